//! What a load is asked to do: [`LoadOptions`] and its builder.

use std::fmt;
use std::sync::Arc;

use crate::buffer::{BufferType, CpuBufferType};
use crate::page_plan::{AdvicePolicy, Prefetch, ProgressFn};
use crate::tensor::TensorInfo;

use super::mode::LoadMode;
use super::report::Budget;

/// A per-tensor routing rule: `Some(buffer type)` sends the tensor to a
/// buffer of that type, `None` to the default ([`LoadOptions::buffer_type`],
/// the mapping on the mapped path). Buffer types are told apart by identity
/// (the same `Arc`), and each gets one buffer, as in ggml.
pub type Route = Arc<dyn Fn(&TensorInfo) -> Option<Arc<dyn BufferType>> + Send + Sync>;

/// How to load: the defaults (`LoadOptions::default()`), changed with
/// the setters, each of which says its default.
///
/// ```
/// use std::sync::Arc;
/// use weightmap::buffer::SimDeviceBufferType;
/// use weightmap::{LoadOptions, Prefetch, Weights};
/// # fn main() -> weightmap::Result<()> {
/// let gpu = Arc::new(SimDeviceBufferType::new(256, usize::MAX)?);
/// let opts = LoadOptions::default()
///     .prefetch(Prefetch::None)
///     // Layers 0 and 1 on the device, everything else mapped.
///     .route(move |t| {
///         let layer: Option<u32> = t.name.strip_prefix("blk.")?.split('.').next()?.parse().ok();
///         (layer? < 2).then(|| gpu.clone() as Arc<dyn weightmap::buffer::BufferType>)
///     });
/// # let mut w = weightmap::gguf::Writer::new(32);
/// # w.tensor("blk.0.attn_q.weight", weightmap::TensorType::F32, &[64], vec![0; 256]);
/// # w.tensor("blk.2.attn_q.weight", weightmap::TensorType::F32, &[64], vec![0; 256]);
/// let weights = Weights::from_memory(w.to_bytes(), &opts)?;
/// assert_eq!(weights.tensor("blk.0.attn_q.weight")?.buffer().type_name(), "SimDevice");
/// assert!(weights.tensor("blk.2.attn_q.weight")?.buffer().is_host());
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct LoadOptions {
    /// Mapped or streamed (default [`LoadMode::Mmap`]).
    pub(crate) mode: LoadMode,
    /// Continue on the stream path when the mapped path cannot be used
    /// (default `true`). Off, the mapped path's failure is returned as
    /// [`crate::Error::MmapFailed`].
    pub(crate) fallback: bool,
    /// Access advice for the mapped tensor region (default
    /// [`AdvicePolicy::PerTensor`]: `MADV_RANDOM` on row-lookup tables only).
    pub(crate) advice: AdvicePolicy,
    /// Prefetch of the mapped tensor region (default
    /// [`Prefetch::Background`] within 50% of the available memory).
    pub(crate) prefetch: Prefetch,
    /// `mlock` the mapping (default off). Failure is an error
    /// ([`crate::Error::Mlock`]).
    pub(crate) mlock: bool,
    /// Where tensors go by default (the CPU buffer type with 32-byte
    /// alignment). On the mapped path a type that can wrap host memory
    /// ([`BufferType::supports_host_ptr`]) views the mapping; one that cannot
    /// makes the load fall back to the stream path.
    pub(crate) buffer_type: Arc<dyn BufferType>,
    /// Per-tensor routing to other buffer types (default none).
    pub(crate) route: Option<Route>,
    /// On the mapped path, fall back to the stream path when any tensor
    /// would have to be copied because it is misaligned, rather than copy
    /// just that tensor (default off: hybrid placement).
    pub(crate) require_all_mapped: bool,
    /// Bytes of the staging buffer used to copy into a buffer that is not
    /// host-visible (default 4 MiB).
    pub(crate) staging_bytes: usize,
    /// Threads reading copied tensors (default 0: the available
    /// parallelism, at most 4, for buffered reads, and 4 for direct reads,
    /// which wait on the device rather than the CPU).
    pub(crate) read_threads: usize,
    /// Direct I/O on the stream path (default [`DirectIo::Auto`]).
    pub(crate) direct_io: DirectIo,
    /// Called with `(bytes_done, bytes_total)` as tensors are read (the
    /// stream path, copies, and the mapped path's prefetch); returning
    /// `Break` cancels the load with [`crate::Error::Cancelled`] (or stops a
    /// background prefetch). Default none.
    pub(crate) progress: Option<ProgressFn>,
    pub(crate) budget: Option<u64>,
    pub(crate) ignore_budget: bool,
    /// Re-read the mapped region the page cache held in small folios
    /// (default off).
    pub(crate) reread_small_folios: bool,
    /// Set by the load of a model in several files for each of them: what
    /// was decided for the model as a whole.
    pub(crate) shard_of_model: Option<Arc<ShardOfModel>>,
}

