//! weightmap's C ABI: load GGUF and safetensors weights from C and C++.
//!
//! The header is `capi/include/weightmap.h`, generated from this file by
//! cbindgen (the test `header_is_current` fails when the committed header
//! drifts; `WM_UPDATE_HEADER=1 cargo test -p weightmap-capi --test header`
//! rewrites it).
//!
//! # Rules of the ABI
//! - Every `int` return is [`WM_OK`] (0) on success and one of the `WM_ERR_*`
//!   codes otherwise; [`wm_last_error`] then says what went wrong and where.
//! - Null pointers, bad indices and bad option values are errors, never
//!   crashes. No Rust panic crosses the boundary: each entry point runs
//!   under `catch_unwind` and a caught panic is [`WM_ERR_INTERNAL`].
//! - Every pointer handed out (tensor names, tensor data, strings, the
//!   fallback reason, the cache report's strings) stays valid until [`wm_free`] of the `wm_weights` it
//!   came from. Strings are NUL-terminated; where a length is returned too,
//!   the length is authoritative (a GGUF string may hold NUL bytes).
//! - A `wm_weights` is immutable once loaded and safe to read from many
//!   threads at once; [`wm_free`] must not race with any other use of it.
//! - Tensor data is read-only: in mmap mode it points into a read-only
//!   mapping of the file, and writing through it faults.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use weightmap::buffer::CpuBufferType;
use weightmap::gguf::Value;
use weightmap::{Error, ErrorKind, LoadMode, LoadOptions, Weights};

mod cache;
mod prefetch;
pub use cache::*;
pub use prefetch::*;

// ---- return codes -----------------------------------------------------------

/// Success.
pub const WM_OK: c_int = 0;
/// The file is not a valid GGUF or safetensors file (bad magic, truncated,
/// out-of-bounds or overlapping tensors, an empty file, not a regular file).
pub const WM_ERR_INVALID_FILE: c_int = 1;
/// An I/O error: the file is missing, unreadable, could not be read.
pub const WM_ERR_IO: c_int = 2;
/// No tensor of that name, no metadata key of that name.
pub const WM_ERR_NOT_FOUND: c_int = 3;
/// The metadata value has another type (or an integer does not fit).
pub const WM_ERR_WRONG_TYPE: c_int = 4;
/// A null pointer, an index out of range, an option value out of range.
pub const WM_ERR_BAD_ARGUMENT: c_int = 5;
/// The mapped path could not be used and `wm_options.fallback` was 0.
pub const WM_ERR_MMAP: c_int = 6;
/// Memory could not be allocated.
pub const WM_ERR_NO_MEMORY: c_int = 7;
/// The tensor cannot be described by `wm_tensor` (more than 4 dimensions).
pub const WM_ERR_UNSUPPORTED: c_int = 8;
/// A bug in weightmap (a caught panic); the message says where.
pub const WM_ERR_INTERNAL: c_int = 9;
/// The caller cancelled the operation (from a progress callback).
pub const WM_ERR_CANCELLED: c_int = 10;
/// A transform given to [`wm_cache_load`] failed: its `apply` callback
/// returned nonzero, or its `select` callback chose an output that cannot
/// be stored (no such ggml type, a bad shape).
pub const WM_ERR_TRANSFORM: c_int = 11;

// ---- load modes ---------------------------------------------------------------

/// `wm_options.mode`: map the file read-only and point tensors at it
/// (the default). A tensor whose address is not aligned for the buffer is
/// copied into an owned buffer and the rest stay mapped (hybrid placement).
pub const WM_MODE_MMAP: u32 = 0;
/// `wm_options.mode`: read every tensor into owned buffers.
pub const WM_MODE_STREAM: u32 = 1;
/// `wm_options.mode`: map, but only if every tensor can be viewed in place;
/// otherwise fall back to the stream path (or fail with [`WM_ERR_MMAP`] when
/// `fallback` is 0). [`wm_mode_used`] reports it as [`WM_MODE_MMAP`].
pub const WM_MODE_MMAP_ALL: u32 = 2;

// ---- types ----------------------------------------------------------------------

/// Loaded weights: opaque. Made by [`wm_load`] (or [`wm_cache_load`]),
/// released by [`wm_free`].
/// Immutable once made; safe to read from many threads at once.
pub struct wm_weights {
    weights: Weights,
    /// Tensor names, NUL-terminated, in tensor order.
    names: Vec<Box<[u8]>>,
    /// Why the mapped path was not used, NUL-terminated.
    fallback: Option<Box<[u8]>>,
    /// Where the load's memory budget came from, NUL-terminated.
    budget_source: Box<[u8]>,
    /// NUL-terminated copies of metadata strings handed out, so that each
    /// pointer stays valid (and the same) until `wm_free`.
    strings: Mutex<StringCache>,
    /// What the cache did, for weights from [`wm_cache_load`].
    cache: Option<cache::ReportStrings>,
}

/// NUL-terminated strings, each in its own allocation so that a pointer to
/// it survives the containers growing.
type CStrings = Arc<Vec<Box<[u8]>>>;

#[derive(Default)]
struct StringCache {
    scalars: HashMap<Box<str>, Box<[u8]>>,
    arrays: HashMap<Box<str>, CStrings>,
}

