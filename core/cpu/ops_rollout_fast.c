/*
 * ops_rollout_fast.c - the rollout's fused activation operand on the CPU (core/backend/ops.h): one pass of
 * qdq_block.h (the CUDA kernel's arithmetic) per block, ResQ's residual and 2:4 mask, BF16 words.
 * The BF16 linear layer it feeds lives in ops_linear.c. The W4A4 decode path's pair, rollout_act8 and
 * linear_forward_w4, is here too: the reference of the CUDA d8 kernels (cuda/decode_fp8.h), bit for bit
 * (this file builds with -ffp-contract=off, so the promotion's three roundings stay three).
 */
#include <stdlib.h>
#include <string.h>

#include "backend/halves.h"
#include "cpu/ops_cpu.h"
#include "format/layout.h"
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

/* swiglu_rows into a row block's h, then rollout_act of it (the GPU fuses the two; the definition is
 * this composition). Row blocks of at most 64 rows keep h small; rollout_act's ResQ rows go to
 * out's second half, so each block writes its Q(h) rows and its residual rows where the whole call
 * would. */
fp4rl_status fp4rl_cpu_swiglu_act(fp4rl_context *ctx, uint16_t *out, unsigned long long *counts, const float *gu, const float *lo,
                                  const float *bias, int64_t N, int64_t inter, int fmt, int truncation_free, int resq)
{
    const int two = fmt >= 0 && (resq == FP4RL_RESQ_DENSE || resq == FP4RL_RESQ_2_4);
    const int64_t RB = 64;
    float *h = malloc((size_t)(N < RB ? N : RB) * (size_t)inter * sizeof(float) + 1);
    uint16_t *ob = two ? malloc((size_t)(2 * (N < RB ? N : RB)) * (size_t)inter * sizeof(uint16_t) + 1) : NULL;
    fp4rl_status st = !h || (two && !ob) ? fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "swiglu_act: out of host memory") : FP4RL_OK;
    for (int64_t n0 = 0; !st && n0 < N; n0 += RB) {
        const int64_t nb = N - n0 < RB ? N - n0 : RB, g = n0 * 2 * inter;
        st = fp4rl_cpu_swiglu_rows(ctx, h, gu + g, lo ? lo + g : NULL, bias, nb, inter);
        if (!st) st = fp4rl_cpu_rollout_act(ctx, two ? ob : out + n0 * inter, counts, h, nb, inter, fmt, truncation_free, resq);
        if (!st && two) { /* the block's [2 nb, inter] to rows n0 .. and N + n0 .. of out */
            memcpy(out + n0 * inter, ob, (size_t)(nb * inter) * sizeof(uint16_t));
            memcpy(out + (N + n0) * inter, ob + nb * inter, (size_t)(nb * inter) * sizeof(uint16_t));
        }
    }
    free(h);
    free(ob);
    return st;
}

/* rollout_act row by row and unit by unit through fp4rl_qdq_block_e4m3 (the same element steps as
 * fp4rl_qdq_block), zero-padded to whole units, written as the FP8 operand. */
