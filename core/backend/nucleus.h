/*
 * nucleus.h - the pieces of top-p (nucleus) truncation that the CPU reference and the GPU kernels
 * share literally (FP4RL_HD): the order key of a float and the tie count at the threshold. The
 * rule itself is in core/backend/ops.h (sample_rows); the loops that sum masses live in the
 * backends (core/cpu/ops_rollout.c, cuda/ops_rollout.cu).
 */
#ifndef FP4RL_NUCLEUS_H
#define FP4RL_NUCLEUS_H

#include <math.h>
#include <stdint.h>

#include "format/formats.h"

/* An unsigned key with the order of the floats (-0 just below +0; no NaN expected). */
FP4RL_HD uint32_t fp4rl_nucleus_key(float f)
{
    const uint32_t u = fp4rl_f32_bits(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Whether truncation is on: 0 < top_p < 1 (0, an unset value, and 1 are off). */
FP4RL_HD int fp4rl_nucleus_on(double top_p) { return top_p > 0 && top_p < 1; }

/* The next bisection probe on [lo, hi] (lo < hi): the upper middle, so the search ends. */
FP4RL_HD uint32_t fp4rl_nucleus_mid(uint32_t lo, uint32_t hi) { return (uint32_t)(lo + ((uint64_t)hi - lo + 1) / 2); }

/* How many of the cnt tokens tied at the threshold key (each of mass e_k > 0) the nucleus takes,
 * the first ones by id: the least n >= 1 with m_gt + n e_k >= target (m_gt: the mass above the
 * key), at most cnt. */
FP4RL_HD int64_t fp4rl_nucleus_ties(double m_gt, double e_k, double target, int64_t cnt)
{
    if (!(e_k > 0)) return cnt;
    const double need = (target - m_gt) / e_k;
    int64_t n = need <= 1 ? 1 : need >= (double)cnt ? cnt : (int64_t)ceil(need);
    while (n > 1 && m_gt + (double)(n - 1) * e_k >= target) n--;
    while (n < cnt && m_gt + (double)n * e_k < target) n++;
    return n;
}

#endif
