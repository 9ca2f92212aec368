/*
 * gemm_fp8.cu - the FP8-operand path of HiF4 x HiF4 and MXFP4 x MXFP4 GEMMs (see gemm_fp8.h for
 * the math and the error bound). Pre-pass: quantized codes -> E4M3 bytes + FP32 unit scales.
 * Reference kernel: per-unit exact partial sums promoted into an FP32 accumulator with the two
 * scales, in K order; the fast wgmma kernel must reproduce its products and partials exactly.
 */
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include <cuda.h> /* CUtensorMap and its enums only: the encoder comes through cudaGetDriverEntryPointByVersion (no -lcuda) */

#include "gemm_fp8.h"
#include "format/formats.h"
#include "format/layout.h"
#include "format/traits.h"
#include "wgmma_common.cuh"

namespace {

/* E4M3 byte of a small signed integer-valued float (|v| <= 28, so exact: 3 significant bits). */
__device__ __forceinline__ uint8_t e4m3_exact(float v) { return fp4rl_e4m3_encode(v, -1.0f); }

/* Scalar pre-pass, one thread per (row, unit): the unit's U codes become E4M3 bytes, its scale
 * one float at scales[u * ld + r] (gemm_fp8.h's layout). The fallback of the vectorised kernels
 * below where the codes or the output are not 16-byte aligned; same bytes and scales. */
__global__ void prepass_hif4_kernel(const uint8_t *codes, const uint32_t *words, int64_t rows, int64_t K, int64_t row_bytes,
                                    int64_t scale_cols, int64_t ld, uint8_t *out, float *scales)
{
    const int64_t units = K / FP4RL_HIF4_UNIT;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * units) return;
    const int64_t r = t / units, u = t - r * units;
    const uint32_t w = words[fp4rl_hif4_word_index(scale_cols, r, u * FP4RL_HIF4_UNIT)];
    /* base / 4: the element value k / 4 is stored as k (times 2^inc); NaN word -> NaN scale */
    scales[u * ld + r] = fp4rl_hif4_word_base_bits(w) == FP4RL_HIF4_NAN_WORD ? fp4rl_bits_f32(0x7fc00000u) : fp4rl_hif4_word_base(w) * 0.25f;
    for (int j = 0; j < FP4RL_HIF4_UNIT; j++) {
        const int64_t k = u * FP4RL_HIF4_UNIT + j;
        const uint8_t code = fp4rl_code_get(codes, row_bytes, 4, r, k);
        const float m = (float)(code & 7u) * (float)(1 << fp4rl_hif4_word_inc(w, j));
        out[r * K + k] = e4m3_exact((code & 8u) ? -m : m);
    }
}

__global__ void prepass_mxfp4_kernel(const uint8_t *codes, const uint8_t *sc, int64_t rows, int64_t K, int64_t row_bytes,
                                     int64_t scale_cols, int tile, int64_t ld, uint8_t *out, float *scales)
{
    const int U = 32;
    const int64_t units = K / U;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * units) return;
    const int64_t r = t / units, u = t - r * units;
    /* 2^e / 2: the E2M1 value v is stored as 2 v (an integer <= 12) */
    scales[u * ld + r] = fp4rl_e8m0_decode(sc[fp4rl_scale_index(tile, U, scale_cols, r, u * U)]) * 0.5f;
    for (int j = 0; j < U; j++) {
        const int64_t k = u * U + j;
        out[r * K + k] = e4m3_exact(2.0f * fp4rl_e2m1_decode(fp4rl_code_get(codes, row_bytes, 4, r, k)));
    }
}

/* Vectorised pre-pass: one thread per 32 elements of a row (16 bytes of codes in one load, 32
 * E4M3 bytes in two 16-byte stores), K-fastest across threads; no per-element branches. Four
 * codes (one 16-bit group, element 4q + e in nibble e) become four bytes at once: the magnitude
 * through a byte permute of an 8-entry table (E4M3 of k * 2^inc, HiF4; of 2 e2m1(k), MXFP4), the
 * sign bit 3 of each nibble moved to bit 7 of its byte. HiF4's increment inc = e8[j / 8] +
 * e16[j / 4] is one value for the 4 elements of a micro-block, so it picks the table. The tables
 * equal e4m3_exact of the scalar kernels' values for every code and inc (checked exhaustively on
 * the host: tools/check_fp8_prepass_lut.c), so both kernels write the same bytes. */
__device__ __forceinline__ uint32_t pp_sign4(uint32_t n16)
{
    uint32_t t = n16;
    t = (t | (t << 8)) & 0x00FF00FFu;
    t = (t | (t << 4)) & 0x0F0F0F0Fu; /* byte e = nibble e */
    return (t & 0x08080808u) << 4;
}
__device__ __forceinline__ uint32_t pp_enc4(uint32_t n16, uint32_t lo, uint32_t hi) { return __byte_perm(lo, hi, n16 & 0x7777u) | pp_sign4(n16); }

__global__ void prepass_hif4_vec_kernel(const uint8_t *codes, const uint32_t *words, int64_t rows, int64_t K, int64_t row_bytes,
                                        int64_t scale_cols, int64_t ld, uint8_t *out, float *scales)
{
    const int64_t cpr = K / 32; /* 32-element chunks a row; two a unit */
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * cpr) return;
    const int64_t r = t / cpr, ch = t - r * cpr, k0 = ch * 32;
    const uint4 cv = *reinterpret_cast<const uint4 *>(codes + r * row_bytes + k0 / 2);
    const uint32_t w = words[fp4rl_hif4_word_index(scale_cols, r, k0)];
    if ((ch & 1) == 0)
        scales[(ch >> 1) * ld + r] =
            fp4rl_hif4_word_base_bits(w) == FP4RL_HIF4_NAN_WORD ? fp4rl_bits_f32(0x7fc00000u) : fp4rl_hif4_word_base(w) * 0.25f;
    const int jb = (int)(ch & 1) * 32; /* position of the chunk in its unit */
    const uint32_t cw[4] = {cv.x, cv.y, cv.z, cv.w};
    uint32_t o[8];
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const int j = jb + 4 * q;
        const int inc = fp4rl_hif4_word_inc(w, j);
        /* E4M3 of k * 2^inc, k = 0..7 (bytes 0..7 of hi:lo) */
        const uint32_t lo = inc == 0 ? 0x44403800u : inc == 1 ? 0x4C484000u : 0x54504800u;
        const uint32_t hi = inc == 0 ? 0x4E4C4A48u : inc == 1 ? 0x56545250u : 0x5E5C5A58u;
        o[q] = pp_enc4((cw[q >> 1] >> (16 * (q & 1))) & 0xFFFFu, lo, hi);
    }
    uint4 *dst = reinterpret_cast<uint4 *>(out + r * K + k0);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

__global__ void prepass_mxfp4_vec_kernel(const uint8_t *codes, const uint8_t *sc, int64_t rows, int64_t K, int64_t row_bytes,
                                         int64_t scale_cols, int tile, int64_t ld, uint8_t *out, float *scales)
{
    const int64_t cpr = K / 32; /* one unit a chunk */
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * cpr) return;
    const int64_t r = t / cpr, u = t - r * cpr, k0 = u * 32;
    const uint4 cv = *reinterpret_cast<const uint4 *>(codes + r * row_bytes + k0 / 2);
    scales[u * ld + r] = fp4rl_e8m0_decode(sc[fp4rl_scale_index(tile, 32, scale_cols, r, k0)]) * 0.5f;
    const uint32_t cw[4] = {cv.x, cv.y, cv.z, cv.w};
    uint32_t o[8];
