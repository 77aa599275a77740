//! The loader: [`Weights::load`] maps a file and places its tensors
//! zero-copy (copying only those that cannot be viewed in place), or streams
//! them into owned buffers, and reports which ran.
//!
//! One idea a module: [`options`](LoadOptions) (what to do), `report` (what
//! was done), `mapped` (the mapped path), `stream` (the stream path),
//! `place` (owned buffers laid out and filled, shared by both), `weights`
//! (the [`Weights`] facade and its tensor handles).
//!
//! ```
//! use weightmap::{gguf::write::Writer, LoadMode, LoadOptions, TensorType, Weights};
//! # fn main() -> weightmap::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("model.gguf");
//! let mut w = Writer::new(32);
//! w.kv_u32("llama.block_count", 1);
//! w.tensor("w", TensorType::F32, &[4], 1.5f32.to_le_bytes().repeat(4));
//! w.write_with(std::fs::File::create(&path).unwrap(), |_, _| {}).unwrap();
//!
//! // SAFETY: nothing modifies or truncates the file while `weights` lives.
//! let weights = unsafe { Weights::load(&path, &LoadOptions::default())? };
//! assert_eq!(weights.report().tensors_mapped, 1);
//! assert_eq!(weights.report().mode_used, LoadMode::Mmap);
//! assert_eq!(weights.tensor("w")?.view::<f32>()?, &[1.5; 4]);
//! assert_eq!(weights.gguf_metadata().unwrap().get_u32("llama.block_count")?, 1);
//!
//! // The stream path is safe and gives the same bytes.
//! let streamed = Weights::load_streamed(&path, &LoadOptions::default())?;
//! assert_eq!(streamed.tensor("w")?.to_vec()?, weights.tensor("w")?.to_vec()?);
//! # Ok(()) }
//! ```

use std::fs::{File, Metadata};
use std::path::Path;

use crate::error::{Error, Result};

mod handle;
mod mapped;
mod options;
mod place;
mod read;
mod report;
mod shards;
mod stream;
mod weights;

pub use crate::error::FallbackReason;
pub use crate::prefetch::{AdvicePolicy, Prefetch};
pub use handle::{Scope, Tensor};
pub use options::{LoadMode, LoadOptions, Route};
pub use read::{DirectIo, DirectOutcome, ProgressFn, ReadReport, PROGRESS_STEP};
pub use report::{BufferReport, CopiedTensor, CopyReason, LoadReport, PlacementKind};
pub use weights::{
    BorrowedWeights, MappedWeights, ModelHeaders, OwnedTensor, ShardReport, TensorRef, Weights,
    WeightsHeader,
};

/// Open `path` for loading: `stat` it first (opening a FIFO would block until
/// a writer appears) and refuse anything but a regular file, open it, and
/// refuse an empty one. Every path into a file goes through here, so the
/// errors are the same whichever path runs: [`Error::Io`] (with the OS's
/// `io::ErrorKind`: `NotFound`, `PermissionDenied`, ...), [`Error::NotAFile`],
/// [`Error::EmptyFile`]. Returns the file and its metadata as opened.
pub(crate) fn open_checked(path: &Path) -> Result<(File, Metadata)> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io("stat", path, e))?;
    if !meta.is_file() {
        return Err(Error::NotAFile { path: path.into() });
    }
    let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
    if meta.len() == 0 {
        return Err(Error::EmptyFile { path: path.into() });
    }
    Ok((file, meta))
}

/// Where a model's bytes are.
pub(crate) enum Source<'a> {
    /// A file, by path.
    Path(&'a Path),
    /// `[offset, offset + len)` of an open file.
    Range {
        file: &'a File,
        offset: u64,
        len: u64,
    },
    /// Memory the caller handed over.
    Memory(std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>),
}

impl Source<'_> {
    /// A name for messages and the report.
    pub(crate) fn label(&self) -> std::path::PathBuf {
        match self {
            Source::Path(p) => p.to_path_buf(),
            Source::Range { offset, len, .. } => {
                format!("<file range: {len} bytes at offset {offset}>").into()
            }
            Source::Memory(m) => format!("<memory: {} bytes>", (**m).as_ref().len()).into(),
        }
    }
}

/// Check an open file range: the file is regular and holds the whole range,
/// and the range is not empty. Returns the file's metadata.
pub(crate) fn check_range(file: &File, offset: u64, len: u64, label: &Path) -> Result<Metadata> {
    let meta = file.metadata().map_err(|e| Error::io("stat", label, e))?;
    if !meta.is_file() {
        return Err(Error::NotAFile { path: label.into() });
    }
    if len == 0 {
        return Err(Error::EmptyFile { path: label.into() });
    }
    match offset.checked_add(len) {
        Some(end) if end <= meta.len() => Ok(meta),
        _ => Err(Error::Truncated {
            what: "file range".into(),
            offset,
            needed: len,
            file_len: meta.len(),
        }),
    }
}

#[cfg(test)]
mod tests;
