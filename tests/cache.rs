//! The transform cache: a fill and a hit give the transform's bytes; a
//! changed source, a corrupted entry, a killed fill, two fills at once, a
//! directory that cannot serve (unsafe, read-only, full) never give wrong
//! tensors; `verify` finds every flipped byte; `prune` keeps the size.
//!
//! The read-only and full-disk cases need a read-only and a tiny
//! filesystem: `.ci/run` mounts them (as root) and names them in
//! `WEIGHTMAP_TEST_RO_DIR` and `WEIGHTMAP_TEST_FULL_DIR`; without them
//! those two tests say so and pass.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use weightmap::cache::{
    Cache, CacheBypass, CacheOutcome, EntryContents, Lookup, Miss, PlannedTensor, Transform,
    TransformId,
};
use weightmap::{gguf::Writer, Error, LoadMode, LoadOptions, TensorType, Weights};

/// Q8_0 blocks: 34 bytes for 32 elements.
const Q8_BLOCK: usize = 34;

/// A model with two Q8_0 matrices (48 KiB each: more than both 4 KiB
/// samples), an F32 vector and a small F32 tensor. `seed` varies the bytes.
fn write_model(path: &Path, seed: u8) {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    for (name, rows) in [("a.weight", 48), ("b.weight", 48)] {
        let blocks = rows * 32; // 32 blocks of 32 per row: ne0 = 1024
        let mut data = Vec::with_capacity(blocks * Q8_BLOCK);
        for b in 0..blocks {
            let scale = half::f16::from_f32(0.01 * (1 + (b + usize::from(seed)) % 7) as f32);
            data.extend_from_slice(&scale.to_le_bytes());
            data.extend((0..32).map(|i| ((b * 31 + i * 7 + usize::from(seed)) % 255) as u8));
        }
        w.tensor(name, TensorType::Q8_0, &[1024, rows as u64], data);
    }
    let v: Vec<u8> = (0..2048u32)
        .flat_map(|i| (i as f32 * 0.5 + f32::from(seed)).to_le_bytes())
        .collect();
    w.tensor("norm.weight", TensorType::F32, &[2048], v);
    w.tensor(
        "bias",
        TensorType::F32,
        &[4],
        1.0f32.to_le_bytes().repeat(4),
    );
    w.write_with(fs::File::create(path).unwrap(), |_, _| {})
        .unwrap();
}

/// Q8_0 tensors dequantized to F32; the rest left out.
fn dequant() -> Transform<'static> {
    Transform::new("dequant-f32", 1, |info, src, dst| {
        let out: &mut [f32] = bytemuck::try_cast_slice_mut(dst).map_err(|e| e.to_string())?;
        weightmap::quant::dequantize(info.ty, src, out).map_err(|e| e.to_string())
    })
    .select(|info| (info.ty == TensorType::Q8_0).then(|| (TensorType::F32, info.ne())))
}

/// What the transform gives, computed without any cache.
fn expected(model: &Path) -> Vec<(String, Vec<f32>)> {
    let w = Weights::load_streamed(model, &LoadOptions::default()).unwrap();
    w.tensors()
        .filter(|t| t.info().ty == TensorType::Q8_0)
        .map(|t| (t.name().to_owned(), t.to_f32_vec().unwrap()))
        .collect()
}

fn assert_transformed(got: &Weights, model: &Path) {
    let want = expected(model);
    assert_eq!(got.len(), want.len());
    for (name, values) in want {
        let t = got.tensor(&name).unwrap();
        assert_eq!(t.info().ty, TensorType::F32);
        let bits: Vec<u32> = t
            .view::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        let want: Vec<u32> = values.iter().map(|x| x.to_bits()).collect();
        assert!(
            bits == want,
            "tensor '{name}' differs from the transform's output"
        );
    }
}

fn load(cache: &Cache, model: &Path) -> weightmap::cache::Cached {
    // SAFETY: each test's files are its own, and nothing changes them
    // while the weights live.
    unsafe { cache.load(model, &dequant(), &LoadOptions::default()) }.unwrap()
}

