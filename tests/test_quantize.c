/*
 * test_quantize.c - quantize / dequantize / transpose behaviour through the public API.
 *
 * The core of it is a reference model of shared/spec/formats.md written in this file (scales from
 * the spec's formulas, elements by nearest-even search over decoded tables, HiF4 by the spec's
 * steps, Philox written out again) that every format, tile, scale rule and rounding is compared
 * with bit for bit, on awkward shapes. Around it: hand-derived edge cases (zero blocks, saturation,
 * ties, signed zero, NaN/Inf blocks, tails, odd rows, one element), 2D transposition invariance,
 * stochastic rounding (replay, offsets, unbiasedness), the spec's Gaussian MSE figures, and the
 * quantization-error report.
 */
#include <float.h>

#include "fmt_test_util.h"

static fp4rl_context *ctx;
static void setup(void)
{
    ref_tables_init();
    OK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0));
}
static void teardown(void) { fp4rl_context_destroy(ctx); }

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int is_fp4(fp4rl_dtype f) { return f != FP4RL_DTYPE_MXFP8_E4M3; }

/* ================================ the reference model ======================================== */

typedef struct refq {
    uint8_t *codes;
    size_t ncodes;
    uint8_t *scales;
    size_t nscales;
    float g;
} refq;

static void ref_put(refq *q, fp4rl_dtype f, int64_t C, int64_t r, int64_t c, uint8_t code)
{
    if (!is_fp4(f)) {
        q->codes[r * C + c] = code;
        return;
    }
    uint8_t *b = &q->codes[r * cdiv(C, 2) + c / 2];
    *b = (c & 1) ? (uint8_t)(*b | code << 4) : (uint8_t)(*b | code);
}

/* Element rounding on a table grid: nearest-even, or stochastic with uniform u (u < 0: nearest). */
static unsigned ref_round(double a, const double *tab, unsigned n, double u)
{
    if (u < 0 || a >= tab[n - 1]) return ref_rne_search(a, tab, n);
    unsigned lo, hi;
    ref_grid_bracket(a, tab, n, &lo, &hi);
    return u < (a - tab[lo]) / (tab[hi] - tab[lo]) ? hi : lo;
}

/* Max magnitude over finite elements of rows [r0, r1) x cols [c0, c1); *finite = no NaN/Inf. */
static float ref_amax(const float *x, int64_t R, int64_t C, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int *finite)
{
    float m = 0.0f;
    *finite = 1;
    for (int64_t r = r0; r < r1 && r < R; r++)
        for (int64_t c = c0; c < c1 && c < C; c++) {
            if (!isfinite(x[r * C + c])) *finite = 0;
            else if (fabsf(x[r * C + c]) > m) m = fabsf(x[r * C + c]);
        }
    return m;
}

static void ref_mx_nv(refq *q, const float *x, int64_t R, int64_t C, fp4rl_dtype f, int tile, int tf, int sr, uint64_t seed,
                      uint64_t off)
{
    const int nv = f == FP4RL_DTYPE_NVFP4, fp8 = f == FP4RL_DTYPE_MXFP8_E4M3;
    const int64_t bh = tile ? tile : 1, bw = tile ? tile : (nv ? 16 : 32);
    const int64_t SR = cdiv(R, bh), SC = cdiv(C, bw);
    const double *tab = fp8 ? E4M3_MAG : E2M1_MAG;
    const unsigned ntab = fp8 ? 127 : 8;
    int fin;
    q->nscales = (size_t)(SR * SC);
    q->scales = calloc(q->nscales, 1);
    q->g = 1.0f;
    if (nv) {
        float at = ref_amax(x, R, C, 0, R, 0, C, &fin);
        q->g = at == 0.0f ? 1.0f : at / 2688.0f;
    }
    for (int64_t i = 0; i < SR; i++)
        for (int64_t k = 0; k < SC; k++) {
            float a = ref_amax(x, R, C, i * bh, (i + 1) * bh, k * bw, (k + 1) * bw, &fin);
            uint8_t s;
            if (!fin) s = nv ? 0x7F : 0xFF;
            else if (nv) s = ref_e4m3_encode((a / 6.0f) / q->g);
            else s = (uint8_t)((tf ? ref_tf_exp(a, fp8 ? 448.0 : 6.0) : ref_floor_exp(a, fp8 ? 8 : 2)) + 127);
            q->scales[i * SC + k] = s;
        }
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            uint8_t s = q->scales[(r / bh) * SC + c / bw];
            float xv = x[r * C + c], v;
            double u = sr ? ref_sr_u(seed, off, (uint64_t)(r * C + c)) : -1.0;
            if (nv) {
                if (s == 0x7F || s == 0) continue; /* code 0 */
                v = xv / ((float)ref_e4m3(s) * q->g);
            } else {
                if (s == 0xFF) continue;
                v = xv * (float)ldexp(1.0, 127 - (int)s);
            }
            unsigned m = ref_round(fabs((double)v), tab, ntab, u);
            ref_put(q, f, C, r, c, (uint8_t)((signbit(v) ? (fp8 ? 0x80 : 0x8) : 0) | m));
        }
}

static void ref_hif4(refq *q, const float *x, int64_t R, int64_t C, int tile, int sr, uint64_t seed, uint64_t off)
{
    const int64_t U = cdiv(C, 64), th = tile ? 64 : 1, s8 = tile ? 8 : 1, s4 = tile ? 4 : 1;
    q->nscales = (size_t)(R * U * 4);
    q->scales = calloc(q->nscales, 1);
    q->g = 1.0f;
    for (int64_t r0 = 0; r0 < R; r0 += th)
        for (int64_t un = 0; un < U; un++) {
            const int64_t c0 = un * 64;
            int fin, f2;
            float amax = ref_amax(x, R, C, r0, r0 + th, c0, c0 + 64, &fin);
            uint32_t e6m2 = 0;
            float base = 0, rec = 0;
            if (fin) ref_hif4_base(amax, &e6m2, &base, &rec);
            for (int64_t r = r0; r < r0 + th && r < R; r++) {
                uint32_t word = 0xFF;
                int e8[8], e16[16];
                if (fin) {
                    const int64_t rs8 = r0 + ((r - r0) / s8) * s8, rs4 = r0 + ((r - r0) / s4) * s4;
                    word = e6m2;
                    for (int h = 0; h < 8; h++) {
                        float m8 = ref_amax(x, R, C, rs8, rs8 + s8, c0 + 8 * h, c0 + 8 * h + 8, &f2);
                        e8[h] = m8 * rec >= 4.0f;
                        word |= (uint32_t)e8[h] << (8 + h);
                    }
                    for (int g = 0; g < 16; g++) {
                        float m4 = ref_amax(x, R, C, rs4, rs4 + s4, c0 + 4 * g, c0 + 4 * g + 4, &f2);
                        e16[g] = (m4 * (e8[g / 2] ? 0.5f : 1.0f)) * rec >= 2.0f;
                        word |= (uint32_t)e16[g] << (16 + g);
                    }
                }
                uint8_t *w = &q->scales[4 * (r * U + un)];
                w[0] = (uint8_t)word; w[1] = (uint8_t)(word >> 8); w[2] = (uint8_t)(word >> 16); w[3] = (uint8_t)(word >> 24);
                if (!fin) continue;
                for (int64_t c = c0; c < c0 + 64 && c < C; c++) {
                    int j = (int)(c - c0), inc = e8[j / 8] + e16[j / 4];
                    float xv = x[r * C + c];
                    float v = (fabsf(xv) * (float)ldexp(1.0, -inc)) * rec;
                    int n;
                    if (!sr) {
                        n = (int)floorf(v * 4.0f + 0.5f);
                    } else {
                        double u = ref_sr_u(seed, off, (uint64_t)(r * C + c));
                        double lo = floor((double)v * 4) / 4;
                        n = v >= 1.75f ? 7 : (int)(lo * 4) + (u < ((double)v - lo) / 0.25);
                    }
                    if (n > 7) n = 7;
                    ref_put(q, FP4RL_DTYPE_HIF4, C, r, c, (uint8_t)((signbit(xv) ? 8 : 0) | n));
                }
            }
        }
}

