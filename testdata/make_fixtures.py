#!/usr/bin/env python3
"""Reference fixtures for weightmap, written by the official Python writers.

Regenerate (from the repository root):

    pip install gguf==0.19.0 safetensors numpy && python3 testdata/make_fixtures.py

Every fixture is written next to this script together with a JSON manifest
`<fixture>.json`.  The manifest is built from what THIS script handed to the
writer (metadata values, tensor bytes and shapes), not by reading the file
back.  Only the absolute file offsets (`offset`, `data_start`) come from
reading the file back (gguf.GGUFReader / the safetensors header JSON), and
that read-back is also used to assert that the file agrees with the manifest.

Output is deterministic: fixed numpy seed, no timestamps, no randomness in
key or tensor order.

Notes on the gguf-py 0.19.0 writer (GGUFWriter):
  * It always writes `general.architecture` first (constructor argument).
  * `add_string()` silently drops empty strings and `add_array()` silently
    drops empty arrays; the empty-string KV below therefore goes through
    `add_key_value()` directly.
  * Quantized tensors are handed over as uint8 arrays of shape
    (rows, bytes_per_row) with `raw_dtype=`; the writer converts the byte
    shape to the element shape itself (quant_shape_from_byte_shape), so
    `raw_shape` is not needed (passing the element shape as raw_shape with a
    uint8 array would be wrong: the writer would divide it again).
  * BF16 has no numpy dtype: it is handed over as uint16 bit patterns with
    `raw_dtype=BF16` (the shape is then taken as-is).
  * Q8_1 is SKIPPED in quant-types.gguf: gguf-py 0.19.0's GGML_QUANT_SIZES
    says Q8_1 blocks are (32, 40) bytes, but ggml's block_q8_1 is
    {ggml_half d; ggml_half s; int8_t qs[32];} = 36 bytes.  A file written
    with gguf-py's size would not match what ggml/llama.cpp expect.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import sys
from importlib.metadata import version as pkg_version
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf import GGML_QUANT_SIZES
import safetensors
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import save_file

GGUF_PY_VERSION = "0.19.0"
OUT = Path(__file__).resolve().parent
SEED = 0x5EED_2024

logging.getLogger("gguf").setLevel(logging.WARNING)

VERSIONS = {
    "gguf": pkg_version("gguf"),
    "safetensors": pkg_version("safetensors"),
    "numpy": np.__version__,
}

if VERSIONS["gguf"] != GGUF_PY_VERSION:
    sys.exit(f"need gguf=={GGUF_PY_VERSION} (have {VERSIONS['gguf']}): "
             f"pip install gguf=={GGUF_PY_VERSION}")


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def raw_bytes(arr: np.ndarray) -> bytes:
    # what both writers put on disk: C order, little endian
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.byteswap().view(a.dtype.newbyteorder("<"))
    return a.tobytes()


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------

_SCALAR_NORMALIZE = {
    VT.UINT8: int, VT.INT8: int, VT.UINT16: int, VT.INT16: int,
    VT.UINT32: int, VT.INT32: int, VT.UINT64: int, VT.INT64: int,
    VT.FLOAT32: lambda v: float(np.float32(v)),  # value as stored (f32-rounded)
    VT.FLOAT64: float,
    VT.BOOL: bool,
    VT.STRING: str,
}


class GGUFFixture:
    """Thin recorder around gguf.GGUFWriter: every KV and tensor handed to the
    writer is also recorded for the manifest."""

    def __init__(self, name: str, arch: str):
        self.name = name
        self.path = OUT / name
        self.w = gguf.GGUFWriter(self.path, arch)
        self.alignment = gguf.GGUF_DEFAULT_ALIGNMENT
        self.kv: dict[str, dict] = {}
        self.tensors: list[dict] = []
        # the writer forces this one in its constructor
        self._rec("general.architecture", VT.STRING, arch)

    # -- metadata ----------------------------------------------------------
    def _rec(self, key, vtype, value, elem_type=None):
        if vtype == VT.ARRAY:
            norm = _SCALAR_NORMALIZE[elem_type]
            self.kv[key] = {"type": "ARRAY", "elem_type": elem_type.name,
                            "len": len(value), "value": [norm(v) for v in value]}
        else:
            self.kv[key] = {"type": vtype.name, "value": _SCALAR_NORMALIZE[vtype](value)}

    def add(self, method: str, key: str, value, vtype: VT):
        getattr(self.w, method)(key, value)
        self._rec(key, vtype, value)

    def add_array(self, key: str, values: list, elem_type: VT):
        # add_array() infers the element type from the first item
        # (str -> STRING, float -> FLOAT32, int -> INT32); check it is the
        # one we want to record
        assert VT.get_type(values[0]) == elem_type, (key, elem_type)
        self.w.add_array(key, values)
        self._rec(key, VT.ARRAY, values, elem_type)

    def add_typed_array(self, key: str, values: list, elem_type: VT):
        self.w.add_key_value(key, values, VT.ARRAY, sub_type=elem_type)
        self._rec(key, VT.ARRAY, values, elem_type)

    def set_alignment(self, n: int):
        self.w.add_custom_alignment(n)  # sets data_alignment + general.alignment (u32)
        self.alignment = n
        self._rec("general.alignment", VT.UINT32, n)

    # -- tensors -----------------------------------------------------------
    def add_tensor(self, name: str, arr: np.ndarray):
        """Plain numpy tensor (F32/F16/F64/I8/I16/I32/I64)."""
        t = {np.dtype(np.float32): QT.F32, np.dtype(np.float16): QT.F16,
             np.dtype(np.float64): QT.F64, np.dtype(np.int8): QT.I8,
             np.dtype(np.int16): QT.I16, np.dtype(np.int32): QT.I32,
             np.dtype(np.int64): QT.I64}[arr.dtype]
        self.w.add_tensor(name, arr)
        self._rec_tensor(name, t, list(reversed(arr.shape)), raw_bytes(arr))

    def add_bf16(self, name: str, values_f32: np.ndarray):
        bits = (values_f32.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        self.w.add_tensor(name, bits, raw_dtype=QT.BF16)
        self._rec_tensor(name, QT.BF16, list(reversed(bits.shape)), raw_bytes(bits))

    def add_quant(self, name: str, qtype: QT, ne0: int, rows: int, rng):
        block, tsize = GGML_QUANT_SIZES[qtype]
        assert ne0 % block == 0
        row_bytes = ne0 // block * tsize
        data = rng.integers(0, 256, size=(rows, row_bytes), dtype=np.uint8)
        self.w.add_tensor(name, data, raw_dtype=qtype)
        self._rec_tensor(name, qtype, [ne0, rows], raw_bytes(data))

    def _rec_tensor(self, name, qtype, ne, b: bytes):
        self.tensors.append({"name": name, "ggml_type_id": int(qtype),
                             "ggml_type": qtype.name, "shape": [int(x) for x in ne],
                             "nbytes": len(b), "sha256": sha256(b), "_bytes": b})

    # -- write + manifest + cross-check ------------------------------------
    def write(self):
        w = self.w
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

        # relative offsets as the writer lays them out (each tensor padded
        # to the alignment)
        rel = 0
        for t in self.tensors:
            t["relative_offset"] = rel
            rel += gguf.GGUFWriter.ggml_pad(t["nbytes"], self.alignment)

        manifest = {
            "file": self.name,
            "format": "gguf",
            "generator": VERSIONS,
            "version": gguf.GGUF_VERSION,
            "alignment": self.alignment,
            "kv_count": len(self.kv),
            "tensor_count": len(self.tensors),
            "metadata_keys_in_order": list(self.kv),
            "metadata": self.kv,
            "tensors": self.tensors,
        }
        self._cross_check(manifest)
        for t in self.tensors:
            del t["_bytes"]
        manifest["file_size"] = self.path.stat().st_size
        write_json(OUT / (self.name + ".json"), manifest)
        return manifest

    def _cross_check(self, m):
        r = gguf.GGUFReader(self.path)
        blob = self.path.read_bytes()
        assert r.fields["GGUF.version"].parts[-1][0] == m["version"]
        assert r.alignment == m["alignment"], (r.alignment, m["alignment"])
        keys = [k for k in r.fields if not k.startswith("GGUF.")]
        assert keys == m["metadata_keys_in_order"], (keys, m["metadata_keys_in_order"])
        for k in keys:
            f, exp = r.fields[k], m["metadata"][k]
            assert VT(f.types[0]).name == exp["type"], (k, f.types, exp["type"])
            got = f.contents()
            if exp["type"] == "ARRAY":
                assert VT(f.types[-1]).name == exp["elem_type"], k
                assert len(got) == exp["len"], k
            assert got == exp["value"], (k, got if not isinstance(got, list) else got[:5])
        assert r.data_offset % m["alignment"] == 0
        m["data_start"] = int(r.data_offset)
        assert len(r.tensors) == len(m["tensors"])
        for rt, t in zip(r.tensors, m["tensors"]):
            assert rt.name == t["name"]
            assert int(rt.tensor_type) == t["ggml_type_id"]
            assert [int(x) for x in rt.shape] == t["shape"], (t["name"], rt.shape, t["shape"])
            assert int(rt.n_bytes) == t["nbytes"], t["name"]
            assert rt.data_offset == r.data_offset + t["relative_offset"], t["name"]
            off = int(rt.data_offset)
            assert blob[off:off + t["nbytes"]] == t["_bytes"], t["name"]
            assert off % m["alignment"] == 0
            t["offset"] = off


def make_tiny_llama(rng):
    g = GGUFFixture("tiny-llama.gguf", "llama")
    g.add("add_string", "general.name", "weightmap tiny llama", VT.STRING)
    g.add("add_uint32", "llama.block_count", 1, VT.UINT32)
    g.add("add_uint32", "llama.context_length", 128, VT.UINT32)
    g.add("add_uint32", "llama.embedding_length", 8, VT.UINT32)
    g.add("add_float32", "llama.rope.freq_base", 10000.0, VT.FLOAT32)
    g.add("add_float32", "llama.attention.layer_norm_rms_epsilon", 1e-5, VT.FLOAT32)
    g.add("add_bool", "tokenizer.ggml.add_bos_token", True, VT.BOOL)
    g.add("add_bool", "weightmap.test.bool_false", False, VT.BOOL)
    g.add("add_uint64", "weightmap.test.u64", 2**63 + 12345, VT.UINT64)  # > i64::MAX
    g.add("add_int32", "weightmap.test.i32", -123456, VT.INT32)
    g.add("add_float64", "weightmap.test.f64", 3.141592653589793, VT.FLOAT64)
    g.add("add_uint8", "weightmap.test.u8", 255, VT.UINT8)
    g.add("add_int8", "weightmap.test.i8", -128, VT.INT8)
    g.add("add_uint16", "weightmap.test.u16", 65535, VT.UINT16)
    g.add("add_int16", "weightmap.test.i16", -32768, VT.INT16)
    g.add("add_int64", "weightmap.test.i64", -(2**40) - 7, VT.INT64)
    g.add("add_string", "weightmap.test.utf8", "héllo wörld ✓ 日本語 🦀", VT.STRING)
    # add_string() drops "" silently, so use the generic add_key_value()
    g.w.add_key_value("weightmap.test.empty_string", "", VT.STRING)
    g._rec("weightmap.test.empty_string", VT.STRING, "")
    g.add_typed_array("weightmap.test.u8_array", [0, 1, 2, 254, 255], VT.UINT8)
    g.add_typed_array("weightmap.test.u64_array", [0, 1, 2**64 - 1], VT.UINT64)
    g.add("add_string", "tokenizer.ggml.model", "llama", VT.STRING)

    # 300 tokens: 3 specials, 256 byte tokens, then words incl. non-ASCII and ""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]  # UNKNOWN, CONTROL, CONTROL
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)  # BYTE
    words = ["▁the", "▁a", "é", "日本語", "🦀", "Ω", "▁naïve", "ß", "\n", "\t",
             " ", "", "▁Привет", "مرحبا", "▁x", "\u00a0", "a\u0301", "∑∫", "😀👍", "end"]
    i = 0
    while len(tokens) < 300:
        tokens.append(words[i] if i < len(words) else f"▁tok{i}")
        types.append(1)  # NORMAL
        i += 1
    assert len(set(tokens)) == len(tokens) and "" in tokens
    scores = [float(-0.25 * k) for k in range(300)]  # exact in f32
    scores[0] = 0.0
    g.add_array("tokenizer.ggml.tokens", tokens, VT.STRING)
    g.add_array("tokenizer.ggml.scores", scores, VT.FLOAT32)
    g.add_array("tokenizer.ggml.token_type", types, VT.INT32)
    g.add("add_uint32", "tokenizer.ggml.bos_token_id", 1, VT.UINT32)
    g.add("add_uint32", "tokenizer.ggml.eos_token_id", 2, VT.UINT32)

    g.add_tensor("token_embd.weight", rng.standard_normal((6, 8)).astype(np.float32))
    g.add_tensor("output_norm.weight", rng.standard_normal(8).astype(np.float16))
    g.add_bf16("blk.0.attn_q.weight", rng.standard_normal((4, 8)).astype(np.float32))
    g.add_tensor("test.f32_3d", rng.standard_normal((2, 3, 4)).astype(np.float32))
    g.add_tensor("test.f64", rng.standard_normal((2, 2)).astype(np.float64))
    g.add_tensor("test.i8", np.array([-128, -1, 0, 1, 127], dtype=np.int8))
    g.add_tensor("test.i16", np.array([[-32768, -1, 0], [1, 2, 32767]], dtype=np.int16))
    g.add_tensor("test.i32", np.array([-2**31, -1, 0, 2**31 - 1], dtype=np.int32))
    g.add_tensor("test.i64", np.array([-2**63, 0, 2**63 - 1], dtype=np.int64))
    g.add_tensor("test.one", np.array([42.5], dtype=np.float32))
    # 0 elements: occupies 0 bytes, so it has the SAME offset as the next tensor
    g.add_tensor("test.empty", np.zeros((0,), dtype=np.float32))
    g.add_tensor("test.last", np.array([1.0, -2.0, 0.5], dtype=np.float32))
    return g.write()


def make_quant_types(rng):
    g = GGUFFixture("quant-types.gguf", "llama")
    g.add("add_string", "general.name", "weightmap quant types", VT.STRING)
    g.add("add_uint32", "general.quantization_version", 2, VT.UINT32)
    written, skipped = [], {}
    i = 0
    for qt in QT:
        block, _ = GGML_QUANT_SIZES[qt]
        if block == 1:
            continue  # not a block-quantized type (F32/F16/BF16/F64/I*)
        if qt == QT.Q8_1:
            skipped[qt.name] = ("gguf-py 0.19.0 GGML_QUANT_SIZES says 40 bytes/block, "
                                "ggml block_q8_1 is 36")
            continue
        nblocks = 1 + (i % 2)     # ne0 = one or two blocks
        rows = 2 + ((i // 2) % 2)  # 2 or 3 rows
        g.add_quant(f"quant.{qt.name.lower()}", qt, block * nblocks, rows, rng)
        written.append(qt.name)
        i += 1
    m = g.write()
    m["skipped_types"] = skipped
    write_json(OUT / (g.name + ".json"), m)
    return m, written, skipped


def make_align8(rng):
    g = GGUFFixture("align8.gguf", "llama")
    g.add("add_string", "general.name", "weightmap align8", VT.STRING)
    g.set_alignment(8)
    g.add("add_uint32", "llama.block_count", 1, VT.UINT32)
    g.add_tensor("a.f32x3", rng.standard_normal(3).astype(np.float32))
    g.add_tensor("b.f16x5", rng.standard_normal(5).astype(np.float16))
    g.add_tensor("c.f32x7", rng.standard_normal(7).astype(np.float32))
    g.add_tensor("d.f16x3x3", rng.standard_normal((3, 3)).astype(np.float16))
    g.add_tensor("e.f32x5", rng.standard_normal(5).astype(np.float32))
    g.add_tensor("f.f16x7", rng.standard_normal(7).astype(np.float16))
    g.add_tensor("g.f32x3x5", rng.standard_normal((3, 5)).astype(np.float32))
    m = g.write()
    offs = [t["offset"] for t in m["tensors"]]
    assert all(o % 8 == 0 for o in offs)
    assert any(o % 32 != 0 for o in offs), offs
    return m


def make_empty():
    g = GGUFFixture("empty.gguf", "llama")
    m = g.write()
    assert m["tensor_count"] == 0 and list(m["metadata"]) == ["general.architecture"]
    return m


# ---------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------

ST_DTYPE = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64",
            "uint64": "U64", "int32": "I32", "uint32": "U32", "int16": "I16",
            "uint16": "U16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
            "bfloat16": "BF16"}


def st_manifest(name: str, entries: dict, metadata):
    """entries: tensor name -> (safetensors dtype, shape, raw bytes), as given
    to the writer.  Offsets come from parsing the written header."""
    path = OUT / name
    blob = path.read_bytes()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen])
    data_start = 8 + hlen
    assert header.pop("__metadata__", None) == metadata
    assert set(header) == set(entries)
    tensors = []
    for tname, (dtype, shape, b) in entries.items():
        h = header[tname]
        assert h["dtype"] == dtype and h["shape"] == list(shape), (tname, h)
        begin, end = h["data_offsets"]
        assert end - begin == len(b)
        assert blob[data_start + begin:data_start + end] == b, tname
        tensors.append({"name": tname, "dtype": dtype, "shape": list(shape),
                        "nbytes": len(b), "sha256": sha256(b),
                        "data_offsets": [begin, end], "offset": data_start + begin})
    tensors.sort(key=lambda t: (t["data_offsets"][0], t["data_offsets"][1]))
    m = {"file": name, "format": "safetensors", "generator": VERSIONS,
         "header_len": hlen, "data_start": data_start, "metadata": metadata,
         "tensors": tensors, "file_size": len(blob)}
    write_json(OUT / (name + ".json"), m)
    return m


def save_np(name: str, tensors: dict, metadata):
    save_file(tensors, OUT / name, metadata=metadata)
    entries = {k: (ST_DTYPE[v.dtype.name], v.shape, raw_bytes(v)) for k, v in tensors.items()}
    return st_manifest(name, entries, metadata)


def make_tiny_st(rng):
    t = {
        "f32.matrix": rng.standard_normal((3, 4)).astype(np.float32),
        "f16.vec": rng.standard_normal(5).astype(np.float16),
        "f64.vec": rng.standard_normal(3).astype(np.float64),
        "i8": np.array([-128, -1, 0, 1, 127], dtype=np.int8),
        "i16": np.array([-32768, 0, 32767], dtype=np.int16),
        "i32": np.array([[-2**31, -1, 0], [1, 2, 2**31 - 1]], dtype=np.int32),
        "i64": np.array([-2**63, 0, 2**63 - 1], dtype=np.int64),
        "u8": np.array([0, 1, 128, 254, 255], dtype=np.uint8),
        "u16": np.array([0, 1, 65535], dtype=np.uint16),
        "u32": np.array([0, 1, 2**32 - 1], dtype=np.uint32),
        "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "bool": np.array([[True, False, True], [False, False, True]]),
        "empty": np.zeros((0,), dtype=np.float32),
        "empty2d": np.zeros((2, 0), dtype=np.float32),
        "scalar": np.array(3.5, dtype=np.float32),
    }
    # BF16: numpy has no bfloat16 dtype, so safetensors.numpy cannot express
    # it; see bf16.safetensors below.
    return save_np("tiny.safetensors", t, {"format": "pt", "note": "weightmap fixture"})


def make_bf16_st(rng):
    # Same Rust serializer that safetensors.numpy.save_file calls
    # (safetensors.serialize_file), fed a TensorSpec with dtype "bfloat16"
    # and uint16 bit patterns, because numpy has no bfloat16 dtype.
    f = rng.standard_normal((4, 3)).astype(np.float32)
    bf = np.ascontiguousarray((f.view(np.uint32) >> 16).astype(np.uint16))
    f32 = rng.standard_normal(2).astype(np.float32)
    specs = {
        "bf16.matrix": TensorSpec(dtype="bfloat16", shape=bf.shape,
                                  data_ptr=bf.ctypes.data, data_len=bf.nbytes),
        "f32.vec": TensorSpec(dtype="float32", shape=f32.shape,
                              data_ptr=f32.ctypes.data, data_len=f32.nbytes),
    }
    meta = {"format": "pt"}
    serialize_file(specs, OUT / "bf16.safetensors", metadata=meta)
    entries = {"bf16.matrix": ("BF16", bf.shape, raw_bytes(bf)),
               "f32.vec": ("F32", f32.shape, raw_bytes(f32))}
    return st_manifest("bf16.safetensors", entries, meta)


def make_odd_offsets_st(rng):
    t = {
        "odd.f32.len3": rng.standard_normal(3).astype(np.float32),
        "odd.f32.len5": rng.standard_normal(5).astype(np.float32),
        "odd.u8.len7": rng.integers(0, 256, 7, dtype=np.uint8),
        "odd.u8.len3": rng.integers(0, 256, 3, dtype=np.uint8),
        "odd.u8.len1": rng.integers(0, 256, 1, dtype=np.uint8),
        "odd.f32.2x3": rng.standard_normal((2, 3)).astype(np.float32),
    }
    m = save_np("odd-offsets.safetensors", t, None)
    assert m["data_start"] % 32 != 0, m["data_start"]
    assert any(x["offset"] % 2 == 1 for x in m["tensors"])
    return m


def main():
    rng = np.random.default_rng(SEED)
    tiny = make_tiny_llama(rng)
    assert all(t["offset"] % 32 == 0 for t in tiny["tensors"])
    _, written, skipped = make_quant_types(rng)
    a8 = make_align8(rng)
    make_empty()
    make_tiny_st(rng)
    make_bf16_st(rng)
    odd = make_odd_offsets_st(rng)

    first = next(t for t in a8["tensors"] if t["offset"] % 32 != 0)
    print("quant types written:", " ".join(written))
    print("quant types skipped:", skipped)
    print("align8.gguf offsets:", [(t["name"], t["offset"]) for t in a8["tensors"]],
          "first not %32:", first["name"], first["offset"])
    print("odd-offsets.safetensors data_start:", odd["data_start"],
          "offsets:", [(t["name"], t["offset"]) for t in odd["tensors"]])
    for p in sorted(OUT.iterdir()):
        if p.suffix in (".gguf", ".safetensors", ".json"):
            print(f"{p.stat().st_size:8d}  {p.name}")


if __name__ == "__main__":
    main()
