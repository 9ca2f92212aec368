/* model.c - fp4rl_model: creation from an HF config, parameters, weights I/O, AdamW steps. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/formats.h"
#include "backend/adamw_math.h"
#include "backend/init_math.h"
#include "model/model.h"
#include "io/safetensors.h"

static const char *const layer_names[FP4RL_LP_COUNT] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
    "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
};

static void add_param(fp4rl_model *m, const char *name, int64_t d0, int64_t d1)
{
    fp4rl_param *p = &m->params[m->n_params++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = d1 ? 2 : 1;
    p->dims[0] = d0;
    p->dims[1] = d1;
    p->numel = d1 ? d0 * d1 : d0;
    p->offset = m->total;
    p->is_norm = strstr(name, "norm") != NULL;
    p->is_bias = strstr(name, ".bias") != NULL;
    m->total += p->numel;
}

static void layout_params(fp4rl_model *m)
{
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t C = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    const int64_t q = c->num_attention_heads * D, kv = c->num_key_value_heads * D;
    char name[96];
    add_param(m, "model.embed_tokens.weight", c->vocab_size, C);
    for (int64_t l = 0; l < c->num_hidden_layers; l++) {
        const int64_t shapes[FP4RL_LP_COUNT][2] = {{C, 0}, {q, C}, {q, 0}, {kv, C}, {kv, 0}, {kv, C}, {kv, 0},
                                                   {C, q}, {C, 0}, {I, C}, {I, C}, {C, I}};
        for (int k = 0; k < FP4RL_LP_COUNT; k++) {
            snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, layer_names[k]);
            add_param(m, name, shapes[k][0], shapes[k][1]);
        }
    }
    add_param(m, "model.norm.weight", C, 0);
    if (!c->tie_word_embeddings) add_param(m, "lm_head.weight", c->vocab_size, C);
}

/* HF's init: normal(0, 0.02) for weights, zero biases, unit norms; element k of the buffer is
 * init_math.h's function of (seed, k), so any split gives the same bits on every backend. */
static void init_range(const fp4rl_model *m, float *dst, int64_t begin, int64_t end, uint64_t seed)
{
    for (int i = 0; i < m->n_params; i++) {
        const fp4rl_param *p = &m->params[i];
        const int64_t lo = p->offset > begin ? p->offset : begin;
        const int64_t hi = p->offset + p->numel < end ? p->offset + p->numel : end;
        if (lo >= hi) continue;
        if (p->is_norm || p->is_bias) {
            for (int64_t k = lo; k < hi; k++) dst[k - begin] = p->is_norm ? 1.0f : 0.0f;
            continue;
        }
        for (int64_t j = (lo - p->offset) & ~(int64_t)1; p->offset + j < hi; j += 2) {
            const int64_t k = p->offset + j; /* pairs start at even positions inside the parameter */
            float a, b;
            fp4rl_init_normal_pair(seed, (uint64_t)k, &a, &b);
            if (k >= lo) dst[k - begin] = a;
            if (k + 1 < hi) dst[k + 1 - begin] = b;
        }
    }
}

typedef struct init_job { const fp4rl_model *m; float *dst; int64_t begin, end; uint64_t seed; } init_job;
static void *init_thread(void *arg)
{
    const init_job *j = arg;
    init_range(j->m, j->dst, j->begin, j->end, j->seed);
    return NULL;
}

/* dst[0 .. end - begin) = the initial values of [begin, end), on up to 32 host threads. */
static void init_parallel(const fp4rl_model *m, float *dst, int64_t begin, int64_t end, uint64_t seed)
{
    enum { MAX_THREADS = 32 };
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int T = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
    if (end - begin < ((int64_t)1 << 20)) T = 1;
    pthread_t th[MAX_THREADS];
    init_job jobs[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 0; t < T; t++) {
        jobs[t] = (init_job){m, dst + (end - begin) * t / T, begin + (end - begin) * t / T,
                             begin + (end - begin) * (t + 1) / T, seed};
        started[t] = t > 0 && pthread_create(&th[t], NULL, init_thread, &jobs[t]) == 0;
    }
    for (int t = 0; t < T; t++)
        if (!started[t]) init_thread(&jobs[t]); /* thread 0, and any thread that could not start */
    for (int t = 1; t < T; t++)
        if (started[t]) pthread_join(th[t], NULL);
}

