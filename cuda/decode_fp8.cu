/*
 * decode_fp8.cu - the W4A4 decode GEMM on the FP8 tensor cores and its activation quantizer (see
 * decode_fp8.h for the contract and gemm_fp8.h for the math and the error bound).
 *
 * Roles: W plays the mma's A operand (mma.sync m16n8k32 E4M3, 16 weight rows x 32 k), the
 * activations its B operand (32 k x 8 activation rows), so C's fragments are [weight row,
 * activation row]. A CTA of 4 warps covers 128 weight rows (32 a warp, two m16 tiles) and up to 64
 * activation rows (NT n8 tiles; larger M runs more CTAs along grid y, which read the same weight
 * rows from L2) over one K slice, in chunks of 128 k copied with cp.async into a 4-stage ring.
 *
 * The k order inside a unit is permuted (A and B agree, and a dot product does not care): in a
 * HiF4 unit thread t of a quad owns k 16t .. 16t + 15, so its weight bytes are 8 contiguous bytes
 * of each row and its activation bytes 16 contiguous bytes; k32 step s takes k 16t + 8s .. + 7
 * (the mma's a0 / b0 slot the first four, a2 / b1 the next four). In an MXFP4 unit (one step)
 * thread t owns k 8t .. 8t + 7. Each register's four bytes stay in k order, so the activation
 * bytes are used as stored.
 *
 * Dequantization in registers, a 32-bit word of 8 codes at a time: the magnitudes through a byte
 * permute of an 8-entry E4M3 table (HiF4: k * 2^inc, the table of the 4-element micro-block's
 * increment; MXFP4: 2 e2m1(k)), the signs (bit 3 of each nibble) replicated into bytes by a second
 * permute in sign mode and merged with one LOP3. The tables are gemm_fp8.cu's pre-pass tables, so
 * the bytes are the pre-pass's.
 *
 * FP4RL_D8_WGMMA=1 (read at every call; off by default): on an sm_90 device with sm_90a code in
 * the build, d8_wg_kernel instead - on sm_90 mma.sync E4M3 compiles to an unpack plus FP16 HMMA,
 * only wgmma runs FP8 at Hopper's FP8 rate, which matters at the rollout's 64-256 rows. The same
 * CTA, copies (D8Copies), ring, promotion and epilogue (d8_finish); the dequantised weights are
 * wgmma's register-sourced A (m64nNk32, N = the CTA's 8 NT activation rows), the activations its
 * K-major shared-memory B (natural k order: see the kernel's comment). Same bits with one slice.
 *
 * FP4RL_D8_PERSIST=1 (read at every call; off by default; fp4rl_cuda_d8_gemm_tiles only, M <= 64,
 * sm_90+ with sm_90+ code): d8p_kernel, persistent and warp-specialised, on the weight re-laid out
 * once (fp4rl_cuda_d8_relayout) so that a ring stage is one bulk copy; a producer warp feeds an
 * mbarrier ring, 4 consumer warps run d8_kernel's unit body (d8_unit) without CTA barriers. Same
 * bits with one slice. The comment above d8p_kernel has the layout, the phases and the sizes.
 */
#include <stdlib.h>
#include <string.h>

#include "decode_fp8.h"
#include "format/formats.h"
#include "format/layout.h"
#include "format/qdq_block.h"
#include "gemm_fp8.h"
#include "mma_common.cuh"
#include "wgmma_common.cuh"

using namespace fp4rl_cuda_mma;

namespace {

constexpr int WARPS = 4, THREADS = WARPS * 32, ROWS = WARPS * 32; /* weight rows a CTA */
constexpr int KC = 128;                                           /* k a chunk (pipeline stage) */
constexpr int STAGES = 4;
constexpr int MCHUNK = 64; /* activation rows a CTA */

struct D8 {
    const uint8_t *a8;
    const float *sa;
    const uint8_t *codes;
    const void *wscales;
    void *c;
    float *ws;
    unsigned *counters;
    int M, N, K, ldc;
    int64_t row_bytes, scale_cols;
    int tile;          /* MXFP4: 0 (1D) or 32 (2D tiles) */
    int64_t lda;       /* FP4RL_FP8_SCALE_LD(M) */
    int slices, chunks_per_slice, chunks;
};
/* d8p_kernel's parameters (its own struct: d8_kernel's stays as it was): the re-laid-out weight
 * (fp4rl_cuda_d8_relayout), row blocks, work items (row block x K slice) and ring stages. */
struct D8P : D8 {
    const uint8_t *tiles;
    int rblocks, items, stages;
};

/* Shared memory of one stage. Weight codes [128 rows][64 bytes], the 16-byte chunk c of row r at
 * chunk c ^ rev2((r >> 1) & 3) (rev2: 2-bit reversal): the HiF4 reads (8 bytes a lane, 4 rows a
 * half-warp) and the MXFP4 reads (4 bytes a lane, 8 rows a warp) then hit distinct banks. Weight
 * scales: HiF4 two words a row; MXFP4 the two aligned words holding the row's 4 scale bytes.
 * Activations [NT * 8 rows][128 bytes], chunk c of row r at c ^ (rev2(r & 3) << 1), for the same
 * reason (16 bytes a lane for HiF4, 8 for MXFP4). Activation scales [units][NT * 8]. */
template <int NT>
struct Stage {
    static constexpr int W = 0, WS = ROWS * 64, A = WS + ROWS * 8, AS = A + NT * 8 * KC;
    static constexpr int BYTES = AS + 4 * NT * 8 * 4;
    static constexpr int SMEM = STAGES * BYTES;
};

__device__ __forceinline__ int rev2(int x) { return ((x & 1) << 1) | ((x >> 1) & 1); }
__device__ __forceinline__ int wswz(int r, int c) { return r * 64 + ((c ^ rev2((r >> 1) & 3)) << 4); }
__device__ __forceinline__ int aswz(int r, int c) { return r * KC + ((c ^ (rev2(r & 3) << 1)) << 4); }

/* d = a b over one 16 x 8 x 32 E4M3 step from zero (F32). */
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
#else
    (void)a, (void)b0, (void)b1;
    d[0] = d[1] = d[2] = d[3] = 0.0f;
    __trap(); /* the host never launches it where the device or the build lacks sm_89 */
#endif
}

/* E4M3 bytes of four codes: magnitudes from the table (lo: k 0..3, hi: k 4..7) selected by the
 * low 16 bits of sel (nibble e = k of code e, bit 3 clear); sgn: bytes 0xFF where code e is
 * negative, else 0x00; the sign lands in bit 7. */
__device__ __forceinline__ uint32_t enc4(uint32_t lo, uint32_t hi, uint32_t sel, uint32_t sgn)
{
    return __byte_perm(lo, hi, sel) | (sgn & 0x80808080u);
}
/* The sign bytes of the codes of a word (nibble e = code e): for codes 0..3 (lo) and 4..7 (hi).
 * prmt's sign mode (selector bit 3) replicates bit 7 of the chosen byte: bit 7 of byte b of w is
 * the sign of code 2b + 1, of w << 4 the sign of code 2b. */
__device__ __forceinline__ void signs8(uint32_t w, uint32_t &lo, uint32_t &hi)
{
    const uint32_t w4 = w << 4;
    lo = prmt_b32(w4, w, 0xD9C8u);
    hi = prmt_b32(w4, w, 0xFBEAu);
}

/* The pre-pass's tables (gemm_fp8.cu, prepass_*_vec_kernel): E4M3 of k * 2^inc (HiF4) and of
 * 2 e2m1(k) (MXFP4), k = 0..7 in bytes 0..7 of hi:lo. HiF4's tables for inc 1, 2 are those of
 * inc 0 with 8 inc added to the exponent field of each nonzero byte. */
constexpr uint32_t HIF4_LO = 0x44403800u, HIF4_HI = 0x4E4C4A48u, MX_LO = 0x44403800u, MX_HI = 0x54504C48u;

/* The scale of a HiF4 unit as the pre-pass writes it: base / 4, NaN for the NaN word. */
__device__ __forceinline__ float hif4_unit_scale(uint32_t w)
{
    return fp4rl_hif4_word_base_bits(w) == FP4RL_HIF4_NAN_WORD ? fp4rl_bits_f32(0x7fc00000u) : fp4rl_hif4_word_base(w) * 0.25f;
}

/* The same scale from the bits, branch-free (the main loop decodes one a weight row a unit):
 * base / 4 = (1 + m/4) 2^(e - 50) for the E6M2 byte s = e << 2 | m (e <= 63) is a normal float
 * with exponent field e + 77, so its bits are (s << 21) + (77 << 23) (checked for every byte
 * against hif4_unit_scale). (MXFP4's fp4rl_e8m0_decode(s) * 0.5f stays: bit forms of it were
 * no shorter in the loop's SASS.) */
__device__ __forceinline__ float hif4_unit_scale_bits(uint32_t w)
{
    static_assert(FP4RL_E6M2_BIAS == 48 && FP4RL_HIF4_BASE_MASK == 0xFFu, "the E6M2 base layout");
    const uint32_t s = w & FP4RL_HIF4_BASE_MASK;
    return fp4rl_bits_f32(s == FP4RL_HIF4_NAN_WORD ? 0x7fc00000u : (s << 21) + (77u << 23));
}
/* acc = acc + p * (sa * sw): the reference's promotion, as separate IEEE operations. */
__device__ __forceinline__ float promote(float acc, float p, float sa, float sw) { return __fadd_rn(acc, __fmul_rn(p, __fmul_rn(sa, sw))); }

/* Where 16-byte chunk c (0..7) of activation row r of a chunk lands in a stage (from Stage::A): the
 * mma.sync kernel's swizzle (WG false), or for the wgmma kernel (WG true) wgmma's no-swizzle
 * K-major layout of its B operand, chunk-major [c][row][16 bytes], so that each core matrix (8
 * rows x 16 bytes of k) is 128 contiguous bytes: a k32 step is chunks 2s, 2s + 1, AROWS * 16
 * bytes apart (the descriptor's leading byte offset), 8-row groups 128 bytes apart (its stride
 * byte offset). */
