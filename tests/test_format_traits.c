/*
 * test_format_traits.c - the traits table (core/format/traits.h) and the layout header
 * (core/format/layout.h) against what the formats do: element maxima and codes from the decoders
 * (formats.h and fmt_test_util.h's independent tables), block sizes, code widths and scale sizes
 * from real quantizations, the allowed tiles against the tensor layer, BF16 exactness by brute
 * force over every code and scale, and the HiF4 word bits against the spec's formula.
 */
#include <float.h>

#include "check_run.h"
#include "fmt_test_util.h"
#include "format/formats.h"
#include "format/layout.h"
#include "format/qdq_block.h"
#include "format/traits.h"
#include "runtime/internal.h"

static fp4rl_context *ctx;
static void setup(void)
{
    ref_tables_init();
    OK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0));
}
static void teardown(void) { fp4rl_context_destroy(ctx); }

static const fp4rl_dtype QFMTS[4] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};
static const fp4rl_dtype ALL_DTYPES[7] = {FP4RL_DTYPE_F32,   FP4RL_DTYPE_BF16, FP4RL_DTYPE_I32,       FP4RL_DTYPE_MXFP4,
                                          FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};

/* The element value of magnitude code c of format f, from the independent tables. */
static double ref_elem(fp4rl_dtype f, unsigned c)
{
    if (f == FP4RL_DTYPE_HIF4) return ref_hif4_elem((uint8_t)c);
    if (f == FP4RL_DTYPE_MXFP8_E4M3) return ref_e4m3((uint8_t)c);
    return ref_e2m1((uint8_t)c);
}

static int is_bf16(float v) { return v != v || fp4rl_round_bf16(v) == v; }

START_TEST(test_names_and_kinds)
{
    for (int i = 0; i < 7; i++) {
        const fp4rl_dtype d = ALL_DTYPES[i];
        const fp4rl_format_traits t = fp4rl_format_of(d);
        ck_assert_int_eq(fp4rl_format_is_quantized(d), fp4rl_dtype_is_quantized(d));
        if (!fp4rl_dtype_is_quantized(d)) {
            ck_assert_int_eq(t.block, 0);
            ck_assert_int_eq(t.scale_kind, FP4RL_SCALE_KIND_NONE);
            continue;
        }
        ck_assert_str_eq(t.name, fp4rl_dtype_name(d));
        ck_assert_int_eq(t.tensor_scale, d == FP4RL_DTYPE_NVFP4);
        ck_assert_int_eq(t.scale_kind, d == FP4RL_DTYPE_HIF4   ? FP4RL_SCALE_KIND_HIF4_WORD
                                       : d == FP4RL_DTYPE_NVFP4 ? FP4RL_SCALE_KIND_UE4M3
                                                                : FP4RL_SCALE_KIND_E8M0);
    }
    /* the fused round trip names formats by their dtype */
    ck_assert_int_eq(FP4RL_QDQ_MXFP4, FP4RL_DTYPE_MXFP4);
    ck_assert_int_eq(FP4RL_QDQ_HIF4, FP4RL_DTYPE_HIF4);
    ck_assert_int_eq(FP4RL_QDQ_MXFP8, FP4RL_DTYPE_MXFP8_E4M3);
    ck_assert_int_eq(fp4rl_qdq_block_size(FP4RL_QDQ_HIF4), 64);
    ck_assert_int_eq(fp4rl_qdq_block_size(FP4RL_QDQ_MXFP4), 32);
    /* the list the "not a quantized format" messages print: every row's name, in table order */
    ck_assert_str_eq(fp4rl_format_list_str(), "mxfp4, nvfp4, hif4, mxfp8_e4m3");
    ck_assert_str_eq(FP4RL_FORMAT_IDS_SEP, ", FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3");
}
END_TEST

/* max_elem is the largest decoded magnitude, max_code decodes to it, emax_elem is its exponent,
 * and the mag mask covers exactly the magnitude codes. */
