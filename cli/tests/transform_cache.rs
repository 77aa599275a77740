//! `weightmap cache ls|verify|prune|clear` on caches the library filled:
//! listing (text and JSON), a flipped byte found by verify and named,
//! least-recently-used and stale entries pruned, clear, and the directory
//! taken from the environment; files that are not entries by their
//! contents (a model named like one, FIFOs) left alone, a size limit that
//! is not a byte count, and a directory other users could write refused.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use weightmap::cache::{parse_size, Cache, CacheBypass, Transform};
use weightmap::{gguf::Writer, Header, LoadOptions, TensorType};

/// F32 elements of the large tensor: 64 KiB, more than both 4 KiB ends a
/// load samples, so a byte in its middle only verify sees.
const BIG: usize = 16 * 1024;

/// A model with a 64 KiB F32 tensor and a small one; `seed` varies them.
fn write_model(path: &Path, seed: u8) {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    let big: Vec<u8> = (0..BIG)
        .flat_map(|i| (i as f32 + f32::from(seed)).to_le_bytes())
        .collect();
    w.tensor("big.weight", TensorType::F32, &[BIG as u64], big);
    let small = (1.0 + f32::from(seed)).to_le_bytes().repeat(4);
    w.tensor("small.weight", TensorType::F32, &[4], small);
    w.write_with(fs::File::create(path).unwrap(), |_, _| {})
        .unwrap();
}

/// Doubles every F32 element.
fn double() -> Transform<'static> {
    Transform::new("double", 1, |_, src, dst| {
        for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
            let x = 2.0 * f32::from_le_bytes(s.try_into().unwrap());
            d.copy_from_slice(&x.to_le_bytes());
        }
        Ok(())
    })
}

/// Fill `cache_dir` with the transform of `model`; the entry's path.
fn fill(cache_dir: &Path, model: &Path) -> PathBuf {
    let cache = Cache::at(cache_dir);
    // SAFETY: the test's files are its own; nothing changes them while the
    // weights live.
    let cached = unsafe { cache.load(model, &double(), &LoadOptions::default()) }.unwrap();
    cached.report().entry.clone().expect("an entry was written")
}

/// A model `name` (seeded `seed`) in `dir`, and its entry in `cache_dir`.
fn model_and_entry(dir: &Path, name: &str, seed: u8, cache_dir: &Path) -> (PathBuf, PathBuf) {
    let model = dir.join(name);
    write_model(&model, seed);
    let entry = fill(cache_dir, &model);
    (model, entry)
}

/// Set when `entry` was last used, `secs_ago` seconds ago.
fn used_ago(entry: &Path, secs_ago: u64) {
    let f = fs::File::options().write(true).open(entry).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(secs_ago))
        .unwrap();
}

fn cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weightmap"));
    c.args(args).env_remove("WEIGHTMAP_CACHE_MAX_SIZE");
    c
}

