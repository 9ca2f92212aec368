/*
 * decode_layout.h - the packed weight layout of the decode GEMM (cuda/decode_packed.cu) and the
 * bit arithmetic that turns it into BF16 tensor-core fragments. Host C and CUDA device code
 * (FP4RL_HD): the device re-layout kernel and the decode kernel call these functions, and so does
 * the CPU test (tests/test_decode_layout.c) that decodes every weight back through the layout and
 * holds it to fp4rl_dequantize bit for bit, on a machine without a GPU.
 *
 * The product is y[M, N] = x[M, K] * W[N, K]^T on mma.sync.m16n8k16 (BF16 in, FP32 accumulate)
 * with W as the MMA's A operand (16 weight rows x 16 k) and the activations as B (16 k x 8 rows).
 *
 * Records. W is cut into tiles of 16 rows and kgroups of 64 k. One record per (tile, kgroup),
 * stored tile-major (a tile's kgroups are consecutive, so a warp streams contiguous bytes):
 *   512 bytes of codes: lane l = 4g + t (g = l / 4, t = l % 4) owns 16 bytes, four 32-bit words;
 *     word j holds the 8 codes of rows g and g + 8 at k = 16t + 4j .. 16t + 4j + 3 of the kgroup.
 *     MMA j of the kgroup reads k in that order (logical k 2t, 2t+1, 2t+8, 2t+9 of the MMA are
 *     physical 16t + 4j + 0, 1, 2, 3): a dot product does not care in which order k is summed
 *     as long as both operands agree, and this one gives every lane its own contiguous codes and
 *     contiguous activations (one 16-byte shared-memory load covers two MMAs).
 *   then the scales, as halfwords a lane loads with one 16-bit read:
 *     MXFP4  32 bytes: halfword 2g + b = (scale(g, b), scale(g + 8, b)), b = the 32-block of the
 *            kgroup (lane t reads b = t / 2);
 *     NVFP4  64 bytes: halfword 4g + t = (scale(g, t), scale(g + 8, t)), block t of the kgroup;
 *     HiF4   80 bytes: 32 halfwords, lane l's = the exponent increments e8 + e16 (0..2, 2 bits
 *            each) of the four micro-blocks 4t + j of row g (bits 2j) and row g + 8 (bits 8 + 2j);
 *            then 8 halfwords (base(g), base(g + 8)), the E6M2 bytes of the rows' unit.
 *   So 4.25 (MXFP4), 4.5 (NVFP4) and 4.625 (HiF4) bits per weight; rows past N and k past K are
 *   zero codes under a finite scale.
 *
 * Dequantization, per 32-bit word: four bit patterns P0..P3, each a pair of BF16 values
 * (low half, high half) = (k, k + 1) of one row, made by a rotation and a mask, times a BF16
 * multiplier pair (one HMUL2 per pair of codes):
 *   E2M1 (MXFP4, NVFP4): the 3 magnitude bits go to BF16 bits 8..6 and the sign to bit 15, so
 *     the pattern is value(code) * 2^-126 exactly (code 1, 0.5, becomes the subnormal 2^-127:
 *     E2M1's own subnormal lines up with BF16's). The multiplier is scale * 2^(126 - d).
 *     Four translates of that bit set cannot tile 32 bits, so P3 takes two rotations.
 *   HiF4: the magnitude k goes to bits 6..4, the sign to bit 15: the subnormal k * 2^-129 =
 *     (k / 4) * 2^-127. The multiplier is base * 2^(127 + inc - d); the increment is an exponent
 *     add on the multiplier's BF16 bits (it is a normal number), one integer multiply-add.
 *   Each product is exactly the dequantized value times 2^-d (value(code) * scale has at most
 *   6 significant bits for every format, and d keeps the range), so the MMA products are the
 *   generic path's and the epilogue multiplies by alpha = 2^d (times NVFP4's tensor scale).
 *   d is per tensor, from its largest scale (fp4rl_dg_pick_d): 0 for any weights below 16 in
 *   magnitude (MX), 7 for NVFP4 (its UE4M3 scales reach 448), 0 for HiF4 bases below 2^-1.
 *   A non-finite block has zero codes (spec section 1); its multiplier is +Inf, so 0 * Inf makes
 *   the NaN of the generic path.
 */
