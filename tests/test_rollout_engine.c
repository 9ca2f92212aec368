/*
 * test_rollout_engine.c - the rollout engine's schedule (core/rl/rollout.c): batched prefill of each
 * prompt once and compacted decode (finished sequences leave the batch, each row at its own
 * position) give the completions and log mu of the lockstep schedule (every sequence every step,
 * prompts fed token by token through the decode path, today's engine before the batched one):
 *   - every rollout numerics (FP32, BF16, W4A16, W16A4, W4A4) and ResQ pattern, MXFP4 / HiF4 /
 *     NVFP4, prompts of 1 to 200 tokens, stop tokens hit early and never hit;
 *   - numerics that couple the rows of a batch (NVFP4's tensor scale, ResQ channel-50) run the
 *     lockstep schedule themselves;
 *   - batch composition never changes a completion: a prompt's completions are the same alone and
 *     next to others (sampling is numbered by sequence and position);
 *   - the batched schedule runs fewer, narrower forwards (decode steps <= max_new - 1).
 */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rl/rollout.h"

static fp4rl_context *ctx;
static void setup(void) { ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK); }
static void teardown(void) { fp4rl_context_destroy(ctx); }

#define OK(call) ck_assert_msg((call) == FP4RL_OK, "%s", fp4rl_last_error())

/* GQA groups of 3, head dim 32, and a context that holds a 200-token prompt */
static const char *CFG =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 40, \"hidden_size\": 192, \"intermediate_size\": 256,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 6, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 256, \"tie_word_embeddings\": false}";

enum { P = 4, G = 3, MAX_NEW = 20 };
static int32_t prompts[1 + 200 + 37 + 5];
static size_t offsets[P + 1];

static void make_prompts(void)
{
    const size_t lens[P] = {1, 200, 37, 5};
    offsets[0] = 0;
    for (int p = 0; p < P; p++) offsets[p + 1] = offsets[p] + lens[p];
    for (size_t i = 0; i < offsets[P]; i++) prompts[i] = (int32_t)((i * 7 + 3) % 40);
}

