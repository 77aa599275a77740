// llama_gen: the pinned llama.cpp generating tokens (sampled, seeded) on its own
// mapping of MODEL (use_mmap, CPU, 2 threads), with or without weightmap's
// announcing hook as its eval callback (benches/residency/llama_gen.sh).
//
//   llama_gen MODEL N_TOKENS plain|announce [PROMPT_TOKENS]
//
// PROMPT_TOKENS: the prompt made that many tokens long (seeded tokens of the
// vocabulary after it), decoded as one batch (a prefill): "prompt_s" and
// "prompt_read_bytes" say what it took, and "prompt_user_s",
// "prompt_sys_s" and "prompt_major_faults" what it cost this process's
// threads (getrusage: the compute's, weightmap's, and the kernel's work for
// them; a madvise(MADV_POPULATE_READ) counts its faults too).
//
// announce: weightmap maps the same file (wm_load, its budget read from the
// system: the memory cgroup, when run in one), and wm_ggml_announce
// (weightmap-ggml.h) is llama.cpp's cb_eval: it announces each node's
// weights as the scheduler reaches them, and the experts llama.cpp's own
// router chose once their ids are computed. The reads bring the file's
// pages into the page cache, which llama.cpp's mapping shares.
// WEIGHTMAP_PREDICT=1 turns the hook's predictor on; WEIGHTMAP_FOLLOW=0
// leaves llama.cpp's mapping unfollowed (weightmap's advice and releases
// then act on its own mapping only).
//
// Prints one JSON line: the mode, seconds to load, to the first token and
// per token after it, tokens/s, the bytes read from storage while
// generating (the prompt's decode included), the token ids, and the hook's
// counts: its announcements, and the expert slices llama.cpp's router chose (announced
// over the budget only; each once a token, and how many distinct), and
// per expert tensor (min, median, max over the tensors) how many distinct
// experts it saw and the share of its announcements that named its most
// used one: how diversely the file routes. With them, every such
// announcement in order ("routing": decode, tensor, slice bytes, experts)
// and the bytes of the tensors not stored by experts ("whole_bytes"), from
// which llama_proof.py counts the LRU bound.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <sys/resource.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "llama.h"
#include "weightmap.h"
#include "weightmap-ggml.h"

static double now() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// What the router chose over the run: each expert slice announced, once.
struct chosen {
    std::vector<std::vector<uint32_t>> used;  // by tensor, by expert: announcements naming it
    std::vector<uint32_t> calls;              // by tensor: its announcements by experts
    uint64_t distinct = 0, announced = 0;
    // Every announcement by experts, in order, for the LRU bound
    // (llama_proof.py): "[decode, tensor, slice bytes, expert...]".
    std::string routing;
    int decode = 0;
    const wm_weights *w = nullptr;
};

static void count_chosen(void *data, uint64_t tensor, const int32_t *experts, uint32_t n) {
    chosen *c = (chosen *)data;
    if (n == 0) return;  // a tensor announced whole
    if (c->used.size() <= tensor) c->used.resize(tensor + 1), c->calls.resize(tensor + 1);
    c->calls[tensor]++;
    wm_tensor t;
    const uint64_t slice = wm_tensor_at(c->w, tensor, &t) == WM_OK && t.n_dims == 3 ? t.nbytes / t.ne[2] : 0;
    c->routing += (c->routing.empty() ? "[" : ", [") + std::to_string(c->decode) + ", " +
                  std::to_string(tensor) + ", " + std::to_string(slice);
    for (uint32_t j = 0; j < n; j++) c->routing += ", " + std::to_string(experts[j]);
    c->routing += "]";
    for (uint32_t j = 0; j < n; j++) {
        std::vector<uint32_t> &u = c->used[tensor];
        if (u.size() <= (size_t)experts[j]) u.resize(experts[j] + 1);
        c->distinct += !u[experts[j]];
        c->announced++;
        u[experts[j]]++;
    }
}

// "[min, median, max]" of `v` (sorted here).
static std::string spread(std::vector<double> v) {
    if (v.empty()) return "null";
    std::sort(v.begin(), v.end());
    char s[96];
    snprintf(s, sizeof s, "[%.3g, %.3g, %.3g]", v.front(), v[v.size() / 2], v.back());
    return s;
}

