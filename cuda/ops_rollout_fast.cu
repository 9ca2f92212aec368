/*
 * ops_rollout_fast.cu - the rollout's fused linear path on the GPU (core/backend/ops.h): the activation
 * operand in one kernel (quantize-dequantize, underflow counts, Rollout-ResQ residual, its fresh
 * quantization and 2:4 mask, BF16 packing), and BF16 packing of the rollout weights. The block
 * arithmetic is that of qdq_block.h (the CPU op's), spread over the lanes of a warp.
 * (linear_forward_bf16 lives in ops_linear.cu, next to the FP32 layer.) The W4A4 decode pair,
 * rollout_act8 and linear_forward_w4, wraps decode_fp8.h's quantizer and d8 GEMM.
 */
#include <stdlib.h>

#include "backend/halves.h"
#include "decode_fp8.h"
#include "decode_w4b.h"
#include "format/formats.h"
#include "format/layout.h"
#include "format/qdq_block.h"
#include "ops_cuda.h"
#include "quant_common.cuh"

using namespace fp4rl_cuda_ops_detail;

namespace {

/* ---- the activation kernel: one thread per 8 consecutive elements of a row ("group"), the
 * groups of one block in adjacent lanes (8 for HiF4's 64, 4 for MX's 32), block-wide values by
 * shuffles. Max is exact and order-free, and every scale and element step is the formats.h
 * function qdq_block.h calls on the CPU, so the results are the CPU's bit for bit
 * (tests/test_ops_parity.c holds them to it). Rows are padded with zeros to whole blocks, the
 * padding of the reference quantizer. */
template <int BS>
__device__ __forceinline__ float block_max_lanes(float v)
{
#pragma unroll
    for (int m = 1; m < BS / 8; m <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

/* y = qdq(x) for one group of 8 elements of a block, given the block's amax and whether it holds
 * a non-finite element; a0, a1: the maxima of the group's halves; h: the group's index in its
 * block; u: the elements' stochastic-rounding uniforms (-1: nearest). */
__device__ __forceinline__ void qdq8(int fmt, const float x[8], float y[8], int h, int truncation_free, float amax, bool nonfinite,
                                     float a0, float a1, const float u[8])
{
    if (nonfinite) {
#pragma unroll
        for (int j = 0; j < 8; j++) y[j] = fp4rl_bits_f32(0x7fc00000u);
        return;
    }
    if (fmt != FP4RL_QDQ_HIF4) {
        const int fp8 = fmt == FP4RL_QDQ_MXFP8;
        const uint8_t s = fp4rl_mx_block_scale(amax, (fp4rl_dtype)fmt, truncation_free);
#pragma unroll
        for (int j = 0; j < 8; j++) y[j] = fp4rl_mx_decode(fp4rl_mx_encode(x[j], fp4rl_e8m0_exp(s), fp8, u[j]), s, fp8);
        return;
    }
    /* this group's bits of the unit's scale word: its e8 bit and its two e16 bits */
    const fp4rl_hif4_base b = fp4rl_hif4_make_base(amax);
    const uint32_t e8 = fp4rl_hif4_e8(fmaxf(a0, a1), b.rec);
    const uint32_t word = b.e6m2 | fp4rl_hif4_e8_at(e8, h) | fp4rl_hif4_e16_at(fp4rl_hif4_e16(a0, e8, b.rec), 2 * h) |
                          fp4rl_hif4_e16_at(fp4rl_hif4_e16(a1, e8, b.rec), 2 * h + 1);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int jj = 8 * h + j;
        y[j] = fp4rl_hif4_decode(fp4rl_hif4_encode(x[j], fp4rl_hif4_word_inc(word, jj), b.rec, u[j]), word, jj);
    }
}

/* y = qdq(x) for this lane's 8 elements, the block's other groups in the neighbouring lanes */
template <int BS>
__device__ __forceinline__ void qdq_group(int fmt, const float x[8], float y[8], int h, int truncation_free, const float u[8])
{
    int fin = 1;
    const float a0 = fp4rl_qdq_amax(x, 0, 4, &fin), a1 = fp4rl_qdq_amax(x, 4, 8, &fin);
    const float amax = block_max_lanes<BS>(fmaxf(a0, a1));
    const float nonfinite = block_max_lanes<BS>(fin ? 0.0f : 1.0f);
    qdq8(fmt, x, y, h, truncation_free, amax, nonfinite != 0.0f, a0, a1, u);
}

/* The stochastic-rounding uniforms of elements i0 .. i0 + 7 (quant_common.cuh's uniforms8, the
 * quantize kernels' own); all -1 (nearest) when not stochastic. */
__device__ __forceinline__ void group_uniforms(int stochastic, uint64_t seed, uint64_t offset, uint64_t i0, float u[8])
{
    if (stochastic) {
        fp4rl_cuda_q::uniforms8(seed, offset, i0, (i0 & 3) == 0, u);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) u[j] = -1.0f;
}

__device__ __forceinline__ void store_bf16x8(uint16_t *o, const float y[8], int64_t valid, int vec)
{
    if (vec && valid >= 8) {
        uint4 v;
        v.x = (uint32_t)fp4rl_f32_to_bf16(y[0]) | (uint32_t)fp4rl_f32_to_bf16(y[1]) << 16;
        v.y = (uint32_t)fp4rl_f32_to_bf16(y[2]) | (uint32_t)fp4rl_f32_to_bf16(y[3]) << 16;
        v.z = (uint32_t)fp4rl_f32_to_bf16(y[4]) | (uint32_t)fp4rl_f32_to_bf16(y[5]) << 16;
        v.w = (uint32_t)fp4rl_f32_to_bf16(y[6]) | (uint32_t)fp4rl_f32_to_bf16(y[7]) << 16;
        *reinterpret_cast<uint4 *>(o) = v;
        return;
    }
    for (int j = 0; j < 8 && j < valid; j++) o[j] = fp4rl_f32_to_bf16(y[j]);
}

template <int BS>
__global__ void __launch_bounds__(256) act_qdq_k(uint16_t *out, unsigned long long *counts, const float *x, int64_t N, int64_t K,
                                                 int fmt, int truncation_free, int resq, int stochastic, uint64_t seed,
                                                 uint64_t offset)
{
    const int two = resq == FP4RL_RESQ_DENSE || resq == FP4RL_RESQ_2_4;
    const int64_t gpr = (K + BS - 1) / BS * (BS / 8), ld = K; /* groups per row, whole blocks; the residual's rows follow */
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;   /* every lane runs: shuffles */
    const int64_t n = i / gpr, g = i - n * gpr, k0 = g * 8;
    const int h = (int)(g % (BS / 8));
    const int64_t valid = n < N && k0 < K ? (K - k0 < 8 ? K - k0 : 8) : 0;
    const int vec = (K % 8) == 0;
    float xv[8], y[8];
    if (valid == 8 && vec) {
        const float4 *p = reinterpret_cast<const float4 *>(x + n * K + k0);
        const float4 a = __ldg(p), c = __ldg(p + 1);
        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = c.x, xv[5] = c.y, xv[6] = c.z, xv[7] = c.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) xv[j] = j < valid ? x[n * K + k0 + j] : 0.0f;
    }
    float u[8];
    group_uniforms(stochastic && valid, seed, offset, (uint64_t)(n * K + k0), u);
    qdq_group<BS>(fmt, xv, y, h, truncation_free, u);
    unsigned long long nz = 0, under = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        nz += xv[j] != 0.0f;
        under += xv[j] != 0.0f && y[j] == 0.0f;
    }
    if (valid) store_bf16x8(out + n * ld + k0, y, valid, vec);
    if (two) {
        float r[8];
#pragma unroll
        for (int j = 0; j < 8; j++) r[j] = xv[j] - y[j];
        const float nearest[8] = {-1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f};
        qdq_group<BS>(fmt, r, r, h, truncation_free, nearest);
        /* padding zeros sort after a group's real elements, so the kept real ones are the CPU's */
        if (resq == FP4RL_RESQ_2_4) fp4rl_mask_2_4_group(r, 4), fp4rl_mask_2_4_group(r + 4, 4);
        if (valid) store_bf16x8(out + (N + n) * ld + k0, r, valid, vec);
    }
    if (!counts) return;
    for (int m = 16; m > 0; m >>= 1) { /* integer sums: exact whatever the order */
        nz += __shfl_xor_sync(0xffffffffu, nz, m);
        under += __shfl_xor_sync(0xffffffffu, under, m);
    }
    if ((threadIdx.x & 31) == 0 && (nz || under)) {
        atomicAdd(counts, nz);
        atomicAdd(counts + 1, under);
    }
}

