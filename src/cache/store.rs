//! The cache directory: where entries are, how one is written so that no
//! reader ever sees it torn, how one is opened and checked, and how the
//! directory is kept within its size.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::buffer::{CpuBuffer, CpuBufferType};
use crate::error::{Error, Result};
use crate::loader::{budget, LoadOptions, Weights};
use crate::os::{
    allocate, is_no_space, is_read_only, shared_dir_problem, sync_dir, try_lock, WritableMap,
    LOCKS, SUPPORTED,
};

use super::entry::{self, EntryInfo, Layout};
use super::key::SourceKey;
use super::report::CacheBypass;
use super::transform::EntryContents;

const ENTRY_EXT: &str = "gguf";
const TMP_PREFIX: &str = ".tmp-";

/// Where no lock tells a live fill's temporary file from a killed one's,
/// one this old is taken for a killed fill's.
const ORPHAN_AGE: Duration = Duration::from_secs(10 * 60);

/// Where the entry of key `hash` is.
pub(crate) fn entry_path(dir: &Path, hash: &str) -> PathBuf {
    dir.join(format!("{hash}.{ENTRY_EXT}"))
}

/// Make `dir` if it is missing (private to this user), and refuse it if
/// another user could write in it.
pub(crate) fn usable(dir: &Path) -> std::result::Result<(), CacheBypass> {
    if !SUPPORTED {
        return Err(CacheBypass::Unsupported);
    }
    if !dir.is_dir() {
        let mut b = fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir).map_err(|e| refusal(dir, "create", &e, 0))?;
    }
    match shared_dir_problem(dir) {
        Ok(None) => Ok(()),
        Ok(Some(problem)) => Err(CacheBypass::UnsafeDirectory {
            dir: dir.to_owned(),
            problem,
        }),
        Err(e) => Err(refusal(dir, "stat", &e, 0)),
    }
}

/// What an OS error on the cache directory means for the load.
fn refusal(dir: &Path, op: &'static str, e: &io::Error, needed: u64) -> CacheBypass {
    if is_no_space(e) {
        CacheBypass::NoSpace {
            dir: dir.to_owned(),
            needed,
        }
    } else if is_read_only(e) {
        CacheBypass::ReadOnly {
            dir: dir.to_owned(),
            error: e.to_string(),
        }
    } else {
        CacheBypass::Io {
            dir: dir.to_owned(),
            op,
            error: e.to_string(),
        }
    }
}

/// Open and check the entry at `path`: `Ok(None)` when there is none,
/// `Err(why)` when the one there is not usable (it will be replaced).
///
/// # Safety
/// As `Weights::load`: nothing truncates or modifies the entry while the
/// weights live.
pub(crate) unsafe fn open_entry(
    path: &Path,
    key: &str,
    options: &LoadOptions,
) -> std::result::Result<Option<Weights>, String> {
    if !path.is_file() {
        return Ok(None);
    }
    // SAFETY: the caller's contract.
    let weights = unsafe { Weights::load(path, options) }.map_err(|e| e.to_string())?;
    entry::check(&weights, Some(key)).map_err(|p| p.to_string())?;
    Ok(Some(weights))
}

/// Open the entry just written at `path`. It was checked as it was
/// written; a failure here is another process's rename in between, and
/// its entry is as good, so the same checks decide.
///
/// # Safety
/// As [`open_entry`].
pub(crate) unsafe fn open_written(
    path: &Path,
    key: &str,
    options: &LoadOptions,
) -> Result<Weights> {
    // SAFETY: the caller's contract.
    match unsafe { open_entry(path, key, options) } {
        Ok(Some(w)) => Ok(w),
        Ok(None) => Err(Error::io(
            "open",
            path,
            io::Error::from(io::ErrorKind::NotFound),
        )),
        // Not the transform's fault: the file under the entry's name is not
        // what was written (another process put a bad one there).
        Err(why) => Err(Error::io(
            "open",
            path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the entry is bad: {why}"),
            ),
        )),
    }
}

