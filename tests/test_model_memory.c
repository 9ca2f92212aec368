/*
 * test_model_memory.c - the model at real depths and its activation memory: a deep narrow model
 * runs a forward, a supervised step and an RL step under every preset (the scratch list has no fixed
 * size); the LM head in chunks of rows equals the unchunked head.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/block.h"
#include "model/model.h"
#include "rl/rollout.h"
#include "rl/session.h"

static fp4rl_context *ctx;
static void setup(void)
{
    ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    fp4rl_context_set_seed(ctx, 5);
}
static void teardown(void) { fp4rl_context_destroy(ctx); }

/* A narrow Qwen2 config of `layers` layers and vocabulary `vocab`. */
static const char *config(int layers, int vocab)
{
    static char json[512];
    snprintf(json, sizeof json,
             "{\"model_type\": \"qwen2\", \"vocab_size\": %d, \"hidden_size\": 32, \"intermediate_size\": 64,"
             " \"num_hidden_layers\": %d, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
             " \"max_position_embeddings\": 128, \"tie_word_embeddings\": true}",
             vocab, layers);
    return json;
}

static fp4rl_quant_policy *preset_policy(fp4rl_preset preset, int bf16)
{
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_apply_preset(p, preset), FP4RL_OK);
    if (bf16) ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_BF16), FP4RL_OK);
    return p;
}

static void fill_tokens(int32_t *tok, int64_t n, int vocab)
{
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)((i * 7 + 3) % vocab);
}

/* A 28-layer model (1.5B's depth) under the HiF4 RL preset, whose 1D blocks need the most scratch
 * buffers: a forward and a supervised step run (the fixed arena failed from 18 layers on), and
 * recomputation at that depth equals keeping the activations. */
START_TEST(test_deep_model_runs)
{
    fp4rl_quant_policy *p = preset_policy(FP4RL_PRESET_HIF4_RL, 0);
    fp4rl_model *m;
    ck_assert_msg(fp4rl_model_create(&m, ctx, config(28, 64), p, 1) == FP4RL_OK, "%s", fp4rl_last_error());
    int32_t tok[2 * 16];
    fill_tokens(tok, 32, 64);
    float logits[2 * 16 * 64];
    ck_assert_msg(fp4rl_model_logits(m, tok, NULL, 2, 16, logits, sizeof logits) == FP4RL_OK, "%s", fp4rl_last_error());
    for (int i = 0; i < 2 * 16 * 64; i++) ck_assert(isfinite(logits[i]));
    double loss = 0, gn = 0;
    ck_assert_msg(fp4rl_model_train_step(m, tok, NULL, NULL, 2, 16, &loss, &gn) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert(isfinite(loss) && loss > 0 && gn > 0);
    /* at this depth, recomputation gives the stored activations' gradients bit for bit */
    float *g[2];
    for (int r = 0; r < 2; r++) {
        ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_RECOMPUTE, r), FP4RL_OK);
        ctx->rng_offset = 7;
        ck_assert_msg(fp4rl_model_compute_gradients(m, tok, NULL, NULL, 2, 16, &loss) == FP4RL_OK, "%s", fp4rl_last_error());
        g[r] = malloc((size_t)m->total * sizeof(float));
        memcpy(g[r], m->g, (size_t)m->total * sizeof(float));
    }
    ck_assert_mem_eq(g[0], g[1], (size_t)m->total * sizeof(float));
    free(g[0]);
    free(g[1]);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* A reward that varies within a group of a random model's completions. */
static int token_sum(void *user, size_t pi, const int32_t *p, size_t pl, const int32_t *c, size_t cl, double *r)
{
    (void)user; (void)pi; (void)p; (void)pl;
    double k = 0;
    for (size_t i = 0; i < cl; i++) k += c[i] % 5;
    *r = k;
    return 0;
}

