//! Unit tests of the entry points, called as C would call them.

use std::ffi::{CStr, CString};
use std::ptr::{null, null_mut};

use super::*;
use weightmap::TensorType;

fn fixture(name: &str) -> CString {
    CString::new(format!("{}/../testdata/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn last_error() -> String {
    let p = wm_last_error();
    assert!(!p.is_null(), "an error message was set");
    // SAFETY: a non-null `wm_last_error` is a C string valid until the next
    // failing call on this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Loaded weights that `wm_free` releases on drop.
#[derive(Debug)]
struct Loaded(*mut wm_weights);

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: from `wm_load`, freed once.
        unsafe { wm_free(self.0) };
    }
}

fn load(name: &str, opts: Option<wm_options>) -> Result<Loaded, (c_int, String)> {
    let path = fixture(name);
    let mut out = null_mut();
    let o = opts.as_ref().map_or(null(), |o| o as *const wm_options);
    // SAFETY: valid C string, options and out pointer.
    let rc = unsafe { wm_load(path.as_ptr(), o, &mut out) };
    if rc == WM_OK {
        assert!(!out.is_null());
        Ok(Loaded(out))
    } else {
        assert!(out.is_null(), "a failed load leaves NULL in *out");
        Err((rc, last_error()))
    }
}

fn opts(mode: u32, fallback: u32, alignment: u64) -> wm_options {
    wm_options {
        mode,
        fallback,
        alignment,
        ..wm_options_default()
    }
}

fn tensor(w: &Loaded, name: &str) -> Result<wm_tensor, (c_int, String)> {
    let name = CString::new(name).unwrap();
    let mut t = std::mem::MaybeUninit::<wm_tensor>::uninit();
    // SAFETY: live weights, a C string, room for a wm_tensor.
    let rc = unsafe { wm_tensor_by_name(w.0, name.as_ptr(), t.as_mut_ptr()) };
    if rc == WM_OK {
        // SAFETY: WM_OK means `*out` was written.
        Ok(unsafe { t.assume_init() })
    } else {
        Err((rc, last_error()))
    }
}

fn bytes_of(t: &wm_tensor) -> &[u8] {
    // SAFETY: `data` holds `nbytes` bytes while the weights live, which
    // the callers' borrows of `Loaded` outlive.
    unsafe { std::slice::from_raw_parts(t.data.cast::<u8>(), t.nbytes as usize) }
}

fn file_bytes(name: &str, offset: u64, len: u64) -> Vec<u8> {
    let all = std::fs::read(fixture(name).to_str().unwrap()).unwrap();
    all[offset as usize..(offset + len) as usize].to_vec()
}

#[test]
fn defaults_are_mmap_with_fallback() {
    let o = wm_options_default();
    assert_eq!((o.mode, o.fallback, o.alignment), (0, 1, 0));
    assert_eq!((o.huge_pages, o.reread_small_folios), (1, 0));
}

/// Load `path` (a C string) with `o`.
fn load_path(path: &CStr, o: &wm_options) -> Loaded {
    let mut out = null_mut();
    // SAFETY: valid C string, options and out pointer.
    let rc = unsafe { wm_load(path.as_ptr(), o, &mut out) };
    assert_eq!(rc, WM_OK, "{}", last_error());
    Loaded(out)
}

fn huge_pages_of(w: &Loaded) -> wm_huge_page_bytes {
    let mut h = wm_huge_page_bytes::default();
    // SAFETY: live weights, room for the figures.
    assert_eq!(unsafe { wm_huge_pages(w.0, &mut h) }, WM_OK);
    h
}

#[test]
fn owned_huge_pages_turn_off_and_the_figure_says_so() {
    // 8 MiB of tensors: owned buffers that large are mapped, so that they
    // can be in huge pages.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let mut wr = weightmap::gguf::Writer::new(32);
    for i in 0..4u8 {
        wr.tensor(
            &format!("t{i}"),
            TensorType::I8,
            &[2 << 20],
            vec![i; 2 << 20],
        );
    }
    std::fs::write(&path, wr.to_bytes()).unwrap();
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    let stream = |huge_pages: u32| {
        let o = wm_options {
            huge_pages,
            ..opts(WM_MODE_STREAM, 1, 0)
        };
        let w = load_path(&c_path, &o);
        let t = tensor(&w, "t3").unwrap();
        assert!(bytes_of(&t).iter().all(|&b| b == 3));
        huge_pages_of(&w)
    };
    let (on, off) = (stream(1), stream(0));
    for h in [&on, &off] {
        assert_eq!(h.mapped_bytes, 0, "{h:?}");
        assert!(h.owned_bytes >= 8 << 20, "{h:?}");
        assert_eq!(h.reread_bytes, 0, "{h:?}");
    }
    if on.owned_huge == WM_UNKNOWN || !weightmap::transparent_huge_pages().for_advised_memory() {
        println!("huge-page figures skipped: not measurable here ({on:?})");
        return;
    }
    assert!(on.owned_huge > 0, "{on:?}");
    assert_eq!(off.owned_huge, 0, "{off:?}");
    // Mapped, the figures are the mapping's.
    let w = load_path(&c_path, &opts(WM_MODE_MMAP, 1, 0));
    let h = huge_pages_of(&w);
    assert!(h.mapped_bytes >= 8 << 20 && h.owned_bytes == 0, "{h:?}");
}

#[test]
fn the_reread_is_asked_for_through_the_options() {
    let o = wm_options {
        reread_small_folios: 1,
        ..wm_options_default()
    };
    let w = load("tiny-llama.gguf", Some(o)).unwrap();
    // SAFETY: live weights.
    let rr = unsafe { &(*w.0).weights }.report().reread.clone();
    assert_ne!(rr, weightmap::Reread::Off, "asked for: acting or refused");
    let h = huge_pages_of(&w);
    assert!(h.mapped_bytes > 0, "{h:?}");
    // NULL figures are a bad argument.
    // SAFETY: live weights; a NULL `out` is refused.
    assert_eq!(
        unsafe { wm_huge_pages(w.0, null_mut()) },
        WM_ERR_BAD_ARGUMENT
    );
    // SAFETY: a NULL `w` is refused.
    let mut h = wm_huge_page_bytes::default();
    assert_eq!(
        unsafe { wm_huge_pages(null(), &mut h) },
        WM_ERR_BAD_ARGUMENT
    );
}

#[test]
fn loads_both_modes_and_describes_tensors() {
    for (mode, used) in [
        (WM_MODE_MMAP, 0),
        (WM_MODE_STREAM, 1),
        (WM_MODE_MMAP_ALL, 0),
    ] {
        let w = load("tiny-llama.gguf", Some(opts(mode, 1, 0))).unwrap();
        // SAFETY: live weights.
        unsafe {
            assert_eq!(wm_mode_used(w.0), used);
            assert!(wm_fallback_reason(w.0).is_null());
            assert_eq!(wm_tensor_count(w.0), 12);
        }
        let t = tensor(&w, "token_embd.weight").unwrap();
        // SAFETY: names are C strings while the weights live.
        assert_eq!(
            unsafe { CStr::from_ptr(t.name) }.to_str().unwrap(),
            "token_embd.weight"
        );
        assert_eq!((t.ggml_type, t.n_dims), (0, 2));
        assert_eq!(t.ne, [8, 6, 1, 1]);
        assert_eq!(t.nb, [4, 32, 192, 192]);
        assert_eq!((t.nbytes, t.file_offset), (192, 8352));
        assert_eq!(bytes_of(&t), file_bytes("tiny-llama.gguf", 8352, 192));
        assert_eq!(t.data as usize % 32, 0, "aligned as the CPU buffer needs");

        let q = tensor(&w, "test.f32_3d").unwrap();
        assert_eq!((q.n_dims, q.ne, q.nb), (3, [4, 3, 2, 1], [4, 16, 48, 96]));
        let bf = tensor(&w, "blk.0.attn_q.weight").unwrap();
        assert_eq!(bf.ggml_type, 30, "BF16 is ggml type 30");
        let empty = tensor(&w, "test.empty").unwrap();
        assert_eq!((empty.nbytes, empty.ne), (0, [0, 1, 1, 1]));

        // tensor_at agrees with tensor_by_name, in file order.
        let mut at = std::mem::MaybeUninit::<wm_tensor>::uninit();
        // SAFETY: live weights, room for a wm_tensor.
        assert_eq!(unsafe { wm_tensor_at(w.0, 0, at.as_mut_ptr()) }, WM_OK);
        // SAFETY: written on WM_OK.
        let at = unsafe { at.assume_init() };
        assert_eq!(
            (at.name, at.data),
            (t.name, t.data),
            "the same pointers each call"
        );
    }
}

#[test]
fn quantized_strides_are_ggml_s() {
    let w = load("quant-types.gguf", None).unwrap();
    let t = tensor(&w, "quant.q4_0").unwrap();
    assert_eq!((t.ggml_type, t.ne), (2, [32, 2, 1, 1]));
    assert_eq!(
        t.nb,
        [18, 18, 36, 36],
        "nb[0] is the block size, nb[1] a row"
    );
    assert_eq!(
        bytes_of(&t),
        file_bytes("quant-types.gguf", t.file_offset, 36)
    );
}

#[test]
fn null_pointers_are_bad_arguments() {
    let path = fixture("tiny-llama.gguf");
    let mut out = null_mut();
    // SAFETY: each pointer is NULL or valid.
    unsafe {
        assert_eq!(wm_load(null(), null(), &mut out), WM_ERR_BAD_ARGUMENT);
        assert!(last_error().contains("path is NULL"), "{}", last_error());
        assert_eq!(
            wm_load(path.as_ptr(), null(), null_mut()),
            WM_ERR_BAD_ARGUMENT
        );
        assert!(last_error().contains("out is NULL"));
        assert_eq!(wm_mode_used(null()), -1);
        assert!(wm_fallback_reason(null()).is_null());
        assert_eq!(wm_tensor_count(null()), 0);
        let mut t = std::mem::MaybeUninit::<wm_tensor>::uninit();
        assert_eq!(wm_tensor_at(null(), 0, t.as_mut_ptr()), WM_ERR_BAD_ARGUMENT);
        assert!(last_error().contains("weights is NULL"));
        let mut v = 0u64;
        assert_eq!(
            wm_meta_u64(null(), c"k".as_ptr(), &mut v),
            WM_ERR_BAD_ARGUMENT
        );
        wm_free(null_mut());
    }
    let w = load("tiny-llama.gguf", None).unwrap();
    // SAFETY: live weights; the NULLs are what is tested.
    unsafe {
        assert_eq!(wm_tensor_at(w.0, 0, null_mut()), WM_ERR_BAD_ARGUMENT);
        let mut t = std::mem::MaybeUninit::<wm_tensor>::uninit();
        assert_eq!(
            wm_tensor_by_name(w.0, null(), t.as_mut_ptr()),
            WM_ERR_BAD_ARGUMENT
        );
        assert!(last_error().contains("tensor name is NULL"));
        let mut v = 0u64;
        assert_eq!(wm_meta_u64(w.0, null(), &mut v), WM_ERR_BAD_ARGUMENT);
        assert_eq!(
            wm_meta_u64(w.0, c"llama.block_count".as_ptr(), null_mut()),
            WM_ERR_BAD_ARGUMENT
        );
        let mut f = 0f64;
        assert_eq!(
            wm_meta_f64(w.0, c"general.name".as_ptr(), null_mut()),
            WM_ERR_BAD_ARGUMENT
        );
        assert_eq!(wm_meta_f64(w.0, null(), &mut f), WM_ERR_BAD_ARGUMENT);
        let mut n = 0u64;
        assert_eq!(
            wm_meta_str(w.0, c"general.name".as_ptr(), null_mut(), &mut n),
            WM_ERR_BAD_ARGUMENT
        );
        assert_eq!(
            wm_meta_array_len(w.0, c"tokenizer.ggml.tokens".as_ptr(), null_mut()),
            WM_ERR_BAD_ARGUMENT
        );
        assert_eq!(
            wm_meta_array_str(
                w.0,
                c"tokenizer.ggml.tokens".as_ptr(),
                0,
                null_mut(),
                &mut n
            ),
            WM_ERR_BAD_ARGUMENT
        );
        let mut m = 0;
        assert_eq!(wm_tensor_is_mapped(w.0, 0, null_mut()), WM_ERR_BAD_ARGUMENT);
        assert_eq!(wm_tensor_is_mapped(null(), 0, &mut m), WM_ERR_BAD_ARGUMENT);
    }
}

#[test]
fn bad_paths_and_files_are_errors_with_messages() {
    let (rc, msg) = load("no-such-file.gguf", None).err().unwrap();
    assert_eq!(rc, WM_ERR_IO);
    assert!(msg.contains("no-such-file.gguf"), "{msg}");
    let (rc, msg) = load("", None).err().unwrap();
    assert_eq!(rc, WM_ERR_INVALID_FILE, "a directory: {msg}");
    assert!(msg.contains("not a regular file"), "{msg}");
    let dir = tempfile::tempdir().unwrap();
    for (name, content, needle) in [
        ("empty.gguf", &b""[..], "empty"),
        ("text.gguf", &b"not a weights file at all"[..], ""),
        ("cut.gguf", &b"GGUF\x03\0\0\0\x05"[..], ""),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        let path = CString::new(path.to_str().unwrap()).unwrap();
        let mut out = null_mut();
        // SAFETY: a C string and room for the pointer.
        let rc = unsafe { wm_load(path.as_ptr(), null(), &mut out) };
        assert_eq!(rc, WM_ERR_INVALID_FILE, "{name}");
        assert!(out.is_null());
        assert!(last_error().contains(needle), "{}", last_error());
    }
}

#[test]
fn bad_options_are_bad_arguments() {
    for (o, needle) in [
        (opts(3, 1, 0), "mode is 3"),
        (opts(0, 2, 0), "fallback is 2"),
        (opts(0, 1, 24), "alignment 24"),
        (
            wm_options {
                huge_pages: 2,
                ..wm_options_default()
            },
            "huge_pages is 2",
        ),
        (
            wm_options {
                reread_small_folios: 7,
                ..wm_options_default()
            },
            "reread_small_folios is 7",
        ),
    ] {
        let (rc, msg) = load("tiny-llama.gguf", Some(o)).err().unwrap();
        assert_eq!(rc, WM_ERR_BAD_ARGUMENT);
        assert!(msg.contains(needle), "{msg}");
    }
}

#[test]
fn missing_tensor_key_and_bad_index() {
    let w = load("tiny-llama.gguf", None).unwrap();
    let (rc, msg) = tensor(&w, "no.such.tensor").err().unwrap();
    assert_eq!(rc, WM_ERR_NOT_FOUND);
    assert!(msg.contains("no.such.tensor"), "{msg}");
    let mut t = std::mem::MaybeUninit::<wm_tensor>::uninit();
    // SAFETY: live weights, room for a wm_tensor.
    unsafe {
        assert_eq!(wm_tensor_at(w.0, 12, t.as_mut_ptr()), WM_ERR_BAD_ARGUMENT);
        assert!(last_error().contains("index 12 is out of range (12 tensors)"));
        assert_eq!(
            wm_tensor_at(w.0, u64::MAX, t.as_mut_ptr()),
            WM_ERR_BAD_ARGUMENT
        );
    }
    let mut v = 0u64;
    // SAFETY: live weights, C strings, room for the values.
    unsafe {
        assert_eq!(
            wm_meta_u64(w.0, c"no.such.key".as_ptr(), &mut v),
            WM_ERR_NOT_FOUND
        );
        assert!(last_error().contains("no.such.key"));
        assert_eq!(
            wm_meta_u64(w.0, c"general.name".as_ptr(), &mut v),
            WM_ERR_WRONG_TYPE
        );
        assert!(last_error().contains("general.name"));
        assert_eq!(
            wm_meta_u64(w.0, c"weightmap.test.i32".as_ptr(), &mut v),
            WM_ERR_WRONG_TYPE,
            "negative"
        );
        let mut f = 0.0;
        assert_eq!(
            wm_meta_f64(w.0, c"llama.block_count".as_ptr(), &mut f),
            WM_ERR_WRONG_TYPE
        );
        assert_eq!(
            wm_meta_f64(w.0, c"no.such.key".as_ptr(), &mut f),
            WM_ERR_NOT_FOUND
        );
        let mut p = null();
        assert_eq!(
            wm_meta_str(w.0, c"llama.block_count".as_ptr(), &mut p, null_mut()),
            WM_ERR_WRONG_TYPE
        );
        assert_eq!(
            wm_meta_array_len(w.0, c"general.name".as_ptr(), &mut v),
            WM_ERR_WRONG_TYPE
        );
        assert_eq!(
            wm_meta_array_str(
                w.0,
                c"weightmap.test.u8_array".as_ptr(),
                0,
                &mut p,
                null_mut()
            ),
            WM_ERR_WRONG_TYPE
        );
        assert_eq!(
            wm_meta_array_str(
                w.0,
                c"tokenizer.ggml.tokens".as_ptr(),
                300,
                &mut p,
                null_mut()
            ),
            WM_ERR_BAD_ARGUMENT
        );
        assert!(last_error().contains("index 300 is out of range"));
    }
}

#[test]
fn metadata_getters() {
    let w = load("tiny-llama.gguf", Some(opts(WM_MODE_STREAM, 1, 0))).unwrap();
    let mut v = 0u64;
    let mut f = 0.0f64;
    let mut p: *const c_char = null();
    let mut n = 0u64;
    // SAFETY: live weights, C strings, room for the values; strings handed
    // out are C strings of `n` bytes while the weights live.
    unsafe {
        assert_eq!(
            wm_meta_u64(w.0, c"llama.block_count".as_ptr(), &mut v),
            WM_OK
        );
        assert_eq!(v, 1);
        assert_eq!(
            wm_meta_u64(w.0, c"weightmap.test.u64".as_ptr(), &mut v),
            WM_OK
        );
        assert_eq!(v, 9223372036854788153);
        assert_eq!(
            wm_meta_u64(w.0, c"weightmap.test.u8".as_ptr(), &mut v),
            WM_OK
        );
        assert_eq!(v, 255);
        assert_eq!(
            wm_meta_f64(w.0, c"weightmap.test.f64".as_ptr(), &mut f),
            WM_OK
        );
        assert_eq!(f, std::f64::consts::PI);
        assert_eq!(
            wm_meta_f64(w.0, c"llama.rope.freq_base".as_ptr(), &mut f),
            WM_OK
        );
        assert_eq!(f, 10000.0);
        assert_eq!(
            wm_meta_str(w.0, c"weightmap.test.utf8".as_ptr(), &mut p, &mut n),
            WM_OK
        );
        let s = "héllo wörld ✓ 日本語 🦀";
        assert_eq!(n as usize, s.len());
        assert_eq!(CStr::from_ptr(p).to_str().unwrap(), s);
        let first = p;
        assert_eq!(
            wm_meta_str(w.0, c"weightmap.test.utf8".as_ptr(), &mut p, null_mut()),
            WM_OK
        );
        assert_eq!(p, first, "the same pointer each call");
        assert_eq!(
            wm_meta_str(w.0, c"weightmap.test.empty_string".as_ptr(), &mut p, &mut n),
            WM_OK
        );
        assert_eq!((n, *p), (0, 0));
        assert_eq!(
            wm_meta_array_len(w.0, c"tokenizer.ggml.tokens".as_ptr(), &mut v),
            WM_OK
        );
        assert_eq!(v, 300);
        assert_eq!(
            wm_meta_array_len(w.0, c"weightmap.test.u64_array".as_ptr(), &mut v),
            WM_OK
        );
        assert_eq!(v, 3);
        assert_eq!(
            wm_meta_array_str(w.0, c"tokenizer.ggml.tokens".as_ptr(), 2, &mut p, &mut n),
            WM_OK
        );
        assert_eq!((CStr::from_ptr(p).to_str().unwrap(), n), ("</s>", 4));
    }
}

#[test]
fn misaligned_file_hybrid_strict_and_no_fallback() {
    // align8.gguf aligns tensors to 8 bytes; a 32-byte CPU buffer cannot
    // view them all in place.
    let hybrid = load("align8.gguf", None).unwrap();
    let mut copied = 0;
    // SAFETY: live weights; room for the values.
    unsafe {
        assert_eq!(wm_mode_used(hybrid.0), 0);
        assert!(
            wm_fallback_reason(hybrid.0).is_null(),
            "hybrid: nothing fell back"
        );
        for i in 0..wm_tensor_count(hybrid.0) {
            let mut m = -1;
            assert_eq!(wm_tensor_is_mapped(hybrid.0, i, &mut m), WM_OK);
            copied += usize::from(m == 0);
            let mut t = std::mem::MaybeUninit::<wm_tensor>::uninit();
            assert_eq!(wm_tensor_at(hybrid.0, i, t.as_mut_ptr()), WM_OK);
            let t = t.assume_init();
            assert_eq!(t.data as usize % 32, 0, "copied tensors are aligned");
            assert_eq!(
                bytes_of(&t),
                file_bytes("align8.gguf", t.file_offset, t.nbytes)
            );
        }
    }
    assert!(copied > 0, "some tensors copied");

    let strict = load("align8.gguf", Some(opts(WM_MODE_MMAP_ALL, 1, 0))).unwrap();
    // SAFETY: live weights; the reason is a C string while they live.
    let reason = unsafe {
        assert_eq!(wm_mode_used(strict.0), 1);
        CStr::from_ptr(wm_fallback_reason(strict.0))
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert!(reason.starts_with("misaligned: tensor '"), "{reason}");
    assert!(reason.contains("is not aligned to 32"), "{reason}");

    let (rc, msg) = load("align8.gguf", Some(opts(WM_MODE_MMAP_ALL, 0, 0)))
        .err()
        .unwrap();
    assert_eq!(rc, WM_ERR_MMAP);
    assert!(msg.contains("not aligned to 32"), "{msg}");

    // With 8-byte alignment every tensor maps.
    let w8 = load("align8.gguf", Some(opts(WM_MODE_MMAP_ALL, 0, 8))).unwrap();
    // SAFETY: live weights.
    assert!(unsafe { wm_fallback_reason(w8.0) }.is_null());
}

#[test]
fn safetensors_files_load_too() {
    let w = load("tiny.safetensors", None).unwrap();
    // SAFETY: live weights.
    let n = unsafe { wm_tensor_count(w.0) };
    assert!(n > 0);
    let mut v = 0u64;
    // SAFETY: live weights, C string, room for a value.
    let rc = unsafe { wm_meta_u64(w.0, c"general.name".as_ptr(), &mut v) };
    assert_eq!(rc, WM_ERR_NOT_FOUND);
    assert!(last_error().contains("safetensors"), "{}", last_error());
}

#[test]
fn the_last_error_is_per_thread() {
    let _ = load("no-such-file.gguf", None);
    std::thread::spawn(|| assert!(wm_last_error().is_null()))
        .join()
        .unwrap();
    assert!(last_error().contains("no-such-file"));
}

#[test]
fn weights_are_read_from_many_threads() {
    let w = load("tiny-llama.gguf", None).unwrap();
    let addr = w.0 as usize;
    let handles: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let w = addr as *const wm_weights;
                let mut p = null();
                for i in 0..300 {
                    // SAFETY: the weights outlive the threads (joined below).
                    let rc = unsafe {
                        wm_meta_array_str(
                            w,
                            c"tokenizer.ggml.tokens".as_ptr(),
                            i,
                            &mut p,
                            null_mut(),
                        )
                    };
                    assert_eq!(rc, WM_OK);
                }
                p as usize
            })
        })
        .collect();
    let ptrs: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(ptrs.windows(2).all(|p| p[0] == p[1]), "one cached copy");
}

