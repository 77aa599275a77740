"""``safetensors.torch``'s loader, zero-copy: CPU tensors viewing a
copy-on-write mapping of the file. Writes into them stay in this process
(the pages written become private memory) and never reach the file.

torch is imported when a function here is called, not when this module is.
"""

import os
from typing import TYPE_CHECKING, Dict, Union

from ._weightmap import safe_open

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["load_file"]


def load_file(
    filename: Union[str, "os.PathLike[str]"],
    device: str = "cpu",
    *,
    backend: str = "mmap",
) -> "Dict[str, torch.Tensor]":
    """Every tensor of ``filename`` (a safetensors or GGUF file, any shard of
    a split GGUF, a ``*.safetensors.index.json`` or a directory holding one),
    by name in file order, as CPU tensors viewing a copy-on-write mapping of
    the file (``backend="mmap"``, the default), or owning a copy of what
    weightmap's stream path read (``backend="pread"``: no mapping).
    ``device`` must be ``"cpu"``; move tensors with ``.to()``.

    With ``"mmap"``, the file must not be modified or truncated while any
    tensor lives.
    """
    with safe_open(filename, framework="pt", device=device, backend=backend) as f:
        return f.get_tensors()
