/*
 * decode_packed.cu - the decode GEMM on re-laid-out FP4 weights (decode_packed.h; the layout and
 * its bit arithmetic are in decode_layout.h).
 *
 * At decode sizes (M up to a few hundred rows) the product is bound by reading W, and the old
 * kernel (decode_gemm.cu, on fp4rl's own layout) spent ~6.7 instructions per weight on gathering
 * and decoding it, so it was bound by instruction issue at 23% of DRAM bandwidth. Here the layout
 * does the gathering once per weight sync: each warp streams contiguous 16-byte pieces, every
 * lane's 32-bit word is the 8 codes of one MMA fragment, and turning a pair of codes into the BF16
 * pair of the fragment is a rotation, a mask and one BF16 multiply (the scale), about 2
 * instructions per weight with the MMAs and the pipeline.
 *
 * Work: a CTA is `wn` (4 or 8) warps, TN tiles of 16 weight rows each (two from M > 16: every
 * activation fragment then feeds the MMAs of both), over one slice of K and one block of up to
 * 8 * NT activation rows (NT n8 tiles of the MMA; each weight fragment is dequantized once per
 * kgroup and used for all of them; rows beyond 128 take further blocks of the grid, which re-read
 * W mostly from L2 since they run side by side). Stages of KS
 * kgroups (64 k each) go through a cp.async pipeline into shared memory: the warps' records and
 * the activation rows of the stage (shared by all warps; 16 bytes of padding per row spread the
 * fragment loads over the banks). Split-K slices of one row block form a thread-block cluster and
 * add their partial sums through distributed shared memory in rank order, so the result does not
 * depend on timing and needs no workspace. ResQ's two halves of x take the same dequantized
 * fragments (the weight is read and decoded once).
 */
#include <cooperative_groups.h>

#include "cuda_internal.h"
#include "decode_layout.h"
#include "decode_packed.h"
#include "mma_common.cuh"
#include "quant_common.cuh"

namespace cg = cooperative_groups;
using namespace fp4rl_cuda_q;
using namespace fp4rl_cuda_mma;

struct fp4rl_dg_layout {
    fp4rl_dtype fmt;
    int64_t N, K;
    int tiles, kgs;
    uint8_t *rec;
    size_t bytes;
    int d;
    uint32_t c2;
    float alpha; /* 2^d, times NVFP4's tensor scale */
};

namespace {

constexpr int MAX_WARPS = 8, MAX_SLICES = 8;

/* Per activation block: NT n8 tiles (8 NT rows); kgroups per stage and pipeline depth chosen so
 * that a stage is a few KB of weights per warp and all stages fit next to a few CTAs per SM. */
/* TN: weight tiles per warp. From M > 16 on every activation fragment read from shared memory
 * feeds the MMAs of two tiles (half the shared-memory and L2 traffic of x per weight, twice the
 * independent accumulators); at M <= 16 one tile per warp keeps more CTAs for the bytes in flight.
 * Stages: M <= 8 keeps five of two kgroups (a stage is almost all weight); the sizes keep about
 * eight CTAs of 4 warps per SM within the 228 KB of shared memory, the sweep's best shape. */
__host__ __device__ constexpr int cfg_tn(int NT) { return NT >= 4 ? 2 : 1; }
__host__ __device__ constexpr int cfg_ks(int NT) { return NT <= 2 ? 2 : 1; }
__host__ __device__ constexpr int cfg_stages(int NT) { return NT == 1 ? 5 : NT <= 8 ? 4 : 3; }
template <int NT>
struct Cfg {
    static constexpr int MROWS = 8 * NT;
    static constexpr int TN = cfg_tn(NT);
    static constexpr int KS = cfg_ks(NT);
    static constexpr int STAGES = cfg_stages(NT);
    static constexpr int RS = KS * FP4RL_DG_KGROUP * 2 + 16; /* bytes per activation row of a stage */
};

struct Args {
    const uint8_t *rec;
    const uint16_t *x;
    float *y;
    const float *bias;
    int64_t ldx; /* elements per row of x: K, or 2K with ResQ */
    int M, N, K, halves;
    int tiles, kgs, wn, slices, kg_per_slice, mblocks;
    int arows; /* activation rows per half in a stage: min(M, 8 NT) */
    int stage_bytes;
    uint32_t c2;
    float alpha;
};

/* Two BF16 products. Exact here (decode_layout.h), so the rounding never acts; subnormal inputs
 * (the E2M1 and HiF4 patterns) are kept, as half-precision arithmetic does without .ftz. */
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b)
{
    uint32_t r;
#if __CUDA_ARCH__ >= 900
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
#else
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
#endif
    return r;
}

