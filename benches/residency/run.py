#!/usr/bin/env python3
"""Decode of a model larger than memory: a plain mapping against weightmap
with announcements, side by side, cold, each run in a fresh cgroup-v1 memory
cgroup of a fraction of the file's size, with the physical limit.

    sudo python3 benches/residency/run.py REPLAY MODEL [--fractions 0.5,0.25]
        [--routings uniform,zipf] [--tokens 12] [--rounds 1]

--modes takes the replay's modes (plain, announce, defaults), each as
MODE@BINARY to run another build side by side, and MODE+guessP for
announce with a guess of each layer's experts right with probability P.

REPLAY is the `moe_replay` example (cargo build --release --example
moe_replay); MODEL a GGUF of llama.cpp's MoE layout (benches/residency/
moe_gguf.py writes the OLMoE-1B-7B and Qwen3-30B-A3B layouts with SYNTHETIC
weights). The routing is SYNTHETIC too (moe_replay's --routing).

The physical limit: the bytes a token must read however it is cached (the
fewer of the best fixed resident set and an LRU cache, each holding the
cgroup's limit less 64 MiB, each starting empty, as the run does),
divided by this disk's rate (the fastest of four dd iflag=direct bs=8M
at once, a cold read through the page cache, and the same read from
inside a cgroup of 64 MiB, measured here: on this machine's virtual disk
the second has been up to twice the first, and the third up to three
times the second), and never more than the in-memory rate (the same
replay on the page-cached file, no cgroup). It is computed over the same tokens as each
tok/s figure: tokens 2 to N, and the second half. Every run's checksum
must be the in-memory run's: the same bytes were read.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = "/sys/fs/cgroup/memory"


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def dd_rate(path, streams=4):
    """Bytes a second read with O_DIRECT, cold: `streams` dd processes at
    once, each a part of the file, as a device reads with several reads in
    flight (one dd alone, one 8 MiB read at a time, read this disk at as
    little as half the rate weightmap's read-ahead reached)."""
    evict(path)
    blocks = -(-os.path.getsize(path) // (8 << 20))
    each = -(-blocks // streams)
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["dd", f"if={path}", "of=/dev/null", "bs=8M", "iflag=direct",
                               f"skip={k * each}", f"count={each}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for k in range(streams)]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError(f"dd failed on {path}")
    return os.path.getsize(path) / (time.perf_counter() - t0)


def buffered_rate(path):
    """Bytes a second read through the page cache, cold, 8 MiB a read: the
    kernel's own read-ahead, which on this machine's virtual disk has read
    faster than O_DIRECT."""
    evict(path)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    rate = os.path.getsize(path) / (time.perf_counter() - t0)
    evict(path)
    return rate


def recycled_rate(path, room=64 << 20):
    """[`buffered_rate`], read from inside a memory cgroup of `room` bytes,
    whose page cache is reclaimed and its pages used again as the read goes,
    as in every run here. This machine is a virtual machine that hands free
    pages back to its host, presumably why a read into pages not used since
    is slower: on the 3.9 GB OLMoE file, 2.3 GB/s here against 0.8 with no
    cgroup (BENCHMARKS.md, "the device's rate, read through a small
    cgroup")."""
    here = os.path.dirname(os.path.abspath(__file__))
    read = f"import sys; sys.path.insert(0, {here!r}); import run; print(run.buffered_rate(sys.argv[1]))"
    rate, _ = run_in_cgroup([sys.executable, "-c", read, path], room, parse=lambda p: float(p.stdout))
    if isinstance(rate, dict):
        raise RuntimeError(f"reading {path} in a cgroup failed: {rate}")
    return rate


def can_limit():
    """Whether this process can make memory cgroups; says why not when not."""
    if os.geteuid() != 0 or not os.access(ROOT, os.W_OK):
        print(f"SKIPPED: needs root and a writable cgroup-v1 memory controller at {ROOT}")
        return False
    return True


def size_and_rate(path):
    """The file's size, and the device's rate: the fastest of the medians of
    three cold O_DIRECT reads ([`dd_rate`]), of three cold reads through
    the page cache ([`buffered_rate`]), and of three such reads from inside
    a small cgroup ([`recycled_rate`]), each printed."""
    direct = statistics.median(dd_rate(path) for _ in range(3))
    buffered = statistics.median(buffered_rate(path) for _ in range(3))
    recycled = statistics.median(recycled_rate(path) for _ in range(3))
    print(f"device rate: O_DIRECT {direct / 1e9:.2f} GB/s, through the page cache "
          f"{buffered / 1e9:.2f} GB/s, the same in a cgroup of 64 MiB {recycled / 1e9:.2f} GB/s; "
          f"the limit takes the fastest")
    return os.path.getsize(path), max(direct, buffered, recycled)


def run_in_cgroup(cmd, limit=None, parse=lambda proc: json.loads(proc.stdout), timeout=None):
    """Run `cmd`, in a fresh memory cgroup of `limit` bytes (None: none), and
    return what `parse` makes of it (the finished process; default: its
    JSON output), or {"failed": status or "timeout", "stderr": ...}, with
    how many times the kernel's OOM killer ran in the cgroup. After
    `timeout` seconds (None: none) the command is killed."""
    cg = None
    if limit is not None:
        cg = f"{ROOT}/weightmap-residency-{os.getpid()}"
        os.mkdir(cg)
    try:
        if cg:
            with open(f"{cg}/memory.limit_in_bytes", "w") as f:
                f.write(str(limit))
            cmd = ["sh", "-c", 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"', "sh", cg, *cmd]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess(cmd, f"timeout after {timeout} s", "", "")
        kills = 0
        if cg:
            with open(f"{cg}/memory.oom_control") as f:
                kills = int(next((l.split()[1] for l in f if l.startswith("oom_kill ")), "0"))
        if proc.returncode != 0:
            return {"failed": proc.returncode, "stderr": proc.stderr[-300:]}, kills
        return parse(proc), kills
    finally:
        if cg:
            os.rmdir(cg)


def replay(binary, model, args, limit=None):
    """One replay's JSON, in a cgroup of `limit` bytes (None: none), with
    whether the kernel's OOM killer ran in it."""
    return run_in_cgroup([binary, model, "--json", *args], limit)


def mode_args(mode, binary):
    """The replay and its options for a --modes entry: MODE, MODE@BINARY
    (another build, side by side), with `+guessP` for a guess of each
    layer's experts right with probability P (MODE+guess0.8)."""
    mode, _, other = mode.partition("@")
    mode, _, guess = mode.partition("+guess")
    args = ["--mode", mode] + (["--guess", guess] if guess else [])
    return other or binary, args


def add_case_args(p, tokens, rounds):
    """The options that say which cases run: cgroup fractions, routings,
    tokens a run and rounds."""
    p.add_argument("--fractions", default="0.5,0.25")
    p.add_argument("--routings", default="uniform,zipf")
    p.add_argument("--tokens", type=int, default=tokens)
    p.add_argument("--rounds", type=int, default=rounds)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("replay")
    p.add_argument("model")
    add_case_args(p, tokens=12, rounds=1)
    p.add_argument("--modes", default="plain,announce")
    a = p.parse_args()
    if not can_limit():
        return
    size, rate = size_and_rate(a.model)
    print(f"model {a.model}: {size / 1e9:.2f} GB; device rate {rate / 1e9:.2f} GB/s "
          f"(weights and routing SYNTHETIC)")
    rows = []
    for routing in a.routings.split(","):
        common = ["--routing", routing, "--tokens", str(a.tokens)]
        # In memory: the file read into the page cache first, no cgroup.
        subprocess.run(["cat", a.model], stdout=subprocess.DEVNULL, check=True)
        mem, _ = replay(a.replay, a.model, ["--mode", "plain", *common])
        for fraction in (float(f) for f in a.fractions.split(",")):
            limit = int(size * fraction)
            runs = {m: [] for m in a.modes.split(",")}
            for _ in range(a.rounds):
                for mode in runs:
                    evict(a.model)
                    binary, args = mode_args(mode, a.replay)
                    r, kills = replay(binary, a.model, [*args, "--budget", str(limit), *common], limit)
                    r["oom_kills"] = kills
                    runs[mode].append(r)
            rows.append((routing, fraction, mem, runs, rate))
            report(rows[-1])
    print(json.dumps([{"routing": r, "fraction": f, "in_memory": m, "runs": x,
                       "direct_rate": d} for r, f, m, x, d in rows]))


def must_read(run, first):
    """Bytes a token must read over tokens `first` to the last, cold from the
    first token on: the fewer of the best fixed resident set's (each of its
    parts read when first used) and an LRU cache's."""
    def per_token(missed):
        return sum(missed[first:]) / len(missed[first:])
    return min(per_token(run["fixed_token_missed"]), per_token(run["lru_token_missed"]))


def report(row):
    routing, fraction, mem, runs, rate = row
    measured = next((r for rs in runs.values() for r in rs if r.get("fixed_token_missed")), None)

    def limit(missed, in_memory):
        return in_memory if not missed else min(in_memory, rate / missed)
    # tok/s is over tokens 2 to N, and again over the second half, once the
    # resident set has filled: each against what those same tokens must read.
    n = len(measured["fixed_token_missed"]) if measured else 0
    missed, late_missed = (must_read(measured, 1), must_read(measured, n // 2)) if measured else (None, None)
    whole, late = limit(missed, mem["tok_s"]), limit(late_missed, later_tok_s(mem))
    print(f"\n{routing} routing, cgroup {fraction}x the file: in memory {mem['tok_s']:.2f} tok/s, "
          f"{mem['touched_bytes_per_token'] / 1e6:.0f} MB touched a token; must read "
          f"{(missed or 0) / 1e6:.0f} MB a token (second half {(late_missed or 0) / 1e6:.0f}); "
          f"physical limit {whole:.2f} tok/s (second half {late:.2f})")
    if measured:
        # The figure before the fixed set's own first reads were counted: as
        # if it started full.
        warm = min(measured["fixed_missed_per_token"], measured["lru_missed_per_token"])
        print(f"  (a fixed set that starts full: {warm / 1e6:.0f} MB a token, "
              f"limit {limit(warm, mem['tok_s']):.2f} tok/s)")
    for mode, rs in runs.items():
        ok = [r for r in rs if "tok_s" in r]
        if not ok:
            print(f"  {mode:9s} failed: {rs}")
            continue
        tok_s = statistics.median(r["tok_s"] for r in ok)
        late_tok_s = statistics.median(later_tok_s(r) for r in ok)
        late_read = statistics.median(later_read(r) for r in ok)
        first = statistics.median(r["first_token_ms"] for r in ok)
        read = statistics.median(r["read_bytes_per_token"] for r in ok)
        same = all(r["checksum"] == mem["checksum"] for r in ok)
        kills = sum(r["oom_kills"] for r in rs)
        print(f"  {mode:9s} {tok_s:7.2f} tok/s ({tok_s / whole:4.0%} of the limit)  first token "
              f"{first:8.1f} ms  read {read / 1e6:7.0f} MB a token  bytes "
              f"{'same' if same else 'DIFFER'}  OOM kills {kills}")
        print(f"  {'':9s} second half of the tokens: {late_tok_s:7.2f} tok/s "
              f"({late_tok_s / late:4.0%} of its limit), read {late_read / 1e6:7.0f} MB a token")


def later_tok_s(run):
    """tok/s over the second half of a run's tokens, once its resident set
    has filled."""
    ms = run["token_ms"][len(run["token_ms"]) // 2:]
    return 1e3 * len(ms) / sum(ms)


def later_read(run):
    """Bytes read a token over the second half of a run's tokens."""
    read = run["token_read_bytes"][len(run["token_read_bytes"]) // 2:]
    return sum(read) / len(read)


if __name__ == "__main__":
    main()
