//! Differential tests against gguf-rs-lib 0.3: random files written by one
//! implementation are read by the other, and every key, value, tensor
//! descriptor and tensor byte must match what was written.
//!
//! gguf-rs-lib's constraints shape the generators: keys must be dot-separated
//! lower_snake_case ASCII, the alignment a multiple of 8, tensors need at
//! least one dimension, and its reader rejects bools other than 0/1. Nested
//! arrays are excluded from the random files (gguf-rs-lib writes them, ggml and
//! weightmap reject them: see `nested_array_written_by_gguf_rs_lib_is_rejected`).
//! gguf-rs-lib's type table agrees with ggml's (Q8_1 = 36 bytes, Q2_0 present;
//! checked by `type_tables_agree`), so every type it can write is used.

use std::io::Cursor;

use gguf_rs_lib::builder::GGUFBuilder;
use gguf_rs_lib::format::metadata::{MetadataArray, MetadataValue};
use gguf_rs_lib::format::types::{GGUFTensorType, GGUFValueType};
use gguf_rs_lib::reader::GGUFFileReader;
use gguf_rs_lib::tensor::TensorTypeUtils;
use proptest::prelude::*;
use weightmap::gguf::{GgufHeader, OwnedValue, Value, ValueType, Writer};
use weightmap::{Error, TensorType};

// ---- the model: what a test writes -------------------------------------------

#[derive(Clone, Debug)]
enum Scalar {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(u32), // bits, so NaN payloads compare exactly
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(u64), // bits
}

#[derive(Clone, Debug)]
enum Val {
    One(Scalar),
    /// Element type id (never 9) and elements.
    Arr(u32, Vec<Scalar>),
}

#[derive(Clone, Debug)]
struct TensorSpec {
    name: String,
    ty: TensorType,
    dims: Vec<u64>,
    data: Vec<u8>,
}

/// Scalar value type ids (everything but array).
const SCALAR_TYPES: [u32; 12] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12];

fn scalar(type_id: u32) -> BoxedStrategy<Scalar> {
    match type_id {
        0 => any::<u8>().prop_map(Scalar::U8).boxed(),
        1 => any::<i8>().prop_map(Scalar::I8).boxed(),
        2 => any::<u16>().prop_map(Scalar::U16).boxed(),
        3 => any::<i16>().prop_map(Scalar::I16).boxed(),
        4 => any::<u32>().prop_map(Scalar::U32).boxed(),
        5 => any::<i32>().prop_map(Scalar::I32).boxed(),
        6 => any::<u32>().prop_map(Scalar::F32).boxed(),
        7 => any::<bool>().prop_map(Scalar::Bool).boxed(),
        8 => "\\PC{0,12}".prop_map(Scalar::Str).boxed(),
        10 => any::<u64>().prop_map(Scalar::U64).boxed(),
        11 => any::<i64>().prop_map(Scalar::I64).boxed(),
        12 => any::<u64>().prop_map(Scalar::F64).boxed(),
        _ => unreachable!(),
    }
}

fn value() -> impl Strategy<Value = Val> {
    let ty = proptest::sample::select(&SCALAR_TYPES[..]);
    prop_oneof![
        ty.clone().prop_flat_map(|t| scalar(t).prop_map(Val::One)),
        ty.prop_flat_map(
            |t| proptest::collection::vec(scalar(t), 0..12).prop_map(move |v| Val::Arr(t, v))
        ),
    ]
}

/// A lower_snake_case dotted key suffix.
fn key_suffix() -> impl Strategy<Value = String> {
    let word = "[a-z0-9]{1,5}";
    let component = proptest::collection::vec(word, 1..3).prop_map(|w| w.join("_"));
    proptest::collection::vec(component, 1..3).prop_map(|c| c.join("."))
}

fn kvs() -> impl Strategy<Value = Vec<(String, Val)>> {
    proptest::collection::vec((key_suffix(), value()), 0..14).prop_map(|v| {
        v.into_iter()
            .enumerate()
            // The index keeps keys unique and away from general.*.
            .map(|(i, (k, val))| (format!("k{i}.{k}"), val))
            .collect()
    })
}

