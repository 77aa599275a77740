"""Read every page of every tensor of MODEL six times (one byte a page,
through weightmap's Python package), and print the load's residency plan
and the median over passes 2-6 of the bytes read from storage
(/proc/self/io read_bytes) and the time of a pass. Run by run.sh inside a
memory cgroup.

    python benches/split/passes.py MODEL
"""
import statistics
import sys
import time

import numpy as np
import weightmap


def read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise RuntimeError("no read_bytes in /proc/self/io")


w = weightmap.open(sys.argv[1])
names = list(w.keys())
passes = []
for _ in range(6):
    b0, t0 = read_bytes(), time.perf_counter()
    for n in names:
        w[n].view(np.uint8)[::4096].sum()
    passes.append(((read_bytes() - b0) / 2**20, (time.perf_counter() - t0) * 1e3))
steady = passes[1:]
print(
    f"{w.report()['residency']} | read per pass {statistics.median(p[0] for p in steady):.1f} MiB,"
    f" {statistics.median(p[1] for p in steady):.0f} ms (medians of passes 2-6)"
)
