//! Reading what a runtime announces it reads next
//! ([`Weights::prefetch`](crate::Weights::prefetch), `wm_prefetch`): the
//! announced ranges of a mapping go to a thread that queues their reads
//! (`MADV_WILLNEED`), so that the announcing call returns without waiting
//! for them and the device reads them while the runtime computes on what it
//! has; over the budget, the call queues the expert slices' reads itself,
//! and the thread keeps the resident set and releases.
//!
//! A plain mapping leaves a model larger than memory to the fault path,
//! whose read-ahead reads around each fault (the device's `read_ahead_kb`)
//! and evicts what the next token needs; queuing only the announced bytes
//! reads what is used and nothing beside it. A tensor whose experts are
//! announced has its fault read-ahead turned off the first time
//! ([`read_only_as_announced`]), so that a fault on it reads its page and no
//! other expert's, and its slices are kept or released as the
//! [`Residency`] decides. Where every weight is resident, a queued read
//! finds its pages cached and does no I/O.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::choices::ResidencyPlan;
use super::plan::{merge, read_only_as_announced};
use super::residency::{exceeds_budget, Range, Residency};
use crate::os::Mapping;

/// At most this many announcements wait for the thread. A runtime that
/// announces faster than the device reads has moved on from the oldest:
/// they are dropped first, so that what is queued, and what dropping the
/// weights waits for, is bounded whatever the call rate.
const QUEUE_LIMIT: usize = 64;

/// What one announcement reads of one mapping: offsets into it, as the
/// tensors' file ranges.
#[derive(Debug)]
pub(crate) struct Announced {
    /// The mapping.
    pub(crate) map: Arc<Mapping>,
    /// Tensors read whole.
    pub(crate) whole: Vec<Range>,
    /// Tensors read by their experts: each tensor's range, and the slices
    /// of the experts announced.
    pub(crate) experts: Vec<(Range, Vec<Range>)>,
}

impl Announced {
    /// Whether `other` names by its experts a tensor of the same mapping
    /// that this names by its experts.
    fn shares_an_expert_tensor(&self, other: &Announced) -> bool {
        Arc::ptr_eq(&self.map, &other.map)
            && self
                .experts
                .iter()
                .any(|(t, _)| other.experts.iter().any(|(o, _)| o == t))
    }

    /// Whether `other` reads the same ranges of the same mapping: queued
    /// twice, the second would find the first's reads queued already.
    fn same_reads(&self, other: &Announced) -> bool {
        Arc::ptr_eq(&self.map, &other.map)
            && self.whole == other.whole
            && self.experts == other.experts
    }
}

/// The thread that reads announced ranges ahead, and keeps the resident set
/// of expert slices ([`Residency`]), started by the first announcement in
/// a process; on drop, what is still queued is abandoned and the thread is
/// joined once it has finished the announcement in hand (its `WILLNEED`s
/// wait for no read).
///
/// After `fork`, the child has the parent's announcer but not its thread:
/// the first announcement in the child starts the child's own (`Started`
/// remembers the process it was started in), and dropping the weights in
/// the child leaves the parent's alone.
#[derive(Debug)]
pub(crate) struct Announcer {
    /// The memory budget of the weights' load.
    budget: Option<u64>,
    /// Bytes of the weights' mapped tensors.
    mapped: u64,
    /// Where expert slices stream, the room for them, in use or not.
    slice_room: Option<u64>,
    /// The way to the thread, once started; `None` inside when it could
    /// not start, and announcements are then read ahead by the caller.
    started: Mutex<Option<Started>>,
    /// Where the weights fit, the ranges announced so far, by address:
    /// what is read once stays, so each is read ahead the first time only.
    /// A `WILLNEED` over cached pages still walks them, and waking the
    /// thread costs a switch, both of which a runtime announcing every
    /// token would otherwise pay on every token.
    read_once: Option<Mutex<HashSet<Range>>>,
    /// Where they exceed it, the expert tensors already read only as
    /// announced, by address.
    advised: Mutex<HashSet<usize>>,
    /// Where even the tensors read whole exceed the budget: they are left
    /// to the fault path ([`read_ahead`]).
    whole_streams: bool,
}

/// Which of an announcement's ranges [`read_ahead`] queues.
#[derive(Clone, Copy, Debug)]
struct Reads {
    /// Tensors announced whole: not where even they exceed the budget.
    whole: bool,
    /// Expert slices.
    slices: bool,
}