fn setup() -> (tempfile::TempDir, PathBuf, Cache) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    write_model(&model, 0);
    let cache = Cache::at(dir.path().join("cache"));
    (dir, model, cache)
}

fn entry_of(c: &weightmap::cache::Cached) -> PathBuf {
    c.report().entry.clone().expect("an entry")
}

fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x40;
    // Written under a new inode and renamed, as a bad disk or a stray
    // writer would leave it, without touching a mapping that may be live.
    let tmp = path.with_extension("flip");
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, path).unwrap();
}

/// Where tensor `name` of the GGUF at `path` starts in the file.
fn tensor_offset(path: &Path, name: &str) -> u64 {
    let h = weightmap::Header::read(path).unwrap();
    h.tensors().find(name).unwrap().file_offset
}

#[test]
fn a_fill_then_a_hit_give_the_transforms_bytes_mapped() {
    let (_dir, model, cache) = setup();
    let first = load(&cache, &model);
    assert_eq!(
        first.report().outcome,
        CacheOutcome::Filled,
        "{}",
        first.report()
    );
    assert_transformed(first.weights(), &model);
    let second = load(&cache, &model);
    assert_eq!(
        second.report().outcome,
        CacheOutcome::Hit,
        "{}",
        second.report()
    );
    assert_eq!(entry_of(&first), entry_of(&second));
    assert_transformed(second.weights(), &model);
    if cfg!(any(unix, windows)) {
        assert_eq!(second.weights().report().mode_used, LoadMode::Mmap);
        assert_eq!(second.weights().report().tensors_copied, 0);
    }
    assert!(second.report().to_string().starts_with("cached: mapped"));
    // The entry is a GGUF file like any other.
    let entry = Weights::load_streamed(entry_of(&second), &LoadOptions::default()).unwrap();
    assert_eq!(entry.len(), 2);
}

#[test]
fn a_source_rewritten_in_place_is_transformed_again() {
    let (_dir, model, cache) = setup();
    let old = entry_of(&load(&cache, &model));
    // New bytes, same path and size: only the identity and the
    // fingerprint tell them apart.
    let before = fs::metadata(&model).unwrap().len();
    write_model(&model, 3);
    assert_eq!(fs::metadata(&model).unwrap().len(), before);
    let again = load(&cache, &model);
    assert_eq!(
        again.report().outcome,
        CacheOutcome::Filled,
        "{}",
        again.report()
    );
    assert_ne!(entry_of(&again), old);
    assert_transformed(again.weights(), &model);
    // The old entry can never be used again: the fill's own prune removed
    // it.
    assert!(!old.exists());
    assert_eq!(cache.entries().unwrap().len(), 1);
}

#[test]
fn a_cache_pointed_at_a_folder_of_models_never_touches_them() {
    let (dir, model, _) = setup();
    // The model itself, and another GGUF, live in the cache's directory.
    let cache = Cache::at(dir.path());
    let other = dir.path().join("other.gguf");
    fs::copy(&model, &other).unwrap();
    let c = load(&cache, &model);
    assert_eq!(c.report().outcome, CacheOutcome::Filled);
    drop(c);
    assert_eq!(cache.entries().unwrap().len(), 1);
    let cleared = cache.clear().unwrap();
    assert_eq!(cleared.removed.len(), 1, "{cleared:?}");
    assert!(model.exists() && other.exists());
}

#[test]
fn entries_of_a_changed_source_are_listed_stale_and_pruned() {
    let (_dir, model, cache) = setup();
    let old = entry_of(&load(&cache, &model));
    assert!(
        cache.entries().unwrap()[0]
            .1
            .as_ref()
            .unwrap()
            .source_current
    );
    write_model(&model, 5);
    let listed = cache.entries().unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].1.as_ref().unwrap().source_current);
    let pruned = cache.prune(u64::MAX).unwrap();
    assert_eq!(pruned.removed.len(), 1, "{pruned:?}");
    assert!(pruned.removed[0].2.contains("source changed"));
    assert!(!old.exists());
}

