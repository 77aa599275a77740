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
//! The JSON is parsed with `serde_json` into the `safetensors` crate's own
//! types, and the crate's validation ([`::safetensors::tensor::Metadata::new`]:
//! offsets contiguous from 0, no gaps, sizes matching dtype × shape) runs on
//! every header. Before it, weightmap makes its own checks, each with a typed
//! error naming the tensor: duplicate JSON keys (which `serde_json` would
//! silently collapse), unsupported sub-byte dtypes, element count and byte
//! size overflow, `data_offsets` that disagree with dtype × shape, data past
//! the end of the file, overlapping tensors. All arithmetic on values read
//! from the file is checked. Like the reference loader, weightmap also
//! requires the data section to end exactly at the end of the file.

use std::collections::{BTreeMap, HashSet};

use ::safetensors::tensor::{Metadata as StMetadata, TensorInfo as StTensorInfo};
use ::safetensors::Dtype;

use crate::error::{Error, Result};
use crate::tensor::{check_overlap, TensorInfo, TensorTable};
use crate::types::TensorType;

/// Largest JSON header accepted, in bytes: the `safetensors` crate's limit.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Bytes of the little-endian header length that starts the file.
pub const LEN_PREFIX: u64 = 8;

/// The key of the free-form string map in the JSON header.
pub const METADATA_KEY: &str = "__metadata__";

/// Whether `prefix` looks like the start of a safetensors file.
///
/// True when the first 8 bytes are a little-endian header length between 2
/// (`{}`) and [`MAX_HEADER_LEN`], and byte 8 is `{`. This only sniffs: a
/// `true` does not mean the header is valid.
///
/// ```
/// let mut bytes = 2u64.to_le_bytes().to_vec();
/// bytes.extend_from_slice(b"{}");
/// assert!(weightmap::safetensors::sniff(&bytes));
/// assert!(!weightmap::safetensors::sniff(b"GGUF\x03\0\0\0\0\0\0\0"));
/// ```
pub fn sniff(prefix: &[u8]) -> bool {
    let (Some(len), Some(&b'{')) = (read_len(prefix), prefix.get(LEN_PREFIX as usize)) else {
        return false;
    };
    (2..=MAX_HEADER_LEN).contains(&len)
}

/// The header length of a file that starts like safetensors (byte 8 is
/// `{`) but whose length prefix is over [`MAX_HEADER_LEN`], so that it gets
/// its own message rather than "unknown format".
pub(crate) fn oversized_len(prefix: &[u8]) -> Option<u64> {
    let len = read_len(prefix)?;
    (prefix.get(LEN_PREFIX as usize) == Some(&b'{') && len > MAX_HEADER_LEN).then_some(len)
}

fn read_len(prefix: &[u8]) -> Option<u64> {
    let b: [u8; 8] = prefix.get(..LEN_PREFIX as usize)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

/// The outcome of [`SafetensorsHeader::parse_prefix`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse {
    /// The prefix held the whole header.
    Complete(SafetensorsHeader),
    /// The prefix ends inside the header; at least `min_len` bytes of the file are needed.
    NeedMore {
        /// The prefix length to try next (at most the file's length).
        min_len: u64,
    },
}

/// A validated safetensors header. It owns its tables and borrows nothing.
///
/// ```
/// use std::collections::HashMap;
/// use safetensors::{tensor::TensorView, Dtype};
/// use weightmap::safetensors::SafetensorsHeader;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A tiny file: one F32 [2, 3] tensor and a metadata entry.
/// let data = [0u8; 24];
/// let view = TensorView::new(Dtype::F32, vec![2, 3], &data)?;
/// let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
/// let bytes = safetensors::serialize([("w", &view)], Some(meta))?;
///
/// let header = SafetensorsHeader::parse(&bytes)?;
/// assert_eq!(header.data_offset(), 8 + header.header_len());
/// assert_eq!(header.metadata()["format"], "pt");
/// let t = &header.tensors()[header.tensor_index("w").unwrap()];
/// assert_eq!((t.ty, &t.shape[..], t.nbytes), (weightmap::TensorType::F32, &[2u64, 3][..], 24));
/// assert_eq!(t.ne(), [3, 2]); // ggml order
/// assert_eq!(t.file_offset, header.data_offset());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorsHeader {
    header_len: u64,
    file_len: u64,
    tensors: TensorTable,
    metadata: BTreeMap<String, String>,
}

