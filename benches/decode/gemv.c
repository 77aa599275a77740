/* Decode-rate benchmark (issue 34): ggml mul_mat of one f32 vector against
 * every 2-D weight of a GGUF -- one decoded token's reads -- on 2 threads,
 * for weights placed in different kinds of memory, side by side in one
 * process.
 *
 * Usage: gemv [--rounds N] [--passes N] [--json] [--workdir DIR] FILE.gguf
 *
 * The cases (each a full set of the model's 2-D weights):
 *   ggml-heap     gguf_init_from_file(no_alloc = false): ggml's own loader,
 *                 the weights read into one heap buffer of ggml's
 *   heap-4k       the file read() into anonymous memory advised
 *                 MADV_NOHUGEPAGE (4 KiB pages: the baseline of the ratios)
 *   heap-thp      the file read() into 2 MiB-aligned anonymous memory
 *                 advised MADV_HUGEPAGE (transparent huge pages)
 *   wm-stream     wm_load(WM_MODE_STREAM) + wm_ggml_place: weightmap's
 *                 owned copies
 *   wm-mmap-cold  wm_load(WM_MODE_MMAP) + wm_ggml_place of copy A, evicted
 *                 (posix_fadvise DONTNEED) just before: the page cache is
 *                 filled by weightmap's load (and the first pass's faults)
 *   wm-mmap-warm  a second wm_load(WM_MODE_MMAP) of copy A, whose page
 *                 cache wm-mmap-cold filled: weightmap's warm load
 *   map-cat       copy B evicted, `cat B > /dev/null` (read()), then a
 *                 plain mmap(PROT_READ, MAP_PRIVATE) of B, the tensors
 *                 pointing into it (ggml_backend_cpu_buffer_from_ptr)
 *   wm-mmap-cat   wm_load(WM_MODE_MMAP) of copy B, over the cache `cat` filled
 *   map-fault     copy C evicted, a plain mapping of C, its page cache
 *                 filled by the faults of its own first pass
 *
 * Why copies, and the order. A mapping's pages come from the file's page
 * cache, whose folio sizes are fixed by whoever read the file into it and
 * stay so while it is cached. So the mapped cases that need a different
 * cache state each get their own copy of the model (A, B, C, written with
 * write() into --workdir (run.sh: target/decode-bench/copies; without it
 * the model's directory) -- a disk filesystem like the model's,
 * since folio sizes depend on the filesystem), and the owned cases read the
 * original FILE (its cache state does not matter to them). The steps:
 *   1. copies A, B, C written, fdatasync'd and evicted;
 *   2. ggml-heap, heap-4k, heap-thp, wm-stream loaded from FILE;
 *   3. A evicted, checked not resident (mincore), wm-mmap-cold loaded and
 *      its first pass run at once (as a runtime decodes right after load);
 *   4. wm-mmap-warm loaded (A is now cached);
 *   5. B evicted, checked, `cat B`, map-cat mapped; then wm-mmap-cat;
 *   6. C evicted, checked, map-fault mapped, its first pass faults it in;
 *   every case's first pass (untimed, "first ms") runs right after its load.
 *   7. page state per case: /proc/self/smaps of the VMAs holding the case's
 *      weights (FilePmdMapped for mapped cases, AnonHugePages for owned);
 *   8. every case's weight bytes and first-pass results compared bit for bit
 *      with ggml-heap's (a mismatch fails the run, exit 1);
 *   9. rounds: a round is --passes sweeps, each sweep one token of every
 *      case, the order of the cases rotating from sweep to sweep and round
 *      to round (interference on 2 shared cores comes in bursts, so no case
 *      runs long alone); a case's figure is the median over rounds of its
 *      median time per token in a round; "paired" is the median over rounds
 *      of heap-4k's time / the case's in the same round;
 *      also its fastest token of all rounds ("best"), since interference
 *      from other processes (2 shared cores) only adds time, and the CPU
 *      time other processes and the hypervisor took during the rounds.
 *   10. page state again (reported in --json; the table marks a change).
 * The copies are left in place for the caller (run.sh reads their folio
 * sizes, then deletes them); their paths are printed.
 *
 * Rates are relative to heap-4k (time of heap-4k / time of the case), and
 * to ggml-heap. Run by hand, never as a test. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "weightmap.h"
#include "weightmap-ggml.h"

#define N_THREADS 2
#define HUGE_SZ (2u << 20)

static void die(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "gemv: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    exit(2);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void loadavg(char *out, size_t n) {
    FILE *f = fopen("/proc/loadavg", "r");
    out[0] = 0;
    if (f) {
        if (!fgets(out, (int)n, f)) out[0] = 0;
        fclose(f);
    }
    char *sp = out;
    for (int i = 0; i < 3 && sp; i++) sp = strchr(sp + 1, ' '); /* keep the three averages */
    if (sp) *sp = 0;
}

