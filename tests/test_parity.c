/*
 * test_parity.c - the CUDA backend against the CPU reference, through the public API.
 *
 * Quantization must agree bit for bit (codes, scales, NVFP4's tensor scale, stochastic bits):
 * every format x {1D, every 2D tile} x {OCP floor, truncation-free} x {nearest, stochastic} x
 * {F32, BF16 source}, on odd shapes with tails, on Gaussian data over a wide exponent range, on
 * data full of rounding ties, and with NaN / Inf / zero blocks. Dequantization (F32 and BF16) and
 * transposition must agree bit for bit too. fp4rl_matmul, for every operand combination
 * (dense F32 / BF16, each quantized format in 1D and 2D) and both output dtypes, including the
 * fused decode path (M <= 64 with a quantized B), must agree within the FP32 summation bound
 *
 *     |C_gpu - C_cpu| <= (2K + 8) * 2^-24 * sum_k |a_ik| |b_jk|   (+ 2^-7 max(|C_gpu|, |C_cpu|) for BF16 C)
 *
 * which covers two different summation orders of the same exact products (each within
 * (K - 1) u sum |a b| of the exact sum), the alpha multiply, and one BF16 rounding of each side.
 *
 * Without a usable GPU (or in a build without CUDA) the suite exits 77, which ctest reports as
 * skipped.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fp4rl/fp4rl.h>

#include "format/formats.h"

static fp4rl_context *cpu, *gpu;

#define OK(call)                                                                                          \
    do {                                                                                                  \
        fp4rl_status st_ = (call);                                                                        \
        ck_assert_msg(st_ == FP4RL_OK, "%s failed: %s: %s", #call, fp4rl_status_name(st_), fp4rl_last_error()); \
    } while (0)

/* ---- data ------------------------------------------------------------------------------------ */
static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next_u64(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static double uniform(void) { return (double)(next_u64() >> 11) * 0x1p-53; }
static double gauss(void)
{
    double u = uniform(), v = uniform();
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
static int irange(int lo, int hi) { return lo + (int)(next_u64() % (uint64_t)(hi - lo + 1)); }

enum { DATA_GAUSS, DATA_TIES, DATA_WIDE, DATA_SPECIAL, DATA_KINDS };

/* n values of one kind. GAUSS: N(0,1) times a per-row power of two; TIES: k/16 * 2^e, which puts
 * many scaled values exactly on rounding midpoints; WIDE: Gaussian times 2^[-140, 120] per element
 * (subnormals, saturation, overflowing scales); SPECIAL: Gaussian with NaN, +-Inf, zero rows and
 * tiny blocks sprinkled in. */
static void fill(float *x, int64_t rows, int64_t cols, int kind)
{
    for (int64_t r = 0; r < rows; r++) {
        const double row_scale = ldexp(1.0, irange(-20, 20));
        const int zero_row = kind == DATA_SPECIAL && irange(0, 9) == 0;
        for (int64_t c = 0; c < cols; c++) {
            double v;
            switch (kind) {
            case DATA_TIES: v = ldexp((double)irange(-100, 100) / 16.0, irange(-3, 3)); break;
            case DATA_WIDE: v = gauss() * ldexp(1.0, irange(-140, 120)); break;
            default: v = gauss() * row_scale; break;
            }
            float f = (float)v;
            if (kind == DATA_SPECIAL) {
                int p = irange(0, 999);
                if (zero_row) f = 0.0f;
                else if (p == 0) f = NAN;
                else if (p == 1) f = INFINITY;
                else if (p == 2) f = -INFINITY;
                else if (p < 40) f = (float)(gauss() * 1e-39); /* binary32 subnormals */
                else if (p < 45) f = -0.0f;
            }
            x[r * cols + c] = f;
        }
    }
}

static fp4rl_tensor *dense(fp4rl_context *ctx, fp4rl_dtype dt, int ndim, const int64_t *shape, const float *x, int64_t n)
{
    fp4rl_tensor *t;
    if (dt == FP4RL_DTYPE_F32) {
        OK(fp4rl_tensor_from_host(&t, ctx, dt, ndim, shape, x));
        return t;
    }
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) h[i] = fp4rl_f32_to_bf16(x[i]);
    OK(fp4rl_tensor_from_host(&t, ctx, dt, ndim, shape, h));
    free(h);
    return t;
}

static const char *fmt_name(fp4rl_dtype f) { return fp4rl_dtype_name(f); }

/* Host copies of a quantized tensor's codes and scales. */
typedef struct qhost {
    uint8_t *codes, *scales;
    size_t ncodes, nscales;
    float g;
    int tile;
} qhost;

static qhost to_qhost(const fp4rl_tensor *q)
{
    qhost h;
    OK(fp4rl_tensor_quant_info(q, &h.tile, &h.ncodes, &h.nscales, &h.g));
    h.codes = malloc(h.ncodes + 1);
    h.scales = malloc(h.nscales + 1);
    OK(fp4rl_tensor_codes_to_host(q, h.codes, h.ncodes));
    OK(fp4rl_tensor_scales_to_host(q, h.scales, h.nscales));
    return h;
}
static void qhost_free(qhost *h)
{
    free(h->codes);
    free(h->scales);
}

static int64_t first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return (int64_t)i;
    return -1;
}

