//! A cache of transformed tensors, in files that later loads map like any
//! weights.
//!
//! A runtime that dequantizes, repacks, permutes or promotes weights after
//! loading them puts every transformed tensor in anonymous memory: charged
//! to the process, never dropped by the kernel, built again in every
//! process and on every start. Through the cache the transform runs once;
//! its output goes to an entry file, and every load after that maps the
//! entry read-only: file-backed pages, shared by every process that maps
//! them, and a start that reads no more than the weights it uses.
//!
//! ```
//! use weightmap::cache::{Cache, CacheOutcome, Transform};
//! use weightmap::{gguf::Writer, LoadOptions, TensorType};
//! # fn main() -> weightmap::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let model = dir.path().join("model.gguf");
//! # let mut w = Writer::new(32);
//! # w.tensor("w", TensorType::F32, &[4], 2.0f32.to_le_bytes().repeat(4));
//! # w.write_with(std::fs::File::create(&model).unwrap(), |_, _| {}).unwrap();
//! // Doubles every F32 tensor (a stand-in for a repack or a dequantization).
//! let double = Transform::new("double", 1, |_info, src, dst| {
//!     for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
//!         let x = 2.0 * f32::from_le_bytes(s.try_into().unwrap());
//!         d.copy_from_slice(&x.to_le_bytes());
//!     }
//!     Ok(())
//! });
//! let cache = Cache::at(dir.path().join("cache"));
//!
//! // SAFETY: nothing modifies or truncates the model or the cache's
//! // entries while the weights live.
//! let first = unsafe { cache.load(&model, &double, &LoadOptions::default())? };
//! assert_eq!(first.report().outcome, CacheOutcome::Filled);
//! assert_eq!(first.weights().tensor("w")?.view::<f32>()?, &[4.0; 4]);
//!
//! // The next load, in this process or another, maps the entry.
//! let second = unsafe { cache.load(&model, &double, &LoadOptions::default())? };
//! assert_eq!(second.report().outcome, CacheOutcome::Hit);
//! assert_eq!(second.weights().tensor("w")?.view::<f32>()?, &[4.0; 4]);
//! # Ok(()) }
//! ```
//!
//! The rules (ARCHITECTURE.md, "The transform cache"):
//!
//! - **Keys**: the source's identity and a cheap fingerprint of
//!   it, the transform's name, version and machine facts. A stale entry
//!   is never found.
//! - **Writes**: a fresh temporary file in the cache directory, its blocks
//!   allocated first, written through a shared mapping, fsynced, renamed
//!   into place, and the directory fsynced. Two processes filling one
//!   entry each rename a whole file; one killed leaves only a temporary
//!   file, which no load reads and `prune` removes.
//! - **Reads**: an entry is a GGUF file, opened once (never through a
//!   link, never a FIFO or a device); its key, the header's checksum and
//!   every byte of every tensor are checked from that open file, which is
//!   then loaded like any model, in any mode and into any buffer type. One
//!   that fails is replaced.
//! - **Where**: `$WEIGHTMAP_CACHE_DIR`, else `$XDG_CACHE_HOME/weightmap`,
//!   else `~/.cache/weightmap` (Windows: `%LOCALAPPDATA%\weightmap`); at
//!   most `$WEIGHTMAP_CACHE_MAX_SIZE` bytes (default 16 GiB), the least
//!   recently used entries pruned first. The directory is opened once and
//!   every file in it reached through that handle; a directory another
//!   user owns or can write, or whose path another user could redirect,
//!   is refused, and one others can only read is made private. Entries are
//!   the user's alone (0600). Whenever the cache cannot serve, the
//!   transform runs in memory and the report says why.

mod entry;
mod key;
mod report;
mod store;
mod transform;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

pub use crate::size::parse_size;
pub use entry::EntryInfo;
pub use key::TransformId;
pub use report::{CacheBypass, CacheOutcome, CacheReport};
pub use store::PruneReport;
pub use transform::{EntryContents, PlannedTensor, Transform};

use crate::buffer::CpuBufferType;
use crate::error::Result;
use crate::loader::{LoadOptions, Weights};
use crate::os::PrivateDir;
use key::SourceKey;

