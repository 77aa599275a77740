"""gguf-py's reader and dequantizer, from weightmap.

- ``GGUFReader(path)`` answers as gguf-py 0.19's ``gguf.GGUFReader``:
  ``fields`` (``ReaderField``: ``offset``, ``name``, ``parts``, ``data``,
  ``types``, ``contents()``), ``tensors`` (``ReaderTensor``: ``name``,
  ``tensor_type``, ``shape``, ``n_elements``, ``n_bytes``, ``data_offset``,
  ``data``, ``field``), ``get_field``, ``get_tensor``, ``alignment``,
  ``data_offset``, ``byte_order``, ``endianess``, ``data`` (the file as a
  read-only ``numpy.memmap``). Where each key/value and tensor is comes from
  weightmap's validated header, read once in Rust; each field's parts are
  built the first time the field is asked for, so a 262,144-token
  vocabulary costs nothing until it is read. Parts and tensor data are
  zero-copy views of the mapped file, with gguf-py's dtypes and shapes
  (plain ``numpy.ndarray`` views of ``data``, where gguf-py's are
  ``numpy.memmap`` slices).
- ``dequantize(data, qtype)`` answers as ``gguf.quants.dequantize`` does,
  with weightmap's kernels (bit for bit ggml's) for the quantized types.
- ``patch()`` puts both in gguf-py's place (``gguf.GGUFReader``,
  ``gguf.gguf_reader.GGUFReader``, ``gguf.dequantize``,
  ``gguf.quants.dequantize``) for code that imports gguf itself
  (transformers' ``from_pretrained(gguf_file=...)``, gguf-py's scripts);
  ``unpatch()`` puts gguf-py's back.

This module needs the ``gguf`` package (gguf-py) for the types it answers
with (``GGUFValueType``, ``GGMLQuantizationType``, ``ReaderField``,
``ReaderTensor``). Only little-endian files (all weightmap reads) are
supported. Repeated keys raise gguf-py's ``KeyError("Duplicate KEY already
in list at offset N")``, a file key named as one of gguf-py's three header
fields (``GGUF.version``, ``GGUF.tensor_count``, ``GGUF.kv_count``) too;
where a file has both, the repeat is named even when the other comes first
(gguf-py names the first). The file must not be modified or truncated while the reader or
an array from it lives.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

import gguf as _gguf
from gguf.constants import GGMLQuantizationType, GGUFEndian, GGUFValueType
from gguf.gguf_reader import ReaderField, ReaderTensor
from gguf.quants import quant_shape_from_byte_shape, quant_shape_to_byte_shape

from ._weightmap import _dequantize, _GgufLayout

__all__ = [
    "GGUFReader",
    "ReaderField",
    "ReaderTensor",
    "cache_reports",
    "cache_wait",
    "dequantize",
    "patch",
    "unpatch",
]

# gguf-py's numpy type for each scalar value type (GGUFReader.gguf_scalar_to_np).
_SCALAR_NP = {
    GGUFValueType.UINT8: np.uint8,
    GGUFValueType.INT8: np.int8,
    GGUFValueType.UINT16: np.uint16,
    GGUFValueType.INT16: np.int16,
    GGUFValueType.UINT32: np.uint32,
    GGUFValueType.INT32: np.int32,
    GGUFValueType.FLOAT32: np.float32,
    GGUFValueType.UINT64: np.uint64,
    GGUFValueType.INT64: np.int64,
    GGUFValueType.FLOAT64: np.float64,
    GGUFValueType.BOOL: np.bool_,
}

# The tensor types gguf-py's reader gives as elements (the rest as bytes).
_ELEMENT_NP = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class _LazyFields(Mapping):
    """``GGUFReader.fields``: key -> ``ReaderField`` in file order, each
    built the first time it is read."""

    def __init__(self, views: "_Views", specs: Dict[str, Any]):
        self._views = views
        self._specs = specs  # key -> what _Views.field needs
        self._built: Dict[str, ReaderField] = {}

    def __getitem__(self, key: str) -> ReaderField:
        f = self._built.get(key)
        if f is None:
            spec = self._specs[key]  # KeyError for an absent key, as a dict
            f = self._views.field(key, spec)
            self._built[key] = f
        return f

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, key: object) -> bool:
        return key in self._specs

    def __repr__(self) -> str:
        return f"<weightmap.gguf fields: {len(self)} keys, {len(self._built)} built>"


class _Views:
    """Typed views of a GGUF file's bytes, and the fields built from them:
    what a ``GGUFReader`` and its lazy ``fields`` share. The fields hold
    this rather than the reader, so that a reader and its fields are no
    reference cycle: they are freed with their last reference, not at the
    next full garbage collection, and a vocabulary's fields are 10^5 numpy
    views (hundreds of MiB of the process's memory for two readers of
    gemma-3's 262k tokens)."""

    def __init__(self, buf: np.ndarray, layout: Any, byte_order: str):
        self._buf = buf
        self._layout = layout
        self._byte_order = byte_order

    def get(self, offset: int, dtype: Any, count: int = 1) -> np.ndarray:
        """``count`` items of ``dtype`` at ``offset``: a view of the file."""
        count = int(count)
        itemsize = np.dtype(dtype).itemsize
        arr = self._buf[offset : offset + itemsize * count].view(dtype=dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self._byte_order))

    def field(self, key: str, spec: Tuple) -> ReaderField:
        """The field ``key``, from what the reader noted of it."""
        if spec[0] == "header":
            _, offset, dtype = spec
            return ReaderField(offset, key, [self.get(offset, dtype)], [0], [
                GGUFValueType.UINT32 if dtype is np.uint32 else GGUFValueType.UINT64
            ])
        _, offset, vtype, vstart, vend, elem, count = spec
        klen = self.get(offset, np.uint64)
        kdata = self.get(offset + 8, np.uint8, klen[0])
        raw_type = self.get(offset + 8 + int(klen[0]), np.uint32)
        parts: List[np.ndarray] = [klen, kdata, raw_type]
        gtype = GGUFValueType(vtype)
        types = [gtype]
        if gtype == GGUFValueType.STRING:
            parts += [self.get(vstart - 8, np.uint64), self.get(vstart, np.uint8, vend - vstart)]
            return ReaderField(offset, key, parts, [4], types)
        if gtype != GGUFValueType.ARRAY:
            parts.append(self.get(vstart, _SCALAR_NP[gtype]))
            return ReaderField(offset, key, parts, [3], types)
        etype = GGUFValueType(elem)
        parts += [self.get(vstart - 12, np.uint32), self.get(vstart - 8, np.uint64)]
        if count:
            types.append(etype)
        first = len(parts)
        if etype == GGUFValueType.STRING:
            offs = self._layout.string_offsets(key)
            buf = self._buf
            u64 = np.dtype(np.uint64)
            lens = [buf[o : o + 8].view(u64) for o in offs.tolist()]
            starts = (offs + 8).tolist()
            ends = (offs + 8 + np.array([n[0] for n in lens], dtype=np.uint64)).tolist() if count else []
            for n, a, b in zip(lens, starts, ends):
                parts.append(n)
                parts.append(buf[a:b])
            idxs = list(range(first + 1, first + 2 * count, 2))
        else:
            items = self.get(vstart, _SCALAR_NP[etype], count)
            # One 1-element view per element, as gguf-py gives them.
            parts += list(items.reshape(count, 1))
            idxs = list(range(first, first + count))
        return ReaderField(offset, key, parts, idxs, types)


