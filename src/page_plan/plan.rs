//! [`PagePlan`]: the page-size decisions of a mapped load, made once,
//! before any page of a tensor is read; and the rules that every other
//! reader and owner of pages follows (a [`Pass`](crate::Pass), the shards of
//! a split model, owned CPU buffers), so that each is decided here only.

use std::sync::Arc;

use crate::error::Result;
use crate::format::Header;
use crate::os::{huge_page, AccessAdvice, Mapping};

use super::choices::{AdvicePolicy, Prefetch, PrefetchDecision, ProgressFn};
use super::choices::{Reread, RereadRefusal, ResidencyPlan, SkipReason};
use super::residency::{exceeds_budget, expert_capacity};

/// Reads the memory the process may still use, in bytes (the load's
/// budget, re-read as the prefetch runs).
pub(crate) type MemReader = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

/// What the load options ask of the plan.
#[derive(Clone)]
pub(crate) struct PlanOptions {
    /// [`LoadOptions::advice`](crate::LoadOptions::advice).
    pub(crate) advice: AdvicePolicy,
    /// [`LoadOptions::prefetch`](crate::LoadOptions::prefetch).
    pub(crate) prefetch: Prefetch,
    /// [`LoadOptions::reread_small_folios`](crate::LoadOptions::reread_small_folios).
    pub(crate) reread: bool,
    /// [`LoadOptions::progress`](crate::LoadOptions::progress): told how a
    /// populate or a background prefetch goes, and may cancel it.
    pub(crate) progress: Option<ProgressFn>,
    /// For one file of a model in several, the tensors read whole that
    /// stream, chosen for the whole model ([`streamed_across`]); `None`:
    /// chosen here, for this file alone.
    pub(crate) streamed: Option<Vec<usize>>,
}

/// The page-size decisions of one mapped load.
pub(crate) struct PagePlan {
    /// The tensors advised `MADV_RANDOM`, sorted.
    pub(crate) random_access: Vec<usize>,
    /// The tensors read whole that stream through the budget
    /// ([`streamed_whole`]), advised `MADV_SEQUENTIAL`, sorted.
    pub(crate) streamed: Vec<usize>,
    /// Whether the prefetch re-reads small folios once it has mapped the
    /// region, or why not.
    pub(crate) reread: Reread,
    /// What the prefetcher is to do, handed to it whole once every tensor
    /// is placed.
    pub(crate) prefetch: PrefetchTask,
    /// Bytes of the mapped tensors read whole, and of the expert tensors
    /// ([`is_expert_tensor`]), for [`plan_residency`].
    pub(crate) whole_and_expert_bytes: (u64, u64),
}

/// The one value the prefetcher
/// ([`Prefetcher::start`](super::prefetch::Prefetcher::start)) is handed:
/// what to do and over which bytes.
pub(crate) struct PrefetchTask {
    /// What to do, decided against the budget.
    pub(crate) decision: PrefetchDecision,
    /// The mapped tensors' ranges of the mapping, sorted and disjoint.
    pub(crate) ranges: Vec<(usize, usize)>,
    /// The same without the tables read by row: what a first pass goes
    /// through in order.
    pub(crate) in_order: Vec<(usize, usize)>,
    /// Whether the region is advised `MADV_HUGEPAGE`: it is then read in
    /// huge-page folios, by the prefetch as by the first pass's own faults.
    pub(crate) huge_pages: bool,
    /// Re-read what the page cache held in small folios, once read.
    pub(crate) reread: bool,
    /// The budget as a background prefetch re-reads it while it runs.
    pub(crate) budget: MemReader,
    /// Told how a populate or a background read goes.
    pub(crate) progress: Option<ProgressFn>,
}

