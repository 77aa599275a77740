//! Announcements (`Weights::prefetch`): what a runtime says it reads next
//! is checked, then read ahead in the background, and only that.
//!
//! Residency is read with `mincore`; the assertions about the page cache
//! run where `tests/common` finds it and the advice on mappings observable
//! (not under qemu-user, which ignores `MADV_WILLNEED`), and the test says
//! when it skips them.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weightmap::gguf::Writer;
use weightmap::{
    evict, Error, ErrorKind, LoadMode, LoadOptions, Need, Prefetch, ResidencyPlan, TensorType,
    Weights,
};

const MIB: usize = 1 << 20;

/// `a` (4 MiB), `blk.0.ffn_up_exps.weight` (4 experts of 4 MiB: ne =
/// [1024, 1024, 4], f32), `b` (4 MiB) and a 1-D `norm`, synced so that
/// eviction can drop them.
fn moe_model(dir: &Path) -> PathBuf {
    moe_model_of(dir, 4)
}

/// [`moe_model`] with experts of `expert_mib` MiB each.
fn moe_model_of(dir: &Path, expert_mib: usize) -> PathBuf {
    let path = dir.join("moe.gguf");
    let mut w = Writer::new(32);
    w.tensor(
        "a",
        TensorType::F32,
        &[1024, 1024],
        common::pattern(1, 4 * MIB),
    );
    w.tensor(
        "blk.0.ffn_up_exps.weight",
        TensorType::F32,
        &[256 * expert_mib as u64, 1024, 4],
        common::pattern(2, 4 * expert_mib * MIB),
    );
    w.tensor(
        "b",
        TensorType::F32,
        &[1024, 1024],
        common::pattern(3, 4 * MIB),
    );
    w.tensor("norm", TensorType::F32, &[16], common::pattern(4, 64));
    let f = std::fs::File::create(&path).unwrap();
    w.write_with(&f, |_, _| {}).unwrap();
    f.sync_all().unwrap();
    path
}

fn load(path: &Path, opts: &LoadOptions) -> Weights {
    // SAFETY: the test's own file, unchanged while mapped.
    unsafe { Weights::load(path, opts) }.unwrap()
}

/// The resident fraction of tensor `name`, once it stops growing or 20 s
/// pass: announced reads land after the call returns.
fn settled_fraction(w: &Weights, name: &str) -> f64 {
    let fraction = || w.residency(name).unwrap().unwrap().fraction();
    let (t0, mut last) = (Instant::now(), -1.0);
    while t0.elapsed() < Duration::from_secs(20) {
        let now = fraction();
        if now > 0.0 && now == last {
            return now;
        }
        last = now;
        std::thread::sleep(Duration::from_millis(20));
    }
    fraction()
}

#[test]
fn a_bad_announcement_is_a_clear_error_and_the_weights_carry_on() {
    let dir = tempfile::tempdir().unwrap();
    let w = load(&moe_model(dir.path()), &LoadOptions::default());
    let exps = w.tensor_index("blk.0.ffn_up_exps.weight").unwrap();
    let norm = w.tensor_index("norm").unwrap();
    let e = w.prefetch(&[Need::tensor(0), Need::tensor(4)]).unwrap_err();
    assert!(
        matches!(e, Error::TensorIndex { index: 4, count: 4 }),
        "{e}"
    );
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert_eq!(e.to_string(), "no tensor 4: the weights hold 4");
    for (tensor, expert, experts) in [(exps, 4, 4), (exps, -1, 4), (norm, 0, 0)] {
        let e = w
            .prefetch(&[Need::experts(tensor, &[0, expert])])
            .unwrap_err();
        let name = w.tensor_at(tensor).unwrap().info().name.to_owned();
        assert!(
            matches!(&e, Error::NoSuchExpert { tensor: t, expert: x, experts: n }
                if *t == name && *x == i64::from(expert) && *n == experts),
            "{e}"
        );
        assert_eq!(e.kind(), ErrorKind::NotFound);
    }
    // The process goes on: the weights answer as before.
    w.prefetch(&[Need::experts(exps, &[3, 0]), Need::tensor(norm)])
        .unwrap();
    assert_eq!(
        w.tensor("b").unwrap().to_vec().unwrap(),
        common::pattern(3, 4 * MIB)
    );
}

