//! Placement: which buffer each tensor goes to, owned buffers laid out and
//! filled from the file, and the bookkeeping both paths share.

use std::path::Path;
use std::sync::Arc;

use crate::buffer::{place, Buffer, BufferType, BufferUsage, Placement};
use crate::error::{Error, Result};
use crate::tensor::TensorTable;

use super::read::{read_buffered, read_direct, Progress, ReadSrc, DIRECT_ALIGN};
use crate::loader::loaded::Slot;
use crate::loader::report::{BufferReport, DirectOutcome, PlacementKind};
use crate::page_plan::plan::drop_from;

/// Tensors bound for one buffer type, in file order. Types are told apart by
/// identity: one buffer per `Arc`, as ggml makes one buffer per type.
pub(crate) struct Group {
    pub bt: Arc<dyn BufferType>,
    pub tensors: Vec<usize>,
}

/// Add tensor `i` to the group for `bt`, creating it if new.
pub(crate) fn add(groups: &mut Vec<Group>, bt: &Arc<dyn BufferType>, i: usize) -> Result<()> {
    let key = Arc::as_ptr(bt) as *const () as usize;
    // Tensors mostly follow the one before into the same group: try the last first.
    let found = match groups.last() {
        Some(g) if Arc::as_ptr(&g.bt) as *const () as usize == key => Some(groups.len() - 1),
        _ => groups
            .iter()
            .position(|g| Arc::as_ptr(&g.bt) as *const () as usize == key),
    };
    match found {
        Some(k) => crate::alloc::push(&mut groups[k].tensors, i, "the tensor groups"),
        None => crate::alloc::push(
            groups,
            Group {
                bt: Arc::clone(bt),
                tensors: vec![i],
            },
            "the tensor groups",
        ),
    }
}

/// The buffers and slots a load is building.
pub(crate) struct Placed {
    pub buffers: Vec<Box<dyn Buffer>>,
    pub reports: Vec<BufferReport>,
    pub slots: Vec<Slot>,
}

impl Placed {
    /// Room for `n` tensors' slots.
    pub fn new(n: usize) -> Result<Placed> {
        let mut slots = crate::alloc::with_capacity(n, "the tensor placements")?;
        slots.resize(n, Slot::EMPTY);
        Ok(Placed {
            buffers: Vec::new(),
            reports: Vec::new(),
            slots,
        })
    }

    /// Take `buffer`, holding `placements` of tensors `idx`.
    pub fn push(
        &mut self,
        buffer: Box<dyn Buffer>,
        idx: &[usize],
        placements: Vec<Placement>,
        kind: PlacementKind,
    ) {
        debug_assert_eq!(idx.len(), placements.len());
        let mut it = placements.into_iter();
        // Infallible: each placement is already made.
        let _ = self.push_with(buffer, idx, kind, |_, _| {
            Ok(it.next().expect("one placement per tensor"))
        });
    }

    /// Take `buffer` and place tensors `idx` in it, `place` giving each
    /// tensor's placement (without a vector of them in between).
    pub fn push_with(
        &mut self,
        buffer: Box<dyn Buffer>,
        idx: &[usize],
        kind: PlacementKind,
        mut place: impl FnMut(usize, &dyn Buffer) -> Result<Placement>,
    ) -> Result<()> {
        let b = u32::try_from(self.buffers.len()).expect("fewer than 2^32 buffers");
        let mut bytes = 0u64;
        for &i in idx {
            let p = place(i, buffer.as_ref())?;
            bytes += p.len as u64;
            self.slots[i] = Slot::new(b, &p, kind);
        }
        self.reports.push(BufferReport {
            buffer_type: buffer.type_name().to_owned(),
            mapped: kind == PlacementKind::Mapped,
            tensors: idx.len(),
            bytes,
            size: buffer.size(),
        });
        self.buffers.push(buffer);
        Ok(())
    }

    /// Every tensor's slot; each was placed (both paths place every tensor).
    pub fn finish(self) -> (Vec<Box<dyn Buffer>>, Vec<BufferReport>, Vec<Slot>) {
        debug_assert!(self.slots.iter().all(|s| s.buffer() != u32::MAX as usize));
        (self.buffers, self.reports, self.slots)
    }
}

