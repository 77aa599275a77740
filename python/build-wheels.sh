#!/usr/bin/env bash
# Builds what `pip install weightmap` installs, into target/wheels/:
#
#   x86_64   weightmap-V-cp39-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
#   aarch64  weightmap-V-cp39-abi3-manylinux2014_aarch64.manylinux_2_17_aarch64.whl
#   sdist    weightmap-V.tar.gz (builds with cargo wherever there is one)
#   windows  weightmap-V-cp39-abi3-win_amd64.whl (not by default: see below)
#   macos    weightmap-V-cp39-abi3-macosx_11_0_arm64.whl (not by default: see below)
#
# Usage: bash python/build-wheels.sh [x86_64] [aarch64] [sdist] [windows] [macos]
# With no argument: x86_64, aarch64 and sdist.
#
# One wheel per platform serves every CPython from 3.9 on: the extension is
# built against the stable ABI (PyO3's abi3-py39 feature, python/Cargo.toml)
# and reaches numpy through numpy's C API capsule, not the buffer protocol.
#
# - Linux wheels are linked by zig (PyPI's `ziglang`, through maturin
#   --zig) against glibc 2.17, so that they are manylinux2014 wheels
#   whatever the glibc of the building machine; `auditwheel show` must
#   accept the tag each one carries, or the script fails.
# - aarch64: rustup cannot fetch other targets' std here, so the aarch64
#   wheel is built by Debian's rustc-web/cargo-web (/usr/bin/rustc and
#   /usr/bin/cargo) with Debian's prebuilt std for arm64
#   (libstd-rust-web-dev:arm64, installed through multiarch). No build-std.
# - windows (x86_64-pc-windows-gnu): Debian's cargo builds std from
#   rust-web-src (-Zbuild-std, several minutes), mingw links, and PyO3
#   makes python3.dll's import library itself (pyo3/generate-import-lib),
#   so no Windows Python is needed to build. Nothing here can run it.
# - macos (aarch64-apple-darwin): std built the same way, linked by zig
#   against its own stubs of libSystem (no Apple SDK is served here), signed
#   ad hoc by zig's linker. Built, never run: no macOS to run it on.
# windows and macos each build std from source: about four CPU-minutes more
# apiece, which is why CI (.ci/wheels.sh) leaves them out.
#
# Installs what it needs when missing: a venv of build tools in
# target/wheel-tools (maturin, ziglang, auditwheel, pinned), and, as root
# through apt, Debian's packages for the targets asked for. Honors
# CARGO_TARGET_DIR (default target/wheels-build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/target/wheels
TOOLS=$ROOT/target/wheel-tools
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/wheels-build}
PY="${PYTHON:-python3}"

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(x86_64 aarch64 sdist)
for t in "${targets[@]}"; do
  case $t in
    x86_64 | aarch64 | sdist | windows | macos) ;;
    *) echo "build-wheels.sh: unknown target '$t' (x86_64, aarch64, sdist, windows, macos)" >&2; exit 2 ;;
  esac
done
wants() { printf '%s\n' "${targets[@]}" | grep -qx "$1"; }

# -- one version: the crates, the C package and the Python package agree --
bash .ci/version.sh

# -- build tools: maturin, zig, auditwheel ---------------------------------
if [ ! -x "$TOOLS/bin/maturin" ] || [ ! -x "$TOOLS/bin/auditwheel" ] \
  || ! "$TOOLS/bin/python" -c 'import ziglang' 2>/dev/null; then
  echo "== build tools into $TOOLS (maturin, ziglang, auditwheel)"
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check \
    "maturin==1.16.0" "ziglang==0.17.1" "auditwheel==6.8.2"
fi
# maturin finds zig as `python -m ziglang` of the python on PATH.
export PATH="$TOOLS/bin:$PATH"

# -- Debian packages, as root through apt, when missing --------------------
debs=()
! wants aarch64 || debs+=(rustc-web cargo-web libstd-rust-web-dev:arm64)
! wants windows || debs+=(rustc-web cargo-web rust-web-src gcc-mingw-w64-x86-64)
! wants macos || debs+=(rustc-web cargo-web rust-web-src)
if [ ${#debs[@]} -gt 0 ] && ! dpkg -s "${debs[@]}" >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "build-wheels.sh: needs Debian's ${debs[*]} (root and apt-get to install them)" >&2
    exit 1
  fi
  echo "== apt-get install ${debs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  wants aarch64 && ! dpkg --print-foreign-architectures | grep -qx arm64 \
    && dpkg --add-architecture arm64
  apt-get update -q >/dev/null
  apt-get install -y -q "${debs[@]}" >/dev/null
fi
# Debian's cargo and rustc (1.96), for the targets rustup has no std for.
DEB_RUST=$TOOLS/debian-rust
mkdir -p "$DEB_RUST"
for b in cargo rustc rustdoc; do ln -sf "/usr/bin/$b" "$DEB_RUST/$b"; done
debian_rust() (
  export PATH="$DEB_RUST:$PATH" RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
  "$@"
)

mkdir -p "$OUT"
maturin_build() {
  nice -n 10 maturin build --release --strip --locked -m python/Cargo.toml --out "$OUT" "$@"
}

# audit ARCH: `auditwheel show` accepts the manylinux_2_17 tag the wheel carries.
audit() {
  local arch=$1 whl report
  whl=$(ls "$OUT"/weightmap-*-cp39-abi3-*manylinux_2_17_"$arch".whl)
  report=$(auditwheel show "$whl")
  echo "$report"
  if ! tr -s ' \n' ' ' <<<"$report" | grep -q "consistent with the following platform tag: \"manylinux_2_17_$arch\""; then
    echo "build-wheels.sh: auditwheel does not accept manylinux_2_17_$arch for $(basename "$whl")" >&2
    return 1
  fi
}

times=()
timed() {
  local name=$1 start=$SECONDS
  shift
  echo
  echo "== $name"
  "$@"
  times+=("$(printf '%5ss  %s' $((SECONDS - start)) "$name")")
}

x86_64() {
  rm -f "$OUT"/weightmap-*-cp39-abi3-*_x86_64.whl
  maturin_build --zig --compatibility manylinux2014 --target x86_64-unknown-linux-gnu
  audit x86_64
}
aarch64() {
  rm -f "$OUT"/weightmap-*-cp39-abi3-*_aarch64.whl
  debian_rust maturin_build --zig --compatibility manylinux2014 --target aarch64-unknown-linux-gnu
  audit aarch64
}
sdist() {
  rm -f "$OUT"/weightmap-*.tar.gz
  maturin sdist -m python/Cargo.toml --out "$OUT"
}
windows() (
  rm -f "$OUT"/weightmap-*-win_amd64.whl
  export RUSTC_BOOTSTRAP=1 CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
  debian_rust maturin_build --target x86_64-pc-windows-gnu -Zbuild-std --features pyo3/generate-import-lib
)
macos() (
  rm -f "$OUT"/weightmap-*-macosx_*.whl
  export RUSTC_BOOTSTRAP=1
  debian_rust maturin_build --zig --target aarch64-apple-darwin -Zbuild-std
)

for t in "${targets[@]}"; do
  timed "$t" "$t"
done

echo
echo "== built (seconds, step)"
printf '%s\n' "${times[@]}"
ls -l "$OUT"
