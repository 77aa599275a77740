//! [`PagePlan`]: every page-size decision of a mapped load, made once,
//! before any page of a tensor is read.
//!
//! - The access advice on the tensor region: `MADV_RANDOM` on the tables
//!   read by row ([`is_row_lookup`]), and `MADV_HUGEPAGE` over the rest of
//!   the region under [`AdvicePolicy::PerTensor`], so that every fault in
//!   it, the prefetch's and the runtime's own, reads PMD-size folios.
//! - The prefetch ([`PrefetchPlan`]): none, queued, populated, a background
//!   read of the whole region when it fits in its share of the memory
//!   budget, and when it does not, the first pass's own faults in huge
//!   pages, or a read-ahead that follows the pass within a window.
//! - Whether to re-read what the page cache held in small folios
//!   ([`Reread`]), or why not.
//! - How far back a drop of pages behind a reader reaches ([`drop_from`]),
//!   and when a [`Pass`](super::Pass) reads in huge pages
//!   ([`pass_in_huge_pages`]).
//!
//! `prefetch.rs`, `pass.rs` and `place.rs` carry these decisions out and
//! make none of their own; what the plan asks of the kernel goes through
//! [`Mapping`] (`src/os/`). Owned buffers take huge pages from their buffer
//! type's switch ([`crate::buffer::CpuBufferType::huge_pages`]).

use std::fmt;

use crate::format::Header;
use crate::os::{AccessAdvice, Mapping};

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

/// `b` bytes in MiB, one decimal, for messages.
pub(crate) fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// What the load options ask of the plan.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanOptions {
    /// [`LoadOptions::advice`](crate::LoadOptions::advice).
    pub(crate) advice: AdvicePolicy,
    /// [`LoadOptions::prefetch`](crate::LoadOptions::prefetch).
    pub(crate) prefetch: Prefetch,
    /// [`LoadOptions::reread_small_folios`](crate::LoadOptions::reread_small_folios)(crate::LoadOptions::reread_small_folios).
    pub(crate) reread: bool,
}

/// The page-size decisions of one mapped load.
#[derive(Debug)]
pub(crate) struct PagePlan {
    /// The tensors advised `MADV_RANDOM`, sorted.
    pub(crate) random_access: Vec<usize>,
    /// Whether the kernel took `MADV_HUGEPAGE` over the tensor region.
    pub(crate) huge_pages: bool,
    /// What the prefetch does.
    pub(crate) prefetch: PrefetchPlan,
    /// Whether the prefetch re-reads small folios once it has mapped the
    /// region, or why not.
    pub(crate) reread: Reread,
}

/// What a mapped load's prefetch does, decided against the budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PrefetchPlan {
    /// No prefetch ([`Prefetch::None`], or nothing stays mapped).
    Off,
    /// `MADV_WILLNEED` over the region.
    WillNeed,
    /// Read and map the region before returning.
    Populate,
    /// A thread reads the whole region in file order.
    Background {
        /// The budget when the load decided.
        budget: u64,
        /// The share of it the region may be, in percent.
        max_percent: u8,
    },
    /// A thread queues reads a window ahead of the first pass and drops
    /// what is a window behind it.
    Windowed {
        /// The budget when the load decided.
        budget: u64,
        /// How far ahead of the pass reads are queued.
        window: u64,
    },
    /// No thread: the first pass's faults read huge-page folios, which
    /// the memory cgroup reclaims whole.
    HugePages {
        /// The budget when the load decided.
        budget: u64,
    },
    /// Not started, and why.
    Skipped(SkipReason),
}

/// What became of [`LoadOptions::reread_small_folios`](crate::LoadOptions::reread_small_folios).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reread {
    /// Not asked for.
    Off,
    /// Asked for: once the prefetch has mapped the region it drops and
    /// reads again what the page cache held in small folios
    /// ([`PrefetchProgress::bytes_reread`](crate::PrefetchProgress::bytes_reread)
    /// counts the bytes).
    On,
    /// Asked for and refused: this load cannot re-read.
    Refused(RereadRefusal),
}

