#!/usr/bin/env bash
# Runs the Rust bindings' tests: fp4rl-sys (declarations vs the header, linking) and fp4rl (the
# safe API, the end-to-end RL run), the doctests (including the compile_fail lifetime
# examples), and a short run of the grpo example. Exits non-zero on any failure.
#
# Which libfp4rl the tests use:
#   FP4RL_PREFIX=DIR      an installed prefix (DIR/lib/pkgconfig/fp4rl.pc); nothing is built.
#   FP4RL_BUILD_DIR=DIR   an existing CMake build of the library: installed from there.
#   neither               the library is configured and built (CPU only; extra CMake flags in
#                         FP4RL_CMAKE_ARGS) in target/fp4rl-c, which later runs reuse.
# In the last two cases it is installed to the scratch prefix target/fp4rl-prefix, so that the
# tests see exactly what `cmake --install` ships (header, library, pkg-config file); files that
# are up to date are not copied again, so an unchanged library does not rebuild the crates.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# paths given relative to the caller's directory, made absolute before leaving it
prefix_arg="${FP4RL_PREFIX:+$(cd "$FP4RL_PREFIX" && pwd)}"
build_arg="${FP4RL_BUILD_DIR:+$(cd "$FP4RL_BUILD_DIR" && pwd)}"
cd "$here"

command -v cargo >/dev/null || { echo "run_tests.sh: cargo is not installed" >&2; exit 1; }
command -v pkg-config >/dev/null || { echo "run_tests.sh: pkg-config is not installed" >&2; exit 1; }

if [[ -n "$prefix_arg" ]]; then
    prefix="$prefix_arg"
else
    build="$build_arg"
    if [[ -z "$build" ]]; then
        build="$here/target/fp4rl-c"
        echo "== building libfp4rl in $build =="
        # shellcheck disable=SC2086 # FP4RL_CMAKE_ARGS is a list of flags
        cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFP4RL_WITH_CUDA=OFF ${FP4RL_CMAKE_ARGS:-} >/dev/null
        cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target fp4rl >/dev/null
    fi
    prefix="$here/target/fp4rl-prefix"
    cmake --install "$build" --prefix "$prefix" >/dev/null
fi
# lib/ or lib64/, as GNUInstallDirs chose
pc="$(find "$prefix" -path '*/pkgconfig/fp4rl.pc' -print -quit)"
[[ -n "$pc" ]] || { echo "run_tests.sh: no pkgconfig/fp4rl.pc under $prefix" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
libdir="$(pkg-config --variable=libdir fp4rl)"
echo "== libfp4rl $(pkg-config --modversion fp4rl) from $prefix =="
# The test binaries carry an rpath to the library; doctests are linked by rustdoc without it.
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Tests run in parallel threads; a BLAS thread pool per call would only oversubscribe the cores.
export OPENBLAS_NUM_THREADS=1

echo "== cargo test =="
start=$SECONDS
cargo test --offline --workspace
echo "== cargo test: $((SECONDS - start)) s =="

echo "== example: grpo (a short run) =="
out="$(mktemp -d "${TMPDIR:-/tmp}/fp4rl-rust-grpo.XXXXXX")"
trap 'rm -rf "$out"' EXIT
cargo run --offline --quiet --example grpo -- --out "$out" --sft-steps 10 --rl-steps 2
[[ "$(wc -l <"$out/metrics.jsonl")" -eq 2 ]] || { echo "run_tests.sh: grpo wrote no metrics for its 2 steps" >&2; exit 1; }
cargo run --offline --quiet --example grpo -- --out "$out" --resume --rl-steps 1 >/dev/null
[[ "$(wc -l <"$out/metrics.jsonl")" -eq 3 ]] || { echo "run_tests.sh: grpo --resume did not continue" >&2; exit 1; }
echo "== Rust bindings: all tests passed =="
