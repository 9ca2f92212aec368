/*
 * test_decode_fp8.c - the W4A4 decode GEMM on the FP8 tensor cores and its activation quantizer
 * (cuda/decode_fp8.h) on the GPU:
 * (a) one K slice: C (FP32 and BF16) memcmp-equal to fp4rl_cuda_fp8_gemm_ref on the pre-passed
 *     operands (fp4rl_cuda_fp8_prepass of the same quantized activation and weight);
 * (b) split-K forced: every sampled output within gemm_fp8.h's bound plus one rounding a slice,
 *     |c - exact| <= (2 K / U + 2 + slices) 2^-24 S (+ 2^-9 S for BF16), S = sum_k |a_k w_k|, against
 *     float64 sums of the exactly decoded operands;
 * (c) fp4rl_cuda_act_e4m3's bytes and scales memcmp-equal to the CPU quantizer (fp4rl_quantize on
 *     a CPU context) followed by a host pre-pass, ResQ dense / 2:4 residual rows included (the
 *     residual x - dequant(Q(x)) quantized on the CPU, the 2:4 mask applied to its decoded values),
 *     ragged K, NaN / Inf units;
 * (d) bad arguments refused with an error;
 * (e) (a) and (b) again with FP4RL_D8_WGMMA=1 (the wgmma kernel on sm_90a builds run on sm_90),
 *     HiF4 1D / 2D and MXFP4 1D / 2D, M in {1, 7, 64, 100, 128, 256}, the default split-K;
 * (f) (a) and (b) again with FP4RL_D8_PERSIST=1 through fp4rl_cuda_d8_gemm_tiles (the persistent
 *     kernel on the re-laid-out weight, sm_90+), HiF4 1D / 2D and MXFP4 1D / 2D, M in {1, 3, 8, 16,
 *     64}, N in {77, 300, 2048, 11008} x K in {64, 320, 2048, 11008} (not 11008 x 11008).
 * HiF4 and MXFP4 (1D; MXFP4 32 x 32 tiles once), M in {1, 3, 8, 16, 17, 64, 100, 128, 256}, the 3B
 * decode shapes and ragged small ones. FP4RL_D8_QUICK=1: a subset (for compute-sanitizer).
 * Label `gpu`: exits 77 (skipped) without a GPU.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "decode_fp8.h"
#include "format/formats.h"
#include "format/layout.h"
#include "format/qdq_block.h"
#include "gemm_fp8.h"
#include "runtime/internal.h"

static fp4rl_context *gpu, *cpu;
static int quick;

#define OKG(call) ck_assert_msg((call) == FP4RL_OK, "%s: %s", #call, fp4rl_last_error())

#include "test_rand.h"
static void *dev(const void *h, size_t bytes)
{
    void *d = NULL;
    OKG(gpu->be->alloc(gpu, &d, bytes));
    if (h) OKG(gpu->be->upload(gpu, d, h, bytes));
    return d;
}
static void *host(const void *d, size_t bytes)
{
    void *h = malloc(bytes);
    OKG(gpu->be->download(gpu, h, d, bytes));
    return h;
}
static float *rand_rows(int64_t R, int64_t K)
{
    float *x = malloc((size_t)(R * K) * sizeof(float));
    for (int64_t i = 0; i < R * K; i++) x[i] = 0.1f * gauss() * (1.0f + (float)(i % 7)); /* varied unit scales */
    return x;
}

/* x [R, K] quantized along K on context ctx (nearest; MX scale rule truncation_free or floor). */
static fp4rl_tensor *quant(fp4rl_context *ctx, fp4rl_dtype fmt, int tile, int tf, const float *x, int64_t R, int64_t K)
{
    const int64_t shape[2] = {R, K};
    fp4rl_tensor *src = NULL, *q = NULL;
    OKG(fp4rl_tensor_from_host(&src, ctx, FP4RL_DTYPE_F32, 2, shape, x));
    fp4rl_quant_policy *p = NULL;
    OKG(fp4rl_quant_policy_create(&p));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_SCALE_RULE, tf ? FP4RL_SCALE_TRUNCATION_FREE : FP4RL_SCALE_OCP_FLOOR));
    OKG(fp4rl_quantize(&q, ctx, src, fmt, p, FP4RL_ROLE_WEIGHT));
    fp4rl_tensor_destroy(src);
    fp4rl_quant_policy_destroy(p);
    return q;
}

