/* weightmap-ggml.h: every tensor of a model weightmap loaded, placed in a
 * ggml context with one call. Header-only; include it after ggml.h,
 * ggml-alloc.h, ggml-backend.h, ggml-cpu.h and weightmap.h.
 *
 *     struct wm_ggml g;
 *     if (wm_ggml_place(w, NULL, &g) == WM_OK) {      // CPU, zero-copy
 *         struct ggml_tensor *q = ggml_get_tensor(g.ctx, "blk.0.attn_q.weight");
 *         ...                                           // compute
 *         wm_ggml_free(&g);                             // before wm_free(w)
 *     }
 *
 * With `buft` NULL (the CPU): a no_alloc context holds one tensor per
 * weight (type, ne and nb from weightmap), whose data is weightmap's
 * pointer: the mapped tensors' span is wrapped with
 * ggml_backend_cpu_buffer_from_ptr, each copied tensor gets a buffer of its
 * own over its bytes, and ggml_backend_tensor_alloc points each tensor at
 * its bytes. Nothing is copied; ggml only reads weights.
 *
 * With another buffer type (a device's): the tensors are allocated in
 * buffers of that type (ggml_backend_alloc_ctx_tensors_from_buft) and
 * uploaded (ggml_backend_tensor_set) through wm_pass, in file order, each
 * tensor's pages dropped after its upload: the host holds about one
 * read-ahead window of the model at a time, never the model twice.
 *
 * The buffers hold weightmap's memory or the device's; free them with
 * wm_ggml_free before wm_free. Returns WM_OK, or the failing call's code
 * (WM_ERR_UNSUPPORTED for a ggml call that failed, with nothing left
 * allocated). */
#ifndef WEIGHTMAP_GGML_H
#define WEIGHTMAP_GGML_H

#include <stdint.h>
#include <stdlib.h>

struct wm_ggml {
    struct ggml_context *ctx;        /* one tensor per weight, by name */
    ggml_backend_buffer_t *buffers;  /* the buffers made, n_buffers of them */
    int n_buffers;
};

static inline void wm_ggml_free(struct wm_ggml *g) {
    for (int i = 0; i < g->n_buffers; i++) ggml_backend_buffer_free(g->buffers[i]);
    free(g->buffers);
    if (g->ctx) ggml_free(g->ctx);
    g->ctx = NULL;
    g->buffers = NULL;
    g->n_buffers = 0;
}

/* wm_pass's callback for uploads: tensor i's bytes into its ggml tensor. */
static inline int wm_ggml__upload(void *tensors, uint64_t i, const wm_tensor *t) {
    struct ggml_tensor *dst = ((struct ggml_tensor **)tensors)[i];
    ggml_backend_tensor_set(dst, t->data, 0, (size_t)t->nbytes);
    return 0;
}

/* wm_ggml_place's work, into arrays of n + 1 entries the caller frees. */
static inline int wm_ggml__place(wm_weights *w, ggml_backend_buffer_type_t buft, struct wm_ggml *out,
                                 uint64_t n, struct ggml_tensor **tensors, wm_tensor *desc, int *mapped) {
    struct ggml_init_params p = {(n + 1) * ggml_tensor_overhead(), NULL, true};
    out->ctx = ggml_init(p);
    if (!out->ctx) return WM_ERR_NO_MEMORY;
    const char *lo = NULL, *hi = NULL; /* the mapped tensors' span */
    for (uint64_t i = 0; i < n; i++) {
        int rc = wm_tensor_at(w, i, &desc[i]);
        if (rc == WM_OK) rc = wm_tensor_is_mapped(w, i, &mapped[i]);
        if (rc != WM_OK) return rc;
        tensors[i] = ggml_new_tensor(out->ctx, (enum ggml_type)desc[i].ggml_type, desc[i].n_dims, desc[i].ne);
        ggml_set_name(tensors[i], desc[i].name);
        if (mapped[i]) {
            const char *b = (const char *)desc[i].data, *e = b + desc[i].nbytes;
            if (!lo || b < lo) lo = b;
            if (!hi || e > hi) hi = e;
        }
    }
    if (buft) {
        /* A device: its own buffers, fed through the bounded pass. */
        ggml_backend_buffer_t b = ggml_backend_alloc_ctx_tensors_from_buft(out->ctx, buft);
        if (!b && n > 0) return WM_ERR_NO_MEMORY;
        if (b) out->buffers[out->n_buffers++] = b;
        return wm_pass(w, 0, 0, wm_ggml__upload, tensors);
    }
    /* The CPU: buffers over weightmap's memory, no copy. */
    ggml_backend_buffer_t span = NULL;
    if (lo) {
        span = ggml_backend_cpu_buffer_from_ptr((void *)lo, (size_t)(hi - lo));
        if (!span) return WM_ERR_UNSUPPORTED;
        out->buffers[out->n_buffers++] = span;
    }
    for (uint64_t i = 0; i < n; i++) {
        ggml_backend_buffer_t b = span;
        if (!mapped[i]) {
            b = ggml_backend_cpu_buffer_from_ptr((void *)desc[i].data, (size_t)desc[i].nbytes);
            if (!b) return WM_ERR_UNSUPPORTED;
            out->buffers[out->n_buffers++] = b;
        }
        if (ggml_backend_tensor_alloc(b, tensors[i], (void *)desc[i].data) != GGML_STATUS_SUCCESS)
            return WM_ERR_UNSUPPORTED;
    }
    return WM_OK;
}

static inline int wm_ggml_place(wm_weights *w, ggml_backend_buffer_type_t buft, struct wm_ggml *out) {
    uint64_t n = wm_tensor_count(w);
    out->ctx = NULL;
    out->n_buffers = 0;
    /* At most one buffer per tensor, and one over the mapped span. */
    out->buffers = (ggml_backend_buffer_t *)calloc((size_t)n + 1, sizeof(ggml_backend_buffer_t));
    struct ggml_tensor **tensors = (struct ggml_tensor **)calloc((size_t)n + 1, sizeof(struct ggml_tensor *));
    wm_tensor *desc = (wm_tensor *)calloc((size_t)n + 1, sizeof(wm_tensor));
    int *mapped = (int *)calloc((size_t)n + 1, sizeof(int));
    int rc = (out->buffers && tensors && desc && mapped)
                 ? wm_ggml__place(w, buft, out, n, tensors, desc, mapped)
                 : WM_ERR_NO_MEMORY;
    free(tensors);
    free(desc);
    free(mapped);
    if (rc != WM_OK) wm_ggml_free(out);
    return rc;
}

#endif /* WEIGHTMAP_GGML_H */
