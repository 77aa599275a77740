#!/usr/bin/env bash
# The library a runtime links must not compile the command's dependencies
# (they belong to the weightmap-cli crate). Fails if any of them is in its normal dependency
# tree. serde_json is allowed: the safetensors crate parses its header with
# it; its `preserve_order` feature (indexmap) is the command's and is not.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(cargo tree -p weightmap --no-default-features -e normal --prefix none --locked)
bad=0
for crate in clap clap_builder sha2 indexmap; do
  if grep -q "^$crate v" <<<"$tree"; then
    echo "check-deps: $crate is in the library's dependency tree:"
    cargo tree -p weightmap --no-default-features -e normal -i "$crate" --locked || true
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "check-deps: the library's tree has none of clap, sha2, indexmap"
exit "$bad"
