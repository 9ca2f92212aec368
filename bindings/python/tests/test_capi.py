"""fp4rl.capi, the SWIG module: it covers the whole header, and its typemaps (statuses, outputs,
handles, buffers) behave as documented in fp4rl.i."""

import json
import re

import numpy as np
import pytest

import fp4rl
from conftest import TINY
from fp4rl import capi


def header_functions(text):
    return set(re.findall(r"FP4RL_API\s+[\w\s\*]*?\b(fp4rl_\w+)\s*\(", text))


def header_constants(text):
    names = set(re.findall(r"#define[ \t]+(FP4RL_\w+)[ \t]+\S", text)) - {"FP4RL_API"}
    for body in re.findall(r"typedef enum \w+ \{(.*?)\}", text, re.S):
        body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        names |= set(re.findall(r"\b(FP4RL_\w+)\s*(?:=|,|$)", body))
    return names


def test_every_header_function_is_wrapped(header_text):
    fns = header_functions(header_text)
    assert len(fns) > 60
    missing = sorted(f for f in fns if not callable(getattr(capi, f, None)))
    assert not missing


def test_every_header_constant_is_exported(header_text):
    consts = header_constants(header_text)
    assert {"FP4RL_DTYPE_HIF4", "FP4RL_RL_SEED", "FP4RL_QP_COUNT", "FP4RL_VERSION_NUMBER"} <= consts
    missing = sorted(c for c in consts if not isinstance(getattr(capi, c, None), int))
    assert not missing


def test_version_matches_header():
    assert capi.fp4rl_version_number() == capi.FP4RL_VERSION_NUMBER
    assert capi.fp4rl_version_string() == f"{capi.FP4RL_VERSION_MAJOR}.{capi.FP4RL_VERSION_MINOR}.{capi.FP4RL_VERSION_PATCH}"
    assert fp4rl.__version__ == fp4rl.version() == capi.fp4rl_version_string()


def test_names():
    assert capi.fp4rl_status_name(capi.FP4RL_ERR_SHAPE) == "FP4RL_ERR_SHAPE"
    assert capi.fp4rl_status_name(999) == "FP4RL_STATUS_UNKNOWN"
    assert capi.fp4rl_dtype_name(capi.FP4RL_DTYPE_MXFP8_E4M3) == "mxfp8_e4m3"
    assert capi.fp4rl_qparam_name(capi.FP4RL_QP_RESQ) == "resq"
    assert capi.fp4rl_qparam_name(999) is None
    assert capi.fp4rl_rl_session_metric_name(0) == "reward/mean"
    assert capi.fp4rl_rl_session_metric_name(10**6) is None


# ---- statuses ----
STATUS_CLASSES = {
    capi.FP4RL_ERR_INVALID_ARGUMENT: (fp4rl.InvalidArgumentError, ValueError),
    capi.FP4RL_ERR_SHAPE: (fp4rl.ShapeError, ValueError),
    capi.FP4RL_ERR_DTYPE: (fp4rl.DTypeError, TypeError),
    capi.FP4RL_ERR_UNSUPPORTED: (fp4rl.UnsupportedError, NotImplementedError),
    capi.FP4RL_ERR_OUT_OF_MEMORY: (fp4rl.OutOfMemoryError, MemoryError),
    capi.FP4RL_ERR_DEVICE: (fp4rl.DeviceError, RuntimeError),
    capi.FP4RL_ERR_IO: (fp4rl.FileIOError, OSError),
    capi.FP4RL_ERR_CORRUPT: (fp4rl.CorruptError, fp4rl.Error),
    capi.FP4RL_ERR_CALLBACK: (fp4rl.CallbackError, fp4rl.Error),
    capi.FP4RL_ERR_INTERNAL: (fp4rl.InternalError, RuntimeError),
}


