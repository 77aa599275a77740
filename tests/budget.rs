//! The memory budget: what a load may still use (injected here with
//! `LoadOptions::budget`; read from MemAvailable and the memory cgroup
//! otherwise, which `src/os/budget.rs` tests on fake /proc and /sys trees).
//! Copies and locks over it are refused with a typed error before anything
//! is allocated; a mapped load copies nothing, so it goes ahead, and its
//! read-ahead then follows the first pass within a window of the budget.
//!
//! Errors, report fields and tensor bytes are checked everywhere; what is
//! in the page cache, where the probe in `tests/common` finds it observable
//! (not under qemu-user, which ignores read-ahead advice, nor on Windows or
//! macOS, which cannot drop a file's pages), and the test prints that it
//! skips those assertions elsewhere.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weightmap::gguf::Writer;
use weightmap::{
    AccessAdvice, AdvicePolicy, Error, ErrorKind, LoadMode, LoadOptions, PrefetchDecision,
    TensorType, Weights,
};

const MIB: usize = 1 << 20;

/// A GGUF of `n` I8 tensors of `mib` MiB each, written to `dir`.
fn model(dir: &Path, n: usize, mib: usize) -> PathBuf {
    let mut w = Writer::new(32);
    for i in 0..n {
        w.tensor(
            &format!("t{i}"),
            TensorType::I8,
            &[(mib * MIB) as u64],
            vec![i as u8; mib * MIB],
        );
    }
    let path = dir.join("m.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

/// A GGUF whose second tensor sits at an odd offset (alignment 1), so the
/// mapped path copies it.
fn misaligned(dir: &Path) -> PathBuf {
    let mut w = Writer::new(1);
    w.tensor("byte", TensorType::I8, &[1], vec![1]);
    w.tensor("floats", TensorType::F32, &[1024], vec![0; 4096]);
    let path = dir.join("odd.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

fn load(path: &Path, opts: &LoadOptions) -> weightmap::Result<Weights> {
    // SAFETY: the test files are private to each test and never modified.
    unsafe { Weights::load(path, opts) }
}

/// Options under which a region too large for the budget is read ahead of
/// the first pass (the windowed read-ahead): advice chosen for the whole
/// region, which a load keeps as it is, with no huge pages.
fn windowed() -> LoadOptions {
    LoadOptions::default().advice(AdvicePolicy::Uniform(AccessAdvice::Normal))
}

/// Whether the windowed read-ahead can run here: it tells where the first
/// pass has got to from `/proc/self/pagemap` (Linux and Android; not on
/// Windows, where Wine would find the Unix file on its `Z:` drive).
fn has_page_map() -> bool {
    cfg!(unix) && std::fs::File::open("/proc/self/pagemap").is_ok()
}

/// Where there is no page map, a load that would follow the first pass
/// reports that it did not start the read-ahead, and why.
fn assert_no_page_map(d: &PrefetchDecision) {
    assert!(
        matches!(d, PrefetchDecision::Skipped(weightmap::SkipReason::Spawn { error, .. })
            if error.contains("no page map")),
        "expected the windowed read-ahead skipped for want of a page map, got {d}"
    );
}

fn over_budget(e: &Error) -> (&'static str, u64, u64, &str) {
    match e {
        Error::OverBudget {
            what,
            needed,
            budget,
            budget_source,
        } => (what, *needed, *budget, budget_source),
        other => panic!("expected OverBudget, got {other:?}"),
    }
}

#[test]
fn a_stream_load_over_the_budget_is_refused_with_the_bytes_and_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 2, 1);
    let e = Weights::load_streamed(&path, &LoadOptions::default().budget(MIB as u64)).unwrap_err();
    let (what, needed, budget, source) = over_budget(&e);
    assert_eq!(what, "the stream path's copy of the tensors");
    assert!(needed >= 2 * MIB as u64, "{needed}");
    assert_eq!((budget, source), (MIB as u64, "LoadOptions::budget"));
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert_eq!(e.name(), "over_budget");
    assert!(e.to_string().contains("over the memory budget"), "{e}");
}

#[test]
fn ignore_budget_goes_ahead_and_the_report_says_what_the_budget_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 2, 1);
    let opts = LoadOptions::default().budget(1000).ignore_budget(true);
    let w = Weights::load_streamed(&path, &opts).unwrap();
    assert_eq!(w.report().mode_used, LoadMode::Stream);
    assert_eq!(w.report().budget.bytes, Some(1000));
    assert_eq!(w.report().budget.source, "LoadOptions::budget");
    assert_eq!(w.tensor("t1").unwrap().to_vec().unwrap(), vec![1u8; MIB]);
}

