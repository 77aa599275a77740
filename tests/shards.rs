//! Models in several files: llama.cpp split GGUF and Hugging Face sharded
//! safetensors, from the reference writers' fixtures (testdata/shards, made
//! by testdata/make_shard_fixtures.py), and every typed error.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};
use weightmap::gguf::{OwnedValue, Writer};
use weightmap::{Error, LoadMode, LoadOptions, ModelHeaders, TensorType, Weights};

fn shards_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/shards")
}

fn manifest() -> Value {
    serde_json::from_slice(&std::fs::read(shards_dir().join("manifest.json")).unwrap()).unwrap()
}

fn load(path: &Path, mode: LoadMode) -> weightmap::Result<Weights> {
    // SAFETY: the fixtures and test files are not modified while loaded.
    unsafe { Weights::load(path, &LoadOptions::default().mode(mode)) }
}

fn hex(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

/// Every tensor's bytes match the manifest, and its shard is the one named.
fn check_against(w: &Weights, m: &Value) {
    let m = m.as_object().unwrap();
    assert_eq!(w.len(), m.len());
    for t in w.tensors() {
        let want = &m[t.name()];
        assert_eq!(hex(&t.to_vec().unwrap()), want["sha256"], "{}", t.name());
    }
    let files: Vec<String> = w
        .report()
        .shards
        .iter()
        .map(|s| s.path.file_name().unwrap().to_str().unwrap().to_owned())
        .collect();
    let mut want: Vec<String> = m
        .values()
        .map(|v| v["shard"].as_str().unwrap().to_owned())
        .collect();
    want.sort();
    want.dedup();
    assert_eq!(files, want);
    let per: usize = w.report().shards.iter().map(|s| s.tensors).sum();
    assert_eq!(per, w.len());
}

#[test]
fn split_gguf_loads_from_any_shard_in_either_mode() {
    let m = manifest();
    for shard in 1..=3 {
        let p = shards_dir().join(format!("split-0000{shard}-of-00003.gguf"));
        for mode in [LoadMode::Mmap, LoadMode::Stream] {
            let w = load(&p, mode).unwrap();
            check_against(&w, &m["gguf"]);
            assert_eq!(w.report().mode_used, mode);
            assert_eq!(w.report().shards.len(), 3);
            // Metadata from the first shard, as llama.cpp reads it.
            let md = w.gguf_metadata().unwrap();
            assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
            assert_eq!(md.get_int::<u64>("split.no").unwrap(), 0);
            assert!(w.path().ends_with("split-00001-of-00003.gguf"));
            // One name index over all shards.
            assert_eq!(w.tensor("output.weight").unwrap().info().ne(), [32, 7]);
            assert_eq!(w.blocks().len(), 2);
        }
    }
    let hs = ModelHeaders::read(shards_dir().join("split-00003-of-00003.gguf")).unwrap();
    assert_eq!((hs.files.len(), hs.tensor_count()), (3, 6));
}

#[test]
fn sharded_safetensors_load_from_the_index_or_its_directory() {
    let m = manifest();
    let dir = shards_dir().join("hf");
    for p in [dir.join("model.safetensors.index.json"), dir.clone()] {
        for mode in [LoadMode::Mmap, LoadMode::Stream] {
            let w = load(&p, mode).unwrap();
            check_against(&w, &m["safetensors"]);
            assert!(w.report().warnings.is_empty(), "{:?}", w.report().warnings);
        }
    }
}

/// Copy the split fixtures into a fresh directory.
fn split_copy() -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (1..=3)
        .map(|i| {
            let name = format!("split-0000{i}-of-00003.gguf");
            let to = dir.path().join(&name);
            std::fs::copy(shards_dir().join(&name), &to).unwrap();
            to
        })
        .collect();
    (dir, paths)
}

/// A shard written with the crate's writer: `keys` as (name, value).
fn write_shard(path: &Path, keys: &[(&str, OwnedValue)], tensors: &[&str]) {
    let mut w = Writer::new(32);
    for (k, v) in keys {
        w.kv(k, v.clone());
    }
    for (i, t) in tensors.iter().enumerate() {
        w.tensor(t, TensorType::F32, &[4], vec![i as u8 + 1; 16]);
    }
    std::fs::write(path, w.to_bytes()).unwrap();
}

fn split_keys(no: u16, count: u16, total: i32) -> Vec<(&'static str, OwnedValue)> {
    vec![
        ("split.no", OwnedValue::U16(no)),
        ("split.count", OwnedValue::U16(count)),
        ("split.tensors.count", OwnedValue::I32(total)),
    ]
}

fn err(p: &Path) -> Error {
    load(p, LoadMode::Mmap).unwrap_err()
}

