#!/usr/bin/env bash
# CI step: weightmap's C library taken as C and C++ runtimes take their
# dependencies (capi/CMakeLists.txt). One cargo build, then the consumer
# project capi/tests/cmake (a C and a C++17 program, each linked shared and
# static) built three ways:
#   1. find_package(weightmap CONFIG) after `cmake --install --prefix P`
#   2. add_subdirectory(capi), sharing the first build's cargo target directory,
#      and FetchContent of this repository by its git URL
#   3. pkg-config on P's weightmap.pc: shared, and --static
# Every program runs on a model `weightmap gen` makes and must print what this
# script computes from the file; a static program must need no weightmap
# shared library (ldd). The install's files, the SONAME and the exported
# symbols (wm_* only: the header's functions) are checked too. Then the same
# project is built for x86_64-pc-windows-gnu with mingw, and its package used
# by the same programs under wine (WM_CMAKE_MINGW=0 skips this, saying so).
#
# Installs what it needs with apt-get when missing (as root): cmake,
# pkg-config, a C/C++ compiler; for mingw, Debian's build-std toolchain, the
# mingw C and C++ compilers and wine. Work goes to target/cmake-ci. Prints
# the seconds each step takes. Run after .ci/cross.sh and the ggml proof,
# whose cargo work it reuses; on its own it builds what they would have.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$root/target/cmake-ci
prefix=$work/prefix
model=$work/model.gguf
# cargo's target directory for the host builds: the repository's own, so that
# what `cargo build --release` built before (.ci/run's ggml proof) is reused
# and only the C library's crate is compiled again (its link takes the
# SONAME). A consumer's build has a target directory of its own, in its
# build tree: the first build of one takes the minutes cargo takes.
cargo_target=$root/target

# step NAME COMMAND...: run it, and say how long it took.
step() {
  local name=$1 start=$SECONDS
  shift
  echo
  echo "== cmake: $name"
  "$@"
  echo "-- cmake: $name: ok, $((SECONDS - start))s"
}
fail() {
  echo "cmake: $*" >&2
  exit 1
}

tools() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  { command -v cc && command -v c++ && command -v readelf && command -v nm; } >/dev/null \
    || missing+=(build-essential)
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
      || fail "missing ${missing[*]}, and cannot apt-get install them"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  cmake --version | head -1
  pkg-config --version
}

# capi inherits the workspace's version (the root Cargo.toml's one version line).
version=$(sed -n 's/^version = "\([0-9.]*\)"$/\1/p' Cargo.toml | head -1)
minor=$(echo "$version" | cut -d. -f2)
[ "$(echo "$version" | cut -d. -f1)" = 0 ] && [ "$minor" -gt 0 ] \
  || fail "the checks below name 0.MINOR SONAMEs; capi is at $version"
soname=libweightmap.so.0.$minor

# The line every consumer program must print, from the file itself: the
# tensors' offsets and sizes as the command reports them, the bytes read
# here (FNV-1a over them in file order).
model() {
  rm -f "$model"
  mkdir -p "$work"
  cargo run --locked -q -- gen "$model" --size 16M --tensors 57 --vocab 2000
  cargo run --locked -q -- inspect "$model" --json >"$work/model.json"
  python3 - "$model" "$work/model.json" "$version" >"$work/expected.txt" <<'EOF'
import json, sys
model, manifest, version = sys.argv[1:]
d = json.load(open(manifest))
data = open(model, "rb").read()
h, total = 0xCBF29CE484222325, 0
for t in d["tensors"]:
    for b in data[t["offset"]:t["offset"] + t["nbytes"]]:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    total += t["nbytes"]
layers = d["metadata"]["llama.block_count"]
print(f"tensors {len(d['tensors'])} bytes {total} fnv1a {h:016x} layers {layers} mode 0 version {version}")
EOF
  cat "$work/expected.txt"
}

# run_all DIR PROGRAM...: each prints the expected line.
run_all() {
  local dir=$1 p out
  shift
  for p in "$@"; do
    out=$("$dir/$p" "$model") || fail "$dir/$p failed"
    [ "$out" = "$(cat "$work/expected.txt")" ] || fail "$dir/$p printed: $out"
    echo "$p: $out"
  done
}

