//! One test per GGUF validation rule: each malformed file must fail
//! with its own `weightmap::Error` variant, naming the key, tensor or offset;
//! each boundary case ggml accepts must parse.

mod common;

use common::{align_up, sample_spec, tt, vt, GgufSpec, Kv, RawGguf, Tensor};
use weightmap::gguf::GgufHeader;
use weightmap::{Error, Parse, TensorType};

fn err(bytes: &[u8]) -> Error {
    match GgufHeader::parse(bytes) {
        Ok(h) => panic!("expected an error, parsed {} tensors", h.tensors().len()),
        Err(e) => e,
    }
}

fn ok(bytes: &[u8]) -> GgufHeader {
    GgufHeader::parse(bytes).unwrap_or_else(|e| panic!("expected a valid file: {e}"))
}

/// A 100-byte file: `r` padded with zeros.
fn padded_100(mut r: RawGguf) -> Vec<u8> {
    assert!(r.len() <= 100);
    let n = 100 - r.len();
    r.zeros(n);
    r.into_bytes()
}

// ---- magic and version -----------------------------------------------------

#[test]
fn bad_magic() {
    let mut spec = GgufSpec::new();
    spec.magic = *b"GGUX";
    assert!(matches!(err(&spec.bytes()), Error::BadMagic { found } if &found == b"GGUX"));
}

#[test]
fn version_0_is_unsupported() {
    let mut spec = GgufSpec::new();
    spec.version = 0;
    assert!(matches!(
        err(&spec.bytes()),
        Error::UnsupportedVersion { version: 0 }
    ));
}

#[test]
fn version_1_is_unsupported() {
    let mut spec = GgufSpec::new();
    spec.version = 1;
    assert!(matches!(
        err(&spec.bytes()),
        Error::UnsupportedVersion { version: 1 }
    ));
}

#[test]
fn version_4_is_unsupported() {
    let mut spec = GgufSpec::new();
    spec.version = 4;
    assert!(matches!(
        err(&spec.bytes()),
        Error::UnsupportedVersion { version: 4 }
    ));
}

#[test]
fn byte_swapped_version_3_is_big_endian() {
    let mut spec = GgufSpec::new();
    spec.version = 0x0300_0000;
    assert!(matches!(
        err(&spec.bytes()),
        Error::BigEndian {
            version: 0x0300_0000
        }
    ));
}

#[test]
fn versions_2_and_3_parse() {
    for v in [2, 3] {
        let mut spec = sample_spec();
        spec.version = v;
        assert_eq!(ok(&spec.bytes()).version(), v);
    }
}

// ---- truncation --------------------------------------------------------------

/// Parse `bytes[..cut]` and expect `Truncated` at `offset`, with `what` containing `what`.
fn assert_truncated(bytes: &[u8], cut: usize, what: &str, offset: usize, needed: u64) {
    match err(&bytes[..cut]) {
        Error::Truncated {
            what: w,
            offset: o,
            needed: n,
            file_len,
        } => {
            assert!(w.contains(what), "what = {w:?}, expected {what:?}");
            assert_eq!((o, n, file_len), (offset as u64, needed, cut as u64), "{w}");
        }
        e => panic!("cut at {cut}: expected Truncated({what}), got {e:?}"),
    }
}

#[test]
fn truncated_inside_magic() {
    assert_truncated(&sample_spec().bytes(), 2, "magic", 0, 4);
}

#[test]
fn truncated_inside_version() {
    assert_truncated(&sample_spec().bytes(), 6, "version", 4, 4);
}

#[test]
fn truncated_inside_counts() {
    let b = sample_spec().bytes();
    assert_truncated(&b, 12, "tensor count", 8, 8);
    assert_truncated(&b, 20, "key/value count", 16, 8);
}

#[test]
fn truncated_inside_a_key() {
    let built = sample_spec().build();
    // Entry 2 is "general.architecture" (20 bytes); cut after 3 of them.
    let key_at = built.kv_at[2] + 8;
    assert_truncated(&built.bytes, key_at + 3, "key of entry 2", key_at, 20);
}

#[test]
fn truncated_inside_a_key_length() {
    let built = sample_spec().build();
    let at = built.kv_at[3];
    assert_truncated(&built.bytes, at + 5, "key length of entry 3", at, 8);
}

#[test]
fn truncated_inside_a_value() {
    let built = sample_spec().build();
    // Entry 1 is llama.block_count (17 bytes), a u32.
    let value_at = built.kv_at[1] + 8 + 17 + 4;
    assert_truncated(
        &built.bytes,
        value_at + 2,
        "value of key 'llama.block_count'",
        value_at,
        4,
    );
}

