//! The memory budget as Linux (and Android) state it: `MemAvailable` in
//! `/proc/meminfo`, and the memory cgroup's limits.
//!
//! `MemAvailable` alone is not enough: it is the whole machine's estimate and
//! knows nothing of the container's or app's cgroup, whose limit is what the
//! OOM killer enforces (ARCHITECTURE.md, "Memory limits", with the kernel
//! documents it rests on). So the budget is the least of `MemAvailable` and, for every
//! memory limit on the process's cgroup and on each ancestor that charges
//! it, in both cgroup versions, that limit less what is used.
//!
//! Everything is read from text files under a root directory, so that tests
//! can point [`read_budget_in`] at a fake tree, on any platform; the Unix
//! layer reads the root `/` on Linux and Android. Nothing here panics on
//! file content: a file that cannot be read or parsed leaves out the limit
//! it holds, and says so in the `unread` notes of
//! [`BudgetReading::Limited`].
#![cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(dead_code))]

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::budget::{Budget, BudgetReading, Counted, Source};

/// From this value up, a cgroup v1 `memory.limit_in_bytes` means "no limit".
/// The kernel writes "unlimited" as the largest page-aligned `i64`
/// (9223372036854771712 with 4 KiB pages, a little less with larger pages);
/// no real limit comes near 2^62 bytes, so everything above is unlimited
/// whatever the page size.
const V1_UNLIMITED_FROM: u64 = 1 << 62;

/// The budget as the files under `root` describe it: `root/proc/meminfo`,
/// `root/proc/self/cgroup`, `root/proc/self/mountinfo`, and the cgroup files
/// under `root/<mount point>`. Mount points are taken as absolute paths
/// inside `root`, so a fake tree needs no real mounts.
///
/// `own_cached` is how much of the model being loaded is in the page cache
/// already: those pages are counted as the model's, not as used.
pub(crate) fn read_budget_in(root: &Path, own_cached: u64) -> BudgetReading {
    let mut r = Reader {
        root,
        own_cached,
        found: Vec::new(),
        unread: Vec::new(),
    };
    r.mem_available();
    r.cgroups();
    r.finish()
}

// ------------------------------------------------------------------ reading

/// One file's content, with "absent" apart from "failed": an absent limit
/// file is how a cgroup says it has no such limit, a failure is not.
enum Read {
    Text(String),
    Absent,
    Failed(String),
}

fn read_text(path: &Path) -> Read {
    use std::io::Read as _;
    // /proc and /sys files report a size of 0: asking it (as
    // `File::read_to_string` does, with its position) is two system calls
    // for nothing, so the file is read through `take`, which asks neither,
    // into a buffer they fit in. No such file is near 1 MiB.
    let read = std::fs::File::open(path).and_then(|f| {
        let mut text = String::with_capacity(4096);
        f.take(1 << 20).read_to_string(&mut text).map(|_| text)
    });
    match read {
        Ok(t) => Read::Text(t),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Read::Absent,
        Err(e) => Read::Failed(e.to_string()),
    }
}

/// The two cgroup versions, which differ in file names, in how "no limit"
/// is written and in how ancestors apply.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// One line of `/proc/self/mountinfo`, the fields this module needs.
struct Mount {
    /// The directory of the mounted filesystem that is seen at `point`:
    /// `/` usually, the cgroup's own path when a container bind-mounts it.
    root: String,
    /// Where it is mounted (absolute).
    point: String,
    fstype: String,
    super_opts: String,
}

/// The process's cgroup in each hierarchy that accounts memory.
#[derive(Default)]
struct Membership {
    /// The `0::/PATH` line.
    v2: Option<String>,
    /// The `N:...memory...:/PATH` line.
    v1: Option<String>,
}

/// What has been read so far.
struct Reader<'a> {
    root: &'a Path,
    /// The model's bytes in the page cache (`read_budget_in`).
    own_cached: u64,
    /// Every figure read, `MemAvailable` first.
    found: Vec<Budget>,
    unread: Vec<String>,
}

