"""The issue-18 experiment harness (bench/fp4_experiments.py, bench/fp4_matrix.py) on the CPU at
the "tiny" size: tasks and rewards, function-preserving outlier injection, the matrix end to end
(2 recipes x 2 seeds, a few steps), and the aggregation on synthetic input. Skips when the Python
binding (package fp4rl) is not installed."""

import json
import math
import os
import pathlib
import random
import sys
import xml.dom.minidom

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

fp4rl = pytest.importorskip("fp4rl")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import fp4_experiments as fx  # noqa: E402
import fp4_matrix as fm  # noqa: E402


# ---- tasks --------------------------------------------------------------------------------------
def test_multistep_task_reward_and_format():
    t = fx.MultiStepTask()
    p = (47, "+", 38, "-", 60)  # 85, then 25
    assert t.prompt(p) == [t.BOS, 4, 7, t.PLUS, 3, 8, t.MINUS, 6, 0, t.EQ]
    assert t.answer(p) == [8, 5, t.SEP, 2, 5, t.END]
    assert t.reward(p, t.answer(p)) == 1.0
    assert t.reward(p, [9, 9, t.SEP, 2, 5, t.END]) == 1.0          # the final result is what counts
    assert t.reward(p, [8, 5, t.SEP, 2, 6, t.END]) == 0.0          # wrong final, no partial credit
    assert t.reward(p, [8, 5, t.SEP, 2, 6, t.END], 0.25) == 0.25   # right intermediate only
    assert t.reward(p, [8, 5, t.SEP, 2, 5]) == 0.0                 # no stop token
    assert t.reward(p, [2, 5, t.END]) == 0.0                       # no worked step
    assert t.reward(p, [8, 5, t.SEP, 2, 5, t.END, 1]) == 0.0       # trailing tokens
    rng = random.Random(3)
    for _ in range(500):
        q = t.sample(rng)
        r1, r2 = t.results(q)
        assert r1 >= 0 and r2 >= 0
        seq = t.prompt(q) + t.answer(q)
        assert max(seq) < t.vocab and len(seq) <= t.seq_len and len(t.answer(q)) <= t.max_new_tokens
    a = fx.AdditionTask()
    assert a.reward((12, 9), [2, 1, a.END]) == 1.0 and a.reward((12, 9), [2, 1]) == 0.0
    # the held-out set is the same whatever the seed of the run
    assert fx.held_out_set(t, 20).items == fx.held_out_set(t, 20).items


# ---- outlier injection --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_state():
    with fp4rl.Context(seed=2) as ctx:
        cfg = fx.model_config("tiny", 16)
        m = fp4rl.Model(ctx, cfg, fx.make_policy("bf16", "bf16", "hif4"), seed=4)
        # a short warm-up so that the model is not at its random init (logits with structure)
        rng = random.Random(0)
        for _ in range(30):
            m.train_step(*fx.teacher_forced_batch(fx.MultiStepTask(), rng, 32))
        yield m.state_dict(copy=True)


def _logits(state, scale, chans):
    with fp4rl.Context(seed=2) as ctx:
        cfg = fx.model_config("tiny", 16)
        pol = fx.make_policy("fp4", "w4a4", "mxfp4")
        m = fp4rl.Model(ctx, cfg, pol, seed=4)
        m.load_state_dict(state)
        toks = np.array([[15, 4, 7, 10, 3, 8, 11, 6, 0, 12, 8, 5, 13, 2, 5, 14]] * 3, np.int32)
        l0 = fx.fp32_logits(m, pol, toks)
        inject_model = m.get_param("model.layers.0.input_layernorm.weight")
        fx.inject_outliers(m, chans, scale)
        l1 = fx.fp32_logits(m, pol, toks)
        via_model = {n: m.get_param(n) for n in m.param_names}
        return l0, l1, inject_model, via_model


def test_outlier_injection_preserves_fp32_logits(tiny_state):
    chans = fx.outlier_channels(64, 4)
    assert len(set(chans)) == 4 and all(0 <= c < 64 for c in chans)
    # a power of two: bit-identical logits (measured: max |diff| 0)
    l0, l1, norm0, after = _logits(tiny_state, 16.0, chans)
    assert np.array_equal(l0, l1)
    # what was written: the norm channels x16, q/k/v and gate/up input columns / 16, the rest as it was
    ref = fx.inject_outliers_state(tiny_state, chans, 16.0)
    for n, v in ref.items():
        np.testing.assert_array_equal(after[n], v, err_msg=n)
    n0 = "model.layers.0.input_layernorm.weight"
    np.testing.assert_array_equal(after[n0][chans], 16 * norm0[chans])
    other = [c for c in range(64) if c not in chans]
    np.testing.assert_array_equal(after[n0][other], norm0[other])
    q = "model.layers.1.self_attn.q_proj.weight"
    np.testing.assert_array_equal(after[q][:, chans], tiny_state[q][:, chans] / 16)
    np.testing.assert_array_equal(after["model.layers.1.self_attn.o_proj.weight"],
                                  tiny_state["model.layers.1.self_attn.o_proj.weight"])
    # any other factor: equal up to FP32 rounding (measured: max |diff| 7.9e-6 at |logit| <= 6.5 for x30)
    l0, l1, _, _ = _logits(tiny_state, 30.0, chans)
    assert not np.array_equal(after[n0], tiny_state[n0])
    assert np.max(np.abs(l1 - l0)) <= 1e-5 * max(1.0, float(np.max(np.abs(l0)))) * 8


