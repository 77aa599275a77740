//! The file mapping: the one place weightmap calls into `unsafe` mapping code.
//!
//! A [`Mapping`] is a read-only, private (`PROT_READ`, `MAP_PRIVATE`) map of a
//! whole file, made with memmap2's `map_copy_read_only`. The pages are the
//! page cache's: the kernel can drop them under pressure and read them again,
//! and they are charged to the process as file-backed memory (RssFile), not
//! anonymous memory.

use std::fs::File;
use std::io;

use memmap2::{Advice, Mmap, MmapOptions};

/// How the kernel should expect the tensor region to be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AccessAdvice {
    /// `MADV_RANDOM`: no read-ahead; pages fault in where they are used. The default,
    /// as in llama.cpp: a runtime touches weights layer by layer, not in file order.
    #[default]
    Random,
    /// `MADV_SEQUENTIAL`: aggressive read-ahead.
    Sequential,
    /// `MADV_NORMAL`: the kernel's default read-ahead.
    Normal,
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
    map: Mmap,
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
        Ok(Mapping { map })
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the mapping is empty (never, in practice: empty files are not mapped).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Address of the first byte.
    pub fn addr(&self) -> usize {
        self.map.as_ptr() as usize
    }

    /// Page-align `[start, end)` outward at the start (madvise needs a
    /// page-aligned address; the length may be anything), clamped to the map.
    fn page_range(&self, start: usize, end: usize) -> (usize, usize) {
        let page = page_size();
        let end = end.min(self.map.len());
        let start = (start.min(end) / page) * page;
        (start, end - start)
    }

    /// Apply `advice` to `[start, end)`. Advisory: the caller may ignore failure.
    pub fn advise(&self, advice: AccessAdvice, start: usize, end: usize) -> io::Result<()> {
        let (off, len) = self.page_range(start, end);
        if len == 0 {
            return Ok(());
        }
        let a = match advice {
            AccessAdvice::Random => Advice::Random,
            AccessAdvice::Sequential => Advice::Sequential,
            AccessAdvice::Normal => Advice::Normal,
        };
        self.map.advise_range(a, off, len)
    }

    /// Ask the kernel to read `[start, end)` ahead (`MADV_WILLNEED`).
    pub fn will_need(&self, start: usize, end: usize) -> io::Result<()> {
        let (off, len) = self.page_range(start, end);
        if len == 0 {
            return Ok(());
        }
        self.map.advise_range(Advice::WillNeed, off, len)
    }

    /// Touch one byte per page of `[start, end)` so every page is resident
    /// and mapped before the first real use (no first-touch faults later).
    pub fn populate(&self, start: usize, end: usize) -> u64 {
        let (off, len) = self.page_range(start, end);
        let page = page_size();
        let bytes = &self.map[off..off + len];
        let mut acc = 0u64;
        for i in (0..bytes.len()).step_by(page) {
            acc = acc.wrapping_add(u64::from(bytes[i]));
        }
        std::hint::black_box(acc)
    }

    /// `mlock` the whole mapping. munmap unlocks it when the mapping drops.
    pub fn lock(&self) -> io::Result<()> {
        self.map.lock()
    }
}

/// The system page size.
pub fn page_size() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions; it only reads a constant.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            return p as usize;
        }
    }
    4096
}

/// The soft `RLIMIT_MEMLOCK`, as text, for error messages.
pub fn memlock_limit() -> String {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `r` is a valid, writable rlimit for getrlimit to fill.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
        if rc == 0 {
            return if r.rlim_cur == libc::RLIM_INFINITY {
                "unlimited".into()
            } else {
                format!("{} bytes", r.rlim_cur)
            };
        }
    }
    "unknown".into()
}
