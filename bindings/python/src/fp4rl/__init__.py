"""fp4rl: end-to-end FP4 RL post-training of LLMs (Python binding of libfp4rl).

    import fp4rl
    with fp4rl.Context() as ctx:
        q = ctx.quantize(np.random.randn(4, 64).astype(np.float32), "hif4")
        print(q.quant_info(), q.numpy())

The Pythonic classes (Context, Tensor, QuantPolicy, Model, RLSession) are built on ``fp4rl.capi``,
the SWIG-generated module with one function per C function of fp4rl.h. Every failure raises an
``fp4rl.Error`` subclass of the status's family with the C library's message.
"""

from . import capi
from .capi import (
    CallbackError,
    CorruptError,
    DeviceError,
    DTypeError,
    Error,
    InternalError,
    InvalidArgumentError,
    FileIOError,
    IOError_,
    OutOfMemoryError,
    ShapeError,
    UnsupportedError,
)
from ._context import Context, Tensor, nccl_unique_id
from ._dlpack import from_dlpack
from ._model import Model
from ._layer import Linear
from ._policy import QuantPolicy
from ._config import GRPOConfig
from ._session import Completion, RLSession, pack_prompts
from ._names import DTYPES as _DTYPES, PRESETS as _PRESETS

__version__ = capi.fp4rl_version_string()
DTYPES = tuple(_DTYPES)
PRESETS = tuple(_PRESETS)
METRICS = RLSession.METRICS


def version() -> str:
    """The version of the linked libfp4rl ("MAJOR.MINOR.PATCH")."""
    return capi.fp4rl_version_string()


def last_error() -> str:
    """This thread's message of the last failed fp4rl call ("" if none)."""
    return capi.fp4rl_last_error()


__all__ = [
    "Context", "Tensor", "from_dlpack", "nccl_unique_id", "QuantPolicy", "Model", "Linear", "RLSession", "GRPOConfig", "Completion", "pack_prompts",
    "Error", "InvalidArgumentError", "ShapeError", "DTypeError", "UnsupportedError", "OutOfMemoryError",
    "DeviceError", "FileIOError", "IOError_", "CorruptError", "CallbackError", "InternalError",
    "DTYPES", "PRESETS", "METRICS", "version", "last_error", "capi",
]
