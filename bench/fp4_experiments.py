#!/usr/bin/env python3
"""One FP4 RL experiment (issue 18): a supervised warm-up, optional function-preserving outlier
injection, then GRPO with the chosen numerics; one JSONL row per RL step plus a summary JSON.

    python3 bench/fp4_experiments.py --train fp4 --rollout w4a4 --format hif4 --resq 2_4 \
        --task multistep --size small --device cuda --seed 1 --rl-steps 60 --out runs/one

Everything goes through the Python binding's public API (fp4rl.Context, QuantPolicy, Model,
RLSession). What each knob means:

- ``--train`` (fp32/bf16/fp4) is the trainer's numerics, ``--rollout`` (bf16/w4a16/w16a4/w4a4) the
  rollout's, ``--format`` (hif4/mxfp4/nvfp4) the FP4 format of weights, activations and gradients,
  ``--resq`` the Rollout-ResQ pattern (off/dense/2_4/channel_50/block_50). The base is the
  ``hif4_rl`` preset (1D blocks, OCP-floor scales, stochastic rounding on gradients) with these
  overrides, so HiF4 and MXFP4 arms differ only in the format.
- The warm-up is supervised (teacher-forced answers) in ``--warmup-numerics`` (default bf16),
  for a fixed number of steps (or until ``--warmup-accuracy``). It depends only on the task, the
  size and the seed, so every recipe of a seed starts RL from the same weights; with
  ``--warmup-cache DIR`` it is computed once and reused (safetensors + JSON).
- Outlier injection (``--outlier-scale S --outlier-channels K``): in every layer the same K
  channels of input_layernorm and post_attention_layernorm are multiplied by S and the matching
  input columns of q/k/v and of gate/up are divided by S. In exact arithmetic the model's function
  is unchanged (with a power-of-two S also in floating point); an FP4 activation quantizer now
  sees LLM-like outlier channels. The summary records the FP32 logit change and the rollout's
  ``quant/act_zero_frac`` before and after injection.
- Held-out accuracy: greedy decoding in the rollout numerics on a fixed set (the same for every
  seed), every ``--eval-every`` steps and at the end.

Tasks (``--task``): ``addition`` (2-digit a + b, answer digits then a stop token) and
``multistep`` (a op b op c with op in {+, -}, 2-digit operands, every intermediate result
non-negative; worked-answer format ``r1 ; r2 <end>`` where r1 = a op b and r2 = r1 op c). The
multistep reward is 1 for a completion whose final result r2 is exactly right and well formed
(digits, ';', digits, stop token), else ``--partial-credit`` (default 0) if only r1 is right, else 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import fp4rl  # noqa: E402

# ---- model sizes: Qwen2-shaped, tied embeddings ---------------------------------------------
SIZES = {
    # CPU CI: a few steps in seconds
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    # the demo's model
    "demo": dict(hidden_size=96, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2),
    # GPU sizes
    "small": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2),
    "medium": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                   num_key_value_heads=2),
}


def model_config(size: str, vocab: int, max_pos: int = 64) -> dict:
    return {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": vocab,
            "max_position_embeddings": max_pos, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True, **SIZES[size]}


# ---- tasks ----------------------------------------------------------------------------------
def _digits(x: int) -> list[int]:
    return [int(c) for c in str(x)]


def _read_number(tokens, i):
    """(value, next index) of the digit run at i, or (None, i) when there is none."""
    j = i
    while j < len(tokens) and 0 <= tokens[j] <= 9 and j - i < 6:
        j += 1
    if j == i:
        return None, i
    return int("".join(str(t) for t in tokens[i:j])), j


class AdditionTask:
    """2-digit a + b; 0..9 digits, 10 '+', 11 '=', 12 end of answer (stop), 13 start of prompt."""

    name = "addition"
    PLUS, EQ, END, BOS = 10, 11, 12, 13
    vocab = 16
    max_new_tokens = 4
    seq_len = 12

    def sample(self, rng: random.Random):
        return (rng.randint(0, 99), rng.randint(0, 99))

    def prompt(self, p):
        a, b = p
        return [self.BOS, *_digits(a), self.PLUS, *_digits(b), self.EQ]

    def answer(self, p):
        return _digits(p[0] + p[1]) + [self.END]

    def reward(self, p, completion, partial_credit=0.0) -> float:
        return 1.0 if list(completion) == self.answer(p) else 0.0

    def correct(self, p, completion) -> bool:
        return list(completion) == self.answer(p)


class MultiStepTask:
    """a op1 b op2 c = r1 ; r2 <end>, op in {+, -}, 2-digit operands, r1 and r2 >= 0.
    Vocabulary: 0..9 digits, 10 '+', 11 '-', 12 '=', 13 ';', 14 end (stop), 15 start of prompt."""

    name = "multistep"
    PLUS, MINUS, EQ, SEP, END, BOS = 10, 11, 12, 13, 14, 15
    vocab = 16
    max_new_tokens = 9  # 3 + 1 + 3 digits, stop, one spare
    seq_len = 20

    def sample(self, rng: random.Random):
        while True:
            a, b, c = rng.randint(0, 99), rng.randint(0, 99), rng.randint(0, 99)
            o1, o2 = rng.choice("+-"), rng.choice("+-")
            r1 = a + b if o1 == "+" else a - b
            r2 = r1 + c if o2 == "+" else r1 - c
            if r1 >= 0 and r2 >= 0:
                return (a, o1, b, o2, c)

    @staticmethod
    def results(p):
        a, o1, b, o2, c = p
        r1 = a + b if o1 == "+" else a - b
        return r1, (r1 + c if o2 == "+" else r1 - c)

    def prompt(self, p):
        a, o1, b, o2, c = p
        op = {"+": self.PLUS, "-": self.MINUS}
        return [self.BOS, *_digits(a), op[o1], *_digits(b), op[o2], *_digits(c), self.EQ]

    def answer(self, p):
        r1, r2 = self.results(p)
        return _digits(r1) + [self.SEP] + _digits(r2) + [self.END]

    def parse(self, completion):
        """(r1, r2) of a well-formed completion 'digits ; digits <end>', else (r1 or None, None)."""
        t = list(completion)
        r1, i = _read_number(t, 0)
        if r1 is None or i >= len(t) or t[i] != self.SEP:
            return r1, None
        r2, j = _read_number(t, i + 1)
        if r2 is None or j != len(t) - 1 or t[j] != self.END:
            return r1, None
        return r1, r2

    def reward(self, p, completion, partial_credit=0.0) -> float:
        r1, r2 = self.results(p)
        g1, g2 = self.parse(completion)
        if g2 is not None and g2 == r2:
            return 1.0
        return float(partial_credit) if g1 == r1 else 0.0

    def correct(self, p, completion) -> bool:
        _, r2 = self.results(p)
        return self.parse(completion)[1] == r2


TASKS = {"addition": AdditionTask, "multistep": MultiStepTask}


class Problems:
    """A batch of problems; the reward looks a completion's problem up by prompt index."""

    def __init__(self, task, rng: random.Random, n: int, partial_credit: float = 0.0):
        self.task = task
        self.items = [task.sample(rng) for _ in range(n)]
        self.prompts = [task.prompt(p) for p in self.items]
        self.partial_credit = partial_credit

    def reward(self, prompt_index, prompt, completion):
        return self.task.reward(self.items[prompt_index], completion, self.partial_credit)


