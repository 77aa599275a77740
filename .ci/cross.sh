#!/usr/bin/env bash
# CI for weightmap on other targets (called by .ci/run; runs on its own too):
#   aarch64-unknown-linux-gnu  every crate's tests (doctests too) under qemu-user
#   x86_64-pc-windows-gnu      every crate's tests (doctests too) under Wine
#   aarch64-linux-android, armv7-linux-androideabi, x86_64-linux-android,
#   aarch64-apple-darwin, aarch64-apple-ios
#                              cargo check only (no NDK or SDK to link with)
#
# rustup cannot fetch other targets' std here, so std is built from source
# (-Zbuild-std) by Debian's rustc-web/cargo-web 1.96 (/usr/bin/rustc and
# /usr/bin/cargo, beside rustup's in ~/.cargo/bin) from rust-web-src, whose
# std dependencies are vendored: no extra flags, no network for std. All of it
# goes to target/cross, apart from the host build in target/.
#
# Installs its Debian packages when missing (root, apt). Registers qemu-user
# with binfmt_misc for aarch64 ELF files when it can, so that programs the tests
# spawn (the command, the C test program) run too; sets up a Wine prefix in
# target/wine-prefix (.ci/wine/setup.sh). Every step runs and reports; the
# script fails at the end if any did.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# The steps' bookkeeping: step, finish, binfmt_aarch64.
# shellcheck source=.ci/lib.sh
source .ci/lib.sh

# -- 1. Debian packages ------------------------------------------------------
packages=(rustc-web cargo-web rust-web-src
  gcc-mingw-w64-x86-64 wine wine64
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static cmake)
install_packages() {
  if dpkg -s "${packages[@]}" >/dev/null 2>&1; then
    echo "all present: ${packages[*]}"
    return
  fi
  local sudo=
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  # With the recommended packages, as on the machine this was tried on.
  $sudo apt-get install -y -q "${packages[@]}"
}
step "Debian packages (build-std toolchain, mingw, wine, aarch64 gcc, qemu-user)" install_packages
if [ "$failed" -ne 0 ]; then
  finish
fi

# -- 2. build-std with Debian's toolchain ------------------------------------
cargo=/usr/bin/cargo
export RUSTC_BOOTSTRAP=1 RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export CARGO_TARGET_DIR=$root/target/cross
# Linkers and runners. The aarch64 runner needs the sysroot (-L); programs
# the tests spawn get it from QEMU_LD_PREFIX through binfmt_misc.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
# The guest's loader searches /lib/aarch64-linux-gnu before the sysroot's
# lib, and qemu finds that path on the host when the sysroot lacks it: where
# Debian's arm64 libc is installed too (multiarch, as .ci/wheels.sh does for
# its arm64 CPython), the sysroot's ld.so would load that other libc, and
# the first thread a program starts hangs. The sysroot's libraries first.
export QEMU_SET_ENV=LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=$root/.ci/wine/run.sh
export WINEPREFIX=$root/target/wine-prefix
# No X server: Wine runs with its null driver.
unset DISPLAY WAYLAND_DISPLAY
xbuild() { "$cargo" "$@" --locked -Zbuild-std; }

step "toolchain: $("$cargo" -V), $("$RUSTC" -V); Cargo.lock as committed" \
  "$cargo" metadata --locked --format-version 1 --no-deps -q

# -- 3. aarch64-unknown-linux-gnu, under qemu-user ---------------------------
step "aarch64: qemu-user for aarch64 ELF files in binfmt_misc (for the programs the tests spawn)" binfmt_aarch64