template <int NT, bool WG>
__device__ __forceinline__ int a_dst(int r, int c)
{
    return WG ? (c * NT * 8 + r) * 16 : aswz(r, c);
}

/* The cp.async copies of the chunks of one CTA (both kernels: 128 threads, 128 weight rows, NT * 8
 * activation rows). Everything that does not change from chunk to chunk (global row pointers,
 * shared destinations, the row / M bounds) is computed once by the constructor, so a chunk's
 * issue is pointer increments, one K bound and the copies: the mma.sync kernel's main-loop budget
 * at decode sizes is ~0.15 warp-instructions a weight (it must be bound by weight bytes). */
template <int U, int NT, bool WG>
struct D8Copies {
    using S = Stage<NT>;
    static constexpr bool HIF4 = U == 64;
    static constexpr int UPC = KC / U; /* units a chunk: 2 or 4 */
    static constexpr int AROWS = NT * 8;
    /* activations: NA copies of 16 bytes a thread (row q >> 3, chunk q & 7); NS scale words */
    static constexpr int ACOPIES = AROWS * 8, NA = (ACOPIES + THREADS - 1) / THREADS;
    static constexpr int SCOPIES = UPC * AROWS, NS = (SCOPIES + THREADS - 1) / THREADS;
    uint32_t sbase, cdst;
    int tid, cch, cend, units, sb3 = 0;
    const uint8_t *cptr[4];
    bool clive[4];
    bool slive;
    const uint8_t *sptr;
    const uint8_t *aptr[NA];
    bool alive[NA];
    int ak[NA];
    const float *saptr[NS];
    bool salive[NS];
    int saul[NS];
    int64_t sastep;

    __device__ __forceinline__ D8Copies(const D8 &p, int rb, int m0, int cbeg, int cend_, int tid_, uint32_t sbase_)
        : sbase(sbase_), tid(tid_), cch(tid_ & 3), cend(cend_), units(p.K / U)
    {
        /* weight codes: rows (tid >> 2) + 32 i, 16-byte chunk tid & 3 of the 64 bytes a row a chunk */
        const int crow = tid >> 2;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int n = rb * ROWS + crow + 32 * i;
            clive[i] = n < p.N;
            cptr[i] = p.codes + (clive[i] ? (int64_t)n * p.row_bytes : 0) + (int64_t)cbeg * (KC / 2) + cch * 16;
        }
        cdst = S::W + wswz(crow, cch); /* + 2048 i: rows 32 apart keep the swizzle */
        /* weight scales of row tid: HiF4 the chunk's two words; MXFP4 the aligned word holding the
         * chunk's 4 scale bytes (c * 4 is a multiple of 4, so the misalignment sb3 is the row's) and
         * the next one when they cross it */
        const int srow_n = rb * ROWS + tid;
        slive = srow_n < p.N;
        if constexpr (HIF4) {
            sptr = static_cast<const uint8_t *>(p.wscales) + ((slive ? (int64_t)srow_n : 0) * p.scale_cols + (int64_t)cbeg * UPC) * 4;
        } else {
            const int64_t nn = slive ? srow_n : 0;
            const int64_t b = (p.tile ? (nn >> 5) : nn) * p.scale_cols + (int64_t)cbeg * UPC;
            sb3 = (int)(b & 3);
            sptr = static_cast<const uint8_t *>(p.wscales) + (b & ~(int64_t)3);
        }
#pragma unroll
        for (int i = 0; i < NA; i++) {
            const int q = tid + i * THREADS, r = (q >> 3) % AROWS, m = m0 + r;
            ak[i] = (q & 7) * 16;
            alive[i] = (ACOPIES % THREADS == 0 || q < ACOPIES) && m < p.M;
            aptr[i] = p.a8 + (alive[i] ? (int64_t)m * p.K : 0) + (int64_t)cbeg * KC + ak[i];
        }
#pragma unroll
        for (int i = 0; i < NS; i++) {
            const int q = tid + i * THREADS, ul = (q / AROWS) % UPC, r = q % AROWS, m = m0 + r;
            saul[i] = ul;
            salive[i] = (SCOPIES % THREADS == 0 || q < SCOPIES) && m < p.M;
            saptr[i] = p.sa + (salive[i] ? ((int64_t)cbeg * UPC + ul) * p.lda + m : 0);
        }
        sastep = (int64_t)UPC * p.lda;
    }

    /* Copies chunk c into the stage at byte offset wso, zero-filled past N, M and K (activation
     * rows past M are zeros, never read); commits one group always. Called for c = cbeg, cbeg + 1,
     * ... in order: each call advances the pointers. */
    __device__ __forceinline__ void issue(const D8 &p, int c, uint32_t wso)
    {
        if (c < cend) {
            const uint32_t st = sbase + wso;
            const int kleft = p.K - c * KC;    /* > 0; >= KC but for a ragged last chunk */
            const int uleft = units - c * UPC; /* units of this chunk still inside K */
            const bool kin = cch * 32 < kleft;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                cp_async16_s(st + cdst + 2048 * i, cptr[i], clive[i] && kin);
                cptr[i] += KC / 2;
            }
            if constexpr (HIF4) {
#pragma unroll
                for (int ul = 0; ul < 2; ul++) cp_async4_s(st + S::WS + tid * 8 + ul * 4, sptr + ul * 4, slive && ul < uleft);
                sptr += UPC * 4;
            } else {
                const int nv = min(UPC, uleft);
                cp_async4_s(st + S::WS + tid * 8, sptr, slive);
                cp_async4_s(st + S::WS + tid * 8 + 4, sptr + 4, slive && sb3 + nv > 4);
                sptr += UPC;
            }
#pragma unroll
            for (int i = 0; i < NA; i++) {
                const int q = tid + i * THREADS;
                if (ACOPIES % THREADS == 0 || q < ACOPIES)
                    cp_async16_s(st + S::A + a_dst<NT, WG>(q >> 3, q & 7), aptr[i], alive[i] && ak[i] < kleft);
                aptr[i] += KC;
            }
#pragma unroll
            for (int i = 0; i < NS; i++) {
                const int q = tid + i * THREADS;
                if (SCOPIES % THREADS == 0 || q < SCOPIES) cp_async4_s(st + S::AS + q * 4, saptr[i], salive[i] && saul[i] < uleft);
                saptr[i] += sastep;
            }
        }
        cp_async_commit();
    }
};

/* The end of a CTA, both kernels: C (one slice), or this slice's partials to ws[slice][m][n] and,
 * in the last CTA of the (row block, M chunk) to arrive, the slices' sum in slice order
 * (independent of timing). acc[mt][nt][i] is the output at weight row rb * ROWS + row0[mt] +
 * (i >> 1) * 8, activation row m0 + nt * 8 + 2t + (i & 1): the C fragment of mma.sync m16n8 and
 * of wgmma m64nN alike, the kernels' warps differing only in row0. */
/* The CTA barrier of d8_finish: __syncthreads, or (NAMED, d8p_kernel) named barrier 1 over the 4
 * consumer warps only, the producer warp being elsewhere. */
template <bool NAMED>
__device__ __forceinline__ void d8_bar()
{
    if constexpr (NAMED) asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
    else __syncthreads();
}

template <int NT, typename TC, bool NAMED = false>
__device__ __forceinline__ void d8_finish(const D8 &p, const float (&acc)[2][NT][4], const int (&row0)[2], int rb, int slice, int m0, int t,
                                          int tid, int &last)
{
    auto store = [&](int m, int n, float v) {
        if (sizeof(TC) == 2) reinterpret_cast<uint16_t *>(p.c)[(int64_t)m * p.ldc + n] = fp4rl_f32_to_bf16(v);
        else reinterpret_cast<float *>(p.c)[(int64_t)m * p.ldc + n] = v;
    };
    if (p.slices == 1) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int n = rb * ROWS + row0[mt] + (i >> 1) * 8, m = m0 + nt * 8 + 2 * t + (i & 1);
                    if (m < p.M && n < p.N) store(m, n, acc[mt][nt][i]);
                }
        return;
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int n = rb * ROWS + row0[mt] + (i >> 1) * 8, m = m0 + nt * 8 + 2 * t + (i & 1);
                if (m < p.M && n < p.N) p.ws[((int64_t)slice * p.M + m) * p.N + n] = acc[mt][nt][i];
            }
    __threadfence();
    d8_bar<NAMED>();
    const int ctr = rb * gridDim.y + blockIdx.y;
    if (tid == 0) {
        const unsigned prev = atomicAdd(&p.counters[ctr], 1u);
        last = prev == (unsigned)p.slices - 1;
        if (last) p.counters[ctr] = 0; /* zero again for the next launch */
    }
    d8_bar<NAMED>();
    if (!last) return;
    __threadfence();
    const int mrows = min(MCHUNK, p.M - m0);
    for (int idx = tid; idx < ROWS * mrows; idx += THREADS) {
        const int m = m0 + idx / ROWS, n = rb * ROWS + idx % ROWS;
        if (n >= p.N) continue;
        float sum = 0.0f;
        for (int s = 0; s < p.slices; s++) sum = __fadd_rn(sum, __ldcg(&p.ws[((int64_t)s * p.M + m) * p.N + n]));
        store(m, n, sum);
    }
}

/* One unit (ul of its 128-k chunk) of this thread's part of the CTA's 128 x NT * 8 outputs: the
 * weight rows wr0 + mt * 16 + hh * 8 dequantised in registers, the k32 steps' mma.sync from zero,
 * and the promotion acc = acc + p * (sa * sw) - d8_kernel's loop body, which d8p_kernel runs too
 * (the same instructions, so the same bits). Pointers, already at this thread's bytes: cw the
 * unit's codes of row wr0 (rows 64 bytes apart: a chunk's swizzled [128][64] layout), ws row wr0's
 * 8-byte scale slot of the chunk (rows 8 bytes apart), a activation row g's 16 (HiF4) or 8 (MXFP4)
 * bytes of the unit (row nt * 8 + g at a + nt * ASTR8), as the unit's activation scale of row 2t
 * (rows nt * 8 at as + nt * 8). MXFP4: soff[mt][hh] + ul is the unit's E8M0 byte in the row's slot;
 * MXPRE (the re-laid-out weight): the slot holds the chunk's four unit scales 2^e / 2 as the top
 * 16 bits of their FP32 values instead (exact: every such value has zero low bits, 2^-128 too). */
