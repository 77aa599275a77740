//! The loader: [`Weights::load`] maps a file and places its tensors
//! zero-copy, or streams them into an owned buffer, and reports which ran.
//!
//! ```
//! use weightmap::{gguf::write::Writer, LoadMode, LoadOptions, TensorType, Weights};
//! # fn main() -> weightmap::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("model.gguf");
//! let mut w = Writer::new(32);
//! w.kv_u32("llama.block_count", 1);
//! w.tensor("w", TensorType::F32, &[4], 1.5f32.to_le_bytes().repeat(4));
//! w.write_with(std::fs::File::create(&path).unwrap(), |_, _| {}).unwrap();
//!
//! // SAFETY: nothing modifies or truncates the file while `weights` lives.
//! let weights = unsafe { Weights::load(&path, &LoadOptions::default())? };
//! assert_eq!(weights.report().mode_used, LoadMode::Mmap);
//! assert_eq!(weights.tensor("w")?.view::<f32>()?, &[1.5; 4]);
//! assert_eq!(weights.gguf_metadata().unwrap().get_u32("llama.block_count")?, 1);
//!
//! // The stream path is safe and gives the same bytes.
//! let streamed = Weights::load_streamed(&path, &LoadOptions::default())?;
//! assert_eq!(streamed.tensor("w")?.to_vec()?, weights.tensor("w")?.to_vec()?);
//! # Ok(()) }
//! ```

use std::fmt;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::buffer::{
    place, view, view_mut, Buffer, BufferType, BufferUsage, CpuBuffer, CpuBufferType, Element,
    MappedBuffer, Placement,
};
use crate::error::{Error, Result};
use crate::format::{read_at, read_header, Format, Header};
use crate::gguf::Metadata;
use crate::mmap::{AccessAdvice, Mapping, Residency};
pub use crate::prefetch::{AdvicePolicy, Prefetch};
use crate::prefetch::{PrefetchDecision, PrefetchProgress, Prefetcher};
use crate::tensor::TensorInfo;

/// Which load path to take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LoadMode {
    /// Map the file read-only and point tensors at it (the default).
    #[default]
    Mmap,
    /// Read the tensors into one owned buffer.
    Stream,
}

impl LoadMode {
    /// `"mmap"` or `"stream"`.
    pub fn name(self) -> &'static str {
        match self {
            LoadMode::Mmap => "mmap",
            LoadMode::Stream => "stream",
        }
    }
}

/// How to load.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Mapped or streamed (default [`LoadMode::Mmap`]).
    pub mode: LoadMode,
    /// Continue on the stream path when the mapped path cannot be used
    /// (default `true`). Off, the mapped path's failure is returned as
    /// [`Error::MmapFailed`].
    pub fallback: bool,
    /// Access advice for the mapped tensor region (default
    /// [`AdvicePolicy::PerTensor`]: `MADV_RANDOM` on row-lookup tables only).
    pub advice: AdvicePolicy,
    /// Prefetch of the mapped tensor region (default
    /// [`Prefetch::Background`] within 50% of the available memory).
    pub prefetch: Prefetch,
    /// `mlock` the mapping (default off). Failure is an error ([`Error::Mlock`]).
    pub mlock: bool,
    /// Where tensors go (default [`CpuBufferType`], 32-byte alignment).
    pub buffer_type: Arc<dyn BufferType>,
    /// Bytes of the staging buffer used to stream into a non-host buffer type.
    pub staging_bytes: usize,
    #[doc(hidden)]
    /// Called on the mapped path after mapping and validation, just before
    /// the file is re-checked and tensors are placed. For tests of what the
    /// loader does when a file changes under it.
    pub before_place_hook: Option<fn(&Path)>,
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
            staging_bytes: 4 << 20,
            before_place_hook: None,
        }
    }
}

impl LoadOptions {
    /// Default options with `mode`.
    pub fn with_mode(mode: LoadMode) -> Self {
        LoadOptions {
            mode,
            ..Default::default()
        }
    }
}

