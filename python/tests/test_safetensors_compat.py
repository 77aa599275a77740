"""What makes weightmap.safe_open a drop-in for safetensors' readers, beyond
the values (test_safe_open.py): backend=, SafetensorError and its messages,
the sub-byte dtypes F4 and F6, F8_E8M0, slices without ml_dtypes, 0-d
arrays. safetensors' own safe_open is the oracle throughout; its own test
suite runs with weightmap swapped in by .ci/safetensors-suite.sh.
"""

import json
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import safetensors
import safetensors.numpy
from safetensors import safe_open as st_safe_open

import weightmap
import weightmap.numpy
import weightmap.torch

try:
    import torch
except ImportError:  # pragma: no cover - the CI installs it
    torch = None
    if os.environ.get("WEIGHTMAP_REQUIRE_TORCH") == "1":
        raise

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tmp_path_factory.mktemp("compat") / "plain.safetensors"
    rng = np.random.default_rng(7)
    safetensors.numpy.save_file(
        {
            "w": rng.standard_normal((5, 3)).astype(np.float32),
            "v": np.arange(6, dtype=np.int64),
            "s": np.array(2.5, dtype=np.float16),
            "e": np.zeros((0, 2), dtype=np.float32),
        },
        path,
        metadata={"k": "v"},
    )
    return path


def test_safetensor_error_is_both_errors():
    assert issubclass(weightmap.SafetensorError, weightmap.Error)
    assert issubclass(weightmap.SafetensorError, ValueError)
    assert issubclass(weightmap.SafetensorError, safetensors.SafetensorError)
    e = weightmap.SafetensorError("File is closed")
    assert str(e) == "File is closed"


def test_closed_handle_is_safetensors_error(plain):
    with weightmap.safe_open(plain, "np") as f:
        pass
    for call in (f.keys, f.metadata, lambda: f.get_tensor("w"), lambda: f.get_slice("w")):
        with pytest.raises(safetensors.SafetensorError) as e:
            call()
        assert str(e.value) == "File is closed"


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_backend_pread_gives_what_mmap_gives(plain, framework):
    if framework == "pt" and torch is None:
        pytest.skip("torch is not installed")
    with weightmap.safe_open(plain, framework, backend="mmap") as f, weightmap.safe_open(
        plain, framework, backend="pread"
    ) as g, _reference_open(plain, framework, backend="pread") as ref:
        assert f.keys() == g.keys() == ref.keys()
        assert g.metadata() == ref.metadata() == {"k": "v"}
        for k in ref.keys():
            a, b, want = f.get_tensor(k), g.get_tensor(k), ref.get_tensor(k)
            assert b.dtype == want.dtype and tuple(b.shape) == tuple(want.shape), k
            if framework == "np":
                assert a.tobytes() == b.tobytes() == want.tobytes(), k
            else:
                assert torch.equal(a, b) and torch.equal(b, want), k
            assert g.get_slice(k).get_shape() == ref.get_slice(k).get_shape()
        if framework == "pt":
            # pread tensors own their bytes: a write changes neither the file
            # nor another handle's view of it.
            t = g.get_tensor("w")
            t.add_(1)
            assert torch.equal(f.get_tensor("w") + 1, t)
            assert torch.equal(weightmap.torch.load_file(plain, backend="pread")["w"], f.get_tensor("w"))
        else:
            arrays = weightmap.numpy.load_file(plain, backend="pread")
            assert all(arrays[k].tobytes() == f.get_tensor(k).tobytes() for k in arrays)


def test_bad_backend_names_both(plain):
    for framework in ("np", "pt") if torch is not None else ("np",):
        with pytest.raises(safetensors.SafetensorError) as e:
            weightmap.safe_open(plain, framework, backend="mmapp")
        assert str(e.value) == 'backend "mmapp" is invalid (expected one of: "mmap", "pread")'
        with pytest.raises(TypeError):
            weightmap.safe_open(plain, framework, backend=1)


def test_missing_file_pread(tmp_path):
    missing = tmp_path / "notafile"
    with pytest.raises(FileNotFoundError) as e:
        weightmap.safe_open(missing, "np", backend="pread")
    assert str(e.value) == f"No such file or directory: {missing}"


def _reference_open(path, framework, backend):
    """safetensors' safe_open with backend=, or without it where the installed
    safetensors predates the argument (0.7, the last release for CPython 3.9):
    its one reader is then the oracle for both of weightmap's."""
    try:
        return st_safe_open(path, framework, backend=backend)
    except TypeError:
        return st_safe_open(path, framework)


def _reference_scalar(ref, name, index):
    """The reference slice's element as a 0-d array, or, where the installed
    safetensors' slices take no integer or Ellipsis index (0.7), the same
    element of its whole tensor."""
    try:
        return ref.get_slice(name)[index]
    except TypeError:
        return np.asarray(ref.get_tensor(name)[index])


