/* ops_linear.c - the FP32 linear layer on OpenBLAS, and the BF16 rounding of GEMM operands.
 * The three GEMMs take separate operands (core/ops.h): the quantized training modes pass each
 * GEMM its own copy, quantized along that GEMM's contraction axis and dequantized to FP32. */
#include <string.h>

#include <cblas.h>

#include "formats.h"
#include "ops_cpu.h"

fp4rl_status fp4rl_cpu_linear_forward(fp4rl_context *ctx, float *y, const float *x, const float *w, const float *b,
                                      int64_t N, int64_t IN, int64_t OUT)
{
    (void)ctx;
    /* start y at the bias (or 0) and let the GEMM add x w^T on top (beta = 1) */
    float beta = 0.0f;
    if (b) {
        for (int64_t n = 0; n < N; n++) memcpy(y + n * OUT, b, (size_t)OUT * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)N, (blasint)OUT, (blasint)IN, 1.0f, x, (blasint)IN,
                w, (blasint)IN, beta, y, (blasint)OUT);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_linear_backward(fp4rl_context *ctx, float *dx, float *dw, float *db, const float *dy_dx,
                                       const float *w_dx, const float *dy_dw, const float *x_dw, const float *dy_db,
                                       int64_t N, int64_t IN, int64_t OUT)
{
    (void)ctx;
    /* dx [N, IN] += dy [N, OUT] . w [OUT, IN] */
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)N, (blasint)IN, (blasint)OUT, 1.0f, dy_dx,
                    (blasint)OUT, w_dx, (blasint)IN, 1.0f, dx, (blasint)IN);
    /* dw [OUT, IN] += dy^T [OUT, N] . x [N, IN] */
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)OUT, (blasint)IN, (blasint)N, 1.0f, dy_dw,
                    (blasint)OUT, x_dw, (blasint)IN, 1.0f, dw, (blasint)IN);
    if (db)
        for (int64_t n = 0; n < N; n++) {
            const float *d = dy_db + n * OUT;
            for (int64_t o = 0; o < OUT; o++) db[o] += d[o];
        }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_round_bf16(fp4rl_context *ctx, float *out, const float *x, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) out[i] = fp4rl_round_bf16(x[i]);
    return FP4RL_OK;
}
