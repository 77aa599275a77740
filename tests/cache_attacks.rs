//! The transform cache under attack and faults: each of the ways a review
//! broke it, as a test, most of them repeated in a bounded loop (500 loads)
//! that must serve no wrong or foreign tensor and clobber no file.
//!
//! The attacks by another user need two uids: run as root, the attacker is
//! `nobody` through `setpriv`; elsewhere those tests print why they did not
//! run, and pass.

#[cfg(unix)]
use std::cell::Cell;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
#[cfg(unix)]
use std::time::Duration;

use weightmap::buffer::SimDeviceBufferType;
use weightmap::cache::{Cache, CacheOutcome, Cached, Transform};
#[cfg(unix)]
use weightmap::cache::{EntryContents, Lookup, PlannedTensor, TransformId};
use weightmap::{gguf::Writer, LoadMode, LoadOptions, TensorType, Weights};

/// F32 elements of the large tensor: 256 KiB, far more than the 4 KiB at
/// each end of a tensor that a source's fingerprint reads.
const BIG: usize = 64 * 1024;

/// A model of two F32 tensors; `seed` varies their values.
fn write_model(path: &Path, seed: u32) {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    let big: Vec<u8> = (0..BIG)
        .flat_map(|i| (i as f32 * 0.25 + seed as f32).to_le_bytes())
        .collect();
    w.tensor("big.weight", TensorType::F32, &[BIG as u64], big);
    w.tensor(
        "small",
        TensorType::F32,
        &[4],
        (seed as f32).to_le_bytes().repeat(4),
    );
    w.write_with(fs::File::create(path).unwrap(), |_, _| {})
        .unwrap();
}

/// Every F32 element times `by`, under one name and version whatever `by`
/// is: a forger's transform with another factor makes an entry with the
/// same key and other bytes.
fn scale(by: f32) -> Transform<'static> {
    Transform::new("scale", 1, move |_, src, dst| {
        for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
            let x = by * f32::from_le_bytes(s.try_into().unwrap());
            d.copy_from_slice(&x.to_le_bytes());
        }
        Ok(())
    })
}

/// The transform the tests' loads use.
fn triple() -> Transform<'static> {
    scale(3.0)
}

/// Each tensor's bytes as the transform gives them for `model` now.
fn expected(model: &Path) -> Vec<(String, Vec<u8>)> {
    let w = Weights::load_streamed(model, &LoadOptions::default()).unwrap();
    w.tensors()
        .map(|t| {
            let bytes = t
                .to_f32_vec()
                .unwrap()
                .iter()
                .flat_map(|x| (3.0 * x).to_le_bytes())
                .collect();
            (t.name().to_owned(), bytes)
        })
        .collect()
}

/// Whether `got` holds exactly `want`'s tensors (read back from any buffer
/// type).
fn holds(got: &Weights, want: &[(String, Vec<u8>)]) -> bool {
    got.len() == want.len()
        && want.iter().all(|(name, bytes)| {
            got.tensor(name)
                .and_then(|t| t.to_vec())
                .is_ok_and(|b| &b == bytes)
        })
}

fn load_with(cache: &Cache, model: &Path, options: &LoadOptions) -> Cached {
    // SAFETY: each test's files are its own; nothing modifies a source or
    // an entry while weights of it live (a test that rewrites one drops
    // them first).
    unsafe { cache.load(model, &triple(), options) }.unwrap()
}

fn load(cache: &Cache, model: &Path) -> Cached {
    load_with(cache, model, &LoadOptions::default())
}

/// Check that `c`'s outcome is `want`, saying what it was otherwise.
fn assert_outcome(c: &Cached, want: CacheOutcome) {
    assert_eq!(c.report().outcome, want, "{}", c.report());
}

/// A directory for a test's files on the disk the tests build on (direct
/// I/O works there, as on a user's disk).
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn setup() -> (tempfile::TempDir, PathBuf, Cache) {
    let dir = scratch();
    let model = dir.path().join("model.gguf");
    write_model(&model, 1);
    let cache = Cache::at(dir.path().join("cache"));
    (dir, model, cache)
}

#[cfg(unix)]
fn inode(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&fs::metadata(path).unwrap())
}

#[cfg(not(unix))]
fn inode(path: &Path) -> u64 {
    fs::metadata(path).unwrap().len()
}

