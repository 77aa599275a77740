//! An entry's bytes: a GGUF file, so that it loads, validates and places
//! like any weights (and `weightmap inspect` or gguf-py can read it). Its
//! metadata says what it is and lets it be checked:
//!
//! | key | value |
//! |---|---|
//! | `weightmap.cache.key` | the key's text ([`super::key`]), compared whole on open |
//! | `weightmap.cache.source` | the source's absolute path, for people (`cache ls`; lossy where it is not UTF-8) |
//! | `weightmap.cache.source_os` | the same path exactly (u8: Unix's bytes, Windows' UTF-16 little-endian), for pruning |
//! | `weightmap.cache.transform` | the transform's name |
//! | `weightmap.cache.transform_version` | its version |
//! | `weightmap.cache.created` | seconds since the Unix epoch |
//! | `weightmap.cache.tensor_xxh3` | each tensor's XXH3-64, in tensor order |
//! | `weightmap.cache.index_xxh3` | XXH3-64 of the header (through the data offset) with this value zeroed |
//!
//! and then whatever the transform adds. A file is an entry by its
//! contents: its key's hash is its file name ([`identify`]). Every open
//! checks every byte ([`check`]): the header against its checksum and each
//! tensor against its own, read from the file, whatever the load's mode or
//! buffer type.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::error::{Error, Result};
use crate::format::{read_header, Header};
use crate::gguf::{OwnedValue, ValueType, Writer};
use crate::os::{path_from_bytes, path_to_bytes, read_at, write_at, write_pieces};

use super::key::{hash_of, SourceKey, TransformId};
use super::transform::{EntryContents, PlannedTensor};

const KEY: &str = "weightmap.cache.key";
const SOURCE: &str = "weightmap.cache.source";
const SOURCE_OS: &str = "weightmap.cache.source_os";
const TRANSFORM: &str = "weightmap.cache.transform";
const TRANSFORM_VERSION: &str = "weightmap.cache.transform_version";
const CREATED: &str = "weightmap.cache.created";
const TENSOR_XXH3: &str = "weightmap.cache.tensor_xxh3";
const INDEX_XXH3: &str = "weightmap.cache.index_xxh3";

/// Tensors start at multiples of 64 bytes: a cache line, the widest SIMD
/// load, and more than ggml (32) or numpy and torch need.
const ALIGNMENT: u64 = 64;

/// An entry's layout, fixed before any byte is written.
pub(crate) struct Layout {
    tensors: Vec<PlannedTensor>,
    header_len: usize,
    /// Each tensor's byte range in the file.
    ranges: Vec<std::ops::Range<usize>>,
    /// The file's length.
    pub len: u64,
    extra: Vec<(String, OwnedValue)>,
    transform: (String, u32),
    created: u64,
}

impl Layout {
    /// Lay out `contents` as an entry for `key`.
    pub(crate) fn plan(
        key: &SourceKey,
        transform: &TransformId,
        contents: &dyn EntryContents,
    ) -> Result<Layout> {
        let tensors = contents.tensors();
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut layout = Layout {
            tensors,
            header_len: 0,
            ranges: Vec::new(),
            len: 0,
            extra: contents.metadata(),
            transform: (transform.name.clone(), transform.version),
            created,
        };
        for t in &layout.tensors {
            t.nbytes()?;
        }
        let zeros = vec![0; layout.tensors.len()];
        let (header, offsets) = layout.writer(key, &zeros, 0).header_bytes();
        let mut end = header.len() as u64;
        for (t, off) in layout.tensors.iter().zip(&offsets) {
            let start = (header.len() as u64)
                .checked_add(*off)
                .ok_or_else(|| Error::size_overflow(&t.name, "entry offset"))?;
            end = start
                .checked_add(t.nbytes()?)
                .ok_or_else(|| Error::size_overflow(&t.name, "entry offset + size"))?;
            let range = usize::try_from(start)
                .ok()
                .zip(usize::try_from(end).ok())
                .ok_or_else(|| Error::size_overflow(&t.name, "entry offset + size"))?;
            layout.ranges.push(range.0..range.1);
        }
        layout.header_len = header.len();
        layout.len = end.div_ceil(ALIGNMENT) * ALIGNMENT;
        Ok(layout)
    }

