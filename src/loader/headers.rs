//! Headers read without loading: one file's ([`WeightsHeader`]) and a whole
//! model's ([`ModelHeaders`]), for inspecting and validating.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::format::{read_header, Header};
use crate::gguf::Metadata;
use crate::tensor::TensorInfo;

use super::source::open_checked;

/// A file's validated header, read without reading tensor data: what
/// `weightmap inspect` and `validate` use.
#[derive(Debug)]
pub struct WeightsHeader {
    header: Header,
    bytes: Vec<u8>,
}

impl WeightsHeader {
    /// Read and validate the header of `path` (every check the loader makes
    /// short of mapping and placing).
    ///
    /// # Errors
    /// As [`Weights::load_streamed`], less the tensor reads.
    pub fn read(path: impl AsRef<Path>) -> Result<WeightsHeader> {
        let path = path.as_ref();
        let (file, meta) = open_checked(path)?;
        let (header, bytes) = read_header(&file, meta.len(), path)?;
        Ok(WeightsHeader { header, bytes })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// GGUF metadata (`None` for safetensors).
    pub fn gguf_metadata(&self) -> Option<Metadata<'_>> {
        self.header.gguf_metadata(&self.bytes)
    }

    /// The first tensor whose file offset is not aligned as a buffer type of
    /// `buffer_alignment` needs for zero-copy placement (the mapping is
    /// page-aligned, so the file offset decides for alignments up to a page).
    pub fn first_misaligned(&self, buffer_alignment: usize) -> Option<(TensorInfo<'_>, usize)> {
        self.header.tensors().iter().find_map(|t| {
            let a = self.header.required_alignment(&t, buffer_alignment);
            (t.file_offset % a as u64 != 0).then_some((t, a))
        })
    }
}

/// The validated headers of every file of a model
/// ([`WeightsHeader::read_model`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct ModelHeaders {
    /// Each file and its header, in shard order (one entry for one file).
    pub files: Vec<(PathBuf, WeightsHeader)>,
    /// Warnings that are not errors (see [`LoadReport::warnings`]).
    pub warnings: Vec<String>,
}

impl ModelHeaders {
    /// The first file's header: the model's metadata.
    pub fn first(&self) -> &WeightsHeader {
        &self.files[0].1
    }

    /// Tensors over every file.
    pub fn tensor_count(&self) -> usize {
        self.files
            .iter()
            .map(|f| f.1.header().tensors().len())
            .sum()
    }

    /// Tensor bytes over every file.
    pub fn tensor_bytes(&self) -> u64 {
        self.files
            .iter()
            .flat_map(|f| f.1.header().tensors())
            .map(|t| t.nbytes)
            .sum()
    }

    /// Bytes of every file.
    pub fn file_len(&self) -> u64 {
        self.files.iter().map(|f| f.1.header().file_len()).sum()
    }
}
