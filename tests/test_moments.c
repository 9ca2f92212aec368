/*
 * test_moments.c - BF16 AdamW moments (FP4RL_MP_OPTIMIZER_MOMENTS = 1): stochastic rounding to
 * BF16 is unbiased, and under a constant gradient it follows the FP32 EMA where nearest rounding
 * stalls; the model holds 2 bytes per moment element and converts its moments when the setting
 * changes; training with BF16 moments follows FP32 moments, is bit-identical run to run, and its
 * dry run refuses a non-finite update; bad values are refused. (Checkpoints of BF16 moments:
 * tests/test_session.c; CPU against GPU bits: tests/test_ops_parity.c.)
 */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/adamw_math.h"
#include "model/model.h"

static fp4rl_context *ctx;
static void setup(void)
{
    ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    fp4rl_context_set_seed(ctx, 5);
}
static void teardown(void) { fp4rl_context_destroy(ctx); }

/* 86,592 parameters, untied (the LM head has its own moments too) */
static const char *SMALL =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 96, \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 64, \"tie_word_embeddings\": false}";

static fp4rl_model *new_model(uint64_t seed, int bf16)
{
    fp4rl_model *m;
    ck_assert_msg(fp4rl_model_create(&m, ctx, SMALL, NULL, seed) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_LR, 3e-3), FP4RL_OK);
    ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_GRAD_CLIP, 1.0), FP4RL_OK);
    if (bf16) ck_assert_msg(fp4rl_model_set_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, 1) == FP4RL_OK, "%s", fp4rl_last_error());
    return m;
}

static void batch(int32_t *tok, int n) /* 4 sequences of 16 tokens */
{
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((i * 37 + 11) % 96);
}

/* the moments as host floats (BF16 ones widened), [0, n) m and [n, 2n) v */
static float *moments(const fp4rl_model *m)
{
    float *h = malloc((size_t)m->total * 2 * sizeof(float));
    ck_assert_int_eq(fp4rl_model_moments_to_host(m, h, h + m->total), FP4RL_OK);
    return h;
}

static float *weights(const fp4rl_model *m)
{
    float *h = malloc((size_t)m->total * sizeof(float));
    ck_assert_int_eq(ctx->be->download(ctx, h, m->w, (size_t)m->total * sizeof(float)), FP4RL_OK);
    return h;
}

static size_t in_use(void)
{
    size_t u = 0;
    ck_assert_int_eq(fp4rl_context_memory(ctx, &u, NULL, NULL), FP4RL_OK);
    return u;
}

static int bf16_exact(float x) { return (fp4rl_f32_bits(x) & 0xffffu) == 0; }

/* fp4rl_f32_to_bf16_sr: the mean of many draws is the value (nearest rounding is off by its
 * whole remainder); BF16 values, inf and NaN pass unchanged. */
START_TEST(test_sr_rounding_unbiased)
{
    const float xs[3] = {1.0f + 0x1p-10f, -3.0f - 0x1p-7f * 0.3f, 1001.0f}; /* 1/8, 0.15 and 1/4 of an ulp above BF16 */
    for (int k = 0; k < 3; k++) {
        const float x = xs[k];
        const float lo = fp4rl_bits_f32(fp4rl_f32_bits(x) & 0xffff0000u), ulp = fabsf(fp4rl_bits_f32((fp4rl_f32_bits(x) & 0xffff0000u) + 0x10000u) - lo);
        const int N = 200000;
        double sum = 0;
        for (int i = 0; i < N; i++) {
            const float r = fp4rl_bf16_to_f32(fp4rl_f32_to_bf16_sr(x, fp4rl_sr_uniform(17, 3, (uint64_t)i)));
            ck_assert(r == lo || fabsf(r - lo) == ulp); /* one of the two neighbours */
            sum += r;
        }
        /* a Bernoulli mean: 5 standard deviations of N draws of spread ulp */
        const double err = fabs(sum / N - x), bound = 5 * 0.5 * ulp / sqrt((double)N);
        const double nearest_err = fabs((double)fp4rl_round_bf16(x) - x);
        printf("bf16 SR of %.9g: mean off by %.3g (bound %.3g); nearest off by %.3g\n", x, err, bound, nearest_err);
        ck_assert_msg(err < bound, "x = %.9g: mean of SR off by %.3g > %.3g", x, err, bound);
        ck_assert(nearest_err > 20 * bound);
    }
    ck_assert_uint_eq(fp4rl_f32_to_bf16_sr(1.5f, 0.999f), fp4rl_f32_to_bf16(1.5f)); /* BF16: unchanged */
    ck_assert(isinf(fp4rl_bf16_to_f32(fp4rl_f32_to_bf16_sr(INFINITY, 0.9f))));
    ck_assert(isnan(fp4rl_bf16_to_f32(fp4rl_f32_to_bf16_sr(NAN, 0.9f))));
}
END_TEST

