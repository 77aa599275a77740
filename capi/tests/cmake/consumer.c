/* A C consumer of weightmap as a C runtime takes it (capi/tests/cmake/):
 * load a model, read a metadata value, read every byte of every tensor
 * through the pointers weightmap hands out. One line out, which
 * .ci/cmake.sh compares with what it computes from the file itself:
 *
 *     tensors N bytes B fnv1a H layers L mode M version V
 *
 * H is FNV-1a (64-bit) over the tensors' bytes in file order. */
#include <inttypes.h>
#include <stdio.h>

#include "weightmap.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL\n", argv[0]);
        return 2;
    }
    wm_options o = wm_options_default();
    wm_weights *w;
    if (wm_load(argv[1], &o, &w) != WM_OK) {
        fprintf(stderr, "%s\n", wm_last_error());
        return 1;
    }
    uint64_t layers;
    if (wm_meta_u64(w, "llama.block_count", &layers) != WM_OK) {
        fprintf(stderr, "%s\n", wm_last_error());
        wm_free(w);
        return 1;
    }
    uint64_t n = wm_tensor_count(w), bytes = 0, h = 14695981039346656037ull;
    for (uint64_t i = 0; i < n; i++) {
        wm_tensor t;
        if (wm_tensor_at(w, i, &t) != WM_OK) {
            fprintf(stderr, "%s\n", wm_last_error());
            wm_free(w);
            return 1;
        }
        const unsigned char *p = (const unsigned char *)t.data;
        for (uint64_t j = 0; j < t.nbytes; j++)
            h = (h ^ p[j]) * 1099511628211ull;
        bytes += t.nbytes;
    }
    printf("tensors %" PRIu64 " bytes %" PRIu64 " fnv1a %016" PRIx64 " layers %" PRIu64
           " mode %d version %s\n",
           n, bytes, h, layers, wm_mode_used(w), wm_version());
    wm_free(w);
    return 0;
}
