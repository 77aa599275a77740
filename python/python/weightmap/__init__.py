"""weightmap: GGUF and safetensors weights, mapped from their files, as
zero-copy numpy arrays or torch tensors.

- ``weightmap.open(path)``: weightmap's own handle (read-only arrays,
  metadata, dequantization, the load report);
- ``weightmap.safe_open(path, framework)``: safetensors' ``safe_open``
  surface, for numpy (``"np"``) and torch (``"pt"``), over safetensors and
  GGUF files alike;
- ``weightmap.numpy.load_file`` and ``weightmap.torch.load_file``: as
  ``safetensors.numpy.load_file`` and ``safetensors.torch.load_file``;
- ``weightmap.gguf``: gguf-py's ``GGUFReader`` and ``dequantize``, and
  ``patch()`` to put them in gguf-py's place.

torch is optional: it is imported only by ``framework="pt"`` and
``weightmap.torch.load_file``.
"""

from ._weightmap import Error, SafeSlice, Weights, __version__, open, safe_open


def _safetensor_error_bases():
    try:
        from safetensors import SafetensorError as _StError
    except Exception:  # safetensors is optional
        return (Error,)
    return (Error, _StError)


class SafetensorError(*_safetensor_error_bases()):  # type: ignore[misc]
    """The error ``weightmap.safe_open`` raises where safetensors raises its
    ``SafetensorError`` (a missing tensor, a closed handle, a bad header, an
    out-of-range slice, a bad ``backend=``), with safetensors' message.

    A ``weightmap.Error`` (so a ``ValueError``); where safetensors is
    importable, also a ``safetensors.SafetensorError``, so that existing
    ``except SafetensorError`` clauses catch it.
    """

    # ValueError's message, never KeyError-style quoting or another base's.
    __str__ = BaseException.__str__


SafetensorError.__module__ = "weightmap"

from . import numpy  # noqa: E402  (after SafetensorError, which it may raise)

__all__ = [
    "Error",
    "SafeSlice",
    "SafetensorError",
    "Weights",
    "__version__",
    "numpy",
    "open",
    "safe_open",
]
