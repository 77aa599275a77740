//! Unix: Linux, Android, macOS, iOS and the BSDs.
//!
//! Files are mapped with memmap2 (`PROT_READ`, `MAP_PRIVATE`); advice,
//! residency and the page cache go through libc directly, because memmap2
//! gates its Linux advice (`HugePage`, `PopulateRead`) by
//! `target_os = "linux"`, and Android's kernel, a Linux kernel, takes them
//! too. What differs inside the family is marked where it is handled:
//!
//! - Linux and Android: `MADV_HUGEPAGE`, `MADV_POPULATE_READ`/`WRITE`
//!   (5.14+), `posix_fadvise`, `O_DIRECT`, `/proc/self/pagemap`, and the
//!   budget from `/proc` and the memory cgroups (Android runs apps in
//!   memory cgroups too, v2 on current releases).
//! - macOS and iOS: no `MADV_SEQUENTIAL` (it about doubled load time on
//!   macOS, llama.cpp PR #740: taken as `MADV_NORMAL`), `F_RDADVISE` beside
//!   `MADV_WILLNEED` to start reads (as ExecuTorch does, #19554), no way to
//!   drop a file's cached pages, and the budget from the host's VM
//!   statistics (macOS) or `os_proc_available_memory` (iOS).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use memmap2::{Mmap, MmapOptions};

use super::advice::{AccessAdvice, Residency};
use super::budget::BudgetReading;

/// Files map here.
pub(crate) const MAPS: bool = true;

#[cfg(test)]
pub(crate) const REFUSED_MAP_ERROR: i32 = libc::ENODEV;

/// Whether [`open_direct`] can bypass the page cache here.
pub(crate) const DIRECT_IO: bool = cfg!(any(target_os = "linux", target_os = "android"));

pub(crate) fn page_size() -> usize {
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    match PAGE.load(Ordering::Relaxed) {
        0 => {
            // SAFETY: sysconf has no preconditions; it only reads a constant.
            let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            // POSIX guarantees a page size; 4 KiB only if it fails to say.
            let p = usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096);
            PAGE.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// A map must start at a multiple of the page size.
pub(crate) fn map_granularity() -> usize {
    page_size()
}

/// The soft `RLIMIT_MEMLOCK`, as text, for error messages.
pub(crate) fn memlock_limit() -> String {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid, writable rlimit for getrlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return "unknown".into();
    }
    if r.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("{} bytes", r.rlim_cur)
    }
}

/// `madvise` over `[addr, addr + len)`.
///
/// # Safety
/// The range is page-aligned, and `advice` is one that cannot change the
/// contents the process sees there (or the caller says why the change is
/// harmless there). A range that is not mapped only fails (`ENOMEM`).
unsafe fn madvise(addr: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: forwarded to the caller.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Fault in, writable, the page-aligned `[addr, addr + len)`
/// (`MADV_POPULATE_WRITE`, Linux 5.14+); a no-op elsewhere, failure ignored.
///
/// # Safety
/// The range is whole pages of memory the caller borrows uniquely.
pub(crate) unsafe fn populate_write(addr: usize, len: usize) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    // SAFETY: the caller's range is whole pages it borrows uniquely.
    // MADV_POPULATE_WRITE only maps the pages writable: it never reads or
    // changes their contents (uninitialised memory stays unread), unmaps
    // nothing, and fails (with an error we ignore) rather than signalling.
    let _ = unsafe { madvise(addr, len, libc::MADV_POPULATE_WRITE) };
    let _ = (addr, len);
}

/// `MADV_HUGEPAGE` on the whole pages of the anonymous memory `mem`
/// (Linux, Android); a hint, refused without transparent huge pages.
pub(crate) fn advise_huge_pages(mem: &mut [u8]) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some((start, end)) =
        super::pages::whole_pages(mem.as_mut_ptr() as usize, mem.len(), page_size())
    {
        // SAFETY: whole pages of memory borrowed uniquely; MADV_HUGEPAGE
        // only changes how the range is backed, never its contents.
        let _ = unsafe { madvise(start, end - start, libc::MADV_HUGEPAGE) };
    }
    let _ = mem;
}

/// The kernel's switch for transparent huge pages, as it reads
/// (`always [madvise] never`): Linux and Android; `None` elsewhere in the
/// family, or where the kernel has none.
pub(crate) fn thp_switch() -> Option<String> {
    if !cfg!(any(target_os = "linux", target_os = "android")) {
        return None;
    }
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()
}

/// The text of `/proc/self/smaps` (Linux and Android): what each mapping
/// of this process holds, and in which page sizes. `Unsupported` elsewhere
/// in the family (macOS and iOS map no file in huge pages).
pub(crate) fn read_smaps() -> io::Result<String> {
    if !cfg!(any(target_os = "linux", target_os = "android")) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no huge pages for mapped files on this platform",
        ));
    }
    std::fs::read_to_string("/proc/self/smaps")
}

/// A read-only private map of `[start, start + len)` of a file, and the file.
pub(crate) struct FileMap {
    map: Mmap,
    /// The mapped file, for page-cache advice on its ranges.
    file: File,
    /// The file offset the map starts at.
    start: u64,
    /// The runtime's own map of the same file, once [`FileMap::follow`]
    /// has checked it: the access advice given this map is given there too,
    /// and a release pages the range out there.
    runtime: std::sync::Mutex<Option<RuntimeMap>>,
}

/// Where a runtime's own map of a [`FileMap`]'s file holds which of its
/// bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RuntimeMap {
    /// The runtime's address of the map's offset 0 (which it need not map).
    at: usize,
    /// The map's offsets it was checked to map, page-aligned.
    from: usize,
    to: usize,
}

