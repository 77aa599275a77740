//! The prefetcher: carries out what a mapped load's
//! [`PagePlan`](super::PagePlan) decided ([`PrefetchTask`]), in a thread
//! that is stopped and joined when the weights drop, and decides nothing
//! of its own.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

#[cfg(doc)]
use super::choices::{AdvicePolicy, Prefetch};
use super::choices::{PrefetchDecision, ProgressFn, SkipReason};
use super::plan::{drop_from, fits, follow_step, total_of, worth_rereading};
use super::plan::{MemReader, PrefetchTask};
use crate::os::{Mapping, PageMap};

/// Where a prefetch stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchProgress {
    /// Bytes of the region read and mapped so far.
    pub bytes_done: u64,
    /// Bytes of the region.
    pub bytes_total: u64,
    /// Bytes of the region dropped and read again, once read, because the
    /// page cache held them in small folios
    /// ([`crate::LoadOptions::reread_small_folios`]).
    pub bytes_reread: u64,
    /// Running, finished or stopped.
    pub state: PrefetchState,
}

/// The state of a background prefetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrefetchState {
    /// Still reading.
    Running,
    /// The whole region was read.
    Finished,
    /// Stopped early: the region no longer fit in the memory budget.
    StoppedForMemory,
    /// Stopped early: the kernel refused a read (a file truncated
    /// underneath gives `EFAULT` here rather than a signal).
    StoppedByError,
    /// Stopped early: the progress callback returned `Break`.
    Cancelled,
}

const RUNNING: u8 = 0;
const FINISHED: u8 = 1;
const STOPPED_MEMORY: u8 = 2;
const STOPPED_ERROR: u8 = 3;
const STOPPED_DROP: u8 = 4;
const STOPPED_CANCEL: u8 = 5;

/// Bytes mapped per `MADV_POPULATE_READ` call, and the granule of progress
/// and of stopping.
const CHUNK: usize = 8 << 20;
/// How far ahead of the mapped front reads are queued.
const AHEAD: usize = 4 * CHUNK;
/// How often, in bytes, the memory check is repeated.
const RECHECK: usize = 64 << 20;

#[derive(Debug)]
struct Shared {
    stop: AtomicBool,
    /// A windowed read-ahead, which waits on the first pass.
    follows_pass: AtomicBool,
    done: AtomicU64,
    /// Bytes re-read because the page cache held them in small folios.
    reread: AtomicU64,
    state: AtomicU8,
    total: u64,
    finished: Mutex<bool>,
    cv: Condvar,
}

impl Shared {
    fn new(total: u64) -> Shared {
        Shared {
            stop: AtomicBool::new(false),
            follows_pass: AtomicBool::new(false),
            done: AtomicU64::new(0),
            reread: AtomicU64::new(0),
            state: AtomicU8::new(RUNNING),
            total,
            finished: Mutex::new(false),
            cv: Condvar::new(),
        }
    }

    fn finish(&self, state: u8) {
        self.state.store(state, Ordering::Release);
        let mut f = self.finished.lock().unwrap_or_else(|e| e.into_inner());
        *f = true;
        self.cv.notify_all();
    }
}

