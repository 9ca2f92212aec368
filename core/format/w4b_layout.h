/*
 * w4b_layout.h - the HiF4 weight re-layout that the W4B decode GEMM reads (cuda/decode_w4b.cu,
 * wp_kernel; made by fp4rl_cuda_w4b_pack for the rollout, ops_list.h linear_w4b_pack), and the
 * arithmetic by which the kernel turns it into its wgmma A fragments. Host and device code
 * (FP4RL_HD): the kernels call these, and tests/test_w4b_layout.c (CPU, in CI) replays the
 * kernel's register arithmetic over them against fp4rl_hif4_decode.
 *
 * The weight [N, K] (K % 64 == 0) in 64-row tiles (rows past N: level 0, word 0) and 64-k chunks:
 *  - codes: [tile][chunk][warp 4][lane 32][4 words]; word s of lane (g = lane / 4, t = lane % 4)
 *    of warp w holds the thread's A fragment registers j = 0..3 of wgmma k16 step s: register j is
 *    row 16 w + g + 8 (j & 1), elements k = 16 s + 2 t + 8 (j >> 1) (nibble j) and k + 1 (nibble
 *    j + 4), each as the offset-binary level 8 + v (v = +-(code & 7), -0 as +0: the products'
 *    zero signs never show, the accumulator starting at +0);
 *  - words: [tile][chunk][warp 4][g 8][hh 2], row 16 w + g + 8 hh, the unit's HiF4 word with its
 *    increment bits re-arranged (fp4rl_w4b_word).
 * A register's BF16x2: OR 0x4300 into both halves of the nibble pair (the BF16 128 + n), then one
 * FMA with sc = base / 4 * 2^inc and -136 sc: (136 + v) sc - 136 sc = v sc exactly (v has 3
 * significant bits, sc 3, 136 sc at most 7; one rounding of an exact value), the value
 * fp4rl_hif4_decode gives. MXFP4 weights use the same tiles and orders (end of this file).
 */
#ifndef FP4RL_FORMAT_W4B_LAYOUT_H
#define FP4RL_FORMAT_W4B_LAYOUT_H

#include "format/formats.h" /* fp4rl_ue4m3_decode; layout.h through traits */
#include "format/layout.h"

#define FP4RL_W4B_TILE_CODE_BYTES 2048 /* a 64-row tile's codes for one 64-k chunk */
#define FP4RL_W4B_TILE_WORD_BYTES 256  /* its 64 words */
#define FP4RL_W4B_MAGIC 0x43004300u   /* BF16x2 128, OR-ed into a nibble pair */
#define FP4RL_W4B_NEG136 0xC308C308u  /* BF16x2 -136 */

/* The offset-binary level of a HiF4 code (sign bit 3, level bits 0..2). */
FP4RL_HD uint32_t fp4rl_w4b_level(uint32_t code) { return (code & 8u) ? 8u - (code & 7u) : 8u + (code & 7u); }

/* Code word i (of [tile][chunk][warp][lane][s]): its register j's first element (row, k). */
FP4RL_HD void fp4rl_w4b_code_pos(int64_t i, int64_t chunks, int j, int64_t *row, int64_t *k)
{
    const int s = (int)(i & 3), lane = (int)((i >> 2) & 31), w = (int)((i >> 7) & 3);
    const int64_t tc = i >> 9, tile = tc / chunks, c = tc - tile * chunks;
    *row = tile * 64 + 16 * w + (lane >> 2) + 8 * (j & 1);
    *k = 64 * c + 16 * s + 2 * (lane & 3) + 8 * (j >> 1);
}
/* Word i (of [tile][chunk][warp][g][hh]): its row and chunk. */
FP4RL_HD void fp4rl_w4b_word_pos(int64_t i, int64_t chunks, int64_t *row, int64_t *c)
{
    const int hh = (int)(i & 1), g = (int)((i >> 1) & 7), w = (int)((i >> 4) & 3);
    const int64_t tc = i >> 6, tile = tc / chunks;
    *c = tc - tile * chunks;
    *row = tile * 64 + 16 * w + g + 8 * hh;
}

