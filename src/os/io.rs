//! File and memory I/O the loader needs beyond `std`: positioned reads,
//! direct (uncached) reads, and prefaulting memory about to be written.

use std::fs::{File, Metadata};
use std::io;
use std::path::Path;

use crate::error::{Error, Result};

/// Read `buf.len()` bytes at `offset`.
pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(buf, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = file;
        f.seek(SeekFrom::Start(offset))?;
        f.read_exact(buf)
    }
}

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
/// (`MADV_POPULATE_WRITE`, Linux 5.14+), so that filling it takes no page
/// fault per 4 KiB. Reading threads call this on their own pieces, so the
/// kernel's zeroing of fresh pages runs on every thread at once rather than
/// in one up-front pass. Best effort: elsewhere, on an older kernel, or on
/// memory that refuses it, pages fault in as they are written.
pub(crate) fn prefault_for_write(dst: &mut [u8]) {
    populate_write(dst.as_mut_ptr() as usize, dst.len());
}

/// `MADV_POPULATE_WRITE` over the whole pages inside `[addr, addr + len)`,
/// memory the caller borrows uniquely; failure is ignored.
fn populate_write(addr: usize, len: usize) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let page = super::mem::page_size();
        let start = addr.next_multiple_of(page);
        let end = addr.saturating_add(len) & !(page - 1);
        if end > start {
            // SAFETY: [start, end) is page-aligned, as madvise requires, and
            // inside memory the caller borrows uniquely (a slice or a
            // vector's spare capacity). MADV_POPULATE_WRITE only maps the
            // pages writable: it never reads or changes their contents
            // (uninitialised memory stays unread), unmaps nothing, and
            // fails (with an error we ignore) rather than signalling.
            unsafe {
                libc::madvise(
                    start as *mut libc::c_void,
                    end - start,
                    libc::MADV_POPULATE_WRITE,
                );
            }
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = (addr, len);
}

/// Open `path` for direct reads (`O_DIRECT`: the page cache is bypassed, so
/// a cold load reads at the device's rate and leaves no cache behind).
#[cfg(target_os = "linux")]
pub(crate) fn open_direct(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// Whether `e` is a file system's refusal of direct I/O (`EINVAL`, from the
/// open or from the first read), after which buffered reads serve instead.
pub(crate) fn refuses_direct_io(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
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