class GGUFReader:
    """gguf-py 0.19's ``GGUFReader``, from weightmap's validated header: see
    the module's docstring. ``mode`` is numpy.memmap's, as for gguf-py
    (``"r"``, the default: read-only views)."""

    byte_order = "I"
    alignment: int = 32
    data_offset: int
    gguf_scalar_to_np = _SCALAR_NP

    def __init__(self, path: Union[os.PathLike, str], mode: str = "r"):
        layout = _GgufLayout(path)
        self.data = np.memmap(path, mode=mode)
        # Parts and tensors are plain ndarray views of the memmap: slicing
        # the np.memmap subclass costs ten times as much (__array_finalize__).
        self._buf = self.data.view(np.ndarray)
        self._views = _Views(self._buf, layout, self.byte_order)
        self.endianess = GGUFEndian.LITTLE
        data = self.data
        specs: Dict[str, Any] = {}
        # gguf-py's first three fields: the version and the two counts.
        specs["GGUF.version"] = ("header", 4, np.uint32)
        specs["GGUF.tensor_count"] = ("header", 8, np.uint64)
        specs["GGUF.kv_count"] = ("header", 16, np.uint64)
        for key, offset, vtype, vstart, vend, elem, count in layout.kvs():
            # A key equal to one before it: gguf-py 0.19's `_push_field`
            # raises this. weightmap's header refuses repeated keys in the
            # file (_GgufLayout raises the same KeyError); a file key can
            # still meet one of the three above.
            if key in specs:
                raise KeyError(f"Duplicate {key} already in list at offset {offset}")
            specs[key] = ("kv", offset, vtype, vstart, vend, elem, count)
        self.fields = _LazyFields(self._views, specs)
        align = specs.get("general.alignment")
        if align is not None:
            f = self.fields["general.alignment"]
            if f.types != [GGUFValueType.UINT32]:
                raise ValueError("Bad type for general.alignment field")
            self.alignment = f.parts[-1][0]
        self.data_offset = int(layout.data_offset)
        self.tensors: List[ReaderTensor] = [
            self._tensor(self._tensor_field(name, at, n_dims), ggml_id, offset, nbytes)
            for name, ggml_id, offset, nbytes, at, n_dims in layout.tensors()
        ]

    # Fetch a key/value metadata field by key.
    def get_field(self, key: str) -> Optional[ReaderField]:
        """The field ``key``, or ``None``."""
        return self.fields.get(key, None)

    # Fetch a tensor from the list by index.
    def get_tensor(self, idx: int) -> ReaderTensor:
        """The tensor at index ``idx`` (file order)."""
        return self.tensors[idx]

    def _get(self, offset: int, dtype: Any, count: int = 1) -> np.ndarray:
        """``count`` items of ``dtype`` at ``offset``: a view of the file."""
        return self._views.get(offset, dtype, count)

    def _tensor_field(self, name: str, at: int, n_dims: int) -> ReaderField:
        """The descriptor of tensor ``name`` at ``at`` with ``n_dims``
        dimensions, as weightmap's header placed it: its parts as views of
        the file, as gguf-py gives them."""
        name_end = at + 8 + len(name.encode("utf-8"))
        dims_end = name_end + 4 + 8 * n_dims
        return ReaderField(
            at,
            name,
            [
                self._get(at, np.uint64),
                self._get(at + 8, np.uint8, name_end - at - 8),
                self._get(name_end, np.uint32),
                self._get(name_end + 4, np.uint64, n_dims),
                self._get(dims_end, np.uint32),
                self._get(dims_end + 4, np.uint64),
            ],
            [1, 3, 4, 5],
        )

    def _tensor(self, field: ReaderField, ggml_id: int, offset: int, nbytes: int) -> ReaderTensor:
        """The tensor whose descriptor is ``field``, with the type, offset
        (from the data section's start) and byte count weightmap's header
        validated: nothing is computed again here."""
        dims = field.parts[3]
        ggml_type = GGMLQuantizationType(ggml_id)
        n_elems = int(np.prod(dims))
        np_dims = tuple(reversed(dims.tolist()))
        n_bytes = int(nbytes)
        data_offs = self.data_offset + int(offset)
        item_type = _ELEMENT_NP.get(ggml_type)
        if item_type is not None:
            item_count = n_elems
        else:
            item_count = n_bytes
            item_type = np.uint8
            np_dims = quant_shape_to_byte_shape(np_dims, ggml_type)
        return ReaderTensor(
            name=field.name,
            tensor_type=ggml_type,
            shape=dims,
            n_elements=n_elems,
            n_bytes=n_bytes,
            data_offset=data_offs,
            data=self._get(data_offs, item_type, item_count).reshape(np_dims),
            field=field,
        )


