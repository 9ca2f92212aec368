/*
 * test_w4b_layout.c - the HiF4 re-layout of the W4B decode GEMM (core/format/w4b_layout.h) on the
 * CPU: for HiF4 weights (1D and 64 x 64 words, ragged N, extreme row scales, NaN units), the
 * layout is packed here by the functions the CUDA pack kernels call, and the kernel's register
 * arithmetic is replayed for every thread, step and A register of every tile and chunk (the
 * BF16x2 OR, the increments by mask and multiply-add, the FMA with the scale and -136 times it,
 * evaluated exactly in double and required to be a BF16 value): every element must come out as
 * fp4rl_hif4_decode's value of the stored code and word (NaN for NaN units, zeros of either sign
 * as zero), and every element of the weight must be reached exactly once. A wrong bit position,
 * rotation, nibble or fragment index fails here without a GPU. MXFP4 likewise (its code words are the
 * codes, its words the two 32-k units' multipliers), against fp4rl_dequantize, BF16 subnormals
 * included; NVFP4 too (its words the four 16-k blocks' multiplier bytes, the tensor scale as
 * alpha), zero, subnormal and NaN block scales included.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "format/formats.h"
#include "format/w4b_layout.h"
#include "runtime/internal.h"

#define OK(call) ck_assert_msg((call) == FP4RL_OK, "%s: %s", #call, fp4rl_last_error())

#define TEST_RAND_SEED 0x2545F4914F6CDD1Dull
#include "test_rand.h"

/* One BF16 half of a 32-bit word as a double. */
static double half_val(uint32_t w, int hi) { return (double)fp4rl_bf16_to_f32((uint16_t)(hi ? w >> 16 : w & 0xFFFFu)); }
/* The BF16x2 product a * b rounded to BF16 per half (the kernel's mul.rn.bf16x2), checked exact. */
static uint32_t bmul2(uint32_t a, uint32_t b)
{
    uint32_t r = 0;
    for (int h = 0; h < 2; h++) {
        const double p = half_val(a, h) * half_val(b, h);
        const uint16_t q = fp4rl_f32_to_bf16((float)p);
        if (!isnan(p)) ck_assert_msg((double)fp4rl_bf16_to_f32(q) == p, "-136 times the base is exact in BF16");
        r |= (uint32_t)q << (16 * h);
    }
    return r;
}

/* x [N, K] quantized on the CPU context in format fmt (tile for the weight role). */
static fp4rl_tensor *quantize(fp4rl_context *ctx, const float *x, int64_t N, int64_t K, fp4rl_dtype fmt, int tile)
{
    const int64_t shape[2] = {N, K};
    fp4rl_tensor *src = NULL, *q = NULL;
    OK(fp4rl_tensor_from_host(&src, ctx, FP4RL_DTYPE_F32, 2, shape, x));
    fp4rl_quant_policy *p = NULL;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile));
    OK(fp4rl_quantize(&q, ctx, src, fmt, p, FP4RL_ROLE_WEIGHT));
    fp4rl_quant_policy_destroy(p);
    fp4rl_tensor_destroy(src);
    return q;
}
/* The re-layout's code words of q (HiF4, MXFP4 or NVFP4), as the CUDA pack kernels make them; *n their count. */
static uint32_t *pack_codes(const fp4rl_tensor *q, int64_t *n)
{
    const int64_t chunks = q->q.cols / 64, tiles = (q->q.rows + 63) / 64;
    *n = tiles * chunks * FP4RL_W4B_TILE_CODE_BYTES / 4;
    uint32_t *pc = malloc((size_t)*n * 4);
    for (int64_t i = 0; i < *n; i++)
        pc[i] = q->dtype == FP4RL_DTYPE_NVFP4
                    ? fp4rl_w4b_pack_nv_codes(q->data, q->q.row_bytes, q->scales, q->q.tile, q->q.scale_cols, q->q.rows, chunks, i)
                    : fp4rl_w4b_pack_codes(q->data, q->q.row_bytes, q->q.rows, chunks, i, q->dtype == FP4RL_DTYPE_HIF4);
    return pc;
}