/* A pre-passed operand on the GPU. */
typedef struct op8 {
    uint8_t *b;
    float *s;
    int64_t rows, K;
    int U;
} op8;
static op8 prepass(const fp4rl_tensor *q)
{
    op8 o = {NULL, NULL, q->q.rows, q->q.cols, fp4rl_cuda_fp8_unit(q)};
    o.b = dev(NULL, (size_t)(o.rows * o.K));
    o.s = dev(NULL, fp4rl_cuda_fp8_scales_bytes(o.rows, o.K, o.U));
    OKG(fp4rl_cuda_fp8_prepass(gpu, q, o.b, o.s));
    return o;
}
static void op8_free(op8 *o)
{
    gpu->be->free(gpu, o->b);
    gpu->be->free(gpu, o->s);
}
/* The exact values of a pre-passed operand on the host: byte value times unit scale. */
static float *op8_values(const op8 *o)
{
    uint8_t *b = host(o->b, (size_t)(o->rows * o->K));
    float *s = host(o->s, fp4rl_cuda_fp8_scales_bytes(o->rows, o->K, o->U));
    float *v = malloc((size_t)(o->rows * o->K) * sizeof(float));
    const int64_t ld = FP4RL_FP8_SCALE_LD(o->rows);
    for (int64_t r = 0; r < o->rows; r++)
        for (int64_t k = 0; k < o->K; k++) v[r * o->K + k] = fp4rl_e4m3_decode(b[r * o->K + k]) * s[(k / o->U) * ld + r];
    free(b);
    free(s);
    return v;
}

static const int64_t MS[] = {1, 3, 8, 16, 17, 64, 100, 128, 256};
/* The wgmma kernel's cases (FP4RL_D8_WGMMA=1): its M tiles n8 .. n64, a ragged 100, grid y > 1. */
static const int64_t MS_WG[] = {1, 7, 64, 100, 128, 256};
static int wg_mode; /* set while FP4RL_D8_WGMMA=1: the MS_WG rows, the default split-K */
/* The persistent kernel's cases (FP4RL_D8_PERSIST=1, fp4rl_cuda_d8_gemm_tiles): M <= 64, its n8 .. n64 tiles. */
static const int64_t MS_P[] = {1, 3, 8, 16, 64};
static int p_mode; /* set while FP4RL_D8_PERSIST=1: the MS_P rows, the re-laid-out weight, the default split-K */