/// Why the mapped path was not used. Each says what and where.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FallbackReason {
    /// This platform has no file mapping weightmap uses.
    Unsupported,
    /// The buffer type is not host-visible: tensors must be copied to it.
    NotHostBuffer {
        /// The buffer type's name.
        buffer_type: String,
    },
    /// The path is not a regular file (a directory, a FIFO, a device).
    NotRegularFile,
    /// Opening the file failed.
    Open {
        /// The OS error.
        error: String,
    },
    /// The file is empty: there is nothing to map.
    EmptyFile,
    /// `mmap` failed (a filesystem that refuses it, no address space, ...).
    Map {
        /// The OS error.
        error: String,
    },
    /// The header failed validation; the stream path re-validates and reports it.
    InvalidFile {
        /// The error's [`Error::kind`].
        kind: &'static str,
        /// The error's message.
        message: String,
    },
    /// A tensor's address is not aligned for the buffer type.
    Misaligned {
        /// The first such tensor, in file order.
        tensor: String,
        /// Its address in the mapping.
        address: usize,
        /// Its file offset.
        file_offset: u64,
        /// The alignment it needs.
        alignment: usize,
    },
    /// A tensor runs past the end of the file.
    OutOfBounds {
        /// The tensor.
        tensor: String,
        /// Where its bytes end.
        end: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The file's length changed after it was mapped.
    FileChanged {
        /// Length when mapped.
        expected: u64,
        /// Length when re-checked.
        found: u64,
    },
}

impl FallbackReason {
    /// A short, stable name: `"unsupported"`, `"not_host"`, `"not_regular_file"`,
    /// `"open"`, `"empty_file"`, `"map"`, `"invalid_file"`, `"misaligned"`,
    /// `"out_of_bounds"`, `"file_changed"`.
    pub fn kind(&self) -> &'static str {
        match self {
            FallbackReason::Unsupported => "unsupported",
            FallbackReason::NotHostBuffer { .. } => "not_host",
            FallbackReason::NotRegularFile => "not_regular_file",
            FallbackReason::Open { .. } => "open",
            FallbackReason::EmptyFile => "empty_file",
            FallbackReason::Map { .. } => "map",
            FallbackReason::InvalidFile { .. } => "invalid_file",
            FallbackReason::Misaligned { .. } => "misaligned",
            FallbackReason::OutOfBounds { .. } => "out_of_bounds",
            FallbackReason::FileChanged { .. } => "file_changed",
        }
    }
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FallbackReason::Unsupported => write!(f, "file mapping is not supported on this platform"),
            FallbackReason::NotHostBuffer { buffer_type } => {
                write!(f, "buffer type '{buffer_type}' is not host-visible")
            }
            FallbackReason::NotRegularFile => write!(f, "not a regular file"),
            FallbackReason::Open { error } => write!(f, "open failed: {error}"),
            FallbackReason::EmptyFile => write!(f, "the file is empty"),
            FallbackReason::Map { error } => write!(f, "mmap failed: {error}"),
            FallbackReason::InvalidFile { message, .. } => write!(f, "invalid file: {message}"),
            FallbackReason::Misaligned {
                tensor,
                address,
                file_offset,
                alignment,
            } => write!(
                f,
                "tensor '{tensor}' at file offset {file_offset} (address {address:#x}) is not aligned to {alignment}"
            ),
            FallbackReason::OutOfBounds {
                tensor,
                end,
                file_len,
            } => write!(f, "tensor '{tensor}' ends at {end}, past the file's {file_len} bytes"),
            FallbackReason::FileChanged { expected, found } => {
                write!(f, "file length changed from {expected} to {found} while mapped")
            }
        }
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
    /// Bytes of the file viewed in place (the tensor region) on the mapped path.
    pub bytes_mapped: u64,
    /// Bytes copied into owned memory (tensor bytes, plus the header bytes read) on the stream path.
    pub bytes_copied: u64,
    /// The file's length.
    pub file_len: u64,
    /// Wall time of the whole load, including any failed mapped attempt.
    pub elapsed: Duration,
    /// What the prefetch policy did (see [`Weights::prefetch_progress`] for
    /// how far a background prefetch has got).
    pub prefetch: PrefetchDecision,
    /// The tensors advised `MADV_RANDOM` as row-lookup tables under
    /// [`AdvicePolicy::PerTensor`] (empty otherwise, and on the stream path).
    pub random_access_tensors: Vec<String>,
}