/// Read `ranges` of `map` (sorted, disjoint) in file order, mapping one
/// [`CHUNK`] at a time (`MADV_POPULATE_READ`), and stop when asked or when
/// the rest no longer fits in memory. Returns the final state.
///
/// In huge pages (`huge`: the ranges are advised `MADV_HUGEPAGE`) the
/// populate's own faults read ahead in PMD-size folios, which the page
/// cache keeps whole and the mapping maps with one entry each. Otherwise
/// reads are queued (`WILLNEED`) up to [`AHEAD`] bytes ahead, which the
/// kernel reads in base-page folios (`force_page_cache_ra`), but without
/// which a range advised `MADV_RANDOM` would be read a page per fault.
fn read_in_order(
    map: &Mapping,
    ranges: &[(usize, usize)],
    huge: bool,
    shared: &Shared,
    mem: Option<(MemReader, u8)>,
    progress: Option<&ProgressFn>,
) -> u8 {
    let total = shared.total;
    let mut done = 0u64;
    let mut next_check = RECHECK as u64;
    for &(start, end) in ranges {
        let mut queued = start;
        let mut pos = start;
        while pos < end {
            if shared.stop.load(Ordering::Relaxed) {
                return STOPPED_DROP;
            }
            let ahead = end.min(pos.saturating_add(AHEAD));
            if !huge && queued < ahead {
                map.will_need(queued, ahead);
                queued = ahead;
            }
            let n = CHUNK.min(end - pos);
            if map.populate_read(pos, pos + n).is_err() {
                return STOPPED_ERROR;
            }
            pos += n;
            done += n as u64;
            shared.done.store(done, Ordering::Relaxed);
            // Once per chunk: a bounded rate.
            if let Some(f) = progress {
                if f(done, total).is_break() {
                    return STOPPED_CANCEL;
                }
            }
            if let Some((avail, pct)) = &mem {
                if done >= next_check && done < total {
                    next_check = done + RECHECK as u64;
                    match avail() {
                        Some(a) if fits(total - done, a, *pct) => {}
                        _ => return STOPPED_MEMORY,
                    }
                }
            }
        }
    }
    FINISHED
}

/// How long a windowed read-ahead waits for the pass to move on.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Queue reads of `ranges` in file order, at most `window` bytes ahead of
/// the first page of `follow` (the ranges a first pass goes through in
/// order) not yet mapped by this process (the front of the pass), and drop
/// the pages of `ranges` more than `window` behind it, until the
/// end, a stop, or an error reading the page map. Pages are read into the
/// page cache only (`MADV_WILLNEED`), never mapped, so that the page map
/// keeps telling where the pass is.
///
/// The region does not fit in the budget, so pages behind the pass go
/// anyway; dropped here, in bulk (`MADV_DONTNEED`, `POSIX_FADV_DONTNEED`),
/// they cost a small part of what the cgroup's reclaim pays for each mapped
/// page it takes (a reverse-map walk and a TLB flush on every CPU), and the
/// pass never waits for reclaim.
fn read_ahead_of_pass(
    map: &Mapping,
    ranges: &[(usize, usize)],
    follow: &[(usize, usize)],
    shared: &Shared,
    window: usize,
    pages: &PageMap,
) -> u8 {
    let base = map.addr();
    let mut done = 0u64;
    // The pass's front, as an offset in the map: it only moves forward, and
    // only through `follow`, so a table read by row, whose pages a pass
    // mostly leaves unmapped, does not hold it back.
    let (mut front, mut r) = (follow.first().map_or(0, |r| r.0), 0);
    let mut behind = DropCursor::new(ranges);
    let step = follow_step();
    for &(start, end) in ranges {
        let mut pos = start;
        while pos < end {
            loop {
                if shared.stop.load(Ordering::Relaxed) {
                    return STOPPED_DROP;
                }
                // Move the front over every step the pass has mapped.
                while r < follow.len() {
                    let (rs, re) = follow[r];
                    front = front.max(rs);
                    if front >= re {
                        r += 1;
                        continue;
                    }
                    match pages.present(base + front) {
                        Ok(true) => front = (front + step).min(re),
                        Ok(false) => break,
                        Err(_) => return STOPPED_ERROR,
                    }
                }
                behind.drop_to(map, ranges, front.saturating_sub(window));
                if r >= follow.len() || pos < front.saturating_add(window) {
                    break;
                }
                std::thread::sleep(FOLLOW_POLL);
            }
            // The pass has read what lies behind its front: queued again,
            // those reads would only bring back what the drop above takes,
            // for good once the drop has passed. A thread the scheduler
            // runs late (another build on the cores) finds the pass far
            // ahead of it, so it moves on to the front.
            if pos < front {
                let to = front.min(end);
                done += (to - pos) as u64;
                pos = to;
                shared.done.store(done, Ordering::Relaxed);
                continue;
            }
            let n = step.min(end - pos);
            map.will_need(pos, pos + n);
            pos += n;
            done += n as u64;
            shared.done.store(done, Ordering::Relaxed);
        }
    }
    FINISHED
}

