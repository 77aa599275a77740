//! What a load did: [`LoadReport`], per-tensor placement, per-buffer figures.

use std::time::Duration;

use crate::error::FallbackReason;
use crate::format::Format;
use crate::page_plan::{PrefetchDecision, Reread, ResidencyPlan};

use std::path::PathBuf;

use super::mode::LoadMode;

/// Where a tensor's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlacementKind {
    /// Viewed in place in the file mapping (zero-copy), through a buffer
    /// over host memory: the CPU's, or a device type's `buffer_from_host_ptr`.
    Mapped,
    /// Copied into an owned buffer.
    Copied,
}

impl PlacementKind {
    /// `"mapped"` or `"copied"`.
    pub fn name(self) -> &'static str {
        match self {
            PlacementKind::Mapped => "mapped",
            PlacementKind::Copied => "copied",
        }
    }
}

/// Why the mapped path copied a tensor instead of viewing it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CopyReason {
    /// Its address in the mapping is not aligned as its buffer type needs.
    Misaligned {
        /// Its address in the mapping.
        address: usize,
        /// The alignment it needs.
        alignment: usize,
    },
    /// It was routed to a buffer type that cannot wrap host memory.
    Routed {
        /// The buffer type.
        buffer_type: String,
    },
}

impl std::fmt::Display for CopyReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyReason::Misaligned { address, alignment } => {
                write!(f, "address {address:#x} is not aligned to {alignment}")
            }
            CopyReason::Routed { buffer_type } => {
                write!(
                    f,
                    "routed to '{buffer_type}', which cannot wrap host memory"
                )
            }
        }
    }
}

/// A tensor the mapped path copied, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopiedTensor {
    /// The tensor.
    pub name: String,
    /// Why.
    pub reason: CopyReason,
}

/// One buffer the load made.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BufferReport {
    /// The buffer's type name (`"CPU_Mapped"`, `"CPU"`, a device's).
    pub buffer_type: String,
    /// Whether it views the mapping (no copy).
    pub mapped: bool,
    /// Tensors placed in it.
    pub tensors: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The buffer's size (a mapped buffer spans from its first tensor to the
    /// end of its last).
    pub size: usize,
}

/// How many bytes of the placed tensors sit in huge pages, measured when
/// asked ([`Weights::huge_pages`]): decode reads every weight per token,
/// and reads them faster from huge pages (ARCHITECTURE.md, "Huge pages for
/// the weights").
///
/// [`Weights::huge_pages`]: crate::Weights::huge_pages
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HugePages {
    /// Bytes of the buffers that view the file mapping.
    pub mapped_bytes: u64,
    /// Of those, the bytes this process has mapped (`Rss`): read by now,
    /// by the prefetch or the first pass. `None` where it cannot be known.
    pub mapped_resident: Option<u64>,
    /// Of those, the bytes mapped with PMD entries (`FilePmdMapped` in
    /// `/proc/self/smaps`); `None` where it cannot be known (no smaps:
    /// Windows and macOS map no file in huge pages).
    pub mapped_huge: Option<u64>,
    /// Bytes of the mapped buffers inside whole huge pages: the most that
    /// can be mapped in huge pages.
    pub mapped_huge_capacity: u64,
    /// Bytes of the owned host buffers (copies, the stream path).
    pub owned_bytes: u64,
    /// Of those, the bytes in transparent huge pages (`AnonHugePages`);
    /// `None` where it cannot be known.
    pub owned_huge: Option<u64>,
}

impl HugePages {
    /// Bytes of the mapped buffers that are mapped in base pages although
    /// the page cache could hold them in huge ones: resident, not in a huge
    /// page, and inside a whole huge page of the buffers (the ragged ends
    /// of a buffer never can be). `None` where it cannot be known.
    ///
    /// Where the region is read under `MADV_HUGEPAGE`, base pages there
    /// mean the page cache already held them in small folios when the
    /// load came (another process filled it with `MADV_WILLNEED`, or
    /// wrote the file): what
    /// [`LoadOptions::reread_small_folios`](crate::LoadOptions::reread_small_folios)
    /// re-reads.
    pub fn mapped_small(&self) -> Option<u64> {
        let resident = self.mapped_resident?.min(self.mapped_huge_capacity);
        Some(resident.saturating_sub(self.mapped_huge?))
    }
}

