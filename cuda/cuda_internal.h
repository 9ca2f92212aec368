/*
 * cuda_internal.h - the CUDA backend's state (ctx->impl) and the functions its files share.
 * CUDA C++ only (the .cu files of cuda/ and the benchmark); nothing here crosses the ABI.
 */
#ifndef FP4RL_CUDA_INTERNAL_H
#define FP4RL_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include "cublaslt_loader.h" /* cublasLt.h, and its entry points loaded at run time */

#include "runtime/internal.h"

/* ---- the caching allocator (cuda_alloc.cu) ----
 * cudaMalloc / cudaFree synchronize the device and cost tens of microseconds, so freed blocks go
 * to per-size free lists and are handed out again. Every op of a context runs on its one stream,
 * so a block freed after being used by queued work can be reused at once by later work on the
 * same stream: stream order keeps them apart. */
typedef struct fp4rl_cuda_block {
    void *ptr;
    size_t size; /* the bucket size actually allocated */
    int in_use;
} fp4rl_cuda_block;

#define FP4RL_CUDA_NBUCKETS 256
typedef struct fp4rl_cuda_free_list {
    void **ptrs;
    size_t len;
    size_t cap; /* kept >= the number of blocks of this bucket, so a free never needs memory */
    size_t nblocks;
} fp4rl_cuda_free_list;

typedef struct fp4rl_cuda_alloc {
    fp4rl_cuda_block *blocks; /* open-addressing table keyed by ptr (linear probing) */
    size_t cap, count;        /* slots, live records */
    fp4rl_cuda_free_list lists[FP4RL_CUDA_NBUCKETS];
    size_t cached_bytes, used_bytes;
    size_t peak_bytes;        /* high-water mark of used_bytes (fp4rl_context_memory) */
} fp4rl_cuda_alloc;

/* The size a request is served with: 512-byte granules, then four steps per power of two, so
 * the waste stays under 25% and equal requests share a bucket. */
size_t fp4rl_cuda_bucket_size(size_t bytes);

/* ---- a cached cuBLASLt plan (gemm.cu) ---- */
#define FP4RL_CUDA_PLAN_CACHE 48
/* Row-major C[M, N] (leading dim ldc) = alpha op(A) op(B) + beta C, in `batch` strided batches
 * (element strides sa, sb, sc; 0 with batch 1): A is stored [M, K] (ta = 0) or [K, M] (ta = 1)
 * with leading dim lda, B [K, N] (tb = 0) or [N, K] (tb = 1) with ldb. */
typedef struct fp4rl_cuda_gemm_shape {
    int ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    int64_t batch, sa, sb, sc;
    int ab_type, c_type; /* cudaDataType values: A and B, C */
} fp4rl_cuda_gemm_shape;

typedef struct fp4rl_cuda_plan {
    int valid;
    fp4rl_cuda_gemm_shape g;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int has_algo;
    unsigned stamp;
} fp4rl_cuda_plan;

typedef struct fp4rl_cuda {
    int device;
    int cc_major, cc_minor, sm_count;
    size_t l2_bytes;
    cudaStream_t stream;     /* where all of the context's work goes: own_stream or the caller's */
    cudaStream_t own_stream; /* the context's own stream, created and destroyed with it */
    cudaEvent_t order_event; /* orders a stream switch (fp4rl_context_set_stream); made on first use */
    fp4rl_cuda_alloc alloc;
    cublasLtHandle_t lt;
    void *lt_workspace;
    size_t lt_workspace_bytes;
    fp4rl_cuda_plan plans[FP4RL_CUDA_PLAN_CACHE];
    unsigned plan_clock;
    /* Small scratch: the NVFP4 tensor amax and flags (device), their host mirror (pinned). */
    unsigned *scratch_dev;
    unsigned *scratch_host;
    /* Arrival counters of the split-K decode kernel; always all zero between launches. */
    unsigned *counters;
    size_t counters_len;
    /* The NCCL communicator (an ncclComm_t) of a distributed context (comm.cu); NULL otherwise. */
    void *nccl_comm;
} fp4rl_cuda;

static inline fp4rl_cuda *fp4rl_cuda_of(const fp4rl_context *ctx) { return (fp4rl_cuda *)ctx->impl; }

/* ---- errors (cuda_context.cu) ----
 * Turns a CUDA error into a status and a message naming `what`. Errors that leave the device
 * context unusable (illegal address, launch failure, ...) poison ctx; an allocation failure is
 * FP4RL_ERR_OUT_OF_MEMORY; others are FP4RL_ERR_DEVICE. */
fp4rl_status fp4rl_cuda_fail(fp4rl_context *ctx, cudaError_t err, const char *what);
/* The error of the last launch (cudaGetLastError), as a status. */
fp4rl_status fp4rl_cuda_check_launch(fp4rl_context *ctx, const char *what);
/* Makes ctx's device current for this thread. */
fp4rl_status fp4rl_cuda_enter(fp4rl_context *ctx);
/* The split-K arrival counters (decode_gemm.cu owns them): cu->counters grown to at least n
 * entries, all zero in stream order; *out the array to use. Each kernel's last CTA resets its own. */
