/*
 * qdq_block.h - dequantize(quantize(x)) of one 1D block with round-to-nearest, as the value a
 * dense GEMM consumes: the fused rollout activation op (CPU core/cpu/ops_rollout_fast.c, CUDA
 * cuda/ops_rollout_fast.cu) calls this one function, so both backends agree bit for bit, and the
 * tests hold it to the generic fp4rl_quantize + fp4rl_dequantize path.
 *
 * The block loops mirror the CPU reference quantizer (core/cpu/cpu_quant.c): amax over the finite
 * elements, a non-finite element makes the whole block NaN, padding elements are zeros. Every
 * per-element and per-scale step is a formats.h function.
 */
#ifndef FP4RL_QDQ_BLOCK_H
#define FP4RL_QDQ_BLOCK_H

#include "format/formats.h"

/* The block formats the round trip covers: the formats that need no tensor-wide statistic
 * (NVFP4's g does, so it is not here), named by their fp4rl_dtype. */
enum { FP4RL_QDQ_MXFP4 = FP4RL_DTYPE_MXFP4, FP4RL_QDQ_MXFP8 = FP4RL_DTYPE_MXFP8_E4M3, FP4RL_QDQ_HIF4 = FP4RL_DTYPE_HIF4 };

/* Elements per block of a round-trip format. */
FP4RL_HD int fp4rl_qdq_block_size(int fmt) { return fp4rl_format_of((fp4rl_dtype)fmt).block; }

/* max |x[i]| over the finite x[i], i in [i0, i1); *finite = 0 when some element is not finite */
FP4RL_HD float fp4rl_qdq_amax(const float *x, int i0, int i1, int *finite)
{
    float a = 0.0f;
    for (int i = i0; i < i1; i++) {
        if (!fp4rl_is_finite(x[i])) *finite = 0;
        else if (fabsf(x[i]) > a) a = fabsf(x[i]);
    }
    return a;
}

/* The HiF4 scale word of the finite block x[0..n) with max |x| amax (and its base in *b): the
 * base from amax, an e8 bit per 8 elements, an e16 bit per 4 (the padding past n is zeros). */
FP4RL_HD uint32_t fp4rl_qdq_hif4_word(const float *x, int n, float amax, fp4rl_hif4_base *b)
{
    int finite = 1;
    *b = fp4rl_hif4_make_base(amax);
    uint32_t word = b->e6m2;
    for (int h = 0; h < 8; h++) {
        const int i0 = 8 * h < n ? 8 * h : n, i1 = 8 * h + 8 < n ? 8 * h + 8 : n;
        word |= fp4rl_hif4_e8_at(fp4rl_hif4_e8(fp4rl_qdq_amax(x, i0, i1, &finite), b->rec), h);
    }
    for (int g = 0; g < 16; g++) {
        const int i0 = 4 * g < n ? 4 * g : n, i1 = 4 * g + 4 < n ? 4 * g + 4 : n;
        word |= fp4rl_hif4_e16_at(fp4rl_hif4_e16(fp4rl_qdq_amax(x, i0, i1, &finite), fp4rl_hif4_word_e8(word, g / 2), b->rec), g);
    }
    return word;
}

/* y[0..n) = dequantize(quantize(x[0..n))) for one block; n <= fp4rl_qdq_block_size(fmt) (the rest
 * of the block is zero padding, which changes no scale). x and y may be the same array. u: the
 * stochastic-rounding uniforms of the n elements (fp4rl_sr_uniform), or NULL for nearest. */
FP4RL_HD void fp4rl_qdq_block_u(int fmt, const float *x, float *y, int n, int truncation_free, const float *u)
{
    int finite = 1;
    const float amax = fp4rl_qdq_amax(x, 0, n, &finite);
    if (!finite) {
        for (int i = 0; i < n; i++) y[i] = fp4rl_bits_f32(0x7fc00000u);
        return;
    }
    if (fmt != FP4RL_QDQ_HIF4) {
        const int fp8 = fmt == FP4RL_QDQ_MXFP8;
        const uint8_t s = fp4rl_mx_block_scale(amax, (fp4rl_dtype)fmt, truncation_free);
        for (int i = 0; i < n; i++) y[i] = fp4rl_mx_decode(fp4rl_mx_encode(x[i], fp4rl_e8m0_exp(s), fp8, u ? u[i] : -1.0f), s, fp8);
        return;
    }
    fp4rl_hif4_base b;
    const uint32_t word = fp4rl_qdq_hif4_word(x, n, amax, &b);
    for (int i = 0; i < n; i++)
        y[i] = fp4rl_hif4_decode(fp4rl_hif4_encode(x[i], fp4rl_hif4_word_inc(word, i), b.rec, u ? u[i] : -1.0f), word, i);
}

