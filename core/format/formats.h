/*
 * formats.h - the one definition of every number format (shared/spec/formats.md).
 *
 * Static inline functions that compile as host C11 and as CUDA device code (FP4RL_HD), so the
 * CPU reference and the GPU kernels call literally the same arithmetic. Build without fast-math
 * and with -ffp-contract=off (nvcc: -fmad=false): an FMA would change bits (fp4rl_fma_exact is
 * the one fused form, used only where the product is exact, so fusing cannot change them).
 *
 * The element encoders are written for throughput as well as exactness: no division by a power of
 * two, no logarithm loop, no data-dependent branch; each returns the same bits as the spec's
 * literal steps (tests/test_formats.c holds them to an independent model and to those steps).
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
/* 2^e for any e in [-149, 127], exactly (including binary32 subnormals), without a branch: a
 * subnormal power is built 2^64 higher and scaled down, which is exact. */
FP4RL_HD float fp4rl_exp2i(int e)
{
    const int sub = e < -126;
    const float f = fp4rl_bits_f32((uint32_t)(e + (sub ? 127 + 64 : 127)) << 23);
    return sub ? f * 0x1p-64f : f;
}
/* floor(log2(a)) for a finite a > 0, exact from the exponent bits; a subnormal is first scaled by
 * 2^64 (exact) into the normal range: no loop, no branch. */
FP4RL_HD int fp4rl_ilog2(float a)
{
    const uint32_t u = fp4rl_f32_bits(a) & 0x7fffffffu;
    const int sub = u < 0x00800000u;
    const uint32_t v = sub ? fp4rl_f32_bits(fp4rl_bits_f32(u) * 0x1p64f) : u;
    return (int)(v >> 23) - (sub ? 127 + 64 : 127);
}
/* a * b + c for an a * b that is exact (a power-of-two scaling that stays normal, or any scaling
 * up): then the fused and the unfused forms are the same single rounding of the same real number.
 * On the GPU it is one FFMA (-fmad=false keeps nvcc from fusing by itself); on the host, where
 * fmaf may be a library call, the plain expression. */