# The C ABI's test compiles its C program with $CC: the cross compiler, here
# through a wrapper that refuses -fsanitize, so that the test skips (and says
# so) its AddressSanitizer run: LeakSanitizer cannot work under qemu-user. The
# plain run of the C program stays. HOST_CC keeps any cc-crate build script
# on the host compiler.
mkdir -p "$CARGO_TARGET_DIR/bin"
cat >"$CARGO_TARGET_DIR/bin/aarch64-cc" <<'EOF'
#!/bin/sh
# Made by .ci/cross.sh: aarch64-linux-gnu-gcc without the sanitizers, whose
# LeakSanitizer cannot run under qemu-user.
for a in "$@"; do
  case $a in
    -fsanitize=*) echo "aarch64-cc: no $a under qemu-user" >&2; exit 1 ;;
  esac
done
exec aarch64-linux-gnu-gcc "$@"
EOF
chmod +x "$CARGO_TARGET_DIR/bin/aarch64-cc"

# Under qemu, code at opt-level 0 (std included: build-std builds it with
# the profile) runs some tests for ten minutes: opt-level 1, debug assertions
# and overflow checks kept (CARGO_PROFILE_DEV_*, target/cross only).
#
# Not run under qemu: the command's tests that run it under RLIMIT_AS
# (cli/tests/reliability.rs). qemu-user does not pass setrlimit(RLIMIT_AS) on
# to the kernel (it would limit qemu itself), so they fail there, and their
# million-tensor files take three quarters of an hour emulated.
a64=aarch64-unknown-linux-gnu
# The memory cgroup tests (budget_cgroup.rs) charge qemu's own translator
# memory to the group beside the load's, so the limits they set say
# nothing about the library there.
# The SIGBUS test (reliability.rs) truncates the file 50 ms after the
# child's mapping appears, counting on the load being over by then, as it
# is natively: emulated, the child may still be loading, before `load`
# installs its SIGBUS handler, and died of an uncaught SIGBUS once
# (ad2a659, which changed neither the command nor the load).
a64_skip=(--skip under_rlimit_as_is_an_error_not_an_abort
  --skip gen_writes_a_tensor_larger_than_its_address_space
  --skip a_full_page_cache_plans_as_a_cold_start
  --skip a_copy_larger_than_the_room_is_still_refused
  --skip load_hashes_on_a_file_truncated_under_its_mapping_is_one_error_line)
a64_test() {
  local pkg=$1
  shift
  env CC="$CARGO_TARGET_DIR/bin/aarch64-cc" HOST_CC=cc WM_REQUIRE_CC=1 CARGO_PROFILE_DEV_OPT_LEVEL=1 \
    "$cargo" test --locked -Zbuild-std --target $a64 -p "$pkg" --no-fail-fast "$@"
}
step "$a64: cargo test -p weightmap (qemu-user)" a64_test weightmap
# qemu-user ignores madvise, so owned buffers are never in huge pages there:
# the C ABI's test of the huge-page switch asserts that they are (the
# library's tests/huge_pages.rs skips the same assertions through its
# probe, which the C ABI's tests cannot reach).
a64_capi_skip=(--skip owned_huge_pages_turn_off_and_the_figure_says_so)
step "$a64: cargo test -p weightmap-capi (qemu-user; the C program without ASan; not: ${a64_capi_skip[*]})" \
  a64_test weightmap-capi -- "${a64_capi_skip[@]}"
step "$a64: cargo test -p weightmap-cli (qemu-user; not: ${a64_skip[*]})" a64_test weightmap-cli -- "${a64_skip[@]}"