/* (a) and (b) for one weight shape and format: every M of MS (a subset when quick or big). */
static void gemm_case(fp4rl_dtype fmt, int tile, int64_t N, int64_t K)
{
    float *xw = rand_rows(N, K);
    fp4rl_tensor *qw = quant(gpu, fmt, tile, 1, xw, N, K);
    op8 w8 = prepass(qw);
    float *wv = op8_values(&w8);
    const int big = N * K > 4000000;
    const int64_t *ms = p_mode ? MS_P : wg_mode ? MS_WG : MS;
    const size_t nms = p_mode ? sizeof MS_P / sizeof MS_P[0] : wg_mode ? sizeof MS_WG / sizeof MS_WG[0] : sizeof MS / sizeof MS[0];
    void *tiles = NULL; /* p_mode: the weight re-laid out once, as a caller would per weight sync */
    if (p_mode) OKG(fp4rl_cuda_d8_relayout(gpu, qw, &tiles, NULL));
    for (size_t mi = 0; mi < nms; mi++) {
        const int64_t M = ms[mi];
        if ((quick || (big && !wg_mode && !p_mode)) && M != 1 && M != 17 && M != 64 && M != 256) continue;
        float *xa = rand_rows(M, K);
        fp4rl_tensor *qa = quant(gpu, fmt, 0, 1, xa, M, K);
        op8 a8 = prepass(qa);
        for (int bf = 0; bf < 2; bf++) {
            const size_t cb = (size_t)(M * N) * (bf ? 2 : 4);
            void *cref = dev(NULL, cb), *c1 = dev(NULL, cb), *cs = dev(NULL, cb);
            OKG(fp4rl_cuda_fp8_gemm_ref(gpu, a8.b, a8.s, w8.b, w8.s, cref, bf, M, N, K, w8.U));
            /* wgmma and persistent: the kernel's own split (0; at most 32 slices, the bound's slice term) */
            const int slices = wg_mode || p_mode ? 0 : (int)(mi % 3) + 2 + (K >= 2048 ? 5 : 0), bound_slices = slices ? slices : 32;
            if (p_mode) {
                OKG(fp4rl_cuda_d8_gemm_tiles(gpu, a8.b, a8.s, M, qw, tiles, c1, bf, N, 1));
                OKG(fp4rl_cuda_d8_gemm_tiles(gpu, a8.b, a8.s, M, qw, tiles, cs, bf, N, slices));
            } else {
                OKG(fp4rl_cuda_d8_gemm(gpu, a8.b, a8.s, M, qw, c1, bf, N, 1));
                OKG(fp4rl_cuda_d8_gemm(gpu, a8.b, a8.s, M, qw, cs, bf, N, slices));
            }
            uint8_t *hr = host(cref, cb), *h1 = host(c1, cb), *hs = host(cs, cb);
            int64_t first = -1;
            for (int64_t i = 0; i < (int64_t)cb && first < 0; i++)
                if (hr[i] != h1[i]) first = i / (bf ? 2 : 4);
            ck_assert_msg(first < 0, "%s%s tile %d %lldx%lldx%lld %s: one slice differs from the reference at output %lld (m %lld, n %lld)",
                          p_mode ? "persistent " : wg_mode ? "wgmma " : "", fmt == FP4RL_DTYPE_HIF4 ? "HiF4" : "MXFP4", tile, (long long)M, (long long)N, (long long)K,
                          bf ? "bf16" : "f32",
                          (long long)first, (long long)(first / N), (long long)(first % N));
            /* (b): a sample of the split-K outputs (all of them for small products) */
            float *av = op8_values(&a8);
            const int all = M * N <= 20000;
            const int64_t samples = all ? M * N : 4000;
            /* BF16 output: one rounding of unit roundoff 2^-8 (8 significant bits), |ref| <= S */
            const double rel = (bf ? 0x1p-8 : 0.0) + (double)(2 * (K / w8.U) + 2 + bound_slices) * 0x1p-24;
            for (int64_t sI = 0; sI < samples; sI++) {
                const int64_t m = all ? sI / N : (int64_t)(unif() * (double)M), n = all ? sI % N : (int64_t)(unif() * (double)N);
                double ref = 0.0, S = 0.0;
                for (int64_t k = 0; k < K; k++) {
                    const double pr = (double)av[m * K + k] * (double)wv[n * K + k];
                    ref += pr;
                    S += fabs(pr);
                }
                float got;
                if (bf) {
                    const uint32_t u = (uint32_t)((uint16_t *)hs)[m * N + n] << 16;
                    memcpy(&got, &u, 4);
                } else {
                    got = ((float *)hs)[m * N + n];
                }
                ck_assert_msg(fabs((double)got - ref) <= rel * S, "split-K %d, %lldx%lldx%lld: c[%lld,%lld] = %.9g, exact %.9g (S %.6g)", slices,
                              (long long)M, (long long)N, (long long)K, (long long)m, (long long)n, (double)got, ref, S);
            }
            free(av);
            free(hr);
            free(h1);
            free(hs);
            gpu->be->free(gpu, cref);
            gpu->be->free(gpu, c1);
            gpu->be->free(gpu, cs);
        }
        op8_free(&a8);
        fp4rl_tensor_destroy(qa);
        free(xa);
    }
    if (tiles) gpu->be->free(gpu, tiles);
    free(wv);
    op8_free(&w8);
    fp4rl_tensor_destroy(qw);
    free(xw);
}

