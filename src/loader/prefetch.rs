//! Getting mapped weights ready to compute on: access advice per tensor and
//! a background prefetcher.
//!
//! A mapped load reads nothing but the header; every tensor page is read on
//! its first touch. From a cold page cache, what that first pass costs is
//! decided by the access advice on the pages: under `MADV_RANDOM` every first
//! touch is one synchronous 4 KiB read (one per page of the region), under
//! `MADV_NORMAL` the kernel reads ahead around each fault, and the same pass
//! takes a small fraction of the time (BENCHMARKS.md, "Ready time: access
//! advice on the first pass"). So weightmap's defaults are:
//!
//! - [`AdvicePolicy::PerTensor`]: `MADV_NORMAL` over the tensor region, and
//!   `MADV_RANDOM` only on the whole pages of tables read by row (an untied
//!   token embedding, per-layer token embeddings; see [`is_row_lookup`]),
//!   where read-ahead would pull in rows no lookup needs.
//! - [`Prefetch::Background`]: once the file has been validated, a thread
//!   reads the tensor region in file order, a few chunks ahead of where it
//!   maps pages, while `load` returns at once. It reads only when the region
//!   fits in the stated share of the memory the kernel says is available, it
//!   re-checks as it goes, and it stops when the weights drop.
//!
//! When the region does not fit in that share of the memory budget (a
//! memory cgroup smaller than the model), reading it all ahead would only
//! evict what was read before the first pass gets there. The region is then
//! advised `MADV_HUGEPAGE` ([`PrefetchDecision::HugePages`]): the pass's own
//! faults read ahead in 2 MiB folios, which the cgroup reclaims whole. Where
//! the kernel refuses that, or the caller chose the advice for the whole
//! region, the prefetch follows the pass ([`PrefetchDecision::Windowed`]): it queues
//! reads (`MADV_WILLNEED`) at most a window ahead of the first page the pass
//! has not yet mapped (told by `/proc/self/pagemap`), the window being half
//! the prefetch's share of the budget, and drops the pages more than a
//! window behind it, so the pass finds its pages read, the page cache holds
//! about a window on either side of it, and the cgroup never has to reclaim
//! mapped pages one by one.
//!
//! llama.cpp, by default, reads the whole file before its load returns
//! (`MAP_POPULATE` plus `MADV_WILLNEED`, whatever memory is free; its
//! llama-mmap.cpp), and uses `MADV_RANDOM` only with `--numa` and on tensors
//! over 4 GiB read by row. weightmap keeps the load itself at header cost and
//! does not prefetch what does not fit.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::read::ProgressFn;
use crate::format::Header;
use crate::os::{AccessAdvice, Mapping, PageMap};

/// Reading the mapped tensor region ahead of use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prefetch {
    /// No prefetch: pages are read as tensors are first used.
    None,
    /// A background thread reads the region in file order after validation,
    /// while `load` returns; it starts only if the region is at most
    /// `max_percent` of the memory budget (the least of `MemAvailable` and
    /// every memory cgroup limit less its usage, [`crate::Budget`]), stops if
    /// that stops being true, and stops when the
    /// weights drop. The default, with 50%.
    Background {
        /// The largest share of available memory, in percent, that the
        /// region may be for the prefetch to run.
        max_percent: u8,
    },
    /// `MADV_WILLNEED` over the region before returning: the reads are
    /// queued, and for a large file the call blocks until most are issued.
    WillNeed,
    /// Read and map every page before returning, whatever the memory: no
    /// first-touch faults afterwards (llama.cpp's `MAP_POPULATE`).
    Populate,
}

impl Prefetch {
    /// The default: [`Prefetch::Background`] with 50%.
    pub const DEFAULT: Prefetch = Prefetch::Background { max_percent: 50 };
}

impl Default for Prefetch {
    fn default() -> Self {
        Prefetch::DEFAULT
    }
}

/// Access advice for the mapped tensor region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AdvicePolicy {
    /// `MADV_NORMAL` over the region, `MADV_RANDOM` on the tensors
    /// read by row (the default): per-layer token embeddings, and a token
    /// embedding when the model has a separate output matrix.
    #[default]
    PerTensor,
    /// The same advice over the whole region (`Uniform(Random)` was
    /// weightmap's default before 0.2; it makes a cold first pass read one
    /// page per fault).
    Uniform(AccessAdvice),
}

