"""Tensor-parallel loading with weightmap.safe_open, as vLLM and TGI shard
weights: every rank opens the same safetensors file and takes its shard of
each 2-D weight with `get_slice(name)[...]`.

    torchrun --nproc-per-node 2 python/examples/tp_load.py MODEL.safetensors

(gloo, CPU.) Names are Hugging Face's llama ones, as `weightmap gen
--format safetensors` writes them:

- column-parallel (the output dimension is split): q_proj, k_proj, v_proj,
  gate_proj, up_proj, and the vocabulary-parallel embed_tokens and lm_head:
  rank r takes rows `[r*n/R, (r+1)*n/R)`, `slice_[a:b]`. Those rows are
  contiguous in the file: the shard is a zero-copy view of the mapping, and
  reading it faults in only its own pages.
- row-parallel (the input dimension is split): o_proj, down_proj: rank r
  takes columns, `slice_[:, a:b]`. Still a zero-copy view (a strided one),
  but each row's part lies between the other ranks' parts, so reading it
  faults in every page holding any of its elements: when a row's part is
  shorter than a page, that is every page of the tensor. A column shard
  costs the whole tensor's pages of page cache (resident file bytes, shared
  between the ranks, not RssAnon); making it contiguous (`.contiguous()`,
  or copying it into a parameter, as vLLM does) costs its own size of
  anonymous memory besides.

Each rank keeps its shards as views, reads every element of them (a sum),
then prints its RssAnon growth and the bytes of the file it made resident
(the `Rss` of the file's mapping in /proc/self/smaps: pages this process
has faulted in), split into row and column shards' tensors. Then the
ranks all-gather every shard (copies, for the collective) and check that
the shards make up each whole tensor bit for bit, as another safe_open of
the file gives it. Exits non-zero on any mismatch.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

import weightmap

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
ROW = ("o_proj", "down_proj")


def kind(name):
    """"column" or "row" parallel, or None for a weight left whole."""
    if any(p in name for p in COLUMN):
        return "column"
    if any(p in name for p in ROW):
        return "row"
    return None


def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def file_rss(path):
    """Bytes of `path`'s mappings resident in this process (smaps' Rss)."""
    path = os.path.realpath(path)
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if not fields:
                continue
            if fields[0].endswith(":"):  # "Rss:  123 kB" and the like
                if inside and fields[0] == "Rss:":
                    total += int(fields[1]) * 1024
            else:  # a mapping: "start-end perms offset dev inode [path]"
                inside = len(fields) >= 6 and fields[5] == path
    return total


def bounds(n, rank, world):
    return n * rank // world, n * (rank + 1) // world


def mib(n):
    return f"{n / 2**20:.1f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    anon0 = rss_anon()
    shards = {}
    full_bytes = {"row": 0, "column": 0}
    shard_bytes = {"row": 0, "column": 0}
    with weightmap.safe_open(a.model, framework="pt") as f:
        for name in f.offset_keys():
            k = kind(name)
            s = f.get_slice(name)
            shape = s.get_shape()
            if k is None or len(shape) != 2:
                continue
            rows, cols = shape
            if k == "column":
                lo, hi = bounds(rows, rank, world)
                t = s[lo:hi]  # contiguous rows: a view of the mapping
            else:
                lo, hi = bounds(cols, rank, world)
                t = s[:, lo:hi]  # strided columns: a view too
            shards[name] = (k, t)
            full_bytes[k] += rows * cols * t.element_size()
            shard_bytes[k] += t.numel() * t.element_size()
    # Read every element of every shard (views: nothing is copied).
    for k, t in shards.values():
        t.sum()
    anon = rss_anon() - anon0
    resident = file_rss(a.model)
    print(
        f"rank {rank}/{world}: {len(shards)} shards, RssAnon +{mib(anon)}, "
        f"{mib(resident)} of the file resident; row shards (column-parallel) "
        f"{mib(shard_bytes['column'])} of {mib(full_bytes['column'])}, column shards "
        f"(row-parallel) {mib(shard_bytes['row'])} of {mib(full_bytes['row'])}",
        flush=True,
    )

    # The shards make up the whole tensors: all-gather and compare.
    bad = 0
    with weightmap.safe_open(a.model, framework="pt") as f:
        for name, (k, t) in shards.items():
            parts = [None] * world
            dist.all_gather_object(parts, (rank, t.contiguous()))
            parts = [p for _, p in sorted(parts, key=lambda x: x[0])]
            whole = torch.cat(parts, dim=0 if k == "column" else 1)
            want = f.get_tensor(name)
            same = whole.shape == want.shape and torch.equal(
                whole.contiguous().view(-1).view(torch.uint8), want.contiguous().view(-1).view(torch.uint8)
            )
            if not same:
                bad += 1
                print(f"rank {rank}: {name}: the shards do not make up the tensor", file=sys.stderr)
    total = torch.tensor([bad])
    dist.all_reduce(total)
    if rank == 0:
        print(f"{len(shards)} tensors sharded over {world} ranks: "
              + ("every one whole again" if total.item() == 0 else f"{total.item()} mismatched"))
    dist.barrier()
    dist.destroy_process_group()
    return 1 if total.item() else 0


if __name__ == "__main__":
    sys.exit(main())