/* ---- the activation kernel, four elements a thread (round to nearest only) ------------------
 * One thread per 4 consecutive elements of a row (a "quad": one HiF4 e16 micro-block, one 2:4
 * group), the quads of one block in adjacent aligned lanes (16 for HiF4's 64, 8 for MX's 32).
 * Twice the threads of act_qdq_k and half the dependent chain each, for the rollout's small N.
 * The same values as qdq8 / the CPU's fp4rl_qdq_block, from formats.h functions:
 *  - the block max and the non-finite flag: one integer max of the magnitude bits over the lanes
 *    of the block (exact, order-free; >= 0x7f800000 iff some element is inf or NaN, which makes
 *    the block NaN, else the max |x|); the HiF4 e8 operand, the max of an 8-element sub-block, is
 *    the first xor-1 step of that butterfly (quads 2h, 2h+1);
 *  - HiF4's increment of the quad, inc = e8 + e16 (the two word bits fp4rl_hif4_word_inc reads for
 *    its four elements), and each value as fp4rl_hif4_qdq_rn (MXFP4: fp4rl_mx4_qdq_rn): the round
 *    trip without the code, equal to decode(encode) (tests/test_formats.c checks every scale) and
 *    a BF16 value, so its BF16 word is its high half. About half the instructions of decoding.
 *    MXFP8 decodes its codes (its values may be BF16 subnormals, so they are rounded);
 *  - padding (the last block of a ragged row): zeros, as act_qdq_k and the reference quantizer;
 *  - 2:4: fp4rl_mask_2_4_group on the quad, padding zeros included, as act_qdq_k (they sort after
 *    the quad's real elements, so the kept real ones are the CPU's);
 *  - counts: integer sums, exact whatever the order.
 * Grid: x covers a row's quads (a block never straddles a CTA: 128 is a multiple of 16), y the
 * rows (a CTA-uniform loop past 65535 rows), so no 64-bit division. */
