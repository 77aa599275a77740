//! File and memory I/O the loader needs beyond `std`: opening a model file,
//! positioned reads, direct (uncached) reads, and prefaulting memory about
//! to be written.

use std::fs::{File, Metadata};
use std::io;
use std::path::Path;

use super::pages::whole_pages;
use super::sys;
use crate::error::{Error, Result};

/// Read `buf.len()` bytes at `offset`, without moving a shared file
/// position (`pread`; Windows `ReadFile` with an offset).
pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match sys::read_some_at(file, &mut buf[got..], offset + got as u64) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(crate) use sys::{open_direct, read_some_at, refuses_direct_io, reopen_for_reader, DIRECT_IO};

/// The granule of direct I/O: offsets, lengths and addresses are
/// multiples of it (the largest logical block size in common use).
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// [`prefault_for_write`] for the next `n` bytes of `v`'s spare capacity
/// (at most all of it), before they are filled: a header read into a
/// fresh vector otherwise takes a page fault every 4 KiB as it is zeroed,
/// a large share of the time spent reading a header of megabytes
/// (BENCHMARKS.md, "Header parsing").
pub(crate) fn prefault_spare(v: &mut Vec<u8>, n: usize) {
    let spare = v.spare_capacity_mut();
    let n = n.min(spare.len());
    if n >= 64 << 10 {
        // A few pages cost less in faults than the call does.
        populate_write(spare.as_mut_ptr() as usize, n);
    }
}

/// Fault in, writable, the whole pages inside `dst` in one kernel call
/// (`MADV_POPULATE_WRITE`, Linux 5.14+ and Android), so that filling it
/// takes no page fault per page. Reading threads call this on their own
/// pieces, so the kernel's zeroing of fresh pages runs on every thread at
/// once rather than in one up-front pass. Best effort: elsewhere, on an
/// older kernel, or on memory that refuses it, pages fault in as they are
/// written.
pub(crate) fn prefault_for_write(dst: &mut [u8]) {
    populate_write(dst.as_mut_ptr() as usize, dst.len());
}

/// Prefault the whole pages inside `[addr, addr + len)`, memory the caller
/// borrows uniquely; failure is ignored.
fn populate_write(addr: usize, len: usize) {
    if let Some((start, end)) = whole_pages(addr, len, sys::page_size()) {
        // SAFETY: [start, end) is whole pages inside memory our callers
        // borrow uniquely (a slice or a vector's spare capacity).
        unsafe { sys::populate_write(start, end - start) };
    }
}

/// Open `path` for loading: `stat` it first (opening a FIFO would block until
/// a writer appears) and refuse anything but a regular file, open it, and
/// refuse an empty one. Every path into a file goes through here, so the
/// errors are the same whichever path runs: [`Error::Io`] (with the OS's
/// `io::ErrorKind`: `NotFound`, `PermissionDenied`, ...), [`Error::NotAFile`],
/// [`Error::EmptyFile`]. Returns the file and its metadata as opened.
pub(crate) fn open_checked(path: &Path) -> Result<(File, Metadata)> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io("stat", path, e))?;
    if !meta.is_file() {
        return Err(Error::NotAFile { path: path.into() });
    }
    let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
    if meta.len() == 0 {
        return Err(Error::EmptyFile { path: path.into() });
    }
    Ok((file, meta))
}
