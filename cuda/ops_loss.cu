/*
 * ops_loss.cu - the GPU twin of core/cpu/ops_loss.c: token log-probs and entropy, masked cross-entropy. One
 * block per row of logits; the row max is exact, the sums of exponentials run in double over a
 * fixed tree (deterministic; equal to the CPU's serial double sums up to the last bits of a
 * double). Per-element backward terms are the CPU's float expressions.
 */
#include <math.h>

#include "ops_cuda.h"

using namespace fp4rl_cuda_ops_detail;

namespace {

__device__ __forceinline__ bool target_ok(int32_t t, int64_t V) { return t >= 0 && t < V; }

/* logsumexp of row x (all threads of the block call it) */
__device__ float row_lse(const float *x, int64_t V, float *shf, double *shd)
{
    float m = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
    m = block_max(m, shf);
    double sum = 0.0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += exp((double)x[v] - (double)m);
    sum = block_sum(sum, shd);
    return (float)((double)m + log(sum));
}

__global__ void __launch_bounds__(RED_THREADS) logprobs_fwd_k(float *logp, float *entropy, float *lse, const float *logits,
                                                              const int32_t *targets, int64_t V)
{
    __shared__ float shf[RED_THREADS];
    __shared__ double shd[RED_THREADS];
    const int64_t n = blockIdx.x;
    const float *x = logits + n * V;
    const float l = row_lse(x, V, shf, shd);
    if (entropy) {
        double h = 0.0;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
            const double lp = (double)x[v] - (double)l;
            h -= exp(lp) * lp;
        }
        h = block_sum(h, shd);
        if (threadIdx.x == 0) entropy[n] = (float)h;
    }
    if (threadIdx.x == 0) {
        lse[n] = l;
        const int32_t t = targets[n];
        logp[n] = target_ok(t, V) ? x[t] - l : 0.0f;
    }
}

__global__ void logprobs_bwd_k(float *dlogits, const float *dlogp, const float *dentropy, const float *logits,
                               const int32_t *targets, const float *lse, const float *entropy, int64_t N, int64_t V)
{
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const int32_t t = targets[n];
    const float gl = (dlogp && target_ok(t, V)) ? dlogp[n] : 0.0f;
    const float gh = dentropy ? dentropy[n] : 0.0f;
    const float h = dentropy ? entropy[n] : 0.0f;
    const float l = lse[n];
    const float *x = logits + n * V;
    float *dx = dlogits + n * V;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < V; v += (int64_t)gridDim.x * blockDim.x) {
        const float lp = x[v] - l;
        const float p = expf_cr(lp);
        float g = -gl * p - gh * p * (lp + h);
        if (v == t) g += gl;
        dx[v] += g;
    }
    }
}

__device__ __forceinline__ float ce_weight(const int32_t *targets, const float *mask, int64_t n, int64_t V)
{
    if (!target_ok(targets[n], V)) return 0.0f;
    return mask ? mask[n] : 1.0f;
}

__global__ void __launch_bounds__(RED_THREADS) ce_lse_k(float *lse, const float *logits, int64_t V)
{
    __shared__ float shf[RED_THREADS];
    __shared__ double shd[RED_THREADS];
    const int64_t n = blockIdx.x;
    const float l = row_lse(logits + n * V, V, shf, shd);
    if (threadIdx.x == 0) lse[n] = l;
}

/* One block: total and count of the masked mean (fixed order). loss may be NULL (count only). */
__global__ void __launch_bounds__(RED_THREADS) ce_total_k(float *loss, double *count_out, const float *lse, const float *logits,
                                                          const int32_t *targets, const float *mask, int64_t N, int64_t V)
{
    __shared__ double shd[RED_THREADS];
    double total = 0.0, count = 0.0;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        const float w = ce_weight(targets, mask, n, V);
        count += w;
        if (loss && w != 0.0f) total += (double)w * ((double)lse[n] - (double)logits[n * V + targets[n]]);
    }
    count = block_sum(count, shd);
    total = block_sum(total, shd);
    if (threadIdx.x == 0) {
        if (loss) loss[0] = count > 0.0 ? (float)(total / count) : 0.0f;
        if (count_out) count_out[0] = count;
    }
}

