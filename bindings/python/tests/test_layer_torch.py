"""fp4rl.torch.Linear (skipped without torch): FP32 numerics equal torch.nn.Linear's; FP4 numerics
equal the C layer's (fp4rl.Linear) bit for bit from the same random stream."""

import numpy as np
import pytest

import fp4rl
from test_layer import IN, OUT, data, run_layer

torch = pytest.importorskip("torch")
import fp4rl.torch as ftorch  # noqa: E402


def test_torch_fp32_equals_torch_nn_linear():
    x, _, _, dy = data(4)
    lin = ftorch.Linear(IN, OUT, policy=fp4rl.QuantPolicy(train_numerics="fp32"))
    ref = torch.nn.Linear(IN, OUT)
    ref.load_state_dict(lin.state_dict())
    xs = [torch.tensor(x, requires_grad=True) for _ in range(2)]
    for m, xt in ((lin, xs[0]), (ref, xs[1])):
        (m(xt) * torch.tensor(dy)).sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(lin.bias.grad, ref.bias.grad, rtol=1e-5, atol=1e-4)


def test_torch_fp4_equals_the_c_layer(ctx):
    x, w, b, dy = data(5)
    pol = fp4rl.QuantPolicy("hif4_rl", seed=123)  # the policy's seed: both contexts draw the same stream
    want = run_layer(ctx, pol, x, w, b, dy, offset=11)
    lin = ftorch.Linear(IN, OUT, policy=pol)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(w))
        lin.bias.copy_(torch.tensor(b))
    xt = torch.tensor(x, requires_grad=True)
    fp4rl._dlpack.default_context(1, 0).rng_offset = 11
    y = lin(xt)
    (y * torch.tensor(dy)).sum().backward()
    assert np.array_equal(y.detach().numpy(), want[0])
    assert np.array_equal(xt.grad.numpy(), want[1])
    assert np.array_equal(lin.weight.grad.numpy(), want[2])
    assert np.array_equal(lin.bias.grad.numpy(), want[3])


@pytest.mark.gpu
def test_torch_cuda_equals_the_cpu():
    """The same layer on a CUDA tensor, on torch's stream: forward and all three gradients match the
    CPU's (HiF4 RL recipe, stochastic rounding from the same stream). The quantized operands are the
    same bits; only the GEMMs' FP32 summation order differs (cuBLASLt vs OpenBLAS)."""
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x, w, b, dy = data(6)
    pol = fp4rl.QuantPolicy("hif4_rl", seed=321)
    out = {}
    for dev in ("cpu", "cuda"):
        lin = ftorch.Linear(IN, OUT, policy=pol, device=dev)
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(w))
            lin.bias.copy_(torch.tensor(b))
        xt = torch.tensor(x, device=dev, requires_grad=True)
        ctx = fp4rl._dlpack.default_context(*((2, 0) if dev == "cuda" else (1, 0)))
        ctx.rng_offset = 17
        y = lin(xt)
        (y * torch.tensor(dy, device=dev)).sum().backward()
        out[dev] = [t.detach().cpu().numpy() for t in (y, xt.grad, lin.weight.grad, lin.bias.grad)]
    for got, want in zip(out["cuda"], out["cpu"]):
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
