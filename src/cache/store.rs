//! The cache directory: where entries are, how one is written so that no
//! reader ever sees it torn, how one is opened and checked, and how the
//! directory is kept within its size.
//!
//! The directory is opened once per use ([`PrivateDir`]) and checked
//! through that handle; every entry is then created, opened, renamed and
//! removed relative to it, never by a path that another user could make
//! lead elsewhere. An entry that was opened is used through that open
//! file: a load maps or reads the very file that was checked, and a fill
//! loads the very file it wrote, whatever happens to their names meanwhile.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::buffer::{Buffer, BufferType, CpuBufferType};
use crate::error::{Error, Result};
use crate::loader::{budget, LoadOptions, Weights};
use crate::os::{
    allocate, is_no_space, is_read_only, make_file_private, try_lock, DirRefusal, PrivateDir,
    WritableMap, LOCKS, SUPPORTED,
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

/// The file name of the entry of key `hash`.
pub(crate) fn entry_name(hash: &str) -> OsString {
    format!("{hash}.{ENTRY_EXT}").into()
}

/// A cache directory opened and checked, and what was made private in it.
pub(crate) type OpenedDir = (Arc<PrivateDir>, Option<String>);

/// The cache directory at `path`, opened and checked; created (private to
/// this user) when `create`. `None` when it does not exist.
pub(crate) fn open_dir(
    path: &Path,
    create: bool,
) -> std::result::Result<Option<OpenedDir>, CacheBypass> {
    if !SUPPORTED {
        return Err(CacheBypass::Unsupported);
    }
    match PrivateDir::open(path, create) {
        Ok((dir, note)) => Ok(Some((Arc::new(dir), note))),
        Err(DirRefusal::Missing) => Ok(None),
        Err(DirRefusal::Unsafe(problem)) => Err(CacheBypass::UnsafeDirectory {
            dir: path.to_owned(),
            problem,
        }),
        Err(DirRefusal::Io(op, e)) => Err(refusal(path, op, &e, 0)),
    }
}

/// The cache directory at `path` for listing and housekeeping: `None`
/// when it does not exist; an error naming the problem when it is unsafe.
pub(crate) fn open_existing(path: &Path) -> Result<Option<Arc<PrivateDir>>> {
    match open_dir(path, false) {
        Ok(found) => Ok(found.map(|(dir, _)| dir)),
        Err(why) => Err(Error::io(
            "open cache directory",
            path,
            io::Error::new(io::ErrorKind::PermissionDenied, why.to_string()),
        )),
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

/// An entry opened and checked in full, then loaded from that open file.
pub(crate) struct OpenEntry {
    pub weights: Weights,
    pub file: File,
    pub path: PathBuf,
}

/// What a lookup found under an entry's name.
// Made once per lookup and matched at once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Opened {
    /// A valid entry, loaded.
    Entry(OpenEntry),
    /// No file.
    Missing,
    /// A file that is not a usable entry, and why (it will be replaced).
    Unusable(String),
}

/// Open, check and load the entry of `key` in `dir`.
///
/// # Safety
/// As `Weights::load`: nothing truncates or modifies the entry while the
/// weights live.
///
/// # Errors
/// The load's own error, when the entry is valid but cannot be loaded
/// with `options` (a budget, a cancelled progress callback, a device that
/// is full): the caller's, as for any model, and no reason to rewrite it.
pub(crate) unsafe fn open_entry(
    dir: &PrivateDir,
    key: &SourceKey,
    options: &LoadOptions,
) -> Result<Opened> {
    let name = entry_name(&key.hash);
    let path = dir.path().join(&name);
    let file = match dir.open_file(&name, false) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Opened::Missing),
        Err(e) => return Ok(Opened::Unusable(e.to_string())),
    };
    // Entries of versions that made them readable by others become private.
    let _ = make_file_private(&file);
    let Some(header) = entry::identify(&file, &path, &key.hash) else {
        let why = "not a cache entry (its key is not its name's)";
        return Ok(Opened::Unusable(why.into()));
    };
    // Checked through reads of the file, never a mapping: a disk's read
    // error is then an error the entry is rebuilt for, not a SIGBUS that
    // kills the process. The pages read are the page cache's, the same
    // ones a mapped load then uses.
    if let Err(problem) = entry::check(&file, &header, Some(&key.text)) {
        return Ok(Opened::Unusable(problem.to_string()));
    }
    // Valid, so an error here is the options': the caller's.
    // SAFETY: the caller's contract.
    let weights = unsafe { load_open(&file, &path, options) }?;
    touch(dir, &name, &file);
    Ok(Opened::Entry(OpenEntry {
        weights,
        file,
        path,
    }))
}

