# Sourced by the ggml proof (capi/tests/ggml/run.sh) and the decode
# benchmarks (benches/decode/run.sh, llama_bench.sh): the pinned llama.cpp
# sources they build from, the vendor/llama.cpp of the PyPI sdist
# llama-cpp-python, checked by sha256, downloaded at run time and never
# committed.
#
# Needs ROOT and WORK set; sets LLAMA (the llama.cpp tree, under WORK).
# fetch_llama_sources fetches it unless it is already there, and returns 2
# when the sdist cannot be had (no pip, or PyPI unreachable), 1 when it does
# not have the pinned sha256.

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA="$WORK/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"

fetch_llama_sources() {
  local sdir="${WM_GGML_WORK:-$ROOT/target/ggml-proof}/sdist" # one download for all
  local sdist="$sdir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  [ -f "$LLAMA/CMakeLists.txt" ] && return 0
  mkdir -p "$sdir" "$WORK"
  if [ ! -f "$sdist" ] || ! echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --quiet - 2>/dev/null; then
    rm -f "$sdist"
    python3 -m pip --version >/dev/null 2>&1 \
      || { echo "no pip to download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2; return 2; }
    # --no-binary for this package only: the same sdist, without building
    # pip's build requirements (cmake, ninja) from source for its metadata.
    echo "+ pip download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (sdist)" >&2
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$sdir" \
      || { echo "could not download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION from PyPI" >&2; return 2; }
  fi
  echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --quiet - \
    || { echo "$sdist does not have the pinned sha256" >&2; return 1; }
  echo "+ tar -xzf $sdist (vendor/llama.cpp)" >&2
  tar -xzf "$sdist" -C "$WORK" "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
}
