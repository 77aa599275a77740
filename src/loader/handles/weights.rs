//! [`Weights`]: what a load returns, and the tensor handles it gives out.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::buffer::{Buffer, CpuBufferType, Placement};
use crate::error::{Error, FallbackReason, Result};
use crate::format::{Format, Header};
use crate::gguf::Metadata;
use crate::os::{AccessAdvice, Mapping, Residency};
use crate::page_plan::announce::Announcer;
use crate::page_plan::plan::{plan_residency, shard_prefetch, streamed_across};
use crate::page_plan::prefetch::Prefetcher;
use crate::page_plan::{PrefetchProgress, PrefetchState};
use crate::tensor::TensorInfo;

use super::tensor_ref::TensorRef;
use crate::loader::budget::{self, CopyRule};
use crate::loader::copy::stream::stream_source;
use crate::loader::loaded::Loaded;
use crate::loader::mapped::{map_any, MapFail};
use crate::loader::mode::LoadMode;
use crate::loader::options::{LoadOptions, ShardOfModel};
use crate::loader::report::{HugePages, LoadReport, PlacementKind, ShardReport};
use crate::loader::shards;
use crate::loader::source::Source;

/// A file mapped read-only with its tensors placed over it: the RAII owner
/// of the mapped path. Tensors that could not be viewed in place (misaligned,
/// or routed to a buffer type that cannot wrap host memory) are copied into
/// owned buffers beside the mapped ones; [`MappedWeights::placements`] says
/// which.
///
/// The mapping is shared by this value, its buffers and a running prefetch
/// through an `Arc`; none of them can be cloned out, so the mapping lives
/// exactly as long as this value (and the `Weights` holding it).
#[derive(Debug)]
pub struct MappedWeights {
    inner: Loaded,
}

impl MappedWeights {
    /// Map `path` and place its tensors, with no fallback.
    ///
    /// # Safety
    /// The file must not be modified or truncated, by this or any other
    /// process, while the returned value, or anything obtained from it
    /// (buffers, tensor handles, views, metadata, and any buffer a
    /// [`crate::buffer::BufferType`] made from the mapping with
    /// `buffer_from_host_ptr`), lives: a changed file changes memory Rust
    /// assumes immutable, and a truncated one raises `SIGBUS` on access.
    ///
    /// # Errors
    /// [`Error::MmapFailed`] with the reason the mapped path could not be
    /// used; the file's own error (missing, empty, invalid, ...); [`Error::Mlock`].
    pub unsafe fn open(path: impl AsRef<Path>, options: &LoadOptions) -> Result<MappedWeights> {
        // SAFETY: forwarded to the caller.
        match unsafe { crate::loader::mapped::map_path(path.as_ref(), options) } {
            Ok(inner) => Ok(MappedWeights { inner }),
            Err(MapFail::Fallback(reason)) => Err(Error::MmapFailed { reason }),
            Err(MapFail::Error(e)) => Err(e),
        }
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.inner.header
    }

    /// The first buffer over the mapping (the default type's, when any
    /// tensor went there).
    pub fn buffer(&self) -> &dyn Buffer {
        self.inner.buffers[0].as_ref()
    }

    /// The whole mapped file.
    pub fn file_bytes(&self) -> &[u8] {
        self.inner.map.as_ref().map_or(&[], |m| m.bytes())
    }

    /// Where each tensor (in file order) sits in its buffer, and whether it
    /// is mapped or copied.
    pub fn placements(&self) -> impl ExactSizeIterator<Item = (Placement, PlacementKind)> + '_ {
        let infos = self.inner.header.tensors();
        self.inner
            .slots
            .iter()
            .zip(infos)
            .map(|(s, t)| (s.placement(t.nbytes), s.kind))
    }
}

#[derive(Debug)]
enum Storage {
    Mapped(MappedWeights),
    Streamed(Loaded),
}

impl Storage {
    fn loaded(&self) -> &Loaded {
        match self {
            Storage::Mapped(m) => &m.inner,
            Storage::Streamed(s) => s,
        }
    }

    fn loaded_mut(&mut self) -> &mut Loaded {
        match self {
            Storage::Mapped(m) => &mut m.inner,
            Storage::Streamed(s) => s,
        }
    }
}

