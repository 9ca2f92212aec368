/*
 * quant_common.cuh - device helpers shared by the quantize and dequantize kernels: loading 8
 * consecutive source elements of a row ("a group"), their max-magnitude keys, Philox uniforms for
 * them, the per-format block scales, encoding a group's 8 elements (through the element functions
 * of core/format/formats.h, the only owner of that arithmetic) into packed codes, and storing them.
 *
 * Every block size (16, 32, 64) and tile width is a multiple of 8, so a group never straddles two
 * blocks. Why the helpers look the way they do (quantization is meant to run at memory speed):
 * - a group is loaded with one 16-byte load (BF16) or two (F32) and kept as loaded;
 * - block maxima are unsigned integer maxima of the magnitude bits ("keys"): non-negative floats
 *   order like their bit patterns, and a key >= 0x7f800000 says the block holds a NaN or an
 *   infinity, so one reduction gives both the max and the finiteness the spec needs; BF16 pairs
 *   are reduced two at a time (__vmaxu2);
 * - codes are packed with one funnel shift per element and the 8 signs are merged with a few byte
 *   permutes for the whole group, straight from the source bits (a code's sign is its input's).
 */
#ifndef FP4RL_QUANT_COMMON_CUH
#define FP4RL_QUANT_COMMON_CUH

#include <type_traits>

#include "cuda_internal.h"
#include "format/formats.h"
#include "format/layout.h"
#include "format/traits.h"