/// A file mapped read-only with every tensor placed in one non-owning CPU
/// buffer over it: the RAII owner of the mapped path.
///
/// The mapping is shared by this value and its [`MappedBuffer`] through an
/// `Arc`, so it is unmapped only after the buffer and every view (which
/// borrow this value) are gone.
#[derive(Debug)]
pub struct MappedWeights {
    path: std::path::PathBuf,
    header: Header,
    buffer: MappedBuffer,
    placements: Vec<Placement>,
    /// Dropped (stopped and joined) before the rest.
    prefetcher: Option<Prefetcher>,
    prefetch: PrefetchDecision,
    random_access: Vec<usize>,
}

impl MappedWeights {
    /// Map `path` and place its tensors, with no fallback.
    ///
    /// # Safety
    /// The file must not be modified or truncated, by this or any other
    /// process, while the returned value (or anything borrowed from it, or
    /// its [`MappedBuffer`]) lives. See [`Mapping`].
    ///
    /// # Errors
    /// [`Error::MmapFailed`] with the reason the mapped path could not be
    /// used, or [`Error::Mlock`].
    pub unsafe fn open(path: impl AsRef<Path>, options: &LoadOptions) -> Result<MappedWeights> {
        // SAFETY: forwarded to the caller.
        match unsafe { map_path(path.as_ref(), options) } {
            Ok(m) => Ok(m),
            Err(MapFail::Fallback(reason)) => Err(Error::MmapFailed { reason }),
            Err(MapFail::Error(e)) => Err(e),
        }
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The non-owning buffer over the tensor region.
    pub fn buffer(&self) -> &MappedBuffer {
        &self.buffer
    }

    /// The whole mapped file.
    pub fn file_bytes(&self) -> &[u8] {
        self.buffer.mapping().bytes()
    }

    /// Where each tensor (in file order) sits in the buffer.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }
}

enum MapFail {
    Fallback(FallbackReason),
    Error(Error),
}

impl From<FallbackReason> for MapFail {
    fn from(r: FallbackReason) -> Self {
        MapFail::Fallback(r)
    }
}

/// The mapped path. Every failure before placement is a fallback reason.
///
/// Safety: the caller promises the file is not changed while the result lives.
unsafe fn map_path(path: &Path, opts: &LoadOptions) -> std::result::Result<MappedWeights, MapFail> {
    // SAFETY: forwarded to the caller.
    unsafe { map_path_on(path, opts, crate::mmap::SUPPORTED) }
}

/// [`map_path`] with the platform's mmap support as a parameter, so the
/// `Unsupported` fallback can be tested on a platform that has mmap.
unsafe fn map_path_on(
    path: &Path,
    opts: &LoadOptions,
    mmap_supported: bool,
) -> std::result::Result<MappedWeights, MapFail> {
    if !mmap_supported {
        return Err(FallbackReason::Unsupported.into());
    }
    let bt = opts.buffer_type.as_ref();
    if !bt.is_host() {
        return Err(FallbackReason::NotHostBuffer {
            buffer_type: bt.name().to_owned(),
        }
        .into());
    }
    // Not File::open first: opening a FIFO blocks until a writer appears.
    let meta = std::fs::metadata(path).map_err(|e| FallbackReason::Open {
        error: e.to_string(),
    })?;
    if !meta.is_file() {
        return Err(FallbackReason::NotRegularFile.into());
    }
    let file = File::open(path).map_err(|e| FallbackReason::Open {
        error: e.to_string(),
    })?;
    let len = file
        .metadata()
        .map_err(|e| FallbackReason::Open {
            error: e.to_string(),
        })?
        .len();
    if len == 0 {
        return Err(FallbackReason::EmptyFile.into());
    }
    // SAFETY: forwarded to our caller, who promises the file stays unchanged.
    let map = unsafe { Mapping::map(&file) }.map_err(|e| FallbackReason::Map {
        error: e.to_string(),
    })?;
    let map = Arc::new(map);
    let header = Header::parse(map.bytes()).map_err(|e| match e {
        Error::TensorOutOfBounds {
            tensor,
            end,
            file_len,
            ..
        } => FallbackReason::OutOfBounds {
            tensor,
            end,
            file_len,
        },
        e => FallbackReason::InvalidFile {
            kind: e.kind(),
            message: e.to_string(),
        },
    })?;

    // Every tensor's end was checked against the mapping's length by the
    // parse above (TensorOutOfBounds → OutOfBounds); now every tensor's
    // address, before placing any.
    let base = map.addr();
    for t in header.tensors() {
        let alignment = header.required_alignment(t, bt.alignment());
        let address = base.wrapping_add(t.file_offset as usize);
        if address % alignment != 0 {
            return Err(FallbackReason::Misaligned {
                tensor: t.name.clone(),
                address,
                file_offset: t.file_offset,
                alignment,
            }
            .into());
        }
    }

    if let Some(hook) = opts.before_place_hook {
        hook(path);
    }
    // The contract forbids changing the file, but a truncation is cheap to
    // notice here, before any tensor is handed out.
    let now = file
        .metadata()
        .map_err(|e| FallbackReason::Open {
            error: e.to_string(),
        })?
        .len();
    if now != len {
        return Err(FallbackReason::FileChanged {
            expected: len,
            found: now,
        }
        .into());
    }

    let (start, end) = header.tensor_region();
    let (start, end) = (start as usize, end as usize);
    // Access advice: MADV_RANDOM only where reads really are by row.
    let random_access = crate::prefetch::apply_advice(&map, &header, opts.advice, start, end);
    if opts.mlock {
        map.lock().map_err(|source| {
            MapFail::Error(Error::Mlock {
                len: map.len(),
                limit: crate::mmap::memlock_limit(),
                source,
            })
        })?;
    }

    let buffer = MappedBuffer::new(Arc::clone(&map), start, end - start, bt.alignment())
        .map_err(MapFail::Error)?;
    let mut placements = Vec::with_capacity(header.tensors().len());
    for t in header.tensors() {
        let alignment = header.required_alignment(t, bt.alignment());
        let p = place(
            &buffer,
            &t.name,
            t.file_offset as usize - start,
            t.nbytes as usize,
            alignment,
        )
        .map_err(MapFail::Error)?;
        placements.push(p);
    }

    // Last, once everything is validated and placed: the prefetch.
    let bytes = (end - start) as u64;
    let (prefetcher, prefetch) = match opts.prefetch {
        Prefetch::None => (None, PrefetchDecision::Off),
        Prefetch::WillNeed => {
            map.will_need(start, end);
            (None, PrefetchDecision::WillNeed { bytes })
        }
        Prefetch::Populate => {
            crate::prefetch::populate(&map, start, end);
            (None, PrefetchDecision::Populated { bytes })
        }
        Prefetch::Background { max_percent } => Prefetcher::start(
            &map,
            start,
            end,
            max_percent,
            crate::prefetch::mem_available,
        ),
    };
    Ok(MappedWeights {
        path: path.to_owned(),
        header,
        buffer,
        placements,
        prefetcher,
        prefetch,
        random_access,
    })
}

/// A file offset as a mapping offset; offsets past `usize` clamp (the
/// mapping clamps them again to its length).
fn clamp(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// Tensors streamed into one owned buffer.
#[derive(Debug)]
struct StreamedWeights {
    header: Header,
    header_bytes: Vec<u8>,
    buffer: Box<dyn Buffer>,
    placements: Vec<Placement>,
}

/// Open a regular, non-empty file and read and validate its header without
/// reading tensor data: the stream path's first half, and `WeightsHeader`.
fn open_and_read_header(path: &Path) -> Result<(File, Header, Vec<u8>)> {
    // Not File::open first: opening a FIFO blocks until a writer appears.
    let meta = std::fs::metadata(path).map_err(|e| Error::io("stat", path, e))?;
    if !meta.is_file() {
        return Err(Error::NotAFile { path: path.into() });
    }
    let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io("stat", path, e))?
        .len();
    if len == 0 {
        return Err(Error::EmptyFile { path: path.into() });
    }
    let (header, bytes) = read_header(&file, len, path)?;
    Ok((file, header, bytes))
}

fn stream_path(path: &Path, opts: &LoadOptions) -> Result<StreamedWeights> {
    let (file, header, header_bytes) = open_and_read_header(path)?;

    let bt = opts.buffer_type.as_ref();
    let align = bt.alignment();
    let mut placements = Vec::with_capacity(header.tensors().len());
    let mut total = 0usize;
    for t in header.tensors() {
        let size = bt.alloc_size(t);
        let too_large = || Error::BufferTooLarge {
            buffer_type: bt.name().to_owned(),
            size: usize::MAX,
            max: bt.max_size(),
        };
        let offset = total
            .checked_next_multiple_of(align)
            .ok_or_else(too_large)?;
        total = offset.checked_add(size).ok_or_else(too_large)?;
        placements.push(Placement {
            offset,
            len: t.nbytes as usize,
        });
    }
    if total > bt.max_size() {
        return Err(Error::BufferTooLarge {
            buffer_type: bt.name().to_owned(),
            size: total,
            max: bt.max_size(),
        });
    }
    let mut buffer = bt.alloc_buffer_to_fill(total)?;
    buffer.set_usage(BufferUsage::Weights);
    // Re-check each placement against the buffer actually allocated.
    for (t, p) in header.tensors().iter().zip(&placements) {
        place(buffer.as_ref(), &t.name, p.offset, p.len, align)?;
    }
    let read_err = |e| Error::io("read", path, e);
    if let Some(dst) = buffer.host_bytes_mut() {
        // Straight into place: one positioned read per tensor, no staging.
        for (t, p) in header.tensors().iter().zip(&placements) {
            read_at(&file, &mut dst[p.offset..p.offset + p.len], t.file_offset)
                .map_err(read_err)?;
        }
    } else {
        let max_tensor = placements.iter().map(|p| p.len).max().unwrap_or(0);
        let mut staging = vec![0u8; opts.staging_bytes.max(1).min(max_tensor)];
        for (t, p) in header.tensors().iter().zip(&placements) {
            let mut done = 0usize;
            while done < p.len {
                let n = staging.len().min(p.len - done);
                read_at(&file, &mut staging[..n], t.file_offset + done as u64).map_err(read_err)?;
                buffer.set(p.offset + done, &staging[..n])?;
                done += n;
            }
        }
    }
    Ok(StreamedWeights {
        header,
        header_bytes,
        buffer,
        placements,
    })
}

#[derive(Debug)]
enum Storage {
    Mapped(MappedWeights),
    Streamed(StreamedWeights),
}

/// Loaded weights: the header, the metadata, and every tensor placed in a
/// buffer — a mapping's ([`LoadMode::Mmap`]) or an owned one ([`LoadMode::Stream`]).
#[derive(Debug)]
pub struct Weights {
    storage: Storage,
    report: LoadReport,
}

impl Weights {
    /// Load `path` as `options` say: mapped by default, falling back to the
    /// stream path (and saying why, in [`Weights::report`]) when the mapped
    /// path cannot be used.
    ///
    /// # Safety
    /// When the mapped path runs, the file must not be modified or truncated,
    /// by this or any other process, while the returned `Weights` lives: a
    /// changed file changes memory Rust assumes immutable, and a truncated
    /// one raises `SIGBUS` on access. Callers that cannot promise this use
    /// [`Weights::load_streamed`].
    ///
    /// # Errors
    /// Any validation error of the file (the stream path reports genuine
    /// corruption after a fallback), I/O errors, [`Error::MmapFailed`] when
    /// fallback is off, [`Error::Mlock`].
    pub unsafe fn load(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Weights> {
        let path = path.as_ref();
        let t0 = Instant::now();
        let mut fallback = None;
        if options.mode == LoadMode::Mmap {
            // SAFETY: forwarded to the caller.
            match unsafe { map_path(path, options) } {
                Ok(m) => {
                    let (start, end) = m.header.tensor_region();
                    let report = LoadReport {
                        format: m.header.format(),
                        mode_requested: LoadMode::Mmap,
                        mode_used: LoadMode::Mmap,
                        fallback: None,
                        tensors_count: m.header.tensors().len(),
                        bytes_mapped: end - start,
                        bytes_copied: 0,
                        file_len: m.header.file_len(),
                        elapsed: t0.elapsed(),
                        prefetch: m.prefetch.clone(),
                        random_access_tensors: m
                            .random_access
                            .iter()
                            .map(|&i| m.header.tensors()[i].name.clone())
                            .collect(),
                    };
                    return Ok(Weights {
                        storage: Storage::Mapped(m),
                        report,
                    });
                }
                Err(MapFail::Error(e)) => return Err(e),
                Err(MapFail::Fallback(reason)) if !options.fallback => {
                    return Err(Error::MmapFailed { reason })
                }
                Err(MapFail::Fallback(reason)) => fallback = Some(reason),
            }
        }
        let s = stream_path(path, options)?;
        let copied: u64 =
            s.placements.iter().map(|p| p.len as u64).sum::<u64>() + s.header_bytes.len() as u64;
        let report = LoadReport {
            format: s.header.format(),
            mode_requested: options.mode,
            mode_used: LoadMode::Stream,
            fallback,
            tensors_count: s.header.tensors().len(),
            bytes_mapped: 0,
            bytes_copied: copied,
            file_len: s.header.file_len(),
            elapsed: t0.elapsed(),
            prefetch: PrefetchDecision::NotMapped,
            random_access_tensors: Vec::new(),
        };
        Ok(Weights {
            storage: Storage::Streamed(s),
            report,
        })
    }

    /// Load `path` on the stream path only. Safe: nothing is mapped.
    ///
    /// # Errors
    /// As [`Weights::load`].
    pub fn load_streamed(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Weights> {
        let opts = LoadOptions {
            mode: LoadMode::Stream,
            ..options.clone()
        };
        // SAFETY: with LoadMode::Stream nothing is mapped, so the contract
        // of `load` (about mapped files) has nothing to hold.
        unsafe { Weights::load(path, &opts) }
    }

    /// What the load did.
    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        match &self.storage {
            Storage::Mapped(m) => &m.header,
            Storage::Streamed(s) => &s.header,
        }
    }

    /// The file's format.
    pub fn format(&self) -> Format {
        self.header().format()
    }

    /// The buffer holding the tensors.
    pub fn buffer(&self) -> &dyn Buffer {
        match &self.storage {
            Storage::Mapped(m) => &m.buffer,
            Storage::Streamed(s) => s.buffer.as_ref(),
        }
    }

    /// The mapped weights, when the mapped path ran.
    pub fn mapped(&self) -> Option<&MappedWeights> {
        match &self.storage {
            Storage::Mapped(m) => Some(m),
            Storage::Streamed(_) => None,
        }
    }

    /// How far the background prefetch has got: `None` when none was
    /// started (see [`LoadReport::prefetch`] for why).
    pub fn prefetch_progress(&self) -> Option<PrefetchProgress> {
        self.mapped()?.prefetcher.as_ref().map(Prefetcher::progress)
    }

    /// Block until the background prefetch, if one runs, has finished or
    /// stopped: for a runtime that wants every page read before its first
    /// pass (the reads began when `load` returned, so this waits only for
    /// what is left).
    pub fn wait_prefetch(&self) -> Option<PrefetchProgress> {
        self.mapped()?.prefetcher.as_ref().map(Prefetcher::wait)
    }

    /// Re-advise the pages of tensor `name` (`MADV_RANDOM` on the whole
    /// pages inside the tensor, so neighbours keep their advice; the others
    /// from the page holding its first byte). A documented no-op on streamed
    /// weights, whose bytes are owned memory.
    ///
    /// # Errors
    /// [`Error::TensorNotFound`].
    pub fn advise(&self, name: &str, access: AccessAdvice) -> Result<()> {
        let i = self.index_of(name)?;
        let r = self.tensor_infos()[i].file_range();
        self.advise_file_range(r, access);
        Ok(())
    }

    /// Re-advise the pages of the file range `range` of the mapping, as
    /// [`Weights::advise`] does for a tensor; clamped to the file. A no-op
    /// on streamed weights.
    pub fn advise_file_range(&self, range: std::ops::Range<u64>, access: AccessAdvice) {
        if let Some(m) = self.mapped() {
            let map = m.buffer.mapping();
            let (s, e) = (clamp(range.start), clamp(range.end));
            let _ = match access {
                AccessAdvice::Random => map.advise_inward(access, s, e),
                _ => map.advise(access, s, e),
            };
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
    /// documented no-op on streamed weights.
    ///
    /// # Errors
    /// [`Error::TensorNotFound`], or [`Error::Io`] if `madvise` fails.
    pub fn release(&self, name: &str) -> Result<()> {
        let i = self.index_of(name)?;
        let r = self.tensor_infos()[i].file_range();
        self.release_file_range(r)
    }

    /// [`Weights::release`] for every tensor: the whole tensor region.
    ///
    /// # Errors
    /// [`Error::Io`] if `madvise` fails.
    pub fn release_all(&self) -> Result<()> {
        let (s, e) = self.header().tensor_region();
        self.release_file_range(s..e)
    }

    fn release_file_range(&self, range: std::ops::Range<u64>) -> Result<()> {
        let Some(m) = self.mapped() else {
            return Ok(());
        };
        m.buffer
            .mapping()
            .release(clamp(range.start), clamp(range.end))
            .map_err(|e| Error::io("madvise", &m.path, e))
    }

    /// How much of tensor `name` is in the page cache (`mincore`); `None`
    /// on streamed weights.
    ///
    /// # Errors
    /// [`Error::TensorNotFound`], or [`Error::Io`] if `mincore` fails.
    pub fn residency(&self, name: &str) -> Result<Option<Residency>> {
        let i = self.index_of(name)?;
        let r = self.tensor_infos()[i].file_range();
        let Some(m) = self.mapped() else {
            return Ok(None);
        };
        m.buffer
            .mapping()
            .residency(clamp(r.start), clamp(r.end))
            .map(Some)
            .map_err(|e| Error::io("mincore", &m.path, e))
    }

    fn index_of(&self, name: &str) -> Result<usize> {
        self.header()
            .tensor_index(name)
            .ok_or_else(|| Error::TensorNotFound { name: name.into() })
    }

    fn placements(&self) -> &[Placement] {
        match &self.storage {
            Storage::Mapped(m) => &m.placements,
            Storage::Streamed(s) => &s.placements,
        }
    }

    /// Tensor descriptors in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        self.header().tensors()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensor_infos().len()
    }

    /// Whether there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensor_infos().is_empty()
    }

    /// The `i`th tensor in file order.
    pub fn tensor_at(&self, i: usize) -> Option<TensorRef<'_>> {
        Some(TensorRef {
            info: self.tensor_infos().get(i)?,
            buffer: self.buffer(),
            placement: *self.placements().get(i)?,
        })
    }

