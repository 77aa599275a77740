#!/usr/bin/env python3
"""gguf-py/numpy dequantization throughput, the counterpart of benches/dequant.rs.

Same types and size: 2^20 elements (4 MiB of f32 output) per call, random
blocks with normal f16 scales, one thread. Prints the median of the timed
calls as GB/s of f32 output (1 GB = 1e9 bytes, as criterion reports).

    /tmp/venv/bin/pip install gguf==0.19.0 numpy
    /tmp/venv/bin/python benches/dequant_numpy.py
"""

import statistics
import time

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

N = 1 << 20
CASES = [(Q.Q4_K, [0, 2]), (Q.Q6_K, [208]), (Q.Q8_0, [0]), (Q.IQ4_XS, [0])]
RUNS = 20

rng = np.random.default_rng(1)
print(f"numpy {np.__version__}, {N} elements per call, median of {RUNS} calls")
for qtype, scales in CASES:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(N // block_size, type_size), dtype=np.uint8)
    for off in scales:
        h = (rng.integers(0, 1 << 16, size=len(blocks)) & 0x83FF) | ((8 + rng.integers(0, 16, size=len(blocks))) << 10)
        blocks[:, off] = h & 0xFF
        blocks[:, off + 1] = h >> 8
    flat = blocks.reshape(-1)
    quants.dequantize(flat, qtype)  # warm up
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        quants.dequantize(flat, qtype)
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(f"{qtype.name:7s} {med * 1e3:8.2f} ms  {N * 4 / med / 1e9:6.2f} GB/s")
