/*
 * test_rollout_fast.c - the rollout's fused linear path (ops rollout_act, linear_forward_bf16,
 * pack_bf16; core/rl/rollout.c's plan) against the generic path it replaces:
 *   - rollout_act's BF16 words equal, bit for bit, the public quantize + dequantize round trip
 *     of x, and of the residual x - xq re-quantized with fresh scales and masked by the resq_mask
 *     op, for MXFP4 / HiF4 / MXFP8, both MX scale rules, ResQ off / dense / 2:4, ragged shapes,
 *     zeros, underflowing values, NaN and Inf; its counts equal the underflow_count op's;
 *   - linear_forward_bf16 equals the FP32 layer on the widened operands;
 *   - whole rollouts with the fused path equal the generic path's (same act_zero_frac exactly,
 *     the same completions, log mu within FP32 summation-order noise);
 *   - the W4A4 decode pair (rollout_act8, linear_forward_w4): e4m3(byte) * scale is rollout_act's
 *     value for every element (counts equal), the GEMM equals the BF16 one on the dequantized
 *     operands within FP32 summation noise, its bias is one addition, bad shapes are refused; and
 *     rollouts forced onto it (FP4RL_ROLLOUT_W4=1: HiF4 1D and 64-row tiles, ResQ 2:4 / dense, MXFP4)
 *     against the BF16 fused path (first-step log mu within summation noise).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/formats.h"
#include "backend/ops.h"
#include "format/layout.h"
#include "format/qdq_block.h"
#include "rl/rollout.h"

static fp4rl_context *ctx;
static void setup(void) { ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK); }
static void teardown(void) { fp4rl_context_destroy(ctx); }

#define OK(call) ck_assert_msg((call) == FP4RL_OK, "%s", fp4rl_last_error())

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double unif(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float gauss(void) { return (float)(sqrt(-2.0 * log(unif() + 1e-300)) * cos(6.283185307179586 * unif())); }

/* Activations with what the rollout meets: per-row scales, outlier channels, exact zeros, values
 * far below their block's max (which underflow), and a NaN and an Inf in two rows. */
static float *activations(int64_t N, int64_t K)
{
    float *x = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t n = 0; n < N; n++) {
        const float rs = (float)exp2((double)(n % 7) - 3.0);
        for (int64_t k = 0; k < K; k++) {
            float v = gauss() * rs;
            if (k % 37 == 5) v *= 40.0f;       /* outlier channel */
            if (k % 11 == 3) v *= 1e-3f;       /* underflows next to the outliers */
            if ((n + k) % 13 == 0) v = 0.0f;   /* exact zeros */
            x[n * K + k] = v;
        }
    }
    if (N > 3 && 3 * K + 70 < N * K) x[3 * K + 70] = NAN; /* in bounds for narrow shapes too */
    if (N > 4) x[4 * K + 1] = INFINITY;
    return x;
}

/* dequantize(quantize(x)) through the public API with stochastic rounding on (seed, the context's
 * offset at the call: returned in *offset) or nearest */
static float *qdq_public_sr(const float *x, int64_t N, int64_t K, fp4rl_dtype fmt, int tf, int sr, uint64_t *offset)
{
    fp4rl_quant_policy *p;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_SCALE_RULE, tf ? FP4RL_SCALE_TRUNCATION_FREE : FP4RL_SCALE_OCP_FLOOR));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_ROUNDING_GRADIENT, sr ? FP4RL_ROUND_STOCHASTIC : FP4RL_ROUND_NEAREST));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_SEED, 4242));
    const int64_t shape[2] = {N, K};
    fp4rl_tensor *t, *q, *d;
    OK(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 2, shape, x));
    *offset = ctx->rng_offset;
    OK(fp4rl_quantize(&q, ctx, t, fmt, p, FP4RL_ROLE_GRADIENT));
    OK(fp4rl_dequantize(&d, ctx, q, FP4RL_DTYPE_F32));
    float *y = malloc((size_t)(N * K) * sizeof(float));
    OK(fp4rl_tensor_to_host(d, y, (size_t)(N * K) * sizeof(float)));
    fp4rl_tensor_destroy(t);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(d);
    fp4rl_quant_policy_destroy(p);
    return y;
}

/* dequantize(quantize(x)) through the public API (the CPU reference quantizer), nearest rounding. */
static float *qdq_public(const float *x, int64_t N, int64_t K, fp4rl_dtype fmt, int tf)
{
    uint64_t offset;
    return qdq_public_sr(x, N, K, fmt, tf, 0, &offset);
}

static int same_bf16(uint16_t got, float want)
{
    const uint16_t w = fp4rl_f32_to_bf16(want);
    if (isnan(want)) return (got & 0x7f80u) == 0x7f80u && (got & 0x7fu) != 0;
    return got == w;
}

START_TEST(test_act_matches_generic)
{
    const fp4rl_dtype fmts[3] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};
    const int qfmt[3] = {FP4RL_QDQ_MXFP4, FP4RL_QDQ_HIF4, FP4RL_QDQ_MXFP8};
    const int resqs[3] = {FP4RL_RESQ_OFF, FP4RL_RESQ_DENSE, FP4RL_RESQ_2_4};
    const int64_t shapes[3][2] = {{6, 199}, {3, 64}, {2, 7}};
    int cases = 0;
    for (int si = 0; si < 3; si++) {
        const int64_t N = shapes[si][0], K = shapes[si][1];
        float *x = activations(N, K);
        for (int f = 0; f < 3; f++)
            for (int tf = 0; tf < 2; tf++) {
                float *xq = qdq_public(x, N, K, fmts[f], tf);
                float *r = malloc((size_t)(N * K) * sizeof(float));
                for (int64_t i = 0; i < N * K; i++) r[i] = x[i] - xq[i];
                float *rq = qdq_public(r, N, K, fmts[f], tf);
                float ref_counts[2] = {0, 0};
                OK(fp4rl_cpu_ops.underflow_count(ctx, ref_counts, x, xq, N * K));
                for (int ri = 0; ri < 3; ri++) {
                    float *rm = malloc((size_t)(N * K) * sizeof(float));
                    memcpy(rm, rq, (size_t)(N * K) * sizeof(float));
                    OK(fp4rl_cpu_ops.resq_mask(ctx, rm, N, K, resqs[ri]));
                    const int two = resqs[ri] != FP4RL_RESQ_OFF;
                    const int64_t ld = K; /* rows 0 .. N-1: xq; N .. 2N-1: the residual */
                    uint16_t *out = malloc((size_t)((two ? 2 : 1) * N * ld) * sizeof(uint16_t));
                    unsigned long long counts[2] = {7, 9}; /* accumulates */
                    OK(fp4rl_cpu_ops.rollout_act(ctx, out, counts, x, N, K, qfmt[f], tf, resqs[ri]));
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t k = 0; k < K; k++) {
                            ck_assert_msg(same_bf16(out[n * ld + k], xq[n * K + k]),
                                          "%s tf %d resq %d [%lld,%lld]: xq %04x, generic %g", fp4rl_dtype_name(fmts[f]), tf,
                                          resqs[ri], (long long)n, (long long)k, out[n * ld + k], xq[n * K + k]);
                            if (two)
                                ck_assert_msg(same_bf16(out[(N + n) * ld + k], rm[n * K + k]),
                                              "%s tf %d resq %d [%lld,%lld]: residual %04x, generic %g", fp4rl_dtype_name(fmts[f]),
                                              tf, resqs[ri], (long long)n, (long long)k, out[(N + n) * ld + k], rm[n * K + k]);
                        }
                    ck_assert_uint_eq(counts[0], 7 + (unsigned long long)ref_counts[0]);
                    ck_assert_uint_eq(counts[1], 9 + (unsigned long long)ref_counts[1]);
                    if (si == 0 && f < 2) ck_assert_uint_gt(counts[1], 9); /* the data does underflow */
                    free(out);
                    free(rm);
                    cases++;
                }
                free(xq);
                free(r);
                free(rq);
            }
        free(x);
    }
    ck_assert_int_eq(cases, 54);
}
END_TEST

