"""What the transformers tests share: whether transformers (with torch) and
the models `weightmap gen` makes are there, and the mark that skips a test
when they are not.

.ci/python.sh makes the models and names their directory in
WEIGHTMAP_GEN_MODELS (holding llama/model.gguf and gemma3/model.gguf), and
sets WEIGHTMAP_REQUIRE_TRANSFORMERS=1: the tests then fail, rather than
skip, when transformers or the models are missing.
"""

import os

import pytest

REQUIRE = os.environ.get("WEIGHTMAP_REQUIRE_TRANSFORMERS") == "1"
MODELS = os.environ.get("WEIGHTMAP_GEN_MODELS")

try:
    import torch
    import transformers
except ImportError:  # pragma: no cover - CI installs them
    if REQUIRE:
        raise
    torch = transformers = None

needs_transformers = pytest.mark.skipif(
    not REQUIRE and (transformers is None or not MODELS),
    reason="transformers or WEIGHTMAP_GEN_MODELS (models `weightmap gen` made) missing",
)
