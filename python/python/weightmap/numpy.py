"""``safetensors.numpy``'s loader, zero-copy: arrays are read-only views of
the mapped file (bf16 and the 8-bit floats as ml_dtypes types)."""

import os
from typing import Dict, Union

import numpy as np

from ._weightmap import safe_open

__all__ = ["load_file"]


def load_file(
    filename: Union[str, "os.PathLike[str]"], *, backend: str = "mmap"
) -> Dict[str, np.ndarray]:
    """Every tensor of ``filename`` (a safetensors or GGUF file, any shard of
    a split GGUF, a ``*.safetensors.index.json`` or a directory holding one),
    by name in file order, as read-only numpy arrays viewing the mapped file
    (``backend="mmap"``, the default) or the memory weightmap's stream path
    read the tensors into (``backend="pread"``).

    With ``"mmap"``, the file must not be modified or truncated while any
    array lives.
    """
    with safe_open(filename, framework="np", backend=backend) as f:
        return f.get_tensors()
