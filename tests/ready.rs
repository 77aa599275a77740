//! Time to ready: eviction, per-tensor advice, the background prefetcher,
//! `release`, and what each does to the page cache and the mapping.
//!
//! Residency is read with `mincore` (what `fincore` prints) and advice from
//! the `VmFlags` of `/proc/self/smaps` (`rr` is `MADV_RANDOM`, `sr`
//! `MADV_SEQUENTIAL`). Files are written, then synced, so that their pages
//! are clean and eviction can drop them.
//!
//! Every byte-level assertion runs everywhere; those about the page cache,
//! the mapping and `VmFlags` run where the probe in `tests/common` finds
//! them observable (not under qemu-user, which ignores page advice, nor on
//! Windows or macOS, which cannot drop a file's pages), and the test prints
//! that it skips them elsewhere.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use common::pattern;
use weightmap::gguf::Writer;
use weightmap::PrefetchState;
use weightmap::{evict, file_residency};
use weightmap::{
    AccessAdvice, AdvicePolicy, Error, LoadMode, LoadOptions, Prefetch, PrefetchDecision,
    TensorType, Weights,
};

const MIB: usize = 1 << 20;

/// Write `w` to `dir/name` and sync it, so its pages can be evicted.
fn write_synced(dir: &Path, name: &str, w: &Writer) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&w.to_bytes()).unwrap();
    f.sync_all().unwrap();
    path
}

/// A llama-shaped file: an (untied, when `output`) token embedding, two
/// layer tensors, and the output projection, each `mib` MiB of f32.
fn model(dir: &Path, name: &str, mib: usize, output: bool) -> PathBuf {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    let n = mib * MIB;
    let f32s = (n / 4) as u64;
    let mut names = vec![
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.0.ffn_up.weight",
    ];
    if output {
        names.push("output.weight");
    }
    for (i, t) in names.iter().enumerate() {
        // 12 bytes short of whole MiB: the later tensors start off a page.
        let len = if i == 0 { f32s - 3 } else { f32s };
        w.tensor(t, TensorType::F32, &[len], pattern(i, len as usize * 4));
    }
    write_synced(dir, name, &w)
}

fn load(path: &Path, opts: &LoadOptions) -> Weights {
    // SAFETY: the test's files are not modified while loaded.
    unsafe { Weights::load(path, opts) }.unwrap()
}

/// The tensor bytes straight from the file.
fn file_tensor(path: &Path, w: &Weights, name: &str) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap();
    let r = w.tensor(name).unwrap().info().file_range();
    raw[r.start as usize..r.end as usize].to_vec()
}

/// Assert that the tensors `names` (every tensor if empty) read back as
/// the file's bytes, reading the file once.
fn assert_file_bytes(path: &Path, w: &Weights, names: &[&str]) {
    let raw = std::fs::read(path).unwrap();
    let all: Vec<String> = w.tensors().map(|t| t.name().to_owned()).collect();
    let names: Vec<&str> = if names.is_empty() {
        all.iter().map(String::as_str).collect()
    } else {
        names.to_vec()
    };
    for name in names {
        let t = w.tensor(name).unwrap();
        let r = t.info().file_range();
        let want = &raw[r.start as usize..r.end as usize];
        assert!(
            t.host_bytes().unwrap() == want,
            "{name}: not the file's bytes"
        );
    }
}

fn tensor_addr(w: &Weights, name: &str) -> (usize, usize) {
    let b = w.tensor(name).unwrap().host_bytes().unwrap();
    (b.as_ptr() as usize, b.len())
}

fn page() -> usize {
    weightmap::page_size()
}

/// Whole pages inside a tensor, as (address, length).
fn inner_pages(w: &Weights, name: &str) -> (usize, usize) {
    let (a, n) = tensor_addr(w, name);
    let s = a.next_multiple_of(page());
    let e = (a + n) / page() * page();
    (s, e - s)
}

