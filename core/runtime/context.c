/* context.c - device contexts and their random state. */
#include <stdlib.h>

#include "runtime/internal.h"
#include "backend/ops.h"

fp4rl_status fp4rl_context_create(fp4rl_context **out, fp4rl_device device, int ordinal)
{
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_context_create: out is NULL");
    if (device != FP4RL_DEVICE_CPU && device != FP4RL_DEVICE_CUDA)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_context_create: unknown device %d (FP4RL_DEVICE_CPU = 0, FP4RL_DEVICE_CUDA = 1)", (int)device);
    if (ordinal < 0) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_context_create: ordinal %d is negative", ordinal);
    if (device == FP4RL_DEVICE_CPU && ordinal != 0)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_context_create: the CPU device has ordinal 0 only, got %d", ordinal);
#ifndef FP4RL_HAVE_CUDA
    if (device == FP4RL_DEVICE_CUDA)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "fp4rl_context_create: this libfp4rl was built without CUDA (no CUDA toolkit at build time, or FP4RL_WITH_CUDA=OFF)");
#endif
    fp4rl_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "fp4rl_context_create: out of memory");
    ctx->device = device;
    ctx->ordinal = ordinal;
    ctx->world_size = 1;
    ctx->be = &fp4rl_cpu_backend;
    ctx->ops = device == FP4RL_DEVICE_CPU ? &fp4rl_cpu_ops : NULL;
#ifdef FP4RL_HAVE_CUDA
    if (device == FP4RL_DEVICE_CUDA) {
        fp4rl_status st = fp4rl_cuda_context_init(ctx, ordinal);
        if (st != FP4RL_OK) {
            free(ctx);
            return st;
        }
    }
#endif
    *out = ctx;
    return FP4RL_OK;
}

void fp4rl_context_destroy(fp4rl_context *ctx)
{
    if (!ctx) return;
    fp4rl_block_list_destroy(ctx); /* before the backend's memory goes */
    ctx->be->context_destroy(ctx);
    free(ctx);
}

fp4rl_status fp4rl_check_ctx(const fp4rl_context *ctx, const char *fn)
{
    if (!ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: context is NULL", fn);
    if (ctx->poisoned)
        return fp4rl_fail(FP4RL_ERR_DEVICE, "%s: the context had a sticky device error earlier and is unusable; destroy it and create a new one", fn);
    return FP4RL_OK;
}

fp4rl_status fp4rl_context_set_seed(fp4rl_context *ctx, uint64_t seed)
{
    fp4rl_status st = fp4rl_check_ctx(ctx, "fp4rl_context_set_seed");
    if (st) return st;
    ctx->seed = seed;
    ctx->rng_offset = 0;
    return FP4RL_OK;
}

fp4rl_status fp4rl_context_get_rng(const fp4rl_context *ctx, uint64_t *seed, uint64_t *offset)
{
    if (!ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_context_get_rng: context is NULL");
    if (seed) *seed = ctx->seed;
    if (offset) *offset = ctx->rng_offset;
    return FP4RL_OK;
}

fp4rl_status fp4rl_context_set_rng_offset(fp4rl_context *ctx, uint64_t offset)
{
    fp4rl_status st = fp4rl_check_ctx(ctx, "fp4rl_context_set_rng_offset");
    if (st) return st;
    ctx->rng_offset = offset;
    return FP4RL_OK;
}

int fp4rl_context_device(const fp4rl_context *ctx) { return ctx ? (int)ctx->device : -1; }

fp4rl_status fp4rl_context_memory(const fp4rl_context *ctx, size_t *in_use, size_t *peak, size_t *reserved)
{
    if (!ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_context_memory: context is NULL");
    size_t u, p, r;
    /* the counts are host state: readable on a poisoned context too; reset_peak = 0 writes nothing */
    ctx->be->memory_stats((fp4rl_context *)ctx, &u, &p, &r, 0);
    if (in_use) *in_use = u;
    if (peak) *peak = p;
    if (reserved) *reserved = r;
    return FP4RL_OK;
}

fp4rl_status fp4rl_context_reset_peak_memory(fp4rl_context *ctx)
{
    if (!ctx) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_context_reset_peak_memory: context is NULL");
    size_t u, p, r;
    ctx->be->memory_stats(ctx, &u, &p, &r, 1);
    return FP4RL_OK;
}
