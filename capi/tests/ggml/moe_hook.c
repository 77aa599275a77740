/* Proof of the announcing hook (wm_ggml_announce, weightmap-ggml.h) inside
 * ggml, on a small mixture-of-experts model (gen_proof_model OUT moe: 2
 * layers, 8 experts, 2 used per token).
 *
 * The graph is a MoE decoder's skeleton, for 4 tokens: get_rows of the
 * token embedding, then per layer an attention-like mul_mat read whole,
 * the router (mul_mat, soft_max, top_k: the ids), and the experts
 * (mul_mat_id of gate, up and down on the ids). It runs through a
 * ggml_backend_sched on the CPU backend, on tensors placed by
 * wm_ggml_place, three ways:
 *   - the reference: weights that fit, no callback;
 *   - weights that fit, with the announcer: every expert tensor is
 *     announced whole, once;
 *   - weights over the budget (wm_load_within: the runtime's 64 MiB
 *     reserve and 512 KiB, below the file): the announcer reads each
 *     layer's ids once computed and announces the experts they name, and
 *     every other weight whole, once, as where they fit.
 * Every way's output must be bit-identical to the reference. Over the
 * budget, the experts announced for each expert tensor must be exactly
 * those the graph's ids name (read back after the compute), announced once
 * a compute, with no ids left unread and no failing call. A runtime's own
 * callback chained behind the announcer is asked about every node. Each
 * layer's router reads its normalised input, named "attn_norm-L" as
 * llama.cpp names it: over the budget, the announcer's predictor (turned
 * on) guesses every layer, the last token's experts among its guesses;
 * turned off, it guesses none; the output is the same either way. The
 * rule that reads a batch's next layer ahead is checked on its own
 * (check_batch_ahead).
 *
 * Usage: ggml_moe_hook MOE.gguf
 * Prints "N passed, N failed" and a PASS or FAIL line; exits nonzero on
 * any failure. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "weightmap.h"
#include "weightmap-ggml.h"

#include "check.h"

#define LAYERS 2
#define TOKENS 4
#define USED 2
#define EMBD 256


/* What one compute gave, and what was announced during it. */
struct run {
    float out[EMBD * TOKENS];
    int32_t ids[LAYERS][TOKENS * USED];  /* the router's choice, read back */
    uint64_t exps_index[LAYERS][3];      /* the expert tensors' indices */
    uint8_t announced[LAYERS][3][64];    /* experts announced, per tensor */
    int times[LAYERS][3];                /* announcements of each expert tensor */
    int whole[LAYERS][3];                /* ... of it whole */
    int whole_any;                       /* announcements of any tensor whole */
    uint64_t asked;                      /* nodes the chained callback was asked about */
    uint64_t n_nodes;
    uint64_t predicted, hits, misses;    /* the predictor's layers, and its score */
};

static void on_announce(void *data, uint64_t tensor, const int32_t *experts, uint32_t n) {
    struct run *r = (struct run *)data;
    r->whole_any += n == 0;
    for (int l = 0; l < LAYERS; l++)
        for (int t = 0; t < 3; t++) {
            if (r->exps_index[l][t] != tensor) continue;
            r->times[l][t]++;
            if (n == 0) r->whole[l][t]++;
            for (uint32_t j = 0; j < n; j++)
                if (experts[j] >= 0 && experts[j] < 64) r->announced[l][t][experts[j]] = 1;
        }
}

/* A runtime's own callback: asks to see nothing, counts the asks. */
static bool runtime_callback(struct ggml_tensor *t, bool ask, void *data) {
    (void)t;
    if (ask) ((struct run *)data)->asked++;
    return !ask;
}

static struct ggml_tensor *weight(struct wm_ggml *g, const char *name) {
    struct ggml_tensor *t = ggml_get_tensor(g->ctx, name);
    if (!t) {
        fprintf(stderr, "the model has no %s\n", name);
        exit(1);
    }
    return t;
}

/* The index (wm_tensor_at's) of the tensor named `name`. */
static uint64_t index_of(wm_weights *w, const char *name) {
    for (uint64_t i = 0; i < wm_tensor_count(w); i++) {
        wm_tensor t;
        if (wm_tensor_at(w, i, &t) == WM_OK && strcmp(t.name, name) == 0) return i;
    }
    fprintf(stderr, "no tensor %s\n", name);
    exit(1);
}

