#!/usr/bin/env bash
# One call on the GPU machine for the rollout work (binaries built here and carried as
# .devrun/pkg.tar.xz by tools/devpack.sh): the op and RL parity suites, rollout throughput of fp4rl
# next to PyTorch + HF generate in the same run, and the demo over several seeds on the GPU and
# (single-threaded, in the background) on that machine's CPU. Logs land in $OUT.
# Usage: bash bench/device_rollout.sh [parity] [dist] [train] [memcheck] [throughput] [demo] [demo-cpu-start demo-cpu-wait]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/fp4rl && tar xJf .devrun/pkg.tar.xz -C /tmp/fp4rl
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/tmp/fp4rl/pkg/lib:$lt:${LD_LIBRARY_PATH:-}
nccl=$(dirname "$(find / -name 'libnccl.so.2*' -not -path '/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:${nccl:-}
export OPENBLAS_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
bin=/tmp/fp4rl/pkg/bin
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(parity throughput demo)
for step in "${steps[@]}"; do
  case $step in
  demo-cpu-start) # CPU demo seeds in the background, collected by demo-cpu-wait
    for s in 1 2 3; do (cd /tmp && timeout 500 $bin/fp4rl_rl_demo --cpu --seed $s --out /tmp/democpu$s > "$OUT/demo_cpu_seed$s.log" 2>&1 &); done ;;
  parity)
    (cd /tmp && timeout 200 $bin/test_ops_parity) 2>&1 | tee "$OUT/ops_parity.log" | grep -E "rollout_act|bf16|Checks|fail|Fail" ;
    (cd /tmp && timeout 200 $bin/test_rl_parity) 2>&1 | tee "$OUT/rl_parity.log" | grep -E "case|step|Checks|fail|Fail" ;;
  dist) # data parallelism on the one GPU there is: world size 1 through NCCL
    (cd /tmp && timeout 200 $bin/test_dist) 2>&1 | tee "$OUT/test_dist.log" | tail -5 ;
    (cd /tmp && timeout 200 $bin/dist_rl 1 --steps 3) 2>&1 | tee "$OUT/dist_rl.log" | tail -6 ;
    (cd /tmp && timeout 200 $bin/dist_rl 1 --bench --steps 3 --prompts 32 --group 8 --max-new 64) 2>&1 | tee "$OUT/dist_rl_bench.log" | tail -4 ;;
  train) # training step throughput (the tiled attention), and the op suite under compute-sanitizer
    (cd /tmp && timeout 200 $bin/fp4rl_model_throughput --train-only) 2>&1 | tee "$OUT/train.md" ;;
  memcheck)
    (cd /tmp && timeout 300 compute-sanitizer --tool memcheck --leak-check no $bin/test_ops_parity) 2>&1 | tee "$OUT/memcheck.log" | tail -4 ;;
  throughput)
    (cd /tmp && timeout 200 $bin/fp4rl_model_throughput --rollout-only) 2>&1 | tee "$OUT/throughput.md" ;
    timeout 200 python3 bench/model_throughput_torch.py 2>&1 | grep -v Warning | tee "$OUT/throughput_torch.md" ;;
  demo)
    for s in 1 2 3 4 5 6; do
      (cd /tmp && timeout 100 $bin/fp4rl_rl_demo --seed $s --out /tmp/demo$s) > "$OUT/demo_gpu_seed$s.log" 2>&1
      echo "gpu seed $s: $(grep -E 'change:' "$OUT/demo_gpu_seed$s.log")"
    done ;;
  demo-cpu-wait)
    while pgrep -f "fp4rl_rl_demo --cpu" > /dev/null; do sleep 5; done
    for s in 1 2 3; do echo "cpu seed $s: $(grep -E 'change:' "$OUT/demo_cpu_seed$s.log")"; done ;;
  esac
done