START_TEST(test_gemm_small)
{
    /* ragged: N not a multiple of the CTA's 128 rows, K one unit, K not a multiple of the 128-k chunk */
    static const int64_t shapes[][2] = {{1, 64}, {77, 64}, {130, 192}, {300, 320}, {256, 2048}};
    for (int f = 0; f < 2; f++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            if (quick && i == 4) continue;
            gemm_case(f ? FP4RL_DTYPE_MXFP4 : FP4RL_DTYPE_HIF4, 0, shapes[i][0], shapes[i][1]);
        }
    gemm_case(FP4RL_DTYPE_MXFP4, 32, 200, 96); /* MXFP4 32 x 32 tiles; K = 3 units */
    gemm_case(FP4RL_DTYPE_MXFP4, 0, 64, 32);   /* one MX unit */
}
END_TEST

START_TEST(test_gemm_3b)
{
    static const int64_t shapes[][2] = {{2048, 2048}, {11008, 2048}, {2048, 11008}};
    for (int f = 0; f < 2; f++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) gemm_case(f ? FP4RL_DTYPE_MXFP4 : FP4RL_DTYPE_HIF4, 0, shapes[i][0], shapes[i][1]);
}
END_TEST

/* The wgmma kernel (FP4RL_D8_WGMMA=1, read at every call) against the same reference: one slice
 * memcmp-equal, the default split within the bound; HiF4 1D and 2D (64 x 64 words), MXFP4 1D and
 * 32 x 32 tiles; ragged N (not a multiple of the CTA's 128 rows nor of wgmma's 64) and K (not a
 * multiple of the 128-k chunk), and the 3B shapes (not when quick). Where the device is not an
 * sm_90 one or the build has no sm_90a code the switch is ignored and this reruns the mma.sync
 * kernel (still a valid check, of nothing new). */
START_TEST(test_gemm_wgmma)
{
    static const int64_t shapes[][2] = {{77, 64}, {130, 192}, {300, 320}, {2048, 2048}, {256, 2048}, {11008, 2048}, {2048, 11008}};
    static const struct { fp4rl_dtype fmt; int tile; } fmts[] = {
        {FP4RL_DTYPE_HIF4, 0}, {FP4RL_DTYPE_HIF4, 64}, {FP4RL_DTYPE_MXFP4, 0}, {FP4RL_DTYPE_MXFP4, 32}};
    setenv("FP4RL_D8_WGMMA", "1", 1);
    wg_mode = 1;
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            if (quick && i >= 3) continue;
            if (fmts[f].tile && i >= 4) continue; /* the 2D tiles: the small shapes and one 3B shape */
            gemm_case(fmts[f].fmt, fmts[f].tile, shapes[i][0], shapes[i][1]);
        }
    wg_mode = 0;
    unsetenv("FP4RL_D8_WGMMA");
}
END_TEST

/* The persistent kernel (FP4RL_D8_PERSIST=1, read at every call, with the weight re-laid out by
 * fp4rl_cuda_d8_relayout) against the same reference: one slice memcmp-equal (so also d8_kernel's
 * one-slice bits), its own default split within the bound; HiF4 1D and 2D (64 x 64 words), MXFP4
 * 1D and 32 x 32 tiles; N ragged (77, 300: row blocks of 128 padded with zero rows) and not, K one
 * unit (64), ragged (320: a half 128-k chunk, a one-chunk ring stage) and not; M 1 .. 64. Where the
 * device is not sm_90+ or the build has no sm_90 code the switch is ignored and this reruns the
 * mma.sync kernel through fp4rl_cuda_d8_gemm_tiles's fallback. */
START_TEST(test_gemm_persist)
{
    static const int64_t Ns[] = {77, 300, 2048, 11008}, Ks[] = {64, 320, 2048, 11008};
    static const struct { fp4rl_dtype fmt; int tile; } fmts[] = {
        {FP4RL_DTYPE_HIF4, 0}, {FP4RL_DTYPE_HIF4, 64}, {FP4RL_DTYPE_MXFP4, 0}, {FP4RL_DTYPE_MXFP4, 32}};
    setenv("FP4RL_D8_PERSIST", "1", 1);
    p_mode = 1;
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t i = 0; i < sizeof Ns / sizeof Ns[0]; i++)
            for (size_t j = 0; j < sizeof Ks / sizeof Ks[0]; j++) {
                if (Ns[i] * Ks[j] > (quick ? 1000000 : 30000000)) continue; /* not 11008 x 11008; quick: the small ones */
                gemm_case(fmts[f].fmt, fmts[f].tile, Ns[i], Ks[j]);
            }
    p_mode = 0;
    unsetenv("FP4RL_D8_PERSIST");
}
END_TEST

