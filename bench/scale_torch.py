#!/usr/bin/env python3
"""The PyTorch + HF transformers reference of bench/scale_bench.c (issue 13): the same Qwen2 config,
random init, the same batch shapes, one JSON line with the same fields.

  rollout: model.generate(do_sample=True, temperature 1, top_k 0, top_p 1, exactly N new tokens)
           on P*G sequences (each of the P random prompts of L tokens repeated G times);
  train:   a GRPO-like step over those P*G sequences in micro-batches of 16: first log pi_old of
           the completion tokens (no-grad forward, as fp4rl's step does before its loss; leave it
           out with --no-old-logprobs), then forward, log-probs (log_softmax in FP32),
           loss = -(adv * exp(logp - logp_old)).mean() (the gradient of -(adv * logp).mean() at
           ratio 1) with GRPO advantages of the same reward as scale_bench.c (fraction of even
           token ids), backward (gradients accumulate), then one torch.optim.AdamW step.
  --master bf16 (default): parameters, gradients and AdamW moments all BF16, the typical eager
           baseline; --master fp32: FP32 parameters and AdamW with torch.autocast(bfloat16)
           forward (mixed precision, what fp4rl's FP32 master weights correspond to).
  Attention: --attn sdpa (default) or eager; the line says which ran.
Step 1 of --steps is a warm-up; the last step is reported. Peak memory is
torch.cuda.max_memory_allocated over the whole run. A failure (out of memory, say) is a result:
"ok": false with the error, exit status 0.

  python3 bench/scale_torch.py CONFIG.json [--prompts P] [--group G] [--prompt-len L]
                               [--new-tokens N] [--steps S] [--attn sdpa|eager] [--master bf16|fp32]
"""
import argparse
import json
import os
import sys
import time


def model_name(path):
    base = os.path.basename(path)
    if base == "config.json":
        return os.path.basename(os.path.dirname(os.path.abspath(path)))
    return base[:-5] if base.endswith(".json") else base


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    ap.add_argument("--master", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--no-old-logprobs", dest="old_logprobs", action="store_false")
    ap.add_argument("--rollout-only", action="store_true", help="generate only (the rollout engine's baseline)")
    a = ap.parse_args()
    P, G, L, N = a.prompts, a.group, a.prompt_len, a.new_tokens
    res = {"impl": "torch", "model": model_name(a.config), "numerics": "bf16", "device": "cuda", "ok": False,
           "prompts": P, "group": G, "batch": P * G, "prompt_len": L, "new_tokens": N, "steps": a.steps,
           "attn": a.attn, "master": a.master, "old_logprobs": a.old_logprobs, "optimizer": f"torch.optim.AdamW ({a.master} params)",
           "create_s": None, "rollout_s": None, "train_s": None, "step_s": None, "rollout_tok_s": None,
           "train_tok_s": None, "reward_mean": None, "peak_mem_gb": None, "reserved_mem_gb": None}
    try:
        import torch
        res["torch"] = torch.__version__
        run(a, res, torch)
        res["ok"] = True
    except Exception as e:  # a failure is a result: report it
        res["error"] = f"{type(e).__name__}: {e}"[:2000]
    try:
        import torch
        if torch.cuda.is_available():
            res["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
            res["reserved_mem_gb"] = torch.cuda.max_memory_reserved() / 2**30
    except Exception:
        pass
    print(json.dumps(res), flush=True)


def completion_logp(model, x, L, autocast, torch):
    """Log-probs [batch, N] of the completion tokens x[:, L:] (log_softmax in FP32)."""
    with autocast:
        logits = model(input_ids=x).logits[:, L - 1:-1]  # position t predicts token t + 1
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, x[:, L:, None]).squeeze(-1)


def run(a, res, torch):
    import transformers
    from transformers import Qwen2Config, Qwen2ForCausalLM

    res["transformers"] = transformers.__version__
    P, G, L, N = a.prompts, a.group, a.prompt_len, a.new_tokens
    with open(a.config) as f:
        cfg = Qwen2Config.from_dict(json.load(f))
    cfg._attn_implementation = a.attn
    dtype = torch.bfloat16 if a.master == "bf16" else torch.float32
    dev = torch.device("cuda")
    torch.manual_seed(1234)

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    with dev:  # initialise on the GPU, as fp4rl_model_create does
        model = Qwen2ForCausalLM(cfg)
    torch.set_default_dtype(old_dtype)
    torch.cuda.synchronize()
    res["create_s"] = time.perf_counter() - t0
    res["attn"] = getattr(model.config, "_attn_implementation", a.attn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.master == "fp32")

    g = torch.Generator(device="cpu").manual_seed(1)
    prompts = torch.randint(0, min(1000, cfg.vocab_size), (P, L), generator=g).to(dev)
    prompts = prompts.repeat_interleave(G, dim=0)  # sequence i belongs to prompt i // G
    gen_kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=N, min_new_tokens=N,
                  pad_token_id=0, attention_mask=torch.ones_like(prompts))
    if a.rollout_only and a.steps == 1:  # one timed step: warm generate's kernels and cuBLAS up first
        model.eval()
        with torch.no_grad(), autocast:
            model.generate(prompts[:8], **dict(gen_kw, max_new_tokens=8, min_new_tokens=8, attention_mask=torch.ones_like(prompts[:8])))
    for step in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad(), autocast:
            seqs = model.generate(prompts, **gen_kw)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        assert seqs.shape == (P * G, L + N), f"generate returned {tuple(seqs.shape)}, not {(P * G, L + N)}"
        if a.rollout_only:
            res.update(rollout_s=t1 - t0, train_s=0.0, step_s=t1 - t0, rollout_tok_s=P * G * N / (t1 - t0))
            continue
        completion = seqs[:, L:]
        reward = (completion % 2 == 0).float().mean(dim=1).view(P, G)
        adv = ((reward - reward.mean(dim=1, keepdim=True)) / (reward.std(dim=1, keepdim=True) + 1e-6)).view(-1)

        mb = a.micro_batch
        n_micro = (P * G + mb - 1) // mb
        logp_old = []
        if a.old_logprobs:
            with torch.no_grad():
                for i in range(0, P * G, mb):
                    logp_old.append(completion_logp(model, seqs[i:i + mb], L, autocast, torch))
        model.train()
        for k, i in enumerate(range(0, P * G, mb)):
            logp = completion_logp(model, seqs[i:i + mb], L, autocast, torch)
            ratio = torch.exp(logp - logp_old[k]) if logp_old else logp
            loss = -(adv[i:i + mb, None] * ratio).mean() / n_micro
            loss.backward()
            del logp, ratio, loss
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        res.update(rollout_s=t1 - t0, train_s=t2 - t1, step_s=t2 - t0, reward_mean=reward.mean().item(),
                   rollout_tok_s=P * G * N / (t1 - t0), train_tok_s=P * G * (L + N) / (t2 - t1))


if __name__ == "__main__":
    sys.exit(main())