/* The initial weights into m->w: in place on the host threads on the CPU; on a device with the
 * init_normal op, generated there (the same bits), with the norms' ones uploaded; else through a
 * bounded host staging buffer (no second full copy of the weights in host memory). */
static fp4rl_status init_weights(fp4rl_model *m, uint64_t seed, const char *fn)
{
    fp4rl_context *ctx = m->ctx;
    if (ctx->device == FP4RL_DEVICE_CPU) {
        init_parallel(m, m->w, 0, m->total, seed);
        return FP4RL_OK;
    }
    fp4rl_status st = FP4RL_OK;
    if (m->ops->init_normal) {
        st = ctx->be->memset0(ctx, m->w, (size_t)m->total * sizeof(float));
        float *ones = NULL;
        for (int i = 0; i < m->n_params && !st; i++) {
            const fp4rl_param *p = &m->params[i];
            if (!p->is_norm && !p->is_bias) {
                st = m->ops->init_normal(ctx, m->w + p->offset, p->offset, p->numel, seed);
            } else if (p->is_norm) { /* biases stay zero */
                float *o = realloc(ones, (size_t)p->numel * sizeof(float));
                if (!o) {
                    st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
                    break;
                }
                ones = o;
                for (int64_t k = 0; k < p->numel; k++) ones[k] = 1.0f;
                st = ctx->be->upload(ctx, m->w + p->offset, ones, (size_t)p->numel * sizeof(float));
            }
        }
        free(ones);
        return st;
    }
    const int64_t chunk = m->total < ((int64_t)64 << 20) ? m->total : ((int64_t)64 << 20); /* 256 MB */
    float *host = malloc((size_t)chunk * sizeof(float));
    if (!host) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory for the weights' staging buffer", fn);
    for (int64_t b = 0; b < m->total && !st; b += chunk) {
        const int64_t e = b + chunk < m->total ? b + chunk : m->total;
        init_parallel(m, host, b, e, seed);
        st = ctx->be->upload(ctx, m->w + b, host, (size_t)(e - b) * sizeof(float));
    }
    free(host);
    return st;
}

static const double hp_defaults[FP4RL_MP_COUNT] = {1e-4, 0.0, 0.9, 0.999, 1e-8, 0.0, 0.0, 0.0, 0.0};

void fp4rl_model_destroy(fp4rl_model *m)
{
    if (!m) return;
    fp4rl_context *ctx = m->ctx;
    void *bufs[5] = {m->w, m->g, m->adam_m, m->adam_v, m->scalar};
    for (int i = 0; i < 5; i++)
        if (bufs[i]) ctx->be->free(ctx, bufs[i]);
    fp4rl_quant_policy_destroy(m->policy);
    free(m->params);
    free(m);
}

fp4rl_status fp4rl_model_create(fp4rl_model **out, fp4rl_context *ctx, const char *config_json,
                                const fp4rl_quant_policy *policy, uint64_t seed)
{
    return fp4rl_model_create_ex(out, ctx, config_json, policy, seed, 1, "fp4rl_model_create");
}

fp4rl_status fp4rl_model_create_ex(fp4rl_model **out, fp4rl_context *ctx, const char *config_json,
                                   const fp4rl_quant_policy *policy, uint64_t seed, int random_init, const char *fn)
{
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (st) return st;
    if (!config_json) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: config_json is NULL", fn);
    if (!ctx->ops)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: the %s backend has no transformer op table yet; use a CPU context for the model",
                          fn, ctx->be->name);
    fp4rl_model *m = calloc(1, sizeof *m);
    if (!m) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    m->ctx = ctx;
    m->ops = ctx->ops;
    memcpy(m->hp, hp_defaults, sizeof m->hp);
    st = fp4rl_hf_config_parse(&m->cfg, config_json, strlen(config_json));
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", fp4rl_last_error());
        st = fp4rl_fail(st, "%s: config.json: %s", fn, msg);
    }
    if (!st) st = fp4rl_policy_copy(&m->policy, policy);
    if (!st) {
        m->params = calloc((size_t)(3 + m->cfg.num_hidden_layers * FP4RL_LP_COUNT), sizeof *m->params);
        if (!m->params) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    if (st) {
        fp4rl_model_destroy(m);
        return st;
    }
    layout_params(m);
    const size_t bytes = (size_t)m->total * sizeof(float);
    st = ctx->be->alloc(ctx, (void **)&m->w, bytes);
    /* the AdamW moments: made by the first update (fp4rl_model_moments_ensure) */
    if (!st) st = ctx->be->alloc(ctx, (void **)&m->scalar, 4 * sizeof(float));
    /* weights that a load overwrites next (from_pretrained) are only zeroed */
    if (!st) st = random_init ? init_weights(m, seed, fn) : ctx->be->memset0(ctx, m->w, bytes);
    if (st) {
        fp4rl_model_destroy(m);
        return st;
    }
    *out = m;
    return FP4RL_OK;
}

