//! The GGUF header parser. Safe code over a byte slice; every size and offset
//! read from the file goes through checked arithmetic.

use super::metadata::{KvEntry, Metadata, ValueType};
use super::spec::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS, MAX_NAME_LEN};
use crate::alloc;
use crate::error::{Error, Result};
use crate::tensor::Parse;
use crate::tensor::{TableBuilder, TensorTable};
use crate::types::TensorType;

/// Smallest possible key/value entry: key length (8), a 1-byte key, value type (4), a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest possible tensor descriptor: name length (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_BYTES: u64 = 8 + 4 + 4 + 8;
/// Tables start this small and grow as entries are actually parsed.
const INITIAL_TABLE_CAP: usize = 256;

/// A validated GGUF header. It owns its tables and borrows nothing: metadata
/// values stay in the file's bytes and are read through [`GgufHeader::metadata_in`]
/// or [`GgufHeader::metadata_in`].
#[derive(Debug, Clone)]
pub struct GgufHeader {
    version: u32,
    alignment: u64,
    header_len: u64,
    data_offset: u64,
    file_len: u64,
    kvs: Vec<KvEntry>,
    kv_sorted: Vec<u32>,
    tensors: TensorTable,
}

impl GgufHeader {
    /// The GGUF magic, the file's first four bytes.
    pub const MAGIC: [u8; 4] = MAGIC;
    /// The alignment that applies when `general.alignment` is absent.
    pub const DEFAULT_ALIGNMENT: u64 = DEFAULT_ALIGNMENT;
    /// The key that sets the data alignment.
    pub const ALIGNMENT_KEY: &'static str = ALIGNMENT_KEY;
    /// Longest tensor name ggml accepts, in bytes (`GGML_MAX_NAME - 1`).
    pub const MAX_NAME_LEN: u64 = MAX_NAME_LEN;
    /// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
    pub const MAX_DIMS: u32 = MAX_DIMS;

    /// Parse and validate a whole file held in `bytes`.
    ///
    /// # Errors
    /// See [`crate::Error`]; truncation anywhere is [`Error::Truncated`].
    pub fn parse(bytes: &[u8]) -> Result<GgufHeader> {
        match Self::parse_prefix(bytes, bytes.len() as u64)? {
            Parse::Complete(h) => Ok(h),
            // Unreachable: with the prefix equal to the file, a short read is truncation.
            Parse::NeedMore { min_len } => Err(Error::Truncated {
                what: "header".into(),
                offset: bytes.len() as u64,
                needed: min_len - bytes.len() as u64,
                file_len: bytes.len() as u64,
            }),
        }
    }

