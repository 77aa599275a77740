//! The safetensors format layer against the Python reference writer's files
//! (testdata/*.safetensors) and hand-made malformed headers.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};
use weightmap::safetensors::SafetensorsHeader;
use weightmap::{Error, Format, Parse, TensorType};

const MAX_HEADER_LEN: u64 = SafetensorsHeader::MAX_HEADER_LEN;

/// Whether the format detection takes `prefix` for safetensors.
fn sniff(prefix: &[u8]) -> bool {
    matches!(Format::detect(prefix), Ok(Format::Safetensors))
}

const FIXTURES: [&str; 3] = [
    "tiny.safetensors",
    "bf16.safetensors",
    "odd-offsets.safetensors",
];

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

fn load(name: &str) -> (Vec<u8>, Value) {
    let bytes = std::fs::read(testdata(name)).unwrap();
    let manifest = std::fs::read(testdata(&format!("{name}.json"))).unwrap();
    (bytes, serde_json::from_slice(&manifest).unwrap())
}

fn dtype(s: &str) -> TensorType {
    match s {
        "F64" => TensorType::F64,
        "F32" => TensorType::F32,
        "F16" => TensorType::F16,
        "BF16" => TensorType::BF16,
        "I8" => TensorType::I8,
        "I16" => TensorType::I16,
        "I32" => TensorType::I32,
        "I64" => TensorType::I64,
        "U8" => TensorType::U8,
        "U16" => TensorType::U16,
        "U32" => TensorType::U32,
        "U64" => TensorType::U64,
        "BOOL" => TensorType::Bool,
        other => panic!("manifest dtype {other} not in the test's table"),
    }
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A safetensors file: the 8-byte length, `json`, then `data_len` bytes.
fn file(json: &str, data_len: usize) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.extend((0..data_len).map(|i| i as u8));
    v
}

fn err(bytes: &[u8]) -> Error {
    match SafetensorsHeader::parse(bytes) {
        Ok(h) => panic!("expected an error, parsed {h:?}"),
        Err(e) => e,
    }
}

fn header_detail(bytes: &[u8]) -> String {
    match err(bytes) {
        Error::SafetensorsHeader { detail } => detail,
        e => panic!("expected SafetensorsHeader, got {e:?}"),
    }
}

// ---- reference fixtures --------------------------------------------------------

#[test]
fn fixtures_match_their_manifests() {
    for name in FIXTURES {
        let (bytes, m) = load(name);
        let h = SafetensorsHeader::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(h.header_len(), m["header_len"].as_u64().unwrap(), "{name}");
        assert_eq!(h.data_offset(), m["data_start"].as_u64().unwrap(), "{name}");
        assert_eq!(h.file_len(), m["file_size"].as_u64().unwrap(), "{name}");
        assert_eq!(h.file_len(), bytes.len() as u64, "{name}");

        let want_meta: std::collections::BTreeMap<String, String> = match &m["metadata"] {
            Value::Null => Default::default(),
            v => serde_json::from_value(v.clone()).unwrap(),
        };
        assert_eq!(h.metadata(), &want_meta, "{name}");

        let tensors = m["tensors"].as_array().unwrap();
        assert_eq!(h.tensors().len(), tensors.len(), "{name}");
        for (i, (t, w)) in h.tensors().iter().zip(tensors).enumerate() {
            let tn = w["name"].as_str().unwrap();
            let ctx = format!("{name}: tensor {i} '{tn}'");
            assert_eq!(t.name, tn, "{ctx}: data order");
            assert_eq!(t.ty, dtype(w["dtype"].as_str().unwrap()), "{ctx}");
            let shape = u64s(&w["shape"]);
            assert_eq!(t.shape, &shape[..], "{ctx}");
            assert!(t.outer_first, "{ctx}");
            let mut ne = shape.clone();
            ne.reverse();
            assert_eq!(t.ne(), ne, "{ctx}");
            assert_eq!(t.n_elements(), shape.iter().product::<u64>(), "{ctx}");
            let nbytes = w["nbytes"].as_u64().unwrap();
            assert_eq!(t.nbytes, nbytes, "{ctx}");
            let offs = u64s(&w["data_offsets"]);
            assert_eq!((t.offset, t.offset + t.nbytes), (offs[0], offs[1]), "{ctx}");
            assert_eq!(t.file_offset, w["offset"].as_u64().unwrap(), "{ctx}");
            assert_eq!(t.file_offset, h.data_offset() + t.offset, "{ctx}");
            let r = t.file_range();
            let data = &bytes[r.start as usize..r.end as usize];
            assert_eq!(
                hex(&Sha256::digest(data)),
                w["sha256"].as_str().unwrap(),
                "{ctx}"
            );
            assert_eq!(h.tensor_index(tn), Some(i), "{ctx}");
        }
        assert_eq!(h.tensor_index("no.such.tensor"), None);
        assert_eq!(h.tensor_index(""), None);
        // The data section is fully covered: the last tensor ends the file.
        let end = h
            .tensors()
            .iter()
            .map(|t| t.file_range().end)
            .max()
            .unwrap();
        assert_eq!(end, h.file_len(), "{name}");
    }
}