/// Attack 1 and 2: a stream-mode load, a mapped load that falls back to
/// the stream path (a device buffer type, which cannot view the mapping),
/// and a device buffer type's own load, each of a filled entry: a hit, the
/// entry untouched.
#[test]
fn every_mode_and_buffer_type_hits_a_filled_entry_and_keeps_it() {
    let (_dir, model, cache) = setup();
    let want = expected(&model);
    let filled = load(&cache, &model);
    assert_eq!(filled.report().outcome, CacheOutcome::Filled);
    let entry = filled.report().entry.clone().unwrap();
    drop(filled);
    let (ino, bytes) = (inode(&entry), fs::read(&entry).unwrap());
    let device = Arc::new(SimDeviceBufferType::new(32, 1 << 30).unwrap());
    let cases = [
        ("stream", LoadOptions::default().mode(LoadMode::Stream)),
        ("device", LoadOptions::default().buffer_type(device.clone())),
        (
            "device, stream",
            LoadOptions::default()
                .buffer_type(device)
                .mode(LoadMode::Stream),
        ),
    ];
    for (what, options) in &cases {
        let c = load_with(&cache, &model, options);
        assert_eq!(
            c.report().outcome,
            CacheOutcome::Hit,
            "{what}: {}",
            c.report()
        );
        assert!(holds(c.weights(), &want), "{what}: wrong tensors");
        assert_eq!(inode(&entry), ino, "{what}: the entry was rewritten");
        assert!(
            fs::read(&entry).unwrap() == bytes,
            "{what}: the entry changed"
        );
    }
}

/// A valid entry that the caller's options cannot load (a memory budget
/// too small for a streamed copy) is the load's error, as for any model,
/// and the entry is left as it is, not rewritten.
#[test]
fn a_valid_entry_the_options_cannot_load_is_their_error_and_kept() {
    let (_dir, model, cache) = setup();
    let entry = load(&cache, &model).report().entry.clone().unwrap();
    let (ino, bytes) = (inode(&entry), fs::read(&entry).unwrap());
    let tight = LoadOptions::default().mode(LoadMode::Stream).budget(4096);
    // SAFETY: nothing modifies the files meanwhile.
    let found = unsafe { cache.lookup(&model, &triple().id(), &tight) };
    assert!(
        found.is_err(),
        "a 4 KiB budget cannot hold a 256 KiB copy: an error, not a miss"
    );
    // SAFETY: as above.
    assert!(unsafe { cache.load(&model, &triple(), &tight) }.is_err());
    assert_eq!(inode(&entry), ino, "the entry was rewritten");
    assert!(fs::read(&entry).unwrap() == bytes, "the entry changed");
    assert_eq!(load(&cache, &model).report().outcome, CacheOutcome::Hit);
}

/// Attack 2: a device buffer type fills an empty cache (the transform
/// reads the source on the host), then hits.
#[test]
fn a_device_buffer_type_fills_then_hits() {
    let (_dir, model, cache) = setup();
    let want = expected(&model);
    let device = Arc::new(SimDeviceBufferType::new(32, 1 << 30).unwrap());
    let options = LoadOptions::default().buffer_type(device);
    let first = load_with(&cache, &model, &options);
    assert_outcome(&first, CacheOutcome::Filled);
    assert!(holds(first.weights(), &want));
    let second = load_with(&cache, &model, &options);
    assert_outcome(&second, CacheOutcome::Hit);
    assert!(holds(second.weights(), &want));
}

/// Whether the tests that need a second user can run: as root, with
/// `setpriv` to become `nobody`.
#[cfg(unix)]
fn attacker_available(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let setpriv = Command::new("setpriv").arg("--version").output().is_ok();
    if root && setpriv {
        return true;
    }
    println!("{test}: skipped: needs root and setpriv to act as another user");
    false
}

/// Run `script` with `sh` as `nobody` until it is killed.
#[cfg(unix)]
fn as_nobody(script: &str) -> std::process::Child {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .spawn()
        .unwrap()
}

#[cfg(unix)]
fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

#[cfg(unix)]
fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// An entry for `model` with the right key and a forger's bytes (every
/// value times 5), readable by anyone, in a directory of its own.
#[cfg(unix)]
fn forged_entry(base: &Path, model: &Path) -> PathBuf {
    let forge = Cache::at(base.join("forge"));
    // SAFETY: nothing modifies the files meanwhile.
    let c = unsafe { forge.load(model, &scale(5.0), &LoadOptions::default()) }.unwrap();
    let path = c.report().entry.clone().unwrap();
    chmod(&base.join("forge"), 0o755);
    chmod(&path, 0o644);
    path
}

