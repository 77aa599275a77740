//! The transform cache from C: [`wm_cache_load`] runs a runtime's
//! transform (a dequantization, a repack for its kernels) once, into an
//! entry file, and maps the entry on every later load, so that the
//! transformed weights are file-backed pages shared by every process
//! instead of anonymous memory in each (`weightmap::cache`).
//!
//! The transform is a pair of callbacks: `select` says which tensors the
//! entry holds and as what (ggml type and `ne`), `apply` computes one output
//! tensor from one source tensor. Both run only on a miss, on the calling
//! thread.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};

use weightmap::cache::{Cache, CacheOutcome, CacheReport, Transform};
use weightmap::{Error, TensorInfo, TensorType};

use crate::*;

/// `wm_cache_report.outcome`: a valid entry was mapped; nothing was
/// transformed and no callback was called.
pub const WM_CACHE_HIT: u32 = 0;
/// `wm_cache_report.outcome`: there was no valid entry; the transform ran
/// into a new one, which is now mapped (and serves every later load).
pub const WM_CACHE_FILLED: u32 = 1;
/// `wm_cache_report.outcome`: the cache could not be used (`reason` says
/// why); the transform ran into memory, as it would without a cache.
pub const WM_CACHE_IN_MEMORY: u32 = 2;

/// What a transform's `select` callback is called with, once for each
/// source tensor on a miss: `user` as given, the source tensor's
/// description (`src->data` is NULL: its bytes are not read yet), and its
/// ggml type and `ne[4]` in `*ggml_type` and `ne`, which the callback may
/// change to those of the output. Return nonzero to put the tensor in the
/// entry, as `*ggml_type` and `ne` then say; 0 to leave it out (the runtime
/// takes it from the source).
pub type wm_select_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        src: *const wm_tensor,
        ggml_type: *mut i32,
        ne: *mut i64,
    ) -> c_int,
>;

/// What a transform's `apply` callback is called with, once for each tensor
/// `select` kept, in file order, on a miss: `user` as given, the source
/// tensor (`src->data` holds its `src->nbytes` bytes, read-only), and the
/// output's `dst_size` bytes, zeroed, to fill. Return 0 on success; anything
/// else fails the load with [`WM_ERR_TRANSFORM`] and nothing is
/// stored. When the cache cannot take the entry, a tensor's `apply` may be
/// called a second time, into memory.
pub type wm_apply_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        src: *const wm_tensor,
        dst: *mut c_void,
        dst_size: usize,
    ) -> c_int,
>;

/// A transform of a model's tensors, one at a time, for
/// [`wm_cache_load`]. An entry is keyed by `name`, `version` and `machine`
/// (and by the source's identity and a fingerprint of its bytes): bump
/// `version` whenever the output changes for the same input, and name in
/// `machine` every fact of the machine the output depends on (the CPU
/// features a repack targets). weightmap adds the page size, the
/// architecture and the OS itself.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct wm_transform {
    /// The transform's name, NUL-terminated UTF-8 (required).
    pub name: *const c_char,
    /// Its version.
    pub version: u32,
    /// The machine facts its output depends on, NUL-terminated UTF-8; NULL
    /// for none.
    pub machine: *const c_char,
    /// Which tensors, as what; NULL: every tensor, keeping its type and
    /// shape (a repack).
    pub select: wm_select_fn,
    /// The transform of one tensor (required).
    pub apply: wm_apply_fn,
    /// Passed to both callbacks as it is.
    pub user: *mut c_void,
}

