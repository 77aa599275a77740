//! [`Pass`]: every tensor (or a chosen set) once, in file order, each
//! resident when it is handed out, with reads queued a bounded window ahead
//! and the pages behind dropped: what an upload to a device, a conversion,
//! a hash or a data check needs, at the disk's rate and in bounded memory.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::os::{AccessAdvice, Mapping};

use super::tensor_ref::TensorRef;
use super::weights::Weights;

/// The pieces a tensor is made resident in, each after the read-ahead is
/// topped up: a large tensor does not wait for its whole read before the
/// next reads are queued.
const PIECE: u64 = 8 << 20;
/// The window when the budget is unknown.
const DEFAULT_WINDOW: u64 = 64 << 20;
/// The window's bounds when it is taken from the budget (a quarter of it):
/// below a few MiB the device sees requests too small to stream; past a
/// few hundred MiB a deeper queue gains nothing.
const MIN_WINDOW: u64 = 4 << 20;
const MAX_WINDOW: u64 = 256 << 20;

/// A pass over loaded weights ([`Weights::pass`]): an iterator of
/// [`TensorRef`]s in file order (shard by shard).
///
/// Before a mapped tensor is handed out its pages are read and mapped
/// (`MADV_POPULATE_READ`; of a tensor larger than the window, its first
/// window's worth, the rest read as it is used), while reads of the tensors
/// after it are queued (`MADV_WILLNEED`) up to [`Pass::window`] bytes ahead.
/// A background prefetch of the load stops when the pass starts: the pass
/// does the reading ahead. When the next one is
/// asked for, the pages of the one before are dropped from the process and
/// the page cache ([`Weights::release`]), unless [`Pass::keep_pages`] is set
/// for a caller that computes on them next. Copied tensors are handed out as
/// they are. Stopping early (dropping the pass) is the way to cancel.
///
/// ```
/// use weightmap::{gguf::Writer, LoadOptions, TensorType, Weights};
/// # fn main() -> weightmap::Result<()> {
/// let mut w = Writer::new(32);
/// w.tensor("b", TensorType::F32, &[4], 2f32.to_le_bytes().repeat(4));
/// w.tensor("a", TensorType::F32, &[4], 1f32.to_le_bytes().repeat(4));
/// let weights = Weights::from_memory(w.to_bytes(), &LoadOptions::default())?;
/// let mut names = Vec::new();
/// for t in weights.pass().window(1 << 20) {
///     let t = t?;
///     names.push(t.name().to_owned()); // upload, hash or convert `t` here
/// }
/// assert_eq!(names, ["b", "a"]); // file order
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Pass<'w> {
    weights: &'w Weights,
    /// Tensor indices to visit, in file order.
    order: Vec<usize>,
    /// The next position in `order` to hand out.
    next: usize,
    window: u64,
    keep_pages: bool,
    /// The read-ahead's front: a position in `order` and an offset into
    /// that tensor's bytes.
    queued_at: (usize, u64),
    /// Bytes of mapped tensors queued, and made resident, so far.
    queued: u64,
    resident: u64,
}

impl Weights {
    /// A pass over every tensor in file order, reading ahead within a
    /// window sized from the memory budget and dropping pages behind it; see
    /// [`Pass`].
    pub fn pass(&self) -> Pass<'_> {
        self.stop_prefetch();
        let mut order: Vec<usize> = (0..self.len()).collect();
        // File order within each file; files in shard order.
        order.sort_by_cached_key(|&i| self.file_position(i));
        let window = self
            .report()
            .budget
            .bytes
            .map_or(DEFAULT_WINDOW, |b| (b / 4).clamp(MIN_WINDOW, MAX_WINDOW));
        Pass {
            weights: self,
            order,
            next: 0,
            window,
            keep_pages: false,
            queued_at: (0, 0),
            queued: 0,
            resident: 0,
        }
    }
}

impl<'w> Pass<'w> {
    /// Queue reads at most `bytes` ahead of the tensor being handed out
    /// (default: a quarter of the memory budget, from 4 to 256 MiB).
    pub fn window(mut self, bytes: u64) -> Self {
        self.window = bytes;
        self
    }