static fp4rl_model *model(fp4rl_dtype fmt, fp4rl_numerics numerics, fp4rl_resq resq, fp4rl_quant_policy **pp)
{
    OK(fp4rl_quant_policy_create(pp));
    OK(fp4rl_quant_policy_set(*pp, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OK(fp4rl_quant_policy_set(*pp, FP4RL_QP_FORMAT_ACTIVATION, fmt));
    OK(fp4rl_quant_policy_set(*pp, FP4RL_QP_ROLLOUT_NUMERICS, numerics));
    OK(fp4rl_quant_policy_set(*pp, FP4RL_QP_RESQ, resq));
    fp4rl_model *m;
    OK(fp4rl_model_create(&m, ctx, CFG, *pp, 5));
    return m;
}

/* Completions equal token for token (at most one may differ: summation-order noise can move a
 * CDF step under a draw), log mu within summation-order noise: BLAS sums a row in another order
 * for another row count or thread split. In FP32 numerics that is FP32 noise (1e-4); where
 * activations are rounded to BF16 such noise flips a rounding now and then (one BF16 step,
 * 2^-8 relative, moves a log-prob by up to ~1e-2: seen 1.6e-3 at most and 2e-4 on average on an
 * AVX-512 OpenBLAS), so the bounds there are that step and a tenth of it on average. A wrong position, cache row or
 * sampling counter changes tokens and moves log mu by O(1). Returns how many completions ended
 * at a stop token. */
static int64_t same_rollouts(const fp4rl_rollout_result *a, const fp4rl_rollout_result *b, const char *what, int fp32)
{
    ck_assert_int_eq(a->n_seqs, b->n_seqs);
    double lp = 0, sum = 0;
    int64_t stopped = 0, differ = 0, n = 0;
    for (int64_t i = 0; i < a->n_seqs; i++) {
        int same = a->lengths[i] == b->lengths[i] && a->stopped[i] == b->stopped[i];
        for (int64_t j = 0; same && j < a->lengths[i]; j++) same = a->tokens[i * a->max_new + j] == b->tokens[i * b->max_new + j];
        differ += !same;
        stopped += a->stopped[i];
        for (int64_t j = 0; same && j < a->lengths[i]; j++, n++) {
            const double d = fabs((double)a->logprobs[i * a->max_new + j] - b->logprobs[i * b->max_new + j]);
            lp = fmax(lp, d);
            sum += d;
        }
    }
    ck_assert_msg(differ <= 1, "%s: %lld completions differ", what, (long long)differ);
    ck_assert_msg(lp <= (fp32 ? 1e-4 : 1e-2), "%s: log mu differs by %g", what, lp);
    ck_assert_msg(n > 0 && sum / (double)n <= (fp32 ? 1e-5 : 1e-3), "%s: log mu differs by %g on average", what, n ? sum / (double)n : 0.0);
    return stopped;
}

static void schedules(fp4rl_dtype fmt, fp4rl_numerics numerics, fp4rl_resq resq, int coupled)
{
    fp4rl_quant_policy *p;
    fp4rl_model *m = model(fmt, numerics, resq, &p);
    const int32_t stops[3] = {4, 17, 29};
    for (int with_stop = 0; with_stop < 2; with_stop++) {
        fp4rl_rollout_cfg cfg = {.group = G, .max_new = MAX_NEW, .temperature = 1.0f, .stop = stops,
                                 .n_stop = with_stop ? 3 : 0, .seed = 7, .offset = 100};
        fp4rl_rollout_result lock, bat;
        m->rollout_lockstep = 1;
        OK(fp4rl_rollout_run(m, &cfg, prompts, offsets, P, &lock));
        m->rollout_lockstep = 0;
        OK(fp4rl_rollout_run(m, &cfg, prompts, offsets, P, &bat));
        char what[96];
        snprintf(what, sizeof what, "%s numerics %d resq %d stop %d", fp4rl_dtype_name(fmt), (int)numerics, (int)resq, with_stop);
        const int64_t stopped = same_rollouts(&lock, &bat, what, numerics == FP4RL_NUMERICS_FP32);
        printf("%s: %lld of %d completions stopped early; decode steps lockstep %lld, batched %lld\n", what, (long long)stopped,
               P * G, (long long)lock.decode_steps, (long long)bat.decode_steps);
        if (with_stop) ck_assert_int_gt(stopped, 0); /* stop tokens are hit early */
        else ck_assert_int_eq(stopped, 0);
        if (!with_stop) ck_assert_int_eq(lock.decode_steps, 200 + MAX_NEW - 1); /* with stops: until all are done */
        if (coupled) ck_assert_int_eq(bat.decode_steps, lock.decode_steps); /* ran the lockstep schedule */
        else ck_assert_int_le(bat.decode_steps, MAX_NEW - 1);
        ck_assert(lock.offset_end == bat.offset_end);
        fp4rl_rollout_result_free(&lock);
        fp4rl_rollout_result_free(&bat);
    }
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}

START_TEST(test_batched_equals_lockstep)
{
    make_prompts();
    schedules(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_FP32, FP4RL_RESQ_OFF, 0);
    schedules(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_BF16, FP4RL_RESQ_OFF, 0);
    schedules(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A16, FP4RL_RESQ_2_4, 0);
    schedules(FP4RL_DTYPE_MXFP4, FP4RL_NUMERICS_W16A4, FP4RL_RESQ_DENSE, 0);
    schedules(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4, 0);
    schedules(FP4RL_DTYPE_MXFP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_OFF, 0);
    schedules(FP4RL_DTYPE_NVFP4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_OFF, 1);    /* the tensor scale couples rows */
    schedules(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_CHANNEL_50, 1); /* ranked over the batch */
}
END_TEST

/* A prompt's completions alone equal its completions next to other prompts (its sequences keep
 * their global indices through row0). */
START_TEST(test_batch_composition)
{
    make_prompts();
    fp4rl_quant_policy *p;
    fp4rl_model *m = model(FP4RL_DTYPE_HIF4, FP4RL_NUMERICS_W4A4, FP4RL_RESQ_2_4, &p);
    const int32_t stop = 4;
    fp4rl_rollout_cfg cfg = {.group = G, .max_new = MAX_NEW, .temperature = 0.9f, .stop = &stop, .n_stop = 1, .seed = 3};
    fp4rl_rollout_result all, one;
    OK(fp4rl_rollout_run(m, &cfg, prompts, offsets, P, &all));
    cfg.row0 = 2 * G; /* prompt 2 alone, numbered as in the whole batch */
    const size_t off2[2] = {0, offsets[3] - offsets[2]};
    OK(fp4rl_rollout_run(m, &cfg, prompts + offsets[2], off2, 1, &one));
    for (int64_t g = 0; g < G; g++) {
        const int64_t i = 2 * G + g;
        ck_assert_int_eq(one.lengths[g], all.lengths[i]);
        ck_assert_mem_eq(one.tokens + g * MAX_NEW, all.tokens + i * MAX_NEW, (size_t)all.lengths[i] * sizeof(int32_t));
        for (int64_t j = 0; j < all.lengths[i]; j++)
            ck_assert_float_eq_tol(one.logprobs[g * MAX_NEW + j], all.logprobs[i * MAX_NEW + j], 1e-4f);
    }
    fp4rl_rollout_result_free(&all);
    fp4rl_rollout_result_free(&one);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rollout_engine");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_batched_equals_lockstep);
    tcase_add_test(tc, test_batch_composition);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