#[test]
fn fixture_details_the_readme_promises() {
    let h = SafetensorsHeader::parse(&load("tiny.safetensors").0).unwrap();
    let t = |n: &str| h.tensors().get(h.tensor_index(n).unwrap()).unwrap();
    assert_eq!(h.data_offset(), 976);
    assert_eq!((t("scalar").shape.len(), t("scalar").nbytes), (0, 4));
    assert_eq!(t("scalar").n_elements(), 1);
    assert_eq!(
        (t("empty2d").shape, t("empty2d").nbytes),
        (&[2u64, 0][..], 0)
    );
    // two zero-size tensors share the offset of the tensor after them
    assert_eq!(t("empty").file_offset, t("f32.matrix").file_offset);
    assert_eq!(t("empty2d").file_offset, t("f32.matrix").file_offset);
    assert_eq!(t("bool").ty, TensorType::Bool);

    let h = SafetensorsHeader::parse(&load("bf16.safetensors").0).unwrap();
    let bf = h
        .tensors()
        .get(h.tensor_index("bf16.matrix").unwrap())
        .unwrap();
    assert_eq!(
        (bf.ty, bf.shape, bf.nbytes),
        (TensorType::BF16, &[4u64, 3][..], 24)
    );

    let h = SafetensorsHeader::parse(&load("odd-offsets.safetensors").0).unwrap();
    assert!(h.metadata().is_empty());
    assert_eq!(h.data_offset(), 400);
    assert!(h.tensors().iter().any(|t| t.file_offset % 2 == 1));
}

#[test]
fn sniff_accepts_safetensors_and_rejects_others() {
    for name in FIXTURES {
        assert!(sniff(&load(name).0), "{name}");
    }
    for name in ["tiny-llama.gguf", "empty.gguf"] {
        assert!(!sniff(&std::fs::read(testdata(name)).unwrap()), "{name}");
    }
    let with_len = |n: u64, next: u8| {
        let mut v = n.to_le_bytes().to_vec();
        v.push(next);
        v
    };
    assert!(sniff(&with_len(2, b'{')));
    assert!(sniff(&with_len(MAX_HEADER_LEN, b'{')));
    assert!(!sniff(&with_len(1, b'{')));
    assert!(!sniff(&with_len(0, b'{')));
    assert!(!sniff(&with_len(MAX_HEADER_LEN + 1, b'{')));
    assert!(!sniff(&with_len(u64::MAX, b'{')));
    assert!(!sniff(&with_len(2, b' ')));
    assert!(!sniff(&2u64.to_le_bytes())); // no byte 8
    assert!(!sniff(&[]));
}

// ---- parse_prefix ----------------------------------------------------------------

