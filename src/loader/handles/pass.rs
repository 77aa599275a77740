//! [`Pass`]: every tensor (or a chosen set) once, in file order, each
//! resident when it is handed out, with reads queued a bounded window ahead
//! and the pages behind dropped: what an upload to a device, a conversion,
//! a hash or a data check needs, at the disk's rate and in bounded memory.

use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::os::{AccessAdvice, Mapping};

use super::tensor_ref::TensorRef;
use super::weights::Weights;
use crate::page_plan::plan::{drop_from, pass_hold, pass_in_huge_pages, pass_window};

/// The pieces the reader maps a tensor in, queuing reads ahead before each:
/// a large tensor does not wait for its whole read before the next reads
/// are queued, and the pass learns of progress piece by piece.
const PIECE: u64 = 8 << 20;
/// A pass over loaded weights ([`Weights::pass`]): an iterator of
/// [`TensorRef`]s in file order (shard by shard).
///
/// A reader thread, started by the first `next`, reads and maps the mapped
/// tensors in order (`MADV_POPULATE_READ`; with a window of 32 MiB or more
/// in huge-page folios, `MADV_HUGEPAGE`, where the kernel reads ahead of
/// each fault; else with reads queued by `MADV_WILLNEED` ahead of it), at
/// most [`Pass::window`] bytes past the
/// end of the tensor being handed out, and never more in all than the
/// memory budget holds. A tensor is handed out once its pages are resident;
/// of one larger than the budget holds, as much as it holds, the rest read
/// as it is used. A background prefetch of the load stops when the pass
/// starts: the pass does the reading ahead. When the next tensor is asked
/// for, the pages of the one before are dropped from the process and the
/// page cache ([`Weights::release`]), unless [`Pass::keep_pages`] is set
/// for a caller that computes on them next. Copied tensors are handed out as
/// they are. Stopping early (dropping the pass) is the way to cancel: the
/// thread stops within one piece of 8 MiB and is joined.
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
    /// Positions before this one are behind the pass.
    left: usize,
    window: u64,
    /// The most bytes the pass holds in the page cache at once: what is
    /// behind it and not yet dropped, the tensor being handed out, and what
    /// is read after it.
    hold: u64,
    keep_pages: bool,
    /// Started by the first `next`, once the window and the order are set.
    reader: Option<Reader>,
    /// Tensors handed out and done with, of one file, whose pages are to
    /// be dropped together: dropping a 4 KiB page costs about a microsecond,
    /// so a thread beside the reader does it, a batch at a time, off the
    /// caller's path.
    behind: Option<PassedTensors>,
    /// Where the last run handed over to be dropped ended, and in which
    /// mapping: the next one reaches back from it ([`drop_from`]).
    dropped_to: Option<(Arc<Mapping>, u64)>,
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
        let budget = self.report().budget.bytes;
        Pass {
            weights: self,
            order,
            next: 0,
            left: 0,
            window: pass_window(budget),
            hold: pass_hold(budget),
            keep_pages: false,
            reader: None,
            behind: None,
            dropped_to: None,
        }
    }
}

impl<'w> Pass<'w> {
    /// Read at most `bytes` past the end of the tensor being handed out
    /// (default: half of the memory budget, from 4 to 64 MiB).
    pub fn window(mut self, bytes: u64) -> Self {
        self.window = bytes;
        self
    }

    /// Keep each tensor's pages after the pass moves on (default off: they
    /// are dropped, so the pass holds about one tensor, one window ahead of
    /// it and a quarter of a window behind).
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
    fn mapped(&self, pos: usize) -> Option<(&'w Arc<Mapping>, Range<u64>)> {
        self.weights.mapped_range_at(*self.order.get(pos)?)
    }