#[test]
fn evict_leaves_little_of_a_file_resident() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf", 4, true);
    std::fs::read(&path).unwrap();
    if !common::file_cache_observable("evict_leaves_little_of_a_file_resident") {
        return;
    }
    assert!(file_residency(&path).unwrap().fraction() > 0.9);
    evict(&path).unwrap();
    let r = file_residency(&path).unwrap();
    assert!(r.fraction() < 0.1, "{r:?}");
    assert!(r.total_pages > 1000);
}

#[test]
fn per_tensor_advice_makes_only_untied_lookup_tables_random() {
    let test = "per_tensor_advice_makes_only_untied_lookup_tables_random";
    // The advice is read back from /proc/self/smaps, where the kernel takes it.
    let flags = common::page_cache_observable(test) && common::proc_self_observable(test, "smaps");
    let dir = tempfile::tempdir().unwrap();
    let untied = model(dir.path(), "untied.gguf", 2, true);
    let w = load(&untied, &LoadOptions::default());
    assert_eq!(w.report().random_access_tensors, ["token_embd.weight"]);
    if flags {
        let (a, n) = inner_pages(&w, "token_embd.weight");
        assert!(
            common::all_flagged(a, n, "rr", true),
            "{:?}",
            common::vm_flags(a, n)
        );
        for t in ["blk.0.attn_q.weight", "output.weight"] {
            let (a, n) = tensor_addr(&w, t);
            assert!(
                common::all_flagged(a, n, "rr", false),
                "{t}: {:?}",
                common::vm_flags(a, n)
            );
        }
        // The page token_embd shares with its neighbour keeps read-ahead.
        let (a, n) = tensor_addr(&w, "token_embd.weight");
        let last = (a + n) / page() * page();
        assert!(common::all_flagged(last, 1, "rr", false));
    }
    assert_file_bytes(&untied, &w, &[]);

    // Tied: the embedding is the output matrix, read whole; nothing random.
    let tied = model(dir.path(), "tied.gguf", 2, false);
    let w = load(&tied, &LoadOptions::default());
    assert!(w.report().random_access_tensors.is_empty());
    if flags {
        let (s, e) = w.header().tensor_region();
        let base = w.mapped().unwrap().file_bytes().as_ptr() as usize;
        assert!(common::all_flagged(
            base + s as usize,
            (e - s) as usize,
            "rr",
            false
        ));
    }

    // Uniform advice covers the whole region, and a re-advise changes one tensor.
    let opts = LoadOptions::default()
        .advice(AdvicePolicy::Uniform(AccessAdvice::Random))
        .prefetch(Prefetch::None);
    let w = load(&tied, &opts);
    let (a, n) = inner_pages(&w, "blk.0.attn_q.weight");
    if flags {
        assert!(common::all_flagged(a, n, "rr", true));
    }
    w.advise("blk.0.attn_q.weight", AccessAdvice::Sequential)
        .unwrap();
    if flags {
        assert!(
            common::all_flagged(a, n, "sr", true),
            "{:?}",
            common::vm_flags(a, n)
        );
        let (a2, n2) = inner_pages(&w, "blk.0.ffn_up.weight");
        assert!(common::all_flagged(a2, n2, "rr", true));
    }
    assert_file_bytes(&tied, &w, &["blk.0.attn_q.weight"]);
    assert!(matches!(
        w.advise("nope", AccessAdvice::Random),
        Err(Error::TensorNotFound { .. })
    ));
}