/// How to load. Start from [`wm_options_default`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct wm_options {
    /// [`WM_MODE_MMAP`] (0, the default), [`WM_MODE_STREAM`] (1) or
    /// [`WM_MODE_MMAP_ALL`] (2).
    pub mode: u32,
    /// 1: fall back to the stream path when the mapped path cannot be used
    /// (the default); 0: fail with [`WM_ERR_MMAP`] instead.
    pub fallback: u32,
    /// The CPU buffer alignment tensors must have to be viewed in place (a
    /// power of two); 0 = the default (32, as ggml's CPU buffer).
    pub alignment: u64,
    /// 1: owned CPU buffers (the stream path, copied tensors) in transparent
    /// huge pages where the kernel gives them (the default); 0: in base
    /// pages (a virtual machine that hands freed memory back to its host
    /// can load faster so).
    pub huge_pages: u32,
    /// 1: once the prefetch has mapped the tensor region, drop and read
    /// again what the page cache held in small folios (another process
    /// filled it), so that decode reads huge pages; 0: not (the default).
    /// Where it cannot act (no huge pages here, no prefetch that maps the
    /// whole region) nothing is re-read; [`wm_huge_pages`] measures the
    /// result.
    pub reread_small_folios: u32,
}

/// A [`wm_huge_page_bytes`] field that could not be measured here.
pub const WM_UNKNOWN: u64 = u64::MAX;

/// How many bytes of the placed tensors sit in huge pages, measured when
/// [`wm_huge_pages`] is called. Decode reads every weight per token, and
/// reads it faster from huge pages.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct wm_huge_page_bytes {
    /// Bytes of the buffers that view the file mapping.
    pub mapped_bytes: u64,
    /// Of those, the bytes this process has mapped (read by now), or
    /// [`WM_UNKNOWN`].
    pub mapped_resident: u64,
    /// Of those, the bytes mapped in huge pages, or [`WM_UNKNOWN`].
    pub mapped_huge: u64,
    /// Bytes of the mapped buffers inside whole huge pages: the most that
    /// can be mapped in huge pages.
    pub mapped_huge_capacity: u64,
    /// Of the resident bytes that could be in huge pages, those in base
    /// pages (small page-cache folios: what `reread_small_folios`
    /// re-reads), or [`WM_UNKNOWN`].
    pub mapped_small: u64,
    /// Bytes of the owned host buffers (copies, the stream path).
    pub owned_bytes: u64,
    /// Of those, the bytes in transparent huge pages, or [`WM_UNKNOWN`].
    pub owned_huge: u64,
    /// Bytes the prefetch dropped and read again because the page cache
    /// held them in small folios (0 when none was asked for or could be).
    pub reread_bytes: u64,
}

/// One tensor, as ggml describes it. Filled by [`wm_tensor_at`] and
/// [`wm_tensor_by_name`]; its pointers stay valid until [`wm_free`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct wm_tensor {
    /// The name, NUL-terminated.
    pub name: *const c_char,
    /// ggml's type id (`enum ggml_type`), or -1 if ggml has no such type
    /// (some safetensors dtypes).
    pub ggml_type: i32,
    /// Number of dimensions in the file (0 for a scalar).
    pub n_dims: i32,
    /// Elements per dimension, ggml order (`ne[0]` innermost); unused dims 1.
    pub ne: [i64; 4],
    /// Strides in bytes, ggml order, as ggml computes them for a contiguous
    /// tensor: `nb[0]` = type size, `nb[1]` = row size, `nb[i]` =
    /// `nb[i-1] * ne[i-1]`.
    pub nb: [u64; 4],
    /// The bytes, read-only: `nbytes` of them.
    pub data: *const c_void,
    /// Size of the data in bytes.
    pub nbytes: u64,
    /// Offset of the data's first byte in the file.
    pub file_offset: u64,
}

// ---- errors -------------------------------------------------------------------------

struct Fail {
    code: c_int,
    msg: String,
}

impl Fail {
    fn new(code: c_int, msg: impl Into<String>) -> Fail {
        Fail {
            code,
            msg: msg.into(),
        }
    }

    fn null(what: &str) -> Fail {
        Fail::new(WM_ERR_BAD_ARGUMENT, format!("{what} is NULL"))
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::new(code_of(&e), e.to_string())
    }
}

/// The return code for a library error: one code per [`ErrorKind`], but
/// for a failed transform, which is the caller's callback and not a bad
/// argument to a call.
fn code_of(e: &Error) -> c_int {
    if matches!(e, Error::Transform { .. }) {
        return WM_ERR_TRANSFORM;
    }
    match e.kind() {
        ErrorKind::InvalidFile => WM_ERR_INVALID_FILE,
        ErrorKind::Io => WM_ERR_IO,
        ErrorKind::NotFound => WM_ERR_NOT_FOUND,
        ErrorKind::WrongType => WM_ERR_WRONG_TYPE,
        ErrorKind::InvalidArgument => WM_ERR_BAD_ARGUMENT,
        ErrorKind::MmapFailed => WM_ERR_MMAP,
        ErrorKind::OutOfMemory => WM_ERR_NO_MEMORY,
        ErrorKind::Unsupported => WM_ERR_UNSUPPORTED,
        ErrorKind::Cancelled => WM_ERR_CANCELLED,
        // A kind added to the library after this ABI was built.
        _ => WM_ERR_INVALID_FILE,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<Box<[u8]>>> = const { RefCell::new(None) };
}

fn set_last_error(msg: &str) {
    let bytes = nul_terminated(msg.as_bytes());
    // `try_with`: during thread teardown the slot may be gone; then the
    // message is dropped, the code still tells the caller.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = Some(bytes));
}

/// `bytes` with a NUL appended, so its pointer is a C string whose length
/// is known to the caller separately.
fn nul_terminated(bytes: &[u8]) -> Box<[u8]> {
    let mut v = Vec::with_capacity(bytes.len() + 1);
    v.extend_from_slice(bytes);
    v.push(0);
    v.into_boxed_slice()
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    format!("internal error (a bug in weightmap): {what}")
}

/// Run `f`, turning its error, or a panic, into a code and `wm_last_error`.
fn guard(f: impl FnOnce() -> Result<(), Fail>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => WM_OK,
        Ok(Err(fail)) => {
            set_last_error(&fail.msg);
            fail.code
        }
        Err(p) => {
            set_last_error(&panic_message(&*p));
            WM_ERR_INTERNAL
        }
    }
}