#[test]
fn split_gguf_errors_name_the_shard() {
    // A missing shard.
    let (dir, paths) = split_copy();
    std::fs::remove_file(&paths[1]).unwrap();
    match err(&paths[0]) {
        Error::MissingShard { path } => assert_eq!(path, paths[1]),
        e => panic!("{e:?}"),
    }
    drop(dir);

    let dir = tempfile::tempdir().unwrap();
    let p = |i: u32| dir.path().join(format!("m-{i:05}-of-00002.gguf"));
    // split.count disagreeing between shards.
    write_shard(&p(1), &split_keys(0, 2, 2), &["a"]);
    write_shard(&p(2), &split_keys(1, 3, 2), &["b"]);
    match err(&p(1)) {
        Error::SplitCountMismatch {
            path,
            expected: 2,
            found: 3,
        } => assert_eq!(path, p(2)),
        e => panic!("{e:?}"),
    }
    // split.no repeated, and out of range.
    write_shard(&p(2), &split_keys(0, 2, 2), &["b"]);
    match err(&p(2)) {
        Error::SplitNoInvalid {
            path,
            no: 0,
            count: 2,
            detail,
        } => {
            assert_eq!(path, p(2));
            assert_eq!(detail, "repeated");
        }
        e => panic!("{e:?}"),
    }
    write_shard(&p(2), &split_keys(7, 2, 2), &["b"]);
    assert!(matches!(err(&p(1)), Error::SplitNoInvalid { no: 7, .. }));
    // A tensor present in two shards.
    write_shard(&p(2), &split_keys(1, 2, 2), &["a"]);
    match err(&p(1)) {
        Error::DuplicateShardTensor {
            tensor,
            first,
            second,
        } => {
            assert_eq!((tensor.as_str(), first, second), ("a", p(1), p(2)));
        }
        e => panic!("{e:?}"),
    }
    // split.tensors.count not matching the tensors found.
    write_shard(&p(1), &split_keys(0, 2, 5), &["a"]);
    write_shard(&p(2), &split_keys(1, 2, 5), &["b"]);
    assert!(matches!(
        err(&p(1)),
        Error::SplitTensorsCount {
            expected: 5,
            found: 2,
            ..
        }
    ));
    // A file with a shard's name that is not part of this model.
    write_shard(&p(1), &split_keys(0, 2, 2), &["a"]);
    write_shard(&p(2), &[], &["b"]);
    match err(&p(1)) {
        Error::NotAShard { path, detail } => {
            assert_eq!(path, p(2));
            assert!(detail.contains("split.no"), "{detail}");
        }
        e => panic!("{e:?}"),
    }
    // And it all loads once right.
    write_shard(&p(2), &split_keys(1, 2, 2), &["b"]);
    let w = load(&p(2), LoadMode::Mmap).unwrap();
    assert_eq!(w.len(), 2);
    assert_eq!(w.tensor("b").unwrap().to_vec().unwrap(), vec![1; 16]);
}

#[test]
fn single_files_and_split_count_one() {
    let dir = tempfile::tempdir().unwrap();
    // split.count = 1 loads as a single file.
    let one = dir.path().join("one.gguf");
    write_shard(&one, &split_keys(0, 1, 1), &["a"]);
    let w = load(&one, LoadMode::Mmap).unwrap();
    assert!(w.report().shards.is_empty());
    // A shard renamed out of the pattern cannot find its siblings: say so.
    let lone = dir.path().join("renamed.gguf");
    write_shard(&lone, &split_keys(0, 3, 3), &["a"]);
    match err(&lone) {
        Error::NotAShard { path, detail } => {
            assert_eq!(path, lone);
            assert!(detail.contains("00001-of-00003"), "{detail}");
        }
        e => panic!("{e:?}"),
    }
}

/// A sharded safetensors model in a fresh directory: `shards` as
/// (file, tensor names), and the index's text.
fn st_model(shards: &[(&str, &[&str])], index: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (file, names) in shards {
        let mut header = serde_json::Map::new();
        let mut off = 0u64;
        for n in *names {
            header.insert(
                (*n).to_owned(),
                serde_json::json!({"dtype": "F32", "shape": [2], "data_offsets": [off, off + 8]}),
            );
            off += 8;
        }
        let json = serde_json::to_vec(&Value::Object(header)).unwrap();
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend(json);
        bytes.extend(vec![7u8; off as usize]);
        std::fs::write(dir.path().join(file), bytes).unwrap();
    }
    std::fs::write(dir.path().join("model.safetensors.index.json"), index).unwrap();
    dir
}