template <int U, int NT, int ASTR8, bool MXPRE = false>
__device__ __forceinline__ void d8_unit(float (&acc)[2][NT][4], const uint8_t *cw_base, const uint8_t *ws_base, const uint8_t *a_base,
                                        const float *as_base, int ul, uint32_t sh8, uint32_t sh16, const int (&soff)[2][2])
{
    constexpr bool HIF4 = U == 64;
    (void)sh8, (void)sh16, (void)soff;
    uint32_t af[2][HIF4 ? 2 : 1][4]; /* [mt][k32 step][a0..a3] */
    float wsc[2][2];                 /* [mt][hh] unit scales of the weight rows */
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int ro = mt * 16 + hh * 8; /* row offset from wr0 */
            if constexpr (HIF4) {
                const uint2 cw = *reinterpret_cast<const uint2 *>(cw_base + ro * 64);
                const uint32_t word = *reinterpret_cast<const uint32_t *>(ws_base + ro * 8 + ul * 4);
                wsc[mt][hh] = hif4_unit_scale_bits(word);
                /* micro-block 4t + 2s + h's increment e8[2t + s] + e16[4t + 2s + h] enters its
                 * tables as inc * 0x08080800 (lo) and inc * 0x08080808 (hi); with the bits
                 * isolated in place (value bit << j) the multiplier is shifted right by j
                 * instead, and the e8 part is shared by the word's two micro-blocks */
                const uint32_t x8 = word >> sh8, x16 = word >> sh16;
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    const uint32_t w = s ? cw.y : cw.x, sel = w & 0x77777777u;
                    uint32_t sg_lo, sg_hi;
                    signs8(w, sg_lo, sg_hi);
                    const uint32_t a = x8 & (1u << s);
                    const uint32_t lo_s = HIF4_LO + a * (0x08080800u >> s), hi_s = HIF4_HI + a * (0x08080808u >> s);
                    const uint32_t b0 = x16 & (1u << (2 * s)), b1 = x16 & (2u << (2 * s));
                    af[mt][s][hh] = enc4(lo_s + b0 * (0x08080800u >> (2 * s)), hi_s + b0 * (0x08080808u >> (2 * s)), sel, sg_lo);
                    af[mt][s][2 + hh] =
                        enc4(lo_s + b1 * (0x08080800u >> (2 * s + 1)), hi_s + b1 * (0x08080808u >> (2 * s + 1)), sel >> 16, sg_hi);
                }
            } else {
                const uint32_t w = *reinterpret_cast<const uint32_t *>(cw_base + ro * 64);
                const uint2 sp = *reinterpret_cast<const uint2 *>(ws_base + ro * 8);
                if constexpr (MXPRE) {
                    const uint32_t h = (ul & 2) ? sp.y : sp.x;
                    wsc[mt][hh] = fp4rl_bits_f32((ul & 1) ? h & 0xffff0000u : h << 16);
                } else {
                    const uint8_t sb = (uint8_t)(__byte_perm(sp.x, sp.y, (uint32_t)(soff[mt][hh] + ul)) & 0xffu);
                    wsc[mt][hh] = fp4rl_e8m0_decode(sb) * 0.5f;
                }
                uint32_t sg_lo, sg_hi;
                signs8(w, sg_lo, sg_hi);
                const uint32_t sel = w & 0x77777777u;
                af[mt][0][hh] = enc4(MX_LO, MX_HI, sel, sg_lo);
                af[mt][0][2 + hh] = enc4(MX_LO, MX_HI, sel >> 16, sg_hi);
            }
        }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        /* B fragment: activation row nt * 8 + g (rows 8 apart share the swizzle) */
        uint32_t b[HIF4 ? 2 : 1][2];
        if constexpr (HIF4) {
            const uint4 v = *reinterpret_cast<const uint4 *>(a_base + nt * ASTR8);
            b[0][0] = v.x, b[0][1] = v.y, b[HIF4 ? 1 : 0][0] = v.z, b[HIF4 ? 1 : 0][1] = v.w;
        } else {
            const uint2 v = *reinterpret_cast<const uint2 *>(a_base + nt * ASTR8);
            b[0][0] = v.x, b[0][1] = v.y;
        }
        /* C columns 2t, 2t + 1 of the tile: activation rows nt * 8 + 2t + j */
        const float2 sa2 = *reinterpret_cast<const float2 *>(as_base + nt * 8);
        const float sa0 = sa2.x, sa1 = sa2.y;
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            float q[4];
            mma_e4m3(q, af[mt][0], b[0][0], b[0][1]);
            if constexpr (HIF4) {
                float q1[4];
                mma_e4m3(q1, af[mt][HIF4 ? 1 : 0], b[HIF4 ? 1 : 0][0], b[HIF4 ? 1 : 0][1]);
#pragma unroll
                for (int i = 0; i < 4; i++) q[i] = __fadd_rn(q[i], q1[i]); /* exact: integers < 2^16 */
            }
            /* c0, c1: weight row g, activation rows 2t, 2t + 1; c2, c3: weight row g + 8 */
            acc[mt][nt][0] = promote(acc[mt][nt][0], q[0], sa0, wsc[mt][0]);
            acc[mt][nt][1] = promote(acc[mt][nt][1], q[1], sa1, wsc[mt][0]);
            acc[mt][nt][2] = promote(acc[mt][nt][2], q[2], sa0, wsc[mt][1]);
            acc[mt][nt][3] = promote(acc[mt][nt][3], q[3], sa1, wsc[mt][1]);
        }
    }
}

template <int U, int NT, typename TC>
__global__ void __launch_bounds__(THREADS) d8_kernel(D8 p)
{
    using S = Stage<NT>;
    constexpr bool HIF4 = U == 64;
    constexpr int UPC = KC / U; /* units a chunk: 2 or 4 */
    constexpr int AROWS = NT * 8;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x / p.slices, slice = blockIdx.x - rb * p.slices;
    const int m0 = blockIdx.y * MCHUNK;
    const int units = p.K / U;

    const int cbeg = slice * p.chunks_per_slice;
    const int cend = min(p.chunks, cbeg + p.chunks_per_slice);

    /* ---- Copies (cp.async) of the chunks (D8Copies: set up once, then one issue a chunk). */
    D8Copies<U, NT, false> copies(p, rb, m0, cbeg, cend, tid, (uint32_t)__cvta_generic_to_shared(smem));
    auto issue = [&](int c, uint32_t wso) { copies.issue(p, c, wso); };

    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;

#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) issue(cbeg + i, (uint32_t)(((cbeg + i) % STAGES) * S::BYTES));

    /* This thread's shared-memory read offsets inside a stage, per unit of the chunk (the
     * swizzles XOR the 16-byte chunk index, so they are computed once here; the weight rows
     * (mt, hh) = warp * 32 + mt * 16 + hh * 8 + g all share one swizzle, as do the activation rows
     * nt * 8 + g, so those become immediates). */
    const int wr0 = warp * 32 + g;
    uint32_t cofs[UPC], aofs[UPC];
#pragma unroll
    for (int ul = 0; ul < UPC; ul++) {
        if constexpr (HIF4) {
            cofs[ul] = S::W + wswz(wr0, 2 * ul + (t >> 1)) + (t & 1) * 8;
            aofs[ul] = S::A + aswz(g, 4 * ul + t);
        } else {
            cofs[ul] = S::W + wswz(wr0, ul) + t * 4;
            aofs[ul] = S::A + aswz(g, 2 * ul + (t >> 1)) + (t & 1) * 8;
        }
    }
    /* HiF4: where this thread's e8 bits (2t, 2t + 1) and e16 bits (4t .. 4t + 3) start in a word */
    const uint32_t sh8 = FP4RL_HIF4_E8_SHIFT + 2 * t, sh16 = FP4RL_HIF4_E16_SHIFT + 4 * t;
    /* MXFP4: the byte of unit ul of the chunk in a row's two scale words (sb3 of row r: the same
     * for the rows (mt, hh) when 1D; per row when 2D tiles) */
    int soff[2][2];
    if constexpr (!HIF4) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int n = rb * ROWS + wr0 + mt * 16 + hh * 8;
                const int64_t nn = n < p.N ? n : 0;
                soff[mt][hh] = (int)((((p.tile ? (nn >> 5) : nn) * p.scale_cols + (int64_t)cbeg * UPC)) & 3);
            }
    }

    uint32_t rso = (uint32_t)((cbeg % STAGES) * S::BYTES); /* the stage read this chunk */
    for (int c = cbeg; c < cend; c++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        /* chunk c + 3 goes to the stage chunk c - 1 used, which every warp finished (barrier above) */
        issue(c + STAGES - 1, rso == 0 ? (uint32_t)((STAGES - 1) * S::BYTES) : rso - S::BYTES);
        const uint8_t *st = smem + rso;
        rso = rso == (uint32_t)((STAGES - 1) * S::BYTES) ? 0u : rso + S::BYTES;
        const int uleft = units - c * UPC;
#pragma unroll
        for (int ul = 0; ul < UPC; ul++) {
            if (ul > 0 && ul >= uleft) break; /* uniform: units past K add nothing (the reference has none) */
            d8_unit<U, NT, 8 * KC>(acc, st + cofs[ul], st + S::WS + wr0 * 8, st + aofs[ul],
                                   reinterpret_cast<const float *>(st + S::AS) + ul * AROWS + 2 * t, ul, sh8, sh16, soff);
        }
    }
    cp_async_wait<0>();
    const int row0[2] = {wr0, wr0 + 16}; /* warp * 32 + mt * 16 + g */
    d8_finish<NT, TC>(p, acc, row0, rb, slice, m0, t, tid, last);
}

