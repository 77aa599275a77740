"""weightmap.gguf.patch(cache=...): transformers' converted GGUF checkpoint
in weightmap's transform cache, and the binding under it
(weightmap._weightmap._cache_lookup, _CacheMiss.write and _CacheEntry).

The binding's tests need numpy only, but for the entry's torch tensors,
which need torch. The transformers tests need torch, transformers and the
models `weightmap gen` makes (_transformers_env.py); each load that must be
a fresh process (the second run of a cache, a run after a corruption) is a
subprocess.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from _transformers_env import MODELS, needs_transformers, torch

import weightmap
import weightmap.numpy
from weightmap._weightmap import _cache_lookup

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "testdata" / "tiny-llama.gguf"

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


@pytest.fixture
def source(tmp_path):
    p = tmp_path / "src.gguf"
    shutil.copyfile(SOURCE, p)
    return p


def _lookup(source, cache, name="t", machine=""):
    return _cache_lookup(str(source), name, 1, machine, str(cache))


LONG = "model.layers.0.self_attn.a_name_longer_than_ggufs_63_bytes.weight" * 2


def _tensors():
    rng = np.random.default_rng(7)
    out = [
        ("f32", rng.standard_normal((3, 5)).astype(np.float32)),
        ("f16", rng.standard_normal(9).astype(np.float16)),
        ("f64", rng.standard_normal((2, 2, 3)).astype(np.float64)),
        ("i8", np.arange(-5, 5, dtype=np.int8)),
        ("i16", np.arange(12, dtype=np.int16).reshape(3, 4)),
        ("i32", np.arange(8, dtype=np.int32).reshape(1, 2, 2, 2)),
        ("i64", np.array([2**40, -1], dtype=np.int64)),
        # Not contiguous: stored as its contiguous copy.
        ("transposed", np.arange(12, dtype=np.float32).reshape(3, 4).T),
        (LONG, np.ones(4, dtype=np.float32)),
    ]
    return out


def test_binding_round_trips_tensors_names_and_metadata(source, tmp_path):
    cache = tmp_path / "cache"
    found = _lookup(source, cache)
    assert found["hit"] is None and found["replaced"] is None
    tensors = _tensors()
    bf16_bits = np.array([0x3F80, 0xC000, 0x7FC0], dtype=np.uint16)  # 1, -2, NaN
    items = [(n, a) for n, a in tensors] + [("bf16 bits", bf16_bits.view(np.int16), "BF16")]
    try:
        import ml_dtypes

        items.append(("bf16", np.array([1.5, -3.0], dtype=ml_dtypes.bfloat16)))
    except ImportError:  # pragma: no cover - CI installs it
        ml_dtypes = None
    metadata = {"json": json.dumps({"a": [1, 2.5, None]}), "text": "é ✓ " * 1000}
    written = found["miss"].write(items, metadata)
    assert written["outcome"] == "filled", written
    assert written["reason"] is None and os.path.isfile(written["entry"])
    with pytest.raises(ValueError, match="already written"):
        found["miss"].write(items, metadata)

    hit = _lookup(source, cache)
    assert hit["hit"] == written["entry"] and hit["miss"] is None
    assert hit["names"] == [i[0] for i in items]
    assert hit["metadata"] == metadata
    arrays = weightmap.numpy.load_file(hit["hit"])
    assert list(arrays) == [f"t.{i}" for i in range(len(items))]
    for i, item in enumerate(items):
        got, want = arrays[f"t.{i}"], np.ascontiguousarray(item[1])
        assert got.shape == want.shape, item[0]
        assert got.tobytes() == want.tobytes(), item[0]
        if len(item) == 2 and item[0] != "bf16":
            assert got.dtype == want.dtype, item[0]
    # Another transform, version or machine fact is another entry.
    assert _lookup(source, cache, name="other")["hit"] is None
    assert _lookup(source, cache, machine="avx2")["hit"] is None


def test_binding_writes_now_and_commits_later(source, tmp_path):
    cache = tmp_path / "cache"
    found = _lookup(source, cache)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    written = found["miss"].write([("x", x)], {"k": "v"}, commit=False)
    assert written["outcome"] == "pending", written
    # The bytes are in the temporary file already: a change to the array
    # now is not the entry's.
    x[0, 0] = 99.0
    early = weightmap.numpy.load_file(written["entry"])["t.0"]
    assert early.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert _lookup(source, cache)["hit"] is None  # not in place before the commit
    committed = written["pending"].commit()
    assert committed["outcome"] == "filled", committed
    with pytest.raises(ValueError, match="already committed"):
        written["pending"].commit()
    hit = _lookup(source, cache)
    assert hit["hit"] == committed["entry"] and hit["metadata"] == {"k": "v"}
    assert early.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]  # the same bytes, renamed


@pytest.mark.parametrize(
    "items, error, match",
    [
        ([("u8", np.zeros(4, dtype=np.uint8))], TypeError, "cannot hold uint8"),
        ([("b", np.zeros(4, dtype=bool))], TypeError, "cannot hold bool"),
        ([("scalar", np.ones((), dtype=np.float32))], ValueError, "0 dimensions"),
        ([("5d", np.zeros((1, 1, 1, 1, 2), dtype=np.float32))], ValueError, "5 dimensions"),
        ([("x", np.zeros(4, dtype=np.float32), "Q4_K")], ValueError, "no entry type"),
        ([("x", np.zeros(4, dtype=np.float32), "BF16")], ValueError, "2 bytes"),
        ([("x", [1.0, 2.0])], TypeError, "not a numpy array"),
    ],
)
def test_binding_refuses_what_an_entry_cannot_hold(source, tmp_path, items, error, match):
    found = _lookup(source, tmp_path / "cache")
    with pytest.raises(error, match=match):
        found["miss"].write(items, {})
    # Nothing was written: the miss can still be.
    assert found["miss"].write([("ok", np.zeros(2, dtype=np.float32))], {})["outcome"] == "filled"


def test_binding_refuses_weightmaps_own_metadata_keys(source, tmp_path):
    found = _lookup(source, tmp_path / "cache")
    with pytest.raises(ValueError, match="weightmap's own"):
        found["miss"].write([], {"weightmap.cache.key": "forged"})


def test_binding_unwritable_directory_is_in_memory_with_a_reason(source, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    found = _lookup(source, blocker / "cache")
    assert found["hit"] is None
    written = found["miss"].write([("w", np.ones(3, dtype=np.float32))], {})
    assert written["outcome"] == "in_memory" and written["entry"] is None
    assert written["reason"] in ("io", "read_only"), written
    assert str(blocker) in written["message"]


def _first_tensor_offset(entry):
    with weightmap.open(entry) as w:
        return w.info("t.0")["file_offset"]


def test_binding_corrupted_entry_is_replaced(source, tmp_path):
    cache = tmp_path / "cache"
    entry = _lookup(source, cache)["miss"].write([("w", np.arange(64, dtype=np.float32))], {})["entry"]
    off = _first_tensor_offset(entry)
    with open(entry, "r+b") as f:
        f.seek(off + 1)
        b = f.read(1)
        f.seek(off + 1)
        f.write(bytes([b[0] ^ 0x01]))
    found = _lookup(source, cache)
    assert found["hit"] is None and found["replaced"], found
    written = found["miss"].write([("w", np.arange(64, dtype=np.float32))], {})
    assert written["outcome"] == "filled" and written["replaced"] == found["replaced"]
    assert _lookup(source, cache)["hit"] == entry
    assert (weightmap.numpy.load_file(entry)["t.0"] == np.arange(64, dtype=np.float32)).all()


def test_binding_source_rewritten_in_place_is_not_served(source, tmp_path):
    cache = tmp_path / "cache"
    _lookup(source, cache)["miss"].write([("w", np.ones(2, dtype=np.float32))], {})
    assert _lookup(source, cache)["hit"] is not None
    data = source.read_bytes()
    st = source.stat()
    with open(source, "r+b") as f:  # same inode, same bytes, a new mtime
        f.write(data)
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert _lookup(source, cache)["hit"] is None


def _decoy(entry, tmp_path):
    """A copy of ``entry`` with every byte of its first tensor flipped: a
    valid GGUF, of the same size and names, that a map by path would take
    for the entry."""
    decoy = tmp_path / "decoy.gguf"
    shutil.copyfile(entry, decoy)
    with weightmap.open(entry) as w:
        info = w.info("t.0")
    with open(decoy, "r+b") as f:
        f.seek(info["file_offset"])
        data = f.read(info["nbytes"])
        f.seek(info["file_offset"])
        f.write(bytes(b ^ 0xFF for b in data))
    return decoy


@needs_torch
@pytest.mark.parametrize("concurrently", ["renamed_over", "removed"])
def test_binding_hit_maps_the_file_it_checked_not_its_path(source, tmp_path, concurrently):
    cache = tmp_path / "cache"
    x = np.arange(1024, dtype=np.float32)
    _lookup(source, cache)["miss"].write([("x", x)], {})
    hit = _lookup(source, cache)
    assert hit["hit"] is not None and hit["entry_file"].path == hit["hit"]
    # Between the lookup's checks and the map: another fill renames a file
    # over the entry's name, or a prune or `cache clear` removes it.
    if concurrently == "renamed_over":
        os.replace(_decoy(hit["hit"], tmp_path), hit["hit"])
    else:
        os.remove(hit["hit"])
    tensors = hit["entry_file"].torch_tensors()
    assert list(tensors) == ["t.0"]
    assert tensors["t.0"].dtype == torch.float32
    assert tensors["t.0"].numpy().tobytes() == x.tobytes()
    # Copy-on-write: a write stays in this process.
    tensors["t.0"][0] = -1.0
    assert hit["entry_file"].torch_tensors()["t.0"][0].item() == 0.0


@needs_torch
def test_binding_write_maps_the_file_it_wrote_not_its_path(source, tmp_path):
    cache = tmp_path / "cache"
    x = np.arange(1024, dtype=np.float32)
    written = _lookup(source, cache)["miss"].write([("x", x)], {}, commit=False)
    assert written["outcome"] == "pending" and written["entry_file"].path == written["entry"]
    os.replace(_decoy(written["entry"], tmp_path), written["entry"])
    assert written["entry_file"].torch_tensors()["t.0"].numpy().tobytes() == x.tobytes()
    written["pending"].commit()

    # A committed write hands back the file it wrote, which is the entry.
    y = np.arange(8, dtype=np.int64)
    filled = _lookup(source, cache, name="other")["miss"].write([("y", y)], {})
    assert filled["outcome"] == "filled", filled
    os.remove(filled["entry"])
    assert filled["entry_file"].torch_tensors()["t.0"].numpy().tobytes() == y.tobytes()


def test_binding_invalid_max_size_is_said_not_replaced_by_the_default(source, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _lookup(source, cache)["miss"].write([("w", np.ones(2, dtype=np.float32))], {})
    monkeypatch.setenv("WEIGHTMAP_CACHE_MAX_SIZE", "lots")
    # A hit still serves: nothing is written.
    assert _lookup(source, cache)["hit"] is not None
    # A miss is not written, in a directory given and in the user's cache.
    monkeypatch.setenv("WEIGHTMAP_CACHE_DIR", str(cache))
    for found in (_lookup(source, cache, name="other"), _cache_lookup(str(source), "other", 1, "")):
        assert found["hit"] is None
        written = found["miss"].write([("w", np.ones(2, dtype=np.float32))], {})
        assert written["outcome"] == "in_memory" and written["entry"] is None, written
        assert written["reason"] == "invalid_max_size", written
        assert "WEIGHTMAP_CACHE_MAX_SIZE" in written["message"] and "lots" in written["message"]
    assert len(list(cache.glob("*.gguf"))) == 1


def _swap_after(real, swap):
    """``_cache_lookup`` as ``real``, but ``swap(path)`` runs on the entry a
    hit found, or on the file a miss's write wrote, before the caller maps
    it: what a concurrent fill, prune or `cache clear` may do."""

    class Miss:
        def __init__(self, miss):
            self.miss = miss

        def write(self, *args, **kwargs):
            written = self.miss.write(*args, **kwargs)
            if written["entry"] is not None:
                swap(written["entry"])
            return written

    def lookup(*args):
        found = dict(real(*args))
        if found["hit"] is not None:
            swap(found["hit"])
        if found["miss"] is not None:
            found["miss"] = Miss(found["miss"])
        return found

    return lookup


def _file_backed(t):
    """Whether torch tensor ``t``'s memory is a file's mapping (Linux's
    /proc/self/maps), or None where that cannot be told."""
    if not os.path.exists("/proc/self/maps"):
        return None
    p = t.data_ptr()
    for line in open("/proc/self/maps"):
        f = line.split()
        a, b = (int(x, 16) for x in f[0].split("-"))
        if a <= p < b:
            return f[4] != "0"  # the inode
    return False


@needs_torch
@pytest.mark.parametrize("concurrently", ["renamed_over", "removed"])
def test_cached_call_maps_the_entry_checked_or_written_not_its_path(source, tmp_path, monkeypatch, concurrently):
    from weightmap import _transformers_cache as tc

    want = {"model.a_name_longer_than_ggufs_63_bytes.weight" * 2: torch.arange(4096, dtype=torch.float32),
            "b": torch.arange(-8, 8, dtype=torch.int32).reshape(4, 4)}

    def original(gguf_checkpoint_path, return_tensors=False, model_to_load=None, torch_dtype=None):
        return {"config": {"k": 1}, "tensors": {k: v.clone() for k, v in want.items()}}

    def swap(path):
        if concurrently == "renamed_over":
            os.replace(_decoy(path, tmp_path), path)
        else:
            os.remove(path)

    real = tc._cache_lookup
    cache = str(tmp_path / "cache")

    def call(lookup, outcome):
        monkeypatch.setattr(tc, "_cache_lookup", lookup)
        result = tc._cached_call(original, cache, "facts", source, True, None, None)
        tc.wait()
        report = tc.reports()[-1]
        if outcome is not None:
            assert report["outcome"] == outcome, report
        assert report["reason"] != "entry_unreadable", report
        assert result["config"] == {"k": 1} and list(result["tensors"]) == list(want)
        for k, v in want.items():
            assert torch.equal(result["tensors"][k], v), k
            assert _file_backed(result["tensors"][k]) in (True, None), k

    # A miss: the file written is renamed over or removed before the map.
    # (Its commit then puts the decoy in place, or finds nothing to rename.)
    call(_swap_after(real, swap), None)
    # A clean fill, then a hit whose entry is swapped after the checks.
    call(real, "filled")
    call(_swap_after(real, swap), "hit")


@needs_torch
def test_a_commit_that_ends_before_the_call_returns_is_reported_filled(source, tmp_path, monkeypatch):
    from weightmap import _transformers_cache as tc

    def original(gguf_checkpoint_path, return_tensors=False, model_to_load=None, torch_dtype=None):
        return {"config": {}, "tensors": {"w": torch.ones(4)}}

    commit_later = tc._commit_later

    def commit_now(pending, report):  # the commit thread wins the race
        commit_later(pending, report)
        tc.wait()

    monkeypatch.setattr(tc, "_commit_later", commit_now)
    tc._cached_call(original, str(tmp_path / "cache"), "facts", source, True, None, None)
    report = tc.reports()[-1]
    assert report["outcome"] == "filled" and report["commit_seconds"] is not None, report


# --- transformers -----------------------------------------------------------

# One load in a fresh interpreter: argv = mode ("plain" or "cache"), the
# model's directory. Prints a JSON line: every parameter's SHA-256, the
# cache's reports, and (Linux) how many parameters lie in the mapping of
# the tensors' entry.
CHILD = r"""
import hashlib, json, logging, os, sys
import torch
from transformers import AutoModelForCausalLM
import weightmap.gguf as wg
mode, directory = sys.argv[1], sys.argv[2]
if mode == "cache":
    wg.patch(cache=True)