    /// Parse from the first bytes of a file that is `file_len` bytes long.
    ///
    /// Returns [`Parse::NeedMore`] when `prefix` ends inside the header, with
    /// the least prefix length worth trying next; the caller reads more and
    /// calls again. Tensor bounds are checked against `file_len`, so a
    /// complete parse has validated everything but the tensor bytes themselves.
    ///
    /// # Errors
    /// Any header problem; a read past `file_len` is [`Error::Truncated`].
    pub fn parse_prefix(prefix: &[u8], file_len: u64) -> Result<Parse<GgufHeader>> {
        let prefix = &prefix[..prefix
            .len()
            .min(usize::try_from(file_len).unwrap_or(usize::MAX))];
        let mut cur = Cursor {
            b: prefix,
            pos: 0,
            base: 0,
            file_len,
        };
        match parse_inner(&mut cur) {
            Ok(h) => Ok(Parse::Complete(h)),
            Err(Stop::More(min_len)) => Ok(Parse::NeedMore { min_len }),
            Err(Stop::Err(e)) => Err(e),
        }
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment: `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Bytes of header proper (magic through the last tensor descriptor).
    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// Absolute offset of the data section (the header length padded to the alignment).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The file length the header was validated against.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Tensor descriptors in file order, indexed by name.
    pub fn tensors(&self) -> &TensorTable {
        &self.tensors
    }

    /// Index (in file order) of the tensor called `name`.
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.tensors.index_of(name)
    }

    /// Where each tensor's descriptor (its name's 8-byte length first)
    /// starts in the file, in file order: what gguf-py's reader gives as
    /// each tensor field's offset. Worked back from where the descriptors
    /// end ([`GgufHeader::header_len`]), each descriptor being its name,
    /// its dimensions and the four fixed fields, as the parser read them.
    ///
    /// ```
    /// # fn main() -> weightmap::Result<()> {
    /// use weightmap::{gguf::{GgufHeader, Writer}, TensorType};
    /// let mut w = Writer::new(32);
    /// w.tensor("a", TensorType::F32, &[4], vec![0; 16]);
    /// w.tensor("bb", TensorType::F32, &[2, 2], vec![0; 16]);
    /// let mut bytes = Vec::new();
    /// w.write_with(&mut bytes, |_, _| {}).unwrap();
    /// let h = GgufHeader::parse(&bytes)?;
    /// // After the 24-byte fixed header: "a" (8 + 1 + 4 + 8 + 4 + 8 bytes), then "bb".
    /// assert_eq!(h.descriptor_offsets(), [24, 24 + 33]);
    /// # Ok(()) }
    /// ```
    pub fn descriptor_offsets(&self) -> Vec<u64> {
        // Bounded by the header the parser validated, so none overflows;
        // saturating all the same, as every sum of file-given sizes here.
        let size = |name: &str, n_dims: usize| {
            MIN_TENSOR_BYTES
                .saturating_add(name.len() as u64)
                .saturating_add((n_dims as u64).saturating_mul(8))
        };
        let tensors = self.tensors.iter();
        let all = tensors.fold(0u64, |sum, t| {
            sum.saturating_add(size(t.name, t.shape.len()))
        });
        let mut at = self.header_len.saturating_sub(all);
        let tensors = self.tensors.iter();
        tensors
            .map(|t| {
                let start = at;
                at = at.saturating_add(size(t.name, t.shape.len()));
                start
            })
            .collect()
    }

    /// Number of metadata entries.
    pub fn kv_count(&self) -> usize {
        self.kvs.len()
    }

    /// The metadata, read from `bytes`: the same bytes (or prefix of them)
    /// this header was parsed from. Values outside `bytes` read as absent.
    pub fn metadata_in<'a>(&'a self, bytes: &'a [u8]) -> Metadata<'a> {
        Metadata::new(bytes, &self.kvs, &self.kv_sorted)
    }
}

enum Stop {
    More(u64),
    Err(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Err(e)
    }
}

type PResult<T> = std::result::Result<T, Stop>;

/// Bytes of the file from offset `base` on, read from `pos`.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
    /// The file offset of `b[0]`: 0, except for the windows of
    /// [`read_windowed`].
    base: u64,
    file_len: u64,
}

impl<'a> Cursor<'a> {
    /// The file offset of the next byte.
    fn at(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn remaining_in_file(&self) -> u64 {
        self.file_len.saturating_sub(self.at())
    }

    #[inline]
    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> PResult<&'a [u8]> {
        let end = (self.pos as u64).checked_add(n);
        match end {
            Some(end) if end <= self.b.len() as u64 => {
                let s = &self.b[self.pos..end as usize];
                self.pos = end as usize;
                Ok(s)
            }
            // `base + b.len() <= file_len`, so no overflow.
            Some(end) if self.base + end <= self.file_len => Err(Stop::More(self.base + end)),
            _ => Err(Stop::Err(Error::Truncated {
                what: what(),
                offset: self.at(),
                needed: n,
                file_len: self.file_len,
            })),
        }
    }

    #[inline]
    fn u32(&mut self, what: impl FnOnce() -> String) -> PResult<u32> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    #[inline]
    fn u64(&mut self, what: impl FnOnce() -> String) -> PResult<u64> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    // `a` is a nonzero power of two (validated).
    x.checked_add(a - 1).map(|v| v & !(a - 1))
}

/// What comes before the tensor descriptors.
struct Head {
    version: u32,
    n_tensors: u64,
    alignment: u64,
    kvs: Vec<KvEntry>,
    kv_sorted: Vec<u32>,
}

