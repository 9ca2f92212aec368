#!/usr/bin/env bash
# The GPU checks and the speed of the packed-weight GEMM with BF16 activations (cuda/decode_w4b.h,
# FP4RL_ROLLOUT_W4B) in one device call (~5 minutes), from one package made here and carried:
#   DEVPACK_DIR=.devrun-b bash tools/devpack.sh build/cuda90/tests/{test_ops_parity,test_rollout_graphs,test_w4b} \
#     build/cuda90/bench/{fp4rl_bench,fp4rl_scale_bench}
# 1. test_w4b (the kernel against the dequantized weights and float64 sums); 2. fp4rl_bench w4b (vs
# cuBLASLt BF16, M 1..512, N = K = 8192 and the 3B fused shapes); 3. the 3B HiF4 W4A4 + ResQ 2:4
# and BF16 rollouts (16 x 8 of 128 + 256) with FP4RL_ROLLOUT_W4B on and off; 4.
# test_ops_parity and test_rollout_graphs (FP4RL_SWIGLU_ACT=1: the activation kernel, swiglu_act,
# the W4B engine; swiglu_act is on by default since session 20), then the swiglu_act A/B (HiF4 and BF16); after 2, ncu of the re-laid-out kernel where it reads counters. Logs in $OUT (the caller tars them).
# Usage: bash bench/device_w4b.sh [pkg=.devrun-b] [budget=420] [steps=test,bench,sweep,ncu,memcheck,roll,tests,ab,small,mid]
#   (sweep: fp4rl_bench w4bsweep, the grid choices at the decode shapes; mid: the 3B rollouts at 8 x 8,
#   W4B up to 128 / 64 operand rows, off, BF16)
#   (budget: seconds after which no new step starts; small: the 3B rollouts at 2 x 8, where W4B runs)
# Since session 21 W4B is on by default on GPUs (FP4RL_ROLLOUT_W4B=0 turns it off). The call session 22
# should make first: LOGDIR=$OUT bash bench/device_w4b.sh pkg=.devrun-b budget=300 steps=test,tests,small,mid,sweep,bench
set -uo pipefail
pkg=.devrun-b budget=420 steps=test,bench,ncu,memcheck,roll,tests,ab
for a in "$@"; do
  case $a in
  pkg=*) pkg=${a#pkg=} ;;
  steps=*) steps=${a#steps=} ;;
  budget=*) budget=${a#budget=} ;;
  *) echo "unknown argument: $a (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
L=${LOGDIR:-/tmp/logs}  # LOGDIR=$OUT: what a run cut off at its limit wrote still comes back
mkdir -p /tmp/optin "$L" && tar xJf "$pkg/pkg.tar.xz" -C /tmp/optin || exit 1
bin=/tmp/optin/pkg/bin
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/tmp/optin/pkg/lib:$lt OPENBLAS_NUM_THREADS=1 FP4RL_FIXTURES=$PWD/tests/fixtures FP4RL_D8_QUICK=1
nvidia-smi --query-gpu=name --format=csv,noheader
on() { [[ ",$steps," == *",$1,"* ]]; }
if on test; then
(cd /tmp && timeout 150 $bin/test_w4b) > $L/test_w4b.log 2>&1
echo "test_w4b rc=$? $(grep -E '^[0-9]+%: Checks' $L/test_w4b.log | tail -1) (t=$SECONDS)"; grep -E ":F:|:E:|w4b:|identity|random|3B" $L/test_w4b.log | cut -c1-400 | head -8
fi
on bench && { (cd /tmp && timeout 150 stdbuf -oL $bin/fp4rl_bench 5 w4b) > $L/bench_w4b.md 2>&1; grep -E "^\||GB/s" $L/bench_w4b.md | head -40; }
on sweep && [ $SECONDS -lt $budget ] && { (cd /tmp && timeout 150 stdbuf -oL $bin/fp4rl_bench 5 w4bsweep) > $L/sweep.md 2>&1; grep -E "^\|" $L/sweep.md | cut -d'|' -f2-8; }
# 2b. where ncu reads counters (Firecracker machines): the re-laid-out kernel at M = 1 and 128, 8192^2
if on ncu && [ $SECONDS -lt $budget ] && command -v ncu > /dev/null; then
  for m in 1 128; do
    (cd /tmp && timeout 60 ncu --clock-control none -k regex:wp_kernel -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      $bin/fp4rl_bench 1 w4bprof $m 8192 8192 pack) > $L/ncu_m$m.txt 2>&1
    echo "ncu M=$m rc=$?"; grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Issued Ipc|No Eligible|Stall" $L/ncu_m$m.txt | head -14
  done