/// Loaded weights: the header, the metadata, and every tensor placed in a
/// buffer: viewed in the file mapping ([`LoadMode::Mmap`]) or copied into
/// owned memory ([`LoadMode::Stream`], and on the mapped path the tensors
/// that cannot be viewed in place).
///
/// Every handle it gives out borrows it, so nothing that views the mapping
/// outlives the `Weights` (which the `# Safety` contract of
/// [`Weights::load`] covers):
///
/// ```compile_fail
/// # use weightmap::{LoadOptions, Weights};
/// let bytes = {
///     // SAFETY: the file is not modified.
///     let w = unsafe { Weights::load("model.gguf", &LoadOptions::default()) }.unwrap();
///     w.tensor("w").unwrap().host_bytes().unwrap()
/// }; // error: `w` does not live long enough
/// # let _ = bytes;
/// ```
#[derive(Debug)]
pub struct Weights {
    /// Reads ahead what the runtime announces; first, so that its thread
    /// is joined before any mapping goes.
    announcer: Announcer,
    /// One per file (a single file is a model of one shard); the first
    /// holds the model's metadata.
    parts: Vec<Storage>,
    /// The index, over all parts, of each part's first tensor, then the
    /// tensor count: tensor `i` is in the last part whose start is `<= i`.
    /// Every lookup, by index or by name, goes through it.
    starts: Vec<usize>,
    report: LoadReport,
    /// How copies made from the weights later are held to the budget.
    copies: CopyRule,
}

/// Load one file as `options` say: mapped, falling back to the stream path.
///
/// # Safety
/// As [`Weights::load`].
unsafe fn load_one(
    path: &Path,
    options: &LoadOptions,
) -> Result<(Storage, Option<FallbackReason>)> {
    // SAFETY: forwarded to the caller.
    unsafe { load_source(&Source::Path(path), options) }
}

/// [`load_one`] for any [`Source`].
///
/// # Safety
/// As [`Weights::load`], for the file behind `src` (memory needs nothing).
unsafe fn load_source(
    src: &Source<'_>,
    options: &LoadOptions,
) -> Result<(Storage, Option<FallbackReason>)> {
    let mut fallback = None;
    if options.mode == LoadMode::Mmap {
        // SAFETY: forwarded to the caller.
        match unsafe { map_any(src, options) } {
            Ok(inner) => return Ok((Storage::Mapped(MappedWeights { inner }), None)),
            Err(MapFail::Error(e)) => return Err(e),
            Err(MapFail::Fallback(reason)) if !options.fallback => {
                return Err(Error::MmapFailed { reason })
            }
            Err(MapFail::Fallback(reason)) => fallback = Some(reason),
        }
    }
    let s = stream_source(src, options).map_err(|e| match &fallback {
        Some(reason) => Error::FallbackFailed {
            reason: reason.clone(),
            source: Box::new(e),
        },
        None => e,
    })?;
    Ok((Storage::Streamed(s), fallback))
}

impl Weights {
    /// Weights of `parts` (one per file, in shard order).
    fn from_parts(parts: Vec<Storage>, report: LoadReport, options: &LoadOptions) -> Weights {
        let mut starts = Vec::with_capacity(parts.len() + 1);
        starts.push(0);
        for part in &parts {
            let n = starts[starts.len() - 1] + part.loaded().header.tensors().len();
            starts.push(n);
        }
        Weights {
            announcer: Announcer::new(report.budget.bytes, report.bytes_mapped, &report.residency),
            parts,
            starts,
            report,
            copies: CopyRule::of(options),
        }
    }

