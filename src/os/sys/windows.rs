//! Windows.
//!
//! Files are mapped as llama.cpp maps them (`src/llama-mmap.cpp`): one
//! `CreateFileMappingW(PAGE_READONLY)`, a `MapViewOfFile(FILE_MAP_READ)`
//! view, and the mapping handle closed at once (the view keeps the section
//! alive). Never `PAGE_WRITECOPY`, memmap2's `map_copy_read_only`: Windows
//! charges commit for the whole of a copy-on-write view when it is made
//! (transformers #48285), and a large one fails with error 1450 or 1455.
//! Views start at the 64 KiB allocation granularity, not the page
//! (onnxruntime #21195). What differs from Unix:
//!
//! - No read-ahead advice: `WillNeed` is `PrefetchVirtualMemory`, which on
//!   its own takes as many faults as no prefetch (Windows-Dev-Performance
//!   #108), so the background prefetch also touches each page, a reader
//!   thread (llama.cpp PR #734: 500 MB/s to 2.3 GB/s on first loads).
//! - Residency is the working set's (`QueryWorkingSetEx`): whether this
//!   process has the page mapped, not whether the file cache holds it, so
//!   a file's cached pages cannot be counted and `evict` cannot be done.
//! - A release takes pages out of the working set (`VirtualUnlock` on pages
//!   that are not locked); they stay in the standby list, the file cache,
//!   which an unprivileged process cannot drop.
//! - A mapped file cannot be truncated, so a mapped read never meets a
//!   vanished page; a failed in-page read (a disk or network error) raises
//!   `EXCEPTION_IN_PAGE_ERROR`.
//! - Reads on one file object are serialised, so every reading thread
//!   opens its own (`ReOpenFile`; llama.cpp #26541: 2.22× one shared
//!   handle). Direct reads use `FILE_FLAG_NO_BUFFERING`, whose offsets,
//!   lengths and buffers must be sector multiples: the stream path's 4 KiB
//!   granule is a multiple of every sector size in use.
//! - The budget is the least of the available physical memory and the job
//!   object's memory limits less what is used, as .NET's GC reads them
//!   (`GetRestrictedPhysicalMemoryLimit`, dotnet/runtime).

use std::fs::File;
use std::io;
use std::os::windows::fs::{FileExt, OpenOptionsExt};
use std::os::windows::io::{AsRawHandle, FromRawHandle};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use windows_sys::Win32::Foundation::{
    CloseHandle, GetLastError, ERROR_INVALID_PARAMETER, ERROR_NOT_LOCKED, ERROR_NOT_SUPPORTED,
    FALSE, HANDLE, INVALID_HANDLE_VALUE,
};
use windows_sys::Win32::Storage::FileSystem::{
    FileBasicInfo, GetFileInformationByHandle, GetFileInformationByHandleEx, ReOpenFile,
    BY_HANDLE_FILE_INFORMATION, FILE_BASIC_INFO, FILE_FLAG_NO_BUFFERING, FILE_GENERIC_READ,
    FILE_GENERIC_WRITE, FILE_SHARE_DELETE, FILE_SHARE_READ, FILE_SHARE_WRITE,
};
use windows_sys::Win32::System::JobObjects::{
    IsProcessInJob, JobObjectExtendedLimitInformation, JobObjectLimitViolationInformation,
    QueryInformationJobObject, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    JOBOBJECT_LIMIT_VIOLATION_INFORMATION, JOB_OBJECT_LIMIT_JOB_MEMORY,
    JOB_OBJECT_LIMIT_PROCESS_MEMORY,
};
use windows_sys::Win32::System::Memory::{
    CreateFileMappingW, MapViewOfFile, PrefetchVirtualMemory, UnmapViewOfFile, VirtualLock,
    VirtualUnlock, FILE_MAP_READ, MEMORY_MAPPED_VIEW_ADDRESS, PAGE_READONLY,
    WIN32_MEMORY_RANGE_ENTRY,
};
use windows_sys::Win32::System::ProcessStatus::{
    K32GetProcessMemoryInfo, K32QueryWorkingSetEx, PROCESS_MEMORY_COUNTERS,
    PROCESS_MEMORY_COUNTERS_EX, PSAPI_WORKING_SET_EX_INFORMATION,
};
use windows_sys::Win32::System::SystemInformation::{
    GetSystemInfo, GlobalMemoryStatusEx, MEMORYSTATUSEX, SYSTEM_INFO,
};
use windows_sys::Win32::System::Threading::{
    GetCurrentProcess, GetProcessWorkingSetSize, SetProcessWorkingSetSize,
};

