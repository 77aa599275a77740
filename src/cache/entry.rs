//! An entry's bytes: a GGUF file, so that it loads, validates and places
//! like any weights (and `weightmap inspect` or gguf-py can read it). Its
//! metadata says what it is and lets it be checked:
//!
//! | key | value |
//! |---|---|
//! | `weightmap.cache.key` | the key's text ([`super::key`]), compared whole on open |
//! | `weightmap.cache.source` | the source's absolute path (for `cache ls` and pruning) |
//! | `weightmap.cache.transform` | the transform's name |
//! | `weightmap.cache.transform_version` | its version |
//! | `weightmap.cache.created` | seconds since the Unix epoch |
//! | `weightmap.cache.tensor_xxh3` | each tensor's XXH3-64, in tensor order (`cache verify`) |
//! | `weightmap.cache.sample_xxh3` | XXH3-64 of both ends of every tensor (checked on open) |
//! | `weightmap.cache.index_xxh3` | XXH3-64 of the header with this value zeroed (checked on open) |
//!
//! and then whatever the transform adds. The header is checked on every
//! open, and so are a few KiB of each tensor; every byte only by
//! [`verify`].

use std::time::{SystemTime, UNIX_EPOCH};

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::error::{Error, Result};
use crate::gguf::{OwnedValue, ValueType, Writer};
use crate::loader::Weights;
use crate::os::{write_at, write_pieces};

use super::key::{sample_ranges, SourceKey, TransformId};
use super::transform::{EntryContents, PlannedTensor};

const KEY: &str = "weightmap.cache.key";
const SOURCE: &str = "weightmap.cache.source";
const TRANSFORM: &str = "weightmap.cache.transform";
const TRANSFORM_VERSION: &str = "weightmap.cache.transform_version";
const CREATED: &str = "weightmap.cache.created";
const TENSOR_XXH3: &str = "weightmap.cache.tensor_xxh3";
const SAMPLE_XXH3: &str = "weightmap.cache.sample_xxh3";
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
        let (header, offsets) = layout.writer(key, &zeros, 0, 0).header_bytes();
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

    fn writer(&self, key: &SourceKey, sums: &[u64], sample: u64, index: u64) -> Writer {
        let mut w = Writer::new(ALIGNMENT);
        let path = key.path.to_string_lossy();
        w.kv_str(KEY, &key.text)
            .kv_str(SOURCE, &path)
            .kv_str(TRANSFORM, &self.transform.0)
            .kv_u32(TRANSFORM_VERSION, self.transform.1)
            .kv(CREATED, OwnedValue::U64(self.created))
            .kv(TENSOR_XXH3, u64_array(sums))
            .kv(SAMPLE_XXH3, OwnedValue::U64(sample));
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
        let sample = sample_hash(self.ranges.iter().map(|r| &dst[r.clone()]));
        let header = self.header(key, &sums, sample)?;
        dst[..header.len()].copy_from_slice(&header);
        Ok(())
    }

    /// Write the whole entry into `file` (at `path`, allocated to the
    /// layout's length) from tensors `contents` already holds
    /// ([`EntryContents::bytes`]), in file order, past the page cache where
    /// the system can ([`write_pieces`]): no page of the file is faulted
    /// in to be written. `None` when some tensor's bytes are not held (then
    /// nothing was written).
    pub(crate) fn write_held(
        &self,
        key: &SourceKey,
        contents: &dyn EntryContents,
        file: &std::fs::File,
        path: &std::path::Path,
    ) -> Option<std::io::Result<()>> {
        let held: Vec<&[u8]> = (0..self.tensors.len())
            .map(|i| contents.bytes(i))
            .collect::<Option<_>>()?;
        Some(self.write_bytes(key, &held, file, path))
    }

    fn write_bytes(
        &self,
        key: &SourceKey,
        held: &[&[u8]],
        file: &std::fs::File,
        path: &std::path::Path,
    ) -> std::io::Result<()> {
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
        let ((sums, sample), written) = std::thread::scope(|scope| {
            let hashing = scope.spawn(|| {
                let sums: Vec<u64> = held.iter().map(|b| xxh3_64(b)).collect();
                (sums, sample_hash(held.iter().copied()))
            });
            let written = write_pieces(file, path, self.len, &pieces);
            let hashed = hashing
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (hashed, written)
        });
        written?;
        let header = self
            .header(key, &sums, sample)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        write_at(file, &header, 0)
    }

    /// The header, with the tensors' checksums `sums`, the sampled
    /// checksum `sample`, and its own checksum in place.
    fn header(&self, key: &SourceKey, sums: &[u64], sample: u64) -> Result<Vec<u8>> {
        let (mut header, _) = self.writer(key, sums, sample, 0).header_bytes();
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

/// XXH3-64 of both ends of each tensor: what an open checks of the data.
fn sample_hash<'a>(tensors: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut h = Xxh3::new();
    for bytes in tensors {
        for r in sample_ranges(0, bytes.len() as u64) {
            // Within `bytes`, whose length fits usize.
            h.update(&bytes[r.start as usize..r.end as usize]);
        }
    }
    h.digest()
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
    /// The sampled data's checksum does not match.
    Sample,
    /// A tensor's checksum does not match (found by [`verify`]).
    Tensor(String),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::WrongKey => f.write_str("its key is another source's or transform's"),
            Problem::NotAnEntry(why) => write!(f, "not a cache entry: {why}"),
            Problem::Index => f.write_str("the header's checksum does not match"),
            Problem::Sample => f.write_str("the sampled tensor bytes' checksum does not match"),
            Problem::Tensor(name) => write!(f, "tensor '{name}': checksum does not match"),
        }
    }
}