/* The host pre-pass of a CPU-quantized [R, K] tensor into rows r0.. of (bytes [*, Kp], scales with
 * leading dimension ld): the pre-pass's values, E4M3 of 4 x value (HiF4) / 2 x value (MXFP4) and
 * the unit scale base / 4 / 2^e / 2; NaN units' scale the NaN 0x7fc00000; padding k bytes 0. */
static void host_prepass(const fp4rl_tensor *q, int64_t r0, uint8_t *out, float *sc, int64_t Kp, int64_t ld)
{
    const int64_t R = q->q.rows, K = q->q.cols, rb = q->q.row_bytes, scols = q->q.scale_cols;
    const int hif4 = q->dtype == FP4RL_DTYPE_HIF4, U = hif4 ? 64 : 32;
    uint8_t *codes = malloc((size_t)(R * rb));
    OKG(fp4rl_tensor_codes_to_host(q, codes, (size_t)(R * rb)));
    const size_t sbytes = (size_t)(R * scols) * (hif4 ? 4 : 1);
    uint8_t *scales = malloc(sbytes);
    OKG(fp4rl_tensor_scales_to_host(q, scales, sbytes));
    const float qnan = fp4rl_bits_f32(0x7fc00000u);
    for (int64_t r = 0; r < R; r++)
        for (int64_t u = 0; u < Kp / U; u++) {
            float s;
            uint32_t word = 0;
            if (hif4) {
                memcpy(&word, scales + 4 * (r * scols + u), 4);
                s = fp4rl_hif4_word_base_bits(word) == FP4RL_HIF4_NAN_WORD ? qnan : fp4rl_hif4_word_base(word) * 0.25f;
            } else {
                const uint8_t e = scales[r * scols + u];
                s = e == FP4RL_E8M0_NAN ? qnan : fp4rl_e8m0_decode(e) * 0.5f;
            }
            sc[u * ld + r0 + r] = s;
            for (int j = 0; j < U; j++) {
                const int64_t k = u * U + j;
                const uint8_t code = k < K ? fp4rl_code_get(codes, rb, 4, r, k) : 0;
                float v;
                if (hif4) {
                    const float m = (float)(code & 7u) * (float)(1 << fp4rl_hif4_word_inc(word, j));
                    v = (code & 8u) ? -m : m;
                } else {
                    v = 2.0f * fp4rl_e2m1_decode(code);
                }
                out[(r0 + r) * Kp + k] = fp4rl_e4m3_encode(v, -1.0f);
            }
        }
    free(codes);
    free(scales);
}

