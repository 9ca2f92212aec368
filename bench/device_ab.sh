#!/usr/bin/env bash
# An A/B of two builds on one GPU machine in one call: packages made here with
#   DEVPACK_DIR=.devrun-a bash tools/devpack.sh ...   and   DEVPACK_DIR=.devrun-b bash tools/devpack.sh ...
# (both carried). B's GPU tests first (from /tmp, fixtures from this checkout), then each rollout
# configuration of fp4rl_scale_bench for A and B alternately (3B, 16 x 8 of 128 + 512 by default),
# then, with attn=1, `fp4rl_bench 10 attn` for both. One JSON line per rollout in $OUT/ab.jsonl.
# Usage: bash bench/device_ab.sh a=.devrun-a b=.devrun-b [tests=test_ops_parity,test_rollout_graphs]
#        [rollouts="3b bf16,3b hif4"] [batch=16,8,128,512] [attn=0]
set -uo pipefail
a=.devrun-a b=.devrun-b tests=test_ops_parity,test_rollout_graphs rollouts="3b bf16,3b hif4" batch="16 8 128 512" attn=0
for arg in "$@"; do
  case $arg in
  a=*) a=${arg#a=} ;;
  b=*) b=${arg#b=} ;;
  tests=*) tests=${arg#tests=} ;;
  rollouts=*) rollouts=${arg#rollouts=} ;;
  batch=*) batch=${arg#batch=}; batch=${batch//,/ } ;;
  attn=*) attn=${arg#attn=} ;;
  *) echo "unknown argument: $arg (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-/tmp/out}
repo=$PWD
mkdir -p "$OUT" /tmp/ab/a /tmp/ab/b
tar xJf "$a/pkg.tar.xz" -C /tmp/ab/a && tar xJf "$b/pkg.tar.xz" -C /tmp/ab/b || exit 1
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export OPENBLAS_NUM_THREADS=1
nvidia-smi --query-gpu=name --format=csv,noheader
for t in ${tests//,/ }; do
  [ -x /tmp/ab/b/pkg/bin/$t ] || { echo "b $t: not packed"; continue; }
  (cd /tmp && LD_LIBRARY_PATH=/tmp/ab/b/pkg/lib:$lt FP4RL_FIXTURES=$repo/tests/fixtures timeout 120 /tmp/ab/b/pkg/bin/$t) > "$OUT/b_$t.log" 2>&1
  echo "b $t rc=$? $(grep -E '^[0-9]+%: Checks' "$OUT/b_$t.log" | tail -1)"
  grep -E "FAILED|:F:|:E:" "$OUT/b_$t.log" | head -5
done
read -r P G L N <<< "$batch"
IFS=, read -ra cfgs <<< "$rollouts"
for cfg in "${cfgs[@]}"; do
  read -r size num <<< "$cfg"
  for v in a b; do
    LD_LIBRARY_PATH=/tmp/ab/$v/pkg/lib:$lt timeout 120 /tmp/ab/$v/pkg/bin/fp4rl_scale_bench "bench/configs/qwen2.5-$size.json" \
      --numerics "$num" --rollout-only --prompts "$P" --group "$G" --prompt-len "$L" --new-tokens "$N" --steps 2 > /tmp/ab/r.json
    sed "s/^{/{\"ab\": \"$v\", /" /tmp/ab/r.json >> "$OUT/ab.jsonl"
    python3 -c "import json; r=json.load(open('/tmp/ab/r.json')); print('$v $size $num: %.3f s, %.0f tok/s, %.2f ms a position' % (r['rollout_s'], r['rollout_tok_s'], 1e3 * r['rollout_s'] / $N) if r.get('ok') else r)"
  done
done
if [ "$attn" = 1 ]; then
  for v in a b; do
    echo "## attention_rows, $v"
    (cd /tmp && LD_LIBRARY_PATH=/tmp/ab/$v/pkg/lib:$lt timeout 90 /tmp/ab/$v/pkg/bin/fp4rl_bench 10 attn) > "$OUT/attn_$v.md" 2>&1
    grep -E "^\| (3B|7B)" "$OUT/attn_$v.md"
  done
fi
