"""Weights loaded and announced in a parent, then in a child after fork:
200,000 announcements of one whole tensor, RssAnon's growth over them, and
how the drop goes (a panic in it is printed, not raised, so read stderr).

    python benches/announce_backlog/fork.py MODEL
"""
import os
import sys
import time

import weightmap


def rss_anon_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon")


w = weightmap.open(sys.argv[1])
dense = list(w.keys()).index("blk.0.attn_q.weight")
w.prefetch([dense])
pid = os.fork()
if pid == 0:
    a0 = rss_anon_kib()
    for _ in range(200_000):
        w.prefetch([dense])
    a1, t1 = rss_anon_kib(), time.perf_counter()
    w.close()
    del w
    print(f"child: RssAnon +{(a1 - a0) / 1024:.1f} MiB over 200,000 announcements,"
          f" the drop {1e3 * (time.perf_counter() - t1):.0f} ms", flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(f"child's wait status {status}")
