//! Data checks (`weightmap::quant::check_data`, `check_tensors`): NaN and
//! infinity in float tensors and in quantized blocks' scales, named by tensor
//! and first bad element or block.
//!
//! The scale-field offsets are checked against the dequantizer: for random
//! blocks of every type whose scales are f16, a block passes the check
//! exactly when its dequantized values are all finite.

use weightmap::gguf::Writer;
use weightmap::quant::{check_data, check_tensors, dequantize_to_vec};
use weightmap::{Error, LoadOptions, TensorType, Weights};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn non_finite(e: Error) -> (String, TensorType, &'static str, u64, &'static str, f64) {
    match e {
        Error::NonFiniteData {
            tensor,
            ty,
            unit,
            index,
            field,
            value,
        } => (tensor, ty, unit, index, field, value),
        e => panic!("expected non_finite_data, got {e}"),
    }
}

/// Quantized types whose scale fields are all f16: for these, and random
/// bytes, "the check passes" and "every dequantized value is finite" are the
/// same statement (an f16 scale times the small integers of a block cannot
/// overflow f32, and an infinite or NaN scale makes some value non-finite).
const F16_SCALED: &[TensorType] = &[
    TensorType::Q1_0,
    TensorType::Q2_0,
    TensorType::Q4_0,
    TensorType::Q4_1,
    TensorType::Q5_0,
    TensorType::Q5_1,
    TensorType::Q8_0,
    TensorType::Q2_K,
    TensorType::Q3_K,
    TensorType::Q4_K,
    TensorType::Q5_K,
    TensorType::Q6_K,
    TensorType::IQ2_XXS,
    TensorType::IQ2_XS,
    TensorType::IQ2_S,
    TensorType::IQ3_XXS,
    TensorType::IQ3_S,
    TensorType::IQ1_S,
    TensorType::IQ1_M,
    TensorType::IQ4_NL,
    TensorType::IQ4_XS,
    TensorType::TQ1_0,
    TensorType::TQ2_0,
    TensorType::NVFP4,
];

#[test]
fn a_block_passes_exactly_when_it_dequantizes_to_finite_values() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for &ty in F16_SCALED {
        let bb = ty.type_size() as usize;
        let (mut bad, mut good) = (0, 0);
        for i in 0..600 {
            let mut block = rng.bytes(bb);
            // Make a non-finite scale likelier than 1 in 32 so both outcomes
            // are seen for every type: set a random f16-aligned pair's
            // exponent bits on every third block.
            if i % 3 == 0 {
                let p = (rng.next() as usize % (bb / 2)) * 2;
                block[p + 1] |= 0x7C;
            }
            let values = dequantize_to_vec(ty, &block).unwrap();
            let finite = values.iter().all(|v| v.is_finite());
            let checked = check_data("t", ty, &block);
            assert_eq!(
                checked.is_ok(),
                finite,
                "{ty} block {block:02x?}: check says {checked:?}"
            );
            if finite {
                good += 1;
            } else {
                bad += 1;
            }
        }
        if ty != TensorType::NVFP4 {
            assert!(bad > 0 && good > 0, "{ty}: {bad} bad, {good} good blocks");
        }
    }
}

#[test]
fn float_elements_pass_exactly_when_they_are_finite() {
    let mut rng = Rng(7);
    for ty in [TensorType::F16, TensorType::BF16, TensorType::F32] {
        let w = ty.type_size() as usize;
        for _ in 0..2000 {
            let mut e = rng.bytes(w);
            if rng.next() % 4 == 0 {
                // Force the exponent to all ones.
                match ty {
                    TensorType::F16 => e[1] |= 0x7C,
                    TensorType::BF16 => {
                        e[1] |= 0x7F;
                        e[0] |= 0x80;
                    }
                    _ => {
                        e[3] |= 0x7F;
                        e[2] |= 0x80;
                    }
                }
            }
            let finite = dequantize_to_vec(ty, &e).unwrap()[0].is_finite();
            assert_eq!(check_data("t", ty, &e).is_ok(), finite, "{ty} {e:02x?}");
        }
    }
    // Every code of the 8-bit floats.
    for ty in [
        TensorType::F8_E4M3,
        TensorType::F8_E5M2,
        TensorType::F8_E4M3FNUZ,
        TensorType::F8_E5M2FNUZ,
        TensorType::F8_E8M0,
    ] {
        for code in 0..=255u8 {
            let finite = dequantize_to_vec(ty, &[code]).unwrap()[0].is_finite();
            assert_eq!(
                check_data("t", ty, &[code]).is_ok(),
                finite,
                "{ty} {code:#04x}"
            );
        }
    }
    // F64: NaN and both infinities, and a finite value too large for f32.
    for (v, ok) in [
        (1e300, true),
        (f64::NAN, false),
        (f64::INFINITY, false),
        (f64::NEG_INFINITY, false),
    ] {
        assert_eq!(
            check_data("t", TensorType::F64, &v.to_le_bytes()).is_ok(),
            ok,
            "{v}"
        );
    }
}

