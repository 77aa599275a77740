//! Touching bytes the way a first forward pass does: every byte read once,
//! in order, so that every page of a mapping is faulted in.

/// Read every byte of `bytes` once (as little-endian words where aligned)
/// and return a wrapping sum, so the reads cannot be optimised away.
pub fn touch(bytes: &[u8]) -> u64 {
    let (head, words, tail) = bytemuck::pod_align_to::<u8, u64>(bytes);
    let mut acc = head.iter().fold(0u64, |a, &b| a.wrapping_add(u64::from(b)));
    // Four independent sums vectorise; one would serialise on the adds.
    let mut lanes = [0u64; 4];
    let mut chunks = words.chunks_exact(4);
    for c in &mut chunks {
        for (l, w) in lanes.iter_mut().zip(c) {
            *l = l.wrapping_add(*w);
        }
    }
    for w in chunks.remainder() {
        acc = acc.wrapping_add(*w);
    }
    for l in lanes {
        acc = acc.wrapping_add(l);
    }
    let acc = tail.iter().fold(acc, |a, &b| a.wrapping_add(u64::from(b)));
    std::hint::black_box(acc)
}

#[cfg(test)]
mod tests {
    use super::touch;

    #[test]
    fn sums_every_byte_whatever_the_alignment() {
        let v: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        for start in 0..9 {
            let s = &v[start..];
            // A naive oracle: the same split, summed in one sequential fold.
            let (h, w, t) = bytemuck::pod_align_to::<u8, u64>(s);
            let bytes = |b: &[u8]| b.iter().map(|&x| u64::from(x)).sum::<u64>();
            let expect = w
                .iter()
                .fold(bytes(h).wrapping_add(bytes(t)), |a, x| a.wrapping_add(*x));
            assert_eq!(touch(s), expect);
        }
        assert_eq!(touch(&[]), 0);
    }
}