#[derive(Debug)]
struct Started {
    /// The process the thread was started in.
    pid: u32,
    /// The way to the thread; `None` when it could not start.
    queue: Option<Arc<Queue>>,
    thread: Option<JoinHandle<()>>,
}

/// The announcements waiting for the thread.
#[derive(Debug, Default)]
struct Queue {
    waiting: Mutex<Waiting>,
    /// Signalled when an announcement is queued or the queue closes.
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Waiting {
    announced: VecDeque<Announced>,
    /// Guesses ([`Announcer::guess`]): served only when no announcement
    /// waits.
    guessed: VecDeque<Announced>,
    /// Set on drop: the thread stops at its next look.
    closed: bool,
}

/// What the thread takes from the queue: an announcement, or a guess.
#[derive(Debug)]
enum Work {
    Announced(Announced),
    Guessed(Announced),
}

impl Queue {
    /// Queue `a`, unless the same reads wait already; at the limit, the
    /// oldest waiting is dropped for it. The guesses waiting for a tensor
    /// `a` names by its experts are dropped: `a` supersedes them.
    fn push(&self, a: Announced) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        w.guessed.retain(|g| !g.shares_an_expert_tensor(&a));
        Self::push_to(&mut w.announced, a);
        drop(w);
        self.changed.notify_one();
    }

    /// Queue the guess `g`, as [`Queue::push`] queues an announcement.
    fn push_guess(&self, g: Announced) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        Self::push_to(&mut w.guessed, g);
        drop(w);
        self.changed.notify_one();
    }

    fn push_to(lane: &mut VecDeque<Announced>, a: Announced) {
        if lane.iter().any(|q| q.same_reads(&a)) {
            return;
        }
        if lane.len() == QUEUE_LIMIT {
            lane.pop_front();
        }
        lane.push_back(a);
    }

    /// The next announcement, else the next guess, waiting for one; `None`
    /// once closed.
    fn pop(&self) -> Option<Work> {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if w.closed {
                return None;
            }
            if let Some(a) = w.announced.pop_front() {
                return Some(Work::Announced(a));
            }
            if let Some(g) = w.guessed.pop_front() {
                return Some(Work::Guessed(g));
            }
            w = self.changed.wait(w).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Put back `g`, taken and not read, to go first among the guesses,
    /// unless an announcement that waits supersedes it.
    fn put_back_guess(&self, g: Announced) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if !w.announced.iter().any(|a| a.shares_an_expert_tensor(&g)) {
            w.guessed.push_front(g);
        }
    }

    /// Whether an announcement waits, or the queue closed, within
    /// `timeout`.
    fn announced_within(&self, timeout: Duration) -> bool {
        let w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let (w, _) = self
            .changed
            .wait_timeout_while(w, timeout, |w| w.announced.is_empty() && !w.closed)
            .unwrap_or_else(|e| e.into_inner());
        !w.announced.is_empty() || w.closed
    }

    /// Abandon what waits and stop the thread.
    fn close(&self) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        w.closed = true;
        w.announced.clear();
        w.guessed.clear();
        drop(w);
        self.changed.notify_all();
    }

    /// How many announcements and guesses wait.
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        let w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        (w.announced.len(), w.guessed.len())
    }
}

impl Announcer {
    /// For weights whose mapped tensors hold `mapped` bytes, loaded under
    /// `budget` (`None`: unknown), whose residency is planned as `plan`.
    pub(crate) fn new(budget: Option<u64>, mapped: u64, plan: &ResidencyPlan) -> Announcer {
        let (whole_streams, slice_room) = match plan {
            ResidencyPlan::StreamExperts {
                expert_capacity, ..
            } => (false, Some(*expert_capacity)),
            ResidencyPlan::StreamAll { .. } => (true, None),
            _ => (false, None),
        };
        Announcer::with(budget, mapped, whole_streams, slice_room)
    }

    /// The same, told whether even the tensors read whole exceed the
    /// budget ([`ResidencyPlan::StreamAll`]), and where expert slices
    /// stream, the room for them ([`ResidencyPlan::StreamExperts`]'s
    /// `expert_capacity`).
    fn with(
        budget: Option<u64>,
        mapped: u64,
        whole_streams: bool,
        slice_room: Option<u64>,
    ) -> Announcer {
        let fits = !exceeds_budget(budget, mapped);
        Announcer {
            budget,
            mapped,
            slice_room,
            started: Mutex::new(None),
            read_once: fits.then(|| Mutex::new(HashSet::new())),
            advised: Mutex::new(HashSet::new()),
            whole_streams,
        }
    }

