/*
 * decode_gemm.cu - the fused FP4-weight GEMM for decode-shaped products: C[M, N] = alpha *
 * A[M, K] * W[N, K]^T with M <= 64 and W quantized (MXFP4, NVFP4, HiF4) along K.
 *
 * At small M the product is bound by reading W, so W is read once, packed (4.25-4.5 bits a
 * value), and dequantized in registers straight into the operand fragments of BF16 tensor-core
 * MMAs (mma.sync m16n8k16, FP32 accumulation). The dequantized values value(code) * block scale
 * are exact in BF16 (spec sections 3, 4 and 6), so the products are exact and only the FP32
 * accumulation order differs from the CPU reference. An F32 activation is split exactly into
 * three BF16 parts (hi + mid + lo == a), each multiplied by the same weights.
 *
 * Layout of the work. W plays the MMA's "A" operand (16 weight rows x 16 k), the activations
 * its "B" (16 k x 8 activation rows). K is walked in chunks of 128; in a chunk, thread t of a quad
 * owns 32 consecutive k (16 packed bytes of each of its weight rows, one 16-byte load) and the
 * MMAs take k in a permuted order so that each thread's fragment registers come from its own
 * bytes: MMA j (0..7) uses k = 32t + 4j .. 32t + 4j + 3 of each thread t. A dot product does not
 * care in which order k is summed, as long as A and B agree on it.
 *
 * A CTA of 4 warps covers 128 weight rows (32 per warp, two m16 tiles) and one slice of K. Split-K
 * slices fill the GPU when N / 128 is small; each slice writes FP32 partial sums and the last CTA
 * of a row block to arrive adds them in slice order, so the result does not depend on timing.
 */
#include <cuda_bf16.h>

#include "mma_common.cuh"
#include "quant_common.cuh"

using namespace fp4rl_cuda_q;
using namespace fp4rl_cuda_mma;

namespace {

constexpr int WARPS = 4, THREADS = WARPS * 32, ROWS_PER_CTA = WARPS * 32, KCHUNK = 128;

struct DG {
    const void *a;
    const uint8_t *codes;
    const void *scales;
    void *c;
    float *ws;
    unsigned *counters;
    int M, N, K;
    int64_t row_bytes, scale_cols;
    int lg; /* log2 of the k extent of one scale: the 1D block or the 2D tile (16, 32, 64) */
    int tile;
    int slices, chunks_per_slice, chunks;
    int c_bf16;
    float alpha;
};

/* Shared memory of one pipeline stage (one K chunk): each thread's 4 weight rows x 16 code bytes,
 * its 4 scale words, and the activation chunk [NT * 8 rows, 128 k] (rows padded by 16 bytes so
 * that the fragment reads of the 8 rows spread over the banks). */
template <int NT, typename AT>
struct Stage {
    static constexpr int A_ROW = KCHUNK * (int)sizeof(AT) + 16;
    static constexpr int CODES = 0, SCALES = 4 * THREADS * 16, A = SCALES + THREADS * 16;
    static constexpr int BYTES = A + NT * 8 * A_ROW;
    /* Three stages in flight (two for the largest): enough bytes in flight per multiprocessor
     * with several CTAs on it, while shared memory still leaves room for those CTAs; profiling at
     * four stages showed occupancy (shared memory) limiting the issue rate. */
    static constexpr int COUNT = BYTES * 3 <= 100 * 1024 ? 3 : 2;
    static constexpr int SMEM = BYTES * COUNT;
};

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t x, uint32_t s)
{
    __nv_bfloat162 a = *reinterpret_cast<__nv_bfloat162 *>(&x), b = *reinterpret_cast<__nv_bfloat162 *>(&s);
    __nv_bfloat162 r = __hmul2(a, b); /* exact: the product is a BF16 value (see the file comment) */
    return *reinterpret_cast<uint32_t *>(&r);
}

/* The element values of a format's 8 magnitude codes (0..7) as BF16, split into byte tables for
 * prmt: hi[0] holds the high bytes of magnitudes 0-3, hi[1] of 4-7, lo likewise. Negative codes
 * differ only in bit 7 of the high byte. Built from the formats.h decoders, once per thread. */
struct Lut {
    uint32_t hi[2], lo[2];
};
template <int F>
__device__ __forceinline__ Lut make_lut()
{
    Lut t = {{0, 0}, {0, 0}};
#pragma unroll
    for (int m = 0; m < 8; m++) {
        const float v = F == HIF4 ? fp4rl_hif4_elem((uint8_t)m) : fp4rl_e2m1_decode((uint8_t)m);
        const uint32_t h = fp4rl_f32_to_bf16(v);
        t.hi[m / 4] |= (h >> 8) << (8 * (m % 4));
        t.lo[m / 4] |= (h & 0xffu) << (8 * (m % 4));
    }
    return t;
}

