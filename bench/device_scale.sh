#!/usr/bin/env bash
# Issue 13's scale benchmark on the GPU machine, from the repo root, with the binaries built here
# and carried as .devrun/pkg.tar.xz (bash tools/devpack.sh build/.../bench/fp4rl_scale_bench):
# fp4rl_scale_bench in each numerics and bench/scale_torch.py for each size and batch, in the same
# call. Every run is under `timeout`; a run that fails or times out still leaves a line ("ok": false).
# Lines go to $OUT/scale.jsonl; the last thing printed is a markdown table with fp4rl/torch ratios.
# Usage: bash bench/device_scale.sh [small|large|both] [sizes=0.5b,1.5b,3b] [numerics=bf16,hif4]
#                                  [torch=bf16[,fp32]|none] [moments=fp32|bf16] [steps=2] [limit=SECONDS] [budget=570] [batch=P,G,L,N]
#        bash bench/device_scale.sh table FILE.jsonl...   (only the table, from earlier lines)
#   small: 16 prompts x 8 completions of 128 + 256 tokens; large: 64 x 8 of 256 + 512.
#   limit: per run (default 300 small, 540 large); budget: for the whole call (the device's
#   600 s per command): a run gets at most what is left of it, and none once under 20 s is left.
#   torch=fp32 adds the mixed-precision baseline (FP32 master weights and AdamW, BF16 autocast).
set -uo pipefail

table() { # the markdown table of JSONL files: one row per model, batch and fp4rl numerics
  python3 - "$@" <<'EOF'
import json, sys
rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.strip().startswith("{")]
key = lambda r: (r["model"], r["prompts"], r["group"], r["prompt_len"], r["new_tokens"])
torch = {}
for r in rows:
    if r["impl"] == "torch" and r.get("master", "bf16") == "bf16":
        torch[key(r)] = r
def num(v, f="{:.0f}"):
    return "-" if v is None else f.format(v)
def ratio(a, b):
    return "-" if a is None or b in (None, 0) else f"{a / b:.2f}"
print("| model | batch | impl | numerics | ok | create s | rollout s | train s | rollout tok/s | train tok/s"
      " | peak GB | rollout x torch | train x torch | peak x torch |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in sorted(rows, key=lambda r: (key(r), r["impl"] != "torch", r["numerics"], r.get("master", ""))):
    t = torch.get(key(r), {}) if r["impl"] == "fp4rl" else {}
    name = r["impl"] + (f" ({r['master']} master, {r['attn']})" if r["impl"] == "torch" else "")
    ok = "yes" if r["ok"] else "NO: " + str(r.get("error", ""))[:80].replace("|", "/")
    print(f"| {r['model']} | {r['prompts']}x{r['group']} of {r['prompt_len']}+{r['new_tokens']} | {name}"
          f" | {r['numerics']} | {ok} | {num(r['create_s'], '{:.2f}')} | {num(r['rollout_s'], '{:.2f}')}"
          f" | {num(r['train_s'], '{:.2f}')} | {num(r['rollout_tok_s'])} | {num(r['train_tok_s'])}"
          f" | {num(r['peak_mem_gb'], '{:.1f}')} | {ratio(r['rollout_tok_s'], t.get('rollout_tok_s'))}"
          f" | {ratio(r['train_tok_s'], t.get('train_tok_s'))} | {ratio(r['peak_mem_gb'], t.get('peak_mem_gb'))} |")
EOF
}

if [ "${1:-}" = table ]; then shift; table "$@"; exit; fi

moments=fp32 custom= mode=small sizes=0.5b,1.5b,3b numerics=bf16,hif4 torchs=bf16 steps=2 limit= budget=570
for a in "$@"; do
  case $a in
  small|large|both) mode=$a ;;
  sizes=*) sizes=${a#sizes=} ;;
  numerics=*) numerics=${a#numerics=} ;;
  torch=*) torchs=${a#torch=} ;;
  steps=*) steps=${a#steps=} ;;
  moments=*) moments=${a#moments=} ;;
  limit=*) limit=${a#limit=} ;;
  budget=*) budget=${a#budget=} ;;
  batch=*) custom=${a#batch=}; custom=${custom//,/ } ;; # batch=P,G,L,N: prompts, group, prompt and new tokens
  *) echo "unknown argument: $a (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