    /// Keep each tensor's pages after the pass moves on (default off: they
    /// are dropped, so the pass holds about one window of the page cache).
    pub fn keep_pages(mut self, yes: bool) -> Self {
        self.keep_pages = yes;
        self
    }

    /// Visit only the tensors called `names`, still in file order.
    ///
    /// # Errors
    /// [`Error::TensorNotFound`] for a name that is not there.
    pub fn only(mut self, names: &[&str]) -> Result<Self> {
        let mut keep = vec![false; self.weights.len()];
        for name in names {
            keep[self.weights.index_of(name)?] = true;
        }
        self.order.retain(|&i| keep[i]);
        Ok(self)
    }

    /// The read-ahead window, in bytes.
    pub fn window_bytes(&self) -> u64 {
        self.window
    }

    /// The mapping and byte range of the tensor at `pos` of the order, when
    /// it is mapped.
    fn mapped(&self, pos: usize) -> Option<(&'w Mapping, Range<u64>)> {
        self.weights.mapped_range_at(*self.order.get(pos)?)
    }

    /// Queue reads (`MADV_WILLNEED`) until `window` bytes of mapped tensors
    /// lie queued ahead of what is resident.
    fn top_up(&mut self) {
        while self.queued < self.resident.saturating_add(self.window) {
            let (pos, off) = self.queued_at;
            if pos >= self.order.len() {
                return;
            }
            let Some((map, r)) = self.mapped(pos) else {
                self.queued_at = (pos + 1, 0);
                continue;
            };
            let room = self.resident + self.window - self.queued;
            let from = r.start + off;
            let to = r.end.min(from.saturating_add(room));
            map.will_need(clamp(from), clamp(to));
            self.queued += to - from;
            self.queued_at = if to >= r.end {
                (pos + 1, 0)
            } else {
                (pos, to - r.start)
            };
        }
    }

    /// Read and map the tensor at `pos` of the order, piece by piece, the
    /// read-ahead topped up before each piece.
    fn make_resident(&mut self, pos: usize) -> Result<()> {
        let Some((map, r)) = self.mapped(pos) else {
            return Ok(());
        };
        // More than a window of one tensor resident at once would evict its
        // own first pages under a budget the window was sized for.
        let end = r.end.min(r.start.saturating_add(self.window.max(PIECE)));
        let mut at = r.start;
        while at < end {
            self.top_up();
            let to = end.min(at + PIECE);
            map.populate_read(clamp(at), clamp(to))
                .map_err(|e| Error::io("madvise(MADV_POPULATE_READ)", self.weights.path(), e))?;
            self.resident += to - at;
            at = to;
        }
        // The rest of a tensor larger than the window is read as the caller
        // goes through it: sequential advice makes the kernel read ahead of
        // those faults and drop what they leave behind.
        if end < r.end {
            let _ = map.advise(AccessAdvice::Sequential, clamp(end), clamp(r.end));
        }
        // A tensor of zero bytes (or one the read-ahead has not reached).
        self.queued = self.queued.max(self.resident);
        Ok(())
    }

    /// Drop the pages of the tensor at `pos` of the order, if it is mapped.
    fn release(&self, pos: usize) -> Result<()> {
        match self.mapped(pos) {
            Some((map, r)) if !self.keep_pages => map
                .release(clamp(r.start), clamp(r.end))
                .map_err(|e| Error::io("madvise(MADV_DONTNEED)", self.weights.path(), e)),
            _ => Ok(()),
        }
    }
}

impl<'w> Iterator for Pass<'w> {
    type Item = Result<TensorRef<'w>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next > 0 {
            if let Err(e) = self.release(self.next - 1) {
                return Some(Err(e));
            }
        }
        let pos = self.next;
        let i = *self.order.get(pos)?;
        self.next += 1;
        if let Err(e) = self.make_resident(pos) {
            return Some(Err(e));
        }
        self.weights.tensor_at(i).map(Ok)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.order.len() - self.next;
        (n, Some(n))
    }
}

impl Drop for Pass<'_> {
    /// The last tensor handed out is released too: a finished or abandoned
    /// pass leaves nothing of its own behind in the page cache.
    fn drop(&mut self) {
        if self.next > 0 {
            let _ = self.release(self.next - 1);
        }
    }
}

fn clamp(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}
