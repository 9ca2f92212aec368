/* ops_linear.c - the FP32 linear layer on OpenBLAS, its BF16-operand forms, and the BF16 rounding
 * and packing of GEMM operands.
 * The three GEMMs take separate operands (core/backend/ops.h): the quantized training modes pass each
 * GEMM its own copy, quantized along that GEMM's contraction axis and dequantized to FP32. */
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "format/formats.h"
#include "cpu/ops_cpu.h"

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

/* ---- BF16 operands (bit patterns of exactly representable values): widened, then the FP32 layer ---- */
/* exact widening of n BF16 values into a new array (NULL: out of memory) */
static float *widen(const uint16_t *x, int64_t n)
{
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (f)
        for (int64_t i = 0; i < n; i++) f[i] = fp4rl_bf16_to_f32(x[i]);
    return f;
}

fp4rl_status fp4rl_cpu_linear_forward_bf16(fp4rl_context *ctx, float *y, const uint16_t *x, const uint16_t *w,
                                           const float *b, int64_t N, int64_t IN, int64_t OUT)
{
    /* widen (exactly) and run the FP32 layer: the products are exact in FP32 either way */
    float *xf = widen(x, N * IN), *wf = widen(w, OUT * IN);
    fp4rl_status st = xf && wf ? fp4rl_cpu_linear_forward(ctx, y, xf, wf, b, N, IN, OUT)
                               : fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "linear_forward_bf16: out of memory");
    free(xf);
    free(wf);
    return st;
}

fp4rl_status fp4rl_cpu_linear_backward_bf16(fp4rl_context *ctx, float *dx, float *dw, float *db, const uint16_t *dy_dx,
                                            const uint16_t *w_dx, const uint16_t *dy_dw, const uint16_t *x_dw,
                                            const float *dy_db, int64_t N, int64_t IN, int64_t OUT)
{
    float *a = dx ? widen(dy_dx, N * OUT) : NULL, *b = dx ? widen(w_dx, OUT * IN) : NULL;
    float *c = dw ? widen(dy_dw, N * OUT) : NULL, *d = dw ? widen(x_dw, N * IN) : NULL;
    fp4rl_status st = FP4RL_OK;
    if ((dx && (!a || !b)) || (dw && (!c || !d))) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "linear_backward_bf16: out of memory");
    if (!st) st = fp4rl_cpu_linear_backward(ctx, dx, dw, db, a, b, c, d, dy_db, N, IN, OUT);
    free(a);
    free(b);
    free(c);
    free(d);
    return st;
}

fp4rl_status fp4rl_cpu_pack_bf16(fp4rl_context *ctx, uint16_t *dst, int64_t ld, const float *src, int64_t rows,
                                 int64_t cols)
{
    (void)ctx;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * ld + c] = fp4rl_f32_to_bf16(src[r * cols + c]);
    return FP4RL_OK;
}
