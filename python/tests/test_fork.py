"""Weights mapped by a parent, used in a child after fork (issue 54).

Python's multiprocessing forks by default on Linux, and so do pre-forking
servers. The announcing thread does not exist in a child: before issue 54
a child's `del w` raised PanicException (joining a thread that is not
there), and its announcements queued with nothing to drain them.
"""

import os
import sys

import gguf
import numpy as np
import pytest

import weightmap

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="fork and /proc/self/status: Linux"
)

UP = "blk.0.ffn_up_exps.weight"


def rss_anon_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon line")


def moe_model(path):
    gw = gguf.GGUFWriter(path, "olmoe")
    experts = np.arange(8 * 4 * 1024, dtype=np.float32).reshape(8, 4, 1024)
    gw.add_tensor(UP, experts)
    gw.add_tensor("blk.0.attn_norm.weight", np.ones(1024, dtype=np.float32))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    return experts


def test_a_child_after_fork_announces_reads_and_frees(tmp_path):
    path = tmp_path / "moe.gguf"
    stderr_path = tmp_path / "child-stderr.txt"
    experts = moe_model(path)
    w = weightmap.open(path)
    # The parent's thread runs before the fork.
    w.prefetch([0, (UP, [1, 2])])
    r, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report on the pipe, never return into pytest
        os.close(r)
        # A panic in a destructor is printed, not raised: the parent reads
        # what the child printed.
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
        why = b""
        try:
            before = rss_anon_kib()
            for i in range(200_000):
                w.prefetch([(UP, [i % 8, (i + 3) % 8]), 1])
            grown = rss_anon_kib() - before
            if grown >= 4096:
                why += b"RssAnon grew by %d KiB over 200,000 announcements; " % grown
            got = w[UP].view(np.float32).reshape(8, 4, 1024)
            if not np.array_equal(got, experts):
                why += b"the child read other bytes; "
            del got
            w.close()
            del w
        except BaseException as e:  # PanicException derives from BaseException
            why += repr(e).encode()
        os.write(wr, why or b"ok")
        os._exit(0)
    os.close(wr)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert said == "ok", said
    printed = stderr_path.read_text()
    assert "anic" not in printed, printed
    # The parent carries on with its own thread.
    w.prefetch([(UP, [5])])
    np.testing.assert_array_equal(w[UP].view(np.float32).reshape(8, 4, 1024), experts)
    w.close()