/// Run `f`, which cannot fail except by a panic; `on_panic` is returned then.
fn guard_value<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        set_last_error(&panic_message(&*p));
        on_panic
    })
}

// ---- pointer helpers (the only unsafe code) ---------------------------------------------

/// The weights behind `w`, or an error for NULL.
///
/// # Safety
/// `w` is NULL or a pointer from [`wm_load`] not yet passed to [`wm_free`].
unsafe fn weights_ref<'a>(w: *const wm_weights) -> Result<&'a wm_weights, Fail> {
    // SAFETY: by the caller's contract a non-null `w` came from `wm_load`
    // (a `Box::into_raw`) and is still live; it is only ever read through
    // shared references, so a `&` to it is sound for as long as it lives.
    unsafe { w.as_ref() }.ok_or_else(|| Fail::null("the weights"))
}

/// The C string at `s` as bytes, or an error for NULL.
///
/// # Safety
/// `s` is NULL or points to a NUL-terminated string that lives as long as `'a`.
unsafe fn c_str<'a>(s: *const c_char, what: &str) -> Result<&'a [u8], Fail> {
    if s.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: non-null, and NUL-terminated and live by the caller's contract.
    Ok(unsafe { CStr::from_ptr(s) }.to_bytes())
}

/// The C string at `s` as UTF-8 (keys and tensor names are UTF-8 in both
/// formats).
///
/// # Safety
/// As [`c_str`].
unsafe fn c_utf8<'a>(s: *const c_char, what: &str) -> Result<&'a str, Fail> {
    // SAFETY: forwarded to the caller.
    let bytes = unsafe { c_str(s, what) }?;
    std::str::from_utf8(bytes).map_err(|_| {
        Fail::new(
            WM_ERR_NOT_FOUND,
            format!(
                "{what} '{}' is not valid UTF-8",
                String::from_utf8_lossy(bytes)
            ),
        )
    })
}

/// Write `value` through `out`, or an error for NULL.
///
/// # Safety
/// `out` is NULL or valid for writing a `T` (alignment included).
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<(), Fail> {
    if out.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: non-null, and valid for a write of `T` by the caller's
    // contract; `write` does not read or drop the old (maybe
    // uninitialized) value.
    unsafe { out.write(value) };
    Ok(())
}

/// A string result: its pointer in `*ptr`, and its length (without the
/// NUL) in `*len` when `len` is not NULL.
///
/// # Safety
/// `ptr` is NULL or valid for writing a pointer; `len` is NULL or valid for
/// writing a `uint64_t`.
unsafe fn put_str(
    ptr: *mut *const c_char,
    p: *const c_char,
    len: *mut u64,
    n: u64,
) -> Result<(), Fail> {
    // SAFETY: forwarded to the caller.
    unsafe { put(ptr, p, "ptr") }?;
    if !len.is_null() {
        // SAFETY: non-null, so valid for a write by the caller's contract.
        unsafe { put(len, n, "len") }?;
    }
    Ok(())
}

// ---- loading ------------------------------------------------------------------------------

/// The default options: mmap mode, fallback to stream on, default
/// alignment, owned buffers in huge pages, no re-read of small folios.
#[no_mangle]
pub extern "C" fn wm_options_default() -> wm_options {
    wm_options {
        mode: WM_MODE_MMAP,
        fallback: 1,
        alignment: 0,
        huge_pages: 1,
        reread_small_folios: 0,
    }
}

/// A 0-or-1 field of `wm_options`, or why not.
fn flag(name: &str, v: u32) -> Result<bool, Fail> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(Fail::new(
            WM_ERR_BAD_ARGUMENT,
            format!("wm_options.{name} is {v}: must be 0 or 1"),
        )),
    }
}

fn load_options(o: &wm_options) -> Result<LoadOptions, Fail> {
    let (mode, all) = match o.mode {
        WM_MODE_MMAP => (LoadMode::Mmap, false),
        WM_MODE_STREAM => (LoadMode::Stream, false),
        WM_MODE_MMAP_ALL => (LoadMode::Mmap, true),
        m => {
            return Err(Fail::new(
                WM_ERR_BAD_ARGUMENT,
                format!(
                    "wm_options.mode is {m}: must be 0 (mmap), 1 (stream) or 2 (mmap, all tensors)"
                ),
            ))
        }
    };
    let fallback = flag("fallback", o.fallback)?;
    let huge_pages = flag("huge_pages", o.huge_pages)?;
    let reread = flag("reread_small_folios", o.reread_small_folios)?;
    let mut opts = LoadOptions::default()
        .mode(mode)
        .fallback(fallback)
        .require_all_mapped(all)
        .reread_small_folios(reread);
    if o.alignment != 0 || !huge_pages {
        let bt = match o.alignment {
            0 => CpuBufferType::new(),
            a => {
                let a = usize::try_from(a).map_err(|_| {
                    Fail::new(
                        WM_ERR_BAD_ARGUMENT,
                        format!("wm_options.alignment {a} is too large"),
                    )
                })?;
                CpuBufferType::with_alignment(a).map_err(|e| {
                    Fail::new(
                        WM_ERR_BAD_ARGUMENT,
                        format!("wm_options.alignment {}: {e}", o.alignment),
                    )
                })?
            }
        };
        opts = opts.buffer_type(Arc::new(bt.huge_pages(huge_pages)));
    }
    Ok(opts)
}