    /// The reader over this pass's mapped tensors, started.
    fn start_reader(&self) -> Reader {
        let mut spans: Vec<Span> = Vec::new();
        let mut run = Vec::with_capacity(self.order.len());
        let mut at = 0u64;
        for pos in 0..self.order.len() {
            let start = at;
            if let Some((map, r)) = self.mapped(pos) {
                let len = (r.end - r.start).min(self.hold);
                spans.push(Span {
                    map: Arc::clone(map),
                    file_start: r.start,
                    run_start: at,
                    len,
                    huge: false,
                });
                at += len;
            }
            run.push(start..at);
        }
        // Each file's part of the run in huge-page folios, where the plan
        // says so: the reader's faults then read ahead on their own, and
        // what it maps and drops costs a fraction of 4 KiB pages. Elsewhere
        // reads are queued ahead.
        let mut first = 0;
        while first < spans.len() {
            let same = |s: &Span| Arc::ptr_eq(&s.map, &spans[first].map);
            let n = spans[first..].iter().take_while(|s| same(s)).count();
            let (from, to) = (
                spans[first].file_start,
                spans[first + n - 1].file_start + spans[first + n - 1].len,
            );
            let map = &spans[first].map;
            let huge = pass_in_huge_pages(map, self.window, clamp(from), clamp(to));
            for s in &mut spans[first..first + n] {
                s.huge = huge;
            }
            first += n;
        }
        Reader::start(spans, run, self.window, self.hold)
    }

    /// Wait until the tensor at `pos` of the order is resident (as much of
    /// it as the pass may hold), letting the reader read on to the window
    /// past it.
    fn make_resident(&mut self, pos: usize) -> Result<()> {
        if self.reader.is_none() {
            self.reader = Some(self.start_reader());
        }
        let Some(reader) = &mut self.reader else {
            return Ok(());
        };
        let r = reader.run[pos].clone();
        if r.is_empty() {
            return Ok(());
        }
        let held_from = self.behind.as_ref().map_or(r.start, |b| b.run_start);
        reader
            .wait_for(r.end, r.end.saturating_add(self.window), held_from)
            .map_err(|e| Error::io("madvise", self.weights.path(), e))?;
        // The rest of a tensor larger than the pass may hold is read as the
        // caller goes through it: sequential advice makes the kernel read
        // ahead of those faults.
        if let Some((map, f)) = self.mapped(pos) {
            let resident_end = f.start + (r.end - r.start);
            if resident_end < f.end {
                let _ = map.advise(AccessAdvice::Sequential, clamp(resident_end), clamp(f.end));
            }
        }
        Ok(())
    }

    /// Put the tensor at `pos` of the order behind the pass; hand what is
    /// behind to be dropped once it is a quarter of the window, when the
    /// next tensor is of another file, or when `last`.
    fn leave(&mut self, pos: usize, last: bool) {
        if pos < self.left {
            return;
        }
        self.left = pos + 1;
        if self.keep_pages {
            return;
        }
        if let Some((map, r)) = self.mapped(pos) {
            match &mut self.behind {
                Some(b) if Arc::ptr_eq(&b.map, map) && r.start >= b.file.end => b.file.end = r.end,
                _ => {
                    self.hand_over();
                    let run_start = self.reader.as_ref().map_or(0, |rd| rd.run[pos].start);
                    let from = match &self.dropped_to {
                        Some((m, end)) if Arc::ptr_eq(m, map) && r.start >= *end => {
                            drop_from(*end, 0)
                        }
                        _ => r.start,
                    };
                    self.behind = Some(PassedTensors {
                        map: Arc::clone(map),
                        file: from..r.end,
                        run_start,
                    });
                }
            }
        }
        if last
            || self
                .behind
                .as_ref()
                .is_some_and(|b| b.bytes() >= self.window / 4)
        {
            self.hand_over();
        }
    }

    /// Give what is behind the pass to the reader to drop (or drop it here
    /// when there is no reader).
    fn hand_over(&mut self) {
        if let Some(b) = self.behind.take() {
            self.dropped_to = Some((Arc::clone(&b.map), b.file.end));
            match &self.reader {
                Some(r) => r.drop_later(b),
                None => b.drop_pages(),
            }
        }
    }
}

impl<'w> Iterator for Pass<'w> {
    type Item = Result<TensorRef<'w>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next > 0 {
            self.leave(self.next - 1, self.next == self.order.len());
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
    /// The reader stops (it is joined, and drops what it was given), then
    /// what is left behind and the last tensor handed out are dropped: a
    /// finished or abandoned pass leaves nothing of its own in the page
    /// cache.
    fn drop(&mut self) {
        drop(self.reader.take());
        if self.next > 0 {
            self.leave(self.next - 1, true);
        }
    }
}

/// The part of one mapped tensor a pass makes resident: its first `len`
/// bytes, at `file_start` in `map`, and at `run_start` in the pass's run
/// (the resident parts of its tensors end to end); `huge` when it is read
/// in huge-page folios, with no reads queued.
#[derive(Debug)]
struct Span {
    map: Arc<Mapping>,
    file_start: u64,
    run_start: u64,
    len: u64,
    huge: bool,
}

