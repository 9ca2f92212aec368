/*
 * test_decode_layout.c - the packed layout of the decode GEMM (cuda/decode_layout.h) on the CPU,
 * no GPU needed: weights quantized by the CPU reference are re-laid out with the same lane
 * builder the device re-layout kernel runs, and every weight is decoded back out of the records
 * the way the kernel does it (the same pattern, multiplier and increment functions; the BF16
 * multiply as a float product that must be exact). Times alpha it must equal fp4rl_dequantize's
 * F32 value bit for bit (NaN for NaN), for MXFP4, NVFP4 and HiF4, 1D and 2D tiles, ragged shapes,
 * NaN blocks, zero blocks, scales that need an exponent offset d > 0 and NVFP4's subnormal
 * scales. The products in the kernel's MMAs are these values times BF16 activations (exact in
 * FP32), so this pins everything but the kernel's indexing, which the GPU test checks.
 */
#include "fmt_test_util.h"
#include "check_run.h"
#include "decode_layout.h"

static fp4rl_context *ctx;
static void setup(void) { OK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0)); }
static void teardown(void) { fp4rl_context_destroy(ctx); }

static float bf16f(uint32_t h) { return bits_f32((h & 0xffffu) << 16); }

/* The BF16 product a * b of the kernel's HMUL2, which the layout makes exact: asserted here. */
static float bf16_mul(uint32_t a, uint32_t b)
{
    const float p = bf16f(a) * bf16f(b);
    ck_assert_msg(isnan(p) || isinf(p) || ref_bf16_round(p) == p, "BF16 product %a * %a = %a is not exact", bf16f(a), bf16f(b), p);
    return p;
}

/* Element (n, k) decoded from the records as lane (g, t) of the kernel does: word j of the
 * lane's 16 bytes, pattern p, half hi, times the lane's multiplier of that row and micro-block. */
static float decode_at(int fmt, const uint8_t *recs, int64_t kgs, uint32_t c2, int64_t n, int64_t k)
{
    const int64_t i = n / FP4RL_DG_TILE, c = k / FP4RL_DG_KGROUP;
    const int r = (int)(n % FP4RL_DG_TILE), g = r % 8, row8 = r / 8, kk = (int)(k % FP4RL_DG_KGROUP);
    const int t = kk / 16, j = (kk % 16) / 4, e = kk % 4, lane = 4 * g + t;
    const uint8_t *rec = recs + (i * kgs + c) * fp4rl_dg_record_bytes(fmt);
    const uint8_t *w = rec + 16 * lane + 4 * j;
    const uint32_t q = (uint32_t)w[0] | (uint32_t)w[1] << 8 | (uint32_t)w[2] << 16 | (uint32_t)w[3] << 24;
    uint32_t P[4];
    fp4rl_dg_patterns(fmt, q, P);
    const uint32_t pat = P[(e < 2 ? 0 : 2) + row8] >> (16 * (e & 1));
    const uint8_t *sc = rec + FP4RL_DG_CODE_BYTES;
    uint32_t m;
    if (fmt == FP4RL_DTYPE_HIF4) {
        const uint32_t hb = sc[64 + 2 * g] | (uint32_t)sc[64 + 2 * g + 1] << 8;
        const uint32_t sb = fp4rl_dg_mult(fmt, fp4rl_dg_dup_byte(hb, row8), c2);
        const uint32_t h = sc[2 * lane] | (uint32_t)sc[2 * lane + 1] << 8;
        m = fp4rl_dg_inc_mult(row8 ? h >> 8 : h, j, sb);
    } else {
        const int s = fp4rl_dg_scale_slot(fmt, g, t);
        const uint32_t hs = sc[2 * s] | (uint32_t)sc[2 * s + 1] << 8;
        m = fp4rl_dg_mult(fmt, fp4rl_dg_dup_byte(hs, row8), c2);
    }
    ck_assert_msg((m & 0xffffu) == (m >> 16), "multiplier halves differ: %08x", m);
    return bf16_mul(pat, m >> (16 * (e & 1)));
}