def teacher_forced_batch(task, rng: random.Random, batch: int):
    tokens = np.zeros((batch, task.seq_len), np.int32)
    mask = np.zeros((batch, task.seq_len), np.float32)
    lengths = np.zeros(batch, np.int32)
    for b in range(batch):
        p = task.sample(rng)
        pr, ans = task.prompt(p), task.answer(p)
        seq = pr + ans
        tokens[b, :len(seq)] = seq
        mask[b, len(pr):len(seq)] = 1.0
        lengths[b] = len(seq)
    return tokens, lengths, mask


def held_out_set(task, n: int) -> Problems:
    """The same held-out problems for every seed and recipe."""
    return Problems(task, random.Random(1_000_003), n)


def accuracy(evaluator, task, problems: Problems) -> float:
    """Greedy held-out accuracy (the evaluator has top_k 1) in the model's rollout numerics."""
    comps = evaluator.rollout(problems.prompts)
    g = int(evaluator.get("group_size"))
    right = sum(task.correct(problems.items[c.prompt_index], c.tokens.tolist()) for c in comps[::g])
    return right / len(problems.prompts)


# ---- numerics ---------------------------------------------------------------------------------
def policy_params(train: str, rollout: str, fmt: str, resq: str = "off") -> dict:
    """QuantPolicy keyword arguments of a recipe: the hif4_rl preset with these overrides."""
    return dict(format_weight=fmt, format_activation=fmt, format_gradient=fmt,
                train_numerics=train, rollout_numerics=rollout, resq=resq)