#[test]
fn the_same_mtime_with_other_bytes_still_changes_the_key() {
    let (_dir, model, cache) = setup();
    let old = entry_of(&load(&cache, &model));
    let mtime = fs::metadata(&model).unwrap().modified().unwrap();
    // Change one byte in the first 4 KiB of a tensor, and put the time back.
    let at = tensor_offset(&model, "a.weight") + 10;
    let mut bytes = fs::read(&model).unwrap();
    bytes[at as usize] ^= 1;
    fs::write(&model, &bytes).unwrap();
    fs::File::options()
        .write(true)
        .open(&model)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let again = load(&cache, &model);
    assert_eq!(again.report().outcome, CacheOutcome::Filled);
    assert_ne!(entry_of(&again), old);
    assert_transformed(again.weights(), &model);
}

#[test]
fn a_corrupted_entry_is_found_and_rebuilt() {
    let (_dir, model, cache) = setup();
    let entry = entry_of(&load(&cache, &model));
    // In the header (the key's text): the index checksum catches it.
    flip_byte(&entry, 40);
    let c = load(&cache, &model);
    assert_eq!(c.report().outcome, CacheOutcome::Filled);
    assert!(c.report().replaced.is_some(), "{}", c.report());
    assert_transformed(c.weights(), &model);
    // Unmapped before the file is replaced (Windows refuses to replace a
    // mapped file).
    drop(c);
    // In a tensor's first bytes: its checksum catches it.
    flip_byte(&entry, tensor_offset(&entry, "b.weight") + 5);
    let c = load(&cache, &model);
    assert_eq!(c.report().outcome, CacheOutcome::Filled);
    assert!(
        c.report().replaced.as_deref().unwrap().contains("b.weight"),
        "{}",
        c.report()
    );
    assert_transformed(c.weights(), &model);
    drop(c);
    // Truncated: the loader's own bounds check.
    let len = fs::metadata(&entry).unwrap().len();
    let bytes = fs::read(&entry).unwrap();
    fs::write(entry.with_extension("cut"), &bytes[..len as usize - 1000]).unwrap();
    fs::rename(entry.with_extension("cut"), &entry).unwrap();
    let c = load(&cache, &model);
    assert_eq!(c.report().outcome, CacheOutcome::Filled);
    assert_transformed(c.weights(), &model);
}

#[test]
fn verify_passes_a_good_cache_and_names_a_flipped_byte() {
    let (_dir, model, cache) = setup();
    let entry = entry_of(&load(&cache, &model));
    let good = cache.verify().unwrap();
    assert_eq!(good.len(), 1);
    assert!(good[0].1.is_ok(), "{:?}", good[0].1);
    // In the middle of a tensor, where no open looks.
    let mid = tensor_offset(&entry, "a.weight") + 96 * 1024;
    flip_byte(&entry, mid);
    // SAFETY: as above.
    let bad = cache.verify().unwrap();
    let why = bad[0].1.as_ref().unwrap_err();
    assert!(why.contains("a.weight"), "{why}");
    // Every open checks every byte too: the entry is rebuilt.
    let c = load(&cache, &model);
    assert_eq!(c.report().outcome, CacheOutcome::Filled, "{}", c.report());
    assert_transformed(c.weights(), &model);
}

#[test]
fn a_directory_other_users_can_write_is_refused() {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let (dir, model, _) = setup();
        let shared = dir.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        let c = load(&Cache::at(&shared), &model);
        match &c.report().outcome {
            CacheOutcome::InMemory(CacheBypass::UnsafeDirectory { problem, .. }) => {
                assert!(problem.contains("777"), "{problem}");
            }
            other => panic!("{other:?}"),
        }
        assert_transformed(c.weights(), &model);
        assert_eq!(fs::read_dir(&shared).unwrap().count(), 0);
    }
}

#[test]
fn a_cache_turned_off_transforms_in_memory() {
    let (_dir, model, _) = setup();
    let c = load(&Cache::off(), &model);
    assert_eq!(c.report().outcome, CacheOutcome::InMemory(CacheBypass::Off));
    assert_eq!(
        c.report().to_string(),
        "not cached (the cache is off): transformed in memory"
    );
    assert_transformed(c.weights(), &model);
}