use super::advice::{AccessAdvice, Residency};
use super::budget::{Budget, BudgetReading, Source};

/// Files map here.
pub(crate) const MAPS: bool = true;

/// `FILE_FLAG_NO_BUFFERING` reads bypass the file cache.
pub(crate) const DIRECT_IO: bool = true;

#[cfg(test)]
pub(crate) const REFUSED_MAP_ERROR: i32 = 1455; // ERROR_COMMITMENT_LIMIT

/// The page size and the allocation granularity, asked once.
fn system_info() -> (usize, usize) {
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    static GRANULE: AtomicUsize = AtomicUsize::new(0);
    let page = PAGE.load(Ordering::Relaxed);
    if page != 0 {
        return (page, GRANULE.load(Ordering::Relaxed));
    }
    // SAFETY: an all-zero SYSTEM_INFO is a valid value of this plain C
    // struct, and GetSystemInfo only writes to it.
    let mut info: SYSTEM_INFO = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a live, writable SYSTEM_INFO.
    unsafe { GetSystemInfo(&mut info) };
    let page = (info.dwPageSize as usize).max(4096);
    let granule = (info.dwAllocationGranularity as usize).max(page);
    GRANULE.store(granule, Ordering::Relaxed);
    PAGE.store(page, Ordering::Relaxed);
    (page, granule)
}

pub(crate) fn page_size() -> usize {
    system_info().0
}

/// A view must start at a multiple of the allocation granularity (64 KiB).
pub(crate) fn map_granularity() -> usize {
    system_info().1
}

/// The working-set limits `VirtualLock` is bound by, as text.
pub(crate) fn memlock_limit() -> String {
    let (mut min, mut max) = (0usize, 0usize);
    // SAFETY: the pseudo-handle of this process and two live, writable
    // locals.
    if unsafe { GetProcessWorkingSetSize(GetCurrentProcess(), &mut min, &mut max) } == FALSE {
        return "unknown".into();
    }
    format!("working set {min}..{max} bytes")
}

/// Nothing to do: Windows commits a fresh page on its first write, and has
/// no call that does it for a range in one go.
///
/// # Safety
/// None needed: nothing is done.
pub(crate) unsafe fn populate_write(_addr: usize, _len: usize) {}

/// Windows backs ordinary allocations with base pages only (large pages
/// need a privilege and locked memory): a no-op.
pub(crate) fn advise_huge_pages(_mem: &mut [u8]) {}

/// `Err` with the calling thread's last error.
fn last_error<T>() -> io::Result<T> {
    Err(io::Error::last_os_error())
}

