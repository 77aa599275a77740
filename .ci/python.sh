#!/usr/bin/env bash
# The Python bindings (python/): build them with maturin through pip into a
# venv under target/, then run their tests against the committed fixtures
# and files safetensors and gguf-py write, with the reference readers
# (gguf-py, safetensors, safetensors' torch path) as oracles.
# Exits non-zero on any failure, "no tests collected" (pytest's 5) included.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV="$ROOT/target/python-venv"
PY="${PYTHON:-python3}"

# python3 -m venv needs ensurepip, which Debian ships as python3-venv.
if [ ! -x "$VENV/bin/python" ]; then
  rm -rf "$VENV"
  if ! "$PY" -m venv "$VENV" >/dev/null 2>&1; then
    rm -rf "$VENV"
    echo "== python3 -m venv failed: installing python3-venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      apt-get install -y -qq "python${ver}-venv" >/dev/null 2>&1 || apt-get install -y -qq python3-venv
    else
      echo "python3 -m venv does not work and python3-venv cannot be installed (not root or no apt-get)" >&2
      exit 1
    fi
    "$PY" -m venv "$VENV"
  fi
fi

echo "== pip install maturin numpy pytest gguf safetensors ml_dtypes"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
# gguf 0.19.0 made the fixtures (testdata/README.md): the oracle is pinned to
# it. safetensors is pinned to the version whose own tests
# .ci/safetensors-suite.sh runs.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
  "maturin>=1.5,<2" numpy pytest "gguf==0.19.0" "safetensors==0.8.0" ml_dtypes

# torch is optional for the package, but CI tests weightmap.safe_open's
# torch path against safetensors' own. The CPU-only wheel index is not
# reachable from CI, so it is PyPI's wheel, which pulls CUDA's libraries:
# 3.0 GB to download, 5.3 GB installed, 100 s on CI's machine without a
# pip cache (python/README.md, "CI"); --no-compile saves a fifth, and
# --no-cache-dir the 3.0 GB pip would keep (CI's disk is small). Pinned, so
# that a warm venv is a no-op. WEIGHTMAP_TORCH=0 skips it (and the torch
# tests skip, saying why); otherwise the tests require torch.
TORCH_SPEC="torch==2.15.0"
if [ "${WEIGHTMAP_TORCH:-1}" != 0 ]; then
  echo "== pip install $TORCH_SPEC"
  t0=$(date +%s)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile --no-cache-dir "$TORCH_SPEC"
  echo "   torch: $(( $(date +%s) - t0 )) s, $(du -sm "$VENV" | cut -f1) MiB venv"
  export WEIGHTMAP_REQUIRE_TORCH=1
fi

# transformers (and accelerate, which its GGUF path needs), pinned, for
# python/tests/test_transformers_gguf.py: from_pretrained(gguf_file=) with
# and without weightmap.gguf.patch() on models `weightmap gen` makes.
if [ "${WEIGHTMAP_TORCH:-1}" != 0 ]; then
  echo "== pip install transformers==5.24.0 accelerate==1.16.0"
  t0=$(date +%s)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile \
    "transformers==5.24.0" "accelerate==1.16.0"
  echo "   transformers: $(( $(date +%s) - t0 )) s"
  echo "== weightmap gen: a llama-shaped and a gemma3-shaped GGUF for transformers"
  GEN="$ROOT/target/python-gen"
  mkdir -p "$GEN/llama" "$GEN/gemma3"
  cargo run --locked -q -- gen "$GEN/llama/model.gguf" --size 16M --tensors 57 --vocab 2000
  cargo run --locked -q -- gen "$GEN/gemma3/model.gguf" --arch gemma3 --size 24M --tensors 41 --vocab 2000
  # and a llama-shaped safetensors model for the tensor-parallel example
  cargo run --locked -q -- gen "$GEN/tp.safetensors" --format safetensors --size 64M \
    --tensors 57 --vocab 4000 --types f32,f16,bf16
  export WEIGHTMAP_GEN_MODELS="$GEN" WEIGHTMAP_REQUIRE_TRANSFORMERS=1 HF_HUB_OFFLINE=1
fi

echo "== pip install ./python (maturin builds the extension)"
# Build outside python/ so that repeated runs reuse the compiled crates.
export CARGO_TARGET_DIR="$ROOT/target/python"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps ./python

echo "== pytest python/tests"
# Run from python/tests' parent with the installed module (not a source tree).
set +e
(cd "$ROOT/python" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests)
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  exit "$rc"
fi

# safetensors' own tests with weightmap's readers swapped in (they need
# torch), and the tensor-parallel example on two ranks (gloo, CPU).
if [ "${WEIGHTMAP_TORCH:-1}" != 0 ]; then
  VENV="$VENV" bash "$ROOT/.ci/safetensors-suite.sh"
  echo "== torchrun --nproc-per-node 2 python/examples/tp_load.py"
  t0=$(date +%s)
  (cd "$ROOT/target" && "$VENV/bin/torchrun" --nproc-per-node 2 \
    "$ROOT/python/examples/tp_load.py" "$GEN/tp.safetensors")
  echo "   tp_load: $(( $(date +%s) - t0 )) s"
fi