/// The variable that sets the user's cache's size limit.
const MAX_SIZE_VAR: &str = "WEIGHTMAP_CACHE_MAX_SIZE";

/// A cache directory and its size limit. Cheap to make: nothing is read or
/// created until a load needs it.
#[derive(Clone, Debug)]
pub struct Cache {
    /// The directory, or why there is none.
    dir: std::result::Result<PathBuf, CacheBypass>,
    /// The size limit, or why `$WEIGHTMAP_CACHE_MAX_SIZE` gives none.
    max_size: std::result::Result<u64, CacheBypass>,
}

/// The transformed tensors of a cached load, and what the cache did.
#[derive(Debug)]
pub struct Cached {
    weights: Weights,
    report: CacheReport,
    /// The entry's file, open: what was checked and loaded.
    file: Option<File>,
}

impl Cached {
    /// The transformed tensors: an entry's mapped tensors, or (when the
    /// cache could not serve) the transform's output in memory.
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// The weights, keeping nothing else.
    pub fn into_weights(self) -> Weights {
        self.weights
    }

    /// Hit, filled or in memory, and why.
    pub fn report(&self) -> &CacheReport {
        &self.report
    }

    /// The entry's file, open (`None` in memory): the very file that was
    /// checked and loaded. A caller that maps the entry again (Python's
    /// copy-on-write tensors, say) maps this, never the entry's path,
    /// which another fill may rename over or a prune remove meanwhile.
    pub fn entry_file(&self) -> Option<&File> {
        self.file.as_ref()
    }
}

impl Default for Cache {
    fn default() -> Self {
        Cache::new()
    }
}

impl Cache {
    /// The default size limit: 16 GiB.
    pub const DEFAULT_MAX_SIZE: u64 = 16 << 30;

    /// The user's cache: `$WEIGHTMAP_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/weightmap`, else `~/.cache/weightmap` (Windows:
    /// `%LOCALAPPDATA%\weightmap`), with `$WEIGHTMAP_CACHE_MAX_SIZE` (a
    /// byte count such as `20G`, [`parse_size`]) as its limit. With no
    /// directory to be had, every load runs in memory
    /// ([`CacheBypass::NoDirectory`]). A limit that is not a byte count is
    /// [`CacheBypass::InvalidMaxSize`]: hits still serve, but nothing is
    /// written (no limit could be kept), and [`Cache::limit`] says why.
    pub fn new() -> Cache {
        Cache {
            dir: default_dir().ok_or(CacheBypass::NoDirectory),
            max_size: max_size_from_env(),
        }
    }

    /// A cache in `dir` (created on first use), with the default limit.
    pub fn at(dir: impl Into<PathBuf>) -> Cache {
        Cache {
            dir: Ok(dir.into()),
            max_size: Ok(Cache::DEFAULT_MAX_SIZE),
        }
    }

    /// The same cache's limit (and any problem with it), in `dir`: the
    /// user's limit for a directory of the caller's.
    pub fn in_dir(mut self, dir: impl Into<PathBuf>) -> Cache {
        self.dir = Ok(dir.into());
        self
    }

    /// No cache: every load transforms into memory
    /// ([`CacheBypass::Off`]), for a runtime's switch or a baseline.
    pub fn off() -> Cache {
        Cache {
            dir: Err(CacheBypass::Off),
            max_size: Ok(0),
        }
    }

    /// The same cache, holding at most `bytes` (pruned after each fill).
    pub fn max_size(mut self, bytes: u64) -> Cache {
        self.max_size = Ok(bytes);
        self
    }

