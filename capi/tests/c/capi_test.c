/* weightmap's C ABI, tested from C.
 *
 * Usage: capi_test EXPECT_FILE
 *
 * EXPECT_FILE is written by the Rust driver (capi/tests/c_abi.rs) from the
 * fixtures' JSON manifests, as whitespace-separated tokens; strings are hex
 * ("-" for the empty string), so that no escaping is needed:
 *
 *   FILE <path> <tensor count>      a fixture, loaded in mmap and stream mode
 *   T <name> <ggml type> <n_dims> <ne0..ne3> <nb0..nb3> <nbytes> <offset>
 *   U <key> <value>                 wm_meta_u64
 *   F <key> <bits of the double>    wm_meta_f64
 *   S <key> <bytes>                 wm_meta_str
 *   A <key> <len>                   wm_meta_array_len
 *   AS <key> <index> <bytes>        wm_meta_array_str
 *   MISALIGNED <path>               a GGUF whose tensors are 8-aligned only
 *   CACHE <dir> <cached>            an empty directory for wm_cache_load;
 *                                   cached 0 where the target may not map
 *                                   entries (it may then run in memory)
 *   END
 *
 * Tensor bytes are compared with the file's own bytes, read with stdio.
 * Prints "N passed, N failed" and exits nonzero on any failure. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weightmap.h"

static int passed, failed;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (cond) {                                              \
            passed++;                                            \
        } else {                                                 \
            failed++;                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
        }                                                        \
    } while (0)

static const char *err(void) {
    const char *e = wm_last_error();
    return e ? e : "(no error message)";
}

/* Decode hex `s` ("-" = empty) into a fresh NUL-terminated buffer. */
static char *unhex(const char *s, size_t *len) {
    size_t n = strcmp(s, "-") == 0 ? 0 : strlen(s) / 2;
    char *out = malloc(n + 1);
    if (!out) abort();
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) abort();
        out[i] = (char)v;
    }
    out[n] = 0;
    if (len) *len = n;
    return out;
}

static char tok[1 << 20];

static const char *next(FILE *f) {
    if (fscanf(f, "%1048575s", tok) != 1) {
        fprintf(stderr, "expectation file ended early\n");
        exit(2);
    }
    return tok;
}

static char *next_str(FILE *f, size_t *len) { return unhex(next(f), len); }
static uint64_t next_u64(FILE *f) { return strtoull(next(f), NULL, 10); }
static int64_t next_i64(FILE *f) { return strtoll(next(f), NULL, 10); }

/* The file's bytes [offset, offset + n), read without weightmap. */
static unsigned char *file_bytes(const char *path, uint64_t offset, uint64_t n) {
    FILE *f = fopen(path, "rb");
    unsigned char *b = malloc(n ? n : 1);
    if (!f || !b) abort();
    if (fseek(f, (long)offset, SEEK_SET) != 0 || fread(b, 1, n, f) != n) abort();
    fclose(f);
    return b;
}

