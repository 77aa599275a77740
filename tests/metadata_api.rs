//! The metadata getters a runtime uses: optional keys, integers of any
//! width, architecture-prefixed keys, per-layer values, and arrays as slices.
//! Every file is built with `weightmap::gguf::Writer`.

use std::borrow::Cow;

use weightmap::gguf::{GgufHeader, OwnedValue, ValueType, Writer};
use weightmap::Error;

fn file(build: impl FnOnce(&mut Writer)) -> Vec<u8> {
    let mut w = Writer::new(32);
    build(&mut w);
    w.to_bytes()
}

fn array(elem: ValueType, items: Vec<OwnedValue>) -> OwnedValue {
    OwnedValue::Array(elem, items)
}

#[test]
fn optional_getters_return_none_for_missing_keys_and_errors_for_wrong_types() {
    let bytes = file(|w| {
        w.kv_u32("a.u32", 7);
        w.kv_str("a.str", "text");
        w.kv("a.f32", OwnedValue::F32(0.5));
        w.kv("a.bool", OwnedValue::Bool(true));
    });
    let g = GgufHeader::parse(&bytes).unwrap();
    let md = g.metadata_in(&bytes);

    assert_eq!(md.get_opt_u32("a.u32").unwrap(), Some(7));
    assert_eq!(md.get_opt_u32("missing").unwrap(), None);
    assert_eq!(md.get_opt_str("a.str").unwrap(), Some("text"));
    assert_eq!(md.get_opt_str("missing").unwrap(), None);
    assert_eq!(md.get_opt_f32("a.f32").unwrap(), Some(0.5));
    assert_eq!(md.get_opt_bool("a.bool").unwrap(), Some(true));
    assert!(md.get_opt_array("missing").unwrap().is_none());

    match md.get_opt_u64("a.u32").unwrap_err() {
        Error::WrongValueType {
            key,
            expected,
            found,
        } => assert_eq!((key.as_str(), expected, found), ("a.u32", "u64", "u32")),
        e => panic!("unexpected {e}"),
    }
    assert_eq!(
        md.get_opt_str("a.u32").unwrap_err().name(),
        "wrong_value_type"
    );
    // The strict form still says the key is missing.
    match md.get_u32("missing").unwrap_err() {
        Error::KeyNotFound { key } => assert_eq!(key, "missing"),
        e => panic!("unexpected {e}"),
    }
}

#[test]
fn get_int_accepts_every_integer_type() {
    let bytes = file(|w| {
        w.kv("u8", OwnedValue::U8(200));
        w.kv("i8", OwnedValue::I8(-100));
        w.kv("u16", OwnedValue::U16(60_000));
        w.kv("i16", OwnedValue::I16(-30_000));
        w.kv("u32", OwnedValue::U32(4_000_000_000));
        w.kv("i32", OwnedValue::I32(-2_000_000_000));
        w.kv("u64", OwnedValue::U64(u64::MAX));
        w.kv("i64", OwnedValue::I64(i64::MIN));
    });
    let g = GgufHeader::parse(&bytes).unwrap();
    let md = g.metadata_in(&bytes);
    assert_eq!(md.get_int::<u8>("u8").unwrap(), 200);
    assert_eq!(md.get_int::<i64>("u8").unwrap(), 200);
    assert_eq!(md.get_int::<i8>("i8").unwrap(), -100);
    assert_eq!(md.get_int::<u32>("u16").unwrap(), 60_000);
    assert_eq!(md.get_int::<i32>("i16").unwrap(), -30_000);
    assert_eq!(md.get_int::<u64>("u32").unwrap(), 4_000_000_000);
    assert_eq!(md.get_int::<usize>("u32").unwrap(), 4_000_000_000);
    assert_eq!(md.get_int::<i64>("i32").unwrap(), -2_000_000_000);
    assert_eq!(md.get_int::<u64>("u64").unwrap(), u64::MAX);
    assert_eq!(md.get_int::<i64>("i64").unwrap(), i64::MIN);
    assert_eq!(md.get_opt_int::<u32>("missing").unwrap(), None);
    assert_eq!(md.get_opt_int::<u32>("u16").unwrap(), Some(60_000));
}

