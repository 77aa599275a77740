/* The ggml proof's programs' checks: CHECK(cond, fmt, ...) counts a pass,
 * or a failure and says where and why; each program prints the counts. */
#ifndef WEIGHTMAP_PROOF_CHECK_H
#define WEIGHTMAP_PROOF_CHECK_H

#include <stdio.h>

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

#endif /* WEIGHTMAP_PROOF_CHECK_H */
