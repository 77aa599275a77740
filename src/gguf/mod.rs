//! The GGUF format layer: a zero-copy, validating header parser.
//!
//! [`Gguf::parse`] reads a whole file held in memory (a mapping, usually) and
//! returns a view that borrows it: keys and string values are never copied,
//! arrays are decoded on demand. [`GgufHeader::parse_prefix`] parses from the
//! first bytes of a file whose full length is known, and says how many bytes
//! it needs when the prefix is too short, so the streaming loader can read
//! the header without reading tensor data.
//!
//! Every check is done before anything is returned; see [`crate::Error`] for
//! what is rejected. No allocation is sized by a count the file claims: tables
//! grow one parsed entry at a time, and each entry consumes real bytes.

pub mod ggml;
mod metadata;
mod parse;
pub(crate) mod scan;
pub mod write;

pub use crate::format::Parse;
pub use metadata::{
    Array, ArrayElem, GgufStr, MetaInt, Metadata, StrIter, Value, ValueType, ARCHITECTURE_KEY,
};
pub(crate) use parse::read_windowed;
#[doc(hidden)]
pub use parse::read_windowed_for_fuzzing;
pub use parse::GgufHeader;

use crate::error::Result;
use crate::tensor::{TensorInfo, TensorTable};

/// The GGUF magic, the file's first four bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// The alignment that applies when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Longest tensor name ggml accepts, in bytes (`GGML_MAX_NAME - 1`).
pub const MAX_NAME_LEN: u64 = 63;

/// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;

/// A parsed GGUF file: the validated header plus the bytes it borrows from.
///
/// ```
/// use weightmap::gguf::{self, Gguf};
/// # fn main() -> weightmap::Result<()> {
/// let mut w = gguf::write::Writer::new(32);
/// w.kv_u32("llama.block_count", 2);
/// w.kv_str("general.architecture", "llama");
/// w.tensor("tok_embd", weightmap::TensorType::F32, &[4, 2], vec![0u8; 32]);
/// let bytes = w.to_bytes();
///
/// let file = Gguf::parse(&bytes)?;
/// assert_eq!(file.metadata().get_u32("llama.block_count")?, 2);
/// assert_eq!(file.metadata().get_str("general.architecture")?, "llama");
/// let t = &file.tensors().get(0).unwrap();
/// assert_eq!((t.name, t.shape, t.nbytes), ("tok_embd", &[4u64, 2][..], 32));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Gguf<'a> {
    bytes: &'a [u8],
    header: GgufHeader,
}

impl<'a> Gguf<'a> {
    /// Parse and validate a whole GGUF file held in `bytes`, including that
    /// every tensor lies within `bytes`.
    ///
    /// # Errors
    /// Any header or tensor-descriptor problem, as a typed [`crate::Error`].
    pub fn parse(bytes: &'a [u8]) -> Result<Gguf<'a>> {
        let header = GgufHeader::parse(bytes)?;
        Ok(Gguf { bytes, header })
    }

    /// The validated header (owned; it borrows nothing).
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The file's metadata.
    pub fn metadata(&self) -> Metadata<'_> {
        self.header.metadata_in(self.bytes)
    }

    /// Tensor descriptors in file order.
    pub fn tensors(&self) -> &TensorTable {
        self.header.tensors()
    }

    /// The bytes of one tensor, by descriptor.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &'a [u8] {
        // Validated at parse: file_offset + nbytes <= file_len == bytes.len().
        let start = info.file_offset as usize;
        &self.bytes[start..start + info.nbytes as usize]
    }

    /// Give the header up, keeping nothing borrowed.
    pub fn into_header(self) -> GgufHeader {
        self.header
    }
}