/// Why [`LoadOptions::reread_small_folios`](crate::LoadOptions::reread_small_folios) could not act.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RereadRefusal {
    /// [`AdvicePolicy::Uniform`]: the caller chose the region's advice, and
    /// it does not ask for huge pages, so a re-read would read small folios
    /// again.
    UniformAdvice,
    /// The kernel did not take `MADV_HUGEPAGE` (no transparent huge pages,
    /// or another platform).
    NoHugePages,
    /// The prefetch does not map the whole region, so there is nothing to
    /// look at once it has: [`Prefetch::None`], [`Prefetch::WillNeed`], or
    /// a region over its share of the memory budget. Named as
    /// [`PrefetchDecision::name`](crate::PrefetchDecision::name) names it.
    Prefetch(&'static str),
    /// The stream path ran: nothing is mapped.
    NotMapped,
}

impl Reread {
    /// A short, stable name: `"off"`, `"on"`, `"refused"`.
    pub fn name(&self) -> &'static str {
        match self {
            Reread::Off => "off",
            Reread::On => "on",
            Reread::Refused(_) => "refused",
        }
    }
}

impl fmt::Display for Reread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reread::Off => write!(f, "off"),
            Reread::On => write!(f, "on"),
            Reread::Refused(r) => write!(f, "refused: {r}"),
        }
    }
}

impl fmt::Display for RereadRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RereadRefusal::UniformAdvice => {
                write!(f, "the advice is uniform, with no huge pages asked for")
            }
            RereadRefusal::NoHugePages => write!(f, "the kernel gives no huge pages here"),
            RereadRefusal::Prefetch(p) => {
                write!(f, "the prefetch ({p}) does not map the whole region")
            }
            RereadRefusal::NotMapped => write!(f, "nothing is mapped (stream path)"),
        }
    }
}