    /// The directory, if there is one.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref().ok()
    }

    /// The size limit, or why there is none
    /// ([`CacheBypass::InvalidMaxSize`]).
    ///
    /// # Errors
    /// The [`CacheBypass`] naming the variable, its value and what is wrong.
    pub fn limit(&self) -> std::result::Result<u64, &CacheBypass> {
        self.max_size.as_ref().copied()
    }

    /// `transform` of the model at `source`: mapped from its entry if the
    /// cache holds a valid one; else transformed into a new entry, which is
    /// then mapped; else, when the cache cannot be written, transformed
    /// into memory. The report says which, and why.
    ///
    /// A hit reads the source's header and a few KiB of each tensor, never
    /// the whole source, and checks every byte of the entry against its
    /// checksums before it returns. On a miss the source is loaded with `options` and
    /// the transform reads it; either way the transformed tensors load
    /// with `options` (mode, prefetch, buffer types).
    ///
    /// # Safety
    /// As [`Weights::load`]: nothing may modify or truncate the source, or
    /// the cache's entries, while the weights live. weightmap itself only
    /// ever renames a whole entry over another or removes one, which leaves
    /// a live mapping intact.
    ///
    /// # Errors
    /// The source's own (unreadable, invalid), the transform's
    /// ([`crate::Error::Transform`]), and a load's. Never the cache's: a
    /// cache that cannot serve is a [`CacheBypass`] in the report.
    pub unsafe fn load(
        &self,
        source: impl AsRef<Path>,
        transform: &Transform<'_>,
        options: &LoadOptions,
    ) -> Result<Cached> {
        // SAFETY: the caller's contract, passed on.
        let mut miss = match unsafe { self.lookup(source, &transform.id(), options)? } {
            Lookup::Hit(cached) => return Ok(cached),
            Lookup::Miss(miss) => miss,
        };
        // The transform reads the very file the key was made from, opened
        // once by the lookup: whatever the path names meanwhile (a link
        // flipped by a deploy, a directory swapped), the entry holds the
        // transform of the file its key names.
        miss.read_by_path = false;
        let file = miss.key.file.clone();
        let len = file
            .metadata()
            .map_err(|e| crate::error::Error::io("stat", &miss.key.path, e))?
            .len();
        // The transform reads the source's bytes on the host, whatever
        // buffer type the transformed tensors go to.
        // SAFETY: the caller's contract covers the source.
        let src = unsafe { Weights::load_file_range(&file, 0, len, &host_options(options))? };
        let mut contents = transform.contents(&src)?;
        // SAFETY: the caller's contract, passed on.
        unsafe { miss.store(&mut contents, options) }
    }

    /// The entry of transform `id` of `source`, if the cache holds a valid
    /// one: the first half of [`Cache::load`], for an entry that is not one
    /// output per source tensor (a whole converted state dict with its
    /// configuration as metadata, say). On a [`Lookup::Miss`], make its
    /// [`EntryContents`] and hand them to [`Miss::store`], which writes
    /// and loads the entry; or, to map the entry's bytes at once and keep
    /// them in memory yourself when the cache cannot take them, to
    /// [`Miss::prepare`], then [`PendingEntry::commit`].
    ///
    /// ```
    /// use weightmap::cache::{Cache, EntryContents, Lookup, PlannedTensor, TransformId};
    /// use weightmap::{gguf::Writer, LoadOptions, TensorType};
    /// # fn main() -> weightmap::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let model = dir.path().join("model.gguf");
    /// # let mut w = Writer::new(32);
    /// # w.tensor("w", TensorType::F32, &[4], 2.0f32.to_le_bytes().repeat(4));
    /// # w.write_with(std::fs::File::create(&model).unwrap(), |_, _| {}).unwrap();
    /// struct Ones;
    /// impl EntryContents for Ones {
    ///     fn tensors(&self) -> Vec<PlannedTensor> {
    ///         vec![PlannedTensor { name: "ones".into(), ty: TensorType::F32, ne: vec![2] }]
    ///     }
    ///     fn fill(&mut self, _: usize, dst: &mut [u8]) -> Result<(), String> {
    ///         dst.copy_from_slice(&1.0f32.to_le_bytes().repeat(2));
    ///         Ok(())
    ///     }
    /// }
    /// let cache = Cache::at(dir.path().join("cache"));
    /// let id = TransformId::new("ones", 1);
    /// let opts = LoadOptions::default();
    /// // SAFETY: nothing modifies the model or the entries meanwhile.
    /// let cached = match unsafe { cache.lookup(&model, &id, &opts)? } {
    ///     Lookup::Hit(cached) => cached,
    ///     Lookup::Miss(miss) => unsafe { miss.store(&mut Ones, &opts)? },
    /// };
    /// assert_eq!(cached.weights().tensor("ones")?.view::<f32>()?, &[1.0, 1.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// As [`Cache::load`].
    ///
    /// # Errors
    /// The source's own (unreadable, invalid), and the load's own error on
    /// a valid entry (a budget, a cancelled progress callback: what loading
    /// any model with `options` could give).
    pub unsafe fn lookup(
        &self,
        source: impl AsRef<Path>,
        id: &TransformId,
        options: &LoadOptions,
    ) -> Result<Lookup> {
        let started = Instant::now();
        let key = SourceKey::of(source.as_ref(), id)?;
        let (dir, made_private) = match self.usable_dir() {
            Ok((dir, note)) => (Ok(dir), note),
            Err(why) => (Err(why), None),
        };
        let mut replaced = None;
        if let Ok(dir) = &dir {
            // SAFETY: the caller's contract covers the cache's entries.
            match unsafe { store::open_entry(dir, &key, options)? } {
                store::Opened::Entry(found) => {
                    let report = CacheReport {
                        outcome: CacheOutcome::Hit,
                        entry: Some(found.path),
                        key: key.hash,
                        replaced: None,
                        made_private,
                        elapsed: started.elapsed(),
                    };
                    return Ok(Lookup::Hit(Cached {
                        weights: found.weights,
                        report,
                        file: Some(found.file),
                    }));
                }
                store::Opened::Missing => {}
                store::Opened::Unusable(problem) => replaced = Some(problem),
            }
        }
        // A fill needs a limit to keep: without one, nothing is written.
        let fill = match (dir, &self.max_size) {
            (Ok(dir), Ok(max_size)) => Ok((dir, *max_size)),
            (Ok(_), Err(why)) => Err(why.clone()),
            (Err(why), _) => Err(why),
        };
        Ok(Lookup::Miss(Miss {
            key,
            id: id.clone(),
            read_by_path: true,
            fill,
            replaced,
            made_private,
            started,
        }))
    }

    /// The directory, opened (created if missing) and checked, if it may
    /// be used, and what was made private.
    fn usable_dir(&self) -> Result<store::OpenedDir, CacheBypass> {
        let path = self.dir.as_ref().map_err(Clone::clone)?;
        let opened = store::open_dir(path, true)?;
        // Created when missing: `None` only if it vanished in between.
        opened.ok_or_else(|| CacheBypass::Io {
            dir: path.clone(),
            op: "open",
            error: "the directory vanished as it was created".into(),
        })
    }

    /// The directory as it is, for listing and housekeeping: `None` when
    /// there is none; an error when it may not be used.
    fn existing_dir(&self) -> Result<Option<Arc<PrivateDir>>> {
        match self.dir() {
            Some(path) => store::open_existing(path),
            None => Ok(None),
        }
    }

    /// Every entry, with what its header says or why it cannot be read.
    /// An entry is a regular file of this user's whose stored key hashes to
    /// its name; nothing else in the directory is listed (a model that
    /// happens to be named like one, a FIFO), nor are the temporary files
    /// of fills under way (or killed).
    ///
    /// # Errors
    /// [`crate::Error::Io`] when the directory cannot be read, or may not be
    /// used (the same rules as a load's: `PermissionDenied`, naming the
    /// problem); none when it does not exist (no entries).
    pub fn entries(&self) -> Result<Vec<(PathBuf, Result<EntryInfo>)>> {
        match self.existing_dir()? {
            Some(dir) => store::entries(&dir),
            None => Ok(Vec::new()),
        }
    }

    /// Check every byte of every entry against its checksums: each entry's
    /// path, and what is wrong with it (`Ok` when nothing). The entries are
    /// read, not mapped: one truncated or unreadable meanwhile is bad, not
    /// a SIGBUS.
    ///
    /// # Errors
    /// As [`Cache::entries`].
    pub fn verify(&self) -> Result<Vec<(PathBuf, std::result::Result<(), String>)>> {
        match self.existing_dir()? {
            Some(dir) => store::verify(&dir),
            None => Ok(Vec::new()),
        }
    }

    /// Remove the entry at `path` (one [`Cache::verify`] found bad) if it
    /// still fails its check, so that the next load of its source rebuilds
    /// it: `true` when it was removed. The file at `path` is moved aside
    /// and checked again before it is removed, so a good entry that a fill
    /// renamed over the bad one meanwhile is kept.
    ///
    /// # Errors
    /// [`crate::Error::Io`] when it cannot be removed; `NotFound` when
    /// `path` is not an entry of this cache by its contents (nothing else
    /// is ever removed); as [`Cache::entries`].
    pub fn remove_bad(&self, path: &Path) -> Result<bool> {
        match self.existing_dir()? {
            Some(dir) => store::remove_bad(&dir, path),
            None => Err(store::not_an_entry(path)),
        }
    }

    /// Remove the entries whose source changed or is gone, then the least
    /// recently used until at most `max_size` bytes remain, and the
    /// temporary files of fills that were killed.
    ///
    /// # Errors
    /// As [`Cache::entries`].
    pub fn prune(&self, max_size: u64) -> Result<PruneReport> {
        match self.existing_dir()? {
            Some(dir) => store::prune(&dir, max_size, None),
            None => Ok(PruneReport::default()),
        }
    }

    /// Remove every entry (and every temporary file no fill holds).
    ///
    /// # Errors
    /// [`crate::Error::Io`] when the directory cannot be read.
    pub fn clear(&self) -> Result<PruneReport> {
        self.prune(0)
    }
}