#[test]
fn a_directory_that_cannot_be_made_falls_back_to_memory() {
    let (dir, model, _) = setup();
    // A file where the directory should be.
    let blocked = dir.path().join("file");
    fs::write(&blocked, b"x").unwrap();
    let c = load(&Cache::at(blocked.join("cache")), &model);
    assert!(
        matches!(c.report().outcome, CacheOutcome::InMemory(_)),
        "{}",
        c.report()
    );
    assert!(c.report().to_string().starts_with("not cached"));
    assert_transformed(c.weights(), &model);
}

/// A directory from the environment, for the tests that need a filesystem
/// `.ci/run` mounts.
fn mounted(var: &str, test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os(var).map(PathBuf::from);
    if dir.is_none() {
        eprintln!("{test}: skipped: {var} is not set (.ci/run mounts it)");
    }
    dir
}

#[test]
fn a_read_only_cache_falls_back_to_memory_and_says_so() {
    let Some(ro) = mounted("WEIGHTMAP_TEST_RO_DIR", "read-only") else {
        return;
    };
    let (_dir, model, _) = setup();
    let c = load(&Cache::at(&ro), &model);
    assert!(
        matches!(
            c.report().outcome,
            CacheOutcome::InMemory(CacheBypass::ReadOnly { .. })
        ),
        "{}",
        c.report()
    );
    assert_transformed(c.weights(), &model);
}

#[test]
fn a_full_disk_falls_back_to_memory_and_leaves_nothing() {
    let Some(full) = mounted("WEIGHTMAP_TEST_FULL_DIR", "full disk") else {
        return;
    };
    let (_dir, model, _) = setup();
    let cache_dir = full.join(format!("cache-{}", std::process::id()));
    let c = load(&Cache::at(&cache_dir), &model);
    assert!(
        matches!(
            c.report().outcome,
            CacheOutcome::InMemory(CacheBypass::NoSpace { .. })
        ),
        "{}",
        c.report()
    );
    assert_transformed(c.weights(), &model);
    assert_eq!(
        fs::read_dir(&cache_dir).unwrap().count(),
        0,
        "a temporary file was left"
    );
    fs::remove_dir(&cache_dir).unwrap();
}

#[test]
fn a_source_that_changes_during_the_fill_is_not_stored() {
    let (_dir, model, cache) = setup();
    let touched = std::sync::atomic::AtomicBool::new(false);
    let t = Transform::new("copy", 1, |_info, src, dst| {
        if !touched.swap(true, std::sync::atomic::Ordering::Relaxed) {
            let later = SystemTime::now() + Duration::from_secs(5);
            let f = fs::File::options().write(true).open(&model).unwrap();
            f.set_modified(later).unwrap();
        }
        dst.copy_from_slice(src);
        Ok(())
    });
    // SAFETY: the test only changes the source's time, not its bytes.
    let c = unsafe { cache.load(&model, &t, &LoadOptions::default()) }.unwrap();
    assert!(
        matches!(
            c.report().outcome,
            CacheOutcome::InMemory(CacheBypass::SourceChanged { .. })
        ),
        "{}",
        c.report()
    );
    assert!(cache.entries().unwrap().is_empty());
}

#[test]
fn a_failing_transform_fails_the_load_and_stores_nothing() {
    let (_dir, model, cache) = setup();
    let t = Transform::new("broken", 1, |info, _, _| {
        Err(format!("cannot do {}", info.name))
    });
    // SAFETY: nothing changes the files.
    let err = unsafe { cache.load(&model, &t, &LoadOptions::default()) }.unwrap_err();
    assert!(
        matches!(&err, Error::Transform { tensor, .. } if tensor == "a.weight"),
        "{err}"
    );
    assert_eq!(err.name(), "transform");
    assert!(cache.entries().unwrap().is_empty());
    let leftovers = fs::read_dir(cache.dir().unwrap()).unwrap().count();
    assert_eq!(leftovers, 0);
}

