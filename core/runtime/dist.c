/*
 * dist.c - data parallelism: the public entry points of distributed contexts (the NCCL unique
 * id, a CUDA context that joins a communicator, its rank), and the collectives the RL session
 * runs through the backend's all-reduce hook (core/runtime/internal.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

fp4rl_status fp4rl_nccl_unique_id(void *id_bytes, size_t n_bytes)
{
    const char *fn = "fp4rl_nccl_unique_id";
    if (!id_bytes) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: id_bytes is NULL", fn);
    if (n_bytes < FP4RL_NCCL_UNIQUE_ID_BYTES)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the buffer holds %zu bytes; an NCCL unique id needs FP4RL_NCCL_UNIQUE_ID_BYTES (%d)",
                          fn, n_bytes, FP4RL_NCCL_UNIQUE_ID_BYTES);
#ifdef FP4RL_HAVE_NCCL
    return fp4rl_cuda_nccl_unique_id(id_bytes, fn);
#else
    return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: this libfp4rl was built without NCCL (no CUDA toolkit, no nccl.h at build time, or FP4RL_NCCL=OFF)", fn);
#endif
}

fp4rl_status fp4rl_context_create_distributed(fp4rl_context **out, int device_ordinal, int rank, int world_size,
                                              const void *id_bytes, size_t n_bytes)
{
    const char *fn = "fp4rl_context_create_distributed";
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (device_ordinal < 0) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: device_ordinal %d is negative", fn, device_ordinal);
    if (world_size < 1) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: world_size is %d; it must be >= 1", fn, world_size);
    if (rank < 0 || rank >= world_size)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: rank %d is outside [0, world_size) = [0, %d)", fn, rank, world_size);
    if (!id_bytes)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: id_bytes is NULL; pass the bytes of rank 0's fp4rl_nccl_unique_id", fn);
    if (n_bytes < FP4RL_NCCL_UNIQUE_ID_BYTES)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: id_bytes holds %zu bytes; an NCCL unique id has FP4RL_NCCL_UNIQUE_ID_BYTES (%d)",
                          fn, n_bytes, FP4RL_NCCL_UNIQUE_ID_BYTES);
#ifdef FP4RL_HAVE_NCCL
    fp4rl_context *ctx = NULL;
    fp4rl_status st = fp4rl_context_create(&ctx, FP4RL_DEVICE_CUDA, device_ordinal);
    if (st) return st;
    st = fp4rl_cuda_comm_init(ctx, rank, world_size, id_bytes, fn);
    if (st) {
        fp4rl_context_destroy(ctx);
        return st;
    }
    ctx->rank = rank;
    ctx->world_size = world_size;
    ctx->comm = 1;
    *out = ctx;
    return FP4RL_OK;
#else
    return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: this libfp4rl was built without NCCL (no CUDA toolkit, no nccl.h at build time, or FP4RL_NCCL=OFF); multi-GPU training needs it",
                      fn);
#endif
}

fp4rl_status fp4rl_context_get_rank(const fp4rl_context *ctx, int *rank, int *world_size)
{
    if (!ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_context_get_rank: context is NULL");
    if (rank) *rank = ctx->rank;
    if (world_size) *world_size = ctx->world_size;
    return FP4RL_OK;
}

/* ---- collectives ---- */
int fp4rl_dist_active(const fp4rl_context *ctx) { return ctx->comm && ctx->be->allreduce; }

fp4rl_status fp4rl_dist_sum_f64(fp4rl_context *ctx, double *v, int64_t n)
{
    return fp4rl_dist_active(ctx) && n > 0 ? ctx->be->allreduce(ctx, v, n, FP4RL_REDUCE_SUM_F64_HOST) : FP4RL_OK;
}

fp4rl_status fp4rl_dist_max_f64(fp4rl_context *ctx, double *v, int64_t n)
{
    return fp4rl_dist_active(ctx) && n > 0 ? ctx->be->allreduce(ctx, v, n, FP4RL_REDUCE_MAX_F64_HOST) : FP4RL_OK;
}

fp4rl_status fp4rl_dist_sum_f32(fp4rl_context *ctx, float *dev, int64_t n, int bf16)
{
    if (!fp4rl_dist_active(ctx) || n <= 0) return FP4RL_OK;
    return ctx->be->allreduce(ctx, dev, n, bf16 ? FP4RL_REDUCE_SUM_F32_BF16 : FP4RL_REDUCE_SUM_F32);
}

/* One sum collective carries the statuses: slot k counts the ranks that failed with status k
 * (k = 1 .. FP4RL_ERR_INTERNAL), then the sum of the failed ranks' numbers, then the extras. */
#define AGREE_SLOTS (FP4RL_ERR_INTERNAL + 2)
#define AGREE_MAX_EXTRA 8

fp4rl_status fp4rl_dist_agree_sum(fp4rl_context *ctx, fp4rl_status st, double *extra, int n_extra, const char *fn)
{
    if (!fp4rl_dist_active(ctx)) return st;
    if (n_extra < 0 || n_extra > AGREE_MAX_EXTRA) return fp4rl_fail(FP4RL_ERR_INTERNAL, "%s: %d values to agree on", fn, n_extra);
    /* the collective may overwrite this thread's message: keep the local failure's */
    char saved[1024] = "";
    if (st) snprintf(saved, sizeof saved, "%s", fp4rl_last_error());
    double v[AGREE_SLOTS + AGREE_MAX_EXTRA] = {0};
    const int code = st >= FP4RL_ERR_INVALID_ARGUMENT && st <= FP4RL_ERR_INTERNAL ? (int)st : (int)FP4RL_ERR_INTERNAL;
    if (st) {
        v[code] = 1;
        v[AGREE_SLOTS - 1] = ctx->rank;
    }
    for (int i = 0; i < n_extra; i++) v[AGREE_SLOTS + i] = extra[i];
    const fp4rl_status cst = fp4rl_dist_sum_f64(ctx, v, AGREE_SLOTS + n_extra);
    if (st) return fp4rl_fail(st, "%s", saved);
    if (cst) return cst;
    int failed = 0, first = 0;
    for (int k = FP4RL_ERR_INVALID_ARGUMENT; k <= FP4RL_ERR_INTERNAL; k++) {
        failed += (int)v[k];
        if (v[k] > 0 && !first) first = k;
    }
    if (failed == 1)
        return fp4rl_fail((fp4rl_status)first, "%s: rank %d of %d failed with %s (its message is on that rank); the call was abandoned on every rank",
                          fn, (int)v[AGREE_SLOTS - 1], ctx->world_size, fp4rl_status_name((fp4rl_status)first));
    if (failed > 1)
        return fp4rl_fail((fp4rl_status)first, "%s: %d of %d ranks failed (%s and others; the messages are on those ranks); the call was abandoned on every rank",
                          fn, failed, ctx->world_size, fp4rl_status_name((fp4rl_status)first));
    for (int i = 0; i < n_extra; i++) extra[i] = v[AGREE_SLOTS + i];
    return FP4RL_OK;
}

fp4rl_status fp4rl_dist_agree(fp4rl_context *ctx, fp4rl_status st, const char *fn)
{
    return fp4rl_dist_agree_sum(ctx, st, NULL, 0, fn);
}
