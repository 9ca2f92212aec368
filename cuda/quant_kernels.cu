/*
 * quant_kernels.cu - quantization on the GPU, bit-identical to core/cpu/cpu_quant.c.
 *
 * Both backends call the same element and scale functions of core/format/formats.h; what differs is only
 * how the work is spread. A block's scale depends on its max magnitude and whether it holds a
 * non-finite value; max and "all finite" are exact and order-free, so any reduction order gives
 * the CPU's scale, and from there each element's code is the same function of the same inputs.
 *
 * The kernels are meant to run at memory speed: one pass over the source with 16-byte loads, each
 * thread holding 32 elements (four groups, whose loads are all in flight together) and owning
 * whole blocks where the layout allows, so that a block's max needs no shuffle and its scale is
 * computed once; the rounding (nearest or stochastic) and the format are template parameters, so
 * each variant is straight-line code; codes leave as 16-byte stores.
 *
 * - quant1d_flat: 1D blocks of a tensor whose rows are whole blocks (C a multiple of the block,
 *   every realistic shape). Then the tensor is one flat run of blocks, scales and codes: thread t
 *   takes elements [32t, 32t + 32): one MX block, two NVFP4 blocks, half a HiF4 unit (a lane pair
 *   shares a unit through one shuffle).
 * - quant1d_kernel: any other 1D case (row tails, padding blocks, unaligned buffers): a thread per
 *   group, blocks reduced across lanes.
 * - quant2d_kernel / quant_hif4_2d_kernel: 2D tiles. A CTA covers 64 rows x 128 columns; thread
 *   (rq, cg) holds the group at column 8 cg of the four rows 4 rq .. 4 rq + 3, so a half-warp reads
 *   256 contiguous bytes of a row per load, a HiF4 4x4 micro-block lies in one thread and an 8x8
 *   sub-block in a lane pair; tiles spanning warps meet in shared memory.
 *
 * NVFP4 also needs the tensor-wide amax before any block scale, which costs one extra read of the
 * source. The amax pass walks the tensor forwards and the quantize pass backwards, so the latter
 * starts on what the former left in L2.
 */
#include "quant_common.cuh"

using namespace fp4rl_cuda_q;

