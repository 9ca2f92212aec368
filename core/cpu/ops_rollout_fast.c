/*
 * ops_rollout_fast.c - the rollout's fused activation operand on the CPU (core/backend/ops.h): one pass of
 * qdq_block.h (the CUDA kernel's arithmetic) per block, ResQ's residual and 2:4 mask, BF16 words.
 * The BF16 linear layer it feeds lives in ops_linear.c.
 */
#include "backend/halves.h"
#include "cpu/ops_cpu.h"
#include "format/qdq_block.h"

fp4rl_status fp4rl_cpu_rollout_act(fp4rl_context *ctx, uint16_t *out, unsigned long long *counts, const float *x,
                                   int64_t N, int64_t K, int fmt, int truncation_free, int resq)
{
    (void)ctx;
    const int two = fmt >= 0 && (resq == FP4RL_RESQ_DENSE || resq == FP4RL_RESQ_2_4);
    const int64_t ld = K; /* the residual's rows follow the N rows of xq */
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
            for (int i = 0; i < len; i++) out[(N + n) * ld + k0 + i] = fp4rl_f32_to_bf16(r[i]);
        }
    if (counts) {
        counts[0] += nz;
        counts[1] += under;
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_qdq_bf16(fp4rl_context *ctx, uint16_t *dst, const float *src, int64_t rows, int64_t cols, int fmt,
                                int truncation_free, int along_rows, int stochastic, uint64_t seed, uint64_t offset)
{
    (void)ctx;
    const int bs = fp4rl_qdq_block_size(fmt);
    /* a line is a row (blocks along the last dim) or a column (along the rows); the element at
     * position k of line l sits at src[l * ls + k * ks] and has index l * len + k of the tensor
     * the blocks run along (the transposed one along the rows) */
    const int64_t lines = along_rows ? cols : rows, len = along_rows ? rows : cols;
    const int64_t ls = along_rows ? 1 : cols, ks = along_rows ? cols : 1;
    float x[64], u[64];
    for (int64_t l = 0; l < lines; l++)
        for (int64_t k0 = 0; k0 < len; k0 += bs) {
            const int n = (int)(len - k0 < bs ? len - k0 : bs);
            for (int i = 0; i < n; i++) {
                x[i] = src[l * ls + (k0 + i) * ks];
                if (stochastic) u[i] = fp4rl_sr_uniform(seed, offset, (uint64_t)(l * len + k0 + i));
            }
            fp4rl_qdq_block_u(fmt, x, x, n, truncation_free, stochastic ? u : NULL);
            for (int i = 0; i < n; i++) dst[l * ls + (k0 + i) * ks] = fp4rl_f32_to_bf16(x[i]);
        }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_add_halves(fp4rl_context *ctx, float *y, const float *ys, const float *b, int64_t N, int64_t OUT)
{
    (void)ctx;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OUT; o++) y[n * OUT + o] = fp4rl_halves_add(ys[n * OUT + o], b, o, ys[(N + n) * OUT + o]);
    return FP4RL_OK;
}
