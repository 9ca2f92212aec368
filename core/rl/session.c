/*
 * session.c - fp4rl_rl_session: the RL step of shared/spec/recipes.md section 3.
 *   1-2 sync + rollout (core/rl/rollout.c), 3 reward, 4 GRPO advantages, 5 log pi_old in the
 *   training numerics, 6 the TIS-weighted clipped loss per token (core/rl/grpo.c), 7 backward in the
 *   training numerics + AdamW, 8 metrics.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rl/grpo.h"
#include "rl/session.h"

static const char *const metric_names[M_COUNT] = {
    "reward/mean", "reward/std", "reward/max", "reward/min", "adv/zero_std_frac", "pg/loss", "pg/clipfrac_low",
    "pg/clipfrac_high", "tis/mean", "tis/max", "tis/capped_frac", "mismatch/logp_abs_diff_mean",
    "mismatch/logp_abs_diff_max", "mismatch/k3_kl", "entropy", "response_length/mean", "response_length/max",
    "response_length/clipped_frac", "grad_norm", "lr", "quant/act_zero_frac", "perf/rollout_tokens_per_s",
    "perf/train_tokens_per_s", "time/rollout_s", "time/train_s", "time/step_s", "kl/k3",
    "io/metrics_write_error", "perf/peak_memory_gb",
};

static const char *const param_names[FP4RL_RL_PARAM_COUNT] = {
    "group_size", "max_new_tokens", "temperature", "top_k", "lr", "weight_decay", "clip_low", "clip_high",
    "tis_cap", "kl_coef", "loss_agg", "adv_norm", "minibatches", "epochs", "grad_clip", "seed", "allreduce_bf16",
    "microbatch_tokens", "warmup_steps", "lr_schedule", "total_steps", "top_p",
};
static const double param_defaults[FP4RL_RL_PARAM_COUNT] = {8, 64, 1.0, 0, 1e-6, 0, 0.2, 0.2, 5.0, 0, 0, 1, 1, 1, 1.0, 0, 0, 0,
                                                            0, 0, 0, 1.0};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static fp4rl_status check_session(const fp4rl_rl_session *s, const char *fn)
{
    if (!s) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: session is NULL", fn);
    return fp4rl_check_ctx(s->model->ctx, fn);
}

static void clear_rollout(fp4rl_rl_session *s)
{
    fp4rl_rollout_result_free(&s->ro);
    free(s->prompts);
    free(s->offsets);
    free(s->rewards);
    s->prompts = NULL;
    s->offsets = NULL;
    s->rewards = NULL;
    s->n_prompts = s->prompt0 = s->global_prompts = 0;
    s->have_rollout = s->have_rewards = 0;
}

void fp4rl_rl_session_destroy(fp4rl_rl_session *s)
{
    if (!s) return;
    clear_rollout(s);
    if (s->ref_w) s->model->ctx->be->free(s->model->ctx, s->ref_w); /* the model outlives the session (fp4rl.h) */
    free(s->stop);
    free(s->metrics_path);
    free(s);
}

