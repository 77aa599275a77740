// fault_rate: how fast, and at what CPU cost, one range of a file comes into
// the page cache cold, by each way weightmap could read it (issue 55's
// dense pipeline). Linux only; built and run by hand, never as a test:
//
//   cc -O2 -pthread benches/residency/fault_rate.c -o target/fault_rate
//   target/fault_rate FILE OFFSET LENGTH WAY [READERS]
//
// The file is dropped from the page cache first (POSIX_FADV_DONTNEED), then
// mapped read-only and read by WAY:
//   touch       the compute's way: one thread touches a byte a page, in
//               order, with the mapping's default read-ahead;
//   touch-seq   the same under MADV_SEQUENTIAL;
//   touch-huge  the same under MADV_SEQUENTIAL and MADV_HUGEPAGE;
//   readers     touch-huge, with READERS threads populating 4 MiB pieces
//               (MADV_POPULATE_READ) up to 32 MiB ahead of the toucher:
//               several reads in flight;
//   willneed    MADV_WILLNEED in 1 MiB pieces, then wait until every page
//               is resident (mincore);
//   populate    MADV_POPULATE_READ in 1 MiB pieces on the default mapping;
//   populate-huge  the same under MADV_HUGEPAGE.
// Prints the wall time, the rate, and the CPU time of this process
// (user + system) while it issued the reads.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

static const size_t PIECE = 4 << 20, AHEAD = 32 << 20;
static char *base;
static size_t first, len;
static atomic_size_t next_piece, touched;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6;
}

// A page-aligned [at, at + n) of the range, clipped to it.
static void advise_piece(size_t at, size_t n, int advice) {
    size_t start = (size_t)(base + first + at) & ~(size_t)4095, end = (size_t)(base + first + at + n);
    madvise((void *)start, end - start, advice);
}

static void *reader(void *unused) {
    (void)unused;
    for (;;) {
        size_t at = atomic_fetch_add(&next_piece, 1) * PIECE;
        if (at >= len) return NULL;
        while (at > atomic_load(&touched) + AHEAD) usleep(100);
        advise_piece(at, len - at < PIECE ? len - at : PIECE, MADV_POPULATE_READ);
    }
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s FILE OFFSET LENGTH WAY [READERS]\n", argv[0]);
        return 2;
    }
    const char *way = argv[4];
    int readers = argc > 5 ? atoi(argv[5]) : 0;
    first = strtoull(argv[2], NULL, 10);
    len = strtoull(argv[3], NULL, 10);
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) return perror("open"), 1;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    base = mmap(NULL, first + len, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return perror("mmap"), 1;
    int touch = strncmp(way, "touch", 5) == 0 || strcmp(way, "readers") == 0;
    if (strcmp(way, "touch-seq") == 0 || strcmp(way, "touch-huge") == 0 || strcmp(way, "readers") == 0)
        advise_piece(0, len, MADV_SEQUENTIAL);
    if (strstr(way, "huge") || strcmp(way, "readers") == 0) advise_piece(0, len, MADV_HUGEPAGE);
    if (strcmp(way, "readers") != 0) readers = 0;
    pthread_t threads[16];
    readers = readers > 16 ? 16 : readers;
    const double t0 = now(), c0 = cpu();
    for (int i = 0; i < readers; i++) pthread_create(&threads[i], NULL, reader, NULL);
    volatile unsigned long sum = 0;
    if (touch) {
        for (size_t at = 0; at < len; at += 4096) {
            sum += (unsigned char)base[first + at];
            if ((at & (PIECE - 1)) == 0) atomic_store(&touched, at);
        }
    } else {
        int advice = strcmp(way, "willneed") == 0 ? MADV_WILLNEED : MADV_POPULATE_READ;
        for (size_t at = 0; at < len; at += 1 << 20) advise_piece(at, len - at < (1 << 20) ? len - at : 1 << 20, advice);
    }
    const double issued = now() - t0, spent = cpu() - c0;
    for (int i = 0; i < readers; i++) pthread_join(threads[i], NULL);
    unsigned char in;
    for (size_t at = 0; at < len; at += 4096)
        while (mincore((void *)((size_t)(base + first + at) & ~(size_t)4095), 1, &in) == 0 && !(in & 1)) usleep(100);
    const double t = now() - t0;
    printf("%-13s readers %d: %7.1f ms, %.2f GB/s; issued in %.1f ms, CPU %.1f ms\n", way, readers, t * 1e3,
           len / t / 1e9, issued * 1e3, spent * 1e3);
    return 0;
}
