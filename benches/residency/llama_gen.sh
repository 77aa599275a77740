#!/usr/bin/env bash
# The proof in llama.cpp (issue 46): the pinned llama.cpp generates tokens on
# a model larger than memory, its own mmap against the same with weightmap's
# announcing hook (wm_ggml_announce as cb_eval), inside a memory cgroup of a
# fraction of the file (benches/residency/llama_proof.py).
#
#   sudo bash benches/residency/llama_gen.sh [MODEL...] [-- llama_proof.py options]
#
# With no MODEL: the SYNTHETIC OLMoE-1B-7B layout (moe_gguf.py, with the
# GPT-NeoX vocab file of the pinned llama.cpp, written to
# target/residency/olmoe.gguf unless an up-to-date one is there), and gemma-3-270m if
# WM_GEMMA names its GGUF. Builds llama_gen (llama.cpp from the same pinned
# sources as the ggml proof, capi/tests/ggml/llama-sources.sh, never
# committed; weightmap's C ABI in release) under target/llama-gen. Needs
# cmake, a C/C++ compiler, and gguf-py with numpy in target/python-venv
# (.ci/python.sh makes it). Run by hand, never as a test.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
# The sources where the decode benchmark keeps them (one tree for both).
WORK="$ROOT/target/decode-bench"
# shellcheck source=capi/tests/ggml/llama-sources.sh
. "$ROOT/capi/tests/ggml/llama-sources.sh"
WORK="$ROOT/target/llama-gen"
mkdir -p "$WORK"
models=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do models+=("$1"); shift; done
[ "${1:-}" = -- ] && shift

fetch_llama_sources
(cd "$ROOT" && cargo build --release --locked -q -p weightmap-capi)
if [ ! -x "$WORK/build/llama_gen" ] || [ "$ROOT/benches/residency/llama_gen/llama_gen.cpp" -nt "$WORK/build/llama_gen" ] ||
  [ "$ROOT/target/release/libweightmap_capi.a" -nt "$WORK/build/llama_gen" ]; then
  echo "+ build llama_gen (llama.cpp of llama-cpp-python $LLAMA_CPP_PYTHON_VERSION)" >&2
  cmake -S "$ROOT/benches/residency/llama_gen" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_SRC="$LLAMA" -DWEIGHTMAP_LIB="$ROOT/target/release/libweightmap_capi.a" >"$WORK/cmake.log" 2>&1 \
    || { cat "$WORK/cmake.log" >&2; exit 1; }
  nice -n 10 cmake --build "$WORK/build" -j2 --target llama_gen >"$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; exit 1; }
fi

if [ ${#models[@]} -eq 0 ]; then
  olmoe="$ROOT/target/residency/olmoe.gguf"
  # A file written before the files routed diversely (weightmap.synthetic
  # below 3, moe_gguf.py) is written again.
  stale() {
    "$ROOT/target/python-venv/bin/python" -c 'import sys, gguf
f = gguf.GGUFReader(sys.argv[1]).fields.get("weightmap.synthetic")
sys.exit(0 if f is None or f.contents() < 3 else 1)' "$1"
  }
  if [ ! -f "$olmoe" ] || stale "$olmoe"; then
    mkdir -p "$(dirname "$olmoe")"
    "$ROOT/target/python-venv/bin/python" "$ROOT/benches/residency/moe_gguf.py" "$olmoe" olmoe \
      --vocab "$LLAMA/models/ggml-vocab-gpt-neox.gguf"
  fi
  models+=("$olmoe")
  [ -n "${WM_GEMMA:-}" ] && models+=("$WM_GEMMA")
fi
for m in "${models[@]}"; do
  python3 "$ROOT/benches/residency/llama_proof.py" "$WORK/build/llama_gen" "$m" "$@"
done
