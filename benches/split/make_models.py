"""Two 100 MiB F32 tensors (blk.0/blk.1.attn_q.weight), written as one file
(one.gguf) and as a llama.cpp split of one tensor a shard
(split-0000N-of-00002.gguf), into the current directory: the case of issue
54's split models. Needs gguf-py (pip install gguf).

    python benches/split/make_models.py
"""
import gguf
import numpy as np


def tensor(layer):
    return np.full(100 * 2**18, layer + 1, dtype=np.float32)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


one = gguf.GGUFWriter("one.gguf", "llama")
for layer in range(2):
    one.add_tensor(f"blk.{layer}.attn_q.weight", tensor(layer))
finish(one)
for layer in range(2):
    w = gguf.GGUFWriter(f"split-{layer + 1:05}-of-00002.gguf", "llama")
    w.add_uint16("split.no", layer)
    w.add_uint16("split.count", 2)
    w.add_int32("split.tensors.count", 2)
    w.add_tensor(f"blk.{layer}.attn_q.weight", tensor(layer))
    finish(w)
