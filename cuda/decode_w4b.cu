/*
 * decode_w4b.cu - the packed-weight GEMM with BF16 activations (decode_w4b.h has the contract).
 *
 * Roles: the weights are wgmma's register-sourced A (a warpgroup's m64 tile: warp w of the group
 * holds weight rows 16 w + g, + 8, lane = 4 g + t), the activations its shared-memory B (N = NB
 * activation rows, K-major, 128-byte swizzled as TMA would write it: 16-byte chunk c of row r of
 * a 64-k chunk at r * 128 + ((c ^ (r & 7)) << 4)), C's fragments [weight row, activation row].
 *
 * A k16 step's A fragment (the mma.sync m16n8k16 layout): a0 row g, k 2t, 2t + 1; a1 row g + 8;
 * a2, a3 the same at k + 8. So thread t needs byte t (two codes) of each 4-byte word of a row's
 * step piece: word 2s for a0 / a1, word 2s + 1 for a2 / a3 (s the step in the 64-k chunk).
 *
 * Dequantization of two codes into one BF16x2 word, in registers: the BF16 bits of the 8
 * magnitudes (HiF4: k; MXFP4: e2m1(k)) are split into a high-byte and a low-byte table of 8 bytes
 * each, looked up four codes at a time by byte permutes, interleaved into two words, the sign bits
 * (bit 3 of each code) merged in from a sign-mode permute; then one BF16x2 multiply by the scale
 * (HiF4: base / 4 times 2^inc of the codes' micro-block; MXFP4: 2^(e - 127)), exact because the
 * product has at most 6 significant bits (HiF4: 3 x 3; MXFP4: 2, down to BF16 subnormals). That is
 * wb_kernel, on the weight as stored. wp_kernel reads the weight re-laid out by fp4rl_cuda_w4b_pack
 * (format/w4b_layout.h: a thread's codes of a chunk in one 16-byte word, one LOP3 + one FMA or
 * multiply a register); same ring, MMAs and epilogue (wb_store), same bits.
 */
#include <cooperative_groups.h>
#include <stdlib.h>
#include <string.h>

#include "decode_w4b.h"
#include "format/formats.h"
#include "format/layout.h"
#include "format/w4b_layout.h"
#include "gemm_fp8.h" /* fp4rl_cuda_has_sm90a */
#include "mma_common.cuh"
#include "wgmma_common.cuh"

namespace {
using namespace fp4rl_cuda_mma;
namespace cg = cooperative_groups;

constexpr int KC = 64;      /* k a chunk (ring stage): one HiF4 unit, two MXFP4 units */
constexpr int THREADS = 256; /* two warpgroups */
enum { FP_HIF4, FP_MX, FP_NV }; /* wp_kernel's formats (the re-layouts of format/w4b_layout.h) */
/* Split-K's sum of the slices' FP32 partials, always in slice order from 0 (the same bits): by the
 * tile's last CTA (a counter), by wb_reduce (a second kernel over the device), or by the tile's
 * slices as one thread-block cluster, each adding a range of the outputs from every rank's shared
 * memory (no workspace, no second launch; at most 8 slices, NB <= 64; opt-in, FP4RL_W4B_REDUCE=2). */
enum { RED_LAST, RED_APART, RED_CLUSTER };
constexpr int RED_PAD = 4; /* the cluster sum's row stride ROWS + 4 floats: lanes t of a warp in distinct banks */
/* Whether the ring's shared memory holds the CTA's partials [NB][ROWS + RED_PAD]. */
template <class S, int NB>
__host__ __device__ constexpr bool red_fits() { return S::STAGES * S::BYTES >= NB * (S::TILES_ROWS + RED_PAD) * 4; }

struct WB {
    const uint16_t *x;
    const uint8_t *codes;
    const void *wscales;
    const float *bias;
    float *c;
    float *ws;
    unsigned *counters;
    int M, N, K, ldc;
    int64_t row_bytes, scale_cols;
    int tile; /* MXFP4: 0 (1D) or 32 (2D tiles) */
    int slices, chunks_per_slice, chunks;
    int reduce; /* split-K's sum: RED_LAST, RED_APART or RED_CLUSTER (wb_store) */
    int tiles;      /* the HiF4 re-layout (wp_kernel): 64-row tiles */
    uint32_t magic; /* wp_kernel: FP4RL_W4B_MAGIC, a parameter so that one LOP3 a register
                     * ORs it in (two immediates would take two) */
    float alpha;    /* the sums' factor: NVFP4 g 2^10 (w4b_layout.h), else 1 (exact either way) */
};

/* One ring stage: activations [NB][128 bytes] (swizzled, 1024-byte aligned: first), weight codes
 * [ROWS][32 bytes], weight scales [ROWS][8 bytes] (HiF4: the unit's word; MXFP4: the aligned word
 * holding the chunk's first scale byte and the next one). STAGES stages, STAGES - 2 chunks copied
 * ahead (see the loop): 8 for the small activation tiles, whose CTAs are bound by weight bytes in
 * flight (Little's law at ~3 TB/s wants ~20 KB a multiprocessor), 4 for NB = 128 (26 KB a stage). */
template <int MT, int NB>
struct Stage {
    static constexpr int ROWS = 2 * MT * 64, TILES_ROWS = ROWS;
    static constexpr int A = 0, W = A + NB * 128, WS = W + ROWS * 32; /* A = 0: XCopies' offsets */
    static constexpr int BYTES = (WS + ROWS * 8 + 1023) / 1024 * 1024;
    static constexpr int STAGES = NB <= 64 ? 8 : 4;
    static constexpr int SMEM = STAGES * BYTES + 1024; /* + the alignment of the dynamic window */
};

/* One ring stage of the re-laid-out kernel: activations as Stage, then the CTA's 2 MT tiles' codes
 * (2048 bytes each) and words (256 bytes each), both copied as 16-byte pieces. */
template <int MT, int NB>
struct PStage {
    static constexpr int TILES = 2 * MT, TILES_ROWS = TILES * 64;
    static constexpr int A = 0, W = A + NB * 128, WS = W + TILES * 2048; /* A = 0: XCopies' offsets */
    static constexpr int BYTES = (WS + TILES * 256 + 1023) / 1024 * 1024;
    static constexpr int STAGES = NB <= 64 ? 8 : 4;
    static constexpr int SMEM = STAGES * BYTES + 1024;
};

static_assert(Stage<1, 32>::STAGES == 8 && Stage<1, 128>::STAGES == 4 && PStage<1, 32>::STAGES == 8 && PStage<1, 128>::STAGES == 4,
              "ring stages: powers of two");

/* An output from its FP32 sum: times alpha, then + bias (two roundings, as the reference's epilogue). */
__device__ __forceinline__ float wb_out(float sum, float alpha, const float *bias, int64_t n)
{
    const float v = __fmul_rn(sum, alpha);
    return bias ? __fadd_rn(v, bias[n]) : v;
}

/* The device code below exists in the sm_90a pass only (the kernel's body is a trap elsewhere). */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The BF16 bits of the 8 magnitudes, high bytes and low bytes, k = 0..3 in the first word. */
constexpr uint32_t HIF4_HI0 = 0x40403F00u, HIF4_HI1 = 0x40404040u, HIF4_LO0 = 0x40008000u, HIF4_LO1 = 0xE0C0A080u; /* k */
constexpr uint32_t MX_HI0 = 0x3F3F3F00u, MX_HI1 = 0x40404040u, MX_LO0 = 0xC0800000u, MX_LO1 = 0xC0804000u;       /* e2m1(k) */

/* The two BF16x2 words of the four codes in the low 16 bits of y (nibble i = code i): r0 codes 0,
 * 1 (low half code 0), r1 codes 2, 3, unscaled. */
template <bool HIF4>
__device__ __forceinline__ void deq4(uint32_t y, uint32_t &r0, uint32_t &r1)
{
    const uint32_t sel = y & 0x7777u;
    const uint32_t hi = prmt_b32(HIF4 ? HIF4_HI0 : MX_HI0, HIF4 ? HIF4_HI1 : MX_HI1, sel);
    const uint32_t lo = prmt_b32(HIF4 ? HIF4_LO0 : MX_LO0, HIF4 ? HIF4_LO1 : MX_LO1, sel);
    /* sign of code 2b: bit 7 of byte b of y << 4; of code 2b + 1: bit 7 of byte b of y */
    const uint32_t y4 = y << 4;
    r0 = prmt_b32(lo, hi, 0x5140u) | (prmt_b32(y4, y, 0xC080u) & 0x80008000u);
    r1 = prmt_b32(lo, hi, 0x7362u) | (prmt_b32(y4, y, 0xD090u) & 0x80008000u);
}
__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

/* HiF4: a unit word's BF16x2 scale base / 4 (NaN for the NaN word) and its increments, the 2-bit
 * field j (= 2 s + h: step s, half h of the A fragment) e8[j] + e16[2 j + th] for this thread's
 * micro-blocks (th = t >> 1: k 2t lies in micro-block t >> 1 of each 8-k group). */
__device__ __forceinline__ void hif4_scales(uint32_t word, uint32_t th, uint32_t &base2, uint32_t &inc2)
{
    static_assert(FP4RL_E6M2_BIAS == 48 && FP4RL_HIF4_BASE_MASK == 0xFFu && FP4RL_HIF4_E8_SHIFT == 8 && FP4RL_HIF4_E16_SHIFT == 16,
                  "the HiF4 word layout");
    const uint32_t s = word & 0xFFu;
    /* base / 4 = (1 + m/4) 2^(e - 50) for s = e << 2 | m: BF16 exponent field e + 77 */
    const uint32_t b = s == FP4RL_HIF4_NAN_WORD ? 0x7FC0u : (s << 5) + (77u << 7);
    base2 = b | (b << 16);
    uint32_t x = (word >> 8) & 0xFFu; /* e8[j] to bit 2 j */
    x = (x | (x << 4)) & 0x0F0Fu;
    x = (x | (x << 2)) & 0x3333u;
    x = (x | (x << 1)) & 0x5555u;
    inc2 = s == FP4RL_HIF4_NAN_WORD ? 0u : x + ((word >> (16 + th)) & 0x5555u);
}
/* MXFP4: the BF16x2 scale 2^(e - 127) of an E8M0 byte (2^-127 is a BF16 subnormal; 255: NaN). */
__device__ __forceinline__ uint32_t mx_scale2(uint32_t e)
{
    const uint32_t b = e == 0xFFu ? 0x7FC0u : e == 0u ? 0x0040u : e << 7;
    return b | (b << 16);
}

using namespace fp4rl_cuda_wg;

/* d += A B, one m64n(NB)k16 BF16 step: A from registers (this warp's 16 weight rows x 16 k), B
 * (NB activation rows x 16 k, K-major, 128-byte swizzle) through the descriptor db. */
template <int NB>
__device__ __forceinline__ void wb_mma(float (&d)[NB / 2], const uint32_t (&a)[4], uint64_t db);
template <>
__device__ __forceinline__ void wb_mma<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wb_mma<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wb_mma<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* The activation copies of one CTA's chunks: NB rows x 8 pieces of 16 bytes a 64-k chunk, into
 * the stage's 128-byte swizzled tile (zero rows past M). The pointers are computed once; each
 * issue advances them one chunk. */
template <int NB>
struct XCopies {
    static constexpr int NA = NB * 8 / THREADS > 0 ? NB * 8 / THREADS : 1; /* copies a thread */
    static constexpr bool ALL = NB * 8 >= THREADS;                          /* every thread copies */
    const uint16_t *ap[NA];
    uint32_t adst[NA];
    bool alive[NA];
    bool mine;

