/*
 * test_formats.c - element and scale math of shared/spec/formats.md, and its test vectors.
 *
 * The element-level checks call core/format/formats.h (the shared header the CPU reference and the CUDA
 * kernels both use) and compare it with an independent model in fmt_test_util.h (decoded tables
 * written from the spec's bit layouts, nearest-even by search). The spec vectors and the element
 * conversions are also checked end to end through the public API.
 */
#include <float.h>

#include "fmt_test_util.h"
#include "format/formats.h"

static fp4rl_context *ctx;
static void setup(void)
{
    ref_tables_init();
    OK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0));
}
static void teardown(void) { fp4rl_context_destroy(ctx); }

/* ================================ element formats ============================================ */

START_TEST(test_e2m1_decode_table)
{
    static const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (unsigned c = 0; c < 16; c++) {
        float v = fp4rl_e2m1_decode((uint8_t)c);
        ck_assert_msg(f32_bits(v) == f32_bits(want[c]), "E2M1 code 0x%x decodes to %a, want %a", c, (double)v, (double)want[c]);
        ck_assert_msg((double)v == ref_e2m1((uint8_t)c), "E2M1 code 0x%x", c);
    }
    ck_assert(signbit(fp4rl_e2m1_decode(0x8))); /* -0 keeps its sign */
}
END_TEST

START_TEST(test_e2m1_roundtrip_all_codes)
{
    for (unsigned c = 0; c < 16; c++) {
        float v = fp4rl_e2m1_decode((uint8_t)c);
        ck_assert_msg(fp4rl_e2m1_encode(v, -1.0f) == c, "E2M1 code 0x%x -> %g -> 0x%x", c, (double)v, fp4rl_e2m1_encode(v, -1.0f));
        /* stochastic rounding of an exact grid value never moves it, whatever u */
        ck_assert_uint_eq(fp4rl_e2m1_encode(v, 0.0f), c);
        ck_assert_uint_eq(fp4rl_e2m1_encode(v, 0.999999f), c);
    }
}
END_TEST

START_TEST(test_e4m3_decode_table)
{
    for (unsigned c = 0; c < 256; c++) {
        float v = fp4rl_e4m3_decode((uint8_t)c);
        double w = ref_e4m3((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            ck_assert_msg(isnan(v), "E4M3 0x%02x must be NaN", c);
            continue;
        }
        ck_assert_msg((double)v == w && !signbit(v) == !signbit(w), "E4M3 0x%02x decodes to %a, want %a", c, (double)v, w);
    }
    /* spot values from the spec's table */
    ck_assert(fp4rl_e4m3_decode(0x7e) == 448.0f);
    ck_assert(fp4rl_e4m3_decode(0x01) == 0x1p-9f);
    ck_assert(fp4rl_e4m3_decode(0x08) == 0x1p-6f);
    ck_assert(fp4rl_e4m3_decode(0x38) == 1.0f);
    ck_assert(fp4rl_e4m3_decode(0xfe) == -448.0f);
}
END_TEST

START_TEST(test_e4m3_roundtrip_all_codes)
{
    for (unsigned c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue;
        float v = fp4rl_e4m3_decode((uint8_t)c);
        ck_assert_msg(fp4rl_e4m3_encode(v, -1.0f) == c, "E4M3 code 0x%02x -> %a -> 0x%02x", c, (double)v, fp4rl_e4m3_encode(v, -1.0f));
        ck_assert_uint_eq(fp4rl_e4m3_encode(v, 0.5f), c);
    }
}
END_TEST

/* The ties listed in the issue, then every midpoint between adjacent E2M1 values and its
 * neighbours one f32 ulp away, then a dense sweep and random values, against the search model. */
START_TEST(test_e2m1_rne_ties_and_sweep)
{
    static const struct { float x; float want; } ties[] = {
        {0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f}, {2.5f, 2.0f}, {3.5f, 4.0f}, {5.0f, 4.0f},
        {-0.25f, -0.0f}, {-0.75f, -1.0f}, {-1.25f, -1.0f}, {-1.75f, -2.0f}, {-2.5f, -2.0f}, {-3.5f, -4.0f}, {-5.0f, -4.0f},
    };
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++) {
        float got = fp4rl_e2m1_decode(fp4rl_e2m1_encode(ties[i].x, -1.0f));
        ck_assert_msg(f32_bits(got) == f32_bits(ties[i].want), "E2M1 RNE(%g) = %g, want %g", (double)ties[i].x, (double)got,
                      (double)ties[i].want);
    }
    int n = 0;
    for (int k = 0; k + 1 < 8; k++) {
        float mid = (float)((E2M1_MAG[k] + E2M1_MAG[k + 1]) / 2);
        float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int s = 0; s < 2; s++)
            for (int j = 0; j < 3; j++) {
                float v = s ? -probes[j] : probes[j];
                uint8_t got = fp4rl_e2m1_encode(v, -1.0f), want = ref_e2m1_encode(v);
                ck_assert_msg(got == want, "E2M1 RNE(%a): 0x%x, model 0x%x", (double)v, got, want);
                n++;
            }
    }
    ck_assert_int_eq(n, 42);
    for (float v = -8.0f; v <= 8.0f; v += 1.0f / 64) /* exact steps: hits every tie again */
        ck_assert_msg(fp4rl_e2m1_encode(v, -1.0f) == ref_e2m1_encode(v), "E2M1 RNE(%g)", (double)v);
    trng r = trng_make(1);
    for (int i = 0; i < 20000; i++) {
        float v = (float)((trng_unif(&r) * 2 - 1) * 7.0);
        ck_assert_msg(fp4rl_e2m1_encode(v, -1.0f) == ref_e2m1_encode(v), "E2M1 RNE(%a)", (double)v);
    }
    /* satfinite: beyond the max is the max, never anything else */
    ck_assert_uint_eq(fp4rl_e2m1_encode(6.5f, -1.0f), 0x7);
    ck_assert_uint_eq(fp4rl_e2m1_encode(7.0f, -1.0f), 0x7);
    ck_assert_uint_eq(fp4rl_e2m1_encode(1e30f, -1.0f), 0x7);
    ck_assert_uint_eq(fp4rl_e2m1_encode(-FLT_MAX, -1.0f), 0xF);
    ck_assert_uint_eq(fp4rl_e2m1_encode(7.0f, 0.0f), 0x7); /* stochastic saturates too */
}
END_TEST

