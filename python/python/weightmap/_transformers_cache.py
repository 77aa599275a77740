"""transformers' converted GGUF checkpoint in weightmap's transform cache:
what ``weightmap.gguf.patch(cache=True)`` installs (python/README.md, "The
cache of transformers' GGUF conversion").

transformers (5.24) reaches a GGUF model's weights, config and tokenizer
through one function, ``transformers.modeling_gguf_pytorch_utils.
load_gguf_checkpoint``, which every caller imports from its module at call
time: ``from_pretrained(gguf_file=)`` calls it once for the config
(``return_tensors=False``) and once for the weights (``return_tensors=True,
model_to_load=model, torch_dtype=dtype``), ``AutoTokenizer`` once more for
the config. Each call walks the whole vocabulary, and the weights call
dequantizes every tensor into new float32 memory.

Each call also walks every GGUF array element by element through
``_gguf_parse_value`` (786k calls for gemma-3's 262k-token vocabulary,
half of a call's time); while installed, that function is replaced by
``_parse_value``, which returns the same values in half the time.

Wrapped, each call's result is an entry of weightmap's cache (a GGUF file):
its tensors (stored as ``t.0``, ``t.1``, ... with their real names in the
entry, since GGUF names stop at 63 bytes) and everything else as one JSON
string. A later call finds the entry, decodes the JSON and maps the tensors
copy-on-write: file-backed pages, shared by every process, that transformers
uses as parameters without a copy. On a miss the original runs, the entry is
written before the call returns (a caller may start training on the tensors
at once), and its tensors are served from the entry too. Either way the
tensors are mapped from the entry's file as the lookup checked it (or the
fill wrote it), held open (``_CacheEntry``), never from its path: another
fill may rename a file over that path, or a prune remove it, in between.
When the cache cannot take the entry, or the result is not something JSON
keeps exactly, the original's result is returned as it is, and the report
says why.
"""

import hashlib
import inspect
import json
import logging
import math
import os
import threading
import time
import warnings
from collections import deque
from typing import Any, Dict, List, Optional

from ._weightmap import __version__ as _weightmap_version
from ._weightmap import _cache_lookup

__all__ = ["TESTED_TRANSFORMERS", "install", "uninstall", "reports", "wait"]

# The transform's name and version in the entries' keys. Bump FORMAT when
# what an entry holds, or how it is read back, changes.
NAME = "transformers.load_gguf_checkpoint"
FORMAT = 1

# transformers versions whose load_gguf_checkpoint was read and tested with
# this wrapper (CI installs 5.24.0). Another version with the same
# signature is cached too, with a warning; one whose signature differs is
# not wrapped.
TESTED_TRANSFORMERS = ("5.24.0",)
_SIGNATURE = ["gguf_checkpoint_path", "return_tensors", "model_to_load", "torch_dtype"]

# The entry's key holding the result but its tensors, as JSON.
_RESULT_KEY = "transformers.result"

logger = logging.getLogger("weightmap")

# (module, original, wrapper, original value parser) while installed.
_installed: Optional[tuple] = None
# The last reports, oldest first.
_reports: "deque[Dict[str, Any]]" = deque(maxlen=32)


# The threads committing entries, oldest first.
_commits: "deque[threading.Thread]" = deque()


def reports() -> List[Dict[str, Any]]:
    """Copies of the last reports (at most 32), oldest first."""
    return [dict(r) for r in _reports]


def install(cache_dir: Optional[str]) -> bool:
    """Wrap transformers' ``load_gguf_checkpoint`` with the cache in
    ``cache_dir`` (``None``: the user's). Wrapping again replaces the
    wrapper. Returns whether it is wrapped: not when the function's
    signature is not the one this wrapper knows (with a warning)."""
    global _installed
    import transformers
    import transformers.modeling_gguf_pytorch_utils as mg

    uninstall()
    original = mg.load_gguf_checkpoint
    params = list(inspect.signature(original).parameters)
    if params != _SIGNATURE:
        warnings.warn(
            f"weightmap.gguf.patch(cache=...): transformers {transformers.__version__}'s "
            f"load_gguf_checkpoint takes {params}, not {_SIGNATURE}: not cached "
            f"(tested: transformers {', '.join(TESTED_TRANSFORMERS)})",
            RuntimeWarning,
            stacklevel=4,
        )
        return False
    if transformers.__version__ not in TESTED_TRANSFORMERS:
        warnings.warn(
            f"weightmap.gguf.patch(cache=...) was tested with transformers "
            f"{', '.join(TESTED_TRANSFORMERS)}, not {transformers.__version__}",
            RuntimeWarning,
            stacklevel=4,
        )
    facts = _versions()

    def load_gguf_checkpoint(gguf_checkpoint_path, return_tensors=False, model_to_load=None, torch_dtype=None):
        return _cached_call(original, cache_dir, facts, gguf_checkpoint_path, return_tensors, model_to_load, torch_dtype)

    load_gguf_checkpoint.__doc__ = original.__doc__
    load_gguf_checkpoint.__wrapped__ = original  # type: ignore[attr-defined]
    parse = mg._gguf_parse_value
    mg.load_gguf_checkpoint = load_gguf_checkpoint
    mg._gguf_parse_value = _value_parser(parse)
    _installed = (mg, original, load_gguf_checkpoint, parse)
    return True