    __device__ __forceinline__ XCopies(const WB &p, int cbeg, int m0, int tid)
    {
        mine = ALL || tid < NB * 8;
#pragma unroll
        for (int i = 0; i < NA; i++) {
            const int q = tid + i * THREADS, r = (q >> 3) % NB, ch = q & 7, m = m0 + r;
            alive[i] = m < p.M;
            ap[i] = p.x + (alive[i] ? (int64_t)m * p.K : 0) + (int64_t)cbeg * KC + ch * 8;
            adst[i] = r * 128 + ((ch ^ (r & 7)) << 4);
        }
    }
    __device__ __forceinline__ void issue(uint32_t st)
    {
        if (!mine) return;
#pragma unroll
        for (int i = 0; i < NA; i++) {
            cp_async16_s(st + adst[i], ap[i], alive[i]);
            ap[i] += KC;
        }
    }
};

/* The copies of one CTA's chunks (all threads). Everything that does not change from chunk to chunk
 * (global pointers, shared destinations, the row bounds) is computed once here, so a chunk's issue
 * is the copies and pointer increments: at decode sizes the loop's instruction count bounds the
 * kernel, and 64-bit address arithmetic per chunk was a fifth of it. Zero-filled past N and M; one
 * commit group per call always. */
template <int MT, int NB, bool HIF4>
struct WbCopies {
    using S = Stage<MT, NB>;
    static constexpr int NC = S::ROWS * 2 / THREADS;  /* code copies of 16 bytes a thread */
    static constexpr bool SC = S::ROWS <= THREADS;    /* scales: threads 0 .. ROWS - 1, one row each */
    static_assert(NC >= 1 && SC, "the tile's copies");
    XCopies<NB> xc;
    const uint8_t *cp[NC];
    const uint8_t *sp;
    uint32_t cdst[NC];
    bool clive[NC], slive;
    int b3; /* MXFP4: the row's first scale byte of chunk cbeg, its offset in the aligned word */

    __device__ __forceinline__ WbCopies(const WB &p, int cbeg, int n0, int m0, int tid) : xc(p, cbeg, m0, tid)
    {
#pragma unroll
        for (int i = 0; i < NC; i++) { /* codes: ROWS rows x 2 chunks of 16 bytes */
            const int q = tid + i * THREADS, r = q >> 1, h = q & 1, n = n0 + r;
            clive[i] = n < p.N;
            cp[i] = p.codes + (clive[i] ? (int64_t)n * p.row_bytes : 0) + (int64_t)cbeg * (KC / 2) + h * 16;
            cdst[i] = S::W + r * 32 + h * 16;
        }
        const int n = n0 + tid;
        slive = tid < S::ROWS && n < p.N;
        const int64_t nn = slive ? n : 0;
        if constexpr (HIF4) {
            sp = static_cast<const uint8_t *>(p.wscales) + (nn * p.scale_cols + cbeg) * 4;
            b3 = 0;
        } else {
            const int64_t b = (p.tile ? (nn >> 5) : nn) * p.scale_cols + 2 * (int64_t)cbeg;
            b3 = (int)(b & 3);
            sp = static_cast<const uint8_t *>(p.wscales) + (b & ~(int64_t)3);
        }
    }