#[test]
fn another_version_or_machine_is_another_entry() {
    let (_dir, model, cache) = setup();
    let a = entry_of(&load(&cache, &model));
    let copy = |v| {
        Transform::new("dequant-f32", v, |_i, s: &[u8], d: &mut [u8]| {
            d.copy_from_slice(s);
            Ok(())
        })
    };
    // SAFETY: nothing changes the files.
    let b = unsafe { cache.load(&model, &copy(2), &LoadOptions::default()) }.unwrap();
    let c = unsafe { cache.load(&model, &copy(2).machine("avx512f"), &LoadOptions::default()) }
        .unwrap();
    assert_eq!(b.report().outcome, CacheOutcome::Filled);
    assert_eq!(c.report().outcome, CacheOutcome::Filled);
    let paths = [a, entry_of(&b), entry_of(&c)];
    assert!(paths[0] != paths[1] && paths[1] != paths[2] && paths[0] != paths[2]);
}

#[test]
fn prune_removes_the_least_recently_used_first() {
    let (dir, _, cache) = setup();
    let mut entries = Vec::new();
    for i in 0..3u8 {
        let m = dir.path().join(format!("m{i}.gguf"));
        write_model(&m, i);
        let e = entry_of(&load(&cache, &m));
        // Distinct, ordered use times.
        let f = fs::File::options().write(true).open(&e).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(100 - u64::from(i) * 10))
            .unwrap();
        entries.push(e);
    }
    let one = fs::metadata(&entries[0]).unwrap().len();
    let report = cache.prune(2 * one).unwrap();
    assert_eq!(report.removed.len(), 1, "{report:?}");
    assert_eq!(report.removed[0].0, entries[0]);
    assert_eq!(report.kept, 2);
    assert!(!entries[0].exists() && entries[1].exists() && entries[2].exists());
    let cleared = cache.clear().unwrap();
    assert_eq!(cleared.removed.len(), 2);
    assert!(cache.entries().unwrap().is_empty());
}

/// The general form: a whole state dict with metadata, filled once.
struct StateDict {
    calls: usize,
}

impl EntryContents for StateDict {
    fn tensors(&self) -> Vec<PlannedTensor> {
        vec![PlannedTensor {
            name: "x".into(),
            ty: TensorType::F32,
            ne: vec![3],
        }]
    }
    fn metadata(&self) -> Vec<(String, weightmap::gguf::OwnedValue)> {
        vec![(
            "app.config".into(),
            weightmap::gguf::OwnedValue::String("{\"layers\": 1}".into()),
        )]
    }
    fn fill(&mut self, _i: usize, dst: &mut [u8]) -> Result<(), String> {
        self.calls += 1;
        dst.copy_from_slice(bytemuck::cast_slice(&[1.0f32, 2.0, 3.0]));
        Ok(())
    }
}

#[test]
fn lookup_then_store_keeps_metadata_and_makes_contents_only_on_a_miss() {
    let (_dir, model, cache) = setup();
    let id = TransformId::new("state-dict", 1);
    let opts = LoadOptions::default();
    let mut made = 0;
    for expect in [CacheOutcome::Filled, CacheOutcome::Hit] {
        // SAFETY: nothing changes the files.
        let c = match unsafe { cache.lookup(&model, &id, &opts) }.unwrap() {
            Lookup::Hit(c) => c,
            Lookup::Miss(miss) => {
                made += 1;
                // SAFETY: as above.
                unsafe { miss.store(&mut StateDict { calls: 0 }, &opts) }.unwrap()
            }
        };
        assert_eq!(c.report().outcome, expect);
        let md = c.weights().gguf_metadata().unwrap();
        assert_eq!(md.get_str("app.config").unwrap(), "{\"layers\": 1}");
        assert_eq!(
            c.weights().tensor("x").unwrap().view::<f32>().unwrap(),
            &[1.0, 2.0, 3.0]
        );
    }
    assert_eq!(made, 1);
}

/// `contents` written as `miss`'s entry and committed at once.
fn write(miss: &Miss, contents: &mut dyn EntryContents) -> Result<PathBuf, CacheBypass> {
    miss.prepare(contents).unwrap()?.commit()
}