START_TEST(test_element_max)
{
    for (int i = 0; i < 4; i++) {
        const fp4rl_dtype f = QFMTS[i];
        const fp4rl_format_traits t = fp4rl_format_of(f);
        const unsigned mask = fp4rl_format_mag_mask(t);
        ck_assert_uint_eq(mask, (1u << (t.code_bits - 1)) - 1u);
        double mx = 0;
        unsigned arg = 0;
        for (unsigned c = 0; c <= mask; c++) {
            const double v = ref_elem(f, c);
            if (v == v && v > mx) mx = v, arg = c;
        }
        ck_assert_msg(mx == (double)t.max_elem, "%s: largest element %g, traits say %g", t.name, mx, (double)t.max_elem);
        ck_assert_uint_eq(arg, t.max_code);
        ck_assert_int_eq(fp4rl_ilog2(t.max_elem), t.emax_elem);
        /* the library's own decoders agree */
        const float lib = f == FP4RL_DTYPE_HIF4 ? fp4rl_hif4_elem((uint8_t)t.max_code)
                          : f == FP4RL_DTYPE_MXFP8_E4M3 ? fp4rl_e4m3_decode((uint8_t)t.max_code)
                                                        : fp4rl_e2m1_decode((uint8_t)t.max_code);
        ck_assert_float_eq(lib, t.max_elem);
        /* a value far beyond the max saturates to max_code (nearest rounding, scale 1) */
        if (f == FP4RL_DTYPE_HIF4) ck_assert_uint_eq(fp4rl_hif4_encode(1e30f, 0, 1.0f, -1.0f), t.max_code);
        else if (f == FP4RL_DTYPE_MXFP8_E4M3) ck_assert_uint_eq(fp4rl_e4m3_encode(1e30f, -1.0f), t.max_code);
        else ck_assert_uint_eq(fp4rl_e2m1_encode(1e30f, -1.0f), t.max_code);
    }
    /* the MX scale rule with the table's constants: a block whose max is the element max gets
     * scale 2^0 (OCP floor), and 2^k when it is max * 2^k */
    for (int k = -20; k <= 20; k++) {
        ck_assert_int_eq(fp4rl_e8m0_exp(fp4rl_mx_block_scale(ldexpf(6.0f, k), FP4RL_DTYPE_MXFP4, 0)), k);
        ck_assert_int_eq(fp4rl_e8m0_exp(fp4rl_mx_block_scale(ldexpf(448.0f, k), FP4RL_DTYPE_MXFP8_E4M3, 0)), k);
        /* just above the max: floor keeps k (saturates), truncation-free moves to k + 1 */
        ck_assert_int_eq(fp4rl_e8m0_exp(fp4rl_mx_block_scale(ldexpf(6.5f, k), FP4RL_DTYPE_MXFP4, 1)), k + 1);
        ck_assert_int_eq(fp4rl_e8m0_exp(fp4rl_mx_block_scale(ldexpf(6.5f, k), FP4RL_DTYPE_MXFP4, 0)), k);
    }
}
END_TEST

/* Block size, code width, scale size and tensor scale, as the quantizer lays a tensor out. */
START_TEST(test_layout_from_quantization)
{
    for (int i = 0; i < 4; i++) {
        const fp4rl_dtype f = QFMTS[i];
        const fp4rl_format_traits t = fp4rl_format_of(f);
        for (int extra = 0; extra <= 1; extra++) {
            const int64_t C = t.block + extra;
            float *x = malloc((size_t)C * sizeof *x);
            for (int64_t c = 0; c < C; c++) x[c] = 0.25f * (float)(c % 5) + 0.5f;
            fp4rl_tensor *src = mk_f32(ctx, 1, C, x), *q = quant(ctx, src, f, 0, 0, 0);
            int tile = -1;
            size_t cb = 0, sb = 0;
            float g = 0;
            OK(fp4rl_tensor_quant_info(q, &tile, &cb, &sb, &g));
            ck_assert_int_eq(tile, 0);
            /* one block fills exactly one scale; one more element opens a second */
            ck_assert_uint_eq(sb, (size_t)(1 + extra) * (size_t)t.scale_bytes);
            ck_assert_uint_eq(cb, (size_t)((C * t.code_bits + 7) / 8));
            ck_assert_int_eq(g != 1.0f, t.tensor_scale);
            fp4rl_qdesc d;
            ck_assert(fp4rl_qdesc_make(&d, f, 1, C, 0));
            ck_assert_int_eq(d.block, t.block);
            ck_assert_int_eq(d.scale_elem_bytes, t.scale_bytes);
            fp4rl_tensor_destroy(q);
            fp4rl_tensor_destroy(src);
            free(x);
        }
    }
}
END_TEST

/* The allowed tiles agree with the tensor layer's check, and with quantization itself. */
/* The tensor layer's layout (fp4rl_qdesc_make, from the traits and layout.h) is the one the formats
 * were first written with: 64-element HiF4 row words, 16 / 32-element byte scales per block or per
 * tile, two 4-bit codes a byte. */