static refq ref_quantize(const float *x, int64_t R, int64_t C, fp4rl_dtype f, int tile, int tf, int sr, uint64_t seed, uint64_t off)
{
    refq q;
    memset(&q, 0, sizeof q);
    q.ncodes = (size_t)(R * (is_fp4(f) ? cdiv(C, 2) : C));
    q.codes = calloc(q.ncodes, 1);
    if (f == FP4RL_DTYPE_HIF4) ref_hif4(&q, x, R, C, tile, sr, seed, off);
    else ref_mx_nv(&q, x, R, C, f, tile, tf, sr, seed, off);
    return q;
}
static void refq_free(refq *q) { free(q->codes); free(q->scales); }

/* The spec's dequantization of element (r, c) from host codes / scales, in double, then the one
 * f32 rounding NVFP4's g brings. */
static float ref_deq(const qhost *h, fp4rl_dtype f, int64_t C, int64_t r, int64_t c)
{
    uint8_t code = qh_code(h, f, C, r, c);
    int64_t bw = h->tile ? h->tile : f == FP4RL_DTYPE_NVFP4 ? 16 : 32, bh = h->tile ? h->tile : 1;
    if (f == FP4RL_DTYPE_HIF4) {
        uint32_t w = qh_word(h, (size_t)(r * cdiv(C, 64) + c / 64));
        int j = (int)(c % 64);
        if ((w & 0xFF) == 0xFF) return NAN;
        int inc = (int)((w >> (8 + j / 8)) & 1) + (int)((w >> (16 + j / 4)) & 1);
        return (float)(ref_hif4_elem(code) * ldexp(1.0, inc) * ldexp(1.0 + (w & 3) / 4.0, (int)((w & 0xFF) >> 2) - 48));
    }
    uint8_t s = h->scales[(r / bh) * cdiv(C, bw) + c / bw];
    if (f == FP4RL_DTYPE_NVFP4) {
        if (s == 0x7F) return NAN;
        return (float)(ref_e2m1(code) * ref_e4m3(s) * (double)h->g);
    }
    if (s == 0xFF) return NAN;
    return (float)((f == FP4RL_DTYPE_MXFP4 ? ref_e2m1(code) : ref_e4m3(code)) * ref_e8m0(s));
}

/* Quantizes x with the library and compares everything with the model; returns the tensor. */
static void check_against_model(const float *x0, int64_t R, int64_t C, fp4rl_dtype f, int tile, int tf, int sr, int bf16,
                                const char *what)
{
    const int64_t n = R * C;
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = bf16 ? ref_bf16_round(x0[i]) : x0[i];
    fp4rl_tensor *src = bf16 ? mk_bf16(ctx, R, C, x) : mk_f32(ctx, R, C, x);
    uint64_t seed = 0x5eed0000ull + (uint64_t)R * 31 + (uint64_t)C, off0 = (uint64_t)C * 1000003ull;
    OK(fp4rl_context_set_seed(ctx, seed));
    OK(fp4rl_context_set_rng_offset(ctx, off0));
    fp4rl_tensor *q = quant(ctx, src, f, tile, tf, sr);
    uint64_t off1;
    OK(fp4rl_context_get_rng(ctx, NULL, &off1));
    ck_assert_msg(off1 == off0 + (sr ? 1 : 0), "%s: offset %llu -> %llu", what, (unsigned long long)off0, (unsigned long long)off1);
    refq m = ref_quantize(x, R, C, f, tile, tf, sr, seed, off0);
    qhost h = qh_get(q);
    ck_assert_int_eq(h.tile, tile);
    ck_assert_msg(h.ncodes == m.ncodes && h.nscales == m.nscales, "%s: sizes %zu/%zu vs model %zu/%zu", what, h.ncodes, h.nscales,
                  m.ncodes, m.nscales);
    ck_assert_msg(f32_bits(h.g) == f32_bits(m.g), "%s: tensor scale %a vs model %a", what, (double)h.g, (double)m.g);
    for (size_t i = 0; i < m.nscales; i++)
        ck_assert_msg(h.scales[i] == m.scales[i], "%s: scale byte %zu is 0x%02x, model 0x%02x", what, i, h.scales[i], m.scales[i]);
    for (size_t i = 0; i < m.ncodes; i++)
        ck_assert_msg(h.codes[i] == m.codes[i], "%s: code byte %zu (row %lld) is 0x%02x, model 0x%02x", what, i,
                      (long long)(i / (m.ncodes / (size_t)R)), h.codes[i], m.codes[i]);
    /* dequantize: F32 exactly the spec's decode, BF16 its RNE rounding */
    float *y = deq_f32(ctx, q);
    fp4rl_tensor *db = NULL;
    OK(fp4rl_dequantize(&db, ctx, q, FP4RL_DTYPE_BF16));
    uint16_t *yb = malloc((size_t)n * 2);
    OK(fp4rl_tensor_to_host(db, yb, (size_t)n * 2));
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            float want = ref_deq(&h, f, C, r, c), got = y[r * C + c];
            ck_assert_msg(same_f32(got, want), "%s: deq(%lld,%lld) = %a, spec %a", what, (long long)r, (long long)c, (double)got,
                          (double)want);
            float gb = bits_f32((uint32_t)yb[r * C + c] << 16);
            ck_assert_msg(same_f32(gb, ref_bf16_round(want)), "%s: bf16 deq(%lld,%lld) = %a, want %a", what, (long long)r, (long long)c,
                          (double)gb, (double)ref_bf16_round(want));
        }
    free(yb);
    fp4rl_tensor_destroy(db);
    free(y);
    qh_free(&h);
    refq_free(&m);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);
    free(x);
}

static const fp4rl_dtype FORMATS[4] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};
static int tiles_of(fp4rl_dtype f, int *t)
{
    t[0] = 0;
    if (f == FP4RL_DTYPE_HIF4) {
        t[1] = 64;
        return 2;
    }
    t[1] = 16; t[2] = 32; t[3] = 64;
    return 4;
}

/* Every format x tile x scale rule x rounding x source dtype, on shapes that are not multiples
 * of anything (tails, odd rows, one element), heavy-tailed data with zeros and a NaN block. */
START_TEST(test_matches_reference_model)
{
    static const int64_t shapes[][2] = {{1, 1}, {1, 5}, {3, 33}, {70, 45}, {129, 67}, {17, 200}, {2, 64}};
    const int nshapes = sizeof shapes / sizeof shapes[0];
    trng rg = trng_make(11);
    int runs = 0;
    for (int si = 0; si < nshapes; si++) {
        const int64_t R = shapes[si][0], C = shapes[si][1];
        float *x = malloc((size_t)(R * C) * sizeof(float));
        for (int64_t i = 0; i < R * C; i++) x[i] = trng_heavy(&rg);
        if (si == 3) x[7 * C + 20] = NAN;        /* one NaN block / unit / tile */
        if (si == 4) x[R * C - 1] = -INFINITY;  /* in the last (tail) block */
        if (si == 5) for (int64_t c = 0; c < C; c++) x[5 * C + c] = 0.0f; /* a zero row */
        for (int fi = 0; fi < 4; fi++) {
            int tiles[4], nt = tiles_of(FORMATS[fi], tiles);
            for (int ti = 0; ti < nt; ti++)
                for (int tf = 0; tf < 2; tf++)
                    for (int sr = 0; sr < 2; sr++)
                        for (int bf = 0; bf < 2; bf++) {
                            if (FORMATS[fi] == FP4RL_DTYPE_NVFP4 || FORMATS[fi] == FP4RL_DTYPE_HIF4) {
                                if (tf) continue; /* the scale rule is MX-only */
                            }
                            char what[128];
                            snprintf(what, sizeof what, "%s %lldx%lld tile %d %s %s %s", fmt_name(FORMATS[fi]), (long long)R,
                                     (long long)C, tiles[ti], tf ? "tf" : "floor", sr ? "stochastic" : "nearest", bf ? "bf16" : "f32");
                            check_against_model(x, R, C, FORMATS[fi], tiles[ti], tf, sr, bf, what);
                            runs++;
                        }
        }
        free(x);
    }
    ck_assert_int_eq(runs, 7 * (2 * 4 * 4 + 4 * 4 + 2 * 4 + 2 * 4 * 4));
}
END_TEST