START_TEST(test_e4m3_rne_all_midpoints)
{
    int n = 0;
    for (int k = 0; k + 1 < 127; k++) {
        double lo = E4M3_MAG[k], hi = E4M3_MAG[k + 1];
        float mid = (float)((lo + hi) / 2); /* exact in f32: at most 5 significant bits */
        ck_assert((double)mid == (lo + hi) / 2);
        float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int s = 0; s < 2; s++)
            for (int j = 0; j < 3; j++) {
                float v = s ? -probes[j] : probes[j];
                uint8_t got = fp4rl_e4m3_encode(v, -1.0f), want = ref_e4m3_encode(v);
                ck_assert_msg(got == want, "E4M3 RNE(%a): 0x%02x, model 0x%02x", (double)v, got, want);
                /* the exact midpoint goes to the even code */
                if (j == 0) ck_assert_msg((got & 1) == 0, "E4M3 tie %a went to odd code 0x%02x", (double)v, got);
                n++;
            }
    }
    ck_assert_int_eq(n, 126 * 6);
    trng r = trng_make(2);
    for (int i = 0; i < 50000; i++) {
        /* log-uniform over the whole range, subnormals included */
        float v = (float)(ldexp(1.0 + trng_unif(&r), (int)(trng_unif(&r) * 22) - 12) * (trng_unif(&r) < 0.5 ? -1 : 1));
        if (fabsf(v) > 448.0f) continue;
        ck_assert_msg(fp4rl_e4m3_encode(v, -1.0f) == ref_e4m3_encode(v), "E4M3 RNE(%a)", (double)v);
    }
    /* satfinite: 449, the would-be midpoint 464 and 480 (NaN in a plain cast) all give 448 */
    ck_assert_uint_eq(fp4rl_e4m3_encode(449.0f, -1.0f), 0x7e);
    ck_assert_uint_eq(fp4rl_e4m3_encode(464.0f, -1.0f), 0x7e);
    ck_assert_uint_eq(fp4rl_e4m3_encode(480.0f, -1.0f), 0x7e);
    ck_assert_uint_eq(fp4rl_e4m3_encode(-1e30f, -1.0f), 0xfe);
    ck_assert_uint_eq(fp4rl_e4m3_encode(1e30f, 0.25f), 0x7e);
}
END_TEST

START_TEST(test_subnormal_codes)
{
    /* E2M1: code 1 is the subnormal 0.5; 0.25 is a tie to 0 (even), a hair above goes to 0.5 */
    ck_assert_uint_eq(fp4rl_e2m1_encode(0.5f, -1.0f), 0x1);
    ck_assert_uint_eq(fp4rl_e2m1_encode(-0.5f, -1.0f), 0x9);
    ck_assert_uint_eq(fp4rl_e2m1_encode(nextafterf(0.25f, 1.0f), -1.0f), 0x1);
    ck_assert_uint_eq(fp4rl_e2m1_encode(0.25f, -1.0f), 0x0);
    ck_assert(fp4rl_e2m1_decode(0x1) == 0.5f);
    /* E4M3: 2^-9 is code 1; 2^-10 ties to 0; 3 * 2^-10 ties between codes 1 and 2 -> 2 */
    ck_assert_uint_eq(fp4rl_e4m3_encode(0x1p-9f, -1.0f), 0x01);
    ck_assert_uint_eq(fp4rl_e4m3_encode(0x1p-10f, -1.0f), 0x00);
    ck_assert_uint_eq(fp4rl_e4m3_encode(nextafterf(0x1p-10f, 1.0f), -1.0f), 0x01);
    ck_assert_uint_eq(fp4rl_e4m3_encode(0x3p-10f, -1.0f), 0x02);
    ck_assert_uint_eq(fp4rl_e4m3_encode(0x7p-9f, -1.0f), 0x07);  /* largest subnormal */
    ck_assert_uint_eq(fp4rl_e4m3_encode(0xfp-10f, -1.0f), 0x08); /* tie 7*2^-9 / 2^-6 -> even 0x08 */
    ck_assert_uint_eq(fp4rl_e4m3_encode(-0x1p-9f, -1.0f), 0x81);
    ck_assert(fp4rl_e4m3_decode(0x01) == 0x1p-9f);
    /* negative values rounding to zero keep the sign bit */
    ck_assert_uint_eq(fp4rl_e2m1_encode(-0.1f, -1.0f), 0x8);
    ck_assert_uint_eq(fp4rl_e4m3_encode(-1e-9f, -1.0f), 0x80);
    ck_assert_uint_eq(fp4rl_e2m1_encode(-0.0f, -1.0f), 0x8);
    ck_assert_uint_eq(fp4rl_e4m3_encode(-0.0f, -1.0f), 0x80);
}
END_TEST

/* Stochastic element rounding against the spec's formula: round up iff u < (v - lo) / (hi - lo). */
START_TEST(test_element_stochastic_formula)
{
    trng r = trng_make(3);
    for (int i = 0; i < 20000; i++) {
        float v = (float)(trng_unif(&r) * 6.5), u = (float)(trng_u64(&r) >> 40) * 0x1p-24f;
        unsigned lo, hi;
        ref_grid_bracket(v, E2M1_MAG, 8, &lo, &hi);
        unsigned want = v >= 6.0f ? 7 : (u < (v - E2M1_MAG[lo]) / (E2M1_MAG[hi] - E2M1_MAG[lo]) ? hi : lo);
        ck_assert_msg(fp4rl_e2m1_encode(v, u) == want, "E2M1 SR(%a, u=%a) = %u, want %u", (double)v, (double)u,
                      fp4rl_e2m1_encode(v, u), want);
        float w = (float)ldexp(1.0 + trng_unif(&r), (int)(trng_unif(&r) * 18) - 10);
        if (w < 448.0f) {
            ref_grid_bracket(w, E4M3_MAG, 127, &lo, &hi);
            want = u < (w - E4M3_MAG[lo]) / (E4M3_MAG[hi] - E4M3_MAG[lo]) ? hi : lo;
            ck_assert_msg(fp4rl_e4m3_encode(w, u) == want, "E4M3 SR(%a, u=%a)", (double)w, (double)u);
        }
    }
}
END_TEST