namespace fp4rl_cuda_q {

/* The kernels' format template ids: the fp4rl_dtype of each format, so fp4rl_format_of(F) gives
 * its traits at compile time. */
enum Fmt { MX4 = FP4RL_DTYPE_MXFP4, MX8 = FP4RL_DTYPE_MXFP8_E4M3, NV = FP4RL_DTYPE_NVFP4, HIF4 = FP4RL_DTYPE_HIF4 };
FP4RL_HD_CONST fp4rl_format_traits traits(int F) { return fp4rl_format_of((fp4rl_dtype)F); }

/* Calls fn(std::integral_constant<int, F>()) with the template id F of quantized format fmt: the
 * one place where a format known at run time becomes a kernel's template argument. */
template <typename Fn>
inline void with_format(int fmt, Fn &&fn)
{
    switch (fmt) {
    case MX4: fn(std::integral_constant<int, MX4>()); break;
    case MX8: fn(std::integral_constant<int, MX8>()); break;
    case NV: fn(std::integral_constant<int, NV>()); break;
    default: fn(std::integral_constant<int, HIF4>()); break;
    }
}

/* Everything a quantize kernel needs, passed by value. */
struct QArgs {
    const void *src;
    uint8_t *codes;
    void *scales;
    int64_t R, C, row_bytes, scale_cols;
    int vec;        /* C % 8 == 0 and the source 16-byte aligned: groups load as vectors, codes store as words */
    int quad;       /* C % 4 == 0: a group's Philox outputs come from two whole counters */
    int stochastic;
    int truncation_free;
    uint64_t seed, offset;
    const unsigned *amax_bits; /* NVFP4: the tensor's finite amax (float bits), device memory */
    int64_t groups_per_row;    /* 1D: groups per row, padded to whole blocks */
    double inv_groups_per_row; /* 1 / groups_per_row, for split_index */
};

/* (t / d, t % d) for 0 <= t < 2^53: a 64-bit integer division is a long subroutine on the GPU,
 * while t * (1 / d) in double is off by at most one, which one compare corrects. */
__device__ __forceinline__ void split_index(int64_t t, int64_t d, double inv_d, int64_t &q, int64_t &r)
{
    q = (int64_t)((double)t * inv_d);
    r = t - q * d;
    if (r < 0) q--, r += d;
    else if (r >= d) q++, r -= d;
}

__device__ __forceinline__ float src_at(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float src_at(const uint16_t *p, int64_t i) { return fp4rl_bf16_to_f32(p[i]); }

/* ---- groups as loaded ------------------------------------------------------------------------ */
/* 8 consecutive elements kept as loaded: BF16 as 4 words (element 2k in the low half of w[k]),
 * F32 as 8 floats. */
template <typename S>
struct Raw8;
template <>
struct Raw8<uint16_t> {
    uint32_t w[4];
    __device__ __forceinline__ float x(int j) const { return __uint_as_float((j & 1) ? (w[j >> 1] & 0xffff0000u) : (w[j >> 1] << 16)); }
};
template <>
struct Raw8<float> {
    float f[8];
    __device__ __forceinline__ float x(int j) const { return f[j]; }
};

/* The group at element i of src (16-byte aligned), or zeros (the spec's padding) when !valid. */
__device__ __forceinline__ void ld8(Raw8<uint16_t> &g, const uint16_t *src, int64_t i, bool valid)
{
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (valid) v = __ldg(reinterpret_cast<const uint4 *>(src + i));
    g.w[0] = v.x; g.w[1] = v.y; g.w[2] = v.z; g.w[3] = v.w;
}
__device__ __forceinline__ void ld8(Raw8<float> &g, const float *src, int64_t i, bool valid)
{
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
    if (valid) {
        a = __ldg(reinterpret_cast<const float4 *>(src + i));
        b = __ldg(reinterpret_cast<const float4 *>(src + i) + 1);
    }
    g.f[0] = a.x; g.f[1] = a.y; g.f[2] = a.z; g.f[3] = a.w;
    g.f[4] = b.x; g.f[5] = b.y; g.f[6] = b.z; g.f[7] = b.w;
}
/* The first n (0..8) elements at src + i, element by element (unaligned rows, tails); zeros after. */
__device__ __forceinline__ void ld8_tail(Raw8<uint16_t> &g, const uint16_t *src, int64_t i, int n)
{
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t lo = 2 * k < n ? src[i + 2 * k] : 0u, hi = 2 * k + 1 < n ? src[i + 2 * k + 1] : 0u;
        g.w[k] = lo | hi << 16;
    }
}
__device__ __forceinline__ void ld8_tail(Raw8<float> &g, const float *src, int64_t i, int n)
{
#pragma unroll
    for (int j = 0; j < 8; j++) g.f[j] = j < n ? src[i + j] : 0.0f;
}

/* Max-magnitude keys: the largest |x| bits of elements 4h .. 4h+3 (key4) or of all 8 (key8). */
__device__ __forceinline__ uint32_t fold16(uint32_t m) { return max(m << 16, m & 0xffff0000u); }
__device__ __forceinline__ uint32_t key4(const Raw8<uint16_t> &g, int h)
{
    return fold16(__vmaxu2(g.w[2 * h] & 0x7fff7fffu, g.w[2 * h + 1] & 0x7fff7fffu));
}
__device__ __forceinline__ uint32_t key8(const Raw8<uint16_t> &g)
{
    return fold16(__vmaxu2(__vmaxu2(g.w[0] & 0x7fff7fffu, g.w[1] & 0x7fff7fffu), __vmaxu2(g.w[2] & 0x7fff7fffu, g.w[3] & 0x7fff7fffu)));
}
__device__ __forceinline__ uint32_t key4(const Raw8<float> &g, int h)
{
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) m = max(m, __float_as_uint(g.f[4 * h + j]) & 0x7fffffffu);
    return m;
}
__device__ __forceinline__ uint32_t key8(const Raw8<float> &g) { return max(key4(g, 0), key4(g, 1)); }
/* A block's key: finite iff below the exponent-all-ones pattern; then it is the float bits of amax. */
__device__ __forceinline__ bool key_finite(uint32_t k) { return k < 0x7f800000u; }
__device__ __forceinline__ uint32_t warp_max_u(uint32_t v, int mask) { return max(v, __shfl_xor_sync(0xffffffffu, v, mask)); }

/* Sign words: the group's bits with each element's sign where a BF16 pair has it (element 2k at
 * bit 15 of word k, 2k+1 at bit 31). BF16: the words as loaded; F32: the top halves. */
__device__ __forceinline__ void sign_words(const Raw8<uint16_t> &g, uint32_t s[4])
{
#pragma unroll
    for (int k = 0; k < 4; k++) s[k] = g.w[k];
}
__device__ __forceinline__ void sign_words(const Raw8<float> &g, uint32_t s[4])
{
#pragma unroll
    for (int k = 0; k < 4; k++) s[k] = __byte_perm(__float_as_uint(g.f[2 * k]), __float_as_uint(g.f[2 * k + 1]), 0x7632);
}
/* The sign bits of 8 packed 4-bit codes (bit 4j + 3 = sign of element j) from the sign words: gather
 * the sign bytes of the even and of the odd elements, byte k = pair k, then move each in place. */
