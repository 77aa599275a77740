#!/usr/bin/env python3
"""Which folio sizes hold a file in the page cache (needs root).

    sudo python3 benches/folios.py FILE [FILE ...] [--json]

For each resident page of FILE (mincore), the page is mapped without
read-ahead (a private mapping advised MADV_RANDOM, touched once per resident
page, so nothing is read from storage), its frame number read from
/proc/self/pagemap and its flags from /proc/kpageflags. A folio is a head
page (KPF_COMPOUND_HEAD) and the tail pages after it (KPF_COMPOUND_TAIL), so
the run of a head and its tails, in file order, is the folio's size. Prints
the resident bytes and the bytes in folios of each size; "2 MiB" is the
PMD size that decode wants.

Without root the frame numbers read as 0 and the script says so.
"""
import ctypes
import json
import os
import struct
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")
KPF_COMPOUND_HEAD = 1 << 15
KPF_COMPOUND_TAIL = 1 << 16
PFN_MASK = (1 << 55) - 1
PRESENT = 1 << 63
MADV_RANDOM = 1

libc = ctypes.CDLL(None, use_errno=True)
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def folios(path):
    size = os.path.getsize(path)
    pages = (size + PAGE - 1) // PAGE
    out = {"file": path, "bytes": size, "resident": 0, "by_size": {}}
    if size == 0:
        return out
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    try:
        p = libc.mmap(None, size, 1, 2, fd, 0)  # PROT_READ, MAP_PRIVATE
        if p in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        libc.madvise(p, pages * PAGE, MADV_RANDOM)
        vec = (ctypes.c_ubyte * pages)()
        if libc.mincore(p, size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        resident = [i for i in range(pages) if vec[i] & 1]
        # Touch resident pages only: each maps a page the cache holds.
        for i in resident:
            ctypes.c_ubyte.from_address(p + i * PAGE).value
        with open("/proc/self/pagemap", "rb") as pm:
            pm.seek((p // PAGE) * 8)
            raw = pm.read(pages * 8)
        entries = struct.unpack(f"<{pages}Q", raw)
        pfns = [e & PFN_MASK if e & PRESENT else 0 for e in entries]
        if resident and not any(pfns[i] for i in resident):
            raise PermissionError("/proc/self/pagemap gives no frame numbers: run as root")
        with open("/proc/kpageflags", "rb") as kf:
            def flags(pfn):
                kf.seek(pfn * 8)
                return struct.unpack("<Q", kf.read(8))[0]

            run = 0
            by = {}
            prev_pfn = None
            for i in range(pages):
                pfn = pfns[i] if vec[i] & 1 else 0
                fl = flags(pfn) if pfn else 0
                tail = pfn and (fl & KPF_COMPOUND_TAIL) and prev_pfn is not None and pfn == prev_pfn + 1
                if tail:
                    run += 1
                else:
                    if run:
                        by[run] = by.get(run, 0) + run
                    run = 1 if pfn else 0
                prev_pfn = pfn if pfn else None
            if run:
                by[run] = by.get(run, 0) + run
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munmap(p, size)
    finally:
        os.close(fd)
    out["resident"] = len(resident) * PAGE
    out["by_size"] = {n * PAGE: c * PAGE for n, c in sorted(by.items())}
    return out


def human(b):
    return f"{b / (1 << 20):.1f} MiB"


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    results = [folios(a) for a in args]
    if "--json" in sys.argv:
        print(json.dumps(results))
        return 0
    for r in results:
        huge = r["by_size"].get(2 << 20, 0)
        sizes = ", ".join(f"{k // 1024} KiB: {human(v)}" for k, v in r["by_size"].items())
        print(f"{r['file']}: {human(r['resident'])} of {human(r['bytes'])} resident; "
              f"{human(huge)} in 2 MiB folios ({sizes})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
