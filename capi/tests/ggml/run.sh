#!/usr/bin/env bash
# The ggml proof: build upstream ggml from the llama.cpp sources vendored in
# the PyPI sdist of llama-cpp-python (pinned in llama-sources.sh, checked by
# sha256), and run proof.c: ggml computes mul_mat and get_rows on tensors
# placed by weightmap's C ABI (mmap, stream and hybrid loads) and on tensors
# from ggml's own gguf loader, and the results must be bit-identical; then
# the transform cache (wm_cache_load): ggml's dequantization of a large
# model, filled into an empty cache and mapped from it, computes the same
# as the transform done in memory, and adds next to no anonymous memory.
# Then moe_hook.c: the announcing hook (wm_ggml_announce) on a small
# mixture-of-experts model, through ggml_backend_sched: the same output
# with it as without, and over the budget, exactly the experts the router
# chose announced.
#
# Needs cmake, a C and C++ compiler, pip and cargo (.ci/ggml-proof.sh
# installs the first two). Nothing of ggml is committed: the sdist is
# downloaded into $WM_GGML_WORK (default target/ggml-proof) and built there.
#
# Exit status: 0 when the proof passed, or (with a "SKIPPED" line) when the
# sdist cannot be downloaded; nonzero on a mismatch or a build failure.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
WORK="${WM_GGML_WORK:-$ROOT/target/ggml-proof}"
# shellcheck source=capi/tests/ggml/llama-sources.sh
. "$ROOT/capi/tests/ggml/llama-sources.sh"
VERSION=$LLAMA_CPP_PYTHON_VERSION
mkdir -p "$WORK"

for tool in cmake cc c++ cargo; do
  command -v "$tool" >/dev/null || { echo "ggml proof: $tool is missing" >&2; exit 1; }
done

rc=0
fetch_llama_sources || rc=$?
if [ "$rc" -eq 2 ]; then
  echo "SKIPPED: ggml proof: the pinned llama.cpp sources cannot be had (above)"
  exit 0
fi
[ "$rc" -eq 0 ] || exit "$rc"

echo "== ggml proof: the model"
cd "$ROOT"
# The generator runs in the dev profile, whose dependencies `cargo test` built.
cargo run --locked -q -p weightmap-capi --example gen_proof_model -- "$WORK/proof.gguf"
# 16384 rows: about 100 MiB of dequantized tensors, far above the noise of
# the process's own allocations in RssAnon.
cargo run --locked -q -p weightmap-capi --example gen_proof_model -- "$WORK/proof-large.gguf" 16384
cargo run --locked -q -p weightmap-capi --example gen_proof_model -- "$WORK/proof-moe.gguf" moe

echo "== ggml proof: build weightmap's C ABI and ggml (llama.cpp vendored by llama-cpp-python $VERSION)"
start=$(date +%s)
ggml_build "$ROOT/capi/tests/ggml" "$WORK/build" ggml_proof "$(nproc)"
ggml_build "$ROOT/capi/tests/ggml" "$WORK/build" ggml_moe_hook "$(nproc)"
echo "ggml proof: ggml and the proof built in $(( $(date +%s) - start ))s"

echo "== ggml proof: run"
rm -rf "$WORK/cache" # the first cached load must fill
"$WORK/build/ggml_proof" "$WORK/proof.gguf" "$WORK/proof-large.gguf" "$WORK/cache"

echo "== ggml proof: the announcing hook on a mixture-of-experts model"
"$WORK/build/ggml_moe_hook" "$WORK/proof-moe.gguf"
