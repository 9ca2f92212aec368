#!/usr/bin/env python3
"""GRPO training in FP4 with a reward written in Python: a template to copy.

A Qwen2-shaped model learns multi-digit addition from scratch: a supervised warm-up until it is
partly right, then GRPO with the HiFloat4 recipe (HiF4 W4A4 rollout with Rollout-ResQ 2:4, FP4
training, truncated importance sampling), the reward computed here in Python. Held-out accuracy
is measured with greedy decoding in the rollout numerics before and after RL; every step's
metrics go to OUT/metrics.jsonl and the session is checkpointed to OUT/ckpt (resumable).

    python3 examples/python/grpo_train.py [--device cpu|cuda] [--out DIR] [--rl-steps N]
                                          [--seed S] [--resume]

To train your own model, replace the task section (prompts and reward) and the model/config
section (e.g. fp4rl.Model.from_pretrained(ctx, "path/to/hf_model_dir", policy)); tokens are plain
int ids, so tokenize and detokenize with your tokenizer around session.step.
"""

import argparse
import os
import random
import time

import numpy as np

import fp4rl

# ---- the task: a + b with the answer checked exactly, in a 16-token vocabulary -------------
# 0..9 digits, 10 '+', 11 '=', 12 end of answer (the stop token), 13 start of prompt
PLUS, EQ, END, BOS = 10, 11, 12, 13
MAX_OPERAND, MAX_ANSWER = 99, 5


def digits(x):
    return [int(c) for c in str(x)]


def make_prompt(a, b):
    return [BOS, *digits(a), PLUS, *digits(b), EQ]


def answer(a, b):
    return digits(a + b) + [END]


class AdditionProblems:
    """Prompts with their answers kept by index, so the reward can look the answer up."""

    def __init__(self, rng, n):
        self.pairs = [(rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)) for _ in range(n)]
        self.prompts = [make_prompt(a, b) for a, b in self.pairs]

    def reward(self, prompt_index, prompt, completion):
        """The reward function handed to fp4rl: 1 for exactly the right digits and the stop token.
        It gets the prompt's index in the batch, the prompt and the completion as token ids."""
        return 1.0 if list(completion) == answer(*self.pairs[prompt_index]) else 0.0


def teacher_forced_batch(rng, batch, seq_len):
    """Prompt + answer sequences for the supervised warm-up, with the loss on the answer only."""
    tokens = np.zeros((batch, seq_len), np.int32)
    mask = np.zeros((batch, seq_len), np.float32)
    lengths = np.zeros(batch, np.int32)
    for b in range(batch):
        a, c = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)
        p, ans = make_prompt(a, c), answer(a, c)
        seq = p + ans
        tokens[b, : len(seq)] = seq
        mask[b, len(p): len(seq)] = 1.0
        lengths[b] = len(seq)
    return tokens, lengths, mask


# ---- the model -----------------------------------------------------------------------------
CONFIG = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 16,
          "hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "max_position_embeddings": 32, "rope_theta": 10000.0,
          "rms_norm_eps": 1e-6, "tie_word_embeddings": True}


