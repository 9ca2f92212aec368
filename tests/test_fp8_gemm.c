/*
 * test_fp8_gemm.c - fp4rl_matmul's FP8-operand path (cuda/gemm_fp8.h) for HiF4 x HiF4 and
 * MXFP4 x MXFP4 (1D along K; HiF4 2D 64 x 64 and MXFP4 2D 32 x 32 tiles) against float64 sums of
 * the exactly dequantized operands (fp4rl_dequantize). Each kernel selected by FP4RL_FP8_GEMM
 * ("ref": the CUDA-core reference, "1": the tensor-core entry, i.e. the wgmma kernel where it
 * applies (sm_90a build on an H100 / H200, K % 128 == 0, M, N >= 128) and the mma.sync kernel
 * elsewhere, "mma": "1" with FP4RL_FP8_WG=0, the mma.sync kernel everywhere, "pipe": "1" with
 * FP4RL_FP8_WG_PIPE=1, the wgmma kernel's pipelined consumer loop, "0": the old BF16
 * path) must give, per output with S = sum_k |a_k b_k|,
 *     |c - c_exact| <= 2^-9 S [BF16 C only] + (2 K / U + 2) 2^-24 S
 * (the per-unit partials are exact; each promotion rounds twice: p * (sa sb), then the add),
 * far inside test_matmul's contract for fp4rl_matmul, 2 K 2^-23 S (+ 2^-8 for BF16 C). Big shapes check a sample of
 * outputs. Prints the worst err / S per case, and for an F32 C how many outputs of "1", "mma" and
 * "pipe" differ in their bits from "ref" (all should be 0: the wgmma kernel's single FMA equals
 * the reference's multiply-then-add because p (sa sb) is exact; informational, not asserted).
 * Label `gpu`: exits 77 (skipped) without a GPU.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"

static fp4rl_context *gpu;
#define OKG(call) ck_assert_msg((call) == FP4RL_OK, "%s: %s", #call, fp4rl_last_error())

#include "test_rand.h"

/* A quantized [R, K] operand and its exact dequantized values on the host. */
static fp4rl_tensor *make_q(fp4rl_dtype fmt, int tile, int64_t R, int64_t K, float **deq_host)
{
    float *x = malloc((size_t)(R * K) * sizeof(float));
    for (int64_t i = 0; i < R * K; i++) x[i] = 0.1f * gauss() * (1.0f + (float)(i % 7)); /* varied unit scales */
    const int64_t shape[2] = {R, K};
    fp4rl_tensor *src = NULL, *q = NULL, *deq = NULL;
    OKG(fp4rl_tensor_from_host(&src, gpu, FP4RL_DTYPE_F32, 2, shape, x));
    fp4rl_quant_policy *p = NULL;
    OKG(fp4rl_quant_policy_create(&p));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile));
    OKG(fp4rl_quantize(&q, gpu, src, fmt, p, FP4RL_ROLE_WEIGHT));
    OKG(fp4rl_dequantize(&deq, gpu, q, FP4RL_DTYPE_F32));
    OKG(fp4rl_tensor_to_host(deq, x, (size_t)(R * K) * sizeof(float)));
    *deq_host = x;
    fp4rl_tensor_destroy(deq);
    fp4rl_tensor_destroy(src);
    fp4rl_quant_policy_destroy(p);
    return q;
}

