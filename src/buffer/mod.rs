//! ggml-style backend buffers.
//!
//! A [`BufferType`] knows its alignment, its largest buffer and whether its
//! memory is host-visible, and allocates [`Buffer`]s. A tensor is *placed*
//! at an offset inside a buffer ([`place`]), which checks bounds and the
//! address's alignment and returns a typed error rather than asserting.
//!
//! The shapes follow ggml's `ggml_backend_buffer_type_i` and
//! `ggml_backend_buffer_i`; optional slots become default methods. What C
//! does by convention, the types do here:
//! - a buffer over a file mapping ([`MappedBuffer`], ggml's
//!   `ggml_backend_cpu_buffer_from_ptr`) holds the mapping through an `Arc`,
//!   so no view of it can outlive the mapping, and dropping it frees nothing
//!   but its handle;
//! - a mapped buffer is read-only: [`Buffer::set`], [`Buffer::memset`] and
//!   [`Buffer::clear`] return [`crate::Error::ReadOnly`] and [`Buffer::host_bytes_mut`]
//!   returns `None`, so nothing can write through a mapped view. A runtime
//!   that must rewrite a weight takes an owned copy ([`crate::TensorRef::to_owned_tensor`]).

mod cpu;
#[cfg(feature = "test-util")]
mod device;

mod interface;

pub use cpu::{CpuBuffer, CpuBufferType, MappedBuffer};
#[cfg(feature = "test-util")]
pub use device::{SimDeviceBuffer, SimDeviceBufferType};
pub(crate) use interface::address_alignment;
pub use interface::{place, Buffer, BufferType, BufferUsage, HostRegion, Placement};