impl SafetensorsHeader {
    /// Parse and validate a whole file held in `whole`.
    ///
    /// # Errors
    /// As [`SafetensorsHeader::parse_prefix`] with `file_len = whole.len()`.
    pub fn parse(whole: &[u8]) -> Result<SafetensorsHeader> {
        let file_len = whole.len() as u64;
        match Self::parse_prefix(whole, file_len)? {
            Parse::Complete(h) => Ok(h),
            // Unreachable: with the prefix equal to the file, a short header is truncation.
            Parse::NeedMore { min_len } => Err(Error::Truncated {
                what: "safetensors header".into(),
                offset: file_len,
                needed: min_len.saturating_sub(file_len),
                file_len,
            }),
        }
    }

    /// Parse from the first bytes of a file that is `file_len` bytes long.
    ///
    /// Returns [`Parse::NeedMore`] when `prefix` is shorter than the 8-byte
    /// length plus the JSON header, with the prefix length needed; the caller
    /// reads more and calls again. Bytes of `prefix` past `file_len` are
    /// ignored. Tensor bounds are checked against `file_len`, so a complete
    /// parse has validated everything but the tensor bytes themselves.
    ///
    /// # Errors
    /// - [`Error::Truncated`]: the file is shorter than 8 bytes, or than the
    ///   header length it declares.
    /// - [`Error::InvalidUtf8`]: the JSON header is not UTF-8.
    /// - [`Error::DuplicateTensor`]: a tensor name appears twice in the JSON.
    /// - [`Error::TensorSizeOverflow`]: a tensor's element count or byte size
    ///   overflows u64, or its absolute offset does.
    /// - [`Error::TensorOutOfBounds`]: a tensor's bytes run past the end of the file.
    /// - [`Error::TensorOverlap`]: two tensors share bytes (zero-size tensors occupy none).
    /// - [`Error::SafetensorsHeader`]: everything else, naming the tensor
    ///   where there is one: header length over [`MAX_HEADER_LEN`], invalid
    ///   JSON, an unknown or sub-byte dtype, a malformed entry, `data_offsets`
    ///   that disagree with dtype × shape or run backwards, other duplicate
    ///   keys, what the `safetensors` crate's own validation rejects (gaps,
    ///   a data section not starting at 0), and bytes after the data section.
    pub fn parse_prefix(prefix: &[u8], file_len: u64) -> Result<Parse> {
        let prefix = &prefix[..prefix
            .len()
            .min(usize::try_from(file_len).unwrap_or(usize::MAX))];
        if file_len < LEN_PREFIX {
            return Err(Error::Truncated {
                what: "safetensors header length".into(),
                offset: 0,
                needed: LEN_PREFIX,
                file_len,
            });
        }
        let Some(n) = read_len(prefix) else {
            return Ok(Parse::NeedMore {
                min_len: LEN_PREFIX,
            });
        };
        if n > MAX_HEADER_LEN {
            return Err(header_err(format!(
                "header length {n} exceeds the limit of {MAX_HEADER_LEN} bytes"
            )));
        }
        // n <= MAX_HEADER_LEN, so this cannot overflow; checked all the same.
        let data_offset = n
            .checked_add(LEN_PREFIX)
            .ok_or_else(|| header_err(format!("header length {n} overflows")))?;
        if data_offset > file_len {
            return Err(Error::Truncated {
                what: "safetensors JSON header".into(),
                offset: LEN_PREFIX,
                needed: n,
                file_len,
            });
        }
        // data_offset <= file_len and prefix.len() <= file_len.
        let Some(json) = prefix.get(LEN_PREFIX as usize..data_offset as usize) else {
            return Ok(Parse::NeedMore {
                min_len: data_offset,
            });
        };
        parse_json(json, n, file_len).map(Parse::Complete)
    }

    /// Length of the JSON header in bytes (`n`, the file's first 8 bytes).
    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// Absolute offset of the data section: `8 + header_len()`.
    pub fn data_offset(&self) -> u64 {
        LEN_PREFIX + self.header_len
    }

    /// The file length the header was validated against.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Tensor descriptors in data order: by offset, then by end (zero-size
    /// tensors before a tensor starting at the same offset), then by name.
    pub fn tensors(&self) -> &[TensorInfo] {
        self.tensors.tensors()
    }

    /// Index (into [`SafetensorsHeader::tensors`]) of the tensor called `name`.
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.tensors.index(name)
    }

    /// The `__metadata__` string map; empty when the header has none.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
}

