//! The loader: byte-identical tensors in both modes, every fallback cause,
//! the mapping's lifetime, typed views and the read-only rule.

mod common;

use std::path::{Path, PathBuf};

use common::pattern;
use std::sync::Arc;

use weightmap::buffer::{BufferType, CpuBufferType, SimDeviceBufferType};
use weightmap::gguf::Writer;
use weightmap::{
    Error, FallbackReason, Format, LoadMode, LoadOptions, Prefetch, TensorType, Weights,
};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

/// A file with one tensor of every ggml type, two rows of two blocks each.
fn every_type_file(dir: &Path, alignment: u64) -> PathBuf {
    let mut w = Writer::new(alignment);
    w.kv_str("general.architecture", "test");
    for (i, ty) in TensorType::ALL.iter().enumerate() {
        if ty.ggml_id().is_none() {
            continue;
        }
        let ne0 = ty.block_size() * 2;
        let n = ty.bytes_for(ne0 * 2).unwrap() as usize;
        w.tensor(&format!("t.{}", ty.name()), *ty, &[ne0, 2], pattern(i, n));
    }
    let path = dir.join(format!("every-type-a{alignment}.gguf"));
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

fn load(path: &Path, opts: &LoadOptions) -> weightmap::Result<Weights> {
    // SAFETY: test files are not modified while loaded (except by the tests
    // that do so on purpose, through the hook, before any tensor is handed out).
    unsafe { Weights::load(path, opts) }
}

fn all_bytes(w: &Weights) -> Vec<(String, Vec<u8>)> {
    w.tensors()
        .map(|t| (t.name().to_owned(), t.to_vec().unwrap()))
        .collect()
}

/// The tensor bytes straight from the file, by descriptor.
fn file_bytes(path: &Path, w: &Weights) -> Vec<(String, Vec<u8>)> {
    let raw = std::fs::read(path).unwrap();
    w.tensor_infos()
        .map(|t| {
            (
                t.name.to_owned(),
                raw[t.file_range().start as usize..t.file_range().end as usize].to_vec(),
            )
        })
        .collect()
}

#[test]
fn every_ggml_type_is_byte_identical_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let path = every_type_file(dir.path(), 32);
    let m = load(&path, &LoadOptions::default()).unwrap();
    let s = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    assert_eq!(m.report().mode_used, LoadMode::Mmap);
    assert_eq!(m.report().fallback, None);
    assert_eq!(s.report().mode_used, LoadMode::Stream);
    assert_eq!(m.len(), 35);
    assert_eq!(all_bytes(&m), all_bytes(&s));
    assert_eq!(all_bytes(&m), file_bytes(&path, &m));
    // The mapped path copies nothing; the stream path copies every tensor byte.
    let tensor_bytes: u64 = m.tensor_infos().map(|t| t.nbytes).sum();
    assert_eq!(m.report().bytes_copied, 0);
    assert!(m.report().bytes_mapped >= tensor_bytes);
    assert!(s.report().bytes_copied >= tensor_bytes);
    // Mapped tensors point into the mapping, at their file offsets.
    let mw = m.mapped().unwrap();
    let base = mw.file_bytes().as_ptr() as usize;
    for t in m.tensors() {
        let addr = t.host_bytes().unwrap().as_ptr() as usize;
        assert_eq!(addr - base, t.info().file_offset as usize, "{}", t.name());
        assert_eq!(addr % 32, 0);
    }
    assert!(!m.buffer().owns_memory());
    assert!(s.buffer().owns_memory());
}

#[test]
fn python_fixtures_are_byte_identical_in_both_modes() {
    for name in [
        "tiny-llama.gguf",
        "quant-types.gguf",
        "empty.gguf",
        "tiny.safetensors",
        "odd-offsets.safetensors",
        "bf16.safetensors",
    ] {
        let path = testdata(name);
        let m = load(&path, &LoadOptions::default()).unwrap();
        let s = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
        assert_eq!(
            m.report().mode_used,
            LoadMode::Mmap,
            "{name}: {:?}",
            m.report().fallback
        );
        assert_eq!(all_bytes(&m), all_bytes(&s), "{name}");
        assert_eq!(all_bytes(&m), file_bytes(&path, &m), "{name}");
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(testdata(&format!("{name}.json"))).unwrap())
                .unwrap();
        assert_eq!(
            manifest["tensors"].as_array().unwrap().len(),
            m.len(),
            "{name}"
        );
    }
}