/* Check one "T" record against the loaded weights. */
static void check_tensor(const wm_weights *w, const char *path, FILE *f, uint64_t index) {
    char *name = next_str(f, NULL);
    int32_t type = (int32_t)next_i64(f);
    int32_t n_dims = (int32_t)next_i64(f);
    int64_t ne[4];
    uint64_t nb[4];
    for (int k = 0; k < 4; k++) ne[k] = next_i64(f);
    for (int k = 0; k < 4; k++) nb[k] = next_u64(f);
    uint64_t nbytes = next_u64(f), offset = next_u64(f);

    wm_tensor t, at;
    int rc = wm_tensor_by_name(w, name, &t);
    CHECK(rc == WM_OK, "%s: wm_tensor_by_name(%s) = %d: %s", path, name, rc, err());
    if (rc != WM_OK) { free(name); return; }
    rc = wm_tensor_at(w, index, &at);
    CHECK(rc == WM_OK && at.name == t.name && at.data == t.data,
          "%s: wm_tensor_at(%" PRIu64 ") is not %s", path, index, name);
    CHECK(strcmp(t.name, name) == 0, "name %s != %s", t.name, name);
    CHECK(t.ggml_type == type, "%s: ggml_type %d != %d", name, t.ggml_type, type);
    CHECK(t.n_dims == n_dims, "%s: n_dims %d != %d", name, t.n_dims, n_dims);
    for (int k = 0; k < 4; k++) {
        CHECK(t.ne[k] == ne[k], "%s: ne[%d] %" PRId64 " != %" PRId64, name, k, t.ne[k], ne[k]);
        CHECK(t.nb[k] == nb[k], "%s: nb[%d] %" PRIu64 " != %" PRIu64, name, k, t.nb[k], nb[k]);
    }
    CHECK(t.nbytes == nbytes, "%s: nbytes %" PRIu64 " != %" PRIu64, name, t.nbytes, nbytes);
    CHECK(t.file_offset == offset, "%s: file_offset %" PRIu64 " != %" PRIu64, name,
          t.file_offset, offset);
    CHECK(t.data != NULL, "%s: data is NULL", name);
    unsigned char *want = file_bytes(path, offset, nbytes);
    CHECK(t.data && memcmp(t.data, want, nbytes) == 0, "%s: data differs from the file's bytes", name);
    free(want);
    free(name);
}

static void check_file(const char *path, uint32_t mode, FILE *f, long start) {
    wm_options o = wm_options_default();
    o.mode = mode;
    wm_weights *w = (wm_weights *)1; /* must be overwritten */
    int rc = wm_load(path, &o, &w);
    CHECK(rc == WM_OK && w != NULL, "wm_load(%s, mode %u) = %d: %s", path, mode, rc, err());
    if (rc != WM_OK) return;
    CHECK(wm_mode_used(w) == (int)mode, "%s: mode used %d, asked %u", path, wm_mode_used(w), mode);
    CHECK(wm_fallback_reason(w) == NULL, "%s: fell back: %s", path, wm_fallback_reason(w));

    fseek(f, start, SEEK_SET);
    uint64_t count = next_u64(f), index = 0;
    CHECK(wm_tensor_count(w) == count, "%s: %" PRIu64 " tensors, want %" PRIu64, path,
          wm_tensor_count(w), count);
    for (;;) {
        long here = ftell(f);
        const char *kind = next(f);
        if (strcmp(kind, "T") == 0) {
            check_tensor(w, path, f, index++);
        } else if (strcmp(kind, "U") == 0) {
            char *key = next_str(f, NULL);
            uint64_t want = next_u64(f), got = 0;
            rc = wm_meta_u64(w, key, &got);
            CHECK(rc == WM_OK && got == want, "%s: u64 %s = %" PRIu64 " (rc %d: %s), want %" PRIu64,
                  path, key, got, rc, err(), want);
            free(key);
        } else if (strcmp(kind, "F") == 0) {
            char *key = next_str(f, NULL);
            uint64_t bits = next_u64(f), gotbits = 0;
            double got = 0;
            rc = wm_meta_f64(w, key, &got);
            memcpy(&gotbits, &got, sizeof got);
            CHECK(rc == WM_OK && gotbits == bits, "%s: f64 %s = %.17g (rc %d)", path, key, got, rc);
            free(key);
        } else if (strcmp(kind, "S") == 0) {
            char *key = next_str(f, NULL);
            size_t n;
            char *want = next_str(f, &n);
            const char *p = NULL;
            uint64_t len = 0;
            rc = wm_meta_str(w, key, &p, &len);
            CHECK(rc == WM_OK && len == n && memcmp(p, want, n) == 0 && p[n] == 0,
                  "%s: str %s (rc %d: %s)", path, key, rc, err());
            free(key);
            free(want);
        } else if (strcmp(kind, "A") == 0) {
            char *key = next_str(f, NULL);
            uint64_t want = next_u64(f), got = 0;
            rc = wm_meta_array_len(w, key, &got);
            CHECK(rc == WM_OK && got == want, "%s: array len %s = %" PRIu64 " (rc %d), want %" PRIu64,
                  path, key, got, rc, want);
            free(key);
        } else if (strcmp(kind, "AS") == 0) {
            char *key = next_str(f, NULL);
            uint64_t i = next_u64(f);
            size_t n;
            char *want = next_str(f, &n);
            const char *p = NULL;
            uint64_t len = 0;
            rc = wm_meta_array_str(w, key, i, &p, &len);
            CHECK(rc == WM_OK && len == n && memcmp(p, want, n) == 0 && p[n] == 0,
                  "%s: %s[%" PRIu64 "] (rc %d: %s)", path, key, i, rc, err());
            free(key);
            free(want);
        } else {
            fseek(f, here, SEEK_SET);
            break;
        }
    }
    CHECK(index == count, "%s: %" PRIu64 " tensor records for %" PRIu64 " tensors", path, index, count);
    wm_free(w);
}