/// What [`wm_cache_load`] did. Its strings are NUL-terminated and stay
/// valid until [`wm_free`] of the weights it came with.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct wm_cache_report {
    /// [`WM_CACHE_HIT`], [`WM_CACHE_FILLED`] or [`WM_CACHE_IN_MEMORY`].
    pub outcome: u32,
    /// Why the cache could not be used, as a stable name (`"read_only"`,
    /// `"no_space"`, `"unsafe_directory"`, `"no_directory"`,
    /// `"source_changed"`, `"invalid_max_size"`, `"io"`, ...: those of
    /// weightmap's `CacheBypass::name`); NULL unless the outcome is
    /// [`WM_CACHE_IN_MEMORY`].
    pub reason: *const c_char,
    /// The whole report as a sentence ("cached: mapped PATH", "not cached
    /// (WHY): transformed in memory", ...).
    pub message: *const c_char,
    /// The entry's file; NULL in memory.
    pub entry: *const c_char,
    /// Why an entry that was there was not used and was replaced (a
    /// checksum that did not match, ...); NULL when none was.
    pub replaced: *const c_char,
    /// Wall time of the whole load (lookup, transform and writes), in
    /// nanoseconds.
    pub elapsed_ns: u64,
}

/// The report's strings, kept by the weights so that the pointers handed
/// out stay valid until `wm_free`.
pub(crate) struct ReportStrings {
    outcome: u32,
    reason: Option<Box<[u8]>>,
    message: Box<[u8]>,
    entry: Option<Box<[u8]>>,
    replaced: Option<Box<[u8]>>,
    elapsed_ns: u64,
}

