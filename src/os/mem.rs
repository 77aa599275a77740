//! What the system says of memory (the page size, huge pages, the
//! memory-lock limit), and a cache prefetch hint.

use std::io;

use super::pages::huge_page_size;
use super::sys;

pub(crate) use sys::memlock_limit;

/// The running system's page size: 4, 16 or 64 KiB (Android 15+ devices
/// and Apple silicon run 16 KiB pages, ARM servers 64 KiB), never assumed.
/// What a tensor's address and length are rounded to for an API that
/// takes whole pages, such as Metal's `newBufferWithBytesNoCopy`.
///
/// ```
/// let page = weightmap::page_size();
/// assert!(page.is_power_of_two() && page >= 4096);
/// ```
pub fn page_size() -> usize {
    sys::page_size()
}

/// The size of a transparent huge page here: one page table's reach, from
/// the page size (2 MiB with 4 KiB pages, 32 MiB with 16 KiB).
pub(crate) fn huge_page() -> usize {
    huge_page_size(sys::page_size())
}

/// How this kernel gives transparent huge pages to anonymous memory
/// (`/sys/kernel/mm/transparent_hugepage/enabled` on Linux and Android).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransparentHugePages {
    /// To all memory (`[always]`).
    Always,
    /// To memory advised `MADV_HUGEPAGE` (`[madvise]`).
    Madvise,
    /// To none (`[never]`).
    Never,
    /// None: a kernel built without them, or another platform.
    Absent,
}

impl TransparentHugePages {
    /// Whether memory advised `MADV_HUGEPAGE` (weightmap's owned buffers,
    /// by default) can be in huge pages: `Always` or `Madvise`.
    pub fn for_advised_memory(self) -> bool {
        matches!(
            self,
            TransparentHugePages::Always | TransparentHugePages::Madvise
        )
    }
}

/// How this kernel gives transparent huge pages, read once per call: the
/// one place weightmap and its tests ask.
///
/// ```
/// use weightmap::{transparent_huge_pages, TransparentHugePages};
/// let thp = transparent_huge_pages();
/// if cfg!(not(any(target_os = "linux", target_os = "android"))) {
///     assert_eq!(thp, TransparentHugePages::Absent);
/// }
/// println!("huge pages for advised memory: {}", thp.for_advised_memory());
/// ```
pub fn transparent_huge_pages() -> TransparentHugePages {
    let Some(enabled) = sys::thp_switch() else {
        return TransparentHugePages::Absent;
    };
    if enabled.contains("[always]") {
        TransparentHugePages::Always
    } else if enabled.contains("[madvise]") {
        TransparentHugePages::Madvise
    } else if enabled.contains("[never]") {
        TransparentHugePages::Never
    } else {
        TransparentHugePages::Absent
    }
}

/// Bytes of `[start, end)` (addresses) inside whole huge pages: the most
/// of it that can be mapped in huge pages.
pub(crate) fn whole_huge_pages(start: usize, end: usize) -> usize {
    let h = huge_page();
    (end / h * h).saturating_sub(start.next_multiple_of(h))
}

/// Ask that the anonymous memory `mem` be backed by huge pages
/// (`MADV_HUGEPAGE`, Linux and Android): a hint, refused without
/// transparent huge pages, and a no-op elsewhere.
pub(crate) fn advise_huge_pages(mem: &mut [u8]) {
    sys::advise_huge_pages(mem);
}

/// Ask the CPU to start loading the cache line of `value`: a hint, which
/// reads nothing and cannot fault. A no-op where weightmap has no hint for
/// the architecture.
pub(crate) fn prefetch_cache_line<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has; it only
    // hints at an address (here a valid reference) and reads nothing.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// Anonymous memory this process maps for itself (zeroed, private), viewed
/// from a start aligned as asked: the slack before it is never touched, so
/// never resident.
#[derive(Debug)]
pub(crate) struct AnonMap {
    map: memmap2::MmapMut,
    start: usize,
    len: usize,
}

impl AnonMap {
    /// `len` zeroed bytes starting at a multiple of `alignment` (a power of
    /// two), advised to be backed by huge pages when `huge_pages` (a hint:
    /// a kernel without transparent huge pages refuses it, and the memory
    /// is the same in base pages).
    pub(crate) fn new(len: usize, alignment: usize, huge_pages: bool) -> io::Result<AnonMap> {
        let slack = if alignment > page_size() {
            alignment
        } else {
            0
        };
        let total = len
            .checked_add(slack)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let mut map = memmap2::MmapOptions::new().len(total).map_anon()?;
        if huge_pages {
            advise_huge_pages(&mut map[..]);
        }
        let addr = map.as_ptr() as usize;
        let start = addr.next_multiple_of(alignment) - addr;
        Ok(AnonMap { map, start, len })
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }

    /// The bytes, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map[self.start..self.start + self.len]
    }
}
