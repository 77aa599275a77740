#!/bin/sh
# cargo's runner for x86_64-pc-windows-gnu (CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER):
# runs a Windows program under Wine, in the prefix .ci/wine/setup.sh made
# (target/wine-prefix unless WINEPREFIX says otherwise), quietly, with the
# program's own exit status.
here=$(cd "$(dirname "$0")" && pwd)
WINEPREFIX=${WINEPREFIX:-$(cd "$here/../.." && pwd)/target/wine-prefix}
WINEDEBUG=-all
export WINEPREFIX WINEDEBUG
exec wine "$@"
