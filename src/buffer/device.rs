//! A simulated device: a buffer type whose memory the host cannot see.
//!
//! It exists so the loader's path for non-host backends (stream through a
//! bounded staging buffer, `set` each tensor) is exercised without a GPU.

use super::interface::{check_alignment, check_range, Buffer, BufferType, BufferUsage, HostRegion};
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
    host_ptr: bool,
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
            host_ptr: false,
        })
    }

    /// The same device, able (`true`) or not to wrap host memory without a
    /// copy ([`BufferType::buffer_from_host_ptr`], as CUDA host registration
    /// or a Metal no-copy buffer does), so both of the loader's device paths
    /// can be tested.
    pub fn with_host_ptr(mut self, yes: bool) -> Self {
        self.host_ptr = yes;
        self
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
            mem: Mem::Owned(vec![0; size]),
            alignment: self.alignment,
            usage: BufferUsage::Any,
        }))
    }
    fn supports_host_ptr(&self) -> bool {
        self.host_ptr
    }
    fn buffer_from_host_ptr(
        &self,
        region: HostRegion,
        alignment: usize,
    ) -> Result<Box<dyn Buffer>> {
        if !self.host_ptr {
            return Err(Error::HostPtrUnsupported {
                buffer_type: self.name().into(),
            });
        }
        Ok(Box::new(SimDeviceBuffer {
            mem: Mem::Host(region),
            alignment: check_alignment(alignment)?,
            usage: BufferUsage::Any,
        }))
    }
}

/// Device memory: its own, or host memory it was handed.
#[derive(Debug)]
enum Mem {
    Owned(Vec<u8>),
    /// Wrapped host memory (read-only: it is a file mapping).
    Host(HostRegion),
}

/// Memory of the simulated device.
#[derive(Debug)]
pub struct SimDeviceBuffer {
    mem: Mem,
    alignment: usize,
    usage: BufferUsage,
}

impl Buffer for SimDeviceBuffer {
    fn type_name(&self) -> &str {
        "SimDevice"
    }
    fn size(&self) -> usize {
        match &self.mem {
            Mem::Owned(v) => v.len(),
            Mem::Host(r) => r.len(),
        }
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
        matches!(self.mem, Mem::Owned(_))
    }
    fn is_host(&self) -> bool {
        false
    }
    fn base_addr(&self) -> usize {
        match &self.mem {
            Mem::Owned(_) => 0,
            // A device address of wrapped host memory is the host address.
            Mem::Host(r) => r.addr(),
        }
    }
    fn set(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let r = check_range(offset, data.len(), self.size())?;
        match &mut self.mem {
            Mem::Owned(v) => {
                v[r].copy_from_slice(data);
                Ok(())
            }
            Mem::Host(_) => Err(Error::ReadOnly {
                buffer: "SimDevice".into(),
            }),
        }
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = check_range(offset, out.len(), self.size())?;
        match &self.mem {
            Mem::Owned(v) => out.copy_from_slice(&v[r]),
            Mem::Host(h) => out.copy_from_slice(&h.bytes()[r]),
        }
        Ok(())
    }
    fn memset(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        let r = check_range(offset, len, self.size())?;
        match &mut self.mem {
            Mem::Owned(v) => {
                v[r].fill(value);
                Ok(())
            }
            Mem::Host(_) => Err(Error::ReadOnly {
                buffer: "SimDevice".into(),
            }),
        }
    }
}
