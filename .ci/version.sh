#!/usr/bin/env bash
# weightmap has one version, the root Cargo.toml's [workspace.package]
# version. This checks that everything that carries it agrees:
#   - the crates weightmap, weightmap-cli and weightmap-capi (they inherit
#     it; cargo metadata says what cargo makes of them);
#   - the C package: capi/CMakeLists.txt reads the first `version = "..."`
#     line of the root Cargo.toml (library file name, SONAME, CMake and
#     pkg-config versions);
#   - the Python package: python/Cargo.toml repeats it (a workspace of its
#     own cannot inherit it) and python/pyproject.toml takes it from there
#     (`dynamic = ["version"]`, no version of its own);
#   - CHANGELOG.md has a section for it;
#   - both Cargo.lock files (cargo metadata --locked).
# Called by .ci/run and by python/build-wheels.sh. Needs cargo and python3 >= 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."

root_meta=$(cargo metadata --locked --no-deps --format-version 1)
py_meta=$(cargo metadata --locked --no-deps --format-version 1 --manifest-path python/Cargo.toml)
cmake_line=$(sed -n 's/^version = "\([0-9]*\.[0-9]*\.[0-9]*\)"$/\1/p' Cargo.toml | head -1)

python3 - "$root_meta" "$py_meta" "$cmake_line" <<'EOF'
import json, re, sys, tomllib

root_meta, py_meta, cmake_line = sys.argv[1:]
with open("Cargo.toml", "rb") as f:
    version = tomllib.load(f)["workspace"]["package"]["version"]
print(f"version {version} (Cargo.toml, [workspace.package])")
problems = []

def expect(what, got):
    ok = got == version
    print(f"  {'ok ' if ok else 'BAD'} {what}: {got}")
    if not ok:
        problems.append(f"{what} is {got!r}, not {version!r}")

crates = {p["name"]: p["version"] for p in json.loads(root_meta)["packages"]}
for name in ("weightmap", "weightmap-cli", "weightmap-capi"):
    expect(f"crate {name}", crates.get(name))
expect("the C package (capi/CMakeLists.txt's read of Cargo.toml)", cmake_line)
py = {p["name"]: p["version"] for p in json.loads(py_meta)["packages"]}
expect("python/Cargo.toml (weightmap-python, the Python package's version)", py.get("weightmap-python"))

with open("python/pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
if "version" in project or "version" not in project.get("dynamic", []):
    problems.append("python/pyproject.toml must not carry a version: dynamic = [\"version\"] (maturin reads python/Cargo.toml)")
else:
    print("  ok  python/pyproject.toml: dynamic version, from python/Cargo.toml")

with open("CHANGELOG.md", encoding="utf-8") as f:
    headings = re.findall(r"^## \[?([^\]\s]+)\]?", f.read(), re.M)
released = [h for h in headings if h.lower() != "unreleased"]
if not released or released[0] != version:
    problems.append(f"CHANGELOG.md's latest version section is {released[:1]}, not [{version}]")
else:
    print(f"  ok  CHANGELOG.md: ## [{version}]")

if problems:
    print("\n".join(["version mismatch:"] + problems), file=sys.stderr)
    sys.exit(1)
EOF