#ifndef FP4RL_DECODE_LAYOUT_H
#define FP4RL_DECODE_LAYOUT_H

#include <stdint.h>

#include "format/formats.h"
#include "format/layout.h"

#define FP4RL_DG_TILE 16       /* weight rows per tile: the MMA's m16 */
#define FP4RL_DG_KGROUP 64     /* k per kgroup */
#define FP4RL_DG_CODE_BYTES 512

/* Scale bytes of one record, and the record. */
FP4RL_HD_CONST int fp4rl_dg_scale_bytes(int fmt) { return fmt == FP4RL_DTYPE_HIF4 ? 80 : fmt == FP4RL_DTYPE_NVFP4 ? 64 : 32; }
FP4RL_HD_CONST int fp4rl_dg_record_bytes(int fmt) { return FP4RL_DG_CODE_BYTES + fp4rl_dg_scale_bytes(fmt); }
FP4RL_HD_CONST int fp4rl_dg_format_ok(int fmt)
{
    return fmt == FP4RL_DTYPE_MXFP4 || fmt == FP4RL_DTYPE_NVFP4 || fmt == FP4RL_DTYPE_HIF4;
}

/* ---- bit placement of one code word ---------------------------------------------------------
 * Pattern p (0..3) is the MMA fragment register a_p: p = 0: row g, k0 (low) and k1 (high);
 * p = 1: row g + 8, k0 and k1; p = 2: row g, k2 and k3; p = 3: row g + 8, k2 and k3.
 * In a pattern, bit b (0..2) of the low element's magnitude sits at BF16 bit mag0 + b, its sign at
 * 15; the high element's at mag0 + 16 + b and 31 (mag0 = 6 for E2M1, 4 for HiF4). The pattern is
 * rotr(q, r) masked, so pattern bit i comes from bit (i + r) mod 32 of the word; r depends on the
 * pattern and, for E2M1's P3, on the bit. */
FP4RL_HD uint32_t fp4rl_dg_rotr(uint32_t q, int r)
{
#ifdef __CUDA_ARCH__
    return __funnelshift_r(q, q, (unsigned)r);
#else
    return r ? (q >> r) | (q << (32 - r)) : q;
#endif
}
#define FP4RL_DG_E2M1_MASK 0x81C081C0u /* sign 15, magnitude 8..6; sign 31, magnitude 24..22 */
#define FP4RL_DG_HIF4_MASK 0x80708070u /* sign 15, magnitude 6..4; sign 31, magnitude 22..20 */

/* The rotation that brings pattern bit `bit` (0..31) of pattern p into place. E2M1 P0..P2 rotate
 * by 0, 4, 10; P3's bits 6 and 22 by 14, its others by 6 (found by search: no four rotations of
 * the E2M1 bit set tile a word, three plus this split one do). HiF4 rotates by 4p. */
FP4RL_HD int fp4rl_dg_rot(int fmt, int p, int bit)
{
    if (fmt == FP4RL_DTYPE_HIF4) return 4 * p;
    if (p < 3) return p == 0 ? 0 : p == 1 ? 4 : 10;
    return (bit == 6 || bit == 22) ? 14 : 6;
}

/* The four patterns of word q: the BF16 pairs before the multiplier. */
FP4RL_HD void fp4rl_dg_patterns(int fmt, uint32_t q, uint32_t P[4])
{
    if (fmt == FP4RL_DTYPE_HIF4) {
        P[0] = q & FP4RL_DG_HIF4_MASK;
        P[1] = fp4rl_dg_rotr(q, 4) & FP4RL_DG_HIF4_MASK;
        P[2] = fp4rl_dg_rotr(q, 8) & FP4RL_DG_HIF4_MASK;
        P[3] = fp4rl_dg_rotr(q, 12) & FP4RL_DG_HIF4_MASK;
    } else {
        P[0] = q & FP4RL_DG_E2M1_MASK;
        P[1] = fp4rl_dg_rotr(q, 4) & FP4RL_DG_E2M1_MASK;
        P[2] = fp4rl_dg_rotr(q, 10) & FP4RL_DG_E2M1_MASK;
        P[3] = (fp4rl_dg_rotr(q, 6) & 0x81808180u) | (fp4rl_dg_rotr(q, 14) & 0x00400040u);
    }
}