#pragma unroll
    for (int q = 0; q < 8; q++) o[q] = pp_enc4((cw[q >> 1] >> (16 * (q & 1))) & 0xFFFFu, 0x44403800u, 0x54504C48u); /* E4M3 of 2 e2m1(k) */
    uint4 *dst = reinterpret_cast<uint4 *>(out + r * K + k0);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

/* One output a thread: for each unit, p = sum of E4M3 products (exact in FP32), then
 * acc += p * (sa * sb) in K order. Same math as the wgmma kernel's promotion. */
template <typename TC>
__global__ void __launch_bounds__(256) fp8_ref_kernel(const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb, TC *c,
                                                      int64_t M, int64_t N, int64_t K, int U)
{
    const int64_t n = (int64_t)blockIdx.x * 16 + (threadIdx.x & 15), m = (int64_t)blockIdx.y * 16 + (threadIdx.x >> 4);
    if (m >= M || n >= N) return;
    const int64_t units = K / U, lda = FP4RL_FP8_SCALE_LD(M), ldb = FP4RL_FP8_SCALE_LD(N);
    const uint8_t *pa = a8 + m * K, *pb = b8 + n * K;
    float acc = 0.0f;
    for (int64_t u = 0; u < units; u++) {
        float p = 0.0f;
        for (int j = 0; j < U; j++) p += fp4rl_e4m3_decode(pa[u * U + j]) * fp4rl_e4m3_decode(pb[u * U + j]);
        acc += p * (sa[u * lda + m] * sb[u * ldb + n]);
    }
    if (sizeof(TC) == 2) reinterpret_cast<uint16_t *>(c)[m * N + n] = fp4rl_f32_to_bf16(acc);
    else reinterpret_cast<float *>(c)[m * N + n] = acc;
}


/* ---- The tensor-core kernel: warp-level mma.sync m16n8k32 E4M3 x E4M3 -> F32 (sm_89+) ----
 * CTA tile 128 (M) x 128 (N), 8 warps as 2 (M) x 4 (N), each warp 64 x 32 outputs (4 m16 x 4 n8
 * mma tiles). One pipeline stage holds 64 K bytes of A and B (one HiF4 unit, two MXFP4 units)
 * plus their unit scales, fetched with cp.async (16-byte chunks, zero-filled past M / N) into
 * a 4-stage ring. Shared layout of a stage's operand: [128 rows][4 chunks of 16 bytes], chunk c
 * of row r stored at chunk c ^ ((r >> 1) & 3) so the 8 rows of an ldmatrix phase hit 8
 * distinct 16-byte bank groups. Per unit each warp zeroes a partial per mma tile, runs the
 * unit's k32 steps (HiF4 2, MXFP4 1) and promotes acc += p * (sa * sb) in K order, the same
 * math as fp8_ref_kernel (a unit's partial is a sum of <= 64 integer products < 2^10 each,
 * exact in FP32 in any order). Needs K % 64 == 0 (the gate checks it). */
constexpr int TC_BM = 128, TC_BN = 128, TC_BK = 64, TC_STAGES = 4, TC_THREADS = 256;
constexpr int TC_TILE_BYTES = TC_BM * TC_BK; /* A and B tiles: 128 rows x 64 bytes each */
constexpr int TC_SMEM = TC_STAGES * (2 * TC_TILE_BYTES + 2 * 2 * TC_BM * 4); /* + 2 units x 128 scales, A and B */

__device__ __forceinline__ int tc_swz(int r, int c) { return r * TC_BK + ((c ^ ((r >> 1) & 3)) << 4); }

