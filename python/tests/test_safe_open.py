"""weightmap.safe_open, weightmap.numpy and weightmap.torch against their
oracles: safetensors' own safe_open / load_file (numpy and torch) on files
safetensors writes here, safetensors.deserialize for the raw bytes of every
dtype, and gguf-py's GGUFReader for GGUF.

torch is optional: its tests skip when it cannot be imported, unless
WEIGHTMAP_REQUIRE_TORCH=1 (CI sets it), when they fail instead.
"""

import hashlib
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gguf
import safetensors
import safetensors.numpy
from safetensors import safe_open as st_safe_open

import weightmap
import weightmap.numpy
import weightmap.torch

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - the CI installs it
    ml_dtypes = None

try:
    import torch
except ImportError:  # pragma: no cover - the CI installs it
    torch = None
    if os.environ.get("WEIGHTMAP_REQUIRE_TORCH") == "1":
        raise

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
needs_ml_dtypes = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = ROOT / "testdata"
SHARDS = TESTDATA / "shards"
GGUF_FILES = ["tiny-llama.gguf", "quant-types.gguf", "align8.gguf", "empty.gguf"]

# safetensors' dtype code -> the numpy dtype name safetensors.numpy.save_file
# writes it from (ml_dtypes' for bf16 and the 8-bit floats).
DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}
ML_DTYPES = {"BF16", "F8_E4M3", "F8_E4M3FNUZ", "F8_E5M2", "F8_E5M2FNUZ", "F8_E8M0"}

# torch names every one of these dtypes as numpy and ml_dtypes do.
TORCH_DTYPES = dict(DTYPES)

# Indices that TGI, transformers and the like use, and the rest safetensors
# accepts: ints (negative too), slices, steps, tuples, Ellipsis.
INDICES = [
    0,
    -1,
    slice(None),
    slice(1, 3),
    slice(0, 0),
    slice(None, None, 2),
    slice(1, None, 3),
    (slice(None), slice(1, 4)),
    (slice(None), slice(None, None, 2)),
    (1, slice(2, 5)),
    (Ellipsis, 1),
    (Ellipsis, slice(0, 2)),
    (0, Ellipsis),
    (slice(None), 2),
    (1, 2),
    (slice(5, 1),),
]

# Indices safetensors refuses under numpy (out of range, too many, lists),
# and ones it cannot parse (negative bounds and steps) that numpy takes.
BAD_INDICES = [
    6,
    -7,
    slice(0, 20),
    (slice(None), slice(None, 8)),
    (slice(2, None), 20),
    (slice(None), -8),
    (0, 0, 0),
    (Ellipsis, Ellipsis),
    [0, 1],
    [],
    slice(-3, None),
    slice(None, None, -1),
    slice(7, None),
    slice(6, None),
]
# An empty range at the end of a dimension: safetensors refuses it (its
# bound check has start >= size), weightmap gives numpy's empty selection.
EMPTY_AT_END = [slice(6, None)]


def _np_dtype(code):
    name = DTYPES[code]
    if code in ML_DTYPES:
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def _random_array(rng, code, shape):
    dt = _np_dtype(code)
    n = int(np.prod(shape, dtype=np.int64))
    if code == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    raw = rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def write_every_dtype(path, metadata=None, seed=0):
    """A file safetensors writes: every dtype weightmap reads, in a matrix,
    plus a scalar, an empty tensor and a vector."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for code in DTYPES:
        tensors[f"t.{code.lower()}"] = _random_array(rng, code, (6, 7))
    tensors["scalar.f32"] = np.array(3.25, dtype=np.float32)
    tensors["scalar.bf16"] = _random_array(rng, "BF16", ())
    tensors["empty.f16"] = np.zeros((0, 4), dtype=np.float16)
    tensors["empty.i32"] = np.zeros((3, 0, 2), dtype=np.int32)
    tensors["vec.u8"] = _random_array(rng, "U8", (11,))
    safetensors.numpy.save_file(tensors, path, metadata=metadata)
    return tensors


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory):
    d = tmp_path_factory.mktemp("st")
    path = d / "every-dtype.safetensors"
    write_every_dtype(path, metadata={"format": "pt", "note": "every dtype"})
    return path


def raw_tensors(path):
    """safetensors' own view of a file: name -> (dtype code, shape, bytes)."""
    data = pathlib.Path(path).read_bytes()
    return {k: (v["dtype"], list(v["shape"]), bytes(v["data"])) for k, v in safetensors.deserialize(data)}


