// A C++17 consumer of weightmap (capi/tests/cmake/): the same line as
// consumer.c, from C++ as a runtime would write it, the weights owned by a
// std::unique_ptr and each tensor seen as a std::string_view and a span of
// bytes. .ci/cmake.sh compares the line with what it computes from the file.
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "weightmap.h"

namespace {

struct Free {
    void operator()(wm_weights *w) const { wm_free(w); }
};
using Weights = std::unique_ptr<wm_weights, Free>;

void check(int rc) {
    if (rc != WM_OK) throw std::runtime_error(wm_last_error());
}

Weights load(const char *path) {
    wm_options o = wm_options_default();
    wm_weights *w = nullptr;
    check(wm_load(path, &o, &w));
    return Weights(w);
}

std::optional<uint64_t> meta_u64(const Weights &w, const char *key) {
    uint64_t v = 0;
    if (wm_meta_u64(w.get(), key, &v) != WM_OK) return std::nullopt;
    return v;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s MODEL\n", argv[0]);
        return 2;
    }
    try {
        const Weights w = load(argv[1]);
        const auto layers = meta_u64(w, "llama.block_count");
        if (!layers) throw std::runtime_error(wm_last_error());
        const uint64_t n = wm_tensor_count(w.get());
        uint64_t bytes = 0, h = 14695981039346656037ull;
        for (uint64_t i = 0; i < n; i++) {
            wm_tensor t{};
            check(wm_tensor_at(w.get(), i, &t));
            const std::string_view name{t.name};
            if (name.empty()) throw std::runtime_error("a tensor without a name");
            const auto *p = static_cast<const unsigned char *>(t.data);
            for (const auto *q = p; q != p + t.nbytes; ++q) h = (h ^ *q) * 1099511628211ull;
            bytes += t.nbytes;
        }
        std::printf("tensors %" PRIu64 " bytes %" PRIu64 " fnv1a %016" PRIx64 " layers %" PRIu64
                    " mode %d version %s\n",
                    n, bytes, h, *layers, wm_mode_used(w.get()), wm_version());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}