constexpr int ACT4_THREADS = 128;

template <int FMT>
__device__ __forceinline__ void qdq4(const float x[4], float y[4], int truncation_free)
{
    constexpr int L = (FMT == FP4RL_QDQ_HIF4 ? 64 : 32) / 4; /* lanes (quads) of a block */
    uint32_t a = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) a = max(a, fp4rl_f32_bits(x[j]) & 0x7fffffffu);
    const uint32_t m8 = max(a, __shfl_xor_sync(0xffffffffu, a, 1)); /* quads 2h, 2h + 1: sub-block h */
    uint32_t m = m8;
#pragma unroll
    for (int k = 2; k < L; k <<= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, k));
    if (m >= 0x7f800000u) {
#pragma unroll
        for (int j = 0; j < 4; j++) y[j] = fp4rl_bits_f32(0x7fc00000u);
        return;
    }
    const float amax = fp4rl_bits_f32(m);
    if (FMT == FP4RL_QDQ_MXFP8) {
        const uint8_t s = fp4rl_mx_block_scale(amax, FP4RL_DTYPE_MXFP8_E4M3, truncation_free);
#pragma unroll
        for (int j = 0; j < 4; j++) y[j] = fp4rl_mx_decode(fp4rl_mx_encode(x[j], fp4rl_e8m0_exp(s), 1, -1.0f), s, 1);
    } else if (FMT == FP4RL_QDQ_MXFP4) {
        const int e = fp4rl_e8m0_exp(fp4rl_mx_block_scale(amax, FP4RL_DTYPE_MXFP4, truncation_free));
        const float sc = fp4rl_mx_elem_scale(e), scale = fp4rl_exp2i(e);
#pragma unroll
        for (int j = 0; j < 4; j++) y[j] = fp4rl_mx4_qdq_rn(x[j], sc, scale);
    } else {
        const fp4rl_hif4_base b = fp4rl_hif4_make_base(amax);
        const uint32_t e8 = fp4rl_hif4_e8(fp4rl_bits_f32(m8), b.rec);
        const uint32_t inc = e8 + fp4rl_hif4_e16(fp4rl_bits_f32(a), e8, b.rec);
        const float screc = fp4rl_hif4_inc_scale(inc) * b.rec, step = fp4rl_hif4_step(b.base, inc);
#pragma unroll
        for (int j = 0; j < 4; j++) y[j] = fp4rl_hif4_qdq_rn(x[j], screc, step);
    }
}