def np_bytes(a):
    return np.ascontiguousarray(a).tobytes()


def torch_bytes(t):
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).numpy().tobytes()


# ---------------------------------------------------------------- numpy, safetensors


def test_np_every_dtype_against_safetensors(every_dtype):
    raw = raw_tensors(every_dtype)
    with weightmap.safe_open(every_dtype, framework="np") as f, st_safe_open(every_dtype, "np") as ref:
        assert f.keys() == ref.keys()
        assert f.offset_keys() == ref.offset_keys()
        assert f.metadata() == ref.metadata() == {"format": "pt", "note": "every dtype"}
        for k in ref.keys():
            code, shape, data = raw[k]
            a = f.get_tensor(k)
            assert isinstance(a, np.ndarray)
            assert list(a.shape) == shape, k
            assert np_bytes(a) == data, k
            assert a.dtype == _np_dtype(code), k
            assert not a.flags.writeable and not a.flags.owndata, k
            assert type(a.base).__name__ == "_Owner", k  # a view of the mapping
            try:
                want = ref.get_tensor(k)
            except (TypeError, AttributeError):
                # safetensors refuses the 8-bit floats under numpy.
                assert code in ML_DTYPES, k
                continue
            assert a.dtype == want.dtype and a.shape == want.shape, k
            assert np_bytes(a) == np_bytes(want), k
            s = f.get_slice(k)
            assert s.get_shape() == ref.get_slice(k).get_shape() == shape
            assert s.get_dtype() == ref.get_slice(k).get_dtype() == code


def test_np_scalar_and_empty(every_dtype):
    with weightmap.safe_open(every_dtype, "numpy") as f:
        s = f.get_tensor("scalar.f32")
        assert s.shape == () and s.item() == 3.25
        e = f.get_tensor("empty.f16")
        assert e.shape == (0, 4) and e.dtype == np.float16
        assert f.get_tensor("empty.i32").shape == (3, 0, 2)
        assert f.get_slice("empty.f16").get_shape() == [0, 4]
        assert f.get_slice("empty.f16")[:].shape == (0, 4)


@pytest.mark.parametrize("index", INDICES + BAD_INDICES, ids=repr)
def test_np_slices_against_safetensors(every_dtype, index):
    with weightmap.safe_open(every_dtype, "np") as f, st_safe_open(every_dtype, "np") as ref:
        for k in ("t.f32", "t.i16", "t.bool", "t.f64", "vec.u8"):
            full = f.get_tensor(k)
            try:
                want = ref.get_slice(k)[index]
            except safetensors.SafetensorError as e:
                if index in EMPTY_AT_END:
                    # The one deliberate difference: numpy's empty selection.
                    got = f.get_slice(k)[index]
                    assert got.size == 0 and got.shape == full[index].shape
                    continue
                # Refused by safetensors: by weightmap too, with its message.
                with pytest.raises(weightmap.SafetensorError) as got:
                    f.get_slice(k)[index]
                assert str(got.value) == str(e), (k, index)
                assert isinstance(got.value, safetensors.SafetensorError)
                continue
            except Exception:
                want = None  # safetensors cannot parse it; numpy's indexing is the oracle
            got = f.get_slice(k)[index]
            want_np = ref.get_tensor(k)[index]
            assert isinstance(got, np.ndarray), (k, index)  # 0-d, never a numpy scalar
            assert got.shape == np.shape(want_np) and got.dtype == want_np.dtype, k
            assert np_bytes(got) == np_bytes(want_np), k
            if want is not None:
                assert isinstance(want, np.ndarray)
                assert got.shape == want.shape, (k, index)
                assert np_bytes(got) == np_bytes(want), (k, index)
            # A view of the mapping, not a copy, when numpy can view it.
            if got.size:
                assert np.shares_memory(got, full), (k, index)
                assert not got.flags.writeable


