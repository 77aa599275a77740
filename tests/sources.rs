//! Models that are not a plain path: a range of a larger file (an APK
//! entry), and memory the caller owns.

mod common;

use std::io::Write;
use std::path::Path;

use common::pattern;
use weightmap::gguf::Writer;
use weightmap::{AccessAdvice, Error, LoadMode, LoadOptions, PlacementKind, TensorType, Weights};

fn model() -> Vec<u8> {
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    w.tensor("a", TensorType::F32, &[64], pattern(1, 256));
    w.tensor("b", TensorType::F16, &[96], pattern(2, 192));
    w.tensor("c", TensorType::Q8_0, &[64], pattern(3, 68));
    w.to_bytes()
}

fn bytes_of(w: &Weights) -> Vec<(String, Vec<u8>)> {
    w.tensors()
        .map(|t| (t.name().to_owned(), t.to_vec().unwrap()))
        .collect()
}

/// `model` inside a larger file, after `prefix` bytes of other data.
fn embedded(dir: &Path, prefix: usize, model: &[u8]) -> std::fs::File {
    let path = dir.join("container.apk");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&vec![0xEE; prefix]).unwrap();
    f.write_all(model).unwrap();
    f.write_all(&[0xDD; 5000]).unwrap();
    drop(f);
    std::fs::File::open(&path).unwrap()
}

fn range(
    file: &std::fs::File,
    offset: u64,
    len: u64,
    mode: LoadMode,
) -> weightmap::Result<Weights> {
    // SAFETY: the container is not modified while loaded.
    unsafe { Weights::load_file_range(file, offset, len, &LoadOptions::default().mode(mode)) }
}

#[test]
fn a_model_in_the_middle_of_a_larger_file_loads_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let want = bytes_of(
        &Weights::from_memory(m.clone(), &LoadOptions::default().mode(LoadMode::Stream)).unwrap(),
    );
    // At a 64-byte offset past three pages: everything maps; at an odd
    // offset, addresses are off 32 and hybrid placement copies them.
    for (offset, copies) in [(3 * 4096 + 64, false), (12_345, true)] {
        let f = embedded(dir.path(), offset, &m);
        for mode in [LoadMode::Mmap, LoadMode::Stream] {
            let w = range(&f, offset as u64, m.len() as u64, mode).unwrap();
            assert_eq!(bytes_of(&w), want, "offset {offset} {mode:?}");
            assert_eq!(w.report().mode_used, mode);
            // file_offset is relative to the model's start.
            assert_eq!(
                w.tensor_infos().next().unwrap().file_offset,
                w.header().data_offset()
            );
            if mode == LoadMode::Mmap {
                assert_eq!(w.report().tensors_copied > 0, copies, "offset {offset}");
                for t in w.tensors() {
                    let addr = t.host_bytes().unwrap().as_ptr() as usize;
                    assert_eq!(addr % 32, 0, "{} at offset {offset}", t.name());
                }
            }
        }
    }
}

#[test]
fn bounds_are_checked_against_the_range_not_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let f = embedded(dir.path(), 4096, &m);
    // One byte short of the last tensor's end: it runs past the range,
    // although the file goes on.
    let end = Weights::from_memory(m.clone(), &LoadOptions::default())
        .unwrap()
        .tensor("c")
        .unwrap()
        .info()
        .file_range()
        .end;
    for mode in [LoadMode::Mmap, LoadMode::Stream] {
        let e = range(&f, 4096, end - 1, mode).unwrap_err();
        assert!(
            matches!(e, Error::TensorOutOfBounds { ref tensor, .. } if tensor == "c"),
            "{e:?}"
        );
    }
    // A range past the end of the file.
    let e = range(&f, 4096, 1 << 30, LoadMode::Mmap).unwrap_err();
    assert!(matches!(e, Error::Truncated { .. }), "{e:?}");
    assert!(matches!(
        range(&f, 4096, 0, LoadMode::Mmap),
        Err(Error::EmptyFile { .. })
    ));
}