#[test]
fn panics_do_not_cross_the_boundary() {
    let rc = guard(|| panic!("boom"));
    assert_eq!(rc, WM_ERR_INTERNAL);
    assert!(last_error().contains("boom"));
    assert_eq!(guard_value(7, || panic!("bang")), 7);
    assert!(last_error().contains("bang"));
}

#[test]
fn version_is_the_crate_s() {
    // SAFETY: a static C string.
    let v = unsafe { CStr::from_ptr(wm_version()) };
    assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn dequantize_rows_match_the_library() {
    let w = load("quant-types.gguf", None).unwrap();
    // SAFETY: live weights.
    let n = unsafe { wm_tensor_count(w.0) };
    // SAFETY: as above; wm_weights wraps the library's Weights.
    let lib = unsafe { &(*w.0).weights };
    let mut checked = 0;
    for i in 0..n {
        let t = lib.tensor_at(i as usize).unwrap();
        let rows = t.n_rows();
        let row_len = t.row_len() as usize;
        let Ok(want) = t.to_f32_vec() else {
            // No dequantization: the C call says so.
            let mut out = vec![0f32; 1];
            // SAFETY: live weights; `out` holds one float.
            let rc = unsafe { wm_tensor_dequantize(w.0, i, 0, 0, out.as_mut_ptr(), 0) };
            assert!(rc == WM_ERR_UNSUPPORTED || rc == WM_OK, "{}", t.name());
            continue;
        };
        let mut out = vec![0f32; want.len()];
        // SAFETY: live weights; `out` holds `out.len()` floats.
        let rc =
            unsafe { wm_tensor_dequantize(w.0, i, 0, rows, out.as_mut_ptr(), out.len() as u64) };
        assert_eq!(rc, WM_OK, "{}: {}", t.name(), last_error());
        assert_eq!(
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{}",
            t.name()
        );
        if rows > 1 {
            let mut one = vec![0f32; row_len];
            // SAFETY: as above.
            let rc =
                unsafe { wm_tensor_dequantize(w.0, i, 1, 2, one.as_mut_ptr(), row_len as u64) };
            assert_eq!(rc, WM_OK);
            assert_eq!(
                one.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want[row_len..2 * row_len]
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>()
            );
        }
        checked += 1;
    }
    assert!(checked > 10);
    let mut out = vec![0f32; 4];
    // Out of range, a wrong length, NULL.
    // SAFETY: live weights; `out` holds 4 floats; NULL is allowed.
    unsafe {
        assert_eq!(
            wm_tensor_dequantize(w.0, 0, 0, 1_000_000, out.as_mut_ptr(), 4),
            WM_ERR_BAD_ARGUMENT
        );
        assert!(last_error().contains("out of range"), "{}", last_error());
        assert_eq!(
            wm_tensor_dequantize(w.0, 0, 0, 1, out.as_mut_ptr(), 3),
            WM_ERR_BAD_ARGUMENT
        );
        assert_eq!(
            wm_tensor_dequantize(w.0, n, 0, 1, out.as_mut_ptr(), 4),
            WM_ERR_BAD_ARGUMENT
        );
        assert_eq!(
            wm_tensor_dequantize(w.0, 0, 0, 1, std::ptr::null_mut(), 4),
            WM_ERR_BAD_ARGUMENT
        );
        assert_eq!(
            wm_tensor_dequantize(null(), 0, 0, 1, out.as_mut_ptr(), 4),
            WM_ERR_BAD_ARGUMENT
        );
    }
}

/// Collects the indices the pass visits; stops after `stop_after`.
struct Visits {
    seen: Vec<u64>,
    first_bytes: Vec<u8>,
    stop_after: usize,
}

unsafe extern "C" fn visit(ctx: *mut c_void, i: u64, t: *const wm_tensor) -> c_int {
    // SAFETY: `ctx` is the `Visits` the test passed; `t` is valid for the call.
    let (v, t) = unsafe { (&mut *ctx.cast::<Visits>(), &*t) };
    v.seen.push(i);
    if t.nbytes > 0 {
        // SAFETY: `data` holds `nbytes` resident bytes.
        v.first_bytes.push(unsafe { *t.data.cast::<u8>() });
    }
    c_int::from(v.seen.len() >= v.stop_after)
}

#[test]
fn the_pass_visits_every_tensor_in_file_order_and_its_callback_can_stop_it() {
    let w = load("tiny-llama.gguf", None).unwrap();
    // SAFETY: live weights.
    let n = unsafe { wm_tensor_count(w.0) } as usize;
    let mut v = Visits {
        seen: Vec::new(),
        first_bytes: Vec::new(),
        stop_after: usize::MAX,
    };
    // SAFETY: live weights, a callback and its context.
    let rc = unsafe { wm_pass(w.0, 1 << 20, 0, Some(visit), (&mut v as *mut Visits).cast()) };
    assert_eq!(rc, WM_OK);
    assert_eq!(v.seen.len(), n);
    let mut offsets = Vec::new();
    for &i in &v.seen {
        let mut t = std::mem::MaybeUninit::<wm_tensor>::uninit();
        // SAFETY: live weights, room for a wm_tensor.
        assert_eq!(unsafe { wm_tensor_at(w.0, i, t.as_mut_ptr()) }, WM_OK);
        // SAFETY: WM_OK means `*out` was written.
        offsets.push(unsafe { t.assume_init() }.file_offset);
    }
    assert!(offsets.windows(2).all(|p| p[0] <= p[1]), "{offsets:?}");
    let mut stopped = Visits {
        seen: Vec::new(),
        first_bytes: Vec::new(),
        stop_after: 3,
    };
    // SAFETY: as above.
    let rc = unsafe { wm_pass(w.0, 0, 1, Some(visit), (&mut stopped as *mut Visits).cast()) };
    assert_eq!(rc, WM_ERR_CANCELLED);
    assert_eq!(stopped.seen, v.seen[..3]);
    assert_eq!(
        stopped.first_bytes,
        v.first_bytes[..stopped.first_bytes.len()]
    );
    // SAFETY: a NULL callback is refused.
    assert_eq!(
        unsafe { wm_pass(w.0, 0, 0, None, null_mut()) },
        WM_ERR_BAD_ARGUMENT
    );
}

#[test]
fn the_budget_the_load_was_held_to_is_readable_from_c() {
    let w = load("tiny-llama.gguf", None).unwrap();
    let (mut bytes, mut source) = (0u64, null());
    // SAFETY: live weights and room for both outputs.
    assert_eq!(unsafe { wm_budget(w.0, &mut bytes, &mut source) }, WM_OK);
    assert!(bytes > 0);
    // SAFETY: a C string valid until wm_free.
    let source = unsafe { CStr::from_ptr(source) }.to_str().unwrap();
    // The figures each platform reads (src/os/budget.rs names them).
    let known = [
        "MemAvailable",
        "cgroup v",
        "GlobalMemoryStatusEx ullAvailPhys",
        "job object ",
        "host_statistics64 HOST_VM_INFO64",
        "os_proc_available_memory",
    ];
    assert!(known.iter().any(|k| source.starts_with(k)), "{source}");
    // SAFETY: a NULL `bytes` is refused.
    assert_eq!(
        unsafe { wm_budget(w.0, null_mut(), null_mut()) },
        WM_ERR_BAD_ARGUMENT
    );
}

/// `wm_load_within` of fixture `name` in stream mode.
fn load_streamed_within(name: &str, budget: u64, ignore: u32) -> Result<Loaded, (c_int, String)> {
    let path = fixture(name);
    let o = opts(WM_MODE_STREAM, 1, 0);
    let mut out = null_mut();
    // SAFETY: valid C string, options and out pointer.
    let rc = unsafe { wm_load_within(path.as_ptr(), &o, budget, ignore, &mut out) };
    if rc == WM_OK {
        Ok(Loaded(out))
    } else {
        assert!(out.is_null(), "a failed load leaves NULL in *out");
        Err((rc, last_error()))
    }
}

#[test]
fn a_budget_given_from_c_refuses_the_copy_unless_told_to_go_ahead() {
    // The stream path copies every tensor: far more than 100 bytes.
    let Err((rc, msg)) = load_streamed_within("tiny-llama.gguf", 100, 0) else {
        panic!("a 100-byte budget let the stream path copy the model");
    };
    assert_eq!(rc, WM_ERR_NO_MEMORY);
    assert!(msg.contains("budget of 100 bytes"), "{msg}");
    let Ok(w) = load_streamed_within("tiny-llama.gguf", 100, 1) else {
        panic!("ignore_budget 1 did not go ahead");
    };
    let (mut bytes, mut source) = (0u64, null());
    // SAFETY: live weights and room for both outputs.
    assert_eq!(unsafe { wm_budget(w.0, &mut bytes, &mut source) }, WM_OK);
    assert_eq!(bytes, 100);
    // SAFETY: a C string valid until wm_free.
    let source = unsafe { CStr::from_ptr(source) }.to_str().unwrap();
    assert_eq!(source, "LoadOptions::budget");
    // 0 reads the system's budget, as wm_load does.
    assert!(load_streamed_within("tiny-llama.gguf", 0, 0).is_ok());
    let Err((rc, msg)) = load_streamed_within("tiny-llama.gguf", 0, 2) else {
        panic!("ignore_budget 2 was taken");
    };
    assert_eq!(rc, WM_ERR_BAD_ARGUMENT);
    assert!(msg.contains("ignore_budget"), "{msg}");
}

// ---- the transform cache (wm_cache_load) ------------------------------------

/// What the C callbacks below are given as `user`: how often each ran, and
/// how they should misbehave.
#[derive(Default)]
struct Calls {
    select: u32,
    apply: u32,
    /// Nonzero: `apply` returns it.
    fail_with: c_int,
    /// `select` chooses a ggml type that does not exist for Q8_0.
    bad_type: bool,
}

const Q4_0: i32 = 2;
const Q8_0: i32 = 8;

/// Q4_0 and Q8_0 tensors become F32 of the same shape; the rest are left out.
unsafe extern "C" fn dequant_select(
    user: *mut c_void,
    src: *const wm_tensor,
    ggml_type: *mut i32,
    _ne: *mut i64,
) -> c_int {
    // SAFETY: `user` is the test's `Calls`; `src` and `ggml_type` are valid
    // for the call, as `wm_select_fn` promises.
    let (calls, src) = unsafe { (&mut *user.cast::<Calls>(), &*src) };
    calls.select += 1;
    if src.ggml_type != Q4_0 && src.ggml_type != Q8_0 {
        return 0;
    }
    let ty = if calls.bad_type && src.ggml_type == Q8_0 {
        999
    } else {
        0
    };
    // SAFETY: as above.
    unsafe { ggml_type.write(ty) };
    1
}

/// Dequantizes `src` to F32 (or copies it, for an F32 source: a repack
/// that changes nothing).
unsafe extern "C" fn dequant_apply(
    user: *mut c_void,
    src: *const wm_tensor,
    dst: *mut c_void,
    dst_size: usize,
) -> c_int {
    // SAFETY: `user` is the test's `Calls`; `src`, its data and `dst` are
    // valid for the call, as `wm_apply_fn` promises.
    let (calls, src, dst) = unsafe {
        (
            &mut *user.cast::<Calls>(),
            &*src,
            std::slice::from_raw_parts_mut(dst.cast::<u8>(), dst_size),
        )
    };
    calls.apply += 1;
    if calls.fail_with != 0 {
        return calls.fail_with;
    }
    // SAFETY: as above.
    let bytes = unsafe { std::slice::from_raw_parts(src.data.cast::<u8>(), src.nbytes as usize) };
    if bytes.len() == dst.len() {
        dst.copy_from_slice(bytes);
        return 0;
    }
    let ty = TensorType::from_ggml_id(src.ggml_type as u32).unwrap();
    match weightmap::quant::dequantize_to_vec(ty, bytes) {
        Ok(v) if v.len() * 4 == dst.len() => {
            for (d, x) in dst.chunks_exact_mut(4).zip(v) {
                d.copy_from_slice(&x.to_le_bytes());
            }
            0
        }
        _ => 1,
    }
}

fn dequant_transform(calls: &mut Calls) -> wm_transform {
    wm_transform {
        name: c"dequant-f32".as_ptr(),
        version: 1,
        machine: null(),
        select: Some(dequant_select),
        apply: Some(dequant_apply),
        user: (calls as *mut Calls).cast(),
    }
}

fn cache_load(
    dir: &std::path::Path,
    source: &CStr,
    t: &wm_transform,
) -> Result<(Loaded, wm_cache_report), (c_int, String)> {
    let dir = CString::new(dir.to_str().unwrap()).unwrap();
    let mut out = null_mut();
    let mut report = std::mem::MaybeUninit::<wm_cache_report>::uninit();
    // SAFETY: valid C strings, transform, out and report pointers; the
    // test's files are its own and nothing changes them.
    let rc = unsafe {
        wm_cache_load(
            dir.as_ptr(),
            source.as_ptr(),
            t,
            null(),
            &mut out,
            report.as_mut_ptr(),
        )
    };
    if rc == WM_OK {
        assert!(!out.is_null());
        // SAFETY: WM_OK means the report was written.
        Ok((Loaded(out), unsafe { report.assume_init() }))
    } else {
        assert!(out.is_null(), "a failed load leaves NULL in *out");
        Err((rc, last_error()))
    }
}

fn c_text_of(p: *const c_char) -> Option<String> {
    // SAFETY: a report's strings are C strings while its weights live.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The Q4_0 and Q8_0 tensors of quant-types.gguf, dequantized by the
/// library without any cache: what the entry must hold.
fn dequantized_in_memory() -> Vec<(String, Vec<u8>)> {
    let path = fixture("quant-types.gguf");
    let w = Weights::load_streamed(path.to_str().unwrap(), &LoadOptions::default()).unwrap();
    w.tensors()
        .filter(|t| matches!(t.info().ty, TensorType::Q4_0 | TensorType::Q8_0))
        .map(|t| {
            let v = t.to_f32_vec().unwrap();
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (t.name().to_owned(), bytes)
        })
        .collect()
}

/// `w` holds `want`'s tensors as F32, each in the entry's mapping when
/// `mapped`.
fn assert_holds(w: &Loaded, want: &[(String, Vec<u8>)], mapped: bool) {
    // SAFETY: live weights.
    assert_eq!(unsafe { wm_tensor_count(w.0) }, want.len() as u64);
    for (name, bytes) in want {
        let t = tensor(w, name).unwrap();
        assert_eq!(t.ggml_type, 0, "{name} is F32 in the entry");
        assert!(
            bytes_of(&t) == bytes.as_slice(),
            "{name}: not the transform's bytes"
        );
        if mapped {
            let mut m = -1;
            // SAFETY: live weights, an int to write.
            assert_eq!(
                unsafe { wm_tensor_is_mapped(w.0, w_index(w, name), &mut m) },
                WM_OK
            );
            assert_eq!(m, 1, "{name} is in the entry's mapping");
        }
    }
}

fn w_index(w: &Loaded, name: &str) -> u64 {
    // SAFETY: live weights.
    let n = unsafe { wm_tensor_count(w.0) };
    (0..n)
        .find(|&i| {
            let mut t = std::mem::MaybeUninit::<wm_tensor>::uninit();
            // SAFETY: live weights, room for a wm_tensor; names are C
            // strings while the weights live.
            unsafe {
                wm_tensor_at(w.0, i, t.as_mut_ptr()) == WM_OK
                    && CStr::from_ptr(t.assume_init().name).to_str() == Ok(name)
            }
        })
        .unwrap()
}

#[test]
fn the_cache_fills_then_hits_with_c_callbacks_and_holds_the_transform_s_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let want = dequantized_in_memory();
    assert_eq!(
        want.len(),
        2,
        "quant-types.gguf has one Q4_0 and one Q8_0 tensor"
    );
    let mut calls = Calls::default();
    let t = dequant_transform(&mut calls);
    let source = fixture("quant-types.gguf");

    let (w, r) = cache_load(dir.path(), &source, &t).unwrap();
    assert_eq!(r.outcome, WM_CACHE_FILLED);
    assert!(r.reason.is_null() && r.replaced.is_null());
    let entry = c_text_of(r.entry).unwrap();
    assert!(entry.starts_with(dir.path().to_str().unwrap()), "{entry}");
    assert!(std::path::Path::new(&entry).is_file());
    assert!(c_text_of(r.message).unwrap().contains("transformed into"));
    assert_holds(&w, &want, true);
    assert_eq!((calls.select, calls.apply), (25, 2));
    drop(w);

    let (w, r) = cache_load(dir.path(), &source, &t).unwrap();
    assert_eq!(r.outcome, WM_CACHE_HIT);
    assert_eq!(c_text_of(r.entry).unwrap(), entry);
    assert!(c_text_of(r.message).unwrap().contains("mapped"));
    assert_holds(&w, &want, true);
    assert_eq!((calls.select, calls.apply), (25, 2), "a hit calls nothing");
}

#[test]
fn without_select_every_tensor_keeps_its_type_and_shape() {
    let dir = tempfile::tempdir().unwrap();
    let mut calls = Calls::default();
    let t = wm_transform {
        select: None,
        ..dequant_transform(&mut calls)
    };
    let (w, r) = cache_load(dir.path(), &fixture("tiny-llama.gguf"), &t).unwrap();
    assert_eq!(r.outcome, WM_CACHE_FILLED);
    let src = load("tiny-llama.gguf", None).unwrap();
    // SAFETY: live weights.
    assert_eq!(unsafe { wm_tensor_count(w.0) }, 12);
    assert_eq!(calls.apply, 12);
    for name in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "test.f32_3d",
        "test.empty",
    ] {
        let (a, b) = (tensor(&w, name).unwrap(), tensor(&src, name).unwrap());
        assert_eq!(
            (a.ggml_type, a.n_dims, a.ne, a.nb),
            (b.ggml_type, b.n_dims, b.ne, b.nb)
        );
        assert_eq!(bytes_of(&a), bytes_of(&b), "{name}");
    }
}