/* Places the 4-bit code `code` (sign bit 3, magnitude bits 2..0) as the low (hi = 0) or high
 * (hi = 1) element of pattern p in word *q. */
FP4RL_HD void fp4rl_dg_place(int fmt, uint32_t *q, int p, int hi, unsigned code)
{
    const int mag0 = (fmt == FP4RL_DTYPE_HIF4 ? 4 : 6) + 16 * hi;
    for (int b = 0; b < 4; b++) {
        const int bit = b < 3 ? mag0 + b : 15 + 16 * hi;
        const int src = (bit + fp4rl_dg_rot(fmt, p, bit)) & 31;
        *q |= ((uint32_t)(code >> b) & 1u) << src;
    }
}

/* ---- scales and multipliers -----------------------------------------------------------------
 * Stored scale bytes are re-encoded so that the multiplier's BF16 bits are (byte << shift) + C:
 * MXFP4 the E8M0 byte itself (shift 7); NVFP4 the UE4M3 value with subnormals normalised and the
 * exponent biased by 3 (shift 4); HiF4 the E6M2 byte itself (shift 5). A NaN scale becomes the
 * byte whose multiplier is +Inf. C carries 2^(126 - d) (E2M1) or 2^(127 - d) (HiF4) and the
 * formats' exponent biases. */
FP4RL_HD int fp4rl_dg_shift(int fmt) { return fmt == FP4RL_DTYPE_HIF4 ? 5 : fmt == FP4RL_DTYPE_NVFP4 ? 4 : 7; }
/* The 16-bit C of format fmt under exponent offset d (both halves: C | C << 16). */
FP4RL_HD uint32_t fp4rl_dg_c2(int fmt, int d)
{
    const uint32_t c = (uint32_t)((fmt == FP4RL_DTYPE_HIF4 ? 206 : fmt == FP4RL_DTYPE_NVFP4 ? 243 : 126) - d) << 7;
    return c | c << 16;
}
/* The stored byte of a scale: s is the E8M0 byte (MXFP4), the UE4M3 byte (NVFP4), or the E6M2
 * base byte of a HiF4 word. */
FP4RL_HD uint32_t fp4rl_dg_scale_byte(int fmt, uint32_t s, int d)
{
    if (fmt == FP4RL_DTYPE_MXFP4) return s == FP4RL_E8M0_NAN ? (uint32_t)(129 + d) : s; /* (b + 126 - d) = 255: Inf */
    if (fmt == FP4RL_DTYPE_HIF4) return s == FP4RL_HIF4_NAN_WORD ? (uint32_t)(196 + 4 * d) : s;
    s &= 0x7fu; /* fp4rl_ue4m3_decode ignores bit 7 */
    if (s == FP4RL_UE4M3_NAN) return (uint32_t)(12 + d) << 3;
    const uint32_t e = s >> 3, m = s & 7u;
    if (e) return ((e + 3u) << 3) | m;
    if (!m) return 0; /* a zero scale: its codes are zero, any finite multiplier does */
    const uint32_t k = m >= 4 ? 2u : m >= 2 ? 1u : 0u; /* m * 2^-9 = 2^(k - 9) * (m / 2^k) */
    return ((k + 1u) << 3) | ((m << (3u - k)) & 7u);
}
/* Both halves of a halfword's byte `which` (0 low, 1 high): b | b << 16. */
FP4RL_HD uint32_t fp4rl_dg_dup_byte(uint32_t hw, int which)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(hw, 0u, which ? 0x4141u : 0x4040u);
#else
    const uint32_t b = (hw >> (8 * which)) & 0xffu;
    return b | b << 16;
