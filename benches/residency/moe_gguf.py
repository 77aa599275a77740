#!/usr/bin/env python3
"""Write a synthetic mixture-of-experts GGUF in a real model's layout, with
gguf-py's own writer: OLMoE-1B-7B (16 layers, hidden 2048, 64 experts, top-8,
expert FFN 1024, vocab 50304) or Qwen3-30B-A3B (48 layers, hidden 2048, 128
experts, top-8, expert FFN 768, vocab 151936). The tensor names, shapes and
keys are llama.cpp's (`olmoe`, `qwen3moe`); the weights are SYNTHETIC: Q4_0
blocks of random nibbles under a small fixed scale (norms are ones), as no
real MoE weights can be downloaded here. Every figure measured on these
files says so.

The files route like a model's in llama.cpp: each token goes to experts of
its own, and so sampled tokens spread over most experts of a tensor. Two
choices make that so (weightmap.synthetic = 3 in the file's keys):
  - the nibbles are symmetric, 1..15 (values -7..7, mean 0). Drawn from
    0..15 (mean -0.5), every layer adds the same drift to every token,
    which swamps each token's identity: every token, prompt or generated,
    then went to the same 8 of 64 experts of a tensor;
  - the token embedding's scale is far larger than the layers'
    (EMBED_SCALE), so that a token's own vector, not what the layers add,
    is most of what each router sees. What the attention adds is a mix of
    every earlier token's, alike for all of them, and it grows layer after
    layer. At 0.05 (weightmap.synthetic = 2), the OLMoE layout's 48 expert
    tensors each saw 26 / 35 / 59 (min / median / max) of the 64 experts
    over 24 tokens in llama.cpp, the most used chosen in 31% / 94% / 100%
    of them; at 0.5, 59 / 61 / 62 and 31% / 38% / 50% (benches/residency/
    llama_gen.sh, BENCHMARKS.md).
The "mini" layout (4 layers, hidden 256, 32 experts, top-4; with the
GPT-NeoX vocab, 30 MB, half of it expert tensors) is a file for tests:
llama.cpp loads it as OLMoE.

    python3 benches/residency/moe_gguf.py OUT.gguf [olmoe|qwen3moe] [--layers N] [--seed S]
        [--vocab VOCAB.gguf]

--layers keeps the layout but writes fewer layers (a small file for tests).
--vocab copies the tokenizer of one of llama.cpp's vocab files
(models/ggml-vocab-*.gguf: gpt-neox for OLMoE, qwen2 for Qwen3), its
tokens cut or padded to the layout's vocab, so that llama.cpp loads the
file and can generate from a prompt. Needs numpy and gguf (gguf-py).
"""
import argparse
import numpy as np
import gguf

LAYOUTS = {
    # arch: (layers, hidden, experts, used, expert_ffn, vocab, heads, kv_heads, head_dim, q/k norm width)
    # pre: llama.cpp's pre-tokenizer name, where the vocab file lacks one.
    "olmoe": dict(layers=16, hidden=2048, experts=64, used=8, ffn=1024, vocab=50304,
                  heads=16, kv_heads=16, head_dim=128, qk_norm="full", shared=False, pre="olmo"),
    "mini": dict(layers=4, hidden=256, experts=32, used=4, ffn=256, vocab=50304,
                 heads=4, kv_heads=4, head_dim=64, qk_norm="full", shared=False, pre="olmo", arch="olmoe"),
    "qwen3moe": dict(layers=48, hidden=2048, experts=128, used=8, ffn=768, vocab=151936,
                     heads=32, kv_heads=4, head_dim=128, qk_norm="head", shared=False, pre="qwen2"),
}

Q4_0 = gguf.GGMLQuantizationType.Q4_0
F32 = gguf.GGMLQuantizationType.F32
BLOCK, BLOCK_BYTES = 32, 18
# f16 0.0022: small enough that a matmul over thousands of random nibbles
# stays finite.
SCALE = np.frombuffer(np.float16(0.0022).tobytes(), dtype=np.uint8)
# The token embedding's, large beside what the layers add (above).
EMBED_SCALE = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)