/* The 28-layer model: one RL step under every preset and under BF16 numerics. */
START_TEST(test_deep_rl_step)
{
    const fp4rl_preset presets[4] = {FP4RL_PRESET_DEFAULT, FP4RL_PRESET_STABLE_2D_MXFP4, FP4RL_PRESET_HIF4_RL, FP4RL_PRESET_HIF4_RL};
    for (int k = 0; k < 4; k++) {
        fp4rl_quant_policy *p = preset_policy(presets[k], k == 3);
        fp4rl_model *m;
        ck_assert_msg(fp4rl_model_create(&m, ctx, config(28, 64), p, 1) == FP4RL_OK, "%s", fp4rl_last_error());
        fp4rl_rl_session *s;
        ck_assert_int_eq(fp4rl_rl_session_create(&s, ctx, m, p), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_GROUP_SIZE, 4), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_MAX_NEW_TOKENS, 6), FP4RL_OK);
        const int32_t prompts[6] = {1, 2, 3, 4, 5, 6};
        const size_t off[3] = {0, 3, 6};
        ck_assert_msg(fp4rl_rl_session_step(s, prompts, off, 2, token_sum, NULL) == FP4RL_OK, "case %d: %s", k, fp4rl_last_error());
        double gn;
        ck_assert_int_eq(fp4rl_rl_session_metric(s, "grad_norm", &gn), FP4RL_OK);
        ck_assert_msg(isfinite(gn), "case %d: grad norm %g", k, gn);
        fp4rl_rl_session_destroy(s);
        fp4rl_model_destroy(m);
        fp4rl_quant_policy_destroy(p);
    }
}
END_TEST

/* The W4B decode path (issue 16: the BF16 operand times the packed weights) at real depth and
 * vocabulary: the model and rollout of test_deep_w4_rollout with FP4RL_ROLLOUT_W4B=1 against =0. On
 * the CPU linear_forward_w4b is the BF16 GEMM over the same BF16 weight words, so every token and
 * log mu is the same bit for bit, and every block linear of all 28 layers took the path. */
START_TEST(test_deep_w4b_rollout)
{
    const char *cfg = "{\"model_type\": \"qwen2\", \"vocab_size\": 151936, \"hidden_size\": 64, \"intermediate_size\": 128,"
                      " \"num_hidden_layers\": 28, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                      " \"max_position_embeddings\": 64, \"tie_word_embeddings\": true}";
    fp4rl_quant_policy *p = preset_policy(FP4RL_PRESET_HIF4_RL, 0);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_W4A4), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_RESQ, FP4RL_RESQ_2_4), FP4RL_OK);
    fp4rl_model *m;
    ck_assert_msg(fp4rl_model_create(&m, ctx, cfg, p, 1) == FP4RL_OK, "%s", fp4rl_last_error());
    const int32_t prompts[7] = {151935, 4, 1000, 77, 150000, 3, 9};
    const size_t off[3] = {0, 4, 7};
    fp4rl_rollout_cfg rc = {.group = 4, .max_new = 3, .temperature = 1.0f, .seed = 3};
    fp4rl_rollout_result r4, rb;
    setenv("FP4RL_ROLLOUT_W4B", "1", 1);
    ck_assert_msg(fp4rl_rollout_run(m, &rc, prompts, off, 2, &r4) == FP4RL_OK, "%s", fp4rl_last_error());
    setenv("FP4RL_ROLLOUT_W4B", "0", 1);
    ck_assert_msg(fp4rl_rollout_run(m, &rc, prompts, off, 2, &rb) == FP4RL_OK, "%s", fp4rl_last_error());
    unsetenv("FP4RL_ROLLOUT_W4B");
    ck_assert_int_eq(r4.w4b_linears, 28 * 7);
    ck_assert_int_eq(rb.w4b_linears, 0);
    ck_assert_int_eq(r4.n_seqs, rb.n_seqs);
    ck_assert(!memcmp(r4.tokens, rb.tokens, (size_t)(r4.n_seqs * 3) * sizeof(int32_t)));
    ck_assert(!memcmp(r4.logprobs, rb.logprobs, (size_t)(r4.n_seqs * 3) * sizeof(float)));
    printf("28 layers, vocab 151936, HiF4 W4A4 + ResQ 2:4: W4B rollout bit for bit the BF16 fused one\n");
    fp4rl_rollout_result_free(&r4);
    fp4rl_rollout_result_free(&rb);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* The W4A4 decode path (issue 16) at real depth and vocabulary: 28 layers whose every K is whole
 * HiF4 units (width 64, intermediate 128), vocabulary 151,936, the HiF4 RL preset's W4A4 rollout
 * with ResQ 2:4. With FP4RL_ROLLOUT_W4=1 every block linear reads the packed weights (the CPU's
 * reference ops; 2 x 4 completions, so every forward is at most 2 x 8 operand rows); its first
 * tokens are those of the BF16 fused path (=0) and log mu agrees to summation-order noise. */
