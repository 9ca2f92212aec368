#!/usr/bin/env bash
# Packs binaries built here, with the non-system shared libraries they load (libfp4rl, OpenBLAS,
# cJSON, subunit, ...), into .devrun/pkg.tar.xz for the GPU machine, which lacks those packages.
# Usage: bash tools/devpack.sh BINARY...   (on the GPU machine: tar xJf, LD_LIBRARY_PATH=pkg/lib)
# DEVPACK_DIR=.devrun-x writes .devrun-x/pkg.tar.xz instead, so that two builds (an A/B) can travel
# side by side without one pack overwriting the other (ignore the folder in .git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
d=${DEVPACK_DIR:-.devrun}
rm -rf "$d/pkg" && mkdir -p "$d/pkg/bin" "$d/pkg/lib"
for b in "$@"; do
  cp "$b" "$d/pkg/bin/"
  ldd "$b" | awk '$3 ~ /^\// {print $3}' | grep -E 'fp4rl|openblas|gfortran|quadmath|cjson|subunit|check' |
    while read -r lib; do cp -L "$lib" "$d/pkg/lib/"; done
done
# debug info off: a RelWithDebInfo build would not fit the 64 MiB that travels to the GPU machine
strip --strip-debug "$d"/pkg/bin/* "$d"/pkg/lib/* 2>/dev/null || true
# xz -9 (a 64 MiB dictionary) stores the test binaries' shared device code once
XZ_OPT=-9 tar cJf "$d/pkg.tar.xz" -C "$d" pkg && rm -rf "$d/pkg"
ls -la "$d/pkg.tar.xz"