/* The largest stored scale (MX / HiF4 base bytes, NVFP4 UE4M3 without bit 7), NaN excluded, and
 * the smallest non-zero one: what the device scan computes. */
static void scan_scales(int fmt, const qhost *h, uint32_t *smax, uint32_t *smin)
{
    *smax = 0;
    *smin = 0xffffffffu;
    const size_t n = fmt == FP4RL_DTYPE_HIF4 ? h->nscales / 4 : h->nscales;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = fmt == FP4RL_DTYPE_HIF4 ? qh_word(h, i) & 0xffu : h->scales[i];
        if (fmt == FP4RL_DTYPE_NVFP4) s &= 0x7fu;
        if ((fmt == FP4RL_DTYPE_NVFP4 && s == 0x7fu) || (fmt != FP4RL_DTYPE_NVFP4 && s == 0xffu)) continue;
        if (s > *smax) *smax = s;
        if (s && s < *smin) *smin = s;
    }
}

/* Quantizes x [N, K] (format fmt, tile, scale rule), re-lays it out and checks every element.
 * Returns d. */
static int check_layout(int fmt, int tile, int tf, int64_t N, int64_t K, const float *x)
{
    fp4rl_tensor *src = mk_f32(ctx, N, K, x);
    fp4rl_tensor *q = quant(ctx, src, (fp4rl_dtype)fmt, tile, tf, 0);
    float *ref = deq_f32(ctx, q);
    qhost h = qh_get(q);
    uint32_t smax, smin;
    scan_scales(fmt, &h, &smax, &smin);
    const int d = fp4rl_dg_pick_d(fmt, smax, smin);
    ck_assert_msg(d >= 0, "%s: no exponent offset (scales %u .. %u)", fmt_name((fp4rl_dtype)fmt), smin, smax);
    fp4rl_dg_src s;
    s.fmt = fmt;
    s.tile = tile;
    s.N = N;
    s.K = K;
    s.row_bytes = (K + 1) / 2;
    const fp4rl_format_traits tr = fp4rl_format_of((fp4rl_dtype)fmt);
    int64_t srows, scols;
    fp4rl_scale_dims(tr, tile, N, K, &srows, &scols);
    s.scale_cols = scols;
    s.codes = h.codes;
    s.scales = h.scales;
    const int64_t tiles = (N + 15) / 16, kgs = (K + 63) / 64, R = fp4rl_dg_record_bytes(fmt);
    uint8_t *recs = malloc((size_t)(tiles * kgs * R));
    memset(recs, 0xA5, (size_t)(tiles * kgs * R)); /* every byte must be written */
    for (int64_t i = 0; i < tiles; i++)
        for (int64_t c = 0; c < kgs; c++)
            for (int l = 0; l < 32; l++) fp4rl_dg_build_lane(&s, d, i, c, l, recs + (i * kgs + c) * R);
    const uint32_t c2 = fp4rl_dg_c2(fmt, d);
    const float alpha = ldexpf(1.0f, d) * (fmt == FP4RL_DTYPE_NVFP4 ? h.g : 1.0f);
    int64_t bad = 0;
    for (int64_t n = 0; n < tiles * 16; n++)
        for (int64_t k = 0; k < kgs * 64; k++) {
            const float v = decode_at(fmt, recs, kgs, c2, n, k);
            if (n >= N || k >= K) { /* padding: zero */
                ck_assert_msg(v == 0.0f, "%s padding (%lld, %lld) = %a", fmt_name((fp4rl_dtype)fmt), (long long)n, (long long)k, v);
                continue;
            }
            /* alpha = 2^d (exact) times NVFP4's g: the generic path's value(code) * s_b * g rounds once, as here */
            const float got = fmt == FP4RL_DTYPE_NVFP4 ? (v * ldexpf(1.0f, d)) * h.g : v * alpha;
            const float want = ref[n * K + k];
            if (!same_f32(got, want) && bad++ < 5)
                printf("  %s tile %d [%lld, %lld] (%lld, %lld): layout %a, dequantize %a\n", fmt_name((fp4rl_dtype)fmt), tile,
                       (long long)N, (long long)K, (long long)n, (long long)k, got, want);
        }
    ck_assert_msg(bad == 0, "%s tile %d [%lld, %lld]: %lld elements differ from fp4rl_dequantize", fmt_name((fp4rl_dtype)fmt), tile,
                  (long long)N, (long long)K, (long long)bad);
    free(recs);
    free(ref);
    qh_free(&h);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);
    return d;
}

