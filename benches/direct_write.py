"""How long writing a new file of N bytes already in memory takes through
the page cache (`pwrite`) and past it (`O_DIRECT`), as the transform cache
writes an entry whose bytes the caller holds (ARCHITECTURE.md, "The
transform cache", "Direct writes of held bytes").

    python3 benches/direct_write.py DIR [--mib 1024] [--runs 5]

Each run writes a new file in DIR each way, interleaved: blocks allocated
first (posix_fallocate, as the cache does), then the bytes in 8 MiB writes
from one touched anonymous buffer, then fsync; and how much the system's
page cache grew while the bytes were written (/proc/meminfo `Cached`,
whole-system, so other processes' I/O shows in it). Prints each run and
the medians. Linux only (O_DIRECT); never run as a test.
"""

import argparse
import mmap
import os
import statistics
import time

CHUNK = 8 << 20


def cached():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) << 10
    return 0


def write(path, buf, direct):
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.posix_fallocate(fd, 0, len(buf))
        view = memoryview(buf)
        before = cached()
        t = time.perf_counter()
        for off in range(0, len(buf), CHUNK):
            os.pwrite(fd, view[off : off + CHUNK], off)
        written = time.perf_counter() - t
        grew = cached() - before
        os.fsync(fd)
        return written, time.perf_counter() - t - written, grew
    finally:
        os.close(fd)
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    n = a.mib << 20
    buf = mmap.mmap(-1, n)  # page-aligned, as direct I/O wants
    for off in range(0, n, CHUNK):
        buf[off : off + CHUNK] = bytes([off // CHUNK % 251 + 1]) * CHUNK
    times = {"buffered": [], "direct": []}
    for i in range(a.runs):
        for mode in times:
            w, s, grew = write(os.path.join(a.dir, f"direct-write-{os.getpid()}"), buf, mode == "direct")
            times[mode].append((w, s, grew))
            print(f"run {i + 1} {mode}: write {w:.3f} s, fsync {s:.3f} s, page cache +{grew >> 20} MiB",
                  flush=True)
    for mode, ts in times.items():
        w = statistics.median(t[0] for t in ts)
        s = statistics.median(t[1] for t in ts)
        together = statistics.median(t[0] + t[1] for t in ts)
        grew = statistics.median(t[2] for t in ts)
        print(f"{mode}: {a.mib} MiB, median write {w:.3f} s, fsync {s:.3f} s, together {together:.3f} s, "
              f"page cache +{grew >> 20} MiB; first run {ts[0][0] + ts[0][1]:.3f} s")


if __name__ == "__main__":
    main()
