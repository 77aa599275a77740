#!/usr/bin/env bash
# CI for what `pip install weightmap` installs (called by .ci/run after
# .ci/python.sh; runs on its own too):
#   1. python/build-wheels.sh: the x86-64 and aarch64 manylinux2014 abi3
#      wheels (auditwheel show accepts each tag) and the sdist;
#   2. the sdist builds with cargo (pip wheel, maturin from the tools venv);
#   3. the x86-64 wheel, installed with its one dependency (numpy) into a
#      fresh venv of every CPython >= 3.9 the machine has (pyenv's and those
#      on PATH; 3.9 to 3.13 must all be there), passes python/tests there,
#      the torch tests skipping (torch is not installed; on 3.9, the tests
#      whose oracle file safetensors 0.7 cannot write are deselected:
#      .ci/pytest_oracle_dtypes.py);
#   4. the aarch64 wheel passes python/tests under qemu-user, in Debian's
#      arm64 CPython (the bookworm python3.11 packages of the arm64
#      multiarch lists, unpacked into target/, not installed), with numpy
#      and the tests' oracles from PyPI's aarch64 wheels.
#
# Builds reuse .ci/python.sh's cargo target directory (target/python): the
# sdist's build finds every dependency compiled there. Every pytest run
# fails on "no tests collected" (exit 5). Every step runs and reports; the
# script fails at the end if any did.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHEELS=$ROOT/target/wheels
TOOLS=$ROOT/target/wheel-tools
WORK=$ROOT/target/wheel-tests
export CARGO_TARGET_DIR=$ROOT/target/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
# No torch in these venvs: its tests skip, saying why (.ci/python.sh runs them).
unset WEIGHTMAP_REQUIRE_TORCH
# The tests' oracles, as .ci/python.sh pins them (gguf 0.19.0 made the fixtures).
TEST_DEPS=(pytest "gguf==0.19.0" safetensors ml_dtypes)
# Every CPython from the wheel's floor (requires-python) up to this one must be found.
REQUIRED_MINORS="9 10 11 12 13"

# The steps' bookkeeping: step, finish, binfmt_aarch64.
# shellcheck source=.ci/lib.sh
source .ci/lib.sh

# pytest_in DIR PYTHON [ARGS...]: python/tests from python/ (not the source
# package, which is python/python/weightmap), "no tests" failing.
pytest_in() {
  local python=$1 rc
  shift
  set +e
  (cd "$ROOT/python" && "$python" -m pytest -q -p no:cacheprovider "$@" tests)
  rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
    return 1
  fi
  return "$rc"
}

# -- 1. build ----------------------------------------------------------------
step "python/build-wheels.sh x86_64 aarch64 sdist" bash python/build-wheels.sh x86_64 aarch64 sdist
if [ "$failed" -ne 0 ]; then
  finish wheels
fi
version=$(sed -n 's/^version = "\([0-9.]*\)"$/\1/p' python/Cargo.toml | head -1)
x86_whl=$WHEELS/weightmap-$version-cp39-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
a64_whl=$WHEELS/weightmap-$version-cp39-abi3-manylinux2014_aarch64.manylinux_2_17_aarch64.whl
sdist=$WHEELS/weightmap-$version.tar.gz
wheel_sizes() { ls -l "$x86_whl" "$a64_whl" "$sdist"; }
step "the wheels and the sdist, by name" wheel_sizes

# -- 2. the sdist builds with cargo -----------------------------------------
sdist_builds() {
  rm -rf "$WORK/sdist"
  mkdir -p "$WORK/sdist"
  # maturin from the tools venv (no build isolation: no second download).
  PATH="$TOOLS/bin:$PATH" nice -n 10 "$TOOLS/bin/python" -m pip wheel -q --no-deps \
    --no-build-isolation -w "$WORK/sdist" "$sdist"
  ls -l "$WORK/sdist"
  ls "$WORK/sdist"/weightmap-"$version"-cp39-abi3-linux_x86_64.whl >/dev/null
}
step "the sdist builds with cargo (pip wheel weightmap-$version.tar.gz)" sdist_builds

# -- 3. the x86-64 wheel on every CPython ------------------------------------
# Interpreters: pyenv's versions, then python3.X on PATH; the first found per minor.
declare -A by_minor=()
candidates=()
if command -v pyenv >/dev/null 2>&1; then
  for v in $(pyenv versions --bare 2>/dev/null); do
    candidates+=("$(pyenv root)/versions/$v/bin/python")
  done
