//! The file mapping: a read-only map of a file, advice over its ranges,
//! residency, locking and eviction.
//!
//! A [`Mapping`] is a read-only, private (`PROT_READ`, `MAP_PRIVATE`) map of a
//! whole file, made with memmap2's `map_copy_read_only`. The pages are the
//! page cache's: the kernel can drop them under pressure and read them again,
//! and they are charged to the process as file-backed memory (RssFile), not
//! anonymous memory.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use memmap2::{Advice, Mmap, MmapOptions};

use super::mem::page_size;

/// How the kernel should expect a range of the mapping to be read.
///
/// Advice is advisory: the kernel may ignore it, and weightmap ignores its
/// failure (as llama.cpp only warns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AccessAdvice {
    /// `MADV_NORMAL`: the kernel's default read-ahead around each fault.
    #[default]
    Normal,
    /// `MADV_RANDOM`: no read-ahead; each first touch reads one page. Right
    /// for a table read by row (a token-embedding lookup), where read-ahead
    /// would pull in rows no lookup needs; ruinous for a tensor read whole
    /// from a cold cache (one synchronous 4 KiB read per page).
    Random,
    /// `MADV_SEQUENTIAL`: aggressive read-ahead, and pages may be reclaimed
    /// soon after use.
    Sequential,
    /// `MADV_WILLNEED`: start reading the range now, and return.
    WillNeed,
}

impl AccessAdvice {
    /// `"normal"`, `"random"`, `"sequential"` or `"willneed"`.
    pub fn name(self) -> &'static str {
        match self {
            AccessAdvice::Normal => "normal",
            AccessAdvice::Random => "random",
            AccessAdvice::Sequential => "sequential",
            AccessAdvice::WillNeed => "willneed",
        }
    }
}

/// How many pages of a range are in the page cache (`mincore`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Residency {
    /// Pages of the range that are resident.
    pub resident_pages: u64,
    /// Pages the range spans.
    pub total_pages: u64,
}

impl Residency {
    /// The resident fraction, from 0 to 1 (1 for an empty range).
    pub fn fraction(&self) -> f64 {
        if self.total_pages == 0 {
            1.0
        } else {
            self.resident_pages as f64 / self.total_pages as f64
        }
    }
}

/// Whether a mapped file is supported on this platform.
pub const SUPPORTED: bool = cfg!(unix);

/// A read-only private map of a whole file.
///
/// # Safety contract
/// Rust assumes memory behind a `&[u8]` does not change. A file-backed map
/// breaks that if the file is modified or truncated while mapped — by this
/// process or any other — and reading a page past a truncated end raises
/// `SIGBUS`. [`Mapping::map`] is therefore `unsafe`; its caller promises the
/// file stays unchanged while the mapping (or anything borrowing it) lives.
#[derive(Debug)]
pub struct Mapping {
    backing: Backing,
    /// Where the view starts in the backing: below a page, for a file range
    /// that starts off a page (the map starts at the page below it).
    delta: usize,
    /// Length of the view.
    len: usize,
    /// The file offset the map starts at (0 for a whole file).
    map_offset: u64,
    /// The mapped file, for page-cache advice on its ranges.
    #[cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(dead_code))]
    file: Option<File>,
}

/// What a [`Mapping`] views.
enum Backing {
    /// A read-only private map of a file.
    Map(Mmap),
    /// Memory the caller handed over (kept alive here); nothing to advise.
    Memory(Arc<dyn AsRef<[u8]> + Send + Sync>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backing::Map(m) => f.debug_tuple("Map").field(m).finish(),
            Backing::Memory(m) => f
                .debug_tuple("Memory")
                .field(&(**m).as_ref().len())
                .finish(),
        }
    }
}

