//! [`SafetensorsHeader`]: the validated header of a safetensors file.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::tensor::{Parse, TensorTable};

use super::json;
use super::spec::{header_err, LEN_PREFIX, MAX_HEADER_LEN, METADATA_KEY};

/// Whether `prefix` looks like the start of a safetensors file.
///
/// True when the first 8 bytes are a little-endian header length between 2
/// (`{}`) and [`MAX_HEADER_LEN`], and byte 8 is `{`. This only sniffs: a
/// `true` does not mean the header is valid.
///
pub(crate) fn sniff(prefix: &[u8]) -> bool {
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
/// let t = &header.tensors().find("w").unwrap();
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
    /// `None` when the header has no `__metadata__` key.
    metadata: Option<BTreeMap<String, String>>,
}

impl SafetensorsHeader {
    /// Largest JSON header accepted, in bytes: the `safetensors` crate's limit.
    pub const MAX_HEADER_LEN: u64 = MAX_HEADER_LEN;
    /// Bytes of the little-endian header length that starts the file.
    pub const LEN_PREFIX: u64 = LEN_PREFIX;
    /// The key of the free-form string map in the JSON header.
    pub const METADATA_KEY: &'static str = METADATA_KEY;

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
    ///   where there is one: header length over [`SafetensorsHeader::MAX_HEADER_LEN`], invalid
    ///   JSON, an unknown or sub-byte dtype, a malformed entry, `data_offsets`
    ///   that disagree with dtype × shape or run backwards, other duplicate
    ///   keys, what the `safetensors` crate's contiguity rule rejects (gaps,
    ///   a data section not starting at 0), and bytes after the data section.
    pub fn parse_prefix(prefix: &[u8], file_len: u64) -> Result<Parse<SafetensorsHeader>> {
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
    pub fn tensors(&self) -> &TensorTable {
        &self.tensors
    }

    /// Index (into [`SafetensorsHeader::tensors`]) of the tensor called `name`.
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.tensors.index_of(name)
    }

    /// The `__metadata__` string map; empty when the header has none.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        self.metadata.as_ref().unwrap_or(&NONE)
    }

    /// Whether the header has a `__metadata__` key, empty or not: the
    /// `safetensors` crate's `metadata()` is `None` where it has none.
    pub fn has_metadata(&self) -> bool {
        self.metadata.is_some()
    }
}

fn parse_json(json: &[u8], header_len: u64, file_len: u64) -> Result<SafetensorsHeader> {
    let data_offset = LEN_PREFIX + header_len;
    let text = std::str::from_utf8(json).map_err(|e| Error::InvalidUtf8 {
        what: "safetensors JSON header".into(),
        offset: LEN_PREFIX + e.valid_up_to() as u64,
    })?;
    let bounds = json::Bounds {
        data_offset,
        data_len: file_len - data_offset, // data_offset <= file_len, checked by the caller
        file_len,
    };
    let json::Parsed { tensors, metadata } = json::parse(text, bounds)?;

    // Data order: by (begin, end), then name (unique by now). Every entry
    // was checked against the bounds as it was read.
    let tensors = tensors.finish(data_offset, file_len)?.into_data_order()?;
    tensors.check_overlap()?;

    // The safetensors crate's rule (`Metadata::validate`): in data order,
    // each tensor begins where the previous one ends, the first at 0. With
    // overlaps rejected above, what is left for it to find is a gap (or a
    // zero-size tensor inside another's bytes). Same message as the crate.
    let mut data_end = 0u64;
    for i in 0..tensors.len() {
        // From the entry alone: no descriptor view a tensor.
        let r = tensors.file_range(i);
        let offset = r.start - data_offset;
        if offset != data_end {
            return Err(header_err(format!(
                "invalid offset for tensor `{}`",
                tensors.name(i)
            )));
        }
        // Checked against data_len per tensor: no overflow.
        data_end = offset + (r.end - r.start);
    }
    if data_end != bounds.data_len {
        return Err(header_err(format!(
            "the tensors' data ends at {} but the file is {file_len} bytes: \
             {} bytes after the data section are not covered by any tensor",
            data_offset + data_end,
            bounds.data_len - data_end
        )));
    }

    Ok(SafetensorsHeader {
        header_len,
        file_len,
        tensors,
        metadata,
    })
}
