#!/usr/bin/env bash
# The transform cache on a real model: examples/dequant_cache.rs (every
# quantized tensor dequantized to F32, then every F32 byte read once), each
# run in a fresh process, in three ways side by side per round:
#   memory  no cache: the transform runs into anonymous memory every time
#   fill    an empty cache: the transform runs into a new entry
#   hit     the filled cache: the entry is mapped
# warm (the model and the entry in the page cache) and cold (both evicted
# with posix_fadvise(DONTNEED) first). Prints each
# run's JSON line and, per case, the medians of ready time, read time and
# RssAnon growth.
#
#   bash benches/transform_cache.sh MODEL [ROUNDS]
set -euo pipefail
MODEL=${1:?usage: transform_cache.sh MODEL [ROUNDS]}
ROUNDS=${2:-5}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
cargo build --release --locked -q --example dequant_cache -p weightmap
EX=target/release/examples/dequant_cache
CACHE=$(mktemp -d)
trap 'rm -rf "$CACHE"' EXIT
OUT=$(mktemp)

evict() {
  python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$1"
}
entry() { ls "$CACHE"/*.gguf 2>/dev/null | head -1; }

for r in $(seq "$ROUNDS"); do
  for temp in warm cold; do
    # memory
    [ "$temp" = cold ] && evict "$MODEL"
    echo "$temp memory $("$EX" "$MODEL" --no-cache)" >>"$OUT"
    # fill: an empty cache
    rm -rf "${CACHE:?}"/*
    [ "$temp" = cold ] && evict "$MODEL"
    echo "$temp fill $("$EX" "$MODEL" --cache "$CACHE")" >>"$OUT"
    # hit
    if [ "$temp" = cold ]; then evict "$MODEL"; evict "$(entry)"; fi
    echo "$temp hit $("$EX" "$MODEL" --cache "$CACHE")" >>"$OUT"
  done
done
cat "$OUT"
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    temp, case, js = line.split(" ", 2)
    rows.setdefault((temp, case), []).append(json.loads(js))
print(f"{'case':<12} {'outcome':<10} {'ready ms':>9} {'read ms':>9} {'RssAnon growth MiB':>19} {'F32 MiB':>8}")
for (temp, case), rs in rows.items():
    med = lambda k: statistics.median(r[k] for r in rs)
    print(f"{temp + ' ' + case:<12} {rs[0]['outcome']:<10} {med('ready_ms'):>9.1f} {med('read_ms'):>9.1f}"
          f" {med('rss_anon_growth_kib') / 1024:>19.1f} {rs[0]['f32_bytes'] / 2**20:>8.1f}")
PY
rm -f "$OUT"