__device__ __forceinline__ uint32_t nibble_signs(const uint32_t s[4])
{
    const uint32_t p01 = __byte_perm(s[0], s[1], 0x7351), p23 = __byte_perm(s[2], s[3], 0x7351);
    const uint32_t ev = __byte_perm(p01, p23, 0x5410), od = __byte_perm(p01, p23, 0x7632);
    return ((ev >> 4) & 0x08080808u) | (od & 0x80808080u);
}
/* The sign bits of 4 byte codes (bit 8j + 7 = sign of element 4h + j). */
__device__ __forceinline__ uint32_t byte_signs(const uint32_t s[4], int h)
{
    return __byte_perm(s[2 * h], s[2 * h + 1], 0x7531) & 0x80808080u;
}

/* Packed codes of a group: 4-bit codes one word (element j in bits 4j..4j+3), 8-bit codes two. */
struct Codes8 { uint32_t lo, hi; };

/* Packs 8 magnitude codes and the signs of the group. Plain shifts and masks rather than funnel-shift
 * or byte-permute intrinsics, so that the compiler sees that only the low 4 or 8 bits of each code
 * are read (and drops the "- 2^23" of formats.h's codes); the nibbles become funnel shifts anyway. */
template <int F, typename S>
__device__ __forceinline__ Codes8 pack8(const uint32_t m[8], const Raw8<S> &g)
{
    uint32_t s[4];
    sign_words(g, s);
    Codes8 c;
    if (traits(F).code_bits == 8) {
        c.lo = ((m[0] & 0xffu) | (m[1] & 0xffu) << 8 | (m[2] & 0xffu) << 16 | m[3] << 24) | byte_signs(s, 0);
        c.hi = ((m[4] & 0xffu) | (m[5] & 0xffu) << 8 | (m[6] & 0xffu) << 16 | m[7] << 24) | byte_signs(s, 1);
    } else {
        uint32_t acc = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) acc = (acc >> 4) | m[j] << 28;
        c.lo = acc | nibble_signs(s);
        c.hi = 0;
    }
    return c;
}

/* Stochastic-rounding uniforms of the elements with row-major indices i0 .. i0+7 (spec section 5).
 * When i0 is a multiple of 4 (quad) two Philox calls cover the group, as on the CPU; otherwise
 * each element takes its own call through fp4rl_sr_uniform. */
__device__ __forceinline__ void uniforms8(uint64_t seed, uint64_t offset, uint64_t i0, int quad, float u[8])
{
    if (quad) {
        const uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint64_t q = (i0 >> 2) + (uint64_t)h;
            const uint32_t c[4] = {(uint32_t)q, (uint32_t)(q >> 32), (uint32_t)offset, (uint32_t)(offset >> 32)};
            uint32_t o[4];
            fp4rl_philox4x32_10(c, k, o);
#pragma unroll
            for (int j = 0; j < 4; j++) u[4 * h + j] = (float)(o[j] >> 8) * 0x1p-24f;
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) u[j] = fp4rl_sr_uniform(seed, offset, i0 + (uint64_t)j);
}

/* ---- per-format block scales and element codes ------------------------------------------------ */
/* What a block needs to encode its elements, from its key (same expressions as the CPU reference):
 * the stored scale, and the per-element factor (MX: 2^-e; NVFP4: the divisor s_b * g; HiF4 words
 * are built by the kernels). zero: the block's codes are all 0 (non-finite, or NVFP4's s_b = 0). */
struct BlockScale {
    uint8_t s;
    bool zero;
    float f, r; /* r: NVFP4's 1 / f, correctly rounded (for fp4rl_nvfp4_elem_mag_r) */
};
template <int F>
__device__ __forceinline__ BlockScale block_scale(uint32_t key, float g, int truncation_free)
{
    BlockScale b;
    const bool finite = key_finite(key);
    if (F == NV) {
        b.s = finite ? fp4rl_nvfp4_block_scale(__uint_as_float(key), g) : (uint8_t)FP4RL_UE4M3_NAN;
        b.zero = b.s == FP4RL_UE4M3_NAN || b.s == 0;
        b.f = fp4rl_nvfp4_elem_div(b.zero ? (uint8_t)0x38 : b.s, g); /* 0x38 = 1.0: any finite divisor for a block whose codes are 0 */
        b.r = 1.0f / b.f;
    } else {
        b.s = finite ? fp4rl_mx_block_scale(__uint_as_float(key), (fp4rl_dtype)F, truncation_free) : (uint8_t)FP4RL_E8M0_NAN;
        b.zero = !finite;
        b.f = fp4rl_mx_elem_scale(fp4rl_e8m0_exp(finite ? b.s : (uint8_t)FP4RL_E8M0_BIAS));
        b.r = 1.0f;
    }
    return b;
}

