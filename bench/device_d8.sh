#!/usr/bin/env bash
# Issue 16's W4A4 decode GEMM on the FP8 tensor cores (cuda/decode_fp8.h), on the GPU machine in
# one call, with the binaries built here and carried as .devrun-d8/pkg.tar.xz:
#   DEVPACK_DIR=.devrun-d8 bash tools/devpack.sh build/cuda90/tests/test_decode_fp8 build/cuda90/bench/fp4rl_bench
# PKG (default .devrun-d8/pkg.tar.xz) and DIR (default /tmp/d8) name the package and where it is
# unpacked. Steps (default: test memcheck bench), logs in $OUT (at most 4 files), a summary on stdout:
#   test      test_decode_fp8 (bit-equality to the FP8 reference, split-K bound, act_e4m3 bytes)
#   quick     its quick subset (FP4RL_D8_QUICK=1)
#   memcheck  the quick subset under compute-sanitizer memcheck
#   bench     fp4rl_bench d8: d8 vs cuBLASLt BF16, M 1..256, 8192^2 and the 3B shapes
# Usage: bash bench/device_d8.sh [test] [quick] [memcheck] [bench]
set -uo pipefail
OUT=${OUT:-/tmp/out}
PKG=${PKG:-.devrun-d8/pkg.tar.xz}
DIR=${DIR:-/tmp/d8}
mkdir -p "$OUT" "$DIR" && tar xJf "$PKG" -C "$DIR"
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$DIR/pkg/lib:$lt:${LD_LIBRARY_PATH:-}
bin=$DIR/pkg/bin
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(test memcheck bench)
for step in "${steps[@]}"; do
  case $step in
  test|quick)
    [ "$step" = quick ] && q=1 || q=0
    (cd /tmp && FP4RL_D8_QUICK=$q timeout 400 $bin/test_decode_fp8) > "$OUT/test_decode_fp8.log" 2>&1
    echo "test_decode_fp8 ($step) rc=$? $(grep -E '^[0-9]+%: Checks' "$OUT/test_decode_fp8.log" | tail -1)"
    grep -E "FAILED|:F:|:E:" "$OUT/test_decode_fp8.log" | cut -c1-400 | head -12 ;;
  memcheck)
    (cd /tmp && FP4RL_D8_QUICK=1 timeout 300 compute-sanitizer --tool memcheck --leak-check no $bin/test_decode_fp8) \
      > "$OUT/memcheck.log" 2>&1
    echo "memcheck rc=$? $(grep -E '^[0-9]+%: Checks|ERROR SUMMARY' "$OUT/memcheck.log" | tr '\n' ' ')"
    grep -E "^=========" "$OUT/memcheck.log" | head -12
    tail -c 20000 "$OUT/memcheck.log" > "$OUT/memcheck.tail" && mv "$OUT/memcheck.tail" "$OUT/memcheck.log" ;;
  bench)
    timeout 300 $bin/fp4rl_bench 10 d8 > "$OUT/bench_d8.md" 2>&1
    echo "fp4rl_bench d8 rc=$?"
    cat "$OUT/bench_d8.md" ;;
  esac
done