#[test]
fn growing_prefixes_reach_the_whole_parse() {
    for name in FIXTURES {
        let (bytes, _) = load(name);
        let whole = SafetensorsHeader::parse(&bytes).unwrap();
        let file_len = bytes.len() as u64;
        let data_start = whole.data_offset() as usize;
        for k in 0..=bytes.len() {
            let got = SafetensorsHeader::parse_prefix(&bytes[..k], file_len)
                .unwrap_or_else(|e| panic!("{name}: prefix {k}: {e}"));
            let want = if k < 8 {
                Parse::NeedMore { min_len: 8 }
            } else if k < data_start {
                Parse::NeedMore {
                    min_len: data_start as u64,
                }
            } else {
                Parse::Complete(whole.clone())
            };
            assert_eq!(got, want, "{name}: prefix {k}");
        }
        // Bytes past file_len are ignored.
        let mut longer = bytes.clone();
        longer.extend_from_slice(b"trailing garbage");
        assert_eq!(
            SafetensorsHeader::parse_prefix(&longer, file_len).unwrap(),
            Parse::Complete(whole.clone())
        );
        // The loop the streaming loader runs: grow to min_len until Complete.
        let mut len = 0u64;
        let mut rounds = 0;
        let got = loop {
            rounds += 1;
            match SafetensorsHeader::parse_prefix(&bytes[..len as usize], file_len).unwrap() {
                Parse::Complete(h) => break h,
                Parse::NeedMore { min_len } => {
                    assert!(min_len > len && min_len <= file_len, "{name}: {min_len}");
                    len = min_len;
                }
            }
        };
        assert_eq!((got, rounds), (whole, 3), "{name}");
    }
}

#[test]
fn prefix_checks_bounds_against_the_file_length() {
    let bytes = file(
        r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
        4,
    );
    let n = bytes.len() as u64;
    // The same header validated against a file one byte too short or long.
    assert!(matches!(
        SafetensorsHeader::parse_prefix(&bytes, n - 1),
        Err(Error::TensorOutOfBounds { file_len, .. }) if file_len == n - 1
    ));
    assert!(matches!(
        SafetensorsHeader::parse_prefix(&bytes, n + 1),
        Err(Error::SafetensorsHeader { .. })
    ));
    // The header itself longer than the file: an error, not NeedMore.
    assert!(matches!(
        SafetensorsHeader::parse_prefix(&bytes[..8], 20),
        Err(Error::Truncated { needed, file_len: 20, .. }) if needed == n - 8 - 4
    ));
    // A file shorter than the length prefix: an error even with no prefix.
    assert!(matches!(
        SafetensorsHeader::parse_prefix(&[], 7),
        Err(Error::Truncated {
            needed: 8,
            file_len: 7,
            ..
        })
    ));
    // The limit is checked before asking for more bytes.
    let huge = (MAX_HEADER_LEN + 1).to_le_bytes();
    assert!(matches!(
        SafetensorsHeader::parse_prefix(&huge, u64::MAX),
        Err(Error::SafetensorsHeader { .. })
    ));
    let max = MAX_HEADER_LEN.to_le_bytes();
    assert_eq!(
        SafetensorsHeader::parse_prefix(&max, u64::MAX).unwrap(),
        Parse::NeedMore {
            min_len: MAX_HEADER_LEN + 8
        }
    );
}

// ---- malformed files --------------------------------------------------------------

#[test]
fn file_shorter_than_eight_bytes() {
    for len in 0..8 {
        let bytes = vec![2u8; len];
        assert!(
            matches!(err(&bytes), Error::Truncated { offset: 0, needed: 8, file_len, .. } if file_len == len as u64),
            "{len}"
        );
    }
}

#[test]
fn header_length_past_the_end() {
    let mut bytes = 100u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    assert!(matches!(
        err(&bytes),
        Error::Truncated {
            offset: 8,
            needed: 100,
            file_len: 10,
            ..
        }
    ));
    // One byte short of a valid file.
    let good = file("{}", 0);
    assert!(SafetensorsHeader::parse(&good).is_ok());
    assert!(matches!(
        err(&good[..good.len() - 1]),
        Error::Truncated { .. }
    ));
}

#[test]
fn header_length_over_the_limit() {
    for n in [MAX_HEADER_LEN + 1, u64::MAX / 2, u64::MAX - 7, u64::MAX] {
        let mut bytes = n.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let d = header_detail(&bytes);
        assert!(d.contains("exceeds the limit"), "{n}: {d}");
    }
}