def uninstall() -> None:
    """Put transformers' own ``load_gguf_checkpoint`` back."""
    global _installed
    if _installed is None:
        return
    module, original, _wrapper, parse = _installed
    module.load_gguf_checkpoint = original
    module._gguf_parse_value = parse
    _installed = None


# GGUF's value types whose elements transformers' parser takes as int, as
# float, and as a UTF-8 string (gguf-py's GGUFValueType).
_INT_TYPES = frozenset((0, 1, 2, 3, 4, 5, 10, 11))
_FLOAT_TYPES = frozenset((6, 12))
_STRING = 8
_ARRAY = 9


def _value_parser(parse):
    """transformers' ``_gguf_parse_value(value, types)`` (``parse``), the
    same value for every input, faster for the common ones: an element of
    an array (``types`` ``[9, t]``) or a scalar of type t that is an int, a
    float, or a string (a 1-D uint8 array, which ``parse`` turns into a list
    of numpy scalars, an ``array("B")`` and bytes to decode). Anything else
    goes to ``parse``."""
    import numpy as np

    ndarray, uint8 = np.ndarray, np.dtype(np.uint8)

    def _parse_value(value, data_type):
        t = data_type
        if type(t) is list:
            if len(t) == 2 and t[0] == _ARRAY:
                t = t[1]
            elif len(t) == 1:
                t = t[0]
            else:
                return parse(value, data_type)
        if t == _STRING:
            if type(value) is ndarray and value.dtype == uint8 and value.ndim == 1:
                return value.tobytes().decode()
        elif t in _INT_TYPES:
            return int(value[0])
        elif t in _FLOAT_TYPES:
            return float(value[0])
        return parse(value, data_type)

    _parse_value.__wrapped__ = parse  # type: ignore[attr-defined]
    return _parse_value


def _versions() -> str:
    """The versions of what makes the result: part of every key."""
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import transformers

    try:
        gguf_version = version("gguf")
    except PackageNotFoundError:
        gguf_version = "none"
    return (
        f"transformers={transformers.__version__};gguf={gguf_version};torch={torch.__version__};"
        f"weightmap={_weightmap_version}"
    )


def _machine(facts: str, return_tensors: bool, model_to_load: Any, torch_dtype: Any) -> str:
    """The key's facts for one call: the versions, the arguments, and for
    the weights call the model's class and state-dict names (which decide
    the GGUF-to-transformers name map)."""
    parts = [facts, f"return_tensors={bool(return_tensors)}", f"torch_dtype={torch_dtype}"]
    if model_to_load is not None:
        cls = type(model_to_load)
        model_type = getattr(getattr(model_to_load, "config", None), "model_type", None)
        keys = "\n".join(model_to_load.state_dict().keys())
        parts.append(f"model={cls.__module__}.{cls.__qualname__};model_type={model_type}")
        parts.append("state_dict_keys=" + hashlib.sha256(keys.encode()).hexdigest())
    return ";".join(parts)


