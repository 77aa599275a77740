#!/usr/bin/env bash
# The bounded pass against the device's sequential rate, pair by pair: each
# round times `dd iflag=direct bs=8M` on the evicted file, then a cold
# `load --pass --evict` (load plus one pass over every tensor, pages dropped
# behind), a cold direct stream load (`load --mode stream --evict`), and a
# cold mapped first pass (`load --touch --evict`), then dd again. Each time
# is set against the mean of the two dd times of its round; the medians of
# those ratios are printed at the end (above 1: slower than dd).
#
# With OLD_WEIGHTMAP, that build's mapped load and first pass is timed in
# each round too, as a fifth column.
#
#   bash benches/pass_vs_dd.sh target/release/weightmap FILE [ROUNDS] [OLD_WEIGHTMAP]
set -euo pipefail
bin=$1 file=$2 rounds=${3:-6} old=${4:-}
evict() { python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$file"; }
dd_ms() { evict; dd if="$file" of=/dev/null bs=8M iflag=direct 2>&1 | tail -1 | awk '{print $8 * 1000}'; }
ms() { # FIELD ARGS...: load_ms plus FIELD (pass_ms or touch_ms; "-" for none)
  local field=$1; shift
  "${BIN:-$bin}" load "$file" --evict --json "$@" | python3 -c "import json,sys; d=json.load(sys.stdin); f=sys.argv[1]; print(d['load_ms'] + (d[f] if f != '-' else 0))" "$field"
}
out=$(mktemp)
for _ in $(seq 1 "$rounds"); do
  a=$(dd_ms)
  p=$(ms pass_ms --pass)
  s=$(ms - --mode stream)
  t=$(ms touch_ms --touch)
  o=nan; [ -n "$old" ] && o=$(BIN=$old ms touch_ms --touch)
  e=$(dd_ms)
  echo "$a $p $s $t $e $o" | tee -a "$out"
done
python3 - "$out" <<'PY'
import statistics as st, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
dd = [(r[0] + r[4]) / 2 for r in rows]
print(f"dd iflag=direct: median {st.median(dd):.1f} ms")
names = [(1, "load --pass"), (2, "stream load (direct)"), (3, "mapped load + first pass")]
if rows[0][5] == rows[0][5]:  # not nan: an old build was timed
    names.append((5, "old build's mapped load + first pass"))
for i, name in names:
    ratios = [r[i] / d for d, r in zip(dd, rows)]
    print(f"{name}: median {st.median([r[i] for r in rows]):.1f} ms, "
          f"{st.median(ratios):.2f}x dd's time (pairs {min(ratios):.2f}-{max(ratios):.2f})")
PY
rm -f "$out"