impl Reader<'_> {
    /// `abs` (an absolute path on the system) inside the root.
    fn file(&self, abs: &str) -> PathBuf {
        self.root.join(abs.trim_start_matches('/'))
    }

    fn note(&mut self, path: &Path, why: impl fmt::Display) {
        self.unread.push(format!("{}: {why}", path.display()));
    }

    /// The text of `path`, or a note and `None` if it is absent or fails.
    fn required(&mut self, path: &Path) -> Option<String> {
        match read_text(path) {
            Read::Text(t) => Some(t),
            Read::Absent => {
                self.note(path, "not found");
                None
            }
            Read::Failed(why) => {
                self.note(path, why);
                None
            }
        }
    }

    fn mem_available(&mut self) {
        let path = self.file("/proc/meminfo");
        let Some(text) = self.required(&path) else {
            return;
        };
        match parse_mem_available(&text) {
            Ok(bytes) => self.found.push(Budget {
                bytes,
                source: Source::MemAvailable,
                counted: None,
            }),
            Err(why) => self.note(&path, why),
        }
    }

    fn cgroups(&mut self) {
        let path = self.file("/proc/self/cgroup");
        let Some(text) = self.required(&path) else {
            return;
        };
        let member = match parse_proc_cgroup(&text) {
            Ok(m) => m,
            Err(why) => return self.note(&path, why),
        };
        if member.v1.is_none() && member.v2.is_none() {
            // No hierarchy accounts this process's memory: no cgroup limit.
            return;
        }
        let Some(mounts) = self.cgroup_mounts() else {
            return;
        };
        if let Some(cg) = &member.v2 {
            self.hierarchy(Version::V2, cg, &mounts);
        }
        if let Some(cg) = &member.v1 {
            self.hierarchy(Version::V1, cg, &mounts);
        }
    }

    /// The cgroup mounts `/proc/self/mountinfo` lists. Parsing it is most
    /// of what reading the budget costs (it lists every mount), and cgroup
    /// hierarchies are mounted once, at boot or when a container starts, so
    /// the system's are kept for the life of the process, as the JDK's
    /// container support keeps its mount points; the limits and usage under
    /// them are read every time. A fake tree is read every time.
    fn cgroup_mounts(&mut self) -> Option<Arc<Vec<Mount>>> {
        static SYSTEM: Mutex<Option<Arc<Vec<Mount>>>> = Mutex::new(None);
        let system = self.root == Path::new("/");
        if system {
            if let Some(m) = &*SYSTEM.lock().unwrap_or_else(|e| e.into_inner()) {
                return Some(Arc::clone(m));
            }
        }
        let path = self.file("/proc/self/mountinfo");
        let text = self.required(&path)?;
        let mut mounts = Vec::new();
        let mut whole = true;
        for (i, line) in text.lines().enumerate() {
            match parse_mount(line) {
                Some(m) if m.fstype == "cgroup" || m.fstype == "cgroup2" => mounts.push(m),
                Some(_) => {}
                None => {
                    whole = false;
                    self.note(&path, format_args!("line {} unparsable", i + 1));
                }
            }
        }
        let mounts = Arc::new(mounts);
        // Kept only when every line was understood.
        if system && whole {
            *SYSTEM.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&mounts));
        }
        Some(mounts)
    }

    /// The limits on cgroup `cg` and its ancestors in one hierarchy.
    fn hierarchy(&mut self, version: Version, cg: &str, mounts: &[Mount]) {
        let here = self.file("/proc/self/mountinfo");
        let name = match version {
            Version::V1 => "cgroup v1 memory",
            Version::V2 => "cgroup2",
        };
        let candidates: Vec<&Mount> = mounts
            .iter()
            .filter(|m| match version {
                Version::V2 => m.fstype == "cgroup2",
                Version::V1 => {
                    m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "memory")
                }
            })
            .collect();
        if candidates.is_empty() {
            // A v1-only system still lists `0::/` (the default hierarchy
            // exists, unmounted); the root cgroup has no limit files in v2,
            // so only a cgroup below it is worth a note.
            if !(version == Version::V2 && cg == "/") {
                self.note(&here, format_args!("no {name} mount for cgroup {cg}"));
            }
            return;
        }
        if !cg.starts_with('/') {
            let path = self.file("/proc/self/cgroup");
            return self.note(&path, format_args!("{name} path {cg:?} is not absolute"));
        }
        // The mount through which the cgroup is seen is one whose root is
        // the cgroup or an ancestor (the longest such root, the nearest
        // view); PATH is then relative to that root. With none, PATH is
        // taken as is under the first mount.
        let within = candidates
            .iter()
            .filter_map(|m| strip_root(cg, &m.root).map(|rel| (*m, rel)))
            .max_by_key(|(m, _)| m.root.len());
        let (mount, base, rel) = match within {
            Some((m, rel)) => (m, m.root.trim_end_matches('/'), rel),
            None => (candidates[0], "", cg.trim_start_matches('/')),
        };
        let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
        if parts.iter().any(|p| *p == "." || *p == "..") {
            // A cgroup outside this namespace's view (`/../x`): its files
            // are not under the mount.
            let path = self.file("/proc/self/cgroup");
            return self.note(
                &path,
                format_args!("{name} path {cg:?} is outside the mount"),
            );
        }
        let top = self.file(&mount.point);
        // v1 ancestors passed over without reading whether they count their
        // children: that matters only once one of them, or one above, has a
        // limit (and mostly none has: the file is then never read).
        let mut unchecked: Vec<PathBuf> = Vec::new();
        // From the process's cgroup up to the mount's root: the ancestors
        // above it are not visible.
        for depth in (0..=parts.len()).rev() {
            let sub = parts[..depth].join("/");
            let dir = if sub.is_empty() {
                top.clone()
            } else {
                top.join(&sub)
            };
            let shown = format!("{base}/{sub}");
            let shown = if shown.len() > 1 {
                shown.trim_end_matches('/').to_string()
            } else {
                shown
            };
            // The root of a hierarchy takes no limit (v1 refuses one, v2 has
            // no such files there), so it is not read when the mount shows
            // the real root.
            if depth == 0 && base.is_empty() {
                break;
            }
            if depth < parts.len() && version == Version::V1 {
                unchecked.push(dir.clone());
                if !self.v1_has_limit(&dir) {
                    continue;
                }
                // An ancestor that does not count its children's usage:
                // neither its limit nor any above it applies to us.
                if !std::mem::take(&mut unchecked)
                    .iter()
                    .all(|d| self.v1_charges_children(d))
                {
                    break;
                }
            }
            if depth == parts.len() && !dir.is_dir() {
                self.note(&dir, "cgroup directory not found");
            }
            self.limits_of(version, &dir, shown);
        }
    }

    /// Whether a v1 cgroup sets a memory limit (a file that cannot be read
    /// or parsed counts as one, so that `limits_of` notes it).
    fn v1_has_limit(&self, dir: &Path) -> bool {
        match read_text(&dir.join("memory.limit_in_bytes")) {
            Read::Absent => false,
            Read::Text(t) => !matches!(parse_limit(Version::V1, &t), Ok(None)),
            Read::Failed(_) => true,
        }
    }

    /// Whether a v1 cgroup's limit covers its descendants:
    /// `memory.use_hierarchy` 1. Absent counts as 1 (the file is gone, the
    /// behaviour always on, in current kernels); unreadable counts as 1 too
    /// and is noted, since assuming the limit applies errs on the safe side.
    fn v1_charges_children(&mut self, dir: &Path) -> bool {
        let path = dir.join("memory.use_hierarchy");
        match read_text(&path) {
            Read::Absent => true,
            Read::Text(t) => match parse_count(&t) {
                Ok(0) => false,
                Ok(1) => true,
                Ok(n) => {
                    self.note(&path, format_args!("{n} is not 0 or 1; taken as 1"));
                    true
                }
                Err(why) => {
                    self.note(&path, format_args!("{why}; taken as 1"));
                    true
                }
            },
            Read::Failed(why) => {
                self.note(&path, format_args!("{why}; taken as 1"));
                true
            }
        }
    }

    /// The limits set on one cgroup, each less its usage.
    fn limits_of(&mut self, version: Version, dir: &Path, shown: String) {
        let (files, usage_file): (&[&'static str], _) = match version {
            Version::V1 => (&["memory.limit_in_bytes"], "memory.usage_in_bytes"),
            // memory.high is where the kernel starts throttling and
            // reclaiming hard; a loader should stay under it as well.
            Version::V2 => (&["memory.max", "memory.high"], "memory.current"),
        };
        let mut limits = Vec::new();
        for &file in files {
            let path = dir.join(file);
            match read_text(&path) {
                // The limit is not set here (v2 without the memory
                // controller enabled, the root cgroup).
                Read::Absent => {}
                Read::Text(t) => match parse_limit(version, &t) {
                    Ok(Some(limit)) => limits.push((file, limit)),
                    Ok(None) => {}
                    Err(why) => self.note(&path, why),
                },
                Read::Failed(why) => self.note(&path, why),
            }
        }
        if limits.is_empty() {
            return;
        }
        let path = dir.join(usage_file);
        let usage = match read_text(&path) {
            Read::Text(t) => parse_count(&t),
            Read::Absent => Err("not found".to_string()),
            Read::Failed(why) => Err(why),
        };
        let usage = match usage {
            Ok(u) => u,
            Err(why) => {
                let skipped: Vec<&str> = limits.iter().map(|(f, _)| *f).collect();
                return self.note(&path, format_args!("{why}; {} skipped", skipped.join(", ")));
            }
        };
        let reclaimable = self.reclaimable(version, dir);
        // The model's own cached pages are its resident set, not a cost
        // against its room; they may lie on either file list, so they and
        // the inactive list are not added together, and of the two the
        // larger is taken: never more than the cgroup's usage.
        let given_back = reclaimable.max(self.own_cached).min(usage);
        for (file, limit) in limits {
            let path = shown.clone();
            let source = match version {
                Version::V1 => Source::CgroupV1 { path, file },
                Version::V2 => Source::CgroupV2 { path, file },
            };
            // Usage can pass a limit (memory.high, or a limit lowered under
            // a full cgroup): nothing is left then, not a wrapped-around
            // huge number.
            self.found.push(Budget {
                bytes: limit.saturating_sub(usage - given_back),
                source,
                counted: Some(Counted {
                    limit,
                    usage,
                    reclaimable,
                    own_cached: self.own_cached.min(usage),
                }),
            });
        }
    }

    /// The file pages the kernel would reclaim before it charged the
    /// cgroup over its limit: the inactive file list (`memory.stat`'s
    /// `total_inactive_file` in v1, which counts the descendants as
    /// `memory.usage_in_bytes` does; `inactive_file` in v2, which always
    /// does). This is what kubelet takes out of usage for its working set;
    /// the active list is left counted as used, since the kernel reclaims
    /// it only after the inactive one. A `memory.stat` that cannot be read
    /// counts none, and says so.
    fn reclaimable(&mut self, version: Version, dir: &Path) -> u64 {
        let key = match version {
            Version::V1 => "total_inactive_file",
            Version::V2 => "inactive_file",
        };
        let path = dir.join("memory.stat");
        let Some(text) = self.required(&path) else {
            return 0;
        };
        match parse_stat(&text, key) {
            Ok(bytes) => bytes,
            Err(why) => {
                self.note(
                    &path,
                    format_args!("{why}; no page cache counted as reclaimable"),
                );
                0
            }
        }
    }

    fn finish(self) -> BudgetReading {
        // On a tie the first read (MemAvailable, then the process's own
        // cgroup before its ancestors) names the source.
        BudgetReading::least(self.found, self.unread)
    }
}

