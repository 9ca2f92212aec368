/*
 * test_session.c - the RL session: rollout/trainer log-prob agreement, Rollout-ResQ's masks and
 * properties, the reward callback's error path, hostile arguments, an end-to-end run that raises
 * reward on the built-in task, and checkpoint round trip with bit-identical resume.
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "addition_task.h"
#include "format/formats.h"
#include "io/safetensors.h"
#include "rl/rollout.h"
#include "rl/session.h"

static const char *TINY =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 32, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 32, \"tie_word_embeddings\": true}";

static fp4rl_context *ctx;
static void setup(void)
{
    ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    fp4rl_context_set_seed(ctx, 5);
}
static void teardown(void) { fp4rl_context_destroy(ctx); }

static fp4rl_quant_policy *policy(fp4rl_preset preset, fp4rl_numerics train, fp4rl_numerics rollout, fp4rl_resq resq)
{
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_apply_preset(p, preset), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, train), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_ROLLOUT_NUMERICS, rollout), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_RESQ, resq), FP4RL_OK);
    return p;
}

static fp4rl_rl_session *new_session(fp4rl_model **m, fp4rl_quant_policy *p, uint64_t seed)
{
    ck_assert_msg(fp4rl_model_create(m, ctx, TINY, p, seed) == FP4RL_OK, "%s", fp4rl_last_error());
    fp4rl_rl_session *s;
    ck_assert_int_eq(fp4rl_rl_session_create(&s, ctx, *m, p), FP4RL_OK);
    const int32_t stop = ADD_END;
    ck_assert_int_eq(fp4rl_rl_session_set_stop_tokens(s, &stop, 1), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_GROUP_SIZE, 4), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_MAX_NEW_TOKENS, 4), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_LR, 1e-3), FP4RL_OK);
    return s;
}

/* A reward that prefers completions with many 7s: learnable from scratch. */
static int sevens(void *user, size_t pi, const int32_t *p, size_t pl, const int32_t *c, size_t cl, double *r)
{
    (void)user; (void)pi; (void)p; (void)pl;
    double k = 0;
    for (size_t i = 0; i < cl; i++) k += c[i] == 7;
    *r = k / 4.0;
    return 0;
}

static void prompts_for(uint64_t seed, size_t n, int32_t *tok, size_t *off)
{
    add_rng r = {seed};
    add_batch(&r, 9, n, tok, off);
}

static void rm_rf(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static double metric(const fp4rl_rl_session *s, const char *name)
{
    double v;
    ck_assert_msg(fp4rl_rl_session_metric(s, name, &v) == FP4RL_OK, "%s", fp4rl_last_error());
    return v;
}

START_TEST(test_mismatch_bf16_vs_fp4)
{
    int32_t tok[8 * 43];
    size_t off[9];
    prompts_for(1, 8, tok, off);
    fp4rl_model *m;
    /* BF16 rollout and BF16 training: the same numbers, so log mu == log pi_old up to GEMM order */
    fp4rl_quant_policy *p = policy(FP4RL_PRESET_DEFAULT, FP4RL_NUMERICS_BF16, FP4RL_NUMERICS_BF16, FP4RL_RESQ_OFF);
    fp4rl_rl_session *s = new_session(&m, p, 3);
    ck_assert_msg(fp4rl_rl_session_step(s, tok, off, 8, sevens, NULL) == FP4RL_OK, "%s", fp4rl_last_error());
    const double bf16_max = metric(s, "mismatch/logp_abs_diff_max");
    ck_assert_msg(bf16_max < 1e-4, "BF16/BF16 mismatch max %.3g", bf16_max);
    ck_assert_double_lt(fabs(metric(s, "tis/mean") - 1.0), 1e-3);
    ck_assert_double_eq(metric(s, "quant/act_zero_frac"), 0.0);
    /* the peak of the context (model, rollout, trainer) after a step holds at least w, g, m and v */
    ck_assert_double_gt(metric(s, "perf/peak_memory_gb"), 0.0);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
    /* HiF4 W4A4 rollout against BF16 training: they differ, and the metrics say so */
    p = policy(FP4RL_PRESET_HIF4_RL, FP4RL_NUMERICS_BF16, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_OFF);
    s = new_session(&m, p, 3);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 8, sevens, NULL), FP4RL_OK);
    const double fp4_mean = metric(s, "mismatch/logp_abs_diff_mean");
    printf("mismatch: BF16 rollout max %.3g; HiF4 W4A4 rollout mean %.3g, k3 %.3g, act_zero %.3f\n", bf16_max, fp4_mean,
           metric(s, "mismatch/k3_kl"), metric(s, "quant/act_zero_frac"));
    ck_assert_msg(fp4_mean > 1e-3 && fp4_mean > 100 * bf16_max, "W4A4 mismatch mean %.3g", fp4_mean);
    ck_assert_double_gt(metric(s, "mismatch/k3_kl"), 0.0);
    ck_assert_double_gt(metric(s, "quant/act_zero_frac"), 0.0);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* ---- ResQ ---- */
static float *randn(int64_t n, uint64_t seed, int outliers)
{
    float *x = malloc((size_t)n * sizeof(float));
    add_rng r = {seed};
    for (int64_t i = 0; i < n; i++) {
        double u1 = (add_rand(&r, 1 << 30) + 1.0) / (1 << 30), u2 = add_rand(&r, 1 << 30) / (double)(1 << 30);
        x[i] = (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
        if (outliers && i % 61 == 3) x[i] *= 40.0f; /* outlier channels inflate the block scales */
    }
    return x;
}

START_TEST(test_resq_2_4_mask)
{
    const int64_t N = 5, K = 23;
    float *r = randn(N * K, 9, 0);
    ck_assert_int_eq(fp4rl_cpu_ops.resq_mask(ctx, r, N, K, FP4RL_RESQ_2_4), FP4RL_OK);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k0 = 0; k0 < K; k0 += 4) {
            int kept = 0, len = (int)(K - k0 < 4 ? K - k0 : 4);
            for (int i = 0; i < len; i++) kept += r[n * K + k0 + i] != 0.0f;
            ck_assert_int_eq(kept, len < 2 ? len : 2);
        }
    /* the kept two are the largest magnitudes; ties go to the lower index */
    float g[8] = {1, -3, 2, 3, 0.5f, 0.5f, 0.5f, 0.1f};
    ck_assert_int_eq(fp4rl_cpu_ops.resq_mask(ctx, g, 1, 8, FP4RL_RESQ_2_4), FP4RL_OK);
    const float want[8] = {0, -3, 0, 3, 0.5f, 0.5f, 0, 0};
    ck_assert_mem_eq(g, want, sizeof want);
    free(r);
}
END_TEST

