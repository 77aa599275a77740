"""Compare two runs of safetensors' Python tests: as they are (safetensors'
own readers) and with weightmap's readers swapped in (wm_swap.py).

Every test that passes on safetensors must pass on weightmap. Prints the
counts (python/README.md quotes them) and each test whose outcome differs;
exits 1 on a test that passes on safetensors and not on weightmap, when
nothing ran, or when no test reached weightmap (a broken swap).

    python compare.py baseline.json weightmap.json
"""

import json
import sys


def count(results, pred=lambda r: True):
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for r in results.values():
        if pred(r):
            out[r["outcome"]] += 1
    return out


def fmt(c):
    return f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"


def main(base_path, wm_path):
    with open(base_path) as f:
        base = json.load(f)
    with open(wm_path) as f:
        wm = json.load(f)
    problems = []
    if not base or not wm:
        problems.append("no tests ran")
    if set(base) != set(wm):
        problems.append(
            f"the runs collected different tests: only on safetensors "
            f"{sorted(set(base) - set(wm))}, only on weightmap {sorted(set(wm) - set(base))}"
        )
    called = {k for k, r in wm.items() if r["weightmap"]}
    if not called:
        problems.append("no test called into weightmap: the swap did not happen")
    print(f"safetensors' suite: {len(base)} tests")
    print(f"  on safetensors:                 {fmt(count(base))}")
    print(f"  on weightmap:                   {fmt(count(wm))}")
    print(f"  calling into weightmap:         {len(called)} tests: "
          f"{fmt(count({k: wm[k] for k in called}))}")
    print(f"  same tests on safetensors:      {fmt(count({k: base[k] for k in called if k in base}))}")
    regressions = []
    for k in sorted(set(base) & set(wm)):
        b, w = base[k]["outcome"], wm[k]["outcome"]
        if b != w:
            mark = "REGRESSION" if b == "passed" else "differs"
            print(f"  {mark}: {k}: {b} on safetensors, {w} on weightmap")
            if b == "passed":
                regressions.append(k)
    if regressions:
        problems.append(f"{len(regressions)} tests pass on safetensors and not on weightmap")
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