START_TEST(test_deep_w4_rollout)
{
    const char *cfg = "{\"model_type\": \"qwen2\", \"vocab_size\": 151936, \"hidden_size\": 64, \"intermediate_size\": 128,"
                      " \"num_hidden_layers\": 28, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                      " \"max_position_embeddings\": 64, \"tie_word_embeddings\": true}";
    fp4rl_quant_policy *p = preset_policy(FP4RL_PRESET_HIF4_RL, 0);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_W4A4), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_RESQ, FP4RL_RESQ_2_4), FP4RL_OK);
    fp4rl_model *m;
    ck_assert_msg(fp4rl_model_create(&m, ctx, cfg, p, 1) == FP4RL_OK, "%s", fp4rl_last_error());
    const int32_t prompts[7] = {151935, 4, 1000, 77, 150000, 3, 9};
    const size_t off[3] = {0, 4, 7};
    fp4rl_rollout_cfg rc = {.group = 4, .max_new = 3, .temperature = 1.0f, .seed = 3};
    fp4rl_rollout_result r4, rb;
    setenv("FP4RL_ROLLOUT_W4", "1", 1);
    ck_assert_msg(fp4rl_rollout_run(m, &rc, prompts, off, 2, &r4) == FP4RL_OK, "%s", fp4rl_last_error());
    setenv("FP4RL_ROLLOUT_W4", "0", 1);
    ck_assert_msg(fp4rl_rollout_run(m, &rc, prompts, off, 2, &rb) == FP4RL_OK, "%s", fp4rl_last_error());
    unsetenv("FP4RL_ROLLOUT_W4");
    ck_assert_int_eq(r4.w4_linears, 28 * 7);
    ck_assert_int_eq(rb.w4_linears, 0);
    double lp = 0;
    for (int64_t i = 0; i < r4.n_seqs; i++) {
        ck_assert_int_eq(r4.tokens[i * 3], rb.tokens[i * 3]);
        ck_assert(r4.tokens[i * 3] >= 0 && r4.tokens[i * 3] < 151936);
        lp = fmax(lp, fabs((double)r4.logprobs[i * 3] - rb.logprobs[i * 3]));
    }
    printf("28 layers, vocab 151936, HiF4 W4A4 + ResQ 2:4: W4A4 vs BF16 fused first-step max |d log mu| %.3g\n", lp);
    ck_assert_msg(lp <= 1e-4, "log mu differs by %g", lp);
    fp4rl_rollout_result_free(&r4);
    fp4rl_rollout_result_free(&rb);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* The hook path's per-token loss on the log-probs, sum_n w_n logp_n + 0.01 entropy_n, with weights
 * by the row's place in the whole batch (user: T). */
static fp4rl_status weighted_logp(void *user, int64_t b0, int64_t nb, const float *logp, const float *entropy, float *dlogp,
                                  double *loss)
{
    const int64_t T = *(const int64_t *)user;
    double l = 0;
    for (int64_t n = 0; n < nb * T; n++) {
        const float w = (float)(((b0 * T + n) % 5) - 2) / 7.0f;
        l += w * logp[n] + 0.01 * entropy[n];
        dlogp[n] = w;
    }
    *loss = l;
    return FP4RL_OK;
}

/* Gradients, loss, logits and log-probs with the head in chunks of 5 rows (and of 1 row) against
 * one chunk: equal up to the FP32 sum order of the head's weight gradient. */