/* (c) one activation case */
static void act_case(fp4rl_dtype fmt, int tf, int resq, int64_t N, int64_t K, int specials)
{
    const int U = fmt == FP4RL_DTYPE_HIF4 ? 64 : 32;
    const int64_t Kp = (K + U - 1) / U * U, rows = resq ? 2 * N : N, ld = FP4RL_FP8_SCALE_LD(rows);
    float *x = rand_rows(N, K);
    if (specials) {
        x[0] = NAN;
        x[(N - 1) * K + K - 1] = INFINITY;
        for (int64_t k = 0; k < K && N > 2; k++) x[K + k] = 0.0f; /* a zero row */
    }
    const size_t ob = (size_t)(rows * Kp), sb = (size_t)((Kp / U) * ld) * 4;
    float *xd = dev(x, (size_t)(N * K) * 4);
    uint8_t *od = dev(NULL, ob);
    float *sd = dev(NULL, sb);
    unsigned long long *cd = dev(NULL, 16), zero[2] = {0, 0};
    OKG(gpu->be->upload(gpu, cd, zero, 16));
    OKG(fp4rl_cuda_act_e4m3(gpu, od, sd, xd, N, K, fmt, tf, resq, cd));
    uint8_t *og = host(od, ob);
    float *sg = host(sd, sb);
    unsigned long long *cg = host(cd, 16);

    uint8_t *oh = calloc(ob, 1);
    float *sh = calloc(sb, 1);
    fp4rl_tensor *q = quant(cpu, fmt, 0, tf, x, N, K);
    host_prepass(q, 0, oh, sh, Kp, ld);
    fp4rl_tensor *deq = NULL;
    OKG(fp4rl_dequantize(&deq, cpu, q, FP4RL_DTYPE_F32));
    float *y = malloc((size_t)(N * K) * 4);
    OKG(fp4rl_tensor_to_host(deq, y, (size_t)(N * K) * 4));
    unsigned long long nz = 0, under = 0;
    for (int64_t i = 0; i < N * K; i++) nz += x[i] != 0.0f, under += x[i] != 0.0f && y[i] == 0.0f;
    if (resq) {
        float *r = malloc((size_t)(N * K) * 4);
        for (int64_t i = 0; i < N * K; i++) r[i] = x[i] - y[i];
        fp4rl_tensor *qr = quant(cpu, fmt, 0, tf, r, N, K), *dr = NULL;
        host_prepass(qr, N, oh, sh, Kp, ld);
        if (resq == FP4RL_RESQ_2_4) { /* rollout_act's mask on the decoded residual, groups of 4 along K */
            OKG(fp4rl_dequantize(&dr, cpu, qr, FP4RL_DTYPE_F32));
            OKG(fp4rl_tensor_to_host(dr, r, (size_t)(N * K) * 4));
            for (int64_t n = 0; n < N; n++)
                for (int64_t k0 = 0; k0 < K; k0 += 4) {
                    float g[4] = {0, 0, 0, 0}, m[4];
                    for (int j = 0; j < 4 && k0 + j < K; j++) g[j] = r[n * K + k0 + j];
                    memcpy(m, g, sizeof m);
                    fp4rl_mask_2_4_group(m, 4);
                    for (int j = 0; j < 4 && k0 + j < K; j++)
                        if (fp4rl_f32_bits(m[j]) != fp4rl_f32_bits(g[j])) oh[(N + n) * Kp + k0 + j] = 0; /* dropped, -0 too */
                }
            fp4rl_tensor_destroy(dr);
        }
        fp4rl_tensor_destroy(qr);
        free(r);
    }
    for (size_t i = 0; i < ob; i++)
        ck_assert_msg(og[i] == oh[i], "act %s tf %d resq %d %lldx%lld: byte (%lld, %lld) = 0x%02x, expected 0x%02x", fmt == FP4RL_DTYPE_HIF4 ? "HiF4" : "MXFP4",
                      tf, resq, (long long)N, (long long)K, (long long)(i / Kp), (long long)(i % Kp), og[i], oh[i]);
    for (size_t i = 0; i < sb / 4; i++) {
        uint32_t a, b;
        memcpy(&a, &sg[i], 4);
        memcpy(&b, &sh[i], 4);
        ck_assert_msg(a == b, "act %s resq %d %lldx%lld: scale (unit %lld, row %lld) = 0x%08x, expected 0x%08x", fmt == FP4RL_DTYPE_HIF4 ? "HiF4" : "MXFP4", resq,
                      (long long)N, (long long)K, (long long)(i / ld), (long long)(i % ld), a, b);
    }
    ck_assert_msg(cg[0] == nz && cg[1] == under, "act counts %llu %llu, expected %llu %llu", cg[0], cg[1], nz, under);
    fp4rl_tensor_destroy(deq);
    fp4rl_tensor_destroy(q);
    free(y), free(x), free(og), free(sg), free(cg), free(oh), free(sh);
    gpu->be->free(gpu, xd), gpu->be->free(gpu, od), gpu->be->free(gpu, sd), gpu->be->free(gpu, cd);
}