/* A HiF4 word as the kernel reads it: the base in bits 0..7 (the NaN word alone, its increments
 * zero), then u = bits 8..31 with, for step s (k 16 s .. 16 s + 15 of the unit): e8[2 s] at u bit
 * 2 s, e16[4 s] at 2 s + 1, e16[4 s + 1] at 8 + 2 s, e16[4 s + 3] at 9 + 2 s, e8[2 s + 1] at 16 +
 * 2 s, e16[4 s + 2] at 17 + 2 s. So u & 0x00550055 puts the e8 of both halves of every step where
 * the increments go (fp4rl_w4b_incs), and rotating u right by 1 (threads t = 0, 1: micro-blocks
 * 4 s, 4 s + 2) or by 8 and 25 (t = 2, 3: 4 s + 1, 4 s + 3) brings the thread's e16 there. */
FP4RL_HD uint32_t fp4rl_w4b_word(uint32_t w)
{
    if ((w & FP4RL_HIF4_BASE_MASK) == FP4RL_HIF4_NAN_WORD) return FP4RL_HIF4_NAN_WORD;
    uint32_t u = 0;
    for (int s = 0; s < 4; s++) {
        const uint32_t e8a = fp4rl_hif4_word_e8(w, 2 * s), e8b = fp4rl_hif4_word_e8(w, 2 * s + 1);
        u |= e8a << (2 * s) | fp4rl_hif4_word_e16(w, 4 * s) << (2 * s + 1) | fp4rl_hif4_word_e16(w, 4 * s + 1) << (8 + 2 * s) |
             fp4rl_hif4_word_e16(w, 4 * s + 3) << (9 + 2 * s) | e8b << (16 + 2 * s) | fp4rl_hif4_word_e16(w, 4 * s + 2) << (17 + 2 * s);
    }
    return (w & FP4RL_HIF4_BASE_MASK) | u << 8;
}

/* Code word i of the re-layout of stored 4-bit codes [N rows, row_bytes] (HiF4: levels; MXFP4,
 * hif4 = 0: the codes as they are). */
FP4RL_HD uint32_t fp4rl_w4b_pack_codes(const uint8_t *codes, int64_t row_bytes, int64_t N, int64_t chunks, int64_t i, int hif4)
{
    uint32_t o = 0;
    for (int j = 0; j < 4; j++) {
        int64_t row, k;
        fp4rl_w4b_code_pos(i, chunks, j, &row, &k);
        const uint32_t b = row < N ? codes[row * row_bytes + k / 2] : 0u; /* elements k (low nibble), k + 1 */
        const uint32_t lo = b & 15u, hi = b >> 4;
        o |= (hif4 ? fp4rl_w4b_level(lo) : lo) << (4 * j) | (hif4 ? fp4rl_w4b_level(hi) : hi) << (16 + 4 * j);
    }
    return o;
}
/* Word i of a HiF4 weight's re-layout from its stored words [N rows, scale_cols]. */
FP4RL_HD uint32_t fp4rl_w4b_pack_word(const uint32_t *words, int64_t scale_cols, int64_t N, int64_t chunks, int64_t i)
{
    int64_t row, c;
    fp4rl_w4b_word_pos(i, chunks, &row, &c);
    return fp4rl_w4b_word(row < N ? words[row * scale_cols + c] : 0u);
}

/* A thread's rotations and masks for its micro-blocks (th = t >> 1). */
typedef struct fp4rl_w4b_th { uint32_t r1, m1, r2, m2; } fp4rl_w4b_th;
FP4RL_HD fp4rl_w4b_th fp4rl_w4b_th_of(int th)
{
    fp4rl_w4b_th c;
    c.r1 = th ? 8u : 1u;
    c.m1 = th ? 0x55u : 0x00550055u;
    c.r2 = th ? 25u : 1u;
    c.m2 = th ? 0x00550000u : 0u;
    return c;
}
FP4RL_HD uint32_t fp4rl_w4b_rotr(uint32_t x, uint32_t r)
{
#ifdef __CUDA_ARCH__
    return __funnelshift_r(x, x, r);
#else
    r &= 31u;
    return r ? (x >> r) | (x << (32u - r)) : x;
#endif
}
/* The row's increments for this thread: 2-bit field s at bit 2 s (step s, first 8 k of the thread's
 * A registers) and at bit 16 + 2 s (its second 8 k), each e8 + e16 of that element pair. */
FP4RL_HD uint32_t fp4rl_w4b_incs(uint32_t pw, fp4rl_w4b_th c)
{
    const uint32_t u = pw >> 8;
    return (u & 0x00550055u) + ((fp4rl_w4b_rotr(u, c.r1) & c.m1) | (fp4rl_w4b_rotr(u, c.r2) & c.m2));
}
/* The row's base / 4 as BF16x2 (NaN for the NaN word): (1 + m/4) 2^(e - 50) for base bits e << 2 | m,
 * the BF16 exponent field e + 77. */