#[test]
fn safetensors_at_odd_offsets_load_zero_copy() {
    // The reference writer starts data at 400 here: 8-aligned, not 32.
    let path = testdata("odd-offsets.safetensors");
    let m = load(&path, &LoadOptions::default()).unwrap();
    assert_eq!(m.format(), Format::Safetensors);
    assert_eq!(m.report().mode_used, LoadMode::Mmap);
    assert!(m
        .tensor_infos()
        .any(|t| t.file_offset % 32 != 0 && t.nbytes > 0));
}

#[test]
fn weak_alignment_copies_only_the_misaligned_tensors() {
    // GGUF allows general.alignment = 8; the CPU buffer type wants 32.
    let path = testdata("align8.gguf");
    let m = load(&path, &LoadOptions::default()).unwrap();
    let r = m.report();
    assert_eq!(r.mode_requested, LoadMode::Mmap);
    assert_eq!(r.mode_used, LoadMode::Mmap);
    assert_eq!(r.fallback, None);
    // Exactly the tensors whose address is off 32 are copied, each named
    // with its address; the rest stay in the mapping.
    let base = m.mapped().unwrap().file_bytes().as_ptr() as usize;
    let misaligned: Vec<&str> = m
        .tensor_infos()
        .filter(|t| (base + t.file_offset as usize) % 32 != 0)
        .map(|t| t.name)
        .collect();
    assert!(misaligned.contains(&"b.f16x5"), "{misaligned:?}");
    let copied: Vec<&str> = r.copied.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(copied, misaligned);
    assert!(r.copied.iter().all(|c| matches!(
        c.reason,
        weightmap::CopyReason::Misaligned { alignment: 32, address } if address % 32 != 0
    )));
    assert_eq!(r.tensors_copied, misaligned.len());
    assert_eq!(r.tensors_mapped + r.tensors_copied, m.len());
    let copied_bytes: u64 = m
        .tensor_infos()
        .filter(|t| misaligned.contains(&t.name))
        .map(|t| t.nbytes)
        .sum();
    assert_eq!(r.bytes_copied, copied_bytes);
    for t in m.tensors() {
        let addr = t.host_bytes().unwrap().as_ptr() as usize;
        assert_eq!(addr % 32, 0, "{}: every tensor is 32-aligned now", t.name());
        let copied = misaligned.contains(&t.name());
        assert_eq!(
            t.placement_kind() == weightmap::PlacementKind::Copied,
            copied
        );
        if !copied {
            assert_eq!(addr - base, t.info().file_offset as usize);
        }
    }
    let s = Weights::load_streamed(&path, &LoadOptions::default()).unwrap();
    assert_eq!(all_bytes(&m), all_bytes(&s));
    assert_eq!(all_bytes(&m), file_bytes(&path, &m));
    // Streamed tensors sit at the buffer type's alignment.
    for t in s.tensors() {
        assert_eq!(t.host_bytes().unwrap().as_ptr() as usize % 32, 0);
    }
    // All or nothing: the first misaligned tensor sends everything to the
    // stream path, and says which.
    let all = load(&path, &LoadOptions::default().require_all_mapped(true)).unwrap();
    assert_eq!(all.report().mode_used, LoadMode::Stream);
    match &all.report().fallback {
        Some(FallbackReason::Misaligned {
            tensor,
            alignment,
            file_offset,
            ..
        }) => {
            assert_eq!(tensor, "b.f16x5");
            assert_eq!(*alignment, 32);
            assert_eq!(*file_offset, 496);
        }
        other => panic!("expected misaligned, got {other:?}"),
    }
    assert_eq!(all_bytes(&all), all_bytes(&s));
    // With an 8-byte buffer type the same file maps whole.
    let opts =
        LoadOptions::default().buffer_type(Arc::new(CpuBufferType::with_alignment(8).unwrap()));
    let m8 = load(&path, &opts).unwrap();
    assert_eq!(m8.report().mode_used, LoadMode::Mmap);
    assert_eq!(m8.report().tensors_copied, 0);
    assert_eq!(all_bytes(&m8), all_bytes(&s));
}
#[test]
fn every_type_at_alignment_8_is_identical_with_hybrid_placement() {
    let dir = tempfile::tempdir().unwrap();
    let path = every_type_file(dir.path(), 8);
    let m = load(&path, &LoadOptions::default()).unwrap();
    assert_eq!(m.report().fallback, None);
    assert!(m.report().tensors_copied > 0 && m.report().tensors_mapped > 0);
    assert_eq!(all_bytes(&m), file_bytes(&path, &m));
    // Every buffer's alignment holds for every tensor in it.
    for t in m.tensors() {
        let addr = t.host_bytes().unwrap().as_ptr() as usize;
        assert_eq!(addr % t.buffer().alignment(), 0, "{}", t.name());
        assert_eq!(addr % t.placement().alignment, 0, "{}", t.name());
    }
}
#[test]
fn fallback_off_returns_the_reason() {
    let opts = LoadOptions::default()
        .fallback(false)
        .require_all_mapped(true);
    match load(&testdata("align8.gguf"), &opts) {
        Err(Error::MmapFailed {
            reason: FallbackReason::Misaligned { tensor, .. },
        }) => assert_eq!(tensor, "b.f16x5"),
        other => panic!("expected MmapFailed, got {other:?}"),
    }
}
#[test]
fn non_host_buffer_type_streams_through_set() {
    let path = testdata("tiny-llama.gguf");
    let dev = SimDeviceBufferType::new(256, 1 << 20).unwrap();
    let opts = LoadOptions::default()
        .buffer_type(Arc::new(dev))
        .staging_bytes(64);
    let w = load(&path, &opts).unwrap();
    assert_eq!(w.report().mode_used, LoadMode::Stream);
    assert_eq!(
        w.report().fallback,
        Some(FallbackReason::NotHostBuffer {
            buffer_type: "SimDevice".into()
        })
    );
    assert!(!w.buffer().is_host());
    let first = w.tensor_at(0).unwrap();
    assert!(first.host_bytes().is_none());
    assert!(matches!(first.view::<f32>(), Err(Error::NotHost { .. })));
    for t in w.tensors() {
        assert_eq!(t.placement().offset % 256, 0);
    }
    assert_eq!(all_bytes(&w), file_bytes(&path, &w));
}