/* Four 4-bit codes to two BF16 pairs, (e0, e1) and (e2, e3). `sel` holds the four magnitudes as
 * prmt selectors (bits 0-15, code i in nibble i, bit 3 clear) and `pick` selects, per byte, the
 * high byte (0-3) or the high byte with the sign bit set (4-7) for negative codes. prmt looks the
 * magnitudes up in the byte tables, then interleaves low and high bytes. */
__device__ __forceinline__ void dequant4(const Lut &t, uint32_t sel, uint32_t pick, uint32_t &p01, uint32_t &p23)
{
    const uint32_t hi = __byte_perm(t.hi[0], t.hi[1], sel);
    const uint32_t lo = __byte_perm(t.lo[0], t.lo[1], sel);
    const uint32_t hs = __byte_perm(hi, hi | 0x80808080u, pick);
    p01 = __byte_perm(lo, hs, 0x5140u);
    p23 = __byte_perm(lo, hs, 0x7362u);
}

/* The scale multipliers (BF16 pairs) of one weight row's 32 elements k0 .. k0+31 for the 8
 * micro-blocks of 4 (HiF4's levels change that often; MX and NVFP4 repeat per 16 or 32), from the
 * scale word that was copied to shared memory for this row and chunk. MX / NVFP4: `sidx` is the
 * index of the scale byte of k0. */
template <int F>
__device__ __forceinline__ void row_scales(const DG &p, int64_t sidx, int k0, uint32_t w, uint32_t s[8])
{
    if constexpr (F == HIF4) {
        if (fp4rl_hif4_word_base_bits(w) == FP4RL_HIF4_NAN_WORD) {
#pragma unroll
            for (int j = 0; j < 8; j++) s[j] = 0x7fc07fc0u;
            return;
        }
        /* base * 2^inc, exact in BF16: the base is a normal number and inc adds to its exponent */
        const uint32_t base = fp4rl_f32_to_bf16(fp4rl_hif4_word_base(w));
        const int p0 = fp4rl_hif4_unit_pos(k0); /* 0 or 32: which half of the 64-element unit */
#pragma unroll
        for (int j = 0; j < 8; j++) { /* micro-block j of the 32: elements p0 + 4j .. p0 + 4j + 3 */
            const uint32_t b = base + ((uint32_t)fp4rl_hif4_word_inc(w, p0 + 4 * j) << 7);
            s[j] = b | b << 16;
        }
    } else {
        /* the second half has its own scale only for 16-element blocks / tiles */
        uint32_t h[2];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            if (half && p.lg != 4) {
                h[1] = h[0];
                break;
            }
            const uint8_t b = (uint8_t)(w >> (8 * ((sidx + half) & 3)));
            const uint32_t v = fp4rl_f32_to_bf16(F == NV ? fp4rl_ue4m3_decode(b) : fp4rl_e8m0_decode(b));
            h[half] = v | v << 16;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) s[j] = h[j / 4];
    }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    return (uint32_t)fp4rl_f32_to_bf16(lo) | (uint32_t)fp4rl_f32_to_bf16(hi) << 16;
}

/* The activation fragment of MMA j (k = 32t + 4j .. +3 of the chunk) for one activation row,
 * from shared memory: one BF16 pair set, or for F32 three exact BF16 parts (hi + mid + lo == a:
 * each residual is exact in F32 and the last one has at most 8 significant bits left). */
__device__ __forceinline__ void act_frag(const uint16_t *row, int k, uint32_t b[3][2])
{
    const uint2 v = *reinterpret_cast<const uint2 *>(row + k);
    b[0][0] = v.x;
    b[0][1] = v.y;
}
__device__ __forceinline__ void act_frag(const float *row, int k, uint32_t b[3][2])
{
    const float4 v = *reinterpret_cast<const float4 *>(row + k);
    const float x[4] = {v.x, v.y, v.z, v.w};
    float hi[4], mid[4], lo[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        hi[i] = fp4rl_round_bf16(x[i]);
        const float r = x[i] - hi[i];
        mid[i] = fp4rl_round_bf16(r);
        lo[i] = fp4rl_round_bf16(r - mid[i]);
    }
    b[0][0] = pack_bf16(hi[0], hi[1]);
    b[0][1] = pack_bf16(hi[2], hi[3]);
    b[1][0] = pack_bf16(mid[0], mid[1]);
    b[1][1] = pack_bf16(mid[2], mid[3]);
    b[2][0] = pack_bf16(lo[0], lo[1]);
    b[2][1] = pack_bf16(lo[2], lo[3]);
}