fn header_err(detail: String) -> Error {
    Error::SafetensorsHeader { detail }
}

fn overflow(name: &str, what: &'static str) -> Error {
    Error::TensorSizeOverflow {
        tensor: name.to_owned(),
        what,
    }
}

/// Map a safetensors dtype to weightmap's type. Sub-byte dtypes (and any the
/// crate adds later) are not supported: weightmap views whole bytes.
fn tensor_type(name: &str, dtype: Dtype) -> Result<TensorType> {
    Ok(match dtype {
        Dtype::F64 => TensorType::F64,
        Dtype::F32 => TensorType::F32,
        Dtype::F16 => TensorType::F16,
        Dtype::BF16 => TensorType::BF16,
        Dtype::I8 => TensorType::I8,
        Dtype::I16 => TensorType::I16,
        Dtype::I32 => TensorType::I32,
        Dtype::I64 => TensorType::I64,
        Dtype::U8 => TensorType::U8,
        Dtype::U16 => TensorType::U16,
        Dtype::U32 => TensorType::U32,
        Dtype::U64 => TensorType::U64,
        Dtype::BOOL => TensorType::Bool,
        Dtype::F8_E4M3 => TensorType::F8_E4M3,
        Dtype::F8_E5M2 => TensorType::F8_E5M2,
        Dtype::F8_E4M3FNUZ => TensorType::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ => TensorType::F8_E5M2FNUZ,
        Dtype::F8_E8M0 => TensorType::F8_E8M0,
        Dtype::C64 => TensorType::C64,
        other => {
            return Err(header_err(format!(
                "tensor '{name}': dtype {other:?} ({} bits per element) is not supported: \
                 weightmap views whole bytes",
                other.bitsize()
            )))
        }
    })
}

fn parse_json(json: &[u8], header_len: u64, file_len: u64) -> Result<SafetensorsHeader> {
    let data_offset = LEN_PREFIX + header_len;
    let text = std::str::from_utf8(json).map_err(|e| Error::InvalidUtf8 {
        what: "safetensors JSON header".into(),
        offset: LEN_PREFIX + e.valid_up_to() as u64,
    })?;
    let mut map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| header_err(format!("invalid JSON: {e}")))?;
    // serde_json keeps the last of repeated keys; the text is valid JSON now,
    // so scan it for repeats.
    check_duplicate_keys(text)?;

    let metadata: BTreeMap<String, String> = match map.remove(METADATA_KEY) {
        None => BTreeMap::new(),
        Some(v) => serde_json::from_value(v)
            .map_err(|e| header_err(format!("{METADATA_KEY}: {e} (expected a map of strings)")))?,
    };

    // The crate's own deserializer for each entry (dtype names, shape and
    // offsets as unsigned integers, no unknown fields checked by it).
    let mut entries: Vec<(String, StTensorInfo)> =
        crate::alloc::with_capacity(map.len(), "the tensor table")?;
    for (name, v) in map {
        let info: StTensorInfo =
            serde_json::from_value(v).map_err(|e| header_err(format!("tensor '{name}': {e}")))?;
        entries.push((name, info));
    }
    // Data order; the crate's validation expects (begin, end) order too.
    entries.sort_by(|(an, a), (bn, b)| a.data_offsets.cmp(&b.data_offsets).then(an.cmp(bn)));

    let data_len = file_len - data_offset; // data_offset <= file_len, checked by the caller
    let mut tensors: Vec<TensorInfo> =
        crate::alloc::with_capacity(entries.len(), "the tensor table")?;
    for (name, info) in &entries {
        tensors.push(check_tensor(name, info, data_offset, data_len, file_len)?);
    }
    check_overlap(&tensors)?;

    // The crate's validation: offsets contiguous from 0, sizes, overflow.
    // weightmap's checks above already reject all but gaps.
    let data_end = StMetadata::new(None, entries)
        .map_err(|e| header_err(e.to_string()))?
        .data_len() as u64;
    if data_end != data_len {
        return Err(header_err(format!(
            "the tensors' data ends at {} but the file is {file_len} bytes: \
             {} bytes after the data section are not covered by any tensor",
            data_offset + data_end,
            data_len - data_end
        )));
    }

    let tensors = TensorTable::new(tensors)?;

    Ok(SafetensorsHeader {
        header_len,
        file_len,
        tensors,
        metadata,
    })
}