/// What a load of a model in several files decides once, for the model,
/// and hands each file's load: so that the files plan as the same model in
/// one file would.
#[derive(Debug)]
pub(crate) struct ShardOfModel {
    /// The budget, read once for the model (its own cached pages are every
    /// file's).
    pub(crate) budget: Budget,
    /// This file's tensors read whole that stream, chosen among the whole
    /// model's ([`streamed_across`](crate::page_plan::plan::streamed_across)).
    pub(crate) streamed: Vec<usize>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            mode: LoadMode::Mmap,
            fallback: true,
            advice: AdvicePolicy::PerTensor,
            prefetch: Prefetch::DEFAULT,
            mlock: false,
            buffer_type: Arc::new(CpuBufferType::new()),
            route: None,
            require_all_mapped: false,
            staging_bytes: 4 << 20,
            read_threads: 0,
            direct_io: DirectIo::Auto,
            progress: None,
            budget: None,
            ignore_budget: false,
            reread_small_folios: false,
            shard_of_model: None,
        }
    }
}

impl fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadOptions")
            .field("mode", &self.mode)
            .field("fallback", &self.fallback)
            .field("advice", &self.advice)
            .field("prefetch", &self.prefetch)
            .field("mlock", &self.mlock)
            .field("buffer_type", &self.buffer_type.name())
            .field("route", &self.route.as_ref().map(|_| "<fn>"))
            .field("require_all_mapped", &self.require_all_mapped)
            .field("staging_bytes", &self.staging_bytes)
            .field("read_threads", &self.read_threads)
            .field("direct_io", &self.direct_io)
            .field("progress", &self.progress.as_ref().map(|_| "<fn>"))
            .field("budget", &self.budget)
            .field("ignore_budget", &self.ignore_budget)
            .field("reread_small_folios", &self.reread_small_folios)
            .field("shard_of_model", &self.shard_of_model)
            .finish()
    }
}

impl LoadOptions {
    /// How often, in bytes read, the stream path calls the progress callback
    /// ([`LoadOptions::progress`]): every this many bytes, and once at the end.
    pub const PROGRESS_STEP: u64 = PROGRESS_STEP;

    /// Mapped or streamed (default [`LoadMode::Mmap`]).
    pub fn mode(mut self, mode: LoadMode) -> Self {
        self.mode = mode;
        self
    }

    /// Continue on the stream path when the mapped path cannot be used
    /// (default `true`). Off, the mapped path's failure is returned as
    /// [`crate::Error::MmapFailed`].
    pub fn fallback(mut self, yes: bool) -> Self {
        self.fallback = yes;
        self
    }

    /// Access advice for the mapped tensor region (default
    /// [`AdvicePolicy::PerTensor`]: `MADV_RANDOM` on row-lookup tables only).
    pub fn advice(mut self, advice: AdvicePolicy) -> Self {
        self.advice = advice;
        self
    }

    /// Prefetch of the mapped tensor region (default
    /// [`Prefetch::Background`] within 50% of the available memory).
    pub fn prefetch(mut self, prefetch: Prefetch) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// After the prefetch ([`Prefetch::Background`] or
    /// [`Prefetch::Populate`]) has mapped the region, drop and read again
    /// what the page cache held in small folios, so that it is read in
    /// huge-page folios (default off).
    ///
    /// The page cache outlives the process that filled it: a file another
    /// process read with `MADV_WILLNEED` (llama.cpp, weightmap before 0.2)
    /// or wrote stays in base-page folios, and decode over it runs slower
    /// for as long as it stays (ARCHITECTURE.md, "Huge pages for the
    /// weights").
    /// [`Weights::huge_pages`](crate::Weights::huge_pages) tells whether it
    /// did ([`HugePages::mapped_small`](crate::HugePages::mapped_small)). For a
    /// server that will decode for hours, reading those bytes from storage
    /// once more is worth it; pages that another process still maps cannot
    /// be dropped and stay as they are. A range is re-read when at least a
    /// quarter of what could be in huge pages (and at least one huge page)
    /// is in small folios.
    ///
    /// Where it cannot act, nothing is re-read and
    /// [`LoadReport::reread`](crate::LoadReport::reread) says why
    /// ([`Reread::Refused`](crate::Reread::Refused)): under
    /// [`AdvicePolicy::Uniform`], where the kernel does not take
    /// `MADV_HUGEPAGE` (other platforms, no transparent huge pages), and
    /// with a prefetch that does not map the whole region
    /// ([`Prefetch::None`], [`Prefetch::WillNeed`], a region over its share
    /// of the memory budget). The bytes re-read are in
    /// [`PrefetchProgress::bytes_reread`](crate::PrefetchProgress::bytes_reread),
    /// for a populate as for a background prefetch.
    pub fn reread_small_folios(mut self, yes: bool) -> Self {
        self.reread_small_folios = yes;
        self
    }

