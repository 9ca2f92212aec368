/*
 * ops_rollout_fast.cu - the rollout's fused linear path on the GPU (core/ops.h): the activation
 * operand in one kernel (quantize-dequantize, underflow counts, Rollout-ResQ residual, its fresh
 * quantization and 2:4 mask, BF16 packing), and BF16 packing of the rollout weights. The block
 * arithmetic is qdq_block.h, the function the CPU op calls, so the two agree bit for bit.
 * (linear_forward_bf16 lives in ops_linear.cu, next to the FP32 layer.)
 */
#include "formats.h"
#include "ops_cuda.h"
#include "qdq_block.h"

using namespace fp4rl_cuda_ops_detail;

namespace {

__global__ void act_bf16_k(uint16_t *out, const float *x, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = fp4rl_f32_to_bf16(x[i]);
}

/* One thread per (row, block): BS elements in registers / local memory. */
template <int BS>
__global__ void __launch_bounds__(128) act_qdq_k(uint16_t *out, unsigned long long *counts, const float *x, int64_t N, int64_t K,
                                                 int fmt, int truncation_free, int resq)
{
    const int two = resq == FP4RL_RESQ_DENSE || resq == FP4RL_RESQ_2_4;
    const int64_t nb = (K + BS - 1) / BS, ld = two ? 2 * K : K;
    unsigned long long nz = 0, under = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * nb; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / nb, k0 = (i - n * nb) * BS;
        const int len = (int)(K - k0 < BS ? K - k0 : BS);
        const float *xr = x + n * K + k0;
        float xb[BS], xq[BS];
        for (int j = 0; j < len; j++) xb[j] = xr[j];
        fp4rl_qdq_block(fmt, xb, xq, len, truncation_free);
        uint16_t *o = out + n * ld + k0;
        for (int j = 0; j < len; j++) {
            nz += xb[j] != 0.0f;
            under += xb[j] != 0.0f && xq[j] == 0.0f;
            o[j] = fp4rl_f32_to_bf16(xq[j]);
        }
        if (!two) continue;
        for (int j = 0; j < len; j++) xb[j] -= xq[j];
        fp4rl_qdq_block(fmt, xb, xb, len, truncation_free);
        if (resq == FP4RL_RESQ_2_4)
            for (int j = 0; j < len; j += 4) fp4rl_mask_2_4_group(xb + j, len - j < 4 ? len - j : 4);
        for (int j = 0; j < len; j++) o[K + j] = fp4rl_f32_to_bf16(xb[j]);
    }
    if (!counts) return;
    /* integer sums: exact whatever the order */
    for (int m = 16; m > 0; m >>= 1) {
        nz += __shfl_xor_sync(0xffffffffu, nz, m);
        under += __shfl_xor_sync(0xffffffffu, under, m);
    }
    if ((threadIdx.x & 31) == 0 && (nz || under)) {
        atomicAdd(counts, nz);
        atomicAdd(counts + 1, under);
    }
}

__global__ void pack_bf16_k(uint16_t *dst, int64_t ld, const float *src, int64_t rows, int64_t cols)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i - r * cols;
        dst[r * ld + c] = fp4rl_f32_to_bf16(src[i]);
    }
}

} // namespace

fp4rl_status fp4rl_cuda_rollout_act(fp4rl_context *ctx, uint16_t *out, unsigned long long *counts, const float *x, int64_t N,
                                    int64_t K, int fmt, int truncation_free, int resq)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    if (fmt < 0) {
        act_bf16_k<<<ew_grid(N * K), 256, 0, s>>>(out, x, N * K);
        return fp4rl_cuda_check_launch(ctx, "rollout_act (bf16)");
    }
    const int bs = fp4rl_qdq_block_size(fmt);
    const int64_t work = N * ((K + bs - 1) / bs);
    if (bs == 64) act_qdq_k<64><<<ew_grid(work, 128), 128, 0, s>>>(out, counts, x, N, K, fmt, truncation_free, resq);
    else act_qdq_k<32><<<ew_grid(work, 128), 128, 0, s>>>(out, counts, x, N, K, fmt, truncation_free, resq);
    return fp4rl_cuda_check_launch(ctx, "rollout_act");
}

fp4rl_status fp4rl_cuda_pack_bf16(fp4rl_context *ctx, uint16_t *dst, int64_t ld, const float *src, int64_t rows, int64_t cols)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    pack_bf16_k<<<ew_grid(rows * cols), 256, 0, s>>>(dst, ld, src, rows, cols);
    return fp4rl_cuda_check_launch(ctx, "pack_bf16");
}