static fp4rl_status check_model(const fp4rl_model *m, const char *fn)
{
    if (!m) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
    return fp4rl_check_ctx(m->ctx, fn);
}

fp4rl_status fp4rl_model_set_policy(fp4rl_model *m, const fp4rl_quant_policy *policy)
{
    fp4rl_status st = check_model(m, "fp4rl_model_set_policy");
    if (st) return st;
    fp4rl_quant_policy *p;
    st = fp4rl_policy_copy(&p, policy);
    if (st) return st;
    fp4rl_quant_policy_destroy(m->policy);
    m->policy = p;
    return FP4RL_OK;
}

static const char *const hp_names[FP4RL_MP_COUNT] = {"lr", "weight_decay", "beta1", "beta2", "adam_eps", "grad_clip",
                                                           "microbatch_tokens", "recompute", "optimizer_moments"};
const char *fp4rl_model_hparam_name(int p) { return p >= 0 && p < FP4RL_MP_COUNT ? hp_names[p] : "?"; }

/* The one definition of the model hyper-parameters' bounds (setter and checkpoint loader). */
const char *fp4rl_model_hparam_allowed(int p, double v)
{
    switch ((fp4rl_mparam)p) {
    case FP4RL_MP_LR: return v > 0 && v <= 1 ? NULL : "(0, 1]";
    case FP4RL_MP_WEIGHT_DECAY: return v >= 0 && v <= 1 ? NULL : "[0, 1]";
    case FP4RL_MP_ADAM_EPS: return v > 0 && v <= 1 ? NULL : "(0, 1]";
    case FP4RL_MP_BETA1: case FP4RL_MP_BETA2: return v >= 0 && v < 1 ? NULL : "[0, 1)";
    case FP4RL_MP_MICROBATCH_TOKENS: return v == floor(v) && v >= 0 && v <= 1099511627776.0 ? NULL : "0 (automatic) or an integer up to 2^40";
    case FP4RL_MP_RECOMPUTE: return v == 0 || v == 1 ? NULL : "0 (when memory requires it) or 1 (always)";
    case FP4RL_MP_OPTIMIZER_MOMENTS: return v == 0 || v == 1 ? NULL : "0 (FP32 moments) or 1 (BF16 moments, stochastic rounding)";
    default: return v >= 0 && isfinite(v) ? NULL : ">= 0"; /* grad_clip */
    }
}

fp4rl_status fp4rl_model_set_hparam(fp4rl_model *m, fp4rl_mparam param, double v)
{
    const char *fn = "fp4rl_model_set_hparam";
    fp4rl_status st = check_model(m, fn);
    if (st) return st;
    if ((int)param < 0 || (int)param >= FP4RL_MP_COUNT)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: unknown parameter %d (0 .. %d)", fn, (int)param, FP4RL_MP_COUNT - 1);
    const char *allowed = fp4rl_model_hparam_allowed((int)param, v);
    if (allowed) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %s = %g is out of range; allowed: %s", fn, fp4rl_model_hparam_name((int)param), v, allowed);
    /* the moments the model holds are converted to the new storage (it sets the parameter) */
    if (param == FP4RL_MP_OPTIMIZER_MOMENTS) return fp4rl_model_convert_moments(m, v != 0);
    m->hp[param] = v;
    return FP4RL_OK;
}