impl FileMap {
    /// Map `[start, start + len)` of `file`, `PROT_READ`, `MAP_PRIVATE`.
    ///
    /// # Safety
    /// The file must not be modified or truncated while the map lives;
    /// `start` is a multiple of [`map_granularity`] and `len` is not 0.
    pub(crate) unsafe fn map(file: &File, start: u64, len: usize) -> io::Result<FileMap> {
        // SAFETY: forwarded to the caller: the file stays unchanged while
        // the map lives. PROT_READ + MAP_PRIVATE means nothing in this
        // process can write through the map.
        let map = unsafe {
            MmapOptions::new()
                .offset(start)
                .len(len)
                .map_copy_read_only(file)?
        };
        Ok(FileMap {
            map,
            file: file.try_clone()?,
            start,
            runtime: std::sync::Mutex::new(None),
        })
    }

    /// Give this map's advice and releases over `[from, to)` from now on
    /// to the runtime's own map of the same file too, whose address for
    /// this map's offset 0 is `at` (Linux and Android). A runtime that
    /// computes on its own map (llama.cpp's) faults its pages in there, and
    /// the kernel drops no page another map holds: releasing this map's
    /// pages alone would leave them in memory.
    ///
    /// Returns whether this is news: not the runtime map followed already.
    ///
    /// # Errors
    /// `InvalidInput` unless `/proc/self/maps` shows the runtime's
    /// addresses of `[from, to)` as a map of this file, without a gap,
    /// read-only, at the same offsets; `Unsupported` on every other
    /// platform.
    pub(crate) fn follow(&self, at: usize, from: usize, to: usize) -> io::Result<bool> {
        let page = page_size();
        let (from, to) = (from / page * page, to.min(self.len()).div_ceil(page) * page);
        let asked = RuntimeMap { at, from, to };
        let mut runtime = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        if *runtime == Some(asked) {
            return Ok(false);
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let maps = std::fs::read_to_string("/proc/self/maps")?;
            let meta = self.file.metadata()?;
            let dev = meta.dev() as libc::dev_t;
            let file = (libc::major(dev) as u32, libc::minor(dev) as u32, meta.ino());
            let first = at.wrapping_add(from);
            if to <= from || !maps_file(&maps, first, to - from, file, self.start + from as u64) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{first:#x} is not a read-only map of this file at the same offsets"),
                ));
            }
            *runtime = Some(asked);
            Ok(true)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no /proc/self/maps on this platform",
        ))
    }

    /// The runtime's addresses of `[off, off + len)`, as far as it was
    /// checked to map them, if it is followed: the start and the length.
    fn runtime_range(&self, off: usize, len: usize) -> Option<(usize, usize)> {
        let runtime = *self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        let r = runtime?;
        let (start, end) = (off.max(r.from), (off + len).min(r.to));
        (start < end).then(|| (r.at.wrapping_add(start), end - start))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The address of map offset `off` (page-aligned, inside the map).
    fn at(&self, off: usize) -> usize {
        self.map.as_ptr() as usize + off
    }

    /// `advice` over `[off, off + len)`; `off` is page-aligned and the range
    /// inside the map (the callers round and clamp it).
    pub(crate) fn advise(&self, advice: AccessAdvice, off: usize, len: usize) -> io::Result<()> {
        let a = match advice {
            AccessAdvice::Normal => libc::MADV_NORMAL,
            AccessAdvice::Random => libc::MADV_RANDOM,
            // llama.cpp PR #740: about twice the load time on macOS.
            AccessAdvice::Sequential if cfg!(target_vendor = "apple") => libc::MADV_NORMAL,
            AccessAdvice::Sequential => libc::MADV_SEQUENTIAL,
            AccessAdvice::WillNeed => {
                self.will_need(off, len);
                return Ok(());
            }
        };
        if let Some((theirs, n)) = self.runtime_range(off, len) {
            // SAFETY: NORMAL, RANDOM and SEQUENTIAL only change read-ahead,
            // never what memory holds, whatever the range now is (the
            // runtime may have unmapped it since `follow`): at worst a hint
            // lands elsewhere, or the call fails. The range is page-aligned:
            // `follow` checked that the runtime maps the file at the same
            // offsets. Advisory.
            let _ = unsafe { madvise(theirs, n, a) };
        }
        // SAFETY: the range is page-aligned and inside this live map;
        // NORMAL, RANDOM and SEQUENTIAL only change read-ahead.
        unsafe { madvise(self.at(off), len, a) }
    }

    /// `MADV_HUGEPAGE` over the range, and over the runtime's map of it
    /// where one is followed: whether the kernel took it for this map (only
    /// Linux's kernel has it).
    pub(crate) fn huge_pages(&self, off: usize, len: usize) -> bool {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            if let Some((theirs, n)) = self.runtime_range(off, len) {
                // SAFETY: as in `base_pages`: MADV_HUGEPAGE too changes how
                // pages are read and mapped, not what they hold.
                let _ = unsafe { madvise(theirs, n, libc::MADV_HUGEPAGE) };
            }
            // SAFETY: the range is page-aligned and inside this live map;
            // MADV_HUGEPAGE changes how pages are read and mapped, not what
            // they hold.
            unsafe { madvise(self.at(off), len, libc::MADV_HUGEPAGE) }.is_ok()
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = (off, len);
            false
        }
    }

    /// `MADV_NOHUGEPAGE` over the range (Linux and Android; elsewhere
    /// nothing): its faults read base pages again. Advisory.
    pub(crate) fn base_pages(&self, off: usize, len: usize) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            if let Some((theirs, n)) = self.runtime_range(off, len) {
                // SAFETY: MADV_NOHUGEPAGE changes how pages are read and
                // mapped, not what they hold, whatever the range now is;
                // page-aligned, as in `advise`. Advisory.
                let _ = unsafe { madvise(theirs, n, libc::MADV_NOHUGEPAGE) };
            }
            // SAFETY: the range is page-aligned and inside this live map;
            // MADV_NOHUGEPAGE changes how pages are read and mapped, not
            // what they hold.
            let _ = unsafe { madvise(self.at(off), len, libc::MADV_NOHUGEPAGE) };
        }
        let _ = (off, len);
    }

    /// Queue reads of the range (`MADV_WILLNEED`; Apple: `F_RDADVISE` too).
    /// Linux caps one call at the device's read-ahead size, so the range is
    /// advised in 1 MiB pieces.
    pub(crate) fn will_need(&self, off: usize, len: usize) {
        const PIECE: usize = 1 << 20;
        let end = off + len;
        let mut at = off;
        while at < end {
            let n = PIECE.min(end - at);
            // SAFETY: a page-aligned piece inside this live map; WILLNEED
            // only starts reads.
            let _ = unsafe { madvise(self.at(at), n, libc::MADV_WILLNEED) };
            #[cfg(target_vendor = "apple")]
            self.read_advise(at, n);
            at += n;
        }
    }

    /// `fcntl(F_RDADVISE)`: ask the kernel to read the file range ahead.
    #[cfg(target_vendor = "apple")]
    fn read_advise(&self, off: usize, len: usize) {
        let (Ok(ra_offset), Ok(ra_count)) = (
            libc::off_t::try_from(self.start + off as u64),
            libc::c_int::try_from(len),
        ) else {
            return;
        };
        let ra = libc::radvisory {
            ra_offset,
            ra_count,
        };
        // SAFETY: F_RDADVISE reads the radvisory struct, a live local; the
        // descriptor is open for as long as `self.file` lives.
        let _ = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_RDADVISE, &ra) };
    }

    /// Wait until the range is cached and mapped (`MADV_POPULATE_READ`,
    /// Linux 5.14+). Mapped bytes are never dereferenced, so a file
    /// truncated underneath gives an error (`EFAULT`), not `SIGBUS`. Where
    /// the kernel lacks it, `MADV_WILLNEED`.
    pub(crate) fn populate_read(&self, off: usize, len: usize) -> io::Result<()> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        // SAFETY: the range is page-aligned and inside this live map;
        // POPULATE_READ maps pages as a read fault would, changing nothing.
        match unsafe { madvise(self.at(off), len, libc::MADV_POPULATE_READ) } {
            // EINVAL: a kernel older than 5.14.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            r => return r,
        }
        // SAFETY: as in `will_need`.
        unsafe { madvise(self.at(off), len, libc::MADV_WILLNEED) }
    }

    /// Drop the range from this map (`MADV_DONTNEED`), page it out of the
    /// runtime's map where one is followed (`MADV_PAGEOUT`), and drop it
    /// from the page cache (`POSIX_FADV_DONTNEED`, Linux, which drops only
    /// clean pages no other mapping holds).
    pub(crate) fn release(&self, off: usize, len: usize) -> io::Result<()> {
        // SAFETY: MADV_DONTNEED discards a private mapping's pages, and with
        // them any copy-on-write changes; this map is PROT_READ and never
        // written, so it has none, and the next access re-reads the file's
        // bytes, which the map's contract says do not change. The range is
        // page-aligned and inside the map.
        unsafe { madvise(self.at(off), len, libc::MADV_DONTNEED)? };
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Some((theirs, n)) = self.runtime_range(off, len) {
            // Not MADV_DONTNEED: the runtime's range is not this value's,
            // and may have been unmapped and reused since `follow`.
            // SAFETY: PAGEOUT reclaims pages as memory pressure would,
            // writing back what it must and keeping every byte (Linux 5.4+;
            // a file's pages only for a process that owns the file or may
            // write it); COLD only moves them to the front of reclaim.
            // Neither changes what any address reads. Advisory.
            if unsafe { madvise(theirs, n, libc::MADV_PAGEOUT) }.is_err() {
                // SAFETY: as above.
                let _ = unsafe { madvise(theirs, n, libc::MADV_COLD) };
            }
        }
        drop_cached(&self.file, self.start + off as u64, len as u64);
        Ok(())
    }

    /// `mincore` over the range.
    pub(crate) fn residency(&self, off: usize, len: usize) -> io::Result<Residency> {
        residency(self.at(off), len)
    }

    /// `mlock` the whole map; munmap unlocks it.
    pub(crate) fn lock(&self) -> io::Result<()> {
        self.map.lock()
    }
}