#[test]
fn get_int_names_key_value_and_target_when_the_value_does_not_fit() {
    let bytes = file(|w| {
        w.kv("big", OwnedValue::U64(u64::MAX));
        w.kv("neg", OwnedValue::I8(-1));
        w.kv("u32", OwnedValue::U32(300));
    });
    let g = GgufHeader::parse(&bytes).unwrap();
    let md = g.metadata_in(&bytes);
    let cases: [(Error, &str, i128, &str); 4] = [
        (
            md.get_int::<i64>("big").unwrap_err(),
            "big",
            i128::from(u64::MAX),
            "i64",
        ),
        (md.get_int::<u64>("neg").unwrap_err(), "neg", -1, "u64"),
        (md.get_int::<u8>("u32").unwrap_err(), "u32", 300, "u8"),
        (md.get_opt_int::<i8>("u32").unwrap_err(), "u32", 300, "i8"),
    ];
    for (e, k, v, t) in cases {
        assert_eq!(e.name(), "int_out_of_range");
        let msg = e.to_string();
        match e {
            Error::IntOutOfRange { key, value, target } => {
                assert_eq!((key.as_str(), value, target), (k, v, t));
            }
            e => panic!("unexpected {e}"),
        }
        assert!(msg.contains(k) && msg.contains(&v.to_string()) && msg.contains(t));
    }
}

#[test]
fn get_int_rejects_values_that_are_not_integers() {
    let bytes = file(|w| {
        w.kv("bool", OwnedValue::Bool(true));
        w.kv("f32", OwnedValue::F32(1.0));
        w.kv("f64", OwnedValue::F64(1.0));
        w.kv_str("str", "1");
        w.kv_i32_array("arr", &[1]);
    });
    let g = GgufHeader::parse(&bytes).unwrap();
    let md = g.metadata_in(&bytes);
    for (key, found) in [
        ("bool", "bool"),
        ("f32", "f32"),
        ("f64", "f64"),
        ("str", "string"),
        ("arr", "array"),
    ] {
        match md.get_int::<u32>(key).unwrap_err() {
            Error::WrongValueType {
                key: k,
                expected,
                found: f,
            } => assert_eq!((k.as_str(), expected, f), (key, "integer", found)),
            e => panic!("unexpected {e}"),
        }
    }
    assert_eq!(
        md.get_int::<u32>("missing").unwrap_err().name(),
        "key_not_found"
    );
}

#[test]
fn architecture_prefixes_hyperparameter_keys() {
    let bytes = file(|w| {
        w.kv_str("general.architecture", "qwen2");
        w.kv("qwen2.context_length", OwnedValue::U64(32_768));
        w.kv_u32("qwen2.block_count", 24);
        w.kv("qwen2.embedding_length", OwnedValue::U32(896));
        w.kv("qwen2.rope.freq_base", OwnedValue::F32(1e6));
        w.kv(
            "qwen2.attention.layer_norm_rms_epsilon",
            OwnedValue::F32(1e-6),
        );
    });
    let g = GgufHeader::parse(&bytes).unwrap();
    let md = g.metadata_in(&bytes);
    assert_eq!(md.architecture().unwrap(), "qwen2");
    assert_eq!(
        md.arch_key("context_length").unwrap(),
        "qwen2.context_length"
    );
    assert_eq!(md.context_length().unwrap(), 32_768);
    assert_eq!(md.block_count().unwrap(), 24);
    assert_eq!(md.embedding_length().unwrap(), 896);
    assert_eq!(md.arch_int::<u32>("context_length").unwrap(), 32_768);
    assert_eq!(md.arch_opt_int::<u32>("expert_count").unwrap(), None);
    assert_eq!(md.arch_f32("rope.freq_base").unwrap(), 1e6);
    assert_eq!(
        md.arch_opt_f32("attention.layer_norm_rms_epsilon").unwrap(),
        Some(1e-6)
    );
    assert_eq!(md.arch_opt_f32("rope.scaling.factor").unwrap(), None);
    match md.arch_int::<i16>("context_length").unwrap_err() {
        Error::IntOutOfRange { key, value, target } => {
            assert_eq!(
                (key.as_str(), value, target),
                ("qwen2.context_length", 32_768, "i16")
            )
        }
        e => panic!("unexpected {e}"),
    }
    match md.arch_int::<u32>("feed_forward_length").unwrap_err() {
        Error::KeyNotFound { key } => assert_eq!(key, "qwen2.feed_forward_length"),
        e => panic!("unexpected {e}"),
    }
}

