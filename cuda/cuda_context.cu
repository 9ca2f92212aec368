/*
 * cuda_context.cu - a CUDA context: device selection, its stream, cuBLASLt handle and workspace,
 * host<->device copies, CUDA error reporting, and the backend table.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "ops_cuda.h"

/* Errors after which the CUDA context is corrupt: every later call would fail or return garbage,
 * so the fp4rl context is poisoned and refuses further work. */
static int is_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
        return 1;
    default:
        return 0;
    }
}

fp4rl_status fp4rl_cuda_fail(fp4rl_context *ctx, cudaError_t err, const char *what)
{
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* not sticky: clear it */
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of GPU memory (%s)", what, cudaGetErrorString(err));
    }
    if (is_sticky(err)) {
        if (ctx) ctx->poisoned = 1;
        return fp4rl_fail(FP4RL_ERR_DEVICE, "%s: CUDA error %s (%s); the device context is corrupt, so this fp4rl context is unusable from now on: destroy it and create a new one",
                          what, cudaGetErrorName(err), cudaGetErrorString(err));
    }
    cudaGetLastError();
    return fp4rl_fail(FP4RL_ERR_DEVICE, "%s: CUDA error %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err));
}

fp4rl_status fp4rl_cuda_check_launch(fp4rl_context *ctx, const char *what)
{
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? FP4RL_OK : fp4rl_cuda_fail(ctx, err, what);
}

fp4rl_status fp4rl_cuda_enter(fp4rl_context *ctx)
{
    cudaError_t err = cudaSetDevice(fp4rl_cuda_of(ctx)->device);
    return err == cudaSuccess ? FP4RL_OK : fp4rl_cuda_fail(ctx, err, "cudaSetDevice");
}

/* ---- memory ops of the backend table ---- */
static fp4rl_status cuda_alloc(fp4rl_context *ctx, void **p, size_t bytes) { return fp4rl_cuda_alloc_bytes(ctx, p, bytes); }
static void cuda_free(fp4rl_context *ctx, void *p)
{
    if (fp4rl_block_defer_free(ctx, p)) return; /* a block views still use goes with the last view */
    fp4rl_cuda_free_bytes(ctx, p);
}

static fp4rl_status cuda_upload(fp4rl_context *ctx, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return FP4RL_OK;
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    /* From pageable memory the call returns once `src` has been staged, so the caller may reuse
     * its buffer at once; stream order puts the copy before any later op on dst. */
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, fp4rl_cuda_of(ctx)->stream);
    return err == cudaSuccess ? FP4RL_OK : fp4rl_cuda_fail(ctx, err, "copy to the GPU");
}

static fp4rl_status cuda_download(fp4rl_context *ctx, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return FP4RL_OK;
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    cudaStream_t s = fp4rl_cuda_of(ctx)->stream;
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s); /* the host reads dst next */
    return err == cudaSuccess ? FP4RL_OK : fp4rl_cuda_fail(ctx, err, "copy from the GPU");
}

static fp4rl_status cuda_memset0(fp4rl_context *ctx, void *dst, size_t bytes)
{
    if (!bytes) return FP4RL_OK;
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    cudaError_t err = cudaMemsetAsync(dst, 0, bytes, fp4rl_cuda_of(ctx)->stream);
    return err == cudaSuccess ? FP4RL_OK : fp4rl_cuda_fail(ctx, err, "cudaMemsetAsync");
}

/* ---- lifetime ---- */
static void release(fp4rl_cuda *cu)
{
    if (!cu) return;
    cudaSetDevice(cu->device);
    if (cu->stream) cudaStreamSynchronize(cu->stream); /* queued work may still use the blocks */
    /* A caller's stream may carry other work too, and the context's own may be the one set:
     * waiting for both keeps every kernel of this context done before its memory goes. */
    if (cu->own_stream && cu->own_stream != cu->stream) cudaStreamSynchronize(cu->own_stream);
    fp4rl_cuda_gemm_destroy(cu);
    if (cu->lt) fp4rl_cublaslt_api()->destroy(cu->lt); /* set only once cuBLASLt loaded */
    if (cu->lt_workspace) cudaFree(cu->lt_workspace);
    if (cu->scratch_dev) cudaFree(cu->scratch_dev);
    if (cu->scratch_host) cudaFreeHost(cu->scratch_host);
    if (cu->counters) cudaFree(cu->counters);
    fp4rl_cuda_alloc_destroy(cu);
    if (cu->order_event) cudaEventDestroy(cu->order_event);
    if (cu->own_stream) cudaStreamDestroy(cu->own_stream); /* never the caller's stream */
    cudaGetLastError(); /* a poisoned context fails all of the above; nothing more to do */
    free(cu);
}

static void cuda_context_destroy(fp4rl_context *ctx)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    if (cu && cu->nccl_comm) {
        cudaSetDevice(cu->device);
        if (!ctx->poisoned) cudaStreamSynchronize(cu->stream); /* collectives still queued finish first */
        fp4rl_cuda_comm_destroy(ctx);
    }
    release(cu);
    ctx->impl = NULL;
}