/* The qdq_bf16 op (the training operands' fused round trip) equals the generic path bit for bit:
 * along the last dim it is fp4rl_quantize of x; down the columns, of x's transpose (transposed
 * back), stochastic rounding included (the same uniforms: the transposed tensor's indices). */
START_TEST(test_qdq_bf16_matches_generic)
{
    const fp4rl_dtype fmts[3] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};
    const int qfmt[3] = {FP4RL_QDQ_MXFP4, FP4RL_QDQ_HIF4, FP4RL_QDQ_MXFP8};
    const int64_t shapes[3][2] = {{70, 33}, {129, 64}, {5, 7}};
    int cases = 0;
    for (int si = 0; si < 3; si++) {
        const int64_t N = shapes[si][0], K = shapes[si][1];
        float *x = activations(N, K), *xt = malloc((size_t)(N * K) * sizeof(float));
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) xt[k * N + n] = x[n * K + k];
        uint16_t *out = malloc((size_t)(N * K) * sizeof(uint16_t));
        for (int f = 0; f < 3; f++)
            for (int along = 0; along < 2; along++)
                for (int sr = 0; sr < 2; sr++) {
                    const int tf = f == 0 && sr;
                    uint64_t off;
                    float *want = along ? qdq_public_sr(xt, K, N, fmts[f], tf, sr, &off) : qdq_public_sr(x, N, K, fmts[f], tf, sr, &off);
                    OK(fp4rl_cpu_ops.qdq_bf16(ctx, out, x, N, K, qfmt[f], tf, along, sr, 4242, off));
                    for (int64_t n = 0; n < N; n++)
                        for (int64_t k = 0; k < K; k++) {
                            const float w = along ? want[k * N + n] : want[n * K + k];
                            ck_assert_msg(same_bf16(out[n * K + k], w), "%s along_rows %d stochastic %d [%lld,%lld]: %04x, generic %g",
                                          fp4rl_dtype_name(fmts[f]), along, sr, (long long)n, (long long)k, out[n * K + k], w);
                        }
                    free(want);
                    cases++;
                }
        free(x), free(xt), free(out);
    }
    ck_assert_int_eq(cases, 36);
}
END_TEST

START_TEST(test_act_bf16_and_pack)
{
    const int64_t N = 3, K = 45;
    float *x = activations(N, K);
    uint16_t out[3 * 45], packed[3 * 100];
    OK(fp4rl_cpu_ops.rollout_act(ctx, out, NULL, x, N, K, -1, 0, FP4RL_RESQ_2_4)); /* BF16: no residual */
    for (int64_t i = 0; i < N * K; i++) ck_assert(same_bf16(out[i], fp4rl_round_bf16(x[i])));
    memset(packed, 0xAB, sizeof packed);
    OK(fp4rl_cpu_ops.pack_bf16(ctx, packed, 100, x, N, K));
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k++) ck_assert_uint_eq(packed[n * 100 + k], out[n * K + k]);
        ck_assert_uint_eq(packed[n * 100 + K], 0xABABu); /* past the row: untouched */
    }
    free(x);
}
END_TEST

/* swiglu_act (SwiGLU of gate/up's output, then the operand, no h) equals swiglu_rows followed by
 * rollout_act over the whole batch, words and counts: 130 rows (the CPU op works in blocks of 64
 * rows, so ResQ's residual rows must land at N + n across blocks), I even and odd, the halves with
 * and without lo and bias, BF16 and every round-trip format, ResQ off / dense / 2:4. */
START_TEST(test_swiglu_act_composes)
{
    const int64_t N = 130;
    const int fmts[4] = {-1, FP4RL_QDQ_HIF4, FP4RL_QDQ_MXFP4, FP4RL_QDQ_MXFP8};
    for (int64_t I = 44; I <= 45; I++) {
        float *gu = activations(N, 2 * I), *lo = activations(N, 2 * I), *b = activations(1, 2 * I), *h = malloc((size_t)(N * I) * 4);
        for (int64_t i = 0; i < N * 2 * I; i++) lo[i] *= 0.01f;
        uint16_t *got = malloc((size_t)(2 * N * I) * 2), *want = malloc((size_t)(2 * N * I) * 2);
        for (int halves = 0; halves < 2; halves++) {
            const float *l = halves ? lo : NULL, *bias = halves ? b : NULL;
            OK(fp4rl_cpu_ops.swiglu_rows(ctx, h, gu, l, bias, N, I));
            for (int f = 0; f < 4; f++)
                for (int resq = FP4RL_RESQ_OFF; resq <= FP4RL_RESQ_2_4; resq++) {
                    const int64_t words = N * I * (fmts[f] >= 0 && resq != FP4RL_RESQ_OFF ? 2 : 1);
                    unsigned long long cg[2] = {1, 2}, cw[2] = {1, 2};
                    memset(got, 0xAB, (size_t)(2 * N * I) * 2);
                    OK(fp4rl_cpu_ops.swiglu_act(ctx, got, cg, gu, l, bias, N, I, fmts[f], f & 1, resq));
                    OK(fp4rl_cpu_ops.rollout_act(ctx, want, cw, h, N, I, fmts[f], f & 1, resq));
                    ck_assert_msg(!memcmp(got, want, (size_t)words * 2), "swiglu_act I %lld halves %d fmt %d resq %d", (long long)I, halves,
                                  fmts[f], resq);
                    ck_assert(cg[0] == cw[0] && cg[1] == cw[1]);
                    if (fmts[f] >= 0) ck_assert(cg[0] > 1); /* counted */
                    if (words < 2 * N * I) ck_assert_uint_eq(got[words], 0xABABu); /* nothing past the operand */
                }
        }
        free(gu), free(lo), free(b), free(h), free(got), free(want);
    }
}
END_TEST