    /// What the thread reads ahead of each announcement: the tensors read
    /// whole, unless they stream; the expert slices where the weights fit
    /// (over the budget, the announcing call queues them:
    /// `queue_slices_here`).
    fn thread_reads(&self) -> Reads {
        Reads {
            whole: !self.whole_streams,
            slices: self.read_once.is_some(),
        }
    }

    /// Queue the reads of `announced`: on the thread, or here when the
    /// thread cannot be started; over the budget, those of the expert
    /// slices here.
    pub(crate) fn announce(&self, mut announced: Vec<Announced>) {
        if let Some(read_once) = &self.read_once {
            let mut seen = read_once.lock().unwrap_or_else(|e| e.into_inner());
            for a in &mut announced {
                let base = a.map.addr();
                // Read again where memory pressure has taken it since.
                let mut first = |r: &Range| {
                    let at = (base + r.0, base + r.1);
                    seen.insert(at) || !last_page_resident(&a.map, r)
                };
                a.whole.retain(&mut first);
                a.experts.retain_mut(|(_, slices)| {
                    slices.retain(&mut first);
                    !slices.is_empty()
                });
            }
            announced.retain(|a| !a.whole.is_empty() || !a.experts.is_empty());
            if announced.is_empty() {
                return;
            }
        } else {
            self.advise_first_announced(&announced);
            self.queue_slices_here(&announced);
        }
        match self.thread_queue() {
            Some(queue) => announced.into_iter().for_each(|a| queue.push(a)),
            None => announced
                .iter()
                .for_each(|a| read_ahead(a, self.thread_reads())),
        }
    }

    /// Queue the reads of `guessed`, what the runtime expects to read but
    /// is not sure of (`Weights::prefetch_likely`), for the thread's spare
    /// time: it takes a guess only when no announcement waits, and over the
    /// budget reads only as much of it as the residency gives guesses
    /// ([`Residency::guess`]). An announcement of the same expert tensor
    /// supersedes the guesses that wait for it. Where the thread cannot be
    /// started, nothing is read: a guess never costs the caller's time.
    /// Where the weights fit, what was read once is not guessed again.
    pub(crate) fn guess(&self, guessed: Vec<Announced>) {
        let guessed = match self.read_once {
            Some(_) => self.not_read_once(guessed),
            None => {
                self.advise_first_announced(&guessed);
                guessed
            }
        };
        if guessed.is_empty() {
            return;
        }
        if let Some(queue) = self.thread_queue() {
            guessed.into_iter().for_each(|g| queue.push_guess(g));
        }
    }

    /// Of `guessed`, the ranges not read once (where the weights fit).
    fn not_read_once(&self, mut guessed: Vec<Announced>) -> Vec<Announced> {
        let Some(read_once) = &self.read_once else {
            return guessed;
        };
        let seen = read_once.lock().unwrap_or_else(|e| e.into_inner());
        for g in &mut guessed {
            let base = g.map.addr();
            let new = |r: &Range| !seen.contains(&(base + r.0, base + r.1));
            g.whole.retain(new);
            g.experts.retain_mut(|(_, slices)| {
                slices.retain(new);
                !slices.is_empty()
            });
        }
        guessed.retain(|g| !g.whole.is_empty() || !g.experts.is_empty());
        guessed
    }

    /// The thread's queue, the thread started if it is not (in this
    /// process); `None` where it cannot be started.
    fn thread_queue(&self) -> Option<Arc<Queue>> {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if started.as_ref().is_some_and(Started::is_parents) {
            // A child after fork: the thread is the parent's. Its handle
            // and queue are left as they are (the parent's thread may have
            // held the queue's lock as it forked); the child starts its own.
            std::mem::forget(started.take());
        }
        let residency = || Residency::new(self.budget, self.mapped).in_room(self.slice_room);
        let reads = self.thread_reads();
        let started = started.get_or_insert_with(|| Started::spawn(residency(), reads));
        started.queue.clone()
    }