/// Whether the tensor `name`, in a model whose tensor names are `names`, is
/// a table that runtimes read by row, so that read-ahead around a lookup
/// reads rows nobody needs: per-layer token embeddings always, and a token
/// embedding when the model has a separate output projection (`output.weight`
/// or `lm_head.weight`). A tied embedding is also the output matrix, read
/// whole for every token's logits, so it is not a lookup table.
pub(crate) fn is_row_lookup<'a>(name: &str, names: impl IntoIterator<Item = &'a str>) -> bool {
    const PER_LAYER: [&str; 2] = [
        "per_layer_token_embd.weight",
        "embed_tokens_per_layer.weight",
    ];
    const EMBEDDING: [&str; 5] = [
        "token_embd.weight",
        "embed_tokens.weight",
        "tok_embeddings.weight",
        "wte.weight",
        "word_embeddings.weight",
    ];
    if PER_LAYER.iter().any(|s| name.ends_with(s)) {
        return true;
    }
    EMBEDDING.iter().any(|s| name.ends_with(s))
        && names
            .into_iter()
            .any(|n| n == "output.weight" || n.ends_with("lm_head.weight"))
}

/// Apply `policy` to the tensor region `[start, end)` of `map`; returns the
/// indices of the tensors advised `MADV_RANDOM`. Advice is advisory: its
/// failure is ignored, as llama.cpp only warns.
pub(crate) fn apply_advice(
    map: &Mapping,
    header: &Header,
    policy: AdvicePolicy,
    start: usize,
    end: usize,
) -> Vec<usize> {
    match policy {
        AdvicePolicy::Uniform(a) => {
            let _ = map.advise(a, start, end);
            Vec::new()
        }
        AdvicePolicy::PerTensor => {
            let tensors = header.tensors();
            let names = || tensors.iter().map(|t| t.name);
            let lookups: Vec<usize> = (0..tensors.len())
                .filter(|&i| is_row_lookup(tensors.name(i), names()))
                .collect();
            // MADV_NORMAL is a fresh mapping's advice already; only the
            // lookup tables need a call (whole pages only: a page shared
            // with a neighbour keeps read-ahead).
            for &i in &lookups {
                let r = tensors.file_range(i);
                let _ = map.advise_inward(AccessAdvice::Random, r.start as usize, r.end as usize);
            }
            lookups
        }
    }
}

/// Advise the tensor region `[start, end)` of `map` `MADV_HUGEPAGE` under
/// [`AdvicePolicy::PerTensor`], in one call (so that the mapping is not cut
/// into a piece per tensor); returns whether the kernel took it.
///
/// Only once the header is read: its first fault's read-ahead (the
/// device's read-ahead size, 8 MiB here) then comes in base pages, the
/// first tensors with it. Read in huge pages, the header would share a
/// 2 MiB folio with the first tensor, and that folio would stay cached as
/// long as the header is mapped, even when every tensor is uploaded to a
/// device and dropped from the host (`tests/budget.rs`).
///
/// Decode reads every weight per token, and how fast it reads them depends
/// on the pages behind them (ARCHITECTURE.md, "Huge pages for the
/// weights", with the kernel functions and the figures). How the page cache is filled decides its folio size, and it
/// outlives the process: under this advice every fault in the region, the
/// prefetch's and the runtime's own, reads PMD-size folios (Linux 5.18+;
/// whole in the cache on ext4 6.16+ and XFS), where `MADV_WILLNEED` reads
/// base pages. Advice the caller chose for the whole region
/// ([`AdvicePolicy::Uniform`]) is left as it is.
pub(crate) fn advise_huge_pages(
    map: &Mapping,
    policy: AdvicePolicy,
    start: usize,
    end: usize,
) -> bool {
    policy == AdvicePolicy::PerTensor && start < end && map.read_in_huge_pages(start, end)
}

/// What the prefetch policy did at load time.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrefetchDecision {
    /// [`Prefetch::None`].
    Off,
    /// The stream path ran: the bytes are already in owned memory.
    NotMapped,
    /// `MADV_WILLNEED` was issued over the region ([`Prefetch::WillNeed`]).
    WillNeed {
        /// Bytes of the region.
        bytes: u64,
    },
    /// The region was read and mapped before the load returned
    /// ([`Prefetch::Populate`]).
    Populated {
        /// Bytes of the region.
        bytes: u64,
    },
    /// A background thread is reading the region in file order; see
    /// `Weights::prefetch_progress`.
    Background {
        /// Bytes of the region.
        bytes: u64,
        /// The memory budget when it started.
        budget: u64,
        /// The limit it was held to, in percent of `budget`.
        max_percent: u8,
    },
    /// The region does not fit in the budget's share: a background thread
    /// reads ahead of the first pass, at most `window` bytes ahead of the
    /// first page the pass has not mapped yet.
    Windowed {
        /// Bytes of the region.
        bytes: u64,
        /// The memory budget when it started.
        budget: u64,
        /// How far ahead of the pass reads are queued.
        window: u64,
    },
    /// The region does not fit in the budget's share, and the kernel reads
    /// it in huge-page folios (`MADV_HUGEPAGE`): no thread, the first
    /// pass's own faults read ahead in 2 MiB folios, which the memory
    /// cgroup reclaims whole.
    HugePages {
        /// Bytes of the region.
        bytes: u64,
        /// The memory budget when the load decided.
        budget: u64,
    },
    /// [`Prefetch::Background`] was asked for and did not start.
    Skipped(SkipReason),
}