START_TEST(test_chunked_head_equals_unchunked)
{
    fp4rl_quant_policy *p = preset_policy(FP4RL_PRESET_HIF4_RL, 0);
    fp4rl_model *m;
    ck_assert_msg(fp4rl_model_create(&m, ctx, config(2, 96), p, 3) == FP4RL_OK, "%s", fp4rl_last_error());
    enum { B = 3, T = 11, V = 96 };
    int32_t tok[B * T], len[B] = {11, 7, 9};
    fill_tokens(tok, B * T, V);
    float mask[B * T];
    for (int i = 0; i < B * T; i++) mask[i] = (float)(i % 3 != 0);
    const size_t budget[3] = {0, 5 * 11 * V * sizeof(float) / 2, 1};
    float *g[3], logits[3][B * T * V], lp[3][B * T];
    double loss[3], hloss[3];
    float *hg[3];
    int64_t T64 = T;
    const fp4rl_loss_hook hook = {weighted_logp, &T64};
    for (int k = 0; k < 3; k++) {
        m->head_chunk_bytes = budget[k];
        fp4rl_context_set_seed(ctx, 9); /* the same stochastic rounding in every run */
        ck_assert_msg(fp4rl_model_compute_gradients(m, tok, len, mask, B, T, &loss[k]) == FP4RL_OK, "%s", fp4rl_last_error());
        g[k] = malloc((size_t)m->total * sizeof(float));
        memcpy(g[k], m->g, (size_t)m->total * sizeof(float));
        fp4rl_context_set_seed(ctx, 9);
        ck_assert_msg(fp4rl_model_pass(m, &(fp4rl_pass){.tokens = tok, .lengths = len, .B = B, .T = T, .backward = 1, .loss = &hloss[k],
                                                        .hook = &hook, .temperature = 0.7f, .micro_tokens = 1 << 30, .fn = "test"}) == FP4RL_OK,
                      "%s", fp4rl_last_error());
        hg[k] = malloc((size_t)m->total * sizeof(float));
        memcpy(hg[k], m->g, (size_t)m->total * sizeof(float));
        ck_assert_int_eq(fp4rl_model_logits(m, tok, len, B, T, logits[k], sizeof logits[k]), FP4RL_OK);
        ck_assert_int_eq(fp4rl_model_token_logprobs(m, tok, len, B, T, lp[k], sizeof lp[k]), FP4RL_OK);
    }
    for (int k = 1; k < 3; k++) {
        const double eg = fp4rl_l2rel(g[k], g[0], m->total), eh = fp4rl_l2rel(hg[k], hg[0], m->total);
        ck_assert_msg(eg <= 1e-6 && eh <= 1e-6, "budget %zu: gradient rel. error %.3g (cross-entropy), %.3g (hook)", budget[k], eg, eh);
        ck_assert_double_le(fabs(loss[k] - loss[0]), 1e-6 * fabs(loss[0]));
        ck_assert_double_le(fabs(hloss[k] - hloss[0]), 1e-6 * fabs(hloss[0]));
        ck_assert_double_le(fp4rl_l2rel(logits[k], logits[0], B * T * V), 1e-6);
        ck_assert_double_le(fp4rl_l2rel(lp[k], lp[0], B * T), 1e-6);
    }
    ck_assert(loss[0] > 0 && hloss[0] != 0);
    for (int k = 0; k < 3; k++) {
        free(g[k]);
        free(hg[k]);
    }
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* Micro-batches of 1 and 3 sequences (and automatic sizing under a small memory budget) against
 * one pass: gradients, losses (cross-entropy and a per-token hook) and log-probs equal up to the
 * FP32 sum order (1e-6), under the HiF4 RL preset with nearest rounding (T = 64 keeps the 1D
 * blocks along tokens within a sequence) and in FP32 numerics. In BF16 numerics the bound is 1e-4:
 * OpenBLAS's sums differ in the last bit with the row count, and rounding the gradients to BF16
 * turns an occasional last-bit difference into a BF16 step. Automatic sizing picks micro-batches:
 * the peak memory drops. */
START_TEST(test_microbatches_equal_one_pass)
{
    const int64_t numerics[3] = {-1, FP4RL_NUMERICS_FP32, FP4RL_NUMERICS_BF16};
    for (int nk = 0; nk < 3; nk++) {
        fp4rl_quant_policy *p = preset_policy(FP4RL_PRESET_HIF4_RL, 0);
        if (numerics[nk] >= 0) ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, numerics[nk]), FP4RL_OK);
        const double tol = numerics[nk] == FP4RL_NUMERICS_BF16 ? 1e-4 : 1e-6;
        ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_ROUNDING_GRADIENT, FP4RL_ROUND_NEAREST), FP4RL_OK);
        fp4rl_model *m;
        ck_assert_msg(fp4rl_model_create(&m, ctx, config(2, 96), p, 3) == FP4RL_OK, "%s", fp4rl_last_error());
        enum { B = 5, T = 64, V = 96 };
        int32_t tok[B * T], len[B] = {64, 40, 64, 17, 51};
        fill_tokens(tok, B * T, V);
        float mask[B * T];
        for (int i = 0; i < B * T; i++) mask[i] = (float)(i % 3 != 0);
        int64_t T64 = T;
        const fp4rl_loss_hook hook = {weighted_logp, &T64};
        const int64_t micro[4] = {1 << 30, T, 3 * T, 0};
        float *g[4], *hg[4], lp[4][B * T];
        double loss[4], hloss[4];
        size_t peak[4];
        for (int k = 0; k < 4; k++) {
            size_t use, res;
            ctx->mem_budget = k == 3 ? (size_t)(4 << 20) : 0; /* automatic: 4 MiB left forces one sequence */
            ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_MICROBATCH_TOKENS, (double)micro[k]), FP4RL_OK);
            ck_assert_int_eq(fp4rl_context_reset_peak_memory(ctx), FP4RL_OK);
            ck_assert_msg(fp4rl_model_compute_gradients(m, tok, len, mask, B, T, &loss[k]) == FP4RL_OK, "%s", fp4rl_last_error());
            ck_assert_int_eq(fp4rl_context_memory(ctx, &use, &peak[k], &res), FP4RL_OK);
            g[k] = malloc((size_t)m->total * sizeof(float));
            memcpy(g[k], m->g, (size_t)m->total * sizeof(float));
            ck_assert_msg(fp4rl_model_pass(m, &(fp4rl_pass){.tokens = tok, .lengths = len, .B = B, .T = T, .backward = 1, .loss = &hloss[k],
                                                            .hook = &hook, .temperature = 0.7f, .micro_tokens = micro[k], .fn = "test"}) == FP4RL_OK,
                          "%s", fp4rl_last_error());
            hg[k] = malloc((size_t)m->total * sizeof(float));
            memcpy(hg[k], m->g, (size_t)m->total * sizeof(float));
            ck_assert_int_eq(fp4rl_model_token_logprobs(m, tok, len, B, T, lp[k], sizeof lp[k]), FP4RL_OK);
        }
        ctx->mem_budget = 0;
        for (int k = 1; k < 4; k++) {
            const double eg = fp4rl_l2rel(g[k], g[0], m->total), eh = fp4rl_l2rel(hg[k], hg[0], m->total);
            ck_assert_msg(eg <= tol && eh <= tol, "numerics %d, micro %lld: gradient rel. error %.3g (cross-entropy), %.3g (hook)",
                          nk, (long long)micro[k], eg, eh);
            ck_assert_double_le(fabs(loss[k] - loss[0]), 1e-6 * fabs(loss[0]));
            ck_assert_double_le(fabs(hloss[k] - hloss[0]), 1e-6 * fabs(hloss[0]));
            ck_assert_double_le(fp4rl_l2rel(lp[k], lp[0], B * T), 1e-6);
        }
        ck_assert(loss[0] > 0 && hloss[0] != 0);
        ck_assert_msg(peak[3] < peak[0] && peak[1] < peak[0], "peak bytes: one pass %zu, micro 1 %zu, automatic %zu", peak[0], peak[1], peak[3]);
        for (int k = 0; k < 4; k++) {
            free(g[k]);
            free(hg[k]);
        }
        fp4rl_model_destroy(m);
        fp4rl_quant_policy_destroy(p);
    }
}
END_TEST