/* CPU seconds the whole machine spent busy (and of it, stolen by the
 * hypervisor), from /proc/stat; and this process's own. */
static void cpu_busy(double *busy, double *steal) {
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    *busy = *steal = 0;
    if (!f) return;
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) == 8) {
        double hz = (double)sysconf(_SC_CLK_TCK);
        *busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz;
        *steal = (double)v[7] / hz;
    }
    fclose(f);
}

static double own_cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n);

/* The median over rounds of base's time / the case's, round by round. */
static double paired(const double *base, const double *t, int n) {
    double *q = malloc(sizeof(double) * n);
    for (int i = 0; i < n; i++) q[i] = base[i] / t[i];
    double m = median(q, n);
    free(q);
    return m;
}

static double median(const double *v, int n) {
    double *s = malloc(sizeof(double) * n);
    memcpy(s, v, sizeof(double) * n);
    qsort(s, n, sizeof(double), cmp_double);
    double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    free(s);
    return m;
}

/* ---- the file and its page cache ---- */

static size_t file_size(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) die("stat %s: %s", path, strerror(errno));
    return (size_t)st.st_size;
}

static void evict(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("open %s: %s", path, strerror(errno));
    fdatasync(fd);
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (rc != 0) die("posix_fadvise %s: %s", path, strerror(rc));
    close(fd);
}

/* Bytes of the file the page cache holds (mincore of a fresh mapping). */
static size_t resident(const char *path) {
    size_t n = file_size(path), page = (size_t)sysconf(_SC_PAGESIZE), pages = (n + page - 1) / page, r = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("open %s: %s", path, strerror(errno));
    void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) die("mmap %s: %s", path, strerror(errno));
    unsigned char *vec = malloc(pages);
    if (mincore(p, n, vec) != 0) die("mincore %s: %s", path, strerror(errno));
    for (size_t i = 0; i < pages; i++) r += (vec[i] & 1) ? page : 0;
    free(vec);
    munmap(p, n);
    return r;
}

static void copy_file(const char *src, const char *dst) {
    int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0) die("open %s: %s", src, strerror(errno));
    if (out < 0) die("open %s: %s", dst, strerror(errno));
    size_t cap = 4u << 20;
    char *buf = malloc(cap);
    for (;;) {
        ssize_t k = read(in, buf, cap);
        if (k < 0) die("read %s: %s", src, strerror(errno));
        if (k == 0) break;
        for (ssize_t off = 0; off < k;) {
            ssize_t w = write(out, buf + off, (size_t)(k - off));
            if (w < 0) die("write %s: %s", dst, strerror(errno));
            off += w;
        }
    }
    free(buf);
    if (fsync(out) != 0) die("fsync %s: %s", dst, strerror(errno));
    close(in);
    close(out);
}

static void read_into(const char *path, char *dst, size_t n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("open %s: %s", path, strerror(errno));
    for (size_t off = 0; off < n;) {
        ssize_t k = read(fd, dst + off, n - off);
        if (k <= 0) die("read %s: %s", path, k < 0 ? strerror(errno) : "short file");
        off += (size_t)k;
    }
    close(fd);
}

/* ---- /proc/self/smaps ---- */

struct vma {
    uintptr_t lo, hi;
    long rss, anon_huge, file_pmd; /* KiB */
};