static void check_weight(fp4rl_context *ctx, int tile, int64_t N, int64_t K)
{
    float *x = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t r = 0; r < N; r++) {
        const float rs = ldexpf(1.0f, (int)(r % 75) - 60);
        for (int64_t k = 0; k < K; k++) x[r * K + k] = rs * gauss() * (1.0f + (float)(k % 7)) * (k % 13 == 0 ? 0.0f : 1.0f);
    }
    for (int64_t i = 5; i < N * K; i += tile ? N * K : 977) x[i] = NAN; /* 2D: one tile NaN, not all */
    fp4rl_tensor *q = quantize(ctx, x, N, K, FP4RL_DTYPE_HIF4, tile);
    const uint8_t *codes = q->data;
    const uint32_t *words = q->scales;
    const int64_t chunks = K / 64, tiles = (N + 63) / 64;

    /* the pack, by the functions the CUDA pack kernels call */
    int64_t ncw;
    uint32_t *pc = pack_codes(q, &ncw);
    const int64_t nww = tiles * chunks * FP4RL_W4B_TILE_WORD_BYTES / 4;
    uint32_t *pwd = malloc((size_t)nww * 4);
    for (int64_t i = 0; i < nww; i++) pwd[i] = fp4rl_w4b_pack_word(words, q->q.scale_cols, N, chunks, i);

    /* the kernel's arithmetic, thread by thread */
    unsigned char *seen = calloc((size_t)(N * K), 1);
    int64_t nans = 0, zeros = 0;
    for (int64_t tc = 0; tc < tiles * chunks; tc++)
        for (int w = 0; w < 4; w++)
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane >> 2, t = lane & 3;
                const fp4rl_w4b_th thc = fp4rl_w4b_th_of(t >> 1);
                const int64_t wi = (tc * 4 + w) * 16 + g * 2; /* words of rows g, g + 8 */
                uint32_t b2[2], c2[2], z[2];
                for (int hh = 0; hh < 2; hh++) {
                    b2[hh] = fp4rl_w4b_base2(pwd[wi + hh]);
                    c2[hh] = bmul2(b2[hh], FP4RL_W4B_NEG136);
                    z[hh] = fp4rl_w4b_incs(pwd[wi + hh], thc);
                }
                for (int s = 0; s < 4; s++) {
                    const int64_t ci = ((tc * 4 + w) * 32 + lane) * 4 + s;
                    const uint32_t y = pc[ci];
                    for (int j = 0; j < 4; j++) {
                        const int hh = j & 1;
                        const uint32_t zm = z[hh] & fp4rl_w4b_step_mask(s);
                        const uint32_t sc = zm * fp4rl_w4b_step_mul(s) + b2[hh], cc = zm * fp4rl_w4b_step_mul(s) + c2[hh];
                        const uint32_t xr = ((y >> (4 * j)) & 0x000F000Fu) | FP4RL_W4B_MAGIC;
                        int64_t row, k;
                        fp4rl_w4b_code_pos(ci, chunks, j, &row, &k);
                        for (int e = 0; e < 2; e++) { /* the register's halves: elements k, k + 1; scale half j >> 1 */
                            const double v = half_val(xr, e) * half_val(sc, j >> 1) + half_val(cc, j >> 1);
                            if (row >= N) continue;
                            const int64_t kk = k + e;
                            const float want = fp4rl_hif4_decode(fp4rl_code_get(codes, q->q.row_bytes, 4, row, kk),
                                                                 words[row * q->q.scale_cols + kk / 64], fp4rl_hif4_unit_pos(kk));
                            ck_assert_msg(!seen[row * K + kk]++, "element (%lld, %lld) reached twice", (long long)row, (long long)kk);
                            if (isnan(want)) {
                                ck_assert_msg(isnan(v), "tile %d %lldx%lld: (%lld, %lld) should be NaN", tile, (long long)N, (long long)K,
                                              (long long)row, (long long)kk);
                                nans++;
                                continue;
                            }
                            ck_assert_msg(v == (double)want && (double)fp4rl_round_bf16((float)v) == v,
                                          "tile %d %lldx%lldx: (%lld, %lld) = %a, the stored weight %a", tile, (long long)N, (long long)K,
                                          (long long)row, (long long)kk, v, (double)want);
                            zeros += want == 0.0f;
                        }
                    }
                }
            }
    for (int64_t i = 0; i < N * K; i++) ck_assert_msg(seen[i] == 1, "element %lld not reached", (long long)i);
    ck_assert_msg(nans > 0 && zeros > 0, "the weight has NaN units (%lld) and zeros (%lld)", (long long)nans, (long long)zeros);
    free(seen);
    free(pc);
    free(pwd);
    free(x);
    fp4rl_tensor_destroy(q);
}