/* Runs C = A B^T under FP4RL_FP8_GEMM=mode into a C of dtype ct and checks it; returns worst err / S. */
static double run_mode(const char *mode, fp4rl_dtype ct, fp4rl_tensor *qa, fp4rl_tensor *qb, const float *a, const float *b, int64_t M,
                       int64_t N, int64_t K, int U, int fp8_able, float **keep)
{
    const int mma = strcmp(mode, "mma") == 0, pipe = strcmp(mode, "pipe") == 0;
    setenv("FP4RL_FP8_GEMM", mma || pipe ? "1" : mode, 1);
    if (mma) setenv("FP4RL_FP8_WG", "0", 1);
    else unsetenv("FP4RL_FP8_WG");
    if (pipe) setenv("FP4RL_FP8_WG_PIPE", "1", 1);
    else unsetenv("FP4RL_FP8_WG_PIPE");
    const int64_t shape[2] = {M, N};
    fp4rl_tensor *c = NULL;
    OKG(fp4rl_tensor_zeros(&c, gpu, ct, 2, shape));
    OKG(fp4rl_matmul(c, gpu, qa, qb));
    float *ch = malloc((size_t)(M * N) * sizeof(float));
    if (ct == FP4RL_DTYPE_F32) {
        OKG(fp4rl_tensor_to_host(c, ch, (size_t)(M * N) * sizeof(float)));
    } else {
        uint16_t *h = malloc((size_t)(M * N) * 2);
        OKG(fp4rl_tensor_to_host(c, h, (size_t)(M * N) * 2));
        for (int64_t i = 0; i < M * N; i++) {
            const uint32_t u = (uint32_t)h[i] << 16;
            memcpy(&ch[i], &u, 4);
        }
        free(h);
    }
    fp4rl_tensor_destroy(c);
    /* every output for small products, else 20000 random ones plus the four corners */
    const int all = (double)M * (double)N * (double)K <= 3e8;
    const int64_t samples = all ? M * N : 20004;
    /* "ref", and "1" where the tensor-core kernel's gate holds (sm_89+, assumed: the GPU tests run
     * on an H200; M >= 512, N >= 128, K >= 128, K % 64 == 0), take the FP8 path with its per-unit
     * bound (the mma's sum of a unit's <= 64 integer products < 2^10 is exact in FP32 in any
     * order); "0" and "1" below the gate are the BF16 cuBLASLt GEMM, held to test_matmul's
     * contract 2 K 2^-23 S (+ 2^-8 S for a BF16 C). */
    const int tc_gate = M >= 512 && N >= 128 && K >= 128 && K % 64 == 0;
    const int fp8 = fp8_able && (strcmp(mode, "ref") == 0 || ((strcmp(mode, "1") == 0 || mma || pipe) && tc_gate));
    const double acc_u = fp8 ? (double)(2 * (K / U) + 2) : (double)(4 * K);
    const double rel = (ct == FP4RL_DTYPE_BF16 ? 0x1p-8 : 0.0) + acc_u * 0x1p-24; /* BF16 C: unit roundoff 2^-8 */
    double worst = 0.0;
    for (int64_t s = 0; s < samples; s++) {
        int64_t m, n;
        if (all) m = s / N, n = s % N;
        else if (s < 4) m = (s & 1) ? M - 1 : 0, n = (s & 2) ? N - 1 : 0;
        else m = (int64_t)(unif() * (double)M), n = (int64_t)(unif() * (double)N);
        double ref = 0.0, S = 0.0;
        for (int64_t k = 0; k < K; k++) {
            const double p = (double)a[m * K + k] * (double)b[n * K + k];
            ref += p;
            S += fabs(p);
        }
        const double err = fabs((double)ch[m * N + n] - ref);
        ck_assert_msg(err <= rel * S, "FP8_GEMM=%s C %s %lldx%lldx%lld: c[%lld,%lld] = %.9g, exact %.9g, err %.3g > %.3g (S %.6g)", mode,
                      ct == FP4RL_DTYPE_F32 ? "f32" : "bf16", (long long)M, (long long)N, (long long)K, (long long)m, (long long)n,
                      (double)ch[m * N + n], ref, err, rel * S, S);
        if (S > 0.0 && err / S > worst) worst = err / S;
    }
    unsetenv("FP4RL_FP8_WG");
    unsetenv("FP4RL_FP8_WG_PIPE");
    if (keep) *keep = ch;
    else free(ch);
    return worst;
}