    /// Forget which expert tensors were advised to be read only as
    /// announced, so that each is advised again at its next announcement:
    /// a runtime's mapping followed since receives the advice too, after
    /// the region's, which would otherwise undo it.
    pub(crate) fn forget_advised(&self) {
        self.advised
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Forget that `[start, end)` of `map` was read, so that the next
    /// announcement there reads it again: its pages were released.
    pub(crate) fn forget_read(&self, map: &crate::os::Mapping, start: usize, end: usize) {
        if let Some(read_once) = &self.read_once {
            let (start, end) = (map.addr() + start, map.addr() + end);
            let mut seen = read_once.lock().unwrap_or_else(|e| e.into_inner());
            seen.retain(|r| r.1 <= start || r.0 >= end);
        }
    }

    /// How many announcements and guesses wait for the thread.
    #[cfg(test)]
    fn queued(&self) -> (usize, usize) {
        let started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        started
            .as_ref()
            .and_then(|s| s.queue.as_ref())
            .map_or((0, 0), |q| q.len())
    }

    /// Over the budget, queue the reads of the announced expert slices here,
    /// in the runtime's thread, before it computes on them. Where the
    /// runtime computes on every core (as ggml does), the reading thread
    /// runs only when the scheduler preempts a compute thread, and the
    /// compute would reach the slices before their reads are queued; its
    /// faults would then read one page each (the tensor is read only as
    /// announced). Queuing costs this thread the page cache's bookkeeping,
    /// the same a fault would pay; the thread still keeps the residency and
    /// releases.
    fn queue_slices_here(&self, announced: &[Announced]) {
        let slices = Reads {
            whole: false,
            slices: true,
        };
        for a in announced {
            read_ahead(a, slices);
        }
    }

    /// Over the budget, read each expert tensor only as announced from its
    /// first announcement on ([`read_only_as_announced`]). That is done
    /// here, in the runtime's thread, before the runtime computes on the
    /// tensor: on the reading thread it would come after the runtime's first
    /// faults there, which would read around themselves in huge-page
    /// folios that no release can drop.
    fn advise_first_announced(&self, announced: &[Announced]) {
        let mut advised = self.advised.lock().unwrap_or_else(|e| e.into_inner());
        for a in announced {
            for (tensor, _) in &a.experts {
                if advised.insert(a.map.addr() + tensor.0) {
                    read_only_as_announced(&a.map, tensor.0, tensor.1);
                }
            }
        }
    }
}

impl Started {
    fn spawn(residency: Residency, reads: Reads) -> Started {
        let queue = Arc::new(Queue::default());
        let theirs = Arc::clone(&queue);
        let spawned = std::thread::Builder::new()
            .name("weightmap-announced".into())
            .stack_size(256 << 10)
            .spawn(move || serve(&theirs, residency, reads));
        let (queue, thread) = match spawned {
            Ok(thread) => (Some(queue), Some(thread)),
            Err(_) => (None, None),
        };
        Started {
            pid: std::process::id(),
            queue,
            thread,
        }
    }