fn parse_inner(cur: &mut Cursor<'_>) -> PResult<GgufHeader> {
    let head = parse_head(cur)?;
    // Room for as many entries as the bytes at hand can hold, at most.
    let at_hand = (cur.b.len() - cur.pos) as u64 / MIN_TENSOR_BYTES;
    let mut table = TableBuilder::new(false, head.n_tensors.min(at_hand) as usize)?;
    for i in 0..head.n_tensors {
        parse_tensor(cur, i, head.alignment, &mut table)?;
    }
    Ok(finish(head, table, cur.at(), cur.file_len)?)
}

/// The magic, version, counts and key/value pairs, with the alignment.
fn parse_head(cur: &mut Cursor<'_>) -> PResult<Head> {
    let magic = cur.take(4, || "magic".into())?;
    if magic != MAGIC {
        let mut found = [0u8; 4];
        found.copy_from_slice(magic);
        return Err(Error::BadMagic { found }.into());
    }
    let version = cur.u32(|| "version".into())?;
    if version == 0 {
        return Err(Error::UnsupportedVersion { version }.into());
    }
    if version & 0xFFFF == 0 {
        // ggml's rule: a version whose low half is zero was written in the
        // other byte order.
        return Err(Error::BigEndian { version }.into());
    }
    if !(2..=3).contains(&version) {
        return Err(Error::UnsupportedVersion { version }.into());
    }
    let counts_at = cur.pos as u64;
    let n_tensors = cur.u64(|| "tensor count".into())?;
    let n_kv = cur.u64(|| "key/value count".into())?;
    let remaining = cur.remaining_in_file();
    if n_tensors > remaining / MIN_TENSOR_BYTES {
        return Err(Error::CountTooLarge {
            what: "tensor".into(),
            count: n_tensors,
            offset: counts_at,
            remaining,
        }
        .into());
    }
    if n_kv > remaining / MIN_KV_BYTES
        || u128::from(n_kv) * u128::from(MIN_KV_BYTES)
            + u128::from(n_tensors) * u128::from(MIN_TENSOR_BYTES)
            > u128::from(remaining)
    {
        return Err(Error::CountTooLarge {
            what: "key/value".into(),
            count: n_kv,
            offset: counts_at + 8,
            remaining,
        }
        .into());
    }

    // ---- key/value pairs ----
    let mut kvs: Vec<KvEntry> = alloc::with_capacity(
        (n_kv as usize).min(INITIAL_TABLE_CAP),
        "the key/value table",
    )?;
    for i in 0..n_kv {
        let kv = parse_kv(cur, i)?;
        alloc::push(&mut kvs, kv, "the key/value table")?;
    }
    // By key, then by place: equal keys sit together in file order.
    let kv_sorted = sorted_index(kvs.len(), |a, b| {
        cur.b[kvs[a].key.clone()]
            .cmp(&cur.b[kvs[b].key.clone()])
            .then(kvs[a].key_offset.cmp(&kvs[b].key_offset))
    })?;
    // The first entry, in file order, whose key an earlier one has: the one
    // a reader going through the file meets first (ggml, gguf-py).
    let first_repeat = kv_sorted
        .windows(2)
        .map(|w| (&kvs[w[0] as usize], &kvs[w[1] as usize]))
        .filter(|(a, b)| cur.b[a.key.clone()] == cur.b[b.key.clone()])
        .map(|(_, later)| later)
        .min_by_key(|kv| kv.key_offset);
    if let Some(later) = first_repeat {
        return Err(Error::DuplicateKey {
            key: String::from_utf8_lossy(&cur.b[later.key.clone()]).into_owned(),
            offset: later.key_offset,
        }
        .into());
    }

    let mut alignment = DEFAULT_ALIGNMENT;
    if let Some(e) = kvs
        .iter()
        .find(|e| &cur.b[e.key.clone()] == ALIGNMENT_KEY.as_bytes())
    {
        if e.vtype != ValueType::U32 {
            return Err(Error::AlignmentType {
                found: e.vtype.name(),
            }
            .into());
        }
        let v = &cur.b[e.value.clone()];
        let a = u64::from(u32::from_le_bytes([v[0], v[1], v[2], v[3]]));
        if a == 0 || !a.is_power_of_two() {
            return Err(Error::AlignmentValue { value: a }.into());
        }
        alignment = a;
    }

    Ok(Head {
        version,
        n_tensors,
        alignment,
        kvs,
        kv_sorted,
    })
}

