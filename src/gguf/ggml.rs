//! ggml-exact validation: the rules of ggml's reference parser (`gguf.cpp`)
//! that weightmap's own parser deliberately does not apply.
//!
//! weightmap accepts any tensor layout whose offsets are aligned, in bounds
//! and non-overlapping, and it caps no string or array. ggml is stricter:
//! [`check_ggml`] answers "will ggml (and so llama.cpp) load this file?" for
//! a header weightmap has already accepted. The rules, in the order ggml
//! applies them (ggml `src/gguf.cpp`, `gguf_init_from_reader`, called
//! `gguf_init_from_file_impl` before ggml commit a0e918c; checked against
//! ggml commit d99724f):
//!
//! 1. [`GgmlRule::StringLength`]: every key, string value and string array
//!    element is at most [`GgmlRule::MAX_STRING_LENGTH`] bytes
//!    (`gguf_reader::read(std::string &)`).
//! 2. [`GgmlRule::ArrayLength`]: every array has at most
//!    [`GgmlRule::MAX_ARRAY_ELEMENTS`] elements, whatever their type
//!    (`gguf_reader::read(std::vector<T> &, size_t)`).
//! 3. [`GgmlRule::TensorName`]: tensor names are unique as C strings, that
//!    is up to their first NUL byte (ggml copies names into a `char[64]`
//!    with `ggml_set_name` and compares them with `strcmp`).
//! 4. [`GgmlRule::PackedOffsets`]: each tensor's offset equals the sum of
//!    the sizes, padded to the alignment, of the tensors before it: tensors
//!    in file order, packed, with no gaps (`ti.offset != ctx->size`).
//! 5. [`GgmlRule::DataSection`]: the data section, the last tensor's
//!    padding included, lies within the file (ggml reads `ctx->size` bytes
//!    from the data offset when it loads tensor data). llama.cpp's model
//!    loader does not load tensor data through ggml, so this is the one
//!    rule llama.cpp itself does not apply; see [`GgmlRule::refused_by`].
//!
//! ```
//! use weightmap::gguf::{self, GgufHeader};
//! # fn main() -> weightmap::Result<()> {
//! let mut w = gguf::Writer::new(32);
//! w.kv_str("general.architecture", "llama");
//! w.tensor("a", weightmap::TensorType::F32, &[3], vec![0u8; 12]);
//! w.tensor("b", weightmap::TensorType::F32, &[8], vec![0u8; 32]);
//! let bytes = w.to_bytes();
//! let file = GgufHeader::parse(&bytes)?;
//! let s = gguf::check_ggml(&file, &file.metadata_in(&bytes))?;
//! assert_eq!((s.tensors, s.data_section_len), (2, 64));
//! # Ok(()) }
//! ```

use std::collections::HashMap;

use super::metadata::{Metadata, Value};
use super::parse::GgufHeader;
use crate::error::{Error, Result};

/// ggml's cap on a string's length in bytes (`GGUF_MAX_STRING_LENGTH`,
/// 1 GiB): keys, string values and the elements of string arrays.
const GGUF_MAX_STRING_LENGTH: u64 = 1024 * 1024 * 1024;

/// ggml's cap on an array's element count (`GGUF_MAX_ARRAY_ELEMENTS`,
/// 2^30), for arrays of every element type.
const GGUF_MAX_ARRAY_ELEMENTS: u64 = 1024 * 1024 * 1024;

impl GgmlRule {
    /// ggml's cap on a string's length in bytes (`GGUF_MAX_STRING_LENGTH`,
    /// 1 GiB), which [`GgmlRule::StringLength`] applies.
    pub const MAX_STRING_LENGTH: u64 = GGUF_MAX_STRING_LENGTH;
    /// ggml's cap on an array's element count (`GGUF_MAX_ARRAY_ELEMENTS`,
    /// 2^30), which [`GgmlRule::ArrayLength`] applies.
    pub const MAX_ARRAY_ELEMENTS: u64 = GGUF_MAX_ARRAY_ELEMENTS;
}

use crate::error::GgmlRule;

/// What [`check_ggml`] checked, for a report line.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GgmlSummary {
    /// Metadata entries checked.
    pub keys: usize,
    /// Strings checked against the length cap (keys, values, elements).
    pub strings: u64,
    /// Arrays checked against the element cap.
    pub arrays: u64,
    /// Tensors checked.
    pub tensors: usize,
    /// The data section's length as ggml computes it: the sum of the
    /// tensors' sizes, each padded to the alignment.
    pub data_section_len: u64,
}

fn refuse(rule: GgmlRule, detail: String) -> Error {
    Error::GgmlWouldRefuse { rule, detail }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    // `a` is a nonzero power of two (the parser validated it).
    x.checked_add(a.checked_sub(1)?).map(|v| v & !(a - 1))
}

fn check_string(what: impl FnOnce() -> String, len: u64) -> Result<()> {
    if len > GGUF_MAX_STRING_LENGTH {
        return Err(refuse(
            GgmlRule::StringLength,
            format!(
                "{} is {len} bytes, over ggml's GGUF_MAX_STRING_LENGTH of {GGUF_MAX_STRING_LENGTH}",
                what()
            ),
        ));
    }
    Ok(())
}