/// `mincore` over the page-aligned `[addr, addr + len)` of a live mapping.
pub(crate) fn residency(addr: usize, len: usize) -> io::Result<Residency> {
    let pages = len.div_ceil(page_size());
    if pages == 0 {
        return Ok(Residency::default());
    }
    let mut vec = Vec::new();
    vec.try_reserve_exact(pages)
        .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
    vec.resize(pages, 0u8);
    // SAFETY: `addr` is page-aligned and `[addr, addr + len)` lies inside a
    // live mapping (the callers clamp it); `vec` has one writable byte per
    // page of that range, as mincore requires. mincore reads no mapped byte.
    let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr().cast()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let resident = vec.iter().filter(|&&b| b & 1 != 0).count();
    Ok(Residency {
        resident_pages: resident as u64,
        total_pages: pages as u64,
    })
}

/// A map of a whole file that is never read, for asking which of its pages
/// are cached (what `fincore` does).
pub(crate) struct CacheProbe {
    map: Mmap,
}

impl CacheProbe {
    /// `None` for an empty file, which cannot be mapped.
    pub(crate) fn open(file: &File) -> io::Result<Option<CacheProbe>> {
        if file.metadata()?.len() == 0 {
            return Ok(None);
        }
        // SAFETY: the map's bytes are never read or handed out (only
        // mincore looks at it, which reads which pages are cached), so a
        // file changing underneath cannot affect memory this code reads.
        let map = unsafe { MmapOptions::new().map(file)? };
        Ok(Some(CacheProbe { map }))
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The cached pages of `[off, off + len)`, `off` page-aligned.
    pub(crate) fn residency(&self, off: usize, len: usize) -> io::Result<Residency> {
        let len = len.min(self.map.len().saturating_sub(off));
        residency(self.map.as_ptr() as usize + off, len)
    }
}

/// This process's `/proc/self/pagemap` (Linux, Android): one 64-bit entry
/// per page, bit 63 set when the page is mapped.
#[derive(Debug)]
pub(crate) struct PageMap {
    file: File,
}

impl PageMap {
    /// # Errors
    /// Where there is no `/proc/self/pagemap` (not Linux's kernel, no procfs).
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
        let mut entry = [0u8; 8];
        let at = (addr / page_size()) as u64 * 8;
        self.file.read_exact_at(&mut entry, at)?;
        Ok(u64::from_le_bytes(entry) >> 63 == 1)
    }
}

