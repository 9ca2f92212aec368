/*
 * tensor_wrap.c - zero-copy tensors across the ABI: the caller's memory wrapped as a tensor
 * (fp4rl_tensor_wrap), a dense tensor's address (fp4rl_tensor_data), the blocks that views
 * (core/model/model_view.c) keep alive, and the context's stream (fp4rl_context_set_stream).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

/* Device memory of fp4rl's own allocations is 256-byte aligned (cudaMalloc), and its kernels
 * (vector loads) and cached cuBLASLt plans (chosen for the default 256-byte alignment) rely on it;
 * wrapped device memory must be as aligned. Host code needs only the element's alignment. */
#define FP4RL_DEVICE_ALIGN 256u

/* ---- blocks kept alive by views ---- */
static fp4rl_retained_block *find_block(fp4rl_context *ctx, const void *block)
{
    for (int i = 0; i < ctx->n_retained; i++)
        if (ctx->retained[i].ptr == block) return &ctx->retained[i];
    return NULL;
}

fp4rl_status fp4rl_block_retain(fp4rl_context *ctx, void *block)
{
    fp4rl_retained_block *b = find_block(ctx, block);
    if (b) {
        b->refs++;
        return FP4RL_OK;
    }
    if (ctx->n_retained == ctx->cap_retained) {
        int ncap = ctx->cap_retained ? 2 * ctx->cap_retained : 4;
        fp4rl_retained_block *nb = realloc(ctx->retained, (size_t)ncap * sizeof *nb);
        if (!nb) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "out of host memory for the list of viewed blocks");
        ctx->retained = nb;
        ctx->cap_retained = ncap;
    }
    ctx->retained[ctx->n_retained++] = (fp4rl_retained_block){block, 1, 0};
    return FP4RL_OK;
}

void fp4rl_block_release(fp4rl_context *ctx, void *block)
{
    fp4rl_retained_block *b = find_block(ctx, block);
    if (!b || --b->refs > 0) return;
    const int pending = b->free_pending;
    *b = ctx->retained[--ctx->n_retained]; /* unordered list: move the last entry into the hole */
    if (pending) ctx->be->free(ctx, block); /* no longer listed: this free is real */
}

bool fp4rl_block_defer_free(fp4rl_context *ctx, void *block)
{
    if (!ctx->n_retained) return false; /* the common case: no views at all */
    fp4rl_retained_block *b = find_block(ctx, block);
    if (!b) return false;
    b->free_pending = 1;
    return true;
}

void fp4rl_block_list_destroy(fp4rl_context *ctx)
{
    /* Views that outlive their context break the documented rule; the blocks their owners
     * already freed are freed now rather than leaked (the views are dangling either way). */
    fp4rl_retained_block *list = ctx->retained;
    int n = ctx->n_retained;
    ctx->retained = NULL;
    ctx->n_retained = ctx->cap_retained = 0;
    for (int i = 0; i < n; i++)
        if (list[i].free_pending) ctx->be->free(ctx, list[i].ptr);
    free(list);
}

void fp4rl_tensor_unwrap(fp4rl_tensor *t)
{
    fp4rl_context *ctx = t->ctx;
    if (t->storage == FP4RL_STORAGE_VIEW) {
        /* The block stays with the context's allocator, whose reuse is ordered on the stream. */
        fp4rl_block_release(ctx, t->retained);
        return;
    }
    /* The caller gets its memory back: queued kernels that read or write it must be done first.
     * A failing wait (a poisoned context) cannot be reported from a destroy; the memory is handed
     * back anyway, as the device will not touch it again. */
    if (ctx->be->synchronize && !ctx->poisoned) (void)ctx->be->synchronize(ctx);
    if (t->release) t->release(t->release_ctx);
}