#[test]
fn device_buffer_too_small_is_an_error() {
    let dev = SimDeviceBufferType::new(32, 100).unwrap();
    let opts = LoadOptions::default().buffer_type(Arc::new(dev));
    // The device cannot view the mapping (a fallback), then the stream
    // path finds its buffer too small: the error names both.
    match load(&testdata("tiny-llama.gguf"), &opts) {
        Err(Error::FallbackFailed { reason, source }) => {
            assert_eq!(reason.name(), "not_host");
            assert!(
                matches!(*source, Error::BufferTooLarge { .. }),
                "{source:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        Weights::load_streamed(testdata("tiny-llama.gguf"), &opts),
        Err(Error::BufferTooLarge { .. })
    ));
}

#[test]
fn missing_file_is_an_io_error_with_its_kind_in_either_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.gguf");
    assert!(matches!(
        load(&path, &LoadOptions::default()),
        Err(Error::Io { op: "stat", .. })
    ));
    // Not a fallback reason: the same error with its io::ErrorKind.
    let opts = LoadOptions::default().fallback(false);
    assert!(matches!(
        load(&path, &opts),
        Err(Error::Io { op: "stat", ref source, .. }) if source.kind() == std::io::ErrorKind::NotFound
    ));
}

#[test]
fn empty_file_is_refused_before_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.gguf");
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        load(&path, &LoadOptions::default()),
        Err(Error::EmptyFile { .. })
    ));
    let opts = LoadOptions::default().fallback(false);
    assert!(matches!(load(&path, &opts), Err(Error::EmptyFile { .. })));
}

#[test]
fn directory_is_not_a_file_in_either_mode() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        load(dir.path(), &LoadOptions::default()),
        Err(Error::NotAFile { .. })
    ));
    assert!(matches!(
        Weights::load_streamed(dir.path(), &LoadOptions::default()),
        Err(Error::NotAFile { .. })
    ));
    let opts = LoadOptions::default().fallback(false);
    assert!(matches!(
        load(dir.path(), &opts),
        Err(Error::NotAFile { .. })
    ));
}

#[cfg(unix)]
#[test]
fn fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fifo");
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // Opening a FIFO for reading would block until a writer appears; the
    // loader must refuse it before opening.
    assert!(matches!(
        load(&path, &LoadOptions::default()),
        Err(Error::NotAFile { .. })
    ));
}