fp4rl_status fp4rl_model_get_hparam(const fp4rl_model *m, fp4rl_mparam param, double *v)
{
    const char *fn = "fp4rl_model_get_hparam";
    fp4rl_status st = check_model(m, fn);
    if (st) return st;
    if (!v || (int)param < 0 || (int)param >= FP4RL_MP_COUNT)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: value is NULL or parameter %d unknown (0 .. %d)", fn, (int)param, FP4RL_MP_COUNT - 1);
    *v = m->hp[param];
    return FP4RL_OK;
}

fp4rl_status fp4rl_model_get_info(const fp4rl_model *m, fp4rl_model_info key, int64_t *value)
{
    const char *fn = "fp4rl_model_get_info";
    fp4rl_status st = check_model(m, fn);
    if (st) return st;
    if (!value) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: value is NULL", fn);
    const fp4rl_hf_config *c = &m->cfg;
    switch (key) {
    case FP4RL_MI_VOCAB_SIZE: *value = c->vocab_size; break;
    case FP4RL_MI_HIDDEN_SIZE: *value = c->hidden_size; break;
    case FP4RL_MI_INTERMEDIATE_SIZE: *value = c->intermediate_size; break;
    case FP4RL_MI_NUM_LAYERS: *value = c->num_hidden_layers; break;
    case FP4RL_MI_NUM_HEADS: *value = c->num_attention_heads; break;
    case FP4RL_MI_NUM_KV_HEADS: *value = c->num_key_value_heads; break;
    case FP4RL_MI_HEAD_DIM: *value = c->head_dim; break;
    case FP4RL_MI_MAX_POSITIONS: *value = c->max_position_embeddings; break;
    case FP4RL_MI_TIED_EMBEDDINGS: *value = c->tie_word_embeddings; break;
    case FP4RL_MI_NUM_PARAMETERS: *value = m->total; break;
    case FP4RL_MI_STEP: *value = m->step; break;
    case FP4RL_MI_NUM_TENSORS: *value = m->n_params; break;
    default: return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: unknown key %d (0 .. 11)", fn, (int)key);
    }
    return FP4RL_OK;
}

const char *fp4rl_model_param_name(const fp4rl_model *m, size_t i)
{
    if (check_model(m, "fp4rl_model_param_name") || i >= (size_t)m->n_params) return NULL;
    return m->params[i].name;
}

static const fp4rl_param *find_param(const fp4rl_model *m, const char *name)
{
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

/* Validates (model, name, buffer) for the per-parameter accessors. */
static fp4rl_status param_access(const fp4rl_model *m, const char *name, const void *buf, size_t bytes,
                                 const fp4rl_param **p, const char *fn)
{
    fp4rl_status st = check_model(m, fn);
    if (st) return st;
    if (!name || !buf) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: name or buffer is NULL", fn);
    *p = find_param(m, name);
    if (!*p) {
        if (m->cfg.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: this model ties lm_head.weight to model.embed_tokens.weight; use that name", fn);
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the model has no parameter \"%s\" (HF names, e.g. model.layers.0.self_attn.q_proj.weight)", fn, name);
    }
    if (bytes != (size_t)(*p)->numel * sizeof(float))
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: %s has %lld floats (%zu bytes); the buffer has %zu bytes", fn, name,
                          (long long)(*p)->numel, (size_t)(*p)->numel * sizeof(float), bytes);
    return FP4RL_OK;
}

fp4rl_status fp4rl_model_param_shape(const fp4rl_model *m, const char *name, int *ndim, int64_t *dims)
{
    const char *fn = "fp4rl_model_param_shape";
    const fp4rl_param *p;
    fp4rl_status st = param_access(m, name, dims, 0, &p, fn);
    if (st == FP4RL_ERR_SHAPE) st = FP4RL_OK; /* no buffer size to check here */
    if (st) return st;
    if (ndim) *ndim = p->ndim;
    dims[0] = p->dims[0];
    dims[1] = p->ndim == 2 ? p->dims[1] : 0;
    return FP4RL_OK;
}

