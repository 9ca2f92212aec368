/*
 * model_view.c - fp4rl_model_param_tensor: a dense tensor that is a view (no copy) of one master
 * weight. The view retains the model's weight buffer (core/tensor/tensor_wrap.c), so the model
 * may be destroyed first: the buffer then goes with the last view.
 */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* ---- views of a model's master weights ---- */
fp4rl_status fp4rl_model_param_tensor(fp4rl_model *m, const char *name, fp4rl_tensor **out)
{
    const char *fn = "fp4rl_model_param_tensor";
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (!m) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(m->ctx, fn);
    if (st) return st;
    if (!name) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: name is NULL", fn);
    const fp4rl_param *p = NULL;
    for (int i = 0; i < m->n_params && !p; i++)
        if (strcmp(m->params[i].name, name) == 0) p = &m->params[i];
    if (!p) {
        if (m->cfg.tie_word_embeddings && strcmp(name, "lm_head.weight") == 0)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: this model ties lm_head.weight to model.embed_tokens.weight; use that name", fn);
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the model has no parameter \"%s\" (HF names, e.g. model.layers.0.self_attn.q_proj.weight)", fn, name);
    }
    fp4rl_tensor *t = calloc(1, sizeof *t);
    if (!t) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if ((st = fp4rl_block_retain(m->ctx, m->w))) {
        free(t);
        return st;
    }
    t->ctx = m->ctx;
    t->dtype = FP4RL_DTYPE_F32;
    t->ndim = p->ndim;
    for (int i = 0; i < p->ndim; i++) t->dims[i] = p->dims[i];
    t->numel = p->numel;
    t->data = m->w + p->offset;
    t->data_bytes = (size_t)p->numel * sizeof(float);
    t->tensor_scale = 1.0f;
    t->storage = FP4RL_STORAGE_VIEW;
    t->retained = m->w;
    *out = t;
    return FP4RL_OK;
}
