/*
 * comm.cu - the NCCL communicator of a distributed CUDA context, and the backend's all-reduce.
 *
 * libnccl is loaded at run time (dlopen of libnccl.so.2 on first use), not linked: a libfp4rl
 * built with NCCL support then still loads, and runs everything but multi-GPU training, on a
 * machine without NCCL. Only NCCL 2's stable C entry points are used, and NVLink SHARP
 * (multicast) is switched off: NCCL_NVLS_ENABLE=0 is set before any NCCL call, and nothing here
 * creates multicast objects.
 */
#include "cuda_internal.h"
#include "format/formats.h"

#ifdef FP4RL_HAVE_NCCL
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

static_assert(sizeof(ncclUniqueId) == FP4RL_NCCL_UNIQUE_ID_BYTES, "FP4RL_NCCL_UNIQUE_ID_BYTES must be NCCL's NCCL_UNIQUE_ID_BYTES");

namespace {

/* The NCCL entry points fp4rl uses, resolved from the loaded library. */
struct nccl_api {
    int ok;
    char why[512]; /* when !ok: why NCCL is not usable */
    int version;
    ncclResult_t (*get_version)(int *);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    const char *(*get_error_string)(ncclResult_t);
    const char *(*get_last_error)(ncclComm_t);
};

template <typename F> static int resolve(void *lib, const char *name, F *out, nccl_api *a)
{
    *out = reinterpret_cast<F>(dlsym(lib, name));
    if (!*out) snprintf(a->why, sizeof a->why, "libnccl has no symbol %s (an NCCL older than 2.13?)", name);
    return *out != nullptr;
}

static nccl_api load_nccl()
{
    nccl_api a;
    memset(&a, 0, sizeof a);
    /* before NCCL reads its environment: no NVLink SHARP multicast (cuMulticastCreate) */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    const char *names[] = {"libnccl.so.2", "libnccl.so",
#ifdef FP4RL_NCCL_LIBRARY_PATH
                           FP4RL_NCCL_LIBRARY_PATH,
#endif
                           nullptr};
    void *lib = nullptr;
    const char *err = "";
    for (int i = 0; names[i] && !lib; i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
        if (!lib) err = dlerror();
    }
    if (!lib) {
        snprintf(a.why, sizeof a.why, "NCCL is not installed here: dlopen(libnccl.so.2) failed (%s); put libnccl.so.2 on the library path", err ? err : "");
        return a;
    }
    if (!resolve(lib, "ncclGetVersion", &a.get_version, &a) || !resolve(lib, "ncclGetUniqueId", &a.get_unique_id, &a) ||
        !resolve(lib, "ncclCommInitRank", &a.comm_init_rank, &a) || !resolve(lib, "ncclCommDestroy", &a.comm_destroy, &a) ||
        !resolve(lib, "ncclCommAbort", &a.comm_abort, &a) || !resolve(lib, "ncclAllReduce", &a.all_reduce, &a) ||
        !resolve(lib, "ncclGetErrorString", &a.get_error_string, &a) || !resolve(lib, "ncclGetLastError", &a.get_last_error, &a))
        return a; /* the library stays loaded: NCCL does not support being unloaded */
    if (a.get_version(&a.version) != ncclSuccess || a.version < 21300 || a.version >= 30000) {
        snprintf(a.why, sizeof a.why, "the libnccl found is version code %d; fp4rl needs NCCL 2 (2.13 or newer)", a.version);
        return a;
    }
    a.ok = 1;
    return a;
}

/* NCCL, loaded once per process (C++ guarantees a thread-safe one-time initialisation). */
static const nccl_api *nccl()
{
    static const nccl_api api = load_nccl();
    return &api;
}

fp4rl_status nccl_fail(fp4rl_context *ctx, ncclResult_t r, const char *what, ncclComm_t comm)
{
    const nccl_api *a = nccl();
    const char *detail = a->get_last_error ? a->get_last_error(comm) : "";
    /* a failed collective leaves the communicator unusable, unless the call was merely invalid */
    if (ctx && r != ncclInvalidArgument && r != ncclInvalidUsage) ctx->poisoned = 1;
    return fp4rl_fail(FP4RL_ERR_DEVICE, "%s: NCCL error %d (%s)%s%s%s", what, (int)r, a->get_error_string(r), detail && *detail ? ": " : "",
                      detail ? detail : "",
                      ctx && ctx->poisoned ? "; the communicator is unusable, so this fp4rl context is too: destroy it on every rank" : "");
}

__global__ void to_bf16_k(uint16_t *out, const float *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = fp4rl_f32_to_bf16(x[i]);
}

__global__ void from_bf16_k(float *out, const uint16_t *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = fp4rl_bf16_to_f32(x[i]);
}

unsigned grid_for(int64_t n)
{
    const int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);
}

} // namespace