fp4rl_status fp4rl_rl_session_create(fp4rl_rl_session **out, fp4rl_context *ctx, fp4rl_model *model,
                                     const fp4rl_quant_policy *policy)
{
    const char *fn = "fp4rl_rl_session_create";
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (st) return st;
    if (!model) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
    if (model->ctx != ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the model belongs to another context", fn);
    if (policy && (st = fp4rl_model_set_policy(model, policy))) return st;
    fp4rl_rl_session *s = calloc(1, sizeof *s);
    if (!s) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    s->model = model; /* its context is the session's: checked above, read as s->model->ctx */
    memcpy(s->hp, param_defaults, sizeof s->hp);
    if (model->n_default_stop && (st = fp4rl_rl_session_set_stop_tokens(s, model->default_stop, (size_t)model->n_default_stop))) {
        fp4rl_rl_session_destroy(s);
        return st;
    }
    *out = s;
    return FP4RL_OK;
}

/* The one definition of each session parameter's bounds, for the setter and the checkpoint
 * loader: NULL when v is allowed, else what is. */
const char *fp4rl_rl_param_allowed(const fp4rl_rl_session *s, int p, double v)
{
    const int integral = v == floor(v);
    const char *allowed = NULL;
    switch ((fp4rl_rlparam)p) {
    case FP4RL_RL_GROUP_SIZE: if (!(integral && v >= 2 && v <= 1024)) allowed = "an integer in 2 .. 1024"; break;
    case FP4RL_RL_MAX_NEW_TOKENS: if (!(integral && v >= 1 && v <= 65536)) allowed = "an integer in 1 .. 65536"; break;
    case FP4RL_RL_TEMPERATURE: if (!(v >= 0.01 && v <= 100)) allowed = "[0.01, 100]"; break;
    case FP4RL_RL_TOP_K: if (!(integral && v >= 0 && v <= (double)s->model->cfg.vocab_size)) allowed = "0 (off) or an integer up to the vocabulary size"; break;
    case FP4RL_RL_LR: if (!(v > 0 && v <= 1)) allowed = "(0, 1]"; break;
    case FP4RL_RL_WEIGHT_DECAY: if (!(v >= 0 && v <= 1)) allowed = "[0, 1]"; break;
    case FP4RL_RL_KL_COEF: if (!(v >= 0 && v <= 100)) allowed = "[0, 100]"; break;
    case FP4RL_RL_CLIP_LOW: if (!(v >= 0 && v < 1)) allowed = "[0, 1)"; break;
    case FP4RL_RL_TIS_CAP: if (!(v == 0 || (v >= 1 && isfinite(v)))) allowed = "0 (off) or >= 1"; break;
    case FP4RL_RL_LOSS_AGG: case FP4RL_RL_ADV_NORM: case FP4RL_RL_ALLREDUCE_BF16: if (!(v == 0 || v == 1)) allowed = "0 or 1"; break;
    case FP4RL_RL_MINIBATCHES: if (!(integral && v >= 1 && v <= 1e6)) allowed = "an integer >= 1"; break;
    case FP4RL_RL_EPOCHS: if (!(integral && v >= 1 && v <= 100)) allowed = "an integer in 1 .. 100"; break;
    case FP4RL_RL_MICROBATCH_TOKENS: if (!(integral && v >= 0 && v <= 1099511627776.0)) allowed = "0 (automatic) or an integer up to 2^40"; break;
    case FP4RL_RL_SEED: if (!(integral && v >= 0 && v <= 9007199254740992.0)) allowed = "an integer in 0 .. 2^53"; break;
    case FP4RL_RL_WARMUP_STEPS: case FP4RL_RL_TOTAL_STEPS:
        if (!(integral && v >= 0 && v <= 2147483648.0)) allowed = "an integer in 0 .. 2^31";
        break;
    case FP4RL_RL_LR_SCHEDULE: if (!(v == 0 || v == 1 || v == 2)) allowed = "0 (constant), 1 (linear) or 2 (cosine)"; break;
    case FP4RL_RL_TOP_P: if (!(v > 0 && v <= 1)) allowed = "(0, 1] (1 = off)"; break;
    default: if (!(v >= 0 && isfinite(v))) allowed = ">= 0"; break; /* clip high, grad clip */
    }
    return allowed;
}

const char *fp4rl_rl_param_name(int p) { return p >= 0 && p < FP4RL_RL_PARAM_COUNT ? param_names[p] : "?"; }

fp4rl_status fp4rl_rl_session_set(fp4rl_rl_session *s, fp4rl_rlparam p, double v)
{
    const char *fn = "fp4rl_rl_session_set";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if ((int)p < 0 || (int)p >= FP4RL_RL_PARAM_COUNT)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: unknown parameter %d (0 .. %d)", fn, (int)p, FP4RL_RL_PARAM_COUNT - 1);
    const char *allowed = fp4rl_rl_param_allowed(s, (int)p, v);
    if (allowed) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %s = %g is out of range; allowed: %s", fn, param_names[p], v, allowed);
    s->hp[p] = v;
    return FP4RL_OK;
}

fp4rl_status fp4rl_rl_session_get(const fp4rl_rl_session *s, fp4rl_rlparam p, double *v)
{
    const char *fn = "fp4rl_rl_session_get";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (!v || (int)p < 0 || (int)p >= FP4RL_RL_PARAM_COUNT)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: value is NULL or parameter %d unknown (0 .. %d)", fn, (int)p, FP4RL_RL_PARAM_COUNT - 1);
    *v = s->hp[p];
    return FP4RL_OK;
}

fp4rl_status fp4rl_rl_session_set_stop_tokens(fp4rl_rl_session *s, const int32_t *ids, size_t n)
{
    const char *fn = "fp4rl_rl_session_set_stop_tokens";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (n && !ids) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: ids is NULL", fn);
    if (n > 1024) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %zu stop tokens; at most 1024", fn, n);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->model->cfg.vocab_size)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: ids[%zu] = %d is outside the vocabulary [0, %lld)", fn, i,
                              ids[i], (long long)s->model->cfg.vocab_size);
    int32_t *copy = n ? malloc(n * sizeof *copy) : NULL;
    if (n && !copy) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (n) memcpy(copy, ids, n * sizeof *copy);
    free(s->stop);
    s->stop = copy;
    s->n_stop = n;
    return FP4RL_OK;
}

fp4rl_status fp4rl_rl_session_get_stop_tokens(const fp4rl_rl_session *s, int32_t *ids, size_t cap, size_t *n)
{
    const char *fn = "fp4rl_rl_session_get_stop_tokens";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (!n) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: n is NULL", fn);
    if (cap && !ids) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: ids is NULL with cap %zu", fn, cap);
    if (ids && s->n_stop) memcpy(ids, s->stop, (cap < s->n_stop ? cap : s->n_stop) * sizeof *ids);
    *n = s->n_stop;
    return FP4RL_OK;
}

/* ---- rollout ---- */
static fp4rl_status check_prompts(const fp4rl_rl_session *s, const int32_t *prompts, const size_t *offsets,
                                  size_t n_prompts, const char *fn)
{
    if (!prompts || !offsets) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: prompts or prompt_offsets is NULL", fn);
    if (n_prompts == 0) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: n_prompts is 0; a step needs at least one prompt", fn);
    if (n_prompts > 1000000) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %zu prompts is too many", fn, n_prompts);
    if (offsets[0] != 0) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: prompt_offsets[0] is %zu; it must be 0", fn, offsets[0]);
    /* every offset is checked before any token is read: offsets must rise, and each prompt fit the
     * context (so the lengths and their sum can neither wrap nor overflow) */
    const int64_t ctx_len = s->model->cfg.max_position_embeddings, max_new = (int64_t)s->hp[FP4RL_RL_MAX_NEW_TOKENS];
    for (size_t p = 0; p < n_prompts; p++) {
        if (offsets[p + 1] <= offsets[p])
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: prompt %zu is empty or its offsets fall (prompt_offsets[%zu] = %zu, [%zu] = %zu); offsets must rise, every prompt needs a token",
                              fn, p, p, offsets[p], p + 1, offsets[p + 1]);
        const size_t len = offsets[p + 1] - offsets[p];
        if (len > (size_t)ctx_len || (int64_t)len + max_new > ctx_len)
            return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: prompt %zu has %zu tokens; with max_new_tokens %lld it exceeds the model's context of %lld",
                              fn, p, len, (long long)max_new, (long long)ctx_len);
    }
    for (size_t p = 0; p < n_prompts; p++)
        for (size_t i = offsets[p]; i < offsets[p + 1]; i++)
            if (prompts[i] < 0 || prompts[i] >= s->model->cfg.vocab_size)
                return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: prompt %zu token %zu is %d, outside the vocabulary [0, %lld)",
                                  fn, p, i - offsets[p], prompts[i], (long long)s->model->cfg.vocab_size);
    return FP4RL_OK;
}

