"""Huge pages from Python: owned buffers in huge pages or not
(`huge_pages=`), the re-read of small page-cache folios
(`reread_small_folios=`), and the figure (`huge_pages()`), on
`weightmap.open` and `weightmap.safe_open`."""

import pathlib
import sys

import numpy as np
import pytest
import safetensors.numpy

import weightmap

TESTDATA = pathlib.Path(__file__).resolve().parents[2] / "testdata"
KEYS = {
    "mapped_bytes",
    "mapped_resident",
    "mapped_huge",
    "mapped_huge_capacity",
    "mapped_small",
    "owned_bytes",
    "owned_huge",
    "reread_bytes",
}


def thp_for_advised_memory():
    """Whether memory advised MADV_HUGEPAGE gets huge pages here: an 8 MiB
    anonymous map advised and touched, then its AnonHugePages in
    /proc/self/smaps. False where it gets none: THP off, no madvise
    (qemu-user ignores it), or no /proc."""
    import ctypes
    import mmap

    try:
        enabled = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        if "[always]" not in enabled and "[madvise]" not in enabled:
            return False
        size, huge = 8 << 20, 2 << 20
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        start = (-addr) % huge
        m.madvise(mmap.MADV_HUGEPAGE, start, 2 * huge)
        for off in range(start, start + 2 * huge, 4096):
            m[off] = 1
        found = 0
        inside = False
        for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("AnonHugePages:"):
                found += int(line.split()[1])
        return found > 0
    except (OSError, AttributeError, ValueError, TypeError):
        return False


@pytest.fixture
def eight_mib(tmp_path):
    """A safetensors file of 8 MiB: owned buffers that large can be huge."""
    path = tmp_path / "m.safetensors"
    tensors = {f"t{i}": np.full(2 << 20, i, dtype=np.uint8) for i in range(4)}
    safetensors.numpy.save_file(tensors, str(path))
    return path


def test_the_figure_has_every_field_and_a_mapped_load_maps():
    with weightmap.open(TESTDATA / "tiny-llama.gguf") as w:
        h = w.huge_pages()
        assert set(h) == KEYS
        assert h["mapped_bytes"] > 0 and h["owned_bytes"] == 0
        assert h["reread_bytes"] == 0
        assert w.report()["reread_small_folios"] == "off"


def test_owned_buffers_in_base_pages_when_huge_pages_are_off(eight_mib):
    figures = {}
    for huge in (True, False):
        with weightmap.open(eight_mib, mode="stream", huge_pages=huge) as w:
            assert (w["t3"] == 3).all()
            figures[huge] = w.huge_pages()
    on, off = figures[True], figures[False]
    assert on["owned_bytes"] >= 8 << 20 and off["owned_bytes"] >= 8 << 20
    if on["owned_huge"] is None:
        pytest.skip("this platform cannot tell which pages are huge")
    assert off["owned_huge"] == 0, off
    if thp_for_advised_memory():
        assert on["owned_huge"] > 0, on


def test_the_reread_is_asked_for_and_says_when_it_cannot_act():
    path = TESTDATA / "tiny-llama.gguf"
    with weightmap.open(path, reread_small_folios=True) as w:
        said = w.report()["reread_small_folios"]
        assert said == "on" or said.startswith("refused: "), said
    with weightmap.open(path, mode="stream", reread_small_folios=True) as w:
        assert w.report()["reread_small_folios"] == "refused: nothing is mapped (stream path)"


def test_safe_open_takes_the_options_where_weightmap_loads_the_file(eight_mib):
    with weightmap.safe_open(
        eight_mib, framework="np", backend="pread", huge_pages=False
    ) as f:
        assert (f.get_tensor("t1") == 1).all()
        h = f.huge_pages()
        assert set(h) == KEYS and h["owned_bytes"] >= 8 << 20
        if h["owned_huge"] is not None:
            assert h["owned_huge"] == 0, h
    # torch over its copy-on-write mapping has no owned buffer and no
    # prefetch: the options are refused, not ignored (before torch loads).
    for kwargs in ({"huge_pages": False}, {"reread_small_folios": True}):
        with pytest.raises(ValueError, match="framework \"pt\""):
            weightmap.safe_open(eight_mib, framework="pt", **kwargs)
