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

use std::collections::{HashMap, HashSet};

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

#[derive(Debug, Default)]
struct Slice {
    /// How many announcements named it.
    uses: u64,
    /// The announcement that last named it (a tick).
    last: u64,
    resident: bool,
}

#[derive(Debug, Default)]
struct ExpertTensor {
    slices: HashMap<Range, Slice>,
    /// The slices its last announcement named.
    last: Vec<Range>,
}

/// The resident set of one mapping's expert slices, from its
/// announcements; the caller releases what [`Residency::announce`] returns.
#[derive(Debug)]
pub(crate) struct Residency {
    /// The memory budget (`None`: unknown, and everything stays).
    budget: Option<u64>,
    /// Bytes of the mapping's tensors that stay mapped.
    mapped: u64,
    /// The tensors announced by their experts, by range.
    experts: HashMap<Range, ExpertTensor>,
    /// Their bytes, which `mapped` holds too.
    expert_bytes: u64,
    tick: u64,
}

impl Residency {
    /// For a mapping whose mapped tensors hold `mapped` bytes, under
    /// `budget`.
    pub(crate) fn new(budget: Option<u64>, mapped: u64) -> Residency {
        Residency {
            budget,
            mapped,
            experts: HashMap::new(),
            expert_bytes: 0,
            tick: 0,
        }
    }

    /// Whether the weights exceed what the budget holds beside the
    /// runtime's reserve: only then is anything streamed or released.
    pub(crate) fn exceeds_budget(&self) -> bool {
        exceeds_budget(self.budget, self.mapped)
    }

    /// The bytes of expert slices that may stay resident: the budget less
    /// the runtime's reserve and every tensor read whole.
    fn capacity(&self) -> u64 {
        expert_capacity(self.budget, self.mapped.saturating_sub(self.expert_bytes))
    }

    /// Note that `slices` of the expert tensor `tensor` are read next, and
    /// return the slices to release: those whose use is over (the tensor's
    /// previous announcement named them and this one does not) and that do
    /// not stay resident, and those that stayed and no longer do.
    pub(crate) fn announce(&mut self, tensor: Range, slices: &[Range]) -> Vec<Range> {
        self.tick += 1;
        let tick = self.tick;
        let t = self.experts.entry(tensor).or_insert_with(|| {
            self.expert_bytes += (tensor.1 - tensor.0) as u64;
            ExpertTensor::default()
        });
        for &r in slices {
            let s = t.slices.entry(r).or_default();
            s.uses += 1;
            s.last = tick;
        }
        let done: Vec<Range> = t.last.drain(..).filter(|r| !slices.contains(r)).collect();
        t.last = slices.to_vec();
        let mut release = self.choose_resident();
        let t = &self.experts[&tensor];
        for r in done {
            if !t.slices[&r].resident && !release.contains(&r) {
                release.push(r);
            }
        }
        release
    }

    /// Choose the slices that stay once their use is over: those used most
    /// (the most recent first among equals), as many as the capacity holds
    /// beside the slices in use (every tensor's last announcement's), which
    /// are in memory whatever is chosen. Returns the slices that stayed and
    /// no longer do.
    fn choose_resident(&mut self) -> Vec<Range> {
        let in_use: HashSet<Range> = self
            .experts
            .values()
            .flat_map(|t| t.last.iter().copied())
            .collect();
        let in_use_bytes: u64 = in_use.iter().map(|r| (r.1 - r.0) as u64).sum();
        let capacity = self.capacity().saturating_sub(in_use_bytes);
        let mut rest: Vec<(&Range, &mut Slice)> = self
            .experts
            .values_mut()
            .flat_map(|t| t.slices.iter_mut())
            .filter(|(r, _)| !in_use.contains(r))
            .collect();
        rest.sort_unstable_by_key(|(_, s)| (std::cmp::Reverse(s.uses), std::cmp::Reverse(s.last)));
        let (mut held, mut demoted) = (0u64, Vec::new());
        for (r, s) in rest {
            let len = (r.1 - r.0) as u64;
            let stayed = s.resident;
            s.resident = held + len <= capacity;
            if s.resident {
                held += len;
            } else if stayed {
                demoted.push(*r);
            }
        }
        demoted
    }

    /// The slices in use (every tensor's last announcement's), and those
    /// chosen to stay beside them.
    #[cfg(test)]
    fn in_memory(&self) -> (HashSet<Range>, HashSet<Range>) {
        let in_use: HashSet<Range> = self.experts.values().flat_map(|t| t.last.clone()).collect();
        let kept = self.experts.values().flat_map(|t| t.slices.iter());
        let kept = kept.filter(|(r, s)| s.resident && !in_use.contains(r));
        let kept = kept.map(|(r, _)| *r).collect();
        (in_use, kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            // (A slice chosen to stay after it was released is read again
            // when it is next announced: kept, but not yet cached.)
            let held: HashSet<Range> = in_use.union(&kept).copied().collect();
            assert!(cached.is_subset(&held), "step {step}: {cached:?} {held:?}");
        }
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
