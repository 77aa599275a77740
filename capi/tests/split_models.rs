//! Models in several files through the C ABI, called from Rust as C calls
//! it: the llama.cpp split GGUF loaded from each shard (the later ones
//! too), and the sharded safetensors index, mapped and streamed. Every
//! tensor of the model, whichever shard holds it, is found by name and by
//! index with its own file's bytes, dims and strides.
//!
//! The ground truth is each shard's own header (`weightmap::Header::parse`
//! of that one file) and the file's bytes at `file_offset..+nbytes`; the
//! names and their shards come from testdata/shards/manifest.json.

use std::collections::BTreeSet;
use std::ffi::{c_int, CStr, CString};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::ptr::null_mut;

use serde_json::Value;
use weightmap::{Header, TensorType};
use weightmap_capi::*;

fn shards_dir() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/shards")).to_path_buf()
}

fn manifest() -> Value {
    serde_json::from_slice(&std::fs::read(shards_dir().join("manifest.json")).unwrap()).unwrap()
}

/// One tensor as its own shard describes it.
struct Expected {
    name: String,
    shard: PathBuf,
    ty: TensorType,
    ne: Vec<u64>,
    file_offset: u64,
    nbytes: u64,
    bytes: Vec<u8>,
}

/// Every tensor of the model whose shards the manifest lists under `key`
/// (files in `dir`), shard by shard in shard order, each in its file's own
/// order.
fn expected(key: &str, dir: &Path) -> Vec<Expected> {
    let m = manifest();
    let m = m[key].as_object().unwrap();
    let files: BTreeSet<&str> = m.values().map(|v| v["shard"].as_str().unwrap()).collect();
    let mut out = Vec::new();
    for f in files {
        let shard = dir.join(f);
        let file = std::fs::read(&shard).unwrap();
        let header = Header::parse(&file).unwrap_or_else(|e| panic!("{f} alone: {e}"));
        for t in header.tensors().iter() {
            assert_eq!(m[t.name]["shard"], f, "{}: the manifest's shard", t.name);
            out.push(Expected {
                name: t.name.to_owned(),
                shard: shard.clone(),
                ty: t.ty,
                ne: t.ne(),
                file_offset: t.file_offset,
                nbytes: t.nbytes,
                bytes: file[t.file_offset as usize..(t.file_offset + t.nbytes) as usize].to_vec(),
            });
        }
    }
    let names: BTreeSet<&str> = out.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, m.keys().map(String::as_str).collect::<BTreeSet<_>>());
    assert_eq!(out.len(), m.len());
    assert!(
        out.iter().any(|e| e.shard != out[0].shard),
        "several shards"
    );
    out
}

fn last_error() -> String {
    let p = wm_last_error();
    assert!(!p.is_null(), "an error message was set");
    // SAFETY: a non-null `wm_last_error` is a C string valid until the next
    // failing call on this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Weights from `wm_load`, released by `wm_free` on drop.
struct Loaded(*mut wm_weights);

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: from `wm_load`, freed once.
        unsafe { wm_free(self.0) };
    }
}

fn load(path: &Path, mode: u32) -> Loaded {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    let mut o = wm_options_default();
    o.mode = mode;
    let mut out = null_mut();
    // SAFETY: a C string, live options, a pointer to write. In mmap mode
    // the committed fixtures are not modified or truncated until `wm_free`.
    let rc = unsafe { wm_load(c.as_ptr(), &o, &mut out) };
    assert_eq!(
        rc,
        WM_OK,
        "wm_load({}, mode {mode}): {}",
        path.display(),
        last_error()
    );
    assert!(!out.is_null());
    Loaded(out)
}