/* Bitwise equality of two quantized tensors (codes, scales, tensor scale). */
static void assert_same_q(const fp4rl_tensor *a, const fp4rl_tensor *b, const char *what)
{
    qhost x = to_qhost(a), y = to_qhost(b);
    ck_assert_msg(x.ncodes == y.ncodes && x.nscales == y.nscales && x.tile == y.tile, "%s: layouts differ", what);
    int64_t dc = first_diff(x.codes, y.codes, x.ncodes), ds = first_diff(x.scales, y.scales, x.nscales);
    ck_assert_msg(dc < 0, "%s: code byte %lld differs: cpu 0x%02x gpu 0x%02x", what, (long long)dc, dc < 0 ? 0 : x.codes[dc],
                  dc < 0 ? 0 : y.codes[dc]);
    ck_assert_msg(ds < 0, "%s: scale byte %lld differs: cpu 0x%02x gpu 0x%02x", what, (long long)ds, ds < 0 ? 0 : x.scales[ds],
                  ds < 0 ? 0 : y.scales[ds]);
    ck_assert_msg(fp4rl_f32_bits(x.g) == fp4rl_f32_bits(y.g), "%s: tensor scale cpu %a gpu %a", what, (double)x.g, (double)y.g);
    qhost_free(&x);
    qhost_free(&y);
}

/* Bitwise equality of two dense tensors. */
static void assert_same_dense(const fp4rl_tensor *a, const fp4rl_tensor *b, const char *what)
{
    size_t n = fp4rl_tensor_nbytes(a);
    ck_assert_msg(n == fp4rl_tensor_nbytes(b), "%s: sizes differ", what);
    uint8_t *x = malloc(n + 1), *y = malloc(n + 1);
    OK(fp4rl_tensor_to_host(a, x, n));
    OK(fp4rl_tensor_to_host(b, y, n));
    int64_t d = first_diff(x, y, n);
    ck_assert_msg(d < 0, "%s: byte %lld differs (cpu 0x%02x, gpu 0x%02x)", what, (long long)d, d < 0 ? 0 : x[d], d < 0 ? 0 : y[d]);
    free(x);
    free(y);
}

static fp4rl_quant_policy *policy(fp4rl_dtype f, int tile, int rule, int rounding)
{
    fp4rl_quant_policy *p;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, f));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_SCALE_RULE, rule));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_ROUNDING_WEIGHT, rounding));
    return p;
}

/* ---- quantize / dequantize / transpose parity ------------------------------------------------ */
static const fp4rl_dtype FORMATS[4] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};

