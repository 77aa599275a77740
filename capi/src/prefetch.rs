//! Announcements from C: [`wm_prefetch`] tells the weights what the
//! runtime reads next (whole tensors, or the experts a router chose), and
//! weightmap reads those bytes ahead in the background
//! (`weightmap::Weights::prefetch`).

use std::ffi::c_int;

use weightmap::Need;

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
/// bytes are read ahead in the background and this returns at once.
/// Every announcement is checked before any is acted on; tensors in owned
/// memory (stream mode, copies) need nothing.
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
        let w = unsafe { weights_ref(w) }?;
        if n == 0 {
            return Ok(());
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
        w.weights.prefetch(&out)?;
        Ok(())
    })
}
