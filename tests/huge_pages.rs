//! Decode reads every weight per token, faster from huge pages: a load must
//! leave the weights there, mapped or streamed (ARCHITECTURE.md, "Huge pages
//! for the weights").
//!
//! What a load leaves is compared with what `read()` leaves, in the same
//! run: a mapping of a file that `std::fs::read` brought into the page cache
//! (`cat`) is the reference, whatever the kernel and the file system give.
//! Where that reference has no huge page at all (a kernel without large
//! folios for this file system, qemu-user, Windows, macOS), the comparisons
//! are skipped with a printed reason; every byte-level assertion runs
//! everywhere.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::pattern;
use weightmap::gguf::Writer;
use weightmap::{
    evict, file_residency, AdvicePolicy, HugePages, LoadMode, LoadOptions, Prefetch, Reread,
    RereadRefusal, TensorType, Weights,
};

const MIB: usize = 1 << 20;

/// A file of eight 8 MiB F32 tensors, synced so that it can be evicted.
/// 64 MiB: `read()`'s read-ahead starts in small folios and grows them, and
/// reaches 2 MiB ones only after about 32 MiB.
fn model(dir: &Path) -> PathBuf {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    let n = (8 * MIB / 4) as u64;
    for i in 0..8 {
        let name = format!("blk.{i}.ffn_up.weight");
        w.tensor(&name, TensorType::F32, &[n], pattern(i, n as usize * 4));
    }
    let path = dir.join("m.gguf");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&w.to_bytes()).unwrap();
    f.sync_all().unwrap();
    path
}

fn load(path: &Path, opts: &LoadOptions) -> Weights {
    // SAFETY: the test's files are not modified while loaded.
    unsafe { Weights::load(path, opts) }.unwrap()
}

/// Read every tensor byte once (what a first pass does), and check the
/// bytes against the file's.
fn touch_and_check(path: &Path, w: &Weights) {
    let raw = std::fs::read(path).unwrap();
    for t in w.tensors() {
        let info = w.tensor_infos().find(|i| i.name == t.name()).unwrap();
        let at = info.file_offset as usize;
        assert!(
            t.host_bytes().unwrap() == &raw[at..at + info.nbytes as usize],
            "{}",
            t.name()
        );
    }
}

/// The page cache filled by `read()` and mapped: the most huge-page bytes
/// this kernel and file system give a mapping of this file. `None`, with a
/// printed reason, where that cannot be measured or is nothing.
fn what_read_gives(test: &str, path: &Path) -> Option<HugePages> {
    if !common::page_cache_observable(test) {
        return None;
    }
    evict(path).unwrap();
    std::fs::read(path).unwrap();
    let w = load(path, &LoadOptions::default().prefetch(Prefetch::None));
    touch_and_check(path, &w);
    let h = w.huge_pages();
    match h.mapped_huge {
        Some(n) if n > 0 => Some(h),
        Some(_) => {
            println!("{test}: huge-page assertions skipped: a mapping of a file read() brought in has no huge page here");
            None
        }
        None => {
            println!("{test}: huge-page assertions skipped: this platform cannot tell ({h:?})");
            None
        }
    }
}

fn cold_load(path: &Path, opts: &LoadOptions) -> Weights {
    if common::page_cache_observable("cold_load") {
        evict(path).unwrap();
        assert!(file_residency(path).unwrap().fraction() < 0.1);
    }
    let w = load(path, opts);
    assert_eq!(w.report().mode_used, LoadMode::Mmap);
    w.wait_prefetch();
    w
}

#[test]
fn a_cold_prefetched_load_leaves_the_weights_in_huge_pages_as_read_does() {
    let test = "a_cold_prefetched_load_leaves_the_weights_in_huge_pages_as_read_does";
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path());
    let reference = what_read_gives(test, &path);
    for prefetch in [Prefetch::DEFAULT, Prefetch::Populate] {
        let w = cold_load(&path, &LoadOptions::default().prefetch(prefetch));
        let h = w.huge_pages();
        touch_and_check(&path, &w);
        assert!(h.mapped_bytes >= w.report().bytes_mapped, "{h:?}");
        if let Some(r) = reference {
            let (got, read) = (h.mapped_huge.unwrap(), r.mapped_huge.unwrap());
            // The bar: at least 90% of what read() gives.
            assert!(
                got * 10 >= read * 9,
                "{prefetch:?}: {got} bytes in huge pages after the prefetch, {read} after read()"
            );
        }
    }
}

