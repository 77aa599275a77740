//! ggml-exact validation (`weightmap::gguf::check_ggml`):
//! files weightmap's default rules accept
//! and ggml's gguf.cpp refuses, and files both accept.
//!
//! The string and array caps are 1 GiB: those files are built over zeroed
//! allocations (calloc: pages nobody writes are never committed) or sparse
//! files, and the parser does not read string or array contents, so they
//! cost a few pages each.

mod common;

use std::path::{Path, PathBuf};

use common::{big_kv, tt, two_tensors, unpadded, GgufSpec, Kv, Tensor};
use weightmap::gguf::{self, GgufHeader};
use weightmap::gguf::{check_ggml, GgmlRule, GgmlSummary};
use weightmap::{Error, TensorType};

// ---- helpers -------------------------------------------------------------

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

fn ggml(bytes: &[u8]) -> weightmap::Result<GgmlSummary> {
    let file = GgufHeader::parse(bytes).expect("weightmap's default rules accept the file");
    check_ggml(&file, &file.metadata_in(bytes))
}

/// The rule and detail of a refusal.
fn refused(bytes: &[u8]) -> (GgmlRule, String) {
    match ggml(bytes) {
        Err(Error::GgmlWouldRefuse { rule, detail }) => (rule, detail),
        other => panic!("expected a ggml refusal, got {other:?}"),
    }
}

// ---- files both rules accept ---------------------------------------------

#[test]
fn committed_fixtures_pass_ggml_rules() {
    for p in common::gguf_fixtures(&testdata("")) {
        let bytes = std::fs::read(&p).unwrap();
        let s = ggml(&bytes).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        let h = GgufHeader::parse(&bytes).unwrap();
        assert_eq!(s.tensors, h.tensors().len());
        assert_eq!(s.keys, h.kv_count());
        assert!(h.data_offset() + s.data_section_len <= h.file_len());
    }
}

#[test]
fn writer_output_passes_ggml_rules() {
    for alignment in [1u64, 8, 32, 4096] {
        let mut w = gguf::Writer::new(alignment);
        w.kv_str("general.architecture", "llama")
            .kv_str_array("tokenizer.ggml.tokens", &["<s>", "a", ""])
            .kv_f32_array("tokenizer.ggml.scores", &[0.0, 1.0, 2.0])
            .tensor("a", TensorType::F32, &[3], vec![0; 12])
            .tensor("b", TensorType::Q4_0, &[32, 2], vec![0; 36])
            .tensor("c", TensorType::F16, &[0, 4], vec![])
            .tensor("d", TensorType::I8, &[5], vec![0; 5]);
        let bytes = w.to_bytes();
        let s = ggml(&bytes).unwrap_or_else(|e| panic!("alignment {alignment}: {e}"));
        let pad = |n: u64| n.div_ceil(alignment) * alignment;
        assert_eq!(s.data_section_len, pad(12) + pad(36) + pad(5));
        assert_eq!((s.keys, s.arrays, s.tensors), (w_keys(alignment), 2, 4));
        // key strings, one string value, three array strings
        assert_eq!(s.strings, s.keys as u64 + 1 + 3);
    }
}

fn w_keys(alignment: u64) -> usize {
    if alignment == 32 {
        3
    } else {
        4 // general.alignment too
    }
}

#[test]
fn an_empty_file_and_a_zero_size_last_tensor_pass() {
    assert_eq!(ggml(&GgufSpec::new().bytes()).unwrap().data_section_len, 0);
    // A last tensor of 0 bytes needs no padding and no data.
    let built = GgufSpec::new()
        .tensor(Tensor::new("a", tt::F32, &[8]))
        .tensor(Tensor::new("z", tt::F32, &[0]))
        .build();
    let bytes = built.truncated(built.tensor_end(1));
    assert_eq!(ggml(&bytes).unwrap().data_section_len, 32);
}

#[test]
fn strings_and_arrays_at_the_caps_pass() {
    for kind in ["string", "u8_array", "string_in_array"] {
        let bytes = big_kv(
            kind,
            GgmlRule::MAX_STRING_LENGTH.min(GgmlRule::MAX_ARRAY_ELEMENTS),
        );
        ggml(&bytes).unwrap_or_else(|e| panic!("{kind} at the cap: {e}"));
    }
}

// ---- files the default accepts and ggml refuses --------------------------

#[test]
fn a_gap_between_tensors_is_refused() {
    let bytes = two_tensors(0, 64);
    let (rule, detail) = refused(&bytes);
    assert_eq!(rule, GgmlRule::PackedOffsets);
    assert!(
        detail.contains("tensor 1 'b' has offset 64, expected 32"),
        "{detail}"
    );
    assert!(detail.contains("a gap of 32 bytes"), "{detail}");
}

#[test]
fn a_gap_before_the_first_tensor_is_refused() {
    let (rule, detail) = refused(&two_tensors(32, 64));
    assert_eq!(rule, GgmlRule::PackedOffsets);
    assert!(
        detail.contains("tensor 0 'a' has offset 32, expected 0"),
        "{detail}"
    );
}

