"""The Pythonic classes: Context, Tensor, QuantPolicy, Model, RLSession."""

import json
import struct

import numpy as np
import pytest

import fp4rl
from conftest import TINY


def read_safetensors(path):
    """{name: array} of a safetensors file (the tests' own reader, for the HF reference)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    kinds = {"F32": np.float32, "I32": np.int32}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype=kinds[meta["dtype"]]).reshape(meta["shape"])
    return out


# ---- Context ----
def test_context(ctx):
    assert ctx.device == "cpu" and "cpu" in repr(ctx)
    assert ctx.rng == (5, 0)
    ctx.seed = 11
    assert (ctx.seed, ctx.rng_offset) == (11, 0)
    ctx.rng_offset = 40
    p = fp4rl.QuantPolicy(rounding_weight="stochastic")
    ctx.quantize(np.ones((2, 32), np.float32), "mxfp4", p)
    assert ctx.rng == (11, 41)  # a stochastically rounded call advances the offset by one
    ctx.quantize(np.ones((2, 32), np.float32), "mxfp4")
    assert ctx.rng_offset == 41
    with fp4rl.Context(0, seed=3) as c2:
        assert c2.seed == 3
    assert c2.closed and "closed" in repr(c2)


def test_stochastic_rounding_replays_from_seed_and_offset(ctx):
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    p = fp4rl.QuantPolicy(rounding_weight="stochastic")
    ctx.seed, ctx.rng_offset = 9, 100
    a = ctx.quantize(x, "mxfp4", p).codes()
    b = ctx.quantize(x, "mxfp4", p).codes()
    ctx.rng_offset = 100
    assert (ctx.quantize(x, "mxfp4", p).codes() == a).all() and not (a == b).all()


# ---- Tensor ----
def test_dense_round_trips(ctx):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    t = ctx.tensor(x)
    assert (t.dtype, t.shape, t.ndim, t.numel, t.nbytes, t.is_quantized) == ("f32", (2, 3, 4), 3, 24, 96, False)
    assert t.ctx is ctx and repr(t) == "<fp4rl.Tensor f32 [2, 3, 4]>"
    y = t.numpy()
    assert y.dtype == np.float32 and (y == x).all() and y is not x
    assert (np.asarray(t) == x).all()
    i = ctx.tensor(np.array([[1, -2], [3, 2**31 - 1]], np.int32))
    assert i.dtype == "i32" and i.numpy().tolist() == [[1, -2], [3, 2**31 - 1]]
    assert ctx.tensor(np.array([1, 2])).dtype == "i32"  # int64 input, range-checked
    bits = np.array([0x3F80, 0xC000, 0x7F80], np.uint16)  # 1.0, -2.0, inf as bf16
    b = ctx.tensor(bits, "bf16")
    assert b.dtype == "bf16" and b.nbytes == 6 and (b.numpy() == bits).all()
    assert ctx.tensor(x.astype(np.float64)).dtype == "f32"  # converted
    z = ctx.zeros((3, 2), "i32")
    assert z.numpy().tolist() == [[0, 0], [0, 0], [0, 0]]
    assert ctx.tensor(np.float32(2.5)).shape == (1,)


def test_bfloat16_arrays_from_ml_dtypes(ctx):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([1.0, -2.5, 3.0], dtype=ml_dtypes.bfloat16)
    t = ctx.tensor(x)
    assert t.dtype == "bf16" and (t.numpy() == x.view(np.uint16)).all()


def test_zero_copy_in(ctx, monkeypatch):
    """A C-contiguous array of the right type reaches the C call as the same object."""
    seen = []
    real = fp4rl.capi.fp4rl_tensor_from_host
    monkeypatch.setattr(fp4rl.capi, "fp4rl_tensor_from_host", lambda *a: seen.append(a[-1]) or real(*a))
    x = np.ones((3, 4), np.float32)
    ctx.tensor(x)
    assert seen[-1] is x
    big = np.ones((6, 8), np.float32)[::2]  # not contiguous: copied
    ctx.tensor(big)
    assert seen[-1] is not big and seen[-1].flags.c_contiguous
    toks = np.array([13, 1, 10, 2, 11], np.int32)
    offs = np.array([0, 5], np.uintp)
    seen_p = []
    real_r = fp4rl.capi.fp4rl_rl_session_rollout
    monkeypatch.setattr(fp4rl.capi, "fp4rl_rl_session_rollout", lambda s, p, o: seen_p.append((p, o)) or real_r(s, p, o))
    s = fp4rl.RLSession(ctx, fp4rl.Model(ctx, TINY), group_size=2, max_new_tokens=2)
    s.rollout(toks, offsets=offs)
    assert seen_p[-1][0] is toks and seen_p[-1][1] is offs


def test_hif4_spec_vector_d(ctx):
    """shared/spec vector D: x_j = (j - 32) / 16 quantizes to scale word 0xEC3FC3B9, x_0 -> -1.875."""
    x = ((np.arange(64) - 32) / 16).astype(np.float32).reshape(1, 64)
    q = ctx.quantize(x, "hif4")
    assert q.dtype == "hif4" and q.is_quantized
    assert q.quant_info() == {"tile": 0, "codes_bytes": 32, "scales_bytes": 4, "tensor_scale": 1.0}
    words = q.scales()
    assert words.dtype == np.dtype("<u4") and words.tolist() == [0xEC3FC3B9]
    y = q.dequantize().numpy()
    assert y[0, 0] == -1.875
    assert (q.numpy() == y).all()
    assert (ctx.fake_quantize(x, "hif4") == y).all()
    codes = q.codes()
    sign = np.stack([codes & 0xF, codes >> 4], axis=1).reshape(-1) >> 3 & 1
    assert (sign == (np.arange(64) < 32)).all()  # the sign bit of each S1P2 code


def test_import_quantized_round_trip(ctx):
    x = np.random.default_rng(1).standard_normal((3, 48)).astype(np.float32)
    for fmt in ("mxfp4", "nvfp4", "hif4", "mxfp8_e4m3"):
        q = ctx.quantize(x, fmt)
        info = q.quant_info()
        r = ctx.import_quantized(fmt, x.shape, q.codes(), q.scales(), tile=info["tile"], tensor_scale=info["tensor_scale"])
        assert r.quant_info() == info and (r.numpy() == q.numpy()).all(), fmt
        assert q.nbytes == info["codes_bytes"] + info["scales_bytes"]


def test_transpose_and_matmul(ctx):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    a = rng.standard_normal((8, 128)).astype(np.float32)
    # dense
    assert (ctx.tensor(w).T.numpy() == w.T).all()
    c = ctx.matmul(a, w).numpy()
    assert c.shape == (8, 64) and np.allclose(c, a @ w.T, rtol=1e-5, atol=1e-4)
    # 2D-tiled quantized: the transpose is the quantization of the transpose
    p = fp4rl.QuantPolicy("stable_2d_mxfp4")
    qw = ctx.quantize(w, "mxfp4", p, "weight")
    assert qw.quant_info()["tile"] == 32
    assert (qw.T.codes() == ctx.quantize(w.T.copy(), "mxfp4", p, "weight").codes()).all()
    # quantized operands multiply as their exact dequantized values
    qa = ctx.quantize(a, "mxfp4", p, "activation")
    out = ctx.zeros((8, 64))
    assert qa.matmul(qw, out=out) is out
    ref = qa.numpy().astype(np.float64) @ qw.numpy().astype(np.float64).T
    assert np.allclose(out.numpy(), ref, rtol=1e-5, atol=1e-4)
    bf = ctx.matmul(qa, qw, out_dtype="bf16")
    assert bf.dtype == "bf16"


def test_quant_error_report(ctx):
    x = np.full((1, 64), 1000.0, np.float32)  # spec vector B: the whole HiF4 unit saturates
    q = ctx.quantize(x, "hif4")
    rep = q.quant_error(x)
    assert set(rep) == {"rel_mse", "underflow_frac", "saturated_frac", "nan_block_frac"}
    assert rep["saturated_frac"] == 1.0 and rep["nan_block_frac"] == 0.0
    x[0, 3] = np.nan
    assert ctx.quant_error(x, ctx.quantize(x, "hif4"))["nan_block_frac"] == 1.0


# ---- QuantPolicy ----
def test_policy_defaults_presets_and_setters():
    p = fp4rl.QuantPolicy()
    d = p.to_dict()
    assert tuple(d) == fp4rl.QuantPolicy.PARAMS == tuple(fp4rl.capi.fp4rl_qparam_name(i) for i in range(15))
    assert d["format_weight"] == "mxfp4" and d["tile_weight"] == 0 and d["seed"] is None and d["format_qk"] is None
    assert d["train_numerics"] == "fp4" and d["rollout_numerics"] == "w4a4" and d["resq"] == "off"
    s = fp4rl.QuantPolicy("stable_2d_mxfp4")
    assert (s["tile_weight"], s["tile_activation"], s["scale_rule"], s["rounding_gradient"], s["format_qk"]) == \
        (32, 32, "truncation_free", "stochastic", "mxfp8_e4m3")
    h = fp4rl.QuantPolicy("hif4_rl", train_numerics="bf16")
    assert h["format_activation"] == "hif4" and h["resq"] == "2_4" and h["train_numerics"] == "bf16"
    h["resq"] = "2:4"
    h.set(resq=fp4rl.capi.FP4RL_RESQ_BLOCK_50, seed=7, format_qk=None)
    assert (h["resq"], h.get_raw("resq"), h["seed"], h.get_raw("format_qk")) == ("block_50", 4, 7, -1)
    assert h.copy() == h and h.copy() is not h and h != p
    assert h.apply_preset("default") == p
    assert fp4rl.QuantPolicy(format_weight="hif4", tile_weight=64)["tile_weight"] == 64
    assert fp4rl.PRESETS == fp4rl.QuantPolicy.PRESETS == ("default", "stable_2d_mxfp4", "hif4_rl")
    assert "QuantPolicy(tile_weight=0" in repr(p)


def test_policy_is_unchanged_by_a_rejected_value():
    p = fp4rl.QuantPolicy(tile_weight=32)
    with pytest.raises(fp4rl.InvalidArgumentError, match="tile_weight"):
        p.set(format_weight="hif4")  # HiF4 takes no 32 x 32 tiles
    assert p["format_weight"] == "mxfp4" and p["tile_weight"] == 32
    with pytest.raises(TypeError):
        p.set(tile_weight=1.5)


# ---- Model ----
def test_model_from_config_forms(ctx, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    for config in (TINY, json.dumps(TINY), cfg, tmp_path, str(cfg)):
        m = fp4rl.Model(ctx, config, seed=1)
        assert m.info["hidden_size"] == 32 and m.ctx is ctx
    assert m.info == {"vocab_size": 16, "hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 4,
                      "num_kv_heads": 2, "head_dim": 8, "max_positions": 32, "tied_embeddings": 1,
                      "num_parameters": m.num_parameters, "step": 0, "num_tensors": 26}
    names = m.param_names
    assert names[0] == "model.embed_tokens.weight" and "model.layers.1.mlp.down_proj.weight" in names
    assert sum(int(np.prod(m.param_shape(n))) for n in names) == m.num_parameters
    assert (fp4rl.Model(ctx, TINY, seed=1).get_param("model.norm.weight") == m.get_param("model.norm.weight")).all()
    assert "2 layers" in repr(m)


def test_load_hf_fixture_logits(ctx, gqa_dir):
    """tests/fixtures/qwen2/gqa: config.json + model.safetensors; FP32 numerics match HF's logits."""
    p = fp4rl.QuantPolicy(train_numerics="fp32")
    m = fp4rl.Model.from_pretrained(ctx, gqa_dir, p)
    assert m.vocab_size == 96 and m.info["num_kv_heads"] == 2
    ref = read_safetensors(gqa_dir / "reference.safetensors")
    tok, lens = ref["input_ids"], ref["lengths"]
    logits = m.logits(tok, lens)
    assert logits.shape == (3, 9, 96) == ref["logits"].shape
    err = np.linalg.norm(logits - ref["logits"]) / np.linalg.norm(ref["logits"])
    assert err <= 1e-4
    loss = m.compute_gradients(tok, lens)
    assert abs(loss - float(ref["loss"][0])) <= 1e-5 * abs(float(ref["loss"][0]))
    g = m.get_grad("model.norm.weight")
    want = ref["grad.model.norm.weight"]
    assert np.linalg.norm(g - want) / np.linalg.norm(want) <= 1e-3
    one = m.logits(tok[0, : lens[0]])
    assert one.shape == (lens[0], 96) and np.allclose(one, logits[0, : lens[0]], atol=1e-5)


