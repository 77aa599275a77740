"""100,000 announcements of one whole tensor, then the weights dropped:
the time an announcement takes, RssAnon's growth over them, and the time
the drop takes (it joins the announcing thread).

    python benches/announce_backlog/backlog.py MODEL
"""
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
plan = w.report()["residency"].split(":")[0]
dense = list(w.keys()).index("blk.0.attn_q.weight")
a0, t0 = rss_anon_kib(), time.perf_counter()
for _ in range(100_000):
    w.prefetch([dense])
t1, a1 = time.perf_counter(), rss_anon_kib()
w.close()
del w
t2 = time.perf_counter()
print(f"{plan} | an announcement {(t1 - t0) / 1e5 * 1e6:.2f} us, RssAnon +{(a1 - a0) / 1024:.1f} MiB,"
      f" the drop {1e3 * (t2 - t1):.0f} ms")
