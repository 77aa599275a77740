//! The reference fixtures (testdata/*.gguf, written by gguf-py's GGUFWriter)
//! parsed by weightmap and checked field by field against their manifests
//! (testdata/*.gguf.json; see testdata/README.md).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use weightmap::gguf::{GgufHeader, Value, ValueType};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

/// The GGUF value type for a manifest type name (gguf-py's GGUFValueType names).
fn value_type(name: &str) -> ValueType {
    match name {
        "UINT8" => ValueType::U8,
        "INT8" => ValueType::I8,
        "UINT16" => ValueType::U16,
        "INT16" => ValueType::I16,
        "UINT32" => ValueType::U32,
        "INT32" => ValueType::I32,
        "FLOAT32" => ValueType::F32,
        "BOOL" => ValueType::Bool,
        "STRING" => ValueType::String,
        "ARRAY" => ValueType::Array,
        "UINT64" => ValueType::U64,
        "INT64" => ValueType::I64,
        "FLOAT64" => ValueType::F64,
        other => panic!("unknown manifest type {other}"),
    }
}

/// Compare one scalar (or string) value with its manifest JSON.
fn check_scalar(what: &str, v: &Value<'_>, want: &Json) {
    let ok = match *v {
        Value::U8(x) => want.as_u64() == Some(u64::from(x)),
        Value::U16(x) => want.as_u64() == Some(u64::from(x)),
        Value::U32(x) => want.as_u64() == Some(u64::from(x)),
        Value::U64(x) => want.as_u64() == Some(x),
        Value::I8(x) => want.as_i64() == Some(i64::from(x)),
        Value::I16(x) => want.as_i64() == Some(i64::from(x)),
        Value::I32(x) => want.as_i64() == Some(i64::from(x)),
        Value::I64(x) => want.as_i64() == Some(x),
        // The manifest holds the f32-rounded value, so the widening is exact.
        Value::F32(x) => want.as_f64() == Some(f64::from(x)),
        Value::F64(x) => want.as_f64() == Some(x),
        Value::Bool(x) => want.as_bool() == Some(x),
        Value::String(s) => want.as_str().map(str::as_bytes) == Some(s.as_bytes()),
        Value::Array(_) => false,
    };
    assert!(ok, "{what}: read {v:?}, manifest says {want}");
}

