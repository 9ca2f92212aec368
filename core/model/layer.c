/*
 * layer.c - one linear layer at the ABI (fp4rl_linear_*): the model's own block linear
 * (core/model/model_linear.c) on the caller's tensors, so a framework can put fp4rl's training
 * numerics into its own layers and get exactly the gradients an fp4rl model would.
 *
 * The linear functions read four things of a model: its context, op table, policy and a test
 * flag. A layer handle holds a model struct with only those set (no weights, no config), which
 * is what makes the layer's numerics the model's by construction rather than by a copy of them.
 */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

struct fp4rl_linear {
    fp4rl_model m;           /* ctx, ops, policy: all the linear functions read */
    int is_qk;
    fp4rl_arena saved;       /* the forward's operands kept for backward */
    fp4rl_linear_saved sv;
    int have_forward;
    float *x, *w;            /* the last forward's inputs (the caller keeps them) */
    int64_t N, IN, OUT;
};

fp4rl_status fp4rl_linear_create(fp4rl_linear **out, fp4rl_context *ctx, const fp4rl_quant_policy *policy, int is_qk)
{
    const char *fn = "fp4rl_linear_create";
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (st) return st;
    if (!ctx->ops)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: the %s backend has no transformer op table", fn, ctx->be->name);
    if (is_qk != 0 && is_qk != 1) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: is_qk is %d; it must be 0 or 1", fn, is_qk);
    fp4rl_linear *l = calloc(1, sizeof *l);
    if (!l) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if ((st = fp4rl_policy_copy(&l->m.policy, policy))) { /* NULL: the default policy */
        free(l);
        return st;
    }
    l->m.ctx = ctx;
    l->m.ops = ctx->ops;
    l->is_qk = is_qk;
    l->saved.ctx = ctx;
    *out = l;
    return FP4RL_OK;
}

void fp4rl_linear_destroy(fp4rl_linear *l)
{
    if (!l) return;
    fp4rl_arena_free(&l->saved);
    fp4rl_quant_policy_destroy(l->m.policy);
    free(l);
}

/* t is a dense F32 tensor of ctx with the given rank and dims (dims[i] < 0: any) */
static fp4rl_status check_f32(const fp4rl_tensor *t, const fp4rl_context *ctx, int ndim, const int64_t *dims, const char *fn,
                              const char *what)
{
    fp4rl_status st = fp4rl_check_tensor(t, fn, what);
    if (st) return st;
    if (t->ctx != ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %s belongs to another context than the layer", fn, what);
    if (t->dtype != FP4RL_DTYPE_F32)
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: %s is %s; the layer takes dense f32", fn, what, fp4rl_dtype_name(t->dtype));
    char got[64], want[64];
    int ok = t->ndim == ndim;
    int64_t shown[2];
    for (int i = 0; i < ndim; i++) {
        shown[i] = dims[i];
        if (ok && dims[i] >= 0 && t->dims[i] != dims[i]) ok = 0;
    }
    if (!ok)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: %s is %s; it must be %s", fn, what, fp4rl_shape_str(got, sizeof got, t->ndim, t->dims),
                          fp4rl_shape_str(want, sizeof want, ndim, shown));
    return FP4RL_OK;
}

static int overlaps(const fp4rl_tensor *a, const fp4rl_tensor *b)
{
    if (!a || !b) return 0;
    const char *p = a->data, *q = b->data;
    return p < q + b->data_bytes && q < p + a->data_bytes;
}

fp4rl_status fp4rl_linear_forward(fp4rl_linear *l, fp4rl_tensor *y, const fp4rl_tensor *x, const fp4rl_tensor *w,
                                  const fp4rl_tensor *b)
{
    const char *fn = "fp4rl_linear_forward";
    if (!l) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
    fp4rl_context *ctx = l->m.ctx;
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    const int64_t any2[2] = {-1, -1};
    if (!st) st = check_f32(x, ctx, 2, any2, fn, "x");
    if (!st) st = check_f32(w, ctx, 2, any2, fn, "w");
    if (st) return st;
    const int64_t N = x->dims[0], IN = x->dims[1], OUT = w->dims[0];
    if (w->dims[1] != IN)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: x is [%lld, %lld] and w [%lld, %lld]: y = x w^T needs w's second dim = %lld", fn,
                          (long long)N, (long long)IN, (long long)OUT, (long long)w->dims[1], (long long)IN);
    const int64_t ydims[2] = {N, OUT}, bdims[1] = {OUT};
    if ((st = check_f32(y, ctx, 2, ydims, fn, "y"))) return st;
    if (b && (st = check_f32(b, ctx, 1, bdims, fn, "b"))) return st;
    if (overlaps(y, x) || overlaps(y, w) || overlaps(y, b))
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: y overlaps an input; give it its own memory", fn);
    /* the previous forward's operands go: a backward belongs to the last forward */
    fp4rl_arena_free(&l->saved);
    l->have_forward = 0;
    const fp4rl_linear_spec s = fp4rl_block_linear_spec(&l->m, l->is_qk, 0);
    st = fp4rl_lin_forward(&l->m, &l->saved, &s, &l->sv, y->data, x->data, w->data, b ? b->data : NULL, N, IN, OUT, NULL);
    if (st) {
        fp4rl_arena_free(&l->saved);
        return st;
    }
    l->x = x->data, l->w = w->data;
    l->N = N, l->IN = IN, l->OUT = OUT;
    l->have_forward = 1;
    return FP4RL_OK;
}

fp4rl_status fp4rl_linear_backward(fp4rl_linear *l, fp4rl_tensor *dx, fp4rl_tensor *dw, fp4rl_tensor *db, const fp4rl_tensor *dy)
{
    const char *fn = "fp4rl_linear_backward";
    if (!l) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: layer is NULL", fn);
    fp4rl_context *ctx = l->m.ctx;
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (st) return st;
    if (!l->have_forward) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: no forward to take the backward of", fn);
    if (!dx && !dw && !db) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: dx, dw and db are all NULL: nothing to compute", fn);
    const int64_t ydims[2] = {l->N, l->OUT}, xdims[2] = {l->N, l->IN}, wdims[2] = {l->OUT, l->IN}, bdims[1] = {l->OUT};
    if ((st = check_f32(dy, ctx, 2, ydims, fn, "dy"))) return st;
    if (dx && (st = check_f32(dx, ctx, 2, xdims, fn, "dx"))) return st;
    if (dw && (st = check_f32(dw, ctx, 2, wdims, fn, "dw"))) return st;
    if (db && (st = check_f32(db, ctx, 1, bdims, fn, "db"))) return st;
    if (overlaps(dx, dy) || overlaps(dw, dy) || overlaps(db, dy) || overlaps(dx, dw) || overlaps(dx, db) || overlaps(dw, db))
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the gradients overlap each other or dy; give each its own memory", fn);
    const fp4rl_linear_spec s = fp4rl_block_linear_spec(&l->m, l->is_qk, 0);
    fp4rl_arena t = {.ctx = ctx};
    st = fp4rl_lin_backward(&l->m, &t, &s, &l->sv, dx ? dx->data : NULL, dw ? dw->data : NULL, db ? db->data : NULL, dy->data, l->x,
                            l->w, l->N, l->IN, l->OUT);
    fp4rl_arena_free(&t);
    return st;
}