/// A file the kernel reports as regular with a nonzero size, but whose
/// filesystem refuses mmap: sysfs attributes.
#[cfg(target_os = "linux")]
#[test]
fn filesystem_refusing_mmap_falls_back() {
    let candidates = [
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/sys/kernel/profiling",
        "/sys/power/state",
        "/sys/kernel/uevent_seqnum",
    ];
    let Some(path) = candidates
        .iter()
        .map(Path::new)
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() > 0))
    else {
        eprintln!(
            "SKIPPED filesystem_refusing_mmap_falls_back: no sysfs attribute here \
             (the loader's unit test a_refused_map_call_falls_back_with_the_os_error \
             covers the path with an injected ENODEV)"
        );
        return;
    };
    let opts = LoadOptions::default().fallback(false);
    match load(path, &opts) {
        Err(Error::MmapFailed {
            reason: FallbackReason::Map { .. },
        }) => {}
        other => panic!(
            "expected a map failure on {}, got {other:?}",
            path.display()
        ),
    }
    // With fallback the stream path reads it and finds it is not a model;
    // the error names both causes.
    match load(path, &LoadOptions::default()) {
        Err(Error::FallbackFailed { reason, source }) => assert!(
            reason.name() == "map"
                && matches!(
                    *source,
                    Error::UnknownFormat
                        | Error::BadMagic { .. }
                        | Error::Truncated { .. }
                        | Error::Io { .. }
                ),
            "{source:?}"
        ),
        Err(e) => assert!(
            matches!(
                e,
                Error::UnknownFormat
                    | Error::BadMagic { .. }
                    | Error::Truncated { .. }
                    | Error::Io { .. }
            ),
            "{e:?}"
        ),
        Ok(_) => panic!("a sysfs attribute loaded as a model"),
    }
}

/// A valid file, then the same file with its last tensor one byte short.
fn short_file(dir: &Path) -> PathBuf {
    let mut w = Writer::new(32);
    w.tensor("a", TensorType::F32, &[8], pattern(1, 32));
    w.tensor("b", TensorType::F32, &[9], pattern(2, 36));
    let mut bytes = w.to_bytes();
    let file = weightmap::gguf::GgufHeader::parse(&bytes).unwrap();
    let end = file.tensors().get(1).unwrap().file_range().end as usize;
    bytes.truncate(end - 1);
    let path = dir.join("short.gguf");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn corruption_gives_the_same_error_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let path = short_file(dir.path());
    let mapped = load(&path, &LoadOptions::default()).unwrap_err();
    let streamed = Weights::load_streamed(&path, &LoadOptions::default()).unwrap_err();
    assert!(matches!(mapped, Error::TensorOutOfBounds { ref tensor, .. } if tensor == "b"));
    assert_eq!(mapped.to_string(), streamed.to_string());
    // Corruption is an error, not a fallback reason: the same without fallback.
    let opts = LoadOptions::default().fallback(false);
    assert!(matches!(
        load(&path, &opts),
        Err(Error::TensorOutOfBounds { ref tensor, .. }) if tensor == "b"
    ));

    // A header error: bad magic.
    let bad = dir.path().join("bad.gguf");
    let mut bytes = std::fs::read(testdata("tiny-llama.gguf")).unwrap();
    bytes[0] = b'X';
    std::fs::write(&bad, &bytes).unwrap();
    let mapped = load(&bad, &LoadOptions::default()).unwrap_err();
    let streamed = Weights::load_streamed(&bad, &LoadOptions::default()).unwrap_err();
    assert_eq!(mapped.name(), streamed.name());
    assert_eq!(mapped.to_string(), streamed.to_string());
    assert!(matches!(load(&bad, &opts), Err(Error::UnknownFormat)));
}

#[test]
fn mapped_buffers_view_the_mapping_and_own_nothing() {
    let path = testdata("tiny-llama.gguf");
    let w = load(&path, &LoadOptions::default()).unwrap();
    let base = w.mapped().unwrap().file_bytes().as_ptr() as usize;
    let b = w.buffer();
    assert_eq!(b.type_name(), "CPU_Mapped");
    assert!(!b.owns_memory() && b.is_host());
    assert!(
        b.base_addr() >= base && b.base_addr() + b.size() <= base + w.report().file_len as usize
    );
    assert_eq!(w.buffers().count(), 1);
    assert_eq!(w.report().buffers.len(), 1);
    assert!(w.report().buffers[0].mapped);
    // The handles borrow the weights: none can outlive them (see the
    // compile_fail examples on `Weights` and `MappedBuffer`).
    let t = w.tensor("token_embd.weight").unwrap();
    let p = t.placement();
    let mut out = vec![0u8; p.len];
    b.get(p.offset, &mut out).unwrap();
    assert_eq!(out, t.to_vec().unwrap());
    assert_eq!(
        &b.host_bytes().unwrap()[p.offset..p.offset + p.len],
        &out[..]
    );
}
#[test]
fn mapped_weights_are_read_only_and_copies_are_writable() {
    let path = testdata("tiny-llama.gguf");
    let w = load(&path, &LoadOptions::default()).unwrap();
    // No `&mut` to a loaded buffer exists (and MappedBuffer refuses writes:
    // the buffer module's unit tests).
    let t = w.tensor("token_embd.weight").unwrap();
    let before = t.view::<f32>().unwrap().to_vec();
    let mut owned = t.to_owned_tensor().unwrap();
    for x in owned.view_mut::<f32>().unwrap() {
        *x *= 2.0;
    }
    assert_eq!(
        t.view::<f32>().unwrap(),
        &before[..],
        "the mapped weight changed"
    );
    assert_eq!(owned.view::<f32>().unwrap()[1], before[1] * 2.0);
}

