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

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

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

/* ---- Announcing from a ggml graph: wm_ggml_announce ---------------------
 *
 * A ggml_backend_sched eval callback that makes a ggml runtime announce by
 * itself (wm_prefetch) what it reads next:
 *
 *     struct wm_ggml_announcer a;
 *     if (wm_ggml_announcer_init(&a, w) == WM_OK) {
 *         ggml_backend_sched_set_eval_callback(sched, wm_ggml_announce, &a);
 *         // llama.cpp: cparams.cb_eval = wm_ggml_announce;
 *         //            cparams.cb_eval_user_data = &a;
 *         ...                              // compute graphs
 *         wm_ggml_announcer_free(&a);      // after the last, before wm_free(w)
 *     }
 *
 * The scheduler asks the callback about each node before computing it
 * (ask = true), computes the nodes up to the first one the callback wants
 * to see as one graph, and then shows it (ask = false). The announcer:
 *   - announces each node's weights whole the first time the scheduler
 *     asks about the node, so that a cold start reads them while the nodes
 *     before them compute (not a get_rows table, of which a node reads a
 *     few rows). Whether they are read then is wm_prefetch's to decide:
 *     not where even the tensors read whole exceed the budget
 *     (WM_RESIDENCY_STREAM_ALL), as the compute reads them in order, which
 *     the fault path's read-ahead streams;
 *   - where the weights fit (wm_residency), asks to see no node: each
 *     split computes as one graph, as without the callback;
 *   - where they exceed the budget, announces the experts each
 *     ggml_mul_mat_id reads (src[0] the experts' weights, ne[2] =
 *     n_expert), only those its ids (src[2]) name, and that tensor never
 *     whole. The ids are the router's top-k, which an I32 node computes
 *     (TOP_K, or ARGSORT and a view): the announcer asks to see every I32
 *     node that computes, so that the scheduler stops after it and the ids
 *     are in memory when it asks about the mul_mat_id; they are read then
 *     (ggml_backend_tensor_get: any backend). ids that are a graph input
 *     are read as they are; ids it cannot vouch for leave that tensor
 *     unannounced (ids_unread).
 *
 * Weights are found by name (the GGUF tensor's, as wm_ggml_place and
 * llama.cpp name them), so the announcer also serves a runtime that maps
 * the file itself: the reads bring the file's pages into the page cache,
 * which both mappings share. Over the budget, the announcer also tells
 * weightmap where the runtime holds each weight it sees (wm_follow_mapping),
 * the first time it sees it, when that is not weightmap's own mapping: the
 * page plan then advises those pages as its own, and pages out of them the
 * slices it releases, which the kernel would otherwise keep (it drops no
 * page a mapping holds). Memory that is not a read-only mapping of the
 * file (a heap copy, llama.cpp's --no-mmap) is refused, and the announcer
 * stops asking if nothing was followed before. `follow` turns it off
 * (after init: 0 when the environment variable WEIGHTMAP_FOLLOW is "0").
 * A runtime's own eval callback goes in
 * `next`/`next_data`: it is asked about every node and shown those it
 * asked for, and its answer ends the compute as before. `on_announce`, when
 * set, is told each announcement (the tensor's index, and its experts or
 * none for the whole tensor): a log, or a test's check.
 *
 * The predictor (over the budget; off by default: set `predict` to 1 after
 * init, or the environment variable WEIGHTMAP_PREDICT to 1 before it, to
 * turn it on; see BENCHMARKS.md for what it gains and costs in llama.cpp).
 * A layer's experts are known only once its router has run, and their
 * reads then hold up the compute. So when a node named "attn_norm-L"
 * (llama.cpp's name for layer L's normalised input) has computed, the
 * announcer applies layer L's router (blk.L.ffn_gate_inp.weight, F32) to
 * its last row, takes the top k (the file's expert_used_count, else the
 * k of the last mul_mat_id seen), and announces those experts of layer L's
 * expert tensors as likely (wm_prefetch_likely): they are read while the
 * attention computes, with the spare time and room only. The true experts
 * follow as above; of each layer's distinct true experts, those guessed
 * count in predicted_hits and the rest in predicted_misses.
 *
 * A batch (a prompt's) whose ids name at least seven eighths of a tensor's
 * experts reads about the whole tensor, in every layer. Over the budget,
 * where the room for expert slices holds three layers' expert tensors,
 * the announcer then also announces the next layer's same tensor
 * ("blk.L+1....") whole, as it announces this one's experts: its reads go
 * to weightmap's thread and come in while this layer computes, where
 * otherwise they would start only once the next router has run. The
 * residency then keeps and releases its slices as the next layer's own
 * announcement names them. `batch_ahead` turns it off (after init: 0 when
 * the environment variable WEIGHTMAP_BATCH_AHEAD is "0"); read_ahead_whole
 * counts those announcements. */

