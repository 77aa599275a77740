"""Tests of the weightmap Python bindings, against the repository's committed
fixtures (testdata/, see testdata/README.md), with the reference readers as
oracles: gguf-py's GGUFReader and gguf.quants.dequantize, and
safetensors.numpy.load_file."""

import gc
import json
import os
import pathlib
import struct

import numpy as np
import pytest

import gguf
import safetensors.numpy
from safetensors import safe_open

import weightmap

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = ROOT / "testdata"
SHARDS = TESTDATA / "shards"

GGUF_FILES = ["tiny-llama.gguf", "quant-types.gguf", "align8.gguf", "empty.gguf"]
ST_FILES = ["tiny.safetensors", "odd-offsets.safetensors"]
MODES = ["mmap", "stream"]

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - the CI installs it
    ml_dtypes = None


def reader_fields(r):
    """gguf-py's metadata, without its GGUF.* pseudo-fields."""
    return {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}


def st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


# ---------------------------------------------------------------- GGUF


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", GGUF_FILES)
def test_gguf_tensors_match_gguf_py(name, mode):
    path = TESTDATA / name
    r = gguf.GGUFReader(path)
    with weightmap.open(path, mode=mode) as w:
        assert w.keys() == [t.name for t in r.tensors]
        assert len(w) == len(r.tensors)
        assert list(w) == w.keys()
        assert w.format == "gguf"
        for t in r.tensors:
            assert t.name in w
            a = w.get_tensor(t.name)
            b = w[t.name]
            assert isinstance(a, np.ndarray)
            assert a.tobytes() == t.data.tobytes()
            assert a.tobytes() == b.tobytes()
            if t.tensor_type == gguf.GGMLQuantizationType.BF16:
                # gguf-py gives bf16 as bytes; weightmap as bfloat16 elements.
                assert a.shape == tuple(int(d) for d in reversed(t.shape))
                assert a.dtype == (ml_dtypes.bfloat16 if ml_dtypes else np.uint16)
                assert np.array_equal(a.view(np.uint8).reshape(t.data.shape), t.data)
            else:
                assert a.dtype == t.data.dtype, t.name
                assert a.shape == t.data.shape, t.name
            info = w.info(t.name)
            assert info["name"] == t.name
            assert info["type"].upper() == t.tensor_type.name
            assert info["ggml_type"] == int(t.tensor_type)
            assert info["shape"] == tuple(int(d) for d in reversed(t.shape))
            assert info["ne"] == tuple(int(d) for d in t.shape)
            assert info["nbytes"] == t.n_bytes
            assert info["file_offset"] == t.data_offset
        assert "no.such.tensor" not in w


@pytest.mark.parametrize("name", GGUF_FILES)
def test_gguf_metadata_matches_gguf_py(name):
    path = TESTDATA / name
    r = gguf.GGUFReader(path)
    with weightmap.open(path) as w:
        md = w.metadata()
    fields = reader_fields(r)
    assert list(md) == list(fields)
    for k, f in fields.items():
        want = f.contents()
        got = md[k]
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            assert isinstance(got, list), k
            assert len(got) == len(want), k
            assert got == list(want), k
            continue
        assert got == want, k
        if vt == gguf.GGUFValueType.BOOL:
            assert type(got) is bool, k
        elif vt in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
            assert type(got) is float, k
        elif vt == gguf.GGUFValueType.STRING:
            assert type(got) is str, k
        else:
            assert type(got) is int, k


def test_gguf_metadata_types_on_tiny_llama():
    with weightmap.open(TESTDATA / "tiny-llama.gguf") as w:
        md = w.metadata()
    assert md["general.architecture"] == "llama"
    tokens = md["tokenizer.ggml.tokens"]
    assert len(tokens) == 300 and all(isinstance(t, str) for t in tokens)
    big = [v for v in md.values() if isinstance(v, int) and v > 2**63 - 1]
    assert big, "the u64 above i64::MAX comes back as a Python int"


def test_alignment_fixture():
    with weightmap.open(TESTDATA / "align8.gguf") as w:
        assert w.metadata()["general.alignment"] == 8
        assert w.info("a.f32x3")["file_offset"] == 480
        assert w.info("b.f16x5")["file_offset"] == 496


def _dequantizable(qtype, data):
    try:
        return gguf.quants.dequantize(data, qtype)
    except NotImplementedError:
        return None