static int read_smaps(struct vma **out) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    int n = 0, cap = 0;
    struct vma *v = NULL;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        long kb;
        char key[64];
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 && strchr(line, ' ') &&
            strchr(line, '-') < strchr(line, ' ')) {
            if (n == cap) v = realloc(v, sizeof *v * (cap = cap ? cap * 2 : 256));
            v[n++] = (struct vma){lo, hi, 0, 0, 0};
        } else if (n && sscanf(line, "%63[^:]: %ld kB", key, &kb) == 2) {
            if (!strcmp(key, "Rss")) v[n - 1].rss = kb;
            else if (!strcmp(key, "AnonHugePages")) v[n - 1].anon_huge = kb;
            else if (!strcmp(key, "FilePmdMapped")) v[n - 1].file_pmd = kb;
        }
    }
    fclose(f);
    *out = v;
    return n;
}

struct pstate {
    long vma_kib, rss_kib, anon_huge_kib, file_pmd_kib;
    int n_vmas;
};

/* The smaps figures of the VMAs that hold any of the n tensors' bytes. */
static struct pstate page_state(struct ggml_tensor **w, int n) {
    struct vma *v = NULL;
    int nv = read_smaps(&v);
    char *hit = calloc(nv ? nv : 1, 1);
    for (int i = 0; i < n; i++) {
        uintptr_t lo = (uintptr_t)w[i]->data, hi = lo + ggml_nbytes(w[i]);
        for (int j = 0; j < nv; j++)
            if (v[j].lo < hi && lo < v[j].hi) hit[j] = 1;
    }
    struct pstate s = {0};
    for (int j = 0; j < nv; j++)
        if (hit[j]) {
            s.n_vmas++;
            s.vma_kib += (long)((v[j].hi - v[j].lo) >> 10);
            s.rss_kib += v[j].rss;
            s.anon_huge_kib += v[j].anon_huge;
            s.file_pmd_kib += v[j].file_pmd;
        }
    free(hit);
    free(v);
    return s;
}

/* ---- the model's 2-D weights ---- */

static struct gguf_context *meta;
static struct ggml_context *meta_ctx;
static int nw;               /* 2-D weights */
static const char **wname;   /* their names */
static size_t *woff;         /* their offsets in the file */
static size_t wbytes;        /* their bytes */
static size_t fsize;

static void read_meta(const char *path) {
    struct gguf_init_params p = {.no_alloc = true, .ctx = &meta_ctx};
    meta = gguf_init_from_file(path, p);
    if (!meta) die("gguf_init_from_file(%s, no_alloc) failed%s", path, "");
    int64_t n = gguf_get_n_tensors(meta);
    wname = calloc((size_t)n + 1, sizeof *wname);
    woff = calloc((size_t)n + 1, sizeof *woff);
    for (int64_t i = 0; i < n; i++) {
        const char *name = gguf_get_tensor_name(meta, i);
        struct ggml_tensor *t = ggml_get_tensor(meta_ctx, name);
        if (ggml_n_dims(t) != 2) continue;
        wname[nw] = name;
        woff[nw] = gguf_get_data_offset(meta) + gguf_get_tensor_offset(meta, i);
        wbytes += ggml_nbytes(t);
        nw++;
    }
    if (nw == 0) die("%s has no 2-D tensor%s", path, "");
}

/* ---- a case ---- */

struct kase {
    const char *name, *what;
    int mapped;                 /* the weights are a file mapping */
    const char *file;           /* the file behind a mapped case */
    struct ggml_tensor **w;     /* the 2-D weights, in wname's order */
    /* the graph */
    struct ggml_context *gctx;
    struct ggml_cgraph *gf;
    struct ggml_tensor **out;
    struct ggml_cplan plan;
    void **first_out;           /* first pass's results */
    double first_ms;
    double *t;                  /* per round: ms per token */
    double best;                /* the fastest token of all rounds */
    struct pstate before, after;
    long resident_before_load;  /* bytes of the file cached before the load, -1 n/a */
    int weights_equal, results_equal;
    /* what to free */
    wm_weights *wm;
    struct wm_ggml g;
    struct ggml_context *tctx;
    struct gguf_context *gg;
    ggml_backend_buffer_t buf;
    void *mem;
    size_t mem_len;
};

static struct ggml_threadpool *pool;