__device__ __forceinline__ void tc_cp16(uint32_t dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tc_cp4(uint32_t dst, const void *src, int bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tc_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void tc_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void tc_ldsm4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

/* d += a b over one 16 x 8 x 32 E4M3 step (F32 accumulate). */
__device__ __forceinline__ void tc_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    (void)d, (void)a, (void)b;
    __trap(); /* the gate never launches it below sm_89 */
#endif
}

template <int U, typename TC>
__global__ void __launch_bounds__(TC_THREADS, 1) fp8_tc_kernel(const uint8_t *__restrict__ a8, const float *__restrict__ sa,
                                                               const uint8_t *__restrict__ b8, const float *__restrict__ sb,
                                                               TC *__restrict__ c, int M, int N, int K)
{
    constexpr int UPS = TC_BK / U; /* units a stage: 1 (HiF4) or 2 (MXFP4) */
    constexpr int KPU = U / 32;    /* k32 steps a unit: 2 or 1 */
    extern __shared__ __align__(128) uint8_t tc_smem[];
    uint8_t *sA = tc_smem, *sB = tc_smem + TC_STAGES * TC_TILE_BYTES;
    float *sSA = reinterpret_cast<float *>(tc_smem + 2 * TC_STAGES * TC_TILE_BYTES); /* [stage][unit][row] */
    float *sSB = sSA + TC_STAGES * 2 * TC_BM;
    const uint32_t sA0 = (uint32_t)__cvta_generic_to_shared(sA), sB0 = (uint32_t)__cvta_generic_to_shared(sB);
    const uint32_t sSA0 = (uint32_t)__cvta_generic_to_shared(sSA), sSB0 = (uint32_t)__cvta_generic_to_shared(sSB);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3; /* warp tile rows wm * 64, cols wn * 32 */
    const int bm = blockIdx.y * TC_BM, bn = blockIdx.x * TC_BN;
    const int KT = K / TC_BK;
    const size_t lda = (size_t)FP4RL_FP8_SCALE_LD(M), ldb = (size_t)FP4RL_FP8_SCALE_LD(N);

    /* Loads of stage kt into ring slot s: 512 chunks of A and of B (2 each a thread), scales. */
    auto load = [&](int kt, int s) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int q = tid + i * TC_THREADS, r = q >> 2, ch = q & 3;
            const int ra = bm + r, rb = bn + r;
            const uint8_t *ga = a8 + (size_t)(ra < M ? ra : 0) * K + (size_t)kt * TC_BK + ch * 16;
            const uint8_t *gb = b8 + (size_t)(rb < N ? rb : 0) * K + (size_t)kt * TC_BK + ch * 16;
            tc_cp16(sA0 + s * TC_TILE_BYTES + tc_swz(r, ch), ga, ra < M ? 16 : 0);
            tc_cp16(sB0 + s * TC_TILE_BYTES + tc_swz(r, ch), gb, rb < N ? 16 : 0);
        }
        if (tid < UPS * TC_BM) {
            const int ul = tid / TC_BM, r = tid % TC_BM, u = kt * UPS + ul;
            const int ra = bm + r, rb = bn + r;
            /* unit-major scales (gemm_fp8.h): consecutive threads read consecutive rows */
            tc_cp4(sSA0 + (uint32_t)((s * 2 + ul) * TC_BM + r) * 4, sa + (size_t)u * lda + (ra < M ? ra : 0), ra < M ? 4 : 0);
            tc_cp4(sSB0 + (uint32_t)((s * 2 + ul) * TC_BM + r) * 4, sb + (size_t)u * ldb + (rb < N ? rb : 0), rb < N ? 4 : 0);
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[mi][ni][j] = 0.0f;

#pragma unroll
    for (int s = 0; s < TC_STAGES - 1; s++) {
        if (s < KT) load(s, s);
        tc_commit();
    }

    const int g = lane >> 2, t = lane & 3;
    /* ldmatrix row addresses. A (x4 per m16 tile and k32 step): lanes 0-7 rows 0-7 k 0-15,
     * 8-15 rows 8-15 k 0-15, 16-23 rows 0-7 k 16-31, 24-31 rows 8-15 k 16-31 -> a0..a3.
     * B (x4 per n8 tile): lanes 8j..8j+7 rows (n) 0-7, chunk j (k 16j..16j+15) -> b[ks=j/2][j%2]. */
    const int a_row = wm * 64 + (lane & 7) + ((lane >> 3) & 1) * 8, a_ch = lane >> 4;
    const int b_row = wn * 32 + (lane & 7), b_ch = lane >> 3;

    for (int kt = 0; kt < KT; kt++) {
        tc_wait<TC_STAGES - 2>();
        __syncthreads();
        {
            const int nk = kt + TC_STAGES - 1;
            if (nk < KT) load(nk, nk % TC_STAGES);
            tc_commit();
        }
        const int s = kt % TC_STAGES;
        const uint32_t tA = sA0 + s * TC_TILE_BYTES, tB = sB0 + s * TC_TILE_BYTES;
        uint32_t af[2][4][4], bf[2][4][2];
#pragma unroll
        for (int ks = 0; ks < 2; ks++)
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
                tc_ldsm4(tA + tc_swz(a_row + mi * 16, ks * 2 + a_ch), af[ks][mi][0], af[ks][mi][1], af[ks][mi][2], af[ks][mi][3]);
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
            tc_ldsm4(tB + tc_swz(b_row + ni * 8, b_ch), bf[0][ni][0], bf[0][ni][1], bf[1][ni][0], bf[1][ni][1]);
#pragma unroll
        for (int ul = 0; ul < UPS; ul++) {
            const float *ssa = sSA + (s * 2 + ul) * TC_BM + wm * 64 + g;
            const float *ssb = sSB + (s * 2 + ul) * TC_BM + wn * 32 + 2 * t;
            float va[4][2], vb[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) va[mi][0] = ssa[mi * 16], va[mi][1] = ssa[mi * 16 + 8];
#pragma unroll
            for (int ni = 0; ni < 4; ni++) vb[ni][0] = ssb[ni * 8], vb[ni][1] = ssb[ni * 8 + 1];
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    /* Each k32 step starts from zero and the unit's steps are summed here, in
                     * FP32 (exact: integers < 2^16): Hopper's FP8 MMA aligns its addends to the
                     * largest with a narrow fraction (about 14 bits, as DeepSeek-V3 measured), so
                     * a running C near 2^15 would drop the small products of the next step. */
                    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int ks = ul * KPU; ks < (ul + 1) * KPU; ks++) {
                        float q[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        tc_mma(q, af[ks][mi], bf[ks][ni]);
#pragma unroll
                        for (int j = 0; j < 4; j++) p[j] += q[j];
                    }
                    /* c0, c1: row g, cols 2t, 2t + 1; c2, c3: row g + 8 */
                    acc[mi][ni][0] += p[0] * (va[mi][0] * vb[ni][0]);
                    acc[mi][ni][1] += p[1] * (va[mi][0] * vb[ni][1]);
                    acc[mi][ni][2] += p[2] * (va[mi][1] * vb[ni][0]);
                    acc[mi][ni][3] += p[3] * (va[mi][1] * vb[ni][1]);
                }
        }
    }
    tc_wait<0>();

    /* Epilogue: row-major C[M, N], guarded; pairs of columns stored together when N is even. */
    const bool pair = (N & 1) == 0;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = bm + wm * 64 + mi * 16 + g + h * 8;
            if (m >= M) continue;
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const int n = bn + wn * 32 + ni * 8 + 2 * t;
                const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
                const size_t o = (size_t)m * N + n;
                if (sizeof(TC) == 2) {
                    uint16_t *cc = reinterpret_cast<uint16_t *>(c);
                    if (pair && n + 1 < N) {
                        *reinterpret_cast<uint32_t *>(cc + o) = (uint32_t)fp4rl_f32_to_bf16(v0) | ((uint32_t)fp4rl_f32_to_bf16(v1) << 16);
                    } else {
                        if (n < N) cc[o] = fp4rl_f32_to_bf16(v0);
                        if (n + 1 < N) cc[o + 1] = fp4rl_f32_to_bf16(v1);
                    }
                } else {
                    float *cf = reinterpret_cast<float *>(c);
                    if (pair && n + 1 < N) {
                        *reinterpret_cast<float2 *>(cf + o) = make_float2(v0, v1);
                    } else {
                        if (n < N) cf[o] = v0;
                        if (n + 1 < N) cf[o + 1] = v1;
                    }
                }
            }
        }
}

template <int U, typename TC>
cudaError_t fp8_tc_launch(cudaStream_t st, const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb, void *c, int64_t M,
                          int64_t N, int64_t K)
{
    const cudaError_t e = cudaFuncSetAttribute(fp8_tc_kernel<U, TC>, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_SMEM);
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)((N + TC_BN - 1) / TC_BN), (unsigned)((M + TC_BM - 1) / TC_BM));
    fp8_tc_kernel<U, TC><<<grid, TC_THREADS, TC_SMEM, st>>>(a8, sa, b8, sb, static_cast<TC *>(c), (int)M, (int)N, (int)K);
    return cudaSuccess;
}

/* ---- The wgmma kernel: wgmma.mma_async m64n128k32 E4M3 x E4M3 -> F32 from shared memory (sm_90a) ----
 * CTA tile 128 (M) x 128 (N), 384 threads: warps 0-3 and 4-7 are two consumer warpgroups (rows
 * 0-63 and 64-127 of the tile, all 128 columns each: m64n128 per wgmma, 232 registers through
 * setmaxnreg), warps 8-11 the producer warpgroup (40 registers; lane 0 of warp 8 works).
 * A stage holds 128 K bytes: the A and B tiles (128 rows x 128 bytes each, written by TMA with
 * the 128-byte swizzle, zero-filled past M / N / K by the tensor map) and the stage's unit scales
 * (HiF4 2 units, MXFP4 4, as [unit][row] floats, one 512-byte bulk copy per unit and operand from
 * the unit-major global layout). Full barrier of a stage: 1 arrival (the producer's
 * arrive.expect_tx) and the bytes of both tiles and all scale copies; empty barrier: 8 arrivals
 * (lane 0 of each consumer warp after its reads). The epilogue stages C through shared memory.
 * Per unit each consumer warpgroup runs the unit's k32 steps (HiF4 2, MXFP4 1), each one wgmma
 * from a zero accumulator (scale-d = 0: Hopper's FP8 MMA keeps a narrow aligned fraction, so a
 * running C would drop small products) into its own 64 registers, waits, and promotes
 * acc = fma(p0 + p1, sa * sb, acc) in K order: the reference's math (p0 + p1 is exact: integers
 * < 2^16). One warpgroup's promotion overlaps the other's MMAs. Needs K % 128 == 0. */
