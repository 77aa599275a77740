#!/usr/bin/env bash
# The library a runtime links (default features off) must not compile the
# command's dependencies. Fails if any of them is in its normal dependency
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
# And the generator is not compiled without its feature.
if grep -rq 'pub mod gen;' src/lib.rs && ! grep -B1 'pub mod gen;' src/lib.rs | grep -q 'cfg(feature = "gen")'; then
  echo "check-deps: src/lib.rs compiles the generator without the gen feature"
  bad=1
fi
[ "$bad" = 0 ] && echo "check-deps: the library's tree has none of clap, sha2, indexmap"
exit "$bad"