/// What [`Cache::lookup`] found.
#[derive(Debug)]
// Made once per load and matched at once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Lookup {
    /// A valid entry, mapped.
    Hit(Cached),
    /// None: make the contents and store them.
    Miss(Miss),
}

/// A lookup that found no usable entry: what storing one needs. Either
/// [`Miss::store`] (write the entry, then load it), or [`Miss::prepare`]
/// (write its bytes to a file the caller maps at once, a [`PendingEntry`])
/// and then [`PendingEntry::commit`] (put it in place).
pub struct Miss {
    key: SourceKey,
    id: TransformId,
    /// Whether the contents may have been read from the source by its path
    /// (every caller of [`Cache::lookup`]), rather than from the file the
    /// key was made from ([`Cache::load`]): then the commit also checks
    /// that the path led to that file throughout.
    read_by_path: bool,
    /// The directory a fill writes in and the limit it prunes to, or why
    /// nothing may be written.
    fill: Result<(Arc<PrivateDir>, u64), CacheBypass>,
    replaced: Option<String>,
    made_private: Option<String>,
    started: Instant,
}

impl std::fmt::Debug for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Miss")
            .field("key", &self.key.hash)
            .field("id", &self.id)
            .field("replaced", &self.replaced)
            .finish_non_exhaustive()
    }
}

