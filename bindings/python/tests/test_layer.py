"""fp4rl.Linear (the C layer API) and fp4rl.torch.Linear (its autograd Function): FP32 numerics
equal a plain matmul; FP4 numerics are the C layer's, bit for bit, from the same random stream;
bad input raises without writing."""

import numpy as np
import pytest

import fp4rl

N, IN, OUT = 33, 64, 24


def data(seed):
    r = np.random.default_rng(seed)
    x = r.standard_normal((N, IN), dtype=np.float32)
    x[:, ::9] *= 25  # outliers: FP4 rounding matters
    return x, (0.1 * r.standard_normal((OUT, IN))).astype(np.float32), r.standard_normal(OUT).astype(np.float32), \
        r.standard_normal((N, OUT)).astype(np.float32)


def run_layer(ctx, policy, x, w, b, dy, offset=7):
    lin = fp4rl.Linear(ctx, policy)
    ctx.rng_offset = offset
    y = np.zeros((N, OUT), np.float32)
    dx, dw, db = np.zeros_like(x), np.zeros_like(w), np.zeros_like(b)
    lin.forward(y, x, w, b)
    lin.backward(dy, dx=dx, dw=dw, db=db)
    return y, dx, dw, db


def test_fp32_layer_is_a_matmul(ctx):
    x, w, b, dy = data(1)
    y, dx, dw, db = run_layer(ctx, fp4rl.QuantPolicy(train_numerics="fp32"), x, w, b, dy)
    np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dx, dy @ w, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dw, dy.T @ x, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(db, dy.sum(0), rtol=1e-5, atol=1e-4)


def test_fp4_layer_quantizes_and_repeats(ctx):
    x, w, b, dy = data(2)
    pol = fp4rl.QuantPolicy("hif4_rl")
    a = run_layer(ctx, pol, x, w, b, dy)
    c = run_layer(ctx, pol, x, w, b, dy)  # the same stream offset: the same draws, the same bits
    for u, v in zip(a, c):
        assert np.array_equal(u, v)
    err = np.abs(a[0] - (x @ w.T + b)).max()
    assert 1e-3 < err < 0.2 * np.abs(x @ w.T).max()  # rounded, but a linear layer still


def test_bad_input_raises(ctx):
    lin = fp4rl.Linear(ctx)
    x, w, b, dy = data(3)
    y = np.zeros((N, OUT), np.float32)
    with pytest.raises(fp4rl.InvalidArgumentError):
        lin.backward(dy, dx=np.zeros_like(x))  # no forward yet
    with pytest.raises(fp4rl.ShapeError):
        lin.forward(y, x, w.T.copy())
    with pytest.raises(TypeError):
        lin.forward(y, x.astype(np.float64), w)
    assert not y.any()
    lin.forward(y, x, w)
    with pytest.raises(fp4rl.InvalidArgumentError):
        lin.backward(dy)  # nothing asked for