#[test]
fn invalid_json() {
    for json in [
        r#"{"a":"#,
        "",
        " ",
        "[]",
        "null",
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} x"#,
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},}"#,
    ] {
        let d = header_detail(&file(json, 1));
        assert!(d.starts_with("invalid JSON"), "{json:?}: {d}");
    }
    // Well-formed JSON, wrong shapes of entries: named in the error.
    for (json, needle) in [
        (
            r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#,
            "tensor 'a'",
        ),
        (r#"{"a":{"dtype":"U8","shape":[1]}}"#, "tensor 'a'"),
        (
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}}"#,
            "tensor 'a'",
        ),
        (r#"{"a":[1,2,3]}"#, "tensor 'a'"),
        (r#"{"__metadata__":{"k":1}}"#, "__metadata__"),
        (r#"{"__metadata__":"x"}"#, "__metadata__"),
    ] {
        let d = header_detail(&file(json, 1));
        assert!(d.contains(needle), "{json:?}: {d}");
    }
}

#[test]
fn non_utf8_header() {
    let mut bytes = file(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
        1,
    );
    bytes[8 + 2] = 0xFF; // inside the name "a"
    assert!(matches!(err(&bytes), Error::InvalidUtf8 { offset: 10, .. }));
}

#[test]
fn offsets_past_the_data_end() {
    let json = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let bytes = file(json, 8);
    let n = bytes.len() as u64;
    let d = 8 + json.len() as u64;
    match err(&bytes) {
        Error::TensorOutOfBounds {
            tensor,
            start,
            end,
            file_len,
        } => assert_eq!((tensor.as_str(), start, end, file_len), ("a", d, d + 16, n)),
        e => panic!("{e:?}"),
    }
    // A zero-size tensor placed past the end is out of bounds too.
    let json = r#"{"z":{"dtype":"F32","shape":[0],"data_offsets":[9,9]},"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}"#;
    assert!(
        matches!(err(&file(json, 8)), Error::TensorOutOfBounds { tensor, .. } if tensor == "z")
    );
}

#[test]
fn huge_offsets_do_not_wrap() {
    // Offsets near u64::MAX: start + data_offset would wrap.
    let json = format!(
        r#"{{"a":{{"dtype":"U8","shape":[8],"data_offsets":[{},{}]}}}}"#,
        u64::MAX - 8,
        u64::MAX
    );
    assert!(matches!(
        err(&file(&json, 8)),
        Error::TensorSizeOverflow { tensor, what: "offset + size" } if tensor == "a"
    ));
    // The safetensors crate's pitfall: eight contiguous U8 tensors of
    // 2^61 - 1 bytes each (sum 2^64 - 8). Must be an error, not a panic.
    let each = (1u64 << 61) - 1;
    let entries: Vec<String> = (0..8)
        .map(|i| {
            format!(
                r#""t{i}":{{"dtype":"U8","shape":[{each}],"data_offsets":[{},{}]}}"#,
                i * each,
                (i + 1) * each
            )
        })
        .collect();
    let json = format!("{{{}}}", entries.join(","));
    assert!(matches!(
        err(&file(&json, 16)),
        Error::TensorOutOfBounds { tensor, end, .. } if tensor == "t0" && end == 8 + json.len() as u64 + each
    ));
}

#[test]
fn overlapping_offsets() {
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let d = 8 + json.len() as u64;
    match err(&file(json, 12)) {
        Error::TensorOverlap {
            tensor,
            start,
            end,
            other,
        } => assert_eq!(
            (tensor.as_str(), start, end, other.as_str()),
            ("b", d + 4, d + 12, "a")
        ),
        e => panic!("{e:?}"),
    }
    // Identical ranges.
    let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    assert!(
        matches!(err(&file(json, 4)), Error::TensorOverlap { tensor, other, .. } if tensor == "b" && other == "a")
    );
    // One large tensor covering a later one that does not touch its neighbour.
    let json = r#"{"big":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},"x":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"y":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}}"#;
    assert!(
        matches!(err(&file(json, 16)), Error::TensorOverlap { tensor, other, .. } if tensor == "x" && other == "big")
    );
}

#[test]
fn zero_size_tensors_occupy_nothing() {
    let json = r#"{"z0":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"z1":{"dtype":"I64","shape":[3,0],"data_offsets":[4,4]},"z2":{"dtype":"BOOL","shape":[0],"data_offsets":[4,4]}}"#;
    let h = SafetensorsHeader::parse(&file(json, 4)).unwrap();
    let names: Vec<&str> = h.tensors().iter().map(|t| t.name).collect();
    assert_eq!(names, ["z0", "a", "z1", "z2"]);
    assert_eq!(h.tensors().get(2).unwrap().file_offset, h.data_offset() + 4);
    // A header with no tensors at all and no data.
    let h = SafetensorsHeader::parse(&file("{}", 0)).unwrap();
    assert!(h.tensors().is_empty() && h.metadata().is_empty());
    assert_eq!(h.data_offset(), h.file_len());
}

#[test]
fn gaps_and_order_as_the_safetensors_crate_judges_them() {
    // A gap between tensors.
    let json = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    let d = header_detail(&file(json, 12));
    assert!(d.contains("`b`"), "{d}");
    // Data not starting at 0.
    let json = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let d = header_detail(&file(json, 8));
    assert!(d.contains("`a`"), "{d}");
    // A zero-size tensor inside another's bytes is a gap to the crate.
    let json = r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}}"#;
    let d = header_detail(&file(json, 8));
    assert!(d.contains("`z`"), "{d}");
    // End before begin.
    let json = r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#;
    let d = header_detail(&file(json, 4));
    assert!(d.contains("'a'") && d.contains("before"), "{d}");
    // Bytes after the data section (the crate's MetadataIncompleteBuffer).
    let json = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let d = header_detail(&file(json, 6));
    assert!(d.contains("not covered"), "{d}");
    let d = header_detail(&file("{}", 1));
    assert!(d.contains("not covered"), "{d}");
    // JSON order differing from data order is fine; tensors() is data order.
    let json = r#"{"second":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"first":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let h = SafetensorsHeader::parse(&file(json, 6)).unwrap();
    let names: Vec<&str> = h.tensors().iter().map(|t| t.name).collect();
    assert_eq!(names, ["first", "second"]);
    assert_eq!(h.tensor_index("second"), Some(1));
}

