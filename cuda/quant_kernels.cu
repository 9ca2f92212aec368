/*
 * quant_kernels.cu - quantization on the GPU, bit-identical to core/cpu/cpu_quant.c.
 *
 * Both backends call the same element and scale functions of core/format/formats.h; what differs is only
 * how the work is spread. A block's scale depends on its max magnitude and whether it holds a
 * non-finite value; max and "all finite" are exact and order-free, so any reduction order gives
 * the CPU's scale, and from there each element's code is the same function of the same inputs.
 *
 * One pass over the source: each thread loads a "group" (8 consecutive elements of a row) into
 * registers, the threads of a block (1D) or tile (2D) reduce their maxima (warp shuffles, then
 * shared memory for tiles that span warps), and each thread encodes its own elements. NVFP4 also
 * needs the tensor-wide amax before any block scale, which costs one extra read of the source.
 */
#include "quant_common.cuh"

using namespace fp4rl_cuda_q;

namespace {

constexpr unsigned FULL = 0xffffffffu;
constexpr int THREADS = 256;

/* ---- the tensor-wide finite amax (NVFP4) -------------------------------------------------- */
template <typename S>
__global__ void __launch_bounds__(THREADS) amax_kernel(const S *src, int64_t n, unsigned *out)
{
    float m = 0.0f;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x * 8;
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i < n; i += stride) {
        float x[8];
        /* the tensor viewed as one row of n elements: vector loads when n % 8 == 0 */
        load8(src, 1, n, 0, i, (n % 8) == 0, x);
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (fp4rl_is_finite(x[j])) m = fmaxf(m, fabsf(x[j]));
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) m = warp_max_xor(m, o);
    /* non-negative floats order like their bit patterns, so an integer max is a float max */
    if ((threadIdx.x & 31) == 0 && m > 0.0f) atomicMax(out, __float_as_uint(m));
}

/* ---- 1D blocks: MX (32), NVFP4 (16), HiF4 units (64) along rows ---------------------------- */
template <int F>
struct Lanes { static constexpr int value = traits(F).block / 8; }; /* groups per block */

template <int F, typename S>
__global__ void __launch_bounds__(THREADS) quant1d_kernel(QArgs a)
{
    constexpr int L = Lanes<F>::value;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t r, g;
    split_index(t, a.groups_per_row, a.inv_groups_per_row, r, g);
    const int64_t c0 = g * 8;
    float x[8];
    load8(static_cast<const S *>(a.src), a.R, a.C, r, c0, a.vec, x);

    /* maxima: of the two 4-element halves (HiF4's micro-blocks), the group, the block */
    float m4[2] = {0.0f, 0.0f};
    unsigned finite = 1;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (!fp4rl_is_finite(x[j])) finite = 0;
        else m4[j / 4] = fmaxf(m4[j / 4], fabsf(x[j]));
    }
    const float m8 = fmaxf(m4[0], m4[1]);
    float amax = m8;