impl PagePlan {
    /// Advise the tensor region of `map` as `asked`, and decide the
    /// prefetch of the `mapped` tensors (those that stay in the mapping)
    /// against `budget` (bytes when the load started; `None`: unreadable),
    /// which a background prefetch re-reads with `reader`.
    pub(crate) fn advise(
        map: &Mapping,
        header: &Header,
        mapped: impl Iterator<Item = usize> + Clone,
        asked: PlanOptions,
        budget: Option<u64>,
        reader: MemReader,
    ) -> Result<PagePlan> {
        let (start, end) = header.tensor_region();
        let (start, end) = (start as usize, end as usize);
        let random_access = advise_access(map, header, asked.advice, start, end);
        let huge_pages = advise_huge_pages(map, asked.advice, start, end);
        let ranges = mapped_ranges(header, mapped.clone(), &[])?;
        let tensors = header.tensors();
        let whole_and_expert_bytes = mapped.clone().fold((0, 0), |(w, e), i| {
            let t = tensors.at(i);
            match is_expert_tensor(&t) {
                true => (w, e + t.nbytes),
                false => (w + t.nbytes, e),
            }
        });
        let streamed = match (asked.advice, &asked.streamed) {
            (AdvicePolicy::Uniform(_), _) => Vec::new(),
            (AdvicePolicy::PerTensor, Some(chosen)) => {
                let mapped: Vec<usize> = mapped.clone().collect();
                let mut kept = chosen.clone();
                kept.retain(|i| mapped.contains(i));
                kept
            }
            (AdvicePolicy::PerTensor, None) => {
                let whole = whole_and_expert_bytes.0;
                streamed_whole(header, mapped.clone(), &random_access, budget, whole)
            }
        };
        for &i in &streamed {
            let r = tensors.file_range(i);
            let _ = map.advise_inward(AccessAdvice::Sequential, r.start as usize, r.end as usize);
        }
        let in_order = mapped_ranges(header, mapped, &random_access)?;
        let decision = plan_prefetch(asked.prefetch, total_of(&ranges), budget, huge_pages);
        let reread = plan_reread(&asked, huge_pages, &decision);
        Ok(PagePlan {
            random_access,
            streamed,
            prefetch: PrefetchTask {
                decision,
                ranges,
                in_order,
                huge_pages,
                reread: reread == Reread::On,
                budget: reader,
                progress: asked.progress,
            },
            reread,
            whole_and_expert_bytes,
        })
    }
}

/// The advice [`PagePlan::advise`] gave `map` at load, given again, so
/// that a runtime's own mapping of the file followed since
/// ([`Mapping::follow`]) receives it too: huge pages over the tensor
/// region where the load gave them (`huge_pages`), unless expert slices
/// stream ([`ResidencyPlan::StreamExperts`]), then the lookup tables read by row
/// (`random_access`) and the tensors read whole that stream (`streamed`).
/// In huge pages, a fault that misses reads two huge pages, whole, where
/// in base pages it reads one read-ahead window; where expert slices
/// stream they gained nothing clear, and a huge folio at a dense tensor's
/// edge would hold expert bytes no release drops (BENCHMARKS.md,
/// "llama.cpp's pages in huge pages"). The region's access advice is not
/// repeated: it only undoes the kernel's default, which the runtime chose
/// for its own mapping.
pub(crate) fn advise_tensors_again(
    map: &Mapping,
    header: &Header,
    huge_pages: bool,
    residency: &ResidencyPlan,
    random_access: &[usize],
    streamed: &[usize],
) {
    if huge_pages && !matches!(residency, ResidencyPlan::StreamExperts { .. }) {
        let (start, end) = header.tensor_region();
        map.read_in_huge_pages(start as usize, end as usize);
    }
    let tensors = header.tensors();
    let advised = [
        (random_access, AccessAdvice::Random),
        (streamed, AccessAdvice::Sequential),
    ];
    for (which, advice) in advised {
        for &i in which {
            let r = tensors.file_range(i);
            let _ = map.advise_inward(advice, r.start as usize, r.end as usize);
        }
    }
}

/// Whether a tensor holds a mixture of experts' weights, which a runtime
/// reads an expert's slice at a time: ggml's `ffn_*_exps` tensors, whose
/// outermost dimension counts experts.
pub(crate) fn is_expert_tensor(t: &crate::tensor::TensorInfo<'_>) -> bool {
    t.experts() > 0 && t.name.contains("_exps")
}

/// What stays resident of `whole` bytes of tensors read whole and
/// `experts` bytes of expert tensors, mapped, under `budget` (bytes;
/// `None`: unknown).
pub(crate) fn plan_residency(budget: Option<u64>, whole: u64, experts: u64) -> ResidencyPlan {
    let mapped = whole.saturating_add(experts);
    match budget {
        Some(budget) if exceeds_budget(Some(budget), mapped) => {
            match expert_capacity(Some(budget), whole) {
                capacity if experts > 0 && capacity > 0 => ResidencyPlan::StreamExperts {
                    whole,
                    experts,
                    expert_capacity: capacity,
                    budget,
                },
                _ => ResidencyPlan::StreamAll { mapped, budget },
            }
        }
        _ => ResidencyPlan::Fits,
    }
}

