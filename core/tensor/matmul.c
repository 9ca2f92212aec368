/* matmul.c - C = A * B^T with dense or quantized operands: exact dequantization, FP32 GEMM. */
#include <limits.h>

#include "runtime/internal.h"

static fp4rl_status check_operand(const fp4rl_tensor *t, const fp4rl_context *ctx, const char *name)
{
    const char *fn = "fp4rl_matmul";
    fp4rl_status st = fp4rl_check_tensor(t, fn, name);
    if (st) return st;
    if (t->ctx != ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %s belongs to another context", fn, name);
    if (t->ndim != 2) return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: %s has %d dims; matmul takes 2-dim tensors", fn, name, t->ndim);
    if (t->dtype == FP4RL_DTYPE_I32 || !(fp4rl_dtype_is_dense(t->dtype) || fp4rl_dtype_is_quantized(t->dtype)))
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: %s is %s; operands are f32, bf16 or quantized", fn, name, fp4rl_dtype_name(t->dtype));
    if (t->dims[0] > INT_MAX || t->dims[1] > INT_MAX)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: %s has a dim above %d, the GEMM's limit", fn, name, INT_MAX);
    return FP4RL_OK;
}

/* An operand the GEMM can take: dense as it is, quantized dequantized to F32 without NVFP4's g. */
static fp4rl_status gemm_operand(fp4rl_context *ctx, const fp4rl_tensor *t, const fp4rl_tensor **view, fp4rl_tensor **tmp, float *g)
{
    *tmp = NULL;
    *g = 1.0f;
    if (!fp4rl_dtype_is_quantized(t->dtype)) {
        *view = t;
        return FP4RL_OK;
    }
    fp4rl_status st = fp4rl_tensor_alloc(tmp, ctx, FP4RL_DTYPE_F32, 2, t->dims, NULL, "fp4rl_matmul");
    if (!st) st = ctx->be->dequantize(ctx, *tmp, t, 1);
    if (st) {
        fp4rl_tensor_destroy(*tmp);
        *tmp = NULL;
        return st;
    }
    *g = t->tensor_scale;
    *view = *tmp;
    return FP4RL_OK;
}

fp4rl_status fp4rl_matmul(fp4rl_tensor *c, fp4rl_context *ctx, const fp4rl_tensor *a, const fp4rl_tensor *b)
{
    const char *fn = "fp4rl_matmul";
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (!st) st = check_operand(a, ctx, "A");
    if (!st) st = check_operand(b, ctx, "B");
    if (!st) st = fp4rl_check_tensor(c, fn, "C");
    if (st) return st;
    char sa[64], sb[64], sc[64];
    if (a->dims[1] != b->dims[1])
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: A is %s and B is %s: the contraction dims differ (%lld vs %lld); C = A * B^T takes A [M, K] and B [N, K]",
                          fn, fp4rl_shape_str(sa, sizeof sa, 2, a->dims), fp4rl_shape_str(sb, sizeof sb, 2, b->dims),
                          (long long)a->dims[1], (long long)b->dims[1]);
    if (c->ctx != ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: C belongs to another context", fn);
    if (c->dtype != FP4RL_DTYPE_F32 && c->dtype != FP4RL_DTYPE_BF16)
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: C is %s; it must be dense f32 or bf16", fn, fp4rl_dtype_name(c->dtype));
    if (c->ndim != 2 || c->dims[0] != a->dims[0] || c->dims[1] != b->dims[0])
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: C is %s but A %s * B^T (B %s) is [%lld, %lld]", fn,
                          fp4rl_shape_str(sc, sizeof sc, c->ndim, c->dims), fp4rl_shape_str(sa, sizeof sa, 2, a->dims),
                          fp4rl_shape_str(sb, sizeof sb, 2, b->dims), (long long)a->dims[0], (long long)b->dims[0]);
    if (ctx->be->matmul) return ctx->be->matmul(ctx, c, a, b);
    const fp4rl_tensor *va, *vb;
    fp4rl_tensor *ta = NULL, *tb = NULL;
    float ga, gb;
    st = gemm_operand(ctx, a, &va, &ta, &ga);
    if (!st) st = gemm_operand(ctx, b, &vb, &tb, &gb);
    if (!st) st = ctx->be->gemm_nt(ctx, c, va, vb, ga * gb);
    fp4rl_tensor_destroy(ta);
    fp4rl_tensor_destroy(tb);
    return st;
}