impl PagePlan {
    /// Advise the tensor region `[start, end)` of `map` as `asked`, and
    /// decide the prefetch of the `bytes` of it that stay mapped against
    /// `budget` (bytes; `None`: unreadable).
    pub(crate) fn advise(
        map: &Mapping,
        header: &Header,
        (start, end): (usize, usize),
        bytes: u64,
        asked: PlanOptions,
        budget: Option<u64>,
    ) -> PagePlan {
        let random_access = advise_access(map, header, asked.advice, start, end);
        let huge_pages = advise_huge_pages(map, asked.advice, start, end);
        let prefetch = plan_prefetch(asked.prefetch, bytes, budget, huge_pages);
        let reread = plan_reread(asked, huge_pages, &prefetch);
        PagePlan {
            random_access,
            huge_pages,
            prefetch,
            reread,
        }
    }
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
) -> PrefetchPlan {
    match asked {
        _ if bytes == 0 => PrefetchPlan::Off,
        Prefetch::None => PrefetchPlan::Off,
        Prefetch::WillNeed => PrefetchPlan::WillNeed,
        // Populating more than the budget holds would only evict what it
        // read before the first pass comes to it.
        Prefetch::Populate => match budget {
            Some(b) if bytes > b => PrefetchPlan::Skipped(SkipReason::TooLarge {
                bytes,
                budget: b,
                max_percent: 100,
            }),
            _ => PrefetchPlan::Populate,
        },
        Prefetch::Background { max_percent } => match budget {
            None => PrefetchPlan::Skipped(SkipReason::MemoryUnknown),
            Some(budget) if fits(bytes, budget, max_percent) => PrefetchPlan::Background {
                budget,
                max_percent,
            },
            // Faults in huge-page folios read ahead on their own, and the
            // cgroup reclaims such folios whole, where the windowed
            // read-ahead's 4 KiB folios cost it a reverse-map walk and a
            // TLB flush each (BENCHMARKS.md, "Under a memory limit").
            Some(budget) if huge_pages => PrefetchPlan::HugePages { budget },
            // Half the prefetch's share: the pass's own pages, and what
            // the kernel has not yet reclaimed behind it, take the rest.
            Some(budget) => PrefetchPlan::Windowed {
                budget,
                window: (u128::from(budget) * u128::from(max_percent) / 200) as u64,
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
fn plan_reread(asked: PlanOptions, huge_pages: bool, prefetch: &PrefetchPlan) -> Reread {
    if !asked.reread {
        return Reread::Off;
    }
    let refused = |r| Reread::Refused(r);
    match prefetch {
        _ if matches!(asked.advice, AdvicePolicy::Uniform(_)) => {
            refused(RereadRefusal::UniformAdvice)
        }
        _ if !huge_pages => refused(RereadRefusal::NoHugePages),
        PrefetchPlan::Populate | PrefetchPlan::Background { .. } => Reread::On,
        PrefetchPlan::Off => refused(RereadRefusal::Prefetch("off")),
        PrefetchPlan::WillNeed => refused(RereadRefusal::Prefetch("willneed")),
        PrefetchPlan::Windowed { .. } => refused(RereadRefusal::Prefetch("windowed")),
        PrefetchPlan::HugePages { .. } => refused(RereadRefusal::Prefetch("huge_pages")),
        PrefetchPlan::Skipped(_) => refused(RereadRefusal::Prefetch("skipped")),
    }
}

/// Where a drop of pages that ends a run begun at `floor` starts, when the
/// last drop ended at `last_end`: a huge page before it.
///
/// The page cache holds a file in folios up to a huge page, and a folio
/// goes only when a drop covers all of it (`POSIX_FADV_DONTNEED` passes
/// over one that straddles the range's ends), so each drop reaches back
/// into the one before it for the folio that straddled their boundary.
pub(crate) fn drop_from(last_end: u64, floor: u64) -> u64 {
    last_end
        .saturating_sub(crate::os::huge_page() as u64)
        .max(floor)
}

/// The least pass window read in huge pages: the kernel reads up to three
/// huge pages past a fault, which a smaller window would not bound.
const PASS_HUGE_FROM: u64 = 32 << 20;

/// Whether a [`Pass`](super::Pass) reading `window` bytes ahead reads
/// `[from, to)` of `map` in huge-page folios: with a window that bounds
/// their read-ahead, where the kernel takes `MADV_HUGEPAGE` (one call over
/// a file's span, so that the mapping is not cut into a piece per tensor).
/// Elsewhere the pass queues reads ahead itself.
pub(crate) fn pass_in_huge_pages(map: &Mapping, window: u64, from: usize, to: usize) -> bool {
    window >= PASS_HUGE_FROM && map.read_in_huge_pages(from, to)
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
            PrefetchPlan::Background {
                budget: 1000,
                max_percent: 50
            }
        );
        assert_eq!(
            plan_prefetch(bg, 600, Some(1000), false),
            PrefetchPlan::Windowed {
                budget: 1000,
                window: 250
            }
        );
        assert_eq!(
            plan_prefetch(bg, 600, Some(1000), true),
            PrefetchPlan::HugePages { budget: 1000 }
        );
        assert_eq!(
            plan_prefetch(bg, 1, None, true),
            PrefetchPlan::Skipped(SkipReason::MemoryUnknown)
        );
        assert_eq!(plan_prefetch(bg, 0, Some(1000), true), PrefetchPlan::Off);
        assert!(matches!(
            plan_prefetch(Prefetch::Populate, 2000, Some(1000), true),
            PrefetchPlan::Skipped(SkipReason::TooLarge { .. })
        ));
    }

    #[test]
    fn a_reread_acts_only_after_a_prefetch_that_maps_the_region_in_huge_pages() {
        let asked = PlanOptions {
            advice: AdvicePolicy::PerTensor,
            prefetch: Prefetch::DEFAULT,
            reread: true,
        };
        let bg = PrefetchPlan::Background {
            budget: 1,
            max_percent: 50,
        };
        let not_asked = PlanOptions {
            reread: false,
            ..asked
        };
        assert_eq!(plan_reread(not_asked, true, &bg), Reread::Off);
        assert_eq!(plan_reread(asked, true, &bg), Reread::On);
        let populate = PrefetchPlan::Populate;
        assert_eq!(plan_reread(asked, true, &populate), Reread::On);
        let refused = |r| Reread::Refused(r);
        assert_eq!(
            plan_reread(asked, false, &bg),
            refused(RereadRefusal::NoHugePages)
        );
        assert_eq!(
            plan_reread(asked, true, &PrefetchPlan::WillNeed),
            refused(RereadRefusal::Prefetch("willneed"))
        );
        let uniform = PlanOptions {
            advice: AdvicePolicy::Uniform(AccessAdvice::Normal),
            ..asked
        };
        assert_eq!(
            plan_reread(uniform, true, &bg),
            refused(RereadRefusal::UniformAdvice)
        );
    }

    #[test]
    fn a_drop_reaches_back_one_huge_page_and_no_further_than_its_run() {
        let h = crate::os::huge_page() as u64;
        assert_eq!(drop_from(10 * h, 0), 9 * h);
        assert_eq!(drop_from(10 * h, 9 * h + 1), 9 * h + 1);
        assert_eq!(drop_from(h / 2, 0), 0);
    }
}
