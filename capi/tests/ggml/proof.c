/* Proof inside ggml: ggml computes on weightmap-placed tensors and gets
 * bit-identical results to the same graph on tensors ggml loaded itself.
 *
 * For each of four loads (weightmap mmap mode; stream mode; hybrid: mmap
 * with a 64-byte buffer alignment, so that tensors at 32 mod 64 are copied
 * and the rest stay mapped; upload: mmap, placed in a buffer type of
 * ggml's own through the bounded pass):
 *   - wm_ggml_place (weightmap-ggml.h) places every tensor in a no_alloc
 *     ggml context: the mapped tensors' span wrapped with
 *     ggml_backend_cpu_buffer_from_ptr, each copied tensor's bytes in a
 *     buffer of their own, each tensor's data weightmap's pointer
 *     (ggml_backend_tensor_alloc); for the upload, tensors allocated in
 *     ggml's buffers and filled by ggml_backend_tensor_set from wm_pass;
 *   - the graph is ggml_mul_mat(W, x) and ggml_get_rows(W, ids) for each
 *     weight;
 *   - every result is compared byte for byte with the same graph on the
 *     tensors of gguf_init_from_file(no_alloc = false).
 *
 * Then the transform cache (wm_cache_load), on LARGE.gguf, the same kinds
 * of tensors with many rows: the transform is ggml's own dequantization
 * to F32 (ggml_get_type_traits(type)->to_float) of every quantized tensor.
 * (ggml's CPU repack would be the transform a runtime wants, but the
 * pinned llama.cpp's repacked kernels crash in prompt processing on
 * AVX-512 machines; a dequantized F32 copy stands in for it.)
 *   - in memory: the transform into a ggml context's own (malloc'd)
 *     buffer, and the graph above on it: the reference;
 *   - fill: wm_cache_load into the empty CACHE_DIR, the entry placed with
 *     wm_ggml_place and the graph computed on it;
 *   - hit: the same again, mapping the entry, calling no callback.
 * Each result must be bit-identical to the reference. RssAnon (the
 * process's anonymous memory, /proc/self/status) is read before each load
 * and after its compute: in memory it grows by about the transformed
 * bytes; from the cache, fill and hit alike, by less than a tenth of them.
 *
 * Usage: ggml_proof MODEL.gguf [LARGE.gguf CACHE_DIR]
 *
 * Prints "N passed, N failed" and a PASS or FAIL line; exits nonzero on
 * any mismatch. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "weightmap.h"
#include "weightmap-ggml.h"

#include "check.h"

#define MAX_T 64


/* The graph's outputs for one set of weight tensors. */
struct outputs {
    int n;
    char names[MAX_T][128];
    void *mm[MAX_T];   /* mul_mat(W, x) */
    size_t mm_bytes[MAX_T];
    void *rows[MAX_T]; /* get_rows(W, ids) */
    size_t rows_bytes[MAX_T];
};

static void *dup_bytes(const void *p, size_t n) {
    void *d = malloc(n ? n : 1);
    if (!d) abort();
    memcpy(d, p, n);
    return d;
}

/* Run mul_mat and get_rows on each of `weights` (n of them) and keep copies
 * of the results. x and ids are the same for every run. */
static void compute(struct ggml_tensor **weights, int n, struct outputs *out) {
    struct ggml_init_params p = {.mem_size = 64u << 20, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    struct ggml_tensor *mm[MAX_T], *rows[MAX_T];
    for (int i = 0; i < n; i++) {
        struct ggml_tensor *w = weights[i];
        struct ggml_tensor *x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, w->ne[0]);
        float *xd = (float *)x->data;
        for (int64_t k = 0; k < w->ne[0]; k++) xd[k] = (float)((k * 37 % 101) - 50) / 25.0f;
        int64_t n_ids = w->ne[1] < 4 ? w->ne[1] : 4;
        struct ggml_tensor *ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_ids);
        for (int64_t k = 0; k < n_ids; k++) ((int32_t *)ids->data)[k] = (int32_t)((w->ne[1] - 1 - 2 * k + w->ne[1]) % w->ne[1]);
        mm[i] = ggml_mul_mat(ctx, w, x);
        rows[i] = ggml_get_rows(ctx, w, ids);
        ggml_build_forward_expand(gf, mm[i]);
        ggml_build_forward_expand(gf, rows[i]);
    }
    enum ggml_status st = ggml_graph_compute_with_ctx(ctx, gf, 2);
    CHECK(st == GGML_STATUS_SUCCESS, "graph compute: status %d", (int)st);
    out->n = n;
    for (int i = 0; i < n; i++) {
        snprintf(out->names[i], sizeof out->names[i], "%s", weights[i]->name);
        out->mm_bytes[i] = ggml_nbytes(mm[i]);
        out->mm[i] = dup_bytes(mm[i]->data, out->mm_bytes[i]);
        out->rows_bytes[i] = ggml_nbytes(rows[i]);
        out->rows[i] = dup_bytes(rows[i]->data, out->rows_bytes[i]);
    }
    ggml_free(ctx);
}

