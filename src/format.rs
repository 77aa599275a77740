//! Format detection and the format-agnostic header.

use std::fs::File;

use crate::alloc::read_more;
use crate::error::{Error, Result};
use crate::gguf::{self, GgufHeader, Metadata};
use crate::os::read_at;
use crate::safetensors::{self as st, SafetensorsHeader};
use crate::tensor::Parse;
use crate::tensor::{TensorInfo, TensorTable};

/// A weight file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// GGUF (ggml's format), versions 2 and 3.
    Gguf,
    /// safetensors (an 8-byte length, a JSON header, then data).
    Safetensors,
}

impl Format {
    /// Lowercase name: `"gguf"` or `"safetensors"`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Gguf => "gguf",
            Format::Safetensors => "safetensors",
        }
    }

    /// Tell the format from a file's first bytes (at least 9 of them, or the
    /// whole file if shorter), by content, not by extension. A file that
    /// starts like the GGUF magic, or is too short to tell, is taken as GGUF,
    /// whose parser then says precisely what is wrong.
    ///
    /// # Errors
    /// [`Error::SafetensorsHeader`] for a safetensors-like start whose header
    /// length is over [`SafetensorsHeader::MAX_HEADER_LEN`];
    /// [`Error::UnknownFormat`] for anything else unrecognised.
    pub fn detect(prefix: &[u8]) -> Result<Format> {
        let n = prefix.len().min(4);
        if prefix[..n] == GgufHeader::MAGIC[..n] {
            Ok(Format::Gguf)
        } else if st::sniff(prefix) {
            Ok(Format::Safetensors)
        } else if let Some(len) = st::oversized_len(prefix) {
            Err(Error::SafetensorsHeader {
                detail: format!(
                    "header length {len} exceeds the limit of {} bytes",
                    SafetensorsHeader::MAX_HEADER_LEN
                ),
            })
        } else {
            Err(Error::UnknownFormat)
        }
    }
}

/// A validated header of either format.
#[derive(Debug, Clone)]
pub enum Header {
    /// A GGUF header.
    Gguf(GgufHeader),
    /// A safetensors header.
    Safetensors(SafetensorsHeader),
}

impl Header {
    /// Detect the format and parse a whole file held in `bytes`.
    ///
    /// # Errors
    /// [`Error::UnknownFormat`] or the format's own validation error.
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        Ok(match Format::detect(bytes)? {
            Format::Gguf => Header::Gguf(GgufHeader::parse(bytes)?),
            Format::Safetensors => Header::Safetensors(SafetensorsHeader::parse(bytes)?),
        })
    }

    /// Parse a header from the first bytes of a file of `file_len` bytes:
    /// [`Parse::NeedMore`] says how many bytes the header needs when `prefix`
    /// holds too few.
    ///
    /// # Errors
    /// As [`Header::parse`].
    pub fn parse_prefix(prefix: &[u8], file_len: u64) -> Result<Parse<Header>> {
        if (prefix.len() as u64) < file_len.min(9) {
            return Ok(Parse::NeedMore {
                min_len: file_len.min(9),
            });
        }
        Ok(match Format::detect(prefix)? {
            Format::Gguf => GgufHeader::parse_prefix(prefix, file_len)?.map(Header::Gguf),
            Format::Safetensors => {
                SafetensorsHeader::parse_prefix(prefix, file_len)?.map(Header::Safetensors)
            }
        })
    }

    /// The format.
    pub fn format(&self) -> Format {
        match self {
            Header::Gguf(_) => Format::Gguf,
            Header::Safetensors(_) => Format::Safetensors,
        }
    }

    /// Tensor descriptors in file order.
    pub fn tensors(&self) -> &TensorTable {
        match self {
            Header::Gguf(h) => h.tensors(),
            Header::Safetensors(h) => h.tensors(),
        }
    }

    /// Index of the tensor called `name`.
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        match self {
            Header::Gguf(h) => h.tensor_index(name),
            Header::Safetensors(h) => h.tensor_index(name),
        }
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        match self {
            Header::Gguf(h) => h.data_offset(),
            Header::Safetensors(h) => h.data_offset(),
        }
    }

    /// The file length the header was validated against.
    pub fn file_len(&self) -> u64 {
        match self {
            Header::Gguf(h) => h.file_len(),
            Header::Safetensors(h) => h.file_len(),
        }
    }

    /// The alignment the file promises for tensor offsets: GGUF's
    /// `general.alignment` (default 32); 1 for safetensors, which promises none.
    pub fn file_alignment(&self) -> u64 {
        match self {
            Header::Gguf(h) => h.alignment(),
            Header::Safetensors(_) => 1,
        }
    }

    /// The alignment a tensor's address must have to be placed zero-copy in
    /// a buffer of a type with alignment `buffer_alignment`.
    ///
    /// GGUF tensors feed ggml kernels, which assume the buffer type's
    /// alignment: the full `buffer_alignment` applies. safetensors promises
    /// only what its writers do in practice (offsets that are multiples of
    /// the element size, after a header padded to 8), and what a typed view
    /// needs is the element's alignment: the element size (capped at
    /// `buffer_alignment`) applies. See ARCHITECTURE.md.
    pub fn required_alignment(&self, info: &TensorInfo, buffer_alignment: usize) -> usize {
        self.alignment_for(info.ty, buffer_alignment)
    }

    /// [`Header::required_alignment`] for a tensor of type `ty`.
    pub(crate) fn alignment_for(
        &self,
        ty: crate::types::TensorType,
        buffer_alignment: usize,
    ) -> usize {
        match self {
            Header::Gguf(_) => buffer_alignment,
            Header::Safetensors(_) => {
                let elem = usize::try_from(ty.type_size()).unwrap_or(1);
                let elem = if elem.is_power_of_two() { elem } else { 1 };
                elem.min(buffer_alignment)
            }
        }
    }

    /// `[start, end)` in the file covering every tensor (zero-size ones
    /// included), or an empty range at the data offset when there are none.
    pub fn tensor_region(&self) -> (u64, u64) {
        let mut it = self.tensors().iter();
        let Some(first) = it.next() else {
            let d = self.data_offset().min(self.file_len());
            return (d, d);
        };
        let mut span = (first.file_offset, first.file_offset + first.nbytes);
        for t in it {
            span.0 = span.0.min(t.file_offset);
            span.1 = span.1.max(t.file_offset + t.nbytes);
        }
        span
    }

    /// GGUF metadata, read from `bytes` (the bytes the header was parsed from).
    pub fn gguf_metadata<'a>(&'a self, bytes: &'a [u8]) -> Option<Metadata<'a>> {
        match self {
            Header::Gguf(h) => Some(h.metadata_in(bytes)),
            Header::Safetensors(_) => None,
        }
    }

    /// The safetensors `__metadata__` map.
    pub fn safetensors_metadata(&self) -> Option<&std::collections::BTreeMap<String, String>> {
        match self {
            Header::Gguf(_) => None,
            Header::Safetensors(h) => Some(h.metadata()),
        }
    }
}