#[test]
fn small_folios_another_reader_left_are_reported_and_reread_on_request() {
    let test = "small_folios_another_reader_left_are_reported_and_reread_on_request";
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path());
    let reference = what_read_gives(test, &path);
    // Another reader fills the page cache in base-page folios: queued reads
    // (MADV_WILLNEED) under advice that does not ask for huge pages, as
    // llama.cpp and weightmap before 0.2 did.
    let fill = |path: &Path| {
        let w = cold_load(
            path,
            &LoadOptions::default()
                .advice(AdvicePolicy::Uniform(weightmap::AccessAdvice::Normal))
                .prefetch(Prefetch::WillNeed),
        );
        for _ in 0..500 {
            if file_residency(path).map_or(true, |r| r.fraction() > 0.99) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(w);
    };
    fill(&path);
    let w = load(&path, &LoadOptions::default());
    let progress = w.wait_prefetch().unwrap();
    assert_eq!(progress.bytes_reread, 0, "nothing is re-read unless asked");
    touch_and_check(&path, &w);
    let before = w.huge_pages();
    drop(w);
    let w = load(&path, &LoadOptions::default().reread_small_folios(true));
    let progress = w.wait_prefetch().unwrap();
    touch_and_check(&path, &w);
    let after = w.huge_pages();
    let Some(r) = reference else { return };
    let cap = before.mapped_huge_capacity;
    assert!(
        before.mapped_small().unwrap() >= cap / 2,
        "the fill left small folios, and the report says so: {before:?}"
    );
    assert!(progress.bytes_reread > 0, "{progress:?}");
    assert!(
        after.mapped_huge.unwrap() * 10 >= r.mapped_huge.unwrap() * 9,
        "re-read: {after:?}, read(): {r:?}"
    );
    assert!(after.mapped_small().unwrap() < cap / 4, "{after:?}");
    // A populate re-reads too, before the load returns, and says how much.
    drop(w);
    fill(&path);
    let opts = LoadOptions::default()
        .prefetch(Prefetch::Populate)
        .reread_small_folios(true);
    let w = load(&path, &opts);
    assert_eq!(w.report().reread, Reread::On);
    let progress = w
        .prefetch_progress()
        .expect("a populate reports its progress");
    assert_eq!(progress.state, weightmap::PrefetchState::Finished);
    assert!(progress.bytes_reread > 0, "{progress:?}");
    touch_and_check(&path, &w);
}

#[test]
fn a_reread_that_cannot_act_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path());
    let asked = LoadOptions::default().reread_small_folios(true);
    let reread = |opts: &LoadOptions| load(&path, opts).report().reread.clone();
    assert_eq!(reread(&LoadOptions::default()), Reread::Off);
    let uniform = asked
        .clone()
        .advice(AdvicePolicy::Uniform(weightmap::AccessAdvice::Normal));
    assert_eq!(
        reread(&uniform),
        Reread::Refused(RereadRefusal::UniformAdvice)
    );
    let stream = asked.clone().mode(LoadMode::Stream);
    assert_eq!(reread(&stream), Reread::Refused(RereadRefusal::NotMapped));
    // Where the kernel takes MADV_HUGEPAGE, the prefetch is what refuses;
    // elsewhere, the want of huge pages.
    let huge_pages_taken = reread(&asked) == Reread::On;
    for (prefetch, name) in [(Prefetch::WillNeed, "willneed"), (Prefetch::None, "off")] {
        let weights = load(&path, &asked.clone().prefetch(prefetch));
        let report = weights.report();
        let why = match huge_pages_taken {
            // The refusal carries the decision the report gives.
            true => RereadRefusal::Prefetch(report.prefetch.clone()),
            false => RereadRefusal::NoHugePages,
        };
        assert_eq!(report.prefetch.name(), name);
        let r = &report.reread;
        assert_eq!(r, &Reread::Refused(why), "{prefetch:?}");
        assert!(r.to_string().starts_with("refused: "), "{r}");
    }
}

#[test]
fn streamed_weights_are_in_transparent_huge_pages_unless_turned_off() {
    let test = "streamed_weights_are_in_transparent_huge_pages_unless_turned_off";
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path());
    let stream = |huge: bool| {
        let bt = weightmap::buffer::CpuBufferType::new().huge_pages(huge);
        let opts = LoadOptions::default()
            .mode(LoadMode::Stream)
            .buffer_type(std::sync::Arc::new(bt));
        let w = load(&path, &opts);
        touch_and_check(&path, &w);
        let h = w.huge_pages();
        assert_eq!(h.mapped_bytes, 0);
        assert!(h.owned_bytes >= w.report().bytes_copied, "{h:?}");
        h
    };
    let on = stream(true);
    let off = stream(false);
    let thp = weightmap::transparent_huge_pages();
    if !thp.for_advised_memory() {
        println!("{test}: huge-page assertions skipped: transparent huge pages are {thp:?} here");
        return;
    }
    if !common::page_cache_observable(test) {
        return;
    }
    // The bar: at least 80% of the owned weights in huge pages.
    let huge = on.owned_huge.unwrap();
    assert!(huge * 10 >= on.owned_bytes * 8, "{on:?}");
    assert_eq!(off.owned_huge, Some(0), "{off:?}");
}