m = AutoModelForCausalLM.from_pretrained(directory, gguf_file="model.gguf")
wg.cache_wait()
params = dict(m.named_parameters())
hashes = {k: hashlib.sha256(v.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
          for k, v in m.state_dict().items()}
reports = wg.cache_reports()
entries = {os.path.realpath(r["entry"]) for r in reports if r["call"] == "tensors" and r["entry"]}
in_entry = None
if entries and os.path.exists("/proc/self/maps"):
    ranges = []
    for line in open("/proc/self/maps"):
        f = line.split(maxsplit=5)
        if len(f) == 6 and os.path.realpath(f[5].strip()) in entries:
            a, b = (int(x, 16) for x in f[0].split("-"))
            ranges.append((a, b))
    in_entry = sum(1 for p in params.values() if any(a <= p.data_ptr() < b for a, b in ranges))
print("RESULT " + json.dumps({"hashes": hashes, "reports": reports, "in_entry": in_entry, "params": len(params)}))
"""


def _child(mode, directory, cache_dir):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore", WEIGHTMAP_CACHE_DIR=str(cache_dir))
    r = subprocess.run([sys.executable, "-c", CHILD, mode, str(directory)], capture_output=True, text=True, env=env)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"the child failed ({r.returncode}):\n{r.stderr[-4000:]}")


def _outcomes(run, call):
    return [r["outcome"] for r in run["reports"] if r["call"] == call]


@needs_transformers
def test_cached_load_is_gguf_pys_bit_for_bit_and_file_backed(tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    model = directory / "model.gguf"
    shutil.copyfile(pathlib.Path(MODELS) / "gemma3" / "model.gguf", model)
    cache = tmp_path / "cache"
    want = _child("plain", directory, cache)["hashes"]  # transformers + gguf-py, no patch
    assert not cache.exists()

    first = _child("cache", directory, cache)
    assert _outcomes(first, "tensors") == ["filled"], first["reports"]
    assert _outcomes(first, "config")[0] == "filled", first["reports"]
    assert first["hashes"] == want
    second = _child("cache", directory, cache)
    assert set(_outcomes(second, "config")) == {"hit"} and _outcomes(second, "tensors") == ["hit"]
    assert second["hashes"] == want
    if sys.platform.startswith("linux"):
        # Every parameter views the entry's mapping, on the first run too.
        assert first["in_entry"] == first["params"] > 0
        assert second["in_entry"] == second["params"]

    # A flipped byte at the start of a tensor of the weights' entry: found
    # by the next load, which converts again and replaces the entry.
    entry = next(r["entry"] for r in second["reports"] if r["call"] == "tensors")
    off = _first_tensor_offset(entry)
    with open(entry, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x40]))
    third = _child("cache", directory, cache)
    tensors = [r for r in third["reports"] if r["call"] == "tensors"]
    assert [r["outcome"] for r in tensors] == ["filled"] and tensors[0]["replaced"], tensors
    assert third["hashes"] == want

    # The source rewritten in place (same inode, a new mtime): its old
    # entries are not found.
    data = model.read_bytes()
    st = model.stat()
    with open(model, "r+b") as f:
        f.write(data)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    fourth = _child("cache", directory, cache)
    assert _outcomes(fourth, "tensors") == ["filled"] and _outcomes(fourth, "config")[0] == "filled"
    assert fourth["hashes"] == want


def _state(directory):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file="model.gguf")
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


@needs_transformers
def test_unwritable_cache_converts_in_memory_and_says_why(tmp_path, monkeypatch, caplog):
    import transformers.modeling_gguf_pytorch_utils as mg

    import weightmap.gguf as wg

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    directory = pathlib.Path(MODELS) / "llama"
    want = _state(directory)
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    original = mg.load_gguf_checkpoint
    caplog.set_level("INFO", logger="weightmap")
    wg.patch(cache=blocker / "cache")
    wg.patch(cache=blocker / "cache")  # twice: still one wrapper over transformers' own
    try:
        assert mg.load_gguf_checkpoint.__wrapped__ is original
        got = _state(directory)
        reports = [r for r in wg.cache_reports() if r["source"] == str(directory / "model.gguf")]
    finally:
        wg.unpatch()
    assert mg.load_gguf_checkpoint is original
    assert wg.cache_reports() == wg.cache_reports() and wg.cache_reports() is not wg.cache_reports()
    calls = [r["call"] for r in reports[-2:]]
    assert calls == ["config", "tensors"], reports
    for r in reports[-2:]:
        assert r["outcome"] == "in_memory" and r["reason"] in ("io", "read_only"), r
        assert str(blocker) in r["message"]
    assert any("not cached" in m and str(blocker) in m for m in caplog.messages)
    assert list(got) == list(want)
    for k in want:
        assert torch.equal(got[k].view(-1).view(torch.uint8), want[k].view(-1).view(torch.uint8)), k


@needs_transformers
def test_results_json_cannot_keep_are_not_cached(tmp_path, monkeypatch):
    from weightmap import _transformers_cache as tc

    assert tc._json_problem({"a": [1, "x", 2.5, None, True, {"b": []}]}, "r") is None
    assert "not a str" in tc._json_problem({1: 2}, "r")
    assert "finite" in tc._json_problem({"a": [float("nan")]}, "r")
    assert "tuple" in tc._json_problem({"a": (1, 2)}, "r")
    assert "numpy" in tc._json_problem({"a": [np.float32(1)]}, "r")

    import transformers.modeling_gguf_pytorch_utils as mg

    import weightmap.gguf as wg

    def fake(gguf_checkpoint_path, return_tensors=False, model_to_load=None, torch_dtype=None):
        return {"config": {"x": (1, 2)}}

    monkeypatch.setattr(mg, "load_gguf_checkpoint", fake)
    wg.patch(cache=tmp_path / "cache")
    try:
        result = mg.load_gguf_checkpoint(str(SOURCE))
    finally:
        wg.unpatch()
    assert mg.load_gguf_checkpoint is fake
    assert result == {"config": {"x": (1, 2)}}
    r = wg.cache_reports()[-1]
    assert r["outcome"] == "in_memory" and r["reason"] == "not_json" and "tuple" in r["message"], r
    assert not any((tmp_path / "cache").glob("*.gguf"))


def _same(a, b):
    """Equal values of the same types, all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b or (a != a and b != b)  # NaN is NaN


@needs_transformers
def test_value_parser_gives_transformers_values_for_every_field():
    import gguf
    import transformers.modeling_gguf_pytorch_utils as mg
    from transformers.integrations.ggml import _gguf_parse_value as original

    import weightmap.gguf as wg
    from weightmap import _transformers_cache as tc

    fast = tc._value_parser(original)
    paths = [pathlib.Path(MODELS) / "llama" / "model.gguf", pathlib.Path(MODELS) / "gemma3" / "model.gguf"]
    paths += sorted((ROOT / "testdata").glob("*.gguf"))
    fields = 0
    for path in paths:
        for reader in (gguf.GGUFReader(path), wg.GGUFReader(path)):
            for key, field in reader.fields.items():
                want = [original(field.parts[i], field.types) for i in field.data]
                got = [fast(field.parts[i], field.types) for i in field.data]
                assert _same(got, want), (path, key)
                fields += 1
    assert fields > 100
    # Types and shapes the files above may not hold.
    cases = [
        (np.array([1], dtype=np.int8), 1),
        (np.array([True]), 7),
        (np.array([True]), [9, 7]),
        (np.array([2.5], dtype=np.float64), [12]),
        (np.array([2**63 - 1], dtype=np.int64), [9, 11]),
        (np.frombuffer("é-ü".encode(), dtype=np.uint8), [9, 8]),
        (np.frombuffer(b"ab", dtype=np.uint8).reshape(1, 2), 13),
        (np.array([5], dtype=np.uint32), [9]),
    ]
    for value, types in cases:
        assert _same(fast(value, types), original(value, types)), (value, types)
    for value, types in [(np.array([1]), [9, 9, 8]), (np.array([1]), [4, 8]),
                         (np.frombuffer(b"\xff", dtype=np.uint8), 8),
                         (np.frombuffer(b"ab", dtype=np.uint8).reshape(1, 2), 8)]:
        with pytest.raises(Exception) as want:
            original(value, types)
        with pytest.raises(type(want.value)):
            fast(value, types)

    wg.patch(cache=True)
    try:
        assert mg._gguf_parse_value.__wrapped__ is original
    finally:
        wg.unpatch()
    assert mg._gguf_parse_value is original