/// First read of a header: large enough for most headers in one go, small
/// next to any model.
const FIRST_READ: u64 = 1 << 20;

/// Read and validate the header of an open file of `file_len` bytes, reading
/// only as much of the file as the header needs (plus at most one read's
/// slack). Returns the header and the bytes read.
pub(crate) fn read_header(
    file: &File,
    file_len: u64,
    path: &std::path::Path,
) -> Result<(Header, Vec<u8>)> {
    read_header_at(file, 0, file_len, path)
}

/// [`read_header`] for a model of `file_len` bytes that starts at `base` in
/// a larger file: every offset is relative to `base`.

pub(crate) fn read_header_at(
    file: &File,
    base: u64,
    file_len: u64,
    path: &std::path::Path,
) -> Result<(Header, Vec<u8>)> {
    let mut bytes: Vec<u8> = Vec::new();
    let mut want = file_len.min(FIRST_READ);
    loop {
        let have = bytes.len();
        usize::try_from(want).map_err(|_| Error::Truncated {
            what: "header".into(),
            offset: 0,
            needed: want,
            file_len,
        })?;
        read_more(&mut bytes, want, &mut |buf, off| {
            read_at(file, buf, base + off).map_err(|e| Error::io("read", path, e))
        })?;
        match Header::parse_prefix(&bytes, file_len)? {
            Parse::Complete(h) => {
                // Keep the header only: the slack of the last read is tensor
                // data, which the caller reads into place itself.
                let header_end = match &h {
                    Header::Gguf(g) => g.header_len(),
                    Header::Safetensors(s) => s.data_offset(),
                };
                bytes.truncate(usize::try_from(header_end).unwrap_or(bytes.len()));
                bytes.shrink_to_fit();
                return Ok((h, bytes));
            }
            Parse::NeedMore { min_len: min } => {
                // A GGUF header longer than the first read: its key/value
                // section is read whole (to its end, found by a walk over
                // its length fields) and its descriptors through a window,
                // so the header is never held whole beside the table made
                // from it.
                if have == 0 && bytes.starts_with(&GgufHeader::MAGIC) {
                    let (h, kv) = gguf::read_windowed(bytes, file_len, |buf, off| {
                        read_at(file, buf, base + off).map_err(|e| Error::io("read", path, e))
                    })?;
                    return Ok((Header::Gguf(h), kv));
                }
                // Otherwise grow geometrically, so a huge header costs O(n)
                // reads and O(n log n) re-parsing at worst; never past the file.
                want = min.max(want.saturating_mul(2)).min(file_len);
                if want <= bytes.len() as u64 {
                    // The parser asked for no more than it has: cannot happen,
                    // but never loop forever on it.
                    return Err(Error::Truncated {
                        what: "header".into(),
                        offset: bytes.len() as u64,
                        needed: min.saturating_sub(bytes.len() as u64),
                        file_len,
                    });
                }
            }
        }
    }
}