/* Activation recomputation (FP4RL_MP_RECOMPUTE) gives bit-identical gradients and loss, also
 * with stochastic rounding of the activations and gradients (the recomputed forward draws the
 * same random numbers), with a lower peak; and automatic micro-batches under a budget that
 * cannot hold one sequence's saved activations turn it on by themselves. */
START_TEST(test_recompute_bit_identical)
{
    fp4rl_quant_policy *p = preset_policy(FP4RL_PRESET_HIF4_RL, 0);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_ROUNDING_ACTIVATION, FP4RL_ROUND_STOCHASTIC), FP4RL_OK);
    fp4rl_model *m;
    ck_assert_msg(fp4rl_model_create(&m, ctx, config(4, 96), p, 3) == FP4RL_OK, "%s", fp4rl_last_error());
    enum { B = 4, T = 64, V = 96 };
    int32_t tok[B * T], len[B] = {64, 40, 64, 17};
    fill_tokens(tok, B * T, V);
    /* 0: keep, 1: recompute, 2: keep one sequence per micro-batch, 3: automatic under a budget */
    float *g[4];
    double loss[4];
    size_t peak[4];
    ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_RECOMPUTE, 2), FP4RL_ERR_INVALID_ARGUMENT);
    for (int k = 0; k < 4; k++) {
        size_t use, res;
        ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_RECOMPUTE, k == 1), FP4RL_OK);
        ck_assert_int_eq(fp4rl_model_set_hparam(m, FP4RL_MP_MICROBATCH_TOKENS, k < 2 ? 1 << 30 : k == 2 ? T : 0), FP4RL_OK);
        ctx->mem_budget = k == 3 ? (size_t)(2 << 20) : 0; /* below one sequence's saved activations */
        ctx->rng_offset = 100;
        ck_assert_int_eq(fp4rl_context_reset_peak_memory(ctx), FP4RL_OK);
        ck_assert_msg(fp4rl_model_compute_gradients(m, tok, len, NULL, B, T, &loss[k]) == FP4RL_OK, "%s", fp4rl_last_error());
        ck_assert_int_eq(fp4rl_context_memory(ctx, &use, &peak[k], &res), FP4RL_OK);
        g[k] = malloc((size_t)m->total * sizeof(float));
        memcpy(g[k], m->g, (size_t)m->total * sizeof(float));
    }
    ctx->mem_budget = 0;
    printf("recompute: peak %zu bytes kept, %zu recomputed; one sequence per micro-batch %zu kept, %zu automatic\n", peak[0],
           peak[1], peak[2], peak[3]);
    ck_assert_mem_eq(g[1], g[0], (size_t)m->total * sizeof(float));
    ck_assert(loss[1] == loss[0]);
    ck_assert_mem_eq(g[3], g[2], (size_t)m->total * sizeof(float)); /* automatic = one sequence, recomputed */
    ck_assert(loss[3] == loss[2]);
    ck_assert_msg(peak[1] < peak[0] && peak[3] < peak[2], "recomputation did not lower the peak");
    for (int k = 0; k < 4; k++) free(g[k]);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* What a block keeps for backward is the narrowest exact form: in BF16 numerics the FP32 inputs of
 * the linears (ln1, ln2, h) die in the forward (their BF16 operands are saved); with 1D FP4 blocks
 * and nearest rounding the forward also makes and saves their along-tokens operands (shared by
 * q/k/v and gate/up like the forward ones), so they die too; with stochastic activations the
 * backward draws those operands itself (the FP32 path's order of draws), so they stay. */
START_TEST(test_block_keeps_narrow_operands)
{
    for (int mode = 0; mode < 3; mode++) { /* 0: HiF4 1D, 1: BF16, 2: HiF4 1D with stochastic activations */
        fp4rl_quant_policy *p = preset_policy(FP4RL_PRESET_HIF4_RL, mode == 1);
        if (mode == 2) ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_ROUNDING_ACTIVATION, FP4RL_ROUND_STOCHASTIC), FP4RL_OK);
        fp4rl_model *m;
        ck_assert_msg(fp4rl_model_create(&m, ctx, config(1, 96), p, 3) == FP4RL_OK, "%s", fp4rl_last_error());
        enum { B = 2, T = 16 };
        const int64_t N = B * T, C = m->cfg.hidden_size;
        int32_t pos[N], len[B] = {T, 9};
        for (int i = 0; i < N; i++) pos[i] = i % T;
        float *x = malloc((size_t)(N * C) * sizeof(float));
        for (int64_t i = 0; i < N * C; i++) x[i] = (float)((i * 37) % 19) / 19.0f - 0.5f;
        const fp4rl_block_batch bt = {pos, len, B, T};
        fp4rl_block_acts A = {.mem = {.ctx = ctx}};
        ck_assert_msg(fp4rl_block_forward(m, 0, &bt, &A, x, NULL) == FP4RL_OK, "%s", fp4rl_last_error());
        const fp4rl_linear_saved *sv = A.sv;
        if (mode < 2) {
            ck_assert(!A.ln1 && !A.ln2 && !A.h);
            ck_assert(sv[FP4RL_LIN_Q].xb && sv[FP4RL_LIN_K].xb == sv[FP4RL_LIN_Q].xb && sv[FP4RL_LIN_DOWN].xb);
        } else {
            ck_assert(A.ln1 && A.ln2 && A.h);
        }
        if (mode == 0) { /* the along-tokens operands, one per input */
            ck_assert(sv[FP4RL_LIN_Q].xbt && sv[FP4RL_LIN_K].xbt == sv[FP4RL_LIN_Q].xbt && sv[FP4RL_LIN_V].xbt == sv[FP4RL_LIN_Q].xbt);
            ck_assert(sv[FP4RL_LIN_GATE].xbt && sv[FP4RL_LIN_UP].xbt == sv[FP4RL_LIN_GATE].xbt && sv[FP4RL_LIN_DOWN].xbt);
            ck_assert(sv[FP4RL_LIN_GATE].xbt != sv[FP4RL_LIN_GATE].xb);
        } else {
            for (int i = 0; i < FP4RL_LIN_COUNT; i++) ck_assert(!sv[i].xbt);
        }
        fp4rl_arena_free(&A.mem);
        free(x);
        fp4rl_model_destroy(m);
        fp4rl_quant_policy_destroy(p);
    }
}
END_TEST