/* A 3-dim tensor is quantized as its [d0 * d1, d2] matrix view. */
START_TEST(test_nd_view)
{
    trng rg = trng_make(12);
    float x[2 * 3 * 40];
    for (int i = 0; i < 240; i++) x[i] = trng_heavy(&rg);
    const int64_t s3[3] = {2, 3, 40};
    fp4rl_tensor *t3 = NULL;
    OK(fp4rl_tensor_from_host(&t3, ctx, FP4RL_DTYPE_F32, 3, s3, x));
    for (int fi = 0; fi < 4; fi++) {
        fp4rl_tensor *q3 = quant(ctx, t3, FORMATS[fi], 0, 0, 0);
        ck_assert_int_eq(fp4rl_tensor_ndim(q3), 3);
        ck_assert_int_eq(fp4rl_tensor_dim(q3, 2), 40);
        refq m = ref_quantize(x, 6, 40, FORMATS[fi], 0, 0, 0, 0, 0);
        qhost h = qh_get(q3);
        ck_assert(h.ncodes == m.ncodes && memcmp(h.codes, m.codes, m.ncodes) == 0);
        ck_assert(h.nscales == m.nscales && memcmp(h.scales, m.scales, m.nscales) == 0);
        fp4rl_tensor *d = NULL;
        OK(fp4rl_dequantize(&d, ctx, q3, FP4RL_DTYPE_F32));
        ck_assert_int_eq(fp4rl_tensor_ndim(d), 3);
        ck_assert_int_eq(fp4rl_tensor_dim(d, 1), 3);
        fp4rl_tensor_destroy(d);
        qh_free(&h);
        refq_free(&m);
        fp4rl_tensor_destroy(q3);
    }
    fp4rl_tensor_destroy(t3);
}
END_TEST

/* ================================ hand-derived edge cases ==================================== */

START_TEST(test_zero_blocks)
{
    /* row 0 all zero; row 1: first block zero, then values */
    float x[2 * 70] = {0};
    for (int c = 64; c < 70; c++) x[70 + c] = (float)(c - 66);
    fp4rl_tensor *src = mk_f32(ctx, 2, 70, x);
    for (int fi = 0; fi < 4; fi++) {
        fp4rl_dtype f = FORMATS[fi];
        fp4rl_tensor *q = quant(ctx, src, f, 0, 0, 0);
        qhost h = qh_get(q);
        float *y = deq_f32(ctx, q);
        if (f == FP4RL_DTYPE_HIF4) {
            ck_assert_uint_eq(qh_word(&h, 0), 0); /* row 0, unit 0 */
            ck_assert_uint_eq(qh_word(&h, 1), 0); /* row 0, unit 1 (tail) */
            ck_assert_uint_eq(qh_word(&h, 2), 0); /* row 1, unit 0 */
        } else {
            int64_t sc = cdiv(70, f == FP4RL_DTYPE_NVFP4 ? 16 : 32);
            for (int64_t k = 0; k < sc; k++) ck_assert_uint_eq(h.scales[k], 0); /* E8M0 0 = 2^-127; UE4M3 0 */
            ck_assert_uint_eq(h.scales[sc], 0);
        }
        for (int c = 0; c < 70; c++) ck_assert_uint_eq(qh_code(&h, f, 70, 0, c), 0);
        for (int c = 0; c < 64; c++) ck_assert_uint_eq(qh_code(&h, f, 70, 1, c), 0);
        for (int i = 0; i < 70 + 64; i++) ck_assert_msg(f32_bits(y[i]) == 0, "%s: zero block deq[%d] = %a", fmt_name(f), i, (double)y[i]);
        free(y);
        qh_free(&h);
        fp4rl_tensor_destroy(q);
    }
    fp4rl_tensor_destroy(src);
    /* an all-zero NVFP4 tensor has g = 1 */
    float z[16] = {0};
    src = mk_f32(ctx, 1, 16, z);
    fp4rl_tensor *q = quant(ctx, src, FP4RL_DTYPE_NVFP4, 0, 0, 0);
    float g;
    OK(fp4rl_tensor_quant_info(q, NULL, NULL, NULL, &g));
    ck_assert(g == 1.0f);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);
}
END_TEST

/* OCP floor: a block with max 7 * 2^k gets 2^k and the 7 saturates to 6; truncation-free gets
 * 2^(k+1) and 3.5 ties to 4. MXFP8: 500 * 2^k -> 448 * 2^k (floor) or 256 * 2^(k+1) (tf). */
START_TEST(test_saturation_floor_vs_truncation_free)
{
    const int ks[4] = {-20, -3, 0, 5};
    for (int i = 0; i < 4; i++) {
        int k = ks[i];
        float x[32];
        for (int c = 0; c < 32; c++) x[c] = (float)ldexp((c % 5) * 0.25 - 0.5, k);
        x[3] = (float)ldexp(7.0, k);
        fp4rl_tensor *src = mk_f32(ctx, 1, 32, x);
        for (int tf = 0; tf < 2; tf++) {
            fp4rl_tensor *q = quant(ctx, src, FP4RL_DTYPE_MXFP4, 0, tf, 0);
            qhost h = qh_get(q);
            float *y = deq_f32(ctx, q);
            ck_assert_int_eq(h.scales[0], 127 + k + tf);
            ck_assert_uint_eq(qh_code(&h, FP4RL_DTYPE_MXFP4, 32, 0, 3), tf ? 0x6 : 0x7);
            ck_assert(y[3] == (float)ldexp(tf ? 8.0 : 6.0, k));
            double sat;
            OK(fp4rl_quant_error(src, q, NULL, NULL, &sat, NULL));
            ck_assert_msg(sat == (tf ? 0.0 : 1.0), "k=%d tf=%d saturated_frac %g", k, tf, sat);
            free(y);
            qh_free(&h);
            fp4rl_tensor_destroy(q);
        }
        fp4rl_tensor_destroy(src);
        x[3] = (float)ldexp(500.0, k);
        src = mk_f32(ctx, 1, 32, x);
        for (int tf = 0; tf < 2; tf++) {
            fp4rl_tensor *q = quant(ctx, src, FP4RL_DTYPE_MXFP8_E4M3, 0, tf, 0);
            qhost h = qh_get(q);
            float *y = deq_f32(ctx, q);
            ck_assert_int_eq(h.scales[0], 127 + k + tf);
            ck_assert_uint_eq(h.codes[3], tf ? 0x78 : 0x7e); /* 256 = 0x78, 448 = 0x7e */
            ck_assert(y[3] == (float)ldexp(tf ? 512.0 : 448.0, k));
            free(y);
            qh_free(&h);
            fp4rl_tensor_destroy(q);
        }
        fp4rl_tensor_destroy(src);
    }
}
END_TEST

/* Truncation-free on heavy-tailed data: no element is ever clipped, every element is the nearest
 * representable value of its block; the same data under the OCP floor does clip. */
START_TEST(test_truncation_free_never_saturates)
{
    const int64_t R = 64, C = 256;
    float *x = malloc((size_t)(R * C) * sizeof(float));
    trng rg = trng_make(13);
    for (int64_t i = 0; i < R * C; i++) x[i] = trng_heavy(&rg);
    fp4rl_tensor *src = mk_f32(ctx, R, C, x);
    const fp4rl_dtype fmts[2] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_MXFP8_E4M3};
    const int tiles[4] = {0, 16, 32, 64};
    for (int fi = 0; fi < 2; fi++)
        for (int ti = 0; ti < 4; ti++) {
            const fp4rl_dtype f = fmts[fi];
            const double maxe = f == FP4RL_DTYPE_MXFP4 ? 6.0 : 448.0;
            const int64_t bh = tiles[ti] ? tiles[ti] : 1, bw = tiles[ti] ? tiles[ti] : 32, SC = cdiv(C, bw);
            fp4rl_tensor *q = quant(ctx, src, f, tiles[ti], 1, 0);
            double sat, under;
            OK(fp4rl_quant_error(src, q, NULL, &under, &sat, NULL));
            ck_assert_msg(sat == 0.0, "%s tile %d tf: saturated_frac %g", fmt_name(f), tiles[ti], sat);
            qhost h = qh_get(q);
            float *y = deq_f32(ctx, q);
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++) {
                    double X = ref_e8m0(h.scales[(r / bh) * SC + c / bw]), v = (double)x[r * C + c] / X;
                    ck_assert_msg(fabs(v) <= maxe, "%s: |x|/X = %g > max", fmt_name(f), v);
                    double want = (f == FP4RL_DTYPE_MXFP4 ? ref_e2m1(ref_e2m1_encode(v)) : ref_e4m3(ref_e4m3_encode(v))) * X;
                    ck_assert((double)y[r * C + c] == want);
                }
            free(y);
            qh_free(&h);
            fp4rl_tensor_destroy(q);
            q = quant(ctx, src, f, tiles[ti], 0, 0);
            OK(fp4rl_quant_error(src, q, NULL, NULL, &sat, NULL));
            /* (only asserted where there are enough blocks for it to be certain) */
            if (tiles[ti] <= 16) ck_assert_msg(sat > 0.05, "%s tile %d floor: saturated_frac %g; the data should clip under the OCP floor", fmt_name(f),
                          tiles[ti], sat);
            fp4rl_tensor_destroy(q);
        }
    fp4rl_tensor_destroy(src);
    free(x);
}
END_TEST