/* ---- streams (fp4rl_context_set_stream) ---- */
static fp4rl_status cuda_set_stream(fp4rl_context *ctx, void *stream)
{
    const char *fn = "fp4rl_context_set_stream";
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    cudaStream_t next = stream ? static_cast<cudaStream_t>(stream) : cu->own_stream;
    if (next == cu->stream) return FP4RL_OK;
    cudaError_t err = cudaSuccess;
    if (!cu->order_event) {
        err = cudaEventCreateWithFlags(&cu->order_event, cudaEventDisableTiming);
        if (err != cudaSuccess) {
            cu->order_event = nullptr;
            return fp4rl_cuda_fail(ctx, err, "fp4rl_context_set_stream: cudaEventCreate");
        }
    }
    /* Recording this device's event into `next` fails for a stream of another device or an invalid
     * handle: the check, before anything changes. */
    err = cudaEventRecord(cu->order_event, next);
    if (err != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky */
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: stream %p is not a usable stream of CUDA device %d (%s: %s)", fn, stream, cu->device,
                          cudaGetErrorName(err), cudaGetErrorString(err));
    }
    /* Everything queued on the old stream (kernels, and blocks freed to the caching allocator,
     * whose reuse relies on one stream's order) happens before anything on the new one. */
    err = cudaEventRecord(cu->order_event, cu->stream);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(next, cu->order_event, 0);
    if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "fp4rl_context_set_stream: ordering the new stream after the old one");
    cu->stream = next;
    return FP4RL_OK;
}

static fp4rl_status cuda_synchronize(fp4rl_context *ctx)
{
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    cudaError_t err = cudaStreamSynchronize(fp4rl_cuda_of(ctx)->stream);
    return err == cudaSuccess ? FP4RL_OK : fp4rl_cuda_fail(ctx, err, "waiting for the context's stream");
}

/* Wrapped memory must be this GPU's device memory (or managed memory): host memory, even pinned,
 * and another GPU's memory are refused. The first and the last byte are both checked, which
 * catches a size that runs past the allocation into unmapped space. */
static fp4rl_status cuda_check_memory(fp4rl_context *ctx, const void *p, size_t bytes, const char *fn)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    const void *ends[2] = {p, static_cast<const char *>(p) + (bytes ? bytes - 1 : 0)};
    for (int i = 0; i < 2; i++) {
        cudaPointerAttributes a;
        cudaError_t err = cudaPointerGetAttributes(&a, ends[i]);
        if (err != cudaSuccess) {
            (void)cudaGetLastError(); /* an unknown pointer is not sticky */
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %p is not memory CUDA knows (%s)", fn, ends[i], cudaGetErrorString(err));
        }
        if (a.type == cudaMemoryTypeManaged) continue;
        if (a.type != cudaMemoryTypeDevice)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %p is %s memory; a CUDA context wraps device memory of its GPU %d", fn, ends[i],
                              a.type == cudaMemoryTypeHost ? "pinned host" : "host", cu->device);
        if (a.device != cu->device)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %p is memory of GPU %d; this context is on GPU %d", fn, ends[i], a.device, cu->device);
    }
    return FP4RL_OK;
}

/* ---- CUDA graphs (the rollout's decode step) ----
 * Relaxed capture: the caching allocator may still call cudaMalloc while a step is recorded (the
 * blocks then belong to the graph's buffers, which the caller keeps until graph_destroy). */
static fp4rl_status cuda_graph_begin(fp4rl_context *ctx)
{
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    cudaError_t err = cudaStreamBeginCapture(fp4rl_cuda_of(ctx)->stream, cudaStreamCaptureModeRelaxed);
    return err == cudaSuccess ? FP4RL_OK : fp4rl_cuda_fail(ctx, err, "cudaStreamBeginCapture");
}

static fp4rl_status cuda_graph_end(fp4rl_context *ctx, void **graph)
{
    *graph = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t err = cudaStreamEndCapture(fp4rl_cuda_of(ctx)->stream, &g);
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, g, 0);
    if (g) cudaGraphDestroy(g);
    if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "recording a CUDA graph");
    *graph = exec;
    return FP4RL_OK;
}

static fp4rl_status cuda_graph_launch(fp4rl_context *ctx, void *graph)
{
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    cudaError_t err = cudaGraphLaunch((cudaGraphExec_t)graph, fp4rl_cuda_of(ctx)->stream);
    return err == cudaSuccess ? FP4RL_OK : fp4rl_cuda_fail(ctx, err, "cudaGraphLaunch");
}

