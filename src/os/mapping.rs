//! The file mapping: a read-only map of a file, advice over its ranges,
//! residency, locking and eviction, the same on every platform.
//!
//! A [`Mapping`] is a read-only map of a file (`sys::FileMap`: Unix
//! `PROT_READ`, `MAP_PRIVATE`; Windows `PAGE_READONLY`, never
//! `PAGE_WRITECOPY`, which charges commit for the whole view). The pages are
//! the page cache's: the kernel can drop them under pressure and read them
//! again, and they are charged to the process as file-backed memory, not
//! anonymous memory. Ranges are rounded here (`pages.rs`), with the running
//! system's page size, so that each `sys` module gets page-aligned offsets.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use super::pages::{sample_starts, MapWindow, View};
use super::smaps::PageSizes;
use super::sys::{self, CacheProbe, FileMap};

pub use super::advice::{AccessAdvice, Residency};

/// Whether this platform maps files (`false`: every load streams).
pub const SUPPORTED: bool = sys::MAPS;

/// A read-only map of a whole file or of a range of it, or memory the
/// caller handed over, viewed the same way.
///
/// # Safety contract
/// Rust assumes memory behind a `&[u8]` does not change. A file-backed map
/// breaks that if the file is modified or truncated while mapped — by this
/// process or any other — and, on Unix, reading a page past a truncated end
/// raises `SIGBUS` (Windows refuses to truncate a mapped file). [`Mapping::map`]
/// is therefore `unsafe`; its caller promises the file stays unchanged while
/// the mapping (or anything borrowing it) lives.
#[derive(Debug)]
pub struct Mapping {
    backing: Backing,
    /// Where the view starts in the backing: below a granule, for a file
    /// range that starts off one (the map starts at the granule below it).
    delta: usize,
    /// Length of the view.
    len: usize,
}

/// What a [`Mapping`] views.
enum Backing {
    /// A read-only map of a file.
    Map(FileMap),
    /// Memory the caller handed over (kept alive here); nothing to advise.
    Memory(Arc<dyn AsRef<[u8]> + Send + Sync>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backing::Map(m) => f.debug_tuple("Map").field(&m.len()).finish(),
            Backing::Memory(m) => f
                .debug_tuple("Memory")
                .field(&(**m).as_ref().len())
                .finish(),
        }
    }
}

impl Mapping {
    /// Map `file` read-only.
    ///
    /// # Safety
    /// The file must not be modified or truncated, by this or any other
    /// process, while the returned mapping or any view of it is alive.
    ///
    /// # Errors
    /// What the system returns: `ENODEV` on filesystems that refuse mmap,
    /// `ENOMEM`; Windows error 1450 (no system resources) or 1455 (the
    /// paging file is too small); `Unsupported` where nothing maps.
    pub unsafe fn map(file: &File) -> io::Result<Mapping> {
        let len = file.metadata()?.len();
        // SAFETY: forwarded to the caller.
        unsafe { Mapping::map_range(file, 0, len) }
    }