FP4RL_HD float fp4rl_fma_exact(float a, float b, float c)
{
#ifdef __CUDA_ARCH__
    return fmaf(a, b, c);
#else
    return a * b + c;
#endif
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
/* The 64-bit product a * b as two halves. On the GPU one mul.wide.u32 (one IMAD.WIDE), written
 * out: from the portable form the compiler carries the Philox state in 64-bit registers, emulated
 * with twice the instructions, and from __umulhi plus a * b it issues two multiplies. */
FP4RL_HD uint32_t fp4rl_mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
#ifdef __CUDA_ARCH__
    uint32_t lo;
    asm("{\n\t.reg .u64 p;\n\tmul.wide.u32 p, %2, %3;\n\tmov.b64 {%0, %1}, p;\n\t}" : "=r"(lo), "=r"(*hi) : "r"(a), "r"(b));
    return lo;
#else
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
#endif
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

/* Magnitude codes count the grid points binade after binade: with E = max(floor(log2 a), emin)
 * the grid step at a is q = 2^(E - mbits) and the point k * q of that binade (k in [2^mbits,
 * 2^(mbits+1)], or [0, 2^mbits] below 2^emin, the subnormals) has the code N + k with
 * N = (E - emin) << mbits. So y = a / q, an exact power-of-two scaling, rounded to an integer and
 * offset by N is the code. Both are done by one binary32 addition: 2^23 + N + y rounds y to an
 * integer (the ulp of [2^23, 2^24) is 1) and its low bits are the code; N is even, so ties to
 * even on the sum are ties to even on y. No division, no logarithm, no branch, and the same
 * result as rounding a to the grid and encoding the grid value (the spec's two steps).
 * The exponent bits of 2^E for a finite a >= 0: */
FP4RL_HD uint32_t fp4rl_grid_ebits(fp4rl_grid g, float a)
{
    const uint32_t emin = (uint32_t)(g.emin + 127) << 23, e = fp4rl_f32_bits(a) & 0x7f800000u;
    return e > emin ? e : emin;
}
/* 1 / q = 2^(mbits - E) and 2^23 + N, from the exponent bits eb of 2^E. */
FP4RL_HD float fp4rl_grid_qinv(fp4rl_grid g, uint32_t eb) { return fp4rl_bits_f32(((uint32_t)(g.mbits + 254) << 23) - eb); }
FP4RL_HD float fp4rl_grid_base(fp4rl_grid g, uint32_t eb)
{
    /* (eb - emin bits) >> (23 - mbits), split so that it is one shift-and-add: both have 23 zero low bits */
    return fp4rl_bits_f32((eb >> (23 - g.mbits)) + (0x4b000000u - ((uint32_t)(g.emin + 127) << g.mbits)));
}
/* The sign-less code of a magnitude a >= 0 (finite or +inf) rounded to the nearest grid value,
 * ties to even, saturating at the max: a is clamped to the max first (the max is a grid value, so
 * it encodes as itself, and y stays small). */
FP4RL_HD uint32_t fp4rl_grid_code_rn(fp4rl_grid g, float a)
{
    a = a < g.maxv ? a : g.maxv;
    const uint32_t eb = fp4rl_grid_ebits(g, a);
    return fp4rl_f32_bits(fp4rl_fma_exact(a, fp4rl_grid_qinv(g, eb), fp4rl_grid_base(g, eb))) - 0x4b000000u;
}
/* The same with stochastic rounding by the uniform u in [0, 1) (spec section 5): between the grid
 * neighbours lo <= a < hi, round up iff u < (a - lo) / (hi - lo) = y - floor(y) (exact: y and
 * floor(y) are integers plus at most 24 significant bits). Saturation as in RNE: the clamped max
 * has y - floor(y) = 0. */
FP4RL_HD uint32_t fp4rl_grid_code_sr(fp4rl_grid g, float a, float u)
{
    a = a < g.maxv ? a : g.maxv;
    const uint32_t eb = fp4rl_grid_ebits(g, a);
    const float y = a * fp4rl_grid_qinv(g, eb), lo = floorf(y);
    const float up = u < y - lo ? 1.0f : 0.0f; /* a float 0 / 1 (one FSET on the GPU), added exactly */
    return fp4rl_f32_bits((lo + fp4rl_grid_base(g, eb)) + up) - 0x4b000000u;
}
/* Either rounding: nearest-even for u < 0, else stochastic with uniform u. */
FP4RL_HD uint32_t fp4rl_grid_code(fp4rl_grid g, float a, float u)
{
    return u < 0.0f ? fp4rl_grid_code_rn(g, a) : fp4rl_grid_code_sr(g, a, u);
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
    return (uint8_t)((fp4rl_signbit(v) << 3) | fp4rl_grid_code(FP4RL_GRID_E2M1, fabsf(v), u));
}
FP4RL_HD float fp4rl_e2m1_decode(uint8_t code)
{
    float m = fp4rl_grid_decode(FP4RL_GRID_E2M1, code & 7u);
    return (code & 8u) ? -m : m;
}
/* E4M3 ("fn"): code = s<<7 | magnitude bits; satfinite (never the NaN code 0x7F). */
FP4RL_HD uint8_t fp4rl_e4m3_encode(float v, float u)
{
    return (uint8_t)((fp4rl_signbit(v) << 7) | fp4rl_grid_code(FP4RL_GRID_E4M3, fabsf(v), u));
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
    return (uint8_t)fp4rl_grid_code_rn(FP4RL_GRID_E4M3, (amax_b / FP4RL_E2M1_MAX) / g);
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
    /* Step 4 without a division: rec = bf16(1 / base) = bf16(4 / q) * 2^-e, because 1 / base =
     * (4 / q) 2^-e stays in the normal range (e in [-48, 15]), where both roundings (binary32,
     * then BF16) commute with a power-of-two factor. The four bf16(4 / q) are the spec's 0x3F80,
     * 0x3F4D, 0x3F2B, 0x3F12; tests/test_formats.c checks every E6M2 code against the division. */
    const uint32_t r16 = (uint32_t)(0x3F123F2B3F4D3F80ull >> (16 * (q - 4))) & 0xffffu;
    b.rec = fp4rl_bits_f32((uint32_t)((int32_t)(r16 << 16) - e * (1 << 23)));
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
/* 2^-inc for an increment inc = e8 + e16 in {0, 1, 2} (fp4rl_exp2i(-inc) without its subnormal case). */
FP4RL_HD float fp4rl_hif4_inc_scale(uint32_t inc) { return fp4rl_bits_f32((127u - inc) << 23); }
FP4RL_HD uint32_t fp4rl_hif4_e16(float m4, uint32_t e8, float rec)
{
    return ((m4 * fp4rl_hif4_inc_scale(e8)) * rec >= 2.0f) ? 1u : 0u;
}
/* Step 6 in three parts, so that a kernel picks the rounding at compile time: the scaled
 * magnitude v of element x with sc = 2^-inc (inc = e8 + e16), then its magnitude code. Nearest
 * is the reference's round half up, n = min(floor(v * 4 + 0.5), 7): v * 4 is exact, so
 * v * 4 + 0.5 is one rounding (one FFMA on the GPU); clamping before the floor saturates as the
 * min after it does; the code is read from the low bits of 2^23 + n (no float-to-int conversion).
 * Stochastic: n = floor(w) + (u < w - floor(w)) with w = min(v * 4, 7), which is the spec's lo and
 * (v - lo) / (hi - lo) times 4, exactly. */
FP4RL_HD float fp4rl_hif4_elem_mag(float x, float sc, float rec) { return (fabsf(x) * sc) * rec; }
/* The same for nearest rounding with one multiply by screc = sc * rec (exact: a power of two times a
 * normal BF16 value). |x| * sc * rec rounded once equals the two roundings whenever |x| * sc is
 * exact; it is not only when |x| * sc < 2^-126, and then v <= 2^-126 * 2^48 (rec <= 2^48) in both
 * forms, which rounds to code 0 either way. Stochastic rounding keeps the two steps: there a tiny v
 * meets u = 0. */
FP4RL_HD float fp4rl_hif4_elem_mag_rn(float x, float screc) { return fabsf(x) * screc; }
/* The level n = code & 7 of nearest rounding, as a float (0 .. 7). */
FP4RL_HD float fp4rl_hif4_level_rn(float v)
{
    float t = fp4rl_fma_exact(v, 4.0f, 0.5f);
    t = t < 7.0f ? t : 7.0f;
    return floorf(t);
}
FP4RL_HD uint32_t fp4rl_hif4_code_rn(float v) { return fp4rl_f32_bits(fp4rl_hif4_level_rn(v) + 0x1p23f) - 0x4b000000u; }
FP4RL_HD uint32_t fp4rl_hif4_code_sr(float v, float u)
{
    float w = v * 4.0f;
    w = w < 7.0f ? w : 7.0f;
    const float lo = floorf(w), up = u < w - lo ? 1.0f : 0.0f;
    return fp4rl_f32_bits((lo + 0x1p23f) + up) - 0x4b000000u;
}
/* Both: u < 0 means nearest (round half up), else stochastic with uniform u. */
FP4RL_HD uint32_t fp4rl_hif4_code_mag(float x, float sc, float rec, float u)
{
    return u < 0.0f ? fp4rl_hif4_code_rn(fp4rl_hif4_elem_mag_rn(x, sc * rec)) : fp4rl_hif4_code_sr(fp4rl_hif4_elem_mag(x, sc, rec), u);
}
/* The full code of element x with increment inc = e8 + e16. */
FP4RL_HD uint8_t fp4rl_hif4_encode(float x, int inc, float rec, float u)
{
    return (uint8_t)((fp4rl_signbit(x) << 3) | fp4rl_hif4_code_mag(x, fp4rl_hif4_inc_scale((uint32_t)inc), rec, u));
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

/* The round trip of one element with nearest rounding, without the code: fp4rl_hif4_decode(
 * fp4rl_hif4_encode(x, inc, rec, -1), word, j) for a finite unit (the word's base b.base, element
 * j's increment inc), given screc = fp4rl_hif4_inc_scale(inc) * rec and step = fp4rl_hif4_step(
 * base, inc). decode multiplies ((n / 4) 2^inc) base: the first two factors are exact, and n (3
 * significant bits) times base (3) is exact in binary32 in HiF4's range, so the value is n * step
 * exactly, with x's sign (the code's sign bit; -0 for a negative x at level 0). The result is also
 * exactly a BF16 value. tests/test_formats.c compares the two over every base and increment. */
FP4RL_HD float fp4rl_hif4_step(float base, uint32_t inc) { return base * fp4rl_bits_f32((125u + inc) << 23); }
FP4RL_HD float fp4rl_hif4_qdq_rn(float x, float screc, float step)
{
    const float m = fp4rl_hif4_level_rn(fp4rl_hif4_elem_mag_rn(x, screc)) * step;
    return fp4rl_bits_f32(fp4rl_f32_bits(m) | (fp4rl_f32_bits(x) & 0x80000000u));
}

/* ---- per-format element quantization (the block scale already chosen) --------------------- */
/* MX element: x scaled by sc = 2^-e (the spec's x * 2^-e, one binary32 multiply: |x| * sc is the
 * magnitude of that product), to E2M1 (fp8 == 0) or E4M3 (fp8 == 1). The kernels compute sc once
 * per block and place the sign themselves (packed, for 8 elements at once). */
FP4RL_HD float fp4rl_mx_elem_scale(int e) { return fp4rl_exp2i(-e); }
FP4RL_HD float fp4rl_mx_elem_mag(float x, float sc) { return fabsf(x) * sc; }
FP4RL_HD fp4rl_grid fp4rl_mx_grid(int fp8) { return fp8 ? FP4RL_GRID_E4M3 : FP4RL_GRID_E2M1; }
FP4RL_HD uint32_t fp4rl_mx_code_mag(float x, float sc, int fp8, float u)
{
    return fp4rl_grid_code(fp4rl_mx_grid(fp8), fp4rl_mx_elem_mag(x, sc), u);
}
FP4RL_HD uint8_t fp4rl_mx_encode(float x, int e, int fp8, float u)
{
    return (uint8_t)((fp4rl_signbit(x) << (fp8 ? 7 : 3)) | fp4rl_mx_code_mag(x, fp4rl_mx_elem_scale(e), fp8, u));
}
/* NaN results are returned as the constant 0x7fc00000, never computed: arithmetic on a NaN keeps
 * its payload on CPUs but gives 0x7fffffff on NVIDIA GPUs, and the backends must agree bit for bit. */
FP4RL_HD float fp4rl_mx_decode(uint8_t code, uint8_t scale, int fp8)
{
    if (scale == FP4RL_E8M0_NAN || (fp8 && (code & 0x7fu) == 0x7fu)) return fp4rl_bits_f32(0x7fc00000u);
    return (fp8 ? fp4rl_e4m3_decode(code) : fp4rl_e2m1_decode(code)) * fp4rl_exp2i(fp4rl_e8m0_exp(scale));
}
/* MXFP4's round trip with nearest rounding, without the code: fp4rl_mx_decode(fp4rl_mx_encode(x,
 * e, 0, -1), s, 0) for a finite block of scale s = 2^e, given sc = fp4rl_mx_elem_scale(e) and
 * scale = fp4rl_exp2i(e). fp4rl_grid_code_rn's sum 2^23 + N + k holds the rounded k = a / q, so k
 * is that sum less 2^23 + N (exact), and the code's value is k q: the value is k (q 2^e), every
 * product exact (k <= 4, powers of two down to 2^-128), with x's sign. Also exactly a BF16 value.
 * tests/test_formats.c compares the two over every scale. */
FP4RL_HD float fp4rl_mx4_qdq_rn(float x, float sc, float scale)
{
    const fp4rl_grid g = FP4RL_GRID_E2M1;
    float a = fp4rl_mx_elem_mag(x, sc);
    a = a < g.maxv ? a : g.maxv;
    const uint32_t eb = fp4rl_grid_ebits(g, a);
    const float gb = fp4rl_grid_base(g, eb), k = fp4rl_fma_exact(a, fp4rl_grid_qinv(g, eb), gb) - gb;
    const float m = k * (fp4rl_bits_f32(eb - ((uint32_t)g.mbits << 23)) * scale); /* q = 2^(E - mbits) */
    return fp4rl_bits_f32(fp4rl_f32_bits(m) | (fp4rl_f32_bits(x) & 0x80000000u));
}
/* NVFP4 element with block scale code s (not 0, not NaN) and tensor scale g: x / (s_b * g), an IEEE
 * division by the block's divisor d = s_b * g (computed once per block by the kernels). */
FP4RL_HD float fp4rl_nvfp4_elem_div(uint8_t s, float g) { return fp4rl_ue4m3_decode(s) * g; }
FP4RL_HD float fp4rl_nvfp4_elem_mag(float x, float d) { return fabsf(x) / d; }
/* The same quotient RN(|x| / d) given r = RN(1 / d), computed once per block. On the GPU, where an
 * IEEE division is a ~10-instruction sequence per element, as Markstein's correction
 * q0 = a r, e = a - q0 d (exact, one FMA), RN(q0 + e r): with r correctly rounded and no
 * underflow or overflow on the way this is the correctly rounded quotient (Markstein's theorem;
 * also checked on 4e8 pairs, all-ones significands and near-tie quotients included). It is used
 * where that holds, a = 0 or a in [2^-60, 2^60) with d in [2^-60, 2^60] (quotient and remainder
 * stay normal), and the plain division elsewhere; the host always divides. */
FP4RL_HD float fp4rl_nvfp4_elem_mag_r(float x, float d, float r)
{
    const float a = fabsf(x);
#ifdef __CUDA_ARCH__
    const uint32_t ba = fp4rl_f32_bits(a), bd = fp4rl_f32_bits(d);
    if (bd - 0x21800000u <= 0x3c000000u && (ba - 0x21800000u < 0x3c000000u || ba == 0)) {
        const float q0 = a * r;
        return fmaf(fmaf(-q0, d, a), r, q0);
    }
#else
    (void)r;
#endif
    return a / d;
}
FP4RL_HD uint32_t fp4rl_nvfp4_code_mag(float x, float d, float u) { return fp4rl_grid_code(FP4RL_GRID_E2M1, fp4rl_nvfp4_elem_mag(x, d), u); }
FP4RL_HD uint8_t fp4rl_nvfp4_encode(float x, uint8_t s, float g, float u)
{
    return (uint8_t)((fp4rl_signbit(x) << 3) | fp4rl_nvfp4_code_mag(x, fp4rl_nvfp4_elem_div(s, g), u));
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
