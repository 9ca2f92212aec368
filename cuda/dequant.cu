/*
 * dequant.cu - dequantization on the GPU: each element through the decode function of
 * core/format/formats.h that the CPU reference uses, so F32 outputs are bit-identical and BF16 outputs
 * are the same RNE rounding of the same values.
 */
#include "quant_common.cuh"

using namespace fp4rl_cuda_q;

namespace {

constexpr int THREADS = 256;

struct DArgs {
    const uint8_t *codes;
    const void *scales;
    void *out;
    int64_t R, C, row_bytes, scale_cols, groups_per_row;
    double inv_groups_per_row;
    int tile, block, vec, unscaled;
    float g;
    unsigned *inexact; /* NULL, or a flag set when a BF16 output is not exact */
};

template <int F>
__device__ __forceinline__ float value_at(const DArgs &a, int64_t r, int64_t c)
{
    const uint8_t code = fp4rl_code_get(a.codes, a.row_bytes, traits(F).code_bits, r, c);
    if (F == HIF4)
        return fp4rl_hif4_decode(code, static_cast<const uint32_t *>(a.scales)[fp4rl_hif4_word_index(a.scale_cols, r, c)],
                                 fp4rl_hif4_unit_pos(c));
    const uint8_t s = static_cast<const uint8_t *>(a.scales)[fp4rl_scale_index(a.tile, a.block, a.scale_cols, r, c)];
    if (F == NV) return a.unscaled ? fp4rl_nvfp4_decode_unscaled(code, s) : fp4rl_nvfp4_decode(code, s, a.g);
    return fp4rl_mx_decode(code, s, F == MX8);
}

/* One thread per group of 8 elements of a row. */
template <int F, typename O>
__global__ void __launch_bounds__(THREADS) dequant_kernel(DArgs a)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t r, g;
    split_index(t, a.groups_per_row, a.inv_groups_per_row, r, g);
    const int64_t c0 = g * 8;
    if (r >= a.R) return;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = c0 + j < a.C ? value_at<F>(a, r, c0 + j) : 0.0f;
    O *out = static_cast<O *>(a.out) + r * a.C + c0;
    if (sizeof(O) == 4) {
        float *o = reinterpret_cast<float *>(out);
        if (a.vec) {
            reinterpret_cast<float4 *>(o)[0] = make_float4(v[0], v[1], v[2], v[3]);
            reinterpret_cast<float4 *>(o)[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (c0 + j < a.C) o[j] = v[j];
        }
        return;
    }
    uint16_t h[8];
    unsigned inexact = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        h[j] = fp4rl_f32_to_bf16(v[j]);
        /* NaN never compares equal; it stays NaN in BF16, which is exact enough */
        if (v[j] == v[j] && fp4rl_bf16_to_f32(h[j]) != v[j] && c0 + j < a.C) inexact = 1;
    }
    uint16_t *o = reinterpret_cast<uint16_t *>(out);
    if (a.vec) {
        uint4 w;
        w.x = (uint32_t)h[0] | (uint32_t)h[1] << 16;
        w.y = (uint32_t)h[2] | (uint32_t)h[3] << 16;
        w.z = (uint32_t)h[4] | (uint32_t)h[5] << 16;
        w.w = (uint32_t)h[6] | (uint32_t)h[7] << 16;
        *reinterpret_cast<uint4 *>(o) = w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (c0 + j < a.C) o[j] = h[j];
    }
    if (inexact && a.inexact) atomicOr(a.inexact, 1u);
}

template <typename O>
void launch(const DArgs &a, int fmt, unsigned blocks, cudaStream_t st)
{
    with_format(fmt, [&](auto F) { dequant_kernel<decltype(F)::value, O><<<blocks, THREADS, 0, st>>>(a); });
}

} // namespace

fp4rl_status fp4rl_cuda_dequantize_to(fp4rl_context *ctx, void *out, fp4rl_dtype out_dtype, const fp4rl_tensor *q,
                                      int unscaled, int *inexact)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    const fp4rl_qdesc *d = &q->q;
    DArgs a;
    a.codes = static_cast<const uint8_t *>(q->data);
    a.scales = q->scales;
    a.out = out;
    a.R = d->rows;
    a.C = d->cols;
    a.row_bytes = d->row_bytes;
    a.scale_cols = d->scale_cols;
    a.groups_per_row = (d->cols + 7) / 8;
    a.inv_groups_per_row = 1.0 / (double)a.groups_per_row;
    a.tile = d->tile;
    a.block = d->block;
    a.vec = d->cols % 8 == 0;
    a.unscaled = unscaled;
    a.g = q->tensor_scale;
    a.inexact = NULL;
    const int64_t threads = d->rows * a.groups_per_row;
    if (threads / THREADS >= 0x7fffffffLL) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "dequantize: the tensor is too large for one CUDA launch");
    const unsigned blocks = fp4rl_cuda_blocks(threads, THREADS);
    cudaError_t err;
    if (inexact && out_dtype == FP4RL_DTYPE_BF16) {
        err = cudaMemsetAsync(cu->scratch_dev + 1, 0, sizeof(unsigned), cu->stream);
        if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "dequantize: cudaMemsetAsync");
        a.inexact = cu->scratch_dev + 1;
    }
    if (inexact) *inexact = 0;
    if (threads > 0) {
        if (out_dtype == FP4RL_DTYPE_F32) launch<float>(a, (int)d->dtype, blocks, cu->stream);
        else launch<uint16_t>(a, (int)d->dtype, blocks, cu->stream);
        st = fp4rl_cuda_check_launch(ctx, "dequantize kernel");
        if (st) return st;
    }
    if (a.inexact) {
        err = cudaMemcpyAsync(cu->scratch_host + 1, a.inexact, sizeof(unsigned), cudaMemcpyDeviceToHost, cu->stream);
        if (err == cudaSuccess) err = cudaStreamSynchronize(cu->stream);
        if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "dequantize: reading the exactness flag");
        *inexact = cu->scratch_host[1] != 0;
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cuda_dequantize(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *q, int unscaled)
{
    return fp4rl_cuda_dequantize_to(ctx, out->data, out->dtype, q, unscaled, NULL);
}
