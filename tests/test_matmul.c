/*
 * test_matmul.c - fp4rl_matmul (C = A * B^T) against a float64 reference computed here from the
 * operands' exact values (dense: the F32 / BF16 elements; quantized: their F32 dequantization,
 * which test_quantize checks bit for bit against the spec).
 *
 * Tolerance. The library accumulates in FP32. A sum of K products computed in binary32 in any order
 * (plus NVFP4's alpha = g_A * g_B applied once, and the one rounding of each NVFP4 operand's
 * dequantized value that the reference sees) is within
 *     |c - ref| <= 2 * K * 2^-23 * sum_k |a_mk| |b_nk|        (the standard gamma_K bound, doubled)
 * of the exact result. For a BF16 C add the final rounding: half a BF16 ulp, <= 2^-8 * |c|.
 */
#include "fmt_test_util.h"

static fp4rl_context *ctx;
static void setup(void)
{
    ref_tables_init();
    OK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0));
}
static void teardown(void) { fp4rl_context_destroy(ctx); }

typedef enum { OP_F32, OP_BF16, OP_MXFP4, OP_MXFP4_2D, OP_NVFP4, OP_HIF4, OP_HIF4_2D, OP_MXFP8, OP_COUNT } opkind;
static const char *const OP_NAME[OP_COUNT] = {"f32", "bf16", "mxfp4", "mxfp4-2d32", "nvfp4", "hif4", "hif4-2d64", "mxfp8"};

/* Makes operand `kind` from x [rows, K] and returns its exact values in *vals (malloc'ed). */
static fp4rl_tensor *make_operand(opkind kind, int64_t rows, int64_t K, const float *x, float **vals)
{
    const size_t n = (size_t)(rows * K);
    *vals = malloc(n * sizeof(float));
    if (kind == OP_F32) {
        memcpy(*vals, x, n * sizeof(float));
        return mk_f32(ctx, rows, K, x);
    }
    if (kind == OP_BF16) {
        for (size_t i = 0; i < n; i++) (*vals)[i] = ref_bf16_round(x[i]);
        return mk_bf16(ctx, rows, K, x);
    }
    static const struct { fp4rl_dtype f; int tile; } q[OP_COUNT] = {
        [OP_MXFP4] = {FP4RL_DTYPE_MXFP4, 0},   [OP_MXFP4_2D] = {FP4RL_DTYPE_MXFP4, 32}, [OP_NVFP4] = {FP4RL_DTYPE_NVFP4, 0},
        [OP_HIF4] = {FP4RL_DTYPE_HIF4, 0},     [OP_HIF4_2D] = {FP4RL_DTYPE_HIF4, 64},   [OP_MXFP8] = {FP4RL_DTYPE_MXFP8_E4M3, 0},
    };
    fp4rl_tensor *src = mk_f32(ctx, rows, K, x);
    fp4rl_tensor *t = quant(ctx, src, q[kind].f, q[kind].tile, 1, 0);
    fp4rl_tensor_destroy(src);
    float *y = deq_f32(ctx, t);
    memcpy(*vals, y, n * sizeof(float));
    free(y);
    return t;
}

/* Runs C = A * B^T with C of dtype cd and checks every entry against the reference. Returns the
 * largest |c - ref| / bound seen. */
static double check_matmul(opkind ka, opkind kb, fp4rl_dtype cd, int64_t M, int64_t N, int64_t K, const float *xa, const float *xb)
{
    float *va, *vb;
    fp4rl_tensor *a = make_operand(ka, M, K, xa, &va), *b = make_operand(kb, N, K, xb, &vb);
    /* C starts as garbage (NaN / 0xFFFF): matmul must overwrite all of it */
    fp4rl_tensor *c = NULL;
    const int64_t cs[2] = {M, N};
    size_t csz = (size_t)(M * N) * (cd == FP4RL_DTYPE_F32 ? 4 : 2);
    uint8_t *junk = malloc(csz);
    memset(junk, 0xFF, csz);
    OK(fp4rl_tensor_from_host(&c, ctx, cd, 2, cs, junk));
    fp4rl_status st = fp4rl_matmul(c, ctx, a, b);
    ck_assert_msg(st == FP4RL_OK, "matmul %s x %s -> %s: %s: %s", OP_NAME[ka], OP_NAME[kb], fp4rl_dtype_name(cd), fp4rl_status_name(st),
                  fp4rl_last_error());
    OK(fp4rl_tensor_to_host(c, junk, csz));
    double worst = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                ref += (double)va[m * K + k] * (double)vb[n * K + k];
                mag += fabs((double)va[m * K + k] * (double)vb[n * K + k]);
            }
            double got = cd == FP4RL_DTYPE_F32 ? (double)((float *)junk)[m * N + n]
                                               : (double)bits_f32((uint32_t)((uint16_t *)junk)[m * N + n] << 16);
            double bound = 2.0 * (double)K * 0x1p-23 * mag;
            if (cd == FP4RL_DTYPE_BF16) bound += 0x1p-8 * (fabs(ref) + bound);
            bound += 1e-37; /* all-zero rows */
            ck_assert_msg(isfinite(got) && fabs(got - ref) <= bound, "matmul %s x %s -> %s [%lld,%lld,%lld] C(%lld,%lld) = %.9g, ref %.9g (bound %.3g)",
                          OP_NAME[ka], OP_NAME[kb], fp4rl_dtype_name(cd), (long long)M, (long long)N, (long long)K, (long long)m,
                          (long long)n, got, ref, bound);
            if (fabs(got - ref) / bound > worst) worst = fabs(got - ref) / bound;
        }
    free(junk);
    free(va);
    free(vb);
    fp4rl_tensor_destroy(a);
    fp4rl_tensor_destroy(b);
    fp4rl_tensor_destroy(c);
    return worst;
}