/* An RL step whose trainer runs in micro-batches of one completion (FP4RL_RL_MICROBATCH_TOKENS)
 * against one pass, from the same weights and seed (FP32 training numerics): the same rollout,
 * so the same loss (1e-6 absolute) and gradient norm (1e-6) and the same update (1e-5 on the
 * weight change). */
START_TEST(test_rl_microbatches_equal_one_pass)
{
    fp4rl_quant_policy *p = preset_policy(FP4RL_PRESET_HIF4_RL, 0);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_FP32), FP4RL_OK);
    double loss[2], gn[2];
    float *w0 = NULL, *dw[2];
    int64_t total = 0;
    for (int k = 0; k < 2; k++) {
        fp4rl_context_set_seed(ctx, 5);
        fp4rl_model *m;
        ck_assert_msg(fp4rl_model_create(&m, ctx, config(3, 64), p, 1) == FP4RL_OK, "%s", fp4rl_last_error());
        total = m->total;
        if (!w0) {
            w0 = malloc((size_t)total * sizeof(float));
            memcpy(w0, m->w, (size_t)total * sizeof(float));
        }
        fp4rl_rl_session *s;
        ck_assert_int_eq(fp4rl_rl_session_create(&s, ctx, m, p), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_GROUP_SIZE, 4), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_MAX_NEW_TOKENS, 6), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_LR, 1e-3), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_MICROBATCH_TOKENS, k ? 1 : 1e9), FP4RL_OK);
        const int32_t prompts[6] = {1, 2, 3, 4, 5, 6};
        const size_t off[3] = {0, 3, 6};
        ck_assert_msg(fp4rl_rl_session_step(s, prompts, off, 2, token_sum, NULL) == FP4RL_OK, "case %d: %s", k, fp4rl_last_error());
        ck_assert_int_eq(fp4rl_rl_session_metric(s, "pg/loss", &loss[k]), FP4RL_OK);
        ck_assert_int_eq(fp4rl_rl_session_metric(s, "grad_norm", &gn[k]), FP4RL_OK);
        dw[k] = malloc((size_t)total * sizeof(float));
        for (int64_t i = 0; i < total; i++) dw[k][i] = m->w[i] - w0[i];
        fp4rl_rl_session_destroy(s);
        fp4rl_model_destroy(m);
    }
    ck_assert_msg(gn[0] > 0 && fabs(gn[1] - gn[0]) <= 1e-6 * gn[0], "grad norm %.9g vs %.9g", gn[1], gn[0]);
    /* the first step's loss is a cancelling sum near 0 (rho = 1, advantages of mean 0): absolute */
    ck_assert_msg(fabs(loss[1] - loss[0]) <= 1e-6, "loss %.9g vs %.9g", loss[1], loss[0]);
    const double e = fp4rl_l2rel(dw[1], dw[0], total);
    ck_assert_msg(e <= 1e-5, "weight change rel. error %.3g", e);
    free(w0);
    free(dw[0]);
    free(dw[1]);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* The gradient buffer lives only while gradients are needed: a model holds none after creation,
 * an RL step makes it for its train phase and releases it after the update (the rollout phase of
 * the next step never holds it), and the model's own API keeps it once made. */