static float *gauss(int64_t n, double s, uint64_t seed)
{
    trng r = trng_make(seed);
    float *x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = (float)(s * trng_gauss(&r));
    return x;
}

static const int FMTS[3] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4};
static int tile2d(int fmt) { return fmt == FP4RL_DTYPE_HIF4 ? 64 : fmt == FP4RL_DTYPE_NVFP4 ? 16 : 32; }

START_TEST(test_shapes)
{
    /* ragged shapes: N not a multiple of 16, K a multiple of 8 but not of 64 (nor of the block) */
    static const int64_t shapes[][2] = {{16, 64}, {37, 136}, {50, 320}, {8, 200}, {129, 1024}};
    for (int f = 0; f < 3; f++)
        for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
            for (int two = 0; two < 2; two++) {
                const int64_t N = shapes[sh][0], K = shapes[sh][1];
                float *x = gauss(N * K, 0.05, (uint64_t)(7 + f * 31 + sh * 5 + two));
                for (int tf = 0; tf < 2; tf++) {
                    const int d = check_layout(FMTS[f], two ? tile2d(FMTS[f]) : 0, tf, N, K, x);
                    /* weights of this size need no offset, except NVFP4's 448 scales */
                    ck_assert_int_eq(d, FMTS[f] == FP4RL_DTYPE_NVFP4 ? 7 : 0);
                }
                free(x);
            }
}
END_TEST

START_TEST(test_special_blocks)
{
    const int64_t N = 48, K = 256;
    for (int f = 0; f < 3; f++)
        for (int two = 0; two < 2; two++) {
            float *x = gauss(N * K, 0.05, 99 + (uint64_t)f);
            for (int64_t k = 0; k < K; k++) x[3 * K + k] = 0.0f;      /* a zero row: zero blocks */
            x[5 * K + 70] = NAN;                                        /* NaN blocks */
            x[17 * K + 3] = INFINITY;
            for (int64_t k = 128; k < 192; k++) x[20 * K + k] = 1e-6f;  /* NVFP4: subnormal UE4M3 scales */
            x[21 * K + 130] = 3e-7f;
            x[40 * K + 200] = 1000.0f;                                  /* large: an offset d > 0 */
            const int d = check_layout(FMTS[f], two ? tile2d(FMTS[f]) : 0, 1, N, K, x);
            printf("  %s tile %d: d = %d\n", fmt_name((fp4rl_dtype)FMTS[f]), two ? tile2d(FMTS[f]) : 0, d);
            ck_assert_int_gt(d, 0);
            free(x);
        }
}
END_TEST

/* Every stored scale byte: its multiplier is the scale times 2^(126 - d) (E2M1) or
 * 2^(127 - d) (HiF4), exactly, for every d the format can pick; NaN scales give +Inf. */