/* MXFP4 (1D and 32 x 32 tiles, scales within FP4RL_W4B_MX_MAX_SCALE, rows down to 2^-60): the code
 * words as HiF4's with the codes themselves, the word the two multipliers; every register's two
 * BF16 values times its multiplier half must be fp4rl_dequantize's value exactly. NVFP4 (1D and
 * 16 x 16 tiles; rows (tiles) from 2^-40 to 1, so zero and subnormal UE4M3 scales; NaN blocks): the word
 * the four blocks' multiplier bytes, the product an exact BF16 that times alpha = g 2^10 (one FP32
 * rounding, the kernel's epilogue) is fp4rl_dequantize's value. */
static void check_weight_e2m1(fp4rl_context *ctx, fp4rl_dtype fmt, int tile, int64_t N, int64_t K)
{
    const int nv = fmt == FP4RL_DTYPE_NVFP4;
    float *x = malloc((size_t)(N * K) * sizeof(float));
    for (int64_t r = 0; r < N; r++) {
        const int64_t rb = tile ? r / tile : r; /* 2D: one scale a tile */
        const float rs = nv ? ldexpf(1.0f, -(int)((rb * 17) % 41))
                            : ldexpf(1.0f, rb % 3 == 1 ? -128 : (int)(rb % 58) - 60); /* amax < 2^2: scale codes <= 128; scale code 0 too */
        for (int64_t k = 0; k < K; k++) x[r * K + k] = rs * gauss() * (1.0f + (float)(k % 3)) * (k % 13 == 0 ? 0.0f : 1.0f);
    }
    if (nv)
        for (int64_t i = 5; i < N * K; i += 977) x[i] = NAN;
    fp4rl_tensor *q = quantize(ctx, x, N, K, fmt, tile), *dq = NULL;
    OK(fp4rl_dequantize(&dq, ctx, q, FP4RL_DTYPE_F32));
    const float *want = dq->data;
    const uint8_t *sc = q->scales;
    const float alpha = q->tensor_scale * 0x1p10f;
    if (!nv)
        for (size_t i = 0; i < q->scales_bytes; i++) ck_assert_uint_le(sc[i], FP4RL_W4B_MX_MAX_SCALE);
    const int64_t chunks = K / 64, tiles = (N + 63) / 64;
    int64_t ncw;
    uint32_t *pc = pack_codes(q, &ncw);
    const int64_t nww = tiles * chunks * FP4RL_W4B_TILE_WORD_BYTES / 4;
    uint32_t *pwd = malloc((size_t)nww * 4);
    for (int64_t i = 0; i < nww; i++)
        pwd[i] = nv ? fp4rl_w4b_pack_nv_word(sc, tile, q->q.scale_cols, N, chunks, i) : fp4rl_w4b_pack_mx_word(sc, tile, q->q.scale_cols, N, chunks, i);
    unsigned char *seen = calloc((size_t)(N * K), 1);
    int64_t zeros = 0, subnormal = 0, nans = 0;
    for (int64_t tc = 0; tc < tiles * chunks; tc++)
        for (int w = 0; w < 4; w++)
            for (int lane = 0; lane < 32; lane++)
                for (int s = 0; s < 4; s++) {
                    const int64_t ci = ((tc * 4 + w) * 32 + lane) * 4 + s;
                    for (int j = 0; j < 4; j++) {
                        const uint32_t xr = fp4rl_w4b_mx_elems(pc[ci], j), wd = pwd[(tc * 4 + w) * 16 + (lane >> 2) * 2 + (j & 1)];
                        const uint32_t mw = nv ? fp4rl_w4b_nv_mult2(wd, s & 1) : wd; /* the step's multiplier in half s >> 1 */
                        int64_t row, k;
                        fp4rl_w4b_code_pos(ci, chunks, j, &row, &k);
                        for (int e = 0; e < 2 && row < N; e++) {
                            const double v = half_val(xr, e) * half_val(mw, s >> 1), wv = want[row * K + k + e];
                            const double got = nv ? (double)(float)(v * (double)alpha) : v; /* v alpha: exact in double, then binary32 */
                            ck_assert_msg(!seen[row * K + k + e]++, "element (%lld, %lld) reached twice", (long long)row, (long long)(k + e));
                            ck_assert_msg(isnan(wv) ? isnan(got) : got == wv && (double)fp4rl_round_bf16((float)v) == v,
                                          "%s tile %d %lldx%lld: (%lld, %lld) = %a, the stored weight %a", fp4rl_dtype_name(fmt), tile, (long long)N,
                                          (long long)K, (long long)row, (long long)(k + e), got, wv);
                            zeros += wv == 0.0;
                            nans += isnan(wv);
                            subnormal += wv != 0.0 && fabs(nv ? v : wv) < 0x1p-126;
                        }
                    }
                }
    for (int64_t i = 0; i < N * K; i++) ck_assert_msg(seen[i] == 1, "element %lld not reached", (long long)i);
    ck_assert_msg(zeros > 0 && (subnormal > 0 || nv), "the weight has zeros (%lld) and BF16 subnormals (%lld)", (long long)zeros, (long long)subnormal);
    if (nv) { /* the scale paths the multiplier bytes cover: zero, subnormal and normal UE4M3, NaN */
        int kinds[4] = {0, 0, 0, 0};
        for (size_t i = 0; i < q->scales_bytes; i++) kinds[sc[i] == 0 ? 0 : sc[i] < 8 ? 1 : sc[i] == FP4RL_UE4M3_NAN ? 3 : 2]++;
        ck_assert_msg(kinds[0] && kinds[1] && kinds[2] && kinds[3] && nans, "NVFP4 scales: %d zero, %d subnormal, %d normal, %d NaN", kinds[0], kinds[1],
                      kinds[2], kinds[3]);
    }
    free(seen);
    free(pc);
    free(pwd);
    free(x);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(dq);
}

