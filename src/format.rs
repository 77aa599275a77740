//! Format detection and the format-agnostic header.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::alloc::read_more;
use crate::error::{Error, Result};
use crate::gguf::{self, GgufHeader, Metadata};
use crate::os::{open_checked, read_at, Mapping};
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

/// The validated header of a weight file, either format: its tensor table,
/// and the bytes it was read from, which GGUF metadata is read from
/// lazily ([`Header::gguf_metadata`]). On the mapped path those bytes are
/// the mapping's (nothing is copied); elsewhere they are the header's own
/// bytes, read or copied once.
#[derive(Debug, Clone)]
pub struct Header {
    parsed: Parsed,
    bytes: HeaderBytes,
}

/// The header as its format's parser returned it.
#[derive(Debug, Clone)]
enum Parsed {
    Gguf(GgufHeader),
    Safetensors(SafetensorsHeader),
}

/// Where a header's bytes are.
#[derive(Debug, Clone)]
enum HeaderBytes {
    /// The header's own bytes (up to the data section).
    Owned(Vec<u8>),
    /// The mapping of the whole file, which the header keeps alive.
    Mapped(Arc<Mapping>),
}

impl Parsed {
    /// Where the header ends: the first byte not read by the parser.
    fn end(&self) -> u64 {
        match self {
            Parsed::Gguf(g) => g.header_len(),
            Parsed::Safetensors(s) => s.data_offset(),
        }
    }

    fn parse_prefix(prefix: &[u8], file_len: u64) -> Result<Parse<Parsed>> {
        if (prefix.len() as u64) < file_len.min(9) {
            return Ok(Parse::NeedMore {
                min_len: file_len.min(9),
            });
        }
        Ok(match Format::detect(prefix)? {
            Format::Gguf => GgufHeader::parse_prefix(prefix, file_len)?.map(Parsed::Gguf),
            Format::Safetensors => {
                SafetensorsHeader::parse_prefix(prefix, file_len)?.map(Parsed::Safetensors)
            }
        })
    }
}

impl Header {
    /// Detect the format and parse a whole file held in `bytes`. The
    /// header's bytes are copied into it; the tensor data is not.
    ///
    /// # Errors
    /// [`Error::UnknownFormat`] or the format's own validation error.
    pub fn parse(bytes: &[u8]) -> Result<Header> {
        let parsed = match Format::detect(bytes)? {
            Format::Gguf => Parsed::Gguf(GgufHeader::parse(bytes)?),
            Format::Safetensors => Parsed::Safetensors(SafetensorsHeader::parse(bytes)?),
        };
        Ok(Header::owning(parsed, bytes))
    }

    /// Parse a header from the first bytes of a file of `file_len` bytes:
    /// [`Parse::NeedMore`] says how many bytes the header needs when `prefix`
    /// holds too few.
    ///
    /// # Errors
    /// As [`Header::parse`].
    pub fn parse_prefix(prefix: &[u8], file_len: u64) -> Result<Parse<Header>> {
        Ok(Parsed::parse_prefix(prefix, file_len)?.map(|p| Header::owning(p, prefix)))
    }

    /// Read and validate the header of the file at `path`, reading only as
    /// much of it as the header needs: every check the loader makes short
    /// of mapping and placing. A split GGUF's shard is read as the one file
    /// it is; `ModelHeaders::read` reads a whole model.
    ///
    /// # Errors
    /// [`Error::Io`], [`Error::NotAFile`], [`Error::EmptyFile`], or any
    /// validation error.
    pub fn read(path: impl AsRef<Path>) -> Result<Header> {
        let path = path.as_ref();
        let (file, meta) = open_checked(path)?;
        read_header(&file, meta.len(), path)
    }

    /// Parse the header at the start of `map` (the model's bytes), keeping
    /// the mapping for its metadata: nothing is copied.
    pub(crate) fn in_mapping(map: &Arc<Mapping>) -> Result<Header> {
        let bytes = map.bytes();
        let parsed = match Format::detect(bytes)? {
            Format::Gguf => Parsed::Gguf(GgufHeader::parse(bytes)?),
            Format::Safetensors => Parsed::Safetensors(SafetensorsHeader::parse(bytes)?),
        };
        Ok(Header {
            parsed,
            bytes: HeaderBytes::Mapped(Arc::clone(map)),
        })
    }

    /// `parsed` with the header's bytes copied from `bytes`, the file's
    /// first bytes.
    fn owning(parsed: Parsed, bytes: &[u8]) -> Header {
        let end = usize::try_from(parsed.end()).map_or(bytes.len(), |e| e.min(bytes.len()));
        Header {
            parsed,
            bytes: HeaderBytes::Owned(bytes[..end].to_vec()),
        }
    }

