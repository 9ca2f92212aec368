/*
 * rl_demo.c - end-to-end FP4 RL on a task a tiny model can learn on two CPU cores.
 *
 * A Qwen2-shaped model is trained from scratch on multi-digit addition (addition_task.h): first a
 * supervised warm-up until it is partly right, then GRPO with the HiFloat4 recipe (HiF4 W4A4
 * rollout with Rollout-ResQ 2:4, FP4 training, truncated importance sampling). Held-out accuracy
 * is measured before and after RL with greedy decoding in the rollout numerics.
 *
 *   fp4rl_rl_demo [--cpu] [--out DIR] [--rl-steps N] [--seed S]
 * Writes DIR/metrics.jsonl (one JSON object per RL step) and DIR/reward_curve.svg.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <fp4rl/fp4rl.h>

#include "addition_task.h"

#define CHECK(call)                                                                                     \
    do {                                                                                                \
        fp4rl_status st_ = (call);                                                                      \
        if (st_ != FP4RL_OK) {                                                                          \
            fprintf(stderr, "fp4rl_rl_demo: %s failed: %s: %s\n", #call, fp4rl_status_name(st_), fp4rl_last_error()); \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)

static const char *CONFIG =
    "{\"model_type\": \"qwen2\", \"architectures\": [\"Qwen2ForCausalLM\"], \"vocab_size\": 16,"
    " \"hidden_size\": 96, \"intermediate_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"max_position_embeddings\": 32, \"rope_theta\": 10000.0,"
    " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true}";

enum { MAX_OPERAND = 99, EVAL_N = 256, MAX_ANSWER = 5 };

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Greedy accuracy on a fixed held-out set, decoded in the rollout numerics. */
static double accuracy(fp4rl_rl_session *eval, const int32_t *prompts, const size_t *offsets)
{
    CHECK(fp4rl_rl_session_rollout(eval, prompts, offsets, EVAL_N));
    double right = 0;
    for (size_t p = 0; p < EVAL_N; p++) {
        int32_t tok[MAX_ANSWER + 1];
        size_t len;
        CHECK(fp4rl_rl_session_completion(eval, 2 * p, tok, NULL, MAX_ANSWER + 1, &len, NULL));
        right += add_reward(prompts + offsets[p], offsets[p + 1] - offsets[p], tok, len);
    }
    return right / EVAL_N;
}