START_TEST(test_linear_bf16)
{
    const int64_t N = 5, IN = 70, OUT = 9;
    float *x = activations(N, IN), *w = activations(OUT, IN);
    for (int64_t i = 0; i < N * IN; i++) x[i] = isfinite(x[i]) ? fp4rl_round_bf16(x[i]) : 1.0f;
    for (int64_t i = 0; i < OUT * IN; i++) w[i] = isfinite(w[i]) ? fp4rl_round_bf16(w[i]) : -2.0f;
    float b[9], y[45], yref[45];
    for (int i = 0; i < 9; i++) b[i] = (float)i - 4.0f;
    uint16_t xb[5 * 70], wb[9 * 70];
    OK(fp4rl_cpu_ops.pack_bf16(ctx, xb, IN, x, N, IN));
    OK(fp4rl_cpu_ops.pack_bf16(ctx, wb, IN, w, OUT, IN));
    for (int with_b = 0; with_b < 2; with_b++) {
        OK(fp4rl_cpu_ops.linear_forward_bf16(ctx, y, xb, wb, with_b ? b : NULL, N, IN, OUT));
        OK(fp4rl_cpu_ops.linear_forward(ctx, yref, x, w, with_b ? b : NULL, N, IN, OUT));
        ck_assert_mem_eq(y, yref, sizeof y);
    }
    free(x);
    free(w);
}
END_TEST

/* ---- the W4A4 decode pair ---- */
START_TEST(test_act8_matches_act)
{
    const int qfmt[2] = {FP4RL_QDQ_HIF4, FP4RL_QDQ_MXFP4};
    const int64_t shapes[3][2] = {{6, 199}, {3, 64}, {2, 7}};
    for (int si = 0; si < 3; si++) {
        const int64_t N = shapes[si][0], K = shapes[si][1];
        float *x = activations(N, K);
        for (int f = 0; f < 2; f++)
            for (int tf = 0; tf < 2; tf++)
                for (int resq = FP4RL_RESQ_OFF; resq <= FP4RL_RESQ_2_4; resq++) {
                    const int64_t U = fp4rl_qdq_block_size(qfmt[f]), Kp = (K + U - 1) / U * U, rows = (resq ? 2 : 1) * N;
                    const int64_t ld = FP4RL_FP8_SCALE_LD(rows);
                    uint16_t *ref = malloc((size_t)(rows * K) * 2);
                    uint8_t *e = malloc((size_t)(rows * Kp));
                    float *sc = malloc((size_t)((Kp / U) * ld) * 4);
                    memset(e, 0xEE, (size_t)(rows * Kp));
                    memset(sc, 0xEE, (size_t)((Kp / U) * ld) * 4);
                    unsigned long long c8[2] = {1, 2}, c16[2] = {1, 2};
                    OK(fp4rl_cpu_ops.rollout_act(ctx, ref, c16, x, N, K, qfmt[f], tf, resq));
                    OK(fp4rl_cpu_ops.rollout_act8(ctx, e, sc, c8, x, N, K, qfmt[f], tf, resq));
                    ck_assert(c8[0] == c16[0] && c8[1] == c16[1]);
                    for (int64_t r = 0; r < rows; r++)
                        for (int64_t k = 0; k < Kp; k++) {
                            if (k >= K) {
                                ck_assert_uint_eq(e[r * Kp + k], 0); /* padding */
                                continue;
                            }
                            if (isnan(sc[(k / U) * ld + r])) { /* a NaN unit: bytes 0 (rollout_act's 2:4 mask zeroes some of its NaNs) */
                                ck_assert_uint_eq(e[r * Kp + k], 0);
                                continue;
                            }
                            const float v = fp4rl_e4m3_decode(e[r * Kp + k]) * sc[(k / U) * ld + r];
                            ck_assert_msg(same_bf16(ref[r * K + k], v), "act8 fmt %d tf %d resq %d (%lld x %lld): row %lld k %lld: %g * %g vs %g",
                                          qfmt[f], tf, resq, (long long)N, (long long)K, (long long)r, (long long)k,
                                          (double)fp4rl_e4m3_decode(e[r * Kp + k]), (double)sc[(k / U) * ld + r],
                                          (double)fp4rl_bf16_to_f32(ref[r * K + k]));
                        }
                    for (int64_t u = 0; u < Kp / U; u++)
                        for (int64_t r = rows; r < ld; r++) ck_assert(sc[u * ld + r] == 0.0f); /* the layout's padding rows */
                    free(ref), free(e), free(sc);
                }
        free(x);
    }
    uint8_t e[64];
    float sc[128], x1[64] = {1.0f};
    ck_assert_int_eq(fp4rl_cpu_ops.rollout_act8(ctx, e, sc, NULL, x1, 1, 64, FP4RL_QDQ_MXFP8, 0, 0), FP4RL_ERR_UNSUPPORTED);
    ck_assert_int_eq(fp4rl_cpu_ops.rollout_act8(ctx, e, sc, NULL, x1, 1, 64, FP4RL_QDQ_HIF4, 0, FP4RL_RESQ_CHANNEL_50), FP4RL_ERR_UNSUPPORTED);
}
END_TEST

/* w [OUT, K] quantized on the CPU with the weight role's parameters (tile), and its dequantization */
static fp4rl_tensor *quant_w(const float *w, int64_t OUT, int64_t K, fp4rl_dtype fmt, int tile, float *wd)
{
    fp4rl_quant_policy *p;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile));
    const int64_t shape[2] = {OUT, K};
    fp4rl_tensor *t, *q, *d;
    OK(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 2, shape, w));
    OK(fp4rl_quantize(&q, ctx, t, fmt, p, FP4RL_ROLE_WEIGHT));
    OK(fp4rl_dequantize(&d, ctx, q, FP4RL_DTYPE_F32));
    OK(fp4rl_tensor_to_host(d, wd, (size_t)(OUT * K) * sizeof(float)));
    fp4rl_tensor_destroy(t);
    fp4rl_tensor_destroy(d);
    fp4rl_quant_policy_destroy(p);
    return q;
}

