//! How much of a range of this process's memory is mapped, and how much
//! of that in huge pages,
//! from `/proc/self/smaps` (Linux and Android): `FilePmdMapped` for a file
//! mapping (page-cache folios of PMD size mapped with one entry each),
//! `AnonHugePages` for anonymous memory (transparent huge pages).
//!
//! No privilege is needed, where folio sizes themselves (`/proc/kpageflags`)
//! need root; and what decode pays for is the mapping, not the folio: a
//! 2 MiB folio mapped by 512 page-table entries still costs a TLB entry a
//! page. Reading the file walks every page table of the process (about a
//! millisecond for a few hundred MiB mapped in base pages), so it is done
//! when asked, never on the load's path.

use std::io;

/// What `/proc/self/smaps` says of a range of this process's memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PageSizes {
    /// Bytes mapped (`Rss`): resident and in this process's page tables.
    pub(crate) resident: u64,
    /// Of those, bytes mapped in huge pages (`FilePmdMapped` for a file,
    /// `AnonHugePages` for anonymous memory).
    pub(crate) huge: u64,
}

/// For each `[start, end)` of `ranges` (addresses in this process), its
/// [`PageSizes`]: the figures of each mapping (VMA) that overlaps it, in
/// proportion to the overlap.
///
/// # Errors
/// Reading `/proc/self/smaps`; `Unsupported` where there is none (every
/// platform but Linux and Android: Windows and macOS map no file in huge
/// pages).
pub(crate) fn page_sizes(ranges: &[(usize, usize)]) -> io::Result<Vec<PageSizes>> {
    let text = super::sys::read_smaps()?;
    Ok(page_sizes_in(&text, ranges))
}

/// [`page_sizes`] over the text of an smaps file.
fn page_sizes_in(smaps: &str, ranges: &[(usize, usize)]) -> Vec<PageSizes> {
    let mut out = vec![PageSizes::default(); ranges.len()];
    let mut vma: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        if let Some(v) = vma_header(line) {
            vma = Some(v);
            continue;
        }
        let Some((vs, ve)) = vma else { continue };
        let Some((field, kb)) = line.split_once(':').and_then(|(k, rest)| {
            let n = rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
            Some((k, n))
        }) else {
            continue;
        };
        let huge = match field {
            "Rss" => false,
            "FilePmdMapped" | "AnonHugePages" => true,
            _ => continue,
        };
        if kb == 0 || ve <= vs {
            continue;
        }
        let bytes = u128::from(kb) * 1024;
        for (o, &(s, e)) in out.iter_mut().zip(ranges) {
            let overlap = e.min(ve).saturating_sub(s.max(vs));
            if overlap > 0 {
                let share = (bytes * overlap as u128 / (ve - vs) as u128) as u64;
                if huge {
                    o.huge += share;
                } else {
                    o.resident += share;
                }
            }
        }
    }
    out
}

/// The address range of a VMA's first line (`start-end perms offset dev
/// inode [path]`), or `None` for a field line (`Name:   value kB`).
fn vma_header(line: &str) -> Option<(usize, usize)> {
    let range = line.split_ascii_whitespace().next()?;
    let (s, e) = range.split_once('-')?;
    let s = usize::from_str_radix(s, 16).ok()?;
    let e = usize::from_str_radix(e, 16).ok()?;
    Some((s, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0000400000 r--p 00000000 fe:00 123 /models/a.gguf
Size:               4096 kB
Rss:                4096 kB
AnonHugePages:         0 kB
FilePmdMapped:      4096 kB
7f0000400000-7f0000600000 r--p 00400000 fe:00 123 /models/a.gguf
Size:               2048 kB
Rss:                1024 kB
FilePmdMapped:         0 kB
7f1000000000-7f1000800000 rw-p 00000000 00:00 0
Size:               8192 kB
Rss:                8192 kB
AnonHugePages:      6144 kB
FilePmdMapped:         0 kB
";

    #[test]
    fn counts_each_vma_s_pages_in_proportion_to_the_overlap() {
        let r = page_sizes_in(
            SMAPS,
            &[
                // The whole file mapping: 4 MiB of its 5 resident in huge pages.
                (0x7f00_0000_0000, 0x7f00_0060_0000),
                // Half of the first VMA.
                (0x7f00_0000_0000, 0x7f00_0020_0000),
                // The anonymous buffer.
                (0x7f10_0000_0000, 0x7f10_0080_0000),
                // Nothing there.
                (0x1000, 0x2000),
            ],
        );
        let p = |resident: u64, huge: u64| PageSizes { resident, huge };
        assert_eq!(
            r,
            vec![
                p(5 << 20, 4 << 20),
                p(2 << 20, 2 << 20),
                p(8 << 20, 6 << 20),
                p(0, 0)
            ]
        );
    }

    #[test]
    fn a_field_line_is_not_a_vma() {
        assert_eq!(vma_header("Size:               4096 kB"), None);
        assert_eq!(vma_header("VmFlags: rd mr mw me"), None);
        assert_eq!(
            vma_header("00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/dbus"),
            Some((0x40_0000, 0x45_2000))
        );
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn an_anonymous_buffer_advised_huge_pages_is_counted_where_thp_allows() {
        let huge = crate::os::huge_page();
        // Three huge pages, so that two whole aligned ones lie inside.
        let mut v = vec![0u8; 3 * huge];
        let start = (v.as_ptr() as usize).next_multiple_of(huge);
        let off = start - v.as_ptr() as usize;
        crate::os::advise_huge_pages(&mut v[off..off + 2 * huge]);
        v[off..off + 2 * huge].fill(1);
        let r = page_sizes(&[(start, start + 2 * huge)]).unwrap()[0];
        let thp = crate::os::transparent_huge_pages();
        if !crate::os::page_advice_is_observable("anonymous huge pages") {
            return;
        }
        // Every byte was written, so every page is mapped.
        assert_eq!(r.resident, 2 * huge as u64, "{r:?}");
        if !thp.for_advised_memory() {
            println!("no transparent huge pages here: {thp:?}");
            assert_eq!(r.huge, 0);
        } else {
            // Whole huge pages, within the range; one may be refused when
            // memory is too fragmented to compact, both hardly.
            assert!(
                r.huge % huge as u64 == 0 && r.huge >= huge as u64,
                "{r:?} ({thp:?})"
            );
        }
    }
}