fp4rl_status fp4rl_model_get_param(const fp4rl_model *m, const char *name, float *dst, size_t bytes)
{
    const fp4rl_param *p;
    fp4rl_status st = param_access(m, name, dst, bytes, &p, "fp4rl_model_get_param");
    return st ? st : m->ctx->be->download(m->ctx, dst, m->w + p->offset, bytes);
}

fp4rl_status fp4rl_model_get_grad(const fp4rl_model *m, const char *name, float *dst, size_t bytes)
{
    const fp4rl_param *p;
    fp4rl_status st = param_access(m, name, dst, bytes, &p, "fp4rl_model_get_grad");
    if (!st && !m->g) { /* released (or never made): no gradient is held, which reads as zeros */
        memset(dst, 0, bytes);
        return FP4RL_OK;
    }
    return st ? st : m->ctx->be->download(m->ctx, dst, m->g + p->offset, bytes);
}

fp4rl_status fp4rl_model_grads(fp4rl_model *m)
{
    if (m->g) return FP4RL_OK;
    const size_t bytes = (size_t)m->total * sizeof(float);
    fp4rl_status st = m->ctx->be->alloc(m->ctx, (void **)&m->g, bytes);
    if (!st) st = m->ctx->be->memset0(m->ctx, m->g, bytes);
    if (st && m->g) fp4rl_model_release_grads(m);
    return st;
}

void fp4rl_model_release_grads(fp4rl_model *m)
{
    if (!m->g) return;
    m->ctx->be->free(m->ctx, m->g);
    m->g = NULL;
}

fp4rl_status fp4rl_model_set_param(fp4rl_model *m, const char *name, const float *src, size_t bytes)
{
    const fp4rl_param *p;
    fp4rl_status st = param_access(m, name, src, bytes, &p, "fp4rl_model_set_param");
    return st ? st : m->ctx->be->upload(m->ctx, m->w + p->offset, src, bytes);
}

/* fp4rl_model_load and fp4rl_model_from_pretrained: core/model/model_hf.c */

fp4rl_status fp4rl_model_save(const fp4rl_model *m, const char *path, fp4rl_dtype dtype)
{
    const char *fn = "fp4rl_model_save";
    fp4rl_status st = check_model(m, fn);
    if (st) return st;
    if (!path) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: path is NULL", fn);
    if (dtype != FP4RL_DTYPE_F32 && dtype != FP4RL_DTYPE_BF16)
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: weights are saved as f32 or bf16, not %s", fn, fp4rl_dtype_name(dtype));
    const size_t bytes = (size_t)m->total * sizeof(float);
    float *host = malloc(bytes);
    fp4rl_st_write_entry *e = calloc((size_t)m->n_params, sizeof *e);
    if (!host || !e) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if (!st) st = m->ctx->be->download(m->ctx, host, m->w, bytes);
    if (!st) {
        for (int i = 0; i < m->n_params; i++) {
            const fp4rl_param *p = &m->params[i];
            e[i] = (fp4rl_st_write_entry){p->name, FP4RL_DTYPE_F32, p->ndim, p->dims, host + p->offset, dtype == FP4RL_DTYPE_BF16};
        }
        const fp4rl_st_kv meta[1] = {{"format", "pt"}};
        st = fp4rl_st_write_path(path, e, (size_t)m->n_params, meta, 1);
        if (st) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", fp4rl_last_error());
            st = fp4rl_fail(st, "%s: %s", fn, msg);
        }
    }
    free(host);
    free(e);
    return st;
}

fp4rl_status fp4rl_model_compute_gradients(fp4rl_model *m, const int32_t *tokens, const int32_t *lengths,
                                           const float *loss_mask, int64_t B, int64_t T, double *loss)
{
    const char *fn = "fp4rl_model_compute_gradients";
    fp4rl_status st = check_model(m, fn);
    return st ? st
              : fp4rl_model_pass(m, &(fp4rl_pass){.tokens = tokens, .lengths = lengths, .loss_mask = loss_mask, .B = B, .T = T,
                                                  .backward = 1, .loss = loss,
                                                  .micro_tokens = (int64_t)m->hp[FP4RL_MP_MICROBATCH_TOKENS], .fn = fn});
}

