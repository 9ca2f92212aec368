"""Context (a device, its memory and its random state) and Tensor (dense or quantized, in a
context), with numpy in and out through the buffer protocol."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from . import _dlpack, _names, capi
from ._base import _Owned, as_array

# numpy dtype of a dense tensor's host elements (bf16: its uint16 bit patterns)
_HOST_DTYPE = {"f32": np.float32, "bf16": np.uint16, "i32": np.int32}


def _is_bfloat16(dt: np.dtype) -> bool:
    # ml_dtypes.bfloat16 (and jax's) reports this name; its bytes are bf16 bit patterns
    return dt.name == "bfloat16" and dt.itemsize == 2


class Context(_Owned):
    """A device, its memory and its random-number state. ``Context()`` is the CPU;
    ``Context("cuda", 0)`` the first GPU (DeviceError without one, UnsupportedError in a build
    without CUDA). One thread at a time per context, as in C."""

    _destroy = staticmethod(capi.fp4rl_context_destroy)

    def __init__(self, device: str | int = "cpu", ordinal: int = 0, *, seed: int | None = None):
        self._adopt(capi.fp4rl_context_create(_names.lookup(_names.DEVICES, device, "device"), ordinal))
        self._ordinal, self._stream = ordinal, None
        if seed is not None:
            self.seed = seed

    @classmethod
    def distributed(cls, ordinal: int, rank: int, world_size: int, nccl_id: bytes, *, seed: int | None = None) -> "Context":
        """A CUDA context on GPU ``ordinal`` that joins the NCCL communicator of ``world_size``
        ranks named by ``nccl_id`` (rank 0's ``fp4rl.nccl_unique_id()``, carried to every rank by
        the job's own means, e.g. ``torch.distributed.broadcast_object_list``) as ``rank``. Blocks
        until every rank has joined. Its RL sessions train data-parallel: every rank passes the
        same global prompts to ``RLSession.step``."""
        ctx = object.__new__(cls)
        ctx._adopt(capi.fp4rl_context_create_distributed(ordinal, rank, world_size, bytes(nccl_id)))
        ctx._ordinal, ctx._stream = ordinal, None
        if seed is not None:
            ctx.seed = seed
        return ctx

    @property
    def rank(self) -> int:
        """This process's rank in a distributed context (0 otherwise)."""
        return capi.fp4rl_context_get_rank(self._h)[0]

    @property
    def world_size(self) -> int:
        """The number of ranks of a distributed context (1 otherwise)."""
        return capi.fp4rl_context_get_rank(self._h)[1]

    def __repr__(self) -> str:
        return f"<fp4rl.Context {self.device if not self.closed else 'closed'}>"

    @property
    def device(self) -> str:
        code = capi.fp4rl_context_device(self._h)
        return next((k for k, v in _names.DEVICES.items() if v == code), str(code))

    # ---- streams (CUDA) ----
    def set_stream(self, stream) -> None:
        """Orders all of the context's later work on ``stream`` (after its earlier work): a
        ``torch.cuda.Stream`` (e.g. ``torch.cuda.current_stream()``; its default stream is CUDA's
        legacy stream), a ``cupy.cuda.Stream``, a cudaStream_t as an int, or None for the
        context's own stream. On the same stream as the framework, fp4rl and it need no other
        synchronization. The stream must outlive its use: set None before destroying it. A CPU
        context takes None only (UnsupportedError otherwise)."""
        s = _dlpack.stream_handle(stream)
        capi.fp4rl_context_set_stream(self._h, s)
        self._stream = s

    @property
    def stream(self) -> int | None:
        """The stream set by :meth:`set_stream` as an int (None: the context's own)."""
        return self._stream

    def _order_before(self, stream: int | None) -> None:
        # `stream` waits for the context's queued work: switching to it records the context's
        # stream's progress into it, switching back orders the context after it again
        if stream == self._stream:
            return
        capi.fp4rl_context_set_stream(self._h, stream)
        capi.fp4rl_context_set_stream(self._h, self._stream)

    def _dlpack_device(self) -> tuple[int, int]:
        return (_dlpack.DL_CPU, 0) if self.device == "cpu" else (_dlpack.DL_CUDA, self._ordinal)

    # ---- random state (stochastic rounding) ----
    @property
    def seed(self) -> int:
        return capi.fp4rl_context_get_rng(self._h)[0]

    @seed.setter
    def seed(self, seed: int) -> None:
        """Sets the seed of stochastic rounding and resets the offset to 0."""
        capi.fp4rl_context_set_seed(self._h, seed)

    @property
    def rng_offset(self) -> int:
        return capi.fp4rl_context_get_rng(self._h)[1]

    @rng_offset.setter
    def rng_offset(self, offset: int) -> None:
        capi.fp4rl_context_set_rng_offset(self._h, offset)

    @property
    def rng(self) -> tuple[int, int]:
        """(seed, offset): a run is replayable from these."""
        return capi.fp4rl_context_get_rng(self._h)

    # ---- memory statistics ----
    def memory(self) -> tuple[int, int, int]:
        """(in_use, peak, reserved): bytes of the context's device memory held by fp4rl now, the
        high-water mark, and what its caching allocator holds (in_use on the CPU)."""
        return capi.fp4rl_context_memory(self._h)

    def reset_peak_memory(self) -> None:
        """Sets the peak of :meth:`memory` to the bytes in use now."""
        capi.fp4rl_context_reset_peak_memory(self._h)

    # ---- tensors ----
    def tensor(self, data, dtype: str | None = None) -> "Tensor":
        """A dense tensor with a copy of ``data`` (any array-like). A C-contiguous array of the
        tensor's element type is handed to the library without a copy on the Python side:
        float32 -> "f32", int32 -> "i32", uint16 or ml_dtypes.bfloat16 -> "bf16" (bit patterns).
        Other arrays are converted (float64 -> f32, ...)."""
        return Tensor.from_numpy(self, data, dtype)

    def zeros(self, shape: Iterable[int] | int, dtype: str = "f32") -> "Tensor":
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return Tensor._wrap(self, capi.fp4rl_tensor_zeros(self._h, _names.dtype_code(dtype), shape))

    def import_quantized(self, dtype: str, shape, codes, scales, *, tile: int = 0, tensor_scale: float = 1.0) -> "Tensor":
        """A quantized tensor from packed codes and scales in the header's layout (copied)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return Tensor._wrap(self, capi.fp4rl_tensor_import_quantized(
            self._h, _names.dtype_code(dtype), shape, tile, _bytes_view(codes), _bytes_view(scales), float(tensor_scale)))

    def _tensor_arg(self, x) -> "Tensor":
        return x if isinstance(x, Tensor) else self.tensor(x)

    # ---- quantize, dequantize, transpose, matmul, quantization error ----
    def quantize(self, x, format: str, policy=None, role: str = "weight") -> "Tensor":
        """Quantizes ``x`` (a Tensor or an array, f32/bf16) to ``format`` ("mxfp4", "nvfp4",
        "hif4", "mxfp8_e4m3") with the tile, rounding and scale rule ``policy`` gives ``role``
        (None: the plain defaults)."""
        src = self._tensor_arg(x)
        return Tensor._wrap(self, capi.fp4rl_quantize(
            self._h, src._h, _names.dtype_code(format), policy._h if policy is not None else None,
            _names.lookup(_names.ROLES, role, "role")))

    def dequantize(self, q: "Tensor", dtype: str = "f32") -> "Tensor":
        return Tensor._wrap(self, capi.fp4rl_dequantize(self._h, q._h, _names.dtype_code(dtype)))

    def transpose(self, t) -> "Tensor":
        """Transposes a 2-dim tensor: dense, or 2D-tiled quantized (a reshuffle of codes and scales)."""
        return Tensor._wrap(self, capi.fp4rl_tensor_transpose(self._h, self._tensor_arg(t)._h))

    def matmul(self, a, b, out: "Tensor | None" = None, out_dtype: str = "f32") -> "Tensor":
        """C[M,N] = A[M,K] @ B[N,K]^T with FP32 accumulation. A and B: Tensors (dense or quantized
        along K) or arrays; ``out``: an existing dense [M,N] tensor to overwrite, else a new one."""
        ta, tb = self._tensor_arg(a), self._tensor_arg(b)
        if out is None:
            out = self.zeros((ta.shape[0], tb.shape[0]) if ta.ndim == 2 and tb.ndim == 2 else (1,), out_dtype)
        capi.fp4rl_matmul(out._h, self._h, ta._h, tb._h)
        return out

    def quant_error(self, src, q: "Tensor") -> dict[str, float]:
        """The quantization-error report of ``q`` against its dense source ``src``."""
        s = self._tensor_arg(src)
        rel_mse, underflow, saturated, nan_blocks = capi.fp4rl_quant_error(s._h, q._h)
        return {"rel_mse": rel_mse, "underflow_frac": underflow, "saturated_frac": saturated, "nan_block_frac": nan_blocks}

    def fake_quantize(self, x, format: str, policy=None, role: str = "weight") -> np.ndarray:
        """``x`` quantized to ``format`` and dequantized back to float32, as a numpy array."""
        with self.quantize(x, format, policy, role) as q:
            return q.numpy()


def nccl_unique_id() -> bytes:
    """A new NCCL unique id (``capi.FP4RL_NCCL_UNIQUE_ID_BYTES`` bytes), made on rank 0 of a
    multi-GPU job for ``Context.distributed``. UnsupportedError without NCCL."""
    return capi.fp4rl_nccl_unique_id()


def _bytes_view(x) -> memoryview | np.ndarray:
    a = np.asarray(x)
    return np.ascontiguousarray(a).view(np.uint8) if a.dtype != np.uint8 else np.ascontiguousarray(a)


class Tensor(_Owned):
    """A tensor in a context: dense (f32, bf16, i32) or quantized (mxfp4, nvfp4, hif4, mxfp8_e4m3).
    Made by a Context (``ctx.tensor(array)``, ``ctx.quantize(...)``, ...) or ``Tensor.from_numpy``;
    ``.ctx`` is its Context, kept alive by the tensor."""

    _destroy = staticmethod(capi.fp4rl_tensor_destroy)

    def __init__(self, *args, **kwargs):
        raise TypeError("make tensors with Context.tensor / Context.zeros / Tensor.from_numpy / Context.quantize")

    @classmethod
    def _wrap(cls, ctx: Context, handle: capi.Handle) -> "Tensor":
        t = object.__new__(cls)
        t._adopt(handle)
        t.ctx = ctx
        return t

    @classmethod
    def from_numpy(cls, ctx: Context, data, dtype: str | None = None) -> "Tensor":
        a = np.asarray(data)
        if _is_bfloat16(a.dtype):
            a = np.ascontiguousarray(a).view(np.uint16)
            dtype = dtype or "bf16"
        if dtype is None:
            dtype = "i32" if a.dtype.kind in "iu" else "f32"
        name = _names.dtype_name(_names.dtype_code(dtype))
        if name not in _HOST_DTYPE:
            raise capi.DTypeError(f"Tensor.from_numpy makes dense tensors (f32, bf16, i32), not {name}; "
                                  "quantize a dense tensor, or use Context.import_quantized")
        if name == "bf16":
            if a.dtype.itemsize != 2 or a.dtype.kind not in "ui":
                raise capi.DTypeError("a bf16 tensor takes its bit patterns as uint16 (or an ml_dtypes.bfloat16 array), "
                                      f"not {a.dtype}")
            a = np.ascontiguousarray(a)
        else:
            a = as_array(a, _HOST_DTYPE[name], "data")
        shape = a.shape if a.ndim else (1,)
        return cls._wrap(ctx, capi.fp4rl_tensor_from_host(ctx._h, _names.DTYPES[name], shape, a))

    @classmethod
    def from_dlpack(cls, x, ctx: Context | None = None) -> "Tensor":
        """See :func:`fp4rl.from_dlpack` (no copy)."""
        return _dlpack.from_dlpack(x, ctx)

    # ---- the DLPack protocol (producer side; no copy) ----
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of the tensor's elements in place (dense tensors). On a GPU the
        consumer's ``stream`` is ordered after the context's queued work (None: the legacy default
        stream; -1: no ordering). The capsule keeps this tensor alive."""
        return _dlpack.export(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(DLPack device type, device id): (1, 0) on the CPU, (2, ordinal) on a GPU."""
        return self.ctx._dlpack_device()

    @property
    def data_ptr(self) -> int:
        """The address of a dense tensor's elements (device memory on a GPU); DTypeError for a
        quantized tensor."""
        p = capi.fp4rl_tensor_data(self._h)
        if p is None:
            raise capi.DTypeError(capi.fp4rl_last_error())
        return p

    def __repr__(self) -> str:
        if self.closed:
            return "<fp4rl.Tensor closed>"
        return f"<fp4rl.Tensor {self.dtype} {list(self.shape)}>"

    # ---- properties ----
    @property
    def dtype(self) -> str:
        return _names.dtype_name(capi.fp4rl_tensor_dtype(self._h))

    @property
    def ndim(self) -> int:
        return capi.fp4rl_tensor_ndim(self._h)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(capi.fp4rl_tensor_dim(self._h, i) for i in range(self.ndim))

    @property
    def numel(self) -> int:
        return capi.fp4rl_tensor_numel(self._h)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (dense), or of the codes plus the scales (quantized)."""
        return capi.fp4rl_tensor_nbytes(self._h)

    @property
    def is_quantized(self) -> bool:
        return self.dtype in _names.QUANTIZED_DTYPES

    # ---- host copies ----
    def numpy(self) -> np.ndarray:
        """A new numpy array with the tensor's values: f32 -> float32, i32 -> int32, bf16 -> uint16
        bit patterns; a quantized tensor gives its exact dequantized float32 values."""
        if self.is_quantized:
            with self.ctx.dequantize(self, "f32") as d:
                return d.numpy()
        out = np.empty(self.shape, dtype=_HOST_DTYPE[self.dtype])
        capi.fp4rl_tensor_to_host(self._h, out)
        return out

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def quant_info(self) -> dict:
        """tile (0 = 1D blocks), codes_bytes, scales_bytes, tensor_scale (NVFP4; else 1.0)."""
        tile, codes_bytes, scales_bytes, tensor_scale = capi.fp4rl_tensor_quant_info(self._h)
        return {"tile": tile, "codes_bytes": codes_bytes, "scales_bytes": scales_bytes, "tensor_scale": tensor_scale}

    def codes(self) -> np.ndarray:
        """The packed codes (uint8, row-major, layout in fp4rl.h)."""
        out = np.empty(self.quant_info()["codes_bytes"], dtype=np.uint8)
        capi.fp4rl_tensor_codes_to_host(self._h, out)
        return out

    def scales(self) -> np.ndarray:
        """The scales: uint32 little-endian words for HiF4, uint8 (E8M0 / UE4M3) for the others."""
        out = np.empty(self.quant_info()["scales_bytes"], dtype=np.uint8)
        capi.fp4rl_tensor_scales_to_host(self._h, out)
        return out.view("<u4") if self.dtype == "hif4" else out

    # ---- operations (in the tensor's context) ----
    def quantize(self, format: str, policy=None, role: str = "weight") -> "Tensor":
        return self.ctx.quantize(self, format, policy, role)

    def dequantize(self, dtype: str = "f32") -> "Tensor":
        return self.ctx.dequantize(self, dtype)

    def transpose(self) -> "Tensor":
        return self.ctx.transpose(self)

    @property
    def T(self) -> "Tensor":
        return self.transpose()

    def matmul(self, b, out: "Tensor | None" = None, out_dtype: str = "f32") -> "Tensor":
        """self[M,K] @ b[N,K]^T (see Context.matmul)."""
        return self.ctx.matmul(self, b, out, out_dtype)

    def quant_error(self, src) -> dict[str, float]:
        """This quantized tensor's error against its dense source."""
        return self.ctx.quant_error(src, self)
