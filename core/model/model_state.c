/*
 * model_state.c - the training state the model owns (its weights, the AdamW moments and step),
 * for callers above it: the RL session's KL reference and optimizer reset, and the session
 * checkpoint's reads and writes. They go through here so that the buffer layout (one FP32 buffer
 * of m->total floats each, params at their offsets: model.h) is known to the model alone.
 */
#include <string.h>

#include "model/model.h"

fp4rl_status fp4rl_model_reset_optimizer(fp4rl_model *m)
{
    const size_t bytes = (size_t)m->total * sizeof(float);
    fp4rl_status st = m->ctx->be->memset0(m->ctx, m->adam_m, bytes);
    if (!st) st = m->ctx->be->memset0(m->ctx, m->adam_v, bytes);
    if (!st) m->step = 0; /* AdamW's bias correction restarts with the moments */
    return st;
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
    fp4rl_status st = fp4rl_model_run_truncated(m, tokens, lengths, NULL, B, T, NULL, logprobs_out, 0, NULL, NULL,
                                                temperature, trunc, micro_tokens, fn);
    m->w = live;
    return st;
}

fp4rl_status fp4rl_model_moments_to_host(const fp4rl_model *m, float *adam_m, float *adam_v)
{
    const size_t bytes = (size_t)m->total * sizeof(float);
    fp4rl_status st = m->ctx->be->download(m->ctx, adam_m, m->adam_m, bytes);
    return st ? st : m->ctx->be->download(m->ctx, adam_v, m->adam_v, bytes);
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
    const size_t bytes = (size_t)m->total * sizeof(float);
    fp4rl_status st = m->ctx->be->upload(m->ctx, m->w, w, bytes);
    if (!st) st = m->ctx->be->upload(m->ctx, m->adam_m, adam_m, bytes);
    return st ? st : m->ctx->be->upload(m->ctx, m->adam_v, adam_v, bytes);
}

void fp4rl_model_restore_training(fp4rl_model *m, fp4rl_quant_policy *policy, const double *hp, int64_t step)
{
    fp4rl_quant_policy_destroy(m->policy);
    m->policy = policy;
    memcpy(m->hp, hp, sizeof m->hp);
    m->step = step;
}
