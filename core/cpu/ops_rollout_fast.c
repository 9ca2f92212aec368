/*
 * ops_rollout_fast.c - the BF16-operand ops on the CPU (core/ops.h): the rollout's activation
 * operand in one pass (qdq_block.h), the linear layer forward and backward on BF16 operands
 * (widened exactly, then the FP32 layer), and BF16 packing.
 */
#include <stdlib.h>
#include <string.h>

#include "ops_cpu.h"
#include "qdq_block.h"

fp4rl_status fp4rl_cpu_rollout_act(fp4rl_context *ctx, uint16_t *out, unsigned long long *counts, const float *x,
                                   int64_t N, int64_t K, int fmt, int truncation_free, int resq)
{
    (void)ctx;
    const int two = fmt >= 0 && (resq == FP4RL_RESQ_DENSE || resq == FP4RL_RESQ_2_4);
    const int64_t ld = two ? 2 * K : K;
    if (fmt < 0) {
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) out[n * ld + k] = fp4rl_f32_to_bf16(x[n * K + k]);
        return FP4RL_OK;
    }
    const int bs = fp4rl_qdq_block_size(fmt);
    unsigned long long nz = 0, under = 0;
    float xq[64], r[64];
    for (int64_t n = 0; n < N; n++)
        for (int64_t k0 = 0; k0 < K; k0 += bs) {
            const float *xb = x + n * K + k0;
            const int len = (int)(K - k0 < bs ? K - k0 : bs);
            fp4rl_qdq_block(fmt, xb, xq, len, truncation_free);
            for (int i = 0; i < len; i++) {
                nz += xb[i] != 0.0f;
                under += xb[i] != 0.0f && xq[i] == 0.0f;
                out[n * ld + k0 + i] = fp4rl_f32_to_bf16(xq[i]);
            }
            if (!two) continue;
            for (int i = 0; i < len; i++) r[i] = xb[i] - xq[i];
            fp4rl_qdq_block(fmt, r, r, len, truncation_free);
            if (resq == FP4RL_RESQ_2_4) /* block starts are multiples of 4, so the groups are the row's */
                for (int i = 0; i < len; i += 4) fp4rl_mask_2_4_group(r + i, len - i < 4 ? len - i : 4);
            for (int i = 0; i < len; i++) out[n * ld + K + k0 + i] = fp4rl_f32_to_bf16(r[i]);
        }
    if (counts) {
        counts[0] += nz;
        counts[1] += under;
    }
    return FP4RL_OK;
}

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