/// The tensors read whole (not experts, not the row-lookup tables
/// `lookups`, sorted) of `mapped`, `whole` bytes with the lookup tables,
/// that stream through the page cache where together they exceed `budget`
/// less the runtime's reserve
/// ([`ResidencyPlan::StreamAll`]): the largest first, until the rest fits.
/// A decode step reads each of them from start to end and none of them can
/// stay, so they are advised `MADV_SEQUENTIAL`: their faults read ahead in
/// large pieces, and, as Linux gives a sequential mapping's pages no
/// recency (`vma_has_recency` in `include/linux/mm_inline.h`), reclaim
/// takes them before the tensors that stay. On gemma-3-270m, whose output
/// matrix is its 170 MiB token embedding, in a cgroup of 121 MiB, that
/// made decode 1.42 times as fast as a plain mapping (BENCHMARKS.md,
/// "Models larger than memory").
pub(crate) fn streamed_whole(
    header: &Header,
    mapped: impl Iterator<Item = usize>,
    lookups: &[usize],
    budget: Option<u64>,
    whole: u64,
) -> Vec<usize> {
    let room = expert_capacity(budget, 0);
    // Asked first: most models fit, and a million tensors' candidates are
    // then never listed.
    if whole <= room {
        return Vec::new();
    }
    let tensors = header.tensors();
    let candidates = mapped
        .filter(|&i| lookups.binary_search(&i).is_err() && !is_expert_tensor(&tensors.at(i)))
        .map(|i| (tensors.at(i).nbytes, i))
        .collect();
    largest_until_the_rest_fits(candidates, room)
}

/// [`streamed_whole`] for a model in several files (`headers`, in shard
/// order, every tensor mapped): the choice made among the whole model's
/// tensors, as for the same model in one file, and told file by file. Each
/// file's own plan would see the whole budget and stream none of them.
pub(crate) fn streamed_across(headers: &[&Header], budget: Option<u64>) -> Vec<Vec<usize>> {
    let mut each = vec![Vec::new(); headers.len()];
    let room = expert_capacity(budget, 0);
    let read_whole = |t: &crate::tensor::TensorInfo<'_>| !is_expert_tensor(t);
    let whole = headers
        .iter()
        .flat_map(|h| h.tensors().iter().filter(read_whole).map(|t| t.nbytes))
        .fold(0u64, u64::saturating_add);
    if whole <= room {
        return each;
    }
    let mut candidates = Vec::new();
    for (k, header) in headers.iter().enumerate() {
        let tensors = header.tensors();
        let names = || tensors.iter().map(|t| t.name);
        for i in 0..tensors.len() {
            let t = tensors.at(i);
            if read_whole(&t) && !is_row_lookup(t.name, names()) {
                candidates.push((t.nbytes, (k, i)));
            }
        }
    }
    for (k, i) in largest_until_the_rest_fits(candidates, room) {
        each[k].push(i);
    }
    each
}