/// A `PAGE_READONLY` view of `[start, start + len)` of a file.
pub(crate) struct FileMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the view is read-only memory owned by this value; reading it from
// any thread is fine, and nothing in it is tied to the thread that made it.
unsafe impl Send for FileMap {}
// SAFETY: shared access only ever reads.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Map `[start, start + len)` of `file` read-only.
    ///
    /// # Safety
    /// The file must not be modified while the view lives (Windows refuses
    /// to truncate it, but not to write it through another handle); `start`
    /// is a multiple of [`map_granularity`] and `len` is not 0.
    pub(crate) unsafe fn map(file: &File, start: u64, len: usize) -> io::Result<FileMap> {
        // Maximum size 0: the mapping is as large as the file.
        // SAFETY: a live file handle, no security attributes, no name.
        let section = unsafe {
            CreateFileMappingW(
                file.as_raw_handle() as HANDLE,
                std::ptr::null(),
                PAGE_READONLY,
                0,
                0,
                std::ptr::null(),
            )
        };
        if section.is_null() {
            return last_error();
        }
        // SAFETY: a live section handle; the offset is granularity-aligned
        // (the caller's promise) and `len` is checked by the system against
        // the section's size.
        let view = unsafe {
            MapViewOfFile(
                section,
                FILE_MAP_READ,
                (start >> 32) as u32,
                start as u32,
                len,
            )
        };
        // Taken before CloseHandle can overwrite it.
        let err = io::Error::last_os_error();
        // SAFETY: the section handle is ours and used no more; the view, if
        // made, keeps the section alive.
        unsafe { CloseHandle(section) };
        if view.Value.is_null() {
            return Err(err);
        }
        Ok(FileMap {
            ptr: view.Value.cast(),
            len,
        })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is this live read-only view; the file
        // does not change while it lives (the contract of `map`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn at(&self, off: usize) -> usize {
        self.ptr as usize + off
    }

    /// Windows has no read-ahead advice to give a runtime's own view, and
    /// no way to page out pages another view holds.
    pub(crate) fn follow(&self, _at: usize, _from: usize, _to: usize) -> io::Result<bool> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no advice for another view on Windows",
        ))
    }

    /// Windows has no read-ahead advice: `WillNeed` prefetches, the rest do
    /// nothing.
    pub(crate) fn advise(&self, advice: AccessAdvice, off: usize, len: usize) -> io::Result<()> {
        if advice == AccessAdvice::WillNeed {
            self.will_need(off, len);
        }
        Ok(())
    }

    /// No huge pages for file views.
    pub(crate) fn huge_pages(&self, _off: usize, _len: usize) -> bool {
        false
    }

    /// Nothing: views are read in base pages here.
    pub(crate) fn base_pages(&self, _off: usize, _len: usize) {}

    /// `PrefetchVirtualMemory` over the range (Windows 8+): reads are
    /// queued and the call returns. Advisory.
    pub(crate) fn will_need(&self, off: usize, len: usize) {
        let entry = WIN32_MEMORY_RANGE_ENTRY {
            VirtualAddress: self.at(off) as *mut _,
            NumberOfBytes: len,
        };
        // SAFETY: one entry describing a range inside this live view; the
        // call only reads the entry and queues reads of the range.
        let _ = unsafe { PrefetchVirtualMemory(GetCurrentProcess(), 1, &entry, 0) };
    }

    /// Queue the range, then read one byte of each page, so that the pages
    /// are cached and in the working set when this returns. Safe here, as
    /// Windows refuses to truncate a mapped file: only an I/O error can
    /// fail a read, and it raises `EXCEPTION_IN_PAGE_ERROR`.
    pub(crate) fn populate_read(&self, off: usize, len: usize) -> io::Result<()> {
        self.will_need(off, len);
        let page = page_size();
        let bytes = &self.bytes()[off..off + len];
        let mut at = 0;
        while at < bytes.len() {
            // A volatile read, so that the touch is not optimised away.
            // SAFETY: `at` is inside `bytes`, a live slice.
            unsafe { std::ptr::read_volatile(bytes.as_ptr().add(at)) };
            at += page;
        }
        Ok(())
    }

    /// Take the range's pages out of the working set: `VirtualUnlock` on
    /// pages that are not locked does that, and says `ERROR_NOT_LOCKED`.
    /// The pages stay in the file cache.
    pub(crate) fn release(&self, off: usize, len: usize) -> io::Result<()> {
        // SAFETY: a range inside this live view; VirtualUnlock changes
        // residency, never contents.
        if unsafe { VirtualUnlock(self.at(off) as *const _, len) } == FALSE {
            // SAFETY: no preconditions.
            let code = unsafe { GetLastError() };
            if code != ERROR_NOT_LOCKED {
                return Err(io::Error::from_raw_os_error(code as i32));
            }
        }
        Ok(())
    }

    /// Pages of the range in this process's working set.
    pub(crate) fn residency(&self, off: usize, len: usize) -> io::Result<Residency> {
        residency(self.at(off), len)
    }

    /// `VirtualLock` the view; when the working set is too small for it,
    /// raise the working set by the view's length and 1 MiB and try once
    /// more (llama.cpp's `llama_mlock`). Unlocked when the view is unmapped.
    pub(crate) fn lock(&self) -> io::Result<()> {
        // SAFETY: the whole of this live view.
        if unsafe { VirtualLock(self.ptr as *const _, self.len) } != FALSE {
            return Ok(());
        }
        let first = io::Error::last_os_error();
        let (mut min, mut max) = (0usize, 0usize);
        let process = {
            // SAFETY: no preconditions; a pseudo-handle needs no closing.
            unsafe { GetCurrentProcess() }
        };
        // SAFETY: two live, writable locals.
        if unsafe { GetProcessWorkingSetSize(process, &mut min, &mut max) } == FALSE {
            return Err(first);
        }
        let more = self.len.saturating_add(1 << 20);
        // SAFETY: plain integers for this process.
        let raised = unsafe {
            SetProcessWorkingSetSize(process, min.saturating_add(more), max.saturating_add(more))
        };
        if raised == FALSE {
            return Err(first);
        }
        // SAFETY: as above.
        if unsafe { VirtualLock(self.ptr as *const _, self.len) } == FALSE {
            return last_error();
        }
        Ok(())
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: the view this value made and owns; nothing borrows it any
        // more (borrows of `bytes` end before the owner drops).
        unsafe {
            UnmapViewOfFile(MEMORY_MAPPED_VIEW_ADDRESS {
                Value: self.ptr.cast(),
            })
        };
    }
}