fi
# pyenv's versions even when pyenv is not on PATH.
for c in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/*/bin/python; do
  candidates+=("$c")
done
for m in $REQUIRED_MINORS; do
  c=$(command -v "python3.$m" 2>/dev/null) && candidates+=("$c")
done
for c in "${candidates[@]}"; do
  [ -x "$c" ] || continue
  mv=$("$c" -c 'import sys; print(sys.version_info[1] if sys.version_info[:2] >= (3, 9) else "")' 2>/dev/null) || continue
  [ -n "$mv" ] && [ -z "${by_minor[$mv]:-}" ] && by_minor[$mv]=$c
done
interpreters() {
  local m missing=()
  for m in $(printf '%s\n' "${!by_minor[@]}" | sort -n); do
    echo "3.$m: ${by_minor[$m]} ($("${by_minor[$m]}" -V 2>&1))"
  done
  for m in $REQUIRED_MINORS; do
    [ -n "${by_minor[$m]:-}" ] || missing+=("3.$m")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "no CPython ${missing[*]} on this machine (pyenv versions, python3.X on PATH)" >&2
    return 1
  fi
}
step "CPythons >= 3.9 on this machine" interpreters

x86_test() {
  local python=$1 venv
  venv=$WORK/venv-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "$x86_whl"
  # The wheel's own dependencies: numpy alone.
  local installed
  installed=$("$venv/bin/python" -m pip list --format freeze --exclude pip --exclude setuptools \
    | cut -d= -f1 | tr 'A-Z' 'a-z' | sort | tr '\n' ' ')
  echo "installed with the wheel: $installed"
  [ "$installed" = "numpy weightmap " ] || { echo "expected numpy and weightmap alone" >&2; return 1; }
  "$venv/bin/python" -c '
import sys, numpy, weightmap, weightmap._weightmap as ext
assert ext.__file__.endswith("_weightmap.abi3.so"), ext.__file__
assert "site-packages" in weightmap.__file__, weightmap.__file__
print(sys.version.split()[0], "numpy", numpy.__version__, "weightmap", weightmap.__version__, ext.__file__)'
  # gguf 0.19.0 (the fixtures' maker, the oracle) says it needs 3.10 but
  # runs on 3.9: its dependencies as usual, itself past the check.
  "$venv/bin/python" -m pip install -q pytest safetensors ml_dtypes pyyaml tqdm requests
  "$venv/bin/python" -m pip install -q --no-deps --ignore-requires-python "gguf==0.19.0"
  # On 3.9, safetensors (0.7.0, the oracle) cannot write the FNUZ float8
  # file that the every_dtype tests compare against: the plugin deselects
  # those tests there, and only where safetensors refuses (it says so).
  export PYTHONPATH=$ROOT/.ci
  pytest_in "$venv/bin/python" -rs -p pytest_oracle_dtypes
}
for m in $(printf '%s\n' "${!by_minor[@]}" | sort -n); do
  step "x86-64 wheel on CPython 3.$m: numpy alone, then python/tests (no torch)" x86_test "${by_minor[$m]}"
done

# -- 4. the aarch64 wheel under qemu-user, in Debian's arm64 CPython ---------
A64_ROOT=$WORK/arm64-root
A64_SITE=$WORK/arm64-site
a64_python() {
  export DEBIAN_FRONTEND=noninteractive
  local need=()
  command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  if [ ${#need[@]} -gt 0 ] || ! apt-cache show python3.11-minimal:arm64 >/dev/null 2>&1; then
    apt-get update -q >/dev/null
  fi
  [ ${#need[@]} -eq 0 ] || apt-get install -y -q "${need[@]}" >/dev/null
  # The interpreter, its standard library and what they load, unpacked (not
  # installed: python3.11:arm64 would replace the machine's python3.11).
  local pkgs=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 libgcc-s1
    libstdc++6 libexpat1 zlib1g libssl3 libffi8 libbz2-1.0 liblzma5 libuuid1 libsqlite3-0
    libncursesw6 libtinfo6 libreadline8)
  rm -rf "$A64_ROOT" "$WORK/arm64-debs"
  mkdir -p "$A64_ROOT" "$WORK/arm64-debs"
  (cd "$WORK/arm64-debs" && apt-get download -q "${pkgs[@]/%/:arm64}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  [ "$(ls "$WORK/arm64-debs"/*.deb | wc -l)" -eq ${#pkgs[@]} ]
  for d in "$WORK/arm64-debs"/*.deb; do dpkg-deb -x "$d" "$A64_ROOT"; done
  # The wheel and the tests' packages: PyPI's aarch64 wheels, chosen and
  # unpacked by the host's pip for CPython 3.11 on manylinux2014 aarch64.
  rm -rf "$A64_SITE"
  "$TOOLS/bin/python" -m pip install -q --target "$A64_SITE" --platform manylinux2014_aarch64 \
    --python-version 3.11 --implementation cp --only-binary=:all: "$a64_whl" "${TEST_DEPS[@]}"
}
step "Debian's arm64 CPython 3.11 (apt-get download, unpacked in target/) and aarch64 wheels from PyPI" a64_python

step "qemu-user for aarch64 ELF files in binfmt_misc" binfmt_aarch64

a64_test() {
  export QEMU_LD_PREFIX=$A64_ROOT PYTHONPATH=$A64_SITE PYTHONDONTWRITEBYTECODE=1
  local py=$A64_ROOT/usr/bin/python3.11
  "$py" -c '
import platform, sys, numpy, weightmap, weightmap._weightmap as ext
assert platform.machine() == "aarch64", platform.machine()
assert ext.__file__.endswith("_weightmap.abi3.so"), ext.__file__
print(sys.version.split()[0], platform.machine(), "numpy", numpy.__version__, "weightmap", weightmap.__version__, ext.__file__)'
  pytest_in "$py" -rs
}
step "aarch64 wheel under qemu-user, Debian's arm64 CPython 3.11: python/tests (no torch)" a64_test

finish wheels