/* The error paths: each returns its code and says why. */
static void check_errors(const char *good, const char *misaligned) {
    wm_weights *w = NULL;
    wm_tensor t;
    uint64_t u = 0;
    double d = 0;
    const char *p = NULL;

    CHECK(wm_load(NULL, NULL, &w) == WM_ERR_BAD_ARGUMENT && w == NULL, "NULL path");
    CHECK(strstr(err(), "path is NULL") != NULL, "message: %s", err());
    CHECK(wm_load(good, NULL, NULL) == WM_ERR_BAD_ARGUMENT, "NULL out");
    CHECK(wm_load("/nonexistent/model.gguf", NULL, &w) == WM_ERR_IO && w == NULL, "missing file");
    CHECK(strstr(err(), "/nonexistent/model.gguf") != NULL, "message names the file: %s", err());
    CHECK(wm_load("/", NULL, &w) == WM_ERR_INVALID_FILE, "a directory: %s", err());
    wm_options o = wm_options_default();
    o.mode = 7;
    CHECK(wm_load(good, &o, &w) == WM_ERR_BAD_ARGUMENT, "mode 7");
    o = wm_options_default();
    o.alignment = 3;
    CHECK(wm_load(good, &o, &w) == WM_ERR_BAD_ARGUMENT, "alignment 3");
    o = wm_options_default();
    CHECK(o.huge_pages == 1 && o.reread_small_folios == 0, "huge-page defaults");
    o.huge_pages = 2;
    CHECK(wm_load(good, &o, &w) == WM_ERR_BAD_ARGUMENT, "huge_pages 2");

    /* Owned buffers in base pages, the re-read asked for, and the figure. */
    o = wm_options_default();
    o.mode = WM_MODE_STREAM;
    o.huge_pages = 0;
    o.reread_small_folios = 1;
    CHECK(wm_load(good, &o, &w) == WM_OK, "load without huge pages: %s", err());
    if (w) {
        wm_huge_page_bytes h;
        CHECK(wm_huge_pages(w, &h) == WM_OK, "wm_huge_pages: %s", err());
        CHECK(h.mapped_bytes == 0 && h.owned_bytes > 0, "streamed: owned bytes only");
        CHECK(h.owned_huge == 0 || h.owned_huge == WM_UNKNOWN, "no huge pages when off");
        CHECK(wm_huge_pages(w, NULL) == WM_ERR_BAD_ARGUMENT, "NULL figures");
        wm_free(w);
        w = NULL;
    }

    CHECK(wm_mode_used(NULL) == -1, "wm_mode_used(NULL)");
    CHECK(wm_fallback_reason(NULL) == NULL, "wm_fallback_reason(NULL)");
    CHECK(wm_tensor_count(NULL) == 0, "wm_tensor_count(NULL)");
    CHECK(wm_tensor_at(NULL, 0, &t) == WM_ERR_BAD_ARGUMENT, "wm_tensor_at(NULL)");
    wm_free(NULL);

    CHECK(wm_load(good, NULL, &w) == WM_OK, "load %s: %s", good, err());
    if (w) {
        uint64_t n = wm_tensor_count(w);
        CHECK(wm_tensor_at(w, n, &t) == WM_ERR_BAD_ARGUMENT, "index n");
        CHECK(strstr(err(), "out of range") != NULL, "message: %s", err());
        CHECK(wm_tensor_at(w, 0, NULL) == WM_ERR_BAD_ARGUMENT, "NULL out");
        CHECK(wm_tensor_by_name(w, "no.such.tensor", &t) == WM_ERR_NOT_FOUND, "missing tensor");
        CHECK(strstr(err(), "no.such.tensor") != NULL, "message: %s", err());
        CHECK(wm_tensor_by_name(w, NULL, &t) == WM_ERR_BAD_ARGUMENT, "NULL name");
        CHECK(wm_meta_u64(w, "no.such.key", &u) == WM_ERR_NOT_FOUND, "missing key");
        CHECK(wm_meta_u64(w, "general.name", &u) == WM_ERR_WRONG_TYPE, "string as u64");
        CHECK(strstr(err(), "general.name") != NULL, "message: %s", err());
        CHECK(wm_meta_f64(w, "general.name", &d) == WM_ERR_WRONG_TYPE, "string as f64");
        CHECK(wm_meta_str(w, "llama.block_count", &p, &u) == WM_ERR_WRONG_TYPE, "u32 as string");
        CHECK(wm_meta_array_len(w, "general.name", &u) == WM_ERR_WRONG_TYPE, "string as array");
        CHECK(wm_meta_array_str(w, "tokenizer.ggml.tokens", UINT64_MAX, &p, &u) == WM_ERR_BAD_ARGUMENT,
              "array index out of range");
        CHECK(wm_meta_array_str(w, "tokenizer.ggml.scores", 0, &p, &u) == WM_ERR_WRONG_TYPE,
              "f32 array as strings");
        CHECK(wm_meta_u64(w, "general.name", NULL) == WM_ERR_BAD_ARGUMENT, "NULL out");
        wm_free(w);
        w = NULL;
    }

    /* Misaligned: hybrid maps what it can; all-or-nothing falls back and
     * says why; without fallback it fails. */
    CHECK(wm_load(misaligned, NULL, &w) == WM_OK, "hybrid load: %s", err());
    if (w) {
        int mapped = 0, copied = 0, m = -1;
        for (uint64_t i = 0; i < wm_tensor_count(w); i++) {
            CHECK(wm_tensor_is_mapped(w, i, &m) == WM_OK, "wm_tensor_is_mapped");
            if (m) mapped++; else copied++;
        }
        CHECK(wm_mode_used(w) == WM_MODE_MMAP && copied > 0 && mapped > 0,
              "hybrid: %d mapped, %d copied", mapped, copied);
        wm_free(w);
        w = NULL;
    }
    o = wm_options_default();
    o.mode = WM_MODE_MMAP_ALL;
    CHECK(wm_load(misaligned, &o, &w) == WM_OK, "fallback load: %s", err());
    if (w) {
        const char *why = wm_fallback_reason(w);
        CHECK(wm_mode_used(w) == WM_MODE_STREAM, "fell back to stream");
        CHECK(why && strncmp(why, "misaligned: ", 12) == 0 && strstr(why, "not aligned to 32"),
              "fallback reason: %s", why ? why : "(NULL)");
        wm_free(w);
        w = NULL;
    }
    o.fallback = 0;
    CHECK(wm_load(misaligned, &o, &w) == WM_ERR_MMAP && w == NULL, "no fallback");
    CHECK(strstr(err(), "not aligned to 32") != NULL, "message: %s", err());
}