fn entries_in(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().ends_with(".gguf")
        })
        .count()
    })
}

#[test]
fn a_failing_callback_is_a_transform_error_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let source = fixture("quant-types.gguf");
    let mut calls = Calls {
        fail_with: 7,
        ..Calls::default()
    };
    let t = dequant_transform(&mut calls);
    let (rc, msg) = cache_load(dir.path(), &source, &t).unwrap_err();
    assert_eq!(rc, WM_ERR_TRANSFORM);
    assert!(
        msg.contains("quant.q4_0") && msg.contains("dequant-f32") && msg.contains("returned 7"),
        "{msg}"
    );
    assert_eq!(entries_in(dir.path()), 0);

    let mut calls = Calls {
        bad_type: true,
        ..Calls::default()
    };
    let t = dequant_transform(&mut calls);
    let (rc, msg) = cache_load(dir.path(), &source, &t).unwrap_err();
    assert_eq!(rc, WM_ERR_TRANSFORM);
    assert!(msg.contains("quant.q8_0") && msg.contains("999"), "{msg}");
    assert_eq!(entries_in(dir.path()), 0);

    // Nothing was stored: the next load fills.
    let mut calls = Calls::default();
    let t = dequant_transform(&mut calls);
    let (_, r) = cache_load(dir.path(), &source, &t).unwrap();
    assert_eq!(r.outcome, WM_CACHE_FILLED);
}