/// Pages of the page-aligned `[addr, addr + len)` in this process's working
/// set (`QueryWorkingSetEx`, bit 0 of each page's attributes: valid), asked
/// in batches so that a large range needs no large table.
pub(crate) fn residency(addr: usize, len: usize) -> io::Result<Residency> {
    const BATCH: usize = 4096;
    let page = page_size();
    let pages = len.div_ceil(page);
    let mut info: Vec<PSAPI_WORKING_SET_EX_INFORMATION> = Vec::new();
    info.try_reserve_exact(pages.min(BATCH))
        .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
    let mut resident = 0u64;
    let mut first = 0;
    while first < pages {
        let n = BATCH.min(pages - first);
        info.clear();
        info.extend(
            (first..first + n).map(|i| PSAPI_WORKING_SET_EX_INFORMATION {
                VirtualAddress: (addr + i * page) as *mut _,
                ..Default::default()
            }),
        );
        let bytes = u32::try_from(n * std::mem::size_of::<PSAPI_WORKING_SET_EX_INFORMATION>())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `info` holds `n` entries, each naming an address; the
        // call fills their attributes and reads no mapped byte.
        if unsafe { K32QueryWorkingSetEx(GetCurrentProcess(), info.as_mut_ptr().cast(), bytes) }
            == FALSE
        {
            return last_error();
        }
        // SAFETY: `Flags` is the whole union as one integer, always valid.
        resident += info
            .iter()
            .filter(|e| unsafe { e.VirtualAttributes.Flags } & 1 != 0)
            .count() as u64;
        first += n;
    }
    Ok(Residency {
        resident_pages: resident,
        total_pages: pages as u64,
    })
}

fn no_cache_view<T>() -> io::Result<T> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "Windows cannot tell or drop which pages of a file are cached",
    ))
}

/// Never made: Windows tells a process's working set, not the file cache.
pub(crate) struct CacheProbe {
    never: std::convert::Infallible,
}

impl CacheProbe {
    pub(crate) fn open(_file: &File) -> io::Result<Option<CacheProbe>> {
        no_cache_view()
    }
    pub(crate) fn len(&self) -> usize {
        match self.never {}
    }
    pub(crate) fn residency(&self, _: usize, _: usize) -> io::Result<Residency> {
        match self.never {}
    }
}

/// Never made: there is no page map to follow a first pass by; the
/// windowed read-ahead is skipped, and says so.
#[derive(Debug)]
pub(crate) struct PageMap {
    never: std::convert::Infallible,
}

