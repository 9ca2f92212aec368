"""Element conversions of libfp4rl against ml_dtypes (shared/spec/formats.md section 2).

Loads the built library through ctypes (path in $FP4RL_LIB) and checks, with ml_dtypes' casts as
the independent reference (they are round-to-nearest-even):
  - E4M3 (MXFP8 elements, NVFP4 scales) and E2M1 (MXFP4 / NVFP4 elements) conversions of in-range
    values, every tie included; ml_dtypes does not saturate E4M3 (480 -> NaN), so only |x| <= 448
    is compared there, and saturation is checked separately against the spec;
  - the decode of every E2M1 / E4M3 / E8M0 / UE4M3 code;
  - BF16 rounding (C of a matmul, BF16 dequantization);
  - whole tensors: MXFP4 / MXFP8 (both scale rules) and NVFP4 codes recomputed from the scales
    with numpy float32 arithmetic and ml_dtypes casts.
"""
import ctypes as C
import os

import ml_dtypes
import numpy as np
import pytest

F32, BF16, I32, MXFP4, NVFP4, HIF4, MXFP8 = range(7)
QP_TILE_ACT, QP_SCALE_RULE, QP_ROUND_ACT, QP_FORMAT_ACT = 1, 3, 5, 9
ROLE_ACT = 1

E4M3 = ml_dtypes.float8_e4m3fn
E2M1 = ml_dtypes.float4_e2m1fn
E8M0 = ml_dtypes.float8_e8m0fnu
BF = ml_dtypes.bfloat16


def _load():
    path = os.environ.get("FP4RL_LIB")
    if not path:
        pytest.skip("FP4RL_LIB is not set (path of the built libfp4rl.so)")
    lib = C.CDLL(path)
    vp, i64p = C.c_void_p, C.POINTER(C.c_int64)
    sig = {
        "fp4rl_context_create": [C.POINTER(vp), C.c_int, C.c_int],
        "fp4rl_context_destroy": [vp],
        "fp4rl_tensor_from_host": [C.POINTER(vp), vp, C.c_int, C.c_int, i64p, vp],
        "fp4rl_tensor_zeros": [C.POINTER(vp), vp, C.c_int, C.c_int, i64p],
        "fp4rl_tensor_to_host": [vp, vp, C.c_size_t],
        "fp4rl_tensor_destroy": [vp],
        "fp4rl_tensor_quant_info": [vp, C.POINTER(C.c_int), C.POINTER(C.c_size_t), C.POINTER(C.c_size_t), C.POINTER(C.c_float)],
        "fp4rl_tensor_codes_to_host": [vp, vp, C.c_size_t],
        "fp4rl_tensor_scales_to_host": [vp, vp, C.c_size_t],
        "fp4rl_tensor_import_quantized": [C.POINTER(vp), vp, C.c_int, C.c_int, i64p, C.c_int, vp, C.c_size_t, vp, C.c_size_t, C.c_float],
        "fp4rl_quant_policy_create": [C.POINTER(vp)],
        "fp4rl_quant_policy_set": [vp, C.c_int, C.c_int64],
        "fp4rl_quant_policy_destroy": [vp],
        "fp4rl_quantize": [C.POINTER(vp), vp, vp, C.c_int, vp, C.c_int],
        "fp4rl_dequantize": [C.POINTER(vp), vp, vp, C.c_int],
        "fp4rl_matmul": [vp, vp, vp, vp],
        "fp4rl_last_error": [],
    }
    for name, args in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = C.c_int
    lib.fp4rl_last_error.restype = C.c_char_p
    for name in ("fp4rl_context_destroy", "fp4rl_tensor_destroy", "fp4rl_quant_policy_destroy"):
        getattr(lib, name).restype = None
    return lib