#[test]
fn a_missing_or_mistyped_architecture_is_an_error_even_for_optional_getters() {
    let none = file(|w| {
        w.kv_u32("llama.block_count", 2);
    });
    let g = GgufHeader::parse(&none).unwrap();
    let md = g.metadata_in(&none);
    for e in [
        md.architecture().unwrap_err(),
        md.arch_key("block_count").unwrap_err(),
        md.arch_opt_int::<u32>("block_count").unwrap_err(),
    ] {
        match e {
            Error::KeyNotFound { key } => assert_eq!(key, "general.architecture"),
            e => panic!("unexpected {e}"),
        }
    }

    let typed = file(|w| {
        w.kv_u32("general.architecture", 1);
    });
    let g = GgufHeader::parse(&typed).unwrap();
    assert_eq!(
        g.metadata_in(&typed).architecture().unwrap_err().name(),
        "wrong_value_type"
    );
}

#[test]
fn per_layer_reads_a_scalar_or_an_array_of_any_integer_type() {
    let bytes = file(|w| {
        w.kv_str("general.architecture", "llama");
        w.kv_u32("llama.block_count", 3);
        w.kv("llama.attention.head_count", OwnedValue::U16(8));
        w.kv_i32_array("llama.attention.head_count_kv", &[2, 0, 4]);
        w.kv(
            "llama.feed_forward_length",
            array(
                ValueType::U64,
                vec![
                    OwnedValue::U64(1024),
                    OwnedValue::U64(2048),
                    OwnedValue::U64(4096),
                ],
            ),
        );
    });
    let g = GgufHeader::parse(&bytes).unwrap();
    let md = g.metadata_in(&bytes);
    assert_eq!(
        md.per_layer::<u32>("llama.attention.head_count", 3)
            .unwrap(),
        [8, 8, 8]
    );
    assert_eq!(
        md.per_layer::<u32>("llama.attention.head_count_kv", 3)
            .unwrap(),
        [2, 0, 4]
    );
    assert_eq!(
        md.arch_per_layer::<u32>("attention.head_count_kv").unwrap(),
        [2, 0, 4]
    );
    assert_eq!(
        md.arch_per_layer::<u64>("feed_forward_length").unwrap(),
        [1024, 2048, 4096]
    );
    assert_eq!(
        md.arch_per_layer::<usize>("attention.head_count").unwrap(),
        [8, 8, 8]
    );
    assert!(md
        .per_layer::<u32>("llama.attention.head_count", 0)
        .unwrap()
        .is_empty());
}

#[test]
fn per_layer_errors_name_the_key() {
    let bytes = file(|w| {
        w.kv_str("general.architecture", "llama");
        w.kv_u32("llama.block_count", 4);
        w.kv_i32_array("llama.attention.head_count_kv", &[2, 2, 4]);
        w.kv_i32_array("llama.attention.sliding_window", &[1, -1, 1, 1]);
        w.kv_f32_array("llama.scores", &[1.0, 2.0, 3.0, 4.0]);
        w.kv("llama.attention.head_count", OwnedValue::F32(8.0));
        w.kv("llama.big", OwnedValue::I64(-5));
    });
    let g = GgufHeader::parse(&bytes).unwrap();
    let md = g.metadata_in(&bytes);

    match md
        .arch_per_layer::<u32>("attention.head_count_kv")
        .unwrap_err()
    {
        Error::PerLayerLength {
            key,
            expected,
            found,
        } => assert_eq!(
            (key.as_str(), expected, found),
            ("llama.attention.head_count_kv", 4, 3)
        ),
        e => panic!("unexpected {e}"),
    }
    match md
        .arch_per_layer::<u32>("attention.sliding_window")
        .unwrap_err()
    {
        Error::IntOutOfRange { key, value, target } => assert_eq!(
            (key.as_str(), value, target),
            ("llama.attention.sliding_window[1]", -1, "u32")
        ),
        e => panic!("unexpected {e}"),
    }
    assert_eq!(
        md.arch_per_layer::<i32>("attention.sliding_window")
            .unwrap(),
        [1, -1, 1, 1]
    );
    match md.arch_per_layer::<u32>("big").unwrap_err() {
        Error::IntOutOfRange { key, value, .. } => {
            assert_eq!((key.as_str(), value), ("llama.big", -5))
        }
        e => panic!("unexpected {e}"),
    }
    for (suffix, found) in [("scores", "array of f32"), ("attention.head_count", "f32")] {
        match md.arch_per_layer::<u32>(suffix).unwrap_err() {
            Error::WrongValueType { key, found: f, .. } => {
                assert_eq!((key, f), (format!("llama.{suffix}"), found))
            }
            e => panic!("unexpected {e}"),
        }
    }
    assert_eq!(
        md.arch_per_layer::<u32>("expert_count").unwrap_err().name(),
        "key_not_found"
    );
}