/* u = 0 is a valid uniform (not "nearest"): every value off the grid rounds up. */
START_TEST(test_element_stochastic_u_zero)
{
    ck_assert_uint_eq(fp4rl_e2m1_encode(0.1f, 0.0f), 0x1);
    ck_assert_uint_eq(fp4rl_e2m1_encode(-4.01f, 0.0f), 0xF);
    ck_assert_uint_eq(fp4rl_e2m1_encode(2.0f, 0.0f), 0x4); /* on the grid: stays */
    ck_assert_uint_eq(fp4rl_e4m3_encode(0x1p-12f, 0.0f), 0x01);
    ck_assert_uint_eq(fp4rl_e4m3_encode(1.01f, 0.0f), 0x39);
    ck_assert_uint_eq(fp4rl_hif4_encode(0.01f, 0, 1.0f, 0.0f), 0x1);
    ck_assert_uint_eq(fp4rl_hif4_encode(0.25f, 0, 1.0f, 0.0f), 0x1);
    /* u just below 1: only a ratio above it rounds up */
    ck_assert_uint_eq(fp4rl_e2m1_encode(0.49f, 1.0f - 0x1p-24f), 0x0);
    ck_assert_uint_eq(fp4rl_hif4_encode(0.24f, 0, 1.0f, 1.0f - 0x1p-24f), 0x0);
}
END_TEST

/* Every BF16 value, then a million random binary32 ones around the grids, through the E2M1 and E4M3
 * encoders: nearest against the search model; stochastic against the spec's formula in double,
 * with u on the exact fraction and 2^-24 either side of it, where the strict "u < fraction"
 * decides. The encoders read codes off one binary32 addition (formats.h), so this walks every
 * binade, the subnormal grids, the ties and the saturation of both grids. */
static void check_grid_sr(float v, float u, const double *tab, unsigned n, int e4m3)
{
    const double a = fabs((double)v);
    unsigned lo, hi, want;
    if (a >= tab[n - 1]) {
        want = n - 1;
    } else {
        ref_grid_bracket(a, tab, n, &lo, &hi);
        want = (double)u < (a - tab[lo]) / (tab[hi] - tab[lo]) ? hi : lo; /* hi - lo is a power of two: exact */
    }
    want |= signbit(v) ? (e4m3 ? 0x80u : 0x8u) : 0u;
    const unsigned got = e4m3 ? fp4rl_e4m3_encode(v, u) : fp4rl_e2m1_encode(v, u);
    ck_assert_msg(got == want, "%s SR(%a, u=%a) = 0x%x, want 0x%x", e4m3 ? "E4M3" : "E2M1", (double)v, (double)u, got, want);
}
START_TEST(test_encoders_every_bf16)
{
    trng r = trng_make(11);
    for (uint32_t h = 0; h < 0x10000u + 1000000u; h++) {
        uint32_t b = h << 16;
        if (h >= 0x10000u) /* random sign and mantissa, exponents from 2^-12 to 2^9 */
            b = ((uint32_t)trng_u64(&r) & 0x807fffffu) | ((uint32_t)(115 + trng_u64(&r) % 22) << 23);
        const float x = bits_f32(b);
        if (isnan(x)) continue;
        {
            const float v = x;
            ck_assert_msg(fp4rl_e2m1_encode(v, -1.0f) == ref_e2m1_encode(v), "E2M1 RNE(%a)", (double)v);
            ck_assert_msg(fp4rl_e4m3_encode(v, -1.0f) == ref_e4m3_encode(v), "E4M3 RNE(%a)", (double)v);
            for (int g = 0; g < 2; g++) {
                const double *tab = g ? E4M3_MAG : E2M1_MAG;
                const unsigned n = g ? 127 : 8;
                const double a = fabs((double)v);
                double frac = 0.0;
                if (a < tab[n - 1]) {
                    unsigned lo, hi;
                    ref_grid_bracket(a, tab, n, &lo, &hi);
                    frac = (a - tab[lo]) / (tab[hi] - tab[lo]);
                }
                const double k24 = floor(frac * 0x1p24);
                const double us[4] = {k24, k24 + 1, k24 - 1, (double)((b * 2654435761u) >> 8)};
                for (int i = 0; i < 4; i++)
                    if (us[i] >= 0 && us[i] < 0x1p24) check_grid_sr(v, (float)(us[i] * 0x1p-24), tab, n, g);
            }
        }
    }
}
END_TEST

/* HiF4 elements: every BF16 value, every increment, the reciprocals of every E6M2 base, against
 * step 6 of the spec written out literally in binary32. */
START_TEST(test_hif4_encode_every_bf16)
{
    for (unsigned c = 0; c < 0xFF; c += 3) {
        const float rec = ref_bf16_round(1.0f / fp4rl_hif4_word_base(c));
        for (uint32_t h = 0; h < 0x10000u; h++) {
            const float x = bits_f32(h << 16);
            if (!isfinite(x)) continue;
            for (int inc = 0; inc <= 2; inc++) {
                const float v = (fabsf(x) * (float)ldexp(1.0, -inc)) * rec;
                const float us[4] = {-1.0f, 0.0f, 1.0f - 0x1p-24f, (float)((h * 40503u + c) & 0xffffffu) * 0x1p-24f};
                for (int i = 0; i < 4; i++) {
                    float nf;
                    if (us[i] < 0.0f) {
                        nf = floorf(v * 4.0f + 0.5f);
                    } else if (v >= 1.75f) {
                        nf = 7.0f;
                    } else {
                        const float lo = floorf(v * 4.0f) * 0.25f;
                        nf = us[i] < (v - lo) * 4.0f ? lo * 4.0f + 1.0f : lo * 4.0f;
                    }
                    const unsigned want = (signbit(x) ? 8u : 0u) | (unsigned)(nf > 7.0f ? 7.0f : nf);
                    ck_assert_msg(fp4rl_hif4_encode(x, inc, rec, us[i]) == want, "HiF4(%a, inc %d, rec %a, u %a) = 0x%x, want 0x%x",
                                  (double)x, inc, (double)rec, (double)us[i], fp4rl_hif4_encode(x, inc, rec, us[i]), want);
                }
            }
        }
    }
    /* the base's reciprocal is the spec's bf16(1 / base) for every amax a BF16 value can be */
    for (uint32_t h = 0; h < 0x7f80u; h++) {
        const fp4rl_hif4_base b = fp4rl_hif4_make_base(bits_f32(h << 16));
        ck_assert_msg(f32_bits(b.rec) == f32_bits(ref_bf16_round(1.0f / b.base)), "rec of base %a", (double)b.base);
    }
}
END_TEST

/* The codeless round trip the rollout's activation kernel uses (fp4rl_hif4_qdq_rn) equals
 * decode(encode(x)) bit for bit: every E6M2 base, every increment, every finite BF16 x (a
 * quarter of them, in turn per base) and random binary32 x, both signs and zeros; the result is
 * a BF16 value. */