constexpr int WG_BM = 128, WG_BN = 128, WG_BK = 128, WG_STAGES = 6, WG_THREADS = 384;
constexpr int WG_A_BYTES = WG_BM * WG_BK, WG_B_BYTES = WG_BN * WG_BK;
/* Scales of a stage, up to 4 units: A [unit][128 rows] then B [unit][128 cols] floats, each unit's
 * 512 bytes one bulk copy of the unit-major global layout (gemm_fp8.h). A consumer thread reads
 * its two rows' A scales as two words (8 distinct consecutive words a warp: no conflict) and its
 * columns 8 j + 2 t, + 1 as one float2 per j (8 consecutive words a warp). 4 KiB. */
constexpr int WG_SC_U = 128;
/* Promotion acc = fma(p, sa sb, acc): p (sa sb) is exact (p < 2^16 an integer, sa sb 6 significant
 * bits), so this rounds once like the reference's acc + p * (sa sb) and gives the same bits. */
[[maybe_unused]] constexpr bool WG_PROMOTE_FMA = true; /* unused outside the sm_90a pass */
constexpr int WG_SC_BYTES = 4 * 1024;
static_assert(4 * 2 * WG_SC_U * 4 <= WG_SC_BYTES, "scale region");
constexpr int WG_STAGE_BYTES = WG_A_BYTES + WG_B_BYTES + WG_SC_BYTES; /* 36 KiB, a multiple of 1024 */
constexpr int WG_SMEM = WG_STAGES * WG_STAGE_BYTES + 1024 /* alignment slack */ + 2 * WG_STAGES * 8;
static_assert(WG_STAGE_BYTES % 1024 == 0, "stage tiles must stay 1024-byte aligned for the 128-byte swizzle");
static_assert(WG_SMEM <= 227 * 1024, "shared memory of one CTA");
/* Epilogue staging: each consumer warpgroup's 64 x 128 outputs in the (then idle) stage memory,
 * rows padded to 136 words (F32) or 68 words (BF16 pairs) so the fragment writes are conflict-free
 * (bank 8 g + 2 t, 4 g + t), then read back a row (F32) or two rows (BF16) a warp in 16-byte
 * pieces for whole-sector coalesced global stores. */
[[maybe_unused]] constexpr int WG_CROW_F32 = 136, WG_CROW_BF16 = 68; /* BF16 unused outside the sm_90a pass */
static_assert(2 * 64 * WG_CROW_F32 * 4 <= WG_STAGES * WG_STAGE_BYTES, "epilogue staging");

/* The device helpers exist only in the sm_90a pass (the kernel's body is empty elsewhere); the
 * descriptor, fence, commit and wait come from wgmma_common.cuh. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using namespace fp4rl_cuda_wg;
using namespace fp4rl_cuda_bulk;
__device__ __forceinline__ void wg_tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* Shared-memory matrix descriptor of a K-major tile with the 128-byte swizzle: rows of 128 bytes,
 * 8-row core groups 1024 bytes apart (stride byte offset), leading byte offset unused (16 bytes:
 * the field's 1), base offset 0 (tiles 1024-aligned), layout type 1 (128B swizzle). A k32 step
 * inside the 128-byte row adds its 32-byte offset to the start address (the hardware applies the XOR). */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr) { return wg_desc_bits(addr, 16, 1024, 1); }

/* d = A B (scale-d = 0: the old d is ignored), one m64n128k32 E4M3 step, both operands from shared
 * memory. d stays an in-out operand as in CUTLASS (as an output only, ptxas spilled the HiF4
 * kernel); wg_fence_regs after the wait keeps reads of d behind it. */
__device__ __forceinline__ void wg_mma_zero(float (&d)[64], uint64_t da, uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(0));
}

/* d[OFF .. OFF + 31] = A B (scale-d = 0), one m64n64k32 E4M3 step: the N-half of the B tile that db
 * points at; fragment d[OFF + 4 j + e], j = 0..7, as the m64n128 one restricted to 8 n8 blocks. */
template <int OFF> __device__ __forceinline__ void wg_mma_zero_n64(float (&d)[64], uint64_t da, uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n}\n"
                 : "+f"(d[OFF + 0]), "+f"(d[OFF + 1]), "+f"(d[OFF + 2]), "+f"(d[OFF + 3]), "+f"(d[OFF + 4]), "+f"(d[OFF + 5]), "+f"(d[OFF + 6]), "+f"(d[OFF + 7]), "+f"(d[OFF + 8]), "+f"(d[OFF + 9]), "+f"(d[OFF + 10]), "+f"(d[OFF + 11]), "+f"(d[OFF + 12]), "+f"(d[OFF + 13]), "+f"(d[OFF + 14]), "+f"(d[OFF + 15]), "+f"(d[OFF + 16]), "+f"(d[OFF + 17]), "+f"(d[OFF + 18]), "+f"(d[OFF + 19]), "+f"(d[OFF + 20]), "+f"(d[OFF + 21]), "+f"(d[OFF + 22]), "+f"(d[OFF + 23]), "+f"(d[OFF + 24]), "+f"(d[OFF + 25]), "+f"(d[OFF + 26]), "+f"(d[OFF + 27]), "+f"(d[OFF + 28]), "+f"(d[OFF + 29]), "+f"(d[OFF + 30]), "+f"(d[OFF + 31])
                 : "l"(da), "l"(db), "r"(0));
}
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

