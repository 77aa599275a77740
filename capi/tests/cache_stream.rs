//! The transform cache through the C ABI with `wm_options.mode` = stream:
//! an entry that a mapped load filled is a hit for a streamed load, which
//! neither rewrites nor replaces it, and holds the transform's bytes.
//! (The check once hashed the loaded header's own bytes, which in stream
//! mode stop short of the padding the stored checksum covers: every
//! streamed cached load wrote the entry again, then failed with "the
//! header's checksum does not match".)

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicU32, Ordering};

use weightmap_capi::*;

/// Weights that `wm_free` releases on drop.
struct Loaded(*mut wm_weights);

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: from `wm_load` or `wm_cache_load`, freed once.
        unsafe { wm_free(self.0) };
    }
}

fn fixture(name: &str) -> CString {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata")
        .join(name);
    CString::new(path.to_str().unwrap()).unwrap()
}

fn last_error() -> String {
    let p = wm_last_error();
    assert!(!p.is_null(), "an error message was set");
    // SAFETY: a non-null `wm_last_error` is a C string valid until the next
    // failing call on this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn text(p: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: a report's strings are C strings while its weights live.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Each byte XOR 0xA5: an output that differs from its source everywhere
/// a byte is not 0xA5's complement, so a load of the source instead of the
/// entry shows. `user` counts the calls.
unsafe extern "C" fn xor_apply(
    user: *mut c_void,
    src: *const wm_tensor,
    dst: *mut c_void,
    dst_size: usize,
) -> c_int {
    // SAFETY: `user` is the test's counter and `src` is valid for the
    // call, as `wm_apply_fn` promises.
    let (calls, src) = unsafe { (&*user.cast::<AtomicU32>(), &*src) };
    calls.fetch_add(1, Ordering::Relaxed);
    if src.nbytes != dst_size as u64 {
        return 1;
    }
    if dst_size == 0 {
        return 0;
    }
    // SAFETY: `src->data` holds `src->nbytes` bytes and `dst` is valid for
    // writing `dst_size` bytes, for the call.
    let (s, d) = unsafe {
        (
            std::slice::from_raw_parts(src.data.cast::<u8>(), dst_size),
            std::slice::from_raw_parts_mut(dst.cast::<u8>(), dst_size),
        )
    };
    for (d, s) in d.iter_mut().zip(s) {
        *d = s ^ 0xA5;
    }
    0
}

fn cache_load(dir: &Path, source: &CStr, t: &wm_transform, mode: u32) -> (Loaded, wm_cache_report) {
    let dir = CString::new(dir.to_str().unwrap()).unwrap();
    let opts = wm_options {
        mode,
        ..wm_options_default()
    };
    let mut out = null_mut();
    let mut report = std::mem::MaybeUninit::<wm_cache_report>::uninit();
    // SAFETY: valid C strings, transform, options, out and report
    // pointers; the test's files are its own and nothing changes them.
    let rc = unsafe {
        wm_cache_load(
            dir.as_ptr(),
            source.as_ptr(),
            t,
            &opts,
            &mut out,
            report.as_mut_ptr(),
        )
    };
    assert_eq!(rc, WM_OK, "{}", last_error());
    // SAFETY: WM_OK means the report was written.
    (Loaded(out), unsafe { report.assume_init() })
}

/// One tensor as the C ABI describes it: name, ggml type, ne, bytes.
type Described = (String, i32, [i64; 4], Vec<u8>);

/// Every tensor of `w`, in its order.
fn tensors(w: &Loaded) -> Vec<Described> {
    // SAFETY: live weights.
    let n = unsafe { wm_tensor_count(w.0) };
    (0..n)
        .map(|i| {
            let mut t = std::mem::MaybeUninit::<wm_tensor>::uninit();
            // SAFETY: live weights, room for a wm_tensor.
            assert_eq!(unsafe { wm_tensor_at(w.0, i, t.as_mut_ptr()) }, WM_OK);
            // SAFETY: WM_OK means it was written.
            let t = unsafe { t.assume_init() };
            let bytes = if t.nbytes == 0 {
                Vec::new()
            } else {
                // SAFETY: `data` holds `nbytes` bytes while the weights live.
                unsafe { std::slice::from_raw_parts(t.data.cast::<u8>(), t.nbytes as usize) }
                    .to_vec()
            };
            // SAFETY: a tensor's name is a C string while the weights live.
            let name = unsafe { CStr::from_ptr(t.name) }
                .to_string_lossy()
                .into_owned();
            (name, t.ggml_type, t.ne, bytes)
        })
        .collect()
}

/// The file's identity (device, inode) where the system has one: a rewrite
/// renames a new file over the entry, which changes it.
fn identity(path: &Path) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).unwrap();
        Some((m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

#[test]
fn a_streamed_load_hits_the_entry_a_mapped_load_filled_and_leaves_it_alone() {
    let dir = tempfile::tempdir().unwrap();
    let source = fixture("tiny-llama.gguf");
    let calls = AtomicU32::new(0);
    let t = wm_transform {
        name: c"xor-a5".as_ptr(),
        version: 1,
        machine: null(),
        select: None,
        apply: Some(xor_apply),
        user: std::ptr::from_ref(&calls).cast_mut().cast(),
    };

    let (filled, r) = cache_load(dir.path(), &source, &t, WM_MODE_MMAP);
    assert_eq!(r.outcome, WM_CACHE_FILLED, "{:?}", text(r.message));
    let entry = PathBuf::from(text(r.entry).unwrap());
    let want = tensors(&filled);
    drop(filled);
    let mut src = null_mut();
    let opts = wm_options_default();
    // SAFETY: a valid C string, options and out pointer.
    let rc = unsafe { wm_load(source.as_ptr(), &opts, &mut src) };
    assert_eq!(rc, WM_OK, "{}", last_error());
    let transformed: Vec<Described> = tensors(&Loaded(src))
        .into_iter()
        .map(|(name, ty, ne, bytes)| (name, ty, ne, bytes.iter().map(|b| b ^ 0xA5).collect()))
        .collect();
    assert_eq!(want, transformed, "the entry holds the transform's bytes");
    let applied = calls.load(Ordering::Relaxed);
    assert!(applied > 0);
    let before = (identity(&entry), std::fs::read(&entry).unwrap());

    // Twice: a streamed hit that rewrote the entry would show on either.
    for _ in 0..2 {
        let (w, r) = cache_load(dir.path(), &source, &t, WM_MODE_STREAM);
        assert_eq!(r.outcome, WM_CACHE_HIT, "{:?}", text(r.message));
        assert_eq!(text(r.replaced), None);
        assert_eq!(text(r.entry).map(PathBuf::from), Some(entry.clone()));
        // SAFETY: live weights.
        assert_eq!(unsafe { wm_mode_used(w.0) }, WM_MODE_STREAM as c_int);
        assert!(tensors(&w) == want, "a streamed hit's tensors differ");
        assert_eq!(
            calls.load(Ordering::Relaxed),
            applied,
            "a hit calls nothing"
        );
        let after = (identity(&entry), std::fs::read(&entry).unwrap());
        assert!(after == before, "the entry was rewritten or replaced");
    }
}