/// Load the entry open as `file` (at `path`, for the report) with
/// `options`.
///
/// # Safety
/// As `Weights::load`.
pub(crate) unsafe fn load_open(file: &File, path: &Path, options: &LoadOptions) -> Result<Weights> {
    let len = file
        .metadata()
        .map_err(|e| Error::io("stat", path, e))?
        .len();
    // SAFETY: the caller's contract.
    unsafe { Weights::load_file_range(file, 0, len, options) }
}

/// Mark the entry `name`, open as `file`, as just used (its modification
/// time), for pruning the least recently used first. Best effort: a
/// read-only cache is still read.
fn touch(dir: &PrivateDir, name: &OsStr, file: &File) {
    let now = SystemTime::now();
    // Unix sets an owner's file times through any handle of it; Windows
    // only through one that may write them.
    if file.set_modified(now).is_err() {
        if let Ok(f) = dir.open_file(name, true) {
            let _ = f.set_modified(now);
        }
    }
}

/// Why an entry was not written.
pub(crate) enum Unwritten {
    /// The cache cannot take it: transform in memory instead.
    Bypass(CacheBypass),
    /// The transform failed: the load fails.
    Failed(Error),
}

/// A fill's temporary file, written whole, its bytes not yet known to be
/// on the disk nor renamed into place. Dropped before it is committed, it
/// is removed.
pub(crate) struct Filled {
    dir: Arc<PrivateDir>,
    name: OsString,
    path: PathBuf,
    file: File,
    len: u64,
    committed: bool,
}

impl Drop for Filled {
    fn drop(&mut self) {
        if !self.committed {
            let _ = self.dir.remove(&self.name);
        }
    }
}

impl Filled {
    /// The temporary file's path: its bytes are the entry's, and stay so
    /// once it is renamed.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file itself, open: map or read this, not the path, which a
    /// commit renames and a prune may remove.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The directory it is in.
    pub(crate) fn dir(&self) -> &Arc<PrivateDir> {
        &self.dir
    }
}

/// Write the entry `layout` describes into a new temporary file in `dir`:
/// created (0600, never through a link), locked, its blocks allocated,
/// written from the bytes `contents` holds (past the page cache where the
/// system can) or through a shared mapping whose writes are then started
/// towards the disk. [`commit`] finishes.
pub(crate) fn fill_temp(
    dir: &Arc<PrivateDir>,
    key: &SourceKey,
    layout: &Layout,
    contents: &mut dyn EntryContents,
) -> std::result::Result<Filled, Unwritten> {
    let bypass = |op, e: &io::Error| Unwritten::Bypass(refusal(dir.path(), op, e, layout.len));
    let (name, file) = create_locked(dir, &key.hash).map_err(|e| bypass("create", &e))?;
    let mut filled = Filled {
        dir: dir.clone(),
        path: dir.path().join(&name),
        name,
        file,
        len: layout.len,
        committed: false,
    };
    allocate(&mut filled.file, layout.len).map_err(|e| bypass("allocate", &e))?;
    match layout.write_held(key, contents, &filled.file) {
        Some(written) => written.map_err(|e| bypass("write", &e))?,
        None => {
            // SAFETY: the file was created just now (O_EXCL) under a name no
            // other process uses, in a directory only this user can write,
            // and its blocks are allocated: nothing truncates it or writes
            // it under the map, and a full disk cannot fault a write
            // through it.
            let mut map =
                unsafe { WritableMap::new(&filled.file) }.map_err(|e| bypass("map", &e))?;
            layout
                .write(key, contents, map.bytes_mut())
                .map_err(Unwritten::Failed)?;
            map.start_flush().map_err(|e| bypass("flush", &e))?;
        }
    }
    Ok(filled)
}

/// A temporary file's name for key `hash`, unique to this process.
fn temp_name(hash: &str) -> OsString {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{TMP_PREFIX}{hash}-{}-{seq}", std::process::id()).into()
}

