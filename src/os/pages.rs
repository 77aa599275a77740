//! Rounding to pages, with the page size as an argument: kernels run with
//! 4, 16 and 64 KiB pages (Android 15+ devices with 16 KiB, ARM servers with
//! 64 KiB), and a range rounded to the wrong size is refused (`EINVAL`) or
//! touches a neighbour's pages (ARCHITECTURE.md, "Platforms": nntrainer
//! #4171, velox #18617, pytorch #145610). The callers pass the running
//! system's [`page_size`](super::page_size) and
//! [`map_granularity`](super::map_granularity); the tests pass each size.

use std::io;

/// Where a map of `[offset, offset + len)` of a file starts and how long it
/// is, for a system that maps from multiples of `granularity` (the page
/// size, or Windows' 64 KiB allocation granularity): the map starts at the
/// multiple at or below `offset`, and the view `delta` bytes into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MapWindow {
    /// The file offset the map starts at.
    pub start: u64,
    /// Where the view starts in the map.
    pub delta: usize,
    /// The map's length: `delta` plus the view's.
    pub total: usize,
}

impl MapWindow {
    /// The window for `[offset, offset + len)`.
    ///
    /// # Errors
    /// `InvalidInput` for a range whose length does not fit in `usize`.
    pub(crate) fn of(offset: u64, len: u64, granularity: usize) -> io::Result<MapWindow> {
        let invalid = || io::Error::from(io::ErrorKind::InvalidInput);
        let g = granularity as u64;
        let start = offset / g * g;
        // Less than `granularity`, so it fits in usize.
        let delta = (offset - start) as usize;
        let total = usize::try_from(len)
            .ok()
            .and_then(|l| l.checked_add(delta))
            .ok_or_else(invalid)?;
        Ok(MapWindow {
            start,
            delta,
            total,
        })
    }
}

/// A view of `len` bytes that starts `delta` bytes into its map, for
/// rounding view offsets to the map's pages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    pub delta: usize,
    pub len: usize,
    pub page: usize,
}

impl View {
    /// `[start, end)` (view offsets) clamped to the view, its start rounded
    /// down to a page (advice needs a page-aligned address; the length may
    /// be anything): as (offset into the map, length).
    pub(crate) fn outward(self, start: usize, end: usize) -> (usize, usize) {
        let end = end.min(self.len) + self.delta;
        let start = (start.min(self.len) + self.delta).min(end) / self.page * self.page;
        (start, end - start)
    }

    /// `[start, end)` rounded inward to whole pages and clamped to the view,
    /// as offsets into the map: the pages that hold nothing but bytes of
    /// the range, so that advice or a release on them cannot affect a
    /// neighbour. The view's last page ends the map: a partial last page
    /// holds no neighbour's bytes, so it belongs to the range.
    pub(crate) fn inward(self, start: usize, end: usize) -> (usize, usize) {
        let end_v = end.min(self.len);
        let start = (start.min(end_v) + self.delta).next_multiple_of(self.page);
        let end = if end_v == self.len {
            end_v + self.delta
        } else {
            (end_v + self.delta) / self.page * self.page
        };
        (start, end.saturating_sub(start))
    }
}

/// The whole pages inside `[addr, addr + len)`, as (start, end), or `None`
/// when there is no whole page.
pub(crate) fn whole_pages(addr: usize, len: usize, page: usize) -> Option<(usize, usize)> {
    let start = addr.checked_next_multiple_of(page)?;
    let end = addr.saturating_add(len) / page * page;
    (end > start).then_some((start, end))
}

/// The size of a PMD-level (transparent) huge page with base pages of
/// `page` bytes: one page table's reach, a page of 8-byte entries. 2 MiB
/// with 4 KiB pages, 32 MiB with 16 KiB, 512 MiB with 64 KiB (arm64).
pub(crate) fn huge_page_size(page: usize) -> usize {
    page.saturating_mul(page / 8)
}