class Lib:
    def __init__(self):
        self.lib = _load()
        self.ctx = C.c_void_p()
        self.ok(self.lib.fp4rl_context_create(C.byref(self.ctx), 0, 0))

    def ok(self, st):
        assert st == 0, f"fp4rl status {st}: {self.lib.fp4rl_last_error().decode()}"

    def close(self):
        self.lib.fp4rl_context_destroy(self.ctx)

    @staticmethod
    def _shape(shape):
        return (C.c_int64 * len(shape))(*shape)

    def dense(self, arr, dtype=F32):
        arr = np.ascontiguousarray(arr, dtype=np.float32 if dtype == F32 else np.uint16)
        t = C.c_void_p()
        self.ok(self.lib.fp4rl_tensor_from_host(C.byref(t), self.ctx, dtype, arr.ndim, self._shape(arr.shape), arr.ctypes.data))
        return t

    def to_host(self, t, shape, dtype=F32):
        out = np.empty(shape, dtype=np.float32 if dtype == F32 else np.uint16)
        self.ok(self.lib.fp4rl_tensor_to_host(t, out.ctypes.data, out.nbytes))
        return out

    def quantize(self, arr, fmt, tile=0, truncation_free=False):
        p = C.c_void_p()
        self.ok(self.lib.fp4rl_quant_policy_create(C.byref(p)))
        self.ok(self.lib.fp4rl_quant_policy_set(p, QP_FORMAT_ACT, fmt))
        self.ok(self.lib.fp4rl_quant_policy_set(p, QP_TILE_ACT, tile))
        self.ok(self.lib.fp4rl_quant_policy_set(p, QP_SCALE_RULE, 1 if truncation_free else 0))
        src = self.dense(arr)
        q = C.c_void_p()
        self.ok(self.lib.fp4rl_quantize(C.byref(q), self.ctx, src, fmt, p, ROLE_ACT))
        self.lib.fp4rl_tensor_destroy(src)
        self.lib.fp4rl_quant_policy_destroy(p)
        return q

    def parts(self, q):
        tile, nc, ns, g = C.c_int(), C.c_size_t(), C.c_size_t(), C.c_float()
        self.ok(self.lib.fp4rl_tensor_quant_info(q, C.byref(tile), C.byref(nc), C.byref(ns), C.byref(g)))
        codes = np.empty(nc.value, np.uint8)
        scales = np.empty(ns.value, np.uint8)
        self.ok(self.lib.fp4rl_tensor_codes_to_host(q, codes.ctypes.data, codes.nbytes))
        self.ok(self.lib.fp4rl_tensor_scales_to_host(q, scales.ctypes.data, scales.nbytes))
        return codes, scales, np.float32(g.value)

    def dequantize(self, q, shape, dtype=F32):
        d = C.c_void_p()
        self.ok(self.lib.fp4rl_dequantize(C.byref(d), self.ctx, q, dtype))
        out = self.to_host(d, shape, dtype)
        self.lib.fp4rl_tensor_destroy(d)
        return out

    def import_q(self, fmt, shape, codes, scales, g=1.0):
        codes = np.ascontiguousarray(codes, np.uint8)
        scales = np.ascontiguousarray(scales, np.uint8)
        q = C.c_void_p()
        self.ok(self.lib.fp4rl_tensor_import_quantized(C.byref(q), self.ctx, fmt, len(shape), self._shape(shape), 0,
                                                       codes.ctypes.data, codes.nbytes, scales.ctypes.data, scales.nbytes, g))
        return q


@pytest.fixture(scope="module")
def lib():
    lb = Lib()
    yield lb
    lb.close()


def unpack4(codes, rows, cols):
    """Packed FP4 codes [rows, ceil(cols/2)] -> [rows, cols] nibbles (element 2k low)."""
    b = codes.reshape(rows, (cols + 1) // 2)
    out = np.empty((rows, 2 * b.shape[1]), np.uint8)
    out[:, 0::2] = b & 15
    out[:, 1::2] = b >> 4
    return out[:, :cols]


def e4m3_magnitudes():
    return np.arange(0x7F, dtype=np.uint8).view(E4M3).astype(np.float64)  # codes 0x00..0x7E


def e2m1_magnitudes():
    return np.arange(8, dtype=np.uint8).view(E2M1).astype(np.float64)


def probes(mags):
    """Every grid value, every midpoint, and the float32 neighbours of each midpoint, both signs."""
    mids = ((mags[:-1] + mags[1:]) / 2).astype(np.float32)
    p = np.concatenate([mags.astype(np.float32), mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf))])
    return np.concatenate([p, -p]).astype(np.float32)


def codes_with_unit_scale(lib, fmt, anchor, vals):
    """Quantizes rows [anchor, v0..v30] (MX, OCP floor: scale 2^0) and returns the v's codes."""
    n = len(vals)
    rows = (n + 30) // 31
    x = np.zeros((rows, 32), np.float32)
    x[:, 0] = anchor
    flat = np.zeros(rows * 31, np.float32)
    flat[:n] = vals
    x[:, 1:] = flat.reshape(rows, 31)
    q = lib.quantize(x, fmt)
    codes, scales, _ = lib.parts(q)
    lib.lib.fp4rl_tensor_destroy(q)
    assert np.all(scales == 127)
    c = codes.reshape(rows, 32) if fmt == MXFP8 else unpack4(codes, rows, 32)
    return c[:, 1:].reshape(-1)[:n]