namespace {

constexpr unsigned FULL = 0xffffffffu;
constexpr int THREADS = 256;

/* ---- the tensor-wide finite amax (NVFP4) -------------------------------------------------- */
/* Thread t reads elements [EPT t, EPT t + EPT) (four 16-byte loads), CTAs in address order. */
template <typename S>
__global__ void __launch_bounds__(THREADS) amax_kernel(const S *src, int64_t n, int vec, unsigned *out)
{
    constexpr int EPT = 64 / (int)sizeof(S); /* 32 BF16 or 16 F32: four 16-byte loads */
    const int64_t i0 = ((int64_t)blockIdx.x * THREADS + threadIdx.x) * EPT;
    uint32_t m = 0;
    if (vec && i0 + EPT <= n) {
        Raw8<S> g[EPT / 8];
#pragma unroll
        for (int k = 0; k < EPT / 8; k++) ld8(g[k], src, i0 + 8 * k, true);
#pragma unroll
        for (int k = 0; k < EPT / 8; k++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t b = __float_as_uint(g[k].x(j)) & 0x7fffffffu;
                m = max(m, key_finite(b) ? b : 0u); /* non-finite elements do not count */
            }
    } else {
        for (int64_t i = i0; i < n && i < i0 + EPT; i++) {
            const uint32_t b = __float_as_uint(src_at(src, i)) & 0x7fffffffu;
            m = max(m, key_finite(b) ? b : 0u);
        }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) m = warp_max_u(m, o);
    /* non-negative floats order like their bit patterns, so an integer max is a float max */
    if ((threadIdx.x & 31) == 0 && m > 0) atomicMax(out, m);
}

/* NVFP4's tensor scale g from the amax pass. */
__device__ __forceinline__ float tensor_scale(const QArgs &a) { return fp4rl_nvfp4_tensor_scale(__uint_as_float(*a.amax_bits)); }

/* ---- 1D, flat --------------------------------------------------------------------------------- */
/* The tensor's elements [32t, 32t + 32) are thread t's (t counted backwards for NVFP4, see the top).
 * Requires C % block == 0 and aligned buffers (launch_quant checks). */
template <int F, bool SR, typename S>
__global__ void __launch_bounds__(THREADS) quant1d_flat(QArgs a, int64_t n)
{
    const int64_t nthreads = (n + 31) / 32;
    const int64_t cta = F == NV ? (int64_t)(gridDim.x - 1 - blockIdx.x) : (int64_t)blockIdx.x;
    const int64_t t = cta * THREADS + threadIdx.x;
    /* HiF4 lane pairs exchange through shuffles of the whole warp: its threads past the end stay
     * (they come in pairs, n being a multiple of 64), the others leave */
    if (F != HIF4 && t >= nthreads) return;
    const bool live = t < nthreads;
    const S *src = static_cast<const S *>(a.src);
    const int64_t e0 = t * 32;
    const bool full = e0 + 32 <= n; /* false only for NVFP4's last thread when n % 32 == 16 */
    Raw8<S> g[4];
#pragma unroll
    for (int k = 0; k < 4; k++) ld8(g[k], src, e0 + 8 * k, full || (live && k < 2));
    float u[4][8] = {};
    if (SR)
#pragma unroll
        for (int k = 0; k < 4; k++) uniforms8(a.seed, a.offset, (uint64_t)(e0 + 8 * k), 1, u[k]);
    Codes8 c[4];

    if constexpr (F == HIF4) {
        /* half `hf` of unit t / 2: sub-blocks h = 4 hf + k, micro-blocks 2h, 2h + 1 */
        const int hf = (int)(t & 1);
        uint32_t m4[4][2], m8[4], key = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            m4[k][0] = key4(g[k], 0);
            m4[k][1] = key4(g[k], 1);
            m8[k] = max(m4[k][0], m4[k][1]);
            key = max(key, m8[k]);
        }
        key = warp_max_u(key, 1);
        const bool finite = key_finite(key);
        const fp4rl_hif4_base b = fp4rl_hif4_make_base(finite ? __uint_as_float(key) : 0.0f);
        uint32_t e8[4], e16[4][2], bits = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int h = 4 * hf + k;
            e8[k] = fp4rl_hif4_e8(__uint_as_float(m8[k]), b.rec);
            e16[k][0] = fp4rl_hif4_e16(__uint_as_float(m4[k][0]), e8[k], b.rec);
            e16[k][1] = fp4rl_hif4_e16(__uint_as_float(m4[k][1]), e8[k], b.rec);
            bits |= fp4rl_hif4_e8_at(e8[k], h) | fp4rl_hif4_e16_at(e16[k][0], 2 * h) | fp4rl_hif4_e16_at(e16[k][1], 2 * h + 1);
        }
        bits |= __shfl_xor_sync(FULL, bits, 1);
#pragma unroll
        for (int k = 0; k < 4; k++) c[k] = encode8_hif4<SR>(g[k], e8[k] + e16[k][0], e8[k] + e16[k][1], b.rec, !finite, u[k]);
        if (!live) return;
        if (hf == 0) static_cast<uint32_t *>(a.scales)[t >> 1] = finite ? b.e6m2 | bits : FP4RL_HIF4_NAN_WORD;
    } else if constexpr (F == NV) {
        const float gs = tensor_scale(a);
        const BlockScale b0 = block_scale<NV>(max(key8(g[0]), key8(g[1])), gs, 0);
        const BlockScale b1 = block_scale<NV>(max(key8(g[2]), key8(g[3])), gs, 0);
#pragma unroll
        for (int k = 0; k < 4; k++) c[k] = encode8<NV, SR>(g[k], k < 2 ? b0 : b1, u[k]);
        if (full) {
            *reinterpret_cast<uint16_t *>(static_cast<uint8_t *>(a.scales) + 2 * t) = (uint16_t)(b0.s | b1.s << 8);
        } else {
            static_cast<uint8_t *>(a.scales)[2 * t] = b0.s;
            *reinterpret_cast<uint2 *>(a.codes + 16 * t) = make_uint2(c[0].lo, c[1].lo);
            return;
        }
    } else { /* MX: one 32-element block */
        uint32_t kw = 0; /* the 16 BF16 pairs (or 32 floats) reduced as pairs, folded once */
        if constexpr (sizeof(S) == 2) {
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int q = 0; q < 4; q++) kw = __vmaxu2(kw, g[k].w[q] & 0x7fff7fffu);
            kw = fold16(kw);
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) kw = max(kw, key8(g[k]));
        }
        const BlockScale b = block_scale<F>(kw, 1.0f, a.truncation_free);
