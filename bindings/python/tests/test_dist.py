"""Data parallelism (NCCL): what can be checked in one process without a GPU."""

import pytest

import fp4rl
from fp4rl import capi


def test_plain_context_is_rank_0_of_1(ctx):
    assert (ctx.rank, ctx.world_size) == (0, 1)
    assert capi.fp4rl_context_get_rank(ctx._h) == (0, 1)


def test_unique_id_or_unsupported():
    try:
        uid = fp4rl.nccl_unique_id()
    except fp4rl.UnsupportedError as e:
        assert "NCCL" in str(e)
    else:
        assert isinstance(uid, bytes) and len(uid) == capi.FP4RL_NCCL_UNIQUE_ID_BYTES


def test_distributed_context_rejects_bad_arguments():
    uid = bytes(capi.FP4RL_NCCL_UNIQUE_ID_BYTES)
    with pytest.raises(fp4rl.InvalidArgumentError, match="rank 2"):
        fp4rl.Context.distributed(0, 2, 2, uid)
    with pytest.raises(fp4rl.InvalidArgumentError, match="world_size"):
        fp4rl.Context.distributed(0, 0, 0, uid)
    with pytest.raises(fp4rl.InvalidArgumentError, match="bytes"):
        fp4rl.Context.distributed(0, 0, 1, b"short")


def test_allreduce_bf16_is_a_session_parameter():
    assert "allreduce_bf16" in fp4rl.RLSession.HPARAMS