# linked_shared EXE LIBDIR: EXE needs weightmap's SONAME and finds it in LIBDIR.
linked_shared() {
  readelf -d "$1" | grep "NEEDED.*\[$soname\]" >/dev/null || fail "$1 does not need $soname"
  local loaded
  loaded=$(ldd "$1" | awk -v s="$soname" '$1 == s { print $3 }')
  [ -n "$loaded" ] && [ "$(realpath "$loaded")" = "$(realpath "$2/$soname")" ] \
    || { ldd "$1"; fail "$1 does not load $2/$soname"; }
  echo "$1: loads $loaded"
}
# linked_static EXE: no weightmap shared library anywhere in EXE's needs.
linked_static() {
  if ldd "$1" | grep -i weightmap; then
    fail "$1 is linked statically and still needs a weightmap shared library"
  fi
  echo "$1: $(ldd "$1" | awk '{print $1}' | tr '\n' ' ')"
}

install_build() {
  rm -rf "$work/build" "$prefix"
  local start=$SECONDS
  cmake -S capi -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DWEIGHTMAP_CARGO_TARGET_DIR="$cargo_target" >"$work/build.log"
  cmake --build "$work/build" -j"$(nproc)" >>"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
  echo "configure and build (cargo, release, in $cargo_target): $((SECONDS - start))s"
  cmake --install "$work/build" --prefix "$prefix" >>"$work/build.log"
  (cd "$prefix" && find . \( -type f -o -type l \) -printf '%p %y %s %l\n' | sort)
}

check_install() {
  # The files, as capi/CMakeLists.txt's header comment lists them.
  local want got
  want=$(printf '%s\n' ./include/weightmap.h ./include/weightmap-ggml.h \
    ./lib/libweightmap.a ./lib/libweightmap.so "./lib/$soname" "./lib/libweightmap.so.$version" \
    ./lib/cmake/weightmap/weightmapConfig.cmake ./lib/cmake/weightmap/weightmapConfigVersion.cmake \
    ./lib/pkgconfig/weightmap.pc | sort)
  got=$(cd "$prefix" && find . \( -type f -o -type l \) | sort)
  [ "$got" = "$want" ] || fail "installed files differ from the list:"$'\n'"$got"
  # Both links to the file, as cargo-c makes them.
  local link
  for link in libweightmap.so "$soname"; do
    [ "$(readlink "$prefix/lib/$link")" = "libweightmap.so.$version" ] \
      || fail "$link -> $(readlink "$prefix/lib/$link"), not libweightmap.so.$version"
  done
  local lib=$prefix/lib/libweightmap.so.$version
  readelf -d "$lib" | grep "SONAME.*\[$soname\]" >/dev/null || fail "$lib's SONAME is not $soname"
  echo "SONAME $soname"
  # The exports: exactly the functions weightmap.h declares.
  nm -D --defined-only "$lib" | awk '{print $3}' | sort >"$work/exports.txt"
  sed -n 's/^[a-z].*[ *]\(wm_[a-z0-9_]*\)(.*/\1/p' capi/include/weightmap.h | sort >"$work/declared.txt"
  [ -s "$work/declared.txt" ] || fail "no function found in weightmap.h"
  diff "$work/declared.txt" "$work/exports.txt" || fail "$lib exports other symbols than weightmap.h's functions"
  echo "exports: $(wc -l <"$work/exports.txt") symbols, each a wm_* function of weightmap.h"
  ls -l "$prefix/lib/libweightmap.a" "$lib"
}

# consumer NAME LIBDIR LABEL CMAKE-ARGS...: configure and build the consumer
# project in $work/NAME with CMAKE-ARGS, say how long that took, run its four
# programs, and check that the shared ones load libweightmap from LIBDIR and
# the static ones load no weightmap library.
consumer() {
  local dir=$work/$1 libdir=$2 label=$3 start=$SECONDS
  shift 3
  rm -rf "$dir"
  cmake -S capi/tests/cmake -B "$dir" "$@" >"$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  cmake --build "$dir" -j"$(nproc)" >>"$dir.log" 2>&1 || { tail -40 "$dir.log"; exit 1; }
  echo "consumer's first configure and build ($label): $((SECONDS - start))s"
  run_all "$dir" consumer_c consumer_cxx consumer_c_static consumer_cxx_static
  [ "${libdir:0:1}" = / ] || libdir=$dir/$libdir
  linked_shared "$dir/consumer_c" "$libdir"
  linked_shared "$dir/consumer_cxx" "$libdir"
  linked_static "$dir/consumer_c_static"
  linked_static "$dir/consumer_cxx_static"
}

