#!/usr/bin/env bash
# Loads under a cgroup-v1 memory limit: what the mapped default (its first
# pass: load --touch), sequential advice, the bounded pass (load --pass) and
# the stream path do inside 256 and 128 MiB, against no limit, cold (evicted
# before every run), rounds interleaved.
#
#   benches/cgroup_budget.sh [WEIGHTMAP] [MODEL] [ROUNDS]
#
# Needs root and the cgroup-v1 memory controller at /sys/fs/cgroup/memory
# (prints SKIPPED otherwise). Makes the cgroup weightmap-bench-$$ and
# removes it at exit. Prints one line per run: limit, mode, exit status,
# ready_ms (for the pass: load_ms + pass_ms), the budget the load saw, and the cgroup's failcnt (how often
# usage hit the limit).
set -u
wm=${1:-target/release/weightmap}
model=${2:-$(ls target/weightmap-cache/default-*.gguf 2>/dev/null | head -n 1)}
rounds=${3:-3}
root=/sys/fs/cgroup/memory
if [ "$(id -u)" != 0 ] || [ ! -w "$root" ]; then
  echo "SKIPPED: needs root and a writable cgroup-v1 memory controller at $root"
  exit 0
fi
[ -n "$model" ] || { echo "no model: run 'cargo run --release -- bench' once"; exit 1; }
cg=$root/weightmap-bench-$$
mkdir "$cg"
trap 'rmdir "$cg" 2>/dev/null' EXIT

run() { # LIMIT MODE-NAME ARGS...
  local limit=$1 name=$2; shift 2
  if [ "$limit" = none ]; then
    echo -1 > "$cg/memory.limit_in_bytes"
  else
    echo "$limit" > "$cg/memory.limit_in_bytes"
  fi
  echo 0 > "$cg/memory.failcnt"
  local out
  out=$(sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" \
        "$wm" load "$model" --evict --json "$@" 2>/tmp/weightmap-cg-err)
  local rc=$?
  local fail; fail=$(cat "$cg/memory.failcnt")
  if [ $rc = 0 ]; then
    python3 -c 'import json,sys; d=json.loads(sys.argv[1]); ready = d["ready_ms"] if d["ready_ms"] is not None else d["load_ms"] + d["pass_ms"]; print("%-6s %-22s exit 0   ready_ms %8.1f  budget %s (%s)  failcnt %s" % (sys.argv[2], sys.argv[3], ready, d["budget_bytes"], d["budget_source"], sys.argv[4]))' "$out" "$limit" "$name" "$fail"
  else
    printf '%-6s %-22s exit %-3s %s  failcnt %s\n' "$limit" "$name" "$rc" "$(tail -c 160 /tmp/weightmap-cg-err | tr '\n' ' ')" "$fail"
  fi
}

for r in $(seq "$rounds"); do
  for limit in none 256M 128M; do
    run "$limit" mmap --touch
    run "$limit" mmap-sequential --touch --advice sequential
    run "$limit" pass --pass
    run "$limit" stream --touch --mode stream
  done
done