/* check_weight_e2m1 over the shapes, 1D and 2D tiles of the format. */
static void check_e2m1(fp4rl_dtype fmt, int tile2d)
{
    fp4rl_context *ctx = NULL;
    OK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0));
    static const int64_t shapes[][2] = {{77, 64}, {130, 320}, {300, 192}};
    for (int tile = 0; tile <= tile2d; tile += tile2d)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_weight_e2m1(ctx, fmt, tile, shapes[i][0], shapes[i][1]);
    fp4rl_context_destroy(ctx);
}
START_TEST(test_layout_decodes_mxfp4) { check_e2m1(FP4RL_DTYPE_MXFP4, 32); }
END_TEST
START_TEST(test_layout_decodes_nvfp4) { check_e2m1(FP4RL_DTYPE_NVFP4, 16); }
END_TEST

/* Every UE4M3 code: its multiplier byte gives s * 2^116 as a BF16 (NaN for the NaN code), both
 * halves of the pair from the word's bytes. */
START_TEST(test_nv_multipliers)
{
    for (uint32_t c = 0; c < 256; c++) {
        const uint32_t q = fp4rl_w4b_nv_q(c);
        ck_assert_uint_lt(q, 256);
        const uint32_t w = q << 8 | fp4rl_w4b_nv_q(0x5A) << 24, m = fp4rl_w4b_nv_mult2(w, 1); /* block 1 (low half) and 3 (high) */
        const double want = (c & 0x7Fu) == FP4RL_UE4M3_NAN ? NAN : (double)fp4rl_ue4m3_decode((uint8_t)c) * 0x1p116;
        const double got = half_val(m, 0);
        if (isnan(want)) ck_assert_msg(isnan(got), "code %u: NaN", c);
        else if (want != 0.0) ck_assert_msg(got == want, "code %u: %a, want %a", c, got, want);
        else ck_assert_msg(isfinite(got), "code 0: finite (its codes are zeroed)");
        ck_assert(half_val(m, 1) == (double)fp4rl_ue4m3_decode(0x5A) * 0x1p116);
    }
}
END_TEST