template <int U, typename TC, bool PIPE>
__global__ void __launch_bounds__(WG_THREADS, 1) fp8_wg_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
                                                               const float *__restrict__ sa, const float *__restrict__ sb,
                                                               TC *__restrict__ c, int M, int N, int K)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int UPS = WG_BK / U; /* units a stage: 2 (HiF4) or 4 (MXFP4) */
    constexpr int KPU = U / 32;    /* k32 steps a unit: 2 or 1 */
    extern __shared__ uint8_t wg_smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(wg_smem_raw);
    const uint32_t base = (raw + 1023u) & ~1023u;
    const uint8_t *gbase = wg_smem_raw + (base - raw);
    const uint32_t bar_full = base + WG_STAGES * WG_STAGE_BYTES, bar_empty = bar_full + WG_STAGES * 8;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* Tile order: groups of 8 M tiles, N-major inside a group (L2 reuse of A and B). */
    const int tiles_m = (M + WG_BM - 1) / WG_BM, tiles_n = (N + WG_BN - 1) / WG_BN;
    const int per_group = 8 * tiles_n, group = (int)blockIdx.x / per_group, first_m = group * 8;
    const int gsize = min(tiles_m - first_m, 8), in_group = (int)blockIdx.x - group * per_group;
    const int bm = (first_m + in_group % gsize) * WG_BM, bn = (in_group / gsize) * WG_BN;
    const int KT = K / WG_BK;
    const size_t lda = (size_t)FP4RL_FP8_SCALE_LD(M), ldb = (size_t)FP4RL_FP8_SCALE_LD(N);

    if (threadIdx.x == 0) {
        for (int s = 0; s < WG_STAGES; s++) {
            wg_mbar_init(bar_full + 8 * s, 1);
            wg_mbar_init(bar_empty + 8 * s, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();

    if (warp >= 8) {
        /* Producer warpgroup: gives registers back; lane 0 of warp 8 fills the ring. Per stage one
         * arrive.expect_tx for all its bytes, two TMA tiles and 2 UPS bulk copies of 512 bytes of
         * scales (a unit's 128 rows, contiguous in the unit-major layout; rows past M / N read the
         * layout's zero padding, so every copy is whole and in bounds). */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        const bool worker = warp == 8 && lane == 0;
        for (int kt = 0; worker && kt < KT; kt++) {
            const int s = kt % WG_STAGES;
            const uint32_t ph = (uint32_t)(kt / WG_STAGES) & 1u;
            wg_mbar_wait_or_trap(bar_empty + 8 * s, ph ^ 1u);
            const uint32_t st = base + s * WG_STAGE_BYTES, scA = st + WG_A_BYTES + WG_B_BYTES, scB = scA + UPS * WG_SC_U * 4;
            const uint32_t fb = bar_full + 8 * s;
            wg_mbar_arrive_tx(fb, WG_A_BYTES + WG_B_BYTES + 2 * UPS * WG_SC_U * 4);
            wg_tma_2d(st, &tmA, kt * WG_BK, bm, fb);
            wg_tma_2d(st + WG_A_BYTES, &tmB, kt * WG_BK, bn, fb);
#pragma unroll
            for (int u = 0; u < UPS; u++) {
                const size_t gu = (size_t)kt * UPS + u;
                wg_bulk(scA + u * WG_SC_U * 4, sa + gu * lda + bm, WG_SC_U * 4, fb);
                wg_bulk(scB + u * WG_SC_U * 4, sb + gu * ldb + bn, WG_SC_U * 4, fb);
            }
        }
        /* Tail: the waits the producer would do for stages KT .. KT + STAGES - 1, i.e. until the
         * consumers have released every stage (traps if they hang). */
        for (int kt = KT; worker && kt < KT + WG_STAGES; kt++)
            wg_mbar_wait_or_trap(bar_empty + 8 * (kt % WG_STAGES), ((uint32_t)(kt / WG_STAGES) & 1u) ^ 1u);
    } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");

    /* Consumers: warpgroup wg takes tile rows wg * 64 .. + 63. Thread fragment of an m64n128 F32
     * result: d[4 j + e], j = 0..15 (the n8 block): rows w * 16 + g (e = 0, 1) and + 8 (e = 2, 3),
     * columns 8 j + 2 t + (e & 1), with w the warp in the group, g = lane / 4, t = lane % 4. */
    const int wg = warp >> 2, w = warp & 3, g = lane >> 2, t = lane & 3;
    /* p0, p1 are written only by the wgmma (scale-d = 0), never zeroed by ordinary instructions:
     * ptxas serializes wgmma whose accumulators other instructions define (warning C7514). */
    float acc[64], p0[64], p1[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;

    if constexpr (!PIPE) {
    for (int kt = 0; kt < KT; kt++) {
        const int s = kt % WG_STAGES;
        wg_mbar_wait(bar_full + 8 * s, (uint32_t)(kt / WG_STAGES) & 1u);
        const uint32_t st = base + s * WG_STAGE_BYTES;
        const uint64_t dA = wg_desc(st + wg * 64 * WG_BK), dB = wg_desc(st + WG_A_BYTES);
        /* this thread's scales: rows wg * 64 + w * 16 + g, + 8; columns 8 j + 2 t + e (a float2 per j) */
        const float *scs = reinterpret_cast<const float *>(gbase + s * WG_STAGE_BYTES + WG_A_BYTES + WG_B_BYTES);
        const float *ssa = scs + wg * 64 + w * 16 + g;
        const float *ssb = scs + UPS * WG_SC_U + 2 * t;
#pragma unroll
        for (int ul = 0; ul < UPS; ul++) {
            wg_fence();
            wg_mma_zero(p0, dA + (uint64_t)((ul * KPU) * 2), dB + (uint64_t)((ul * KPU) * 2)); /* +32 bytes a k32 step: 2 in 16-byte units */
            if (KPU == 2) wg_mma_zero(p1, dA + (uint64_t)((ul * KPU + 1) * 2), dB + (uint64_t)((ul * KPU + 1) * 2));
            wg_commit();
            wg_wait0();
            wg_fence_regs(p0);
            if (KPU == 2) wg_fence_regs(p1);
            const float a0 = ssa[ul * WG_SC_U], a1 = ssa[ul * WG_SC_U + 8];
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const float2 b = *reinterpret_cast<const float2 *>(ssb + ul * WG_SC_U + 8 * j);
                float q[4];
#pragma unroll
                for (int e = 0; e < 4; e++) q[e] = KPU == 2 ? p0[4 * j + e] + p1[4 * j + e] : p0[4 * j + e];
                const float sc[4] = {a0 * b.x, a0 * b.y, a1 * b.x, a1 * b.y}; /* sa sb: exact (3 + 3 significant bits) */
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[4 * j + e] = WG_PROMOTE_FMA ? __fmaf_rn(q[e], sc[e], acc[4 * j + e]) : __fadd_rn(acc[4 * j + e], __fmul_rn(q[e], sc[e]));
            }
        }
        /* This warp's reads of the stage (wgmma operands, waited above; scales, in registers) are
         * done: release the slot. */
        __syncwarp();
        if (lane == 0) wg_mbar_arrive(bar_empty + 8 * s);
    }
    } else {
    /* Pipelined variant (FP4RL_FP8_WG_PIPE=1): 4 jobs a stage, each job's wgmmas issued one job
     * ahead of its promotion, so this warpgroup's tensor-core work overlaps its own promotion, not
     * only the other warpgroup's. HiF4: job jj = unit jj / 2, N-half jj % 2 (two m64n64k32 steps
     * from zero into buffer jj % 2: step 0 at [0, 32), step 1 at [32, 64)). MXFP4: job jj = unit jj
     * (one m64n128k32 from zero into buffer jj % 2). Consecutive jobs alternate buffers, so the
     * job in flight never writes the one being promoted. Same per-output arithmetic and K order
     * as the plain loop. HiF4 reads each A k32 slice twice (once per N-half): more shared-memory
     * traffic for the tensor cores than the plain loop's m64n128. */
    const int w_row = wg * 64 + w * 16 + g;
    auto issue = [&](int s, int jj, float (&buf)[64]) {
        const uint32_t st = base + s * WG_STAGE_BYTES;
        const uint64_t dA = wg_desc(st + wg * 64 * WG_BK), dB = wg_desc(st + WG_A_BYTES);
        wg_fence();
        if constexpr (KPU == 2) {
            const int ul = jj >> 1, h = jj & 1;
            const uint64_t db = dB + (uint64_t)(h * (64 * WG_BK / 16)); /* rows 64 h of B: 8 KiB, 1024-aligned */
            wg_mma_zero_n64<0>(buf, dA + (uint64_t)(ul * 4), db + (uint64_t)(ul * 4));
            wg_mma_zero_n64<32>(buf, dA + (uint64_t)(ul * 4 + 2), db + (uint64_t)(ul * 4 + 2));
        } else {
            wg_mma_zero(buf, dA + (uint64_t)(jj * 2), dB + (uint64_t)(jj * 2));
        }
    };
    auto promote = [&](int s, int jj, float (&buf)[64]) {
        wg_fence_regs(buf);
        const float *scs = reinterpret_cast<const float *>(gbase + s * WG_STAGE_BYTES + WG_A_BYTES + WG_B_BYTES);
        const int ul = KPU == 2 ? jj >> 1 : jj;
        const float a0 = scs[ul * WG_SC_U + w_row], a1 = scs[ul * WG_SC_U + w_row + 8];
        const float *ssb = scs + (UPS + ul) * WG_SC_U + 2 * t;
        constexpr int NJ = KPU == 2 ? 8 : 16; /* n8 blocks a job */
        const int j0 = KPU == 2 ? (jj & 1) * 8 : 0;
#pragma unroll
        for (int jl = 0; jl < NJ; jl++) {
            const int j = j0 + jl;
            const float2 b = *reinterpret_cast<const float2 *>(ssb + 8 * j);
            const float sc[4] = {a0 * b.x, a0 * b.y, a1 * b.x, a1 * b.y}; /* sa sb: exact */
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float q;
                if constexpr (KPU == 2) q = buf[4 * jl + e] + buf[32 + 4 * jl + e]; /* exact: integers < 2^16 */
                else q = buf[4 * jl + e];
                acc[4 * j + e] = WG_PROMOTE_FMA ? __fmaf_rn(q, sc[e], acc[4 * j + e]) : __fadd_rn(acc[4 * j + e], __fmul_rn(q, sc[e]));
            }
        }
    };
    /* One stage's 4 jobs: for each job jj the next one is issued before jj is waited for
     * (wait_group 1) and promoted. FIRST: job 0 was issued by the previous stage's job 3; NEXT:
     * job 3 issues the next stage's job 0 (after its full barrier), else job 3 is promoted after
     * wait_group 0. The loop runs stages in pairs (kt: NEXT, kt + 1: FIRST), so nothing is in
     * flight across its back edge: there the compiler may move the buffers between registers, and
     * ptxas serializes every wgmma of the kernel when such moves touch the registers of one in
     * flight (C7514 / C7515, seen with a one-stage body that issued across the back edge). */
    auto run_stage = [&](int kt, auto first, auto next) {
        constexpr bool FIRST = decltype(first)::value, NEXT = decltype(next)::value;
        const int s = kt % WG_STAGES;
        if constexpr (!FIRST) {
            wg_mbar_wait(bar_full + 8 * s, (uint32_t)(kt / WG_STAGES) & 1u);
            issue(s, 0, p0);
            wg_commit();
        }
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            if (jj < 3) {
                if (jj & 1) issue(s, jj + 1, p0); /* job jj + 1 into buffer (jj + 1) % 2 */
                else issue(s, jj + 1, p1);
                wg_commit();
                wg_wait1(); /* job jj done */
            } else if constexpr (NEXT) {
                const int s2 = (kt + 1) % WG_STAGES;
                wg_mbar_wait(bar_full + 8 * s2, (uint32_t)((kt + 1) / WG_STAGES) & 1u);
                issue(s2, 0, p0);
                wg_commit();
                wg_wait1();
            } else {
                wg_wait0();
            }
            if (jj & 1) promote(s, jj, p1);
            else promote(s, jj, p0);
        }
        /* jobs 0-3 of stage s are complete and their scales read: release it */
        __syncwarp();
        if (lane == 0) wg_mbar_arrive(bar_empty + 8 * s);
    };
    int kt = 0;
    for (; kt + 1 < KT; kt += 2) {
        run_stage(kt, std::false_type(), std::true_type());
        run_stage(kt + 1, std::true_type(), std::false_type());
    }
    if (kt < KT) run_stage(kt, std::false_type(), std::false_type());
    }

    /* Epilogue through shared memory: both consumer warpgroups are past their last reads of the
     * stages (named barrier 1 over the 256 consumer threads; the producer only waits on barriers
     * now), each stages its 64 x 128 outputs (barrier 2 + wg over its 128 threads), then its warps
     * store whole rows: 512 bytes (F32) or two rows of 256 bytes (BF16) a warp instruction, 16 bytes
     * a lane where N and c allow, else guarded single elements. */
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    {
        uint32_t *cs = reinterpret_cast<uint32_t *>(wg_smem_raw + (base - raw)) + wg * 64 * (sizeof(TC) == 4 ? WG_CROW_F32 : WG_CROW_BF16);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = w * 16 + g + h * 8;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                if (sizeof(TC) == 4)
                    *reinterpret_cast<float2 *>(cs + row * WG_CROW_F32 + 8 * j + 2 * t) = make_float2(v0, v1);
                else
                    cs[row * WG_CROW_BF16 + 4 * j + t] = (uint32_t)fp4rl_f32_to_bf16(v0) | ((uint32_t)fp4rl_f32_to_bf16(v1) << 16);
            }
        }
        asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");
        const bool vec = (N % (int)(16 / sizeof(TC))) == 0 && ((uintptr_t)c & 15) == 0;
        if (sizeof(TC) == 4) {
            float *cf = reinterpret_cast<float *>(c);
            const int n = bn + 4 * lane;
#pragma unroll 4
            for (int i = 0; i < 16; i++) {
                const int row = w * 16 + i, m = bm + wg * 64 + row;
                if (m >= M) break;
                const float4 v = *reinterpret_cast<const float4 *>(cs + row * WG_CROW_F32 + 4 * lane);
                float *o = cf + (size_t)m * N + n;
                if (vec && n + 4 <= N) {
                    *reinterpret_cast<float4 *>(o) = v;
                } else {
                    if (n < N) o[0] = v.x;
                    if (n + 1 < N) o[1] = v.y;
                    if (n + 2 < N) o[2] = v.z;
                    if (n + 3 < N) o[3] = v.w;
                }
            }
        } else {
            uint16_t *cc = reinterpret_cast<uint16_t *>(c);
            const int n = bn + 8 * (lane & 15);
#pragma unroll 4
            for (int i = 0; i < 8; i++) {
                const int row = w * 16 + 2 * i + (lane >> 4), m = bm + wg * 64 + row;
                if (m >= M) continue;
                const uint4 v = *reinterpret_cast<const uint4 *>(cs + row * WG_CROW_BF16 + 4 * (lane & 15));
                uint16_t *o = cc + (size_t)m * N + n;
                if (vec && n + 8 <= N) {
                    *reinterpret_cast<uint4 *>(o) = v;
                } else {
                    const uint32_t vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        if (n + e < N) o[e] = (uint16_t)(vv[e >> 1] >> (16 * (e & 1)));
                }
            }
        }
    }
    } /* consumers */