/* ---- The wgmma variant (FP4RL_D8_WGMMA=1, sm_90a): mma.sync E4M3 on sm_90 is FP16 HMMA after an
 * unpack (static SASS study), only wgmma runs FP8 at Hopper's FP8 rate. Same CTA (128 threads, 128
 * weight rows, NT * 8 activation rows), copies, ring and epilogue as d8_kernel; the one warpgroup
 * runs the row block as two m64 tiles (mt) one after the other: weight rows mt * 64 + 16 w + g
 * (+ 8) in warp w. Per unit and tile: the unit's k32 steps (HiF4 2, MXFP4 1), each one
 * m64n(8 NT)k32 wgmma from zero into its own registers (A: the dequantised weights, built in
 * registers as d8_kernel builds them; B: the activations from the stage), commit, wait for all,
 * then the promotion acc = acc + p * (sa * sw) in K order with `promote` (p = p0 + p1 exact:
 * integers < 2^16), so one K slice gives d8_kernel's bits. The wait before the promotion also
 * keeps the A registers unmodified while the wgmma reads them (the next tile's dequantisation
 * writes them only after it).
 * The k order is natural here (wgmma's B comes from shared memory in the hardware's order, no
 * per-thread permutation as d8_kernel's B fragments allow): step s of a unit is k 32 s .. 32 s +
 * 31 = one 16-byte piece of a weight row's codes, of which thread t needs bytes 2t, 2t + 1 (k 4t ..
 * 4t + 3: a0 / a1) and 8 + 2t, 9 + 2t (k 16 + 4t ..: a2 / a3), read as two 16-bit loads and joined
 * into one word of 8 codes for the same byte-permute dequantisation. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using namespace fp4rl_cuda_wg;

/* d = A B from zero (scale-d 0: the old d is ignored), one m64n(8 NT)k32 E4M3 step with A from
 * registers - this warp's 16 weight rows x 32 k of the warpgroup's 64, in the mma.sync m16n8k32 A
 * fragment's layout (a0: row g, k 4t .. 4t + 3; a1: row g + 8; a2, a3: k + 16; PTX ISA, wgmma
 * register fragment of A for .e4m3, = CUTLASS's ALayout_64x32) - and B (the activations, K-major,
 * as FP8 wgmma requires) through the descriptor db. d stays an in-out operand written only by
 * wgmma, as in gemm_fp8.cu (ptxas serializes wgmma whose accumulators other instructions define,
 * C7514). d[4 j + e]: weight row 16 w + g + 8 (e >> 1), activation row 8 j + 2 t + (e & 1). */
template <int NT>
__device__ __forceinline__ void wg_mma_rs(float (&d)[4 * NT], const uint32_t (&a)[4], uint64_t db)
{
    static_assert(NT == 1 || NT == 2 || NT == 4 || NT == 8, "wgmma n8 .. n64");
    if constexpr (NT == 1) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
    } else if constexpr (NT == 2) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
    } else if constexpr (NT == 4) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
    }
}

/* Thread t's 8 codes of a 16-byte piece of codes at q (q: the piece + 2t): nibbles 0-3 k 4t .. 4t +
 * 3, nibbles 4-7 k 16 + 4t .. 16 + 4t + 3 of the piece's 32 k. */
__device__ __forceinline__ uint32_t codes_wg(const uint8_t *q)
{
    const uint32_t lo = *reinterpret_cast<const uint16_t *>(q), hi = *reinterpret_cast<const uint16_t *>(q + 8);
    return __byte_perm(lo, hi, 0x5410u);
}
#endif

template <int U, int NT, typename TC>
__global__ void __launch_bounds__(THREADS) d8_wg_kernel(D8 p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = Stage<NT>;
    constexpr bool HIF4 = U == 64;
    constexpr int UPC = KC / U; /* units a chunk: 2 or 4 */
    constexpr int KPU = U / 32; /* k32 steps a unit: 2 or 1 */
    constexpr int AROWS = NT * 8;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x / p.slices, slice = blockIdx.x - rb * p.slices;
    const int m0 = blockIdx.y * MCHUNK;
    const int units = p.K / U;
    const int cbeg = slice * p.chunks_per_slice;
    const int cend = min(p.chunks, cbeg + p.chunks_per_slice);
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    D8Copies<U, NT, true> copies(p, rb, m0, cbeg, cend, tid, sbase);

    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) copies.issue(p, cbeg + i, (uint32_t)(((cbeg + i) % STAGES) * S::BYTES));

    /* This thread's weight rows mt * 64 + wr0 + 8 hh all share one swizzle (wswz's (r >> 1) & 3),
     * so the piece offsets are computed once and the rows become immediates. */
    const int wr0 = warp * 16 + g;
    uint32_t cofs[4];
#pragma unroll
    for (int pc = 0; pc < 4; pc++) cofs[pc] = S::W + wswz(wr0, pc) + 2 * t;
    /* HiF4: step s's low nibbles are micro-block 8 s + t (e16 bit 8 s + t, e8 bit 4 s + t / 2), the
     * high ones micro-block 8 s + 4 + t (e16 8 s + 4 + t, e8 4 s + 2 + t / 2) */
    const uint32_t sh8 = FP4RL_HIF4_E8_SHIFT + (t >> 1), sh16 = FP4RL_HIF4_E16_SHIFT + t;
    int soff[2][2] = {{0, 0}, {0, 0}};
    if constexpr (!HIF4) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int n = rb * ROWS + mt * 64 + wr0 + hh * 8;
                const int64_t nn = n < p.N ? n : 0;
                soff[mt][hh] = (int)((((p.tile ? (nn >> 5) : nn) * p.scale_cols + (int64_t)cbeg * UPC)) & 3);
            }
    }

    uint32_t rso = (uint32_t)((cbeg % STAGES) * S::BYTES); /* the stage read this chunk */
    for (int c = cbeg; c < cend; c++) {
        cp_async_wait<STAGES - 2>();
        wg_fence_proxy_async(); /* this thread's copies of chunk c, for wgmma's reads of B */
        __syncthreads();
        /* chunk c + 3 goes to the stage chunk c - 1 used: its wgmmas were waited for, every warp is
         * past them (barrier above) */
        copies.issue(p, c + STAGES - 1, rso == 0 ? (uint32_t)((STAGES - 1) * S::BYTES) : rso - S::BYTES);
        const uint8_t *st = smem + rso;
        const uint32_t sst = sbase + rso;
        rso = rso == (uint32_t)((STAGES - 1) * S::BYTES) ? 0u : rso + S::BYTES;
        const int uleft = units - c * UPC;
#pragma unroll
        for (int ul = 0; ul < UPC; ul++) {
            if (ul > 0 && ul >= uleft) break; /* uniform: units past K add nothing (the reference has none) */
            const float *as_base = reinterpret_cast<const float *>(st + S::AS) + ul * AROWS + 2 * t;
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                uint32_t af[KPU][4]; /* [k32 step][a0..a3] */
                float wsc[2];        /* [hh] unit scales of the weight rows g, g + 8 */
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int r = mt * 64 + hh * 8; /* row offset from wr0 */
                    if constexpr (HIF4) {
                        const uint32_t word = *reinterpret_cast<const uint32_t *>(st + S::WS + (wr0 + r) * 8 + ul * 4);
                        wsc[hh] = hif4_unit_scale_bits(word);
#pragma unroll
                        for (int s = 0; s < 2; s++) {
                            const uint32_t w = codes_wg(st + cofs[2 * ul + s] + r * 64), sel = w & 0x77777777u;
                            uint32_t sg_lo, sg_hi;
                            signs8(w, sg_lo, sg_hi);
                            /* inc = e8 + e16 of the low and the high micro-block; the tables of inc are
                             * inc 0's with 8 inc added to the exponent field of each nonzero byte */
                            const uint32_t i0 = ((word >> (sh8 + 4 * s)) & 1u) + ((word >> (sh16 + 8 * s)) & 1u);
                            const uint32_t i1 = ((word >> (sh8 + 4 * s + 2)) & 1u) + ((word >> (sh16 + 8 * s + 4)) & 1u);
                            af[s][hh] = enc4(HIF4_LO + i0 * 0x08080800u, HIF4_HI + i0 * 0x08080808u, sel, sg_lo);
                            af[s][2 + hh] = enc4(HIF4_LO + i1 * 0x08080800u, HIF4_HI + i1 * 0x08080808u, sel >> 16, sg_hi);
                        }
                    } else {
                        const uint2 sp = *reinterpret_cast<const uint2 *>(st + S::WS + (wr0 + r) * 8);
                        const uint8_t sb = (uint8_t)(__byte_perm(sp.x, sp.y, (uint32_t)(soff[mt][hh] + ul)) & 0xffu);
                        wsc[hh] = fp4rl_e8m0_decode(sb) * 0.5f;
                        const uint32_t w = codes_wg(st + cofs[ul] + r * 64), sel = w & 0x77777777u;
                        uint32_t sg_lo, sg_hi;
                        signs8(w, sg_lo, sg_hi);
                        af[0][hh] = enc4(MX_LO, MX_HI, sel, sg_lo);
                        af[0][2 + hh] = enc4(MX_LO, MX_HI, sel >> 16, sg_hi);
                    }
                }
                /* B of step s: the unit's 16-byte chunks 2 (KPU ul + s), + 1 of every activation row */
                float q0[4 * NT], q1[4 * NT];
                wg_fence(); /* the A registers above, the accumulators' last reads below */
#pragma unroll
                for (int s = 0; s < KPU; s++) {
                    const uint32_t b = sst + S::A + (uint32_t)((2 * (KPU * ul + s)) * AROWS * 16);
                    const uint64_t db = wg_desc_bits(b, AROWS * 16, 128, 0);
                    if (s == 0) wg_mma_rs<NT>(q0, af[0], db);
                    else wg_mma_rs<NT>(q1, af[KPU - 1], db);
                }
                wg_commit();
                wg_wait0();
                wg_fence_regs(q0);
                if constexpr (HIF4) wg_fence_regs(q1);
#pragma unroll
                for (int s = 0; s < KPU; s++) wg_fence_regs(af[s]);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const float2 sa2 = *reinterpret_cast<const float2 *>(as_base + nt * 8);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float q = HIF4 ? __fadd_rn(q0[4 * nt + e], q1[4 * nt + e]) : q0[4 * nt + e]; /* exact: integers < 2^16 */
                        acc[mt][nt][e] = promote(acc[mt][nt][e], q, (e & 1) ? sa2.y : sa2.x, wsc[e >> 1]);
                    }
                }
            }
        }
    }
    cp_async_wait<0>();
    const int row0[2] = {wr0, 64 + wr0};
    d8_finish<NT, TC>(p, acc, row0, rb, slice, m0, t, tid, last);