    /// Load `path` as `options` say: mapped by default, falling back to the
    /// stream path (and saying why, in [`Weights::report`]) when the mapped
    /// path cannot be used.
    ///
    /// `path` may name one file, any shard of a llama.cpp split GGUF
    /// (`NAME-00002-of-00005.gguf`: the others are found by name), a
    /// Hugging Face `*.safetensors.index.json`, or a directory holding one.
    /// Every shard's header is validated, and the shards against each other,
    /// before any is placed; then each file is mapped (or streamed) on its
    /// own, behind one name index. Metadata comes from the first shard, as
    /// in llama.cpp.
    ///
    /// # Safety
    /// Whenever the mapped path may run (`options.mode` is
    /// [`LoadMode::Mmap`]), the files must not be modified or truncated, by
    /// this or any other process, while the returned `Weights`, or anything
    /// obtained from it (tensor handles, views, buffers, metadata, and any
    /// buffer a [`crate::buffer::BufferType`] made from the mapping with
    /// `buffer_from_host_ptr`), lives: a changed file changes memory Rust
    /// assumes immutable, and a truncated one raises `SIGBUS` on access.
    /// Callers that cannot promise this use [`Weights::load_streamed`].
    ///
    /// # Errors
    /// The file's own errors, the same from either path: [`Error::Io`] (a
    /// missing file is `NotFound`), [`Error::NotAFile`], [`Error::EmptyFile`],
    /// any validation error. For several files: [`Error::MissingShard`],
    /// [`Error::SplitCountMismatch`], [`Error::SplitNoInvalid`],
    /// [`Error::SplitTensorsCount`], [`Error::DuplicateShardTensor`],
    /// [`Error::NotAShard`], [`Error::TensorNotInShard`],
    /// [`Error::UnlistedShardTensor`], [`Error::ShardIndex`], each naming the
    /// file. [`Error::MmapFailed`] when the mapped path cannot be used and
    /// fallback is off; [`Error::FallbackFailed`] when it could not be used
    /// and the stream path then failed; [`Error::Mlock`].
    pub unsafe fn load(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Weights> {
        let path = path.as_ref();
        let t0 = Instant::now();
        let files = shards::resolve(path)?;
        if let shards::Files::Single(p) = &files {
            // SAFETY: forwarded to the caller.
            let (mut part, fallback) = unsafe { load_one(p, options)? };
            if let Some(md) = part.loaded().header.gguf_metadata() {
                shards::single_is_split(p, md.get_opt_int::<u64>("split.count").ok().flatten())?;
            }
            let report = part.loaded_mut().report(options.mode, fallback, t0);
            return Ok(Weights::from_parts(vec![part], report, options));
        }
        // Several files: validate all, then load each.
        let (headers, warnings) = shards::check(&files)?;
        let total: u64 = headers
            .iter()
            .map(|h| {
                h.header
                    .tensor_region()
                    .1
                    .saturating_sub(h.header.tensor_region().0)
            })
            .sum();
        // One budget and one choice of what streams, for the model: each
        // file's own would see the whole budget.
        let own_cached = headers
            .iter()
            .filter_map(|h| {
                let (s, e) = h.header.tensor_region();
                let file = std::fs::File::open(&h.path).ok()?;
                Some(budget::cached_bytes(options, &file, e - s))
            })
            .sum();
        let budget = budget::current(options, own_cached);
        let each: Vec<&Header> = headers.iter().map(|h| &h.header).collect();
        let streamed = streamed_across(&each, budget.bytes);
        let mut parts = Vec::with_capacity(headers.len());
        let mut fallbacks = Vec::with_capacity(headers.len());
        for (h, streamed) in headers.iter().zip(streamed) {
            let mut opts = options.clone();
            opts.shard_of_model = Some(Arc::new(ShardOfModel {
                budget: budget.clone(),
                streamed,
            }));
            // Each shard's prefetch gets its share of the memory limit, so
            // that together they hold to it.
            let (s, e) = h.header.tensor_region();
            opts.prefetch = shard_prefetch(options.prefetch, e - s, total);
            // SAFETY: forwarded to the caller.
            let (part, fallback) = unsafe { load_one(&h.path, &opts)? };
            parts.push(part);
            fallbacks.push(fallback);
        }
        let report = combine_reports(&mut parts, &fallbacks, options.mode, warnings, t0);
        Ok(Weights::from_parts(parts, report, options))
    }

    /// Load a model that occupies `[offset, offset + len)` of the open
    /// `file`: an Android APK entry (`AAsset_openFileDescriptor64` gives a
    /// descriptor, a start and a length), or any container. The mapping
    /// starts at the page below `offset`; alignment is checked on absolute
    /// addresses and bounds against `len`, not the file's end; the stream
    /// path reads only the range (buffered). Tensor `file_offset`s are
    /// relative to `offset`. `file` is duplicated, not taken.
    ///
    /// # Safety
    /// As [`Weights::load`], for that range of the file.
    ///
    /// # Errors
    /// As [`Weights::load`]; [`Error::Truncated`] when the range runs past
    /// the file.
    pub unsafe fn load_file_range(
        file: &std::fs::File,
        offset: u64,
        len: u64,
        options: &LoadOptions,
    ) -> Result<Weights> {
        // SAFETY: forwarded to the caller.
        unsafe {
            Weights::single(
                &Source::Range { file, offset, len },
                options,
                Instant::now(),
            )
        }
    }

    /// Load one source into weights of one part.
    ///
    /// # Safety
    /// As [`Weights::load`], for the file behind `src` (memory needs nothing).
    unsafe fn single(src: &Source<'_>, options: &LoadOptions, t0: Instant) -> Result<Weights> {
        // SAFETY: forwarded to the caller.
        let (mut part, fallback) = unsafe { load_source(src, options)? };
        let report = part.loaded_mut().report(options.mode, fallback, t0);
        Ok(Weights::from_parts(vec![part], report, options))
    }

    /// Load a model from memory the caller hands over: a `Vec<u8>`, an
    /// `Arc<[u8]>`, or `include_bytes!`'s `&'static [u8]`. Safe: the memory
    /// is kept alive by the weights and cannot change behind them. With the
    /// default [`LoadMode::Mmap`] tensors are views into it wherever their
    /// addresses are aligned for their buffer type (hybrid placement copies
    /// the rest); [`LoadMode::Stream`] copies every tensor. Advice, release
    /// and residency are no-ops.
    ///
    /// ```
    /// use weightmap::{gguf::Writer, LoadOptions, TensorType, Weights};
    /// # fn main() -> weightmap::Result<()> {
    /// let mut w = Writer::new(32);
    /// w.tensor("w", TensorType::F32, &[4], 2.0f32.to_le_bytes().repeat(4));
    /// let weights = Weights::from_memory(w.to_bytes(), &LoadOptions::default())?;
    /// assert_eq!(weights.tensor("w")?.view::<f32>()?, &[2.0; 4]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Weights::load`], less the file's own.
    pub fn from_memory(
        bytes: impl AsRef<[u8]> + Send + Sync + 'static,
        options: &LoadOptions,
    ) -> Result<Weights> {
        // SAFETY: memory has no file to change: nothing to promise.
        unsafe { Weights::single(&Source::Memory(Arc::new(bytes)), options, Instant::now()) }
    }

    /// Load a model from bytes the caller lends, with the views borrowing
    /// them: no copy where a tensor's address is aligned (hybrid placement
    /// copies the rest). Safe: the result borrows `bytes`, so it cannot
    /// outlive them. Tensors are viewed through weightmap's own CPU buffers
    /// only: `options.buffer_type` and `options.route` are not used (a
    /// buffer type handed the borrowed memory could keep it past the
    /// borrow), so every tensor is on the default CPU type, with the
    /// alignment of `options.buffer_type`.
    ///
    /// ```
    /// use weightmap::{gguf::Writer, LoadOptions, TensorType, Weights};
    /// # fn main() -> weightmap::Result<()> {
    /// let mut w = Writer::new(32);
    /// w.tensor("w", TensorType::F32, &[4], 3.0f32.to_le_bytes().repeat(4));
    /// let bytes = w.to_bytes();
    /// let weights = Weights::from_slice(&bytes, &LoadOptions::default())?;
    /// assert_eq!(weights.tensor("w")?.view::<f32>()?, &[3.0; 4]);
    /// # Ok(()) }
    /// ```
    ///
    /// A view cannot outlive the bytes:
    ///
    /// ```compile_fail
    /// # use weightmap::{LoadOptions, Weights};
    /// let w = {
    ///     let bytes = vec![0u8; 64];
    ///     Weights::from_slice(&bytes, &LoadOptions::default()).unwrap()
    /// }; // error: `bytes` does not live long enough
    /// # let _ = w;
    /// ```
    ///
    /// # Errors
    /// As [`Weights::from_memory`].
    pub fn from_slice<'a>(bytes: &'a [u8], options: &LoadOptions) -> Result<BorrowedWeights<'a>> {
        let t0 = Instant::now();
        let align = options.buffer_type.alignment();
        let cpu: Arc<dyn crate::buffer::BufferType> =
            Arc::new(CpuBufferType::with_alignment(align)?);
        let mut opts = options.clone().buffer_type(cpu);
        opts.route = None;
        // SAFETY: the result is a `BorrowedWeights<'a>`, which holds every
        // handle to the mapping (its buffers and prefetch live inside the
        // `Weights` it owns; only weightmap's CPU buffer type is handed the
        // region, and keeps it there), so none outlives `bytes`; and `&'a
        // [u8]` cannot change while borrowed.
        let src = Source::Memory(unsafe { Mapping::borrowed_memory(bytes) });
        // SAFETY: memory has no file to change.
        let inner = unsafe { Weights::single(&src, &opts, t0)? };
        Ok(BorrowedWeights {
            inner,
            _bytes: std::marker::PhantomData,
        })
    }

    /// Load `path` on the stream path only. Safe: nothing is mapped.
    ///
    /// # Errors
    /// As [`Weights::load`].
    pub fn load_streamed(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Weights> {
        let opts = options.clone().mode(LoadMode::Stream);
        // SAFETY: with LoadMode::Stream nothing is mapped, so the contract
        // of `load` (about mapped files) has nothing to hold.
        unsafe { Weights::load(path, &opts) }
    }

    fn loaded(&self) -> &Loaded {
        self.parts[0].loaded()
    }

    /// What the load did.
    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// The validated header of the (first) file: its metadata is the
    /// model's. For a model in several files, [`Weights::tensor_infos`]
    /// lists every tensor and [`LoadReport::shards`] every file.
    pub fn header(&self) -> &Header {
        &self.loaded().header
    }

    /// The file's format.
    pub fn format(&self) -> Format {
        self.header().format()
    }

    /// The file that was loaded (the first shard, for several).
    pub fn path(&self) -> &Path {
        &self.loaded().path
    }

    /// The main buffer: the first one made (the mapped buffer of the
    /// default type, when there is one). See [`Weights::buffers`].
    pub fn buffer(&self) -> &dyn Buffer {
        self.loaded().buffers[0].as_ref()
    }

    /// Every buffer the load made: per file, one per buffer type over the
    /// mapping, then one per buffer type for copies.
    pub fn buffers(&self) -> impl Iterator<Item = &dyn Buffer> + '_ {
        self.parts
            .iter()
            .flat_map(|p| p.loaded().buffers.iter().map(|b| b.as_ref()))
    }

    /// The mapped weights of the (first) file, when the mapped path ran.
    pub fn mapped(&self) -> Option<&MappedWeights> {
        match &self.parts[0] {
            Storage::Mapped(m) => Some(m),
            Storage::Streamed(_) => None,
        }
    }

    /// Tensor descriptors in file order (shard by shard, for several files;
    /// each `file_offset` is within its own file).
    pub fn tensor_infos(&self) -> impl ExactSizeIterator<Item = TensorInfo<'_>> + '_ {
        (0..self.len()).map(move |i| {
            self.info_at(i)
                .expect("every index below len() is a tensor")
        })
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        *self
            .starts
            .last()
            .expect("starts ends with the tensor count")
    }

    /// Whether there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The descriptor of tensor `i`.
    fn info_at(&self, i: usize) -> Option<TensorInfo<'_>> {
        let (p, j) = self.loc(i)?;
        self.parts[p].loaded().header.tensors().get(j)
    }

    /// The thread that reads announced tensors ahead.
    pub(super) fn announcer(&self) -> &Announcer {
        &self.announcer
    }

    /// The part and the index in it of tensor `i`.
    fn loc(&self, i: usize) -> Option<(usize, usize)> {
        if i >= self.len() {
            return None;
        }
        let p = self.starts.partition_point(|&start| start <= i) - 1;
        Some((p, i - self.starts[p]))
    }

    /// The `i`th tensor in file order.
    pub fn tensor_at(&self, i: usize) -> Option<TensorRef<'_>> {
        let (p, j) = self.loc(i)?;
        let l = self.parts[p].loaded();
        let slot = l.slots.get(j)?;
        let info = l.header.tensors().get(j)?;
        Some(TensorRef::new(
            info,
            l.buffers[slot.buffer()].as_ref(),
            slot.placement(info.nbytes),
            slot.kind,
            self.copies,
        ))
    }

    /// The tensor called `name`.
    ///
    /// # Errors
    /// [`Error::TensorNotFound`].
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>> {
        self.index_of(name).and_then(|i| {
            self.tensor_at(i)
                .ok_or(Error::TensorNotFound { name: name.into() })
        })
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = TensorRef<'_>> + '_ {
        // Every index below len() has a slot: both paths place every tensor.
        (0..self.len()).map(move |i| self.tensor_at(i).expect("every tensor is placed"))
    }

    /// GGUF metadata (`None` for safetensors): the first file's.
    pub fn gguf_metadata(&self) -> Option<Metadata<'_>> {
        let l = self.loaded();
        l.header.gguf_metadata()
    }

    /// The safetensors `__metadata__` map (`None` for GGUF): the first file's.
    pub fn safetensors_metadata(&self) -> Option<&std::collections::BTreeMap<String, String>> {
        self.header().safetensors_metadata()
    }

    /// How far the background prefetch has got (over every file), or what a
    /// populate ([`Prefetch::Populate`](crate::Prefetch::Populate)) read
    /// before the load returned: `None` when neither ran (see
    /// [`LoadReport::prefetch`] for why).
    pub fn prefetch_progress(&self) -> Option<PrefetchProgress> {
        combine_progress(
            self.parts
                .iter()
                .filter_map(|p| p.loaded().prefetcher.as_ref().map(Prefetcher::progress)),
        )
    }

    /// Block until the background prefetch, if one runs, has finished or
    /// stopped: for a runtime that wants every page read before its first
    /// pass (the reads began when `load` returned, so this waits only for
    /// what is left).
    pub fn wait_prefetch(&self) -> Option<PrefetchProgress> {
        combine_progress(
            self.parts
                .iter()
                .filter_map(|p| p.loaded().prefetcher.as_ref().map(Prefetcher::wait)),
        )
    }

    /// The mapping and the file range of tensor `name`, when it is mapped.
    fn mapped_range(&self, name: &str) -> Result<Option<(&Mapping, std::ops::Range<u64>)>> {
        Ok(self
            .mapped_range_at(self.index_of(name)?)
            .map(|(m, r)| (m.as_ref(), r)))
    }

    /// Stop every background prefetch: a pass reads ahead itself, within its
    /// window, and two read-aheads would hold twice the page cache.
    pub(crate) fn stop_prefetch(&self) {
        for p in &self.parts {
            if let Some(pf) = &p.loaded().prefetcher {
                pf.stop();
            }
        }
    }

    /// Where the `i`th tensor's bytes start: its file (the part's index) and
    /// its offset in that file.
    pub(crate) fn file_position(&self, i: usize) -> Option<(usize, u64)> {
        let (p, j) = self.loc(i)?;
        Some((p, self.parts[p].loaded().header.tensors().at(j).file_offset))
    }

    /// The file that holds tensor `i` (its shard's, for several); the
    /// first shard's for an index past the end.
    pub(crate) fn path_of(&self, i: usize) -> &Path {
        let p = self.loc(i).map_or(0, |(p, _)| p);
        &self.parts[p].loaded().path
    }

    /// Give the file that holds the `i`th tensor, when it is mapped, the
    /// tensors' advice of its load again: a runtime's mapping followed
    /// since then ([`Mapping::follow`]) receives it too.
    pub(crate) fn advise_again(&self, i: usize) {
        let Some((p, _)) = self.loc(i) else { return };
        let l = self.parts[p].loaded();
        if let Some(map) = &l.map {
            crate::page_plan::plan::advise_tensors_again(
                map,
                &l.header,
                l.huge_pages,
                &self.report.residency,
                &l.random_access,
                &l.streamed,
            );
        }
    }

    /// The mapping that holds the `i`th tensor, when it is mapped, and the
    /// file range its mapped tensors span.
    pub(crate) fn mapped_extent_at(
        &self,
        i: usize,
    ) -> Option<(&Arc<Mapping>, std::ops::Range<u64>)> {
        let (p, _) = self.loc(i)?;
        let (map, _) = self.mapped_range_at(i)?;
        let part = self.starts[p]..self.starts[p + 1];
        let ranges = part.filter_map(|j| self.mapped_range_at(j)).map(|(_, r)| r);
        let (start, end) = ranges.fold((u64::MAX, 0), |(s, e), r| (s.min(r.start), e.max(r.end)));
        Some((map, start..end))
    }

    /// The mapping and the file range of the `i`th tensor, when it is mapped.
    pub(crate) fn mapped_range_at(
        &self,
        i: usize,
    ) -> Option<(&Arc<Mapping>, std::ops::Range<u64>)> {
        let (p, j) = self.loc(i)?;
        let l = self.parts[p].loaded();
        match (&l.map, l.slots[j].kind) {
            (Some(m), PlacementKind::Mapped) => Some((m, l.header.tensors().at(j).file_range())),
            _ => None,
        }
    }

    /// Re-advise the pages of tensor `name` (`MADV_RANDOM` on the whole
    /// pages inside the tensor, so neighbours keep their advice; the others
    /// from the page holding its first byte). A documented no-op on streamed
    /// weights and on copied tensors, whose bytes are owned memory.
    ///
    /// # Errors
    /// [`Error::TensorNotFound`].
    pub fn advise(&self, name: &str, access: AccessAdvice) -> Result<()> {
        if let Some((map, r)) = self.mapped_range(name)? {
            advise_range(map, r, access);
        }
        Ok(())
    }

    /// Re-advise the pages of the file range `range` of the (first) file's
    /// mapping, as [`Weights::advise`] does for a tensor; clamped to the
    /// file. A no-op on streamed weights.
    pub fn advise_file_range(&self, range: std::ops::Range<u64>, access: AccessAdvice) {
        if let Some(map) = &self.loaded().map {
            advise_range(map, range, access);
        }
    }

    /// Drop tensor `name`'s pages from memory (`MADV_DONTNEED` on this
    /// mapping, then `POSIX_FADV_DONTNEED` on the page cache), rounded
    /// inward to whole pages so neighbours stay: for a runtime that has
    /// copied the tensor to a device (llama.cpp's `unmap_fragment`). The
    /// tensor still reads correctly afterwards: its pages are read from the
    /// file again. A running background prefetch may read them back in;
    /// call [`Weights::wait_prefetch`] first. The kernel drops page-cache
    /// pages by folio: a large folio (up to 2 MiB on Linux 6.x) that also
    /// holds a neighbour's mapped bytes stays cached at each edge. A
    /// documented no-op on streamed weights and copied tensors.
    ///
    /// # Errors
    /// [`Error::TensorNotFound`], or [`Error::Io`] if `madvise` fails.
    pub fn release(&self, name: &str) -> Result<()> {
        match self.mapped_range(name)? {
            Some((map, r)) => self.release_in(map, r),
            None => Ok(()),
        }
    }

    /// [`Weights::release`] for every mapped tensor: every file's tensor region.
    ///
    /// # Errors
    /// [`Error::Io`] if `madvise` fails.
    pub fn release_all(&self) -> Result<()> {
        for p in &self.parts {
            let l = p.loaded();
            if let Some(map) = &l.map {
                let (s, e) = l.header.tensor_region();
                self.release_in(map, s..e)?;
            }
        }
        Ok(())
    }

    fn release_in(&self, map: &Mapping, r: std::ops::Range<u64>) -> Result<()> {
        let (start, end) = (clamp(r.start), clamp(r.end));
        // An announcement after this reads the range again.
        self.announcer.forget_read(map, start, end);
        map.release(start, end)
            .map_err(|e| Error::io("madvise", self.path(), e))
    }

    /// How much of tensor `name` is in the page cache (`mincore`); `None`
    /// on streamed weights and for copied tensors.
    ///
    /// # Errors
    /// [`Error::TensorNotFound`], or [`Error::Io`] if `mincore` fails.
    pub fn residency(&self, name: &str) -> Result<Option<Residency>> {
        match self.mapped_range(name)? {
            Some((map, r)) => map
                .residency(clamp(r.start), clamp(r.end))
                .map(Some)
                .map_err(|e| Error::io("mincore", self.path(), e)),
            None => Ok(None),
        }
    }

    /// How many bytes of the placed tensors are in huge pages now: the
    /// mapped buffers' bytes mapped with PMD entries, and the owned host
    /// buffers' bytes in transparent huge pages. Measured when called
    /// (`/proc/self/smaps`, about a millisecond), so ask after the first
    /// pass or [`Weights::wait_prefetch`]: a mapping has no pages until
    /// something reads them. Device buffers are not counted.
    ///
    /// ```no_run
    /// # fn main() -> weightmap::Result<()> {
    /// // SAFETY: model.gguf is not modified while loaded.
    /// let w = unsafe { weightmap::Weights::load("model.gguf", &Default::default())? };
    /// w.wait_prefetch();
    /// let h = w.huge_pages();
    /// if let Some(huge) = h.mapped_huge {
    ///     println!("{huge} of {} mapped bytes in huge pages", h.mapped_bytes);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn huge_pages(&self) -> HugePages {
        let mut ranges = Vec::new();
        let mut mapped = Vec::new();
        for b in self.buffers().filter(|b| b.is_host()) {
            if let Some(bytes) = b.host_bytes() {
                let start = bytes.as_ptr() as usize;
                ranges.push((start, start + bytes.len()));
                mapped.push(!b.owns_memory());
            }
        }
        let measured = crate::os::page_sizes(&ranges).ok();
        let known = measured.as_ref().map(|_| 0);
        let mut h = HugePages {
            mapped_bytes: 0,
            mapped_resident: known,
            mapped_huge: known,
            mapped_huge_capacity: 0,
            owned_bytes: 0,
            owned_huge: known,
        };
        let add = |total: &mut Option<u64>, n: Option<u64>| {
            if let (Some(t), Some(n)) = (total.as_mut(), n) {
                *t += n;
            }
        };
        for (i, &(s, e)) in ranges.iter().enumerate() {
            let m = measured.as_ref().map(|m| m[i]);
            if mapped[i] {
                h.mapped_bytes += (e - s) as u64;
                h.mapped_huge_capacity += crate::os::whole_huge_pages(s, e) as u64;
                add(&mut h.mapped_resident, m.map(|m| m.resident));
                add(&mut h.mapped_huge, m.map(|m| m.huge));
            } else {
                h.owned_bytes += (e - s) as u64;
                add(&mut h.owned_huge, m.map(|m| m.huge));
            }
        }
        h
    }

    /// The index (in file order, over every file) of the tensor called
    /// `name`, for [`Weights::tensor_at`]: each file's own name index is
    /// asked in turn (names are unique across shards).
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.parts
            .iter()
            .zip(&self.starts)
            .find_map(|(part, start)| Some(start + part.loaded().header.tensor_index(name)?))
    }

    /// [`Weights::tensor_index`], with [`Error::TensorNotFound`] for a name
    /// that is not there.
    pub(crate) fn index_of(&self, name: &str) -> Result<usize> {
        self.tensor_index(name)
            .ok_or_else(|| Error::TensorNotFound { name: name.into() })
    }
}