fi
# 2c. compute-sanitizer memcheck of both kernels on ragged shapes (where the machine's runtime has it)
if on memcheck && [ $SECONDS -lt $budget ] && command -v compute-sanitizer > /dev/null; then
  for a in "1 300 320" "33 300 320 pack" "300 77 2048 pack" "100 130 640" "40 300 320 nvfp4"; do
    (cd /tmp && timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $bin/fp4rl_bench 1 w4bprof $a) > $L/memcheck.txt 2>&1
    echo "memcheck w4bprof $a: rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.txt | tail -1)"
  done
fi
roll() { # numerics, prompts, then env settings; one line of tokens/s
  local num=$1 P=$2; shift 2
  [ $SECONDS -lt $budget ] || { echo "skipped (budget): 3b $num ${P}x8 $*"; return; }
  env "$@" timeout 60 $bin/fp4rl_scale_bench bench/configs/qwen2.5-3b.json --numerics "$num" --rollout-only --prompts $P --group 8 \
    --prompt-len 128 --new-tokens 256 --steps 2 > $L/r.json 2>&1
  python3 -c "import json,sys; r=json.load(open('$L/r.json')); print('3b $num ${P}x8 $*: %.0f tok/s, %.2f ms a position' % (r['rollout_tok_s'], 1e3 * r['rollout_s'] / 256) if r.get('ok') else r)" 2>&1 | tail -1
}
if on roll; then
  echo "## rollouts (t=$SECONDS)"
  roll hif4 16 FP4RL_ROLLOUT_W4B=1
  roll hif4 16 FP4RL_ROLLOUT_W4B=0
  roll bf16 16 FP4RL_ROLLOUT_W4B=0
fi
if on small; then # 2 x 8 sequences: ResQ's operand 32 rows, so W4B runs on every decode GEMM
  echo "## small rollouts (t=$SECONDS)"
  roll hif4 2 FP4RL_ROLLOUT_W4B_ROWS=32 # the default: W4B on (GPU), up to 32 rows
  roll hif4 2 FP4RL_ROLLOUT_W4B=0
  roll bf16 2 FP4RL_ROLLOUT_W4B=0
fi
if on mid; then # 8 x 8 sequences: ResQ's operand 128 rows; W4B there only with FP4RL_ROLLOUT_W4B_ROWS >= 128
  echo "## 8 x 8 rollouts (t=$SECONDS)"
  roll hif4 8 FP4RL_ROLLOUT_W4B_ROWS=128
  roll hif4 8 FP4RL_ROLLOUT_W4B_ROWS=64
  roll hif4 8 FP4RL_ROLLOUT_W4B=0
  roll bf16 8 FP4RL_ROLLOUT_W4B=0
fi
if on tests; then
  echo "## engine and parity tests (t=$SECONDS)"
  for t in test_ops_parity:70 test_rollout_graphs:90; do
    n=${t%%:*}
    [ $SECONDS -lt $budget ] || { echo "skipped (budget): $n"; continue; }
    (cd /tmp && timeout ${t#*:} $bin/$n) > $L/$n.log 2>&1
    echo "$n rc=$? $(grep -E '^[0-9]+%: Checks' $L/$n.log | tail -1) (t=$SECONDS)"; grep -E ":F:|:E:" $L/$n.log | cut -c1-300 | head -8
  done
fi
if on ab; then
  roll hif4 16 FP4RL_SWIGLU_ACT=1
  roll hif4 16 FP4RL_SWIGLU_ACT=0
  roll bf16 16 FP4RL_SWIGLU_ACT=1
  roll bf16 16 FP4RL_SWIGLU_ACT=0
fi