/* ---- wrap ---- */
fp4rl_status fp4rl_tensor_wrap(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype, int ndim, const int64_t *shape,
                               const int64_t *strides, void *data, void (*release)(void *), void *release_ctx)
{
    const char *fn = "fp4rl_tensor_wrap";
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (st) return st;
    if (!fp4rl_dtype_is_dense(dtype)) {
        if (fp4rl_dtype_is_quantized(dtype))
            return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: %s is a quantized dtype; only dense f32, bf16 and i32 memory can be wrapped (import codes and scales with fp4rl_tensor_import_quantized)",
                              fn, fp4rl_dtype_name(dtype));
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: unknown dtype %d (f32, bf16 or i32)", fn, (int)dtype);
    }
    int64_t numel;
    if ((st = fp4rl_check_shape(ndim, shape, &numel, fn))) return st;
    if (!data) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: data is NULL", fn);
    if (strides) {
        /* Row-major contiguous: stride[i] = prod(shape[i+1..]); a dim of size 1 is never stepped
         * over, so its stride is free (DLPack producers and PyTorch give such dims any stride). */
        int64_t want = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            if (shape[i] != 1 && strides[i] != want) {
                char sh[160];
                return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT,
                                  "%s: the memory is not contiguous: dim %d of shape %s has stride %lld, a row-major layout needs %lld; fp4rl takes contiguous memory only (make a contiguous copy first)",
                                  fn, i, fp4rl_shape_str(sh, sizeof sh, ndim, shape), (long long)strides[i], (long long)want);
            }
            want *= shape[i];
        }
    }
    const size_t elem = fp4rl_dtype_size(dtype), bytes = (size_t)numel * elem;
    const uintptr_t align = ctx->device == FP4RL_DEVICE_CPU ? elem : FP4RL_DEVICE_ALIGN;
    if ((uintptr_t)data % align)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: data %p is not aligned to %zu bytes (%s on the %s)", fn, data,
                          (size_t)align, ctx->device == FP4RL_DEVICE_CPU ? "the element size" : "fp4rl's device alignment",
                          ctx->be->name);
    if ((uintptr_t)data > UINTPTR_MAX - bytes)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: data %p + %zu bytes wraps around the address space", fn, data, bytes);
    if (ctx->be->check_memory && (st = ctx->be->check_memory(ctx, data, bytes, fn))) return st;
    fp4rl_tensor *t = calloc(1, sizeof *t);
    if (!t) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    t->ctx = ctx;
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->dims, shape, (size_t)ndim * sizeof(int64_t));
    t->numel = numel;
    t->data = data;
    t->data_bytes = bytes;
    t->tensor_scale = 1.0f;
    t->storage = FP4RL_STORAGE_WRAPPED;
    t->release = release;
    t->release_ctx = release_ctx;
    *out = t;
    return FP4RL_OK;
}

void *fp4rl_tensor_data(const fp4rl_tensor *t)
{
    const char *fn = "fp4rl_tensor_data";
    if (!t) {
        fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tensor is NULL", fn);
        return NULL;
    }
    if (!fp4rl_dtype_is_dense(t->dtype)) {
        fp4rl_fail(FP4RL_ERR_DTYPE, "%s: the tensor is %s; its codes and scales have no dense address (dequantize it, or read them with fp4rl_tensor_codes_to_host / fp4rl_tensor_scales_to_host)",
                   fn, fp4rl_dtype_name(t->dtype));
        return NULL;
    }
    return t->data;
}

/* ---- the context's stream ---- */
fp4rl_status fp4rl_context_set_stream(fp4rl_context *ctx, void *cuda_stream)
{
    const char *fn = "fp4rl_context_set_stream";
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (st) return st;
    if (!ctx->be->set_stream) {
        if (!cuda_stream) return FP4RL_OK; /* the context's own order: nothing to change */
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: a %s context has no streams (its work is done when each call returns); only NULL is accepted", fn,
                          ctx->be->name);
    }
    return ctx->be->set_stream(ctx, cuda_stream);
}
