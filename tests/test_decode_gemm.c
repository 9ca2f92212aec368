/*
 * test_decode_gemm.c - the decode GEMM on packed FP4 weights (cuda/decode_packed.h) on the GPU
 * against the generic path: the weight dequantized exactly (fp4rl_dequantize, F32) times the BF16
 * activations, summed in float64 here. The kernel's products are those exact products and only
 * its FP32 summation order differs, so every output is held to
 *     |y - ref| <= 1e-5 * sum_k |x_mk| |w_nk|   (+ the same of bias-free rounding: none)
 * and a NaN weight block must give NaN. Every format (MXFP4, NVFP4 with its tensor scale, HiF4),
 * 1D and 2D tiles, M in {1, 7, 16, 64, 256} (and 100 / 129, rows past one block of 128), ragged N and
 * K (multiples of the block and not), ResQ's [x1 | x2] against the same weight, a bias, scales that
 * need an exponent offset, and the launch shapes the benchmark sweeps (4 / 8 warps, 1..8 split-K
 * slices reduced in a cluster). Label `gpu`: exits 77 (skipped) without a GPU.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "decode_packed.h"
#include "runtime/internal.h"

static fp4rl_context *gpu;
static int quick; /* FP4RL_DG_QUICK=1: a subset, for compute-sanitizer */

#define OKG(call) ck_assert_msg((call) == FP4RL_OK, "%s: %s", #call, fp4rl_last_error())

#include "test_rand.h"
static uint16_t bf16_bits(float f) /* round to nearest even (no NaN here) */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_val(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void *dev(const void *h, size_t bytes)
{
    void *d = NULL;
    OKG(gpu->be->alloc(gpu, &d, bytes));
    if (h) OKG(gpu->be->upload(gpu, d, h, bytes));
    return d;
}

typedef struct wcase {
    fp4rl_dtype fmt;
    int tile;
    int64_t N, K;
    fp4rl_tensor *q;
    float *w; /* the exact dequantized weight [N, K] */
    fp4rl_dg_layout *L;
} wcase;

/* A weight of Gaussian values (scale 0.05) with `special` extras: a NaN block and a value of
 * 1000 (which needs an exponent offset). */
static wcase make_weight(fp4rl_dtype fmt, int tile, int64_t N, int64_t K, int special)
{
    wcase c = {fmt, tile, N, K, NULL, NULL, NULL};
    float *x = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t i = 0; i < N * K; i++) x[i] = 0.05f * gauss();
    if (special) {
        x[(N / 3) * K + K / 2] = NAN;
        x[(N - 1) * K + 3] = 1000.0f;
        for (int64_t k = 0; k < K; k++) x[(N / 2) * K + k] = 0.0f;
    }
    const int64_t shape[2] = {N, K};
    fp4rl_tensor *src = NULL, *deq = NULL;
    OKG(fp4rl_tensor_from_host(&src, gpu, FP4RL_DTYPE_F32, 2, shape, x));
    fp4rl_quant_policy *p = NULL;
    OKG(fp4rl_quant_policy_create(&p));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_SCALE_RULE, FP4RL_SCALE_TRUNCATION_FREE));
    OKG(fp4rl_quantize(&c.q, gpu, src, fmt, p, FP4RL_ROLE_WEIGHT));
    OKG(fp4rl_dequantize(&deq, gpu, c.q, FP4RL_DTYPE_F32));
    OKG(fp4rl_tensor_to_host(deq, x, (size_t)(N * K) * sizeof(float)));
    c.w = x;
    OKG(fp4rl_cuda_dg_prepare(gpu, c.q, &c.L));
    fp4rl_tensor_destroy(deq);
    fp4rl_tensor_destroy(src);
    fp4rl_quant_policy_destroy(p);
    return c;
}
static void free_weight(wcase *c)
{
    fp4rl_cuda_dg_destroy(gpu, c->L);
    fp4rl_tensor_destroy(c->q);
    free(c->w);
}

/* y = x W^T (+ bias) for M rows through the kernel (launch shape warps / slices, 0 = auto),
 * checked against the float64 reference. Returns the worst |y - ref| / (1e-5 * abs-sum). */