__global__ void ce_bwd_k(float *dlogits, const float *dloss, const float *logits, const int32_t *targets, const float *mask,
                         const float *lse, const double *count_p, int64_t N, int64_t V)
{
    const double count = count_p[0];
    if (!(count > 0.0)) return;
    for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const float w = ce_weight(targets, mask, n, V);
    if (w == 0.0f) continue;
    const float coef = (float)((double)dloss[0] * w / count);
    const float *x = logits + n * V;
    float *dx = dlogits + n * V;
    const int32_t t = targets[n];
    const float l = lse[n];
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < V; v += (int64_t)gridDim.x * blockDim.x) {
        const float p = expf_cr(x[v] - l);
        dx[v] += coef * (p - (v == t ? 1.0f : 0.0f));
    }
    }
}

/* grid of a row-wise elementwise kernel: x covers V, y the rows */
dim3 row_grid(int64_t N, int64_t V)
{
    int64_t bx = (V + 255) / 256;
    if (bx > 1024) bx = 1024;
    return dim3((unsigned)bx, (unsigned)(N < 65535 ? N : 65535));
}

} // namespace

fp4rl_status fp4rl_cuda_logprobs_forward(fp4rl_context *ctx, float *logp, float *entropy, float *lse, const float *logits,
                                         const int32_t *targets, int64_t N, int64_t V)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    logprobs_fwd_k<<<(unsigned)N, RED_THREADS, 0, s>>>(logp, entropy, lse, logits, targets, V);
    return fp4rl_cuda_check_launch(ctx, "logprobs_forward");
}

fp4rl_status fp4rl_cuda_logprobs_backward(fp4rl_context *ctx, float *dlogits, const float *dlogp, const float *dentropy,
                                          const float *logits, const int32_t *targets, const float *lse, const float *entropy,
                                          int64_t N, int64_t V)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    logprobs_bwd_k<<<row_grid(N, V), 256, 0, s>>>(dlogits, dlogp, dentropy, logits, targets, lse, entropy, N, V);
    return fp4rl_cuda_check_launch(ctx, "logprobs_backward");
}

fp4rl_status fp4rl_cuda_cross_entropy_forward(fp4rl_context *ctx, float *loss, float *lse, const float *logits,
                                              const int32_t *targets, const float *mask, int64_t N, int64_t V)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    ce_lse_k<<<(unsigned)N, RED_THREADS, 0, s>>>(lse, logits, V);
    if ((st = fp4rl_cuda_check_launch(ctx, "cross_entropy_forward (lse)"))) return st;
    ce_total_k<<<1, RED_THREADS, 0, s>>>(loss, NULL, lse, logits, targets, mask, N, V);
    return fp4rl_cuda_check_launch(ctx, "cross_entropy_forward (mean)");
}

fp4rl_status fp4rl_cuda_cross_entropy_backward(fp4rl_context *ctx, float *dlogits, const float *dloss, const float *logits,
                                               const int32_t *targets, const float *mask, const float *lse, int64_t N,
                                               int64_t V)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    void *count = NULL;
    if ((st = fp4rl_cuda_alloc_bytes(ctx, &count, sizeof(double)))) return st;
    ce_total_k<<<1, RED_THREADS, 0, s>>>(NULL, static_cast<double *>(count), lse, logits, targets, mask, N, V);
    st = fp4rl_cuda_check_launch(ctx, "cross_entropy_backward (count)");
    if (!st) {
        ce_bwd_k<<<row_grid(N, V), 256, 0, s>>>(dlogits, dloss, logits, targets, mask, lse, static_cast<const double *>(count), N, V);
        st = fp4rl_cuda_check_launch(ctx, "cross_entropy_backward");
    }
    fp4rl_cuda_free_bytes(ctx, count);
    return st;
}
