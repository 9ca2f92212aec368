"""Lifetimes: handles free their C objects exactly once, never a parent before its children, in
any garbage-collection order; explicit close() and `with`; no leak over 1000 create/destroy."""

import gc
import os
import tracemalloc
import weakref

import numpy as np
import pytest

import fp4rl
from conftest import TINY


def test_tensor_outlives_a_dropped_context():
    ctx = fp4rl.Context()
    t = ctx.tensor(np.arange(4, dtype=np.float32))
    h = ctx.handle
    del ctx
    gc.collect()
    assert h.alive and h.children == 1  # kept by the tensor's handle
    assert t.numpy().tolist() == [0, 1, 2, 3]
    assert t.ctx.device == "cpu"  # the Pythonic parent is kept too


def test_closing_a_context_with_live_children_defers_its_destroy():
    with fp4rl.Context() as ctx:
        t = ctx.tensor(np.ones(3, np.float32))
        m = fp4rl.Model(ctx, TINY)
    assert ctx.closed and ctx.handle.alive  # closed to us, alive for t and m
    with pytest.raises(fp4rl.InvalidArgumentError, match="closed"):
        ctx.zeros([2])
    assert t.numpy().sum() == 3 and m.logits([13, 1]).shape == (2, 16)
    mh = weakref.ref(m.handle)  # (holding a handle would hold its C object)
    t.close()
    assert not t.handle.alive and ctx.handle.alive
    del m
    gc.collect()
    assert mh() is None
    assert not ctx.handle.alive  # the last child took the closed context with it
    ctx.close()  # idempotent


def test_session_keeps_model_and_context():
    ctx = fp4rl.Context()
    model = fp4rl.Model(ctx, TINY)
    s = fp4rl.RLSession(ctx, model, group_size=2, max_new_tokens=2, stop_tokens=[12])
    ch, mh = ctx.handle, model.handle
    model.close()
    ctx.close()
    del model, ctx
    gc.collect()
    assert ch.alive and mh.alive and mh.closed
    s.step([[13, 1, 10, 1, 11]], lambda i, p, c: 1.0)  # still trains its (closed-to-us) model
    sh = weakref.ref(s.handle)
    del s
    gc.collect()
    assert sh() is None and not mh.alive and not ch.alive


def _cycle():
    ctx = fp4rl.Context()
    ts = [ctx.tensor(np.ones(1000, np.float32)) for _ in range(3)]
    m = fp4rl.Model(ctx, TINY)
    s = fp4rl.RLSession(ctx, m)
    ctx.loop = [ctx, ts, m, s]  # a cycle through the context
    for t in ts:
        t.back = ctx
    m.back = s
    return [weakref.ref(x.handle) for x in (ctx, m, s, *ts)] + [weakref.ref(ctx)]


def test_reference_cycles_collect_in_any_order():
    """Objects in a cycle are cleared in an order the collector picks; the handles' parent links
    are not visible to it, so the C objects still go children first (a wrong order would free a
    tensor into a destroyed context's allocator, which ASan or glibc would catch)."""
    refs = [r for _ in range(20) for r in _cycle()]
    assert any(r() is not None for r in refs)  # only the collector can free a cycle
    gc.collect()
    assert not any(r() for r in refs)


def test_weakrefs_and_handle_introspection(ctx):
    t = ctx.tensor(np.zeros(2, np.float32))
    r = weakref.ref(t)
    hr = weakref.ref(t.handle)
    assert t.handle.kind == "tensor" and t.handle.parents == (ctx.handle,)
    del t
    gc.collect()
    assert r() is None and hr() is None


def _rss_kib():
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _churn(n):
    x = np.ones((128, 128), np.float32)  # 64 KiB per tensor: a leak of one per round is 64 MiB
    p = fp4rl.QuantPolicy("hif4_rl")
    for i in range(n):
        ctx = fp4rl.Context()
        t = ctx.tensor(x)
        q = ctx.quantize(t, "hif4", p)
        pol = fp4rl.QuantPolicy("stable_2d_mxfp4")
        if i % 2:  # half by explicit close, half by garbage collection
            q.close()
            t.close()
            pol.close()
            ctx.close()
        del ctx, t, q, pol


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc for the RSS")
def test_no_leak_over_1000_create_destroy():
    _churn(50)  # warm up allocator pools and numpy
    gc.collect()
    tracemalloc.start()
    rss0 = _rss_kib()
    snap0 = tracemalloc.take_snapshot()
    _churn(1000)
    gc.collect()
    grown_py = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(snap0, "filename"))
    rss1 = _rss_kib()
    tracemalloc.stop()
    print(f"1000 rounds: RSS {rss0} -> {rss1} KiB, Python allocations {grown_py / 1024:+.1f} KiB")
    assert rss1 - rss0 < 8 * 1024  # vs 64 MiB for one leaked tensor per round
    assert grown_py < 256 * 1024


def test_failed_creates_leak_nothing(ctx):
    _rss = _rss_kib()
    for _ in range(1000):
        with pytest.raises(fp4rl.ShapeError):
            ctx.tensor(np.ones(3, np.float32)).matmul(np.ones((2, 2), np.float32))
    assert ctx.handle.children < 10  # only what the test itself still holds
    assert _rss_kib() - _rss < 8 * 1024
