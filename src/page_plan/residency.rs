//! What stays resident when the weights exceed the memory budget, decided
//! from what the runtime announces ([`Residency`]): every tensor read whole
//! (norms, attention, routers, shared experts) stays, the expert slices in
//! use stay while they are, and beside them so do the slices the
//! announcements show are used most, as many as the budget holds after the
//! rest. Every other expert slice streams through: it is read ahead when
//! announced and released once the next announcement of its tensor shows
//! its use is over (or, if it stayed, once it loses its place), so that the
//! kernel's reclaim, which sees only recency, never has to choose between
//! it and the resident set.
//!
//! Where the weights fit, every slice is resident and nothing is released.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};

/// Bytes kept out of the resident set for the runtime's own memory (its
/// activations, its KV cache, the allocator's slack).
pub(crate) const RUNTIME_RESERVE: u64 = 64 << 20;

/// The bytes of expert slices that may stay resident under `budget`
/// (`None`: unknown, no limit) beside `whole` bytes of tensors read whole:
/// the budget less the runtime's reserve and those tensors.
pub(crate) fn expert_capacity(budget: Option<u64>, whole: u64) -> u64 {
    match budget {
        None => u64::MAX,
        Some(b) => b.saturating_sub(RUNTIME_RESERVE).saturating_sub(whole),
    }
}

/// Whether `mapped` bytes exceed what `budget` (`None`: unknown, no
/// limit) holds beside the runtime's reserve.
pub(crate) fn exceeds_budget(budget: Option<u64>, mapped: u64) -> bool {
    budget.is_some_and(|b| mapped > b.saturating_sub(RUNTIME_RESERVE))
}

/// A range of one mapping: `[start, end)`.
pub(crate) type Range = (usize, usize);

fn len(r: &Range) -> u64 {
    (r.1 - r.0) as u64
}

#[derive(Debug, Default)]
struct Slice {
    /// How many announcements named it.
    uses: u64,
    /// The announcement that last named it (a tick).
    last: u64,
    /// Whether it is in its tensor's last announcement.
    in_use: bool,
}

impl Slice {
    /// Where a slice not in use ranks: the most used first, the most
    /// recent first among equals, then by address.
    fn rank(&self, r: Range) -> Rank {
        (Reverse(self.uses), Reverse(self.last), r)
    }
}

type Rank = (Reverse<u64>, Reverse<u64>, Range);

#[cfg(test)]
type Set = std::collections::HashSet<Range>;

/// The resident set of one mapping's expert slices, from its
/// announcements; the caller releases what [`Residency::announce`] returns.
///
/// The slices not in use that stay (`kept`) are in memory, in rank order.
/// A slice joins them when its use ends, and its rank against theirs and
/// the room decide whether it stays or the worst of them goes. A slice
/// released stays again only once an announcement has read it again: the
/// room of a slice counted as staying but not in memory would be room the
/// page cache leaves empty. An announcement changes the rank of the few
/// slices it names and of those whose use it ends, so it moves only those
/// and the worst that stay: a model of 48 layers and 128 experts tracks
/// 18,432 slices, which ranking anew at each of a token's 144
/// announcements would cost more than the token.
#[derive(Debug)]
pub(crate) struct Residency {
    /// The memory budget (`None`: unknown, and everything stays).
    budget: Option<u64>,
    /// Bytes of the mapping's tensors that stay mapped.
    mapped: u64,
    /// Every slice announced, by range.
    slices: HashMap<Range, Slice>,
    /// The tensors announced by their experts, by range, with the slices
    /// their last announcement named.
    tensors: HashMap<Range, Vec<Range>>,
    /// Their bytes, which `mapped` holds too.
    expert_bytes: u64,
    /// The tick of each of their last announcements.
    announced_at: HashMap<Range, u64>,
    /// The room for slices, in use or not, where it is known from the
    /// plan (its `expert_capacity`): the slices in use beyond it end their
    /// use ([`Residency::end_oldest_uses`]).
    slice_room: Option<u64>,
    /// Bytes of the slices in use.
    in_use_bytes: u64,
    /// The slices not in use that stay, and their bytes.
    kept: BTreeSet<Rank>,
    kept_bytes: u64,
    /// Slices guessed ([`Residency::guess`]) and read, not yet announced:
    /// each with its tensor and the tick of its guess. They are not in
    /// `kept`, and are the first to go.
    guessed: HashMap<Range, (Range, u64)>,
    guessed_bytes: u64,
    /// Guessed slices that an announcement then named, and those it
    /// superseded or that made way for one.
    guess_hits: u64,
    guess_misses: u64,
    tick: u64,
}