static double check_run(const wcase *c, int64_t M, int resq, int bias, int warps, int slices)
{
    const int64_t N = c->N, K = c->K, KX = resq ? 2 * K : K;
    uint16_t *xh = malloc((size_t)(M * KX) * 2);
    for (int64_t i = 0; i < M * KX; i++) xh[i] = bf16_bits(gauss());
    float *bh = malloc((size_t)N * sizeof(float));
    for (int64_t n = 0; n < N; n++) bh[n] = 0.1f * gauss();
    uint16_t *xd = dev(xh, (size_t)(M * KX) * 2);
    float *bd = dev(bh, (size_t)N * sizeof(float)), *yd = dev(NULL, (size_t)(M * N) * sizeof(float));
    OKG(gpu->be->memset0(gpu, yd, (size_t)(M * N) * sizeof(float)));
    float *y = malloc((size_t)(M * N) * sizeof(float));
    for (int64_t i = 0; i < M * N; i++) y[i] = NAN; /* garbage the kernel must overwrite */
    OKG(gpu->be->upload(gpu, yd, y, (size_t)(M * N) * sizeof(float)));
    OKG(fp4rl_cuda_dg_run_cfg(gpu, yd, xd, M, resq, c->L, bias ? bd : NULL, warps, slices));
    OKG(gpu->be->download(gpu, y, yd, (size_t)(M * N) * sizeof(float)));
    double worst = 0;
    int64_t nbad = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0, a = 0;
            int nan = 0;
            for (int h = 0; h < (resq ? 2 : 1); h++)
                for (int64_t k = 0; k < K; k++) {
                    const double xv = bf16_val(xh[m * KX + h * K + k]), wv = c->w[n * K + k];
                    if (isnan(wv)) nan = 1;
                    s += xv * wv;
                    a += fabs(xv * wv);
                }
            if (bias) s += bh[n];
            const float got = y[m * N + n];
            if (nan) {
                if (!isnan(got) && nbad++ < 5) printf("    (%lld, %lld): %g, want NaN\n", (long long)m, (long long)n, got);
                continue;
            }
            const double r = fabs(got - s) / (1e-5 * a + 1e-30);
            if (!(r <= 1.0) && nbad++ < 5)
                printf("    (%lld, %lld): %.9g, want %.9g (abs-sum %.3g)\n", (long long)m, (long long)n, got, s, a);
            if (!(r <= worst)) worst = r;
        }
    printf("  %-5s tile %2d [%5lld x %5lld] M %3lld%s%s warps %d slices %d: worst %.3f of the bound%s\n", fp4rl_dtype_name(c->fmt),
           c->tile, (long long)N, (long long)K, (long long)M, resq ? " resq" : "", bias ? " bias" : "", warps, slices, worst,
           nbad ? "  FAILED" : "");
    ck_assert_msg(nbad == 0, "%s tile %d [%lld, %lld] M %lld resq %d: %lld outputs off", fp4rl_dtype_name(c->fmt), c->tile, (long long)N,
                  (long long)K, (long long)M, resq, (long long)nbad);
    gpu->be->free(gpu, xd);
    gpu->be->free(gpu, bd);
    gpu->be->free(gpu, yd);
    free(xh);
    free(bh);
    free(y);
    return worst;
}

static const fp4rl_dtype FMTS[3] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4};
static int tile2d(fp4rl_dtype f) { return f == FP4RL_DTYPE_HIF4 ? 64 : f == FP4RL_DTYPE_NVFP4 ? 16 : 32; }
static const int64_t MS[] = {1, 7, 16, 64, 256};

static void setup(void) { ck_assert_int_eq(fp4rl_context_create(&gpu, FP4RL_DEVICE_CUDA, 0), FP4RL_OK); }
static void teardown(void) { fp4rl_context_destroy(gpu); }

