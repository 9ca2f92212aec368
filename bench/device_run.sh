#!/usr/bin/env bash
# What one call on the GPU machine runs (binaries built here, carried as .devrun/pkg.tar.xz):
# the parity suite, the parity suite's quick subset under compute-sanitizer memcheck, and the
# benchmark. Logs land in $OUT. Usage: bash bench/device_run.sh [parity] [memcheck] [bench]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/fp4rl && tar xJf .devrun/pkg.tar.xz -C /tmp/fp4rl
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/tmp/fp4rl/pkg/lib:$lt:${LD_LIBRARY_PATH:-}
bin=/tmp/fp4rl/pkg/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(parity bench memcheck)
for step in "${steps[@]}"; do
  case $step in
  parity) (cd /tmp && time timeout 200 $bin/test_parity) 2>&1 | tee "$OUT/parity.log" | tail -15 ;;
  bench) timeout 150 $bin/fp4rl_bench 2>&1 | tee "$OUT/bench.md" ;;
  profile) timeout 200 ncu --clock-control none -k regex:decode_gemm_kernel --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy \
      --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis $bin/fp4rl_bench 3 decode 2>&1 |
      tee "$OUT/profile.txt" | grep -v "^==PROF==" | tail -150 ;;
  memcheck) (cd /tmp && FP4RL_PARITY_QUICK=1 timeout 220 compute-sanitizer --tool memcheck --leak-check no $bin/test_parity) 2>&1 |
      tee "$OUT/memcheck.log" | tail -8 ;;
  esac
done