impl Residency {
    /// For a mapping whose mapped tensors hold `mapped` bytes, under
    /// `budget`.
    pub(crate) fn new(budget: Option<u64>, mapped: u64) -> Residency {
        Residency {
            budget,
            mapped,
            slices: HashMap::new(),
            tensors: HashMap::new(),
            expert_bytes: 0,
            announced_at: HashMap::new(),
            slice_room: None,
            in_use_bytes: 0,
            kept: BTreeSet::new(),
            kept_bytes: 0,
            guessed: HashMap::new(),
            guessed_bytes: 0,
            guess_hits: 0,
            guess_misses: 0,
            tick: 0,
        }
    }

    /// The same, with the room for slices known from the plan:
    /// `expert_capacity` of [`ResidencyPlan::StreamExperts`](crate::ResidencyPlan::StreamExperts).
    pub(crate) fn in_room(mut self, slice_room: Option<u64>) -> Residency {
        self.slice_room = slice_room;
        self
    }

    /// Whether the weights exceed what the budget holds beside the
    /// runtime's reserve: only then is anything streamed or released.
    pub(crate) fn exceeds_budget(&self) -> bool {
        exceeds_budget(self.budget, self.mapped)
    }

    /// The bytes of expert slices that may stay resident beside those in
    /// use and those guessed: the budget less the runtime's reserve, every
    /// tensor read whole, the slices in use, which are in memory whatever
    /// is chosen, and the guesses read.
    fn room(&self) -> u64 {
        self.room_beside_in_use().saturating_sub(self.guessed_bytes)
    }

    /// Whether the slice `r` is in memory as far as the plan goes: in use,
    /// kept, or guessed.
    pub(crate) fn holds(&self, r: Range) -> bool {
        self.guessed.contains_key(&r)
            || self
                .slices
                .get(&r)
                .is_some_and(|s| s.in_use || self.kept.contains(&s.rank(r)))
    }

    /// Whether a guess could be given room ([`Residency::guess`]).
    pub(crate) fn has_spare_room(&self) -> bool {
        !self.exceeds_budget() || self.spare_room() > 0
    }

    /// The room no slice holds, in use, kept or guessed: all a guess may
    /// take.
    fn spare_room(&self) -> u64 {
        self.room().saturating_sub(self.kept_bytes)
    }

    fn room_beside_in_use(&self) -> u64 {
        let whole = self.mapped.saturating_sub(self.expert_bytes);
        expert_capacity(self.budget, whole).saturating_sub(self.in_use_bytes)
    }

    /// Note a guess that `slices` of the expert tensor `tensor` are read
    /// next (`Weights::prefetch_likely`), and return the slices to read. A
    /// guess takes the budget's spare room only, what neither the slices in
    /// use, nor those kept from past announcements, nor other guesses hold:
    /// it never costs what was announced its place. Slices in memory
    /// already (in use, kept, guessed) are not read again.
    pub(crate) fn guess(&mut self, tensor: Range, slices: &[Range]) -> Vec<Range> {
        if !self.exceeds_budget() {
            return slices.to_vec();
        }
        self.tick += 1;
        // A tensor guessed by its experts is an expert tensor: its bytes
        // leave those read whole.
        if let Entry::Vacant(first) = self.tensors.entry(tensor) {
            first.insert(Vec::new());
            self.expert_bytes += len(&tensor);
        }
        let mut spare = self.spare_room();
        let mut read = Vec::new();
        for &r in slices {
            if self.holds(r) {
                continue;
            }
            if len(&r) > spare {
                break;
            }
            spare -= len(&r);
            self.slices.entry(r).or_default();
            self.guessed.insert(r, (tensor, self.tick));
            self.guessed_bytes += len(&r);
            read.push(r);
        }
        read
    }