/// What a load did.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LoadReport {
    /// The file's format.
    pub format: Format,
    /// The mode asked for.
    pub mode_requested: LoadMode,
    /// The mode that ran.
    pub mode_used: LoadMode,
    /// Why the mapped path was not used, when it was asked for and not used.
    pub fallback: Option<FallbackReason>,
    /// Number of tensors.
    pub tensors_count: usize,
    /// Tensors viewed in place in the mapping.
    pub tensors_mapped: usize,
    /// Tensors copied into owned buffers (all of them on the stream path).
    pub tensors_copied: usize,
    /// Bytes of the tensors viewed in place.
    pub bytes_mapped: u64,
    /// Bytes of the tensors copied (tensor bytes only).
    pub bytes_copied: u64,
    /// On the mapped path, each tensor copied rather than viewed, and why.
    pub copied: Vec<CopiedTensor>,
    /// The buffers, with their tensors and bytes.
    pub buffers: Vec<BufferReport>,
    /// The file's length.
    pub file_len: u64,
    /// Wall time of the whole load, including any failed mapped attempt.
    pub elapsed: Duration,
    /// What the prefetch policy did (see `Weights::prefetch_progress` for
    /// how far a background prefetch has got).
    pub prefetch: PrefetchDecision,
    /// What became of
    /// [`LoadOptions::reread_small_folios`](crate::LoadOptions::reread_small_folios):
    /// not asked for, acting, or refused and why (for a model in several
    /// files, the first file's).
    pub reread: Reread,
    /// For a model in several files, each file (empty for one file).
    pub shards: Vec<ShardReport>,
    /// Things worth knowing that are not errors (an index whose
    /// `metadata.total_size` disagrees with the shards, ...).
    pub warnings: Vec<String>,
    /// How copied tensors were read (threads, direct I/O); `None` when
    /// nothing was copied.
    pub read: Option<ReadReport>,
    /// The tensors advised `MADV_RANDOM` as row-lookup tables under
    /// [`crate::AdvicePolicy::PerTensor`] (empty otherwise, and on the
    /// stream path).
    pub random_access_tensors: Vec<String>,
    /// The tensors read whole that stream through the page cache because,
    /// together, they exceed the memory budget
    /// ([`ResidencyPlan::StreamAll`]), advised `MADV_SEQUENTIAL` under
    /// [`crate::AdvicePolicy::PerTensor`]: the largest first, until the rest
    /// fits (empty otherwise, and on the stream path).
    pub streamed_tensors: Vec<String>,
    /// The memory budget the load was held to.
    pub budget: Budget,
    /// What stays resident when the mapped tensors are larger than the
    /// budget, and what streams through as the runtime announces it.
    pub residency: ResidencyPlan,
}

/// The memory the process may still use, as the load read it when it
/// started: the least of `MemAvailable` and, for the process's memory
/// cgroup and each of its ancestors, the limit less the usage (cgroup v1 or
/// v2), with the page cache the kernel would reclaim first counted as
/// available, as `MemAvailable` and kubelet count it. Every memory decision
/// of the load is made against it: the background prefetch, populate,
/// mlock, the residency, and every copy (which is refused with
/// [`crate::Error::OverBudget`] rather than risk the OOM killer).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Budget {
    /// Bytes, or `None` when no figure could be read (then nothing is refused).
    pub bytes: Option<u64>,
    /// Where the figure came from: `"MemAvailable"`, `"cgroup v1 /NAME
    /// memory.limit_in_bytes"`, `"cgroup v2 /a/b memory.max"`,
    /// `"LoadOptions::budget"`; or why none could be read.
    pub source: String,
    /// For a cgroup's figure: its limit.
    pub limit: Option<u64>,
    /// For a cgroup's figure: its usage, page cache included.
    pub usage: Option<u64>,
    /// For a cgroup's figure: its inactive file pages (`memory.stat`),
    /// counted as available.
    pub reclaimable: Option<u64>,
    /// For a cgroup's figure: the model's own bytes in the page cache,
    /// counted as its resident set rather than as used where they are more
    /// than `reclaimable` (the two may overlap, so only the larger counts).
    /// `bytes` is `limit - (usage - max(reclaimable, own_cached))`.
    pub own_cached: Option<u64>,
}

/// One file of a model: where it is and what its load did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardReport {
    /// The file.
    pub path: PathBuf,
    /// Its tensors.
    pub tensors: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The mode that ran for it.
    pub mode_used: LoadMode,
    /// Why it was not mapped, when it was asked to be.
    pub fallback: Option<FallbackReason>,
}

/// What the reads did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DirectOutcome {
    /// Buffered, as asked ([`DirectIo::Off`](crate::DirectIo::Off)), or nothing to read.
    Off,
    /// Read with `O_DIRECT`.
    Used,
    /// Buffered: [`DirectIo::Auto`](crate::DirectIo::Auto) found the file mostly cached.
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
    /// Reading threads used (by the direct reads, when there were any).
    pub threads: usize,
    /// Whether the reads were direct.
    pub direct: DirectOutcome,
}