/// Attack 3: another user swaps the cache directory (in a parent anyone
/// may write, and through a link of theirs in a sticky one, as in `/tmp`)
/// for one of theirs holding a forged entry, in a loop, while 500 loads
/// run: none serves a foreign tensor, and no load writes into their
/// directory.
#[test]
#[cfg(unix)]
fn another_users_directory_swaps_serve_nothing_of_theirs() {
    if !attacker_available("another_users_directory_swaps_serve_nothing_of_theirs") {
        return;
    }
    let base = tempfile::tempdir_in("/tmp").unwrap();
    chmod(base.path(), 0o755);
    let model = base.path().join("model.gguf");
    write_model(&model, 2);
    chmod(&model, 0o644);
    let want = expected(&model);
    let forged = forged_entry(base.path(), &model);
    let name = forged.file_name().unwrap().to_str().unwrap().to_owned();
    let forged = forged.display();

    // A parent anyone may write: the directories themselves are swapped.
    let open = base.path().join("open");
    fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let mine = open.join("cache");
    fs::create_dir(&mine).unwrap();
    chmod(&mine, 0o700);
    let o = open.display();
    let swap = format!(
        "mkdir {o}/evil && cp {forged} {o}/evil/{name} && \
         while :; do mv {o}/cache {o}/real; mv {o}/evil {o}/cache; \
         mv {o}/cache {o}/evil; mv {o}/real {o}/cache; done 2>/dev/null"
    );
    // A sticky parent, as /tmp: a link of theirs, flipped between the
    // user's directory and theirs.
    let sticky = base.path().join("sticky");
    fs::create_dir(&sticky).unwrap();
    chmod(&sticky, 0o1777);
    let real = base.path().join("real-cache");
    fs::create_dir(&real).unwrap();
    chmod(&real, 0o700);
    let s = sticky.display();
    let r = real.display();
    let flip = format!(
        "mkdir {s}/evil && cp {forged} {s}/evil/{name} && ln -s {r} {s}/cache && \
         while :; do ln -sfn {s}/evil {s}/cache.new; mv -T {s}/cache.new {s}/cache; \
         ln -sfn {r} {s}/cache.new; mv -T {s}/cache.new {s}/cache; done 2>/dev/null"
    );
    for (what, script, dir) in [
        ("0777 parent", swap, open.join("cache")),
        ("1777 parent, their link", flip, sticky.join("cache")),
    ] {
        let mut attacker = as_nobody(&script);
        std::thread::sleep(Duration::from_millis(200));
        let cache = Cache::at(&dir);
        let mut wrong = 0;
        for _ in 0..500 {
            if !holds(load(&cache, &model).weights(), &want) {
                wrong += 1;
            }
        }
        attacker.kill().unwrap();
        attacker.wait().unwrap();
        assert_eq!(
            wrong, 0,
            "{what}: {wrong} of 500 loads served foreign tensors"
        );
        let theirs = sticky.join("evil");
        let planted = fs::read_dir(open.join("evil"))
            .into_iter()
            .chain(fs::read_dir(theirs))
            .flatten()
            .count();
        assert!(planted <= 2, "{what}: a load wrote into their directory");
    }
}

/// Entry contents that hold their bytes (written past the page cache where
/// the system can), and that, when first asked for them, do what an
/// attacker with the directory would: put a link to `victim` where the
/// fill's temporary file was. Unix only: creating a link needs a privilege
/// on Windows, where the cache directory is reached by its path and its
/// ACL is what keeps others out (ARCHITECTURE.md, "The transform cache").
#[cfg(unix)]
struct PlantLink {
    data: Vec<u8>,
    dir: PathBuf,
    victim: PathBuf,
    planted: Cell<bool>,
}

#[cfg(unix)]
impl EntryContents for PlantLink {
    fn tensors(&self) -> Vec<PlannedTensor> {
        let ne = vec![(self.data.len() / 4) as u64];
        vec![PlannedTensor {
            name: "w".into(),
            ty: TensorType::F32,
            ne,
        }]
    }

    fn bytes(&self, _index: usize) -> Option<&[u8]> {
        if !self.planted.replace(true) {
            for item in fs::read_dir(&self.dir).unwrap() {
                let path = item.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if name.starts_with(".tmp-") {
                    fs::rename(&path, path.with_extension("moved")).unwrap();
                    link(&self.victim, &path);
                }
            }
        }
        Some(&self.data)
    }

    fn fill(&mut self, _i: usize, dst: &mut [u8]) -> Result<(), String> {
        dst.copy_from_slice(&self.data);
        Ok(())
    }
}

#[cfg(unix)]
fn link(target: &Path, at: &Path) {
    std::os::unix::fs::symlink(target, at).unwrap();
}