fp4rl_status fp4rl_model_update(fp4rl_model *m, double lr, double weight_decay, double clip, double *grad_norm)
{
    fp4rl_context *ctx = m->ctx;
    float norm = 0;
    fp4rl_status st = fp4rl_model_grads(m); /* none held: a zero gradient (weight decay alone) */
    if (!st) st = m->ops->grad_norm(ctx, m->scalar + 1, m->g, m->total);
    /* a non-finite gradient stops the update before anything changes */
    if (!st) st = ctx->be->download(ctx, &norm, m->scalar + 1, sizeof norm);
    if (!st && !isfinite(norm))
        st = fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_model_update: the gradient norm is %g, not finite; the update was not applied (weights and optimizer state unchanged)", (double)norm);
    if (!st && clip > 0) st = m->ops->grad_clip(ctx, m->g, m->total, m->scalar + 1, (float)clip);
    /* the dry run: an update that would leave a weight or a moment non-finite (an absurd learning
     * rate or weight decay, a weight near the float range) is refused before anything changes */
    if (!st) st = fp4rl_model_moments_ensure(m);
    float bad = 0;
    const double b1 = m->hp[FP4RL_MP_BETA1], b2 = m->hp[FP4RL_MP_BETA2], eps = m->hp[FP4RL_MP_ADAM_EPS];
    const int64_t t = m->step + 1;
    /* BF16 moments: stochastic rounding from uniforms of (step, element) alone (core/backend/adamw_math.h) */
    const int bf16 = fp4rl_model_moments_bf16(m);
    const uint64_t sr_seed = FP4RL_ADAMW_SR_SEED, sr_offset = FP4RL_ADAMW_SR_OFFSET(t);
    if (!st && bf16)
        st = m->ops->adamw_check_bf16(ctx, m->scalar + 3, m->w, m->g, m->adam_m, m->adam_v, m->total, lr, b1, b2, eps,
                                      weight_decay, t, sr_seed, sr_offset);
    else if (!st)
        st = m->ops->adamw_check(ctx, m->scalar + 3, m->w, m->g, m->adam_m, m->adam_v, m->total, lr, b1, b2, eps, weight_decay, t);
    if (!st) st = ctx->be->download(ctx, &bad, m->scalar + 3, sizeof bad);
    if (!st && bad != 0)
        st = fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT,
                        "fp4rl_model_update: the AdamW update (lr %g, weight_decay %g) would make weights or optimizer moments "
                        "non-finite; it was not applied (weights and optimizer state unchanged)", lr, weight_decay);
    if (!st && bf16)
        st = m->ops->adamw_update_bf16(ctx, m->w, m->g, m->adam_m, m->adam_v, m->total, lr, b1, b2, eps, weight_decay, t,
                                       sr_seed, sr_offset);
    else if (!st)
        st = m->ops->adamw_update(ctx, m->w, m->g, m->adam_m, m->adam_v, m->total, lr, b1, b2, eps, weight_decay, t);
    if (st) return st;
    m->step++;
    if (grad_norm) *grad_norm = norm;
    return FP4RL_OK;
}

fp4rl_status fp4rl_model_train_step(fp4rl_model *m, const int32_t *tokens, const int32_t *lengths, const float *loss_mask,
                                    int64_t B, int64_t T, double *loss, double *grad_norm)
{
    const char *fn = "fp4rl_model_train_step";
    fp4rl_status st = check_model(m, fn);
    double l = 0;
    if (!st)
        st = fp4rl_model_pass(m, &(fp4rl_pass){.tokens = tokens, .lengths = lengths, .loss_mask = loss_mask, .B = B, .T = T,
                                               .backward = 1, .loss = &l,
                                               .micro_tokens = (int64_t)m->hp[FP4RL_MP_MICROBATCH_TOKENS], .fn = fn});
    if (!st && !isfinite(l))
        st = fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the loss is %g, not finite; the update was not applied", fn, l);
    if (!st) st = fp4rl_model_update(m, m->hp[FP4RL_MP_LR], m->hp[FP4RL_MP_WEIGHT_DECAY], m->hp[FP4RL_MP_GRAD_CLIP], grad_norm);
    if (!st && loss) *loss = l;
    return st;
}
