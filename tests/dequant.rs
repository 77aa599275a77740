//! Dequantization to f32 (`weightmap::quant`).
//!
//! - Bit-identity with gguf-py 0.19's `gguf.quants.dequantize` (itself
//!   bit-exact with ggml's to_float) for every type gguf-py implements, and
//!   with ml_dtypes' float32 conversion for every code of the safetensors
//!   8-bit floats, through the committed fixtures in `testdata/dequant/`
//!   (made by `testdata/make_dequant_fixtures.py`; see testdata/README.md).
//! - Hand-computed values for the types neither implements (Q8_K, Q1_0,
//!   Q2_0, the integers, bool, F64), each from ggml's reference formula.
//! - The error cases.

use std::path::PathBuf;

use weightmap::quant::{dequantize, dequantize_to_vec};
use weightmap::{Error, TensorType};

/// Every type with a gguf-py fixture.
const GGUF_PY_TYPES: &[TensorType] = &[
    TensorType::F32,
    TensorType::F16,
    TensorType::BF16,
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
    TensorType::IQ1_S,
    TensorType::IQ1_M,
    TensorType::IQ2_XXS,
    TensorType::IQ2_XS,
    TensorType::IQ2_S,
    TensorType::IQ3_XXS,
    TensorType::IQ3_S,
    TensorType::IQ4_NL,
    TensorType::IQ4_XS,
    TensorType::TQ1_0,
    TensorType::TQ2_0,
    TensorType::MXFP4,
    TensorType::NVFP4,
];

/// The safetensors 8-bit floats, every code checked against ml_dtypes.
const F8_TYPES: &[TensorType] = &[
    TensorType::F8_E4M3,
    TensorType::F8_E5M2,
    TensorType::F8_E4M3FNUZ,
    TensorType::F8_E5M2FNUZ,
    TensorType::F8_E8M0,
];

fn fixture(ty: TensorType) -> (Vec<u8>, Vec<f32>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/dequant");
    let read = |ext: &str| {
        let path = dir.join(format!("{}.{ext}", ty.name()));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let raw = read("bin");
    let want = read("f32")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (raw, want)
}

/// Compare bit for bit; where `nan_as_class`, any NaN matches any NaN.
fn assert_bits(ty: TensorType, got: &[f32], want: &[f32], nan_as_class: bool) {
    assert_eq!(got.len(), want.len(), "{ty}: element count");
    let mut bad = Vec::new();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (nan_as_class && g.is_nan() && w.is_nan());
        if !same {
            bad.push((i, *g, *w));
        }
    }
    assert!(
        bad.is_empty(),
        "{ty}: {} of {} elements differ, first (index, got, want): {:?}",
        bad.len(),
        got.len(),
        &bad[..bad.len().min(8)]
    );
}

fn check_fixture(ty: TensorType, nan_as_class: bool) {
    let (raw, want) = fixture(ty);
    assert!(
        raw.len() as u64 % ty.type_size() == 0,
        "{ty}: fixture is ragged"
    );
    assert!(want.len() >= 256, "{ty}: fixture too small");

    let got = dequantize_to_vec(ty, &raw).unwrap();
    assert_bits(ty, &got, &want, nan_as_class);

    // The same bytes at an odd address take the unaligned path.
    let mut shifted = vec![0u8; raw.len() + 1];
    shifted[1..].copy_from_slice(&raw);
    let mut out = vec![f32::NAN; want.len()];
    dequantize(ty, &shifted[1..], &mut out).unwrap();
    assert_bits(ty, &out, &want, nan_as_class);
}

/// Every type gguf-py implements, bit for bit, NaNs included.
#[test]
fn bit_identical_to_gguf_py() {
    for &ty in GGUF_PY_TYPES {
        check_fixture(ty, false);
    }
}

/// All 256 codes of each 8-bit float, against ml_dtypes 0.5.4 (NaN codes
/// only need to give a NaN: weightmap gives the quiet NaN).
#[test]
fn f8_matches_ml_dtypes_for_every_code() {
    for &ty in F8_TYPES {
        check_fixture(ty, true);
    }
}