/* This rank's share of n global prompts: [*p0, *p1). Every prompt's group stays on one rank. */
static void rank_share(const fp4rl_context *ctx, size_t n, size_t *p0, size_t *p1)
{
    const size_t W = (size_t)ctx->world_size, r = (size_t)ctx->rank;
    *p0 = n * r / W;
    *p1 = n * (r + 1) / W;
}

static fp4rl_status do_rollout(fp4rl_rl_session *s, const int32_t *prompts, const size_t *offsets, size_t n_prompts,
                               const char *fn)
{
    fp4rl_status st = check_session(s, fn);
    if (!st) st = check_prompts(s, prompts, offsets, n_prompts, fn);
    if (st) return st;
    const int dist = fp4rl_dist_active(s->model->ctx);
    if (dist && n_prompts < (size_t)s->model->ctx->world_size)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %zu prompts for %d ranks; every rank needs at least one prompt (pass the same global prompt list on every rank)",
                          fn, n_prompts, s->model->ctx->world_size);
    size_t p0 = 0, p1 = n_prompts;
    if (dist) rank_share(s->model->ctx, n_prompts, &p0, &p1);
    clear_rollout(s);
    const size_t n_local = p1 - p0, n_tok = offsets[p1] - offsets[p0];
    s->prompts = malloc(n_tok * sizeof(int32_t));
    s->offsets = malloc((n_local + 1) * sizeof(size_t));
    if (!s->prompts || !s->offsets) {
        clear_rollout(s);
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    memcpy(s->prompts, prompts + offsets[p0], n_tok * sizeof(int32_t));
    for (size_t p = 0; p <= n_local; p++) s->offsets[p] = offsets[p0 + p] - offsets[p0];
    s->n_prompts = n_local;
    s->prompt0 = p0;
    s->global_prompts = n_prompts;
    const int64_t G = (int64_t)s->hp[FP4RL_RL_GROUP_SIZE], max_new = (int64_t)s->hp[FP4RL_RL_MAX_NEW_TOKENS];
    fp4rl_rollout_cfg cfg = {
        .group = G, .max_new = max_new,
        .temperature = (float)s->hp[FP4RL_RL_TEMPERATURE], .top_k = (int64_t)s->hp[FP4RL_RL_TOP_K], .top_p = s->hp[FP4RL_RL_TOP_P],
        .stop = s->stop, .n_stop = (int64_t)s->n_stop, .seed = (uint64_t)s->hp[FP4RL_RL_SEED], .offset = s->sample_offset,
        .row0 = (uint64_t)p0 * (uint64_t)G, /* sampling draws by the global completion index */
    };
    /* a rank's rollout ends at its own share's last decode step: every rank moves on to the offset
     * after the global batch's, even when its rollout fails, so the ranks never sample apart */
    if (dist) {
        size_t max_plen = 0;
        for (size_t p = 0; p < n_prompts; p++)
            if (offsets[p + 1] - offsets[p] > max_plen) max_plen = offsets[p + 1] - offsets[p];
        s->sample_offset = cfg.offset + (uint64_t)max_plen + (uint64_t)max_new - 1;
    }
    const double t0 = now_s();
    st = fp4rl_rollout_run(s->model, &cfg, s->prompts, s->offsets, n_local, &s->ro);
    if (st) {
        clear_rollout(s);
        return st;
    }
    s->rollout_s = now_s() - t0;
    if (!dist) s->sample_offset = s->ro.offset_end;
    s->have_rollout = 1;
    return FP4RL_OK;
}

fp4rl_status fp4rl_rl_session_rollout(fp4rl_rl_session *s, const int32_t *prompts, const size_t *offsets, size_t n_prompts)
{
    return do_rollout(s, prompts, offsets, n_prompts, "fp4rl_rl_session_rollout");
}

fp4rl_status fp4rl_rl_session_num_completions(const fp4rl_rl_session *s, size_t *n)
{
    const char *fn = "fp4rl_rl_session_num_completions";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (!n) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: n is NULL", fn);
    *n = s->have_rollout ? (size_t)s->ro.n_seqs : 0;
    return FP4RL_OK;
}

fp4rl_status fp4rl_rl_session_completion(const fp4rl_rl_session *s, size_t i, int32_t *tokens, float *logprobs, size_t cap,
                                         size_t *length, size_t *prompt_index)
{
    const char *fn = "fp4rl_rl_session_completion";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (!s->have_rollout) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: no rollout yet; call fp4rl_rl_session_rollout first", fn);
    if (i >= (size_t)s->ro.n_seqs)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: completion %zu does not exist (the rollout has %lld)", fn, i, (long long)s->ro.n_seqs);
    if (!length) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: length is NULL", fn);
    const size_t len = (size_t)s->ro.lengths[i];
    if ((tokens || logprobs) && cap < len)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: completion %zu has %zu tokens; the buffers hold %zu", fn, i, len, cap);
    if (tokens) memcpy(tokens, s->ro.tokens + i * (size_t)s->ro.max_new, len * sizeof(int32_t));
    if (logprobs) memcpy(logprobs, s->ro.logprobs + i * (size_t)s->ro.max_new, len * sizeof(float));
    *length = len;
    if (prompt_index) *prompt_index = s->prompt0 + i / (size_t)s->hp[FP4RL_RL_GROUP_SIZE];
    return FP4RL_OK;
}