START_TEST(test_act)
{
    static const int64_t shapes[][2] = {{1, 64}, {5, 100}, {3, 2048}, {130, 320}, {17, 40}};
    static const int resqs[3] = {FP4RL_RESQ_OFF, FP4RL_RESQ_DENSE, FP4RL_RESQ_2_4};
    for (int f = 0; f < 2; f++)
        for (int ri = 0; ri < 3; ri++)
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
                const fp4rl_dtype fmt = f ? FP4RL_DTYPE_MXFP4 : FP4RL_DTYPE_HIF4;
                act_case(fmt, 0, resqs[ri], shapes[i][0], shapes[i][1], (int)(i & 1));
                if (f) act_case(fmt, 1, resqs[ri], shapes[i][0], shapes[i][1], (int)(i & 1) ^ 1);
            }
}
END_TEST

/* (c) once more through the GEMM: the act operand of a ResQ pair against the weight, one slice,
 * equals the reference on it (the d8 path end to end). */
START_TEST(test_act_gemm)
{
    const int64_t N = 300, K = 256, M = 5;
    for (int f = 0; f < 2; f++) {
        const fp4rl_dtype fmt = f ? FP4RL_DTYPE_MXFP4 : FP4RL_DTYPE_HIF4;
        const int U = f ? 32 : 64;
        float *xw = rand_rows(N, K), *x = rand_rows(M, K);
        fp4rl_tensor *qw = quant(gpu, fmt, 0, 1, xw, N, K);
        op8 w8 = prepass(qw);
        const int64_t ld = FP4RL_FP8_SCALE_LD(2 * M);
        float *xd = dev(x, (size_t)(M * K) * 4), *sd = dev(NULL, (size_t)((K / U) * ld) * 4);
        uint8_t *od = dev(NULL, (size_t)(2 * M * K));
        OKG(fp4rl_cuda_act_e4m3(gpu, od, sd, xd, M, K, fmt, 1, FP4RL_RESQ_2_4, NULL));
        void *c1 = dev(NULL, (size_t)(2 * M * N) * 4), *c2 = dev(NULL, (size_t)(2 * M * N) * 4);
        OKG(fp4rl_cuda_d8_gemm(gpu, od, sd, 2 * M, qw, c1, 0, N, 1));
        OKG(fp4rl_cuda_fp8_gemm_ref(gpu, od, sd, w8.b, w8.s, c2, 0, 2 * M, N, K, U));
        uint8_t *h1 = host(c1, (size_t)(2 * M * N) * 4), *h2 = host(c2, (size_t)(2 * M * N) * 4);
        ck_assert(memcmp(h1, h2, (size_t)(2 * M * N) * 4) == 0);
        free(h1), free(h2), free(xw), free(x);
        gpu->be->free(gpu, xd), gpu->be->free(gpu, sd), gpu->be->free(gpu, od), gpu->be->free(gpu, c1), gpu->be->free(gpu, c2);
        op8_free(&w8);
        fp4rl_tensor_destroy(qw);
    }
}
END_TEST