def make_policy(train: str, rollout: str, fmt: str, resq: str = "off") -> fp4rl.QuantPolicy:
    return fp4rl.QuantPolicy("hif4_rl", **policy_params(train, rollout, fmt, resq))


# ---- outlier injection ------------------------------------------------------------------------
def outlier_channels(hidden: int, k: int, seed: int = 1234) -> list[int]:
    """K channels, the same in every layer and every run (LLM outlier features sit in fixed dims)."""
    return sorted(int(c) for c in np.random.default_rng(seed).choice(hidden, size=k, replace=False))


def _layer_pairs(names):
    """(norm, [following linears]) for each decoder layer's two RMSNorms."""
    out = []
    layers = sorted({int(n.split(".")[2]) for n in names if n.startswith("model.layers.")})
    for i in layers:
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight",
                    [p + f"self_attn.{x}_proj.weight" for x in ("q", "k", "v")]))
        out.append((p + "post_attention_layernorm.weight",
                    [p + f"mlp.{x}_proj.weight" for x in ("gate", "up")]))
    return out


def inject_outliers_state(state: dict, channels, scale: float) -> dict:
    """A copy of a state dict (HF names -> float32 arrays) with the injection applied."""
    out = {k: np.array(v, dtype=np.float32, copy=True) for k, v in state.items()}
    ch = np.asarray(list(channels), dtype=np.int64)
    for norm, linears in _layer_pairs(out.keys()):
        out[norm][ch] *= np.float32(scale)
        for lin in linears:
            out[lin][:, ch] /= np.float32(scale)  # [out, in]: the input columns
    return out


def inject_outliers(model: fp4rl.Model, channels, scale: float) -> None:
    """The injection on a model, through get_param / set_param."""
    names = model.param_names
    state = {n: model.get_param(n) for pair in _layer_pairs(names) for n in [pair[0], *pair[1]]}
    for name, value in inject_outliers_state(state, channels, scale).items():
        model.set_param(name, value)


def fp32_logits(model: fp4rl.Model, policy: fp4rl.QuantPolicy, tokens) -> np.ndarray:
    """Logits in FP32 numerics (the model's policy is restored after)."""
    model.set_policy(fp4rl.QuantPolicy(train_numerics="fp32"))
    try:
        return model.logits(tokens)
    finally:
        model.set_policy(policy)


def measure_step_metrics(ctx, config, state, policy, task, prompts, seed: int, group_size: int = 4) -> dict:
    """One RL step's metrics on a throwaway copy of the weights (the rollout metrics such as
    quant/act_zero_frac are only published by a full step); the caller's model is untouched."""
    m = fp4rl.Model(ctx, config, policy, seed=seed)
    try:
        m.load_state_dict(state)
        with fp4rl.RLSession(ctx, m, policy, stop_tokens=[task.END], group_size=group_size,
                             max_new_tokens=task.max_new_tokens, lr=1e-9, seed=seed) as s:
            return s.step(prompts, lambda i, p, c: float(len(c) % 2))
    finally:
        m.close()


