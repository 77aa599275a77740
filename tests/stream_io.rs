//! The stream path's I/O: parallel reads, direct reads (and their fallback),
//! progress, and cancellation that frees everything.

mod common;

use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::pattern;
use weightmap::buffer::{Buffer, BufferType, BufferUsage, CpuBufferType};
use weightmap::gguf::Writer;
use weightmap::{DirectIo, DirectOutcome};
const PROGRESS_STEP: u64 = weightmap::LoadOptions::PROGRESS_STEP;
use weightmap::{evict, file_residency};
use weightmap::{Error, LoadOptions, Prefetch, TensorType, Weights};

const MIB: usize = 1 << 20;

/// `n` f32 tensors of `mib` MiB each, and a small odd one, written and
/// synced under `dir`.
fn model(dir: &Path, n: usize, mib: usize) -> PathBuf {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    for i in 0..n {
        w.tensor(
            &format!("t.{i}"),
            TensorType::F32,
            &[(mib * MIB / 4) as u64],
            pattern(i, mib * MIB),
        );
    }
    w.tensor("small", TensorType::F32, &[5], pattern(99, 20));
    let path = dir.join("m.gguf");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&w.to_bytes()).unwrap();
    f.sync_all().unwrap();
    path
}

fn bytes_of(w: &Weights) -> Vec<Vec<u8>> {
    w.tensors().map(|t| t.to_vec().unwrap()).collect()
}

fn file_tensors(path: &Path, w: &Weights) -> Vec<Vec<u8>> {
    let raw = std::fs::read(path).unwrap();
    w.tensor_infos()
        .map(|t| raw[t.file_range().start as usize..t.file_range().end as usize].to_vec())
        .collect()
}

#[test]
fn a_direct_stream_load_leaves_the_page_cache_nearly_empty() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = model(dir.path(), 8, 8);
    // Where the file's cache cannot be dropped or seen (Windows, macOS),
    // the direct load still runs and its bytes are checked.
    let cache = match evict(&path) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("a_direct_stream_load: page-cache assertions skipped: evict: {e}");
            false
        }
    };
    let opts = LoadOptions::default()
        .direct_io(DirectIo::On)
        .read_threads(3);
    let w = Weights::load_streamed(&path, &opts).unwrap();
    let read = w.report().read.clone().unwrap();
    if let DirectOutcome::Refused { error } = &read.direct {
        eprintln!("SKIPPED: this filesystem refuses O_DIRECT ({error})");
        return;
    }
    assert_eq!(read.direct, DirectOutcome::Used);
    assert_eq!(read.threads, 3);
    if cache {
        let r = file_residency(&path).unwrap();
        assert!(r.fraction() < 0.05, "{r:?}");
    }
    // The owned buffer holds the file's layout; every tensor is still at
    // the buffer type's alignment and byte-identical.
    for t in w.tensors() {
        assert_eq!(t.host_bytes().unwrap().as_ptr() as usize % 32, 0);
    }
    assert_eq!(bytes_of(&w), file_tensors(&path, &w));
    // Buffered, the same bytes, and the file is then cached.
    if cache {
        evict(&path).unwrap();
    }
    let b =
        Weights::load_streamed(&path, &LoadOptions::default().direct_io(DirectIo::Off)).unwrap();
    assert_eq!(b.report().read.as_ref().unwrap().direct, DirectOutcome::Off);
    assert_eq!(bytes_of(&b), bytes_of(&w));
    if cache {
        assert!(file_residency(&path).unwrap().fraction() > 0.9);
    }
}

#[test]
fn auto_reads_directly_only_from_a_cold_cache() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = model(dir.path(), 4, 4);
    std::fs::read(&path).unwrap();
    let warm = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    if let Err(e) = file_residency(&path) {
        // The cache cannot be seen (Windows): Auto reads buffered, and
        // says why.
        eprintln!("auto_reads_directly: page-cache assertions skipped: {e}");
        let read = warm.report().read.clone().unwrap();
        assert!(
            matches!(&read.direct, DirectOutcome::NotApplicable { reason }
                if reason.starts_with("residency unknown")),
            "{read:?}"
        );
        assert_eq!(read.threads, cores);
        assert_eq!(bytes_of(&warm), file_tensors(&path, &warm));
        return;
    }
    match &warm.report().read.as_ref().unwrap().direct {
        DirectOutcome::Skipped { reason } => assert!(reason.contains("page cache"), "{reason}"),
        other => panic!("warm: {other:?}"),
    }
    evict(&path).unwrap();
    let cold = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    assert!(
        matches!(
            cold.report().read.as_ref().unwrap().direct,
            DirectOutcome::Used | DirectOutcome::Refused { .. }
        ),
        "{:?}",
        cold.report().read
    );
    assert_eq!(bytes_of(&cold), bytes_of(&warm));
    // By default, direct reads take 4 threads, whatever the core count
    // (they wait on the device); buffered ones, the cores, at most 4.
    let read = cold.report().read.clone().unwrap();
    let expected = if read.direct == DirectOutcome::Used {
        4
    } else {
        cores
    };
    assert_eq!(read.threads, expected, "{read:?}");
    assert_eq!(warm.report().read.as_ref().unwrap().threads, cores);
}

/// tmpfs refused `O_DIRECT` before Linux 6.6 and accepts it since; either
/// way the bytes are right and the report says which. (A refusal is forced
/// in the loader's unit tests.)
#[test]
fn direct_io_on_tmpfs_is_used_or_refused_but_never_wrong() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("SKIPPED: no /dev/shm (a tmpfs) on this machine");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let path = model(dir.path(), 2, 1);
    let w = Weights::load_streamed(&path, &LoadOptions::default().direct_io(DirectIo::On)).unwrap();
    match &w.report().read.as_ref().unwrap().direct {
        DirectOutcome::Refused { error } => assert!(error.contains("Invalid argument"), "{error}"),
        DirectOutcome::Used => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(bytes_of(&w), file_tensors(&path, &w));
}