struct wm_ggml_announcer {
    const wm_weights *w;
    /* set to NULL by wm_ggml_announcer_init; the caller may set them */
    ggml_backend_sched_eval_callback next;    /* the runtime's own callback */
    void *next_data;
    void (*on_announce)(void *data, uint64_t tensor, const int32_t *experts, uint32_t n_experts);
    void *on_announce_data;
    /* what it did */
    uint64_t announced;                       /* wm_prefetch calls that succeeded */
    uint64_t ids_unread;                      /* mul_mat_ids whose experts could not be told */
    int last_error;                           /* the last failing call's code, or WM_OK */
    int predict;                              /* 1: guess a layer's experts (after init: $WEIGHTMAP_PREDICT == "1") */
    uint64_t predicted;                       /* layers guessed */
    uint64_t predicted_hits, predicted_misses; /* true experts guessed, and not */
    int follow;                               /* 1: the runtime's own mapping is followed (after init: unless $WEIGHTMAP_FOLLOW == "0") */
    uint64_t following, follow_refused;       /* weights whose mapping is followed, and refusals */
    int batch_ahead;                          /* 1: a batch's next layer is read ahead (after init: unless $WEIGHTMAP_BATCH_AHEAD == "0") */
    uint64_t read_ahead_whole;                /* expert tensors announced whole ahead of a batch */
    /* its state */
    int over_budget;                          /* the weights exceed the budget */
    uint64_t layer_expert_bytes;              /* over the budget, a layer's expert tensors (on average) */
    uint64_t expert_capacity;                 /* over the budget, the room for expert slices */
    uint64_t n, n_slots, *slots;              /* name -> index + 1, open addressing */
    const char **names;
    uint8_t *announced_whole;                 /* by index: announced whole once */
    uint8_t *followed;                        /* by index: its runtime mapping told once */
    const struct ggml_tensor *computed[8];    /* I32 nodes seen, newest at computed_next - 1 */
    unsigned computed_next;
    int32_t *scratch;                         /* the experts of one mul_mat_id */
    uint64_t scratch_len;
    bool next_asked;
    int64_t guess_k;                          /* the router's k, 0 while unknown */
    int64_t guessed_layer;                    /* the layer of `guessed`, or -1 */
    uint8_t *guessed;                         /* by expert: guessed for guessed_layer */
    float *guess_scratch;                     /* a row, then the router's logits */
    uint64_t guessed_len, guess_scratch_len;
};

static inline uint64_t wm_ggml__hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* The layer of a weight named "blk.L.rest", with `rest` set to ".rest";
 * -1 for a weight of no layer. */
static inline long wm_ggml__layer(const char *name, const char **rest) {
    char *end;
    if (strncmp(name, "blk.", 4) != 0) return -1;
    long layer = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || layer < 0) return -1;
    *rest = end;
    return layer;
}

static inline void wm_ggml_announcer_free(struct wm_ggml_announcer *a) {
    free(a->slots);
    free(a->names);
    free(a->announced_whole);
    free(a->followed);
    free(a->scratch);
    free(a->guessed);
    free(a->guess_scratch);
    memset(a, 0, sizeof *a);
}

