#!/usr/bin/env bash
# llama.cpp with one flag, tested: weightmap.patch (beside this script)
# applied to the pinned llama.cpp (the sources of the ggml proof,
# capi/tests/ggml/llama-sources.sh), llama-cli built with -DLLAMA_WEIGHTMAP=ON
# against weightmap's installed CMake package, then run on a small
# SYNTHETIC mixture-of-experts file (benches/residency/moe_gguf.py mini,
# which llama.cpp loads as OLMoE) with seeded sampling:
#   - where the model fits, `--weightmap` says it has nothing to do, and the
#     tokens are those without the flag;
#   - over a budget given by $WEIGHTMAP_BUDGET, planned stream_experts and
#     stream_all, the hook announces (every expert choice read, no error) and
#     the tokens are those without the flag and without repacking
#     (--no-repack), which the flag turns off over the budget: repacked
#     weights compute with other kernels, whose sums round differently;
#   - with $WEIGHTMAP_PREDICT=1, the hook's predictor guesses every layer,
#     and the tokens are the same.
#
# Needs cmake, a C/C++ compiler, cargo, patch (installed with apt-get when
# missing, as root), and gguf-py with numpy in
# $WM_PYTHON (default target/python-venv/bin/python, which .ci/python.sh
# makes). Work goes to $WM_LLAMA_WORK (default target/llama-cli).
#
# Exit status: 0 when every check passed, or (with a "SKIPPED" line) when
# the pinned sources cannot be downloaded; nonzero otherwise.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="${WM_LLAMA_WORK:-$ROOT/target/llama-cli}"
PY="${WM_PYTHON:-$ROOT/target/python-venv/bin/python}"
# shellcheck source=capi/tests/ggml/llama-sources.sh
. "$ROOT/capi/tests/ggml/llama-sources.sh"
mkdir -p "$WORK"

if ! command -v patch >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "== llama-cli --weightmap: apt-get install patch"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patch >/dev/null
fi
for tool in cmake cc c++ cargo patch; do
  command -v "$tool" >/dev/null || { echo "llama-cli --weightmap: $tool is missing" >&2; exit 1; }
done

rc=0
fetch_llama_sources || rc=$?
if [ "$rc" -eq 2 ]; then
  echo "SKIPPED: llama-cli --weightmap: the pinned llama.cpp sources cannot be had (above)"
  exit 0
fi
[ "$rc" -eq 0 ] || exit "$rc"

echo "== llama-cli --weightmap: apply capi/llama.cpp/weightmap.patch"
if patch -d "$LLAMA" -p1 --dry-run --reverse --force -s <"$ROOT/capi/llama.cpp/weightmap.patch" >/dev/null 2>&1; then
  echo "(applied already)"
else
  patch -d "$LLAMA" -p1 --forward <"$ROOT/capi/llama.cpp/weightmap.patch"
fi

echo "== llama-cli --weightmap: weightmap's C package, then llama-cli against it"
start=$SECONDS
# cargo's work goes to the repository's target directory, which the earlier
# steps of CI filled.
cmake -S "$ROOT/capi" -B "$WORK/weightmap" -DWEIGHTMAP_CARGO_TARGET_DIR="$ROOT/target" >"$WORK/weightmap.log" 2>&1 &&
  cmake --build "$WORK/weightmap" >>"$WORK/weightmap.log" 2>&1 &&
  cmake --install "$WORK/weightmap" --prefix "$WORK/prefix" >>"$WORK/weightmap.log" 2>&1 ||
  { tail -40 "$WORK/weightmap.log" >&2; exit 1; }
cmake -S "$LLAMA" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_WEIGHTMAP=ON \
  -DCMAKE_PREFIX_PATH="$WORK/prefix" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$WORK/cmake.log" 2>&1 ||
  { cat "$WORK/cmake.log" >&2; exit 1; }
cmake --build "$WORK/build" -j"$(nproc)" --target llama-cli >"$WORK/build.log" 2>&1 ||
  { tail -50 "$WORK/build.log" >&2; exit 1; }
echo "llama-cli built in $((SECONDS - start))s"

model="$WORK/mini.gguf"
if [ ! -f "$model" ]; then
  "$PY" "$ROOT/benches/residency/moe_gguf.py" "$model" mini --vocab "$LLAMA/models/ggml-vocab-gpt-neox.gguf"