    /* Chunk c (c = cbeg, cbeg + 1, ... in order: each call advances the pointers) into the stage at
     * shared address st. */
    __device__ __forceinline__ void issue(int c, int cend, uint32_t st, int tid)
    {
        if (c < cend) {
            xc.issue(st);
#pragma unroll
            for (int i = 0; i < NC; i++) {
                cp_async16_s(st + cdst[i], cp[i], clive[i]);
                cp[i] += KC / 2;
            }
            if (tid < S::ROWS) {
                const uint32_t sd = st + S::WS + tid * 8;
                if constexpr (HIF4) {
                    cp_async4_s(sd, sp, slive);
                    sp += 4;
                } else { /* the two scale bytes at offset b3: the second word only when they straddle */
                    cp_async4_s(sd, sp, slive);
                    cp_async4_s(sd + 4, sp + 4, slive && b3 == 3);
                    sp += (b3 + 2) & 4; /* the aligned word advances when the bytes pass it */
                    b3 = (b3 + 2) & 3;
                }
            }
        }
        cp_async_commit();
    }
};

/* The ring stage of chunk c >= 0 (STAGES a power of two: a mask, not a signed modulo). */
__device__ __forceinline__ int ring(int c, int stages) { return (int)((unsigned)c & (unsigned)(stages - 1)); }

/* ---- the HiF4 re-layout (format/w4b_layout.h has the layout and the arithmetic) ---- */
/* a * b + c and (a & b) | c as single instructions (PTX, so the compiler keeps their form: it would
 * otherwise shift before masking, or OR an immediate in a second LOP3). */
__device__ __forceinline__ uint32_t mad_u32(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d;
    asm("mad.lo.u32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ uint32_t bfma2(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
/* Both halves the low (high) half of a: the compiler folds these into the FMA's operand selects. */
__device__ __forceinline__ uint32_t half_lo2(uint32_t a)
{
    uint32_t d;
    asm("{.reg .b16 l, h;\nmov.b32 {l, h}, %1;\nmov.b32 %0, {l, l};}\n" : "=r"(d) : "r"(a));
    return d;
}
__device__ __forceinline__ uint32_t half_hi2(uint32_t a)
{
    uint32_t d;
    asm("{.reg .b16 l, h;\nmov.b32 {l, h}, %1;\nmov.b32 %0, {h, h};}\n" : "=r"(d) : "r"(a));
    return d;
}

/* The copies of the re-laid-out kernel's chunks: a tile's chunks are consecutive in global memory
 * (2048 code bytes, 256 word bytes each), so a piece's pointer advances by a constant. */
template <int MT, int NB>
struct PCopies {
    using S = PStage<MT, NB>;
    XCopies<NB> xc;
    const uint8_t *cp[MT];
    const uint8_t *sp;
    uint32_t cdst[MT], sdst;
    bool clive[MT], slive, sown;

    __device__ __forceinline__ PCopies(const WB &p, int cbeg, int rb, int m0, int tid) : xc(p, cbeg, m0, tid)
    {
        const uint8_t *codes = p.codes;
        const uint8_t *words = static_cast<const uint8_t *>(p.wscales);
#pragma unroll
        for (int i = 0; i < MT; i++) { /* 2 MT tiles x 128 pieces */
            const int q = tid + i * THREADS, tile = q >> 7, off = q & 127, tg = rb * S::TILES + tile;
            clive[i] = tg < p.tiles;
            cp[i] = codes + (clive[i] ? ((int64_t)tg * p.chunks + cbeg) * 2048 : 0) + off * 16;
            cdst[i] = S::W + tile * 2048 + off * 16;
        }
        const int tile = tid >> 4, off = tid & 15, tg = rb * S::TILES + tile; /* 2 MT tiles x 16 pieces */
        sown = tid < S::TILES * 16;
        slive = sown && tg < p.tiles;
        sp = words + (slive ? ((int64_t)tg * p.chunks + cbeg) * 256 : 0) + off * 16;
        sdst = S::WS + tile * 256 + off * 16;
    }
    __device__ __forceinline__ void issue(int c, int cend, uint32_t st)
    {
        if (c < cend) {
            xc.issue(st);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                cp_async16_s(st + cdst[i], cp[i], clive[i]);
                cp[i] += 2048;
            }
            if (sown) {
                cp_async16_s(st + sdst, sp, slive);
                sp += 256;
            }
        }
        cp_async_commit();
    }
};

/* The end of both kernels, after their last chunk: acc[mt][4 j + e] is C[m0 + 8 j + 2 t + (e & 1)][n0 + rl0 + 64 mt +
 * 8 (e >> 1)]. One slice: C (+ bias) directly; split-K: the sum by p.reduce (RED_*). red: the ring's
 * shared memory (SMEM_OK: it holds the CTA's partials, the cluster sum's condition). */
template <int MT, int NB, bool SMEM_OK>
__device__ __forceinline__ void wb_store(const WB &p, float (&acc)[MT][NB / 2], int n0, int rl0, int m0, int t, int tid, int rb, int slice,
                                         float *red)
{
    using S = Stage<MT, NB>;
    constexpr int NR = NB / 2;
    __shared__ int last;
    wg_wait0(); /* the last MMAs retired, their accumulators readable; no copy in flight */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) wg_fence_regs(acc[mt]);
    cp_async_wait<0>();
    if constexpr (SMEM_OK) {
        if (p.slices > 1 && p.reduce == RED_CLUSTER) { /* launched as clusters of p.slices CTAs, rank = slice */
            constexpr int LD = S::ROWS + RED_PAD;
            __syncthreads(); /* every warp is done with the ring */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int i = 0; i < NR; i++) red[(8 * (i >> 2) + 2 * t + (i & 1)) * LD + rl0 + 64 * mt + 8 * ((i & 3) >> 1)] = acc[mt][i];
            cg::cluster_group cl = cg::this_cluster();
            cl.sync();
            const float *parts[8];
#pragma unroll
            for (int q = 0; q < 8; q++) parts[q] = q < p.slices ? cl.map_shared_rank(red, q) : red;
            const int E = min(NB, p.M - m0) * S::ROWS, e0 = E * slice / p.slices, e1 = E * (slice + 1) / p.slices;
            for (int e = e0 + tid; e < e1; e += THREADS) {
                const int m = e / S::ROWS, nl = e - m * S::ROWS, n = n0 + nl;
                if (n >= p.N) continue;
                float sum = 0.0f;
#pragma unroll
                for (int q = 0; q < 8; q++)
                    if (q < p.slices) sum = __fadd_rn(sum, parts[q][m * LD + nl]);
                p.c[(int64_t)(m0 + m) * p.ldc + n] = wb_out(sum, p.alpha, p.bias, n);
            }
            cl.sync(); /* no CTA leaves while another still reads its shared memory */
            return;
        }
    }
    (void)red;
    if (p.slices == 1) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < NR; i++) {
                const int n = n0 + rl0 + 64 * mt + 8 * ((i & 3) >> 1), m = m0 + 8 * (i >> 2) + 2 * t + (i & 1);
                if (m < p.M && n < p.N) p.c[(int64_t)m * p.ldc + n] = wb_out(acc[mt][i], p.alpha, p.bias, n);
            }
        return;
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const int n = n0 + rl0 + 64 * mt + 8 * ((i & 3) >> 1), m = m0 + 8 * (i >> 2) + 2 * t + (i & 1);
            if (m < p.M && n < p.N) p.ws[((int64_t)slice * p.M + m) * p.N + n] = acc[mt][i];
        }
    if (p.reduce == RED_APART) return; /* wb_reduce, launched next, sums them */
    __threadfence();
    __syncthreads();
    const int ctr = rb * gridDim.y + blockIdx.y;
    if (tid == 0) {
        const unsigned prev = atomicAdd(&p.counters[ctr], 1u);
        last = prev == (unsigned)p.slices - 1;
        if (last) p.counters[ctr] = 0; /* zero again for the next launch */
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* 4 outputs a thread at a time (n fastest: coalesced), their partials 4 slices at a time: 16
     * loads in flight before the sums, which stay in slice order (a loop of dependent load + add
     * was latency-bound: a whole tile's outputs times the slices, one L2 round trip each) */
    const int total = S::ROWS * min(NB, p.M - m0);
    for (int base = 0; base < total; base += 4 * THREADS) {
        float sum[4];
        int64_t off[4];
        bool ok[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int idx = base + u * THREADS + tid, m = m0 + idx / S::ROWS, n = n0 + idx % S::ROWS;
            ok[u] = idx < total && n < p.N;
            off[u] = ok[u] ? (int64_t)m * p.N + n : 0;
            sum[u] = 0.0f;
        }
        for (int s0 = 0; s0 < p.slices; s0 += 4) {
            float v[4][4];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int q = 0; q < 4; q++) v[u][q] = ok[u] && s0 + q < p.slices ? __ldcg(&p.ws[(int64_t)(s0 + q) * p.M * p.N + off[u]]) : 0.0f;
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int q = 0; q < 4; q++)
                    if (s0 + q < p.slices) sum[u] = __fadd_rn(sum[u], v[u][q]);
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (ok[u]) {
                const int64_t m = off[u] / p.N, n = off[u] - m * p.N;
                p.c[m * p.ldc + n] = wb_out(sum[u], p.alpha, p.bias, n);
            }
    }
}

