//! Every system call weightmap makes, behind safe functions (as memmap2's
//! `os` module): the file mapping and its advice, residency and eviction;
//! positioned, direct and prefaulting I/O; what the system says of memory.
//! The rest of the crate calls no `libc` function.

mod budget;
mod io;
mod map;
mod mem;

pub(crate) use budget::*;
pub(crate) use io::*;
pub(crate) use map::*;
pub(crate) use mem::*;

// The page-cache helpers a caller may use directly.
pub use map::{evict, file_residency, AccessAdvice, Residency};
