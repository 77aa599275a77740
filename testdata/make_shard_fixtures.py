#!/usr/bin/env python3
"""Write the sharded-model fixtures with the reference writers.

    pip install gguf==0.19.0 safetensors numpy && python3 testdata/make_shard_fixtures.py

- testdata/shards/split-0000N-of-00003.gguf: gguf-py's GGUFWriter with
  split_max_tensors=2 (llama.cpp's split layout: `split.no`, `split.count`,
  `split.tensors.count`, names NAME-%05d-of-%05d.gguf, metadata in the first
  shard only).
- testdata/shards/hf/model-0000N-of-00002.safetensors and
  model.safetensors.index.json: safetensors' numpy writer per shard, and the
  index in the layout Hugging Face tools write ({"metadata": {"total_size":
  ...}, "weight_map": {tensor: file}}).
- testdata/shards/manifest.json: every tensor's shard, dtype, shape and the
  sha256 of its bytes, computed here from the arrays written.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from safetensors.numpy import save_file

OUT = Path(__file__).resolve().parent / "shards"


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20261201)
    t: dict[str, np.ndarray] = {}
    t["token_embd.weight"] = rng.standard_normal((7, 32), dtype=np.float32)
    for i in range(2):
        t[f"blk.{i}.attn_norm.weight"] = rng.standard_normal(32, dtype=np.float32)
        t[f"blk.{i}.attn_q.weight"] = rng.standard_normal((32, 32)).astype(np.float16)
    t["output.weight"] = rng.standard_normal((7, 32), dtype=np.float32)
    return t


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def main() -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / "hf").mkdir(exist_ok=True)
    ts = tensors()
    manifest: dict = {"gguf": {}, "safetensors": {}}

    # Split GGUF: 6 tensors, at most 2 per shard -> 3 shards.
    w = GGUFWriter(OUT / "split.gguf", "llama", split_max_tensors=2)
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(32)
    for name, a in ts.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    names = list(ts)
    for i, name in enumerate(names):
        manifest["gguf"][name] = {
            "shard": f"split-{i // 2 + 1:05d}-of-00003.gguf",
            "sha256": sha(ts[name]),
        }

    # Sharded safetensors: layers 0 in shard 1, the rest in shard 2.
    first = {k: v for k, v in ts.items() if k.startswith("token_embd") or k.startswith("blk.0.")}
    second = {k: v for k, v in ts.items() if k not in first}
    files = {
        "model-00001-of-00002.safetensors": first,
        "model-00002-of-00002.safetensors": second,
    }
    weight_map = {}
    total = 0
    for fname, part in files.items():
        save_file(part, str(OUT / "hf" / fname), metadata={"format": "np"})
        for k, v in part.items():
            weight_map[k] = fname
            total += v.nbytes
            manifest["safetensors"][k] = {"shard": fname, "sha256": sha(v)}
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (OUT / "hf" / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
