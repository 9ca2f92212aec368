/*
 * layout.h - where a quantized tensor keeps each element's code and scale, and the bit layout of
 * the HiF4 scale word (shared/spec/formats.md sections 1 and 6; the memory layout is documented
 * for users in fp4rl.h at fp4rl_tensor_codes_to_host / _scales_to_host). Host and CUDA device
 * code (FP4RL_HD), so the CPU reference, the error report and the GPU kernels index and pack alike.
 *
 * A tensor is viewed as [rows, cols]. Codes are row-major with row_bytes per row: 8-bit codes one
 * a byte, 4-bit codes two a byte with element 2k in the low nibble. MX / NVFP4 scales are one byte
 * per 1D block of a row, or per T x T tile; HiF4 keeps one 32-bit word per 64 elements of every
 * row, in 1D and 2D alike (a 2D tensor's words repeat its tile's base and sub-block bits).
 */
#ifndef FP4RL_FORMAT_LAYOUT_H
#define FP4RL_FORMAT_LAYOUT_H

#include "format/traits.h"

/* ---- codes ----------------------------------------------------------------------------------- */
/* Code of element (r, c) for codes of code_bits (4 or 8) bits. */
FP4RL_HD uint8_t fp4rl_code_get(const uint8_t *codes, int64_t row_bytes, int code_bits, int64_t r, int64_t c)
{
    if (code_bits == 8) return codes[r * row_bytes + c];
    const uint8_t b = codes[r * row_bytes + c / 2];
    return (c & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 0x0f);
}
/* Writes the code of element (r, c); the other nibble of its byte is kept. */
FP4RL_HD void fp4rl_code_put(uint8_t *codes, int64_t row_bytes, int code_bits, int64_t r, int64_t c, uint8_t code)
{
    if (code_bits == 8) {
        codes[r * row_bytes + c] = code;
        return;
    }
    uint8_t *b = &codes[r * row_bytes + c / 2];
    *b = (c & 1) ? (uint8_t)((*b & 0x0f) | (code << 4)) : (uint8_t)((*b & 0xf0) | code);
}

/* Bytes of codes in a row of `cols` elements of code_bits (4 or 8) bits; an odd 4-bit row ends
 * in a padding nibble. */
FP4RL_HD int64_t fp4rl_code_row_bytes(int code_bits, int64_t cols) { return (cols * code_bits + 7) / 8; }

/* ---- the FP8-operand unit scales (the W4A4 GEMMs: cuda/gemm_fp8.h, cuda/decode_fp8.h, the ops
 * rollout_act8 and linear_forward_w4) ------------------------------------------------------------
 * An operand [rows, K] of E4M3 bytes has one FP32 scale per unit (HiF4: base / 4, U = 64; MXFP4:
 * 2^e / 2, U = 32), stored unit-major as [K / U][ld] floats with ld = FP4RL_FP8_SCALE_LD(rows), rows
 * rounded up to a multiple of 128: the scale of row r, unit u is at scales[u * ld + r], so one
 * unit's scales of consecutive rows are contiguous (the wgmma producer fetches a tile's 128 rows of
 * a unit as one 512-byte bulk copy, 16-byte aligned, never past the buffer). Rows rows .. ld - 1
 * are padding, written as zeros by whoever writes the operand. */
#define FP4RL_FP8_SCALE_LD(rows) ((((rows) + 127) / 128) * 128)

/* ---- MX / NVFP4 scales ----------------------------------------------------------------------- */
/* Index of the scale byte of element (r, c): per 1D block of `block` elements (tile 0) or per
 * tile x tile tile. */
FP4RL_HD int64_t fp4rl_scale_index(int tile, int block, int64_t scale_cols, int64_t r, int64_t c)
{
    if (tile) return (r / tile) * scale_cols + c / tile;
    return r * scale_cols + c / block;
}

/* ---- HiF4 scale words ------------------------------------------------------------------------ */
/* One unit is 64 elements of a row. Word bits 7..0: the E6M2 base (0xFF: the unit is NaN);
 * bit 8 + h: e8[h], the increment of elements 8h .. 8h+7; bit 16 + g: e16[g], of elements
 * 4g .. 4g+3. A 2D tile's sub-block (8 x 8) and micro-block (4 x 4) bits sit in every row word
 * of the tile at the positions of the row's own elements. */
#define FP4RL_HIF4_UNIT 64
#define FP4RL_HIF4_BASE_MASK 0xFFu
#define FP4RL_HIF4_NAN_WORD 0x000000FFu /* the base's NaN code, nothing else */
#define FP4RL_HIF4_E8_SHIFT 8   /* 8 bits e8[0..7] */
#define FP4RL_HIF4_E16_SHIFT 16 /* 16 bits e16[0..15] */