/// Pages behind a first pass, dropped a batch at a time.
struct DropCursor {
    /// Dropped up to here (an offset in the map), in `ranges[range]`.
    at: usize,
    range: usize,
}

impl DropCursor {
    /// Bytes dropped per call at least: a call costs a drain of every
    /// CPU's page lists.
    const BATCH: usize = 8 << 20;

    fn new(ranges: &[(usize, usize)]) -> DropCursor {
        DropCursor {
            at: ranges.first().map_or(0, |r| r.0),
            range: 0,
        }
    }

    /// Drop the parts of `ranges` before `to`, once they come to a batch.
    fn drop_to(&mut self, map: &Mapping, ranges: &[(usize, usize)], to: usize) {
        if to < self.at.saturating_add(Self::BATCH) {
            return;
        }
        while let Some(&(rs, re)) = ranges.get(self.range) {
            self.at = self.at.max(rs);
            let upto = to.min(re);
            if upto > self.at {
                // From a huge page back: the last batch may have ended
                // inside a large folio (the pass's own faults read them).
                let from = drop_from(self.at as u64, rs as u64) as usize;
                // Advisory: a failure only leaves the pages to reclaim.
                let _ = map.release(from, upto);
                self.at = upto;
            }
            if self.at < re {
                return;
            }
            self.range += 1;
        }
    }
}

/// Drop and read again, in huge-page folios, each of `ranges` (advised
/// `MADV_HUGEPAGE`, read and mapped) of which this process maps enough in
/// small folios to be [worth it](worth_rereading): the page cache held it
/// so before the load (another process
/// filled it), which a fault under the advice does not change. Returns the
/// bytes re-read; stops early when `stop` says so. What another process
/// still maps cannot be dropped, and stays as it is.
fn reread_small_folios(map: &Mapping, ranges: &[(usize, usize)], stop: impl Fn() -> bool) -> u64 {
    let mut reread = 0u64;
    for &(start, end) in ranges {
        let Ok((sizes, capacity)) = map.page_sizes(start, end) else {
            return reread;
        };
        let small = sizes
            .resident
            .min(capacity as u64)
            .saturating_sub(sizes.huge);
        if !worth_rereading(small, capacity as u64) {
            continue;
        }
        if map.release(start, end).is_err() {
            continue;
        }
        let mut pos = start;
        while pos < end {
            if stop() {
                return reread;
            }
            let n = CHUNK.min(end - pos);
            if map.populate_read(pos, pos + n).is_err() {
                return reread;
            }
            pos += n;
            reread += n as u64;
        }
    }
    reread
}

/// Read the task's ranges in order (within `mem`'s budget, if given) and
/// then, if the task asks for it and all was read, re-read its small
/// folios; returns the final state, the re-read bytes in `shared`.
fn read_region(
    map: &Mapping,
    task: &PrefetchTask,
    shared: &Shared,
    mem: Option<(MemReader, u8)>,
) -> u8 {
    let progress = task.progress.as_ref();
    let state = read_in_order(map, &task.ranges, task.huge_pages, shared, mem, progress);
    if state == FINISHED && task.reread {
        let n = reread_small_folios(map, &task.ranges, || shared.stop.load(Ordering::Relaxed));
        shared.reread.store(n, Ordering::Relaxed);
    }
    state
}

/// A prefetch of a mapping's tensor region: a thread, stopped and joined
/// on drop (no thread outlives it and nothing is read after it drops), or
/// the record of a populate that ran before the load returned.
///
/// After `fork`, the child has the parent's prefetcher but not its thread:
/// dropped in the child, it joins nothing.
#[derive(Debug)]
pub(crate) struct Prefetcher {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    /// The process the thread was started in.
    pid: u32,
}