# ---- the warm-up -----------------------------------------------------------------------------
def make_context(device: str, seed: int) -> fp4rl.Context:
    ctx = fp4rl.Context("cuda", 0) if device == "cuda" else fp4rl.Context("cpu")
    ctx.seed = seed
    return ctx


def warmup(ctx, config, task, seed, steps, batch, lr, target_acc, numerics, eval_every, held_out, log=print):
    """Supervised warm-up from a random init; returns (state dict, info)."""
    pol = fp4rl.QuantPolicy("hif4_rl", train_numerics=numerics, rollout_numerics="bf16" if numerics != "fp4" else "w4a4")
    model = fp4rl.Model(ctx, config, pol, seed=seed, lr=lr, grad_clip=1.0)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    acc, loss, done = 0.0, float("nan"), 0
    with fp4rl.RLSession(ctx, model, stop_tokens=[task.END], group_size=2, top_k=1,
                         max_new_tokens=task.max_new_tokens) as ev:
        for step in range(1, steps + 1):
            loss, _ = model.train_step(*teacher_forced_batch(task, rng, batch))
            done = step
            if step % eval_every == 0 or step == steps:
                acc = accuracy(ev, task, held_out)
                log(f"  warm-up {step:5d}  loss {loss:.4f}  held-out {100 * acc:5.1f}%  ({time.perf_counter() - t0:.0f} s)")
                if target_acc is not None and acc >= target_acc:
                    break
    state = model.state_dict(copy=True)
    model.close()
    return state, {"steps": done, "loss": float(loss), "accuracy": acc, "numerics": numerics,
                   "seconds": time.perf_counter() - t0}


def cached_warmup(args, ctx, config, task, held_out, log=print):
    key = (f"{task.name}_{args.size}_s{args.seed}_w{args.warmup_steps}_b{args.warmup_batch}"
           f"_lr{args.warmup_lr:g}_{args.warmup_numerics}_t{args.warmup_accuracy}")
    path = os.path.join(args.warmup_cache, key) if args.warmup_cache else None
    if path and os.path.exists(path + ".json") and os.path.exists(path + ".safetensors"):
        with open(path + ".json") as f:
            info = json.load(f)
        m = fp4rl.Model(ctx, config, None, seed=args.seed)
        m.load(path + ".safetensors")
        state = m.state_dict(copy=True)
        m.close()
        info["cached"] = True
        return state, info
    state, info = warmup(ctx, config, task, args.seed, args.warmup_steps, args.warmup_batch, args.warmup_lr,
                         args.warmup_accuracy, args.warmup_numerics, args.warmup_eval_every, held_out, log)
    if path:
        os.makedirs(args.warmup_cache, exist_ok=True)
        m = fp4rl.Model(ctx, config, None, seed=args.seed)
        m.load_state_dict(state)
        m.save(path + ".safetensors")
        m.close()
        with open(path + ".json.tmp", "w") as f:
            json.dump(info, f)
        os.replace(path + ".json.tmp", path + ".json")
    info["cached"] = False
    return state, info