/* The BF16 multiplier pairs of lane (g, t) in one record: rows g (mg) and g + 8 (mg8) for the
 * four MMAs of the kgroup (they differ only for HiF4's micro-blocks). */
template <int F>
__device__ __forceinline__ void lane_mults(const uint8_t *rec, int lane, int g, int t, uint32_t c2, uint32_t mg[4], uint32_t mg8[4])
{
    const uint8_t *sc = rec + FP4RL_DG_CODE_BYTES;
    if constexpr (F == HIF4) {
        const uint32_t hb = *reinterpret_cast<const uint16_t *>(sc + 64 + 2 * g);
        const uint32_t sb = fp4rl_dg_mult(F, fp4rl_dg_dup_byte(hb, 0), c2), sb8 = fp4rl_dg_mult(F, fp4rl_dg_dup_byte(hb, 1), c2);
        const uint32_t h = *reinterpret_cast<const uint16_t *>(sc + 2 * lane), h8 = h >> 8;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            mg[j] = fp4rl_dg_inc_mult(h, j, sb);
            mg8[j] = fp4rl_dg_inc_mult(h8, j, sb8);
        }
    } else {
        const uint32_t hs = *reinterpret_cast<const uint16_t *>(sc + 2 * fp4rl_dg_scale_slot(F, g, t));
        const uint32_t s = fp4rl_dg_mult(F, fp4rl_dg_dup_byte(hs, 0), c2), s8 = fp4rl_dg_mult(F, fp4rl_dg_dup_byte(hs, 1), c2);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            mg[j] = s;
            mg8[j] = s8;
        }
    }
}

