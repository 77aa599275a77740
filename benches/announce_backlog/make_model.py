"""A small mixture-of-experts GGUF for issue 54's announcement figures: a
58 MiB tensor read whole (blk.0.attn_q.weight) and 8 experts of 60 MiB
(blk.0.ffn_up_exps.weight), 538 MiB in all, written to ./moe.gguf. In a
450 MiB cgroup its dense part fits and its experts do not
(`stream experts`). Needs gguf-py.

    python benches/announce_backlog/make_model.py
"""
import gguf
import numpy as np

w = gguf.GGUFWriter("moe.gguf", "olmoe")
w.add_tensor("blk.0.attn_q.weight", np.full(58 * 2**18, 1, dtype=np.float32))
w.add_tensor("blk.0.ffn_up_exps.weight", np.ones((8, 60, 2**18), dtype=np.float32))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