/// Hand-checked landmarks of the 8-bit formats (OCP MX spec and the
/// fnuz definitions), independent of the fixtures.
#[test]
fn f8_landmarks() {
    let one = |ty, code: u8| dequantize_to_vec(ty, &[code]).unwrap()[0];
    use TensorType as T;
    assert_eq!(one(T::F8_E4M3, 0x38), 1.0); // exponent 7 - bias 7
    assert_eq!(one(T::F8_E4M3, 0x7E), 448.0); // largest finite
    assert_eq!(one(T::F8_E4M3, 0x01), 2f32.powi(-9)); // smallest subnormal
    assert!(one(T::F8_E4M3, 0x7F).is_nan() && one(T::F8_E4M3, 0xFF).is_nan());
    assert_eq!(one(T::F8_E4M3, 0x80).to_bits(), (-0.0f32).to_bits());
    assert_eq!(one(T::F8_E5M2, 0x3C), 1.0);
    assert_eq!(one(T::F8_E5M2, 0x7B), 57344.0);
    assert_eq!(one(T::F8_E5M2, 0x7C), f32::INFINITY);
    assert!(one(T::F8_E5M2, 0x7D).is_nan());
    assert_eq!(one(T::F8_E4M3FNUZ, 0x40), 1.0); // bias 8
    assert_eq!(one(T::F8_E4M3FNUZ, 0x7F), 240.0);
    assert!(one(T::F8_E4M3FNUZ, 0x80).is_nan());
    assert_eq!(one(T::F8_E5M2FNUZ, 0x40), 1.0); // bias 16
    assert_eq!(one(T::F8_E5M2FNUZ, 0x7F), 57344.0);
    assert!(one(T::F8_E5M2FNUZ, 0x80).is_nan());
    assert_eq!(one(T::F8_E8M0, 127), 1.0);
    assert_eq!(one(T::F8_E8M0, 0), 2f32.powi(-127));
    assert!(one(T::F8_E8M0, 255).is_nan());
}

/// Q8_K: gguf-py has no dequantization for it and ggml's type table no
/// to_float, but ggml-quants.c's reference `dequantize_row_q8_K` is
/// `y[j] = d * qs[j]` with an f32 `d`. Checked by hand: d = 0.25 times each
/// of the 256 codes -128..=127 is exact.
#[test]
fn q8_k_reference_formula() {
    let mut block = Vec::new();
    block.extend(0.25f32.to_le_bytes());
    block.extend((0..256i32).map(|j| (j - 128) as i8 as u8));
    block.extend([0u8; 32]); // bsums: not used by dequantization
    let y = dequantize_to_vec(TensorType::Q8_K, &block).unwrap();
    let want: Vec<f32> = (0..256).map(|j| 0.25 * (j as f32 - 128.0)).collect();
    assert_eq!(y, want);
}

/// Q1_0 (gguf-py lacks it): ggml's `dequantize_row_q1_0` gives `d` for a set
/// bit and `-d` for a clear one, bit `j % 8` of byte `j / 8`. By hand: d = 1.5
/// (f16 0x3E00), first byte 0b1010_0101.
#[test]
fn q1_0_reference_formula() {
    let mut block = vec![0x00, 0x3E, 0b1010_0101];
    block.extend([0xFF; 15]);
    let y = dequantize_to_vec(TensorType::Q1_0, &block).unwrap();
    assert_eq!(y.len(), 128);
    assert_eq!(&y[..8], &[1.5, -1.5, 1.5, -1.5, -1.5, 1.5, -1.5, 1.5]);
    assert!(y[8..].iter().all(|&v| v == 1.5));
}