/* Compute the graph on `w`'s tensors, with the announcer when `hooked`
 * (1: its predictor on; 2: off), into `r`. */
static void compute(wm_weights *w, int hooked, struct run *r) {
    static const char *exps[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    memset(r, 0, sizeof *r);
    struct wm_ggml g;
    int rc = wm_ggml_place(w, NULL, &g);
    CHECK(rc == WM_OK, "wm_ggml_place: %d %s", rc, wm_last_error());
    if (rc != WM_OK) return;
    struct ggml_init_params p = {ggml_tensor_overhead() * 256 + ggml_graph_overhead(), NULL, true};
    struct ggml_context *ctx = ggml_init(p);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    struct ggml_tensor *tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, TOKENS);
    ggml_set_input(tokens);
    struct ggml_tensor *x = ggml_get_rows(ctx, weight(&g, "token_embd.weight"), tokens);
    struct ggml_tensor *ids[LAYERS];
    char name[64];
    for (int l = 0; l < LAYERS; l++) {
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        x = ggml_add(ctx, x, ggml_mul_mat(ctx, weight(&g, name), x));
        /* The layer's normalised input, named as llama.cpp names it: the
         * predictor applies the router to it. */
        struct ggml_tensor *xn = ggml_rms_norm(ctx, x, 1e-5f);
        ggml_format_name(xn, "attn_norm-%d", l);
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
        struct ggml_tensor *probs = ggml_soft_max(ctx, ggml_mul_mat(ctx, weight(&g, name), xn));
        ids[l] = ggml_top_k(ctx, probs, USED);
        ggml_set_output(ids[l]);
        struct ggml_tensor *as[3];
        for (int t = 0; t < 3; t++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, exps[t]);
            as[t] = weight(&g, name);
            r->exps_index[l][t] = index_of(w, name);
        }
        struct ggml_tensor *xe = ggml_reshape_3d(ctx, x, EMBD, 1, TOKENS);
        struct ggml_tensor *gate = ggml_mul_mat_id(ctx, as[0], xe, ids[l]);
        struct ggml_tensor *up = ggml_mul_mat_id(ctx, as[1], xe, ids[l]);
        struct ggml_tensor *down = ggml_mul_mat_id(ctx, as[2], ggml_mul(ctx, ggml_silu(ctx, gate), up), ids[l]);
        struct ggml_tensor *e0 = ggml_view_2d(ctx, down, EMBD, TOKENS, down->nb[2], 0);
        struct ggml_tensor *e1 = ggml_view_2d(ctx, down, EMBD, TOKENS, down->nb[2], down->nb[1]);
        x = ggml_add(ctx, x, ggml_add(ctx, e0, e1));
    }
    ggml_set_output(x);
    ggml_build_forward_expand(gf, x);
    r->n_nodes = (uint64_t)ggml_graph_n_nodes(gf);

    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 2);
    ggml_backend_sched_t sched = ggml_backend_sched_new(&cpu, NULL, 1, 1024, false, false);
    struct wm_ggml_announcer a;
    if (hooked) {
        rc = wm_ggml_announcer_init(&a, w);
        CHECK(rc == WM_OK, "wm_ggml_announcer_init: %d", rc);
        a.on_announce = on_announce;
        a.on_announce_data = r;
        a.next = runtime_callback;
        a.next_data = r;
        a.predict = hooked == 1;
        ggml_backend_sched_set_eval_callback(sched, wm_ggml_announce, &a);
    }
    CHECK(ggml_backend_sched_alloc_graph(sched, gf), "ggml_backend_sched_alloc_graph");
    int32_t tok[TOKENS] = {3, 17, 42, 63};
    ggml_backend_tensor_set(tokens, tok, 0, sizeof tok);
    CHECK(ggml_backend_sched_graph_compute(sched, gf) == GGML_STATUS_SUCCESS, "compute");
    ggml_backend_tensor_get(x, r->out, 0, sizeof r->out);
    for (int l = 0; l < LAYERS; l++)
        for (int t = 0; t < TOKENS; t++)
            ggml_backend_tensor_get(ids[l], &r->ids[l][t * USED], (size_t)t * ids[l]->nb[1], USED * sizeof(int32_t));
    if (hooked) {
        CHECK(a.last_error == WM_OK, "an announcement failed: %d %s", a.last_error, wm_last_error());
        CHECK(a.ids_unread == 0, "%" PRIu64 " mul_mat_ids' ids unread", a.ids_unread);
        CHECK(a.announced > 0, "nothing announced");
        r->predicted = a.predicted;
        r->hits = a.predicted_hits;
        r->misses = a.predicted_misses;
        wm_ggml_announcer_free(&a);
    }
    ggml_backend_sched_free(sched);
    ggml_backend_free(cpu);
    ggml_free(ctx);
    wm_ggml_free(&g);
}

