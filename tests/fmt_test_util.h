/*
 * fmt_test_util.h - helpers shared by the format-correctness suites (test_formats, test_quantize,
 * test_matmul): a deterministic random generator, tensor helpers over the public API, and an
 * independent model of the element formats of shared/spec/formats.md (decoded tables written from
 * the spec's bit layouts, nearest-by-search rounding) that the suites check the library against.
 *
 * Nothing here calls core/format/formats.h: the point is to have a second implementation.
 */
#ifndef FMT_TEST_UTIL_H
#define FMT_TEST_UTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fp4rl/fp4rl.h>

/* A passing ck_assert* records its location with a write() to the runner (_mark_point); these
 * suites make millions of element-wise assertions, which made them syscall-bound. Passing
 * assertions here record nothing; failures are reported exactly as before. */
#undef ck_assert_msg
#define ck_assert_msg(expr, ...) \
    ((expr) ? (void)0 : _ck_assert_failed(__FILE__, __LINE__, "Assertion '" #expr "' failed", ##__VA_ARGS__))

/* ---- status checks ------------------------------------------------------------------------- */
#define OK(call)                                                                                      \
    do {                                                                                              \
        fp4rl_status st_ = (call);                                                                    \
        ck_assert_msg(st_ == FP4RL_OK, "%s failed: %s: %s", #call, fp4rl_status_name(st_), fp4rl_last_error()); \
    } while (0)

/* ---- deterministic random numbers (xorshift64*, Box-Muller) --------------------------------- */
typedef struct trng { uint64_t s; } trng;
static inline trng trng_make(uint64_t seed) { trng r = {seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull}; return r; }
static inline uint64_t trng_u64(trng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 2685821657736338717ull;
}
static inline double trng_unif(trng *r) { return (double)(trng_u64(r) >> 11) * 0x1p-53; }
static inline double trng_gauss(trng *r)
{
    double u = trng_unif(r), v = trng_unif(r);
    return sqrt(-2.0 * log(u + 0x1p-60)) * cos(6.283185307179586 * v);
}
/* Heavy-tailed: a Gaussian times a log-normal factor (magnitudes spread over ~8 binades), with
 * some exact zeros and negative zeros. */
static inline float trng_heavy(trng *r)
{
    double u = trng_unif(r);
    if (u < 0.02) return 0.0f;
    if (u < 0.03) return -0.0f;
    return (float)(trng_gauss(r) * exp(1.5 * trng_gauss(r)));
}

/* ---- bfloat16, independently: round-to-nearest-even through double ---------------------------- */
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float ref_bf16_round(float f)
{
    if (isnan(f)) return f;
    if (isinf(f) || f == 0.0f) return f;
    int e;
    double m = frexp((double)f, &e);          /* |m| in [0.5, 1): 8 significant bits below */
    double r = ldexp(nearbyint(ldexp(m, 8)), e - 8); /* default rounding mode: ties to even */
    if (e - 8 < -133) r = ldexp(nearbyint(ldexp((double)f, 133)), -133); /* bf16 subnormals */
    if (fabs(r) > 0x1.FEp127) return f > 0 ? INFINITY : -INFINITY;
    return (float)r;
}
static inline uint16_t ref_bf16_bits(float f) { return (uint16_t)(f32_bits(ref_bf16_round(f)) >> 16); }

/* ---- element formats, from the spec's tables ------------------------------------------------ */
static const double E2M1_MAG[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
static inline double ref_e2m1(uint8_t code)
{
    double m = E2M1_MAG[code & 7];
    return (code & 8) ? -m : m;
}
/* E4M3 "fn": bias 7, subnormals m * 2^-9, 0x7F / 0xFF NaN, no infinities. */
static inline double ref_e4m3(uint8_t code)
{
    int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp((double)m, -9) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}
static inline double ref_hif4_elem(uint8_t code)
{
    double m = (code & 7) / 4.0;
    return (code & 8) ? -m : m;
}
static inline double ref_e8m0(uint8_t c) { return c == 0xFF ? NAN : ldexp(1.0, (int)c - 127); }

/* Round-to-nearest-even with saturation by search over a table of `n` non-negative magnitudes
 * (index = magnitude code bits, increasing). Ties go to the even index (= even mantissa LSB).
 * Returns the magnitude code. */
static inline unsigned ref_rne_search(double a, const double *tab, unsigned n)
{
    if (a >= tab[n - 1]) return n - 1;
    unsigned best = 0;
    for (unsigned k = 1; k < n; k++) {
        double db = fabs(a - tab[best]), dk = fabs(a - tab[k]);
        if (dk < db || (dk == db && (k & 1) == 0)) best = k;
    }
    return best;
}
static double E4M3_MAG[127]; /* codes 0x00 .. 0x7E */
static inline void ref_tables_init(void)
{
    for (unsigned k = 0; k < 127; k++) E4M3_MAG[k] = ref_e4m3((uint8_t)k);
}
static inline uint8_t ref_e2m1_encode(double v)
{
    return (uint8_t)((signbit(v) ? 8 : 0) | ref_rne_search(fabs(v), E2M1_MAG, 8));
}
static inline uint8_t ref_e4m3_encode(double v)
{
    return (uint8_t)((signbit(v) ? 0x80 : 0) | ref_rne_search(fabs(v), E4M3_MAG, 127));
}
/* The neighbours lo <= a < hi on a grid (a below the max), for stochastic rounding. */
static inline void ref_grid_bracket(double a, const double *tab, unsigned n, unsigned *lo, unsigned *hi)
{
    unsigned k = 0;
    while (k + 1 < n && tab[k + 1] <= a) k++;
    *lo = k;
    *hi = k + 1 < n ? k + 1 : k;
}

/* Independent scale exponents: floor from frexp; truncation-free by search. */
static inline int ref_floor_exp(float amax, int emax_elem)
{
    if (amax == 0.0f) return -127;
    int e;
    frexp((double)amax, &e);
    e = (e - 1) - emax_elem;
    return e < -127 ? -127 : e > 127 ? 127 : e;
}
static inline int ref_tf_exp(float amax, double max_elem)
{
    if (amax == 0.0f) return -127;
    int e = -127;
    while (e < 127 && (double)amax > ldexp(max_elem, e)) e++;
    return e;
}

/* HiF4 base scale: an independent walk through steps 2-4 of spec section 6. */
static inline void ref_hif4_base(float amax, uint32_t *e6m2, float *base, float *rec)
{
    float sf = amax * 0.142578125f;
    if (sf < 0x1p-48f) sf = 0x1p-48f;
    if (sf > 49152.0f) sf = 49152.0f;
    sf = ref_bf16_round(sf);
    int e;
    double m = frexp((double)sf, &e); /* sf = (8m / 4) * 2^(e-1), 8m in [4, 8) */
    int E = e - 1, q = (int)nearbyint(8 * m);
    if (q == 8) { q = 4; E++; }
    *e6m2 = (uint32_t)(((E + 48) << 2) | (q - 4));
    *base = (float)ldexp(q / 4.0, E);
    *rec = ref_bf16_round(1.0f / *base);
}

/* Philox4x32-10 (Salmon et al., Random123), written out again for the reference model. */
static inline void ref_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]}, k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * x[0], p1 = (uint64_t)0xCD9E8D57u * x[2];
        uint32_t y0 = (uint32_t)(p1 >> 32) ^ x[1] ^ k0, y1 = (uint32_t)p1, y2 = (uint32_t)(p0 >> 32) ^ x[3] ^ k1, y3 = (uint32_t)p0;
        x[0] = y0; x[1] = y1; x[2] = y2; x[3] = y3;
    }
    memcpy(out, x, sizeof x);
}
/* The spec's uniform of element i of a stochastic call (seed, offset). */
static inline double ref_sr_u(uint64_t seed, uint64_t offset, uint64_t i)
{
    uint64_t q = i / 4;
    uint32_t c[4] = {(uint32_t)q, (uint32_t)(q >> 32), (uint32_t)offset, (uint32_t)(offset >> 32)};
    uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, o[4];
    ref_philox(c, k, o);
    return ldexp((double)(o[i % 4] >> 8), -24);
}