fn run(args: &[&str]) -> Output {
    cmd(args).output().expect("running the weightmap binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Run `cache ACTION --dir DIR EXTRA...`, expect exit `code`.
fn cache(action: &str, dir: &Path, extra: &[&str], code: i32) -> Output {
    let mut args = vec!["cache", action, "--dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert_eq!(
        o.status.code(),
        Some(code),
        "{args:?}: stdout {} stderr {}",
        stdout(&o),
        stderr(&o)
    );
    o
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

fn name(path: &Path) -> &str {
    path.file_name().unwrap().to_str().unwrap()
}

/// Flip one byte at `offset`, written as a new file renamed over the old
/// (as a bad disk or a stray writer leaves it), not through a mapping.
fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x40;
    let tmp = path.with_extension("flip");
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, path).unwrap();
}

#[test]
fn ls_lists_an_entry_and_verify_names_a_flipped_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let (model, entry) = model_and_entry(tmp.path(), "model.gguf", 0, &dir);
    let bytes = fs::metadata(&entry).unwrap().len();

    let text = stdout(&cache("ls", &dir, &[], 0));
    assert!(text.starts_with("ENTRY"), "{text}");
    let row = text.lines().find(|l| l.contains(name(&entry))).unwrap();
    assert!(row.contains(&bytes.to_string()), "{row}");
    assert!(row.contains("double@1"), "{row}");
    assert!(row.contains(model.to_str().unwrap()), "{row}");
    assert!(!row.contains("stale"), "{row}");
    let total = text.lines().last().unwrap();
    assert!(total.starts_with("total: 1 entry, "), "{total}");
    assert!(total.contains("17179869184 (16.0 GiB) limit"), "{total}");

    let listed = json(&cache("ls", &dir, &["--json"], 0));
    let e = &listed.as_array().unwrap()[..];
    assert_eq!(e.len(), 1);
    let e = &e[0];
    assert_eq!(e["path"], entry.to_str().unwrap());
    assert_eq!(e["key"], entry.file_stem().unwrap().to_str().unwrap());
    assert_eq!(e["bytes"], bytes);
    assert!(e["last_used"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(e["transform"], "double");
    assert_eq!(e["transform_version"], 1);
    assert_eq!(e["tensors"], 2);
    assert_eq!(
        e["source"],
        std::path::absolute(&model).unwrap().to_str().unwrap()
    );
    assert_eq!(e["stale"], false);
    assert!(e["error"].is_null());

    let good = cache("verify", &dir, &[], 0);
    let text = stdout(&good);
    assert!(text.contains(&format!("ok   {}", name(&entry))), "{text}");
    assert!(text.contains("1 entry: 1 ok, 0 bad"), "{text}");
    assert!(stderr(&good).is_empty());

    // In the middle of the big tensor, where no load looks.
    let at = Header::read(&entry)
        .unwrap()
        .tensors()
        .find("big.weight")
        .unwrap()
        .file_offset
        + (BIG * 4 / 2) as u64;
    flip_byte(&entry, at);
    let bad = cache("verify", &dir, &["--keep-bad"], 1);
    let text = stdout(&bad);
    let line = text.lines().find(|l| l.starts_with("BAD")).unwrap();
    assert!(line.contains(name(&entry)), "{line}");
    assert!(line.contains("big.weight"), "{line}");
    assert!(text.contains("1 entry: 0 ok, 1 bad"), "{text}");
    let err = stderr(&bad);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: 1 of 1 cache entries are bad: "),
        "{err}"
    );
    assert!(
        err.contains(name(&entry)) && err.contains("big.weight"),
        "{err}"
    );

    assert!(entry.exists(), "--keep-bad removed it");

    // Without --keep-bad the bad entry goes, and the next load rebuilds it.
    let verdicts = json(&cache("verify", &dir, &["--json"], 1));
    let v = &verdicts[0];
    assert_eq!(v["path"], entry.to_str().unwrap());
    assert_eq!(v["ok"], false);
    assert_eq!(v["removed"], true);
    assert!(v["error"].as_str().unwrap().contains("big.weight"), "{v}");
    assert!(!entry.exists());
    assert_eq!(fill(&dir, &model), entry);
    assert!(stdout(&cache("verify", &dir, &[], 0)).contains("1 entry: 1 ok, 0 bad"));
}

/// Replace the entry at `entry` by a GGUF file that holds its key (so it is
/// still that key's entry by its contents) and one tensor, and no other
/// field: what a hand-made file, or a writer that stopped short of the
/// other fields, leaves under an entry's name.
fn keep_only_the_key(entry: &Path) {
    let header = Header::read(entry).unwrap();
    let md = header.gguf_metadata().unwrap();
    let key = md.get_str("weightmap.cache.key").unwrap().to_owned();
    let mut w = Writer::new(64);
    w.kv_str("weightmap.cache.key", &key);
    w.tensor("w", TensorType::F32, &[4], 1.0f32.to_le_bytes().repeat(4));
    let tmp = entry.with_extension("rewrite");
    w.write_with(fs::File::create(&tmp).unwrap(), |_, _| {})
        .unwrap();
    fs::rename(&tmp, entry).unwrap();
}

#[test]
fn an_entry_whose_header_lacks_a_field_is_listed_unreadable_fails_verify_and_is_pruned() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let (_, good) = model_and_entry(tmp.path(), "model.gguf", 0, &dir);
    let (_, junk) = model_and_entry(tmp.path(), "other.gguf", 1, &dir);
    keep_only_the_key(&junk);
    let junk_len = fs::metadata(&junk).unwrap().len();

    let text = stdout(&cache("ls", &dir, &[], 0));
    let row = text.lines().find(|l| l.contains(name(&junk))).unwrap();
    assert!(row.contains("unreadable: "), "{row}");
    assert!(row.contains("weightmap.cache.source"), "{row}");
    assert!(text.contains("total: 2 entries (1 unreadable)"), "{text}");
    let listed = json(&cache("ls", &dir, &["--json"], 0));
    let junk_json = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == junk.to_str().unwrap())
        .unwrap();
    assert_eq!(junk_json["bytes"], junk_len);
    assert!(junk_json["transform"].is_null() && junk_json["stale"].is_null());
    assert!(junk_json["error"].is_string());

    let o = cache("verify", &dir, &["--keep-bad"], 1);
    assert!(stdout(&o).contains(&format!("ok   {}", name(&good))));
    let err = stderr(&o);
    assert!(
        err.starts_with("error: 1 of 2 cache entries are bad: "),
        "{err}"
    );
    assert!(
        err.contains(name(&junk)) && !err.contains(name(&good)),
        "{err}"
    );

    let report = json(&cache("prune", &dir, &["--json"], 0));
    let removed = report["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 1, "{report}");
    assert_eq!(removed[0]["path"], junk.to_str().unwrap());
    let reason = removed[0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("unreadable: "), "{reason}");
    assert!(!junk.exists() && good.exists());
}