#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

template <int MT, int NB, bool HIF4>
__global__ void __launch_bounds__(THREADS, 1) wb_kernel(WB p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = Stage<MT, NB>;
    constexpr int STAGES = S::STAGES;
    constexpr int NR = NB / 2; /* accumulator registers of one m64 tile */
    extern __shared__ uint8_t wb_smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(wb_smem_raw);
    const uint32_t sbase = (raw + 1023u) & ~1023u;
    const uint8_t *smem = wb_smem_raw + (sbase - raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, g = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x / p.slices, slice = blockIdx.x - rb * p.slices;
    const int n0 = rb * S::ROWS, m0 = blockIdx.y * NB;
    const int cbeg = slice * p.chunks_per_slice, cend = min(p.chunks, cbeg + p.chunks_per_slice);
    /* this thread's weight rows (CTA-local): tile mt, half hh at rl0 + 64 mt + 8 hh */
    const int rl0 = wg * MT * 64 + (warp & 3) * 16 + g;
    const uint32_t selg = (uint32_t)t | ((uint32_t)(t + 4) << 4); /* byte t of two words */
    const uint32_t th = (uint32_t)t >> 1;
    int rb3[MT][2] = {}; /* MXFP4: the row's first scale byte's offset in its aligned word */
    if constexpr (!HIF4) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int n = n0 + rl0 + 64 * mt + 8 * hh;
                const int64_t nn = n < p.N ? n : 0;
                rb3[mt][hh] = (int)(((p.tile ? (nn >> 5) : nn) * p.scale_cols) & 3);
            }
    }

    float acc[MT][NR];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < NR; i++) acc[mt][i] = 0.0f;

    WbCopies<MT, NB, HIF4> copies(p, cbeg, n0, m0, tid);
#pragma unroll
    for (int i = 0; i < STAGES - 2; i++) copies.issue(cbeg + i, cend, sbase + (uint32_t)(ring(cbeg + i, STAGES) * S::BYTES), tid);

    for (int c = cbeg; c < cend; c++) {
        /* chunk c landed (this thread's copies), for every thread and for wgmma's async reads */
        cp_async_wait<STAGES - 3>();
        wg_fence_proxy_async();
        __syncthreads();
        /* chunk c + STAGES - 2 into the stage of chunk c - 2: every thread passed chunk c - 1's
         * step 0 (barrier above), whose wait_group 1 retired all of chunk c - 2's wgmmas */
        copies.issue(c + STAGES - 2, cend, sbase + (uint32_t)(ring(c + STAGES - 2, STAGES) * S::BYTES), tid);
        const int so = ring(c, STAGES) * S::BYTES;
        const uint8_t *st = smem + so;
        /* the chunk's scales of this thread's rows */
        uint32_t sc[MT][2][2]; /* HiF4: base2, inc2; MXFP4: the two units' BF16x2 scales */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int rl = rl0 + 64 * mt + 8 * hh;
                if constexpr (HIF4) {
                    hif4_scales(*reinterpret_cast<const uint32_t *>(st + S::WS + rl * 8), th, sc[mt][hh][0], sc[mt][hh][1]);
                } else {
                    const uint2 v = *reinterpret_cast<const uint2 *>(st + S::WS + rl * 8);
                    const uint32_t o = (uint32_t)((rb3[mt][hh] + 2 * c) & 3);
                    const uint32_t e2 = prmt_b32(v.x, v.y, o | ((o + 1) << 4));
                    sc[mt][hh][0] = mx_scale2(e2 & 0xFFu);
                    sc[mt][hh][1] = mx_scale2((e2 >> 8) & 0xFFu);
                }
            }
#pragma unroll
        for (int s = 0; s < KC / 16; s++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int rl = rl0 + 64 * mt + 8 * hh;
                    const uint2 cw = *reinterpret_cast<const uint2 *>(st + S::W + rl * 32 + 8 * s);
                    const uint32_t y = prmt_b32(cw.x, cw.y, selg); /* byte 0: k 16s + 2t, +1; byte 1: k + 8 */
                    uint32_t v0, v1;
                    deq4<HIF4>(y, v0, v1);
                    uint32_t s0, s1;
                    if constexpr (HIF4) {
                        s0 = sc[mt][hh][0] + ((sc[mt][hh][1] >> (4 * s)) & 3u) * 0x00800080u;
                        s1 = sc[mt][hh][0] + ((sc[mt][hh][1] >> (4 * s + 2)) & 3u) * 0x00800080u;
                    } else {
                        s0 = s1 = sc[mt][hh][s >> 1];
                    }
                    af[mt][hh] = bmul2(v0, s0);
                    af[mt][2 + hh] = bmul2(v1, s1);
                }
            const uint64_t db = wg_desc_bits(sbase + (uint32_t)so + S::A + 32u * s, 16, 1024, 1);
            wg_fence();