impl Prefetcher {
    /// Carry out `task` over `map`, and say what was done: a background
    /// thread re-reads the budget as it goes; a populate runs here, and
    /// `Err(Cancelled)` says the progress callback cancelled it.
    pub(crate) fn start(
        map: &Arc<Mapping>,
        task: PrefetchTask,
    ) -> crate::error::Result<(Option<Prefetcher>, PrefetchDecision)> {
        let bytes = total_of(&task.ranges);
        Ok(match task.decision.clone() {
            PrefetchDecision::WillNeed { .. } => {
                for &(s, e) in &task.ranges {
                    map.will_need(s, e);
                }
                (None, task.decision)
            }
            PrefetchDecision::Populated { .. } => {
                let shared = Arc::new(Shared::new(bytes));
                let state = read_region(map, &task, &shared, None);
                if state == STOPPED_CANCEL {
                    return Err(crate::error::Error::Cancelled);
                }
                shared.finish(state);
                let done = Prefetcher {
                    shared,
                    handle: None,
                    pid: std::process::id(),
                };
                (Some(done), task.decision)
            }
            PrefetchDecision::Background { max_percent, .. } => {
                let shared = Arc::new(Shared::new(bytes));
                let m = Arc::clone(map);
                let decision = task.decision.clone();
                let mem = Arc::clone(&task.budget);
                Prefetcher::spawn(shared, decision, move |s| {
                    read_region(&m, &task, s, Some((mem, max_percent)))
                })
            }
            PrefetchDecision::Windowed { window, .. } => {
                Prefetcher::start_windowed(map, task, window)
            }
            decision => (None, decision),
        })
    }

    /// Start the thread that runs `read` (returning its final state), and
    /// report `decision` for it, or why it could not start.
    fn spawn(
        shared: Arc<Shared>,
        decision: PrefetchDecision,
        read: impl FnOnce(&Shared) -> u8 + Send + 'static,
    ) -> (Option<Prefetcher>, PrefetchDecision) {
        let s = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("weightmap-prefetch".into())
            .stack_size(64 << 10)
            .spawn(move || {
                let state = read(&s);
                s.finish(state);
            });
        match spawned {
            Ok(handle) => (
                Some(Prefetcher {
                    shared,
                    handle: Some(handle),
                    pid: std::process::id(),
                }),
                decision,
            ),
            Err(e) => (
                None,
                PrefetchDecision::Skipped(SkipReason::Spawn {
                    error: e.to_string(),
                }),
            ),
        }
    }

    /// A read-ahead of the task's ranges that follows the first pass
    /// through its ranges read in order ([`read_ahead_of_pass`]), `window`
    /// bytes ahead of it.
    fn start_windowed(
        map: &Arc<Mapping>,
        task: PrefetchTask,
        window: u64,
    ) -> (Option<Prefetcher>, PrefetchDecision) {
        let pages = match PageMap::open() {
            Ok(p) => p,
            Err(e) => {
                return (
                    None,
                    PrefetchDecision::Skipped(SkipReason::Spawn {
                        error: format!("no page map to follow the first pass: {e}"),
                    }),
                )
            }
        };
        let shared = Arc::new(Shared::new(total_of(&task.ranges)));
        shared.follows_pass.store(true, Ordering::Relaxed);
        let m = Arc::clone(map);
        let w = usize::try_from(window).unwrap_or(usize::MAX);
        let decision = task.decision.clone();
        Prefetcher::spawn(shared, decision, move |s| {
            read_ahead_of_pass(&m, &task.ranges, &task.in_order, s, w, &pages)
        })
    }