// ------------------------------------------------------------------ parsing

/// At most this much of a bad file's content goes into a note.
const SHOWN: usize = 32;

fn shown(s: &str) -> String {
    let cut: String = s.chars().take(SHOWN).collect();
    if cut.len() < s.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// A cgroup counter file: decimal digits and one newline, nothing else
/// (`str::parse` would also take a leading `+`).
fn parse_count(text: &str) -> Result<u64, String> {
    let s = text.strip_suffix('\n').unwrap_or(text);
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("not a number: {}", shown(s)));
    }
    s.parse::<u64>()
        .map_err(|_| format!("number out of range: {}", shown(s)))
}

/// A limit file: `Some(bytes)`, or `None` for "no limit" (v2 `max`, v1 a
/// value from [`V1_UNLIMITED_FROM`] up).
fn parse_limit(version: Version, text: &str) -> Result<Option<u64>, String> {
    if version == Version::V2 && text.strip_suffix('\n').unwrap_or(text) == "max" {
        return Ok(None);
    }
    let n = parse_count(text)?;
    Ok((version == Version::V2 || n < V1_UNLIMITED_FROM).then_some(n))
}

/// The value of `key` in a `memory.stat` text (`KEY VALUE` lines).
fn parse_stat(text: &str, key: &str) -> Result<u64, String> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .ok_or_else(|| format!("no {key} line"))?;
    parse_count(line).map_err(|why| format!("{key}: {why}"))
}