/// Q2_0 (gguf-py has no such type id): ggml's `dequantize_row_q2_0` gives
/// `(q - 1) * d` for 2-bit codes q, bits `2 * (j % 4)` of byte `j / 4`. By
/// hand: d = 2 (f16 0x4000), byte 0b11_10_01_00 holds codes 0, 1, 2, 3.
#[test]
fn q2_0_reference_formula() {
    let mut block = vec![0x00, 0x40, 0b1110_0100];
    block.extend([0x55; 15]); // code 1 everywhere: 0.0
    let y = dequantize_to_vec(TensorType::Q2_0, &block).unwrap();
    assert_eq!(y.len(), 64);
    assert_eq!(&y[..4], &[-2.0, 0.0, 2.0, 4.0]);
    assert!(y[4..].iter().all(|&v| v == 0.0));
}

/// Integers, bool and F64 convert as values (a C `(float)` cast: round to
/// nearest even). By hand: 2^24 + 1 rounds to 2^24, 2^63 - 1 to 2^63.
#[test]
fn plain_types_convert_as_values() {
    let le = |v: &[i64], w: usize| -> Vec<u8> {
        v.iter()
            .flat_map(|x| x.to_le_bytes()[..w].to_vec())
            .collect()
    };
    let v = |ty, b: &[u8]| dequantize_to_vec(ty, b).unwrap();
    use TensorType as T;
    assert_eq!(
        v(T::I8, &le(&[-128, -1, 0, 127], 1)),
        [-128.0, -1.0, 0.0, 127.0]
    );
    assert_eq!(v(T::I16, &le(&[-32768, 32767], 2)), [-32768.0, 32767.0]);
    assert_eq!(
        v(T::I32, &le(&[-(1 << 31), (1 << 24) + 1], 4)),
        [-2147483648.0, 16777216.0]
    );
    assert_eq!(
        v(T::I64, &le(&[i64::MAX, i64::MIN], 8)),
        [2f32.powi(63), -(2f32.powi(63))]
    );
    assert_eq!(v(T::U8, &[0, 255]), [0.0, 255.0]);
    assert_eq!(v(T::U16, &le(&[65535], 2)), [65535.0]);
    assert_eq!(v(T::U32, &u32::MAX.to_le_bytes()), [4294967296.0]);
    assert_eq!(v(T::U64, &u64::MAX.to_le_bytes()), [2f32.powi(64)]);
    assert_eq!(v(T::Bool, &[0, 1, 2, 255]), [0.0, 1.0, 1.0, 1.0]);
    let f64s: Vec<u8> = [1.0f64 / 3.0, 1e300, -0.0, 1e-50]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let y = v(T::F64, &f64s);
    assert_eq!(y[0], 1.0f32 / 3.0);
    assert_eq!(y[1], f32::INFINITY);
    assert_eq!(y[2].to_bits(), (-0.0f32).to_bits());
    assert_eq!(y[3], 0.0);
}

/// A Q4_K block by hand, through ggml's formula `d1 * q - m1` with the
/// scales of `get_scale_min_k4`: d = 1, dmin = 0.5, scale 2 and min 3 for
/// every group, codes 0x_1 low and 0x2_ high: 2 * 1 - 1.5 and 2 * 2 - 1.5.
#[test]
fn q4_k_by_hand() {
    let mut block = vec![0x00, 0x3C, 0x00, 0x38];
    // Scales 0..4 in bytes 0..4, mins 0..4 in 4..8, groups 4..8 in 8..12.
    block.extend([2, 2, 2, 2, 3, 3, 3, 3, 0x32, 0x32, 0x32, 0x32]);
    block.extend([0x21; 128]);
    let y = dequantize_to_vec(TensorType::Q4_K, &block).unwrap();
    for (i, chunk) in y.chunks(32).enumerate() {
        let want = if i % 2 == 0 { 0.5 } else { 2.5 };
        assert!(chunk.iter().all(|&v| v == want), "group {i}: {chunk:?}");
    }
}

#[test]
fn every_type_but_q8_1_c64_and_sub_byte_floats_dequantizes() {
    for &ty in TensorType::ALL {
        let expected = !matches!(
            ty,
            TensorType::Q8_1
                | TensorType::C64
                | TensorType::F4
                | TensorType::F6_E2M3
                | TensorType::F6_E3M2
        );
        assert_eq!(ty.has_dequantize(), expected, "{ty}");
        if expected {
            // Two zeroed blocks come out as the right number of elements.
            let bytes = vec![0u8; 2 * ty.type_size() as usize];
            let y = dequantize_to_vec(ty, &bytes).unwrap();
            assert_eq!(y.len() as u64, 2 * ty.block_size(), "{ty}");
        }
    }
}

