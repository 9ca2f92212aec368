/*
 * init_math.h - the random initial weights (HF's normal(0, 0.02)), written once for the host
 * threads (core/model/model.c, core/cpu/ops_adamw.c) and the CUDA kernel (cuda/ops_optim.cu): element k of the parameter
 * buffer depends only on (seed, k), so any split into ranges, on any backend, gives the same bits.
 *
 * Weights come in pairs (j, j + 1) of a parameter from one Philox4x32-10 call at counter
 * (offset + j) / 2 and a Box-Muller transform. Its log, sin and cos are evaluated here with IEEE
 * double +, -, *, / and sqrt only (both builds forbid FMA contraction), not with the platform's
 * libm, whose last bits differ between glibc and CUDA: so the CPU and the GPU agree bit for bit.
 * Their error (below 1e-15 relative) is far under the float result's rounding.
 */
#ifndef FP4RL_INIT_MATH_H
#define FP4RL_INIT_MATH_H

#include <stdint.h>

#include "format/formats.h"

/* ln(x) for x in (0, 1]: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s), s = (m-1)/(m+1) */
FP4RL_HD double fp4rl_init_log(double x)
{
    uint64_t u;
    memcpy(&u, &x, 8);
    int e = (int)((u >> 52) & 0x7ff) - 1023; /* x is normal: (o + 1) 2^-32 >= 2^-32 */
    u = (u & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
    double m;
    memcpy(&m, &u, 8);
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e++;
    }
    const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double t = 1.0 / 25.0; /* |s| <= 0.1716: the series to s^25 is exact to double rounding */
    for (int k = 23; k >= 1; k -= 2) t = 1.0 / (double)k + s2 * t;
    return (double)e * 0.6931471805599453 + 2.0 * s * t;
}

/* cos and sin of 2 pi u for u in [0, 1): the quadrant from 4u (exact), then Taylor series on
 * [0, pi/2) to the 25th power (the next term is below 1e-17) */
FP4RL_HD void fp4rl_init_cos_sin(double u, double *c, double *s)
{
    const double q4 = 4.0 * u;
    const int q = (int)q4;
    const double a = (q4 - (double)q) * 1.5707963267948966, a2 = a * a;
    double sn = 1.0, cs = 1.0;
    for (int k = 24; k >= 2; k -= 2) {
        sn = 1.0 - a2 / (double)((k + 1) * k) * sn; /* sin a / a = 1 - a^2/(2*3) (1 - a^2/(4*5) (...)) */
        cs = 1.0 - a2 / (double)(k * (k - 1)) * cs;
    }
    sn *= a;
    const double cq[4] = {cs, -sn, -cs, sn}, sq[4] = {sn, cs, -sn, -cs};
    *c = cq[q & 3];
    *s = sq[q & 3];
}

/* Elements (k, k + 1) of the parameter buffer, k even: counter c = k / 2 of (seed, "mod"). */
FP4RL_HD void fp4rl_init_normal_pair(uint64_t seed, uint64_t k, float *a, float *b)
{
    const uint64_t c = k >> 1;
    const uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0x6d6f64u /* "mod" */, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t o[4];
    fp4rl_philox4x32_10(ctr, key, o);
    const double u1 = ((double)o[0] + 1.0) * 0x1p-32, u2 = (double)o[1] * 0x1p-32;
    const double r = sqrt(-2.0 * fp4rl_init_log(u1));
    double cs, sn;
    fp4rl_init_cos_sin(u2, &cs, &sn);
    *a = (float)(0.02 * r * cs);
    *b = (float)(0.02 * r * sn);
}

#endif