static wm_weights *load(const char *path, uint64_t budget, uint32_t want_kind) {
    wm_weights *w = NULL;
    int rc = wm_load_within(path, NULL, budget, 0, &w);
    if (rc != WM_OK) {
        fprintf(stderr, "wm_load_within %s: %d %s\n", path, rc, wm_last_error());
        exit(1);
    }
    struct wm_residency_plan r;
    CHECK(wm_residency(w, &r) == WM_OK && r.kind == want_kind, "residency kind %u, want %u", r.kind, want_kind);
    return w;
}

/* Over the budget: each expert tensor announced once, with exactly the
 * experts the ids name. */
static void check_experts(const struct run *r, const char *label) {
    for (int l = 0; l < LAYERS; l++) {
        uint8_t want[64] = {0};
        for (int j = 0; j < TOKENS * USED; j++)
            if (r->ids[l][j] >= 0 && r->ids[l][j] < 64) want[r->ids[l][j]] = 1;
        for (int t = 0; t < 3; t++) {
            CHECK(r->times[l][t] == 1, "%s: layer %d tensor %d announced %d times", label, l, t, r->times[l][t]);
            CHECK(r->whole[l][t] == 0, "%s: layer %d tensor %d announced whole", label, l, t);
            CHECK(memcmp(want, r->announced[l][t], sizeof want) == 0, "%s: layer %d tensor %d: other experts",
                  label, l, t);
        }
    }
}

/* A batch's next layer read ahead: which tensor is the next layer's, and
 * when a batch reads it whole (most experts named, and room for three
 * layers); never where that room is unknown, as in this file's tight
 * budget, so the computes above announced no expert tensor whole. */