def test_np_advanced_index_copies(every_dtype):
    with weightmap.safe_open(every_dtype, "np") as f:
        full = f.get_tensor("t.f32")
        # A list is refused, as safetensors refuses it; an index array is numpy's.
        with pytest.raises(weightmap.SafetensorError, match="Non empty lists are not implemented"):
            f.get_slice("t.f32")[[0, 2]]
        got = f.get_slice("t.f32")[np.array([0, 2])]
        assert np.array_equal(got, full[[0, 2]])
        assert not np.shares_memory(got, full)


def test_np_bf16_and_float8_are_ml_dtypes(every_dtype):
    raw = raw_tensors(every_dtype)
    with weightmap.safe_open(every_dtype, "np") as f:
        for code in ML_DTYPES:
            k = f"t.{code.lower()}"
            a = f.get_tensor(k)
            if ml_dtypes is None:  # pragma: no cover
                continue
            assert a.dtype == np.dtype(getattr(ml_dtypes, DTYPES[code]))
            assert a.tobytes() == raw[k][2]
        if ml_dtypes is not None:
            # bfloat16 is the top half of float32: the conversion is exact.
            b = f.get_tensor("t.bf16")
            bits = b.view(np.uint16).astype(np.uint32) << 16
            wide = b.astype(np.float32)
            finite = np.isfinite(wide)
            assert np.array_equal(wide.view(np.uint32)[finite], bits[finite])


def test_np_load_file_against_safetensors(tmp_path):
    path = tmp_path / "plain.safetensors"
    rng = np.random.default_rng(3)
    tensors = {f"layer.{i}.w": rng.standard_normal((8, 5 + i)).astype(np.float32) for i in range(6)}
    tensors["norm"] = rng.standard_normal(5).astype(np.float16)
    safetensors.numpy.save_file(tensors, path)
    got = weightmap.numpy.load_file(path)
    want = safetensors.numpy.load_file(path)
    assert list(got) == list(want)  # file order, as safetensors' get_tensors
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
        assert np.array_equal(got[k], want[k])
        assert not got[k].flags.writeable


@pytest.mark.parametrize(
    "metadata", [None, {}, {"format": "pt"}, {"a": "1", "b": "two", "format": "np"}], ids=repr
)
def test_metadata_as_safetensors_gives_it(tmp_path, metadata):
    path = tmp_path / "m.safetensors"
    safetensors.numpy.save_file({"x": np.ones(3, np.float32)}, path, metadata=metadata)
    with st_safe_open(path, "np") as ref:
        want = ref.metadata()
    for framework in ["np"] + (["pt"] if torch is not None else []):
        with weightmap.safe_open(path, framework) as f:
            got = f.metadata()
        assert got == want, framework
        assert (got is None) == (want is None), framework


def test_closed_handle_and_context_manager(every_dtype):
    f = weightmap.safe_open(every_dtype, "np")
    with f as g:
        assert g is f
        a = f.get_tensor("t.f32")
        s = f.get_slice("t.f32")
        want = a.tobytes()
    for call in (f.keys, f.offset_keys, f.metadata, f.get_tensors):
        with pytest.raises(ValueError, match="closed"):
            call()
    with pytest.raises(ValueError, match="closed"):
        f.get_tensor("t.f32")
    with pytest.raises(ValueError, match="closed"):
        f.get_slice("t.f32")
    assert "closed" in repr(f)
    del f, g
    # Arrays and slices outlive the handle.
    assert a.tobytes() == want
    assert s[1:3].tobytes() == a[1:3].tobytes()