/// The header whose descriptors (in `table`) end at `header_len`.
fn finish(head: Head, table: TableBuilder, header_len: u64, file_len: u64) -> Result<GgufHeader> {
    let data_offset = align_up(header_len, head.alignment).ok_or(Error::TensorSizeOverflow {
        tensor: String::new(),
        what: "data offset",
    })?;
    // Place in the file and check bounds (llama.cpp's rule: the tensor's end,
    // not its padding, must lie within the file); then index the names.
    let tensors = table.finish(data_offset, file_len)?;
    tensors.check_overlap()?;
    Ok(GgufHeader {
        version: head.version,
        alignment: head.alignment,
        header_len,
        data_offset,
        file_len,
        kvs: head.kvs,
        kv_sorted: head.kv_sorted,
        tensors,
    })
}

/// Bytes of descriptors [`read_windowed`] reads at a time.
const WINDOW: usize = 1 << 20;

/// Read and validate a GGUF header of a `file_len`-byte file without
/// holding its tensor descriptors: the key/value section is read whole
/// (`bytes`, the first bytes of the file, grows to its end, found by a walk
/// over its length fields when `bytes` does not hold it), the descriptors
/// through a window of [`WINDOW`] bytes, each copied into the table as it
/// is parsed. Returns the header and the key/value section's bytes (what
/// [`GgufHeader::metadata_in`] needs). `read(buf, offset)` fills `buf`
/// from the file.
///
/// The checks, and the errors, are those of [`GgufHeader::parse`] on the
/// whole file. A million descriptors take tens of MiB of header; read this
/// way they cost only the table, not the table and the bytes it came from
/// (BENCHMARKS.md, "inspect and validate").
///
/// # Errors
/// As [`GgufHeader::parse`], and what `read` returns.
pub(crate) fn read_windowed(
    bytes: Vec<u8>,
    file_len: u64,
    read: impl FnMut(&mut [u8], u64) -> Result<()>,
) -> Result<(GgufHeader, Vec<u8>)> {
    read_windowed_by(WINDOW, bytes, file_len, read)
}

/// [`read_windowed`] of `bytes`, a whole file, from its first 24 bytes
/// and with windows of `window` bytes: for the fuzz target that holds it to
/// [`GgufHeader::parse`]. Not part of the API.
#[doc(hidden)]
pub fn read_windowed_for_fuzzing(bytes: &[u8], window: usize) -> Result<(GgufHeader, Vec<u8>)> {
    let first = bytes[..bytes.len().min(24)].to_vec();
    read_windowed_by(window.max(1), first, bytes.len() as u64, |buf, off| {
        let src = usize::try_from(off)
            .ok()
            .and_then(|o| bytes.get(o..o.checked_add(buf.len())?))
            .ok_or_else(|| Error::Truncated {
                what: "read".into(),
                offset: off,
                needed: buf.len() as u64,
                file_len: bytes.len() as u64,
            })?;
        buf.copy_from_slice(src);
        Ok(())
    })
}

