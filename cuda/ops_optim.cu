/*
 * ops_optim.cu - AdamW (FP32 or BF16 moments) and its dry run, the global gradient norm and its clipping on the GPU.
 * AdamW is core/backend/adamw_math.h's element step, as on the CPU (IEEE sqrt and division, no
 * FMA), so it is bitwise the CPU's. The norm is a two-stage fixed-order double sum (deterministic).
 */
#include <math.h>

#include "backend/adamw_math.h"
#include "backend/init_math.h"
#include "ops_cuda.h"

using namespace fp4rl_cuda_ops_detail;

namespace {

__global__ void adamw_k(float *params, const float *grads, float *m, float *v, int64_t n, fp4rl_adamw_k k)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float p = params[i], mi = m[i], vi = v[i];
        fp4rl_adamw_elem(&k, grads[i], &p, &mi, &vi);
        params[i] = p;
        m[i] = mi;
        v[i] = vi;
    }
}

/* bad[0] (zeroed before) = 1 where some element's update is non-finite; every writer writes 1 */
__global__ void adamw_check_k(float *bad, const float *params, const float *grads, const float *m, const float *v, int64_t n,
                              fp4rl_adamw_k k)
{
    int any = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        any |= fp4rl_adamw_elem_bad(&k, grads[i], params[i], m[i], v[i]);
    if (__syncthreads_or(any) && threadIdx.x == 0) bad[0] = 1.0f;
}

/* the same with BF16 moments (adamw_math.h: the FP32 step, then stochastic rounding of m and v) */
__global__ void adamw_bf16_k(float *params, const float *grads, uint16_t *m, uint16_t *v, int64_t n, fp4rl_adamw_k k,
                             uint64_t seed, uint64_t offset)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float p = params[i];
        uint16_t mi = m[i], vi = v[i];
        fp4rl_adamw_elem_bf16(&k, grads[i], &p, &mi, &vi, seed, offset, (uint64_t)i);
        params[i] = p;
        m[i] = mi;
        v[i] = vi;
    }
}

__global__ void adamw_check_bf16_k(float *bad, const float *params, const float *grads, const uint16_t *m, const uint16_t *v,
                                   int64_t n, fp4rl_adamw_k k, uint64_t seed, uint64_t offset)
{
    int any = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        any |= fp4rl_adamw_elem_bf16_bad(&k, grads[i], params[i], m[i], v[i], seed, offset, (uint64_t)i);
    if (__syncthreads_or(any) && threadIdx.x == 0) bad[0] = 1.0f;
}

/* one thread per element pair of the parameter */
__global__ void init_normal_k(float *dst, int64_t k0, int64_t n, uint64_t seed)
{
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; 2 * t < n; t += (int64_t)gridDim.x * blockDim.x) {
        float a, b;
        fp4rl_init_normal_pair(seed, (uint64_t)(k0 + 2 * t), &a, &b);
        dst[2 * t] = a;
        if (2 * t + 1 < n) dst[2 * t + 1] = b;
    }
}

constexpr int NORM_BLOCKS = 512;

/* Stage 1: block b sums the squares of its fixed grid-stride share into partial[b]. */
__global__ void __launch_bounds__(RED_THREADS) sumsq_k(double *partial, const float *g, int64_t n)
{
    __shared__ double sh[RED_THREADS];
    double ss = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        ss += (double)g[i] * g[i];
    ss = block_sum(ss, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = ss;
}
/* Stage 2: one block sums the partials. */
__global__ void __launch_bounds__(RED_THREADS) norm_final_k(float *norm, const double *partial, int np)
{
    __shared__ double sh[RED_THREADS];
    double ss = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x) ss += partial[i];
    ss = block_sum(ss, sh);
    if (threadIdx.x == 0) norm[0] = (float)sqrt(ss);
}

__global__ void clip_k(float *g, int64_t n, const float *norm, float max_norm)
{
    const float coef = max_norm / (norm[0] + 1e-6f);
    if (coef >= 1.0f) return; /* as the CPU: a NaN norm scales (poisons) the gradients */
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) g[i] *= coef;
}

} // namespace