/* NVFP4 by hand. g = 2688 / 2688 = 1; block 1 has amax 102: s = RNE_ue4m3(17) = 16 (tie to even),
 * so 102 / 16 = 6.375 saturates to 6 -> 96, and 40 / 16 = 2.5 ties to 2 -> 32. */
START_TEST(test_nvfp4_by_hand)
{
    float x[32] = {0};
    x[0] = 2688.0f; x[1] = -13.0f; x[16] = 102.0f; x[17] = 40.0f; x[18] = -24.0f; x[19] = 0.5f;
    fp4rl_tensor *src = mk_f32(ctx, 1, 32, x);
    fp4rl_tensor *q = quant(ctx, src, FP4RL_DTYPE_NVFP4, 0, 0, 0);
    qhost h = qh_get(q);
    float *y = deq_f32(ctx, q);
    ck_assert(h.g == 1.0f);
    ck_assert_uint_eq(h.scales[0], 0x7e); /* 448 */
    ck_assert_uint_eq(h.scales[1], 0x58); /* 16 */
    ck_assert(y[0] == 2688.0f);
    ck_assert_uint_eq(qh_code(&h, FP4RL_DTYPE_NVFP4, 32, 0, 1), 0x8); /* -13/448 = -0.029 -> -0 */
    ck_assert(y[1] == 0.0f && signbit(y[1]));
    ck_assert_uint_eq(qh_code(&h, FP4RL_DTYPE_NVFP4, 32, 0, 16), 0x7);
    ck_assert(y[16] == 96.0f);
    ck_assert_uint_eq(qh_code(&h, FP4RL_DTYPE_NVFP4, 32, 0, 17), 0x4);
    ck_assert(y[17] == 32.0f);
    ck_assert_uint_eq(qh_code(&h, FP4RL_DTYPE_NVFP4, 32, 0, 18), 0xB);
    ck_assert(y[18] == -24.0f);
    ck_assert_uint_eq(qh_code(&h, FP4RL_DTYPE_NVFP4, 32, 0, 19), 0x0); /* 0.5/16: underflows */
    double under;
    OK(fp4rl_quant_error(src, q, NULL, &under, NULL, NULL));
    ck_assert(under == 2.0 / 6.0);
    free(y);
    qh_free(&h);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);

    /* a tensor of max 1: g = 1 / 2688 (f32), the block scale (1/6)/g rounds to 448, and
     * 1 decodes to 6 * 448 * g (one f32 rounding) */
    float one[5] = {1.0f, -0.5f, 0.25f, 0.0f, 0.75f};
    src = mk_f32(ctx, 1, 5, one);
    q = quant(ctx, src, FP4RL_DTYPE_NVFP4, 0, 0, 0);
    h = qh_get(q);
    y = deq_f32(ctx, q);
    ck_assert(h.g == 1.0f / 2688.0f);
    ck_assert_uint_eq(h.scales[0], ref_e4m3_encode((1.0f / 6.0f) / h.g));
    ck_assert_uint_eq(h.scales[0], 0x7e);
    ck_assert(y[0] == (float)(2688.0 * (double)h.g));
    ck_assert(fabsf(y[0] - 1.0f) < 1e-6f);
    ck_assert(y[1] == (float)(-1344.0 * (double)h.g)); /* -0.5 -> -3 * 448 * g */
    free(y);
    qh_free(&h);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);
}
END_TEST

START_TEST(test_negative_zero)
{
    /* -0.0 and negatives that round to zero keep the sign bit; they dequantize to -0.0 */
    float x[64];
    for (int c = 0; c < 64; c++) x[c] = (c % 2) ? -0.0f : -1e-6f;
    for (int c = 10; c < 64; c += 16) x[c] = 4.0f; /* an anchor in every block sets its scale */
    fp4rl_tensor *src = mk_f32(ctx, 1, 64, x);
    for (int fi = 0; fi < 4; fi++) {
        fp4rl_dtype f = FORMATS[fi];
        fp4rl_tensor *q = quant(ctx, src, f, 0, 0, 0);
        qhost h = qh_get(q);
        float *y = deq_f32(ctx, q);
        for (int c = 0; c < 64; c++) {
            if (c % 16 == 10) continue;
            uint8_t want = f == FP4RL_DTYPE_MXFP8_E4M3 ? 0x80 : 0x8;
            ck_assert_msg(qh_code(&h, f, 64, 0, c) == want, "%s: code of %g at %d is 0x%x", fmt_name(f), (double)x[c], c,
                          qh_code(&h, f, 64, 0, c));
            ck_assert_msg(y[c] == 0.0f && signbit(y[c]), "%s: deq of %g is %g", fmt_name(f), (double)x[c], (double)y[c]);
        }
        free(y);
        qh_free(&h);
        fp4rl_tensor_destroy(q);
    }
    fp4rl_tensor_destroy(src);
}
END_TEST

/* NaN / +-Inf make their block NaN: scale NaN code, codes 0, every element dequantizes to NaN;
 * the other blocks are untouched, and NVFP4's g comes from the finite elements. */
START_TEST(test_nonfinite_blocks)
{
    const int64_t R = 2, C = 130;
    for (int tile2d = 0; tile2d < 2; tile2d++)
        for (int fi = 0; fi < 4; fi++) {
            const fp4rl_dtype f = FORMATS[fi];
            const int tile = tile2d ? (f == FP4RL_DTYPE_HIF4 ? 64 : 16) : 0;
            float x[2 * 130];
            for (int i = 0; i < R * C; i++) x[i] = (float)((i * 7) % 23) - 11.0f;
            x[5] = NAN;
            x[C + 70] = INFINITY;
            x[C + 129] = -INFINITY;
            fp4rl_tensor *src = mk_f32(ctx, R, C, x);
            fp4rl_tensor *q = quant(ctx, src, f, tile, 0, 0);
            qhost h = qh_get(q);
            float *y = deq_f32(ctx, q);
            const int64_t bw = tile ? tile : f == FP4RL_DTYPE_NVFP4 ? 16 : f == FP4RL_DTYPE_HIF4 ? 64 : 32;
            const int64_t bh = tile ? tile : 1, SC = cdiv(C, bw);
            int64_t nblocks = (f == FP4RL_DTYPE_HIF4 ? cdiv(R, bh) : cdiv(R, bh)) * SC;
            int nan_blocks = 0;
            for (int64_t br = 0; br < cdiv(R, bh); br++)
                for (int64_t bc = 0; bc < SC; bc++) {
                    int bad = 0;
                    for (int64_t r = br * bh; r < (br + 1) * bh && r < R; r++)
                        for (int64_t c = bc * bw; c < (bc + 1) * bw && c < C; c++) bad |= !isfinite(x[r * C + c]);
                    nan_blocks += bad;
                    for (int64_t r = br * bh; r < (br + 1) * bh && r < R; r++) {
                        if (f == FP4RL_DTYPE_HIF4) {
                            uint32_t w = qh_word(&h, (size_t)(r * SC + bc));
                            ck_assert_msg((w == 0xFF) == bad, "%s tile %d: word 0x%08x of block (%lld,%lld)", fmt_name(f), tile, w,
                                          (long long)r, (long long)bc);
                        } else {
                            uint8_t s = h.scales[br * SC + bc], nanc = f == FP4RL_DTYPE_NVFP4 ? 0x7F : 0xFF;
                            ck_assert_msg((s == nanc) == bad, "%s tile %d: scale 0x%02x of block (%lld,%lld)", fmt_name(f), tile, s,
                                          (long long)br, (long long)bc);
                        }
                        for (int64_t c = bc * bw; c < (bc + 1) * bw && c < C; c++) {
                            if (bad) {
                                ck_assert_uint_eq(qh_code(&h, f, C, r, c), 0);
                                ck_assert(isnan(y[r * C + c]));
                            } else {
                                ck_assert(isfinite(y[r * C + c]));
                            }
                        }
                    }
                }
            ck_assert_int_eq(nan_blocks, 3);
            double nanf;
            OK(fp4rl_quant_error(src, q, NULL, NULL, NULL, &nanf));
            ck_assert_msg(nanf == (double)nan_blocks / (double)nblocks, "%s: nan_block_frac %g", fmt_name(f), nanf);
            if (f == FP4RL_DTYPE_NVFP4) ck_assert(h.g == 11.0f / 2688.0f);
            free(y);
            qh_free(&h);
            fp4rl_tensor_destroy(q);
            fp4rl_tensor_destroy(src);
        }
}
END_TEST

