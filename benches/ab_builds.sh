#!/usr/bin/env bash
# Two builds of the command side by side on one model: the binaries
# alternate run by run, warm then cold, so the disk's drift falls on both.
#
#   benches/ab_builds.sh AFTER_BINARY BEFORE_BINARY [MODEL] [ROUNDS]
#
# MODEL defaults to the bench's cached default model (made by
# `cargo run --release -- bench` once). Each run writes its `bench --json`
# to $OUT (default target/ab/), then the script prints, for each mode,
# the median of the runs' medians and of the after/before pair ratios.
set -euo pipefail
after=$1 before=$2
model=${3:-$(ls target/weightmap-cache/default-*.gguf | head -n 1)}
rounds=${4:-3}
out=${OUT:-target/ab}
mkdir -p "$out"
for r in $(seq "$rounds"); do
  for cold in "" "--cold"; do
    for b in after before; do
      bin=$after; [ "$b" = before ] && bin=$before
      "$bin" bench "$model" --iters 5 --warmup 1 --modes mmap,stream,baseline $cold --json \
        > "$out/$b${cold:+-cold}-$r.json"
    done
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics as st, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def med(b, m, k, r):
    return json.load(open(f"{out}/{b}-{r}.json"))["modes"][m][k]["median"]
for cold in ["", "-cold"]:
    print("cold" if cold else "warm")
    for m in ["mmap", "stream", "baseline"]:
        for k in ["load_ms", "ready_ms"]:
            a = [med("after" + cold, m, k, r) for r in range(1, rounds + 1)]
            b = [med("before" + cold, m, k, r) for r in range(1, rounds + 1)]
            ratio = st.median(x / y for x, y in zip(a, b))
            print(f"  {m:9} {k:9} after {st.median(a):9.1f}  before {st.median(b):9.1f}  after/before {ratio:.2f}")
PY