fp4rl_status fp4rl_cpu_rollout_act8(fp4rl_context *ctx, uint8_t *out, float *scales, unsigned long long *counts, const float *x,
                                    int64_t N, int64_t K, int fmt, int truncation_free, int resq)
{
    (void)ctx;
    if (fmt != FP4RL_QDQ_HIF4 && fmt != FP4RL_QDQ_MXFP4)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "rollout_act8: format %d is not HiF4 or MXFP4", fmt);
    if (resq != FP4RL_RESQ_OFF && resq != FP4RL_RESQ_DENSE && resq != FP4RL_RESQ_2_4)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "rollout_act8: ResQ mode %d (only off, dense, 2:4)", resq);
    const int U = fp4rl_qdq_block_size(fmt), two = resq != FP4RL_RESQ_OFF;
    const int64_t Kp = (K + U - 1) / U * U, rows = (two ? 2 : 1) * N, ld = FP4RL_FP8_SCALE_LD(rows);
    unsigned long long nz = 0, under = 0;
    float xb[64], y[64], r[64];
    for (int64_t u = 0; u < Kp / U; u++) /* the layout's padding rows */
        for (int64_t n = rows; n < ld; n++) scales[u * ld + n] = 0.0f;
    for (int64_t n = 0; n < N; n++)
        for (int64_t u = 0; u < Kp / U; u++) {
            const int64_t k0 = u * U;
            const int len = (int)(K - k0 < U ? K - k0 : U);
            for (int i = 0; i < U; i++) xb[i] = i < len ? x[n * K + k0 + i] : 0.0f;
            uint8_t *e = out + n * Kp + k0;
            scales[u * ld + n] = fp4rl_qdq_block_e4m3(fmt, xb, y, e, U, truncation_free);
            for (int i = 0; i < len; i++) {
                nz += xb[i] != 0.0f;
                under += xb[i] != 0.0f && y[i] == 0.0f;
            }
            if (!two) continue;
            for (int i = 0; i < U; i++) r[i] = xb[i] - y[i]; /* 0 in the padding */
            uint8_t *er = out + (N + n) * Kp + k0;
            scales[u * ld + N + n] = fp4rl_qdq_block_e4m3(fmt, r, y, er, U, truncation_free);
            if (resq == FP4RL_RESQ_2_4) /* rollout_act's mask on the dequantized residual; zeros pad a short tail group */
                for (int i = 0; i < U; i += 4) {
                    float g[4] = {y[i], y[i + 1], y[i + 2], y[i + 3]};
                    fp4rl_mask_2_4_group(g, 4);
                    for (int j = 0; j < 4; j++)
                        if (fp4rl_f32_bits(g[j]) != fp4rl_f32_bits(y[i + j])) er[i + j] = 0; /* dropped (the mask writes +0; a -0 too): byte 0, the unit keeps its scale */
                }
        }
    if (counts) {
        counts[0] += nz;
        counts[1] += under;
    }
    return FP4RL_OK;
}

/* One unit of weight row o as the E4M3 operand's values (the pre-pass's, cuda/gemm_fp8.cu: HiF4 +-k
 * 2^inc, MXFP4 2 e2m1(k), small integers) into v[0..U) and its scale (base / 4, 2^e / 2; NaN for a
 * NaN unit). */
static float w4_unit(const fp4rl_tensor *w, int64_t o, int64_t u, int U, float *v)
{
    const uint8_t *codes = w->data;
    const int64_t rb = w->q.row_bytes, k0 = u * U;
    if (w->dtype == FP4RL_DTYPE_HIF4) {
        const uint32_t word = ((const uint32_t *)w->scales)[fp4rl_hif4_word_index(w->q.scale_cols, o, k0)];
        for (int j = 0; j < U; j++) {
            const uint8_t code = fp4rl_code_get(codes, rb, 4, o, k0 + j);
            const float m = (float)(code & 7u) * (float)(1 << fp4rl_hif4_word_inc(word, j));
            v[j] = (code & 8u) ? -m : m;
        }
        return fp4rl_hif4_word_base_bits(word) == FP4RL_HIF4_NAN_WORD ? fp4rl_bits_f32(0x7fc00000u) : fp4rl_hif4_word_base(word) * 0.25f;
    }
    const uint8_t s = ((const uint8_t *)w->scales)[fp4rl_scale_index(w->q.tile, U, w->q.scale_cols, o, k0)];
    for (int j = 0; j < U; j++) v[j] = 2.0f * fp4rl_e2m1_decode(fp4rl_code_get(codes, rb, 4, o, k0 + j));
    return fp4rl_e8m0_decode(s) * 0.5f; /* NaN for the NaN scale byte */
}