START_TEST(test_linear_w4)
{
    const int64_t N = 7, K = 192, OUT = 70;
    const fp4rl_dtype fmts[4] = {FP4RL_DTYPE_HIF4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_MXFP4};
    const int tiles[4] = {0, 64, 0, 32};
    for (int c = 0; c < 4; c++) {
        const int qf = (int)fmts[c];
        const int64_t U = fp4rl_qdq_block_size(qf), rows = 2 * N, ld = FP4RL_FP8_SCALE_LD(rows);
        float *x = activations(N, K), *w = activations(OUT, K), *wd = malloc((size_t)(OUT * K) * 4);
        for (int64_t i = 0; i < N * K; i++) x[i] = isfinite(x[i]) ? x[i] : 0.5f; /* the NaN unit: tested by act8 */
        for (int64_t i = 0; i < OUT * K; i++) w[i] = isfinite(w[i]) ? w[i] : -0.5f;
        fp4rl_tensor *q = quant_w(w, OUT, K, fmts[c], tiles[c], wd);
        uint8_t *a8 = malloc((size_t)(rows * K));
        float *sa = malloc((size_t)((K / U) * ld) * 4), b[70], *y = malloc((size_t)(rows * OUT) * 4), *yb = malloc((size_t)(rows * OUT) * 4);
        float *yref = malloc((size_t)(rows * OUT) * 4);
        for (int i = 0; i < OUT; i++) b[i] = 0.25f * (float)i - 3.0f;
        uint16_t *xb = malloc((size_t)(rows * K) * 2), *wb = malloc((size_t)(OUT * K) * 2);
        OK(fp4rl_cpu_ops.rollout_act8(ctx, a8, sa, NULL, x, N, K, qf, 0, FP4RL_RESQ_2_4));
        OK(fp4rl_cpu_ops.rollout_act(ctx, xb, NULL, x, N, K, qf, 0, FP4RL_RESQ_2_4));
        OK(fp4rl_cpu_ops.pack_bf16(ctx, wb, K, wd, OUT, K));
        OK(fp4rl_cpu_ops.linear_forward_w4(ctx, y, a8, sa, q, NULL, rows, K, OUT));
        OK(fp4rl_cpu_ops.linear_forward_w4(ctx, yb, a8, sa, q, b, rows, K, OUT));
        OK(fp4rl_cpu_ops.linear_forward_bf16(ctx, yref, xb, wb, NULL, rows, K, OUT));
        double num = 0, den = 0;
        for (int64_t i = 0; i < rows * OUT; i++) {
            num = fmax(num, fabs((double)y[i] - yref[i]));
            den = fmax(den, fabs((double)yref[i]));
            const float want = y[i] + b[i % OUT];
            ck_assert(memcmp(&yb[i], &want, 4) == 0); /* the bias: one FP32 addition after the GEMM */
        }
        printf("linear_forward_w4 %s tile %d: rel err vs the BF16 GEMM %.3g\n", fp4rl_dtype_name(fmts[c]), tiles[c], num / den);
        ck_assert_msg(num <= 1e-6 * den, "linear_forward_w4: rel err %g", num / den);
        /* refusals: too many rows, K not whole units, another shape */
        ck_assert_int_eq(fp4rl_cpu_ops.linear_forward_w4(ctx, y, a8, sa, q, NULL, FP4RL_W4_MAX_ROWS + 1, K, OUT), FP4RL_ERR_UNSUPPORTED);
        ck_assert_int_eq(fp4rl_cpu_ops.linear_forward_w4(ctx, y, a8, sa, q, NULL, rows, K, OUT - 1), FP4RL_ERR_SHAPE);
        fp4rl_tensor_destroy(q);
        free(x), free(w), free(wd), free(a8), free(sa), free(y), free(yb), free(yref), free(xb), free(wb);
    }
    float w[2 * 40], wd[2 * 40];
    for (int i = 0; i < 80; i++) w[i] = (float)(i % 9) - 4.0f;
    fp4rl_tensor *q = quant_w(w, 2, 40, FP4RL_DTYPE_MXFP4, 0, wd);
    uint8_t a8[40] = {0};
    float sa[256] = {0}, y[2];
    ck_assert_int_eq(fp4rl_cpu_ops.linear_forward_w4(ctx, y, a8, sa, q, NULL, 1, 40, 2), FP4RL_ERR_UNSUPPORTED);
    fp4rl_tensor_destroy(q);
}
END_TEST

/* linear_forward_w4b (the BF16 operand times the packed weight): bit for bit linear_forward_bf16
 * over pack_bf16 of the dequantized weight, with and without bias, HiF4 1D / 64 x 64 and MXFP4 1D /
 * 32 x 32; linear_w4b_ok and the op refuse NVFP4, K not a multiple of 64 and
 * another shape. */
