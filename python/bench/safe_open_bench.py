"""Every tensor of a few-hundred-MB safetensors file, warm: weightmap.safe_open
against safetensors' safe_open, under numpy and under torch.

    python python/bench/safe_open_bench.py [--size-mb 300] [--runs 7] [--file PATH]

Makes the file once (safetensors writes it: many tensors, F32, F16 and BF16
mixed), reads it once so that it is in the page cache, then runs each
(library, framework) pair in a fresh interpreter, `--runs` times,
interleaved. Each run times, after its imports:

    with safe_open(path, framework) as f:
        for k in f.keys():
            t = f.get_tensor(k)
            kept[k] = t                      # kept, as load_file keeps them
            touch(t)                         # one byte of every 4 KiB page

and reports RssAnon (/proc/self/status) after the loop against before the
open, and how much of the time the get_tensor calls took (the rest is the
touch: page faults). Prints one line per run and a table of medians
(Markdown).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = 4096


def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def make(path, size_mb):
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    kinds = [(np.float32, (768, 1024)), (np.float16, (1024, 1536)), (ml_dtypes.bfloat16, (1024, 1536))]
    tensors, total, i = {}, 0, 0
    while total < size_mb * 2**20:
        dt, shape = kinds[i % 3]
        a = rng.standard_normal(shape, dtype=np.float32).astype(dt)
        tensors[f"model.layers.{i // 3}.{['q', 'k', 'v'][i % 3]}.weight"] = a
        tensors[f"model.layers.{i // 3}.norm{i % 3}.weight"] = np.ones(shape[1], dtype=dt)
        total += a.nbytes + shape[1] * a.itemsize
        i += 1
    save_file(tensors, str(path), metadata={"format": "pt"})
    return len(tensors)


def child(lib, framework, path):
    """One timed run; prints a JSON line."""
    import numpy as np

    if framework == "pt":
        import torch

        def touch(t):
            return int(t.reshape(-1).view(torch.uint8)[::PAGE].sum())

    else:
        import ml_dtypes  # noqa: F401  (safetensors' numpy path needs it for BF16)

        def touch(t):
            return int(t.reshape(-1).view(np.uint8)[::PAGE].sum())

    if lib == "weightmap":
        from weightmap import safe_open
    else:
        from safetensors import safe_open
    clock = time.perf_counter
    base = rss_anon()
    t0 = clock()
    kept, acc, in_get = {}, 0, 0.0
    with safe_open(path, framework=framework) as f:
        for k in f.keys():
            g = clock()
            t = f.get_tensor(k)
            in_get += clock() - g
            kept[k] = t
            acc += touch(t)
    dt = clock() - t0
    grew = rss_anon() - base
    print(json.dumps({"lib": lib, "framework": framework, "ms": dt * 1e3, "get_ms": in_get * 1e3,
                      "rss_anon": grew, "n": len(kept), "acc": acc}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=300)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--file", type=pathlib.Path)
    ap.add_argument("--frameworks", default="np,pt")
    ap.add_argument("--child", nargs=3, metavar=("LIB", "FRAMEWORK", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return

    path = args.file or ROOT / "target" / "bench" / f"safe_open-{args.size_mb}M.safetensors"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        n = make(tmp, args.size_mb)
        tmp.rename(path)
        print(f"made {path}: {n} tensors, {path.stat().st_size / 2**20:.1f} MiB")
    # Warm: the whole file in the page cache.
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass
    size = path.stat().st_size
    configs = [(lib, fw) for fw in args.frameworks.split(",") for lib in ("weightmap", "safetensors")]
    results = {c: [] for c in configs}
    accs = {}
    for r in range(args.runs):
        # Rotate the order every round, so that no pair always runs first.
        for c in configs[r % len(configs):] + configs[: r % len(configs)]:
            out = subprocess.run(
                [sys.executable, __file__, "--child", c[0], c[1], str(path)],
                check=True, capture_output=True, text=True,
            ).stdout
            row = json.loads(out.strip().splitlines()[-1])
            results[c].append(row)
            accs.setdefault(c[1], set()).add(row["acc"])
            print(f"run {r}: {c[0]:11} {c[1]}: {row['ms']:8.1f} ms, RssAnon +{row['rss_anon'] / 2**20:7.1f} MiB", flush=True)
    for fw, a in accs.items():
        assert len(a) == 1, f"{fw}: the libraries read different bytes: {a}"
    print()
    print(f"File: {path.name}, {size / 2**20:.1f} MiB, {results[configs[0]][0]['n']} tensors; "
          f"{args.runs} runs each, medians.")
    print()
    print("| framework | library | every tensor, touched (ms) | min–max (ms) | of which get_tensor (ms) | RssAnon growth (MiB) |")
    print("|---|---|---:|---:|---:|---:|")
    for c in configs:
        ms = [x["ms"] for x in results[c]]
        get = [x["get_ms"] for x in results[c]]
        rss = [x["rss_anon"] / 2**20 for x in results[c]]
        print(f"| {c[1]} | {c[0]} | {statistics.median(ms):.1f} | {min(ms):.1f}–{max(ms):.1f} "
              f"| {statistics.median(get):.1f} | {statistics.median(rss):.1f} |")
    for fw in args.frameworks.split(","):
        w = statistics.median(x["ms"] for x in results[("weightmap", fw)])
        s = statistics.median(x["ms"] for x in results[("safetensors", fw)])
        print(f"\n{fw}: weightmap is {s / w:.1f}x safetensors' speed ({w:.1f} vs {s:.1f} ms)", end="")
    print()


if __name__ == "__main__":
    main()