/// `MemAvailable` in bytes from `/proc/meminfo` text: the line must read
/// `MemAvailable: <digits> kB` (kernels before 3.14 have no such line).
fn parse_mem_available(text: &str) -> Result<u64, String> {
    let Some(rest) = text.lines().find_map(|l| l.strip_prefix("MemAvailable:")) else {
        return Err("no MemAvailable line".to_string());
    };
    let bad = || format!("MemAvailable line unparsable: {}", shown(rest.trim()));
    let digits = rest.trim().strip_suffix(" kB").ok_or_else(bad)?.trim_end();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|kb| kb.checked_mul(1024))
        .ok_or_else(bad)
}

/// `/proc/self/cgroup`: `ID:CONTROLLERS:PATH` lines. Any other line makes
/// the file unreadable, since a misread membership would check the wrong
/// cgroup's limits.
fn parse_proc_cgroup(text: &str) -> Result<Membership, String> {
    let mut m = Membership::default();
    for (i, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        // The path is last and may itself hold ':'.
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("line {} unparsable: {}", i + 1, shown(line)));
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("line {} unparsable: {}", i + 1, shown(line)));
        }
        if id == "0" && controllers.is_empty() {
            m.v2.get_or_insert_with(|| path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            m.v1.get_or_insert_with(|| path.to_string());
        }
    }
    Ok(m)
}

/// One `/proc/self/mountinfo` line: `ID PARENT MAJ:MIN ROOT POINT OPTS
/// [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTS`. `None` if it is not one.
fn parse_mount(line: &str) -> Option<Mount> {
    let fields: Vec<&str> = line.split(' ').collect();
    // The separator comes after the six fixed fields and the optional ones.
    let sep = fields.iter().skip(6).position(|f| *f == "-")? + 6;
    let after = fields.get(sep + 1..sep + 4)?;
    Some(Mount {
        root: unescape(fields[3])?,
        point: unescape(fields[4])?,
        fstype: after[0].to_string(),
        super_opts: after[2].to_string(),
    })
}

/// The kernel writes space, tab, newline and backslash in mountinfo paths as
/// `\ooo` octal escapes. `None` if the result is not UTF-8 (such a path
/// could not be one of the cgroup paths, which are read as text).
fn unescape(field: &str) -> Option<String> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                let v = u32::from(d[0] - b'0') * 64
                    + u32::from(d[1] - b'0') * 8
                    + u32::from(d[2] - b'0');
                out.push(u8::try_from(v).ok()?);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `cg` relative to a mount whose root is `root`, if `root` is `cg` or one
