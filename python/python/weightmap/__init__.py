"""weightmap: GGUF and safetensors weights, mapped from their files, as
zero-copy numpy arrays or torch tensors.

- ``weightmap.open(path)``: weightmap's own handle (read-only arrays,
  metadata, dequantization, the load report);
- ``weightmap.safe_open(path, framework)``: safetensors' ``safe_open``
  surface, for numpy (``"np"``) and torch (``"pt"``), over safetensors and
  GGUF files alike;
- ``weightmap.numpy.load_file`` and ``weightmap.torch.load_file``: as
  ``safetensors.numpy.load_file`` and ``safetensors.torch.load_file``.

torch is optional: it is imported only by ``framework="pt"`` and
``weightmap.torch.load_file``.
"""

from ._weightmap import Error, SafeSlice, Weights, __version__, open, safe_open
from . import numpy

__all__ = ["Error", "SafeSlice", "Weights", "__version__", "numpy", "open", "safe_open"]