    fn writer(&self, key: &SourceKey, sums: &[u64], index: u64) -> Writer {
        let mut w = Writer::new(ALIGNMENT);
        let path = key.path.to_string_lossy();
        let exact = path_to_bytes(&key.path).into_iter().map(OwnedValue::U8);
        w.kv_str(KEY, &key.text)
            .kv_str(SOURCE, &path)
            .kv(SOURCE_OS, OwnedValue::Array(ValueType::U8, exact.collect()))
            .kv_str(TRANSFORM, &self.transform.0)
            .kv_u32(TRANSFORM_VERSION, self.transform.1)
            .kv(CREATED, OwnedValue::U64(self.created))
            .kv(TENSOR_XXH3, u64_array(sums));
        for (k, v) in &self.extra {
            w.kv(k, v.clone());
        }
        // Last, so that its offset is simple to find, though open() looks
        // it up by name.
        w.kv(INDEX_XXH3, OwnedValue::U64(index));
        for t in &self.tensors {
            w.tensor_deferred(&t.name, t.ty, &t.ne);
        }
        w
    }

    /// Write the whole entry into `dst` (the layout's length, zeroed): the
    /// tensors through `contents`, then the header with their checksums.
    pub(crate) fn write(
        &self,
        key: &SourceKey,
        contents: &mut dyn EntryContents,
        dst: &mut [u8],
    ) -> Result<()> {
        let mut sums = Vec::with_capacity(self.tensors.len());
        for (i, (t, range)) in self.tensors.iter().zip(&self.ranges).enumerate() {
            let out = &mut dst[range.clone()];
            contents.fill(i, out).map_err(|message| Error::Transform {
                tensor: t.name.clone(),
                message,
            })?;
            sums.push(xxh3_64(out));
        }
        let header = self.header(key, &sums)?;
        dst[..header.len()].copy_from_slice(&header);
        Ok(())
    }

    /// Write the whole entry into `file` (allocated to the layout's
    /// length) from tensors `contents` already holds
    /// ([`EntryContents::bytes`]), in file order, past the page cache where
    /// the system can ([`write_pieces`]): no page of the file is faulted
    /// in to be written. `None` when some tensor's bytes are not held (then
    /// nothing was written).
    pub(crate) fn write_held(
        &self,
        key: &SourceKey,
        contents: &dyn EntryContents,
        file: &File,
    ) -> Option<std::io::Result<()>> {
        let held: Vec<&[u8]> = (0..self.tensors.len())
            .map(|i| contents.bytes(i))
            .collect::<Option<_>>()?;
        Some(self.write_bytes(key, &held, file))
    }

    fn write_bytes(&self, key: &SourceKey, held: &[&[u8]], file: &File) -> std::io::Result<()> {
        for ((t, range), bytes) in self.tensors.iter().zip(&self.ranges).zip(held) {
            if bytes.len() != range.len() {
                let why = format!(
                    "tensor '{}': {} bytes held, {} planned",
                    t.name,
                    bytes.len(),
                    range.len()
                );
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, why));
            }
        }
        let pieces: Vec<(u64, &[u8])> = (self.ranges.iter().zip(held))
            .map(|(range, bytes)| (range.start as u64, *bytes))
            .collect();
        // The checksums go in the header, written last: they are computed
        // on a thread of their own while the tensors go to the disk.
        let (sums, written) = std::thread::scope(|scope| {
            let hashing = scope.spawn(|| held.iter().map(|b| xxh3_64(b)).collect::<Vec<u64>>());
            let written = write_pieces(file, self.len, &pieces);
            let hashed = hashing
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (hashed, written)
        });
        written?;
        let header = self
            .header(key, &sums)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        write_at(file, &header, 0)
    }

    /// The header, with the tensors' checksums `sums` and its own checksum
    /// in place.
    fn header(&self, key: &SourceKey, sums: &[u64]) -> Result<Vec<u8>> {
        let (mut header, _) = self.writer(key, sums, 0).header_bytes();
        assert_eq!(
            header.len(),
            self.header_len,
            "the header's length is fixed by the plan"
        );
        let at = index_value_at(&header, self.len)?;
        let index = index_hash(&header, at);
        header[at..at + 8].copy_from_slice(&index.to_le_bytes());
        Ok(header)
    }
}

fn u64_array(v: &[u64]) -> OwnedValue {
    OwnedValue::Array(
        ValueType::U64,
        v.iter().map(|&x| OwnedValue::U64(x)).collect(),
    )
}

/// XXH3-64 of `header` with its 8 bytes at `at` taken as zero.
fn index_hash(header: &[u8], at: usize) -> u64 {
    let mut h = Xxh3::new();
    h.update(&header[..at]);
    h.update(&[0; 8]);
    h.update(&header[at + 8..]);
    h.digest()
}