impl PageMap {
    pub(crate) fn open() -> io::Result<PageMap> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "Windows has no page map",
        ))
    }
    pub(crate) fn present(&self, _addr: usize) -> io::Result<bool> {
        match self.never {}
    }
}

pub(crate) fn evict(_file: &File) -> io::Result<()> {
    no_cache_view()
}

/// Windows cannot drop a range of a file's cache: a no-op.
pub(crate) fn drop_cached(_file: &File, _offset: u64, _len: u64) {}

/// No per-handle read-ahead switch: a no-op.
pub(crate) fn advise_no_readahead(_file: &File) {}

/// `ReadFile` at an offset (`seek_read`): positioned, though reads on one
/// file object are serialised ([`reopen_for_reader`]).
pub(crate) fn read_some_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    file.seek_read(buf, offset)
}

/// A reading thread's own file object on `file` (`ReOpenFile`), for direct
/// reads with `FILE_FLAG_NO_BUFFERING`; `None`, and the handle shared, if
/// the system will not reopen it.
pub(crate) fn reopen_for_reader(file: &File, direct: bool) -> io::Result<Option<File>> {
    let flags = if direct { FILE_FLAG_NO_BUFFERING } else { 0 };
    // SAFETY: a live handle; the returned handle, if valid, is new and ours.
    let h = unsafe {
        ReOpenFile(
            file.as_raw_handle() as HANDLE,
            FILE_GENERIC_READ,
            FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
            flags,
        )
    };
    if h == INVALID_HANDLE_VALUE || h.is_null() {
        return Ok(None);
    }
    // SAFETY: `h` is a valid handle that nothing else owns.
    Ok(Some(unsafe { File::from_raw_handle(h as _) }))
}

/// Open `path` for reads that bypass the file cache
/// (`FILE_FLAG_NO_BUFFERING`).
pub(crate) fn open_direct(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(FILE_FLAG_NO_BUFFERING)
        .open(path)
}

/// Whether `e` refuses unbuffered reads (an unaligned request, a file
/// system without them), after which buffered reads serve instead.
pub(crate) fn refuses_direct_io(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(c) if c == ERROR_INVALID_PARAMETER as i32 || c == ERROR_NOT_SUPPORTED as i32
    )
}

/// The volume serial number and file index of an open file.
fn file_id(file: &File) -> io::Result<(u32, u32, u32)> {
    // SAFETY: an all-zero BY_HANDLE_FILE_INFORMATION is a valid value.
    let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: a live handle and a live, writable struct.
    if unsafe { GetFileInformationByHandle(file.as_raw_handle() as HANDLE, &mut info) } == FALSE {
        return last_error();
    }
    Ok((
        info.dwVolumeSerialNumber,
        info.nFileIndexHigh,
        info.nFileIndexLow,
    ))
}

/// Whether `path` still names the open `file` (volume and file index).
pub(crate) fn same_file(file: &File, path: &Path) -> io::Result<bool> {
    Ok(file_id(file)? == file_id(&File::open(path)?)?)
}

/// The volume serial number and file index of an open file: with its size
/// and modification time, what tells one file from another.
pub(crate) fn file_identity(file: &File) -> io::Result<(u64, u64)> {
    let (volume, high, low) = file_id(file)?;
    Ok((u64::from(volume), (u64::from(high) << 32) | u64::from(low)))
}

/// The open file's change time (`FILE_BASIC_INFO.ChangeTime`, in 100 ns
/// units): set by any write or attribute change, and not by
/// `SetFileTime` on the last-write time alone, so a rewrite whose
/// modification time was restored still shows here.
pub(crate) fn change_time_ns(file: &File) -> io::Result<u64> {
    // SAFETY: an all-zero FILE_BASIC_INFO is a valid value.
    let mut info: FILE_BASIC_INFO = unsafe { std::mem::zeroed() };
    // SAFETY: a live handle, and a live, writable struct of the size given.
    let ok = unsafe {
        GetFileInformationByHandleEx(
            file.as_raw_handle() as HANDLE,
            FileBasicInfo,
            (&mut info as *mut FILE_BASIC_INFO).cast(),
            std::mem::size_of::<FILE_BASIC_INFO>() as u32,
        )
    };
    if ok == FALSE {
        return last_error();
    }
    Ok(u64::try_from(info.ChangeTime)
        .unwrap_or(0)
        .saturating_mul(100))
}

