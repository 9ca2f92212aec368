/*
 * pretrain_experiment.c - a small from-scratch pretraining run in four numerics, same seed, same
 * data and data order: BF16; MXFP4 1D OCP-floor nearest; the "Stable FP4" recipe (MXFP4 2D 32x32
 * truncation-free, stochastic rounding on gradients, MXFP8 q/k); HiF4 1D (the HiF4 RL recipe's
 * training numerics). Reports each arm's final eval loss and its gap to BF16.
 *
 * The corpus is generated here (no downloads): sequences from a random sparse second-order Markov
 * source over a 64-token vocabulary, so there is structure to learn and a known entropy floor.
 *
 *   fp4rl_pretrain_experiment [steps] [--cpu]
 */
#include <math.h>
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

enum { V = 64, B = 16, T = 64, NEXT = 4, EVAL_BATCHES = 8 };
static const char *CONFIG =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 64, \"hidden_size\": 128, \"intermediate_size\": 256,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 64, \"tie_word_embeddings\": false}";

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* The source: for each (previous two tokens), NEXT possible next tokens with fixed probabilities. */
typedef struct source { int32_t next[V][V][NEXT]; double p[NEXT]; } source;

static void make_source(source *src, uint64_t seed)
{
    for (int a = 0; a < V; a++)
        for (int b = 0; b < V; b++)
            for (int k = 0; k < NEXT; k++) src->next[a][b][k] = (int32_t)(rng_next(&seed) % V);
    const double w[NEXT] = {0.55, 0.25, 0.15, 0.05};
    memcpy(src->p, w, sizeof w);
}

static void sample_batch(const source *src, uint64_t *s, int32_t *tok)
{
    for (int b = 0; b < B; b++) {
        tok[b * T] = (int32_t)(rng_next(s) % V);
        tok[b * T + 1] = (int32_t)(rng_next(s) % V);
        for (int t = 2; t < T; t++) {
            double u = (double)(rng_next(s) >> 11) * 0x1p-53, acc = 0;
            int k = 0;
            for (; k < NEXT - 1; k++) {
                acc += src->p[k];
                if (u < acc) break;
            }
            tok[b * T + t] = src->next[tok[b * T + t - 2]][tok[b * T + t - 1]][k];
        }
    }
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 400;
    source *src = malloc(sizeof *src);
    make_source(src, 12345);
    /* the entropy floor per predicted token (after the first two) */
    double h = 0;
    for (int k = 0; k < NEXT; k++) h -= src->p[k] * log(src->p[k]);
    fp4rl_context *ctx;
    CHECK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0));
    const char *names[4] = {"BF16", "MXFP4 1D OCP-floor nearest", "MXFP4 2D 32x32 TF + SR dY + MXFP8 q/k", "HiF4 1D (SR dY)"};
    double final[4];
    printf("pretraining %d steps of %d x %d tokens, vocab %d, source entropy floor ~%.3f nats/token (positions >= 2)\n\n",
           steps, B, T, V, h);
    for (int arm = 0; arm < 4; arm++) {
        fp4rl_quant_policy *p;
        CHECK(fp4rl_quant_policy_create(&p));
        if (arm == 0) CHECK(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_BF16));
        if (arm == 2) CHECK(fp4rl_quant_policy_apply_preset(p, FP4RL_PRESET_STABLE_2D_MXFP4));
        if (arm == 3) {
            CHECK(fp4rl_quant_policy_apply_preset(p, FP4RL_PRESET_HIF4_RL));
            CHECK(fp4rl_quant_policy_set(p, FP4RL_QP_RESQ, FP4RL_RESQ_OFF)); /* rollout only anyway */
        }
        CHECK(fp4rl_context_set_seed(ctx, 7));
        fp4rl_model *m;
        CHECK(fp4rl_model_create(&m, ctx, CONFIG, p, 42));
        CHECK(fp4rl_model_set_hparam(m, FP4RL_MP_LR, 2e-3));
        CHECK(fp4rl_model_set_hparam(m, FP4RL_MP_WEIGHT_DECAY, 0.01));
        CHECK(fp4rl_model_set_hparam(m, FP4RL_MP_GRAD_CLIP, 1.0));
        uint64_t data = 99; /* the same data order in every arm */
        int32_t tok[B * T];
        const double t0 = seconds();
        for (int s = 0; s < steps; s++) {
            sample_batch(src, &data, tok);
            double loss;
            CHECK(fp4rl_model_train_step(m, tok, NULL, NULL, B, T, &loss, NULL));
            if ((s + 1) % 100 == 0) printf("  [%s] step %d train loss %.4f (%.0f s)\n", names[arm], s + 1, loss, seconds() - t0);
        }
        /* eval: held-out batches (another stream), loss in FP32 numerics of the trained weights */
        CHECK(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_FP32));
        CHECK(fp4rl_model_set_policy(m, p));
        uint64_t eval = 555;
        double sum = 0;
        for (int e = 0; e < EVAL_BATCHES; e++) {
            sample_batch(src, &eval, tok);
            double loss;
            CHECK(fp4rl_model_compute_gradients(m, tok, NULL, NULL, B, T, &loss));
            sum += loss;
        }
        final[arm] = sum / EVAL_BATCHES;
        printf("%-40s eval loss %.4f\n", names[arm], final[arm]);
        fp4rl_model_destroy(m);
        fp4rl_quant_policy_destroy(p);
    }
    printf("\n| arm | eval loss | gap to BF16 |\n|---|---|---|\n");
    for (int arm = 0; arm < 4; arm++)
        printf("| %s | %.4f | %+.2f%% |\n", names[arm], final[arm], 100.0 * (final[arm] - final[0]) / final[0]);
    fp4rl_context_destroy(ctx);
    free(src);
    return 0;
}