/// `posix_fadvise` over `[offset, offset + len)` (0, 0: the whole file).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
    // On 32-bit Android `off_t` is 32 bits: a range past it is not advised.
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: posix_fadvise only reads its integer arguments; an invalid
    // descriptor or range is reported as an error code.
    match unsafe { libc::posix_fadvise(file.as_raw_fd(), off, len, advice) } {
        0 => Ok(()),
        rc => Err(io::Error::from_raw_os_error(rc)),
    }
}

/// Drop the file's clean, unmapped pages from the page cache.
pub(crate) fn evict(file: &File) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    return fadvise(file, 0, 0, libc::POSIX_FADV_DONTNEED);
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = file;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this system has no posix_fadvise(POSIX_FADV_DONTNEED)",
        ))
    }
}

/// Drop a range of the file from the page cache; advisory.
pub(crate) fn drop_cached(file: &File, offset: u64, len: u64) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = fadvise(file, offset, len, libc::POSIX_FADV_DONTNEED);
    let _ = (file, offset, len);
}

/// `POSIX_FADV_RANDOM` on the descriptor: no read-ahead; advisory.
pub(crate) fn advise_no_readahead(file: &File) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = fadvise(file, 0, 0, libc::POSIX_FADV_RANDOM);
    let _ = file;
}

/// `pread`: some bytes at `offset`, the file position untouched.
pub(crate) fn read_some_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    file.read_at(buf, offset)
}

/// A reading thread's own handle on `file`, or `None` to share it: `pread`
/// keeps no shared position and the kernel does not serialise it.
pub(crate) fn reopen_for_reader(_file: &File, _direct: bool) -> io::Result<Option<File>> {
    Ok(None)
}

/// Open `path` for direct reads (`O_DIRECT`: the page cache is bypassed, so
/// a cold load reads at the device's rate and leaves no cache behind).
/// Offsets, lengths and buffer addresses must be multiples of the logical
/// block size.
pub(crate) fn open_direct(path: &Path) -> io::Result<File> {
    open_with_o_direct(std::fs::OpenOptions::new().read(true), path)
}

/// `options` with `O_DIRECT` (Linux and Android), `Unsupported` elsewhere.
fn open_with_o_direct(options: &mut std::fs::OpenOptions, path: &Path) -> io::Result<File> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_DIRECT).open(path)
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = (options, path);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "O_DIRECT is Linux-only",
        ))
    }
}

/// Whether `e` is a file system's refusal of direct I/O (`EINVAL`, from the
/// open or from the first read: an SD card on Android, tmpfs), after which
/// buffered reads serve instead.
pub(crate) fn refuses_direct_io(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// Whether `path` still names the open `file` (device and inode).
pub(crate) fn same_file(file: &File, path: &Path) -> io::Result<bool> {
    let (open, now) = (file.metadata()?, std::fs::metadata(path)?);
    Ok(now.dev() == open.dev() && now.ino() == open.ino())
}

/// The device and inode of an open file: with its size, modification and
/// change times, what tells one file from another (a cache key's source
/// identity).
pub(crate) fn file_identity(file: &File) -> io::Result<(u64, u64)> {
    let m = file.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// The open file's status change time (`st_ctime`) in nanoseconds: any
/// write, truncation, chmod or rename sets it to now, and no unprivileged
/// call can set it back (`utimensat` sets only the access and modification
/// times), so a rewrite whose mtime was restored still shows here.
pub(crate) fn change_time_ns(file: &File) -> io::Result<u64> {
    let m = file.metadata()?;
    let ns = i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec());
    Ok(u64::try_from(ns).unwrap_or(0))
}

/// This process's effective user id.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// `name` as a C string naming one entry of a directory: no `/`, no NUL,
/// not `.` or `..`.
fn entry_name(name: &OsStr) -> io::Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file name in the directory",
        ));
    }
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
}

/// `-1` as an error, anything else as itself.
fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `fstat` of a descriptor.
fn fstat_fd(fd: libc::c_int) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value, written over by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live descriptor and a live, writable struct.
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

/// The mode of `st` as a `u32`: `st_mode` is a `u16` on Apple's systems,
/// a `u32` elsewhere (and wider than `mode_t` on 32-bit Android).
#[allow(clippy::useless_conversion)]
fn mode_of(st: &libc::stat) -> u32 {
    u32::from(st.st_mode)
}

/// Whether the mode `m` is a regular file's.
#[allow(clippy::useless_conversion)]
fn is_regular(m: u32) -> bool {
    m & u32::from(libc::S_IFMT) == u32::from(libc::S_IFREG)
}

/// Clear `O_NONBLOCK` on `fd`, which was opened with it only so that the
/// open itself could not wait on a FIFO or a device.
fn clear_nonblock(fd: libc::c_int) -> io::Result<()> {
    // SAFETY: a live descriptor; F_GETFL and F_SETFL touch no memory.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) })?;
    Ok(())
}

/// The error a file that is not a regular file (a FIFO, a device, a
/// socket, a directory) gives where one was wanted.
fn not_regular() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")
}

/// Open `path` for reading only if it is a regular file, without ever
/// waiting: a FIFO's open would block until a writer came, a device's could
/// have effects. `InvalidInput` ("not a regular file") for anything else.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !is_regular(mode_of(&fstat_fd(file.as_raw_fd())?)) {
        return Err(not_regular());
    }
    clear_nonblock(file.as_raw_fd())?;
    Ok(file)
}

/// What walking a path found: its real path as far as it exists (every
/// symbolic link resolved), the names below that which do not exist yet,
/// and the trail: `/` and every directory, link and file the walk met, in
/// order.
pub(crate) struct Walked {
    pub real: std::path::PathBuf,
    pub missing: Vec<std::ffi::OsString>,
    pub trail: Vec<std::fs::Metadata>,
}