/* Every format and tile, ragged shapes, every M, ResQ and bias on some. */
START_TEST(test_formats_shapes)
{
    /* N, K: one tile and one kgroup; ragged N and K a multiple of every block but not of 64;
     * K a multiple of 8 only; a few row blocks and split-K by the automatic choice */
    static const int64_t shapes[][2] = {{16, 64}, {40, 192}, {300, 648}, {1000, 1088}};
    for (int f = 0; f < 3; f++)
        for (int two = 0; two < (quick ? 1 : 2); two++)
            for (size_t sh = quick; sh < sizeof shapes / sizeof shapes[0] - quick; sh++) {
                const int tile = two ? tile2d(FMTS[f]) : 0;
                wcase c = make_weight(FMTS[f], tile, shapes[sh][0], shapes[sh][1], sh == 1);
                for (size_t mi = 0; mi < sizeof MS / sizeof MS[0] - quick; mi++) check_run(&c, MS[mi], (int)(mi & 1), (int)(mi != 2), 0, 0);
                free_weight(&c);
            }
}
END_TEST

/* Rows past one block of 128 and ResQ with split-K in a cluster. */
START_TEST(test_blocks_resq)
{
    for (int f = 0; f < 3; f++) {
        wcase c = make_weight(FMTS[f], 0, 1280, 2048, 0); /* 8 split-K slices by the automatic choice */
        check_run(&c, 1, 1, 1, 0, 0);
        check_run(&c, 129, 1, 1, 0, 0);
        if (!quick) {
            check_run(&c, 1, 0, 0, 0, 0);
            check_run(&c, 64, 1, 0, 0, 0);
            check_run(&c, 100, 0, 1, 0, 0);
        }
        free_weight(&c);
    }
}
END_TEST

/* The launch shapes the benchmark sweeps give the same results (within the bound). */
START_TEST(test_launch_shapes)
{
    static const int warps[2] = {4, 8}, slices[5] = {1, 2, 3, 5, 8};
    for (int f = 0; f < 3; f++) {
        wcase c = make_weight(FMTS[f], 0, 520, 1280, 0);
        for (int wi = 0; wi < 2; wi++)
            for (int si = 0; si < 5; si += quick ? 2 : 1) {
                check_run(&c, 1, 0, 1, warps[wi], slices[si]);
                check_run(&c, 16, 1, 1, warps[wi], slices[si]);
                check_run(&c, si == 2 ? 256 : 64, 0, 0, warps[wi], slices[si]);
                check_run(&c, si == 1 ? 20 : 32, 1, 0, warps[wi], slices[si]); /* M 17..32: 4 n8 tiles, two weight tiles per warp */
            }
        free_weight(&c);
    }
}
END_TEST

/* Unsupported inputs are refused with a message; nothing is launched. */
START_TEST(test_refusals)
{
    const int64_t shape[2] = {32, 100};
    float *x = calloc(32 * 100, sizeof(float));
    fp4rl_tensor *src = NULL, *q = NULL;
    OKG(fp4rl_tensor_from_host(&src, gpu, FP4RL_DTYPE_F32, 2, shape, x));
    OKG(fp4rl_quantize(&q, gpu, src, FP4RL_DTYPE_MXFP4, NULL, FP4RL_ROLE_WEIGHT));
    fp4rl_dg_layout *L = (fp4rl_dg_layout *)1;
    ck_assert_int_eq(fp4rl_cuda_dg_prepare(gpu, q, &L), FP4RL_ERR_UNSUPPORTED); /* K = 100: not a multiple of 8 */
    ck_assert_ptr_null(L);
    ck_assert(fp4rl_last_error()[0] != 0);
    fp4rl_tensor_destroy(q);
    OKG(fp4rl_quantize(&q, gpu, src, FP4RL_DTYPE_MXFP8_E4M3, NULL, FP4RL_ROLE_WEIGHT));
    ck_assert_int_eq(fp4rl_cuda_dg_prepare(gpu, q, &L), FP4RL_ERR_UNSUPPORTED);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);
    free(x);
}
END_TEST

int main(void)
{
    if (fp4rl_gpu_or_skip("test_decode_gemm")) return 77;
    quick = getenv("FP4RL_DG_QUICK") && atoi(getenv("FP4RL_DG_QUICK"));
    Suite *s = suite_create("decode_gemm");
    TCase *tc = tcase_create("decode");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_formats_shapes);
    tcase_add_test(tc, test_blocks_resq);
    tcase_add_test(tc, test_launch_shapes);
    suite_add_tcase(s, tc);
    return fp4rl_check_run_nofork(s);
}