#[cfg(unix)]
fn path_of(bytes: &[u8]) -> Result<PathBuf, Fail> {
    use std::os::unix::ffi::OsStrExt;
    Ok(std::ffi::OsStr::from_bytes(bytes).into())
}

#[cfg(not(unix))]
fn path_of(bytes: &[u8]) -> Result<PathBuf, Fail> {
    std::str::from_utf8(bytes)
        .map(PathBuf::from)
        .map_err(|_| Fail::new(WM_ERR_BAD_ARGUMENT, "the path is not valid UTF-8"))
}

fn build(weights: Weights) -> Result<wm_weights, Fail> {
    let n = weights.len();
    let mut names = Vec::with_capacity(n);
    for t in weights.tensors() {
        names.push(nul_terminated(t.name().as_bytes()));
    }
    let fallback = weights
        .report()
        .fallback
        .as_ref()
        .map(|r| nul_terminated(format!("{}: {r}", r.name()).as_bytes()));
    let budget_source = nul_terminated(weights.report().budget.source.as_bytes());
    Ok(wm_weights {
        budget_source,
        weights,
        names,
        fallback,
        strings: Mutex::new(StringCache::default()),
        cache: None,
    })
}

/// What every load starts from, once `*out` is cleared (so that every
/// failure leaves NULL there): the file at `path` (named `what` in
/// messages), and the options `opts` say (NULL: [`wm_options_default`]).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `opts` is NULL or points to a
/// `wm_options`; `out` is NULL or valid for writing a pointer.
unsafe fn load_args(
    path: *const c_char,
    what: &str,
    opts: *const wm_options,
    out: *mut *mut wm_weights,
) -> Result<(PathBuf, LoadOptions), Fail> {
    // SAFETY: forwarded to the caller.
    unsafe { put(out, std::ptr::null_mut(), "out") }?;
    // SAFETY: forwarded to the caller.
    let path = path_of(unsafe { c_str(path, what) }?)?;
    // SAFETY: forwarded to the caller.
    let o = unsafe { opts.as_ref() }
        .copied()
        .unwrap_or_else(|| wm_options_default());
    Ok((path, load_options(&o)?))
}

/// Load the GGUF or safetensors file at `path` (the format is told by its
/// content) as `opts` say (NULL = [`wm_options_default`]), and store the
/// result in `*out` (set to NULL on failure).
///
/// In mmap mode the file must not be modified or truncated, by this or any
/// other process, until [`wm_free`]: tensor data points into the mapping.
/// Use [`WM_MODE_STREAM`] when that cannot be promised.
///
/// Returns [`WM_OK`], or [`WM_ERR_BAD_ARGUMENT`] (NULL `path` or `out`, bad
/// options), [`WM_ERR_IO`], [`WM_ERR_INVALID_FILE`], [`WM_ERR_MMAP`],
/// [`WM_ERR_NO_MEMORY`].
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `opts` is NULL or points to a
/// `wm_options`; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn wm_load(
    path: *const c_char,
    opts: *const wm_options,
    out: *mut *mut wm_weights,
) -> c_int {
    // SAFETY: the same contract.
    unsafe { wm_load_within(path, opts, 0, 0, out) }
}

/// [`wm_load`] held to a memory budget of `budget` bytes instead of the one
/// read from the system (0: read it, as `wm_load` does), and, with
/// `ignore_budget` 1, going ahead with copies over the budget instead of
/// failing with [`WM_ERR_NO_MEMORY`] (0: refuse them). The budget decides
/// the stream path's and the copied tensors' refusal, the prefetch and the
/// window of [`wm_pass`]; [`wm_budget`] reports it.
///
/// Returns what [`wm_load`] returns, and [`WM_ERR_BAD_ARGUMENT`] for an
/// `ignore_budget` other than 0 or 1.
///
/// # Safety
/// As for [`wm_load`].
#[no_mangle]
pub unsafe extern "C" fn wm_load_within(
    path: *const c_char,
    opts: *const wm_options,
    budget: u64,
    ignore_budget: u32,
    out: *mut *mut wm_weights,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let (path, mut options) = unsafe { load_args(path, "path", opts, out) }?;
        options = match ignore_budget {
            0 => options,
            1 => options.ignore_budget(true),
            v => {
                return Err(Fail::new(
                    WM_ERR_BAD_ARGUMENT,
                    format!("ignore_budget is {v}: must be 0 or 1"),
                ))
            }
        };
        if budget != 0 {
            options = options.budget(budget);
        }
        // SAFETY: the caller promises (documented above and in the header)
        // not to modify or truncate the file until `wm_free`, which is when
        // the `Weights` and everything handed out from it die.
        let weights = unsafe { Weights::load(&path, &options) }?;
        let boxed = Box::new(build(weights)?);
        // SAFETY: as above.
        unsafe { put(out, Box::into_raw(boxed), "out") }
    })
}

/// This thread's last error message, NUL-terminated; NULL if no call on
/// this thread has failed yet. Only failing calls set it; the pointer stays
/// valid until the next failing call on this thread.
#[no_mangle]
pub extern "C" fn wm_last_error() -> *const c_char {
    guard_value(std::ptr::null(), || {
        LAST_ERROR
            .try_with(|slot| {
                slot.borrow()
                    .as_ref()
                    .map_or(std::ptr::null(), |b| b.as_ptr().cast())
            })
            .unwrap_or(std::ptr::null())
    })
}