/* The transform cache's test transform: every F32 tensor, negated; the
 * rest left out. `user` counts the calls and may make apply fail. */
struct negate {
    int selects, applies, fail_with;
};

static int negate_select(void *user, const wm_tensor *src, int32_t *ggml_type, int64_t *ne) {
    struct negate *n = user;
    n->selects++;
    (void)ne;
    return src->ggml_type == 0 && *ggml_type == 0;
}

static int negate_apply(void *user, const wm_tensor *src, void *dst, size_t dst_size) {
    struct negate *n = user;
    n->applies++;
    if (n->fail_with) return n->fail_with;
    if (dst_size != src->nbytes) return -1;
    const float *in = src->data;
    float *out = dst;
    for (size_t i = 0; i < dst_size / sizeof(float); i++) out[i] = -in[i];
    return 0;
}

/* Every tensor of `cached` is the transform of `source`'s, done here in
 * memory; `cached` holds exactly the tensors select kept. */
static void check_cached_bytes(const wm_weights *cached, const wm_weights *source, wm_transform *t,
                               const char *label) {
    uint64_t kept = 0;
    for (uint64_t i = 0; i < wm_tensor_count(source); i++) {
        wm_tensor s, c;
        int32_t type;
        int64_t ne[4];
        if (wm_tensor_at(source, i, &s) != WM_OK) { CHECK(0, "%s: source tensor %" PRIu64, label, i); return; }
        type = s.ggml_type;
        memcpy(ne, s.ne, sizeof ne);
        struct negate scratch = {0, 0, 0};
        if (!t->select(&scratch, &s, &type, ne)) {
            CHECK(wm_tensor_by_name(cached, s.name, &c) == WM_ERR_NOT_FOUND, "%s: %s left out", label, s.name);
            continue;
        }
        kept++;
        int rc = wm_tensor_by_name(cached, s.name, &c);
        CHECK(rc == WM_OK, "%s: %s: %s", label, s.name, err());
        if (rc != WM_OK) continue;
        void *want = malloc(s.nbytes ? s.nbytes : 1);
        if (!want) abort();
        CHECK(t->apply(&scratch, &s, want, s.nbytes) == 0, "%s: in-memory apply of %s", label, s.name);
        CHECK(c.ggml_type == type && memcmp(c.ne, ne, sizeof ne) == 0 && c.nbytes == s.nbytes,
              "%s: %s has the type and shape select chose", label, s.name);
        CHECK(memcmp(c.data, want, s.nbytes) == 0, "%s: %s is not the transform's bytes", label, s.name);
        free(want);
    }
    CHECK(kept > 0 && wm_tensor_count(cached) == kept, "%s: %" PRIu64 " tensors, %" PRIu64 " kept", label,
          wm_tensor_count(cached), kept);
}

