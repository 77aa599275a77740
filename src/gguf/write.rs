//! A small GGUF v3 writer: for doc examples, tests and the `gen` command.
//!
//! It writes what the parser reads: key/values in insertion order, tensors
//! packed in insertion order, each offset padded to the alignment, and the
//! data section padded at the end. Tensor data can be given up front or
//! produced while writing (so a 1 GiB model never sits in memory).

use std::io::{self, Write};

use super::metadata::ValueType;
use super::spec::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC};
use crate::types::TensorType;

/// A metadata value to write.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum OwnedValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// An array: the element type and the elements (which must all be of it).
    Array(ValueType, Vec<OwnedValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl OwnedValue {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            OwnedValue::U8(_) => ValueType::U8,
            OwnedValue::I8(_) => ValueType::I8,
            OwnedValue::U16(_) => ValueType::U16,
            OwnedValue::I16(_) => ValueType::I16,
            OwnedValue::U32(_) => ValueType::U32,
            OwnedValue::I32(_) => ValueType::I32,
            OwnedValue::F32(_) => ValueType::F32,
            OwnedValue::Bool(_) => ValueType::Bool,
            OwnedValue::String(_) => ValueType::String,
            OwnedValue::Array(..) => ValueType::Array,
            OwnedValue::U64(_) => ValueType::U64,
            OwnedValue::I64(_) => ValueType::I64,
            OwnedValue::F64(_) => ValueType::F64,
        }
    }

    fn write_payload(&self, out: &mut Vec<u8>) {
        match self {
            OwnedValue::U8(v) => out.push(*v),
            OwnedValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::Bool(v) => out.push(u8::from(*v)),
            OwnedValue::String(s) => put_str(out, s.as_bytes()),
            OwnedValue::Array(elem, items) => {
                out.extend_from_slice(&elem.id().to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for it in items {
                    it.write_payload(out);
                }
            }
            OwnedValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

/// The largest chunk [`Writer::write_with`] asks a deferred tensor's bytes
/// in: 4 MiB.
pub const CHUNK: usize = 4 << 20;

/// Write `n` zero bytes, a bounded buffer at a time.
fn write_zeros<W: Write>(out: &mut W, mut n: u64) -> io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..k])?;
        n -= k as u64;
    }
    Ok(())
}

struct PendingTensor {
    name: String,
    ty: TensorType,
    dims: Vec<u64>,
    nbytes: u64,
    data: Option<Vec<u8>>,
}

/// Builds a GGUF file.
///
/// ```
/// use weightmap::{gguf::Writer, TensorType};
/// let mut w = Writer::new(32);
/// w.kv_str("general.architecture", "llama");
/// w.tensor("a", TensorType::F32, &[2], vec![0; 8]);
/// let bytes = w.to_bytes();
/// assert_eq!(&bytes[..4], b"GGUF");
/// ```
pub struct Writer {
    alignment: u64,
    kvs: Vec<(String, OwnedValue)>,
    tensors: Vec<PendingTensor>,
}

impl Writer {
    /// A writer laying tensors out at `alignment` (a power of two). An
    /// alignment other than 32 is recorded as `general.alignment`.
    ///
    /// # Panics
    /// If `alignment` is not a nonzero power of two that fits a u32 (a
    /// programming error, not bad input).
    pub fn new(alignment: u64) -> Writer {
        assert!(alignment.is_power_of_two() && alignment <= u64::from(u32::MAX));
        let mut w = Writer {
            alignment,
            kvs: Vec::new(),
            tensors: Vec::new(),
        };
        if alignment != DEFAULT_ALIGNMENT {
            w.kv(ALIGNMENT_KEY, OwnedValue::U32(alignment as u32));
        }
        w
    }

    /// Add a key/value pair.
    pub fn kv(&mut self, key: &str, value: OwnedValue) -> &mut Self {
        self.kvs.push((key.to_owned(), value));
        self
    }

