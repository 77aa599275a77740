//! Where an owned CPU buffer should come from: the global allocator
//! (`alloc_zeroed` with the buffer's aligned `Layout`) or an anonymous
//! mapping. Times alloc + fill every byte + drop, per buffer, for sizes from
//! 256 B to 4 MiB, the way `to_owned_tensor` uses a buffer: written whole
//! once, with 16 alive at a time (a runtime keeps the copies it makes). Prints a table; the smallest size at which the
//! mapping is no slower is `CpuBuffer`'s threshold (src/buffer/cpu.rs).
//!
//! Run: `cargo bench --bench cpu_buffer`

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::hint::black_box;
use std::time::{Duration, Instant};

use memmap2::MmapOptions;

const ALIGN: usize = 32;

/// Buffers alive at once: a runtime copies several tensors and keeps them,
/// so a freed block is not simply handed back for the next one.
const HELD: usize = 16;

fn heap(size: usize) {
    let layout = Layout::from_size_align(size, ALIGN).unwrap();
    let mut held = [std::ptr::null_mut::<u8>(); HELD];
    for p in &mut held {
        // SAFETY: `layout` has a nonzero size; the block is checked non-null,
        // written within its size, and freed below with the same layout.
        unsafe {
            *p = alloc_zeroed(layout);
            assert!(!p.is_null());
            std::ptr::write_bytes(*p, 1, size);
        }
    }
    black_box(&held);
    for p in held {
        // SAFETY: allocated above with `layout`, freed once.
        unsafe { dealloc(p, layout) };
    }
}

fn map(size: usize) {
    let held: Vec<_> = (0..HELD)
        .map(|_| {
            let mut m = MmapOptions::new().len(size).map_anon().unwrap();
            m.fill(1);
            m
        })
        .collect();
    black_box(&held);
}

/// Median time of one call, over 7 rounds of enough calls to take ~20 ms.
fn time(f: impl Fn(usize), size: usize) -> Duration {
    let t = Instant::now();
    f(size);
    let one = t.elapsed().max(Duration::from_nanos(50));
    let n = (Duration::from_millis(20).as_nanos() / one.as_nanos()).clamp(1, 1_000_000) as u32;
    let mut rounds: Vec<Duration> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f(size);
            }
            t.elapsed() / (n * HELD as u32)
        })
        .collect();
    rounds.sort();
    rounds[3]
}

fn main() {
    println!(
        "{:>9} {:>12} {:>12} {:>7}",
        "size", "heap", "mmap", "mmap/heap"
    );
    let mut size = 256;
    while size <= 4 << 20 {
        let h = time(heap, size);
        let m = time(map, size);
        println!(
            "{:>9} {:>10.2?} {:>10.2?} {:>7.2}",
            size,
            h,
            m,
            m.as_secs_f64() / h.as_secs_f64()
        );
        size *= 2;
    }
}
