#!/usr/bin/env bash
# safetensors' own Python tests, with weightmap's readers in safetensors'
# place (python/safetensors_suite/). Run by .ci/python.sh, in its venv, after
# the bindings are installed: VENV must name that venv.
#
# The tests are not in this repository: they are safetensors 0.8.0's (the
# version .ci/python.sh installs), taken from its sdist on PyPI, which ships
# bindings/python/tests; the download is pinned by its sha256. The suite runs
# twice, as it is and with the swap, and python/safetensors_suite/compare.py
# fails the step if a test that passes on safetensors does not pass on
# weightmap (or nothing ran, or no test reached weightmap).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
: "${VENV:?VENV must name the venv .ci/python.sh made}"
VENV=$(cd "$VENV" && pwd)
PYBIN="$VENV/bin/python"

ST_VERSION=0.8.0
ST_URL="https://files.pythonhosted.org/packages/45/06/f955dbbb1859e3bd23c8ac6141af5106e7ad5fedec4a3a6e3d60f94b7001/safetensors-$ST_VERSION.tar.gz"
ST_SHA256=fabaf3e0f18a6618d9b36560682562157f77c2b71fcffc7b432be2baed9d753d
# The test modules for the readers numpy and torch use; the tf, flax, mlx
# and paddle ones need frameworks weightmap does not serve.
ST_TESTS="test_simple.py test_pt_comparison.py test_handle.py test_threadable.py test_multithreaded.py test_pt_model.py test_pread_backend.py"

WORK="$ROOT/target/safetensors-suite"
mkdir -p "$WORK"
TARBALL="$WORK/safetensors-$ST_VERSION.tar.gz"
if ! echo "$ST_SHA256  $TARBALL" | sha256sum -c --status 2>/dev/null; then
  echo "== downloading safetensors $ST_VERSION's sdist (its Python tests)"
  "$PYBIN" - "$ST_URL" "$TARBALL" <<'PY'
import sys, urllib.request
urllib.request.urlretrieve(sys.argv[1], sys.argv[2])
PY
  echo "$ST_SHA256  $TARBALL" | sha256sum -c --quiet
fi

installed=$("$PYBIN" -c 'import safetensors; print(safetensors.__version__)')
if [ "$installed" != "$ST_VERSION" ]; then
  echo "safetensors $installed is installed; the suite is $ST_VERSION's" >&2
  exit 1
fi

run() {  # run NAME on|off: a fresh copy of the tests, results in $WORK/NAME.json
  local name=$1 swap=$2 dir="$WORK/$1"
  rm -rf "$dir"
  mkdir -p "$dir"
  tar -xzf "$TARBALL" -C "$dir" --strip-components=3 \
    "safetensors-$ST_VERSION/bindings/python/tests"
  # The tests write ./tests/data/... and ./out_*.safetensors: run from $dir.
  set +e
  (cd "$dir" && PYTHONPATH="$ROOT/python/safetensors_suite" "$PYBIN" -m pytest -q \
    -p no:cacheprovider -p wm_swap --wm-swap="$swap" --wm-results="$WORK/$name.json" \
    $(for t in $ST_TESTS; do echo "tests/$t"; done) > "$WORK/$name.log" 2>&1)
  local rc=$?
  set -e
  tail -n 1 "$WORK/$name.log"
  # pytest's 5: nothing collected. Other failures are compared below.
  if [ "$rc" -eq 5 ] || [ "$rc" -ge 2 ]; then
    cat "$WORK/$name.log" >&2
    echo "pytest exited $rc on the $name run" >&2
    exit 1
  fi
}

t0=$(date +%s)
echo "== safetensors $ST_VERSION's tests on safetensors"
run safetensors off
echo "== safetensors $ST_VERSION's tests on weightmap"
run weightmap on
if ! "$PYBIN" "$ROOT/python/safetensors_suite/compare.py" "$WORK/safetensors.json" "$WORK/weightmap.json"; then
  grep -E "^(FAILED|ERROR)" "$WORK/weightmap.log" >&2 || true
  exit 1
fi
echo "   safetensors' suite: $(( $(date +%s) - t0 )) s"