static void build_graph(struct kase *k) {
    size_t mem = ggml_graph_overhead_custom(2 * (size_t)nw + 16, false) + (size_t)(2 * nw + 4) * ggml_tensor_overhead();
    for (int i = 0; i < nw; i++) mem += (size_t)(k->w[i]->ne[0] + k->w[i]->ne[1]) * sizeof(float) + 64;
    struct ggml_init_params p = {.mem_size = mem, .mem_buffer = NULL, .no_alloc = false};
    k->gctx = ggml_init(p);
    if (!k->gctx) die("ggml_init for %s%s", k->name, "");
    k->gf = ggml_new_graph_custom(k->gctx, 2 * (size_t)nw + 16, false);
    k->out = calloc((size_t)nw, sizeof *k->out);
    for (int i = 0; i < nw; i++) {
        struct ggml_tensor *x = ggml_new_tensor_1d(k->gctx, GGML_TYPE_F32, k->w[i]->ne[0]);
        float *xd = (float *)x->data;
        for (int64_t j = 0; j < x->ne[0]; j++) xd[j] = (float)((j * 37 % 101) - 50) / 25.0f;
        k->out[i] = ggml_mul_mat(k->gctx, k->w[i], x);
        ggml_build_forward_expand(k->gf, k->out[i]);
    }
    k->plan = ggml_graph_plan(k->gf, N_THREADS, pool);
    k->plan.work_data = k->plan.work_size ? malloc(k->plan.work_size) : NULL;
}

static double token(struct kase *k) {
    double t0 = now_ms();
    enum ggml_status st = ggml_graph_compute(k->gf, &k->plan);
    double t1 = now_ms();
    if (st != GGML_STATUS_SUCCESS) die("graph compute failed for %s%s", k->name, "");
    return t1 - t0;
}

/* Build the graph and run the first (untimed-for-the-rate) pass right
 * after the load, keeping its results. */
static void first_pass(struct kase *k) {
    build_graph(k);
    k->first_ms = token(k);
    k->first_out = calloc((size_t)nw, sizeof *k->first_out);
    for (int i = 0; i < nw; i++) {
        size_t b = ggml_nbytes(k->out[i]);
        k->first_out[i] = malloc(b);
        memcpy(k->first_out[i], k->out[i]->data, b);
    }
}

/* Tensors over `base`, a copy or mapping of the whole file. */
static void place_over(struct kase *k, char *base) {
    struct ggml_init_params p = {.mem_size = ((size_t)nw + 1) * ggml_tensor_overhead(), .mem_buffer = NULL, .no_alloc = true};
    k->tctx = ggml_init(p);
    k->buf = ggml_backend_cpu_buffer_from_ptr(base, fsize);
    if (!k->buf) die("ggml_backend_cpu_buffer_from_ptr for %s%s", k->name, "");
    k->w = calloc((size_t)nw, sizeof *k->w);
    for (int i = 0; i < nw; i++) {
        struct ggml_tensor *t = ggml_dup_tensor(k->tctx, ggml_get_tensor(meta_ctx, wname[i]));
        ggml_set_name(t, wname[i]);
        if (ggml_backend_tensor_alloc(k->buf, t, base + woff[i]) != GGML_STATUS_SUCCESS)
            die("ggml_backend_tensor_alloc %s for %s", wname[i], k->name);
        k->w[i] = t;
    }
}

static void load_ggml_heap(struct kase *k, const char *path) {
    struct gguf_init_params p = {.no_alloc = false, .ctx = &k->tctx};
    k->gg = gguf_init_from_file(path, p);
    if (!k->gg) die("gguf_init_from_file(%s) failed%s", path, "");
    k->w = calloc((size_t)nw, sizeof *k->w);
    for (int i = 0; i < nw; i++) k->w[i] = ggml_get_tensor(k->tctx, wname[i]);
}