/// Lay out tensors `idx` one after another at `bt`'s alignment, each taking
/// `bt.alloc_size` bytes (which must cover the tensor); returns each offset
/// and the total size.
fn layout(bt: &dyn BufferType, infos: &TensorTable, idx: &[usize]) -> Result<(Vec<usize>, usize)> {
    let align = bt.alignment();
    let too_large = || Error::BufferTooLarge {
        buffer_type: bt.name().to_owned(),
        size: usize::MAX,
        max: bt.max_size(),
    };
    let mut offsets = crate::alloc::with_capacity(idx.len(), "the buffer layout")?;
    let mut total = 0usize;
    for &i in idx {
        let t = infos.at(i);
        let size = bt.alloc_size(&t);
        if (size as u64) < t.nbytes {
            return Err(Error::AllocSizeTooSmall {
                buffer_type: bt.name().to_owned(),
                tensor: t.name.to_owned(),
                alloc_size: size,
                nbytes: t.nbytes,
            });
        }
        let offset = total
            .checked_next_multiple_of(align)
            .ok_or_else(too_large)?;
        total = offset.checked_add(size).ok_or_else(too_large)?;
        offsets.push(offset);
    }
    if total > bt.max_size() {
        return Err(Error::BufferTooLarge {
            buffer_type: bt.name().to_owned(),
            size: total,
            max: bt.max_size(),
        });
    }
    Ok((offsets, total))
}

/// Tensor bytes below which direct reads are not tried: the CPU buffer
/// type's heap threshold (smaller buffers are not page-aligned).
const DIRECT_MIN: u64 = crate::buffer::CpuBuffer::MAP_THRESHOLD as u64;

/// How a group's owned buffer is laid out.
pub(crate) enum Layout {
    /// Tensors one after another at the type's alignment.
    Packed { offsets: Vec<usize>, total: usize },
    /// The file's own layout from `base` (a multiple of [`DIRECT_ALIGN`]):
    /// each tensor at `file_offset - base`, so the whole span can be read
    /// with direct I/O in large aligned reads.
    Mirror { base: u64, size: usize },
}

/// What the reads of one load share.
pub(crate) struct ReadCtx<'a> {
    pub src: ReadSrc<'a>,
    /// The file's path, for messages, and for direct reads (which open it
    /// again with `O_DIRECT`): `None` where it cannot be reopened.
    pub direct_path: Option<&'a Path>,
    pub path: &'a Path,
    pub staging_bytes: usize,
    pub threads: usize,
    /// Threads for direct reads.
    pub direct_threads: usize,
    pub progress: &'a Progress,
}