/// Attack 4: a link planted at the fill's temporary name, 500 times: the
/// fill writes the file it created, never the link's target.
#[test]
#[cfg(unix)]
fn a_link_planted_at_the_temporary_name_clobbers_nothing() {
    let (dir, model, cache) = setup();
    let victim = dir.path().join("victim");
    let precious = vec![0x5a; 1 << 20];
    fs::write(&victim, &precious).unwrap();
    let data: Vec<u8> = (0..(256 << 10)).map(|i| (i % 251) as u8).collect();
    for round in 0..500 {
        let id = TransformId::new("held", round);
        let options = LoadOptions::default();
        // SAFETY: nothing modifies the files meanwhile.
        let Lookup::Miss(miss) = unsafe { cache.lookup(&model, &id, &options) }.unwrap() else {
            panic!("round {round}: a new version is a miss");
        };
        let mut contents = PlantLink {
            data: data.clone(),
            dir: cache.dir().unwrap().to_owned(),
            victim: victim.clone(),
            planted: Cell::new(false),
        };
        // SAFETY: as above.
        let cached = unsafe { miss.store(&mut contents, &options) }.unwrap();
        assert!(
            cached.weights().tensor("w").unwrap().to_vec().unwrap() == data,
            "round {round}: the entry's bytes are wrong"
        );
        drop(cached);
        assert!(
            fs::read(&victim).unwrap() == precious,
            "round {round}: the link's target was written"
        );
        cache.clear().unwrap();
        for item in fs::read_dir(cache.dir().unwrap()).unwrap() {
            let _ = fs::remove_file(item.unwrap().path());
        }
    }
}

/// Write `values` into the middle of `model`'s large tensor in place,
/// keeping its size and restoring its modification time.
fn rewrite_middle(model: &Path, values: f32) {
    let header = weightmap::Header::read(model).unwrap();
    let start = header.tensors().iter().next().unwrap().file_range().start;
    let mtime = fs::metadata(model).unwrap().modified().unwrap();
    let f = fs::OpenOptions::new().write(true).open(model).unwrap();
    let bytes = values.to_le_bytes().repeat(64);
    let at = start + (BIG as u64 * 4) / 2;
    #[cfg(unix)]
    std::os::unix::fs::FileExt::write_all_at(&f, &bytes, at).unwrap();
    #[cfg(windows)]
    std::os::windows::fs::FileExt::seek_write(&f, &bytes, at).unwrap();
    f.set_modified(mtime).unwrap();
}

/// Attack 5: a tensor rewritten in its middle, the size kept and the
/// modification time restored, 500 times: each load gives the file's
/// current values, never an earlier entry's.
#[test]
fn a_source_rewritten_with_its_mtime_restored_is_never_stale() {
    let (_dir, model, cache) = setup();
    let mut stale = 0;
    for round in 0..500 {
        rewrite_middle(&model, round as f32 + 0.5);
        let want = expected(&model);
        let c = load(&cache, &model);
        if !holds(c.weights(), &want) {
            stale += 1;
        }
    }
    assert_eq!(stale, 0, "{stale} of 500 loads served a stale entry");
}

/// Where tensor `name` of the GGUF at `path` starts in the file.
fn tensor_start(path: &Path, name: &str) -> u64 {
    let header = weightmap::Header::read(path).unwrap();
    let i = header.tensor_index(name).unwrap();
    header.tensors().iter().nth(i).unwrap().file_range().start
}

/// Attack 6: four bytes changed in the middle of a tensor of the entry,
/// in place, 500 times: the entry is never served, and each load gives the
/// right tensors.
#[test]
fn a_corrupted_entry_is_never_served() {
    let (_dir, model, cache) = setup();
    let want = expected(&model);
    let entry = load(&cache, &model).report().entry.clone().unwrap();
    let at = tensor_start(&entry, "big.weight") + (BIG as u64 * 4) / 2;
    let mut served = 0;
    for round in 0..500u32 {
        let f = fs::OpenOptions::new().write(true).open(&entry).unwrap();
        let junk = (round + 1).to_le_bytes();
        #[cfg(unix)]
        std::os::unix::fs::FileExt::write_all_at(&f, &junk, at).unwrap();
        #[cfg(windows)]
        std::os::windows::fs::FileExt::seek_write(&f, &junk, at).unwrap();
        drop(f);
        let c = load(&cache, &model);
        if c.report().outcome == CacheOutcome::Hit || !holds(c.weights(), &want) {
            served += 1;
        }
    }
    assert_eq!(
        served, 0,
        "{served} of 500 loads served the corrupted entry"
    );
}

