"""weightmap.gguf against gguf-py 0.19 (the oracle): GGUFReader field by
field and tensor by tensor on every committed GGUF fixture and on a
vocabulary file gguf-py's own writer makes (262,144 tokens, as gemma 3's);
dequantize bit for bit on every type of quant-types.gguf; patch()/unpatch().
"""

import gc
import pathlib
import struct
import tracemalloc
import weakref

import numpy as np
import pytest

import gguf
import gguf.gguf_reader
import gguf.quants

import weightmap.gguf as wg

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = ROOT / "testdata"
FIXTURES = sorted(p.relative_to(TESTDATA).as_posix() for p in TESTDATA.rglob("*.gguf"))


def write_vocab(path, n):
    """A tokenizer's worth of metadata, written by gguf-py: n tokens, their
    scores and types, merges, every scalar type, empty arrays, tensors."""
    w = gguf.GGUFWriter(str(path), "gemma3")
    rng = np.random.default_rng(5)
    w.add_token_list([f"tok{i}\u00e9" if i % 7 else "" for i in range(n)])
    w.add_token_scores(rng.standard_normal(n).astype(np.float32).tolist())
    w.add_token_types(rng.integers(1, 7, n).tolist())
    w.add_token_merges([f"a{i} b{i}" for i in range(1000)])
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -3)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", -2.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_string("t.empty_str", "")
    w.add_array("t.empty_arr", [])
    w.add_array("t.bool_arr", [True, False, True])
    w.add_array("t.i64_arr", [1, -2, 3])
    w.add_array("t.f64_arr", [0.5, -0.25])
    w.add_tensor("f32", rng.standard_normal((3, 4)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 8)).astype(np.float16))
    w.add_tensor("q8", np.zeros((2, 34), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    # 32,768 tokens: gguf-py's reader takes 4 s on it (31 s on 262,144).
    return write_vocab(tmp_path_factory.mktemp("gguf") / "vocab.gguf", 32_768)


@pytest.fixture(scope="module")
def big_vocab_file(tmp_path_factory):
    # As gemma 3's: 262,144 tokens (weightmap's reader only).
    return write_vocab(tmp_path_factory.mktemp("gguf") / "vocab262k.gguf", 262_144)


def _offset(reader, arr):
    """Where a part or tensor's bytes are in the reader's mapped file."""
    base = reader.data.ctypes.data
    return arr.ctypes.data - base


def assert_same_reader(path):
    want = gguf.GGUFReader(path)
    got = wg.GGUFReader(path)
    assert got.alignment == want.alignment and type(got.alignment) is type(want.alignment)
    assert got.data_offset == want.data_offset
    assert got.byte_order == want.byte_order and got.endianess == want.endianess
    assert list(got.fields) == list(want.fields)
    assert len(got.fields) == len(want.fields)
    for key, fw in want.fields.items():
        fg = got.fields[key]
        assert isinstance(fg, gguf.gguf_reader.ReaderField)
        assert (fg.offset, fg.name, fg.types, fg.data) == (fw.offset, fw.name, fw.types, fw.data), key
        assert len(fg.parts) == len(fw.parts), key
        for pg, pw in zip(fg.parts, fw.parts):
            assert pg.dtype == pw.dtype and pg.shape == pw.shape, key
            assert pg.tobytes() == pw.tobytes(), key
            assert _offset(got, pg) == _offset(want, pw), key  # a view of the same bytes
        assert fg.contents() == fw.contents(), key
        if fw.types and fw.types[0] == gguf.GGUFValueType.ARRAY and len(fw.data) >= 3:
            assert fg.contents(1) == fw.contents(1) and fg.contents(slice(0, 3)) == fw.contents(slice(0, 3))
        assert got.get_field(key) is fg
    assert got.get_field("no.such.key") is None
    assert len(got.tensors) == len(want.tensors)
    for i, (tw, tg) in enumerate(zip(want.tensors, got.tensors)):
        assert got.get_tensor(i) is tg
        assert isinstance(tg, gguf.gguf_reader.ReaderTensor)
        for attr in ("name", "tensor_type", "n_elements", "n_bytes", "data_offset"):
            assert getattr(tg, attr) == getattr(tw, attr), (tw.name, attr)
        assert type(tg.tensor_type) is type(tw.tensor_type)
        assert tg.shape.dtype == tw.shape.dtype and tg.shape.tolist() == tw.shape.tolist()
        assert tg.data.dtype == tw.data.dtype and tg.data.shape == tw.data.shape, tw.name
        assert tg.data.tobytes() == tw.data.tobytes(), tw.name
        if tw.data.size:  # zero-copy: a view of the same bytes of the mapped file
            assert _offset(got, tg.data) == _offset(want, tw.data) == tw.data_offset
            assert np.shares_memory(tg.data, got.data)
        assert (tg.field.offset, tg.field.name, tg.field.data, tg.field.types) == (
            tw.field.offset, tw.field.name, tw.field.data, tw.field.types)
        for pg, pw in zip(tg.field.parts, tw.field.parts):
            assert pg.dtype == pw.dtype and pg.tobytes() == pw.tobytes()
    return got


@pytest.mark.parametrize("name", FIXTURES)
def test_reader_against_gguf_py(name):
    assert_same_reader(TESTDATA / name)


def test_reader_on_a_vocabulary(vocab_file):
    assert_same_reader(vocab_file)


def test_a_reader_is_freed_with_its_last_reference(vocab_file):
    """No reference cycle between a reader and its fields: dropped, they
    go at once, not at the next garbage collection (their views are
    hundreds of MiB for a real vocabulary)."""
    was = gc.isenabled()
    gc.disable()
    try:
        r = wg.GGUFReader(vocab_file)
        assert len(r.fields["tokenizer.ggml.tokens"].data) > 0  # built
        reader, fields = weakref.ref(r), weakref.ref(r.fields)
        del r
        assert reader() is None and fields() is None
    finally:
        if was:
            gc.enable()


def test_fields_are_built_when_read(big_vocab_file):
    r = wg.GGUFReader(big_vocab_file)
    assert "0 built" in repr(r.fields)  # opening built none
    tokens = r.fields["tokenizer.ggml.tokens"]
    assert "1 built" in repr(r.fields)
    assert len(tokens.data) == 262_144 and len(tokens.parts) == 5 + 2 * 262_144
    want = [f"tok{i}\u00e9" if i % 7 else "" for i in range(262_144)]
    assert tokens.contents() == want
    assert r.fields["tokenizer.ggml.tokens"] is tokens  # built once
    scores = r.fields["tokenizer.ggml.scores"]
    assert len(scores.data) == 262_144 and scores.parts[scores.data[5]].dtype == np.float32


def test_fixtures_are_all_there():
    assert {"tiny-llama.gguf", "quant-types.gguf", "align8.gguf", "empty.gguf"} <= set(FIXTURES)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint8).tobytes()


@pytest.mark.parametrize("path", ["quant-types.gguf", "tiny-llama.gguf"])
def test_dequantize_against_gguf_py(path):
    reader = gguf.GGUFReader(TESTDATA / path)
    tried = 0
    for t in reader.tensors:
        try:
            want = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            with pytest.raises(NotImplementedError):
                wg.dequantize(t.data, t.tensor_type)
            continue
        got = wg.dequantize(t.data, t.tensor_type)
        assert got.dtype == want.dtype == np.float32, t.name
        assert got.shape == want.shape, t.name
        assert _bits(got) == _bits(want), t.name
        tried += 1
    assert tried >= 10 if path == "quant-types.gguf" else tried > 0


def test_patch_and_unpatch(vocab_file):
    orig = (gguf.GGUFReader, gguf.gguf_reader.GGUFReader, gguf.dequantize, gguf.quants.dequantize)
    name_map = gguf.get_tensor_name_map
    wg.patch()
    try:
        wg.patch()  # twice is harmless
        from gguf import GGUFReader, dequantize

        assert GGUFReader is wg.GGUFReader and gguf.gguf_reader.GGUFReader is wg.GGUFReader
        assert dequantize is wg.dequantize and gguf.quants.dequantize is wg.dequantize
        r = gguf.GGUFReader(vocab_file)
        assert isinstance(r, wg.GGUFReader)
        # The name map is the map gguf-py builds, a new object each call.
        arch = gguf.MODEL_ARCH.LLAMA
        m = gguf.get_tensor_name_map(arch, 4)
        assert isinstance(m, gguf.TensorNameMap)
        assert gguf.get_tensor_name_map(arch, 4) is not m
        fresh = name_map(arch, 4)
        assert m.mapping == fresh.mapping
        assert gguf.get_tensor_name_map(arch, 5).mapping == name_map(arch, 5).mapping
    finally:
        wg.unpatch()
    assert (gguf.GGUFReader, gguf.gguf_reader.GGUFReader, gguf.dequantize, gguf.quants.dequantize) == orig
    assert gguf.get_tensor_name_map is name_map
    assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 4) is not m
    wg.unpatch()  # twice is harmless
    assert gguf.GGUFReader is orig[0]


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 4)
    with pytest.raises(ValueError):
        wg.GGUFReader(p)
    p.write_bytes(b"not a gguf file at all, just some bytes")
    with pytest.raises(ValueError):
        wg.GGUFReader(p)