/* y = rollout_linear(x) for an [N, IN] x with the policy's ResQ pattern. */
static float *resq_output(fp4rl_model *m, fp4rl_resq pattern, const float *x, const float *w, int64_t N, int64_t IN, int64_t OUT)
{
    fp4rl_quant_policy_set(m->policy, FP4RL_QP_RESQ, pattern);
    fp4rl_arena a = {.ctx = ctx};
    fp4rl_linear_spec s = fp4rl_block_linear_spec(m, 0, 1);
    float *y = malloc((size_t)(N * OUT) * sizeof(float)), *wq = malloc((size_t)(OUT * IN) * sizeof(float));
    float *xc = malloc((size_t)(N * IN) * sizeof(float)), *wc = malloc((size_t)(OUT * IN) * sizeof(float));
    memcpy(xc, x, (size_t)(N * IN) * sizeof(float));
    memcpy(wc, w, (size_t)(OUT * IN) * sizeof(float));
    ck_assert_int_eq(fp4rl_linear_operand(m, &a, wq, wc, OUT, IN, &s, FP4RL_ROLE_WEIGHT, 0), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rollout_linear(m, &a, &s, pattern, y, xc, wq, NULL, N, IN, OUT, NULL), FP4RL_OK);
    fp4rl_arena_free(&a);
    free(wq);
    free(xc);
    free(wc);
    return y;
}