/* (d) refusals: an error status and a message, nothing launched. */
START_TEST(test_refusals)
{
    float *x = rand_rows(64, 100);
    fp4rl_tensor *q = quant(gpu, FP4RL_DTYPE_HIF4, 0, 1, x, 64, 100); /* K = 100: not whole units */
    uint8_t *a8 = dev(NULL, 64 * 128);
    float *sa = dev(NULL, 4096), *c = dev(NULL, 64 * 64 * 4);
    ck_assert_int_eq(fp4rl_cuda_d8_gemm(gpu, a8, sa, 1, q, c, 0, 64, 0), FP4RL_ERR_UNSUPPORTED);
    ck_assert(fp4rl_last_error()[0] != 0);
    void *tiles = NULL;
    ck_assert_int_eq(fp4rl_cuda_d8_relayout(gpu, q, &tiles, NULL), FP4RL_ERR_UNSUPPORTED);
    ck_assert(tiles == NULL);
    ck_assert_int_ne(fp4rl_cuda_d8_gemm_tiles(gpu, a8, sa, 1, q, NULL, c, 0, 64, 0), FP4RL_OK);
    fp4rl_tensor_destroy(q);
    q = quant(gpu, FP4RL_DTYPE_HIF4, 0, 1, x, 50, 64);
    ck_assert_int_ne(fp4rl_cuda_d8_gemm(gpu, NULL, sa, 1, q, c, 0, 50, 0), FP4RL_OK);
    ck_assert_int_ne(fp4rl_cuda_d8_gemm(gpu, a8, NULL, 1, q, c, 0, 50, 0), FP4RL_OK);
    ck_assert_int_ne(fp4rl_cuda_d8_gemm(gpu, a8, sa, 1, q, NULL, 0, 50, 0), FP4RL_OK);
    ck_assert_int_ne(fp4rl_cuda_d8_gemm(gpu, a8, sa, 1, NULL, c, 0, 50, 0), FP4RL_OK);
    ck_assert_int_eq(fp4rl_cuda_d8_gemm(gpu, a8, sa, 0, q, c, 0, 50, 0), FP4RL_ERR_UNSUPPORTED);
    ck_assert_int_eq(fp4rl_cuda_d8_gemm(gpu, a8, sa, 257, q, c, 0, 50, 0), FP4RL_ERR_UNSUPPORTED);
    ck_assert_int_eq(fp4rl_cuda_d8_gemm(gpu, a8, sa, 1, q, c, 0, 10, 0), FP4RL_ERR_UNSUPPORTED); /* ldc < N */
    ck_assert_int_eq(fp4rl_cuda_d8_gemm(gpu, a8 + 1, sa, 1, q, c, 0, 50, 0), FP4RL_ERR_UNSUPPORTED);
    fp4rl_tensor_destroy(q);
    q = quant(gpu, FP4RL_DTYPE_MXFP8_E4M3, 0, 1, x, 50, 64); /* wrong dtype */
    ck_assert_int_eq(fp4rl_cuda_d8_gemm(gpu, a8, sa, 1, q, c, 0, 50, 0), FP4RL_ERR_UNSUPPORTED);
    fp4rl_tensor_destroy(q);
    ck_assert_int_ne(fp4rl_cuda_act_e4m3(gpu, NULL, sa, c, 1, 64, FP4RL_DTYPE_HIF4, 0, 0, NULL), FP4RL_OK);
    ck_assert_int_ne(fp4rl_cuda_act_e4m3(gpu, a8, sa, c, 1, 64, FP4RL_DTYPE_NVFP4, 0, 0, NULL), FP4RL_OK);
    ck_assert_int_ne(fp4rl_cuda_act_e4m3(gpu, a8, sa, c, 1, 64, FP4RL_DTYPE_HIF4, 0, 7, NULL), FP4RL_OK);
    ck_assert_int_ne(fp4rl_cuda_act_e4m3(gpu, a8, sa, c, 0, 64, FP4RL_DTYPE_HIF4, 0, 0, NULL), FP4RL_OK);
    gpu->be->free(gpu, a8), gpu->be->free(gpu, sa), gpu->be->free(gpu, c);
    free(x);
}
END_TEST

static void setup(void)
{
    ck_assert_int_eq(fp4rl_context_create(&gpu, FP4RL_DEVICE_CUDA, 0), FP4RL_OK);
    ck_assert_int_eq(fp4rl_context_create(&cpu, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
}
static void teardown(void)
{
    fp4rl_context_destroy(gpu);
    fp4rl_context_destroy(cpu);
}

int main(void)
{
    if (fp4rl_gpu_or_skip("test_decode_fp8")) return 77;
    quick = getenv("FP4RL_D8_QUICK") && atoi(getenv("FP4RL_D8_QUICK"));
    Suite *s = suite_create("decode_fp8");
    TCase *tc = tcase_create("d8");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 1800);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_act);
    tcase_add_test(tc, test_act_gemm);
    tcase_add_test(tc, test_gemm_small);
    if (!quick) tcase_add_test(tc, test_gemm_3b);
    tcase_add_test(tc, test_gemm_wgmma); /* a failure leaves FP4RL_D8_WGMMA set: only test_gemm_persist after it */
    tcase_add_test(tc, test_gemm_persist); /* last: a failure leaves FP4RL_D8_PERSIST set */
    suite_add_tcase(s, tc);
    return fp4rl_check_run_nofork(s);
}