/// Tensors of one mapping behind the pass, to drop together.
#[derive(Debug)]
struct PassedTensors {
    map: Arc<Mapping>,
    /// From the first one's start to the last one's end, in the file.
    file: Range<u64>,
    /// Where the first one starts in the pass's run.
    run_start: u64,
}

impl PassedTensors {
    fn bytes(&self) -> u64 {
        self.file.end - self.file.start
    }

    /// Drop the pages from the process and the page cache. Advisory, as
    /// the pages are read again if used: a failure only leaves them cached.
    fn drop_pages(&self) {
        let _ = self
            .map
            .release(clamp(self.file.start), clamp(self.file.end));
    }
}

/// What the pass and its reader tell each other.
#[derive(Debug, Default)]
struct State {
    /// The run is resident up to here.
    done: u64,
    /// The pass waits for the run up to here (the end of the tensor it
    /// hands out next) ...
    need: u64,
    /// ... lets the reader read up to here ...
    ahead: u64,
    /// ... and holds the run from here on (what it has not handed over to
    /// be dropped).
    held_from: u64,
    /// Handed over, not dropped yet.
    drops: Vec<PassedTensors>,
    /// Where what is being dropped now starts in the run.
    dropping: Option<u64>,
    stop: bool,
    /// A read failed; the reader maps nothing more.
    failed: Option<std::io::Error>,
}

impl State {
    /// How far the reader may read: the tensor the pass waits for, and the
    /// window past it as far as the pass may hold.
    fn bound(&self, hold: u64) -> u64 {
        let oldest = self
            .dropping
            .or(self.drops.first().map(|d| d.run_start))
            .map_or(self.held_from, |o| o.min(self.held_from));
        self.need.max(self.ahead.min(oldest.saturating_add(hold)))
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, s: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(s).unwrap_or_else(|e| e.into_inner())
    }
}

/// Reads a pass's run in order, on a thread of its own, and drops what the
/// pass hands over; in the pass's thread if no thread could be started.
#[derive(Debug)]
struct Reader {
    /// Each position of the pass's order as a range of the run (empty for
    /// a tensor that is not mapped).
    run: Vec<Range<u64>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Drops what the pass hands over: dropping pages costs about as much
    /// CPU as reading them, so it runs beside the reader, not in its way.
    dropper: Option<JoinHandle<()>>,
    /// The cursor, when there is no thread.
    inline: Option<Cursor>,
}

impl Reader {
    fn start(spans: Vec<Span>, run: Vec<Range<u64>>, window: u64, hold: u64) -> Reader {
        let shared = Arc::new(Shared::default());
        let cursor = Cursor {
            spans,
            window,
            hold,
            span: 0,
            off: 0,
            queued: 0,
            queued_span: 0,
        };
        let mut reader = Reader {
            run,
            shared: Arc::clone(&shared),
            thread: None,
            dropper: None,
            inline: None,
        };
        if cursor.spans.is_empty() {
            return reader;
        }
        // The cursor goes to the thread through `slot`; if the thread cannot
        // start, its closure is dropped unrun and the cursor is taken back,
        // to be stepped in the pass's thread.
        let slot = Arc::new(Mutex::new(Some(cursor)));
        let theirs = Arc::clone(&slot);
        let spawned = std::thread::Builder::new()
            .name("weightmap-pass".into())
            .stack_size(64 << 10)
            .spawn(move || {
                let cursor = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(c) = cursor {
                    c.run(&shared);
                }
            });
        match spawned {
            Ok(h) => reader.thread = Some(h),
            Err(_) => reader.inline = slot.lock().unwrap_or_else(|e| e.into_inner()).take(),
        }
        let shared = Arc::clone(&reader.shared);
        reader.dropper = std::thread::Builder::new()
            .name("weightmap-pass-drop".into())
            .stack_size(64 << 10)
            .spawn(move || drop_handed_over(&shared))
            .ok();
        reader
    }

