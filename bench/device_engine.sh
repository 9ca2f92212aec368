#!/usr/bin/env bash
# The rollout engine alone on the GPU machine (binaries built here and carried as .devrun/pkg.tar.xz
# by tools/devpack.sh, fp4rl_scale_bench among them): fp4rl_rl_session_rollout of the real Qwen2.5
# configs, P x G completions of L + N tokens (no stop tokens), one JSON line per size and numerics
# in $OUT/engine.jsonl (rollout_s and rollout_tok_s of the last of `steps` rollouts).
# Usage: bash bench/device_engine.sh [sizes=0.5b,1.5b,3b] [numerics=bf16,hif4] [batch=16,8,128,256] [steps=2]
set -uo pipefail
sizes=0.5b,1.5b,3b numerics=bf16,hif4 batch="16 8 128 256" steps=2
for a in "$@"; do
  case $a in
  sizes=*) sizes=${a#sizes=} ;;
  numerics=*) numerics=${a#numerics=} ;;
  batch=*) batch=${a#batch=}; batch=${batch//,/ } ;;
  steps=*) steps=${a#steps=} ;;
  *) echo "unknown argument: $a (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/fp4rl && tar xJf .devrun/pkg.tar.xz -C /tmp/fp4rl
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/tmp/fp4rl/pkg/lib:$lt:${LD_LIBRARY_PATH:-} OPENBLAS_NUM_THREADS=1
read -r P G L N <<< "$batch"
for model in ${sizes//,/ }; do
  for num in ${numerics//,/ }; do
    timeout 200 /tmp/fp4rl/pkg/bin/fp4rl_scale_bench "bench/configs/qwen2.5-$model.json" --numerics "$num" --rollout-only \
      --prompts "$P" --group "$G" --prompt-len "$L" --new-tokens "$N" --steps "$steps" | tee -a "$OUT/engine.jsonl" |
      python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print('$model $num ${P}x${G} of ${L}+${N}: rollout %.3f s, %.0f tok/s, peak %s GB' % (r['rollout_s'] or 0, r['rollout_tok_s'] or 0, r.get('peak_mem_gb')) if r.get('ok') else r)"
  done
done