/* A constant gradient g = 1 for T steps on n elements: the FP32 moments are the EMAs
 * m = 1 - b1^t, v = 1 - b2^t. Nearest rounding to BF16 stalls v (v moves by 0.001 (1 - v), less
 * than half an ulp once v > ~1/4); the op's stochastic rounding tracks the FP32 EMA in the mean
 * over elements (each element draws its own uniforms). */
START_TEST(test_sr_tracks_ema_constant_gradient)
{
    const fp4rl_ops *ops = ctx->ops;
    const int64_t n = 4096;
    const int T = 2000;
    const double lr = 1e-6, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    float *p = calloc((size_t)n, sizeof(float)), *g = malloc((size_t)n * sizeof(float));
    uint16_t *mb = calloc((size_t)n, sizeof(uint16_t)), *vb = calloc((size_t)n, sizeof(uint16_t));
    for (int64_t i = 0; i < n; i++) g[i] = 1.0f;
    float p32 = 0, m32 = 0, v32 = 0, g1 = 1.0f, pn = 0; /* FP32 moments: the op itself on one element */
    uint16_t mn = 0, vn = 0;                            /* nearest rounding, for contrast */
    for (int t = 1; t <= T; t++) {
        ck_assert_int_eq(ops->adamw_update_bf16(ctx, p, g, mb, vb, n, lr, b1, b2, eps, 0.0, t, FP4RL_ADAMW_SR_SEED,
                                                FP4RL_ADAMW_SR_OFFSET(t)), FP4RL_OK);
        ck_assert_int_eq(ops->adamw_update(ctx, &p32, &g1, &m32, &v32, 1, lr, b1, b2, eps, 0.0, t), FP4RL_OK);
        const fp4rl_adamw_k k = fp4rl_adamw_constants(lr, b1, b2, eps, 0.0, t);
        float mi = fp4rl_bf16_to_f32(mn), vi = fp4rl_bf16_to_f32(vn);
        fp4rl_adamw_elem(&k, 1.0f, &pn, &mi, &vi);
        mn = fp4rl_f32_to_bf16(mi);
        vn = fp4rl_f32_to_bf16(vi);
        if (t % 500 == 0 || t == 50) {
            double sm = 0, sv = 0;
            for (int64_t i = 0; i < n; i++) sm += fp4rl_bf16_to_f32(mb[i]), sv += fp4rl_bf16_to_f32(vb[i]);
            sm /= n, sv /= n;
            printf("t %4d: v fp32 %.5f, bf16 SR mean %.5f (rel %+.2e), bf16 nearest %.5f; m fp32 %.5f, SR mean %.5f\n", t,
                   v32, sv, sv / v32 - 1, fp4rl_bf16_to_f32(vn), m32, sm);
            ck_assert_msg(fabs(sv / v32 - 1) < 2e-3, "t %d: mean BF16 v %.6f against FP32 %.6f", t, sv, v32);
            ck_assert_msg(fabs(sm / m32 - 1) < 2e-3, "t %d: mean BF16 m %.6f against FP32 %.6f", t, sm, m32);
        }
    }
    /* the FP32 EMA reached 1 - 0.999^2000 = 0.865; nearest rounding stopped far below it */
    ck_assert_double_eq_tol(v32, 1 - pow(0.999, T), 1e-3);
    ck_assert_msg(fp4rl_bf16_to_f32(vn) < 0.5 * v32, "nearest-rounded v %.4f did not stall (FP32 %.4f)", fp4rl_bf16_to_f32(vn), v32);
    free(p), free(g), free(mb), free(vb);
}
END_TEST

/* The setting: default 0; 1 frees 4 bytes per parameter (2 per moment element) and converts the
 * moments the model holds to nearest BF16, 0 widens them back exactly; the step count stays;
 * setting the same value again changes nothing; bad values are refused and change nothing. */