#[test]
fn empty_input_gives_empty_output() {
    assert_eq!(
        dequantize_to_vec(TensorType::Q4_K, &[]).unwrap(),
        Vec::<f32>::new()
    );
    dequantize(TensorType::IQ2_XXS, &[], &mut []).unwrap();
}

#[test]
fn ragged_bytes_are_an_error() {
    let bytes = vec![0u8; 145];
    let err = dequantize_to_vec(TensorType::Q4_K, &bytes).unwrap_err();
    assert_eq!(err.name(), "ragged_blocks");
    assert!(matches!(
        err,
        Error::RaggedBlocks {
            ty: TensorType::Q4_K,
            nbytes: 145,
            block_bytes: 144
        }
    ));
    let mut out = vec![0.0; 256];
    let err = dequantize(TensorType::Q4_K, &bytes, &mut out).unwrap_err();
    assert_eq!(err.name(), "ragged_blocks");
    // A 3-byte F16 tensor is ragged too.
    let err = dequantize_to_vec(TensorType::F16, &[0, 0, 0]).unwrap_err();
    assert_eq!(err.name(), "ragged_blocks");
    assert!(err.to_string().contains("not a whole number"), "{err}");
}

#[test]
fn wrong_output_length_is_an_error() {
    let bytes = vec![0u8; 2 * 34];
    for len in [0, 63, 65, 1000] {
        let mut out = vec![0.0; len];
        let err = dequantize(TensorType::Q8_0, &bytes, &mut out).unwrap_err();
        assert_eq!(err.name(), "output_length");
        assert!(
            matches!(err, Error::OutputLength { ty: TensorType::Q8_0, expected: 64, found } if found == len),
            "{err:?}"
        );
    }
    // Nothing is written on error.
    let mut out = vec![7.0; 63];
    let _ = dequantize(TensorType::Q8_0, &bytes, &mut out);
    assert!(out.iter().all(|&v| v == 7.0));
}

#[test]
fn types_without_dequantization_are_an_error() {
    for ty in [
        TensorType::Q8_1,
        TensorType::C64,
        TensorType::F4,
        TensorType::F6_E2M3,
        TensorType::F6_E3M2,
    ] {
        let bytes = vec![0u8; ty.type_size() as usize];
        let err = dequantize_to_vec(ty, &bytes).unwrap_err();
        assert_eq!(err.name(), "no_dequantize");
        assert!(matches!(err, Error::NoDequantize { ty: t } if t == ty));
        let mut out = vec![0.0; ty.block_size() as usize];
        assert_eq!(
            dequantize(ty, &bytes, &mut out).unwrap_err().name(),
            "no_dequantize"
        );
    }
}

/// The new block structs view tensor bytes like the existing ones.
#[test]
fn block_structs_view_tensor_bytes() {
    use weightmap::gguf;
    use weightmap::quant::{BlockIQ4XS, BlockNVFP4};
    let (raw, want) = fixture(TensorType::IQ4_XS);
    let mut w = gguf::Writer::new(32);
    w.tensor("x", TensorType::IQ4_XS, &[want.len() as u64], raw.clone());
    let bytes = w.to_bytes();
    let file = gguf::GgufHeader::parse(&bytes).unwrap();
    let info = &file.tensors().get(0).unwrap();
    let blocks: &[BlockIQ4XS] = info
        .view(&bytes[info.file_offset as usize..][..info.nbytes as usize])
        .unwrap();
    assert_eq!(blocks.len(), raw.len() / 136);
    assert_eq!(bytemuck::cast_slice::<BlockIQ4XS, u8>(blocks), &raw[..]);
    assert!(info
        .view::<BlockNVFP4>(&bytes[info.file_offset as usize..][..info.nbytes as usize])
        .is_err());
}
