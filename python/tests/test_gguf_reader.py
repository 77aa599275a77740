"""weightmap.gguf against gguf-py 0.19 (the oracle): GGUFReader field by
field and tensor by tensor on every committed GGUF fixture and on a
vocabulary file gguf-py's own writer makes (262,144 tokens, as gemma 3's);
dequantize bit for bit on every type of quant-types.gguf; patch()/unpatch().
"""

import pathlib

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
        # The name map is built once per architecture and block count, and
        # is the map gguf-py builds.
        arch = gguf.MODEL_ARCH.LLAMA
        m = gguf.get_tensor_name_map(arch, 4)
        assert gguf.get_tensor_name_map(arch, 4) is m
        assert gguf.get_tensor_name_map(arch, 5) is not m
        fresh = name_map(arch, 4)
        assert m.mapping == fresh.mapping
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
