/*
 * transpose.cu - transposes on the GPU: dense F32/BF16/I32 tensors, and 2D-tiled quantized
 * tensors (a reshuffle of codes and scales; the spec's Q(W)^T == Q(W^T)).
 */
#include "quant_common.cuh"

namespace {

constexpr int TILE = 32, ROWS = 8;

/* Dense: 32 x 32 tiles through shared memory so both the reads and the writes are coalesced. */
template <typename E>
__global__ void __launch_bounds__(TILE * ROWS) transpose_dense_kernel(const E *in, E *out, int64_t R, int64_t C, int64_t tiles_c)
{
    __shared__ E tile[TILE][TILE + 1]; /* +1: the column reads below hit 32 different banks */
    const int64_t by = blockIdx.x / tiles_c, bx = blockIdx.x - by * tiles_c;
    const int64_t c = bx * TILE + threadIdx.x;
    for (int i = threadIdx.y; i < TILE; i += ROWS) {
        const int64_t r = by * TILE + i;
        if (r < R && c < C) tile[i][threadIdx.x] = in[r * C + c];
    }
    __syncthreads();
    const int64_t orow_r = by * TILE + threadIdx.x; /* output column = input row */
    for (int i = threadIdx.y; i < TILE; i += ROWS) {
        const int64_t oc = bx * TILE + i; /* output row = input column */
        if (oc < C && orow_r < R) out[oc * R + orow_r] = tile[threadIdx.x][i];
    }
}

/* Quantized codes: 64 x 64 element tiles. FP4 codes are unpacked to one byte per element in
 * shared memory and repacked along the other axis; elements outside the tensor are 0, which is
 * also what the padding nibble of an odd output row must be. */
template <bool NIBBLES>
__global__ void __launch_bounds__(256) transpose_codes_kernel(const uint8_t *in, uint8_t *out, int64_t R, int64_t C,
                                                              int64_t in_row_bytes, int64_t out_row_bytes, int64_t tiles_c)
{
    __shared__ uint8_t tile[64][65];
    const int64_t by = blockIdx.x / tiles_c, bx = blockIdx.x - by * tiles_c;
    const int64_t r0 = by * 64, c0 = bx * 64;
    constexpr int BPR = NIBBLES ? 32 : 64; /* bytes per tile row */
    for (int i = threadIdx.x; i < 64 * BPR; i += blockDim.x) {
        const int tr = i / BPR, tb = i % BPR;
        const int64_t r = r0 + tr;
        if (NIBBLES) {
            const int64_t c = c0 + 2 * tb;
            uint8_t b = (r < R && c < C) ? in[r * in_row_bytes + c / 2] : (uint8_t)0;
            tile[tr][2 * tb] = b & 0x0f;
            tile[tr][2 * tb + 1] = (c + 1 < C) ? (uint8_t)(b >> 4) : (uint8_t)0;
        } else {
            const int64_t c = c0 + tb;
            tile[tr][tb] = (r < R && c < C) ? in[r * in_row_bytes + c] : (uint8_t)0;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 64 * BPR; i += blockDim.x) {
        const int oc = i / BPR, ob = i % BPR; /* output row (input column), byte in its tile row */
        const int64_t orow = c0 + oc;
        if (orow >= C) continue;
        if (NIBBLES) {
            const int64_t k = r0 / 2 + ob;
            if (k < out_row_bytes) out[orow * out_row_bytes + k] = (uint8_t)(tile[2 * ob][oc] | tile[2 * ob + 1][oc] << 4);
        } else {
            const int64_t k = r0 + ob;
            if (k < out_row_bytes) out[orow * out_row_bytes + k] = tile[ob][oc];
        }
    }
}

/* MX / NVFP4 tile scales: the scale matrix transposes with the tiles. */
__global__ void transpose_scales_kernel(const uint8_t *in, uint8_t *out, int64_t rows, int64_t cols)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * cols) return;
    const int64_t i = t / cols, k = t - i * cols;
    out[k * rows + i] = in[t];
}

/* HiF4 64 x 64 tiles: the word of output row c (input column c), unit v (input rows 64v ..),
 * rebuilt from the input's row words as on the CPU (format/layout.h). */
__global__ void transpose_hif4_words_kernel(const uint32_t *in, uint32_t *out, int64_t R, int64_t U, int64_t orows, int64_t ocols)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= orows * ocols) return;
    const int64_t c = t / ocols, v = t - c * ocols;
    out[t] = fp4rl_hif4_transposed_word(in, R, U, c, v);
}

} // namespace

fp4rl_status fp4rl_cuda_transpose(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *t)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    cudaStream_t s = cu->stream;
    if (fp4rl_dtype_is_dense(t->dtype)) {
        const int64_t R = t->dims[0], C = t->dims[1], tc = (C + TILE - 1) / TILE, blocks = ((R + TILE - 1) / TILE) * tc;
        if (blocks > 0x7fffffffLL) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "fp4rl_tensor_transpose: the tensor is too large for one CUDA launch");
        const dim3 threads(TILE, ROWS);
        if (t->dtype == FP4RL_DTYPE_BF16)
            transpose_dense_kernel<<<(unsigned)blocks, threads, 0, s>>>(static_cast<const uint16_t *>(t->data), static_cast<uint16_t *>(out->data), R, C, tc);
        else
            transpose_dense_kernel<<<(unsigned)blocks, threads, 0, s>>>(static_cast<const uint32_t *>(t->data), static_cast<uint32_t *>(out->data), R, C, tc);
        return fp4rl_cuda_check_launch(ctx, "fp4rl_tensor_transpose: dense kernel");
    }
    const fp4rl_qdesc *d = &t->q, *od = &out->q;
    const int64_t tc = (d->cols + 63) / 64, blocks = ((d->rows + 63) / 64) * tc;
    if (blocks > 0x7fffffffLL) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "fp4rl_tensor_transpose: the tensor is too large for one CUDA launch");
    const uint8_t *ic = static_cast<const uint8_t *>(t->data);
    uint8_t *oc = static_cast<uint8_t *>(out->data);
    if (fp4rl_format_of(d->dtype).code_bits == 8)
        transpose_codes_kernel<false><<<(unsigned)blocks, 256, 0, s>>>(ic, oc, d->rows, d->cols, d->row_bytes, od->row_bytes, tc);
    else
        transpose_codes_kernel<true><<<(unsigned)blocks, 256, 0, s>>>(ic, oc, d->rows, d->cols, d->row_bytes, od->row_bytes, tc);
    st = fp4rl_cuda_check_launch(ctx, "fp4rl_tensor_transpose: codes kernel");
    if (st) return st;
    if (fp4rl_format_of(d->dtype).scale_kind == FP4RL_SCALE_KIND_HIF4_WORD) {
        const int64_t n = od->scale_rows * od->scale_cols;
        transpose_hif4_words_kernel<<<fp4rl_cuda_blocks(n, 256), 256, 0, s>>>(static_cast<const uint32_t *>(t->scales),
                                                                             static_cast<uint32_t *>(out->scales), d->rows,
                                                                             d->scale_cols, od->scale_rows, od->scale_cols);
    } else {
        const int64_t n = d->scale_rows * d->scale_cols;
        transpose_scales_kernel<<<fp4rl_cuda_blocks(n, 256), 256, 0, s>>>(static_cast<const uint8_t *>(t->scales),
                                                                         static_cast<uint8_t *>(out->scales), d->scale_rows, d->scale_cols);
    }
    st = fp4rl_cuda_check_launch(ctx, "fp4rl_tensor_transpose: scales kernel");
    out->tensor_scale = t->tensor_scale;
    return st;
}
