//! What stays resident when the weights exceed the memory budget, decided
//! from what the runtime announces ([`Residency`]): every tensor read whole
//! (norms, attention, routers, shared experts) stays, and so do the expert
//! slices the announcements show are used most, as many as the budget
//! holds after the rest; every other expert slice streams through: it is
//! read ahead when announced and released once the next announcement of
//! its tensor shows its use is over, so that the kernel's reclaim, which
//! sees only recency, never has to choose between it and the resident set.
//!
//! Where the weights fit, every slice is resident and nothing is released.

use std::collections::HashMap;

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
    /// return the slices whose use is over and that do not stay resident:
    /// those its previous announcement named and this one does not.
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
        self.choose_resident();
        let t = &self.experts[&tensor];
        done.into_iter()
            .filter(|r| t.slices.get(r).is_some_and(|s| !s.resident))
            .collect()
    }

    /// The slices used most (the most recent first among equals), as many
    /// as the capacity holds.
    fn choose_resident(&mut self) {
        let capacity = self.capacity();
        let mut all: Vec<(&Range, &mut Slice)> = self
            .experts
            .values_mut()
            .flat_map(|t| t.slices.iter_mut())
            .collect();
        all.sort_unstable_by_key(|(_, s)| (std::cmp::Reverse(s.uses), std::cmp::Reverse(s.last)));
        let mut held = 0u64;
        for (r, s) in all {
            let len = (r.1 - r.0) as u64;
            s.resident = held + len <= capacity;
            if s.resident {
                held += len;
            }
        }
    }

    /// Bytes of the expert slices chosen to stay resident, and of those
    /// that stream through. (For the report that is still to come, issue
    /// 46; its tests read it now.)
    #[cfg(test)]
    fn split(&self) -> (u64, u64) {
        let slices = self.experts.values().flat_map(|t| t.slices.iter());
        slices.fold((0, 0), |(res, streams), (r, s)| {
            let len = (r.1 - r.0) as u64;
            match s.resident {
                true => (res + len, streams),
                false => (res, streams + len),
            }
        })
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

    #[test]
    fn where_the_weights_fit_nothing_is_released() {
        let (t, e) = slices(0);
        let mut r = Residency::new(Some(1 << 40), 4 * MIB as u64);
        assert!(!r.exceeds_budget());
        assert!(r.announce(t, &[e[0], e[1]]).is_empty());
        assert!(r.announce(t, &[e[2], e[3]]).is_empty());
        assert_eq!(r.split(), (4 * MIB as u64, 0));
        let mut unknown = Residency::new(None, 4 * MIB as u64);
        unknown.announce(t, &[e[0]]);
        assert!(unknown.announce(t, &[e[1]]).is_empty());
    }

    #[test]
    fn the_most_used_slices_stay_and_the_rest_stream_through() {
        let (t, e) = slices(0);
        // Room for two 1 MiB slices beside 2 MiB read whole.
        let budget = RUNTIME_RESERVE + 4 * MIB as u64;
        let mut r = Residency::new(Some(budget), 6 * MIB as u64);
        assert!(r.exceeds_budget());
        // Expert 0 is used by every token; 1, 2, 3 in turn.
        assert!(r.announce(t, &[e[0], e[1]]).is_empty());
        // e1's use is over; e0 (2 uses) and e2 (as used, and more recent)
        // stay.
        assert_eq!(r.announce(t, &[e[0], e[2]]), [e[1]]);
        // e2's use is over; e0 (3 uses) and e3 (the most recent) stay.
        assert_eq!(r.announce(t, &[e[0], e[3]]), [e[2]]);
        assert_eq!(r.announce(t, &[e[0], e[1]]), [e[3]]);
        assert_eq!(r.split(), (2 * MIB as u64, 2 * MIB as u64));
    }

    #[test]
    fn a_budget_below_the_tensors_read_whole_keeps_no_expert() {
        let (t, e) = slices(0);
        let mut r = Residency::new(Some(RUNTIME_RESERVE), 64 * MIB as u64);
        r.announce(t, &[e[0]]);
        assert_eq!(r.announce(t, &[e[1]]), [e[0]]);
        assert_eq!(r.split(), (0, 2 * MIB as u64));
    }
}
