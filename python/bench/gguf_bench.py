"""transformers' GGUF load and gguf-py's reader, with and without
weightmap.gguf.patch(), on a GGUF model `weightmap gen` makes.

    python python/bench/gguf_bench.py DIR/model.gguf [--runs 3]

DIR must hold only the GGUF: transformers builds the config from it
(offline: HF_HUB_OFFLINE=1). Each measurement runs in a fresh interpreter,
after its imports, interleaved, `--runs` times (medians reported), with
transformers byte-compiled first (as an installed package is):

- open: `gguf.GGUFReader(path)` against `weightmap.gguf.GGUFReader(path)`,
  then the same with every field built (`[r.fields[k] for k in r.fields]`);
- load: `AutoModelForCausalLM.from_pretrained(DIR, gguf_file=NAME)` with
  gguf-py's reader and dequantizer, then after `weightmap.gguf.patch()`;
  each load also writes a SHA-256 of every parameter's bytes, and the
  script fails if the two loads' parameters differ in any bit.

Wall time and the process's CPU time (time.process_time) are both
reported: on a shared machine the CPU time moves less with the load.
Made for python/README.md's figures; never run as a test.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

CHILD = r"""
import hashlib, json, os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
what, path = sys.argv[1], sys.argv[2]
out = {}
if what in ("open-gguf", "open-wm", "fields-gguf", "fields-wm"):
    import gguf, weightmap.gguf
    cls = gguf.GGUFReader if what.endswith("gguf") else weightmap.gguf.GGUFReader
    t, c = time.perf_counter(), time.process_time()
    r = cls(path)
    if what.startswith("fields"):
        fields = [r.fields[k] for k in r.fields]
    out["s"], out["cpu"] = time.perf_counter() - t, time.process_time() - c
else:
    import torch, transformers
    from transformers import AutoModelForCausalLM
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if what == "load-wm":
        import weightmap.gguf
        weightmap.gguf.patch()
    d, name = os.path.split(path)
    t, c = time.perf_counter(), time.process_time()
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=name)
    out["s"], out["cpu"] = time.perf_counter() - t, time.process_time() - c
    h = hashlib.sha256()
    for k, v in sorted(m.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    out["sha256"] = h.hexdigest()
    out["params"] = sum(p.numel() for p in m.parameters())
print("RESULT " + json.dumps(out))
"""


def run(what, path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    r = subprocess.run([sys.executable, "-c", CHILD, what, str(path)], capture_output=True, text=True, env=env)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{what} failed:\n{r.stderr[-3000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=pathlib.Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-load", action="store_true", help="only the reader figures")
    a = ap.parse_args()
    kinds = ["open-gguf", "open-wm", "fields-gguf", "fields-wm"]
    if not a.skip_load:
        kinds += ["load-gguf", "load-wm"]
    if not a.skip_load:
        # Byte-compile transformers once, as an installed package is: else
        # every run compiles the modules it imports (PYTHONDONTWRITEBYTECODE).
        import transformers

        subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0",
                        os.path.dirname(transformers.__file__)], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times = {k: [] for k in kinds}
    cpus = {k: [] for k in kinds}
    hashes = {}
    for i in range(a.runs):
        for k in kinds:
            r = run(k, a.model)
            times[k].append(r["s"])
            cpus[k].append(r["cpu"])
            if "sha256" in r:
                hashes.setdefault(k, set()).add(r["sha256"])
            print(f"run {i + 1} {k}: {r['s']:.4f} s wall, {r['cpu']:.4f} s CPU"
                  + (f", params {r['params']}" if "params" in r else ""), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    cmed = {k: statistics.median(v) for k, v in cpus.items()}
    print()
    print(f"{a.model} ({a.model.stat().st_size / 2**20:.1f} MiB), medians of {a.runs} "
          f"(wall; CPU time of the process in brackets):")
    print("| what | gguf-py | weightmap | speed-up |")
    print("|---|---|---|---|")
    rows = [("GGUFReader(path)", "open-gguf", "open-wm"), ("... and every field built", "fields-gguf", "fields-wm")]
    if not a.skip_load:
        rows.append(("from_pretrained(gguf_file=)", "load-gguf", "load-wm"))
    for label, g, w in rows:
        print(f"| {label} | {med[g]:.3f} s ({cmed[g]:.3f} s) | {med[w]:.4f} s ({cmed[w]:.4f} s) "
              f"| {med[g] / med[w]:.1f}× ({cmed[g] / cmed[w]:.1f}×) |")
    if not a.skip_load:
        if hashes["load-gguf"] != hashes["load-wm"] or len(hashes["load-gguf"]) != 1:
            raise SystemExit(f"the parameters differ: {hashes}")
        print(f"parameters bit-identical with and without the patch (sha256 {hashes['load-wm'].pop()[:16]}...)")


if __name__ == "__main__":
    main()
