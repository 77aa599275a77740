//! The mapped path: map the file, validate it, view every tensor that can
//! be viewed in place, copy only those that cannot, then prefetch.

use std::fs::{File, Metadata};
use std::path::Path;
use std::sync::Arc;

use super::prefetch::{self, Prefetch, PrefetchDecision, Prefetcher};
use crate::buffer::{address_alignment, place, HostRegion};
use crate::error::{Error, FallbackReason};
use crate::format::Header;
use crate::os::Mapping;

use super::loaded::Loaded;
use super::options::LoadOptions;
use super::place::{add, copy_group, plan, Group, Placed, ReadCtx};
use super::read::{DirectOutcome, Progress, ReadReport, ReadSrc};
use super::report::{CopiedTensor, CopyReason, PlacementKind};
use super::source::{check_range, open_checked, Source};

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
/// that has mmap.
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
    // 1. Causes the stream path does better on: no mmap here, or a default
    //    buffer type that cannot view host memory.
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
    // 2. Open: a missing, unreadable, irregular or empty file is an error in
    //    either mode, with its own type and io::ErrorKind. A file range must
    //    lie inside its file.
    let opened: Option<(File, Metadata)> = match src {
        Source::Path(p) => Some(open_checked(p)?),
        Source::Range { file, offset, len } => {
            let meta = check_range(file, *offset, *len, path)?;
            let f = file.try_clone().map_err(|e| Error::io("dup", path, e))?;
            Some((f, meta))
        }
        Source::Memory(_) => None,
    };
    // 3. Map the file (or the range: from the page below its start) read-only
    //    and private; memory is viewed as it is.
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
    let map = match (src, &opened) {
        // SAFETY: forwarded to our caller, who promises the file stays unchanged.
        (Source::Path(_), Some((file, _))) => unsafe { Mapping::map(file) }.map_err(map_err)?,
        // SAFETY: as above, for the range.
        (Source::Range { offset, len, .. }, Some((file, _))) => {
            unsafe { Mapping::map_range(file, *offset, *len) }.map_err(map_err)?
        }
        (Source::Memory(m), _) => Mapping::from_memory(Arc::clone(m)),
        _ => unreachable!("a file source has an open file"),
    };
    let map = Arc::new(map);
    // 4. Validate the header from the mapping: every tensor's type, size,
    //    offset and end. Invalid is an error here; it is parsed only once.
    let header = Header::in_mapping(&map)?;

    // 5. Decide every tensor's place before placing any: in the mapping if
    //    its buffer type can view host memory and its address is aligned as
    //    that type needs, else copied.
    let infos = header.tensors();
    let base = map.addr();
    let mut mapped: Vec<Group> = Vec::new();
    let mut copies: Vec<Group> = Vec::new();
    let mut copied = Vec::new();
    for i in 0..infos.len() {
        // Only a routing rule needs the whole descriptor.
        let target = match opts.route {
            Some(_) => opts.target(&infos.at(i)),
            None => std::borrow::Cow::Borrowed(&opts.buffer_type),
        };
        if !target.supports_host_ptr() {
            let c = CopiedTensor {
                name: crate::alloc::string(infos.name(i), "the load report")?,
                reason: CopyReason::Routed {
                    buffer_type: target.name().to_owned(),
                },
            };
            crate::alloc::push(&mut copied, c, "the load report")?;
            add(&mut copies, &target, i)?;
            continue;
        }
        let alignment = header.alignment_for(infos.ty(i), target.alignment());
        let file_offset = infos.file_range(i).start;
        let address = base.wrapping_add(file_offset as usize);
        if address % alignment == 0 {
            add(&mut mapped, &target, i)?;
        } else if opts.require_all_mapped {
            return Err(FallbackReason::Misaligned {
                tensor: infos.name(i).to_owned(),
                address,
                file_offset,
                alignment,
            }
            .into());
        } else {
            let c = CopiedTensor {
                name: crate::alloc::string(infos.name(i), "the load report")?,
                reason: CopyReason::Misaligned { address, alignment },
            };
            crate::alloc::push(&mut copied, c, "the load report")?;
            add(&mut copies, &target, i)?;
        }
    }

    #[cfg(test)]
    if let Some(hook) = BEFORE_PLACE.with(|h| h.get()) {
        hook(path);
    }
    // 6. The contract forbids changing the file, but a truncation, a rewrite
    //    that moved the modification time, or a path that now names another
    //    file is cheap to notice here, before any tensor is handed out.
    match (src, &opened) {
        (Source::Path(p), Some((file, meta))) => same_file(file, p, meta)?,
        (Source::Range { .. }, Some((file, meta))) => same_length_and_time(file, path, meta)?,
        _ => {}
    }

    // 7. Access advice (MADV_RANDOM only where reads are by row; the region
    //    read in huge pages), and mlock,
    //    which pins the whole mapping and so must fit the memory budget.
    let budget = super::budget::current(opts);
    let (start, end) = header.tensor_region();
    let (start, end) = (start as usize, end as usize);
    let random_access = prefetch::apply_advice(&map, &header, opts.advice, start, end);
    let huge_pages = prefetch::advise_huge_pages(&map, opts.advice, start, end);
    if opts.mlock {
        super::budget::check(map.len() as u64, "mlock of the mapping", &budget, opts)?;
        map.lock().map_err(|source| Error::Mlock {
            len: map.len(),
            limit: crate::os::memlock_limit(),
            source,
        })?;
    }

    // 8. One buffer per buffer type over the span of its mapped tensors;
    //    each tensor placed at its own (checked) alignment, and the buffer's
    //    alignment the least of them, so `Buffer::alignment` is true of all.
    let mut placed = Placed::new(infos.len())?;
    if mapped.is_empty() && copies.is_empty() {
        // No tensors: an empty view at the region's start.
        let region = HostRegion::new(Arc::clone(&map), start, 0)?;
        let buffer = bt.buffer_from_host_ptr(region, bt.alignment())?;
        placed.push(buffer, &[], Vec::new(), PlacementKind::Mapped);
    }
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    // The same without the tables read by row: what a first pass goes
    // through in order.
    let mut in_order: Vec<(usize, usize)> = Vec::new();
    for g in &mapped {
        let span_start = g
            .tensors
            .iter()
            .map(|&i| infos.file_range(i).start)
            .min()
            .unwrap_or(0) as usize;
        let span_end = g
            .tensors
            .iter()
            .map(|&i| infos.file_range(i).end)
            .max()
            .unwrap_or(0) as usize;
        let cap = g.bt.alignment();
        let align_of = |i: usize| {
            address_alignment(base.wrapping_add(infos.file_range(i).start as usize), cap)
        };
        let least = g.tensors.iter().map(|&i| align_of(i)).min().unwrap_or(cap);
        let region = HostRegion::new(Arc::clone(&map), span_start, span_end - span_start)?;
        let buffer = g.bt.buffer_from_host_ptr(region, least)?;
        placed.push_with(buffer, &g.tensors, PlacementKind::Mapped, |i, buffer| {
            let t = infos.at(i);
            let r = (t.file_offset as usize, t.file_range().end as usize);
            push_range(&mut ranges, r)?;
            if random_access.binary_search(&i).is_err() {
                push_range(&mut in_order, r)?;
            }
            place(
                buffer,
                t.name,
                t.file_offset as usize - span_start,
                t.nbytes as usize,
                align_of(i),
            )
        })?;
    }
    // 9. Copies: read from the file straight into one owned buffer per
    //    type, in parallel (buffered: the file is mapped anyway).
    let mut read = None;
    if !copies.is_empty() {
        let mut plans = Vec::with_capacity(copies.len());
        let mut total = 0u64;
        let mut host = 0u64;
        for g in &copies {
            let (layout, bytes, _) = plan(g.bt.as_ref(), infos, &g.tensors, false)?;
            total += bytes;
            if g.bt.is_host() {
                host += bytes;
            }
            plans.push(layout);
        }
        super::budget::check(host, "the copied tensors", &budget, opts)?;
        let progress = Progress::new(opts.progress.clone(), total);
        let read_src = match (src, &opened) {
            (Source::Range { offset, .. }, Some((file, _))) => ReadSrc::File {
                file,
                base: *offset,
            },
            (_, Some((file, _))) => ReadSrc::File { file, base: 0 },
            (_, None) => ReadSrc::Memory(map.bytes()),
        };
        let ctx = ReadCtx {
            src: read_src,
            direct_path: None,
            path,
            staging_bytes: opts.staging_bytes,
            threads: opts.threads(),
            direct_threads: opts.direct_threads(),
            progress: &progress,
        };
        for (g, layout) in copies.iter().zip(plans) {
            let f = copy_group(&ctx, g.bt.as_ref(), infos, &g.tensors, layout)?;
            placed.push(f.buffer, &g.tensors, f.placements, PlacementKind::Copied);
        }
        read = Some(ReadReport {
            threads: ctx.threads,
            direct: DirectOutcome::Off,
        });
    }
    let (buffers, buffer_reports, slots) = placed.finish();

    // 10. Last, once everything is validated and placed: the prefetch of
    //     what stays mapped, in file order.
    let ranges = merge(ranges);
    let bytes: u64 = ranges.iter().map(|r| (r.1 - r.0) as u64).sum();
    let (prefetcher, prefetch) = match opts.prefetch {
        _ if ranges.is_empty() => (None, PrefetchDecision::Off),
        Prefetch::None => (None, PrefetchDecision::Off),
        Prefetch::WillNeed => {
            for &(s, e) in &ranges {
                map.will_need(s, e);
            }
            (None, PrefetchDecision::WillNeed { bytes })
        }
        // Populating more than the budget holds would only evict what it
        // read before the first pass comes to it.
        Prefetch::Populate if budget.bytes.is_some_and(|b| bytes > b) => (
            None,
            PrefetchDecision::Skipped(prefetch::SkipReason::TooLarge {
                bytes,
                budget: budget.bytes.unwrap_or(0),
                max_percent: 100,
            }),
        ),
        Prefetch::Populate => {
            let reread = opts.reread_small_folios;
            if !prefetch::populate(&map, &ranges, huge_pages, reread, opts.progress.as_ref()) {
                return Err(Error::Cancelled.into());
            }
            (None, PrefetchDecision::Populated { bytes })
        }
        Prefetch::Background { max_percent } => Prefetcher::start(
            &map,
            prefetch::Region {
                ranges,
                in_order: merge(in_order),
                huge_pages,
                reread: opts.reread_small_folios,
            },
            max_percent,
            budget.bytes,
            super::budget::reader(opts),
            opts.progress.clone(),
        ),
    };

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
        random_access,
        copied,
        read,
    })
}

/// Add `r` to `ranges`, joined to the last one when it follows it within
/// [`merge`]'s gap (tensors come in file order, so a million of them make a
/// handful of ranges, not a million).
fn push_range(ranges: &mut Vec<(usize, usize)>, r: (usize, usize)) -> crate::error::Result<()> {
    if let Some(last) = ranges.last_mut() {
        if r.0 >= last.0 && r.0 <= last.1.saturating_add(MERGE_GAP) {
            last.1 = last.1.max(r.1);
            return Ok(());
        }
    }
    crate::alloc::push(ranges, r, "the prefetch ranges")
}

/// Ranges closer than this are read as one.
const MERGE_GAP: usize = 1 << 20;

/// Sort and merge file ranges; ranges less than 1 MiB apart become one, as
/// reading a small gap costs less than a second pass.
fn merge(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    const GAP: usize = MERGE_GAP;
    ranges.retain(|r| r.1 > r.0);
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len().min(64));
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.0 <= last.1.saturating_add(GAP) => last.1 = last.1.max(r.1),
            _ => out.push(r),
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

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