/* Four values as BF16 words. EXACT: they are BF16 values already (HiF4's and MXFP4's round trips,
 * NaN 0x7fc00000 included), so their high halves, which is what fp4rl_f32_to_bf16 returns for
 * them; else rounded by fp4rl_f32_to_bf16 (MXFP8's values may need it: BF16 subnormals). */
template <bool EXACT>
__device__ __forceinline__ uint16_t to_bf16(float v)
{
    return EXACT ? (uint16_t)(fp4rl_f32_bits(v) >> 16) : fp4rl_f32_to_bf16(v);
}
template <bool EXACT>
__device__ __forceinline__ void store_bf16x4(uint16_t *o, const float y[4], int valid, int vec)
{
    if (vec && valid == 4) {
        *reinterpret_cast<uint2 *>(o) = make_uint2((uint32_t)to_bf16<EXACT>(y[0]) | (uint32_t)to_bf16<EXACT>(y[1]) << 16,
                                                   (uint32_t)to_bf16<EXACT>(y[2]) | (uint32_t)to_bf16<EXACT>(y[3]) << 16);
        return;
    }
    for (int j = 0; j < valid; j++) o[j] = to_bf16<EXACT>(y[j]);
}

/* act_qdq4_k's input, four elements k0 .. k0 + 3 of row n (zeros past `valid`; vec: 16-byte loads):
 * ActRows reads x [N, K]; ActSwiglu computes swiglu_rows' values (K = inter) from the gate/up
 * GEMM's output or halves (gu, lo, bias: backend/halves.h), each element with swiglu_rows_k's
 * expression, so the fused swiglu_act sees the h swiglu_rows would write. */
struct ActRows {
    const float *x;
    __device__ __forceinline__ void load(int64_t n, int64_t K, int64_t k0, int valid, int vec, float v[4]) const
    {
        const float *xr = x + n * K + k0;
        if (vec && valid == 4) {
            const float4 a = __ldg(reinterpret_cast<const float4 *>(xr));
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
            return;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = j < valid ? xr[j] : 0.0f;
    }
};
struct ActSwiglu {
    const float *gu, *lo, *bias;
    __device__ __forceinline__ void load(int64_t n, int64_t K, int64_t k0, int valid, int vec, float v[4]) const
    {
        const int64_t g = n * 2 * K + k0; /* gate's element; up's is K further */
        if (vec && valid == 4) {
            const float4 a = fp4rl_halves_at4(gu, lo, bias, g, k0), b = fp4rl_halves_at4(gu, lo, bias, g + K, K + k0);
            v[0] = swiglu1(a.x, b.x), v[1] = swiglu1(a.y, b.y), v[2] = swiglu1(a.z, b.z), v[3] = swiglu1(a.w, b.w);
            return;
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            v[j] = j < valid ? swiglu1(fp4rl_halves_at(gu, lo, bias, g + j, k0 + j), fp4rl_halves_at(gu, lo, bias, g + K + j, K + k0 + j))
                             : 0.0f;
    }
};

/* FMT: FP4RL_QDQ_* or ACT4_BF16 (BF16 numerics: the values rounded, no quantization, no counts).
 * qpr: quads a row, whole blocks; vec: K % 4 == 0, the input's 16-byte loads aligned, out 8-byte
 * aligned. */
constexpr int ACT4_BF16 = -1;
template <int FMT, typename Src>
__global__ void __launch_bounds__(ACT4_THREADS) act_qdq4_k(uint16_t *out, unsigned long long *counts, Src src, int64_t N,
                                                           int64_t K, int qpr, int truncation_free, int resq, int vec)
{
    constexpr bool EXACT = FMT == FP4RL_QDQ_HIF4 || FMT == FP4RL_QDQ_MXFP4; /* their values are BF16 values */
    const int two = FMT != ACT4_BF16 && (resq == FP4RL_RESQ_DENSE || resq == FP4RL_RESQ_2_4);
    const int t = (int)blockIdx.x * ACT4_THREADS + (int)threadIdx.x; /* every lane runs: shuffles */
    const int64_t k0 = 4 * (int64_t)t;
    const int valid = t < qpr && k0 < K ? (K - k0 < 4 ? (int)(K - k0) : 4) : 0;
    unsigned nz = 0, under = 0;
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y) { /* CTA-uniform */
        float xv[4], y[4];
        src.load(n, K, k0, valid, vec, xv);
        if constexpr (FMT == ACT4_BF16) {
#pragma unroll
            for (int j = 0; j < 4; j++) y[j] = xv[j];
        } else {
            qdq4<FMT>(xv, y, truncation_free);
        }
        if constexpr (FMT != ACT4_BF16) { /* BF16 numerics count nothing */
#pragma unroll
            for (int j = 0; j < 4; j++) {
                nz += xv[j] != 0.0f;
                under += xv[j] != 0.0f && y[j] == 0.0f;
            }
        }
        if (valid) store_bf16x4<EXACT>(out + n * K + k0, y, valid, vec);
        if (two) {
            float r[4];
#pragma unroll
            for (int j = 0; j < 4; j++) r[j] = xv[j] - y[j];
            if constexpr (FMT != ACT4_BF16) qdq4<FMT>(r, r, truncation_free);
            if (resq == FP4RL_RESQ_2_4) fp4rl_mask_2_4_group(r, 4);
            if (valid) store_bf16x4<EXACT>(out + (N + n) * K + k0, r, valid, vec);
        }
    }
    if (!counts) return; /* uniform: every thread of the grid sees the same pointer */
    __shared__ unsigned snz[ACT4_THREADS / 32], sunder[ACT4_THREADS / 32];
    nz = __reduce_add_sync(0xffffffffu, nz); /* integer sums: exact whatever the order */
    under = __reduce_add_sync(0xffffffffu, under);
    if ((threadIdx.x & 31) == 0) snz[threadIdx.x >> 5] = nz, sunder[threadIdx.x >> 5] = under;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long a = 0, b = 0;
#pragma unroll
        for (int w = 0; w < ACT4_THREADS / 32; w++) a += snz[w], b += sunder[w];
        if (a || b) {
            atomicAdd(counts, a);
            atomicAdd(counts + 1, b);
        }
    }
}