#pragma unroll
    for (int o = 1; o < L; o <<= 1) {
        amax = warp_max_xor(amax, o);
        finite &= __shfl_xor_sync(FULL, finite, o);
    }

    float u[8] = {-1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f};
    if (a.stochastic && r < a.R && c0 < a.C) uniforms8(a.seed, a.offset, (uint64_t)(r * a.C + c0), a.quad, u);
    uint8_t code[8];

    if (F == HIF4) {
        const int h = (int)(g % 8); /* the group's 8-element sub-block inside its unit */
        uint32_t word = FP4RL_HIF4_NAN_WORD, bits = 0;
        fp4rl_hif4_base b = {0, 0.0f, 0.0f};
        uint32_t e8 = 0, e16[2] = {0, 0};
        if (finite) {
            b = fp4rl_hif4_make_base(amax);
            e8 = fp4rl_hif4_e8(m8, b.rec);
            e16[0] = fp4rl_hif4_e16(m4[0], e8, b.rec);
            e16[1] = fp4rl_hif4_e16(m4[1], e8, b.rec);
            bits = fp4rl_hif4_e8_at(e8, h) | fp4rl_hif4_e16_at(e16[0], 2 * h) | fp4rl_hif4_e16_at(e16[1], 2 * h + 1);
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) bits |= __shfl_xor_sync(FULL, bits, o);
        if (finite) word = b.e6m2 | bits;
#pragma unroll
        for (int j = 0; j < 8; j++)
            code[j] = (finite && c0 + j < a.C) ? fp4rl_hif4_encode(x[j], (int)(e8 + e16[j / 4]), b.rec, u[j]) : (uint8_t)0;
        if (h == 0 && r < a.R) static_cast<uint32_t *>(a.scales)[fp4rl_hif4_word_index(a.scale_cols, r, c0)] = word;
    } else {
        const float gs = F == NV ? fp4rl_nvfp4_tensor_scale(__uint_as_float(*a.amax_bits)) : 1.0f;
        const uint8_t s = block_scale<F>(amax, finite != 0, gs, a.truncation_free);
#pragma unroll
        for (int j = 0; j < 8; j++) code[j] = c0 + j < a.C ? encode_elem<F>(x[j], s, gs, u[j]) : (uint8_t)0;
        if (g % L == 0 && r < a.R) static_cast<uint8_t *>(a.scales)[fp4rl_scale_index(0, traits(F).block, a.scale_cols, r, c0)] = s;
    }
    store8<F>(a, r, c0, code);
}

/* ---- 2D tiles: MX / NVFP4 T x T (T = 16, 32, 64), HiF4 64 x 64 ------------------------------
 * A CTA covers T rows x W columns with W = 4096 / T (T = 64: one tile; 32: four; 16: sixteen),
 * 512 groups, two per thread: thread t takes groups t and t + 256, which lie in the same tile
 * (the second is 256 / (W / 8) rows further down). */
template <int T>
struct Tile2D {
    static constexpr int W = 4096 / T;         /* columns per CTA */
    static constexpr int GW = W / 8;           /* groups per CTA row */
    static constexpr int TG = T / 8;           /* groups per tile row */
    static constexpr int TILES = W / T;        /* tiles per CTA */
    static constexpr int DROW = THREADS / GW;  /* rows between a thread's two groups */
};

/* Max over the lanes of a warp that hold groups of the same tile: lanes differing only in
 * bits below TG (same tile row) or at or above GW (other rows of the CTA). */
template <int T>
__device__ __forceinline__ float tile_warp_max(float v, unsigned &finite)
{
#pragma unroll
    for (int o = 1; o < 32; o <<= 1)
        if (o < Tile2D<T>::TG || o >= Tile2D<T>::GW) {
            v = warp_max_xor(v, o);
            finite &= __shfl_xor_sync(FULL, finite, o);
        }
    return v;
}