#[test]
fn memory_the_caller_owns_loads_zero_copy_where_aligned() {
    static TINY: &[u8] = include_bytes!("../testdata/tiny-llama.gguf");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tiny-llama.gguf");
    // SAFETY: the fixture is not modified.
    let from_file = unsafe { Weights::load(&path, &LoadOptions::default()) }.unwrap();
    let want = bytes_of(&from_file);
    let st = Weights::from_memory(TINY, &LoadOptions::default()).unwrap();
    assert_eq!(bytes_of(&st), want);
    let arc: std::sync::Arc<[u8]> = TINY.into();
    let a = Weights::from_memory(arc, &LoadOptions::default()).unwrap();
    assert_eq!(bytes_of(&a), want);
    assert_eq!(a.gguf_metadata().unwrap().architecture().unwrap(), "llama");
    // A view is a view: its address is in the caller's memory, where aligned.
    let base = TINY.as_ptr() as usize;
    for t in st.tensors() {
        let addr = t.host_bytes().unwrap().as_ptr() as usize;
        let inside = (base..base + TINY.len()).contains(&addr);
        assert_eq!(
            inside,
            t.placement_kind() == PlacementKind::Mapped,
            "{}",
            t.name()
        );
        assert_eq!(addr % t.buffer().alignment(), 0);
    }
    // Page-aligned memory maps every tensor: a page-aligned window of a
    // larger vector (whose heap block does not move with the vector).
    let mut v = vec![0u8; TINY.len() + 4096];
    let start = (v.as_ptr() as usize).next_multiple_of(4096) - v.as_ptr() as usize;
    v[start..start + TINY.len()].copy_from_slice(TINY);
    struct Page(Vec<u8>, usize, usize);
    impl AsRef<[u8]> for Page {
        fn as_ref(&self) -> &[u8] {
            &self.0[self.1..self.1 + self.2]
        }
    }
    let w = Weights::from_memory(Page(v, start, TINY.len()), &LoadOptions::default()).unwrap();
    assert_eq!(w.report().tensors_copied, 0);
    assert_eq!(bytes_of(&w), want);
    // Advice and release are no-ops on memory; the stream mode copies.
    w.advise(w.tensor_infos().next().unwrap().name, AccessAdvice::Random)
        .unwrap();
    w.release_all().unwrap();
    assert_eq!(bytes_of(&w), want);
    let s = Weights::from_memory(TINY, &LoadOptions::default().mode(LoadMode::Stream)).unwrap();
    assert_eq!(s.report().tensors_mapped, 0);
    assert_eq!(bytes_of(&s), want);
    // Corrupt memory gets the same typed error as a corrupt file.
    let mut bad = TINY.to_vec();
    bad[0] = b'X';
    assert!(matches!(
        Weights::from_memory(bad, &LoadOptions::default()),
        Err(Error::UnknownFormat)
    ));
    assert!(matches!(
        Weights::from_memory(Vec::new(), &LoadOptions::default()),
        Err(Error::EmptyFile { .. } | Error::UnknownFormat | Error::Truncated { .. })
    ));
}

#[test]
fn borrowed_bytes_load_as_views_that_cannot_outlive_them() {
    let m = model();
    // Page-aligned storage, so every tensor is a view (a `Vec<[u8; 4096]>`
    // is only as aligned as the allocator makes it: 16 bytes, often).
    let mut storage = vec![0u8; m.len() + 4096];
    let at = storage.as_ptr().align_offset(4096);
    storage[at..at + m.len()].copy_from_slice(&m);
    let bytes: &[u8] = &storage[at..at + m.len()];
    let want = bytes_of(&Weights::from_memory(m.clone(), &LoadOptions::default()).unwrap());
    let w = Weights::from_slice(bytes, &LoadOptions::default()).unwrap();
    assert_eq!(bytes_of(&w), want);
    assert_eq!(w.report().tensors_copied, 0);
    let base = bytes.as_ptr() as usize;
    for t in w.tensors() {
        let addr = t.host_bytes().unwrap().as_ptr() as usize;
        assert_eq!(
            addr - base,
            t.info().file_offset as usize,
            "a view into the caller's bytes"
        );
    }
    // Routing and device buffer types are not used for borrowed bytes.
    let dev: std::sync::Arc<dyn weightmap::buffer::BufferType> = std::sync::Arc::new(
        weightmap::buffer::SimDeviceBufferType::new(32, usize::MAX)
            .unwrap()
            .with_host_ptr(true),
    );
    let w = Weights::from_slice(bytes, &LoadOptions::default().buffer_type(dev)).unwrap();
    assert!(w.tensors().all(|t| t.buffer().is_host()));
    // Unaligned borrowed bytes: hybrid placement copies what it must.
    let mut odd = vec![0u8; m.len() + 1];
    odd[1..].copy_from_slice(&m);
    let w = Weights::from_slice(&odd[1..], &LoadOptions::default()).unwrap();
    assert_eq!(bytes_of(&w), want);
    drop(w);
    drop(odd);
}
