/*
 * test_w4b.c - the packed-weight GEMM with BF16 activations (cuda/decode_w4b.h) on the GPU:
 * (a) dequantization bit for bit: with X the identity (M = K rows), C[m, n] is one product
 *     1 * W[n, m] (and zeros: NaN where row n of W has a NaN, 0 * NaN being NaN), so every
 *     output must equal fp4rl_dequantize's value of the weight exactly
 *     (HiF4 1D / 64 x 64 words, MXFP4 1D / 32 x 32 tiles; weight rows scaled by 2^-60 .. 2^14 and
 *     NaN units, so the scale paths' exponent range and NaN are covered; one K slice and split-K);
 * (b) random BF16 X: every sampled output within FP32 summation's bound of the float64 sum of the
 *     exact products, |c - exact| <= (K + 2 + slices) 2^-24 S (S = sum |x w|), with and without
 *     bias; M from 1 to 300 (every activation tile, ragged), N ragged and the 3B shapes, the
 *     default split and forced ones; two runs memcmp-equal (deterministic; with a forced split, the
 *     sum by the tiles' last CTAs, by wb_reduce and in a thread-block cluster, FP4RL_W4B_REDUCE=2);
 * (c) bad arguments refused with an error;
 * (d) fp4rl_cuda_w4b_pack (HiF4, and MXFP4 with scale codes <= 128, re-laid out for wp_kernel): the
 *     GEMM's results bit for bit those of the weight as stored, and (a), (b) run on re-laid-out
 *     weights too (MXFP4 down to scale code 0: BF16 subnormal weights); MXFP4 with larger scales
 *     is left as stored; NVFP4 (1D, 16 x 16), which the kernel reads re-laid out only, with its tensor
 *     scale as the epilogue's alpha: (a) and (b) too.
 * Label `gpu`: exits 77 (skipped) without a GPU; where the device is not compute capability 9.0 or
 * the build has no sm_90a code, fp4rl_cuda_w4b_ok is 0 and the GEMM cases are skipped (the
 * refusals still run).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "decode_w4b.h"
#include "format/formats.h"
#include "runtime/internal.h"

static fp4rl_context *gpu;
static int have; /* fp4rl_cuda_w4b_ok on this device and build */

#define OKG(call) ck_assert_msg((call) == FP4RL_OK, "%s: %s", #call, fp4rl_last_error())

#define TEST_RAND_SEED 0x2545F4914F6CDD1Dull
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

/* W [N, K] on the GPU, quantized (nearest), and its dequantized values on the host. extreme 1: rows
 * scaled by 2^-60 .. 2^14 and a few NaN elements (their units decode to NaN); 2: (MXFP4 that
 * fp4rl_cuda_w4b_pack re-lays out) rows by 2^-66 .. 2^-7 and, a third of the row blocks, 2^-128
 * (scale code 0, BF16 subnormal weights), no NaN. pack: re-laid out, which every case here must be. */