impl Miss {
    /// Why the entry that was there was not used, if there was one.
    pub fn replaced(&self) -> Option<&str> {
        self.replaced.as_deref()
    }

    /// Write `contents` as the entry, then load it with `options`; when the
    /// cache cannot take it, build it in memory instead (held to the
    /// memory budget). The report says which.
    ///
    /// # Safety
    /// As [`Cache::load`].
    ///
    /// # Errors
    /// The contents' ([`crate::Error::Transform`]), and the entry's load's.
    pub unsafe fn store(
        self,
        contents: &mut dyn EntryContents,
        options: &LoadOptions,
    ) -> Result<Cached> {
        let layout = entry::Layout::plan(&self.key, &self.id, contents)?;
        let committed = self
            .prepare_planned(&layout, contents)?
            .and_then(PendingEntry::commit_open);
        // The file written is loaded through its own handle: an entry
        // removed or replaced under its name meanwhile changes nothing.
        let loaded = match committed {
            // SAFETY: the caller's contract covers the cache's entries.
            Ok((path, file)) => match unsafe { store::load_open(&file, &path, options) } {
                Ok(weights) => Ok((weights, path, file)),
                Err(e) => Err(CacheBypass::Io {
                    dir: path.clone(),
                    op: "load",
                    error: e.to_string(),
                }),
            },
            Err(why) => Err(why),
        };
        let (weights, outcome, entry, file) = match loaded {
            Ok((weights, path, file)) => (weights, CacheOutcome::Filled, Some(path), Some(file)),
            Err(why) => {
                let weights = store::in_memory(&self.key, &layout, contents, options)?;
                (weights, CacheOutcome::InMemory(why), None, None)
            }
        };
        let report = CacheReport {
            outcome,
            entry,
            key: self.key.hash,
            replaced: self.replaced,
            made_private: self.made_private,
            elapsed: self.started.elapsed(),
        };
        Ok(Cached {
            weights,
            report,
            file,
        })
    }

