/*
 * ops_optim.cu - AdamW, the global gradient norm and its clipping on the GPU. AdamW is the CPU's
 * element loop (host scalars formed the same way, IEEE sqrt and division, no FMA), so it is
 * bitwise the CPU's. The norm is a two-stage fixed-order double sum (deterministic).
 */
#include <math.h>

#include "ops_cuda.h"

using namespace fp4rl_cuda_ops_detail;

namespace {

__global__ void adamw_k(float *params, const float *grads, float *m, float *v, int64_t n, float decay, float step_size,
                        float bc2_sqrt, float one_m_b1, float b2, float one_m_b2, float epsf)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = grads[i];
        float p = params[i] * decay;
        float mi = m[i], vi = v[i];
        mi += one_m_b1 * (g - mi);
        vi = vi * b2 + one_m_b2 * g * g;
        const float denom = sqrtf(vi) / bc2_sqrt + epsf;
        p -= step_size * (mi / denom);
        params[i] = p;
        m[i] = mi;
        v[i] = vi;
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
    const double bc1 = 1.0 - pow(beta1, (double)t);
    const double bc2 = 1.0 - pow(beta2, (double)t);
    const float decay = (float)(1.0 - lr * weight_decay);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float one_m_b1 = (float)(1.0 - beta1), b2 = (float)beta2, one_m_b2 = (float)(1.0 - beta2);
    adamw_k<<<ew_grid(n), 256, 0, s>>>(params, grads, m, v, n, decay, step_size, bc2_sqrt, one_m_b1, b2, one_m_b2, (float)eps);
    return fp4rl_cuda_check_launch(ctx, "adamw_update");
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