    /// Whether this was started in another process: this is a child after
    /// fork, where the thread does not exist.
    fn is_parents(&self) -> bool {
        self.pid != std::process::id()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.is_parents() {
            // Joining a thread of the parent would fail (and panic inside
            // std); its queue may be locked for good. Both are left.
            std::mem::forget(self.thread.take());
            std::mem::forget(self.queue.take());
            return;
        }
        if let Some(queue) = &self.queue {
            queue.close();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether the last page of `r` in `map` is in memory: where it is not,
/// what was read once has been taken since (reclaim takes a range read
/// together from its oldest pages, so the last goes last). Unknown counts
/// as resident.
fn last_page_resident(map: &crate::os::Mapping, r: &Range) -> bool {
    let page = crate::os::page_size();
    let start = r.1.saturating_sub(1) / page * page;
    map.residency(start.max(r.0), r.1)
        .map_or(true, |res| res.resident_pages == res.total_pages)
}

/// The thread's loop: for each announcement, the announced ranges of
/// `reads` are read ahead, and then, where the weights exceed the budget,
/// the slices the residency lets go are released. The reads come first
/// because the runtime is about to compute on them: a page it reaches
/// before its read is queued costs a fault that reads that page alone.
fn serve(queue: &Queue, mut residency: Residency, reads: Reads) {
    let mut in_flight = InFlight::default();
    while let Some(work) = queue.pop() {
        match work {
            Work::Announced(a) => {
                serve_announced(&a, &mut residency, reads);
                in_flight.note(&a, reads);
            }
            Work::Guessed(g) => serve_guessed(g, queue, &mut in_flight, &mut residency, reads),
        }
    }
}

/// How long a guess waits for the reads before it, at most: a
/// read that has not come in by then was most likely taken again by
/// reclaim, and is no longer in flight.
const GUESS_WAIT: Duration = Duration::from_millis(100);

/// The ranges the thread has read ahead and not yet seen in memory. A
/// guess is read with the device's spare time only: queued behind these,
/// or with many of its own pieces, its reads would hold up what the runtime
/// announces next, as a device reads in the order it is asked.
#[derive(Debug, Default)]
struct InFlight {
    ranges: Vec<(Arc<Mapping>, Range)>,
}

impl InFlight {
    /// Note the reads of `a`, the latest announcement: those `thread_reads`
    /// says the thread queued, and the slices the announcing call queued
    /// over the budget. They replace what was noted: a device reads in
    /// about the order it is asked, so the earlier reads are in once these
    /// are, and checking only these keeps the look the same size however
    /// long no guess comes.
    fn note(&mut self, a: &Announced, thread_reads: Reads) {
        let queued = Reads {
            whole: thread_reads.whole,
            slices: true,
        };
        let ranges = reads(a, queued).into_iter();
        self.ranges = ranges.map(|r| (Arc::clone(&a.map), r)).collect();
    }

    /// Wait until the reads are in, or [`GUESS_WAIT`] has passed: `true`;
    /// `false` as soon as an announcement waits, which goes first.
    fn wait(&mut self, queue: &Queue) -> bool {
        let start = Instant::now();
        loop {
            self.ranges.retain(|(map, r)| !last_page_resident(map, r));
            if self.ranges.is_empty() || start.elapsed() >= GUESS_WAIT {
                self.ranges.clear();
                return true;
            }
            if queue.announced_within(Duration::from_millis(1)) {
                return false;
            }
        }
    }
}

/// One read of a guess: a tensor read whole, or one slice of an expert
/// tensor.
#[derive(Clone, Copy, Debug)]
enum Piece {
    Whole(Range),
    Slice { tensor: Range, slice: Range },
}

impl Announced {
    /// The reads of this guess, a piece at a time, in its order; tensors
    /// read whole only with `whole`.
    fn pieces(&self, whole: bool) -> Vec<Piece> {
        let whole = self
            .whole
            .iter()
            .filter(|_| whole)
            .map(|&r| Piece::Whole(r));
        let slices = self.experts.iter().flat_map(|(tensor, slices)| {
            slices.iter().map(|&slice| Piece::Slice {
                tensor: *tensor,
                slice,
            })
        });
        whole.chain(slices).collect()
    }

    /// The guess of `pieces` of this mapping.
    fn of_pieces(map: &Arc<Mapping>, pieces: &[Piece]) -> Announced {
        let mut g = Announced {
            map: Arc::clone(map),
            whole: Vec::new(),
            experts: Vec::new(),
        };
        for &p in pieces {
            match p {
                Piece::Whole(r) => g.whole.push(r),
                Piece::Slice { tensor, slice } => match g.experts.last_mut() {
                    Some((t, slices)) if *t == tensor => slices.push(slice),
                    _ => g.experts.push((tensor, vec![slice])),
                },
            }
        }
        g
    }
}

/// Read a guess ahead with the device's spare time: a piece at a time
/// ([`Piece`]), each once the reads before it are in ([`InFlight`]), so that
/// an announcement that comes meanwhile waits behind one piece at most,
/// whose rest is then put back for after it (or dropped, superseded).
/// Where the weights exceed the budget, a slice is read only where the
/// residency has spare room for it ([`Residency::guess`]).
fn serve_guessed(
    g: Announced,
    queue: &Queue,
    in_flight: &mut InFlight,
    residency: &mut Residency,
    reads: Reads,
) {
    // Over the budget, a slice in memory already, or with no room to
    // spare, would be read nowhere: the guess does not wait for it.
    let base = g.map.addr();
    let spare = residency.has_spare_room();
    let mut pieces = g.pieces(reads.whole);
    pieces.retain(|p| match p {
        Piece::Whole(_) => true,
        Piece::Slice { slice, .. } => spare && !residency.holds((base + slice.0, base + slice.1)),
    });
    for (n, &piece) in pieces.iter().enumerate() {
        if !in_flight.wait(queue) {
            queue.put_back_guess(Announced::of_pieces(&g.map, &pieces[n..]));
            return;
        }
        let read = match piece {
            Piece::Whole(r) => vec![r],
            Piece::Slice { slice, .. } if !residency.exceeds_budget() => vec![slice],
            Piece::Slice { tensor, slice } => {
                let at = |r: Range| (base + r.0, base + r.1);
                let read = residency.guess(at(tensor), &[at(slice)]);
                read.into_iter().map(|r| (r.0 - base, r.1 - base)).collect()
            }
        };
        for (start, end) in read {
            g.map.will_need(start, end);
            in_flight.ranges.push((Arc::clone(&g.map), (start, end)));
        }
    }
}

/// Read an announcement ahead, and release what the residency lets go.
fn serve_announced(a: &Announced, residency: &mut Residency, reads: Reads) {
    // The residency keys ranges by address, so that the files of a
    // model in several tell theirs apart.
    let base = a.map.addr();
    let at = |r: &Range| (base + r.0, base + r.1);
    // Where the weights fit, nothing is kept or released.
    let experts = match residency.exceeds_budget() {
        true => &a.experts[..],
        false => &[],
    };
    let announced: Vec<Vec<Range>> = experts
        .iter()
        .map(|(_, slices)| slices.iter().map(at).collect())
        .collect();
    let mut done = Vec::new();
    for ((tensor, _), slices) in experts.iter().zip(&announced) {
        done.extend(residency.announce(at(tensor), slices));
    }
    read_ahead(a, reads);
    for (start, end) in done {
        // One tensor's announcement may let go of a slice another in
        // the same one names: that slice stays.
        if !announced.iter().flatten().any(|&r| r == (start, end)) {
            // Advisory: a failure leaves the pages to reclaim.
            let _ = a.map.release(start - base, end - base);
        }
    }
}

/// Queue the reads of `a`'s ranges of `which`: its tensors announced whole,
/// then each expert tensor's slices, tensor by tensor in the order
/// announced, near ranges joined. A runtime announces in the order it
/// computes, so that its compute follows the reads as they complete: in
/// address order, a layer's first expert node (llama.cpp's up projection)
/// would wait for the slices of a tensor before it in the file (the
/// gate's).
///
/// Where even the tensors read whole exceed the budget, they are left to the
/// fault path: a decode step reads them in order, and the page plan has
/// advised those that cannot stay to be read ahead sequentially
/// ([`streamed_whole`](super::plan::streamed_whole)). Read ahead besides,
/// they only compete for the budget: a tensor larger than what it leaves
/// free evicts its own first pages before the compute reaches them.
fn read_ahead(a: &Announced, which: Reads) {
    for (start, end) in reads(a, which) {
        a.map.will_need(start, end);
    }
}

/// The ranges [`read_ahead`] reads, in its order.
fn reads(a: &Announced, which: Reads) -> Vec<Range> {
    let whole = if which.whole {
        a.whole.clone()
    } else {
        Vec::new()
    };
    let tensors = a.experts.iter().filter(|_| which.slices);
    let tensors = tensors.map(|(_, slices)| slices.clone());
    std::iter::once(whole)
        .chain(tensors)
        .flat_map(merge)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// What the reads do to the page cache is tested where it can be
    /// observed (`tests/announce.rs`); here, the thread's life.
    #[test]
    fn the_thread_ends_with_its_announcer_and_lets_go_of_the_mapping() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![3u8; 8 << 20]).unwrap();
        // SAFETY: the temporary file is not changed while mapped.
        let map = Arc::new(unsafe { Mapping::map(f.as_file()) }.unwrap());
        // A budget below the file: slices are released as they go.
        let announcer = Announcer::with(Some(70 << 20), 8 << 20, false, None);
        for i in 0..4 {
            announcer.announce(vec![Announced {
                map: Arc::clone(&map),
                whole: vec![(0, 1 << 20)],
                experts: vec![((4 << 20, 8 << 20), vec![((4 + i) << 20, (5 + i) << 20)])],
            }]);
        }
        drop(announcer);
        // Joined: the thread has read ahead what it was sent and let go.
        assert_eq!(Arc::strong_count(&map), 1);
        assert_eq!(map.bytes()[5 << 20], 3);
    }

    /// A mapping of `mib` MiB of a temporary file.
    fn mapping(mib: usize) -> (tempfile::NamedTempFile, Arc<Mapping>) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![3u8; mib << 20]).unwrap();
        // SAFETY: the temporary file is not changed while mapped.
        let map = Arc::new(unsafe { Mapping::map(f.as_file()) }.unwrap());
        (f, map)
    }