/// Lay out tensors `idx` for `bt`: mirroring the file when `direct` is
/// asked for and the file's layout suits the type (every offset aligned for
/// it, `alloc_size` the tensor's size, the span no more than 1% larger than
/// the tensors), packed otherwise. Returns the layout, the bytes it reads,
/// and why direct reads were not possible, if they were asked for and are not.
pub(crate) fn plan(
    bt: &dyn BufferType,
    infos: &TensorTable,
    idx: &[usize],
    direct: bool,
) -> Result<(Layout, u64, Option<String>)> {
    let packed = |why: Option<String>| -> Result<(Layout, u64, Option<String>)> {
        let (offsets, total) = layout(bt, infos, idx)?;
        let bytes = idx.iter().map(|&i| infos.at(i).nbytes).sum();
        Ok((Layout::Packed { offsets, total }, bytes, why))
    };
    if !direct || idx.is_empty() {
        return packed(None);
    }
    if !bt.is_host() {
        return packed(Some(format!(
            "buffer type '{}' is not host memory",
            bt.name()
        )));
    }
    let tensors: u64 = idx.iter().map(|&i| infos.at(i).nbytes).sum();
    if tensors < DIRECT_MIN {
        // Small buffers come from the heap, not page-aligned; and a few
        // hundred KiB are read as fast either way.
        return packed(Some(format!(
            "{tensors} bytes is under the {DIRECT_MIN}-byte direct-read minimum"
        )));
    }
    let align = bt.alignment();
    if align > DIRECT_ALIGN {
        return packed(Some(format!("alignment {align} is over a page")));
    }
    for &i in idx {
        let t = infos.at(i);
        if t.file_offset % align as u64 != 0 {
            return packed(Some(format!(
                "tensor '{}' at file offset {} is not aligned to {align}",
                t.name, t.file_offset
            )));
        }
        if bt.alloc_size(&t) as u64 != t.nbytes {
            return packed(Some(format!(
                "buffer type '{}' pads tensor '{}'",
                bt.name(),
                t.name
            )));
        }
    }
    let start = idx
        .iter()
        .map(|&i| infos.file_range(i).start)
        .min()
        .unwrap_or(0);
    let end = idx
        .iter()
        .map(|&i| infos.file_range(i).end)
        .max()
        .unwrap_or(0);
    let base = start / DIRECT_ALIGN as u64 * DIRECT_ALIGN as u64;
    let span = (end - base).next_multiple_of(DIRECT_ALIGN as u64);
    if span > tensors + tensors / 100 + 2 * DIRECT_ALIGN as u64 {
        return packed(Some(format!(
            "the file's layout spans {span} bytes for {tensors} bytes of tensors"
        )));
    }
    let size = usize::try_from(span).map_err(|_| Error::BufferTooLarge {
        buffer_type: bt.name().to_owned(),
        size: usize::MAX,
        max: bt.max_size(),
    })?;
    if size > bt.max_size() {
        return Err(Error::BufferTooLarge {
            buffer_type: bt.name().to_owned(),
            size,
            max: bt.max_size(),
        });
    }
    Ok((Layout::Mirror { base, size }, span, None))
}

/// An owned buffer filled with its tensors.
pub(crate) struct Filled {
    pub buffer: Box<dyn Buffer>,
    pub placements: Vec<Placement>,
    /// For a mirrored layout: whether the reads were direct, or why not.
    pub direct: Option<DirectOutcome>,
}

/// Allocate one buffer of `bt` for tensors `idx`, laid out as `layout`, and
/// read them into it from the file: on a host buffer in parallel positioned
/// reads straight into place (with `O_DIRECT` for a mirrored layout), on any
/// other through a staging buffer of at most `staging_bytes` and `set`.
pub(crate) fn copy_group(
    ctx: &ReadCtx<'_>,
    bt: &dyn BufferType,
    infos: &TensorTable,
    idx: &[usize],
    layout: Layout,
) -> Result<Filled> {
    let (offsets, total, mirror) = match layout {
        Layout::Packed { offsets, total } => (offsets, total, None),
        Layout::Mirror { base, size } => (
            crate::alloc::collect(
                idx.iter()
                    .map(|&i| (infos.file_range(i).start - base) as usize),
                "the buffer layout",
            )?,
            size,
            Some(base),
        ),
    };
    // Buffered reads prefault each piece in its reading thread, one call a
    // piece (`read_buffered`). Direct reads fault their pages in as the
    // device writes them, in every reading thread at once: prefaulting
    // first only adds a single-threaded zeroing pass, so a direct buffer is
    // not prefaulted (BENCHMARKS.md, "Stream path from a cold cache: direct
    // I/O", "No prefault for direct reads").
    let mut buffer = if mirror.is_some() {
        bt.alloc_buffer(total)?
    } else {
        bt.alloc_buffer_to_fill(total)?
    };
    buffer.set_usage(BufferUsage::Weights);
    // Each placement is checked against the buffer actually allocated.
    let mut placements = crate::alloc::with_capacity(idx.len(), "the tensor placements")?;
    for (&i, &offset) in idx.iter().zip(&offsets) {
        let t = infos.at(i);
        placements.push(place(
            buffer.as_ref(),
            t.name,
            offset,
            t.nbytes as usize,
            bt.alignment(),
        )?);
    }
    let mut outcome = None;
    if let Some(dst) = buffer.host_bytes_mut() {
        if let (Some(base), Some(dpath)) = (mirror, ctx.direct_path) {
            if dst.as_ptr() as usize % DIRECT_ALIGN != 0 {
                outcome = Some(DirectOutcome::NotApplicable {
                    reason: "the buffer is not page-aligned".into(),
                });
            } else {
                match read_direct(dpath, dst, base, ctx.direct_threads, ctx.progress)? {
                    Ok(()) => {
                        return Ok(Filled {
                            buffer,
                            placements,
                            direct: Some(DirectOutcome::Used),
                        })
                    }
                    Err(error) => outcome = Some(DirectOutcome::Refused { error }),
                }
            }
        }
        // Straight into place, one positioned read per piece.
        let mut pieces: Vec<(&mut [u8], u64)> =
            crate::alloc::with_capacity(idx.len(), "the reads")?;
        let mut rest: &mut [u8] = dst;
        let mut at = 0usize;
        let mut order: Vec<(usize, usize)> = crate::alloc::collect(
            idx.iter().copied().zip(placements.iter().map(|p| p.offset)),
            "the reads",
        )?;
        order.sort_unstable_by_key(|o| o.1);
        for (i, offset) in order {
            let len = infos.at(i).nbytes as usize;
            if len == 0 {
                // Nothing to read; its offset may lie inside a neighbour.
                continue;
            }
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(offset - at);
            let (d, tail) = tail.split_at_mut(len);
            pieces.push((d, infos.file_range(i).start));
            rest = tail;
            at = offset + len;
        }
        read_buffered(ctx.src, ctx.path, pieces, ctx.threads, ctx.progress)?;
    } else {
        upload(ctx, buffer.as_mut(), infos, idx, &placements)?;
    }
    Ok(Filled {
        buffer,
        placements,
        direct: outcome,
    })
}