START_TEST(test_hif4_qdq_rn_every_base)
{
    trng r = trng_make(18);
    for (uint32_t c = 0; c < 0xFFu; c++) {
        const float base = fp4rl_hif4_word_base(c), rec = ref_bf16_round(1.0f / base); /* the spec's step 4 */
        for (uint32_t inc = 0; inc <= 2; inc++) {
            /* the word: base c, element 0's e8 / e16 bits giving inc */
            const uint32_t word = c | fp4rl_hif4_e8_at(inc >= 1, 0) | fp4rl_hif4_e16_at(inc == 2, 0);
            ck_assert_int_eq(fp4rl_hif4_word_inc(word, 0), (int)inc);
            const float screc = fp4rl_hif4_inc_scale(inc) * rec, step = fp4rl_hif4_step(base, inc);
            for (uint32_t i = 0; i < 0x4000u + 4096u; i++) {
                const float x = i < 0x4000u ? bits_f32((4 * i + (c & 3u)) << 16) : bits_f32((uint32_t)trng_u64(&r));
                if (!isfinite(x)) continue;
                const float want = fp4rl_hif4_decode(fp4rl_hif4_encode(x, (int)inc, rec, -1.0f), word, 0);
                const float got = fp4rl_hif4_qdq_rn(x, screc, step);
                ck_assert_msg(f32_bits(got) == f32_bits(want), "base 0x%x inc %u x %a: %a, want %a", c, inc, (double)x, (double)got,
                              (double)want);
                ck_assert_uint_eq(f32_bits(got) & 0xffffu, 0u);
            }
        }
    }
}
END_TEST

/* fp4rl_mx4_qdq_rn equals MXFP4's decode(encode(x)) bit for bit: every scale exponent, finite BF16
 * x (a sixteenth of them, in turn per scale) and random binary32 x; the result is a BF16 value. */
START_TEST(test_mx4_qdq_rn_every_scale)
{
    trng r = trng_make(19);
    for (int e = -127; e <= 127; e++) {
        const uint8_t s = fp4rl_e8m0_of_exp(e);
        const float sc = fp4rl_mx_elem_scale(e), scale = fp4rl_exp2i(e);
        for (uint32_t i = 0; i < 0x1000u + 4096u; i++) {
            const float x = i < 0x1000u ? bits_f32((16 * i + ((uint32_t)e & 15u)) << 16) : bits_f32((uint32_t)trng_u64(&r));
            if (!isfinite(x)) continue;
            const float want = fp4rl_mx_decode(fp4rl_mx_encode(x, e, 0, -1.0f), s, 0), got = fp4rl_mx4_qdq_rn(x, sc, scale);
            ck_assert_msg(f32_bits(got) == f32_bits(want), "e %d x %a: %a, want %a", e, (double)x, (double)got, (double)want);
            ck_assert_uint_eq(f32_bits(got) & 0xffffu, 0u);
        }
    }
}
END_TEST

START_TEST(test_bf16_rounding)
{
    trng r = trng_make(4);
    for (int i = 0; i < 100000; i++) {
        uint32_t b = (uint32_t)trng_u64(&r);
        if (i < 1000) b = (b & 0xffff0000u) | 0x8000u; /* exact ties */
        float f = bits_f32(b);
        if (isnan(f)) {
            ck_assert(isnan(fp4rl_round_bf16(f)));
            continue;
        }
        ck_assert_msg(fp4rl_f32_to_bf16(f) == ref_bf16_bits(f), "bf16(%a): 0x%04x vs 0x%04x", (double)f, fp4rl_f32_to_bf16(f),
                      ref_bf16_bits(f));
    }
    ck_assert_uint_eq(fp4rl_f32_to_bf16(1.00390625f), 0x3f80); /* tie to even */
    ck_assert_uint_eq(fp4rl_f32_to_bf16(1.01171875f), 0x3f82);
}
END_TEST

/* ================================ scales ===================================================== */

START_TEST(test_mx_scale_exponent)
{
    /* by hand */
    ck_assert_int_eq(fp4rl_mx_scale_exp(0.0f, 2, 6.0f, 0), -127);
    ck_assert_int_eq(fp4rl_mx_scale_exp(0.0f, 2, 6.0f, 1), -127);
    ck_assert_int_eq(fp4rl_mx_scale_exp(6.0f, 2, 6.0f, 0), 0);
    ck_assert_int_eq(fp4rl_mx_scale_exp(6.0f, 2, 6.0f, 1), 0);
    ck_assert_int_eq(fp4rl_mx_scale_exp(7.0f, 2, 6.0f, 0), 0);  /* 7 saturates to 6 */
    ck_assert_int_eq(fp4rl_mx_scale_exp(7.0f, 2, 6.0f, 1), 1);  /* 7 / 2 = 3.5 fits */
    ck_assert_int_eq(fp4rl_mx_scale_exp(4.0f, 2, 6.0f, 1), 0);
    ck_assert_int_eq(fp4rl_mx_scale_exp(3.99f, 2, 6.0f, 0), -1);
    ck_assert_int_eq(fp4rl_mx_scale_exp(448.0f, 8, 448.0f, 0), 0);
    ck_assert_int_eq(fp4rl_mx_scale_exp(449.0f, 8, 448.0f, 0), 0);
    ck_assert_int_eq(fp4rl_mx_scale_exp(449.0f, 8, 448.0f, 1), 1);
    ck_assert_int_eq(fp4rl_mx_scale_exp(0x1p-140f, 2, 6.0f, 0), -127);  /* clamped */
    ck_assert_int_eq(fp4rl_mx_scale_exp(0x1p-149f, 2, 6.0f, 1), -127);  /* smallest subnormal */
    ck_assert_int_eq(fp4rl_mx_scale_exp(FLT_MAX, 2, 6.0f, 0), 125);
    ck_assert_int_eq(fp4rl_mx_scale_exp(FLT_MAX, 2, 6.0f, 1), 126);
    ck_assert_int_eq(fp4rl_mx_scale_exp(FLT_MAX, 8, 448.0f, 1), 120);
    /* exhaustive-ish: boundaries max * 2^k and their neighbours, plus random magnitudes */
    trng r = trng_make(5);
    for (int i = 0; i < 40000; i++) {
        float a;
        if (i < 3 * 300) {
            int k = i / 3 - 150;
            float base = (float)ldexp((i & 1) ? 448.0 : 6.0, k);
            if (base == 0.0f || isinf(base)) continue;
            a = (i % 3 == 0) ? base : (i % 3 == 1) ? nextafterf(base, 0.0f) : nextafterf(base, INFINITY);
        } else {
            a = bits_f32((uint32_t)trng_u64(&r) & 0x7fffffffu);
            if (!isfinite(a)) continue;
        }
        ck_assert_msg(fp4rl_mx_scale_exp(a, 2, 6.0f, 0) == ref_floor_exp(a, 2), "E2M1 floor(%a)", (double)a);
        ck_assert_msg(fp4rl_mx_scale_exp(a, 2, 6.0f, 1) == ref_tf_exp(a, 6.0), "E2M1 tf(%a): %d vs %d", (double)a,
                      fp4rl_mx_scale_exp(a, 2, 6.0f, 1), ref_tf_exp(a, 6.0));
        ck_assert_msg(fp4rl_mx_scale_exp(a, 8, 448.0f, 0) == ref_floor_exp(a, 8), "E4M3 floor(%a)", (double)a);
        ck_assert_msg(fp4rl_mx_scale_exp(a, 8, 448.0f, 1) == ref_tf_exp(a, 448.0), "E4M3 tf(%a)", (double)a);
    }
}
END_TEST