/* A result of all zeros would prove little: the inputs are nonzero. */
static void check_nonzero(const struct outputs *o, const char *label) {
    for (int i = 0; i < o->n; i++) {
        int nonzero = 0;
        for (size_t k = 0; k < o->mm_bytes[i]; k++) nonzero |= ((unsigned char *)o->mm[i])[k];
        CHECK(nonzero, "%s mul_mat(%s) is all zeros", label, o->names[i]);
    }
}

static void free_outputs(struct outputs *o) {
    for (int i = 0; i < o->n; i++) {
        free(o->mm[i]);
        free(o->rows[i]);
    }
    o->n = 0;
}

/* The reference: ggml's own loader, with data. */
static void reference(const char *path, struct outputs *out) {
    struct ggml_context *ctx = NULL;
    struct gguf_init_params p = {.no_alloc = false, .ctx = &ctx};
    struct gguf_context *g = gguf_init_from_file(path, p);
    if (!g || !ctx) {
        fprintf(stderr, "gguf_init_from_file(%s) failed\n", path);
        exit(2);
    }
    int n = (int)gguf_get_n_tensors(g);
    if (n > MAX_T) exit(2);
    struct ggml_tensor *w[MAX_T];
    for (int i = 0; i < n; i++) w[i] = ggml_get_tensor(ctx, gguf_get_tensor_name(g, i));
    compute(w, n, out);
    gguf_free(g);
    ggml_free(ctx);
}

static const char *mode_name(uint32_t mode, uint64_t alignment, int upload) {
    if (upload) return "upload";
    if (mode == WM_MODE_STREAM) return "stream";
    return alignment > 32 ? "hybrid" : "mmap";
}

/* Load with weightmap, place with weightmap-ggml.h (zero-copy on the CPU;
 * with `upload`, into a buffer type of ggml's own, fed through wm_pass),
 * compute, and compare with ggml's own load. */