#endif
}
/* The BF16 multiplier pair of a stored scale byte, given as b | b << 16. */
FP4RL_HD uint32_t fp4rl_dg_mult(int fmt, uint32_t bdup, uint32_t c2) { return bdup * (1u << fp4rl_dg_shift(fmt)) + c2; }
/* HiF4: the multiplier of micro-block j (0..3) of a row: its base multiplier sb2 with the
 * increment in bits 2j..2j+1 of h added to both exponents. The field is isolated and multiplied
 * into place (0x00800080 = 1 << 7 in each half), one mask and one multiply-add. */
FP4RL_HD uint32_t fp4rl_dg_inc_mult(uint32_t h, int j, uint32_t sb2) { return (h & (3u << (2 * j))) * (0x00800080u >> (2 * j)) + sb2; }

/* HiF4: the exponent increment e8 + e16 of element k (0..63) of a unit word. */
FP4RL_HD uint32_t fp4rl_dg_hif4_inc(uint32_t w, int k) { return (uint32_t)fp4rl_hif4_word_inc(w, k); }

/* ---- the exponent offset d ------------------------------------------------------------------
 * From the largest stored scale of the tensor (non-NaN; NVFP4 bit 7 cleared) and, for MXFP4, the
 * smallest non-zero E8M0 byte. Returns d, or -1 when no d keeps every product exact (MXFP4 scales
 * spanning more than 2^132, or HiF4 bases of 2^13 and more). */
FP4RL_HD int fp4rl_dg_pick_d(int fmt, uint32_t smax, uint32_t smin_nonzero)
{
    if (fmt == FP4RL_DTYPE_MXFP4) {
        /* multiplier exponent e + 126 - d <= 127; products v 2^(e - d) >= 2^-133 need e - d >= -132 */
        const int d = (int)smax > 128 ? (int)smax - 128 : 0;
        return d <= 5 || smin_nonzero >= (uint32_t)(d - 5) ? d : -1;
    }
    if (fmt == FP4RL_DTYPE_NVFP4) {
        const int e = (int)(smax >> 3); /* UE4M3 exponent field 0..15: multiplier exponent e + 246 - d <= 254 */
        return e > 8 ? e - 8 : 0;
    }
    /* HiF4: multiplier exponent field E + 206 - d + inc <= 254 with inc <= 2; the NaN byte
     * 196 + 4d must fit in a byte */
    const int E = (int)(smax >> 2), d = E > 46 ? E - 46 : 0;
    return d <= 14 ? d : -1;
}

/* ---- one lane's share of a record ------------------------------------------------------------
 * The source tensor: codes row-major with row_bytes per row (two a byte, low nibble first), and
 * its scales as fp4rl stores them (format/layout.h): MX / NVFP4 bytes per 1D block (tile 0) or per
 * tile x tile tile, HiF4 one word per 64 elements of every row. */
typedef struct fp4rl_dg_src {
    int fmt, tile;
    int64_t N, K, row_bytes, scale_cols;
    const uint8_t *codes;
    const void *scales;
} fp4rl_dg_src;

FP4RL_HD unsigned fp4rl_dg_src_code(const fp4rl_dg_src *s, int64_t r, int64_t k)
{
    if (r >= s->N || k >= s->K) return 0;
    const uint8_t b = s->codes[r * s->row_bytes + k / 2];
    return (k & 1) ? (unsigned)(b >> 4) : (unsigned)(b & 15u);
}
/* The scale byte (MX, NVFP4) or word (HiF4) of element (r, k); padding: 0 (a finite multiplier). */
FP4RL_HD uint32_t fp4rl_dg_src_scale(const fp4rl_dg_src *s, int64_t r, int64_t k)
{
    if (r >= s->N || k >= s->K) return 0;
    if (s->fmt == FP4RL_DTYPE_HIF4) return ((const uint32_t *)s->scales)[fp4rl_hif4_word_index(s->scale_cols, r, k)];
    const int block = fp4rl_format_of((fp4rl_dtype)s->fmt).block;
    return ((const uint8_t *)s->scales)[fp4rl_scale_index(s->tile, block, s->scale_cols, r, k)];
}

/* Writes lane l's part of the record of (tile i, kgroup c) at rec: its 16 code bytes and its
 * scale halfwords (lanes below 16 / 32 / 8 write the MX / NVFP4 / HiF4-base halfwords of their
 * index). d: the exponent offset (NaN scales become the +Inf byte). */
