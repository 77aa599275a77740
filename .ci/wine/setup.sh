#!/usr/bin/env bash
# A Wine prefix that runs Rust programs built for x86_64-pc-windows-gnu:
# target/wine-prefix (or $WINEPREFIX), made headless (no X server needed), with
# a bcryptprimitives.dll exporting ProcessPrng (processprng.c) in system32,
# which Wine 8 lacks and Rust's std imports. Idempotent: an existing prefix is
# kept and only the DLL refreshed. Leaves a persistent wineserver running for
# the prefix (stop it with `wineserver -k`). Needs wine (wine64) and
# gcc-mingw-w64-x86-64.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export WINEPREFIX=${WINEPREFIX:-$root/target/wine-prefix}
export WINEDEBUG=-all
unset DISPLAY WAYLAND_DISPLAY

dll=$root/target/wine-dll/bcryptprimitives.dll
mkdir -p "$(dirname "$dll")"
x86_64-w64-mingw32-gcc -O2 -s -Wall -Wextra -Werror -shared -static-libgcc \
  -o "$dll" "$here/processprng.c" "$here/bcryptprimitives.def" -ladvapi32

if [ ! -f "$WINEPREFIX/system.reg" ]; then
  # mscoree and mshtml off: no offer to install Wine Mono or Gecko.
  WINEDLLOVERRIDES="mscoree,mshtml=" wine wineboot -i
  wineserver -w
fi
cp "$dll" "$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll"
# One server for every program that follows, until `wineserver -k`: without
# it each program's server exits a moment after the program, and a program
# started in that moment loses its connection ("wine client error:0:
# recvmsg: Connection reset by peer") and fails.
wineserver -p
echo "wine prefix $WINEPREFIX ready ($(wine --version))"
