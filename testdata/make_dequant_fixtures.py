#!/usr/bin/env python3
"""Make the dequantization fixtures in testdata/dequant/ for tests/dequant.rs.

For each type, `<type>.bin` holds raw blocks (or elements) as a file stores
them and `<type>.f32` the reference output, little-endian f32, one per element.
`<type>` is weightmap's `TensorType::name()`.

The reference for the ggml types is gguf-py's `gguf.quants.dequantize`
(gguf 0.19.0, bit-exact with ggml's own to_float); for the safetensors 8-bit
floats it is ml_dtypes' conversion to float32 (ml_dtypes 0.5.4).

    python3 -m venv /tmp/venv
    /tmp/venv/bin/pip install gguf==0.19.0 numpy ml_dtypes==0.5.4
    /tmp/venv/bin/python testdata/make_dequant_fixtures.py

Block contents are random (seeded, so the output is reproducible) with the
scale fields kept finite, plus edge blocks: scales of 0, -0, the smallest and
largest subnormal, the smallest normal, ±1 and ±65504, over quant bytes that
are all 0x00, all 0xFF or random.
"""

import importlib.metadata
import os

import ml_dtypes
import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

assert importlib.metadata.version("gguf") == "0.19.0"

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dequant")
rng = np.random.default_rng(20260821)

EDGE_F16 = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF]

# Byte offsets of each block's f16 scale fields (ggml-common.h's structs).
F16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.IQ2_XXS: [0], Q.IQ2_XS: [0], Q.IQ2_S: [0], Q.IQ3_XXS: [0], Q.IQ3_S: [0],
    Q.IQ1_S: [0], Q.IQ4_NL: [0], Q.IQ4_XS: [0], Q.TQ1_0: [52], Q.TQ2_0: [64],
    Q.IQ1_M: [], Q.MXFP4: [], Q.NVFP4: [],
}

BLOCKS = {32: 64, 64: 32, 256: 12}


def finite_f16(n):
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    inf_nan = ((h >> 10) & 0x1F) == 0x1F
    h[inf_nan] &= ~np.uint32(0x4000)  # clear the exponent's top bit
    return h.astype(np.uint16)


def put_f16(block, off, h):
    block[off] = h & 0xFF
    block[off + 1] = h >> 8


def put_iq1m_scale(block, h):
    # The f16 is the top nibbles of the four u16 at offset 48, low nibble first.
    for i in range(4):
        hi = 48 + 2 * i + 1
        block[hi] = (block[hi] & 0x0F) | (((h >> (4 * i)) & 0xF) << 4)


def make_blocks(qtype):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n = BLOCKS[block_size]
    blocks = rng.integers(0, 256, size=(n, type_size), dtype=np.uint8)
    for i in range(n):
        b = blocks[i]
        edge = i < len(EDGE_F16)
        if edge and i % 3 == 0:
            b[:] = 0
        elif edge and i % 3 == 1:
            b[:] = 0xFF
        fields = F16_FIELDS[qtype]
        values = [EDGE_F16[i]] * len(fields) if edge else finite_f16(len(fields))
        for off, h in zip(fields, values):
            put_f16(b, off, int(h))
        if qtype == Q.IQ1_M:
            put_iq1m_scale(b, EDGE_F16[i] if edge else int(finite_f16(1)[0]))
        if qtype == Q.MXFP4 and edge:
            b[0] = [0, 1, 2, 126, 127, 128, 253, 254, 255][i]
        if qtype == Q.NVFP4 and edge:
            b[0:4] = [[0x00, 0x7F, 0xFF, 0x80], [0x01, 0x07, 0x08, 0x38],
                      [0x7E, 0xFE, 0x3F, 0x40]][i % 3]
    return blocks


def write(name, raw, ref):
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    ref = np.ascontiguousarray(ref, dtype="<f4").reshape(-1)
    raw.tofile(os.path.join(OUT, name + ".bin"))
    ref.tofile(os.path.join(OUT, name + ".f32"))


def main():
    os.makedirs(OUT, exist_ok=True)
    names = {Q.IQ2_XXS: "iq2_xxs", Q.IQ2_XS: "iq2_xs", Q.IQ2_S: "iq2_s",
             Q.IQ3_XXS: "iq3_xxs", Q.IQ3_S: "iq3_s", Q.IQ1_S: "iq1_s",
             Q.IQ1_M: "iq1_m", Q.IQ4_NL: "iq4_nl", Q.IQ4_XS: "iq4_xs"}
    for qtype in F16_FIELDS:
        name = names.get(qtype) or qtype.name.lower().replace("_k", "_K")
        blocks = make_blocks(qtype)
        write(name, blocks, quants.dequantize(blocks, qtype))

    # Plain float types: random bit patterns plus the special values.
    specials16 = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00,
                           0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFFFF],
                          dtype=np.uint16)
    f16 = np.concatenate([specials16, rng.integers(0, 1 << 16, 1010, dtype=np.uint16)])
    f16 = f16[(((f16 >> 10) & 0x1F) != 0x1F) | ((f16 & 0x3FF) == 0)]  # no NaNs
    write("f16", f16, quants.dequantize(f16.view(np.uint8), Q.F16))
    bf16 = np.concatenate([specials16, rng.integers(0, 1 << 16, 1010, dtype=np.uint16)])
    write("bf16", bf16, quants.dequantize(bf16.view(np.uint8), Q.BF16))
    f32 = rng.integers(0, 1 << 32, 512, dtype=np.uint32)
    write("f32", f32, quants.dequantize(f32.view(np.uint8), Q.F32))

    # safetensors 8-bit floats: every code.
    codes = np.arange(256, dtype=np.uint8)
    for name, dtype in [("f8_e4m3", ml_dtypes.float8_e4m3fn), ("f8_e5m2", ml_dtypes.float8_e5m2),
                        ("f8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
                        ("f8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz),
                        ("f8_e8m0", ml_dtypes.float8_e8m0fnu)]:
        write(name, codes, codes.view(dtype).astype(np.float32))


if __name__ == "__main__":
    main()