def test_bad_framework_device_and_name(every_dtype):
    for bad in ("tf", "flax", "mlx"):
        with pytest.raises(ValueError, match="not supported"):
            weightmap.safe_open(every_dtype, bad)
    with pytest.raises(ValueError, match="invalid"):
        weightmap.safe_open(every_dtype, "tensorflow2")
    with pytest.raises(ValueError, match="device"):
        weightmap.safe_open(every_dtype, "np", device="cuda:0")
    with pytest.raises(ValueError, match="device"):
        weightmap.safe_open(every_dtype, "np", device=0)
    with weightmap.safe_open(every_dtype, "np", device="cpu") as f:
        # safetensors' error and message for a missing tensor.
        for call in (f.get_tensor, f.get_slice):
            with pytest.raises(weightmap.SafetensorError) as e:
                call("no.such")
            assert str(e.value) == "File does not contain tensor no.such"
    missing = every_dtype.parent / "nope.safetensors"
    with pytest.raises(FileNotFoundError) as e:
        weightmap.safe_open(missing, "np")
    assert str(e.value) == f"No such file or directory: {missing}"
    bad = every_dtype.parent / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    for framework in ("np", "pt") if torch is not None else ("np",):
        with pytest.raises(weightmap.SafetensorError) as e:
            weightmap.safe_open(bad, framework)
        assert isinstance(e.value, weightmap.Error) and e.value.kind == "invalid_file"
        assert str(e.value).startswith("Error while deserializing header: ")
        with pytest.raises(safetensors.SafetensorError):
            st_safe_open(bad, framework)


def _run(script, *args):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_np_without_ml_dtypes_is_a_clear_error(every_dtype):
    r = _run(
        """
        import sys
        sys.modules["ml_dtypes"] = None  # import ml_dtypes fails
        import numpy as np, weightmap
        with weightmap.safe_open(sys.argv[1], "np") as f:
            assert f.get_tensor("t.f32").dtype == np.float32
            for k in ("t.bf16", "t.f8_e4m3"):
                try:
                    f.get_tensor(k)
                except TypeError as e:
                    assert "ml_dtypes" in str(e), e
                else:
                    raise SystemExit(k + " did not raise")
        print("OK")
        """,
        every_dtype,
    )
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


def test_package_imports_without_torch(every_dtype):
    r = _run(
        """
        import sys
        sys.modules["torch"] = None  # import torch fails
        import weightmap, weightmap.numpy, weightmap.torch
        assert len(weightmap.numpy.load_file(sys.argv[1])) > 0
        for call in (lambda: weightmap.safe_open(sys.argv[1], "pt"),
                     lambda: weightmap.torch.load_file(sys.argv[1])):
            try:
                call()
            except ImportError as e:
                assert "torch" in str(e), e
            else:
                raise SystemExit("no ImportError")
        print("OK")
        """,
        every_dtype,
    )
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


# ---------------------------------------------------------------- torch, safetensors


@needs_torch
def test_pt_every_dtype_against_safetensors(every_dtype):
    raw = raw_tensors(every_dtype)
    with weightmap.safe_open(every_dtype, framework="pt") as f, st_safe_open(every_dtype, "pt") as ref:
        assert f.keys() == ref.keys()
        assert f.offset_keys() == ref.offset_keys()
        assert f.metadata() == ref.metadata()
        for k in ref.keys():
            code, shape, data = raw[k]
            t = f.get_tensor(k)
            want = ref.get_tensor(k)
            assert isinstance(t, torch.Tensor)
            assert t.dtype == want.dtype == getattr(torch, TORCH_DTYPES[code]), k
            assert list(t.shape) == list(want.shape) == shape, k
            assert t.device.type == "cpu"
            assert torch_bytes(t) == torch_bytes(want) == data, k
            assert t.is_contiguous()
            s = f.get_slice(k)
            assert s.get_shape() == ref.get_slice(k).get_shape()
            assert s.get_dtype() == ref.get_slice(k).get_dtype() == code