#[test]
fn a_cache_that_cannot_be_used_transforms_in_memory_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let mut calls = Calls::default();
    let t = dequant_transform(&mut calls);
    let (w, r) = cache_load(&file.join("cache"), &fixture("quant-types.gguf"), &t).unwrap();
    assert_eq!(r.outcome, WM_CACHE_IN_MEMORY);
    assert_eq!(c_text_of(r.reason).as_deref(), Some("io"));
    assert!(r.entry.is_null());
    assert!(c_text_of(r.message).unwrap().starts_with("not cached"));
    assert_holds(&w, &dequantized_in_memory(), false);
}

#[test]
fn cache_load_refuses_null_and_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let d = CString::new(dir.path().to_str().unwrap()).unwrap();
    let source = fixture("quant-types.gguf");
    let mut calls = Calls::default();
    let good = dequant_transform(&mut calls);
    let mut out = null_mut();
    let call = |t: *const wm_transform, src: *const c_char, o: *const wm_options, out| {
        // SAFETY: NULL or valid pointers, as the contract allows.
        let rc = unsafe { wm_cache_load(d.as_ptr(), src, t, o, out, null_mut()) };
        (rc, last_error())
    };
    let bad = |rc: c_int, msg: &str, what: &str| {
        assert_eq!(rc, WM_ERR_BAD_ARGUMENT, "{what}: {msg}");
        assert!(msg.contains(what), "{msg} names {what}");
    };
    let (rc, msg) = call(&good, source.as_ptr(), null(), null_mut());
    bad(rc, &msg, "out");
    let (rc, msg) = call(&good, null(), null(), &mut out);
    bad(rc, &msg, "source_path");
    let (rc, msg) = call(null(), source.as_ptr(), null(), &mut out);
    bad(rc, &msg, "transform");
    let no_name = wm_transform {
        name: null(),
        ..good
    };
    let (rc, msg) = call(&no_name, source.as_ptr(), null(), &mut out);
    bad(rc, &msg, "wm_transform.name");
    let bad_name = wm_transform {
        name: c"\xff".as_ptr(),
        ..good
    };
    let (rc, msg) = call(&bad_name, source.as_ptr(), null(), &mut out);
    bad(rc, &msg, "UTF-8");
    let no_apply = wm_transform {
        apply: None,
        ..good
    };
    let (rc, msg) = call(&no_apply, source.as_ptr(), null(), &mut out);
    bad(rc, &msg, "wm_transform.apply");
    let (rc, msg) = call(&good, source.as_ptr(), &opts(9, 1, 0), &mut out);
    bad(rc, &msg, "mode");
    assert!(out.is_null());

    let missing = c"/nonexistent/model.gguf";
    let (rc, msg) = call(&good, missing.as_ptr(), null(), &mut out);
    assert_eq!(rc, WM_ERR_IO, "{msg}");
    assert_eq!((calls.select, calls.apply), (0, 0));
    assert_eq!(entries_in(dir.path()), 0);
}