template <int F, int NT>
__global__ void __launch_bounds__(MAX_WARPS * 32) dg_kernel(const Args p)
{
    using C = Cfg<NT>;
    constexpr int R = fp4rl_dg_record_bytes(F);
    constexpr int TN = C::TN;
    constexpr int SETS = NT == 1 ? 2 : 1; /* two accumulators break the chain of dependent MMAs at M <= 8 */
    extern __shared__ __align__(16) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int nthreads = p.wn * 32;
    int bid = blockIdx.x;
    const int slice = bid % p.slices;
    bid /= p.slices;
    const int mb = bid % p.mblocks, rb = bid / p.mblocks;
    const int tile = (rb * p.wn + warp) * TN; /* this warp's first tile; it has tiles tile .. tile + TN - 1 */
    const bool live = tile < p.tiles;
    const int m0 = mb * C::MROWS, Mb = min(C::MROWS, p.M - m0);
    const int kg0 = slice * p.kg_per_slice, kg1 = min(p.kgs, kg0 + p.kg_per_slice);
    const int nst = kg1 > kg0 ? (kg1 - kg0 + C::KS - 1) / C::KS : 0;
    const int wbytes = p.wn * TN * C::KS * R;

    /* Copies stage i (kgroups kg0 + i KS ..) into slot i % STAGES; every call commits one group so
     * the wait counts stay aligned. Activation pieces of k >= K are zero-filled; rows >= Mb are
     * never read (the fragment loads below give zeros for them). */
    constexpr int PR = C::KS * 8; /* 16-byte pieces per activation row of a stage */
    const int aq = tid % PR, am0 = tid / PR, astep = nthreads / PR;
    auto issue = [&](int i) {
        if (i < nst) {
            uint8_t *st = smem + (i % C::STAGES) * p.stage_bytes;
            const int kgs = kg0 + i * C::KS, nk = min(C::KS, kg1 - kgs);
            if (live) {
#pragma unroll
                for (int u = 0; u < TN; u++) {
                    /* a tile past the last one reads zeros (its results are never stored) */
                    const bool ok = tile + u < p.tiles;
                    const uint8_t *src = p.rec + (ok ? ((int64_t)(tile + u) * p.kgs + kgs) * R : 0);
                    uint8_t *dst = st + (warp * TN + u) * C::KS * R;
                    for (int q = lane; q < nk * (R / 16); q += 32) cp_async16(dst + 16 * q, src + (ok ? 16 * q : 0), ok);
                }
            }
            if (aq < nk * 8) {
                uint8_t *act = st + wbytes + aq * 16;
                const int k = kgs * FP4RL_DG_KGROUP + aq * 8;
                const bool ok = k < p.K;
                for (int h = 0; h < p.halves; h++)
                    for (int m = am0; m < Mb; m += astep)
                        cp_async16(act + (h * p.arows + m) * C::RS, p.x + (ok ? (int64_t)(m0 + m) * p.ldx + h * p.K + k : 0), ok);
            }
        }
        cp_async_commit();
    };

    float acc[SETS][TN][NT][4];
#pragma unroll
    for (int s = 0; s < SETS; s++)
#pragma unroll
        for (int u = 0; u < TN; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[s][u][nt][i] = 0.0f;

#pragma unroll
    for (int i = 0; i < C::STAGES - 1; i++) issue(i);

    for (int i = 0; i < nst; i++) {
        cp_async_wait<C::STAGES - 2>(); /* this thread's copies of stage i have landed */
        __syncthreads();                /* ... and everyone's; the slot of stage i - 1 is free again */
        issue(i + C::STAGES - 1);
        if (!live) continue;
        const uint8_t *st = smem + (i % C::STAGES) * p.stage_bytes;
        const uint8_t *act = st + wbytes + t * 32;
        const int nk = min(C::KS, kg1 - (kg0 + i * C::KS));
#pragma unroll
        for (int kk = 0; kk < C::KS; kk++) {
            if (kk >= nk) break;
            uint32_t words[TN][4], mg[TN][4], mg8[TN][4];
#pragma unroll
            for (int u = 0; u < TN; u++) {
                const uint8_t *rec = st + ((warp * TN + u) * C::KS + kk) * R;
                const uint4 q4 = *reinterpret_cast<const uint4 *>(rec + 16 * lane);
                words[u][0] = q4.x;
                words[u][1] = q4.y;
                words[u][2] = q4.z;
                words[u][3] = q4.w;
                lane_mults<F>(rec, lane, g, t, p.c2, mg[u], mg8[u]);
            }
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                /* the fragments of MMAs j = 2jj, 2jj + 1 of every tile */
                uint32_t a[TN][2][4];
#pragma unroll
                for (int u = 0; u < TN; u++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int j = 2 * jj + e;
                        uint32_t P[4];
                        fp4rl_dg_patterns(F, words[u][j], P);
                        a[u][e][0] = hmul2(P[0], mg[u][j]);
                        a[u][e][1] = hmul2(P[1], mg8[u][j]);
                        a[u][e][2] = hmul2(P[2], mg[u][j]);
                        a[u][e][3] = hmul2(P[3], mg8[u][j]);
                    }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if (h >= p.halves) break;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const int row = nt * 8 + g;
                        /* activations k = 16t + 8jj .. +7 of kgroup kk: B fragments of both MMAs */
                        uint4 v = make_uint4(0u, 0u, 0u, 0u);
                        if (row < Mb)
                            v = *reinterpret_cast<const uint4 *>(act + (h * p.arows + row) * C::RS + kk * (FP4RL_DG_KGROUP * 2) + jj * 16);
#pragma unroll
                        for (int u = 0; u < TN; u++) {
                            mma_bf16(acc[0][u][nt], a[u][0][0], a[u][0][1], a[u][0][2], a[u][0][3], v.x, v.y);
                            mma_bf16(acc[SETS - 1][u][nt], a[u][1][0], a[u][1][1], a[u][1][2], a[u][1][3], v.z, v.w);
                        }
                    }
                }
            }
        }
    }
    cp_async_wait<0>();

    /* accumulator (nt, i): weight row g + 8 (i >> 1) of the tile, activation row 8 nt + 2t + (i & 1) */
    if (p.slices == 1) {
        if (!live) return;
#pragma unroll
        for (int u = 0; u < TN; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int n = (tile + u) * FP4RL_DG_TILE + g + 8 * (i >> 1), m = nt * 8 + 2 * t + (i & 1);
                    if (m < Mb && n < p.N) {
                        const float s = SETS == 2 ? acc[0][u][nt][i] + acc[SETS - 1][u][nt][i] : acc[0][u][nt][i];
                        p.y[(int64_t)(m0 + m) * p.N + n] = p.alpha * s + (p.bias ? p.bias[n] : 0.0f);
                    }
                }
        return;
    }