FP4RL_HD uint32_t fp4rl_w4b_base2(uint32_t pw)
{
    const uint32_t s = pw & FP4RL_HIF4_BASE_MASK;
    return s == FP4RL_HIF4_NAN_WORD ? 0x7FC07FC0u : ((s << 5) + (77u << 7)) * 0x00010001u;
}
/* Step s's increments at the BF16x2 exponent fields: (incs & fp4rl_w4b_step_mask(s)) *
 * fp4rl_w4b_step_mul(s), added to base2 (scale) and to -136 base2 (its negated 136 multiple):
 * both stay normal, or NaN with zero increments. */
FP4RL_HD uint32_t fp4rl_w4b_step_mask(int s) { return 0x00030003u << (2 * s); }
FP4RL_HD uint32_t fp4rl_w4b_step_mul(int s) { return 0x80u >> (2 * s); }

/* ---- MXFP4 (1D blocks of 32, or 32 x 32 tiles) ----
 * Re-laid out only when every scale code is at most FP4RL_W4B_MX_MAX_SCALE (|w| <= 12; other weights
 * keep the stored layout and its kernel): the code words hold the E2M1 codes themselves (sign bit 3,
 * magnitude e1 e0 m) in the same nibble order as HiF4's levels; a register's two codes become the
 * BF16x2 of e2m1 * 2^-126 by placing e1 e0 m at bits 6..8 (the exponent's low bits and the top
 * mantissa bit: e = 0 a subnormal, m / 2 * 2^-126) and the sign at 15; one BF16x2 multiply by
 * 2^(scale - 1) gives e2m1 * 2^(scale - 127) exactly (at most 2 significant bits, >= 2^-128). The
 * word of a row and chunk holds those two multipliers (its two 32-k units), low half first. */
#define FP4RL_W4B_MX_MAX_SCALE 128u /* 2^(128 - 1) is BF16's largest power of two */

FP4RL_HD uint32_t fp4rl_w4b_rotl(uint32_t x, uint32_t r)
{
#ifdef __CUDA_ARCH__
    return __funnelshift_l(x, x, r);
#else
    r &= 31u;
    return r ? (x << r) | (x >> (32u - r)) : x;
#endif
}
/* Register j's BF16x2 (e2m1 * 2^-126 of its two codes) from the code word y of its step. */
FP4RL_HD uint32_t fp4rl_w4b_mx_mag(uint32_t y, int j) { return fp4rl_w4b_rotl(y, (uint32_t)(6 - 4 * j) & 31u) & 0x01C001C0u; }
FP4RL_HD uint32_t fp4rl_w4b_mx_sign_src(uint32_t y, int j) { return fp4rl_w4b_rotl(y, (uint32_t)(12 - 4 * j) & 31u); }
FP4RL_HD uint32_t fp4rl_w4b_mx_elems(uint32_t y, int j) { return fp4rl_w4b_mx_mag(y, j) | (fp4rl_w4b_mx_sign_src(y, j) & 0x80008000u); }
/* The word of scale codes s0 (k 0..31 of the chunk) and s1 (k 32..63), both <= FP4RL_W4B_MX_MAX_SCALE. */
FP4RL_HD uint32_t fp4rl_w4b_mx_word(uint32_t s0, uint32_t s1) { return ((s0 + 126u) << 7) | (((s1 + 126u) << 7) << 16); }
/* Word i of an MXFP4 weight's re-layout from its stored E8M0 scales (tile 0: 1D blocks of 32;
 * 32: 32 x 32 tiles). */
FP4RL_HD uint32_t fp4rl_w4b_pack_mx_word(const uint8_t *scales, int tile, int64_t scale_cols, int64_t N, int64_t chunks, int64_t i)
{
    int64_t row, c;
    fp4rl_w4b_word_pos(i, chunks, &row, &c);
    const uint32_t s0 = row < N ? scales[fp4rl_scale_index(tile, 32, scale_cols, row, 64 * c)] : 0u;
    const uint32_t s1 = row < N ? scales[fp4rl_scale_index(tile, 32, scale_cols, row, 64 * c + 32)] : 0u;
    return fp4rl_w4b_mx_word(s0, s1);
}

