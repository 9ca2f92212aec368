/*
 * dist_common.h - the RL run shared by the data-parallel GPU test (test_dist.c) and the
 * multi-process program (dist_rl.c): a model, a session with deterministic numerics (FP32 or
 * BF16 rollout and training, round-to-nearest: no stochastic rounding), a fixed stream of prompts
 * of different lengths, a reward that is a pure function of the completion, and a checksum of the
 * weights. Public ABI only.
 */
#ifndef FP4RL_DIST_COMMON_H
#define FP4RL_DIST_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fp4rl/fp4rl.h>

/* The small model of the tests (vocab 16, 2 layers) and a ~120M-parameter one for throughput. */
static const char *const DIST_SMALL =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 64, \"tie_word_embeddings\": true}";
static const char *const DIST_BENCH =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 32000, \"hidden_size\": 1024, \"intermediate_size\": 2816,"
    " \"num_hidden_layers\": 8, \"num_attention_heads\": 16, \"num_key_value_heads\": 4,"
    " \"max_position_embeddings\": 512, \"tie_word_embeddings\": true}";

typedef struct dist_cfg {
    int bench;            /* the throughput model instead of the small one */
    int n_prompts;        /* global prompts per step */
    int group;            /* completions per prompt */
    int max_new;          /* tokens per completion at most */
    int steps;
    int bf16;             /* BF16 rollout and training numerics (else FP32) */
    int allreduce_bf16;   /* FP4RL_RL_ALLREDUCE_BF16 */
} dist_cfg;

#define DIST_DEFAULT_CFG {0, 16, 4, 6, 3, 1, 0}

typedef struct dist_run {
    fp4rl_model *model;
    fp4rl_rl_session *session;
    fp4rl_quant_policy *policy;
    int32_t vocab;
} dist_run;

/* The prompts of step k: n_prompts prompts of 2 .. 9 tokens (the longest not always on the
 * same rank), the same on every rank. tok holds n_prompts * 9, off n_prompts + 1. */
static void dist_prompts(const dist_cfg *c, int k, int32_t vocab, int32_t *tok, size_t *off)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(k + 1);
    off[0] = 0;
    for (int p = 0; p < c->n_prompts; p++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const size_t len = 2 + (size_t)((x >> 40) % 8);
        for (size_t i = 0; i < len; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            tok[off[p] + i] = (int32_t)((x >> 33) % (uint64_t)vocab);
        }
        off[p + 1] = off[p] + len;
    }
}

/* The fraction of 7s in the completion, plus a per-prompt offset: a function of its arguments only. */
static int dist_reward(void *user, size_t pi, const int32_t *p, size_t pl, const int32_t *c, size_t cl, double *r)
{
    (void)user; (void)p; (void)pl;
    double k = 0;
    for (size_t i = 0; i < cl; i++) k += c[i] == 7;
    *r = k / (double)(cl ? cl : 1) + 0.05 * (double)(pi % 4);
    return 0;
}

static fp4rl_status dist_setup(dist_run *r, fp4rl_context *ctx, const dist_cfg *c)
{
    memset(r, 0, sizeof *r);
    fp4rl_status st = fp4rl_quant_policy_create(&r->policy);
    const int64_t num = c->bf16 ? FP4RL_NUMERICS_BF16 : FP4RL_NUMERICS_FP32;
    if (!st) st = fp4rl_quant_policy_set(r->policy, FP4RL_QP_TRAIN_NUMERICS, num);
    if (!st) st = fp4rl_quant_policy_set(r->policy, FP4RL_QP_ROLLOUT_NUMERICS, num);
    if (!st) st = fp4rl_context_set_seed(ctx, 1);
    if (!st) st = fp4rl_model_create(&r->model, ctx, c->bench ? DIST_BENCH : DIST_SMALL, r->policy, 7);
    if (!st) st = fp4rl_rl_session_create(&r->session, ctx, r->model, r->policy);
    int64_t v = 0;
    if (!st) st = fp4rl_model_get_info(r->model, FP4RL_MI_VOCAB_SIZE, &v);
    r->vocab = (int32_t)v;
    const int32_t stop = 3;
    if (!st) st = fp4rl_rl_session_set_stop_tokens(r->session, &stop, 1);
    const double hp[][2] = {{FP4RL_RL_GROUP_SIZE, c->group}, {FP4RL_RL_MAX_NEW_TOKENS, c->max_new}, {FP4RL_RL_LR, 1e-3},
                            {FP4RL_RL_SEED, 17}, {FP4RL_RL_ALLREDUCE_BF16, c->allreduce_bf16}};
    for (size_t i = 0; !st && i < sizeof hp / sizeof hp[0]; i++) st = fp4rl_rl_session_set(r->session, (fp4rl_rlparam)hp[i][0], hp[i][1]);
    return st;
}

static void dist_teardown(dist_run *r)
{
    fp4rl_rl_session_destroy(r->session);
    fp4rl_model_destroy(r->model);
    fp4rl_quant_policy_destroy(r->policy);
    memset(r, 0, sizeof *r);
}

/* Step k of the run. */
static fp4rl_status dist_step(dist_run *r, const dist_cfg *c, int k)
{
    int32_t *tok = malloc((size_t)c->n_prompts * 9 * sizeof(int32_t));
    size_t *off = malloc(((size_t)c->n_prompts + 1) * sizeof(size_t));
    if (!tok || !off) {
        free(tok);
        free(off);
        return FP4RL_ERR_OUT_OF_MEMORY;
    }
    dist_prompts(c, k, r->vocab, tok, off);
    fp4rl_status st = fp4rl_rl_session_step(r->session, tok, off, (size_t)c->n_prompts, dist_reward, NULL);
    free(tok);
    free(off);
    return st;
}

/* Every weight in HF order (host F32, malloc'd; *n floats). NULL on failure. */
static float *dist_weights(const fp4rl_model *m, int64_t *n)
{
    int64_t layers = 0, total = 0;
    if (fp4rl_model_get_info(m, FP4RL_MI_NUM_LAYERS, &layers) || fp4rl_model_get_info(m, FP4RL_MI_NUM_PARAMETERS, &total)) return NULL;
    static const char *const per_layer[] = {
        "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
        "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight",
        "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
    float *w = malloc((size_t)total * sizeof(float));
    int64_t at = 0;
    for (int64_t i = -1; w && i <= layers * 12; i++) {
        char name[128];
        if (i < 0) snprintf(name, sizeof name, "model.embed_tokens.weight");
        else if (i == layers * 12) snprintf(name, sizeof name, "model.norm.weight");
        else snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)(i / 12), per_layer[i % 12]);
        int nd = 0;
        int64_t d[2] = {1, 1};
        if (fp4rl_model_param_shape(m, name, &nd, d) != FP4RL_OK) break;
        const int64_t k = d[0] * (nd == 2 ? d[1] : 1);
        if (at + k > total || fp4rl_model_get_param(m, name, w + at, (size_t)k * sizeof(float)) != FP4RL_OK) break;
        at += k;
    }
    if (w && at != total) { /* an untied LM head: not in the configs above */
        free(w);
        return NULL;
    }
    *n = total;
    return w;
}

/* FNV-1a over the weights' bytes. */
static uint64_t dist_checksum(const float *w, int64_t n)
{
    const unsigned char *b = (const unsigned char *)w;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Metrics that depend on wall time (not compared between runs). */
static int dist_timed_metric(const char *name)
{
    return strncmp(name, "perf/", 5) == 0 || strncmp(name, "time/", 5) == 0;
}

#endif