    /// Wait until the run is resident up to `need`, letting the reader read
    /// up to `ahead` while the pass holds the run from `held_from`.
    fn wait_for(&mut self, need: u64, ahead: u64, held_from: u64) -> std::io::Result<()> {
        let mut s = self.shared.lock();
        s.need = need;
        s.ahead = ahead;
        s.held_from = held_from;
        if let Some(c) = &mut self.inline {
            while s.done < need && s.failed.is_none() && !c.ended() {
                drop(s);
                c.step(&self.shared);
                s = self.shared.lock();
            }
        } else {
            self.shared.changed.notify_all();
            while s.done < need && s.failed.is_none() && self.thread.is_some() {
                s = self.shared.wait(s);
            }
        }
        match s.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Drop `behind` on the dropping thread (or here, without one).
    fn drop_later(&self, behind: PassedTensors) {
        if self.dropper.is_none() {
            return behind.drop_pages();
        }
        self.shared.lock().drops.push(behind);
        self.shared.changed.notify_all();
    }
}

impl Drop for Reader {
    /// Stop the threads and join them, then drop what is still handed
    /// over.
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        for h in [self.thread.take(), self.dropper.take()]
            .into_iter()
            .flatten()
        {
            let _ = h.join();
        }
        for b in std::mem::take(&mut self.shared.lock().drops) {
            b.drop_pages();
        }
    }
}

/// The reader's place in the run: the piece it maps next, and the front of
/// the reads it has queued ahead of that.
#[derive(Debug)]
struct Cursor {
    spans: Vec<Span>,
    window: u64,
    hold: u64,
    span: usize,
    off: u64,
    queued: u64,
    queued_span: usize,
}

impl Cursor {
    /// Map pieces as the pass lets it, until the run ends or the pass
    /// stops it.
    fn run(mut self, shared: &Shared) {
        while !self.ended() {
            let mut s = shared.lock();
            while !s.stop && (s.failed.is_some() || self.piece_end() > s.bound(self.hold)) {
                s = shared.wait(s);
            }
            if s.stop {
                return;
            }
            drop(s);
            self.step(shared);
        }
    }

    fn ended(&self) -> bool {
        self.span >= self.spans.len()
    }

    /// The run offset the next piece ends at.
    fn piece_end(&self) -> u64 {
        self.spans
            .get(self.span)
            .map_or(u64::MAX, |s| s.run_start + s.len.min(self.off + PIECE))
    }

    /// Queue reads as far as the pass lets the reader go, then map the
    /// next piece and say so (or keep the error for the pass).
    fn step(&mut self, shared: &Shared) {
        let Some(span) = self.spans.get(self.span) else {
            return;
        };
        let end = self.piece_end();
        let bound = shared.lock().bound(self.hold).max(end);
        let from = span.file_start + self.off;
        let to = span.file_start + (end - span.run_start);
        let map = Arc::clone(&span.map);
        self.queue_to(bound.min(end.saturating_add(self.window)));
        let result = map.populate_read(clamp(from), clamp(to));
        self.off = to - self.spans[self.span].file_start;
        if self.off >= self.spans[self.span].len {
            self.span += 1;
            self.off = 0;
        }
        let mut s = shared.lock();
        match result {
            Ok(()) => s.done = end,
            Err(e) => s.failed = Some(e),
        }
        shared.changed.notify_all();
    }

    /// Queue reads (`MADV_WILLNEED`) of the run up to offset `to`.
    fn queue_to(&mut self, to: u64) {
        while self.queued < to {
            let Some(span) = self.spans.get(self.queued_span) else {
                return;
            };
            let end = span.run_start + span.len;
            let upto = to.min(end);
            // WILLNEED reads 4 KiB folios: a huge-page span reads ahead
            // through its own faults.
            if self.queued < upto && !span.huge {
                let from = span.file_start + (self.queued - span.run_start);
                span.map.will_need(
                    clamp(from),
                    clamp(span.file_start + (upto - span.run_start)),
                );
            }
            self.queued = self.queued.max(upto);
            if self.queued >= end {
                self.queued_span += 1;
            }
        }
    }
}

/// Drop what the pass hands over, until it stops.
fn drop_handed_over(shared: &Shared) {
    loop {
        let drops = {
            let mut s = shared.lock();
            while !s.stop && s.drops.is_empty() {
                s = shared.wait(s);
            }
            if s.stop {
                return;
            }
            s.dropping = s.drops.first().map(|d| d.run_start);
            std::mem::take(&mut s.drops)
        };
        for b in &drops {
            b.drop_pages();
        }
        shared.lock().dropping = None;
        shared.changed.notify_all();
    }
}

fn clamp(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}