#[test]
fn only_the_announced_tensors_and_experts_are_read() {
    let test = "only_the_announced_tensors_and_experts_are_read";
    let dir = tempfile::tempdir().unwrap();
    let path = moe_model(dir.path());
    let w = load(&path, &LoadOptions::default().prefetch(Prefetch::None));
    if !common::page_cache_observable(test) {
        w.prefetch(&[Need::tensor(0), Need::experts(1, &[2])])
            .unwrap();
        return;
    }
    evict(&path).unwrap();
    let exps = w.tensor_index("blk.0.ffn_up_exps.weight").unwrap();
    w.prefetch(&[Need::tensor(0), Need::experts(exps, &[2])])
        .unwrap();
    assert!(settled_fraction(&w, "a") > 0.9);
    // One expert of four: a quarter of the tensor, read whole.
    let f = settled_fraction(&w, "blk.0.ffn_up_exps.weight");
    assert!((0.24..=0.27).contains(&f), "{f}");
    let b = w.residency("b").unwrap().unwrap().fraction();
    assert!(b < 0.01, "b was not announced, yet {b} of it is resident");
}

#[test]
fn streamed_weights_take_announcements_and_have_nothing_to_read() {
    let dir = tempfile::tempdir().unwrap();
    let opts = LoadOptions::default().mode(LoadMode::Stream);
    let w = load(&moe_model(dir.path()), &opts);
    w.prefetch(&[Need::tensor(0), Need::experts(1, &[0, 1, 2, 3])])
        .unwrap();
    assert!(w.prefetch(&[Need::experts(1, &[9])]).is_err());
}

#[test]
fn over_budget_a_slice_whose_use_is_over_is_released_and_the_most_used_stay() {
    let test = "over_budget_a_slice_whose_use_is_over_is_released_and_the_most_used_stay";
    let dir = tempfile::tempdir().unwrap();
    let path = moe_model(dir.path());
    // Room for one 4 MiB expert beside the 8 MiB read whole and the
    // runtime's 64 MiB: the weights (24 MiB) exceed the budget's share.
    let budget = (64 + 8 + 4) * MIB as u64 + 4096;
    let w = load(
        &path,
        &LoadOptions::default()
            .prefetch(Prefetch::None)
            .budget(budget),
    );
    let exps = w.tensor_index("blk.0.ffn_up_exps.weight").unwrap();
    let name = "blk.0.ffn_up_exps.weight";
    let whole = (8 * MIB + 64) as u64;
    assert_eq!(
        w.report().residency,
        ResidencyPlan::StreamExperts {
            whole,
            experts: 16 * MIB as u64,
            expert_capacity: budget - (64 << 20) - whole,
            budget,
        }
    );
    assert_eq!(w.report().residency.name(), "stream_experts");
    if !common::page_cache_observable(test) {
        w.prefetch(&[Need::experts(exps, &[0])]).unwrap();
        w.prefetch(&[Need::experts(exps, &[1])]).unwrap();
        return;
    }
    evict(&path).unwrap();
    w.prefetch(&[Need::experts(exps, &[0])]).unwrap();
    let one = settled_fraction(&w, name);
    assert!((0.24..=0.27).contains(&one), "{one}");
    // Experts 1 and 2 next: expert 0's use is over and, the budget holding
    // one slice, it is released: half the tensor stays, not three quarters.
    w.prefetch(&[Need::experts(exps, &[1, 2])]).unwrap();
    let fraction = || w.residency(name).unwrap().unwrap().fraction();
    let t0 = Instant::now();
    while fraction() < 0.45 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = fraction();
    assert!(
        (0.49..=0.52).contains(&after),
        "{after}: expert 0 was not released"
    );
    // Within the budget, nothing is released.
    let roomy = load(&path, &LoadOptions::default().prefetch(Prefetch::None));
    evict(&path).unwrap();
    roomy.prefetch(&[Need::experts(exps, &[0])]).unwrap();
    settled_fraction(&roomy, name);
    roomy.prefetch(&[Need::experts(exps, &[1])]).unwrap();
    let both = settled_fraction(&roomy, name);
    assert!((0.49..=0.52).contains(&both), "{both}");
}

/// The bytes this thread has had the kernel read from storage
/// (`/proc/thread-self/io`, Linux and Android), where it counts them.
fn thread_read_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/thread-self/io").ok()?;
    let line = io.lines().find_map(|l| l.strip_prefix("read_bytes: "))?;
    line.trim().parse().ok()
}