fn check_file(name: &str) -> usize {
    let bytes = std::fs::read(testdata().join(name)).unwrap();
    let manifest: Json =
        serde_json::from_slice(&std::fs::read(testdata().join(format!("{name}.json"))).unwrap())
            .unwrap();
    let file = GgufHeader::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    let h = &file;

    assert_eq!(manifest["file"], name);
    assert_eq!(
        Some(u64::from(h.version())),
        manifest["version"].as_u64(),
        "{name}: version"
    );
    assert_eq!(
        Some(h.alignment()),
        manifest["alignment"].as_u64(),
        "{name}: alignment"
    );
    assert_eq!(
        Some(h.kv_count() as u64),
        manifest["kv_count"].as_u64(),
        "{name}: kv_count"
    );
    assert_eq!(
        Some(h.data_offset()),
        manifest["data_start"].as_u64(),
        "{name}: data_start"
    );
    assert_eq!(
        Some(bytes.len() as u64),
        manifest["file_size"].as_u64(),
        "{name}: file_size"
    );

    // ---- metadata, in file order ----
    let md = file.metadata_in(&bytes);
    let keys: Vec<&str> = md.iter().map(|(k, _)| k).collect();
    let want_keys: Vec<&str> = manifest["metadata_keys_in_order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(keys, want_keys, "{name}: keys in order");
    let mut checked = 0;
    for (key, want) in manifest["metadata"].as_object().unwrap() {
        let what = format!("{name}: {key}");
        let v = md.get(key).unwrap_or_else(|| panic!("{what}: missing"));
        assert_eq!(
            v.value_type(),
            value_type(want["type"].as_str().unwrap()),
            "{what}: type"
        );
        if let Value::Array(arr) = v {
            let elem = value_type(want["elem_type"].as_str().unwrap());
            let items = want["value"].as_array().unwrap();
            assert_eq!(arr.elem_type(), elem, "{what}: element type");
            assert_eq!(Some(arr.len()), want["len"].as_u64(), "{what}: len");
            assert_eq!(arr.len(), items.len() as u64, "{what}: manifest len");
            if elem == ValueType::String {
                let strs: Vec<&[u8]> = arr.strings().unwrap().map(|s| s.as_bytes()).collect();
                let want_strs: Vec<&[u8]> = items
                    .iter()
                    .map(|s| s.as_str().unwrap().as_bytes())
                    .collect();
                assert_eq!(strs, want_strs, "{what}: strings");
            }
            let read: Vec<Value<'_>> = arr.iter().collect();
            assert_eq!(read.len(), items.len(), "{what}: iter length");
            for (i, (v, w)) in read.iter().zip(items).enumerate() {
                check_scalar(&format!("{what}[{i}]"), v, w);
            }
        } else {
            check_scalar(&what, &v, &want["value"]);
        }
        checked += 1;
    }
    assert_eq!(checked, h.kv_count(), "{name}: every key checked");

    // ---- tensors, in file order ----
    let tensors = manifest["tensors"].as_array().unwrap();
    assert_eq!(
        Some(file.tensors().len() as u64),
        manifest["tensor_count"].as_u64()
    );
    assert_eq!(file.tensors().len(), tensors.len(), "{name}: tensor count");
    for (t, want) in file.tensors().iter().zip(tensors) {
        let what = format!("{name}: tensor {}", t.name);
        assert_eq!(
            t.name,
            want["name"].as_str().unwrap(),
            "{name}: tensor order"
        );
        assert_eq!(
            t.ty.ggml_id().map(u64::from),
            want["ggml_type_id"].as_u64(),
            "{what}: type"
        );
        assert!(
            t.ty.name()
                .eq_ignore_ascii_case(want["ggml_type"].as_str().unwrap()),
            "{what}: type name"
        );
        let shape: Vec<u64> = want["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.shape, &shape[..], "{what}: shape");
        assert_eq!(
            Some(t.offset),
            want["relative_offset"].as_u64(),
            "{what}: relative offset"
        );
        assert_eq!(
            Some(t.file_offset),
            want["offset"].as_u64(),
            "{what}: offset"
        );
        assert_eq!(Some(t.nbytes), want["nbytes"].as_u64(), "{what}: nbytes");
        let digest = Sha256::digest(&bytes[t.file_offset as usize..][..t.nbytes as usize]);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, want["sha256"].as_str().unwrap(), "{what}: sha256");
        assert_eq!(
            file.tensor_index(t.name)
                .map(|i| file.tensors().get(i).unwrap()),
            Some(t)
        );
    }
    tensors.len()
}

#[test]
fn tiny_llama() {
    assert_eq!(check_file("tiny-llama.gguf"), 12);
    // Spot checks that do not depend on the manifest being right.
    let bytes = std::fs::read(testdata().join("tiny-llama.gguf")).unwrap();
    let file = GgufHeader::parse(&bytes).unwrap();
    let md = file.metadata_in(&bytes);
    assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(
        md.get_u64("weightmap.test.u64").unwrap(),
        9223372036854788153
    );
    assert_eq!(md.get_array("tokenizer.ggml.tokens").unwrap().len(), 300);
    let empty = file
        .tensors()
        .iter()
        .find(|t| t.name == "test.empty")
        .unwrap();
    assert_eq!(empty.nbytes, 0);
}

#[test]
fn quant_types() {
    // 25 block-quantized types; Q8_1 is skipped by the generator (gguf-py's
    // 40-byte block disagrees with ggml's 36).
    assert_eq!(check_file("quant-types.gguf"), 25);
}

#[test]
fn align8() {
    assert_eq!(check_file("align8.gguf"), 7);
    let bytes = std::fs::read(testdata().join("align8.gguf")).unwrap();
    let file = GgufHeader::parse(&bytes).unwrap();
    assert_eq!(file.alignment(), 8);
    assert_eq!(file.tensors().get(1).unwrap().file_offset, 496);
}

#[test]
fn empty() {
    assert_eq!(check_file("empty.gguf"), 0);
}

#[test]
fn every_gguf_fixture_has_a_manifest_and_is_checked() {
    let names: Vec<String> = std::fs::read_dir(testdata())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    for known in [
        "align8.gguf",
        "empty.gguf",
        "quant-types.gguf",
        "tiny-llama.gguf",
    ] {
        assert!(names.iter().any(|n| n == known), "{known} missing");
    }
    // Any fixture added later is checked against its manifest too.
    for n in &names {
        check_file(n);
    }
}