START_TEST(test_linear_w4b)
{
    const int64_t N = 9, K = 192, OUT = 70;
    const fp4rl_dtype fmts[4] = {FP4RL_DTYPE_HIF4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_MXFP4};
    const int tiles[4] = {0, 64, 0, 32};
    for (int c = 0; c < 4; c++) {
        float *x = activations(N, K), *w = activations(OUT, K), *wd = malloc((size_t)(OUT * K) * 4);
        fp4rl_tensor *q = quant_w(w, OUT, K, fmts[c], tiles[c], wd);
        float b[70], *y = malloc((size_t)(N * OUT) * 4), *yref = malloc((size_t)(N * OUT) * 4);
        for (int i = 0; i < OUT; i++) b[i] = 0.25f * (float)i - 3.0f;
        uint16_t *xb = malloc((size_t)(N * K) * 2), *wb = malloc((size_t)(OUT * K) * 2);
        OK(fp4rl_cpu_ops.pack_bf16(ctx, xb, K, x, N, K));
        OK(fp4rl_cpu_ops.pack_bf16(ctx, wb, K, wd, OUT, K));
        OK(fp4rl_cpu_ops.linear_w4b_ok(ctx, q));
        for (int with_b = 0; with_b < 2; with_b++) {
            OK(fp4rl_cpu_ops.linear_forward_w4b(ctx, y, xb, q, with_b ? b : NULL, N, K, OUT));
            OK(fp4rl_cpu_ops.linear_forward_bf16(ctx, yref, xb, wb, with_b ? b : NULL, N, K, OUT));
            ck_assert_msg(!memcmp(y, yref, (size_t)(N * OUT) * 4), "linear_forward_w4b %s tile %d bias %d: differs from the BF16 GEMM",
                          fp4rl_dtype_name(fmts[c]), tiles[c], with_b);
        }
        ck_assert_int_eq(fp4rl_cpu_ops.linear_forward_w4b(ctx, y, xb, q, NULL, N, K, OUT - 1), FP4RL_ERR_SHAPE);
        fp4rl_tensor_destroy(q);
        free(x), free(w), free(wd), free(y), free(yref), free(xb), free(wb);
    }
    float w[2 * 96], wd[2 * 96];
    for (int i = 0; i < 192; i++) w[i] = (float)(i % 9) - 4.0f;
    fp4rl_tensor *q = quant_w(w, 2, 96, FP4RL_DTYPE_MXFP4, 0, wd); /* K = 96: not a multiple of 64 */
    ck_assert_int_eq(fp4rl_cpu_ops.linear_w4b_ok(ctx, q), FP4RL_ERR_UNSUPPORTED);
    fp4rl_tensor_destroy(q);
    q = quant_w(w, 2, 64, FP4RL_DTYPE_NVFP4, 0, wd);
    ck_assert_int_eq(fp4rl_cpu_ops.linear_w4b_ok(ctx, q), FP4RL_ERR_UNSUPPORTED);
    uint16_t xb[64] = {0};
    float y[2];
    ck_assert_int_eq(fp4rl_cpu_ops.linear_forward_w4b(ctx, y, xb, q, NULL, 1, 64, 2), FP4RL_ERR_UNSUPPORTED);
    fp4rl_tensor_destroy(q);
}
END_TEST

/* ---- whole rollouts, fused vs generic ---- */
static const char *SMALL =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 96, \"intermediate_size\": 160,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 32, \"tie_word_embeddings\": false}";

/* The block's fused steps on the CPU (the reference every backend's fused kernels are held to):
 * qkv_rope_store equals rope_forward on q and k plus kv_store of k and v, and swiglu_rows equals
 * swiglu_forward on the halves, bit for bit, FP32 and BF16 caches, rows stored out of order. */
START_TEST(test_fused_block_ops)
{
    const fp4rl_ops *o = ctx->ops;
    const int64_t N = 5, Hq = 6, Hkv = 2, D = 16, QD = Hq * D, KD = Hkv * D, W3 = QD + 2 * KD, R = 9, I = 37;
    const int32_t pos[5] = {0, 3, 17, 200, 4095}, rows[5] = {7, 0, 3, 8, 1};
    float *qkv = malloc((size_t)(N * W3) * 4), *q = malloc((size_t)(N * QD) * 4), *q2 = malloc((size_t)(N * QD) * 4);
    float *k = malloc((size_t)(N * KD) * 4), *v = malloc((size_t)(N * KD) * 4);
    for (int64_t i = 0; i < N * W3; i++) qkv[i] = 3 * gauss();
    for (int kvb = 0; kvb < 2; kvb++) {
        const size_t cb = (size_t)(R * KD) * (kvb ? 2 : 4);
        unsigned char *kc = calloc(1, cb), *vc = calloc(1, cb), *kc2 = calloc(1, cb), *vc2 = calloc(1, cb);
        OK(o->qkv_rope_store(ctx, q, kc, vc, kvb, qkv, NULL, NULL, pos, rows, N, Hq, Hkv, D, 1e6f));
        for (int64_t n = 0; n < N; n++) { /* the steps one by one */
            memcpy(q2 + n * QD, qkv + n * W3, (size_t)QD * 4);
            memcpy(k + n * KD, qkv + n * W3 + QD, (size_t)KD * 4);
            memcpy(v + n * KD, qkv + n * W3 + QD + KD, (size_t)KD * 4);
        }
        OK(o->rope_forward(ctx, q2, q2, pos, N, Hq, D, 1e6f));
        OK(o->rope_forward(ctx, k, k, pos, N, Hkv, D, 1e6f));
        OK(o->kv_store(ctx, kc2, kvb, k, rows, N, KD));
        OK(o->kv_store(ctx, vc2, kvb, v, rows, N, KD));
        ck_assert_msg(!memcmp(q, q2, (size_t)(N * QD) * 4), "qkv_rope_store: q differs from rope_forward");
        ck_assert_msg(!memcmp(kc, kc2, cb) && !memcmp(vc, vc2, cb), "qkv_rope_store: cache (bf16 %d) differs from rope + kv_store", kvb);
        free(kc), free(vc), free(kc2), free(vc2);
    }
    float *gu = malloc((size_t)(N * 2 * I) * 4), *h = malloc((size_t)(N * I) * 4), *h2 = malloc((size_t)(N * I) * 4);
    for (int64_t i = 0; i < N * 2 * I; i++) gu[i] = 4 * gauss();
    OK(o->swiglu_rows(ctx, h, gu, NULL, NULL, N, I));
    for (int64_t n = 0; n < N; n++) OK(o->swiglu_forward(ctx, h2 + n * I, gu + n * 2 * I, gu + n * 2 * I + I, I));
    ck_assert_msg(!memcmp(h, h2, (size_t)(N * I) * 4), "swiglu_rows differs from swiglu_forward");
    free(qkv), free(q), free(q2), free(k), free(v), free(gu), free(h), free(h2);
}
END_TEST

/* The fused steps reading a ResQ GEMM's halves (lo, bias) equal add_halves followed by the op, bit
 * for bit: with and without bias, rows of a multiple of 4 and not (I = 36 / 37; q/k/v rows of 160
 * and 30 values); and a bias without lo equals the op on x + bias. */