START_TEST(test_resq_properties)
{
    fp4rl_quant_policy *p = policy(FP4RL_PRESET_HIF4_RL, FP4RL_NUMERICS_FP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_OFF);
    fp4rl_model *m;
    ck_assert_int_eq(fp4rl_model_create(&m, ctx, TINY, p, 1), FP4RL_OK);
    const int64_t N = 64, IN = 256, OUT = 48;
    float *x = randn(N * IN, 11, 1), *w = randn(OUT * IN, 12, 0);
    /* error against the exact product of X and the quantized W: dense ResQ recovers the activation
     * residual, so it must be far below no ResQ; 2:4 in between */
    fp4rl_quant_policy_set(m->policy, FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_W4A16);
    float *yw = resq_output(m, FP4RL_RESQ_OFF, x, w, N, IN, OUT); /* FP4 weights, BF16 activations */
    fp4rl_quant_policy_set(m->policy, FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_W4A4);
    float *y_off = resq_output(m, FP4RL_RESQ_OFF, x, w, N, IN, OUT), *y_dense = resq_output(m, FP4RL_RESQ_DENSE, x, w, N, IN, OUT);
    float *y_24 = resq_output(m, FP4RL_RESQ_2_4, x, w, N, IN, OUT);
    double e_off = 0, e_dense = 0, e_24 = 0, ref = 0;
    for (int64_t i = 0; i < N * OUT; i++) {
        e_off += pow(y_off[i] - yw[i], 2);
        e_dense += pow(y_dense[i] - yw[i], 2);
        e_24 += pow(y_24[i] - yw[i], 2);
        ref += pow(yw[i], 2);
    }
    printf("resq: output rel. MSE vs W4A16: off %.4g, 2:4 %.4g, dense %.4g\n", e_off / ref, e_24 / ref, e_dense / ref);
    ck_assert_double_lt(e_dense, 0.25 * e_off);
    ck_assert_double_lt(e_24, e_off);
    /* batch invariance: row 5 alone and inside the batch of 64 */
    for (int k = 0; k < 2; k++) {
        fp4rl_resq pat = k ? FP4RL_RESQ_CHANNEL_50 : FP4RL_RESQ_2_4;
        float *yb = resq_output(m, pat, x, w, N, IN, OUT), *y1 = resq_output(m, pat, x + 5 * IN, w, 1, IN, OUT);
        double d = 0, s = 0;
        for (int64_t j = 0; j < OUT; j++) {
            d = fmax(d, fabs(yb[5 * OUT + j] - y1[j]));
            s = fmax(s, fabs(y1[j]));
        }
        if (pat == FP4RL_RESQ_2_4) ck_assert_msg(d <= 1e-5 * s, "2:4 is not batch-invariant: %.3g", d / s);
        else ck_assert_msg(d > 1e-3 * s, "channel-50 unexpectedly batch-invariant (%.3g)", d / s);
        free(yb);
        free(y1);
    }
    free(x); free(w); free(yw); free(y_off); free(y_dense); free(y_24);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* ---- errors ---- */
static int fail_on_fifth(void *user, size_t pi, const int32_t *p, size_t pl, const int32_t *c, size_t cl, double *r)
{
    int *calls = user;
    (void)pi; (void)p; (void)pl; (void)c; (void)cl;
    *r = 0.5;
    return ++*calls == 5 ? 42 : 0;
}
static int nan_reward(void *user, size_t pi, const int32_t *p, size_t pl, const int32_t *c, size_t cl, double *r)
{
    (void)user; (void)pi; (void)p; (void)pl; (void)c; (void)cl;
    *r = NAN;
    return 0;
}

static float *all_params(fp4rl_model *m)
{
    float *w = malloc((size_t)m->total * sizeof(float));
    ck_assert_int_eq(m->ctx->be->download(m->ctx, w, m->w, (size_t)m->total * sizeof(float)), FP4RL_OK);
    return w;
}

START_TEST(test_errors)
{
    fp4rl_quant_policy *p = policy(FP4RL_PRESET_HIF4_RL, FP4RL_NUMERICS_FP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4);
    fp4rl_model *m;
    fp4rl_rl_session *s = new_session(&m, p, 4);
    int32_t tok[4 * 43];
    size_t off[5];
    prompts_for(2, 4, tok, off);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 4, sevens, NULL), FP4RL_OK); /* one real step first */
    float *before = all_params(m);
    int64_t step_before = m->step, steps;
    int calls = 0;
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 4, fail_on_fifth, &calls), FP4RL_ERR_CALLBACK);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "completion 4"));
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "returned 42"));
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 4, nan_reward, NULL), FP4RL_ERR_CALLBACK);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "completion 0"));
    float *after = all_params(m);
    ck_assert_mem_eq(before, after, (size_t)m->total * sizeof(float));
    ck_assert_int_eq(m->step, step_before);
    fp4rl_rl_session_step_count(s, &steps);
    ck_assert_int_eq(steps, 1);
    /* hostile arguments */
    size_t zero_len[3] = {0, 3, 3}, bad0[2] = {1, 4};
    ck_assert_int_eq(fp4rl_rl_session_step(NULL, tok, off, 4, sevens, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_rl_session_step(s, NULL, off, 4, sevens, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, NULL, 4, sevens, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 0, sevens, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 4, NULL, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, zero_len, 2, sevens, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "empty"));
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, bad0, 1, sevens, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    /* offsets that wrap or overflow are refused before any token is read (ASan: no overflow) */
    const size_t wraps[][3] = {{0, SIZE_MAX, 2}, {0, ((size_t)1 << 63) + 5, 3}, {0, 3, SIZE_MAX - 1}, {0, SIZE_MAX - 10, 2}};
    for (int k = 0; k < 4; k++) {
        ck_assert_int_ne(fp4rl_rl_session_step(s, tok, wraps[k], 2, sevens, NULL), FP4RL_OK);
        ck_assert_int_ne(fp4rl_rl_session_rollout(s, tok, wraps[k], 2), FP4RL_OK);
    }
    int32_t longp[40] = {0};
    size_t loff[2] = {0, 30}; /* 30 + 4 new tokens > 32 positions */
    ck_assert_int_eq(fp4rl_rl_session_step(s, longp, loff, 1, sevens, NULL), FP4RL_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "context"));
    int32_t badtok[3] = {1, 99, 2};
    size_t boff[2] = {0, 3};
    ck_assert_int_eq(fp4rl_rl_session_step(s, badtok, boff, 1, sevens, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_GROUP_SIZE, 1), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "group_size"));
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_TEMPERATURE, 0), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_TIS_CAP, 0.5), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_rl_session_set(s, (fp4rl_rlparam)99, 1), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_rl_session_train(s), FP4RL_ERR_INVALID_ARGUMENT); /* no rollout */
    double r[2] = {0, 0};
    ck_assert_int_eq(fp4rl_rl_session_set_rewards(s, r, 2), FP4RL_ERR_INVALID_ARGUMENT);
    double v;
    ck_assert_int_eq(fp4rl_rl_session_metric(s, "nope", &v), FP4RL_ERR_INVALID_ARGUMENT);
    int32_t badstop = 77;
    ck_assert_int_eq(fp4rl_rl_session_set_stop_tokens(s, &badstop, 1), FP4RL_ERR_INVALID_ARGUMENT);
    fp4rl_rl_session *s2;
    ck_assert_int_eq(fp4rl_rl_session_create(&s2, ctx, NULL, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_rl_session_load(s, "/nonexistent/ckpt"), FP4RL_ERR_IO);
    free(before);
    free(after);
    fp4rl_rl_session_destroy(s);
    fp4rl_rl_session_destroy(NULL);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* The split API: rollout, read completions and their log mu, set rewards, train. */
START_TEST(test_split_api_and_metrics)
{
    fp4rl_quant_policy *p = policy(FP4RL_PRESET_HIF4_RL, FP4RL_NUMERICS_FP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4);
    fp4rl_model *m;
    fp4rl_rl_session *s = new_session(&m, p, 6);
    int32_t tok[3 * 43];
    size_t off[4], n;
    prompts_for(3, 3, tok, off);
    ck_assert_int_eq(fp4rl_rl_session_rollout(s, tok, off, 3), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_num_completions(s, &n), FP4RL_OK);
    ck_assert_uint_eq(n, 12);
    double r[12];
    for (size_t i = 0; i < n; i++) {
        int32_t c[4];
        float lp[4];
        size_t len, pi;
        ck_assert_int_eq(fp4rl_rl_session_completion(s, i, c, lp, 4, &len, &pi), FP4RL_OK);
        ck_assert_uint_eq(pi, i / 4);
        ck_assert(len >= 1 && len <= 4);
        for (size_t j = 0; j < len; j++) ck_assert(lp[j] <= 0.0f && isfinite(lp[j]));
        ck_assert_int_eq(fp4rl_rl_session_completion(s, i, c, lp, 0, &len, NULL), len ? FP4RL_ERR_SHAPE : FP4RL_OK);
        sevens(NULL, pi, NULL, 0, c, len, &r[i]);
    }
    ck_assert_int_eq(fp4rl_rl_session_set_rewards(s, r, 12), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_train(s), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_num_completions(s, &n), FP4RL_OK);
    ck_assert_uint_eq(n, 0);
    char json[4096];
    size_t need;
    ck_assert_int_eq(fp4rl_rl_session_metrics_json(s, json, 10, &need), FP4RL_ERR_SHAPE);
    ck_assert_int_eq(fp4rl_rl_session_metrics_json(s, json, sizeof json, &need), FP4RL_OK);
    ck_assert_uint_eq(strlen(json) + 1, need);
    for (size_t i = 0; fp4rl_rl_session_metric_name(i); i++) ck_assert_ptr_nonnull(strstr(json, fp4rl_rl_session_metric_name(i)));
    ck_assert_ptr_nonnull(strstr(json, "\"step\": 1"));
    ck_assert_double_eq_tol(metric(s, "lr"), 1e-3, 1e-12);
    ck_assert_double_gt(metric(s, "grad_norm"), 0);
    ck_assert(metric(s, "entropy") > 0);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* The mean reward of 8 samples for each of n fixed held-out prompts (a fixed sampling seed), in
 * the rollout numerics: the quantity RL maximises, without the noise of changing prompts. */
static double held_out_reward(fp4rl_rl_session *eval, const int32_t *pt, const size_t *off, size_t n)
{
    fp4rl_rl_session_set(eval, FP4RL_RL_SEED, 4242); /* the same samples' randomness each time */
    ck_assert_int_eq(fp4rl_rl_session_rollout(eval, pt, off, n), FP4RL_OK);
    double sum = 0;
    for (size_t i = 0; i < 8 * n; i++) {
        int32_t c[4];
        size_t len;
        ck_assert_int_eq(fp4rl_rl_session_completion(eval, i, c, NULL, 4, &len, NULL), FP4RL_OK);
        sum += add_reward(pt + off[i / 8], off[i / 8 + 1] - off[i / 8], c, len);
    }
    return sum / (double)(8 * n);
}

/* End to end on the built-in task: a short supervised warm-up, then FP4 RL raises the reward. */
START_TEST(test_rl_raises_reward)
{
    static const char *SMALL =
        "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 64, \"intermediate_size\": 128,"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"max_position_embeddings\": 32, \"tie_word_embeddings\": true}";
    fp4rl_quant_policy *p = policy(FP4RL_PRESET_HIF4_RL, FP4RL_NUMERICS_FP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4);
    fp4rl_model *m;
    fp4rl_rl_session *s, *eval;
    const int32_t stop = ADD_END;
    ck_assert_int_eq(fp4rl_model_create(&m, ctx, SMALL, p, 7), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_create(&s, ctx, m, NULL), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_create(&eval, ctx, m, NULL), FP4RL_OK);
    fp4rl_rl_session_set_stop_tokens(s, &stop, 1);
    fp4rl_rl_session_set_stop_tokens(eval, &stop, 1);
    fp4rl_rl_session_set(eval, FP4RL_RL_GROUP_SIZE, 8);
    fp4rl_rl_session_set(eval, FP4RL_RL_MAX_NEW_TOKENS, 4);
    fp4rl_model_set_hparam(m, FP4RL_MP_LR, 3e-3);
    add_rng rng = {77}, eval_rng = {78};
    enum { B = 32, T = 8, E = 128 };
    int32_t tok[B * T], len[B], ept[E * 6];
    size_t eoff[E + 1];
    float mask[B * T];
    add_batch(&eval_rng, 9, E, ept, eoff);
    for (int step = 0; step < 150; step++) { /* warm up until partly right */
        memset(tok, 0, sizeof tok);
        memset(mask, 0, sizeof mask);
        for (int b = 0; b < B; b++) len[b] = (int32_t)add_sequence(add_rand(&rng, 10), add_rand(&rng, 10), tok + b * T, mask + b * T);
        ck_assert_int_eq(fp4rl_model_train_step(m, tok, len, mask, B, T, NULL, NULL), FP4RL_OK);
    }
    const double r0 = held_out_reward(eval, ept, eoff, E);
    fp4rl_rl_session_set(s, FP4RL_RL_GROUP_SIZE, 8);
    fp4rl_rl_session_set(s, FP4RL_RL_MAX_NEW_TOKENS, 4);
    fp4rl_rl_session_set(s, FP4RL_RL_LR, 1e-3);
    fp4rl_rl_session_set(s, FP4RL_RL_CLIP_HIGH, 0.28);
    int32_t pt[32 * 6];
    size_t off[33];
    for (int k = 0; k < 24; k++) {
        add_batch(&rng, 9, 32, pt, off);
        ck_assert_msg(fp4rl_rl_session_step(s, pt, off, 32, add_reward_fn, NULL) == FP4RL_OK, "%s", fp4rl_last_error());
        if (getenv("FP4RL_TEST_VERBOSE")) printf("rl step %d reward %.3f\n", k, metric(s, "reward/mean"));
    }
    const double r1 = held_out_reward(eval, ept, eoff, E);
    printf("rl: held-out mean reward %.3f after the warm-up, %.3f after 24 FP4 RL steps\n", r0, r1);
    ck_assert_msg(r1 > r0 + 0.03, "held-out reward %.3f -> %.3f", r0, r1);
    fp4rl_rl_session_destroy(eval);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* A resume's fresh process state: another context, with another seed, in place of the first
 * (returned); end_resume destroys both runs and puts the first context back. */
static fp4rl_context *fresh_context(void)
{
    fp4rl_context *first = ctx;
    ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    fp4rl_context_set_seed(ctx, 999);
    return first;
}

static void end_resume(fp4rl_context *first, fp4rl_rl_session *s2, fp4rl_model *m2, fp4rl_rl_session *s, fp4rl_model *m,
                       fp4rl_quant_policy *p)
{
    fp4rl_rl_session_destroy(s2);
    fp4rl_model_destroy(m2);
    fp4rl_context_destroy(ctx);
    ctx = first;
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}

/* Save after step 1; an uninterrupted run of steps 2-3 and a resumed one are bit-identical. */
START_TEST(test_checkpoint_resume)
{
    fp4rl_quant_policy *p = policy(FP4RL_PRESET_HIF4_RL, FP4RL_NUMERICS_FP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4);
    fp4rl_model *m, *m2;
    fp4rl_rl_session *s = new_session(&m, p, 8);
    fp4rl_rl_session_set(s, FP4RL_RL_KL_COEF, 0.01); /* the reference weights travel too */
    fp4rl_rl_session_set(s, FP4RL_RL_MINIBATCHES, 2);
    char dir[] = "/tmp/fp4rl_ckpt_XXXXXX", ck[600];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    int32_t tok[3][4 * 43];
    size_t off[3][5];
    for (int k = 0; k < 3; k++) prompts_for(10 + (uint64_t)k, 4, tok[k], off[k]);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok[0], off[0], 4, sevens, NULL), FP4RL_OK);
    ck_assert_msg(fp4rl_rl_session_save(s, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert_msg(fp4rl_rl_session_save(s, ck) == FP4RL_OK, "%s", fp4rl_last_error()); /* over an existing one */
    for (int k = 1; k < 3; k++) ck_assert_int_eq(fp4rl_rl_session_step(s, tok[k], off[k], 4, sevens, NULL), FP4RL_OK);
    float *want = all_params(m);
    char want_json[4096], got_json[4096];
    ck_assert_int_eq(fp4rl_rl_session_metrics_json(s, want_json, sizeof want_json, NULL), FP4RL_OK);

    /* a fresh process state: another context with other seeds, another model init */
    fp4rl_context *ctx0 = fresh_context();
    fp4rl_quant_policy *p0 = policy(FP4RL_PRESET_DEFAULT, FP4RL_NUMERICS_BF16, FP4RL_NUMERICS_BF16, FP4RL_RESQ_OFF);
    fp4rl_rl_session *s2 = new_session(&m2, p0, 123);
    ck_assert_msg(fp4rl_rl_session_load(s2, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    int64_t steps;
    fp4rl_rl_session_step_count(s2, &steps);
    ck_assert_int_eq(steps, 1);
    for (int k = 1; k < 3; k++) ck_assert_int_eq(fp4rl_rl_session_step(s2, tok[k], off[k], 4, sevens, NULL), FP4RL_OK);
    float *got = all_params(m2);
    ck_assert_mem_eq(want, got, (size_t)m->total * sizeof(float));
    ck_assert_int_eq(fp4rl_rl_session_metrics_json(s2, got_json, sizeof got_json, NULL), FP4RL_OK);
    /* the same step and rewards (timings differ) */
    ck_assert_double_eq(metric(s2, "reward/mean"), metric(s, "reward/mean"));
    ck_assert_double_eq(metric(s2, "pg/loss"), metric(s, "pg/loss"));
    ck_assert_int_eq(m2->step, m->step);
    /* a corrupt checkpoint changes nothing */
    char st_path[700];
    snprintf(st_path, sizeof st_path, "%s/state.json", ck);
    FILE *f = fopen(st_path, "w");
    fputs("{\"format\": \"fp4rl-rl-checkpoint\", \"version\": 1}", f);
    fclose(f);
    ck_assert_int_eq(fp4rl_rl_session_load(s2, ck), FP4RL_ERR_CORRUPT);
    float *still = all_params(m2);
    ck_assert_mem_eq(got, still, (size_t)m->total * sizeof(float));
    rm_rf(dir);
    free(want); free(got); free(still);
    fp4rl_quant_policy_destroy(p0);
    end_resume(ctx0, s2, m2, s, m, p);
}
END_TEST

/* Rewrites dir/state.json: array `key` to its first n entries (n >= 0), else string `key` to
 * `value` (NULL: removed). */
static void rewrite_state(const char *dir, const char *key, int n, const char *value)
{
    char path[700];
    snprintf(path, sizeof path, "%s/state.json", dir);
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    char *text = calloc(1 << 16, 1);
    const size_t len = fread(text, 1, (1 << 16) - 1, f);
    fclose(f);
    cJSON *root = cJSON_ParseWithLength(text, len);
    ck_assert_ptr_nonnull(root);
    cJSON *hp = cJSON_GetObjectItemCaseSensitive(root, key);
    while (n >= 0 && cJSON_GetArraySize(hp) > n) cJSON_DeleteItemFromArray(hp, cJSON_GetArraySize(hp) - 1);
    if (n < 0) cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    if (n < 0 && value) cJSON_AddStringToObject(root, key, value);
    char *out = cJSON_Print(root);
    f = fopen(path, "wb");
    fputs(out, f);
    fclose(f);
    cJSON_free(out);
    cJSON_Delete(root);
    free(text);
}

/* FP4RL_RL_ALLREDUCE_BF16: a 0/1 parameter, saved with the rest; checkpoints written before it
 * existed (16 session parameters) still load and keep the session's value. */
START_TEST(test_checkpoint_before_allreduce_param)
{
    fp4rl_model *m;
    fp4rl_rl_session *s = new_session(&m, NULL, 4);
    double v = -1;
    ck_assert_int_eq(fp4rl_rl_session_get(s, FP4RL_RL_ALLREDUCE_BF16, &v), FP4RL_OK);
    ck_assert_double_eq(v, 0);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_ALLREDUCE_BF16, 2), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "allreduce_bf16"));
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_ALLREDUCE_BF16, 1), FP4RL_OK);
    int32_t tok[2 * 43];
    size_t off[3];
    prompts_for(21, 2, tok, off);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 2, sevens, NULL), FP4RL_OK); /* one process: no effect */
    char dir[] = "/tmp/fp4rl_ckpt_XXXXXX", ck[600];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    ck_assert_msg(fp4rl_rl_session_save(s, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    fp4rl_model *m2;
    fp4rl_rl_session *s2 = new_session(&m2, NULL, 5);
    ck_assert_msg(fp4rl_rl_session_load(s2, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert_int_eq(fp4rl_rl_session_get(s2, FP4RL_RL_ALLREDUCE_BF16, &v), FP4RL_OK);
    ck_assert_double_eq(v, 1); /* saved */
    /* an older checkpoint: 16 parameters; the 17th keeps the loading session's value */
    rewrite_state(ck, "session_params", 16, NULL);
    ck_assert_int_eq(fp4rl_rl_session_set(s2, FP4RL_RL_ALLREDUCE_BF16, 0), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s2, FP4RL_RL_LR, 0.5), FP4RL_OK);
    ck_assert_msg(fp4rl_rl_session_load(s2, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert_int_eq(fp4rl_rl_session_get(s2, FP4RL_RL_ALLREDUCE_BF16, &v), FP4RL_OK);
    ck_assert_double_eq(v, 0);
    ck_assert_int_eq(fp4rl_rl_session_get(s2, FP4RL_RL_LR, &v), FP4RL_OK);
    ck_assert_double_eq(v, 1e-3); /* the checkpoint's */
    /* fewer than that is corrupt */
    rewrite_state(ck, "session_params", 15, NULL);
    ck_assert_int_eq(fp4rl_rl_session_load(s2, ck), FP4RL_ERR_CORRUPT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "session_params"));
    rm_rf(dir);
    fp4rl_rl_session_destroy(s2);
    fp4rl_model_destroy(m2);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
}
END_TEST

/* the moments of a model as host floats: [0, n) m, [n, 2n) v */
static float *moments_of(const fp4rl_model *m)
{
    float *h = malloc((size_t)m->total * 2 * sizeof(float));
    ck_assert_int_eq(fp4rl_model_moments_to_host(m, h, h + m->total), FP4RL_OK);
    return h;
}

static double moments_setting(const fp4rl_model *m)
{
    double v = -1;
    ck_assert_int_eq(fp4rl_model_get_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, &v), FP4RL_OK);
    return v;
}

/* BF16 optimizer moments in a checkpoint: stored as BF16, their dtype in state.json; a fresh
 * model (FP32 moments) that loads it takes BF16 moments and resumes bit-identically; an FP32
 * checkpoint brings FP32 moments back into a BF16 model; one written before the parameter
 * existed (FP32 moments, 8 model parameters, no dtype) keeps the model's BF16 setting and rounds
 * the moments to nearest; a dtype in state.json that is not the file's is corrupt. */
START_TEST(test_checkpoint_bf16_moments)
{
    fp4rl_quant_policy *p = policy(FP4RL_PRESET_HIF4_RL, FP4RL_NUMERICS_FP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4);
    fp4rl_model *m, *m2;
    fp4rl_rl_session *s = new_session(&m, p, 8);
    ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_OPTIMIZER_MOMENTS, 1), FP4RL_OK);
    char dir[] = "/tmp/fp4rl_ckpt_XXXXXX", ck[600], ck2[600], path[700];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    snprintf(ck2, sizeof ck2, "%s/ckpt_f32", dir);
    int32_t tok[3][4 * 43];
    size_t off[3][5];
    for (int k = 0; k < 3; k++) prompts_for(30 + (uint64_t)k, 4, tok[k], off[k]);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok[0], off[0], 4, sevens, NULL), FP4RL_OK);
    ck_assert_msg(fp4rl_rl_session_save(s, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    for (int k = 1; k < 3; k++) ck_assert_int_eq(fp4rl_rl_session_step(s, tok[k], off[k], 4, sevens, NULL), FP4RL_OK);
    float *want = all_params(m), *want_mo = moments_of(m);
    const int64_t n = m->total;
    /* the file: BF16 moments, and state.json says so */
    fp4rl_st *fo;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", ck);
    ck_assert_int_eq(fp4rl_st_open_path(&fo, path), FP4RL_OK);
    ck_assert_int_eq(fp4rl_st_find(fo, "adam_m")->dtype, FP4RL_ST_BF16);
    ck_assert_int_eq(fp4rl_st_find(fo, "adam_v")->dtype, FP4RL_ST_BF16);
    ck_assert_uint_eq(fp4rl_st_find(fo, "adam_v")->nbytes, (size_t)n * 2);
    fp4rl_st_close(fo);
    snprintf(path, sizeof path, "%s/state.json", ck);
    uint8_t *text;
    size_t len;
    ck_assert_int_eq(fp4rl_read_file(path, 1 << 20, &text, &len, "test"), FP4RL_OK);
    cJSON *root = cJSON_ParseWithLength((const char *)text, len);
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(root, "optimizer_moments")->valuestring, "bf16");
    cJSON_Delete(root);
    free(text);

    /* a fresh process state: another context, a model with FP32 moments */
    fp4rl_context *ctx0 = fresh_context();
    fp4rl_rl_session *s2 = new_session(&m2, NULL, 123);
    ck_assert_double_eq(moments_setting(m2), 0);
    ck_assert_msg(fp4rl_rl_session_load(s2, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert_double_eq(moments_setting(m2), 1);
    for (int k = 1; k < 3; k++) ck_assert_int_eq(fp4rl_rl_session_step(s2, tok[k], off[k], 4, sevens, NULL), FP4RL_OK);
    float *got = all_params(m2), *got_mo = moments_of(m2);
    ck_assert_mem_eq(want, got, (size_t)n * sizeof(float));
    ck_assert_mem_eq(want_mo, got_mo, (size_t)n * 2 * sizeof(float));
    ck_assert_int_eq(m2->step, m->step);

    /* an FP32 checkpoint loaded by a BF16 model: its FP32 moments, exactly */
    ck_assert_int_eq(fp4rl_model_set_hparam(m2, FP4RL_MP_OPTIMIZER_MOMENTS, 0), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_step(s2, tok[0], off[0], 4, sevens, NULL), FP4RL_OK); /* moments off the BF16 grid */
    ck_assert_msg(fp4rl_rl_session_save(s2, ck2) == FP4RL_OK, "%s", fp4rl_last_error());
    float *f32 = moments_of(m2);
    ck_assert_int_eq(fp4rl_model_set_hparam(m2, FP4RL_MP_OPTIMIZER_MOMENTS, 1), FP4RL_OK);
    ck_assert_msg(fp4rl_rl_session_load(s2, ck2) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert_double_eq(moments_setting(m2), 0);
    float *back = moments_of(m2);
    ck_assert_mem_eq(back, f32, (size_t)n * 2 * sizeof(float));
    /* the same checkpoint as one written before the parameter: the model's BF16 setting stays and
     * the FP32 moments are rounded to nearest BF16 */
    rewrite_state(ck2, "model_params", 8, NULL);
    rewrite_state(ck2, "optimizer_moments", -1, NULL);
    ck_assert_int_eq(fp4rl_model_set_hparam(m2, FP4RL_MP_OPTIMIZER_MOMENTS, 1), FP4RL_OK);
    ck_assert_msg(fp4rl_rl_session_load(s2, ck2) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert_double_eq(moments_setting(m2), 1);
    free(back);
    back = moments_of(m2);
    int64_t off_grid = 0;
    for (int64_t i = 0; i < 2 * n; i++) {
        ck_assert_msg(back[i] == fp4rl_round_bf16(f32[i]), "moment %lld: %.9g is not nearest BF16 of %.9g", (long long)i, back[i], f32[i]);
        off_grid += back[i] != f32[i];
    }
    ck_assert_int_gt(off_grid, n); /* a real conversion */
    /* a dtype in state.json other than the file's, or an unknown one: corrupt, nothing changes */
    float *before = all_params(m2);
    rewrite_state(ck2, "optimizer_moments", -1, "bf16");
    FP4RL_EXPECT(fp4rl_rl_session_load(s2, ck2), FP4RL_ERR_CORRUPT);
    ck_assert_msg(strstr(fp4rl_last_error(), "adam_m is F32"), "%s", fp4rl_last_error());
    rewrite_state(ck2, "optimizer_moments", -1, "fp8");
    FP4RL_EXPECT(fp4rl_rl_session_load(s2, ck2), FP4RL_ERR_CORRUPT);
    ck_assert_msg(strstr(fp4rl_last_error(), "optimizer_moments"), "%s", fp4rl_last_error());
    float *after = all_params(m2), *after_mo = moments_of(m2);
    ck_assert_mem_eq(before, after, (size_t)n * sizeof(float));
    ck_assert_mem_eq(back, after_mo, (size_t)n * 2 * sizeof(float));
    ck_assert_double_eq(moments_setting(m2), 1);
    rm_rf(dir);
    free(want), free(want_mo), free(got), free(got_mo), free(f32), free(back), free(before), free(after), free(after_mo);
    end_resume(ctx0, s2, m2, s, m, p);
}
END_TEST

/* ---- save targets (core/io/atomic_dir.c) ---- */
static void put_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}
static int file_is(const char *path, const char *text)
{
    char buf[256] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n == strlen(text) && memcmp(buf, text, n) == 0;
}
static int exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}
/* A save to `target` is refused with an error naming it; `witness` still holds `text`. */
static void save_refused(const fp4rl_rl_session *s, const char *target, const char *witness, const char *text)
{
    ck_assert_int_eq(fp4rl_rl_session_save(s, target), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), target));
    ck_assert(file_is(witness, text));
}
/* Creates the directory of template `dir` (mkdtemp) and names `name` in it into out. */
static void in_fresh_dir(char *dir, const char *name, char *out, size_t cap)
{
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_lt(snprintf(out, cap, "%s/%s", dir, name), (int)cap);
}
/* A pid that is no longer alive: a child that exited and was reaped. */
static long dead_pid(void)
{
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    waitpid(pid, NULL, 0);
    return (long)pid;
}