/// A tiny MoE file in `dir`: 4 experts of 2 rows of 8 f32 (`ne = [8, 2,
/// 4]`, 256 bytes of 1s), and a 1-D norm (32 bytes of 2s).
fn write_tiny_moe(dir: &std::path::Path) -> CString {
    let path = dir.join("moe.gguf");
    let mut g = weightmap::gguf::Writer::new(32);
    g.tensor(
        "blk.0.ffn_up_exps.weight",
        TensorType::F32,
        &[8, 2, 4],
        vec![1; 256],
    );
    g.tensor("blk.0.norm.weight", TensorType::F32, &[8], vec![2; 32]);
    g.write_with(std::fs::File::create(&path).unwrap(), |_, _| {})
        .unwrap();
    CString::new(path.to_str().unwrap()).unwrap()
}

#[test]
fn the_residency_says_what_streams_under_a_budget_below_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny_moe(dir.path());
    let residency_within = |budget| {
        let mut out = null_mut();
        // SAFETY: valid C string, options and out pointer.
        let rc = unsafe {
            wm_load_within(
                path.as_ptr(),
                &opts(WM_MODE_MMAP, 1, 0),
                budget,
                0,
                &mut out,
            )
        };
        assert_eq!(rc, WM_OK, "{}", last_error());
        let w = Loaded(out);
        let mut r = wm_residency_plan::default();
        // SAFETY: live weights and a place for the answer.
        assert_eq!(unsafe { wm_residency(w.0, &mut r) }, WM_OK);
        // SAFETY: a NULL `out` is refused.
        assert_eq!(
            unsafe { wm_residency(w.0, null_mut()) },
            WM_ERR_BAD_ARGUMENT
        );
        r
    };
    // The runtime's reserve (64 MiB) and 100 bytes: the norm stays, 68
    // bytes of expert slices with it, and the experts stream.
    let reserve = 64 << 20;
    let r = residency_within(reserve + 100);
    assert_eq!(r.kind, WM_RESIDENCY_STREAM_EXPERTS);
    let got = (r.whole, r.experts, r.expert_capacity, r.mapped, r.budget);
    assert_eq!(got, (32, 256, 68, 0, reserve + 100));
    // No room beside the norm: everything streams.
    let r = residency_within(reserve + 20);
    assert_eq!(r.kind, WM_RESIDENCY_STREAM_ALL);
    assert_eq!((r.mapped, r.budget, r.whole), (288, reserve + 20, 0));
    let r = residency_within(1 << 40);
    assert_eq!(r.kind, WM_RESIDENCY_FITS);
    // SAFETY: NULL weights are refused.
    assert_eq!(
        unsafe { wm_residency(null(), &mut r.clone()) },
        WM_ERR_BAD_ARGUMENT
    );
}