def test_outlier_injection_raises_act_zero_frac(tiny_state):
    task = fx.MultiStepTask()
    cfg = fx.model_config("tiny", 16)
    prompts = fx.held_out_set(task, 8).prompts
    chans = fx.outlier_channels(64, 4)
    with fp4rl.Context(seed=2) as ctx:
        for fmt in ("hif4", "mxfp4"):
            pol = fx.make_policy("fp4", "w4a4", fmt)
            before = fx.measure_step_metrics(ctx, cfg, tiny_state, pol, task, prompts, 1)["quant/act_zero_frac"]
            after = fx.measure_step_metrics(ctx, cfg, fx.inject_outliers_state(tiny_state, chans, 16.0), pol, task,
                                            prompts, 1)["quant/act_zero_frac"]
            # measured on this model: hif4 ~0.15 -> ~0.33, mxfp4 ~0.15 -> ~0.43
            assert 0.0 < before < 1.0 and 0.0 < after < 1.0
            assert after > before + 0.08, (fmt, before, after)
        # a BF16 rollout quantizes nothing
        pol = fx.make_policy("bf16", "bf16", "hif4")
        bf = fx.measure_step_metrics(ctx, cfg, fx.inject_outliers_state(tiny_state, chans, 16.0), pol, task, prompts, 1)
        assert bf["quant/act_zero_frac"] == 0.0


# ---- aggregation ------------------------------------------------------------------------------
def test_mean_std_and_curves():
    m, s, n = fm.mean_std([1.0, 2.0, 3.0, 4.0])
    assert (m, n) == (2.5, 4) and s == pytest.approx(math.sqrt(5 / 3), rel=1e-12)
    assert fm.mean_std([2.0, None, float("nan"), 4.0]) == (3.0, pytest.approx(math.sqrt(2)), 2)
    assert fm.mean_std([5.0]) == (5.0, None, 1)
    assert fm.mean_std([]) == (None, None, 0)
    c = fm.mean_curve([[[0, 0.1], [5, 0.3]], [[0, 0.3], [5, None], [10, 0.5]]])
    assert [x for x, *_ in c] == [0, 5, 10]
    assert c[0][1] == pytest.approx(0.2) and c[0][2] == pytest.approx(math.sqrt(0.02)) and c[0][3] == 2
    assert c[1][1:] == (0.3, 0.0, 1) and c[2][1:] == (0.5, 0.0, 1)
    assert fm.fmt_ms(0.25, 0.05, 3, 100, 1) == "25.0 ± 5.0" and fm.fmt_ms(None, None, 0) == "-"


def _synthetic(recipe, fmt, seed, before, after, zero):
    means = {k: 0.5 for k in fx.SUMMARY_MEANS}
    means["quant/act_zero_frac"] = zero
    return {"arm": {"recipe": recipe, "format": fmt}, "seed": seed, "acc_before": before, "acc_after": after,
            "acc_gain": after - before, "reward_last": after, "means": means,
            "acc_curve": [[0, before], [10, after]], "reward_curve": [[1, before], [10, after]]}


def test_aggregate_rl_synthetic():
    runs = [_synthetic("fp4/w4a4", "hif4", 1, 0.2, 0.5, 0.1), _synthetic("fp4/w4a4", "hif4", 2, 0.4, 0.6, 0.3),
            _synthetic("fp4/w4a4", "mxfp4", 1, 0.2, 0.3, 0.5), _synthetic("bf16/bf16", "any", 1, 0.2, 0.7, 0.0)]
    agg = fm.aggregate_rl(runs)
    assert set(agg) == {("fp4/w4a4", "hif4"), ("fp4/w4a4", "mxfp4"), ("bf16/bf16", "any")}
    r = agg[("fp4/w4a4", "hif4")]
    assert r["seeds"] == [1, 2]
    m, s, n = r["acc after %"]
    assert (m, n) == (pytest.approx(0.55), 2) and s == pytest.approx(math.sqrt(0.005))
    assert r["gain (points)"][0] == pytest.approx(0.25)
    assert r["act_zero_frac %"][0] == pytest.approx(0.2)
    assert agg[("fp4/w4a4", "mxfp4")]["acc after %"] == (0.3, None, 1)
    assert r["acc_curve"][1][1] == pytest.approx(0.55)
    assert [name for name, *_ in fm.arms(["bf16/bf16", "fp4/w4a4"], ["hif4", "mxfp4"])] == [
        ("bf16/bf16", "bf16", "bf16", "off", False), ("fp4/w4a4", "fp4", "w4a4", "off", True),
        ("fp4/w4a4", "fp4", "w4a4", "off", True)]
    assert [f for _, f in fm.arms(["bf16/bf16", "fp4/w4a4"], ["hif4", "mxfp4"])] == ["any", "hif4", "mxfp4"]