    /// Add a u32 value.
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.kv(key, OwnedValue::U32(v))
    }

    /// Add a string value.
    pub fn kv_str(&mut self, key: &str, v: &str) -> &mut Self {
        self.kv(key, OwnedValue::String(v.to_owned()))
    }

    /// Add an array of strings.
    pub fn kv_str_array<S: AsRef<str>>(&mut self, key: &str, v: &[S]) -> &mut Self {
        let items = v
            .iter()
            .map(|s| OwnedValue::String(s.as_ref().to_owned()))
            .collect();
        self.kv(key, OwnedValue::Array(ValueType::String, items))
    }

    /// Add an array of f32.
    pub fn kv_f32_array(&mut self, key: &str, v: &[f32]) -> &mut Self {
        let items = v.iter().map(|&x| OwnedValue::F32(x)).collect();
        self.kv(key, OwnedValue::Array(ValueType::F32, items))
    }

    /// Add an array of i32.
    pub fn kv_i32_array(&mut self, key: &str, v: &[i32]) -> &mut Self {
        let items = v.iter().map(|&x| OwnedValue::I32(x)).collect();
        self.kv(key, OwnedValue::Array(ValueType::I32, items))
    }

    /// Add a tensor with its bytes. `dims` are in ggml order (`ne[0]` first).
    ///
    /// # Panics
    /// If `data` is not the tensor's exact size, or `ne[0]` is not a whole
    /// number of blocks (programming errors).
    pub fn tensor(&mut self, name: &str, ty: TensorType, dims: &[u64], data: Vec<u8>) -> &mut Self {
        let nbytes = Self::size_of(ty, dims);
        assert_eq!(data.len() as u64, nbytes, "tensor '{name}': data size");
        self.push(name, ty, dims, nbytes, Some(data))
    }

    /// Add a tensor whose bytes [`Writer::write_with`] asks for while writing.
    pub fn tensor_deferred(&mut self, name: &str, ty: TensorType, dims: &[u64]) -> &mut Self {
        let nbytes = Self::size_of(ty, dims);
        self.push(name, ty, dims, nbytes, None)
    }

    fn push(
        &mut self,
        name: &str,
        ty: TensorType,
        dims: &[u64],
        nbytes: u64,
        data: Option<Vec<u8>>,
    ) -> &mut Self {
        assert!(ty.ggml_id().is_some(), "{ty} has no ggml id");
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            ty,
            dims: dims.to_vec(),
            nbytes,
            data,
        });
        self
    }

    fn size_of(ty: TensorType, dims: &[u64]) -> u64 {
        let n: u64 = dims.iter().product();
        ty.bytes_for(n)
            .unwrap_or_else(|| panic!("{n} elements are not whole {ty} blocks"))
    }

    fn pad(x: u64, a: u64) -> u64 {
        x.div_ceil(a) * a
    }

    /// The header bytes (magic through tensor descriptors, padded to the
    /// alignment), and each tensor's offset in the data section.
    pub fn header_bytes(&self) -> (Vec<u8>, Vec<u64>) {
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut h, k.as_bytes());
            h.extend_from_slice(&v.value_type().id().to_le_bytes());
            v.write_payload(&mut h);
        }
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut off = 0u64;
        for t in &self.tensors {
            put_str(&mut h, t.name.as_bytes());
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.ggml_id().unwrap_or(0).to_le_bytes());
            h.extend_from_slice(&off.to_le_bytes());
            offsets.push(off);
            off = Self::pad(off + t.nbytes, self.alignment);
        }
        let padded = Self::pad(h.len() as u64, self.alignment) as usize;
        h.resize(padded, 0);
        (h, offsets)
    }

    /// Write the file. `fill(i, chunk)` is called for each deferred tensor
    /// `i` (insertion index) with its bytes in order, as consecutive zeroed
    /// chunks of at most 4 MiB (each but the last exactly 4 MiB), so memory
    /// use does not grow with tensor size.
    ///
    /// # Errors
    /// Whatever `out` returns.
    pub fn write_with<W: Write>(
        &self,
        out: W,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> io::Result<()> {
        self.try_write_with(out, |i, buf| {
            fill(i, buf);
            Ok(())
        })
    }

    /// [`Writer::write_with`] with a `fill` that can fail (or stop the
    /// write): its first error is returned.
    ///
    /// # Errors
    /// Whatever `out` or `fill` returns.
    pub fn try_write_with<W: Write>(
        &self,
        mut out: W,
        mut fill: impl FnMut(usize, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let (header, offsets) = self.header_bytes();
        out.write_all(&header)?;
        let mut pos = 0u64;
        let longest = self
            .tensors
            .iter()
            .filter(|t| t.data.is_none())
            .map(|t| t.nbytes)
            .max()
            .unwrap_or(0);
        let mut scratch = vec![0u8; usize::try_from(longest).unwrap_or(CHUNK).min(CHUNK)];
        for (i, t) in self.tensors.iter().enumerate() {
            write_zeros(&mut out, offsets[i] - pos)?;
            match &t.data {
                Some(d) => out.write_all(d)?,
                None => {
                    let mut left = t.nbytes;
                    while left > 0 {
                        // At most CHUNK, which fits usize.
                        let n = left.min(scratch.len() as u64) as usize;
                        let buf = &mut scratch[..n];
                        buf.fill(0);
                        fill(i, buf)?;
                        out.write_all(buf)?;
                        left -= n as u64;
                    }
                }
            }
            pos = offsets[i] + t.nbytes;
        }
        let end = Self::pad(pos, self.alignment);
        write_zeros(&mut out, end - pos)?;
        out.flush()
    }

    /// The whole file in memory (deferred tensors are zero).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.write_with(&mut v, |_, _| {});
        v
    }
}