#else
    (void)sa, (void)sb, (void)c, (void)M, (void)N, (void)K;
    __trap(); /* launched only where the sm_90a probe says this build has the kernel */
#endif
}

/* Whether this build carries sm_90a code for the device (the wgmma kernel's body). */
__global__ void fp8_wg_probe_kernel(int *out)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *out = 1;
#else
    *out = 0;
#endif
}

typedef CUresult (*wg_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *, const cuuint64_t *,
                                 const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

wg_encode_fn wg_encoder(void)
{
    static wg_encode_fn fn = NULL;
    static int tried = 0;
    if (!tried) {
        tried = 1;
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = reinterpret_cast<wg_encode_fn>(p);
        else
            (void)cudaGetLastError();
    }
    return fn;
}

/* [rows, K] E4M3 bytes, K-major; boxes of 128 K bytes x 128 rows, 128-byte swizzle, zeros out of bounds. */
int wg_map(CUtensorMap *map, const uint8_t *p, int64_t rows, int64_t K)
{
    wg_encode_fn enc = wg_encoder();
    if (!enc) return 0;
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)K};
    const cuuint32_t box[2] = {(cuuint32_t)WG_BK, 128u}, es[2] = {1u, 1u};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t *>(p), dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int U, typename TC, bool PIPE>
