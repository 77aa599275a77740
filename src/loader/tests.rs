//! Loader tests that need its private seams: no mmap on the platform, a map
//! call that fails, and a file that changes between validation and placement.

use std::path::{Path, PathBuf};

use super::copy::read::FAIL_DIRECT;
use super::mapped::{map_path_on, MapFail, BEFORE_PLACE, FAIL_MAP};
use super::mode::LoadMode;
use super::options::DirectIo;
use super::options::LoadOptions;
use super::report::DirectOutcome;
use super::Weights;
use crate::error::{Error, FallbackReason, Result};
use crate::gguf::Writer;
use crate::types::TensorType;

fn fixture(dir: &Path) -> (PathBuf, Vec<u8>) {
    let mut w = Writer::new(32);
    w.kv_u32("llama.block_count", 1);
    let data: Vec<u8> = (0..64u8).collect();
    w.tensor("w", TensorType::F32, &[16], data.clone());
    w.tensor("v", TensorType::F32, &[16], data.clone());
    let path = dir.join("model.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    (path, data)
}

fn load(path: &Path, opts: &LoadOptions) -> Result<Weights> {
    // SAFETY: the files are changed only by the hooks, before any tensor is
    // handed out.
    unsafe { Weights::load(path, opts) }
}

/// Run `f` with `hook` called before placement, on this thread only.
fn with_hook<T>(hook: fn(&Path), f: impl FnOnce() -> T) -> T {
    BEFORE_PLACE.with(|h| h.set(Some(hook)));
    let out = f();
    BEFORE_PLACE.with(|h| h.set(None));
    out
}

#[test]
fn no_mmap_on_the_platform_is_a_fallback_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = fixture(dir.path());
    // SAFETY: the file is not modified.
    let r = unsafe { map_path_on(&path, &LoadOptions::default(), false) };
    assert!(matches!(
        r,
        Err(MapFail::Fallback(FallbackReason::Unsupported))
    ));
    // SAFETY: as above.
    let r = unsafe { map_path_on(&path, &LoadOptions::default(), true) };
    assert!(r.is_ok());
}

#[test]
fn a_refused_map_call_falls_back_with_the_os_error() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = fixture(dir.path());
    FAIL_MAP.with(|f| f.set(true));
    let w = load(&path, &LoadOptions::default());
    let off = load(&path, &LoadOptions::default().fallback(false));
    FAIL_MAP.with(|f| f.set(false));
    let w = w.unwrap();
    assert_eq!(w.report().mode_used, LoadMode::Stream);
    match &w.report().fallback {
        Some(FallbackReason::Map { error }) => assert_eq!(
            *error,
            std::io::Error::from_raw_os_error(crate::os::REFUSED_MAP_ERROR).to_string()
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(w.tensor("w").unwrap().to_vec().unwrap(), data);
    assert!(matches!(
        off,
        Err(Error::MmapFailed {
            reason: FallbackReason::Map { .. }
        })
    ));
}

#[cfg(not(windows))]
fn truncate_to_half(path: &Path) {
    let len = std::fs::metadata(path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(len / 2).unwrap();
}

// Windows refuses to truncate or replace a mapped file: tests/file_rules.rs.
#[cfg(not(windows))]
#[test]
fn a_truncation_before_placement_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = fixture(dir.path());
    let original = std::fs::read(&path).unwrap();
    let off = with_hook(truncate_to_half, || {
        load(&path, &LoadOptions::default().fallback(false))
    });
    match off {
        Err(Error::MmapFailed {
            reason: FallbackReason::FileChanged { detail },
        }) => assert_eq!(
            detail,
            format!("length {} -> {}", original.len(), original.len() / 2)
        ),
        other => panic!("expected file_changed, got {other:?}"),
    }
    // With fallback, the stream path finds the file truncated; the error
    // names both causes.
    std::fs::write(&path, &original).unwrap();
    let err = with_hook(truncate_to_half, || load(&path, &LoadOptions::default())).unwrap_err();
    match &err {
        Error::FallbackFailed { reason, source } => {
            assert_eq!(reason.name(), "file_changed");
            assert!(
                matches!(
                    **source,
                    Error::Truncated { .. } | Error::TensorOutOfBounds { .. }
                ),
                "{source:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.starts_with("mapping failed (the file changed")
            && msg.contains("then streaming failed"),
        "{msg}"
    );
}

fn rewrite_tensor_bytes(path: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    // Let the modification time move even on a coarse clock.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let raw = std::fs::read(path).unwrap();
    let h = crate::Header::parse(&raw).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    for t in h.tensors() {
        let r = t.file_range();
        f.seek(SeekFrom::Start(r.start)).unwrap();
        f.write_all(&vec![0xA5; (r.end - r.start) as usize])
            .unwrap();
    }
}

#[test]
fn a_same_length_rewrite_before_placement_is_noticed_by_its_mtime() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = fixture(dir.path());
    let off = with_hook(rewrite_tensor_bytes, || {
        load(&path, &LoadOptions::default().fallback(false))
    });
    assert!(
        matches!(&off, Err(Error::MmapFailed { reason: FallbackReason::FileChanged { detail } }) if detail == "modification time changed"),
        "{off:?}"
    );
    // With fallback, the stream path reads the file as it now is.
    let (path, _) = fixture(dir.path());
    let w = with_hook(rewrite_tensor_bytes, || {
        load(&path, &LoadOptions::default())
    })
    .unwrap();
    assert_eq!(w.report().mode_used, LoadMode::Stream);
    assert_eq!(w.tensor("w").unwrap().to_vec().unwrap(), vec![0xA5; 64]);
}

#[cfg(not(windows))]
fn replace_path(path: &Path) {
    let tmp = path.with_extension("new");
    std::fs::copy(path, &tmp).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

// Windows refuses to truncate or replace a mapped file: tests/file_rules.rs.
#[cfg(not(windows))]
#[test]
fn a_path_that_now_names_another_file_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = fixture(dir.path());
    let off = with_hook(replace_path, || {
        load(&path, &LoadOptions::default().fallback(false))
    });
    assert!(
        matches!(&off, Err(Error::MmapFailed { reason: FallbackReason::FileChanged { detail } }) if detail.contains("another file")),
        "{off:?}"
    );
}

#[test]
fn a_filesystem_refusing_direct_io_is_read_buffered_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    // Over the direct-read minimum.
    let mut w = Writer::new(32);
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    w.tensor("w", TensorType::F32, &[1 << 18], data.clone());
    w.tensor("v", TensorType::F32, &[1 << 18], data.clone());
    let path = dir.path().join("big.gguf");
    std::fs::write(&path, w.to_bytes()).unwrap();
    FAIL_DIRECT.with(|f| f.set(true));
    let w = Weights::load_streamed(&path, &LoadOptions::default().direct_io(DirectIo::On));
    FAIL_DIRECT.with(|f| f.set(false));
    let w = w.unwrap();
    match &w.report().read.as_ref().unwrap().direct {
        DirectOutcome::Refused { error } => assert!(error.contains("injected"), "{error}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(w.tensor("w").unwrap().to_vec().unwrap(), data);
    assert_eq!(w.tensor("v").unwrap().to_vec().unwrap(), data);
}