    fn whole(map: &Arc<Mapping>, range: Range) -> Vec<Announced> {
        vec![Announced {
            map: Arc::clone(map),
            whole: vec![range],
            experts: Vec::new(),
        }]
    }

    #[test]
    fn what_waits_is_bounded_and_repeats_coalesce() {
        let (_f, map) = mapping(8);
        // Over the budget: nothing is skipped as read once, everything
        // goes to the thread.
        let announcer = Announcer::with(Some(70 << 20), 8 << 20, false, None);
        // Issue 54: each of these was queued, and dropping the weights
        // then re-advised the range once for each.
        for _ in 0..100_000 {
            announcer.announce(whole(&map, (0, 4 << 20)));
        }
        assert!(announcer.queued().0 <= 1, "{:?}", announcer.queued());
        for i in 0..10_000 {
            let at = (i * 4096) % (8 << 20);
            announcer.announce(whole(&map, (at, at + 4096)));
        }
        assert!(
            announcer.queued().0 <= QUEUE_LIMIT,
            "{:?}",
            announcer.queued()
        );
        // Guesses, as many, wait bounded too.
        for i in 0..100_000 {
            let at = (i * 4096) % (8 << 20);
            announcer.guess(whole(&map, (at, at + 4096)));
        }
        assert!(
            announcer.queued().1 <= QUEUE_LIMIT,
            "{:?}",
            announcer.queued()
        );
        // Dropped, what waits is abandoned: the mapping is let go.
        drop(announcer);
        assert_eq!(Arc::strong_count(&map), 1);
    }