# -- 4. x86_64-pc-windows-gnu, under Wine ------------------------------------
win=x86_64-pc-windows-gnu
step "$win: Wine prefix $WINEPREFIX with ProcessPrng (.ci/wine/setup.sh)" bash .ci/wine/setup.sh
# Wine's PATH is Windows' own: the C ABI's test finds no `cc` there and skips
# its C program (saying so), unless WM_REQUIRE_CC is set, hence env -u.
#
# Not run under Wine: capi/tests/header.rs (header_is_current). cbindgen
# runs `cargo metadata`, a Linux program that a Windows process cannot
# start; the header is the same whatever the target, and the host's suite
# checks it.
win_skip=(--skip header_is_current)
# Now and then, on a loaded machine, Wine fails to start a process that a
# test spawns: the process dies before its start-up is done, with no exit
# code, and Wine's CreateProcess then returns STATUS_INTERNAL_ERROR
# (ntdll/unix/process.c), which Rust sees as "Os { code: 1359 }"
# (ERROR_INTERNAL_ERROR) from Command::output. None of weightmap's code ran
# in that process. That failure, and no other, gets the package's tests run
# once more; the log keeps the first run.
#
# The first run's output goes to a file, not through a pipe to tee: the
# wineserver and the Wine services (winedevice.exe) that start while the
# tests run inherit their stdout and outlive them, so a reader of a pipe
# would wait for them forever.
win_test() {
  local pkg=$1 log=$CARGO_TARGET_DIR/wine-test-$1.log rc=0
  shift
  local cmd=(env -u WM_REQUIRE_CC "$cargo" test --locked -Zbuild-std --target $win -p "$pkg" --no-fail-fast "$@")
  "${cmd[@]}" >"$log" 2>&1 || rc=$?
  cat "$log"
  [ "$rc" -ne 0 ] || return 0
  grep -q 'code: 1359, kind: Uncategorized' "$log" || return "$rc"
  echo "-- Wine failed to start a process (ERROR_INTERNAL_ERROR, above): the tests of $pkg once more"
  "${cmd[@]}"
}
for pkg in weightmap weightmap-capi weightmap-cli; do
  skip=()
  [ "$pkg" != weightmap-capi ] || skip=(-- "${win_skip[@]}")
  step "$win: cargo test -p $pkg (Wine${skip:+; not: ${win_skip[*]}})" win_test $pkg "${skip[@]}"
done
# The C ABI's C test against the DLL: compiled on the host with mingw,
# linked with the import library, run under Wine by the host's test
# (capi/tests/c_abi.rs, WM_CAPI_CROSS_*). Under Wine itself the test cannot
# start a compiler, and says so.
win_c_test() {
  xbuild build --target $win -p weightmap-capi
  env -u RUSTC -u RUSTC_BOOTSTRAP -u RUSTDOC -u CARGO_TARGET_DIR WM_REQUIRE_CC=1 \
    WM_CAPI_CROSS_CC=x86_64-w64-mingw32-gcc \
    WM_CAPI_CROSS_LIB="$CARGO_TARGET_DIR/$win/debug/libweightmap_capi.dll.a" \
    WM_CAPI_CROSS_RUNNER="$root/.ci/wine/run.sh" \
    cargo test --locked -p weightmap-capi --test c_abi
}
step "$win: the C ABI's C test against weightmap_capi.dll (Wine)" win_c_test
wineserver -k 2>/dev/null || true

# -- the aarch64 C library's LOAD segments, aligned for 16 KiB pages at least
load_alignment() {
  # The library the aarch64 capi tests were built with: `cargo test` leaves
  # the cdylib in deps/ (a `cargo build` would put it in debug/, rebuilding
  # everything under the dev profile's own hash).
  local so=$CARGO_TARGET_DIR/$a64/debug/deps/libweightmap_capi.so
  local align n=0
  for align in $(aarch64-linux-gnu-readelf -lW "$so" | awk '/LOAD/ { print $NF }'); do
    echo "LOAD align $align"
    [ $((align)) -ge 16384 ] || return 1
    n=$((n + 1))
  done
  [ "$n" -gt 0 ]
}
step "$a64: libweightmap_capi.so LOAD segments aligned for 16 KiB pages (readelf -lW)" load_alignment

# -- 5. Android and Apple: cargo check ---------------------------------------
for t in aarch64-linux-android armv7-linux-androideabi x86_64-linux-android \
  aarch64-apple-darwin aarch64-apple-ios; do
  step "$t: cargo check -p weightmap -p weightmap-capi -p weightmap-cli" \
    "$cargo" check --locked -Zbuild-std --target "$t" --keep-going -p weightmap -p weightmap-capi -p weightmap-cli
done

finish cross
