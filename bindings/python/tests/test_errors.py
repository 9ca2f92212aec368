"""Every error path of the Pythonic layer: each exception class raised by a real failing call,
carrying the C library's message unchanged (str(e) == fp4rl_last_error())."""

import traceback

import numpy as np
import pytest

import fp4rl
from conftest import TINY


def raises_c_error(cls, fn, *args, **kwargs):
    """Calls fn, which must fail in the C library with cls; returns the exception."""
    with pytest.raises(cls) as info:
        fn(*args, **kwargs)
    e = info.value
    assert type(e) is cls
    assert str(e) == e.c_message == fp4rl.last_error() != ""
    assert e.status == cls.status and e.status_name == fp4rl.capi.fp4rl_status_name(cls.status)
    return e


def test_invalid_argument(ctx):
    e = raises_c_error(fp4rl.InvalidArgumentError, fp4rl.QuantPolicy, tile_weight=7)
    assert "tile_weight" in str(e)
    assert isinstance(e, ValueError)
    raises_c_error(fp4rl.InvalidArgumentError, fp4rl.capi.fp4rl_context_set_seed, None, 1)
    model = fp4rl.Model(ctx, TINY)
    raises_c_error(fp4rl.InvalidArgumentError, model.set_hparams, lr=-1.0)
    raises_c_error(fp4rl.InvalidArgumentError, fp4rl.RLSession(ctx, model).set, group_size=1)
    raises_c_error(fp4rl.InvalidArgumentError, fp4rl.RLSession(ctx, model).metric, "no/such")


def test_shape(ctx):
    e = raises_c_error(fp4rl.ShapeError, ctx.zeros, [0])
    assert "dim 0 is 0" in str(e)
    a = ctx.tensor(np.ones((2, 64), np.float32))
    b = ctx.tensor(np.ones((3, 32), np.float32))
    raises_c_error(fp4rl.ShapeError, ctx.matmul, a, b)


def test_dtype(ctx):
    e = raises_c_error(fp4rl.DTypeError, ctx.zeros, [2], "hif4")
    assert isinstance(e, TypeError)
    x = ctx.tensor(np.ones((2, 64), np.int32))
    raises_c_error(fp4rl.DTypeError, ctx.quantize, x, "mxfp4")


def test_unsupported(ctx):
    q = ctx.quantize(np.ones((64, 64), np.float32), "mxfp4")  # 1D blocks: no transpose
    e = raises_c_error(fp4rl.UnsupportedError, q.transpose)
    assert isinstance(e, NotImplementedError)
    raises_c_error(fp4rl.UnsupportedError, fp4rl.Model, ctx, {**TINY, "model_type": "llama"})


def test_out_of_memory(ctx):
    e = raises_c_error(fp4rl.OutOfMemoryError, ctx.zeros, [1 << 45])
    assert isinstance(e, MemoryError)


def test_device():
    """A CUDA context without a usable GPU is DEVICE; a build without CUDA says UNSUPPORTED."""
    with pytest.raises((fp4rl.DeviceError, fp4rl.UnsupportedError)) as info:
        fp4rl.Context("cuda", 4096)
    e = info.value
    assert str(e) == fp4rl.last_error()
    if isinstance(e, fp4rl.UnsupportedError):
        assert "without CUDA" in str(e)
        pytest.skip("libfp4rl was built without CUDA: no DEVICE path to exercise")
    assert type(e) is fp4rl.DeviceError and isinstance(e, RuntimeError)


def test_io(ctx, tmp_path):
    model = fp4rl.Model(ctx, TINY)
    e = raises_c_error(fp4rl.FileIOError, model.load, tmp_path / "missing.safetensors")
    assert isinstance(e, OSError)
    s = fp4rl.RLSession(ctx, model)
    assert fp4rl.IOError_ is fp4rl.FileIOError  # the old name still catches it
    raises_c_error(fp4rl.IOError_, setattr, s, "metrics_file", tmp_path / "no" / "dir" / "m.jsonl")