typedef struct shape {
    int ndim;
    int64_t d[3];
} shape;
/* The last three reach the kernels' flat 1D path with a partial last thread (NVFP4, 144 and 34320
 * elements: 16 past a multiple of 32) and a partial last CTA of HiF4 lane pairs (7 x 192). */
static const shape SHAPES[] = {
    {2, {1, 1}},  {2, {1, 33}},   {2, {3, 37}},    {2, {17, 64}}, {2, {64, 64}},
    {2, {65, 129}}, {2, {130, 200}}, {3, {2, 5, 70}}, {2, {96, 520}}, {1, {1000}},
    {2, {3, 48}}, {2, {7, 192}}, {2, {33, 1040}},
};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

static int64_t numel(const shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}

/* One configuration on both backends: quantize, compare; dequantize both ways, compare;
 * transpose (2D tiles), compare. */
static void one_config(fp4rl_dtype f, int tile, int rule, int rounding, fp4rl_dtype src_dt, const shape *s, int kind)
{
    char what[256];
    snprintf(what, sizeof what, "%s tile %d rule %d %s src %s shape[%d]=%lldx%lld.. data %d", fmt_name(f), tile, rule,
             rounding ? "stochastic" : "nearest", fp4rl_dtype_name(src_dt), s->ndim, (long long)s->d[0],
             (long long)(s->ndim > 1 ? s->d[1] : 0), kind);
    const int64_t n = numel(s), cols = s->d[s->ndim - 1];
    float *x = malloc((size_t)n * sizeof(float));
    fill(x, n / cols, cols, kind);
    fp4rl_tensor *xc = dense(cpu, src_dt, s->ndim, s->d, x, n), *xg = dense(gpu, src_dt, s->ndim, s->d, x, n);
    fp4rl_quant_policy *p = policy(f, tile, rule, rounding);
    const uint64_t seed = next_u64(), off = next_u64() >> 1;
    OK(fp4rl_context_set_seed(cpu, seed));
    OK(fp4rl_context_set_seed(gpu, seed));
    OK(fp4rl_context_set_rng_offset(cpu, off));
    OK(fp4rl_context_set_rng_offset(gpu, off));
    fp4rl_tensor *qc, *qg;
    OK(fp4rl_quantize(&qc, cpu, xc, f, p, FP4RL_ROLE_WEIGHT));
    OK(fp4rl_quantize(&qg, gpu, xg, f, p, FP4RL_ROLE_WEIGHT));
    assert_same_q(qc, qg, what);
    uint64_t oc, og;
    OK(fp4rl_context_get_rng(cpu, NULL, &oc));
    OK(fp4rl_context_get_rng(gpu, NULL, &og));
    ck_assert_msg(oc == og && oc == off + (rounding ? 1u : 0u), "%s: rng offsets cpu %llu gpu %llu", what, (unsigned long long)oc,
                  (unsigned long long)og);

    for (int dt = 0; dt < 2; dt++) {
        fp4rl_tensor *dc, *dg;
        fp4rl_dtype odt = dt ? FP4RL_DTYPE_BF16 : FP4RL_DTYPE_F32;
        OK(fp4rl_dequantize(&dc, cpu, qc, odt));
        OK(fp4rl_dequantize(&dg, gpu, qg, odt));
        char w2[300];
        snprintf(w2, sizeof w2, "dequantize to %s: %s", fp4rl_dtype_name(odt), what);
        assert_same_dense(dc, dg, w2);
        fp4rl_tensor_destroy(dc);
        fp4rl_tensor_destroy(dg);
    }
    if (tile && s->ndim == 2) {
        fp4rl_tensor *tc, *tg;
        OK(fp4rl_tensor_transpose(&tc, cpu, qc));
        OK(fp4rl_tensor_transpose(&tg, gpu, qg));
        char w2[300];
        snprintf(w2, sizeof w2, "transpose: %s", what);
        assert_same_q(tc, tg, w2);
        fp4rl_tensor_destroy(tc);
        fp4rl_tensor_destroy(tg);
    }
    fp4rl_tensor_destroy(qc);
    fp4rl_tensor_destroy(qg);
    fp4rl_tensor_destroy(xc);
    fp4rl_tensor_destroy(xg);
    fp4rl_quant_policy_destroy(p);
    free(x);
}