START_TEST(test_storage_and_conversion)
{
    fp4rl_model *m = new_model(1, 0);
    double v = -1;
    ck_assert_int_eq(fp4rl_model_get_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, &v), FP4RL_OK);
    ck_assert_double_eq(v, 0);
    int32_t tok[64];
    batch(tok, 64);
    for (int s = 0; s < 2; s++) ck_assert_int_eq(fp4rl_model_train_step(m, tok, NULL, NULL, 4, 16, NULL, NULL), FP4RL_OK);
    float *f32 = moments(m);
    const int64_t n = m->total;
    int inexact = 0;
    for (int64_t i = 0; i < 2 * n; i++) inexact += !bf16_exact(f32[i]);
    ck_assert_int_gt(inexact, n); /* FP32 moments are not BF16 values */
    const size_t before = in_use();
    ck_assert_msg(fp4rl_model_set_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, 1) == FP4RL_OK, "%s", fp4rl_last_error());
    const size_t after = in_use();
    const double saved = (double)before - (double)after;
    printf("BF16 moments: %lld parameters, %.0f bytes fewer (%.3f per parameter)\n", (long long)n, saved, saved / (double)n);
    /* (the CPU backend counts malloc_usable_size: up to a page more per buffer) */
    ck_assert_msg(fabs(saved - 4.0 * (double)n) < 20000, "in use %zu -> %zu: %.0f bytes fewer, expected 4 x %lld", before, after,
                  saved, (long long)n);
    ck_assert_int_eq(fp4rl_model_get_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, &v), FP4RL_OK);
    ck_assert_double_eq(v, 1);
    ck_assert_int_eq(m->step, 2);
    float *b16 = moments(m);
    for (int64_t i = 0; i < 2 * n; i++)
        ck_assert_msg(b16[i] == fp4rl_round_bf16(f32[i]), "moment %lld: %.9g, not nearest BF16 of %.9g", (long long)i, b16[i], f32[i]);
    /* the same value again: no conversion, no allocation */
    void *mm = m->adam_m;
    ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, 1), FP4RL_OK);
    ck_assert_ptr_eq(m->adam_m, mm);
    /* bad values */
    const double bad[4] = {2, -1, 0.5, NAN};
    for (int k = 0; k < 4; k++) {
        FP4RL_EXPECT(fp4rl_model_set_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, bad[k]), FP4RL_ERR_INVALID_ARGUMENT);
        ck_assert_msg(strstr(fp4rl_last_error(), "optimizer_moments") && strstr(fp4rl_last_error(), "BF16"), "%s", fp4rl_last_error());
        ck_assert_int_eq(fp4rl_model_get_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, &v), FP4RL_OK);
        ck_assert_double_eq(v, 1);
    }
    ck_assert_int_eq(in_use(), after);
    /* back to FP32: exactly the BF16 values, 4 bytes per parameter more */
    ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, 0), FP4RL_OK);
    ck_assert_msg(fabs((double)in_use() - (double)before) < 20000, "in use %zu, was %zu with FP32 moments", in_use(), before);
    float *back = moments(m);
    ck_assert_mem_eq(back, b16, (size_t)n * 2 * sizeof(float));
    /* a model's optimizer reset and a reload zero BF16 moments too */
    ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, 1), FP4RL_OK);
    ck_assert_int_eq(fp4rl_model_reset_optimizer(m), FP4RL_OK);
    float *zero = moments(m);
    for (int64_t i = 0; i < 2 * n; i++) ck_assert(zero[i] == 0.0f);
    free(f32), free(b16), free(back), free(zero);
    fp4rl_model_destroy(m);
}
END_TEST

/* The moments exist from the first update: a new model holds only its weights (plus a few
 * scalars), choosing BF16 moments before training allocates and converts nothing, the first
 * update allocates 2 x 2 bytes per parameter, and an optimizer reset gives them back. */
START_TEST(test_moments_lazy)
{
    const size_t empty = in_use();
    fp4rl_model *m = new_model(3, 0);
    const int64_t n = m->total;
    const size_t created = in_use();
    ck_assert_msg(fabs((double)(created - empty) - 4.0 * (double)n) < 20000, "a new model holds %zu bytes, weights are %lld",
                  created - empty, (long long)(4 * n));
    ck_assert_ptr_null(m->adam_m);
    float *z = moments(m); /* unallocated moments read as zeros */
    for (int64_t i = 0; i < 2 * n; i++) ck_assert(z[i] == 0.0f);
    free(z);
    ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, 1), FP4RL_OK);
    ck_assert_int_eq(in_use(), created);
    ck_assert_ptr_null(m->adam_m);
    int32_t tok[64];
    batch(tok, 64);
    ck_assert_int_eq(fp4rl_model_train_step(m, tok, NULL, NULL, 4, 16, NULL, NULL), FP4RL_OK);
    ck_assert_ptr_nonnull(m->adam_m);
    float *b16 = moments(m);
    int nonzero = 0;
    for (int64_t i = 0; i < 2 * n; i++) {
        ck_assert(bf16_exact(b16[i]));
        nonzero += b16[i] != 0.0f;
    }
    ck_assert_int_gt(nonzero, n);
    free(b16);
    /* the gradients were released by nobody here: count only the moments' bytes via a reset */
    const size_t trained = in_use();
    ck_assert_int_eq(fp4rl_model_reset_optimizer(m), FP4RL_OK);
    ck_assert_ptr_null(m->adam_m);
    ck_assert_int_eq(m->step, 0);
    const double freed = (double)trained - (double)in_use();
    ck_assert_msg(fabs(freed - 4.0 * (double)n) < 20000, "a reset freed %.0f bytes, BF16 moments are %lld", freed, (long long)(4 * n));
    fp4rl_model_destroy(m);
}
END_TEST

