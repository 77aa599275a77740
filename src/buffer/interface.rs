//! ggml's backend interface: the buffer type and buffer traits, and where a
//! tensor is placed in a buffer.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::os::Mapping;
use crate::tensor::TensorInfo;

/// What a buffer holds; plain metadata a scheduler may read (ggml's
/// `GGML_BACKEND_BUFFER_USAGE_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BufferUsage {
    /// Unspecified.
    #[default]
    Any,
    /// Model weights.
    Weights,
    /// Intermediate results.
    Compute,
}

/// A kind of memory that buffers are allocated from (ggml's buffer type).
pub trait BufferType: Send + Sync + fmt::Debug {
    /// A short name, such as `"CPU"`.
    fn name(&self) -> &str;

    /// The alignment every tensor address in this type's buffers must have:
    /// a nonzero power of two.
    fn alignment(&self) -> usize;

    /// The largest buffer this type can allocate.
    fn max_size(&self) -> usize {
        usize::MAX
    }

    /// Whether the CPU can read this type's memory directly.
    fn is_host(&self) -> bool {
        false
    }

    /// Allocate a zeroed buffer of `size` bytes.
    ///
    /// # Errors
    /// [`Error::BufferTooLarge`] past [`BufferType::max_size`], or [`Error::Alloc`].
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn Buffer>>;

    /// Allocate a buffer the caller is about to fill completely (weights
    /// being loaded). A type may prefault its pages here, since every one
    /// will be written at once; by default this is [`BufferType::alloc_buffer`].
    ///
    /// # Errors
    /// As [`BufferType::alloc_buffer`].
    fn alloc_buffer_to_fill(&self, size: usize) -> Result<Box<dyn Buffer>> {
        self.alloc_buffer(size)
    }

    /// Bytes a tensor needs in this type's buffers (by default its size).
    /// Placement refuses a value smaller than the tensor's size
    /// ([`Error::AllocSizeTooSmall`]).
    fn alloc_size(&self, tensor: &TensorInfo) -> usize {
        usize::try_from(tensor.nbytes).unwrap_or(usize::MAX)
    }

    /// Whether [`BufferType::buffer_from_host_ptr`] works for this type
    /// (ggml's optional `buffer_from_host_ptr` device capability): the CPU
    /// type, and device types that can wrap host memory (CUDA host
    /// registration, Metal no-copy buffers). By default false.
    fn supports_host_ptr(&self) -> bool {
        false
    }

    /// A buffer of this type over host memory it does not own: a range of a
    /// file mapping, in which each tensor's address is a multiple of
    /// `alignment` (which may be below [`BufferType::alignment`]; it is what
    /// the buffer's [`Buffer::alignment`] must then report). The buffer
    /// keeps the region, and so the mapping, alive. The loader calls this
    /// instead of copying when [`BufferType::supports_host_ptr`] is true.
    ///
    /// # Errors
    /// [`Error::HostPtrUnsupported`] by default.
    fn buffer_from_host_ptr(
        &self,
        region: HostRegion,
        alignment: usize,
    ) -> Result<Box<dyn Buffer>> {
        let _ = (region, alignment);
        Err(Error::HostPtrUnsupported {
            buffer_type: self.name().to_owned(),
        })
    }
}

/// A region of backend memory that tensors are placed in (ggml's buffer).
///
/// `set`/`get` of a byte range at an offset work on every buffer and are the
/// only way to reach a non-host buffer's memory.
pub trait Buffer: Send + Sync + fmt::Debug {
    /// The name of the buffer's type.
    fn type_name(&self) -> &str;

    /// Size in bytes.
    fn size(&self) -> usize;

    /// The alignment tensor addresses in this buffer must have.
    fn alignment(&self) -> usize;

    /// What the buffer holds.
    fn usage(&self) -> BufferUsage;

    /// Say what the buffer holds.
    fn set_usage(&mut self, usage: BufferUsage);

    /// Whether dropping the buffer frees its memory (false for a buffer
    /// that views memory someone else owns).
    fn owns_memory(&self) -> bool;

    /// Whether the CPU can read the memory directly.
    fn is_host(&self) -> bool;

    /// The address placement checks alignment against: the base pointer for
    /// host buffers, 0 for device buffers (their offsets are their addresses).
    fn base_addr(&self) -> usize;

    /// The whole buffer as bytes, for host buffers.
    fn host_bytes(&self) -> Option<&[u8]> {
        None
    }