/// `wm_prefetch`'s and `wm_prefetch_likely`'s signature.
type Announce = unsafe extern "C" fn(*const wm_weights, *const wm_need, usize) -> c_int;

#[test]
fn announcements_and_guesses_are_checked_and_a_bad_one_is_an_error_the_weights_outlive() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tiny_moe(dir.path());
    let calls: [Announce; 2] = [wm_prefetch, wm_prefetch_likely];
    for (mode, call) in [WM_MODE_MMAP, WM_MODE_STREAM]
        .into_iter()
        .flat_map(|m| calls.map(|c| (m, c)))
    {
        let w = load_path(&path, &opts(mode, 1, 0));
        let experts = [3i32, 0];
        let need = |tensor, experts: &[i32]| wm_need {
            tensor,
            experts: if experts.is_empty() {
                null()
            } else {
                experts.as_ptr()
            },
            n_experts: experts.len() as u32,
        };
        let prefetch = |needs: &[wm_need]| {
            // SAFETY: live weights and `needs.len()` announcements whose
            // experts live for the call.
            unsafe { call(w.0, needs.as_ptr(), needs.len()) }
        };
        assert_eq!(prefetch(&[need(0, &experts), need(1, &[])]), WM_OK);
        // SAFETY: n = 0 reads nothing.
        assert_eq!(unsafe { call(w.0, null(), 0) }, WM_OK);
        assert_eq!(prefetch(&[need(0, &[]), need(2, &[])]), WM_ERR_NOT_FOUND);
        assert_eq!(last_error(), "no tensor 2: the weights hold 2");
        assert_eq!(prefetch(&[need(0, &[4])]), WM_ERR_NOT_FOUND);
        assert!(last_error().contains("has no expert 4"), "{}", last_error());
        assert_eq!(prefetch(&[need(1, &[0])]), WM_ERR_NOT_FOUND);
        let no_ids = wm_need {
            tensor: 0,
            experts: null(),
            n_experts: 2,
        };
        assert_eq!(prefetch(&[no_ids]), WM_ERR_BAD_ARGUMENT);
        // SAFETY: NULL weights are refused before anything is read.
        let rc = unsafe { call(null(), [need(0, &[])].as_ptr(), 1) };
        assert_eq!(rc, WM_ERR_BAD_ARGUMENT);
        // SAFETY: n > 0 with NULL needs is refused.
        assert_eq!(unsafe { call(w.0, null(), 1) }, WM_ERR_BAD_ARGUMENT);
        // The weights answer as before.
        let t = tensor(&w, "blk.0.norm.weight").unwrap();
        assert_eq!(bytes_of(&t), &[2; 32]);
    }
}

#[test]
fn following_a_runtimes_mapping_takes_only_a_mapping_of_the_file() {
    let w = load("tiny-llama.gguf", None).unwrap();
    let heap = vec![0u8; 4096];
    // SAFETY: NULL weights are refused; `data` is only an address.
    let rc = unsafe { wm_follow_mapping(null(), 0, heap.as_ptr().cast()) };
    assert_eq!(rc, WM_ERR_BAD_ARGUMENT);
    // SAFETY: live weights; `data` is only an address.
    let rc = unsafe { wm_follow_mapping(w.0, 1 << 40, heap.as_ptr().cast()) };
    assert_eq!(rc, WM_ERR_NOT_FOUND, "{}", last_error());
    // A heap buffer is no mapping of the file (and on platforms without
    // /proc/self/maps nothing is).
    // SAFETY: as above.
    let rc = unsafe { wm_follow_mapping(w.0, 0, heap.as_ptr().cast()) };
    assert_eq!(rc, WM_ERR_IO);
    let msg = last_error();
    assert!(msg.contains("following the runtime's mapping of"), "{msg}");
}
