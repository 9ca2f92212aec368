/* cpu_backend.c - the CPU backend: host memory and the OpenBLAS GEMM. */
#include <malloc.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "cpu/cpu_internal.h"
#include "format/formats.h"

/* The context's byte counts (ctx->impl, made by its first allocation): malloc_usable_size of each
 * live block, so a free subtracts what its allocation added. */
typedef struct cpu_mem {
    size_t in_use, peak;
} cpu_mem;

static fp4rl_status cpu_alloc(fp4rl_context *ctx, void **p, size_t bytes)
{
    if (!ctx->impl && !(ctx->impl = calloc(1, sizeof(cpu_mem))))
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "out of host memory for the CPU context's counters");
    *p = malloc(bytes ? bytes : 1);
    if (!*p) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "out of host memory allocating %zu bytes", bytes);
    cpu_mem *m = ctx->impl;
    m->in_use += malloc_usable_size(*p);
    if (m->in_use > m->peak) m->peak = m->in_use;
    return FP4RL_OK;
}
static void cpu_free(fp4rl_context *ctx, void *p)
{
    if (!p || fp4rl_block_defer_free(ctx, p)) return; /* a block views still use goes with the last view */
    ((cpu_mem *)ctx->impl)->in_use -= malloc_usable_size(p); /* p came from cpu_alloc: impl exists */
    free(p);
}
static void cpu_memory_stats(fp4rl_context *ctx, size_t *in_use, size_t *peak, size_t *reserved, int reset_peak)
{
    cpu_mem zero = {0, 0}, *m = ctx->impl ? ctx->impl : &zero;
    if (reset_peak) m->peak = m->in_use;
    *in_use = m->in_use;
    *peak = m->peak;
    *reserved = m->in_use;
}
/* MemAvailable of /proc/meminfo (the kernel's estimate of what can be allocated without
 * swapping); where it cannot be read, the free physical pages. */
static size_t cpu_memory_available(fp4rl_context *ctx)
{
    (void)ctx;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return (size_t)kb * 1024;
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)1 << 30;
}
static fp4rl_status cpu_copy(fp4rl_context *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    if (bytes) memcpy(dst, src, bytes);
    return FP4RL_OK;
}
static fp4rl_status cpu_memset0(fp4rl_context *ctx, void *dst, size_t bytes)
{
    (void)ctx;
    if (bytes) memset(dst, 0, bytes);
    return FP4RL_OK;
}

/* An F32 view of a dense tensor: the data itself, or a widened copy of BF16 (exact). */
static const float *as_f32(const fp4rl_tensor *t, float **tmp)
{
    *tmp = NULL;
    if (t->dtype == FP4RL_DTYPE_F32) return t->data;
    float *f = malloc((size_t)t->numel * sizeof(float));
    if (!f) return NULL;
    const uint16_t *h = t->data;
    for (int64_t i = 0; i < t->numel; i++) f[i] = fp4rl_bf16_to_f32(h[i]);
    *tmp = f;
    return f;
}

static fp4rl_status cpu_gemm_nt(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b, float alpha)
{
    (void)ctx;
    const int64_t M = a->dims[0], K = a->dims[1], N = b->dims[0];
    float *ta, *tb, *tc = NULL;
    const float *fa = as_f32(a, &ta), *fb = as_f32(b, &tb);
    float *fc = c->dtype == FP4RL_DTYPE_F32 ? c->data : (tc = malloc((size_t)(M * N) * sizeof(float)));
    fp4rl_status st = FP4RL_OK;
    if (!fa || !fb || !fc) {
        st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "fp4rl_matmul: out of host memory for F32 copies of the operands");
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)M, (blasint)N, (blasint)K, alpha, fa, (blasint)K,
                    fb, (blasint)K, 0.0f, fc, (blasint)N);
        if (tc)
            for (int64_t i = 0; i < M * N; i++) ((uint16_t *)c->data)[i] = fp4rl_f32_to_bf16(tc[i]);
    }
    free(ta);
    free(tb);
    free(tc);
    return st;
}

static void cpu_context_destroy(fp4rl_context *ctx)
{
    free(ctx->impl);
    ctx->impl = NULL;
}

const fp4rl_backend fp4rl_cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .memset0 = cpu_memset0,
    .quantize = fp4rl_cpu_quantize,
    .dequantize = fp4rl_cpu_dequantize,
    .transpose = fp4rl_cpu_transpose,
    .gemm_nt = cpu_gemm_nt,
    .context_destroy = cpu_context_destroy,
    .memory_stats = cpu_memory_stats,
    .memory_available = cpu_memory_available,
    .head_chunk_max = (size_t)256 << 20,
};
