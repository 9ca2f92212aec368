"""Linear: one linear layer in a policy's training numerics (fp4rl_linear_*), the exact arithmetic
of an fp4rl model's block linear on the caller's tensors; fp4rl.torch.Linear builds on it."""

from __future__ import annotations

import numpy as np

from . import capi
from ._base import _Owned
from ._context import Context, Tensor
from ._policy import QuantPolicy


def _as_tensor(ctx: Context, x):
    """x as an fp4rl Tensor of ctx: itself, or a zero-copy wrap of a DLPack array (numpy float32
    on a CPU context, torch tensors on either) -> (tensor, the array the result lives in)."""
    if x is None or isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray) and (x.dtype != np.float32 or not x.flags.c_contiguous):
        raise TypeError("fp4rl.Linear takes C-contiguous float32 arrays (no silent copies: convert first)")
    return Tensor.from_dlpack(x, ctx)


class Linear(_Owned):
    """``y = x w^T + b`` with W, X and dY quantized exactly as fp4rl's own model does in the
    training numerics of ``policy`` (formats, 2D tiles shared by forward and backward, stochastic
    rounding from the context's stream); ``qk=True`` for a q/k projection (FORMAT_QK applies).

        lin = fp4rl.Linear(ctx, fp4rl.QuantPolicy("hif4_rl"))
        lin.forward(y, x, w, b)              # fp4rl Tensors or float32 arrays (no copies)
        lin.backward(dy, dx=dx, dw=dw, db=db)  # accumulates into the given gradients

    ``x`` and ``w`` must stay alive and unchanged between a forward and its backward."""

    _destroy = staticmethod(capi.fp4rl_linear_destroy)

    def __init__(self, ctx: Context, policy: QuantPolicy | None = None, *, qk: bool = False):
        self._adopt(capi.fp4rl_linear_create(ctx._h, policy._h if policy is not None else None, int(bool(qk))))
        self.ctx = ctx
        self._saved = None

    def forward(self, y, x, w, b=None) -> None:
        ty, tx, tw, tb = (_as_tensor(self.ctx, a) for a in (y, x, w, b))
        capi.fp4rl_linear_forward(self._h, ty._h, tx._h, tw._h, tb._h if tb is not None else None)
        self._saved = (tx, tw, x, w)  # the C layer reads x and w again in the backward

    def backward(self, dy, *, dx=None, dw=None, db=None) -> None:
        tdy, tdx, tdw, tdb = (_as_tensor(self.ctx, a) for a in (dy, dx, dw, db))
        capi.fp4rl_linear_backward(self._h, *(t._h if t is not None else None for t in (tdx, tdw, tdb)), tdy._h)
