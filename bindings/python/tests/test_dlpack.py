"""Zero copy across the binding: DLPack both ways with numpy (and torch when installed), on the
same memory (the data pointers are compared), the producer kept alive, bad inputs refused
without side effects; model parameter views and the zero-copy state_dict; set_stream on the CPU.
CUDA tests (marked gpu) skip without a usable GPU or without torch built for CUDA."""

import gc

import numpy as np
import pytest

import fp4rl
from fp4rl import capi
from conftest import TINY


def np_ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# ---- numpy -> fp4rl ----
def test_from_numpy_is_the_same_memory(ctx):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = fp4rl.from_dlpack(a, ctx)
    assert t.ctx is ctx and t.shape == (3, 4) and t.dtype == "f32"
    assert t.data_ptr == np_ptr(a)  # no copy
    a[1, 2] = -5.0  # the fp4rl tensor sees numpy's writes...
    assert t.numpy()[1, 2] == -5.0
    out = np.zeros((3, 3), np.float32)
    ctx.matmul(t, t, out=fp4rl.from_dlpack(out, ctx))  # ...and numpy sees fp4rl's
    assert np.array_equal(out, a @ a.T)
    i = fp4rl.from_dlpack(np.arange(5, dtype=np.int32), ctx)
    assert i.dtype == "i32" and list(i.numpy()) == [0, 1, 2, 3, 4]


def test_from_numpy_keeps_the_producer_alive(ctx):
    a = np.full(1024, 3.0, np.float32)
    t = fp4rl.from_dlpack(a, ctx)
    ptr = np_ptr(a)
    del a
    gc.collect()
    assert t.data_ptr == ptr and (t.numpy() == 3.0).all()  # the array is held by the tensor
    t.close()


def test_from_numpy_refusals(ctx):
    with pytest.raises(fp4rl.DTypeError):
        fp4rl.from_dlpack(np.zeros(4, np.float64), ctx)
    with pytest.raises(fp4rl.InvalidArgumentError, match="contiguous"):
        fp4rl.from_dlpack(np.zeros((4, 4), np.float32)[:, ::2], ctx)
    with pytest.raises(fp4rl.InvalidArgumentError, match="contiguous"):
        fp4rl.from_dlpack(np.zeros((4, 4), np.float32).T, ctx)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        fp4rl.from_dlpack(ro, ctx)
    with pytest.raises(TypeError):
        fp4rl.from_dlpack(object(), ctx)
    # a refused capsule still belongs to its producer: wrapping it afterwards works
    a = np.zeros(8, np.float64)
    cap = a.__dlpack__()
    with pytest.raises(fp4rl.DTypeError):
        fp4rl.from_dlpack(cap, ctx)
    del cap  # the capsule's own destructor releases it (no crash, no double free)
    gc.collect()


def test_from_dlpack_default_context_and_zero_dims():
    t = fp4rl.from_dlpack(np.array(2.5, np.float32))  # a 0-dim array is one element
    assert t.ctx.device == "cpu" and t.shape == (1,) and t.numpy()[0] == 2.5
    assert fp4rl.from_dlpack(t) is t


# ---- fp4rl -> numpy ----
def test_numpy_from_fp4rl_is_the_same_memory(ctx):
    t = ctx.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert t.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(t)
    assert a.shape == (2, 3) and a.dtype == np.float32
    assert np_ptr(a) == t.data_ptr  # no copy
    a[0, 1] = 42.0
    assert t.numpy()[0, 1] == 42.0
    ia = np.from_dlpack(ctx.tensor(np.arange(4, dtype=np.int32)))
    assert ia.dtype == np.int32 and list(ia) == [0, 1, 2, 3]


def test_exported_tensor_outlives_close(ctx):
    t = ctx.tensor(np.arange(4, dtype=np.float32))
    a = np.from_dlpack(t)
    t.close()  # the capsule holds the C tensor: numpy's array stays valid
    gc.collect()
    assert list(a) == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(fp4rl.InvalidArgumentError):
        t.numpy()  # the Python object is closed for its owner