#[test]
fn over_budget_the_announcing_thread_queues_the_slices_reads_and_within_it_returns_at_once() {
    let test =
        "over_budget_the_announcing_thread_queues_the_slices_reads_and_within_it_returns_at_once";
    let dir = tempfile::tempdir().unwrap();
    let path = moe_model(dir.path());
    let budget = (64 + 8 + 4) * MIB as u64 + 4096;
    let opts = LoadOptions::default().prefetch(Prefetch::None);
    let over = load(&path, &opts.clone().budget(budget));
    let within = load(&path, &opts);
    let exps = over.tensor_index("blk.0.ffn_up_exps.weight").unwrap();
    let page_cache = common::page_cache_observable(test);
    if !page_cache || !common::proc_self_observable(test, "io") {
        over.prefetch(&[Need::experts(exps, &[2])]).unwrap();
        return;
    }
    let Some(start) = thread_read_bytes() else {
        println!("{test}: skipped: /proc/thread-self/io does not count reads here");
        return;
    };
    // Over the budget, the reads of expert 2's slice are queued by this
    // call, before it returns (where the runtime computes on every core, a
    // background thread would queue them after the compute's faults).
    evict(&path).unwrap();
    over.prefetch(&[Need::experts(exps, &[2])]).unwrap();
    let queued = thread_read_bytes().unwrap() - start;
    assert!(
        queued >= 4 * MIB as u64,
        "{queued} bytes queued by the call"
    );
    // Within the budget, the weights' thread queues them.
    evict(&path).unwrap();
    let start = thread_read_bytes().unwrap();
    within.prefetch(&[Need::experts(exps, &[1])]).unwrap();
    let queued = thread_read_bytes().unwrap() - start;
    assert!(queued < MIB as u64, "{queued} bytes queued by the call");
    assert!(settled_fraction(&within, "blk.0.ffn_up_exps.weight") >= 0.25);
}

#[test]
fn over_budget_a_fault_on_an_announced_expert_reads_only_its_own_pages() {
    let test = "over_budget_a_fault_on_an_announced_expert_reads_only_its_own_pages";
    let dir = tempfile::tempdir().unwrap();
    // Experts of 3 MiB, so that one's ends are not those of the 2 MiB
    // folios the region is read in where the kernel reads huge pages.
    let path = moe_model_of(dir.path(), 3);
    let budget = (64 + 8 + 3) * MIB as u64 + 4096;
    let w = load(
        &path,
        &LoadOptions::default()
            .prefetch(Prefetch::None)
            .budget(budget),
    );
    let name = "blk.0.ffn_up_exps.weight";
    let exps = w.tensor_index(name).unwrap();
    w.prefetch(&[Need::experts(exps, &[1])]).unwrap();
    if !common::page_cache_observable(test) {
        return;
    }
    settled_fraction(&w, name);
    // The runtime computes on expert 1 after its pages were dropped: each
    // fault reads its own page, not the huge-page folio around it, which
    // holds parts of experts 0 and 2 (the default advice reads the region
    // in huge pages where the kernel can), nor the read-ahead around it.
    evict(&path).unwrap();
    let bytes = w.tensor_at(exps).unwrap().host_bytes().unwrap();
    let expert = &bytes[3 * MIB..6 * MIB];
    let touched: u64 = expert.iter().step_by(4096).map(|&b| u64::from(b)).sum();
    std::hint::black_box(touched);
    let fraction = w.residency(name).unwrap().unwrap().fraction();
    assert!(
        (0.24..=0.26).contains(&fraction),
        "{fraction}: the faults read more than expert 1"
    );
}

