//! `weightmap validate FILE --ggml`: the command says which of ggml's
//! gguf.cpp rules a file breaks, and where; files both accept pass.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{big_kv_prefix, tt, two_tensors, unpadded, GgufSpec, Tensor};
use weightmap::gguf::GgmlRule;

fn testdata(name: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("testdata")
        .join(name)
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weightmap"))
        .args(args)
        .output()
        .expect("running the weightmap binary")
}

fn validate(path: &Path, ggml: bool) -> (Option<i32>, String, String) {
    let mut args: Vec<&std::ffi::OsStr> = vec!["validate".as_ref(), path.as_os_str()];
    if ggml {
        args.push("--ggml".as_ref());
    }
    let o = run(&args);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn write_temp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Exit 0 without `--ggml`; exit 1, nothing on stdout, and
/// `error: llama.cpp would refuse this file: <rule>: ...` with it.
fn assert_cli_refuses(path: &Path, rule: GgmlRule, detail_part: &str) {
    let (code, out, err) = validate(path, false);
    assert_eq!(code, Some(0), "default rules accept {path:?}: {err}");
    assert!(out.starts_with("ok: gguf"), "{out}");
    assert_cli_ggml_refuses(path, rule, detail_part);
}

/// `--ggml` only: exit 1, nothing on stdout, one error line.
fn assert_cli_ggml_refuses(path: &Path, rule: GgmlRule, detail_part: &str) {
    let (code, out, err) = validate(path, true);
    assert_eq!(code, Some(1), "--ggml refuses {path:?}: {out}");
    assert_eq!(out, "", "nothing on stdout when refused");
    let want = format!(
        "error: {} would refuse this file: {}: ",
        rule.refused_by(),
        rule.name()
    );
    assert!(err.starts_with(&want), "{err}");
    assert!(
        err.contains(detail_part),
        "{err} should mention {detail_part}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");
}

#[test]
fn cli_fixtures_would_load() {
    for p in common::gguf_fixtures(&testdata("")) {
        let (code, out, err) = validate(&p, true);
        assert_eq!(code, Some(0), "{p:?}: {err}");
        assert!(out.starts_with("ok: gguf"), "{out}");
        let last = out.lines().last().unwrap();
        assert!(
            last.starts_with("llama.cpp would load this file (ggml's rules: "),
            "{last}"
        );
    }
}

#[test]
fn cli_refuses_with_the_rule_and_where() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert_cli_refuses(
        &write_temp(d, "gap.gguf", &two_tensors(0, 64)),
        GgmlRule::PackedOffsets,
        "tensor 1 'b' has offset 64, expected 32",
    );
    assert_cli_refuses(
        &write_temp(d, "order.gguf", &two_tensors(32, 0)),
        GgmlRule::PackedOffsets,
        "tensor 0 'a' has offset 32, expected 0",
    );
    assert_cli_refuses(
        &write_temp(d, "unpadded.gguf", &unpadded()),
        GgmlRule::DataSection,
        "after the last tensor 't' are missing",
    );
    let nul = GgufSpec::new()
        .tensor(Tensor::new("w\0x", tt::F32, &[8]))
        .tensor(Tensor::new("w\0y", tt::F32, &[8]))
        .bytes();
    // The NUL is printed escaped. (Not "nul.gguf": Windows reserves the
    // name NUL, with any extension, for its null device.)
    assert_cli_refuses(
        &write_temp(d, "nul-name.gguf", &nul),
        GgmlRule::TensorName,
        "'w\\0x'",
    );
}

#[test]
fn cli_refuses_an_oversized_string_in_a_sparse_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big-string.gguf");
    let (prefix, total) = big_kv_prefix("string", GgmlRule::MAX_STRING_LENGTH + 1);
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(&prefix).unwrap();
    f.set_len(total as u64).unwrap();
    drop(f);
    // The default rules' acceptance of this layout is shown by
    // an_oversized_string_value_is_refused; reading a 1 GiB header once is enough.
    assert_cli_ggml_refuses(
        &p,
        GgmlRule::StringLength,
        "string value of key 'general.name' is 1073741825 bytes",
    );
}

#[test]
fn cli_ggml_on_safetensors_is_an_error() {
    let p = testdata("bf16.safetensors");
    let (code, _, _) = validate(&p, false);
    assert_eq!(code, Some(0));
    let (code, out, err) = validate(&p, true);
    assert_eq!(code, Some(1));
    assert_eq!(out, "");
    assert!(
        err.starts_with("error: ") && err.contains("--ggml applies to GGUF files only"),
        "{err}"
    );
}

#[test]
fn cli_ggml_with_data_prints_both_lines() {
    let p = testdata("tiny-llama.gguf");
    let o = run(&[
        "validate".as_ref(),
        p.as_os_str(),
        "--ggml".as_ref(),
        "--data".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("\nllama.cpp would load this file"), "{out}");
    assert!(out.contains("\ndata ok: "), "{out}");
}