def test_export_refusals(ctx):
    q = ctx.quantize(np.ones((1, 64), np.float32), "mxfp4")
    with pytest.raises(BufferError, match="dequantize"):
        q.__dlpack__()
    with pytest.raises(fp4rl.DTypeError):
        q.data_ptr
    t = ctx.tensor(np.ones(4, np.float32))
    with pytest.raises(BufferError):
        t.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        t.__dlpack__(stream=7)  # a CPU tensor takes no stream
    cap = t.__dlpack__(max_version=(1, 0))  # a versioned capsule, never consumed: freed cleanly
    del cap
    gc.collect()
    assert (t.numpy() == 1).all()


def test_round_trip_through_numpy_keeps_the_pointer(ctx):
    t = ctx.tensor(np.arange(8, dtype=np.float32))
    back = fp4rl.from_dlpack(np.from_dlpack(t), ctx)
    assert back.data_ptr == t.data_ptr


def test_bf16_tensor_exports_as_bfloat16(ctx):
    t = ctx.tensor(np.array([0x3F80, 0x4000], np.uint16), "bf16")  # 1.0, 2.0
    back = fp4rl.from_dlpack(t.__dlpack__(), ctx)  # a bf16 capsule wraps as bf16 again
    assert back.dtype == "bf16" and back.data_ptr == t.data_ptr


def test_raw_wrap_keeps_its_owner(ctx):
    a = np.arange(4, dtype=np.float32)
    h = capi.fp4rl_tensor_wrap(ctx.handle, capi.FP4RL_DTYPE_F32, (4,), None, np_ptr(a), a)
    assert capi.fp4rl_tensor_data(h) == np_ptr(a)
    with pytest.raises(fp4rl.InvalidArgumentError, match="contiguous"):
        capi.fp4rl_tensor_wrap(ctx.handle, capi.FP4RL_DTYPE_F32, (2, 2), (1, 2), np_ptr(a), a)
    with pytest.raises(fp4rl.ShapeError):
        capi.fp4rl_tensor_wrap(ctx.handle, capi.FP4RL_DTYPE_F32, (2, 2), (2,), np_ptr(a), a)
    with pytest.raises(fp4rl.InvalidArgumentError):
        capi.fp4rl_tensor_wrap(ctx.handle, capi.FP4RL_DTYPE_F32, (4,), None, None, a)
    import sys
    refs = sys.getrefcount(a)
    capi.fp4rl_tensor_destroy(h)
    assert sys.getrefcount(a) == refs - 1  # released exactly once


def test_cpu_context_takes_no_stream(ctx):
    ctx.set_stream(None)
    assert ctx.stream is None
    with pytest.raises(fp4rl.UnsupportedError):
        ctx.set_stream(1234)
    assert ctx.stream is None


# ---- models ----
def test_param_tensor_is_the_weight(ctx):
    m = fp4rl.Model(ctx, TINY, seed=1)
    name = "model.layers.0.mlp.down_proj.weight"
    v = m.param_tensor(name)
    assert v.shape == m.param_shape(name) and v.dtype == "f32"
    a = np.from_dlpack(v)
    assert np.array_equal(a, m.get_param(name))
    a[0, 0] = 0.5
    assert m.get_param(name)[0, 0] == 0.5  # a write through the view is the weight
    m.train_step(np.arange(8, dtype=np.int32) % 16)
    assert np.array_equal(a, m.get_param(name))  # AdamW's update shows in the view
    with pytest.raises(fp4rl.InvalidArgumentError, match="no parameter"):
        m.param_tensor("no.such.weight")
    expect = m.get_param(name)
    m.close()  # the view keeps the memory: still the last weights
    gc.collect()
    assert np.array_equal(a, expect)


def test_state_dict_zero_copy_and_copies(ctx):
    a = fp4rl.Model(ctx, TINY, seed=1)
    b = fp4rl.Model(ctx, TINY, seed=2)
    sd = a.state_dict()
    assert list(sd) == a.param_names
    name = "model.norm.weight"
    assert all(isinstance(v, np.ndarray) for v in sd.values())
    assert all(np.array_equal(sd[n], a.get_param(n)) for n in sd)
    assert np_ptr(sd[name]) == a.param_tensor(name).data_ptr  # views, not copies
    copies = a.state_dict(copy=True)
    assert np_ptr(copies[name]) != np_ptr(sd[name]) and all(np.array_equal(copies[n], sd[n]) for n in sd)
    b.load_state_dict(sd)  # round trip: b now has a's weights
    assert all(np.array_equal(b.get_param(n), copies[n]) for n in copies)
    assert all(np.array_equal(v, copies[n]) for n, v in b.state_dict().items())
    sd[name][:] = 7.0  # a view writes the live weight; the copy does not change
    assert (a.get_param(name) == 7.0).all() and not (copies[name] == 7.0).all()