START_TEST(test_fused_ops_halves)
{
    const fp4rl_ops *o = ctx->ops;
    const int64_t N = 5, R = 9;
    const int32_t pos[5] = {0, 3, 17, 200, 4095}, rows[5] = {7, 0, 3, 8, 1};
    const int64_t shapes[2][3] = {{6, 2, 16}, {3, 1, 6}}; /* Hq, Hkv, D */
    for (int s = 0; s < 2; s++)
        for (int mode = 0; mode < 3; mode++) { /* 0: lo, no bias; 1: lo and bias; 2: bias alone */
            const int64_t Hq = shapes[s][0], Hkv = shapes[s][1], D = shapes[s][2], QD = Hq * D, KD = Hkv * D, W = QD + 2 * KD;
            float *ys = malloc((size_t)(2 * N * W) * 4), *b = malloc((size_t)W * 4), *x = malloc((size_t)(N * W) * 4);
            float *q = malloc((size_t)(N * QD) * 4), *q2 = malloc((size_t)(N * QD) * 4);
            for (int64_t i = 0; i < 2 * N * W; i++) ys[i] = (i < N * W ? 3 : 0.01f) * gauss();
            for (int64_t i = 0; i < W; i++) b[i] = gauss();
            const float *lo = mode < 2 ? ys + N * W : NULL, *bias = mode ? b : NULL;
            if (lo) OK(o->add_halves(ctx, x, ys, bias, N, W));
            else
                for (int64_t i = 0; i < N * W; i++) x[i] = ys[i] + b[i % W];
            for (int kvb = 0; kvb < 2; kvb++) {
                const size_t cb = (size_t)(R * KD) * (kvb ? 2 : 4);
                unsigned char *kc = calloc(1, cb), *vc = calloc(1, cb), *kc2 = calloc(1, cb), *vc2 = calloc(1, cb);
                OK(o->qkv_rope_store(ctx, q, kc, vc, kvb, ys, lo, bias, pos, rows, N, Hq, Hkv, D, 1e6f));
                OK(o->qkv_rope_store(ctx, q2, kc2, vc2, kvb, x, NULL, NULL, pos, rows, N, Hq, Hkv, D, 1e6f));
                ck_assert_msg(!memcmp(q, q2, (size_t)(N * QD) * 4), "qkv_rope_store (W %lld, mode %d): q differs", (long long)W, mode);
                ck_assert_msg(!memcmp(kc, kc2, cb) && !memcmp(vc, vc2, cb), "qkv_rope_store (W %lld, mode %d, bf16 %d): cache differs",
                              (long long)W, mode, kvb);
                free(kc), free(vc), free(kc2), free(vc2);
            }
            free(ys), free(b), free(x), free(q), free(q2);
        }
    for (int64_t I = 36; I <= 37; I++)
        for (int mode = 0; mode < 3; mode++) {
            const int64_t W = 2 * I;
            float *ys = malloc((size_t)(2 * N * W) * 4), *b = malloc((size_t)W * 4), *x = malloc((size_t)(N * W) * 4);
            float *h = malloc((size_t)(N * I) * 4), *h2 = malloc((size_t)(N * I) * 4);
            for (int64_t i = 0; i < 2 * N * W; i++) ys[i] = (i < N * W ? 4 : 0.01f) * gauss();
            for (int64_t i = 0; i < W; i++) b[i] = gauss();
            const float *lo = mode < 2 ? ys + N * W : NULL, *bias = mode ? b : NULL;
            if (lo) OK(o->add_halves(ctx, x, ys, bias, N, W));
            else
                for (int64_t i = 0; i < N * W; i++) x[i] = ys[i] + b[i % W];
            OK(o->swiglu_rows(ctx, h, ys, lo, bias, N, I));
            OK(o->swiglu_rows(ctx, h2, x, NULL, NULL, N, I));
            ck_assert_msg(!memcmp(h, h2, (size_t)(N * I) * 4), "swiglu_rows (I %lld, mode %d) differs from add_halves + swiglu_rows",
                          (long long)I, mode);
            free(ys), free(b), free(x), free(h), free(h2);
        }
}
END_TEST

static void rollout_pair(fp4rl_dtype fmt, fp4rl_numerics numerics, fp4rl_resq resq, int expect_fast_zero_frac, int64_t qk_format,
                         int64_t fused)
{
    fp4rl_quant_policy *p;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_ACTIVATION, fmt));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_ROLLOUT_NUMERICS, numerics));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_RESQ, resq));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_QK, qk_format));
    fp4rl_model *m;
    OK(fp4rl_model_create(&m, ctx, SMALL, p, 3));
    const int32_t prompts[9] = {13, 4, 10, 7, 11, 13, 9, 9, 10};
    const size_t off[3] = {0, 5, 9};
    const int32_t stop = 12;
    fp4rl_rollout_cfg cfg = {.group = 8, .max_new = 12, .temperature = 1.0f, .stop = &stop, .n_stop = 1, .seed = 11};
    fp4rl_rollout_result rf, rg;
    m->rollout_generic = 0;
    OK(fp4rl_rollout_run(m, &cfg, prompts, off, 2, &rf));
    m->rollout_generic = 1;
    OK(fp4rl_rollout_run(m, &cfg, prompts, off, 2, &rg));
    int equal = 0;
    double lp = 0;
    for (int64_t i = 0; i < rf.n_seqs; i++) {
        int same = rf.lengths[i] == rg.lengths[i];
        for (int64_t j = 0; same && j < rf.lengths[i]; j++) same = rf.tokens[i * 12 + j] == rg.tokens[i * 12 + j];
        equal += same;
        for (int64_t j = 0; same && j < rf.lengths[i]; j++) lp = fmax(lp, fabs((double)rf.logprobs[i * 12 + j] - rg.logprobs[i * 12 + j]));
    }
    printf("rollout %s numerics %d resq %d: fused vs generic: %d/%lld completions equal, max |d log mu| %.3g, act_zero_frac %.6f / %.6f\n",
           fp4rl_dtype_name(fmt), (int)numerics, (int)resq, equal, (long long)rf.n_seqs, lp, rf.act_zero_frac, rg.act_zero_frac);
    ck_assert_int_eq(rf.fused_linears, fused);
    ck_assert_int_eq(rg.fused_linears, 0);
    ck_assert_int_ge(equal, rf.n_seqs - 1); /* one flip allowed: FP32 summation order can move a CDF step */
    ck_assert_msg(lp <= 1e-4, "log mu differs by %g", lp);
    ck_assert(rf.act_zero_frac == rg.act_zero_frac); /* the same quantized activations, counted exactly */
    if (expect_fast_zero_frac) ck_assert(rf.act_zero_frac > 0);
    fp4rl_rollout_result_free(&rf);
    fp4rl_rollout_result_free(&rg);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}

START_TEST(test_rollout_fused_equals_generic)
{
    const int64_t all = 2 * 7 + 1; /* every linear of the 2 layers and the head */
    rollout_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4, 1, -1, all);
    rollout_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_DENSE, 1, -1, all);
    rollout_pair(FP4RL_DTYPE_MXFP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_OFF, 1, -1, all);
    rollout_pair(FP4RL_DTYPE_MXFP4, FP4RL_NUMERICS_W16A4, FP4RL_RESQ_2_4, 1, -1, all);
    rollout_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A16, FP4RL_RESQ_2_4, 0, -1, all);
    rollout_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_BF16, FP4RL_RESQ_OFF, 0, -1, all);
    /* MXFP8 q/k projections take the generic path, the rest stays fused (no shared q/k/v operand) */
    rollout_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4, 1, FP4RL_DTYPE_MXFP8_E4M3, all - 2 * 2);
    /* channel-50 needs the whole batch: generic everywhere but the (BF16) head */
    rollout_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_CHANNEL_50, 1, -1, 1);
}
END_TEST