    /// The bytes the header was read from (from the start of the file).
    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            HeaderBytes::Owned(b) => b,
            HeaderBytes::Mapped(m) => m.bytes(),
        }
    }

    /// The header's bytes from the start of the file up to the data
    /// section (all of them where the header was read alone).
    pub(crate) fn raw(&self) -> &[u8] {
        let bytes = self.bytes();
        let end = usize::try_from(self.data_offset()).map_or(bytes.len(), |e| e.min(bytes.len()));
        &bytes[..end]
    }

    /// The format.
    pub fn format(&self) -> Format {
        match self.parsed {
            Parsed::Gguf(_) => Format::Gguf,
            Parsed::Safetensors(_) => Format::Safetensors,
        }
    }

    /// The GGUF header, when the file is GGUF.
    pub fn gguf(&self) -> Option<&GgufHeader> {
        match &self.parsed {
            Parsed::Gguf(h) => Some(h),
            Parsed::Safetensors(_) => None,
        }
    }

    /// The safetensors header, when the file is safetensors.
    pub fn safetensors(&self) -> Option<&SafetensorsHeader> {
        match &self.parsed {
            Parsed::Gguf(_) => None,
            Parsed::Safetensors(h) => Some(h),
        }
    }

    /// Tensor descriptors in file order.
    pub fn tensors(&self) -> &TensorTable {
        match &self.parsed {
            Parsed::Gguf(h) => h.tensors(),
            Parsed::Safetensors(h) => h.tensors(),
        }
    }

    /// Index of the tensor called `name`.
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        match &self.parsed {
            Parsed::Gguf(h) => h.tensor_index(name),
            Parsed::Safetensors(h) => h.tensor_index(name),
        }
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        match &self.parsed {
            Parsed::Gguf(h) => h.data_offset(),
            Parsed::Safetensors(h) => h.data_offset(),
        }
    }

    /// The file length the header was validated against.
    pub fn file_len(&self) -> u64 {
        match &self.parsed {
            Parsed::Gguf(h) => h.file_len(),
            Parsed::Safetensors(h) => h.file_len(),
        }
    }

    /// The alignment the file promises for tensor offsets: GGUF's
    /// `general.alignment` (default 32); 1 for safetensors, which promises none.
    pub fn file_alignment(&self) -> u64 {
        match &self.parsed {
            Parsed::Gguf(h) => h.alignment(),
            Parsed::Safetensors(_) => 1,
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
        match &self.parsed {
            Parsed::Gguf(_) => buffer_alignment,
            Parsed::Safetensors(_) => {
                let elem = usize::try_from(ty.type_size()).unwrap_or(1);
                let elem = if elem.is_power_of_two() { elem } else { 1 };
                elem.min(buffer_alignment)
            }
        }
    }

    /// The first tensor whose file offset is not aligned as a buffer type of
    /// `buffer_alignment` needs for zero-copy placement (the mapping is
    /// page-aligned, so the file offset decides for alignments up to a
    /// page), with the alignment it needs.
    pub fn first_misaligned(&self, buffer_alignment: usize) -> Option<(TensorInfo<'_>, usize)> {
        self.tensors().iter().find_map(|t| {
            let a = self.required_alignment(&t, buffer_alignment);
            (t.file_offset % a as u64 != 0).then_some((t, a))
        })
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

    /// GGUF metadata (`None` for safetensors), read from the header's bytes.
    pub fn gguf_metadata(&self) -> Option<Metadata<'_>> {
        match &self.parsed {
            Parsed::Gguf(h) => Some(h.metadata_in(self.bytes())),
            Parsed::Safetensors(_) => None,
        }
    }

    /// The safetensors `__metadata__` map (`None` for GGUF).
    pub fn safetensors_metadata(&self) -> Option<&std::collections::BTreeMap<String, String>> {
        match &self.parsed {
            Parsed::Gguf(_) => None,
            Parsed::Safetensors(h) => Some(h.metadata()),
        }
    }
}

/// First read of a header: large enough for most headers in one go, small
/// next to any model.
const FIRST_READ: u64 = 1 << 20;

/// Read and validate the header of an open file of `file_len` bytes, reading
/// only as much of the file as the header needs (plus at most one read's
/// slack). The header keeps the bytes it needs for its metadata.
pub(crate) fn read_header(file: &File, file_len: u64, path: &Path) -> Result<Header> {
    read_header_at(file, 0, file_len, path)
}

/// [`read_header`] for a model of `file_len` bytes that starts at `base` in
/// a larger file: every offset is relative to `base`.
pub(crate) fn read_header_at(file: &File, base: u64, file_len: u64, path: &Path) -> Result<Header> {
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
        match Parsed::parse_prefix(&bytes, file_len)? {
            Parse::Complete(parsed) => {
                // Keep the header only: the slack of the last read is tensor
                // data, which the caller reads into place itself.
                bytes.truncate(usize::try_from(parsed.end()).unwrap_or(bytes.len()));
                bytes.shrink_to_fit();
                return Ok(Header {
                    parsed,
                    bytes: HeaderBytes::Owned(bytes),
                });
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
                    return Ok(Header {
                        parsed: Parsed::Gguf(h),
                        bytes: HeaderBytes::Owned(kv),
                    });
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
