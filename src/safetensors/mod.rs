//! The safetensors format layer: a validating header parser.
//!
//! A safetensors file is an 8-byte little-endian header length `n`, `n`
//! bytes of UTF-8 JSON, then the data section. The JSON maps each tensor
//! name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets
//! relative to the data section), plus an optional `__metadata__` map of
//! strings.
//!
//! [`SafetensorsHeader::parse`] reads a whole file held in memory;
//! [`SafetensorsHeader::parse_prefix`] parses from the first bytes of a file
//! whose full length is known and says how many bytes it needs when the
//! prefix is too short (like [`crate::gguf::GgufHeader::parse_prefix`]).
//!
//! The JSON is read once, by a serde visitor that builds the tensor table
//! as it goes (no `serde_json::Value` tree, no second parse). Each entry is
//! checked when it is read, each with a typed error naming the tensor: a
//! repeated key (which a plain `serde_json` map would silently collapse),
//! unknown and sub-byte dtypes (by the `safetensors` crate's `Dtype`),
//! element count and byte size overflow, `data_offsets` that disagree with
//! dtype × shape, data past the end of the file. Then, in data order:
//! overlapping tensors, and the `safetensors` crate's own rule that offsets
//! are contiguous from 0 (no gaps). All arithmetic on values read from the
//! file is checked. Like the reference loader, weightmap also requires the
//! data section to end exactly at the end of the file.
//!
//! The crate's `Metadata` is not built: it would hold a second copy of the
//! table (a `Vec` of its `TensorInfo` and a name → index `HashMap`), the
//! larger part of the cost of a header with a million tensors
//! (BENCHMARKS.md, "Many tensors").

mod header;
mod json;
mod spec;

pub use header::SafetensorsHeader;
pub(crate) use header::{oversized_len, sniff};