/// Release weights from [`wm_load`], and with them every pointer handed
/// out from them. NULL is fine. No other thread may be using `w`.
///
/// # Safety
/// `w` is NULL or a pointer from [`wm_load`] not yet passed to `wm_free`.
#[no_mangle]
pub unsafe extern "C" fn wm_free(w: *mut wm_weights) {
    if w.is_null() {
        return;
    }
    // SAFETY: `w` came from `Box::into_raw` in `wm_load` and is freed once,
    // by the contract.
    let b = unsafe { Box::from_raw(w) };
    guard_value((), move || drop(b));
}

/// The mode that ran: 0 (mmap; possibly with some tensors copied) or 1
/// (stream); -1 for NULL.
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`].
#[no_mangle]
pub unsafe extern "C" fn wm_mode_used(w: *const wm_weights) -> c_int {
    guard_value(-1, || {
        // SAFETY: by the contract.
        match unsafe { weights_ref(w) } {
            Ok(w) => match w.weights.report().mode_used {
                LoadMode::Mmap => WM_MODE_MMAP as c_int,
                LoadMode::Stream => WM_MODE_STREAM as c_int,
            },
            Err(f) => {
                set_last_error(&f.msg);
                -1
            }
        }
    })
}

/// Why the mapped path was asked for and not used, as `"kind: detail"`
/// (kinds: `misaligned`, `map`, `not_host`, `unsupported`,
/// `file_changed`); NULL when it was used, when stream mode was asked for,
/// or for NULL `w`.
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`].
#[no_mangle]
pub unsafe extern "C" fn wm_fallback_reason(w: *const wm_weights) -> *const c_char {
    guard_value(std::ptr::null(), || {
        // SAFETY: by the contract.
        match unsafe { weights_ref(w) } {
            Ok(w) => w
                .fallback
                .as_ref()
                .map_or(std::ptr::null(), |b| b.as_ptr().cast()),
            Err(_) => std::ptr::null(),
        }
    })
}

/// The memory budget the load was held to, in `*bytes` (what the process
/// could still use: MemAvailable, or a memory cgroup's limit less the usage
/// it cannot reclaim, whichever is less; or the figure `$WEIGHTMAP_BUDGET`
/// gives), and in `*source` where that figure came from (`"MemAvailable"`,
/// `"cgroup v1 /NAME memory.limit_in_bytes"`, `"WEIGHTMAP_BUDGET"`, ...),
/// valid until [`wm_free`]. `source` may be NULL.
///
/// Returns [`WM_OK`], [`WM_ERR_NOT_FOUND`] when no figure could be read
/// (`*source` still says why), [`WM_ERR_BAD_ARGUMENT`] (NULL `w` or `bytes`).
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `bytes` is NULL or valid
/// for writing a `uint64_t`; `source` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn wm_budget(
    w: *const wm_weights,
    bytes: *mut u64,
    source: *mut *const c_char,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let w = unsafe { weights_ref(w) }?;
        if bytes.is_null() {
            return Err(Fail::null("bytes"));
        }
        if !source.is_null() {
            // SAFETY: by the contract, `source` is valid for writing.
            unsafe { source.write(w.budget_source.as_ptr().cast()) };
        }
        let b = w
            .weights
            .report()
            .budget
            .bytes
            .ok_or_else(|| Fail::new(WM_ERR_NOT_FOUND, "no memory budget could be read"))?;
        // SAFETY: by the contract, `bytes` is valid for writing.
        unsafe { bytes.write(b) };
        Ok(())
    })
}

/// Measure how many bytes of the placed tensors sit in huge pages now, into
/// `*out` (fields that cannot be measured here are [`WM_UNKNOWN`]): after
/// the prefetch or a first pass, since a mapping has no pages until read.
///
/// Returns [`WM_OK`], or [`WM_ERR_BAD_ARGUMENT`] (NULL `w` or `out`).
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `out` is NULL or valid
/// for writing a [`wm_huge_page_bytes`].
#[no_mangle]
pub unsafe extern "C" fn wm_huge_pages(
    w: *const wm_weights,
    out: *mut wm_huge_page_bytes,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let w = unsafe { weights_ref(w) }?;
        if out.is_null() {
            return Err(Fail::null("out"));
        }
        let h = w.weights.huge_pages();
        let known = |v: Option<u64>| v.unwrap_or(WM_UNKNOWN);
        let reread = w.weights.prefetch_progress().map_or(0, |p| p.bytes_reread);
        let figures = wm_huge_page_bytes {
            mapped_bytes: h.mapped_bytes,
            mapped_resident: known(h.mapped_resident),
            mapped_huge: known(h.mapped_huge),
            mapped_huge_capacity: h.mapped_huge_capacity,
            mapped_small: known(h.mapped_small()),
            owned_bytes: h.owned_bytes,
            owned_huge: known(h.owned_huge),
            reread_bytes: reread,
        };
        // SAFETY: by the contract, `out` is valid for writing.
        unsafe { out.write(figures) };
        Ok(())
    })
}

// ---- tensors --------------------------------------------------------------------------------