START_TEST(test_multipliers)
{
    for (int d = 0; d <= 14; d++) {
        const uint32_t cmx = fp4rl_dg_c2(FP4RL_DTYPE_MXFP4, d), cnv = fp4rl_dg_c2(FP4RL_DTYPE_NVFP4, d),
                       chi = fp4rl_dg_c2(FP4RL_DTYPE_HIF4, d);
        for (uint32_t b = 0; b < 256; b++) {
            /* MXFP4: E8M0 bytes up to 128 + d are what offset d allows */
            uint32_t m = fp4rl_dg_mult(FP4RL_DTYPE_MXFP4, fp4rl_dg_dup_byte(fp4rl_dg_scale_byte(FP4RL_DTYPE_MXFP4, b, d), 0), cmx);
            if (b == 0xff) ck_assert(isinf(bf16f(m)) && bf16f(m) > 0);
            else if ((int)b <= 128 + d) ck_assert_msg(bf16f(m) == ldexpf(1.0f, (int)b - 127 + 126 - d), "mx %u d %d", b, d);
            /* NVFP4 for the d it can take (0..7) */
            if (d <= 7) {
                m = fp4rl_dg_mult(FP4RL_DTYPE_NVFP4, fp4rl_dg_dup_byte(fp4rl_dg_scale_byte(FP4RL_DTYPE_NVFP4, b, d), 0), cnv);
                const uint32_t s = b & 0x7fu;
                if (s == 0x7f) ck_assert(isinf(bf16f(m)) && bf16f(m) > 0);
                else if (s && (int)(s >> 3) <= 8 + d)
                    ck_assert_msg(bf16f(m) == ldexpf(fp4rl_ue4m3_decode((uint8_t)s), 126 - d), "nv %u d %d: %a", b, d, bf16f(m));
            }
            /* HiF4 bases with E <= 46 + d, each increment 0..2 */
            m = fp4rl_dg_mult(FP4RL_DTYPE_HIF4, fp4rl_dg_dup_byte(fp4rl_dg_scale_byte(FP4RL_DTYPE_HIF4, b, d), 0), chi);
            if (b == 0xff) {
                ck_assert(isinf(bf16f(m)) && bf16f(m) > 0);
                ck_assert_uint_eq(fp4rl_dg_inc_mult(0, 0, m), m);
            } else if ((int)(b >> 2) <= 46 + d) {
                for (uint32_t inc = 0; inc <= 2; inc++)
                    for (int j = 0; j < 4; j++) {
                        uint32_t h = inc << (2 * j); /* the other fields hold anything: the mask isolates j's */
                        for (int jj = 0; jj < 8; jj++)
                            if (jj != j) h |= ((uint32_t)(jj + inc + b) & 3u) << (2 * jj);
                        const uint32_t mi = fp4rl_dg_inc_mult(h, j, m);
                        ck_assert_msg(bf16f(mi) == ldexpf(fp4rl_hif4_word_base(b), 127 - d + (int)inc), "hif4 %u d %d inc %u", b, d,
                                      inc);
                        ck_assert_uint_eq(mi & 0xffffu, mi >> 16);
                    }
            }
        }
    }
}
END_TEST

/* Every code in every position of a word decodes to value(code) * 2^-126 (E2M1) or
 * (k / 4) * 2^-127 (HiF4), whatever the other 28 bits hold. */
START_TEST(test_patterns)
{
    trng r = trng_make(5);
    for (int f = 0; f < 3; f += 2) {
        const int fmt = FMTS[f];
        for (int p = 0; p < 4; p++)
            for (int hi = 0; hi < 2; hi++)
                for (unsigned code = 0; code < 16; code++)
                    for (int rep = 0; rep < 8; rep++) {
                        uint32_t q = 0;
                        unsigned other[4][2];
                        for (int pp = 0; pp < 4; pp++)
                            for (int hh = 0; hh < 2; hh++) {
                                other[pp][hh] = (pp == p && hh == hi) ? code : (unsigned)(trng_u64(&r) & 15u);
                                fp4rl_dg_place(fmt, &q, pp, hh, other[pp][hh]);
                            }
                        uint32_t P[4];
                        fp4rl_dg_patterns(fmt, q, P);
                        for (int pp = 0; pp < 4; pp++)
                            for (int hh = 0; hh < 2; hh++) {
                                const unsigned c = other[pp][hh];
                                const float v = bf16f(P[pp] >> (16 * hh));
                                const float want = fmt == FP4RL_DTYPE_HIF4 ? fp4rl_hif4_elem((uint8_t)c) * 0x1p-127f
                                                                           : fp4rl_e2m1_decode((uint8_t)c) * 0x1p-126f;
                                ck_assert_msg(same_f32(v, want) && signbit(v) == signbit(want), "%s p %d hi %d code %u: %a, want %a",
                                              fmt_name((fp4rl_dtype)fmt), pp, hh, c, v, want);
                            }
                    }
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("decode_layout");
    TCase *tc = tcase_create("layout");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_patterns);
    tcase_add_test(tc, test_multipliers);
    tcase_add_test(tc, test_shapes);
    tcase_add_test(tc, test_special_blocks);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
