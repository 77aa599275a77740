//! The bounded pass (`Weights::pass`): every tensor once in file order, each
//! resident when handed out, reads queued within a window ahead, pages
//! behind dropped unless kept, and stopping early as the way to cancel.
//!
//! What a pass hands out, in which order, and its bytes are checked
//! everywhere; what is resident when, where the probe in `tests/common`
//! finds the page cache observable (not under qemu-user, which ignores page
//! advice, nor on Windows or macOS), and the test prints that it skips
//! those assertions elsewhere.

mod common;

use std::path::{Path, PathBuf};

use weightmap::gguf::Writer;
use weightmap::{Error, LoadOptions, TensorType, Weights};

const MIB: usize = 1 << 20;

/// A GGUF at `dir/m.gguf` of I8 tensors, each `(name, MiB, fill byte)`.
fn write_model(dir: &Path, tensors: impl IntoIterator<Item = (String, usize, u8)>) -> PathBuf {
    let mut w = Writer::new(32);
    for (name, mib, fill) in tensors {
        w.tensor(
            &name,
            TensorType::I8,
            &[(mib * MIB) as u64],
            vec![fill; mib * MIB],
        );
    }
    let path = dir.join("m.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

/// `n` tensors of 4 MiB each, tensor `ti` filled with byte `i`.
fn model(dir: &Path, n: usize) -> PathBuf {
    write_model(dir, (0..n).map(|i| (format!("t{i}"), 4, i as u8)))
}

/// Mapped, cold (where the platform can drop a file's pages), with no
/// prefetch of its own, so that what is resident is what the pass read.
fn cold(path: &Path) -> Weights {
    cold_with(path, LoadOptions::default())
}

/// [`cold`] with `opts` for the rest.
fn cold_with(path: &Path, opts: LoadOptions) -> Weights {
    if common::page_cache_probe().files.is_ok() {
        weightmap::evict(path).unwrap();
    }
    let opts = opts.prefetch(weightmap::Prefetch::None);
    // SAFETY: the test files are private to each test and never modified.
    unsafe { Weights::load(path, &opts) }.unwrap()
}

fn resident(w: &Weights, name: &str) -> f64 {
    w.residency(name).unwrap().expect("mapped").fraction()
}

#[test]
fn the_pass_visits_every_tensor_once_in_file_order() {
    let dir = tempfile::tempdir().unwrap();
    let w = cold(&model(dir.path(), 6));
    let seen: Vec<(String, u64)> = w
        .pass()
        .map(|t| {
            let t = t.unwrap();
            (t.name().to_owned(), t.info().file_offset)
        })
        .collect();
    let names: Vec<&str> = seen.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(names, ["t0", "t1", "t2", "t3", "t4", "t5"]);
    assert!(seen.windows(2).all(|p| p[0].1 < p[1].1), "{seen:?}");
}

#[test]
fn a_split_model_is_passed_shard_by_shard_in_file_order() {
    let shards = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/shards");
    let w = Weights::load_streamed(
        shards.join("split-00002-of-00003.gguf"),
        &LoadOptions::default(),
    )
    .unwrap();
    let names: Vec<String> = w.pass().map(|t| t.unwrap().name().to_owned()).collect();
    let want: Vec<String> = w.tensor_infos().map(|t| t.name.to_owned()).collect();
    assert_eq!(names, want);
}

/// Whether `cond` holds within a few seconds: pages behind a pass are
/// dropped by its reader thread, soon after the pass moves on.
fn soon(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

#[test]
fn each_tensor_is_resident_when_handed_out_and_dropped_behind() {
    let observable =
        common::page_cache_observable("each_tensor_is_resident_when_handed_out_and_dropped_behind");
    let dir = tempfile::tempdir().unwrap();
    let w = cold(&model(dir.path(), 8));
    let mut prev: Option<String> = None;
    let mut seen = 0;
    // With an 8 MiB window, what is behind is dropped every 2 MiB: after
    // each 4 MiB tensor.
    for t in w.pass().window(8 * MIB as u64) {
        let t = t.unwrap();
        if observable {
            assert_eq!(resident(&w, t.name()), 1.0, "{} handed out", t.name());
            if let Some(p) = &prev {
                assert!(soon(|| resident(&w, p) < 0.1), "{p} kept behind the pass");
            }
        }
        // The bytes are the file's.
        let b = t.host_bytes().unwrap();
        assert!(b.iter().step_by(4096).all(|&x| x == b[0]));
        assert_eq!(b[0], seen as u8, "{}", t.name());
        prev = Some(t.name().to_owned());
        seen += 1;
    }
    assert_eq!(seen, 8);
    // Once the pass is done, the last tensor goes too.
    if observable {
        assert!(resident(&w, "t7") < 0.1);
    }
}

#[test]
fn keep_pages_leaves_what_the_pass_read_in_the_page_cache() {
    let observable =
        common::page_cache_observable("keep_pages_leaves_what_the_pass_read_in_the_page_cache");
    let dir = tempfile::tempdir().unwrap();
    let w = cold(&model(dir.path(), 4));
    let n = w
        .pass()
        .keep_pages(true)
        .inspect(|t| assert!(t.is_ok()))
        .count();
    assert_eq!(n, 4);
    if observable {
        for i in 0..4 {
            assert_eq!(resident(&w, &format!("t{i}")), 1.0);
        }
    }
}

#[test]
fn reads_are_queued_no_further_than_the_window() {
    // A cold file, and what of it is read: evict and mincore.
    let observable = common::file_cache_observable("reads_are_queued_no_further_than_the_window");
    let dir = tempfile::tempdir().unwrap();
    let w = cold(&model(dir.path(), 16));
    let mut pass = w.pass().window(8 * MIB as u64);
    assert_eq!(pass.window_bytes(), 8 * MIB as u64);
    for i in 0..4 {
        assert_eq!(pass.next().unwrap().unwrap().name(), format!("t{i}"));
    }
    if !observable {
        return;
    }
    // t3 is handed out; t4 and t5 (8 MiB) may be queued, t8 on are not.
    std::thread::sleep(std::time::Duration::from_millis(200));
    for i in 8..16 {
        assert!(
            resident(&w, &format!("t{i}")) < 0.1,
            "t{i} read past the window"
        );
    }
}

#[test]
fn stopping_a_pass_early_reads_no_further_and_drops_its_last_tensor() {
    let test = "stopping_a_pass_early_reads_no_further_and_drops_its_last_tensor";
    // Reading no further needs a cold file (evict) and mincore; dropping
    // the last tensor, the page advice honoured too.
    let cold_file = common::file_cache_observable(test);
    let dropped = cold_file && common::page_cache_observable(test);
    let dir = tempfile::tempdir().unwrap();
    let w = cold(&model(dir.path(), 12));
    {
        let mut pass = w.pass().window(4 * MIB as u64);
        assert_eq!(pass.next().unwrap().unwrap().name(), "t0");
        assert_eq!(pass.next().unwrap().unwrap().name(), "t1");
    }
    if !cold_file {
        return;
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    if dropped {
        assert!(
            resident(&w, "t1") < 0.1,
            "the last tensor handed out stayed"
        );
    }
    for i in 4..12 {
        assert!(
            resident(&w, &format!("t{i}")) < 0.1,
            "t{i} read after the pass stopped"
        );
    }
}

#[test]
fn only_visits_the_chosen_tensors_in_file_order() {
    let dir = tempfile::tempdir().unwrap();
    let w = cold(&model(dir.path(), 6));
    let names: Vec<String> = w
        .pass()
        .only(&["t4", "t1"])
        .unwrap()
        .map(|t| t.unwrap().name().to_owned())
        .collect();
    assert_eq!(names, ["t1", "t4"]);
    assert!(matches!(
        w.pass().only(&["nope"]),
        Err(Error::TensorNotFound { name }) if name == "nope"
    ));
}

#[test]
fn a_streamed_model_is_passed_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let w = Weights::load_streamed(model(dir.path(), 3), &LoadOptions::default()).unwrap();
    let firsts: Vec<u8> = w
        .pass()
        .map(|t| t.unwrap().host_bytes().unwrap()[0])
        .collect();
    assert_eq!(firsts, [0, 1, 2]);
}

/// One tensor `big` of `mib` MiB filled with 9, then `n` of 4 MiB as in
/// [`model`].
fn big_then_small(dir: &Path, mib: usize, n: usize) -> PathBuf {
    let big = std::iter::once(("big".to_string(), mib, 9));
    write_model(
        dir,
        big.chain((0..n).map(|i| (format!("t{i}"), 4, i as u8))),
    )
}

fn file_resident(path: &Path) -> f64 {
    weightmap::file_residency(path).unwrap().fraction()
}

#[test]
fn a_tensor_larger_than_the_window_is_read_once_and_dropped() {
    let observable =
        common::page_cache_observable("a_tensor_larger_than_the_window_is_read_once_and_dropped");
    let dir = tempfile::tempdir().unwrap();
    let path = big_then_small(dir.path(), 24, 6);
    let w = cold(&path);
    let mut names = Vec::new();
    for t in w.pass().window(4 * MIB as u64) {
        let t = t.unwrap();
        if t.name() == "big" && observable {
            assert_eq!(resident(&w, "big"), 1.0);
        }
        names.push(t.name().to_owned());
    }
    assert_eq!(names, ["big", "t0", "t1", "t2", "t3", "t4", "t5"]);
    if !observable {
        return;
    }
    // Nothing the pass read stays: not the large tensor, and not a read
    // queued for it after it was dropped.
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        file_resident(&path) < 0.1,
        "{:.0}% of the file stayed cached",
        file_resident(&path) * 100.0
    );
}

#[test]
fn the_pass_holds_no_more_than_the_budget() {
    let observable = common::page_cache_observable("the_pass_holds_no_more_than_the_budget");
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 16);
    let budget = 16 * MIB as u64;
    let w = cold_with(&path, LoadOptions::default().budget(budget));
    let len = std::fs::metadata(&path).unwrap().len() as f64;
    let pass = w.pass();
    assert_eq!(pass.window_bytes(), budget / 2);
    let mut seen = 0;
    for t in pass {
        let t = t.unwrap();
        assert_eq!(t.name(), format!("t{seen}"));
        if observable {
            assert_eq!(resident(&w, t.name()), 1.0, "{} handed out", t.name());
            // The reader may be mid-piece: give it a moment to fill what it may.
            std::thread::sleep(std::time::Duration::from_millis(20));
            let held = file_resident(&path) * len;
            assert!(
                held <= budget as f64,
                "{:.1} MiB cached at {}",
                held / MIB as f64,
                t.name()
            );
        }
        seen += 1;
    }
    assert_eq!(seen, 16);
}

#[test]
fn of_a_tensor_larger_than_the_budget_as_much_as_it_holds_is_resident() {
    let observable = common::page_cache_observable(
        "of_a_tensor_larger_than_the_budget_as_much_as_it_holds_is_resident",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = big_then_small(dir.path(), 32, 1);
    let w = cold_with(&path, LoadOptions::default().budget(16 * MIB as u64));
    let mut pass = w.pass();
    let big = pass.next().unwrap().unwrap();
    assert_eq!(big.name(), "big");
    // The budget less a sixteenth: 15 of its 32 MiB.
    if observable {
        let r = resident(&w, "big");
        assert!((0.45..0.9).contains(&r), "{:.0}% resident", r * 100.0);
    }
    // The rest is there to read all the same.
    let b = big.host_bytes().unwrap();
    assert!(b.iter().step_by(4096).all(|&x| x == 9));
    assert_eq!(pass.next().unwrap().unwrap().name(), "t0");
}

#[test]
fn a_pass_read_in_huge_pages_leaves_no_more_than_a_huge_page_behind() {
    // A window of 32 MiB or more is read in huge-page folios where the
    // kernel takes the advice; folios shared by two runs of dropped tensors
    // must go too.
    let observable = common::page_cache_observable(
        "a_pass_read_in_huge_pages_leaves_no_more_than_a_huge_page_behind",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 24);
    let w = cold(&path);
    let mut seen = 0;
    for t in w.pass().window(32 * MIB as u64) {
        let t = t.unwrap();
        if observable {
            assert_eq!(resident(&w, t.name()), 1.0, "{} handed out", t.name());
        }
        let i: u8 = t.name()[1..].parse().unwrap();
        assert_eq!(i, seen);
        let b = t.host_bytes().unwrap();
        assert!(b.iter().step_by(4096).all(|&x| x == i));
        seen += 1;
    }
    assert_eq!(seen, 24);
    if !observable {
        return;
    }
    // The header's pages and the huge page holding the first tensor's
    // start may stay: at most 4 MiB of the 96.
    let left = file_resident(&path) * std::fs::metadata(&path).unwrap().len() as f64;
    assert!(
        left <= 4.0 * MIB as f64,
        "{:.1} MiB stayed cached",
        left / MIB as f64
    );
}