    /// `mlock` the mapping (default off). Failure is an error
    /// ([`crate::Error::Mlock`]).
    pub fn mlock(mut self, yes: bool) -> Self {
        self.mlock = yes;
        self
    }

    /// Where tensors go by default (the CPU buffer type with 32-byte
    /// alignment). On the mapped path a type that can wrap host memory
    /// ([`BufferType::supports_host_ptr`]) views the mapping; one that cannot
    /// makes the load fall back to the stream path.
    pub fn buffer_type(mut self, bt: Arc<dyn BufferType>) -> Self {
        self.buffer_type = bt;
        self
    }

    /// Per-tensor routing to other buffer types (default none).
    pub fn route(
        mut self,
        rule: impl Fn(&TensorInfo) -> Option<Arc<dyn BufferType>> + Send + Sync + 'static,
    ) -> Self {
        self.route = Some(Arc::new(rule));
        self
    }

    /// On the mapped path, fall back to the stream path when any tensor
    /// would have to be copied because it is misaligned, rather than copy
    /// just that tensor (default off: hybrid placement).
    pub fn require_all_mapped(mut self, yes: bool) -> Self {
        self.require_all_mapped = yes;
        self
    }

    /// Bytes of the staging buffer used to copy into a buffer that is not
    /// host-visible (default 4 MiB).
    pub fn staging_bytes(mut self, n: usize) -> Self {
        self.staging_bytes = n;
        self
    }

    /// Threads reading copied tensors (default 0: the available
    /// parallelism, at most 4, for buffered reads, and 4 for direct reads,
    /// which wait on the device rather than the CPU).
    pub fn read_threads(mut self, n: usize) -> Self {
        self.read_threads = n;
        self
    }

    /// Direct I/O on the stream path (default [`DirectIo::Auto`]).
    pub fn direct_io(mut self, d: DirectIo) -> Self {
        self.direct_io = d;
        self
    }

    /// The memory budget to hold the load to, in bytes, instead of the one
    /// read from the system (default: read; see [`crate::Budget`]).
    pub fn budget(mut self, bytes: u64) -> Self {
        self.budget = Some(bytes);
        self
    }

    /// Go ahead with copies and locks larger than the memory budget
    /// (default off: they are refused with [`crate::Error::OverBudget`]).
    /// The prefetch still keeps to the budget.
    pub fn ignore_budget(mut self, yes: bool) -> Self {
        self.ignore_budget = yes;
        self
    }

    /// Called with `(bytes_done, bytes_total)` as tensors are read (the
    /// stream path, copies, and the mapped path's prefetch); returning
    /// `Break` cancels the load with [`crate::Error::Cancelled`] (or stops a
    /// background prefetch). Default none.
    pub fn progress(
        mut self,
        f: impl Fn(u64, u64) -> std::ops::ControlFlow<()> + Send + Sync + 'static,
    ) -> Self {
        self.progress = Some(Arc::new(f));
        self
    }

    /// Threads for buffered reads: the cores, at most 4, unless set.
    pub(crate) fn threads(&self) -> usize {
        self.threads_or(default_threads())
    }

    /// Threads for direct reads: [`DIRECT_THREADS`] unless
    /// set.
    pub(crate) fn direct_threads(&self) -> usize {
        self.threads_or(DIRECT_THREADS)
    }

    fn threads_or(&self, default: usize) -> usize {
        if self.read_threads == 0 {
            default
        } else {
            self.read_threads
        }
    }

    /// The buffer type tensor `t` goes to.
    pub(crate) fn target(&self, t: &TensorInfo) -> std::borrow::Cow<'_, Arc<dyn BufferType>> {
        use std::borrow::Cow;
        // No `Arc` clone per tensor on the common, unrouted path.
        match self.route.as_ref().and_then(|r| r(t)) {
            Some(bt) => Cow::Owned(bt),
            None => Cow::Borrowed(&self.buffer_type),
        }
    }
}

/// Bytes between two progress calls.
pub(crate) const PROGRESS_STEP: u64 = 16 << 20;

/// Whether the stream path reads with `O_DIRECT`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DirectIo {
    /// Direct when the file is mostly not in the page cache (less than half
    /// resident, by a sampled `mincore`), buffered when
    /// it mostly is: from a warm cache a copy out of the cache beats a read
    /// from storage, and from a cold one a direct read skips the page-cache
    /// copy of every byte (the default).
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

/// The default number of threads for direct reads, whatever the core
/// count: they wait on the device, and more requests in flight keep it
/// busier. 4 rather than 2: faster cold loads even on 2 cores, where 8
/// gain nothing over 4; BENCHMARKS.md, "Stream path from a cold cache:
/// direct I/O", "Threads".
pub(crate) const DIRECT_THREADS: usize = 4;

/// The default number of reading threads: the available parallelism,
/// capped at 4 (more threads than that only queue on one device).
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}