static void check_case(fp4rl_dtype fmt, int tile, int64_t M, int64_t N, int64_t K)
{
    const int U = fmt == FP4RL_DTYPE_HIF4 ? 64 : 32;
    const int fp8_able = fmt == FP4RL_DTYPE_HIF4 || tile == 0 || tile == 32; /* MXFP4 64 x 64 tiles: the old path */
    float *a = NULL, *b = NULL;
    fp4rl_tensor *qa = make_q(fmt, tile, M, K, &a), *qb = make_q(fmt, tile, N, K, &b);
    const char *modes[5] = {"ref", "1", "mma", "pipe", "0"};
    float *c32[4] = {NULL, NULL, NULL, NULL}; /* F32 C of ref, 1, mma, pipe */
    for (int mi = 0; mi < 5; mi++)
        for (int ci = 0; ci < 2; ci++) {
            const fp4rl_dtype ct = ci ? FP4RL_DTYPE_BF16 : FP4RL_DTYPE_F32;
            const double w = run_mode(modes[mi], ct, qa, qb, a, b, M, N, K, U, fp8_able, !ci && mi < 4 ? &c32[mi] : NULL);
            printf("%s tile %d %lldx%lldx%lld FP8_GEMM=%-3s C %-4s worst err/S %.3e (FP8 bound %.3e)\n", fmt == FP4RL_DTYPE_HIF4 ? "hif4" : "mxfp4",
                   tile, (long long)M, (long long)N, (long long)K, modes[mi], ci ? "bf16" : "f32", w,
                   (ci ? 0x1p-8 : 0.0) + (double)(2 * (K / U) + 2) * 0x1p-24);
        }
    for (int mi = 1; mi < 4; mi++) {
        int64_t diff = 0;
        for (int64_t i = 0; i < M * N; i++) diff += memcmp(&c32[0][i], &c32[mi][i], sizeof(float)) != 0;
        printf("%s tile %d %lldx%lldx%lld FP8_GEMM=%-3s C f32: %lld of %lld outputs differ in bits from ref\n",
               fmt == FP4RL_DTYPE_HIF4 ? "hif4" : "mxfp4", tile, (long long)M, (long long)N, (long long)K, modes[mi], (long long)diff,
               (long long)(M * N));
    }
    for (int mi = 0; mi < 4; mi++) free(c32[mi]);
    unsetenv("FP4RL_FP8_GEMM");
    fp4rl_tensor_destroy(qa);
    fp4rl_tensor_destroy(qb);
    free(a);
    free(b);
}

static const fp4rl_dtype FMTS[2] = {FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP4};

START_TEST(test_small_ragged)
{
    for (int f = 0; f < 2; f++) {
        check_case(FMTS[f], 0, 520, 136, 192);   /* ragged M and N past whole 128 x 128 tiles; K % 128 != 0: mma.sync */
        check_case(FMTS[f], 0, 64, 40, 128);     /* below the fast kernel's gate: the old path */
        check_case(FMTS[f], 0, 600, 250, 1024);  /* K % 128 == 0: the wgmma kernel, ragged M and N */
        check_case(FMTS[f], 0, 640, 131, 256);   /* odd N (single-column stores), one partial N tile */
        check_case(FMTS[f], 0, 768, 384, 640);   /* whole tiles, K = 5 stages of 128 */
        check_case(FMTS[f], 64, 512, 256, 512);  /* 2D tiles (HiF4 64 x 64; MXFP4 64 x 64 keeps the old path) */
    }
    check_case(FP4RL_DTYPE_MXFP4, 32, 544, 160, 320);
}
END_TEST

START_TEST(test_big)
{
    for (int f = 0; f < 2; f++) {
        check_case(FMTS[f], 0, 1024, 1024, 1024);
        check_case(FMTS[f], 0, 2048, 1536, 8960);
    }
}
END_TEST

static void setup(void) { ck_assert_int_eq(fp4rl_context_create(&gpu, FP4RL_DEVICE_CUDA, 0), FP4RL_OK); }
static void teardown(void) { fp4rl_context_destroy(gpu); }

int main(void)
{
    if (fp4rl_gpu_or_skip("test_fp8_gemm")) return 77;
    Suite *s = suite_create("fp8_gemm");
    TCase *tc = tcase_create("fp8");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, test_small_ragged);
    tcase_add_test(tc, test_big);
    suite_add_tcase(s, tc);
    return fp4rl_check_run_nofork(s);
}