#if __CUDA_ARCH__ >= 900
    /* split K: partial sums [m][n of the row block] in this CTA's shared memory, then each rank of
     * the cluster adds one range of them over all ranks in rank order */
    __syncthreads(); /* every warp is done with the stages */
    float *red = reinterpret_cast<float *>(smem);
    const int NL = p.wn * TN * FP4RL_DG_TILE, lg = (p.wn == 8 ? 7 : 6) + (TN == 2 ? 1 : 0);
    if (live) {
#pragma unroll
        for (int u = 0; u < TN; u++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int m = nt * 8 + 2 * t + (i & 1);
                    if (m < Mb) /* rows past Mb have no room when the CTA covers fewer rows (arows) */
                        red[m * NL + (warp * TN + u) * FP4RL_DG_TILE + g + 8 * (i >> 1)] =
                            SETS == 2 ? acc[0][u][nt][i] + acc[SETS - 1][u][nt][i] : acc[0][u][nt][i];
                }
    }
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    const int rank = (int)cl.block_rank(), S = p.slices;
    const float *parts[MAX_SLICES];
#pragma unroll
    for (int q = 0; q < MAX_SLICES; q++) parts[q] = q < S ? cl.map_shared_rank(red, q) : red;
    const int E = Mb * NL, e0 = (int)((int64_t)E * rank / S), e1 = (int)((int64_t)E * (rank + 1) / S);
    for (int e = e0 + tid; e < e1; e += nthreads) {
        const int m = e >> lg, nl = e & (NL - 1);
        const int64_t n = (int64_t)rb * NL + nl;
        if (n >= p.N) continue;
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < MAX_SLICES; q++)
            if (q < S) s += parts[q][e];
        p.y[(int64_t)(m0 + m) * p.N + n] = p.alpha * s + (p.bias ? p.bias[n] : 0.0f);
    }
    cl.sync(); /* no CTA leaves while another still reads its shared memory */
#else
    __trap(); /* clusters need sm_90: the host launches one slice there (fp4rl_cuda_dg_run_cfg) */
#endif
}

/* ---- prepare: the largest scale, then the records ---- */
__global__ void scan_kernel(int fmt, const void *scales, int64_t n, unsigned *out)
{
    unsigned mx = 0, mn = 0xffffffffu;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        unsigned s;
        if (fmt == HIF4) {
            s = fp4rl_hif4_word_base_bits(static_cast<const uint32_t *>(scales)[i]);
            if (s == FP4RL_HIF4_NAN_WORD) continue;
        } else {
            s = static_cast<const uint8_t *>(scales)[i];
            if (fmt == NV) {
                s &= 0x7fu;
                if (s == FP4RL_UE4M3_NAN) continue;
            } else if (s == FP4RL_E8M0_NAN) {
                continue;
            }
        }
        mx = max(mx, s);
        if (s) mn = min(mn, s);
    }
    atomicMax(&out[0], mx);
    atomicMin(&out[1], mn);
}

__global__ void relayout_kernel(fp4rl_dg_src src, int d, int64_t tiles, int64_t kgs, uint8_t *rec)
{
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= tiles * kgs * 32) return;
    const int l = (int)(id & 31);
    const int64_t rc = id >> 5, i = rc / kgs, c = rc - i * kgs;
    fp4rl_dg_build_lane(&src, d, i, c, l, rec + rc * fp4rl_dg_record_bytes(src.fmt));
}