/// A file's bytes, or `None` when it is gone.
fn contents(path: &Path) -> Option<Vec<u8>> {
    fs::read(path).ok()
}

#[test]
fn a_model_named_like_an_entry_is_never_listed_checked_or_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let (model, entry) = model_and_entry(tmp.path(), "model.gguf", 0, &dir);
    // A valid GGUF file with no key: a model kept in the cache's folder.
    let model_there = dir.join(format!("{}.gguf", "0123456789abcdef".repeat(2)));
    write_model(&model_there, 3);
    let before = contents(&model_there);
    assert!(before.is_some());

    let text = stdout(&cache("ls", &dir, &[], 0));
    assert!(!text.contains(name(&model_there)), "{text}");
    assert!(text.contains("total: 1 entry, "), "{text}");
    let listed = json(&cache("ls", &dir, &["--json"], 0));
    let paths: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["path"])
        .collect();
    assert_eq!(paths, [entry.to_str().unwrap()]);

    let text = stdout(&cache("verify", &dir, &[], 0));
    assert!(text.contains("1 entry: 1 ok, 0 bad"), "{text}");
    assert!(!text.contains(name(&model_there)), "{text}");
    assert!(
        contents(&model_there) == before,
        "the model was changed or removed"
    );

    let report = json(&cache("prune", &dir, &["--max-size", "0", "--json"], 0));
    let removed: Vec<&Value> = report["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["path"])
        .collect();
    assert_eq!(removed, [entry.to_str().unwrap()], "{report}");
    assert!(
        contents(&model_there) == before,
        "the model was changed or removed"
    );

    assert_eq!(fill(&dir, &model), entry);
    let report = json(&cache("clear", &dir, &["--json"], 0));
    assert_eq!(report["removed"].as_array().unwrap().len(), 1, "{report}");
    assert!(!entry.exists());
    assert!(
        contents(&model_there) == before,
        "the model was changed or removed"
    );
}

#[test]
fn prune_removes_the_least_recently_used_and_clear_removes_all() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let entries: Vec<PathBuf> = (0..3u8)
        .map(|i| {
            let (_, e) = model_and_entry(tmp.path(), &format!("m{i}.gguf"), i, &dir);
            // m0 used longest ago, m2 last.
            used_ago(&e, 100 - u64::from(i) * 10);
            e
        })
        .collect();
    let one = fs::metadata(&entries[0]).unwrap().len();

    let o = cache("prune", &dir, &["--max-size", &(2 * one).to_string()], 0);
    let text = stdout(&o);
    let removed: Vec<&str> = text.lines().filter(|l| l.starts_with("removed ")).collect();
    assert_eq!(removed.len(), 1, "{text}");
    assert!(removed[0].contains(name(&entries[0])), "{text}");
    assert!(removed[0].contains("least recently used"), "{text}");
    assert!(text.contains("kept 2 entries"), "{text}");
    assert!(!entries[0].exists() && entries[1].exists() && entries[2].exists());

    // Within the limit already: nothing to do.
    let report = json(&cache("prune", &dir, &["--json"], 0));
    assert_eq!(report["removed"].as_array().unwrap().len(), 0);
    assert_eq!(report["kept"], 2);
    assert_eq!(report["kept_bytes"], 2 * one);
    assert_eq!(report["max_size"], 16u64 << 30);
    assert_eq!(report["failed"].as_array().unwrap().len(), 0);

    let report = json(&cache("clear", &dir, &["--json"], 0));
    let removed = report["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 2, "{report}");
    assert!(removed.iter().all(|r| r["bytes"] == one));
    assert_eq!(report["kept"], 0);
    assert!(!entries[1].exists() && !entries[2].exists());
    assert_eq!(
        json(&cache("ls", &dir, &["--json"], 0)),
        Value::Array(vec![])
    );
    let text = stdout(&cache("ls", &dir, &[], 0));
    assert!(text.starts_with("total: 0 entries, 0 B of a "), "{text}");
}