static const int TILES_MX[4] = {0, 16, 32, 64};
static const int TILES_HIF4[2] = {0, 64};

/* FP4RL_PARITY_QUICK=1 runs a subset (for slow runners such as compute-sanitizer): every
 * configuration still runs, on fewer shapes and data kinds, and fewer matmul operand pairs. */
static int quick(void) { return getenv("FP4RL_PARITY_QUICK") != NULL; }

/* _i: the format. Every tile, rule, rounding, source dtype, shape and data kind. */
START_TEST(quantize_parity)
{
    const fp4rl_dtype f = FORMATS[_i];
    const int *tiles = f == FP4RL_DTYPE_HIF4 ? TILES_HIF4 : TILES_MX;
    const int ntiles = f == FP4RL_DTYPE_HIF4 ? 2 : 4;
    for (int ti = 0; ti < ntiles; ti++)
        for (int rule = 0; rule < 2; rule++)
            for (int rounding = 0; rounding < 2; rounding++)
                for (int sdt = 0; sdt < 2; sdt++)
                    for (int si = 0; si < NSHAPES; si++)
                        for (int kind = 0; kind < DATA_KINDS; kind++)
                            if (!quick() || ((si == 2 || si == 6 || si == 7) && (kind == DATA_TIES || kind == DATA_SPECIAL)))
                                one_config(f, tiles[ti], rule, rounding, sdt ? FP4RL_DTYPE_BF16 : FP4RL_DTYPE_F32, &SHAPES[si], kind);
}
END_TEST

/* A larger tensor, so that the kernels' full-size paths (many CTAs, aligned vectors) run. */
START_TEST(quantize_parity_large)
{
    const shape s = {2, {1000, 1536}};
    for (int fi = 0; fi < 4; fi++) {
        const fp4rl_dtype f = FORMATS[fi];
        const int tile = fi == 2 ? 64 : 32;
        for (int rounding = 0; rounding < 2; rounding++) {
            one_config(f, 0, 1, rounding, FP4RL_DTYPE_BF16, &s, DATA_GAUSS);
            one_config(f, tile, 1, rounding, FP4RL_DTYPE_F32, &s, DATA_SPECIAL);
        }
    }
}
END_TEST

/* Shapes with many CTAs on every fast path: 1D flat (whole blocks per row) and 2D tiles with a
 * partial last row band and column chunk, every format, tile, rounding and both source types, on
 * wide-range, tie-heavy and special (NaN / Inf / zero / subnormal) data. */
START_TEST(quantize_parity_fast_paths)
{
    static const shape big[2] = {{2, {96, 4096}}, {3, {2, 45, 1664}}};
    for (int fi = 0; fi < 4; fi++) {
        const fp4rl_dtype f = FORMATS[fi];
        const int *tiles = f == FP4RL_DTYPE_HIF4 ? TILES_HIF4 : TILES_MX;
        const int ntiles = f == FP4RL_DTYPE_HIF4 ? 2 : 4;
        for (int ti = 0; ti < ntiles; ti++)
            for (int rounding = 0; rounding < 2; rounding++)
                for (int bi = 0; bi < 2; bi++) {
                    const int kind = (ti + rounding + bi) % 3 == 0 ? DATA_WIDE : (ti + rounding + bi) % 3 == 1 ? DATA_TIES : DATA_SPECIAL;
                    one_config(f, tiles[ti], (ti + bi) & 1, rounding, bi ? FP4RL_DTYPE_F32 : FP4RL_DTYPE_BF16, &big[bi], kind);
                    if (!quick()) one_config(f, tiles[ti], 1, rounding, bi ? FP4RL_DTYPE_BF16 : FP4RL_DTYPE_F32, &big[bi], DATA_GAUSS);
                }
    }
}
END_TEST