__device__ __forceinline__ void store_c(const DG &p, int m, int64_t n, float acc)
{
    const float v = p.alpha * acc;
    if (p.c_bf16) static_cast<uint16_t *>(p.c)[(int64_t)m * p.N + n] = fp4rl_f32_to_bf16(v);
    else static_cast<float *>(p.c)[(int64_t)m * p.N + n] = v;
}

template <int F, int NT, typename AT>
__global__ void __launch_bounds__(THREADS) decode_gemm_kernel(DG p)
{
    using S = Stage<NT, AT>;
    constexpr int PARTS = sizeof(AT) == 4 ? 3 : 1;
    constexpr int A_PIECES = KCHUNK * (int)sizeof(AT) / 16; /* 16-byte pieces per activation row */
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x / p.slices, slice = blockIdx.x - rb * p.slices;
    const Lut lut = make_lut<F>();

    /* this thread's weight rows: slot r = 2 mt + hr is row g + 8 hr of m-tile mt; per row, where
     * its codes and its scales start (row 0 for rows past N, whose copies are zero-filled) */
    int64_t nrow[4], srow[4];
    const uint8_t *crow[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        nrow[r] = (int64_t)rb * ROWS_PER_CTA + warp * 32 + (r >> 1) * 16 + (r & 1) * 8 + g;
        const int64_t n = nrow[r] < p.N ? nrow[r] : 0;
        crow[r] = p.codes + n * p.row_bytes;
        srow[r] = (F == HIF4 || !p.tile ? n : n >> p.lg) * p.scale_cols;
    }
    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;

    const int cbeg = slice * p.chunks_per_slice;
    const int cend = min(p.chunks, cbeg + p.chunks_per_slice);
    const AT *A = static_cast<const AT *>(p.a);

    /* Copies chunk c into stage c % COUNT; out-of-range rows, k and chunks become zeros. Every
     * call commits one group, so wait_group counts stay aligned. */
    auto issue = [&](int c) {
        if (c < cend) {
            uint8_t *st = smem + (c % S::COUNT) * S::BYTES;
            const int k0 = c * KCHUNK + 32 * t;
            const int kk = k0 < p.K ? k0 : 0;
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const bool live = nrow[r] < p.N && k0 < p.K;
                cp_async16(st + S::CODES + (r * THREADS + tid) * 16, crow[r] + kk / 2, live);
                /* the aligned word holding this row's scale byte(s) of k0 .. k0+31, or its HiF4 word */
                const void *sw = F == HIF4 ? (const void *)(static_cast<const uint32_t *>(p.scales) + srow[r] + (kk >> 6))
                                           : (const void *)(static_cast<const uint8_t *>(p.scales) + ((srow[r] + (kk >> p.lg)) & ~(int64_t)3));
                cp_async4(st + S::SCALES + (tid * 4 + r) * 4, sw, live);
            }
            for (int i = tid; i < p.M * A_PIECES; i += THREADS) { /* rows >= M stay zero */
                const int m = i / A_PIECES, q = i % A_PIECES;
                const int k = c * KCHUNK + q * (16 / (int)sizeof(AT));
                const bool live = k < p.K;
                cp_async16(st + S::A + m * S::A_ROW + q * 16, A + (live ? (int64_t)m * p.K + k : 0), live);
            }
        }
        cp_async_commit();
    };

    /* activation rows past M: zero in every stage, once (the copies never touch them) */
    for (int st = 0; st < S::COUNT; st++)
        for (int i = p.M * S::A_ROW / 16 + tid; i < NT * 8 * S::A_ROW / 16; i += THREADS)
            reinterpret_cast<uint4 *>(smem + st * S::BYTES + S::A)[i] = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < S::COUNT - 1; i++) issue(cbeg + i);

    for (int c = cbeg; c < cend; c++) {
        cp_async_wait<S::COUNT - 2>(); /* this thread's copies of chunk c have landed */
        __syncthreads();               /* ... and everyone's; stage (c - 1) % COUNT is free again */
        issue(c + S::COUNT - 1);
        const uint8_t *st = smem + (c % S::COUNT) * S::BYTES;
        const int k0 = c * KCHUNK + 32 * t;
        uint4 code[4];
        uint32_t sc[4][8];
        const uint4 sw = *reinterpret_cast<const uint4 *>(st + S::SCALES + tid * 16);
        const uint32_t words[4] = {sw.x, sw.y, sw.z, sw.w};
#pragma unroll
        for (int r = 0; r < 4; r++) {
            code[r] = *reinterpret_cast<const uint4 *>(st + S::CODES + (r * THREADS + tid) * 16);
            row_scales<F>(p, srow[r] + (k0 >> p.lg), k0, words[r], sc[r]);
        }
        const AT *arow = reinterpret_cast<const AT *>(st + S::A);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            /* weight fragments of MMA j: a0/a2 from row g, a1/a3 from row g + 8 */
            uint32_t af[2][4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const uint32_t word = j < 2 ? code[r].x : j < 4 ? code[r].y : j < 6 ? code[r].z : code[r].w;
                /* selectors and sign picks of a word's 8 codes at once; MMA j takes half j & 1 */
                const uint32_t sel = word & 0x77777777u, pick = 0x32103210u | ((word >> 1) & 0x44444444u);
                uint32_t p01, p23;
                dequant4(lut, (j & 1) ? sel >> 16 : sel, (j & 1) ? pick >> 16 : pick, p01, p23);
                af[r >> 1][(r & 1)] = bf16x2_mul(p01, sc[r][j]);
                af[r >> 1][2 + (r & 1)] = bf16x2_mul(p23, sc[r][j]);
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint32_t bf[3][2];
                act_frag(arow + (nt * 8 + g) * (S::A_ROW / (int)sizeof(AT)), 32 * t + 4 * j, bf);
#pragma unroll
                for (int part = 0; part < PARTS; part++)
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
                        mma_bf16(acc[mt][nt], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[part][0], bf[part][1]);
            }
        }
    }
    cp_async_wait<0>();

    /* accumulator (mt, nt, i): weight row g + 8 (i >> 1) of tile mt, activation row nt*8 + 2t + (i & 1) */
    if (p.slices == 1) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int64_t n = nrow[2 * mt + (i >> 1)];
                    const int m = nt * 8 + 2 * t + (i & 1);
                    if (m < p.M && n < p.N) store_c(p, m, n, acc[mt][nt][i]);
                }
        return;
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int64_t n = nrow[2 * mt + (i >> 1)];
                const int m = nt * 8 + 2 * t + (i & 1);
                if (m < p.M && n < p.N) p.ws[((int64_t)slice * p.M + m) * p.N + n] = acc[mt][nt][i];
            }
    __threadfence(); /* partials visible device-wide before this CTA counts itself in */
    __syncthreads();
    if (tid == 0) {
        const unsigned prev = atomicAdd(&p.counters[rb], 1u);
        last = prev == (unsigned)p.slices - 1;
        if (last) p.counters[rb] = 0; /* every counter is zero again for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int idx = tid; idx < ROWS_PER_CTA * p.M; idx += THREADS) {
        const int m = idx / ROWS_PER_CTA;
        const int64_t n = (int64_t)rb * ROWS_PER_CTA + idx % ROWS_PER_CTA;
        if (n >= p.N) continue;
        float sum = 0.0f;
        for (int s = 0; s < p.slices; s++) sum += __ldcg(&p.ws[((int64_t)s * p.M + m) * p.N + n]);
        store_c(p, m, n, sum);
    }
}

template <int F, int NT, typename AT>
cudaError_t launch_one(const DG &p, unsigned blocks, cudaStream_t s)
{
    constexpr int smem = Stage<NT, AT>::SMEM;
    /* above 48 KB of dynamic shared memory a kernel must opt in */
    cudaError_t err = cudaFuncSetAttribute(decode_gemm_kernel<F, NT, AT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    decode_gemm_kernel<F, NT, AT><<<blocks, THREADS, smem, s>>>(p);
    return cudaSuccess;
}

template <int F, typename AT>
cudaError_t launch_nt(const DG &p, unsigned blocks, cudaStream_t s)
{
    if (p.M <= 8) return launch_one<F, 1, AT>(p, blocks, s);
    if (p.M <= 16) return launch_one<F, 2, AT>(p, blocks, s);
    if (p.M <= 32) return launch_one<F, 4, AT>(p, blocks, s);
    return launch_one<F, 8, AT>(p, blocks, s);
}

template <typename AT>
cudaError_t launch_fmt(const DG &p, int fmt, unsigned blocks, cudaStream_t s)
{
    if (fmt == MX4) return launch_nt<MX4, AT>(p, blocks, s);
    if (fmt == NV) return launch_nt<NV, AT>(p, blocks, s);
    return launch_nt<HIF4, AT>(p, blocks, s);
}

} // namespace