/* The index of the tensor named `name`, or -1. */
static inline int64_t wm_ggml__index(const struct wm_ggml_announcer *a, const char *name) {
    for (uint64_t s = wm_ggml__hash(name) & (a->n_slots - 1); a->slots[s]; s = (s + 1) & (a->n_slots - 1)) {
        uint64_t i = a->slots[s] - 1;
        if (strcmp(a->names[i], name) == 0) return (int64_t)i;
    }
    return -1;
}

static inline int wm_ggml_announcer_init(struct wm_ggml_announcer *a, const wm_weights *w) {
    memset(a, 0, sizeof *a);
    a->w = w;
    a->n = wm_tensor_count(w);
    a->n_slots = 16;
    while (a->n_slots < 2 * a->n) a->n_slots *= 2;
    a->slots = (uint64_t *)calloc((size_t)a->n_slots, sizeof(uint64_t));
    a->names = (const char **)calloc((size_t)a->n + 1, sizeof(char *));
    a->announced_whole = (uint8_t *)calloc((size_t)a->n + 1, 1);
    a->followed = (uint8_t *)calloc((size_t)a->n + 1, 1);
    if (!a->slots || !a->names || !a->announced_whole || !a->followed) {
        wm_ggml_announcer_free(a);
        return WM_ERR_NO_MEMORY;
    }
    struct wm_residency_plan r;
    int rc = wm_residency(w, &r);
    a->over_budget = rc == WM_OK && r.kind != WM_RESIDENCY_FITS;
    uint64_t layers = 0; /* of expert tensors */
    for (uint64_t i = 0; rc == WM_OK && i < a->n; i++) {
        wm_tensor t;
        rc = wm_tensor_at(w, i, &t);
        if (rc != WM_OK) break;
        a->names[i] = t.name;
        uint64_t s = wm_ggml__hash(t.name) & (a->n_slots - 1);
        while (a->slots[s]) s = (s + 1) & (a->n_slots - 1);
        a->slots[s] = i + 1;
        const char *rest;
        long layer = wm_ggml__layer(t.name, &rest);
        if (t.n_dims == 3 && strstr(t.name, "_exps") && layer >= 0 && (uint64_t)layer + 1 > layers)
            layers = (uint64_t)layer + 1;
    }
    if (rc != WM_OK) {
        wm_ggml_announcer_free(a);
        return rc;
    }
    if (r.kind == WM_RESIDENCY_STREAM_EXPERTS && layers > 0) {
        a->layer_expert_bytes = r.experts / layers;
        a->expert_capacity = r.expert_capacity;
    }
    a->guessed_layer = -1;
    const char *predict = getenv("WEIGHTMAP_PREDICT");
    a->predict = predict && strcmp(predict, "1") == 0;
    const char *follow = getenv("WEIGHTMAP_FOLLOW");
    a->follow = !(follow && strcmp(follow, "0") == 0);
    const char *batch_ahead = getenv("WEIGHTMAP_BATCH_AHEAD");
    a->batch_ahead = !(batch_ahead && strcmp(batch_ahead, "0") == 0);
    const char *arch;
    uint64_t arch_len, k;
    char key[96];
    if (wm_meta_str(w, "general.architecture", &arch, &arch_len) == WM_OK && arch_len < 64) {
        snprintf(key, sizeof key, "%.*s.expert_used_count", (int)arch_len, arch);
        if (wm_meta_u64(w, key, &k) == WM_OK && k > 0 && k < 4096) a->guess_k = (int64_t)k;
    }
    return WM_OK;
}

/* The index of the weight `t` is (or views), or -1 when it is none. */
static inline int64_t wm_ggml__weight(const struct wm_ggml_announcer *a, const struct ggml_tensor *t) {
    if (t->view_src) t = t->view_src;
    if (t->op != GGML_OP_NONE || !t->name[0]) return -1;
    return wm_ggml__index(a, t->name);
}

/* Tell weightmap where the runtime holds weight `i` (`t`), once, unless it
 * is weightmap's own mapping; after a refusal before any success (a heap
 * copy, a platform without it), ask no more. */