START_TEST(test_layout_decodes_the_weight)
{
    fp4rl_context *ctx = NULL;
    OK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0));
    static const int64_t shapes[][2] = {{77, 64}, {130, 320}, {300, 192}, {64, 2048}};
    for (int tile = 0; tile <= 64; tile += 64)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_weight(ctx, tile, shapes[i][0], shapes[i][1]);
    fp4rl_context_destroy(ctx);
}
END_TEST

/* Every base and increment pattern: the word's re-arranged bits give each thread e8 + e16 of each
 * of its element pairs, the base as BF16 base / 4, the NaN word NaN with no increments. */
START_TEST(test_word_bits)
{
    for (uint32_t it = 0; it < 200000; it++) {
        uint32_t w = (uint32_t)(unif() * 4294967296.0);
        if (it < 256) w = (w & ~0xFFu) | it; /* every base */
        const uint32_t pw = fp4rl_w4b_word(w);
        const int nan = (w & 0xFFu) == FP4RL_HIF4_NAN_WORD;
        ck_assert_uint_eq(pw & 0xFFu, w & 0xFFu);
        if (nan) {
            ck_assert_uint_eq(pw, FP4RL_HIF4_NAN_WORD);
            ck_assert(isnan(half_val(fp4rl_w4b_base2(pw), 0)) && isnan(half_val(fp4rl_w4b_base2(pw), 1)));
            continue;
        }
        for (int h = 0; h < 2; h++) ck_assert(half_val(fp4rl_w4b_base2(pw), h) == (double)fp4rl_hif4_word_base(w) * 0.25);
        for (int t = 0; t < 4; t++) {
            const uint32_t z = fp4rl_w4b_incs(pw, fp4rl_w4b_th_of(t >> 1));
            for (int s = 0; s < 4; s++)
                for (int half = 0; half < 2; half++) {
                    const uint32_t f = (z >> (2 * s + 16 * half)) & 3u;
                    const int j = 16 * s + 2 * t + 8 * half; /* the pair's first element in the unit */
                    ck_assert_uint_eq(f, (uint32_t)fp4rl_hif4_word_inc(w, j));
                    ck_assert_uint_eq(f, (uint32_t)fp4rl_hif4_word_inc(w, j + 1));
                }
        }
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("w4b_layout");
    TCase *tc = tcase_create("w4b_layout");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_word_bits);
    tcase_add_test(tc, test_layout_decodes_the_weight);
    tcase_add_test(tc, test_layout_decodes_mxfp4);
    tcase_add_test(tc, test_layout_decodes_nvfp4);
    tcase_add_test(tc, test_nv_multipliers);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