#[test]
fn dtype_shape_size_mismatch() {
    for (json, len) in [
        (
            r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}"#,
            16,
        ),
        (
            r#"{"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,4]}}"#,
            4,
        ),
        (r#"{"w":{"dtype":"U8","shape":[],"data_offsets":[0,0]}}"#, 0),
    ] {
        let d = header_detail(&file(json, len));
        assert!(d.contains("'w'") && d.contains("needs"), "{json}: {d}");
    }
}

#[test]
fn shape_product_overflow() {
    let json = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{},8],"data_offsets":[0,4]}}}}"#,
        1u64 << 62
    );
    assert!(matches!(
        err(&file(&json, 4)),
        Error::TensorSizeOverflow { tensor, what: "element count" } if tensor == "w"
    ));
    // Element count fits, byte size does not: 2^62 F32 = 2^64 bytes.
    let json = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,4]}}}}"#,
        1u64 << 62
    );
    assert!(matches!(
        err(&file(&json, 4)),
        Error::TensorSizeOverflow { tensor, what: "byte size" } if tensor == "w"
    ));
}

#[test]
fn duplicate_tensor_names() {
    let t = r#"{"dtype":"U8","shape":[2],"data_offsets":[0,2]}"#;
    let json = format!(r#"{{"a":{t},"a":{t}}}"#);
    assert!(matches!(err(&file(&json, 2)), Error::DuplicateTensor { name } if name == "a"));
    // Escapes decode to the same name.
    let json = format!(r#"{{"w\u0031":{t},"w1":{t}}}"#);
    assert!(matches!(err(&file(&json, 2)), Error::DuplicateTensor { name } if name == "w1"));
    // The first copy differing (and invalid) does not hide the repeat.
    let json = format!(r#"{{"a":{{"dtype":"XX"}},"b":{t},"a":{t}}}"#);
    assert!(matches!(err(&file(&json, 2)), Error::DuplicateTensor { name } if name == "a"));
    // Repeats elsewhere: __metadata__ itself, a key in it, a field of a tensor.
    for (json, needle) in [
        (
            format!(r#"{{"__metadata__":{{}},"a":{t},"__metadata__":{{}}}}"#),
            "'__metadata__'",
        ),
        (
            format!(r#"{{"__metadata__":{{"k":"1","k":"2"}},"a":{t}}}"#),
            "'k'",
        ),
        (
            r#"{"a":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#.to_string(),
            "tensor 'a': duplicate key 'dtype'",
        ),
    ] {
        let d = header_detail(&file(&json, 2));
        assert!(d.contains(needle), "{json}: {d}");
    }
    // Not duplicates: the same key in different objects, repeated text inside strings.
    let json =
        format!(r#"{{"__metadata__":{{"a":"{{\"x\":1,\"x\":2}}","dtype":"a,\"a\":"}},"a":{t}}}"#);
    let h = SafetensorsHeader::parse(&file(&json, 2)).unwrap();
    assert_eq!(h.metadata()["a"], r#"{"x":1,"x":2}"#);
    assert_eq!(h.metadata()["dtype"], r#"a,"a":"#);
}

#[test]
fn unknown_dtype_string() {
    for dtype in ["Q4_0", "f32", "", "F128"] {
        let json = format!(r#"{{"w":{{"dtype":"{dtype}","shape":[1],"data_offsets":[0,1]}}}}"#);
        let d = header_detail(&file(&json, 1));
        assert!(
            d.contains("tensor 'w'") && d.contains("unknown variant"),
            "{dtype}: {d}"
        );
    }
}

#[test]
fn sub_byte_dtypes_map_to_whole_byte_blocks() {
    for (dtype, ty, shape, len) in [
        ("F4", TensorType::F4, 2, 1),
        ("F6_E2M3", TensorType::F6_E2M3, 4, 3),
        ("F6_E3M2", TensorType::F6_E3M2, 4, 3),
    ] {
        let json = format!(
            r#"{{"w":{{"dtype":"{dtype}","shape":[3,{shape}],"data_offsets":[0,{}]}}}}"#,
            3 * len
        );
        let h = SafetensorsHeader::parse(&file(&json, 3 * len))
            .unwrap_or_else(|e| panic!("{dtype}: {e}"));
        let t = &h.tensors().get(0).unwrap();
        assert_eq!(
            (t.ty, t.nbytes, t.ne()),
            (ty, 3 * len as u64, vec![shape as u64, 3]),
            "{dtype}"
        );
        // Elements that do not fill whole bytes are refused, saying so.
        let json = format!(
            r#"{{"w":{{"dtype":"{dtype}","shape":[{}],"data_offsets":[0,{len}]}}}}"#,
            shape + 1
        );
        let d = header_detail(&file(&json, len + 1));
        assert!(
            d.contains("tensor 'w'") && d.contains(dtype) && d.contains("whole number of bytes"),
            "{d}"
        );
    }
}

#[test]
fn every_supported_dtype_maps() {
    for (dtype, ty, size) in [
        ("F64", TensorType::F64, 8),
        ("F32", TensorType::F32, 4),
        ("F16", TensorType::F16, 2),
        ("BF16", TensorType::BF16, 2),
        ("I8", TensorType::I8, 1),
        ("I16", TensorType::I16, 2),
        ("I32", TensorType::I32, 4),
        ("I64", TensorType::I64, 8),
        ("U8", TensorType::U8, 1),
        ("U16", TensorType::U16, 2),
        ("U32", TensorType::U32, 4),
        ("U64", TensorType::U64, 8),
        ("BOOL", TensorType::Bool, 1),
        ("F8_E4M3", TensorType::F8_E4M3, 1),
        ("F8_E5M2", TensorType::F8_E5M2, 1),
        ("F8_E4M3FNUZ", TensorType::F8_E4M3FNUZ, 1),
        ("F8_E5M2FNUZ", TensorType::F8_E5M2FNUZ, 1),
        ("F8_E8M0", TensorType::F8_E8M0, 1),
        ("C64", TensorType::C64, 8),
    ] {
        let n = 3 * size;
        let json = format!(r#"{{"w":{{"dtype":"{dtype}","shape":[1,3],"data_offsets":[0,{n}]}}}}"#);
        let h =
            SafetensorsHeader::parse(&file(&json, n)).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        let t = &h.tensors().get(0).unwrap();
        assert_eq!(
            (t.ty, t.nbytes, t.ne()),
            (ty, n as u64, vec![3, 1]),
            "{dtype}"
        );
    }
}

#[test]
fn one_pass_keeps_the_precedence_of_errors() {
    let t = r#"{"dtype":"U8","shape":[2],"data_offsets":[0,2]}"#;
    // Invalid JSON anywhere beats a repeated name before it.
    let d = header_detail(&file(&format!(r#"{{"a":{t},"a":{t},}}"#), 2));
    assert!(d.starts_with("invalid JSON"), "{d}");
    // A repeat beats any other problem, wherever the problem is.
    for json in [
        format!(r#"{{"a":{{"dtype":"U8","shape":[-1],"data_offsets":[0,2]}},"a":{t}}}"#),
        format!(r#"{{"x":[1],"a":{t},"a":{t}}}"#),
        format!(r#"{{"__metadata__":{{"k":1}},"a":{t},"a":{t}}}"#),
        format!(r#"{{"b":{{"dtype":"U8","shape":[9],"data_offsets":[0,9]}},"a":{t},"a":{t}}}"#),
    ] {
        assert!(
            matches!(err(&file(&json, 2)), Error::DuplicateTensor { ref name } if name == "a"),
            "{json}"
        );
    }
    // The first repeat in text order, at any depth.
    let json = format!(
        r#"{{"a":{{"dtype":"U8","x":{{"k":1,"k":2}},"shape":[2],"data_offsets":[0,2]}},"a":{t}}}"#
    );
    let d = header_detail(&file(&json, 2));
    assert!(d.contains("tensor 'a': duplicate key 'k'"), "{d}");
    // A repeated field whose first value was bad is still a repeat.
    let json = r#"{"a":{"dtype":7,"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
    let d = header_detail(&file(json, 2));
    assert!(d.contains("tensor 'a': duplicate key 'dtype'"), "{d}");
    let json = format!(r#"{{"__metadata__":{{"k":1,"k":"2"}},"a":{t}}}"#);
    let d = header_detail(&file(&json, 2));
    assert!(d.contains("duplicate __metadata__ key 'k'"), "{d}");
    // Otherwise the first problem in text order, named.
    let json = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0]},"b":{"dtype":"XX","shape":[2],"data_offsets":[2,4]}}"#;
    let d = header_detail(&file(json, 4));
    assert!(
        d.contains("tensor 'a'") && d.contains("data_offsets"),
        "{d}"
    );
    // Unknown fields are ignored, as the safetensors crate does.
    let json =
        r#"{"a":{"dtype":"U8","shape":[2],"extra":{"x":[1,{"y":null}]},"data_offsets":[0,2]}}"#;
    let h = SafetensorsHeader::parse(&file(json, 2)).unwrap();
    assert_eq!(h.tensors().get(0).unwrap().nbytes, 2);
}

#[test]
fn a_repeat_is_found_among_thousands_of_names() {
    // Past several growths of the name set: the repeat of an early name.
    let mut entries: Vec<String> = (0..5000)
        .map(|i| {
            format!(
                r#""t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}}"#,
                i + 1
            )
        })
        .collect();
    let ok = format!("{{{}}}", entries.join(","));
    let h = SafetensorsHeader::parse(&file(&ok, 5000)).unwrap();
    assert_eq!(h.tensors().len(), 5000);
    assert_eq!(h.tensor_index("t4999"), Some(4999));
    entries.push(r#""t17":{"dtype":"U8","shape":[0],"data_offsets":[5000,5000]}"#.into());
    let json = format!("{{{}}}", entries.join(","));
    assert!(matches!(err(&file(&json, 5000)), Error::DuplicateTensor { name } if name == "t17"));
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    // Inside an unknown field, in __metadata__, and as a tensor entry.
    for (head, tail) in [
        (
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":"#,
            "}}",
        ),
        (r#"{"__metadata__":{"k":"#, "}}"),
        (r#"{"a":"#, "}"),
    ] {
        let json = format!("{head}{}{}{tail}", "[".repeat(100_000), "]".repeat(100_000));
        let d = header_detail(&file(&json, 1));
        assert!(
            d.starts_with("invalid JSON") && d.contains("recursion"),
            "{d}"
        );
    }
}

// ---- against the safetensors crate ------------------------------------------------

mod differential {
    use super::*;
    use proptest::prelude::*;

    const DTYPES: [(&str, u64); 6] = [
        ("F32", 4),
        ("F16", 2),
        ("U8", 1),
        ("I64", 8),
        ("BOOL", 1),
        ("F8_E4M3", 1),
    ];

    /// A header of up to 12 tensors with unique names, laid out in a random
    /// order, with one offset optionally nudged and the data optionally one
    /// byte too long or short.
    fn header() -> impl Strategy<Value = Vec<u8>> {
        let tensor = (0..DTYPES.len(), prop::collection::vec(0u64..4, 0..3));
        (
            prop::collection::vec(tensor, 0..12),
            any::<u64>(),
            prop::option::of((any::<prop::sample::Index>(), -3i64..4)),
            -1i64..2,
        )
            .prop_map(|(ts, order, nudge, extra)| {
                let mut idx: Vec<usize> = (0..ts.len()).collect();
                // A deterministic shuffle from `order`.
                for i in (1..idx.len()).rev() {
                    idx.swap(i, (order.rotate_left(i as u32) % (i as u64 + 1)) as usize);
                }
                let mut off = 0u64;
                let mut entries = Vec::new();
                for (k, &i) in idx.iter().enumerate() {
                    let (d, shape) = &ts[i];
                    let (name, size) = DTYPES[*d];
                    let n = size * shape.iter().product::<u64>();
                    let mut begin = off;
                    if let Some((at, by)) = nudge {
                        if at.index(idx.len().max(1)) == k {
                            begin = begin.saturating_add_signed(by);
                        }
                    }
                    entries.push(format!(
                        r#""t{i}":{{"dtype":"{name}","shape":{shape:?},"data_offsets":[{begin},{}]}}"#,
                        begin + n
                    ));
                    off += n;
                }
                let data = off.saturating_add_signed(extra) as usize;
                file(&format!("{{{}}}", entries.join(",")), data)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// weightmap accepts exactly the headers the safetensors crate
        /// accepts (unique names, byte-sized dtypes), with the same tensors.
        #[test]
        fn accepts_what_the_crate_accepts(bytes in header()) {
            let ours = SafetensorsHeader::parse(&bytes);
            let theirs = safetensors::SafeTensors::deserialize(&bytes);
            prop_assert_eq!(ours.is_ok(), theirs.is_ok(), "{:?} vs {:?}", ours.as_ref().err(), theirs.as_ref().err());
            if let (Ok(h), Ok(st)) = (ours, theirs) {
                prop_assert_eq!(h.tensors().len(), st.len());
                for t in h.tensors() {
                    let v = st.tensor(t.name).unwrap();
                    let shape: Vec<u64> = v.shape().iter().map(|&d| d as u64).collect();
                    prop_assert_eq!(t.shape, &shape[..]);
                    let r = t.file_range();
                    prop_assert_eq!(&bytes[r.start as usize..r.end as usize], v.data());
                }
            }
        }

        /// Any byte of a header changed: an answer, never a panic.
        #[test]
        fn a_changed_byte_is_never_a_panic(bytes in header(), at in any::<prop::sample::Index>(), b in any::<u8>()) {
            let mut bytes = bytes;
            let i = 8 + at.index(bytes.len() - 8);
            bytes[i] = b;
            let _ = SafetensorsHeader::parse(&bytes);
        }
    }
}

#[test]
fn an_absent_metadata_key_is_told_from_an_empty_one() {
    // safetensors' `metadata()` is None for the first and {} for the second.
    for (json, present) in [
        ("{}", false),
        (r#"{"__metadata__":{}}"#, true),
        (r#"{"__metadata__":{"k":"v"}}"#, true),
    ] {
        let h = SafetensorsHeader::parse(&file(json, 0)).unwrap();
        assert_eq!(h.has_metadata(), present, "{json}");
        assert_eq!(
            h.metadata().is_empty(),
            json != r#"{"__metadata__":{"k":"v"}}"#
        );
    }
}