# ---- the run ---------------------------------------------------------------------------------
def _clean(x):
    """JSON-safe: non-finite floats become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return _clean(x.item())
    return x


def _mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


SUMMARY_MEANS = ("reward/mean", "quant/act_zero_frac", "mismatch/logp_abs_diff_mean", "mismatch/logp_abs_diff_max",
                 "mismatch/k3_kl", "tis/mean", "tis/max", "tis/capped_frac", "entropy", "pg/clipfrac_high",
                 "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "time/step_s")


def run(args, log=print) -> dict:
    """One experiment; writes OUT/metrics.jsonl and OUT/summary.json and returns the summary."""
    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    task = TASKS[args.task]()
    config = model_config(args.size, task.vocab)
    ctx = make_context(args.device, args.seed)
    held_out = held_out_set(task, args.eval_n)

    state, warm = cached_warmup(args, ctx, config, task, held_out, log)
    policy = make_policy(args.train, args.rollout, args.format, args.resq)

    outliers = None
    if args.outlier_scale != 1.0 and args.outlier_channels > 0:
        chans = outlier_channels(config["hidden_size"], args.outlier_channels)
        probe = held_out.prompts[:8]
        before = measure_step_metrics(ctx, config, state, policy, task, probe, args.seed)
        m = fp4rl.Model(ctx, config, policy, seed=args.seed)
        m.load_state_dict(state)
        toks = np.array([(p + task.answer(it))[:task.seq_len] + [0] * (task.seq_len - len(p + task.answer(it)))
                         for p, it in zip(held_out.prompts[:16], held_out.items[:16])], np.int32)
        l0 = fp32_logits(m, policy, toks)
        inject_outliers(m, chans, args.outlier_scale)
        l1 = fp32_logits(m, policy, toks)
        state = m.state_dict(copy=True)
        m.close()
        after = measure_step_metrics(ctx, config, state, policy, task, probe, args.seed)
        outliers = {"scale": args.outlier_scale, "channels": chans,
                    "fp32_logit_max_abs_diff": float(np.max(np.abs(l1 - l0))),
                    "fp32_logit_max_abs": float(np.max(np.abs(l0))),
                    "act_zero_frac_before": before["quant/act_zero_frac"],
                    "act_zero_frac_after": after["quant/act_zero_frac"],
                    "logp_abs_diff_before": before["mismatch/logp_abs_diff_mean"],
                    "logp_abs_diff_after": after["mismatch/logp_abs_diff_mean"]}
        log(f"  outliers x{args.outlier_scale:g} on {len(chans)} channels: FP32 logits change "
            f"{outliers['fp32_logit_max_abs_diff']:.2e}; act_zero_frac {before['quant/act_zero_frac']:.4f} -> "
            f"{after['quant/act_zero_frac']:.4f}")

    model = fp4rl.Model(ctx, config, policy, seed=args.seed)
    model.load_state_dict(state)
    jsonl = os.path.join(args.out, "metrics.jsonl")
    session = fp4rl.RLSession(ctx, model, policy, stop_tokens=[task.END], group_size=args.group_size,
                              max_new_tokens=task.max_new_tokens, lr=args.lr, clip_high=args.clip_high,
                              tis_cap=args.tis_cap, seed=args.seed)
    evaluator = fp4rl.RLSession(ctx, model, stop_tokens=[task.END], group_size=2, top_k=1,
                                max_new_tokens=task.max_new_tokens)
    acc_before = accuracy(evaluator, task, held_out)
    log(f"  {args.train}/{args.rollout} {args.format} resq {args.resq} seed {args.seed}: held-out {100 * acc_before:.1f}% before RL")
    rng = random.Random(args.seed * 7919 + 17)
    rows = []
    with open(jsonl + ".tmp", "w") as f:
        for step in range(1, args.rl_steps + 1):
            batch = Problems(task, rng, args.prompts_per_step, args.partial_credit)
            t0 = time.perf_counter()
            m = session.step(batch.prompts, batch.reward)
            wall = time.perf_counter() - t0
            acc = None
            if step % args.eval_every == 0 or step == args.rl_steps:
                acc = accuracy(evaluator, task, held_out)
            ntok = m["response_length/mean"] * args.prompts_per_step * args.group_size
            row = {"step": step, "eval/accuracy": acc, **{k: v for k, v in m.items() if k != "step"},
                   "wall/step_s": wall, "wall/tokens_per_s": ntok / wall if wall > 0 else None}
            rows.append(row)
            f.write(json.dumps(_clean(row)) + "\n")
            f.flush()
            if acc is not None or step == 1:
                log(f"  step {step:4d} reward {m['reward/mean']:.3f} acc {'' if acc is None else f'{100 * acc:.1f}%'} "
                    f"act_zero {m['quant/act_zero_frac']:.4f} mismatch {m['mismatch/logp_abs_diff_mean']:.4f} "
                    f"tis {m['tis/mean']:.3f}")
    os.replace(jsonl + ".tmp", jsonl)
    acc_after = rows[-1]["eval/accuracy"] if rows else acc_before
    k = max(1, len(rows) // 5)
    summary = {
        "recipe": {"train": args.train, "rollout": args.rollout, "format": args.format, "resq": args.resq,
                   "tis_cap": args.tis_cap},
        "task": args.task, "size": args.size, "seed": args.seed, "device": ctx.device,
        "fp4rl_version": fp4rl.version(), "policy": policy.to_dict(), "model": model.info,
        "session_hparams": session.hparams, "prompts_per_step": args.prompts_per_step, "rl_steps": args.rl_steps,
        "partial_credit": args.partial_credit, "eval_n": args.eval_n, "warmup": warm, "outliers": outliers,
        "acc_before": acc_before, "acc_after": acc_after, "acc_gain": acc_after - acc_before,
        "acc_curve": [[0, acc_before]] + [[r["step"], r["eval/accuracy"]] for r in rows if r["eval/accuracy"] is not None],
        "reward_curve": [[r["step"], r["reward/mean"]] for r in rows],
        "reward_first": _mean([r["reward/mean"] for r in rows[:k]]),
        "reward_last": _mean([r["reward/mean"] for r in rows[-k:]]),
        "means": {name: _mean([r.get(name) for r in rows]) for name in SUMMARY_MEANS},
        "wall_s": time.perf_counter() - t_start,
    }
    summary = _clean(summary)
    with open(os.path.join(args.out, "summary.json.tmp"), "w") as f:
        json.dump(summary, f, indent=1)
    os.replace(os.path.join(args.out, "summary.json.tmp"), os.path.join(args.out, "summary.json"))
    evaluator.close()
    session.close()
    model.close()
    ctx.close()
    log(f"  held-out {100 * acc_before:.1f}% -> {100 * acc_after:.1f}% ({100 * (acc_after - acc_before):+.1f} points), "
        f"{summary['wall_s']:.0f} s")
    return summary


def add_arguments(ap: argparse.ArgumentParser, recipe: bool = True) -> None:
    if recipe:
        ap.add_argument("--train", default="fp4", choices=["fp32", "bf16", "fp4"], help="training numerics")
        ap.add_argument("--rollout", default="w4a4", choices=["bf16", "w4a16", "w16a4", "w4a4"], help="rollout numerics")
        ap.add_argument("--format", default="hif4", choices=["hif4", "mxfp4", "nvfp4"])
        ap.add_argument("--resq", default="off", choices=["off", "dense", "2_4", "channel_50", "block_50"])
        ap.add_argument("--seed", type=int, default=1)
        ap.add_argument("--out", default="fp4_experiment_out")
    ap.add_argument("--tis-cap", type=float, default=5.0, help="truncated importance sampling cap (0 = off)")
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--task", default="multistep", choices=sorted(TASKS))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rl-steps", type=int, default=40)
    ap.add_argument("--prompts-per-step", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4, help="RL learning rate")
    ap.add_argument("--clip-high", type=float, default=0.28)
    ap.add_argument("--partial-credit", type=float, default=0.0, help="multistep: reward for a right intermediate only")
    ap.add_argument("--eval-n", type=int, default=256, help="held-out problems")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--warmup-steps", type=int, default=1500)
    ap.add_argument("--warmup-batch", type=int, default=64)
    ap.add_argument("--warmup-lr", type=float, default=2e-3)
    ap.add_argument("--warmup-accuracy", type=float, default=None, help="stop the warm-up early at this held-out accuracy")
    ap.add_argument("--warmup-numerics", default="bf16", choices=["fp32", "bf16", "fp4"])
    ap.add_argument("--warmup-eval-every", type=int, default=250)
    ap.add_argument("--warmup-cache", default=None, help="directory to reuse warm-ups across runs")
    ap.add_argument("--outlier-scale", type=float, default=1.0, help="1 = no injection")
    ap.add_argument("--outlier-channels", type=int, default=4)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    run(args, log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    sys.exit(main())
