/*
 * ops_cuda.h - the CUDA backend's op table (core/backend/ops.h) and what its files (cuda/ops_*.cu) share.
 * Every op runs on the context's stream with plain, deterministic kernels (one block per row for
 * reductions, fixed-order sums in the CPU's precision), and checks its launches.
 */
#ifndef FP4RL_OPS_CUDA_H
#define FP4RL_OPS_CUDA_H

#include "cuda_internal.h"
#include "backend/ops.h"

extern "C" const fp4rl_ops fp4rl_cuda_ops;

namespace fp4rl_cuda_ops_detail {

constexpr int RED_THREADS = 256; /* threads of the row-reduction kernels (a power of two) */

/* Grid of a grid-stride elementwise kernel: enough blocks for n, capped (the loops stride). */
inline unsigned ew_grid(int64_t n, int threads = 256)
{
    int64_t b = (n + threads - 1) / threads;
    if (b > 65535 * 16) b = 65535 * 16;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Block-wide sum of one double per thread, a fixed tree (the same order every run). All threads
 * of the block must call it; `sh` holds blockDim.x doubles. Returns the total to every thread. */
__device__ inline double block_sum(double v, double *sh)
{
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        __syncthreads();
    }
    const double r = sh[0];
    __syncthreads();
    return r;
}

/* Block-wide max of one float per thread (order-independent). `sh` holds blockDim.x floats. */
__device__ inline float block_max(float v, float *sh)
{
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] = fmaxf(sh[t], sh[t + s]);
        __syncthreads();
    }
    const float r = sh[0];
    __syncthreads();
    return r;
}

/* exp, pow, cos, sin of binary32 arguments, correctly rounded to binary32 in all but rare
 * double-rounding cases: through double, so they agree with the C library's (nearly correctly
 * rounded) expf / powf / cosf / sinf that the CPU ops use, where CUDA's own are 1-2 ulp off. */
__device__ __forceinline__ float expf_cr(float x) { return (float)exp((double)x); }
__device__ __forceinline__ float powf_cr(float x, float y) { return (float)pow((double)x, (double)y); }
__device__ __forceinline__ float cosf_cr(float x) { return (float)cos((double)x); }
__device__ __forceinline__ float sinf_cr(float x) { return (float)sin((double)x); }
/* SwiGLU's element, silu(g) * u with silu(g) = g * sigmoid(g): the CPU's expression (swiglu_forward,
 * swiglu_rows and the rollout's fused swiglu_act share it). */
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf_cr(-x)); }
__device__ __forceinline__ float swiglu1(float g, float u) { return g * sigmoid(g) * u; }

/* Column sums acc[c] += sum_{n < N} f(n, c), deterministic and parallel over rows: chunks of
 * COLSUM_ROWS rows summed serially (one thread per chunk and column, coalesced over columns), then
 * the chunks in order. The rounding differs from a serial sum over all rows by the order only.
 * f is a functor: float operator()(int64_t n, int64_t c) const. */
constexpr int64_t COLSUM_ROWS = 64;
template <typename F> __global__ void colsum_partial_k(float *part, int64_t N, int64_t C, F f)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, chunk = blockIdx.y;
    if (c >= C) return;
    const int64_t n0 = chunk * COLSUM_ROWS, n1 = n0 + COLSUM_ROWS < N ? n0 + COLSUM_ROWS : N;
    float a = 0.0f;
    for (int64_t n = n0; n < n1; n++) a += f(n, c);
    part[chunk * C + c] = a;
}
__global__ void colsum_finish_k(float *acc, const float *part, int64_t chunks, int64_t C);
template <typename F> fp4rl_status colsum(fp4rl_context *ctx, cudaStream_t s, float *acc, int64_t N, int64_t C, F f, const char *what)
{
    const int64_t chunks = (N + COLSUM_ROWS - 1) / COLSUM_ROWS;
    if (chunks < 1) return FP4RL_OK;
    void *part = NULL;
    fp4rl_status st = fp4rl_cuda_alloc_bytes(ctx, &part, (size_t)(chunks * C) * sizeof(float));
    if (st) return st;
    const dim3 grid(fp4rl_cuda_blocks(C, 128), (unsigned)chunks);
    colsum_partial_k<F><<<grid, 128, 0, s>>>(static_cast<float *>(part), N, C, f);
    colsum_finish_k<<<fp4rl_cuda_blocks(C, 128), 128, 0, s>>>(acc, static_cast<const float *>(part), chunks, C);
    st = fp4rl_cuda_check_launch(ctx, what);
    fp4rl_cuda_free_bytes(ctx, part);
    return st;
}

} // namespace fp4rl_cuda_ops_detail

/* The ops (cuda/ops_*.cu); each is documented at its entry in core/backend/ops_list.h. */
/* The tiled training attention (ops_attention_tiled.cu) for the head dims and grids it covers. */
int fp4rl_cuda_attention_tiled_ok(int64_t B, int64_t Hq, int64_t D);
/* The BF16-numerics training attention on the tensor cores (ops_attention_gemm.cu), for head dims
 * it covers (fp4rl_cuda_attention_gemm_ok); others run the per-row kernels in BF16 numerics. */
int fp4rl_cuda_attention_gemm_ok(int64_t D);
fp4rl_status fp4rl_cuda_attention_forward_gemm(fp4rl_context *ctx, cudaStream_t s, float *out, float *lse, const float *q, const float *k,
                                               const float *v, const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                               int64_t D, float scale);
fp4rl_status fp4rl_cuda_attention_backward_gemm(fp4rl_context *ctx, cudaStream_t s, float *dq, float *dk, float *dv, const float *dout,
                                                const float *q, const float *k, const float *v, const float *out, const float *lse,
                                                const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                                                float scale);
fp4rl_status fp4rl_cuda_attention_forward_tiled(fp4rl_context *ctx, cudaStream_t s, float *out, float *lse, const float *q, const float *k,
                                                const float *v, const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                                int64_t D, float scale);
fp4rl_status fp4rl_cuda_attention_backward_tiled(fp4rl_context *ctx, cudaStream_t s, float *dq, float *dk, float *dv, const float *dout,
                                                 const float *q, const float *k, const float *v, const float *out, const float *lse,
                                                 const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                                                 float scale);

/* fp4rl_cuda_<op> for every op of core/backend/ops_list.h: a definition of another signature does
 * not compile. */
#define FP4RL_OP(ret, op, params) ret fp4rl_cuda_##op params;
#include "backend/ops_list.h"

/* Makes the device current and returns the context's stream in *s. */
inline fp4rl_status fp4rl_cuda_op_begin(fp4rl_context *ctx, cudaStream_t *s)
{
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    *s = fp4rl_cuda_of(ctx)->stream;
    return st;
}

#endif
