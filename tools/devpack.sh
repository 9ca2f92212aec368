#!/usr/bin/env bash
# Packs binaries built here, with the non-system shared libraries they load (libfp4rl, OpenBLAS,
# cJSON, subunit, ...), into .devrun/pkg.tar.xz for the GPU machine, which lacks those packages.
# Usage: bash tools/devpack.sh BINARY...   (on the GPU machine: tar xJf, LD_LIBRARY_PATH=pkg/lib)
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .devrun/pkg && mkdir -p .devrun/pkg/bin .devrun/pkg/lib
for b in "$@"; do
  cp "$b" .devrun/pkg/bin/
  ldd "$b" | awk '$3 ~ /^\// {print $3}' | grep -E 'fp4rl|openblas|gfortran|quadmath|cjson|subunit|check' |
    while read -r lib; do cp -L "$lib" .devrun/pkg/lib/; done
done
# debug info off: a RelWithDebInfo build would not fit the 64 MiB that travels to the GPU machine
strip --strip-debug .devrun/pkg/bin/* .devrun/pkg/lib/* 2>/dev/null || true
# xz -9 (a 64 MiB dictionary) stores the test binaries' shared device code once
XZ_OPT=-9 tar cJf .devrun/pkg.tar.xz -C .devrun pkg && rm -rf .devrun/pkg
ls -la .devrun/pkg.tar.xz