/// A second handle on `file` that writes past the file cache
/// (`ReOpenFile` with `FILE_FLAG_NO_BUFFERING`: the same file, never its
/// path opened again).
pub(crate) struct DirectWrites<'a> {
    direct: File,
    _file: std::marker::PhantomData<&'a File>,
}

impl<'a> DirectWrites<'a> {
    pub(crate) fn start(file: &'a File) -> io::Result<DirectWrites<'a>> {
        // SAFETY: a live handle; ReOpenFile returns a new one or an error.
        let h = unsafe {
            ReOpenFile(
                file.as_raw_handle() as HANDLE,
                FILE_GENERIC_WRITE,
                FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                FILE_FLAG_NO_BUFFERING,
            )
        };
        if h == INVALID_HANDLE_VALUE || h.is_null() {
            return last_error();
        }
        // SAFETY: `h` is a valid handle that nothing else owns.
        let direct = unsafe { File::from_raw_handle(h as _) };
        Ok(DirectWrites {
            direct,
            _file: std::marker::PhantomData,
        })
    }

    /// The handle writing past the file cache.
    pub(crate) fn file(&self) -> &File {
        &self.direct
    }
}

/// Extending a file with `SetEndOfFile` (`File::set_len`) allocates its
/// clusters on NTFS, so a full disk fails there, before any write through a
/// mapping: nothing more to do.
pub(crate) fn reserve(_file: &File, _len: u64) -> io::Result<()> {
    Ok(())
}

/// Whether [`try_lock`] tells a held file from a free one here (none taken (`try_lock`)).
pub(crate) const LOCKS: bool = false;

/// No advisory lock is taken: a file another process has mapped cannot be
/// deleted on Windows, which is what the lock guards against elsewhere.
pub(crate) fn try_lock(_file: &File) -> io::Result<bool> {
    Ok(true)
}

/// The least of the available physical memory and, in a job, its memory
/// limits less what is committed. The available memory counts the
/// standby list (cached pages) already, so `_own_cached` changes nothing.
pub(crate) fn read_budget(_own_cached: u64) -> BudgetReading {
    let mut found = Vec::new();
    let mut unread = Vec::new();
    // SAFETY: an all-zero MEMORYSTATUSEX is valid; dwLength is set below.
    let mut status: MEMORYSTATUSEX = unsafe { std::mem::zeroed() };
    status.dwLength = std::mem::size_of::<MEMORYSTATUSEX>() as u32;
    // SAFETY: a live, writable struct with its length set.
    if unsafe { GlobalMemoryStatusEx(&mut status) } == FALSE {
        unread.push(format!(
            "GlobalMemoryStatusEx: {}",
            io::Error::last_os_error()
        ));
    } else if status.ullTotalPhys == 0 || status.ullAvailPhys == 0 {
        // A call that succeeds and reports no memory at all has read
        // nothing (Wine can answer zeros when it fails to read the host's
        // figures). Taken as 0 it would refuse every copy, so it is left
        // out like a failed call.
        unread.push(format!(
            "GlobalMemoryStatusEx: no figure (total {}, available {})",
            status.ullTotalPhys, status.ullAvailPhys
        ));
    } else {
        found.push(Budget {
            bytes: status.ullAvailPhys,
            source: Source::AvailablePhysical,
            counted: None,
        });
    }
    job_limits(&mut found, &mut unread);
    BudgetReading::least(found, unread)
}

/// The job object's `JobMemoryLimit` less the job's committed memory, and
/// `ProcessMemoryLimit` less this process's, where the job sets them.
fn job_limits(found: &mut Vec<Budget>, unread: &mut Vec<String>) {
    let mut in_job = FALSE;
    // SAFETY: this process's pseudo-handle, no job handle (any job), and a
    // live, writable BOOL.
    let ok = unsafe { IsProcessInJob(GetCurrentProcess(), std::ptr::null_mut(), &mut in_job) };
    if ok == FALSE {
        unread.push(format!("IsProcessInJob: {}", io::Error::last_os_error()));
        return;
    }
    if in_job == FALSE {
        return;
    }
    // SAFETY: an all-zero struct of integers is valid.
    let mut limits: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
    if let Err(e) = query_job(JobObjectExtendedLimitInformation, &mut limits) {
        unread.push(format!("QueryInformationJobObject(extended limits): {e}"));
        return;
    }
    let flags = limits.BasicLimitInformation.LimitFlags;
    if flags & JOB_OBJECT_LIMIT_PROCESS_MEMORY != 0 {
        match process_commit() {
            Ok(used) => found.push(Budget {
                bytes: (limits.ProcessMemoryLimit as u64).saturating_sub(used),
                source: Source::JobObject {
                    limit: "ProcessMemoryLimit",
                },
                counted: None,
            }),
            Err(e) => unread.push(format!("GetProcessMemoryInfo: {e}")),
        }
    }
    if flags & JOB_OBJECT_LIMIT_JOB_MEMORY != 0 {
        // SAFETY: as above.
        let mut usage: JOBOBJECT_LIMIT_VIOLATION_INFORMATION = unsafe { std::mem::zeroed() };
        match query_job(JobObjectLimitViolationInformation, &mut usage) {
            Ok(()) => found.push(Budget {
                bytes: (limits.JobMemoryLimit as u64).saturating_sub(usage.JobMemory),
                source: Source::JobObject {
                    limit: "JobMemoryLimit",
                },
                counted: None,
            }),
            Err(e) => unread.push(format!("QueryInformationJobObject(job memory): {e}")),
        }
    }
}

/// `QueryInformationJobObject` of this process's job into `out`.
fn query_job<T>(class: i32, out: &mut T) -> io::Result<()> {
    let size = std::mem::size_of::<T>() as u32;
    // SAFETY: a null job handle means the calling process's job; `out` is a
    // live, writable value of the size given, of the type `class` fills.
    let ok = unsafe {
        QueryInformationJobObject(
            std::ptr::null_mut(),
            class,
            (out as *mut T).cast(),
            size,
            std::ptr::null_mut(),
        )
    };
    if ok == FALSE {
        return last_error();
    }
    Ok(())
}

/// This process's committed private memory (`PrivateUsage`), what a job's
/// process memory limit holds it to.
fn process_commit() -> io::Result<u64> {
    // SAFETY: an all-zero struct of integers is valid; `cb` is set below.
    let mut counters: PROCESS_MEMORY_COUNTERS_EX = unsafe { std::mem::zeroed() };
    counters.cb = std::mem::size_of::<PROCESS_MEMORY_COUNTERS_EX>() as u32;
    // SAFETY: the EX struct starts with the plain one and `cb` says which
    // it is; a live, writable value.
    let ok = unsafe {
        K32GetProcessMemoryInfo(
            GetCurrentProcess(),
            (&mut counters as *mut PROCESS_MEMORY_COUNTERS_EX).cast::<PROCESS_MEMORY_COUNTERS>(),
            counters.cb,
        )
    };
    if ok == FALSE {
        return last_error();
    }
    Ok(counters.PrivateUsage as u64)
}

/// Whether `e` says the disk or the user's quota is full
/// (`ERROR_HANDLE_DISK_FULL`, `ERROR_DISK_FULL`, `ERROR_DISK_QUOTA_EXCEEDED`).
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(39 | 112 | 1295))
}

/// Whether `e` says the place cannot be written at all
/// (`ERROR_ACCESS_DENIED`, `ERROR_WRITE_PROTECT`).
pub(crate) fn is_read_only(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(5 | 19))
}

/// No transparent huge pages on Windows.
pub(crate) fn thp_switch() -> Option<String> {
    None
}

/// No `/proc/self/smaps` on Windows: no file is mapped in huge pages.
pub(crate) fn read_smaps() -> io::Result<String> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "no huge pages for mapped files on this platform",
    ))
}