    /// Map `[offset, offset + len)` of `file` read-only: the map starts at
    /// the granule below `offset` (a page; Windows' 64 KiB allocation
    /// granularity), and the view at `offset` (a model inside a larger
    /// file, such as an Android APK entry).
    ///
    /// # Safety
    /// As [`Mapping::map`], for that range of the file.
    ///
    /// # Errors
    /// As [`Mapping::map`]; `InvalidInput` for a range past `usize`.
    pub unsafe fn map_range(file: &File, offset: u64, len: u64) -> io::Result<Mapping> {
        if len == 0 {
            // No system maps zero bytes (mmap: EINVAL); say so plainly.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map zero bytes",
            ));
        }
        let w = MapWindow::of(offset, len, sys::map_granularity())?;
        // SAFETY: forwarded to the caller; `w.start` is a multiple of the
        // map granularity and `w.total` is not 0, as `FileMap::map` requires.
        let map = unsafe { FileMap::map(file, w.start, w.total)? };
        Ok(Mapping {
            backing: Backing::Map(map),
            delta: w.delta,
            len: w.total - w.delta,
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

    fn file_map(&self) -> Option<&FileMap> {
        match &self.backing {
            Backing::Map(m) => Some(m),
            Backing::Memory(_) => None,
        }
    }

    /// The viewed bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Map(m) => &m.bytes()[self.delta..self.delta + self.len],
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

    /// The view's geometry in its map, for rounding to pages.
    fn view(&self) -> View {
        View {
            delta: self.delta,
            len: self.len,
            page: sys::page_size(),
        }
    }

    /// Apply `advice` to `[start, end)`, the start rounded down to a page.
    /// Advisory: the caller may ignore failure.
    pub fn advise(&self, advice: AccessAdvice, start: usize, end: usize) -> io::Result<()> {
        let (off, len) = self.view().outward(start, end);
        match self.file_map() {
            Some(m) if len > 0 => m.advise(advice, off, len),
            _ => Ok(()),
        }
    }

    /// Apply `advice` only to the whole pages inside `[start, end)`, so that
    /// pages shared with a neighbouring tensor keep their advice.
    pub fn advise_inward(&self, advice: AccessAdvice, start: usize, end: usize) -> io::Result<()> {
        let (off, len) = self.view().inward(start, end);
        match self.file_map() {
            Some(m) if len > 0 => m.advise(advice, off, len),
            _ => Ok(()),
        }
    }

    /// Ask the kernel to read `[start, end)` in huge-page folios
    /// (`MADV_HUGEPAGE`, Linux and Android): since Linux 5.18 a fault in
    /// such a file mapping reads two PMD-size folios (2 MiB with 4 KiB
    /// pages) and reads ahead another, and a filesystem with large folios
    /// (ext4 since 6.16, XFS) keeps them whole in the page cache and maps
    /// them with one entry. Pages cost a small part of what base pages do
    /// to read, map, drop and reclaim; reads queued with
    /// [`Mapping::will_need`] still come in base pages. Returns whether the
    /// kernel took the advice (it is refused without transparent huge pages,
    /// and on every other platform).
    pub fn read_in_huge_pages(&self, start: usize, end: usize) -> bool {
        let (off, len) = self.view().outward(start, end);
        match self.file_map() {
            Some(m) if len > 0 => m.huge_pages(off, len),
            _ => false,
        }
    }

    /// Undo [`Mapping::read_in_huge_pages`] over the whole pages inside
    /// `[start, end)` (`MADV_NOHUGEPAGE`): faults there read base pages
    /// again, so that dropping a part of the range
    /// ([`Mapping::release`]) is not kept from it by a huge-page folio
    /// that also holds the rest. Advisory.
    pub fn read_in_base_pages(&self, start: usize, end: usize) {
        let (off, len) = self.view().inward(start, end);
        if let Some(m) = self.file_map() {
            if len > 0 {
                m.base_pages(off, len);
            }
        }
    }

    /// Queue reads of `[start, end)` into the page cache (`MADV_WILLNEED`;
    /// Windows `PrefetchVirtualMemory`) and return without waiting for them.
    /// Advisory: failure is ignored.
    pub fn will_need(&self, start: usize, end: usize) {
        let (off, len) = self.view().outward(start, end);
        if let Some(m) = self.file_map() {
            if len > 0 {
                m.will_need(off, len);
            }
        }
    }

    /// Wait until `[start, end)` is in the page cache and mapped, so that a
    /// later first touch takes no fault (`MADV_POPULATE_READ` on Linux 5.14+
    /// and Android; elsewhere each page is touched, or, where touching a
    /// vanished page could signal, `MADV_WILLNEED`: see each platform).
    /// Pages not yet read are read here, under the range's advice: queue
    /// them with [`Mapping::will_need`] first for large reads.
    ///
    /// # Errors
    /// What the system returns, such as `EFAULT` past a truncated end.
    pub fn populate_read(&self, start: usize, end: usize) -> io::Result<()> {
        let (off, len) = self.view().outward(start, end);
        match self.file_map() {
            Some(m) if len > 0 => m.populate_read(off, len),
            _ => Ok(()),
        }
    }

    /// Give this mapping's access advice and releases over `[start, end)`
    /// from now on to the runtime's own mapping of the same file too, which
    /// holds this view's offset 0 at address `at` (it need map only
    /// `[start, end)`): a runtime that computes on its own
    /// mapping (llama.cpp's) faults the pages in there, where releasing
    /// this mapping's alone would leave them (the kernel drops no page
    /// another mapping holds). Its pages are paged out (`MADV_PAGEOUT`),
    /// never discarded: nothing it holds is lost, whatever the range holds
    /// by then. A no-op on memory the caller owns. Returns whether this is
    /// news: not the runtime's mapping followed already.
    ///
    /// # Errors
    /// `InvalidInput` unless the process's maps show the runtime's
    /// addresses of `[start, end)` as a read-only mapping of this file at
    /// the same offsets (Linux and Android); `Unsupported` on every other
    /// platform.
    pub fn follow(&self, at: usize, start: usize, end: usize) -> io::Result<bool> {
        let Some(m) = self.file_map() else {
            return Ok(false);
        };
        let (start, end) = (start.min(self.len), end.min(self.len));
        let d = self.delta;
        m.follow(at.wrapping_sub(d), start + d, end + d)
    }

    /// Drop the whole pages inside `[start, end)` from this mapping and, where
    /// the platform allows, from the page cache (Unix: `MADV_DONTNEED`, then
    /// `POSIX_FADV_DONTNEED`; Windows: out of the working set only). Rounded
    /// inward, so a neighbour's pages stay. Reading the range again faults
    /// the same bytes back in from the file.
    ///
    /// # Errors
    /// What the system returns.
    pub fn release(&self, start: usize, end: usize) -> io::Result<()> {
        let (off, len) = self.view().inward(start, end);
        match self.file_map() {
            Some(m) if len > 0 => m.release(off, len),
            _ => Ok(()),
        }
    }

    /// How much of `[start, end)` is resident (`mincore`; Windows: in the
    /// working set, `QueryWorkingSetEx`).
    ///
    /// # Errors
    /// What the system returns.
    pub fn residency(&self, start: usize, end: usize) -> io::Result<Residency> {
        let (off, len) = self.view().outward(start, end);
        match self.file_map() {
            Some(m) => m.residency(off, len),
            // Memory the caller owns is resident as far as this can tell.
            None => {
                let pages = len.div_ceil(sys::page_size()) as u64;
                Ok(Residency {
                    resident_pages: pages,
                    total_pages: pages,
                })
            }
        }
    }

    /// What this process has mapped of `[start, end)`, and how much of
    /// it in huge pages, with the most that could be
    /// (`/proc/self/smaps`).
    ///
    /// # Errors
    /// Reading smaps; `Unsupported` where there is none.
    pub(crate) fn page_sizes(&self, start: usize, end: usize) -> io::Result<(PageSizes, usize)> {
        let (s, e) = (self.addr() + start, self.addr() + end);
        let sizes = super::smaps::page_sizes(&[(s, e)])?;
        Ok((sizes[0], super::mem::whole_huge_pages(s, e)))
    }

    /// Lock the whole mapping in memory (`mlock`; Windows `VirtualLock`,
    /// the working set raised and the lock retried once). Unlocked when the
    /// mapping drops.
    pub fn lock(&self) -> io::Result<()> {
        match self.file_map() {
            Some(m) => m.lock(),
            None => Ok(()),
        }
    }
}

/// Drop `path`'s clean pages from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`, which needs no privilege), after
/// writing back any dirty ones, so that the next read comes from storage:
/// how a cold start is measured. Pages that some process has mapped stay.
///
/// # Errors
/// Opening the file; `Unsupported` where the platform cannot drop a file's
/// pages (macOS, iOS, Windows).
pub fn evict(path: &Path) -> io::Result<()> {
    let file = File::open(path)?;
    // Dirty pages cannot be dropped; write them back first. A file opened
    // read-only can still be synced on Linux; failure only leaves pages.
    let _ = file.sync_data();
    sys::evict(&file)
}

/// How much of the file at `path` is in the page cache, without reading it
/// (what `fincore` prints).
///
/// # Errors
/// Opening the file, or the residency query; `Unsupported` where the
/// platform cannot tell (Windows: its working-set query sees only this
/// process's mapped pages, not the cache).
pub fn file_residency(path: &Path) -> io::Result<Residency> {
    let file = File::open(path)?;
    match CacheProbe::open(&file)? {
        Some(p) => p.residency(0, p.len()),
        None => Ok(Residency::default()),
    }
}

/// Windows [`residency_estimate_of`] samples.
const SAMPLE_WINDOWS: usize = 64;
/// Pages in each of them.
const SAMPLE_PAGES: usize = 16;

/// An estimate of how much of the open `file` is in the page cache: the
/// residency of 64 windows of 16 pages spread evenly from its start to its
/// end (the whole file when it is no larger than that). The returned counts
/// are of the sampled pages.
///
/// A whole-file `mincore` walks every page, a measurable part of a warm
/// stream load on a large file (BENCHMARKS.md, "Stream path"); the sample
/// costs a fixed 1,024 pages and answers "is most of it cached?" as well.
///
/// # Errors
/// As [`file_residency`].
pub(crate) fn residency_estimate_of(file: &File) -> io::Result<Residency> {
    let Some(probe) = CacheProbe::open(file)? else {
        return Ok(Residency::default());
    };
    let page = sys::page_size();
    let len = probe.len();
    let Some(starts) = sample_starts(len.div_ceil(page), SAMPLE_WINDOWS, SAMPLE_PAGES) else {
        return probe.residency(0, len);
    };
    let mut sum = Residency::default();
    for first in starts {
        let off = first * page;
        let r = probe.residency(off, (SAMPLE_PAGES * page).min(len - off))?;
        sum.resident_pages += r.resident_pages;
        sum.total_pages += r.total_pages;
    }
    Ok(sum)
}

/// Drop `[offset, offset + len)` of `file` from the page cache: for bytes
/// read once and uploaded elsewhere, which the host need not keep.
/// Advisory; a no-op where the platform cannot.
pub(crate) fn drop_cached(file: &File, offset: u64, len: u64) {
    sys::drop_cached(file, offset, len);
}

/// Turn off the kernel's read-ahead on `file`'s descriptor, so that reading
/// its header caches the header's pages only: for a load whose tensors are
/// read with direct I/O. Advisory; a no-op where the platform has no such
/// advice.
pub fn advise_no_readahead(file: &File) {
    sys::advise_no_readahead(file);
}

/// Which pages of this process's address space are mapped (Linux and
/// Android: `/proc/self/pagemap`). A page that the page cache holds but no
/// fault has mapped reads as not present, which is how a read-ahead tells
/// where a first pass over a mapping has got to.
pub(crate) use sys::PageMap;

/// How many of the whole pages inside `mem`, memory of this process, are
/// resident: for tests of what the allocator and prefaulting do.
///
/// # Errors
/// What the system returns; `Unsupported` where it cannot tell.
#[cfg(test)]
pub(crate) fn memory_residency(mem: &[u8]) -> io::Result<Residency> {
    match super::pages::whole_pages(mem.as_ptr() as usize, mem.len(), sys::page_size()) {
        Some((start, end)) => sys::residency(start, end - start),
        None => Ok(Residency::default()),
    }
}

/// Whether this system does what page advice asks, measured: a released
/// range of a mapped file must stop being resident. qemu-user takes advice
/// and does nothing (ARCHITECTURE.md, "What is tested where"),
/// and wine keeps pages a Windows release would take out of the working
/// set; tests that measure the page cache skip those assertions there, and
/// say so, while every byte-level assertion still runs.
///
/// # Errors
/// Why the probe could not run (no mapping here, no temporary file).
#[cfg(test)]
pub(crate) fn advice_is_honoured() -> Result<bool, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("probe");
    let page = sys::page_size();
    std::fs::write(&path, vec![1u8; 16 * page]).map_err(|e| e.to_string())?;
    let file = File::open(&path).map_err(|e| e.to_string())?;
    // SAFETY: the probe's own temporary file, not changed while mapped.
    let map = unsafe { Mapping::map(&file) }.map_err(|e| e.to_string())?;
    map.populate_read(0, map.len()).map_err(|e| e.to_string())?;
    let before = map.residency(0, map.len()).map_err(|e| e.to_string())?;
    map.release(0, map.len()).map_err(|e| e.to_string())?;
    let after = map.residency(0, map.len()).map_err(|e| e.to_string())?;
    Ok(before.resident_pages > 0 && after.resident_pages == 0)
}

