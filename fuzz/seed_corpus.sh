#!/bin/sh
# Seed both fuzz targets' corpora from the reference fixtures in testdata/.
# Run from anywhere; fuzz/corpus is gitignored.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
for target in parse_bytes load_file; do
    mkdir -p "$here/corpus/$target"
    for f in "$here"/../testdata/*.gguf "$here"/../testdata/*.safetensors; do
        cp "$f" "$here/corpus/$target/seed-$(basename "$f")"
    done
done
echo "seeded $(ls "$here/corpus/parse_bytes" | wc -l) files per target"
