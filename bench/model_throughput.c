/*
 * model_throughput.c - training and rollout throughput of a ~100M-parameter Qwen2 (hidden 768,
 * 12 layers, 12 heads / 4 KV heads, intermediate 2048, vocab 32000: the configuration of
 * shared/reference/h200.md's PyTorch baselines), on the GPU when there is one.
 *   train:   tokens/s of fp4rl_model_train_step on 16 x 512 tokens, BF16 and FP4 (HiF4 recipe)
 *   rollout: generated tokens/s of fp4rl_rl_session_rollout, 64-token prompts, 128 new tokens,
 *            64 and 256 sequences, BF16 rollout and FP4 (HiF4 W4A4 + ResQ 2:4) rollout
 * The PyTorch + HF transformers reference of the same shapes is bench/model_throughput_torch.py.
 *   fp4rl_model_throughput [--cpu] [--rollout-only | --train-only]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fp4rl/fp4rl.h>

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        fp4rl_status st_ = (call);                                                                  \
        if (st_ != FP4RL_OK) {                                                                      \
            fprintf(stderr, "%s failed: %s: %s\n", #call, fp4rl_status_name(st_), fp4rl_last_error()); \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static const char *CONFIG =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 32000, \"hidden_size\": 768, \"intermediate_size\": 2048,"
    " \"num_hidden_layers\": 12, \"num_attention_heads\": 12, \"num_key_value_heads\": 4,"
    " \"max_position_embeddings\": 1024, \"tie_word_embeddings\": false}";

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int cpu = 0, rollout_only = 0, train_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cpu")) cpu = 1;
        else if (!strcmp(argv[i], "--rollout-only")) rollout_only = 1;
        else if (!strcmp(argv[i], "--train-only")) train_only = 1;
        else {
            fprintf(stderr, "usage: %s [--cpu] [--rollout-only | --train-only]\n", argv[0]);
            return 2;
        }
    }
    fp4rl_context *ctx = NULL;
    if (!cpu && fp4rl_context_create(&ctx, FP4RL_DEVICE_CUDA, 0) != FP4RL_OK) ctx = NULL;
    if (!ctx) CHECK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0));
    printf("# fp4rl model throughput on the %s\n\n", fp4rl_context_device(ctx) ? "GPU" : "CPU");
    enum { B = 16, T = 512 };
    int32_t *tok = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 7919u + 13u) % 32000u);
    printf("| what | numerics | tokens/s |\n|---|---|---|\n");
    /* 0: BF16; 1: HiF4 W4A4 without ResQ; 2: the HiF4 recipe (W4A4 + ResQ 2:4, FP4 training) */
    static const char *const names[3] = {"BF16", "W4A4 HiF4", "W4A4 HiF4 + ResQ 2:4"};
    for (int v = 0; v < 3; v++) {
        const int fp4 = v > 0;
        fp4rl_quant_policy *p;
        fp4rl_model *m;
        CHECK(fp4rl_quant_policy_create(&p));
        CHECK(fp4rl_quant_policy_apply_preset(p, FP4RL_PRESET_HIF4_RL));
        if (!fp4) {
            CHECK(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_BF16));
            CHECK(fp4rl_quant_policy_set(p, FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_BF16));
        }
        if (v == 1) CHECK(fp4rl_quant_policy_set(p, FP4RL_QP_RESQ, FP4RL_RESQ_OFF));
        CHECK(fp4rl_model_create(&m, ctx, CONFIG, p, 1));
        if (!rollout_only && v != 1) {
            double loss;
            CHECK(fp4rl_model_train_step(m, tok, NULL, NULL, B, T, &loss, NULL)); /* warm-up */
            const int reps = 3;
            double t0 = now();
            for (int r = 0; r < reps; r++) CHECK(fp4rl_model_train_step(m, tok, NULL, NULL, B, T, &loss, NULL));
            printf("| train step, 16 x 512 | %s | %.0f |\n", fp4 ? "FP4 (HiF4, SR dY)" : "BF16", reps * B * T / (now() - t0));
            fflush(stdout);
        }
        for (int k = 0; k < 2 && !train_only; k++) {
            const size_t n_prompts = k ? 32 : 8; /* x 8 completions = 64 or 256 sequences */
            fp4rl_rl_session *s;
            CHECK(fp4rl_rl_session_create(&s, ctx, m, NULL));
            CHECK(fp4rl_rl_session_set(s, FP4RL_RL_GROUP_SIZE, 8));
            CHECK(fp4rl_rl_session_set(s, FP4RL_RL_MAX_NEW_TOKENS, 128));
            size_t *off = malloc(sizeof(size_t) * (n_prompts + 1));
            for (size_t i = 0; i <= n_prompts; i++) off[i] = i * 64;
            CHECK(fp4rl_rl_session_rollout(s, tok, off, n_prompts)); /* no stop tokens: 128 each */
            double gen = 0, t1 = now();
            CHECK(fp4rl_rl_session_rollout(s, tok, off, n_prompts));
            const double dt = now() - t1;
            size_t n;
            CHECK(fp4rl_rl_session_num_completions(s, &n));
            for (size_t i = 0; i < n; i++) {
                size_t len;
                CHECK(fp4rl_rl_session_completion(s, i, NULL, NULL, 0, &len, NULL));
                gen += (double)len;
            }
            printf("| rollout, %zu sequences, 64 + 128 tokens | %s | %.0f |\n", n, names[v], gen / dt);
            fflush(stdout);
            free(off);
            fp4rl_rl_session_destroy(s);
        }
        fp4rl_model_destroy(m);
        fp4rl_quant_policy_destroy(p);
    }
    free(tok);
    fp4rl_context_destroy(ctx);
    return 0;
}