static void load_anon(struct kase *k, const char *path, int huge) {
    size_t len = (fsize + HUGE_SZ - 1) / HUGE_SZ * HUGE_SZ;
    size_t map_len = huge ? len + HUGE_SZ : len;
    char *m = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap anonymous for %s: %s", k->name, strerror(errno));
    char *base = m;
    if (huge) { /* 2 MiB-aligned, the slack unmapped */
        base = (char *)(((uintptr_t)m + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
        if (base > m) munmap(m, (size_t)(base - m));
        size_t tail = (size_t)(m + map_len - (base + len));
        if (tail) munmap(base + len, tail);
    }
    if (madvise(base, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0)
        die("madvise for %s: %s", k->name, strerror(errno));
    read_into(path, base, fsize);
    if (mprotect(base, len, PROT_READ) != 0) die("mprotect for %s: %s", k->name, strerror(errno));
    k->mem = base;
    k->mem_len = len;
    place_over(k, base);
}

static void load_map(struct kase *k, const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("open %s: %s", path, strerror(errno));
    char *m = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) die("mmap %s: %s", path, strerror(errno));
    k->mem = m;
    k->mem_len = fsize;
    place_over(k, m);
}

static void load_wm(struct kase *k, const char *path, uint32_t mode) {
    wm_options o = wm_options_default();
    o.mode = mode;
    if (wm_load(path, &o, &k->wm) != WM_OK) die("wm_load %s: %s", path, wm_last_error());
    int rc = wm_ggml_place(k->wm, NULL, &k->g);
    if (rc != WM_OK) die("wm_ggml_place %s: %s", path, wm_last_error());
    k->w = calloc((size_t)nw, sizeof *k->w);
    for (int i = 0; i < nw; i++) {
        k->w[i] = ggml_get_tensor(k->g.ctx, wname[i]);
        if (!k->w[i]) die("weightmap placed no %s in %s", wname[i], path);
    }
}

static long evict_checked(const char *path) {
    evict(path);
    return (long)resident(path);
}

static void print_json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
        else putchar(*s);
    }
    putchar('"');
}