START_TEST(test_e8m0_decode)
{
    for (unsigned c = 0; c < 255; c++)
        ck_assert_msg((double)fp4rl_e8m0_decode((uint8_t)c) == ref_e8m0((uint8_t)c), "E8M0 0x%02x", c);
    ck_assert(isnan(fp4rl_e8m0_decode(0xFF)));
    ck_assert(fp4rl_e8m0_decode(127) == 1.0f);
    ck_assert(fp4rl_e8m0_decode(0) == 0x1p-127f);
}
END_TEST

START_TEST(test_nvfp4_scale_math)
{
    ck_assert(fp4rl_nvfp4_tensor_scale(0.0f) == 1.0f);
    ck_assert(fp4rl_nvfp4_tensor_scale(2688.0f) == 1.0f);
    ck_assert(fp4rl_nvfp4_tensor_scale(5376.0f) == 2.0f);
    /* with g = 1: s = RNE_ue4m3(amax / 6) */
    ck_assert_uint_eq(fp4rl_nvfp4_block_scale(78.0f, 1.0f), 0x55);   /* 13 = 1.625 * 8 */
    ck_assert_uint_eq(fp4rl_nvfp4_block_scale(102.0f, 1.0f), 0x58);  /* 17: tie 16 | 18 -> 16 */
    ck_assert_uint_eq(fp4rl_nvfp4_block_scale(114.0f, 1.0f), 0x5a);  /* 19: tie 18 | 20 -> 20 */
    ck_assert_uint_eq(fp4rl_nvfp4_block_scale(2688.0f, 1.0f), 0x7e); /* 448 */
    ck_assert_uint_eq(fp4rl_nvfp4_block_scale(6000.0f, 1.0f), 0x7e); /* satfinite, not NaN */
    ck_assert_uint_eq(fp4rl_nvfp4_block_scale(0.0f, 1.0f), 0x00);
    ck_assert_uint_eq(fp4rl_nvfp4_block_scale(6.0f * 0x1p-10f, 1.0f), 0x00); /* tie 0 | 2^-9 -> 0 */
    ck_assert_uint_eq(fp4rl_nvfp4_block_scale(6.0f * 0x1p-9f, 1.0f), 0x01);
    trng r = trng_make(6);
    for (int i = 0; i < 20000; i++) {
        float at = (float)(ldexp(1.0 + trng_unif(&r), (int)(trng_unif(&r) * 40) - 20));
        float ab = at * (float)trng_unif(&r);
        float g = fp4rl_nvfp4_tensor_scale(at);
        ck_assert((double)g == (double)(at / 2688.0f));
        float s = (ab / 6.0f) / g; /* the spec's order of operations, in f32 */
        ck_assert_msg(fp4rl_nvfp4_block_scale(ab, g) == ref_e4m3_encode(s), "ue4m3(%a)", (double)s);
    }
    /* decode: value(code) * s, exact; NaN scale code */
    ck_assert(fp4rl_nvfp4_decode_unscaled(0x7, 0x55) == 6.0f * 13.0f);
    ck_assert(fp4rl_nvfp4_decode(0xF, 0x55, 0.5f) == -39.0f);
    ck_assert(isnan(fp4rl_nvfp4_decode(0x0, 0x7F, 1.0f)));
}
END_TEST

START_TEST(test_hif4_base_scale)
{
    static const uint16_t rec_mant[4] = {0x00, 0x4D, 0x2B, 0x12}; /* bf16 mantissas of 1/1, 1/1.25, ... */
    trng r = trng_make(7);
    for (int i = 0; i < 30000; i++) {
        float a = i < 2 ? (i ? 0.0f : FLT_MAX) : (float)ldexp(1.0 + trng_unif(&r), (int)(trng_unif(&r) * 120) - 60);
        fp4rl_hif4_base b = fp4rl_hif4_make_base(a);
        uint32_t e6m2;
        float base, rec;
        ref_hif4_base(a, &e6m2, &base, &rec);
        ck_assert_msg(b.e6m2 == e6m2 && b.base == base && b.rec == rec, "HiF4 base(%a): 0x%02x %a %a vs 0x%02x %a %a", (double)a,
                      b.e6m2, (double)b.base, (double)b.rec, e6m2, (double)base, (double)rec);
        ck_assert(b.e6m2 <= 0xFE);
        ck_assert((f32_bits(b.rec) >> 16 & 0x7f) == rec_mant[b.e6m2 & 3]);
        ck_assert((f32_bits(b.rec) & 0xffff) == 0); /* a bf16 value */
        ck_assert(fp4rl_hif4_word_base(b.e6m2) == b.base);
    }
    /* the word base for every E6M2 code is (1 + m/4) 2^(e-48) */
    for (unsigned s = 0; s < 0xFF; s++)
        ck_assert((double)fp4rl_hif4_word_base(s) == ldexp(1.0 + (s & 3) / 4.0, (int)(s >> 2) - 48));
    /* clamps: a zero unit gets code 0 (base 2^-48); a huge one 0xFE (49152) */
    ck_assert_uint_eq(fp4rl_hif4_make_base(0.0f).e6m2, 0x00);
    ck_assert_uint_eq(fp4rl_hif4_make_base(1e30f).e6m2, 0xFE);
    ck_assert(fp4rl_hif4_make_base(1e30f).base == 49152.0f);
    /* the double rounding: amax = 7 gives sf = 0.998046875 -> bf16 1.0 -> base 1 (0xC0) */
    ck_assert_uint_eq(fp4rl_hif4_make_base(7.0f).e6m2, 0xC0);
}
END_TEST

