/*
 * cuda_alloc.cu - the caching device allocator of a CUDA context.
 *
 * A table keyed by pointer remembers every block the context got from cudaMalloc (its bucket
 * size, whether it is in use); freed blocks wait on a free list per bucket size. The hot path
 * (an op allocating its output, a matmul its temporaries) then costs a table lookup instead of a
 * device-wide synchronizing cudaMalloc / cudaFree.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

static int floor_log2(size_t x)
{
    int p = 0;
    while (x >>= 1) p++;
    return p;
}

size_t fp4rl_cuda_bucket_size(size_t bytes)
{
    if (bytes <= 512) return 512;
    int p = floor_log2(bytes);
    size_t step = (size_t)1 << (p - 2);
    return (bytes + step - 1) / step * step;
}

/* Index of a bucket size (an output of fp4rl_cuda_bucket_size): 0 for 512, then four per power
 * of two; sizes up to 2^63 stay below 4 * 55. */
static int bucket_index(size_t bucket_size)
{
    if (bucket_size <= 512) return 0;
    int p = floor_log2(bucket_size);
    return 4 * (p - 9) + (int)(bucket_size >> (p - 2)) - 3;
}

static size_t hash_ptr(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return (size_t)x & (cap - 1);
}

static fp4rl_cuda_block *find(fp4rl_cuda_alloc *a, const void *p)
{
    if (!a->cap) return NULL;
    for (size_t i = hash_ptr(p, a->cap);; i = (i + 1) & (a->cap - 1)) {
        if (!a->blocks[i].ptr) return NULL;
        if (a->blocks[i].ptr == p) return &a->blocks[i];
    }
}

/* Doubles the table's slots (the load factor stays under 1/2). */
static int grow(fp4rl_cuda_alloc *a)
{
    size_t ncap = a->cap ? a->cap * 2 : 256;
    fp4rl_cuda_block *nb = (fp4rl_cuda_block *)calloc(ncap, sizeof(fp4rl_cuda_block));
    if (!nb) return 0;
    for (size_t i = 0; i < a->cap; i++) {
        if (!a->blocks[i].ptr) continue;
        size_t j = hash_ptr(a->blocks[i].ptr, ncap);
        while (nb[j].ptr) j = (j + 1) & (ncap - 1);
        nb[j] = a->blocks[i];
    }
    free(a->blocks);
    a->blocks = nb;
    a->cap = ncap;
    return 1;
}

static int insert(fp4rl_cuda_alloc *a, void *p, size_t size)
{
    if ((a->count + 1) * 2 > a->cap && !grow(a)) return 0;
    size_t i = hash_ptr(p, a->cap);
    while (a->blocks[i].ptr) i = (i + 1) & (a->cap - 1);
    a->blocks[i].ptr = p;
    a->blocks[i].size = size;
    a->blocks[i].in_use = 1;
    a->count++;
    return 1;
}

/* Removes p's record, shifting later members of its probe run back (no tombstones). */
static void erase(fp4rl_cuda_alloc *a, const void *p)
{
    fp4rl_cuda_block *b = find(a, p);
    if (!b) return;
    size_t i = (size_t)(b - a->blocks), mask = a->cap - 1;
    a->blocks[i].ptr = NULL;
    a->count--;
    for (size_t j = (i + 1) & mask; a->blocks[j].ptr; j = (j + 1) & mask) {
        size_t h = hash_ptr(a->blocks[j].ptr, a->cap);
        /* j may move into the hole i unless its home slot h lies cyclically in (i, j] */
        if (((j - h) & mask) >= ((j - i) & mask)) {
            a->blocks[i] = a->blocks[j];
            a->blocks[j].ptr = NULL;
            i = j;
        }
    }
}

/* Makes room on a bucket's free list for one more block of that bucket. */
static int reserve(fp4rl_cuda_free_list *l)
{
    if (l->nblocks + 1 <= l->cap) return 1;
    size_t ncap = l->cap ? l->cap * 2 : 16;
    void **np = (void **)realloc(l->ptrs, ncap * sizeof(void *));
    if (!np) return 0;
    l->ptrs = np;
    l->cap = ncap;
    return 1;
}