#pragma unroll
            for (int mt = 0; mt < MT; mt++) wb_mma<NB>(acc[mt], af[mt], db);
            wg_commit();
            wg_wait1(); /* the step before this one retired: its A registers and stage reads are free */
        }
    }
    wb_store<MT, NB, red_fits<S, NB>()>(p, acc, n0, rl0, m0, t, tid, rb, slice, reinterpret_cast<float *>(wb_smem_raw + (sbase - raw)));
#else
    (void)p;
    __trap(); /* launched only where fp4rl_cuda_has_sm90a says this build has the kernel */
#endif
}

/* The re-laid-out kernel (fp4rl_cuda_w4b_pack; F: FP_HIF4, FP_MX, FP_NV): wb_kernel's ring, MMAs and
 * epilogue; a chunk's weights are one 16-byte load a tile, then a register is one LOP3 + one FMA
 * (HiF4) or two rotations, two LOP3 and a multiply (MXFP4, NVFP4) (format/w4b_layout.h). */
template <int MT, int NB, int F>
__global__ void __launch_bounds__(THREADS, 1) wp_kernel(WB p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = PStage<MT, NB>;
    constexpr int STAGES = S::STAGES;
    constexpr int NR = NB / 2;
    extern __shared__ uint8_t wp_smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(wp_smem_raw);
    const uint32_t sbase = (raw + 1023u) & ~1023u;
    const uint8_t *smem = wp_smem_raw + (sbase - raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wl = warp & 3, g = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x / p.slices, slice = blockIdx.x - rb * p.slices;
    const int n0 = rb * S::TILES * 64, m0 = blockIdx.y * NB;
    const int cbeg = slice * p.chunks_per_slice, cend = min(p.chunks, cbeg + p.chunks_per_slice);
    const int rl0 = wg * MT * 64 + wl * 16 + g;
    const fp4rl_w4b_th thc = fp4rl_w4b_th_of(t >> 1); /* where this thread's micro-block bits sit in a word */
    const uint32_t neg136 = FP4RL_W4B_NEG136;

    float acc[MT][NR];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < NR; i++) acc[mt][i] = 0.0f;

    PCopies<MT, NB> copies(p, cbeg, rb, m0, tid);
#pragma unroll
    for (int i = 0; i < STAGES - 2; i++) copies.issue(cbeg + i, cend, sbase + (uint32_t)(ring(cbeg + i, STAGES) * S::BYTES));

    for (int c = cbeg; c < cend; c++) {
        cp_async_wait<STAGES - 3>(); /* the ring as wb_kernel's */
        wg_fence_proxy_async();
        __syncthreads();
        copies.issue(c + STAGES - 2, cend, sbase + (uint32_t)(ring(c + STAGES - 2, STAGES) * S::BYTES));
        const int so = ring(c, STAGES) * S::BYTES;
        const uint8_t *st = smem + so;
        uint4 cw[MT];
        uint32_t b2[MT][2], c2[MT][2], z[MT][2]; /* MXFP4: b2 the two units' multipliers; NVFP4: b2 blocks 0 | 2, c2 1 | 3 */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int tile = wg * MT + mt;
            cw[mt] = *reinterpret_cast<const uint4 *>(st + S::W + tile * 2048 + (wl * 32 + lane) * 16);
            const uint2 sw = *reinterpret_cast<const uint2 *>(st + S::WS + tile * 256 + (wl * 8 + g) * 8);
            if constexpr (F == FP_MX) {
                b2[mt][0] = sw.x;
                b2[mt][1] = sw.y;
                continue;
            }
            if constexpr (F == FP_NV) {
                b2[mt][0] = fp4rl_w4b_nv_mult2(sw.x, 0);
                c2[mt][0] = fp4rl_w4b_nv_mult2(sw.x, 1);
                b2[mt][1] = fp4rl_w4b_nv_mult2(sw.y, 0);
                c2[mt][1] = fp4rl_w4b_nv_mult2(sw.y, 1);
                continue;
            }
            b2[mt][0] = fp4rl_w4b_base2(sw.x);
            b2[mt][1] = fp4rl_w4b_base2(sw.y);
            z[mt][0] = fp4rl_w4b_incs(sw.x, thc);
            z[mt][1] = fp4rl_w4b_incs(sw.y, thc);
            /* -136 base / 4: times 2^inc below by the same exponent add as the scale (normal, or NaN with z = 0) */
            c2[mt][0] = bmul2(b2[mt][0], neg136);
            c2[mt][1] = bmul2(b2[mt][1], neg136);
        }
        const uint64_t db0 = wg_desc_bits(sbase + (uint32_t)so + S::A, 16, 1024, 1); /* + 2 a step: 32 bytes */
#pragma unroll
        for (int s = 0; s < KC / 16; s++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const uint32_t y = s == 0 ? cw[mt].x : s == 1 ? cw[mt].y : s == 2 ? cw[mt].z : cw[mt].w;
#pragma unroll
                for (int hh = 0; hh < 2; hh++) { /* a[hh]: the step's first 8 k, a[2 + hh]: its second */
                    if constexpr (F != FP_HIF4) { /* e2m1 2^-126 (two rotations, two LOP3) times the unit's (block's) multiplier */
                        const uint32_t mw = F == FP_MX || !(s & 1) ? b2[mt][hh] : c2[mt][hh];
                        const uint32_t m = s < 2 ? half_lo2(mw) : half_hi2(mw);
                        af[mt][hh] = bmul2(and_or(fp4rl_w4b_mx_sign_src(y, hh), 0x80008000u, fp4rl_w4b_mx_mag(y, hh)), m);
                        af[mt][2 + hh] = bmul2(and_or(fp4rl_w4b_mx_sign_src(y, 2 + hh), 0x80008000u, fp4rl_w4b_mx_mag(y, 2 + hh)), m);
                        continue;
                    }
                    /* the increments of step s to the exponent fields: one LOP3, then an IMAD each */
                    const uint32_t zm = z[mt][hh] & fp4rl_w4b_step_mask(s);
                    const uint32_t sc = mad_u32(zm, fp4rl_w4b_step_mul(s), b2[mt][hh]), cc = mad_u32(zm, fp4rl_w4b_step_mul(s), c2[mt][hh]);
                    const uint32_t x0 = and_or(y >> (4 * hh), 0x000F000Fu, p.magic);
                    const uint32_t x1 = and_or(y >> (4 * (2 + hh)), 0x000F000Fu, p.magic);
                    af[mt][hh] = bfma2(x0, half_lo2(sc), half_lo2(cc));
                    af[mt][2 + hh] = bfma2(x1, half_hi2(sc), half_hi2(cc));
                }
            }
            const uint64_t db = db0 + 2u * (uint32_t)s;
            wg_fence();
#pragma unroll
            for (int mt = 0; mt < MT; mt++) wb_mma<NB>(acc[mt], af[mt], db);
            wg_commit();
            wg_wait1();
        }
    }
    wb_store<MT, NB, red_fits<S, NB>()>(p, acc, n0, rl0, m0, t, tid, rb, slice, reinterpret_cast<float *>(wp_smem_raw + (sbase - raw)));