START_TEST(test_hif4_element_rules)
{
    /* half up on the magnitude, saturate at 1.75; sign kept */
    ck_assert_uint_eq(fp4rl_hif4_encode(0.125f, 0, 1.0f, -1.0f), 0x1);  /* 0.5 step: half -> up */
    ck_assert_uint_eq(fp4rl_hif4_encode(-0.125f, 0, 1.0f, -1.0f), 0x9);
    ck_assert_uint_eq(fp4rl_hif4_encode(0.375f, 0, 1.0f, -1.0f), 0x2);  /* 1.5 steps -> 2 */
    ck_assert_uint_eq(fp4rl_hif4_encode(0.625f, 0, 1.0f, -1.0f), 0x3);  /* 2.5 -> 3 (RNE would give 2) */
    ck_assert_uint_eq(fp4rl_hif4_encode(1.875f, 0, 1.0f, -1.0f), 0x7);  /* saturates */
    ck_assert_uint_eq(fp4rl_hif4_encode(100.0f, 0, 1.0f, -1.0f), 0x7);
    ck_assert_uint_eq(fp4rl_hif4_encode(-0.0f, 0, 1.0f, -1.0f), 0x8);
    ck_assert_uint_eq(fp4rl_hif4_encode(-0.1f, 0, 1.0f, -1.0f), 0x8);  /* -0.4 steps -> -0 */
    ck_assert_uint_eq(fp4rl_hif4_encode(2.0f, 1, 1.0f, -1.0f), 0x4);    /* 2 * 2^-1 = 1.0 */
    ck_assert_uint_eq(fp4rl_hif4_encode(2.0f, 2, 1.0f, -1.0f), 0x2);
    /* the increment thresholds */
    ck_assert_uint_eq(fp4rl_hif4_e8(4.0f, 1.0f), 1);
    ck_assert_uint_eq(fp4rl_hif4_e8(nextafterf(4.0f, 0.0f), 1.0f), 0);
    ck_assert_uint_eq(fp4rl_hif4_e16(2.0f, 0, 1.0f), 1);
    ck_assert_uint_eq(fp4rl_hif4_e16(3.9f, 1, 1.0f), 0);
    ck_assert_uint_eq(fp4rl_hif4_e16(4.0f, 1, 1.0f), 1);
    /* decode of every code at every position under a word with mixed increments */
    uint32_t word = 0xC0u | 0x0500u | 0x00F30000u; /* base 1, e8 at h=0,2, e16 at g=0,1,4,5,6,7 */
    for (int j = 0; j < 64; j++)
        for (unsigned c = 0; c < 16; c++) {
            int inc = (int)((word >> (8 + j / 8)) & 1) + (int)((word >> (16 + j / 4)) & 1);
            double want = ref_hif4_elem((uint8_t)c) * ldexp(1.0, inc);
            float got = fp4rl_hif4_decode((uint8_t)c, word, j);
            ck_assert_msg((double)got == want && !signbit(got) == !signbit(want), "HiF4 decode(0x%x, j=%d)", c, j);
        }
    ck_assert(isnan(fp4rl_hif4_decode(0x3, FP4RL_HIF4_NAN_WORD, 5)));
}
END_TEST

/* ================================ Philox ===================================================== */

