/*
 * formats.h - the one definition of every number format (shared/spec/formats.md).
 *
 * Static inline functions that compile as host C11 and as CUDA device code (FP4RL_HD), so the
 * CPU reference and the GPU kernels call literally the same arithmetic. Build without fast-math
 * and with -ffp-contract=off (nvcc: -fmad=false): an FMA would change bits.
 *
 * Each function here works on one element or one block scale. The block loops (max over a block
 * or tile, walking the layout) live in the backends; max is exact and order-free, so the loops
 * cannot disagree.
 */
#ifndef FP4RL_FORMATS_H
#define FP4RL_FORMATS_H

#include <stdint.h>
#include <string.h>
#include <math.h>

#include "format/layout.h" /* the HiF4 word's bits */
#include "format/traits.h" /* FP4RL_HD; each format's constants */

/* ---- bit access ---------------------------------------------------------------------------- */
FP4RL_HD uint32_t fp4rl_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
FP4RL_HD float fp4rl_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
/* 2^e for any e in [-149, 127], exactly (including binary32 subnormals). */
FP4RL_HD float fp4rl_exp2i(int e)
{
    if (e >= -126) return fp4rl_bits_f32((uint32_t)(e + 127) << 23);
    return fp4rl_bits_f32(1u << (e + 149));
}
/* floor(log2(a)) for a finite a > 0, exact from the exponent bits (subnormals too). */
FP4RL_HD int fp4rl_ilog2(float a)
{
    uint32_t u = fp4rl_f32_bits(a) & 0x7fffffffu;
    int be = (int)(u >> 23);
    if (be != 0) return be - 127;
    int e = -150; /* subnormal: position of the top set bit of the mantissa */
    while (u) { u >>= 1; e++; }
    return e;
}
FP4RL_HD int fp4rl_is_finite(float x) { return (fp4rl_f32_bits(x) & 0x7f800000u) != 0x7f800000u; }
FP4RL_HD int fp4rl_signbit(float x) { return (int)(fp4rl_f32_bits(x) >> 31); }