static void with_weightmap(const char *path, uint32_t mode, uint64_t alignment, int upload,
                           const struct outputs *ref) {
    const char *label = mode_name(mode, alignment, upload);
    wm_options o = wm_options_default();
    o.mode = mode;
    o.alignment = alignment;
    wm_weights *wm = NULL;
    int rc = wm_load(path, &o, &wm);
    CHECK(rc == WM_OK, "%s: wm_load: %s", label, wm_last_error());
    if (rc != WM_OK) return;
    int n = (int)wm_tensor_count(wm);
    CHECK(n == ref->n, "%s: %d tensors, ggml has %d", label, n, ref->n);
    if (n != ref->n || n > MAX_T) { wm_free(wm); return; }

    wm_tensor t[MAX_T];
    int mapped[MAX_T], n_mapped = 0, n_copied = 0;
    for (int i = 0; i < n; i++) {
        if (wm_tensor_at(wm, (uint64_t)i, &t[i]) != WM_OK || wm_tensor_is_mapped(wm, (uint64_t)i, &mapped[i]) != WM_OK) {
            CHECK(0, "%s: tensor %d: %s", label, i, wm_last_error());
            wm_free(wm);
            return;
        }
        if (mapped[i]) n_mapped++; else n_copied++;
    }
    if (mode == WM_MODE_STREAM) CHECK(n_mapped == 0, "stream: %d tensors mapped", n_mapped);
    else if (alignment > 32) CHECK(n_mapped > 0 && n_copied > 0, "hybrid: %d mapped, %d copied", n_mapped, n_copied);
    else CHECK(n_copied == 0, "%s: %d tensors copied", label, n_copied);

    struct wm_ggml g;
    rc = wm_ggml_place(wm, upload ? ggml_backend_cpu_buffer_type() : NULL, &g);
    CHECK(rc == WM_OK, "%s: wm_ggml_place: %d %s", label, rc, wm_last_error());
    if (rc != WM_OK) { wm_free(wm); return; }
    struct ggml_tensor *w[MAX_T];
    for (int i = 0; i < n; i++) {
        w[i] = ggml_get_tensor(g.ctx, ref->names[i]);
        CHECK(w[i] != NULL, "%s: no tensor %s in the context", label, ref->names[i]);
        if (!w[i]) { wm_ggml_free(&g); wm_free(wm); return; }
        CHECK(strcmp(t[i].name, ref->names[i]) == 0, "%s: tensor %d is %s, ggml's is %s", label, i, t[i].name, ref->names[i]);
        for (int k = 0; k < 4; k++)
            CHECK((uint64_t)w[i]->nb[k] == t[i].nb[k], "%s: %s nb[%d]: ggml %zu, weightmap %" PRIu64,
                  label, t[i].name, k, w[i]->nb[k], t[i].nb[k]);
        CHECK(ggml_nbytes(w[i]) == t[i].nbytes, "%s: %s nbytes", label, t[i].name);
        if (upload)
            CHECK(w[i]->data != t[i].data, "%s: %s was not uploaded", label, t[i].name);
        else
            CHECK(w[i]->data == t[i].data, "%s: %s: data is not weightmap's pointer", label, t[i].name);
    }

    struct outputs got;
    compute(w, n, &got);
    int same = 0;
    for (int i = 0; i < n; i++) {
        int ok_mm = got.mm_bytes[i] == ref->mm_bytes[i] && memcmp(got.mm[i], ref->mm[i], got.mm_bytes[i]) == 0;
        int ok_rows = got.rows_bytes[i] == ref->rows_bytes[i] && memcmp(got.rows[i], ref->rows[i], got.rows_bytes[i]) == 0;
        CHECK(ok_mm, "%s: mul_mat(%s, x) differs from ggml's own load", label, t[i].name);
        CHECK(ok_rows, "%s: get_rows(%s) differs from ggml's own load", label, t[i].name);
        same += ok_mm && ok_rows;
    }
    printf("%-6s: %d tensors (%d mapped, %d copied, %d ggml buffers from wm_ggml_place): "
           "%d of %d mul_mat + get_rows results bit-identical to gguf_init_from_file's\n",
           label, n, n_mapped, n_copied, g.n_buffers, same, n);
    free_outputs(&got);
    wm_ggml_free(&g);
    wm_free(wm);
}

/* ---- the transform cache -------------------------------------------------- */

/* The process's anonymous resident memory in bytes (-1 where there is no
 * /proc/self/status). */
static int64_t rss_anon(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %lld kB", &kib) == 1) break;
    fclose(f);
    return kib < 0 ? -1 : (int64_t)kib * 1024;
}

/* The transform: every quantized tensor, dequantized to F32 by ggml itself;
 * the rest left out of the entry. `user` counts the applies. */
static int dequant_select(void *user, const wm_tensor *src, int32_t *ggml_type, int64_t *ne) {
    (void)user;
    (void)ne; /* the shape stays */
    if (src->ggml_type < 0 || !ggml_is_quantized((enum ggml_type)src->ggml_type)) return 0;
    *ggml_type = GGML_TYPE_F32;
    return 1;
}

static int dequant_apply(void *user, const wm_tensor *src, void *dst, size_t dst_size) {
    ++*(int *)user;
    const struct ggml_type_traits *tt = ggml_get_type_traits((enum ggml_type)src->ggml_type);
    int64_t n = src->ne[0] * src->ne[1] * src->ne[2] * src->ne[3];
    if (!tt->to_float || dst_size != (size_t)n * sizeof(float)) return 1;
    tt->to_float(src->data, dst, n);
    return 0;
}

/* ggml's to_float for these types is its portable reference code, the same
 * on every CPU: the transform depends on no machine fact. */