/// Attack 7: the entry vanishes while it is filled (a `cache clear`
/// alongside; two processes' fills under a limit that holds one entry):
/// every load succeeds, with the right tensors, and no fill is lost to the
/// housekeeper (the second review's break 2: a `clear` between a fill's
/// create and its lock removed the fill's file).
#[test]
fn an_entry_removed_during_a_fill_never_fails_a_load() {
    let (dir, model, cache) = setup();
    let want = expected(&model);
    let stop = AtomicBool::new(false);
    let failed = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = cache.clear();
            }
        });
        let (mut failed, mut lost) = (0, 0);
        for _ in 0..500 {
            // SAFETY: nothing modifies the files; the clear only removes
            // entries, which leaves a live mapping intact.
            match unsafe { cache.load(&model, &triple(), &LoadOptions::default()) } {
                Ok(c) if !holds(c.weights(), &want) => failed += 1,
                Ok(c) if c.report().outcome.name() == "in_memory" => lost += 1,
                Ok(_) => {}
                Err(_) => failed += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        (failed, lost)
    });
    assert_eq!(
        failed,
        (0, 0),
        "of 500 loads beside a clear, (failed or wrong, fills lost)"
    );

    // Two fillers, each prune keeping one entry: each removes the other's.
    let other = dir.path().join("other.gguf");
    write_model(&other, 7);
    let one_entry = fs::metadata(load(&cache, &model).report().entry.as_ref().unwrap())
        .unwrap()
        .len();
    let small = cache.clone().max_size(one_entry + one_entry / 2);
    let run = |model: &Path| {
        let want = expected(model);
        (0..250)
            .filter(|_| {
                // SAFETY: as above.
                let c = unsafe { small.load(model, &triple(), &LoadOptions::default()) };
                !c.is_ok_and(|c| holds(c.weights(), &want))
            })
            .count()
    };
    let failed: usize = std::thread::scope(|scope| {
        let a = scope.spawn(|| run(&model));
        let b = scope.spawn(|| run(&other));
        a.join().unwrap() + b.join().unwrap()
    });
    assert_eq!(
        failed, 0,
        "{failed} of 500 loads failed under a one-entry limit"
    );
}

/// Attack 8: a source whose path is not UTF-8 fills, then hits; its
/// entry is listed as current and survives a prune.
#[test]
#[cfg(unix)]
fn a_source_path_that_is_not_utf8_fills_then_hits() {
    use std::os::unix::ffi::OsStrExt;
    let (dir, _, cache) = setup();
    let model = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"mod\xffel.gguf"));
    write_model(&model, 3);
    let want = expected(&model);
    let first = load(&cache, &model);
    assert_outcome(&first, CacheOutcome::Filled);
    let second = load(&cache, &model);
    assert_outcome(&second, CacheOutcome::Hit);
    assert!(holds(second.weights(), &want));
    let listed = cache.entries().unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].1.as_ref().unwrap().source_current);
    assert_eq!(cache.prune(u64::MAX).unwrap().removed.len(), 0);
}

/// Attack 9: a private source's transformed weights are this user's alone:
/// the entry is 0600, a directory others could read is made 0700 (and the
/// report says so), and another user cannot read the entry.
#[test]
#[cfg(unix)]
fn entries_are_private_and_a_readable_directory_is_made_private() {
    let base = tempfile::tempdir_in("/tmp").unwrap();
    chmod(base.path(), 0o755);
    let model = base.path().join("private.gguf");
    write_model(&model, 4);
    chmod(&model, 0o600);
    let dir = base.path().join("cache");
    fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o755);
    let cache = Cache::at(&dir);
    let c = load(&cache, &model);
    let entry = c.report().entry.clone().unwrap();
    assert_eq!(
        mode_of(&entry) & 0o077,
        0,
        "entry mode {:o}",
        mode_of(&entry)
    );
    assert_eq!(mode_of(&dir), 0o700);
    assert!(
        c.report().to_string().contains("made private"),
        "{}",
        c.report()
    );
    if attacker_available("entries_are_private_and_a_readable_directory_is_made_private") {
        let read = as_nobody(&format!("cat {} > /dev/null 2>&1", entry.display()))
            .wait()
            .unwrap();
        assert!(!read.success(), "another user read the entry");
    }
}

/// Run `f` on a thread of its own; fail if it has not finished within a
/// minute (it waits on a FIFO, say).
#[cfg(unix)]
fn within_a_minute<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} did not finish: it waits on a FIFO"))
}

/// Attack 10: FIFOs where an entry's source was, at a temporary file's
/// name and at an entry's name never make the cache wait.
#[test]
#[cfg(unix)]
fn fifos_never_make_the_cache_wait() {
    let (dir, model, cache) = setup();
    let entry = load(&cache, &model).report().entry.clone().unwrap();
    let mkfifo = |p: &Path| {
        let ok = Command::new("mkfifo").arg(p).status().unwrap();
        assert!(ok.success());
    };
    fs::remove_file(&model).unwrap();
    mkfifo(&model);
    let hash = entry.file_stem().unwrap().to_str().unwrap().to_owned();
    let cache_dir = cache.dir().unwrap().to_owned();
    mkfifo(&cache_dir.join(format!(".tmp-{hash}-1")));
    mkfifo(&cache_dir.join(format!("{}.gguf", "0".repeat(32))));
    let other = dir.path().join("other.gguf");
    write_model(&other, 5);
    let c = cache.clone();
    within_a_minute("listing", move || c.entries().map(|e| e.len()).unwrap());
    let c = cache.clone();
    within_a_minute("verify", move || c.verify().map(|v| v.len()).unwrap());
    let c = cache.clone();
    within_a_minute("a fill and its prune", move || {
        let _ = load(&c, &other);
    });
    let c = cache.clone();
    within_a_minute("prune", move || c.prune(0).unwrap().removed.len());
    let c = cache.clone();
    within_a_minute("clear", move || c.clear().unwrap().removed.len());
}

