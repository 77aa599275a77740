//! Reading tensors into owned memory: in parallel, directly from storage
//! where that wins (`O_DIRECT`, Linux), with progress and cancellation.

use std::fs::File;
use std::io;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// A progress callback: `(bytes_done, bytes_total)`; return
/// `ControlFlow::Break(())` to cancel the load. It is called from the
/// reading threads (one call at a time), at most once per
/// [`PROGRESS_STEP`] bytes and once at the end.
pub type ProgressFn = Arc<dyn Fn(u64, u64) -> ControlFlow<()> + Send + Sync>;

/// Bytes between two progress calls.
pub const PROGRESS_STEP: u64 = 16 << 20;

/// Whether the stream path reads with `O_DIRECT`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DirectIo {
    /// Direct when the file is mostly not in the page cache (less than half
    /// resident, by `mincore`), buffered when it mostly is: from a warm cache
    /// a copy out of the cache beats a read from storage, and from a cold
    /// one a direct read skips the page-cache copy of every byte (the
    /// default).
    #[default]
    Auto,
    /// Direct whenever the layout and the filesystem allow.
    On,
    /// Always through the page cache.
    Off,
}

impl DirectIo {
    /// `"auto"`, `"on"` or `"off"`.
    pub fn name(self) -> &'static str {
        match self {
            DirectIo::Auto => "auto",
            DirectIo::On => "on",
            DirectIo::Off => "off",
        }
    }
}

/// What the reads did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DirectOutcome {
    /// Buffered, as asked ([`DirectIo::Off`]), or nothing to read.
    Off,
    /// Read with `O_DIRECT`.
    Used,
    /// Buffered: [`DirectIo::Auto`] found the file mostly cached.
    Skipped {
        /// Why, e.g. `"87% of the file is in the page cache"`.
        reason: String,
    },
    /// Buffered: direct reads cannot be used for this load (the layout, the
    /// platform, a buffer that is not page-aligned).
    NotApplicable {
        /// Why.
        reason: String,
    },
    /// Buffered: the filesystem refused `O_DIRECT` (tmpfs, some overlayfs).
    Refused {
        /// The OS error.
        error: String,
    },
}

impl std::fmt::Display for DirectOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirectOutcome::Off => write!(f, "buffered"),
            DirectOutcome::Used => write!(f, "direct (O_DIRECT)"),
            DirectOutcome::Skipped { reason } => write!(f, "buffered: {reason}"),
            DirectOutcome::NotApplicable { reason } => write!(f, "buffered: {reason}"),
            DirectOutcome::Refused { error } => {
                write!(f, "buffered: the filesystem refused O_DIRECT ({error})")
            }
        }
    }
}

/// How a load read its copied tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadReport {
    /// Reading threads used.
    pub threads: usize,
    /// Whether the reads were direct.
    pub direct: DirectOutcome,
}

/// Progress shared by the reading threads of one load.
pub(crate) struct Progress {
    f: Option<ProgressFn>,
    total: u64,
    done: AtomicU64,
    /// The `done` of the last call, under the lock that serialises calls.
    last: Mutex<u64>,
    cancelled: AtomicBool,
}

impl Progress {
    pub(crate) fn new(f: Option<ProgressFn>, total: u64) -> Progress {
        Progress {
            f,
            total,
            done: AtomicU64::new(0),
            last: Mutex::new(0),
            cancelled: AtomicBool::new(false),
        }
    }

    /// Whether some thread has seen a cancel.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Count `n` more bytes done; call the callback if a step has passed.
    /// Returns false once the load is cancelled.
    pub(crate) fn add(&self, n: u64) -> bool {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(f) = &self.f {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if !self.cancelled()
                && (done >= *last + PROGRESS_STEP || done >= self.total)
                && done > *last
            {
                *last = done;
                if f(done.min(self.total), self.total).is_break() {
                    self.cancelled.store(true, Ordering::Relaxed);
                }
            }
        }
        !self.cancelled()
    }
}

/// Where copies read from: a file (from `base`, for a model inside a larger
/// file) or memory the caller handed over.
#[derive(Clone, Copy)]
pub(crate) enum ReadSrc<'a> {
    File { file: &'a File, base: u64 },
    Memory(&'a [u8]),
}

impl ReadSrc<'_> {
    /// Fill `buf` from offset `off` of the model.
    pub(crate) fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        match *self {
            ReadSrc::File { file, base } => crate::format::read_at(file, buf, base + off),
            ReadSrc::Memory(m) => {
                let start = usize::try_from(off)
                    .map_err(|_| io::Error::from(io::ErrorKind::UnexpectedEof))?;
                let src = start
                    .checked_add(buf.len())
                    .and_then(|end| m.get(start..end))
                    .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
                buf.copy_from_slice(src);
                Ok(())
            }
        }
    }
}

/// Bytes one buffered read asks for, at most. Each thread prefaults a
/// piece and then copies into it, so a piece that fits in L2 is still
/// cached when the copy writes it: on the 512 MiB bench model (warm, 2
/// cores, 2 MiB of L2 a core) 512 KiB pieces loaded in a median 0.475× the
/// `read()` baseline over six runs, 2 MiB in 0.49× and 8 MiB in 0.505×.
const BUFFERED_PIECE: usize = 512 << 10;

/// Bytes one direct read asks for, at most: large requests keep the
/// device's queue full (nothing is zeroed or copied by the kernel).
const DIRECT_PIECE: usize = 8 << 20;