static float *random_matrix(int64_t rows, int64_t cols, double amp, uint64_t seed)
{
    float *x = malloc((size_t)(rows * cols) * sizeof(float));
    trng r = trng_make(seed);
    for (int64_t i = 0; i < rows * cols; i++) x[i] = (float)(amp * trng_gauss(&r) * (1.0 + 3.0 * (trng_unif(&r) < 0.05)));
    return x;
}

/* Every operand combination, C f32 and bf16, on odd shapes. The amplitudes differ so that NVFP4's
 * g_A and g_B are far from 1 and from each other (a missing or doubled alpha would show). */
START_TEST(test_matmul_all_operand_combinations)
{
    static const int64_t shapes[][3] = {{5, 7, 100}, {1, 1, 1}, {3, 2, 33}, {33, 65, 130}};
    int runs = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        float *xa = random_matrix(M, K, 37.0, 100 + si), *xb = random_matrix(N, K, 0.02, 200 + si);
        for (int ka = 0; ka < OP_COUNT; ka++)
            for (int kb = 0; kb < OP_COUNT; kb++)
                for (int cd = 0; cd < 2; cd++) {
                    if (si == 3 && ka != kb && ka != OP_F32 && kb != OP_F32) continue; /* the big shape: a subset */
                    check_matmul((opkind)ka, (opkind)kb, cd ? FP4RL_DTYPE_BF16 : FP4RL_DTYPE_F32, M, N, K, xa, xb);
                    runs++;
                }
        free(xa);
        free(xb);
    }
    ck_assert_int_eq(runs, 3 * 64 * 2 + (8 + 7 + 7) * 2);
}
END_TEST

/* The reference is sensitive: the operands' values are not trivially representable, so a product
 * with the wrong values (e.g. NVFP4 without its g) lands far outside the bound. */
START_TEST(test_matmul_reference_is_sensitive)
{
    const int64_t M = 4, N = 3, K = 48;
    float *xa = random_matrix(M, K, 5.0, 300), *xb = random_matrix(N, K, 7.0, 301);
    float *va, *vb;
    fp4rl_tensor *a = make_operand(OP_NVFP4, M, K, xa, &va), *b = make_operand(OP_NVFP4, N, K, xb, &vb);
    float ga, gb;
    OK(fp4rl_tensor_quant_info(a, NULL, NULL, NULL, &ga));
    OK(fp4rl_tensor_quant_info(b, NULL, NULL, NULL, &gb));
    ck_assert(ga != 1.0f && gb != 1.0f && ga != gb);
    fp4rl_tensor *c = NULL;
    const int64_t cs[2] = {M, N};
    OK(fp4rl_tensor_zeros(&c, ctx, FP4RL_DTYPE_F32, 2, cs));
    OK(fp4rl_matmul(c, ctx, a, b));
    float out[12];
    OK(fp4rl_tensor_to_host(c, out, sizeof out));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                ref += (double)va[m * K + k] * vb[n * K + k];
                mag += fabs((double)va[m * K + k] * vb[n * K + k]);
            }
            double bound = 2.0 * K * 0x1p-23 * mag;
            ck_assert(fabs(out[m * N + n] - ref) <= bound);
            /* dropping alpha would be off by a factor 1 / (g_A g_B) */
            ck_assert(fabs(out[m * N + n] / ((double)ga * gb) - ref) > 1000 * bound || fabs(ref) < 1e-30);
        }
    double dq = 0, bsum = 0;
    for (int64_t i = 0; i < M * K; i++) {
        dq += fabs((double)va[i] - xa[i]);
        bsum += fabs((double)xa[i]);
    }
    ck_assert_msg(dq > 1e-3 * bsum, "the NVFP4 operand should not be exactly representable");
    free(va);
    free(vb);
    free(xa);
    free(xb);
    fp4rl_tensor_destroy(a);
    fp4rl_tensor_destroy(b);
    fp4rl_tensor_destroy(c);
}
END_TEST