def _cached_call(original, cache_dir, facts, path, return_tensors, model_to_load, torch_dtype):
    started = time.perf_counter()
    report: Dict[str, Any] = {
        "call": "tensors" if return_tensors else "config",
        "source": os.fspath(path),
        "outcome": "in_memory",
        "reason": None,
        "message": None,
        "entry": None,
        "replaced": None,
        "seconds": 0.0,
        "convert_seconds": None,
        "write_seconds": None,
        "commit_seconds": None,
    }

    def run_original():
        t = time.perf_counter()
        result = original(path, return_tensors=return_tensors, model_to_load=model_to_load, torch_dtype=torch_dtype)
        report["convert_seconds"] = time.perf_counter() - t
        return result

    def done(result, **fields):
        report.update(fields)
        report["seconds"] = time.perf_counter() - started
        _reports.append(report)
        logger.info("%s", _describe(report))
        return result

    try:
        machine = _machine(facts, return_tensors, model_to_load, torch_dtype)
        found = _cache_lookup(os.fspath(path), NAME, FORMAT, machine, cache_dir)
    except Exception as e:  # weightmap cannot read the source: transformers says why
        return done(run_original(), reason="lookup_failed", message=f"{type(e).__name__}: {e}")
    report["replaced"] = found["replaced"]

    if found["hit"] is not None:
        entry = os.fspath(found["hit"])
        try:
            result = _from_entry(found["entry_file"], found["names"], found["metadata"], return_tensors)
        except Exception as e:  # the map failed (address space, a torch without a dtype)
            return done(run_original(), reason="entry_unreadable", message=f"{type(e).__name__}: {e}")
        return done(result, outcome="hit", entry=entry)

    result = run_original()
    rest = {k: v for k, v in result.items() if not (return_tensors and k == "tensors")}
    problem = _json_problem(rest, "result")
    if problem is not None:
        return done(result, reason="not_json", message=problem)
    arrays: list = []
    if return_tensors:
        arrays, problem = _arrays(result.get("tensors", {}))
        if problem is not None:
            return done(result, reason="unsupported_tensor", message=problem)
    text = json.dumps(rest, allow_nan=False, separators=(",", ":"))
    t = time.perf_counter()
    try:
        # The tensors' bytes are copied into the entry's file before this
        # returns (so a caller that starts training on them changes nothing
        # of the entry); only the wait for the disk and the rename into
        # place may come later, on a thread of their own.
        written = found["miss"].write(arrays, {_RESULT_KEY: text}, commit=not return_tensors)
    except Exception as e:  # a tensor the binding refuses, or the fill failed
        return done(result, reason="write_failed", message=f"{type(e).__name__}: {e}")
    report["write_seconds"] = time.perf_counter() - t
    if written["outcome"] not in ("filled", "pending"):
        return done(result, reason=written["reason"], message=written["message"])
    entry = os.fspath(written["entry"])
    if return_tensors:
        # The entry's tensors in place of the original's: the parameters are
        # then file-backed from the first run on.
        try:
            names = list(result["tensors"])
            converted = result["tensors"]
            result["tensors"] = _entry_tensors(written["entry_file"], names)
        except Exception as e:  # the map failed: keep the original's
            return done(result, reason="entry_unreadable", message=f"{type(e).__name__}: {e}")
        # Emptied, not only dropped: something of transformers' may still
        # hold the dict.
        converted.clear()
        del arrays, converted
        _give_back_freed_memory()
    if written["outcome"] == "pending":
        # Reported before the commit starts: a commit that ends first would
        # otherwise have its outcome overwritten by "filling".
        done(None, outcome="filling", entry=entry)
        _commit_later(written["pending"], report)
        return result
    return done(result, outcome="filled", entry=entry)


def _give_back_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's
    ``malloc_trim(0)``) once a miss's converted tensors are freed: glibc
    keeps freed chunks below its mmap threshold (most of a model's
    tensors) as the process's anonymous memory until then. Nothing where
    the C library has no ``malloc_trim``."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc; Windows
        return
    trim(0)


def _commit_later(pending, report: Dict[str, Any]) -> None:
    """Commit ``pending`` (fsync, then rename into place) on a thread of its
    own, and update ``report`` when it is done. Not a daemon: the
    interpreter waits for it before it exits, so the entry is in place for
    the next process. A process killed first leaves a temporary file that no
    lookup reads and the cache's prune removes."""

    def run():
        t = time.perf_counter()
        try:
            committed = pending.commit()
        except Exception as e:  # pragma: no cover - commit reports, it does not raise
            committed = {"outcome": "in_memory", "entry": None, "reason": "io", "message": str(e)}
        report["commit_seconds"] = time.perf_counter() - t
        report["outcome"] = committed["outcome"]
        report["entry"] = committed["entry"] and os.fspath(committed["entry"])
        report["reason"] = committed["reason"]
        report["message"] = committed["message"]
        logger.info("%s", _describe(report))

    thread = threading.Thread(target=run, name="weightmap-cache-commit", daemon=False)
    _commits.append(thread)
    thread.start()


def wait() -> None:
    """Wait until every entry this process wrote is committed (in place
    for the next lookup), and its report final."""
    while _commits:
        _commits.popleft().join()


