#!/usr/bin/env python3
"""The issue-18 matrices over seeds: RL recipes (``rl``) and FP4 pretraining (``pretrain``), with
tables (mean +- sample std over seeds) and SVG curves rendered into the output directory.

    python3 bench/fp4_matrix.py rl --out OUT --device cuda --size small --seeds 1,2,3,4,5
    python3 bench/fp4_matrix.py pretrain --out OUT --device cuda --size small --seeds 1,2,3
    python3 bench/fp4_matrix.py lr-sweep --out OUT --device cuda --size small --lrs 1e-4,2e-4,5e-4
    python3 bench/fp4_matrix.py disagreement --out OUT --device cuda --size medium --at 0,500,3000
    python3 bench/fp4_matrix.py render --out OUT          # tables and plots from what OUT holds

RL arms: BF16/BF16 (format-independent, run once per seed and shown in every format's column);
FP4 training with BF16, W4A16, W16A4, W4A4 and W4A4 + ResQ 2:4 rollouts; BF16 training with a W4A4
rollout; each for every ``--formats`` entry (default hif4,mxfp4). Every arm gets the same
hyper-parameters (this program's options, chosen once, written to OUT/matrix_config.json and
results.md); a seed's warm-up is shared by all its arms (OUT/warmup/). Each finished run leaves
OUT/runs/<arm>_s<seed>/summary.json and is skipped when the command is run again, so a matrix is
split into short runs with ``--time-budget S`` (no new run starts after S seconds) or with
``--recipes`` / ``--formats`` / ``--seeds`` subsets, repeated until everything is done; every
invocation re-renders OUT/results.md from all runs present. Changing a hyper-parameter against an
existing OUT is refused (use a new OUT).

Pretraining arms: BF16, MXFP4 1D with OCP-floor scales (the default preset), the stable 2D MXFP4
preset (2D tiles, truncation-free, SR on gradients, MXFP8 q/k), HiF4 1D (the default preset with
HiF4 formats); next-token loss on a generated corpus of worked arithmetic (both tasks' sequences,
loss on every token), the same data order in every arm (it depends on the seed only), eval loss
on a fixed held-out batch in BF16 numerics and in the arm's own numerics.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import fp4_experiments as fx  # noqa: E402
import fp4rl  # noqa: E402

# name, train numerics, rollout numerics, ResQ, whether the format matters
RECIPES = [
    ("bf16/bf16", "bf16", "bf16", "off", False),
    ("fp4/bf16", "fp4", "bf16", "off", True),
    ("fp4/w4a16", "fp4", "w4a16", "off", True),
    ("fp4/w16a4", "fp4", "w16a4", "off", True),
    ("fp4/w4a4", "fp4", "w4a4", "off", True),
    ("fp4/w4a4+resq2:4", "fp4", "w4a4", "2_4", True),
    ("bf16/w4a4", "bf16", "w4a4", "off", True),
]
RECIPE_NAMES = [r[0] for r in RECIPES]
NO_FORMAT = "any"


def slug(name: str) -> str:
    return name.replace("/", "-").replace("+", "_").replace(":", "")


def arms(recipes, formats):
    """(recipe tuple, format label) of each arm; format-independent recipes once."""
    out = []
    for r in RECIPES:
        if r[0] not in recipes:
            continue
        if r[4]:
            out += [(r, f) for f in formats]
        else:
            out.append((r, NO_FORMAT))
    return out


# ---- statistics --------------------------------------------------------------------------------
def mean_std(values):
    """(mean, sample std with n - 1, n) of the finite values; std is None for n < 2, mean None for n = 0."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return None, None, 0
    m = sum(xs) / n
    if n < 2:
        return m, None, n
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)), n


def mean_curve(curves):
    """Mean and sample std per x of several [[x, y], ...] curves (x values present in any)."""
    by_x: dict[float, list[float]] = {}
    for c in curves:
        for x, y in c:
            if y is not None:
                by_x.setdefault(x, []).append(y)
    out = []
    for x in sorted(by_x):
        m, s, n = mean_std(by_x[x])
        out.append((x, m, s or 0.0, n))
    return out