fi

# generate NAME [ARGS...]: the tokens llama-cli generates (its answer's
# line) into $WORK/NAME.out, its log into $WORK/NAME.log.
generate() {
  local name=$1
  shift
  "$WORK/build/bin/llama-cli" -m "$model" -p "The weights of a model larger than memory" -n 24 \
    --seed 46 -st -c 256 -t 2 --simple-io -v "$@" >"$WORK/$name.stdout" 2>"$WORK/$name.log" ||
    { tail -20 "$WORK/$name.log" >&2; echo "llama-cli $* failed" >&2; exit 1; }
  # The lines between the prompt's echo ("> PROMPT") and the speeds
  # ("[ Prompt: ...") are the answer.
  sed -n '/^> /,/^\[ Prompt:/{/^> /d;/^\[ Prompt:/d;p}' "$WORK/$name.stdout" >"$WORK/$name.out"
  [ -s "$WORK/$name.out" ] || { cat "$WORK/$name.stdout" >&2; echo "no answer from llama-cli $*" >&2; exit 1; }
}
fail() {
  echo "llama-cli --weightmap: $*" >&2
  exit 1
}
same() { # same A B: the two runs generated the same tokens
  cmp -s "$WORK/$1.out" "$WORK/$2.out" ||
    fail "$1 and $2 generated different tokens: '$(cat "$WORK/$1.out")' against '$(cat "$WORK/$2.out")'"
}

echo "== llama-cli --weightmap: where the model fits"
generate plain
generate fits --weightmap
same plain fits
grep -q "weightmap .*: fits in the budget of .*: nothing to do" "$WORK/fits.log" ||
  fail "--weightmap did not say the model fits: $(grep -i weightmap "$WORK/fits.log")"
echo "ok: the same tokens ($(cat "$WORK/plain.out"))"

echo "== llama-cli --weightmap: over the budget"
generate unpacked --no-repack
# 79 MiB less weightmap's 64 MiB reserve for the runtime holds the 14.5 MiB
# read whole, not the 13.5 MiB of experts; 4 MiB holds neither.
for case in stream_experts:79M stream_all:4M; do
  plan=${case%%:*}
  WEIGHTMAP_BUDGET=${case#*:} generate "$plan" --weightmap
  same unpacked "$plan"
  grep -q "weightmap .*: $plan, budget .* (WEIGHTMAP_BUDGET); weights not repacked" "$WORK/$plan.log" ||
    fail "--weightmap did not plan $plan: $(grep -i weightmap "$WORK/$plan.log")"
  line=$(grep "weightmap: [0-9]* announcements" "$WORK/$plan.log") || fail "no announcer counts in $WORK/$plan.log"
  [[ "$line" =~ weightmap:\ ([0-9]+)\ announcements,\ 0\ expert\ choices\ unread,\ last\ error\ 0\; ]] &&
    [ "${BASH_REMATCH[1]}" -gt 0 ] || fail "$plan: $line"
  # llama.cpp computes on its own mapping, which the hook has weightmap
  # follow (its advice and releases reach those pages too).
  [[ "$line" =~ \ ([0-9]+)\ weights\ followed\ in\ llama.cpp\'s\ mapping,\ 0\ refused ]] &&
    [ "${BASH_REMATCH[1]}" -gt 0 ] || fail "$plan: llama.cpp's mapping not followed: $line"
  echo "ok: $plan: the same tokens as --no-repack without the flag; ${line#*weightmap: }"
done

# The predictor, turned on from the environment: every layer guessed, and
# the tokens unchanged.
WEIGHTMAP_PREDICT=1 WEIGHTMAP_BUDGET=79M generate predicted --weightmap
same unpacked predicted
line=$(grep "weightmap: [0-9]* announcements" "$WORK/predicted.log") || fail "no announcer counts in $WORK/predicted.log"
[[ "$line" =~ ,\ last\ error\ 0\;\ ([0-9]+)\ layers\ guessed,\ ([0-9]+)\ of\ ([0-9]+)\ chosen ]] &&
  [ "${BASH_REMATCH[1]}" -gt 0 ] && [ "${BASH_REMATCH[3]}" -gt 0 ] || fail "WEIGHTMAP_PREDICT=1: $line"
echo "ok: WEIGHTMAP_PREDICT=1: the same tokens; ${line#*weightmap: }"