/// The first page of each of `windows` windows of `each` pages spread
/// evenly over `pages` pages, the first at the start and the last ending at
/// the last page; `None` when the windows would cover every page (count
/// them all instead).
pub(crate) fn sample_starts(pages: usize, windows: usize, each: usize) -> Option<Vec<usize>> {
    if windows < 2 || pages <= windows.saturating_mul(each) {
        return None;
    }
    let span = pages - each;
    Some((0..windows).map(|i| i * span / (windows - 1)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: [usize; 3] = [4 << 10, 16 << 10, 64 << 10];

    #[test]
    fn a_map_window_starts_at_the_granule_below_the_offset() {
        for g in SIZES.into_iter().chain([64 << 10]) {
            let w = MapWindow::of(3 * g as u64 + 100, 1000, g).unwrap();
            assert_eq!(w.start, 3 * g as u64);
            assert_eq!((w.delta, w.total), (100, 1100));
            let w = MapWindow::of(5 * g as u64, 7, g).unwrap();
            assert_eq!((w.start, w.delta, w.total), (5 * g as u64, 0, 7));
            // Offsets 16 KiB-aligned but not 64 KiB-aligned still map from
            // the 64 KiB below (pytorch #145610).
            let w = MapWindow::of(16 << 10, 1, 64 << 10).unwrap();
            assert_eq!((w.start, w.delta), (0, 16 << 10));
        }
        assert!(MapWindow::of(1, u64::MAX, 4096).is_err());
    }

    #[test]
    fn outward_rounds_the_start_down_to_each_page_size() {
        for page in SIZES {
            let v = View {
                delta: 100,
                len: 10 * page,
                page,
            };
            // View offset page+10 is map offset page+110: its page starts at
            // `page`.
            assert_eq!(v.outward(page + 10, 2 * page), (page, page + 100));
            // Clamped to the view.
            assert_eq!(v.outward(0, usize::MAX), (0, 10 * page + 100));
            // An empty range at the end: at most the partial last page.
            assert!(v.outward(usize::MAX, usize::MAX).1 < page);
            let (off, _) = v.outward(3 * page - 1, 4 * page);
            assert_eq!(off % page, 0);
        }
    }

    #[test]
    fn inward_keeps_only_whole_pages_of_the_range() {
        for page in SIZES {
            let v = View {
                delta: 0,
                len: 10 * page + 5,
                page,
            };
            assert_eq!(v.inward(1, 3 * page + 1), (page, 2 * page));
            assert_eq!(v.inward(page / 2, page), (page, 0));
            // The view's partial last page belongs to a range ending there.
            assert_eq!(v.inward(9 * page, usize::MAX), (9 * page, page + 5));
            let v = View {
                delta: page / 4,
                len: 4 * page,
                page,
            };
            // View offset 3/4 page is map offset 1 page.
            assert_eq!(v.inward(page * 3 / 4, page * 7 / 4), (page, page));
        }
    }

    #[test]
    fn whole_pages_are_inside_the_range() {
        for page in SIZES {
            assert_eq!(
                whole_pages(page + 1, 3 * page, page),
                Some((2 * page, 4 * page))
            );
            assert_eq!(whole_pages(page + 1, page, page), None);
            assert_eq!(whole_pages(0, page, page), Some((0, page)));
            assert_eq!(whole_pages(usize::MAX - 3, 100, page), None);
        }
    }

    #[test]
    fn huge_pages_follow_the_base_page() {
        assert_eq!(huge_page_size(4 << 10), 2 << 20);
        assert_eq!(huge_page_size(16 << 10), 32 << 20);
        assert_eq!(huge_page_size(64 << 10), 512 << 20);
    }

    #[test]
    fn samples_spread_from_the_first_page_to_the_last() {
        let s = sample_starts(10_000, 64, 16).unwrap();
        assert_eq!((s[0], s[63] + 16), (0, 10_000));
        assert!(s.windows(2).all(|w| w[1] - w[0] >= 16));
        assert_eq!(sample_starts(64 * 16, 64, 16), None);
    }
}