by_find_package() {
  consumer package "$prefix/lib" "the installed package" -DCMAKE_PREFIX_PATH="$prefix"
}

# The install build's cargo target directory: cargo finds nothing to do.
by_add_subdirectory() {
  consumer subdirectory weightmap/lib "cargo's work shared" \
    -DWEIGHTMAP_FROM=subdirectory -DWEIGHTMAP_CARGO_TARGET_DIR="$cargo_target"
}

# FetchContent from a git URL (this repository, at the commit checked out):
# a copy of the sources at another path, so cargo compiles weightmap and the
# C library's crate again; their dependencies it shares.
by_fetchcontent() {
  consumer fetchcontent _deps/weightmap-build/lib "git clone; dependencies shared" \
    -DWEIGHTMAP_FROM=fetchcontent -DWEIGHTMAP_GIT_REPOSITORY="file://$root" \
    -DWEIGHTMAP_GIT_TAG="$(git rev-parse HEAD)" -DWEIGHTMAP_CARGO_TARGET_DIR="$cargo_target"
}

by_pkg_config() {
  local d=$work/pkg-config start=$SECONDS
  rm -rf "$d"
  mkdir -p "$d"
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
  [ "$(pkg-config --modversion weightmap)" = "$version" ] || fail "weightmap.pc's version is not $version"
  local cflags libs libdir static_libs
  cflags=$(pkg-config --cflags weightmap)
  libs=$(pkg-config --libs weightmap)
  libdir=$(pkg-config --variable=libdir weightmap)
  # Shared: the prefix is not a system directory, so the programs carry it.
  cc -std=c11 -Wall -Werror capi/tests/cmake/consumer.c $cflags $libs -Wl,-rpath,"$libdir" -o "$d/consumer_c"
  c++ -std=c++17 -Wall -Werror capi/tests/cmake/consumer.cpp $cflags $libs -Wl,-rpath,"$libdir" -o "$d/consumer_cxx"
  # Static: --static adds Libs.private; with the shared library beside the
  # static one, the linker is told to take the archive.
  static_libs=$(pkg-config --static --libs weightmap | sed 's/\(^\| \)-lweightmap\( \|$\)/\1-l:libweightmap.a\2/')
  echo "pkg-config --static --libs, as linked: $static_libs"
  cc -std=c11 -Wall -Werror capi/tests/cmake/consumer.c $cflags $static_libs -o "$d/consumer_c_static"
  c++ -std=c++17 -Wall -Werror capi/tests/cmake/consumer.cpp $cflags $static_libs -o "$d/consumer_cxx_static"
  echo "four programs compiled and linked: $((SECONDS - start))s"
  run_all "$d" consumer_c consumer_cxx consumer_c_static consumer_cxx_static
  linked_shared "$d/consumer_c" "$libdir"
  linked_static "$d/consumer_c_static"
  linked_static "$d/consumer_cxx_static"
}

# The system libraries the package names (capi/CMakeLists.txt asks rustc at
# configure time, for an empty crate) must be those rustc names for the
# crate's own static library: a dependency that links one more would break
# static consumers only where the C library does not happen to provide it.
# The crate is compiled once more for this (only it: the rest is cargo's).
native_libs() {
  local pc crate
  pc=$(sed -n 's/^Libs.private: //p' "$prefix/lib/pkgconfig/weightmap.pc" | tr ' ' '\n' | sed '/^$/d' | sort -u)
  crate=$(RUSTC=$(sed -n 's/^WEIGHTMAP_RUSTC:FILEPATH=//p' "$work/build/CMakeCache.txt") \
    cargo rustc --manifest-path capi/Cargo.toml --lib --crate-type staticlib --release --locked \
    --target-dir "$cargo_target" -- --print native-static-libs 2>&1 \
    | sed -n 's/.*native-static-libs: //p' | tr ' ' '\n' | sed '/^$/d' | sort -u)
  [ -n "$crate" ] || fail "rustc printed no native-static-libs for the crate"
  [ "$pc" = "$crate" ] || fail "weightmap.pc's Libs.private ($(echo $pc)) is not what rustc names for the crate ($(echo $crate))"
  echo "Libs.private and the crate's own: $(echo $crate)"
}

