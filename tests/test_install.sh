#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, then builds a user's program two ways, as a
# user would: with nothing but `pkg-config --cflags --libs fp4rl`, and with find_package(fp4rl).
set -euo pipefail
build_dir=$1 src_dir=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build_dir" --prefix "$tmp/prefix" >/dev/null
libdir=$(ls -d "$tmp"/prefix/lib*/pkgconfig | head -1 | xargs dirname)
test -f "$tmp/prefix/include/fp4rl/fp4rl.h"
ls "$libdir"/libfp4rl.so.0 >/dev/null  # versioned SONAME
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
cc -std=c99 -Wall -Werror "$src_dir/tests/consumer/main.c" -o "$tmp/consumer_pc" $(pkg-config --cflags --libs fp4rl)
LD_LIBRARY_PATH="$libdir" "$tmp/consumer_pc"
cmake -S "$src_dir/tests/consumer" -B "$tmp/cmake_build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cmake_build" >/dev/null
LD_LIBRARY_PATH="$libdir" "$tmp/cmake_build/consumer"
echo "install test: pkg-config and find_package consumers built and ran"