static fp4rl_tensor *weight(fp4rl_dtype fmt, int tile, int pack, int64_t N, int64_t K, int extreme, float **values)
{
    float *x = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t r = 0; r < N; r++) {
        const int64_t rb = tile ? r / tile : r;
        const float rs = extreme == 2 ? ldexpf(1.0f, rb % 3 == 1 ? -128 : (int)(rb % 60) - 66)
                         : extreme ? ldexpf(1.0f, (int)(r % 75) - 60)
                                   : 0.05f * (float)(1 + r % 5);
        for (int64_t k = 0; k < K; k++) x[r * K + k] = rs * gauss() * (1.0f + (float)(k % 7));
    }
    if (extreme == 1)
        for (int64_t i = 0; i < N * K; i += 977) x[i] = NAN;
    const int64_t shape[2] = {N, K};
    fp4rl_tensor *src = NULL, *q = NULL, *dq = NULL;
    OKG(fp4rl_tensor_from_host(&src, gpu, FP4RL_DTYPE_F32, 2, shape, x));
    fp4rl_quant_policy *p = NULL;
    OKG(fp4rl_quant_policy_create(&p));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile));
    OKG(fp4rl_quantize(&q, gpu, src, fmt, p, FP4RL_ROLE_WEIGHT));
    OKG(fp4rl_dequantize(&dq, gpu, q, FP4RL_DTYPE_F32));
    *values = malloc((size_t)(N * K) * sizeof(float));
    OKG(fp4rl_tensor_to_host(dq, *values, (size_t)(N * K) * sizeof(float)));
    if (pack) {
        OKG(fp4rl_cuda_w4b_pack(gpu, q));
        ck_assert_int_eq(q->layout, FP4RL_LAYOUT_W4B);
    }
    fp4rl_tensor_destroy(src);
    fp4rl_tensor_destroy(dq);
    fp4rl_quant_policy_destroy(p);
    free(x);
    return q;
}

static const struct {
    fp4rl_dtype fmt;
    int tile, pack; /* pack: re-laid out by fp4rl_cuda_w4b_pack (NVFP4 always) */
    const char *name;
} FMTS[] = {{FP4RL_DTYPE_HIF4, 0, 0, "HiF4"},
            {FP4RL_DTYPE_MXFP4, 0, 0, "MXFP4"},
            {FP4RL_DTYPE_HIF4, 0, 1, "HiF4 re-laid out"},
            {FP4RL_DTYPE_MXFP4, 0, 1, "MXFP4 re-laid out"},
            {FP4RL_DTYPE_HIF4, 64, 0, "HiF4 64x64"},
            {FP4RL_DTYPE_MXFP4, 32, 0, "MXFP4 32x32"},
            {FP4RL_DTYPE_HIF4, 64, 1, "HiF4 64x64 re-laid out"},
            {FP4RL_DTYPE_MXFP4, 32, 1, "MXFP4 32x32 re-laid out"},
            {FP4RL_DTYPE_NVFP4, 0, 1, "NVFP4 re-laid out"},
            {FP4RL_DTYPE_NVFP4, 16, 1, "NVFP4 16x16 re-laid out"}};
/* The extreme weights of format f (MXFP4 re-laid out: the range it is re-laid out in). */
static int extreme_of(size_t f) { return FMTS[f].pack && FMTS[f].fmt == FP4RL_DTYPE_MXFP4 ? 2 : 1; }

/* (a): X = I [K, K]; c[m, n] must be W[n, m] (NaN where W is NaN; +-0 alike). */
START_TEST(test_identity)
{
    if (!have) return;
    static const int64_t shapes[][2] = {{300, 192}, {77, 128}, {520, 64}};
    for (size_t f = 0; f < sizeof FMTS / sizeof FMTS[0]; f++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int split = 0; split < 2; split++) {
                const int64_t N = shapes[si][0], K = shapes[si][1], M = K;
                float *wv = NULL;
                fp4rl_tensor *q = weight(FMTS[f].fmt, FMTS[f].tile, FMTS[f].pack, N, K, extreme_of(f), &wv);
                uint16_t *xi = calloc((size_t)(M * K), sizeof(uint16_t));
                for (int64_t i = 0; i < K; i++) xi[i * K + i] = 0x3F80u; /* 1.0 */
                uint16_t *dx = dev(xi, (size_t)(M * K) * 2);
                float *dc = dev(NULL, (size_t)(M * N) * 4);
                OKG(fp4rl_cuda_w4b_gemm(gpu, dc, N, dx, M, q, NULL, split ? 2 : 1));
                float *c = host(dc, (size_t)(M * N) * 4);
                /* a NaN anywhere in row n makes every c[., n] NaN: 0 * NaN = NaN in the other k */
                int64_t bad = 0, first = -1, nans = 0;
                char *nanrow = calloc((size_t)N, 1);
                for (int64_t i = 0; i < N * K; i++) nanrow[i / K] |= (char)isnan(wv[i]);
                for (int64_t m = 0; m < M; m++)
                    for (int64_t n = 0; n < N; n++) {
                        const float want = nanrow[n] ? NAN : wv[n * K + m], got = c[m * N + n];
                        nans += isnan(want);
                        const int ok = isnan(want) ? isnan(got) : got == want;
                        if (!ok && first < 0) first = m * N + n;
                        bad += !ok;
                    }
                ck_assert_msg(nans > 0 || extreme_of(f) == 2, "the extreme weight has NaN units");
                ck_assert_msg(bad == 0, "%s %lldx%lld split %d: %lld outputs differ from the dequantized weight, first c[%lld, %lld] = %a, w = %a",
                              FMTS[f].name, (long long)N, (long long)K, split, (long long)bad, (long long)(first / N), (long long)(first % N),
                              (double)c[first], (double)wv[(first % N) * K + first / N]);
                free(c);
                free(xi);
                free(wv);
                free(nanrow);
                gpu->be->free(gpu, dx);
                gpu->be->free(gpu, dc);
                fp4rl_tensor_destroy(q);
            }
    printf("identity: every format and tile, one slice and two, bit for bit the dequantized weights\n");
}
END_TEST