/// Number of tensors; 0 for NULL.
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`].
#[no_mangle]
pub unsafe extern "C" fn wm_tensor_count(w: *const wm_weights) -> u64 {
    guard_value(0, || {
        // SAFETY: by the contract.
        unsafe { weights_ref(w) }.map_or(0, |w| w.weights.len() as u64)
    })
}

/// Tensor `i` of `w`, or a bad-argument failure naming the range.
/// What every per-tensor call with an output starts from: tensor `i` of
/// `w`, once the output pointer is known not to be NULL (`out_is_null`).
///
/// # Safety
/// As [`weights_ref`].
unsafe fn tensor_args<'a>(
    w: *const wm_weights,
    i: u64,
    out_is_null: bool,
) -> Result<weightmap::TensorRef<'a>, Fail> {
    // SAFETY: forwarded to the caller.
    let w = unsafe { weights_ref(w) }?;
    if out_is_null {
        return Err(Fail::null("out"));
    }
    tensor_of(w, i)
}

fn tensor_of(w: &wm_weights, i: u64) -> Result<weightmap::TensorRef<'_>, Fail> {
    usize::try_from(i)
        .ok()
        .and_then(|i| w.weights.tensor_at(i))
        .ok_or_else(|| {
            Fail::new(
                WM_ERR_BAD_ARGUMENT,
                format!(
                    "tensor index {i} is out of range ({} tensors)",
                    w.weights.len()
                ),
            )
        })
}

fn describe(w: &wm_weights, i: usize) -> Result<wm_tensor, Fail> {
    let t = tensor_of(w, i as u64)?;
    let bytes = t.host_bytes().ok_or_else(|| {
        Fail::new(
            WM_ERR_INTERNAL,
            format!("tensor '{}' is not in host memory", t.name()),
        )
    })?;
    describe_info(&t.info(), w.names[i].as_ptr().cast(), bytes.as_ptr().cast())
}

/// `info` as a `wm_tensor` whose name is at `name` and bytes at `data`.
fn describe_info(
    info: &weightmap::TensorInfo<'_>,
    name: *const c_char,
    data: *const c_void,
) -> Result<wm_tensor, Fail> {
    let dims = info.ne();
    if dims.len() > 4 {
        return Err(Fail::new(
            WM_ERR_UNSUPPORTED,
            format!(
                "tensor '{}' has {} dimensions; wm_tensor holds at most 4",
                info.name,
                dims.len()
            ),
        ));
    }
    let mut ne = [1i64; 4];
    for (slot, &d) in ne.iter_mut().zip(&dims) {
        *slot = i64::try_from(d).map_err(|_| {
            Fail::new(
                WM_ERR_UNSUPPORTED,
                format!("tensor '{}' has a dimension of {d}", info.name),
            )
        })?;
    }
    // ggml's strides for a contiguous tensor (ggml_new_tensor_impl).
    let ty = info.ty;
    let mut nb = [0u64; 4];
    nb[0] = ty.type_size();
    nb[1] = nb[0].saturating_mul(ne[0] as u64 / ty.block_size());
    for k in 2..4 {
        nb[k] = nb[k - 1].saturating_mul(ne[k - 1] as u64);
    }
    Ok(wm_tensor {
        name,
        ggml_type: ty
            .ggml_id()
            .and_then(|id| i32::try_from(id).ok())
            .unwrap_or(-1),
        n_dims: dims.len() as i32,
        ne,
        nb,
        data,
        nbytes: info.nbytes,
        file_offset: info.file_offset,
    })
}

/// Describe tensor `i` (file order, `0 <= i < wm_tensor_count(w)`) in `*out`.
///
/// Returns [`WM_OK`], [`WM_ERR_BAD_ARGUMENT`] (NULL `w` or `out`, `i` out
/// of range), [`WM_ERR_UNSUPPORTED`].
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `out` is NULL or valid
/// for writing a `wm_tensor`.
#[no_mangle]
pub unsafe extern "C" fn wm_tensor_at(w: *const wm_weights, i: u64, out: *mut wm_tensor) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let w = unsafe { weights_ref(w) }?;
        if out.is_null() {
            return Err(Fail::null("out"));
        }
        let i = usize::try_from(i).unwrap_or(usize::MAX);
        let t = describe(w, i)?;
        // SAFETY: by the contract.
        unsafe { put(out, t, "out") }
    })
}

/// Describe the tensor named `name` in `*out`.
///
/// Returns [`WM_OK`], [`WM_ERR_NOT_FOUND`], [`WM_ERR_BAD_ARGUMENT`] (NULL
/// `w`, `name` or `out`), [`WM_ERR_UNSUPPORTED`].
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `name` is NULL or a
/// NUL-terminated string; `out` is NULL or valid for writing a `wm_tensor`.
#[no_mangle]
pub unsafe extern "C" fn wm_tensor_by_name(
    w: *const wm_weights,
    name: *const c_char,
    out: *mut wm_tensor,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let w = unsafe { weights_ref(w) }?;
        // SAFETY: by the contract.
        let name = unsafe { c_utf8(name, "tensor name") }?;
        if out.is_null() {
            return Err(Fail::null("out"));
        }
        let i = w.weights.tensor_index(name).ok_or_else(|| {
            Fail::new(
                WM_ERR_NOT_FOUND,
                format!("no tensor named '{name}' in {}", w.weights.path().display()),
            )
        })?;
        let t = describe(w, i)?;
        // SAFETY: by the contract.
        unsafe { put(out, t, "out") }
    })
}

/// What [`wm_pass`] calls with each tensor: `ctx` as given, the tensor's
/// index (as for [`wm_tensor_at`]) and its description, whose `data` is
/// resident for the call. Return 0 to go on, anything else to stop the pass.
pub type wm_pass_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, i: u64, t: *const wm_tensor) -> c_int>;

/// Visit every tensor once, in file order, through the bounded pass: each
/// tensor's pages are read before `f` is called with it, reads of the next
/// ones are queued up to `window` bytes ahead (0: half of the memory
/// budget, from 4 to 64 MiB), and, unless `keep_pages` is 1, the pages of
/// each are dropped, a batch at a time, after `f` returns: what an upload to a device, a
/// conversion or a hash needs, in bounded memory. The pointers in `*t` stay
/// valid until [`wm_free`] (pages dropped are read again if used).
///
/// Returns [`WM_OK`] when every tensor was visited, [`WM_ERR_CANCELLED`]
/// when `f` stopped the pass, [`WM_ERR_BAD_ARGUMENT`] (NULL `w` or `f`),
/// [`WM_ERR_IO`], [`WM_ERR_UNSUPPORTED`] (a tensor `wm_tensor` cannot hold).
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `f` is NULL or a
/// function that may be called with `ctx` from this thread.
#[no_mangle]
pub unsafe extern "C" fn wm_pass(
    w: *const wm_weights,
    window: u64,
    keep_pages: u32,
    f: wm_pass_fn,
    ctx: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let w = unsafe { weights_ref(w) }?;
        let f = f.ok_or_else(|| Fail::null("f"))?;
        let mut pass = w.weights.pass().keep_pages(keep_pages == 1);
        if window > 0 {
            pass = pass.window(window);
        }
        for t in pass {
            let t = t?;
            let i = w.weights.tensor_index(t.name()).ok_or_else(|| {
                Fail::new(
                    WM_ERR_INTERNAL,
                    format!("tensor '{}' has no index", t.name()),
                )
            })?;
            let d = describe(w, i)?;
            // SAFETY: the caller promises `f` may be called with `ctx`; `d`
            // lives for the call.
            if unsafe { f(ctx, i as u64, &d) } != 0 {
                return Err(Fail::new(
                    WM_ERR_CANCELLED,
                    "the pass was stopped by its callback",
                ));
            }
        }
        Ok(())
    })
}

/// Whether tensor `i` is viewed in place in the file mapping (1) or was
/// copied into an owned buffer (0; always so in stream mode), in `*out`.
///
/// Returns [`WM_OK`] or [`WM_ERR_BAD_ARGUMENT`].
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `out` is NULL or valid
/// for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn wm_tensor_is_mapped(
    w: *const wm_weights,
    i: u64,
    out: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let t = unsafe { tensor_args(w, i, out.is_null()) }?;
        let mapped = t.placement_kind() == weightmap::PlacementKind::Mapped;
        // SAFETY: by the contract.
        unsafe { put(out, c_int::from(mapped), "out") }
    })
}

/// Dequantize rows `[row_begin, row_end)` of tensor `i` to f32 into `out`,
/// which holds `out_len` floats: exactly `(row_end - row_begin) * ne[0]`
/// (a row is `ne[0]` elements; pass `0` and the tensor's row count,
/// `ne[1] * ne[2] * ne[3]`, for the whole tensor). ggml's reference
/// semantics for every type with a block layout (`weightmap::quant`).
///
/// Returns [`WM_OK`]; [`WM_ERR_BAD_ARGUMENT`] for a bad index, range or
/// length; [`WM_ERR_UNSUPPORTED`] for a type without a dequantization (Q8_1).
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `out` is NULL or valid
/// for writing `out_len` floats.
#[no_mangle]
pub unsafe extern "C" fn wm_tensor_dequantize(
    w: *const wm_weights,
    i: u64,
    row_begin: u64,
    row_end: u64,
    out: *mut f32,
    out_len: u64,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let t = unsafe { tensor_args(w, i, out.is_null()) }?;
        let n = usize::try_from(out_len)
            .map_err(|_| Fail::new(WM_ERR_BAD_ARGUMENT, "out_len does not fit in memory"))?;
        // SAFETY: the caller promises `out` is valid for `out_len` floats,
        // and nothing else refers to that memory during this call.
        let out = unsafe { std::slice::from_raw_parts_mut(out, n) };
        t.rows_f32(row_begin..row_end, out)?;
        Ok(())
    })
}

// ---- metadata ---------------------------------------------------------------------------------

/// What every `wm_meta_*` call starts from: the weights and the key, once
/// the output pointer `what` is known not to be NULL (`out_is_null`).
///
/// # Safety
/// `w` and `key` as the calling function's contract says.
unsafe fn meta_args<'a>(
    w: *const wm_weights,
    key: *const c_char,
    out_is_null: bool,
    what: &str,
) -> Result<(&'a wm_weights, &'a str), Fail> {
    // SAFETY: forwarded to the caller.
    let w = unsafe { weights_ref(w) }?;
    // SAFETY: forwarded to the caller.
    let key = unsafe { c_utf8(key, "key") }?;
    if out_is_null {
        return Err(Fail::null(what));
    }
    Ok((w, key))
}

/// The GGUF metadata of `w`, or why a lookup of `key` finds none.
fn gguf_meta<'a>(w: &'a wm_weights, key: &str) -> Result<weightmap::gguf::Metadata<'a>, Fail> {
    w.weights.gguf_metadata().ok_or_else(|| no_metadata(w, key))
}

fn no_metadata(w: &wm_weights, key: &str) -> Fail {
    Fail::new(
        WM_ERR_NOT_FOUND,
        format!(
            "metadata key '{key}' not found: {} is a {} file without GGUF metadata",
            w.weights.path().display(),
            w.weights.format().name()
        ),
    )
}

/// The integer at `key` (stored as any GGUF integer type whose value fits
/// in a u64) in `*out`.
///
/// Returns [`WM_OK`], [`WM_ERR_NOT_FOUND`], [`WM_ERR_WRONG_TYPE`] (not an
/// integer, or negative), [`WM_ERR_BAD_ARGUMENT`].
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `key` is NULL or a
/// NUL-terminated string; `out` is NULL or valid for writing a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn wm_meta_u64(
    w: *const wm_weights,
    key: *const c_char,
    out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let (w, key) = unsafe { meta_args(w, key, out.is_null(), "out") }?;
        let md = gguf_meta(w, key)?;
        let v = md.get_int::<u64>(key)?;
        // SAFETY: by the contract.
        unsafe { put(out, v, "out") }
    })
}

/// The float at `key` (stored as f32 or f64) in `*out`.
///
/// Returns [`WM_OK`], [`WM_ERR_NOT_FOUND`], [`WM_ERR_WRONG_TYPE`],
/// [`WM_ERR_BAD_ARGUMENT`].
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `key` is NULL or a
/// NUL-terminated string; `out` is NULL or valid for writing a `double`.
#[no_mangle]
pub unsafe extern "C" fn wm_meta_f64(
    w: *const wm_weights,
    key: *const c_char,
    out: *mut f64,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let (w, key) = unsafe { meta_args(w, key, out.is_null(), "out") }?;
        let md = gguf_meta(w, key)?;
        let v = match md.get(key) {
            Some(Value::F32(v)) => f64::from(v),
            Some(Value::F64(v)) => v,
            Some(other) => {
                return Err(Fail::new(
                    WM_ERR_WRONG_TYPE,
                    format!(
                        "metadata key '{key}' holds {}, not a float",
                        other.value_type().name()
                    ),
                ))
            }
            None => return Err(Error::KeyNotFound { key: key.into() }.into()),
        };
        // SAFETY: by the contract.
        unsafe { put(out, v, "out") }
    })
}

/// The string at `key`: `*ptr` gets its bytes, NUL-terminated, and `*len`
/// (if `len` is not NULL) their number, without the NUL. The bytes are the
/// file's (GGUF strings are meant to be UTF-8). For a safetensors file, the
/// keys are those of its `__metadata__`.
///
/// Returns [`WM_OK`], [`WM_ERR_NOT_FOUND`], [`WM_ERR_WRONG_TYPE`],
/// [`WM_ERR_BAD_ARGUMENT`].
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `key` is NULL or a
/// NUL-terminated string; `ptr` is NULL or valid for writing a pointer;
/// `len` is NULL or valid for writing a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn wm_meta_str(
    w: *const wm_weights,
    key: *const c_char,
    ptr: *mut *const c_char,
    len: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let (w, key) = unsafe { meta_args(w, key, ptr.is_null(), "ptr") }?;
        let bytes: &[u8] = match w.weights.gguf_metadata() {
            Some(md) => md.get_gguf_str(key)?.as_bytes(),
            None => match w.weights.safetensors_metadata().and_then(|m| m.get(key)) {
                Some(s) => s.as_bytes(),
                None => return Err(Error::KeyNotFound { key: key.into() }.into()),
            },
        };
        let n = bytes.len() as u64;
        let p = {
            let mut cache = w.strings.lock().unwrap_or_else(|e| e.into_inner());
            cache
                .scalars
                .entry(key.into())
                .or_insert_with(|| nul_terminated(bytes))
                .as_ptr()
        };
        // SAFETY: by the contract. The pointer is into a boxed slice the
        // cache keeps, unmoved, until `wm_free`.
        unsafe { put_str(ptr, p.cast(), len, n) }
    })
}

/// The number of elements of the array at `key` in `*out`.
///
/// Returns [`WM_OK`], [`WM_ERR_NOT_FOUND`], [`WM_ERR_WRONG_TYPE`] (not an
/// array), [`WM_ERR_BAD_ARGUMENT`].
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `key` is NULL or a
/// NUL-terminated string; `out` is NULL or valid for writing a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn wm_meta_array_len(
    w: *const wm_weights,
    key: *const c_char,
    out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let (w, key) = unsafe { meta_args(w, key, out.is_null(), "out") }?;
        let md = gguf_meta(w, key)?;
        let n = md.get_array(key)?.len();
        // SAFETY: by the contract.
        unsafe { put(out, n, "out") }
    })
}

/// Element `i` of the string array at `key` (such as
/// `tokenizer.ggml.tokens`): as [`wm_meta_str`]. The first call for a key
/// copies all its strings once, so walking a whole array is linear.
///
/// Returns [`WM_OK`], [`WM_ERR_NOT_FOUND`], [`WM_ERR_WRONG_TYPE`] (not an
/// array of strings), [`WM_ERR_BAD_ARGUMENT`] (NULL pointers, `i` out of
/// range).
///
/// # Safety
/// As [`wm_meta_str`].
#[no_mangle]
pub unsafe extern "C" fn wm_meta_array_str(
    w: *const wm_weights,
    key: *const c_char,
    i: u64,
    ptr: *mut *const c_char,
    len: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let (w, key) = unsafe { meta_args(w, key, ptr.is_null(), "ptr") }?;
        let md = gguf_meta(w, key)?;
        let arr = md.get_array(key)?;
        let strings = arr.strings()?;
        let all = {
            let mut cache = w.strings.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(cache.arrays.entry(key.into()).or_insert_with(|| {
                Arc::new(strings.map(|s| nul_terminated(s.as_bytes())).collect())
            }))
        };
        let s = usize::try_from(i)
            .ok()
            .and_then(|i| all.get(i))
            .ok_or_else(|| {
                Fail::new(
                    WM_ERR_BAD_ARGUMENT,
                    format!(
                        "index {i} is out of range for metadata array '{key}' ({} elements)",
                        arr.len()
                    ),
                )
            })?;
        // The stored slice carries the NUL; the length does not count it.
        let n = (s.len() - 1) as u64;
        // SAFETY: by the contract. The pointer is into a boxed slice the
        // cache keeps (through its `Arc`), unmoved, until `wm_free`.
        unsafe { put_str(ptr, s.as_ptr().cast(), len, n) }
    })
}

/// weightmap's version, e.g. `"0.1.0"`: a static string.
#[no_mangle]
pub extern "C" fn wm_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

// `wm_weights` is read from many threads at once: the header promises it.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<wm_weights>();
};

#[cfg(test)]
mod tests;
