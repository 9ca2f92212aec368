/*
 * test_model_memory.c - the model at real depths and its activation memory: a deep narrow model
 * runs a forward and a training step (the scratch list has no fixed size).
 */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

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
 * buffers: a forward and a supervised step run (the fixed arena failed from 18 layers on). */
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
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