    /// The whole buffer as writable bytes, for writable host buffers.
    fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        None
    }

    /// Copy `data` into the buffer at `offset`.
    ///
    /// # Errors
    /// [`Error::OutOfBuffer`], or [`Error::ReadOnly`] for a mapped buffer.
    fn set(&mut self, offset: usize, data: &[u8]) -> Result<()>;

    /// Copy `out.len()` bytes at `offset` out of the buffer.
    ///
    /// # Errors
    /// [`Error::OutOfBuffer`].
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()>;

    /// Fill `len` bytes at `offset` with `value`.
    ///
    /// # Errors
    /// [`Error::OutOfBuffer`], or [`Error::ReadOnly`] for a mapped buffer.
    fn memset(&mut self, offset: usize, len: usize, value: u8) -> Result<()>;

    /// Fill the whole buffer with `value`.
    ///
    /// # Errors
    /// [`Error::ReadOnly`] for a mapped buffer.
    fn clear(&mut self, value: u8) -> Result<()> {
        let n = self.size();
        self.memset(0, n, value)
    }
}

/// Check that `[offset, offset + len)` lies within a buffer of `size` bytes.
///
/// # Errors
/// [`Error::OutOfBuffer`] when it does not, including when the end overflows.
pub(crate) fn check_range(
    offset: usize,
    len: usize,
    size: usize,
) -> Result<std::ops::Range<usize>> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(offset..end),
        _ => Err(Error::OutOfBuffer {
            offset,
            len,
            buffer_size: size,
        }),
    }
}

/// Where a tensor sits in a buffer: checked against the buffer's bounds and
/// alignment when it was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Offset from the buffer's start.
    pub offset: usize,
    /// Bytes the tensor occupies.
    pub len: usize,
    /// The alignment the tensor's address was checked against: a power of
    /// two, at least the buffer's [`Buffer::alignment`].
    pub alignment: usize,
}

/// Place a tensor of `len` bytes named `tensor` at `offset` in `buffer`,
/// requiring its address to be a multiple of `alignment` (a power of two;
/// normally the buffer's own [`Buffer::alignment`]).
///
/// ```
/// use weightmap::buffer::{place, BufferType, CpuBufferType};
/// # fn main() -> weightmap::Result<()> {
/// let buf = CpuBufferType::new().alloc_buffer(128)?;
/// assert!(place(buf.as_ref(), "w", 32, 64, 32).is_ok());
/// assert!(place(buf.as_ref(), "w", 8, 64, 32).is_err()); // misaligned
/// assert!(place(buf.as_ref(), "w", 96, 64, 32).is_err()); // past the end
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::OutOfBuffer`] or [`Error::MisalignedPlacement`].
pub fn place(
    buffer: &dyn Buffer,
    tensor: &str,
    offset: usize,
    len: usize,
    alignment: usize,
) -> Result<Placement> {
    check_range(offset, len, buffer.size())?;
    let address = buffer.base_addr().wrapping_add(offset);
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(Error::InvalidAlignment { alignment });
    }
    if address % alignment != 0 {
        return Err(Error::MisalignedPlacement {
            tensor: tensor.to_owned(),
            address,
            alignment,
        });
    }
    Ok(Placement {
        offset,
        len,
        alignment,
    })
}

/// The largest power of two that divides `address`, capped at `cap` (a
/// power of two): the alignment a tensor at `address` really has.
pub(crate) fn address_alignment(address: usize, cap: usize) -> usize {
    if address == 0 {
        cap
    } else {
        (1usize << address.trailing_zeros()).min(cap)
    }
}

pub(crate) fn check_alignment(alignment: usize) -> Result<usize> {
    if alignment == 0 || !alignment.is_power_of_two() {
        Err(Error::InvalidAlignment { alignment })
    } else {
        Ok(alignment)
    }
}

/// A byte range of a read-only file mapping, handed to
/// [`BufferType::buffer_from_host_ptr`]: the memory a non-owning buffer
/// views. It keeps the mapping alive (an `Arc`), and only the loader makes
/// one, so it is covered by the `# Safety` contract of the load that mapped
/// the file: the file must not change while it, or any buffer holding it,
/// lives. It is not `Clone`.
#[derive(Debug)]
pub struct HostRegion {
    map: Arc<Mapping>,
    start: usize,
    len: usize,
}

impl HostRegion {
    pub(crate) fn new(map: Arc<Mapping>, start: usize, len: usize) -> Result<HostRegion> {
        check_range(start, len, map.len())?;
        Ok(HostRegion { map, start, len })
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map.bytes()[self.start..self.start + self.len]
    }

    /// Address of the first byte.
    pub fn addr(&self) -> usize {
        self.map.addr() + self.start
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the region starts in the file.
    pub fn file_start(&self) -> usize {
        self.start
    }
}