# ---- the harness end to end -----------------------------------------------------------------------
RL_STEPS = 3
MATRIX_ARGS = ["--size", "tiny", "--task", "multistep", "--seeds", "1,2", "--recipes", "bf16/bf16,fp4/w4a4+resq2:4",
               "--formats", "hif4", "--warmup-steps", "30", "--warmup-batch", "32", "--warmup-eval-every", "30",
               "--rl-steps", str(RL_STEPS), "--prompts-per-step", "4", "--group-size", "4", "--eval-n", "16",
               "--eval-every", "2", "--tis-cap", "4"]
ROW_KEYS = ("step", "eval/accuracy", "reward/mean", "quant/act_zero_frac", "mismatch/logp_abs_diff_mean", "tis/mean",
            "tis/max", "tis/capped_frac", "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "wall/tokens_per_s")


def _finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def test_matrix_end_to_end(tmp_path, capsys):
    out = tmp_path / "mx"
    fm.main(["rl", "--out", str(out), *MATRIX_ARGS])
    runs = sorted((out / "runs").iterdir())
    assert [r.name for r in runs] == ["any_bf16-bf16_s1", "any_bf16-bf16_s2", "hif4_fp4-w4a4_resq24_s1",
                                      "hif4_fp4-w4a4_resq24_s2"]
    summaries = {}
    for r in runs:
        rows = [json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()]
        assert [row["step"] for row in rows] == list(range(1, RL_STEPS + 1))
        for row in rows:
            for k in ROW_KEYS:
                assert k in row, k
            for k, v in row.items():
                assert v is None or _finite(v), (k, v)
            assert 0.0 <= row["reward/mean"] <= 1.0
            assert 0.0 <= row["quant/act_zero_frac"] <= 1.0
            assert row["mismatch/logp_abs_diff_mean"] >= 0.0
            assert 0.0 < row["tis/mean"] and 0.0 <= row["tis/capped_frac"] <= 1.0
            assert row["perf/rollout_tokens_per_s"] > 0 and row["wall/tokens_per_s"] > 0
            assert row["eval/accuracy"] is None or 0.0 <= row["eval/accuracy"] <= 1.0
        assert [row["eval/accuracy"] is not None for row in rows] == [False, True, True]
        s = json.loads((r / "summary.json").read_text())
        summaries[r.name] = s
        assert 0.0 <= s["acc_before"] <= 1.0 and 0.0 <= s["acc_after"] <= 1.0
        assert s["acc_after"] == rows[-1]["eval/accuracy"]
        assert s["acc_gain"] == pytest.approx(s["acc_after"] - s["acc_before"])
        assert s["session_hparams"]["tis_cap"] == 4.0 and s["rl_steps"] == RL_STEPS
        assert s["means"]["quant/act_zero_frac"] == pytest.approx(np.mean([x["quant/act_zero_frac"] for x in rows]))
        o = s["outliers"]
        assert o["scale"] == 16.0 and o["fp32_logit_max_abs_diff"] == 0.0
        assert s["warmup"]["steps"] == 30
    bf, fp4 = summaries["any_bf16-bf16_s1"], summaries["hif4_fp4-w4a4_resq24_s1"]
    assert bf["policy"]["rollout_numerics"] == "bf16" and bf["means"]["quant/act_zero_frac"] == 0.0
    assert fp4["policy"]["resq"] == "2_4" and fp4["policy"]["format_activation"] == "hif4"
    assert fp4["outliers"]["act_zero_frac_after"] > fp4["outliers"]["act_zero_frac_before"]
    assert fp4["means"]["quant/act_zero_frac"] > 0.0
    # every arm of a seed starts RL from the same warm-up
    assert bf["warmup"]["cached"] is False and fp4["warmup"]["cached"] is True
    assert {k: v for k, v in bf["warmup"].items() if k != "cached"} == {k: v for k, v in fp4["warmup"].items() if k != "cached"}
    # the tables: the accuracy cell is the mean +- std of the two seeds
    md = (out / "results.md").read_text()
    accs = [summaries[f"hif4_fp4-w4a4_resq24_s{i}"]["acc_after"] for i in (1, 2)]
    m, sd, _ = fm.mean_std(accs)
    assert f"| FP4 | W4A4 + ResQ 2:4 | {fm.fmt_ms(m, sd, 2, 100, 1)} |" in md
    assert "| BF16 | BF16 |" in md and "tis_cap=4.0" in md
    for fn in ("acc_hif4.svg", "reward_hif4.svg"):
        doc = xml.dom.minidom.parse(str(out / fn))
        assert len(doc.getElementsByTagName("polyline")) == 2  # one curve per recipe
    # a second invocation runs nothing new; other hyper-parameters against the same OUT are refused
    mtimes = [os.path.getmtime(r / "summary.json") for r in runs]
    fm.main(["rl", "--out", str(out), *MATRIX_ARGS])
    assert [os.path.getmtime(r / "summary.json") for r in runs] == mtimes
    with pytest.raises(SystemExit):
        fm.main(["rl", "--out", str(out), *MATRIX_ARGS, "--lr", "1e-3"])


def test_lr_sweep_chooses_best_gain_and_shares_warmups(tmp_path):
    out = tmp_path / "sweep"
    args = [a for a in MATRIX_ARGS]
    i = args.index("--recipes")
    del args[i:i + 2]
    i = args.index("--formats")
    del args[i:i + 2]
    best = fm.run_lr_sweep(fm.parse_args(["lr-sweep", "--out", str(out), *args, "--lrs", "1e-4,1e-3"]), log=lambda s: None)
    gains = {}
    for lr in ("0.0001", "0.001"):
        runs = sorted((out / f"lr_{lr}" / "runs").iterdir())
        assert [r.name for r in runs] == ["any_bf16-bf16_s1", "any_bf16-bf16_s2"]
        ss = [json.loads((r / "summary.json").read_text()) for r in runs]
        assert all(s["session_hparams"]["lr"] == float(lr) for s in ss)
        gains[float(lr)] = np.mean([s["acc_gain"] for s in ss])
    # the rule: the highest mean gain (the first on a tie)
    assert best == max(gains, key=lambda k: (gains[k], -k))
    assert json.loads((out / "chosen_lr.json").read_text())["lr"] == best
    # one warm-up per seed, shared by both learning rates
    assert len(list((out / "warmup").glob("*.safetensors"))) == 2
    assert "(chosen)" in (out / "lr_sweep.md").read_text()


def test_disagreement_2d_is_zero_and_1d_scales_match_numpy(tmp_path):
    ctx = fp4rl.Context("cpu")
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((96, 128)) * np.exp(rng.standard_normal((96, 1)))).astype(np.float32)
    for fmt, tile in fm.DISAGREE_FORMATS.items():
        d2 = fm.fwd_bwd_disagreement(ctx, w, fmt, tile)
        assert d2["elem_diff_frac"] == 0.0 and d2["rel_diff"] == 0.0 and d2["scale_diff_frac"] == 0.0
        d1 = fm.fwd_bwd_disagreement(ctx, w, fmt, 0)
        assert d1["elem_diff_frac"] > 0.0 and d1["rel_diff"] > 0.0
        assert 0.0 < d1["rel_err_fwd"] < 0.2 and 0.0 < d1["rel_err_bwd"] < 0.2
    # MXFP4 1D, OCP floor: an element's E8M0 exponent is floor(log2(amax of its 32-block)) - 2,
    # computed here independently along rows (forward) and columns (backward)
    def exps(a):
        amax = np.abs(a).reshape(a.shape[0], -1, 32).max(axis=2)
        return np.repeat(np.floor(np.log2(amax)), 32, axis=1)
    want = float(np.mean(exps(w) != exps(np.ascontiguousarray(w.T)).T))
    assert fm.fwd_bwd_disagreement(ctx, w, "mxfp4", 0)["scale_diff_frac"] == pytest.approx(want, abs=1e-12)
    assert 0.05 < want < 0.95
    res = fm.run_disagreement(fm.parse_args(["disagreement", "--out", str(tmp_path), "--size", "tiny", "--at", "0,3",
                                          "--seeds", "1", "--batch", "8"]), log=lambda s: None)
    assert [r["step"] for r in res] == [0, 3]
    for r in res:
        for fmt in fm.DISAGREE_FORMATS:
            assert r["by_format"][fmt]["2d"]["weights"]["elem_diff_frac"] == 0.0
            assert r["by_format"][fmt]["1d"]["weights"]["elem_diff_frac"] > 0.0
            assert r["by_format"][fmt]["1d"]["activations"]["elements"] == 64 * 20 * 64  # [64 held-out sequences * 20 tokens, hidden]
    assert "| 3 | mxfp4 | weights | 1d |" in (tmp_path / "disagreement.md").read_text()
    ctx.close()