fp4rl_status fp4rl_cuda_split_counters(fp4rl_context *ctx, size_t n, unsigned **out);

/* ---- memory (cuda_alloc.cu) ---- */
fp4rl_status fp4rl_cuda_alloc_bytes(fp4rl_context *ctx, void **p, size_t bytes);
void fp4rl_cuda_free_bytes(fp4rl_context *ctx, void *p);
/* Returns every cached free block to the driver. */
void fp4rl_cuda_alloc_trim(fp4rl_cuda *cu);
/* The backend's memory_stats: used, peak, used + cached bytes. */
void fp4rl_cuda_memory_stats(fp4rl_context *ctx, size_t *in_use, size_t *peak, size_t *reserved, int reset_peak);
size_t fp4rl_cuda_memory_available(fp4rl_context *ctx);
void fp4rl_cuda_alloc_destroy(fp4rl_cuda *cu);

/* ---- the communicator (comm.cu) ---- */
/* The backend's all-reduce (fp4rl_backend.allreduce) over the context's NCCL communicator. */
fp4rl_status fp4rl_cuda_allreduce(fp4rl_context *ctx, void *buf, int64_t n, fp4rl_reduce_kind kind);
/* Destroys the context's communicator, if any (aborts it when the context is poisoned). */
void fp4rl_cuda_comm_destroy(fp4rl_context *ctx);

/* ---- the backend's ops ---- */
fp4rl_status fp4rl_cuda_quantize(fp4rl_context *ctx, fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p);
/* The GPU work of fp4rl_cuda_quantize alone, queued on the stream and not waited for: NVFP4's amax
 * pass stays in device memory (cu->scratch_dev) and q->tensor_scale is not set. For the benchmark,
 * which times the kernels without the host read-back of g. */
fp4rl_status fp4rl_cuda_quantize_launch(fp4rl_context *ctx, fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p);
fp4rl_status fp4rl_cuda_dequantize(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *q, int unscaled);
fp4rl_status fp4rl_cuda_transpose(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *t);
fp4rl_status fp4rl_cuda_gemm_nt(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b, float alpha);
fp4rl_status fp4rl_cuda_matmul(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b);
void fp4rl_cuda_gemm_destroy(fp4rl_cuda *cu);
/* Row-major c[M,N] = alpha * a[M,K] b[N,K]^T + beta * c on cuBLASLt with a cached plan (gemm.cu;
 * FP32 compute, never TF32), on the context stream. 1: launched; 0: no algorithm (caller falls back). */
int fp4rl_cuda_lt_gemm(fp4rl_cuda *cu, int64_t M, int64_t N, int64_t K, const void *a, const void *b, cudaDataType_t ab, void *c,
                       cudaDataType_t ct, float alpha, float beta);
/* The general form (fp4rl_cuda_gemm_shape above), same cache and rules. */
int fp4rl_cuda_lt_gemm_ex(fp4rl_cuda *cu, const fp4rl_cuda_gemm_shape *g, const void *a, const void *b, void *c, float alpha,
                          float beta);

/* Dequantizes q into a dense BF16/F32 device buffer of q's [R, C] shape (unscaled: without
 * NVFP4's g). When `inexact` is not NULL, *inexact is set when some value is not exactly
 * representable in the BF16 output (only possible for MXFP8; synchronizes). */
fp4rl_status fp4rl_cuda_dequantize_to(fp4rl_context *ctx, void *out, fp4rl_dtype out_dtype, const fp4rl_tensor *q,
                                      int unscaled, int *inexact);

/* ---- the fused FP4-weight decode GEMM (decode_gemm.cu) ----
 * c[M, N] = alpha * a[M, K] * dequant(w[N, K])^T for a dense F32/BF16 `a` with M <= 64 and a
 * MXFP4 / NVFP4 / HiF4 `w` whose blocks run along K (1D, or 2D tiles), reading the packed codes and
 * scales directly. Returns FP4RL_ERR_UNSUPPORTED (without a message) when the shapes do not fit it. */
#define FP4RL_DECODE_MAX_M 64
int fp4rl_cuda_decode_gemm_fits(const fp4rl_tensor *a, const fp4rl_tensor *w);
fp4rl_status fp4rl_cuda_decode_gemm(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *w, float alpha);
/* The same with `slices` split-K slices (0: the automatic choice), for the benchmark's sweep. */
fp4rl_status fp4rl_cuda_decode_gemm_split(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *w, float alpha,
                                          int slices);

/* Launch helpers: a grid of ceil(n / threads) blocks. */
static inline unsigned fp4rl_cuda_blocks(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

#endif