#else
    (void)p;
    __trap(); /* launched only where fp4rl_cuda_has_sm90a says this build has the kernel */
#endif
}

/* ---- The persistent, warp-specialised variant (FP4RL_D8_PERSIST=1, sm_90+, M <= 64) ---------
 * d8_kernel is latency-bound at decode sizes (bench/RESULTS.md: half a wave of 4-warp CTAs, each
 * thread issuing its own 16-byte cp.async and every chunk a __syncthreads). Here:
 * - the weight is re-laid out once (fp4rl_cuda_d8_relayout, per weight sync) as chunks of
 *   P_CHUNK_BYTES: a 128-row x 128-k chunk's codes in d8_kernel's swizzled shared layout
 *   [128][64] (wswz), then its scale slots [128][8] (HiF4: the chunk's two words; MXFP4: its four
 *   unit scales 2^e / 2 pre-decoded as the top halves of their FP32 values, one shift a unit in
 *   the loop instead of the E8M0 decode; 32 x 32 tiles expanded to every row), chunk-major within
 *   a row block. A ring stage (P_CPS chunks of one row block) is then one contiguous bulk copy, and the
 *   consumers' reads are d8_kernel's, conflict-free as there. Rows past N and units past K are
 *   zero codes and zero scale bytes.
 * - one producer warp streams each stage with cp.async.bulk (one weight copy, one per activation
 *   row, one per unit of activation scales, spread over its lanes) completing on the stage's
 *   full mbarrier (arrive.expect_tx by lane 0); the 4 consumer warps wait on it, run d8_unit (the
 *   same dequantisation, mma.sync and promotion code as d8_kernel) and release the stage on its
 *   empty mbarrier (one arrival a warp). No CTA barrier in the loop.
 * - the activations stream in the ring with the weights (K is unbounded; a whole K slice of 16
 *   rows at K = 16384 would not fit), rows ASTR bytes apart: ASTR = stage k + 64 (HiF4, 16-byte
 *   reads, a quarter-warp's two rows 16 banks apart) or + 32 (MXFP4, 8-byte reads, a half-warp's
 *   four rows 8 banks apart), so the B-fragment reads are conflict-free without a swizzle.
 *   Activation rows M .. NT * 8 - 1 are zeroed once and never copied (their outputs are not
 *   stored).
 * - persistent: the grid is the CTAs that fit (2 a multiprocessor by default), each walking work
 *   items (row block x K slice) blockIdx.x, + gridDim.x, ...; the ring runs on across items.
 *   A work item is d8_kernel's CTA: the same units promoted in K order from zero, then d8_finish
 *   (its barrier a named one over the consumers), so one slice gives d8_kernel's bits and
 *   split-K sums the slices in slice order.
 * Phases: stage s = it % stages, use n = it / stages (it counts stages over all items, the same
 * in the producer and the consumers); consumers wait full[s] for parity n & 1, the producer
 * waits empty[s] for parity (n & 1) ^ 1 (true at once on a fresh barrier, n = 0). */
constexpr int P_CPS = 2;                              /* 128-k chunks a stage */
constexpr int P_CHUNK_BYTES = ROWS * 64 + ROWS * 8;   /* codes + scale slots of one chunk: 9 KiB */
constexpr int P_THREADS = THREADS + 32;               /* 4 consumer warps + the producer warp */
constexpr int P_MAX_STAGES = 8;
constexpr int P_MAX_M = 64;

template <int U, int NT>
struct PStage {
    static constexpr int AROWS = NT * 8, UPC = KC / U;
    static constexpr int ASTR = P_CPS * KC + (U == 64 ? 64 : 32);
    /* the weight chunks at 0, then the activation rows, then their scales */
    static constexpr int A = P_CPS * P_CHUNK_BYTES, AS = A + AROWS * ASTR;
    static constexpr int BYTES = AS + P_CPS * UPC * AROWS * 4;
    static_assert(A % 16 == 0 && AS % 16 == 0 && BYTES % 16 == 0 && ASTR % 16 == 0, "bulk-copy destinations are 16-byte aligned");
};