/* (b) for one weight: every M of ms, bias or not, default split and `slices` forced. */
static void gemm_case(size_t f, int64_t N, int64_t K, const int64_t *ms, size_t nms, int slices)
{
    float *wv = NULL;
    fp4rl_tensor *q = weight(FMTS[f].fmt, FMTS[f].tile, FMTS[f].pack, N, K, 0, &wv);
    float *bias = malloc((size_t)N * 4);
    for (int64_t n = 0; n < N; n++) bias[n] = gauss();
    float *dbias = dev(bias, (size_t)N * 4);
    for (size_t mi = 0; mi < nms; mi++) {
        const int64_t M = ms[mi];
        uint16_t *x = malloc((size_t)(M * K) * 2);
        for (int64_t i = 0; i < M * K; i++) x[i] = fp4rl_f32_to_bf16(gauss() * (1.0f + (float)(i % 5)));
        uint16_t *dx = dev(x, (size_t)(M * K) * 2);
        const int64_t ldc = N + 3; /* a padded C */
        float *dc = dev(NULL, (size_t)(M * ldc) * 4), *dc2 = dev(NULL, (size_t)(M * ldc) * 4);
        for (int mode = 0; mode < 3; mode++) { /* 0: default split, no bias; 1: default, bias; 2: forced split, bias */
            const int sl = mode == 2 ? slices : 0;
            const float *b = mode ? dbias : NULL;
            /* mode 2: the split-K sum by the tiles' last CTAs, by wb_reduce and (opt-in) in a
             * thread-block cluster: the same order, the same bits */
            if (mode == 2) setenv("FP4RL_W4B_REDUCE", "0", 1);
            OKG(fp4rl_cuda_w4b_gemm(gpu, dc, ldc, dx, M, q, b, sl));
            if (mode == 2) setenv("FP4RL_W4B_REDUCE", "1", 1);
            OKG(fp4rl_cuda_w4b_gemm(gpu, dc2, ldc, dx, M, q, b, sl));
            float *c = host(dc, (size_t)(M * ldc) * 4), *c2 = host(dc2, (size_t)(M * ldc) * 4);
            for (int run = 0; run < (mode == 2 ? 2 : 1); run++) {
                for (int64_t m = 0; m < M; m++)
                    ck_assert_msg(!memcmp(c + m * ldc, c2 + m * ldc, (size_t)N * 4), "%s %lldx%lldx%lld mode %d%s: two runs differ", FMTS[f].name,
                                  (long long)M, (long long)N, (long long)K, mode, run ? " (cluster sum)" : "");
                if (mode == 2 && run == 0) {
                    setenv("FP4RL_W4B_REDUCE", "2", 1);
                    OKG(fp4rl_cuda_w4b_gemm(gpu, dc2, ldc, dx, M, q, b, sl));
                    free(c2);
                    c2 = host(dc2, (size_t)(M * ldc) * 4);
                }
            }
            unsetenv("FP4RL_W4B_REDUCE");
            const int all = M * N <= 30000;
            const int64_t samples = all ? M * N : 3000;
            const double rel = (double)(K + 2 + (sl ? sl : 16)) * 0x1p-24;
            for (int64_t s = 0; s < samples; s++) {
                const int64_t m = all ? s / N : (int64_t)(unif() * (double)M), n = all ? s % N : (int64_t)(unif() * (double)N);
                double ref = b ? (double)bias[n] : 0.0, S = b ? fabs((double)bias[n]) : 0.0;
                for (int64_t k = 0; k < K; k++) {
                    const double pr = (double)fp4rl_bf16_to_f32(x[m * K + k]) * (double)wv[n * K + k];
                    ref += pr;
                    S += fabs(pr);
                }
                const double got = c[m * ldc + n];
                ck_assert_msg(fabs(got - ref) <= rel * S, "%s %lldx%lldx%lld mode %d: c[%lld, %lld] = %.9g, exact %.9g (S %.6g)", FMTS[f].name,
                              (long long)M, (long long)N, (long long)K, mode, (long long)m, (long long)n, got, ref, S);
            }
            free(c);
            free(c2);
        }
        free(x);
        gpu->be->free(gpu, dx);
        gpu->be->free(gpu, dc);
        gpu->be->free(gpu, dc2);
    }
    free(bias);
    gpu->be->free(gpu, dbias);
    free(wv);
    fp4rl_tensor_destroy(q);
}