/* Tails: layout sizes for C not a multiple of the block, and the tail block's scale comes from the
 * tail's elements only. Odd rows: every row's padding nibble is 0. */
START_TEST(test_tails_and_odd_rows)
{
    const int64_t R = 3, C = 45;
    float x[3 * 45];
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) x[r * C + c] = c < 32 ? -1.0f : -100.0f; /* MX tail = cols 32..44 */
    fp4rl_tensor *src = mk_f32(ctx, R, C, x);
    for (int fi = 0; fi < 4; fi++) {
        const fp4rl_dtype f = FORMATS[fi];
        fp4rl_tensor *q = quant(ctx, src, f, 0, 0, 0);
        qhost h = qh_get(q);
        size_t want_codes = (size_t)(R * (is_fp4(f) ? 23 : 45));
        size_t want_scales = f == FP4RL_DTYPE_HIF4 ? (size_t)(R * 1 * 4) : (size_t)(R * cdiv(C, f == FP4RL_DTYPE_NVFP4 ? 16 : 32));
        ck_assert_uint_eq(h.ncodes, want_codes);
        ck_assert_uint_eq(h.nscales, want_scales);
        if (f == FP4RL_DTYPE_MXFP4 || f == FP4RL_DTYPE_MXFP8_E4M3) {
            int emax = f == FP4RL_DTYPE_MXFP4 ? 2 : 8;
            for (int64_t r = 0; r < R; r++) {
                ck_assert_int_eq(h.scales[r * 2], 127 + 0 - emax);  /* floor(log2 1) - emax */
                ck_assert_int_eq(h.scales[r * 2 + 1], 127 + 6 - emax); /* floor(log2 100) - emax */
            }
        }
        if (is_fp4(f))
            for (int64_t r = 0; r < R; r++) ck_assert_msg((h.codes[r * 23 + 22] & 0xF0) == 0, "%s row %lld: padding nibble", fmt_name(f), (long long)r);
        /* the same bytes import back (import rejects a dirty padding nibble) */
        fp4rl_tensor *back = NULL;
        int64_t shape[2] = {R, C};
        OK(fp4rl_tensor_import_quantized(&back, ctx, f, 2, shape, 0, h.codes, h.ncodes, h.scales, h.nscales, h.g));
        float *y0 = deq_f32(ctx, q), *y1 = deq_f32(ctx, back);
        ck_assert(memcmp(y0, y1, sizeof(float) * (size_t)(R * C)) == 0);
        free(y0);
        free(y1);
        fp4rl_tensor_destroy(back);
        qh_free(&h);
        fp4rl_tensor_destroy(q);
    }
    fp4rl_tensor_destroy(src);
}
END_TEST

/* One-element tensors, by hand: x = 3. */
START_TEST(test_one_element)
{
    const float three = 3.0f;
    const int64_t s1[1] = {1};
    fp4rl_tensor *t1 = NULL;
    OK(fp4rl_tensor_from_host(&t1, ctx, FP4RL_DTYPE_F32, 1, s1, &three));
    fp4rl_tensor *t2 = mk_f32(ctx, 1, 1, &three);
    for (int k = 0; k < 2; k++) {
        fp4rl_tensor *src = k ? t2 : t1;
        struct { fp4rl_dtype f; uint8_t code; uint32_t scale; float deq; } want[4] = {
            {FP4RL_DTYPE_MXFP4, 0x7, 126, 3.0f},           /* e = 1 - 2: 3 / 0.5 = 6 */
            {FP4RL_DTYPE_MXFP8_E4M3, 0x7C, 120, 3.0f},     /* e = 1 - 8: 3 * 128 = 384 = 1.5 * 2^8 */
            {FP4RL_DTYPE_NVFP4, 0x7, 0x7E, 0.0f},          /* g = 3/2688, s = 448, 6 * 448 * g */
            {FP4RL_DTYPE_HIF4, 0x7, 0x000101BBu, 3.0625f}, /* base 1.75/4, rec 2.28125, inc 2 */
        };
        for (int i = 0; i < 4; i++) {
            fp4rl_tensor *q = quant(ctx, src, want[i].f, 0, 0, 0);
            qhost h = qh_get(q);
            float *y = deq_f32(ctx, q);
            ck_assert_uint_eq(h.ncodes, 1);
            ck_assert_uint_eq(h.codes[0], want[i].code); /* high nibble (padding) 0 for FP4 */
            if (want[i].f == FP4RL_DTYPE_HIF4) ck_assert_uint_eq(qh_word(&h, 0), want[i].scale);
            else ck_assert_uint_eq(h.scales[0], want[i].scale);
            if (want[i].f == FP4RL_DTYPE_NVFP4) {
                ck_assert(h.g == 3.0f / 2688.0f);
                ck_assert(y[0] == (float)(2688.0 * (double)h.g));
                ck_assert(fabsf(y[0] - 3.0f) <= 3e-7f * 3);
            } else {
                ck_assert_msg(y[0] == want[i].deq, "%s: %a", fmt_name(want[i].f), (double)y[0]);
            }
            free(y);
            qh_free(&h);
            fp4rl_tensor_destroy(q);
        }
    }
    fp4rl_tensor_destroy(t1);
    fp4rl_tensor_destroy(t2);
}
END_TEST

/* ================================ transposition ============================================== */

static void expect_same_quant(const fp4rl_tensor *a, const fp4rl_tensor *b, const char *what)
{
    qhost ha = qh_get(a), hb = qh_get(b);
    ck_assert_int_eq(fp4rl_tensor_dim(a, 0), fp4rl_tensor_dim(b, 0));
    ck_assert_int_eq(fp4rl_tensor_dim(a, 1), fp4rl_tensor_dim(b, 1));
    ck_assert_int_eq(ha.tile, hb.tile);
    ck_assert_msg(ha.ncodes == hb.ncodes && memcmp(ha.codes, hb.codes, ha.ncodes) == 0, "%s: codes differ", what);
    ck_assert_msg(ha.nscales == hb.nscales && memcmp(ha.scales, hb.scales, ha.nscales) == 0, "%s: scales differ", what);
    ck_assert_msg(f32_bits(ha.g) == f32_bits(hb.g), "%s: tensor scale %a vs %a", what, (double)ha.g, (double)hb.g);
    qh_free(&ha);
    qh_free(&hb);
}

START_TEST(test_transpose_invariance_2d)
{
    static const int64_t shapes[][2] = {{70, 45}, {129, 67}, {1, 5}, {5, 1}, {64, 64}, {100, 130}};
    trng rg = trng_make(14);
    int runs = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t R = shapes[si][0], C = shapes[si][1];
        float *x = malloc((size_t)(R * C) * sizeof(float)), *xt = malloc((size_t)(R * C) * sizeof(float));
        for (int64_t i = 0; i < R * C; i++) x[i] = trng_heavy(&rg);
        if (si == 5) x[3 * C + 100] = NAN; /* a NaN tile transposes too */
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) xt[c * R + r] = x[r * C + c];
        for (int bf = 0; bf < 2; bf++) {
            fp4rl_tensor *w = bf ? mk_bf16(ctx, R, C, x) : mk_f32(ctx, R, C, x);
            fp4rl_tensor *wt = bf ? mk_bf16(ctx, C, R, xt) : mk_f32(ctx, C, R, xt);
            for (int fi = 0; fi < 4; fi++) {
                int tiles[4], nt = tiles_of(FORMATS[fi], tiles);
                for (int ti = 1; ti < nt; ti++)
                    for (int tf = 0; tf < 2; tf++) {
                        char what[96];
                        snprintf(what, sizeof what, "%s tile %d %s %lldx%lld %s", fmt_name(FORMATS[fi]), tiles[ti], tf ? "tf" : "floor",
                                 (long long)R, (long long)C, bf ? "bf16" : "f32");
                        fp4rl_tensor *q = quant(ctx, w, FORMATS[fi], tiles[ti], tf, 0);
                        fp4rl_tensor *qt = quant(ctx, wt, FORMATS[fi], tiles[ti], tf, 0);
                        fp4rl_tensor *tq = NULL;
                        OK(fp4rl_tensor_transpose(&tq, ctx, q));
                        expect_same_quant(tq, qt, what);
                        /* and transposing back gives the original bits */
                        fp4rl_tensor *tqt = NULL;
                        OK(fp4rl_tensor_transpose(&tqt, ctx, tq));
                        expect_same_quant(tqt, q, what);
                        fp4rl_tensor_destroy(tqt);
                        fp4rl_tensor_destroy(tq);
                        fp4rl_tensor_destroy(qt);
                        fp4rl_tensor_destroy(q);
                        runs++;
                    }
            }
            fp4rl_tensor_destroy(w);
            fp4rl_tensor_destroy(wt);
        }
        free(x);
        free(xt);
    }
    ck_assert_int_eq(runs, 6 * 2 * (3 + 3 + 1 + 3) * 2);
}
END_TEST