/* ---- bfloat16 ------------------------------------------------------------------------------ */
FP4RL_HD float fp4rl_bf16_to_f32(uint16_t h) { return fp4rl_bits_f32((uint32_t)h << 16); }
/* Round to nearest even; NaN stays a (quiet) NaN. */
FP4RL_HD uint16_t fp4rl_f32_to_bf16(float f)
{
    uint32_t u = fp4rl_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
FP4RL_HD float fp4rl_round_bf16(float f) { return fp4rl_bf16_to_f32(fp4rl_f32_to_bf16(f)); }
/* Stochastic rounding with the uniform u in [0, 1) (fp4rl_sr_uniform's, a multiple of 2^-24):
 * the magnitude rounds away from zero with probability (its bits below BF16's) / 2^16, so the
 * expected result is f itself (unbiased); u * 2^16 is exact and its floor adds to the dropped
 * bits. Inf stays inf, a finite value above BF16's largest may round to inf, NaN stays a quiet
 * NaN; a BF16 value is returned unchanged. */
FP4RL_HD uint16_t fp4rl_f32_to_bf16_sr(float f, float u)
{
    uint32_t b = fp4rl_f32_bits(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x0040u);
    b += (uint32_t)(u * 65536.0f);
    return (uint16_t)(b >> 16);
}

/* ---- Philox4x32-10 (spec section 5) -------------------------------------------------------- */
FP4RL_HD uint32_t fp4rl_mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}
/* out[0..3] = Philox4x32-10(counter c, key k). */
FP4RL_HD void fp4rl_philox4x32_10(const uint32_t c_in[4], const uint32_t k_in[2], uint32_t out[4])
{
    uint32_t c0 = c_in[0], c1 = c_in[1], c2 = c_in[2], c3 = c_in[3], k0 = k_in[0], k1 = k_in[1];
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = fp4rl_mulhilo(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = fp4rl_mulhilo(0xCD9E8D57u, c2, &hi1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}
/* The uniform u in [0, 1) of element `i` of a stochastic call (seed, offset). */
FP4RL_HD float fp4rl_sr_uniform(uint64_t seed, uint64_t offset, uint64_t i)
{
    uint64_t q = i >> 2;
    uint32_t c[4] = {(uint32_t)q, (uint32_t)(q >> 32), (uint32_t)offset, (uint32_t)(offset >> 32)};
    uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t o[4];
    fp4rl_philox4x32_10(c, k, o);
    return (float)(o[i & 3] >> 8) * 0x1p-24f;
}

/* ---- minifloat element grids (E2M1, E4M3, UE4M3) ------------------------------------------- */
/* A grid of magnitudes with `mbits` mantissa bits, smallest normal 2^emin, largest `maxv`. */
typedef struct fp4rl_grid { int mbits; int emin; float maxv; } fp4rl_grid;
#define FP4RL_GRID_E2M1 ((fp4rl_grid){1, 0, FP4RL_E2M1_MAX})
#define FP4RL_GRID_E4M3 ((fp4rl_grid){3, -6, FP4RL_E4M3_MAX})

/* log2 of the spacing of the grid at magnitude a (a finite, >= 0). Every division by a power
 * of two below is written as a multiplication by its (exact) reciprocal: both are correctly
 * rounded operations on the same real number, so the bits are identical, and a multiply is far
 * cheaper than an IEEE division, on the GPU above all. */
FP4RL_HD int fp4rl_grid_qexp(fp4rl_grid g, float a)
{
    int e = (a < fp4rl_exp2i(g.emin)) ? g.emin : fp4rl_ilog2(a);
    return e - g.mbits;
}
/* Rounds a finite magnitude a >= 0 to the grid: nearest-even (u < 0) or stochastic with uniform u,
 * saturating at the max. The result is an exact grid value. */
FP4RL_HD float fp4rl_grid_round(fp4rl_grid g, float a, float u)
{
    if (a >= g.maxv) return g.maxv;
    const int qe = fp4rl_grid_qexp(g, a);
    const float q = fp4rl_exp2i(qe), qinv = fp4rl_exp2i(-qe);
    float r;
    if (u < 0.0f) {
        r = rintf(a * qinv) * q;        /* a / q, exact */
    } else {
        float lo = floorf(a * qinv) * q, hi = lo + q;
        r = (u < (a - lo) * qinv) ? hi : lo; /* (v - lo) / (hi - lo), hi - lo = q */
    }
    return r > g.maxv ? g.maxv : r;
}
/* Encodes a grid magnitude (exact grid value) as sign-less code bits: exponent field, mantissa. */
FP4RL_HD uint32_t fp4rl_grid_encode(fp4rl_grid g, float r)
{
    if (r < fp4rl_exp2i(g.emin)) /* subnormal or zero: exponent field 0 */
        return (uint32_t)(r * fp4rl_exp2i(g.mbits - g.emin));
    int e = fp4rl_ilog2(r);
    uint32_t m = (uint32_t)((r * fp4rl_exp2i(-e) - 1.0f) * (float)(1 << g.mbits));
    return ((uint32_t)(e - g.emin + 1) << g.mbits) | m;
}
FP4RL_HD float fp4rl_grid_decode(fp4rl_grid g, uint32_t bits)
{
    uint32_t ef = bits >> g.mbits, m = bits & ((1u << g.mbits) - 1u);
    if (ef == 0) return (float)m * fp4rl_exp2i(g.emin - g.mbits);
    return (1.0f + (float)m * fp4rl_exp2i(-g.mbits)) * fp4rl_exp2i((int)ef - 1 + g.emin);
}

/* E2M1: code = s<<3 | magnitude bits. `v` is the scaled value; u < 0 means nearest. */
FP4RL_HD uint8_t fp4rl_e2m1_encode(float v, float u)
{
    float a = fabsf(v);
    return (uint8_t)((fp4rl_signbit(v) << 3) | fp4rl_grid_encode(FP4RL_GRID_E2M1, fp4rl_grid_round(FP4RL_GRID_E2M1, a, u)));
}
FP4RL_HD float fp4rl_e2m1_decode(uint8_t code)
{
    float m = fp4rl_grid_decode(FP4RL_GRID_E2M1, code & 7u);
    return (code & 8u) ? -m : m;
}
/* E4M3 ("fn"): code = s<<7 | magnitude bits; satfinite (never the NaN code 0x7F). */
FP4RL_HD uint8_t fp4rl_e4m3_encode(float v, float u)
{
    float a = fabsf(v);
    return (uint8_t)((fp4rl_signbit(v) << 7) | fp4rl_grid_encode(FP4RL_GRID_E4M3, fp4rl_grid_round(FP4RL_GRID_E4M3, a, u)));
}
FP4RL_HD float fp4rl_e4m3_decode(uint8_t code)
{
    if ((code & 0x7fu) == 0x7fu) return fp4rl_bits_f32(0x7fc00000u);
    float m = fp4rl_grid_decode(FP4RL_GRID_E4M3, code & 0x7fu);
    return (code & 0x80u) ? -m : m;
}

/* ---- MX scales (E8M0), spec section 3 ------------------------------------------------------ */
#define FP4RL_E8M0_NAN 0xFFu
/* Scale exponent of an MX block with max magnitude amax (finite, >= 0). emax_elem, max_elem: the
 * element grid's (fp4rl_format_traits); truncation_free selects the rule. */
FP4RL_HD int fp4rl_mx_scale_exp(float amax, int emax_elem, float max_elem, int truncation_free)
{
    if (amax == 0.0f) return -127;
    int e = fp4rl_ilog2(amax) - emax_elem;
    /* max_elem * 2^e is exact in binary32 for every e the clamp below lets through */
    if (truncation_free && e >= -127 && amax > max_elem * fp4rl_exp2i(e)) e += 1;
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    return e;
}
/* The E8M0 code of 2^e (e in [-127, 127], as fp4rl_mx_scale_exp gives) and back. */
FP4RL_HD uint8_t fp4rl_e8m0_of_exp(int e) { return (uint8_t)(e + FP4RL_E8M0_BIAS); }
FP4RL_HD int fp4rl_e8m0_exp(uint8_t s) { return (int)s - FP4RL_E8M0_BIAS; }
/* The stored E8M0 scale of a finite block of MX format d (MXFP4, MXFP8) with max magnitude amax. */
FP4RL_HD uint8_t fp4rl_mx_block_scale(float amax, fp4rl_dtype d, int truncation_free)
{
    const fp4rl_format_traits t = fp4rl_format_of(d);
    return fp4rl_e8m0_of_exp(fp4rl_mx_scale_exp(amax, t.emax_elem, t.max_elem, truncation_free));
}
FP4RL_HD float fp4rl_e8m0_decode(uint8_t s)
{
    if (s == FP4RL_E8M0_NAN) return fp4rl_bits_f32(0x7fc00000u);
    return fp4rl_exp2i(fp4rl_e8m0_exp(s));
}

/* ---- NVFP4 scales (UE4M3 + binary32 per tensor), spec section 4 ----------------------------- */
/* (choice) The spec's g = 1 for an all-zero tensor extends to tensors so tiny that g would be a
 * binary32 subnormal (amax_t < 2688 * 2^-126): s_b * g could underflow to 0 and the element
 * division become x / 0. With g = 1 every block scale rounds to 0, so every code is 0, which is
 * what such a tensor dequantizes to anyway. */
FP4RL_HD float fp4rl_nvfp4_tensor_scale(float amax_t)
{
    const float g = amax_t / (FP4RL_E4M3_MAX * FP4RL_E2M1_MAX); /* 2688, exact */
    return g < 0x1p-126f ? 1.0f : g;
}
/* The UE4M3 code of a block with max magnitude amax_b under tensor scale g. 0x7F marks a NaN block. */
#define FP4RL_UE4M3_NAN 0x7Fu
FP4RL_HD uint8_t fp4rl_nvfp4_block_scale(float amax_b, float g)
{
    float s = (amax_b / FP4RL_E2M1_MAX) / g;
    return (uint8_t)fp4rl_grid_encode(FP4RL_GRID_E4M3, fp4rl_grid_round(FP4RL_GRID_E4M3, s, -1.0f));
}
FP4RL_HD float fp4rl_ue4m3_decode(uint8_t s) { return fp4rl_e4m3_decode((uint8_t)(s & 0x7fu)); }

/* ---- HiFloat4, spec section 6 -------------------------------------------------------------- */
typedef struct fp4rl_hif4_base { uint32_t e6m2; float base; float rec; } fp4rl_hif4_base;

/* Steps 2-4: the E6M2 base scale of a unit (or 2D tile) with max magnitude amax (finite). */
FP4RL_HD fp4rl_hif4_base fp4rl_hif4_make_base(float amax)
{
    fp4rl_hif4_base b;
    float sf = amax * 0.142578125f;
    if (sf < 0x1p-48f) sf = 0x1p-48f; /* E6M2's smallest, 2^-FP4RL_E6M2_BIAS */
    if (sf > FP4RL_E6M2_MAX) sf = FP4RL_E6M2_MAX;
    sf = fp4rl_round_bf16(sf);
    int e = fp4rl_ilog2(sf);                     /* sf = (q / 4) * 2^e with q in [4, 8) */
    float qf = rintf(sf * fp4rl_exp2i(2 - e));   /* exact power-of-two scaling, then RNE */
    int q = (int)qf;
    if (q == 8) { q = 4; e += 1; }
    b.e6m2 = ((uint32_t)(e + FP4RL_E6M2_BIAS) << 2) | (uint32_t)(q - 4);
    b.base = ((float)q * 0.25f) * fp4rl_exp2i(e);
    b.rec = fp4rl_round_bf16(1.0f / b.base);
    return b;
}
/* The base scale of a stored word (whose low byte is not the NaN code). */
FP4RL_HD float fp4rl_hif4_word_base(uint32_t word)
{
    uint32_t s = fp4rl_hif4_word_base_bits(word);
    return (1.0f + (float)(s & 3u) * 0.25f) * fp4rl_exp2i((int)(s >> 2) - FP4RL_E6M2_BIAS);
}
/* Step 5: the increment bits. m8: max magnitude of the 8-element (8x8) sub-block; m4: of the
 * 4-element (4x4) micro-block; e8: the e8 bit of the micro-block's parent. */
FP4RL_HD uint32_t fp4rl_hif4_e8(float m8, float rec) { return (m8 * rec >= 4.0f) ? 1u : 0u; }
FP4RL_HD uint32_t fp4rl_hif4_e16(float m4, uint32_t e8, float rec)
{
    return ((m4 * fp4rl_exp2i(-(int)e8)) * rec >= 2.0f) ? 1u : 0u;
}
/* Step 6: the code of element x with increment inc = e8 + e16; u < 0 means the reference's
 * round-half-up, else stochastic rounding with uniform u. */
FP4RL_HD uint8_t fp4rl_hif4_encode(float x, int inc, float rec, float u)
{
    float v = (fabsf(x) * fp4rl_exp2i(-inc)) * rec;
    float n;
    if (u < 0.0f) {
        n = floorf(v * 4.0f + 0.5f);
    } else if (v >= FP4RL_HIF4_ELEM_MAX) {
        n = 7.0f;
    } else {
        float lo = floorf(v * 4.0f) * 0.25f;
        n = (u < (v - lo) * 4.0f) ? lo * 4.0f + 1.0f : lo * 4.0f; /* (v - lo) / (hi - lo), hi - lo = 1/4 */
    }
    if (n > 7.0f) n = 7.0f;
    return (uint8_t)((fp4rl_signbit(x) << 3) | (uint32_t)n);
}
/* The S1P2 element value of a code, (-1)^s (code & 7) / 4, before the scales. */
FP4RL_HD float fp4rl_hif4_elem(uint8_t code)
{
    const float m = (float)(code & 7u) * 0.25f;
    return (code & 8u) ? -m : m;
}
/* Dequantize element j (0..63) of a unit. */
FP4RL_HD float fp4rl_hif4_decode(uint8_t code, uint32_t word, int j)
{
    if (fp4rl_hif4_word_base_bits(word) == FP4RL_HIF4_NAN_WORD) return fp4rl_bits_f32(0x7fc00000u);
    float m = ((float)(code & 7u) * 0.25f) * fp4rl_exp2i(fp4rl_hif4_word_inc(word, j)) * fp4rl_hif4_word_base(word);
    return (code & 8u) ? -m : m;
}

/* ---- per-format element quantization (the block scale already chosen) --------------------- */
/* MX element: x scaled by 2^-e, to E2M1 (fp8 == 0) or E4M3 (fp8 == 1). */
FP4RL_HD uint8_t fp4rl_mx_encode(float x, int e, int fp8, float u)
{
    float v = x * fp4rl_exp2i(-e);
    return fp8 ? fp4rl_e4m3_encode(v, u) : fp4rl_e2m1_encode(v, u);
}
/* NaN results are returned as the constant 0x7fc00000, never computed: arithmetic on a NaN keeps
 * its payload on CPUs but gives 0x7fffffff on NVIDIA GPUs, and the backends must agree bit for bit. */
FP4RL_HD float fp4rl_mx_decode(uint8_t code, uint8_t scale, int fp8)
{
    if (scale == FP4RL_E8M0_NAN || (fp8 && (code & 0x7fu) == 0x7fu)) return fp4rl_bits_f32(0x7fc00000u);
    return (fp8 ? fp4rl_e4m3_decode(code) : fp4rl_e2m1_decode(code)) * fp4rl_exp2i(fp4rl_e8m0_exp(scale));
}
/* NVFP4 element with block scale code s (not 0, not NaN) and tensor scale g. */
FP4RL_HD uint8_t fp4rl_nvfp4_encode(float x, uint8_t s, float g, float u)
{
    return fp4rl_e2m1_encode(x / (fp4rl_ue4m3_decode(s) * g), u);
}
/* value(code) * s_b, exact; the GEMM applies g as alpha. */
FP4RL_HD float fp4rl_nvfp4_decode_unscaled(uint8_t code, uint8_t s)
{
    if (s == FP4RL_UE4M3_NAN) return fp4rl_bits_f32(0x7fc00000u);
    return fp4rl_e2m1_decode(code) * fp4rl_ue4m3_decode(s);
}
FP4RL_HD float fp4rl_nvfp4_decode(uint8_t code, uint8_t s, float g)
{
    if (s == FP4RL_UE4M3_NAN) return fp4rl_bits_f32(0x7fc00000u); /* not NaN * g: see fp4rl_mx_decode */
    return fp4rl_nvfp4_decode_unscaled(code, s) * g;
}

#endif /* FP4RL_FORMATS_H */