cudaError_t fp8_wg_launch_v(cudaStream_t st, const CUtensorMap &ma, const CUtensorMap &mb, const float *sa, const float *sb, void *c,
                            int64_t M, int64_t N, int64_t K)
{
    const cudaError_t e = cudaFuncSetAttribute(fp8_wg_kernel<U, TC, PIPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM);
    if (e != cudaSuccess) return e;
    const unsigned tiles = (unsigned)(((M + WG_BM - 1) / WG_BM) * ((N + WG_BN - 1) / WG_BN));
    fp8_wg_kernel<U, TC, PIPE><<<tiles, WG_THREADS, WG_SMEM, st>>>(ma, mb, sa, sb, static_cast<TC *>(c), (int)M, (int)N, (int)K);
    return cudaSuccess;
}

/* FP4RL_FP8_WG_PIPE=1: the pipelined consumer loop (see fp8_wg_kernel); else the plain one. Read
 * at every launch (the bench and the test switch it). */
template <int U, typename TC>
cudaError_t fp8_wg_launch(cudaStream_t st, const CUtensorMap &ma, const CUtensorMap &mb, const float *sa, const float *sb, void *c,
                          int64_t M, int64_t N, int64_t K)
{
    const char *e = getenv("FP4RL_FP8_WG_PIPE");
    if (e && strcmp(e, "1") == 0) return fp8_wg_launch_v<U, TC, true>(st, ma, mb, sa, sb, c, M, N, K);
    return fp8_wg_launch_v<U, TC, false>(st, ma, mb, sa, sb, c, M, N, K);
}

/* FP4RL_FP8_GEMM: "1" -> the tensor-core kernel where its gate holds (sm_89+, M >= 512, N >= 128,
 * K >= 128, K % 64 == 0), else the old path; "ref" -> the reference kernel (any size); unset or
 * anything else -> the old path (dequantize to BF16, cuBLASLt). The tensor-core kernel is exact
 * (test_fp8_gemm on the H200) but at 0.18-0.26x of cuBLASLt BF16 it is slower than the old path
 * (0.5-0.8x), so it stays opt-in until a wgmma kernel replaces it (bench/RESULTS.md, session 11). */
int fp8_mode(void)
{
    const char *e = getenv("FP4RL_FP8_GEMM");
    if (e && strcmp(e, "ref") == 0) return 2;
    if (e && strcmp(e, "1") == 0) return 1;
    return 0;
}

} // namespace

int fp4rl_cuda_fp8_unit(const fp4rl_tensor *t)
{
    if (t->dtype == FP4RL_DTYPE_HIF4) return FP4RL_HIF4_UNIT; /* 1D and 2D keep one word per 64 of a row */
    if (t->dtype == FP4RL_DTYPE_MXFP4 && (t->q.tile == 0 || t->q.tile == 32)) return 32;
    return 0;
}

fp4rl_status fp4rl_cuda_fp8_prepass(fp4rl_context *ctx, const fp4rl_tensor *t, uint8_t *e4m3, float *scales)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    const int U = fp4rl_cuda_fp8_unit(t);
    const int64_t rows = t->q.rows, K = t->q.cols, ld = FP4RL_FP8_SCALE_LD(rows);
    if (!U || K % U) return FP4RL_ERR_UNSUPPORTED;
    /* the layout's padding rows: zeros (read by the wgmma kernel's bulk copies of partial tiles) */
    if (ld > rows) {
        const cudaError_t e = cudaMemset2DAsync(scales + rows, (size_t)ld * 4, 0, (size_t)(ld - rows) * 4, (size_t)(K / U), cu->stream);
        if (e != cudaSuccess) return fp4rl_cuda_fail(ctx, e, "fp4rl_matmul: FP8 pre-pass (scale padding)");
    }
    const uint8_t *codes = static_cast<const uint8_t *>(t->data);
    /* 16-byte loads of codes and stores of bytes (K % 32 == 0 holds for both units) */
    const bool vec = ((uintptr_t)codes & 15) == 0 && (t->q.row_bytes & 15) == 0 && ((uintptr_t)e4m3 & 15) == 0 && K % 32 == 0;
    const int64_t n = vec ? rows * (K / 32) : rows * (K / U);
    const unsigned blocks = (unsigned)((n + 255) / 256);
    if (t->dtype == FP4RL_DTYPE_HIF4) {
        const uint32_t *w = static_cast<const uint32_t *>(t->scales);
        if (vec) prepass_hif4_vec_kernel<<<blocks, 256, 0, cu->stream>>>(codes, w, rows, K, t->q.row_bytes, t->q.scale_cols, ld, e4m3, scales);
        else prepass_hif4_kernel<<<blocks, 256, 0, cu->stream>>>(codes, w, rows, K, t->q.row_bytes, t->q.scale_cols, ld, e4m3, scales);
    } else {
        const uint8_t *sc = static_cast<const uint8_t *>(t->scales);
        if (vec)
            prepass_mxfp4_vec_kernel<<<blocks, 256, 0, cu->stream>>>(codes, sc, rows, K, t->q.row_bytes, t->q.scale_cols, t->q.tile, ld, e4m3,
                                                                     scales);
        else
            prepass_mxfp4_kernel<<<blocks, 256, 0, cu->stream>>>(codes, sc, rows, K, t->q.row_bytes, t->q.scale_cols, t->q.tile, ld, e4m3, scales);
    }
    return fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: FP8 pre-pass");
}

fp4rl_status fp4rl_cuda_fp8_gemm_ref(fp4rl_context *ctx, const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb,
                                     void *c, int c_bf16, int64_t M, int64_t N, int64_t K, int U)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    const dim3 grid((unsigned)((N + 15) / 16), (unsigned)((M + 15) / 16));
    if (c_bf16) fp8_ref_kernel<<<grid, 256, 0, cu->stream>>>(a8, sa, b8, sb, static_cast<uint16_t *>(c), M, N, K, U);
    else fp8_ref_kernel<<<grid, 256, 0, cu->stream>>>(a8, sa, b8, sb, static_cast<float *>(c), M, N, K, U);
    return fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: FP8 reference GEMM");
}

int fp4rl_cuda_fp8_tc_ok(fp4rl_context *ctx, int64_t M, int64_t N, int64_t K)
{
    const fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    if (cu->cc_major * 10 + cu->cc_minor < 89) return 0;
    return M >= 512 && N >= 128 && K >= 128 && K % 64 == 0 && M < (1 << 30) && N < (1 << 30) && K < (1 << 30);
}

int fp4rl_cuda_has_sm90a(fp4rl_context *ctx)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    if (cu->cc_major != 9 || cu->cc_minor != 0) return 0;
    /* The probe's answer, asked once per process; not while a stream captures a graph, where the
     * probe's copy could not run (callers then take their sm_89 kernels). */
    static int probed = -1;
    if (probed < 0) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(cu->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
            (void)cudaGetLastError();
            return 0;
        }
        int *d = NULL, h = 0;
        if (cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
            fp8_wg_probe_kernel<<<1, 1>>>(d);
            if (cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) h = 0;
            cudaFree(d);
        }
        (void)cudaGetLastError();
        probed = h == 1;
    }
    return probed;
}

