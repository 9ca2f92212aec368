#!/usr/bin/env bash
# The rollout engine alone on the GPU machine (binaries built here and carried as .devrun/pkg.tar.xz
# by tools/devpack.sh, fp4rl_scale_bench among them): fp4rl_rl_session_rollout of the real Qwen2.5
# configs, P x G completions of L + N tokens (no stop tokens), one JSON line per size and numerics
# in $OUT/engine.jsonl (rollout_s and rollout_tok_s of the last of `steps` rollouts), next to HF
# generate of the same shapes (bench/scale_torch.py --rollout-only; torch=0 skips it), then a table:
# tokens/s, x HF, the mean time per generated position against its bound (the BF16 weight bytes
# plus the mean KV bytes a decode step reads, over the copy bandwidth torch measures in this run).
# torch_steps=1 times one HF generate after a short warm-up generate (HF at 512 new tokens takes ~50 s a step).
# pkg=.devrun-b takes the package from another folder (tools/devpack.sh's DEVPACK_DIR).
# Usage: bash bench/device_engine.sh [pkg=.devrun] [sizes=0.5b,1.5b,3b] [numerics=bf16,hif4] [batch=16,8,128,256] [steps=2] [torch=1] [torch_steps=2]
set -uo pipefail
pkg=.devrun sizes=0.5b,1.5b,3b numerics=bf16,hif4 batch="16 8 128 256" steps=2 torch=1 torch_steps=
for a in "$@"; do
  case $a in
  pkg=*) pkg=${a#pkg=} ;;
  sizes=*) sizes=${a#sizes=} ;;
  numerics=*) numerics=${a#numerics=} ;;
  batch=*) batch=${a#batch=}; batch=${batch//,/ } ;;
  steps=*) steps=${a#steps=} ;;
  torch=*) torch=${a#torch=} ;;
  torch_steps=*) torch_steps=${a#torch_steps=} ;;
  *) echo "unknown argument: $a (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/fp4rl && tar xJf "$pkg/pkg.tar.xz" -C /tmp/fp4rl
lt=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/tmp/fp4rl/pkg/lib:$lt:${LD_LIBRARY_PATH:-} OPENBLAS_NUM_THREADS=1
read -r P G L N <<< "$batch"
for model in ${sizes//,/ }; do
  for num in ${numerics//,/ }; do
    timeout 200 /tmp/fp4rl/pkg/bin/fp4rl_scale_bench "bench/configs/qwen2.5-$model.json" --numerics "$num" --rollout-only \
      --prompts "$P" --group "$G" --prompt-len "$L" --new-tokens "$N" --steps "$steps" | tee -a "$OUT/engine.jsonl" |
      python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print('$model $num ${P}x${G} of ${L}+${N}: rollout %.3f s, %.0f tok/s, peak %s GB' % (r['rollout_s'] or 0, r['rollout_tok_s'] or 0, r.get('peak_mem_gb')) if r.get('ok') else r)"
  done
  [ "$torch" = 1 ] && timeout 280 python3 bench/scale_torch.py "bench/configs/qwen2.5-$model.json" --rollout-only --steps "${torch_steps:-$steps}" \
    --prompts "$P" --group "$G" --prompt-len "$L" --new-tokens "$N" 2>/dev/null | grep '^{' >> "$OUT/engine.jsonl"
done
python3 - "$OUT/engine.jsonl" <<'PY'
import json, sys, time
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
try:  # the copy bandwidth of this machine, now (bytes read + written per second)
    import torch
    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
    for _ in range(3): b.copy_(a)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(10): b.copy_(a)
    torch.cuda.synchronize(); bw = 2 * 10 * a.numel() / (time.perf_counter() - t)
except Exception as e:
    bw = None
print(f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write)" if bw else "copy bandwidth: not measured")
hf = {(r["model"], r["batch"], r["prompt_len"], r["new_tokens"]): r for r in rows if r["impl"] == "torch" and r.get("ok")}
print("| model | batch | numerics | rollout s | tok/s | x HF generate | prefill tok/s | ms per position | bound ms | x bound |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if r["impl"] != "fp4rl" or not r.get("ok"): continue
    c = json.load(open(f"bench/configs/{r['model']}.json"))
    C, I, Lr, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = c["num_key_value_heads"] * C // c["num_attention_heads"]
    wbytes = 2 * (Lr * (C * (C + 2 * kv) + C * C + 3 * C * I) + V * C)
    L, N, B = r["prompt_len"], r["new_tokens"], r["batch"]
    kvbytes = B * (L + N / 2) * Lr * 2 * kv * 2  # BF16 k and v of the mean context, every row
    pos_ms = 1e3 * r["rollout_s"] / N
    bound = 1e3 * (wbytes + kvbytes) / bw if bw else None  # HBM bytes per second of a copy (read + write)
    h = hf.get((r["model"], B, L, N))
    pf = f"{r['prefill_tok_s']:.0f}" if r.get("prefill_tok_s") else "-"  # one-token rollouts: sync + prefill + 1 sample
    print(f"| {r['model']} | {r['prompts']}x{r['group']} of {L}+{N} | {r['numerics']} | {r['rollout_s']:.2f} | {r['rollout_tok_s']:.0f}"
          + (f" | {r['rollout_tok_s'] / h['rollout_tok_s']:.2f}" if h else " | -")
          + f" | {pf} | {pos_ms:.2f} | " + (f"{bound:.2f} | {pos_ms / bound:.1f} |" if bound else "- | - |"))
for k, h in hf.items():
    print(f"HF generate {k}: {h['rollout_s']:.2f} s, {h['rollout_tok_s']:.0f} tok/s, peak {h['peak_mem_gb']:.1f} GB")
PY