/// Walk `path` from `/` as the kernel resolves it, link by link, handing
/// each existing step to `check` (the directory it is in, that directory's
/// metadata, the step's path and its own, unfollowed), which may refuse it
/// with a reason. A step that does not exist ends the walk: it and the
/// names after it are `missing`, and a `..` among them is refused, since
/// what it leads to cannot be known before the step exists.
fn walk(
    path: &Path,
    mut check: impl FnMut(&Path, &std::fs::Metadata, &Path, &std::fs::Metadata) -> Option<String>,
) -> io::Result<Result<Walked, String>> {
    use std::collections::VecDeque;
    use std::path::{Component, PathBuf};
    let mut left: VecDeque<std::ffi::OsString> = VecDeque::new();
    let push_front = |left: &mut VecDeque<std::ffi::OsString>, p: &Path| {
        for c in p.components().rev() {
            if let Component::Normal(n) = c {
                left.push_front(n.to_owned());
            } else if c == Component::ParentDir {
                left.push_front("..".into());
            }
        }
    };
    let absolute = std::path::absolute(path)?;
    push_front(&mut left, &absolute);
    let mut real = PathBuf::from("/");
    let mut trail = vec![std::fs::metadata(&real)?];
    let mut links = 0;
    while let Some(name) = left.pop_front() {
        if name == ".." {
            real.pop();
            continue;
        }
        let parent = std::fs::metadata(&real)?;
        let next = real.join(&name);
        let meta = match std::fs::symlink_metadata(&next) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let missing: Vec<_> = std::iter::once(name).chain(left).collect();
                if missing.iter().any(|n| n == "..") {
                    return Ok(Err(format!(
                        "{} goes up (..) from {}, which does not exist",
                        path.display(),
                        next.display()
                    )));
                }
                return Ok(Ok(Walked {
                    real,
                    missing,
                    trail,
                }));
            }
            Err(e) => return Err(e),
        };
        if let Some(why) = check(&real, &parent, &next, &meta) {
            return Ok(Err(why));
        }
        trail.push(meta.clone());
        if meta.file_type().is_symlink() {
            links += 1;
            if links > 40 {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            let target = std::fs::read_link(&next)?;
            if target.is_absolute() {
                real = PathBuf::from("/");
            }
            push_front(&mut left, &target);
        } else {
            real = next;
        }
    }
    Ok(Ok(Walked {
        real,
        missing: Vec::new(),
        trail,
    }))
}

/// The trail of `path` ([`Walked`]): what it leads through to its file, for
/// telling later whether it led anywhere else meanwhile; and whether
/// another user could change what it leads to (a step that
/// [`path_problem`] would refuse). `NotFound` when it leads to nothing.
pub(crate) fn path_trail(path: &Path) -> io::Result<(Vec<std::fs::Metadata>, bool)> {
    let mut open_to_others = false;
    let walked = walk(path, |dir, parent, next, meta| {
        open_to_others |= parent_problem(dir, parent, next, Some(meta.uid())).is_some();
        None
    })?;
    match walked {
        Ok(w) if w.missing.is_empty() => Ok((w.trail, open_to_others)),
        _ => Err(io::ErrorKind::NotFound.into()),
    }
}

/// Why another user could change what the directory `dir` (metadata
/// `parent`) holds under a name: it is theirs (not root's), or they may
/// write in it and it is not sticky, or it is sticky and the name (`child`,
/// `None` before it exists) is theirs.
fn parent_problem(
    dir: &Path,
    parent: &std::fs::Metadata,
    next: &Path,
    child_uid: Option<u32>,
) -> Option<String> {
    let me = euid();
    let trusted = |uid: u32| uid == me || uid == 0 || is_system_uid(uid);
    if !trusted(parent.uid()) {
        return Some(format!(
            "{} is owned by uid {}, who could swap what {} leads to",
            dir.display(),
            parent.uid(),
            next.display()
        ));
    }
    let open_to_others = parent.mode() & 0o022 != 0;
    let sticky = parent.mode() & 0o1000 != 0;
    if open_to_others && !(sticky && child_uid.is_some_and(trusted)) {
        return Some(format!(
            "{} lets other users write in it (mode {:o}){}, so they could swap {}",
            dir.display(),
            parent.mode() & 0o7777,
            match child_uid {
                Some(uid) if sticky => format!(" and {} is uid {uid}'s", next.display()),
                _ => String::new(),
            },
            next.display()
        ));
    }
    None
}

/// Why a directory reached through `path` could be changed by another
/// user, or how far it exists and what is missing below that.
///
/// Each step of the path is checked as the kernel's `protected_symlinks`
/// and `protected_regular` rules think of `/tmp` ([`parent_problem`]).
/// Once every step passes, no other user can make the path lead anywhere
/// else, so a handle opened on the real path afterwards is the directory
/// that was checked. Missing steps are made by
/// [`DirHandle::make_child`], one at a time, each checked as it is made.
pub(crate) fn path_problem(path: &Path) -> io::Result<Result<Walked, String>> {
    walk(path, |dir, parent, next, meta| {
        parent_problem(dir, parent, next, Some(meta.uid()))
    })
}

/// Whether `uid` is the system's own: root's peers that no app or login
/// runs as. On Android, every uid below `AID_APP_START` (10000) is a
/// system service's (`system`, 1000, owns `/data`, above every app's own
/// directory; bionic's `android_filesystem_config.h`); elsewhere, none but
/// root, which the caller trusts already.
fn is_system_uid(uid: u32) -> bool {
    cfg!(target_os = "android") && uid < 10_000
}

/// A directory opened once (`O_DIRECTORY | O_NOFOLLOW`): every file in it
/// is opened, created, renamed and removed relative to this handle
/// (`openat`, `renameat`, `unlinkat`, each with `O_NOFOLLOW` where it
/// opens), so that nothing done to the directory's path afterwards changes
/// which directory they act in.
pub(crate) struct DirHandle {
    fd: std::os::fd::OwnedFd,
}