#pragma unroll
        for (int k = 0; k < 4; k++) c[k] = encode8<F, SR>(g[k], b, u[k]);
        static_cast<uint8_t *>(a.scales)[t] = b.s;
    }
    if (traits(F).code_bits == 8) {
        uint4 *p = reinterpret_cast<uint4 *>(a.codes + 32 * t);
        p[0] = make_uint4(c[0].lo, c[0].hi, c[1].lo, c[1].hi);
        p[1] = make_uint4(c[2].lo, c[2].hi, c[3].lo, c[3].hi);
    } else {
        *reinterpret_cast<uint4 *>(a.codes + 16 * t) = make_uint4(c[0].lo, c[1].lo, c[2].lo, c[3].lo);
    }
}

/* ---- 1D, general: a thread per group of 8, blocks across L lanes ------------------------------ */
template <int F>
struct Lanes { static constexpr int value = traits(F).block / 8; }; /* groups per block */

/* The group at (r, c0) of the source, zeros outside the tensor (the spec's padding). */
template <typename S>
__device__ __forceinline__ void load_group(Raw8<S> &g, const QArgs &a, int64_t r, int64_t c0)
{
    const S *src = static_cast<const S *>(a.src);
    const bool in = r < a.R && c0 < a.C;
    if (a.vec) ld8(g, src, r * a.C + c0, in);
    else if (in) ld8_tail(g, src, r * a.C + c0, (int)min((int64_t)8, a.C - c0));
    else ld8(g, src, 0, false);
}
/* Stores the codes of the group at (r, c0) if it is inside the tensor. */
template <int F>
__device__ __forceinline__ void store_group(const QArgs &a, int64_t r, int64_t c0, Codes8 c)
{
    if (r >= a.R || c0 >= a.C) return;
    const int64_t byte = r * a.row_bytes + c0 * traits(F).code_bits / 8;
    if (a.vec) st_codes<F>(a.codes, byte, c);
    else st_codes_tail<F>(a.codes, byte, c, (int)min((int64_t)8, a.C - c0));
}

template <int F, bool SR, typename S>
__global__ void __launch_bounds__(THREADS) quant1d_kernel(QArgs a)
{
    constexpr int L = Lanes<F>::value;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t r, g;
    split_index(t, a.groups_per_row, a.inv_groups_per_row, r, g);
    const int64_t c0 = g * 8;
    Raw8<S> x;
    load_group(x, a, r, c0);
    const uint32_t m4[2] = {key4(x, 0), key4(x, 1)}, m8 = max(m4[0], m4[1]);
    uint32_t key = m8;
#pragma unroll
    for (int o = 1; o < L; o <<= 1) key = warp_max_u(key, o);
    float u[8] = {};
    if (SR && r < a.R && c0 < a.C) uniforms8(a.seed, a.offset, (uint64_t)(r * a.C + c0), a.quad, u);
    Codes8 c;
    if constexpr (F == HIF4) {
        const int h = (int)(g % 8); /* the group's 8-element sub-block inside its unit */
        const bool finite = key_finite(key);
        const fp4rl_hif4_base b = fp4rl_hif4_make_base(finite ? __uint_as_float(key) : 0.0f);
        const uint32_t e8 = fp4rl_hif4_e8(__uint_as_float(m8), b.rec);
        const uint32_t e16[2] = {fp4rl_hif4_e16(__uint_as_float(m4[0]), e8, b.rec), fp4rl_hif4_e16(__uint_as_float(m4[1]), e8, b.rec)};
        uint32_t bits = fp4rl_hif4_e8_at(e8, h) | fp4rl_hif4_e16_at(e16[0], 2 * h) | fp4rl_hif4_e16_at(e16[1], 2 * h + 1);
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) bits |= __shfl_xor_sync(FULL, bits, o);
        c = encode8_hif4<SR>(x, e8 + e16[0], e8 + e16[1], b.rec, !finite, u);
        if (h == 0 && r < a.R)
            static_cast<uint32_t *>(a.scales)[fp4rl_hif4_word_index(a.scale_cols, r, c0)] = finite ? b.e6m2 | bits : FP4RL_HIF4_NAN_WORD;
    } else {
        const BlockScale b = block_scale<F>(key, F == NV ? tensor_scale(a) : 1.0f, a.truncation_free);
        c = encode8<F, SR>(x, b, u);
        if (g % L == 0 && r < a.R) static_cast<uint8_t *>(a.scales)[fp4rl_scale_index(0, traits(F).block, a.scale_cols, r, c0)] = b.s;
    }
    store_group<F>(a, r, c0, c);
}