int fp4rl_cuda_decode_gemm_fits(const fp4rl_tensor *a, const fp4rl_tensor *w)
{
    if (fp4rl_format_of(w->dtype).code_bits != 4) return 0; /* the 4-bit formats' lookup tables */
    if (a->dtype != FP4RL_DTYPE_F32 && a->dtype != FP4RL_DTYPE_BF16) return 0;
    if (a->ndim != 2 || w->ndim != 2) return 0;
    /* K % 32 == 0: every 32nd k starts a 16-byte aligned piece of a code row, and the scale bytes
     * of 32 consecutive k (two for NVFP4 and 16-tiles, at an even index) sit in one aligned word */
    return a->dims[0] <= FP4RL_DECODE_MAX_M && a->dims[1] % 32 == 0 && w->dims[1] == a->dims[1] && w->dims[0] <= 0x7fffffff &&
           a->dims[1] <= 0x7fffffff;
}

fp4rl_status fp4rl_cuda_split_counters(fp4rl_context *ctx, size_t n, unsigned **out)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    if (n > cu->counters_len) { /* cudaFree waits for the kernels using the old array */
        unsigned *nc = NULL;
        cudaError_t err = cudaMalloc((void **)&nc, n * sizeof(unsigned));
        /* zeroed in the context's stream order, like everything the kernels read */
        if (err == cudaSuccess) err = cudaMemsetAsync(nc, 0, n * sizeof(unsigned), cu->stream);
        if (err != cudaSuccess) {
            cudaFree(nc);
            return fp4rl_cuda_fail(ctx, err, "fp4rl_matmul: split-K counters");
        }
        cudaFree(cu->counters);
        cu->counters = nc;
        cu->counters_len = n;
    }
    *out = cu->counters;
    return FP4RL_OK;
}