def test_scalar_index_gives_0d_arrays(plain):
    with weightmap.safe_open(plain, "np") as f, st_safe_open(plain, "np") as ref:
        for index in (1, -1, (2,), (Ellipsis, 3)):
            got, want = f.get_slice("v")[index], _reference_scalar(ref, "v", index)
            assert type(got) is np.ndarray and got.shape == () == want.shape
            assert got.item() == want.item()
        got, want = f.get_slice("w")[4, 2], _reference_scalar(ref, "w", (4, 2))
        assert type(got) is np.ndarray and got.shape == () and got.item() == want.item()
        # A 0-d tensor's slice is itself.
        assert f.get_slice("s")[()].shape == () and f.get_slice("s")[()].item() == 2.5


def _header_file(path, entries, data):
    """A safetensors file written byte by byte (for dtypes no writer here has)."""
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def test_sub_byte_dtypes_fail_only_their_own_access(tmp_path):
    path = tmp_path / "subbyte.safetensors"
    f4 = bytes(range(0x10, 0x1c))  # 12 bytes: 24 fp4 values, shape [4, 6]
    f6 = bytes(range(0x40, 0x49))  # 9 bytes: 12 fp6 values, shape [3, 4]
    scale = bytes([126, 127, 128, 129])  # E8M0: 0.5, 1, 2, 4
    entries = {
        "fp4": {"dtype": "F4", "shape": [4, 6], "data_offsets": [0, 12]},
        "fp6": {"dtype": "F6_E2M3", "shape": [3, 4], "data_offsets": [12, 21]},
        "scale": {"dtype": "F8_E8M0", "shape": [4], "data_offsets": [21, 25]},
    }
    _header_file(path, entries, f4 + f6 + scale)
    with weightmap.safe_open(path, "np") as f, st_safe_open(path, "np") as ref:
        assert f.keys() == ref.keys() == ["fp4", "fp6", "scale"]
        for k in ("fp4", "fp6"):
            assert f.get_slice(k).get_shape() == ref.get_slice(k).get_shape()
            assert f.get_slice(k).get_dtype() == ref.get_slice(k).get_dtype()
            with pytest.raises(TypeError, match=ref.get_slice(k).get_dtype()):
                f.get_tensor(k)
        s = f.get_tensor("scale")  # ml_dtypes' float8_e8m0fnu
        assert s.tobytes() == scale and [float(x) for x in s] == [0.5, 1.0, 2.0, 4.0]
    with weightmap.open(path) as w:  # weightmap's own API gives the packed bytes
        assert w["fp4"].dtype == np.uint8 and w["fp4"].shape == (4, 3)
        assert w["fp4"].tobytes() == f4
        assert w.info("fp6")["type"] == "f6_e2m3"
    if torch is None:
        return
    with weightmap.safe_open(path, "pt") as f, st_safe_open(path, "pt") as ref:
        got, want = f.get_tensor("fp4"), ref.get_tensor("fp4")
        assert got.dtype == want.dtype == torch.float4_e2m1fn_x2
        assert got.shape == want.shape == (4, 3)
        assert got.view(torch.uint8).numpy().tobytes() == want.view(torch.uint8).numpy().tobytes() == f4
        with pytest.raises(TypeError, match="F6_E2M3"):
            f.get_tensor("fp6")
        with pytest.raises(Exception):
            ref.get_tensor("fp6")  # safetensors has no torch dtype for it either
        got, want = f.get_tensor("scale"), ref.get_tensor("scale")
        assert got.dtype == want.dtype == torch.float8_e8m0fnu
        assert got.float().tolist() == want.float().tolist() == [0.5, 1.0, 2.0, 4.0]
        # Elements that do not fill whole bytes are a bad header, as safetensors says.
    bad = tmp_path / "odd.safetensors"
    _header_file(bad, {"x": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"\0\0")
    with pytest.raises(safetensors.SafetensorError):
        st_safe_open(bad, "np")
    with pytest.raises(weightmap.SafetensorError, match="whole number of bytes"):
        weightmap.safe_open(bad, "np")


def test_slices_without_ml_dtypes(plain, tmp_path):
    path = tmp_path / "bf16.safetensors"
    _header_file(
        path,
        {
            "b": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
            "f": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]},
        },
        bytes(range(12)) + np.array([1.5, 2.5], dtype=np.float32).tobytes(),
    )
    script = """
        import sys
        sys.modules["ml_dtypes"] = None  # import ml_dtypes fails
        import weightmap
        with weightmap.safe_open(sys.argv[1], "np") as f:
            s = f.get_slice("b")  # no TypeError: the slice is lazy
            assert s.get_shape() == [2, 3] and s.get_dtype() == "BF16", s
            try:
                s[0]
            except TypeError as e:
                assert "ml_dtypes" in str(e), e
            else:
                raise SystemExit("indexing bf16 without ml_dtypes did not raise")
            assert f.get_slice("f")[1:].tolist() == [2.5]
        print("OK")
    """
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


@needs_torch
def test_pt_slice_after_close_and_pread(plain):
    with weightmap.safe_open(plain, "pt", backend="pread") as f:
        s = f.get_slice("w")
    with st_safe_open(plain, "pt") as ref:
        want = ref.get_slice("w")[:, 1:3]
    got = s[:, 1:3]
    assert torch.equal(got, want)