template <int F, int T, typename S>
__global__ void __launch_bounds__(THREADS) quant2d_kernel(QArgs a, int64_t chunks)
{
    using G = Tile2D<T>;
    __shared__ unsigned s_amax[G::TILES], s_nonfinite[G::TILES];
    const int64_t band = (unsigned)blockIdx.x / (unsigned)chunks, chunk = blockIdx.x - band * chunks;
    const int tid = threadIdx.x, gcol = tid % G::GW, tl = gcol / G::TG;
    const int64_t r0 = band * T + tid / G::GW, r1 = r0 + G::DROW, c0 = chunk * G::W + gcol * 8;
    const S *src = static_cast<const S *>(a.src);
    float x[2][8];
    load8(src, a.R, a.C, r0, c0, a.vec, x[0]);
    load8(src, a.R, a.C, r1, c0, a.vec, x[1]);
    if (tid < G::TILES) s_amax[tid] = 0, s_nonfinite[tid] = 0;

    float m = 0.0f;
    unsigned finite = 1;
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (!fp4rl_is_finite(x[k][j])) finite = 0;
            else m = fmaxf(m, fabsf(x[k][j]));
        }
    m = tile_warp_max<T>(m, finite);
    __syncthreads(); /* s_amax initialised */
    const int lane = tid & 31;
    if ((lane & (G::TG - 1)) == 0 && lane < G::GW) { /* one lane per (warp, tile) */
        if (m > 0.0f) atomicMax(&s_amax[tl], __float_as_uint(m));
        if (!finite) atomicOr(&s_nonfinite[tl], 1u);
    }
    __syncthreads();
    const float amax = __uint_as_float(s_amax[tl]);
    finite = !s_nonfinite[tl];
    const float gs = F == NV ? fp4rl_nvfp4_tensor_scale(__uint_as_float(*a.amax_bits)) : 1.0f;
    const uint8_t s = block_scale<F>(amax, finite != 0, gs, a.truncation_free);
    const int64_t tile_col = chunk * G::TILES + tl;
    if (tid / G::GW == 0 && gcol % G::TG == 0 && tile_col < a.scale_cols)
        static_cast<uint8_t *>(a.scales)[band * a.scale_cols + tile_col] = s;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int64_t r = k ? r1 : r0;
        float u[8] = {-1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f};
        if (a.stochastic && r < a.R && c0 < a.C) uniforms8(a.seed, a.offset, (uint64_t)(r * a.C + c0), a.quad, u);
        uint8_t code[8];
#pragma unroll
        for (int j = 0; j < 8; j++) code[j] = c0 + j < a.C ? encode_elem<F>(x[k][j], s, gs, u[j]) : (uint8_t)0;
        store8<F>(a, r, c0, code);
    }
}

static_assert(FP4RL_HIF4_UNIT == 64 && traits(HIF4).block == 64, "the HiF4 kernels map threads to 64-element units");

/* HiF4 64 x 64 tiles. Warp w holds rows 4w .. 4w+3 (first groups) and 32+4w .. (second), all 8
 * group columns; so a warp's rows are exactly one 4-row band of micro-blocks (4 x 4), and an 8 x 8
 * sub-block spans two warps, which meet in shared memory. */