fp4rl_status fp4rl_cuda_decode_gemm(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *w, float alpha)
{
    return fp4rl_cuda_decode_gemm_split(ctx, c, a, w, alpha, 0);
}

fp4rl_status fp4rl_cuda_decode_gemm_split(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *w, float alpha,
                                          int want_slices)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    if (!fp4rl_cuda_decode_gemm_fits(a, w)) return FP4RL_ERR_UNSUPPORTED;
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    DG p;
    p.a = a->data;
    p.codes = static_cast<const uint8_t *>(w->data);
    p.scales = w->scales;
    p.c = c->data;
    p.M = (int)a->dims[0];
    p.N = (int)w->dims[0];
    p.K = (int)a->dims[1];
    p.row_bytes = w->q.row_bytes;
    p.scale_cols = w->q.scale_cols;
    p.tile = w->q.tile;
    const int extent = w->q.tile ? w->q.tile : w->q.block; /* 16, 32 or 64 */
    p.lg = extent == 16 ? 4 : extent == 32 ? 5 : 6;
    p.c_bf16 = c->dtype == FP4RL_DTYPE_BF16;
    p.alpha = alpha;
    p.chunks = (p.K + KCHUNK - 1) / KCHUNK;
    const int rblocks = (p.N + ROWS_PER_CTA - 1) / ROWS_PER_CTA;
    /* enough CTAs for about four per multiprocessor; each slice keeps at least 4 chunks */
    int slices = (4 * cu->sm_count + rblocks - 1) / rblocks;
    if (slices > p.chunks / 4) slices = p.chunks / 4;
    if (slices < 1) slices = 1;
    if (slices > 32) slices = 32;
    if (want_slices > 0) slices = want_slices < p.chunks ? want_slices : p.chunks;
    p.chunks_per_slice = (p.chunks + slices - 1) / slices;
    p.slices = (p.chunks + p.chunks_per_slice - 1) / p.chunks_per_slice;
    p.ws = NULL;
    p.counters = cu->counters;
    void *ws = NULL;
    if (p.slices > 1) {
        st = fp4rl_cuda_split_counters(ctx, (size_t)rblocks, &p.counters);
        if (st) return st;
        st = fp4rl_cuda_alloc_bytes(ctx, &ws, (size_t)p.slices * p.M * p.N * sizeof(float));
        if (st) return st;
        p.ws = static_cast<float *>(ws);
    }
    const unsigned blocks = (unsigned)(rblocks * p.slices);
    const int fmt = (int)w->dtype;
    cudaError_t err = a->dtype == FP4RL_DTYPE_BF16 ? launch_fmt<uint16_t>(p, fmt, blocks, cu->stream)
                                                   : launch_fmt<float>(p, fmt, blocks, cu->stream);
    st = err != cudaSuccess ? fp4rl_cuda_fail(ctx, err, "fp4rl_matmul: decode GEMM shared memory")
                            : fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: decode GEMM kernel");
    fp4rl_cuda_free_bytes(ctx, ws); /* stream order keeps later users of the block after this kernel */
    return st;
}