# ---- torch (CPU; skipped without torch) ----
def test_torch_cpu_round_trip(ctx):
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = fp4rl.from_dlpack(x, ctx)
    assert t.data_ptr == x.data_ptr()
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.data_ptr() and torch.equal(y, x)
    b = torch.ones(2, 64, dtype=torch.bfloat16)
    tb = fp4rl.from_dlpack(b, ctx)
    assert tb.dtype == "bf16" and tb.data_ptr == b.data_ptr()
    assert torch.from_dlpack(tb).dtype == torch.bfloat16
    m = fp4rl.Model(ctx, TINY, seed=1)
    w = torch.from_dlpack(m.param_tensor("model.embed_tokens.weight"))
    assert torch.equal(w, torch.from_numpy(m.get_param("model.embed_tokens.weight")))


# ---- CUDA (marked gpu) ----
@pytest.fixture(scope="module")
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


@pytest.mark.gpu
def test_cuda_round_trip_no_copy(gpu, torch_cuda):
    torch = torch_cuda
    x = torch.randn(64, 128, device="cuda")
    t = fp4rl.from_dlpack(x, gpu)
    assert t.data_ptr == x.data_ptr() and t.__dlpack_device__() == (2, 0)
    y = torch.from_dlpack(t)
    assert y.device.type == "cuda" and y.data_ptr() == x.data_ptr()
    q = gpu.quantize(t, "mxfp8_e4m3")  # the library reads torch's memory on the device
    # bit for bit the CPU reference's round trip of the same values (OCP MX scales clamp the
    # block maximum, so a tolerance around x would not hold; the reference is the contract)
    with fp4rl.Context() as cpu:
        want = cpu.quantize(cpu.tensor(x.cpu().numpy()), "mxfp8_e4m3").numpy()
    assert np.array_equal(q.numpy(), want)
    m = fp4rl.Model(gpu, TINY, seed=1)
    sd = m.state_dict()
    w = torch.from_dlpack(sd["model.norm.weight"])
    assert w.device.type == "cuda" and w.data_ptr() == sd["model.norm.weight"].data_ptr
    w.mul_(2.0)  # torch writes the master weight in place
    torch.cuda.synchronize()
    assert (m.get_param("model.norm.weight") == 2.0).all()


@pytest.mark.gpu
def test_cuda_load_state_dict_device_to_device(gpu, torch_cuda):
    """load_state_dict from torch CUDA tensors (FP32 and BF16) copies on the device and is ordered
    against the context's work: the model then holds exactly those values, and a bad shape among
    them changes nothing."""
    torch = torch_cuda
    m = fp4rl.Model(gpu, TINY, seed=1)
    g = torch.Generator(device="cuda").manual_seed(0)
    new = {n: torch.randn(m.param_shape(n), device="cuda", generator=g) for n in m.param_names}
    new["model.norm.weight"] = new["model.norm.weight"].bfloat16()
    before = {n: m.get_param(n) for n in m.param_names}
    bad = dict(new)
    bad["model.norm.weight"] = torch.zeros(3, device="cuda")
    with pytest.raises(fp4rl.ShapeError):
        m.load_state_dict(bad)
    assert all((m.get_param(n) == before[n]).all() for n in m.param_names)
    m.load_state_dict(new)
    for n, v in new.items():
        assert np.array_equal(m.get_param(n), v.float().cpu().numpy()), n


@pytest.mark.gpu
def test_cuda_stream_ordering(gpu, torch_cuda):
    torch = torch_cuda
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        gpu.set_stream(torch.cuda.current_stream())
        assert gpu.stream == s.cuda_stream
        x = torch.empty(1 << 22, device="cuda")
        torch.cuda._sleep(50_000_000)  # holds the stream back
        x.fill_(3.0)
        t = fp4rl.from_dlpack(x, gpu)  # on the same stream: ordered after the fill
        assert (t.numpy() == 3.0).all()
    gpu.set_stream(None)
    # producer side: torch's stream waits for the library's queued work before it reads
    t2 = gpu.tensor(np.full(1 << 20, 5.0, np.float32))
    y = torch.from_dlpack(t2)
    assert bool((y == 5.0).all())