impl Mapping {
    /// Map `file` read-only and private.
    ///
    /// # Safety
    /// The file must not be modified or truncated, by this or any other
    /// process, while the returned mapping or any view of it is alive.
    ///
    /// # Errors
    /// What `mmap` returns: `ENODEV` on filesystems that refuse it, `EINVAL`
    /// for an empty file, `ENOMEM`, ...
    pub unsafe fn map(file: &File) -> io::Result<Mapping> {
        // SAFETY: forwarded to the caller: the file stays unchanged while
        // the mapping lives. PROT_READ + MAP_PRIVATE means nothing in this
        // process can write through the map.
        let map = unsafe { MmapOptions::new().map_copy_read_only(file)? };
        let len = map.len();
        Ok(Mapping {
            backing: Backing::Map(map),
            delta: 0,
            len,
            map_offset: 0,
            file: Some(file.try_clone()?),
        })
    }

    /// Map `[offset, offset + len)` of `file` read-only and private: the map
    /// starts at the page below `offset`, and the view at `offset` (a model
    /// inside a larger file, such as an Android APK entry).
    ///
    /// # Safety
    /// As [`Mapping::map`], for that range of the file.
    ///
    /// # Errors
    /// What `mmap` returns; `InvalidInput` for a range past `usize`.
    pub unsafe fn map_range(file: &File, offset: u64, len: u64) -> io::Result<Mapping> {
        let page = page_size() as u64;
        let start = offset / page * page;
        let delta = (offset - start) as usize;
        let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let total = len
            .checked_add(delta)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: forwarded to the caller, as in `map`; the offset is
        // page-aligned, as mmap requires.
        let map = unsafe {
            MmapOptions::new()
                .offset(start)
                .len(total)
                .map_copy_read_only(file)?
        };
        Ok(Mapping {
            backing: Backing::Map(map),
            delta,
            len,
            map_offset: start,
            file: Some(file.try_clone()?),
        })
    }