#[test]
fn metadata_and_lookup_work_in_both_modes() {
    let path = testdata("tiny-llama.gguf");
    for w in [
        load(&path, &LoadOptions::default()).unwrap(),
        Weights::load_streamed(&path, &LoadOptions::default()).unwrap(),
    ] {
        let md = w.gguf_metadata().unwrap();
        assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(md.get_u32("llama.block_count").unwrap(), 1);
        let tokens = md.get_array("tokenizer.ggml.tokens").unwrap();
        assert_eq!(tokens.strings().unwrap().count() as u64, tokens.len());
        assert!(matches!(
            w.tensor("nope"),
            Err(Error::TensorNotFound { .. })
        ));
        let names: Vec<&str> = w.tensors().map(|t| t.name()).collect();
        let infos: Vec<&str> = w.tensor_infos().map(|t| t.name).collect();
        assert_eq!(names, infos);
        assert!(w.safetensors_metadata().is_none());
    }
    let st = load(&testdata("tiny.safetensors"), &LoadOptions::default()).unwrap();
    assert_eq!(
        st.safetensors_metadata()
            .unwrap()
            .get("format")
            .map(String::as_str),
        Some("pt")
    );
    assert!(st.gguf_metadata().is_none());
}

#[test]
fn prefetch_advice_and_lock_options_keep_bytes_identical() {
    let dir = tempfile::tempdir().unwrap();
    let path = every_type_file(dir.path(), 32);
    let plain = all_bytes(&load(&path, &LoadOptions::default()).unwrap());
    // Their effect on the page cache and the mapping is asserted in
    // tests/ready.rs (mincore, smaps VmFlags); here, that the report says
    // what ran and the bytes do not change.
    for (prefetch, advice, kind) in [
        (
            Prefetch::WillNeed,
            weightmap::AccessAdvice::Sequential,
            "willneed",
        ),
        (
            Prefetch::Populate,
            weightmap::AccessAdvice::Normal,
            "populated",
        ),
        (Prefetch::None, weightmap::AccessAdvice::Random, "off"),
    ] {
        let opts = LoadOptions::default()
            .prefetch(prefetch)
            .advice(weightmap::AdvicePolicy::Uniform(advice));
        let w = load(&path, &opts).unwrap();
        assert_eq!(w.report().mode_used, LoadMode::Mmap);
        assert_eq!(w.report().prefetch.name(), kind);
        assert_eq!(all_bytes(&w), plain);
    }
    // mlock: either it works, or the error names RLIMIT_MEMLOCK.
    let opts = LoadOptions::default().mlock(true);
    match load(&path, &opts) {
        Ok(w) => assert_eq!(all_bytes(&w), plain),
        Err(e @ Error::Mlock { .. }) => assert!(e.to_string().contains("RLIMIT_MEMLOCK")),
        Err(e) => panic!("unexpected {e:?}"),
    }
}

#[test]
fn page_aligned_buffer_type_streams_at_4096() {
    let path = testdata("tiny-llama.gguf");
    let opts =
        LoadOptions::default().buffer_type(Arc::new(CpuBufferType::with_alignment(4096).unwrap()));
    let s = Weights::load_streamed(&path, &opts).unwrap();
    for t in s.tensors() {
        assert_eq!(t.host_bytes().unwrap().as_ptr() as usize % 4096, 0);
    }
    assert_eq!(all_bytes(&s), file_bytes(&path, &s));
    assert_eq!(CpuBufferType::with_alignment(4096).unwrap().name(), "CPU");
}