#[test]
fn per_layer_without_a_block_count_is_key_not_found() {
    let bytes = file(|w| {
        w.kv_str("general.architecture", "llama");
        w.kv_u32("llama.attention.head_count", 8);
    });
    let g = GgufHeader::parse(&bytes).unwrap();
    match g
        .metadata_in(&bytes)
        .arch_per_layer::<u32>("attention.head_count")
        .unwrap_err()
    {
        Error::KeyNotFound { key } => assert_eq!(key, "llama.block_count"),
        e => panic!("unexpected {e}"),
    }
}

/// A file whose only key is a u32 array, with a key of `key_len` bytes, so
/// that the array's bytes start at a different address for each length.
fn u32_array_file(key_len: usize, values: &[u32]) -> Vec<u8> {
    let key = "k".repeat(key_len);
    file(|w| {
        w.kv(
            &key,
            array(
                ValueType::U32,
                values.iter().map(|&v| OwnedValue::U32(v)).collect(),
            ),
        );
    })
}

#[test]
fn as_slice_borrows_aligned_arrays_and_copies_unaligned_ones() {
    let values = [1u32, 0xDEAD_BEEF, 3, u32::MAX];
    let (mut borrowed, mut owned) = (0, 0);
    for key_len in 1..=8 {
        let bytes = u32_array_file(key_len, &values);
        let g = GgufHeader::parse(&bytes).unwrap();
        let key = "k".repeat(key_len);
        let a = g.metadata_in(&bytes).get_array(&key).unwrap();
        let aligned = a.raw_bytes().as_ptr() as usize % std::mem::align_of::<u32>() == 0;
        let s = a.as_slice::<u32>().unwrap();
        assert_eq!(&s[..], values, "key length {key_len}");
        match s {
            Cow::Borrowed(b) => {
                assert!(aligned, "key length {key_len}: borrowed but unaligned");
                assert_eq!(b.as_ptr().cast::<u8>(), a.raw_bytes().as_ptr());
                borrowed += 1;
            }
            Cow::Owned(_) => {
                assert!(!aligned, "key length {key_len}: copied though aligned");
                owned += 1;
            }
        }
    }
    // Eight consecutive key lengths reach every offset modulo 4.
    assert!(
        borrowed > 0 && owned > 0,
        "{borrowed} borrowed, {owned} owned"
    );
}

#[test]
fn as_slice_reads_every_numeric_type_and_rejects_other_element_types() {
    let bytes = file(|w| {
        w.kv_f32_array("f32", &[1.5, -0.0, f32::INFINITY]);
        w.kv_i32_array("i32", &[-1, 2]);
        w.kv(
            "u8",
            array(ValueType::U8, vec![OwnedValue::U8(1), OwnedValue::U8(255)]),
        );
        w.kv(
            "i64",
            array(
                ValueType::I64,
                vec![OwnedValue::I64(i64::MIN), OwnedValue::I64(7)],
            ),
        );
        w.kv("f64", array(ValueType::F64, vec![OwnedValue::F64(0.25)]));
        w.kv("empty", array(ValueType::U16, vec![]));
        w.kv_str_array("str", &["a"]);
    });
    let g = GgufHeader::parse(&bytes).unwrap();
    let md = g.metadata_in(&bytes);
    let a = |k: &str| md.get_array(k).unwrap();
    assert_eq!(
        &a("f32").as_slice::<f32>().unwrap()[..],
        [1.5, -0.0, f32::INFINITY]
    );
    assert_eq!(&a("i32").as_slice::<i32>().unwrap()[..], [-1, 2]);
    assert_eq!(&a("u8").as_slice::<u8>().unwrap()[..], [1, 255]);
    assert_eq!(&a("i64").as_slice::<i64>().unwrap()[..], [i64::MIN, 7]);
    assert_eq!(&a("f64").as_slice::<f64>().unwrap()[..], [0.25]);
    assert!(a("empty").as_slice::<u16>().unwrap().is_empty());
    match a("i32").as_slice::<u32>().unwrap_err() {
        Error::WrongValueType {
            key,
            expected,
            found,
        } => assert_eq!(
            (key.as_str(), expected, found),
            ("i32", "array of u32", "array of i32")
        ),
        e => panic!("unexpected {e}"),
    }
    assert_eq!(
        a("str").as_slice::<u8>().unwrap_err().name(),
        "wrong_value_type"
    );
}