/// Where the index checksum's value is, in an entry's header (of a file
/// `file_len` bytes long).
fn index_value_at(header: &[u8], file_len: u64) -> Result<usize> {
    let parsed = match crate::format::Header::parse_prefix(header, file_len)? {
        crate::tensor::Parse::Complete(h) => h,
        crate::tensor::Parse::NeedMore { min_len } => {
            return Err(Error::Truncated {
                what: "an entry's header".into(),
                needed: min_len,
                offset: 0,
                file_len: header.len() as u64,
            })
        }
    };
    let md = parsed.gguf_metadata().ok_or(Error::UnknownFormat)?;
    let kv = md.layout().find(|kv| kv.key == INDEX_XXH3);
    kv.filter(|kv| kv.value_type == ValueType::U64)
        .and_then(|kv| usize::try_from(kv.value.start).ok())
        .ok_or_else(|| Error::KeyNotFound {
            key: INDEX_XXH3.into(),
        })
}

/// What is wrong with an entry that loaded as a GGUF file, if anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Problem {
    /// Its key is another's: a hash collision or a file put in its place.
    WrongKey,
    /// A field of the layout is missing or of the wrong type.
    NotAnEntry(String),
    /// The header's checksum does not match.
    Index,
    /// A tensor's checksum does not match.
    Tensor(String),
    /// The file could not be read.
    Unreadable(String),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::WrongKey => f.write_str("its key is another source's or transform's"),
            Problem::NotAnEntry(why) => write!(f, "not a cache entry: {why}"),
            Problem::Index => f.write_str("the header's checksum does not match"),
            Problem::Tensor(name) => write!(f, "tensor '{name}': checksum does not match"),
            Problem::Unreadable(why) => write!(f, "cannot be read: {why}"),
        }
    }
}

/// The header of the file `file` (at `label`, for messages) if it is an
/// entry by its contents: a GGUF header whose stored key hashes to
/// `name_hash`, the entry's file name. Anything else in the directory (a
/// model that happens to be named like an entry, a file cut short before
/// its key) is not an entry: never listed, checked or removed.
pub(crate) fn identify(file: &File, label: &Path, name_hash: &str) -> Option<Header> {
    let len = file.metadata().ok()?.len();
    let header = read_header(file, len, label).ok()?;
    let md = header.gguf_metadata()?;
    let key = md.get_str(KEY).ok()?;
    (hash_of(key) == name_hash).then_some(())?;
    Some(header)
}

/// Every check of the entry in `file`, whose header is `header`: its key
/// (when `expected_key` is given; `None` for a check that does not know
/// the source, `cache verify`), the header's checksum, and every byte of
/// every tensor against its stored checksum. The bytes are read from the
/// file, never through a mapping: a disk that cannot read a page then
/// gives an error (the entry is rebuilt), not a SIGBUS that kills the
/// process. What is checked never depends on how the entry is loaded
/// (mapped or streamed, into host or device buffers).
pub(crate) fn check(
    file: &File,
    header: &Header,
    expected_key: Option<&str>,
) -> Result<(), Problem> {
    let md = header
        .gguf_metadata()
        .ok_or_else(|| Problem::NotAnEntry("not GGUF".into()))?;
    let field = |key: &str| Problem::NotAnEntry(format!("no {key}"));
    let key = md.get_str(KEY).map_err(|_| field(KEY))?;
    if expected_key.is_some_and(|k| k != key) {
        return Err(Problem::WrongKey);
    }
    let stored: u64 = md.get_int(INDEX_XXH3).map_err(|_| field(INDEX_XXH3))?;
    let at = md
        .layout()
        .find(|kv| kv.key == INDEX_XXH3)
        .and_then(|kv| usize::try_from(kv.value.start).ok())
        .ok_or_else(|| field(INDEX_XXH3))?;
    // The header as written: through the data offset, padding included
    // (an owning header's own bytes stop before the padding).
    let head_len = usize::try_from(header.data_offset()).map_err(|_| Problem::Index)?;
    let mut head = vec![0u8; head_len];
    read_at(file, &mut head, 0).map_err(|e| Problem::Unreadable(e.to_string()))?;
    if at + 8 > head.len() || index_hash(&head, at) != stored {
        return Err(Problem::Index);
    }
    let sums: Vec<u64> = md
        .get_array(TENSOR_XXH3)
        .and_then(|a| a.values::<u64>().map(|v| v.collect()))
        .map_err(|_| field(TENSOR_XXH3))?;
    let tensors = header.tensors();
    if sums.len() != tensors.len() {
        return Err(Problem::NotAnEntry(format!(
            "{} checksums for {} tensors",
            sums.len(),
            tensors.len()
        )));
    }
    let ranges: Vec<Range<u64>> = tensors.iter().map(|t| t.file_range()).collect();
    let got = hash_ranges(file, &ranges).map_err(|e| Problem::Unreadable(e.to_string()))?;
    for ((t, want), got) in tensors.iter().zip(sums).zip(got) {
        if want != got {
            return Err(Problem::Tensor(t.name.to_owned()));
        }
    }
    Ok(())
}