/// [`read_windowed`] with windows of `window` bytes.
fn read_windowed_by(
    window_len: usize,
    mut bytes: Vec<u8>,
    file_len: u64,
    mut read: impl FnMut(&mut [u8], u64) -> Result<()>,
) -> Result<(GgufHeader, Vec<u8>)> {
    // Grow the prefix to the key/value section's end: first by a walk over
    // its length fields, which reads each byte once and ends within a step
    // of it, then, if the walk met something odd, geometrically.
    let mut walked = false;
    let (head, kv_len) = loop {
        let mut cur = Cursor {
            b: &bytes,
            pos: 0,
            base: 0,
            file_len,
        };
        let min = match parse_head(&mut cur) {
            Ok(head) => break (head, cur.pos),
            Err(Stop::Err(e)) => return Err(e),
            Err(Stop::More(min)) => min,
        };
        if !walked {
            walked = true;
            super::scan::read_kv(&mut bytes, file_len, &mut read)?;
            continue;
        }
        let have = bytes.len() as u64;
        let want = min.max(have.saturating_mul(2)).min(file_len);
        if want <= have {
            // The parser asked for no more than it has: cannot happen, but
            // never loop forever on it.
            return Err(Error::Truncated {
                what: "header".into(),
                offset: have,
                needed: min.saturating_sub(have),
                file_len,
            });
        }
        crate::alloc::read_more(&mut bytes, want, &mut read)?;
    };
    bytes.truncate(kv_len);
    bytes.shrink_to_fit();

    // The descriptors, window by window; one cut by the window's end is
    // parsed again from its start in the next.
    let mut table = TableBuilder::new(
        false,
        head.n_tensors.min(window_len as u64 / MIN_TENSOR_BYTES) as usize,
    )?;
    let mut window: Vec<u8> = Vec::new();
    let (mut at, mut i) = (kv_len as u64, 0u64);
    let mut size = window_len as u64;
    while i < head.n_tensors {
        window.clear();
        crate::alloc::read_more(&mut window, size.min(file_len - at), &mut |buf, off| {
            read(buf, at + off)
        })?;
        let mut cur = Cursor {
            b: &window,
            pos: 0,
            base: at,
            file_len,
        };
        let mut cut = None;
        while i < head.n_tensors {
            let start = cur.pos;
            match parse_tensor(&mut cur, i, head.alignment, &mut table) {
                Ok(()) => i += 1,
                Err(Stop::Err(e)) => return Err(e),
                Err(Stop::More(end)) => {
                    cut = Some((start, end));
                    break;
                }
            }
        }
        match cut {
            None => at = cur.at(),
            // Not even one descriptor fit (it cannot, legitimately: a
            // name is at most 63 bytes): a window large enough for it.
            Some((0, end)) => size = size.max(end - at),
            Some((start, _)) => at += start as u64,
        }
    }
    Ok((finish(head, table, at, file_len)?, bytes))
}

/// Indices `0..n` sorted by `cmp`, as u32 (tables are bounded by the file size,
/// and a file with 2^32 entries would be larger than any index needs).
fn sorted_index(
    n: usize,
    cmp: impl Fn(usize, usize) -> std::cmp::Ordering,
) -> crate::error::Result<Vec<u32>> {
    let mut idx = alloc::index(n, "the key index")?;
    idx.sort_unstable_by(|&a, &b| cmp(a as usize, b as usize));
    Ok(idx)
}