/// [`advice_is_honoured`], or a printed reason to skip and `false`.
#[cfg(test)]
pub(crate) fn page_advice_is_observable(test: &str) -> bool {
    match advice_is_honoured() {
        Ok(true) => true,
        Ok(false) => {
            println!("{test}: page-cache assertions skipped: this system ignores page advice (released pages stay resident)");
            false
        }
        Err(why) => {
            println!("{test}: page-cache assertions skipped: {why}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::io::read_at;
    use super::*;

    #[test]
    fn the_residency_estimate_samples_what_the_whole_count_sees() {
        let dir = tempfile::tempdir().unwrap();
        // 16 MiB: far more pages than the 64 windows of 16 sampled.
        let path = dir.path().join("big");
        std::fs::write(&path, vec![7u8; 16 << 20]).unwrap();
        std::fs::read(&path).unwrap();
        let whole = match file_residency(&path) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                println!("skipped: this platform cannot tell a file's residency: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        assert!(whole.fraction() > 0.9, "{whole:?}");
        let r = residency_estimate_of(&File::open(&path).unwrap()).unwrap();
        assert_eq!(r.total_pages, 64 * 16);
        assert!(r.fraction() > 0.9, "{r:?}");
        match evict(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                println!("skipped the evicted half: this platform cannot evict: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        }
        let r = residency_estimate_of(&File::open(&path).unwrap()).unwrap();
        assert!(r.fraction() < 0.1, "{r:?}");
        // The first MiB read, and whatever read-ahead adds: the estimate is
        // near the whole-file count, which is neither none nor all of it.
        read_at(&File::open(&path).unwrap(), &mut vec![0u8; 1 << 20], 0).unwrap();
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
        std::fs::write(&small, vec![1u8; 100 * sys::page_size()]).unwrap();
        assert_eq!(
            residency_estimate_of(&File::open(&small).unwrap()).unwrap(),
            file_residency(&small).unwrap()
        );
    }

    #[test]
    fn a_range_maps_from_the_granule_below_and_views_its_bytes() {
        if !SUPPORTED {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // Past Windows' 64 KiB granularity, so the range starts off it.
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let f = File::open(&path).unwrap();
        for (off, len) in [(0, 10), (70_001, 123_457), (131_072, 5), (299_999, 1)] {
            // SAFETY: the temporary file is not changed while mapped.
            let m = unsafe { Mapping::map_range(&f, off, len) }.unwrap();
            let o = off as usize;
            assert_eq!(m.bytes(), &bytes[o..o + len as usize], "{off}+{len}");
            m.advise(AccessAdvice::WillNeed, 0, m.len()).ok();
            m.populate_read(0, m.len()).unwrap();
            m.release(0, m.len()).unwrap();
            assert_eq!(m.bytes(), &bytes[o..o + len as usize], "after release");
        }
        // SAFETY: as above.
        let whole = unsafe { Mapping::map(&f) }.unwrap();
        assert_eq!(whole.bytes(), &bytes[..]);
    }
}