/// Attack 11: a model named like an entry in the cache directory is never
/// listed, verified as bad, pruned or cleared.
#[test]
fn a_model_named_like_an_entry_is_never_touched() {
    let (dir, model, cache) = setup();
    let _ = load(&cache, &model);
    let look_alike = cache
        .dir()
        .unwrap()
        .join("0123456789abcdef0123456789abcdef.gguf");
    write_model(&look_alike, 6);
    let bytes = fs::read(&look_alike).unwrap();
    assert!(cache
        .entries()
        .unwrap()
        .iter()
        .all(|(p, _)| p != &look_alike));
    let verdicts = cache.verify().unwrap();
    assert!(verdicts.iter().all(|(p, _)| p != &look_alike));
    assert!(cache.remove_bad(&look_alike).is_err());
    cache.prune(0).unwrap();
    cache.clear().unwrap();
    assert!(
        fs::read(&look_alike).unwrap() == bytes,
        "the model was changed or removed"
    );
    drop(dir);
}

/// The child of the test below: a load through the user's cache, with the
/// environment it was given.
#[test]
fn child_user_cache_load() {
    let Some(model) = std::env::var_os("WM_ATTACK_CHILD_MODEL") else {
        return;
    };
    let c = load(&Cache::new(), Path::new(&model));
    println!(
        "child outcome: {} / {}",
        c.report().outcome.name(),
        c.report()
    );
}

/// Attack 11: a `WEIGHTMAP_CACHE_MAX_SIZE` that is not a byte count is
/// said, not taken for 16 GiB: hits still serve, and nothing is written.
#[test]
fn a_max_size_that_is_not_a_byte_count_is_said() {
    let (_dir, model, cache) = setup();
    let child = |model: &Path| {
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_user_cache_load",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("WM_ATTACK_CHILD_MODEL", model)
            .env("WEIGHTMAP_CACHE_DIR", cache.dir().unwrap())
            .env("WEIGHTMAP_CACHE_MAX_SIZE", "lots")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.split_once("child outcome: ").map(|(_, o)| o.to_owned()))
            .unwrap_or_else(|| panic!("no outcome: {text}"))
    };
    let miss = child(&model);
    assert!(miss.starts_with("in_memory"), "{miss}");
    assert!(miss.contains("WEIGHTMAP_CACHE_MAX_SIZE"), "{miss}");
    let _ = load(&cache, &model);
    let hit = child(&model);
    assert!(hit.starts_with("hit"), "{hit}");
}

// The second review (issue 53): an entry keyed to one file but made from
// another, a fill's temporary file removed by a housekeeper, housekeepers
// failing for what another removed first, an entry larger than the limit,
// and a cache path whose missing steps were never checked.

/// Point the link `at` to `target` as `ln -sfn` does: a new link renamed
/// over the old one.
#[cfg(unix)]
fn relink(target: &Path, at: &Path) {
    let new = at.with_extension("new-link");
    let _ = fs::remove_file(&new);
    link(target, &new);
    fs::rename(&new, at).unwrap();
}

/// Two models and a link to the first, `model.gguf`: a deploy's current
/// version.
#[cfg(unix)]
fn blue_green() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf, Cache) {
    let dir = scratch();
    let (blue, green) = (dir.path().join("blue.gguf"), dir.path().join("green.gguf"));
    write_model(&blue, 1);
    write_model(&green, 9);
    let current = dir.path().join("model.gguf");
    link(&blue, &current);
    let cache = Cache::at(dir.path().join("cache"));
    (dir, blue, green, current, cache)
}

/// Tensors held in memory: what a caller that read the source by its path
/// (transformers, say) hands to [`weightmap::cache::Miss::store`].
#[cfg(unix)]
struct Held(Vec<(String, Vec<u8>)>);

#[cfg(unix)]
impl EntryContents for Held {
    fn tensors(&self) -> Vec<PlannedTensor> {
        let planned = |(name, bytes): &(String, Vec<u8>)| PlannedTensor {
            name: name.clone(),
            ty: TensorType::F32,
            ne: vec![bytes.len() as u64 / 4],
        };
        self.0.iter().map(planned).collect()
    }

    fn bytes(&self, index: usize) -> Option<&[u8]> {
        Some(&self.0[index].1)
    }