    /// The tensor called `name`.
    ///
    /// # Errors
    /// [`Error::TensorNotFound`].
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>> {
        self.header()
            .tensor_index(name)
            .and_then(|i| self.tensor_at(i))
            .ok_or_else(|| Error::TensorNotFound { name: name.into() })
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = TensorRef<'_>> + '_ {
        (0..self.len()).map(move |i| TensorRef {
            info: &self.tensor_infos()[i],
            buffer: self.buffer(),
            placement: self.placements()[i],
        })
    }

    fn header_bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped(m) => m.file_bytes(),
            Storage::Streamed(s) => &s.header_bytes,
        }
    }

    /// GGUF metadata (`None` for safetensors).
    pub fn gguf_metadata(&self) -> Option<Metadata<'_>> {
        self.header().gguf_metadata(self.header_bytes())
    }

    /// The safetensors `__metadata__` map (`None` for GGUF).
    pub fn safetensors_metadata(&self) -> Option<&std::collections::BTreeMap<String, String>> {
        self.header().safetensors_metadata()
    }
}

/// A placed tensor, borrowed from loaded [`Weights`]: read-only whatever the
/// mode. To change a weight, take [`TensorRef::to_owned_tensor`].
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'w> {
    info: &'w TensorInfo,
    buffer: &'w dyn Buffer,
    placement: Placement,
}