/* ---- 2D tiles ----------------------------------------------------------------------------------
 * A CTA covers rows [64 band, +64) x columns [128 chunk, +128): thread tid = 16 rq + cg holds the
 * groups at column 8 cg of rows 4 rq .. 4 rq + 3. In warp w, lanes 0-15 have rq = 2w and lanes
 * 16-31 rq = 2w + 1, so a warp covers rows 8w .. 8w + 7 of the band. */
struct Tile2DPos {
    int64_t band, chunk;
    int tid, cg, rq, lane, w;
};
__device__ __forceinline__ Tile2DPos tile2d_pos(int64_t chunks, bool backwards)
{
    Tile2DPos p;
    const unsigned bid = backwards ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    p.band = bid / (unsigned)chunks;
    p.chunk = bid - p.band * chunks;
    p.tid = threadIdx.x;
    p.cg = p.tid & 15;
    p.rq = p.tid >> 4;
    p.lane = p.tid & 31;
    p.w = p.tid >> 5;
    return p;
}

/* MX / NVFP4 T x T tiles, T = 16, 32, 64. A tile is T/8 group columns x T/4 row quads: the lanes
 * sharing it in a warp differ in the low bits of cg and in bit 4; T/8 warps share a tile row. */
template <int F, int T, bool SR, typename S>
__global__ void __launch_bounds__(THREADS) quant2d_kernel(QArgs a, int64_t chunks, int64_t scale_rows)
{
    constexpr int TG = T / 8, TPR = 128 / T;
    __shared__ uint32_t s_key[8][TPR];
    const Tile2DPos p = tile2d_pos(chunks, F == NV);
    const int64_t r0 = p.band * 64 + 4 * p.rq, c0 = p.chunk * 128 + 8 * p.cg;
    Raw8<S> g[4];
#pragma unroll
    for (int k = 0; k < 4; k++) load_group(g[k], a, r0 + k, c0);
    uint32_t key = max(max(key8(g[0]), key8(g[1])), max(key8(g[2]), key8(g[3])));
#pragma unroll
    for (int o = 1; o < TG; o <<= 1) key = warp_max_u(key, o);
    key = warp_max_u(key, 16);
    const int tc = p.cg / TG, tr = 4 * p.rq / T;
    if (p.lane < 16 && p.cg % TG == 0) s_key[p.w][tc] = key;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TG; i++) key = max(key, s_key[tr * TG + i][tc]);
    const BlockScale b = block_scale<F>(key, F == NV ? tensor_scale(a) : 1.0f, a.truncation_free);
    const int64_t tile_r = p.band * (64 / T) + tr, tile_c = p.chunk * TPR + tc;
    if ((4 * p.rq) % T == 0 && p.cg % TG == 0 && tile_r < scale_rows && tile_c < a.scale_cols)
        static_cast<uint8_t *>(a.scales)[tile_r * a.scale_cols + tile_c] = b.s;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int64_t r = r0 + k;
        float u[8] = {};
        if (SR && r < a.R && c0 < a.C) uniforms8(a.seed, a.offset, (uint64_t)(r * a.C + c0), a.quad, u);
        store_group<F>(a, r, c0, encode8<F, SR>(g[k], b, u));
    }
}

static_assert(FP4RL_HIF4_UNIT == 64 && traits(HIF4).block == 64, "the HiF4 kernels map threads to 64-element units");

/* Bits 0..7 of x spread to the even bits 0, 2, .., 14. */
__device__ __forceinline__ uint32_t spread8(uint32_t x)
{
    x = (x | x << 4) & 0x0f0fu;
    x = (x | x << 2) & 0x3333u;
    return (x | x << 1) & 0x5555u;
}

/* HiF4 64 x 64 tiles, two per CTA (tc = cg / 8). Thread (rq, cg) owns the micro-blocks (rq, 2h) and
 * (rq, 2h + 1) of its tile, h = cg % 8; lanes l and l ^ 16 share the sub-block (w, h). The four rows
 * of a thread share one scale word per tile (e8 changes every 8 rows, e16 every 4). */