/* Index of the word of element (r, c), and the element's position j (0..63) in its unit. */
FP4RL_HD int64_t fp4rl_hif4_word_index(int64_t scale_cols, int64_t r, int64_t c) { return r * scale_cols + c / FP4RL_HIF4_UNIT; }
FP4RL_HD int fp4rl_hif4_unit_pos(int64_t c) { return (int)(c % FP4RL_HIF4_UNIT); }

FP4RL_HD uint32_t fp4rl_hif4_word_base_bits(uint32_t w) { return w & FP4RL_HIF4_BASE_MASK; }
FP4RL_HD uint32_t fp4rl_hif4_word_e8(uint32_t w, int h) { return (w >> (FP4RL_HIF4_E8_SHIFT + h)) & 1u; }
FP4RL_HD uint32_t fp4rl_hif4_word_e16(uint32_t w, int g) { return (w >> (FP4RL_HIF4_E16_SHIFT + g)) & 1u; }
/* The word bits that carry e8[h] = bit, e16[g] = bit (bit is 0 or 1). */
FP4RL_HD uint32_t fp4rl_hif4_e8_at(uint32_t bit, int h) { return bit << (FP4RL_HIF4_E8_SHIFT + h); }
FP4RL_HD uint32_t fp4rl_hif4_e16_at(uint32_t bit, int g) { return bit << (FP4RL_HIF4_E16_SHIFT + g); }
/* The exponent increment e8[j/8] + e16[j/4] of element j of the unit. */
FP4RL_HD int fp4rl_hif4_word_inc(uint32_t w, int j) { return (int)fp4rl_hif4_word_e8(w, j / 8) + (int)fp4rl_hif4_word_e16(w, j / 4); }

/* The word of row c, unit v of the transpose of a 2D (64 x 64) HiF4 tensor whose R rows keep U
 * words each: rows of the output are the input's columns. All rows of a tile share the base; the
 * e8 of sub-block (h, j / 8) is bit e8[j / 8] of every input row 8h .. 8h+7 and becomes e8[h]; the
 * e16 of micro-block (g, j / 4) likewise becomes e16[g]. A NaN tile stays the NaN word (its base
 * byte 0xFF, no bits). */
FP4RL_HD uint32_t fp4rl_hif4_transposed_word(const uint32_t *w, int64_t R, int64_t U, int64_t c, int64_t v)
{
    const int64_t u = c / FP4RL_HIF4_UNIT;
    const int j = fp4rl_hif4_unit_pos(c);
    const uint32_t base = fp4rl_hif4_word_base_bits(w[(v * FP4RL_HIF4_UNIT) * U + u]);
    if (base == FP4RL_HIF4_NAN_WORD) return FP4RL_HIF4_NAN_WORD;
    uint32_t out = base;
    for (int h = 0; h < 8; h++) {
        const int64_t r = v * FP4RL_HIF4_UNIT + 8 * h;
        if (r < R) out |= fp4rl_hif4_e8_at(fp4rl_hif4_word_e8(w[r * U + u], j / 8), h);
    }
    for (int g = 0; g < 16; g++) {
        const int64_t r = v * FP4RL_HIF4_UNIT + 4 * g;
        if (r < R) out |= fp4rl_hif4_e16_at(fp4rl_hif4_word_e16(w[r * U + u], j / 4), g);
    }
    return out;
}

/* ---- the scale matrix ------------------------------------------------------------------------ */
/* The [scale_rows, scale_cols] scales of a [rows, cols] tensor of format t: HiF4 one word per 64
 * elements of every row (1D and 2D alike), the others one scale per 1D block of a row (tile 0)
 * or per tile x tile tile. */
FP4RL_HD void fp4rl_scale_dims(fp4rl_format_traits t, int tile, int64_t rows, int64_t cols, int64_t *scale_rows,
                               int64_t *scale_cols)
{
    if (t.scale_kind == FP4RL_SCALE_KIND_HIF4_WORD) {
        *scale_rows = rows;
        *scale_cols = (cols + FP4RL_HIF4_UNIT - 1) / FP4RL_HIF4_UNIT;
    } else if (tile) {
        *scale_rows = (rows + tile - 1) / tile;
        *scale_cols = (cols + tile - 1) / tile;
    } else {
        *scale_rows = rows;
        *scale_cols = (cols + t.block - 1) / t.block;
    }
}

#endif /* FP4RL_FORMAT_LAYOUT_H */
