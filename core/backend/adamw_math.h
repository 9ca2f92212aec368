/*
 * adamw_math.h - AdamW's arithmetic, written once for the CPU op (core/cpu/ops_adamw.c) and the
 * CUDA op (cuda/ops_optim.cu): the binary32 constants formed on the host from the double
 * hyper-parameters as PyTorch forms them, and the per-element step. Both backends run this code
 * (the CUDA files build without FMA contraction), so the update and its dry run
 * (adamw_check, which says whether an update would leave a non-finite value) agree bit for bit;
 * so do the BF16-moment variants (adamw_update_bf16 / adamw_check_bf16), stochastic rounding
 * included.
 */
#ifndef FP4RL_ADAMW_MATH_H
#define FP4RL_ADAMW_MATH_H

#include <math.h>
#include <stdint.h>

#include "format/formats.h"

typedef struct fp4rl_adamw_k {
    float decay, step_size, bc2_sqrt, one_m_b1, b2, one_m_b2, eps;
} fp4rl_adamw_k;

/* The constants of step t >= 1 (host code). */
static inline fp4rl_adamw_k fp4rl_adamw_constants(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t)
{
    const double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
    fp4rl_adamw_k k;
    k.decay = (float)(1.0 - lr * weight_decay);
    k.step_size = (float)(lr / bc1);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.one_m_b1 = (float)(1.0 - beta1);
    k.b2 = (float)beta2;
    k.one_m_b2 = (float)(1.0 - beta2);
    k.eps = (float)eps;
    return k;
}

/* One element: p, m, v updated from g (decoupled decay never enters m or v; m in PyTorch's lerp
 * form of b1 m + (1 - b1) g). */
FP4RL_HD void fp4rl_adamw_elem(const fp4rl_adamw_k *k, float g, float *p, float *m, float *v)
{
    const float pi = *p * k->decay;
    const float mi = *m + k->one_m_b1 * (g - *m);
    const float vi = *v * k->b2 + k->one_m_b2 * g * g;
    const float denom = sqrtf(vi) / k->bc2_sqrt + k->eps;
    *p = pi - k->step_size * (mi / denom);
    *m = mi;
    *v = vi;
}

/* 1 when the step would leave p, m or v non-finite at this element. */
FP4RL_HD int fp4rl_adamw_elem_bad(const fp4rl_adamw_k *k, float g, float p, float m, float v)
{
    fp4rl_adamw_elem(k, g, &p, &m, &v);
    return !fp4rl_is_finite(p) || !fp4rl_is_finite(m) || !fp4rl_is_finite(v);
}

/* ---- BF16 moments (FP4RL_MP_OPTIMIZER_MOMENTS = 1) ----
 * m and v are stored as BF16 bits; each step widens them to FP32 (exact), runs fp4rl_adamw_elem
 * unchanged (the parameter's update reads the FP32 m and v of this step) and stores m and v back
 * rounded to BF16 STOCHASTICALLY (fp4rl_f32_to_bf16_sr). Nearest rounding would not do: BF16
 * keeps 8 significant bits, so a value changed by less than half its ulp (a relative 2^-9 to
 * 2^-8, depending on where it lies in its binade) rounds back to itself. v = b2 v + (1 - b2) g^2
 * with b2 = 0.999 moves by 0.001 (g^2 - v): under a steady gradient it stops moving once g^2 / v
 * falls below about 3 to 5, v stalls at a fraction of g^2 (and m, with 1 - b1 = 0.1, stalls when
 * g is within 2-4% of m). Stochastic rounding is unbiased, so the stored moments follow the FP32
 * EMA in expectation.
 * The uniforms are counter-based, so the CPU and CUDA ops round to the same bits: element i of a
 * step takes fp4rl_sr_uniform(seed, offset, 2 i) for m and (seed, offset, 2 i + 1) for v; the
 * model passes FP4RL_ADAMW_SR_SEED and FP4RL_ADAMW_SR_OFFSET(t) of AdamW step t, a function of
 * the step alone: the same on every rank of a data-parallel run whatever the contexts' seeds,
 * and disjoint from the quantizers' offsets (the context's counter, which counts up from 0). */
#define FP4RL_ADAMW_SR_SEED 0x6164616d77763136ull /* "adamwv16" */
#define FP4RL_ADAMW_SR_OFFSET(t) (0xada0000000000000ull ^ (uint64_t)(t))

FP4RL_HD void fp4rl_adamw_elem_bf16(const fp4rl_adamw_k *k, float g, float *p, uint16_t *m, uint16_t *v, uint64_t seed,
                                    uint64_t offset, uint64_t i)
{
    float mi = fp4rl_bf16_to_f32(*m), vi = fp4rl_bf16_to_f32(*v);
    fp4rl_adamw_elem(k, g, p, &mi, &vi);
    *m = fp4rl_f32_to_bf16_sr(mi, fp4rl_sr_uniform(seed, offset, 2 * i));
    *v = fp4rl_f32_to_bf16_sr(vi, fp4rl_sr_uniform(seed, offset, 2 * i + 1));
}

/* 1 when the BF16-moment step would leave p, or m or v after their rounding, non-finite. */
FP4RL_HD int fp4rl_adamw_elem_bf16_bad(const fp4rl_adamw_k *k, float g, float p, uint16_t m, uint16_t v, uint64_t seed,
                                       uint64_t offset, uint64_t i)
{
    fp4rl_adamw_elem_bf16(k, g, &p, &m, &v, seed, offset, i);
    return !fp4rl_is_finite(p) || !fp4rl_is_finite(fp4rl_bf16_to_f32(m)) || !fp4rl_is_finite(fp4rl_bf16_to_f32(v));
}

#endif