fp4rl_status fp4rl_rl_session_set_rewards(fp4rl_rl_session *s, const double *rewards, size_t n)
{
    const char *fn = "fp4rl_rl_session_set_rewards";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (!s->have_rollout) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: no rollout yet; call fp4rl_rl_session_rollout first", fn);
    if (!rewards) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: rewards is NULL", fn);
    if (n != (size_t)s->ro.n_seqs)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: %zu rewards for %lld completions", fn, n, (long long)s->ro.n_seqs);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(rewards[i]))
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the reward of completion %zu (prompt %zu) is %g, not finite", fn, i,
                              s->prompt0 + i / (size_t)s->hp[FP4RL_RL_GROUP_SIZE], rewards[i]);
    double *copy = malloc(n * sizeof *copy);
    if (!copy) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    memcpy(copy, rewards, n * sizeof *copy);
    free(s->rewards);
    s->rewards = copy;
    s->have_rewards = 1;
    return FP4RL_OK;
}

/* ---- train ---- */

double fp4rl_rl_lr_factor(int schedule, double warmup, double total, double u)
{
    if (u < warmup) return u / warmup;
    if (schedule == 0) return 1.0;
    const double span = total - warmup;
    if (span <= 0) return 0.0; /* the schedule has ended before it began */
    const double progress = (u - warmup) / span;
    if (schedule == 1) return progress >= 1 ? 0.0 : 1.0 - progress;
    return progress >= 1 ? 0.0 : 0.5 * (1.0 + cos(3.141592653589793 * progress));
}

typedef struct pg_ctx {
    const fp4rl_rl_session *s;
    fp4rl_pg_config cfg;
    int64_t seq0, nseq, T;           /* the minibatch: sequences [seq0, seq0 + nseq) */
    double total, nonempty;          /* the loss normalizers: tokens and non-empty completions of the
                                        minibatch, over every rank's share of it */
    float *logp_old;                 /* [n_seqs, T]; filled by the hook when old_from_pass */
    const float *logp_ref;            /* [n_seqs, T] */
    int old_from_pass;                /* log pi_old is the training pass's own log-probs (one update per step) */
    const float *adv;
    const int64_t *plen;
    /* accumulated over the step */
    double tokens, clip_low, clip_high, capped, tis_sum, tis_max, ent_sum, kl_sum, loss_sum;
} pg_ctx;

static fp4rl_status pg_hook(void *user, int64_t b0, int64_t nb, const float *logp, const float *entropy, float *dlogp,
                            double *loss)
{
    pg_ctx *c = user;
    const fp4rl_rollout_result *ro = &c->s->ro;
    const int per_seq = c->s->hp[FP4RL_RL_LOSS_AGG] == 0;
    double l_sum = 0;
    for (int64_t i = 0; i < nb; i++) { /* the micro-batch's sequences b0 .. of the minibatch */
        const int64_t seq = c->seq0 + b0 + i, clen = ro->lengths[seq];
        for (int64_t j = 0; j < clen; j++) {
            const int64_t t = c->plen[seq] + j;   /* the token's position */
            const int64_t row = i * c->T + t - 1; /* the row predicting it, in the micro-batch */
            const double w = per_seq ? 1.0 / ((double)clen * c->nonempty) : 1.0 / c->total;
            double g;
            fp4rl_pg_token_stats ts;
            if (c->old_from_pass) c->logp_old[seq * c->T + t] = logp[row]; /* the same weights: on-policy */
            const double lp_old = c->logp_old[seq * c->T + t], mu = ro->logprobs[seq * ro->max_new + j];
            const double lp_ref = c->logp_ref ? c->logp_ref[seq * c->T + t] : 0.0;
            const double l = fp4rl_pg_token_loss(&c->cfg, logp[row], lp_old, mu, lp_ref, c->adv[seq], &g, &ts);
            dlogp[row] = (float)(w * g);
            l_sum += w * l;
            c->tokens += 1;
            c->clip_low += ts.clipped_low;
            c->clip_high += ts.clipped_high;
            c->capped += ts.tis_capped;
            c->tis_sum += ts.tis_weight;
            if (ts.tis_weight > c->tis_max) c->tis_max = ts.tis_weight;
            c->ent_sum += entropy[row];
            c->kl_sum += ts.kl_k3;
        }
    }
    *loss = l_sum;
    c->loss_sum += l_sum;
    return FP4RL_OK;
}

/* The rollout as a padded training batch: prompt + completion per sequence. */
static fp4rl_status build_batch(const fp4rl_rl_session *s, int32_t **tokens, int32_t **lengths, int64_t **plen, int64_t *T)
{
    const fp4rl_rollout_result *ro = &s->ro;
    const int64_t n = ro->n_seqs, G = (int64_t)s->hp[FP4RL_RL_GROUP_SIZE];
    int64_t t_max = 1;
    *plen = malloc((size_t)n * sizeof(int64_t));
    *lengths = malloc((size_t)n * sizeof(int32_t));
    if (!*plen || !*lengths) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "fp4rl_rl_session_train: out of memory");
    for (int64_t i = 0; i < n; i++) {
        (*plen)[i] = (int64_t)(s->offsets[i / G + 1] - s->offsets[i / G]);
        (*lengths)[i] = (int32_t)((*plen)[i] + ro->lengths[i]);
        if ((*lengths)[i] > t_max) t_max = (*lengths)[i];
    }
    *tokens = calloc((size_t)(n * t_max), sizeof(int32_t));
    if (!*tokens) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "fp4rl_rl_session_train: out of memory");
    for (int64_t i = 0; i < n; i++) {
        memcpy(*tokens + i * t_max, s->prompts + s->offsets[i / G], (size_t)(*plen)[i] * sizeof(int32_t));
        memcpy(*tokens + i * t_max + (*plen)[i], ro->tokens + i * ro->max_new, (size_t)ro->lengths[i] * sizeof(int32_t));
    }
    *T = t_max;
    return FP4RL_OK;
}

