//! Every page-size decision weightmap makes, in one place: [`PagePlan`]
//! (a mapped load's advice, prefetch and re-read, decided once against the
//! budget before any page of a tensor is read), and the rules everything
//! else that reads, drops or owns pages follows ([`plan`]: the re-read
//! threshold, the read-ahead window of a prefetch and of a
//! [`Pass`](crate::Pass), the step in units of the machine's huge page,
//! each shard's share, where an owned buffer starts). The prefetcher
//! ([`prefetch`]) carries the plan out; the loader, a pass and the CPU
//! buffer type ask, and decide nothing about pages themselves. What the
//! plan asks of the kernel goes through [`Mapping`](crate::os::Mapping)
//! (`src/os/`).
//!
//! The module sits below the buffers and the loader (tests/layers.rs), so
//! that an owned buffer's huge-page start is decided here too.
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
//!   token embedding, per-layer token embeddings; see
//!   [`is_row_lookup`](plan::is_row_lookup)),
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
//! faults read ahead in huge-page folios, which the cgroup reclaims whole. Where
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

pub(crate) mod announce;
mod choices;
pub(crate) mod plan;
pub(crate) mod prefetch;
pub(crate) mod residency;

pub use choices::{AdvicePolicy, Prefetch, PrefetchDecision, ProgressFn};
pub use choices::{Reread, RereadRefusal, ResidencyPlan, SkipReason};
pub(crate) use plan::{PagePlan, PlanOptions};
pub use prefetch::{PrefetchProgress, PrefetchState};
