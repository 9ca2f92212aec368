/*
 * ops_norm.cu - RMSNorm on the GPU: one block per row, the sum of squares in double (a fixed
 * tree, so run-to-run deterministic; it can differ from the CPU's serial double sum only in the
 * last bits of a double), the elementwise parts in the CPU's float order. dweight is a separate
 * column kernel, serial over the rows like the CPU (bitwise the CPU's sums).
 */
#include "ops_cuda.h"

using namespace fp4rl_cuda_ops_detail;

namespace {

/* One block a row. EPT > 0: the row is read once into registers (element c = tid + k * RED_THREADS
 * in v[k], all loads issued before the first use) and the output computed from them; EPT == 0:
 * any C, re-reading the row (or its sum) for the output. Both sum each thread's squares in
 * increasing c and then block_sum, so the two are bit-identical. With b (residual_rmsnorm) the
 * row is first a + b, written to sum (which may alias a or b: each thread reads its own elements
 * before it writes them). */
template <int EPT>
__global__ void __launch_bounds__(RED_THREADS) rmsnorm_fwd_k(float *out, float *rstd, const float *x, const float *weight, int64_t C,
                                                             float eps, const float *b, float *sum)
{
    __shared__ double sh[RED_THREADS];
    const int64_t n = blockIdx.x;
    const float *xr = x + n * C;
    float *o = out + n * C;
    double ss = 0.0;
    if constexpr (EPT > 0) {
        float v[EPT];
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t c = threadIdx.x + (int64_t)k * RED_THREADS;
            v[k] = c < C ? (b ? xr[c] + b[n * C + c] : xr[c]) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t c = threadIdx.x + (int64_t)k * RED_THREADS;
            if (c < C) {
                if (b) sum[n * C + c] = v[k];
                ss += (double)v[k] * v[k];
            }
        }
        ss = block_sum(ss, sh);
        const float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
#pragma unroll
        for (int k = 0; k < EPT; k++) {
            const int64_t c = threadIdx.x + (int64_t)k * RED_THREADS;
            if (c < C) o[c] = (v[k] * r) * weight[c];
        }
        if (threadIdx.x == 0) rstd[n] = r;
        return;
    }
    if (b) {
        const float *br = b + n * C;
        float *sr = sum + n * C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            const float v = xr[c] + br[c];
            sr[c] = v;
            ss += (double)v * v;
        }
        xr = sr;
    } else {
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += (double)xr[c] * xr[c];
    }
    ss = block_sum(ss, sh);
    const float r = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = (xr[c] * r) * weight[c];
    if (threadIdx.x == 0) rstd[n] = r;
}

/* The smallest register tile that holds a row of C, else the re-reading form. In place (out == x,
 * or sum == a) stays correct: a thread reads its own elements before it writes them. */
static void rmsnorm_launch(cudaStream_t s, float *out, float *rstd, const float *x, const float *weight, int64_t N, int64_t C,
                           float eps, const float *b, float *sum)
{
    const unsigned g = (unsigned)N;
    if (C <= 4 * RED_THREADS) rmsnorm_fwd_k<4><<<g, RED_THREADS, 0, s>>>(out, rstd, x, weight, C, eps, b, sum);
    else if (C <= 8 * RED_THREADS) rmsnorm_fwd_k<8><<<g, RED_THREADS, 0, s>>>(out, rstd, x, weight, C, eps, b, sum);
    else if (C <= 16 * RED_THREADS) rmsnorm_fwd_k<16><<<g, RED_THREADS, 0, s>>>(out, rstd, x, weight, C, eps, b, sum);
    else rmsnorm_fwd_k<0><<<g, RED_THREADS, 0, s>>>(out, rstd, x, weight, C, eps, b, sum);
}

__global__ void __launch_bounds__(RED_THREADS) rmsnorm_bwd_dx_k(float *dx, const float *dout, const float *x, const float *weight,
                                                                const float *rstd, int64_t C)
{
    __shared__ double sh[RED_THREADS];
    const int64_t n = blockIdx.x;
    const float *xr = x + n * C, *d = dout + n * C;
    float *dxr = dx + n * C;
    const float r = rstd[n];
    double gx = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) gx += (double)(d[c] * weight[c]) * (xr[c] * r);
    gx = block_sum(gx, sh);
    const float mean_gx = (float)(gx / (double)C);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float xhat = xr[c] * r;
        dxr[c] += r * (d[c] * weight[c] - xhat * mean_gx);
    }
}

/* the dweight term of row n, column c */
struct RmsDw {
    const float *dout, *x, *rstd;
    int64_t C;
    __device__ float operator()(int64_t n, int64_t c) const { return dout[n * C + c] * (x[n * C + c] * rstd[n]); }
};

} // namespace

fp4rl_status fp4rl_cuda_rmsnorm_forward(fp4rl_context *ctx, float *out, float *rstd, const float *x, const float *weight,
                                        int64_t N, int64_t C, float eps)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    rmsnorm_launch(s, out, rstd, x, weight, N, C, eps, nullptr, nullptr);
    return fp4rl_cuda_check_launch(ctx, "rmsnorm_forward");
}

fp4rl_status fp4rl_cuda_residual_rmsnorm(fp4rl_context *ctx, float *sum, float *out, float *rstd, const float *a, const float *b,
                                         const float *weight, int64_t N, int64_t C, float eps)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    rmsnorm_launch(s, out, rstd, a, weight, N, C, eps, b, sum);
    return fp4rl_cuda_check_launch(ctx, "residual_rmsnorm");
}

fp4rl_status fp4rl_cuda_rmsnorm_backward(fp4rl_context *ctx, float *dx, float *dweight, const float *dout, const float *x,
                                         const float *weight, const float *rstd, int64_t N, int64_t C)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    rmsnorm_bwd_dx_k<<<(unsigned)N, RED_THREADS, 0, s>>>(dx, dout, x, weight, rstd, C);
    if ((st = fp4rl_cuda_check_launch(ctx, "rmsnorm_backward (dx)"))) return st;
    if (dweight) {
        st = colsum(ctx, s, dweight, N, C, RmsDw{dout, x, rstd, C}, "rmsnorm_backward (dweight)");
    }
    return st;
}