template <typename S>
__global__ void __launch_bounds__(THREADS) quant_hif4_2d_kernel(QArgs a, int64_t chunks)
{
    __shared__ unsigned s_amax, s_nonfinite;
    __shared__ float s_m4[16][16];     /* [micro row][micro col] */
    __shared__ uint8_t s_e8[8][8];     /* [sub row][sub col] */
    __shared__ uint8_t s_e16[16][16];
    const int64_t band = (unsigned)blockIdx.x / (unsigned)chunks, u = blockIdx.x - band * chunks;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gcol = lane & 7;
    const int i0 = tid >> 3, i1 = i0 + 32; /* rows inside the tile */
    const int64_t c0 = u * 64 + gcol * 8;
    const S *src = static_cast<const S *>(a.src);
    float x[2][8];
    load8(src, a.R, a.C, band * 64 + i0, c0, a.vec, x[0]);
    load8(src, a.R, a.C, band * 64 + i1, c0, a.vec, x[1]);
    if (tid == 0) s_amax = 0, s_nonfinite = 0;

    float m4[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}; /* [group][half] */
    unsigned finite = 1;
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (!fp4rl_is_finite(x[k][j])) finite = 0;
            else m4[k][j / 4] = fmaxf(m4[k][j / 4], fabsf(x[k][j]));
        }
    /* micro-block maxima: the 4 lanes with this group column (lane bits 3 and 4) */
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) m4[k][hh] = warp_max_xor(warp_max_xor(m4[k][hh], 8), 16);
    float m = fmaxf(fmaxf(m4[0][0], m4[0][1]), fmaxf(m4[1][0], m4[1][1]));
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        m = warp_max_xor(m, o);
        finite &= __shfl_xor_sync(FULL, finite, o);
    }
    __syncthreads(); /* s_amax initialised */
    if (lane < 8) {
        s_m4[w][2 * gcol] = m4[0][0];
        s_m4[w][2 * gcol + 1] = m4[0][1];
        s_m4[w + 8][2 * gcol] = m4[1][0];
        s_m4[w + 8][2 * gcol + 1] = m4[1][1];
    }
    if (lane == 0) {
        if (m > 0.0f) atomicMax(&s_amax, __float_as_uint(m));
        if (!finite) atomicOr(&s_nonfinite, 1u);
    }
    __syncthreads();
    finite = !s_nonfinite;
    fp4rl_hif4_base b = {0, 0.0f, 0.0f};
    if (finite) b = fp4rl_hif4_make_base(__uint_as_float(s_amax));
    if (finite && tid < 64) { /* e8 of sub-block (tid / 8, tid % 8) */
        const int sr = tid >> 3, sc = tid & 7;
        float m8 = fmaxf(fmaxf(s_m4[2 * sr][2 * sc], s_m4[2 * sr][2 * sc + 1]), fmaxf(s_m4[2 * sr + 1][2 * sc], s_m4[2 * sr + 1][2 * sc + 1]));
        s_e8[sr][sc] = (uint8_t)fp4rl_hif4_e8(m8, b.rec);
    }
    __syncthreads();
    if (finite) { /* e16 of micro-block (tid / 16, tid % 16) */
        const int mr = tid >> 4, mc = tid & 15;
        s_e16[mr][mc] = (uint8_t)fp4rl_hif4_e16(s_m4[mr][mc], s_e8[mr / 2][mc / 2], b.rec);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int i = k ? i1 : i0;
        const int64_t r = band * 64 + i;
        float uu[8] = {-1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f};
        if (a.stochastic && r < a.R && c0 < a.C) uniforms8(a.seed, a.offset, (uint64_t)(r * a.C + c0), a.quad, uu);
        uint8_t code[8];
#pragma unroll
        for (int j = 0; j < 8; j++)
            code[j] = (finite && c0 + j < a.C)
                          ? fp4rl_hif4_encode(x[k][j], s_e8[i / 8][gcol] + s_e16[i / 4][2 * gcol + j / 4], b.rec, uu[j])
                          : (uint8_t)0;
        store8<HIF4>(a, r, c0, code);
        if (gcol == 0 && r < a.R) {
            uint32_t word = FP4RL_HIF4_NAN_WORD;
            if (finite) {
                word = b.e6m2;
                for (int h = 0; h < 8; h++) word |= fp4rl_hif4_e8_at(s_e8[i / 8][h], h);
                for (int gg = 0; gg < 16; gg++) word |= fp4rl_hif4_e16_at(s_e16[i / 4][gg], gg);
            }
            static_cast<uint32_t *>(a.scales)[r * a.scale_cols + u] = word;
        }
    }
}

/* ---- host dispatch ---------------------------------------------------------------------------- */
template <typename S>
void launch_quant(const QArgs &a, int fmt, int tile, cudaStream_t st)
{
    if (tile == 0) {
        const int64_t threads = a.R * a.groups_per_row;
        unsigned blocks = fp4rl_cuda_blocks(threads, THREADS);
        with_format(fmt, [&](auto F) { quant1d_kernel<decltype(F)::value, S><<<blocks, THREADS, 0, st>>>(a); });
        return;
    }
    const int64_t W = 4096 / tile, chunks = (a.C + W - 1) / W, bands = (a.R + tile - 1) / tile;
    const unsigned blocks = (unsigned)(chunks * bands);
    if (fmt == HIF4) {
        quant_hif4_2d_kernel<S><<<blocks, THREADS, 0, st>>>(a, chunks);
        return;
    }
#define FP4RL_Q2D(F)                                                                           \
    switch (tile) {                                                                            \
    case 16: quant2d_kernel<F, 16, S><<<blocks, THREADS, 0, st>>>(a, chunks); break;           \
    case 32: quant2d_kernel<F, 32, S><<<blocks, THREADS, 0, st>>>(a, chunks); break;           \
    default: quant2d_kernel<F, 64, S><<<blocks, THREADS, 0, st>>>(a, chunks); break;           \
    }
    switch (fmt) {
    case MX4: FP4RL_Q2D(MX4) break;
    case MX8: FP4RL_Q2D(MX8) break;
    default: FP4RL_Q2D(NV) break;
    }
#undef FP4RL_Q2D
}

} // namespace