/* ---- tensors ----------------------------------------------------------------------------------- */
static inline fp4rl_tensor *mk_f32(fp4rl_context *ctx, int64_t r, int64_t c, const float *x)
{
    int64_t shape[2] = {r, c};
    fp4rl_tensor *t = NULL;
    OK(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 2, shape, x));
    return t;
}
static inline fp4rl_tensor *mk_bf16(fp4rl_context *ctx, int64_t r, int64_t c, const float *x)
{
    uint16_t *h = malloc((size_t)(r * c) * 2);
    for (int64_t i = 0; i < r * c; i++) h[i] = ref_bf16_bits(x[i]);
    int64_t shape[2] = {r, c};
    fp4rl_tensor *t = NULL;
    OK(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_BF16, 2, shape, h));
    free(h);
    return t;
}

/* A policy for the activation role: tile, scale rule, rounding, seed (-1: the context's). */
static inline fp4rl_quant_policy *mk_policy(fp4rl_dtype fmt, int tile, int truncation_free, int stochastic, int64_t seed)
{
    fp4rl_quant_policy *p = NULL;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_ACTIVATION, fmt));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_ACTIVATION, tile));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_SCALE_RULE, truncation_free ? FP4RL_SCALE_TRUNCATION_FREE : FP4RL_SCALE_OCP_FLOOR));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_ROUNDING_ACTIVATION, stochastic ? FP4RL_ROUND_STOCHASTIC : FP4RL_ROUND_NEAREST));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_SEED, seed));
    return p;
}
static inline fp4rl_tensor *quant(fp4rl_context *ctx, const fp4rl_tensor *src, fp4rl_dtype fmt, int tile, int tf, int sr)
{
    fp4rl_quant_policy *p = mk_policy(fmt, tile, tf, sr, -1);
    fp4rl_tensor *q = NULL;
    OK(fp4rl_quantize(&q, ctx, src, fmt, p, FP4RL_ROLE_ACTIVATION));
    fp4rl_quant_policy_destroy(p);
    return q;
}