START_TEST(test_grads_only_in_train_phase)
{
    fp4rl_quant_policy *p = preset_policy(FP4RL_PRESET_HIF4_RL, 0);
    fp4rl_model *m;
    ck_assert_msg(fp4rl_model_create(&m, ctx, config(2, 64), p, 1) == FP4RL_OK, "%s", fp4rl_last_error());
    const size_t gbytes = (size_t)m->total * sizeof(float);
    /* the AdamW moments are made by the first update and kept */
    const size_t mbytes = 2 * fp4rl_moment_bytes(m->total, fp4rl_model_moments_bf16(m));
    size_t base, in_use, peak, reserved;
    ck_assert(m->g == NULL);
    ck_assert_int_eq(fp4rl_context_memory(ctx, &base, &peak, &reserved), FP4RL_OK);
    fp4rl_rl_session *s;
    ck_assert_int_eq(fp4rl_rl_session_create(&s, ctx, m, p), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_GROUP_SIZE, 4), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_MAX_NEW_TOKENS, 6), FP4RL_OK);
    const int32_t prompts[6] = {1, 2, 3, 4, 5, 6};
    const size_t off[3] = {0, 3, 6};
    for (int step = 0; step < 2; step++) {
        ck_assert_int_eq(fp4rl_context_reset_peak_memory(ctx), FP4RL_OK);
        ck_assert_msg(fp4rl_rl_session_step(s, prompts, off, 2, token_sum, NULL) == FP4RL_OK, "%s", fp4rl_last_error());
        ck_assert_int_eq(fp4rl_context_memory(ctx, &in_use, &peak, &reserved), FP4RL_OK);
        ck_assert_msg(m->g == NULL, "step %d: the gradients outlive the step", step);
        ck_assert_msg(peak >= base + gbytes, "step %d: peak %zu never held the %zu gradient bytes over %zu", step, peak, gbytes, base);
        ck_assert_msg(fp4rl_model_moments_held(m), "step %d: no moments after the update", step);
        ck_assert_msg(in_use <= base + mbytes + gbytes / 2, "step %d: %zu bytes in use after the step, %zu before", step, in_use, base);
        double gn = 0;
        ck_assert_int_eq(fp4rl_rl_session_metric(s, "grad_norm", &gn), FP4RL_OK);
        ck_assert(gn > 0);
    }
    /* released gradients read as zeros; the model's API makes and keeps them */
    float *g = malloc(gbytes);
    const char *name = "model.layers.0.mlp.down_proj.weight";
    int nd = 0;
    int64_t dims[8], numel = 1;
    ck_assert_int_eq(fp4rl_model_param_shape(m, name, &nd, dims), FP4RL_OK);
    for (int i = 0; i < nd; i++) numel *= dims[i];
    g[0] = 1.0f;
    ck_assert_int_eq(fp4rl_model_get_grad(m, name, g, (size_t)numel * sizeof(float)), FP4RL_OK);
    ck_assert(g[0] == 0.0f);
    int32_t tok[2 * 5] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    double loss = 0;
    ck_assert_int_eq(fp4rl_model_compute_gradients(m, tok, NULL, NULL, 2, 5, &loss), FP4RL_OK);
    ck_assert(m->g != NULL);
    ck_assert_int_eq(fp4rl_model_get_grad(m, name, g, (size_t)numel * sizeof(float)), FP4RL_OK);
    double sq = 0;
    for (int64_t i = 0; i < numel; i++) sq += (double)g[i] * g[i];
    ck_assert(sq > 0);
    free(g);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model_memory");
    TCase *tc = tcase_create("model_memory");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_deep_model_runs);
    tcase_add_test(tc, test_deep_rl_step);
    tcase_add_test(tc, test_deep_w4_rollout);
    tcase_add_test(tc, test_deep_w4b_rollout);
    tcase_add_test(tc, test_chunked_head_equals_unchunked);
    tcase_add_test(tc, test_microbatches_equal_one_pass);
    tcase_add_test(tc, test_rl_microbatches_equal_one_pass);
    tcase_add_test(tc, test_recompute_bit_identical);
    tcase_add_test(tc, test_block_keeps_narrow_operands);
    tcase_add_test(tc, test_grads_only_in_train_phase);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