START_TEST(test_qdesc_layout)
{
    const int64_t dims[] = {1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200};
    const int nd = (int)(sizeof dims / sizeof dims[0]);
    for (int i = 0; i < 4; i++)
        for (int tile = 0; tile <= 64; tile = tile ? tile * 2 : 16)
            for (int a = 0; a < nd; a++)
                for (int b = 0; b < nd; b++) {
                    const fp4rl_dtype f = QFMTS[i];
                    const int64_t R = dims[a], C = dims[b];
                    if (!fp4rl_format_tile_ok(f, tile)) continue;
                    const int hif4 = f == FP4RL_DTYPE_HIF4, block = hif4 ? 64 : f == FP4RL_DTYPE_NVFP4 ? 16 : 32;
                    fp4rl_qdesc d;
                    ck_assert(fp4rl_qdesc_make(&d, f, R, C, tile));
                    ck_assert_int_eq(d.block, block);
                    ck_assert_int_eq(d.row_bytes, f == FP4RL_DTYPE_MXFP8_E4M3 ? C : (C + 1) / 2);
                    ck_assert_int_eq(d.scale_rows, hif4 || !tile ? R : (R + tile - 1) / tile);
                    ck_assert_int_eq(d.scale_cols, hif4 ? (C + 63) / 64 : (C + (tile ? tile : block) - 1) / (tile ? tile : block));
                    ck_assert_int_eq(d.scale_elem_bytes, hif4 ? 4 : 1);
                }
    fp4rl_qdesc d;
    ck_assert(!fp4rl_qdesc_make(&d, FP4RL_DTYPE_F32, 4, 4, 0)); /* a dense dtype has no layout */
    char buf[32];
    ck_assert_str_eq(fp4rl_format_tiles_str(FP4RL_DTYPE_HIF4, "", buf, sizeof buf), "64");
    ck_assert_str_eq(fp4rl_format_tiles_str(FP4RL_DTYPE_NVFP4, "0", buf, sizeof buf), "0, 16, 32, 64");
    ck_assert_str_eq(fp4rl_format_tiles_str(FP4RL_DTYPE_BF16, "0", buf, sizeof buf), "0");
}
END_TEST

START_TEST(test_tiles)
{
    const int64_t tiles[] = {-64, -1, 0, 1, 8, 16, 24, 32, 48, 64, 128};
    for (int i = 0; i < 7; i++)
        for (size_t k = 0; k < sizeof tiles / sizeof tiles[0]; k++) {
            const fp4rl_dtype d = ALL_DTYPES[i];
            if (!fp4rl_dtype_is_quantized(d)) {
                ck_assert(!fp4rl_format_tile_ok(d, tiles[k]));
                continue;
            }
            const int64_t t = tiles[k];
            const int spec = t == 0 || (d == FP4RL_DTYPE_HIF4 ? t == 64 : t == 16 || t == 32 || t == 64);
            ck_assert_msg(fp4rl_format_tile_ok(d, t) == spec, "%s tile %lld", fp4rl_dtype_name(d), (long long)t);
        }
    /* what the spec allows: HiF4 1D or 64 x 64, the others 16, 32 or 64 */
    ck_assert(fp4rl_format_tile_ok(FP4RL_DTYPE_HIF4, 64) && !fp4rl_format_tile_ok(FP4RL_DTYPE_HIF4, 32) &&
              !fp4rl_format_tile_ok(FP4RL_DTYPE_HIF4, 16));
    for (int i = 0; i < 4; i++)
        for (int tile = 16; tile <= 64; tile *= 2) {
            const fp4rl_dtype f = QFMTS[i];
            float x[64 * 64];
            for (int k = 0; k < 64 * 64; k++) x[k] = (float)(k % 9) - 4.0f;
            fp4rl_tensor *src = mk_f32(ctx, 64, 64, x), *q = NULL;
            fp4rl_quant_policy *p = NULL;
            OK(fp4rl_quant_policy_create(&p));
            OK(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile)); /* MXFP4 takes every tile */
            const fp4rl_status st = fp4rl_quantize(&q, ctx, src, f, p, FP4RL_ROLE_WEIGHT);
            ck_assert_int_eq(st == FP4RL_OK, fp4rl_format_tile_ok(f, tile));
            fp4rl_tensor_destroy(q);
            fp4rl_quant_policy_destroy(p);
            fp4rl_tensor_destroy(src);
        }
}
END_TEST

