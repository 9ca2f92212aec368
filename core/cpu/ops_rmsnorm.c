/* ops_rmsnorm.c - RMSNorm (Qwen2RMSNorm): out = (x * rstd) * weight, rstd = 1/sqrt(mean(x^2) + eps).
 * Row reductions accumulate in double: this backend is the reference the others are held to. */
#include <math.h>

#include "cpu/ops_cpu.h"

fp4rl_status fp4rl_cpu_rmsnorm_forward(fp4rl_context *ctx, float *out, float *rstd, const float *x, const float *weight,
                                       int64_t N, int64_t C, float eps)
{
    (void)ctx;
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        float *o = out + n * C;
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        for (int64_t c = 0; c < C; c++) o[c] = (xr[c] * r) * weight[c];
        rstd[n] = r;
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_rmsnorm_backward(fp4rl_context *ctx, float *dx, float *dweight, const float *dout,
                                        const float *x, const float *weight, const float *rstd, int64_t N, int64_t C)
{
    (void)ctx;
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C, *d = dout + n * C;
        float *dxr = dx + n * C;
        float r = rstd[n];
        /* with xhat = x * rstd and g = dout * weight: dx = rstd * (g - xhat * mean(g * xhat)),
         * the second term being the gradient through rstd */
        double gx = 0.0;
        for (int64_t c = 0; c < C; c++) gx += (double)(d[c] * weight[c]) * (xr[c] * r);
        float mean_gx = (float)(gx / (double)C);
        for (int64_t c = 0; c < C; c++) {
            float xhat = xr[c] * r;
            dxr[c] += r * (d[c] * weight[c] - xhat * mean_gx);
            if (dweight) dweight[c] += d[c] * xhat;
        }
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_residual_rmsnorm(fp4rl_context *ctx, float *sum, float *out, float *rstd, const float *a, const float *b,
                                        const float *weight, int64_t N, int64_t C, float eps)
{
    fp4rl_status st = fp4rl_cpu_residual_forward(ctx, sum, a, b, N * C);
    return st ? st : fp4rl_cpu_rmsnorm_forward(ctx, out, rstd, sum, weight, N, C, eps);
}