    fn fill(&mut self, index: usize, dst: &mut [u8]) -> Result<(), String> {
        dst.copy_from_slice(&self.0[index].1);
        Ok(())
    }
}

/// Break 1, the caller's own read: between the lookup and the commit the
/// link leads to another model and back (a blue/green deploy and its
/// rollback), and the caller reads that model by the path. Nothing is
/// stored, and a later load of the first model gives its own tensors.
#[test]
#[cfg(unix)]
fn a_path_that_led_elsewhere_between_lookup_and_commit_stores_nothing() {
    let (_dir, blue, green, current, cache) = blue_green();
    let options = LoadOptions::default();
    // SAFETY: each model is written once, before any load.
    let Lookup::Miss(miss) = (unsafe { cache.lookup(&current, &triple().id(), &options) }).unwrap()
    else {
        panic!("an empty cache is a miss");
    };
    relink(&green, &current);
    let mut read_by_path = Held(expected(&current));
    relink(&blue, &current);
    // SAFETY: as above.
    let stored = unsafe { miss.store(&mut read_by_path, &options) }.unwrap();
    assert_eq!(
        stored.report().outcome.name(),
        "in_memory",
        "{}",
        stored.report()
    );
    let again = load(&cache, &current);
    assert!(
        holds(again.weights(), &expected(&blue)),
        "blue's entry holds green's tensors: {}",
        again.report()
    );
}

/// Break 1, the same with a directory swapped for another and back (as a
/// deploy that renames release directories does): the model's own file
/// never changes, only what the path leads to.
#[test]
#[cfg(unix)]
fn a_directory_swapped_and_back_between_lookup_and_commit_stores_nothing() {
    let dir = scratch();
    let (live, spare) = (dir.path().join("live"), dir.path().join("spare"));
    fs::create_dir(&live).unwrap();
    fs::create_dir(&spare).unwrap();
    let model = live.join("model.gguf");
    write_model(&model, 1);
    write_model(&spare.join("model.gguf"), 9);
    let want = expected(&model);
    let swap = || {
        let parked = dir.path().join("parked");
        fs::rename(&live, &parked).unwrap();
        fs::rename(&spare, &live).unwrap();
        fs::rename(&parked, &spare).unwrap();
    };
    let cache = Cache::at(dir.path().join("cache"));
    let options = LoadOptions::default();
    // SAFETY: each model is written once, before any load.
    let Lookup::Miss(miss) = (unsafe { cache.lookup(&model, &triple().id(), &options) }).unwrap()
    else {
        panic!("an empty cache is a miss");
    };
    swap();
    let mut read_by_path = Held(expected(&model));
    swap();
    // SAFETY: as above.
    let stored = unsafe { miss.store(&mut read_by_path, &options) }.unwrap();
    assert_eq!(
        stored.report().outcome.name(),
        "in_memory",
        "{}",
        stored.report()
    );
    assert!(
        holds(load(&cache, &model).weights(), &want),
        "the entry holds the other model's tensors"
    );
}

/// Break 1, `Cache::load`: the link leads to the other model just after
/// the key is made (here, while the lookup reads a damaged entry, whose
/// streamed load calls the progress callback) and back while the transform
/// runs. The entry must hold the keyed model's tensors.
#[test]
#[cfg(unix)]
fn an_entry_holds_the_tensors_of_the_file_its_key_names() {
    use std::sync::atomic::AtomicUsize;
    let (_dir, blue, green, current, cache) = blue_green();
    let entry = load(&cache, &current).report().entry.clone().unwrap();
    let at = tensor_start(&entry, "big.weight") + 16;
    let f = fs::OpenOptions::new().write(true).open(&entry).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0xff; 4], at).unwrap();
    drop(f);
    let step = Arc::new(AtomicUsize::new(0));
    let (s, g, c) = (step.clone(), green.clone(), current.clone());
    let options = LoadOptions::default()
        .mode(LoadMode::Stream)
        .progress(move |_, _| {
            if s.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                relink(&g, &c);
            }
            std::ops::ControlFlow::Continue(())
        });
    let (s, b, c) = (step.clone(), blue.clone(), current.clone());
    // `triple()`'s name, version and output, with the flip back.
    let flip_back = Transform::new("scale", 1, move |_, src, dst| {
        if s.compare_exchange(1, 2, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            relink(&b, &c);
        }
        for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
            let x = 3.0 * f32::from_le_bytes(s.try_into().unwrap());
            d.copy_from_slice(&x.to_le_bytes());
        }
        Ok(())
    });
    // SAFETY: each model is written once, before any load.
    let filled = unsafe { cache.load(&current, &flip_back, &options) }.unwrap();
    assert_eq!(
        step.load(Ordering::SeqCst),
        2,
        "the link was not flipped and back"
    );
    drop(filled);
    let hit = load(&cache, &current);
    assert_outcome(&hit, CacheOutcome::Hit);
    assert!(
        holds(hit.weights(), &expected(&blue)),
        "blue's entry holds green's tensors"
    );
}