FP4RL_HD void fp4rl_dg_build_lane(const fp4rl_dg_src *s, int d, int64_t i, int64_t c, int l, uint8_t *rec)
{
    const int g = l >> 2, t = l & 3, fmt = s->fmt;
    const int64_t r0 = i * FP4RL_DG_TILE + g, r1 = r0 + 8, kb = c * FP4RL_DG_KGROUP + 16 * t;
    uint32_t w[4];
    for (int j = 0; j < 4; j++) {
        uint32_t q = 0;
        for (int e = 0; e < 4; e++) {
            const int p = e < 2 ? 0 : 2, hi = e & 1;
            fp4rl_dg_place(fmt, &q, p, hi, fp4rl_dg_src_code(s, r0, kb + 4 * j + e));
            fp4rl_dg_place(fmt, &q, p + 1, hi, fp4rl_dg_src_code(s, r1, kb + 4 * j + e));
        }
        w[j] = q;
    }
    for (int j = 0; j < 4; j++)
        for (int b = 0; b < 4; b++) rec[16 * l + 4 * j + b] = (uint8_t)(w[j] >> (8 * b));
    uint8_t *sc = rec + FP4RL_DG_CODE_BYTES;
    if (fmt == FP4RL_DTYPE_HIF4) {
        const uint32_t w0 = fp4rl_dg_src_scale(s, r0, kb), w1 = fp4rl_dg_src_scale(s, r1, kb);
        uint32_t h = 0;
        for (int j = 0; j < 4; j++) { /* NaN words carry no increments (their multiplier stays +Inf) */
            const int k = (int)((kb + 4 * j) % FP4RL_HIF4_UNIT);
            if (fp4rl_hif4_word_base_bits(w0) != FP4RL_HIF4_NAN_WORD) h |= fp4rl_dg_hif4_inc(w0, k) << (2 * j);
            if (fp4rl_hif4_word_base_bits(w1) != FP4RL_HIF4_NAN_WORD) h |= fp4rl_dg_hif4_inc(w1, k) << (8 + 2 * j);
        }
        sc[2 * l] = (uint8_t)h;
        sc[2 * l + 1] = (uint8_t)(h >> 8);
        if (l < 8) { /* the bases of rows l and l + 8 (g = l) */
            const int64_t kc = c * FP4RL_DG_KGROUP, ra = i * FP4RL_DG_TILE + l;
            sc[64 + 2 * l] = (uint8_t)fp4rl_dg_scale_byte(fmt, fp4rl_hif4_word_base_bits(fp4rl_dg_src_scale(s, ra, kc)), d);
            sc[64 + 2 * l + 1] = (uint8_t)fp4rl_dg_scale_byte(fmt, fp4rl_hif4_word_base_bits(fp4rl_dg_src_scale(s, ra + 8, kc)), d);
        }
        return;
    }
    int gg, blk;
    if (fmt == FP4RL_DTYPE_NVFP4) {
        gg = g, blk = t; /* halfword 4g + t = l */
    } else {
        if (l >= 16) return;
        gg = l >> 1, blk = l & 1; /* halfword 2g + b = l */
    }
    const int64_t ra = i * FP4RL_DG_TILE + gg, kk = c * FP4RL_DG_KGROUP + blk * (fmt == FP4RL_DTYPE_NVFP4 ? 16 : 32);
    sc[2 * l] = (uint8_t)fp4rl_dg_scale_byte(fmt, fp4rl_dg_src_scale(s, ra, kk), d);
    sc[2 * l + 1] = (uint8_t)fp4rl_dg_scale_byte(fmt, fp4rl_dg_src_scale(s, ra + 8, kk), d);
}

/* The halfword index of lane (g, t)'s MX / NVFP4 scales in a record. */
FP4RL_HD int fp4rl_dg_scale_slot(int fmt, int g, int t) { return fmt == FP4RL_DTYPE_NVFP4 ? 4 * g + t : 2 * g + (t >> 1); }

#endif /* FP4RL_DECODE_LAYOUT_H */