case $mode in
small) batches=("16 8 128 256") ;;
large) batches=("64 8 256 512") ;;
both) batches=("16 8 128 256" "64 8 256 512") ;;
esac
[ -n "${custom:-}" ] && batches=("$custom")
[ "$torchs" = none ] && torchs=

OUT=${OUT:-/tmp/out}
jsonl=$OUT/scale.jsonl
pkg=${FP4RL_PKG:-/tmp/fp4rl} # where the package is unpacked
mkdir -p "$OUT" "$pkg"
[ -x "$pkg/pkg/bin/fp4rl_scale_bench" ] || tar xJf .devrun/pkg.tar.xz -C "$pkg"
# the CUDA libraries the binaries load live in the pip packages of torch on that machine
for lib in libcublasLt.so.13 libnccl.so.2; do
  d=$(dirname "$(find / -name "$lib*" -not -path '/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
  LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}${d:-}
done
export LD_LIBRARY_PATH=$pkg/pkg/lib:$LD_LIBRARY_PATH OPENBLAS_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
bench_bin=$pkg/pkg/bin/fp4rl_scale_bench

# run NAME LIMIT CMD...: appends CMD's JSON line, or a failure line when it printed none
run() {
  local name=$1 lim=$2; shift 2
  local log=$OUT/$name.log t0=$SECONDS rc=125 line
  [ $((budget - SECONDS)) -lt "$lim" ] && lim=$((budget - SECONDS))
  : > "$log.out"
  if [ "$lim" -ge 20 ]; then
    timeout "$lim" "$@" > "$log.out" 2> "$log"
    rc=$?
  else
    echo "skipped: $lim s left of the call's budget of $budget s" > "$log"
  fi
  line=$(grep '^{' "$log.out" | tail -1)
  if [ -z "$line" ]; then
    line=$(python3 -c 'import json, sys; print(json.dumps({"impl": sys.argv[1], "model": sys.argv[2], "numerics": sys.argv[3],
"ok": False, "prompts": int(sys.argv[4]), "group": int(sys.argv[5]), "prompt_len": int(sys.argv[6]),
"new_tokens": int(sys.argv[7]), "master": sys.argv[8], "attn": "sdpa", "create_s": None, "rollout_s": None,
"train_s": None, "rollout_tok_s": None, "train_tok_s": None, "peak_mem_gb": None,
"error": "exit status %s after %ss (124 = timeout, 125 = not run); stderr: %s" % (sys.argv[9], sys.argv[10], sys.argv[11][-300:])}))' \
      "$impl" "$(basename "$cfg" .json)" "$num" $bt "${master:-}" "$rc" "$((SECONDS - t0))" "$(tail -c 300 "$log")")
  fi
  echo "$line" | tee -a "$jsonl"
}

for batch in "${batches[@]}"; do
  read -r P G L N <<< "$batch"
  bt="$P $G $L $N"
  lim=${limit:-$([ "$P" -gt 16 ] && echo 540 || echo 300)}
  for model in ${sizes//,/ }; do
    cfg=bench/configs/qwen2.5-$model.json
    impl=torch num=bf16
    for master in ${torchs//,/ }; do
      run "torch_${model}_${P}x${G}_${master}" "$lim" python3 bench/scale_torch.py "$cfg" --prompts "$P" --group "$G" \
        --prompt-len "$L" --new-tokens "$N" --steps "$steps" --master "$master"
    done
    impl=fp4rl master=
    for num in ${numerics//,/ }; do
      run "fp4rl_${model}_${P}x${G}_${num}" "$lim" "$bench_bin" "$cfg" --numerics "$num" --prompts "$P" --group "$G" \
        --prompt-len "$L" --new-tokens "$N" --steps "$steps" --moments "$moments"
    done
  done
done
echo
table "$jsonl"
