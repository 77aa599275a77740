#!/usr/bin/env bash
# A transform-cache hit of two builds side by side: examples/dequant_cache
# of each build (AFTER and BEFORE: paths to its binary), each with a cache
# of its own filled once, then hits alternating run by run, warm and then
# cold (the model and the entry evicted with posix_fadvise(DONTNEED)), so
# that the disk's drift falls on both. Prints the medians of ready time,
# read time (every F32 byte once, after ready) and RssAnon growth, and the
# median after/before ratio of the ready times.
#
#   bash benches/cache_hit_ab.sh AFTER BEFORE MODEL [ROUNDS]
#
# A build's example: `cargo build --release --example dequant_cache -p
# weightmap` in a worktree of that commit (its target/release/examples/).
set -euo pipefail
AFTER=${1:?usage: cache_hit_ab.sh AFTER BEFORE MODEL [ROUNDS]}
BEFORE=${2:?usage: cache_hit_ab.sh AFTER BEFORE MODEL [ROUNDS]}
MODEL=${3:?usage: cache_hit_ab.sh AFTER BEFORE MODEL [ROUNDS]}
ROUNDS=${4:-5}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
OUT=$DIR/runs.txt

evict() {
  python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$1"
}
bin() { if [ "$1" = after ]; then echo "$AFTER"; else echo "$BEFORE"; fi; }

for b in after before; do
  "$(bin $b)" "$MODEL" --cache "$DIR/$b" >/dev/null
done
for r in $(seq "$ROUNDS"); do
  for temp in warm cold; do
    for b in after before; do
      if [ "$temp" = cold ]; then evict "$MODEL"; evict "$(ls "$DIR/$b"/*.gguf | head -1)"; fi
      echo "$temp $b $r $("$(bin $b)" "$MODEL" --cache "$DIR/$b")" >>"$OUT"
    done
  done
done
python3 - "$OUT" <<'PY'
import json, statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    temp, build, r, js = line.split(" ", 3)
    rows[(temp, build, int(r))] = json.loads(js)
for temp in ["warm", "cold"]:
    for build in ["after", "before"]:
        rs = [v for (t, b, _), v in rows.items() if (t, b) == (temp, build)]
        assert all(r["outcome"] == "hit" for r in rs), rs
        med = lambda k: st.median(r[k] for r in rs)
        print(f"{temp} {build:6} ready {med('ready_ms'):8.1f} ms  read {med('read_ms') - med('ready_ms'):7.1f} ms"
              f"  RssAnon growth {med('rss_anon_growth_kib') / 1024:6.1f} MiB")
    rounds = sorted({r for (t, _, r) in rows if t == temp})
    ratio = st.median(rows[(temp, "after", r)]["ready_ms"] / rows[(temp, "before", r)]["ready_ms"] for r in rounds)
    print(f"{temp} ready after/before {ratio:.2f}")
PY