#[test]
fn a_tensor_announced_whole_is_left_to_the_fault_path_where_those_read_whole_stream() {
    let test = "a_tensor_announced_whole_is_left_to_the_fault_path_where_those_read_whole_stream";
    let dir = tempfile::tempdir().unwrap();
    let path = moe_model(dir.path());
    let exps = 1;
    // Room for the 8 MiB read whole and one expert (`stream_experts`),
    // and for not even the 8 MiB (`stream_all`).
    let roomy = (64 + 8 + 4) * MIB as u64 + 4096;
    let tight = (64 + 4) * MIB as u64;
    let load_under = |budget: u64| {
        let opts = LoadOptions::default().prefetch(Prefetch::None);
        let w = load(&path, &opts.budget(budget));
        assert_eq!(w.tensor_index("blk.0.ffn_up_exps.weight"), Some(exps));
        w
    };
    if !common::page_cache_observable(test) {
        let w = load_under(tight);
        w.prefetch(&[Need::tensor(0), Need::experts(exps, &[0])])
            .unwrap();
        return;
    }
    // Announce `a` whole, then an expert: once the expert is read, the
    // thread has seen both, and read `a` ahead or not.
    let a_read = |budget: u64| {
        let w = load_under(budget);
        evict(&path).unwrap();
        w.prefetch(&[Need::tensor(0)]).unwrap();
        w.prefetch(&[Need::experts(exps, &[0])]).unwrap();
        settled_fraction(&w, "blk.0.ffn_up_exps.weight");
        w.residency("a").unwrap().unwrap().fraction()
    };
    let read = a_read(roomy);
    assert!(read > 0.99, "{read}");
    // `a` streams: nothing of it is read ahead (but the pages it shares
    // with the header, which the load mapped, and with expert 0).
    let read = a_read(tight);
    assert!(read < 0.05, "{read}");
}

#[test]
fn the_report_says_what_stays_resident_and_a_budget_below_the_dense_part_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = moe_model(dir.path());
    let fits = load(&path, &LoadOptions::default().budget(1 << 40));
    assert_eq!(fits.report().residency, ResidencyPlan::Fits);
    assert!(fits.report().streamed_tensors.is_empty());
    // Not even the 8 MiB read whole fit beside the runtime's 64 MiB.
    let tight = LoadOptions::default().budget(68 * MIB as u64);
    let w = load(&path, &tight);
    let mapped = (24 * MIB + 64) as u64;
    let all = ResidencyPlan::StreamAll {
        mapped,
        budget: 68 * MIB as u64,
    };
    assert_eq!(w.report().residency, all);
    assert!(w.report().residency.to_string().starts_with("stream all: "));
    // The largest tensors read whole stream through until the rest (the
    // 64-byte norm) fits in the 4 MiB left: both 4 MiB ones.
    assert_eq!(w.report().streamed_tensors, ["a", "b"]);
    // It runs: announcements and reads work as ever.
    w.prefetch(&[Need::tensor(0), Need::experts(1, &[1, 2])])
        .unwrap();
    assert_eq!(
        w.tensor("b").unwrap().to_vec().unwrap(),
        common::pattern(3, 4 * MIB)
    );
    let streamed = load(
        &path,
        &tight.clone().mode(LoadMode::Stream).ignore_budget(true),
    );
    assert_eq!(streamed.report().residency, ResidencyPlan::Fits);
    assert!(streamed.report().streamed_tensors.is_empty());
}

#[test]
fn re_announcing_reads_again_after_a_release_and_after_eviction() {
    let test = "re_announcing_reads_again_after_a_release_and_after_eviction";
    let dir = tempfile::tempdir().unwrap();
    let path = moe_model(dir.path());
    let w = load(&path, &LoadOptions::default().prefetch(Prefetch::None));
    if !common::page_cache_observable(test) {
        return;
    }
    evict(&path).unwrap();
    let a = w.tensor_index("a").unwrap();
    w.prefetch(&[Need::tensor(a)]).unwrap();
    assert!(settled_fraction(&w, "a") > 0.9);
    // The runtime drops it (say, after copying it to a device) and then
    // needs it again: announced, it is read again.
    w.release("a").unwrap();
    assert!(w.residency("a").unwrap().unwrap().fraction() < 0.1);
    w.prefetch(&[Need::tensor(a)]).unwrap();
    let again = settled_fraction(&w, "a");
    assert!(again > 0.9, "read once, released, announced: {again}");
    // Memory pressure takes it (here, eviction of the whole file): the
    // next announcement reads it again too.
    evict(&path).unwrap();
    w.prefetch(&[Need::tensor(a)]).unwrap();
    let after_pressure = settled_fraction(&w, "a");
    assert!(after_pressure > 0.9, "evicted, announced: {after_pressure}");
}