/* A model whose every K is whole HiF4 units and whose q / k / v, gate / up rows are multiples of 64
 * (the W4A4 path's layouts, 64-row weight tiles included). */
static const char *SMALL64 =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 128, \"intermediate_size\": 192,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 32, \"tie_word_embeddings\": false}";

/* The same rollout with FP4RL_ROLLOUT_W4=1 (every forward here has at most 2 x 9 operand rows, so
 * prefill too runs the W4A4 GEMMs) and =0 (the BF16 fused path): the prefill's samples, the first
 * token of each completion, are the same tokens with log mu within summation-order noise. */
/* The SMALL64 model (seed) under a policy of weight and activation format fmt, rollout numerics,
 * ResQ and weight tile (*pp: the policy, for the caller to destroy). */
static fp4rl_model *small64_model(fp4rl_quant_policy **pp, fp4rl_dtype fmt, fp4rl_numerics numerics, fp4rl_resq resq, int tile,
                                  uint64_t seed)
{
    fp4rl_quant_policy *p;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_ACTIVATION, fmt));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_ROLLOUT_NUMERICS, numerics));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_RESQ, resq));
    fp4rl_model *m;
    OK(fp4rl_model_create(&m, ctx, SMALL64, p, seed));
    *pp = p;
    return m;
}

/* The rollout of the 2 prompts (CSR off) with the switch `env` set to 1 (*on) and to 0 (*off). */
static void switch_pair(const char *env, fp4rl_model *m, const fp4rl_rollout_cfg *cfg, const int32_t *prompts, const size_t *off,
                        fp4rl_rollout_result *on, fp4rl_rollout_result *offr)
{
    setenv(env, "1", 1);
    OK(fp4rl_rollout_run(m, cfg, prompts, off, 2, on));
    setenv(env, "0", 1);
    OK(fp4rl_rollout_run(m, cfg, prompts, off, 2, offr));
    unsetenv(env);
}

static void w4_pair(fp4rl_dtype fmt, fp4rl_resq resq, int tile)
{
    fp4rl_quant_policy *p;
    fp4rl_model *m = small64_model(&p, fmt, FP4RL_NUMERICS_W4A4, resq, tile, 3);
    const int32_t prompts[9] = {13, 4, 10, 7, 11, 13, 9, 9, 10};
    const size_t off[3] = {0, 5, 9};
    fp4rl_rollout_cfg cfg = {.group = 4, .max_new = 4, .temperature = 1.0f, .seed = 11};
    fp4rl_rollout_result r4, rb;
    switch_pair("FP4RL_ROLLOUT_W4", m, &cfg, prompts, off, &r4, &rb);
    double lp = 0;
    for (int64_t i = 0; i < r4.n_seqs; i++) {
        ck_assert_int_eq(r4.tokens[i * 4], rb.tokens[i * 4]);
        lp = fmax(lp, fabs((double)r4.logprobs[i * 4] - rb.logprobs[i * 4]));
    }
    printf("rollout %s tile %d resq %d: W4A4 vs BF16 fused: first-step max |d log mu| %.3g, act_zero_frac %.6f / %.6f\n",
           fp4rl_dtype_name(fmt), tile, (int)resq, lp, r4.act_zero_frac, rb.act_zero_frac);
    ck_assert_int_eq(r4.w4_linears, 2 * 7);
    ck_assert_int_eq(rb.w4_linears, 0);
    ck_assert_int_eq(r4.fused_linears, rb.fused_linears);
    ck_assert_msg(lp <= 1e-5, "first-step log mu differs by %g", lp);
    fp4rl_rollout_result_free(&r4);
    fp4rl_rollout_result_free(&rb);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}

START_TEST(test_rollout_w4_equals_fused)
{
    w4_pair(FP4RL_DTYPE_HIF4, FP4RL_RESQ_2_4, 0);
    w4_pair(FP4RL_DTYPE_HIF4, FP4RL_RESQ_OFF, 64);
    w4_pair(FP4RL_DTYPE_MXFP4, FP4RL_RESQ_DENSE, 0);
    w4_pair(FP4RL_DTYPE_MXFP4, FP4RL_RESQ_OFF, 32);
}
END_TEST

/* The rollout with FP4RL_ROLLOUT_W4B=1 (decode GEMMs of at most 32 operand rows, here every decode step's, on
 * the packed weights) and =0 (and unset: off on the CPU): on the CPU linear_forward_w4b is the BF16 GEMM over the same BF16
 * weight words, so the tokens and log mu are the same bit for bit; weights HiF4 / MXFP4 (1D and
 * tiles) with FP4 or BF16 activations, ResQ off / dense / 2:4; swiglu_act on with 2:4 too. */
static void w4b_pair(fp4rl_dtype fmt, fp4rl_numerics numerics, fp4rl_resq resq, int tile)
{
    fp4rl_quant_policy *p;
    fp4rl_model *m = small64_model(&p, fmt, numerics, resq, tile, 7);
    int32_t prompts[40];
    for (int i = 0; i < 40; i++) prompts[i] = (int32_t)((i * 5 + 1) % 16);
    const size_t off[3] = {0, 21, 40};
    fp4rl_rollout_cfg cfg = {.group = 3, .max_new = 5, .temperature = 1.0f, .seed = 13};
    fp4rl_rollout_result ra, rb;
    switch_pair("FP4RL_ROLLOUT_W4B", m, &cfg, prompts, off, &ra, &rb);
    printf("rollout %s numerics %d resq %d tile %d: W4B linears %lld of %lld\n", fp4rl_dtype_name(fmt), (int)numerics, (int)resq, tile,
           (long long)ra.w4b_linears, (long long)ra.fused_linears);
    ck_assert_int_eq(ra.w4b_linears, 2 * 7);
    ck_assert_int_eq(rb.w4b_linears, 0);
    fp4rl_rollout_result rd; /* unset: off on the CPU (its op dequantizes at every call), on on a GPU */
    OK(fp4rl_rollout_run(m, &cfg, prompts, off, 2, &rd));
    ck_assert_int_eq(rd.w4b_linears, 0);
    fp4rl_rollout_result_free(&rd);
    ck_assert_int_eq(ra.n_seqs, rb.n_seqs);
    ck_assert(ra.act_zero_frac == rb.act_zero_frac);
    ck_assert(!memcmp(ra.tokens, rb.tokens, (size_t)(ra.n_seqs * cfg.max_new) * sizeof(int32_t)));
    ck_assert(!memcmp(ra.logprobs, rb.logprobs, (size_t)(ra.n_seqs * cfg.max_new) * sizeof(float)));
    fp4rl_rollout_result_free(&ra);
    fp4rl_rollout_result_free(&rb);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}