    /// Write the entry's bytes into a temporary file in the cache, which
    /// may be mapped at once; the wait for the disk (fsync) and the rename
    /// into place are [`PendingEntry::commit`]'s, which a caller may run on
    /// another thread while it uses the tensors. The bytes are copied out
    /// of `contents` here, so what the caller does with its own copy
    /// afterwards changes nothing of the entry. The inner `Err` says why
    /// the cache cannot take them (no directory, a full disk, an entry
    /// larger than the limit, ...): nothing is left behind, and the caller
    /// keeps what it has in memory.
    ///
    /// # Errors
    /// The contents' ([`crate::Error::Transform`]).
    pub fn prepare(
        &self,
        contents: &mut dyn EntryContents,
    ) -> Result<std::result::Result<PendingEntry, CacheBypass>> {
        let layout = entry::Layout::plan(&self.key, &self.id, contents)?;
        self.prepare_planned(&layout, contents)
    }

    fn prepare_planned(
        &self,
        layout: &entry::Layout,
        contents: &mut dyn EntryContents,
    ) -> Result<std::result::Result<PendingEntry, CacheBypass>> {
        let (dir, max_size) = match &self.fill {
            Ok((dir, max_size)) => (dir, *max_size),
            Err(why) => return Ok(Err(why.clone())),
        };
        // The limit bounds every entry, the one being written too: one
        // larger than it is never written (nor anything evicted for it).
        if layout.len > max_size {
            return Ok(Err(CacheBypass::TooLarge {
                bytes: layout.len,
                limit: max_size,
            }));
        }
        match store::fill_temp(dir, &self.key, layout, contents) {
            Ok(filled) => Ok(Ok(PendingEntry {
                filled,
                key: self.key.clone(),
                check_path: self.read_by_path,
                max_size,
            })),
            Err(store::Unwritten::Bypass(why)) => Ok(Err(why)),
            Err(store::Unwritten::Failed(e)) => Err(e),
        }
    }
}

/// An entry whose bytes are written but not yet committed: neither known to
/// be on the disk nor under its name, so no lookup finds it yet. Dropped
/// without [`commit`](PendingEntry::commit), it is removed.
pub struct PendingEntry {
    filled: store::Filled,
    key: SourceKey,
    /// Whether the commit checks that the source's path led to the keyed
    /// file throughout (the contents were read by the path).
    check_path: bool,
    max_size: u64,
}

impl std::fmt::Debug for PendingEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingEntry")
            .field("path", &self.path())
            .finish_non_exhaustive()
    }
}

impl PendingEntry {
    /// The temporary file holding the entry's bytes, for messages: map
    /// [`PendingEntry::file`], not this path.
    pub fn path(&self) -> &Path {
        self.filled.path()
    }

    /// The file holding the entry's bytes, open. A mapping of it made now
    /// stays valid, and the same bytes, after the commit renames it, and
    /// after anything else is renamed over or removes its name.
    pub fn file(&self) -> &File {
        self.filled.file()
    }

    /// Wait for the bytes to reach the disk, check that the source did not
    /// change meanwhile, nor its path lead anywhere else (the caller read it
    /// by that path), and rename the file into place (then prune the cache
    /// to its limit). Returns the entry's path, for messages and reports:
    /// map the file [`PendingEntry::file`] gave, not this path, which
    /// another fill may rename a file over, or a prune remove, at any time.
    ///
    /// # Errors
    /// Why the cache could not take the entry: the temporary file is then
    /// removed, and whoever maps it keeps its bytes.
    pub fn commit(self) -> std::result::Result<PathBuf, CacheBypass> {
        self.commit_open().map(|(path, _)| path)
    }

