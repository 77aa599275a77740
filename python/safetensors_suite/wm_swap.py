"""pytest plugin: run safetensors' own Python tests with weightmap's readers
in safetensors' place, and record what each test did.

Loaded with ``-p wm_swap`` (this directory on ``PYTHONPATH``) by
``.ci/safetensors-suite.sh``, which runs the pinned suite twice: once as it
is (``--wm-swap=off``, safetensors' own result) and once with the swap
(``--wm-swap=on``). With the swap, before any test module is imported:

- ``safetensors.safe_open`` (and the ``safe_open`` that
  ``safetensors.numpy`` and ``safetensors.torch`` imported, which
  ``load_model`` and friends use) is ``weightmap.safe_open``;
- ``safetensors.numpy.load_file`` is ``weightmap.numpy.load_file``;
- ``safetensors.torch.load_file`` (which ``load_model`` calls) is
  ``weightmap.torch.load_file``.

Writers (``save_file``, ``serialize``, ...) stay safetensors' own.
``--wm-results FILE`` writes, for every test, its outcome ("passed",
"failed", "skipped") and whether it called into weightmap.
"""

import functools
import json
import threading

import pytest

_lock = threading.Lock()
_current = {"nodeid": None}
_called = set()
_outcomes = {}
_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def pytest_addoption(parser):
    group = parser.getgroup("wm_swap", "weightmap in safetensors' place")
    group.addoption("--wm-swap", choices=("on", "off"), default="off",
                    help="put weightmap's readers in safetensors' place")
    group.addoption("--wm-results", default=None,
                    help="write each test's outcome (JSON) to this file")


def _counted(fn):
    """``fn``, noting that the running test called it (threads included)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with _lock:
            if _current["nodeid"] is not None:
                _called.add(_current["nodeid"])
        return fn(*args, **kwargs)

    return call


def pytest_configure(config):
    if config.getoption("--wm-swap") != "on":
        return
    import safetensors
    import safetensors.numpy
    import safetensors.torch

    import weightmap
    import weightmap.numpy
    import weightmap.torch

    safe_open = _counted(weightmap.safe_open)
    for mod in (safetensors, safetensors.numpy, safetensors.torch):
        if hasattr(mod, "safe_open"):
            mod.safe_open = safe_open
    safetensors.numpy.load_file = _counted(weightmap.numpy.load_file)
    safetensors.torch.load_file = _counted(weightmap.torch.load_file)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current["nodeid"] = item.nodeid
    yield
    _current["nodeid"] = None


def pytest_runtest_logreport(report):
    outcome = "failed" if report.failed else "skipped" if report.skipped else "passed"
    old = _outcomes.get(report.nodeid, "passed")
    _outcomes[report.nodeid] = max(old, outcome, key=_RANK.__getitem__)


def pytest_collectreport(report):
    # A module that cannot be imported is a failure of its own.
    if report.failed:
        _outcomes[report.nodeid] = "failed"


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--wm-results")
    if not path:
        return
    results = {
        nodeid: {"outcome": outcome, "weightmap": nodeid in _called}
        for nodeid, outcome in sorted(_outcomes.items())
    }
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
