"""transformers' GGUF load with weightmap.gguf.patch(cache=...): the first
run on an empty cache and the next on the filled one, against gguf-py's
path and patch() alone.

    python python/bench/gguf_cache_bench.py DIR/model.gguf [--runs 3] [--cache-dir D]

DIR must hold only the GGUF (offline: HF_HUB_OFFLINE=1). Each load runs in
a fresh interpreter, after its imports (torch, transformers, weightmap, and
the model's class, whose import is 2-3 s of the first from_pretrained) and
the patch, interleaved, `--runs` times (medians reported), with
transformers byte-compiled first:

- (a) gguf-py: transformers as it is;
- (b) patch(): weightmap's reader and dequantizer;
- (c) patch(cache=D) on an empty cache (D removed before each run);
- (d) patch(cache=D) on the filled cache;
- (e) two processes loading at once from the filled cache, both alive when
  each measures.

Each load reports wall and CPU time of `from_pretrained`, its RssAnon
growth (/proc/self/status) after the load and again after reading every
parameter (a SHA-256 of all their bytes, zero-copy), the time of a first
read of one element in every 4 KiB of every parameter (the page faults a
first compute takes: from the disk where an entry was just written past
the page cache), the seconds the entry's write took, and how many
parameters lie in the entry's mapping; the script fails if any load's
parameters differ from (a)'s in any bit. Made for python/README.md's
figures; never run as a test. Linux only (/proc).
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import hashlib, importlib, json, os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
mode, path, cache = sys.argv[1], sys.argv[2], sys.argv[3]
import torch, transformers
from transformers import AutoModelForCausalLM
import transformers.modeling_gguf_pytorch_utils, transformers.quantizers.quantizer_gguf
import weightmap, weightmap.torch, weightmap.gguf
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
with weightmap.open(path) as w:
    arch = w.metadata()["general.architecture"]
try:  # the model's class: an import, not part of the load
    importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
except ImportError:
    pass
if mode == "patch":
    weightmap.gguf.patch()
elif mode.startswith("cache"):
    weightmap.gguf.patch(cache=cache)

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

d, name = os.path.split(path)
a0 = anon()
t, c = time.perf_counter(), time.process_time()
m = AutoModelForCausalLM.from_pretrained(d, gguf_file=name)
out = {"s": time.perf_counter() - t, "cpu": time.process_time() - c, "anon_load": anon() - a0}
# The entry's commit (fsync, rename) may still run on its own thread: how
# much longer until it is in place for the next process.
t = time.perf_counter()
if mode.startswith("cache"):
    weightmap.gguf.cache_wait()
out["commit_wait"] = time.perf_counter() - t
reports = weightmap.gguf.cache_reports()
out["outcomes"] = [f"{r['call']}:{r['outcome']}" + (f" (replaced: {r['replaced']})" if r["replaced"] else "")
                   for r in reports]
out["write_s"] = sum(r["write_seconds"] or 0 for r in reports)
params = dict(m.named_parameters())
out["param_bytes"] = sum(p.numel() * p.element_size() for p in params.values())
entries = {os.path.realpath(r["entry"]) for r in reports if r["call"] == "tensors" and r["entry"]}
ranges = []
for line in open("/proc/self/maps"):
    f = line.split(maxsplit=5)
    if len(f) == 6 and os.path.realpath(f[5].strip()) in entries:
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        ranges.append((lo, hi))
out["in_entry"] = f"{sum(1 for p in params.values() if any(lo <= p.data_ptr() < hi for lo, hi in ranges))}/{len(params)}"
# One element of every page of every parameter: the first compute's reads
# (from the entry's file where the parameters are mapped).
t = time.perf_counter()
with torch.no_grad():
    for p in params.values():
        flat = p.detach().reshape(-1)
        flat[:: max(1, 4096 // p.element_size())].sum()
out["touch_s"] = time.perf_counter() - t
if mode == "cache-pair":
    print("LOADED", flush=True)
    sys.stdin.readline()  # both loaded: read and measure now
h = hashlib.sha256()
for k, v in sorted(m.state_dict().items()):
    h.update(k.encode())
    h.update(v.detach().contiguous().view(-1).view(torch.uint8).numpy())
out["sha256"] = h.hexdigest()
out["anon_read"] = anon() - a0
print("RESULT " + json.dumps(out), flush=True)
if mode == "cache-pair":
    sys.stdin.read()  # stay alive until the other one has measured too
"""

MODES = {"gguf": "(a) gguf-py", "patch": "(b) patch()", "cache-empty": "(c) patch(cache=) empty",
         "cache-hit": "(d) patch(cache=) filled"}


def env():
    e = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    e.pop("PYTHONDONTWRITEBYTECODE", None)
    return e


def parse(stdout, what):
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{what} failed")


def run(mode, path, cache):
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), str(cache)],
                       capture_output=True, text=True, env=env())
    if r.returncode:
        raise SystemExit(f"{mode} failed:\n{r.stderr[-3000:]}")
    return parse(r.stdout, mode)