/// Every ggml type gguf-rs-lib can write, as weightmap types.
fn writable_types() -> Vec<TensorType> {
    TensorTypeUtils::all_types()
        .into_iter()
        .filter(|t| t.block_size_bytes().is_some())
        .map(|t| TensorType::from_ggml_id(t as u32).expect("a ggml type"))
        .collect()
}

fn bytes_from_seed(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn tensor(i: usize) -> impl Strategy<Value = TensorSpec> {
    let ty = proptest::sample::select(writable_types());
    (
        ty,
        0u64..4,
        proptest::collection::vec(0u64..4, 0..4),
        "[a-z_.]{1,20}",
        any::<u64>(),
    )
        .prop_map(move |(ty, blocks, rest, name, seed)| {
            let mut dims = vec![blocks * ty.block_size()];
            dims.extend(rest);
            let n: u64 = dims.iter().product();
            let nbytes = ty.bytes_for(n).unwrap() as usize;
            TensorSpec {
                name: format!("t{i}.{name}"),
                ty,
                dims,
                data: bytes_from_seed(seed, nbytes),
            }
        })
}

fn tensors() -> impl Strategy<Value = Vec<TensorSpec>> {
    (0usize..8).prop_flat_map(|n| (0..n).map(tensor).collect::<Vec<_>>())
}

fn alignment() -> impl Strategy<Value = u64> {
    proptest::sample::select(vec![8u64, 16, 32, 64])
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Data-section offsets of `ts` packed in order, each aligned to `a`.
fn expected_offsets(ts: &[TensorSpec], a: u64) -> Vec<u64> {
    let mut off = 0;
    ts.iter()
        .map(|t| {
            let o = align_up(off, a);
            off = o + t.data.len() as u64;
            o
        })
        .collect()
}

// ---- conversions ---------------------------------------------------------------

fn grl_type_of(t: u32) -> GGUFValueType {
    GGUFValueType::from_u32(t).unwrap()
}

fn scalar_to_grl(s: &Scalar) -> MetadataValue {
    match s {
        Scalar::U8(v) => MetadataValue::U8(*v),
        Scalar::I8(v) => MetadataValue::I8(*v),
        Scalar::U16(v) => MetadataValue::U16(*v),
        Scalar::I16(v) => MetadataValue::I16(*v),
        Scalar::U32(v) => MetadataValue::U32(*v),
        Scalar::I32(v) => MetadataValue::I32(*v),
        Scalar::F32(b) => MetadataValue::F32(f32::from_bits(*b)),
        Scalar::Bool(v) => MetadataValue::Bool(*v),
        Scalar::Str(v) => MetadataValue::String(v.clone()),
        Scalar::U64(v) => MetadataValue::U64(*v),
        Scalar::I64(v) => MetadataValue::I64(*v),
        Scalar::F64(b) => MetadataValue::F64(f64::from_bits(*b)),
    }
}

fn to_grl(v: &Val) -> MetadataValue {
    match v {
        Val::One(s) => scalar_to_grl(s),
        Val::Arr(t, items) => MetadataValue::Array(Box::new(
            MetadataArray::new(grl_type_of(*t), items.iter().map(scalar_to_grl).collect()).unwrap(),
        )),
    }
}

fn scalar_to_owned(s: &Scalar) -> OwnedValue {
    match s {
        Scalar::U8(v) => OwnedValue::U8(*v),
        Scalar::I8(v) => OwnedValue::I8(*v),
        Scalar::U16(v) => OwnedValue::U16(*v),
        Scalar::I16(v) => OwnedValue::I16(*v),
        Scalar::U32(v) => OwnedValue::U32(*v),
        Scalar::I32(v) => OwnedValue::I32(*v),
        Scalar::F32(b) => OwnedValue::F32(f32::from_bits(*b)),
        Scalar::Bool(v) => OwnedValue::Bool(*v),
        Scalar::Str(v) => OwnedValue::String(v.clone()),
        Scalar::U64(v) => OwnedValue::U64(*v),
        Scalar::I64(v) => OwnedValue::I64(*v),
        Scalar::F64(b) => OwnedValue::F64(f64::from_bits(*b)),
    }
}

fn to_owned_value(v: &Val) -> OwnedValue {
    match v {
        Val::One(s) => scalar_to_owned(s),
        Val::Arr(t, items) => OwnedValue::Array(
            ValueType::from_id(*t).unwrap(),
            items.iter().map(scalar_to_owned).collect(),
        ),
    }
}

fn grl_tensor_type(t: TensorType) -> GGUFTensorType {
    GGUFTensorType::from_u32(t.ggml_id().unwrap()).unwrap()
}

// ---- comparisons -----------------------------------------------------------------

/// Does weightmap's value equal the written scalar (floats by bits)?
fn scalar_eq_wm(s: &Scalar, v: &Value<'_>) -> bool {
    match (s, v) {
        (Scalar::U8(a), Value::U8(b)) => a == b,
        (Scalar::I8(a), Value::I8(b)) => a == b,
        (Scalar::U16(a), Value::U16(b)) => a == b,
        (Scalar::I16(a), Value::I16(b)) => a == b,
        (Scalar::U32(a), Value::U32(b)) => a == b,
        (Scalar::I32(a), Value::I32(b)) => a == b,
        (Scalar::F32(a), Value::F32(b)) => *a == b.to_bits(),
        (Scalar::Bool(a), Value::Bool(b)) => a == b,
        (Scalar::Str(a), Value::String(b)) => a.as_bytes() == b.as_bytes(),
        (Scalar::U64(a), Value::U64(b)) => a == b,
        (Scalar::I64(a), Value::I64(b)) => a == b,
        (Scalar::F64(a), Value::F64(b)) => *a == b.to_bits(),
        _ => false,
    }
}

fn check_wm_value(key: &str, want: &Val, got: Value<'_>) -> Result<(), TestCaseError> {
    match want {
        Val::One(s) => prop_assert!(scalar_eq_wm(s, &got), "{key}: wrote {s:?}, read {got:?}"),
        Val::Arr(t, items) => {
            let Value::Array(arr) = got else {
                return Err(TestCaseError::fail(format!("{key}: not an array: {got:?}")));
            };
            prop_assert_eq!(arr.elem_type().id(), *t, "{}", key);
            prop_assert_eq!(arr.len(), items.len() as u64, "{}", key);
            let read: Vec<Value<'_>> = arr.iter().collect();
            prop_assert_eq!(read.len(), items.len(), "{}: iter length", key);
            for (i, (s, v)) in items.iter().zip(&read).enumerate() {
                prop_assert!(scalar_eq_wm(s, v), "{key}[{i}]: wrote {s:?}, read {v:?}");
                let by_index = arr.get(i as u64);
                prop_assert!(
                    by_index.is_some_and(|g| scalar_eq_wm(s, &g)),
                    "{key}.get({i})"
                );
            }
            if *t == 8 {
                let strs: Vec<&[u8]> = arr.strings().unwrap().map(|s| s.as_bytes()).collect();
                let want: Vec<&[u8]> = items
                    .iter()
                    .map(|s| match s {
                        Scalar::Str(s) => s.as_bytes(),
                        _ => unreachable!(),
                    })
                    .collect();
                prop_assert_eq!(strs, want, "{}: strings()", key);
            }
        }
    }
    Ok(())
}

fn scalar_eq_grl(s: &Scalar, v: &MetadataValue) -> bool {
    match (s, v) {
        (Scalar::F32(a), MetadataValue::F32(b)) => *a == b.to_bits(),
        (Scalar::F64(a), MetadataValue::F64(b)) => *a == b.to_bits(),
        _ => scalar_to_grl(s) == *v,
    }
}

fn check_grl_value(key: &str, want: &Val, got: &MetadataValue) -> Result<(), TestCaseError> {
    match (want, got) {
        (Val::One(s), v) => prop_assert!(
            scalar_eq_grl(s, v),
            "{key}: wrote {s:?}, gguf-rs-lib read {v:?}"
        ),
        (Val::Arr(t, items), MetadataValue::Array(arr)) => {
            prop_assert_eq!(arr.element_type as u32, *t, "{}", key);
            prop_assert_eq!(arr.values.len(), items.len(), "{}", key);
            for (i, (s, v)) in items.iter().zip(&arr.values).enumerate() {
                prop_assert!(
                    scalar_eq_grl(s, v),
                    "{key}[{i}]: wrote {s:?}, gguf-rs-lib read {v:?}"
                );
            }
        }
        (w, g) => {
            return Err(TestCaseError::fail(format!(
                "{key}: wrote {w:?}, gguf-rs-lib read {g:?}"
            )))
        }
    }
    Ok(())
}

// ---- the properties ---------------------------------------------------------------

/// Written by gguf-rs-lib, read by weightmap.
fn grl_to_weightmap(
    kvs: &[(String, Val)],
    ts: &[TensorSpec],
    align: u64,
) -> Result<(), TestCaseError> {
    let mut b = GGUFBuilder::new().with_tensor_alignment(align as usize);
    for (k, v) in kvs {
        b = b.add_metadata(k.clone(), to_grl(v));
    }
    for t in ts {
        b = b
            .add_tensor(
                t.name.to_owned(),
                t.dims.clone(),
                grl_tensor_type(t.ty),
                t.data.clone(),
            )
            .unwrap();
    }
    let (bytes, _) = b.build_to_bytes().unwrap();

    let file = GgufHeader::parse(&bytes)
        .map_err(|e| TestCaseError::fail(format!("weightmap rejected: {e}")))?;
    let md = file.metadata_in(&bytes);

    // gguf-rs-lib adds general.alignment when it is not 32, and
    // general.quantization_version when a tensor is quantized (by its own definition).
    let quantized = ts.iter().any(|t| grl_tensor_type(t.ty).is_quantized());
    let extra = usize::from(align != 32) + usize::from(quantized);
    prop_assert_eq!(md.len(), kvs.len() + extra);
    prop_assert_eq!(file.alignment(), align);
    if align != 32 {
        prop_assert_eq!(md.get_u32("general.alignment").unwrap() as u64, align);
    }
    if quantized {
        prop_assert_eq!(md.get_u32("general.quantization_version").unwrap(), 2);
    }
    for (k, v) in kvs {
        let got = md
            .get(k)
            .ok_or_else(|| TestCaseError::fail(format!("{k} missing")))?;
        check_wm_value(k, v, got)?;
    }
    // Every key iterated is one that was written (or one of the extras).
    for (k, _) in md.iter() {
        prop_assert!(
            kvs.iter().any(|(w, _)| w == k)
                || k == "general.alignment"
                || k == "general.quantization_version",
            "unexpected key {}",
            k
        );
    }

    prop_assert_eq!(file.tensors().len(), ts.len());
    let offsets = expected_offsets(ts, align);
    for ((t, want), off) in file.tensors().iter().zip(ts).zip(offsets) {
        prop_assert_eq!(&t.name, &want.name);
        prop_assert_eq!(t.ty, want.ty);
        prop_assert_eq!(t.shape, &want.dims[..]);
        prop_assert_eq!(t.offset, off, "{}", t.name);
        prop_assert_eq!(t.file_offset, file.data_offset() + off);
        prop_assert_eq!(t.nbytes, want.data.len() as u64);
        prop_assert!(
            bytes[t.file_offset as usize..][..t.nbytes as usize] == want.data[..],
            "{}: bytes differ",
            t.name
        );
    }
    Ok(())
}

/// Written by weightmap, read by gguf-rs-lib.
fn weightmap_to_grl(
    kvs: &[(String, Val)],
    ts: &[TensorSpec],
    align: u64,
) -> Result<(), TestCaseError> {
    let mut w = Writer::new(align);
    for (k, v) in kvs {
        w.kv(k, to_owned_value(v));
    }
    for t in ts {
        w.tensor(&t.name, t.ty, &t.dims, t.data.clone());
    }
    let bytes = w.to_bytes();
    let own = GgufHeader::parse(&bytes)
        .map_err(|e| TestCaseError::fail(format!("weightmap rejected its own file: {e}")))?;

    let mut r = GGUFFileReader::new(Cursor::new(bytes.clone()))
        .map_err(|e| TestCaseError::fail(format!("gguf-rs-lib rejected: {e}")))?;
    let md = r.metadata();
    prop_assert_eq!(md.len(), kvs.len() + usize::from(align != 32));
    if align != 32 {
        prop_assert_eq!(
            md.get("general.alignment"),
            Some(&MetadataValue::U32(align as u32))
        );
    }
    for (k, v) in kvs {
        let got = md
            .get(k)
            .ok_or_else(|| TestCaseError::fail(format!("{k} missing")))?;
        check_grl_value(k, v, got)?;
    }
    prop_assert_eq!(r.tensor_data_offset(), own.data_offset());

    let infos: Vec<_> = r.tensor_infos().to_vec();
    prop_assert_eq!(infos.len(), ts.len());
    let offsets = expected_offsets(ts, align);
    for ((info, want), off) in infos.iter().zip(ts).zip(offsets) {
        prop_assert_eq!(info.name(), want.name.as_str());
        prop_assert_eq!(info.tensor_type() as u32, want.ty.ggml_id().unwrap());
        prop_assert_eq!(info.shape().dims(), &want.dims[..]);
        prop_assert_eq!(info.data_offset(), off);
        let data = r.load_tensor_data(&want.name).unwrap().unwrap();
        prop_assert!(
            data.as_slice() == &want.data[..],
            "{}: bytes differ",
            want.name
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn gguf_rs_lib_writes_weightmap_reads(kvs in kvs(), ts in tensors(), align in alignment()) {
        grl_to_weightmap(&kvs, &ts, align)?;
    }

    #[test]
    fn weightmap_writes_gguf_rs_lib_reads(kvs in kvs(), ts in tensors(), align in alignment()) {
        weightmap_to_grl(&kvs, &ts, align)?;
    }
}

// ---- fixed cases -------------------------------------------------------------------

#[test]
fn type_tables_agree() {
    let mut n = 0;
    for t in TensorTypeUtils::all_types() {
        let id = t as u32;
        match (t.block_size_bytes(), TensorType::from_ggml_id(id)) {
            (Some(bytes), Some(wm)) => {
                assert_eq!(t.block_size() as u64, wm.block_size(), "{t:?} block size");
                assert_eq!(bytes as u64, wm.type_size(), "{t:?} bytes per block");
                n += 1;
            }
            (None, None) => {}
            (a, b) => panic!("{t:?} (id {id}): gguf-rs-lib {a:?}, weightmap {b:?}"),
        }
    }
    // Every ggml type weightmap knows is one gguf-rs-lib can write.
    assert_eq!(
        n,
        TensorType::ALL
            .iter()
            .filter(|t| t.ggml_id().is_some())
            .count()
    );
    assert_eq!(writable_types().len(), n);
}

#[test]
fn every_type_round_trips_both_ways() {
    let ts: Vec<TensorSpec> = writable_types()
        .into_iter()
        .enumerate()
        .map(|(i, ty)| {
            let dims = vec![2 * ty.block_size(), 3];
            let n = ty.bytes_for(6 * ty.block_size()).unwrap() as usize;
            TensorSpec {
                name: format!("t.{}", ty.name()),
                ty,
                dims,
                data: bytes_from_seed(i as u64 + 7, n),
            }
        })
        .collect();
    let kvs = vec![
        (
            "a.str_array".to_string(),
            Val::Arr(8, vec![Scalar::Str("x".into()), Scalar::Str(String::new())]),
        ),
        (
            "a.f32_array".to_string(),
            Val::Arr(
                6,
                vec![Scalar::F32(0x7fc0_0001), Scalar::F32(1.5f32.to_bits())],
            ),
        ),
    ];
    grl_to_weightmap(&kvs, &ts, 32).unwrap();
    weightmap_to_grl(&kvs, &ts, 64).unwrap();
}

#[test]
fn nested_array_written_by_gguf_rs_lib_is_rejected() {
    let inner = MetadataValue::Array(Box::new(
        MetadataArray::new(GGUFValueType::U8, vec![MetadataValue::U8(1)]).unwrap(),
    ));
    let outer = MetadataArray::new(GGUFValueType::Array, vec![inner]).unwrap();
    let (bytes, _) = GGUFBuilder::new()
        .add_metadata("a.nested", MetadataValue::Array(Box::new(outer)))
        .build_to_bytes()
        .unwrap();
    assert!(
        matches!(GgufHeader::parse(&bytes), Err(Error::NestedArray { key, .. }) if key == "a.nested")
    );
}