/// Break 1 in a loop, as a deploy's link flips: 200 fills while a thread
/// flips the link between two models, then a load of each: every load
/// serves the tensors of the model the link leads to.
#[test]
#[cfg(unix)]
fn fills_while_a_link_flips_serve_only_the_keyed_files_tensors() {
    let (dir, blue, green, current, _) = blue_green();
    let (want_blue, want_green) = (expected(&blue), expected(&green));
    let stop = AtomicBool::new(false);
    let mut wrong = 0;
    std::thread::scope(|scope| {
        for round in 0..200 {
            let cache = Cache::at(dir.path().join(format!("cache-{round}")));
            stop.store(false, Ordering::SeqCst);
            let flipper = scope.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    relink(&green, &current);
                    relink(&blue, &current);
                }
            });
            drop(load(&cache, &current));
            stop.store(true, Ordering::SeqCst);
            flipper.join().unwrap();
            for (target, want) in [(&blue, &want_blue), (&green, &want_green)] {
                relink(target, &current);
                if !holds(load(&cache, &current).weights(), want) {
                    wrong += 1;
                }
            }
        }
    });
    assert_eq!(
        wrong, 0,
        "{wrong} of 400 loads served the other model's tensors"
    );
}

/// Break 4: an entry larger than the limit is not written (and nothing
/// else is evicted for it); the load serves the right tensors from memory
/// and says why.
#[test]
fn an_entry_larger_than_the_limit_is_not_written() {
    let (_dir, model, cache) = setup();
    let other = model.with_file_name("other.gguf");
    write_model(&other, 3);
    let kept = load(&cache, &other).report().entry.clone().unwrap();
    let entry_bytes = fs::metadata(&kept).unwrap().len();
    for limit in [entry_bytes / 2, 0] {
        let small = cache.clone().max_size(limit);
        let c = load(&small, &model);
        assert_eq!(
            c.report().outcome.name(),
            "in_memory",
            "limit {limit}: {}",
            c.report()
        );
        let CacheOutcome::InMemory(why) = &c.report().outcome else {
            unreachable!()
        };
        assert_eq!(why.name(), "too_large", "limit {limit}: {why}");
        assert!(
            holds(c.weights(), &expected(&model)),
            "limit {limit}: wrong tensors"
        );
        let listed = small.entries().unwrap();
        assert_eq!(listed.len(), 1, "limit {limit}: {listed:?}");
        assert!(
            kept.exists(),
            "limit {limit}: an entry was evicted for one never written"
        );
    }
}

/// Break 5: a cache path that goes up (`..`) from a step that does not
/// exist yet is refused, and nothing is created where it leads: a
/// directory others may write in. Then the same as another user, where
/// the tests run as root: `nobody` names a path through a missing step
/// of a sticky directory into a third user's 0777 directory.
#[test]
#[cfg(unix)]
fn a_cache_path_through_a_missing_step_is_checked_whole() {
    let base = tempfile::tempdir_in("/tmp").unwrap();
    let open = base.path().join("open");
    fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let through_missing = base.path().join("missing/../open/cache");
    let made = weightmap::cache::ensure_private_dir(&through_missing);
    assert!(made.is_err(), "a path through a missing step was used");
    assert!(
        !open.join("cache").exists(),
        "a directory was made inside a 0777 one"
    );
    let (_dir, model, _) = setup();
    let c = load(&Cache::at(&through_missing), &model);
    assert_eq!(c.report().outcome.name(), "in_memory", "{}", c.report());
    assert!(
        !open.join("cache").exists(),
        "a load filled a 0777 directory"
    );

    if !attacker_available("a_cache_path_through_a_missing_step_is_checked_whole") {
        return;
    }
    chmod(base.path(), 0o1777);
    std::os::unix::fs::chown(&open, Some(4242), Some(4242)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args([
            "--exact",
            "child_makes_a_private_dir",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("WM_CHILD_PRIVATE_DIR", &through_missing)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("child made: refused"), "{text}");
    assert!(
        !open.join("cache").exists(),
        "nobody made a directory in uid 4242's"
    );
}

/// The child of the test above: make the directory it was given.
#[test]
fn child_makes_a_private_dir() {
    let Some(dir) = std::env::var_os("WM_CHILD_PRIVATE_DIR") else {
        return;
    };
    match weightmap::cache::ensure_private_dir(Path::new(&dir)) {
        Ok(()) => println!("child made: made"),
        Err(e) => println!("child made: refused: {e}"),
    }
}
