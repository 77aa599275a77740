/*
 * The floor under the stream path's warm load: what only the system calls
 * it makes cost, with nothing else around them. Maps an anonymous buffer
 * of the file's size, then THREADS threads each take an equal half (third,
 * ...) of the file and, piece by piece, prefault the piece
 * (MADV_POPULATE_WRITE) and pread into it, as src/loader/read.rs does.
 * Prints the wall time of four rounds, each on a fresh buffer.
 *
 *   cc -O2 -pthread benches/stream_floor.c -o /tmp/stream_floor
 *   /tmp/stream_floor 2 512 target/weightmap-cache/default-*.gguf
 *
 * Arguments: threads, piece size in KiB, file (read from offset 0; run it
 * warm, after `cat FILE > /dev/null`). Linux 5.14+ (MADV_POPULATE_WRITE).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

struct part {
    int fd;
    char *dst;
    size_t len, piece;
    off_t off;
    double ms;
};

static void *run(void *arg) {
    struct part *p = arg;
    double t = now_ms();
    for (size_t o = 0; o < p->len; o += p->piece) {
        size_t n = p->len - o < p->piece ? p->len - o : p->piece;
        madvise(p->dst + o, n, MADV_POPULATE_WRITE);
        if (pread(p->fd, p->dst + o, n, p->off + (off_t)o) != (ssize_t)n) {
            perror("pread");
            exit(1);
        }
    }
    p->ms = now_ms() - t;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s THREADS PIECE_KIB FILE\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    size_t piece = (size_t)atol(argv[2]) << 10;
    int fd = open(argv[3], O_RDONLY);
    struct stat st;
    if (threads < 1 || threads > 64 || piece == 0 || fd < 0 || fstat(fd, &st) != 0) {
        perror(argv[3]);
        return 2;
    }
    /* Whole pieces per thread; the tail of the file past them is skipped. */
    size_t per = (size_t)st.st_size / threads / piece * piece;
    for (int round = 0; round < 4; round++) {
        char *buf = mmap(NULL, per * threads, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (buf == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        pthread_t tid[64];
        struct part parts[64];
        double t0 = now_ms();
        for (int i = 0; i < threads; i++) {
            parts[i] = (struct part){fd, buf + i * per, per, piece, (off_t)(i * per), 0};
            pthread_create(&tid[i], NULL, run, &parts[i]);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(tid[i], NULL);
        printf("%d threads, %zu KiB pieces, %.1f MiB: %.1f ms (threads:", threads,
               piece >> 10, per * threads / 1048576.0, now_ms() - t0);
        for (int i = 0; i < threads; i++)
            printf(" %.1f", parts[i].ms);
        printf(")\n");
        munmap(buf, per * threads);
    }
    return 0;
}