@needs_torch
def test_pt_zero_copy(every_dtype):
    header = {k: v for k, v in _st_offsets(every_dtype).items()}
    with weightmap.safe_open(every_dtype, "torch") as f:
        a = f.get_tensor("t.f32")
        b = f.get_tensor("t.f32")
        c = f.get_tensor("t.i64")
        assert a.data_ptr() == b.data_ptr()
        # Two tensors are as far apart in memory as in the file: one mapping.
        assert c.data_ptr() - a.data_ptr() == header["t.i64"] - header["t.f32"]
        d = weightmap.torch.load_file(every_dtype)
        assert d["t.f32"].data_ptr() != a.data_ptr()  # a new handle maps anew


def _st_offsets(path):
    import json
    import struct

    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        h = json.loads(fh.read(n))
    return {k: 8 + n + v["data_offsets"][0] for k, v in h.items() if k != "__metadata__"}


@needs_torch
@pytest.mark.parametrize("index", INDICES + [[0, 2], []], ids=repr)
def test_pt_slices_against_safetensors(every_dtype, index):
    with weightmap.safe_open(every_dtype, "pytorch") as f, st_safe_open(every_dtype, "pt") as ref:
        for k in ("t.f32", "t.bf16", "t.i16", "t.bool", "t.u64"):
            full = f.get_tensor(k)
            got = f.get_slice(k)[index]
            want = ref.get_slice(k)[index]
            assert got.dtype == want.dtype and got.shape == want.shape, (k, index)
            assert got.is_contiguous() == want.is_contiguous(), (k, index)
            assert torch_bytes(got) == torch_bytes(want), (k, index)
            assert torch_bytes(got) == torch_bytes(full[index]), (k, index)
            basic = not isinstance(index, list)
            if basic and got.numel():
                # A view of the same mapped bytes, as safetensors' torch slices are.
                lo, hi = full.data_ptr(), full.data_ptr() + full.numel() * full.element_size()
                assert lo <= got.data_ptr() < hi, (k, index)