# The quantized types gguf-py 0.19's dequantize handles (besides F32, F16).
_GGUF_PY_DEQUANT = frozenset(
    GGMLQuantizationType[n]
    for n in (
        "BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K TQ1_0 TQ2_0 MXFP4 NVFP4 "
        "IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ1_S IQ1_M IQ4_NL IQ4_XS"
    ).split()
    if n in GGMLQuantizationType.__members__
)


def dequantize(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """As ``gguf.quants.dequantize``: F32 as a float32 view, F16 converted,
    the quantized types gguf-py handles (rows of bytes, ``[..., bytes per
    row]``) dequantized by weightmap's kernels into float32 of shape
    ``[..., elements per row]``; any other type is ``NotImplementedError``."""
    if qtype == GGMLQuantizationType.F32:
        return data.view(np.float32)
    if qtype == GGMLQuantizationType.F16:
        return data.view(np.float16).astype(np.float32)
    qtype = GGMLQuantizationType(qtype)
    if qtype not in _GGUF_PY_DEQUANT:
        raise NotImplementedError(f"Dequantization for {qtype.name} is not yet implemented")
    shape = quant_shape_from_byte_shape(data.shape, qtype)
    # Read in place; a strided array is made contiguous first (a copy).
    raw = np.ascontiguousarray(data)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    return _dequantize(raw, int(qtype)).reshape(shape)


_saved: Optional[Dict[str, Any]] = None


def patch(cache: Union[bool, str, "os.PathLike[str]"] = False) -> None:
    """Put ``GGUFReader`` and ``dequantize`` in gguf-py's place:
    ``gguf.GGUFReader``, ``gguf.gguf_reader.GGUFReader``,
    ``gguf.dequantize`` and ``gguf.quants.dequantize``. Code that looks them
    up after this (``from gguf import GGUFReader`` at call time, as
    transformers does) gets weightmap's. Calling it twice is harmless.

    ``gguf.get_tensor_name_map`` is also made to build its map once per
    architecture and block count: transformers asks for it once per
    parameter it loads (313 times for gemma-3-270m), and gguf-py builds a
    new ``TensorNameMap`` each time, which is about a quarter of a patched
    ``from_pretrained``. Each call still returns a ``TensorNameMap`` of its
    own, its ``mapping`` a copy of the one built: a caller that changes it
    changes nobody else's.

    ``cache=True`` (or a directory) also caches transformers' converted
    checkpoint (``load_gguf_checkpoint``: config, tokenizer and tensors) in
    weightmap's transform cache, ``cache=True`` in the user's cache
    directory (``$WEIGHTMAP_CACHE_DIR``, ``$XDG_CACHE_HOME/weightmap``,
    ``~/.cache/weightmap``); ``cache_reports()`` says what each call did.
    Each ``patch()`` sets the cache as it asks: ``patch()`` alone leaves
    transformers' loader uncached."""
    global _saved

    _set_cache(cache)

    import gguf.gguf_reader
    import gguf.quants
    import gguf.tensor_mapping

    if _saved is not None:
        return
    _saved = {
        "GGUFReader": _gguf.GGUFReader,
        "gguf_reader.GGUFReader": gguf.gguf_reader.GGUFReader,
        "dequantize": _gguf.dequantize,
        "quants.dequantize": gguf.quants.dequantize,
        "get_tensor_name_map": _gguf.get_tensor_name_map,
        "tensor_mapping.get_tensor_name_map": gguf.tensor_mapping.get_tensor_name_map,
    }
    _gguf.GGUFReader = GGUFReader
    gguf.gguf_reader.GGUFReader = GGUFReader
    _gguf.dequantize = dequantize
    gguf.quants.dequantize = dequantize
    name_map = _tensor_name_maps_built_once(_saved["get_tensor_name_map"])
    _gguf.get_tensor_name_map = name_map
    gguf.tensor_mapping.get_tensor_name_map = name_map


def _tensor_name_maps_built_once(build: Any) -> Any:
    """``build`` (gguf-py's ``get_tensor_name_map``) run once per
    architecture and block count; each call gets a new object whose dict
    attributes (``mapping``: name -> (tensor, name), immutable values) are
    copies of the first build's, which no caller ever sees."""
    import functools

    built: Dict[Tuple[Any, int], Any] = {}

    @functools.wraps(build)
    def get_tensor_name_map(arch: Any, n_blocks: int) -> Any:
        first = built.get((arch, n_blocks))
        if first is None:
            first = built[(arch, n_blocks)] = build(arch, n_blocks)
        fresh = object.__new__(type(first))
        fresh.__dict__.update({k: dict(v) if isinstance(v, dict) else v for k, v in vars(first).items()})
        return fresh

    return get_tensor_name_map


def unpatch() -> None:
    """Undo ``patch()``: gguf-py's own reader and dequantizer again, and
    transformers' own ``load_gguf_checkpoint``."""
    global _saved
    import gguf.gguf_reader
    import gguf.quants

    _set_cache(False)

    if _saved is None:
        return
    _gguf.GGUFReader = _saved["GGUFReader"]
    gguf.gguf_reader.GGUFReader = _saved["gguf_reader.GGUFReader"]
    _gguf.dequantize = _saved["dequantize"]
    gguf.quants.dequantize = _saved["quants.dequantize"]
    _gguf.get_tensor_name_map = _saved["get_tensor_name_map"]
    gguf.tensor_mapping.get_tensor_name_map = _saved["tensor_mapping.get_tensor_name_map"]
    _saved = None


def _set_cache(cache: Union[bool, str, "os.PathLike[str]"]) -> None:
    """Wrap transformers' ``load_gguf_checkpoint`` with the cache ``cache``
    asks for (True: the user's directory; a path: that one), or unwrap it."""
    from . import _transformers_cache

    if cache is False or cache is None:
        _transformers_cache.uninstall()
    else:
        _transformers_cache.install(None if cache is True else os.fspath(cache))


def cache_reports() -> List[Dict[str, Any]]:
    """What the cache did on the last calls of transformers'
    ``load_gguf_checkpoint`` (at most 32, oldest first), under
    ``patch(cache=...)``: dicts of ``call`` ("config" or "tensors"),
    ``source``, ``outcome`` ("hit", "filled", "filling" or "in_memory"),
    ``reason`` and ``message`` (why in memory), ``entry`` (the entry's
    path), ``replaced`` (why an entry that was there was not used),
    ``seconds`` (the whole call), ``convert_seconds`` (transformers' own
    conversion, on a miss), ``write_seconds`` (the copy into the entry's
    file) and ``commit_seconds`` (the wait for the disk and the rename).
    "filling" is a tensors call whose entry's bytes were written before it
    returned, and whose commit runs on a thread of its own (the process
    waits for it before it exits; ``cache_wait()`` waits now): its report
    becomes "filled" (or "in_memory", saying why) when that is done. Each
    is also logged on the "weightmap" logger at INFO."""
    from ._transformers_cache import reports

    return reports()


def cache_wait() -> None:
    """Wait until every cache entry this process wrote under
    ``patch(cache=...)`` is committed, so that another process finds it."""
    from ._transformers_cache import wait

    wait()