/* Launch act_qdq4_k on src for format fmt (FP4RL_QDQ_* or ACT4_BF16; returns 0), or return 1 where
 * it does not apply (empty or huge shapes, another format). vec as act_qdq4_k's. */
template <typename Src>
int act4_launch(cudaStream_t s, uint16_t *out, unsigned long long *counts, Src src, int64_t N, int64_t K, int fmt,
                int truncation_free, int resq, int vec)
{
    const int bs = fmt == ACT4_BF16 ? 4 : fp4rl_qdq_block_size(fmt);
    const int64_t qpr = (K + bs - 1) / bs * (bs / 4);
    if (N <= 0 || K <= 0 || qpr > (int64_t)1 << 30) return 1;
    const dim3 grid((unsigned)((qpr + ACT4_THREADS - 1) / ACT4_THREADS), (unsigned)(N < 65535 ? N : 65535));
#define ACT4(F) act_qdq4_k<F, Src><<<grid, ACT4_THREADS, 0, s>>>(out, counts, src, N, K, (int)qpr, truncation_free, resq, vec)
    if (fmt == FP4RL_QDQ_HIF4) ACT4(FP4RL_QDQ_HIF4);
    else if (fmt == FP4RL_QDQ_MXFP4) ACT4(FP4RL_QDQ_MXFP4);
    else if (fmt == FP4RL_QDQ_MXFP8) ACT4(FP4RL_QDQ_MXFP8);
    else if (fmt == ACT4_BF16) ACT4(ACT4_BF16);
    else return 1;
#undef ACT4
    return 0;
}

/* act4_launch on x [N, K] for a nearest-rounding activation (returns 0), or 1 where it does not
 * apply (see there, and FP4RL_ACT_QDQ4=0): the caller then runs act_qdq_k. */
int act_qdq4_launch(cudaStream_t s, uint16_t *out, unsigned long long *counts, const float *x, int64_t N, int64_t K, int fmt,
                    int truncation_free, int resq)
{
    static const int off = [] {
        const char *e = getenv("FP4RL_ACT_QDQ4"); /* on unless "0" (the HiF4 rollout ~4.5% faster, bench/RESULTS.md) */
        return e && e[0] == '0';
    }();
    if (off || fmt < 0) return 1;
    const int vec = K % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)out % 8 == 0;
    return act4_launch(s, out, counts, ActRows{x}, N, K, fmt, truncation_free, resq, vec);
}