/// Mark the entry at `path` as just used (its modification time), for
/// pruning the least recently used first. Best effort: a read-only cache
/// is still read.
pub(crate) fn touch(path: &Path) {
    // Windows sets a file's times only through a handle that may write
    // them; Unix through any handle of the owner's.
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .or_else(|_| File::open(path));
    if let Ok(f) = file {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Why an entry was not written.
pub(crate) enum Unwritten {
    /// The cache cannot take it: transform in memory instead.
    Bypass(CacheBypass),
    /// The transform failed: the load fails.
    Failed(Error),
}

/// A temporary file removed when dropped, unless kept.
struct TempFile {
    path: PathBuf,
    keep: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A fill's temporary file, written whole, its bytes not yet known to be
/// on the disk nor renamed into place. Dropped, it is removed.
pub(crate) struct Filled {
    tmp: TempFile,
    file: File,
    len: u64,
}

impl Filled {
    /// The temporary file: its bytes are the entry's, and stay so once it
    /// is renamed (a mapping of it now is a mapping of the entry).
    pub(crate) fn path(&self) -> &Path {
        &self.tmp.path
    }
}

/// Write the entry `layout` describes into a new temporary file in `dir`:
/// created, locked, its blocks allocated, filled through a shared mapping
/// whose writes are then started towards the disk. [`commit`] finishes.
pub(crate) fn fill_temp(
    dir: &Path,
    key: &SourceKey,
    layout: &Layout,
    contents: &mut dyn EntryContents,
) -> std::result::Result<Filled, Unwritten> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let bypass = |op, e: &io::Error| Unwritten::Bypass(refusal(dir, op, e, layout.len));
    let name = format!(
        "{TMP_PREFIX}{}-{}-{}",
        key.hash,
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let tmp = TempFile {
        path: dir.join(name),
        keep: false,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp.path)
        .map_err(|e| bypass("create", &e))?;
    // A held lock tells `prune` the file is a fill under way.
    let _ = try_lock(&file);
    allocate(&mut file, layout.len).map_err(|e| bypass("allocate", &e))?;
    match layout.write_held(key, contents, &file, &tmp.path) {
        Some(written) => written.map_err(|e| bypass("write", &e))?,
        None => {
            // SAFETY: the file was created just now under a name no other
            // process uses, in a directory only this user can write
            // (`usable`), and its blocks are allocated: nothing truncates it
            // or writes it under the map, and a full disk cannot fault a
            // write through it.
            let mut map = unsafe { WritableMap::new(&file) }.map_err(|e| bypass("map", &e))?;
            layout
                .write(key, contents, map.bytes_mut())
                .map_err(Unwritten::Failed)?;
            map.start_flush().map_err(|e| bypass("flush", &e))?;
        }
    }
    Ok(Filled {
        tmp,
        file,
        len: layout.len,
    })
}

/// Make `filled` the entry of `key` in `dir`: fsync it, check that the
/// source did not change while it was made, rename it over the entry's
/// name, and fsync the directory. Returns the entry's path.
pub(crate) fn commit(
    mut filled: Filled,
    dir: &Path,
    key: &SourceKey,
) -> std::result::Result<PathBuf, Unwritten> {
    let bypass = |op, e: &io::Error| Unwritten::Bypass(refusal(dir, op, e, filled.len));
    filled.file.sync_all().map_err(|e| bypass("fsync", &e))?;
    if !key.still_current() {
        return Err(Unwritten::Bypass(CacheBypass::SourceChanged {
            path: key.path.clone(),
        }));
    }
    let path = entry_path(dir, &key.hash);
    if let Err(e) = fs::rename(&filled.tmp.path, &path) {
        // Windows refuses to replace a file another process has mapped:
        // when that file is this key's entry, another fill won the race,
        // and its entry serves (the open that follows checks it).
        return if entry::has_key(&path, &key.text) {
            Ok(path)
        } else {
            Err(bypass("rename", &e))
        };
    }
    filled.tmp.keep = true;
    sync_dir(dir).map_err(|e| bypass("fsync", &e))?;
    Ok(path)
}

/// The entry `layout` describes, built in memory: what a load without a
/// cache would hold, held to the memory budget as any copy. The bytes are a
/// CPU buffer (aligned, in huge pages where there are), so the load views
/// every tensor in place rather than copying it again.
pub(crate) fn in_memory(
    key: &SourceKey,
    layout: &Layout,
    contents: &mut dyn EntryContents,
    options: &LoadOptions,
) -> Result<Weights> {
    budget::check(
        layout.len,
        "the transformed tensors",
        &budget::current(options),
        options,
    )?;
    let len = usize::try_from(layout.len).map_err(|_| Error::OutOfMemory {
        bytes: layout.len,
        what: "the transformed tensors",
    })?;
    let mut buffer = CpuBufferType::new().alloc(len)?;
    layout.write(key, contents, buffer.bytes_mut())?;
    Weights::from_memory(InMemoryEntry(buffer), options)
}

/// An entry's bytes in memory.
struct InMemoryEntry(CpuBuffer);

impl AsRef<[u8]> for InMemoryEntry {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Every entry in `dir` (by its name: [`is_entry_name`]), with its
/// header's account or why it has none.
pub(crate) fn entries(dir: &Path) -> Result<Vec<(PathBuf, Result<EntryInfo>)>> {
    let mut out = Vec::new();
    let read = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io("read directory", dir, e)),
    };
    for item in read {
        let path = item
            .map_err(|e| Error::io("read directory", dir, e))?
            .path();
        if is_entry_name(&file_name(&path)) {
            let info = EntryInfo::read(&path);
            out.push((path, info));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Whether `name` is an entry's: 32 hex digits (the key's hash), then
/// `.gguf`. Nothing else in the directory is ever listed or removed, so a
/// cache pointed at a folder of models never touches them.
fn is_entry_name(name: &str) -> bool {
    name.strip_suffix(&format!(".{ENTRY_EXT}"))
        .is_some_and(is_key_hash)
}

/// Whether `path`'s file name is an entry's.
pub(crate) fn is_entry_path(path: &Path) -> bool {
    is_entry_name(&file_name(path))
}

/// Whether `name` is a fill's temporary file: `.tmp-`, a key's hash, `-`.
fn is_temp_name(name: &str) -> bool {
    name.strip_prefix(TMP_PREFIX)
        .and_then(|rest| rest.get(..33))
        .is_some_and(|head| head.ends_with('-') && is_key_hash(&head[..32]))
}

fn is_key_hash(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Every check of the entry at `path`, every byte of it.
///
/// # Safety
/// Nothing truncates the entry while it is checked.
pub(crate) unsafe fn verify_entry(path: &Path) -> std::result::Result<(), String> {
    let options = LoadOptions::default().prefetch(crate::loader::Prefetch::None);
    // SAFETY: the caller's contract.
    let weights = unsafe { Weights::load(path, &options) }.map_err(|e| e.to_string())?;
    entry::verify(&weights).map_err(|p| p.to_string())
}

/// What [`super::Cache::prune`] removed.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct PruneReport {
    /// Each file removed, its bytes, and why ("source changed",
    /// "least recently used", "unreadable: ...", "killed fill").
    pub removed: Vec<(PathBuf, u64, String)>,
    /// Entries kept, and their bytes.
    pub kept: usize,
    /// Bytes of the entries kept.
    pub kept_bytes: u64,
    /// Files that could not be removed (in use on Windows, ...), and why.
    pub failed: Vec<(PathBuf, String)>,
}

/// Remove from `dir` the entries whose source changed, those no header
/// can be read of, then the least recently used until at most `max_size`
/// bytes remain (never `keep`), and the temporary files of killed fills.
pub(crate) fn prune(dir: &Path, max_size: u64, keep: Option<&Path>) -> Result<PruneReport> {
    let mut report = PruneReport::default();
    let mut live = Vec::new();
    for (path, info) in entries(dir)? {
        match info {
            Ok(info) if info.source_current => live.push(info),
            Ok(info) => remove(&mut report, &path, info.bytes, "source changed or gone"),
            Err(e) => {
                let bytes = fs::metadata(&path).map_or(0, |m| m.len());
                remove(&mut report, &path, bytes, &format!("unreadable: {e}"));
            }
        }
    }
    live.sort_by_key(|i| i.last_used);
    let mut total: u64 = live.iter().map(|i| i.bytes).sum();
    for info in live {
        if total > max_size && keep != Some(info.path.as_path()) {
            total -= info.bytes;
            remove(&mut report, &info.path, info.bytes, "least recently used");
        } else {
            report.kept += 1;
            report.kept_bytes += info.bytes;
        }
    }
    remove_orphans(dir, &mut report)?;
    Ok(report)
}

fn remove(report: &mut PruneReport, path: &Path, bytes: u64, why: &str) {
    match fs::remove_file(path) {
        Ok(()) => report
            .removed
            .push((path.to_owned(), bytes, why.to_owned())),
        Err(e) => report.failed.push((path.to_owned(), e.to_string())),
    }
}

/// Remove the temporary files that no fill holds and that are old enough
/// to be a killed fill's.
fn remove_orphans(dir: &Path, report: &mut PruneReport) -> Result<()> {
    let read = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("read directory", dir, e)),
    };
    for item in read {
        let path = item
            .map_err(|e| Error::io("read directory", dir, e))?
            .path();
        if !is_temp_name(&file_name(&path)) {
            continue;
        }
        let Ok(file) = File::open(&path) else {
            continue;
        };
        let Ok(meta) = file.metadata() else { continue };
        let age = meta.modified().ok().and_then(|t| t.elapsed().ok());
        // A live fill holds a lock on its file where there are locks.
        let orphan = if LOCKS {
            try_lock(&file).unwrap_or(false)
        } else {
            age.is_some_and(|a| a >= ORPHAN_AGE)
        };
        if orphan {
            remove(report, &path, meta.len(), "a killed fill's temporary file");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_caches_own_names_are_entries_or_temporary_files() {
        let hash = "0123456789abcdef0123456789abcdef";
        assert!(is_entry_name(&format!("{hash}.gguf")));
        assert!(is_temp_name(&format!(".tmp-{hash}-12-0")));
        for other in [
            "model.gguf",
            "default-0123456789abcdef.gguf",
            &format!("{hash}.safetensors"),
        ] {
            assert!(!is_entry_name(other), "{other}");
        }
        assert!(!is_entry_name(&format!("{}.gguf", hash.to_uppercase())));
        assert!(!is_temp_name(".tmp-model"));
        assert!(!is_temp_name(&format!(".tmp-{hash}")));
    }
}