START_TEST(test_gemm_small)
{
    if (!have) return;
    static const int64_t ms[] = {1, 7, 32, 33, 64, 100, 128, 256, 300};
    static const int64_t shapes[][2] = {{77, 64}, {300, 320}, {130, 2048}};
    for (size_t f = 0; f < sizeof FMTS / sizeof FMTS[0]; f++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) gemm_case(f, shapes[i][0], shapes[i][1], ms, sizeof ms / sizeof ms[0], 3);
    printf("random X: M 1..300, ragged N, within FP32 summation's bound, deterministic\n");
}
END_TEST

START_TEST(test_gemm_3b)
{
    if (!have) return;
    static const int64_t ms[] = {16, 128, 256};
    static const int64_t shapes[][2] = {{2560, 2048}, {22016, 2048}, {2048, 11008}};
    for (size_t f = 0; f < sizeof FMTS / sizeof FMTS[0]; f++) /* 1D: HiF4, MXFP4, as stored and re-laid out; NVFP4 */
        if (FMTS[f].tile == 0)
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) gemm_case(f, shapes[i][0], shapes[i][1], ms, sizeof ms / sizeof ms[0], 5);
    printf("3B shapes (q|k|v, gate|up, down), HiF4 and MXFP4 as stored and re-laid out, NVFP4: within the bound\n");
}
END_TEST

/* (d) the re-layout changes no bit: the same weight as stored and re-laid out (HiF4, 1D and 64 x 64,
 * extreme rows with NaN units), every activation tile, default and forced split, bias. */