/* With 1D blocks, quantizing along rows and along columns gives different numbers: a fixed
 * fraction of the entries of deq(Q(W)) and deq(Q(W^T))^T differ on heavy-tailed data, while the
 * 2D tiles agree exactly. */
START_TEST(test_1d_rows_vs_columns_disagree)
{
    const int64_t R = 128, C = 192;
    float *x = malloc((size_t)(R * C) * sizeof(float)), *xt = malloc((size_t)(R * C) * sizeof(float));
    trng rg = trng_make(15);
    for (int64_t i = 0; i < R * C; i++) x[i] = trng_heavy(&rg);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) xt[c * R + r] = x[r * C + c];
    fp4rl_tensor *w = mk_f32(ctx, R, C, x), *wt = mk_f32(ctx, C, R, xt);
    for (int fi = 0; fi < 4; fi++)
        for (int two_d = 0; two_d < 2; two_d++) {
            const fp4rl_dtype f = FORMATS[fi];
            const int tile = two_d ? (f == FP4RL_DTYPE_HIF4 ? 64 : 32) : 0;
            fp4rl_tensor *q = quant(ctx, w, f, tile, 0, 0), *qt = quant(ctx, wt, f, tile, 0, 0);
            fp4rl_tensor *d = NULL, *dt = NULL, *dtt = NULL;
            OK(fp4rl_dequantize(&d, ctx, q, FP4RL_DTYPE_F32));
            OK(fp4rl_dequantize(&dt, ctx, qt, FP4RL_DTYPE_F32));
            OK(fp4rl_tensor_transpose(&dtt, ctx, dt)); /* a dense transpose */
            float *a = malloc((size_t)(R * C) * sizeof(float)), *b = malloc((size_t)(R * C) * sizeof(float));
            OK(fp4rl_tensor_to_host(d, a, (size_t)(R * C) * sizeof(float)));
            OK(fp4rl_tensor_to_host(dtt, b, (size_t)(R * C) * sizeof(float)));
            int64_t differ = 0;
            for (int64_t i = 0; i < R * C; i++) differ += a[i] != b[i];
            double frac = (double)differ / (double)(R * C);
            if (two_d) ck_assert_msg(differ == 0, "%s 2D: %lld entries differ", fmt_name(f), (long long)differ);
            /* FP4: > 5%. E4M3 is a float format, so its block scale only shifts exponents and the
             * two directions differ only where one side saturates or goes subnormal: > 0.2%. */
            else ck_assert_msg(frac > (is_fp4(f) ? 0.05 : 0.002), "%s 1D: only %.2f%% of entries differ between row and column blocks",
                               fmt_name(f), 100 * frac);
            free(a);
            free(b);
            fp4rl_tensor_destroy(d);
            fp4rl_tensor_destroy(dt);
            fp4rl_tensor_destroy(dtt);
            fp4rl_tensor_destroy(q);
            fp4rl_tensor_destroy(qt);
        }
    fp4rl_tensor_destroy(w);
    fp4rl_tensor_destroy(wt);
    free(x);
    free(xt);
}
END_TEST

START_TEST(test_transpose_1d_unsupported)
{
    float x[6 * 40];
    for (int i = 0; i < 240; i++) x[i] = (float)i;
    fp4rl_tensor *src = mk_f32(ctx, 6, 40, x);
    for (int fi = 0; fi < 4; fi++) {
        fp4rl_tensor *q = quant(ctx, src, FORMATS[fi], 0, 0, 0);
        fp4rl_tensor *sentinel = (fp4rl_tensor *)&x[0], *out = sentinel;
        fp4rl_status st = fp4rl_tensor_transpose(&out, ctx, q);
        ck_assert_msg(st == FP4RL_ERR_UNSUPPORTED, "%s: transpose of 1D gave %s", fmt_name(FORMATS[fi]), fp4rl_status_name(st));
        ck_assert(strlen(fp4rl_last_error()) > 0);
        ck_assert(out == sentinel); /* outputs untouched on failure */
        fp4rl_tensor_destroy(q);
    }
    fp4rl_tensor_destroy(src);
}
END_TEST

/* ================================ stochastic rounding ======================================== */

static int codes_equal(const fp4rl_tensor *a, const fp4rl_tensor *b)
{
    qhost ha = qh_get(a), hb = qh_get(b);
    int eq = ha.ncodes == hb.ncodes && memcmp(ha.codes, hb.codes, ha.ncodes) == 0 && ha.nscales == hb.nscales &&
             memcmp(ha.scales, hb.scales, ha.nscales) == 0;
    qh_free(&ha);
    qh_free(&hb);
    return eq;
}

START_TEST(test_sr_replay_and_offsets)
{
    const int64_t R = 16, C = 96;
    float x[16 * 96];
    trng rg = trng_make(16);
    for (int i = 0; i < R * C; i++) x[i] = (float)trng_gauss(&rg);
    fp4rl_tensor *src = mk_f32(ctx, R, C, x);
    for (int fi = 0; fi < 4; fi++) {
        const fp4rl_dtype f = FORMATS[fi];
        uint64_t seed, off;
        OK(fp4rl_context_set_rng_offset(ctx, 99));
        OK(fp4rl_context_set_seed(ctx, 1234));
        OK(fp4rl_context_get_rng(ctx, &seed, &off));
        ck_assert(seed == 1234 && off == 0); /* set_seed resets the offset */
        OK(fp4rl_context_set_rng_offset(ctx, 7));
        fp4rl_tensor *a = quant(ctx, src, f, 0, 1, 1);
        OK(fp4rl_context_get_rng(ctx, NULL, &off));
        ck_assert_uint_eq(off, 8);
        fp4rl_tensor *b = quant(ctx, src, f, 0, 1, 1); /* offset 8 */
        OK(fp4rl_context_get_rng(ctx, NULL, &off));
        ck_assert_uint_eq(off, 9);
        fp4rl_tensor *n = quant(ctx, src, f, 0, 1, 0); /* nearest does not advance */
        OK(fp4rl_context_get_rng(ctx, NULL, &off));
        ck_assert_uint_eq(off, 9);
        OK(fp4rl_context_set_rng_offset(ctx, 7));
        fp4rl_tensor *a2 = quant(ctx, src, f, 0, 1, 1); /* replay of (1234, 7) */
        ck_assert_msg(codes_equal(a, a2), "%s: (seed, offset) replay differs", fmt_name(f));
        ck_assert_msg(!codes_equal(a, b), "%s: offsets 7 and 8 gave the same bits", fmt_name(f));
        ck_assert_msg(!codes_equal(a, n), "%s: stochastic equals nearest", fmt_name(f));
        /* the scales are those of nearest rounding: SR touches elements only */
        qhost ha = qh_get(a), hn = qh_get(n);
        ck_assert(memcmp(ha.scales, hn.scales, ha.nscales) == 0 && f32_bits(ha.g) == f32_bits(hn.g));
        qh_free(&ha);
        qh_free(&hn);
        /* another seed, same offset: different bits */
        OK(fp4rl_context_set_seed(ctx, 1235));
        OK(fp4rl_context_set_rng_offset(ctx, 7));
        fp4rl_tensor *c = quant(ctx, src, f, 0, 1, 1);
        ck_assert(!codes_equal(a, c));
        /* the policy's seed overrides the context's; the context's offset still advances */
        fp4rl_quant_policy *p = mk_policy(f, 0, 1, 1, 1234);
        fp4rl_tensor *d = NULL;
        OK(fp4rl_context_set_rng_offset(ctx, 7));
        OK(fp4rl_quantize(&d, ctx, src, f, p, FP4RL_ROLE_ACTIVATION));
        OK(fp4rl_context_get_rng(ctx, &seed, &off));
        ck_assert(seed == 1235 && off == 8);
        ck_assert_msg(codes_equal(a, d), "%s: policy seed 1234 differs from context seed 1234", fmt_name(f));
        fp4rl_quant_policy_destroy(p);
        fp4rl_tensor_destroy(a);
        fp4rl_tensor_destroy(a2);
        fp4rl_tensor_destroy(b);
        fp4rl_tensor_destroy(c);
        fp4rl_tensor_destroy(d);
        fp4rl_tensor_destroy(n);
    }
    fp4rl_tensor_destroy(src);
}
END_TEST