fp4rl_status fp4rl_cuda_adamw_update(fp4rl_context *ctx, float *params, const float *grads, float *m, float *v, int64_t n,
                                     double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    const fp4rl_adamw_k k = fp4rl_adamw_constants(lr, beta1, beta2, eps, weight_decay, t);
    adamw_k<<<ew_grid(n), 256, 0, s>>>(params, grads, m, v, n, k);
    return fp4rl_cuda_check_launch(ctx, "adamw_update");
}

fp4rl_status fp4rl_cuda_adamw_check(fp4rl_context *ctx, float *bad, const float *params, const float *grads, const float *m,
                                    const float *v, int64_t n, double lr, double beta1, double beta2, double eps,
                                    double weight_decay, int64_t t)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    if (cudaMemsetAsync(bad, 0, sizeof(float), s) != cudaSuccess) return fp4rl_cuda_check_launch(ctx, "adamw_check (zero)");
    const fp4rl_adamw_k k = fp4rl_adamw_constants(lr, beta1, beta2, eps, weight_decay, t);
    adamw_check_k<<<ew_grid(n), 256, 0, s>>>(bad, params, grads, m, v, n, k);
    return fp4rl_cuda_check_launch(ctx, "adamw_check");
}

fp4rl_status fp4rl_cuda_adamw_update_bf16(fp4rl_context *ctx, float *params, const float *grads, uint16_t *m, uint16_t *v,
                                          int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay,
                                          int64_t t, uint64_t seed, uint64_t offset)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    const fp4rl_adamw_k k = fp4rl_adamw_constants(lr, beta1, beta2, eps, weight_decay, t);
    adamw_bf16_k<<<ew_grid(n), 256, 0, s>>>(params, grads, m, v, n, k, seed, offset);
    return fp4rl_cuda_check_launch(ctx, "adamw_update_bf16");
}

fp4rl_status fp4rl_cuda_adamw_check_bf16(fp4rl_context *ctx, float *bad, const float *params, const float *grads,
                                         const uint16_t *m, const uint16_t *v, int64_t n, double lr, double beta1,
                                         double beta2, double eps, double weight_decay, int64_t t, uint64_t seed,
                                         uint64_t offset)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    if (cudaMemsetAsync(bad, 0, sizeof(float), s) != cudaSuccess) return fp4rl_cuda_check_launch(ctx, "adamw_check_bf16 (zero)");
    const fp4rl_adamw_k k = fp4rl_adamw_constants(lr, beta1, beta2, eps, weight_decay, t);
    adamw_check_bf16_k<<<ew_grid(n), 256, 0, s>>>(bad, params, grads, m, v, n, k, seed, offset);
    return fp4rl_cuda_check_launch(ctx, "adamw_check_bf16");
}

fp4rl_status fp4rl_cuda_init_normal(fp4rl_context *ctx, float *dst, int64_t k0, int64_t n, uint64_t seed)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    init_normal_k<<<ew_grid((n + 1) / 2), 256, 0, s>>>(dst, k0, n, seed);
    return fp4rl_cuda_check_launch(ctx, "init_normal");
}

fp4rl_status fp4rl_cuda_grad_norm(fp4rl_context *ctx, float *norm, const float *g, int64_t n)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    void *partial = NULL;
    if ((st = fp4rl_cuda_alloc_bytes(ctx, &partial, NORM_BLOCKS * sizeof(double)))) return st;
    sumsq_k<<<NORM_BLOCKS, RED_THREADS, 0, s>>>(static_cast<double *>(partial), g, n);
    st = fp4rl_cuda_check_launch(ctx, "grad_norm (partial sums)");
    if (!st) {
        norm_final_k<<<1, RED_THREADS, 0, s>>>(norm, static_cast<const double *>(partial), NORM_BLOCKS);
        st = fp4rl_cuda_check_launch(ctx, "grad_norm (total)");
    }
    fp4rl_cuda_free_bytes(ctx, partial); /* stream order keeps a reuse after the kernels */
    return st;
}

fp4rl_status fp4rl_cuda_grad_clip(fp4rl_context *ctx, float *g, int64_t n, const float *norm, float max_norm)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    clip_k<<<ew_grid(n), 256, 0, s>>>(g, n, norm, max_norm);
    return fp4rl_cuda_check_launch(ctx, "grad_clip");
}
