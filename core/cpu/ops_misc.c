/* ops_misc.c - the residual add: a sum forward, the same gradient to both branches backward. */
#include <string.h>

#include "cpu/ops_cpu.h"

fp4rl_status fp4rl_cpu_residual_forward(fp4rl_context *ctx, float *out, const float *a, const float *b, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_copy(fp4rl_context *ctx, float *dst, const float *src, int64_t n)
{
    (void)ctx;
    memmove(dst, src, (size_t)n * sizeof(float));
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_sub(fp4rl_context *ctx, float *out, const float *a, const float *b, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) out[i] = a[i] - b[i];
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_residual_backward(fp4rl_context *ctx, float *da, float *db, const float *dout, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
    return FP4RL_OK;
}
