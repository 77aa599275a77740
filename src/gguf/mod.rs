//! The GGUF format layer: a zero-copy, validating header parser.
//!
//! [`GgufHeader::parse`] reads a whole file held in memory (a mapping,
//! usually); [`GgufHeader::metadata_in`] reads its key/values from those
//! bytes: keys and string values are never copied, arrays are decoded on
//! demand. [`GgufHeader::parse_prefix`] parses from the
//! first bytes of a file whose full length is known, and says how many bytes
//! it needs when the prefix is too short, so the streaming loader can read
//! the header without reading tensor data.
//!
//! Every check is done before anything is returned; see [`crate::Error`] for
//! what is rejected. No allocation is sized by a count the file claims: tables
//! grow one parsed entry at a time, and each entry consumes real bytes.

mod ggml;
mod metadata;
mod parse;
mod scan;
mod spec;
mod write;

pub use crate::error::GgmlRule;
pub use ggml::{check_ggml, GgmlSummary};
pub use metadata::{Array, ArrayElem, GgufStr, KvLayout, MetaInt, Metadata, Value, ValueType};
pub(crate) use parse::read_windowed;
#[doc(hidden)]
pub use parse::read_windowed_for_fuzzing;
pub use parse::GgufHeader;
pub use write::{OwnedValue, Writer};