/// XXH3-64 of each of `ranges` of `file`, read on up to four threads (the
/// largest ranges first).
fn hash_ranges(file: &File, ranges: &[Range<u64>]) -> std::io::Result<Vec<u64>> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(ranges[i].end - ranges[i].start));
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let work = || {
        let mut out = Vec::new();
        // One piece's buffer a thread: the check adds little anonymous
        // memory however large the entry.
        let mut buf = vec![0u8; READ_PIECE];
        while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
            out.push((i, hash_by_reads(file, ranges[i].clone(), &mut buf)));
        }
        out
    };
    let results: Vec<(usize, std::io::Result<u64>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (1..threads).map(|_| scope.spawn(work)).collect();
        let mut all = work();
        for h in handles {
            all.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        all
    });
    let mut sums = vec![0u64; ranges.len()];
    for (i, sum) in results {
        sums[i] = sum?;
    }
    Ok(sums)
}

/// The size of one read of the check: large enough that the calls cost
/// nothing beside the hashing, small enough to stay in the CPU's cache.
const READ_PIECE: usize = 256 << 10;

/// XXH3-64 of `range` of `file`, read in pieces through `buf`.
fn hash_by_reads(file: &File, range: Range<u64>, buf: &mut [u8]) -> std::io::Result<u64> {
    let mut h = Xxh3::new();
    let mut at = range.start;
    while at < range.end {
        // At most the buffer's length, which fits usize.
        let n = (range.end - at).min(buf.len() as u64) as usize;
        read_at(file, &mut buf[..n], at)?;
        h.update(&buf[..n]);
        at += n as u64;
    }
    Ok(h.digest())
}

/// Whether the file `file` (at `label`) is an entry whose key is `key`
/// (its header alone is read).
pub(crate) fn has_key(file: &File, label: &Path, key: &str) -> bool {
    identify(file, label, &hash_of(key)).is_some_and(|h| {
        h.gguf_metadata()
            .is_some_and(|md| md.get_str(KEY).is_ok_and(|k| k == key))
    })
}

/// What `cache ls` shows of an entry, read from its header alone.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EntryInfo {
    /// The entry's file.
    pub path: PathBuf,
    /// Its length in bytes.
    pub bytes: u64,
    /// When it was last used (its modification time, set on every hit).
    pub last_used: SystemTime,
    /// The source it was made from, for people: its path, with any byte
    /// that is not UTF-8 replaced (`source_path` is exact).
    pub source: String,
    /// The source's path exactly as it was loaded.
    pub source_path: PathBuf,
    /// The transform's name.
    pub transform: String,
    /// The transform's version.
    pub transform_version: u32,
    /// Tensors in the entry.
    pub tensors: usize,
    /// Whether the source is still the file the entry was made from;
    /// `false` when it changed or is gone (the entry can never be used
    /// again, and `cache prune` removes it).
    pub source_current: bool,
}

impl EntryInfo {
    /// What the header `header` of the entry at `path` (`bytes` long, last
    /// modified at `last_used`) says of it.
    pub(crate) fn of(
        header: &Header,
        path: PathBuf,
        bytes: u64,
        last_used: SystemTime,
    ) -> Result<EntryInfo> {
        let md = header.gguf_metadata().ok_or(Error::UnknownFormat)?;
        let key = md.get_str(KEY)?;
        let source = md.get_str(SOURCE)?.to_owned();
        let exact = md
            .get_array(SOURCE_OS)?
            .values::<u8>()?
            .collect::<Vec<u8>>();
        let source_path = path_from_bytes(&exact).ok_or_else(|| Error::KeyNotFound {
            key: SOURCE_OS.into(),
        })?;
        Ok(EntryInfo {
            path,
            bytes,
            last_used,
            source_current: super::key::still_describes(key, &source_path),
            source,
            source_path,
            transform: md.get_str(TRANSFORM)?.to_owned(),
            transform_version: md.get_int(TRANSFORM_VERSION)?,
            tensors: header.tensors().len(),
        })
    }
}

/// The bytes a planned tensor takes.
impl PlannedTensor {
    pub(crate) fn nbytes(&self) -> Result<u64> {
        let n = self
            .ne
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::size_overflow(&self.name, "element count"))?;
        if self.ty.ggml_id().is_none() {
            return Err(Error::Transform {
                tensor: self.name.clone(),
                message: format!("{} has no GGUF type id, so no entry can hold it", self.ty),
            });
        }
        self.ty
            .bytes_for(n)
            .ok_or_else(|| Error::size_overflow(&self.name, "byte size"))
    }
}
