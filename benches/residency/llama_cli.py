#!/usr/bin/env python3
"""llama-cli, as a user runs it, with and without --weightmap (capi/llama.cpp/
weightmap.patch), side by side: in memory, warm and cold, where the model
fits; then cold, each run in a fresh cgroup-v1 memory cgroup of a fraction
of the file's size.

    sudo python3 benches/residency/llama_cli.py LLAMA_CLI MODEL
        [--fractions 0.5] [--tokens 16] [--rounds 3] [--modes plain,no-repack,weightmap]
        [--timeout 300] [--no-in-memory] [--llama-args '-b 64 -ub 64']

LLAMA_CLI is llama-cli built with -DLLAMA_WEIGHTMAP=ON (capi/llama.cpp/
run.sh builds one under target/llama-cli). The modes:
  plain      llama-cli as is: it maps the file and repacks what its CPU
             kernels prefer into anonymous memory;
  no-repack  llama-cli --no-repack: its own mapping alone;
  weightmap  llama-cli --weightmap, which over the budget also stops the
             repacking (the tokens are then no-repack's).
MODE@LLAMA_CLI in --modes runs MODE with another build of llama-cli (one
without the predictor, say), side by side. Each run generates --tokens
tokens, seeded, from one prompt (single turn);
a run in a cgroup that has not ended after --timeout seconds is killed and
counted as failed.
Reports per mode the medians of llama-cli's own generation and prompt
speeds and of the whole run's wall time (load included), the OOM kills, and
whether the tokens are the in-memory run's of the same kernels (plain's
for plain, and for weightmap where it fits; no-repack's otherwise), and
over the budget the hook's predictor's score (its log line at exit). On the
files benches/residency/moe_gguf.py writes the weights are SYNTHETIC: the
tokens mean nothing, but must be the same.
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import can_limit, evict, run_in_cgroup, size_and_rate  # noqa: E402

PROMPT = "The weights of a model larger than memory"
EXTRA = []  # --llama-args
FLAGS = {"plain": [], "no-repack": ["--no-repack"], "weightmap": ["--weightmap"]}
TIMINGS = re.compile(r"\[ Prompt: ([0-9.]+) t/s \| Generation: ([0-9.]+) t/s \]")
PLAN = re.compile(r"weightmap [^:]*: (fits|stream_experts|stream_all)")
GUESSES = re.compile(r"(\d+) layers guessed, (\d+) of (\d+) chosen experts")


def parse(started):
    def of(proc):
        out = proc.stdout
        # What llama-cli printed between its echo of the prompt and its
        # speeds: every generated token.
        answer = out.split("\n> " + PROMPT + "\n", 1)[-1].split("\n[ Prompt:", 1)[0].strip()
        m = TIMINGS.search(out)
        plan = PLAN.search(proc.stderr)
        guesses = GUESSES.search(proc.stderr)
        return {"wall_s": time.perf_counter() - started, "tokens": answer,
                "guessed": [int(g) for g in guesses.groups()] if guesses else None,
                "prompt_tok_s": float(m.group(1)) if m else None,
                "tok_s": float(m.group(2)) if m else None,
                "plan": plan.group(1) if plan else None}
    return of


def generate(cli, model, tokens, mode, limit=None, timeout=None):
    # MODE@LLAMA_CLI: that mode with another build, side by side.
    mode, _, other = mode.partition("@")
    cmd = [other or cli, "-m", model, "-p", PROMPT, "-n", str(tokens), "--seed", "46", "-st", "-c", "512",
           "-t", "2", "--simple-io", "-v", *EXTRA, *FLAGS[mode]]
    r, kills = run_in_cgroup(cmd, limit, parse(time.perf_counter()), timeout)
    r["oom_kills"] = kills
    return r


def report(label, runs, reference):
    for mode, rs in runs.items():
        ok = [r for r in rs if r.get("tok_s")]
        kills = sum(r["oom_kills"] for r in rs)
        if not ok:
            why = rs[0].get("failed", "no timings")
            print(f"  {label:10s} {mode:9s} failed in every run ({why}), OOM kills {kills}")
            continue
        med = lambda k: statistics.median(r[k] for r in ok)
        ref = reference(mode.partition("@")[0], ok[0]["plan"])
        same = all(r["tokens"] == ref for r in ok)
        print(f"  {label:10s} {mode:9s} {med('tok_s'):7.2f} tok/s  prompt {med('prompt_tok_s'):7.2f} tok/s  "
              f"wall {med('wall_s'):6.2f} s  plan {ok[0]['plan'] or '-':14s} tokens "
              f"{'same' if same else 'DIFFER'}  OOM kills {kills}  runs {len(ok)}/{len(rs)}")
        if ok[0]["guessed"]:
            # The hook's predictor, over every run: its layers guessed, and
            # of the experts llama.cpp's router chose, those guessed.
            layers, hits, chosen = (sum(r["guessed"][i] for r in ok) for i in range(3))
            print(f"  {'':10s} {'':9s} predictor: {layers} layers guessed, {hits} of {chosen} chosen experts "
                  f"guessed ({hits / max(chosen, 1):.0%})")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("llama_cli")
    p.add_argument("model")
    p.add_argument("--fractions", default="0.5")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    # In a cgroup smaller than its repacked copies, plain llama-cli can
    # stall in reclaim for many minutes, neither killed nor generating.
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--modes", default=",".join(FLAGS), help="the modes run in cgroups")
    p.add_argument("--no-in-memory", action="store_true", help="skip the warm and cold runs without a cgroup")
    p.add_argument("--llama-args", default="", help="more arguments for every run (e.g. '-b 64 -ub 64')")
    a = p.parse_args()
    EXTRA.extend(shlex.split(a.llama_args))
    if not can_limit():
        return
    size, rate = size_and_rate(a.model)
    print(f"model {a.model}: {size / 1e9:.2f} GB; device rate {rate / 1e9:.2f} GB/s; "
          f"{a.tokens} tokens a run, medians of {a.rounds}")
    subprocess.run(["cat", a.model], stdout=subprocess.DEVNULL, check=True)
    ref = {m: generate(a.llama_cli, a.model, a.tokens, m)["tokens"] for m in ("plain", "no-repack")}
    # Where weightmap's plan is fits, the flag changes nothing: plain's
    # kernels; over the budget it stops the repacking.
    reference = lambda mode, plan: ref["plain" if mode == "plain" or plan == "fits" else "no-repack"]
    print(f"in memory, tokens: {ref['plain']!r} (no-repack: {ref['no-repack']!r})")
    for label, cold in () if a.no_in_memory else (("warm", False), ("cold", True)):
        runs = {m: [] for m in ("plain", "weightmap")}
        for _ in range(a.rounds):
            for mode in runs:
                if cold:
                    evict(a.model)
                runs[mode].append(generate(a.llama_cli, a.model, a.tokens, mode))
        report(label, runs, reference)
    for fraction in (float(f) for f in a.fractions.split(",") if f):
        limit = int(size * fraction)
        print(f"cgroup {fraction}x the file ({limit / 2**20:.0f} MiB), cold:")
        runs = {m: [] for m in a.modes.split(",")}
        for _ in range(a.rounds):
            for mode in runs:
                evict(a.model)
                runs[mode].append(generate(a.llama_cli, a.model, a.tokens, mode, limit, a.timeout))
        report(f"{fraction}x", runs, reference)


if __name__ == "__main__":
    main()