def test_corrupt(ctx, tmp_path):
    e = raises_c_error(fp4rl.CorruptError, fp4rl.Model, ctx, {**TINY, "hidden_size": "wide"})
    assert "hidden_size" in str(e)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{junk!!}")
    raises_c_error(fp4rl.CorruptError, fp4rl.Model(ctx, TINY).load, junk)
    raises_c_error(fp4rl.CorruptError, ctx.import_quantized, "nvfp4", [16], np.zeros(8, np.uint8),
                   np.zeros(1, np.uint8), tensor_scale=-1.0)


def test_callback(ctx):
    model = fp4rl.Model(ctx, TINY)
    s = fp4rl.RLSession(ctx, model, group_size=2, max_new_tokens=2, lr=1e-3)
    before = model.get_param("model.norm.weight")

    def reward(i, prompt, completion):
        if i == 1:
            return {}["missing"]  # raises KeyError on the second prompt
        return 1.0

    with pytest.raises(fp4rl.CallbackError) as info:
        s.step([[13, 1, 11], [13, 2, 11]], reward)
    e = info.value
    assert type(e) is fp4rl.CallbackError
    assert e.c_message == fp4rl.last_error()
    assert str(e).startswith(e.c_message)
    assert "the reward function raised KeyError: 'missing'" in str(e) and "in reward" in str(e)
    assert isinstance(e.__cause__, KeyError)
    frames = traceback.extract_tb(e.__cause__.__traceback__)
    assert frames[-1].name == "reward"
    assert s.step_count == 0 and (model.get_param("model.norm.weight") == before).all()
    # a non-number and a non-finite reward: the first is Python's TypeError, the second the C check
    with pytest.raises(fp4rl.CallbackError) as info:
        s.step([[13, 1, 11]], lambda i, p, c: "one")
    assert isinstance(info.value.__cause__, TypeError)
    e = raises_c_error(fp4rl.CallbackError, s.step, [[13, 1, 11]], lambda i, p, c: float("nan"))
    assert e.__cause__ is None and "finite" in str(e)
    # the session still works afterwards
    assert s.step([[13, 1, 11]], lambda i, p, c: float(len(c)))["step"] == 1


def test_keyboard_interrupt_in_a_reward_is_not_wrapped(ctx):
    s = fp4rl.RLSession(ctx, fp4rl.Model(ctx, TINY), group_size=2, max_new_tokens=2)

    def reward(i, p, c):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s.step([[13, 1, 11]], reward)
    assert s.step_count == 0


def test_internal_maps_to_its_class():
    """The library never fails with INTERNAL on purpose; the mapping is checked directly."""
    with pytest.raises(fp4rl.InternalError):
        fp4rl.capi.raise_for_status(fp4rl.InternalError.status)


def test_binding_side_checks_use_the_same_classes(ctx):
    with pytest.raises(fp4rl.InvalidArgumentError, match="unknown dtype 'fp3'"):
        ctx.zeros([2], "fp3")
    with pytest.raises(fp4rl.InvalidArgumentError, match="no quantization-policy parameter"):
        fp4rl.QuantPolicy(tile_wieght=32)
    with pytest.raises(fp4rl.InvalidArgumentError, match="RL hyper-parameter"):
        fp4rl.RLSession(ctx, fp4rl.Model(ctx, TINY), group_sise=4)
    with pytest.raises(fp4rl.InvalidArgumentError, match="outside int32"):
        fp4rl.Model(ctx, TINY).logits(np.array([[1, 2**40]]))
    with pytest.raises(fp4rl.DTypeError):
        fp4rl.Tensor.from_numpy(ctx, np.ones(4, np.float32), "hif4")
    with pytest.raises(TypeError):
        fp4rl.Tensor()
    with pytest.raises(FileNotFoundError):  # a path that is not there: Python's own error
        fp4rl.Model(ctx, "/no/such/config.json")
