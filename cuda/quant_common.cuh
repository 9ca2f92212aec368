/*
 * quant_common.cuh - device helpers shared by the quantize and dequantize kernels: loading
 * 8 consecutive source elements of a row, Philox uniforms for them, the per-format scale and
 * element encoders (thin wrappers that pick the formats.h function of each format exactly as the
 * CPU reference does), and storing 8 codes.
 *
 * The unit of work everywhere is a "group": 8 consecutive elements of one row. Every block size
 * (16, 32, 64) and tile width is a multiple of 8, so a group never straddles two blocks.
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
    int vec;        /* C % 8 == 0: groups are 16-byte aligned in the source and 4/8-byte in the codes */
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

/* The 8 elements of row r from column c0 (zeros outside the tensor, the padding of the spec). */
__device__ __forceinline__ void load8(const float *src, int64_t R, int64_t C, int64_t r, int64_t c0, int vec, float x[8])
{
    if (r < R && vec && c0 < C) {
        const float4 *p = reinterpret_cast<const float4 *>(src + r * C + c0);
        float4 a = __ldg(p), b = __ldg(p + 1);
        x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
        x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) x[j] = (r < R && c0 + j < C) ? src[r * C + c0 + j] : 0.0f;
}

__device__ __forceinline__ void load8(const uint16_t *src, int64_t R, int64_t C, int64_t r, int64_t c0, int vec, float x[8])
{
    if (r < R && vec && c0 < C) {
        uint4 v = __ldg(reinterpret_cast<const uint4 *>(src + r * C + c0));
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            x[2 * k] = fp4rl_bf16_to_f32((uint16_t)(w[k] & 0xffffu));
            x[2 * k + 1] = fp4rl_bf16_to_f32((uint16_t)(w[k] >> 16));
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) x[j] = (r < R && c0 + j < C) ? fp4rl_bf16_to_f32(src[r * C + c0 + j]) : 0.0f;
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

/* The stored scale of an MX / NVFP4 block (same expressions as the CPU reference). */
template <int F>
__device__ __forceinline__ uint8_t block_scale(float amax, bool finite, float g, int truncation_free)
{
    if (F == NV) return finite ? fp4rl_nvfp4_block_scale(amax, g) : (uint8_t)FP4RL_UE4M3_NAN;
    if (!finite) return (uint8_t)FP4RL_E8M0_NAN;
    return fp4rl_mx_block_scale(amax, (fp4rl_dtype)F, truncation_free);
}

/* The code of one element of an MX / NVFP4 block with stored scale s. */
template <int F>
__device__ __forceinline__ uint8_t encode_elem(float x, uint8_t s, float g, float u)
{
    if (F == NV) return (s == FP4RL_UE4M3_NAN || s == 0) ? (uint8_t)0 : fp4rl_nvfp4_encode(x, s, g, u);
    return s == FP4RL_E8M0_NAN ? (uint8_t)0 : fp4rl_mx_encode(x, fp4rl_e8m0_exp(s), F == MX8, u);
}

/* Stores the 8 codes of a group at row r, column c0 (codes of columns >= C must be 0). */
template <int F>
__device__ __forceinline__ void store8(const QArgs &a, int64_t r, int64_t c0, const uint8_t code[8])
{
    if (r >= a.R || c0 >= a.C) return;
    uint8_t *row = a.codes + r * a.row_bytes;
    if (F == MX8) {
        if (a.vec) {
            uint2 v;
            v.x = (uint32_t)code[0] | (uint32_t)code[1] << 8 | (uint32_t)code[2] << 16 | (uint32_t)code[3] << 24;
            v.y = (uint32_t)code[4] | (uint32_t)code[5] << 8 | (uint32_t)code[6] << 16 | (uint32_t)code[7] << 24;
            *reinterpret_cast<uint2 *>(row + c0) = v;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (c0 + j < a.C) row[c0 + j] = code[j];
        }
        return;
    }
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) w |= (uint32_t)(code[j] & 0xfu) << (4 * j);
    if (a.vec) {
        *reinterpret_cast<uint32_t *>(row + c0 / 2) = w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (c0 / 2 + k < a.row_bytes) row[c0 / 2 + k] = (uint8_t)(w >> (8 * k));
    }
}

__device__ __forceinline__ float warp_max_xor(float v, int mask) { return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, mask)); }

} // namespace fp4rl_cuda_q

#endif