def pair(path, cache):
    """Two loads at once; each measures once both have loaded."""
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, "cache-pair", str(path), str(cache)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=env()) for _ in range(2)]
    for p in procs:
        for line in p.stdout:
            if line.strip() == "LOADED":
                break
        else:
            raise SystemExit("a paired load failed")
    results = []
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
        line = next((ln for ln in p.stdout if ln.startswith("RESULT ")), "")
        results.append(parse(line, "a paired load"))
    for p in procs:
        p.stdin.close()
        p.wait()
    return results


def mib(n):
    return f"{n / 2**20:.0f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=pathlib.Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cache-dir", type=pathlib.Path, help="the cache (default: a new temporary directory)")
    a = ap.parse_args()
    import transformers

    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", os.path.dirname(transformers.__file__)],
                   check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = None
    cache = a.cache_dir
    if cache is None:
        tmp = tempfile.mkdtemp(prefix="wm-cache-bench-")
        cache = pathlib.Path(tmp) / "cache"
    results = {k: [] for k in MODES}
    pairs = []
    try:
        for i in range(a.runs):
            with open("/proc/loadavg") as f:
                print(f"run {i + 1}, load average {f.read().split()[0]}", flush=True)
            for mode in MODES:
                if mode == "cache-empty":
                    shutil.rmtree(cache, ignore_errors=True)
                r = run(mode, a.model, cache)
                results[mode].append(r)
                print(f"  {MODES[mode]}: {r['s']:.3f} s wall (+{r['commit_wait']:.3f} s until the entry was committed), "
                      f"{r['cpu']:.3f} s CPU, RssAnon +{mib(r['anon_load'])} "
                      f"(+{mib(r['anon_read'])} after reading every parameter), first read of every page {r['touch_s']:.3f} s, "
                      f"entry written in {r['write_s']:.3f} s, in the entry {r['in_entry']}, "
                      f"{' '.join(r['outcomes'])}", flush=True)
            p = pair(a.model, cache)
            pairs.append(p)
            print(f"  (e) two at once: RssAnon +{mib(p[0]['anon_read'])} and +{mib(p[1]['anon_read'])}, "
                  f"in the entry {p[0]['in_entry']}, {p[1]['in_entry']}, {' '.join(p[0]['outcomes'])}; "
                  f"{' '.join(p[1]['outcomes'])}", flush=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    want = {r["sha256"] for r in results["gguf"]}
    got = {r["sha256"] for rs in results.values() for r in rs} | {r["sha256"] for p in pairs for r in p}
    if len(want) != 1 or got != want:
        raise SystemExit(f"the parameters differ: gguf-py {want}, all loads {got}")
    param_bytes = results["gguf"][0]["param_bytes"]
    med = lambda mode, k: statistics.median(r[k] for r in results[mode])  # noqa: E731
    base, base_cpu = med("gguf", "s"), med("gguf", "cpu")
    print()
    print(f"{a.model} ({a.model.stat().st_size / 2**20:.1f} MiB; {mib(param_bytes)} of parameters), "
          f"medians of {a.runs}:")
    print("| load | wall (CPU) | vs gguf-py | then a first read of every page | RssAnon growth: loaded / every parameter read |")
    print("|---|---|---|---|---|")
    for mode, label in MODES.items():
        s, c, touch = med(mode, "s"), med(mode, "cpu"), med(mode, "touch_s")
        al, ar = med(mode, "anon_load"), med(mode, "anon_read")
        w = med(mode, "commit_wait")
        commit = f"; entry committed {w:.3f} s later" if w >= 0.0005 else ""
        print(f"| {label} | {s:.3f} s ({c:.3f} s){commit} | {base / s:.1f}× ({base_cpu / c:.1f}×) | "
              f"{touch:.3f} s | {mib(al)} ({100 * al / param_bytes:.0f}%) / {mib(ar)} ({100 * ar / param_bytes:.0f}%) |")
    combined = statistics.median(p[0]["anon_read"] + p[1]["anon_read"] for p in pairs)
    print(f"| (e) two processes at once, filled cache | | | | combined {mib(combined)} "
          f"({100 * combined / param_bytes:.0f}% of one model's parameters) |")
    print("parameters bit-identical to gguf-py's in every load "
          f"(sha256 {want.pop()[:16]}...)")
    hit_anon = med("cache-hit", "anon_read")
    checks = [
        ("(c) >= 5x faster than (a)", base / med("cache-empty", "s") >= 5),
        ("(c) with its first read of every page >= 5x faster than (a) with its",
         statistics.median(r["s"] + r["touch_s"] for r in results["gguf"])
         / statistics.median(r["s"] + r["touch_s"] for r in results["cache-empty"]) >= 5),
        ("(d) >= 20x faster than (a)", base / med("cache-hit", "s") >= 20),
        ("(d) RssAnon growth <= 25% of the parameters", hit_anon <= 0.25 * param_bytes),
        ("(e) combined RssAnon growth <= 25% of one model's parameters", combined <= 0.25 * param_bytes),
    ]
    for what, ok in checks:
        print(f"{'met' if ok else 'NOT met'}: {what}")


if __name__ == "__main__":
    main()
