#!/usr/bin/env python3
"""The pinned llama.cpp generating tokens on a model larger than memory:
its own mmap against the same with weightmap's announcing hook
(wm_ggml_announce as its eval callback), side by side, cold, each run in a
fresh cgroup-v1 memory cgroup of a fraction of the file's size.

    sudo python3 benches/residency/llama_proof.py LLAMA_GEN MODEL
        [--fractions 0.5] [--tokens 16] [--rounds 3] [--modes plain,announce]

The modes: plain (llama.cpp's own mapping alone), announce (with the
hook), each as MODE@LLAMA_GEN to run another build side by side, and
announce with options after `+`: predict (the hook's predictor
on, WEIGHTMAP_PREDICT=1; its hit rate is reported), nofollow (the hook
leaves llama.cpp's mapping unfollowed, WEIGHTMAP_FOLLOW=0: weightmap's
advice and releases act on its own mapping only), noahead (a batch's next
layer is not read ahead, WEIGHTMAP_BATCH_AHEAD=0); announce+predict+nofollow
takes both.

LLAMA_GEN is benches/residency/llama_gen built (benches/residency/
llama_gen.sh builds it and runs this). llama.cpp's own router picks the
experts; on the files benches/residency/moe_gguf.py writes, the weights are
SYNTHETIC, so the tokens mean nothing, but they must be the same in every
run: the in-memory run's (the file page-cached first, no cgroup).

Reports per mode the median tokens/s after the first token, the first
token's time (prompt included), and the bytes read from storage per
generated token while generating (llama_gen's /proc/self/io, the prompt's
decode included; the load, where llama.cpp populates its mapping, is not),
with the OOM kills; and, over the budget, how many distinct expert slices llama.cpp's
router chose (the hook's count): with synthetic weights its choices say
nothing of a real model's.

With --prompt N, the prompt is N tokens decoded as one batch (a
prefill), and each mode also reports the prompt's time and the bytes it
read, against its limit: the slower of the in-memory run's prompt and the
whole file read at the device rate (cold, a prompt that names most experts
reads about all of it). These machines' compute speed drifts by a third
within minutes, so the in-memory run is made again in every round, beside
the cold ones: the share of the limit is the median over the rounds of
each round's own.

The LRU bound: llama.cpp's router's own choices (the hook's run's,
decode by decode) replayed through an LRU cache of expert slices holding
the cgroup's limit less the tensors not stored by experts and 64 MiB,
starting empty as the cold run does; the bytes it misses a token after the
first, divided by the device rate, never faster than in memory. For a
dense model, the limit: the bytes of the tensors that cannot stay in that
room (all of them less the room) read each token at the device rate,
never faster than in memory.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import can_limit, evict, run_in_cgroup, size_and_rate  # noqa: E402


RESERVE = 64 << 20


NAN = float("nan")


def cpu(r):
    """The prompt's CPU seconds, user and kernel (nan from a llama_gen too
    old to count them)."""
    return r.get("prompt_user_s", NAN) + r.get("prompt_sys_s", NAN)


def lru_missed(routing, room, decodes):
    """Bytes an LRU cache of `room` bytes of expert slices, empty at first,
    misses over `routing` ([decode, tensor, slice bytes, expert...] in
    order), in the decodes after the first, a decode."""
    cache, held, missed = OrderedDict(), 0, 0
    for decode, tensor, size, *experts in routing:
        for e in experts:
            key = (tensor, e)
            if key in cache:
                cache.move_to_end(key)
                continue
            missed += size if decode > 0 else 0
            cache[key] = size
            held += size
            while held > room and cache:
                held -= cache.popitem(last=False)[1]
    return missed / max(decodes - 1, 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("llama_gen")
    p.add_argument("model")
    p.add_argument("--fractions", default="0.5")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default="plain,announce")
    p.add_argument("--prompt", type=int, default=0,
                   help="a prompt of this many tokens, decoded as one batch (a prefill)")
    a = p.parse_args()
    if not can_limit():
        return
    size, rate = size_and_rate(a.model)
    print(f"model {a.model}: {size / 1e9:.2f} GB; device rate {rate / 1e9:.2f} GB/s")
    options = {"predict": "WEIGHTMAP_PREDICT=1", "nofollow": "WEIGHTMAP_FOLLOW=0",
               "noahead": "WEIGHTMAP_BATCH_AHEAD=0"}

    def gen(mode, limit):
        mode, _, binary = mode.partition("@")
        mode, *asked = mode.split("+")
        env = ["env", *(options[o] for o in asked)] if asked else []
        prompt = [str(a.prompt)] if a.prompt else []
        return run_in_cgroup([*env, binary or a.llama_gen, a.model, str(a.tokens), mode, *prompt], limit)
    subprocess.run(["cat", a.model], stdout=subprocess.DEVNULL, check=True)
    mem, _ = gen("plain", None)
    print(f"in memory: {mem['tok_s']:.2f} tok/s, first token {mem['first_token_s']:.2f} s, "
          f"tokens {mem['tokens']}")
    rows = []
    for fraction in (float(f) for f in a.fractions.split(",")):
        limit = int(size * fraction)
        runs = {m: [] for m in a.modes.split(",")}
        mems = []
        for _ in range(a.rounds):
            if a.prompt:
                subprocess.run(["cat", a.model], stdout=subprocess.DEVNULL, check=True)
                mems.append(gen("plain", None)[0])
            for mode in runs:
                evict(a.model)
                r, kills = gen(mode, limit)
                r["oom_kills"] = kills
                runs[mode].append(r)
        print(f"\ncgroup {fraction}x the file ({limit / 2**20:.0f} MiB):")
        for mode, rs in runs.items():
            ok = [r for r in rs if "tok_s" in r]
            if not ok:
                print(f"  {mode:9s} failed: {rs}")
                continue
            tok_s = statistics.median(r["tok_s"] for r in ok)
            first = statistics.median(r["first_token_s"] for r in ok)
            read = statistics.median(r["gen_read_bytes"] / a.tokens for r in ok)
            same = all(r["tokens"] == mem["tokens"] for r in ok)
            kills = sum(r["oom_kills"] for r in rs)
            print(f"  {mode:9s} {tok_s:6.2f} tok/s ({tok_s / mem['tok_s']:4.0%} of in memory)  "
                  f"first token {first:6.2f} s  read {read / 1e6:6.0f} MB a token  tokens "
                  f"{'same' if same else 'DIFFER'}  OOM kills {kills}  runs {len(ok)}/{len(rs)}")
            if a.prompt:
                # Cold, a prefill reads every tensor it touches at least
                # once: the file, at the device rate, or computes as fast
                # as in memory, whichever is slower.
                prompt_s = statistics.median(r["prompt_s"] for r in ok)
                prompt_read = statistics.median(r["prompt_read_bytes"] for r in ok)
                in_memory = statistics.median(m["prompt_s"] for m in mems)
                bound = max(in_memory, size / rate)
                share = statistics.median(max(m["prompt_s"], size / rate) / r["prompt_s"]
                                          for m, r in zip(mems, rs) if "prompt_s" in r)
                print(f"            prompt of {ok[0]['prompt_tokens']} tokens: {prompt_s:.2f} s, read "
                      f"{prompt_read / 1e6:.0f} MB; limit {bound:.2f} s (in memory {in_memory:.2f} s, "
                      f"the file at the device rate {size / rate:.2f} s): {share:.0%} of it, round by round; "
                      f"CPU {statistics.median(map(cpu, ok)):.1f} s, "
                      f"{statistics.median(r.get('prompt_sys_s', NAN) for r in ok):.2f} s of it in the kernel "
                      f"(in memory {statistics.median(map(cpu, mems)):.1f} s)"
                      + (f"; {ok[0]['read_ahead_whole']} expert tensors read ahead whole"
                         if "read_ahead_whole" in ok[0] else ""))
            if ok[0].get("whole_bytes") and not ok[0].get("expert_slices_announced"):
                # A dense model: what cannot stay is read every token.
                must = max(ok[0]["whole_bytes"] - (limit - RESERVE), 0)
                bound = min(mem["tok_s"], rate / must) if must else mem["tok_s"]
                print(f"            limit: {must / 1e6:.0f} MB a token cannot stay, {bound:.2f} tok/s; "
                      f"{mode} at {tok_s / bound:.0%} of it")
            if ok[0].get("expert_slices_announced"):
                # What llama.cpp's router chose, as the hook saw it.
                r = ok[0]
                print(f"            router: {r['expert_slices_distinct']} distinct expert slices, "
                      f"{r['expert_slices_announced']} announced over {a.tokens} decodes; per expert "
                      f"tensor {r['distinct_experts_per_tensor']} distinct experts (min, median, max), "
                      f"the most used chosen in {r['most_used_share']}")
                missed = lru_missed(r["routing"], limit - r["whole_bytes"] - RESERVE, a.tokens)
                bound = min(mem["tok_s"], rate / missed) if missed else mem["tok_s"]
                if r.get("predict"):
                    hits, misses = r["predicted_hits"], r["predicted_misses"]
                    print(f"            predictor: {r['predicted_layers']} layers guessed, "
                          f"{hits} of {hits + misses} chosen experts guessed ({hits / max(hits + misses, 1):.0%})")
                print(f"            llama.cpp's mapping: {r['following']} weights followed, "
                      f"{r['follow_refused']} refused")
                print(f"            LRU bound: {missed / 1e6:.0f} MB missed a token, {bound:.2f} tok/s; "
                      f"{mode} at {tok_s / bound:.0%} of it")
        rows.append({"fraction": fraction, "in_memory": mem, "in_memory_by_round": mems, "runs": runs,
                     "direct_rate": rate})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
