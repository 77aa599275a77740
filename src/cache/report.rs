//! What a cached load did: used an entry, made one, or transformed in
//! memory, and why.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// How the transformed tensors were had.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheOutcome {
    /// A valid entry was mapped: nothing was transformed.
    Hit,
    /// No valid entry was there: the transform ran into a new one, which is
    /// now mapped (and used by every later load).
    Filled,
    /// The cache could not be used: the transform ran into memory, as it
    /// would without a cache.
    InMemory(CacheBypass),
}

impl CacheOutcome {
    /// `"hit"`, `"filled"` or `"in_memory"`.
    pub fn name(&self) -> &'static str {
        match self {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Filled => "filled",
            CacheOutcome::InMemory(_) => "in_memory",
        }
    }
}

/// Why the cache could not be used. Nothing here is an error: the load
/// goes on in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheBypass {
    /// The cache is off ([`super::Cache::off`]).
    Off,
    /// No directory is set and none can be derived (no
    /// `WEIGHTMAP_CACHE_DIR`, `XDG_CACHE_HOME` or home directory).
    NoDirectory,
    /// This platform maps no files, so an entry could not be placed.
    Unsupported,
    /// The directory is another user's, or other users can write in it:
    /// they could plant entries or swap them.
    UnsafeDirectory {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The directory cannot be written (a read-only filesystem, no
    /// permission).
    ReadOnly {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        error: String,
    },
    /// The disk (or the quota) is full.
    NoSpace {
        /// The directory.
        dir: PathBuf,
        /// The entry's bytes.
        needed: u64,
    },
    /// The source changed while the transform read it: what was made is
    /// not stored.
    SourceChanged {
        /// The source.
        path: PathBuf,
    },
    /// The contents were read from the source by its path (a caller of
    /// [`super::Cache::lookup`]), and between the lookup and the commit
    /// that path led through a directory or link that changed: it may have
    /// led to another file, so what was made is not stored under the key
    /// of the one the lookup opened.
    SourcePathChanged {
        /// The source's path.
        path: PathBuf,
        /// What changed.
        problem: String,
    },
    /// The entry would be larger than the cache's size limit: it is not
    /// written, and nothing is evicted for it.
    TooLarge {
        /// The entry's bytes.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// `$WEIGHTMAP_CACHE_MAX_SIZE` is not a byte count: no limit could be
    /// kept, so nothing is written (entries already there still serve).
    InvalidMaxSize {
        /// The variable's value.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Another I/O error.
    Io {
        /// The directory.
        dir: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        error: String,
    },
}

impl CacheBypass {
    /// A short, stable name: `"off"`, `"no_directory"`, `"unsupported"`,
    /// `"unsafe_directory"`, `"read_only"`, `"no_space"`,
    /// `"source_changed"`, `"source_path_changed"`, `"too_large"`,
    /// `"invalid_max_size"`, `"io"`.
    pub fn name(&self) -> &'static str {
        match self {
            CacheBypass::Off => "off",
            CacheBypass::NoDirectory => "no_directory",
            CacheBypass::Unsupported => "unsupported",
            CacheBypass::UnsafeDirectory { .. } => "unsafe_directory",
            CacheBypass::ReadOnly { .. } => "read_only",
            CacheBypass::NoSpace { .. } => "no_space",
            CacheBypass::SourceChanged { .. } => "source_changed",
            CacheBypass::SourcePathChanged { .. } => "source_path_changed",
            CacheBypass::TooLarge { .. } => "too_large",
            CacheBypass::InvalidMaxSize { .. } => "invalid_max_size",
            CacheBypass::Io { .. } => "io",
        }
    }
}

impl fmt::Display for CacheBypass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheBypass::Off => f.write_str("the cache is off"),
            CacheBypass::NoDirectory => f.write_str(
                "no cache directory: set WEIGHTMAP_CACHE_DIR (or XDG_CACHE_HOME, or HOME)",
            ),
            CacheBypass::Unsupported => f.write_str("this platform cannot map a cache entry"),
            CacheBypass::UnsafeDirectory { dir, problem } => {
                write!(f, "refusing cache directory {}: {problem}", dir.display())
            }
            CacheBypass::ReadOnly { dir, error } => {
                write!(
                    f,
                    "cache directory {} cannot be written: {error}",
                    dir.display()
                )
            }
            CacheBypass::NoSpace { dir, needed } => {
                write!(f, "no space for a {needed}-byte entry in {}", dir.display())
            }
            CacheBypass::SourceChanged { path } => write!(
                f,
                "{} changed while it was transformed; the result was not stored",
                path.display()
            ),
            CacheBypass::SourcePathChanged { path, problem } => write!(
                f,
                "the path {} may have led to another file while it was read ({problem}); \
                 the result was not stored",
                path.display()
            ),
            CacheBypass::TooLarge { bytes, limit } => write!(
                f,
                "a {bytes}-byte entry is larger than the cache's limit of {limit} bytes \
                 (WEIGHTMAP_CACHE_MAX_SIZE)"
            ),
            CacheBypass::InvalidMaxSize { problem, .. } => {
                write!(f, "WEIGHTMAP_CACHE_MAX_SIZE: {problem}")
            }
            CacheBypass::Io { dir, op, error } => {
                write!(f, "{op} in cache directory {}: {error}", dir.display())
            }
        }
    }
}

/// What a cached load did.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CacheReport {
    /// Hit, filled, or in memory and why.
    pub outcome: CacheOutcome,
    /// The entry's file (`None` in memory).
    pub entry: Option<PathBuf>,
    /// The entry's key, as 32 hex digits (its file name without `.gguf`).
    pub key: String,
    /// Why an entry that was there was not used, and replaced (a checksum
    /// that did not match, ...).
    pub replaced: Option<String>,
    /// What was made private in the cache directory before it was used
    /// (a directory other users could read or search), if anything.
    pub made_private: Option<String>,
    /// Wall time of the whole cached load: lookup, transform and writes.
    pub elapsed: Duration,
}

impl fmt::Display for CacheReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.outcome, &self.entry) {
            (CacheOutcome::Hit, Some(p)) => write!(f, "cached: mapped {}", p.display())?,
            (CacheOutcome::Filled, Some(p)) => {
                write!(f, "cached: transformed into {}", p.display())?;
            }
            (CacheOutcome::InMemory(why), _) => {
                write!(f, "not cached ({why}): transformed in memory")?
            }
            (_, None) => write!(f, "cached")?,
        }
        if let Some(why) = &self.replaced {
            write!(f, "; the entry that was there was replaced: {why}")?;
        }
        if let Some(what) = &self.made_private {
            write!(f, "; the cache directory was made private: {what}")?;
        }
        Ok(())
    }
}