fn check_tensor(
    name: &str,
    info: &StTensorInfo,
    data_offset: u64,
    data_len: u64,
    file_len: u64,
) -> Result<TensorInfo> {
    let ty = tensor_type(name, info.dtype)?;
    let shape: Box<[u64]> = info.shape.iter().map(|&d| d as u64).collect();
    let n_elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| overflow(name, "element count"))?;
    let nbytes = ty
        .bytes_for(n_elements)
        .ok_or_else(|| overflow(name, "byte size"))?;
    let (begin, end) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
    if end < begin {
        return Err(header_err(format!(
            "tensor '{name}': data_offsets [{begin}, {end}] end before they begin"
        )));
    }
    if end - begin != nbytes {
        return Err(header_err(format!(
            "tensor '{name}': dtype {:?} shape {:?} needs {nbytes} bytes but data_offsets \
             [{begin}, {end}] hold {}",
            info.dtype,
            info.shape,
            end - begin
        )));
    }
    if end > data_len {
        let start = data_offset
            .checked_add(begin)
            .ok_or_else(|| overflow(name, "offset + size"))?;
        let end = data_offset
            .checked_add(end)
            .ok_or_else(|| overflow(name, "offset + size"))?;
        return Err(Error::TensorOutOfBounds {
            tensor: name.to_owned(),
            start,
            end,
            file_len,
        });
    }
    // begin <= end <= data_len, so data_offset + begin <= file_len.
    Ok(TensorInfo {
        name: name.to_owned(),
        ty,
        shape,
        outer_first: true,
        offset: begin,
        file_offset: data_offset + begin,
        nbytes,
    })
}

/// Find a key repeated within one JSON object, at any depth. `text` must be
/// valid JSON (it has been parsed already), so the scan only tracks strings,
/// nesting and commas. Keys are compared decoded (`"a"` equals `"\u0061"`).
fn check_duplicate_keys(text: &str) -> Result<()> {
    struct Frame {
        /// Keys seen so far; `None` for an array.
        keys: Option<HashSet<String>>,
        /// The top-level key this frame sits under (for depth ≥ 2).
        under: Option<String>,
    }
    let b = text.as_bytes();
    let mut stack: Vec<Frame> = Vec::new();
    let mut expect_key = false;
    let mut last_top_key: Option<String> = None;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let mut j = i + 1;
                let mut escaped = false;
                while j < b.len() && b[j] != b'"' {
                    if b[j] == b'\\' {
                        escaped = true;
                        j += 1;
                    }
                    j += 1;
                }
                let raw = text.get(i..=j).unwrap_or("");
                if expect_key {
                    let key = if escaped {
                        serde_json::from_str::<String>(raw)
                            .map_err(|e| header_err(format!("invalid JSON key {raw}: {e}")))?
                    } else {
                        raw.get(1..raw.len().saturating_sub(1))
                            .unwrap_or("")
                            .to_owned()
                    };
                    let depth = stack.len();
                    if let Some(Frame {
                        keys: Some(keys),
                        under,
                    }) = stack.last_mut()
                    {
                        if keys.contains(&key) {
                            return Err(match (depth, under.as_deref()) {
                                (1, _) if key == METADATA_KEY => {
                                    header_err(format!("duplicate key '{METADATA_KEY}'"))
                                }
                                (1, _) => Error::DuplicateTensor { name: key },
                                (_, Some(METADATA_KEY)) => {
                                    header_err(format!("duplicate {METADATA_KEY} key '{key}'"))
                                }
                                (_, Some(t)) => {
                                    header_err(format!("tensor '{t}': duplicate key '{key}'"))
                                }
                                (_, None) => header_err(format!("duplicate key '{key}'")),
                            });
                        }
                        if depth == 1 {
                            last_top_key = Some(key.clone());
                        }
                        keys.insert(key);
                    }
                    expect_key = false;
                }
                i = j + 1;
                continue;
            }
            c @ (b'{' | b'[') => {
                let under = match stack.len() {
                    0 => None,
                    1 => last_top_key.clone(),
                    _ => stack.last().and_then(|f| f.under.clone()),
                };
                stack.push(Frame {
                    keys: (c == b'{').then(HashSet::new),
                    under,
                });
                expect_key = c == b'{';
            }
            b'}' | b']' => {
                stack.pop();
                expect_key = false;
            }
            b',' => expect_key = matches!(stack.last(), Some(Frame { keys: Some(_), .. })),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}