impl DirHandle {
    /// Open the directory at `real` (a path with no symbolic link in its
    /// last step).
    pub(crate) fn open(real: &Path) -> io::Result<DirHandle> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(real)?;
        Ok(DirHandle { fd: file.into() })
    }

    /// Make directory `name` in this one (`at`, for messages), private to
    /// this user, and open it: refused where another user could change
    /// what `name` leads to ([`parent_problem`]: checked on this handle,
    /// and on what was made, which someone may have made first).
    pub(crate) fn make_child(
        &self,
        at: &Path,
        name: &OsStr,
    ) -> io::Result<Result<DirHandle, String>> {
        let c = entry_name(name)?;
        let next = at.join(name);
        // SAFETY: a live directory descriptor and a NUL-terminated name.
        if let Err(e) = cvt(unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o700) }) {
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e);
            }
        }
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: as above.
        let fd = cvt(unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags) })?;
        // SAFETY: `fd` was just opened and nothing else owns it.
        let child = DirHandle {
            fd: unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) },
        };
        let parent = File::from(self.fd.try_clone()?).metadata()?;
        let uid = fstat_fd(fd)?.st_uid;
        Ok(match parent_problem(at, &parent, &next, Some(uid)) {
            Some(why) => Err(why),
            None => Ok(child),
        })
    }

    /// Why another user could plant, swap or read files in it (it is
    /// theirs, or others may write in it), or `None`; a directory only
    /// others' reading is wrong with is made private first, and said in
    /// the second value.
    pub(crate) fn make_private(&self) -> io::Result<(Option<String>, Option<String>)> {
        let st = fstat_fd(self.fd.as_raw_fd())?;
        let me = euid();
        if st.st_uid != me {
            let why = format!(
                "it is owned by uid {}, not by this user (uid {me})",
                st.st_uid
            );
            return Ok((Some(why), None));
        }
        let mode = mode_of(&st) & 0o7777;
        if mode & 0o022 != 0 {
            let why = format!("its mode {mode:o} lets other users write in it");
            return Ok((Some(why), None));
        }
        if mode & 0o077 == 0 {
            return Ok((None, None));
        }
        // SAFETY: a live descriptor; fchmod touches no memory.
        cvt(unsafe { libc::fchmod(self.fd.as_raw_fd(), 0o700) })?;
        Ok((None, Some(format!("its mode was {mode:o}: made 700"))))
    }

    /// Open file `name` in it, for reading (and writing with `write`), only
    /// if it is a regular file of this user's (never a link, a FIFO or a
    /// device; the open never waits). `NotFound` when there is none.
    pub(crate) fn open_file(&self, name: &OsStr, write: bool) -> io::Result<File> {
        let c = entry_name(name)?;
        let access = if write { libc::O_RDWR } else { libc::O_RDONLY };
        let flags = access | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
        // SAFETY: a live directory descriptor and a NUL-terminated name.
        let fd = cvt(unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags) })?;
        // SAFETY: `fd` was just opened and nothing else owns it.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let st = fstat_fd(fd)?;
        if !is_regular(mode_of(&st)) {
            return Err(not_regular());
        }
        if st.st_uid != euid() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("owned by uid {}, not by this user", st.st_uid),
            ));
        }
        clear_nonblock(fd)?;
        Ok(file)
    }

    /// Create file `name` in it, readable and writable by this user alone
    /// (0600), failing if any file or link has that name.
    pub(crate) fn create_new(&self, name: &OsStr) -> io::Result<File> {
        let c = entry_name(name)?;
        let flags =
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let mode: libc::c_uint = 0o600;
        // SAFETY: a live directory descriptor and a NUL-terminated name.
        let fd = cvt(unsafe { libc::openat(self.fd.as_raw_fd(), c.as_ptr(), flags, mode) })?;
        // SAFETY: `fd` was just opened and nothing else owns it.
        Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    }

    /// Rename `from` to `to` in it, replacing `to`.
    pub(crate) fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (f, t) = (entry_name(from)?, entry_name(to)?);
        let d = self.fd.as_raw_fd();
        // SAFETY: a live directory descriptor and NUL-terminated names.
        cvt(unsafe { libc::renameat(d, f.as_ptr(), d, t.as_ptr()) })?;
        Ok(())
    }

    /// Give the file `from` in it the second name `to`, failing if `to`
    /// exists (`linkat`, which never replaces).
    pub(crate) fn link(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (f, t) = (entry_name(from)?, entry_name(to)?);
        let d = self.fd.as_raw_fd();
        // SAFETY: a live directory descriptor and NUL-terminated names.
        cvt(unsafe { libc::linkat(d, f.as_ptr(), d, t.as_ptr(), 0) })?;
        Ok(())
    }

    /// Whether `name` in it is the open `file` (device and inode, the name
    /// not followed if it is a link). `NotFound` when there is no `name`.
    pub(crate) fn holds(&self, name: &OsStr, file: &File) -> io::Result<bool> {
        let c = entry_name(name)?;
        // SAFETY: an all-zero stat is valid; fstatat writes it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a live directory descriptor, a NUL-terminated name and a
        // live, writable struct.
        cvt(unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        let open = fstat_fd(file.as_raw_fd())?;
        Ok(st.st_dev == open.st_dev && st.st_ino == open.st_ino)
    }

    /// Remove file `name` from it (never a directory).
    pub(crate) fn remove(&self, name: &OsStr) -> io::Result<()> {
        let c = entry_name(name)?;
        // SAFETY: a live directory descriptor and a NUL-terminated name.
        cvt(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) })?;
        Ok(())
    }

    /// The names in it that are regular files (by `fstatat` without
    /// following links), with their length and modification time.
    pub(crate) fn files(
        &self,
    ) -> io::Result<Vec<(std::ffi::OsString, u64, std::time::SystemTime)>> {
        // A descriptor of its own for the directory stream, which
        // closedir closes: the handle's own stays open.
        // SAFETY: a live descriptor; fcntl touches no memory.
        let dup = cvt(unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
        // SAFETY: `dup` is a directory descriptor nothing else owns; on
        // success the stream owns it.
        let dir = unsafe { libc::fdopendir(dup) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: `dup` is ours and still open.
            unsafe { libc::close(dup) };
            return Err(e);
        }
        // SAFETY: a live stream; the dup shares its offset with others.
        unsafe { libc::rewinddir(dir) };
        let mut out = Vec::new();
        loop {
            // SAFETY: a live stream, read by this thread only.
            let ent = unsafe { libc::readdir(dir) };
            if ent.is_null() {
                break;
            }
            // SAFETY: readdir returned a live entry whose d_name is
            // NUL-terminated; it is copied before the next call.
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            // SAFETY: an all-zero stat is valid; fstatat writes it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: a live directory descriptor, a NUL-terminated name and
            // a live, writable struct.
            let r = unsafe {
                libc::fstatat(
                    self.fd.as_raw_fd(),
                    name.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if r != 0 || !is_regular(mode_of(&st)) {
                continue;
            }
            let mtime = std::time::UNIX_EPOCH
                + std::time::Duration::new(
                    u64::try_from(st.st_mtime).unwrap_or(0),
                    u32::try_from(st.st_mtime_nsec).unwrap_or(0),
                );
            let len = u64::try_from(st.st_size).unwrap_or(0);
            out.push((OsStr::from_bytes(bytes).to_owned(), len, mtime));
        }
        // SAFETY: the stream is live and not used again; this closes `dup`.
        unsafe { libc::closedir(dir) };
        Ok(out)
    }

    /// Make renames and removals in it durable (`fsync` on the directory).
    pub(crate) fn sync(&self) -> io::Result<()> {
        // SAFETY: a live descriptor; fsync touches no memory.
        cvt(unsafe { libc::fsync(self.fd.as_raw_fd()) })?;
        Ok(())
    }
}

/// Make a file of this user's private to it (0600) if others may read or
/// write it: an entry written by an older weightmap, made 0644.
pub(crate) fn make_file_private(file: &File) -> io::Result<()> {
    let st = fstat_fd(file.as_raw_fd())?;
    if mode_of(&st) & 0o077 != 0 {
        // SAFETY: a live descriptor; fchmod touches no memory.
        cvt(unsafe { libc::fchmod(file.as_raw_fd(), 0o600) })?;
    }
    Ok(())
}

/// `file`, switched to direct writes (`O_DIRECT` set on the open file with
/// `fcntl`, not by opening its path again) until the guard is dropped.
/// `Unsupported` where there is no `O_DIRECT`.
pub(crate) struct DirectWrites<'a> {
    file: &'a File,
    #[cfg(any(target_os = "linux", target_os = "android"))]
    flags: libc::c_int,
}

impl<'a> DirectWrites<'a> {
    pub(crate) fn start(file: &'a File) -> io::Result<DirectWrites<'a>> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let fd = file.as_raw_fd();
            // SAFETY: a live descriptor; F_GETFL touches no memory.
            let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
            // SAFETY: as above.
            cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) })?;
            Ok(DirectWrites { file, flags })
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = file;
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "O_DIRECT is Linux-only",
            ))
        }
    }

    /// The file, writing past the page cache.
    pub(crate) fn file(&self) -> &File {
        self.file
    }
}

