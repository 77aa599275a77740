//! The memory budget in a real memory cgroup whose page cache is full: a
//! load there plans as a cold start does. Issue 54: the budget took the
//! limit less the usage, page cache included, so after `cat` of an
//! unrelated file (or with the model's own file warm, a restart) the
//! stream path refused a copy that fits and the mapped load planned to
//! stream everything.
//!
//! Needs root and a memory cgroup hierarchy (v1 or v2) it can make a group
//! in; skipped with the reason printed otherwise. Each run is a process put
//! in the group by `sh` before it `exec`s, so this test's own memory stays
//! outside it.
#![cfg(target_os = "linux")]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use weightmap::{gguf::Writer, TensorType};

const MIB: u64 = 1 << 20;
/// The group's limit.
const LIMIT: u64 = 256 * MIB;
/// The model: two 64 MiB F32 tensors, which fit the limit, with little
/// room beside them.
const TENSOR: usize = 64 << 20;
/// The unrelated file read inside the group: most of the limit.
const UNRELATED: u64 = 200 * MIB;

/// A memory cgroup made for one test, removed on drop.
struct Group {
    dir: PathBuf,
    /// The file that sets its limit.
    limit_file: &'static str,
}

impl Group {
    /// A new group limited to `limit` bytes, or why none can be made here.
    fn new(name: &str, limit: u64) -> Result<Group, String> {
        if !is_root() {
            return Err("not root".into());
        }
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2 = Path::new("/sys/fs/cgroup");
        let (dir, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(name), "memory.limit_in_bytes")
        } else if v2.join("cgroup.controllers").exists() {
            // The memory controller must be on for the root's children.
            let _ = fs::write(v2.join("cgroup.subtree_control"), "+memory");
            (v2.join(name), "memory.max")
        } else {
            return Err("no memory cgroup hierarchy mounted at /sys/fs/cgroup".into());
        };
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let group = Group { dir, limit_file };
        fs::write(group.dir.join(limit_file), limit.to_string())
            .map_err(|e| format!("{limit_file}: {e}"))?;
        Ok(group)
    }

    /// Run `args` in the group; its stdout, stderr and whether it succeeded.
    fn run(&self, args: &[&str]) -> (String, String, bool) {
        let procs = self.dir.join("cgroup.procs");
        let out = Command::new("sh")
            .arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(&procs)
            .args(args)
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            out.status.success(),
        )
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Its processes have exited; the kernel may take a moment to see it.
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!(
            "could not remove {} ({})",
            self.dir.display(),
            self.limit_file
        );
    }
}

/// Whether this process's effective uid is 0 (`/proc/self/status`).
fn is_root() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

/// Read `path` through the page cache inside `group`.
fn read_in(group: &Group, path: &Path) {
    let input = format!("if={}", path.display());
    let (_, stderr, ok) = group.run(&["dd", &input, "of=/dev/null", "bs=1M"]);
    assert!(ok, "{stderr}");
}

fn write_model(path: &Path) {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    for (i, name) in ["blk.0.ffn_up.weight", "blk.0.ffn_down.weight"]
        .iter()
        .enumerate()
    {
        let bytes: Vec<u8> = (0..TENSOR / 4)
            .flat_map(|j| ((j + i) as f32).to_le_bytes())
            .collect();
        w.tensor(name, TensorType::F32, &[(TENSOR / 4) as u64], bytes);
    }
    w.write_with(fs::File::create(path).unwrap(), |_, _| {})
        .unwrap();
}

/// One load in `group`, as its JSON (or the error's text, which the test
/// then shows).
fn load(group: &Group, model: &Path, mode: &str, evict: bool) -> Result<Value, String> {
    let bin = env!("CARGO_BIN_EXE_weightmap");
    let model = model.to_str().unwrap();
    let mut args = vec![bin, "load", "--json", "--mode", mode, model];
    if evict {
        args.push("--evict");
    }
    let (stdout, stderr, ok) = group.run(&args);
    if !ok {
        return Err(stderr);
    }
    Ok(serde_json::from_str(&stdout).unwrap())
}

/// What a load decided: the plan, and the stream path's verdict.
fn decisions(group: &Group, model: &Path, evict: bool) -> (String, Result<String, String>) {
    let mapped = load(group, model, "mmap", evict).expect("a mapped load never refuses");
    let streamed = load(group, model, "stream", evict).map(|v| v["mode_used"].to_string());
    (mapped["residency_kind"].to_string(), streamed)
}

/// A scratch directory holding the model, and a group `name` limited to
/// `limit` bytes; `None`, with the reason printed, where no group can be
/// made.
fn setup(name: &str, limit: u64) -> Option<(tempfile::TempDir, Group, PathBuf)> {
    let group = match Group::new(&format!("{name}-{}", std::process::id()), limit) {
        Ok(g) => g,
        Err(why) => {
            eprintln!("skipped: no memory cgroup can be made here ({why})");
            return None;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.gguf");
    write_model(&model);
    Some((dir, group, model))
}

#[test]
fn a_full_page_cache_plans_as_a_cold_start() {
    let Some((dir, group, model)) = setup("weightmap-budget", LIMIT) else {
        return;
    };
    let unrelated = dir.path().join("unrelated.bin");
    fs::write(&unrelated, vec![7u8; UNRELATED as usize]).unwrap();

    let cold = decisions(&group, &model, true);
    assert_eq!(cold.0, "\"fits\"", "{cold:?}");
    assert!(
        cold.1.is_ok(),
        "the stream path refused a cold start: {cold:?}"
    );

    // An unrelated file read inside the group: its pages are charged here,
    // all of them reclaimable.
    weightmap::evict(&unrelated).unwrap();
    read_in(&group, &unrelated);
    let warm = decisions(&group, &model, true);
    assert_eq!(warm, cold, "with an unrelated file in the page cache");
    let v = load(&group, &model, "mmap", true).unwrap();
    assert!(v["budget_reclaimable"].as_u64().unwrap() > 0, "{v}");

    // The model's own file warm in the group, as after a restart.
    weightmap::evict(&unrelated).unwrap();
    // Read twice: on the active list, where the kernel reclaims last.
    read_in(&group, &model);
    read_in(&group, &model);
    let restart = decisions(&group, &model, false);
    assert_eq!(restart, cold, "with the model's own file in the page cache");
}

#[test]
fn a_copy_larger_than_the_room_is_still_refused() {
    // Less than the model: no page cache given back makes room for it.
    let Some((dir, group, model)) = setup("weightmap-refuse", 100 * MIB) else {
        return;
    };
    let unrelated = dir.path().join("unrelated.bin");
    fs::write(&unrelated, vec![7u8; (80 * MIB) as usize]).unwrap();
    weightmap::evict(&unrelated).unwrap();
    read_in(&group, &unrelated);
    let refused = load(&group, &model, "stream", true).unwrap_err();
    assert!(refused.contains("over the memory budget"), "{refused}");
}