#else
    (void)p;
    __trap(); /* launched only where fp4rl_cuda_has_sm90a says this build has the kernel */
#endif
}

/* The split-K sum where the partials are many (wb_store with RED_APART): one thread an output,
 * over every multiprocessor, the slices added in slice order (wb_store's order: the same bits).
 * The tile's last CTA alone took ~25 us for 8 slices of 256 x 64 outputs (2048 x 2048 at M = 64,
 * session 21, H100): one multiprocessor's loads, against ~1 us here plus a launch. */
__global__ void wb_reduce(const float *ws, int slices, int64_t MN, int N, float *c, int ldc, float alpha, const float *bias)
{
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= MN) return;
    float sum = 0.0f;
    int s = 0;
    for (; s + 4 <= slices; s += 4) { /* four loads in flight, then the adds in order */
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; q++) v[q] = __ldcg(&ws[(int64_t)(s + q) * MN + i]);
#pragma unroll
        for (int q = 0; q < 4; q++) sum = __fadd_rn(sum, v[q]);
    }
    for (; s < slices; s++) sum = __fadd_rn(sum, __ldcg(&ws[(int64_t)s * MN + i]));
    const int64_t m = i / N, n = i - m * N;
    c[m * ldc + n] = wb_out(sum, alpha, bias, n);
}

/* The kernel's shared-memory attribute (set once per instantiation: *cached) and its CTAs a
 * multiprocessor (*occ). */
template <class Kern>
cudaError_t k_prepare(Kern kern, int smem, int *cached, int *occ)
{
    if (!*cached) { /* every device of a process gets the same value */
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        int n = 0;
        if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, THREADS, smem);
        if (e != cudaSuccess) return e;
        *cached = n < 1 ? 1 : n;
    }
    *occ = *cached;
    return cudaSuccess;
}
/* The launch: split-K's slices of a tile as one thread-block cluster where they sum in shared memory. */
template <class Kern>
cudaError_t k_launch(Kern kern, const WB &p, dim3 grid, int smem, cudaStream_t s)
{
    if (p.slices == 1 || p.reduce != RED_CLUSTER) return kern<<<grid, THREADS, smem, s>>>(p), cudaSuccess;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)p.slices; /* grid.x = row blocks x slices: a cluster is one tile's slices */
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, p);
}
/* k_prepare (grid 0: *occ, and *red_ok whether the ring holds the cluster sum's partials) or the
 * launch, for the tile (MT, NB) and the layout L: 0 HiF4 as stored, 1 MXFP4 as stored (wb_kernel),
 * 2 HiF4, 3 MXFP4, 4 NVFP4 re-laid out (wp_kernel). */
template <int MT, int NB, int L>
cudaError_t k_run(const WB &p, dim3 grid, cudaStream_t s, int *occ, int *red_ok)
{
    static int cached = 0; /* per instantiation */
    if constexpr (L >= 2) {
        constexpr int F = L == 2 ? FP_HIF4 : L == 3 ? FP_MX : FP_NV;
        using S = PStage<MT, NB>;
        if (grid.x) return k_launch(wp_kernel<MT, NB, F>, p, grid, S::SMEM, s);
        *red_ok = red_fits<S, NB>();
        return k_prepare(wp_kernel<MT, NB, F>, S::SMEM, &cached, occ);
    } else {
        using S = Stage<MT, NB>;
        if (grid.x) return k_launch(wb_kernel<MT, NB, L == 0>, p, grid, S::SMEM, s);
        *red_ok = red_fits<S, NB>();
        return k_prepare(wb_kernel<MT, NB, L == 0>, S::SMEM, &cached, occ);
    }
}
template <int MT, int L>
cudaError_t k_dispatch_nb(const WB &p, int nb, dim3 grid, cudaStream_t s, int *occ, int *red_ok)
{
    if (nb == 32) return k_run<MT, 32, L>(p, grid, s, occ, red_ok);
    if (nb == 64) return k_run<MT, 64, L>(p, grid, s, occ, red_ok);
    return k_run<MT, 128, L>(p, grid, s, occ, red_ok);
}
template <int MT>
cudaError_t k_dispatch_l(const WB &p, int layout, int nb, dim3 grid, cudaStream_t s, int *occ, int *red_ok)
{
    if (layout == 4) return k_dispatch_nb<MT, 4>(p, nb, grid, s, occ, red_ok);
    if (layout == 3) return k_dispatch_nb<MT, 3>(p, nb, grid, s, occ, red_ok);
    if (layout == 2) return k_dispatch_nb<MT, 2>(p, nb, grid, s, occ, red_ok);
    return layout ? k_dispatch_nb<MT, 1>(p, nb, grid, s, occ, red_ok) : k_dispatch_nb<MT, 0>(p, nb, grid, s, occ, red_ok);
}
cudaError_t wb_dispatch(const WB &p, int mt, int nb, int layout, dim3 grid, cudaStream_t s, int *occ, int *red_ok)
{
    return mt == 2 ? k_dispatch_l<2>(p, layout, nb, grid, s, occ, red_ok) : k_dispatch_l<1>(p, layout, nb, grid, s, occ, red_ok);
}

/* ---- the re-layout (fp4rl_cuda_w4b_pack, format/w4b_layout.h), one thread an output word ---- */
__global__ void wp_pack_codes(const uint8_t *codes, int64_t row_bytes, int64_t N, int64_t chunks, int hif4, int64_t total, uint32_t *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = fp4rl_w4b_pack_codes(codes, row_bytes, N, chunks, i, hif4);
}
__global__ void wp_pack_words(const uint32_t *words, int64_t scale_cols, int64_t N, int64_t chunks, int64_t total, uint32_t *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = fp4rl_w4b_pack_word(words, scale_cols, N, chunks, i);
}
__global__ void wp_pack_words_mx(const uint8_t *scales, int tile, int64_t scale_cols, int64_t N, int64_t chunks, int64_t total, uint32_t *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = fp4rl_w4b_pack_mx_word(scales, tile, scale_cols, N, chunks, i);
}
__global__ void wp_pack_nv_codes(const uint8_t *codes, int64_t row_bytes, const uint8_t *scales, int tile, int64_t scale_cols, int64_t N,
                                 int64_t chunks, int64_t total, uint32_t *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = fp4rl_w4b_pack_nv_codes(codes, row_bytes, scales, tile, scale_cols, N, chunks, i);
}
__global__ void wp_pack_nv_words(const uint8_t *scales, int tile, int64_t scale_cols, int64_t N, int64_t chunks, int64_t total, uint32_t *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = fp4rl_w4b_pack_nv_word(scales, tile, scale_cols, N, chunks, i);
}
/* *bad = 1 where a scale code exceeds FP4RL_W4B_MX_MAX_SCALE (its multiplier is no BF16). */
__global__ void wp_mx_scales_bad(const uint8_t *scales, int64_t n, unsigned *bad)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        if (scales[i] > FP4RL_W4B_MX_MAX_SCALE) *bad = 1u;
}

