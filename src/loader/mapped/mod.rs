//! The mapped path: map the file, validate it, view every tensor that can
//! be viewed in place, copy only those that cannot, then prefetch.

use std::fs::{File, Metadata};
use std::path::Path;
use std::sync::Arc;

use crate::buffer::{address_alignment, place, BufferType, HostRegion};
use crate::error::{Error, FallbackReason};
use crate::format::Header;
use crate::loader::budget;
use crate::loader::copy::place::{add, copy_group, plan, Group, Placed, ReadCtx};
use crate::loader::copy::read::{Progress, ReadSrc};
use crate::loader::loaded::Loaded;
use crate::loader::options::LoadOptions;
use crate::loader::report::ReadReport;
use crate::loader::report::{Budget, CopiedTensor, CopyReason, DirectOutcome, PlacementKind};
use crate::loader::source::{check_range, open_checked, Source};
use crate::os::Mapping;
use crate::page_plan::prefetch::Prefetcher;
use crate::page_plan::{PagePlan, PlanOptions};

/// Why the mapped path stopped: a cause the stream path may do better on,
/// or an error it would only repeat.
pub(crate) enum MapFail {
    Fallback(FallbackReason),
    Error(Error),
}

impl From<FallbackReason> for MapFail {
    fn from(r: FallbackReason) -> Self {
        MapFail::Fallback(r)
    }
}

impl From<Error> for MapFail {
    fn from(e: Error) -> Self {
        MapFail::Error(e)
    }
}

