/*
 * halves.h - the sum of a Rollout-ResQ GEMM's two halves, written once for the CPU ops
 * (core/cpu/ops_rollout_fast.c, ops_swiglu.c, ops_rope.c) and the CUDA kernels
 * (cuda/ops_rollout_fast.cu, ops_elementwise.cu). The fused path's GEMM of 2N rows gives top
 * (Q(x) w^T) and lo (S(Q(R)) w^T); a value is (top + b) + lo, the generic path's order (its first
 * GEMM adds the bias, then residual_forward adds the second). add_halves writes these sums, and
 * swiglu_rows and qkv_rope_store can read them straight from the halves: each computes its inputs
 * with this one expression, so the bits are add_halves' followed by the op's.
 */
#ifndef FP4RL_BACKEND_HALVES_H
#define FP4RL_BACKEND_HALVES_H

#include <stdint.h>

#include "format/traits.h"

/* top + b[c], or top when b is NULL: the top half with its bias. */
FP4RL_HD float fp4rl_halves_top(float top, const float *b, int64_t c) { return b ? top + b[c] : top; }

/* (top + b[c]) + lo: one sum of the two halves (add_halves' value). */
FP4RL_HD float fp4rl_halves_add(float top, const float *b, int64_t c, float lo) { return fp4rl_halves_top(top, b, c) + lo; }

/* Element i (column c) of an op's input read from its halves: (top[i] + b[c]) + lo[i], a term
 * absent when its pointer is NULL (top[i] alone when both are). */
FP4RL_HD float fp4rl_halves_at(const float *top, const float *lo, const float *b, int64_t i, int64_t c)
{
    const float t = fp4rl_halves_top(top[i], b, c);
    return lo ? t + lo[i] : t;
}

#ifdef __CUDACC__
/* fp4rl_halves_at of elements i .. i + 3 (columns c .. c + 3) in 16-byte loads of top and lo: i a
 * multiple of 4, top and lo 16-byte aligned (b read by element, as the scalar form reads it). */
__device__ __forceinline__ float4 fp4rl_halves_at4(const float *top, const float *lo, const float *b, int64_t i, int64_t c)
{
    const float4 t = *reinterpret_cast<const float4 *>(top + i);
    if (!lo)
        return make_float4(fp4rl_halves_top(t.x, b, c), fp4rl_halves_top(t.y, b, c + 1), fp4rl_halves_top(t.z, b, c + 2),
                           fp4rl_halves_top(t.w, b, c + 3));
    const float4 l = *reinterpret_cast<const float4 *>(lo + i);
    return make_float4(fp4rl_halves_add(t.x, b, c, l.x), fp4rl_halves_add(t.y, b, c + 1, l.y), fp4rl_halves_add(t.z, b, c + 2, l.z),
                       fp4rl_halves_add(t.w, b, c + 3, l.w));
}
#endif

#endif