fn by_name(w: &Loaded, name: &str) -> Result<wm_tensor, (c_int, String)> {
    let name = CString::new(name).unwrap();
    let mut t = MaybeUninit::<wm_tensor>::uninit();
    // SAFETY: live weights, a C string, room for a wm_tensor.
    let rc = unsafe { wm_tensor_by_name(w.0, name.as_ptr(), t.as_mut_ptr()) };
    if rc == WM_OK {
        // SAFETY: WM_OK means `*out` was written.
        Ok(unsafe { t.assume_init() })
    } else {
        Err((rc, last_error()))
    }
}

fn at(w: &Loaded, i: u64) -> Result<wm_tensor, (c_int, String)> {
    let mut t = MaybeUninit::<wm_tensor>::uninit();
    // SAFETY: live weights, room for a wm_tensor.
    let rc = unsafe { wm_tensor_at(w.0, i, t.as_mut_ptr()) };
    if rc == WM_OK {
        // SAFETY: WM_OK means `*out` was written.
        Ok(unsafe { t.assume_init() })
    } else {
        Err((rc, last_error()))
    }
}

fn name_of(t: &wm_tensor) -> &str {
    // SAFETY: `name` is a C string while the weights live, which the
    // callers' borrows of `Loaded` outlive.
    unsafe { CStr::from_ptr(t.name) }.to_str().unwrap()
}

fn bytes_of(t: &wm_tensor) -> &[u8] {
    // SAFETY: `data` holds `nbytes` bytes while the weights live, which
    // the callers' borrows of `Loaded` outlive.
    unsafe { std::slice::from_raw_parts(t.data.cast::<u8>(), t.nbytes as usize) }
}

/// `t` is `e`: name, type, dims, ggml strides, size, offset in its own
/// shard, and the bytes of that shard.
fn check(t: &wm_tensor, e: &Expected, what: &str) {
    assert_eq!(name_of(t), e.name, "{what}");
    let id = e.ty.ggml_id().map_or(-1, |id| id as i32);
    assert_eq!(t.ggml_type, id, "{what}: {}", e.name);
    assert_eq!(t.n_dims as usize, e.ne.len(), "{what}: {}", e.name);
    let mut ne = [1i64; 4];
    for (slot, d) in ne.iter_mut().zip(&e.ne) {
        *slot = *d as i64;
    }
    assert_eq!(t.ne, ne, "{what}: {}", e.name);
    let mut nb = [e.ty.type_size(), 0, 0, 0];
    nb[1] = nb[0] * (ne[0] as u64 / e.ty.block_size());
    nb[2] = nb[1] * ne[1] as u64;
    nb[3] = nb[2] * ne[2] as u64;
    assert_eq!(t.nb, nb, "{what}: {}", e.name);
    assert_eq!(t.nbytes, e.nbytes, "{what}: {}", e.name);
    assert_eq!(
        t.file_offset,
        e.file_offset,
        "{what}: {} (in {})",
        e.name,
        e.shard.display()
    );
    assert_eq!(
        bytes_of(t),
        &e.bytes[..],
        "{what}: {} (in {})",
        e.name,
        e.shard.display()
    );
}