#[test]
fn a_commit_says_where_the_entry_is_or_why_there_is_none() {
    let (dir, model, cache) = setup();
    let id = TransformId::new("state-dict", 1);
    let opts = LoadOptions::default();
    // SAFETY: nothing changes the files.
    let lookup = unsafe { cache.lookup(&model, &id, &opts) }.unwrap();
    let Lookup::Miss(miss) = lookup else {
        panic!("an empty cache hit");
    };
    let mut contents = StateDict { calls: 0 };
    let path = write(&miss, &mut contents).expect("written");
    assert_eq!(contents.calls, 1);
    let w = Weights::load_streamed(&path, &opts).unwrap();
    assert_eq!(
        w.tensor("x").unwrap().view::<f32>().unwrap(),
        &[1.0, 2.0, 3.0]
    );
    // A blocked directory: nothing written, and the contents stay the
    // caller's.
    let blocked = dir.path().join("file");
    fs::write(&blocked, b"x").unwrap();
    // SAFETY: as above.
    let lookup = unsafe { Cache::at(blocked.join("c")).lookup(&model, &id, &opts) }.unwrap();
    let Lookup::Miss(miss) = lookup else {
        panic!("hit");
    };
    assert!(miss.prepare(&mut contents).unwrap().is_err());
}

/// Contents that hold their bytes: written straight to the disk where the
/// system can (direct I/O), in parts of a few MiB.
struct Held {
    data: Vec<Vec<f32>>,
}

impl EntryContents for Held {
    fn tensors(&self) -> Vec<PlannedTensor> {
        (self.data.iter().enumerate())
            .map(|(i, d)| PlannedTensor {
                name: format!("held.{i}"),
                ty: TensorType::F32,
                ne: vec![d.len() as u64],
            })
            .collect()
    }
    fn bytes(&self, index: usize) -> Option<&[u8]> {
        Some(bytemuck::cast_slice(&self.data[index]))
    }
    fn fill(&mut self, _i: usize, _dst: &mut [u8]) -> Result<(), String> {
        Err("fill is not called when the bytes are held".into())
    }
}

#[test]
fn contents_that_hold_their_bytes_are_written_without_fill() {
    let (_dir, model, cache) = setup();
    let id = TransformId::new("held", 1);
    let opts = LoadOptions::default();
    // Tensors across several of the writer's parts, one of a single
    // element, an entry whose length is no multiple of 4096.
    let data: Vec<Vec<f32>> = [5000, 3_000_000, 1, 2_500_001]
        .iter()
        .enumerate()
        .map(|(t, &n)| (0..n).map(|i| (i * 4 + t) as f32 * 0.25).collect())
        .collect();
    // SAFETY: nothing changes the files.
    let lookup = unsafe { cache.lookup(&model, &id, &opts) }.unwrap();
    let Lookup::Miss(miss) = lookup else {
        panic!("hit");
    };
    let written = write(&miss, &mut Held { data: data.clone() });
    assert!(written.is_ok(), "{written:?}");
    // SAFETY: as above.
    let again = unsafe { cache.lookup(&model, &id, &opts) }.unwrap();
    let Lookup::Hit(c) = again else {
        panic!("the written entry is not found");
    };
    for (i, d) in data.iter().enumerate() {
        let name = format!("held.{i}");
        assert_eq!(
            c.weights().tensor(&name).unwrap().view::<f32>().unwrap(),
            &d[..]
        );
    }
    drop(c);
    let verdicts = cache.verify().unwrap();
    assert!(verdicts[0].1.is_ok(), "{:?}", verdicts[0].1);
}