def test_e4m3_in_range_matches_ml_dtypes(lib):
    rng = np.random.default_rng(1)
    vals = np.concatenate([
        probes(e4m3_magnitudes()),
        (rng.uniform(1, 2, 20000) * 2.0 ** rng.integers(-12, 9, 20000) * rng.choice([-1, 1], 20000)).astype(np.float32),
    ])
    vals = vals[np.abs(vals) <= 448]
    got = codes_with_unit_scale(lib, MXFP8, 256.0, vals)
    want = vals.astype(E4M3).view(np.uint8)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"{bad.size} mismatches, e.g. {vals[bad[:5]]} -> {got[bad[:5]]} vs ml_dtypes {want[bad[:5]]}"


def test_e4m3_saturates_where_ml_dtypes_gives_nan(lib):
    vals = np.array([449, 464, 480, 500, -480, -511], np.float32)  # scale stays 2^0 below 512
    assert np.all(np.isnan(vals[2:3].astype(E4M3).astype(np.float32)))  # the plain cast: NaN
    got = codes_with_unit_scale(lib, MXFP8, 256.0, vals)
    assert list(got) == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE]  # satfinite: +-448


def test_e2m1_matches_ml_dtypes(lib):
    rng = np.random.default_rng(2)
    vals = np.concatenate([probes(e2m1_magnitudes()), rng.uniform(-6, 6, 5000).astype(np.float32),
                           np.array([0.0, -0.0, -0.1, 0.1], np.float32)])
    vals = vals[np.abs(vals) <= 6]
    got = codes_with_unit_scale(lib, MXFP4, 4.0, vals)
    want = vals.astype(E2M1).view(np.uint8) & 15
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"{bad.size} mismatches, e.g. {vals[bad[:5]]} -> {got[bad[:5]]} vs ml_dtypes {want[bad[:5]]}"
    # the ties
    t = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    assert list(codes_with_unit_scale(lib, MXFP4, 4.0, t)) == list(t.astype(E2M1).view(np.uint8) & 15) == [0, 2, 2, 4, 4, 6, 6]


def test_decode_every_code(lib):
    # E2M1: the 16 codes of one MXFP4 block with scale 2^0
    codes = np.arange(16, dtype=np.uint8)
    q = lib.import_q(MXFP4, (1, 16), codes[0::2] | (codes[1::2] << 4), [127])
    got = lib.dequantize(q, (1, 16))[0]
    lib.lib.fp4rl_tensor_destroy(q)
    want = codes.view(E2M1).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # -0 included
    # E4M3: all 256 codes (0x7F / 0xFF are NaN)
    codes = np.arange(256, dtype=np.uint8)
    q = lib.import_q(MXFP8, (1, 256), codes, [127] * 8)
    got = lib.dequantize(q, (1, 256))[0]
    lib.lib.fp4rl_tensor_destroy(q)
    want = codes.view(E4M3).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    assert np.array_equal(got[fin].view(np.uint32), want[fin].view(np.uint32))
    # E8M0: every scale code, on blocks of 1.0 (code 2)
    scales = np.arange(256, dtype=np.uint8)
    q = lib.import_q(MXFP4, (256, 1), np.full(256, 2, np.uint8), scales)
    got = lib.dequantize(q, (256, 1))[:, 0]
    lib.lib.fp4rl_tensor_destroy(q)
    want = scales.view(E8M0).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got[255])
    assert np.array_equal(got[:255], want[:255])
    # UE4M3 (NVFP4 block scales 0x00..0x7E), g = 1, element code 2 (1.0)
    scales = np.arange(0x7F, dtype=np.uint8)
    q = lib.import_q(NVFP4, (0x7F, 1), np.full(0x7F, 2, np.uint8), scales, 1.0)
    got = lib.dequantize(q, (0x7F, 1))[:, 0]
    lib.lib.fp4rl_tensor_destroy(q)
    assert np.array_equal(got, scales.view(E4M3).astype(np.float32))


def _bf16_via_matmul(lib, x):
    a = lib.dense(x.reshape(-1, 1))
    b = lib.dense(np.ones((1, 1), np.float32))
    c = C.c_void_p()
    lib.ok(lib.lib.fp4rl_tensor_zeros(C.byref(c), lib.ctx, BF16, 2, Lib._shape((x.size, 1))))
    lib.ok(lib.lib.fp4rl_matmul(c, lib.ctx, a, b))
    out = lib.to_host(c, (x.size, 1), BF16)[:, 0]
    for t in (a, b, c):
        lib.lib.fp4rl_tensor_destroy(t)
    return out