/// How many times a fill makes a new temporary file after a housekeeper
/// took the last one, and how long it waits for one to let go of a lock.
const CREATE_TRIES: usize = 4;
const LOCK_WAIT: Duration = Duration::from_millis(500);

/// Take `file`'s lock, waiting up to [`LOCK_WAIT`] for a housekeeper that
/// holds it (one does only between its own lock and its removal of the
/// file). `false` when it was not had.
fn lock_within_wait(file: &File) -> io::Result<bool> {
    let start = std::time::Instant::now();
    loop {
        if try_lock(file)? {
            return Ok(true);
        }
        if start.elapsed() >= LOCK_WAIT {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A new temporary file for key `hash` in `dir`, created (0600, never
/// through a link) and locked, so that no housekeeper takes it for a
/// killed fill's. No call creates a file locked, so there is a moment
/// between the two in which a housekeeper may find it unlocked and remove
/// it; the name is therefore checked, once the lock is held, to still be
/// this file, and a file lost that way costs a new name, never the fill.
/// Where there are no locks, housekeepers go by age instead.
fn create_locked(dir: &PrivateDir, hash: &str) -> io::Result<(OsString, File)> {
    for _ in 0..CREATE_TRIES {
        let name = temp_name(hash);
        let file = dir.create_new(&name)?;
        #[cfg(test)]
        tests::between_create_and_lock(dir);
        if LOCKS && !lock_within_wait(&file)? {
            // A housekeeper holds it, and is removing it.
            continue;
        }
        match dir.holds(&name, &file) {
            Ok(true) => return Ok((name, file)),
            Ok(false) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(
        "every temporary file made was removed at once by a housekeeper",
    ))
}

/// Make `filled` the entry of `key`: fsync it, check that the source did
/// not change while it was made (nor, with `check_path`, its path lead
/// anywhere else: the contents were read by it), rename it over the
/// entry's name, and
/// fsync the directory. Returns the entry's path and the file written,
/// which the caller loads: whatever happens to the name afterwards (a
/// prune, a `cache clear`, another fill's rename), that file keeps the
/// bytes.
pub(crate) fn commit(
    mut filled: Filled,
    key: &SourceKey,
    check_path: bool,
) -> std::result::Result<(PathBuf, File), Unwritten> {
    let dir = filled.dir.clone();
    let bypass = |op, e: &io::Error| Unwritten::Bypass(refusal(dir.path(), op, e, filled.len));
    filled.file.sync_all().map_err(|e| bypass("fsync", &e))?;
    if !key.unchanged() {
        return Err(Unwritten::Bypass(CacheBypass::SourceChanged {
            path: key.path.clone(),
        }));
    }
    if let (true, Err(problem)) = (check_path, key.path_unmoved()) {
        return Err(Unwritten::Bypass(CacheBypass::SourcePathChanged {
            path: key.path.clone(),
            problem,
        }));
    }
    let name = entry_name(&key.hash);
    let path = dir.path().join(&name);
    if let Err(e) = dir.rename(&filled.name, &name) {
        // Windows refuses to replace a file another process has mapped:
        // when that file is this key's entry, another fill won the race,
        // and its entry serves; this process keeps the bytes it wrote.
        let theirs = dir.open_file(&name, false);
        return match theirs {
            Ok(f) if entry::has_key(&f, &path, &key.text) => {
                let file = filled.file.try_clone().map_err(|e| bypass("open", &e))?;
                Ok((path, file))
            }
            _ => Err(bypass("rename", &e)),
        };
    }
    filled.committed = true;
    dir.sync().map_err(|e| bypass("fsync", &e))?;
    let file = filled.file.try_clone().map_err(|e| bypass("open", &e))?;
    Ok((path, file))
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
        &budget::current(options, 0),
        options,
    )?;
    let len = usize::try_from(layout.len).map_err(|_| Error::OutOfMemory {
        bytes: layout.len,
        what: "the transformed tensors",
    })?;
    let mut buffer = host_buffer(options, len)?;
    // Never empty: `host_buffer` gives a buffer that shows its bytes.
    layout.write(key, contents, buffer.host_bytes_mut().unwrap_or_default())?;
    Weights::from_memory(InMemoryEntry(buffer), options)
}

/// `len` bytes of host memory as the caller's options ask: from their
/// buffer type when it is the host's (its alignment and huge-page switch
/// hold), else a CPU buffer of its alignment.
fn host_buffer(options: &LoadOptions, len: usize) -> Result<Box<dyn Buffer>> {
    let bt = &options.buffer_type;
    let mut buffer = match bt.is_host() {
        true => bt.alloc_buffer_to_fill(len)?,
        false => CpuBufferType::with_alignment(bt.alignment())?.alloc_buffer_to_fill(len)?,
    };
    match buffer.host_bytes_mut().is_some() {
        true => Ok(buffer),
        // A host type whose buffers do not show their bytes.
        false => CpuBufferType::with_alignment(bt.alignment())?.alloc_buffer_to_fill(len),
    }
}

/// An entry's bytes in memory.
struct InMemoryEntry(Box<dyn Buffer>);

impl AsRef<[u8]> for InMemoryEntry {
    fn as_ref(&self) -> &[u8] {
        self.0.host_bytes().unwrap_or_default()
    }
}

/// One entry found in the directory: its name, file and header.
struct Found {
    name: OsString,
    path: PathBuf,
    file: File,
    header: crate::format::Header,
    bytes: u64,
    modified: SystemTime,
}

/// Every entry in `dir` by its contents ([`entry::identify`]): a regular
/// file of this user's, named `<32 hex digits>.gguf`, whose stored key
/// hashes to that name. Nothing else is listed, opened past its first
/// bytes, or ever removed; a FIFO, a device or a link is never opened.
fn found(dir: &PrivateDir) -> Result<Vec<Found>> {
    let files = dir
        .files()
        .map_err(|e| Error::io("read directory", dir.path(), e))?;
    let mut out = Vec::new();
    for (name, bytes, modified) in files {
        let Some(hash) = name.to_str().and_then(entry_hash) else {
            continue;
        };
        let path = dir.path().join(&name);
        let Ok(file) = dir.open_file(&name, false) else {
            continue;
        };
        if let Some(header) = entry::identify(&file, &path, hash) {
            out.push(Found {
                name,
                path,
                file,
                header,
                bytes,
                modified,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Every entry in `dir`, with its header's account (or why it has none).
pub(crate) fn entries(dir: &PrivateDir) -> Result<Vec<(PathBuf, Result<EntryInfo>)>> {
    Ok(found(dir)?
        .into_iter()
        .map(|f| {
            let info = EntryInfo::of(&f.header, f.path.clone(), f.bytes, f.modified);
            (f.path, info)
        })
        .collect())
}

/// Every check of every entry in `dir`, every byte of it: each entry's
/// path and what is wrong with it.
pub(crate) fn verify(dir: &PrivateDir) -> Result<Vec<(PathBuf, std::result::Result<(), String>)>> {
    Ok(found(dir)?
        .into_iter()
        .map(|f| {
            let verdict = entry::check(&f.file, &f.header, None).map_err(|p| p.to_string());
            (f.path, verdict)
        })
        .collect())
}

/// The error of a removal of `path`, which is not an entry of the cache.
pub(crate) fn not_an_entry(path: &Path) -> Error {
    let e = io::Error::new(io::ErrorKind::NotFound, "not an entry of this cache");
    Error::io("remove", path, e)
}

/// Remove the entry at `path` from `dir` if it fails its check; `true`
/// when it was removed. `NotFound` unless it is an entry of `dir` by its
/// contents. The file is first moved aside, locked, under a temporary
/// name (which no lookup reads and no fill or housekeeper takes), and
/// checked there: so the file removed is the one found bad, never a good
/// entry a fill renamed over it after it was found. One that passes (that
/// good entry) is put back, unless another has taken its name meanwhile.
pub(crate) fn remove_bad(dir: &PrivateDir, path: &Path) -> Result<bool> {
    let not_ours = || not_an_entry(path);
    if path.parent() != Some(dir.path()) {
        return Err(not_ours());
    }
    let name = path.file_name().ok_or_else(not_ours)?;
    let hash = name.to_str().and_then(entry_hash).ok_or_else(not_ours)?;
    let file = dir.open_file(name, false).map_err(|_| not_ours())?;
    let header = entry::identify(&file, path, hash).ok_or_else(not_ours)?;
    let io_err = |e| Error::io("remove", path, e);
    if LOCKS && !lock_within_wait(&file).map_err(io_err)? {
        return Ok(false);
    }
    let aside = temp_name(hash);
    match dir.rename(name, &aside) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        r => r.map_err(io_err)?,
    }
    let bad =
        dir.holds(&aside, &file).map_err(io_err)? && entry::check(&file, &header, None).is_err();
    if !bad {
        // `link` never replaces: a newer entry under the name stays.
        let _ = dir.link(&aside, name);
    }
    dir.remove(&aside).map_err(io_err)?;
    Ok(bad)
}

/// The key hash of an entry's file name: 32 lowercase hex digits, then
/// `.gguf`.
fn entry_hash(name: &str) -> Option<&str> {
    name.strip_suffix(&format!(".{ENTRY_EXT}"))
        .filter(|h| is_key_hash(h))
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

/// Remove from `dir` the entries whose source changed, those whose header
/// lacks a field, then the least recently used until at most `max_size`
/// bytes remain (never `keep`), and the temporary files of killed fills.
pub(crate) fn prune(dir: &PrivateDir, max_size: u64, keep: Option<&Path>) -> Result<PruneReport> {
    let mut report = PruneReport::default();
    let mut live = Vec::new();
    for f in found(dir)? {
        match EntryInfo::of(&f.header, f.path.clone(), f.bytes, f.modified) {
            Ok(info) if info.source_current => live.push((f.name, info)),
            Ok(info) => remove(
                dir,
                &mut report,
                &f.name,
                &info.path,
                info.bytes,
                "source changed or gone",
            ),
            Err(e) => remove(
                dir,
                &mut report,
                &f.name,
                &f.path,
                f.bytes,
                &format!("unreadable: {e}"),
            ),
        }
    }
    live.sort_by_key(|(_, i)| i.last_used);
    let mut total: u64 = live.iter().map(|(_, i)| i.bytes).sum();
    for (name, info) in live {
        if total > max_size && keep != Some(info.path.as_path()) {
            total -= info.bytes;
            remove(
                dir,
                &mut report,
                &name,
                &info.path,
                info.bytes,
                "least recently used",
            );
        } else {
            report.kept += 1;
            report.kept_bytes += info.bytes;
        }
    }
    remove_orphans(dir, &mut report)?;
    Ok(report)
}

fn remove(
    dir: &PrivateDir,
    report: &mut PruneReport,
    name: &OsStr,
    path: &Path,
    bytes: u64,
    why: &str,
) {
    match dir.remove(name) {
        Ok(()) => report
            .removed
            .push((path.to_owned(), bytes, why.to_owned())),
        // Another housekeeper removed it first: what was wanted is done,
        // and it is that one's to report.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => report.failed.push((path.to_owned(), e.to_string())),
    }
}

/// Remove the temporary files that no fill holds and that are old enough
/// to be a killed fill's.
fn remove_orphans(dir: &PrivateDir, report: &mut PruneReport) -> Result<()> {
    let files = dir
        .files()
        .map_err(|e| Error::io("read directory", dir.path(), e))?;
    for (name, bytes, modified) in files {
        if !name.to_str().is_some_and(is_temp_name) {
            continue;
        }
        let Ok(file) = dir.open_file(&name, false) else {
            continue;
        };
        let age = modified.elapsed().ok();
        // A live fill holds a lock on its file where there are locks.
        let orphan = if LOCKS {
            try_lock(&file).unwrap_or(false)
        } else {
            age.is_some_and(|a| a >= ORPHAN_AGE)
        };
        if orphan {
            let path = dir.path().join(&name);
            remove(
                dir,
                report,
                &name,
                &path,
                bytes,
                "a killed fill's temporary file",
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A host buffer type that counts its buffers, over the CPU's.
    #[derive(Debug)]
    struct Counting(CpuBufferType, AtomicUsize);

    impl BufferType for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn alignment(&self) -> usize {
            self.0.alignment()
        }
        fn is_host(&self) -> bool {
            true
        }
        fn alloc_buffer(&self, size: usize) -> Result<Box<dyn Buffer>> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.alloc_buffer(size)
        }
    }

    #[test]
    fn an_entry_in_memory_is_made_by_the_callers_host_buffer_type() {
        let bt = Arc::new(Counting(
            CpuBufferType::with_alignment(4096)
                .unwrap()
                .huge_pages(false),
            AtomicUsize::new(0),
        ));
        let options = LoadOptions::default().buffer_type(bt.clone());
        let buffer = host_buffer(&options, 1 << 20).unwrap();
        assert_eq!(bt.1.load(Ordering::SeqCst), 1);
        assert_eq!(buffer.host_bytes().unwrap().len(), 1 << 20);
        assert_eq!(buffer.host_bytes().unwrap().as_ptr() as usize % 4096, 0);
    }

    thread_local! {
        /// What a test runs between a fill's creation of its temporary
        /// file and its lock: a housekeeper's turn, in the worst place.
        static HOUSEKEEPER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    pub(super) fn between_create_and_lock(dir: &PrivateDir) {
        if HOUSEKEEPER.replace(false) {
            let report = prune(dir, u64::MAX, None).unwrap();
            // Where files are locked, the fill's is not yet: the
            // housekeeper takes it. Where they are not (Windows), a file
            // held open cannot be removed, and the housekeeper leaves it.
            let expected = usize::from(crate::os::LOCKS);
            assert_eq!(
                report.removed.len(),
                expected,
                "the housekeeper did not find the fill's file as expected"
            );
        }
    }

    /// A planned entry of one 64 KiB F32 tensor, and its contents.
    struct Ones;

    impl EntryContents for Ones {
        fn tensors(&self) -> Vec<crate::cache::PlannedTensor> {
            let ty = crate::TensorType::F32;
            vec![crate::cache::PlannedTensor {
                name: "w".into(),
                ty,
                ne: vec![16384],
            }]
        }
        fn fill(&mut self, _: usize, dst: &mut [u8]) -> std::result::Result<(), String> {
            dst.fill(1);
            Ok(())
        }
    }

    /// Break 2 of the second review: a prune (`cache clear`) that runs
    /// between a fill's creation of its temporary file and its lock finds
    /// the file unlocked. The fill must still be stored.
    #[test]
    fn a_housekeeper_between_create_and_lock_loses_no_fill() {
        let tmp = tempfile::tempdir().unwrap();
        let model = tmp.path().join("m.gguf");
        let mut w = crate::gguf::Writer::new(32);
        w.tensor("w", crate::TensorType::F32, &[4], vec![0; 16]);
        w.write_with(File::create(&model).unwrap(), |_, _| {})
            .unwrap();
        let (dir, _) = open_dir(&tmp.path().join("cache"), true).unwrap().unwrap();
        let key = SourceKey::of(&model, &crate::cache::TransformId::new("ones", 1)).unwrap();
        let layout = Layout::plan(&key, &crate::cache::TransformId::new("ones", 1), &Ones).unwrap();
        HOUSEKEEPER.set(true);
        let filled = fill_temp(&dir, &key, &layout, &mut Ones);
        assert!(!HOUSEKEEPER.get(), "the housekeeper did not run");
        let Ok(filled) = filled else {
            panic!("the fill was refused")
        };
        assert!(
            commit(filled, &key, false).is_ok(),
            "the fill's file was removed under it"
        );
        assert!(dir.open_file(&entry_name(&key.hash), false).is_ok());
    }

    /// Break 3 of the second review: a file another housekeeper removed
    /// first is no failure.
    #[test]
    fn a_file_already_gone_is_no_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, _) = open_dir(tmp.path(), false).unwrap().unwrap();
        let mut report = PruneReport::default();
        let name = OsStr::new("0123456789abcdef0123456789abcdef.gguf");
        remove(&dir, &mut report, name, &tmp.path().join(name), 1, "test");
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        assert!(report.removed.is_empty(), "{:?}", report.removed);
    }

    #[test]
    fn only_the_caches_own_names_are_entries_or_temporary_files() {
        let hash = "0123456789abcdef0123456789abcdef";
        assert_eq!(entry_hash(&format!("{hash}.gguf")), Some(hash));
        assert!(is_temp_name(&format!(".tmp-{hash}-12-0")));
        for other in [
            "model.gguf",
            "default-0123456789abcdef.gguf",
            &format!("{hash}.safetensors"),
        ] {
            assert!(entry_hash(other).is_none(), "{other}");
        }
        assert!(entry_hash(&format!("{}.gguf", hash.to_uppercase())).is_none());
        assert!(!is_temp_name(".tmp-model"));
        assert!(!is_temp_name(&format!(".tmp-{hash}")));
    }
}
