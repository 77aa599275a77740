"""Type stubs of weightmap._weightmap, the extension module the weightmap
package re-exports."""

import os
from types import TracebackType
from typing import Any, Dict, Iterator, List, Literal, Optional, Sequence, Tuple, Type, Union

import numpy as np

__version__: str

class Error(ValueError):
    """An error from weightmap (invalid file, unsupported operation, refused copy)."""

    kind: str
    """Its category: "invalid_file", "unsupported", "out_of_memory", ..."""
    name: str
    """The error's stable name, e.g. "truncated"."""

MetadataValue = Union[str, bytes, int, float, bool, List["MetadataValue"]]

class Weights:
    """A loaded model, made by `open`. Arrays from it outlive it."""

    @property
    def closed(self) -> bool: ...
    @property
    def path(self) -> str: ...
    @property
    def mode(self) -> Literal["mmap", "stream"]: ...
    @property
    def format(self) -> Literal["gguf", "safetensors"]: ...
    def keys(self) -> List[str]:
        """Tensor names in file order."""
    def __len__(self) -> int: ...
    def __contains__(self, name: str) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def __getitem__(self, name: str) -> np.ndarray: ...
    def get_tensor(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only, zero-copy array (KeyError if absent)."""
    def get_f32(self, name: str) -> np.ndarray:
        """A new float32 array of the tensor's element shape, dequantized."""
    def metadata(self) -> Dict[str, MetadataValue]:
        """GGUF key/values, or the safetensors __metadata__ map."""
    def info(self, name: str) -> Dict[str, Any]:
        """name, type, ggml_type, shape (numpy order), ne (ggml order), nbytes,
        offset, file_offset, block_size, type_size."""
    def report(self) -> Dict[str, Any]:
        """format, mode_requested, mode_used, fallback, fallback_detail,
        tensors_count, tensors_mapped, tensors_copied, bytes_mapped,
        bytes_copied, file_len, shards, budget_bytes, budget_source,
        budget_limit, budget_usage, budget_reclaimable, budget_own_cached
        (a cgroup's figure: its limit, usage, inactive file pages and the
        model's own cached bytes; None for other figures),
        reread_small_folios ("off", "on", or "refused: <why>"), residency
        ("fits: ...", "stream experts: ..." or "stream all: ...": what stays
        resident when the weights exceed the memory budget)."""
    def huge_pages(self) -> Dict[str, Optional[int]]:
        """Bytes of the tensors in huge pages, measured now: mapped_bytes,
        mapped_resident, mapped_huge, mapped_huge_capacity, mapped_small,
        owned_bytes, owned_huge (None where this platform cannot tell), and
        reread_bytes (what the prefetch re-read)."""
    def prefetch(
        self,
        needs: Sequence[Union[str, int, Tuple[Union[str, int], Sequence[int]]]],
        likely: bool = False,
    ) -> None:
        """Announce what the runtime reads next: each need a tensor (name or
        index), or a (tensor, experts) pair whose experts' slices are read.
        Their reads are queued; returns without waiting for them. KeyError (name),
        IndexError (index) or weightmap.Error (expert) for a need that is
        not there, and then nothing is read. With likely=True the needs are
        a guess (a predictor's), read only with spare time and room, never
        before or at the cost of what was announced."""
    def close(self) -> None: ...
    def __enter__(self) -> "Weights": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

def open(
    path: Union[str, "os.PathLike[str]"],
    mode: Literal["mmap", "stream"] = "mmap",
    *,
    huge_pages: bool = True,
    reread_small_folios: bool = False,
) -> Weights:
    """Open a GGUF or safetensors model (a file, any shard of a split GGUF, a
    *.safetensors.index.json, or a directory). In mmap mode the files must
    not change while the handle or any array from it lives. huge_pages=False
    puts owned buffers in base pages; reread_small_folios=True re-reads what
    the page cache held in small folios once the prefetch has mapped it."""

Framework = Literal["np", "numpy", "pt", "torch", "pytorch"]

class SafeSlice:
    """A tensor from `safe_open.get_slice`, indexed lazily: `slice_[a:b]`,
    `slice_[:, a:b]`, ints, steps, tuples, Ellipsis. Indexing is the
    framework's own (numpy's or torch's) over a zero-copy view of the file:
    a view where it can view the selection, a copy where it cannot."""

    def get_shape(self) -> List[int]:
        """The full tensor's shape (a block-quantized GGUF tensor's byte shape;
        safetensors' element shape for F4 and F6)."""
    def get_dtype(self) -> str:
        """safetensors' dtype string ("F32", "BF16", "F8_E4M3", ...); for
        GGUF, the ggml type's name ("Q4_K", "F16", ...)."""
    def __getitem__(self, index: Any) -> Any: ...

class safe_open:
    """safetensors' `safe_open`, over anything `open` loads (a safetensors or
    GGUF file, any shard of a split GGUF, a *.safetensors.index.json, a
    directory). framework "np"/"numpy": read-only zero-copy numpy arrays;
    "pt"/"torch"/"pytorch": zero-copy CPU tensors over a copy-on-write
    mapping (writes stay in this process, never reach the file). device:
    "cpu". The files must not change while the handle or a tensor lives."""

    def __init__(
        self,
        filename: Union[str, "os.PathLike[str]"],
        framework: Framework,
        device: Any = "cpu",
        backend: Literal["mmap", "pread"] = "mmap",
        *,
        huge_pages: bool = True,
        reread_small_folios: bool = False,
    ) -> None:
        """huge_pages and reread_small_folios as for `open`, where weightmap
        loads the file (framework "np", or backend "pread"); ValueError if
        set otherwise for framework "pt" with backend "mmap"."""
    def huge_pages(self) -> Dict[str, Optional[int]]:
        """As `Weights.huge_pages`; ValueError for framework "pt" with
        backend "mmap"."""
    def keys(self) -> List[str]:
        """Tensor names, sorted (as safetensors)."""
    def offset_keys(self) -> List[str]:
        """Tensor names in file order (shard by shard)."""
    def metadata(self) -> Optional[Dict[str, Any]]:
        """safetensors: the __metadata__ map, or None when the file has none;
        GGUF: every key/value of the (first) file as Python values."""
    def get_tensor(self, name: str) -> Any:
        """A read-only numpy array ("np") or a CPU torch.Tensor ("pt"),
        zero-copy with backend "mmap". weightmap.SafetensorError if absent."""
    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor by name, in file order."""
    def get_slice(self, name: str) -> SafeSlice: ...
    def __enter__(self) -> "safe_open": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class _CacheEntry:
    """A cache entry's file, open: the very file a lookup checked, or a fill
    wrote. Its tensors are mapped from this handle, never from the entry's
    path, which another fill may rename over, or a prune remove, meanwhile."""

    @property
    def path(self) -> str:
        """The entry's path when the handle was taken (for messages)."""
    def torch_tensors(self) -> Dict[str, Any]:
        """Every tensor ("t.0", "t.1", ...) by name in file order, as CPU
        torch tensors viewing a copy-on-write mapping of this open file."""

class _CacheMiss:
    """A transform-cache lookup that found no usable entry (weightmap.gguf's
    cache of transformers' conversion uses it)."""

    @property
    def replaced(self) -> Optional[str]:
        """Why the entry that was there was not used, if there was one."""
    def write(self, tensors: List[Any], metadata: Dict[str, str], commit: bool = True) -> Dict[str, Any]:
        """Store `tensors` ((name, array) or (name, array, type_name): numpy
        arrays of 1 to 4 dimensions, float32/16, bfloat16, float64, int8 to
        int64; type_name "F32", "BF16", ... takes an array of that element
        size as that type) and `metadata` (no key under "weightmap.") as the
        entry, with the GIL released (nothing may write to or resize the
        arrays meanwhile). Returns outcome ("filled" or "in_memory"), entry,
        entry_file (the file written, open: a _CacheEntry, or None), reason
        ("read_only", "invalid_max_size", ...), message, replaced. Once
        only. With commit=False: outcome "pending", entry the temporary
        file's path, entry_file that file (map it now, through
        entry_file.torch_tensors()), and pending, a _CachePending whose
        commit() finishes."""

class _CachePending:
    """An entry written but not committed: _CacheMiss.write(commit=False)."""

    def commit(self) -> Dict[str, Any]:
        """Wait for the disk and rename the entry into place, with the GIL
        released; a dict as _CacheMiss.write returns. Once only."""

def _cache_lookup(
    source: Union[str, "os.PathLike[str]"],
    name: str,
    version: int,
    machine: str,
    dir: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> Dict[str, Any]:
    """The entry of transform (name, version, machine) of `source` in the
    cache at `dir` (default: $WEIGHTMAP_CACHE_DIR, $XDG_CACHE_HOME/weightmap,
    ~/.cache/weightmap): hit (the entry's path or None), entry_file (a hit's
    file as the lookup checked it, open: a _CacheEntry, or None), names and
    metadata (a hit's tensor names and string key/values), miss (a
    _CacheMiss or None), replaced (why an entry there was not used),
    seconds."""
