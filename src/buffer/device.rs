//! A simulated device: a buffer type whose memory the host cannot see.
//!
//! It exists so the loader's path for non-host backends (stream through a
//! bounded staging buffer, `set` each tensor) is exercised without a GPU.

use super::{check_alignment, check_range, Buffer, BufferType, BufferUsage};
use crate::error::{Error, Result};

/// A buffer type for a pretend device with its own memory, reachable only
/// through [`Buffer::set`] and [`Buffer::get`].
///
/// ```
/// use weightmap::buffer::{Buffer, BufferType, SimDeviceBufferType};
/// # fn main() -> weightmap::Result<()> {
/// let dev = SimDeviceBufferType::new(256, 1 << 20)?;
/// let mut buf = dev.alloc_buffer(1024)?;
/// assert!(buf.host_bytes().is_none());
/// buf.set(256, b"weights")?;
/// let mut out = [0u8; 7];
/// buf.get(256, &mut out)?;
/// assert_eq!(&out, b"weights");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SimDeviceBufferType {
    alignment: usize,
    max_size: usize,
}

impl SimDeviceBufferType {
    /// A device with the given tensor alignment and largest buffer.
    ///
    /// # Errors
    /// [`Error::InvalidAlignment`] unless `alignment` is a nonzero power of two.
    pub fn new(alignment: usize, max_size: usize) -> Result<Self> {
        Ok(SimDeviceBufferType {
            alignment: check_alignment(alignment)?,
            max_size,
        })
    }
}

impl BufferType for SimDeviceBufferType {
    fn name(&self) -> &str {
        "SimDevice"
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn max_size(&self) -> usize {
        self.max_size
    }
    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn Buffer>> {
        if size > self.max_size {
            return Err(Error::BufferTooLarge {
                buffer_type: self.name().into(),
                size,
                max: self.max_size,
            });
        }
        Ok(Box::new(SimDeviceBuffer {
            mem: vec![0; size],
            alignment: self.alignment,
            usage: BufferUsage::Any,
        }))
    }
}

/// Memory of the simulated device.
#[derive(Debug)]
pub struct SimDeviceBuffer {
    mem: Vec<u8>,
    alignment: usize,
    usage: BufferUsage,
}

impl Buffer for SimDeviceBuffer {
    fn type_name(&self) -> &str {
        "SimDevice"
    }
    fn size(&self) -> usize {
        self.mem.len()
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn usage(&self) -> BufferUsage {
        self.usage
    }
    fn set_usage(&mut self, usage: BufferUsage) {
        self.usage = usage;
    }
    fn owns_memory(&self) -> bool {
        true
    }
    fn is_host(&self) -> bool {
        false
    }
    fn base_addr(&self) -> usize {
        0
    }
    fn set(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let r = check_range(offset, data.len(), self.mem.len())?;
        self.mem[r].copy_from_slice(data);
        Ok(())
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = check_range(offset, out.len(), self.mem.len())?;
        out.copy_from_slice(&self.mem[r]);
        Ok(())
    }
    fn memset(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        let r = check_range(offset, len, self.mem.len())?;
        self.mem[r].fill(value);
        Ok(())
    }
}