#[cfg(test)]
thread_local! {
    /// Called after validation, just before the file is re-checked and
    /// tensors are placed: for tests of a file that changes under the loader.
    pub(crate) static BEFORE_PLACE: std::cell::Cell<Option<fn(&Path)>> =
        const { std::cell::Cell::new(None) };
    /// Makes the map call fail as a filesystem that refuses mmap does.
    pub(crate) static FAIL_MAP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The mapped path.
///
/// # Safety
/// The file must not be modified or truncated while the result, or any
/// buffer or view obtained from it, lives.
pub(crate) unsafe fn map_path(
    path: &Path,
    opts: &LoadOptions,
) -> std::result::Result<Loaded, MapFail> {
    // SAFETY: forwarded to the caller.
    unsafe { map_source(&Source::Path(path), opts, crate::os::SUPPORTED) }
}

/// [`map_path`] for any [`Source`].
///
/// # Safety
/// As [`map_path`], for the file behind `src` (memory needs nothing).
pub(crate) unsafe fn map_any(
    src: &Source<'_>,
    opts: &LoadOptions,
) -> std::result::Result<Loaded, MapFail> {
    // SAFETY: forwarded to the caller.
    unsafe { map_source(src, opts, crate::os::SUPPORTED) }
}

/// [`map_path_on`] for a path, for tests.
#[cfg(test)]
pub(crate) unsafe fn map_path_on(
    path: &Path,
    opts: &LoadOptions,
    mmap_supported: bool,
) -> std::result::Result<Loaded, MapFail> {
    // SAFETY: forwarded to the caller.
    unsafe { map_source(&Source::Path(path), opts, mmap_supported) }
}

/// The mapped path over `src`, with the platform's mmap support as a
/// parameter, so the `Unsupported` fallback can be tested on a platform
/// that has mmap. Each step is a function below, in this order.
///
/// # Safety
/// As [`map_path`].
unsafe fn map_source(
    src: &Source<'_>,
    opts: &LoadOptions,
    mmap_supported: bool,
) -> std::result::Result<Loaded, MapFail> {
    let label = src.label();
    let path = label.as_path();
    check_mappable(src, opts, mmap_supported)?;
    let opened = open_source(src, path)?;
    // SAFETY: forwarded to our caller, who promises the file stays unchanged.
    let map = unsafe { map_opened(src, &opened) }?;
    // Every tensor's type, size, offset and end, validated from the
    // mapping: invalid is an error here; it is parsed only once.
    let header = Header::in_mapping(&map)?;
    let routes = route_tensors(&header, map.addr(), opts)?;
    #[cfg(test)]
    if let Some(hook) = BEFORE_PLACE.with(|h| h.get()) {
        hook(path);
    }
    check_unchanged(src, &opened, path)?;
    let own_cached = opened
        .as_ref()
        .map_or(0, |(f, _)| budget::cached_bytes(opts, f, map.len() as u64));
    let (budget, budget_reader) = budget::read_once(opts, own_cached);
    let asked = PlanOptions {
        advice: opts.advice,
        prefetch: opts.prefetch,
        reread: opts.reread_small_folios,
        progress: opts.progress.clone(),
        streamed: opts.shard_of_model.as_ref().map(|m| m.streamed.clone()),
    };
    let mapped = routes.mapped.iter().flat_map(|g| g.tensors.iter().copied());
    let plan = PagePlan::advise(&map, &header, mapped, asked, budget.bytes, budget_reader)?;
    lock_if_asked(&map, &budget, opts)?;
    let mut placed = Placed::new(header.tensors().len())?;
    let region_start = header.tensor_region().0 as usize;
    place_mapped(
        &map,
        &header,
        &routes.mapped,
        region_start,
        opts,
        &mut placed,
    )?;
    let read = copy_tensors(
        src,
        &opened,
        &map,
        &header,
        &routes.copies,
        &budget,
        opts,
        &mut placed,
    )?;
    let (buffers, buffer_reports, slots) = placed.finish();
    // Last, once everything is validated and placed: the prefetch of what
    // stays mapped, as the plan says.
    let huge_pages = plan.prefetch.huge_pages;
    let (prefetcher, prefetch) = Prefetcher::start(&map, plan.prefetch)?;
    Ok(Loaded {
        budget,
        path: path.to_owned(),
        header,
        buffers,
        buffer_reports,
        slots,
        map: Some(map),
        prefetcher,
        prefetch,
        huge_pages,
        random_access: plan.random_access,
        streamed: plan.streamed,
        whole_and_expert_bytes: plan.whole_and_expert_bytes,
        reread: plan.reread,
        copied: routes.copied,
        read,
    })
}

/// Causes the stream path does better on: no mmap here, or a default buffer
/// type that cannot view host memory.
fn check_mappable(
    src: &Source<'_>,
    opts: &LoadOptions,
    mmap_supported: bool,
) -> std::result::Result<(), MapFail> {
    if !mmap_supported && !matches!(src, Source::Memory(_)) {
        return Err(FallbackReason::Unsupported.into());
    }
    let bt = &opts.buffer_type;
    if !bt.supports_host_ptr() {
        return Err(FallbackReason::NotHostBuffer {
            buffer_type: bt.name().to_owned(),
        }
        .into());
    }
    Ok(())
}

/// The open file behind `src` and its metadata then (`None` for memory). A
/// missing, unreadable, irregular or empty file is an error in either mode,
/// with its own type and `io::ErrorKind`; a file range must lie inside its
/// file.
fn open_source(
    src: &Source<'_>,
    path: &Path,
) -> std::result::Result<Option<(File, Metadata)>, MapFail> {
    Ok(match src {
        Source::Path(p) => Some(open_checked(p)?),
        Source::Range { file, offset, len } => {
            let meta = check_range(file, *offset, *len, path)?;
            let f = file.try_clone().map_err(|e| Error::io("dup", path, e))?;
            Some((f, meta))
        }
        Source::Memory(_) => None,
    })
}

/// Map the file (or the range: from the page below its start) read-only and
/// private; memory is viewed as it is. A refused map is a fallback.
///
/// # Safety
/// As [`map_path`], for the file `opened`.
unsafe fn map_opened(
    src: &Source<'_>,
    opened: &Option<(File, Metadata)>,
) -> std::result::Result<Arc<Mapping>, MapFail> {
    #[cfg(test)]
    if FAIL_MAP.with(|f| f.get()) {
        return Err(FallbackReason::Map {
            error: std::io::Error::from_raw_os_error(crate::os::REFUSED_MAP_ERROR).to_string(),
        }
        .into());
    }
    let map_err = |e: std::io::Error| FallbackReason::Map {
        error: e.to_string(),
    };
    let map = match (src, opened) {
        // SAFETY: forwarded to our caller, who promises the file stays unchanged.
        (Source::Path(_), Some((file, _))) => unsafe { Mapping::map(file) }.map_err(map_err)?,
        // SAFETY: as above, for the range.
        (Source::Range { offset, len, .. }, Some((file, _))) => {
            unsafe { Mapping::map_range(file, *offset, *len) }.map_err(map_err)?
        }
        (Source::Memory(m), _) => Mapping::from_memory(Arc::clone(m)),
        _ => unreachable!("a file source has an open file"),
    };
    Ok(Arc::new(map))
}

/// Where each tensor goes, decided before any is placed.
struct Routes {
    /// Viewed in the mapping, grouped by buffer type.
    mapped: Vec<Group>,
    /// Copied into owned buffers, grouped by buffer type.
    copies: Vec<Group>,
    /// The copied tensors and why, for the report.
    copied: Vec<CopiedTensor>,
}

/// Route every tensor: in the mapping if its buffer type can view host
/// memory and its address (the mapping at `base`) is aligned as that type
/// needs, else copied (or, under `require_all_mapped`, a fallback).
fn route_tensors(
    header: &Header,
    base: usize,
    opts: &LoadOptions,
) -> std::result::Result<Routes, MapFail> {
    let infos = header.tensors();
    let mut r = Routes {
        mapped: Vec::new(),
        copies: Vec::new(),
        copied: Vec::new(),
    };
    let copy = |r: &mut Routes, i: usize, target: &Arc<dyn BufferType>, reason| {
        let c = CopiedTensor {
            name: crate::alloc::string(infos.name(i), "the load report")?,
            reason,
        };
        crate::alloc::push(&mut r.copied, c, "the load report")?;
        add(&mut r.copies, target, i)
    };
    for i in 0..infos.len() {
        // Only a routing rule needs the whole descriptor.
        let target = match opts.route {
            Some(_) => opts.target(&infos.at(i)),
            None => std::borrow::Cow::Borrowed(&opts.buffer_type),
        };
        if !target.supports_host_ptr() {
            let buffer_type = target.name().to_owned();
            copy(&mut r, i, &target, CopyReason::Routed { buffer_type })?;
            continue;
        }
        let alignment = header.alignment_for(infos.ty(i), target.alignment());
        let file_offset = infos.file_range(i).start;
        let address = base.wrapping_add(file_offset as usize);
        if address % alignment == 0 {
            add(&mut r.mapped, &target, i)?;
        } else if opts.require_all_mapped {
            return Err(FallbackReason::Misaligned {
                tensor: infos.name(i).to_owned(),
                address,
                file_offset,
                alignment,
            }
            .into());
        } else {
            copy(
                &mut r,
                i,
                &target,
                CopyReason::Misaligned { address, alignment },
            )?;
        }
    }
    Ok(r)
}

/// The contract forbids changing the file, but a truncation, a rewrite that
/// moved the modification time, or a path that now names another file is
/// cheap to notice here, before any tensor is handed out.
fn check_unchanged(
    src: &Source<'_>,
    opened: &Option<(File, Metadata)>,
    path: &Path,
) -> std::result::Result<(), MapFail> {
    match (src, opened) {
        (Source::Path(p), Some((file, meta))) => same_file(file, p, meta),
        (Source::Range { .. }, Some((file, meta))) => same_length_and_time(file, path, meta),
        _ => Ok(()),
    }
}

/// `mlock` of the whole mapping, when asked: it pins every page, so it
/// must fit the memory budget.
fn lock_if_asked(map: &Mapping, budget: &Budget, opts: &LoadOptions) -> crate::error::Result<()> {
    if !opts.mlock {
        return Ok(());
    }
    budget::check(map.len() as u64, "mlock of the mapping", budget, opts)?;
    map.lock().map_err(|source| Error::Mlock {
        len: map.len(),
        limit: crate::os::memlock_limit(),
        source,
    })
}

/// One buffer per buffer type over the span of its mapped tensors; each
/// tensor placed at its own (checked) alignment, and the buffer's alignment
/// the least of them, so `Buffer::alignment` is true of all. With no
/// tensors at all, an empty view at the region's start (`region_start`).
fn place_mapped(
    map: &Arc<Mapping>,
    header: &Header,
    groups: &[Group],
    region_start: usize,
    opts: &LoadOptions,
    placed: &mut Placed,
) -> crate::error::Result<()> {
    let infos = header.tensors();
    let base = map.addr();
    if infos.is_empty() {
        let bt = &opts.buffer_type;
        let region = HostRegion::new(Arc::clone(map), region_start, 0)?;
        let buffer = bt.buffer_from_host_ptr(region, bt.alignment())?;
        placed.push(buffer, &[], Vec::new(), PlacementKind::Mapped);
    }
    for g in groups {
        let range = |i: usize| infos.file_range(i);
        let span_start = g.tensors.iter().map(|&i| range(i).start).min().unwrap_or(0) as usize;
        let span_end = g.tensors.iter().map(|&i| range(i).end).max().unwrap_or(0) as usize;
        let cap = g.bt.alignment();
        let align_of =
            |i: usize| address_alignment(base.wrapping_add(range(i).start as usize), cap);
        let least = g.tensors.iter().map(|&i| align_of(i)).min().unwrap_or(cap);
        let region = HostRegion::new(Arc::clone(map), span_start, span_end - span_start)?;
        let buffer = g.bt.buffer_from_host_ptr(region, least)?;
        placed.push_with(buffer, &g.tensors, PlacementKind::Mapped, |i, buffer| {
            let t = infos.at(i);
            let offset = t.file_offset as usize - span_start;
            place(buffer, t.name, offset, t.nbytes as usize, align_of(i))
        })?;
    }
    Ok(())
}

/// Read the tensors routed to `copies` from the file straight into one
/// owned buffer per type, in parallel (buffered: the file is mapped
/// anyway), once the host's part of them fits the budget. `None` when
/// nothing is copied.
#[allow(clippy::too_many_arguments)]
fn copy_tensors(
    src: &Source<'_>,
    opened: &Option<(File, Metadata)>,
    map: &Mapping,
    header: &Header,
    copies: &[Group],
    budget: &Budget,
    opts: &LoadOptions,
    placed: &mut Placed,
) -> crate::error::Result<Option<ReadReport>> {
    if copies.is_empty() {
        return Ok(None);
    }
    let infos = header.tensors();
    let mut plans = Vec::with_capacity(copies.len());
    let (mut total, mut host) = (0u64, 0u64);
    for g in copies {
        let (layout, bytes, _) = plan(g.bt.as_ref(), infos, &g.tensors, false)?;
        total += bytes;
        if g.bt.is_host() {
            host += bytes;
        }
        plans.push(layout);
    }
    budget::check(host, "the copied tensors", budget, opts)?;
    let progress = Progress::new(opts.progress.clone(), total);
    let read_src = match (src, opened) {
        (Source::Range { offset, .. }, Some((file, _))) => ReadSrc::File {
            file,
            base: *offset,
        },
        (_, Some((file, _))) => ReadSrc::File { file, base: 0 },
        (_, None) => ReadSrc::Memory(map.bytes()),
    };
    let label = src.label();
    let ctx = ReadCtx {
        src: read_src,
        direct_path: None,
        path: label.as_path(),
        staging_bytes: opts.staging_bytes,
        threads: opts.threads(),
        direct_threads: opts.direct_threads(),
        progress: &progress,
    };
    for (g, layout) in copies.iter().zip(plans) {
        let f = copy_group(&ctx, g.bt.as_ref(), infos, &g.tensors, layout)?;
        placed.push(f.buffer, &g.tensors, f.placements, PlacementKind::Copied);
    }
    Ok(Some(ReadReport {
        threads: ctx.threads,
        direct: DirectOutcome::Off,
    }))
}

/// Whether `file` (opened from `path`, `opened` its metadata then) is still
/// the same length and modification time, and `path` still names it.
fn same_file(file: &File, path: &Path, opened: &Metadata) -> std::result::Result<(), MapFail> {
    same_length_and_time(file, path, opened)?;
    let changed = |detail: String| MapFail::Fallback(FallbackReason::FileChanged { detail });
    match crate::os::same_file(file, path) {
        Ok(true) => {}
        Ok(false) => return Err(changed("the path now names another file".into())),
        Err(e) => return Err(changed(format!("the path is gone: {e}"))),
    }
    Ok(())
}

/// Whether `file` still has `opened`'s length and modification time.
fn same_length_and_time(
    file: &File,
    path: &Path,
    opened: &Metadata,
) -> std::result::Result<(), MapFail> {
    let changed = |detail: String| MapFail::Fallback(FallbackReason::FileChanged { detail });
    let now = file.metadata().map_err(|e| Error::io("stat", path, e))?;
    if now.len() != opened.len() {
        return Err(changed(format!("length {} -> {}", opened.len(), now.len())));
    }
    if let (Ok(a), Ok(b)) = (opened.modified(), now.modified()) {
        if a != b {
            return Err(changed("modification time changed".into()));
        }
    }
    Ok(())
}