fp4rl_status fp4rl_cuda_alloc_bytes(fp4rl_context *ctx, void **p, size_t bytes)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    fp4rl_cuda_alloc *a = &cu->alloc;
    size_t size = fp4rl_cuda_bucket_size(bytes);
    if (size < bytes || bytes > ((size_t)1 << 62))
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "a CUDA allocation of %zu bytes is too large", bytes);
    fp4rl_cuda_free_list *l = &a->lists[bucket_index(size)];
    if (l->len) {
        void *q = l->ptrs[--l->len];
        fp4rl_cuda_block *b = find(a, q);
        b->in_use = 1;
        a->cached_bytes -= b->size;
        a->used_bytes += b->size;
        if (a->used_bytes > a->peak_bytes) a->peak_bytes = a->used_bytes;
        *p = q;
        return FP4RL_OK;
    }
    if (!reserve(l)) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "out of host memory for the CUDA allocator's lists");
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    void *q = NULL;
    cudaError_t err = cudaMalloc(&q, size);
    if (err == cudaErrorMemoryAllocation) { /* the cache may hold what is missing: give it back, retry */
        cudaGetLastError();
        fp4rl_cuda_alloc_trim(cu);
        err = cudaMalloc(&q, size);
    }
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "out of GPU memory allocating %zu bytes on CUDA device %d (%zu bytes in use by this context)",
                          bytes, cu->device, a->used_bytes);
    }
    if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "cudaMalloc");
    if (!insert(a, q, size)) {
        cudaFree(q);
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "out of host memory for the CUDA allocator's table");
    }
    l->nblocks++;
    a->used_bytes += size;
    if (a->used_bytes > a->peak_bytes) a->peak_bytes = a->used_bytes;
    *p = q;
    return FP4RL_OK;
}

void fp4rl_cuda_free_bytes(fp4rl_context *ctx, void *p)
{
    if (!p) return;
    fp4rl_cuda_alloc *a = &fp4rl_cuda_of(ctx)->alloc;
    fp4rl_cuda_block *b = find(a, p);
    if (!b || !b->in_use) return; /* not ours, or a double free: ignore rather than corrupt the lists */
    fp4rl_cuda_free_list *l = &a->lists[bucket_index(b->size)];
    l->ptrs[l->len++] = p; /* cap >= nblocks > len: reserved when the block was made */
    b->in_use = 0;
    a->used_bytes -= b->size;
    a->cached_bytes += b->size;
}

void fp4rl_cuda_memory_stats(fp4rl_context *ctx, size_t *in_use, size_t *peak, size_t *reserved, int reset_peak)
{
    fp4rl_cuda_alloc *a = &fp4rl_cuda_of(ctx)->alloc;
    if (reset_peak) a->peak_bytes = a->used_bytes;
    *in_use = a->used_bytes;
    *peak = a->peak_bytes;
    *reserved = a->used_bytes + a->cached_bytes;
}

size_t fp4rl_cuda_memory_available(fp4rl_context *ctx)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: clear it */
        free_b = 0;
    }
    return free_b + fp4rl_cuda_of(ctx)->alloc.cached_bytes;
}

void fp4rl_cuda_alloc_trim(fp4rl_cuda *cu)
{
    fp4rl_cuda_alloc *a = &cu->alloc;
    for (int i = 0; i < FP4RL_CUDA_NBUCKETS; i++) {
        fp4rl_cuda_free_list *l = &a->lists[i];
        while (l->len) {
            void *q = l->ptrs[--l->len];
            erase(a, q);
            cudaFree(q);
            l->nblocks--;
        }
    }
    a->cached_bytes = 0;
}

void fp4rl_cuda_alloc_destroy(fp4rl_cuda *cu)
{
    fp4rl_cuda_alloc *a = &cu->alloc;
    for (size_t i = 0; i < a->cap; i++)
        if (a->blocks[i].ptr) cudaFree(a->blocks[i].ptr);
    for (int i = 0; i < FP4RL_CUDA_NBUCKETS; i++) free(a->lists[i].ptrs);
    free(a->blocks);
    memset(a, 0, sizeof *a);
}
