//! Placement: which buffer each tensor goes to, owned buffers laid out and
//! filled from the file, and the bookkeeping both paths share.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::buffer::{place, Buffer, BufferType, BufferUsage, Placement};
use crate::error::{Error, Result};
use crate::format::read_at;
use crate::tensor::TensorInfo;

use super::report::{BufferReport, PlacementKind};

/// Where one tensor ended up: a buffer (index into the load's buffers) and
/// its place there.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub buffer: usize,
    pub placement: Placement,
    pub kind: PlacementKind,
}

/// Tensors bound for one buffer type, in file order. Types are told apart by
/// identity: one buffer per `Arc`, as ggml makes one buffer per type.
pub(crate) struct Group {
    pub bt: Arc<dyn BufferType>,
    pub tensors: Vec<usize>,
}

/// Add tensor `i` to the group for `bt`, creating it if new.
pub(crate) fn add(groups: &mut Vec<Group>, bt: Arc<dyn BufferType>, i: usize) {
    let key = Arc::as_ptr(&bt) as *const () as usize;
    match groups
        .iter_mut()
        .find(|g| Arc::as_ptr(&g.bt) as *const () as usize == key)
    {
        Some(g) => g.tensors.push(i),
        None => groups.push(Group {
            bt,
            tensors: vec![i],
        }),
    }
}

/// The buffers and slots a load is building.
pub(crate) struct Placed {
    pub buffers: Vec<Box<dyn Buffer>>,
    pub reports: Vec<BufferReport>,
    pub slots: Vec<Option<Slot>>,
}

impl Placed {
    pub fn new(n: usize) -> Placed {
        Placed {
            buffers: Vec::new(),
            reports: Vec::new(),
            slots: vec![None; n],
        }
    }

    /// Take `buffer`, holding `placements` of tensors `idx`.
    pub fn push(
        &mut self,
        buffer: Box<dyn Buffer>,
        idx: &[usize],
        placements: Vec<Placement>,
        kind: PlacementKind,
    ) {
        let b = self.buffers.len();
        self.reports.push(BufferReport {
            buffer_type: buffer.type_name().to_owned(),
            mapped: kind == PlacementKind::Mapped,
            tensors: idx.len(),
            bytes: placements.iter().map(|p| p.len as u64).sum(),
            size: buffer.size(),
        });
        for (&i, placement) in idx.iter().zip(placements) {
            self.slots[i] = Some(Slot {
                buffer: b,
                placement,
                kind,
            });
        }
        self.buffers.push(buffer);
    }

    /// Every tensor's slot; `None` if one was never placed (a bug).
    pub fn finish(self) -> (Vec<Box<dyn Buffer>>, Vec<BufferReport>, Vec<Slot>) {
        let slots = self.slots.into_iter().flatten().collect();
        (self.buffers, self.reports, slots)
    }
}

/// Lay out tensors `idx` one after another at `bt`'s alignment, each taking
/// `bt.alloc_size` bytes (which must cover the tensor); returns each offset
/// and the total size.
fn layout(bt: &dyn BufferType, infos: &[TensorInfo], idx: &[usize]) -> Result<(Vec<usize>, usize)> {
    let align = bt.alignment();
    let too_large = || Error::BufferTooLarge {
        buffer_type: bt.name().to_owned(),
        size: usize::MAX,
        max: bt.max_size(),
    };
    let mut offsets = Vec::with_capacity(idx.len());
    let mut total = 0usize;
    for &i in idx {
        let t = &infos[i];
        let size = bt.alloc_size(t);
        if (size as u64) < t.nbytes {
            return Err(Error::AllocSizeTooSmall {
                buffer_type: bt.name().to_owned(),
                tensor: t.name.clone(),
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

/// Allocate one buffer of `bt` for tensors `idx` and read them into it from
/// `file`: straight into place with one positioned read per tensor on a host
/// buffer, through a staging buffer of at most `staging_bytes` and `set` on
/// any other.
pub(crate) fn copy_group(
    file: &File,
    path: &Path,
    bt: &dyn BufferType,
    infos: &[TensorInfo],
    idx: &[usize],
    staging_bytes: usize,
) -> Result<(Box<dyn Buffer>, Vec<Placement>)> {
    let (offsets, total) = layout(bt, infos, idx)?;
    let mut buffer = bt.alloc_buffer_to_fill(total)?;
    buffer.set_usage(BufferUsage::Weights);
    // Each placement is checked against the buffer actually allocated.
    let mut placements = Vec::with_capacity(idx.len());
    for (&i, &offset) in idx.iter().zip(&offsets) {
        let t = &infos[i];
        placements.push(place(
            buffer.as_ref(),
            &t.name,
            offset,
            t.nbytes as usize,
            bt.alignment(),
        )?);
    }
    let read_err = |e| Error::io("read", path, e);
    if let Some(dst) = buffer.host_bytes_mut() {
        for (&i, p) in idx.iter().zip(&placements) {
            read_at(
                file,
                &mut dst[p.offset..p.offset + p.len],
                infos[i].file_offset,
            )
            .map_err(read_err)?;
        }
    } else {
        let max_tensor = placements.iter().map(|p| p.len).max().unwrap_or(0);
        let n = staging_bytes.max(1).min(max_tensor);
        let mut staging = Vec::new();
        staging.try_reserve_exact(n).map_err(|_| Error::Alloc {
            size: n,
            source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
        })?;
        staging.resize(n, 0u8);
        for (&i, p) in idx.iter().zip(&placements) {
            let mut done = 0usize;
            while done < p.len {
                let n = staging.len().min(p.len - done);
                read_at(file, &mut staging[..n], infos[i].file_offset + done as u64)
                    .map_err(read_err)?;
                buffer.set(p.offset + done, &staging[..n])?;
                done += n;
            }
        }
    }
    Ok((buffer, placements))
}
