#!/usr/bin/env bash
# Sets up, builds and runs fp4rl's main job: the end-to-end FP4 RL demo (examples/rl_demo.c).
# A tiny Qwen2-shaped model learns multi-digit addition: supervised warm-up, then GRPO with the
# HiFloat4 recipe (HiF4 W4A4 rollout + Rollout-ResQ 2:4, FP4 training, TIS). On the CPU by
# default (a few minutes on 2 cores); pass --gpu to use a GPU when the build has CUDA.
# Output: progress lines, a before/after table, rl_demo_out/metrics.jsonl, rl_demo_out/reward_curve.svg.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# Build only what the demo needs: the CPU demo compiles no CUDA (minutes saved where a toolkit
# is installed); --gpu compiles the CUDA backend for this machine's GPU only.
args=(--cpu) build=build/demo-cpu cfg=(-DFP4RL_WITH_CUDA=OFF)
if [ "${1:-}" = "--gpu" ]; then
  args=() build=build/demo-gpu cfg=(-DFP4RL_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native)
  shift
fi
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFP4RL_BUILD_TESTS=OFF "${cfg[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)" --target fp4rl_rl_demo
# The model is tiny: one BLAS thread per GEMM beats OpenBLAS's thread pool spinning on small products.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
"./$build/fp4rl_rl_demo" "${args[@]}" "$@"