/* The step's statistics on this rank, as sums and maxima: a distributed context reduces them over
 * the ranks before the metrics are formed, so every rank reports the global batch's metrics. */
enum {
    S_R_SUM, S_R_SQ, S_N, S_LEN_SUM, S_CLIPPED, S_ZERO_GROUPS, S_PROMPTS, S_ACT_ZERO, S_TOKENS, S_CLIP_LOW, S_CLIP_HIGH,
    S_CAPPED, S_TIS, S_ENT, S_KL, S_LOSS, S_MM, S_K3, S_NTOK, S_TRAIN_TOKENS, S_COUNT
};
enum { X_R_MAX, X_R_NEG_MIN, X_LEN_MAX, X_TIS_MAX, X_MM_MAX, X_ROLLOUT_S, X_TRAIN_S, X_COUNT };

/* The mismatch between the rollout's log mu and the trainer's log pi_old, over the completions. */
static void mismatch_stats(const fp4rl_rl_session *s, const float *logp_old, int64_t T, const int64_t *plen, double *sum, double *mx)
{
    for (int64_t i = 0; i < s->ro.n_seqs; i++)
        for (int64_t j = 0; j < s->ro.lengths[i]; j++) {
            const double mu = s->ro.logprobs[i * s->ro.max_new + j], old = logp_old[i * T + plen[i] + j];
            const double d = fabs(mu - old), r = exp(old - mu);
            sum[S_MM] += d;
            mx[X_MM_MAX] = fmax(mx[X_MM_MAX], d);
            sum[S_K3] += r - 1.0 - (old - mu);
            sum[S_NTOK]++;
        }
}

static void local_stats(const fp4rl_rl_session *s, const pg_ctx *pc, double *sum, double *mx)
{
    const int64_t n = s->ro.n_seqs;
    mx[X_R_MAX] = mx[X_R_NEG_MIN] = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const double r = s->rewards[i];
        sum[S_R_SUM] += r;
        sum[S_R_SQ] += r * r;
        mx[X_R_MAX] = fmax(mx[X_R_MAX], r);
        mx[X_R_NEG_MIN] = fmax(mx[X_R_NEG_MIN], -r);
        sum[S_LEN_SUM] += (double)s->ro.lengths[i];
        mx[X_LEN_MAX] = fmax(mx[X_LEN_MAX], (double)s->ro.lengths[i]);
        sum[S_CLIPPED] += !s->ro.stopped[i];
    }
    sum[S_N] = (double)n;
    sum[S_PROMPTS] = (double)s->n_prompts;
    sum[S_ACT_ZERO] = s->ro.act_zero_frac * (double)n;
    sum[S_TOKENS] = pc->tokens;
    sum[S_CLIP_LOW] = pc->clip_low;
    sum[S_CLIP_HIGH] = pc->clip_high;
    sum[S_CAPPED] = pc->capped;
    sum[S_TIS] = pc->tis_sum;
    sum[S_ENT] = pc->ent_sum;
    sum[S_KL] = pc->kl_sum;
    sum[S_LOSS] = pc->loss_sum;
    mx[X_TIS_MAX] = pc->tis_max;
    mx[X_ROLLOUT_S] = s->rollout_s;
}

static void set_metrics(fp4rl_rl_session *s, const double *sum, const double *mx, double grad_norm, int64_t updates, int dist,
                        double lr)
{
    double *M = s->metrics;
    memset(s->metrics, 0, sizeof s->metrics);
    const double n = sum[S_N], mean = sum[S_R_SUM] / n;
    M[M_REWARD_MEAN] = mean;
    M[M_REWARD_STD] = n > 1 ? sqrt(fmax(0.0, (sum[S_R_SQ] - n * mean * mean) / (n - 1))) : 0.0;
    M[M_REWARD_MAX] = mx[X_R_MAX];
    M[M_REWARD_MIN] = -mx[X_R_NEG_MIN];
    M[M_ADV_ZERO_STD_FRAC] = sum[S_ZERO_GROUPS] / sum[S_PROMPTS];
    M[M_RESP_LEN_MEAN] = sum[S_LEN_SUM] / n;
    M[M_RESP_LEN_MAX] = mx[X_LEN_MAX];
    M[M_RESP_LEN_CLIPPED] = sum[S_CLIPPED] / n;
    M[M_ACT_ZERO_FRAC] = dist ? sum[S_ACT_ZERO] / n : s->ro.act_zero_frac;
    const double tok = sum[S_TOKENS] > 0 ? sum[S_TOKENS] : 1;
    M[M_PG_LOSS] = sum[S_LOSS] / (double)updates;
    M[M_PG_CLIPFRAC_LOW] = sum[S_CLIP_LOW] / tok;
    M[M_PG_CLIPFRAC_HIGH] = sum[S_CLIP_HIGH] / tok;
    M[M_TIS_MEAN] = sum[S_TIS] / tok;
    M[M_TIS_MAX] = mx[X_TIS_MAX];
    M[M_TIS_CAPPED_FRAC] = sum[S_CAPPED] / tok;
    M[M_ENTROPY] = sum[S_ENT] / tok;
    M[M_KL] = sum[S_KL] / tok;
    M[M_MISMATCH_MEAN] = sum[S_NTOK] ? sum[S_MM] / sum[S_NTOK] : 0;
    M[M_MISMATCH_MAX] = mx[X_MM_MAX];
    M[M_MISMATCH_K3] = sum[S_NTOK] ? sum[S_K3] / sum[S_NTOK] : 0;
    M[M_GRAD_NORM] = grad_norm / (double)updates;
    M[M_LR] = lr; /* the last update's, after the schedule */
    const double rollout_s = mx[X_ROLLOUT_S], train_s = mx[X_TRAIN_S];
    M[M_TIME_ROLLOUT] = rollout_s;
    M[M_TIME_TRAIN] = train_s;
    M[M_TIME_STEP] = rollout_s + train_s;
    M[M_ROLLOUT_TPS] = rollout_s > 0 ? n * M[M_RESP_LEN_MEAN] / rollout_s : 0;
    M[M_TRAIN_TPS] = train_s > 0 ? sum[S_TRAIN_TOKENS] / train_s : 0;
    /* this rank's context: the high-water mark since its creation or last reset_peak_memory (1e9 bytes) */
    size_t peak = 0;
    fp4rl_context_memory(s->model->ctx, NULL, &peak, NULL);
    M[M_PEAK_MEM_GB] = (double)peak * 1e-9;
}