#[test]
fn background_prefetch_reads_the_region_after_a_cold_start() {
    let test = "background_prefetch_reads_the_region_after_a_cold_start";
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf", 8, true);
    let observable = common::page_cache_observable(test);
    if observable {
        evict(&path).unwrap();
        assert!(file_residency(&path).unwrap().fraction() < 0.1);
    }
    let w = load(&path, &LoadOptions::default());
    assert_eq!(w.report().mode_used, LoadMode::Mmap);
    let (s, e) = w.header().tensor_region();
    match &w.report().prefetch {
        PrefetchDecision::Background { bytes, .. } => assert_eq!(*bytes, e - s),
        other => panic!("expected a background prefetch, got {other}"),
    }
    let done = w.wait_prefetch().unwrap();
    assert_eq!(done.state, PrefetchState::Finished);
    assert_eq!(done.bytes_done, done.bytes_total);
    // Everything is resident, and nothing was touched by this test.
    if observable {
        for t in w.tensors() {
            let r = w.residency(t.name()).unwrap().unwrap();
            assert_eq!(r.resident_pages, r.total_pages, "{}", t.name());
        }
    }
    assert_eq!(
        w.prefetch_progress().unwrap().state,
        PrefetchState::Finished
    );
    assert_file_bytes(&path, &w, &[]);
}

#[test]
fn no_prefetch_reads_nothing_beyond_what_is_touched() {
    let test = "no_prefetch_reads_nothing_beyond_what_is_touched";
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf", 16, true);
    let observable = common::file_cache_observable(test);
    if observable {
        evict(&path).unwrap();
    }
    let opts = LoadOptions::default().prefetch(Prefetch::None);
    let w = load(&path, &opts);
    assert_eq!(w.report().prefetch, PrefetchDecision::Off);
    assert!(w.prefetch_progress().is_none());
    // The last tensor lies 48 MiB past the header: no read reached it.
    if observable {
        let r = w.residency("output.weight").unwrap().unwrap();
        assert!(r.fraction() < 0.1, "{r:?}");
    }
}

#[test]
fn an_invalid_file_is_never_prefetched() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf", 16, true);
    // One byte short: the last tensor runs past the end.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(f.metadata().unwrap().len() - 1).unwrap();
    f.sync_all().unwrap();
    let observable = common::file_cache_observable("an_invalid_file_is_never_prefetched");
    if observable {
        evict(&path).unwrap();
    }
    let opts = LoadOptions::default().fallback(false);
    // SAFETY: the file is not modified while loaded.
    let err = unsafe { Weights::load(&path, &opts) }.unwrap_err();
    assert!(matches!(err, Error::TensorOutOfBounds { .. }), "{err:?}");
    // Only the header's pages (and the kernel's read-ahead around them) were read.
    if observable {
        let r = file_residency(&path).unwrap();
        assert!(r.fraction() < 0.5, "{r:?}");
    }
}

/// How many of the pages in `[addr, addr + len)` this process has mapped
/// (`/proc/self/pagemap`, bit 63 of each page's entry).
fn mapped_pages(addr: usize, len: usize) -> usize {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
    let pages = len.div_ceil(page());
    let mut buf = vec![0u8; pages * 8];
    f.seek(SeekFrom::Start((addr / page() * 8) as u64)).unwrap();
    f.read_exact(&mut buf).unwrap();
    buf.chunks_exact(8)
        .filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) >> 63 == 1)
        .count()
}