/* Q(W)^T == Q(W^T) on the GPU for 2D tiles with nearest rounding (the spec's invariance). */
START_TEST(transpose_invariance)
{
    const int64_t d[2] = {150, 200}, dt[2] = {200, 150};
    float *x = malloc(150 * 200 * sizeof(float)), *xt = malloc(150 * 200 * sizeof(float));
    fill(x, 150, 200, DATA_GAUSS);
    for (int r = 0; r < 150; r++)
        for (int c = 0; c < 200; c++) xt[c * 150 + r] = x[r * 200 + c];
    fp4rl_tensor *w = dense(gpu, FP4RL_DTYPE_F32, 2, d, x, 150 * 200), *wt = dense(gpu, FP4RL_DTYPE_F32, 2, dt, xt, 150 * 200);
    for (int fi = 0; fi < 4; fi++) {
        const int ntiles = FORMATS[fi] == FP4RL_DTYPE_HIF4 ? 1 : 3;
        for (int ti = 0; ti < ntiles; ti++) {
            const int tile = FORMATS[fi] == FP4RL_DTYPE_HIF4 ? 64 : TILES_MX[ti + 1];
            fp4rl_quant_policy *p = policy(FORMATS[fi], tile, 1, 0);
            fp4rl_tensor *q, *qt, *q_t;
            OK(fp4rl_quantize(&q, gpu, w, FORMATS[fi], p, FP4RL_ROLE_WEIGHT));
            OK(fp4rl_quantize(&qt, gpu, wt, FORMATS[fi], p, FP4RL_ROLE_WEIGHT));
            OK(fp4rl_tensor_transpose(&q_t, gpu, q));
            char what[64];
            snprintf(what, sizeof what, "Q(W)^T vs Q(W^T), %s tile %d", fmt_name(FORMATS[fi]), tile);
            assert_same_q(q_t, qt, what); /* NVFP4 too: W and W^T have the same amax, so the same g */
            fp4rl_tensor_destroy(q);
            fp4rl_tensor_destroy(qt);
            fp4rl_tensor_destroy(q_t);
            fp4rl_quant_policy_destroy(p);
        }
    }
    fp4rl_tensor_destroy(w);
    fp4rl_tensor_destroy(wt);
    free(x);
    free(xt);
}
END_TEST

START_TEST(dense_transpose_parity)
{
    const int64_t shapes[3][2] = {{1, 1}, {37, 65}, {300, 129}};
    for (int si = 0; si < 3; si++) {
        const int64_t n = shapes[si][0] * shapes[si][1];
        float *x = malloc((size_t)n * sizeof(float));
        fill(x, shapes[si][0], shapes[si][1], DATA_SPECIAL);
        for (int dt = 0; dt < 3; dt++) {
            const fp4rl_dtype d = dt == 0 ? FP4RL_DTYPE_F32 : dt == 1 ? FP4RL_DTYPE_BF16 : FP4RL_DTYPE_I32;
            fp4rl_tensor *a, *b, *ta, *tb;
            if (d == FP4RL_DTYPE_I32) { /* any 32-bit pattern: reuse the float bits */
                OK(fp4rl_tensor_from_host(&a, cpu, d, 2, shapes[si], x));
                OK(fp4rl_tensor_from_host(&b, gpu, d, 2, shapes[si], x));
            } else {
                a = dense(cpu, d, 2, shapes[si], x, n);
                b = dense(gpu, d, 2, shapes[si], x, n);
            }
            OK(fp4rl_tensor_transpose(&ta, cpu, a));
            OK(fp4rl_tensor_transpose(&tb, gpu, b));
            assert_same_dense(ta, tb, "dense transpose");
            fp4rl_tensor_destroy(a);
            fp4rl_tensor_destroy(b);
            fp4rl_tensor_destroy(ta);
            fp4rl_tensor_destroy(tb);
        }
        free(x);
    }
}
END_TEST

