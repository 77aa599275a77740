//! [`Loaded`]: what either path made of one file, before it becomes part of
//! a [`Weights`](super::weights::Weights).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::buffer::{Buffer, Placement};
use crate::error::FallbackReason;
use crate::format::Header;
use crate::os::Mapping;
use crate::page_plan::plan::plan_residency;
use crate::page_plan::prefetch::Prefetcher;
use crate::page_plan::{PrefetchDecision, Reread};

use super::mode::LoadMode;
use super::report::{Budget, BufferReport, CopiedTensor, LoadReport, PlacementKind, ReadReport};

/// Where one tensor ended up: a buffer (index into the load's buffers) and
/// its place there, in 16 bytes (a million-tensor load keeps a million).
/// Its length is the tensor's size, so it is not stored.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    offset: usize,
    buffer: u32,
    /// log2 of the alignment the address was checked against.
    align_log2: u8,
    pub kind: PlacementKind,
}

impl Slot {
    /// Not yet placed.
    pub(crate) const EMPTY: Slot = Slot {
        offset: 0,
        buffer: u32::MAX,
        align_log2: 0,
        kind: PlacementKind::Copied,
    };

    /// Placed as `p` says in buffer `buffer` of the load.
    pub(crate) fn new(buffer: u32, p: &Placement, kind: PlacementKind) -> Slot {
        Slot {
            offset: p.offset,
            buffer,
            align_log2: p.alignment.trailing_zeros() as u8,
            kind,
        }
    }

    /// The index of its buffer.
    pub fn buffer(&self) -> usize {
        self.buffer as usize
    }

    /// Its placement, for a tensor of `len` bytes.
    pub fn placement(&self, len: u64) -> Placement {
        Placement {
            offset: self.offset,
            len: len as usize,
            alignment: 1 << self.align_log2,
        }
    }
}

/// Everything a load made, from either path.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub path: PathBuf,
    pub header: Header,
    pub buffers: Vec<Box<dyn Buffer>>,
    pub buffer_reports: Vec<BufferReport>,
    /// One per tensor, in header order.
    pub slots: Vec<Slot>,
    pub map: Option<Arc<Mapping>>,
    /// Stopped and joined on drop.
    pub prefetcher: Option<Prefetcher>,
    pub prefetch: PrefetchDecision,
    pub random_access: Vec<usize>,
    /// Whether the tensor region was advised to be read in huge pages.
    pub huge_pages: bool,
    /// The tensors read whole that stream through the budget.
    pub streamed: Vec<usize>,
    /// What became of the re-read of small folios.
    pub reread: Reread,
    pub copied: Vec<CopiedTensor>,
    pub read: Option<ReadReport>,
    /// The memory budget the load was held to.
    pub budget: Budget,
    /// Bytes of the mapped tensors read whole and of the mapped expert
    /// tensors (0 and 0 on the stream path).
    pub whole_and_expert_bytes: (u64, u64),
}

impl Loaded {
    /// What the load did; the list of copied tensors moves into it (at a
    /// million misaligned tensors it is not held twice).
    pub(crate) fn report(
        &mut self,
        requested: LoadMode,
        fallback: Option<FallbackReason>,
        t0: Instant,
    ) -> LoadReport {
        let infos = self.header.tensors();
        let names = |of: &[usize]| -> Vec<String> {
            of.iter().map(|&i| infos.at(i).name.to_owned()).collect()
        };
        let (mut tm, mut tc, mut bm, mut bc) = (0, 0, 0u64, 0u64);
        for (s, t) in self.slots.iter().zip(infos) {
            match s.kind {
                PlacementKind::Mapped => {
                    tm += 1;
                    bm += t.nbytes;
                }
                PlacementKind::Copied => {
                    tc += 1;
                    bc += t.nbytes;
                }
            }
        }
        LoadReport {
            format: self.header.format(),
            mode_requested: requested,
            mode_used: if self.map.is_some() {
                LoadMode::Mmap
            } else {
                LoadMode::Stream
            },
            fallback,
            tensors_count: infos.len(),
            tensors_mapped: tm,
            tensors_copied: tc,
            bytes_mapped: bm,
            bytes_copied: bc,
            copied: std::mem::take(&mut self.copied),
            buffers: self.buffer_reports.clone(),
            file_len: self.header.file_len(),
            elapsed: t0.elapsed(),
            prefetch: self.prefetch.clone(),
            reread: self.reread.clone(),
            read: self.read.clone(),
            shards: Vec::new(),
            warnings: Vec::new(),
            residency: plan_residency(
                self.budget.bytes,
                self.whole_and_expert_bytes.0,
                self.whole_and_expert_bytes.1,
            ),
            budget: self.budget.clone(),
            random_access_tensors: names(&self.random_access),
            streamed_tensors: names(&self.streamed),
        }
    }
}
