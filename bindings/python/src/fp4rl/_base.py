"""The common part of every Pythonic fp4rl object: it wraps one owning ``capi.Handle``.

Lifetime is the handle's business (capi_runtime.h): the C object is destroyed exactly once, when
the handle goes or is closed, and never before the handles that depend on it. ``close()`` and
``with`` only make that happen now instead of at garbage collection. The Pythonic objects also
keep their parent objects (``tensor.ctx``, ``session.model``) as plain attributes for the user's
convenience; safety does not depend on those."""

from __future__ import annotations

import numpy as np

from . import capi


class _Owned:
    __slots__ = ("_h", "__weakref__")
    _destroy = None  # the capi *_destroy function of the subclass

    def _adopt(self, handle: capi.Handle) -> None:
        self._h = handle

    @property
    def handle(self) -> capi.Handle:
        """The low-level ``fp4rl.capi.Handle`` (pass it to ``fp4rl.capi`` functions)."""
        return self._h

    @property
    def closed(self) -> bool:
        return self._h.closed

    def close(self) -> None:
        """Release the C object now (or, if objects made from it still live, when the last of them
        goes). Idempotent; the object cannot be used afterwards."""
        type(self)._destroy(self._h)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def as_array(x, dtype, what: str) -> np.ndarray:
    """``x`` as a C-contiguous array of ``dtype``; the same object (no copy) when it already is one.

    Integer inputs of a wider type are range-checked, since a silent wrap-around would turn a bad
    token id into a valid one. Float inputs may be BF16 (ml_dtypes.bfloat16 arrays, widened exactly)
    and torch tensors (any device, requires_grad or not, bfloat16 included: detached and copied to
    the host)."""
    if hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy"):  # a torch.Tensor
        x = x.detach()
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":
            x = x.float()
        x = x.cpu().numpy()
    a = np.asarray(x)
    want = np.dtype(dtype)
    if a.dtype.name == "bfloat16" and want.kind == "f":  # ml_dtypes: every BF16 value is an exact FP32
        a = a.astype(np.float32)
    if a.dtype != want:
        if want.kind in "iu":
            if a.dtype.kind not in "iub":
                raise TypeError(f"{what} must hold integers, not {a.dtype}")
            if a.size:
                info = np.iinfo(want)
                lo, hi = a.min(), a.max()
                if lo < info.min or hi > info.max:
                    raise capi.InvalidArgumentError(f"{what} holds {lo}..{hi}, outside {want}'s range")
        elif want.kind == "f" and a.dtype.kind not in "fiub":
            raise TypeError(f"{what} must hold numbers, not {a.dtype}")
    return np.ascontiguousarray(a, dtype=want)