def _gguf_with_keys(path, keys):
    """A GGUF file with no tensors and one UINT32 key/value per key, in
    order (repeats and all), written byte by byte: gguf-py's writer refuses
    a repeated key."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, len(keys)))
    for i, key in enumerate(keys):
        k = key.encode("utf-8")
        out += struct.pack("<Q", len(k)) + k + struct.pack("<II", int(gguf.GGUFValueType.UINT32), i)
    out += b"\0" * (-len(out) % 32)
    path.write_bytes(bytes(out))
    return path


def _key_error(make, path):
    with pytest.raises(KeyError) as e:
        make(path)
    return str(e.value)


@pytest.mark.parametrize(
    "keys",
    [
        ["general.name", "GGUF.version"],
        ["GGUF.tensor_count", "general.name"],
        ["a", "b", "a"],
        ["b", "a", "a", "b", "a"],  # the first repeat in file order is named
        ["z", "a", "z", "a"],
    ],
)
def test_repeated_and_colliding_keys_as_gguf_py(tmp_path, keys):
    # gguf-py 0.19's _push_field raises KeyError("Duplicate KEY already in
    # list at offset OFFSET") for a key that repeats one before it, its own
    # GGUF.version, GGUF.tensor_count and GGUF.kv_count included.
    p = _gguf_with_keys(tmp_path / "keys.gguf", keys)
    want = _key_error(gguf.GGUFReader, p)
    assert want.startswith("'Duplicate ")
    assert _key_error(wg.GGUFReader, p) == want


@pytest.mark.parametrize("keys,repeat", [(["a", "GGUF.version", "a"], 2), (["GGUF.kv_count", "GGUF.kv_count"], 1)])
def test_a_synthetic_name_before_a_repeated_key(tmp_path, keys, repeat):
    # The one difference: weightmap's header refuses the file's repeated key
    # before the reader meets the synthetic name, so the KeyError names the
    # repeat where gguf-py's names the synthetic name.
    p = _gguf_with_keys(tmp_path / "keys.gguf", keys)
    assert _key_error(gguf.GGUFReader, p).startswith("'Duplicate GGUF.")
    offset = 24 + sum(8 + len(k) + 8 for k in keys[:repeat])
    assert _key_error(wg.GGUFReader, p) == f"'Duplicate {keys[repeat]} already in list at offset {offset}'"


def test_tensor_descriptors_of_every_rank_and_a_non_ascii_name(tmp_path):
    # The descriptors' parts sit where weightmap's header says: names whose
    # UTF-8 length is not their length in characters, 1 to 4 dimensions.
    p = tmp_path / "ranks.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_tensor("v\u00e9ctor", np.arange(5, dtype=np.float32))
    w.add_tensor("m", np.zeros((3, 2), dtype=np.float16))
    w.add_tensor("\u5f20\u91cf.3d", np.ones((2, 3, 4), dtype=np.float32))
    w.add_tensor("t4", np.zeros((1, 2, 1, 3), dtype=np.int8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = assert_same_reader(p)
    assert [t.name for t in got.tensors] == ["v\u00e9ctor", "m", "\u5f20\u91cf.3d", "t4"]


def test_dequantize_reads_its_input_in_place():
    # 2 MB of Q8_0 blocks: a copy of the input (ascontiguousarray().tobytes(),
    # as before) would show in tracemalloc's peak; the output is numpy's
    # wrapping of Rust's vector, which tracemalloc does not see.
    rng = np.random.default_rng(1)
    blocks = 64 * 960
    raw = rng.integers(0, 256, (blocks, 34), dtype=np.uint8)
    raw[:, :2] = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)  # finite scales
    data = raw.reshape(64, -1)
    q8 = gguf.GGMLQuantizationType.Q8_0
    want = gguf.quants.dequantize(data, q8)
    tracemalloc.start()
    try:
        got = wg.dequantize(data, q8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < data.nbytes // 4, peak
    assert _bits(got) == _bits(want)
    # A strided input is made contiguous first, and gives the same values.
    strided = np.concatenate([data, data], axis=1)[:, : data.shape[1]]
    assert not strided.flags.c_contiguous
    assert _bits(wg.dequantize(strided, q8)) == _bits(want)


def test_patched_name_maps_are_each_callers_own():
    arch = gguf.MODEL_ARCH.LLAMA
    calls = []
    original = gguf.get_tensor_name_map

    def counting(a, n):
        calls.append((a, n))
        return original(a, n)

    gguf.get_tensor_name_map = counting
    wg.patch()
    try:
        first = gguf.get_tensor_name_map(arch, 2)
        key = next(iter(first.mapping))
        first.mapping["added.by.one.caller"] = first.mapping[key]
        del first.mapping[key]
        second = gguf.get_tensor_name_map(arch, 2)
        assert "added.by.one.caller" not in second.mapping
        assert second.mapping == original(arch, 2).mapping
        assert second.get_name(key) == original(arch, 2).get_name(key)
        assert calls == [(arch, 2)]  # built once per architecture and block count
    finally:
        wg.unpatch()
        gguf.get_tensor_name_map = original