/* ---- blocks down the columns (the training GEMMs' operands contracted along tokens) ----------
 * A CTA is 32 columns x one block of BS rows: thread (tx, ty) holds rows 8 ty .. 8 ty + 7 of
 * column tx, so each load and store of a warp is 32 consecutive columns of one row (coalesced);
 * the block's maximum and non-finite flag meet in shared memory. Element (r, c) is element
 * c * rows + r of the transposed tensor the generic path quantizes: its uniform's index. */
template <int BS>
__global__ void __launch_bounds__(32 * (BS / 8)) qdq_rows_k(uint16_t *dst, const float *src, int64_t rows, int64_t cols, int fmt,
                                                            int truncation_free, int stochastic, uint64_t seed, uint64_t offset)
{
    __shared__ float smax[BS / 8][32];
    __shared__ int sbad[BS / 8][32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c = (int64_t)blockIdx.x * 32 + tx, r0 = (int64_t)blockIdx.y * BS + 8 * ty;
    float x[8], y[8], u[8];
#pragma unroll
    for (int j = 0; j < 8; j++) x[j] = c < cols && r0 + j < rows ? __ldg(src + (r0 + j) * cols + c) : 0.0f;
    int fin = 1;
    const float a0 = fp4rl_qdq_amax(x, 0, 4, &fin), a1 = fp4rl_qdq_amax(x, 4, 8, &fin);
    smax[ty][tx] = fmaxf(a0, a1);
    sbad[ty][tx] = !fin;
    __syncthreads();
    float amax = 0.0f;
    int bad = 0;
#pragma unroll
    for (int g = 0; g < BS / 8; g++) amax = fmaxf(amax, smax[g][tx]), bad |= sbad[g][tx];
    group_uniforms(stochastic && c < cols, seed, offset, (uint64_t)(c * rows + r0), u);
    qdq8(fmt, x, y, ty, truncation_free, amax, bad != 0, a0, a1, u);
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (c < cols && r0 + j < rows) dst[(r0 + j) * cols + c] = fp4rl_f32_to_bf16(y[j]);
}

__global__ void pack_bf16_k(uint16_t *dst, int64_t ld, const float *src, int64_t rows, int64_t cols)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i - r * cols;
        dst[r * ld + c] = fp4rl_f32_to_bf16(src[i]);
    }
}

/* The dense case (ld == cols, 16-byte aligned source, 8-byte aligned destination), four values per
 * thread: the bandwidth-bound form, for the training GEMMs' operands. */
__global__ void pack_bf16_x4_k(uint2 *dst, const float4 *src, int64_t n4)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 v = src[i];
        dst[i] = make_uint2((uint32_t)fp4rl_f32_to_bf16(v.x) | (uint32_t)fp4rl_f32_to_bf16(v.y) << 16,
                            (uint32_t)fp4rl_f32_to_bf16(v.z) | (uint32_t)fp4rl_f32_to_bf16(v.w) << 16);
    }
}

/* add_halves: the CPU's expression, (top + b) + bottom (backend/halves.h); vec (OUT % 4 == 0, every
 * pointer 16-byte aligned): four consecutive outputs of a row a thread (it is bound by the 3 x N x
 * OUT floats it moves) */
__global__ void add_halves_k(float *y, const float *ys, const float *b, int64_t N, int64_t OUT, int vec)
{
    const float *lo = ys + N * OUT;
    if (vec) {
        const int64_t O4 = OUT / 4, n4 = N * O4;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x)
            reinterpret_cast<float4 *>(y)[i] = fp4rl_halves_at4(ys, lo, b, i * 4, (i % O4) * 4);
        return;
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * OUT; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = fp4rl_halves_add(ys[i], b, i % OUT, lo[i]);
}

} // namespace

fp4rl_status fp4rl_cuda_rollout_act(fp4rl_context *ctx, uint16_t *out, unsigned long long *counts, const float *x, int64_t N,
                                    int64_t K, int fmt, int truncation_free, int resq)
{
    if (fmt < 0) return fp4rl_cuda_pack_bf16(ctx, out, K, x, N, K); /* BF16 numerics: x rounded, the packing op's kernels */
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    if (!act_qdq4_launch(s, out, counts, x, N, K, fmt, truncation_free, resq)) return fp4rl_cuda_check_launch(ctx, "rollout_act");
    const int bs = fp4rl_qdq_block_size(fmt);
    const int64_t threads = N * ((K + bs - 1) / bs) * (bs / 8);
    const unsigned grid = fp4rl_cuda_blocks(threads, 256);
    if (bs == 64) act_qdq_k<64><<<grid, 256, 0, s>>>(out, counts, x, N, K, fmt, truncation_free, resq, 0, 0, 0);
    else act_qdq_k<32><<<grid, 256, 0, s>>>(out, counts, x, N, K, fmt, truncation_free, resq, 0, 0, 0);
    return fp4rl_cuda_check_launch(ctx, "rollout_act");
}

