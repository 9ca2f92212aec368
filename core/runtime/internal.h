/*
 * internal.h - the structures behind the opaque handles, and the backend interface.
 * Not installed; the ABI is abi/include/fp4rl/fp4rl.h.
 */
#ifndef FP4RL_INTERNAL_H
#define FP4RL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fp4rl/fp4rl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP4RL_HIDDEN __attribute__((visibility("hidden")))

/* ---- errors (core/runtime/error.c) ---- */
/* Sets this thread's message and returns `s`. printf-style. */
FP4RL_HIDDEN fp4rl_status fp4rl_fail(fp4rl_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Formats a shape as "[2, 3, 4]" into buf. */
FP4RL_HIDDEN const char *fp4rl_shape_str(char *buf, size_t n, int ndim, const int64_t *dims);

/* ---- the quantized-tensor description shared by backends ---- */
typedef struct fp4rl_qdesc {
    fp4rl_dtype dtype;   /* MXFP4, NVFP4, HIF4, MXFP8_E4M3 */
    int64_t rows, cols;  /* the [R, C] view */
    int tile;            /* 0 = 1D */
    int block;           /* 1D block (32, 16, 64); for 2D the tile */
    int64_t row_bytes;   /* bytes of codes per row */
    int64_t scale_rows, scale_cols; /* the scale matrix */
    int scale_elem_bytes;           /* 1, or 4 for HiF4 words */
} fp4rl_qdesc;

/* Fills a description from the format's traits and layout (format/traits.h, format/layout.h);
 * false when the byte sizes overflow or dtype is not a quantized format. */
FP4RL_HIDDEN bool fp4rl_qdesc_make(fp4rl_qdesc *d, fp4rl_dtype dtype, int64_t rows, int64_t cols, int tile);
FP4RL_HIDDEN size_t fp4rl_qdesc_codes_bytes(const fp4rl_qdesc *d);
FP4RL_HIDDEN size_t fp4rl_qdesc_scales_bytes(const fp4rl_qdesc *d);
FP4RL_HIDDEN bool fp4rl_dtype_is_quantized(fp4rl_dtype t);
FP4RL_HIDDEN bool fp4rl_dtype_is_dense(fp4rl_dtype t);
FP4RL_HIDDEN size_t fp4rl_dtype_size(fp4rl_dtype t); /* dense element size */
/* For messages: `first`, then the 2D tile edges format f takes (format/traits.h), comma-separated
 * ("0, 64" after "0"; "16, 32, 64" after ""), in buf of n bytes. */
FP4RL_HIDDEN const char *fp4rl_format_tiles_str(fp4rl_dtype f, const char *first, char *buf, size_t n);

/* The parameters of one quantization call, resolved from (format, policy, role, context). */
typedef struct fp4rl_qparams {
    fp4rl_dtype format;
    int tile;
    int truncation_free;
    int stochastic;
    uint64_t seed, offset;
} fp4rl_qparams;

typedef enum fp4rl_storage { FP4RL_STORAGE_OWNED = 0, FP4RL_STORAGE_WRAPPED, FP4RL_STORAGE_VIEW } fp4rl_storage;

struct fp4rl_tensor {
    fp4rl_context *ctx;
    fp4rl_dtype dtype;
    int ndim;
    int64_t dims[FP4RL_MAX_DIMS];
    int64_t numel;
    void *data;        /* dense elements, or packed codes; device memory of ctx */
    size_t data_bytes;
    void *scales;      /* quantized only */
    size_t scales_bytes;
    float tensor_scale;/* NVFP4's g; 1 otherwise */
    fp4rl_qdesc q;     /* quantized only */
    /* Where `data` came from (core/tensor/tensor_wrap.c): the library's own allocation (OWNED),
     * the caller's memory (WRAPPED: release(release_ctx) when destroyed, never freed here), or a
     * view into a block of the context that `retained` keeps alive (VIEW: a model parameter). */
    fp4rl_storage storage;
    void (*release)(void *);
    void *release_ctx;
    void *retained;    /* VIEW: the block base passed to fp4rl_block_retain */
    /* 0: data and scales as format/layout.h says. FP4RL_LAYOUT_W4B: re-laid out by the backend's
     * linear_w4b_pack (ops_list.h) for its linear_forward_w4b, which alone reads it; such tensors
     * stay inside the rollout engine, and the ABI refuses them (fp4rl_check_tensor). */
    int layout;
};
#define FP4RL_LAYOUT_W4B 1

/* What a collective of the backend's communicator reduces, and how (see fp4rl_backend.allreduce). */
typedef enum fp4rl_reduce_kind {
    FP4RL_REDUCE_SUM_F32 = 0,      /* device float buffer, summed in FP32 */
    FP4RL_REDUCE_SUM_F32_BF16 = 1, /* device float buffer, rounded to BF16 (RNE), summed in BF16, widened */
    FP4RL_REDUCE_SUM_F64_HOST = 2, /* host double buffer, summed */
    FP4RL_REDUCE_MAX_F64_HOST = 3  /* host double buffer, maximum */
} fp4rl_reduce_kind;

/* ---- the backend interface: what each device fills ----
 * Memory functions work on device memory of the context. Every function returns a status and
 * sets the message on failure. Arguments have been validated by core before the call. */
typedef struct fp4rl_backend {
    const char *name;
    fp4rl_status (*alloc)(fp4rl_context *ctx, void **p, size_t bytes);
    void (*free)(fp4rl_context *ctx, void *p);
    fp4rl_status (*upload)(fp4rl_context *ctx, void *dst, const void *src, size_t bytes);
    fp4rl_status (*download)(fp4rl_context *ctx, void *dst, const void *src, size_t bytes);
    fp4rl_status (*memset0)(fp4rl_context *ctx, void *dst, size_t bytes);
    /* q has its descriptor and storage set; src is dense F32/BF16 with numel == rows * cols. */
    fp4rl_status (*quantize)(fp4rl_context *ctx, fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p);
    /* out is dense F32/BF16 of q's shape. unscaled: skip NVFP4's g (for GEMM alpha). */
    fp4rl_status (*dequantize)(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *q, int unscaled);
    /* out has the transposed descriptor / shape and storage set. */
    fp4rl_status (*transpose)(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *t);
    /* c = alpha * a * b^T, a [M,K], b [N,K] both dense F32/BF16. */
    fp4rl_status (*gemm_nt)(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b, float alpha);
    void (*context_destroy)(fp4rl_context *ctx);
    /* Optional; NULL means core dequantizes quantized operands to F32 and calls gemm_nt. A backend
     * with faster paths for quantized operands (fused kernels, exact BF16 dequantization) sets it:
     * c = a * b^T for operands core has validated, with the semantics of fp4rl_matmul. */
    fp4rl_status (*matmul)(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b);
    /* Optional; NULL where the backend has no communicator (the CPU). An all-reduce over the
     * context's communicator (ctx->comm set), in place on `n` elements of `buf`, in the context's
     * stream order: every rank calls it at the same point. The result is bit-identical on every
     * rank. Host kinds return when the result is in `buf`. */
    fp4rl_status (*allreduce)(fp4rl_context *ctx, void *buf, int64_t n, fp4rl_reduce_kind kind);
    /* Bytes held by the context (fp4rl_context_memory); reset_peak != 0 first sets peak = in use. */
    void (*memory_stats)(fp4rl_context *ctx, size_t *in_use, size_t *peak, size_t *reserved, int reset_peak);
    /* Bytes the context could still allocate now: the device's free memory plus what its caching
     * allocator holds unused (automatic micro-batch sizing). */
    size_t (*memory_available)(fp4rl_context *ctx);
    /* The most bytes the LM head's chunk of rows should take (core/model/model_forward.c): the
     * CPU's GEMM is as fast on 80 rows as on 1000, a GPU's is not, and its row reductions need
     * rows enough to fill the device. */
    size_t head_chunk_max;
    /* Optional (NULL: the backend has no streams, the CPU). Orders all of the context's later work
     * on `stream` (a cudaStream_t; NULL = the backend's own), after all of its earlier work. */
    fp4rl_status (*set_stream)(fp4rl_context *ctx, void *stream);
    /* Optional (NULL: host memory, not checkable). FP4RL_OK when [p, p + bytes) is memory of the
     * context's device; else a clear error naming `fn`. */
    fp4rl_status (*check_memory)(fp4rl_context *ctx, const void *p, size_t bytes, const char *fn);
    /* Optional (NULL: work is done when a call returns). Waits until the context's queued work is
     * done (before caller memory is handed back through a wrapped tensor's release). */
    fp4rl_status (*synchronize)(fp4rl_context *ctx);
    /* Optional (NULL: no graphs, the CPU). The context's work between graph_begin and graph_end is
     * recorded into *graph instead of run (CUDA stream capture); graph_launch runs it again, on the
     * same buffers, in stream order; graph_destroy frees it. Between begin and end no op may
     * synchronize with the host (no download) and the buffers used must outlive the graph. */
    fp4rl_status (*graph_begin)(fp4rl_context *ctx);
    fp4rl_status (*graph_end)(fp4rl_context *ctx, void **graph);
    fp4rl_status (*graph_launch)(fp4rl_context *ctx, void *graph);
    void (*graph_destroy)(fp4rl_context *ctx, void *graph);
} fp4rl_backend;

/* A block of device memory that views keep alive (core/tensor/tensor_wrap.c). */
typedef struct fp4rl_retained_block {
    void *ptr;
    int64_t refs;
    int free_pending; /* its owner freed it while views existed: freed when the last view goes */
} fp4rl_retained_block;

struct fp4rl_context {
    fp4rl_device device;
    int ordinal;
    uint64_t seed;
    uint64_t rng_offset;
    const fp4rl_backend *be;
    const struct fp4rl_ops *ops; /* the transformer op table (core/backend/ops.h); NULL where not implemented yet */
    void *impl;       /* backend state */
    int poisoned;     /* a sticky device error happened: refuse further work */
    /* data parallelism (core/runtime/dist.c): rank and world size (0 and 1 by default); comm is set when
     * the context joined a communicator (fp4rl_context_create_distributed), and then the sessions
     * run their collectives through be->allreduce */
    int rank, world_size;
    int comm;
    size_t mem_budget; /* tests: when non-zero, the bytes automatic micro-batch sizing assumes free */
    /* blocks views hold (fp4rl_model_param_tensor): a short list, usually empty */
    fp4rl_retained_block *retained;
    int n_retained, cap_retained;
};

FP4RL_HIDDEN extern const fp4rl_backend fp4rl_cpu_backend;
#ifdef FP4RL_HAVE_CUDA
/* Creates the CUDA state of ctx (ctx->impl) and sets ctx->be. */
FP4RL_HIDDEN fp4rl_status fp4rl_cuda_context_init(fp4rl_context *ctx, int ordinal);
#endif
#ifdef FP4RL_HAVE_NCCL
/* cuda/comm.cu: a new NCCL unique id (FP4RL_NCCL_UNIQUE_ID_BYTES bytes); the communicator of a
 * CUDA context (ctx->impl made), joined as `rank` of `world_size`; `fn` names the caller. */
FP4RL_HIDDEN fp4rl_status fp4rl_cuda_nccl_unique_id(void *id, const char *fn);
FP4RL_HIDDEN fp4rl_status fp4rl_cuda_comm_init(fp4rl_context *ctx, int rank, int world_size, const void *id, const char *fn);
#endif

/* ---- core/runtime/dist.c: the collectives of a distributed context ---- */
/* Whether ctx runs collectives (it joined a communicator). */
FP4RL_HIDDEN int fp4rl_dist_active(const fp4rl_context *ctx);
/* In-place sum or maximum of n host doubles over the ranks (a no-op when not active). */
FP4RL_HIDDEN fp4rl_status fp4rl_dist_sum_f64(fp4rl_context *ctx, double *v, int64_t n);
FP4RL_HIDDEN fp4rl_status fp4rl_dist_max_f64(fp4rl_context *ctx, double *v, int64_t n);
/* In-place sum of a device float buffer over the ranks, in FP32 or BF16 (a no-op when not active). */
FP4RL_HIDDEN fp4rl_status fp4rl_dist_sum_f32(fp4rl_context *ctx, float *dev, int64_t n, int bf16);
/* Every rank calls this at the same point with its own status `st`: when some rank failed, every
 * rank returns a failure (its own status and message, or "fn: rank r failed ..."); else FP4RL_OK.
 * Returns st unchanged when not active. */
FP4RL_HIDDEN fp4rl_status fp4rl_dist_agree(fp4rl_context *ctx, fp4rl_status st, const char *fn);
/* The same, and in the same collective the sum over the ranks of n_extra (<= 8) host doubles,
 * written back to `extra` when no rank failed. */
FP4RL_HIDDEN fp4rl_status fp4rl_dist_agree_sum(fp4rl_context *ctx, fp4rl_status st, double *extra, int n_extra, const char *fn);

/* core/tensor/policy.c: the parameters of one quantize call from (policy or NULL, format, role, ctx). */
FP4RL_HIDDEN fp4rl_status fp4rl_policy_resolve(const fp4rl_quant_policy *p, fp4rl_dtype format, fp4rl_role role,
                                               const fp4rl_context *ctx, fp4rl_qparams *out, const char *fn);

/* A parameter's value (param in range), and a new copy of a policy (src NULL = defaults). */
FP4RL_HIDDEN int64_t fp4rl_policy_value(const fp4rl_quant_policy *p, fp4rl_qparam param);
FP4RL_HIDDEN fp4rl_status fp4rl_policy_copy(fp4rl_quant_policy **out, const fp4rl_quant_policy *src);

/* ---- core helpers (core/tensor/tensor.c) ---- */
FP4RL_HIDDEN fp4rl_status fp4rl_check_ctx(const fp4rl_context *ctx, const char *fn);
FP4RL_HIDDEN fp4rl_status fp4rl_check_tensor(const fp4rl_tensor *t, const char *fn, const char *what);
/* Allocates a tensor shell and its storage (dense when dtype is dense; else codes + scales per q). */
FP4RL_HIDDEN fp4rl_status fp4rl_tensor_alloc(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype, int ndim,
                                             const int64_t *dims, const fp4rl_qdesc *q, const char *fn);
/* The [R, C] view of a shape. */
FP4RL_HIDDEN void fp4rl_rows_cols(int ndim, const int64_t *dims, int64_t *rows, int64_t *cols);
/* Copies any tensor (dense or quantized) into a new tensor of the CPU context `host` (for reports). */
FP4RL_HIDDEN fp4rl_status fp4rl_tensor_to_cpu(fp4rl_tensor **out, fp4rl_context *host, const fp4rl_tensor *t);
/* Overflow-checked a * b into *r. */
FP4RL_HIDDEN bool fp4rl_mul_ok(size_t a, size_t b, size_t *r);
/* Validates a dense shape (1..FP4RL_MAX_DIMS dims, each >= 1, bytes fit) and computes numel. */
FP4RL_HIDDEN fp4rl_status fp4rl_check_shape(int ndim, const int64_t *shape, int64_t *numel, const char *fn);

/* ---- core/tensor/tensor_wrap.c: blocks kept alive by views ----
 * A view (fp4rl_model_param_tensor) retains the block it points into; the backend's free of a
 * retained block (the model destroyed first) only marks it, and the last view's release frees it.
 * Backends call fp4rl_block_defer_free first thing in their `free`: true = keep the block. */
FP4RL_HIDDEN fp4rl_status fp4rl_block_retain(fp4rl_context *ctx, void *block);
FP4RL_HIDDEN void fp4rl_block_release(fp4rl_context *ctx, void *block);
FP4RL_HIDDEN bool fp4rl_block_defer_free(fp4rl_context *ctx, void *block);
/* Frees blocks still pending at context destruction (their views outlived the rules) and the list. */
FP4RL_HIDDEN void fp4rl_block_list_destroy(fp4rl_context *ctx);
/* Hands back the storage of a WRAPPED or VIEW tensor (fp4rl_tensor_destroy calls it): waits for the
 * context's queued work, then calls the caller's release; a view releases its block. */
FP4RL_HIDDEN void fp4rl_tensor_unwrap(fp4rl_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
