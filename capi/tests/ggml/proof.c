/* Proof inside ggml: ggml computes on weightmap-placed tensors and gets
 * bit-identical results to the same graph on tensors ggml loaded itself.
 *
 * Usage: ggml_proof MODEL.gguf
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
 * Prints "N passed, N failed"; exits nonzero on any mismatch. */
#include <inttypes.h>
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

#define MAX_T 64

static int passed, failed;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (cond) {                                                         \
            passed++;                                                       \
        } else {                                                            \
            failed++;                                                       \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
        }                                                                   \
    } while (0)

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

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    struct outputs ref;
    reference(argv[1], &ref);
    for (int i = 0; i < ref.n; i++) {
        /* A result of all zeros would prove little: the inputs are nonzero. */
        int nonzero = 0;
        for (size_t k = 0; k < ref.mm_bytes[i]; k++) nonzero |= ((unsigned char *)ref.mm[i])[k];
        CHECK(nonzero, "reference mul_mat(%s) is all zeros", ref.names[i]);
    }
    with_weightmap(argv[1], WM_MODE_MMAP, 0, 0, &ref);
    with_weightmap(argv[1], WM_MODE_STREAM, 0, 0, &ref);
    with_weightmap(argv[1], WM_MODE_MMAP, 64, 0, &ref);
    with_weightmap(argv[1], WM_MODE_MMAP, 0, 1, &ref);
    free_outputs(&ref);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
