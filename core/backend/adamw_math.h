/*
 * adamw_math.h - AdamW's arithmetic, written once for the CPU op (core/cpu/ops_adamw.c) and the
 * CUDA op (cuda/ops_optim.cu): the binary32 constants formed on the host from the double
 * hyper-parameters as PyTorch forms them, and the per-element step. Both backends run this code
 * (the CUDA files build without FMA contraction), so the update and its dry run
 * (adamw_check, which says whether an update would leave a non-finite value) agree bit for bit.
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

#endif