def test_one_class_per_status_family(ctx):
    assert len({cls for cls, _ in STATUS_CLASSES.values()}) == 10
    with pytest.raises(fp4rl.InvalidArgumentError):
        capi.fp4rl_context_set_rng_offset(None, 0)
    message = capi.fp4rl_last_error()
    assert message
    for status, (cls, std) in STATUS_CLASSES.items():
        with pytest.raises(cls) as info:
            capi.raise_for_status(status)
        e = info.value
        assert type(e) is cls and isinstance(e, fp4rl.Error) and isinstance(e, std)
        assert cls.status == e.status == status
        assert e.status_name == capi.fp4rl_status_name(status)
        assert str(e) == e.c_message == message
        assert cls.__module__ == "fp4rl"
    assert capi.raise_for_status(capi.FP4RL_OK) is None
    with pytest.raises(fp4rl.Error) as info:  # unknown statuses still raise the base class
        capi.raise_for_status(77)
    assert type(info.value) is fp4rl.Error and info.value.status == 77


def test_status_results_are_none_and_outputs_are_values(ctx):
    h = ctx.handle
    assert capi.fp4rl_context_set_seed(h, 9) is None
    assert capi.fp4rl_context_get_rng(h) == (9, 0)
    assert capi.fp4rl_context_set_rng_offset(h, 2**64 - 1) is None
    assert capi.fp4rl_context_get_rng(h) == (9, 2**64 - 1)
    assert capi.fp4rl_context_device(h) == capi.FP4RL_DEVICE_CPU
    assert capi.fp4rl_context_device(None) == -1
    p = capi.fp4rl_quant_policy_create()
    assert capi.fp4rl_quant_policy_get(p, capi.FP4RL_QP_SEED) == -1
    with pytest.raises(OverflowError):  # a uint64 argument
        capi.fp4rl_context_set_seed(h, -1)


def test_tensor_accessors_and_outputs(ctx):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = capi.fp4rl_tensor_from_host(ctx.handle, capi.FP4RL_DTYPE_F32, x.shape, x)
    assert isinstance(t, capi.Handle) and t.kind == "tensor"
    assert capi.fp4rl_tensor_dtype(t) == capi.FP4RL_DTYPE_F32
    assert capi.fp4rl_tensor_ndim(t) == 2
    assert [capi.fp4rl_tensor_dim(t, i) for i in range(3)] == [2, 3, 0]
    assert capi.fp4rl_tensor_numel(t) == 6 and capi.fp4rl_tensor_nbytes(t) == 24
    assert capi.fp4rl_tensor_context(t) is ctx.handle
    assert capi.fp4rl_tensor_dtype(None) == -1 and capi.fp4rl_tensor_numel(None) == 0
    y = np.zeros_like(x)
    capi.fp4rl_tensor_to_host(t, y)
    assert (y == x).all()
    q = capi.fp4rl_quantize(ctx.handle, t, capi.FP4RL_DTYPE_MXFP4, None, capi.FP4RL_ROLE_WEIGHT)
    tile, codes_bytes, scales_bytes, tensor_scale = capi.fp4rl_tensor_quant_info(q)
    assert (tile, codes_bytes, scales_bytes, tensor_scale) == (0, 4, 2, 1.0)
    stats = capi.fp4rl_quant_error(t, q)
    assert isinstance(stats, tuple) and len(stats) == 4
    with pytest.raises(fp4rl.DTypeError, match="fp4rl_tensor_quant_info"):
        capi.fp4rl_tensor_quant_info(t)


# ---- handles ----
def test_handles_cannot_be_made_or_confused(ctx):
    with pytest.raises(TypeError):
        capi.Handle()
    p = capi.fp4rl_quant_policy_create()
    with pytest.raises(TypeError, match="context handle, not a quant_policy handle"):
        capi.fp4rl_context_set_seed(p, 1)
    with pytest.raises(TypeError, match="must be an fp4rl context handle"):
        capi.fp4rl_context_set_seed(12345, 1)
    # None is NULL: the library reports it in its own words
    with pytest.raises(fp4rl.InvalidArgumentError) as info:
        capi.fp4rl_context_set_seed(None, 1)
    assert str(info.value) == capi.fp4rl_last_error() and "NULL" in str(info.value)
    assert "quant_policy" in repr(p)