/* ---- matmul ---------------------------------------------------------------------------------- */
typedef struct opkind {
    fp4rl_dtype dt; /* F32, BF16, or a quantized format */
    int tile;
} opkind;
static const opkind OPS[] = {
    {FP4RL_DTYPE_F32, 0},   {FP4RL_DTYPE_BF16, 0},  {FP4RL_DTYPE_MXFP4, 0}, {FP4RL_DTYPE_MXFP4, 32},
    {FP4RL_DTYPE_NVFP4, 0}, {FP4RL_DTYPE_NVFP4, 16}, {FP4RL_DTYPE_HIF4, 0}, {FP4RL_DTYPE_HIF4, 64},
    {FP4RL_DTYPE_MXFP8_E4M3, 0}, {FP4RL_DTYPE_MXFP8_E4M3, 64},
};
#define NOPS (int)(sizeof OPS / sizeof OPS[0])

/* The same operand on both backends: dense from the same values, quantized on the CPU and
 * imported into the GPU context, so that only the GEMM is compared. Also returns its values as
 * the CPU dequantizes them (with NVFP4's g), for the error bound. */
static void operand_pair(opkind k, int64_t rows, int64_t cols, const float *x, fp4rl_tensor **c, fp4rl_tensor **g, float *vals)
{
    const int64_t d[2] = {rows, cols}, n = rows * cols;
    if (k.dt == FP4RL_DTYPE_F32 || k.dt == FP4RL_DTYPE_BF16) {
        *c = dense(cpu, k.dt, 2, d, x, n);
        *g = dense(gpu, k.dt, 2, d, x, n);
        for (int64_t i = 0; i < n; i++) vals[i] = k.dt == FP4RL_DTYPE_F32 ? x[i] : fp4rl_round_bf16(x[i]);
        return;
    }
    fp4rl_tensor *src = dense(cpu, FP4RL_DTYPE_F32, 2, d, x, n), *deq;
    fp4rl_quant_policy *p = policy(k.dt, k.tile, 1, 0);
    OK(fp4rl_quantize(c, cpu, src, k.dt, p, FP4RL_ROLE_WEIGHT));
    qhost h = to_qhost(*c);
    OK(fp4rl_tensor_import_quantized(g, gpu, k.dt, 2, d, h.tile, h.codes, h.ncodes, h.scales, h.nscales, h.g));
    OK(fp4rl_dequantize(&deq, cpu, *c, FP4RL_DTYPE_F32));
    OK(fp4rl_tensor_to_host(deq, vals, (size_t)n * sizeof(float)));
    fp4rl_tensor_destroy(deq);
    fp4rl_tensor_destroy(src);
    fp4rl_quant_policy_destroy(p);
    qhost_free(&h);
}

static float c_at(const void *buf, fp4rl_dtype dt, int64_t i)
{
    return dt == FP4RL_DTYPE_F32 ? ((const float *)buf)[i] : fp4rl_bf16_to_f32(((const uint16_t *)buf)[i]);
}

static double worst_ratio[2]; /* the largest |diff| / bound seen for F32 and BF16 outputs, reported at the end */