#[test]
fn sharded_safetensors_errors_name_the_file() {
    let two = [("a.safetensors", &["x"][..]), ("b.safetensors", &["y"][..])];
    let good = r#"{"metadata": {"total_size": 16}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}"#;
    let d = st_model(&two, good);
    assert_eq!(load(d.path(), LoadMode::Mmap).unwrap().len(), 2);

    // weight_map names a file that is missing.
    let d = st_model(
        &two,
        r#"{"weight_map": {"x": "a.safetensors", "y": "c.safetensors"}}"#,
    );
    match err(d.path()) {
        Error::MissingShard { path } => assert!(path.ends_with("c.safetensors")),
        e => panic!("{e:?}"),
    }
    // A listed tensor absent from its file.
    let d = st_model(
        &two,
        r#"{"weight_map": {"x": "a.safetensors", "y": "b.safetensors", "z": "b.safetensors"}}"#,
    );
    match err(d.path()) {
        Error::TensorNotInShard { tensor, path } => {
            assert_eq!(tensor, "z");
            assert!(path.ends_with("b.safetensors"));
        }
        e => panic!("{e:?}"),
    }
    // A tensor in two files.
    let dup = [
        ("a.safetensors", &["x"][..]),
        ("b.safetensors", &["x", "y"][..]),
    ];
    let d = st_model(&dup, good);
    assert!(
        matches!(err(d.path()), Error::DuplicateShardTensor { ref tensor, .. } if tensor == "x")
    );
    // A shard holding a tensor the index does not list.
    let extra = [
        ("a.safetensors", &["x", "w"][..]),
        ("b.safetensors", &["y"][..]),
    ];
    let d = st_model(&extra, good);
    match err(d.path()) {
        Error::UnlistedShardTensor { tensor, path } => {
            assert_eq!(tensor, "w");
            assert!(path.ends_with("a.safetensors"));
        }
        e => panic!("{e:?}"),
    }
    // Malformed JSON, and the wrong types.
    for (index, needle) in [
        ("{not json", "invalid JSON"),
        (r#"{"metadata": {}}"#, "no \"weight_map\""),
        (r#"{"weight_map": ["a.safetensors"]}"#, "not an object"),
        (r#"{"weight_map": {"x": 3}}"#, "not a string"),
        (
            r#"{"weight_map": {"x": "../a.safetensors"}}"#,
            "not a file name",
        ),
        (
            r#"{"metadata": {"total_size": "big"}, "weight_map": {"x": "a.safetensors"}}"#,
            "total_size",
        ),
    ] {
        let d = st_model(&two, index);
        match err(d.path()) {
            Error::ShardIndex { detail, .. } => {
                assert!(detail.contains(needle), "{index}: {detail}")
            }
            e => panic!("{index}: {e:?}"),
        }
    }
    // total_size disagreeing is a warning (transformers never checks it).
    let d = st_model(
        &two,
        r#"{"metadata": {"total_size": 999}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}"#,
    );
    let w = load(d.path(), LoadMode::Mmap).unwrap();
    assert_eq!(w.report().warnings.len(), 1);
    assert!(
        w.report().warnings[0].contains("999"),
        "{:?}",
        w.report().warnings
    );
}

/// A model of `layers` dense F32 tensors of `mib` MiB each (`blk.N.attn_q`,
/// values varying by layer), written as one file at `dir/one.gguf` and as a
/// split of one layer a shard (`dir/split-0000N-of-0000K.gguf`); the
/// split's first shard.
fn dense_one_and_split(dir: &Path, layers: u16, mib: usize) -> (PathBuf, PathBuf) {
    let tensor = |l: u16| -> (String, Vec<u8>) {
        let name = format!("blk.{l}.attn_q.weight");
        (name, vec![l as u8 + 1; mib << 20])
    };
    let mut one = Writer::new(32);
    one.kv_str("general.architecture", "llama");
    for l in 0..layers {
        let (name, bytes) = tensor(l);
        one.tensor(&name, TensorType::F32, &[(mib << 18) as u64], bytes);
    }
    let one_path = dir.join("one.gguf");
    one.write_with(std::fs::File::create(&one_path).unwrap(), |_, _| {})
        .unwrap();
    for l in 0..layers {
        let mut w = Writer::new(32);
        if l == 0 {
            w.kv_str("general.architecture", "llama");
        }
        for (k, v) in split_keys(l, layers, i32::from(layers)) {
            w.kv(k, v);
        }
        let (name, bytes) = tensor(l);
        w.tensor(&name, TensorType::F32, &[(mib << 18) as u64], bytes);
        let path = dir.join(format!("split-{:05}-of-{layers:05}.gguf", l + 1));
        w.write_with(std::fs::File::create(&path).unwrap(), |_, _| {})
            .unwrap();
    }
    (
        one_path,
        dir.join(format!("split-00001-of-{layers:05}.gguf")),
    )
}

#[test]
fn a_split_model_plans_as_the_same_model_in_one_file() {
    // Issue 54: two 100 MiB tensors under a 200 MiB budget. In one file the
    // larger streams until the rest fits beside the runtime's reserve; as
    // two shards, each shard's plan saw the whole budget and streamed
    // nothing, and the model read 1.7 times the bytes a pass.
    let dir = tempfile::tempdir().unwrap();
    let (one, split) = dense_one_and_split(dir.path(), 2, 100);
    let opts = LoadOptions::default()
        .budget(200 << 20)
        .prefetch(weightmap::Prefetch::None);
    // SAFETY: the test's own files, unchanged while mapped.
    let one = unsafe { Weights::load(&one, &opts) }.unwrap();
    // SAFETY: as above.
    let split = unsafe { Weights::load(&split, &opts) }.unwrap();
    let (a, b) = (one.report(), split.report());
    assert_eq!(b.shards.len(), 2);
    assert!(!a.streamed_tensors.is_empty(), "{:?}", a.residency);
    assert_eq!(b.streamed_tensors, a.streamed_tensors);
    assert_eq!(b.residency, a.residency);
    assert_eq!(b.budget, a.budget);
}
