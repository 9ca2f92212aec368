"""fp4rl.torch: fp4rl's FP4 training numerics inside a PyTorch model, layer by layer.

    import fp4rl, fp4rl.torch
    layer = fp4rl.torch.Linear(1536, 8960, bias=False, policy=fp4rl.QuantPolicy("hif4_rl"), device="cuda")
    y = layer(x)           # x: float32 [..., 1536]; autograd as torch.nn.Linear
    y.sum().backward()     # dX, dW with W, X and dY quantized exactly as fp4rl's own model does

The GEMMs run in libfp4rl (``fp4rl.Linear``) on torch's memory without copies (DLPack), on a
context of the tensor's device, ordered on torch's current CUDA stream. Inputs and weights are
float32 (the master weights, as fp4rl keeps them); outputs are float32.
"""

from __future__ import annotations

import math

import torch

from . import _dlpack
from ._layer import Linear as _Layer
from ._policy import QuantPolicy


def _context_for(t: torch.Tensor):
    dev = (2, t.device.index if t.device.index is not None else torch.cuda.current_device()) if t.is_cuda else (1, 0)
    ctx = _dlpack.default_context(*dev)
    if t.is_cuda:  # fp4rl's work joins torch's stream order
        ctx.set_stream(torch.cuda.current_stream(t.device))
    return ctx


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, weight, bias, module):
        # detached: torch refuses to export a tensor that requires grad through DLPack (a
        # Parameter passes .contiguous() unchanged); the Function itself owns the autograd edge
        shape = x.shape
        x2 = x.detach().reshape(-1, shape[-1]).contiguous()
        w = weight.detach().contiguous()
        bias = bias.detach().contiguous() if bias is not None else None
        layer = module._layer_for(x2)
        y = torch.empty(x2.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
        layer.forward(y, x2, w, bias)
        module._forwards += 1
        fctx.save_for_backward(x2, w, bias)
        fctx.module, fctx.shape, fctx.forward_id = module, shape, module._forwards
        return y.reshape(*shape[:-1], w.shape[0])

    @staticmethod
    def backward(fctx, gy):
        x2, w, bias = fctx.saved_tensors
        module = fctx.module
        layer = module._layer_for(x2)
        if module._forwards != fctx.forward_id:
            # the layer was called again since this forward (re-use, checkpointing): restore this
            # forward's saved operands by running it again (the same bits under nearest rounding;
            # stochastic rounding draws afresh)
            layer.forward(torch.empty(x2.shape[0], w.shape[0], dtype=torch.float32, device=x2.device), x2, w, bias)
            module._forwards += 1
        gy2 = gy.reshape(-1, gy.shape[-1]).to(torch.float32).contiguous()
        need_x, need_w, need_b = fctx.needs_input_grad[:3]
        dx = torch.zeros_like(x2) if need_x else None
        dw = torch.zeros_like(w) if need_w else None
        db = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if (need_b and bias is not None) else None
        if dx is not None or dw is not None or db is not None:
            layer.backward(gy2, dx=dx, dw=dw, db=db)
        return (dx.reshape(fctx.shape) if dx is not None else None), dw, db, None


class Linear(torch.nn.Module):
    """A drop-in for ``torch.nn.Linear`` (float32 weights, the same initialisation) whose three
    GEMMs run in fp4rl with the training numerics of ``policy`` (``qk=True``: a q/k projection,
    where the policy's FORMAT_QK applies). Gradients equal those of fp4rl's own model linear for
    the same inputs and random stream."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, policy: QuantPolicy | None = None,
                 qk: bool = False, device=None):
        super().__init__()
        self.in_features, self.out_features, self.qk = in_features, out_features, qk
        self.policy = policy
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=torch.float32, device=device))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=torch.float32, device=device)) if bias else None
        self._layers: dict = {}
        self._forwards = 0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # torch.nn.Linear's
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def _layer_for(self, t: torch.Tensor) -> _Layer:
        ctx = _context_for(t)
        key = id(ctx)
        if key not in self._layers:
            self._layers[key] = _Layer(ctx, self.policy, qk=self.qk)
        return self._layers[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"fp4rl.torch.Linear takes float32 inputs, not {x.dtype} (fp4rl quantizes from FP32)")
        return _LinearFn.apply(x, self.weight, self.bias, self)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, qk={self.qk}"