/// The progress of several prefetches as one.
fn combine_progress(it: impl Iterator<Item = PrefetchProgress>) -> Option<PrefetchProgress> {
    let mut out: Option<PrefetchProgress> = None;
    for p in it {
        out = Some(match out {
            None => p,
            Some(o) => PrefetchProgress {
                bytes_done: o.bytes_done + p.bytes_done,
                bytes_total: o.bytes_total + p.bytes_total,
                bytes_reread: o.bytes_reread + p.bytes_reread,
                // Running while any runs; otherwise the first that did not finish.
                state: if o.state == PrefetchState::Running || p.state == PrefetchState::Running {
                    PrefetchState::Running
                } else if o.state != PrefetchState::Finished {
                    o.state
                } else {
                    p.state
                },
            },
        });
    }
    out
}

/// One report for a model in several files.
fn combine_reports(
    parts: &mut [Storage],
    fallbacks: &[Option<FallbackReason>],
    requested: LoadMode,
    warnings: Vec<String>,
    t0: Instant,
) -> LoadReport {
    let mut each: Vec<LoadReport> = parts
        .iter_mut()
        .zip(fallbacks)
        .map(|(p, f)| p.loaded_mut().report(requested, f.clone(), t0))
        .collect();
    let first_copied = std::mem::take(&mut each[0].copied);
    let mut r = each[0].clone();
    r.copied = first_copied;
    r.shards = parts
        .iter()
        .zip(&each)
        .map(|(p, e)| ShardReport {
            path: p.loaded().path.clone(),
            tensors: e.tensors_count,
            bytes: e.bytes_mapped + e.bytes_copied,
            mode_used: e.mode_used,
            fallback: e.fallback.clone(),
        })
        .collect();
    for e in &mut each[1..] {
        r.tensors_count += e.tensors_count;
        r.tensors_mapped += e.tensors_mapped;
        r.tensors_copied += e.tensors_copied;
        r.bytes_mapped += e.bytes_mapped;
        r.bytes_copied += e.bytes_copied;
        r.copied.append(&mut e.copied);
        r.buffers.extend(e.buffers.iter().cloned());
        r.file_len += e.file_len;
        r.random_access_tensors
            .extend(e.random_access_tensors.iter().cloned());
        r.streamed_tensors
            .extend(e.streamed_tensors.iter().cloned());
        if e.mode_used == LoadMode::Stream {
            r.mode_used = LoadMode::Stream;
        }
        if r.fallback.is_none() {
            r.fallback = e.fallback.clone();
        }
    }
    let (whole, experts) = parts.iter().fold((0, 0), |(w, e), p| {
        let (pw, pe) = p.loaded().whole_and_expert_bytes;
        (w + pw, e + pe)
    });
    r.residency = plan_residency(r.budget.bytes, whole, experts);
    r.warnings = warnings;
    r.elapsed = t0.elapsed();
    r
}

fn advise_range(map: &Mapping, r: std::ops::Range<u64>, access: AccessAdvice) {
    let (s, e) = (clamp(r.start), clamp(r.end));
    let _ = match access {
        AccessAdvice::Random => map.advise_inward(access, s, e),
        _ => map.advise(access, s, e),
    };
}

/// A file offset as a mapping offset; offsets past `usize` clamp (the
/// mapping clamps them again to its length).
fn clamp(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// [`Weights`] over bytes borrowed from the caller ([`Weights::from_slice`]):
/// dereferences to `Weights`, and cannot outlive the bytes.
#[derive(Debug)]
pub struct BorrowedWeights<'a> {
    inner: Weights,
    _bytes: std::marker::PhantomData<&'a [u8]>,
}

impl std::ops::Deref for BorrowedWeights<'_> {
    type Target = Weights;
    fn deref(&self) -> &Weights {
        &self.inner
    }
}