template <bool SR, typename S>
__global__ void __launch_bounds__(THREADS) quant_hif4_2d_kernel(QArgs a, int64_t chunks)
{
    __shared__ uint32_t s_key[8][2];
    const Tile2DPos p = tile2d_pos(chunks, false);
    const int64_t r0 = p.band * 64 + 4 * p.rq, c0 = p.chunk * 128 + 8 * p.cg;
    const int tc = p.cg >> 3, h = p.cg & 7;
    Raw8<S> g[4];
#pragma unroll
    for (int k = 0; k < 4; k++) load_group(g[k], a, r0 + k, c0);
    uint32_t m4[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 4; k++) m4[0] = max(m4[0], key4(g[k], 0)), m4[1] = max(m4[1], key4(g[k], 1));
    const uint32_t m8 = warp_max_u(max(m4[0], m4[1]), 16);
    uint32_t key = m8;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) key = warp_max_u(key, o);
    if ((p.lane & 0x17) == 0) s_key[p.w][tc] = key; /* lanes 0 and 8: h = 0 of each tile, first row quad */
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 8; i++) key = max(key, s_key[i][tc]);
    const bool finite = key_finite(key);
    const fp4rl_hif4_base b = fp4rl_hif4_make_base(finite ? __uint_as_float(key) : 0.0f);
    const uint32_t e8 = fp4rl_hif4_e8(__uint_as_float(m8), b.rec);
    const uint32_t e16[2] = {fp4rl_hif4_e16(__uint_as_float(m4[0]), e8, b.rec), fp4rl_hif4_e16(__uint_as_float(m4[1]), e8, b.rec)};
    /* the word: e8 of the 8 lanes of this half-warp and tile, e16 of their 16 micro-blocks */
    const int off = (p.lane & 16) + 8 * tc;
    const uint32_t b8 = (__ballot_sync(FULL, e8) >> off) & 0xffu;
    const uint32_t x0 = (__ballot_sync(FULL, e16[0]) >> off) & 0xffu, x1 = (__ballot_sync(FULL, e16[1]) >> off) & 0xffu;
    const uint32_t word = finite ? b.e6m2 | b8 << FP4RL_HIF4_E8_SHIFT | (spread8(x0) | spread8(x1) << 1) << FP4RL_HIF4_E16_SHIFT
                                 : FP4RL_HIF4_NAN_WORD;
    const int64_t unit = p.chunk * 2 + tc;
    if (h < 4 && r0 + h < a.R && unit < a.scale_cols) static_cast<uint32_t *>(a.scales)[(r0 + h) * a.scale_cols + unit] = word;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int64_t r = r0 + k;
        float u[8] = {};
        if (SR && r < a.R && c0 < a.C) uniforms8(a.seed, a.offset, (uint64_t)(r * a.C + c0), a.quad, u);
        store_group<HIF4>(a, r, c0, encode8_hif4<SR>(g[k], e8 + e16[0], e8 + e16[1], b.rec, !finite, u));
    }
}

/* ---- host dispatch ---------------------------------------------------------------------------- */
inline bool aligned(const void *p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; }

template <bool SR, typename S>
void launch_quant(const QArgs &a, int fmt, int tile, int64_t scale_rows, cudaStream_t st)
{
    if (tile == 0) {
        const fp4rl_format_traits t = fp4rl_format_of((fp4rl_dtype)fmt);
        const int64_t n = a.R * a.C;
        /* flat: whole blocks per row, and 16-byte aligned source and codes (32 elements a thread) */
        if (a.C % t.block == 0 && aligned(a.src, 16) && aligned(a.codes, 16) && aligned(a.scales, 4)) {
            const unsigned blocks = fp4rl_cuda_blocks((n + 31) / 32, THREADS);
            with_format(fmt, [&](auto F) { quant1d_flat<decltype(F)::value, SR, S><<<blocks, THREADS, 0, st>>>(a, n); });
            return;
        }
        const unsigned blocks = fp4rl_cuda_blocks(a.R * a.groups_per_row, THREADS);
        with_format(fmt, [&](auto F) { quant1d_kernel<decltype(F)::value, SR, S><<<blocks, THREADS, 0, st>>>(a); });
        return;
    }
    const int64_t chunks = (a.C + 127) / 128, bands = (a.R + 63) / 64;
    const unsigned blocks = (unsigned)(chunks * bands);
    if (fmt == HIF4) {
        quant_hif4_2d_kernel<SR, S><<<blocks, THREADS, 0, st>>>(a, chunks);
        return;
    }
    with_format(fmt, [&](auto F) {
        constexpr int Fv = decltype(F)::value;
        if constexpr (Fv != HIF4) {
            switch (tile) {
            case 16: quant2d_kernel<Fv, 16, SR, S><<<blocks, THREADS, 0, st>>>(a, chunks, scale_rows); break;
            case 32: quant2d_kernel<Fv, 32, SR, S><<<blocks, THREADS, 0, st>>>(a, chunks, scale_rows); break;
            default: quant2d_kernel<Fv, 64, SR, S><<<blocks, THREADS, 0, st>>>(a, chunks, scale_rows); break;
            }
        }
    });
}

} // namespace