static void check_batch_ahead(const wm_weights *over) {
    struct wm_ggml_announcer a;
    CHECK(wm_ggml_announcer_init(&a, over) == WM_OK, "wm_ggml_announcer_init");
    int64_t up0 = wm_ggml__index(&a, "blk.0.ffn_up_exps.weight"), up1 = wm_ggml__index(&a, "blk.1.ffn_up_exps.weight");
    CHECK(up0 >= 0 && up1 >= 0 && wm_ggml__next_layer(&a, (uint64_t)up0) == up1, "blk.0's next layer is blk.1");
    CHECK(wm_ggml__next_layer(&a, (uint64_t)up1) == -1, "the last layer has no next");
    int64_t embd = wm_ggml__index(&a, "token_embd.weight");
    CHECK(embd >= 0 && wm_ggml__next_layer(&a, (uint64_t)embd) == -1, "a weight of no layer has no next");
    CHECK(a.batch_ahead && a.layer_expert_bytes > 0, "a layer's expert bytes are known over the budget");
    CHECK(!wm_ggml__reads_layer_ahead(&a, TOKENS, 8, 8), "read ahead with room for less than three layers");
    a.expert_capacity = 3 * a.layer_expert_bytes;
    CHECK(wm_ggml__reads_layer_ahead(&a, TOKENS, 7, 8), "7 of 8 experts named, room for three layers: not read ahead");
    CHECK(!wm_ggml__reads_layer_ahead(&a, TOKENS, 6, 8), "6 of 8 experts named: read ahead");
    CHECK(!wm_ggml__reads_layer_ahead(&a, 1, 8, 8), "one row, a decode: read ahead");
    a.batch_ahead = 0;
    CHECK(!wm_ggml__reads_layer_ahead(&a, TOKENS, 8, 8), "batch_ahead = 0: read ahead");
    wm_ggml_announcer_free(&a);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MOE.gguf\n", argv[0]);
        return 2;
    }
    ggml_cpu_init();
    const uint64_t reserve = (uint64_t)64 << 20;
    wm_weights *fits = load(argv[1], (uint64_t)1 << 40, WM_RESIDENCY_FITS);
    wm_weights *over = load(argv[1], reserve + (512 << 10), WM_RESIDENCY_STREAM_EXPERTS);
    static struct run ref, run;

    compute(fits, 0, &ref);
    int distinct = 0;
    for (int j = 1; j < TOKENS * USED; j++) distinct += ref.ids[0][j] != ref.ids[0][0];
    CHECK(distinct > 0, "the router chose one expert for every token");

    compute(fits, 1, &run);
    CHECK(memcmp(ref.out, run.out, sizeof ref.out) == 0, "fits, announcing: the output differs");
    CHECK(run.asked == run.n_nodes, "fits: the runtime's callback asked about %" PRIu64 " of %" PRIu64 " nodes",
          run.asked, run.n_nodes);
    for (int l = 0; l < LAYERS; l++)
        for (int t = 0; t < 3; t++)
            CHECK(run.times[l][t] == 1 && run.whole[l][t] == 1, "fits: layer %d tensor %d: %d, %d whole", l, t,
                  run.times[l][t], run.whole[l][t]);
    int fits_whole = run.whole_any;

    compute(over, 1, &run);
    CHECK(memcmp(ref.out, run.out, sizeof ref.out) == 0, "over the budget: the output differs");
    CHECK(memcmp(ref.ids, run.ids, sizeof ref.ids) == 0, "over the budget: the ids differ");
    check_experts(&run, "over the budget");
    CHECK(run.whole_any == fits_whole - LAYERS * 3, "over the budget: %d tensors announced whole, %d where they fit",
          run.whole_any, fits_whole);
    CHECK(run.asked == run.n_nodes, "over: asked about %" PRIu64 " of %" PRIu64 " nodes", run.asked, run.n_nodes);

    /* The predictor guessed each layer from its normalised input, the
     * router's own input: the last token's experts, exactly, are guessed;
     * the other tokens' are scored as misses where the last did not
     * choose them. */
    uint64_t chosen = 0;
    for (int l = 0; l < LAYERS; l++) {
        uint8_t seen[64] = {0};
        for (int j = 0; j < TOKENS * USED; j++)
            if (run.ids[l][j] >= 0 && run.ids[l][j] < 64 && !seen[run.ids[l][j]]++) chosen++;
    }
    CHECK(run.predicted == LAYERS, "the predictor guessed %" PRIu64 " of %d layers", run.predicted, LAYERS);
    CHECK(run.hits >= (uint64_t)(LAYERS * USED) && run.hits + run.misses == chosen,
          "the predictor: %" PRIu64 " hits and %" PRIu64 " misses of %" PRIu64 " experts chosen", run.hits,
          run.misses, chosen);
    printf("over the budget, the predictor: %" PRIu64 " of %" PRIu64 " chosen experts guessed\n", run.hits, chosen);
    struct run off;
    compute(over, 2, &off);
    CHECK(memcmp(ref.out, off.out, sizeof ref.out) == 0, "predictor off: the output differs");
    CHECK(off.predicted == 0 && off.hits + off.misses == 0, "predictor off: %" PRIu64 " layers guessed",
          off.predicted);

    int announced = 0;
    for (int e = 0; e < 64; e++) announced += run.announced[0][0][e];
    printf("over the budget: layer 0's experts: %d of 8 announced, those its ids name; output bit-identical\n",
           announced);

    check_batch_ahead(over);

    wm_free(fits);
    wm_free(over);
    printf("%d passed, %d failed\n", passed, failed);
    printf("ggml MoE hook proof: %s\n", failed ? "FAIL" : "PASS");
    return failed ? 1 : 0;
}