#[test]
fn the_error_names_the_tensor_and_the_first_bad_element() {
    let mut v = vec![0.5f32; 100];
    v[41] = f32::NEG_INFINITY;
    v[77] = f32::NAN;
    let e = check_data("blk.0.attn_norm.weight", TensorType::F32, &f32_bytes(&v)).unwrap_err();
    assert_eq!(e.name(), "non_finite_data");
    assert_eq!(
        e.to_string(),
        "tensor 'blk.0.attn_norm.weight' (f32): element 41 is -inf"
    );
    let (tensor, ty, unit, index, field, value) = non_finite(e);
    assert_eq!(
        (tensor.as_str(), ty, unit, index, field),
        ("blk.0.attn_norm.weight", TensorType::F32, "element", 41, "")
    );
    assert_eq!(value, f64::NEG_INFINITY);
}

#[test]
fn quantized_errors_name_the_block_and_field() {
    // Q4_K: dmin (bytes 2..4) of block 2 is NaN.
    let mut q4k = vec![0u8; 144 * 3];
    q4k[144 * 2 + 2..144 * 2 + 4].copy_from_slice(&0x7E00u16.to_le_bytes());
    let (_, _, unit, index, field, value) =
        non_finite(check_data("q4k", TensorType::Q4_K, &q4k).unwrap_err());
    assert_eq!((unit, index, field), ("block", 2, "dmin"));
    assert!(value.is_nan());

    // Q6_K: d is the last field, at byte 208.
    let mut q6k = vec![0u8; 210 * 2];
    q6k[210 + 208..210 + 210].copy_from_slice(&0xFC00u16.to_le_bytes());
    let e = check_data("q6k", TensorType::Q6_K, &q6k).unwrap_err();
    assert_eq!(e.to_string(), "tensor 'q6k' (q6_K): block 1 has d = -inf");

    // Q8_K: an f32 d.
    let mut q8k = vec![0u8; 292];
    q8k[..4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    let (_, _, _, index, field, _) =
        non_finite(check_data("q8k", TensorType::Q8_K, &q8k).unwrap_err());
    assert_eq!((index, field), (0, "d"));

    // MXFP4: E8M0 exponent 0xFF, rejected as ggml's validator does.
    let mut mx = vec![0u8; 17 * 2];
    mx[17] = 0xFF;
    let (_, _, _, index, field, _) =
        non_finite(check_data("mx", TensorType::MXFP4, &mx).unwrap_err());
    assert_eq!((index, field), (1, "e"));
    mx[17] = 0xFE;
    assert!(check_data("mx", TensorType::MXFP4, &mx).is_ok());

    // Integers have nothing to check.
    assert!(check_data("i", TensorType::I32, &[0xFF; 16]).is_ok());
}

#[test]
fn ragged_bytes_are_an_error() {
    let e = check_data("q", TensorType::Q8_0, &[0; 35]).unwrap_err();
    assert_eq!(e.name(), "ragged_blocks");
    let e = check_tensors([("q", TensorType::Q8_0, &[0u8; 33][..])], 0).unwrap_err();
    assert_eq!(e.name(), "ragged_blocks");
}

/// Three tensors, big enough that the checker splits the last one into
/// several pieces (pieces are 4 MiB).
fn big_tensors() -> Vec<(String, TensorType, Vec<u8>)> {
    vec![
        ("a".into(), TensorType::F16, vec![0u8; 1000]),
        ("b".into(), TensorType::Q8_0, vec![0u8; 34 * 1000]),
        ("c".into(), TensorType::F32, f32_bytes(&vec![1.0; 3 << 20])),
    ]
}

fn as_refs(t: &[(String, TensorType, Vec<u8>)]) -> Vec<(&str, TensorType, &[u8])> {
    t.iter()
        .map(|(n, ty, b)| (n.as_str(), *ty, &b[..]))
        .collect()
}

#[test]
fn clean_tensors_pass_and_are_counted() {
    let t = big_tensors();
    let total: u64 = t.iter().map(|x| x.2.len() as u64).sum();
    for threads in [1, 2, 3, 8] {
        let s = check_tensors(as_refs(&t), threads).unwrap();
        assert_eq!((s.tensors, s.bytes), (3, total));
        assert!(s.threads >= 1 && s.threads <= threads);
    }
    let s = check_tensors(as_refs(&t), 0).unwrap();
    assert_eq!(s.tensors, 3);
    assert_eq!(check_tensors(Vec::new(), 0).unwrap().tensors, 0);
}

#[test]
fn the_first_bad_value_in_order_is_reported_whatever_the_thread_count() {
    let mut t = big_tensors();
    // Bad values in several pieces of `c` (element 2.5 Mi is in its third
    // piece) and in `b`'s block 999; `b` comes first.
    let c = &mut t[2].2;
    for i in [(5 << 19) + 3, (1 << 20) + 5, (3 << 20) - 1] {
        c[i * 4..i * 4 + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    }
    for threads in [1, 2, 3, 8] {
        let (tensor, _, _, index, _, _) =
            non_finite(check_tensors(as_refs(&t), threads).unwrap_err());
        assert_eq!(
            (tensor.as_str(), index),
            ("c", (1 << 20) + 5),
            "{threads} threads"
        );
    }
    let b = &mut t[1].2;
    b[34 * 999 + 1] = 0x7C;
    for threads in [1, 2, 3, 8] {
        let (tensor, ty, unit, index, field, _) =
            non_finite(check_tensors(as_refs(&t), threads).unwrap_err());
        assert_eq!(
            (tensor.as_str(), ty, unit, index, field),
            ("b", TensorType::Q8_0, "block", 999, "d"),
            "{threads} threads"
        );
    }
}

/// Write `w` to a temporary file and load it (stream path: no `unsafe`).
fn load(w: &Writer) -> (tempfile::TempDir, Weights) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    let weights = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    (dir, weights)
}

fn check_weights(weights: &Weights) -> weightmap::Result<weightmap::quant::CheckStats> {
    let owned: Vec<(String, TensorType, Vec<u8>)> = weights
        .tensors()
        .map(|t| {
            let i = t.info();
            (i.name.to_owned(), i.ty, t.to_vec().unwrap())
        })
        .collect();
    check_tensors(as_refs(&owned), 0)
}

fn model(f32_data: Vec<u8>, q8_data: Vec<u8>) -> Writer {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    w.tensor(
        "token_embd.weight",
        TensorType::F16,
        &[64, 4],
        vec![0x3C; 512],
    );
    w.tensor("output_norm.weight", TensorType::F32, &[64], f32_data);
    w.tensor("blk.0.ffn_up.weight", TensorType::Q8_0, &[64, 2], q8_data);
    w
}

#[test]
fn a_clean_file_passes() {
    let (_dir, weights) = load(&model(f32_bytes(&[1.0; 64]), vec![0; 34 * 4]));
    let s = check_weights(&weights).unwrap();
    assert_eq!((s.tensors, s.bytes), (3, 512 + 256 + 136));
}

#[test]
fn a_nan_in_an_f32_tensor_of_a_file_is_found() {
    let mut v = vec![1.0f32; 64];
    v[63] = f32::NAN;
    let (_dir, weights) = load(&model(f32_bytes(&v), vec![0; 34 * 4]));
    let e = check_weights(&weights).unwrap_err();
    assert_eq!(
        e.to_string(),
        "tensor 'output_norm.weight' (f32): element 63 is NaN"
    );
}

#[test]
fn an_inf_in_a_q8_0_scale_of_a_file_is_found() {
    let mut q = vec![0u8; 34 * 4];
    q[34 * 2..34 * 2 + 2].copy_from_slice(&0x7C00u16.to_le_bytes());
    let (_dir, weights) = load(&model(f32_bytes(&[1.0; 64]), q));
    let e = check_weights(&weights).unwrap_err();
    assert_eq!(
        e.to_string(),
        "tensor 'blk.0.ffn_up.weight' (q8_0): block 2 has d = inf"
    );
}