def _from_entry(entry_file: Any, names: List[str], metadata: Dict[str, str], return_tensors: bool) -> Dict[str, Any]:
    """The call's result from its entry: the JSON decoded (new objects on
    every call), and the tensors mapped copy-on-write under their names."""
    result = json.loads(metadata[_RESULT_KEY])
    if return_tensors:
        result["tensors"] = _entry_tensors(entry_file, names)
    return result


def _entry_tensors(entry_file: Any, names: List[str]) -> Dict[str, Any]:
    """The entry's tensors under their names, mapped copy-on-write from
    ``entry_file`` (a ``_CacheEntry``: the file the lookup checked, or the
    fill wrote, held open), never from the entry's path, which may name
    another file, or none, by now."""
    mapped = entry_file.torch_tensors()
    if len(mapped) != len(names):
        raise ValueError(f"{entry_file.path}: {len(mapped)} tensors for {len(names)} names")
    return {name: mapped[f"t.{i}"] for i, name in enumerate(names)}


_PLAIN = frozenset({str, int, bool, type(None)})
_NUMBERS = frozenset({int, float, bool})


def _json_problem(value: Any, where: str) -> Optional[str]:
    """Where ``value`` holds something a JSON round trip would not give
    back as it is (only dicts with str keys, lists, str, int, finite float,
    bool and None survive), or ``None``."""
    t = type(value)
    if t in _PLAIN:
        return None
    if t is float:
        return None if math.isfinite(value) else f"{where}: {value!r} is not a finite float"
    if t is dict:
        for k, v in value.items():
            if type(k) is not str:
                return f"{where}: key {k!r} is a {type(k).__name__}, not a str"
            if type(v) not in _PLAIN:
                p = _json_problem(v, f"{where}[{k!r}]")
                if p is not None:
                    return p
        return None
    if t is list:
        # A vocabulary's lists hold 10^5 to 10^6 elements: take their types
        # in one pass at C speed, and walk them one by one only when they
        # hold something else.
        types = set(map(type, value))
        if types <= _PLAIN:
            return None
        if types <= _NUMBERS and all(map(math.isfinite, value)):
            return None
        for i, v in enumerate(value):
            tv = type(v)
            if tv in _PLAIN or (tv is float and math.isfinite(v)):
                continue
            p = _json_problem(v, f"{where}[{i}]")
            if p is not None:
                return p
        return None
    return f"{where}: a {t.__module__}.{t.__qualname__} does not survive JSON"


def _arrays(tensors: Dict[str, Any]):
    """The tensors as ``(name, array[, type name])`` for the entry, or why
    they cannot be stored as they are."""
    import torch

    supported = {torch.float32, torch.float16, torch.bfloat16, torch.float64,
                 torch.int8, torch.int16, torch.int32, torch.int64}
    out = []
    storages = set()
    for name, t in tensors.items():
        if type(name) is not str or not isinstance(t, torch.Tensor):
            return None, f"tensors[{name!r}]: not a str name and a torch.Tensor"
        if t.device.type != "cpu" or t.layout != torch.strided or t.dtype not in supported or not 1 <= t.dim() <= 4:
            return None, (f"tensors[{name!r}]: {t.dtype} {t.layout} on {t.device}, {t.dim()} dimensions: "
                          "an entry holds CPU tensors of 1 to 4 dimensions, float32/16, bfloat16, "
                          "float64 or int8 to int64")
        if t.numel():
            # Tensors sharing memory would come back apart.
            storage = t.untyped_storage().data_ptr()
            if storage in storages:
                return None, f"tensors[{name!r}] shares its memory with another tensor"
            storages.add(storage)
        t = t.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        if t.dtype == torch.bfloat16:
            out.append((name, t.view(torch.int16).numpy(), "BF16"))
        else:
            out.append((name, t.numpy()))
    return out, None


def _describe(r: Dict[str, Any]) -> str:
    head = f"load_gguf_checkpoint({r['source']!r}, {r['call']}): "
    if r["outcome"] == "hit":
        s = f"cached: mapped {r['entry']}"
    elif r["outcome"] == "filled":
        s = f"cached: converted into {r['entry']}"
    elif r["outcome"] == "filling":
        s = f"cached: converted into {r['entry']}, committing on a thread"
    else:
        s = f"not cached ({r['reason']}: {r['message']}): converted in memory"
    if r["replaced"]:
        s += f"; the entry that was there was replaced: {r['replaced']}"
    return f"{head}{s} ({r['seconds']:.3f} s)"