fp4rl_status fp4rl_cuda_swiglu_act(fp4rl_context *ctx, uint16_t *out, unsigned long long *counts, const float *gu, const float *lo,
                                  const float *bias, int64_t N, int64_t inter, int fmt, int truncation_free, int resq)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st || N <= 0 || inter <= 0) return st;
    /* the four-wide kernel whatever FP4RL_ACT_QDQ4 says: there is no one-wide swiglu_act */
    const int vec = inter % 4 == 0 && (uintptr_t)gu % 16 == 0 && (uintptr_t)lo % 16 == 0 && (uintptr_t)out % 8 == 0;
    if (act4_launch(s, out, fmt >= 0 ? counts : NULL, ActSwiglu{gu, lo, bias}, N, inter, fmt < 0 ? ACT4_BF16 : fmt, truncation_free,
                    resq, vec))
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "swiglu_act: format %d or rows of %lld elements not supported", fmt, (long long)inter);
    return fp4rl_cuda_check_launch(ctx, "swiglu_act");
}

fp4rl_status fp4rl_cuda_add_halves(fp4rl_context *ctx, float *y, const float *ys, const float *b, int64_t N, int64_t OUT)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    const int vec = OUT % 4 == 0 && (uintptr_t)y % 16 == 0 && (uintptr_t)ys % 16 == 0 && (uintptr_t)b % 16 == 0;
    add_halves_k<<<ew_grid(vec ? N * OUT / 4 : N * OUT), 256, 0, s>>>(y, ys, b, N, OUT, vec);
    return fp4rl_cuda_check_launch(ctx, "add_halves");
}

fp4rl_status fp4rl_cuda_qdq_bf16(fp4rl_context *ctx, uint16_t *dst, const float *src, int64_t rows, int64_t cols, int fmt,
                                 int truncation_free, int along_rows, int stochastic, uint64_t seed, uint64_t offset)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    const int bs = fp4rl_qdq_block_size(fmt);
    if (along_rows) {
        const dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + bs - 1) / bs));
        if (grid.y > 65535) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "qdq_bf16: %lld rows are more than this kernel's grid takes", (long long)rows);
        if (bs == 64) qdq_rows_k<64><<<grid, dim3(32, 8), 0, s>>>(dst, src, rows, cols, fmt, truncation_free, stochastic, seed, offset);
        else qdq_rows_k<32><<<grid, dim3(32, 4), 0, s>>>(dst, src, rows, cols, fmt, truncation_free, stochastic, seed, offset);
        return fp4rl_cuda_check_launch(ctx, "qdq_bf16 (along rows)");
    }
    if (!stochastic && !act_qdq4_launch(s, dst, NULL, src, rows, cols, fmt, truncation_free, FP4RL_RESQ_OFF))
        return fp4rl_cuda_check_launch(ctx, "qdq_bf16");
    const int64_t threads = rows * ((cols + bs - 1) / bs) * (bs / 8);
    const unsigned grid = fp4rl_cuda_blocks(threads, 256);
    if (bs == 64) act_qdq_k<64><<<grid, 256, 0, s>>>(dst, NULL, src, rows, cols, fmt, truncation_free, FP4RL_RESQ_OFF, stochastic, seed, offset);
    else act_qdq_k<32><<<grid, 256, 0, s>>>(dst, NULL, src, rows, cols, fmt, truncation_free, FP4RL_RESQ_OFF, stochastic, seed, offset);
    return fp4rl_cuda_check_launch(ctx, "qdq_bf16");
}

