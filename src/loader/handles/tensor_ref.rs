//! [`TensorRef`], a placed tensor borrowed from its [`Weights`](super::Weights),
//! and [`OwnedTensor`], a writable copy of one.

use crate::buffer::{Buffer, CpuBuffer, CpuBufferType, Placement};
use crate::error::{Error, Result};
use crate::tensor::{view, view_mut, Element, TensorInfo, TensorTable};
use crate::types::TensorType;

use crate::loader::budget::CopyRule;
use crate::loader::report::PlacementKind;

/// A placed tensor, borrowed from loaded [`Weights`](super::Weights): read-only whatever the
/// mode. To change a weight, take [`TensorRef::to_owned_tensor`].
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'w> {
    info: TensorInfo<'w>,
    buffer: &'w dyn Buffer,
    placement: Placement,
    kind: PlacementKind,
    copies: CopyRule,
}

impl<'w> TensorRef<'w> {
    /// The tensor `info`, placed at `placement` in `buffer`, its copies held
    /// to the budget as `copies` says.
    pub(crate) fn new(
        info: TensorInfo<'w>,
        buffer: &'w dyn Buffer,
        placement: Placement,
        kind: PlacementKind,
        copies: CopyRule,
    ) -> TensorRef<'w> {
        TensorRef {
            info,
            buffer,
            placement,
            kind,
            copies,
        }
    }

    /// The descriptor.
    pub fn info(&self) -> TensorInfo<'w> {
        self.info
    }

    /// The name.
    pub fn name(&self) -> &'w str {
        self.info.name
    }

    /// Where the tensor sits in its buffer, and the alignment its address has.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// Whether it is viewed in the mapping or was copied.
    pub fn placement_kind(&self) -> PlacementKind {
        self.kind
    }

    /// The buffer it sits in.
    pub fn buffer(&self) -> &'w dyn Buffer {
        self.buffer
    }

    /// The bytes, when the buffer is host-visible.
    pub fn host_bytes(&self) -> Option<&'w [u8]> {
        let b: &'w [u8] = self.buffer.host_bytes()?;
        b.get(self.placement.offset..self.placement.offset + self.placement.len)
    }

    /// The bytes as `T`, zero-copy.
    ///
    /// # Errors
    /// [`Error::NotHost`] for a device buffer, [`Error::ViewType`] or [`Error::ViewLayout`].
    pub fn view<T: Element>(&self) -> Result<&'w [T]> {
        let bytes = self.host_bytes().ok_or_else(|| Error::NotHost {
            buffer: self.buffer.type_name().to_owned(),
        })?;
        view(&self.info, bytes)
    }

    /// Copy the bytes into `out` (which must be exactly the tensor's size);
    /// works on every buffer.
    ///
    /// # Errors
    /// [`Error::OutOfBuffer`] if `out` is the wrong size.
    pub fn read_into(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.placement.len {
            return Err(Error::OutOfBuffer {
                offset: 0,
                len: out.len(),
                buffer_size: self.placement.len,
            });
        }
        self.buffer.get(self.placement.offset, out)
    }

    /// The bytes, copied.
    ///
    /// # Errors
    /// As [`Buffer::get`].
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.placement.len];
        self.read_into(&mut v)?;
        Ok(v)
    }

    /// An owned, writable copy in a CPU buffer (for a runtime that must
    /// rewrite a weight: fusing batch-norm, repacking). A copy of 1 MiB or
    /// more is first held to the memory budget: the one the load was given
    /// ([`LoadOptions::budget`](crate::LoadOptions::budget)), or else the
    /// system's as it is now (smaller copies are not worth reading the
    /// cgroup files for); not with
    /// [`LoadOptions::ignore_budget`](crate::LoadOptions::ignore_budget).
    ///
    /// # Errors
    /// [`Error::OverBudget`], [`Error::Alloc`], or as [`Buffer::get`].
    pub fn to_owned_tensor(&self) -> Result<OwnedTensor> {
        const CHECKED_FROM: usize = 1 << 20;
        if self.placement.len >= CHECKED_FROM {
            self.copies
                .check(self.placement.len as u64, "an owned copy of the tensor")?;
        }
        let mut buf = CpuBufferType::new().alloc(self.placement.len)?;
        self.buffer.get(self.placement.offset, buf.bytes_mut())?;
        Ok(OwnedTensor {
            info: TensorTable::of_one(self.info)?,
            buf,
        })
    }

    /// Elements per row: `ne[0]` (1 for a scalar).
    pub fn row_len(&self) -> u64 {
        self.info.row_len()
    }

    /// Number of rows: the product of `ne[1..]` (1 for a vector or scalar).
    pub fn n_rows(&self) -> u64 {
        self.info.n_rows()
    }

    /// Bytes per row (a whole number of blocks: validated at parse time).
    pub fn row_bytes(&self) -> usize {
        let n = self.n_rows();
        if n == 0 {
            0
        } else {
            self.placement.len / n as usize
        }
    }

    fn host_or_err(&self) -> Result<&'w [u8]> {
        self.host_bytes().ok_or_else(|| Error::NotHost {
            buffer: self.buffer.type_name().to_owned(),
        })
    }

    fn row_range(&self, rows: std::ops::Range<u64>) -> Result<std::ops::Range<usize>> {
        let n = self.n_rows();
        if rows.start > rows.end || rows.end > n {
            return Err(Error::RowOutOfRange {
                tensor: self.info.name.to_owned(),
                row: if rows.start > rows.end {
                    rows.start
                } else {
                    rows.end
                },
                rows: n,
            });
        }
        let rb = self.row_bytes();
        Ok(rows.start as usize * rb..rows.end as usize * rb)
    }

    /// Row `i`'s bytes, zero-copy (the row of an embedding table, say).
    ///
    /// # Errors
    /// [`Error::RowOutOfRange`], or [`Error::NotHost`] for a device tensor.
    pub fn row(&self, i: u64) -> Result<&'w [u8]> {
        let r = self.row_range(i..i.saturating_add(1))?;
        Ok(&self.host_or_err()?[r])
    }

    /// Row `i` as `T`, zero-copy.
    ///
    /// # Errors
    /// As [`TensorRef::row`], and as [`TensorRef::view`] for the element type.
    pub fn row_as<T: Element>(&self, i: u64) -> Result<&'w [T]> {
        let r = self.row_range(i..i.saturating_add(1))?;
        let bytes = &self.host_or_err()?[r];
        view(&self.info, bytes)
    }

    /// Every row's bytes, in order.
    ///
    /// # Errors
    /// [`Error::NotHost`] for a device tensor.
    pub fn rows(&self) -> Result<std::slice::ChunksExact<'w, u8>> {
        Ok(self.host_or_err()?.chunks_exact(self.row_bytes().max(1)))
    }

    /// Dequantize the whole tensor to f32 into `out` (exactly
    /// [`TensorInfo::n_elements`] long), with ggml's reference semantics
    /// ([`crate::quant::dequantize`]). Works on every buffer: a device
    /// tensor is read back first.
    ///
    /// # Errors
    /// As [`crate::quant::dequantize`].
    pub fn dequantize_into(&self, out: &mut [f32]) -> Result<()> {
        match self.host_bytes() {
            Some(b) => crate::quant::dequantize(self.info.ty, b, out),
            None => crate::quant::dequantize(self.info.ty, &self.to_vec()?, out),
        }
    }

    /// The whole tensor as f32, in a new `Vec`.
    ///
    /// # Errors
    /// As [`crate::quant::dequantize_to_vec`].
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        match self.host_bytes() {
            Some(b) => crate::quant::dequantize_to_vec(self.info.ty, b),
            None => crate::quant::dequantize_to_vec(self.info.ty, &self.to_vec()?),
        }
    }

    /// Rows `rows` dequantized to f32 into `out` (exactly
    /// `rows.len() * row_len()` long): an embedding lookup.
    ///
    /// # Errors
    /// [`Error::RowOutOfRange`], [`Error::NotHost`], or as
    /// [`crate::quant::dequantize`].
    pub fn rows_f32(&self, rows: std::ops::Range<u64>, out: &mut [f32]) -> Result<()> {
        let r = self.row_range(rows)?;
        crate::quant::dequantize(self.info.ty, &self.host_or_err()?[r], out)
    }

    /// Row `i` dequantized to f32 into `out` (exactly `row_len()` long).
    ///
    /// # Errors
    /// As [`TensorRef::rows_f32`].
    pub fn row_f32(&self, i: u64, out: &mut [f32]) -> Result<()> {
        self.rows_f32(i..i.saturating_add(1), out)
    }

    /// Check the shape (`ne`, ggml order) and that the type is one of
    /// `types` (any type when empty): what a runtime does for each weight it
    /// expects.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`], [`Error::TypeMismatch`].
    pub fn check_shape(self, ne: &[u64], types: &[TensorType]) -> Result<Self> {
        let found = self.info.ne();
        if found != ne {
            return Err(Error::ShapeMismatch {
                tensor: self.info.name.to_owned(),
                expected: ne.to_vec(),
                found,
            });
        }
        if !types.is_empty() && !types.contains(&self.info.ty) {
            return Err(Error::TypeMismatch {
                tensor: self.info.name.to_owned(),
                expected: types.iter().map(|t| t.name()).collect(),
                found: self.info.ty.name(),
            });
        }
        Ok(self)
    }
}

/// A writable copy of one tensor, in its own 32-byte-aligned CPU buffer.
#[derive(Debug)]
pub struct OwnedTensor {
    /// Its descriptor, as a table of one.
    info: TensorTable,
    buf: CpuBuffer,
}

impl OwnedTensor {
    /// The descriptor.
    pub fn info(&self) -> TensorInfo<'_> {
        self.info.at(0)
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.buf.bytes()
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.buf.bytes_mut()
    }

    /// The bytes as `T`.
    ///
    /// # Errors
    /// As [`TensorInfo::view`].
    pub fn view<T: Element>(&self) -> Result<&[T]> {
        view(&self.info.at(0), self.buf.bytes())
    }

    /// The bytes as writable `T`.
    ///
    /// # Errors
    /// As [`TensorInfo::view`].
    pub fn view_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        view_mut(&self.info.at(0), self.buf.bytes_mut())
    }
}