#[test]
fn a_layout_direct_reads_cannot_use_is_read_buffered_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    // general.alignment = 8: offsets off 32.
    let mut w = Writer::new(8);
    w.tensor("a", TensorType::F32, &[3], pattern(1, 12));
    w.tensor("b", TensorType::F32, &[1 << 18], pattern(2, 1 << 20));
    let path = dir.path().join("a8.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    let w = Weights::load_streamed(&path, &LoadOptions::default().direct_io(DirectIo::On)).unwrap();
    match &w.report().read.as_ref().unwrap().direct {
        DirectOutcome::NotApplicable { reason } => {
            assert!(reason.contains("not aligned to 32"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(bytes_of(&w), file_tensors(&path, &w));
}

#[test]
fn progress_is_monotonic_bounded_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 6, 8);
    let tensor_bytes: u64 = 6 * 8 * MIB as u64 + 20;
    for direct in [DirectIo::Off, DirectIo::On] {
        let calls: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
        let c = Arc::clone(&calls);
        let opts = LoadOptions::default()
            .direct_io(direct)
            .read_threads(2)
            .progress(move |done, total| {
                c.lock().unwrap().push((done, total));
                ControlFlow::Continue(())
            });
        Weights::load_streamed(&path, &opts).unwrap();
        let calls = calls.lock().unwrap();
        let total = calls[0].1;
        assert!(total >= tensor_bytes, "{direct:?}: total {total}");
        assert!(
            calls.windows(2).all(|w| w[0].0 < w[1].0),
            "{direct:?}: {calls:?}"
        );
        assert_eq!(calls.last().unwrap().0, total, "{direct:?}");
        assert!(
            calls.len() as u64 <= total / PROGRESS_STEP + 2,
            "{direct:?}: {} calls",
            calls.len()
        );
    }
    // The mapped path reports its prefetch.
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let opts = LoadOptions::default()
        .prefetch(Prefetch::Populate)
        .progress(move |_, _| {
            c.fetch_add(1, Ordering::SeqCst);
            ControlFlow::Continue(())
        });
    // SAFETY: the file is not modified while loaded.
    unsafe { Weights::load(&path, &opts) }.unwrap();
    assert!(calls.load(Ordering::SeqCst) >= 6);
}

/// A CPU buffer type that counts its live buffers.
#[derive(Debug, Default)]
struct Counting {
    live: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct Counted {
    inner: Box<dyn Buffer>,
    live: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl BufferType for Counting {
    fn name(&self) -> &str {
        "Counting"
    }
    fn alignment(&self) -> usize {
        32
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc_buffer(&self, size: usize) -> weightmap::Result<Box<dyn Buffer>> {
        let inner = CpuBufferType::new().alloc_buffer(size)?;
        self.live.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(Counted {
            inner,
            live: Arc::clone(&self.live),
        }))
    }
}

impl Buffer for Counted {
    fn type_name(&self) -> &str {
        "Counting"
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn alignment(&self) -> usize {
        self.inner.alignment()
    }
    fn usage(&self) -> BufferUsage {
        self.inner.usage()
    }
    fn set_usage(&mut self, u: BufferUsage) {
        self.inner.set_usage(u)
    }
    fn owns_memory(&self) -> bool {
        true
    }
    fn is_host(&self) -> bool {
        true
    }
    fn base_addr(&self) -> usize {
        self.inner.base_addr()
    }
    fn host_bytes(&self) -> Option<&[u8]> {
        self.inner.host_bytes()
    }
    fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        self.inner.host_bytes_mut()
    }
    fn set(&mut self, o: usize, d: &[u8]) -> weightmap::Result<()> {
        self.inner.set(o, d)
    }
    fn get(&self, o: usize, out: &mut [u8]) -> weightmap::Result<()> {
        self.inner.get(o, out)
    }
    fn memset(&mut self, o: usize, n: usize, v: u8) -> weightmap::Result<()> {
        self.inner.memset(o, n, v)
    }
}

#[test]
fn cancelling_stops_every_thread_and_frees_every_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 8, 8);
    let live = Arc::new(AtomicUsize::new(0));
    for direct in [DirectIo::Off, DirectIo::On] {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        let opts = LoadOptions::default()
            .buffer_type(Arc::new(Counting {
                live: Arc::clone(&live),
            }))
            .direct_io(direct)
            .read_threads(2)
            .progress(move |done, total| {
                c.fetch_add(1, Ordering::SeqCst);
                assert!(done < total, "cancelled before the end");
                ControlFlow::Break(())
            });
        let err = Weights::load_streamed(&path, &opts).unwrap_err();
        assert!(matches!(err, Error::Cancelled), "{err:?}");
        // One Break is heard once: no call after it.
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // The buffer allocated for the load is gone, and so are the threads
        // (they ran in a scope that has ended).
        assert_eq!(live.load(Ordering::SeqCst), 0, "{direct:?}");
    }
    // The mapped path's populate prefetch cancels the same way.
    let opts = LoadOptions::default()
        .prefetch(Prefetch::Populate)
        .progress(|_, _| ControlFlow::Break(()));
    // SAFETY: the file is not modified while loaded.
    let err = unsafe { Weights::load(&path, &opts) }.unwrap_err();
    assert!(matches!(err, Error::Cancelled), "{err:?}");
}
