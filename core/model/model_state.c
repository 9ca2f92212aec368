/*
 * model_state.c - the training state the model owns (its weights, the AdamW moments and step),
 * for callers above it: the RL session's KL reference and optimizer reset, and the session
 * checkpoint's reads and writes. They go through here so that the buffer layout (one buffer of
 * m->total elements each, params at their offsets: model.h; the moments FP32 or BF16 bits,
 * FP4RL_MP_OPTIMIZER_MOMENTS) is known to the model alone.
 */
#include <stdlib.h>
#include <string.h>

#include "format/formats.h"
#include "model/model.h"

/* The moments exist from the first update on (fp4rl_model_moments_ensure): before it they are
 * zero by definition, so a model that only rolls out or evaluates never holds them, and choosing
 * their storage (FP4RL_MP_OPTIMIZER_MOMENTS) before training converts nothing. */
fp4rl_status fp4rl_model_moments_ensure(fp4rl_model *m)
{
    if (m->adam_m) return FP4RL_OK;
    const int bf16 = fp4rl_model_moments_bf16(m);
    void *am, *av;
    fp4rl_status st = fp4rl_model_moments_alloc(m, bf16, &am, &av);
    if (!st) fp4rl_model_moments_adopt(m, bf16, am, av);
    return st;
}

int fp4rl_model_moments_held(const fp4rl_model *m) { return m->adam_m != NULL; }

fp4rl_status fp4rl_model_reset_optimizer(fp4rl_model *m)
{
    /* zero moments are no moments: their memory goes back until the next update */
    fp4rl_model_moments_discard(m, m->adam_m, m->adam_v);
    m->adam_m = m->adam_v = NULL;
    m->step = 0; /* AdamW's bias correction restarts with the moments */
    return FP4RL_OK;
}

fp4rl_status fp4rl_model_copy_weights(const fp4rl_model *m, float **out)
{
    fp4rl_status st = m->ctx->be->alloc(m->ctx, (void **)out, (size_t)m->total * sizeof(float));
    return st ? st : m->ops->copy(m->ctx, *out, m->w, m->total);
}

fp4rl_status fp4rl_model_ref_logprobs(fp4rl_model *m, float *ref_w, const int32_t *tokens, const int32_t *lengths,
                                      int64_t B, int64_t T, float *logprobs_out, float temperature,
                                      const fp4rl_truncation *trunc, int64_t micro_tokens, const char *fn)
{
    /* every pass reads m->w, so the reference stands in for it for this one forward */
    float *live = m->w;
    m->w = ref_w;
    fp4rl_status st = fp4rl_model_pass(m, &(fp4rl_pass){.tokens = tokens, .lengths = lengths, .B = B, .T = T,
                                                        .logprobs_out = logprobs_out, .temperature = temperature,
                                                        .trunc = trunc, .micro_tokens = micro_tokens, .fn = fn});
    m->w = live;
    return st;
}

/* Moments move between the device and host floats in chunks of this many elements (the BF16
 * bits are staged on the host and widened or rounded there). */
#define MOMENT_CHUNK ((int64_t)1 << 20)

/* host[0 .. n) = the moment at dev (BF16 bits when bf16; widened exactly), or dev = host[0 .. n)
 * (to_device; rounded to nearest even into BF16). `bits` stages MOMENT_CHUNK BF16 values. */
static fp4rl_status moment_move(fp4rl_context *ctx, void *dev, int bf16, float *host, int64_t n, int to_device,
                                uint16_t *bits)
{
    if (!dev && !to_device) { /* moments not allocated yet: zero */
        memset(host, 0, (size_t)n * sizeof(float));
        return FP4RL_OK;
    }
    if (!bf16)
        return to_device ? ctx->be->upload(ctx, dev, host, (size_t)n * sizeof(float))
                         : ctx->be->download(ctx, host, dev, (size_t)n * sizeof(float));
    fp4rl_status st = FP4RL_OK;
    for (int64_t b = 0; !st && b < n; b += MOMENT_CHUNK) {
        const int64_t c = n - b < MOMENT_CHUNK ? n - b : MOMENT_CHUNK;
        uint16_t *d = (uint16_t *)dev + b;
        if (to_device) {
            for (int64_t i = 0; i < c; i++) bits[i] = fp4rl_f32_to_bf16(host[b + i]);
            st = ctx->be->upload(ctx, d, bits, (size_t)c * sizeof(uint16_t));
        } else {
            st = ctx->be->download(ctx, bits, d, (size_t)c * sizeof(uint16_t));
            for (int64_t i = 0; !st && i < c; i++) host[b + i] = fp4rl_bf16_to_f32(bits[i]);
        }
    }
    return st;
}

static uint16_t *staging(int bf16, const char *fn, fp4rl_status *st)
{
    uint16_t *bits = bf16 ? malloc((size_t)MOMENT_CHUNK * sizeof *bits) : NULL;
    if (bf16 && !bits) *st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    return bits;
}

fp4rl_status fp4rl_model_moments_to_host(const fp4rl_model *m, float *adam_m, float *adam_v)
{
    const int bf16 = fp4rl_model_moments_bf16(m);
    fp4rl_status st = FP4RL_OK;
    uint16_t *bits = staging(bf16, "fp4rl_model_moments_to_host", &st);
    if (!st) st = moment_move(m->ctx, m->adam_m, bf16, adam_m, m->total, 0, bits);
    if (!st) st = moment_move(m->ctx, m->adam_v, bf16, adam_v, m->total, 0, bits);
    free(bits);
    return st;
}

