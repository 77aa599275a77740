#!/usr/bin/env python3
"""Write a GGUF and a safetensors file with N small tensors each.

Each tensor is F32 [2, 2] (16 bytes) named "blk.<i>.ffn.weight"; the GGUF
file has no metadata and the default alignment of 32, the safetensors file
packs its tensors contiguously. Both describe the same tensors, so the
header parse and the tensor table are all that differ between a mapped load
of one and of the other:

    python3 benches/many_tensors.py 1000000 /tmp/many
    target/release/weightmap load /tmp/many/1000000.gguf --json --prefetch off
    target/release/weightmap load /tmp/many/1000000.safetensors --json --prefetch off
"""

import json
import os
import struct
import sys


def names(n):
    return [f"blk.{i}.ffn.weight" for i in range(n)]


def write_gguf(path, n):
    align = 32
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", 3, n, 0)
    for i, name in enumerate(names(n)):
        b = name.encode()
        out += struct.pack("<Q", len(b)) + b
        out += struct.pack("<I", 2) + struct.pack("<QQ", 2, 2)
        out += struct.pack("<IQ", 0, i * align)  # type 0 = F32
    out += b"\0" * (-len(out) % align)
    with open(path, "wb") as f:
        f.write(out)
        f.write(b"\0" * (n * align))


def write_safetensors(path, n):
    header = {
        name: {"dtype": "F32", "shape": [2, 2], "data_offsets": [16 * i, 16 * i + 16]}
        for i, name in enumerate(names(n))
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.write(b"\0" * (16 * n))


def main():
    n = int(sys.argv[1])
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    write_gguf(os.path.join(out, f"{n}.gguf"), n)
    write_safetensors(os.path.join(out, f"{n}.safetensors"), n)


if __name__ == "__main__":
    main()