fn parse_kv(cur: &mut Cursor<'_>, i: u64) -> PResult<KvEntry> {
    let key_offset = cur.pos as u64;
    let key_len = cur.u64(|| format!("key length of entry {i}"))?;
    if key_len == 0 {
        return Err(Error::EmptyKey { offset: key_offset }.into());
    }
    let key_bytes = cur.take(key_len, || format!("key of entry {i}"))?;
    let key_start = cur.pos - key_bytes.len();
    let key = std::str::from_utf8(key_bytes).map_err(|_| Error::InvalidUtf8 {
        what: format!("key of entry {i}"),
        offset: key_offset,
    })?;
    let key_range = key_start..cur.pos;
    let type_at = cur.pos as u64;
    let type_id = cur.u32(|| format!("value type of key '{key}'"))?;
    let vtype = ValueType::from_id(type_id).ok_or_else(|| Error::UnknownValueType {
        key: key.to_owned(),
        type_id,
        offset: type_at,
    })?;
    let (value, elem, count) = match vtype {
        ValueType::String => {
            let len = cur.u64(|| format!("string length of key '{key}'"))?;
            let s = cur.take(len, || format!("string value of key '{key}'"))?;
            let start = cur.pos - s.len();
            (start..cur.pos, ValueType::U8, len)
        }
        ValueType::Array => {
            let elem_at = cur.pos as u64;
            let elem_id = cur.u32(|| format!("array element type of key '{key}'"))?;
            let elem = ValueType::from_id(elem_id).ok_or_else(|| Error::UnknownValueType {
                key: key.to_owned(),
                type_id: elem_id,
                offset: elem_at,
            })?;
            if elem == ValueType::Array {
                return Err(Error::NestedArray {
                    key: key.to_owned(),
                    offset: elem_at,
                }
                .into());
            }
            let count_at = cur.pos as u64;
            let count = cur.u64(|| format!("array length of key '{key}'"))?;
            let remaining = cur.remaining_in_file();
            let too_large = || Error::CountTooLarge {
                what: format!("array '{key}' element"),
                count,
                offset: count_at,
                remaining,
            };
            let start = cur.pos;
            if let Some(size) = elem.fixed_size() {
                // A byte size that overflows is a bad count; one that merely
                // runs past the end is a truncated file (take reports it).
                let nbytes = count.checked_mul(size).ok_or_else(too_large)?;
                cur.take(nbytes, || format!("array value of key '{key}'"))?;
            } else {
                // Strings: each at least its 8-byte length.
                if count > remaining / 8 {
                    return Err(too_large().into());
                }
                // Fast walk over the lengths while they and their strings
                // lie inside the bytes at hand (the hot loop of a 262,144-token
                // vocabulary); the checked reads below take over at the first
                // string that does not, to report NeedMore or Truncated.
                let (b, mut pos, mut done) = (cur.b, cur.pos, 0u64);
                while done < count {
                    let Some(len) = b.get(pos..pos + 8) else {
                        break;
                    };
                    let len = u64::from_le_bytes(len.try_into().unwrap_or([0xFF; 8]));
                    match (pos as u64 + 8).checked_add(len) {
                        Some(end) if end <= b.len() as u64 => pos = end as usize,
                        _ => break,
                    }
                    done += 1;
                }
                cur.pos = pos;
                for j in done..count {
                    let len = cur.u64(|| format!("length of string {j} of array '{key}'"))?;
                    cur.take(len, || format!("string {j} of array '{key}'"))?;
                }
            }
            (start..cur.pos, elem, count)
        }
        fixed => {
            let size = fixed.fixed_size().unwrap_or(0);
            let s = cur.take(size, || format!("value of key '{key}'"))?;
            let start = cur.pos - s.len();
            (start..cur.pos, ValueType::U8, 1)
        }
    };
    Ok(KvEntry {
        key: key_range,
        key_offset,
        vtype,
        value,
        elem,
        count,
    })
}