impl Drop for DirectWrites<'_> {
    fn drop(&mut self) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        // SAFETY: a live descriptor; F_SETFL touches no memory. Restoring
        // the flags cannot fail on a descriptor F_GETFL read them from.
        unsafe {
            libc::fcntl(self.file.as_raw_fd(), libc::F_SETFL, self.flags);
        }
    }
}

/// Allocate the blocks of `file`'s first `len` bytes, so that writing them
/// through a mapping cannot meet a full disk (which a mapping reports as
/// SIGBUS, not as an error). `Unsupported` where the filesystem or the
/// platform cannot (the caller then writes the bytes instead).
pub(crate) fn reserve(file: &File, len: u64) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let len = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length overflows off_t"))?;
        // SAFETY: a live descriptor; posix_fallocate reads nothing of ours.
        match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
            0 => Ok(()),
            libc::EOPNOTSUPP | libc::EINVAL => Err(io::ErrorKind::Unsupported.into()),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = (file, len);
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// Whether [`try_lock`] tells a held file from a free one here (`flock`).
pub(crate) const LOCKS: bool = true;

/// Take an exclusive advisory lock on `file` without waiting (`flock`):
/// `false` when another open file holds it. Held until `file` is closed,
/// so a lock outlives no process.
pub(crate) fn try_lock(file: &File) -> io::Result<bool> {
    // SAFETY: a live descriptor; flock touches no memory of ours.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// The memory budget: Linux and Android read `/proc` and the memory
/// cgroups; macOS the host's VM statistics; iOS `os_proc_available_memory`.
/// `own_cached`: the model's bytes in the page cache, which a cgroup's
/// figure counts as the model's rather than as used (the others count
/// cached pages as available already).
pub(crate) fn read_budget(own_cached: u64) -> BudgetReading {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    return super::cgroup::read_budget_in(Path::new("/"), own_cached);
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = own_cached;
    #[cfg(target_os = "macos")]
    return apple::host_vm_budget();
    #[cfg(any(target_os = "ios", target_os = "tvos", target_os = "visionos"))]
    return apple::proc_available_budget();
    #[allow(unreachable_code)]
    BudgetReading::Unreadable {
        why: "no memory figure is read on this system".into(),
    }
}

#[cfg(target_vendor = "apple")]
mod apple {
    use super::super::budget::{Budget, BudgetReading, Source};

    /// What macOS could hand out without paging out memory in use: the
    /// free, inactive, purgeable and speculative pages of
    /// `host_statistics64(HOST_VM_INFO64)` (what `vm_stat` prints), as
    /// Activity Monitor's "available" counts them.
    #[cfg(target_os = "macos")]
    pub(super) fn host_vm_budget() -> BudgetReading {
        // SAFETY: an all-zero vm_statistics64 is a valid value of this
        // plain C struct of integers.
        let mut stats: libc::vm_statistics64 = unsafe { std::mem::zeroed() };
        let mut count = libc::HOST_VM_INFO64_COUNT;
        // SAFETY: `stats` is writable and `count` says how many integers it
        // holds, as host_statistics64 requires; mach_host_self has no
        // preconditions.
        let rc = unsafe {
            libc::host_statistics64(
                libc::mach_host_self(),
                libc::HOST_VM_INFO64,
                (&mut stats as *mut libc::vm_statistics64).cast(),
                &mut count,
            )
        };
        if rc != libc::KERN_SUCCESS {
            return BudgetReading::Unreadable {
                why: format!("host_statistics64 returned {rc}"),
            };
        }
        let pages = u64::from(stats.free_count)
            + u64::from(stats.inactive_count)
            + u64::from(stats.purgeable_count)
            + u64::from(stats.speculative_count);
        BudgetReading::least(
            vec![Budget {
                bytes: pages.saturating_mul(super::page_size() as u64),
                source: Source::HostVmStatistics,
                counted: None,
            }],
            Vec::new(),
        )
    }

    #[cfg(any(target_os = "ios", target_os = "tvos", target_os = "visionos"))]
    extern "C" {
        /// `<os/proc.h>`, iOS 13+: the bytes the app may still allocate
        /// before it reaches its jetsam limit; 0 when not applicable.
        fn os_proc_available_memory() -> libc::size_t;
    }

    #[cfg(any(target_os = "ios", target_os = "tvos", target_os = "visionos"))]
    pub(super) fn proc_available_budget() -> BudgetReading {
        // SAFETY: no arguments, no preconditions.
        let bytes = unsafe { os_proc_available_memory() };
        if bytes == 0 {
            return BudgetReading::Unreadable {
                why: "os_proc_available_memory returned 0 (no jetsam limit applies)".into(),
            };
        }
        BudgetReading::least(
            vec![Budget {
                bytes: bytes as u64,
                source: Source::ProcAvailableMemory,
                counted: None,
            }],
            Vec::new(),
        )
    }
}

/// Whether `e` says the disk or the user's quota is full.
pub(crate) fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// Whether `e` says the place cannot be written at all (a read-only
/// filesystem, no permission).
pub(crate) fn is_read_only(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EROFS | libc::EACCES | libc::EPERM)
    )
}

