#!/usr/bin/env bash
# One run of passes.py on MODEL in a new cgroup-v1 memory cgroup of LIMIT
# MiB, every GGUF beside MODEL evicted first (root; removed after).
#
#   sudo bash benches/split/run.sh PYTHON MODEL LIMIT_MIB
#
# BENCHMARKS.md's figures: LIMIT 200 (a budget of about 170 MiB beside
# Python's own memory), one.gguf against split-00001-of-00002.gguf.
set -euo pipefail
PY=${1:?usage: run.sh PYTHON MODEL LIMIT_MIB}
MODEL=${2:?usage: run.sh PYTHON MODEL LIMIT_MIB}
LIMIT=${3:?usage: run.sh PYTHON MODEL LIMIT_MIB}
HERE=$(cd "$(dirname "$0")" && pwd)
CG=/sys/fs/cgroup/memory/weightmap-split-$$
mkdir "$CG"
trap 'sleep 0.3; rmdir "$CG"' EXIT
echo $((LIMIT << 20)) >"$CG/memory.limit_in_bytes"
for f in "$(dirname "$MODEL")"/*.gguf; do
  python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$f"
done
sh -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$CG" "$PY" "$HERE/passes.py" "$MODEL"
