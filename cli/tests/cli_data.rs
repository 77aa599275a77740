//! `weightmap validate --data` and `weightmap dequant`, run as the built
//! binary on files made with `weightmap::gguf::Writer`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use weightmap::gguf::Writer;
use weightmap::quant::dequantize_to_vec;
use weightmap::TensorType;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weightmap"))
        .args(args)
        .output()
        .expect("running the weightmap binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Expect exit 1, nothing on stdout, and one `error: ` line on stderr.
fn fails(args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{args:?}: stdout {}",
        text(&o.stdout)
    );
    assert!(o.stdout.is_empty(), "{args:?}: stdout {}", text(&o.stdout));
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{args:?}: stderr {err:?}");
    assert!(err.starts_with("error: "), "{args:?}: stderr {err:?}");
    err
}

fn ok(args: &[&str]) -> Output {
    let o = run(args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{args:?}: stderr {}",
        text(&o.stderr)
    );
    o
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Deterministic bytes whose f16 fields are finite: every odd byte (the high
/// byte of a little-endian f16 at an even offset) has its top exponent bit
/// clear.
fn finite_quant_bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| {
            let b = (i as u8).wrapping_mul(37).wrapping_add(seed);
            if i % 2 == 1 {
                b & 0xBF
            } else {
                b
            }
        })
        .collect()
}

struct Model {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

/// A file with an F32 norm, an F16 matrix, a Q8_0 and a Q4_K matrix and an
/// I32 vector; `patch` may change tensor data before writing.
fn model(patch: impl FnOnce(&mut [Vec<u8>])) -> Model {
    let mut data = vec![
        f32_bytes(&(0..64).map(|i| i as f32 * 0.25 - 3.0).collect::<Vec<_>>()),
        (0..64 * 3)
            .flat_map(|i| half::f16::from_f32(i as f32 / 7.0).to_le_bytes())
            .collect(),
        finite_quant_bytes(34 * 2 * 5, 1),
        finite_quant_bytes(144 * 4, 2),
        vec![0xFF; 4 * 8],
    ];
    patch(&mut data);
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    let mut it = data.into_iter();
    w.tensor(
        "output_norm.weight",
        TensorType::F32,
        &[64],
        it.next().unwrap(),
    );
    w.tensor(
        "token_embd.weight",
        TensorType::F16,
        &[64, 3],
        it.next().unwrap(),
    );
    w.tensor(
        "blk.0.ffn_up.weight",
        TensorType::Q8_0,
        &[64, 5],
        it.next().unwrap(),
    );
    w.tensor(
        "blk.0.ffn_down.weight",
        TensorType::Q4_K,
        &[512, 2],
        it.next().unwrap(),
    );
    w.tensor("ids", TensorType::I32, &[8], it.next().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    Model { _dir: dir, path }
}

// ---- validate --data ----------------------------------------------------------

#[test]
fn validate_data_passes_a_clean_file_and_reports_count_bytes_and_throughput() {
    let m = model(|_| {});
    let out = text(&ok(&["validate", p(&m.path), "--data"]).stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("ok: gguf, 5 tensors,"), "{out}");
    let bytes = 256 + 384 + 340 + 576 + 32;
    assert!(
        lines[1].starts_with(&format!("data ok: 5 tensors, {bytes} bytes checked in ")),
        "{out}"
    );
    assert!(lines[1].contains(" GB/s, "), "{out}");
    // Without --data, the data is not read.
    let out = text(&ok(&["validate", p(&m.path)]).stdout);
    assert_eq!(out.lines().count(), 1, "{out}");
}

#[test]
fn validate_data_fails_on_a_nan_in_an_f32_tensor() {
    let m = model(|d| d[0][4 * 10..4 * 11].copy_from_slice(&f32::NAN.to_le_bytes()));
    let err = fails(&["validate", p(&m.path), "--data"]);
    assert_eq!(
        err,
        "error: tensor 'output_norm.weight' (f32): element 10 is NaN\n"
    );
    // The header alone is fine.
    ok(&["validate", p(&m.path)]);
}

#[test]
fn validate_data_fails_on_an_inf_in_a_q8_0_scale() {
    let m = model(|d| d[2][34 * 7..34 * 7 + 2].copy_from_slice(&0x7C00u16.to_le_bytes()));
    let err = fails(&["validate", p(&m.path), "--data"]);
    assert_eq!(
        err,
        "error: tensor 'blk.0.ffn_up.weight' (q8_0): block 7 has d = inf\n"
    );
}

#[test]
fn validate_data_fails_on_a_q4_k_dmin() {
    let m = model(|d| d[3][144 * 3 + 2..144 * 3 + 4].copy_from_slice(&0xFE00u16.to_le_bytes()));
    let err = fails(&["validate", p(&m.path), "--data"]);
    assert_eq!(
        err,
        "error: tensor 'blk.0.ffn_down.weight' (q4_K): block 3 has dmin = NaN\n"
    );
}

// ---- dequant --------------------------------------------------------------------

/// The reference: `quant::dequantize` over the tensor's bytes as written.
fn reference(ty: TensorType, bytes: &[u8]) -> Vec<f32> {
    dequantize_to_vec(ty, bytes).unwrap()
}

fn floats(b: &[u8]) -> Vec<f32> {
    assert_eq!(b.len() % 4, 0);
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn dequant_stdout(m: &Model, args: &[&str]) -> Vec<f32> {
    let mut a = vec!["dequant", p(&m.path)];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "-"]);
    floats(&ok(&a).stdout)
}

#[test]
fn dequant_writes_whole_tensors_as_quant_dequantize_does() {
    let mut data = Vec::new();
    let m = model(|d| data = d.to_vec());
    let names = [
        ("output_norm.weight", TensorType::F32),
        ("token_embd.weight", TensorType::F16),
        ("blk.0.ffn_up.weight", TensorType::Q8_0),
        ("blk.0.ffn_down.weight", TensorType::Q4_K),
        ("ids", TensorType::I32),
    ];
    for ((name, ty), bytes) in names.iter().zip(&data) {
        let want = reference(*ty, bytes);
        let got = dequant_stdout(&m, &[name]);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{name}"
        );
    }
}