#[test]
fn a_prepared_entry_is_mapped_at_once_and_found_only_once_committed() {
    let (_dir, model, cache) = setup();
    let id = TransformId::new("state-dict", 1);
    let opts = LoadOptions::default();
    // SAFETY: nothing changes the files.
    let lookup = unsafe { cache.lookup(&model, &id, &opts) }.unwrap();
    let Lookup::Miss(miss) = lookup else {
        panic!("an empty cache hit");
    };
    let pending = miss
        .prepare(&mut StateDict { calls: 0 })
        .unwrap()
        .expect("prepared");
    // Mapped before the commit: the entry's bytes, under the temporary name.
    // SAFETY: nothing changes the file.
    let early = unsafe { Weights::load(pending.path(), &opts) }.unwrap();
    assert_eq!(
        early.tensor("x").unwrap().view::<f32>().unwrap(),
        &[1.0, 2.0, 3.0]
    );
    // SAFETY: as above.
    let before = unsafe { cache.lookup(&model, &id, &opts) }.unwrap();
    assert!(matches!(before, Lookup::Miss(_)), "found before the commit");
    // Windows may refuse to rename a file this process maps.
    let early = if cfg!(windows) {
        drop(early);
        None
    } else {
        Some(early)
    };
    let committed = std::thread::spawn(move || pending.commit()).join().unwrap();
    let path = committed.expect("committed");
    // The early mapping still holds the same bytes, now under the entry's
    // name, which a lookup finds.
    if let Some(early) = early {
        assert_eq!(
            early.tensor("x").unwrap().view::<f32>().unwrap(),
            &[1.0, 2.0, 3.0]
        );
    }
    // SAFETY: as above.
    match unsafe { cache.lookup(&model, &id, &opts) }.unwrap() {
        Lookup::Hit(c) => assert_eq!(c.report().entry.as_deref(), Some(path.as_path())),
        Lookup::Miss(_) => panic!("not found after the commit"),
    }
}

#[test]
fn a_prepared_entry_dropped_uncommitted_leaves_nothing() {
    let (_dir, model, cache) = setup();
    let id = TransformId::new("state-dict", 1);
    let opts = LoadOptions::default();
    // SAFETY: nothing changes the files.
    let lookup = unsafe { cache.lookup(&model, &id, &opts) }.unwrap();
    let Lookup::Miss(miss) = lookup else {
        panic!("hit");
    };
    let prepared = miss.prepare(&mut StateDict { calls: 0 }).unwrap();
    assert!(prepared.is_ok());
    drop(prepared);
    assert_eq!(fs::read_dir(cache.dir().unwrap()).unwrap().count(), 0);
}

/// The child of the tests below: fills the cache named in the environment
/// with a slow transform, announcing each tensor.
#[test]
fn child_fill() {
    let Some(cache_dir) = std::env::var_os("WM_CACHE_CHILD_DIR") else {
        return;
    };
    let model = PathBuf::from(std::env::var_os("WM_CACHE_CHILD_MODEL").unwrap());
    let pause = Duration::from_millis(
        std::env::var("WM_CACHE_CHILD_PAUSE_MS")
            .unwrap()
            .parse()
            .unwrap(),
    );
    if std::env::var_os("WM_CACHE_CHILD_HELD").is_some() {
        // Held bytes, written past the page cache: 128 MiB, long enough to
        // be killed while the bytes go to the disk.
        let id = TransformId::new("held", 1);
        // SAFETY: nothing changes the files.
        let lookup = unsafe { Cache::at(cache_dir).lookup(&model, &id, &LoadOptions::default()) };
        if let Lookup::Miss(miss) = lookup.unwrap() {
            let written = write(&miss, &mut Held { data: held_data() });
            println!("child outcome: {written:?}");
        }
        return;
    }
    let inner = dequant();
    let slow = Transform::new("dequant-f32", 1, |info, src, dst| {
        std::thread::sleep(pause);
        // The real transform, so that the entry is the one the parent wants.
        let out: &mut [f32] = bytemuck::try_cast_slice_mut(dst).map_err(|e| e.to_string())?;
        let _ = &inner;
        weightmap::quant::dequantize(info.ty, src, out).map_err(|e| e.to_string())
    })
    .select(|info| (info.ty == TensorType::Q8_0).then(|| (TensorType::F32, info.ne())));
    // SAFETY: nothing changes the files.
    let c = unsafe { Cache::at(cache_dir).load(&model, &slow, &LoadOptions::default()) }.unwrap();
    println!("child outcome: {}", c.report().outcome.name());
}

/// What the held child writes: two tensors, 128 MiB.
fn held_data() -> Vec<Vec<f32>> {
    [24 << 20, (8 << 20) + 3]
        .iter()
        .enumerate()
        .map(|(t, &n)| (0..n).map(|i| (i * 2 + t) as f32).collect())
        .collect()
}

