"""DLPack both ways, without copies: ``fp4rl.from_dlpack(x)`` wraps a producer's array (a torch
tensor, a numpy or CuPy array) as an fp4rl Tensor on the same memory, and fp4rl Tensors have
``__dlpack__`` / ``__dlpack_device__``, so ``torch.from_dlpack(t)`` and ``np.from_dlpack(t)`` see
the fp4rl tensor's memory. The capsules themselves are made and read in C (dlpack_capi.h).

Streams (CUDA): the protocol's rule is that the producer orders its pending work before the
consumer's stream. As a producer, ``Tensor.__dlpack__(stream=s)`` makes ``s`` wait for the
context's queued work; as a consumer, ``from_dlpack`` hands the producer the context's stream
(``Context.set_stream``), or, while the context runs on its own stream, CUDA's legacy default
stream, which the context's own (blocking) stream is implicitly ordered after.
"""

from __future__ import annotations

from . import capi

# DLDeviceType values of the DLPack specification
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
_LEGACY_STREAM = 1  # the protocol's (and CUDA's cudaStreamLegacy) value for the legacy default stream

_default_contexts: dict = {}


def stream_handle(stream) -> int | None:
    """A stream as the int the C library takes: None (the context's own), an int (a cudaStream_t;
    0, the NULL stream, means CUDA's legacy default stream, which is PyTorch's default stream), or
    an object with ``cuda_stream`` (torch.cuda.Stream) or ``ptr`` (cupy.cuda.Stream)."""
    if stream is None:
        return None
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            stream = getattr(stream, attr)
            break
    s = int(stream)
    if s < 0:
        raise ValueError(f"stream {s} is not a CUDA stream")
    return _LEGACY_STREAM if s == 0 else s


def default_context(device_type: int, device_id: int):
    """The context ``from_dlpack(x)`` uses when given none: one per device, made on first use."""
    from ._context import Context

    key = ("cpu", 0) if device_type in (DL_CPU, DL_CUDA_HOST) else ("cuda", device_id)
    if device_type not in (DL_CPU, DL_CUDA_HOST, DL_CUDA, DL_CUDA_MANAGED):
        raise BufferError(f"from_dlpack: DLPack device type {device_type} is neither the CPU nor a CUDA GPU")
    ctx = _default_contexts.get(key)
    if ctx is None or ctx.closed:
        ctx = _default_contexts[key] = Context(*key)
    return ctx


def from_dlpack(x, ctx=None):
    """An fp4rl Tensor on the memory of ``x`` (no copy): any object with ``__dlpack__`` (torch
    tensors, numpy and CuPy arrays, JAX arrays) or a DLPack capsule. float32, bfloat16 and int32
    elements, C-contiguous, writable; on a GPU 256-byte aligned (fresh allocations are; a slice at
    an offset may not be: ``.contiguous().clone()`` it). ``ctx``: the Context to use (on x's
    device); None gives a default one per device. The producer's tensor stays alive until the
    fp4rl Tensor is closed or collected, and fp4rl writes to it in place."""
    from ._context import Tensor

    if isinstance(x, Tensor):
        return x
    if hasattr(x, "__dlpack__"):
        dev_type, dev_id = (int(v) for v in x.__dlpack_device__())
        if ctx is None:
            ctx = default_context(dev_type, dev_id)
        want = ctx._dlpack_device()
        if (dev_type in (DL_CPU, DL_CUDA_HOST)) != (want[0] == DL_CPU) or (want[0] == DL_CUDA and dev_id != want[1]):
            raise capi.InvalidArgumentError(f"from_dlpack: the array is on DLPack device ({dev_type}, {dev_id}), "
                                            f"the context on {want}: move it there or pass a context of that device")
        kwargs = {}
        if want[0] == DL_CUDA:
            kwargs["stream"] = ctx._stream if ctx._stream is not None else _LEGACY_STREAM
        try:
            cap = x.__dlpack__(max_version=(1, 0), **kwargs)
        except TypeError:  # a producer older than DLPack 1.0's max_version
            cap = x.__dlpack__(**kwargs)
    else:
        if ctx is None:
            raise TypeError("from_dlpack: a bare capsule needs ctx= (the Context of its device)")
        cap = x
    want = ctx._dlpack_device()
    return Tensor._wrap(ctx, capi.dlpack_import(cap, ctx._h, want[0], want[1]))


def export(t, stream=None, max_version=None, dl_device=None, copy=None):
    """Tensor.__dlpack__ (the DLPack protocol's producer side)."""
    dev = t.__dlpack_device__()
    if dl_device is not None and tuple(int(v) for v in dl_device) != dev:
        raise BufferError(f"__dlpack__: the tensor is on DLPack device {dev}, not {tuple(dl_device)}; fp4rl does not copy across devices")
    if copy:
        raise BufferError("__dlpack__: fp4rl shares its tensors in place (copy=True is not supported: copy on the consumer's side)")
    if dev[0] == DL_CUDA:
        if stream is None:
            stream = _LEGACY_STREAM  # the protocol: None means the legacy default stream
        elif stream == 0:
            raise ValueError("__dlpack__: stream 0 is ambiguous in the DLPack protocol (use 1 for the legacy default stream, 2 for per-thread)")
        if stream != -1:  # -1: the consumer asked for no synchronization
            t.ctx._order_before(stream_handle(stream))
    elif stream is not None and stream != -1:
        raise BufferError(f"__dlpack__: a CPU tensor takes no stream (got {stream})")
    versioned = max_version is not None and int(max_version[0]) >= 1
    return capi.dlpack_export(t._h, versioned, dev[0], dev[1])