START_TEST(test_philox_kat)
{
    static const struct { uint32_t k[2], c[4], want[4]; } kat[] = {
        {{0, 0}, {0, 0, 0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0xa4093822u, 0x299f31d0u}, {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        fp4rl_philox4x32_10(kat[i].c, kat[i].k, out);
        for (int j = 0; j < 4; j++)
            ck_assert_msg(out[j] == kat[i].want[j], "Philox KAT %zu word %d: 0x%08x, want 0x%08x", i, j, out[j], kat[i].want[j]);
        ref_philox(kat[i].c, kat[i].k, out); /* the test's own Philox, used by test_quantize */
        for (int j = 0; j < 4; j++) ck_assert_uint_eq(out[j], kat[i].want[j]);
    }
    trng r = trng_make(8);
    for (int i = 0; i < 1000; i++) {
        uint32_t c[4], k[2], o1[4], o2[4];
        for (int j = 0; j < 4; j++) c[j] = (uint32_t)trng_u64(&r);
        k[0] = (uint32_t)trng_u64(&r);
        k[1] = (uint32_t)trng_u64(&r);
        fp4rl_philox4x32_10(c, k, o1);
        ref_philox(c, k, o2);
        ck_assert(memcmp(o1, o2, sizeof o1) == 0);
    }
}
END_TEST

START_TEST(test_sr_uniform_layout)
{
    /* u of element i = (Philox(ctr = (i/4 lo, i/4 hi, off lo, off hi), key = (seed lo, seed hi))[i%4] >> 8) * 2^-24 */
    const uint64_t seeds[3] = {0, 0x123456789abcdef0ull, ~0ull}, offs[3] = {0, 1, 0xfedcba9876543210ull};
    const uint64_t idx[6] = {0, 1, 3, 4, 1001, 0x500000003ull};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (int k = 0; k < 6; k++) {
                uint64_t i = idx[k], q = i / 4;
                uint32_t c[4] = {(uint32_t)q, (uint32_t)(q >> 32), (uint32_t)offs[b], (uint32_t)(offs[b] >> 32)};
                uint32_t key[2] = {(uint32_t)seeds[a], (uint32_t)(seeds[a] >> 32)}, o[4];
                fp4rl_philox4x32_10(c, key, o);
                float want = (float)ldexp((double)(o[i % 4] >> 8), -24);
                float u = fp4rl_sr_uniform(seeds[a], offs[b], i);
                ck_assert(u == want);
                ck_assert(u >= 0.0f && u < 1.0f);
            }
}
END_TEST

/* ================================ through the public API ===================================== */

/* Quantizes rows of 32 [anchor, v0..v30] with MX (OCP floor) so that the block scale is 2^0 and
 * the codes are plain element conversions; returns the codes of the v's. */
static void api_element_codes(fp4rl_dtype fmt, float anchor, const float *v, int n, uint8_t *codes)
{
    int rows = (n + 30) / 31;
    float *x = calloc((size_t)rows * 32, sizeof(float));
    for (int r = 0; r < rows; r++) x[r * 32] = anchor;
    for (int i = 0; i < n; i++) x[(i / 31) * 32 + 1 + i % 31] = v[i];
    fp4rl_tensor *src = mk_f32(ctx, rows, 32, x);
    fp4rl_tensor *q = quant(ctx, src, fmt, 0, 0, 0);
    qhost h = qh_get(q);
    for (int r = 0; r < rows; r++) ck_assert_uint_eq(h.scales[r], 127); /* 2^0 */
    for (int i = 0; i < n; i++) codes[i] = qh_code(&h, fmt, 32, i / 31, 1 + i % 31);
    float *y = deq_f32(ctx, q);
    for (int i = 0; i < n; i++) {
        double want = fmt == FP4RL_DTYPE_MXFP4 ? ref_e2m1(codes[i]) : ref_e4m3(codes[i]);
        ck_assert((double)y[(i / 31) * 32 + 1 + i % 31] == want);
    }
    free(y);
    qh_free(&h);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);
    free(x);
}

START_TEST(test_api_e4m3_midpoints)
{
    float v[126 * 6];
    uint8_t codes[126 * 6];
    int n = 0;
    for (int k = 0; k + 1 < 127; k++) {
        float mid = (float)((E4M3_MAG[k] + E4M3_MAG[k + 1]) / 2);
        float p[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int j = 0; j < 3; j++) {
            v[n++] = p[j];
            v[n++] = -p[j];
        }
    }
    api_element_codes(FP4RL_DTYPE_MXFP8_E4M3, 256.0f, v, n, codes);
    for (int i = 0; i < n; i++)
        ck_assert_msg(codes[i] == ref_e4m3_encode(v[i]), "MXFP8 code of %a: 0x%02x, model 0x%02x", (double)v[i], codes[i],
                      ref_e4m3_encode(v[i]));
    /* saturation inside a block of scale 2^0: 480 -> 448 */
    float s[2] = {480.0f, -500.0f};
    uint8_t sc[2];
    api_element_codes(FP4RL_DTYPE_MXFP8_E4M3, 256.0f, s, 2, sc);
    ck_assert_uint_eq(sc[0], 0x7e);
    ck_assert_uint_eq(sc[1], 0xfe);
}
END_TEST

START_TEST(test_api_e2m1_ties)
{
    float v[8 * 6 + 14];
    uint8_t codes[8 * 6 + 14];
    int n = 0;
    for (int k = 0; k + 1 < 8; k++) {
        float mid = (float)((E2M1_MAG[k] + E2M1_MAG[k + 1]) / 2);
        float p[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int j = 0; j < 3; j++) {
            v[n++] = p[j];
            v[n++] = -p[j];
        }
    }
    for (int k = 0; k < 8; k++) { /* the grid itself */
        v[n++] = (float)E2M1_MAG[k];
        if (k) v[n++] = (float)-E2M1_MAG[k];
    }
    v[n++] = -0.0f;
    api_element_codes(FP4RL_DTYPE_MXFP4, 4.0f, v, n, codes);
    for (int i = 0; i < n; i++)
        ck_assert_msg(codes[i] == ref_e2m1_encode(v[i]), "MXFP4 code of %a: 0x%x, model 0x%x", (double)v[i], codes[i],
                      ref_e2m1_encode(v[i]));
    /* the list, explicitly */
    static const float t[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    static const uint8_t tw[7] = {0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6};
    uint8_t tc[7];
    api_element_codes(FP4RL_DTYPE_MXFP4, 4.0f, t, 7, tc);
    for (int i = 0; i < 7; i++) ck_assert_msg(tc[i] == tw[i], "RNE(%g): 0x%x want 0x%x", (double)t[i], tc[i], tw[i]);
}
END_TEST

/* HiF4 spec vectors through fp4rl_quantize on a [1, 64] tensor. */
typedef struct hif4_unit { uint32_t word; uint8_t code[64]; float deq[64]; } hif4_unit;
static hif4_unit hif4_quantize_unit(const float *x)
{
    hif4_unit u;
    fp4rl_tensor *src = mk_f32(ctx, 1, 64, x);
    fp4rl_tensor *q = NULL;
    OK(fp4rl_quantize(&q, ctx, src, FP4RL_DTYPE_HIF4, NULL, FP4RL_ROLE_WEIGHT));
    qhost h = qh_get(q);
    ck_assert_uint_eq(h.nscales, 4);
    ck_assert_uint_eq(h.ncodes, 32);
    u.word = qh_word(&h, 0);
    for (int j = 0; j < 64; j++) u.code[j] = qh_code(&h, FP4RL_DTYPE_HIF4, 64, 0, j);
    float *y = deq_f32(ctx, q);
    memcpy(u.deq, y, sizeof u.deq);
    /* the dequantized values are the spec's decode of (word, codes), done independently here */
    for (int j = 0; j < 64; j++) {
        if ((u.word & 0xFF) == 0xFF) {
            ck_assert(isnan(y[j]));
            continue;
        }
        uint32_t s = u.word & 0xFF;
        int inc = (int)((u.word >> (8 + j / 8)) & 1) + (int)((u.word >> (16 + j / 4)) & 1);
        double want = ref_hif4_elem(u.code[j]) * ldexp(1.0, inc) * ldexp(1.0 + (s & 3) / 4.0, (int)(s >> 2) - 48);
        ck_assert_msg((double)y[j] == want && !signbit(y[j]) == !signbit(want), "HiF4 decode j=%d: %a vs %a", j, (double)y[j], want);
    }
    free(y);
    qh_free(&h);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);
    return u;
}

START_TEST(test_hif4_vector_a)
{
    float x[64] = {0};
    x[0] = 7.0f; x[1] = -0.5f; x[8] = 1.0f; x[9] = 3.0f; x[16] = 0.2001953125f;
    hif4_unit u = hif4_quantize_unit(x);
    ck_assert_msg(u.word == 0x000501C0u, "vector A word 0x%08x", u.word);
    ck_assert(u.deq[0] == 7.0f);
    ck_assert(u.deq[1] == -1.0f); /* -0.5 is a tie that rounds up in magnitude */
    ck_assert(u.deq[8] == 1.0f);
    ck_assert(u.deq[9] == 3.0f);
    ck_assert(u.deq[16] == 0.25f);
    ck_assert_uint_eq(u.code[0], 0x7);
    ck_assert_uint_eq(u.code[1], 0x9);
    ck_assert_uint_eq(u.code[8], 0x2);
    ck_assert_uint_eq(u.code[9], 0x6);
    ck_assert_uint_eq(u.code[16], 0x1);
    for (int j = 0; j < 64; j++)
        if (j != 0 && j != 1 && j != 8 && j != 9 && j != 16) {
            ck_assert_uint_eq(u.code[j], 0);
            ck_assert(f32_bits(u.deq[j]) == 0);
        }
}
END_TEST

START_TEST(test_hif4_vector_b)
{
    float x[64];
    for (int j = 0; j < 64; j++) x[j] = 1000.0f;
    hif4_unit u = hif4_quantize_unit(x);
    ck_assert_msg(u.word == 0xFFFFFFDCu, "vector B word 0x%08x", u.word);
    for (int j = 0; j < 64; j++) {
        ck_assert(u.deq[j] == 896.0f);
        ck_assert_uint_eq(u.code[j], 0x7);
    }
    /* the whole unit is clipped: the error report says so */
    fp4rl_tensor *src = mk_f32(ctx, 1, 64, x), *q = NULL;
    OK(fp4rl_quantize(&q, ctx, src, FP4RL_DTYPE_HIF4, NULL, FP4RL_ROLE_WEIGHT));
    double sat;
    OK(fp4rl_quant_error(src, q, NULL, NULL, &sat, NULL));
    ck_assert(sat == 1.0);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);
}
END_TEST