/// Why a background prefetch did not start.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// The region is more than `max_percent` of the memory budget.
    TooLarge {
        /// Bytes of the region.
        bytes: u64,
        /// The memory budget.
        budget: u64,
        /// The limit, in percent.
        max_percent: u8,
    },
    /// The memory budget could not be read (no `/proc`).
    MemoryUnknown,
    /// The thread could not be started.
    Spawn {
        /// The OS error.
        error: String,
    },
}

impl PrefetchDecision {
    /// A short, stable name: `"off"`, `"not_mapped"`, `"willneed"`,
    /// `"populated"`, `"background"`, `"windowed"`, `"huge_pages"`,
    /// `"skipped"`.
    pub fn name(&self) -> &'static str {
        match self {
            PrefetchDecision::Off => "off",
            PrefetchDecision::NotMapped => "not_mapped",
            PrefetchDecision::WillNeed { .. } => "willneed",
            PrefetchDecision::Populated { .. } => "populated",
            PrefetchDecision::Background { .. } => "background",
            PrefetchDecision::Windowed { .. } => "windowed",
            PrefetchDecision::HugePages { .. } => "huge_pages",
            PrefetchDecision::Skipped(_) => "skipped",
        }
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

impl fmt::Display for PrefetchDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefetchDecision::Off => write!(f, "off"),
            PrefetchDecision::NotMapped => write!(f, "not mapped (stream path)"),
            PrefetchDecision::WillNeed { bytes } => write!(f, "willneed over {}", mib(*bytes)),
            PrefetchDecision::Populated { bytes } => {
                write!(f, "populated {} before returning", mib(*bytes))
            }
            PrefetchDecision::Background {
                bytes,
                budget,
                max_percent,
            } => write!(
                f,
                "background: reading {} in file order (memory budget {}, limit {max_percent}%)",
                mib(*bytes),
                mib(*budget)
            ),
            PrefetchDecision::Windowed {
                bytes,
                budget,
                window,
            } => write!(
                f,
                "windowed: reading {} at most {} ahead of the first pass (memory budget {})",
                mib(*bytes),
                mib(*window),
                mib(*budget)
            ),
            PrefetchDecision::HugePages { bytes, budget } => write!(
                f,
                "huge pages: {} read by the first pass in 2 MiB folios (memory budget {})",
                mib(*bytes),
                mib(*budget)
            ),
            PrefetchDecision::Skipped(r) => write!(f, "skipped: {r}"),
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::TooLarge {
                bytes,
                budget,
                max_percent,
            } => write!(
                f,
                "{} is over {max_percent}% of the memory budget ({})",
                mib(*bytes),
                mib(*budget)
            ),
            SkipReason::MemoryUnknown => write!(f, "memory budget unknown"),
            SkipReason::Spawn { error } => write!(f, "cannot start a thread: {error}"),
        }
    }
}

/// Whether a background prefetch of `bytes` may run within a memory budget of `budget`
/// bytes available and a limit of `max_percent`: `Ok(available)`, or why
/// not.
pub(crate) fn decide(bytes: u64, budget: Option<u64>, max_percent: u8) -> Result<u64, SkipReason> {
    let avail = budget.ok_or(SkipReason::MemoryUnknown)?;
    if fits(bytes, avail, max_percent) {
        Ok(avail)
    } else {
        Err(SkipReason::TooLarge {
            bytes,
            budget: avail,
            max_percent,
        })
    }
}

fn fits(bytes: u64, avail: u64, max_percent: u8) -> bool {
    u128::from(bytes) * 100 <= u128::from(avail) * u128::from(max_percent)
}

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

/// Reads the memory the process may still use, in bytes (the load's
/// budget, re-read as the prefetch runs).
pub(crate) type MemReader = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

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