START_TEST(test_rollout_w4b_equals_fused)
{
    w4b_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4, 0);
    w4b_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A16, FP4RL_RESQ_OFF, 64);
    w4b_pair(FP4RL_DTYPE_MXFP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_DENSE, 0);
    w4b_pair(FP4RL_DTYPE_MXFP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_OFF, 32);
    setenv("FP4RL_SWIGLU_ACT", "1", 1);
    w4b_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4, 0);
    unsetenv("FP4RL_SWIGLU_ACT");
}
END_TEST

/* The rollout with FP4RL_SWIGLU_ACT=1 (down_proj's operand from swiglu_act) and =0 (swiglu_rows, then
 * rollout_act): the same tokens and log mu, bit for bit, BF16 and HiF4 / MXFP4 with ResQ off, dense
 * and 2:4 (test_swiglu_act_composes covers more rows than one of the CPU op's 64-row blocks). */
static void swiglu_act_pair(fp4rl_dtype fmt, fp4rl_numerics numerics, fp4rl_resq resq)
{
    fp4rl_quant_policy *p;
    fp4rl_model *m = small64_model(&p, fmt, numerics, resq, 0, 5);
    int32_t prompts[40];
    for (int i = 0; i < 40; i++) prompts[i] = (int32_t)((i * 7 + 3) % 16);
    const size_t off[3] = {0, 25, 40};
    fp4rl_rollout_cfg cfg = {.group = 4, .max_new = 6, .temperature = 1.0f, .seed = 12};
    fp4rl_rollout_result ra, rb;
    switch_pair("FP4RL_SWIGLU_ACT", m, &cfg, prompts, off, &ra, &rb);
    ck_assert_int_eq(ra.n_seqs, rb.n_seqs);
    ck_assert(ra.fused_linears > 0 && ra.fused_linears == rb.fused_linears);
    ck_assert(ra.act_zero_frac == rb.act_zero_frac);
    for (int64_t i = 0; i < ra.n_seqs; i++) ck_assert_int_eq(ra.lengths[i], rb.lengths[i]);
    ck_assert(!memcmp(ra.tokens, rb.tokens, (size_t)(ra.n_seqs * cfg.max_new) * sizeof(int32_t)));
    ck_assert(!memcmp(ra.logprobs, rb.logprobs, (size_t)(ra.n_seqs * cfg.max_new) * sizeof(float)));
    fp4rl_rollout_result_free(&ra);
    fp4rl_rollout_result_free(&rb);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}

START_TEST(test_rollout_swiglu_act_equals_unfused)
{
    swiglu_act_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_BF16, FP4RL_RESQ_OFF);
    swiglu_act_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4);
    swiglu_act_pair(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_OFF);
    swiglu_act_pair(FP4RL_DTYPE_MXFP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_DENSE);
}
END_TEST

/* The training step makes its forward operands with 1D blocks along the last dim through the same
 * fused round trip: gradients (stochastic dY included, drawn in the same order) are bit-identical
 * to the generic quantize / dequantize path's. */
static void train_pair(fp4rl_preset preset, fp4rl_dtype fmt)
{
    fp4rl_quant_policy *p;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_apply_preset(p, preset));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_ACTIVATION, fmt));
    enum { B = 3, T = 9 };
    int32_t tok[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (i * 7 + 3) % 16;
    const int32_t len[B] = {9, 6, 8};
    float *g[2];
    int64_t n = 0;
    double loss[2];
    for (int generic = 0; generic < 2; generic++) {
        fp4rl_model *m;
        OK(fp4rl_model_create(&m, ctx, SMALL, p, 5));
        m->rollout_generic = generic;
        ctx->rng_offset = 0;
        OK(fp4rl_model_compute_gradients(m, tok, len, NULL, B, T, &loss[generic]));
        n = m->total;
        g[generic] = malloc((size_t)n * sizeof(float));
        OK(ctx->be->download(ctx, g[generic], m->g, (size_t)n * sizeof(float)));
        fp4rl_model_destroy(m);
    }
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += memcmp(&g[0][i], &g[1][i], sizeof(float)) != 0;
    printf("training %s operands, preset %d: fused vs generic: %lld of %lld gradient words differ, loss %.9g / %.9g\n",
           fp4rl_dtype_name(fmt), (int)preset, (long long)diff, (long long)n, loss[0], loss[1]);
    ck_assert_int_eq(diff, 0);
    ck_assert(loss[0] == loss[1]);
    free(g[0]);
    free(g[1]);
    fp4rl_quant_policy_destroy(p);
}

START_TEST(test_train_operands_fused_equals_generic)
{
    train_pair(FP4RL_PRESET_HIF4_RL, FP4RL_DTYPE_HIF4);
    train_pair(FP4RL_PRESET_DEFAULT, FP4RL_DTYPE_MXFP4);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("rollout_fast");
    TCase *tc = tcase_create("fused");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_act_matches_generic);
    tcase_add_test(tc, test_qdq_bf16_matches_generic);
    tcase_add_test(tc, test_act_bf16_and_pack);
    tcase_add_test(tc, test_swiglu_act_composes);
    tcase_add_test(tc, test_linear_bf16);
    tcase_add_test(tc, test_fused_block_ops);
    tcase_add_test(tc, test_fused_ops_halves);
    tcase_add_test(tc, test_rollout_fused_equals_generic);
    tcase_add_test(tc, test_train_operands_fused_equals_generic);
    tcase_add_test(tc, test_act8_matches_act);
    tcase_add_test(tc, test_linear_w4);
    tcase_add_test(tc, test_rollout_w4_equals_fused);
    tcase_add_test(tc, test_linear_w4b);
    tcase_add_test(tc, test_rollout_w4b_equals_fused);
    tcase_add_test(tc, test_rollout_swiglu_act_equals_unfused);
    suite_add_tcase(su, tc);
    return fp4rl_check_run(su);
}