static inline void wm_ggml__follow(struct wm_ggml_announcer *a, const struct ggml_tensor *t, uint64_t i) {
    if (!a->follow || a->followed[i]) return;
    a->followed[i] = 1;
    if (t->view_src) t = t->view_src;
    wm_tensor mine;
    if (!t->data || !t->buffer || !ggml_backend_buffer_is_host(t->buffer) || wm_tensor_at(a->w, i, &mine) != WM_OK ||
        mine.data == t->data)
        return;
    if (wm_follow_mapping(a->w, i, t->data) == WM_OK) {
        a->following++;
    } else {
        a->follow_refused++;
        if (!a->following) a->follow = 0;
    }
}

static inline void wm_ggml__prefetch(struct wm_ggml_announcer *a, uint64_t i, const int32_t *experts, uint32_t k) {
    wm_need need = {i, experts, k};
    int rc = wm_prefetch(a->w, &need, 1);
    if (rc != WM_OK) {
        a->last_error = rc;
        return;
    }
    a->announced++;
    if (a->on_announce) a->on_announce(a->on_announce_data, i, experts, k);
}

/* Whether the data of `ids` can be read now: a graph input, or computed by
 * an I32 node the announcer has seen. */
static inline bool wm_ggml__ids_ready(const struct wm_ggml_announcer *a, const struct ggml_tensor *ids) {
    const struct ggml_tensor *root = ids->view_src ? ids->view_src : ids;
    if (root->op == GGML_OP_NONE) return root->data != NULL;
    for (unsigned j = 0; j < 8; j++)
        if (a->computed[j] == root) return true;
    return false;
}

/* Score the guess of the layer whose expert tensor `weight` is against the
 * true experts `distinct` (n of them), once a layer. */
static inline void wm_ggml__score(struct wm_ggml_announcer *a, uint64_t weight, const int32_t *distinct, uint32_t n) {
    char prefix[32];
    if (a->guessed_layer < 0) return;
    int len = snprintf(prefix, sizeof prefix, "blk.%lld.", (long long)a->guessed_layer);
    if (strncmp(a->names[weight], prefix, (size_t)len) != 0) return;
    for (uint32_t j = 0; j < n; j++) {
        bool hit = (uint64_t)distinct[j] < a->guessed_len && a->guessed[distinct[j]];
        a->predicted_hits += hit;
        a->predicted_misses += !hit;
    }
    a->guessed_layer = -1;
}

/* Weight i's namesake in the next layer ("blk.L.rest" -> "blk.L+1.rest"),
 * or -1. */
static inline int64_t wm_ggml__next_layer(const struct wm_ggml_announcer *a, uint64_t i) {
    const char *rest;
    char next[128];
    long layer = wm_ggml__layer(a->names[i], &rest);
    if (layer < 0) return -1;
    int len = snprintf(next, sizeof next, "blk.%ld%s", layer + 1, rest);
    return len > 0 && len < (int)sizeof next ? wm_ggml__index(a, next) : -1;
}

/* Whether a batch of `rows` whose ids name `n` of `n_expert` experts has
 * the next layer's expert tensors read ahead whole: most of them named
 * (seven eighths: a short prompt's few rows name fewer, and would read
 * what it does not use), and room for experts that holds the layer in use,
 * the next, and as much again. */
static inline bool wm_ggml__reads_layer_ahead(const struct wm_ggml_announcer *a, int64_t rows, uint32_t n,
                                              int64_t n_expert) {
    return a->batch_ahead && rows > 1 && 8 * (int64_t)n >= 7 * n_expert && a->layer_expert_bytes > 0 &&
           a->expert_capacity / 3 >= a->layer_expert_bytes;
}

/* Announce the experts that mul_mat_id `t`'s ids name, of weight `i`, and,
 * for a batch that names most of them, the next layer's weight whole
 * (wm_ggml__reads_layer_ahead); false when they cannot be read. */