def tensors(a):
    """(name, ne (ggml order, innermost first), type) in llama.cpp's order."""
    h, q = a["hidden"], a["heads"] * a["head_dim"]
    kv = a["kv_heads"] * a["head_dim"]
    out = [("token_embd.weight", [h, a["vocab"]], Q4_0)]
    for i in range(a["layers"]):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", [h], F32),
            (b + "attn_q.weight", [h, q], Q4_0),
            (b + "attn_k.weight", [h, kv], Q4_0),
            (b + "attn_v.weight", [h, kv], Q4_0),
            (b + "attn_output.weight", [q, h], Q4_0),
        ]
        if a["qk_norm"] == "full":
            out += [(b + "attn_q_norm.weight", [q], F32), (b + "attn_k_norm.weight", [kv], F32)]
        else:
            out += [(b + "attn_q_norm.weight", [a["head_dim"]], F32),
                    (b + "attn_k_norm.weight", [a["head_dim"]], F32)]
        out += [
            (b + "ffn_norm.weight", [h], F32),
            (b + "ffn_gate_inp.weight", [h, a["experts"]], F32),
            (b + "ffn_gate_exps.weight", [h, a["ffn"], a["experts"]], Q4_0),
            (b + "ffn_up_exps.weight", [h, a["ffn"], a["experts"]], Q4_0),
            (b + "ffn_down_exps.weight", [a["ffn"], h, a["experts"]], Q4_0),
        ]
    out += [("output_norm.weight", [h], F32), ("output.weight", [h, a["vocab"]], Q4_0)]
    return out


def byte_shape(ne, ty):
    """numpy shape (outermost first) of the tensor's bytes."""
    shape = list(reversed(ne))
    if ty == Q4_0:
        shape[-1] = shape[-1] // BLOCK * BLOCK_BYTES
    else:
        shape[-1] *= 4
    return shape


def data(ne, ty, rng, name):
    if ty == F32:
        # Norms are ones; the router is small random values.
        if "gate_inp" in name:
            v = rng.standard_normal(int(np.prod(ne)), dtype=np.float32) * 0.02
        else:
            v = np.ones(int(np.prod(ne)), dtype=np.float32)
        return v.view(np.uint8).reshape(byte_shape(ne, ty))
    rows = int(np.prod(ne[1:]))
    blocks = ne[0] // BLOCK
    b = np.empty((rows, blocks, BLOCK_BYTES), dtype=np.uint8)
    n = rng.integers(1, 16, size=(rows, blocks, BLOCK_BYTES - 2, 2), dtype=np.uint8)
    b[:, :, 2:] = n[..., 0] | (n[..., 1] << 4)  # two symmetric nibbles a byte (above)
    b[:, :, 0:2] = EMBED_SCALE if name == "token_embd.weight" else SCALE
    return b.reshape(byte_shape(ne, ty))


# The per-token arrays of a vocab file, and what pads each past its end
# (the vocab files pad with "[PADn]" tokens of type USER_DEFINED).
PER_TOKEN = {
    "tokenizer.ggml.tokens": lambda i: f"[PAD{i}]",
    "tokenizer.ggml.token_type": lambda i: int(gguf.TokenType.USER_DEFINED),
    "tokenizer.ggml.scores": lambda i: 0.0,
}


def add_vocab(w, path, n_vocab, pre):
    """Copy the tokenizer.* keys of the vocab file at `path`, its per-token
    arrays cut or padded to `n_vocab` tokens, and `pre` as the pre-tokenizer
    where it names none."""
    r = gguf.GGUFReader(path)
    if "tokenizer.ggml.pre" not in r.fields:
        w.add_tokenizer_pre(pre)
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        v = f.contents()
        if key in PER_TOKEN:
            v = v[:n_vocab] + [PER_TOKEN[key](i) for i in range(len(v), n_vocab)]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, v)
        else:
            w.add_key_value(key, v, f.types[0])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("arch", nargs="?", default="olmoe", choices=sorted(LAYOUTS))
    p.add_argument("--layers", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab")
    args = p.parse_args()
    a = dict(LAYOUTS[args.arch])
    if args.layers:
        a["layers"] = args.layers
    arch = a.get("arch", args.arch)
    w = gguf.GGUFWriter(args.out, arch)
    w.add_name(f"synthetic {args.arch} layout (random weights)")
    w.add_block_count(a["layers"])
    w.add_context_length(4096)
    w.add_embedding_length(a["hidden"])
    w.add_feed_forward_length(a["ffn"])
    w.add_expert_feed_forward_length(a["ffn"])
    w.add_head_count(a["heads"])
    w.add_head_count_kv(a["kv_heads"])
    w.add_key_length(a["head_dim"])
    w.add_value_length(a["head_dim"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(a["experts"])
    w.add_expert_used_count(a["used"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_uint32("weightmap.synthetic", 3)  # 3: routes like a model (above)
    if args.vocab:
        add_vocab(w, args.vocab, a["vocab"], a["pre"])
    plan = tensors(a)
    for name, ne, ty in plan:
        shape = byte_shape(ne, ty)
        w.add_tensor_info(name, shape, np.dtype(np.uint8), int(np.prod(shape)), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(args.seed)
    for name, ne, ty in plan:
        w.write_tensor_data(data(ne, ty, rng, name))
    w.close()


if __name__ == "__main__":
    main()