int main(int argc, char **argv) {
    int rounds = 7, passes = 3, json = 0;
    const char *path = NULL, *workdir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--passes") && i + 1 < argc) passes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--workdir") && i + 1 < argc) workdir = argv[++i];
        else if (!strcmp(argv[i], "--json")) json = 1;
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else {
            fprintf(stderr, "usage: gemv [--rounds N] [--passes N] [--json] [--workdir DIR] FILE.gguf\n");
            return 2;
        }
    }
    if (!path || rounds < 1 || passes < 1 || passes > 64) {
        fprintf(stderr, "usage: gemv [--rounds N] [--passes N] [--json] [--workdir DIR] FILE.gguf\n");
        return 2;
    }
    FILE *log = json ? stderr : stdout; /* progress lines */
    fsize = file_size(path);
    read_meta(path);

    char dirbuf[4096];
    if (!workdir) {
        snprintf(dirbuf, sizeof dirbuf, "%s", path);
        char *slash = strrchr(dirbuf, '/');
        if (slash) *slash = 0; else snprintf(dirbuf, sizeof dirbuf, ".");
        workdir = dirbuf;
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char copy[3][4200];
    const char *tag[3] = {"wm", "cat", "fault"};
    for (int c = 0; c < 3; c++) {
        snprintf(copy[c], sizeof copy[c], "%s/%s.decode-%s.%d", workdir, base, tag[c], (int)getpid());
        fprintf(log, "copy %s -> %s\n", path, copy[c]);
        fflush(log);
        copy_file(path, copy[c]);
        evict(copy[c]);
    }

    ggml_cpu_init();
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(N_THREADS);
    pool = ggml_threadpool_new(&tpp);
    if (!pool) die("ggml_threadpool_new failed%s%s", "", "");

    enum { GGML_HEAP, HEAP_4K, HEAP_THP, WM_STREAM, WM_COLD, WM_WARM, MAP_CAT, WM_CAT, MAP_FAULT, NK };
    struct kase ks[NK] = {
        [GGML_HEAP] = {"ggml-heap", "gguf_init_from_file(no_alloc=false), heap", 0},
        [HEAP_4K] = {"heap-4k", "read() into anon memory, MADV_NOHUGEPAGE", 0},
        [HEAP_THP] = {"heap-thp", "read() into 2 MiB-aligned anon memory, MADV_HUGEPAGE", 0},
        [WM_STREAM] = {"wm-stream", "wm_load stream + wm_ggml_place (owned copies)", 0},
        [WM_COLD] = {"wm-mmap-cold", "evict A, wm_load mmap A + wm_ggml_place", 1, copy[0]},
        [WM_WARM] = {"wm-mmap-warm", "wm_load mmap A again (cache left by wm-mmap-cold)", 1, copy[0]},
        [MAP_CAT] = {"map-cat", "evict B, cat B > /dev/null, mmap(PROT_READ, MAP_PRIVATE) B", 1, copy[1]},
        [WM_CAT] = {"wm-mmap-cat", "wm_load mmap B (cache left by cat)", 1, copy[1]},
        [MAP_FAULT] = {"map-fault", "evict C, mmap C, cache filled by its first pass's faults", 1, copy[2]},
    };
    for (int c = 0; c < NK; c++) ks[c].resident_before_load = -1;

#define STEP(...) do { fprintf(log, __VA_ARGS__); fflush(log); } while (0)
    STEP("load ggml-heap: gguf_init_from_file(%s, no_alloc=false)\n", path);
    load_ggml_heap(&ks[GGML_HEAP], path);
    first_pass(&ks[GGML_HEAP]);
    STEP("load heap-4k: read(%s) into MADV_NOHUGEPAGE memory\n", path);
    load_anon(&ks[HEAP_4K], path, 0);
    first_pass(&ks[HEAP_4K]);
    STEP("load heap-thp: read(%s) into MADV_HUGEPAGE memory\n", path);
    load_anon(&ks[HEAP_THP], path, 1);
    first_pass(&ks[HEAP_THP]);
    STEP("load wm-stream: wm_load(%s, WM_MODE_STREAM)\n", path);
    load_wm(&ks[WM_STREAM], path, WM_MODE_STREAM);
    first_pass(&ks[WM_STREAM]);

    ks[WM_COLD].resident_before_load = evict_checked(copy[0]);
    STEP("load wm-mmap-cold: evict, wm_load(%s, WM_MODE_MMAP) (%ld bytes cached before)\n", copy[0], ks[WM_COLD].resident_before_load);
    load_wm(&ks[WM_COLD], copy[0], WM_MODE_MMAP);
    first_pass(&ks[WM_COLD]);
    ks[WM_WARM].resident_before_load = (long)resident(copy[0]);
    STEP("load wm-mmap-warm: wm_load(%s, WM_MODE_MMAP) (%ld bytes cached before)\n", copy[0], ks[WM_WARM].resident_before_load);
    load_wm(&ks[WM_WARM], copy[0], WM_MODE_MMAP);
    first_pass(&ks[WM_WARM]);

    long b_cold = evict_checked(copy[1]);
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "cat '%s' > /dev/null", copy[1]);
    STEP("fill map-cat: evict (%ld bytes cached after), %s\n", b_cold, cmd);
    if (system(cmd) != 0) die("%s failed%s", cmd, "");
    ks[MAP_CAT].resident_before_load = (long)resident(copy[1]);
    STEP("load map-cat: mmap(%s) (%ld bytes cached before)\n", copy[1], ks[MAP_CAT].resident_before_load);
    load_map(&ks[MAP_CAT], copy[1]);
    first_pass(&ks[MAP_CAT]);
    ks[WM_CAT].resident_before_load = (long)resident(copy[1]);
    STEP("load wm-mmap-cat: wm_load(%s, WM_MODE_MMAP)\n", copy[1]);
    load_wm(&ks[WM_CAT], copy[1], WM_MODE_MMAP);
    first_pass(&ks[WM_CAT]);

    ks[MAP_FAULT].resident_before_load = evict_checked(copy[2]);
    STEP("load map-fault: evict, mmap(%s) (%ld bytes cached before)\n", copy[2], ks[MAP_FAULT].resident_before_load);
    load_map(&ks[MAP_FAULT], copy[2]);
    first_pass(&ks[MAP_FAULT]);

    /* Page state, and bytes and results against ggml's own load. */
    int mismatches = 0;
    struct kase *ref = &ks[GGML_HEAP];
    for (int c = 0; c < NK; c++) {
        struct kase *k = &ks[c];
        k->before = page_state(k->w, nw);
        k->weights_equal = k->results_equal = 1;
        for (int i = 0; i < nw; i++) {
            size_t b = ggml_nbytes(k->w[i]);
            if (b != ggml_nbytes(ref->w[i]) || memcmp(k->w[i]->data, ref->w[i]->data, b) != 0) k->weights_equal = 0;
            size_t ob = ggml_nbytes(k->out[i]);
            if (ob != ggml_nbytes(ref->out[i]) || memcmp(k->first_out[i], ref->first_out[i], ob) != 0) k->results_equal = 0;
        }
        if (!k->weights_equal || !k->results_equal) {
            mismatches++;
            fprintf(stderr, "gemv: %s differs from ggml-heap (weights %s, results %s)\n", k->name,
                    k->weights_equal ? "equal" : "DIFFER", k->results_equal ? "equal" : "DIFFER");
        }
    }

    STEP("%d rounds x %d tokens per case, %d cases rotating, %d threads, %d 2-D weights (%.1f MiB)\n",
         rounds, passes, NK, N_THREADS, nw, wbytes / 1048576.0);
    for (int c = 0; c < NK; c++) ks[c].t = calloc((size_t)rounds, sizeof(double));
    char load0[128], load1[128];
    loadavg(load0, sizeof load0);
    double busy0, steal0, busy1, steal1, own0 = own_cpu(), wall0 = now_ms();
    cpu_busy(&busy0, &steal0);
    for (int r = 0; r < rounds; r++) {
        static double pt[NK][64];
        for (int p = 0; p < passes; p++)
            for (int j = 0; j < NK; j++) {
                int c = (j + r + p) % NK;
                struct kase *k = &ks[c];
                pt[c][p] = token(k);
                if (k->best == 0 || pt[c][p] < k->best) k->best = pt[c][p];
            }
        for (int c = 0; c < NK; c++) ks[c].t[r] = median(pt[c], passes);
        if (!json) {
            fprintf(log, "  round %d:", r);
            for (int c = 0; c < NK; c++) fprintf(log, " %s %.2f", ks[c].name, ks[c].t[r]);
            fprintf(log, " (ms/token)\n");
            fflush(log);
        }
    }
    for (int c = 0; c < NK; c++) ks[c].after = page_state(ks[c].w, nw);
    loadavg(load1, sizeof load1);
    cpu_busy(&busy1, &steal1);
    double wall = (now_ms() - wall0) / 1e3, own = own_cpu() - own0;
    double others = busy1 - busy0 - own, steal = steal1 - steal0;

    double base4k = median(ks[HEAP_4K].t, rounds), baseg = median(ks[GGML_HEAP].t, rounds);
    if (json) {
        printf("{\"file\": ");
        print_json_string(path);
        printf(", \"file_bytes\": %zu, \"weights_2d\": %d, \"weights_2d_bytes\": %zu, \"threads\": %d, \"rounds\": %d, \"passes\": %d, \"baseline\": \"heap-4k\", \"loadavg_before_rounds\": \"%s\", \"loadavg_after_rounds\": \"%s\", \"rounds_wall_s\": %.2f, \"rounds_own_cpu_s\": %.2f, \"rounds_others_cpu_s\": %.2f, \"rounds_steal_s\": %.2f, \"copies\": [",
               fsize, nw, wbytes, N_THREADS, rounds, passes, load0, load1, wall, own, others, steal);
        for (int c = 0; c < 3; c++) { if (c) printf(", "); print_json_string(copy[c]); }
        printf("], \"cases\": [\n");
        for (int c = 0; c < NK; c++) {
            struct kase *k = &ks[c];
            double m = median(k->t, rounds);
            printf("  {\"name\": \"%s\", \"what\": ", k->name);
            print_json_string(k->what);
            printf(", \"mapped\": %s, \"file\": ", k->mapped ? "true" : "false");
            if (k->file) print_json_string(k->file); else printf("null");
            printf(", \"median_ms_per_token\": %.4f, \"gb_per_s\": %.3f, \"vs_heap_4k\": %.4f, \"vs_heap_4k_paired\": %.4f, \"vs_ggml_heap\": %.4f, \"best_ms_per_token\": %.4f, \"best_vs_heap_4k\": %.4f, \"first_pass_ms\": %.3f, \"ms_per_token_by_round\": [",
                   m, wbytes / (m * 1e6), base4k / m, paired(ks[HEAP_4K].t, k->t, rounds), baseg / m, k->best, ks[HEAP_4K].best / k->best, k->first_ms);
            for (int r = 0; r < rounds; r++) printf("%s%.4f", r ? ", " : "", k->t[r]);
            printf("], \"resident_before_load\": ");
            if (k->resident_before_load >= 0) printf("%ld", k->resident_before_load); else printf("null");
            struct pstate *s[2] = {&k->before, &k->after};
            const char *sn[2] = {"smaps_before_rounds", "smaps_after_rounds"};
            for (int q = 0; q < 2; q++)
                printf(", \"%s\": {\"vmas\": %d, \"vma_kib\": %ld, \"rss_kib\": %ld, \"anon_huge_pages_kib\": %ld, \"file_pmd_mapped_kib\": %ld}",
                       sn[q], s[q]->n_vmas, s[q]->vma_kib, s[q]->rss_kib, s[q]->anon_huge_kib, s[q]->file_pmd_kib);
            printf(", \"weights_identical\": %s, \"results_identical\": %s}%s\n", k->weights_equal ? "true" : "false",
                   k->results_equal ? "true" : "false", c + 1 < NK ? "," : "");
        }
        printf("]}\n");
    } else {
        printf("\n%s: %d 2-D weights, %.1f MiB; mul_mat of one f32 vector with each, %d threads;\n"
               "median over %d rounds of the median of %d tokens (interleaved); rate = heap-4k's (or ggml-heap's) time / the case's;\n"
               "load average (1, 5, 15 min) %s before the rounds, %s after; during the rounds\n"
               "(%.1f s) this process used %.1f s of CPU, other processes %.1f s, steal %.1f s\n\n",
               path, nw, wbytes / 1048576.0, N_THREADS, rounds, passes, load0, load1, wall, own, others, steal);
        printf("%-13s %9s %7s %8s %8s %8s %8s %8s %8s %8s %12s %9s %6s\n", "case", "ms/token", "GB/s", "vs 4k", "paired", "vs ggml",
               "best ms", "best 4k", "first ms", "RSS MiB", "huge MiB", "(of VMA)", "bytes");
        for (int c = 0; c < NK; c++) {
            struct kase *k = &ks[c];
            double m = median(k->t, rounds);
            long huge = k->mapped ? k->before.file_pmd_kib : k->before.anon_huge_kib;
            long huge2 = k->mapped ? k->after.file_pmd_kib : k->after.anon_huge_kib;
            char hs[64];
            snprintf(hs, sizeof hs, "%.1f %s%s", huge / 1024.0, k->mapped ? "PMD" : "AHP", huge2 != huge ? "*" : "");
            printf("%-13s %9.3f %7.2f %7.3fx %7.3fx %7.3fx %8.3f %7.3fx %8.2f %8.1f %12s %9.1f %6s\n", k->name, m, wbytes / (m * 1e6),
                   base4k / m, paired(ks[HEAP_4K].t, k->t, rounds), baseg / m, k->best, ks[HEAP_4K].best / k->best, k->first_ms, k->before.rss_kib / 1024.0, hs, k->before.vma_kib / 1024.0,
                   k->weights_equal && k->results_equal ? "same" : "DIFF");
        }
        printf("\nms/token, GB/s, vs 4k, vs ggml: from the median; paired: the median over rounds of\n"
               "heap-4k's time / the case's in the same round; best ms, best 4k: the fastest token of\n"
               "all rounds and heap-4k's fastest / the case's (interference only adds time)\n");
        printf("huge MiB: FilePmdMapped (PMD) of the mapping for mapped cases, AnonHugePages (AHP) for owned\n"
               "ones, summed over the VMAs holding the case's weights (/proc/self/smaps, after the first\n"
               "passes; * = changed by the end of the rounds). bytes: weights and first-pass results\n"
               "bit-identical to ggml-heap's. Cases:\n");
        for (int c = 0; c < NK; c++) printf("  %-13s %s\n", ks[c].name, ks[c].what);
        printf("copies (A, B, C): %s %s %s\n", copy[0], copy[1], copy[2]);
    }

    for (int c = 0; c < NK; c++) {
        struct kase *k = &ks[c];
        if (k->wm) { wm_ggml_free(&k->g); wm_free(k->wm); }
        if (k->buf) ggml_backend_buffer_free(k->buf);
        if (k->tctx) ggml_free(k->tctx);
        if (k->gg) gguf_free(k->gg);
        if (k->mem) munmap(k->mem, k->mem_len);
        ggml_free(k->gctx);
        free(k->plan.work_data);
    }
    ggml_threadpool_free(pool);
    return mismatches ? 1 : 0;
}