#[test]
fn a_budget_that_holds_the_copy_lets_the_stream_path_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 2, 1);
    let w = Weights::load_streamed(&path, &LoadOptions::default().budget(64 * MIB as u64)).unwrap();
    assert_eq!(w.report().bytes_copied, 2 * MIB as u64);
}

#[test]
fn the_system_budget_is_read_when_none_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 1, 1);
    let w = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    let b = &w.report().budget;
    // Every platform tested has a figure to read.
    assert!(b.bytes.is_some_and(|n| n > 0), "{b:?}");
    // Linux has /proc: MemAvailable or a cgroup.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    assert!(
        b.source == "MemAvailable" || b.source.starts_with("cgroup v"),
        "{b:?}"
    );
    #[cfg(windows)]
    assert!(
        b.source == "GlobalMemoryStatusEx ullAvailPhys" || b.source.starts_with("job object"),
        "{b:?}"
    );
    #[cfg(target_os = "macos")]
    assert_eq!(b.source, "host_statistics64 HOST_VM_INFO64", "{b:?}");
}

#[test]
fn a_mapped_load_copies_nothing_so_a_small_budget_refuses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 4, 1);
    let w = load(&path, &windowed().budget(MIB as u64)).unwrap();
    assert_eq!(w.report().mode_used, LoadMode::Mmap);
    assert_eq!(w.report().bytes_copied, 0);
    // The region is over half the budget: the read-ahead follows the pass.
    if has_page_map() {
        match &w.report().prefetch {
            PrefetchDecision::Windowed {
                bytes,
                budget,
                window,
            } => {
                assert_eq!((*bytes, *budget), (4 * MIB as u64, MIB as u64));
                assert_eq!(*window, MIB as u64 / 4);
            }
            other => panic!("expected a windowed read-ahead, got {other}"),
        }
        // Waiting for a read-ahead that waits for the pass returns at once.
        let t0 = Instant::now();
        assert!(w.wait_prefetch().is_some());
        assert!(t0.elapsed() < Duration::from_secs(30));
    } else {
        assert_no_page_map(&w.report().prefetch);
        assert!(w.wait_prefetch().is_none());
    }
    for i in 0..4 {
        assert_eq!(
            w.tensor(&format!("t{i}")).unwrap().host_bytes().unwrap()[0],
            i as u8
        );
    }
}

#[test]
fn copied_tensors_of_a_mapped_load_are_held_to_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = misaligned(dir.path());
    // The default budget holds the copies (a few KiB).
    let w = load(&path, &LoadOptions::default()).unwrap();
    assert_eq!(
        w.tensor("floats").unwrap().placement_kind(),
        weightmap::PlacementKind::Copied
    );
    let e = load(&path, &LoadOptions::default().budget(100)).unwrap_err();
    let (what, needed, budget, _) = over_budget(&e);
    assert_eq!(what, "the copied tensors");
    assert!(needed >= 4096, "{needed}");
    assert_eq!(budget, 100);
}

#[test]
fn a_fallback_to_the_stream_path_is_held_to_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let path = misaligned(dir.path());
    let opts = LoadOptions::default().require_all_mapped(true).budget(100);
    let e = load(&path, &opts).unwrap_err();
    match &e {
        Error::FallbackFailed { source, .. } => {
            assert_eq!(
                over_budget(source).0,
                "the stream path's copy of the tensors"
            );
        }
        other => panic!("expected FallbackFailed, got {other:?}"),
    }
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert!(e.to_string().contains("budget"), "{e}");
}