impl<'w> TensorRef<'w> {
    /// The descriptor.
    pub fn info(&self) -> &'w TensorInfo {
        self.info
    }

    /// The name.
    pub fn name(&self) -> &'w str {
        &self.info.name
    }

    /// Where the tensor sits in its buffer.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// The bytes, when the buffer is host-visible.
    pub fn host_bytes(&self) -> Option<&'w [u8]> {
        let b: &'w [u8] = self.buffer.host_bytes()?;
        b.get(self.placement.offset..self.placement.offset + self.placement.len)
    }

    /// The bytes as `T`, zero-copy.
    ///
    /// # Errors
    /// [`Error::NotHost`] for a device buffer, [`Error::ViewType`] or [`Error::ViewLayout`].
    pub fn view<T: Element>(&self) -> Result<&'w [T]> {
        let bytes = self.host_bytes().ok_or_else(|| Error::NotHost {
            buffer: self.buffer.type_name().to_owned(),
        })?;
        view(self.info, bytes)
    }

    /// Copy the bytes into `out` (which must be exactly the tensor's size);
    /// works on every buffer.
    ///
    /// # Errors
    /// [`Error::OutOfBuffer`] if `out` is the wrong size.
    pub fn read_into(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.placement.len {
            return Err(Error::OutOfBuffer {
                offset: 0,
                len: out.len(),
                buffer_size: self.placement.len,
            });
        }
        self.buffer.get(self.placement.offset, out)
    }

    /// The bytes, copied.
    ///
    /// # Errors
    /// As [`Buffer::get`].
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.placement.len];
        self.read_into(&mut v)?;
        Ok(v)
    }

    /// An owned, writable copy in a CPU buffer (for a runtime that must
    /// rewrite a weight: fusing batch-norm, repacking).
    ///
    /// # Errors
    /// [`Error::Alloc`], or as [`Buffer::get`].
    pub fn to_owned_tensor(&self) -> Result<OwnedTensor> {
        let mut buf = CpuBufferType::new().alloc(self.placement.len)?;
        self.buffer.get(self.placement.offset, buf.bytes_mut())?;
        Ok(OwnedTensor {
            info: self.info.clone(),
            buf,
        })
    }
}