static fp4rl_status append_metrics_line(const fp4rl_rl_session *s);

/* Steps 4-8 on the pending rollout and rewards. `st` is the caller's status so far: in a
 * distributed context every rank comes here, failed or not, so that all ranks agree to go on or
 * to stop (`fn` names the entry point in the messages about other ranks). */
static fp4rl_status train_impl(fp4rl_rl_session *s, fp4rl_status st, const char *entry)
{
    const char *fn = "fp4rl_rl_session_train";
    fp4rl_model *m = s->model;
    fp4rl_context *ctx = s->model->ctx;
    const int dist = fp4rl_dist_active(ctx);
    if (st && !dist) return st;
    const double t0 = now_s();
    const int64_t n = st ? 0 : s->ro.n_seqs, G = (int64_t)s->hp[FP4RL_RL_GROUP_SIZE];
    const float temp = (float)s->hp[FP4RL_RL_TEMPERATURE];
    const int64_t micro = (int64_t)s->hp[FP4RL_RL_MICROBATCH_TOKENS];
    /* top-p: every log-prob of the loss under the rollout's truncation (see FP4RL_RL_TOP_P) */
    const fp4rl_truncation trunc = {(int64_t)s->hp[FP4RL_RL_TOP_K], s->hp[FP4RL_RL_TOP_P]};
    int32_t *tokens = NULL, *lengths = NULL;
    int64_t *plen = NULL, T = 0, zero_groups = 0;
    float *adv = NULL, *logp_old = NULL, *logp_ref = NULL;
    if (!st) {
        adv = malloc((size_t)n * sizeof(float));
        st = adv ? build_batch(s, &tokens, &lengths, &plen, &T) : fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    if (!st) {
        logp_old = malloc((size_t)(n * T) * sizeof(float));
        if (s->hp[FP4RL_RL_KL_COEF] > 0) logp_ref = malloc((size_t)(n * T) * sizeof(float));
        if (!logp_old || (s->hp[FP4RL_RL_KL_COEF] > 0 && !logp_ref)) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    /* 4. advantages (a prompt's group is whole on this rank) */
    if (!st) fp4rl_grpo_advantages(s->rewards, (int64_t)s->n_prompts, G, s->hp[FP4RL_RL_ADV_NORM] != 0, adv, &zero_groups);
    /* 5. log pi_old with the current weights and the training numerics. With one update per step
     * the training pass runs on the same weights, so its own log-probs are log pi_old (TRL does the
     * same): no forward of its own, unless the forward draws random numbers (stochastic rounding
     * of weights or activations: then the two forwards differ and pi_old keeps its own). */
    const int64_t share = dist ? (int64_t)(s->global_prompts / (size_t)ctx->world_size) * G : n;
    const int64_t mbs = (int64_t)s->hp[FP4RL_RL_MINIBATCHES] < share ? (int64_t)s->hp[FP4RL_RL_MINIBATCHES] : share;
    const int old_from_pass = !s->separate_old_pass && s->hp[FP4RL_RL_EPOCHS] == 1 && mbs <= 1 && !fp4rl_model_forward_draws(m);
    if (!st && !old_from_pass)
        st = fp4rl_model_pass(m, &(fp4rl_pass){.tokens = tokens, .lengths = lengths, .B = n, .T = T, .logprobs_out = logp_old,
                                               .temperature = temp, .trunc = &trunc, .micro_tokens = micro, .fn = fn});
    /* the KL reference: the weights at the first step with beta > 0, kept on the device */
    if (!st && logp_ref) {
        if (!s->ref_w) st = fp4rl_model_copy_weights(m, &s->ref_w); /* ref = w */
        if (!st) st = fp4rl_model_ref_logprobs(m, s->ref_w, tokens, lengths, n, T, logp_ref, temp, &trunc, micro, fn);
    }
    double sum[S_COUNT] = {0}, mx[X_COUNT] = {0};
    if (!st && !old_from_pass) mismatch_stats(s, logp_old, T, plen, sum, mx);
    /* every rank has its batch and log-probs: all go on, or all stop here */
    st = fp4rl_dist_agree(ctx, st, entry);
    /* a session's first update starts a fresh AdamW state: moments left by earlier supervised
     * training are scaled to another loss and would shrink the RL updates for hundreds of steps */
    if (!st && s->steps == 0) st = fp4rl_model_reset_optimizer(m);
    /* 6-7. loss, backward, AdamW over minibatches and epochs. Minibatch b of a distributed step is
     * every rank's local minibatch b: the loss is normalised by the counts of all of them and the
     * gradients are summed over the ranks, so every rank applies the same update. The count of
     * minibatches is capped by the smallest rank's completions, the same on every rank. */
    pg_ctx pc = {.s = s, .cfg = {s->hp[FP4RL_RL_CLIP_LOW], s->hp[FP4RL_RL_CLIP_HIGH], s->hp[FP4RL_RL_TIS_CAP], s->hp[FP4RL_RL_KL_COEF]},
                 .T = T, .logp_old = logp_old, .logp_ref = logp_ref, .old_from_pass = old_from_pass, .adv = adv, .plen = plen};
    const int bf16 = s->hp[FP4RL_RL_ALLREDUCE_BF16] != 0;
    double gn_sum = 0, last_lr = s->hp[FP4RL_RL_LR];
    int64_t updates = 0;
    int stopped = st != FP4RL_OK; /* a failure every rank knows of: no more collectives */
    for (int64_t e = 0; !stopped && e < (int64_t)s->hp[FP4RL_RL_EPOCHS]; e++)
        for (int64_t b = 0; !stopped && b < mbs; b++) {
            pc.seq0 = n * b / mbs;
            pc.nseq = n * (b + 1) / mbs - pc.seq0;
            double norm[2] = {0, 0}; /* tokens, non-empty completions */
            for (int64_t i = pc.seq0; i < pc.seq0 + pc.nseq; i++) {
                norm[0] += (double)s->ro.lengths[i];
                norm[1] += s->ro.lengths[i] > 0;
            }
            /* with the counts, whether the previous minibatch's update failed on some rank */
            if ((st = fp4rl_dist_agree_sum(ctx, st, norm, 2, entry))) {
                stopped = 1;
                break;
            }
            pc.total = norm[0];
            pc.nonempty = norm[1];
            const fp4rl_loss_hook hook = {pg_hook, &pc};
            double loss, gn = 0;
            st = fp4rl_model_pass(m, &(fp4rl_pass){.tokens = tokens + pc.seq0 * T, .lengths = lengths + pc.seq0, .B = pc.nseq, .T = T,
                                                   .backward = 1, .loss = &loss, .hook = &hook, .temperature = temp,
                                                   .trunc = &trunc, .micro_tokens = micro, .fn = fn});
            if (!st && !isfinite(loss))
                st = fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the policy loss of minibatch %lld is %g, not finite; its update was not applied", fn, (long long)b, loss);
            if ((st = fp4rl_dist_agree(ctx, st, entry))) {
                stopped = 1;
                break;
            }
            st = fp4rl_dist_sum_f32(ctx, fp4rl_model_grad_buffer(m), fp4rl_model_param_floats(m), bf16);
            /* this update's learning rate: u = the session's earlier updates (the model's AdamW step, reset at its first) */
            const double lr = s->hp[FP4RL_RL_LR] * fp4rl_rl_lr_factor((int)s->hp[FP4RL_RL_LR_SCHEDULE], s->hp[FP4RL_RL_WARMUP_STEPS],
                                                                      s->hp[FP4RL_RL_TOTAL_STEPS], (double)fp4rl_model_optimizer_step(m));
            if (!st) st = fp4rl_model_update(m, lr, s->hp[FP4RL_RL_WEIGHT_DECAY], s->hp[FP4RL_RL_GRAD_CLIP], &gn);
            last_lr = lr;
            if (st && updates > 0) { /* a refused update stops the step; the earlier ones are not undone */
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", fp4rl_last_error());
                st = fp4rl_fail(st, "%s: epoch %lld, minibatch %lld: %s; the %lld update(s) before it in this step stay applied", fn,
                                (long long)e, (long long)b, msg, (long long)updates);
            }
            gn_sum += gn;
            updates++;
            for (int64_t i = pc.seq0; i < pc.seq0 + pc.nseq; i++) sum[S_TRAIN_TOKENS] += lengths[i];
        }
    if (!stopped) st = fp4rl_dist_agree(ctx, st, entry); /* the last update */
    fp4rl_model_release_grads(m); /* the next rollout phase does not hold them (the next pass makes them) */
    if (!st && old_from_pass) mismatch_stats(s, logp_old, T, plen, sum, mx); /* filled by the pass */
    if (!st) {
        sum[S_ZERO_GROUPS] = (double)zero_groups;
        local_stats(s, &pc, sum, mx);
        mx[X_TRAIN_S] = now_s() - t0;
        st = fp4rl_dist_sum_f64(ctx, sum, S_COUNT);
        if (!st) st = fp4rl_dist_max_f64(ctx, mx, X_COUNT);
    }
    if (!st) {
        set_metrics(s, sum, mx, gn_sum, updates, dist, last_lr);
        s->steps++;
        clear_rollout(s);
        /* the update is applied: a failing metrics append does not fail the step; it is
         * reported by the metric "io/metrics_write_error" (1) and fp4rl_last_error() */
        s->metrics[M_METRICS_WRITE_ERROR] = 0;
        s->metrics[M_METRICS_WRITE_ERROR] = append_metrics_line(s) != FP4RL_OK;
    }
    free(adv);
    free(tokens);
    free(lengths);
    free(plen);
    free(logp_old);
    free(logp_ref);
    return st;
}

fp4rl_status fp4rl_rl_session_train(fp4rl_rl_session *s)
{
    const char *fn = "fp4rl_rl_session_train";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (!s->have_rollout || !s->have_rewards)
        st = fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: needs a rollout and its rewards first (fp4rl_rl_session_rollout, fp4rl_rl_session_set_rewards)", fn);
    return train_impl(s, st, fn);
}

fp4rl_status fp4rl_rl_session_step(fp4rl_rl_session *s, const int32_t *prompts, const size_t *offsets, size_t n_prompts,
                                   fp4rl_reward_fn reward_fn, void *user)
{
    const char *fn = "fp4rl_rl_session_step";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (!reward_fn) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: reward_fn is NULL", fn);
    /* in a distributed context a failure before training still goes through train_impl, where
     * every rank learns of it */
    const int dist = fp4rl_dist_active(s->model->ctx);
    if ((st = do_rollout(s, prompts, offsets, n_prompts, fn)) && !dist) return st;
    const size_t n = st ? 0 : (size_t)s->ro.n_seqs, G = (size_t)s->hp[FP4RL_RL_GROUP_SIZE];
    double *r = st ? NULL : malloc((n ? n : 1) * sizeof *r);
    if (!st && !r) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (size_t i = 0; !st && i < n; i++) {
        const size_t p = i / G;
        r[i] = NAN;
        int rc = reward_fn(user, s->prompt0 + p, s->prompts + s->offsets[p], s->offsets[p + 1] - s->offsets[p],
                           s->ro.tokens + i * (size_t)s->ro.max_new, (size_t)s->ro.lengths[i], &r[i]);
        if (rc != 0 || !isfinite(r[i]))
            st = rc != 0 ? fp4rl_fail(FP4RL_ERR_CALLBACK, "%s: the reward callback returned %d for completion %zu (prompt %zu, %lld tokens); the step was abandoned, the model is unchanged",
                                      fn, rc, i, s->prompt0 + p, (long long)s->ro.lengths[i])
                         : fp4rl_fail(FP4RL_ERR_CALLBACK, "%s: the reward callback gave %g for completion %zu (prompt %zu, %lld tokens); rewards must be finite; the step was abandoned, the model is unchanged",
                                      fn, r[i], i, s->prompt0 + p, (long long)s->ro.lengths[i]);
    }
    if (!st) st = fp4rl_rl_session_set_rewards(s, r, n);
    free(r);
    st = train_impl(s, st, fn);
    if (st) clear_rollout(s);
    return st;
}

/* ---- metrics ---- */
const char *fp4rl_rl_session_metric_name(size_t i) { return i < M_COUNT ? metric_names[i] : NULL; }

fp4rl_status fp4rl_rl_session_metric(const fp4rl_rl_session *s, const char *name, double *value)
{
    const char *fn = "fp4rl_rl_session_metric";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (!name || !value) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: name or value is NULL", fn);
    for (int i = 0; i < M_COUNT; i++)
        if (strcmp(name, metric_names[i]) == 0) {
            *value = s->metrics[i];
            return FP4RL_OK;
        }
    return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: no metric \"%s\" (see fp4rl_rl_session_metric_name)", fn, name);
}

fp4rl_status fp4rl_rl_session_step_count(const fp4rl_rl_session *s, int64_t *steps)
{
    fp4rl_status st = check_session(s, "fp4rl_rl_session_step_count");
    if (st) return st;
    if (!steps) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_rl_session_step_count: steps is NULL");
    *steps = s->steps;
    return FP4RL_OK;
}

/* The JSON object of the last step's metrics; returns the length it needs (without the NUL). */
static size_t metrics_json(const fp4rl_rl_session *s, char *buf, size_t cap)
{
    size_t used = (size_t)snprintf(buf, cap, "{\"step\": %lld", (long long)s->steps);
    for (int i = 0; i < M_COUNT; i++) {
        const double v = s->metrics[i];
        used += (size_t)snprintf(used < cap ? buf + used : NULL, used < cap ? cap - used : 0,
                                 isfinite(v) ? ", \"%s\": %.17g" : ", \"%s\": null", metric_names[i], v);
    }
    used += (size_t)snprintf(used < cap ? buf + used : NULL, used < cap ? cap - used : 0, "}");
    return used;
}

fp4rl_status fp4rl_rl_session_metrics_json(const fp4rl_rl_session *s, char *buf, size_t buf_size, size_t *needed)
{
    const char *fn = "fp4rl_rl_session_metrics_json";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (!buf && buf_size) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: buf is NULL", fn);
    const size_t need = metrics_json(s, NULL, 0) + 1;
    if (needed) *needed = need;
    if (buf_size < need) return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: the JSON needs %zu bytes; buf holds %zu", fn, need, buf_size);
    metrics_json(s, buf, buf_size);
    return FP4RL_OK;
}

fp4rl_status fp4rl_rl_session_set_metrics_file(fp4rl_rl_session *s, const char *path)
{
    const char *fn = "fp4rl_rl_session_set_metrics_file";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    char *copy = NULL;
    if (path) {
        FILE *f = fopen(path, "a");
        if (!f) return fp4rl_fail(FP4RL_ERR_IO, "%s: cannot open %s for appending", fn, path);
        fclose(f);
        copy = malloc(strlen(path) + 1);
        if (!copy) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        strcpy(copy, path);
    }
    free(s->metrics_path);
    s->metrics_path = copy;
    return FP4RL_OK;
}

static fp4rl_status append_metrics_line(const fp4rl_rl_session *s)
{
    if (!s->metrics_path) return FP4RL_OK;
    const size_t need = metrics_json(s, NULL, 0) + 1;
    char *line = malloc(need);
    if (!line) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "metrics: out of memory");
    metrics_json(s, line, need);
    FILE *f = fopen(s->metrics_path, "a");
    int ok = f && fprintf(f, "%s\n", line) > 0;
    if (f && fclose(f) != 0) ok = 0;
    free(line);
    return ok ? FP4RL_OK : fp4rl_fail(FP4RL_ERR_IO, "fp4rl_rl_session_step: the step completed, but appending its metrics to %s failed (metric io/metrics_write_error = 1)", s->metrics_path);
}

fp4rl_status fp4rl_rl_session_save(const fp4rl_rl_session *s, const char *dir)
{
    const char *fn = "fp4rl_rl_session_save";
    fp4rl_status st = check_session(s, fn);
    if (st) return st;
    if (!dir) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: dir is NULL", fn);
    if (!fp4rl_dist_active(s->model->ctx)) return fp4rl_session_save(s, dir);
    /* the ranks' states are identical: rank 0 writes, and every rank learns whether it did */
    st = s->model->ctx->rank == 0 ? fp4rl_session_save(s, dir) : FP4RL_OK;
    return fp4rl_dist_agree(s->model->ctx, st, fn);
}

fp4rl_status fp4rl_rl_session_load(fp4rl_rl_session *s, const char *dir)
{
    fp4rl_status st = check_session(s, "fp4rl_rl_session_load");
    if (st) return st;
    if (!dir) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_rl_session_load: dir is NULL");
    return fp4rl_session_load(s, dir);
}