    /// Let go of the guess of `r`, unconfirmed. It is in memory still,
    /// and the caller settles whether it stays ([`Residency::settle`]).
    fn drop_guess(&mut self, r: Range) {
        if self.guessed.remove(&r).is_some() {
            self.guessed_bytes -= len(&r);
            self.guess_misses += 1;
        }
    }

    /// Note that `slices` of the expert tensor `tensor` are read next, and
    /// return the slices to release: those whose use is over (the tensor's
    /// previous announcement named them and this one does not) and that do
    /// not stay resident, and those that stayed and no longer do.
    pub(crate) fn announce(&mut self, tensor: Range, slices: &[Range]) -> Vec<Range> {
        self.tick += 1;
        // The guesses of this tensor: confirmed where named, else
        // superseded.
        let mut unconfirmed = Vec::new();
        for (&r, &(t, _)) in &self.guessed {
            if t == tensor {
                if slices.contains(&r) {
                    self.guess_hits += 1;
                } else {
                    unconfirmed.push(r);
                }
            }
        }
        for &r in slices {
            if self.guessed.remove(&r).is_some() {
                self.guessed_bytes -= len(&r);
            }
        }
        for &r in &unconfirmed {
            self.drop_guess(r);
        }
        let last = match self.tensors.get_mut(&tensor) {
            Some(last) => std::mem::take(last),
            None => {
                self.expert_bytes += len(&tensor);
                Vec::new()
            }
        };
        for &r in slices {
            let s = self.slices.entry(r).or_default();
            if !s.in_use {
                let rank = s.rank(r);
                s.in_use = true;
                self.in_use_bytes += len(&r);
                if self.kept.remove(&rank) {
                    self.kept_bytes -= len(&r);
                }
            }
            s.uses += 1;
            s.last = self.tick;
        }
        // The slices whose use is over are in memory still, as are the
        // guesses let go.
        let mut out_of_use = unconfirmed;
        for r in last.into_iter().filter(|r| !slices.contains(r)) {
            let s = self.slices.get_mut(&r).expect("a slice in use is known");
            if s.in_use {
                s.in_use = false;
                self.in_use_bytes -= len(&r);
                out_of_use.push(r);
            } // (else named twice in the last announcement)
        }
        self.tensors.insert(tensor, slices.to_vec());
        self.announced_at.insert(tensor, self.tick);
        out_of_use.extend(self.end_oldest_uses(tensor));
        // Guesses are the first to go when the slices in use need room:
        // the oldest first.
        while self.guessed_bytes > self.room_beside_in_use() {
            let oldest = self
                .guessed
                .iter()
                .min_by_key(|(r, (_, tick))| (*tick, **r));
            let oldest = *oldest.expect("guessed bytes are guessed slices'").0;
            self.drop_guess(oldest);
            out_of_use.push(oldest);
        }
        self.settle(out_of_use)
    }

