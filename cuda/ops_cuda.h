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

/* The ops (cuda/ops_*.cu); each is documented at its slot in core/backend/ops.h. */
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

#define FP4RL_CUDA_OP(name, ...) fp4rl_status fp4rl_cuda_##name(fp4rl_context *ctx, __VA_ARGS__)
FP4RL_CUDA_OP(embedding_forward, float *out, const int32_t *tokens, const float *wte, int64_t N, int64_t V, int64_t C);
FP4RL_CUDA_OP(embedding_backward, float *dwte, const float *dout, const int32_t *tokens, int64_t N, int64_t V, int64_t C);
FP4RL_CUDA_OP(rmsnorm_forward, float *out, float *rstd, const float *x, const float *weight, int64_t N, int64_t C, float eps);
FP4RL_CUDA_OP(rmsnorm_backward, float *dx, float *dweight, const float *dout, const float *x, const float *weight,
              const float *rstd, int64_t N, int64_t C);
FP4RL_CUDA_OP(linear_forward, float *y, const float *x, const float *w, const float *b, int64_t N, int64_t IN, int64_t OUT);
FP4RL_CUDA_OP(linear_backward, float *dx, float *dw, float *db, const float *dy_dx, const float *w_dx, const float *dy_dw,
              const float *x_dw, const float *dy_db, int64_t N, int64_t IN, int64_t OUT);
FP4RL_CUDA_OP(round_bf16, float *out, const float *x, int64_t n);
FP4RL_CUDA_OP(rope_forward, float *out, const float *x, const int32_t *positions, int64_t N, int64_t H, int64_t D, float theta);
FP4RL_CUDA_OP(rope_backward, float *dx, const float *dout, const int32_t *positions, int64_t N, int64_t H, int64_t D,
              float theta);
FP4RL_CUDA_OP(attention_forward, float *out, float *lse, const float *q, const float *k, const float *v,
              const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, fp4rl_att_numerics nm);
FP4RL_CUDA_OP(attention_backward, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
              const float *v, const float *out, const float *lse, const int32_t *lengths, int64_t B, int64_t T,
              int64_t Hq, int64_t Hkv, int64_t D, fp4rl_att_numerics nm);
FP4RL_CUDA_OP(swiglu_forward, float *out, const float *gate, const float *up, int64_t n);
FP4RL_CUDA_OP(swiglu_backward, float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n);
FP4RL_CUDA_OP(residual_forward, float *out, const float *a, const float *b, int64_t n);
FP4RL_CUDA_OP(residual_backward, float *da, float *db, const float *dout, int64_t n);
FP4RL_CUDA_OP(copy, float *dst, const float *src, int64_t n);
FP4RL_CUDA_OP(sub, float *out, const float *a, const float *b, int64_t n);
FP4RL_CUDA_OP(logprobs_forward, float *logp, float *entropy, float *lse, const float *logits, const int32_t *targets,
              int64_t N, int64_t V);
FP4RL_CUDA_OP(logprobs_backward, float *dlogits, const float *dlogp, const float *dentropy, const float *logits,
              const int32_t *targets, const float *lse, const float *entropy, int64_t N, int64_t V);
FP4RL_CUDA_OP(cross_entropy_forward, float *loss, float *lse, const float *logits, const int32_t *targets,
              const float *mask, int64_t N, int64_t V);
FP4RL_CUDA_OP(cross_entropy_backward, float *dlogits, const float *dloss, const float *logits, const int32_t *targets,
              const float *mask, const float *lse, int64_t N, int64_t V);
FP4RL_CUDA_OP(adamw_update, float *params, const float *grads, float *m, float *v, int64_t n, double lr, double beta1,
              double beta2, double eps, double weight_decay, int64_t t);
FP4RL_CUDA_OP(adamw_check, float *bad, const float *params, const float *grads, const float *m, const float *v, int64_t n,
              double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t);
FP4RL_CUDA_OP(adamw_update_bf16, float *params, const float *grads, uint16_t *m, uint16_t *v, int64_t n, double lr,
              double beta1, double beta2, double eps, double weight_decay, int64_t t, uint64_t seed, uint64_t offset);
FP4RL_CUDA_OP(adamw_check_bf16, float *bad, const float *params, const float *grads, const uint16_t *m, const uint16_t *v,
              int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t, uint64_t seed,
              uint64_t offset);
FP4RL_CUDA_OP(grad_norm, float *norm, const float *g, int64_t n);
FP4RL_CUDA_OP(init_normal, float *dst, int64_t k0, int64_t n, uint64_t seed);
FP4RL_CUDA_OP(grad_clip, float *g, int64_t n, const float *norm, float max_norm);
FP4RL_CUDA_OP(kv_store, void *cache, int kv_bf16, const float *src, const int32_t *rows, int64_t N, int64_t W);
FP4RL_CUDA_OP(attention_rows, float *out, const float *q, const void *kc, const void *vc, int kv_bf16, const int32_t *seg,
              int64_t N, int64_t max_keys, int64_t Hq, int64_t Hkv, int64_t D, fp4rl_att_numerics nm);
FP4RL_CUDA_OP(gather_rows, float *dst, const float *src, const int32_t *idx, int64_t N, int64_t W);
FP4RL_CUDA_OP(resq_mask, float *r, int64_t N, int64_t K, int pattern);
FP4RL_CUDA_OP(sample_rows, int32_t *tokens, float *logp, const float *logits, int64_t B, int64_t V, float temperature,
              int64_t top_k, double top_p, uint64_t seed, uint64_t offset, uint64_t row0, const int32_t *steps,
              const int32_t *rows);
FP4RL_CUDA_OP(nucleus_logprobs_forward, float *logp, float *lse, const float *logits, const int32_t *targets, int64_t N,
              int64_t V, int64_t top_k, double top_p);
FP4RL_CUDA_OP(nucleus_logprobs_backward, float *dlogits, const float *dlogp, const float *logits, const int32_t *targets,
              const float *lse, int64_t N, int64_t V, int64_t top_k, double top_p);
FP4RL_CUDA_OP(underflow_count, float *counts, const float *x, const float *xq, int64_t n);
FP4RL_CUDA_OP(rollout_act, uint16_t *out, unsigned long long *counts, const float *x, int64_t N, int64_t K, int fmt,
              int truncation_free, int resq);
FP4RL_CUDA_OP(qdq_bf16, uint16_t *dst, const float *src, int64_t rows, int64_t cols, int fmt, int truncation_free, int along_rows,
              int stochastic, uint64_t seed, uint64_t offset);
FP4RL_CUDA_OP(linear_forward_bf16, float *y, const uint16_t *x, const uint16_t *w, const float *b, int64_t N, int64_t IN,
              int64_t OUT);
FP4RL_CUDA_OP(pack_bf16, uint16_t *dst, int64_t ld, const float *src, int64_t rows, int64_t cols);
FP4RL_CUDA_OP(linear_backward_bf16, float *dx, float *dw, float *db, const uint16_t *dy_dx, const uint16_t *w_dx,
              const uint16_t *dy_dw, const uint16_t *x_dw, const float *dy_db, int64_t N, int64_t IN, int64_t OUT);
FP4RL_CUDA_OP(scale, float *x, int64_t n, float alpha);
#undef FP4RL_CUDA_OP

/* Makes the device current and returns the context's stream in *s. */
inline fp4rl_status fp4rl_cuda_op_begin(fp4rl_context *ctx, cudaStream_t *s)
{
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    *s = fp4rl_cuda_of(ctx)->stream;
    return st;
}

#endif