/* A weight the kernels or the re-layout take (NVFP4: the re-layout only, wb_layout_ok below). */
int wb_weight_ok(const fp4rl_tensor *w)
{
    if (!w || w->ndim != 2 || !w->data || !w->scales) return 0;
    if (w->layout != 0 && w->layout != FP4RL_LAYOUT_W4B) return 0;
    if (w->dtype != FP4RL_DTYPE_HIF4 && !(w->dtype == FP4RL_DTYPE_MXFP4 && (w->q.tile == 0 || w->q.tile == 32)) &&
        !(w->dtype == FP4RL_DTYPE_NVFP4 && (w->q.tile == 0 || w->q.tile == 16)))
        return 0;
    const int64_t N = w->q.rows, K = w->q.cols;
    if (N < 1 || K < KC || K % KC || N >= (1LL << 31) || K >= (1LL << 31)) return 0;
    return !((uintptr_t)w->data & 15) && !((uintptr_t)w->scales & 3) && !(w->q.row_bytes & 15);
}

/* Whether a weight wb_weight_ok takes can be read as it is (NVFP4 only re-laid out). */
int wb_layout_ok(const fp4rl_tensor *w) { return w->dtype != FP4RL_DTYPE_NVFP4 || w->layout == FP4RL_LAYOUT_W4B; }

} // namespace

int fp4rl_cuda_w4b_ok(fp4rl_context *ctx, const fp4rl_tensor *w)
{
    return ctx && wb_weight_ok(w) && wb_layout_ok(w) && fp4rl_cuda_has_sm90a(ctx);
}

fp4rl_status fp4rl_cuda_w4b_gemm(fp4rl_context *ctx, float *c, int64_t ldc, const uint16_t *x, int64_t M, const fp4rl_tensor *w,
                                 const float *bias, int slices)
{
    if (!ctx || !c || !x || !w) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "w4b_gemm: NULL context, output, operand or weight");
    if (!wb_weight_ok(w))
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED,
                          "w4b_gemm: the weight must be 2D HiF4, MXFP4 1D or in 32 x 32 tiles, or NVFP4 1D or in 16 x 16 tiles, K a positive "
                          "multiple of %d, aligned", KC);
    if (!wb_layout_ok(w)) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "w4b_gemm: an NVFP4 weight is read re-laid out only (fp4rl_cuda_w4b_pack first)");
    const int64_t N = w->q.rows, K = w->q.cols;
    if (M < 1 || M >= (1LL << 31)) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "w4b_gemm: M = %lld out of range", (long long)M);
    if (ldc < N || ldc >= (1LL << 31)) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "w4b_gemm: ldc = %lld below N = %lld or too large", (long long)ldc, (long long)N);
    if ((uintptr_t)x & 15) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "w4b_gemm: the activations must be 16-byte aligned");
    if (!fp4rl_cuda_has_sm90a(ctx)) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "w4b_gemm: needs a compute capability 9.0 device and a build with sm_90a code");
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    WB p;
    p.x = x;
    p.codes = static_cast<const uint8_t *>(w->data);
    p.wscales = w->scales;
    p.bias = bias;
    p.c = c;
    p.M = (int)M;
    p.N = (int)N;
    p.K = (int)K;
    p.ldc = (int)ldc;
    p.row_bytes = w->q.row_bytes;
    p.scale_cols = w->q.scale_cols;
    p.tile = w->dtype == FP4RL_DTYPE_MXFP4 ? w->q.tile : 0;
    p.chunks = (int)(K / KC);
    p.tiles = (int)((N + 63) / 64);
    p.magic = FP4RL_W4B_MAGIC;
    p.alpha = w->dtype == FP4RL_DTYPE_NVFP4 ? w->tensor_scale * 0x1p10f : 1.0f; /* w4b_layout.h: the 2^-10 of the multipliers */
    /* 0 HiF4 as stored, 1 MXFP4 as stored, 2 HiF4, 3 MXFP4 and 4 NVFP4 re-laid out by fp4rl_cuda_w4b_pack */
    const int layout = w->dtype == FP4RL_DTYPE_NVFP4 ? 4 : (w->dtype == FP4RL_DTYPE_HIF4 ? 0 : 1) + (w->layout == FP4RL_LAYOUT_W4B ? 2 : 0);
    /* The tile: NB the fewest activation rows (32, 64, 128) covering M, up to 128; 256 weight rows
     * a CTA (two m64 tiles a warpgroup: the per-chunk copies, barrier and MMA issue over twice the
     * work) where NB <= 64 and N > 4096, or that still gives a CTA a multiprocessor, else 128 (the
     * sweep of session 21, fp4rl_bench w4bsweep on an H100: 128-row CTAs took 3B o from 9.0-11.3 us
     * to 7.5-9.3 at M = 1..64, q+k+v slightly, down alike; 256 rows were better for 8192^2 and gate+up). The grid: at most
     * one wave of the CTAs the device holds at once (occ a multiprocessor: a second, partial wave
     * costs a whole CTA's time), filled by split-K with at most 16 slices of at least 4 chunks, the
     * slices' FP32 partials (written and read again, mostly in L2) within 4 weight bytes a partial
     * byte and 16 MB. On an H100 (session 20) this grid took 8192^2 at M = 1 from 1.63x to 2.03x
     * cuBLASLt BF16; 32 slices of 6 chunks (3B down) and 128-row CTAs at 2560 x 2048 were slower
     * than 16 slices and 256-row CTAs. */
    const int nb = M <= 32 ? 32 : M <= 64 ? 64 : 128;
    const int64_t mblocks = (M + nb - 1) / nb;
    if (mblocks > 65535) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "w4b_gemm: M = %lld too large", (long long)M);
    const int sms = cu->sm_count > 0 ? cu->sm_count : 1;
    const char *menv = getenv("FP4RL_W4B_MT"); /* 1 or 2 m64 tiles a warpgroup: a tuning knob, like FP4RL_W4B_SLICES */
    const int mt = menv && (menv[0] == '1' || menv[0] == '2') ? menv[0] - '0' : (nb <= 64 && N > 4096) || ((N + 255) / 256) * mblocks >= sms ? 2 : 1;
    int64_t smax = p.chunks / 4;
    if (smax > K / (4 * M)) smax = K / (4 * M);
    if (smax > (16LL << 20) / (4 * M * N)) smax = (16LL << 20) / (4 * M * N);
    if (smax > 16) smax = 16;
    if (smax < 1) smax = 1;
    int occ = 1, red_ok = 0;
    cudaError_t e = wb_dispatch(p, mt, nb, layout, dim3(0, 0), cu->stream, &occ, &red_ok);
    if (e != cudaSuccess) return fp4rl_cuda_fail(ctx, e, "w4b_gemm: shared memory attribute");
    const int rows = 128 * mt;
    const int64_t rblocks = (N + rows - 1) / rows;
    const char *senv = getenv("FP4RL_W4B_SLICES"); /* n slices where the caller left the choice: a tuning knob (read at every call) */
    int want = slices > 0 ? slices : senv && atoi(senv) > 0 ? atoi(senv) : 0;
    if (want <= 0) {
        const int64_t tiles = rblocks * mblocks, fit = (int64_t)occ * sms / tiles;
        want = (int)(fit < smax ? fit : smax);
    }
    if (want < 1) want = 1;
    /* Split-K's sum (RED_*): by the tile's last CTA while a tile's outputs are one pass of its
     * threads (M <= 4 at 256 rows: no second launch), else by wb_reduce over the whole device.
     * FP4RL_W4B_REDUCE=0 / 1 forces the one or the other, =2 the cluster sum (opt-in, not yet run
     * on a GPU; at most 8 slices, where the ring holds the partials; else wb_reduce). A tuning
     * knob, read at every call. */
    const char *renv = getenv("FP4RL_W4B_REDUCE");
    p.reduce = renv && renv[0] >= '0' && renv[0] <= '2' ? renv[0] - '0' : (M < nb ? M : nb) * rows > 4 * THREADS ? RED_APART : RED_LAST;
    if (p.reduce == RED_CLUSTER && !red_ok) p.reduce = RED_APART;
    if (p.reduce == RED_CLUSTER && want > 8) want = 8; /* the portable cluster size */
    if (want > p.chunks) want = p.chunks;
    p.chunks_per_slice = (p.chunks + want - 1) / want;
    p.slices = (p.chunks + p.chunks_per_slice - 1) / p.chunks_per_slice;
    if (rblocks * p.slices >= (1LL << 31)) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "w4b_gemm: N = %lld too large", (long long)N);
    p.ws = NULL;
    p.counters = cu->counters;
    void *ws = NULL;
    if (p.slices > 1 && p.reduce != RED_CLUSTER) {
        if (p.reduce == RED_LAST) st = fp4rl_cuda_split_counters(ctx, (size_t)(rblocks * mblocks), &p.counters);
        if (!st) st = fp4rl_cuda_alloc_bytes(ctx, &ws, (size_t)p.slices * (size_t)M * (size_t)N * sizeof(float));
        if (st) return st;
        p.ws = static_cast<float *>(ws);
    }
    const dim3 grid((unsigned)(rblocks * p.slices), (unsigned)mblocks);
    e = wb_dispatch(p, mt, nb, layout, grid, cu->stream, &occ, &red_ok);
    if (e == cudaSuccess && p.slices > 1 && p.reduce == RED_APART) {
        const int64_t MN = M * N;
        wb_reduce<<<(unsigned)((MN + 255) / 256), 256, 0, cu->stream>>>(p.ws, p.slices, MN, p.N, c, p.ldc, p.alpha, bias);
        e = cudaGetLastError();
    }
    st = e != cudaSuccess ? fp4rl_cuda_fail(ctx, e, "w4b_gemm: launch") : fp4rl_cuda_check_launch(ctx, "w4b_gemm");
    fp4rl_cuda_free_bytes(ctx, ws); /* stream order keeps the block's next user after this kernel */
    return st;
}