#[test]
fn mlock_over_the_budget_is_refused_before_locking() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 1, 1);
    let e = load(&path, &LoadOptions::default().mlock(true).budget(4096)).unwrap_err();
    let (what, needed, ..) = over_budget(&e);
    assert_eq!(what, "mlock of the mapping");
    assert!(needed > MIB as u64, "{needed}");
}

/// Wait until `cond` holds, for at most `limit`.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// 16 tensors of 4 MiB in `dir`, loaded cold (where a file's pages can be
/// dropped) against a budget of 32 MiB with the windowed read-ahead, whose
/// window that makes 8 MiB (where there is a page map to follow the pass).
fn windowed_model(dir: &Path) -> Weights {
    let path = model(dir, 16, 4);
    if common::page_cache_probe().files.is_ok() {
        weightmap::evict(&path).unwrap();
    }
    let w = load(&path, &windowed().budget(32 * MIB as u64)).unwrap();
    if has_page_map() {
        assert_eq!(w.report().prefetch.name(), "windowed");
    } else {
        assert_no_page_map(&w.report().prefetch);
    }
    w
}

/// Whether `test` can watch the windowed read-ahead: the page cache
/// observable, and the read-ahead running (it needs the page map).
fn read_ahead_observable(test: &str) -> bool {
    common::page_cache_observable(test) && common::proc_self_observable(test, "pagemap")
}

/// How much of tensor `ti` is in the page cache.
fn resident_at(w: &Weights, i: usize) -> f64 {
    w.residency(&format!("t{i}"))
        .unwrap()
        .expect("mapped")
        .fraction()
}

#[test]
fn the_read_ahead_keeps_within_its_window_of_the_first_pass() {
    let observable =
        read_ahead_observable("the_read_ahead_keeps_within_its_window_of_the_first_pass");
    let dir = tempfile::tempdir().unwrap();
    let w = windowed_model(dir.path());
    let resident = |i: usize| resident_at(&w, i);
    if observable {
        // Before any pass: the window ahead of the region's start is read...
        assert!(
            eventually(Duration::from_secs(20), || resident(0) > 0.9),
            "the first tensor was never read ahead"
        );
        // ...and nothing far past it (tensor 8 starts 32 MiB in).
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            resident(8) < 0.1,
            "read ahead past the window: {}",
            resident(8)
        );
    }
    // The pass maps tensors 0..8; the read-ahead follows it.
    for i in 0..8 {
        let bytes = w.tensor(&format!("t{i}")).unwrap().host_bytes().unwrap();
        let sum: u64 = bytes.iter().step_by(4096).map(|&b| u64::from(b)).sum();
        assert_eq!(sum, (i * 4 * MIB / 4096) as u64);
    }
    if !observable {
        return;
    }
    assert!(
        eventually(Duration::from_secs(20), || resident(8) > 0.9),
        "the read-ahead did not follow the pass"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        resident(15) < 0.1,
        "read ahead past the window: {}",
        resident(15)
    );
}

#[test]
fn the_read_ahead_drops_what_the_first_pass_left_a_window_behind() {
    let observable =
        read_ahead_observable("the_read_ahead_drops_what_the_first_pass_left_a_window_behind");
    let dir = tempfile::tempdir().unwrap();
    let w = windowed_model(dir.path());
    let resident = |i: usize| resident_at(&w, i);
    // A first pass over tensors 0..12 (48 MiB in).
    for i in 0..12 {
        let bytes = w.tensor(&format!("t{i}")).unwrap().host_bytes().unwrap();
        assert!(bytes.iter().step_by(4096).all(|&b| b == i as u8));
    }
    if !observable {
        return;
    }
    // Tensors 0..8 end 16 MiB behind its front, past the 8 MiB window.
    assert!(
        eventually(Duration::from_secs(20), || (0..8)
            .all(|i| resident(i) < 0.1)),
        "pages far behind the pass stayed: {:?}",
        (0..12).map(resident).collect::<Vec<_>>()
    );
    // What is within the window behind it stays.
    assert!(resident(11) > 0.9, "{}", resident(11));
}