/// Read `pieces` (each a destination and the file offset of its first
/// byte) with `threads` threads, each taking a run of pieces of about equal
/// bytes. Stops early when `progress` is cancelled.
pub(crate) fn read_buffered(
    src: ReadSrc<'_>,
    path: &Path,
    pieces: Vec<(&mut [u8], u64)>,
    threads: usize,
    progress: &Progress,
) -> Result<()> {
    // Cut into pieces so threads share large tensors too.
    let oom = |_| Error::OutOfMemory {
        what: "the reads",
        bytes: (pieces.len() as u64).saturating_mul(24),
    };
    let mut cut: Vec<(&mut [u8], u64)> = Vec::new();
    cut.try_reserve_exact(pieces.len()).map_err(oom)?;
    for (mut dst, mut off) in pieces {
        while dst.len() > BUFFERED_PIECE {
            let (a, b) = dst.split_at_mut(BUFFERED_PIECE);
            crate::alloc::push(&mut cut, (a, off), "the reads")?;
            off += BUFFERED_PIECE as u64;
            dst = b;
        }
        crate::alloc::push(&mut cut, (dst, off), "the reads")?;
    }
    let total: usize = cut.iter().map(|p| p.0.len()).sum();
    let threads = threads.clamp(1, cut.len().max(1));
    let per = total.div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(&mut [u8], u64)>> = (0..threads).map(|_| Vec::new()).collect();
    let mut acc = 0usize;
    for p in cut {
        let g = (acc / per).min(threads - 1);
        acc += p.0.len();
        crate::alloc::push(&mut groups[g], p, "the reads")?;
    }
    let run = |group: Vec<(&mut [u8], u64)>| -> io::Result<bool> {
        for (dst, off) in group {
            if progress.cancelled() {
                return Ok(false);
            }
            // Each thread maps its own pages, one call a piece, so the kernel
            // zeroes fresh pages on every thread at once (prefaulting the
            // whole buffer in one call first zeroed it on one thread: 0.75×
            // the read() baseline, warm, against 0.50× this way).
            crate::buffer::prefault_for_write(dst);
            src.read_at(dst, off)?;
            if !progress.add(dst.len() as u64) {
                return Ok(false);
            }
        }
        Ok(true)
    };
    finish(run_groups(groups, run), path, progress)
}

/// Run `run` on every group, each on its own scoped thread (in this thread
/// when there is one group); every thread has ended when this returns.
fn run_groups<G: Send>(
    groups: Vec<G>,
    run: impl Fn(G) -> io::Result<bool> + Sync,
) -> Vec<io::Result<bool>> {
    if groups.len() <= 1 {
        return groups.into_iter().map(run).collect();
    }
    let run = &run;
    std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|g| s.spawn(move || run(g)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

fn finish(results: Vec<io::Result<bool>>, path: &Path, progress: &Progress) -> Result<()> {
    for r in results {
        r.map_err(|e| Error::io("read", path, e))?;
    }
    if progress.cancelled() {
        return Err(Error::Cancelled);
    }
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// Makes `read_direct` answer as a filesystem that refuses `O_DIRECT`.
    pub(crate) static FAIL_DIRECT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The granule of direct reads: offsets, lengths and addresses are
/// multiples of it (the largest logical block size in common use).
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// Read `[file_start, file_start + dst.len())` of `path` into `dst` with
/// `O_DIRECT`, in parallel. `file_start`, `dst`'s address and length are
/// multiples of [`DIRECT_ALIGN`]; bytes past the end of the file are left
/// as they are. `Ok(Err(error))` when the filesystem refuses `O_DIRECT`
/// (the caller reads buffered instead).
pub(crate) fn read_direct(
    path: &Path,
    dst: &mut [u8],
    file_start: u64,
    threads: usize,
    progress: &Progress,
) -> Result<std::result::Result<(), String>> {
    #[cfg(test)]
    if FAIL_DIRECT.with(|f| f.get()) {
        return Ok(Err("Invalid argument (os error 22), injected".into()));
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(Err(e.to_string())),
            Err(e) => return Err(Error::io("open", path, e)),
        };
        let n = dst.len();
        let mut chunks: Vec<(&mut [u8], u64)> = dst
            .chunks_mut(DIRECT_PIECE)
            .enumerate()
            .map(|(i, c)| (c, file_start + (i * DIRECT_PIECE) as u64))
            .collect();
        // Probe with the first block: a filesystem that accepts the open
        // may still refuse the read (EINVAL).
        if let Some((c, off)) = chunks.first_mut() {
            let probe = DIRECT_ALIGN.min(c.len());
            if let Err(e) = file.read_at(&mut c[..probe], *off) {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    return Ok(Err(e.to_string()));
                }
                return Err(Error::io("read", path, e));
            }
        }
        let threads = threads.clamp(1, chunks.len().max(1));
        let per = chunks.len().div_ceil(threads);
        let mut groups: Vec<Vec<(&mut [u8], u64)>> = Vec::with_capacity(threads);
        while !chunks.is_empty() {
            let rest = chunks.split_off(per.min(chunks.len()));
            groups.push(std::mem::replace(&mut chunks, rest));
        }
        let run = |group: Vec<(&mut [u8], u64)>| -> io::Result<bool> {
            for (dst, off) in group {
                if progress.cancelled() {
                    return Ok(false);
                }
                let mut got = 0;
                while got < dst.len() {
                    match file.read_at(&mut dst[got..], off + got as u64) {
                        Ok(0) => break, // the end of the file
                        Ok(k) => got += k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                    // A short read before the end comes back unaligned
                    // only at the end of the file.
                    if got % DIRECT_ALIGN != 0 {
                        break;
                    }
                }
                if !progress.add(dst.len() as u64) {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let _ = n;
        finish(run_groups(groups, run), path, progress).map(Ok)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (path, dst, file_start, threads, progress);
        Ok(Err("O_DIRECT is Linux-only".into()))
    }
}

/// The default number of reading threads: the available parallelism,
/// capped at 4 (more threads than that only queue on one device).
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}
