#!/usr/bin/env bash
# CI step: the ggml proof (capi/tests/ggml/run.sh), that ggml computes the
# same results on tensors placed by weightmap's C ABI as on its own, and on
# tensors a transform cache entry holds (wm_cache_load, filled then hit) as
# on the same transform done in memory, with RssAnon ≈ 0 for the entry. Installs
# cmake and a C/C++ compiler with apt-get when they are missing. Exits 0
# with a SKIPPED line only when the pinned llama.cpp sources cannot be
# downloaded; nonzero on a mismatch.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cmake >/dev/null || ! command -v c++ >/dev/null || ! command -v cc >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "== ggml proof: apt-get install cmake build-essential"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake build-essential >/dev/null
  else
    echo "ggml proof: cmake or a C/C++ compiler is missing and cannot be installed" >&2
    exit 1
  fi
fi

bash capi/tests/ggml/run.sh
