#!/usr/bin/env bash
# Issue 16's decode GEMM on packed FP4 weights, on the GPU machine in one call, with the binaries
# built here and carried as .devrun/pkg.tar.xz:
#   bash tools/devpack.sh build/cuda90/tests/test_decode_gemm build/cuda90/bench/fp4rl_bench
# PKG (default .devrun/pkg.tar.xz) and DIR (default /tmp/fp4rl) name the package and where it is
# unpacked, so that a second build can travel beside the first (e.g. PKG=.devrun-dg/pkg.tar.xz
# DIR=/tmp/dg, the package moved there after devpack and carried as .devrun-dg).
# Steps (default: test bench profile), logs in $OUT, a compact summary on stdout:
#   test      test_decode_gemm (every format / tile / M / ResQ / split-K against float64)
#   quick     its quick subset (FP4RL_DG_QUICK=1), without the sanitizer
#   memcheck  its quick subset under compute-sanitizer memcheck (FP4RL_DG_QUICK=1)
#   bench     fp4rl_bench dg: the packed kernel vs cuBLASLt BF16, M 1..256, 8192^2 and 3B shapes
#   profile   ncu of the packed kernel: HiF4 M = 1, MXFP4 M = 1, HiF4 M = 64, MXFP4 M = 128 (8192^2;
#             PROFILE="fmt M,fmt M" picks others)
# Usage: bash bench/device_decode.sh [test] [quick] [memcheck] [bench] [profile]
set -uo pipefail
OUT=${OUT:-/tmp/out}
PKG=${PKG:-.devrun/pkg.tar.xz}
DIR=${DIR:-/tmp/fp4rl}
mkdir -p "$OUT" "$DIR" && tar xJf "$PKG" -C "$DIR"
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$DIR/pkg/lib:$lt:${LD_LIBRARY_PATH:-}
bin=$DIR/pkg/bin
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/gpu.txt"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(test bench profile)
for step in "${steps[@]}"; do
  case $step in
  test|quick)
    [ "$step" = quick ] && q=1 || q=0
    (cd /tmp && FP4RL_DG_QUICK=$q timeout 150 $bin/test_decode_gemm) > "$OUT/test_decode_gemm.log" 2>&1
    echo "test_decode_gemm ($step) rc=$? $(grep -E '^[0-9]+%: Checks' "$OUT/test_decode_gemm.log" | tail -1)"
    grep -E "FAILED|:F:|:E:|    \(" "$OUT/test_decode_gemm.log" | head -20
    # the worst error per format, as a share of the bound
    awk '/worst/ {f=$1; w=$(NF-3); if (w+0 > m[f]) m[f]=w+0} END {for (f in m) printf "  worst %-6s %.3f of the bound\n", f, m[f]}' \
      "$OUT/test_decode_gemm.log" ;;
  memcheck)
    (cd /tmp && FP4RL_DG_QUICK=1 timeout 200 compute-sanitizer --tool memcheck --leak-check no $bin/test_decode_gemm) \
      > "$OUT/memcheck.log" 2>&1
    echo "memcheck rc=$? $(grep -E '^[0-9]+%: Checks|ERROR SUMMARY' "$OUT/memcheck.log" | tr '\n' ' ')"
    grep -E "^=========" "$OUT/memcheck.log" | head -12 ;;
  bench)
    timeout 170 $bin/fp4rl_bench 10 dg > "$OUT/bench_dg.md" 2>&1
    echo "fp4rl_bench dg rc=$?"
    cat "$OUT/bench_dg.md" ;;
  profile)
    IFS=, read -ra cfgs <<< "${PROFILE:-hif4 1,mxfp4 1,hif4 64,mxfp4 128}"
    for cfg in "${cfgs[@]}"; do
      f=$OUT/ncu_${cfg// /_}.txt
      timeout 100 ncu --clock-control none -k regex:dg_kernel --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section InstructionStats --section Occupancy \
        --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        $bin/fp4rl_bench 3 dgprof $cfg > "$f" 2>&1
      echo "## ncu $cfg (rc=$?), full report in $f"
      grep -E "^\s+(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|No Eligible|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Dynamic Shared Memory Per Block|Grid Size|Block Size|Executed Instructions |Warp Cycles Per Issued Instruction|Avg. Active Threads Per Warp)" "$f" | sed 's/  */ /g' | head -20
    done ;;
  esac
done