static void write_svg(const char *path, const double *reward, const double *acc_x, const double *acc, int n, int n_acc)
{
    FILE *f = fopen(path, "w");
    if (!f) return;
    const double W = 640, H = 360, L = 50, B = 40;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%g\" y=\"20\" font-size=\"14\">fp4rl: FP4 RL (HiF4 W4A4 + ResQ 2:4) on addition</text>\n", L);
    fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", L, H - B, W - 10, H - B);
    fprintf(f, "<line x1=\"%g\" y1=\"30\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", L, L, H - B);
    for (int k = 0; k <= 4; k++) {
        double y = H - B - k * (H - B - 30) / 4;
        fprintf(f, "<text x=\"10\" y=\"%g\">%.2f</text><line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#ddd\"/>\n", y + 4, k / 4.0, L, y, W - 10, y);
    }
    fprintf(f, "<text x=\"%g\" y=\"%g\">RL step (0 .. %d)</text>\n", W / 2 - 40, H - 10, n);
    const double sx = (W - 10 - L) / (n > 1 ? n - 1 : 1), sy = H - B - 30;
    fprintf(f, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
    for (int i = 0; i < n; i++) fprintf(f, "%.1f,%.1f ", L + i * sx, H - B - reward[i] * sy);
    fprintf(f, "\"/>\n<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"");
    for (int i = 0; i < n_acc; i++) fprintf(f, "%.1f,%.1f ", L + acc_x[i] * sx, H - B - acc[i] * sy);
    fprintf(f, "\"/>\n<text x=\"%g\" y=\"45\" fill=\"#1f77b4\">mean reward of the rollouts</text>\n", L + 10);
    fprintf(f, "<text x=\"%g\" y=\"60\" fill=\"#d62728\">held-out greedy accuracy</text>\n</svg>\n", L + 10);
    fclose(f);
}

int main(int argc, char **argv)
{
    const char *out = "rl_demo_out";
    int rl_steps = 60, force_cpu = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cpu")) force_cpu = 1;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--rl-steps") && i + 1 < argc) rl_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = (uint64_t)atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--cpu] [--out DIR] [--rl-steps N] [--seed S]\n", argv[0]);
            return 2;
        }
    }
    mkdir(out, 0755);
    const double t_start = seconds();

    /* the GPU when there is one and the model runs there; else the CPU */
    fp4rl_context *ctx = NULL;
    fp4rl_model *model = NULL;
    fp4rl_quant_policy *pol;
    CHECK(fp4rl_quant_policy_create(&pol));
    CHECK(fp4rl_quant_policy_apply_preset(pol, FP4RL_PRESET_HIF4_RL));
    if (!force_cpu && fp4rl_context_create(&ctx, FP4RL_DEVICE_CUDA, 0) == FP4RL_OK) {
        if (fp4rl_model_create(&model, ctx, CONFIG, pol, seed) != FP4RL_OK) {
            printf("note: %s; running on the CPU\n", fp4rl_last_error());
            fp4rl_context_destroy(ctx);
            ctx = NULL;
        }
    }
    if (!ctx) {
        CHECK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0));
        CHECK(fp4rl_model_create(&model, ctx, CONFIG, pol, seed));
    }
    CHECK(fp4rl_context_set_seed(ctx, seed));
    int64_t n_params;
    CHECK(fp4rl_model_get_info(model, FP4RL_MI_NUM_PARAMETERS, &n_params));
    printf("fp4rl %s RL demo on the %s: Qwen2-shaped model, %lld parameters, task: a + b with a, b <= %d\n",
           fp4rl_version_string(), fp4rl_context_device(ctx) == FP4RL_DEVICE_CUDA ? "GPU" : "CPU", (long long)n_params, MAX_OPERAND);
    printf("recipe: HiF4 FP4 training, HiF4 W4A4 rollout + Rollout-ResQ 2:4, GRPO with TIS (cap 5)\n\n");

    /* a fixed held-out set, and greedy decoding for evaluation */
    add_rng eval_rng = {0x5eed0000ull + seed}, rng = {0xadd0000ull + seed};
    int32_t *eval_prompts = malloc(EVAL_N * 43 * sizeof(int32_t));
    size_t eval_off[EVAL_N + 1];
    add_batch(&eval_rng, MAX_OPERAND, EVAL_N, eval_prompts, eval_off);
    fp4rl_rl_session *eval, *rl;
    CHECK(fp4rl_rl_session_create(&eval, ctx, model, NULL));
    const int32_t stop = ADD_END;
    CHECK(fp4rl_rl_session_set_stop_tokens(eval, &stop, 1));
    CHECK(fp4rl_rl_session_set(eval, FP4RL_RL_GROUP_SIZE, 2));
    CHECK(fp4rl_rl_session_set(eval, FP4RL_RL_TOP_K, 1));
    CHECK(fp4rl_rl_session_set(eval, FP4RL_RL_MAX_NEW_TOKENS, MAX_ANSWER));

    /* 1. supervised warm-up until the model is partly right */
    CHECK(fp4rl_model_set_hparam(model, FP4RL_MP_LR, 2e-3));
    CHECK(fp4rl_model_set_hparam(model, FP4RL_MP_GRAD_CLIP, 1.0));
    enum { SFT_B = 64, SFT_T = 16 };
    int32_t tok[SFT_B * SFT_T];
    float mask[SFT_B * SFT_T];
    int32_t len[SFT_B];
    double acc0 = 0, t0 = seconds();
    int sft_step = 0;
    printf("supervised warm-up (FP4 training):\n");
    for (; sft_step < 3000; sft_step++) {
        memset(tok, 0, sizeof tok);
        memset(mask, 0, sizeof mask);
        for (int b = 0; b < SFT_B; b++)
            len[b] = (int32_t)add_sequence(add_rand(&rng, MAX_OPERAND + 1), add_rand(&rng, MAX_OPERAND + 1), tok + b * SFT_T, mask + b * SFT_T);
        double loss;
        CHECK(fp4rl_model_train_step(model, tok, len, mask, SFT_B, SFT_T, &loss, NULL));
        if ((sft_step + 1) % 100 == 0) {
            acc0 = accuracy(eval, eval_prompts, eval_off);
            printf("  step %4d  loss %.4f  held-out accuracy %5.1f%%  (%.0f s)\n", sft_step + 1, loss, 100 * acc0, seconds() - t0);
            fflush(stdout);
            if (acc0 >= 0.30) break;
        }
    }
    const double acc_before = acc0;

    /* 2. FP4 RL */
    CHECK(fp4rl_rl_session_create(&rl, ctx, model, NULL));
    CHECK(fp4rl_rl_session_set_stop_tokens(rl, &stop, 1));
    CHECK(fp4rl_rl_session_set(rl, FP4RL_RL_GROUP_SIZE, 8));
    CHECK(fp4rl_rl_session_set(rl, FP4RL_RL_MAX_NEW_TOKENS, MAX_ANSWER));
    CHECK(fp4rl_rl_session_set(rl, FP4RL_RL_LR, 5e-4));
    CHECK(fp4rl_rl_session_set(rl, FP4RL_RL_CLIP_HIGH, 0.28));
    CHECK(fp4rl_rl_session_set(rl, FP4RL_RL_SEED, (double)seed));
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    remove(path);
    CHECK(fp4rl_rl_session_set_metrics_file(rl, path));
    enum { P = 32 };
    int32_t prompts[P * 43];
    size_t off[P + 1];
    double *rewards = calloc((size_t)rl_steps + 1, sizeof(double)), acc_x[64], acc_y[64];
    int n_acc = 0;
    acc_x[n_acc] = 0;
    acc_y[n_acc++] = acc_before;
    printf("\nFP4 RL (%d prompts x 8 completions per step):\n", P);
    printf("  %5s %8s %8s %9s %10s %11s %9s\n", "step", "reward", "acc", "tis/mean", "mismatch", "act_zero", "tok/s");
    double acc = acc_before;
    for (int s = 0; s < rl_steps; s++) {
        add_batch(&rng, MAX_OPERAND, P, prompts, off);
        CHECK(fp4rl_rl_session_step(rl, prompts, off, P, add_reward_fn, NULL));
        double r, tis, mm, az, tps;
        fp4rl_rl_session_metric(rl, "reward/mean", &r);
        fp4rl_rl_session_metric(rl, "tis/mean", &tis);
        fp4rl_rl_session_metric(rl, "mismatch/logp_abs_diff_mean", &mm);
        fp4rl_rl_session_metric(rl, "quant/act_zero_frac", &az);
        fp4rl_rl_session_metric(rl, "perf/rollout_tokens_per_s", &tps);
        rewards[s] = r;
        const int last = s + 1 == rl_steps;
        if ((s + 1) % 10 == 0 || last) {
            acc = accuracy(eval, eval_prompts, eval_off);
            if (n_acc < 64) {
                acc_x[n_acc] = s;
                acc_y[n_acc++] = acc;
            }
            printf("  %5d %8.3f %7.1f%% %9.3f %10.4f %10.2f%% %9.0f\n", s + 1, r, 100 * acc, tis, mm, 100 * az, tps);
        } else {
            printf("  %5d %8.3f %8s %9.3f %10.4f %10.2f%% %9.0f\n", s + 1, r, "", tis, mm, 100 * az, tps);
        }
        fflush(stdout);
    }
    snprintf(path, sizeof path, "%s/reward_curve.svg", out);
    write_svg(path, rewards, acc_x, acc_y, rl_steps, n_acc);

    printf("\n| phase                        | held-out accuracy (greedy, W4A4 HiF4 + ResQ) |\n");
    printf("|------------------------------|----------------------------------------------|\n");
    printf("| after supervised warm-up     | %43.1f%% |\n", 100 * acc_before);
    printf("| after %3d FP4 RL steps       | %43.1f%% |\n", rl_steps, 100 * acc);
    printf("\nchange: %+.1f points; wrote %s/metrics.jsonl and %s/reward_curve.svg; %.0f s in all\n",
           100 * (acc - acc_before), out, out, seconds() - t_start);
    free(rewards);
    free(eval_prompts);
    fp4rl_rl_session_destroy(rl);
    fp4rl_rl_session_destroy(eval);
    fp4rl_model_destroy(model);
    fp4rl_quant_policy_destroy(pol);
    fp4rl_context_destroy(ctx);
    return 0;
}
