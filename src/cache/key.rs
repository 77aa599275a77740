//! An entry's key: what must be equal for a cached transform to stand for
//! the one that would run now. The source's identity (device, inode, size,
//! modification time, and the status change time, which no unprivileged
//! call sets back, so a rewrite whose modification time was restored still
//! changes it), a fingerprint of its header and of a sample of each
//! tensor's bytes, the transform's name, version and machine facts, and the
//! facts weightmap adds itself (the page size, the architecture, the entry
//! format). Any change gives another key, so a stale entry is never found,
//! let alone used.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use xxhash_rust::xxh3::{xxh3_128, Xxh3};

use crate::error::{Error, Result};
use crate::format::{read_header, Header};
use crate::os::{change_time_ns, file_identity, open_regular, page_size, read_at, PathTrail};

/// The version of the entry layout ([`super::entry`]): part of every key,
/// so entries of another layout are never read.
pub(crate) const ENTRY_FORMAT: u32 = 2;

/// How many bytes of each end of a tensor the fingerprint reads.
pub(crate) const SAMPLE: u64 = 4096;

/// What keys a transform's entries: its name, its version (bumped whenever
/// its output changes for the same input) and the machine facts its output
/// depends on (CPU features, ...). weightmap adds the page size, the
/// architecture and the OS itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TransformId {
    /// The name.
    pub name: String,
    /// The version.
    pub version: u32,
    /// The machine facts, as one string (empty when there are none).
    pub machine: String,
}

impl TransformId {
    /// `name` at `version`, depending on no machine fact.
    pub fn new(name: impl Into<String>, version: u32) -> TransformId {
        TransformId {
            name: name.into(),
            version,
            machine: String::new(),
        }
    }

    /// The same, depending on `facts`.
    pub fn machine(mut self, facts: impl Into<String>) -> TransformId {
        self.machine = facts.into();
        self
    }
}

/// A source file as a lookup sees it: the file, opened once, its
/// identity and header, the key of the entry that would hold `transform`
/// of it, and what its path led through.
#[derive(Clone, Debug)]
pub(crate) struct SourceKey {
    pub path: PathBuf,
    /// The source, open: the file every fact of the key was read from, and
    /// the one [`super::Cache::load`] transforms, whatever the path names
    /// meanwhile.
    pub file: Arc<File>,
    /// What the path led through to `file` just after it was opened, or
    /// `None` when by then it led elsewhere.
    trail: Option<PathTrail>,
    /// Every fact the key is made of, one `name=value` a line: stored in the
    /// entry and compared whole when it is opened.
    pub text: String,
    /// The key's 128-bit hash, as 32 hex digits: the entry's file name.
    pub hash: String,
}

impl SourceKey {
    /// Open `path` once, read its header and identity from that open file,
    /// sample its tensors, and make the key of `transform` of it. Reads the
    /// header and at most two 4 KiB pieces of each tensor, never the whole
    /// file.
    ///
    /// # Errors
    /// The file's own; [`Error::NotAShard`] for a shard of a split model,
    /// which one file's key cannot name.
    pub(crate) fn of(path: &Path, transform: &TransformId) -> Result<SourceKey> {
        let path = std::path::absolute(path).map_err(|e| Error::io("resolve", path, e))?;
        // Never a FIFO or a device: their open could wait, or act.
        let file = open_regular(&path).map_err(|e| Error::io("open", &path, e))?;
        let text = key_text(&file_facts(&file, &path, true)?, transform);
        let trail = PathTrail::of(&path)
            .ok()
            .filter(|t| t.file() == file_identity(&file).ok());
        let hash = hash_of(&text);
        Ok(SourceKey {
            path,
            file: Arc::new(file),
            trail,
            text,
            hash,
        })
    }

    /// Whether the open source is still the file this key was made from
    /// (same identity, times and fingerprint): checked before an entry
    /// made from it is committed.
    pub(crate) fn unchanged(&self) -> bool {
        file_facts(&self.file, &self.path, false).is_ok_and(|facts| self.text.contains(&facts))
    }

    /// Whether the path still leads through what it led through when the
    /// key was made, and so led to the keyed file throughout: checked
    /// before an entry made from what the caller read by the path is
    /// committed. `Err` says what differs.
    pub(crate) fn path_unmoved(&self) -> std::result::Result<(), String> {
        let Some(then) = &self.trail else {
            return Err("it led to another file as the key was made".into());
        };
        match PathTrail::of(&self.path) {
            Ok(now) if then.same_way(&now) => Ok(()),
            Ok(_) => Err("a directory or link on it changed".into()),
            Err(e) => Err(format!("it cannot be followed now: {e}")),
        }
    }
}

/// The key `text`'s 128-bit hash, as 32 hex digits: its entry's file name.
pub(crate) fn hash_of(text: &str) -> String {
    format!("{:032x}", xxh3_128(text.as_bytes()))
}

/// Whether the file at `path` is still the source `key_text` (an entry's
/// stored key) was made from: same identity, same fingerprint. `false`
/// when it changed or is gone.
pub(crate) fn still_describes(key_text: &str, path: &Path) -> bool {
    open_regular(path)
        .and_then(|file| file_facts(&file, path, false).map_err(std::io::Error::other))
        .is_ok_and(|facts| key_text.contains(&facts))
}

