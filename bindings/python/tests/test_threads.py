"""Threads and re-entrancy: long calls release the GIL, and a context in use is refused (with an
exception, never a race) to other threads and to reward functions calling back into it."""

import threading
import weakref

import numpy as np
import pytest

import fp4rl
from conftest import TINY

PROMPTS = [[13, 1, 10, 2, 11], [13, 3, 10, 4, 11]]


def batch():
    tok = np.array([[13, 1, 10, 2, 11, 3, 12, 0]] * 4, np.int32)
    mask = np.zeros(tok.shape, np.float32)
    mask[:, 5:7] = 1
    return tok, mask


def train(seed, out, key):
    with fp4rl.Context() as ctx:
        m = fp4rl.Model(ctx, TINY, seed=seed, lr=1e-3)
        tok, mask = batch()
        out[key] = [m.train_step(tok, None, mask)[0] for _ in range(20)]


def test_separate_contexts_run_in_parallel_threads():
    sequential, parallel = {}, {}
    for k in range(3):
        train(k, sequential, k)
    threads = [threading.Thread(target=train, args=(k, parallel, k)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert parallel == sequential


def test_a_busy_context_is_refused_to_other_threads(ctx):
    m = fp4rl.Model(ctx, TINY)
    s = fp4rl.RLSession(ctx, m, group_size=2, max_new_tokens=2)
    entered, proceed = threading.Event(), threading.Event()
    result = {}

    def slow_reward(i, p, c):
        entered.set()
        proceed.wait(10)
        return 1.0

    def worker():
        try:
            result["metrics"] = s.step(PROMPTS[:1], slow_reward)
        except Exception as e:  # noqa: BLE001 - reported below
            result["error"] = e

    t = threading.Thread(target=worker)
    t.start()
    assert entered.wait(10)
    try:
        with pytest.raises(fp4rl.InvalidArgumentError, match="busy with a call in another thread"):
            ctx.zeros([2])
        with pytest.raises(fp4rl.InvalidArgumentError, match="busy"):
            m.logits([13, 1])
        with pytest.raises(fp4rl.InvalidArgumentError, match="busy"):
            s.close()
        with pytest.raises(fp4rl.InvalidArgumentError, match="busy"):
            ctx.close()
        with fp4rl.Context() as other:  # another context is free
            assert other.zeros([2]).numpy().tolist() == [0, 0]
    finally:
        proceed.set()
        t.join()
    assert "error" not in result and result["metrics"]["step"] == 1
    assert ctx.zeros([1]).numel == 1  # free again


def test_reward_reentry_follows_the_c_contract(ctx):
    """fp4rl.h: a reward function may use fp4rl, this context included, but not step, train or
    destroy the session calling it or that session's model. Reading them is fine."""
    m = fp4rl.Model(ctx, TINY)
    other = fp4rl.Model(ctx, TINY, seed=9, lr=1e-3)
    s = fp4rl.RLSession(ctx, m, group_size=2, max_new_tokens=2)
    tok, mask = batch()
    seen = []

    def reward(i, p, c):
        logits = m.logits(list(p) + list(c))  # the stepping model, read: allowed
        t = ctx.tensor(logits[-1])  # the same context: allowed
        q = ctx.quantize(t.numpy().reshape(1, -1), "mxfp4")  # a long call, nested: allowed
        loss, _ = other.train_step(tok, None, mask)  # another model of this context: allowed
        seen.append((s.step_count, s.get("group_size"), float(loss), q.dtype))
        return float(np.argmax(logits[-1]) == 7)

    metrics = s.step(PROMPTS, reward)
    assert metrics["step"] == 1 and len(seen) == 4 and seen[0][:2] == (0, 2.0) and other.step == 4
    forbidden = [
        lambda: s.step(PROMPTS, lambda *a: 0.0),
        lambda: s.train(),
        lambda: s.rollout(PROMPTS),
        lambda: s.set(lr=1e-4),
        lambda: s.close(),
        lambda: m.train_step(tok, None, mask),
        lambda: m.compute_gradients(tok, None, mask),
        lambda: m.set_hparams(lr=1e-4),
        lambda: m.close(),
        lambda: fp4rl.RLSession(ctx, m),
    ]
    for k, call in enumerate(forbidden):
        with pytest.raises(fp4rl.CallbackError) as info:
            s.step(PROMPTS, lambda i, p, c, call=call: call() or 1.0)
        cause = info.value.__cause__
        assert isinstance(cause, fp4rl.InvalidArgumentError), k
        assert "may read it but not step, train, change or destroy it" in str(cause), k
    assert s.step_count == 1 and not s.closed and not m.closed
    assert m.logits([13, 1]).shape == (2, 16)  # and all of it is usable again afterwards
    s.step(PROMPTS, lambda *a: 1.0)


def test_reward_may_use_other_contexts_and_release_objects(ctx):
    s = fp4rl.RLSession(ctx, fp4rl.Model(ctx, TINY), group_size=2, max_new_tokens=2)
    doomed = [ctx.tensor(np.ones(8, np.float32)) for _ in range(4)]
    handles = [weakref.ref(t.handle) for t in doomed]
    with fp4rl.Context() as ctx2:
        inner = fp4rl.RLSession(ctx2, fp4rl.Model(ctx2, TINY), group_size=2, max_new_tokens=2)
        inner_errors = []

        def failing(i, p, c):
            raise ValueError("inner")

        def reward(i, p, c):
            if doomed:
                doomed.pop()  # the last reference: destroyed once the step returns (its context is busy)
            try:  # a whole nested step, in another context, whose own reward fails
                inner.step([list(p)], failing)
            except fp4rl.CallbackError as e:
                inner_errors.append(e)
            return 0.5

        metrics = s.step(PROMPTS, reward)
    assert metrics["reward/mean"] == 0.5
    assert len(inner_errors) == 4 and all(isinstance(e.__cause__, ValueError) for e in inner_errors)
    assert not any(h() for h in handles)
    # after nesting, the outer step's own failures are still chained correctly
    with pytest.raises(fp4rl.CallbackError) as info:
        s.step(PROMPTS, lambda i, p, c: 1 / 0)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