static void one_matmul(opkind ka, opkind kb, fp4rl_dtype cdt, int64_t M, int64_t N, int64_t K, int nan_block)
{
    float *xa = malloc((size_t)(M * K) * sizeof(float)), *xb = malloc((size_t)(N * K) * sizeof(float));
    float *va = malloc((size_t)(M * K) * sizeof(float)), *vb = malloc((size_t)(N * K) * sizeof(float));
    fill(xa, M, K, DATA_GAUSS);
    fill(xb, N, K, DATA_GAUSS);
    if (nan_block) xb[(N / 2) * K + K / 3] = NAN;
    fp4rl_tensor *ac, *ag, *bc, *bg, *cc, *cg;
    operand_pair(ka, M, K, xa, &ac, &ag, va);
    operand_pair(kb, N, K, xb, &bc, &bg, vb);
    const int64_t dc[2] = {M, N};
    OK(fp4rl_tensor_zeros(&cc, cpu, cdt, 2, dc));
    OK(fp4rl_tensor_zeros(&cg, gpu, cdt, 2, dc));
    OK(fp4rl_matmul(cc, cpu, ac, bc));
    OK(fp4rl_matmul(cg, gpu, ag, bg));
    const size_t es = cdt == FP4RL_DTYPE_F32 ? 4 : 2;
    void *hc = malloc((size_t)(M * N) * es), *hg = malloc((size_t)(M * N) * es);
    OK(fp4rl_tensor_to_host(cc, hc, (size_t)(M * N) * es));
    OK(fp4rl_tensor_to_host(cg, hg, (size_t)(M * N) * es));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            const float x = c_at(hc, cdt, i * N + j), y = c_at(hg, cdt, i * N + j);
            if (isnan(x) || isnan(y) || isinf(x) || isinf(y)) {
                ck_assert_msg((isnan(x) && isnan(y)) || x == y, "matmul %s/%d x %s/%d -> %s [%lld,%lld,%lld]: C[%lld,%lld] cpu %g gpu %g",
                              fmt_name(ka.dt), ka.tile, fmt_name(kb.dt), kb.tile, fp4rl_dtype_name(cdt), (long long)M, (long long)N,
                              (long long)K, (long long)i, (long long)j, (double)x, (double)y);
                continue;
            }
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) s += fabs((double)va[i * K + k]) * fabs((double)vb[j * K + k]);
            double bound = (2.0 * (double)K + 8.0) * 0x1p-24 * s + 1e-30;
            if (cdt == FP4RL_DTYPE_BF16) bound += 0x1p-7 * fmax(fabs((double)x), fabs((double)y));
            const double diff = fabs((double)x - (double)y);
            const int wi = cdt == FP4RL_DTYPE_BF16;
            if (diff / bound > worst_ratio[wi]) worst_ratio[wi] = diff / bound;
            ck_assert_msg(diff <= bound, "matmul %s/%d x %s/%d -> %s [%lld,%lld,%lld]: C[%lld,%lld] cpu %.9g gpu %.9g, |diff| %g > bound %g",
                          fmt_name(ka.dt), ka.tile, fmt_name(kb.dt), kb.tile, fp4rl_dtype_name(cdt), (long long)M, (long long)N,
                          (long long)K, (long long)i, (long long)j, (double)x, (double)y, diff, bound);
        }
    fp4rl_tensor_destroy(ac);
    fp4rl_tensor_destroy(ag);
    fp4rl_tensor_destroy(bc);
    fp4rl_tensor_destroy(bg);
    fp4rl_tensor_destroy(cc);
    fp4rl_tensor_destroy(cg);
    free(xa);
    free(xb);
    free(va);
    free(vb);
    free(hc);
    free(hg);
}

/* (M, N, K): fused decode path with split-K (1, 300, 2048), with a partial K chunk (16, 130, 480),
 * at its M limit (64, 257, 256) and in between (33, 50, 96); beyond it (100, 70, 128); K not a
 * multiple of 32 (5, 7, 37: never fused); and a plain GEMM (128, 256, 512). */
static const int64_t MM[][3] = {{1, 300, 2048}, {16, 130, 480}, {64, 257, 256}, {33, 50, 96},
                                {100, 70, 128}, {5, 7, 37},     {128, 256, 512}};
#define NMM (int)(sizeof MM / sizeof MM[0])