#[test]
fn truncated_inside_a_value_type() {
    let built = sample_spec().build();
    let type_at = built.kv_at[1] + 8 + 17;
    assert_truncated(
        &built.bytes,
        type_at + 1,
        "value type of key 'llama.block_count'",
        type_at,
        4,
    );
}

#[test]
fn truncated_inside_a_string() {
    let built = sample_spec().build();
    // Entry 2: "general.architecture" = "llama".
    let len_at = built.kv_at[2] + 8 + 20 + 4;
    assert_truncated(
        &built.bytes,
        len_at + 4,
        "string length of key 'general.architecture'",
        len_at,
        8,
    );
    assert_truncated(
        &built.bytes,
        len_at + 8 + 2,
        "string value of key 'general.architecture'",
        len_at + 8,
        5,
    );
}

#[test]
fn truncated_inside_an_array() {
    let built = sample_spec().build();
    // Entry 3: "test.u32_array" (14 bytes) = [1, 2, 3, 4].
    let elem_at = built.kv_at[3] + 8 + 14 + 4;
    assert_truncated(
        &built.bytes,
        elem_at + 2,
        "array element type of key 'test.u32_array'",
        elem_at,
        4,
    );
    assert_truncated(
        &built.bytes,
        elem_at + 4 + 3,
        "array length of key 'test.u32_array'",
        elem_at + 4,
        8,
    );
    let data_at = elem_at + 12;
    assert_truncated(
        &built.bytes,
        data_at + 7,
        "array value of key 'test.u32_array'",
        data_at,
        16,
    );
}

#[test]
fn truncated_inside_a_string_array() {
    let built = sample_spec().build();
    // Entry 4: "tokenizer.ggml.tokens" (21 bytes) = ["<s>", "hello", "world"].
    // (A cut in the first 24 bytes of elements is CountTooLarge: three
    // strings cannot fit; see `cut_is_truncated`.)
    let data_at = built.kv_at[4] + 8 + 21 + 4 + 12;
    let s2_len_at = data_at + (8 + 3) + (8 + 5);
    assert_truncated(
        &built.bytes,
        s2_len_at + 8 + 2,
        "string 2 of array 'tokenizer.ggml.tokens'",
        s2_len_at + 8,
        5,
    );
    assert_truncated(
        &built.bytes,
        s2_len_at + 1,
        "length of string 2 of array 'tokenizer.ggml.tokens'",
        s2_len_at,
        8,
    );
}

#[test]
fn truncated_inside_a_tensor_descriptor() {
    let built = sample_spec().build();
    let bytes = &built.bytes;
    // Tensor 0: "token_embd.weight" (17 bytes).
    let t0 = built.tensor_desc_at[0];
    assert_truncated(bytes, t0 + 3, "name length of tensor 0", t0, 8);
    assert_truncated(bytes, t0 + 8 + 5, "name of tensor 0", t0 + 8, 17);
    // Tensor 1: "blk.0.attn_q.weight" (19 bytes), dims [32, 2].
    let t1 = built.tensor_desc_at[1];
    let name = "blk.0.attn_q.weight";
    let ndims_at = t1 + 8 + name.len();
    assert_truncated(
        bytes,
        ndims_at + 2,
        &format!("n_dims of tensor '{name}'"),
        ndims_at,
        4,
    );
    let dim1_at = ndims_at + 4 + 8;
    assert_truncated(
        bytes,
        dim1_at + 4,
        &format!("dimension 1 of tensor '{name}'"),
        dim1_at,
        8,
    );
    let type_at = dim1_at + 8;
    assert_truncated(
        bytes,
        type_at + 1,
        &format!("type of tensor '{name}'"),
        type_at,
        4,
    );
    // Last tensor's offset field ends the header.
    let off_at = built.header_len - 8;
    assert_truncated(
        bytes,
        off_at + 7,
        "offset of tensor 'output_norm.weight'",
        off_at,
        8,
    );
}

/// What a file cut at `cut` (inside the header of `sample_spec()`) must give:
/// `true` for Truncated, `false` for CountTooLarge. A count is rejected up
/// front when even its minimum-size entries cannot fit in what is left: the
/// header counts (24 + 5 keys * 14 + 3 tensors * 24 bytes), and the string
/// array's 3 elements (8 bytes each at least).
fn cut_is_truncated(built: &common::Built, cut: usize) -> bool {
    let plausible = 24 + 5 * 14 + 3 * 24;
    let tokens_data = built.kv_at[4] + 8 + 21 + 4 + 12;
    let in_counts = (24..plausible).contains(&cut);
    let in_tokens = (tokens_data..tokens_data + 3 * 8).contains(&cut);
    !(in_counts || in_tokens)
}

