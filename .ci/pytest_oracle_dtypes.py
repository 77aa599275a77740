"""A pytest plugin for .ci/wheels.sh: leave out the tests whose oracle file
the installed safetensors cannot write.

python/tests' `every_dtype` fixture has safetensors write a file holding
every dtype weightmap reads, the 8-bit float FNUZ types included. On
CPython 3.9 the newest safetensors is 0.7.0 (0.8 needs 3.10), which has no
FNUZ types, so the fixture fails before weightmap is called. This plugin
asks safetensors to write one such tensor; only if it refuses are the tests
that use the fixture deselected, and the count is printed. Everything else
runs as everywhere. Loaded with `-p pytest_oracle_dtypes` (PYTHONPATH=.ci).
"""

import numpy as np


def _oracle_refusal():
    try:
        import ml_dtypes
        import safetensors.numpy
    except ImportError as e:  # the suite itself will say what is missing
        return None
    try:
        safetensors.numpy.save({"x": np.zeros(1, dtype=ml_dtypes.float8_e5m2fnuz)})
    except Exception as e:  # safetensors' own error type differs by version
        return f"safetensors {safetensors.__version__} cannot write F8_E5M2FNUZ ({e})"
    return None


def pytest_collection_modifyitems(config, items):
    why = _oracle_refusal()
    if why is None:
        return
    left_out = [i for i in items if "every_dtype" in getattr(i, "fixturenames", ())]
    if not left_out:
        return
    items[:] = [i for i in items if i not in left_out]
    config.hook.pytest_deselected(items=left_out)
    print(f"\n{len(left_out)} tests that use the every_dtype fixture deselected: {why}")