    /// End the use of the tensors announced longest ago, until the slices
    /// in use fit in the room for slices; return the slices whose use
    /// ended. A decode step's slices in use fit (OLMoE's layout at a
    /// quarter of the file: 384 slices, 430 MB, in a room of 603 MiB),
    /// but a prompt's batch names about every expert of every layer. A
    /// runtime computes its layers in order, so the tensor announced
    /// longest ago is done with. Ended here, its slices are released
    /// before the next layer's reads make the kernel's reclaim choose what
    /// goes; its next announcement reads them again.
    fn end_oldest_uses(&mut self, current: Range) -> Vec<Range> {
        let Some(room) = self.slice_room else {
            return Vec::new();
        };
        let mut ended = Vec::new();
        while self.in_use_bytes > room {
            let in_use = self
                .announced_at
                .iter()
                .filter(|(t, _)| **t != current && !self.tensors[*t].is_empty());
            let Some((&oldest, _)) = in_use.min_by_key(|(t, tick)| (**tick, **t)) else {
                break;
            };
            let slices = self.tensors.get_mut(&oldest).map(std::mem::take);
            for r in slices.unwrap_or_default() {
                let s = self.slices.get_mut(&r).expect("a slice in use is known");
                if s.in_use {
                    s.in_use = false;
                    self.in_use_bytes -= len(&r);
                    ended.push(r);
                }
            }
        }
        ended
    }

    /// Settle which slices stay, now that `in_memory` (slices in memory,
    /// out of use and not guessed) join those kept, and return the slices
    /// to release: the worst ranked of them all, until the rest fit in the
    /// room. A slice released waits, and stays again only once it is read
    /// again, announced: counting it as staying before would hold its room
    /// for bytes that are not in memory while the page cache held less than
    /// the budget allows.
    fn settle(&mut self, in_memory: Vec<Range>) -> Vec<Range> {
        for r in in_memory {
            self.kept.insert(self.slices[&r].rank(r));
            self.kept_bytes += len(&r);
        }
        let room = self.room();
        let mut over = Vec::new();
        while self.kept_bytes > room {
            let worst = self.kept.pop_last().expect("kept bytes are kept slices'");
            self.kept_bytes -= len(&worst.2);
            over.push(worst);
        }
        // Of those, the best first: one smaller than the last to go may
        // fit still.
        let mut release = Vec::new();
        for rank in over.into_iter().rev() {
            if self.kept_bytes + len(&rank.2) <= room {
                self.kept_bytes += len(&rank.2);
                self.kept.insert(rank);
            } else {
                release.push(rank.2);
            }
        }
        release
    }

    /// How many guessed slices an announcement named, and how many it
    /// superseded or made way for.
    #[cfg(test)]
    fn guesses(&self) -> (u64, u64) {
        (self.guess_hits, self.guess_misses)
    }