/* Saving replaces only a previous checkpoint; a regular file, a foreign directory and a symbolic
 * link are refused and left byte-identical; a killed save's leftovers are cleaned by the next
 * save or load, and a checkpoint a killed save left moved aside is put back. */
START_TEST(test_save_targets)
{
    fp4rl_model *m;
    fp4rl_rl_session *s = new_session(&m, NULL, 4);
    char dir[] = "/tmp/fp4rl_tgt_XXXXXX", file[600], foreign[600], link_p[600], ck[600], inner[700], path[800], path2[800], path3[900];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/notes.txt", dir);
    put_file(file, "the user's notes\n");
    save_refused(s, file, file, "the user's notes\n");
    snprintf(foreign, sizeof foreign, "%s/photos", dir);
    mkdir(foreign, 0755);
    snprintf(inner, sizeof inner, "%s/cat.jpg", foreign);
    put_file(inner, "meow");
    save_refused(s, foreign, inner, "meow");
    snprintf(link_p, sizeof link_p, "%s/link", dir);
    ck_assert_int_eq(symlink(foreign, link_p), 0);
    save_refused(s, link_p, inner, "meow");
    /* nothing was left next to them */
    char cmd[800];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 3", dir);
    ck_assert_int_eq(system(cmd), 0);
    /* an empty directory, then over a previous checkpoint */
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    mkdir(ck, 0755);
    ck_assert_msg(fp4rl_rl_session_save(s, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert_msg(fp4rl_rl_session_save(s, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    snprintf(path, sizeof path, "%s/.fp4rl-checkpoint", ck);
    ck_assert(exists(path));
    snprintf(path, sizeof path, "%s/.fp4rl-staging", ck);
    ck_assert(!exists(path));
    /* a checkpoint written before the marker: recognised by its state.json, replaced */
    snprintf(path, sizeof path, "%s/.fp4rl-checkpoint", ck);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_msg(fp4rl_rl_session_save(s, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert(exists(path));
    /* a killed save's staging directory is removed; a look-alike without the in-progress file
     * (not provably ours) and one of a live process stay */
    const long dead = dead_pid();
    char stale[700], lookalike[700], live[700];
    snprintf(stale, sizeof stale, "%s/.ckpt.fp4rl-tmp.%ld.aaaa", dir, dead);
    snprintf(lookalike, sizeof lookalike, "%s/.ckpt.fp4rl-tmp.%ld.bbbb", dir, dead);
    snprintf(live, sizeof live, "%s/.ckpt.fp4rl-tmp.%ld.cccc", dir, (long)getppid());
    mkdir(stale, 0755);
    mkdir(lookalike, 0755);
    mkdir(live, 0755);
    snprintf(path, sizeof path, "%s/.fp4rl-staging", stale);
    put_file(path, "pid\n");
    snprintf(path, sizeof path, "%s/model.safetensors", stale);
    put_file(path, "partial");
    snprintf(path, sizeof path, "%s/.fp4rl-staging", live);
    put_file(path, "pid\n");
    ck_assert_msg(fp4rl_rl_session_save(s, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert(!exists(stale));
    ck_assert(exists(lookalike));
    ck_assert(exists(live));
    /* killed between the two renames: the previous checkpoint is moved aside; load puts it back */
    snprintf(path, sizeof path, "%s/.ckpt.fp4rl-old.%ld.dddd", dir, dead);
    ck_assert_int_eq(rename(ck, path), 0);
    snprintf(path2, sizeof path2, "%s/.ckpt.fp4rl-tmp.%ld.dddd", dir, dead);
    mkdir(path2, 0755);
    snprintf(path3, sizeof path3, "%s/.fp4rl-staging", path2);
    put_file(path3, "pid\n");
    ck_assert_msg(fp4rl_rl_session_load(s, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert(exists(ck));
    ck_assert(!exists(path));
    ck_assert(!exists(path2));
    /* dir.old of a save of earlier versions is still read */
    snprintf(path, sizeof path, "%s.old", ck);
    ck_assert_int_eq(rename(ck, path), 0);
    ck_assert_msg(fp4rl_rl_session_load(s, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    rm_rf(dir);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
}
END_TEST

/* The end of a test: its directory, session, model and two weight copies go. */
static void finish(const char *dir, fp4rl_rl_session *s, fp4rl_model *m, float *before, float *after)
{
    rm_rf(dir);
    free(before);
    free(after);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
}

/* A metrics append that fails after the update (the JSONL path became a directory): the step
 * succeeds and reports the logging problem separately. */
START_TEST(test_metrics_append_failure)
{
    fp4rl_model *m;
    fp4rl_rl_session *s = new_session(&m, NULL, 4);
    char dir[] = "/tmp/fp4rl_mx_XXXXXX", log[600];
    in_fresh_dir(dir, "metrics.jsonl", log, sizeof log);
    ck_assert_int_eq(fp4rl_rl_session_set_metrics_file(s, log), FP4RL_OK);
    int32_t tok[2 * 43];
    size_t off[3];
    prompts_for(3, 2, tok, off);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 2, sevens, NULL), FP4RL_OK);
    ck_assert_double_eq(metric(s, "io/metrics_write_error"), 0);
    ck_assert_int_eq(unlink(log), 0);
    ck_assert_int_eq(mkdir(log, 0755), 0);
    float *before = all_params(m);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 2, sevens, NULL), FP4RL_OK);
    ck_assert_double_eq(metric(s, "io/metrics_write_error"), 1);
    float *after = all_params(m);
    ck_assert(memcmp(before, after, (size_t)m->total * sizeof(float)) != 0); /* the update was applied */
    int64_t steps;
    fp4rl_rl_session_step_count(s, &steps);
    ck_assert_int_eq(steps, 2);
    finish(dir, s, m, before, after);
}
END_TEST

/* Sets state.json's key (index >= 0: its array entry) to v in checkpoint `dir`; index -2 restores
 * the saved copy. */
static void edit_state(const char *dir, const char *key, int index, double v)
{
    char path[700], keep[700];
    snprintf(path, sizeof path, "%s/state.json", dir);
    snprintf(keep, sizeof keep, "%s/state.keep", dir);
    FILE *f = fopen(keep, "rb");
    if (!f) { /* first edit: keep the original */
        char cmd[1500];
        snprintf(cmd, sizeof cmd, "cp %s %s", path, keep);
        ck_assert_int_eq(system(cmd), 0);
        f = fopen(keep, "rb");
    }
    char *text = calloc(1 << 16, 1);
    const size_t len = fread(text, 1, (1 << 16) - 1, f);
    fclose(f);
    cJSON *root = cJSON_ParseWithLength(text, len);
    cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
    if (index >= 0) cJSON_ReplaceItemInArray(item, index, cJSON_CreateNumber(v));
    else cJSON_ReplaceItemInObjectCaseSensitive(root, key, cJSON_CreateNumber(v));
    char *out = cJSON_Print(root);
    put_file(path, out);
    cJSON_free(out);
    cJSON_Delete(root);
    free(text);
}

/* A checkpoint with any out-of-range field is refused with FP4RL_ERR_CORRUPT naming it, and the
 * session is unchanged: the loader applies exactly the setters' bounds. */
START_TEST(test_checkpoint_bounds)
{
    fp4rl_model *m;
    fp4rl_rl_session *s = new_session(&m, NULL, 4);
    char dir[] = "/tmp/fp4rl_bnd_XXXXXX", ck[600];
    in_fresh_dir(dir, "ckpt", ck, sizeof ck);
    ck_assert_msg(fp4rl_rl_session_save(s, ck) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_LR, 0.25), FP4RL_OK);
    float *before = all_params(m);
    static const struct { const char *key; int index; double v; const char *name; } bad[] = {
        {"session_params", FP4RL_RL_GROUP_SIZE, 0, "group_size"}, {"session_params", FP4RL_RL_GROUP_SIZE, 1, "group_size"},
        {"session_params", FP4RL_RL_GROUP_SIZE, -4, "group_size"}, {"session_params", FP4RL_RL_GROUP_SIZE, 1e300, "group_size"},
        {"session_params", FP4RL_RL_MAX_NEW_TOKENS, 0, "max_new_tokens"}, {"session_params", FP4RL_RL_MAX_NEW_TOKENS, 1e18, "max_new_tokens"},
        {"session_params", FP4RL_RL_TEMPERATURE, 0, "temperature"}, {"session_params", FP4RL_RL_TEMPERATURE, -1, "temperature"},
        {"session_params", FP4RL_RL_TEMPERATURE, 1e-40, "temperature"}, {"session_params", FP4RL_RL_TOP_K, 1e9, "top_k"},
        {"session_params", FP4RL_RL_LR, 0, "lr"}, {"session_params", FP4RL_RL_LR, -1, "lr"}, {"session_params", FP4RL_RL_LR, 1e300, "lr"},
        {"session_params", FP4RL_RL_WEIGHT_DECAY, 1e300, "weight_decay"}, {"session_params", FP4RL_RL_KL_COEF, 1e300, "kl_coef"},
        {"session_params", FP4RL_RL_CLIP_LOW, 5, "clip_low"}, {"session_params", FP4RL_RL_TIS_CAP, 0.5, "tis_cap"},
        {"session_params", FP4RL_RL_LOSS_AGG, 7, "loss_agg"}, {"session_params", FP4RL_RL_MINIBATCHES, 0, "minibatches"},
        {"session_params", FP4RL_RL_EPOCHS, 0, "epochs"}, {"session_params", FP4RL_RL_EPOCHS, 1e9, "epochs"},
        {"session_params", FP4RL_RL_GRAD_CLIP, -1, "grad_clip"}, {"session_params", FP4RL_RL_SEED, -1, "seed"},
        {"session_params", FP4RL_RL_SEED, 1e300, "seed"}, {"session_params", FP4RL_RL_ALLREDUCE_BF16, 9, "allreduce_bf16"},
        {"model_params", FP4RL_MP_BETA1, 1.5, "beta1"}, {"model_params", FP4RL_MP_ADAM_EPS, 0, "adam_eps"},
        {"model_params", FP4RL_MP_OPTIMIZER_MOMENTS, 2, "optimizer_moments"},
        {"session_steps", -1, 1.5, "session_steps"}, {"session_steps", -1, 1e300, "session_steps"},
        {"model_step", -1, 2.5, "model_step"}, {"stop_tokens", 0, 1.5, "stop_tokens"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        edit_state(ck, bad[k].key, bad[k].index, bad[k].v);
        ck_assert_msg(fp4rl_rl_session_load(s, ck) == FP4RL_ERR_CORRUPT, "%s[%d] = %g accepted", bad[k].key, bad[k].index, bad[k].v);
        ck_assert_msg(strstr(fp4rl_last_error(), bad[k].name), "%s", fp4rl_last_error());
        double lr;
        fp4rl_rl_session_get(s, FP4RL_RL_LR, &lr);
        ck_assert_double_eq(lr, 0.25);
    }
    float *after = all_params(m);
    ck_assert_mem_eq(before, after, (size_t)m->total * sizeof(float));
    finish(dir, s, m, before, after);
}
END_TEST

static float *device_copy(fp4rl_model *m, const float *dev)
{
    float *h = malloc((size_t)m->total * sizeof(float));
    ck_assert_int_eq(m->ctx->be->download(m->ctx, h, dev, (size_t)m->total * sizeof(float)), FP4RL_OK);
    return h;
}

/* A non-finite gradient, or an update that would leave a weight or moment non-finite, stops the
 * update: weights, AdamW moments and the step stay bit-identical, and the error names the
 * quantity. */
START_TEST(test_nonfinite_update)
{
    fp4rl_model *m;
    fp4rl_rl_session *s = new_session(&m, NULL, 4);
    int32_t tok[2 * 43];
    size_t off[3];
    prompts_for(3, 2, tok, off);
    ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 2, sevens, NULL), FP4RL_OK); /* moments are non-zero */
    float *w0 = device_copy(m, m->w), *m0 = device_copy(m, m->adam_m), *v0 = device_copy(m, m->adam_v);
    const int64_t step0 = m->step;
    float *g = calloc((size_t)m->total, sizeof(float));
    ck_assert(m->g == NULL); /* the step released its gradients; an update makes a buffer to fill */
    ck_assert_int_eq(fp4rl_model_grads(m), FP4RL_OK);
    g[m->total / 2] = INFINITY;
    ck_assert_int_eq(m->ctx->be->upload(m->ctx, m->g, g, (size_t)m->total * sizeof(float)), FP4RL_OK);
    ck_assert_int_eq(fp4rl_model_update(m, 1e-3, 0, 1.0, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "gradient norm"));
    float *w1 = device_copy(m, m->w), *m1 = device_copy(m, m->adam_m), *v1 = device_copy(m, m->adam_v);
    const size_t bytes = (size_t)m->total * sizeof(float);
    ck_assert_mem_eq(w0, w1, bytes);
    ck_assert_mem_eq(m0, m1, bytes);
    ck_assert_mem_eq(v0, v1, bytes);
    ck_assert_int_eq(m->step, step0);
    /* a finite gradient whose square overflows the second moment (no clipping): AdamW's dry run
     * refuses the update, and nothing changes either */
    g[m->total / 2] = 1e25f;
    ck_assert_int_eq(m->ctx->be->upload(m->ctx, m->g, g, (size_t)m->total * sizeof(float)), FP4RL_OK);
    ck_assert_int_eq(fp4rl_model_update(m, 1e-3, 0, 0.0, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "non-finite"));
    free(w1); free(m1); free(v1);
    w1 = device_copy(m, m->w), m1 = device_copy(m, m->adam_m), v1 = device_copy(m, m->adam_v);
    ck_assert_mem_eq(w0, w1, bytes);
    ck_assert_mem_eq(m0, m1, bytes);
    ck_assert_mem_eq(v0, v1, bytes);
    ck_assert_int_eq(m->step, step0);
    /* and a sane gradient still updates */
    g[m->total / 2] = 1e-3f;
    ck_assert_int_eq(m->ctx->be->upload(m->ctx, m->g, g, (size_t)m->total * sizeof(float)), FP4RL_OK);
    ck_assert_int_eq(fp4rl_model_update(m, 1e-3, 0, 0.0, NULL), FP4RL_OK);
    ck_assert_int_eq(m->step, step0 + 1);
    free(g); free(w0); free(m0); free(v0); free(w1); free(m1); free(v1);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
}
END_TEST

/* With one update per step, log pi_old is the training pass's own log-probs (no forward of its
 * own): the step equals one with the separate pass (the same weights, so the same log-probs) up
 * to the order of FP32 sums, and the mismatch metric is the same. */
START_TEST(test_old_logp_from_pass)
{
    float *w[2];
    double mm[2], loss[2];
    float *w0 = NULL;
    int64_t total = 0;
    for (int k = 0; k < 2; k++) {
        fp4rl_model *m;
        fp4rl_rl_session *s = new_session(&m, NULL, 4);
        s->separate_old_pass = k;
        int32_t tok[3 * 43];
        size_t off[4];
        prompts_for(3, 3, tok, off);
        if (!w0) w0 = device_copy(m, m->w);
        ctx->rng_offset = 0;
        ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 3, sevens, NULL), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_metric(s, "mismatch/logp_abs_diff_mean", &mm[k]), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_metric(s, "pg/loss", &loss[k]), FP4RL_OK);
        w[k] = device_copy(m, m->w);
        total = m->total;
        fp4rl_rl_session_destroy(s);
        fp4rl_model_destroy(m);
    }
    double dd = 0, dw = 0;
    for (int64_t i = 0; i < total; i++) {
        dd = fmax(dd, fabs((double)w[0][i] - w[1][i]));
        dw = fmax(dw, fabs((double)w[1][i] - w0[i]));
    }
    printf("log pi_old from the pass: max weight difference %.3g (update %.3g), mismatch %.6g / %.6g, loss %.9g / %.9g\n", dd, dw,
           mm[0], mm[1], loss[0], loss[1]);
    ck_assert(dw > 0);
    ck_assert_double_le(dd, 1e-6 * dw);
    ck_assert_double_le(fabs(mm[0] - mm[1]), 1e-6 * fmax(1e-9, mm[1]));
    ck_assert_double_le(fabs(loss[0] - loss[1]), 1e-6);
    free(w[0]);
    free(w[1]);
    free(w0);
}
END_TEST

/* The learning-rate schedule per update, against transformers' get_{linear,cosine}_schedule_with_warmup
 * written out here: lr(u) = lr * u / W in the warm-up (0 at the first update: the weights do not
 * move), then linear max(0, (N - u) / (N - W)) or cosine 0.5 (1 + cos(pi (u - W) / (N - W))). */
START_TEST(test_lr_schedule)
{
    const double lr = 1e-3;
    for (int sched = 1; sched <= 2; sched++) {
        const int W = sched == 1 ? 1 : 2, N = sched == 1 ? 4 : 6;
        fp4rl_model *m;
        fp4rl_rl_session *s = new_session(&m, NULL, 4);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_LR_SCHEDULE, 3), FP4RL_ERR_INVALID_ARGUMENT);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_WARMUP_STEPS, 1.5), FP4RL_ERR_INVALID_ARGUMENT);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_LR_SCHEDULE, sched), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_WARMUP_STEPS, W), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_TOTAL_STEPS, N), FP4RL_OK);
        int32_t tok[2 * 43];
        size_t off[3];
        prompts_for(5, 2, tok, off);
        float *w0 = device_copy(m, m->w);
        for (int u = 0; u <= N; u++) {
            ck_assert_int_eq(fp4rl_rl_session_step(s, tok, off, 2, sevens, NULL), FP4RL_OK);
            double got;
            ck_assert_int_eq(fp4rl_rl_session_metric(s, "lr", &got), FP4RL_OK);
            double f;
            if (u < W) f = (double)u / W;
            else if (sched == 1) f = fmax(0.0, (double)(N - u) / (double)(N - W));
            else f = fmax(0.0, 0.5 * (1.0 + cos(M_PI * (double)(u - W) / (double)(N - W))));
            ck_assert_msg(fabs(got - lr * f) <= 1e-15, "schedule %d, update %d: lr %.17g, expected %.17g", sched, u, got, lr * f);
            if (u == 0) { /* lr 0: AdamW with no decay leaves the weights as they were */
                float *w1 = device_copy(m, m->w);
                ck_assert_mem_eq(w0, w1, (size_t)m->total * sizeof(float));
                free(w1);
            }
        }
        free(w0);
        fp4rl_rl_session_destroy(s);
        fp4rl_model_destroy(m);
    }
}
END_TEST

int main(void)
{
    Suite *su = suite_create("session");
    TCase *tc = tcase_create("session");
    tcase_set_timeout(tc, 600);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_mismatch_bf16_vs_fp4);
    tcase_add_test(tc, test_resq_2_4_mask);
    tcase_add_test(tc, test_resq_properties);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_split_api_and_metrics);
    tcase_add_test(tc, test_rl_raises_reward);
    tcase_add_test(tc, test_checkpoint_resume);
    tcase_add_test(tc, test_checkpoint_before_allreduce_param);
    tcase_add_test(tc, test_checkpoint_bf16_moments);
    tcase_add_test(tc, test_save_targets);
    tcase_add_test(tc, test_metrics_append_failure);
    tcase_add_test(tc, test_checkpoint_bounds);
    tcase_add_test(tc, test_nonfinite_update);
    tcase_add_test(tc, test_old_logp_from_pass);
    tcase_add_test(tc, test_lr_schedule);
    suite_add_tcase(su, tc);
    return fp4rl_check_run(su);
}