def fmt_ms(m, s, n, scale=1.0, digits=1):
    if m is None:
        return "-"
    spec = ".3g" if digits is None else f".{digits}f"  # None: 3 significant digits
    t = f"{scale * m:{spec}}"
    if s is not None:
        t += f" ± {scale * s:{spec}}"
    return t


# ---- SVG ---------------------------------------------------------------------------------------
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    t = math.floor(lo / step) * step
    out = []
    while t <= hi + 1e-9 * step:
        if t >= lo - 1e-9 * step:
            out.append(round(t, 10))
        t += step
    return out


def svg_lines(series, title, xlabel, ylabel, width=720, height=420):
    """An SVG line chart: series = [(label, [(x, mean, std, n), ...])], mean lines with +-std bands."""
    ml, mr, mt, mb = 60, 200, 36, 48
    pts = [(x, m, s) for _, c in series for x, m, s, _ in c if m is not None]
    if not pts:
        pts = [(0, 0, 0), (1, 1, 0)]
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] - p[2] for p in pts), max(p[1] + p[2] for p in pts)
    if x1 == x0:
        x1 = x0 + 1
    if y1 - y0 < 1e-9:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = 0.05 * (y1 - y0)
    y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - ml - mr, height - mt - mb

    def X(x):
        return ml + (x - x0) / (x1 - x0) * pw

    def Y(y):
        return mt + (1 - (y - y0) / (y1 - y0)) * ph

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="{ml + pw / 2}" y="20" text-anchor="middle" font-size="14">{_esc(title)}</text>',
         f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>']
    for t in _ticks(y0, y1):
        o.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{Y(t):.1f}" y2="{Y(t):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{ml - 6}" y="{Y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in _ticks(x0, x1):
        o.append(f'<text x="{X(t):.1f}" y="{mt + ph + 16}" text-anchor="middle">{t:g}</text>')
    o.append(f'<text x="{ml + pw / 2}" y="{height - 10}" text-anchor="middle">{_esc(xlabel)}</text>')
    o.append(f'<text x="16" y="{mt + ph / 2}" text-anchor="middle" transform="rotate(-90 16 {mt + ph / 2})">{_esc(ylabel)}</text>')
    for i, (label, c) in enumerate(series):
        col = COLORS[i % len(COLORS)]
        c = [p for p in c if p[1] is not None]
        if not c:
            continue
        if any(p[2] for p in c):
            up = " ".join(f"{X(x):.1f},{Y(m + s):.1f}" for x, m, s, _ in c)
            dn = " ".join(f"{X(x):.1f},{Y(m - s):.1f}" for x, m, s, _ in reversed(c))
            o.append(f'<polygon points="{up} {dn}" fill="{col}" fill-opacity="0.15" stroke="none"/>')
        o.append(f'<polyline points="{" ".join(f"{X(x):.1f},{Y(m):.1f}" for x, m, _, _ in c)}" fill="none" '
                 f'stroke="{col}" stroke-width="2"/>')
        ly = mt + 14 + 18 * i
        o.append(f'<line x1="{ml + pw + 12}" x2="{ml + pw + 36}" y1="{ly - 4}" y2="{ly - 4}" stroke="{col}" stroke-width="3"/>')
        o.append(f'<text x="{ml + pw + 42}" y="{ly}">{_esc(label)}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def _write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


# ---- the RL matrix -----------------------------------------------------------------------------
HPARAM_KEYS = ("tis_cap", "size", "task", "rl_steps", "prompts_per_step", "group_size", "lr", "clip_high",
               "partial_credit", "eval_n", "eval_every", "warmup_steps", "warmup_batch", "warmup_lr",
               "warmup_accuracy", "warmup_numerics", "outlier_scale", "outlier_channels")


def _check_config(out, cfg):
    path = os.path.join(out, "matrix_config.json")
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        diff = {k: (old.get(k), v) for k, v in cfg.items() if old.get(k) != v}
        if diff:
            raise SystemExit(f"{out} holds runs with other hyper-parameters {diff}; use a new --out")
    else:
        os.makedirs(out, exist_ok=True)
        _write(path, json.dumps(cfg, indent=1, sort_keys=True))


def run_rl(args, log=print):
    cfg = {k: getattr(args, k) for k in HPARAM_KEYS}
    _check_config(args.out, cfg)
    t0 = time.perf_counter()
    seeds = [int(s) for s in args.seeds.split(",")]
    pending = arms(args.recipes.split(",") if args.recipes != "all" else RECIPE_NAMES, args.formats.split(","))
    done = skipped = 0
    for seed in seeds:  # seed-major: a seed's warm-up is made once and reused by its arms
        for (name, train, rollout, resq, _), fmt in pending:
            d = os.path.join(args.out, "runs", f"{fmt}_{slug(name)}_s{seed}")
            if os.path.exists(os.path.join(d, "summary.json")):
                continue
            if args.time_budget and time.perf_counter() - t0 > args.time_budget:
                skipped += 1
                continue
            log(f"== {name} {fmt} seed {seed}")
            a = argparse.Namespace(**vars(args))
            a.train, a.rollout, a.resq, a.seed, a.out = train, rollout, resq, seed, d
            a.format = "hif4" if fmt == NO_FORMAT else fmt
            a.warmup_cache = args.warmup_cache or os.path.join(args.out, "warmup")
            s = fx.run(a, log=log)
            s["arm"] = {"recipe": name, "format": fmt}
            _write(os.path.join(d, "summary.json"), json.dumps(s, indent=1))
            done += 1
    if skipped:
        log(f"time budget reached: {skipped} runs left; run the same command again to continue")
    render_rl(args.out)
    log(f"{done} runs in {time.perf_counter() - t0:.0f} s; tables in {os.path.join(args.out, 'results.md')}")
    return skipped


def load_runs(out):
    runs = []
    root = os.path.join(out, "runs")
    for d in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        p = os.path.join(root, d, "summary.json")
        if os.path.exists(p):
            with open(p) as f:
                runs.append(json.load(f))
    return runs


STATS = [  # column, how to read it from a summary, scale, digits
    ("acc before %", lambda s: s["acc_before"], 100, 1),
    ("acc after %", lambda s: s["acc_after"], 100, 1),
    ("gain (points)", lambda s: s["acc_gain"], 100, 1),
    ("reward (last 20%)", lambda s: s["reward_last"], 1, 3),
    ("act_zero_frac %", lambda s: s["means"]["quant/act_zero_frac"], 100, 2),
    ("logp_abs_diff_mean", lambda s: s["means"]["mismatch/logp_abs_diff_mean"], 1, None),
    ("tis/mean", lambda s: s["means"]["tis/mean"], 1, 3),
    ("tis/max", lambda s: s["means"]["tis/max"], 1, 2),
    ("tis/capped_frac %", lambda s: s["means"]["tis/capped_frac"], 100, 2),
    ("rollout tok/s", lambda s: s["means"]["perf/rollout_tokens_per_s"], 1, 0),
]


def aggregate_rl(runs):
    """{(recipe, format): {column: (mean, std, n)}, ...} plus the curves."""
    groups: dict[tuple, list] = {}
    for s in runs:
        groups.setdefault((s["arm"]["recipe"], s["arm"]["format"]), []).append(s)
    agg = {}
    for key, ss in groups.items():
        row = {col: mean_std([get(s) for s in ss]) for col, get, _, _ in STATS}
        row["seeds"] = sorted(s["seed"] for s in ss)
        row["acc_curve"] = mean_curve([s["acc_curve"] for s in ss])
        row["reward_curve"] = mean_curve([s["reward_curve"] for s in ss])
        agg[key] = row
    return agg


def render_rl(out):
    runs = load_runs(out)
    agg = aggregate_rl(runs)
    with open(os.path.join(out, "matrix_config.json")) as f:
        cfg = json.load(f)
    formats = sorted({f for (_, f) in agg if f != NO_FORMAT}) or ["hif4"]
    lines = ["# FP4 RL recipe matrix", "",
             "Generated by `bench/fp4_matrix.py rl`. The same hyper-parameters for every arm: "
             + ", ".join(f"{k}={v}" for k, v in sorted(cfg.items())) + ".",
             f"Device: {runs[0]['device'] if runs else '-'}; fp4rl {runs[0]['fp4rl_version'] if runs else '-'}. "
             "Mean ± sample std over seeds (n in the detail table).", "",
             "## Held-out accuracy after RL (%)", "",
             "| train | rollout | " + " | ".join(formats) + " |", "|---|---|" + "---|" * len(formats)]
    for name, train, rollout, resq, fdep in RECIPES:
        cells = []
        for f in formats:
            row = agg.get((name, f if fdep else NO_FORMAT))
            cells.append(fmt_ms(*row["acc after %"], 100, 1) if row else "-")
        if any(c != "-" for c in cells):
            ro = rollout.upper() + (" + ResQ 2:4" if resq == "2_4" else "")
            lines.append(f"| {train.upper()} | {ro} | " + " | ".join(cells) + " |")
    lines += ["", "## Every arm", "", "| recipe | format | seeds | " + " | ".join(c for c, _, _, _ in STATS) + " |",
              "|---|---|---|" + "---|" * len(STATS)]
    for name, *_ in RECIPES:
        for f in [NO_FORMAT] + formats:
            row = agg.get((name, f))
            if row:
                lines.append(f"| {name} | {f} | {','.join(map(str, row['seeds']))} | "
                             + " | ".join(fmt_ms(*row[c], sc, dg) for c, _, sc, dg in STATS) + " |")
    lines.append("")
    for f in formats:
        keys = [(n, f if fd else NO_FORMAT) for n, *_, fd in RECIPES if (n, f if fd else NO_FORMAT) in agg]
        for metric, label in (("acc_curve", "held-out accuracy"), ("reward_curve", "reward/mean")):
            series = [(n, [(x, m * (100 if metric == "acc_curve" else 1), s * (100 if metric == "acc_curve" else 1), k)
                           for x, m, s, k in agg[(n, ff)][metric]]) for n, ff in keys]
            fn = f"{metric.split('_')[0]}_{f}.svg"
            _write(os.path.join(out, fn), svg_lines(series, f"{label} ({f}; mean ± std over seeds)", "RL step",
                                                    label + (" %" if metric == "acc_curve" else "")))
            lines.append(f"![{label} {f}]({fn})")
    _write(os.path.join(out, "results.md"), "\n".join(lines) + "\n")
    return agg


# ---- the pretraining comparison ----------------------------------------------------------------
PRETRAIN_ARMS = {
    "bf16": lambda: fp4rl.QuantPolicy(train_numerics="bf16"),
    "mxfp4_1d_ocp": lambda: fp4rl.QuantPolicy("default"),
    "stable_2d_mxfp4": lambda: fp4rl.QuantPolicy("stable_2d_mxfp4"),
    "hif4_1d": lambda: fp4rl.QuantPolicy(format_weight="hif4", format_activation="hif4", format_gradient="hif4"),
}


def corpus_batch(rng, batch, seq_len=20):
    """Worked arithmetic of both tasks in the multistep vocabulary (addition as a + b - 0 problems
    would be degenerate, so addition prompts use the multistep tokens with one operator)."""
    ms = fx.MultiStepTask()
    tokens = np.zeros((batch, seq_len), np.int32)
    lengths = np.zeros(batch, np.int32)
    for b in range(batch):
        if rng.random() < 0.5:
            p = ms.sample(rng)
            seq = ms.prompt(p) + ms.answer(p)
        else:
            a, c = rng.randint(0, 999), rng.randint(0, 999)
            seq = [ms.BOS, *fx._digits(a), ms.PLUS, *fx._digits(c), ms.EQ, *fx._digits(a + c), ms.END]
        tokens[b, :len(seq)] = seq
        lengths[b] = len(seq)
    return tokens, lengths


def eval_loss(model, tokens, lengths):
    lp = model.token_logprobs(tokens, lengths)
    n = int(np.sum(lengths - 1))
    return float(-lp.sum() / n)


def run_pretrain(args, log=print):
    os.makedirs(args.out, exist_ok=True)
    cfg = {k: getattr(args, k) for k in ("size", "steps", "batch", "lr", "eval_every")}
    t0 = time.perf_counter()
    config = fx.model_config(args.size, 16)
    for seed in [int(s) for s in args.seeds.split(",")]:
        for arm in args.arms.split(","):
            path = os.path.join(args.out, "pretrain", f"{arm}_s{seed}.json")
            if os.path.exists(path):
                continue
            if args.time_budget and time.perf_counter() - t0 > args.time_budget:
                log("time budget reached; run the same command again to continue")
                break
            ctx = fx.make_context(args.device, seed)
            pol = PRETRAIN_ARMS[arm]()
            bf = fp4rl.QuantPolicy(train_numerics="bf16")
            model = fp4rl.Model(ctx, config, pol, seed=seed, lr=args.lr, grad_clip=1.0)
            data = random.Random(seed)             # the same data order in every arm
            ev_t, ev_l = corpus_batch(random.Random(999_331), 256)
            curve, curve_own = [], []
            ts = time.perf_counter()
            for step in range(1, args.steps + 1):
                model.train_step(*corpus_batch(data, args.batch))
                if step % args.eval_every == 0 or step == args.steps:
                    curve_own.append([step, eval_loss(model, ev_t, ev_l)])
                    model.set_policy(bf)
                    curve.append([step, eval_loss(model, ev_t, ev_l)])
                    model.set_policy(pol)
            res = {"arm": arm, "seed": seed, "config": cfg, "policy": pol.to_dict(), "eval_loss_bf16": curve,
                   "eval_loss_own": curve_own, "seconds": time.perf_counter() - ts, "device": ctx.device,
                   "num_parameters": model.num_parameters}
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _write(path, json.dumps(fx._clean(res), indent=1))
            log(f"  {arm} seed {seed}: final eval loss {curve[-1][1]:.4f} (own numerics {curve_own[-1][1]:.4f}), "
                f"{res['seconds']:.0f} s")
            model.close()
            ctx.close()
    render_pretrain(args.out)


def render_pretrain(out):
    root = os.path.join(out, "pretrain")
    res = []
    for fn in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        with open(os.path.join(root, fn)) as f:
            res.append(json.load(f))
    if not res:
        return
    by = {}
    for r in res:
        by.setdefault(r["arm"], []).append(r)
    base = mean_std([r["eval_loss_bf16"][-1][1] for r in by.get("bf16", [])])[0]
    lines = ["# FP4 pretraining comparison", "", f"Generated by `bench/fp4_matrix.py pretrain`; {res[0]['config']}, "
             f"{res[0]['num_parameters']} parameters, device {res[0]['device']}. Same data order in every arm.", "",
             "| arm | seeds | final eval loss (BF16 eval) | vs BF16 | final eval loss (own numerics) |", "|---|---|---|---|---|"]
    series = []
    for arm in PRETRAIN_ARMS:
        if arm not in by:
            continue
        rs = by[arm]
        m, s, n = mean_std([r["eval_loss_bf16"][-1][1] for r in rs])
        mo, so, _ = mean_std([r["eval_loss_own"][-1][1] for r in rs])
        rel = f"{100 * (m / base - 1):+.1f}%" if base else "-"
        lines.append(f"| {arm} | {','.join(str(r['seed']) for r in rs)} | {fmt_ms(m, s, n, 1, 4)} | {rel} | {fmt_ms(mo, so, n, 1, 4)} |")
        series.append((arm, mean_curve([r["eval_loss_bf16"] for r in rs])))
    _write(os.path.join(out, "pretrain_eval_loss.svg"), svg_lines(series, "eval loss (BF16 eval; mean ± std)", "step", "loss"))
    lines += ["", "![eval loss](pretrain_eval_loss.svg)", ""]
    _write(os.path.join(out, "pretrain.md"), "\n".join(lines))


# ---- the RL learning rate, chosen once on BF16/BF16 ---------------------------------------------
def run_lr_sweep(args, log=print):
    """BF16/BF16 at each ``--lrs`` value (every seed; warm-ups shared), then the rule fixed before
    looking: the lr with the highest mean held-out gain. Writes OUT/lr_sweep.md and OUT/chosen_lr.json;
    the matrix is then run with ``--lr`` set to it, the same for every arm."""
    lrs = [float(x) for x in args.lrs.split(",")]
    rows = []
    for lr in lrs:
        a = argparse.Namespace(**vars(args))
        a.lr, a.recipes, a.formats = lr, RECIPE_NAMES[0], "hif4"
        a.out = os.path.join(args.out, f"lr_{lr:g}")
        a.warmup_cache = args.warmup_cache or os.path.join(args.out, "warmup")
        run_rl(a, log)
        runs = [s for s in load_runs(a.out) if s["arm"]["recipe"] == RECIPE_NAMES[0]]
        gain = mean_std([s["acc_gain"] for s in runs])
        after = mean_std([s["acc_after"] for s in runs])
        rows.append((lr, gain, after, sorted(s["seed"] for s in runs)))
    done = [r for r in rows if r[1][2]]
    best = max(done, key=lambda r: r[1][0]) if done else None
    lines = ["# RL learning rate on BF16/BF16", "",
             f"Generated by `bench/fp4_matrix.py lr-sweep`; {args.rl_steps} RL steps, rule: the highest mean held-out gain.", "",
             "| lr | seeds | gain (points) | acc after % |", "|---|---|---|---|"]
    for lr, g, a_, seeds in rows:
        lines.append(f"| {lr:g}{' (chosen)' if best and lr == best[0] else ''} | {','.join(map(str, seeds))} | "
                     f"{fmt_ms(*g, 100, 1)} | {fmt_ms(*a_, 100, 1)} |")
    _write(os.path.join(args.out, "lr_sweep.md"), "\n".join(lines) + "\n")
    if best:
        _write(os.path.join(args.out, "chosen_lr.json"), json.dumps({"lr": best[0], "gain": best[1][0]}))
        log(f"chosen lr {best[0]:g} (mean gain {100 * best[1][0]:+.1f} points)")
    return best[0] if best else None


# ---- forward/backward disagreement of 1D blocks ---------------------------------------------------
DISAGREE_FORMATS = {"mxfp4": 32, "nvfp4": 16, "hif4": 64}  # format: the 2D tile measured next to 1D
LINEAR_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                   "up_proj.weight", "down_proj.weight")


def _block_scales(q, fmt, rows, cols):
    """Per-element scale codes [rows, cols] of a 1D-quantized MX / NVFP4 tensor (None for HiF4,
    whose scale word is hierarchical); the block of the scale layout in fp4rl.h: 32 (MX), 16 (NVFP4)."""
    if fmt == "hif4":
        return None
    b = 32 if fmt.startswith("mx") else 16
    sc = q.scales().reshape(rows, -1)
    return np.repeat(sc, b, axis=1)[:, :cols]


def fwd_bwd_disagreement(ctx, w, fmt, tile):
    """How far the forward's and the backward's quantized copies of one tensor are apart. w [R, C]:
    the forward GEMM quantizes it in blocks along C (y = x w^T reduces over C), the backward's
    GEMM in blocks along R (dx = dy w reduces over R), i.e. Q(w^T)^T. With 2D tiles both are the
    same bits; with 1D blocks elements get other scales. Nearest rounding, OCP-floor scales.
    scale_diff_frac: 1D MX / NVFP4, the elements whose block scale differs; 2D, the tiles' scale
    codes of Q(w) against those of the library's transpose of Q(w^T); HiF4 1D: not measured."""
    pol = fp4rl.QuantPolicy(format_weight=fmt, tile_weight=tile)
    w = np.ascontiguousarray(w, dtype=np.float32)
    R, C = w.shape
    with ctx.quantize(w, fmt, pol, "weight") as qf, ctx.quantize(np.ascontiguousarray(w.T), fmt, pol, "weight") as qb:
        f, b = qf.numpy(), qb.numpy().T
        if tile:
            with ctx.transpose(qb) as qbt:
                scale_diff = float(np.mean(qf.scales() != qbt.scales()))
        else:
            sf, sb = _block_scales(qf, fmt, R, C), _block_scales(qb, fmt, C, R)
            scale_diff = float(np.mean(sf != sb.T)) if sf is not None else None
    nw = float(np.linalg.norm(w)) or 1.0
    out = {"elements": int(w.size), "elem_diff_frac": float(np.mean(f != b)),
           "rel_diff": float(np.linalg.norm(f - b)) / nw,
           "rel_err_fwd": float(np.linalg.norm(f - w)) / nw, "rel_err_bwd": float(np.linalg.norm(b - w)) / nw}
    if scale_diff is not None:
        out["scale_diff_frac"] = scale_diff
    return out


def _weighted(rows):
    """Element-weighted means of a list of fwd_bwd_disagreement results."""
    n = sum(r["elements"] for r in rows)
    keys = [k for k in rows[0] if k != "elements"]
    return {k: sum(r[k] * r["elements"] for r in rows) / n for k in keys}


def measure_disagreement(ctx, state, act):
    """{format: {"1d"/"2d": {"weights": ..., "activations": ...}}} over every linear weight of a
    model's state dict and one activation tensor act [N, C] (a batch's embedding rows: the first
    block's input; forward blocks run along C, the weight gradient's along the N tokens)."""
    ws = [v.reshape(v.shape[0], -1) for k, v in state.items() if k.endswith(LINEAR_SUFFIXES)]
    res = {}
    for fmt, t2 in DISAGREE_FORMATS.items():
        res[fmt] = {}
        for kind, tile in (("1d", 0), ("2d", t2)):
            res[fmt][kind] = {"weights": _weighted([fwd_bwd_disagreement(ctx, w, fmt, tile) for w in ws]),
                              "activations": fwd_bwd_disagreement(ctx, act, fmt, tile)}
    return res


def run_disagreement(args, log=print):
    """Pretrains BF16 models (the pretraining comparison's size, data and lr) and measures the
    forward/backward disagreement of 1D blocks against 2D tiles on their weights and activations at
    the ``--at`` steps. Writes OUT/disagreement.json and OUT/disagreement.md."""
    os.makedirs(args.out, exist_ok=True)
    config = fx.model_config(args.size, 16)
    at = sorted({int(x) for x in args.at.split(",")})
    results = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        ctx = fx.make_context(args.device, seed)
        model = fp4rl.Model(ctx, config, fp4rl.QuantPolicy(train_numerics="bf16"), seed=seed, lr=args.lr, grad_clip=1.0)
        data = random.Random(seed)
        ev_t, _ = corpus_batch(random.Random(999_331), 64)
        for step in range(0, at[-1] + 1):
            if step:
                model.train_step(*corpus_batch(data, args.batch))
            if step in at:
                state = model.state_dict(copy=True)
                act = state["model.embed_tokens.weight"][ev_t.reshape(-1)]
                results.append({"seed": seed, "step": step, "by_format": measure_disagreement(ctx, state, act)})
                log(f"  seed {seed} step {step}: MXFP4 1D weights elem_diff "
                    f"{100 * results[-1]['by_format']['mxfp4']['1d']['weights']['elem_diff_frac']:.1f}%")
        model.close()
        ctx.close()
    _write(os.path.join(args.out, "disagreement.json"), json.dumps(fx._clean(results), indent=1))
    lines = ["# Forward/backward disagreement of 1D blocks", "",
             f"Generated by `bench/fp4_matrix.py disagreement`; BF16 pretraining, size {args.size}, lr {args.lr:g}, "
             f"batch {args.batch}, seeds {args.seeds}. Per tensor w [R, C]: the forward copy Q(w) (blocks along C) "
             "against the backward copy Q(w^T)^T (blocks along R); nearest rounding, OCP-floor scales. "
             "Weights: every linear weight, element-weighted; activations: a batch's embedding rows [N, C]. "
             "Mean ± std over seeds.", "",
             "| step | format | tensor | blocks | elements differing % | scales differing % | ‖Q_f − Q_b‖/‖w‖ | ‖Q_f − w‖/‖w‖ |",
             "|---|---|---|---|---|---|---|---|"]
    for step in at:
        rs = [r for r in results if r["step"] == step]
        for fmt in DISAGREE_FORMATS:
            for tensor in ("weights", "activations"):
                for kind in ("1d", "2d"):
                    get = lambda k: mean_std([r["by_format"][fmt][kind][tensor].get(k, float("nan")) for r in rs])  # noqa: E731
                    lines.append(f"| {step} | {fmt} | {tensor} | {kind} | {fmt_ms(*get('elem_diff_frac'), 100, 2)} | "
                                 f"{fmt_ms(*get('scale_diff_frac'), 100, 2)} | "
                                 f"{fmt_ms(*get('rel_diff'), 1, 4)} | {fmt_ms(*get('rel_err_fwd'), 1, 4)} |")
    _write(os.path.join(args.out, "disagreement.md"), "\n".join(lines) + "\n")
    return results


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    rl = sub.add_parser("rl", help="the RL recipe matrix")
    fx.add_arguments(rl, recipe=False)
    rl.add_argument("--out", required=True)
    rl.add_argument("--seeds", default="1,2,3,4,5")
    rl.add_argument("--formats", default="hif4,mxfp4", help="comma list of hif4, mxfp4, nvfp4")
    rl.add_argument("--recipes", default="all", help="comma list of " + ", ".join(RECIPE_NAMES))
    rl.add_argument("--time-budget", type=float, default=0, help="seconds after which no new run starts (0 = none)")
    # outliers on by default here: 4 channels x16 (a power of two: exactly function-preserving)
    rl.set_defaults(outlier_scale=16.0)
    ls = sub.add_parser("lr-sweep", help="the RL learning rate, chosen once on BF16/BF16")
    fx.add_arguments(ls, recipe=False)
    ls.add_argument("--out", required=True)
    ls.add_argument("--seeds", default="1,2,3,4,5")
    ls.add_argument("--lrs", default="5e-5,1e-4,2e-4,5e-4")
    ls.add_argument("--time-budget", type=float, default=0)
    ls.set_defaults(outlier_scale=16.0)
    dg = sub.add_parser("disagreement", help="forward/backward disagreement of 1D blocks vs 2D tiles")
    dg.add_argument("--out", required=True)
    dg.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    dg.add_argument("--size", default="tiny", choices=sorted(fx.SIZES))
    dg.add_argument("--seeds", default="1,2,3")
    dg.add_argument("--at", default="0,500,3000", help="steps at which to measure")
    dg.add_argument("--batch", type=int, default=64)
    dg.add_argument("--lr", type=float, default=2e-3)
    pt = sub.add_parser("pretrain", help="the 1D vs 2D FP4 pretraining comparison")
    pt.add_argument("--out", required=True)
    pt.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    pt.add_argument("--size", default="tiny", choices=sorted(fx.SIZES))
    pt.add_argument("--seeds", default="1,2,3")
    pt.add_argument("--arms", default=",".join(PRETRAIN_ARMS))
    pt.add_argument("--steps", type=int, default=2000)
    pt.add_argument("--batch", type=int, default=64)
    pt.add_argument("--lr", type=float, default=2e-3)
    pt.add_argument("--eval-every", type=int, default=100)
    pt.add_argument("--time-budget", type=float, default=0)
    rd = sub.add_parser("render", help="tables and plots from an output directory")
    rd.add_argument("--out", required=True)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    if args.mode == "rl":
        run_rl(args, log)
    elif args.mode == "lr-sweep":
        run_lr_sweep(args, log)
    elif args.mode == "disagreement":
        run_disagreement(args, log)
    elif args.mode == "pretrain":
        run_pretrain(args, log)
    else:
        if os.path.exists(os.path.join(args.out, "matrix_config.json")):
            render_rl(args.out)
        render_pretrain(args.out)


if __name__ == "__main__":
    sys.exit(main())