/* The re-layout: one thread a row of one chunk (block b = row block * chunks + chunk). */
template <int U>
__global__ void __launch_bounds__(ROWS) d8p_relayout_k(uint8_t *out, D8P p)
{
    constexpr int UPC = KC / U;
    const int r = threadIdx.x, units = p.K / U;
    for (int64_t b = blockIdx.x; b < (int64_t)p.rblocks * p.chunks; b += gridDim.x) {
        const int rb = (int)(b / p.chunks), c = (int)(b - (int64_t)rb * p.chunks);
        uint8_t *dst = out + b * P_CHUNK_BYTES;
        const int n = rb * ROWS + r, kleft = p.K - c * KC, uleft = units - c * UPC;
        const bool live = n < p.N;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint4 v = make_uint4(0, 0, 0, 0);
            if (live && q * 32 < kleft) v = *reinterpret_cast<const uint4 *>(p.codes + (int64_t)n * p.row_bytes + (int64_t)c * (KC / 2) + q * 16);
            *reinterpret_cast<uint4 *>(dst + wswz(r, q)) = v;
        }
        uint32_t sl[2] = {0, 0};
        if (live) {
            if constexpr (U == 64) {
                const uint32_t *ws = static_cast<const uint32_t *>(p.wscales) + (int64_t)n * p.scale_cols + (int64_t)c * UPC;
#pragma unroll
                for (int ul = 0; ul < UPC; ul++)
                    if (ul < uleft) sl[ul] = ws[ul];
            } else { /* the scales 2^e / 2 as d8_kernel decodes them, their top halves (d8_unit's MXPRE) */
                const uint8_t *ws = static_cast<const uint8_t *>(p.wscales) + (int64_t)(p.tile ? n >> 5 : n) * p.scale_cols + (int64_t)c * UPC;
#pragma unroll
                for (int ul = 0; ul < UPC; ul++)
                    if (ul < uleft) sl[ul >> 1] |= (fp4rl_f32_bits(fp4rl_e8m0_decode(ws[ul]) * 0.5f) >> 16) << (16 * (ul & 1));
            }
        }
        *reinterpret_cast<uint2 *>(dst + ROWS * 64 + r * 8) = make_uint2(sl[0], sl[1]);
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
using namespace fp4rl_cuda_bulk;
#endif

template <int U, int NT, typename TC>
__global__ void __launch_bounds__(P_THREADS) d8p_kernel(D8P p)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using S = PStage<U, NT>;
    constexpr bool HIF4 = U == 64;
    constexpr int UPC = S::UPC, AROWS = S::AROWS;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ int last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int units = p.K / U, stages = p.stages;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t bar_full = sbase + (uint32_t)(stages * S::BYTES), bar_empty = bar_full + 8u * stages;
    if (tid == 0) {
        for (int s = 0; s < stages; s++) {
            wg_mbar_init(bar_full + 8 * s, 1);
            wg_mbar_init(bar_empty + 8 * s, WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    /* activation rows M .. AROWS - 1 of every stage: zeros, never copied */
    const int zrows = AROWS - p.M, zper = zrows * (S::ASTR / 16);
    for (int i = tid; i < stages * zper; i += P_THREADS) {
        const int s = i / zper, j = i - s * zper;
        *reinterpret_cast<uint4 *>(smem + s * S::BYTES + S::A + p.M * S::ASTR + j * 16) = make_uint4(0, 0, 0, 0);
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads(); /* the barriers' init and the zeros, before any copy or read */

    if (warp == WARPS) {
        /* Producer warp: every lane waits for the stage to be free, lane 0 announces its bytes, then
         * the lanes share its copies (copy 0 the weight chunks, 1 .. M the activation rows, then
         * the units' activation scales: AROWS floats of the unit-major layout, whose rows past M
         * are its zero padding, lda being a multiple of 128 >= AROWS). */
        uint32_t it = 0;
        for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
            const int rb = item % p.rblocks, slice = item / p.rblocks;
            const int cbeg = slice * p.chunks_per_slice, cend = min(p.chunks, cbeg + p.chunks_per_slice);
            for (int c = cbeg; c < cend; c += P_CPS, it++) {
                const uint32_t s = it % (uint32_t)stages, ph = (it / (uint32_t)stages) & 1u;
                const int n = min(P_CPS, cend - c);
                const int abytes = min(n * KC, p.K - c * KC); /* a multiple of 32: K % U == 0 */
                const int nu = min(n * UPC, units - c * UPC);
                const uint32_t st = sbase + s * S::BYTES, fb = bar_full + 8 * s;
                wg_mbar_wait_or_trap(bar_empty + 8 * s, ph ^ 1u);
                if (lane == 0) wg_mbar_arrive_tx(fb, (uint32_t)(n * P_CHUNK_BYTES + p.M * abytes + nu * AROWS * 4));
                __syncwarp();
                for (int i = lane; i < 1 + p.M + nu; i += 32) {
                    if (i == 0) {
                        wg_bulk(st, p.tiles + ((int64_t)rb * p.chunks + c) * P_CHUNK_BYTES, (uint32_t)(n * P_CHUNK_BYTES), fb);
                    } else if (i <= p.M) {
                        wg_bulk(st + S::A + (i - 1) * S::ASTR, p.a8 + (int64_t)(i - 1) * p.K + (int64_t)c * KC, (uint32_t)abytes, fb);
                    } else {
                        const int u = i - 1 - p.M;
                        wg_bulk(st + S::AS + u * AROWS * 4, p.sa + ((int64_t)c * UPC + u) * p.lda, AROWS * 4, fb);
                    }
                }
            }
        }
        /* Tail: the waits for the next `stages` stages, i.e. until the consumers have released
         * every stage - so a pipeline bug (a byte count that never lands, a lost arrival) traps here
         * after ~1 s instead of leaving the consumers spinning on a full barrier for ever. */
        for (uint32_t k = it; k < it + (uint32_t)stages; k++)
            wg_mbar_wait_or_trap(bar_empty + 8 * (k % (uint32_t)stages), ((k / (uint32_t)stages) & 1u) ^ 1u);
        return;
    }

    /* Consumer warps: d8_kernel's thread mapping (weight rows warp * 32 + mt * 16 + hh * 8 + g);
     * the read offsets inside a chunk are computed once. */
    const int wr0 = warp * 32 + g;
    uint32_t cofs[UPC], aofs[UPC];
#pragma unroll
    for (int ul = 0; ul < UPC; ul++) {
        if constexpr (HIF4) {
            cofs[ul] = wswz(wr0, 2 * ul + (t >> 1)) + (t & 1) * 8;
            aofs[ul] = g * S::ASTR + (4 * ul + t) * 16;
        } else {
            cofs[ul] = wswz(wr0, ul) + t * 4;
            aofs[ul] = g * S::ASTR + ul * 32 + t * 8;
        }
    }
    const uint32_t sh8 = FP4RL_HIF4_E8_SHIFT + 2 * t, sh16 = FP4RL_HIF4_E16_SHIFT + 4 * t;
    const int soff[2][2] = {{0, 0}, {0, 0}}; /* unused: MXPRE */
    const int row0[2] = {wr0, wr0 + 16};
    uint32_t it = 0;
    for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
        const int rb = item % p.rblocks, slice = item / p.rblocks;
        const int cbeg = slice * p.chunks_per_slice, cend = min(p.chunks, cbeg + p.chunks_per_slice);
        float acc[2][NT][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
        for (int c = cbeg; c < cend; c += P_CPS, it++) {
            const uint32_t s = it % (uint32_t)stages, ph = (it / (uint32_t)stages) & 1u;
            wg_mbar_wait(bar_full + 8 * s, ph);
            const uint8_t *st = smem + s * S::BYTES;
            const int n = min(P_CPS, cend - c);
#pragma unroll
            for (int j = 0; j < P_CPS; j++) {
                if (j > 0 && j >= n) break; /* uniform: a slice's last stage may hold one chunk */
                const int uleft = units - (c + j) * UPC;
                const uint8_t *cw = st + j * P_CHUNK_BYTES;
                const uint8_t *ab = st + S::A + j * KC;
                const float *asb = reinterpret_cast<const float *>(st + S::AS) + j * UPC * AROWS + 2 * t;
#pragma unroll
                for (int ul = 0; ul < UPC; ul++) {
                    if (ul > 0 && ul >= uleft) break; /* uniform: units past K add nothing (the reference has none) */
                    d8_unit<U, NT, 8 * S::ASTR, true>(acc, cw + cofs[ul], cw + ROWS * 64 + wr0 * 8, ab + aofs[ul], asb + ul * AROWS, ul, sh8, sh16, soff);
                }
            }
            __syncwarp(); /* every lane's reads of the stage, before the warp releases it */
            if (lane == 0) wg_mbar_arrive(bar_empty + 8 * s);
        }
        d8_finish<NT, TC, true>(p, acc, row0, rb, slice, 0, t, tid, last);
    }
#else
    (void)p;
    __trap(); /* launched only where d8_arch_ok(ctx, 90) says this build has the kernel */
#endif
}

template <int U, int NT, typename TC>
cudaError_t d8_launch_one(const D8 &p, dim3 grid, cudaStream_t s, bool wg)
{
    constexpr int smem = Stage<NT>::SMEM;
    void (*kernel)(D8) = wg ? d8_wg_kernel<U, NT, TC> : d8_kernel<U, NT, TC>;
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    kernel<<<grid, THREADS, smem, s>>>(p);
    return cudaSuccess;
}

template <int U, typename TC>
cudaError_t d8_launch(const D8 &p, dim3 grid, cudaStream_t s, bool wg)
{
    if (p.M <= 8) return d8_launch_one<U, 1, TC>(p, grid, s, wg);
    if (p.M <= 16) return d8_launch_one<U, 2, TC>(p, grid, s, wg);
    if (p.M <= 32) return d8_launch_one<U, 4, TC>(p, grid, s, wg);
    return d8_launch_one<U, 8, TC>(p, grid, s, wg);
}

/* Whether this build has code of architecture >= arch (89: the mma body; 90: d8p_kernel's bulk
 * copies and mbarriers) for the current device, which must be of that compute capability too:
 * a probe kernel's answer, asked once per arch. */
__global__ void d8_probe_kernel(int *out, int arch)
{
#if defined(__CUDA_ARCH__)
    *out = __CUDA_ARCH__ >= arch * 10;
#else
    (void)out, (void)arch;
#endif
}

int d8_arch_ok(fp4rl_context *ctx, int arch)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    if (cu->cc_major * 10 + cu->cc_minor < arch) return 0;
    static int probed[2] = {-1, -1};
    int &pr = probed[arch >= 90];
    if (pr < 0) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(cu->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
            (void)cudaGetLastError();
            return arch < 90; /* while capturing: assume the mma body (a launch error reports it otherwise), not the opt-in one */
        }
        int *d = NULL, h = 0;
        if (cudaMalloc(&d, sizeof(int)) == cudaSuccess) {
            d8_probe_kernel<<<1, 1>>>(d, arch);
            if (cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) h = 0;
            cudaFree(d);
        }
        (void)cudaGetLastError();
        pr = h == 1;
    }
    return pr;
}
int d8_device_ok(fp4rl_context *ctx) { return d8_arch_ok(ctx, 89); }

/* ---- the activation quantizer (fp4rl_cuda_act_e4m3) ----------------------------------------
 * One thread per 8 consecutive elements of a row ("group"), a unit's groups in adjacent lanes, as
 * rollout_act's act_qdq_k: the same formats.h steps (amax over the finite elements, a non-finite
 * element makes the unit NaN, zero padding to whole units), but the codes are kept and written as
 * the pre-pass's E4M3 bytes, the unit's scale as its FP32 scale. */
template <int BS>
__device__ __forceinline__ float unit_max_lanes(float v)
{
#pragma unroll
    for (int m = 1; m < BS / 8; m <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

/* E4M3 byte of a small integer-valued float (exact: at most 3 significant bits). */
__device__ __forceinline__ uint8_t e4m3_exact(float v) { return fp4rl_e4m3_encode(v, -1.0f); }

/* Quantizes the group x (group h of its unit) with nearest rounding: E4M3 bytes (packed, byte j
 * = element j), the dequantized values y (what rollout_act yields) and the unit's FP32 scale. */
template <int BS>
__device__ __forceinline__ void quant_group(const float x[8], int h, int truncation_free, uint8_t o[8], float y[8], float &scale)
{
    int fin = 1;
    const float a0 = fp4rl_qdq_amax(x, 0, 4, &fin), a1 = fp4rl_qdq_amax(x, 4, 8, &fin);
    const float amax = unit_max_lanes<BS>(fmaxf(a0, a1));
    const float bad = unit_max_lanes<BS>(fin ? 0.0f : 1.0f);
    if (bad != 0.0f) { /* the quantizer's NaN unit: codes 0, and the pre-pass's NaN scale */
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = 0, y[j] = fp4rl_bits_f32(0x7fc00000u);
        scale = fp4rl_bits_f32(0x7fc00000u);
        return;
    }
    if (BS == 32) {
        const uint8_t s = fp4rl_mx_block_scale(amax, FP4RL_DTYPE_MXFP4, truncation_free);
        scale = fp4rl_e8m0_decode(s) * 0.5f; /* 2^e / 2: the byte holds 2 e2m1(code) */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint8_t code = fp4rl_mx_encode(x[j], fp4rl_e8m0_exp(s), 0, -1.0f);
            y[j] = fp4rl_mx_decode(code, s, 0);
            o[j] = e4m3_exact(2.0f * fp4rl_e2m1_decode(code));
        }
        return;
    }
    /* HiF4: this group's bits of the unit's word (its e8 bit, its two e16 bits), as rollout_act */
    const fp4rl_hif4_base b = fp4rl_hif4_make_base(amax);
    const uint32_t e8 = fp4rl_hif4_e8(fmaxf(a0, a1), b.rec);
    const uint32_t word = b.e6m2 | fp4rl_hif4_e8_at(e8, h) | fp4rl_hif4_e16_at(fp4rl_hif4_e16(a0, e8, b.rec), 2 * h) |
                          fp4rl_hif4_e16_at(fp4rl_hif4_e16(a1, e8, b.rec), 2 * h + 1);
    scale = hif4_unit_scale(word);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int jj = 8 * h + j, inc = fp4rl_hif4_word_inc(word, jj);
        const uint8_t code = fp4rl_hif4_encode(x[j], inc, b.rec, -1.0f);
        y[j] = fp4rl_hif4_decode(code, word, jj);
        const float m = (float)(code & 7u) * (float)(1 << inc); /* value * 4 = k * 2^inc */
        o[j] = e4m3_exact((code & 8u) ? -m : m);
    }
}

__device__ __forceinline__ void store8(uint8_t *dst, const uint8_t o[8])
{
    const uint32_t lo = (uint32_t)o[0] | (uint32_t)o[1] << 8 | (uint32_t)o[2] << 16 | (uint32_t)o[3] << 24;
    const uint32_t hi = (uint32_t)o[4] | (uint32_t)o[5] << 8 | (uint32_t)o[6] << 16 | (uint32_t)o[7] << 24;
    *reinterpret_cast<uint2 *>(dst) = make_uint2(lo, hi);
}

template <int BS>
__global__ void __launch_bounds__(256) act_e4m3_k(uint8_t *out, float *scales, unsigned long long *counts, const float *x, int64_t N,
                                                  int64_t K, int truncation_free, int resq, int64_t ld)
{
    const int two = resq == FP4RL_RESQ_DENSE || resq == FP4RL_RESQ_2_4;
    const int64_t Kp = (K + BS - 1) / BS * BS, gpr = Kp / 8;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; /* every lane runs: shuffles */
    const int64_t n = i / gpr, g = i - n * gpr, k0 = g * 8;
    const int h = (int)(g % (BS / 8));
    const int64_t valid = n < N && k0 < K ? (K - k0 < 8 ? K - k0 : 8) : 0;
    float xv[8], y[8], scale;
    uint8_t o[8];
    if (valid == 8 && (K % 8) == 0) {
        const float4 *p = reinterpret_cast<const float4 *>(x + n * K + k0);
        const float4 a = __ldg(p), c = __ldg(p + 1);
        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = c.x, xv[5] = c.y, xv[6] = c.z, xv[7] = c.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) xv[j] = j < valid ? x[n * K + k0 + j] : 0.0f;
    }
    quant_group<BS>(xv, h, truncation_free, o, y, scale);
    unsigned long long nz = 0, under = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        nz += xv[j] != 0.0f;
        under += xv[j] != 0.0f && y[j] == 0.0f;
    }
    const bool row = n < N; /* whole units of real rows are written, padding included */
    if (row) {
        store8(out + n * Kp + k0, o);
        if (h == 0) scales[(k0 / BS) * ld + n] = scale;
    }
    if (two) {
        float r[8], yr[8];
#pragma unroll
        for (int j = 0; j < 8; j++) r[j] = xv[j] - y[j];
        quant_group<BS>(r, h, truncation_free, o, yr, scale);
        if (resq == FP4RL_RESQ_2_4) {
            /* rollout_act masks the dequantized residual; an element the mask drops (its bits
             * changed: the mask writes +0, so a dropped -0 counts too) is written as the byte
             * 0x00, the unit keeps its scale */
            float m[8];
#pragma unroll
            for (int j = 0; j < 8; j++) m[j] = yr[j];
            fp4rl_mask_2_4_group(m, 4), fp4rl_mask_2_4_group(m + 4, 4);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (fp4rl_f32_bits(m[j]) != fp4rl_f32_bits(yr[j])) o[j] = 0;
        }
        if (row) {
            store8(out + (N + n) * Kp + k0, o);
            if (h == 0) scales[(k0 / BS) * ld + N + n] = scale;
        }
    }
    if (!counts) return;
    for (int m = 16; m > 0; m >>= 1) { /* integer sums: exact whatever the order */
        nz += __shfl_xor_sync(0xffffffffu, nz, m);
        under += __shfl_xor_sync(0xffffffffu, under, m);
    }
    if ((threadIdx.x & 31) == 0 && (nz || under)) {
        atomicAdd(counts, nz);
        atomicAdd(counts + 1, under);
    }
}

} // namespace