/* ---- launch ---- */
template <int F, int NT>
cudaError_t launch(const Args &a, int blocks, int smem, cudaStream_t s)
{
    cudaError_t err = cudaFuncSetAttribute(dg_kernel<F, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)blocks);
    cfg.blockDim = dim3((unsigned)(a.wn * 32));
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)a.slices;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = a.slices > 1 ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, dg_kernel<F, NT>, a);
}

/* CTAs of this shape that fit on one multiprocessor (registers, shared memory, threads). */
template <int F, int NT>
int fit(int wn, int smem)
{
    int n = 0;
    if (cudaFuncSetAttribute(dg_kernel<F, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, dg_kernel<F, NT>, wn * 32, (size_t)smem) != cudaSuccess)
        n = 0;
    return n > 0 ? n : 1;
}

template <int F>
int fit_nt(int NT, int wn, int smem)
{
    switch (NT) {
    case 1: return fit<F, 1>(wn, smem);
    case 2: return fit<F, 2>(wn, smem);
    case 4: return fit<F, 4>(wn, smem);
    case 8: return fit<F, 8>(wn, smem);
    default: return fit<F, 16>(wn, smem);
    }
}

template <int F>
cudaError_t launch_nt(int NT, const Args &a, int blocks, int smem, cudaStream_t s)
{
    switch (NT) {
    case 1: return launch<F, 1>(a, blocks, smem, s);
    case 2: return launch<F, 2>(a, blocks, smem, s);
    case 4: return launch<F, 4>(a, blocks, smem, s);
    case 8: return launch<F, 8>(a, blocks, smem, s);
    default: return launch<F, 16>(a, blocks, smem, s);
    }
}

} // namespace

extern "C" {

fp4rl_status fp4rl_cuda_dg_prepare_raw(fp4rl_context *ctx, fp4rl_dtype fmt, int tile, int64_t N, int64_t K, const void *codes,
                                       int64_t row_bytes, const void *scales, int64_t scale_cols, float tensor_scale,
                                       fp4rl_dg_layout **out)
{
    *out = NULL;
    if (!fp4rl_dg_format_ok(fmt))
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "decode GEMM: %s weights are not supported (MXFP4, NVFP4, HiF4)", fp4rl_dtype_name(fmt));
    if (N < 1 || K < 8 || K % 8 || K > ((int64_t)1 << 30) || N > ((int64_t)1 << 30) || !fp4rl_format_tile_ok(fmt, tile))
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "decode GEMM: weight [%lld, %lld] tile %d not supported (K a multiple of 8)",
                          (long long)N, (long long)K, tile);
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    const fp4rl_format_traits tr = fp4rl_format_of(fmt);
    int64_t srows, scols;
    fp4rl_scale_dims(tr, tile, N, K, &srows, &scols);
    if (scale_cols != scols)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "decode GEMM: %lld scale columns, the layout has %lld", (long long)scale_cols,
                          (long long)scols);
    /* 1. the largest (and MXFP4's smallest non-zero) scale, to the host: the exponent offset d */
    unsigned *scan = NULL, host[2];
    st = fp4rl_cuda_alloc_bytes(ctx, (void **)&scan, 2 * sizeof(unsigned));
    if (st) return st;
    cudaError_t err = cudaMemsetAsync(scan, 0, sizeof(unsigned), cu->stream);
    if (err == cudaSuccess) err = cudaMemsetAsync(scan + 1, 0xff, sizeof(unsigned), cu->stream);
    if (err == cudaSuccess) {
        const int64_t n = srows * scols;
        const int blocks = (int)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
        scan_kernel<<<blocks, 256, 0, cu->stream>>>((int)fmt, scales, n, scan);
        err = cudaGetLastError();
    }
    if (err == cudaSuccess) err = cudaMemcpyAsync(host, scan, sizeof host, cudaMemcpyDeviceToHost, cu->stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(cu->stream);
    fp4rl_cuda_free_bytes(ctx, scan);
    if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "decode GEMM: scale scan");
    const int d = fp4rl_dg_pick_d(fmt, host[0], host[1]);
    if (d < 0)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "decode GEMM: the %s scales span too wide a range to stay exact in BF16 products",
                          fp4rl_dtype_name(fmt));
    /* 2. the records */
    fp4rl_dg_layout *L = (fp4rl_dg_layout *)calloc(1, sizeof *L);
    if (!L) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "decode GEMM: out of host memory");
    L->fmt = fmt;
    L->N = N;
    L->K = K;
    L->tiles = (int)((N + FP4RL_DG_TILE - 1) / FP4RL_DG_TILE);
    L->kgs = (int)((K + FP4RL_DG_KGROUP - 1) / FP4RL_DG_KGROUP);
    L->bytes = (size_t)L->tiles * (size_t)L->kgs * (size_t)fp4rl_dg_record_bytes(fmt);
    L->d = d;
    L->c2 = fp4rl_dg_c2(fmt, d);
    L->alpha = fp4rl_exp2i(d) * (fmt == FP4RL_DTYPE_NVFP4 ? tensor_scale : 1.0f);
    st = fp4rl_cuda_alloc_bytes(ctx, (void **)&L->rec, L->bytes);
    if (st) {
        free(L);
        return st;
    }
    fp4rl_dg_src src;
    src.fmt = (int)fmt;
    src.tile = tile;
    src.N = N;
    src.K = K;
    src.row_bytes = row_bytes;
    src.scale_cols = scale_cols;
    src.codes = static_cast<const uint8_t *>(codes);
    src.scales = scales;
    const int64_t lanes = (int64_t)L->tiles * L->kgs * 32;
    relayout_kernel<<<(unsigned)((lanes + 255) / 256), 256, 0, cu->stream>>>(src, d, L->tiles, L->kgs, L->rec);
    st = fp4rl_cuda_check_launch(ctx, "decode GEMM: relayout");
    if (st) {
        fp4rl_cuda_dg_destroy(ctx, L);
        return st;
    }
    *out = L;
    return FP4RL_OK;
}

