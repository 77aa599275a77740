#!/usr/bin/env bash
# Which folio sizes each way of filling the page cache leaves a model in,
# side by side in one run (needs root: benches/folios.py reads
# /proc/kpageflags). For each fill, the file is evicted first, then filled,
# then its folios counted; rounds are interleaved.
#
#   sudo bash benches/page_cache_folios.sh WEIGHTMAP FILE [ROUNDS] [OLD_WEIGHTMAP]
#
# Fills: `cat FILE`; a plain read-only mapping touched page by page (its own
# faults); `weightmap load --touch` with the default prefetch, with
# `--prefetch populate`, `--prefetch willneed` and `--prefetch off`; the
# stream path (which reads with O_DIRECT from cold, leaving nothing); and,
# given OLD_WEIGHTMAP, that build's default load. Prints, per fill, the
# median MiB in 2 MiB folios and its ratio to `cat`'s in the same round.
set -euo pipefail
wm=$1 file=$2 rounds=${3:-3} old=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
evict() { python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fdatasync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$file"; }
touch_mapping() {
  python3 - "$file" <<'PY'
import mmap, sys
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    s = 0
    for o in range(0, len(m), 4096):
        s += m[o]
PY
}
fills=(cat mapping wm-default wm-populate wm-willneed wm-off wm-stream)
[ -n "$old" ] && fills+=(old-default)
out=$(mktemp)
for r in $(seq "$rounds"); do
  for fill in "${fills[@]}"; do
    evict
    case $fill in
      cat) cat "$file" > /dev/null ;;
      mapping) touch_mapping ;;
      wm-default) "$wm" load "$file" --touch > /dev/null ;;
      wm-populate) "$wm" load "$file" --touch --prefetch populate > /dev/null ;;
      wm-willneed) "$wm" load "$file" --touch --prefetch willneed > /dev/null ;;
      wm-off) "$wm" load "$file" --touch --prefetch off > /dev/null ;;
      wm-stream) "$wm" load "$file" --touch --mode stream > /dev/null ;;
      old-default) "$old" load "$file" --touch > /dev/null ;;
    esac
    huge=$(python3 "$here/folios.py" "$file" --json | python3 -c "import json,sys; r=json.load(sys.stdin)[0]; print(r['by_size'].get(str(2 << 20), 0), r['resident'])")
    echo "$r $fill $huge" >> "$out"
  done
done
python3 - "$out" "${fills[@]}" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
fills = sys.argv[2:]
cat = {r: int(h) for r, f, h, _ in rows if f == "cat"}
print(f"{'fill':<14}{'2 MiB folios, MiB':>20}{'resident, MiB':>16}{'vs cat':>10}")
for f in fills:
    mine = [(r, int(h), int(res)) for r, g, h, res in rows if g == f]
    mib = st.median(h for _, h, _ in mine) / 2**20
    res = st.median(x for _, _, x in mine) / 2**20
    ratio = st.median(h / cat[r] if cat[r] else float("nan") for r, h, _ in mine)
    print(f"{f:<14}{mib:>20.1f}{res:>16.1f}{ratio:>10.2f}")
PY
rm -f "$out"