static inline bool wm_ggml__announce_experts(struct wm_ggml_announcer *a, const struct ggml_tensor *t, uint64_t i) {
    const struct ggml_tensor *ids = t->src[2], *as = t->src[0];
    int64_t n_expert = as->ne[2], k = ids->ne[0], rows = ids->ne[1];
    if (!wm_ggml__ids_ready(a, ids) || !ids->buffer || ids->type != GGML_TYPE_I32 || ids->nb[0] != sizeof(int32_t) ||
        n_expert <= 0 || k <= 0 || ids->ne[2] * ids->ne[3] != 1)
        return false;
    /* scratch: the distinct experts (n_expert at most), one row of ids
     * (k), and whether each expert is chosen (n_expert) */
    uint64_t need = 2 * (uint64_t)n_expert + (uint64_t)k;
    if (a->scratch_len < need) {
        int32_t *m = (int32_t *)realloc(a->scratch, (size_t)need * sizeof(int32_t));
        if (!m) return false;
        a->scratch = m;
        a->scratch_len = need;
    }
    int32_t *distinct = a->scratch, *row = distinct + n_expert, *chosen = row + k;
    memset(chosen, 0, (size_t)n_expert * sizeof(int32_t));
    uint32_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        ggml_backend_tensor_get((struct ggml_tensor *)ids, row, (size_t)(r * ids->nb[1]), (size_t)k * sizeof(int32_t));
        for (int64_t j = 0; j < k; j++) {
            int32_t e = row[j];
            if (e < 0 || e >= n_expert) return false;
            if (!chosen[e]) distinct[n++] = e;
            chosen[e] = 1;
        }
    }
    wm_ggml__prefetch(a, i, distinct, n);
    if (wm_ggml__reads_layer_ahead(a, rows, n, n_expert)) {
        int64_t next = wm_ggml__next_layer(a, i);
        if (next >= 0) {
            wm_ggml__prefetch(a, (uint64_t)next, NULL, 0);
            a->read_ahead_whole++;
        }
    }
    if (a->guess_k <= 0) a->guess_k = k;
    wm_ggml__score(a, i, distinct, n);
    return true;
}

/* Whether `t` is an I32 node that computes (not a view, not an input): a
 * router's top-k. */
static inline bool wm_ggml__computes_ids(const struct ggml_tensor *t) {
    return t->type == GGML_TYPE_I32 && t->op != GGML_OP_NONE && !t->view_src;
}

/* The layer whose normalised input `t` is ("attn_norm-L"), when the
 * predictor can guess that layer's experts (its router is an F32 weight of
 * weightmap's whose rows are t's); else -1. */
static inline int64_t wm_ggml__guessable(const struct wm_ggml_announcer *a, const struct ggml_tensor *t,
                                         wm_tensor *router) {
    char *end;
    if (!a->over_budget || !a->predict || a->guess_k <= 0 || strncmp(t->name, "attn_norm-", 10) != 0) return -1;
    long layer = strtol(t->name + 10, &end, 10);
    char name[64];
    if (*end || end == t->name + 10 || layer < 0) return -1;
    snprintf(name, sizeof name, "blk.%ld.ffn_gate_inp.weight", layer);
    int64_t i = wm_ggml__index(a, name);
    if (i < 0 || wm_tensor_at(a->w, (uint64_t)i, router) != WM_OK) return -1;
    if (router->ggml_type != GGML_TYPE_F32 || router->ne[0] != t->ne[0] || router->ne[1] < a->guess_k ||
        t->type != GGML_TYPE_F32 || t->nb[0] != sizeof(float) || !t->buffer)
        return -1;
    return layer;
}

/* Guess layer `layer`'s experts from its normalised input `t`, computed:
 * its router on t's last row, the top guess_k, announced likely for the
 * layer's expert tensors. */
