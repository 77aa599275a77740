//! [`ModelHeaders`]: a whole model's headers, read and checked against
//! each other without loading, for inspecting and validating.

use std::path::PathBuf;

use crate::format::Header;

/// The validated headers of every file of a model
/// ([`ModelHeaders::read`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct ModelHeaders {
    /// Each file and its header, in shard order (one entry for one file).
    pub files: Vec<(PathBuf, Header)>,
    /// Warnings that are not errors (see [`crate::LoadReport::warnings`]).
    pub warnings: Vec<String>,
}

impl ModelHeaders {
    /// The first file's header: the model's metadata.
    pub fn first(&self) -> &Header {
        &self.files[0].1
    }

    /// Tensors over every file.
    pub fn tensor_count(&self) -> usize {
        self.files.iter().map(|f| f.1.tensors().len()).sum()
    }

    /// Tensor bytes over every file.
    pub fn tensor_bytes(&self) -> u64 {
        self.files
            .iter()
            .flat_map(|f| f.1.tensors())
            .map(|t| t.nbytes)
            .sum()
    }

    /// Bytes of every file.
    pub fn file_len(&self) -> u64 {
        self.files.iter().map(|f| f.1.file_len()).sum()
    }
}
