# Sourced by benches/decode/run.sh and llama_bench.sh: the pinned llama.cpp
# sources both build from, the vendor/llama.cpp of the PyPI sdist
# llama-cpp-python (checked by sha256, as capi/tests/ggml/run.sh checks it),
# downloaded at run time and never committed.
#
# Needs ROOT and WORK set; sets LLAMA (the llama.cpp tree) and fetches it
# into WORK unless it is already there.

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA="$WORK/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"

fetch_llama_sources() {
  local sdir="${WM_GGML_WORK:-$ROOT/target/ggml-proof}/sdist" # shared with the ggml proof
  local sdist="$sdir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  [ -f "$LLAMA/CMakeLists.txt" ] && return 0
  mkdir -p "$sdir" "$WORK"
  if [ ! -f "$sdist" ] || ! echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --quiet - 2>/dev/null; then
    rm -f "$sdist"
    # --no-binary for this package only: the same sdist, without building
    # pip's build requirements (cmake, ninja) from source for its metadata.
    echo "+ pip download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (sdist)" >&2
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$sdir"
  fi
  echo "$LLAMA_CPP_PYTHON_SHA256  $sdist" | sha256sum -c --quiet - \
    || { echo "$sdist does not have the pinned sha256" >&2; return 1; }
  echo "+ tar -xzf $sdist (vendor/llama.cpp)" >&2
  tar -xzf "$sdist" -C "$WORK" "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
}