static inline void wm_ggml__guess(struct wm_ggml_announcer *a, const struct ggml_tensor *t, int64_t layer,
                                  const wm_tensor *router) {
    int64_t n_embd = router->ne[0], n_expert = router->ne[1], k = a->guess_k;
    uint64_t need = (uint64_t)(n_embd + n_expert);
    if (a->guess_scratch_len < need) {
        float *m = (float *)realloc(a->guess_scratch, (size_t)need * sizeof(float));
        if (!m) return;
        a->guess_scratch = m;
        a->guess_scratch_len = need;
    }
    if (a->guessed_len < (uint64_t)n_expert) {
        uint8_t *m = (uint8_t *)realloc(a->guessed, (size_t)n_expert);
        if (!m) return;
        a->guessed = m;
        a->guessed_len = (uint64_t)n_expert;
    }
    float *x = a->guess_scratch, *logit = x + n_embd;
    int64_t rows = ggml_nrows(t);
    ggml_backend_tensor_get((struct ggml_tensor *)t, x, (size_t)((rows - 1) * t->nb[1]), (size_t)n_embd * sizeof(float));
    const float *wr = (const float *)router->data;
    for (int64_t e = 0; e < n_expert; e++) {
        float sum = 0;
        for (int64_t j = 0; j < n_embd; j++) sum += wr[e * (int64_t)(router->nb[1] / sizeof(float)) + j] * x[j];
        logit[e] = sum;
    }
    /* the top k, by selection: k and n_expert are small */
    int32_t *experts = a->scratch_len >= (uint64_t)k ? a->scratch : NULL;
    if (!experts) {
        experts = (int32_t *)realloc(a->scratch, (size_t)k * sizeof(int32_t));
        if (!experts) return;
        a->scratch = experts;
        a->scratch_len = (uint64_t)k;
    }
    memset(a->guessed, 0, (size_t)n_expert);
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < n_expert; e++)
            if (!a->guessed[e] && (best < 0 || logit[e] > logit[best])) best = e;
        a->guessed[best] = 1;
        experts[j] = (int32_t)best;
    }
    static const char *exps[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    char name[64];
    for (int s = 0; s < 3; s++) {
        snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)layer, exps[s]);
        int64_t i = wm_ggml__index(a, name);
        if (i < 0) continue;
        wm_need guess = {(uint64_t)i, experts, (uint32_t)k};
        int rc = wm_prefetch_likely(a->w, &guess, 1);
        if (rc != WM_OK) a->last_error = rc;
    }
    a->guessed_layer = layer;
    a->predicted++;
}

static inline bool wm_ggml_announce(struct ggml_tensor *t, bool ask, void *user_data) {
    struct wm_ggml_announcer *a = (struct wm_ggml_announcer *)user_data;
    wm_tensor router;
    int64_t layer = wm_ggml__guessable(a, t, &router);
    if (!ask) {
        if (wm_ggml__computes_ids(t)) a->computed[a->computed_next++ % 8] = t;
        if (layer >= 0) wm_ggml__guess(a, t, layer, &router);
        return a->next && a->next_asked ? a->next(t, false, a->next_data) : true;
    }
    for (int s = 0; a->over_budget && s < GGML_MAX_SRC && t->src[s]; s++) {
        int64_t i = wm_ggml__weight(a, t->src[s]);
        if (i >= 0) wm_ggml__follow(a, t->src[s], (uint64_t)i);
    }
    if (a->over_budget && t->op == GGML_OP_MUL_MAT_ID) {
        int64_t i = wm_ggml__weight(a, t->src[0]);
        if (i >= 0 && !wm_ggml__announce_experts(a, t, (uint64_t)i)) a->ids_unread++;
    }
    for (int s = 0; s < GGML_MAX_SRC && t->src[s]; s++) {
        if (s == 0 && (t->op == GGML_OP_GET_ROWS || (a->over_budget && t->op == GGML_OP_MUL_MAT_ID))) continue;
        int64_t i = wm_ggml__weight(a, t->src[s]);
        if (i < 0 || a->announced_whole[i]) continue;
        a->announced_whole[i] = 1;
        wm_ggml__prefetch(a, (uint64_t)i, NULL, 0);
    }
    a->next_asked = a->next ? a->next(t, true, a->next_data) : false;
    return (a->over_budget && wm_ggml__computes_ids(t)) || layer >= 0 || a->next_asked;
}

#endif /* WEIGHTMAP_GGML_H */