START_TEST(test_hif4_vector_c)
{
    float x[64] = {0};
    hif4_unit u = hif4_quantize_unit(x);
    ck_assert_uint_eq(u.word, 0x00000000u);
    for (int j = 0; j < 64; j++) {
        ck_assert_uint_eq(u.code[j], 0);
        ck_assert(f32_bits(u.deq[j]) == 0);
    }
}
END_TEST

START_TEST(test_hif4_vector_d)
{
    float x[64];
    for (int j = 0; j < 64; j++) x[j] = (float)(j - 32) / 16.0f;
    hif4_unit u = hif4_quantize_unit(x);
    ck_assert_msg(u.word == 0xEC3FC3B9u, "vector D word 0x%08x", u.word);
    ck_assert(u.deq[0] == -1.875f);
    /* base 0.3125 (E6M2 0xB9); every element within ~half a step of its position's grid (the
     * BF16 reciprocal and the saturated max -2 -> -1.875 stay inside 0.625 steps) */
    ck_assert_uint_eq(u.word & 0xFF, 0xB9);
    for (int j = 0; j < 64; j++) {
        int inc = (int)((u.word >> (8 + j / 8)) & 1) + (int)((u.word >> (16 + j / 4)) & 1);
        float step = 0.25f * (float)(1 << inc) * 0.3125f;
        ck_assert_int_eq((u.code[j] >> 3) & 1, j < 32);
        ck_assert_msg(fabsf(u.deq[j] - x[j]) <= 0.625f * step, "D j=%d: %g -> %g", j, (double)x[j], (double)u.deq[j]);
    }
}
END_TEST

START_TEST(test_hif4_vector_e)
{
    float x[64] = {0};
    x[5] = 1e30f;
    hif4_unit u = hif4_quantize_unit(x);
    ck_assert_msg(u.word == 0x000201FEu, "vector E word 0x%08x", u.word);
    ck_assert(u.deq[5] == 344064.0f);
    ck_assert_uint_eq(u.code[5], 0x7);
    for (int j = 0; j < 64; j++)
        if (j != 5) ck_assert(u.deq[j] == 0.0f);
}
END_TEST

START_TEST(test_hif4_vector_nan)
{
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const int pos[3] = {0, 37, 63};
    for (int b = 0; b < 3; b++) {
        float x[64];
        for (int j = 0; j < 64; j++) x[j] = (float)j - 20.0f;
        x[pos[b]] = bad[b];
        hif4_unit u = hif4_quantize_unit(x);
        ck_assert_msg(u.word == 0x000000FFu, "NaN vector word 0x%08x", u.word);
        for (int j = 0; j < 64; j++) {
            ck_assert_uint_eq(u.code[j], 0);
            ck_assert(isnan(u.deq[j]));
        }
    }
}
END_TEST

Suite *formats_suite(void)
{
    Suite *s = suite_create("formats");
    TCase *tc = tcase_create("elements");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_e2m1_decode_table);
    tcase_add_test(tc, test_e2m1_roundtrip_all_codes);
    tcase_add_test(tc, test_e4m3_decode_table);
    tcase_add_test(tc, test_e4m3_roundtrip_all_codes);
    tcase_add_test(tc, test_e2m1_rne_ties_and_sweep);
    tcase_add_test(tc, test_e4m3_rne_all_midpoints);
    tcase_add_test(tc, test_subnormal_codes);
    tcase_add_test(tc, test_element_stochastic_formula);
    tcase_add_test(tc, test_element_stochastic_u_zero);
    tcase_add_test(tc, test_bf16_rounding);
    tcase_add_test(tc, test_encoders_every_bf16);
    tcase_add_test(tc, test_hif4_encode_every_bf16);
    tcase_add_test(tc, test_hif4_qdq_rn_every_base);
    tcase_add_test(tc, test_mx4_qdq_rn_every_scale);
    suite_add_tcase(s, tc);
    tc = tcase_create("scales");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_mx_scale_exponent);
    tcase_add_test(tc, test_e8m0_decode);
    tcase_add_test(tc, test_nvfp4_scale_math);
    tcase_add_test(tc, test_hif4_base_scale);
    tcase_add_test(tc, test_hif4_element_rules);
    suite_add_tcase(s, tc);
    tc = tcase_create("philox");
    tcase_add_test(tc, test_philox_kat);
    tcase_add_test(tc, test_sr_uniform_layout);
    suite_add_tcase(s, tc);
    tc = tcase_create("api");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_api_e4m3_midpoints);
    tcase_add_test(tc, test_api_e2m1_ties);
    tcase_add_test(tc, test_hif4_vector_a);
    tcase_add_test(tc, test_hif4_vector_b);
    tcase_add_test(tc, test_hif4_vector_c);
    tcase_add_test(tc, test_hif4_vector_d);
    tcase_add_test(tc, test_hif4_vector_e);
    tcase_add_test(tc, test_hif4_vector_nan);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(formats_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