fp4rl_status fp4rl_cuda_dg_prepare(fp4rl_context *ctx, const fp4rl_tensor *w, fp4rl_dg_layout **out)
{
    *out = NULL;
    if (!fp4rl_dg_format_ok(w->dtype) || w->ndim != 2)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "decode GEMM: needs a 2-dim MXFP4, NVFP4 or HiF4 weight");
    return fp4rl_cuda_dg_prepare_raw(ctx, w->dtype, w->q.tile, w->dims[0], w->dims[1], w->data, w->q.row_bytes, w->scales,
                                     w->q.scale_cols, w->tensor_scale, out);
}

void fp4rl_cuda_dg_destroy(fp4rl_context *ctx, fp4rl_dg_layout *L)
{
    if (!L) return;
    fp4rl_cuda_free_bytes(ctx, L->rec); /* stream order keeps it alive for the kernels queued on it */
    free(L);
}

void fp4rl_cuda_dg_info(const fp4rl_dg_layout *L, fp4rl_dtype *fmt, int64_t *N, int64_t *K, size_t *bytes, int *d)
{
    if (fmt) *fmt = L->fmt;
    if (N) *N = L->N;
    if (K) *K = L->K;
    if (bytes) *bytes = L->bytes;
    if (d) *d = L->d;
}