/// Of `candidates` (bytes, key) that do not all fit in `room`: the largest
/// first until the rest fits; sorted by key.
fn largest_until_the_rest_fits<K: Ord + Copy>(mut candidates: Vec<(u64, K)>, room: u64) -> Vec<K> {
    let mut left: u64 = candidates.iter().map(|c| c.0).sum();
    candidates.sort_unstable_by(|a, b| b.cmp(a));
    let mut streamed = Vec::new();
    for (bytes, key) in candidates {
        if left <= room {
            break;
        }
        left -= bytes;
        streamed.push(key);
    }
    streamed.sort_unstable();
    streamed
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
fn advise_access(
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
/// weights"). How the page cache is filled decides its folio size, and it
/// outlives the process: under this advice every fault in the region, the
/// prefetch's and the runtime's own, reads PMD-size folios (Linux 5.18+;
/// whole in the cache on ext4 6.16+ and XFS), where `MADV_WILLNEED` reads
/// base pages. Advice the caller chose for the whole region
/// ([`AdvicePolicy::Uniform`]) is left as it is.
fn advise_huge_pages(map: &Mapping, policy: AdvicePolicy, start: usize, end: usize) -> bool {
    policy == AdvicePolicy::PerTensor && start < end && map.read_in_huge_pages(start, end)
}

/// The prefetch `asked` for, of `bytes`, against a budget of `budget`
/// bytes (`None`: unreadable), the region advised huge pages or not.
pub(crate) fn plan_prefetch(
    asked: Prefetch,
    bytes: u64,
    budget: Option<u64>,
    huge_pages: bool,
) -> PrefetchDecision {
    match asked {
        _ if bytes == 0 => PrefetchDecision::Off,
        Prefetch::None => PrefetchDecision::Off,
        Prefetch::WillNeed => PrefetchDecision::WillNeed { bytes },
        // Populating more than the budget holds would only evict what it
        // read before the first pass comes to it.
        Prefetch::Populate => match budget {
            Some(b) if bytes > b => PrefetchDecision::Skipped(SkipReason::TooLarge {
                bytes,
                budget: b,
                max_percent: 100,
            }),
            _ => PrefetchDecision::Populated { bytes },
        },
        Prefetch::Background { max_percent } => match budget {
            None => PrefetchDecision::Skipped(SkipReason::MemoryUnknown),
            Some(budget) if fits(bytes, budget, max_percent) => PrefetchDecision::Background {
                bytes,
                budget,
                max_percent,
            },
            // Faults in huge-page folios read ahead on their own, and the
            // cgroup reclaims such folios whole, where the windowed
            // read-ahead's 4 KiB folios cost it a reverse-map walk and a
            // TLB flush each (BENCHMARKS.md, "Under a memory limit").
            Some(budget) if huge_pages => PrefetchDecision::HugePages { bytes, budget },
            Some(budget) => PrefetchDecision::Windowed {
                bytes,
                budget,
                window: read_ahead_window(budget, max_percent),
            },
        },
    }
}

/// Whether a prefetch of `bytes` fits in `max_percent` of `budget`.
pub(crate) fn fits(bytes: u64, budget: u64, max_percent: u8) -> bool {
    u128::from(bytes) * 100 <= u128::from(budget) * u128::from(max_percent)
}

/// Whether the re-read `asked` for can act: only where the region is read
/// in huge pages and a prefetch maps all of it first.
fn plan_reread(asked: &PlanOptions, huge_pages: bool, prefetch: &PrefetchDecision) -> Reread {
    if !asked.reread {
        return Reread::Off;
    }
    let refused = |r| Reread::Refused(r);
    match prefetch {
        _ if matches!(asked.advice, AdvicePolicy::Uniform(_)) => {
            refused(RereadRefusal::UniformAdvice)
        }
        _ if !huge_pages => refused(RereadRefusal::NoHugePages),
        PrefetchDecision::Populated { .. } | PrefetchDecision::Background { .. } => Reread::On,
        other => refused(RereadRefusal::Prefetch(other.clone())),
    }
}

/// Whether a range of `capacity` bytes that could be held in huge pages,
/// `small` of them resident in small folios, is worth dropping and reading
/// again: a quarter of it at least, and at least one huge page, as the
/// ragged ends of a range and a neighbour's page are not worth a read.
pub(crate) fn worth_rereading(small: u64, capacity: u64) -> bool {
    small >= (capacity / 4).max(huge_page() as u64)
}

// ------------------------------------------------------------ read-ahead

/// How far ahead of a reader that the region does not fit in memory for
/// (the windowed prefetch, a [`Pass`](crate::Pass)) reads are queued: half
/// of the reader's share of the budget, the reader's own pages, and what
/// reclaim has not yet taken behind it, having the other half.
pub(crate) fn read_ahead_window(budget: u64, share_percent: u8) -> u64 {
    (u128::from(budget) * u128::from(share_percent) / 200) as u64
}

/// A pass's window when the budget is unknown.
const DEFAULT_PASS_WINDOW: u64 = 64 << 20;
/// A pass's window's bounds when it is taken from the budget: below a few
/// MiB the device sees requests too small to stream; past 64 MiB, read in
/// huge pages, the pass was slower, not faster (BENCHMARKS.md).
const PASS_WINDOW_BOUNDS: (u64, u64) = (4 << 20, 64 << 20);

/// The read-ahead window of a [`Pass`](crate::Pass) under `budget` (the
/// whole budget is its share): [`read_ahead_window`] within bounds.
pub(crate) fn pass_window(budget: Option<u64>) -> u64 {
    let (least, most) = PASS_WINDOW_BOUNDS;
    budget.map_or(DEFAULT_PASS_WINDOW, |b| {
        read_ahead_window(b, 100).clamp(least, most)
    })
}

/// The most a [`Pass`](crate::Pass) holds resident under `budget`: all but
/// a sixteenth, left for what the caller allocates as it goes.
pub(crate) fn pass_hold(budget: Option<u64>) -> u64 {
    budget.map_or(u64::MAX, |b| b - b / 16)
}

/// Whether a [`Pass`](crate::Pass) reading `window` bytes ahead reads
/// `[from, to)` of `map` in huge-page folios: with a window that bounds
/// their read-ahead (the kernel reads up to three huge pages past a fault,
/// so sixteen of them), where the kernel takes `MADV_HUGEPAGE` (one call
/// over a file's span, so that the mapping is not cut into a piece per
/// tensor). Elsewhere the pass queues reads ahead itself.
pub(crate) fn pass_in_huge_pages(map: &Mapping, window: u64, from: usize, to: usize) -> bool {
    window >= 16 * huge_page() as u64 && map.read_in_huge_pages(from, to)
}

/// The step in which a windowed read-ahead queues reads and looks for the
/// first pass's front: one huge page, the largest folio a fault reads.
pub(crate) fn follow_step() -> usize {
    huge_page()
}

/// Where a drop of pages that ends a run begun at `floor` starts, when the
/// last drop ended at `last_end`: a huge page before it.
///
/// The page cache holds a file in folios up to a huge page, and a folio
/// goes only when a drop covers all of it (`POSIX_FADV_DONTNEED` passes
/// over one that straddles the range's ends), so each drop reaches back
/// into the one before it for the folio that straddled their boundary.
pub(crate) fn drop_from(last_end: u64, floor: u64) -> u64 {
    last_end.saturating_sub(huge_page() as u64).max(floor)
}

/// Turn off the read-ahead of the fault path over `[start, end)` of `map`,
/// a tensor whose experts the runtime announces, in weights that exceed the
/// memory budget (where they fit, the prefetch reads every tensor whole and
/// the advice would only slow it): from then on a fault reads only its
/// page, and the announcements read what is used. Left to the kernel's
/// read-ahead, each fault on an expert's slice reads around it (the
/// device's read-ahead) into experts no token chose, which a model larger
/// than memory cannot afford: on the synthetic OLMoE layout in a cgroup of
/// half the file it read 2.5 to 4 times what was touched (BENCHMARKS.md,
/// "Models larger than memory").
///
/// The range is read in base pages too. Under `MADV_HUGEPAGE` a fault reads
/// its whole 2 MiB folio even under `MADV_RANDOM` (Linux's
/// `do_sync_mmap_readahead`), and an expert's slice is rarely a multiple
/// of 2 MiB (1.1 MiB in OLMoE's layout), so that folio holds parts of its
/// neighbours, and no release of one slice can drop it
/// (`POSIX_FADV_DONTNEED` drops only folios wholly inside its range).
/// Advisory: a failure only leaves the read-ahead on.
pub(crate) fn read_only_as_announced(map: &Mapping, start: usize, end: usize) {
    let _ = map.advise_inward(AccessAdvice::Random, start, end);
    map.read_in_base_pages(start, end);
}

/// The prefetch of one file of a model in several, `region` bytes of
/// `total`: a background prefetch's share of the budget split by size, so
/// that together the files hold to it.
pub(crate) fn shard_prefetch(asked: Prefetch, region: u64, total: u64) -> Prefetch {
    let Prefetch::Background { max_percent } = asked else {
        return asked;
    };
    let share = if total == 0 {
        1.0
    } else {
        region as f64 / total as f64
    };
    Prefetch::Background {
        max_percent: ((f64::from(max_percent) * share).floor() as u8)
            .max(1)
            .min(max_percent),
    }
}

// --------------------------------------------------------- owned buffers

/// Where an owned buffer that is an anonymous mapping starts: at a
/// multiple of a huge page when it is to be in huge pages (and advised
/// `MADV_HUGEPAGE`), so that every whole huge page of it can be one; else
/// at the alignment its type asks.
pub(crate) fn owned_buffer_alignment(alignment: usize, huge_pages: bool) -> usize {
    if huge_pages {
        alignment.max(huge_page())
    } else {
        alignment
    }
}

// ---------------------------------------------------------------- ranges

/// The file ranges of the `tensors`, but those in `skip` (sorted), sorted
/// and merged: what a prefetch reads.
fn mapped_ranges(
    header: &Header,
    tensors: impl Iterator<Item = usize>,
    skip: &[usize],
) -> Result<Vec<(usize, usize)>> {
    let infos = header.tensors();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for i in tensors {
        if skip.binary_search(&i).is_err() {
            let r = infos.file_range(i);
            push_range(&mut ranges, (r.start as usize, r.end as usize))?;
        }
    }
    Ok(merge(ranges))
}

/// Add `r` to `ranges`, joined to the last one when it follows it within
/// [`MERGE_GAP`] (tensors come in file order, so a million of them make a
/// handful of ranges, not a million).
fn push_range(ranges: &mut Vec<(usize, usize)>, r: (usize, usize)) -> Result<()> {
    if let Some(last) = ranges.last_mut() {
        if r.0 >= last.0 && r.0 <= last.1.saturating_add(MERGE_GAP) {
            last.1 = last.1.max(r.1);
            return Ok(());
        }
    }
    crate::alloc::push(ranges, r, "the prefetch ranges")
}

/// Ranges closer than this are read as one, as reading a small gap costs
/// less than a second pass.
const MERGE_GAP: usize = 1 << 20;

/// Sort and merge ranges; those less than [`MERGE_GAP`] apart become one.
pub(super) fn merge(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.retain(|r| r.1 > r.0);
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len().min(64));
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.0 <= last.1.saturating_add(MERGE_GAP) => last.1 = last.1.max(r.1),
            _ => out.push(r),
        }
    }
    out
}