fp4rl_status fp4rl_cuda_w4b_pack(fp4rl_context *ctx, fp4rl_tensor *w)
{
    if (!ctx || !w) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "w4b_pack: NULL context or weight");
    if (!wb_weight_ok(w) || w->ctx != ctx)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "w4b_pack: the weight must be one fp4rl_cuda_w4b_gemm takes, of this context");
    if (w->layout == FP4RL_LAYOUT_W4B) return FP4RL_OK;
    if (w->storage != FP4RL_STORAGE_OWNED) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "w4b_pack: the weight's memory is not the library's own");
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    const bool hif4 = w->dtype == FP4RL_DTYPE_HIF4, nv = w->dtype == FP4RL_DTYPE_NVFP4;
    if (!hif4 && !nv) { /* MXFP4: only where every multiplier is a BF16 (w4b_layout.h); else the stored layout stays */
        unsigned *bad = NULL, hbad = 0;
        st = fp4rl_cuda_alloc_bytes(ctx, (void **)&bad, sizeof(unsigned));
        if (st) return st;
        const int64_t ns = (int64_t)w->scales_bytes;
        cudaError_t e = cudaMemsetAsync(bad, 0, sizeof(unsigned), cu->stream);
        if (e == cudaSuccess) {
            wp_mx_scales_bad<<<(unsigned)((ns + 255) / 256 < 4096 ? (ns + 255) / 256 : 4096), 256, 0, cu->stream>>>(static_cast<const uint8_t *>(w->scales), ns, bad);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess) e = cudaMemcpyAsync(&hbad, bad, sizeof(unsigned), cudaMemcpyDeviceToHost, cu->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cu->stream);
        fp4rl_cuda_free_bytes(ctx, bad);
        if (e != cudaSuccess) return fp4rl_cuda_fail(ctx, e, "w4b_pack: the MXFP4 scale check");
        if (hbad) return FP4RL_OK;
    }
    const int64_t N = w->q.rows, chunks = w->q.cols / KC, tiles = (N + 63) / 64;
    const size_t ncodes = (size_t)(tiles * chunks) * FP4RL_W4B_TILE_CODE_BYTES, nwords = (size_t)(tiles * chunks) * FP4RL_W4B_TILE_WORD_BYTES;
    void *codes = NULL, *words = NULL;
    st = ctx->be->alloc(ctx, &codes, ncodes);
    if (!st) st = ctx->be->alloc(ctx, &words, nwords);
    if (st) {
        if (codes) ctx->be->free(ctx, codes);
        return st;
    }
    const int64_t tc = (int64_t)ncodes / 4, tw = (int64_t)nwords / 4;
    const unsigned bc = (unsigned)((tc + 255) / 256 < 65536 ? (tc + 255) / 256 : 65536), bw = (unsigned)((tw + 255) / 256 < 65536 ? (tw + 255) / 256 : 65536);
    const uint8_t *src = static_cast<const uint8_t *>(w->data);
    if (nv) {
        const uint8_t *sc = static_cast<const uint8_t *>(w->scales);
        wp_pack_nv_codes<<<bc, 256, 0, cu->stream>>>(src, w->q.row_bytes, sc, w->q.tile, w->q.scale_cols, N, chunks, tc, static_cast<uint32_t *>(codes));
        wp_pack_nv_words<<<bw, 256, 0, cu->stream>>>(sc, w->q.tile, w->q.scale_cols, N, chunks, tw, static_cast<uint32_t *>(words));
    } else if (hif4) {
        wp_pack_codes<<<bc, 256, 0, cu->stream>>>(src, w->q.row_bytes, N, chunks, 1, tc, static_cast<uint32_t *>(codes));
        wp_pack_words<<<bw, 256, 0, cu->stream>>>(static_cast<const uint32_t *>(w->scales), w->q.scale_cols, N, chunks, tw, static_cast<uint32_t *>(words));
    } else {
        wp_pack_codes<<<bc, 256, 0, cu->stream>>>(src, w->q.row_bytes, N, chunks, 0, tc, static_cast<uint32_t *>(codes));
        wp_pack_words_mx<<<bw, 256, 0, cu->stream>>>(static_cast<const uint8_t *>(w->scales), w->q.tile, w->q.scale_cols, N, chunks, tw,
                                                     static_cast<uint32_t *>(words));
    }
    st = fp4rl_cuda_check_launch(ctx, "w4b_pack");
    if (st) {
        ctx->be->free(ctx, codes);
        ctx->be->free(ctx, words);
        return st;
    }
    ctx->be->free(ctx, w->data); /* stream order keeps the frees after the packing kernels */
    ctx->be->free(ctx, w->scales);
    w->data = codes;
    w->data_bytes = ncodes;
    w->scales = words;
    w->scales_bytes = nwords;
    w->layout = FP4RL_LAYOUT_W4B;
    return FP4RL_OK;
}