/* A NaN block in an operand makes the rows (columns) of C that use it NaN; the others stay finite. */
START_TEST(test_matmul_nan_block_propagates)
{
    const int64_t M = 3, N = 2, K = 70;
    float *xa = random_matrix(M, K, 1.0, 400), *xb = random_matrix(N, K, 1.0, 401);
    xa[1 * K + 40] = NAN;
    const fp4rl_dtype fmts[4] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};
    for (int fi = 0; fi < 4; fi++) {
        fp4rl_tensor *sa = mk_f32(ctx, M, K, xa), *a = quant(ctx, sa, fmts[fi], 0, 0, 0), *b = mk_f32(ctx, N, K, xb), *c = NULL;
        const int64_t cs[2] = {M, N};
        OK(fp4rl_tensor_zeros(&c, ctx, FP4RL_DTYPE_F32, 2, cs));
        OK(fp4rl_matmul(c, ctx, a, b));
        float out[6];
        OK(fp4rl_tensor_to_host(c, out, sizeof out));
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++)
                ck_assert_msg(m == 1 ? isnan(out[m * N + n]) : isfinite(out[m * N + n]), "%s: C(%lld,%lld) = %g", fp4rl_dtype_name(fmts[fi]),
                              (long long)m, (long long)n, (double)out[m * N + n]);
        fp4rl_tensor_destroy(sa);
        fp4rl_tensor_destroy(a);
        fp4rl_tensor_destroy(b);
        fp4rl_tensor_destroy(c);
    }
    free(xa);
    free(xb);
}
END_TEST

/* A 2D-tiled weight serves both GEMMs: W [N, K] quantized once, its transpose [K, N] used as the
 * B operand of the other product gives the same numbers as quantizing W^T. */
START_TEST(test_matmul_transposed_2d_operand)
{
    const int64_t M = 6, N = 40, K = 50;
    float *xw = random_matrix(N, K, 1.0, 500), *xd = random_matrix(M, N, 1.0, 501);
    float *xwt = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < K; c++) xwt[c * N + r] = xw[r * K + c];
    const fp4rl_dtype fmts[4] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};
    for (int fi = 0; fi < 4; fi++) {
        const int tile = fmts[fi] == FP4RL_DTYPE_HIF4 ? 64 : 32;
        fp4rl_tensor *sw = mk_f32(ctx, N, K, xw), *swt = mk_f32(ctx, K, N, xwt), *d = mk_f32(ctx, M, N, xd);
        fp4rl_tensor *qw = quant(ctx, sw, fmts[fi], tile, 1, 0), *qwt = quant(ctx, swt, fmts[fi], tile, 1, 0), *tw = NULL;
        OK(fp4rl_tensor_transpose(&tw, ctx, qw));
        fp4rl_tensor *c1 = NULL, *c2 = NULL;
        const int64_t cs[2] = {M, K};
        OK(fp4rl_tensor_zeros(&c1, ctx, FP4RL_DTYPE_F32, 2, cs));
        OK(fp4rl_tensor_zeros(&c2, ctx, FP4RL_DTYPE_F32, 2, cs));
        OK(fp4rl_matmul(c1, ctx, d, tw));  /* dX = dY * W, with W^T [K, N] as B */
        OK(fp4rl_matmul(c2, ctx, d, qwt));
        float o1[6 * 50], o2[6 * 50];
        OK(fp4rl_tensor_to_host(c1, o1, sizeof o1));
        OK(fp4rl_tensor_to_host(c2, o2, sizeof o2));
        ck_assert_msg(memcmp(o1, o2, sizeof o1) == 0, "%s: transpose(Q(W)) and Q(W^T) give different products", fp4rl_dtype_name(fmts[fi]));
        fp4rl_tensor *objs[8] = {sw, swt, d, qw, qwt, tw, c1, c2};
        for (int i = 0; i < 8; i++) fp4rl_tensor_destroy(objs[i]);
    }
    free(xw);
    free(xwt);
    free(xd);
}
END_TEST

Suite *matmul_suite(void)
{
    Suite *s = suite_create("matmul");
    TCase *tc = tcase_create("matmul");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_matmul_all_operand_combinations);
    tcase_add_test(tc, test_matmul_reference_is_sensitive);
    tcase_add_test(tc, test_matmul_nan_block_propagates);
    tcase_add_test(tc, test_matmul_transposed_2d_operand);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(matmul_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