fp4rl_status fp4rl_cuda_nccl_unique_id(void *id, const char *fn)
{
    const nccl_api *a = nccl();
    if (!a->ok) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s", fn, a->why);
    ncclUniqueId uid;
    ncclResult_t r = a->get_unique_id(&uid);
    if (r != ncclSuccess) {
        const char *detail = a->get_last_error(nullptr);
        return fp4rl_fail(FP4RL_ERR_DEVICE, "%s: ncclGetUniqueId failed with NCCL error %d (%s)%s%s", fn, (int)r, a->get_error_string(r),
                          detail && *detail ? ": " : "", detail ? detail : "");
    }
    memcpy(id, &uid, sizeof uid);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cuda_comm_init(fp4rl_context *ctx, int rank, int world_size, const void *id, const char *fn)
{
    const nccl_api *a = nccl();
    if (!a->ok) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: %s", fn, a->why);
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    ncclComm_t comm = nullptr;
    ncclResult_t r = a->comm_init_rank(&comm, world_size, uid, rank);
    if (r != ncclSuccess) {
        char what[256];
        snprintf(what, sizeof what, "%s: ncclCommInitRank (rank %d of %d on GPU %d)", fn, rank, world_size, cu->device);
        return nccl_fail(nullptr, r, what, comm);
    }
    cu->nccl_comm = comm;
    return FP4RL_OK;
}

void fp4rl_cuda_comm_destroy(fp4rl_context *ctx)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    if (!cu || !cu->nccl_comm) return;
    const nccl_api *a = nccl();
    ncclComm_t comm = static_cast<ncclComm_t>(cu->nccl_comm);
    /* a poisoned context may have a collective that never completes: abort instead of waiting */
    if (ctx->poisoned) a->comm_abort(comm);
    else if (a->comm_destroy(comm) != ncclSuccess) a->comm_abort(comm);
    cu->nccl_comm = nullptr;
}

fp4rl_status fp4rl_cuda_allreduce(fp4rl_context *ctx, void *buf, int64_t n, fp4rl_reduce_kind kind)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    if (!cu->nccl_comm) return fp4rl_fail(FP4RL_ERR_INTERNAL, "allreduce: the context has no communicator");
    if (n <= 0) return FP4RL_OK;
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    const nccl_api *a = nccl();
    ncclComm_t comm = static_cast<ncclComm_t>(cu->nccl_comm);
    cudaStream_t s = cu->stream;
    ncclResult_t r = ncclSuccess;
    switch (kind) {
    case FP4RL_REDUCE_SUM_F32:
        r = a->all_reduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, comm, s);
        return r == ncclSuccess ? FP4RL_OK : nccl_fail(ctx, r, "allreduce (FP32 gradients)", comm);
    case FP4RL_REDUCE_SUM_F32_BF16: {
        uint16_t *h = nullptr;
        if ((st = fp4rl_cuda_alloc_bytes(ctx, reinterpret_cast<void **>(&h), (size_t)n * sizeof(uint16_t)))) return st;
        to_bf16_k<<<grid_for(n), 256, 0, s>>>(h, static_cast<const float *>(buf), n);
        st = fp4rl_cuda_check_launch(ctx, "allreduce (to BF16)");
        if (!st) {
            r = a->all_reduce(h, h, (size_t)n, ncclBfloat16, ncclSum, comm, s);
            if (r != ncclSuccess) st = nccl_fail(ctx, r, "allreduce (BF16 gradients)", comm);
        }
        if (!st) {
            from_bf16_k<<<grid_for(n), 256, 0, s>>>(static_cast<float *>(buf), h, n);
            st = fp4rl_cuda_check_launch(ctx, "allreduce (from BF16)");
        }
        fp4rl_cuda_free_bytes(ctx, h); /* stream order keeps the block until the kernels are done */
        return st;
    }
    case FP4RL_REDUCE_SUM_F64_HOST:
    case FP4RL_REDUCE_MAX_F64_HOST: {
        const size_t bytes = (size_t)n * sizeof(double);
        double *d = nullptr;
        if ((st = fp4rl_cuda_alloc_bytes(ctx, reinterpret_cast<void **>(&d), bytes))) return st;
        cudaError_t err = cudaMemcpyAsync(d, buf, bytes, cudaMemcpyHostToDevice, s);
        if (err != cudaSuccess) st = fp4rl_cuda_fail(ctx, err, "allreduce (copy to the GPU)");
        if (!st) {
            r = a->all_reduce(d, d, (size_t)n, ncclFloat64, kind == FP4RL_REDUCE_SUM_F64_HOST ? ncclSum : ncclMax, comm, s);
            if (r != ncclSuccess) st = nccl_fail(ctx, r, "allreduce (metrics)", comm);
        }
        if (!st) {
            err = cudaMemcpyAsync(buf, d, bytes, cudaMemcpyDeviceToHost, s);
            if (err == cudaSuccess) err = cudaStreamSynchronize(s);
            if (err != cudaSuccess) st = fp4rl_cuda_fail(ctx, err, "allreduce (copy from the GPU)");
        }
        fp4rl_cuda_free_bytes(ctx, d);
        return st;
    }
    }
    return fp4rl_fail(FP4RL_ERR_INTERNAL, "allreduce: unknown kind %d", (int)kind);
}

#else /* no NCCL at build time: a context never has a communicator */

fp4rl_status fp4rl_cuda_allreduce(fp4rl_context *ctx, void *buf, int64_t n, fp4rl_reduce_kind kind)
{
    (void)ctx; (void)buf; (void)n; (void)kind;
    return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "allreduce: this libfp4rl was built without NCCL");
}

void fp4rl_cuda_comm_destroy(fp4rl_context *ctx) { (void)ctx; }

#endif