def test_save_pretrained_round_trip_and_stop_tokens(ctx, gqa_dir, tmp_path):
    """Model.save_pretrained -> Model.from_pretrained (both through the C functions): identical
    weights, sharded or not; eos ids of generation_config.json become the sessions' stop tokens."""
    m = fp4rl.Model.from_pretrained(ctx, gqa_dir)
    m.save_pretrained(tmp_path / "one")
    m.save_pretrained(tmp_path / "shards", max_shard_bytes=40000)
    assert (tmp_path / "shards" / "model.safetensors.index.json").is_file()
    for d in ("one", "shards"):
        r = fp4rl.Model.from_pretrained(ctx, tmp_path / d)
        for n in m.param_names:
            assert (r.get_param(n) == m.get_param(n)).all()
    assert fp4rl.RLSession(ctx, m).stop_tokens == ()
    (tmp_path / "one" / "generation_config.json").write_text('{"eos_token_id": [3, 9]}')
    s = fp4rl.RLSession(ctx, fp4rl.Model.from_pretrained(ctx, tmp_path / "one"))
    assert s.stop_tokens == (3, 9)
    s.stop_tokens = [4]
    assert s.stop_tokens == (4,)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(fp4rl.Error):
        m.save_pretrained(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_model_training_params_and_save_load(ctx, tmp_path):
    m = fp4rl.Model(ctx, TINY, seed=2, lr=3e-3)
    assert m.get_hparam("lr") == 3e-3 and m.hparams["beta1"] == 0.9 and tuple(m.hparams) == fp4rl.Model.HPARAMS
    m.set_hparams(grad_clip=1.0, weight_decay=0.01)
    assert m.hparams["grad_clip"] == 1.0
    # BF16 AdamW moments: 0/1, converted in place; anything else refused with the C message
    assert m.hparams["optimizer_moments"] == 0
    m.set_hparams(optimizer_moments=1)
    assert m.get_hparam("optimizer_moments") == 1
    with pytest.raises(fp4rl.InvalidArgumentError, match="optimizer_moments"):
        m.set_hparams(optimizer_moments=2)
    m.set_hparams(optimizer_moments=0)
    tok = np.array([[13, 1, 10, 2, 11, 3, 12, 0], [13, 4, 10, 4, 11, 8, 12, 0]], np.int32)
    lens = np.array([7, 7], np.int32)
    mask = np.zeros(tok.shape, np.float32)
    mask[:, 5:7] = 1
    lp = m.token_logprobs(tok, lens)
    assert lp.shape == (2, 8) and lp[0, 0] == 0 and lp[0, 7] == 0 and (lp[:, 1:7] < 0).all()
    full = m.logits(tok, lens)
    logsm = full - np.log(np.exp(full).sum(-1, keepdims=True))
    assert np.allclose(lp[0, 1:7], logsm[0, np.arange(6), tok[0, 1:7]], atol=1e-4)
    losses = [m.train_step(tok, lens, mask)[0] for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0] and m.step == 15
    assert np.abs(m.get_grad("model.layers.0.mlp.up_proj.weight")).sum() > 0
    w = m.get_param("model.layers.1.self_attn.q_proj.weight")
    assert m.param_shape("model.layers.1.self_attn.q_proj.weight") == w.shape == (32, 32)
    m.set_param("model.layers.1.self_attn.q_proj.weight", w * 2)
    assert (m.get_param("model.layers.1.self_attn.q_proj.weight") == w * 2).all()
    m.save(tmp_path / "w.safetensors")
    m2 = fp4rl.Model(ctx, TINY, seed=99)
    m2.load(tmp_path / "w.safetensors")
    assert (m2.logits(tok, lens) == m.logits(tok, lens)).all()
    m.save(tmp_path / "w16.safetensors", dtype="bf16")
    m2.load(tmp_path / "w16.safetensors")
    m2.set_policy(fp4rl.QuantPolicy("hif4_rl"))
    with pytest.raises(fp4rl.CorruptError, match=r"model.embed_tokens.weight: expected \[16, 64\]"):
        fp4rl.Model(ctx, {**TINY, "hidden_size": 64, "intermediate_size": 128}).load(tmp_path / "w.safetensors")


# ---- RLSession ----
def sevens(i, prompt, completion):
    """tests/test_session.c's reward: completions with many 7s."""
    return sum(t == 7 for t in completion) / 4.0


PROMPTS = [[13, 1, 10, 2, 11], [13, 3, 10, 4, 11], [13, 9, 10, 9, 11], [13, 5, 10, 0, 11]]


def new_session(ctx, model_seed=3, **kw):
    m = fp4rl.Model(ctx, TINY, fp4rl.QuantPolicy("hif4_rl"), seed=model_seed)
    return fp4rl.RLSession(ctx, m, stop_tokens=[12], group_size=4, max_new_tokens=4, lr=1e-3, **kw)


def test_state_dict_round_trip_and_bf16(ctx):
    a = fp4rl.Model(ctx, TINY, seed=1)
    b = fp4rl.Model(ctx, TINY, seed=2)
    sd = a.state_dict()
    assert list(sd) == a.param_names and all(np.array_equal(sd[n], a.get_param(n)) for n in sd)
    bad = dict(sd)
    bad["model.norm.weight"] = np.zeros(3, np.float32)  # wrong shape: nothing is written
    before = b.state_dict()
    with pytest.raises(fp4rl.ShapeError):
        b.load_state_dict(bad)
    with pytest.raises(fp4rl.InvalidArgumentError):
        b.load_state_dict({"no.such.weight": np.zeros(1, np.float32)})
    assert all(np.array_equal(before[n], v) for n, v in b.state_dict().items())
    b.load_state_dict(sd)
    assert all(np.array_equal(sd[n], v) for n, v in b.state_dict().items())
    ml_dtypes = pytest.importorskip("ml_dtypes")
    w = sd["model.norm.weight"] * 1.5
    b.set_param("model.norm.weight", w.astype(ml_dtypes.bfloat16))  # BF16 in: widened exactly
    assert np.array_equal(b.get_param("model.norm.weight"), w.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_grpo_config_defaults_and_trl_names(ctx):
    s = new_session(ctx)
    fresh = fp4rl.RLSession(ctx, s.model)
    assert fresh.config == fp4rl.GRPOConfig()  # the dataclass's defaults are the C library's
    assert fp4rl.GRPOConfig.names() == fp4rl.RLSession.HPARAMS
    assert "num_generations" in fp4rl.GRPOConfig.doc("group_size")
    c = fp4rl.GRPOConfig.from_trl(num_generations=4, max_completion_length=4, learning_rate=2e-3, beta=0.04,
                                  epsilon=0.1, epsilon_high=0.28, loss_type="dr_grpo", lr_scheduler_type="cosine",
                                  warmup_steps=1, max_steps=10, num_iterations=2, max_grad_norm=0.5)
    assert (c.group_size, c.max_new_tokens, c.lr, c.kl_coef, c.clip_low, c.clip_high) == (4, 4, 2e-3, 0.04, 0.1, 0.28)
    assert (c.loss_agg, c.adv_norm, c.lr_schedule, c.warmup_steps, c.total_steps, c.epochs, c.grad_clip) == (1, 0, 2, 1, 10, 2, 0.5)
    assert fp4rl.GRPOConfig.from_trl(loss_type="grpo", scale_rewards=False).to_dict()["adv_norm"] == 0
    with pytest.raises(TypeError):
        fp4rl.GRPOConfig.from_trl(num_generationz=4)
    with pytest.raises(ValueError):
        fp4rl.GRPOConfig.from_trl(loss_type="ppo")
    s2 = fp4rl.RLSession(ctx, s.model, config=c, clip_high=0.3)  # keyword arguments override the config
    assert s2.config == c.update({"clip_high": 0.3})


def test_grpo_config_top_p(ctx):
    # top-p: default 1 (off), TRL's name, the library's range (0, 1] refused outside with its message
    assert fp4rl.GRPOConfig().top_p == 1.0 and "(0, 1]" in fp4rl.GRPOConfig.doc("top_p")
    c = fp4rl.GRPOConfig.from_trl(top_p=0.9, num_generations=4)
    assert (c.top_p, c.group_size) == (0.9, 4)
    s = new_session(ctx, top_p=0.8)
    assert s.hparams["top_p"] == 0.8
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(fp4rl.InvalidArgumentError, match=r"top_p .*\(0, 1\]"):
            fp4rl.RLSession(ctx, s.model, top_p=bad)


def test_batched_rewards_equal_per_completion(ctx):
    # the same seed and prompts: a batched reward (TRL's form) gives the step a per-completion one gives
    out = []
    for batched in (False, True):
        s = new_session(ctx, seed=7)
        if batched:
            seen = []
            def rewards(prompts, completions):
                seen.append((prompts, completions))
                return [sevens(0, p, c) for p, c in zip(prompts, completions)]
            metrics = s.step(PROMPTS, rewards, batched=True)
            (prompts, completions), = seen
            assert len(completions) == 16 and all(list(p) == PROMPTS[i // 4] for i, p in enumerate(prompts))
        else:
            metrics = s.step(PROMPTS, sevens)
        out.append((metrics, s.model.get_param("model.norm.weight")))
    assert out[0][0]["reward/mean"] == out[1][0]["reward/mean"] and out[0][0]["pg/loss"] == out[1][0]["pg/loss"]
    assert np.array_equal(out[0][1], out[1][1])
    s = new_session(ctx)
    with pytest.raises(ValueError):
        s.step(PROMPTS, lambda p, c: [0.0], batched=True)


def test_session_lr_schedule(ctx):
    # warm-up of 2 updates then cosine to 0 at 4: lr 0, lr/2, lr, lr/2 (transformers' schedule)
    s = new_session(ctx, warmup_steps=2, lr_schedule=2, total_steps=4)
    assert (s.hparams["warmup_steps"], s.hparams["lr_schedule"], s.hparams["total_steps"]) == (2, 2, 4)
    got = [s.step(PROMPTS, lambda i, p, c: sevens(i, p, c))["lr"] for _ in range(4)]
    assert got == pytest.approx([0.0, 0.5e-3, 1e-3, 0.5e-3], abs=1e-15)
    with pytest.raises(fp4rl.Error):
        s.set(lr_schedule=3)


def test_session_hparams_and_metrics(ctx, tmp_path):
    s = new_session(ctx, clip_high=0.28, seed=42, metrics_file=tmp_path / "m.jsonl")
    hp = s.hparams
    assert tuple(hp) == fp4rl.RLSession.HPARAMS and len(hp) == fp4rl.capi.FP4RL_RL_PARAM_COUNT
    assert (hp["group_size"], hp["max_new_tokens"], hp["lr"], hp["clip_high"], hp["seed"]) == (4, 4, 1e-3, 0.28, 42)
    assert hp["tis_cap"] == 5 and s.stop_tokens == (12,)
    assert s.model.ctx is ctx and s.ctx is ctx
    assert s.metrics["step"] == 0
    seen = []
    metrics = s.step(PROMPTS, lambda i, p, c: seen.append((i, p, c)) or sevens(i, p, c))
    assert len(seen) == 16 and [i for i, _, _ in seen] == [k // 4 for k in range(16)]
    assert all(isinstance(p, tuple) and list(p) == PROMPTS[i] for i, p, _ in seen)
    assert all(1 <= len(c) <= 4 and (12 not in c[:-1]) for _, _, c in seen)
    assert tuple(metrics) == ("step",) + fp4rl.METRICS and metrics["step"] == 1 == s.step_count
    assert metrics["reward/mean"] == pytest.approx(np.mean([sevens(*x) for x in seen]))
    assert metrics["response_length/mean"] == pytest.approx(np.mean([len(c) for _, _, c in seen]))
    parsed = json.loads(s.metrics_json())
    assert parsed["step"] == 1 and parsed["reward/mean"] == metrics["reward/mean"]
    line = json.loads((tmp_path / "m.jsonl").read_text().splitlines()[-1])
    assert line["pg/loss"] == metrics["pg/loss"]
    s.metrics_file = None
    s.step(PROMPTS, sevens)
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 1
    assert "step 2" in repr(s)


def test_session_split_form_and_prompt_forms(ctx):
    s = new_session(ctx)
    comps = s.rollout(PROMPTS)
    assert len(comps) == 16 == s.num_completions
    c = comps[5]
    assert c.prompt_index == 1 and c.tokens.dtype == np.int32 and c.logprobs.shape == c.tokens.shape
    assert (c.logprobs <= 0).all()
    s.set_rewards([float(len(x.tokens)) for x in comps])
    metrics = s.train()
    assert metrics["step"] == 1 and metrics["reward/mean"] == pytest.approx(np.mean([len(x.tokens) for x in comps]))
    tokens, offsets = fp4rl.pack_prompts(PROMPTS)
    assert tokens.dtype == np.int32 and offsets.dtype == np.uintp and offsets.tolist() == [0, 5, 10, 15, 20]
    assert len(s.rollout(tokens, offsets=offsets)) == 16
    assert len(s.rollout(np.array(PROMPTS))) == 16  # a 2-D array: one prompt per row
    with pytest.raises(fp4rl.ShapeError):
        s.set_rewards(np.ones(3))
    with pytest.raises(fp4rl.InvalidArgumentError):
        s.rollout([[13, 99, 11]])  # a token outside the vocabulary: the library says so


def test_checkpoint_resume_is_bit_identical(ctx, tmp_path):
    """Save after step 1; continuing and resuming in a fresh context give the same weights."""
    s = new_session(ctx, kl_coef=0.01, minibatches=2)
    batches = [PROMPTS[k:] + PROMPTS[:k] for k in range(3)]
    s.step(batches[0], sevens)
    s.save(tmp_path / "ckpt")
    s.save(tmp_path / "ckpt")  # over an existing one
    for b in batches[1:]:
        want_metrics = s.step(b, sevens)
    want = s.model.get_param("model.layers.1.mlp.down_proj.weight")
    with fp4rl.Context(seed=999) as ctx2:
        s2 = fp4rl.RLSession(ctx2, fp4rl.Model(ctx2, TINY, seed=123), group_size=2)
        s2.load(tmp_path / "ckpt")
        assert s2.step_count == 1 and s2.get("group_size") == 4
        for b in batches[1:]:
            got_metrics = s2.step(b, sevens)
        assert (s2.model.get_param("model.layers.1.mlp.down_proj.weight") == want).all()
        assert got_metrics["reward/mean"] == want_metrics["reward/mean"] and got_metrics["pg/loss"] == want_metrics["pg/loss"]
        (tmp_path / "ckpt" / "state.json").write_text('{"format": "fp4rl-rl-checkpoint", "version": 1}')
        with pytest.raises(fp4rl.CorruptError):
            s2.load(tmp_path / "ckpt")
        assert (s2.model.get_param("model.layers.1.mlp.down_proj.weight") == want).all()


def test_context_memory_returns_to_baseline(ctx):
    base, peak, reserved = ctx.memory()
    assert reserved == base and peak >= base
    t = ctx.tensor(np.zeros((256, 256), dtype=np.float32))
    assert ctx.memory()[0] >= base + 256 * 256 * 4
    t.close()
    used, peak, _ = ctx.memory()
    assert used == base and peak >= base + 256 * 256 * 4
    ctx.reset_peak_memory()
    assert ctx.memory()[1] == base


def test_fit_loop_callback_and_progress():
    # fit = step per batch: the same weights as calling step() per batch; the callback sees each
    # step's metrics and stops the loop by returning False; progress lines name each phase. A
    # context per run: stochastic rounding draws from the context's counter.
    import io
    with fp4rl.Context(seed=5) as c0, fp4rl.Context(seed=5) as c1, fp4rl.Context(seed=5) as c2:
        ref = new_session(c0, seed=7)
        want = [ref.step(PROMPTS, sevens) for _ in range(2)]
        s = new_session(c1, seed=7)
        seen, log = [], io.StringIO()
        hist = s.fit(iter([PROMPTS] * 5), sevens, steps=3, callback=lambda i, m: seen.append((i, m)) or i < 1, progress=log)
        assert [i for i, _ in seen] == [0, 1] and len(hist) == 2  # stopped by the callback after the 2nd step
        assert [h["reward/mean"] for h in hist] == [w["reward/mean"] for w in want]
        assert np.array_equal(s.model.get_param("model.norm.weight"), ref.model.get_param("model.norm.weight"))
        lines = log.getvalue().splitlines()
        assert len(lines) == 4 and "step 1/3 rollout" in lines[0] and "| train" in lines[1] and "reward" in lines[1]
        # batched rewards through fit equal per-completion ones; steps bounds the loop
        b = new_session(c2, seed=7)
        hb = b.fit([PROMPTS] * 4, lambda ps, cs: [sevens(0, p, c) for p, c in zip(ps, cs)], steps=2, batched=True)
        assert len(hb) == 2 and [h["pg/loss"] for h in hb] == [w["pg/loss"] for w in want]
