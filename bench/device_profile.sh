#!/usr/bin/env bash
# The trainer's kernel-time profile at a real size, on the GPU machine, with the binaries built
# here and carried in .devrun (bash tools/devpack.sh build/.../bench/fp4rl_scale_bench, and
# .devrun/libkprof.so built from tools/kprof.cpp with .devrun/libcupti.so.13 next to it):
# fp4rl_scale_bench --train-only under the kprof injection library (CUPTI activity records; no
# replay, so the times are the real run's). One profile per size and numerics in $OUT/kprof_*.txt.
# Usage: bash bench/device_profile.sh [sizes=0.5b] [numerics=bf16,hif4] [batch=P,G,L,N] [steps=2] [top=45] [part=train|rollout]
set -uo pipefail
sizes=0.5b numerics=bf16,hif4 batch="16 8 128 256" steps=2 top=45 part=train
for a in "$@"; do
  case $a in
  sizes=*) sizes=${a#sizes=} ;;
  numerics=*) numerics=${a#numerics=} ;;
  batch=*) batch=${a#batch=}; batch=${batch//,/ } ;;
  steps=*) steps=${a#steps=} ;;
  top=*) top=${a#top=} ;;
  part=*) part=${a#part=} ;;
  *) echo "unknown argument: $a (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-/tmp/out}
pkg=${FP4RL_PKG:-/tmp/fp4rl}
mkdir -p "$OUT" "$pkg"
tar xJf .devrun/pkg.tar.xz -C "$pkg" # fresh: a warm machine may hold an older package
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$pkg/pkg/lib:$PWD/.devrun:$lt:${LD_LIBRARY_PATH:-} OPENBLAS_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
read -r P G L N <<< "$batch"
for model in ${sizes//,/ }; do
  for num in ${numerics//,/ }; do
    f=$OUT/kprof_${part}_${model}_${num}.txt
    CUDA_INJECTION64_PATH=$PWD/.devrun/libkprof.so KPROF_OUT=$f KPROF_TOP=$top timeout 280 \
      "$pkg/pkg/bin/fp4rl_scale_bench" "bench/configs/qwen2.5-$model.json" --numerics "$num" --$part-only \
      --prompts "$P" --group "$G" --prompt-len "$L" --new-tokens "$N" --steps "$steps" | tee -a "$f"
    sed -n '1,30p' "$f"
  done
done