/* wm_cache_load with a C transform: a fill, then a hit that calls nothing,
 * both holding the transform's bytes; a failing callback; bad arguments. */
static void check_cache(const char *good, const char *dir, int cached) {
    wm_weights *source = NULL, *w = NULL;
    if (wm_load(good, NULL, &source) != WM_OK) { CHECK(0, "load %s: %s", good, err()); return; }
    struct negate n = {0, 0, 0};
    wm_transform t = {"negate-f32", 1, "capi_test", negate_select, negate_apply, &n};
    wm_cache_report r;

    int rc = wm_cache_load(dir, good, &t, NULL, &w, &r);
    CHECK(rc == WM_OK && w != NULL, "fill: %d %s", rc, err());
    if (rc == WM_OK) {
        uint64_t n_tensors = wm_tensor_count(source);
        CHECK(n.selects == (int)n_tensors && n.applies > 0, "fill: %d selects, %d applies", n.selects, n.applies);
        if (cached)
            CHECK(r.outcome == WM_CACHE_FILLED && r.entry && strncmp(r.entry, dir, strlen(dir)) == 0 && !r.reason,
                  "fill: outcome %u: %s", r.outcome, r.message);
        else
            CHECK(r.outcome == WM_CACHE_FILLED || (r.outcome == WM_CACHE_IN_MEMORY && r.reason),
                  "fill: outcome %u: %s", r.outcome, r.message);
        check_cached_bytes(w, source, &t, "fill");
        wm_free(w);
        w = NULL;
    }
    int applies = n.applies;
    rc = wm_cache_load(dir, good, &t, NULL, &w, &r);
    CHECK(rc == WM_OK, "hit: %d %s", rc, err());
    if (rc == WM_OK) {
        if (cached)
            CHECK(r.outcome == WM_CACHE_HIT && n.applies == applies && strstr(r.message, "mapped"),
                  "hit: outcome %u, %d applies: %s", r.outcome, n.applies - applies, r.message);
        check_cached_bytes(w, source, &t, "hit");
        wm_free(w);
        w = NULL;
    }

    /* A failing callback fails the load; another version stores nothing. */
    struct negate failing = {0, 0, 5};
    wm_transform bad = {"negate-f32", 2, NULL, negate_select, negate_apply, &failing};
    CHECK(wm_cache_load(dir, good, &bad, NULL, &w, NULL) == WM_ERR_TRANSFORM && w == NULL, "failing apply");
    CHECK(strstr(err(), "returned 5") && strstr(err(), "negate-f32"), "message: %s", err());
    bad.user = &n;
    CHECK(wm_cache_load(dir, good, &bad, NULL, &w, &r) == WM_OK, "version 2: %s", err());
    if (w) {
        CHECK(!cached || r.outcome == WM_CACHE_FILLED, "version 2 after a failure fills: %s", r.message);
        wm_free(w);
        w = NULL;
    }

    CHECK(wm_cache_load(dir, good, NULL, NULL, &w, NULL) == WM_ERR_BAD_ARGUMENT && w == NULL, "NULL transform");
    CHECK(wm_cache_load(dir, NULL, &t, NULL, &w, NULL) == WM_ERR_BAD_ARGUMENT, "NULL source");
    CHECK(wm_cache_load(dir, good, &t, NULL, NULL, NULL) == WM_ERR_BAD_ARGUMENT, "NULL out");
    bad.apply = NULL;
    CHECK(wm_cache_load(dir, good, &bad, NULL, &w, NULL) == WM_ERR_BAD_ARGUMENT, "NULL apply");
    CHECK(strstr(err(), "apply") != NULL, "message: %s", err());
    CHECK(wm_cache_load(dir, "/nonexistent/model.gguf", &t, NULL, &w, NULL) == WM_ERR_IO, "missing source");
    wm_free(source);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s EXPECT_FILE\n", argv[0]);
        return 2;
    }
    /* Binary: on Windows, ftell in text mode misplaces LF-only lines. */
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    CHECK(wm_last_error() == NULL, "no error before any call");
    char *first = NULL, *misaligned = NULL, *cache_dir = NULL;
    int files = 0, cached = 0;
    for (;;) {
        const char *kind = next(f);
        if (strcmp(kind, "END") == 0) break;
        if (strcmp(kind, "MISALIGNED") == 0) {
            misaligned = next_str(f, NULL);
            continue;
        }
        if (strcmp(kind, "CACHE") == 0) {
            cache_dir = next_str(f, NULL);
            cached = (int)next_u64(f);
            continue;
        }
        if (strcmp(kind, "FILE") != 0) {
            fprintf(stderr, "unexpected record %s\n", kind);
            return 2;
        }
        char *path = next_str(f, NULL);
        long start = ftell(f);
        check_file(path, WM_MODE_MMAP, f, start);
        check_file(path, WM_MODE_STREAM, f, start);
        files++;
        if (!first) first = path; else free(path);
    }
    fclose(f);
    if (first && misaligned) check_errors(first, misaligned);
    else CHECK(0, "the expectations name no fixture or no misaligned file");
    if (first && cache_dir) check_cache(first, cache_dir, cached);
    else CHECK(0, "the expectations name no cache directory");
    printf("C ABI: %d files checked in both modes (weightmap %s)\n", files, wm_version());
    printf("%d passed, %d failed\n", passed, failed);
    free(first);
    free(misaligned);
    free(cache_dir);
    return failed ? 1 : 0;
}
