#!/usr/bin/env bash
# The GPU checks of the opt-in kernels (bench/pending/README.md) and their speed, in one device call
# (~4-5 minutes), from one package made here and carried:
#   DEVPACK_DIR=.devrun-b bash tools/devpack.sh build/cuda90/tests/{test_decode_fp8,test_ops_parity,test_rollout_graphs,test_rollout_fast} \
#     build/cuda90/bench/{fp4rl_bench,fp4rl_scale_bench}
# 1. test_decode_fp8 (quick), test_ops_parity, test_rollout_graphs with every switch on (the tests set
#    them too); 2. the quick d8 test under compute-sanitizer memcheck (mma.sync, wgmma and persistent kernels); 3. fp4rl_bench d8 (the W4A4
#    decode GEMM against cuBLASLt BF16) and attn (split-keys attention, FP4RL_ATTN_SPLIT=1 vs 0);
# 4. the 3B HiF4 and BF16 rollouts with FP4RL_SWIGLU_ACT on and off (the defaults otherwise), the 3B
#    HiF4 W4A4 + ResQ 2:4 rollout (16 x 8 of 128 + 256) with each switch off in turn against all on, and the 3B BF16 rollout with the attention split on and off. Logs in one $OUT/logs.tgz.
# Usage: bash bench/device_optin.sh [pkg=.devrun-b] [budget=280]  (seconds the steps may take in all)
set -uo pipefail
pkg=.devrun-b budget=280
for a in "$@"; do
  case $a in
  pkg=*) pkg=${a#pkg=} ;;
  budget=*) budget=${a#budget=} ;;
  *) echo "unknown argument: $a (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
FINAL=${OUT:-/tmp/out}
L=/tmp/logs; mkdir -p "$FINAL" $L /tmp/optin && tar xJf "$pkg/pkg.tar.xz" -C /tmp/optin || exit 1
bin=/tmp/optin/pkg/bin
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/tmp/optin/pkg/lib:$lt OPENBLAS_NUM_THREADS=1 FP4RL_FIXTURES=$PWD/tests/fixtures FP4RL_D8_QUICK=1
ON="FP4RL_ATTN_SPLIT=1 FP4RL_ACT_QDQ4=1 FP4RL_RESQ_HALVES=1 FP4RL_ROLLOUT_W4=1 FP4RL_D8_WGMMA=1 FP4RL_SWIGLU_ACT=1"
left() { echo $((budget - SECONDS > 5 ? budget - SECONDS : 5)); }
nvidia-smi --query-gpu=name --format=csv,noheader
for t in test_decode_fp8:40 test_ops_parity:60 test_rollout_graphs:90 test_rollout_fast:90; do
  n=${t%%:*}
  [ -x $bin/$n ] || { echo "$n: not packed"; continue; }
  (cd /tmp && env $ON timeout ${t#*:} $bin/$n) > $L/$n.log 2>&1
  echo "$n rc=$? $(grep -E '^[0-9]+%: Checks' $L/$n.log | tail -1)"; grep -E ":F:|:E:" $L/$n.log | cut -c1-300 | head -8
done
if [ -x $bin/test_decode_fp8 ] && command -v compute-sanitizer > /dev/null; then
  (cd /tmp && timeout 60 compute-sanitizer --tool memcheck --leak-check no $bin/test_decode_fp8) > $L/memcheck.log 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.log | tail -1)"
  (cd /tmp && FP4RL_D8_WGMMA=1 timeout 60 compute-sanitizer --tool memcheck --leak-check no $bin/test_decode_fp8) > $L/memcheck_wg.log 2>&1
  echo "wgmma memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck_wg.log | tail -1)"
  (cd /tmp && FP4RL_D8_PERSIST=1 timeout 90 compute-sanitizer --tool memcheck --leak-check no $bin/test_decode_fp8) > $L/memcheck_p.log 2>&1
  echo "persistent memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck_p.log | tail -1)"
fi
echo "## fp4rl_bench d8 (t=$SECONDS)"
(cd /tmp && timeout 60 stdbuf -oL $bin/fp4rl_bench 5 d8) > $L/bench_d8.md 2>&1; grep -vE "^\s*$" $L/bench_d8.md | tail -60
for s in 1 0; do
  echo "## fp4rl_bench attn, FP4RL_ATTN_SPLIT=$s (t=$SECONDS)"
  (cd /tmp && FP4RL_ATTN_SPLIT=$s timeout 40 stdbuf -oL $bin/fp4rl_bench 5 attn) > $L/attn_$s.md 2>&1; grep -E "^\| (3B|7B)" $L/attn_$s.md
done
roll() { # numerics, then env settings; one line of tokens/s
  local num=$1; shift
  env "$@" timeout $(left) $bin/fp4rl_scale_bench bench/configs/qwen2.5-3b.json --numerics "$num" --rollout-only --prompts 16 --group 8 \
    --prompt-len 128 --new-tokens 256 --steps 2 > $L/r.json 2>&1
  python3 -c "import json,sys; r=json.load(open('$L/r.json')); print('3b $num $*: %.0f tok/s, %.2f ms a position' % (r['rollout_tok_s'], 1e3 * r['rollout_s'] / 256) if r.get('ok') else r)" 2>&1 | tail -1
}
roll hif4 FP4RL_SWIGLU_ACT=1
roll hif4 FP4RL_SWIGLU_ACT=0
roll bf16 FP4RL_SWIGLU_ACT=1
roll bf16 FP4RL_SWIGLU_ACT=0
roll hif4 $ON
roll hif4 ${ON/FP4RL_ROLLOUT_W4=1/FP4RL_ROLLOUT_W4=0}
roll hif4 ${ON/FP4RL_D8_WGMMA=1/FP4RL_D8_WGMMA=0}
roll hif4 ${ON/FP4RL_RESQ_HALVES=1/FP4RL_RESQ_HALVES=0}
roll hif4 ${ON/FP4RL_ACT_QDQ4=1/FP4RL_ACT_QDQ4=0}
roll bf16 FP4RL_ATTN_SPLIT=1
roll bf16 FP4RL_ATTN_SPLIT=0
roll hif4 FP4RL_ATTN_SPLIT=0
tar czf "$FINAL/logs.tgz" -C /tmp logs; echo "done t=$SECONDS"
