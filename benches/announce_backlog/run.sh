#!/usr/bin/env bash
# SCRIPT (backlog.py or fork.py) on MODEL in a new cgroup-v1 memory cgroup
# of 450 MiB, the model evicted first (root; the cgroup removed after).
#
#   sudo bash benches/announce_backlog/run.sh PYTHON SCRIPT MODEL
set -euo pipefail
PY=${1:?usage: run.sh PYTHON SCRIPT MODEL}
SCRIPT=${2:?usage: run.sh PYTHON SCRIPT MODEL}
MODEL=${3:?usage: run.sh PYTHON SCRIPT MODEL}
CG=/sys/fs/cgroup/memory/weightmap-backlog-$$
mkdir "$CG"
trap 'sleep 0.3; rmdir "$CG"' EXIT
echo $((450 << 20)) >"$CG/memory.limit_in_bytes"
python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$MODEL"
sh -c 'echo $$ >"$0/cgroup.procs"; exec "$@"' "$CG" "$PY" "$SCRIPT" "$MODEL"