#[test]
fn a_guess_is_read_in_the_room_nobody_holds_and_goes_first_once_superseded() {
    let test = "a_guess_is_read_in_the_room_nobody_holds_and_goes_first_once_superseded";
    let dir = tempfile::tempdir().unwrap();
    // Four experts of 2 MiB; room for three beside the 8 MiB read whole and
    // the runtime's 64 MiB.
    let path = moe_model_of(dir.path(), 2);
    let budget = (64 + 8 + 6) * MIB as u64 + 4096;
    let opts = LoadOptions::default().prefetch(Prefetch::None);
    let w = load(&path, &opts.clone().budget(budget));
    assert_eq!(w.report().residency.name(), "stream_experts");
    let exps = w.tensor_index("blk.0.ffn_up_exps.weight").unwrap();
    let name = "blk.0.ffn_up_exps.weight";
    // Checked as announcements are.
    let err = w.prefetch_likely(&[Need::experts(exps, &[4])]).unwrap_err();
    assert!(err.to_string().contains("expert 4"), "{err}");
    if !common::page_cache_observable(test) {
        w.prefetch_likely(&[Need::experts(exps, &[1])]).unwrap();
        return;
    }
    evict(&path).unwrap();
    w.prefetch(&[Need::experts(exps, &[0])]).unwrap();
    assert!((0.24..=0.27).contains(&settled_fraction(&w, name)));
    // Guesses take the room nobody holds: the 4 MiB the slice in use
    // leaves. Experts 1 and 2 are read; then the room is full, and a guess
    // of expert 3 reads nothing.
    w.prefetch_likely(&[Need::experts(exps, &[1, 2])]).unwrap();
    let guessed = settled_fraction(&w, name);
    assert!((0.74..=0.77).contains(&guessed), "{guessed}");
    w.prefetch_likely(&[Need::experts(exps, &[3])]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let full = settled_fraction(&w, name);
    assert!((0.74..=0.77).contains(&full), "{full}: over the room");
    // The router chose 2 and 3: the guess of 1 is superseded, and what
    // stays in memory, guesses included, keeps to the room of three
    // experts (which one goes, the residency's unit tests check).
    w.prefetch(&[Need::experts(exps, &[2, 3])]).unwrap();
    let fraction = || w.residency(name).unwrap().unwrap().fraction();
    let t0 = Instant::now();
    while fraction() < 0.7 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = fraction();
    assert!((0.74..=0.77).contains(&after), "{after}: over the room");
    // Where the weights fit, a guess is read whole.
    let roomy = load(&path, &opts);
    evict(&path).unwrap();
    roomy.prefetch_likely(&[Need::experts(exps, &[3])]).unwrap();
    let one = settled_fraction(&roomy, name);
    assert!((0.24..=0.27).contains(&one), "{one}");
}

/// Read one byte a page of `bytes`, as a runtime computing on them does
/// (`black_box`: an optimised build would otherwise read nothing, the sum
/// being unused).
fn touch(bytes: &[u8]) -> u64 {
    std::hint::black_box(bytes.iter().step_by(4096).map(|&b| u64::from(b)).sum())
}

#[test]
fn a_released_slice_leaves_the_runtimes_own_mapping_too() {
    let test = "a_released_slice_leaves_the_runtimes_own_mapping_too";
    let dir = tempfile::tempdir().unwrap();
    let path = moe_model(dir.path());
    // Room for one 4 MiB expert beside the 8 MiB read whole and the
    // runtime's 64 MiB, as above.
    let budget = (64 + 8 + 4) * MIB as u64 + 4096;
    let opts = LoadOptions::default()
        .prefetch(Prefetch::None)
        .budget(budget);
    let name = "blk.0.ffn_up_exps.weight";
    // The runtime's own mapping of the file (llama.cpp's), on which it
    // computes expert 0, then experts 1 and 2, as it announces them; what
    // stays cached of the tensor once expert 0's use is over.
    let run = |follow: bool| -> Option<f64> {
        let w = load(&path, &opts);
        let exps = w.tensor_index(name).unwrap();
        let at = w.tensor_at(exps).unwrap().info().file_offset as usize;
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the test's own file, unchanged while mapped.
        let theirs = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let experts = |e: &[usize]| {
            for &e in e {
                touch(&theirs[at + e * 4 * MIB..at + (e + 1) * 4 * MIB]);
            }
        };
        if follow {
            // A copy on the heap is no mapping of the file.
            let copy = theirs[at..at + 4096].to_vec();
            let err = w.follow_runtime_mapping(exps, copy.as_ptr()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Io, "{err}");
            let followed = w.follow_runtime_mapping(exps, theirs[at..].as_ptr());
            if !cfg!(any(target_os = "linux", target_os = "android")) {
                assert_eq!(followed.unwrap_err().kind(), ErrorKind::Io);
                return None;
            }
            followed.unwrap();
        }
        if !common::page_cache_observable(test) {
            return None;
        }
        evict(&path).unwrap();
        w.prefetch(&[Need::experts(exps, &[0])]).unwrap();
        experts(&[0]);
        assert!((0.24..=0.27).contains(&settled_fraction(&w, name)));
        w.prefetch(&[Need::experts(exps, &[1, 2])]).unwrap();
        experts(&[1, 2]);
        std::thread::sleep(Duration::from_millis(300));
        Some(settled_fraction(&w, name))
    };
    // Unfollowed, the runtime's mapping keeps expert 0 cached: the kernel
    // drops no page a mapping holds.
    let Some(unfollowed) = run(false) else {
        run(true);
        return;
    };
    assert!((0.74..=0.77).contains(&unfollowed), "{unfollowed}");
    let followed = run(true).expect("observable above");
    assert!(
        (0.49..=0.52).contains(&followed),
        "{followed}: expert 0 stayed in the runtime's mapping"
    );
}

#[test]
fn a_followed_mapping_is_advised_as_the_loads_own_and_its_expert_tensors_again() {
    let test = "a_followed_mapping_is_advised_as_the_loads_own_and_its_expert_tensors_again";
    if !cfg!(any(target_os = "linux", target_os = "android"))
        || !common::proc_self_observable(test, "smaps")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = moe_model(dir.path());
    let file = std::fs::File::open(&path).unwrap();
    // SAFETY: the test's own file, unchanged while mapped.
    let theirs = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let page = weightmap::page_size();
    // Tensor `i`'s address in the runtime's mapping.
    let at = |w: &Weights, i: usize| {
        theirs.as_ptr() as usize + w.tensor_at(i).unwrap().info().file_offset as usize
    };
    // Its whole pages there: advice never reaches a neighbour's.
    let theirs_of = |w: &Weights, i: usize| {
        let end = at(w, i) + w.tensor_at(i).unwrap().info().nbytes as usize;
        let (start, end) = (at(w, i).div_ceil(page) * page, end / page * page);
        (start, end - start)
    };
    // Room for one expert beside the 8 MiB read whole (experts stream), and
    // for less than the 8 MiB (everything streams), each beside the
    // runtime's 64 MiB.
    for (room, plan) in [(8 + 4, "stream_experts"), (4, "stream_all")] {
        let budget = (64 + room) * MIB as u64 + 4096;
        let opts = LoadOptions::default()
            .prefetch(Prefetch::None)
            .budget(budget);
        let w = load(&path, &opts);
        assert_eq!(w.report().residency.name(), plan);
        let b = w.tensor("a").unwrap().host_bytes().unwrap();
        if !common::all_flagged(b.as_ptr() as usize, b.len(), "hg", true) {
            println!("{test}: skipped: the load advised no huge pages here (THP off)");
            return;
        }
        let exps = w.tensor_index("blk.0.ffn_up_exps.weight").unwrap();
        // Announced before the runtime's mapping is followed: advised in
        // weightmap's own mapping only.
        w.prefetch(&[Need::experts(exps, &[0])]).unwrap();
        let (a, a_len) = theirs_of(&w, w.tensor_index("a").unwrap());
        assert!(common::all_flagged(a, a_len, "hg", false));
        w.follow_runtime_mapping(exps, at(&w, exps) as *const u8)
            .unwrap();
        // The load's huge pages reach the runtime's mapping where the
        // tensors read whole stream, not where experts do.
        let huge = plan == "stream_all";
        assert!(
            common::all_flagged(a, a_len, "hg", huge),
            "{plan}: {:?}",
            common::vm_flags(a, a_len)
        );
        // The expert tensor's own advice, given again at its next
        // announcement, comes after the region's.
        w.prefetch(&[Need::experts(exps, &[1])]).unwrap();
        let (e, e_len) = theirs_of(&w, exps);
        for flag in ["nh", "rr"] {
            assert!(
                common::all_flagged(e, e_len, flag, true),
                "{plan}: {flag}: {:?}",
                common::vm_flags(e, e_len)
            );
        }
    }
}