/* The comparison is exactly the spec's `u < (v - lo) / (hi - lo)` with u = (out >> 8) * 2^-24:
 * elements placed exactly on v = lo + u * (hi - lo) (scale 2^0, lo = 0, hi = 0.5, so v = u / 2,
 * exact in f32) must stay at lo; one ulp above, they must go up. Any other u (another lane, bit
 * shift, counter or key) or a <= shows up here. And u = 0 is a valid draw that rounds every
 * off-grid value up: (seed 1, offset 270842) gives u = 0 for element 0. */
START_TEST(test_sr_exact_u_boundaries)
{
    const int64_t R = 4, C = 32;
    const uint64_t seed = 77, off = 5;
    float x[4 * 32], xu[4 * 32];
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            int64_t i = r * C + c;
            float v = (float)(ref_sr_u(seed, off, (uint64_t)i) / 2);
            ck_assert((double)v * 2 == ref_sr_u(seed, off, (uint64_t)i));
            x[i] = (c % 2) ? -v : v;
            xu[i] = (c % 2) ? -nextafterf(v, 1.0f) : nextafterf(v, 1.0f);
            if (c == 0) x[i] = xu[i] = 4.0f; /* anchor: scale 2^0 under the OCP floor */
        }
    for (int up = 0; up < 2; up++) {
        fp4rl_tensor *src = mk_f32(ctx, R, C, up ? xu : x);
        OK(fp4rl_context_set_seed(ctx, seed));
        OK(fp4rl_context_set_rng_offset(ctx, off));
        fp4rl_tensor *q = quant(ctx, src, FP4RL_DTYPE_MXFP4, 0, 0, 1);
        qhost h = qh_get(q);
        for (int64_t r = 0; r < R; r++) {
            ck_assert_uint_eq(h.scales[r], 127);
            for (int64_t c = 1; c < C; c++) {
                uint8_t want = (uint8_t)(((c % 2) ? 8 : 0) | (up ? 1 : 0));
                ck_assert_msg(qh_code(&h, FP4RL_DTYPE_MXFP4, C, r, c) == want, "element %lld: v = u/2 %s: code 0x%x, want 0x%x",
                              (long long)(r * C + c), up ? "+ 1 ulp" : "exactly", qh_code(&h, FP4RL_DTYPE_MXFP4, C, r, c), want);
            }
        }
        qh_free(&h);
        fp4rl_tensor_destroy(q);
        fp4rl_tensor_destroy(src);
    }
    /* u = 0: 0.1 rounds up to 0.5 (nearest would give 0) */
    ck_assert(ref_sr_u(1, 270842, 0) == 0.0);
    float z[32] = {0.1f, 4.0f};
    fp4rl_tensor *src = mk_f32(ctx, 1, 32, z);
    OK(fp4rl_context_set_seed(ctx, 1));
    OK(fp4rl_context_set_rng_offset(ctx, 270842));
    fp4rl_tensor *q = quant(ctx, src, FP4RL_DTYPE_MXFP4, 0, 0, 1);
    qhost h = qh_get(q);
    ck_assert_uint_eq(qh_code(&h, FP4RL_DTYPE_MXFP4, 32, 0, 0), 0x1);
    qh_free(&h);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);
}
END_TEST

/* Unbiasedness: over n = 2000 offsets the mean of the dequantized values converges to x. Each
 * draw is x's lower or upper neighbour (spacing `step`), so its standard deviation is at most
 * step / 2 and |mean - x| <= 5 * (step / 2) / sqrt(n) holds with overwhelming probability (the
 * seed is fixed, so the test is deterministic). Elements that are clipped (beyond the largest
 * magnitude of their block / position) are excluded: there SR saturates like RNE. */
START_TEST(test_sr_unbiased)
{
    const int n = 2000, C = 64;
    for (int fi = 0; fi < 4; fi++) {
        const fp4rl_dtype f = FORMATS[fi];
        float x[64];
        trng rg = trng_make(17 + (uint64_t)fi);
        double amp = f == FP4RL_DTYPE_NVFP4 ? 2688.0 : f == FP4RL_DTYPE_HIF4 ? 7.0 : 3.0;
        for (int c = 0; c < C; c++) x[c] = (float)((trng_unif(&rg) * 2 - 1) * amp);
        /* anchors: NVFP4 every 16-block max 2688 (g = 1, s = 448 exactly); HiF4 max 7 (base 1) */
        if (f == FP4RL_DTYPE_NVFP4) for (int c = 0; c < C; c += 16) x[c] = 2688.0f;
        if (f == FP4RL_DTYPE_HIF4) x[0] = 7.0f;
        fp4rl_tensor *src = mk_f32(ctx, 1, C, x);
        OK(fp4rl_context_set_seed(ctx, 42 + (uint64_t)fi));
        double sum[64] = {0}, lo[64], hi[64];
        int clipped[64] = {0};
        for (int k = 0; k < n; k++) {
            fp4rl_tensor *q = quant(ctx, src, f, 0, 1, 1);
            float *y = deq_f32(ctx, q);
            if (k == 0) {
                /* each element's two neighbours on its grid, from the scales (which SR does not
                 * touch), and whether it is clipped */
                qhost h = qh_get(q);
                for (int c = 0; c < C; c++) {
                    double X, a = fabs((double)x[c]);
                    const double *tab;
                    unsigned ntab, l, u;
                    double hif4_tab[8];
                    if (f == FP4RL_DTYPE_HIF4) {
                        uint32_t w = qh_word(&h, 0);
                        int inc = (int)((w >> (8 + c / 8)) & 1) + (int)((w >> (16 + c / 4)) & 1);
                        X = ldexp(1.0, inc) * ldexp(1.0 + (w & 3) / 4.0, (int)((w & 0xFF) >> 2) - 48);
                        for (int j = 0; j < 8; j++) hif4_tab[j] = j / 4.0;
                        tab = hif4_tab;
                        ntab = 8;
                    } else if (f == FP4RL_DTYPE_NVFP4) {
                        X = ref_e4m3(h.scales[c / 16]) * h.g;
                        tab = E2M1_MAG;
                        ntab = 8;
                    } else {
                        X = ref_e8m0(h.scales[0]);
                        tab = f == FP4RL_DTYPE_MXFP4 ? E2M1_MAG : E4M3_MAG;
                        ntab = f == FP4RL_DTYPE_MXFP4 ? 8 : 127;
                    }
                    clipped[c] = a > tab[ntab - 1] * X;
                    ref_grid_bracket(a / X, tab, ntab, &l, &u);
                    lo[c] = tab[l] * X;
                    hi[c] = tab[u] * X;
                    if (x[c] < 0) {
                        double t = -lo[c];
                        lo[c] = -hi[c];
                        hi[c] = t;
                    }
                }
                qh_free(&h);
            }
            for (int c = 0; c < C; c++) {
                sum[c] += y[c];
                if (!clipped[c])
                    ck_assert_msg((double)y[c] == lo[c] || (double)y[c] == hi[c], "%s: draw %g of %g is not a neighbour (%g, %g)",
                                  fmt_name(f), (double)y[c], (double)x[c], lo[c], hi[c]);
            }
            free(y);
            fp4rl_tensor_destroy(q);
        }
        uint64_t off;
        OK(fp4rl_context_get_rng(ctx, NULL, &off));
        ck_assert_uint_eq(off, (uint64_t)n);
        int tested = 0, nclipped = 0, moved = 0;
        for (int c = 0; c < C; c++) {
            if (f != FP4RL_DTYPE_HIF4) ck_assert_msg(!clipped[c], "%s: element %d clipped under a truncation-free scale", fmt_name(f), c);
            if (clipped[c]) {
                nclipped++;
                continue;
            }
            double mean = sum[c] / n, step = hi[c] - lo[c];
            ck_assert_msg(lo[c] <= x[c] && x[c] <= hi[c], "%s: %g outside [%g, %g]", fmt_name(f), (double)x[c], lo[c], hi[c]);
            ck_assert_msg(fabs(mean - x[c]) <= 5.0 * (step / 2) / sqrt((double)n),
                          "%s: element %d: mean %.9g vs x %.9g (step %g)", fmt_name(f), c, mean, (double)x[c], step);
            /* and nearest rounding would be off by much more for most elements */
            moved += fabs(mean - x[c]) < 0.1 * fmin(x[c] - lo[c], hi[c] - x[c]);
            tested++;
        }
        ck_assert_msg(moved >= tested / 2, "%s: only %d of %d means are closer to x than to its neighbours", fmt_name(f), moved, tested);
        ck_assert_msg(nclipped <= C / 4, "%s: %d of %d elements clipped", fmt_name(f), nclipped, C);
        ck_assert(tested >= 3 * C / 4);
        fp4rl_tensor_destroy(src);
    }
}
END_TEST

