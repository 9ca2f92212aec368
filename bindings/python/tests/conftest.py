"""Shared fixtures of the fp4rl Python tests."""

import os
import pathlib

# Before libfp4rl (and its OpenBLAS) is loaded: the suite's timings assume one BLAS thread per
# process, and CI machines have 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402

import fp4rl  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = pathlib.Path(os.environ.get("FP4RL_FIXTURES", REPO / "tests" / "fixtures"))
HEADER = pathlib.Path(os.environ.get("FP4RL_HEADER", REPO / "abi" / "include" / "fp4rl" / "fp4rl.h"))

# The model of tests/test_session.c: 2 layers, hidden 32, the addition task's 16-token vocabulary.
TINY = {"model_type": "qwen2", "vocab_size": 16, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 32, "tie_word_embeddings": True}


@pytest.fixture
def ctx():
    with fp4rl.Context(seed=5) as c:
        yield c


# A CUDA context per test module (the GPU tests skip without one).
@pytest.fixture(scope="module")
def gpu():
    try:
        ctx = fp4rl.Context("cuda", 0)
    except (fp4rl.DeviceError, fp4rl.UnsupportedError) as e:
        pytest.skip(f"no CUDA context: {e}")
    yield ctx
    ctx.close()


@pytest.fixture
def gqa_dir():
    d = FIXTURES / "qwen2" / "gqa"
    if not (d / "model.safetensors").exists():
        pytest.skip(f"no fixture at {d}")
    return d


@pytest.fixture
def header_text():
    if not HEADER.exists():
        pytest.skip(f"no header at {HEADER}")
    return HEADER.read_text()