/// of its ancestors (component-wise: root `/a` is no ancestor of `/ab`).
fn strip_root<'c>(cg: &'c str, root: &str) -> Option<&'c str> {
    let root = root.trim_end_matches('/');
    let rest = cg.strip_prefix(root)?;
    (rest.is_empty() || rest.starts_with('/')).then(|| rest.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// A fake root: `/proc` files and cgroup mounts in a temporary directory.
    struct Tree {
        dir: tempfile::TempDir,
    }

    /// The mountinfo lines of a typical v2 system.
    const V2_MOUNTS: &str = "\
22 28 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    /// The mountinfo lines of a v1 system with the memory controller under
    /// `/sys/fs/cgroup/memory` (its root `root`) and another controller
    /// pair that must not be taken for it.
    fn v1_mounts(root: &str) -> String {
        format!(
            "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 {root} /sys/fs/cgroup/memory rw,relatime shared:15 - cgroup cgroup rw,memory
"
        )
    }

    impl Tree {
        fn new() -> Tree {
            Tree {
                dir: tempfile::tempdir().unwrap(),
            }
        }

        fn put(&self, rel: &str, text: &str) {
            let path = self.dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }

        fn meminfo(&self, bytes: u64) {
            let kb = bytes / 1024;
            self.put(
                "proc/meminfo",
                &format!("MemTotal:       67108864 kB\nMemFree:         1000000 kB\nMemAvailable:   {kb} kB\nBuffers:  1 kB\n"),
            );
        }

        /// A v2-only system, the process in `cg`.
        fn v2(&self, cg: &str) {
            self.put("proc/self/cgroup", &format!("0::{cg}\n"));
            self.put("proc/self/mountinfo", V2_MOUNTS);
        }

        /// A v1 system (with the empty v2 hierarchy of a hybrid setup), the
        /// process in `cg` for memory, the memory mount's root `root`.
        fn v1(&self, cg: &str, root: &str) {
            self.put(
                "proc/self/cgroup",
                &format!("12:pids:/\n4:memory:{cg}\n2:cpu,cpuacct:/\n0::/\n"),
            );
            self.put("proc/self/mountinfo", &v1_mounts(root));
        }

        /// v2 files of cgroup `cg` (relative to the mount).
        fn v2_files(&self, cg: &str, max: &str, high: Option<&str>, current: u64) {
            let d = format!("sys/fs/cgroup/{cg}");
            self.put(&format!("{d}/memory.max"), &format!("{max}\n"));
            if let Some(h) = high {
                self.put(&format!("{d}/memory.high"), &format!("{h}\n"));
            }
            self.put(&format!("{d}/memory.current"), &format!("{current}\n"));
            self.stat(&d, "inactive_file", 0);
        }

        /// v1 files of cgroup `cg` (relative to the mount).
        fn v1_files(&self, cg: &str, limit: &str, usage: u64) {
            let d = format!("sys/fs/cgroup/memory/{cg}");
            self.put(&format!("{d}/memory.limit_in_bytes"), &format!("{limit}\n"));
            self.put(&format!("{d}/memory.usage_in_bytes"), &format!("{usage}\n"));
            self.put(&format!("{d}/memory.use_hierarchy"), "1\n");
            self.stat(&d, "total_inactive_file", 0);
        }

        /// `memory.stat` of cgroup `dir` (relative to the tree) with
        /// `key` at `bytes`, among the other lines a kernel writes.
        fn stat(&self, dir: &str, key: &str, bytes: u64) {
            self.put(
                &format!("{dir}/memory.stat"),
                &format!("cache 1\nrss 2\nactive_file 3\n{key} {bytes}\nunevictable 0\n"),
            );
        }

        fn read(&self) -> BudgetReading {
            read_budget_in(self.dir.path(), 0)
        }
    }

    fn v1(path: &str, file: &'static str) -> Source {
        Source::CgroupV1 {
            path: path.into(),
            file,
        }
    }

    fn v2(path: &str, file: &'static str) -> Source {
        Source::CgroupV2 {
            path: path.into(),
            file,
        }
    }

    /// The budget, which must exist, and the notes.
    fn limited(r: &BudgetReading) -> (&Budget, &[String]) {
        match r {
            BudgetReading::Limited { budget, unread } => (budget, unread),
            BudgetReading::Unreadable { why } => panic!("unreadable: {why}"),
        }
    }

    #[test]
    fn sources_display_as_the_file_to_look_at() {
        assert_eq!(Source::MemAvailable.to_string(), "MemAvailable");
        assert_eq!(
            v1("/NAME", "memory.limit_in_bytes").to_string(),
            "cgroup v1 /NAME memory.limit_in_bytes"
        );
        assert_eq!(
            v2("/a/b", "memory.max").to_string(),
            "cgroup v2 /a/b memory.max"
        );
    }

    #[test]
    fn v2_limit_on_own_cgroup_is_the_budget() {
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v2("/app");
        t.v2_files("app", &(512 * MIB).to_string(), Some("max"), 100 * MIB);
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!(b.bytes, 412 * MIB);
        assert_eq!(b.source, v2("/app", "memory.max"));
        assert!(unread.is_empty(), "{unread:?}");
    }

    #[test]
    fn v2_tighter_ancestor_decides() {
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v2("/a/b/c");
        t.v2_files("a", &(2 * GIB).to_string(), None, GIB);
        t.v2_files("a/b", &(256 * MIB).to_string(), None, 200 * MIB);
        t.v2_files("a/b/c", &GIB.to_string(), None, 150 * MIB);
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!(b.bytes, 56 * MIB);
        assert_eq!(b.source, v2("/a/b", "memory.max"));
        assert!(unread.is_empty(), "{unread:?}");
    }

    #[test]
    fn v2_max_everywhere_leaves_mem_available() {
        let t = Tree::new();
        t.meminfo(3 * GIB);
        t.v2("/user.slice/app");
        t.v2_files("user.slice", "max", Some("max"), 5 * GIB);
        t.v2_files("user.slice/app", "max", Some("max"), GIB);
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!((b.bytes, &b.source), (3 * GIB, &Source::MemAvailable));
        assert!(unread.is_empty(), "{unread:?}");
    }

    #[test]
    fn v2_memory_high_tighter_than_max_decides() {
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v2("/app");
        t.v2_files(
            "app",
            &GIB.to_string(),
            Some(&(600 * MIB).to_string()),
            100 * MIB,
        );
        let r = t.read();
        let (b, _) = limited(&r);
        assert_eq!(b.bytes, 500 * MIB);
        assert_eq!(b.source, v2("/app", "memory.high"));
    }

    #[test]
    fn v2_limit_looser_than_mem_available_leaves_mem_available() {
        let t = Tree::new();
        t.meminfo(GIB);
        t.v2("/app");
        t.v2_files("app", &(4 * GIB).to_string(), None, MIB);
        let r = t.read();
        assert_eq!(limited(&r).0.source, Source::MemAvailable);
    }

    #[test]
    fn v1_limit_on_own_cgroup_is_the_budget() {
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/NAME", "/");
        t.v1_files("", "9223372036854771712", 3 * GIB);
        t.v1_files("NAME", &(128 * MIB).to_string(), 28 * MIB);
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!(b.bytes, 100 * MIB);
        assert_eq!(b.source, v1("/NAME", "memory.limit_in_bytes"));
        assert_eq!(
            b.source.to_string(),
            "cgroup v1 /NAME memory.limit_in_bytes"
        );
        assert!(unread.is_empty(), "{unread:?}");
    }

    #[test]
    fn reclaimable_page_cache_counts_as_available_in_v1_and_v2() {
        // Issue 54's case: a 1 GiB cgroup after `cat` of a 700 MB file,
        // all of it on the inactive list.
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/NAME", "/");
        t.v1_files("NAME", &GIB.to_string(), 856 * MIB);
        t.stat(
            "sys/fs/cgroup/memory/NAME",
            "total_inactive_file",
            700 * MIB,
        );
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!(b.bytes, GIB - 156 * MIB);
        let counted = b.counted.unwrap();
        assert_eq!(
            (counted.limit, counted.usage, counted.reclaimable),
            (GIB, 856 * MIB, 700 * MIB)
        );
        assert!(unread.is_empty(), "{unread:?}");

        // v2 names the (always hierarchical) figure inactive_file.
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v2("/app");
        t.v2_files("app", &GIB.to_string(), None, 900 * MIB);
        t.stat("sys/fs/cgroup/app", "inactive_file", 600 * MIB);
        let r = t.read();
        assert_eq!(limited(&r).0.bytes, GIB - 300 * MIB);
    }

    #[test]
    fn the_models_own_cached_pages_count_as_its_not_as_used() {
        // The model's 400 MiB warm (a restart), on the active list: its
        // budget is the cold start's.
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/NAME", "/");
        t.v1_files("NAME", &GIB.to_string(), 450 * MIB);
        t.stat("sys/fs/cgroup/memory/NAME", "total_inactive_file", 10 * MIB);
        let warm = read_budget_in(t.dir.path(), 400 * MIB);
        assert_eq!(limited(&warm).0.bytes, GIB - 50 * MIB);
        assert_eq!(limited(&warm).0.counted.unwrap().own_cached, 400 * MIB);
        // On the inactive list they are not counted twice.
        t.stat(
            "sys/fs/cgroup/memory/NAME",
            "total_inactive_file",
            420 * MIB,
        );
        let warm = read_budget_in(t.dir.path(), 400 * MIB);
        assert_eq!(limited(&warm).0.bytes, GIB - 30 * MIB);
        // Never more than the usage.
        let warm = read_budget_in(t.dir.path(), 4 * GIB);
        assert_eq!(limited(&warm).0.bytes, GIB);
        // MemAvailable counts cached pages as available already.
        let t = Tree::new();
        t.meminfo(GIB);
        t.put("proc/self/cgroup", "0::/\n");
        t.put("proc/self/mountinfo", V2_MOUNTS);
        let r = read_budget_in(t.dir.path(), 400 * MIB);
        assert_eq!(limited(&r).0.bytes, GIB);
    }

    #[test]
    fn an_unreadable_memory_stat_counts_nothing_reclaimable_and_says_so() {
        for stat in [None, Some("cache 1\n"), Some("total_inactive_file x\n")] {
            let t = Tree::new();
            t.meminfo(8 * GIB);
            t.v1("/NAME", "/");
            t.v1_files("NAME", &GIB.to_string(), 856 * MIB);
            let path = "sys/fs/cgroup/memory/NAME/memory.stat";
            match stat {
                Some(text) => t.put(path, text),
                None => std::fs::remove_file(t.dir.path().join(path)).unwrap(),
            }
            let r = t.read();
            let (b, unread) = limited(&r);
            assert_eq!(b.bytes, 168 * MIB, "{stat:?}");
            assert_eq!(unread.len(), 1, "{unread:?}");
            assert!(unread[0].contains("memory.stat"), "{unread:?}");
        }
    }

    #[test]
    fn the_root_of_a_v1_hierarchy_is_not_read() {
        // The kernel refuses a limit on the root, so its file is never
        // read: here it would not parse.
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/NAME", "/");
        t.v1_files("", "not a number", 3 * GIB);
        t.v1_files("NAME", &(128 * MIB).to_string(), 28 * MIB);
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!(b.bytes, 100 * MIB);
        assert!(unread.is_empty(), "{unread:?}");
        // A container's mount shows a cgroup as its root: that one is read.
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/docker/c1", "/docker/c1");
        t.v1_files("", &(64 * MIB).to_string(), 16 * MIB);
        let r = t.read();
        assert_eq!(limited(&r).0.bytes, 48 * MIB);
    }

    #[test]
    fn v1_nested_parent_tighter_decides() {
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/parent/child", "/");
        t.v1_files("parent", &(300 * MIB).to_string(), 250 * MIB);
        t.v1_files("parent/child", &GIB.to_string(), 200 * MIB);
        let r = t.read();
        let (b, _) = limited(&r);
        assert_eq!(b.bytes, 50 * MIB);
        assert_eq!(b.source, v1("/parent", "memory.limit_in_bytes"));
    }

    #[test]
    fn v1_parent_without_use_hierarchy_does_not_apply() {
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/parent/child", "/");
        t.v1_files("parent", &(300 * MIB).to_string(), 250 * MIB);
        t.put("sys/fs/cgroup/memory/parent/memory.use_hierarchy", "0\n");
        t.v1_files("parent/child", &GIB.to_string(), 200 * MIB);
        let r = t.read();
        let (b, _) = limited(&r);
        assert_eq!(b.bytes, GIB - 200 * MIB);
        assert_eq!(b.source, v1("/parent/child", "memory.limit_in_bytes"));
    }

    #[test]
    fn v1_use_hierarchy_absent_counts_as_on() {
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/parent/child", "/");
        t.v1_files("parent", &(300 * MIB).to_string(), 250 * MIB);
        std::fs::remove_file(
            t.dir
                .path()
                .join("sys/fs/cgroup/memory/parent/memory.use_hierarchy"),
        )
        .unwrap();
        t.v1_files("parent/child", &GIB.to_string(), 200 * MIB);
        let r = t.read();
        assert_eq!(limited(&r).0.source, v1("/parent", "memory.limit_in_bytes"));
    }

    #[test]
    fn v1_huge_limit_means_unlimited() {
        for huge in [
            "9223372036854771712",
            "9223372036854775807",
            &(1u64 << 62).to_string(),
        ] {
            let t = Tree::new();
            t.meminfo(2 * GIB);
            t.v1("/NAME", "/");
            t.v1_files("NAME", huge, 5 * GIB);
            let r = t.read();
            let (b, unread) = limited(&r);
            assert_eq!(
                (b.bytes, &b.source),
                (2 * GIB, &Source::MemAvailable),
                "{huge}"
            );
            assert!(unread.is_empty(), "{unread:?}");
        }
    }

    #[test]
    fn v1_mount_root_not_slash_is_stripped_container_case() {
        // A container sees its own cgroup bind-mounted at the memory mount
        // point: /proc/self/cgroup names the full path, mountinfo's root
        // is that same path, and its files are at the mount point itself.
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/docker/abc123", "/docker/abc123");
        t.v1_files("", &(256 * MIB).to_string(), 56 * MIB);
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!(b.bytes, 200 * MIB);
        assert_eq!(b.source, v1("/docker/abc123", "memory.limit_in_bytes"));
        assert!(unread.is_empty(), "{unread:?}");
    }

    #[test]
    fn v1_path_not_under_mount_root_is_taken_as_is() {
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/NAME", "/elsewhere");
        t.v1_files("NAME", &(64 * MIB).to_string(), 0);
        let r = t.read();
        assert_eq!(limited(&r).0.bytes, 64 * MIB);
    }

    #[test]
    fn mount_root_is_stripped_by_component() {
        assert_eq!(strip_root("/a/b", "/a"), Some("b"));
        assert_eq!(strip_root("/a", "/a"), Some(""));
        assert_eq!(strip_root("/a/b", "/"), Some("a/b"));
        assert_eq!(strip_root("/ab", "/a"), None);
    }

    #[test]
    fn no_memory_line_in_proc_self_cgroup_leaves_mem_available() {
        let t = Tree::new();
        t.meminfo(GIB);
        t.put("proc/self/cgroup", "12:pids:/x\n2:cpu,cpuacct:/x\n");
        t.put("proc/self/mountinfo", &v1_mounts("/"));
        t.v1_files("x", &MIB.to_string(), 0);
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!((b.bytes, &b.source), (GIB, &Source::MemAvailable));
        assert!(unread.is_empty(), "{unread:?}");
    }

    #[test]
    fn memory_mount_missing_leaves_mem_available() {
        let t = Tree::new();
        t.meminfo(GIB);
        t.put("proc/self/cgroup", "4:memory:/NAME\n0::/\n");
        // Only cpu,cpuacct is mounted; no cgroup2 either.
        t.put(
            "proc/self/mountinfo",
            "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n",
        );
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!((b.bytes, &b.source), (GIB, &Source::MemAvailable));
        assert_eq!(unread.len(), 1, "{unread:?}");
        assert!(
            unread[0].contains("no cgroup v1 memory mount"),
            "{unread:?}"
        );
    }

    #[test]
    fn usage_above_limit_is_zero_not_underflow() {
        let t = Tree::new();
        t.meminfo(GIB);
        t.v1("/NAME", "/");
        t.v1_files("NAME", &(128 * MIB).to_string(), 130 * MIB);
        let r = t.read();
        let (b, _) = limited(&r);
        assert_eq!(
            (b.bytes, &b.source),
            (0, &v1("/NAME", "memory.limit_in_bytes"))
        );

        let t = Tree::new();
        t.meminfo(GIB);
        t.v2("/app");
        t.v2_files(
            "app",
            &GIB.to_string(),
            Some(&(100 * MIB).to_string()),
            120 * MIB,
        );
        let r = t.read();
        assert_eq!(limited(&r).0.bytes, 0);
    }

    #[test]
    fn no_proc_at_all_is_unreadable() {
        let t = Tree::new();
        match t.read() {
            BudgetReading::Unreadable { why } => {
                assert!(why.contains("meminfo"), "{why}");
                assert!(why.contains("cgroup"), "{why}");
            }
            other => panic!("expected Unreadable, got {other:?}"),
        }
    }

    #[test]
    fn cgroup_limit_without_meminfo_is_still_a_budget() {
        let t = Tree::new();
        t.v2("/app");
        t.v2_files("app", &GIB.to_string(), None, 0);
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!((b.bytes, &b.source), (GIB, &v2("/app", "memory.max")));
        assert!(unread.iter().any(|u| u.contains("meminfo")), "{unread:?}");
    }

    #[test]
    fn garbage_in_a_cgroup_file_skips_that_limit_only() {
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v2("/a/b");
        t.v2_files("a", &GIB.to_string(), None, 200 * MIB);
        // The tighter limit is unreadable: left out, noted.
        t.v2_files("a/b", "12x", Some(&(4 * GIB).to_string()), 0);
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!(b.bytes, GIB - 200 * MIB);
        assert_eq!(b.source, v2("/a", "memory.max"));
        assert_eq!(unread.len(), 1, "{unread:?}");
        assert!(
            unread[0].contains("memory.max") && unread[0].contains("12x"),
            "{unread:?}"
        );

        // Garbage usage: the limits it would complete are left out.
        let t = Tree::new();
        t.meminfo(8 * GIB);
        t.v1("/p/c", "/");
        t.v1_files("p", &GIB.to_string(), 100 * MIB);
        t.v1_files("p/c", &(64 * MIB).to_string(), 0);
        t.put("sys/fs/cgroup/memory/p/c/memory.usage_in_bytes", "-5\n");
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!(
            (b.bytes, &b.source),
            (GIB - 100 * MIB, &v1("/p", "memory.limit_in_bytes"))
        );
        assert!(unread[0].contains("memory.usage_in_bytes"), "{unread:?}");
    }

    #[test]
    fn garbage_meminfo_is_noted_and_cgroup_limits_still_apply() {
        let t = Tree::new();
        t.put("proc/meminfo", "MemAvailable: lots kB\n");
        t.v2("/app");
        t.v2_files("app", &GIB.to_string(), None, 0);
        let r = t.read();
        let (b, unread) = limited(&r);
        assert_eq!(b.source, v2("/app", "memory.max"));
        assert!(unread[0].contains("MemAvailable"), "{unread:?}");
    }

    #[test]
    fn numbers_are_parsed_strictly() {
        assert_eq!(parse_count("42\n"), Ok(42));
        assert_eq!(parse_count("0"), Ok(0));
        for bad in [
            "",
            "\n",
            "+42",
            " 42",
            "42 ",
            "42\n\n",
            "4 2",
            "-1",
            "18446744073709551616",
            "0x10",
        ] {
            assert!(parse_count(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_limit(Version::V2, "max\n"), Ok(None));
        assert!(parse_limit(Version::V1, "max\n").is_err());
        assert_eq!(parse_mem_available("MemAvailable:   100 kB\n"), Ok(102_400));
        for bad in [
            "MemFree: 1 kB\n",
            "MemAvailable: 100\n",
            "MemAvailable: -1 kB\n",
            "MemAvailable: 1 MB\n",
        ] {
            assert!(parse_mem_available(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn proc_self_cgroup_garbage_makes_it_unreadable() {
        assert!(parse_proc_cgroup("4:memory\n").is_err());
        assert!(parse_proc_cgroup("x:memory:/a\n").is_err());
        let m = parse_proc_cgroup("4:memory,hugetlb:/a:b\n0::/c\n").unwrap();
        assert_eq!(
            (m.v1.as_deref(), m.v2.as_deref()),
            (Some("/a:b"), Some("/c"))
        );
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        let m = parse_mount(
            r"35 31 0:32 /my\040root /sys/fs/cgroup/mem\134ory rw - cgroup cgroup rw,memory",
        )
        .unwrap();
        assert_eq!(
            (m.root.as_str(), m.point.as_str()),
            ("/my root", r"/sys/fs/cgroup/mem\ory")
        );
        assert_eq!(
            (m.fstype.as_str(), m.super_opts.as_str()),
            ("cgroup", "rw,memory")
        );
        assert!(parse_mount("35 31 0:32 / /x rw - cgroup").is_none());
    }
}