START_TEST(test_pack_same_bits)
{
    if (!have) return;
    static const int64_t shapes[][2] = {{300, 320}, {130, 2048}, {2560, 2048}};
    static const int64_t ms[] = {1, 33, 100, 300};
    for (int fi = 0; fi < 4; fi++) /* HiF4 1D and 64 x 64, MXFP4 1D and 32 x 32 */
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const fp4rl_dtype fmt = fi < 2 ? FP4RL_DTYPE_HIF4 : FP4RL_DTYPE_MXFP4;
            const int tile = fi == 1 ? 64 : fi == 3 ? 32 : 0, ext = fi < 2 ? 1 : 2;
            const int64_t N = shapes[si][0], K = shapes[si][1];
            float *wv = NULL, *wv2 = NULL;
            rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)(N * K + fi);
            fp4rl_tensor *q = weight(fmt, tile, 0, N, K, ext, &wv);
            rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)(N * K + fi);
            fp4rl_tensor *qp = weight(fmt, tile, 1, N, K, ext, &wv2);
            ck_assert_msg(!memcmp(wv, wv2, (size_t)(N * K) * sizeof(float)), "the same seed, the same weight");
            float *bias = malloc((size_t)N * 4);
            for (int64_t n = 0; n < N; n++) bias[n] = gauss();
            float *dbias = dev(bias, (size_t)N * 4);
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                const int64_t M = ms[mi];
                uint16_t *x = malloc((size_t)(M * K) * 2);
                for (int64_t i = 0; i < M * K; i++) x[i] = fp4rl_f32_to_bf16(gauss());
                uint16_t *dx = dev(x, (size_t)(M * K) * 2);
                float *d1 = dev(NULL, (size_t)(M * N) * 4), *d2 = dev(NULL, (size_t)(M * N) * 4);
                for (int mode = 0; mode < 2; mode++) {
                    OKG(fp4rl_cuda_w4b_gemm(gpu, d1, N, dx, M, q, mode ? dbias : NULL, mode ? 3 : 0));
                    OKG(fp4rl_cuda_w4b_gemm(gpu, d2, N, dx, M, qp, mode ? dbias : NULL, mode ? 3 : 0));
                    float *c1 = host(d1, (size_t)(M * N) * 4), *c2 = host(d2, (size_t)(M * N) * 4);
                    ck_assert_msg(!memcmp(c1, c2, (size_t)(M * N) * 4), "%s tile %d %lldx%lldx%lld mode %d: re-laid out differs from as stored",
                                  fp4rl_dtype_name(fmt), tile, (long long)M, (long long)N, (long long)K, mode);
                    free(c1);
                    free(c2);
                }
                free(x);
                gpu->be->free(gpu, dx);
                gpu->be->free(gpu, d1);
                gpu->be->free(gpu, d2);
            }
            free(bias);
            gpu->be->free(gpu, dbias);
            free(wv);
            free(wv2);
            fp4rl_tensor_destroy(q);
            fp4rl_tensor_destroy(qp);
        }
    printf("re-layout: HiF4 1D and 64x64, MXFP4 1D and 32x32, M 1..300, split and bias: bit for bit the weight as stored\n");
}
END_TEST