// Bytes this process has had read from storage (/proc/self/io, all its
// threads: faults, read-ahead, announced reads), or 0 where unknown.
static unsigned long long storage_read_bytes() {
    FILE *f = fopen("/proc/self/io", "r");
    unsigned long long v = 0;
    char line[128];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "read_bytes: %llu", &v) == 1) break;
    if (f) fclose(f);
    return v;
}

// This process's CPU seconds so far, in user space and in the kernel (all
// its threads: the compute's, weightmap's, and the kernel's work on their
// behalf: faults, reclaim, read submission), and its major faults.
struct cpu_use {
    double user = 0, sys = 0;
    long major_faults = 0;
};
static cpu_use cpu_now() {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    return {r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6, r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6,
            r.ru_majflt};
}

static void quiet(enum ggml_log_level level, const char *text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if ((argc != 4 && argc != 5) || (strcmp(argv[3], "plain") != 0 && strcmp(argv[3], "announce") != 0)) {
        fprintf(stderr, "usage: %s MODEL N_TOKENS plain|announce [PROMPT_TOKENS]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    const int n_gen = atoi(argv[2]);
    const int n_prompt = argc == 5 ? atoi(argv[4]) : 0;
    const bool announce = strcmp(argv[3], "announce") == 0;
    llama_log_set(quiet, nullptr);
    llama_backend_init();

    const double t0 = now();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.load_mode = LLAMA_LOAD_MODE_MMAP;
    // No repacked copies of the weights (ggml-cpu's extra buffer types):
    // they are anonymous memory the size of the model, which a cgroup
    // smaller than the file kills for, and the weights must stay the
    // mapping's pages, whichever mode runs.
    mp.use_extra_bufts = false;
    llama_model *model = llama_model_load_from_file(path, mp);
    if (!model) {
        fprintf(stderr, "llama.cpp could not load %s\n", path);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = std::max(512, n_prompt + n_gen + 8);
    cp.n_batch = std::max(64, n_prompt);
    cp.n_ubatch = cp.n_batch;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    wm_weights *w = nullptr;
    wm_ggml_announcer a;
    wm_residency_plan plan = {};
    chosen routed;
    if (announce) {
        if (wm_load(path, nullptr, &w) != WM_OK || wm_ggml_announcer_init(&a, w) != WM_OK) {
            fprintf(stderr, "weightmap: %s\n", wm_last_error());
            return 1;
        }
        wm_residency(w, &plan);
        routed.w = w;
        a.on_announce = count_chosen;
        a.on_announce_data = &routed;
        cp.cb_eval = wm_ggml_announce;
        cp.cb_eval_user_data = &a;
    }
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama.cpp could not make a context\n");
        return 1;
    }
    const double t_load = now() - t0;

    const llama_vocab *vocab = llama_model_get_vocab(model);
    const std::string prompt = "The weights of a model larger than memory";
    std::vector<llama_token> toks(prompt.size() + 8);
    int n = llama_tokenize(vocab, prompt.c_str(), (int32_t)prompt.size(), toks.data(), (int32_t)toks.size(), true,
                           false);
    if (n <= 0) {
        fprintf(stderr, "llama.cpp could not tokenize the prompt\n");
        return 1;
    }
    toks.resize(n);
    // A prefill: the prompt, then tokens drawn from the vocabulary's upper
    // part (seeded; the same in every run), so that its rows route as
    // diversely as a long text would, not as a few tokens repeated.
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    uint64_t draw = 46;
    while ((int)toks.size() < n_prompt && n_vocab > 2048) {
        draw = draw * 6364136223846793005ull + 1442695040888963407ull;
        toks.push_back((llama_token)(1024 + (draw >> 33) % (uint64_t)(n_vocab - 2048)));
    }
    n = (int)toks.size();
    // Sampled, seeded: the same logits give the same tokens in every run,
    // and synthetic weights, whose greedy choice repeats one token (and so
    // one routing), give a different token, and experts, each step.
    llama_sampler *sampler = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(sampler, llama_sampler_init_dist(46));
    llama_batch batch = llama_batch_get_one(toks.data(), n);
    std::vector<llama_token> out;
    llama_token tok;
    const unsigned long long read_before = storage_read_bytes();
    const cpu_use cpu_before = cpu_now();
    cpu_use cpu_prompt;
    const double t_start = now();
    double t_first = 0, t_prompt = 0;
    unsigned long long prompt_read = 0;
    for (int i = 0; i < n_gen; i++) {
        routed.decode = i;
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama_decode failed at token %d\n", i);
            return 1;
        }
        if (i == 0) {
            t_prompt = now() - t_start;
            prompt_read = storage_read_bytes() - read_before;
            cpu_prompt = cpu_now();
        }
        tok = llama_sampler_sample(sampler, ctx, -1);
        out.push_back(tok);
        if (i == 0) t_first = now() - t_start;
        batch = llama_batch_get_one(&tok, 1);
    }
    const double t_rest = now() - t_start - t_first;
    const unsigned long long gen_read = storage_read_bytes() - read_before;

    printf("{\"mode\": \"%s\", \"load_s\": %.3f, \"first_token_s\": %.3f, \"tok_s\": %.3f, \"prompt_tokens\": %d, "
           "\"gen_read_bytes\": %llu, \"prompt_s\": %.3f, \"prompt_read_bytes\": %llu, \"prompt_user_s\": %.3f, "
           "\"prompt_sys_s\": %.3f, \"prompt_major_faults\": %ld",
           argv[3], t_load, t_first, n_gen > 1 ? (n_gen - 1) / t_rest : 0.0, n, gen_read, t_prompt, prompt_read,
           cpu_prompt.user - cpu_before.user, cpu_prompt.sys - cpu_before.sys,
           cpu_prompt.major_faults - cpu_before.major_faults);
    if (announce)
        printf(", \"announced\": %llu, \"ids_unread\": %llu, \"last_error\": %d, \"residency\": %u, "
               "\"expert_slices_announced\": %llu, \"expert_slices_distinct\": %llu, \"predict\": %d, "
               "\"predicted_layers\": %llu, \"predicted_hits\": %llu, \"predicted_misses\": %llu, "
               "\"following\": %llu, \"follow_refused\": %llu, \"read_ahead_whole\": %llu",
               (unsigned long long)a.announced, (unsigned long long)a.ids_unread, a.last_error, plan.kind,
               (unsigned long long)routed.announced, (unsigned long long)routed.distinct, a.predict,
               (unsigned long long)a.predicted, (unsigned long long)a.predicted_hits,
               (unsigned long long)a.predicted_misses, (unsigned long long)a.following,
               (unsigned long long)a.follow_refused, (unsigned long long)a.read_ahead_whole);
    if (announce) {
        std::vector<double> distinct, top_share;
        for (size_t t = 0; t < routed.used.size(); t++) {
            if (routed.calls[t] == 0) continue;
            const std::vector<uint32_t> &u = routed.used[t];
            distinct.push_back((double)std::count_if(u.begin(), u.end(), [](uint32_t k) { return k > 0; }));
            top_share.push_back((double)*std::max_element(u.begin(), u.end()) / routed.calls[t]);
        }
        printf(", \"expert_tensors\": %zu, \"distinct_experts_per_tensor\": %s, \"most_used_share\": %s",
               distinct.size(), spread(distinct).c_str(), spread(top_share).c_str());
        // The bytes of the tensors not stored by experts (ggml's 3-D
        // ones), which an LRU of experts holds beside them.
        uint64_t whole = 0;
        wm_tensor t;
        for (uint64_t i = 0; i < wm_tensor_count(w); i++)
            if (wm_tensor_at(w, i, &t) == WM_OK && t.n_dims != 3) whole += t.nbytes;
        printf(", \"whole_bytes\": %llu, \"routing\": [%s]", (unsigned long long)whole, routed.routing.c_str());
    }
    printf(", \"tokens\": [");
    for (size_t i = 0; i < out.size(); i++) printf("%s%d", i ? ", " : "", out[i]);
    printf("]}\n");

    llama_sampler_free(sampler);
    llama_free(ctx);
    llama_model_free(model);
    if (announce) {
        wm_ggml_announcer_free(&a);
        wm_free(w);
    }
    llama_backend_free();
    return 0;
}
