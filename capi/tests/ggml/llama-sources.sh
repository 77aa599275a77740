# shellcheck shell=bash
# Sourced by the ggml proof (capi/tests/ggml/run.sh) and the decode
# benchmarks (benches/decode/run.sh, llama_bench.sh): the pinned llama.cpp
# sources they build from, the vendor/llama.cpp of the PyPI sdist
# llama-cpp-python, checked by sha256, downloaded at run time and never
# committed.
#
# Needs ROOT and WORK set; sets LLAMA (the llama.cpp tree, under WORK).
# fetch_llama_sources fetches it unless it is already there, and returns 2
# when the sdist cannot be had (no pip, or PyPI unreachable), 1 when it does
# not have the pinned sha256. ggml_build builds a program against its ggml
# and weightmap's C ABI, the one recipe of the proof and the benchmark.

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

# ggml_build CMAKE_DIR BUILD_DIR TARGET JOBS [NICENESS]: weightmap's C ABI
# (cargo, release, into $ROOT/target), then TARGET from CMAKE_DIR, whose
# CMakeLists.txt includes capi/tests/ggml/ggml.cmake, with ggml from LLAMA
# (fetch_llama_sources first), in BUILD_DIR with JOBS jobs, every command
# under `nice -n NICENESS` (default 0). The logs are BUILD_DIR.cmake.log and
# BUILD_DIR.build.log; on a failure their end goes to stderr.
ggml_build() {
  local cmake_dir=$1 build=$2 target=$3 jobs=$4 niceness=${5:-0}
  local -a nice=(nice -n "$niceness")
  echo "+ cargo build --release --locked -p weightmap-capi" >&2
  (cd "$ROOT" && CARGO_TARGET_DIR="$ROOT/target" "${nice[@]}" cargo build --release --locked -p weightmap-capi) \
    || return 1
  echo "+ cmake -S $cmake_dir -B $build (ggml of llama-cpp-python $LLAMA_CPP_PYTHON_VERSION)" >&2
  "${nice[@]}" cmake -S "$cmake_dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_SRC="$LLAMA/ggml" \
    -DWEIGHTMAP_LIB="$ROOT/target/release/libweightmap_capi.a" >"$build.cmake.log" 2>&1 \
    || { cat "$build.cmake.log" >&2; return 1; }
  echo "+ cmake --build $build -j$jobs --target $target" >&2
  "${nice[@]}" cmake --build "$build" -j"$jobs" --target "$target" >"$build.build.log" 2>&1 \
    || { tail -50 "$build.build.log" >&2; return 1; }
}