fp4rl_status fp4rl_cuda_quantize(fp4rl_context *ctx, fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    const fp4rl_qdesc *d = &q->q;
    const int fmt = (int)d->dtype;
    QArgs a;
    a.src = src->data;
    a.codes = static_cast<uint8_t *>(q->data);
    a.scales = q->scales;
    a.R = d->rows;
    a.C = d->cols;
    a.row_bytes = d->row_bytes;
    a.scale_cols = d->scale_cols;
    a.vec = d->cols % 8 == 0;
    a.quad = d->cols % 4 == 0;
    a.stochastic = p->stochastic;
    a.truncation_free = p->truncation_free;
    a.seed = p->seed;
    a.offset = p->offset;
    a.amax_bits = cu->scratch_dev;
    a.groups_per_row = d->scale_cols * (fp4rl_format_of(d->dtype).block / 8);
    a.inv_groups_per_row = 1.0 / (double)a.groups_per_row;
    const int bf16 = src->dtype == FP4RL_DTYPE_BF16;
    /* 2D grids are one CTA per (row band, column chunk): keep the count within a grid's x range */
    if (d->tile && ((d->rows + d->tile - 1) / d->tile) * ((d->cols + 4096 / d->tile - 1) / (4096 / d->tile)) > 0x7fffffffLL)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "fp4rl_quantize: the tensor is too large for one CUDA launch");
    if (!d->tile && (d->rows * d->scale_cols * 8 + THREADS) / THREADS > 0x7fffffffLL)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "fp4rl_quantize: the tensor is too large for one CUDA launch");

    cudaError_t err;
    if (fmt == NV) { /* the tensor scale g first: max |x| over the finite elements */
        err = cudaMemsetAsync(cu->scratch_dev, 0, sizeof(unsigned), cu->stream);
        if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "fp4rl_quantize: cudaMemsetAsync");
        const int64_t n = src->numel;
        unsigned blocks = (unsigned)((n / 8 + THREADS) / THREADS);
        const unsigned cap = (unsigned)cu->sm_count * 8;
        if (blocks > cap) blocks = cap;
        if (bf16) amax_kernel<<<blocks, THREADS, 0, cu->stream>>>(static_cast<const uint16_t *>(src->data), n, cu->scratch_dev);
        else amax_kernel<<<blocks, THREADS, 0, cu->stream>>>(static_cast<const float *>(src->data), n, cu->scratch_dev);
        st = fp4rl_cuda_check_launch(ctx, "fp4rl_quantize: amax kernel");
        if (st) return st;
    }
    if (bf16) launch_quant<uint16_t>(a, fmt, d->tile, cu->stream);
    else launch_quant<float>(a, fmt, d->tile, cu->stream);
    st = fp4rl_cuda_check_launch(ctx, "fp4rl_quantize: quantize kernel");
    if (st) return st;
    q->tensor_scale = 1.0f;
    if (fmt == NV) { /* the host copy of g, which the tensor carries and matmul applies as alpha */
        err = cudaMemcpyAsync(cu->scratch_host, cu->scratch_dev, sizeof(unsigned), cudaMemcpyDeviceToHost, cu->stream);
        if (err == cudaSuccess) err = cudaStreamSynchronize(cu->stream);
        if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "fp4rl_quantize: reading the NVFP4 tensor amax");
        float amax;
        memcpy(&amax, cu->scratch_host, sizeof amax);
        q->tensor_scale = fp4rl_nvfp4_tensor_scale(amax);
    }
    return FP4RL_OK;
}
