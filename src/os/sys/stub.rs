//! Systems weightmap does not map on (WASI and others without `unix` or
//! `windows`): every load streams, and the report says why
//! (`FallbackReason::Unsupported`). Reads use `std` alone; everything about
//! pages is a no-op or `Unsupported`.

use std::fs::File;
use std::io;
use std::path::Path;

use super::advice::{AccessAdvice, Residency};
use super::budget::BudgetReading;

pub(crate) const MAPS: bool = false;
pub(crate) const DIRECT_IO: bool = false;
#[cfg(test)]
pub(crate) const REFUSED_MAP_ERROR: i32 = 1;

fn unsupported<T>() -> io::Result<T> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "not supported on this platform",
    ))
}

/// Nothing here is rounded to a system page; 4 KiB keeps the arithmetic
/// of the platform-independent code meaningful.
pub(crate) fn page_size() -> usize {
    4096
}

pub(crate) fn map_granularity() -> usize {
    page_size()
}

pub(crate) fn memlock_limit() -> String {
    "unknown".into()
}

/// # Safety
/// None needed: nothing is done.
pub(crate) unsafe fn populate_write(_addr: usize, _len: usize) {}

pub(crate) fn advise_huge_pages(_mem: &mut [u8]) {}

/// Never made: [`FileMap::map`] always fails.
pub(crate) struct FileMap {
    never: std::convert::Infallible,
}

impl FileMap {
    /// # Safety
    /// None needed: nothing is mapped.
    pub(crate) unsafe fn map(_file: &File, _start: u64, _len: usize) -> io::Result<FileMap> {
        unsupported()
    }
    pub(crate) fn bytes(&self) -> &[u8] {
        match self.never {}
    }
    pub(crate) fn len(&self) -> usize {
        match self.never {}
    }
    pub(crate) fn advise(&self, _: AccessAdvice, _: usize, _: usize) -> io::Result<()> {
        match self.never {}
    }
    pub(crate) fn follow(&self, _: usize, _: usize, _: usize) -> io::Result<bool> {
        match self.never {}
    }
    pub(crate) fn huge_pages(&self, _: usize, _: usize) -> bool {
        match self.never {}
    }
    pub(crate) fn base_pages(&self, _: usize, _: usize) {
        match self.never {}
    }
    pub(crate) fn will_need(&self, _: usize, _: usize) {
        match self.never {}
    }
    pub(crate) fn populate_read(&self, _: usize, _: usize) -> io::Result<()> {
        match self.never {}
    }
    pub(crate) fn release(&self, _: usize, _: usize) -> io::Result<()> {
        match self.never {}
    }
    pub(crate) fn residency(&self, _: usize, _: usize) -> io::Result<Residency> {
        match self.never {}
    }
    pub(crate) fn lock(&self) -> io::Result<()> {
        match self.never {}
    }
}

pub(crate) fn residency(_addr: usize, _len: usize) -> io::Result<Residency> {
    unsupported()
}

/// Never made: residency cannot be asked here.
pub(crate) struct CacheProbe {
    never: std::convert::Infallible,
}

impl CacheProbe {
    pub(crate) fn open(_file: &File) -> io::Result<Option<CacheProbe>> {
        unsupported()
    }
    pub(crate) fn len(&self) -> usize {
        match self.never {}
    }
    pub(crate) fn residency(&self, _: usize, _: usize) -> io::Result<Residency> {
        match self.never {}
    }
}

/// Never made: there is no page map.
#[derive(Debug)]
pub(crate) struct PageMap {
    never: std::convert::Infallible,
}

impl PageMap {
    pub(crate) fn open() -> io::Result<PageMap> {
        unsupported()
    }
    pub(crate) fn present(&self, _addr: usize) -> io::Result<bool> {
        match self.never {}
    }
}

pub(crate) fn evict(_file: &File) -> io::Result<()> {
    unsupported()
}

pub(crate) fn drop_cached(_file: &File, _offset: u64, _len: u64) {}

pub(crate) fn advise_no_readahead(_file: &File) {}

/// A seek and a read, one at a time in the process: a cloned handle shares
/// its position, so two threads' seeks must not interleave.
pub(crate) fn read_some_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::io::{Read, Seek, SeekFrom};
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut f = file;
    f.seek(SeekFrom::Start(offset))?;
    f.read(buf)
}

/// `None`: the threads share the handle ([`read_some_at`] serialises them).
pub(crate) fn reopen_for_reader(_file: &File, _direct: bool) -> io::Result<Option<File>> {
    Ok(None)
}

pub(crate) fn open_direct(_path: &Path) -> io::Result<File> {
    unsupported()
}

pub(crate) fn refuses_direct_io(_e: &io::Error) -> bool {
    false
}

/// Nothing identifies a file here beyond its metadata: the length and the
/// modification time, which the caller compares too.
pub(crate) fn same_file(_file: &File, path: &Path) -> io::Result<bool> {
    std::fs::metadata(path).map(|_| true)
}

pub(crate) fn read_budget(_own_cached: u64) -> BudgetReading {
    BudgetReading::Unreadable {
        why: "no memory figure is read on this system".into(),
    }
}

pub(crate) fn file_identity(_file: &File) -> io::Result<(u64, u64)> {
    Ok((0, 0))
}

pub(crate) fn change_time_ns(_file: &File) -> io::Result<u64> {
    Ok(0)
}

/// No direct writes here.
pub(crate) struct DirectWrites<'a>(&'a File);

impl<'a> DirectWrites<'a> {
    pub(crate) fn start(_file: &'a File) -> io::Result<DirectWrites<'a>> {
        unsupported()
    }

    pub(crate) fn file(&self) -> &File {
        self.0
    }
}

pub(crate) fn reserve(_file: &File, _len: u64) -> io::Result<()> {
    unsupported()
}

/// Whether [`try_lock`] tells a held file from a free one here (none).
pub(crate) const LOCKS: bool = false;

pub(crate) fn try_lock(_file: &File) -> io::Result<bool> {
    Ok(true)
}

pub(crate) fn is_no_space(_e: &io::Error) -> bool {
    false
}

pub(crate) fn is_read_only(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
}

/// No transparent huge pages on this platform.
pub(crate) fn thp_switch() -> Option<String> {
    None
}

/// No `/proc/self/smaps` on this platform: no file is mapped in huge pages.
pub(crate) fn read_smaps() -> io::Result<String> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no huge pages for mapped files on this platform",
    ))
}
