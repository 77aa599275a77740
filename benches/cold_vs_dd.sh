#!/usr/bin/env bash
# Cold stream loads against the device's sequential rate, pair by pair:
# each round evicts the file and times `dd iflag=direct bs=8M`, then a
# stream load with 4 and with 2 direct-reading threads and a buffered one
# (each `load --evict`), then dd again. A load's rate against dd is the
# mean of the two dd times over its load time; the medians of those ratios
# are printed at the end. The host's disk rate drifts (±30% here), so the
# pairs, not the medians of separate runs, are what to compare.
#
#   bash benches/cold_vs_dd.sh target/release/weightmap FILE [ROUNDS]
set -euo pipefail
bin=$1 file=$2 rounds=${3:-8}
evict() { python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$file"; }
dd_ms() { evict; dd if="$file" of=/dev/null bs=8M iflag=direct 2>&1 | tail -1 | awk '{print $8 * 1000}'; }
load_ms() { "$bin" load "$file" --mode stream --evict --json "$@" | python3 -c "import json,sys; print(json.load(sys.stdin)['load_ms'])"; }
out=$(mktemp)
for _ in $(seq 1 "$rounds"); do
  a=$(dd_ms)
  d4=$(load_ms --threads 4)
  d2=$(load_ms --threads 2)
  b=$(load_ms --direct-io off)
  e=$(dd_ms)
  echo "$a $d4 $d2 $b $e" | tee -a "$out"
done
python3 - "$out" <<'PY'
import statistics as s, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
dd = [(r[0] + r[4]) / 2 for r in rows]
print(f"dd median {s.median(dd):.1f} ms")
for i, name in [(1, "direct, 4 threads"), (2, "direct, 2 threads"), (3, "buffered")]:
    ratios = [d / r[i] for d, r in zip(dd, rows)]
    print(f"{name}: median {s.median([r[i] for r in rows]):.1f} ms, "
          f"rate against dd {s.median(ratios):.2f}x (pairs {min(ratios):.2f}-{max(ratios):.2f})")
PY
rm -f "$out"
