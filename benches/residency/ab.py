#!/usr/bin/env python3
"""Two builds of `moe_replay` side by side: the announce mode of each, cold,
in a fresh memory cgroup of each fraction of the file, the builds
alternating round by round. Weights and routing are SYNTHETIC (run.py).

    sudo python3 benches/residency/ab.py AFTER BEFORE MODEL [--fractions 0.5,0.25]
        [--routings uniform,zipf] [--tokens 64] [--rounds 3]

Prints, per case, each build's median tok/s (over tokens 2 to N) and bytes
read a token, and their ratio; every run's checksum must be the same.
"""
import argparse
import os
import statistics

from run import add_case_args, can_limit, evict, replay


def main():
    p = argparse.ArgumentParser()
    p.add_argument("after")
    p.add_argument("before")
    p.add_argument("model")
    add_case_args(p, tokens=64, rounds=3)
    a = p.parse_args()
    if not can_limit():
        return
    size = os.path.getsize(a.model)
    print(f"model {a.model}: {size / 1e9:.2f} GB (weights and routing SYNTHETIC)")
    builds = {"after": a.after, "before": a.before}
    for routing in a.routings.split(","):
        for fraction in (float(f) for f in a.fractions.split(",")):
            limit = int(size * fraction)
            args = ["--mode", "announce", "--routing", routing, "--tokens", str(a.tokens),
                    "--budget", str(limit)]
            runs = {b: [] for b in builds}
            for _ in range(a.rounds):
                for name, binary in builds.items():
                    evict(a.model)
                    r, kills = replay(binary, a.model, args, limit)
                    r["oom_kills"] = kills
                    runs[name].append(r)
            report(routing, fraction, runs)


def report(routing, fraction, runs):
    print(f"\n{routing} routing, cgroup {fraction}x the file")
    medians = {}
    sums = {r["checksum"] for rs in runs.values() for r in rs if "checksum" in r}
    for name, rs in runs.items():
        ok = [r for r in rs if "tok_s" in r]
        if len(ok) < len(rs):
            print(f"  {name:6s} failed: {[r for r in rs if 'tok_s' not in r]}")
            return
        tok_s = statistics.median(r["tok_s"] for r in ok)
        read = statistics.median(r["read_bytes_per_token"] for r in ok)
        kills = sum(r["oom_kills"] for r in rs)
        medians[name] = tok_s
        each = ", ".join(f"{r['tok_s']:.2f}" for r in ok)
        print(f"  {name:6s} {tok_s:7.2f} tok/s  read {read / 1e6:6.0f} MB a token  "
              f"OOM kills {kills}  ({each})")
    print(f"  after / before: {medians['after'] / medians['before']:.2f}; bytes "
          f"{'the same in every run' if len(sums) == 1 else 'DIFFER'}")


if __name__ == "__main__":
    main()