/* fp4rl_qdq_block_u with round-to-nearest */
FP4RL_HD void fp4rl_qdq_block(int fmt, const float *x, float *y, int n, int truncation_free)
{
    fp4rl_qdq_block_u(fmt, x, y, n, truncation_free, NULL);
}

/* The block as an FP8-GEMM operand (format/layout.h's FP4RL_FP8_SCALE_LD; fmt HiF4 or MXFP4, nearest):
 * returns the unit scale (HiF4: base / 4; MXFP4: 2^e / 2) and writes the E4M3 bytes e[0..n) of the
 * small integers value / scale (HiF4: +-k 2^inc, MXFP4: 2 e2m1(k); exact in E4M3) and y[0..n), the
 * values fp4rl_qdq_block gives (= e4m3(e[i]) * scale). A non-finite element makes the block NaN:
 * bytes 0, y NaN, scale the NaN 0x7fc00000 (the pre-pass's bytes and scale of a NaN unit). */
FP4RL_HD float fp4rl_qdq_block_e4m3(int fmt, const float *x, float *y, uint8_t *e, int n, int truncation_free)
{
    int finite = 1;
    const float amax = fp4rl_qdq_amax(x, 0, n, &finite), qnan = fp4rl_bits_f32(0x7fc00000u);
    if (!finite) {
        for (int i = 0; i < n; i++) y[i] = qnan, e[i] = 0;
        return qnan;
    }
    if (fmt != FP4RL_QDQ_HIF4) {
        const uint8_t s = fp4rl_mx_block_scale(amax, FP4RL_DTYPE_MXFP4, truncation_free);
        for (int i = 0; i < n; i++) {
            const uint8_t code = fp4rl_mx_encode(x[i], fp4rl_e8m0_exp(s), 0, -1.0f);
            y[i] = fp4rl_mx_decode(code, s, 0);
            e[i] = fp4rl_e4m3_encode(2.0f * fp4rl_e2m1_decode(code), -1.0f);
        }
        return fp4rl_e8m0_decode(s) * 0.5f;
    }
    fp4rl_hif4_base b;
    const uint32_t word = fp4rl_qdq_hif4_word(x, n, amax, &b);
    for (int i = 0; i < n; i++) {
        const int inc = fp4rl_hif4_word_inc(word, i);
        const uint8_t code = fp4rl_hif4_encode(x[i], inc, b.rec, -1.0f);
        const float m = (float)(code & 7u) * (float)(1 << inc);
        y[i] = fp4rl_hif4_decode(code, word, i);
        e[i] = fp4rl_e4m3_encode((code & 8u) ? -m : m, -1.0f);
    }
    return fp4rl_hif4_word_base_bits(word) == FP4RL_HIF4_NAN_WORD ? qnan : fp4rl_hif4_word_base(word) * 0.25f;
}

/* Rollout-ResQ's 2:4 mask on one group of len <= 4 values: keep the two largest magnitudes (the
 * lower index on ties), as the resq_mask op does; groups of <= 2 keep everything. */
FP4RL_HD void fp4rl_mask_2_4_group(float *g, int len)
{
    if (len <= 2) return;
    int i1 = 0, i2 = -1;
    for (int i = 1; i < len; i++)
        if (fabsf(g[i]) > fabsf(g[i1])) i1 = i;
    for (int i = 0; i < len; i++)
        if (i != i1 && (i2 < 0 || fabsf(g[i]) > fabsf(g[i2]))) i2 = i;
    for (int i = 0; i < len; i++)
        if (i != i1 && i != i2) g[i] = 0.0f;
}

#endif /* FP4RL_QDQ_BLOCK_H */