    /// Ask the thread to stop reading ahead (it stops within one chunk and
    /// is joined on drop, as ever).
    pub(crate) fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }

    /// Where it stands.
    pub(crate) fn progress(&self) -> PrefetchProgress {
        let state = match self.shared.state.load(Ordering::Acquire) {
            RUNNING => PrefetchState::Running,
            FINISHED => PrefetchState::Finished,
            STOPPED_MEMORY => PrefetchState::StoppedForMemory,
            STOPPED_CANCEL => PrefetchState::Cancelled,
            _ => PrefetchState::StoppedByError,
        };
        PrefetchProgress {
            bytes_done: self.shared.done.load(Ordering::Relaxed),
            bytes_total: self.shared.total,
            bytes_reread: self.shared.reread.load(Ordering::Relaxed),
            state,
        }
    }

    /// Block until the thread has finished or stopped. A read-ahead that
    /// follows the first pass waits for the pass, so waiting for it would
    /// never end: its progress is returned at once.
    pub(crate) fn wait(&self) -> PrefetchProgress {
        if self.shared.follows_pass.load(Ordering::Relaxed) {
            return self.progress();
        }
        let mut f = self
            .shared
            .finished
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while !*f {
            f = self.shared.cv.wait(f).unwrap_or_else(|e| e.into_inner());
        }
        drop(f);
        self.progress()
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if self.pid != std::process::id() {
            // A child after fork: the thread is the parent's. Joined here,
            // one the fork caught running never ends in the child, and
            // std panics ("threads should not terminate unexpectedly").
            std::mem::forget(self.handle.take());
            return;
        }
        if let Some(h) = self.handle.take() {
            // The thread checks the flag between chunks of CHUNK bytes, so
            // this waits for at most one chunk's read.
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::plan_prefetch;
    use super::super::Prefetch;
    use super::*;
    use std::io::Write;

    fn mapped_file(len: usize) -> (tempfile::NamedTempFile, Arc<Mapping>) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; len]).unwrap();
        f.flush().unwrap();
        // SAFETY: the temporary file is not changed while mapped.
        let map = unsafe { Mapping::map(f.as_file()) }.unwrap();
        (f, Arc::new(map))
    }

    /// All of `map`, read in base pages, not re-read, as `decision` says,
    /// against a budget that `budget` reads.
    fn whole(map: &Mapping, decision: PrefetchDecision, budget: MemReader) -> PrefetchTask {
        PrefetchTask {
            decision,
            ranges: vec![(0, map.len())],
            in_order: vec![(0, map.len())],
            huge_pages: false,
            reread: false,
            budget,
            progress: None,
        }
    }

    /// A background prefetch of all of `map`, planned against a budget
    /// that stays `budget`, and started.
    fn start_with(
        map: &Arc<Mapping>,
        max_percent: u8,
        budget: Option<u64>,
    ) -> (Option<Prefetcher>, PrefetchDecision) {
        let asked = Prefetch::Background { max_percent };
        let decision = plan_prefetch(asked, map.len() as u64, budget, false);
        Prefetcher::start(map, whole(map, decision, Arc::new(move || budget))).unwrap()
    }

    #[test]
    fn the_policy_follows_the_injected_available_memory() {
        let (_f, map) = mapped_file(3 * CHUNK);
        let len = map.len();
        // 3 chunks against 4 chunks available at 50%: too large to read
        // ahead whole, so the read-ahead follows the pass within a chunk
        // (half of the 50% share).
        let (p, d) = start_with(&map, 50, Some(4 * CHUNK as u64));
        if PageMap::open().is_err() {
            // No page map to follow a pass by (Windows, macOS): skipped,
            // and the report says why.
            assert!(p.is_none());
            assert!(
                matches!(&d, PrefetchDecision::Skipped(SkipReason::Spawn { error })
                    if error.starts_with("no page map to follow the first pass")),
                "{d:?}"
            );
            return;
        }
        assert!(p.is_some());
        assert!(
            matches!(d, PrefetchDecision::Windowed { bytes, budget, window }
                if bytes == len as u64 && budget == 4 * CHUNK as u64 && window == CHUNK as u64),
            "{d:?}"
        );
        drop(p);
        let (p, d) = start_with(&map, 50, None);
        assert!(p.is_none());
        assert_eq!(d, PrefetchDecision::Skipped(SkipReason::MemoryUnknown));
        // Against 8 chunks it fits and runs to the end.
        let (p, d) = start_with(&map, 50, Some(8 * CHUNK as u64));
        assert_eq!(d.name(), "background");
        let p = p.unwrap();
        let done = p.wait();
        assert_eq!(done.state, PrefetchState::Finished);
        assert_eq!(done.bytes_done, len as u64);
    }

    /// A read-ahead thread that first runs when the pass is already far
    /// ahead (a loaded machine schedules it late) drops what is a window
    /// behind the pass and never reads it back.
    #[test]
    fn a_late_read_ahead_reads_nothing_behind_the_pass() {
        let test = "a_late_read_ahead_reads_nothing_behind_the_pass";
        let (f, map) = mapped_file(6 * CHUNK);
        // Observable where the file's pages can be dropped (synced first:
        // dirty pages stay) and there is a page map to follow the pass by.
        f.as_file().sync_all().unwrap();
        let dropped = crate::os::evict(f.path()).is_ok()
            && map.residency(0, map.len()).unwrap().resident_pages == 0;
        if !dropped || PageMap::open().is_err() {
            println!("{test}: skipped: no page map, or the page cache cannot be dropped here");
            return;
        }
        // The pass has mapped 5 of the 6 chunks before the thread starts.
        map.populate_read(0, 5 * CHUNK).unwrap();
        let decision = PrefetchDecision::Windowed {
            bytes: map.len() as u64,
            budget: 4 * CHUNK as u64,
            window: CHUNK as u64,
        };
        let task = whole(&map, decision, Arc::new(|| None));
        let (p, d) = Prefetcher::start_windowed(&map, task, CHUNK as u64);
        assert_eq!(d.name(), "windowed");
        // It drops up to a window behind the pass's front...
        let far_behind = |m: &Mapping| m.residency(0, 3 * CHUNK).unwrap().fraction();
        let t0 = std::time::Instant::now();
        while far_behind(&map) > 0.0 && t0.elapsed() < std::time::Duration::from_secs(20) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // ...and, waiting for the pass to move on, reads none of it back.
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(far_behind(&map), 0.0);
        drop(p);
    }

    #[test]
    fn it_stops_when_memory_stops_fitting() {
        use std::sync::atomic::AtomicUsize;
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        // Plenty at the start, nothing at the first re-check.
        fn shrinking() -> Option<u64> {
            match CALLS.fetch_add(1, Ordering::SeqCst) {
                0 => Some(u64::MAX / 200),
                _ => Some(0),
            }
        }
        let (_f, map) = mapped_file(RECHECK + 2 * CHUNK);
        let len = map.len();
        let decision = plan_prefetch(Prefetch::DEFAULT, len as u64, shrinking(), false);
        let task = whole(&map, decision, Arc::new(shrinking));
        let (p, _) = Prefetcher::start(&map, task).unwrap();
        let done = p.unwrap().wait();
        assert_eq!(done.state, PrefetchState::StoppedForMemory);
        assert!(done.bytes_done >= RECHECK as u64 && done.bytes_done < len as u64);
    }

    #[test]
    fn a_child_after_fork_leaves_the_parents_thread_unjoined() {
        // As a child after fork sees it: a prefetch started in another
        // process, whose thread the fork caught running (blocked here).
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let (p, _) =
            Prefetcher::spawn(Arc::new(Shared::new(1)), PrefetchDecision::Off, move |_| {
                let _ = blocked.recv();
                FINISHED
            });
        let mut p = p.expect("the thread starts");
        p.pid = p.pid.wrapping_add(1);
        let (dropped, done) = std::sync::mpsc::channel();
        let dropper = std::thread::spawn(move || {
            drop(p);
            dropped.send(()).unwrap();
        });
        let returned = done.recv_timeout(std::time::Duration::from_secs(10));
        release.send(()).unwrap();
        dropper.join().unwrap();
        assert!(
            returned.is_ok(),
            "the drop waited for another process's thread"
        );
    }

    #[test]
    fn drop_stops_and_joins_the_thread() {
        let (_f, map) = mapped_file(4 * CHUNK);
        let (p, _) = start_with(&map, 100, Some(u64::MAX / 200));
        let p = p.unwrap();
        let shared = Arc::clone(&p.shared);
        drop(p);
        // Joined: the thread has set its final state, and it held the last
        // other reference to `shared` and to the mapping.
        assert_ne!(shared.state.load(Ordering::Acquire), RUNNING);
        assert_eq!(Arc::strong_count(&shared), 1);
        assert_eq!(Arc::strong_count(&map), 1);
    }
}