/// The cheap checks of an open: the key, the header's checksum, and both
/// ends of every tensor. `expected_key` is `None` for a check that does not
/// know the source (`cache verify`).
pub(crate) fn check(weights: &Weights, expected_key: Option<&str>) -> Result<(), Problem> {
    let md = weights
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
    let raw = weights.header().raw();
    if at + 8 > raw.len() || index_hash(raw, at) != stored {
        return Err(Problem::Index);
    }
    let stored: u64 = md.get_int(SAMPLE_XXH3).map_err(|_| field(SAMPLE_XXH3))?;
    let bytes: Option<Vec<&[u8]>> = weights.tensors().map(|t| t.host_bytes()).collect();
    let bytes =
        bytes.ok_or_else(|| Problem::NotAnEntry("a tensor is not in host memory".into()))?;
    if sample_hash(bytes.into_iter()) != stored {
        return Err(Problem::Sample);
    }
    Ok(())
}

/// Every check: [`check`], then every byte of every tensor against its
/// stored checksum.
pub(crate) fn verify(weights: &Weights) -> Result<(), Problem> {
    check(weights, None)?;
    let md = weights
        .gguf_metadata()
        .ok_or_else(|| Problem::NotAnEntry("not GGUF".into()))?;
    let sums: Vec<u64> = md
        .get_array(TENSOR_XXH3)
        .and_then(|a| a.values::<u64>().map(|v| v.collect()))
        .map_err(|_| Problem::NotAnEntry(format!("no {TENSOR_XXH3}")))?;
    if sums.len() != weights.len() {
        return Err(Problem::NotAnEntry(format!(
            "{} checksums for {} tensors",
            sums.len(),
            weights.len()
        )));
    }
    for (t, sum) in weights.tensors().zip(sums) {
        let bytes = t
            .host_bytes()
            .ok_or_else(|| Problem::NotAnEntry("a tensor is not in host memory".into()))?;
        if xxh3_64(bytes) != sum {
            return Err(Problem::Tensor(t.name().to_owned()));
        }
    }
    Ok(())
}

/// Whether the file at `path` is an entry whose key is `key` (its header
/// alone is read).
pub(crate) fn has_key(path: &std::path::Path, key: &str) -> bool {
    crate::format::Header::read(path).is_ok_and(|h| {
        h.gguf_metadata()
            .is_some_and(|md| md.get_str(KEY).is_ok_and(|k| k == key))
    })
}

/// What `cache ls` shows of an entry, read from its header alone.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EntryInfo {
    /// The entry's file.
    pub path: std::path::PathBuf,
    /// Its length in bytes.
    pub bytes: u64,
    /// When it was last used (its modification time, set on every hit).
    pub last_used: SystemTime,
    /// The source it was made from.
    pub source: String,
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
    /// Read what the header of the entry at `path` says of it.
    pub(crate) fn read(path: &std::path::Path) -> Result<EntryInfo> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io("stat", path, e))?;
        let header = crate::format::Header::read(path)?;
        let md = header.gguf_metadata().ok_or(Error::UnknownFormat)?;
        let key = md.get_str(KEY)?;
        let source = md.get_str(SOURCE)?.to_owned();
        Ok(EntryInfo {
            path: path.to_owned(),
            bytes: meta.len(),
            last_used: meta.modified().unwrap_or(UNIX_EPOCH),
            source_current: super::key::still_describes(key, std::path::Path::new(&source)),
            source,
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