    /// The slices in use (every tensor's last announcement's), and those
    /// chosen to stay beside them.
    #[cfg(test)]
    fn in_memory(&self) -> (Set, Set) {
        let in_use = self.tensors.values().flatten().copied().collect();
        let kept = self.kept.iter().map(|rank| rank.2).collect();
        (in_use, kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const MIB: usize = 1 << 20;

    /// A tensor of four 1 MiB experts at `at` MiB.
    fn slices(at: usize) -> (Range, [Range; 4]) {
        let s = |i: usize| ((at + i) * MIB, (at + i + 1) * MIB);
        ((at * MIB, (at + 4) * MIB), [s(0), s(1), s(2), s(3)])
    }

    fn bytes(ranges: &HashSet<Range>) -> u64 {
        ranges.iter().map(|r| (r.1 - r.0) as u64).sum()
    }

    #[test]
    fn where_the_weights_fit_nothing_is_released() {
        let (t, e) = slices(0);
        let mut r = Residency::new(Some(1 << 40), 4 * MIB as u64);
        assert!(!r.exceeds_budget());
        assert!(r.announce(t, &[e[0], e[1]]).is_empty());
        assert!(r.announce(t, &[e[2], e[3]]).is_empty());
        assert_eq!(r.in_memory().1, HashSet::from([e[0], e[1]]));
        let mut unknown = Residency::new(None, 4 * MIB as u64);
        unknown.announce(t, &[e[0]]);
        assert!(unknown.announce(t, &[e[1]]).is_empty());
    }

    #[test]
    fn slices_in_use_beyond_the_room_end_their_use_the_oldest_tensor_first() {
        // A prompt's batch names every expert of every layer: three tensors
        // of four 1 MiB experts, all named, in a room of 9 MiB (2 MiB
        // read whole beside them). The runtime computes the tensors in
        // order: once the third is announced, the first is done with.
        let (a, b, c) = (slices(0), slices(4), slices(8));
        let budget = RUNTIME_RESERVE + 11 * MIB as u64;
        let mut r = Residency::new(Some(budget), 14 * MIB as u64).in_room(Some(9 * MIB as u64));
        assert!(r.announce(a.0, &a.1).is_empty());
        assert!(r.announce(b.0, &b.1).is_empty());
        // The first tensor's use ends: one of its slices fits the room
        // left beside the eight in use, and stays; the rest are released.
        let mut released = r.announce(c.0, &c.1);
        released.sort_unstable();
        assert_eq!(released, a.1[1..], "the first tensor's slices are released");
        let in_use = HashSet::from_iter(b.1.iter().chain(&c.1).copied());
        assert_eq!(r.in_memory(), (in_use, HashSet::from([a.1[0]])));
        // Its next announcement reads it again, as in use.
        r.announce(a.0, &a.1[..1]);
        assert!(r.in_memory().0.contains(&a.1[0]));
    }

    #[test]
    fn the_most_used_slice_stays_and_the_rest_stream_through() {
        let (t, e) = slices(0);
        // Room for two 1 MiB slices beside 2 MiB read whole: one in use,
        // one kept.
        let budget = RUNTIME_RESERVE + 4 * MIB as u64;
        let mut r = Residency::new(Some(budget), 6 * MIB as u64);
        assert!(r.exceeds_budget());
        // Expert 1 is used by every other token.
        assert!(r.announce(t, &[e[1]]).is_empty());
        // e1's use is over, and it stays.
        assert!(r.announce(t, &[e[2]]).is_empty());
        // e2 stays in its turn: as used as e1, and more recent.
        assert!(r.announce(t, &[e[1]]).is_empty());
        // e1, used twice, stays; e2 goes.
        assert_eq!(r.announce(t, &[e[3]]), [e[2]]);
        // e3's use is over and e1 keeps its place.
        assert_eq!(r.announce(t, &[e[2]]), [e[3]]);
        assert_eq!(
            r.in_memory(),
            (HashSet::from([e[2]]), HashSet::from([e[1]]))
        );
    }

    #[test]
    fn what_stays_fits_beside_what_is_in_use_and_the_rest_is_released() {
        // Two tensors of four experts, announced in turn, two experts at a
        // time; room for six slices. A page cache that reads what is
        // announced and drops what is released holds only the slices in
        // use and those kept, which never take more than the room.
        let tensors = [slices(0), slices(4)];
        let budget = RUNTIME_RESERVE + 6 * MIB as u64;
        let mut r = Residency::new(Some(budget), 8 * MIB as u64);
        let mut cached = HashSet::new();
        let mut seed = 7u64;
        for step in 0..500 {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let (t, e) = tensors[step % 2];
            let (a, b) = (e[(seed >> 33) as usize % 4], e[(seed >> 45) as usize % 4]);
            let named = if a == b { vec![a] } else { vec![a, b] };
            cached.extend(named.iter().copied());
            for gone in r.announce(t, &named) {
                assert!(
                    !named.contains(&gone),
                    "step {step}: released {gone:?} in use"
                );
                cached.remove(&gone);
            }
            let (in_use, kept) = r.in_memory();
            assert!(
                bytes(&in_use) + bytes(&kept) <= 6 * MIB as u64,
                "step {step}"
            );
            // What the plan holds is what is cached: a slice released is
            // not counted as staying until it is read again.
            let held: HashSet<Range> = in_use.union(&kept).copied().collect();
            assert_eq!(cached, held, "step {step}");
        }
    }

    #[test]
    fn what_stays_was_read_and_ranks_above_what_is_released() {
        // Three tensors of eight experts, of 1, 2 and 3 MiB slices, each
        // announced with one to three experts, in turn; room for 20 MiB of
        // slices beside 1 MiB read whole. A page cache reads what is
        // announced and drops what is released.
        let tensor = |at: usize, size: usize| {
            let slices: Vec<Range> = (0..8)
                .map(|i| ((at + i * size) * MIB, (at + (i + 1) * size) * MIB))
                .collect();
            ((at * MIB, (at + 8 * size) * MIB), slices)
        };
        let tensors = [tensor(1, 1), tensor(9, 2), tensor(25, 3)];
        let budget = RUNTIME_RESERVE + 21 * MIB as u64;
        let mut r = Residency::new(Some(budget), 49 * MIB as u64);
        let mut cached = HashSet::new();
        let mut seed = 11u64;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as usize % n
        };
        let mut released_any = false;
        for step in 0..2000 {
            let (t, slices) = &tensors[step % 3];
            // Skewed, so that some experts rank high and stay.
            let named: Vec<Range> = (0..1 + next(3))
                .map(|_| slices[next(8).min(next(8))])
                .collect();
            let (_, before) = r.in_memory();
            cached.extend(named.iter().copied());
            let released = r.announce(*t, &named);
            let (in_use, kept) = r.in_memory();
            for gone in &released {
                assert!(
                    !in_use.contains(gone) && !kept.contains(gone),
                    "step {step}"
                );
                cached.remove(gone);
                // What goes ranks below all that stays, or did not fit
                // beside it.
                let rank = r.slices[gone].rank(*gone);
                let worst = r.kept.last();
                assert!(
                    worst.is_none_or(|w| rank > *w) || r.kept_bytes + len(gone) > r.room(),
                    "step {step}: {gone:?} released"
                );
            }
            released_any |= !released.is_empty();
            assert!(bytes(&in_use) + bytes(&kept) <= 20 * MIB as u64);
            let held: HashSet<Range> = in_use.union(&kept).copied().collect();
            assert_eq!(cached, held, "step {step}");
            // What stayed and no longer does is let go.
            for lost in before.difference(&kept).filter(|s| !in_use.contains(s)) {
                assert!(released.contains(lost), "step {step}: {lost:?} kept");
            }
        }
        assert!(released_any);
    }

    #[test]
    fn a_guess_takes_only_the_room_nobody_holds() {
        let (t, e) = slices(0);
        let (u, f) = slices(4);
        // Room for six 1 MiB slices beside 8 MiB of expert tensors.
        let budget = RUNTIME_RESERVE + 6 * MIB as u64;
        let mut r = Residency::new(Some(budget), 8 * MIB as u64);
        r.announce(u, &[f[0]]);
        r.announce(t, &[e[0]]);
        r.announce(t, &[e[1]]);
        r.announce(t, &[e[2]]);
        // In use: e2, f0; kept: e0, e1; 2 MiB spare.
        assert_eq!(r.in_memory().1, HashSet::from([e[0], e[1]]));
        // A guess of f1, f2 and f3 reads the first two, and costs no slice
        // in use or kept its place.
        assert_eq!(r.guess(u, &[f[1], f[2], f[3]]), [f[1], f[2]]);
        assert_eq!(
            r.in_memory(),
            (HashSet::from([e[2], f[0]]), HashSet::from([e[0], e[1]]))
        );
        // The room is full: nothing more is read.
        assert!(r.guess(t, &[e[3]]).is_empty());
        // Slices in memory already are not read again.
        assert!(r.guess(t, &[e[2], e[0], e[1]]).is_empty());
        // The next announcement of u names f1: a hit, and f1 is in use; it
        // supersedes f2, a miss.
        r.announce(u, &[f[1]]);
        assert_eq!(r.guesses(), (1, 1));
        assert!(r.in_memory().0.contains(&f[1]));
    }

    #[test]
    fn what_was_guessed_and_not_announced_goes_first() {
        let (t, e) = slices(0);
        // 1 MiB read whole beside t: room for 3 MiB of slices.
        let budget = RUNTIME_RESERVE + 4 * MIB as u64;
        let mut r = Residency::new(Some(budget), 5 * MIB as u64);
        r.announce(t, &[e[0]]);
        assert_eq!(r.guess(t, &[e[1]]), [e[1]]);
        // The tensor's next announcement supersedes the guess. There is
        // room for e1 beside e0 (its use over), and so it stays, ranked
        // last: the next that needs room takes its place first.
        assert!(r.announce(t, &[e[2]]).is_empty());
        assert_eq!(r.guesses(), (0, 1));
        assert_eq!(r.in_memory().1, HashSet::from([e[0], e[1]]));
        assert_eq!(r.announce(t, &[e[3]]), [e[1]]);
        assert_eq!(r.in_memory().1, HashSet::from([e[0], e[2]]));
        // Guesses that the slices in use then need the room of go first,
        // the oldest first. Room for 5 MiB of slices.
        let (u, f) = slices(4);
        let budget = RUNTIME_RESERVE + 5 * MIB as u64;
        let mut r = Residency::new(Some(budget), 8 * MIB as u64);
        r.announce(u, &[f[0]]);
        assert_eq!(r.guess(t, &[e[0]]), [e[0]]);
        assert_eq!(r.guess(t, &[e[1]]), [e[1]]);
        let released = r.announce(u, &f);
        assert_eq!(released, [e[0]]);
        assert_eq!(r.announce(t, &[e[2]]), [e[1]]);
        assert_eq!(r.guesses(), (0, 2));
    }

    #[test]
    fn guesses_never_hold_more_than_the_room() {
        // As the test above with announcements, with guesses of the next
        // tensor's slices between them, right half the time. Announcements
        // name experts 0 to 2 of each tensor, which the room holds with
        // 1 MiB to spare.
        let tensors = [slices(0), slices(4)];
        let budget = RUNTIME_RESERVE + 7 * MIB as u64;
        let mut r = Residency::new(Some(budget), 8 * MIB as u64);
        let mut cached = HashSet::new();
        let mut seed = 5u64;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as usize % n
        };
        for step in 0..2000 {
            let (t, e) = tensors[step % 2];
            let named = vec![e[next(3)]];
            let guess = if next(2) == 0 {
                named.clone()
            } else {
                vec![e[next(4)]]
            };
            let (_, kept_before) = r.in_memory();
            cached.extend(r.guess(t, &guess));
            // A guess costs no kept slice its place.
            assert_eq!(r.in_memory().1, kept_before, "step {step}");
            cached.extend(named.iter().copied());
            for gone in r.announce(t, &named) {
                assert!(
                    !named.contains(&gone),
                    "step {step}: released {gone:?} in use"
                );
                cached.remove(&gone);
            }
            let (in_use, kept) = r.in_memory();
            let guessed: HashSet<Range> = r.guessed.keys().copied().collect();
            let held: HashSet<Range> = in_use.union(&kept).chain(&guessed).copied().collect();
            assert!(bytes(&held) <= 7 * MIB as u64, "step {step}");
            assert!(cached.is_subset(&held), "step {step}: {cached:?} {held:?}");
        }
        // Guesses were read (while the room had spare bytes) and settled.
        let (hits, misses) = r.guesses();
        assert!(hits + misses > 0, "{hits} {misses}");
    }

    #[test]
    fn a_budget_below_the_tensors_read_whole_keeps_no_expert() {
        let (t, e) = slices(0);
        let mut r = Residency::new(Some(RUNTIME_RESERVE), 64 * MIB as u64);
        r.announce(t, &[e[0]]);
        assert_eq!(r.announce(t, &[e[1]]), [e[0]]);
        assert!(r.in_memory().1.is_empty());
    }
}