def test_bf16_rounding_matches_ml_dtypes(lib):
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, 50000, dtype=np.uint64).astype(np.uint32)
    bits[:5000] = (bits[:5000] & 0xFFFF0000) | 0x8000  # exact ties
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) < 1e37) & (np.abs(x) > 1e-37)]
    got = _bf16_via_matmul(lib, x)
    want = x.astype(BF).view(np.uint16)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"{bad.size} mismatches, e.g. {x[bad[:5]]}: {got[bad[:5]]} vs {want[bad[:5]]}"


def test_bf16_dequantize_matches_ml_dtypes(lib):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((16, 200)) * np.exp(2 * rng.standard_normal((16, 200)))).astype(np.float32)
    for fmt in (MXFP4, NVFP4, HIF4, MXFP8):
        q = lib.quantize(x, fmt)
        f = lib.dequantize(q, x.shape, F32)
        b = lib.dequantize(q, x.shape, BF16)
        lib.lib.fp4rl_tensor_destroy(q)
        assert np.array_equal(b, f.astype(BF).view(np.uint16)), fmt


@pytest.mark.parametrize("truncation_free", [False, True])
@pytest.mark.parametrize("fmt", [MXFP4, MXFP8])
def test_mx_tensor_codes_match_ml_dtypes(lib, fmt, truncation_free):
    rng = np.random.default_rng(5 + fmt + truncation_free)
    R, Cc = 37, 101
    x = (rng.standard_normal((R, Cc)) * np.exp(1.5 * rng.standard_normal((R, Cc)))).astype(np.float32)
    q = lib.quantize(x, fmt, truncation_free=truncation_free)
    codes, scales, _ = lib.parts(q)
    lib.lib.fp4rl_tensor_destroy(q)
    nb = (Cc + 31) // 32
    e = scales.reshape(R, nb).astype(np.int32) - 127
    # the spec's scale rules, from numpy's exact frexp
    xp = np.zeros((R, nb * 32), np.float32)
    xp[:, :Cc] = x
    amax = np.abs(xp).reshape(R, nb, 32).max(axis=2)
    emax, maxe = (2, 6.0) if fmt == MXFP4 else (8, 448.0)
    ef = np.frexp(amax)[1] - 1 - emax
    if truncation_free:
        ef = ef + (amax > maxe * np.ldexp(1.0, ef))
    assert np.array_equal(e, np.clip(ef, -127, 127))
    # the elements: x * 2^-e in float32, then the ml_dtypes cast (in range) or the max
    v = (x * np.repeat(np.ldexp(np.float32(1), -e), 32, axis=1)[:, :Cc].astype(np.float32)).astype(np.float32)
    if fmt == MXFP8:
        want = np.clip(v, -448, 448).astype(E4M3).view(np.uint8)
        got = codes.reshape(R, Cc)
    else:
        want = np.clip(v, -6, 6).astype(E2M1).view(np.uint8) & 15
        got = unpack4(codes, R, Cc)
    if truncation_free:
        assert np.all(np.abs(v) <= maxe)
    assert np.array_equal(got, want), np.argwhere(got != want)[:5]


def test_nvfp4_tensor_matches_ml_dtypes(lib):
    rng = np.random.default_rng(9)
    R, Cc = 19, 77
    x = (rng.standard_normal((R, Cc)) * np.exp(1.5 * rng.standard_normal((R, Cc)))).astype(np.float32)
    q = lib.quantize(x, NVFP4)
    codes, scales, g = lib.parts(q)
    lib.lib.fp4rl_tensor_destroy(q)
    f32 = np.float32
    assert g == f32(np.abs(x).max()) / f32(2688.0)
    nb = (Cc + 15) // 16
    xp = np.zeros((R, nb * 16), np.float32)
    xp[:, :Cc] = x
    amax = np.abs(xp).reshape(R, nb, 16).max(axis=2)
    s = ((amax / f32(6)).astype(f32) / g).astype(f32)
    assert np.array_equal(scales.reshape(R, nb), np.clip(s, 0, 448).astype(E4M3).view(np.uint8))
    sval = np.repeat(scales.reshape(R, nb).view(E4M3).astype(f32), 16, axis=1)[:, :Cc]
    v = (x / (sval * g).astype(f32)).astype(f32)
    want = np.where(sval == 0, 0, np.clip(v, -6, 6).astype(E2M1).view(np.uint8) & 15)
    assert np.array_equal(unpack4(codes, R, Cc), want)