START_TEST(test_refusals)
{
    float *wv = NULL;
    fp4rl_tensor *q = weight(FP4RL_DTYPE_HIF4, 0, 0, 64, 128, 0, &wv);
    uint16_t *dx = dev(NULL, 64 * 128 * 2 + 16);
    float *dc = dev(NULL, 64 * 64 * 4);
    ck_assert_int_eq(fp4rl_cuda_w4b_gemm(gpu, NULL, 64, dx, 4, q, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_cuda_w4b_gemm(gpu, dc, 64, NULL, 4, q, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_cuda_w4b_gemm(NULL, dc, 64, dx, 4, q, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_cuda_w4b_gemm(gpu, dc, 64, dx, 4, NULL, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_cuda_w4b_gemm(gpu, dc, 63, dx, 4, q, NULL, 0), FP4RL_ERR_UNSUPPORTED); /* ldc < N */
    ck_assert_int_eq(fp4rl_cuda_w4b_gemm(gpu, dc, 64, dx, 0, q, NULL, 0), FP4RL_ERR_UNSUPPORTED); /* M = 0 */
    ck_assert_int_eq(fp4rl_cuda_w4b_gemm(gpu, dc, 64, (const uint16_t *)((char *)dx + 2), 4, q, NULL, 0), FP4RL_ERR_UNSUPPORTED);
    ck_assert_int_eq(fp4rl_cuda_w4b_pack(NULL, q), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_cuda_w4b_pack(gpu, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    if (have) { /* a re-laid-out weight: the ABI refuses it, packing again changes nothing */
        OKG(fp4rl_cuda_w4b_pack(gpu, q));
        void *d = q->data;
        OKG(fp4rl_cuda_w4b_pack(gpu, q));
        ck_assert_ptr_eq(q->data, d);
        fp4rl_tensor *dq = NULL;
        ck_assert_int_eq(fp4rl_dequantize(&dq, gpu, q, FP4RL_DTYPE_F32), FP4RL_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_null(dq);
    }
    fp4rl_tensor_destroy(q);
    free(wv);
    q = weight(FP4RL_DTYPE_NVFP4, 0, 0, 64, 128, 0, &wv); /* NVFP4: read re-laid out only */
    ck_assert_int_eq(fp4rl_cuda_w4b_ok(gpu, q), 0);
    ck_assert_int_eq(fp4rl_cuda_w4b_gemm(gpu, dc, 64, dx, 4, q, NULL, 0), FP4RL_ERR_UNSUPPORTED);
    if (have) {
        OKG(fp4rl_cuda_w4b_pack(gpu, q));
        ck_assert_int_eq(q->layout, FP4RL_LAYOUT_W4B);
        ck_assert_int_eq(fp4rl_cuda_w4b_ok(gpu, q), 1);
    }
    fp4rl_tensor_destroy(q);
    free(wv);
    if (have) { /* MXFP4 with a scale code past FP4RL_W4B_MX_MAX_SCALE (|w| ~ 2^14): left as stored */
        q = weight(FP4RL_DTYPE_MXFP4, 0, 0, 77, 128, 1, &wv);
        OKG(fp4rl_cuda_w4b_pack(gpu, q));
        ck_assert_int_eq(q->layout, 0);
        fp4rl_tensor_destroy(q);
        free(wv);
    }
    q = weight(FP4RL_DTYPE_MXFP4, 0, 0, 64, 96, 0, &wv); /* K not a multiple of 64 */
    ck_assert_int_eq(fp4rl_cuda_w4b_ok(gpu, q), 0);
    ck_assert_int_eq(fp4rl_cuda_w4b_gemm(gpu, dc, 64, dx, 4, q, NULL, 0), FP4RL_ERR_UNSUPPORTED);
    fp4rl_tensor_destroy(q);
    free(wv);
    gpu->be->free(gpu, dx);
    gpu->be->free(gpu, dc);
}
END_TEST

static void setup(void)
{
    ck_assert_int_eq(fp4rl_context_create(&gpu, FP4RL_DEVICE_CUDA, 0), FP4RL_OK);
    float *wv = NULL;
    fp4rl_tensor *q = weight(FP4RL_DTYPE_HIF4, 0, 0, 64, 64, 0, &wv);
    have = fp4rl_cuda_w4b_ok(gpu, q);
    if (!have) printf("w4b: not on this device or build (needs compute capability 9.0 and sm_90a code); GEMM cases skipped\n");
    fp4rl_tensor_destroy(q);
    free(wv);
}
static void teardown(void) { fp4rl_context_destroy(gpu); }

int main(void)
{
    if (fp4rl_gpu_or_skip("test_w4b")) return 77;
    Suite *s = suite_create("w4b");
    TCase *tc = tcase_create("w4b");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 1800);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_identity);
    tcase_add_test(tc, test_gemm_small);
    tcase_add_test(tc, test_pack_same_bits);
    tcase_add_test(tc, test_gemm_3b);
    suite_add_tcase(s, tc);
    return fp4rl_check_run_nofork(s);
}