#[test]
fn tensors_uploaded_to_a_device_leave_no_pages_of_the_file_behind() {
    use std::sync::Arc;
    use weightmap::buffer::{BufferType, SimDeviceBufferType};
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 8, 1);
    let device: Arc<dyn BufferType> = Arc::new(SimDeviceBufferType::new(256, usize::MAX).unwrap());
    // Uploads drop what they read from the page cache (posix_fadvise):
    // seen with evict and file_residency.
    let observable = common::file_cache_observable(
        "tensors_uploaded_to_a_device_leave_no_pages_of_the_file_behind",
    );
    for mode in [LoadMode::Mmap, LoadMode::Stream] {
        if observable {
            weightmap::evict(&path).unwrap();
        }
        let d = Arc::clone(&device);
        let opts = LoadOptions::default()
            .mode(mode)
            .route(move |t| t.name.starts_with('t').then(|| Arc::clone(&d)));
        let w = load(&path, &opts).unwrap();
        assert_eq!(w.report().bytes_copied, 8 * MIB as u64, "{mode:?}");
        // The header's pages may stay; the 8 MiB of tensor data may not.
        if observable {
            let cached = weightmap::file_residency(&path).unwrap();
            assert!(
                cached.resident_pages * 4096 < MIB as u64,
                "{mode:?}: {} pages of the file cached after the upload",
                cached.resident_pages
            );
        }
        for i in 0..8 {
            assert_eq!(
                w.tensor(&format!("t{i}")).unwrap().to_vec().unwrap(),
                vec![i as u8; MIB]
            );
        }
    }
}

#[test]
fn an_owned_copy_is_held_to_the_budget_the_load_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 2, 2);
    let opts = LoadOptions::default().budget(MIB as u64);
    let w = load(&path, &opts).unwrap();
    let e = w.tensor("t0").unwrap().to_owned_tensor().unwrap_err();
    let (what, needed, budget, source) = over_budget(&e);
    assert_eq!(what, "an owned copy of the tensor");
    assert_eq!((needed, budget), (2 * MIB as u64, MIB as u64));
    assert_eq!(source, "LoadOptions::budget");
    // Told to go ahead, it copies.
    let w = load(&path, &opts.ignore_budget(true)).unwrap();
    let owned = w.tensor("t1").unwrap().to_owned_tensor().unwrap();
    assert!(owned.bytes().iter().all(|&b| b == 1));
}

#[test]
fn a_region_over_the_budget_is_read_in_huge_pages_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 16, 4);
    if common::page_cache_probe().files.is_ok() {
        weightmap::evict(&path).unwrap();
    }
    let w = load(&path, &LoadOptions::default().budget(32 * MIB as u64)).unwrap();
    match &w.report().prefetch {
        // The kernel took the advice: no thread, the pass's faults read.
        PrefetchDecision::HugePages { bytes, budget } => {
            assert_eq!((*bytes, *budget), (64 * MIB as u64, 32 * MIB as u64));
            assert_eq!(w.report().prefetch.name(), "huge_pages");
            assert!(w.wait_prefetch().is_none());
        }
        // A kernel without transparent huge pages refuses it.
        PrefetchDecision::Windowed { .. } => {}
        // Elsewhere there are no huge pages, and no page map to follow the
        // pass with.
        other if !has_page_map() => assert_no_page_map(other),
        other => panic!("expected huge pages or a windowed read-ahead, got {other}"),
    }
    for i in 0..16 {
        let bytes = w.tensor(&format!("t{i}")).unwrap().host_bytes().unwrap();
        assert!(bytes.iter().step_by(4096).all(|&b| b == i as u8));
    }
}
