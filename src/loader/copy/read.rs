//! Reading tensors into owned memory: in parallel, directly from storage
//! where that wins (`O_DIRECT`, Linux), with progress and cancellation.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::loader::options::PROGRESS_STEP;
use crate::page_plan::ProgressFn;

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

impl<'a> ReadSrc<'a> {
    /// This source read through `own`, a reading thread's own handle on the
    /// same file, where it has one ([`crate::os::reopen_for_reader`]).
    pub(crate) fn with_file<'b>(self, own: Option<&'b File>) -> ReadSrc<'b>
    where
        'a: 'b,
    {
        match (self, own) {
            (ReadSrc::File { base, .. }, Some(file)) => ReadSrc::File { file, base },
            (src, _) => src,
        }
    }

    /// Drop `[off, off + len)` from the page cache, when the source is a
    /// file: bytes uploaded to a device are not kept on the host.
    pub(crate) fn drop_cached(&self, off: u64, len: u64) {
        if let ReadSrc::File { file, base } = *self {
            crate::os::drop_cached(file, base + off, len);
        }
    }

    /// Fill `buf` from offset `off` of the model.
    pub(crate) fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        match *self {
            ReadSrc::File { file, base } => crate::os::read_at(file, buf, base + off),
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
/// cached when the copy writes it. 512 KiB: the fastest of 512 KiB, 2 MiB
/// and 8 MiB pieces; BENCHMARKS.md, "Stream path from a warm cache".
const BUFFERED_PIECE: usize = 512 << 10;

/// Bytes one direct read asks for, at most: large requests keep the
/// device's queue full (nothing is zeroed or copied by the kernel).
const DIRECT_PIECE: usize = 8 << 20;

/// Bytes of consecutive pieces one reading thread takes from the queue at
/// a time: small enough that a thread the host slows takes fewer of them,
/// so the threads end together (a static share each does not), large
/// enough that two threads seldom fill pages under one page table page
/// (2 MiB), whose lock they would share. 4 MiB chunks against static
/// halves: BENCHMARKS.md, "Stream path from a warm cache".
const CHUNK: usize = 4 << 20;

/// Read `pieces` (each a destination and the file offset of its first
/// byte) with `threads` threads, which take runs of about [`CHUNK`] bytes
/// from one queue. Stops early when `progress` is cancelled.
pub(crate) fn read_buffered(
    src: ReadSrc<'_>,
    path: &Path,
    pieces: Vec<(&mut [u8], u64)>,
    threads: usize,
    progress: &Progress,
) -> Result<()> {
    // Cut into pieces so threads share large tensors too, and gather the
    // pieces into chunks.
    let mut chunks: Vec<Vec<(&mut [u8], u64)>> = Vec::new();
    let mut chunk: Vec<(&mut [u8], u64)> = Vec::new();
    let mut in_chunk = 0usize;
    for (mut dst, mut off) in pieces {
        loop {
            let n = dst.len().min(BUFFERED_PIECE);
            let (a, b) = dst.split_at_mut(n);
            crate::alloc::push(&mut chunk, (a, off), "the reads")?;
            in_chunk += n;
            if in_chunk >= CHUNK {
                crate::alloc::push(&mut chunks, std::mem::take(&mut chunk), "the reads")?;
                in_chunk = 0;
            }
            off += n as u64;
            dst = b;
            if dst.is_empty() {
                break;
            }
        }
    }
    if !chunk.is_empty() {
        crate::alloc::push(&mut chunks, chunk, "the reads")?;
    }
    let run = |file: &mut Option<File>, chunk: Vec<(&mut [u8], u64)>| -> io::Result<bool> {
        let src = src.with_file(file.as_ref());
        for (dst, off) in chunk {
            // Each thread maps its own pages, one call a piece, so the kernel
            // zeroes fresh pages on every thread at once; prefaulting the
            // whole buffer in one call first would zero it on one thread
            // (BENCHMARKS.md, "Stream path from a warm cache").
            crate::os::prefault_for_write(dst);
            src.read_at(dst, off)?;
            if !progress.add(dst.len() as u64) {
                return Ok(false);
            }
        }
        Ok(true)
    };
    let handle = || match src {
        ReadSrc::File { file, .. } => crate::os::reopen_for_reader(file, false),
        ReadSrc::Memory(_) => Ok(None),
    };
    finish(
        run_queue(chunks, threads, handle, run, progress),
        path,
        progress,
    )
}

/// Run `run` on every item, in order, on `threads` scoped threads (in this
/// thread when one is enough) that each take the next item from one queue.
/// Each thread first makes its own state with `init` (a file handle of its
/// own, where the system serialises reads on one).
/// A thread stops at its first error or `Ok(false)`, and every thread stops
/// taking items once one has failed or `progress` is cancelled. Every
/// thread has ended when this returns; each gives its first failure, or
/// `Ok(true)`.
fn run_queue<I: Send, S>(
    items: Vec<I>,
    threads: usize,
    init: impl Fn() -> io::Result<S> + Sync,
    run: impl Fn(&mut S, I) -> io::Result<bool> + Sync,
    progress: &Progress,
) -> Vec<io::Result<bool>> {
    let threads = threads.clamp(1, items.len().max(1));
    let queue = Mutex::new(items.into_iter());
    let failed = AtomicBool::new(false);
    let work = || -> io::Result<bool> {
        let mut state = init().inspect_err(|_| failed.store(true, Ordering::Relaxed))?;
        loop {
            if failed.load(Ordering::Relaxed) || progress.cancelled() {
                return Ok(!progress.cancelled());
            }
            // The lock is held only to take an item, so a panic (which
            // `scope` passes on) cannot poison it midway.
            let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
            let Some(item) = next else { return Ok(true) };
            match run(&mut state, item) {
                Ok(true) => {}
                other => {
                    failed.store(true, Ordering::Relaxed);
                    return other;
                }
            }
        }
    };
    if threads == 1 {
        return vec![work()];
    }
    let work = &work;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|_| s.spawn(work)).collect();
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

pub(crate) use crate::os::DIRECT_ALIGN;

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
    let file = match crate::os::open_direct(path) {
        Ok(f) => f,
        Err(e) if crate::os::refuses_direct_io(&e) => return Ok(Err(e.to_string())),
        Err(e) => return Err(Error::io("open", path, e)),
    };
    let mut chunks: Vec<(&mut [u8], u64)> = dst
        .chunks_mut(DIRECT_PIECE)
        .enumerate()
        .map(|(i, c)| (c, file_start + (i * DIRECT_PIECE) as u64))
        .collect();
    // Probe with the first block: a filesystem that accepts the open
    // may still refuse the read (EINVAL).
    if let Some((c, off)) = chunks.first_mut() {
        let probe = DIRECT_ALIGN.min(c.len());
        if let Err(e) = crate::os::read_some_at(&file, &mut c[..probe], *off) {
            if crate::os::refuses_direct_io(&e) {
                return Ok(Err(e.to_string()));
            }
            return Err(Error::io("read", path, e));
        }
    }
    // Threads take the next 8 MiB from one queue, so the device sees one
    // sequential stream with a request per thread in flight.
    let run = |own: &mut Option<File>, (dst, off): (&mut [u8], u64)| -> io::Result<bool> {
        let file = own.as_ref().unwrap_or(&file);
        let mut got = 0;
        while got < dst.len() {
            match crate::os::read_some_at(file, &mut dst[got..], off + got as u64) {
                Ok(0) => break, // the end of the file
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            // A short read before the end comes back unaligned only at
            // the end of the file.
            if got % DIRECT_ALIGN != 0 {
                break;
            }
        }
        Ok(progress.add(dst.len() as u64))
    };
    let handle = || crate::os::reopen_for_reader(&file, true);
    finish(
        run_queue(chunks, threads, handle, run, progress),
        path,
        progress,
    )
    .map(Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::ControlFlow;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn the_queue_runs_every_item_once_and_stops_at_a_failure() {
        for threads in 1..=4 {
            let runs: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
            let progress = Progress::new(None, 0);
            let results = run_queue(
                (0..100).collect(),
                threads,
                || Ok(()),
                |_: &mut (), i: usize| {
                    runs[i].fetch_add(1, Ordering::Relaxed);
                    Ok(true)
                },
                &progress,
            );
            assert_eq!(results.len(), threads);
            assert!(results.iter().all(|r| matches!(r, Ok(true))));
            assert!(runs.iter().all(|n| n.load(Ordering::Relaxed) == 1));

            // Item 10 fails: its error comes back, nothing runs twice, and
            // the queue stops (on one thread, right after it).
            let runs: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
            let results = run_queue(
                (0..100).collect(),
                threads,
                || Ok(()),
                |_: &mut (), i: usize| {
                    runs[i].fetch_add(1, Ordering::Relaxed);
                    if i == 10 {
                        return Err(io::Error::other("item 10"));
                    }
                    Ok(true)
                },
                &progress,
            );
            let errors: Vec<String> = results
                .iter()
                .filter_map(|r| r.as_ref().err().map(|e| e.to_string()))
                .collect();
            assert_eq!(errors, ["item 10"], "{threads} threads");
            assert!(runs.iter().all(|n| n.load(Ordering::Relaxed) <= 1));
            if threads == 1 {
                let ran = runs
                    .iter()
                    .filter(|n| n.load(Ordering::Relaxed) == 1)
                    .count();
                assert_eq!(ran, 11);
            }
        }
    }

    #[test]
    fn a_cancelled_queue_takes_no_more_items() {
        let f: ProgressFn = Arc::new(|done, _| {
            if done >= 5 * PROGRESS_STEP {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        let progress = Progress::new(Some(f), 100 * PROGRESS_STEP);
        let ran = AtomicUsize::new(0);
        let results = run_queue(
            (0..100).collect(),
            1,
            || Ok(()),
            |_: &mut (), _: usize| {
                ran.fetch_add(1, Ordering::Relaxed);
                Ok(progress.add(PROGRESS_STEP))
            },
            &progress,
        );
        assert!(matches!(results[..], [Ok(false)]), "{results:?}");
        assert_eq!(ran.load(Ordering::Relaxed), 5);
        assert!(progress.cancelled());
    }
}