int fp4rl_cuda_fp8_wg_ok(fp4rl_context *ctx, int64_t M, int64_t N, int64_t K)
{
    const char *e = getenv("FP4RL_FP8_WG"); /* "0": the mma.sync kernel everywhere (for comparisons) */
    if (e && strcmp(e, "0") == 0) return 0;
    if (M < WG_BM || N < WG_BN || K < WG_BK || K % WG_BK || M >= (1 << 30) || N >= (1 << 30) || K >= (1 << 30)) return 0;
    return fp4rl_cuda_has_sm90a(ctx) && wg_encoder() != NULL;
}

/* Calls f(unit, C element) with the template arguments of a kernel variant: U in {32, 64} as
 * std::integral_constant, the C type as a null pointer of it (BF16 words or FP32). */
template <typename F>
static cudaError_t per_variant(int U, int c_bf16, F f)
{
    using U64 = std::integral_constant<int, 64>;
    using U32 = std::integral_constant<int, 32>;
    if (U == 64) return c_bf16 ? f(U64{}, (uint16_t *)nullptr) : f(U64{}, (float *)nullptr);
    return c_bf16 ? f(U32{}, (uint16_t *)nullptr) : f(U32{}, (float *)nullptr);
}

/* The wgmma kernel reads its operands and scales with 16-byte bulk copies. */
static bool wg_aligned(const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb)
{
    return !((uintptr_t)a8 & 15) && !((uintptr_t)b8 & 15) && !((uintptr_t)sa & 15) && !((uintptr_t)sb & 15);
}

fp4rl_status fp4rl_cuda_fp8_gemm_wg(fp4rl_context *ctx, const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb, void *c,
                                    int c_bf16, int64_t M, int64_t N, int64_t K, int U)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    if (!fp4rl_cuda_fp8_wg_ok(ctx, M, N, K) || (U != 32 && U != 64) || !wg_aligned(a8, sa, b8, sb)) return FP4RL_ERR_UNSUPPORTED;
    CUtensorMap ma, mb;
    if (!wg_map(&ma, a8, M, K) || !wg_map(&mb, b8, N, K)) return fp4rl_cuda_fail(ctx, cudaErrorInvalidValue, "fp4rl_matmul: FP8 wgmma GEMM (tensor map)");
    const cudaError_t e = per_variant(U, c_bf16, [&](auto u, auto *tc) {
        return fp8_wg_launch<decltype(u)::value, std::remove_pointer_t<decltype(tc)>>(cu->stream, ma, mb, sa, sb, c, M, N, K);
    });
    if (e != cudaSuccess) return fp4rl_cuda_fail(ctx, e, "fp4rl_matmul: FP8 wgmma GEMM (shared memory attribute)");
    return fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: FP8 wgmma GEMM");
}

fp4rl_status fp4rl_cuda_fp8_gemm_mma(fp4rl_context *ctx, const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb, void *c,
                                     int c_bf16, int64_t M, int64_t N, int64_t K, int U)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    if (K % 64 || (U != 32 && U != 64)) return FP4RL_ERR_UNSUPPORTED;
    const cudaError_t e = per_variant(U, c_bf16, [&](auto u, auto *tc) {
        return fp8_tc_launch<decltype(u)::value, std::remove_pointer_t<decltype(tc)>>(cu->stream, a8, sa, b8, sb, c, M, N, K);
    });
    if (e != cudaSuccess) return fp4rl_cuda_fail(ctx, e, "fp4rl_matmul: FP8 tensor-core GEMM (shared memory attribute)");
    return fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: FP8 tensor-core GEMM");
}

fp4rl_status fp4rl_cuda_fp8_gemm_tc(fp4rl_context *ctx, const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb, void *c,
                                    int c_bf16, int64_t M, int64_t N, int64_t K, int U)
{
    if (fp4rl_cuda_fp8_wg_ok(ctx, M, N, K) && wg_aligned(a8, sa, b8, sb))
        return fp4rl_cuda_fp8_gemm_wg(ctx, a8, sa, b8, sb, c, c_bf16, M, N, K, U);
    return fp4rl_cuda_fp8_gemm_mma(ctx, a8, sa, b8, sb, c, c_bf16, M, N, K, U);
}

int fp4rl_cuda_fp8_gemm_wanted(fp4rl_context *ctx, const fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b)
{
    (void)ctx;
    if (a->dtype != b->dtype || a->ndim != 2 || b->ndim != 2) return 0;
    if (c->dtype != FP4RL_DTYPE_F32 && c->dtype != FP4RL_DTYPE_BF16) return 0;
    const int U = fp4rl_cuda_fp8_unit(a);
    if (!U || U != fp4rl_cuda_fp8_unit(b) || a->q.cols != b->q.cols || a->q.cols % U) return 0;
    const int mode = fp8_mode();
    if (mode == 2) return 1;
    if (mode == 0) return 0;
    return fp4rl_cuda_fp8_tc_ok(ctx, a->q.rows, b->q.rows, a->q.cols);
}

fp4rl_status fp4rl_cuda_fp8_gemm(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b)
{
    const int U = fp4rl_cuda_fp8_unit(a);
    const int64_t M = a->q.rows, N = b->q.rows, K = a->q.cols;
    void *a8 = NULL, *b8 = NULL, *sa = NULL, *sb = NULL;
    fp4rl_status st = fp4rl_cuda_alloc_bytes(ctx, &a8, (size_t)(M * K));
    if (!st) st = fp4rl_cuda_alloc_bytes(ctx, &b8, (size_t)(N * K));
    if (!st) st = fp4rl_cuda_alloc_bytes(ctx, &sa, fp4rl_cuda_fp8_scales_bytes(M, K, U));
    if (!st) st = fp4rl_cuda_alloc_bytes(ctx, &sb, fp4rl_cuda_fp8_scales_bytes(N, K, U));
    if (!st) st = fp4rl_cuda_fp8_prepass(ctx, a, static_cast<uint8_t *>(a8), static_cast<float *>(sa));
    if (!st) st = fp4rl_cuda_fp8_prepass(ctx, b, static_cast<uint8_t *>(b8), static_cast<float *>(sb));
    if (!st && fp8_mode() != 2)
        st = fp4rl_cuda_fp8_gemm_tc(ctx, static_cast<const uint8_t *>(a8), static_cast<const float *>(sa), static_cast<const uint8_t *>(b8),
                                    static_cast<const float *>(sb), c->data, c->dtype == FP4RL_DTYPE_BF16, M, N, K, U);
    else if (!st)
        st = fp4rl_cuda_fp8_gemm_ref(ctx, static_cast<const uint8_t *>(a8), static_cast<const float *>(sa), static_cast<const uint8_t *>(b8),
                                     static_cast<const float *>(sb), c->data, c->dtype == FP4RL_DTYPE_BF16, M, N, K, U);
    fp4rl_cuda_free_bytes(ctx, a8);
    fp4rl_cuda_free_bytes(ctx, b8);
    fp4rl_cuda_free_bytes(ctx, sa);
    fp4rl_cuda_free_bytes(ctx, sb);
    return st;
}