#[test]
fn dequant_selects_rows_by_range_and_list() {
    let mut q8 = Vec::new();
    let m = model(|d| q8 = d[2].clone());
    let all = reference(TensorType::Q8_0, &q8);
    let row = |r: usize| all[r * 64..(r + 1) * 64].to_vec();

    assert_eq!(
        dequant_stdout(&m, &["blk.0.ffn_up.weight", "--rows", "1..4"]),
        all[64..256]
    );
    assert!(dequant_stdout(&m, &["blk.0.ffn_up.weight", "--rows", "2..2"]).is_empty());
    let list = dequant_stdout(&m, &["blk.0.ffn_up.weight", "--rows", "4,0,4"]);
    assert_eq!(list, [row(4), row(0), row(4)].concat());

    // A Q4_K row is 512 elements: two blocks.
    let mut q4k = Vec::new();
    let m = model(|d| q4k = d[3].clone());
    let all = reference(TensorType::Q4_K, &q4k);
    assert_eq!(
        dequant_stdout(&m, &["blk.0.ffn_down.weight", "--rows", "1"]),
        all[512..]
    );
}

#[test]
fn dequant_writes_to_a_file() {
    let mut f16 = Vec::new();
    let m = model(|d| f16 = d[1].clone());
    let out = m.path.with_file_name("out.f32");
    let o = ok(&[
        "dequant",
        p(&m.path),
        "token_embd.weight",
        "--rows",
        "0..2",
        "-o",
        p(&out),
    ]);
    assert!(text(&o.stdout).starts_with("wrote 2 rows of 64 f32 (512 bytes)"));
    let got = floats(&std::fs::read(&out).unwrap());
    assert_eq!(got, reference(TensorType::F16, &f16)[..128]);
}

#[test]
fn dequant_errors_are_one_line() {
    let m = model(|_| {});
    let f = p(&m.path);
    let err = fails(&["dequant", f, "nope", "-o", "-"]);
    assert!(err.contains("tensor 'nope' not found"), "{err}");
    let err = fails(&[
        "dequant",
        f,
        "blk.0.ffn_up.weight",
        "--rows",
        "3..6",
        "-o",
        "-",
    ]);
    assert!(
        err.contains("'blk.0.ffn_up.weight': row 5 is out of range"),
        "{err}"
    );
    assert!(err.contains("5 rows"), "{err}");
    let err = fails(&[
        "dequant",
        f,
        "blk.0.ffn_up.weight",
        "--rows",
        "0,5",
        "-o",
        "-",
    ]);
    assert!(err.contains("row 5 is out of range"), "{err}");
    // A usage error (a malformed --rows) is clap's exit 2.
    let o = run(&["dequant", f, "ids", "--rows", "4..1", "-o", "-"]);
    assert_eq!(o.status.code(), Some(2));
    let o = run(&["dequant", f, "ids"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn dequant_of_a_type_without_dequantization_fails() {
    let mut w = Writer::new(32);
    w.tensor("q81", TensorType::Q8_1, &[32, 2], vec![0; 72]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q81.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    let err = fails(&["dequant", p(&path), "q81", "-o", "-"]);
    assert_eq!(
        err,
        "error: tensor 'q81': q8_1 has no dequantization to f32\n"
    );
}