fp4rl_status fp4rl_cuda_dg_run_cfg(fp4rl_context *ctx, float *y, const uint16_t *x, int64_t M, int resq, const fp4rl_dg_layout *L,
                                   const float *bias, int warps, int slices)
{
    if (M < 1 || M > ((int64_t)1 << 24)) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "decode GEMM: M = %lld", (long long)M);
    if ((warps && warps != 4 && warps != 8) || slices < 0 || slices > MAX_SLICES)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "decode GEMM: warps %d (4 or 8), slices %d (1..%d)", warps, slices, MAX_SLICES);
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    const int NT = M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : M <= 64 ? 8 : 16;
    const int mrows = 8 * NT, ks = cfg_ks(NT), stages = cfg_stages(NT), tn = cfg_tn(NT);
    Args a;
    a.rec = L->rec;
    a.x = x;
    a.y = y;
    a.bias = bias;
    a.halves = resq ? 2 : 1;
    a.ldx = L->K * a.halves;
    a.M = (int)M;
    a.N = (int)L->N;
    a.K = (int)L->K;
    a.tiles = L->tiles;
    a.kgs = L->kgs;
    a.mblocks = (int)((M + mrows - 1) / mrows);
    a.arows = M < mrows ? (int)M : mrows;
    a.c2 = L->c2;
    a.alpha = L->alpha;
    /* The H200 sweep of v1 (8192^2): 4 warps and as many split-K slices as fill the machine
     * (4 warps x 8 slices: 26.4 us at M = 1 against 31.1 for two CTAs per SM; the same at M = 16
     * and 64). So: 4 warps (8 when the row blocks alone fill it), and slices up to one full wave
     * of CTAs as far as registers and shared memory let them be resident at once (never a second,
     * partial wave); each slice keeps at least two stages. */
    const int sms = cu->sm_count, R = fp4rl_dg_record_bytes(L->fmt);
    const int row_bytes = ks * FP4RL_DG_KGROUP * 2 + 16;
    const int arows = M < mrows ? (int)M : mrows;
    auto smem_of = [&](int wn, int sl) {
        const int pipe = stages * (wn * tn * ks * R + a.halves * arows * row_bytes);
        const int red = sl > 1 ? wn * tn * FP4RL_DG_TILE * arows * (int)sizeof(float) : 0;
        return pipe > red ? pipe : red;
    };
    auto fits = [&](int wn, int sl) {
        const int sm = smem_of(wn, sl);
        return L->fmt == FP4RL_DTYPE_MXFP4 ? fit_nt<MX4>(NT, wn, sm) : L->fmt == FP4RL_DTYPE_NVFP4 ? fit_nt<NV>(NT, wn, sm) : fit_nt<HIF4>(NT, wn, sm);
    };
    a.wn = warps ? warps : ((L->tiles + 8 * tn - 1) / (8 * tn) * a.mblocks >= fits(8, 1) * sms ? 8 : 4);
    const int rblocks = (L->tiles + a.wn * tn - 1) / (a.wn * tn);
    int s = slices;
    if (!s) {
        const int ctas = rblocks * a.mblocks, smax = L->kgs / (2 * ks) > 1 ? L->kgs / (2 * ks) : 1;
        s = fits(a.wn, 2) * sms / ctas;
        if (s < 1) s = 1;
        if (s > smax) s = smax;
        if (s > MAX_SLICES) s = MAX_SLICES;
    }
    if (s > L->kgs) s = L->kgs;
    if (cu->cc_major < 9) s = 1; /* split-K slices meet in a thread-block cluster (sm_90) */
    a.kg_per_slice = (L->kgs + s - 1) / s;
    a.slices = (L->kgs + a.kg_per_slice - 1) / a.kg_per_slice; /* no empty slice */
    a.stage_bytes = a.wn * tn * ks * R + a.halves * a.arows * row_bytes;
    const int smem = smem_of(a.wn, a.slices);
    const int64_t blocks = (int64_t)rblocks * a.mblocks * a.slices;
    if (blocks > 0x7fffffff) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "decode GEMM: grid too large");
    cudaError_t err;
    if (L->fmt == FP4RL_DTYPE_MXFP4) err = launch_nt<MX4>(NT, a, (int)blocks, smem, cu->stream);
    else if (L->fmt == FP4RL_DTYPE_NVFP4) err = launch_nt<NV>(NT, a, (int)blocks, smem, cu->stream);
    else err = launch_nt<HIF4>(NT, a, (int)blocks, smem, cu->stream);
    return err != cudaSuccess ? fp4rl_cuda_fail(ctx, err, "decode GEMM: launch") : fp4rl_cuda_check_launch(ctx, "decode GEMM kernel");
}

fp4rl_status fp4rl_cuda_dg_run(fp4rl_context *ctx, float *y, const uint16_t *x, int64_t M, int resq, const fp4rl_dg_layout *L,
                               const float *bias)
{
    return fp4rl_cuda_dg_run_cfg(ctx, y, x, M, resq, L, bias, 0, 0);
}

} // extern "C"
