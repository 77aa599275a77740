#!/usr/bin/env python3
"""Cold `weightmap load` runs, each in a fresh cgroup-v1 memory cgroup,
configurations interleaved round by round; prints each one's median ms
(ready_ms, or load_ms + pass_ms for --pass) and its runs.

    sudo python3 benches/cgroup_rounds.py ROUNDS MODEL "BINARY LIMIT ARGS..." ...

LIMIT is none (a cgroup with no limit) or a size for memory.limit_in_bytes
(128M, 256M). Every run passes `--evict --json`. Needs root and the v1
memory controller at /sys/fs/cgroup/memory; prints SKIPPED otherwise.
"""
import json
import os
import statistics
import subprocess
import sys

ROOT = "/sys/fs/cgroup/memory"


def run(binary, limit, args, model):
    cg = f"{ROOT}/weightmap-rounds-{os.getpid()}"
    os.mkdir(cg)
    try:
        with open(f"{cg}/memory.limit_in_bytes", "w") as f:
            f.write("-1" if limit == "none" else limit)
        cmd = [binary, "load", model, "--evict", "--json", *args]
        # The child joins the cgroup before it execs the command.
        out = subprocess.run(
            ["sh", "-c", 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"', "sh", cg, *cmd],
            capture_output=True, text=True)
        if out.returncode != 0:
            return None
        d = json.loads(out.stdout)
        return d["ready_ms"] if d["ready_ms"] is not None else d["load_ms"] + d["pass_ms"]
    finally:
        os.rmdir(cg)


def main():
    if os.geteuid() != 0 or not os.access(ROOT, os.W_OK):
        print(f"SKIPPED: needs root and a writable cgroup-v1 memory controller at {ROOT}")
        return
    rounds, model, configs = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    times = {c: [] for c in configs}
    for _ in range(rounds):
        for c in configs:
            binary, limit, *args = c.split()
            times[c].append(run(binary, limit, args, model))
    for c in configs:
        ok = [t for t in times[c] if t is not None]
        med = f"{statistics.median(ok):8.1f}" if ok else "  failed"
        runs = " ".join("x" if t is None else f"{t:.0f}" for t in times[c])
        print(f"{c:60s} median {med}  [{runs}]")


if __name__ == "__main__":
    main()
