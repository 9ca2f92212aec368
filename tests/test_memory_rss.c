/*
 * test_memory_rss.c - peak host memory of one RL step on a model with Qwen2.5's vocabulary
 * (151,936): 2 layers, 32 completions of 32 prompt + 32 new tokens, under every recipe (the three
 * presets, BF16 training and rollout, NVFP4 whose tensor scale takes the lockstep rollout). One
 * full FP32 copy of the trainer's [2048, 151936] logits is 1.24 GB; the step must stay well under
 * it (the LM head runs in chunks of rows). Its own executable so no other test raises VmHWM; each
 * recipe is a loop iteration, which Check runs in its own forked process (a child's VmHWM starts
 * at its RSS at the fork).
 */
#include "check_run.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fp4rl/fp4rl.h>

/* The process's peak resident set (VmHWM) in bytes. */
static double peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    fclose(f);
    ck_assert_double_gt(kb, 0);
    return kb * 1024.0;
}

/* The recipes: a preset, then formats (all three roles; 0 = the preset's) and numerics (-1 = the preset's). */
static const struct {
    const char *name;
    fp4rl_preset preset;
    fp4rl_dtype format;
    int train, rollout;
} recipes[] = {
    {"HiF4 RL preset", FP4RL_PRESET_HIF4_RL, 0, -1, -1},
    {"stable 2D MXFP4 preset", FP4RL_PRESET_STABLE_2D_MXFP4, 0, -1, -1},
    {"default preset (MXFP4 1D)", FP4RL_PRESET_DEFAULT, 0, -1, -1},
    {"BF16 training and rollout", FP4RL_PRESET_HIF4_RL, 0, FP4RL_NUMERICS_BF16, FP4RL_NUMERICS_BF16},
    {"NVFP4 W4A4 (lockstep rollout)", FP4RL_PRESET_DEFAULT, FP4RL_DTYPE_NVFP4, FP4RL_NUMERICS_FP4, FP4RL_NUMERICS_W4A4},
};

START_TEST(test_rl_step_peak_rss_full_vocab)
{
    const char *cfg = "{\"model_type\": \"qwen2\", \"vocab_size\": 151936, \"hidden_size\": 32, \"intermediate_size\": 64,"
                      " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                      " \"max_position_embeddings\": 128, \"tie_word_embeddings\": true}";
    fp4rl_context *ctx;
    ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_apply_preset(p, recipes[_i].preset), FP4RL_OK);
    if (recipes[_i].format)
        for (fp4rl_qparam q = FP4RL_QP_FORMAT_WEIGHT; q <= FP4RL_QP_FORMAT_GRADIENT; q++)
            ck_assert_int_eq(fp4rl_quant_policy_set(p, q, recipes[_i].format), FP4RL_OK);
    if (recipes[_i].train >= 0) ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, recipes[_i].train), FP4RL_OK);
    if (recipes[_i].rollout >= 0)
        ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_ROLLOUT_NUMERICS, recipes[_i].rollout), FP4RL_OK);
    fp4rl_model *m;
    ck_assert_msg(fp4rl_model_create(&m, ctx, cfg, p, 1) == FP4RL_OK, "%s", fp4rl_last_error());
    fp4rl_rl_session *s;
    ck_assert_int_eq(fp4rl_rl_session_create(&s, ctx, m, p), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_GROUP_SIZE, 8), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_MAX_NEW_TOKENS, 32), FP4RL_OK);
    enum { P = 4, PL = 32 };
    int32_t prompts[P * PL];
    size_t off[P + 1];
    for (int i = 0; i < P * PL; i++) prompts[i] = (i * 7919 + 11) % 151936;
    for (int i = 0; i <= P; i++) off[i] = (size_t)i * PL;
    const double before = peak_rss();
    /* the step's phases one by one, to say which holds the memory */
    ck_assert_msg(fp4rl_rl_session_rollout(s, prompts, off, P) == FP4RL_OK, "%s", fp4rl_last_error());
    const double after_rollout = peak_rss();
    double r[P * 8];
    for (int i = 0; i < P * 8; i++) r[i] = i % 3;
    ck_assert_int_eq(fp4rl_rl_session_set_rewards(s, r, P * 8), FP4RL_OK);
    ck_assert_msg(fp4rl_rl_session_train(s) == FP4RL_OK, "%s", fp4rl_last_error());
    const double peak = peak_rss();
    printf("RL step, vocab 151936, 32 x (32 + 32) tokens, %s: peak RSS %.0f MB (after creation %.0f MB, after the rollout %.0f MB)\n",
           recipes[_i].name, peak / 1e6, before / 1e6, after_rollout / 1e6);
    ck_assert_msg(peak < 0.6e9, "%s: peak RSS %.0f MB; one FP32 logits copy is 1245 MB", recipes[_i].name, peak / 1e6);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
    fp4rl_context_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("memory_rss");
    TCase *tc = tcase_create("memory_rss");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_rl_step_peak_rss_full_vocab, 0, (int)(sizeof recipes / sizeof recipes[0]));
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