@pytest.mark.parametrize("mode", MODES)
def test_get_f32_bit_identical_with_gguf_py_on_quant_types(mode):
    path = TESTDATA / "quant-types.gguf"
    r = gguf.GGUFReader(path)
    checked = []
    with weightmap.open(path, mode=mode) as w, np.errstate(all="ignore"):
        for t in r.tensors:
            want = _dequantizable(t.tensor_type, t.data)
            if want is None:
                continue
            got = w.get_f32(t.name)
            assert got.dtype == np.float32
            assert got.shape == want.shape, t.name
            assert got.flags.writeable  # a new array, the caller's
            assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32)), t.name
            checked.append(t.tensor_type.name)
    # Every type but the two gguf-py 0.19.0 cannot dequantize (Q8_K, Q1_0).
    assert len(checked) == len(r.tensors) - 2, checked


def _dequant_fixture_types():
    out = []
    for p in sorted((TESTDATA / "dequant").glob("*.bin")):
        name = p.stem
        qt = getattr(gguf.GGMLQuantizationType, name.upper(), None)
        if qt is not None:
            out.append((name, qt))
    return out


@pytest.mark.parametrize("name,qtype", _dequant_fixture_types(), ids=lambda v: str(v))
def test_get_f32_bit_identical_on_dequant_fixtures(tmp_path, name, qtype):
    """testdata/dequant/<type>.bin (edge-case scales) written into a GGUF
    with gguf-py's writer, dequantized by weightmap, against both
    gguf.quants.dequantize and the committed <type>.f32."""
    raw = np.fromfile(TESTDATA / "dequant" / f"{name}.bin", dtype=np.uint8)
    ref = np.fromfile(TESTDATA / "dequant" / f"{name}.f32", dtype="<f4")
    block, tsize = gguf.GGML_QUANT_SIZES[qtype]
    path = tmp_path / f"{name}.gguf"
    wr = gguf.GGUFWriter(path, "llama")
    if qtype == gguf.GGMLQuantizationType.F32:
        wr.add_tensor("t", raw.view("<f4").reshape(1, -1))
    elif qtype == gguf.GGMLQuantizationType.F16:
        wr.add_tensor("t", raw.view("<f2").reshape(1, -1))
    else:
        # Raw blocks (bf16 too), given to the writer in their byte shape.
        assert raw.size % tsize == 0
        wr.add_tensor("t", raw.reshape(1, -1), raw_dtype=qtype)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    with weightmap.open(path) as w, np.errstate(all="ignore"):
        got = w.get_f32("t").reshape(-1)
        assert w.get_tensor("t").tobytes() == raw.tobytes()
        want = gguf.quants.dequantize(gguf.GGUFReader(path).tensors[0].data, qtype).reshape(-1)
    assert got.shape == ref.shape
    assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_get_f32_plain_types():
    path = TESTDATA / "tiny-llama.gguf"
    with weightmap.open(path) as w:
        for name in w.keys():
            ty = w.info(name)["type"]
            a = w.get_tensor(name)
            if ty in ("f32", "f16"):
                assert np.array_equal(w.get_f32(name), a.astype(np.float32))
            elif ty == "bf16":
                bits = a.view(np.uint16).astype(np.uint32) << 16
                assert np.array_equal(w.get_f32(name).view(np.uint32), bits)


# ---------------------------------------------------------------- safetensors


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ST_FILES)
def test_safetensors_match_reference(name, mode):
    path = TESTDATA / name
    ref = safetensors.numpy.load_file(path)
    header, data_start = st_header(path)
    with safe_open(path, "np") as f:
        ref_md = f.metadata() or {}
    with weightmap.open(path, mode=mode) as w:
        assert w.format == "safetensors"
        assert sorted(w.keys()) == sorted(ref)
        assert w.metadata() == ref_md
        for k, v in ref.items():
            a = w[k]
            assert a.dtype == v.dtype, k
            assert a.shape == v.shape, k
            assert np.array_equal(a, v), k
            assert a.tobytes() == v.tobytes(), k
            info = w.info(k)
            assert info["shape"] == v.shape
            assert info["nbytes"] == v.nbytes
            assert info["type"].upper() == header[k]["dtype"]
            assert info["file_offset"] == data_start + header[k]["data_offsets"][0]


def test_safetensors_file_order():
    path = TESTDATA / "tiny.safetensors"
    manifest = json.loads((TESTDATA / "tiny.safetensors.json").read_text())
    with weightmap.open(path) as w:
        assert w.keys() == [t["name"] for t in manifest["tensors"]]