#[test]
fn tensors_out_of_order_are_refused() {
    let (rule, detail) = refused(&two_tensors(32, 0));
    assert_eq!(rule, GgmlRule::PackedOffsets);
    assert!(
        detail.contains("tensor 0 'a' has offset 32, expected 0"),
        "{detail}"
    );
    // ggml reports the first mismatch in file order: here tensor 1, which
    // sits where tensor 2 belongs.
    let mut a = Tensor::new("a", tt::F32, &[8]);
    a.offset = Some(0);
    let mut b = Tensor::new("b", tt::F32, &[16]);
    b.offset = Some(64);
    let mut c = Tensor::new("c", tt::F32, &[8]);
    c.offset = Some(32);
    let bytes = GgufSpec::new().tensor(a).tensor(b).tensor(c).bytes();
    let (rule, detail) = refused(&bytes);
    assert_eq!(rule, GgmlRule::PackedOffsets);
    assert!(
        detail.contains("tensor 1 'b' has offset 64, expected 32"),
        "{detail}"
    );
}

#[test]
fn missing_data_section_padding_is_refused() {
    let bytes = unpadded();
    let e = ggml(&bytes).unwrap_err();
    assert!(
        e.to_string().starts_with(
            "ggml's gguf_init_from_file with tensor data (not llama.cpp's loader, which reads \
             metadata only) would refuse this file: data_section: "
        ),
        "{e}"
    );
    let (rule, detail) = refused(&bytes);
    assert_eq!(rule, GgmlRule::DataSection);
    assert!(
        detail.contains("20 of the 20 padding bytes after the last tensor 't' are missing"),
        "{detail}"
    );
    // One padding byte short is still short.
    let built = GgufSpec::new()
        .tensor(Tensor::new("t", tt::F32, &[3]))
        .build();
    let one_short = built.truncated(built.bytes.len() - 1);
    let (rule, detail) = refused(&one_short);
    assert_eq!(rule, GgmlRule::DataSection);
    assert!(detail.contains("ends 1 bytes past the end"), "{detail}");
    // The whole file passes.
    ggml(&built.bytes).unwrap();
}

#[test]
fn an_oversized_string_value_is_refused() {
    let bytes = big_kv("string", GgmlRule::MAX_STRING_LENGTH + 1);
    let (rule, detail) = refused(&bytes);
    assert_eq!(rule, GgmlRule::StringLength);
    assert!(
        detail.contains("string value of key 'general.name' is 1073741825 bytes"),
        "{detail}"
    );
    assert!(
        detail.contains("GGUF_MAX_STRING_LENGTH of 1073741824"),
        "{detail}"
    );
}

#[test]
fn an_oversized_string_in_an_array_is_refused() {
    let bytes = big_kv("string_in_array", GgmlRule::MAX_STRING_LENGTH + 1);
    let (rule, detail) = refused(&bytes);
    assert_eq!(rule, GgmlRule::StringLength);
    assert!(
        detail.contains("string 0 of array 'tokenizer.ggml.tokens' is 1073741825 bytes"),
        "{detail}"
    );
}

#[test]
fn an_oversized_array_is_refused() {
    let bytes = big_kv("u8_array", GgmlRule::MAX_ARRAY_ELEMENTS + 1);
    let (rule, detail) = refused(&bytes);
    assert_eq!(rule, GgmlRule::ArrayLength);
    assert!(
        detail.contains("array 'big.u8' of u8 has 1073741825 elements"),
        "{detail}"
    );
}

#[test]
fn tensor_names_equal_up_to_a_nul_are_refused() {
    let bytes = GgufSpec::new()
        .tensor(Tensor::new("w\0x", tt::F32, &[8]))
        .tensor(Tensor::new("w\0y", tt::F32, &[8]))
        .bytes();
    let (rule, detail) = refused(&bytes);
    assert_eq!(rule, GgmlRule::TensorName);
    assert!(detail.contains("tensors 0 "), "{detail}");
    assert!(detail.contains("('w')"), "{detail}");
    // A NUL alone is not refused.
    let bytes = GgufSpec::new()
        .tensor(Tensor::new("w\0x", tt::F32, &[8]))
        .tensor(Tensor::new("v", tt::F32, &[8]))
        .bytes();
    ggml(&bytes).unwrap();
}

#[test]
fn the_error_kind_and_display_are_stable() {
    let e = ggml(&two_tensors(0, 64)).unwrap_err();
    assert_eq!(e.name(), "ggml_would_refuse");
    assert!(e
        .to_string()
        .starts_with("llama.cpp would refuse this file: packed_offsets: tensor 1 'b'"));
    let names: Vec<&str> = GgmlRule::ALL.iter().map(|r| r.name()).collect();
    assert_eq!(
        names,
        [
            "string_length",
            "array_length",
            "tensor_name",
            "packed_offsets",
            "data_section"
        ]
    );
}

#[test]
fn metadata_over_too_few_bytes_is_an_error_not_a_pass() {
    let bytes = GgufSpec::new()
        .kv(Kv::string("general.architecture", b"llama"))
        .kv(Kv::u32("llama.block_count", 2))
        .bytes();
    let h = GgufHeader::parse(&bytes).unwrap();
    let e = check_ggml(&h, &h.metadata_in(&bytes[..30])).unwrap_err();
    assert_eq!(e.name(), "metadata_incomplete", "{e}");
    check_ggml(&h, &h.metadata_in(&bytes)).unwrap();
}

// ---- the command ---------------------------------------------------------