#[test]
fn every_cut_inside_the_header_is_an_error() {
    let built = sample_spec().build();
    let mut truncated = 0;
    for cut in 0..built.header_len {
        match err(&built.bytes[..cut]) {
            Error::Truncated { file_len, .. } if cut_is_truncated(&built, cut) => {
                assert_eq!(file_len, cut as u64);
                truncated += 1;
            }
            Error::CountTooLarge { .. } if !cut_is_truncated(&built, cut) => {}
            e => panic!("cut at {cut}: unexpected {e:?}"),
        }
    }
    assert!(truncated > built.header_len / 2);
}

// ---- counts ------------------------------------------------------------------

#[test]
fn tensor_count_2_pow_62_in_100_bytes() {
    let mut r = RawGguf::new();
    r.header(3, 1 << 62, 0);
    match err(&padded_100(r)) {
        Error::CountTooLarge {
            what,
            count,
            offset,
            remaining,
        } => {
            assert_eq!(what, "tensor");
            assert_eq!((count, offset, remaining), (1 << 62, 8, 76));
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn kv_count_u64_max_in_100_bytes() {
    let mut r = RawGguf::new();
    r.header(3, 0, u64::MAX);
    match err(&padded_100(r)) {
        Error::CountTooLarge {
            what,
            count,
            offset,
            remaining,
        } => {
            assert_eq!(what, "key/value");
            assert_eq!((count, offset, remaining), (u64::MAX, 16, 76));
        }
        e => panic!("{e:?}"),
    }
}

// ---- key/value entries -------------------------------------------------------

#[test]
fn string_length_past_end() {
    let mut r = RawGguf::new();
    r.header(3, 0, 1)
        .string(b"k")
        .u32(vt::STRING)
        .string_with_len(1000, b"abc");
    let bytes = padded_100(r);
    let at = 24 + 8 + 1 + 4 + 8;
    assert_truncated(&bytes, bytes.len(), "string value of key 'k'", at, 1000);
}

#[test]
fn key_length_u64_max() {
    let mut r = RawGguf::new();
    r.header(3, 0, 1).u64(u64::MAX);
    let bytes = padded_100(r);
    assert_truncated(&bytes, bytes.len(), "key of entry 0", 32, u64::MAX);
}

#[test]
fn array_count_whose_byte_size_overflows() {
    // 2^61 + 1 u64 elements: the byte size overflows u64.
    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_array("a", vt::U64, (1 << 61) + 1, &[]);
    match err(&padded_100(r)) {
        Error::CountTooLarge {
            what,
            count,
            offset,
            ..
        } => {
            assert!(what.contains("'a'"), "{what}");
            assert_eq!((count, offset), ((1 << 61) + 1, 24 + 8 + 1 + 4 + 4));
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn array_count_past_end() {
    // Fixed-size elements: the exact size runs past the end, a truncation.
    let mut r = RawGguf::new();
    r.header(3, 0, 1).kv_array("a", vt::U8, 1 << 40, &[]);
    let bytes = padded_100(r);
    assert_truncated(
        &bytes,
        bytes.len(),
        "array value of key 'a'",
        24 + 8 + 1 + 4 + 12,
        1 << 40,
    );
    // Strings: more elements than 8-byte lengths fit in what is left.
    for count in [u64::MAX, 20] {
        let mut r = RawGguf::new();
        r.header(3, 0, 1).kv_array("a", vt::STRING, count, &[]);
        match err(&padded_100(r)) {
            Error::CountTooLarge { count: c, .. } => assert_eq!(c, count),
            e => panic!("count {count}: {e:?}"),
        }
    }
}

#[test]
fn unknown_value_type() {
    let spec = GgufSpec::new()
        .kv(Kv::u32("a.b", 1))
        .kv(Kv::raw("x.y", 13, &[0; 8]));
    let built = spec.build();
    let type_at = built.kv_at[1] + 8 + 3;
    match err(&built.bytes) {
        Error::UnknownValueType {
            key,
            type_id,
            offset,
        } => {
            assert_eq!((key.as_str(), type_id, offset), ("x.y", 13, type_at as u64));
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn unknown_array_element_type() {
    let mut p = RawGguf::new();
    p.u32(13).u64(1).u32(0);
    let built = GgufSpec::new()
        .kv(Kv::raw("arr", vt::ARRAY, &p.bytes))
        .build();
    let elem_at = built.kv_at[0] + 8 + 3 + 4;
    match err(&built.bytes) {
        Error::UnknownValueType {
            key,
            type_id,
            offset,
        } => {
            assert_eq!((key.as_str(), type_id, offset), ("arr", 13, elem_at as u64));
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn nested_array() {
    let mut p = RawGguf::new();
    p.u32(vt::ARRAY).u64(1).u32(vt::U8).u64(1).u8(7);
    let built = GgufSpec::new()
        .kv(Kv::raw("arr", vt::ARRAY, &p.bytes))
        .build();
    let elem_at = built.kv_at[0] + 8 + 3 + 4;
    match err(&built.bytes) {
        Error::NestedArray { key, offset } => {
            assert_eq!((key.as_str(), offset), ("arr", elem_at as u64))
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn empty_key() {
    let built = GgufSpec::new()
        .kv(Kv::u32("a", 1))
        .kv(Kv::u32("", 1))
        .build();
    match err(&built.bytes) {
        Error::EmptyKey { offset } => assert_eq!(offset, built.kv_at[1] as u64),
        e => panic!("{e:?}"),
    }
}

#[test]
fn duplicate_key() {
    let built = GgufSpec::new()
        .kv(Kv::u32("a.k", 1))
        .kv(Kv::u32("b", 2))
        .kv(Kv::string("a.k", b"again"))
        .build();
    match err(&built.bytes) {
        Error::DuplicateKey { key, offset } => {
            assert_eq!((key.as_str(), offset), ("a.k", built.kv_at[2] as u64))
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn the_duplicate_named_is_the_first_repeat_in_file_order() {
    // The error names the entry a reader going through the file meets
    // first (ggml, gguf-py), whatever the keys' order and counts.
    for (keys, repeat) in [
        (["b", "a", "a", "b", "a"].as_slice(), 2),
        (&["z", "a", "z", "a"], 2),
    ] {
        let built = keys
            .iter()
            .enumerate()
            .fold(GgufSpec::new(), |spec, (i, k)| {
                spec.kv(Kv::u32(k, i as u32))
            })
            .build();
        match err(&built.bytes) {
            Error::DuplicateKey { key, offset } => {
                assert_eq!(
                    (key.as_str(), offset),
                    (keys[repeat], built.kv_at[repeat] as u64)
                )
            }
            e => panic!("{e:?}"),
        }
    }
}

#[test]
fn key_not_utf8() {
    let mut kv = Kv::u32("ab", 1);
    kv.key = vec![b'a', 0xff];
    let built = GgufSpec::new().kv(kv).build();
    assert!(
        matches!(err(&built.bytes), Error::InvalidUtf8 { offset, .. } if offset == built.kv_at[0] as u64)
    );
}

// ---- general.alignment -------------------------------------------------------

#[test]
fn alignment_as_i32() {
    let spec = GgufSpec::new().kv(Kv::i32("general.alignment", 32));
    assert!(matches!(
        err(&spec.bytes()),
        Error::AlignmentType { found: "i32" }
    ));
}

#[test]
fn alignment_as_u64() {
    let spec = GgufSpec::new().kv(Kv::u64("general.alignment", 32));
    assert!(matches!(
        err(&spec.bytes()),
        Error::AlignmentType { found: "u64" }
    ));
}

#[test]
fn alignment_0() {
    let spec = GgufSpec::new().kv(Kv::u32("general.alignment", 0));
    assert!(matches!(
        err(&spec.bytes()),
        Error::AlignmentValue { value: 0 }
    ));
}

#[test]
fn alignment_13() {
    let mut spec = GgufSpec::new().kv(Kv::u32("general.alignment", 13));
    spec.layout_alignment = 13;
    spec = spec.tensor(Tensor::new("a", tt::I8, &[3]));
    assert!(matches!(
        err(&spec.bytes()),
        Error::AlignmentValue { value: 13 }
    ));
}

#[test]
fn alignment_1_2_4_are_valid() {
    for a in [1u32, 2, 4] {
        let built = GgufSpec::new()
            .alignment_key(a)
            .tensor(Tensor::new("a", tt::I8, &[3]))
            .tensor(Tensor::new("b", tt::F16, &[3]))
            .tensor(Tensor::new("c", tt::F32, &[1]))
            .build();
        let h = ok(&built.bytes);
        assert_eq!(h.alignment(), u64::from(a));
        assert_eq!(
            h.data_offset(),
            align_up(built.header_len as u64, u64::from(a))
        );
        assert_eq!(h.data_offset(), built.data_offset as u64);
        for (t, &off) in h.tensors().iter().zip(&built.offsets) {
            assert_eq!(t.offset, off);
            assert_eq!(t.offset % u64::from(a), 0);
            assert_eq!(t.file_offset, built.data_offset as u64 + off);
        }
        // With alignment 1, "b" starts right after "a"'s 3 bytes.
        if a == 1 {
            assert_eq!(h.tensors().get(1).unwrap().offset, 3);
        }
    }
}

// ---- tensor descriptors ------------------------------------------------------

#[test]
fn tensor_name_64_bytes_is_too_long() {
    let name = "n".repeat(64);
    let built = GgufSpec::new()
        .tensor(Tensor::new("first", tt::F32, &[1]))
        .tensor(Tensor::new(&name, tt::F32, &[1]))
        .build();
    match err(&built.bytes) {
        Error::TensorNameTooLong { len, offset } => {
            assert_eq!((len, offset), (64, built.tensor_desc_at[1] as u64))
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn tensor_name_63_bytes_is_valid() {
    let name = "n".repeat(63);
    let h = ok(&GgufSpec::new()
        .tensor(Tensor::new(&name, tt::F32, &[1]))
        .bytes());
    assert_eq!(h.tensors().get(0).unwrap().name, name);
    assert_eq!(h.tensor_index(&name), Some(0));
}

#[test]
fn tensor_name_not_utf8() {
    let mut t = Tensor::new("ab", tt::F32, &[1]);
    t.name = vec![0xc3, 0x28];
    let built = GgufSpec::new().tensor(t).build();
    assert!(
        matches!(err(&built.bytes), Error::InvalidUtf8 { offset, .. } if offset == built.tensor_desc_at[0] as u64 + 8)
    );
}

#[test]
fn duplicate_tensor_names() {
    let spec = GgufSpec::new()
        .tensor(Tensor::new("w", tt::F32, &[4]))
        .tensor(Tensor::new("x", tt::F32, &[4]))
        .tensor(Tensor::new("w", tt::F32, &[4]));
    assert!(matches!(err(&spec.bytes()), Error::DuplicateTensor { name } if name == "w"));
}

#[test]
fn five_dims() {
    let spec = GgufSpec::new().tensor(Tensor::new("t5", tt::F32, &[1, 1, 1, 1, 1]));
    assert!(
        matches!(err(&spec.bytes()), Error::TooManyDims { tensor, n_dims: 5 } if tensor == "t5")
    );
}

#[test]
fn n_dims_u32_max() {
    let mut t = Tensor::new("t", tt::F32, &[1]);
    t.n_dims = Some(u32::MAX);
    let spec = GgufSpec::new().tensor(t);
    assert!(matches!(
        err(&spec.bytes()),
        Error::TooManyDims {
            n_dims: u32::MAX,
            ..
        }
    ));
}

#[test]
fn dim_minus_1() {
    let spec = GgufSpec::new().tensor(Tensor::new("neg", tt::F32, &[4, u64::MAX]));
    assert!(matches!(
        err(&spec.bytes()),
        Error::NegativeDim { tensor, index: 1, value: -1 } if tensor == "neg"
    ));
}

#[test]
fn element_count_overflow() {
    for dims in [
        &[1u64 << 32, 1 << 32][..],
        &[1 << 31, 1 << 31, 2],
        &[1 << 62, 2],
    ] {
        let spec = GgufSpec::new().tensor(Tensor::new("big", tt::F32, dims));
        assert!(
            matches!(
                err(&spec.bytes()),
                Error::TensorSizeOverflow { ref tensor, what: "element count" } if tensor == "big"
            ),
            "{dims:?}"
        );
    }
}

#[test]
fn byte_size_2_pow_64_minus_16() {
    // ggml's case: a size of 2^64 - 16 wraps to 0 when padded to 32. As F32
    // and as F64, with an element count below INT64_MAX.
    for (ty, n) in [(tt::F32, (1u64 << 62) - 4), (28, (1u64 << 61) - 2)] {
        let spec = GgufSpec::new().tensor(Tensor::new("huge", ty, &[n]));
        assert!(
            matches!(
                err(&spec.bytes()),
                Error::TensorSizeOverflow { ref tensor, what: "byte size" } if tensor == "huge"
            ),
            "type {ty}"
        );
    }
}

#[test]
fn type_id_past_the_table() {
    let spec = GgufSpec::new().tensor(Tensor::new("t", 43, &[1]));
    assert!(
        matches!(err(&spec.bytes()), Error::UnknownTensorType { tensor, type_id: 43 } if tensor == "t")
    );
    let spec = GgufSpec::new().tensor(Tensor::new("t", u32::MAX, &[1]));
    assert!(matches!(
        err(&spec.bytes()),
        Error::UnknownTensorType {
            type_id: u32::MAX,
            ..
        }
    ));
}

#[test]
fn removed_type_ids() {
    for id in [4u32, 5, 31, 36] {
        let spec = GgufSpec::new().tensor(Tensor::new("t", id, &[32]));
        assert!(
            matches!(err(&spec.bytes()), Error::UnknownTensorType { type_id, .. } if type_id == id),
            "id {id}"
        );
    }
}

#[test]
fn type_id_42_q2_0_is_valid() {
    let h = ok(&GgufSpec::new()
        .tensor(Tensor::new("q", tt::Q2_0, &[64, 2]))
        .bytes());
    let t = &h.tensors().get(0).unwrap();
    assert_eq!(t.ty, TensorType::Q2_0);
    assert_eq!(t.nbytes, 2 * 18);
}

#[test]
fn ne0_33_with_q4_0_is_a_block_mismatch() {
    let spec = GgufSpec::new().tensor(Tensor::new("q", tt::Q4_0, &[33, 2]));
    assert!(matches!(
        err(&spec.bytes()),
        Error::BlockMismatch { tensor, ty: TensorType::Q4_0, ne0: 33, block_size: 32 } if tensor == "q"
    ));
    // Only ne[0] must be whole blocks.
    let h = ok(&GgufSpec::new()
        .tensor(Tensor::new("q", tt::Q4_0, &[32, 33]))
        .bytes());
    assert_eq!(h.tensors().get(0).unwrap().nbytes, 33 * 18);
}

#[test]
fn offset_not_a_multiple_of_the_alignment() {
    let mut t = Tensor::new("b", tt::F32, &[4]);
    t.offset = Some(48);
    let spec = GgufSpec::new()
        .tensor(Tensor::new("a", tt::F32, &[4]))
        .tensor(t);
    assert!(matches!(
        err(&spec.bytes()),
        Error::MisalignedOffset { tensor, offset: 48, alignment: 32 } if tensor == "b"
    ));
}

#[test]
fn offsets_laid_out_with_alignment_1_when_32_applies() {
    let mut spec = GgufSpec::new()
        .tensor(Tensor::new("a", tt::F32, &[3]))
        .tensor(Tensor::new("b", tt::F32, &[2]));
    spec.layout_alignment = 1;
    assert_eq!(spec.build().offsets, [0, 12]);
    assert!(matches!(
        err(&spec.bytes()),
        Error::MisalignedOffset { tensor, offset: 12, alignment: 32 } if tensor == "b"
    ));
}

#[test]
fn offset_u64_max() {
    let mut t = Tensor::new("t", tt::F32, &[4]);
    t.offset = Some(u64::MAX);
    let spec = GgufSpec::new().tensor(t.clone());
    assert!(matches!(
        err(&spec.bytes()),
        Error::MisalignedOffset {
            offset: u64::MAX,
            ..
        }
    ));
    // Aligned, but data offset + offset wraps.
    t.offset = Some(!31);
    let spec = GgufSpec::new().tensor(t.clone());
    assert!(matches!(
        err(&spec.bytes()),
        Error::TensorSizeOverflow {
            what: "offset + size",
            ..
        }
    ));
    // With alignment 1, offset + size itself wraps.
    t.offset = Some(u64::MAX);
    let spec = GgufSpec::new().alignment_key(1).tensor(t);
    assert!(matches!(
        err(&spec.bytes()),
        Error::TensorSizeOverflow { .. }
    ));
}

#[test]
fn last_tensor_one_byte_short() {
    let built = sample_spec().build();
    let last = built.offsets.len() - 1;
    let end = built.tensor_end(last);
    let short = built.truncated(end - 1);
    match err(&short) {
        Error::TensorOutOfBounds {
            tensor,
            start,
            end: e,
            file_len,
        } => {
            assert_eq!(tensor, "output_norm.weight");
            assert_eq!(
                (start, e, file_len),
                (
                    (built.data_offset as u64 + built.offsets[last]),
                    end as u64,
                    end as u64 - 1
                )
            );
        }
        e => panic!("{e:?}"),
    }
    // The tensor's end, without the trailing padding, is enough (llama.cpp's rule).
    assert_eq!(ok(&built.truncated(end)).tensors().len(), 3);
}

#[test]
fn two_i8_tensors_of_0x7fffffffffffffc0_elements() {
    const N: u64 = 0x7FFF_FFFF_FFFF_FFC0;
    let mut r = RawGguf::new();
    r.header(3, 2, 0)
        .tensor(b"a", &[N], tt::I8, 0)
        .tensor(b"b", &[N], tt::I8, N)
        .pad_to(32)
        .zeros(64);
    assert!(matches!(err(&r.bytes), Error::TensorOutOfBounds { tensor, .. } if tensor == "a"));
}

#[test]
fn overlapping_tensors() {
    let mut b = Tensor::new("b", tt::F32, &[16]);
    b.offset = Some(32);
    let built = GgufSpec::new()
        .tensor(Tensor::new("a", tt::F32, &[16]))
        .tensor(b)
        .build();
    let d = built.data_offset as u64;
    match err(&built.bytes) {
        Error::TensorOverlap {
            tensor,
            start,
            end,
            other,
        } => {
            assert_eq!((tensor.as_str(), other.as_str()), ("b", "a"));
            assert_eq!((start, end), (d + 32, d + 96));
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn zero_dim_tensor_is_valid_with_0_bytes() {
    let built = GgufSpec::new()
        .tensor(Tensor::new("empty", tt::F32, &[0, 4]))
        .tensor(Tensor::new("next", tt::F32, &[2]))
        .build();
    let file = GgufHeader::parse(&built.bytes).unwrap();
    let (e, n) = (
        &file.tensors().get(0).unwrap(),
        &file.tensors().get(1).unwrap(),
    );
    assert_eq!((e.nbytes, e.n_elements(), e.shape), (0, 0, &[0u64, 4][..]));
    assert_eq!(e.offset, n.offset, "a 0-byte tensor takes no room");
    assert!(&built.bytes[e.file_offset as usize..][..e.nbytes as usize].is_empty());
    assert_eq!(
        &built.bytes[n.file_offset as usize..][..n.nbytes as usize],
        &common::pattern(1, 8)[..]
    );
}

#[test]
fn header_with_no_tensors_and_no_keys() {
    let mut r = RawGguf::new();
    r.header(3, 0, 0);
    let file = GgufHeader::parse(&r.bytes).unwrap();
    assert_eq!((file.tensors().len(), file.kv_count()), (0, 0));
    assert_eq!(file.header_len(), 24);
    assert!(file.metadata_in(&r.bytes).is_empty());
}

#[test]
fn valid_sample_file_round_trips() {
    let built = sample_spec().build();
    let file = GgufHeader::parse(&built.bytes).unwrap();
    assert_eq!(file.header_len(), built.header_len as u64);
    assert_eq!(file.data_offset(), built.data_offset as u64);
    for (i, t) in file.tensors().iter().enumerate() {
        assert_eq!(t.offset, built.offsets[i]);
        assert_eq!(t.nbytes, built.nbytes[i]);
        assert_eq!(
            &built.bytes[t.file_offset as usize..][..t.nbytes as usize],
            &common::pattern(i, t.nbytes as usize)[..]
        );
    }
    let tokens: Vec<&[u8]> = file
        .metadata_in(&built.bytes)
        .get_array("tokenizer.ggml.tokens")
        .unwrap()
        .strings()
        .unwrap()
        .map(|s| s.as_bytes())
        .collect();
    assert_eq!(tokens, [&b"<s>"[..], b"hello", b"world"]);
}

// ---- parse_prefix ------------------------------------------------------------

#[test]
fn parse_prefix_needs_more_until_complete() {
    let built = sample_spec().build();
    let bytes = &built.bytes;
    let len = bytes.len() as u64;
    let whole = ok(bytes);
    for n in 0..=bytes.len() {
        match GgufHeader::parse_prefix(&bytes[..n], len).unwrap() {
            Parse::NeedMore { min_len } => {
                assert!(n < built.header_len, "prefix {n}: NeedMore past the header");
                assert!(
                    min_len > n as u64 && min_len <= len,
                    "prefix {n}: min_len {min_len}"
                );
            }
            Parse::Complete(h) => {
                assert!(
                    n >= built.header_len,
                    "prefix {n}: complete before the header ends"
                );
                assert_eq!(h.tensors(), whole.tensors());
                assert_eq!(h.kv_count(), whole.kv_count());
                assert_eq!(
                    (h.alignment(), h.data_offset(), h.file_len()),
                    (whole.alignment(), whole.data_offset(), len)
                );
                assert_eq!(
                    h.metadata_in(&bytes[..n])
                        .get_u32("llama.block_count")
                        .unwrap(),
                    2
                );
            }
        }
    }
}

#[test]
fn parse_prefix_following_min_len_reaches_complete() {
    let bytes = sample_spec().bytes();
    let len = bytes.len() as u64;
    let (mut n, mut steps) = (0usize, 0);
    let h = loop {
        match GgufHeader::parse_prefix(&bytes[..n], len).unwrap() {
            Parse::Complete(h) => break h,
            Parse::NeedMore { min_len } => n = min_len as usize,
        }
        steps += 1;
        assert!(steps < 200, "no progress");
    };
    assert_eq!(h.tensors(), ok(&bytes).tensors());
    assert_eq!(h.kv_count(), 5);
}

#[test]
fn parse_prefix_of_a_truncated_file_is_truncated_never_need_more() {
    let built = sample_spec().build();
    for cut in 0..built.header_len {
        let file = &built.bytes[..cut];
        match GgufHeader::parse_prefix(file, cut as u64) {
            Ok(Parse::NeedMore { min_len }) => {
                panic!("cut {cut}: NeedMore({min_len}) on a whole file")
            }
            Ok(Parse::Complete(_)) => panic!("cut {cut}: complete"),
            Err(Error::Truncated { file_len, .. }) if cut_is_truncated(&built, cut) => {
                assert_eq!(file_len, cut as u64)
            }
            Err(Error::CountTooLarge { .. }) if !cut_is_truncated(&built, cut) => {}
            Err(e) => panic!("cut {cut}: {e:?}"),
        }
    }
}

#[test]
fn parse_prefix_checks_tensor_bounds_against_file_len() {
    let built = sample_spec().build();
    let header = &built.bytes[..built.header_len];
    let end = built.tensor_end(2) as u64;
    assert!(matches!(
        GgufHeader::parse_prefix(header, end),
        Ok(Parse::Complete(_))
    ));
    assert!(matches!(
        GgufHeader::parse_prefix(header, end - 1),
        Err(Error::TensorOutOfBounds { tensor, .. }) if tensor == "output_norm.weight"
    ));
}

// ---- metadata getters --------------------------------------------------------

fn getter_file() -> common::Built {
    GgufSpec::new()
        .kv(Kv::u64("a.u64", 5))
        .kv(Kv::string("a.bad", &[b'o', b'k', 0xff, 0xfe]))
        .kv(Kv::bool("a.bool", 2))
        .build()
}

#[test]
fn get_u32_on_a_u64_key() {
    let built = getter_file();
    let file = GgufHeader::parse(&built.bytes).unwrap();
    let md = file.metadata_in(&built.bytes);
    assert_eq!(md.get_u64("a.u64").unwrap(), 5);
    match md.get_u32("a.u64") {
        Err(Error::WrongValueType {
            key,
            expected,
            found,
        }) => {
            assert_eq!((key.as_str(), expected, found), ("a.u64", "u32", "u64"))
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn missing_key() {
    let built = getter_file();
    let file = GgufHeader::parse(&built.bytes).unwrap();
    assert!(
        matches!(file.metadata_in(&built.bytes).get_str("a.missing"), Err(Error::KeyNotFound { key }) if key == "a.missing")
    );
    assert!(file.metadata_in(&built.bytes).get("a.missing").is_none());
}

#[test]
fn get_str_on_non_utf8() {
    let built = getter_file();
    let file = GgufHeader::parse(&built.bytes).unwrap();
    let md = file.metadata_in(&built.bytes);
    let bytes_at = built.kv_at[1] + 8 + 5 + 4 + 8;
    match md.get_str("a.bad") {
        Err(Error::InvalidUtf8 { what, offset }) => {
            assert!(what.contains("a.bad"), "{what}");
            assert_eq!(offset, bytes_at as u64);
        }
        r => panic!("{r:?}"),
    }
    assert_eq!(
        md.get_gguf_str("a.bad").unwrap().as_bytes(),
        [b'o', b'k', 0xff, 0xfe]
    );
}

#[test]
fn bool_nonzero_is_true() {
    let built = getter_file();
    let file = GgufHeader::parse(&built.bytes).unwrap();
    assert!(file.metadata_in(&built.bytes).get_bool("a.bool").unwrap());
}

/// The test suite's layout of a valid file is the library writer's, byte
/// for byte: `GgufSpec` exists for the fields a test overrides and the
/// offsets it patches, not as a second idea of what a GGUF file is.
#[test]
fn spec_layout_is_the_writers() {
    use weightmap::gguf::ValueType;
    use weightmap::gguf::{OwnedValue, Writer};
    use weightmap::TensorType;
    let mut w = Writer::new(32);
    w.kv_str("general.name", &"n".repeat(200))
        .kv_u32("llama.block_count", 2)
        .kv_str("general.architecture", "llama")
        .kv(
            "test.u32_array",
            OwnedValue::Array(ValueType::U32, (1..=4).map(OwnedValue::U32).collect()),
        )
        .kv_str_array("tokenizer.ggml.tokens", &["<s>", "hello", "world"]);
    for (i, (name, ty, dims)) in [
        ("token_embd.weight", TensorType::F32, &[4u64, 3][..]),
        ("blk.0.attn_q.weight", TensorType::Q4_0, &[32, 2]),
        ("output_norm.weight", TensorType::F16, &[5]),
    ]
    .into_iter()
    .enumerate()
    {
        let n = ty.bytes_for(dims.iter().product()).unwrap() as usize;
        w.tensor(name, ty, dims, common::pattern(i, n));
    }
    assert_eq!(w.to_bytes(), common::sample_spec().bytes());
}