/* Supervised training from the same init: BF16 moments follow FP32 moments (loss within 2% at
 * every step, both fall), the moments stay BF16 values, and two BF16 runs are bit-identical. */
START_TEST(test_training_bf16_moments)
{
    enum { STEPS = 25 };
    fp4rl_model *m[3] = {new_model(7, 0), new_model(7, 1), new_model(7, 1)};
    int32_t tok[64];
    batch(tok, 64);
    double loss[3][STEPS];
    for (int s = 0; s < STEPS; s++)
        for (int k = 0; k < 3; k++)
            ck_assert_msg(fp4rl_model_train_step(m[k], tok, NULL, NULL, 4, 16, &loss[k][s], NULL) == FP4RL_OK, "%s",
                          fp4rl_last_error());
    double worst = 0;
    for (int s = 0; s < STEPS; s++) worst = fmax(worst, fabs(loss[1][s] - loss[0][s]) / loss[0][s]);
    printf("loss FP32 moments %.4f -> %.4f, BF16 moments %.4f -> %.4f; largest relative gap %.2e\n", loss[0][0],
           loss[0][STEPS - 1], loss[1][0], loss[1][STEPS - 1], worst);
    ck_assert_msg(worst < 0.02, "BF16-moment loss differs from FP32-moment loss by %.3g (relative)", worst);
    ck_assert(loss[0][STEPS - 1] < 0.5 * loss[0][0]);
    ck_assert(loss[1][STEPS - 1] < 0.5 * loss[1][0]);
    /* the runs differ (the moments are rounded) but not the same-seed BF16 runs */
    float *w0 = weights(m[0]), *w1 = weights(m[1]), *w2 = weights(m[2]);
    const size_t wb = (size_t)m[0]->total * sizeof(float);
    ck_assert(memcmp(w0, w1, wb) != 0);
    ck_assert_mem_eq(w1, w2, wb);
    for (int s = 0; s < STEPS; s++) ck_assert(loss[1][s] == loss[2][s]);
    float *mo1 = moments(m[1]), *mo2 = moments(m[2]);
    ck_assert_mem_eq(mo1, mo2, 2 * wb);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < 2 * m[1]->total; i++) {
        ck_assert(bf16_exact(mo1[i]));
        nonzero += mo1[i] != 0;
    }
    ck_assert_int_gt(nonzero, m[1]->total); /* and they hold the training's moments */
    free(w0), free(w1), free(w2), free(mo1), free(mo2);
    for (int k = 0; k < 3; k++) fp4rl_model_destroy(m[k]);
}
END_TEST

/* The dry run of the BF16-moment update: a gradient whose square overflows v is refused before
 * anything changes (weights, moments, step), and a sane one then updates. */
START_TEST(test_nonfinite_update_bf16)
{
    fp4rl_model *m = new_model(3, 1);
    int32_t tok[64];
    batch(tok, 64);
    ck_assert_int_eq(fp4rl_model_train_step(m, tok, NULL, NULL, 4, 16, NULL, NULL), FP4RL_OK);
    float *w0 = weights(m), *mo0 = moments(m);
    float *g = calloc((size_t)m->total, sizeof(float));
    g[m->total / 3] = 1e25f;
    ck_assert_int_eq(fp4rl_model_grads(m), FP4RL_OK);
    ck_assert_int_eq(ctx->be->upload(ctx, m->g, g, (size_t)m->total * sizeof(float)), FP4RL_OK);
    FP4RL_EXPECT(fp4rl_model_update(m, 1e-3, 0, 0.0, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "non-finite"));
    float *w1 = weights(m), *mo1 = moments(m);
    ck_assert_mem_eq(w0, w1, (size_t)m->total * sizeof(float));
    ck_assert_mem_eq(mo0, mo1, (size_t)m->total * 2 * sizeof(float));
    ck_assert_int_eq(m->step, 1);
    g[m->total / 3] = 1e-3f;
    ck_assert_int_eq(ctx->be->upload(ctx, m->g, g, (size_t)m->total * sizeof(float)), FP4RL_OK);
    ck_assert_int_eq(fp4rl_model_update(m, 1e-3, 0, 0.0, NULL), FP4RL_OK);
    ck_assert_int_eq(m->step, 2);
    free(w0), free(mo0), free(w1), free(mo1), free(g);
    fp4rl_model_destroy(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("moments");
    TCase *tc = tcase_create("bf16");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_sr_rounding_unbiased);
    tcase_add_test(tc, test_sr_tracks_ema_constant_gradient);
    tcase_add_test(tc, test_storage_and_conversion);
    tcase_add_test(tc, test_moments_lazy);
    tcase_add_test(tc, test_training_bf16_moments);
    tcase_add_test(tc, test_nonfinite_update_bf16);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