@pytest.mark.parametrize("mode", MODES)
def test_bf16_safetensors(mode):
    path = TESTDATA / "bf16.safetensors"
    header, data_start = st_header(path)
    raw = path.read_bytes()
    with weightmap.open(path, mode=mode) as w:
        assert w.metadata() == {"format": "pt"}
        for k, h in header.items():
            if k == "__metadata__":
                continue
            a = w[k]
            s, e = h["data_offsets"]
            assert a.tobytes() == raw[data_start + s : data_start + e]
            assert a.shape == tuple(h["shape"])
            if h["dtype"] == "BF16":
                assert a.dtype == (ml_dtypes.bfloat16 if ml_dtypes else np.uint16)
                bits = a.view(np.uint16).astype(np.uint32) << 16
                assert np.array_equal(w.get_f32(k).view(np.uint32), bits)
                if ml_dtypes:
                    assert np.array_equal(a.astype(np.float32), w.get_f32(k))


# ---------------------------------------------------------------- shards


def _split_paths():
    return sorted(SHARDS.glob("split-*.gguf"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("which", [0, 1, 2])
def test_split_gguf_from_any_shard(which, mode):
    paths = _split_paths()
    assert len(paths) == 3
    readers = [gguf.GGUFReader(p) for p in paths]
    want = [(t.name, t) for r in readers for t in r.tensors]
    with weightmap.open(paths[which], mode=mode) as w:
        assert w.keys() == [n for n, _ in want]
        for n, t in want:
            a = w[n]
            assert a.dtype == t.data.dtype and a.shape == t.data.shape, n
            assert a.tobytes() == t.data.tobytes(), n
        md = w.metadata()
        first = reader_fields(readers[0])
        assert list(md) == list(first)
        for k, f in first.items():
            c = f.contents()
            assert md[k] == (list(c) if isinstance(c, list) else c), k
        assert w.report()["shards"] == 3


def test_split_gguf_second_shard_manifest():
    import hashlib

    manifest = json.loads((SHARDS / "manifest.json").read_text())["gguf"]
    with weightmap.open(SHARDS / "split-00002-of-00003.gguf") as w:
        assert sorted(w.keys()) == sorted(manifest)
        for n, m in manifest.items():
            assert hashlib.sha256(w[n].tobytes()).hexdigest() == m["sha256"], n


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("target", ["hf/model.safetensors.index.json", "hf"])
def test_safetensors_index_and_directory(target, mode):
    ref = {}
    for p in sorted((SHARDS / "hf").glob("*.safetensors")):
        ref.update(safetensors.numpy.load_file(p))
    with weightmap.open(SHARDS / target, mode=mode) as w:
        assert sorted(w.keys()) == sorted(ref)
        for k, v in ref.items():
            a = w[k]
            assert a.dtype == v.dtype and a.shape == v.shape
            assert a.tobytes() == v.tobytes()


# ---------------------------------------------------------------- modes, report


@pytest.mark.parametrize("name", GGUF_FILES + ST_FILES + ["bf16.safetensors"])
def test_stream_mode_gives_equal_bytes(name):
    path = TESTDATA / name
    with weightmap.open(path) as m, weightmap.open(path, mode="stream") as s:
        assert m.keys() == s.keys()
        assert m.metadata() == s.metadata()
        for k in m.keys():
            a, b = m[k], s[k]
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()
            assert m.info(k) == s.info(k)
        assert s.report()["mode_used"] == "stream"
        assert s.mode == "stream" and m.mode == "mmap"


def test_report():
    with weightmap.open(TESTDATA / "tiny-llama.gguf") as w:
        r = w.report()
        n = len(w)
    for key in (
        "mode_used",
        "fallback",
        "tensors_mapped",
        "tensors_copied",
        "bytes_mapped",
        "bytes_copied",
        "budget_bytes",
        "budget_source",
        "budget_limit",
        "budget_usage",
        "budget_reclaimable",
        "budget_own_cached",
    ):
        assert key in r
    assert r["mode_used"] == "mmap"
    assert r["mode_requested"] == "mmap"
    assert r["fallback"] is None
    assert r["format"] == "gguf"
    assert r["tensors_mapped"] + r["tensors_copied"] == n
    assert r["tensors_mapped"] > 0
    assert isinstance(r["budget_source"], str)
    assert r["budget_bytes"] is None or isinstance(r["budget_bytes"], int)


def test_zero_copy_in_mmap_mode():
    path = TESTDATA / "tiny-llama.gguf"
    with weightmap.open(path) as w:
        a = w["token_embd.weight"]
        b = w["token_embd.weight"]
        assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        assert type(a.base).__name__ == "_Owner"
        assert not a.flags.owndata


# ---------------------------------------------------------------- lifetime, read-only


@pytest.mark.parametrize("mode", MODES)
def test_arrays_outlive_the_handle(mode):
    path = TESTDATA / "tiny-llama.gguf"
    want = {t.name: t.data.tobytes() for t in gguf.GGUFReader(path).tensors}
    w = weightmap.open(path, mode=mode)
    arrays = {k: w[k] for k in w.keys()}
    # Views of views: numpy collapses their base to the array's, the owner.
    views = {k: a[..., :1] for k, a in arrays.items() if a.ndim}
    view_want = {k: v.tobytes() for k, v in views.items()}
    del w
    gc.collect()
    for k, a in arrays.items():
        assert a.tobytes() == want[k]
    del arrays
    gc.collect()
    for k, v in views.items():
        assert v.tobytes() == view_want[k]


def test_arrays_outlive_the_with_block():
    path = TESTDATA / "quant-types.gguf"
    with weightmap.open(path) as w:
        a = w["quant.q4_0"]
        expect = a.tobytes()
    assert w.closed
    del w
    gc.collect()
    assert a.tobytes() == expect


def test_closed_handle_refuses_use():
    w = weightmap.open(TESTDATA / "tiny-llama.gguf")
    a = w["test.one"]
    w.close()
    with pytest.raises(ValueError):
        w.keys()
    with pytest.raises(ValueError):
        w["test.one"]
    w.close()  # twice is fine
    assert a.shape == (1,)
    assert "closed" in repr(w)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["tiny-llama.gguf", "quant-types.gguf", "tiny.safetensors", "bf16.safetensors"])
def test_arrays_are_read_only(name, mode):
    with weightmap.open(TESTDATA / name, mode=mode) as w:
        for k in w.keys():
            a = w[k]
            assert not a.flags.writeable
            if a.size:
                with pytest.raises(ValueError):
                    a.reshape(-1)[0] = 0
                with pytest.raises(ValueError):
                    a[...] = 0
            with pytest.raises(ValueError):
                a.flags.writeable = True
            v = a.view()
            with pytest.raises(ValueError):
                v.flags.writeable = True


# ---------------------------------------------------------------- errors


def test_invalid_file_is_weightmap_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a model at all, not gguf nor safetensors")
    with pytest.raises(weightmap.Error) as e:
        weightmap.open(bad)
    assert isinstance(e.value, ValueError)
    assert str(e.value)
    assert e.value.kind == "invalid_file"
    assert isinstance(e.value.name, str)
    assert issubclass(weightmap.Error, ValueError)


def test_truncated_gguf_is_weightmap_error(tmp_path):
    data = (TESTDATA / "tiny-llama.gguf").read_bytes()
    p = tmp_path / "t.gguf"
    p.write_bytes(data[: len(data) // 2])
    for mode in MODES:
        with pytest.raises(weightmap.Error) as e:
            weightmap.open(p, mode=mode)
        assert "truncat" in str(e.value).lower() or str(e.value)


def test_missing_file_is_file_not_found(tmp_path):
    for mode in MODES:
        with pytest.raises(FileNotFoundError):
            weightmap.open(tmp_path / "nope.gguf", mode=mode)
        with pytest.raises(FileNotFoundError):
            weightmap.open(str(tmp_path / "nope.safetensors"), mode=mode)


def test_missing_tensor_is_key_error():
    with weightmap.open(TESTDATA / "tiny-llama.gguf") as w:
        with pytest.raises(KeyError):
            w["no.such.tensor"]
        with pytest.raises(KeyError):
            w.get_tensor("no.such.tensor")
        with pytest.raises(KeyError):
            w.get_f32("no.such.tensor")
        with pytest.raises(KeyError):
            w.info("no.such.tensor")


def test_bad_mode_is_value_error():
    with pytest.raises(ValueError):
        weightmap.open(TESTDATA / "tiny-llama.gguf", mode="fast")


def test_unsupported_dequant_is_weightmap_error():
    # gguf-py cannot dequantize Q1_0 or Q8_K; whatever weightmap says, it
    # returns an array of the element shape or raises weightmap.Error.
    with weightmap.open(TESTDATA / "quant-types.gguf") as w:
        for k in ("quant.q8_k", "quant.q1_0"):
            try:
                a = w.get_f32(k)
            except weightmap.Error:
                continue
            assert a.shape == w.info(k)["shape"]


def test_empty_file_and_directory_errors(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(weightmap.Error):
        weightmap.open(empty)
    d = tmp_path / "dir"
    d.mkdir()
    with pytest.raises((weightmap.Error, OSError)):
        weightmap.open(d)


@pytest.mark.parametrize("name", ["tiny-llama.gguf", "tiny.safetensors"])
def test_truncations_and_corruptions_never_crash(tmp_path, name):
    """Every truncation (in steps) and byte flips in the header: each either
    loads, with every tensor readable, or raises a Python exception."""
    data = (TESTDATA / name).read_bytes()
    p = tmp_path / name
    rng = np.random.default_rng(1)
    cases = [data[:n] for n in range(0, len(data), max(1, len(data) // 97))]
    for _ in range(60):
        b = bytearray(data)
        i = int(rng.integers(0, min(len(b), 1200)))
        b[i] ^= int(rng.integers(1, 256))
        cases.append(bytes(b))
    for case in cases:
        p.write_bytes(case)
        for mode in MODES:
            try:
                w = weightmap.open(p, mode=mode)
            except (weightmap.Error, OSError):
                continue
            with w:
                w.metadata()
                for k in w.keys():
                    w[k].tobytes()
                    w.info(k)
                    try:
                        w.get_f32(k)
                    except weightmap.Error:
                        pass


def test_pathlike_and_repr():
    p = TESTDATA / "tiny-llama.gguf"
    with weightmap.open(os.fspath(p)) as a, weightmap.open(p) as b:
        assert a.keys() == b.keys()
        assert "tiny-llama.gguf" in repr(a)
        assert a.path.endswith("tiny-llama.gguf")


# ---------------------------------------------------------------- announcements


@pytest.mark.parametrize("mode", MODES)
def test_prefetch_checks_every_need_and_the_weights_carry_on(tmp_path, mode):
    path = tmp_path / "moe.gguf"
    gw = gguf.GGUFWriter(path, "olmoe")
    experts = np.arange(4 * 2 * 8, dtype=np.float32).reshape(4, 2, 8)  # ne = [8, 2, 4]
    gw.add_tensor("blk.0.ffn_up_exps.weight", experts)
    gw.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    with weightmap.open(path, mode=mode) as w:
        assert w.prefetch([]) is None
        w.prefetch(["blk.0.attn_norm.weight", 0, ("blk.0.ffn_up_exps.weight", [3, 1]), (0, [0])])
        with pytest.raises(KeyError):
            w.prefetch(["blk.0.attn_norm.weight", "blk.9.nothing"])
        with pytest.raises(IndexError):
            w.prefetch([2])
        with pytest.raises(weightmap.Error) as e:
            w.prefetch([("blk.0.ffn_up_exps.weight", [4])])
        assert e.value.name == "no_such_expert"
        assert "has no expert 4" in str(e.value)
        with pytest.raises(weightmap.Error):
            w.prefetch([("blk.0.attn_norm.weight", [0])])
        # A bad expert list is named as such, not as a missing tensor.
        up = "blk.0.ffn_up_exps.weight"
        for bad, error in [
            ([2**31], ValueError),
            (["a"], TypeError),
            ("12", TypeError),
            (None, TypeError),
            ([True], TypeError),
        ]:
            with pytest.raises(error) as e:
                w.prefetch([(up, bad)])
            assert not isinstance(e.value, IndexError), e.value
            assert up in str(e.value) and "experts" in str(e.value), e.value
        with pytest.raises(TypeError):
            w.prefetch([(up, [0], [1])])
        # A bool is not a tensor index (True would be tensor 1).
        for need in [True, (False, [0])]:
            with pytest.raises(TypeError) as e:
                w.prefetch([need])
            assert "bool" in str(e.value), e.value
        with pytest.raises(IndexError):
            w.prefetch([-1])
        # A guess is checked as an announcement is.
        w.prefetch([(up, [3, 1])], likely=True)
        with pytest.raises(weightmap.Error) as e:
            w.prefetch([(up, [4])], likely=True)
        assert e.value.name == "no_such_expert"
        with pytest.raises(IndexError):
            w.prefetch([2], likely=True)
        with pytest.raises(TypeError):
            w.prefetch([(up, [True])], likely=True)
        # The weights answer as before.
        np.testing.assert_array_equal(
            w["blk.0.ffn_up_exps.weight"].view(np.float32).reshape(4, 2, 8), experts
        )
        assert w.report()["residency"].startswith("fits: ")
