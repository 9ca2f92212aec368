#!/usr/bin/env bash
# Issue 17 (quantization at the memory limit), one call on the GPU machine, a few minutes at most:
# the GPU parity suites that cover quantization, the quantize benchmark, and (when ncu is there)
# Nsight Compute on three quantize kernels. Binaries built here for sm_90a and carried as
# .devrun/pkg.tar.xz:
#   cmake -S . -B build/cuda90 -DCMAKE_CUDA_ARCHITECTURES=90a -DFP4RL_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   ninja -C build/cuda90 test_parity test_ops_parity fp4rl_bench
#   bash tools/devpack.sh build/cuda90/tests/test_parity build/cuda90/tests/test_ops_parity build/cuda90/bench/fp4rl_bench
# Usage: bash bench/device_quant.sh [parity] [ops] [bench] [profile]   (no argument: all four)
# Prints a compact summary; full logs land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
pkg=/tmp/fp4rl
mkdir -p "$OUT" "$pkg" && tar xJf .devrun/pkg.tar.xz -C "$pkg" # fresh: a warm machine may hold an older package
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$pkg/pkg/lib:$lt:${LD_LIBRARY_PATH:-}
# test_ops_parity names its fixtures by the build machine's path; this tree's copy is the same
export FP4RL_FIXTURES=$PWD/tests/fixtures OPENBLAS_NUM_THREADS=1
bin=$pkg/pkg/bin
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(parity ops bench profile)
t0=$SECONDS

# Runs a Check suite with a time limit; prints its verdict and the first failures.
suite() {
  local name=$1 limit=$2
  local s=$SECONDS
  (cd /tmp && timeout "$limit" "$bin/$name") > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - s)) s) $(grep -E '^[0-9]+%: Checks' "$OUT/$name.log" | tail -1)"
  grep -E ':[FE]:' "$OUT/$name.log" | head -5 | cut -c1-400
  grep -E '^parity: ' "$OUT/$name.log" | head -2
  [ $rc -eq 124 ] && echo "  $name: timed out after $limit s (log: $OUT/$name.log)"
}

# Nsight Compute on one kernel (mangled-name regex) of `fp4rl_bench 3 quant FORMAT`: the figures
# that say whether it is bound by memory or by instruction issue.
profile() {
  local what=$1 fmt=$2 regex=$3
  timeout 40 ncu --clock-control none --kernel-name-base mangled -k "regex:$regex" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats --section SchedulerStats \
    "$bin/fp4rl_bench" 3 quant "$fmt" > "$OUT/ncu_$what.txt" 2>&1
  echo "ncu $what (rc=$?):"
  grep -E '^ +(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Warp Cycles Per Issued Instruction|L2 Hit Rate|Mem Busy|Max Bandwidth) ' \
    "$OUT/ncu_$what.txt" | sed 's/  */ /g' | head -16
}

for step in "${steps[@]}"; do
  case $step in
  parity) suite test_parity 120 ;;
  ops) suite test_ops_parity 50 ;;
  bench)
    timeout 40 "$bin/fp4rl_bench" 10 quant > "$OUT/bench_quant.md" 2>&1
    echo "fp4rl_bench quant: rc=$?"
    grep -E '^(#|Streaming|\|)' "$OUT/bench_quant.md" ;;
  profile)
    if command -v ncu > /dev/null; then
      profile mxfp4_1d_nearest mxfp4 'quant1d_flatILi3ELb0EtE'
      profile mxfp4_1d_sr mxfp4 'quant1d_flatILi3ELb1EtE'
      profile hif4_2d_nearest hif4 'quant_hif4_2d_kernelILb0EtE'
    else
      echo "profile: no ncu on this machine"
    fi ;;
  *) echo "unknown step: $step (parity ops bench profile)" ;;
  esac
done
echo "device_quant.sh: $((SECONDS - t0)) s"