def test_destroy_is_idempotent_and_closes(ctx):
    p = capi.fp4rl_quant_policy_create()
    assert p.alive and not p.closed
    assert capi.fp4rl_quant_policy_destroy(p) is None
    assert p.closed and not p.alive and p.address == 0
    capi.fp4rl_quant_policy_destroy(p)  # a second destroy does nothing
    capi.fp4rl_quant_policy_destroy(None)  # like the C function
    with pytest.raises(fp4rl.InvalidArgumentError, match="was closed"):
        capi.fp4rl_quant_policy_get(p, 0)
    with pytest.raises(TypeError):
        capi.fp4rl_tensor_destroy(ctx.handle)


def test_destroying_a_parent_waits_for_its_children():
    c = capi.fp4rl_context_create(capi.FP4RL_DEVICE_CPU, 0)
    t = capi.fp4rl_tensor_zeros(c, capi.FP4RL_DTYPE_F32, [4])
    assert c.children == 1 and t.parents == (c,)
    capi.fp4rl_context_destroy(c)
    assert c.closed and c.alive  # unusable, but its allocator still serves t
    with pytest.raises(fp4rl.InvalidArgumentError, match="closed"):
        capi.fp4rl_tensor_zeros(c, capi.FP4RL_DTYPE_F32, [4])
    out = np.ones(4, np.float32)
    capi.fp4rl_tensor_to_host(t, out)
    assert (out == 0).all()
    capi.fp4rl_tensor_destroy(t)  # the last child: the context goes with it
    assert not t.alive and not c.alive and c.children == 0


def test_failed_create_returns_nothing(ctx):
    with pytest.raises(fp4rl.ShapeError):
        capi.fp4rl_tensor_zeros(ctx.handle, capi.FP4RL_DTYPE_F32, [0])
    assert ctx.handle.children == 0


# ---- buffers ----
def test_from_host_checks_the_buffer_against_dtype_and_shape(ctx):
    h = ctx.handle
    x = np.ones((2, 3), np.float32)
    with pytest.raises(fp4rl.ShapeError, match="data has 24 bytes; a f32 tensor of 8 elements needs 32"):
        capi.fp4rl_tensor_from_host(h, capi.FP4RL_DTYPE_F32, [2, 4], x)
    with pytest.raises(fp4rl.DTypeError, match="float32"):
        capi.fp4rl_tensor_from_host(h, capi.FP4RL_DTYPE_F32, [2, 3], x.astype(np.float64))
    with pytest.raises(fp4rl.DTypeError, match="int32"):
        capi.fp4rl_tensor_from_host(h, capi.FP4RL_DTYPE_I32, [2, 3], x)
    with pytest.raises(TypeError, match="C-contiguous"):
        capi.fp4rl_tensor_from_host(h, capi.FP4RL_DTYPE_F32, [3, 2], x.T)
    with pytest.raises(TypeError):
        capi.fp4rl_tensor_from_host(h, capi.FP4RL_DTYPE_F32, [2, 3], [1.0] * 6)
    # raw bytes are taken by their length
    t = capi.fp4rl_tensor_from_host(h, capi.FP4RL_DTYPE_F32, [2, 3], x.tobytes())
    assert capi.fp4rl_tensor_nbytes(t) == 24
    # the library's own checks still speak for themselves (shape before data)
    with pytest.raises(fp4rl.ShapeError) as info:
        capi.fp4rl_tensor_from_host(h, capi.FP4RL_DTYPE_F32, [0, 3], x)
    assert str(info.value) == capi.fp4rl_last_error()
    with pytest.raises(fp4rl.ShapeError):
        capi.fp4rl_tensor_from_host(h, capi.FP4RL_DTYPE_F32, [1] * 12, x)
    with pytest.raises(fp4rl.DTypeError) as info:
        capi.fp4rl_tensor_from_host(h, capi.FP4RL_DTYPE_HIF4, [2, 3], x)
    assert str(info.value) == capi.fp4rl_last_error()


def test_destination_buffers_must_be_writable_and_big_enough(ctx):
    t = capi.fp4rl_tensor_zeros(ctx.handle, capi.FP4RL_DTYPE_F32, [4])
    with pytest.raises(TypeError, match="writable"):
        capi.fp4rl_tensor_to_host(t, bytes(16))
    with pytest.raises(fp4rl.Error) as info:
        capi.fp4rl_tensor_to_host(t, bytearray(8))
    assert str(info.value) == capi.fp4rl_last_error()
    buf = bytearray(16)
    capi.fp4rl_tensor_to_host(t, buf)
    assert buf == bytes(16)