/// Check a header weightmap has accepted against the rules of ggml's
/// parser that weightmap does not apply, each a [`GgmlRule`] with its
/// source. `metadata` must be the header's metadata over the bytes it was
/// parsed from ([`GgufHeader::metadata_in`], or
/// [`crate::Header::gguf_metadata`]).
///
/// Reads no tensor data and allocates only a name table.
///
/// # Errors
/// The first violation in file order, as [`Error::GgmlWouldRefuse`] naming
/// the rule, the key or tensor, and the sizes or offsets involved;
/// [`Error::MetadataIncomplete`] when `metadata` does not hold every entry
/// of the header.
pub fn check_ggml(header: &GgufHeader, metadata: &Metadata<'_>) -> Result<GgmlSummary> {
    let mut summary = GgmlSummary {
        keys: 0,
        strings: 0,
        arrays: 0,
        tensors: header.tensors().len(),
        data_section_len: 0,
    };

    // ---- key/value pairs, in file order, as ggml reads them ----
    for (key, value) in metadata.iter() {
        summary.keys += 1;
        summary.strings += 1;
        check_string(|| format!("key '{key}'"), key.len() as u64)?;
        match value {
            Value::String(s) => {
                summary.strings += 1;
                check_string(
                    || format!("string value of key '{key}'"),
                    s.as_bytes().len() as u64,
                )?;
            }
            Value::Array(a) => {
                summary.arrays += 1;
                if a.len() > GGUF_MAX_ARRAY_ELEMENTS {
                    return Err(refuse(
                        GgmlRule::ArrayLength,
                        format!(
                            "array '{key}' of {} has {} elements, over ggml's \
                             GGUF_MAX_ARRAY_ELEMENTS of {GGUF_MAX_ARRAY_ELEMENTS}",
                            a.elem_type().name(),
                            a.len()
                        ),
                    ));
                }
                if let Ok(strings) = a.strings() {
                    for (i, s) in strings.enumerate() {
                        summary.strings += 1;
                        check_string(
                            || format!("string {i} of array '{key}'"),
                            s.as_bytes().len() as u64,
                        )?;
                    }
                }
            }
            _ => {}
        }
    }
    if summary.keys != header.kv_count() {
        return Err(Error::MetadataIncomplete {
            expected: header.kv_count(),
            found: summary.keys,
        });
    }

    // ---- tensor names, compared as C strings ----
    let mut seen: HashMap<&[u8], usize> = HashMap::new();
    for (i, t) in header.tensors().iter().enumerate() {
        let bytes = t.name.as_bytes();
        let c_name = bytes
            .iter()
            .position(|&b| b == 0)
            .map_or(bytes, |nul| &bytes[..nul]);
        if let Some(&j) = seen.get(c_name) {
            let other = header.tensors().at(j).name;
            return Err(refuse(
                GgmlRule::TensorName,
                format!(
                    "tensors {j} '{}' and {i} '{}' have the same name up to the first NUL \
                     byte ('{}'), which ggml compares",
                    other,
                    t.name,
                    String::from_utf8_lossy(c_name)
                ),
            ));
        }
        seen.insert(c_name, i);
    }

    // ---- offsets: the running sum of padded sizes ----
    let alignment = header.alignment();
    let mut expected = 0u64;
    for (i, t) in header.tensors().iter().enumerate() {
        if t.offset != expected {
            let why = if t.offset > expected {
                format!("a gap of {} bytes before it", t.offset - expected)
            } else {
                "it starts before the end of the previous tensor's padded size \
                 (tensors out of file order, or padded less than the alignment)"
                    .to_owned()
            };
            return Err(refuse(
                GgmlRule::PackedOffsets,
                format!(
                    "tensor {i} '{}' has offset {}, expected {expected} (the sizes of the \
                     tensors before it, each padded to {alignment}): {why}",
                    t.name, t.offset
                ),
            ));
        }
        let padded = align_up(t.nbytes, alignment).ok_or_else(|| {
            refuse(
                GgmlRule::PackedOffsets,
                format!("tensor {i} '{}': padded size overflows", t.name),
            )
        })?;
        expected = expected.checked_add(padded).ok_or_else(|| {
            refuse(
                GgmlRule::PackedOffsets,
                format!(
                    "tensor {i} '{}': the data section size overflows ({expected} + {padded})",
                    t.name
                ),
            )
        })?;
    }
    summary.data_section_len = expected;

    // ---- the data section, padding included, within the file ----
    if let Some(last) = header.tensors().iter().next_back() {
        let end = header.data_offset().checked_add(expected);
        let file_len = header.file_len();
        let pad = expected.saturating_sub(last.offset.saturating_add(last.nbytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                let (end_text, short) = match end {
                    Some(e) => (e.to_string(), (e - file_len).to_string()),
                    None => ("overflow".to_owned(), "more than 2^64".to_owned()),
                };
                return Err(refuse(
                    GgmlRule::DataSection,
                    format!(
                        "the data section [{}, {end_text}) ({expected} bytes: every tensor \
                         padded to {alignment}) ends {short} bytes past the end of the file \
                         ({file_len} bytes): {short} of the {pad} padding bytes after the last \
                         tensor '{}' are missing",
                        header.data_offset(),
                        last.name
                    ),
                ));
            }
        }
    }
    Ok(summary)
}