/* _i: the shape. Every A kind x B kind x C dtype. */
START_TEST(matmul_parity)
{
    for (int ia = 0; ia < NOPS; ia++)
        for (int ib = 0; ib < NOPS; ib++)
            for (int cd = 0; cd < 2; cd++)
                if (!quick() || (ia < 2 && cd == (ib & 1)) || (ia == ib && cd == 0))
                    one_matmul(OPS[ia], OPS[ib], cd ? FP4RL_DTYPE_BF16 : FP4RL_DTYPE_F32, MM[_i][0], MM[_i][1], MM[_i][2], 0);
}
END_TEST

/* A NaN block in B: the same outputs are NaN on both backends, fused path or not. */
START_TEST(matmul_nan_block)
{
    for (int ib = 2; ib < NOPS; ib++)
        for (int ia = 0; ia < 2; ia++) {
            one_matmul(OPS[ia], OPS[ib], FP4RL_DTYPE_F32, 4, 130, 256, 1);
            one_matmul(OPS[ia], OPS[ib], FP4RL_DTYPE_F32, 80, 130, 256, 1);
        }
}
END_TEST

/* ---- errors ---------------------------------------------------------------------------------- */
START_TEST(bad_ordinal)
{
    fp4rl_context *c = NULL;
    fp4rl_status st = fp4rl_context_create(&c, FP4RL_DEVICE_CUDA, 4096);
    ck_assert_int_eq(st, FP4RL_ERR_DEVICE);
    ck_assert_ptr_null(c);
    ck_assert_msg(strncmp(fp4rl_last_error(), "no CUDA device: ", 16) == 0, "message: %s", fp4rl_last_error());
}
END_TEST

static void setup(void)
{
    OK(fp4rl_context_create(&cpu, FP4RL_DEVICE_CPU, 0));
    OK(fp4rl_context_create(&gpu, FP4RL_DEVICE_CUDA, 0));
}
static void teardown(void)
{
    fp4rl_context_destroy(cpu);
    fp4rl_context_destroy(gpu);
}

static Suite *parity_suite(void)
{
    Suite *s = suite_create("parity");
    TCase *q = tcase_create("quantize");
    tcase_add_checked_fixture(q, setup, teardown);
    tcase_set_timeout(q, 600);
    tcase_add_loop_test(q, quantize_parity, 0, 4);
    tcase_add_test(q, quantize_parity_large);
    tcase_add_test(q, quantize_parity_fast_paths);
    tcase_add_test(q, transpose_invariance);
    tcase_add_test(q, dense_transpose_parity);
    suite_add_tcase(s, q);
    TCase *m = tcase_create("matmul");
    tcase_add_checked_fixture(m, setup, teardown);
    tcase_set_timeout(m, 600);
    tcase_add_loop_test(m, matmul_parity, 0, NMM);
    tcase_add_test(m, matmul_nan_block);
    suite_add_tcase(s, m);
    TCase *e = tcase_create("errors");
    tcase_add_test(e, bad_ordinal);
    suite_add_tcase(s, e);
    return s;
}

int main(void)
{
    fp4rl_context *probe = NULL;
    fp4rl_status st = fp4rl_context_create(&probe, FP4RL_DEVICE_CUDA, 0);
    if (st != FP4RL_OK) {
        printf("skip: no usable CUDA context (%s: %s)\n", fp4rl_status_name(st), fp4rl_last_error());
        return 77;
    }
    fp4rl_context_destroy(probe);
    SRunner *sr = srunner_create(parity_suite());
    srunner_set_fork_status(sr, CK_NOFORK); /* one process: CUDA state does not survive fork() */
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("parity: matmul worst |gpu - cpu| / bound: %.3g with F32 C, %.3g with BF16 C (a BF16 C differs by one BF16 ulp at most)\n",
           worst_ratio[0], worst_ratio[1]);
    return failed ? 1 : 0;
}
