/* quant.c - the quantize / dequantize / transpose entry points: validation, then the backend. */
#include <string.h>

#include "format/traits.h"
#include "runtime/internal.h"

fp4rl_status fp4rl_quantize(fp4rl_tensor **out, fp4rl_context *ctx, const fp4rl_tensor *src, fp4rl_dtype format,
                            const fp4rl_quant_policy *policy, fp4rl_role role)
{
    const char *fn = "fp4rl_quantize";
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (!st) st = fp4rl_check_tensor(src, fn, "src");
    if (st) return st;
    if (src->ctx != ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: src belongs to another context", fn);
    if (src->dtype != FP4RL_DTYPE_F32 && src->dtype != FP4RL_DTYPE_BF16)
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: src is %s; quantize takes f32 or bf16", fn, fp4rl_dtype_name(src->dtype));
    if (!fp4rl_dtype_is_quantized(format))
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: format %s (%d) is not a quantized format (%s)", fn,
                          fp4rl_dtype_name(format), (int)format, fp4rl_format_list_str());
    fp4rl_qparams p;
    st = fp4rl_policy_resolve(policy, format, role, ctx, &p, fn);
    if (st) return st;
    int64_t rows, cols;
    fp4rl_rows_cols(src->ndim, src->dims, &rows, &cols);
    fp4rl_qdesc d;
    if (!fp4rl_qdesc_make(&d, format, rows, cols, p.tile)) return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: the layout's size overflows", fn);
    fp4rl_tensor *q;
    st = fp4rl_tensor_alloc(&q, ctx, format, src->ndim, src->dims, &d, fn);
    if (st) return st;
    st = ctx->be->quantize(ctx, q, src, &p);
    if (st) {
        fp4rl_tensor_destroy(q);
        return st;
    }
    if (p.stochastic) ctx->rng_offset++;
    *out = q;
    return FP4RL_OK;
}

fp4rl_status fp4rl_dequantize(fp4rl_tensor **out, fp4rl_context *ctx, const fp4rl_tensor *q, fp4rl_dtype dtype)
{
    const char *fn = "fp4rl_dequantize";
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (!st) st = fp4rl_check_tensor(q, fn, "q");
    if (st) return st;
    if (q->ctx != ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: q belongs to another context", fn);
    if (!fp4rl_dtype_is_quantized(q->dtype))
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: q is %s, not a quantized tensor", fn, fp4rl_dtype_name(q->dtype));
    if (dtype != FP4RL_DTYPE_F32 && dtype != FP4RL_DTYPE_BF16)
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: the output dtype must be f32 or bf16, got %s", fn, fp4rl_dtype_name(dtype));
    fp4rl_tensor *t;
    st = fp4rl_tensor_alloc(&t, ctx, dtype, q->ndim, q->dims, NULL, fn);
    if (st) return st;
    st = ctx->be->dequantize(ctx, t, q, 0);
    if (st) {
        fp4rl_tensor_destroy(t);
        return st;
    }
    *out = t;
    return FP4RL_OK;
}

fp4rl_status fp4rl_tensor_transpose(fp4rl_tensor **out, fp4rl_context *ctx, const fp4rl_tensor *t)
{
    const char *fn = "fp4rl_tensor_transpose";
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (!st) st = fp4rl_check_tensor(t, fn, "t");
    if (st) return st;
    if (t->ctx != ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: t belongs to another context", fn);
    if (t->ndim != 2) return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: t has %d dims; transpose takes 2", fn, t->ndim);
    const int64_t tdims[2] = {t->dims[1], t->dims[0]};
    fp4rl_qdesc d, *pd = NULL;
    if (fp4rl_dtype_is_quantized(t->dtype)) {
        if (t->q.tile == 0)
            return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: t is %s with 1D blocks along its rows; its transpose needs blocks along the columns, which only a re-quantization of the high-precision source gives (2D tiles transpose exactly)",
                              fn, fp4rl_dtype_name(t->dtype));
        fp4rl_qdesc_make(&d, t->dtype, tdims[0], tdims[1], t->q.tile);
        pd = &d;
    }
    fp4rl_tensor *o;
    st = fp4rl_tensor_alloc(&o, ctx, t->dtype, 2, tdims, pd, fn);
    if (st) return st;
    st = ctx->be->transpose(ctx, o, t);
    if (st) {
        fp4rl_tensor_destroy(o);
        return st;
    }
    *out = o;
    return FP4RL_OK;
}