/// Whether `[at, at + len)` of this process maps, without a gap and
/// read-only, the file `file` (device major, minor, inode) from file offset
/// `offset` on, by the text of `/proc/self/maps` (one map a line, by
/// address: `start-end perms offset major:minor inode [path]`, in hex but
/// the inode).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn maps_file(maps: &str, at: usize, len: usize, file: (u32, u32, u64), offset: u64) -> bool {
    let Some(end) = at.checked_add(len).filter(|_| len > 0) else {
        return false;
    };
    // Every address below `shown` is shown to map the file as asked.
    let mut shown = at;
    for line in maps.lines() {
        let Some(m) = MapsLine::parse(line) else {
            return false;
        };
        if m.end <= shown {
            continue;
        }
        let expected = offset + (shown - at) as u64;
        let here = m.offset.checked_add((shown.wrapping_sub(m.start)) as u64);
        if m.start > shown || m.file != file || m.writable || here != Some(expected) {
            return false;
        }
        shown = m.end;
        if shown >= end {
            return true;
        }
    }
    false
}

/// One line of `/proc/self/maps`.
#[cfg(any(target_os = "linux", target_os = "android"))]
struct MapsLine {
    start: usize,
    end: usize,
    writable: bool,
    offset: u64,
    file: (u32, u32, u64),
}

#[cfg(any(target_os = "linux", target_os = "android"))]
impl MapsLine {
    fn parse(line: &str) -> Option<MapsLine> {
        let mut fields = line.split_ascii_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let perms = fields.next()?;
        let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
        let (major, minor) = fields.next()?.split_once(':')?;
        let inode = fields.next()?.parse().ok()?;
        Some(MapsLine {
            start: usize::from_str_radix(start, 16).ok()?,
            end: usize::from_str_radix(end, 16).ok()?,
            writable: perms.as_bytes().get(1) != Some(&b'-'),
            offset,
            file: (
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
                inode,
            ),
        })
    }
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;

    /// A file (fe:01, inode 77) mapped whole at 0x10000, split in two by
    /// advice, then a map of another file and one written to.
    const MAPS: &str = "\
00010000-00030000 r--p 00000000 fe:01 77 /models/a.gguf
00030000-00050000 r--p 00020000 fe:01 77 /models/a.gguf
00050000-00060000 r--p 00000000 fe:01 78 /models/b.gguf
00060000-00070000 rw-p 00000000 fe:01 77 /models/a.gguf
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
";
    const A: (u32, u32, u64) = (0xfe, 1, 77);

    #[test]
    fn a_range_maps_the_file_only_read_only_at_the_same_offsets_without_a_gap() {
        // Whole, across the split, and from within.
        assert!(maps_file(MAPS, 0x10000, 0x40000, A, 0));
        assert!(maps_file(MAPS, 0x28000, 0x10000, A, 0x18000));
        // Another offset, file or device.
        assert!(!maps_file(MAPS, 0x10000, 0x40000, A, 0x1000));
        assert!(!maps_file(MAPS, 0x10000, 0x40000, (0xfe, 1, 78), 0));
        assert!(!maps_file(MAPS, 0x10000, 0x40000, (0xfe, 2, 77), 0));
        // Past its end, into another file's map; writable; not mapped.
        assert!(!maps_file(MAPS, 0x10000, 0x41000, A, 0));
        assert!(!maps_file(MAPS, 0x60000, 0x1000, A, 0));
        assert!(!maps_file(MAPS, 0x8000, 0x1000, A, 0));
        assert!(!maps_file(MAPS, 0x10000, 0, A, 0));
        assert!(!maps_file(MAPS, usize::MAX, 2, A, 0));
    }
}
