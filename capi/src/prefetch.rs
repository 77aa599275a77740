//! Announcements from C: [`wm_prefetch`] tells the weights what the
//! runtime reads next (whole tensors, or the experts a router chose), and
//! weightmap reads those bytes ahead in the background
//! (`weightmap::Weights::prefetch`); [`wm_prefetch_likely`] tells it a
//! guess, read only with spare time and room; [`wm_residency`] says what stays
//! resident of weights larger than the budget, and what streams.

use std::ffi::c_int;

use weightmap::{Need, ResidencyPlan};

use crate::*;

/// What the runtime reads next: tensor `tensor` (its index, as for
/// [`wm_tensor_at`]) whole when `n_experts` is 0; else, of a tensor whose
/// last dimension counts experts (ggml's `ffn_*_exps`, `ne[2] =
/// n_expert`), only the slices of the `n_experts` experts at `experts`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct wm_need {
    /// The tensor's index.
    pub tensor: u64,
    /// The experts' ids, as the router gives them (`n_experts` of them;
    /// may be NULL when `n_experts` is 0).
    pub experts: *const i32,
    /// How many ids `experts` holds; 0 for the whole tensor.
    pub n_experts: u32,
}

/// What the runtime reads next: the `n` announcements at `needs`. Their
/// reads are queued and this returns without waiting for them (over the
/// budget, it queues the experts' slices itself, before returning, so that
/// they are on their way before the runtime computes on them). Where even
/// the tensors read whole exceed the budget ([`WM_RESIDENCY_STREAM_ALL`]),
/// a tensor announced whole is not read ahead: the compute reads it in
/// order, and the fault path streams it.
/// Every announcement is checked before any is acted on; tensors in owned
/// memory (stream mode, copies) need nothing. A ggml runtime can leave the
/// announcing to `wm_ggml_announce` (weightmap-ggml.h), an eval callback of
/// `ggml_backend_sched` (llama.cpp's `cb_eval`) that announces each node's
/// weights ahead of its compute, and for `ggml_mul_mat_id` the experts the
/// router chose.
///
/// Returns [`WM_OK`]; [`WM_ERR_NOT_FOUND`] for a tensor index or an expert
/// that does not exist (nothing is read ahead then, and the weights stay
/// usable; [`wm_last_error`] names it); [`WM_ERR_BAD_ARGUMENT`] for NULL
/// `w`, NULL `needs` with `n` > 0, or NULL `experts` with `n_experts` > 0.
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `needs` is NULL or
/// points to `n` `wm_need`s, each of whose `experts` is NULL or points to
/// `n_experts` `int32_t`s, all valid for the call.
#[no_mangle]
pub unsafe extern "C" fn wm_prefetch(
    w: *const wm_weights,
    needs: *const wm_need,
    n: usize,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let (w, needs) = unsafe { needs_of(w, needs, n) }?;
        w.weights.prefetch(&needs)?;
        Ok(())
    })
}

/// What the runtime expects to read but is not sure of: a predictor's
/// guess of the experts a router will choose. Read ahead with the disk's
/// spare time and the budget's spare room only: never before, or at the
/// cost of, what [`wm_prefetch`] announced. A later [`wm_prefetch`] of the
/// same tensor supersedes its guesses, and what was guessed and not
/// announced is the first to go. Returns at once; 0 or a `WM_ERR` code,
/// checked as [`wm_prefetch`]'s (`weightmap::Weights::prefetch_likely`).
///
/// # Safety
/// As for [`wm_prefetch`].
#[no_mangle]
pub unsafe extern "C" fn wm_prefetch_likely(
    w: *const wm_weights,
    needs: *const wm_need,
    n: usize,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let (w, needs) = unsafe { needs_of(w, needs, n) }?;
        w.weights.prefetch_likely(&needs)?;
        Ok(())
    })
}

/// The runtime computes on its own mapping of the weights' file, where it
/// holds tensor `tensor` at `data` (llama.cpp's `mmap`, with weightmap's
/// hook announcing for it): from now on the page plan's access advice
/// reaches those pages too, and the slices it releases are paged out of
/// them (`MADV_PAGEOUT`), never discarded
/// (`weightmap::Weights::follow_runtime_mapping`). Cheap to call again.
///
/// Returns [`WM_OK`]; [`WM_ERR_IO`] unless the process's maps show `data`
/// in a read-only mapping of the same file at the same offsets (Linux and
/// Android; on every other platform, always); [`WM_ERR_NOT_FOUND`] for a
/// tensor that is not there; [`WM_ERR_BAD_ARGUMENT`] for NULL `w`.
///
/// # Safety
/// `w` is NULL or live weights from [`wm_load`]. `data` is only an
/// address: it is never read.
#[no_mangle]
pub unsafe extern "C" fn wm_follow_mapping(
    w: *const wm_weights,
    tensor: u64,
    data: *const std::ffi::c_void,
) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let w = unsafe { weights_ref(w) }?;
        let tensor = usize::try_from(tensor).unwrap_or(usize::MAX);
        w.weights.follow_runtime_mapping(tensor, data.cast())?;
        Ok(())
    })
}