/// Everything the C ABI says about every tensor of `w`.
fn check_model(w: &Loaded, want: &[Expected], mode: u32, what: &str) {
    // SAFETY: live weights.
    let (count, used) = unsafe { (wm_tensor_count(w.0), wm_mode_used(w.0)) };
    assert_eq!(count, want.len() as u64, "{what}");
    assert_eq!(used, mode as c_int, "{what}: wm_mode_used");
    for (i, e) in want.iter().enumerate() {
        let t = by_name(w, &e.name).unwrap_or_else(|(rc, msg)| {
            panic!("{what}: wm_tensor_by_name({}): {rc} {msg}", e.name)
        });
        check(&t, e, what);
        let a = at(w, i as u64)
            .unwrap_or_else(|(rc, msg)| panic!("{what}: wm_tensor_at({i}): {rc} {msg}"));
        check(&a, e, what);
        // The same tensor: the same pointers.
        assert_eq!((a.name, a.data), (t.name, t.data), "{what}: {}", e.name);

        let mut mapped: c_int = -1;
        // SAFETY: live weights, an int to write.
        assert_eq!(
            unsafe { wm_tensor_is_mapped(w.0, i as u64, &mut mapped) },
            WM_OK
        );
        if mode == WM_MODE_STREAM {
            assert_eq!(mapped, 0, "{what}: {} is copied in stream mode", e.name);
        } else {
            assert!(mapped == 0 || mapped == 1, "{what}: {}", e.name);
        }
    }
    // Past the end, and names no shard holds.
    let (rc, msg) = at(w, count).unwrap_err();
    assert_eq!(rc, WM_ERR_BAD_ARGUMENT, "{what}: {msg}");
    for missing in ["no.such.tensor", "blk.1.attn_q", "blk.9.attn_q.weight", ""] {
        let (rc, msg) = by_name(w, missing).unwrap_err();
        assert_eq!(rc, WM_ERR_NOT_FOUND, "{what}: {missing}: {msg}");
        assert!(msg.contains(&format!("'{missing}'")), "{what}: {msg}");
    }
}

#[test]
fn c_abi_finds_every_tensor_of_a_split_gguf_from_any_shard() {
    let want = expected("gguf", &shards_dir());
    for shard in [2, 3, 1] {
        let p = shards_dir().join(format!("split-0000{shard}-of-00003.gguf"));
        for mode in [WM_MODE_MMAP, WM_MODE_STREAM] {
            let what = format!("split GGUF from shard {shard}, mode {mode}");
            let w = load(&p, mode);
            check_model(&w, &want, mode, &what);
            // In mmap mode the GGUF's 32-aligned tensors are all viewed in
            // place, in every shard's own mapping.
            if mode == WM_MODE_MMAP {
                for i in 0..want.len() as u64 {
                    let mut mapped: c_int = -1;
                    // SAFETY: live weights, an int to write.
                    unsafe { wm_tensor_is_mapped(w.0, i, &mut mapped) };
                    assert_eq!(mapped, 1, "{what}: {}", want[i as usize].name);
                }
            }
            // Metadata is the first shard's, whichever shard was named.
            let key = CString::new("split.no").unwrap();
            let mut no = u64::MAX;
            // SAFETY: live weights, a C string, a u64 to write.
            let rc = unsafe { wm_meta_u64(w.0, key.as_ptr(), &mut no) };
            assert_eq!((rc, no), (WM_OK, 0), "{what}");
        }
    }
}

#[test]
fn c_abi_finds_every_tensor_of_a_sharded_safetensors_index() {
    let dir = shards_dir().join("hf");
    let want = expected("safetensors", &dir);
    for p in [dir.join("model.safetensors.index.json"), dir.clone()] {
        for mode in [WM_MODE_MMAP, WM_MODE_STREAM] {
            let what = format!("{}, mode {mode}", p.display());
            let w = load(&p, mode);
            check_model(&w, &want, mode, &what);
        }
    }
}

/// The data pointers of tensors in different shards stay valid, and
/// distinct, while the weights live: several files, several mappings.
#[test]
fn c_abi_tensor_pointers_of_every_shard_stay_valid_until_free() {
    let want = expected("gguf", &shards_dir());
    for mode in [WM_MODE_MMAP, WM_MODE_STREAM] {
        let w = load(&shards_dir().join("split-00003-of-00003.gguf"), mode);
        let all: Vec<wm_tensor> = want.iter().map(|e| by_name(&w, &e.name).unwrap()).collect();
        // Look every name up again, then read every earlier result.
        for e in &want {
            by_name(&w, &e.name).unwrap();
        }
        let mut datas = BTreeSet::new();
        for (t, e) in all.iter().zip(&want) {
            check(t, e, &format!("mode {mode}, after more lookups"));
            if t.nbytes > 0 {
                assert!(
                    datas.insert(t.data as usize),
                    "{}: a shared data pointer",
                    e.name
                );
            }
        }
    }
}
