"""weightmap's Python bindings beside gguf-py (for a .gguf) or safetensors'
`safe_open` (for a .safetensors): open time, per-tensor access, RssAnon
with every tensor touched, dequantization rate (GGUF only).

    target/python-venv/bin/python benches/python_open.py FILE [ROUNDS]

Each measurement runs in a fresh interpreter (so RssAnon is the reader's
own), warm (the file is read once first); medians over ROUNDS.
"""
import json
import statistics
import subprocess
import sys

CHILD = r'''
import json, sys, time
import numpy as np
path, who = sys.argv[1], sys.argv[2]
def rss_anon():
    for l in open("/proc/self/status"):
        if l.startswith("RssAnon:"):
            return int(l.split()[1])
base = rss_anon()
t0 = time.perf_counter()
if who == "weightmap":
    import weightmap
    w = weightmap.open(path)
    names = w.keys()
    get = lambda n: w[n]
elif who == "safetensors":
    from safetensors import safe_open
    f = safe_open(path, "np")
    names = list(f.keys())
    get = lambda n: f.get_tensor(n)
else:
    from gguf import GGUFReader
    r = GGUFReader(path)
    names = [t.name for t in r.tensors]
    by = {t.name: t for t in r.tensors}
    get = lambda n: by[n].data
open_s = time.perf_counter() - t0
t1 = time.perf_counter()
total = 0
for n in names:
    a = get(n)
    total += int(np.asarray(a).view(np.uint8).reshape(-1)[::4096].sum())
touch_s = time.perf_counter() - t1
deq = None
if path.endswith(".safetensors"):
    pass
elif who == "weightmap":
    q = [n for n in names if w.info(n)["type"] in ("q4_K", "q6_K", "q8_0")][:8]
    t2 = time.perf_counter(); nb = 0
    for n in q:
        nb += w.get_f32(n).nbytes
    deq = nb / (time.perf_counter() - t2) / 1e9
else:
    from gguf.quants import dequantize
    q = [t for t in r.tensors if t.tensor_type.name in ("Q4_K", "Q6_K", "Q8_0")][:8]
    t2 = time.perf_counter(); nb = 0
    for t in q:
        nb += dequantize(t.data, t.tensor_type).astype(np.float32).nbytes
    deq = nb / (time.perf_counter() - t2) / 1e9
print(json.dumps({"open_ms": open_s * 1e3, "touch_ms": touch_s * 1e3,
                  "per_tensor_us": touch_s * 1e6 / max(1, len(names)),
                  "rss_anon_growth_mib": (rss_anon() - base) / 1024, "dequant_gb_s_f32_out": deq}))
'''

def run(path, who):
    out = subprocess.run([sys.executable, "-c", CHILD, path, who], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)

path = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
open(path, "rb").read()
other = "safetensors" if path.endswith(".safetensors") else "gguf-py"
rows = {"weightmap": [], other: []}
for _ in range(rounds):
    for who in rows:
        rows[who].append(run(path, {"gguf-py": "gguf"}.get(who, who)))
for who, rs in rows.items():
    med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if rs[0][k] is not None}
    print(who, {k: round(v, 3) for k, v in med.items()})
wm, ref = (statistics.median(r["open_ms"] for r in rows[k]) for k in ("weightmap", other))
print(f"open: {other} / weightmap = {ref / wm:.0f}x")