namespace {

/* The weight checks of fp4rl_cuda_d8_gemm and fp4rl_cuda_d8_relayout (who: the message prefix);
 * *U the unit. */
fp4rl_status d8_weight_check(const fp4rl_tensor *w, const char *who, int *U)
{
    if (w->dtype != FP4RL_DTYPE_HIF4 && w->dtype != FP4RL_DTYPE_MXFP4)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: the weight must be HiF4 or MXFP4 (got dtype %d)", who, (int)w->dtype);
    *U = fp4rl_cuda_fp8_unit(w);
    if (!*U || w->ndim != 2) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: the weight must be 2D, HiF4 or MXFP4 1D along K or 32 x 32 tiles", who);
    const int64_t N = w->q.rows, K = w->q.cols;
    if (K % *U || K < *U) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: K = %lld is not a positive multiple of the unit %d", who, (long long)K, *U);
    if (N >= (1LL << 31) || K >= (1LL << 31))
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: N = %lld, K = %lld out of range", who, (long long)N, (long long)K);
    if (((uintptr_t)w->data & 15) || ((uintptr_t)w->scales & 3) || (w->q.row_bytes & 15))
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "%s: weight not aligned (codes and rows 16 bytes, scales 4)", who);
    return FP4RL_OK;
}

/* The weight fields of a D8 (everything fp4rl_cuda_d8_relayout needs too). */
void d8_weight_params(D8P &p, const fp4rl_tensor *w)
{
    p.codes = static_cast<const uint8_t *>(w->data);
    p.wscales = w->scales;
    p.N = (int)w->q.rows;
    p.K = (int)w->q.cols;
    p.row_bytes = w->q.row_bytes;
    p.scale_cols = w->q.scale_cols;
    p.tile = w->dtype == FP4RL_DTYPE_MXFP4 ? w->q.tile : 0;
    p.chunks = (p.K + KC - 1) / KC;
    p.rblocks = (p.N + ROWS - 1) / ROWS;
    p.tiles = NULL;
}

size_t d8_relayout_bytes(const D8P &p) { return (size_t)p.rblocks * (size_t)p.chunks * P_CHUNK_BYTES; }

/* d8p_kernel's launch: the ring's stages as fit `ctas` CTAs a multiprocessor (at most
 * P_MAX_STAGES, at least 2), the grid the CTAs that fit, the K split the one that balances the
 * work items over it (slices <= 0; or slices forced). */
template <int U, int NT, typename TC>
cudaError_t d8p_launch_one(fp4rl_context *ctx, D8P &p, int slices, int ctas, void **ws)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    using S = PStage<U, NT>;
    void (*kernel)(D8P) = d8p_kernel<U, NT, TC>;
    /* the ring's size, the attribute and the occupancy: once per (device, ctas) and variant, not
     * at every call (the host calls would cost about as much as an M = 1 GEMM) */
    static int c_dev = -1, c_ctas = 0, c_stages = 0, c_smem = 0, c_occ = 0;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev != c_dev || ctas != c_ctas) {
        int sm_smem = 0, blk_smem = 0, occ = 0;
        if ((e = cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev)) != cudaSuccess) return e;
        if ((e = cudaDeviceGetAttribute(&blk_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess) return e;
        const int per_cta = min(blk_smem, sm_smem / ctas - 1024 /* the runtime's reserve a CTA */ - 16 /* `last` */);
        const int stages = max(2, min(P_MAX_STAGES, per_cta / (S::BYTES + 16)));
        const int smem = stages * (S::BYTES + 16);
        if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) != cudaSuccess) return e;
        if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, P_THREADS, smem)) != cudaSuccess) return e;
        c_stages = stages, c_smem = smem, c_occ = occ, c_ctas = ctas, c_dev = dev;
    }
    p.stages = c_stages;
    const int smem = c_smem, occ = c_occ;
    const int cap = cu->sm_count * max(occ, 1);
    int want = slices;
    if (want <= 0) {
        /* fewest waves x (stages a work item + its split-K traffic: 128 x M partials written and
         * read again, in units of a stage's weight bytes); ties to fewer slices */
        double best = -1.0;
        for (int s = 1; s <= min(32, p.chunks); s++) {
            const int cps = (p.chunks + s - 1) / s, sl = (p.chunks + cps - 1) / cps;
            const long items = (long)p.rblocks * sl;
            const double item = (double)((cps + P_CPS - 1) / P_CPS) + (sl > 1 ? 2.0 * ROWS * 4 * p.M / (P_CPS * P_CHUNK_BYTES) : 0.0);
            const double cost = (double)((items + cap - 1) / cap) * item;
            if (best < 0.0 || cost < best) best = cost, want = s;
        }
    }
    want = max(1, min(want, p.chunks));
    p.chunks_per_slice = (p.chunks + want - 1) / want;
    p.slices = (p.chunks + p.chunks_per_slice - 1) / p.chunks_per_slice;
    p.items = p.rblocks * p.slices;
    p.ws = NULL;
    p.counters = cu->counters;
    if (p.slices > 1) {
        fp4rl_status st = fp4rl_cuda_split_counters(ctx, (size_t)p.rblocks, &p.counters);
        if (!st) st = fp4rl_cuda_alloc_bytes(ctx, ws, (size_t)p.slices * p.M * p.N * sizeof(float));
        if (st) return cudaErrorMemoryAllocation; /* the status's message stays the last error */
        p.ws = static_cast<float *>(*ws);
    }
    kernel<<<min(p.items, cap), P_THREADS, smem, cu->stream>>>(p);
    return cudaSuccess;
}

template <int U, typename TC>
cudaError_t d8p_launch(fp4rl_context *ctx, D8P &p, int slices, int ctas, void **ws)
{
    if (p.M <= 8) return d8p_launch_one<U, 1, TC>(ctx, p, slices, ctas, ws);
    if (p.M <= 16) return d8p_launch_one<U, 2, TC>(ctx, p, slices, ctas, ws);
    if (p.M <= 32) return d8p_launch_one<U, 4, TC>(ctx, p, slices, ctas, ws);
    return d8p_launch_one<U, 8, TC>(ctx, p, slices, ctas, ws);
}