/* The magnitude code of element x of an MX / NVFP4 block (f from block_scale), nearest or
 * stochastic with uniform u. */
template <int F, bool SR>
__device__ __forceinline__ uint32_t elem_code(float x, float f, float r, float u)
{
    constexpr int fp8 = traits(F).code_bits == 8;
    const float a = F == NV ? fp4rl_nvfp4_elem_mag_r(x, f, r) : fp4rl_mx_elem_mag(x, f);
    return SR ? fp4rl_grid_code_sr(fp4rl_mx_grid(fp8), a, u) : fp4rl_grid_code_rn(fp4rl_mx_grid(fp8), a);
}
/* The magnitude code of a HiF4 element with sc = 2^-inc and the unit's reciprocal rec (nearest:
 * screc = sc * rec, one multiply; see fp4rl_hif4_elem_mag_rn). */
template <bool SR>
__device__ __forceinline__ uint32_t hif4_code(float x, float sc, float rec, float screc, float u)
{
    return SR ? fp4rl_hif4_code_sr(fp4rl_hif4_elem_mag(x, sc, rec), u) : fp4rl_hif4_code_rn(fp4rl_hif4_elem_mag_rn(x, screc));
}

/* The packed codes of group g of an MX / NVFP4 block; u: the group's uniforms (SR only). */
template <int F, bool SR, typename S>
__device__ __forceinline__ Codes8 encode8(const Raw8<S> &g, const BlockScale &b, const float *u)
{
    uint32_t m[8];
#pragma unroll
    for (int j = 0; j < 8; j++) m[j] = elem_code<F, SR>(g.x(j), b.f, b.r, SR ? u[j] : -1.0f);
    Codes8 c = pack8<F>(m, g);
    if (b.zero) c.lo = c.hi = 0;
    return c;
}
/* The packed codes of a HiF4 group whose halves have increments inc0 (elements 0..3) and inc1. */
template <bool SR, typename S>
__device__ __forceinline__ Codes8 encode8_hif4(const Raw8<S> &g, uint32_t inc0, uint32_t inc1, float rec, bool zero, const float *u)
{
    const float sc0 = fp4rl_hif4_inc_scale(inc0), sc1 = fp4rl_hif4_inc_scale(inc1), sr0 = sc0 * rec, sr1 = sc1 * rec;
    uint32_t m[8];
#pragma unroll
    for (int j = 0; j < 8; j++) m[j] = hif4_code<SR>(g.x(j), j < 4 ? sc0 : sc1, rec, j < 4 ? sr0 : sr1, SR ? u[j] : -1.0f);
    Codes8 c = pack8<HIF4>(m, g);
    if (zero) c.lo = c.hi = 0;
    return c;
}

/* Stores a group's codes at byte offset `byte` of the code buffer, aligned (4 bytes for 4-bit
 * codes, 8 for 8-bit ones). */
template <int F>
__device__ __forceinline__ void st_codes(uint8_t *codes, int64_t byte, Codes8 c)
{
    if (traits(F).code_bits == 8) *reinterpret_cast<uint2 *>(codes + byte) = make_uint2(c.lo, c.hi);
    else *reinterpret_cast<uint32_t *>(codes + byte) = c.lo;
}
/* The same for a group whose row has only n (1..8) columns left, or an unaligned row: byte stores
 * of the bytes that hold those columns (a 4-bit row's last byte keeps 0 in its pad nibble). */
template <int F>
__device__ __forceinline__ void st_codes_tail(uint8_t *codes, int64_t byte, Codes8 c, int n)
{
    const int nb = traits(F).code_bits == 8 ? n : (n + 1) / 2;
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (k < nb) codes[byte + k] = (uint8_t)((k < 4 ? c.lo : c.hi) >> (8 * (k & 3)));
}

} // namespace fp4rl_cuda_q

#endif
