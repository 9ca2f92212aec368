#!/usr/bin/env bash
# The library's defaults on the GPU machine (no switch set), in one call (~2-3 minutes): the GPU
# tests of the rollout and decode kernels, then the 3B BF16 and HiF4 + ResQ 2:4 rollouts (16 x 8 of
# 128 + 256), then, where .devrun holds libkprof.so and libcupti.so.13, the kernel-time profile of
# the 3B HiF4 rollout (bench/device_profile.sh). Package made here and carried as .devrun:
#   bash tools/devpack.sh build/cuda90/tests/{test_decode_fp8,test_ops_parity,test_rollout_graphs,test_rollout_fast,test_rl_parity,test_fp8_gemm} \
#     build/cuda90/bench/fp4rl_scale_bench
#   nvcc -O2 -shared -Xcompiler -fPIC tools/kprof.cpp -o .devrun/libkprof.so -L<cuda>/lib -lcupti; cp <cuda>/lib/libcupti.so.13 .devrun/
# Usage: bash bench/device_defaults.sh [profile=1]   (logs in $OUT/logs.tgz, profiles in $OUT/kprof_*.txt)
set -uo pipefail
profile=1
for a in "$@"; do
  case $a in
  profile=*) profile=${a#profile=} ;;
  *) echo "unknown argument: $a (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-/tmp/out}
P=/tmp/defaults; mkdir -p "$OUT" $P/logs && tar xJf .devrun/pkg.tar.xz -C $P || exit 1
b=$P/pkg/bin
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$P/pkg/lib:$lt OPENBLAS_NUM_THREADS=1 FP4RL_FIXTURES=$PWD/tests/fixtures
nvidia-smi --query-gpu=name --format=csv,noheader
for t in test_decode_fp8:90 test_ops_parity:60 test_rollout_graphs:90 test_rollout_fast:90 test_rl_parity:60 test_fp8_gemm:90; do
  n=${t%%:*}
  [ -x $b/$n ] || { echo "$n: not packed"; continue; }
  (cd /tmp && timeout ${t#*:} $b/$n) > $P/logs/$n.log 2>&1
  echo "$n rc=$? $(grep -E '^[0-9]+%: Checks' $P/logs/$n.log | tail -1)"; grep -E ":F:|:E:" $P/logs/$n.log | cut -c1-300 | head -5
done
for num in bf16 hif4; do
  timeout 90 $b/fp4rl_scale_bench bench/configs/qwen2.5-3b.json --numerics $num --rollout-only --prompts 16 --group 8 \
    --prompt-len 128 --new-tokens 256 --steps 2 > $P/logs/r_$num.json 2>&1
  python3 -c "import json; r=json.load(open('$P/logs/r_$num.json')); print('3b $num defaults: %.0f tok/s, %.2f ms a position' % (r['rollout_tok_s'], 1e3 * r['rollout_s'] / 256))" 2>&1 | tail -1
done
tar czf "$OUT/logs.tgz" -C $P logs
if [ "$profile" = 1 ] && [ -f .devrun/libkprof.so ]; then
  FP4RL_PKG=$P bash bench/device_profile.sh sizes=3b numerics=bf16,hif4 batch=16,8,128,256 steps=1 part=rollout top=25 2>&1 | grep -vE '^\{' | cut -c1-160
fi
