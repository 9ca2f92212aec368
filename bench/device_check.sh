#!/usr/bin/env bash
# One call on the GPU machine (binaries built here for sm_90a and carried as .devrun/pkg.tar.xz by
# tools/devpack.sh): the GPU suites, the transformers-5 fixtures and the check that transformers
# reads what fp4rl_model_save_pretrained writes, and the scale benchmark. Logs land in $OUT.
# Usage: bash bench/device_check.sh [fixtures] [gpu] [pretrained] [scale ARGS...]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/fp4rl && tar xJf .devrun/pkg.tar.xz -C /tmp/fp4rl
# the test binaries find their fixtures here, not at the build machine's source path
repo=$PWD
export FP4RL_FIXTURES=$repo/tests/fixtures
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
nccl=$(dirname "$(find / -name 'libnccl.so.2*' -not -path '/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH=/tmp/fp4rl/pkg/lib:$lt:${nccl:-}:${LD_LIBRARY_PATH:-}
export OPENBLAS_NUM_THREADS=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
bin=/tmp/fp4rl/pkg/bin
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
  fixtures) # tests/fixtures/qwen2_hf5 with the machine's torch + transformers 5, returned as a tarball
    python3 tests/fixtures/gen_hf5.py /tmp/qwen2_hf5 2>&1 | tail -3 &&
      tar czf "$OUT/qwen2_hf5.tgz" -C /tmp qwen2_hf5 && du -sh /tmp/qwen2_hf5/* ;;
  gpu)
    # every suite with a GPU part (those not packed are skipped)
    for t in test_ops_parity test_parity test_rl_parity test_rollout_graphs test_rollout_fast test_dist test_model_memory \
             test_pretrained test_model test_session test_top_p test_layer test_zero_copy_cuda test_moments test_matmul \
             test_quantize test_decode_gemm test_fp8_gemm; do
      [ -x $bin/$t ] || continue
      (cd /tmp && timeout 240 $bin/$t) > "$OUT/$t.log" 2>&1
      echo "$t rc=$? $(grep -E '^[0-9]+%: Checks' "$OUT/$t.log" | tail -1)"
    done ;;
  pretrained)
    (cd /tmp && timeout 120 $bin/fp4rl_load_time $repo/tests/fixtures/qwen2/gqa --cpu --save /tmp/fp4rl_saved) 2>&1 | tail -3
    timeout 120 python3 tests/fixtures/check_saved_with_hf.py /tmp/fp4rl_saved 2>&1 | grep -v Warning | tail -2 ;;
  load3b) # a random Qwen2.5-3B saved by transformers in BF16 (sharded, as on the hub), loaded by fp4rl on the GPU
    timeout 200 python3 -c "
import json, torch, time
from transformers import Qwen2Config, Qwen2ForCausalLM
cfg = Qwen2Config(**json.load(open('bench/configs/qwen2.5-3b.json')))
t = time.time()
with torch.device('cuda'):
    m = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
m.save_pretrained('/tmp/qwen3b', max_shard_size='2GB')
print('transformers wrote /tmp/qwen3b in %.1f s' % (time.time() - t))
" 2>&1 | grep -v Warn | tail -2; ls /tmp/qwen3b | head; du -sh /tmp/qwen3b
    (cd /tmp && timeout 200 $bin/fp4rl_load_time /tmp/qwen3b) 2>&1 | tail -4 ;;
  scale) # the rest of the arguments go to bench/device_scale.sh
    bash bench/device_scale.sh "$@"; exit ;;
  esac
done