static wm_transform dequant_transform(int *applies) {
    wm_transform t = {"ggml-to_float-f32", 1, NULL, dequant_select, dequant_apply, applies};
    return t;
}

/* In memory, as a runtime does it without a cache: a ggml context whose
 * buffer holds the transformed tensors, filled by the same callbacks.
 * `*bytes` gets the transformed bytes. */
static void transform_in_memory(const char *path, struct outputs *out, uint64_t *bytes) {
    wm_weights *src = NULL;
    if (wm_load(path, NULL, &src) != WM_OK) {
        CHECK(0, "in memory: wm_load(%s): %s", path, wm_last_error());
        return;
    }
    int applies = 0;
    wm_transform t = dequant_transform(&applies);
    int n_src = (int)wm_tensor_count(src), n = 0;
    wm_tensor s[MAX_T];
    int32_t type[MAX_T];
    int64_t ne[MAX_T][4];
    size_t total = 0;
    for (int i = 0; i < n_src && n < MAX_T; i++) {
        wm_tensor d;
        if (wm_tensor_at(src, (uint64_t)i, &d) != WM_OK) continue;
        type[n] = d.ggml_type;
        memcpy(ne[n], d.ne, sizeof ne[n]);
        if (!t.select(t.user, &d, &type[n], ne[n])) continue;
        s[n] = d;
        total += ggml_row_size((enum ggml_type)type[n], ne[n][0]) * (size_t)(ne[n][1] * ne[n][2] * ne[n][3]);
        n++;
    }
    struct ggml_init_params p = {.mem_size = total + (size_t)(n + 1) * ggml_tensor_overhead(), .mem_buffer = NULL,
                                 .no_alloc = false};
    int64_t before = rss_anon();
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_tensor *w[MAX_T];
    for (int i = 0; i < n; i++) {
        w[i] = ggml_new_tensor(ctx, (enum ggml_type)type[i], s[i].n_dims, ne[i]);
        ggml_set_name(w[i], s[i].name);
        CHECK(t.apply(t.user, &s[i], w[i]->data, ggml_nbytes(w[i])) == 0, "in memory: apply %s", s[i].name);
    }
    compute(w, n, out);
    int64_t growth = rss_anon() - before;
    check_nonzero(out, "in memory:");
    *bytes = total;
    /* The measurement sees the transformed tensors where they are anonymous. */
    CHECK(growth >= (int64_t)total * 9 / 10, "in memory: RssAnon grew by %" PRId64 " for %zu bytes", growth, total);
    printf("in memory: %d tensors dequantized by ggml into a malloc'd ggml context (%zu bytes): "
           "RssAnon +%" PRId64 " bytes (%.0f%% of them)\n",
           n, total, growth, 100.0 * (double)growth / (double)total);
    ggml_free(ctx);
    wm_free(src);
}

/* Through the cache: wm_cache_load, wm_ggml_place, the graph; bit-identical
 * to `ref` (the transform in memory), with RssAnon growth under a tenth of
 * the entry's tensor bytes. */