/// How much a windowed read-ahead queues at a time, and the step at which
/// it looks for the first pass's front.
const STEP: usize = 2 << 20;
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
    let mut behind = Behind::new(ranges);
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
                        Ok(true) => front = (front + STEP).min(re),
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
            let n = STEP.min(end - pos);
            map.will_need(pos, pos + n);
            pos += n;
            done += n as u64;
            shared.done.store(done, Ordering::Relaxed);
        }
    }
    FINISHED
}

/// Pages behind a first pass, dropped a batch at a time.
struct Behind {
    /// Dropped up to here (an offset in the map), in `ranges[range]`.
    at: usize,
    range: usize,
}

impl Behind {
    /// Bytes dropped per call at least: a call costs a drain of every
    /// CPU's page lists.
    const BATCH: usize = 8 << 20;

    fn new(ranges: &[(usize, usize)]) -> Behind {
        Behind {
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
                // From a huge page back: a large folio (the pass's own
                // faults read them) goes only when a drop covers all of it,
                // and the last batch ended inside one.
                let from = self.at.saturating_sub(crate::os::huge_page()).max(rs);
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

fn total_of(ranges: &[(usize, usize)]) -> u64 {
    ranges.iter().map(|r| (r.1 - r.0) as u64).sum()
}

/// Read and map `ranges` in the calling thread ([`Prefetch::Populate`]),
/// in huge pages when they are advised so (`huge`), then, if asked
/// (`reread`), re-read what the page cache held in small folios; false if
/// `progress` cancelled it.
pub(crate) fn populate(
    map: &Mapping,
    ranges: &[(usize, usize)],
    huge: bool,
    reread: bool,
    progress: Option<&ProgressFn>,
) -> bool {
    let shared = Shared::new(total_of(ranges));
    let state = read_in_order(map, ranges, huge, &shared, None, progress);
    if state == FINISHED && reread && huge {
        reread_small_folios(map, ranges, || false);
    }
    state != STOPPED_CANCEL
}

/// Drop and read again, in huge-page folios, each of `ranges` (advised
/// `MADV_HUGEPAGE`, read and mapped) that this process maps mostly in base
/// pages: the page cache held it in small folios before the load (another
/// process filled it), which a fault under the advice does not change.
/// Returns the bytes re-read; stops early when `stop` says so. What another
/// process still maps cannot be dropped, and stays as it is.
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
        // A quarter of what could be huge, at least one huge page: the
        // ragged ends of a range and a neighbour's page are not worth a read.
        if small < (capacity as u64 / 4).max(crate::os::huge_page() as u64) {
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

/// The mapped tensor region a prefetch reads.
#[derive(Debug)]
pub(crate) struct Region {
    /// Sorted, disjoint ranges of the mapping.
    pub(crate) ranges: Vec<(usize, usize)>,
    /// The same without the tables read by row: what a first pass goes
    /// through in order.
    pub(crate) in_order: Vec<(usize, usize)>,
    /// Whether the region is advised `MADV_HUGEPAGE` ([`advise_huge_pages`]):
    /// it is then read in PMD-size folios, by the prefetch as by the first
    /// pass's own faults.
    pub(crate) huge_pages: bool,
    /// Re-read what the page cache held in small folios, once read
    /// ([`crate::LoadOptions::reread_small_folios`]).
    pub(crate) reread: bool,
}

/// A background prefetch of a mapping's tensor region, stopped and joined on
/// drop: no thread outlives it and nothing is read after it drops.
#[derive(Debug)]
pub(crate) struct Prefetcher {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// Decide against `budget` (the load's, read when it started) and, if
    /// the region (`region.ranges`) fits, start the thread, which re-reads the
    /// budget with `mem` as it goes; if it does not fit, follow the first
    /// pass through `in_order` (the region without the tables read by row,
    /// which a pass does not go through in order).
    pub(crate) fn start(
        map: &Arc<Mapping>,
        region: Region,
        max_percent: u8,
        budget: Option<u64>,
        mem: MemReader,
        progress: Option<ProgressFn>,
    ) -> (Option<Prefetcher>, PrefetchDecision) {
        let Region {
            ranges,
            in_order,
            huge_pages,
            reread,
        } = region;
        let bytes = total_of(&ranges);
        let avail = match decide(bytes, budget, max_percent) {
            Ok(a) => a,
            Err(SkipReason::TooLarge { budget, .. }) => {
                // Faults in huge-page folios read ahead on their own, and
                // the cgroup reclaims such folios whole, where the windowed
                // read-ahead's 4 KiB folios cost it a reverse-map walk and
                // a TLB flush each (BENCHMARKS.md, "Under a memory limit").
                if huge_pages && !ranges.is_empty() {
                    return (None, PrefetchDecision::HugePages { bytes, budget });
                }
                return Prefetcher::start_windowed(map, ranges, in_order, budget, max_percent);
            }
            Err(r) => return (None, PrefetchDecision::Skipped(r)),
        };
        let shared = Arc::new(Shared::new(bytes));
        let m = Arc::clone(map);
        let decision = PrefetchDecision::Background {
            bytes,
            budget: avail,
            max_percent,
        };
        Prefetcher::spawn(shared, decision, move |s| {
            let state = read_in_order(
                &m,
                &ranges,
                huge_pages,
                s,
                Some((mem, max_percent)),
                progress.as_ref(),
            );
            if state == FINISHED && reread && huge_pages {
                let n = reread_small_folios(&m, &ranges, || s.stop.load(Ordering::Relaxed));
                s.reread.store(n, Ordering::Relaxed);
            }
            state
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

    /// A read-ahead of `ranges` that follows the first pass through
    /// `follow` ([`read_ahead_of_pass`]), half of `max_percent` of `budget`
    /// ahead of it.
    fn start_windowed(
        map: &Arc<Mapping>,
        ranges: Vec<(usize, usize)>,
        follow: Vec<(usize, usize)>,
        budget: u64,
        max_percent: u8,
    ) -> (Option<Prefetcher>, PrefetchDecision) {
        let bytes = total_of(&ranges);
        // Half the prefetch's share: the pass's own pages, and what the
        // kernel has not yet reclaimed behind it, take the rest.
        let window = (u128::from(budget) * u128::from(max_percent) / 200) as u64;
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
        let shared = Arc::new(Shared::new(bytes));
        shared.follows_pass.store(true, Ordering::Relaxed);
        let m = Arc::clone(map);
        let w = usize::try_from(window).unwrap_or(usize::MAX);
        let decision = PrefetchDecision::Windowed {
            bytes,
            budget,
            window,
        };
        Prefetcher::spawn(shared, decision, move |s| {
            read_ahead_of_pass(&m, &ranges, &follow, s, w, &pages)
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
        if let Some(h) = self.handle.take() {
            // The thread checks the flag between chunks of CHUNK bytes, so
            // this waits for at most one chunk's read.
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_embedding_is_a_row_lookup_only_when_untied() {
        let untied = ["token_embd.weight", "blk.0.attn_q.weight", "output.weight"];
        assert!(is_row_lookup("token_embd.weight", untied));
        let tied = ["token_embd.weight", "blk.0.attn_q.weight"];
        assert!(!is_row_lookup("token_embd.weight", tied));
        assert!(is_row_lookup("per_layer_token_embd.weight", tied));
        assert!(!is_row_lookup("blk.0.attn_q.weight", untied));
    }

    #[test]
    fn a_prefetch_runs_only_within_its_share_of_known_memory() {
        assert_eq!(decide(400, Some(1000), 50), Ok(1000));
        assert!(matches!(
            decide(600, Some(1000), 50),
            Err(SkipReason::TooLarge { .. })
        ));
        assert_eq!(decide(1, None, 50), Err(SkipReason::MemoryUnknown));
    }
    use std::io::Write;

    fn mapped_file(len: usize) -> (tempfile::NamedTempFile, Arc<Mapping>) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; len]).unwrap();
        f.flush().unwrap();
        // SAFETY: the temporary file is not changed while mapped.
        let map = unsafe { Mapping::map(f.as_file()) }.unwrap();
        (f, Arc::new(map))
    }

    /// A prefetch of all of `map` held to a budget that stays `budget`.
    fn start_with(
        map: &Arc<Mapping>,
        max_percent: u8,
        budget: Option<u64>,
    ) -> (Option<Prefetcher>, PrefetchDecision) {
        let ranges = vec![(0, map.len())];
        Prefetcher::start(
            map,
            Region {
                in_order: ranges.clone(),
                ranges,
                huge_pages: false,
                reread: false,
            },
            max_percent,
            budget,
            Arc::new(move || budget),
            None,
        )
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
        let (p, _) = Prefetcher::start(
            &map,
            Region {
                ranges: vec![(0, len)],
                in_order: vec![(0, len)],
                huge_pages: false,
                reread: false,
            },
            50,
            shrinking(),
            Arc::new(shrinking),
            None,
        );
        let done = p.unwrap().wait();
        assert_eq!(done.state, PrefetchState::StoppedForMemory);
        assert!(done.bytes_done >= RECHECK as u64 && done.bytes_done < len as u64);
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