    fn experts(map: &Arc<Mapping>, tensor: Range, slice: Range) -> Announced {
        Announced {
            map: Arc::clone(map),
            whole: Vec::new(),
            experts: vec![(tensor, vec![slice])],
        }
    }

    #[test]
    fn guesses_wait_for_announcements_and_are_superseded_by_them() {
        let (_f, map) = mapping(1);
        const K: usize = 4096;
        let (t, u) = ((0, 4 * K), (4 * K, 8 * K));
        let q = Queue::default();
        q.push_guess(experts(&map, t, (0, K)));
        q.push_guess(experts(&map, u, (4 * K, 5 * K)));
        q.push_guess(experts(&map, u, (4 * K, 5 * K))); // a repeat
        assert_eq!(q.len(), (0, 2));
        // An announcement of t's experts supersedes t's guess; u's waits
        // behind it.
        q.push(experts(&map, t, (K, 2 * K)));
        assert_eq!(q.len(), (1, 1));
        assert!(matches!(q.pop(), Some(Work::Announced(a)) if a.experts[0].0 == t));
        assert!(matches!(q.pop(), Some(Work::Guessed(g)) if g.experts[0].0 == u));
        // Bounded as announcements are.
        for i in 0..1000 {
            q.push_guess(experts(&map, u, (4 * K + i, 5 * K)));
        }
        assert_eq!(q.len(), (0, QUEUE_LIMIT));
        q.close();
        assert!(q.pop().is_none());
    }

    #[test]
    fn a_guess_waits_for_the_reads_before_it_and_gives_way_to_announcements() {
        const K: usize = 4096;
        let (f, map) = mapping(1);
        let guess = Announced {
            map: Arc::clone(&map),
            whole: vec![(0, K)],
            experts: vec![((4 * K, 8 * K), vec![(4 * K, 5 * K), (6 * K, 7 * K)])],
        };
        // A piece at a time, and back.
        let pieces = guess.pieces(true);
        assert_eq!(pieces.len(), 3);
        assert!(Announced::of_pieces(&map, &pieces).same_reads(&guess));
        assert_eq!(guess.pieces(false).len(), 2);
        // A read still in flight: the file, dropped from the page cache
        // (written back first: dirty pages stay). Where that cannot be
        // seen, nothing more is tested.
        f.as_file().sync_all().unwrap();
        map.release(0, 1 << 20).unwrap();
        if last_page_resident(&map, &(0, 1 << 20)) {
            eprintln!("SKIPPED: the page cache cannot be observed here");
            return;
        }
        let unread = |in_flight: &mut InFlight| {
            in_flight.ranges = vec![(Arc::clone(&map), (0, 1 << 20))];
        };
        let (mut in_flight, mut residency) = (InFlight::default(), Residency::new(None, 1 << 20));
        let reads = Reads {
            whole: true,
            slices: true,
        };
        // An announcement waits: the guess gives way, and is put back to go
        // first among the guesses once the announcement is served.
        let q = Queue::default();
        q.push(whole(&map, (8 * K, 9 * K)).remove(0));
        unread(&mut in_flight);
        serve_guessed(guess, &q, &mut in_flight, &mut residency, reads);
        assert_eq!(q.len(), (1, 1));
        assert!(matches!(q.pop(), Some(Work::Announced(_))));
        let Some(Work::Guessed(back)) = q.pop() else {
            panic!("the guess was not put back")
        };
        assert!(back.same_reads(&Announced::of_pieces(&map, &pieces)));
        // One that names the guess's expert tensor supersedes it.
        q.push(experts(&map, (4 * K, 8 * K), (5 * K, 6 * K)));
        unread(&mut in_flight);
        serve_guessed(back, &q, &mut in_flight, &mut residency, reads);
        assert_eq!(q.len(), (1, 0));
        // With none waiting, the guess waits for the reads before it (or
        // for GUESS_WAIT), and is then read.
        let q = Queue::default();
        unread(&mut in_flight);
        assert!(in_flight.wait(&q));
        assert!(in_flight.ranges.is_empty());
    }