fp4rl_status fp4rl_cuda_pack_bf16(fp4rl_context *ctx, uint16_t *dst, int64_t ld, const float *src, int64_t rows, int64_t cols)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    const int64_t n = rows * cols;
    if (ld == cols && n % 4 == 0 && (uintptr_t)src % 16 == 0 && (uintptr_t)dst % 8 == 0) {
        const int64_t n4 = n / 4;
        pack_bf16_x4_k<<<ew_grid(n4), 256, 0, s>>>(reinterpret_cast<uint2 *>(dst),
                                                                  reinterpret_cast<const float4 *>(src), n4);
    } else {
        pack_bf16_k<<<ew_grid(n), 256, 0, s>>>(dst, ld, src, rows, cols);
    }
    return fp4rl_cuda_check_launch(ctx, "pack_bf16");
}

/* ---- the W4A4 decode pair (decode_fp8.h) ---- */
static_assert(FP4RL_W4_MAX_ROWS == FP4RL_D8_MAX_M, "linear_forward_w4's row limit is the d8 kernel's");

namespace {
/* y += b per column: the bias after the GEMM, y = gemm + b as the CPU adds it */
__global__ void add_bias_k(float *y, const float *b, int64_t N, int64_t OUT)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * OUT; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], b[i % OUT]);
}
} // namespace

fp4rl_status fp4rl_cuda_rollout_act8(fp4rl_context *ctx, uint8_t *out, float *scales, unsigned long long *counts, const float *x,
                                     int64_t N, int64_t K, int fmt, int truncation_free, int resq)
{
    return fp4rl_cuda_act_e4m3(ctx, out, scales, x, N, K, fmt, truncation_free, resq, counts); /* FP4RL_QDQ_* is the dtype */
}

fp4rl_status fp4rl_cuda_linear_forward_w4(fp4rl_context *ctx, float *y, const uint8_t *a8, const float *sa, const fp4rl_tensor *w,
                                          const float *b, int64_t N, int64_t K, int64_t OUT)
{
    if (w->q.rows != OUT || w->q.cols != K)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "linear_forward_w4: the weight is [%lld, %lld], the layer [%lld, %lld]", (long long)w->q.rows,
                          (long long)w->q.cols, (long long)OUT, (long long)K);
    /* FP4RL_D8_SLICES=<n>: n K slices (1: the CPU's bits); unset: the kernel's own choice (split-K
     * where the weight's row blocks alone would leave the GPU idle), fixed per shape */
    const char *env = getenv("FP4RL_D8_SLICES");
    const int slices = env && *env ? atoi(env) : 0;
    fp4rl_status st = fp4rl_cuda_d8_gemm(ctx, a8, sa, N, w, y, 0, OUT, slices);
    if (st || !b) return st;
    cudaStream_t s;
    if ((st = fp4rl_cuda_op_begin(ctx, &s))) return st;
    add_bias_k<<<ew_grid(N * OUT), 256, 0, s>>>(y, b, N, OUT);
    return fp4rl_cuda_check_launch(ctx, "linear_forward_w4 (bias)");
}

/* ---- the packed-weight GEMM with BF16 activations (decode_w4b.h) ---- */
fp4rl_status fp4rl_cuda_linear_w4b_ok(fp4rl_context *ctx, const fp4rl_tensor *w)
{
    fp4rl_status st = fp4rl_cpu_ops.linear_w4b_ok(ctx, w); /* the format rules: one owner, the CPU op */
    if (st) return st;
    if (!fp4rl_cuda_w4b_ok(ctx, w))
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "linear_forward_w4b: needs a compute capability 9.0 device, a build with sm_90a code "
                                                 "and an aligned weight");
    return FP4RL_OK;
}

fp4rl_status fp4rl_cuda_linear_w4b_pack(fp4rl_context *ctx, fp4rl_tensor *w)
{
    fp4rl_status st = fp4rl_cuda_linear_w4b_ok(ctx, w);
    return st ? st : fp4rl_cuda_w4b_pack(ctx, w);
}

fp4rl_status fp4rl_cuda_linear_forward_w4b(fp4rl_context *ctx, float *y, const uint16_t *x, const fp4rl_tensor *w, const float *b, int64_t N,
                                           int64_t K, int64_t OUT)
{
    fp4rl_status st = fp4rl_cuda_linear_w4b_ok(ctx, w);
    if (st) return st;
    if (w->q.rows != OUT || w->q.cols != K)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "linear_forward_w4b: the weight is [%lld, %lld], the layer [%lld, %lld]", (long long)w->q.rows,
                          (long long)w->q.cols, (long long)OUT, (long long)K);
    return fp4rl_cuda_w4b_gemm(ctx, y, OUT, x, N, w, b, 0);
}