fn child_command(cache_dir: &Path, model: &Path, pause_ms: u64) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_fill", "--nocapture", "--test-threads=1"])
        .env("WM_CACHE_CHILD_DIR", cache_dir)
        .env("WM_CACHE_CHILD_MODEL", model)
        .env("WM_CACHE_CHILD_PAUSE_MS", pause_ms.to_string())
        .stdout(std::process::Stdio::piped());
    c
}

fn spawn_child(cache_dir: &Path, model: &Path, pause_ms: u64) -> std::process::Child {
    child_command(cache_dir, model, pause_ms).spawn().unwrap()
}

/// Wait until `dir` holds a file (a fill's temporary file).
fn wait_for_a_file(dir: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while fs::read_dir(dir).unwrap().count() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the child never started its fill"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_held_write_killed_midway_leaves_nothing_wrong() {
    let (_dir, model, cache) = setup();
    let cache_dir = cache.dir().unwrap().to_owned();
    fs::create_dir_all(&cache_dir).unwrap();
    let want = held_data();
    for delay_ms in [0, 30, 80] {
        let mut child = child_command(&cache_dir, &model, 0)
            .env("WM_CACHE_CHILD_HELD", "1")
            .spawn()
            .unwrap();
        wait_for_a_file(&cache_dir);
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        // Killed before its rename: no entry; after: a whole one. Never a
        // torn one, never another's bytes.
        for (path, verdict) in cache.verify().unwrap() {
            assert!(verdict.is_ok(), "{}: {verdict:?}", path.display());
        }
        let id = TransformId::new("held", 1);
        // SAFETY: nothing changes the files.
        if let Lookup::Hit(c) =
            unsafe { cache.lookup(&model, &id, &LoadOptions::default()) }.unwrap()
        {
            for (i, d) in want.iter().enumerate() {
                let t = c.weights().tensor(&format!("held.{i}")).unwrap();
                assert_eq!(t.view::<f32>().unwrap(), &d[..]);
            }
        }
        fs::remove_dir_all(&cache_dir).unwrap();
        fs::create_dir_all(&cache_dir).unwrap();
    }
}

#[test]
fn a_fill_killed_midway_leaves_nothing_a_load_uses() {
    let (_dir, model, cache) = setup();
    let cache_dir = cache.dir().unwrap().to_owned();
    fs::create_dir_all(&cache_dir).unwrap();
    let mut child = spawn_child(&cache_dir, &model, 400);
    // Wait for its temporary file, then kill it mid-fill.
    wait_for_a_file(&cache_dir);
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        cache.entries().unwrap().is_empty(),
        "a killed fill left an entry"
    );
    let c = load(&cache, &model);
    assert_eq!(c.report().outcome, CacheOutcome::Filled);
    assert_transformed(c.weights(), &model);
    // The killed fill's temporary file went with the prune that follows
    // every fill (at once where a lock tells it is free).
    if cfg!(unix) {
        let left: Vec<_> = fs::read_dir(&cache_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(left, vec![entry_of(&c)]);
    }
}

#[test]
fn two_processes_filling_one_entry_leave_one_whole_entry() {
    let (_dir, model, cache) = setup();
    let cache_dir = cache.dir().unwrap().to_owned();
    let kids = [
        spawn_child(&cache_dir, &model, 20),
        spawn_child(&cache_dir, &model, 20),
    ];
    for kid in kids {
        let out = kid.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("child outcome: filled") || text.contains("child outcome: hit"),
            "{text}"
        );
    }
    let listed = cache.entries().unwrap();
    assert_eq!(listed.len(), 1);
    let verdicts = cache.verify().unwrap();
    assert!(verdicts[0].1.is_ok(), "{:?}", verdicts[0].1);
    let c = load(&cache, &model);
    assert_eq!(c.report().outcome, CacheOutcome::Hit);
    assert_transformed(c.weights(), &model);
    assert_eq!(
        fs::read_dir(&cache_dir).unwrap().count(),
        1,
        "a temporary file was left"
    );
}
