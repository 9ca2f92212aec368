"""CUDA contexts through the binding (skipped without a usable GPU): device tensors in and out of
numpy, and quantization and matmul bit-identical to / consistent with the CPU reference."""

import numpy as np
import pytest

import fp4rl
from conftest import TINY


def test_device_tensors_round_trip(gpu):
    assert gpu.device == "cuda"
    x = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32)
    t = gpu.tensor(x)
    assert t.ctx is gpu and t.shape == x.shape and (t.numpy() == x).all()
    assert (gpu.tensor(np.arange(6, dtype=np.int32)).numpy() == np.arange(6)).all()
    assert (gpu.zeros((4, 4)).numpy() == 0).all()


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "hif4", "mxfp8_e4m3"])
@pytest.mark.parametrize("preset", ["default", "stable_2d_mxfp4", "hif4_rl"])
def test_quantize_matches_the_cpu_bit_for_bit(gpu, fmt, preset):
    x = np.random.default_rng(1).standard_normal((64, 192)).astype(np.float32)
    x[3, 17] = 40.0  # an outlier
    policy = fp4rl.QuantPolicy(preset)
    if fmt == "hif4" and policy["tile_weight"] not in (0, 64):
        policy.set(tile_weight=0)
    with fp4rl.Context() as cpu:
        for role in ("weight", "gradient"):  # nearest and (for the presets) stochastic rounding
            cpu.seed = gpu.seed = 3
            cpu.rng_offset = gpu.rng_offset = 10
            qc, qg = cpu.quantize(x, fmt, policy, role), gpu.quantize(x, fmt, policy, role)
            assert qg.quant_info() == qc.quant_info()
            assert (qg.codes() == qc.codes()).all() and (qg.scales() == qc.scales()).all(), role
            assert (qg.numpy() == qc.numpy()).all()
            assert gpu.rng == cpu.rng


def test_matmul_and_transpose_on_the_gpu(gpu):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((32, 256)).astype(np.float32)
    w = rng.standard_normal((128, 256)).astype(np.float32)
    p = fp4rl.QuantPolicy("stable_2d_mxfp4")
    qa, qw = gpu.quantize(a, "mxfp4", p, "activation"), gpu.quantize(w, "mxfp4", p, "weight")
    out = gpu.matmul(qa, qw).numpy()
    ref = qa.numpy().astype(np.float64) @ qw.numpy().astype(np.float64).T
    assert np.allclose(out, ref, rtol=1e-4, atol=1e-3)
    assert (qw.T.codes() == gpu.quantize(w.T.copy(), "mxfp4", p, "weight").codes()).all()
    assert np.allclose(gpu.matmul(a, w).numpy(), a @ w.T, rtol=1e-4, atol=1e-3)


def test_model_on_the_gpu_runs_or_says_why(gpu):
    try:
        m = fp4rl.Model(gpu, TINY)
    except fp4rl.UnsupportedError as e:
        assert str(e) == fp4rl.last_error() and "CPU" in str(e)
        pytest.skip(f"the CUDA backend has no model yet: {e}")
    assert m.logits([13, 1, 10]).shape == (3, 16)