/// The source's lines of a key, read from the open `file` (at `path`, for
/// messages): its identity and fingerprint. A shard of a split model is
/// refused when `whole`: its key would name one file of several.
fn file_facts(file: &File, path: &Path, whole: bool) -> Result<String> {
    let [dev, ino, size, mtime, ctime] = identity_of(file, path)?;
    let header = read_header(file, size, path)?;
    let shards = header
        .gguf_metadata()
        .and_then(|md| md.get_opt_int::<u64>("split.count").ok().flatten());
    if whole && shards.is_some_and(|n| n > 1) {
        return Err(Error::NotAShard {
            path: path.to_owned(),
            detail: format!(
                "split.count is {}: the transform cache takes a model in one file",
                shards.unwrap_or(0)
            ),
        });
    }
    let fingerprint = fingerprint(&header, |offset, buf| {
        read_at(file, buf, offset).map_err(|e| Error::io("read", path, e))
    })?;
    Ok(format!(
        "source.device={dev}\nsource.inode={ino}\nsource.size={size}\nsource.mtime_ns={mtime}\n\
         source.ctime_ns={ctime}\nsource.fingerprint={fingerprint:016x}\n"
    ))
}

/// Device, inode, size, and the modification and change times in
/// nanoseconds.
pub(crate) fn identity_of(file: &File, path: &Path) -> Result<[u64; 5]> {
    let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
    let (dev, ino) = file_identity(file).map_err(|e| Error::io("stat", path, e))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let ctime = change_time_ns(file).map_err(|e| Error::io("stat", path, e))?;
    Ok([dev, ino, meta.len(), mtime, ctime])
}

/// A cheap fingerprint of a model: its header's bytes, then the first and
/// last [`SAMPLE`] bytes of every tensor, read through `read(offset, buf)`.
/// It catches a file rewritten with its old size and time, which the
/// identity alone would miss, without reading every byte.
pub(crate) fn fingerprint(
    header: &Header,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<()>,
) -> Result<u64> {
    let mut h = Xxh3::new();
    h.update(header.raw());
    let mut buf = vec![0u8; 2 * SAMPLE as usize];
    for info in header.tensors().iter() {
        let range = info.file_range();
        for piece in sample_ranges(range.start, range.end) {
            // At most 2 * SAMPLE bytes, which fits usize.
            let n = (piece.end - piece.start) as usize;
            read(piece.start, &mut buf[..n])?;
            h.update(&buf[..n]);
        }
    }
    Ok(h.digest())
}

/// The pieces of `[start, end)` the fingerprint reads: its first and last
/// [`SAMPLE`] bytes (once, when they overlap).
pub(crate) fn sample_ranges(start: u64, end: u64) -> impl Iterator<Item = Range<u64>> {
    let len = end.saturating_sub(start);
    let (first, second) = if len <= 2 * SAMPLE {
        (start..end, None)
    } else {
        (start..start + SAMPLE, Some(end - SAMPLE..end))
    };
    std::iter::once(first).chain(second)
}

fn key_text(source_facts: &str, t: &TransformId) -> String {
    format!(
        "entry.format={ENTRY_FORMAT}\n{source_facts}\
         transform.name={}\ntransform.version={}\ntransform.machine={}\n\
         machine.arch={}\nmachine.os={}\nmachine.page_size={}\n",
        t.name.escape_default(),
        t.version,
        t.machine.escape_default(),
        std::env::consts::ARCH,
        std::env::consts::OS,
        page_size(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_cover_small_tensors_whole_and_large_ones_at_both_ends() {
        let ranges = |a, b| sample_ranges(a, b).collect::<Vec<_>>();
        assert_eq!(ranges(10, 10), vec![(10..10)]);
        assert_eq!(ranges(0, 8192), vec![(0..8192)]);
        assert_eq!(ranges(0, 8193), [0..4096, 4097..8193]);
    }

    #[test]
    fn every_fact_changes_the_key() {
        let t = TransformId {
            name: "f32".into(),
            version: 1,
            machine: "avx2".into(),
        };
        let base = key_text("source.size=1\n", &t);
        let mut others = vec![key_text("source.size=2\n", &t)];
        for change in [
            |t: &mut TransformId| t.name.push('x'),
            |t: &mut TransformId| t.version += 1,
            |t: &mut TransformId| t.machine.push('x'),
        ] {
            let mut t2 = t.clone();
            change(&mut t2);
            others.push(key_text("source.size=1\n", &t2));
        }
        for o in others {
            assert_ne!(o, base);
        }
    }

    #[test]
    fn a_name_cannot_forge_another_line() {
        let t = TransformId {
            name: "a\ntransform.version=7".into(),
            version: 1,
            machine: String::new(),
        };
        let text = key_text("source.size=1\n", &t);
        let lines = text.lines().filter(|l| l.starts_with("transform.version="));
        assert_eq!(lines.collect::<Vec<_>>(), ["transform.version=1"]);
    }
}