/// The weights at `w` and the `n` needs at `needs`, as [`wm_prefetch`]
/// takes them.
///
/// # Safety
/// As for [`wm_prefetch`]; the needs borrow the caller's arrays for the
/// call.
unsafe fn needs_of<'a>(
    w: *const wm_weights,
    needs: *const wm_need,
    n: usize,
) -> Result<(&'a wm_weights, Vec<Need<'a>>), Fail> {
    // SAFETY: by the contract.
    let w = unsafe { weights_ref(w) }?;
    if n == 0 {
        return Ok((w, Vec::new()));
    }
    if needs.is_null() {
        return Err(Fail::null("needs"));
    }
    // SAFETY: by the contract, `needs` points to `n` of them.
    let needs = unsafe { std::slice::from_raw_parts(needs, n) };
    let mut out = Vec::with_capacity(n);
    for need in needs {
        let experts: &[i32] = match (need.experts.is_null(), need.n_experts) {
            (_, 0) => &[],
            (true, _) => return Err(Fail::null("experts")),
            // SAFETY: by the contract, `n_experts` ids at `experts`.
            (false, k) => unsafe { std::slice::from_raw_parts(need.experts, k as usize) },
        };
        let tensor = usize::try_from(need.tensor).unwrap_or(usize::MAX);
        out.push(Need::experts(tensor, experts));
    }
    Ok((w, out))
}

/// [`wm_residency`]'s kind: the mapped tensors fit in the budget (or it is
/// unknown); every page stays resident once read.
pub const WM_RESIDENCY_FITS: u32 = 0;
/// [`wm_residency`]'s kind: over the budget, the tensors read whole stay
/// resident and the expert tensors' slices stream as announced.
pub const WM_RESIDENCY_STREAM_EXPERTS: u32 = 1;
/// [`wm_residency`]'s kind: over the budget with no room for expert slices
/// (or no expert tensors): the largest tensors read whole stream through in
/// order until the rest fits, and the expert slices as announced.
pub const WM_RESIDENCY_STREAM_ALL: u32 = 2;

/// What stays resident of the weights under the load's memory budget, and
/// what streams through (the load report's residency). Byte fields that the
/// kind does not give are 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct wm_residency_plan {
    /// [`WM_RESIDENCY_FITS`], [`WM_RESIDENCY_STREAM_EXPERTS`] or
    /// [`WM_RESIDENCY_STREAM_ALL`].
    pub kind: u32,
    /// Bytes of the tensors read whole (norms, attention, routers, shared
    /// experts), which stay resident (stream experts).
    pub whole: u64,
    /// Bytes of the expert tensors (`ffn_*_exps`), which stream (stream
    /// experts).
    pub experts: u64,
    /// Bytes of expert slices that stay resident, the most used (stream
    /// experts).
    pub expert_capacity: u64,
    /// Bytes of the mapped tensors, all of which stream (stream all).
    pub mapped: u64,
    /// The memory budget (stream experts, stream all).
    pub budget: u64,
}

/// What stays resident of the weights and what streams, into `*out`.
///
/// Returns [`WM_OK`], or [`WM_ERR_BAD_ARGUMENT`] (NULL `w` or `out`).
///
/// # Safety
/// `w` is NULL or a live pointer from [`wm_load`]; `out` is NULL or valid
/// for writing a `wm_residency_plan`.
#[no_mangle]
pub unsafe extern "C" fn wm_residency(w: *const wm_weights, out: *mut wm_residency_plan) -> c_int {
    guard(|| {
        // SAFETY: by the contract.
        let w = unsafe { weights_ref(w) }?;
        if out.is_null() {
            return Err(Fail::null("out"));
        }
        let r = match &w.weights.report().residency {
            ResidencyPlan::Fits => wm_residency_plan::default(),
            ResidencyPlan::StreamExperts {
                whole,
                experts,
                expert_capacity,
                budget,
            } => wm_residency_plan {
                kind: WM_RESIDENCY_STREAM_EXPERTS,
                whole: *whole,
                experts: *experts,
                expert_capacity: *expert_capacity,
                budget: *budget,
                ..Default::default()
            },
            ResidencyPlan::StreamAll { mapped, budget } => wm_residency_plan {
                kind: WM_RESIDENCY_STREAM_ALL,
                mapped: *mapped,
                budget: *budget,
                ..Default::default()
            },
            other => {
                let msg = format!("a residency this C ABI does not know: {other}");
                return Err(Fail::new(WM_ERR_INTERNAL, msg));
            }
        };
        // SAFETY: by the contract, `out` is valid for writing.
        unsafe { out.write(r) };
        Ok(())
    })
}