    /// [`PendingEntry::commit`], keeping the file written open.
    fn commit_open(self) -> std::result::Result<(PathBuf, File), CacheBypass> {
        let dir = self.filled.dir().clone();
        match store::commit(self.filled, &self.key, self.check_path) {
            Ok((path, file)) => {
                // Pruning is housekeeping: a failure leaves the cache
                // larger, never wrong; and the file is open here, so a
                // prune that removes it (another process's limit) takes
                // nothing from this load.
                let _ = store::prune(&dir, self.max_size, Some(&path));
                Ok((path, file))
            }
            Err(store::Unwritten::Bypass(why)) => Err(why),
            Err(store::Unwritten::Failed(e)) => Err(CacheBypass::Io {
                dir: dir.path().to_owned(),
                op: "commit",
                error: e.to_string(),
            }),
        }
    }
}

/// The options the transform's source is loaded with: the caller's, with
/// every tensor on the host (a CPU buffer type of the caller's alignment),
/// since the transform reads their bytes.
fn host_options(options: &LoadOptions) -> LoadOptions {
    let all_host = options.route.is_none() && options.buffer_type.is_host();
    if all_host {
        return options.clone();
    }
    let align = options.buffer_type.alignment();
    let cpu = CpuBufferType::with_alignment(align).unwrap_or_else(|_| CpuBufferType::new());
    let mut opts = options.clone().buffer_type(Arc::new(cpu));
    opts.route = None;
    opts
}

/// `$WEIGHTMAP_CACHE_MAX_SIZE`, parsed; the default when it is unset.
fn max_size_from_env() -> std::result::Result<u64, CacheBypass> {
    match std::env::var_os(MAX_SIZE_VAR) {
        None => Ok(Cache::DEFAULT_MAX_SIZE),
        Some(v) => {
            let text = v.to_string_lossy().into_owned();
            parse_size(&text).map_err(|problem| CacheBypass::InvalidMaxSize {
                value: text,
                problem,
            })
        }
    }
}

/// `$WEIGHTMAP_CACHE_DIR`, else the user's cache directory.
fn default_dir() -> Option<PathBuf> {
    env_dir("WEIGHTMAP_CACHE_DIR").or_else(user_cache_dir)
}

/// The environment variable `name` as a path, if it is set and not empty.
fn env_dir(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// weightmap's directory in the user's cache: `$XDG_CACHE_HOME/weightmap`,
/// else `~/.cache/weightmap` (Windows: `%LOCALAPPDATA%\weightmap`, the
/// user's local, not roaming, application data). `None` where the
/// environment names none. The transform cache's default (below
/// `$WEIGHTMAP_CACHE_DIR`), and where the command keeps the models it
/// generates for `bench`.
///
/// ```
/// if let Some(dir) = weightmap::cache::user_cache_dir() {
///     assert!(dir.ends_with("weightmap"));
/// }
/// ```
pub fn user_cache_dir() -> Option<PathBuf> {
    if cfg!(windows) {
        return env_dir("LOCALAPPDATA").map(|d| d.join("weightmap"));
    }
    env_dir("XDG_CACHE_HOME")
        .map(|d| d.join("weightmap"))
        .or_else(|| env_dir("HOME").map(|h| h.join(".cache").join("weightmap")))
}

/// Make `dir` a directory fit to hold files this user will trust, by the
/// cache directory's own rules (ARCHITECTURE.md, "The transform cache"):
/// created private (0700) with any missing parents; refused where another
/// user owns it, may write in it, or could make its path lead elsewhere;
/// made private where others may only read it. For a tool's own cache of
/// files (the command's generated models), so that it follows the same
/// rules as the transform cache.
///
/// ```
/// # fn main() -> weightmap::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// weightmap::cache::ensure_private_dir(&dir.path().join("models"))?;
/// assert!(dir.path().join("models").is_dir());
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`crate::Error::Io`]: `PermissionDenied` naming what is wrong, or the
/// system's own error (a file where the directory should be, a read-only
/// file system).
pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    match store::open_dir(dir, true) {
        Ok(_) => Ok(()),
        Err(why) => Err(crate::error::Error::io(
            "open directory",
            dir,
            std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.to_string()),
        )),
    }
}