    #[test]
    fn a_guess_where_the_weights_fit_skips_what_was_read_once() {
        let (_f, map) = mapping(1);
        let announcer = Announcer::with(Some(1 << 40), 1 << 20, false, None);
        announcer.announce(whole(&map, (0, 4096)));
        assert!(announcer.not_read_once(whole(&map, (0, 4096))).is_empty());
        let new = announcer.not_read_once(whole(&map, (4096, 8192)));
        assert_eq!(new[0].whole, [(4096, 8192)]);
        announcer.guess(new);
        drop(announcer);
        assert_eq!(Arc::strong_count(&map), 1);
    }

    #[test]
    fn a_child_after_fork_starts_its_own_thread_and_leaves_the_parents() {
        let (_f, map) = mapping(1);
        let announcer = Announcer::with(Some(70 << 20), 1 << 20, false, None);
        announcer.announce(whole(&map, (0, 4096)));
        // As a child after fork sees it: started in another process.
        let parents = {
            let mut started = announcer.started.lock().unwrap();
            let s = started.as_mut().unwrap();
            s.pid = s.pid.wrapping_add(1);
            s.thread.as_ref().unwrap().thread().id()
        };
        announcer.announce(whole(&map, (4096, 8192)));
        let started = announcer.started.lock().unwrap();
        let s = started.as_ref().unwrap();
        assert_eq!(s.pid, std::process::id());
        assert_ne!(s.thread.as_ref().unwrap().thread().id(), parents);
        drop(started);
        // Dropped without joining the "parent's" thread, which still waits
        // for announcements in this test's process.
        drop(announcer);
    }

    #[test]
    fn a_released_range_is_read_again_where_the_weights_fit() {
        let (_f, map) = mapping(1);
        let announcer = Announcer::with(Some(1 << 40), 1 << 20, false, None);
        let seen = |a: &Announcer| a.read_once.as_ref().unwrap().lock().unwrap().len();
        announcer.announce(whole(&map, (0, 4096)));
        announcer.announce(whole(&map, (8192, 12288)));
        assert_eq!(seen(&announcer), 2);
        announcer.forget_read(&map, 0, 8192);
        assert_eq!(seen(&announcer), 1);
    }

    #[test]
    fn reads_go_tensor_by_tensor_in_the_order_announced() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&[0u8; 4096]).unwrap();
        // SAFETY: the temporary file is not changed while mapped.
        let map = Arc::new(unsafe { Mapping::map(f.as_file()) }.unwrap());
        const M: usize = 1 << 20;
        // The up projection's experts (later in the file) announced before
        // the gate's, as llama.cpp computes them; each tensor's adjacent
        // slices joined.
        let up = ((40 * M, 48 * M), vec![(41 * M, 42 * M), (42 * M, 43 * M)]);
        let gate = ((20 * M, 28 * M), vec![(25 * M, 26 * M), (21 * M, 22 * M)]);
        let a = Announced {
            map,
            whole: vec![(3 * M, 4 * M), (0, M)],
            experts: vec![up, gate],
        };
        let which = |whole, slices| Reads { whole, slices };
        let slices = [(41 * M, 43 * M), (21 * M, 22 * M), (25 * M, 26 * M)];
        assert_eq!(reads(&a, which(false, true)), slices);
        let whole = [(0, M), (3 * M, 4 * M)];
        assert_eq!(reads(&a, which(true, false)), whole);
        assert_eq!(reads(&a, which(true, true)), [&whole[..], &slices].concat());
    }
}