impl ReportStrings {
    fn of(r: &CacheReport) -> ReportStrings {
        let (outcome, reason) = match &r.outcome {
            CacheOutcome::Hit => (WM_CACHE_HIT, None),
            CacheOutcome::Filled => (WM_CACHE_FILLED, None),
            CacheOutcome::InMemory(why) => (WM_CACHE_IN_MEMORY, Some(why.name())),
            // An outcome added to the library after this ABI: whatever it
            // is, it is not an entry the ABI can describe.
            other => (WM_CACHE_IN_MEMORY, Some(other.name())),
        };
        let text = |s: &str| nul_terminated(s.as_bytes());
        ReportStrings {
            outcome,
            reason: reason.map(text),
            message: text(&r.to_string()),
            entry: r
                .entry
                .as_ref()
                .map(|p| nul_terminated(p.as_os_str().as_encoded_bytes())),
            replaced: r.replaced.as_deref().map(text),
            elapsed_ns: u64::try_from(r.elapsed.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    fn report(&self) -> wm_cache_report {
        let ptr =
            |s: &Option<Box<[u8]>>| s.as_ref().map_or(std::ptr::null(), |b| b.as_ptr().cast());
        wm_cache_report {
            outcome: self.outcome,
            reason: ptr(&self.reason),
            message: self.message.as_ptr().cast(),
            entry: ptr(&self.entry),
            replaced: ptr(&self.replaced),
            elapsed_ns: self.elapsed_ns,
        }
    }
}

/// The C string at `s` as UTF-8, or a bad-argument failure.
///
/// # Safety
/// As [`c_str`].
unsafe fn c_text<'a>(s: *const c_char, what: &str) -> Result<&'a str, Fail> {
    // SAFETY: forwarded to the caller.
    let bytes = unsafe { c_str(s, what) }?;
    std::str::from_utf8(bytes)
        .map_err(|_| Fail::new(WM_ERR_BAD_ARGUMENT, format!("{what} is not valid UTF-8")))
}

/// The output a `select` callback chose for `src`, checked: a type ggml
/// and GGUF know, and a shape (`ne`, as many dimensions as the source's or
/// up to the last one that is not 1) whose rows hold whole blocks.
fn selected_output(
    src: &wm_tensor,
    ggml_type: i32,
    ne: [i64; 4],
) -> Result<(TensorType, Vec<u64>), String> {
    let ty = u32::try_from(ggml_type)
        .ok()
        .and_then(TensorType::from_ggml_id)
        .ok_or_else(|| {
            format!("select chose ggml type {ggml_type}, which weightmap does not know")
        })?;
    let used = ne.iter().rposition(|&d| d != 1).map_or(0, |k| k + 1);
    let n_dims = used.max(usize::try_from(src.n_dims).unwrap_or(0));
    let dims: Vec<u64> = ne[..n_dims]
        .iter()
        .map(|&d| u64::try_from(d).map_err(|_| format!("select chose ne {ne:?}: negative")))
        .collect::<Result<_, _>>()?;
    if dims.first().is_some_and(|&n0| n0 % ty.block_size() != 0) {
        return Err(format!(
            "select chose ne[0] = {} for {ty}, not a multiple of its block of {}",
            dims[0],
            ty.block_size()
        ));
    }
    Ok((ty, dims))
}

/// The transform of `wm_cache_load` (`source` in mmap mode unless `opts`
/// say otherwise; NULL `opts` = [`wm_options_default`]) from the cache in
/// `cache_dir`, in `*out` (NULL on failure): the tensors of a valid entry,
/// mapped; else `t` run into a new entry, which is then mapped; else, when
/// the cache cannot be written (read-only, full, another user's), `t` run
/// into memory. The weights work with every `wm_*` call, and
/// `weightmap-ggml.h` places them like any; they hold only the tensors
/// `select` kept. `*report` (when `report` is not NULL) says which, and
/// why.
///
/// `cache_dir` NULL is the user's cache: `$WEIGHTMAP_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/weightmap`, else `~/.cache/weightmap` (Windows:
/// `%LOCALAPPDATA%\weightmap`), held to `$WEIGHTMAP_CACHE_MAX_SIZE` bytes
/// (default 16 GiB). A directory given is created if missing and held to
/// the default size. The least recently used entries are pruned after each
/// fill. A directory another user can write is refused (in memory, reason
/// `"unsafe_directory"`).
///
/// A hit reads the source's header and a few KiB of each tensor, checks
/// every byte of the entry against its checksums, and calls no callback.
/// A stale entry (the source rewritten, another transform name, version
/// or machine facts) or a corrupted one is never used.
///
/// Returns [`WM_OK`]; [`WM_ERR_BAD_ARGUMENT`] (NULL `source_path`,
/// `t`, `t->name`, `t->apply` or `out`; bad options);
/// [`WM_ERR_TRANSFORM`] (a callback failed, or chose an output that
/// cannot be stored: nothing is stored then); the source's own
/// ([`WM_ERR_IO`], [`WM_ERR_INVALID_FILE`]);
/// [`WM_ERR_NO_MEMORY`] (in memory, over the budget). Never the
/// cache's: a cache that cannot serve is [`WM_CACHE_IN_MEMORY`].
///
/// # Safety
/// `cache_dir` and `source_path` are NULL or NUL-terminated strings; `t` is
/// NULL or points to a `wm_transform` whose callbacks may be called with
/// its `user` from this thread during the call; `opts` is NULL or points to
/// a `wm_options`; `out` is NULL or valid for writing a pointer; `report` is
/// NULL or valid for writing a `wm_cache_report`. As for
/// [`wm_load`], neither the source nor the cache's entries may be
/// modified or truncated until [`wm_free`] (weightmap only ever
/// renames a whole entry over another, which leaves a mapping intact).
#[no_mangle]
pub unsafe extern "C" fn wm_cache_load(
    cache_dir: *const c_char,
    source_path: *const c_char,
    t: *const wm_transform,
    opts: *const wm_options,
    out: *mut *mut wm_weights,
    report: *mut wm_cache_report,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let (source, options) = unsafe { load_args(source_path, "source_path", opts, out) }?;
        let cache = if cache_dir.is_null() {
            Cache::new()
        } else {
            // SAFETY: a C string, by the contract.
            Cache::at(path_of(unsafe { c_str(cache_dir, "cache_dir") }?)?)
        };
        // SAFETY: NULL or pointing to a `wm_transform`, by the contract.
        let t = unsafe { t.as_ref() }.ok_or_else(|| Fail::null("the transform"))?;
        // SAFETY: NULL or a C string, by the contract.
        let name = unsafe { c_text(t.name, "wm_transform.name") }?;
        let machine = if t.machine.is_null() {
            ""
        } else {
            // SAFETY: a C string, by the contract.
            unsafe { c_text(t.machine, "wm_transform.machine") }?
        };
        let apply = t.apply.ok_or_else(|| Fail::null("wm_transform.apply"))?;

        // A `select` whose choice cannot be stored: the Rust transform's
        // selection cannot fail, so the tensor is kept as it is and the
        // error waits here; the first `apply` (a kept tensor exists, so
        // one is called before anything is stored) fails with it.
        let rejected: RefCell<Option<Error>> = RefCell::new(None);
        let user = t.user;
        let mut transform = Transform::new(name, t.version, |info, src, dst| {
            if rejected.borrow().is_some() {
                return Err("the transform's select callback failed".into());
            }
            let tensor_name = nul_terminated(info.name.as_bytes());
            let desc = describe_info(info, tensor_name.as_ptr().cast(), src.as_ptr().cast())
                .map_err(|f| f.msg)?;
            // SAFETY: the caller promises `apply` may be called with `user`
            // on this thread; `desc`, its name and `src` live for the call,
            // and `dst` is valid for writing `dst.len()` bytes.
            let rc = unsafe { apply(user, &desc, dst.as_mut_ptr().cast(), dst.len()) };
            match rc {
                0 => Ok(()),
                rc => Err(format!(
                    "the apply callback of transform '{name}' returned {rc}"
                )),
            }
        })
        .machine(machine);
        if let Some(select) = t.select {
            let rejected = &rejected;
            transform = transform.select(move |info| match select_one(select, user, info) {
                Ok(output) => output,
                Err(message) => {
                    rejected.borrow_mut().get_or_insert(Error::Transform {
                        tensor: info.name.to_owned(),
                        message,
                    });
                    Some((info.ty, info.ne()))
                }
            });
        }
        // SAFETY: the caller promises (documented above and in the header)
        // not to modify or truncate the source or the entries until
        // `wm_free`, which is when the `Weights` die.
        let loaded = unsafe { cache.load(&source, &transform, &options) };
        if let Some(e) = rejected.take() {
            return Err(e.into());
        }
        let cached = loaded?;
        let strings = ReportStrings::of(cached.report());
        let mut w = build(cached.into_weights())?;
        if !report.is_null() {
            // SAFETY: by the contract, `report` is valid for writing; its
            // strings live in `w`, which is handed out below.
            unsafe { report.write(strings.report()) };
        }
        w.cache = Some(strings);
        // SAFETY: as above.
        unsafe { put(out, Box::into_raw(Box::new(w)), "out") }
    })
}

/// Ask `select` about the source tensor `info`: `Ok(None)` to leave it out,
/// `Ok(Some(output))` to keep it as `output`, `Err` when its choice cannot
/// be stored.
fn select_one(
    select: unsafe extern "C" fn(*mut c_void, *const wm_tensor, *mut i32, *mut i64) -> c_int,
    user: *mut c_void,
    info: &TensorInfo<'_>,
) -> Result<Option<(TensorType, Vec<u64>)>, String> {
    let name = nul_terminated(info.name.as_bytes());
    let desc = describe_info(info, name.as_ptr().cast(), std::ptr::null()).map_err(|f| f.msg)?;
    let (mut ggml_type, mut ne) = (desc.ggml_type, desc.ne);
    // SAFETY: `wm_cache_load`'s caller promises `select` may be called
    // with `user` on this thread; `desc` and its name live for the call,
    // and `ggml_type` and `ne` (4 elements) are valid for writing.
    let keep = unsafe { select(user, &desc, &mut ggml_type, ne.as_mut_ptr()) };
    if keep == 0 {
        return Ok(None);
    }
    selected_output(&desc, ggml_type, ne).map(Some)
}