fn parse_tensor(
    cur: &mut Cursor<'_>,
    i: u64,
    alignment: u64,
    table: &mut TableBuilder,
) -> PResult<()> {
    let name_at = cur.at();
    let len = cur.u64(|| format!("name length of tensor {i}"))?;
    if len > MAX_NAME_LEN {
        return Err(Error::TensorNameTooLong {
            len,
            offset: name_at,
        }
        .into());
    }
    let name_bytes = cur.take(len, || format!("name of tensor {i}"))?;
    let name = std::str::from_utf8(name_bytes).map_err(|_| Error::InvalidUtf8 {
        what: format!("name of tensor {i}"),
        offset: name_at + 8,
    })?;

    let n_dims = cur.u32(|| format!("n_dims of tensor '{name}'"))?;
    if n_dims > MAX_DIMS {
        return Err(Error::TooManyDims {
            tensor: name.to_owned(),
            n_dims,
        }
        .into());
    }
    let mut shape = [0u64; MAX_DIMS as usize];
    for (d, slot) in shape.iter_mut().enumerate().take(n_dims as usize) {
        let v = cur.u64(|| format!("dimension {d} of tensor '{name}'"))?;
        if (v as i64) < 0 {
            return Err(Error::NegativeDim {
                tensor: name.to_owned(),
                index: d,
                value: v as i64,
            }
            .into());
        }
        *slot = v;
    }
    let type_id = cur.u32(|| format!("type of tensor '{name}'"))?;
    let offset = cur.u64(|| format!("offset of tensor '{name}'"))?;
    let ty = TensorType::from_ggml_id(type_id).ok_or_else(|| Error::UnknownTensorType {
        tensor: name.to_owned(),
        type_id,
    })?;
    let dims = &shape[..n_dims as usize];

    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n < i64::MAX as u64)
        .ok_or_else(|| Error::size_overflow(name, "element count"))?;
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % ty.block_size() != 0 {
        return Err(Error::BlockMismatch {
            tensor: name.to_owned(),
            ty,
            ne0,
            block_size: ty.block_size(),
        }
        .into());
    }
    let nbytes = ty
        .bytes_for(n_elements)
        .filter(|&n| n <= isize::MAX as u64)
        .ok_or_else(|| Error::size_overflow(name, "byte size"))?;
    align_up(nbytes, alignment).ok_or_else(|| Error::size_overflow(name, "padded size"))?;
    if offset % alignment != 0 {
        return Err(Error::MisalignedOffset {
            tensor: name.to_owned(),
            offset,
            alignment,
        }
        .into());
    }
    offset
        .checked_add(nbytes)
        .ok_or_else(|| Error::size_overflow(name, "offset + size"))?;
    // Indexed by name (and a repeat found) once all are read.
    table.push_unindexed(name, ty, dims, offset, nbytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Writer;

    /// `read_windowed_by(window)` of `bytes`, from its first `first` bytes.
    fn windowed(bytes: &[u8], window: usize, first: usize) -> Result<(GgufHeader, Vec<u8>)> {
        let len = bytes.len() as u64;
        let first = bytes[..first.min(bytes.len())].to_vec();
        read_windowed_by(window, first, len, |buf, off| {
            let off = off as usize;
            buf.copy_from_slice(&bytes[off..off + buf.len()]);
            Ok(())
        })
    }

    fn model(n: usize) -> Vec<u8> {
        let mut w = Writer::new(32);
        w.kv_str("general.architecture", "llama");
        let tokens: Vec<String> = (0..200).map(|i| format!("tok{i}")).collect();
        w.kv_str_array("tokenizer.ggml.tokens", &tokens);
        for i in 0..n {
            let name = format!("blk.{i}.{}", "w".repeat(i % 13));
            w.tensor(
                &name,
                crate::TensorType::F32,
                &[4, (i % 3 + 1) as u64],
                vec![1; 16 * (i % 3 + 1)],
            );
        }
        w.to_bytes()
    }

    #[test]
    fn windows_give_the_header_the_whole_bytes_give() {
        let bytes = model(300);
        let whole = GgufHeader::parse(&bytes).unwrap();
        for window in [1, 7, 40, 64, 119, 1000, 1 << 20] {
            for first in [24, 100, 4096, bytes.len()] {
                let (h, kv) = windowed(&bytes, window, first).unwrap();
                assert_eq!(h.tensors(), whole.tensors(), "window {window}");
                assert_eq!(
                    (h.header_len(), h.data_offset(), h.alignment(), h.version()),
                    (
                        whole.header_len(),
                        whole.data_offset(),
                        whole.alignment(),
                        whole.version()
                    )
                );
                let (a, b) = (h.metadata_in(&kv), whole.metadata_in(&bytes));
                assert_eq!(a.len(), b.len());
                for (x, y) in a.iter().zip(b.iter()) {
                    assert_eq!(format!("{x:?}"), format!("{y:?}"));
                }
                assert!(
                    kv.len() < whole.header_len() as usize,
                    "no descriptors kept"
                );
            }
        }
    }

    #[test]
    fn windows_give_the_error_the_whole_bytes_give() {
        let bytes = model(40);
        let h = GgufHeader::parse(&bytes).unwrap();
        let header = h.header_len() as usize;
        let check = |b: &[u8]| {
            let whole = GgufHeader::parse(b).map(|_| ()).map_err(|e| e.to_string());
            for window in [1, 33, 256] {
                let w = windowed(b, window, 24)
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                assert_eq!(w, whole, "window {window}");
            }
        };
        // Cut anywhere in the header.
        for cut in (0..header).step_by(7) {
            check(&bytes[..cut]);
        }
        // Bytes of the key/value section changed: where the walk meets
        // something odd, the prefix grows geometrically instead.
        for at in (0..header - 40 * 30).step_by(5) {
            for v in [0u8, 0xff] {
                let mut b = bytes.clone();
                b[at] = v;
                check(&b);
            }
        }
        // Any byte of the descriptors changed.
        let start = header - 40 * 30;
        for at in (start..header).step_by(3) {
            for v in [0u8, 0x41, 0xff] {
                let mut b = bytes.clone();
                b[at] = v;
                check(&b);
            }
        }
    }
}