/// A writable copy of one tensor, in its own 32-byte-aligned CPU buffer.
#[derive(Debug)]
pub struct OwnedTensor {
    info: TensorInfo,
    buf: CpuBuffer,
}

impl OwnedTensor {
    /// The descriptor.
    pub fn info(&self) -> &TensorInfo {
        &self.info
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.buf.bytes()
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.buf.bytes_mut()
    }

    /// The bytes as `T`.
    ///
    /// # Errors
    /// As [`crate::buffer::view`].
    pub fn view<T: Element>(&self) -> Result<&[T]> {
        view(&self.info, self.buf.bytes())
    }

    /// The bytes as writable `T`.
    ///
    /// # Errors
    /// As [`crate::buffer::view`].
    pub fn view_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        view_mut(&self.info, self.buf.bytes_mut())
    }
}

/// A file's validated header, read without reading tensor data: what
/// `weightmap inspect` and `validate` use.
#[derive(Debug)]
pub struct WeightsHeader {
    header: Header,
    bytes: Vec<u8>,
}

impl WeightsHeader {
    /// Read and validate the header of `path` (every check the loader makes
    /// short of mapping and placing).
    ///
    /// # Errors
    /// As [`Weights::load_streamed`], less the tensor reads.
    pub fn read(path: impl AsRef<Path>) -> Result<WeightsHeader> {
        let (_, header, bytes) = open_and_read_header(path.as_ref())?;
        Ok(WeightsHeader { header, bytes })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// GGUF metadata (`None` for safetensors).
    pub fn gguf_metadata(&self) -> Option<Metadata<'_>> {
        self.header.gguf_metadata(&self.bytes)
    }

    /// The first tensor whose file offset is not aligned as a buffer type of
    /// `buffer_alignment` needs for zero-copy placement (the mapping is
    /// page-aligned, so the file offset decides for alignments up to a page).
    pub fn first_misaligned(&self, buffer_alignment: usize) -> Option<(&TensorInfo, usize)> {
        self.header.tensors().iter().find_map(|t| {
            let a = self.header.required_alignment(t, buffer_alignment);
            (t.file_offset % a as u64 != 0).then_some((t, a))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_mmap_on_the_platform_is_a_fallback_reason() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tiny-llama.gguf");
        // SAFETY: the fixture is not modified.
        let r = unsafe { map_path_on(&path, &LoadOptions::default(), false) };
        assert!(matches!(
            r,
            Err(MapFail::Fallback(FallbackReason::Unsupported))
        ));
        // SAFETY: as above.
        let r = unsafe { map_path_on(&path, &LoadOptions::default(), true) };
        assert!(r.is_ok());
    }
}