/* Both entries: tiles NULL, or the persistent kernel not selected, take d8_kernel / d8_wg_kernel. */
fp4rl_status d8_gemm(fp4rl_context *ctx, const uint8_t *a8, const float *sa, int64_t M, const fp4rl_tensor *w, const void *tiles, void *c,
                     int c_bf16, int64_t ldc, int slices)
{
    if (!ctx || !a8 || !sa || !w || !c || !w->data || !w->scales)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "d8_gemm: NULL context, operand, scale or output pointer");
    int U = 0;
    fp4rl_status st = d8_weight_check(w, "d8_gemm", &U);
    if (st) return st;
    const int64_t N = w->q.rows;
    if (M < 1 || M > FP4RL_D8_MAX_M) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "d8_gemm: M = %lld outside 1..%d", (long long)M, FP4RL_D8_MAX_M);
    if (ldc < N || ldc >= (1LL << 31)) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "d8_gemm: ldc = %lld out of range", (long long)ldc);
    if (((uintptr_t)a8 & 15) || ((uintptr_t)sa & 3) || ((uintptr_t)tiles & 15))
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "d8_gemm: operands not aligned (a8 and tiles 16 bytes, sa 4)");
    if (!d8_device_ok(ctx)) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "d8_gemm: needs an sm_89+ device and a build with sm_89+ code");
    if ((st = fp4rl_cuda_enter(ctx))) return st;
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    D8P p;
    d8_weight_params(p, w);
    p.a8 = a8;
    p.sa = sa;
    p.c = c;
    p.M = (int)M;
    p.ldc = (int)ldc;
    p.lda = FP4RL_FP8_SCALE_LD(M);
    /* FP4RL_D8_PERSIST=1 (read at every call) with a re-laid-out weight, M <= 64, on an sm_90+
     * device with sm_90+ code in the build: d8p_kernel; FP4RL_D8_PERSIST_CTAS (1..4, default 2)
     * sets its CTAs a multiprocessor (a tuning knob for the GPU measurements). Its bulk copies of
     * activation scales need a 16-byte aligned sa (else the other kernels). */
    const char *penv = getenv("FP4RL_D8_PERSIST");
    if (tiles && penv && strcmp(penv, "1") == 0 && M <= P_MAX_M && !((uintptr_t)sa & 15) && d8_arch_ok(ctx, 90)) {
        const char *cenv = getenv("FP4RL_D8_PERSIST_CTAS");
        const int ctas = cenv && atoi(cenv) >= 1 && atoi(cenv) <= 4 ? atoi(cenv) : 2;
        p.tiles = static_cast<const uint8_t *>(tiles);
        void *ws = NULL;
        cudaError_t e;
        if (U == 64) e = c_bf16 ? d8p_launch<64, uint16_t>(ctx, p, slices, ctas, &ws) : d8p_launch<64, float>(ctx, p, slices, ctas, &ws);
        else e = c_bf16 ? d8p_launch<32, uint16_t>(ctx, p, slices, ctas, &ws) : d8p_launch<32, float>(ctx, p, slices, ctas, &ws);
        if (e == cudaErrorMemoryAllocation && !ws) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "d8_gemm: split-K workspace (%s)", fp4rl_last_error());
        st = e != cudaSuccess ? fp4rl_cuda_fail(ctx, e, "d8_gemm (persistent): launch setup") : fp4rl_cuda_check_launch(ctx, "d8_gemm (persistent)");
        fp4rl_cuda_free_bytes(ctx, ws);
        return st;
    }
    const int rblocks = p.rblocks, mchunks = (int)((M + MCHUNK - 1) / MCHUNK);
    /* about two CTAs a multiprocessor (each keeps 3 x 8 KB of weights in flight); every slice
     * keeps at least 2 chunks so the ring has work to overlap */
    int want = slices;
    if (want <= 0) {
        want = (2 * cu->sm_count + rblocks * mchunks - 1) / (rblocks * mchunks);
        if (want > p.chunks / 2) want = p.chunks / 2;
        if (want > 32) want = 32;
    }
    if (want < 1) want = 1;
    if (want > p.chunks) want = p.chunks;
    p.chunks_per_slice = (p.chunks + want - 1) / want;
    p.slices = (p.chunks + p.chunks_per_slice - 1) / p.chunks_per_slice;
    p.ws = NULL;
    p.counters = cu->counters;
    void *ws = NULL;
    if (p.slices > 1) {
        st = fp4rl_cuda_split_counters(ctx, (size_t)rblocks * mchunks, &p.counters);
        if (!st) st = fp4rl_cuda_alloc_bytes(ctx, &ws, (size_t)p.slices * M * N * sizeof(float));
        if (st) return st;
        p.ws = static_cast<float *>(ws);
    }
    const dim3 grid((unsigned)(rblocks * p.slices), (unsigned)mchunks);
    /* FP4RL_D8_WGMMA=1 (read at every call): the wgmma kernel, on a compute capability 9.0 device
     * with sm_90a code in the build; else (and by default) the mma.sync one */
    const char *wenv = getenv("FP4RL_D8_WGMMA");
    const bool wg = wenv && strcmp(wenv, "1") == 0 && fp4rl_cuda_has_sm90a(ctx);
    cudaError_t e;
    if (U == 64) e = c_bf16 ? d8_launch<64, uint16_t>(p, grid, cu->stream, wg) : d8_launch<64, float>(p, grid, cu->stream, wg);
    else e = c_bf16 ? d8_launch<32, uint16_t>(p, grid, cu->stream, wg) : d8_launch<32, float>(p, grid, cu->stream, wg);
    st = e != cudaSuccess ? fp4rl_cuda_fail(ctx, e, "d8_gemm: shared memory attribute") : fp4rl_cuda_check_launch(ctx, "d8_gemm");
    fp4rl_cuda_free_bytes(ctx, ws); /* stream order keeps the block's next user after this kernel */
    return st;
}

} // namespace

fp4rl_status fp4rl_cuda_d8_gemm(fp4rl_context *ctx, const uint8_t *a8, const float *sa, int64_t M, const fp4rl_tensor *w, void *c,
                                int c_bf16, int64_t ldc, int slices)
{
    return d8_gemm(ctx, a8, sa, M, w, NULL, c, c_bf16, ldc, slices);
}

fp4rl_status fp4rl_cuda_d8_gemm_tiles(fp4rl_context *ctx, const uint8_t *a8, const float *sa, int64_t M, const fp4rl_tensor *w,
                                      const void *tiles, void *c, int c_bf16, int64_t ldc, int slices)
{
    if (!tiles) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "d8_gemm_tiles: NULL re-laid-out weight");
    return d8_gemm(ctx, a8, sa, M, w, tiles, c, c_bf16, ldc, slices);
}

size_t fp4rl_cuda_d8_relayout_bytes(const fp4rl_tensor *w)
{
    D8P p;
    d8_weight_params(p, w);
    return d8_relayout_bytes(p);
}

fp4rl_status fp4rl_cuda_d8_relayout(fp4rl_context *ctx, const fp4rl_tensor *w, void **out, size_t *bytes)
{
    if (!ctx || !w || !out || !w->data || !w->scales) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "d8_relayout: NULL context, weight or output");
    int U = 0;
    fp4rl_status st = d8_weight_check(w, "d8_relayout", &U);
    if (st) return st;
    if ((st = fp4rl_cuda_enter(ctx))) return st;
    D8P p;
    d8_weight_params(p, w);
    const size_t n = d8_relayout_bytes(p);
    void *d = NULL;
    if ((st = fp4rl_cuda_alloc_bytes(ctx, &d, n))) return st;
    const int64_t blocks = (int64_t)p.rblocks * p.chunks;
    const unsigned grid = (unsigned)min(blocks, (int64_t)1 << 20);
    if (U == 64) d8p_relayout_k<64><<<grid, ROWS, 0, fp4rl_cuda_of(ctx)->stream>>>(static_cast<uint8_t *>(d), p);
    else d8p_relayout_k<32><<<grid, ROWS, 0, fp4rl_cuda_of(ctx)->stream>>>(static_cast<uint8_t *>(d), p);
    if ((st = fp4rl_cuda_check_launch(ctx, "d8_relayout"))) {
        fp4rl_cuda_free_bytes(ctx, d);
        return st;
    }
    *out = d;
    if (bytes) *bytes = n;
    return FP4RL_OK;
}

fp4rl_status fp4rl_cuda_act_e4m3(fp4rl_context *ctx, uint8_t *out, float *scales, const float *x, int64_t N, int64_t K, int fmt,
                                 int truncation_free, int resq, unsigned long long *counts)
{
    if (!ctx || !out || !scales || !x) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "act_e4m3: NULL context, input or output pointer");
    if (fmt != FP4RL_DTYPE_HIF4 && fmt != FP4RL_DTYPE_MXFP4)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "act_e4m3: format %d is not HiF4 or MXFP4", fmt);
    if (resq != FP4RL_RESQ_OFF && resq != FP4RL_RESQ_DENSE && resq != FP4RL_RESQ_2_4)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "act_e4m3: ResQ mode %d (only off, dense, 2:4)", resq);
    if (N < 1 || K < 1 || N >= (1LL << 30) || K >= (1LL << 31))
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "act_e4m3: N = %lld, K = %lld out of range", (long long)N, (long long)K);
    if (((uintptr_t)out & 7) || ((uintptr_t)scales & 3) || ((uintptr_t)x & 3))
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "act_e4m3: misaligned pointers (out 8 bytes, x and scales 4)");
    if ((K % 8) == 0 && ((uintptr_t)x & 15)) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "act_e4m3: x must be 16-byte aligned");
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    const int BS = fmt == FP4RL_DTYPE_HIF4 ? 64 : 32;
    const int64_t rows = (resq == FP4RL_RESQ_OFF ? 1 : 2) * N, ld = FP4RL_FP8_SCALE_LD(rows), units = (K + BS - 1) / BS;
    if (ld > rows) { /* the layout's padding rows are zeros, as the pre-pass writes them */
        const cudaError_t e = cudaMemset2DAsync(scales + rows, (size_t)ld * 4, 0, (size_t)(ld - rows) * 4, (size_t)units, cu->stream);
        if (e != cudaSuccess) return fp4rl_cuda_fail(ctx, e, "act_e4m3: scale padding");
    }
    const int64_t threads = N * units * (BS / 8);
    const unsigned grid = (unsigned)((threads + 255) / 256);
    if (BS == 64) act_e4m3_k<64><<<grid, 256, 0, cu->stream>>>(out, scales, counts, x, N, K, truncation_free, resq, ld);
    else act_e4m3_k<32><<<grid, 256, 0, cu->stream>>>(out, scales, counts, x, N, K, truncation_free, resq, ld);
    return fp4rl_cuda_check_launch(ctx, "act_e4m3");
}