    /// View memory the caller owns (`include_bytes!`, a buffer already in
    /// memory) as a mapping: safe, since it is kept alive and never changes
    /// behind a shared reference. Advice, release and residency are no-ops
    /// on it.
    pub fn from_memory(bytes: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Mapping {
        let len = (*bytes).as_ref().len();
        Mapping {
            backing: Backing::Memory(bytes),
            delta: 0,
            len,
            map_offset: 0,
            file: None,
        }
    }

    /// Memory borrowed from the caller, as [`Mapping::from_memory`] takes it,
    /// for a lifetime the type system does not carry.
    ///
    /// # Safety
    /// `bytes` must stay valid and unchanged while the returned `Arc`, and
    /// every clone of it, lives.
    pub(crate) unsafe fn borrowed_memory(bytes: &[u8]) -> Arc<dyn AsRef<[u8]> + Send + Sync> {
        struct Borrowed {
            ptr: *const u8,
            len: usize,
        }
        // SAFETY: `Borrowed` only reads memory the caller of
        // `from_borrowed` keeps valid and unchanged; shared reads are
        // thread-safe.
        unsafe impl Send for Borrowed {}
        // SAFETY: as for Send.
        unsafe impl Sync for Borrowed {}
        impl AsRef<[u8]> for Borrowed {
            fn as_ref(&self) -> &[u8] {
                // SAFETY: `ptr..ptr+len` was a live `&[u8]` when made, and
                // the caller of `from_borrowed` keeps it valid and unchanged
                // while this value lives.
                unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
            }
        }
        Arc::new(Borrowed {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        })
    }

    fn mmap(&self) -> Option<&Mmap> {
        match &self.backing {
            Backing::Map(m) => Some(m),
            Backing::Memory(_) => None,
        }
    }

    /// The viewed bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Map(m) => &m[self.delta..self.delta + self.len],
            Backing::Memory(b) => &(**b).as_ref()[..self.len],
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Address of the first byte of the view.
    pub fn addr(&self) -> usize {
        self.bytes().as_ptr() as usize
    }

    /// Page-align `[start, end)` (view offsets) outward at the start
    /// (madvise needs a page-aligned address; the length may be anything),
    /// clamped to the view; as offsets into the map.
    fn page_range(&self, start: usize, end: usize) -> (usize, usize) {
        let page = page_size();
        let end = end.min(self.len) + self.delta;
        let start = ((start.min(self.len) + self.delta).min(end) / page) * page;
        (start, end - start)
    }

    /// Round `[start, end)` (view offsets) inward to whole pages, clamped to
    /// the view; as offsets into the map: the pages that hold nothing but
    /// bytes of the range, so that advice or a release on them cannot affect
    /// a neighbour.
    fn page_range_inward(&self, start: usize, end: usize) -> (usize, usize) {
        let page = page_size();
        let end_v = end.min(self.len);
        let start = (start.min(end_v) + self.delta).next_multiple_of(page);
        // The view's last page ends the map: a partial last page holds no
        // neighbour's bytes, so it belongs to the range.
        let end = if end_v == self.len {
            end_v + self.delta
        } else {
            (end_v + self.delta) / page * page
        };
        (start, end.saturating_sub(start))
    }

    /// Apply `advice` to `[start, end)`, the start rounded down to a page.
    /// Advisory: the caller may ignore failure.
    pub fn advise(&self, advice: AccessAdvice, start: usize, end: usize) -> io::Result<()> {
        let (off, len) = self.page_range(start, end);
        self.advise_pages(advice, off, len)
    }

    /// Apply `advice` only to the whole pages inside `[start, end)`, so that
    /// pages shared with a neighbouring tensor keep their advice.
    pub fn advise_inward(&self, advice: AccessAdvice, start: usize, end: usize) -> io::Result<()> {
        let (off, len) = self.page_range_inward(start, end);
        self.advise_pages(advice, off, len)
    }

    fn advise_pages(&self, advice: AccessAdvice, off: usize, len: usize) -> io::Result<()> {
        let Some(map) = self.mmap() else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        let a = match advice {
            AccessAdvice::Random => Advice::Random,
            AccessAdvice::Sequential => Advice::Sequential,
            AccessAdvice::Normal => Advice::Normal,
            AccessAdvice::WillNeed => Advice::WillNeed,
        };
        map.advise_range(a, off, len)
    }

    /// Ask the kernel to read `[start, end)` in huge-page folios
    /// (`MADV_HUGEPAGE`): since Linux 5.18 a fault in such a file mapping
    /// reads two PMD-size (2 MiB) folios and reads ahead another, and a
    /// filesystem with large folios (ext4 since 6.16, XFS) keeps them whole
    /// in the page cache and maps them with one entry. Pages cost a small
    /// part of what 4 KiB ones do to read, map, drop and reclaim; reads
    /// queued with [`Mapping::will_need`] still come in 4 KiB folios.
    /// Returns whether the kernel took the advice (it is refused without
    /// transparent huge pages).
    pub fn read_in_huge_pages(&self, start: usize, end: usize) -> bool {
        let Some(map) = self.mmap() else {
            return false;
        };
        let (off, len) = self.page_range(start, end);
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if len > 0 {
            return map.advise_range(Advice::HugePage, off, len).is_ok();
        }
        let _ = (map, off, len);
        false
    }

    /// Queue reads of `[start, end)` into the page cache (`MADV_WILLNEED`)
    /// and return without waiting for them. The kernel reads a WILLNEED
    /// range whatever the range's access advice, but caps one call at the
    /// device's read-ahead size, so the range is advised in 1 MiB pieces.
    /// Advisory: failure is ignored.
    pub fn will_need(&self, start: usize, end: usize) {
        const PIECE: usize = 1 << 20;
        let Some(map) = self.mmap() else {
            return;
        };
        let (mut off, len) = self.page_range(start, end);
        let end = off + len;
        while off < end {
            let n = PIECE.min(end - off);
            let _ = map.advise_range(Advice::WillNeed, off, n);
            off += n;
        }
    }

    /// Wait until `[start, end)` is in the page cache and mapped
    /// (`MADV_POPULATE_READ`, Linux 5.14+), so that a later first touch
    /// takes no fault. Pages not yet read are read here, under the range's
    /// advice: queue them with [`Mapping::will_need`] first for large reads.
    /// Mapped bytes are never dereferenced, so a file truncated underneath
    /// gives an error (`EFAULT`), not `SIGBUS`. Where the kernel or platform
    /// lacks `MADV_POPULATE_READ`, this is `MADV_WILLNEED`.
    ///
    /// # Errors
    /// What `madvise` returns, such as `EFAULT` past a truncated end.
    pub fn populate_read(&self, start: usize, end: usize) -> io::Result<()> {
        let Some(map) = self.mmap() else {
            return Ok(());
        };
        let (off, len) = self.page_range(start, end);
        if len == 0 {
            return Ok(());
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        match map.advise_range(Advice::PopulateRead, off, len) {
            // EINVAL: a kernel older than 5.14.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            r => return r,
        }
        map.advise_range(Advice::WillNeed, off, len)
    }

    /// Drop the whole pages inside `[start, end)` from this mapping
    /// (`MADV_DONTNEED`) and then from the page cache
    /// (`POSIX_FADV_DONTNEED`, where the platform has it, which drops only
    /// clean pages no other mapping holds). Rounded inward, so a neighbour's
    /// pages stay. Reading the range again faults the same bytes back in
    /// from the file.
    ///
    /// # Errors
    /// What `madvise` returns.
    pub fn release(&self, start: usize, end: usize) -> io::Result<()> {
        let Some(map) = self.mmap() else {
            return Ok(());
        };
        let (off, len) = self.page_range_inward(start, end);
        if len == 0 {
            return Ok(());
        }
        // SAFETY: MADV_DONTNEED discards a private mapping's pages, and with
        // them any copy-on-write changes; this mapping is PROT_READ and never
        // written, so it has none, and the next access re-reads the file's
        // bytes, which the mapping's contract says do not change. The range
        // lies inside the mapping (page_range_inward clamps it).
        unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, off, len)?;
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let (Some(file), Backing::Map(_)) = (&self.file, &self.backing) {
            use std::os::fd::AsRawFd;
            // The map starts at this file offset.
            let map_start = self.map_file_offset();
            // SAFETY: posix_fadvise only reads its integer arguments; an
            // invalid descriptor or range is reported as an error code.
            let _ = unsafe {
                libc::posix_fadvise(
                    file.as_raw_fd(),
                    (map_start + off as u64) as libc::off_t,
                    len as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
        }
        Ok(())
    }

    /// How much of `[start, end)` is in the page cache (`mincore`).
    ///
    /// # Errors
    /// What `mincore` returns.
    pub fn residency(&self, start: usize, end: usize) -> io::Result<Residency> {
        let (off, len) = self.page_range(start, end);
        match self.mmap() {
            Some(map) => mincore(map.as_ptr(), off, len),
            // Memory the caller owns is resident as far as this can tell.
            None => {
                let pages = len.div_ceil(page_size()) as u64;
                Ok(Residency {
                    resident_pages: pages,
                    total_pages: pages,
                })
            }
        }
    }

    /// `mlock` the whole mapping. munmap unlocks it when the mapping drops.
    pub fn lock(&self) -> io::Result<()> {
        match self.mmap() {
            Some(m) => m.lock(),
            None => Ok(()),
        }
    }

    /// The file offset the map starts at (the page below a range's offset).
    fn map_file_offset(&self) -> u64 {
        self.map_offset
    }
}

/// `mincore` over `[off, off + len)` of the mapping that starts at `base`
/// (page-aligned; `off` a multiple of the page size).
fn mincore(base: *const u8, off: usize, len: usize) -> io::Result<Residency> {
    let page = page_size();
    let pages = len.div_ceil(page);
    if pages == 0 {
        return Ok(Residency::default());
    }
    #[cfg(unix)]
    {
        let mut vec = Vec::new();
        vec.try_reserve_exact(pages)
            .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        vec.resize(pages, 0u8);
        // SAFETY: `base + off` is page-aligned and `[base + off, + len)` lies
        // inside a live mapping (the callers clamp it); `vec` has one
        // writable byte per page of that range, as mincore requires. mincore
        // reads no mapped byte.
        let rc = unsafe {
            libc::mincore(
                base.wrapping_add(off) as *mut libc::c_void,
                len,
                vec.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let resident = vec.iter().filter(|&&b| b & 1 != 0).count();
        Ok(Residency {
            resident_pages: resident as u64,
            total_pages: pages as u64,
        })
    }
    #[cfg(not(unix))]
    {
        let _ = base;
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// Drop `path`'s clean pages from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`, which needs no privilege), after
/// writing back any dirty ones, so that the next read comes from storage:
/// how a cold start is measured. Pages that some process has mapped stay.
///
/// # Errors
/// Opening the file; `Unsupported` where the platform has no `posix_fadvise`.
pub fn evict(path: &Path) -> io::Result<()> {
    let file = File::open(path)?;
    // Dirty pages cannot be dropped; write them back first. A file opened
    // read-only can still be synced on Linux; failure only leaves pages.
    let _ = file.sync_data();
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise only reads its integer arguments; offset 0
        // with length 0 means the whole file.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// Drop `[offset, offset + len)` of `file` from the page cache
/// (`POSIX_FADV_DONTNEED`): for bytes read once and uploaded elsewhere,
/// which the host need not keep. Advisory; a no-op where the platform has no
/// `posix_fadvise`.
pub(crate) fn drop_cached(file: &File, offset: u64, len: u64) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return;
        };
        // SAFETY: posix_fadvise only reads its integer arguments; an invalid
        // descriptor or range is reported as an error code.
        let _ =
            unsafe { libc::posix_fadvise(file.as_raw_fd(), off, len, libc::POSIX_FADV_DONTNEED) };
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = (file, offset, len);
}

/// Turn off the kernel's read-ahead on `file`'s descriptor
/// (`POSIX_FADV_RANDOM`), so that reading its header caches the header's
/// pages only: for a load whose tensors are read with direct I/O. Advisory;
/// a no-op where the platform has no `posix_fadvise`.
pub fn advise_no_readahead(file: &File) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise only reads its integer arguments.
        let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = file;
}

/// How much of the file at `path` is in the page cache, measured with
/// `mincore` over a mapping whose bytes are never read (what `fincore`
/// prints).
///
/// # Errors
/// Opening or mapping the file, or `mincore`.
pub fn file_residency(path: &Path) -> io::Result<Residency> {
    match map_for_mincore(&File::open(path)?)? {
        Some(map) => mincore(map.as_ptr(), 0, map.len()),
        None => Ok(Residency::default()),
    }
}

/// A mapping of the whole of `file` for `mincore` to look at, never to be
/// read; `None` for an empty file, which cannot be mapped.
fn map_for_mincore(file: &File) -> io::Result<Option<Mmap>> {
    if file.metadata()?.len() == 0 {
        return Ok(None);
    }
    // SAFETY: the mapping's bytes are never read or handed out (the
    // callers pass it to mincore only, which looks at which pages are
    // cached), so a file changing underneath cannot affect memory this
    // code reads.
    Ok(Some(unsafe { MmapOptions::new().map(file)? }))
}

/// Which pages of this process's address space are mapped, read from
/// `/proc/self/pagemap` (one 64-bit entry per page; bit 63: present). A
/// page that the page cache holds but no fault has mapped reads as not
/// present, which is how a read-ahead tells where a first pass over a
/// mapping has got to.
#[derive(Debug)]
pub(crate) struct PageMap {
    file: File,
}

impl PageMap {
    /// Open this process's page map.
    ///
    /// # Errors
    /// Where there is no `/proc/self/pagemap` (not Linux, no procfs).
    pub(crate) fn open() -> io::Result<PageMap> {
        Ok(PageMap {
            file: File::open("/proc/self/pagemap")?,
        })
    }

    /// Whether the page holding `addr` is mapped in this process.
    ///
    /// # Errors
    /// The read of the entry.
    pub(crate) fn present(&self, addr: usize) -> io::Result<bool> {
        use std::os::unix::fs::FileExt;
        let mut entry = [0u8; 8];
        let at = (addr / page_size()) as u64 * 8;
        self.file.read_exact_at(&mut entry, at)?;
        Ok(u64::from_le_bytes(entry) >> 63 == 1)
    }
}

/// Windows [`residency_estimate_of`] samples.
const SAMPLE_WINDOWS: usize = 64;
/// Pages in each of them.
const SAMPLE_PAGES: usize = 16;

/// An estimate of how much of the open `file` is in the page cache:
/// `mincore` over 64 windows of 16 pages spread evenly from its start to
/// its end (the whole file when it is no larger than that). The returned
/// counts are of the sampled pages.
///
/// A whole-file `mincore` walks every page, a measurable part of a warm
/// stream load on a large file (BENCHMARKS.md, "Stream path"); the sample
/// costs a fixed 1,024 pages and answers "is most of it cached?" as well.
///
/// # Errors
/// Mapping the file, or `mincore`.
pub(crate) fn residency_estimate_of(file: &File) -> io::Result<Residency> {
    let Some(map) = map_for_mincore(file)? else {
        return Ok(Residency::default());
    };
    let page = page_size();
    let pages = map.len().div_ceil(page);
    if pages <= SAMPLE_WINDOWS * SAMPLE_PAGES {
        return mincore(map.as_ptr(), 0, map.len());
    }
    let mut sum = Residency::default();
    // Window i starts at page i * (pages - SAMPLE_PAGES) / (windows - 1):
    // the first at the file's start, the last ending at its last page.
    let span = pages - SAMPLE_PAGES;
    for i in 0..SAMPLE_WINDOWS {
        let first = i * span / (SAMPLE_WINDOWS - 1);
        let off = first * page;
        let n = (SAMPLE_PAGES * page).min(map.len() - off);
        let r = mincore(map.as_ptr(), off, n)?;
        sum.resident_pages += r.resident_pages;
        sum.total_pages += r.total_pages;
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn the_residency_estimate_samples_what_the_whole_count_sees() {
        let dir = tempfile::tempdir().unwrap();
        // 16 MiB: far more pages than the 64 windows of 16 sampled.
        let path = dir.path().join("big");
        std::fs::write(&path, vec![7u8; 16 << 20]).unwrap();
        std::fs::read(&path).unwrap();
        let r = residency_estimate_of(&File::open(&path).unwrap()).unwrap();
        assert_eq!(r.total_pages, 64 * 16);
        assert!(r.fraction() > 0.9, "{r:?}");
        evict(&path).unwrap();
        let r = residency_estimate_of(&File::open(&path).unwrap()).unwrap();
        assert!(r.fraction() < 0.1, "{r:?}");
        // The first MiB read, and whatever read-ahead adds: the estimate is
        // near the whole-file count, which is neither none nor all of it.
        let f = File::open(&path).unwrap();
        f.read_exact_at(&mut vec![0u8; 1 << 20], 0).unwrap();
        let whole = file_residency(&path).unwrap().fraction();
        let est = residency_estimate_of(&File::open(&path).unwrap())
            .unwrap()
            .fraction();
        assert!(whole > 0.05 && whole < 0.95, "{whole}");
        assert!(
            (est - whole).abs() < 0.1,
            "estimate {est}, whole count {whole}"
        );
        // A file of fewer pages than the sample is counted whole.
        let small = dir.path().join("small");
        std::fs::write(&small, vec![1u8; 100 * page_size()]).unwrap();
        assert_eq!(
            residency_estimate_of(&File::open(&small).unwrap()).unwrap(),
            file_residency(&small).unwrap()
        );
    }
}
