#!/usr/bin/env bash
# Sets up, builds and runs fp4rl's main program. Until the end-to-end FP4 RL demo exists, that is
# the format table: each format's error, underflow and saturation on Gaussian and outlier data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/release -j"$(nproc)" --target fp4rl_format_table
./build/release/fp4rl_format_table "$@"
