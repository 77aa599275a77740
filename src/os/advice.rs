//! What a caller says of a mapping's pages ([`AccessAdvice`]) and hears
//! back of them ([`Residency`]): the words every platform's layer speaks.

/// How the kernel should expect a range of the mapping to be read.
///
/// Advice is advisory: the kernel may ignore it, and weightmap ignores its
/// failure (as llama.cpp only warns). Windows takes none of it but
/// `WillNeed` (`PrefetchVirtualMemory`); macOS and iOS take `posix_madvise`.
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

/// How many pages of a range are in the page cache (`mincore`; on Windows,
/// in the process's working set, `QueryWorkingSetEx`).
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