@needs_torch
def test_pt_load_file_against_safetensors(tmp_path):
    import safetensors.torch

    path = tmp_path / "model.safetensors"
    g = torch.Generator().manual_seed(0)
    tensors = {
        "embed": torch.randn(16, 8, generator=g).to(torch.bfloat16),
        "layer.0.w": torch.randn(8, 8, generator=g),
        "layer.0.b": torch.randn(8, generator=g).half(),
        "step": torch.tensor(7, dtype=torch.int64),
        "f8": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
    }
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
    got = weightmap.torch.load_file(path)
    want = safetensors.torch.load_file(path)
    assert list(got) == list(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch_bytes(got[k]) == torch_bytes(v), k
        assert torch_bytes(got[k]) == torch_bytes(tensors[k]), k
    with pytest.raises(ValueError, match="device"):
        weightmap.torch.load_file(path, device="cuda")


WRITE_SCRIPT = """
import gc, hashlib, sys
import numpy as np, torch, weightmap, weightmap.torch
from safetensors import safe_open as st_safe_open

st_path, gguf_path = sys.argv[1], sys.argv[2]
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
before = {p: sha(p) for p in (st_path, gguf_path)}

with weightmap.safe_open(st_path, "pt") as f:
    w = f.get_tensor("w")
    orig = w.clone()
    w[0, 0] = 42.0          # a write into the mapped file's bytes
    w[1].mul_(2)
    assert w[0, 0].item() == 42.0
    assert torch.equal(w[1], orig[1] * 2)
    s = f.get_slice("w")[2:4]
    s.fill_(-1.5)           # a view: lands in the same private pages
    assert bool((w[2:4] == -1.5).all())
    again = f.get_tensor("w")
    assert again[0, 0].item() == 42.0   # the same mapping
    b = f.get_tensor("b16")
    b.zero_()
    assert int(b.count_nonzero()) == 0

d = weightmap.torch.load_file(st_path)
assert torch.equal(d["w"], orig)      # a fresh open sees the file's bytes
d["w"].add_(1)
del d

with weightmap.safe_open(gguf_path, "pt") as g:
    for k in g.offset_keys():
        t = g.get_tensor(k)
        if t.numel():
            t.view(-1)[0] = 1 if t.dtype != torch.bool else True
            t.reshape(-1).view(torch.uint8)[-1] = 0xA5 if t.dtype != torch.bool else 1

w.add_(1)                 # still valid after the handle closed
del f, s, again, b
gc.collect()
w.sub_(1)
assert w[0, 0].item() == 42.0
del w
gc.collect()

after = {p: sha(p) for p in (st_path, gguf_path)}
assert after == before, "the file changed"
with weightmap.safe_open(st_path, "pt") as f:
    assert torch.equal(f.get_tensor("w"), orig)
with st_safe_open(st_path, "pt") as f:
    assert torch.equal(f.get_tensor("w"), orig)
with weightmap.safe_open(st_path, "np") as f:
    assert np.array_equal(f.get_tensor("w"), orig.numpy())
print("OK")
"""


@needs_torch
def test_pt_write_never_crashes_nor_reaches_the_file(tmp_path):
    import shutil

    import safetensors.torch

    st = tmp_path / "w.safetensors"
    safetensors.torch.save_file(
        {"w": torch.arange(4 * 6, dtype=torch.float32).reshape(4, 6), "b16": torch.ones(5, dtype=torch.bfloat16)},
        st,
    )
    gg = tmp_path / "quant-types.gguf"
    shutil.copy(TESTDATA / "quant-types.gguf", gg)
    before = (st.read_bytes(), gg.read_bytes())
    r = _run(WRITE_SCRIPT, st, gg)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "OK" in r.stdout, r.stderr
    assert (st.read_bytes(), gg.read_bytes()) == before


RSS_SCRIPT = """
import sys
import weightmap
def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
path, framework = sys.argv[1], sys.argv[2]
if framework == "pt":
    import torch
base = rss_anon()
with weightmap.safe_open(path, framework) as f:
    kept = {k: f.get_tensor(k) for k in f.keys()}
total = 0
for t in kept.values():
    total += int(t.reshape(-1)[::1024].sum())   # read every 4 KiB page
print(rss_anon() - base, total)
"""


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_every_tensor_touched_costs_no_anonymous_memory(tmp_path, framework):
    """64 MiB of tensors, every page read, all kept: RssAnon grows by far
    less than the data (a copying loader grows by all of it)."""
    if framework == "pt" and torch is None:
        pytest.skip("torch is not installed")
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc/self/status")
    path = tmp_path / "big.safetensors"
    tensors = {f"w.{i}": np.full((1024, 1024), i, dtype=np.float32) for i in range(16)}
    safetensors.numpy.save_file(tensors, path)
    r = _run(RSS_SCRIPT, path, framework)
    assert r.returncode == 0, r.stderr
    grew, total = map(int, r.stdout.split())
    assert total == sum(i * 1024 * 1024 for i in range(16)) // 1024
    assert grew < 16 * 2**20, f"RssAnon grew by {grew / 2**20:.1f} MiB"


# ---------------------------------------------------------------- GGUF


def _gguf_dtype_str(t):
    return t.tensor_type.name


@pytest.mark.parametrize("name", GGUF_FILES)
def test_gguf_np_against_gguf_py(name):
    path = TESTDATA / name
    r = gguf.GGUFReader(path)
    with weightmap.safe_open(path, "np") as f, weightmap.open(path) as w:
        assert f.offset_keys() == [t.name for t in r.tensors]
        assert f.keys() == sorted(t.name for t in r.tensors)
        assert f.metadata() == w.metadata()
        for t in r.tensors:
            a = f.get_tensor(t.name)
            s = f.get_slice(t.name)
            assert s.get_dtype() == _gguf_dtype_str(t)
            assert a.tobytes() == t.data.tobytes(), t.name
            assert not a.flags.writeable
            if t.tensor_type == gguf.GGMLQuantizationType.BF16:
                assert a.shape == tuple(int(d) for d in reversed(t.shape))
            else:
                assert a.dtype == t.data.dtype and a.shape == t.data.shape, t.name
            assert s.get_shape() == list(a.shape)
            if a.ndim and a.shape[0] > 1:
                assert np.array_equal(s[1:], a[1:])
                assert np.shares_memory(s[1:], a)


@needs_torch
@pytest.mark.parametrize("name", GGUF_FILES)
def test_gguf_pt_against_gguf_py(name):
    """As ComfyUI-GGUF sees a GGUF through gguf-py (torch.from_numpy of each
    tensor's data): quantized types as uint8 rows of bytes, plain types as
    their torch dtype."""
    path = TESTDATA / name
    r = gguf.GGUFReader(path)
    plain = {
        "F32": torch.float32,
        "F16": torch.float16,
        "F64": torch.float64,
        "I8": torch.int8,
        "I16": torch.int16,
        "I32": torch.int32,
        "I64": torch.int64,
        "BF16": torch.bfloat16,
    }
    with weightmap.safe_open(path, "pt") as f:
        assert f.offset_keys() == [t.name for t in r.tensors]
        assert f.keys() == sorted(t.name for t in r.tensors)
        for t in r.tensors:
            x = f.get_tensor(t.name)
            code = _gguf_dtype_str(t)
            assert f.get_slice(t.name).get_dtype() == code
            assert torch_bytes(x) == t.data.tobytes(), t.name
            if code in plain:
                assert x.dtype == plain[code], t.name
                if code != "BF16":
                    ref = torch.from_numpy(np.array(t.data))
                    assert x.shape == ref.shape and torch.equal(x, ref), t.name
                else:
                    assert tuple(x.shape) == tuple(int(d) for d in reversed(t.shape))
            else:
                assert x.dtype == torch.uint8, t.name
                assert tuple(x.shape) == t.data.shape, t.name
            assert f.get_slice(t.name).get_shape() == list(x.shape)


@pytest.mark.parametrize("framework", ["np", "pt"])
@pytest.mark.parametrize("which", [0, 2])
def test_split_gguf(framework, which):
    if framework == "pt" and torch is None:
        pytest.skip("torch is not installed")
    paths = sorted(SHARDS.glob("split-*.gguf"))
    readers = [gguf.GGUFReader(p) for p in paths]
    want = [t for r in readers for t in r.tensors]
    with weightmap.safe_open(paths[which], framework) as f:
        assert f.offset_keys() == [t.name for t in want]
        assert f.keys() == sorted(t.name for t in want)
        md = f.metadata()
        assert md["split.count"] == 3
        for t in want:
            x = f.get_tensor(t.name)
            got = np_bytes(x) if framework == "np" else torch_bytes(x)
            assert got == t.data.tobytes(), t.name


@pytest.mark.parametrize("framework", ["np", "pt"])
@pytest.mark.parametrize("target", ["hf/model.safetensors.index.json", "hf"])
def test_sharded_safetensors(framework, target):
    if framework == "pt" and torch is None:
        pytest.skip("torch is not installed")
    files = sorted((SHARDS / "hf").glob("*.safetensors"))
    want_order, want = [], {}
    for p in files:
        with st_safe_open(p, framework) as ref:
            want_order += ref.offset_keys()
            for k in ref.keys():
                want[k] = ref.get_tensor(k)
    with st_safe_open(files[0], framework) as ref:
        first_md = ref.metadata()
    with weightmap.safe_open(SHARDS / target, framework) as f:
        assert f.keys() == sorted(want)
        assert f.offset_keys() == want_order
        assert f.metadata() == first_md
        for k, v in want.items():
            x = f.get_tensor(k)
            assert x.dtype == v.dtype and tuple(x.shape) == tuple(v.shape), k
            if framework == "np":
                assert np_bytes(x) == np_bytes(v), k
            else:
                assert torch_bytes(x) == torch_bytes(v), k
    loader = weightmap.numpy.load_file if framework == "np" else weightmap.torch.load_file
    assert list(loader(SHARDS / target)) == want_order