def accuracy(evaluator, problems):
    """Greedy held-out accuracy in the rollout numerics (the evaluator has top_k 1)."""
    completions = evaluator.rollout(problems.prompts)
    g = int(evaluator.get("group_size"))
    right = sum(problems.reward(c.prompt_index, None, c.tokens.tolist()) for c in completions[::g])
    return right / len(problems.prompts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--out", default="grpo_out")
    ap.add_argument("--rl-steps", type=int, default=60)
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--max-warmup-steps", type=int, default=3000)
    ap.add_argument("--warmup-accuracy", type=float, default=0.30, help="stop the warm-up at this held-out accuracy")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--resume", action="store_true", help="continue from OUT/ckpt")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()

    # a context: the GPU when asked for (or available, with "auto"), else the CPU
    ctx = None
    if args.device in ("auto", "cuda"):
        try:
            ctx = fp4rl.Context("cuda", 0)
        except (fp4rl.DeviceError, fp4rl.UnsupportedError) as e:
            if args.device == "cuda":
                raise
            print(f"note: no GPU ({e}); running on the CPU")
    ctx = ctx or fp4rl.Context("cpu")
    ctx.seed = args.seed  # stochastic rounding

    policy = fp4rl.QuantPolicy("hif4_rl")  # HiF4 everywhere, dY stochastic, W4A4 rollout, ResQ 2:4
    model = fp4rl.Model(ctx, CONFIG, policy, seed=args.seed, lr=2e-3, grad_clip=1.0)
    print(f"fp4rl {fp4rl.version()} on the {ctx.device.upper()}: {model.num_parameters} parameters; "
          f"policy {policy['format_weight']} W/X/dY, rollout {policy['rollout_numerics']}, ResQ {policy['resq']}")

    rng = random.Random(args.seed)
    held_out = AdditionProblems(random.Random(10_000 + args.seed), 256)
    evaluator = fp4rl.RLSession(ctx, model, stop_tokens=[END], group_size=2, top_k=1, max_new_tokens=MAX_ANSWER)
    session = fp4rl.RLSession(
        ctx, model, stop_tokens=[END],
        group_size=8, max_new_tokens=MAX_ANSWER, lr=5e-4, clip_high=0.28, seed=args.seed,
        metrics_file=os.path.join(args.out, "metrics.jsonl"))
    ckpt = os.path.join(args.out, "ckpt")

    if args.resume and os.path.isdir(ckpt):
        session.load(ckpt)  # weights, optimizer, step, random state, hyper-parameters
        print(f"resumed from {ckpt} at RL step {session.step_count}")
    else:
        # 1. supervised warm-up (FP4 training) until the model is partly right
        print("supervised warm-up:")
        t0 = time.perf_counter()
        for step in range(1, args.max_warmup_steps + 1):
            loss, _ = model.train_step(*teacher_forced_batch(rng, 64, 16))
            if step % 100 == 0:
                acc = accuracy(evaluator, held_out)
                print(f"  step {step:5d}  loss {loss:.4f}  held-out accuracy {100 * acc:5.1f}%  ({time.perf_counter() - t0:.0f} s)",
                      flush=True)
                if acc >= args.warmup_accuracy:
                    break
    acc_before = accuracy(evaluator, held_out)

    # 2. GRPO in FP4 with the Python reward
    print(f"\nFP4 RL ({args.prompts_per_step} prompts x {int(session.get('group_size'))} completions per step):")
    print(f"  {'step':>5} {'reward':>8} {'acc':>7} {'tis/mean':>9} {'mismatch':>9} {'act_zero':>9} {'tok/s':>8}")
    first = session.step_count
    for _ in range(args.rl_steps):
        batch = AdditionProblems(rng, args.prompts_per_step)
        m = session.step(batch.prompts, batch.reward)
        step = m["step"]
        acc = ""
        if step % 10 == 0 or step == first + args.rl_steps:
            acc = f"{100 * accuracy(evaluator, held_out):6.1f}%"
            session.save(ckpt)  # atomic: a crash never destroys the previous checkpoint
        print(f"  {step:5d} {m['reward/mean']:8.3f} {acc:>7} {m['tis/mean']:9.3f} {m['mismatch/logp_abs_diff_mean']:9.4f} "
              f"{100 * m['quant/act_zero_frac']:8.2f}% {m['perf/rollout_tokens_per_s']:8.0f}", flush=True)
    session.save(ckpt)
    model.save(os.path.join(args.out, "model.safetensors"))  # HF names, loadable by transformers
    acc_after = accuracy(evaluator, held_out)
    print(f"\nheld-out greedy accuracy: {100 * acc_before:.1f}% before RL, {100 * acc_after:.1f}% after "
          f"({100 * (acc_after - acc_before):+.1f} points); checkpoint in {ckpt}, metrics in "
          f"{os.path.join(args.out, 'metrics.jsonl')}; {time.perf_counter() - t_start:.0f} s in all")


if __name__ == "__main__":
    main()