static void transform_cached(const char *path, const char *dir, uint32_t want, const struct outputs *ref,
                             uint64_t ref_bytes) {
    const char *label = want == WM_CACHE_FILLED ? "fill" : "hit";
    int applies = 0;
    wm_transform t = dequant_transform(&applies);
    wm_weights *w = NULL;
    wm_cache_report r;
    int64_t before = rss_anon();
    int rc = wm_cache_load(dir, path, &t, NULL, &w, &r);
    CHECK(rc == WM_OK, "%s: wm_cache_load: %d %s", label, rc, wm_last_error());
    if (rc != WM_OK) return;
    CHECK(r.outcome == want, "%s: outcome %u: %s", label, r.outcome, r.message);
    int n = (int)wm_tensor_count(w);
    CHECK(want == WM_CACHE_FILLED ? applies == n : applies == 0, "%s: %d applies for %d tensors", label, applies, n);
    CHECK(n == ref->n, "%s: %d tensors, %d transformed in memory", label, n, ref->n);
    if (n != ref->n) { wm_free(w); return; }

    struct wm_ggml g;
    rc = wm_ggml_place(w, NULL, &g);
    CHECK(rc == WM_OK, "%s: wm_ggml_place: %d %s", label, rc, wm_last_error());
    if (rc != WM_OK) { wm_free(w); return; }
    struct ggml_tensor *gt[MAX_T];
    uint64_t bytes = 0;
    int n_mapped = 0;
    for (int i = 0; i < n; i++) {
        wm_tensor d;
        int mapped = 0;
        rc = wm_tensor_at(w, (uint64_t)i, &d);
        if (rc == WM_OK) rc = wm_tensor_is_mapped(w, (uint64_t)i, &mapped);
        gt[i] = rc == WM_OK && strcmp(d.name, ref->names[i]) == 0 ? ggml_get_tensor(g.ctx, d.name) : NULL;
        if (!gt[i]) {
            CHECK(0, "%s: tensor %d of the entry is not %s, or not placed", label, i, ref->names[i]);
            wm_ggml_free(&g);
            wm_free(w);
            return;
        }
        CHECK(gt[i]->type == GGML_TYPE_F32 && gt[i]->data == d.data, "%s: %s is not the entry's F32 bytes", label,
              d.name);
        bytes += d.nbytes;
        n_mapped += mapped;
    }
    CHECK(n_mapped == n, "%s: %d of %d tensors in the entry's mapping", label, n_mapped, n);
    CHECK(bytes == ref_bytes, "%s: %" PRIu64 " bytes, %" PRIu64 " in memory", label, bytes, ref_bytes);

    struct outputs got;
    compute(gt, n, &got);
    int64_t growth = rss_anon() - before;
    int same = 0;
    for (int i = 0; i < n; i++) {
        int ok_mm = got.mm_bytes[i] == ref->mm_bytes[i] && memcmp(got.mm[i], ref->mm[i], got.mm_bytes[i]) == 0;
        int ok_rows = got.rows_bytes[i] == ref->rows_bytes[i] && memcmp(got.rows[i], ref->rows[i], got.rows_bytes[i]) == 0;
        CHECK(ok_mm, "%s: mul_mat(%s, x) differs from the in-memory transform's", label, ref->names[i]);
        CHECK(ok_rows, "%s: get_rows(%s) differs from the in-memory transform's", label, ref->names[i]);
        same += ok_mm && ok_rows;
    }
    CHECK(growth < (int64_t)(bytes / 10), "%s: RssAnon grew by %" PRId64 " bytes for %" PRIu64
          " bytes of cached tensors", label, growth, bytes);
    printf("%-4s: %s (%.1f ms); %d tensors placed from the entry (%" PRIu64 " bytes, %d mapped): "
           "%d of %d mul_mat + get_rows results bit-identical to the in-memory transform's; "
           "RssAnon +%" PRId64 " bytes (%.2f%% of the tensors)\n",
           label, r.message, (double)r.elapsed_ns / 1e6, n, bytes, n_mapped, same, n, growth,
           100.0 * (double)growth / (double)bytes);
    free_outputs(&got);
    wm_ggml_free(&g);
    wm_free(w);
}

static void cache_proof(const char *large, const char *dir) {
    if (rss_anon() < 0) {
        CHECK(0, "no RssAnon in /proc/self/status: the memory half of the proof cannot run here");
        return;
    }
    struct outputs ref = {0};
    uint64_t bytes = 0;
    transform_in_memory(large, &ref, &bytes);
    if (ref.n == 0) return;
    transform_cached(large, dir, WM_CACHE_FILLED, &ref, bytes);
    transform_cached(large, dir, WM_CACHE_HIT, &ref, bytes);
    free_outputs(&ref);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf [LARGE.gguf CACHE_DIR]\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    struct outputs ref;
    reference(argv[1], &ref);
    check_nonzero(&ref, "reference");
    with_weightmap(argv[1], WM_MODE_MMAP, 0, 0, &ref);
    with_weightmap(argv[1], WM_MODE_STREAM, 0, 0, &ref);
    with_weightmap(argv[1], WM_MODE_MMAP, 64, 0, &ref);
    with_weightmap(argv[1], WM_MODE_MMAP, 0, 1, &ref);
    free_outputs(&ref);
    if (argc == 4) cache_proof(argv[2], argv[3]);
    printf("%d passed, %d failed\n", passed, failed);
    printf("ggml proof: %s\n", failed ? "FAIL" : "PASS");
    return failed ? 1 : 0;
}
