//! The `weightmap` binary, run as a user would: exit codes, stderr, and the
//! JSON each subcommand prints, on the reference fixtures and on files
//! generated in a temporary directory.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn testdata(name: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("testdata")
        .join(name)
}

fn manifest(name: &str) -> Value {
    let text = std::fs::read_to_string(testdata(&format!("{name}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weightmap"))
        .args(args)
        .output()
        .expect("running the weightmap binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Run, expect exit 0, parse stdout as JSON.
fn run_json(args: &[&str]) -> Value {
    let o = run(args);
    assert_eq!(o.status.code(), Some(0), "{args:?}: stderr {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", stdout(&o)))
}

/// Expect exit 1 and exactly one line on stderr, starting `error: `.
fn assert_fails(args: &[&str]) -> String {
    let o = run(args);
    assert_eq!(o.status.code(), Some(1), "{args:?}: stdout {}", stdout(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{args:?}: stderr {err:?}");
    assert!(err.starts_with("error: "), "{args:?}: stderr {err:?}");
    err
}

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Write `file`'s data to storage, so that eviction can drop its pages
/// (opened for writing: Windows flushes only such a handle).
fn sync(file: &Path) {
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.sync_all().unwrap();
}

/// Whether this system reports page faults and memory from procfs (the
/// figures are null elsewhere).
const PROCFS: bool = cfg!(any(target_os = "linux", target_os = "android"));

/// Whether the memory figures the command reports are its own: on Linux or
/// Android under the kernel of its own architecture. Under a user-mode
/// emulator (qemu-user, whose kernel `/proc/sys/kernel/arch` names another
/// architecture) `/proc/self/status` counts the emulator's memory too: its
/// translated code and its own heap, megabytes of anonymous memory.
/// Prints why when it returns false.
fn own_memory_figures(test: &str) -> bool {
    if !PROCFS {
        return false;
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/arch").unwrap_or_default();
    let (kernel, ours) = (kernel.trim(), std::env::consts::ARCH);
    if kernel.is_empty() || kernel == ours || (ours == "arm" && kernel.starts_with("arm")) {
        return true;
    }
    eprintln!("{test}: RssAnon assertions skipped: an {ours} program under a {kernel} kernel is emulated, and the emulator's memory is counted with it");
    false
}

/// Whether this platform can drop `file` from the page cache (`--evict`,
/// `bench --cold`); `false` where `weightmap::evict` says `Unsupported`
/// (Windows, macOS).
fn evicts(file: &Path) -> bool {
    match weightmap::evict(file) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => false,
        Err(e) => panic!("evicting {}: {e}", file.display()),
    }
}

#[test]
fn inspect_json_tiny_llama_matches_the_manifest() {
    let m = manifest("tiny-llama.gguf");
    let v = run_json(&["inspect", p(&testdata("tiny-llama.gguf")), "--json"]);
    assert_eq!(
        keys(&v),
        BTreeSet::from([
            "format",
            "version",
            "alignment",
            "data_offset",
            "file_size",
            "metadata",
            "tensors"
        ])
    );
    assert_eq!(v["format"], "gguf");
    assert_eq!(v["version"], m["version"]);
    assert_eq!(v["alignment"], m["alignment"]);
    assert_eq!(v["data_offset"], m["data_start"]);
    assert_eq!(v["file_size"], m["file_size"]);

    let md = v["metadata"].as_object().unwrap();
    assert_eq!(md.len() as u64, m["kv_count"].as_u64().unwrap());
    assert_eq!(md["general.architecture"], "llama");
    assert_eq!(md["llama.block_count"], 1);
    assert_eq!(
        md["weightmap.test.u64"],
        m["metadata"]["weightmap.test.u64"]["value"]
    );
    assert_eq!(
        md["weightmap.test.i64"],
        m["metadata"]["weightmap.test.i64"]["value"]
    );
    assert_eq!(
        md["weightmap.test.utf8"],
        m["metadata"]["weightmap.test.utf8"]["value"]
    );
    assert_eq!(
        md["llama.attention.layer_norm_rms_epsilon"],
        m["metadata"]["llama.attention.layer_norm_rms_epsilon"]["value"]
    );
    assert_eq!(md["weightmap.test.bool_false"], false);
    assert_eq!(
        md["tokenizer.ggml.tokens"],
        serde_json::json!({"type": "array", "elem_type": "string", "len": 300})
    );
    assert_eq!(md["tokenizer.ggml.scores"]["elem_type"], "f32");

    let tensors = v["tensors"].as_array().unwrap();
    let mt = m["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), mt.len());
    for (t, want) in tensors.iter().zip(mt) {
        assert_eq!(
            keys(t),
            BTreeSet::from(["name", "type", "type_id", "shape", "offset", "nbytes"])
        );
        assert_eq!(t["name"], want["name"]);
        assert_eq!(t["type_id"], want["ggml_type_id"]);
        assert_eq!(
            t["type"].as_str().unwrap(),
            want["ggml_type"].as_str().unwrap().to_lowercase()
        );
        assert_eq!(t["shape"], want["shape"]);
        assert_eq!(t["offset"], want["offset"]);
        assert_eq!(t["nbytes"], want["nbytes"]);
    }
}

#[test]
fn inspect_full_prints_array_elements() {
    let v = run_json(&[
        "inspect",
        p(&testdata("tiny-llama.gguf")),
        "--json",
        "--full",
    ]);
    let tokens = &v["metadata"]["tokenizer.ggml.tokens"];
    assert_eq!(tokens["len"], 300);
    let values = tokens["values"].as_array().unwrap();
    assert_eq!(values.len(), 300);
    let m = manifest("tiny-llama.gguf");
    assert_eq!(
        tokens["values"],
        m["metadata"]["tokenizer.ggml.tokens"]["value"]
    );
}

#[test]
fn inspect_safetensors_json() {
    let m = manifest("tiny.safetensors");
    let v = run_json(&["inspect", p(&testdata("tiny.safetensors")), "--json"]);
    assert_eq!(v["format"], "safetensors");
    assert_eq!(v["version"], Value::Null);
    assert_eq!(v["alignment"], 1);
    assert_eq!(v["metadata"], m["metadata"]);
    let t = v["tensors"].as_array().unwrap();
    let u8t = t.iter().find(|t| t["name"] == "u8").unwrap();
    assert_eq!(u8t["type"], "u8");
    assert_eq!(u8t["type_id"], Value::Null, "u8 has no ggml id");
}

#[test]
fn inspect_text_lists_tensors() {
    let o = run(&["inspect", p(&testdata("tiny-llama.gguf"))]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(out.contains("token_embd.weight"), "{out}");
    assert!(out.contains("general.architecture"), "{out}");
    assert!(out.contains("\"llama\""), "{out}");
}

#[test]
fn validate_good_files() {
    for f in [
        "tiny-llama.gguf",
        "quant-types.gguf",
        "empty.gguf",
        "tiny.safetensors",
        "bf16.safetensors",
        "odd-offsets.safetensors",
    ] {
        let o = run(&["validate", p(&testdata(f))]);
        assert_eq!(o.status.code(), Some(0), "{f}: {}", stderr(&o));
        assert!(stdout(&o).starts_with("ok: "), "{f}: {}", stdout(&o));
    }
    let o = run(&["validate", p(&testdata("tiny-llama.gguf"))]);
    assert_eq!(stdout(&o), "ok: gguf, 12 tensors, 473 bytes\n");
}

#[test]
fn validate_notes_a_misaligned_tensor() {
    let o = run(&["validate", p(&testdata("align8.gguf"))]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("ok: gguf, 7 tensors"));
    assert!(
        lines[1].starts_with("note: ") && lines[1].contains("b.f16x5"),
        "{out}"
    );
}

#[test]
fn validate_rejects_corrupt_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(testdata("tiny-llama.gguf")).unwrap();
    // Cut inside the last tensor's bytes.
    let last = &manifest("tiny-llama.gguf")["tensors"][11];
    assert_eq!(last["name"], "test.last");
    let cut = (last["offset"].as_u64().unwrap() + 4) as usize;
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..cut]).unwrap();
    let err = assert_fails(&["validate", p(&truncated)]);
    assert!(
        err.contains("test.last"),
        "names the tensor past the end: {err}"
    );

    let header_cut = dir.path().join("header-cut.gguf");
    std::fs::write(&header_cut, &bytes[..1000]).unwrap();
    assert_fails(&["validate", p(&header_cut)]);

    let garbage = dir.path().join("garbage.bin");
    std::fs::write(&garbage, b"definitely not a model file").unwrap();
    assert_fails(&["validate", p(&garbage)]);

    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert_fails(&["validate", p(&empty)]);

    assert_fails(&["validate", p(&dir.path().join("missing.gguf"))]);
    assert_fails(&["validate", p(dir.path())]);
    assert_fails(&["inspect", p(&truncated), "--json"]);
    assert_fails(&["load", p(&truncated)]);
}

#[test]
fn bad_usage_exits_2() {
    for args in [
        &[][..],
        &["frobnicate"],
        &["validate"],
        &["inspect", "a", "b"],
        &["load", "x", "--mode", "teleport"],
        &["bench", "--iters", "0"],
        &["bench", "x.gguf", "--format", "gguf"],
        &["gen", "out", "--types", "q9_9"],
        &["gen", "out", "--size", "12 parsecs"],
        &["inspect", "x", "--bogus"],
    ] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    assert_eq!(run(&["--help"]).status.code(), Some(0));
}

/// The (name, sha256) pairs of a `load --hashes --json` report.
fn hashes(v: &Value) -> Vec<(String, String)> {
    v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["sha256"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn load_json(file: &Path, mode: &str, extra: &[&str]) -> Value {
    let mut args = vec!["load", p(file), "--mode", mode, "--json"];
    args.extend_from_slice(extra);
    run_json(&args)
}

#[test]
fn load_both_modes_give_the_same_bytes() {
    let f = testdata("quant-types.gguf");
    let m = manifest("quant-types.gguf");
    let mmap = load_json(&f, "mmap", &["--hashes"]);
    let stream = load_json(&f, "stream", &["--hashes"]);
    let required = [
        "format",
        "mode_requested",
        "mode_used",
        "fallback",
        "tensors_count",
        "tensors_mapped",
        "tensors_copied",
        "bytes_mapped",
        "bytes_copied",
        "copied",
        "buffers",
        "load_ms",
        "touch_ms",
        "ready_ms",
        "major_faults",
        "minor_faults",
        "resident_before_pct",
        "resident_after_pct",
        "read",
        "pass_ms",
        "window_bytes",
        "budget_bytes",
        "budget_source",
        "budget_limit",
        "budget_usage",
        "budget_reclaimable",
        "budget_own_cached",
        "prefetch",
        "prefetch_kind",
        "prefetched_bytes",
        "prefetch_reread_bytes",
        "reread_small_folios",
        "residency",
        "residency_kind",
        "random_access_tensors",
        "streamed_tensors",
        "shards",
        "shard_files",
        "warnings",
        "rss_anon_kib",
        "rss_file_kib",
        "vm_hwm_kib",
        "rss_anon_after_touch_kib",
        "rss_file_after_touch_kib",
        "vm_hwm_after_touch_kib",
        "huge_pages",
        "tensors",
    ];
    for v in [&mmap, &stream] {
        assert_eq!(keys(v), BTreeSet::from(required));
        assert_eq!(v["format"], "gguf");
        assert_eq!(v["fallback"], Value::Null);
        assert_eq!(v["tensors_count"], m["tensor_count"]);
        assert!(v["load_ms"].as_f64().unwrap() >= 0.0);
    }
    assert_eq!(
        (&mmap["mode_requested"], &mmap["mode_used"]),
        (&"mmap".into(), &"mmap".into())
    );
    assert_eq!(
        (&stream["mode_requested"], &stream["mode_used"]),
        (&"stream".into(), &"stream".into())
    );
    assert!(mmap["bytes_mapped"].as_u64().unwrap() > 0);
    assert_eq!(mmap["bytes_copied"], 0);
    assert_eq!(stream["bytes_mapped"], 0);
    assert!(stream["bytes_copied"].as_u64().unwrap() > 0);
    // Which buffers the huge-page figures count: the mapping, or the copy.
    let hp = |v: &Value, k: &str| v["huge_pages"][k].as_u64().unwrap();
    assert!(hp(&mmap, "mapped_bytes") >= mmap["bytes_mapped"].as_u64().unwrap());
    assert_eq!(hp(&mmap, "owned_bytes"), 0);
    assert_eq!(hp(&stream, "mapped_bytes"), 0);
    assert!(hp(&stream, "owned_bytes") >= stream["bytes_copied"].as_u64().unwrap());
    let huge = &stream["huge_pages"]["owned_huge_bytes"];
    assert_eq!(huge.is_null(), !PROCFS, "{huge}");
    if PROCFS {
        assert!(mmap["rss_anon_kib"].as_u64().unwrap() > 0);
        assert!(mmap["vm_hwm_kib"].as_u64().unwrap() > 0);
    }

    assert_eq!(hashes(&mmap), hashes(&stream));
    let hashes = mmap["tensors"].as_array().unwrap();
    let mt = m["tensors"].as_array().unwrap();
    assert_eq!(hashes.len(), mt.len());
    for (h, want) in hashes.iter().zip(mt) {
        assert_eq!(h["name"], want["name"]);
        assert_eq!(h["sha256"], want["sha256"], "{}", want["name"]);
    }
    // Without --hashes there is no tensor list.
    assert!(load_json(&f, "mmap", &[]).get("tensors").is_none());
}

#[test]
fn load_misaligned_file_copies_only_what_it_must() {
    let f = testdata("align8.gguf");
    let v = load_json(&f, "mmap", &["--hashes"]);
    assert_eq!(v["mode_requested"], "mmap");
    assert_eq!(v["mode_used"], "mmap");
    assert_eq!(v["fallback"], Value::Null);
    let copied: Vec<&str> = v["copied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(copied.contains(&"b.f16x5"), "{copied:?}");
    let (m, c) = (
        v["tensors_mapped"].as_u64().unwrap(),
        v["tensors_copied"].as_u64().unwrap(),
    );
    assert_eq!(c as usize, copied.len());
    assert_eq!(m + c, v["tensors_count"].as_u64().unwrap());
    assert!(m > 0 && v["bytes_copied"].as_u64().unwrap() > 0);
    for t in v["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let want = if copied.contains(&name) {
            "copied"
        } else {
            "mapped"
        };
        assert_eq!(t["placement"], want, "{name}");
    }
    let stream = load_json(&f, "stream", &["--hashes"]);
    assert_eq!(hashes(&v), hashes(&stream));

    // All or nothing: without fallback that fails naming the tensor; with
    // it, the stream path runs and says why.
    let err = assert_fails(&["load", p(&f), "--no-fallback", "--require-all-mapped"]);
    assert!(err.contains("b.f16x5"), "{err}");
    let v = load_json(&f, "mmap", &["--require-all-mapped"]);
    assert_eq!(v["mode_used"], "stream");
    assert_eq!(v["fallback"]["kind"], "misaligned");
    // The stream path never needed the mapping.
    let v = load_json(&f, "stream", &["--no-fallback"]);
    assert_eq!(v["mode_used"], "stream");
    assert_eq!(v["fallback"], Value::Null);
}

#[test]
fn hybrid_load_grows_anonymous_memory_by_the_copied_bytes_only() {
    // general.alignment = 8: four 8 MiB tensors, each 8 bytes further along
    // than the last (an 8-byte spacer between them), so their addresses
    // take all four residues mod 32 and exactly one is 32-aligned.
    let dir = tempfile::tempdir().unwrap();
    let mut w = weightmap::gguf::Writer::new(8);
    let big = 8 << 20;
    for i in 0..4 {
        w.tensor(
            &format!("big.{i}"),
            weightmap::TensorType::F32,
            &[big / 4],
            vec![i as u8 + 1; big as usize],
        );
        w.tensor(
            &format!("spacer.{i}"),
            weightmap::TensorType::F32,
            &[2],
            vec![9; 8],
        );
    }
    let f = dir.path().join("a8.gguf");
    std::fs::write(&f, w.to_bytes()).unwrap();
    let v = load_json(&f, "mmap", &["--prefetch", "off"]);
    assert_eq!(v["mode_used"], "mmap");
    let copied = v["bytes_copied"].as_u64().unwrap();
    let mapped = v["bytes_mapped"].as_u64().unwrap();
    let names: Vec<&str> = v["copied"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names.iter().filter(|n| n.starts_with("big.")).count(),
        3,
        "{names:?}"
    );
    assert!(mapped >= big && copied >= 3 * big, "{v}");
    if own_memory_figures("hybrid_load_grows_anonymous_memory_by_the_copied_bytes_only") {
        // The copies are owned memory (prefaulted as they are filled); the
        // mapped tensor costs nothing anonymous until touched, and then only
        // file-backed pages.
        let anon = v["rss_anon_kib"].as_u64().unwrap() * 1024;
        assert!(anon >= copied, "RssAnon {anon} < copied {copied}");
        assert!(
            anon < copied + (4 << 20),
            "RssAnon {anon} vs copied {copied}"
        );
    }
    let stream = load_json(&f, "stream", &["--hashes"]);
    let mmap = load_json(&f, "mmap", &["--hashes"]);
    assert_eq!(hashes(&mmap), hashes(&stream));
}

#[test]
fn load_touch_and_evict_report_ready_time_faults_and_residency() {
    // Under the target directory, on a disk filesystem (eviction cannot
    // drop the pages of a RAM filesystem).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = gen_small(dir.path(), "m.gguf", "gguf");
    sync(&f);
    let plain = load_json(&f, "mmap", &[]);
    for k in [
        "touch_ms",
        "ready_ms",
        "resident_before_pct",
        "rss_anon_after_touch_kib",
    ] {
        assert!(plain[k].is_null(), "{k} without --touch/--evict");
    }
    if PROCFS {
        assert!(plain["major_faults"].is_u64() && plain["minor_faults"].is_u64());
    }
    assert_eq!(plain["prefetch_kind"], "background");
    assert!(plain["prefetch"]
        .as_str()
        .unwrap()
        .starts_with("background"));

    let evict: &[&str] = if evicts(&f) { &["--evict"] } else { &[] };
    for mode in ["mmap", "stream"] {
        let v = load_json(&f, mode, &[&["--touch"], evict].concat());
        let (load, touch, ready) = (
            v["load_ms"].as_f64().unwrap(),
            v["touch_ms"].as_f64().unwrap(),
            v["ready_ms"].as_f64().unwrap(),
        );
        assert!((ready - (load + touch)).abs() < 0.01, "{v}");
        if !evict.is_empty() {
            assert!(v["resident_before_pct"].as_f64().unwrap() < 10.0, "{v}");
        }
        if PROCFS {
            assert!(v["major_faults"].is_u64() && v["minor_faults"].is_u64());
            assert!(v["rss_anon_after_touch_kib"].is_u64());
        }
    }
    if evict.is_empty() {
        // A platform that cannot evict says so, and loads nothing.
        let err = assert_fails(&["load", p(&f), "--touch", "--evict"]);
        assert!(err.contains("need a platform that can"), "{err}");
    }
    let stream = load_json(&f, "stream", &["--touch"]);
    assert_eq!(stream["prefetch_kind"], "not_mapped");
    // A model that fits keeps every tensor resident, either way.
    assert_eq!(plain["residency_kind"], "fits");
    assert_eq!(stream["residency_kind"], "fits");
    let random = load_json(&f, "mmap", &["--advice", "random", "--prefetch", "off"]);
    assert_eq!(random["prefetch"], "off");

    let o = run(&[&["load", p(&f), "--touch"], evict].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for label in [
        "touch time:",
        "ready time:",
        "major faults:",
        "resident before:",
        "prefetch:",
    ] {
        assert!(out.contains(label), "{label}: {out}");
    }
}

#[test]
fn load_text_output() {
    let o = run(&["load", p(&testdata("tiny.safetensors")), "--hashes"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("mode:") && out.contains("f32.matrix"), "{out}");
}

fn gen_small(dir: &Path, name: &str, format: &str) -> PathBuf {
    let out = dir.join(name);
    let o = run(&[
        "gen",
        p(&out),
        "--format",
        format,
        "--size",
        "4M",
        "--tensors",
        "23",
        "--vocab",
        "300",
        "--types",
        "F32,q8_0,Q4_k",
        "--alignment",
        "64",
        "--seed",
        "42",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("wrote "), "{}", stdout(&o));
    assert!(
        stderr(&o).is_empty(),
        "no progress when stderr is not a terminal: {}",
        stderr(&o)
    );
    out
}

#[test]
fn gen_then_inspect_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let f = gen_small(dir.path(), "m.gguf", "gguf");
    let v = run_json(&["inspect", p(&f), "--json"]);
    assert_eq!(v["format"], "gguf");
    assert_eq!(v["version"], 3);
    assert_eq!(v["alignment"], 64);
    let md = &v["metadata"];
    assert_eq!(md["general.architecture"], "llama");
    assert_eq!(md["general.alignment"], 64);
    assert_eq!(md["tokenizer.ggml.tokens"]["len"], 300);
    assert_eq!(md["tokenizer.ggml.token_type"]["elem_type"], "i32");
    assert!(md["llama.rope.freq_base"].is_f64());
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 23);
    assert_eq!(tensors[0]["name"], "token_embd.weight");
    assert_eq!(tensors[0]["shape"][1], 300);
    let types: BTreeSet<&str> = tensors
        .iter()
        .map(|t| t["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, BTreeSet::from(["f32", "q8_0", "q4_K"]));
    let total: u64 = tensors.iter().map(|t| t["nbytes"].as_u64().unwrap()).sum();
    // Within 10% of --size.
    assert!(total.abs_diff(4 << 20) < (4 << 20) / 10, "total {total}");
    for t in tensors {
        assert_eq!(t["offset"].as_u64().unwrap() % 64, 0);
    }
    assert_eq!(run(&["validate", p(&f)]).status.code(), Some(0));

    // Same seed, same file; the generated file loads identically both ways.
    let again = gen_small(dir.path(), "again.gguf", "gguf");
    assert!(std::fs::read(&f).unwrap() == std::fs::read(&again).unwrap());
    let a = load_json(&f, "mmap", &["--hashes", "--no-fallback"]);
    let b = load_json(&f, "stream", &["--hashes"]);
    assert_eq!(a["mode_used"], "mmap");
    assert_eq!(hashes(&a), hashes(&b));
    assert!(a["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["placement"] == "mapped"));
    assert!(b["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["placement"] == "copied"));
}

#[test]
fn gen_then_inspect_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let f = gen_small(dir.path(), "m.safetensors", "safetensors");
    let v = run_json(&["inspect", p(&f), "--json"]);
    assert_eq!(v["format"], "safetensors");
    assert_eq!(v["version"], Value::Null);
    assert_eq!(v["metadata"]["vocab_size"], "300");
    assert_eq!(v["metadata"]["format"], "pt");
    assert_eq!(v["data_offset"].as_u64().unwrap() % 64, 0);
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 23);
    let embed = tensors
        .iter()
        .find(|t| t["name"] == "model.embed_tokens.weight")
        .unwrap();
    assert_eq!(embed["shape"][0], 300);
    let types: BTreeSet<&str> = tensors
        .iter()
        .map(|t| t["type"].as_str().unwrap())
        .collect();
    // Quantized types have no safetensors dtype: they are written as f16.
    assert_eq!(types, BTreeSet::from(["f32", "f16"]));
    assert_eq!(run(&["validate", p(&f)]).status.code(), Some(0));
}

#[test]
fn gen_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    // Not a power of two: the library's error, exit 1.
    let err = assert_fails(&["gen", p(&out), "--alignment", "48", "--size", "1K"]);
    assert!(err.contains("48"), "{err}");
    assert!(!out.exists());
    // A directory that does not exist.
    assert_fails(&[
        "gen",
        p(&dir.path().join("no/such/dir/x.gguf")),
        "--size",
        "1K",
    ]);
}

#[test]
fn bench_reports_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let f = gen_small(dir.path(), "m.gguf", "gguf");
    let v = run_json(&["bench", p(&f), "--iters", "1", "--warmup", "0", "--json"]);
    assert_eq!(v["identical_bytes"], true);
    assert_eq!(v["tensors_compared"], 23);
    assert_eq!(v["page_cache"], "warm");
    assert_eq!(v["iters"], 1);
    let modes = ["mmap", "mmap-random", "mmap-normal", "stream", "baseline"];
    assert_eq!(v["order"], serde_json::json!(modes));
    for mode in modes {
        let m = &v["modes"][mode];
        for k in ["load_ms", "ready_ms"] {
            assert_eq!(m[k]["samples"].as_array().unwrap().len(), 1, "{mode} {k}");
            assert!(m[k]["median"].is_number(), "{mode} {k}");
        }
        if PROCFS {
            assert!(m["peak_rss_anon_after_touch_kib"].is_u64(), "{mode}");
        }
    }
    assert_eq!(v["modes"]["mmap"]["bytes_copied"], 0);
    assert_eq!(v["modes"]["mmap-random"]["prefetch"], "off");
    for r in ["mmap_over_stream_ready", "mmap_over_best_advice_ready"] {
        assert!(v["ratios"][r].is_number(), "{r}");
    }

    // Cold: every run evicts first; two modes only.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = gen_small(dir.path(), "m.gguf", "gguf");
    sync(&f);
    let cold = [
        "bench",
        p(&f),
        "--iters",
        "1",
        "--warmup",
        "0",
        "--json",
        "--cold",
        "--modes",
        "mmap,stream",
    ];
    if !evicts(&f) {
        // A platform that cannot evict refuses --cold before any run.
        let err = assert_fails(&cold);
        assert!(err.contains("--cold"), "{err}");
        return;
    }
    let v = run_json(&cold);
    assert_eq!(v["page_cache"], "cold");
    assert_eq!(v["order"], serde_json::json!(["mmap", "stream"]));
    assert!(
        v["modes"]["mmap"]["resident_before_pct_max"]
            .as_f64()
            .unwrap()
            < 10.0,
        "{v}"
    );
    assert_eq!(v["identical_bytes"], true);

    // A file with misaligned tensors: bench runs, the mapped mode copies
    // just those, and the bytes agree.
    let v = run_json(&[
        "bench",
        p(&testdata("align8.gguf")),
        "--iters",
        "1",
        "--warmup",
        "0",
        "--json",
    ]);
    assert_eq!(v["modes"]["mmap"]["mode_used"], "mmap");
    assert!(v["modes"]["mmap"]["bytes_copied"].as_u64().unwrap() > 0);
    assert_eq!(v["modes"]["mmap"]["fallback"], Value::Null);
    assert_eq!(v["identical_bytes"], true);
}

/// Slow (writes the 512 MiB default model twice over the run): run with
/// `cargo test --release --test cli -- --ignored`.
#[test]
#[ignore]
fn bench_generates_then_reuses_the_default_model() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let bench = || {
        Command::new(env!("CARGO_BIN_EXE_weightmap"))
            .args([
                "bench",
                "--iters",
                "1",
                "--warmup",
                "0",
                "--json",
                "--format",
                "safetensors",
            ])
            .env("WEIGHTMAP_CACHE", &cache)
            .output()
            .unwrap()
    };
    let first = bench();
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert!(stderr(&first).contains("generating"), "{}", stderr(&first));
    let v: Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(v["generated"], true);
    assert_eq!(v["format"], "safetensors");
    assert_eq!(v["tensors_count"], 300);
    assert_eq!(v["identical_bytes"], true);
    let file = PathBuf::from(v["file"].as_str().unwrap());
    assert!(file.starts_with(&cache), "{}", file.display());

    let second = bench();
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("using the cached"),
        "{}",
        stderr(&second)
    );

    // A cached file of the wrong size is regenerated.
    std::fs::write(&file, b"stale").unwrap();
    let third = bench();
    assert_eq!(third.status.code(), Some(0), "{}", stderr(&third));
    assert!(stderr(&third).contains("generating"), "{}", stderr(&third));
}

/// Run `args` under a pseudo-terminal (util-linux `script`), so stderr is a
/// terminal; `None`, with a visible note, where `script` is missing.
fn run_in_pty(args: &[&str]) -> Option<String> {
    let mut cmd = String::from(env!("CARGO_BIN_EXE_weightmap"));
    for a in args {
        cmd.push(' ');
        cmd.push_str(a);
    }
    match Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
    {
        Ok(o) => {
            assert!(o.status.success(), "{cmd}: {}", stderr(&o));
            Some(String::from_utf8_lossy(&o.stdout).into_owned())
        }
        Err(e) => {
            eprintln!("SKIPPED progress-bar test: no `script` to make a pseudo-terminal ({e})");
            None
        }
    }
}

#[test]
fn progress_bars_show_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("m.gguf");
    let fs = f.to_str().unwrap();
    let Some(out) = run_in_pty(&[
        "gen",
        fs,
        "--size",
        "24M",
        "--vocab",
        "1000",
        "--tensors",
        "30",
    ]) else {
        return;
    };
    assert!(out.contains("gen: [") && out.contains("MiB"), "{out}");
    assert!(out.contains("wrote "), "{out}");
    let out = run_in_pty(&["load", fs, "--mode", "stream", "--direct-io", "off"]).unwrap();
    assert!(out.contains("load: [") && out.contains("mode:"), "{out}");
    // Not a terminal: no bar (gen_small checks gen's stderr is empty).
    let o = run(&["load", fs, "--mode", "stream"]);
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
}

#[test]
fn gen_shards_writes_split_models_that_load_like_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let gen = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "gen",
            p(out),
            "--size",
            "4M",
            "--vocab",
            "300",
            "--tensors",
            "21",
        ];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    gen(&dir.path().join("whole.gguf"), &[]);
    let out = gen(&dir.path().join("m.gguf"), &["--shards", "3"]);
    assert!(out.starts_with("wrote 3 files"), "{out}");
    let whole = load_json(&dir.path().join("whole.gguf"), "mmap", &["--hashes"]);
    for shard in 1..=3 {
        let f = dir.path().join(format!("m-0000{shard}-of-00003.gguf"));
        let v = load_json(&f, "mmap", &["--hashes"]);
        assert_eq!(v["shards"], 3);
        assert_eq!(v["shard_files"].as_array().unwrap().len(), 3);
        assert_eq!(hashes(&v), hashes(&whole));
    }
    // inspect and validate take any shard; validate --ggml checks each.
    let f = dir.path().join("m-00002-of-00003.gguf");
    let o = run(&["validate", p(&f), "--ggml"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).starts_with("ok: gguf, 3 files, 21 tensors"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        stdout(&o).matches("llama.cpp would load this file").count(),
        3
    );
    let v = run_json(&["inspect", p(&f), "--json"]);
    assert_eq!(v["shards_count"], 3);

    // Sharded safetensors with an index, loaded from the index or the directory.
    let sdir = dir.path().join("st");
    std::fs::create_dir(&sdir).unwrap();
    let out = gen(
        &sdir.join("model.safetensors"),
        &["--format", "safetensors", "--shards", "2"],
    );
    assert!(out.contains("model.safetensors.index.json"), "{out}");
    let st_whole = dir.path().join("whole.safetensors");
    gen(&st_whole, &["--format", "safetensors"]);
    let a = load_json(&sdir, "mmap", &["--hashes"]);
    let b = load_json(
        &sdir.join("model.safetensors.index.json"),
        "stream",
        &["--hashes"],
    );
    let c = load_json(&st_whole, "mmap", &["--hashes"]);
    assert_eq!(a["shards"], 2);
    assert_eq!(hashes(&a), hashes(&c));
    assert_eq!(hashes(&b), hashes(&c));
}

/// The read() baseline bench holds the stream path to reads every file of
/// a sharded model, as `load` does, not only the one named.
#[test]
fn read_baseline_reads_every_file_of_a_model() {
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    let dir = testdata("shards");
    let split: u64 = (1..=3)
        .map(|i| size(&dir.join(format!("split-{i:05}-of-00003.gguf"))))
        .sum();
    let hf: u64 = (1..=2)
        .map(|i| size(&dir.join(format!("hf/model-{i:05}-of-00002.safetensors"))))
        .sum();
    let second = dir.join("split-00002-of-00003.gguf");
    let index = dir.join("hf/model.safetensors.index.json");
    let single = testdata("tiny-llama.gguf");
    for (path, bytes) in [
        (second.as_path(), split),
        (index.as_path(), hf),
        (dir.join("hf").as_path(), hf),
        (single.as_path(), size(&single)),
    ] {
        let v = run_json(&["read-baseline", p(path), "--json", "--touch"]);
        assert_eq!(v["bytes"], bytes, "{}", path.display());
        assert!(v["ready_ms"].as_f64().unwrap() >= v["load_ms"].as_f64().unwrap());
    }
}

/// `gen --arch gemma3`: attention wider than the embedding, so that a
/// runtime assuming n_head × head_dim = n_embd is caught; the file loads.
#[test]
fn gen_arch_gemma3_has_attention_wider_than_the_embedding() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("g.gguf");
    // token_embd, two blocks of 13, output_norm.
    let o = run(&[
        "gen",
        p(&f),
        "--arch",
        "gemma3",
        "--size",
        "4M",
        "--tensors",
        "28",
        "--vocab",
        "300",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = run_json(&["inspect", p(&f), "--json"]);
    let md = &v["metadata"];
    assert_eq!(md["general.architecture"], "gemma3");
    assert_eq!(md["gemma3.block_count"], 2);
    let n_embd = md["gemma3.embedding_length"].as_u64().unwrap();
    let heads = md["gemma3.attention.head_count"].as_u64().unwrap();
    let head_dim = md["gemma3.attention.key_length"].as_u64().unwrap();
    assert_ne!(heads * head_dim, n_embd);
    let tensors = v["tensors"].as_array().unwrap();
    let shape = |name: &str| {
        let t = tensors
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"));
        t["shape"].clone()
    };
    // ggml order: [n_embd, rows]; the rows are the heads' width, not n_embd.
    let q = shape("blk.0.attn_q.weight");
    assert_eq!(q[0], n_embd);
    assert_ne!(q[1], n_embd);
    assert_eq!(q[1], heads * head_dim);
    assert_eq!(shape("blk.1.attn_output.weight")[0], heads * head_dim);
    assert_eq!(shape("blk.1.attn_q_norm.weight")[0], head_dim);
    assert!(tensors.iter().all(|t| t["name"] != "output.weight"), "tied");
    let loaded = load_json(&f, "mmap", &["--hashes"]);
    assert_eq!(loaded["tensors"].as_array().unwrap().len(), 28);
    assert_eq!(run(&["validate", p(&f)]).status.code(), Some(0));
}

#[test]
fn load_refuses_a_copy_over_the_budget_with_exit_1_and_says_budget() {
    let f = testdata("tiny-llama.gguf");
    let err = assert_fails(&["load", p(&f), "--mode", "stream", "--budget", "16"]);
    assert!(err.contains("over the memory budget of 16 bytes"), "{err}");
    assert!(err.contains("--ignore-budget"), "{err}");
    let v = run_json(&[
        "load",
        p(&f),
        "--mode",
        "stream",
        "--budget",
        "16",
        "--ignore-budget",
        "--json",
    ]);
    assert_eq!(v["budget_bytes"], 16);
    assert_eq!(v["budget_source"], "LoadOptions::budget");
    assert_eq!(v["mode_used"], "stream");
}

#[test]
fn load_json_reports_the_budget_it_read() {
    let f = testdata("tiny-llama.gguf");
    let v = run_json(&["load", p(&f), "--json"]);
    assert!(v["budget_bytes"].as_u64().is_some_and(|b| b > 0), "{v}");
    let source = v["budget_source"].as_str().unwrap();
    if cfg!(windows) {
        assert!(
            source == "GlobalMemoryStatusEx ullAvailPhys" || source.starts_with("job object "),
            "{source}"
        );
    } else if PROCFS {
        assert!(
            source == "MemAvailable" || source.starts_with("cgroup v"),
            "{source}"
        );
    }
}

#[test]
fn load_takes_its_budget_from_weightmap_budget_unless_its_options_give_one() {
    let f = testdata("tiny-llama.gguf");
    let with_var = |value: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_weightmap"))
            .args(["load", p(&f)])
            .args(args)
            .env("WEIGHTMAP_BUDGET", value)
            .output()
            .expect("running the weightmap binary")
    };
    let o = with_var("16", &["--mode", "stream"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("over the memory budget of 16 bytes"),
        "{}",
        stderr(&o)
    );
    let v: Value = serde_json::from_slice(&with_var("1K", &["--json"]).stdout).unwrap();
    assert_eq!(v["budget_bytes"], 1024);
    assert_eq!(v["budget_source"], "WEIGHTMAP_BUDGET");
    assert_eq!(v["residency_kind"], "stream_all", "{v}");
    // The options' budget wins over the variable's.
    let v: Value =
        serde_json::from_slice(&with_var("16", &["--budget", "1G", "--json"]).stdout).unwrap();
    assert_eq!(v["budget_source"], "LoadOptions::budget");
    // A variable that is not a byte count is reported, not replaced by the
    // system's figure without a word.
    let v: Value = serde_json::from_slice(&with_var("lots", &["--json"]).stdout).unwrap();
    assert_eq!(v["budget_bytes"], Value::Null);
    let source = v["budget_source"].as_str().unwrap();
    assert!(
        source.starts_with("unreadable: $WEIGHTMAP_BUDGET: 'lots'"),
        "{source}"
    );
}

#[test]
fn load_pass_reads_every_tensor_through_the_window_it_reports() {
    let f = testdata("tiny-llama.gguf");
    let v = run_json(&[
        "load",
        p(&f),
        "--pass",
        "--window",
        "1M",
        "--hashes",
        "--json",
    ]);
    assert!(v["pass_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{v}");
    assert_eq!(v["window_bytes"], 1 << 20);
    // The hashes, read through the pass, are those of the stream path.
    let s = run_json(&["load", p(&f), "--mode", "stream", "--hashes", "--json"]);
    let hashes = |v: &Value| -> Vec<(String, String)> {
        v["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["name"].to_string(), t["sha256"].to_string()))
            .collect()
    };
    assert_eq!(hashes(&v), hashes(&s));
    let plain = run_json(&["load", p(&f), "--json"]);
    assert_eq!(plain["pass_ms"], Value::Null);
    assert_eq!(plain["window_bytes"], Value::Null);
}