/// Copy tensors `idx` into `buffer` (not host-visible) at `placements`,
/// through a staging buffer of at most `staging_bytes`, dropping each piece
/// from the page cache once uploaded: the host keeps neither a copy nor the
/// file's pages, so it never holds the model twice.
fn upload(
    ctx: &ReadCtx<'_>,
    buffer: &mut dyn Buffer,
    infos: &TensorTable,
    idx: &[usize],
    placements: &[Placement],
) -> Result<()> {
    let max_tensor = placements.iter().map(|p| p.len).max().unwrap_or(0);
    let n = ctx.staging_bytes.max(1).min(max_tensor);
    let mut staging = Vec::new();
    staging.try_reserve_exact(n).map_err(|_| Error::Alloc {
        size: n,
        source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
    })?;
    staging.resize(n, 0u8);
    let mut dropped = Dropped::default();
    for (&i, p) in idx.iter().zip(placements) {
        let mut done = 0usize;
        while done < p.len {
            let n = staging.len().min(p.len - done);
            let at = infos.file_range(i).start + done as u64;
            ctx.src
                .read_at(&mut staging[..n], at)
                .map_err(|e| Error::io("read", ctx.path, e))?;
            buffer.set(p.offset + done, &staging[..n])?;
            let (from, to) = dropped.next(at, n as u64);
            ctx.src.drop_cached(from, to - from);
            done += n;
            if !ctx.progress.add(n as u64) {
                return Err(Error::Cancelled);
            }
        }
    }
    Ok(())
}

/// The ranges to drop from the page cache as uploaded pieces follow one
/// another: each reaches back into the run of pieces before it as far as
/// [`drop_from`] says, so that the folio that straddled the last boundary
/// goes with the next piece.
#[derive(Debug, Default)]
struct Dropped {
    /// Where the current run of adjoining pieces starts, and ends.
    run: Option<(u64, u64)>,
}

impl Dropped {
    /// The range to drop for the piece `[start, start + len)`.
    fn next(&mut self, start: u64, len: u64) -> (u64, u64) {
        let end = start + len;
        let run_start = match self.run {
            Some((s, e)) if e == start => s,
            _ => start,
        };
        self.run = Some((run_start, end));
        (drop_from(start, run_start), end)
    }
}