#[test]
fn release_drops_a_tensors_pages_and_keeps_its_bytes() {
    let test = "release_drops_a_tensors_pages_and_keeps_its_bytes";
    let observable = common::page_cache_observable(test);
    // What this process maps is read from /proc/self/pagemap.
    let mapped = observable && common::proc_self_observable(test, "pagemap");
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf", 16, true);
    let opts = LoadOptions::default().prefetch(Prefetch::Populate);
    let w = load(&path, &opts);
    assert!(matches!(
        w.report().prefetch,
        PrefetchDecision::Populated { .. }
    ));
    let name = "blk.0.attn_q.weight";
    let before = file_tensor(&path, &w, name);
    if observable {
        for t in w.tensors() {
            let r = w.residency(t.name()).unwrap().unwrap();
            assert_eq!(r.resident_pages, r.total_pages, "{}", t.name());
        }
    }
    let (a, n) = inner_pages(&w, name);
    if mapped {
        assert_eq!(
            mapped_pages(a, n),
            n / page(),
            "populated: every page mapped"
        );
    }
    w.release(name).unwrap();
    // This process no longer maps a single whole page of the tensor...
    if mapped {
        assert_eq!(mapped_pages(a, n), 0);
    }
    // ...and the page cache dropped them, except a large folio (up to 2 MiB
    // on Linux 6.x) that also holds a neighbour's mapped bytes, at each edge.
    if observable {
        let r = w.residency(name).unwrap().unwrap();
        assert!(r.fraction() < 0.3, "{r:?}");
        assert!(r.total_pages >= 4096);
        // The neighbours are untouched.
        for t in ["token_embd.weight", "blk.0.ffn_up.weight"] {
            let r = w.residency(t).unwrap().unwrap();
            assert_eq!(r.resident_pages, r.total_pages, "{t}");
            if mapped {
                let (a, n) = inner_pages(&w, t);
                assert_eq!(mapped_pages(a, n), n / page(), "{t}");
            }
        }
    }
    // The bytes read back unchanged, faulted in again from the file.
    assert_eq!(w.tensor(name).unwrap().host_bytes().unwrap(), &before[..]);
    if observable {
        let r = w.residency(name).unwrap().unwrap();
        assert_eq!(r.resident_pages, r.total_pages);
    }

    w.release_all().unwrap();
    if mapped {
        let (s, e) = w.header().tensor_region();
        let base = w.mapped().unwrap().file_bytes().as_ptr() as usize;
        let first = (base + s as usize).next_multiple_of(page());
        assert_eq!(mapped_pages(first, base + e as usize - first), 0);
    }
    if observable {
        let r = file_residency(&path).unwrap();
        assert!(r.fraction() < 0.1, "{r:?}");
    }
    assert_eq!(w.tensor(name).unwrap().host_bytes().unwrap(), &before[..]);
    assert_file_bytes(&path, &w, &[]);
}

#[test]
fn advise_and_release_are_noops_on_streamed_weights() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf", 1, true);
    let w = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    assert_eq!(w.report().prefetch, PrefetchDecision::NotMapped);
    let before = w.tensor("output.weight").unwrap().to_vec().unwrap();
    w.advise("output.weight", AccessAdvice::Random).unwrap();
    w.release("output.weight").unwrap();
    w.release_all().unwrap();
    assert!(w.residency("output.weight").unwrap().is_none());
    assert!(w.prefetch_progress().is_none() && w.wait_prefetch().is_none());
    assert_eq!(w.tensor("output.weight").unwrap().to_vec().unwrap(), before);
    assert!(matches!(
        w.release("nope"),
        Err(Error::TensorNotFound { .. })
    ));
}

#[test]
fn every_prefetch_and_advice_gives_identical_bytes() {
    // Each load starts cold where the file's pages can be dropped.
    let cold = common::file_cache_observable("every_prefetch_and_advice_gives_identical_bytes");
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "m.gguf", 1, true);
    let streamed = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    let want: Vec<Vec<u8>> = streamed.tensors().map(|t| t.to_vec().unwrap()).collect();
    for prefetch in [
        Prefetch::None,
        Prefetch::DEFAULT,
        Prefetch::WillNeed,
        Prefetch::Populate,
    ] {
        for advice in [
            AdvicePolicy::PerTensor,
            AdvicePolicy::Uniform(AccessAdvice::Random),
            AdvicePolicy::Uniform(AccessAdvice::Sequential),
        ] {
            if cold {
                evict(&path).unwrap();
            }
            let opts = LoadOptions::default().prefetch(prefetch).advice(advice);
            let w = load(&path, &opts);
            let got: Vec<Vec<u8>> = w.tensors().map(|t| t.to_vec().unwrap()).collect();
            assert_eq!(got, want, "{prefetch:?} {advice:?}");
        }
    }
}