fp4rl_status fp4rl_cpu_linear_forward_w4(fp4rl_context *ctx, float *y, const uint8_t *a8, const float *sa, const fp4rl_tensor *w,
                                         const float *b, int64_t N, int64_t K, int64_t OUT)
{
    (void)ctx;
    const int U = w->dtype == FP4RL_DTYPE_HIF4 ? 64 : w->dtype == FP4RL_DTYPE_MXFP4 && (w->q.tile == 0 || w->q.tile == 32) ? 32 : 0;
    if (!U || w->ndim != 2)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "linear_forward_w4: the weight must be 2D HiF4, or MXFP4 1D or in 32 x 32 tiles");
    if (w->q.rows != OUT || w->q.cols != K)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "linear_forward_w4: the weight is [%lld, %lld], the layer [%lld, %lld]", (long long)w->q.rows,
                          (long long)w->q.cols, (long long)OUT, (long long)K);
    if (K % U || N < 1 || N > FP4RL_W4_MAX_ROWS)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "linear_forward_w4: K = %lld must be a multiple of %d and N = %lld within 1..%d",
                          (long long)K, U, (long long)N, FP4RL_W4_MAX_ROWS);
    float e4[256], wv[64], acc[FP4RL_W4_MAX_ROWS];
    for (int i = 0; i < 256; i++) e4[i] = fp4rl_e4m3_decode((uint8_t)i);
    const int64_t lda = FP4RL_FP8_SCALE_LD(N);
    for (int64_t o = 0; o < OUT; o++) {
        for (int64_t n = 0; n < N; n++) acc[n] = 0.0f;
        for (int64_t u = 0; u < K / U; u++) {
            const float sw = w4_unit(w, o, u, U, wv);
            for (int64_t n = 0; n < N; n++) {
                const uint8_t *pa = a8 + n * K + u * U;
                float p = 0.0f; /* integers below 2^16: exact in any order */
                for (int j = 0; j < U; j++) p += e4[pa[j]] * wv[j];
                acc[n] = acc[n] + p * (sa[u * lda + n] * sw);
            }
        }
        for (int64_t n = 0; n < N; n++) y[n * OUT + o] = b ? acc[n] + b[o] : acc[n];
    }
    return FP4RL_OK;
}

/* The formats linear_forward_w4b takes (its CUDA kernel's too): HiF4 any tile (one word per 64 of a
 * row), MXFP4 1D or 32 x 32 tiles; 2D; K a positive multiple of 64. */
fp4rl_status fp4rl_cpu_linear_w4b_ok(fp4rl_context *ctx, const fp4rl_tensor *w)
{
    (void)ctx;
    if (!w || w->ndim != 2 || (w->dtype != FP4RL_DTYPE_HIF4 && !(w->dtype == FP4RL_DTYPE_MXFP4 && (w->q.tile == 0 || w->q.tile == 32))))
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "linear_forward_w4b: the weight must be 2D HiF4, or MXFP4 1D or in 32 x 32 tiles");
    if (w->q.cols < 64 || w->q.cols % 64)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "linear_forward_w4b: K = %lld is not a positive multiple of 64", (long long)w->q.cols);
    return FP4RL_OK;
}

/* The CPU reads the weight as stored: nothing to re-lay out. */
fp4rl_status fp4rl_cpu_linear_w4b_pack(fp4rl_context *ctx, fp4rl_tensor *w) { return fp4rl_cpu_linear_w4b_ok(ctx, w); }

/* The composition the contract names: the weight dequantized to BF16 (exact), then the BF16 GEMM. */
fp4rl_status fp4rl_cpu_linear_forward_w4b(fp4rl_context *ctx, float *y, const uint16_t *x, const fp4rl_tensor *w, const float *b, int64_t N,
                                          int64_t K, int64_t OUT)
{
    fp4rl_status st = fp4rl_cpu_linear_w4b_ok(ctx, w);
    if (st) return st;
    if (w->layout) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "linear_forward_w4b: the weight was re-laid out for another backend");
    if (w->q.rows != OUT || w->q.cols != K)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "linear_forward_w4b: the weight is [%lld, %lld], the layer [%lld, %lld]", (long long)w->q.rows,
                          (long long)w->q.cols, (long long)OUT, (long long)K);
    fp4rl_tensor *wb = NULL;
    st = fp4rl_dequantize(&wb, ctx, w, FP4RL_DTYPE_BF16);
    if (!st) st = fp4rl_cpu_linear_forward_bf16(ctx, y, x, (const uint16_t *)wb->data, b, N, K, OUT);
    fp4rl_tensor_destroy(wb);
    return st;
}
