#!/usr/bin/env bash
# The ggml proof: build upstream ggml from the llama.cpp sources
# vendored in the PyPI sdist of llama-cpp-python (pinned below, checked by
# sha256), and run proof.c: ggml computes mul_mat and get_rows on tensors
# placed by weightmap's C ABI (mmap, stream and hybrid loads) and on tensors
# from ggml's own gguf loader, and the results must be bit-identical.
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
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SDIST="$WORK/sdist/llama_cpp_python-$VERSION.tar.gz"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp/ggml"
mkdir -p "$WORK"

for tool in cmake cc c++ cargo; do
  command -v "$tool" >/dev/null || { echo "ggml proof: $tool is missing" >&2; exit 1; }
done

if [ ! -f "$SRC/CMakeLists.txt" ]; then
  if [ ! -f "$SDIST" ] || ! echo "$SHA256  $SDIST" | sha256sum -c --quiet - 2>/dev/null; then
    rm -f "$SDIST"
    PIP=(python3 -m pip)
    if ! "${PIP[@]}" --version >/dev/null 2>&1; then
      echo "SKIPPED: ggml proof: no pip to download llama-cpp-python==$VERSION"
      exit 0
    fi
    echo "== ggml proof: pip download llama-cpp-python==$VERSION (sdist)"
    # --no-binary for this package only: the same sdist, without building
    # pip's build requirements (cmake, ninja) from source for its metadata.
    if ! "${PIP[@]}" download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -d "$WORK/sdist"; then
      echo "SKIPPED: ggml proof: could not download llama-cpp-python==$VERSION from PyPI"
      exit 0
    fi
  fi
  echo "$SHA256  $SDIST" | sha256sum -c --quiet - \
    || { echo "ggml proof: $SDIST does not have the pinned sha256" >&2; exit 1; }
  tar -xzf "$SDIST" -C "$WORK" "llama_cpp_python-$VERSION/vendor/llama.cpp/ggml"
fi

echo "== ggml proof: weightmap's C ABI (release) and the model"
cd "$ROOT"
cargo build --release --locked -p weightmap-capi
# The generator runs in the dev profile, whose dependencies `cargo test` built.
cargo run --locked -q -p weightmap-capi --example gen_proof_model -- "$WORK/proof.gguf"

echo "== ggml proof: build ggml (llama.cpp vendored by llama-cpp-python $VERSION)"
start=$(date +%s)
cmake -S "$ROOT/capi/tests/ggml" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_SRC="$SRC" -DWEIGHTMAP_LIB="$ROOT/target/release/libweightmap_capi.a" >"$WORK/cmake.log" 2>&1 \
  || { cat "$WORK/cmake.log" >&2; exit 1; }
cmake --build "$WORK/build" -j"$(nproc)" --target ggml_proof >"$WORK/build.log" 2>&1 \
  || { tail -50 "$WORK/build.log" >&2; exit 1; }
echo "ggml proof: ggml and the proof built in $(( $(date +%s) - start ))s"

echo "== ggml proof: run"
"$WORK/build/ggml_proof" "$WORK/proof.gguf"