#[test]
fn an_entry_of_a_rewritten_source_is_marked_stale_and_pruned() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let (model, old) = model_and_entry(tmp.path(), "a.gguf", 0, &dir);
    let (_, current) = model_and_entry(tmp.path(), "b.gguf", 1, &dir);
    // New bytes at the same path: the entry can never be used again.
    write_model(&model, 7);

    let text = stdout(&cache("ls", &dir, &[], 0));
    let row = |e: &Path| text.lines().find(|l| l.contains(name(e))).unwrap();
    assert!(row(&old).ends_with("stale"), "{text}");
    assert!(!row(&current).contains("stale"), "{text}");
    assert!(text.contains("total: 2 entries (1 stale)"), "{text}");
    let listed = json(&cache("ls", &dir, &["--json"], 0));
    let stale: Vec<bool> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["stale"].as_bool().unwrap())
        .collect();
    let old_first = old < current;
    assert_eq!(stale, [old_first, !old_first]);

    // The default limit (16 GiB) keeps the current one.
    let report = json(&cache("prune", &dir, &["--json"], 0));
    let removed = report["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 1, "{report}");
    assert_eq!(removed[0]["path"], old.to_str().unwrap());
    assert!(removed[0]["reason"]
        .as_str()
        .unwrap()
        .contains("source changed"));
    assert_eq!(report["kept"], 1);
    assert!(!old.exists() && current.exists());
}

#[test]
fn a_missing_directory_has_nothing_to_list_verify_or_prune() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("never-made");
    let text = stdout(&cache("ls", &dir, &[], 0));
    assert!(text.starts_with("total: 0 entries"), "{text}");
    assert_eq!(
        json(&cache("ls", &dir, &["--json"], 0)),
        Value::Array(vec![])
    );
    assert!(stdout(&cache("verify", &dir, &[], 0)).contains("0 entries: 0 ok, 0 bad"));
    assert_eq!(
        json(&cache("verify", &dir, &["--json"], 0)),
        Value::Array(vec![])
    );
    let report = json(&cache("prune", &dir, &["--json"], 0));
    assert_eq!(report["removed"].as_array().unwrap().len(), 0);
    cache("clear", &dir, &[], 0);
    assert!(!dir.exists(), "listing or pruning made the directory");
}

