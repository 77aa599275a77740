"""transformers' from_pretrained(gguf_file=...) through weightmap.gguf.patch()
gives the parameters gguf-py's path gives, bit for bit, on models
`weightmap gen` makes (llama and gemma3 shapes).

The tests skip, or with WEIGHTMAP_REQUIRE_TRANSFORMERS=1 fail, without
transformers or the models (_transformers_env.py).
"""

import pathlib

import gguf
import pytest
from _transformers_env import MODELS, needs_transformers, torch

import weightmap.gguf as wg

pytestmark = needs_transformers


def _load(directory):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file="model.gguf")
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_from_pretrained_same_parameters_with_the_patch(arch, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    directory = pathlib.Path(MODELS) / arch
    assert (directory / "model.gguf").is_file(), directory
    want = _load(directory)  # gguf-py's reader and dequantizer
    opened = []
    init = wg.GGUFReader.__init__

    def spy(self, *args, **kwargs):
        opened.append(args[0])
        init(self, *args, **kwargs)

    monkeypatch.setattr(wg.GGUFReader, "__init__", spy)
    wg.patch()
    try:
        got = _load(directory)
    finally:
        wg.unpatch()
    assert opened, "transformers did not open the file through weightmap.gguf.GGUFReader"
    assert gguf.GGUFReader is not wg.GGUFReader  # unpatched
    assert list(got) == list(want)
    for k in want:
        a, b = got[k], want[k]
        assert a.dtype == b.dtype and a.shape == b.shape, k
        # Bit for bit (the generated weights hold NaNs: no float comparison).
        assert torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)), k
