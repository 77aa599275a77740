//! What a caller may ask of a mapped load's pages, and what the plan
//! decided: the public vocabulary of [`PagePlan`](super::PagePlan).

use std::fmt;
use std::ops::ControlFlow;
use std::sync::Arc;

use crate::os::AccessAdvice;

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
    /// pass's own faults read ahead in huge-page folios, which the memory
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
                "huge pages: {} read by the first pass in huge-page folios (memory budget {})",
                mib(*bytes),
                mib(*budget)
            ),
            PrefetchDecision::Skipped(r) => write!(f, "skipped: {r}"),
        }
    }
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
    /// a region over its share of the memory budget. The decision is the
    /// one [`LoadReport::prefetch`](crate::LoadReport::prefetch) gives.
    Prefetch(PrefetchDecision),
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
                let name = p.name();
                write!(f, "the prefetch ({name}) does not map the whole region")
            }
            RereadRefusal::NotMapped => write!(f, "nothing is mapped (stream path)"),
        }
    }
}

/// A progress callback: `(bytes_done, bytes_total)`; return
/// `ControlFlow::Break(())` to cancel the load. It is called from the
/// reading threads (one call at a time), at most once per
/// [`LoadOptions::PROGRESS_STEP`](crate::LoadOptions::PROGRESS_STEP) bytes
/// and once at the end.
pub type ProgressFn = Arc<dyn Fn(u64, u64) -> ControlFlow<()> + Send + Sync>;

/// What stays resident when the mapped weights are larger than the memory
/// budget ([`LoadReport::residency`](crate::LoadReport::residency)); the
/// runtime's announcements ([`Weights::prefetch`](crate::Weights::prefetch))
/// carry it out.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResidencyPlan {
    /// The mapped tensors fit in the budget less the runtime's 64 MiB (or
    /// the budget is unknown, or nothing is mapped): every page stays
    /// resident once read.
    Fits,
    /// Larger than the budget: the tensors read whole (norms, attention,
    /// routers, shared experts) stay resident, and the expert tensors'
    /// slices (`ffn_*_exps`) stream through as the runtime announces them,
    /// the most used of them kept, up to `expert_capacity` bytes.
    StreamExperts {
        /// Bytes of the tensors read whole.
        whole: u64,
        /// Bytes of the expert tensors.
        experts: u64,
        /// Bytes of expert slices that stay resident.
        expert_capacity: u64,
        /// The memory budget.
        budget: u64,
    },
    /// Larger than the budget, with no room for any expert slice beside the
    /// tensors read whole (or no expert tensors at all): the expert slices
    /// stream through the page cache as announced, and so do the largest
    /// tensors read whole, in order, until the rest fits
    /// ([`LoadReport::streamed_tensors`](crate::LoadReport::streamed_tensors)).
    /// The load still runs.
    StreamAll {
        /// Bytes of the mapped tensors.
        mapped: u64,
        /// The memory budget.
        budget: u64,
    },
}

impl ResidencyPlan {
    /// A short, stable name: `"fits"`, `"stream_experts"`, `"stream_all"`.
    pub fn name(&self) -> &'static str {
        match self {
            ResidencyPlan::Fits => "fits",
            ResidencyPlan::StreamExperts { .. } => "stream_experts",
            ResidencyPlan::StreamAll { .. } => "stream_all",
        }
    }
}

impl fmt::Display for ResidencyPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResidencyPlan::Fits => write!(f, "fits: every tensor stays resident"),
            ResidencyPlan::StreamExperts {
                whole,
                experts,
                expert_capacity,
                budget,
            } => write!(
                f,
                "stream experts: over the memory budget ({}), the tensors read whole ({}) stay \
                 resident, the expert tensors ({}) stream as announced, the most used {} of \
                 them kept",
                mib(*budget),
                mib(*whole),
                mib(*experts),
                mib(*expert_capacity)
            ),
            ResidencyPlan::StreamAll { mapped, budget } => write!(
                f,
                "stream all: {} of tensors over a memory budget ({}) that holds not even \
                 those read whole; the largest of them stream through in order, the expert \
                 slices as announced",
                mib(*mapped),
                mib(*budget)
            ),
        }
    }
}