fp4rl_status fp4rl_model_read_weights(const fp4rl_model *m, const fp4rl_st *f, float *w)
{
    fp4rl_status st = FP4RL_OK;
    for (int i = 0; !st && i < m->n_params; i++)
        st = fp4rl_st_read_f32(f, m->params[i].name, m->params[i].ndim, m->params[i].dims, w + m->params[i].offset);
    return st;
}

fp4rl_status fp4rl_model_state_from_host(fp4rl_model *m, const float *w, const float *adam_m, const float *adam_v)
{
    const int bf16 = fp4rl_model_moments_bf16(m);
    fp4rl_status st = m->ctx->be->upload(m->ctx, m->w, w, (size_t)m->total * sizeof(float));
    uint16_t *bits = st ? NULL : staging(bf16, "fp4rl_model_state_from_host", &st);
    if (!st) st = moment_move(m->ctx, m->adam_m, bf16, (float *)adam_m, m->total, 1, bits);
    if (!st) st = moment_move(m->ctx, m->adam_v, bf16, (float *)adam_v, m->total, 1, bits);
    free(bits);
    return st;
}

fp4rl_status fp4rl_model_moments_alloc(const fp4rl_model *m, int bf16, void **adam_m, void **adam_v)
{
    const size_t bytes = fp4rl_moment_bytes(m->total, bf16);
    fp4rl_context *ctx = m->ctx;
    *adam_m = *adam_v = NULL;
    fp4rl_status st = ctx->be->alloc(ctx, adam_m, bytes);
    if (!st) st = ctx->be->alloc(ctx, adam_v, bytes);
    if (!st) st = ctx->be->memset0(ctx, *adam_m, bytes);
    if (!st) st = ctx->be->memset0(ctx, *adam_v, bytes);
    if (st) {
        fp4rl_model_moments_discard(m, *adam_m, *adam_v);
        *adam_m = *adam_v = NULL;
    }
    return st;
}

void fp4rl_model_moments_discard(const fp4rl_model *m, void *adam_m, void *adam_v)
{
    if (adam_m) m->ctx->be->free(m->ctx, adam_m);
    if (adam_v) m->ctx->be->free(m->ctx, adam_v);
}

void fp4rl_model_moments_adopt(fp4rl_model *m, int bf16, void *adam_m, void *adam_v)
{
    fp4rl_model_moments_discard(m, m->adam_m, m->adam_v);
    m->adam_m = adam_m;
    m->adam_v = adam_v;
    m->hp[FP4RL_MP_OPTIMIZER_MOMENTS] = bf16 ? 1.0 : 0.0;
}

fp4rl_status fp4rl_model_convert_moments(fp4rl_model *m, int bf16)
{
    const char *fn = "fp4rl_model_set_hparam (optimizer_moments)";
    const int from = fp4rl_model_moments_bf16(m);
    if (from == !!bf16) return FP4RL_OK;
    if (!m->adam_m) { /* nothing held yet: the first update allocates the chosen storage */
        m->hp[FP4RL_MP_OPTIMIZER_MOMENTS] = bf16 ? 1.0 : 0.0;
        return FP4RL_OK;
    }
    void *nm = NULL, *nv = NULL;
    fp4rl_status st = fp4rl_model_moments_alloc(m, bf16, &nm, &nv);
    float *chunk = st ? NULL : malloc((size_t)MOMENT_CHUNK * sizeof *chunk);
    if (!st && !chunk) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    uint16_t *bits = st ? NULL : staging(1, fn, &st);
    void *const src[2] = {m->adam_m, m->adam_v}, *const dst[2] = {nm, nv};
    for (int k = 0; k < 2; k++) /* each moment through host floats, a chunk at a time */
        for (int64_t b = 0; !st && b < m->total; b += MOMENT_CHUNK) {
            const int64_t c = m->total - b < MOMENT_CHUNK ? m->total - b : MOMENT_CHUNK;
            st = moment_move(m->ctx, (char *)src[k] + fp4rl_moment_bytes(b, from), from, chunk, c, 0, bits);
            if (!st) st = moment_move(m->ctx, (char *)dst[k] + fp4rl_moment_bytes(b, bf16), bf16, chunk, c, 1, bits);
        }
    free(chunk);
    free(bits);
    if (st) {
        fp4rl_model_moments_discard(m, nm, nv);
        return st;
    }
    fp4rl_model_moments_adopt(m, bf16, nm, nv);
    return FP4RL_OK;
}

void fp4rl_model_restore_training(fp4rl_model *m, fp4rl_quant_policy *policy, const double *hp, int64_t step)
{
    fp4rl_quant_policy_destroy(m->policy);
    m->policy = policy;
    const double moments = m->hp[FP4RL_MP_OPTIMIZER_MOMENTS]; /* what the buffers are: fp4rl_model_moments_adopt's */
    memcpy(m->hp, hp, sizeof m->hp);
    m->hp[FP4RL_MP_OPTIMIZER_MOMENTS] = moments;
    m->step = step;
}