/// The bytes in `ranges` (offsets into one mapping).
pub(crate) fn total_of(ranges: &[(usize, usize)]) -> u64 {
    ranges.iter().map(|r| (r.1 - r.0) as u64).sum()
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
    fn a_background_prefetch_runs_only_within_its_share_of_known_memory() {
        let bg = Prefetch::Background { max_percent: 50 };
        assert_eq!(
            plan_prefetch(bg, 400, Some(1000), false),
            PrefetchDecision::Background {
                bytes: 400,
                budget: 1000,
                max_percent: 50
            }
        );
        assert_eq!(
            plan_prefetch(bg, 600, Some(1000), false),
            PrefetchDecision::Windowed {
                bytes: 600,
                budget: 1000,
                window: 250
            }
        );
        assert_eq!(
            plan_prefetch(bg, 600, Some(1000), true),
            PrefetchDecision::HugePages {
                bytes: 600,
                budget: 1000
            }
        );
        assert_eq!(
            plan_prefetch(bg, 1, None, true),
            PrefetchDecision::Skipped(SkipReason::MemoryUnknown)
        );
        assert_eq!(
            plan_prefetch(bg, 0, Some(1000), true),
            PrefetchDecision::Off
        );
        assert!(matches!(
            plan_prefetch(Prefetch::Populate, 2000, Some(1000), true),
            PrefetchDecision::Skipped(SkipReason::TooLarge { .. })
        ));
    }

    #[test]
    fn a_reread_acts_only_after_a_prefetch_that_maps_the_region_in_huge_pages() {
        let asked = PlanOptions {
            advice: AdvicePolicy::PerTensor,
            streamed: None,
            prefetch: Prefetch::DEFAULT,
            reread: true,
            progress: None,
        };
        let bg = PrefetchDecision::Background {
            bytes: 1,
            budget: 1,
            max_percent: 50,
        };
        let not_asked = PlanOptions {
            reread: false,
            ..asked.clone()
        };
        assert_eq!(plan_reread(&not_asked, true, &bg), Reread::Off);
        assert_eq!(plan_reread(&asked, true, &bg), Reread::On);
        let populate = PrefetchDecision::Populated { bytes: 1 };
        assert_eq!(plan_reread(&asked, true, &populate), Reread::On);
        let refused = |r| Reread::Refused(r);
        assert_eq!(
            plan_reread(&asked, false, &bg),
            refused(RereadRefusal::NoHugePages)
        );
        let will_need = PrefetchDecision::WillNeed { bytes: 1 };
        assert_eq!(
            plan_reread(&asked, true, &will_need),
            refused(RereadRefusal::Prefetch(will_need))
        );
        let uniform = PlanOptions {
            advice: AdvicePolicy::Uniform(AccessAdvice::Normal),
            streamed: None,
            ..asked
        };
        assert_eq!(
            plan_reread(&uniform, true, &bg),
            refused(RereadRefusal::UniformAdvice)
        );
    }

    #[test]
    fn a_reread_is_worth_a_quarter_of_a_range_and_at_least_a_huge_page() {
        let h = huge_page() as u64;
        assert!(worth_rereading(h, 4 * h));
        assert!(!worth_rereading(h - 1, 4 * h));
        assert!(!worth_rereading(h / 2, h / 2));
        assert!(worth_rereading(10 * h, 40 * h));
        assert!(!worth_rereading(10 * h - 1, 40 * h));
    }

    #[test]
    fn the_pass_and_the_read_ahead_take_half_their_share_of_the_budget() {
        assert_eq!(read_ahead_window(1000, 50), 250);
        assert_eq!(read_ahead_window(u64::MAX, 100), u64::MAX / 2);
        assert_eq!(pass_window(Some(40 << 20)), 20 << 20);
        assert_eq!(pass_window(Some(1 << 20)), 4 << 20);
        assert_eq!(pass_window(Some(1 << 40)), 64 << 20);
        assert_eq!(pass_window(None), 64 << 20);
        assert_eq!(pass_hold(Some(1600)), 1500);
    }

    #[test]
    fn each_shard_gets_its_share_of_a_background_prefetch() {
        let bg = |p| Prefetch::Background { max_percent: p };
        assert_eq!(shard_prefetch(bg(50), 1, 4), bg(12));
        assert_eq!(shard_prefetch(bg(50), 1, 1000), bg(1));
        assert_eq!(shard_prefetch(bg(50), 0, 0), bg(50));
        assert_eq!(shard_prefetch(Prefetch::WillNeed, 1, 4), Prefetch::WillNeed);
    }

    #[test]
    fn an_owned_buffer_in_huge_pages_starts_on_a_huge_page() {
        assert_eq!(owned_buffer_alignment(32, true), huge_page());
        assert_eq!(owned_buffer_alignment(32, false), 32);
        let above = 2 * huge_page();
        assert_eq!(owned_buffer_alignment(above, true), above);
    }

    #[test]
    fn a_drop_reaches_back_one_huge_page_and_no_further_than_its_run() {
        let h = huge_page() as u64;
        assert_eq!(drop_from(10 * h, 0), 9 * h);
        assert_eq!(drop_from(10 * h, 9 * h + 1), 9 * h + 1);
        assert_eq!(drop_from(h / 2, 0), 0);
    }

    #[test]
    fn over_the_budget_experts_stream_and_below_the_dense_part_everything_does() {
        let mib = 1u64 << 20;
        assert_eq!(
            plan_residency(None, 10 * mib, 90 * mib),
            ResidencyPlan::Fits
        );
        assert_eq!(
            plan_residency(Some(200 * mib), 10 * mib, 90 * mib),
            ResidencyPlan::Fits
        );
        assert_eq!(
            plan_residency(Some(100 * mib), 10 * mib, 90 * mib),
            ResidencyPlan::StreamExperts {
                whole: 10 * mib,
                experts: 90 * mib,
                expert_capacity: 26 * mib,
                budget: 100 * mib
            }
        );
        let all = |b| ResidencyPlan::StreamAll {
            mapped: 100 * mib,
            budget: b,
        };
        assert_eq!(
            plan_residency(Some(70 * mib), 10 * mib, 90 * mib),
            all(70 * mib)
        );
        assert_eq!(plan_residency(Some(70 * mib), 100 * mib, 0), all(70 * mib));
    }

    #[test]
    fn merge_joins_near_ranges_and_drops_empty_ones() {
        let m = 1 << 20;
        assert_eq!(
            merge(vec![
                (5 * m, 6 * m),
                (0, 10),
                (20, 30),
                (7, 7),
                (2 * m + 40, 3 * m)
            ]),
            vec![(0, 30), (2 * m + 40, 3 * m), (5 * m, 6 * m)]
        );
        assert!(merge(vec![(3, 3)]).is_empty());
    }
}