fp4rl_status fp4rl_cuda_quantize_launch(fp4rl_context *ctx, fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p)
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
    /* vector loads and word stores: whole groups per row, 16-byte source and 8-byte code alignment */
    a.vec = d->cols % 8 == 0 && aligned(src->data, 16) && aligned(q->data, 8);
    a.quad = d->cols % 4 == 0;
    a.stochastic = p->stochastic;
    a.truncation_free = p->truncation_free;
    a.seed = p->seed;
    a.offset = p->offset;
    a.amax_bits = cu->scratch_dev;
    a.groups_per_row = d->scale_cols * (fp4rl_format_of(d->dtype).block / 8);
    a.inv_groups_per_row = 1.0 / (double)a.groups_per_row;
    const int bf16 = src->dtype == FP4RL_DTYPE_BF16;
    /* 2D grids are one CTA per 64 x 128 (row band, column chunk): keep the count within a grid's x range */
    if (d->tile && ((d->rows + 63) / 64) * ((d->cols + 127) / 128) > 0x7fffffffLL)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "fp4rl_quantize: the tensor is too large for one CUDA launch");
    if (!d->tile && (d->rows * d->scale_cols * 8 + THREADS) / THREADS > 0x7fffffffLL)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "fp4rl_quantize: the tensor is too large for one CUDA launch");

    cudaError_t err;
    if (fmt == NV) { /* the tensor scale g first: max |x| over the finite elements */
        err = cudaMemsetAsync(cu->scratch_dev, 0, sizeof(unsigned), cu->stream);
        if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "fp4rl_quantize: cudaMemsetAsync");
        const int64_t n = src->numel, ept = bf16 ? 32 : 16;
        const unsigned blocks = fp4rl_cuda_blocks((n + ept - 1) / ept, THREADS);
        const int vec = aligned(src->data, 16);
        if (n > 0) {
            if (bf16) amax_kernel<<<blocks, THREADS, 0, cu->stream>>>(static_cast<const uint16_t *>(src->data), n, vec, cu->scratch_dev);
            else amax_kernel<<<blocks, THREADS, 0, cu->stream>>>(static_cast<const float *>(src->data), n, vec, cu->scratch_dev);
            st = fp4rl_cuda_check_launch(ctx, "fp4rl_quantize: amax kernel");
            if (st) return st;
        }
    }
    if (d->rows * d->cols > 0) {
        const int64_t scale_rows = d->scale_rows;
        if (a.stochastic) {
            if (bf16) launch_quant<true, uint16_t>(a, fmt, d->tile, scale_rows, cu->stream);
            else launch_quant<true, float>(a, fmt, d->tile, scale_rows, cu->stream);
        } else {
            if (bf16) launch_quant<false, uint16_t>(a, fmt, d->tile, scale_rows, cu->stream);
            else launch_quant<false, float>(a, fmt, d->tile, scale_rows, cu->stream);
        }
        st = fp4rl_cuda_check_launch(ctx, "fp4rl_quantize: quantize kernel");
        if (st) return st;
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cuda_quantize(fp4rl_context *ctx, fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p)
{
    fp4rl_status st = fp4rl_cuda_quantize_launch(ctx, q, src, p);
    if (st) return st;
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    cudaError_t err;
    q->tensor_scale = 1.0f;
    if (q->q.dtype == FP4RL_DTYPE_NVFP4) { /* the host copy of g, which the tensor carries and matmul applies as alpha */
        err = cudaMemcpyAsync(cu->scratch_host, cu->scratch_dev, sizeof(unsigned), cudaMemcpyDeviceToHost, cu->stream);
        if (err == cudaSuccess) err = cudaStreamSynchronize(cu->stream);
        if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "fp4rl_quantize: reading the NVFP4 tensor amax");
        float amax;
        memcpy(&amax, cu->scratch_host, sizeof amax);
        q->tensor_scale = fp4rl_nvfp4_tensor_scale(amax);
    }
    return FP4RL_OK;
}