static void cuda_graph_destroy(fp4rl_context *ctx, void *graph)
{
    (void)ctx;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

static const fp4rl_backend cuda_backend = {
    "cuda",
    cuda_alloc,
    cuda_free,
    cuda_upload,
    cuda_download,
    cuda_memset0,
    fp4rl_cuda_quantize,
    fp4rl_cuda_dequantize,
    fp4rl_cuda_transpose,
    fp4rl_cuda_gemm_nt,
    cuda_context_destroy,
    fp4rl_cuda_matmul,
    fp4rl_cuda_allreduce,
    fp4rl_cuda_memory_stats,
    fp4rl_cuda_memory_available,
    (size_t)2 << 30, /* head_chunk_max: ~600 rows of 151,936 FP32 logits and their gradients */
    cuda_set_stream,
    cuda_check_memory,
    cuda_synchronize,
    cuda_graph_begin,
    cuda_graph_end,
    cuda_graph_launch,
    cuda_graph_destroy,
};

#define LT_WORKSPACE_BYTES ((size_t)32 << 20) /* what cuBLASLt suggests for Hopper */
#define SPLITK_COUNTERS 4096                 /* row blocks of the decode kernel; grown on demand */

extern "C" fp4rl_status fp4rl_cuda_context_init(fp4rl_context *ctx, int ordinal)
{
    const char *fn = "fp4rl_context_create";
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return fp4rl_fail(FP4RL_ERR_DEVICE, "no CUDA device: %s: cudaGetDeviceCount failed with %s (%s)", fn,
                          cudaGetErrorName(err), cudaGetErrorString(err));
    }
    if (n == 0) return fp4rl_fail(FP4RL_ERR_DEVICE, "no CUDA device: %s: the CUDA runtime sees no GPU", fn);
    if (ordinal >= n)
        return fp4rl_fail(FP4RL_ERR_DEVICE, "no CUDA device: %s: ordinal %d asked for, but only %d GPU%s (0 .. %d)", fn, ordinal, n,
                          n == 1 ? " is visible" : "s are visible", n - 1);

    /* libcublasLt is loaded at run time (cuda/cublaslt_loader.h): its absence is told here, at the
     * context's creation, not at the first GEMM. */
    const fp4rl_cublaslt *api = fp4rl_cublaslt_api();
    if (!api->ok) return fp4rl_fail(FP4RL_ERR_DEVICE, "no CUDA device: %s: device %d: %s", fn, ordinal, api->why);

    fp4rl_cuda *cu = (fp4rl_cuda *)calloc(1, sizeof *cu);
    if (!cu) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    cu->device = ordinal;
    cudaDeviceProp prop;
    const char *step = "cudaSetDevice";
    err = cudaSetDevice(ordinal);
    if (err == cudaSuccess) step = "cudaGetDeviceProperties", err = cudaGetDeviceProperties(&prop, ordinal);
    if (err == cudaSuccess) step = "cudaStreamCreate", err = cudaStreamCreate(&cu->own_stream);
    cu->stream = cu->own_stream;
    if (err == cudaSuccess) step = "cudaMalloc (cuBLASLt workspace)", err = cudaMalloc(&cu->lt_workspace, LT_WORKSPACE_BYTES);
    if (err == cudaSuccess) step = "cudaMalloc (scratch)", err = cudaMalloc((void **)&cu->scratch_dev, 64);
    if (err == cudaSuccess) step = "cudaMallocHost (scratch)", err = cudaMallocHost((void **)&cu->scratch_host, 64);
    if (err == cudaSuccess) step = "cudaMalloc (counters)", err = cudaMalloc((void **)&cu->counters, SPLITK_COUNTERS * sizeof(unsigned));
    /* on the context's stream like all of its work, so a caller's stream set later is ordered after it */
    if (err == cudaSuccess) step = "cudaMemsetAsync (counters)", err = cudaMemsetAsync(cu->counters, 0, SPLITK_COUNTERS * sizeof(unsigned), cu->stream);
    if (err != cudaSuccess) {
        fp4rl_status st = err == cudaErrorMemoryAllocation
                              ? fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory on CUDA device %d at %s", fn, ordinal, step)
                              : fp4rl_fail(FP4RL_ERR_DEVICE, "no CUDA device: %s: device %d is not usable: %s failed with %s (%s)", fn,
                                           ordinal, step, cudaGetErrorName(err), cudaGetErrorString(err));
        cudaGetLastError();
        release(cu);
        return st;
    }
    cu->counters_len = SPLITK_COUNTERS;
    cu->lt_workspace_bytes = LT_WORKSPACE_BYTES;
    cu->cc_major = prop.major;
    cu->cc_minor = prop.minor;
    cu->sm_count = prop.multiProcessorCount;
    cu->l2_bytes = (size_t)prop.l2CacheSize;
    if (prop.major < 8) {
        release(cu);
        return fp4rl_fail(FP4RL_ERR_DEVICE, "no CUDA device: %s: device %d (%s) has compute capability %d.%d; fp4rl's kernels need 8.0 or newer",
                          fn, ordinal, prop.name, prop.major, prop.minor);
    }
    cublasStatus_t bs = api->create(&cu->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        cu->lt = NULL;
        release(cu);
        return fp4rl_fail(FP4RL_ERR_DEVICE, "no CUDA device: %s: cublasLtCreate failed on device %d (status %d)", fn, ordinal, (int)bs);
    }
    ctx->impl = cu;
    ctx->be = &cuda_backend;
    ctx->ops = &fp4rl_cuda_ops;
    return FP4RL_OK;
}
