//! Where a model's bytes are ([`Source`]), and the checks every path into a
//! file makes before reading it.

use std::fs::{File, Metadata};
use std::path::Path;

use crate::error::{Error, Result};
pub(crate) use crate::os::open_checked;

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