/* ================================ error figures ============================================== */

START_TEST(test_gaussian_mse_ratios)
{
    const int64_t R = 256, C = 4096;
    float *x = malloc((size_t)(R * C) * sizeof(float));
    trng rg = trng_make(18);
    for (int64_t i = 0; i < R * C; i++) x[i] = (float)trng_gauss(&rg);
    fp4rl_tensor *src = mk_f32(ctx, R, C, x);
    double mse[3];
    const fp4rl_dtype f[3] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4};
    for (int i = 0; i < 3; i++) {
        fp4rl_tensor *q = quant(ctx, src, f[i], 0, 0, 0); /* 1D, OCP floor, nearest */
        OK(fp4rl_quant_error(src, q, &mse[i], NULL, NULL, NULL));
        fp4rl_tensor_destroy(q);
    }
    double nv = mse[1] / mse[2], mx = mse[0] / mse[2];
    printf("Gaussian 256x4096 rel. MSE: MXFP4 %.5f NVFP4 %.5f HiF4 %.5f; NVFP4/HiF4 = %.4f (spec 1.31), MXFP4/HiF4 = %.4f (spec 1.89)\n",
           mse[0], mse[1], mse[2], nv, mx);
    ck_assert_msg(fabs(nv / 1.31 - 1) <= 0.03, "MSE(NVFP4)/MSE(HiF4) = %.4f, spec ~1.31", nv);
    ck_assert_msg(fabs(mx / 1.89 - 1) <= 0.03, "MSE(MXFP4)/MSE(HiF4) = %.4f, spec ~1.89", mx);
    fp4rl_tensor_destroy(src);
    free(x);
}
END_TEST

START_TEST(test_quant_error_sanity)
{
    /* exactly representable data: zero error everywhere */
    trng rg = trng_make(19);
    const int64_t R = 8, C = 96;
    float x[8 * 96];
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            int k = (int)(r * 3 + c / 32) - 10; /* a binade per block */
            x[r * C + c] = (float)(ref_e2m1((uint8_t)(trng_u64(&rg) & 15)) * ldexp(1.0, k));
            if (c % 32 == 0) x[r * C + c] = (float)ldexp(6.0, k); /* block max 6 * 2^k: e = k under both rules */
        }
    fp4rl_tensor *src = mk_f32(ctx, R, C, x);
    for (int tf = 0; tf < 2; tf++) {
        fp4rl_tensor *q = quant(ctx, src, FP4RL_DTYPE_MXFP4, 0, tf, 0);
        double mse = -1, under = -1, sat = -1, nanf = -1;
        OK(fp4rl_quant_error(src, q, &mse, &under, &sat, &nanf));
        ck_assert_msg(mse == 0 && under == 0 && sat == 0 && nanf == 0, "exact MXFP4: %g %g %g %g", mse, under, sat, nanf);
        fp4rl_tensor_destroy(q);
    }
    /* MXFP8 and re-quantization of dequantized MX data is exact (OCP floor is idempotent) */
    for (int fi = 0; fi < 4; fi += 3) {
        float g[8 * 96];
        for (int i = 0; i < R * C; i++) g[i] = trng_heavy(&rg);
        fp4rl_tensor *s0 = mk_f32(ctx, R, C, g), *q0 = quant(ctx, s0, FORMATS[fi], 0, 0, 0);
        float *y = deq_f32(ctx, q0);
        fp4rl_tensor *s1 = mk_f32(ctx, R, C, y), *q1 = quant(ctx, s1, FORMATS[fi], 0, 0, 0);
        double mse = -1, under = -1;
        OK(fp4rl_quant_error(s1, q1, &mse, &under, NULL, NULL));
        ck_assert_msg(mse == 0 && under == 0, "%s requantized: mse %g under %g", fmt_name(FORMATS[fi]), mse, under);
        free(y);
        fp4rl_tensor_destroy(s0);
        fp4rl_tensor_destroy(q0);
        fp4rl_tensor_destroy(s1);
        fp4rl_tensor_destroy(q1);
    }
    /* HiF4: the decoded spec vector A is exactly representable */
    float a[64] = {0};
    a[0] = 7.0f; a[1] = -1.0f; a[8] = 1.0f; a[9] = 3.0f; a[16] = 0.25f;
    fp4rl_tensor *sa = mk_f32(ctx, 1, 64, a), *qa = quant(ctx, sa, FP4RL_DTYPE_HIF4, 0, 0, 0);
    double mse = -1, sat = -1;
    OK(fp4rl_quant_error(sa, qa, &mse, NULL, &sat, NULL));
    ck_assert(mse == 0 && sat == 0);
    fp4rl_tensor_destroy(sa);
    fp4rl_tensor_destroy(qa);
    fp4rl_tensor_destroy(src);

    /* underflow: a block [1000, 31 tiny values]: 2^7 scale, 1e-3 / 128 rounds to zero */
    float u[2 * 32];
    for (int c = 0; c < 32; c++) { u[c] = (c % 2 ? -1e-3f : 1e-3f); u[32 + c] = 1.0f; }
    u[0] = 1000.0f;
    fp4rl_tensor *su = mk_f32(ctx, 2, 32, u), *qu = quant(ctx, su, FP4RL_DTYPE_MXFP4, 0, 0, 0);
    double under = -1, rel = -1;
    OK(fp4rl_quant_error(su, qu, &rel, &under, NULL, NULL));
    ck_assert_msg(under == 31.0 / 64.0, "underflow_frac %g, want 31/64", under);
    /* rel_mse by hand: 1000 -> 1024 (1000/128 = 7.8 saturates to 6? no: floor e = 9 - 2 = 7, 7.8 -> 6 -> 768) */
    double se = (1000.0 - 768.0) * (1000.0 - 768.0) + 31 * 1e-6, sx = 1e6 + 31 * 1e-6 + 32;
    ck_assert_msg(fabs(rel - se / sx) <= 1e-6 * (se / sx), "rel_mse %.9g, want %.9g", rel, se / sx);
    double sat2;
    OK(fp4rl_quant_error(su, qu, NULL, NULL, &sat2, NULL));
    ck_assert(sat2 == 0.5); /* the first block clipped 1000 to 768 */
    fp4rl_tensor_destroy(su);
    fp4rl_tensor_destroy(qu);
}
END_TEST

Suite *quantize_suite(void)
{
    Suite *s = suite_create("quantize");
    TCase *tc = tcase_create("model");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_matches_reference_model);
    tcase_add_test(tc, test_nd_view);
    suite_add_tcase(s, tc);
    tc = tcase_create("edges");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_zero_blocks);
    tcase_add_test(tc, test_saturation_floor_vs_truncation_free);
    tcase_add_test(tc, test_truncation_free_never_saturates);
    tcase_add_test(tc, test_nvfp4_by_hand);
    tcase_add_test(tc, test_negative_zero);
    tcase_add_test(tc, test_nonfinite_blocks);
    tcase_add_test(tc, test_tails_and_odd_rows);
    tcase_add_test(tc, test_one_element);
    suite_add_tcase(s, tc);
    tc = tcase_create("transpose");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_transpose_invariance_2d);
    tcase_add_test(tc, test_1d_rows_vs_columns_disagree);
    tcase_add_test(tc, test_transpose_1d_unsupported);
    suite_add_tcase(s, tc);
    tc = tcase_create("stochastic");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_sr_replay_and_offsets);
    tcase_add_test(tc, test_sr_exact_u_boundaries);
    tcase_add_test(tc, test_sr_unbiased);
    suite_add_tcase(s, tc);
    tc = tcase_create("error");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_gaussian_mse_ratios);
    tcase_add_test(tc, test_quant_error_sanity);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(quantize_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
