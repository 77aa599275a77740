//! The one counting allocator of the test suite and the benchmarks.
//!
//! [`Counting`] wraps `System` and, while [`measure`] runs a closure, adds up
//! what the current thread allocates: bytes and allocations (a realloc counts
//! its whole new size, as if fresh), and the live balance with its peak
//! (allocations minus frees, so frees of older memory make it negative).
//! Other threads are not counted. A binary that uses it declares it:
//!
//! ```ignore
//! #[path = "common/counting_alloc.rs"]
//! mod counting_alloc;
//! #[global_allocator]
//! static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;
//! ```
//!
//! It sees heap allocations only: anonymous and file mappings do not go
//! through the allocator.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The allocator: `System`, counted.
pub struct Counting;

/// What a thread allocated while [`measure`] ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Bytes allocated (a realloc counts its new size).
    pub bytes: u64,
    /// Number of allocations (reallocs included).
    pub count: u64,
    /// Bytes allocated minus bytes freed at the end.
    pub live: i64,
    /// The highest `live` reached.
    pub peak: i64,
}

/// Per-thread counter state. All `Cell`s of `Copy` types with `const`
/// initialisers: reading or writing them never allocates and registers no
/// destructor, so the allocator can use them without recursing into itself.
struct Counter {
    /// Counting is on for this thread.
    on: Cell<bool>,
    /// Inside `record` (guards against reentrancy, should anything in it allocate).
    busy: Cell<bool>,
    counts: Cell<Counts>,
}

thread_local! {
    static COUNTER: Counter = const {
        Counter {
            on: Cell::new(false),
            busy: Cell::new(false),
            counts: Cell::new(Counts { bytes: 0, count: 0, live: 0, peak: 0 }),
        }
    };
}

/// Count `allocated` new bytes (0 for a free) and a live change of `delta`.
fn record(allocated: usize, delta: i64) {
    // try_with: during thread teardown the slot may be gone; then do nothing.
    let _ = COUNTER.try_with(|c| {
        if c.on.get() && !c.busy.replace(true) {
            let mut n = c.counts.get();
            if allocated > 0 {
                n.bytes = n.bytes.saturating_add(allocated as u64);
                n.count += 1;
            }
            n.live = n.live.saturating_add(delta);
            n.peak = n.peak.max(n.live);
            c.counts.set(n);
            c.busy.set(false);
        }
    });
}

fn signed(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; `record` only touches thread-local `Cell`s and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size(), signed(layout.size()));
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size(), signed(layout.size()));
        // SAFETY: forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Conservative: the whole new size, as if freshly allocated.
        record(new_size, signed(new_size) - signed(layout.size()));
        // SAFETY: forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        record(0, -signed(layout.size()));
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Run `f` with this thread's counter on: its result and what it allocated
/// on this thread.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Counts) {
    COUNTER.with(|c| {
        c.counts.set(Counts::default());
        c.on.set(true);
    });
    let r = f();
    let counts = COUNTER.with(|c| {
        c.on.set(false);
        c.counts.get()
    });
    (r, counts)
}