/* ---- NVFP4 (1D blocks of 16, or 16 x 16 tiles) ----
 * Only re-laid out (no kernel reads its stored layout). The code words hold the E2M1 codes as
 * MXFP4's, except that a block whose scale is zero has its codes zeroed (value * 0 is 0 either
 * way, so its multiplier need only be finite). A register's two codes are MXFP4's e2m1 * 2^-126
 * (fp4rl_w4b_mx_elems), times the multiplier of the step's 16-k block: s_b * 2^116 as a BF16, a
 * normal number in [2^107, 2^125) for every finite s_b > 0 (NaN for a NaN block). The product is
 * e2m1 * s_b * 2^-10 exactly (at most 6 significant bits, within [2^-20, 2.625]); the kernel
 * multiplies its FP32 sums by alpha = g * 2^10, a power of two away from g, so C = g (X V^T) with
 * V = e2m1 * s_b: the tensor scale as the GEMM's alpha, as the format contract puts it.
 * The word of a row and chunk holds its four blocks' multipliers as bytes q (block s in byte s):
 * the BF16 bits 16 q + 0x7500 (exponent field 234 + (q >> 3), top mantissa bits q & 7), so a pair
 * of them is one byte permute and one multiply-add (fp4rl_w4b_nv_mult2). */
#define FP4RL_W4B_NV_BIAS 0x75007500u /* BF16x2 exponent field 234 in both halves */
#define FP4RL_W4B_NV_NAN_Q 0xACu      /* 16 q + 0x7500 = 0x7FC0, BF16's NaN */

/* The multiplier byte q of a UE4M3 scale code (bit 7 ignored, as fp4rl_ue4m3_decode does). */
FP4RL_HD uint32_t fp4rl_w4b_nv_q(uint32_t s)
{
    s &= 0x7Fu;
    if (s == FP4RL_UE4M3_NAN) return FP4RL_W4B_NV_NAN_Q;
    if (s == 0) return 0u;
    const uint32_t b = fp4rl_f32_bits(fp4rl_ue4m3_decode((uint8_t)s) * 0x1p116f) >> 16; /* exact: <= 4 significant bits */
    return (b - (FP4RL_W4B_NV_BIAS & 0xFFFFu)) >> 4;
}
/* The BF16x2 multipliers of blocks odd (low half) and odd + 2 (high half) of a row's word. */
FP4RL_HD uint32_t fp4rl_w4b_nv_mult2(uint32_t w, int odd)
{
#ifdef __CUDA_ARCH__
    const uint32_t q2 = __byte_perm(w, 0u, odd ? 0x4341u : 0x4240u);
#else
    const uint32_t q2 = (w >> (8 * odd)) & 0x00FF00FFu;
#endif
    return q2 * 16u + FP4RL_W4B_NV_BIAS;
}
/* Code word i of an NVFP4 weight's re-layout: fp4rl_w4b_pack_codes' (hif4 = 0) with the codes of
 * zero-scale blocks zeroed (scales: the stored UE4M3 codes, tile 0 or 16). */
FP4RL_HD uint32_t fp4rl_w4b_pack_nv_codes(const uint8_t *codes, int64_t row_bytes, const uint8_t *scales, int tile, int64_t scale_cols, int64_t N,
                                          int64_t chunks, int64_t i)
{
    uint32_t o = fp4rl_w4b_pack_codes(codes, row_bytes, N, chunks, i, 0);
    for (int j = 0; j < 4; j++) { /* register j's two codes lie in one 16-k block */
        int64_t row, k;
        fp4rl_w4b_code_pos(i, chunks, j, &row, &k);
        if (row < N && (scales[fp4rl_scale_index(tile, 16, scale_cols, row, k)] & 0x7Fu) == 0) o &= ~(0x000F000Fu << (4 * j));
    }
    return o;
}
/* Word i of an NVFP4 weight's re-layout from its stored UE4M3 scales. */
FP4RL_HD uint32_t fp4rl_w4b_pack_nv_word(const uint8_t *scales, int tile, int64_t scale_cols, int64_t N, int64_t chunks, int64_t i)
{
    int64_t row, c;
    fp4rl_w4b_word_pos(i, chunks, &row, &c);
    uint32_t o = 0;
    for (int b = 0; b < 4 && row < N; b++) o |= fp4rl_w4b_nv_q(scales[fp4rl_scale_index(tile, 16, scale_cols, row, 64 * c + 16 * b)]) << (8 * b);
    return o;
}

#endif