def test_model_batches_are_checked_against_batch_and_seq_len(ctx):
    m = capi.fp4rl_model_create(ctx.handle, json.dumps(TINY), None, 1)
    tok = np.zeros((2, 4), np.int32)
    out = np.empty((2, 4, 16), np.float32)
    capi.fp4rl_model_logits(m, tok, None, 2, 4, out)
    with pytest.raises(fp4rl.ShapeError, match="tokens holds 8 ids; batch 2 x seq_len 5"):
        capi.fp4rl_model_logits(m, tok, None, 2, 5, out)
    with pytest.raises(fp4rl.ShapeError, match="lengths holds 3 values"):
        capi.fp4rl_model_logits(m, tok, np.array([4, 4, 4], np.int32), 2, 4, out)
    with pytest.raises(fp4rl.ShapeError, match="loss_mask holds 4 values"):
        capi.fp4rl_model_train_step(m, tok, None, np.ones(4, np.float32), 2, 4)
    with pytest.raises(fp4rl.DTypeError, match="int32"):
        capi.fp4rl_model_logits(m, tok.astype(np.int64), None, 2, 4, out)
    with pytest.raises(fp4rl.Error) as info:  # too small an output: the library's check
        capi.fp4rl_model_logits(m, tok, None, 2, 4, np.empty(10, np.float32))
    assert str(info.value) == capi.fp4rl_last_error()
    loss, gnorm = capi.fp4rl_model_train_step(m, tok, np.array([4, 3], np.int32), None, 2, 4)
    assert loss > 0 and gnorm > 0
    assert capi.fp4rl_model_param_shape(m, "model.embed_tokens.weight") == (16, 32)
    assert m.parents == (ctx.handle,)


def test_prompt_offsets_must_stay_inside_the_prompts(ctx):
    m = capi.fp4rl_model_create(ctx.handle, json.dumps(TINY), None, 1)
    s = capi.fp4rl_rl_session_create(ctx.handle, m, None)
    assert s.parents == (ctx.handle, m)
    prompts = np.array([13, 1, 10, 2, 11], np.int32)
    with pytest.raises(fp4rl.ShapeError, match=r"prompt_offsets\[1\] is 6"):
        capi.fp4rl_rl_session_rollout(s, prompts, np.array([0, 6], np.uint64))
    with pytest.raises(fp4rl.InvalidArgumentError) as info:  # the library's own check
        capi.fp4rl_rl_session_rollout(s, prompts, np.array([0, 0], np.uint64))
    assert str(info.value) == capi.fp4rl_last_error()
    capi.fp4rl_rl_session_set(s, capi.FP4RL_RL_MAX_NEW_TOKENS, 3)
    capi.fp4rl_rl_session_rollout(s, prompts, np.array([0, 5], np.uint64))
    n = capi.fp4rl_rl_session_num_completions(s)
    assert n == 8
    length, prompt_index = capi.fp4rl_rl_session_completion(s, 7, None, None)
    assert 1 <= length <= 3 and prompt_index == 0
    toks, lps = np.empty(length, np.int32), np.empty(length, np.float32)
    assert capi.fp4rl_rl_session_completion(s, 7, toks, lps) == (length, 0)
    assert (lps <= 0).all()
    if length > 1:
        with pytest.raises(fp4rl.ShapeError):
            capi.fp4rl_rl_session_completion(s, 7, np.empty(length - 1, np.int32), None)
    text = capi.fp4rl_rl_session_metrics_json(s)
    assert isinstance(text, str) and text.startswith('{"step": 0')


def test_reward_callable_is_checked(ctx):
    m = capi.fp4rl_model_create(ctx.handle, json.dumps(TINY), None, 1)
    s = capi.fp4rl_rl_session_create(ctx.handle, m, None)
    with pytest.raises(TypeError, match="callable"):
        capi.fp4rl_rl_session_step(s, np.array([13, 1], np.int32), np.array([0, 2], np.uint64), 42)