#[test]
fn the_directory_and_limit_come_from_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let xdg = tmp.path().join("xdg");
    let (_, entry) = model_and_entry(tmp.path(), "model.gguf", 0, &xdg.join("weightmap"));
    let ls = |envs: &[(&str, &PathBuf)]| {
        let mut c = cmd(&["cache", "ls"]);
        c.env_remove("WEIGHTMAP_CACHE_DIR")
            .env("WEIGHTMAP_CACHE_MAX_SIZE", "1M");
        for (k, v) in envs {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    // The user's cache directory: XDG's, or Windows' local application data.
    let base = if cfg!(windows) {
        "LOCALAPPDATA"
    } else {
        "XDG_CACHE_HOME"
    };
    let text = ls(&[(base, &xdg)]);
    assert!(text.contains(name(&entry)), "{text}");
    assert!(text.contains("1048576 (1.0 MiB) limit"), "{text}");
    // WEIGHTMAP_CACHE_DIR comes first.
    let empty = tmp.path().join("empty");
    let text = ls(&[(base, &xdg), ("WEIGHTMAP_CACHE_DIR", &empty)]);
    assert!(text.starts_with("total: 0 entries"), "{text}");
    // --dir comes before both.
    let dir = xdg.join("weightmap");
    let o = cmd(&["cache", "ls", "--dir", dir.to_str().unwrap()])
        .env("WEIGHTMAP_CACHE_DIR", &empty)
        .output()
        .unwrap();
    assert!(stdout(&o).contains(name(&entry)), "{}", stdout(&o));
}

#[test]
fn bad_sizes_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let o = run(&["cache", "prune", "--dir", dir, "--max-size", "12X"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--max-size"), "{}", stderr(&o));
    let o = cmd(&["cache", "prune", "--dir", dir])
        .env("WEIGHTMAP_CACHE_MAX_SIZE", "lots")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.starts_with("error: WEIGHTMAP_CACHE_MAX_SIZE: "),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Make a FIFO at `path`.
#[cfg(unix)]
fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("running mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// [`cache`], failed if it has not ended after 30 s: an open of a FIFO
/// waits for a writer that never comes, and the test would hang instead.
/// Its output goes to files in `scratch`, so that no full pipe stalls it.
#[cfg(unix)]
fn cache_ending(scratch: &Path, action: &str, dir: &Path, extra: &[&str], code: i32) -> Output {
    let mut args = vec!["cache", action, "--dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (out, err) = (scratch.join("stdout"), scratch.join("stderr"));
    let mut child = cmd(&args)
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()
        .expect("running the weightmap binary");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} had not ended after 30 s: it waits on a FIFO");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let o = Output {
        status,
        stdout: fs::read(&out).unwrap(),
        stderr: fs::read(&err).unwrap(),
    };
    assert_eq!(
        o.status.code(),
        Some(code),
        "{args:?}: stdout {} stderr {}",
        stdout(&o),
        stderr(&o)
    );
    o
}

#[cfg(unix)]
#[test]
fn fifos_named_like_entries_or_fills_and_a_fifo_source_are_never_opened() {
    use std::os::unix::fs::FileTypeExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let (model, stale) = model_and_entry(tmp.path(), "model.gguf", 0, &dir);
    let (_, current) = model_and_entry(tmp.path(), "other.gguf", 1, &dir);
    fs::remove_file(&model).unwrap();
    mkfifo(&model);
    let fifos = [
        dir.join(format!("{}.gguf", "0123456789abcdef".repeat(2))),
        dir.join(format!(".tmp-{}-1", "fedcba9876543210".repeat(2))),
    ];
    for f in &fifos {
        mkfifo(f);
    }

    let listed = json(&cache_ending(tmp.path(), "ls", &dir, &["--json"], 0));
    let listed: Vec<(&str, bool)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["stale"].as_bool().unwrap()))
        .collect();
    let mut want = [
        (stale.to_str().unwrap(), true),
        (current.to_str().unwrap(), false),
    ];
    want.sort();
    assert_eq!(listed, want);

    let text = stdout(&cache_ending(tmp.path(), "verify", &dir, &[], 0));
    assert!(text.contains("2 entries: 2 ok, 0 bad"), "{text}");

    let report = json(&cache_ending(tmp.path(), "prune", &dir, &["--json"], 0));
    let removed = report["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 1, "{report}");
    assert_eq!(removed[0]["path"], stale.to_str().unwrap());
    assert_eq!(report["kept"], 1);

    let report = json(&cache_ending(tmp.path(), "clear", &dir, &["--json"], 0));
    let removed = report["removed"].as_array().unwrap();
    assert_eq!(removed.len(), 1, "{report}");
    assert_eq!(removed[0]["path"], current.to_str().unwrap());
    for f in fifos.iter().chain([&model]) {
        let kind = fs::symlink_metadata(f).unwrap().file_type();
        assert!(kind.is_fifo(), "{} was replaced or removed", f.display());
    }
}

#[test]
fn a_limit_that_is_not_a_byte_count_stops_only_a_prune_without_max_size() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let (model, entry) = model_and_entry(tmp.path(), "model.gguf", 0, &dir);
    let why = CacheBypass::InvalidMaxSize {
        value: "lots".into(),
        problem: parse_size("lots").unwrap_err(),
    };
    let run_with_lots = |action: &str, extra: &[&str], code: i32| {
        let mut args = vec!["cache", action, "--dir", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        let o = cmd(&args)
            .env("WEIGHTMAP_CACHE_MAX_SIZE", "lots")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", stderr(&o));
        o
    };

    let o = run_with_lots("ls", &[], 0);
    let text = stdout(&o);
    assert!(text.contains(name(&entry)), "{text}");
    let total = text.lines().last().unwrap();
    assert!(total.starts_with("total: 1 entry, "), "{total}");
    assert!(
        total.contains(&format!(" of an invalid limit ({why}), in ")),
        "{total}"
    );
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let listed = json(&run_with_lots("ls", &["--json"], 0));
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let text = stdout(&run_with_lots("verify", &[], 0));
    assert!(text.contains("1 entry: 1 ok, 0 bad"), "{text}");

    let o = run_with_lots("prune", &[], 1);
    assert_eq!(stderr(&o), format!("error: {why}\n"));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    assert!(entry.exists());

    let report = json(&run_with_lots("prune", &["--max-size", "0", "--json"], 0));
    assert_eq!(report["removed"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["max_size"], 0);
    assert!(!entry.exists());

    assert_eq!(fill(&dir, &model), entry);
    let report = json(&run_with_lots("clear", &["--json"], 0));
    assert_eq!(report["removed"].as_array().unwrap().len(), 1, "{report}");
    assert!(!entry.exists());
}

#[cfg(unix)]
#[test]
fn a_directory_others_can_write_is_refused_and_one_they_can_read_is_made_private() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let (_, entry) = model_and_entry(tmp.path(), "model.gguf", 0, &dir);
    let mode = |d: &Path| fs::metadata(d).unwrap().permissions().mode() & 0o7777;
    let chmod = |d: &Path, m: u32| fs::set_permissions(d, fs::Permissions::from_mode(m)).unwrap();

    chmod(&dir, 0o777);
    for (action, extra) in [
        ("ls", &[][..]),
        ("ls", &["--json"][..]),
        ("verify", &[][..]),
        ("prune", &[][..]),
        ("prune", &["--max-size", "0"][..]),
        ("clear", &[][..]),
    ] {
        let o = cache(action, &dir, extra, 1);
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{action} {extra:?}: {err}");
        assert!(err.starts_with("error: "), "{action} {extra:?}: {err}");
        assert!(
            err.contains("mode 777 lets other users write in it"),
            "{action} {extra:?}: {err}"
        );
        assert!(
            err.contains(dir.to_str().unwrap()),
            "{action} {extra:?}: {err}"
        );
        assert!(stdout(&o).is_empty(), "{action} {extra:?}: {}", stdout(&o));
    }
    assert!(entry.exists());
    assert_eq!(mode(&dir), 0o777, "a refused directory was changed");

    chmod(&dir, 0o755);
    let text = stdout(&cache("ls", &dir, &[], 0));
    assert!(text.contains(name(&entry)), "{text}");
    assert_eq!(mode(&dir), 0o700);
}

/// Break 3 of the second review: two `cache clear` runs at once over 30
/// entries, 10 times. A file the other run removed first is no failure:
/// both exit 0, and between them every entry is reported removed once.
#[test]
fn two_housekeepers_at_once_both_succeed_and_remove_each_entry_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let models: Vec<PathBuf> = (0..30u8)
        .map(|i| {
            let model = tmp.path().join(format!("m{i}.gguf"));
            write_model(&model, i);
            model
        })
        .collect();
    for round in 0..10 {
        for model in &models {
            fill(&dir, model);
        }
        let start = || {
            cmd(&["cache", "clear", "--json", "--dir", dir.to_str().unwrap()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (start(), start());
        let mut removed = 0;
        for child in [a, b] {
            let o = child.wait_with_output().unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "round {round}: {} {}",
                stdout(&o),
                stderr(&o)
            );
            let report = json(&o);
            assert_eq!(
                report["failed"].as_array().unwrap().len(),
                0,
                "round {round}: {report}"
            );
            removed += report["removed"].as_array().unwrap().len();
        }
        // Unix unlinks a name once. Windows (Wine at least) can report a
        // file deleted by both when both delete it at once: every entry is
        // still reported by one of them, and none is left.
        if cfg!(unix) {
            assert_eq!(removed, 30, "round {round}: entries reported removed");
        } else {
            assert!(removed >= 30, "round {round}: {removed} reported removed");
        }
        let left = fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().ends_with(".gguf")
            })
            .count();
        assert_eq!(left, 0, "round {round}: entries left after both");
    }
}
