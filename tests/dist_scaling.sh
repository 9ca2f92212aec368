#!/usr/bin/env bash
# Scaling of the data-parallel RL step: rollout and train tokens/s on 1, 2 and 4 GPUs, one process
# per GPU (tests/dist_rl.c with the ~120M-parameter model of tests/dist_common.h), as
#   weak scaling:   PER_GPU prompts per GPU (the global batch grows with the GPUs), and
#   strong scaling: the 4-GPU global batch (4 x PER_GPU prompts) split over 1, 2, 4 GPUs.
# Needs the GPUs (counts above what nvidia-smi lists are skipped) and a CUDA build with NCCL:
#   cmake --build build/release --target dist_rl && bash tests/dist_scaling.sh build/release
# Environment: PER_GPU (32 prompts), GROUP (8), MAX_NEW (64), STEPS (4; step 1 warms up and is
# not counted). Prints a markdown table.
set -euo pipefail
build=${1:-build/release}
bin="$build/tests/dist_rl"
per_gpu=${PER_GPU:-32} group=${GROUP:-8} max_new=${MAX_NEW:-64} steps=${STEPS:-4}
[ -x "$bin" ] || { echo "dist_scaling.sh: $bin not built" >&2; exit 1; }
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
export NCCL_NVLS_ENABLE=0
echo "| scaling | GPUs | global prompts x G | rollout tok/s | train tok/s | rollout speed-up | train speed-up |"
echo "|---|---|---|---|---|---|---|"
for mode in weak strong; do
  base_r="" base_t=""
  for n in 1 2 4; do
    if [ "$n" -gt "$ngpu" ]; then echo "| $mode | $n | skipped: $ngpu GPU(s) visible | | | | |"; continue; fi
    [ "$mode" = weak ] && prompts=$((per_gpu * n)) || prompts=$((per_gpu * 4))
    line=$("$bin" "$n" --bench --steps "$steps" --prompts "$prompts" --group "$group" --max-new "$max_new" | grep '^summary:')
    r=$(sed -E 's/.*rollout ([0-9.]+) tok\/s.*/\1/' <<<"$line")
    t=$(sed -E 's/.*train ([0-9.]+) tok\/s.*/\1/' <<<"$line")
    base_r=${base_r:-$r} base_t=${base_t:-$t}
    echo "| $mode | $n | $prompts x $group | $r | $t | $(awk -v a="$r" -v b="$base_r" 'BEGIN{printf "%.2f", a/b}') | $(awk -v a="$t" -v b="$base_t" 'BEGIN{printf "%.2f", a/b}') |"
  done
done