# cargo-c, where it is installed (building it takes longer than this whole
# script, so CI does not): `cargo cinstall` must install the same files under
# the same names, less the CMake package, with the same SONAME and the same
# Libs, Libs.private and Cflags in weightmap.pc.
cargo_c() {
  local d=$work/cargo-c
  rm -rf "$d/dest"
  cargo cinstall --locked --release -p weightmap-capi --prefix /p --libdir lib \
    --destdir "$d/dest" --target-dir "$d/target" >"$work/cargo-c.log" 2>&1 \
    || { tail -40 "$work/cargo-c.log"; exit 1; }
  local want got
  want=$(cd "$prefix" && find . \( -type f -o -type l \) -printf '%p %y %l\n' | grep -v '^./lib/cmake/' | sort)
  got=$(cd "$d/dest/p" && find . \( -type f -o -type l \) -printf '%p %y %l\n' | sort)
  [ "$got" = "$want" ] || fail "cargo cinstall installed:"$'\n'"$got"$'\n'"capi/CMakeLists.txt:"$'\n'"$want"
  echo "$got"
  readelf -d "$d/dest/p/lib/libweightmap.so.$version" | grep "SONAME.*\[$soname\]" >/dev/null \
    || fail "cargo-c's SONAME is not $soname"
  local field
  for field in Libs Libs.private Cflags; do
    [ "$(sed -n "s/^$field: //p" "$d/dest/p/lib/pkgconfig/weightmap.pc")" \
      = "$(sed -n "s/^$field: //p" "$prefix/lib/pkgconfig/weightmap.pc")" ] \
      || fail "weightmap.pc's $field differs between cargo-c and capi/CMakeLists.txt"
  done
  echo "same SONAME ($soname); same Libs, Libs.private and Cflags in weightmap.pc"
}

# With mingw: the same project for x86_64-pc-windows-gnu, its package
# consumed by the same programs, run under wine. Debian's rustc and cargo
# build std for the target (-Zbuild-std, as .ci/cross.sh does), in the dev
# profile and in .ci/cross.sh's target directory, so that cargo reuses what
# that script built (std, the dependencies); standalone it builds them.
mingw_packages=(rustc-web cargo-web rust-web-src gcc-mingw-w64-x86-64 g++-mingw-w64-x86-64 wine wine64)
mingw() {
  local win=x86_64-pc-windows-gnu b=$work/mingw p=$work/mingw-prefix c=$work/mingw-package
  if ! dpkg -s "${mingw_packages[@]}" >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || fail "missing some of ${mingw_packages[*]}, and cannot apt-get install them"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${mingw_packages[@]}" >/dev/null
  fi
  rm -rf "$b" "$p" "$c"
  # The linker as .ci/cross.sh names it: cargo's fingerprints include it.
  export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
  local start=$SECONDS
  RUSTC_BOOTSTRAP=1 cmake -S capi -B "$b" -DCMAKE_SYSTEM_NAME=Windows \
    -DCMAKE_C_COMPILER=x86_64-w64-mingw32-gcc -DWEIGHTMAP_CARGO=/usr/bin/cargo \
    -DWEIGHTMAP_RUSTC=/usr/bin/rustc -DWEIGHTMAP_CARGO_ARGS=-Zbuild-std \
    -DWEIGHTMAP_CARGO_PROFILE=dev -DWEIGHTMAP_CARGO_TARGET_DIR="$root/target/cross" >"$work/mingw.log"
  RUSTC_BOOTSTRAP=1 cmake --build "$b" >>"$work/mingw.log" 2>&1 || { tail -40 "$work/mingw.log"; exit 1; }
  echo "configure and build ($win, dev profile): $((SECONDS - start))s"
  cmake --install "$b" --prefix "$p" >>"$work/mingw.log"
  local want got
  want=$(printf '%s\n' ./bin/weightmap.dll ./include/weightmap.h ./include/weightmap-ggml.h \
    ./lib/libweightmap.a ./lib/libweightmap.dll.a \
    ./lib/cmake/weightmap/weightmapConfig.cmake ./lib/cmake/weightmap/weightmapConfigVersion.cmake \
    ./lib/pkgconfig/weightmap.pc | sort)
  got=$(cd "$p" && find . \( -type f -o -type l \) | sort)
  [ "$got" = "$want" ] || fail "installed files ($win) differ from the list:"$'\n'"$got"
  echo "$got"
  # The DLL exports the header's functions and nothing else.
  x86_64-w64-mingw32-objdump -p "$p/bin/weightmap.dll" \
    | sed -n '/\[Ordinal\/Name Pointer\] Table/,/^$/p' | awk '/\]/ { print $NF }' | sed 1d | sort >"$work/exports-dll.txt"
  diff "$work/declared.txt" "$work/exports-dll.txt" || fail "weightmap.dll exports other symbols than weightmap.h's functions"
  echo "weightmap.dll exports $(wc -l <"$work/exports-dll.txt") symbols, each a wm_* function of weightmap.h"

  start=$SECONDS
  cmake -S capi/tests/cmake -B "$c" -DCMAKE_SYSTEM_NAME=Windows \
    -DCMAKE_C_COMPILER=x86_64-w64-mingw32-gcc -DCMAKE_CXX_COMPILER=x86_64-w64-mingw32-g++ \
    -DCMAKE_PREFIX_PATH="$p" "-DCMAKE_EXE_LINKER_FLAGS=-static-libgcc -static-libstdc++" >"$work/mingw-package.log"
  cmake --build "$c" -j"$(nproc)" >>"$work/mingw-package.log" 2>&1 || { cat "$work/mingw-package.log"; exit 1; }
  echo "consumer's first configure and build ($win): $((SECONDS - start))s"
  # The import library names the DLL as installed; the static programs import none.
  local e
  local e imports
  for e in consumer_c consumer_cxx consumer_c_static consumer_cxx_static; do
    imports=$(x86_64-w64-mingw32-objdump -p "$c/$e.exe" | sed -n 's/.*DLL Name: //p')
    case $e in
      *_static) if echo "$imports" | grep -i weightmap; then
          fail "$e.exe is linked statically and still imports a weightmap DLL"
        fi ;;
      *) echo "$imports" | grep -x 'weightmap.dll' >/dev/null || fail "$e.exe does not import weightmap.dll" ;;
    esac
  done
  echo "consumer_c.exe, consumer_cxx.exe import weightmap.dll; the static ones no weightmap DLL"
  # Windows looks for a DLL beside the program first.
  cp "$p/bin/weightmap.dll" "$c/"
  export WINEPREFIX=${WINEPREFIX:-$root/target/wine-prefix}
  unset DISPLAY WAYLAND_DISPLAY
  bash .ci/wine/setup.sh
  local out
  for e in consumer_c consumer_cxx consumer_c_static consumer_cxx_static; do
    # Windows' C library writes text as CRLF.
    out=$(.ci/wine/run.sh "$c/$e.exe" "$model" | tr -d '\r') || fail "$e.exe failed under wine"
    [ "$out" = "$(cat "$work/expected.txt")" ] || fail "$e.exe printed: $out"
    echo "$e.exe (wine): $out"
  done
  wineserver -k 2>/dev/null || true
}

total=$SECONDS
step "tools" tools
step "a model (weightmap gen), and the line each program must print" model
step "cmake -S capi, build, install --prefix $prefix" install_build
step "the install: its files, SONAME, exports" check_install
step "1. find_package(weightmap CONFIG)" by_find_package
step "2. add_subdirectory(capi)" by_add_subdirectory
step "2b. FetchContent (git URL, SOURCE_SUBDIR capi)" by_fetchcontent
step "3. pkg-config weightmap, shared and --static" by_pkg_config
step "the static library's system libraries, as rustc names them for the crate" native_libs
if cargo cinstall --version >/dev/null 2>&1; then
  step "cargo cinstall: the same install, less the CMake package" cargo_c
else
  echo "SKIPPED: the comparison with cargo cinstall (cargo-c is not installed)"
fi
if [ "${WM_CMAKE_MINGW:-1}" = 1 ]; then
  step "x86_64-pc-windows-gnu: the DLL's package, its programs under wine" mingw
else
  echo "SKIPPED: the mingw build (WM_CMAKE_MINGW=0)"
fi
echo
echo "cmake: every way passed, $((SECONDS - total))s"