/* BF16 exactness by brute force over every element code and every scale. */
START_TEST(test_bf16_exactness)
{
    int exact[4][2]; /* [format][unscaled, with the tensor scale] */
    for (int i = 0; i < 4; i++) exact[i][0] = exact[i][1] = 1;
    for (unsigned s = 0; s < 255; s++) /* E8M0: every non-NaN scale */
        for (unsigned c = 0; c < 256; c++) {
            if (c < 16 && !is_bf16(fp4rl_mx_decode((uint8_t)c, (uint8_t)s, 0))) exact[0][0] = 0;
            if (!is_bf16(fp4rl_mx_decode((uint8_t)c, (uint8_t)s, 1))) exact[3][0] = 0;
        }
    for (unsigned s = 0; s < 0x7F; s++) /* UE4M3: every non-NaN scale */
        for (unsigned c = 0; c < 16; c++) {
            if (!is_bf16(fp4rl_nvfp4_decode_unscaled((uint8_t)c, (uint8_t)s))) exact[1][0] = 0;
            /* with the tensor scale g of a few tensors' maxima: some value is not BF16 */
            const float amax[3] = {1.0f, 3.0f, 1000.0f};
            for (int a = 0; a < 3; a++)
                if (!is_bf16(fp4rl_nvfp4_decode((uint8_t)c, (uint8_t)s, fp4rl_nvfp4_tensor_scale(amax[a])))) exact[1][1] = 0;
        }
    for (uint32_t base = 0; base < 0xFF; base++) /* HiF4: every base, every increment, every code */
        for (uint32_t bits = 0; bits < 4; bits++) {
            const uint32_t w = base | fp4rl_hif4_e8_at(bits & 1u, 0) | fp4rl_hif4_e16_at(bits >> 1, 0);
            for (unsigned c = 0; c < 16; c++)
                if (!is_bf16(fp4rl_hif4_decode((uint8_t)c, w, 0))) exact[2][0] = 0;
        }
    exact[0][1] = exact[0][0], exact[2][1] = exact[2][0], exact[3][1] = exact[3][0]; /* no tensor scale */
    for (int i = 0; i < 4; i++) {
        const fp4rl_format_traits t = fp4rl_format_of(QFMTS[i]);
        ck_assert_msg(t.bf16_exact_unscaled == exact[i][0], "%s: unscaled BF16 exactness is %d", t.name, exact[i][0]);
        ck_assert_msg(t.bf16_exact == exact[i][1], "%s: BF16 exactness is %d", t.name, exact[i][1]);
    }
    /* what the table says, spelled out: the FP4 formats widen to BF16 exactly (NVFP4 without g), MXFP8 may not */
    ck_assert(exact[0][1] && exact[2][1] && exact[1][0] && !exact[1][1] && !exact[3][0]);
}
END_TEST

/* The HiF4 word accessors are the spec's formula: bits 7..0 base, 8 + j/8 e8, 16 + j/4 e16. */
START_TEST(test_hif4_word_bits)
{
    trng r = trng_make(11);
    for (int n = 0; n < 2000; n++) {
        const uint32_t w = (uint32_t)trng_u64(&r);
        ck_assert_uint_eq(fp4rl_hif4_word_base_bits(w), w & 0xFFu);
        uint32_t rebuilt = fp4rl_hif4_word_base_bits(w);
        for (int h = 0; h < 8; h++) rebuilt |= fp4rl_hif4_e8_at(fp4rl_hif4_word_e8(w, h), h);
        for (int g = 0; g < 16; g++) rebuilt |= fp4rl_hif4_e16_at(fp4rl_hif4_word_e16(w, g), g);
        ck_assert_uint_eq(rebuilt, w);
        for (int j = 0; j < 64; j++)
            ck_assert_int_eq(fp4rl_hif4_word_inc(w, j), (int)((w >> (8 + j / 8)) & 1u) + (int)((w >> (16 + j / 4)) & 1u));
    }
    /* spec vector A's word: e8[0], e16[0] and e16[2] set */
    const uint32_t a = 0x000501C0u;
    ck_assert_int_eq(fp4rl_hif4_word_inc(a, 0), 2);
    ck_assert_int_eq(fp4rl_hif4_word_inc(a, 8), 1);
    ck_assert_int_eq(fp4rl_hif4_word_inc(a, 16), 0);
    ck_assert_uint_eq(FP4RL_HIF4_NAN_WORD, 0xFFu);
    /* element and word indexing: unit 1 of row 2 in a tensor of 3 words a row */
    ck_assert_int_eq(fp4rl_hif4_word_index(3, 2, 64 + 5), 2 * 3 + 1);
    ck_assert_int_eq(fp4rl_hif4_unit_pos(64 + 5), 5);
    ck_assert_int_eq(fp4rl_scale_index(0, 32, 4, 1, 70), 4 + 2);
    ck_assert_int_eq(fp4rl_scale_index(16, 32, 4, 33, 50), 2 * 4 + 3);
    uint8_t codes[4] = {0, 0, 0, 0};
    fp4rl_code_put(codes, 2, 4, 1, 1, 0xA);
    fp4rl_code_put(codes, 2, 4, 1, 0, 0x5);
    ck_assert_uint_eq(codes[2], 0xA5); /* element 2k in the low nibble */
    ck_assert_uint_eq(fp4rl_code_get(codes, 2, 4, 1, 1), 0xA);
    fp4rl_code_put(codes, 2, 8, 0, 1, 0x7E);
    ck_assert_uint_eq(codes[1], 0x7E);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("format_traits");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_names_and_kinds);
    tcase_add_test(tc, test_element_max);
    tcase_add_test(tc, test_layout_from_quantization);
    tcase_add_test(tc, test_qdesc_layout);
    tcase_add_test(tc, test_tiles);
    tcase_add_test(tc, test_bf16_exactness);
    tcase_add_test(tc, test_hif4_word_bits);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