/* Host copies of a quantized tensor's parts (malloc'ed; the caller frees). */
typedef struct qhost {
    uint8_t *codes;
    size_t ncodes;
    uint8_t *scales;     /* bytes; HiF4 words are little-endian uint32 (read with qh_word) */
    size_t nscales;
    float g;
    int tile;
} qhost;
static inline qhost qh_get(const fp4rl_tensor *q)
{
    qhost h;
    memset(&h, 0, sizeof h);
    OK(fp4rl_tensor_quant_info(q, &h.tile, &h.ncodes, &h.nscales, &h.g));
    h.codes = malloc(h.ncodes ? h.ncodes : 1);
    h.scales = malloc(h.nscales ? h.nscales : 1);
    OK(fp4rl_tensor_codes_to_host(q, h.codes, h.ncodes));
    OK(fp4rl_tensor_scales_to_host(q, h.scales, h.nscales));
    return h;
}
static inline void qh_free(qhost *h) { free(h->codes); free(h->scales); }
static inline uint32_t qh_word(const qhost *h, size_t i)
{
    const uint8_t *b = h->scales + 4 * i;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
/* The 4-bit (or 8-bit for MXFP8) code of element (r, c) of an [R, C] tensor. */
static inline uint8_t qh_code(const qhost *h, fp4rl_dtype fmt, int64_t C, int64_t r, int64_t c)
{
    if (fmt == FP4RL_DTYPE_MXFP8_E4M3) return h->codes[r * C + c];
    uint8_t b = h->codes[r * ((C + 1) / 2) + c / 2];
    return (c & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
}

/* Dequantized F32 values of q (malloc'ed). */
static inline float *deq_f32(fp4rl_context *ctx, const fp4rl_tensor *q)
{
    fp4rl_tensor *d = NULL;
    OK(fp4rl_dequantize(&d, ctx, q, FP4RL_DTYPE_F32));
    size_t n = (size_t)fp4rl_tensor_numel(q);
    float *y = malloc(n * sizeof(float));
    OK(fp4rl_tensor_to_host(d, y, n * sizeof(float)));
    fp4rl_tensor_destroy(d);
    return y;
}

/* Bitwise equality of two floats, treating every NaN as equal. */
static inline int same_f32(float a, float b) { return (isnan(a) && isnan(b)) || f32_bits(a) == f32_bits(b); }

static inline const char *fmt_name(fp4rl_dtype f) { return fp4rl_dtype_name(f); }

#endif
