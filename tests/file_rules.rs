//! What a runtime may do with a model file around a load, on every
//! platform: delete or replace it once the `Weights` drop (Windows refuses
//! both while a view of the file is mapped: ARCHITECTURE.md, "Platforms",
//! safetensors #164 and #574, ollama #17070), and, on Windows,
//! that a mapped file cannot be truncated, so that no mapped read can meet
//! a vanished page.

use std::path::{Path, PathBuf};

use weightmap::gguf::Writer;
use weightmap::{LoadMode, LoadOptions, TensorType, Weights};

/// A one-tensor model of a few pages, and the tensor's bytes.
fn model(dir: &Path, name: &str, fill: u8) -> (PathBuf, Vec<u8>) {
    let data = vec![fill; 256 << 10];
    let mut w = Writer::new(32);
    w.kv_str("general.architecture", "llama");
    w.tensor(
        "w",
        TensorType::F32,
        &[(data.len() / 4) as u64],
        data.clone(),
    );
    let path = dir.join(name);
    std::fs::write(&path, w.to_bytes()).unwrap();
    (path, data)
}

fn load_mapped(path: &Path) -> Weights {
    // SAFETY: each test changes the file only after dropping the weights,
    // or (on Windows) tries a change the system refuses.
    let w = unsafe { Weights::load(path, &LoadOptions::default().fallback(false)) }.unwrap();
    assert_eq!(w.report().mode_used, LoadMode::Mmap);
    w
}

#[test]
fn a_file_can_be_deleted_as_soon_as_its_weights_drop() {
    let dir = tempfile::tempdir().unwrap();
    for streamed in [false, true] {
        let (path, data) = model(dir.path(), "m.gguf", 7);
        let w = if streamed {
            Weights::load_streamed(&path, &LoadOptions::default()).unwrap()
        } else {
            load_mapped(&path)
        };
        // Every page read, the prefetch running or done.
        assert_eq!(w.tensor("w").unwrap().to_vec().unwrap(), data);
        drop(w);
        std::fs::remove_file(&path).unwrap_or_else(|e| panic!("streamed {streamed}: {e}"));
        assert!(!path.exists());
    }
}

#[test]
fn a_file_can_be_replaced_as_soon_as_its_weights_drop() {
    let dir = tempfile::tempdir().unwrap();
    let (path, old) = model(dir.path(), "m.gguf", 1);
    let w = load_mapped(&path);
    assert_eq!(w.tensor("w").unwrap().to_vec().unwrap(), old);
    drop(w);
    let (next, new) = model(dir.path(), "next.gguf", 2);
    std::fs::rename(&next, &path).unwrap();
    let w = load_mapped(&path);
    assert_eq!(w.tensor("w").unwrap().to_vec().unwrap(), new);
}

#[cfg(windows)]
#[test]
fn windows_refuses_to_truncate_a_mapped_file() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = model(dir.path(), "m.gguf", 3);
    let w = load_mapped(&path);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // ERROR_USER_MAPPED_FILE: the view keeps every page of the file.
    assert!(f.set_len(0).is_err());
    assert_eq!(w.tensor("w").unwrap().to_vec().unwrap(), data);
    drop(w);
    f.set_len(0).unwrap();
}
