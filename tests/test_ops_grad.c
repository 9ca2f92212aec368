/*
 * test_ops_grad.c - the CPU op table (core/backend/ops.h) against small double-precision references.
 *
 * For every op with a backward: the float forward matches a naive double reference written
 * straight from the definition, and the float backward matches central finite differences of
 * that double reference (loss L = sum r * out with random r, so dout = r). The gradient buffers
 * start non-zero, which checks the accumulate (+=) rule at the same time. Shapes are small and
 * deliberately odd (T=5, C=7, V=11, Hq=4, Hkv=2, padding) so tails and masks are exercised.
 *
 * Errors are measured as max|got - want| / max|want| over a buffer. Tolerances:
 *   FWD_TOL  1e-5  float op vs double reference (binary32 rounding of O(10)-term sums)
 *   GRAD_TOL 1e-4  float backward vs double central differences (h = 1e-6 relative; the FD
 *                  error is ~1e-10, the rest is binary32 rounding of the backward)
 * FP4RL_TEST_VERBOSE=1 prints every measured error.
 */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/formats.h"
#include "backend/ops.h"

#define FWD_TOL 1e-5
#define GRAD_TOL 1e-4

static const fp4rl_ops *ops = &fp4rl_cpu_ops;

/* ---- allocations, freed by the fixture's teardown ------------------------------------------ */
#define MAX_ALLOCS 256
static void *allocs[MAX_ALLOCS];
static int n_allocs;
static void *track(void *p)
{
    ck_assert_ptr_nonnull(p);
    ck_assert_int_lt(n_allocs, MAX_ALLOCS);
    allocs[n_allocs++] = p;
    return p;
}
static float *fbuf(int64_t n) { return track(calloc((size_t)n, sizeof(float))); }
static double *dbuf(int64_t n) { return track(calloc((size_t)n, sizeof(double))); }
static int32_t *ibuf(int64_t n) { return track(calloc((size_t)n, sizeof(int32_t))); }
static void setup(void) { n_allocs = 0; }
static void teardown(void)
{
    for (int i = 0; i < n_allocs; i++) free(allocs[i]);
    n_allocs = 0;
}

/* ---- deterministic random numbers (splitmix64) -------------------------------------------- */
static uint64_t rng = 1;
static double urand(void)
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1p-53;
}
/* uniform in [-a, a) */
static float *frand(int64_t n, double a)
{
    float *x = fbuf(n);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(a * (2.0 * urand() - 1.0));
    return x;
}
static double *to_double(const float *x, int64_t n)
{
    double *d = dbuf(n);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static float *fcopy(const float *x, int64_t n)
{
    float *c = fbuf(n);
    memcpy(c, x, (size_t)n * sizeof(float));
    return c;
}

/* ---- error measures ---------------------------------------------------------------------- */
/* max|got - base - want| / max|want|; base (the buffer's value before an accumulating backward)
 * may be NULL. An all-zero want falls back to the absolute error. */
static double rel_err(const float *got, const float *base, const double *want, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? (double)base[i] : 0.0);
        double e = fabs(g - want[i]);
        if (!(e <= num)) num = e; /* NaN propagates as a failure */
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return den > 0.0 ? num / den : num;
}
#define CHECK_ERR(what, err, tol)                                                                  \
    do {                                                                                           \
        double e_ = (err);                                                                         \
        if (getenv("FP4RL_TEST_VERBOSE")) printf("%-40s %.3g (tol %.0e)\n", what, e_, (double)tol); \
        ck_assert_msg(e_ <= (tol), "%s: relative error %.3g > %.0e", what, e_, (double)(tol));     \
    } while (0)
#define CHECK_FWD(what, got, want, n) CHECK_ERR(what, rel_err(got, NULL, want, n), FWD_TOL)
#define CHECK_GRAD(what, got, base, want, n) CHECK_ERR(what, rel_err(got, base, want, n), GRAD_TOL)
#define CHECK_OK(call) ck_assert_int_eq((call), FP4RL_OK)

/* ---- central differences of a double reference --------------------------------------------
 * A problem is a reference forward writing nout outputs from inputs held in `st`; the loss is
 * sum_i r[i] out[i]. fd_grad perturbs x (one of the inputs inside st) in place. */
typedef void (*ref_fn)(const void *st, double *out);
typedef struct fd_problem {
    ref_fn f;
    const void *st;
    const double *r;
    int64_t nout;
    double *out;
} fd_problem;
static double fd_loss(const fd_problem *p)
{
    p->f(p->st, p->out);
    double l = 0.0;
    for (int64_t i = 0; i < p->nout; i++) l += p->r[i] * p->out[i];
    return l;
}
static double *fd_grad(const fd_problem *p, double *x, int64_t n)
{
    double *g = dbuf(n);
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i], h = 1e-6 * fmax(1.0, fabs(x0));
        if (isnan(x0)) continue; /* padding the op must never read */
        x[i] = x0 + h;
        double lp = fd_loss(p);
        x[i] = x0 - h;
        double lm = fd_loss(p);
        x[i] = x0;
        g[i] = (lp - lm) / (2.0 * h);
    }
    return g;
}
static fd_problem problem(ref_fn f, const void *st, int64_t nout, float **r_float)
{
    float *r = frand(nout, 1.0);
    *r_float = r;
    fd_problem p = {f, st, to_double(r, nout), nout, dbuf(nout)};
    return p;
}

/* =========================================================================================== */
/* embedding                                                                                   */
/* =========================================================================================== */
typedef struct emb_st { const int32_t *tok; const double *wte; int64_t N, V, C; } emb_st;
static void ref_embedding(const void *sv, double *out)
{
    const emb_st *s = sv;
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t c = 0; c < s->C; c++) {
            int32_t t = s->tok[n];
            out[n * s->C + c] = (t >= 0 && t < s->V) ? s->wte[t * s->C + c] : 0.0;
        }
}

START_TEST(test_embedding)
{
    rng = 11;
    enum { N = 9, V = 11, C = 7 };
    /* repeats (3, 3, 3; 10, 10) test the scatter-add; -1 and 11 are out of range */
    static const int32_t tok_init[N] = {3, 0, 10, 3, -1, 10, 3, 11, 5};
    int32_t *tok = ibuf(N);
    memcpy(tok, tok_init, sizeof tok_init);
    float *wte = frand(V * C, 1.0), *out = frand(N * C, 5.0);
    CHECK_OK(ops->embedding_forward(NULL, out, tok, wte, N, V, C));
    emb_st st = {tok, to_double(wte, V * C), N, V, C};
    double *want = dbuf(N * C);
    ref_embedding(&st, want);
    ck_assert_msg(rel_err(out, NULL, want, N * C) == 0.0, "embedding forward is a copy");

    float *r;
    fd_problem p = problem(ref_embedding, &st, N * C, &r);
    float *dwte = frand(V * C, 1.0), *dwte0 = fcopy(dwte, V * C);
    CHECK_OK(ops->embedding_backward(NULL, dwte, r, tok, N, V, C));
    CHECK_GRAD("embedding dwte", dwte, dwte0, fd_grad(&p, (double *)st.wte, V * C), V * C);
}
END_TEST

/* =========================================================================================== */
/* RMSNorm                                                                                     */
/* =========================================================================================== */
typedef struct rms_st { const double *x, *w; int64_t N, C; double eps; } rms_st;
static void ref_rmsnorm(const void *sv, double *out)
{
    const rms_st *s = sv;
    for (int64_t n = 0; n < s->N; n++) {
        double ss = 0.0;
        for (int64_t c = 0; c < s->C; c++) ss += s->x[n * s->C + c] * s->x[n * s->C + c];
        double rstd = 1.0 / sqrt(ss / (double)s->C + s->eps);
        for (int64_t c = 0; c < s->C; c++) out[n * s->C + c] = s->x[n * s->C + c] * rstd * s->w[c];
    }
}

START_TEST(test_rmsnorm)
{
    rng = 12;
    enum { N = 5, C = 7 };
    const float eps = 1e-6f; /* Qwen2's rms_norm_eps */
    float *x = frand(N * C, 2.0), *w = frand(C, 1.5), *out = fbuf(N * C), *rstd = fbuf(N);
    x[3 * C + 2] = 40.0f; /* one outlier row */
    CHECK_OK(ops->rmsnorm_forward(NULL, out, rstd, x, w, N, C, eps));
    rms_st st = {to_double(x, N * C), to_double(w, C), N, C, eps};
    double *want = dbuf(N * C), *want_rstd = dbuf(N);
    ref_rmsnorm(&st, want);
    for (int64_t n = 0; n < N; n++) {
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++) ss += st.x[n * C + c] * st.x[n * C + c];
        want_rstd[n] = 1.0 / sqrt(ss / C + eps);
    }
    CHECK_FWD("rmsnorm out", out, want, N * C);
    CHECK_FWD("rmsnorm rstd", rstd, want_rstd, N);

    float *r;
    fd_problem p = problem(ref_rmsnorm, &st, N * C, &r);
    float *dx = frand(N * C, 1.0), *dx0 = fcopy(dx, N * C), *dw = frand(C, 1.0), *dw0 = fcopy(dw, C);
    CHECK_OK(ops->rmsnorm_backward(NULL, dx, dw, r, x, w, rstd, N, C));
    CHECK_GRAD("rmsnorm dx", dx, dx0, fd_grad(&p, (double *)st.x, N * C), N * C);
    CHECK_GRAD("rmsnorm dweight", dw, dw0, fd_grad(&p, (double *)st.w, C), C);

    /* dweight is optional; dx does not depend on it */
    float *dx2 = fcopy(dx0, N * C);
    CHECK_OK(ops->rmsnorm_backward(NULL, dx2, NULL, r, x, w, rstd, N, C));
    ck_assert_mem_eq(dx2, dx, N * C * sizeof(float));
}
END_TEST

/* =========================================================================================== */
/* linear                                                                                      */
/* =========================================================================================== */
typedef struct lin_st { const double *x, *w, *b; int64_t N, IN, OUT; } lin_st;
static void ref_linear(const void *sv, double *out)
{
    const lin_st *s = sv;
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t o = 0; o < s->OUT; o++) {
            double acc = s->b ? s->b[o] : 0.0;
            for (int64_t i = 0; i < s->IN; i++) acc += s->x[n * s->IN + i] * s->w[o * s->IN + i];
            out[n * s->OUT + o] = acc;
        }
}

START_TEST(test_linear)
{
    rng = 13;
    enum { N = 5, IN = 7, OUT = 3 };
    float *x = frand(N * IN, 1.0), *w = frand(OUT * IN, 1.0), *b = frand(OUT, 1.0);
    float *y = frand(N * OUT, 9.0); /* garbage: forward overwrites */
    CHECK_OK(ops->linear_forward(NULL, y, x, w, b, N, IN, OUT));
    lin_st st = {to_double(x, N * IN), to_double(w, OUT * IN), to_double(b, OUT), N, IN, OUT};
    double *want = dbuf(N * OUT);
    ref_linear(&st, want);
    CHECK_FWD("linear y (bias)", y, want, N * OUT);
    lin_st st_nb = st;
    st_nb.b = NULL;
    ref_linear(&st_nb, want);
    CHECK_OK(ops->linear_forward(NULL, y, x, w, NULL, N, IN, OUT));
    CHECK_FWD("linear y (no bias)", y, want, N * OUT);

    float *r;
    fd_problem p = problem(ref_linear, &st, N * OUT, &r);
    float *dx = frand(N * IN, 1.0), *dx0 = fcopy(dx, N * IN);
    float *dw = frand(OUT * IN, 1.0), *dw0 = fcopy(dw, OUT * IN);
    float *db = frand(OUT, 1.0), *db0 = fcopy(db, OUT);
    CHECK_OK(ops->linear_backward(NULL, dx, dw, db, r, w, r, x, r, N, IN, OUT));
    CHECK_GRAD("linear dx", dx, dx0, fd_grad(&p, (double *)st.x, N * IN), N * IN);
    CHECK_GRAD("linear dw", dw, dw0, fd_grad(&p, (double *)st.w, OUT * IN), OUT * IN);
    CHECK_GRAD("linear db", db, db0, fd_grad(&p, (double *)st.b, OUT), OUT);
}
END_TEST

/* Each backward GEMM reads its own operands: the hook for the quantized modes. */
START_TEST(test_linear_operand_routing)
{
    rng = 14;
    enum { N = 5, IN = 7, OUT = 3 };
    float *dy_dx = frand(N * OUT, 1.0), *w_dx = frand(OUT * IN, 1.0);
    float *dy_dw = frand(N * OUT, 1.0), *x_dw = frand(N * IN, 1.0), *dy_db = frand(N * OUT, 1.0);
    float *dx = fbuf(N * IN), *dw = fbuf(OUT * IN), *db = fbuf(OUT);
    CHECK_OK(ops->linear_backward(NULL, dx, dw, db, dy_dx, w_dx, dy_dw, x_dw, dy_db, N, IN, OUT));
    double *want_dx = dbuf(N * IN), *want_dw = dbuf(OUT * IN), *want_db = dbuf(OUT);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OUT; o++) {
            for (int i = 0; i < IN; i++) {
                want_dx[n * IN + i] += (double)dy_dx[n * OUT + o] * w_dx[o * IN + i];
                want_dw[o * IN + i] += (double)dy_dw[n * OUT + o] * x_dw[n * IN + i];
            }
            want_db[o] += dy_db[n * OUT + o];
        }
    CHECK_FWD("linear routing dx = dy_dx w_dx", dx, want_dx, N * IN);
    CHECK_FWD("linear routing dw = dy_dw^T x_dw", dw, want_dw, OUT * IN);
    CHECK_FWD("linear routing db = sum dy_db", db, want_db, OUT);

    /* every gradient is optional */
    float *dx2 = fbuf(N * IN);
    CHECK_OK(ops->linear_backward(NULL, dx2, NULL, NULL, dy_dx, w_dx, NULL, NULL, NULL, N, IN, OUT));
    ck_assert_mem_eq(dx2, dx, N * IN * sizeof(float));
}
END_TEST

START_TEST(test_round_bf16)
{
    rng = 15;
    enum { n = 37 };
    float *x = frand(n, 3.0), *out = fbuf(n);
    x[0] = 1.0f + 0x1p-8f;            /* a tie: rounds to even (1.0) */
    x[1] = 1.0f + 3 * 0x1p-8f;        /* a tie: rounds to even (1 + 2^-6) */
    x[2] = fp4rl_bits_f32(0x7fc00001u); /* NaN stays NaN */
    CHECK_OK(ops->round_bf16(NULL, out, x, n));
    ck_assert_float_eq(out[0], 1.0f);
    ck_assert_float_eq(out[1], 1.0f + 0x1p-6f);
    ck_assert(isnan(out[2]));
    for (int i = 0; i < n; i++) {
        if (i == 2) continue;
        ck_assert_uint_eq(fp4rl_f32_bits(out[i]), fp4rl_f32_bits(fp4rl_round_bf16(x[i])));
        ck_assert_uint_eq(fp4rl_f32_bits(out[i]) & 0xffffu, 0u);
    }
    CHECK_OK(ops->round_bf16(NULL, x, x, n)); /* in place */
    ck_assert_mem_eq(x + 3, out + 3, (n - 3) * sizeof(float));
}
END_TEST

/* =========================================================================================== */
/* RoPE                                                                                        */
/* =========================================================================================== */
typedef struct rope_st { const double *x; const int32_t *pos; int64_t N, H, D; double theta; } rope_st;
static void ref_rope(const void *sv, double *out)
{
    const rope_st *s = sv;
    int64_t half = s->D / 2;
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t h = 0; h < s->H; h++)
            for (int64_t i = 0; i < half; i++) {
                double a = s->pos[n] * pow(s->theta, -2.0 * (double)i / (double)s->D);
                const double *x = s->x + (n * s->H + h) * s->D;
                double *o = out + (n * s->H + h) * s->D;
                o[i] = x[i] * cos(a) - x[i + half] * sin(a);
                o[i + half] = x[i + half] * cos(a) + x[i] * sin(a);
            }
}

START_TEST(test_rope)
{
    rng = 16;
    enum { N = 5, H = 3, D = 8 };
    const float theta = 10000.0f;
    static const int32_t pos_init[N] = {0, 1, 7, 3, 40};
    int32_t *pos = ibuf(N);
    memcpy(pos, pos_init, sizeof pos_init);
    float *x = frand(N * H * D, 1.0), *out = fbuf(N * H * D);
    CHECK_OK(ops->rope_forward(NULL, out, x, pos, N, H, D, theta));
    rope_st st = {to_double(x, N * H * D), pos, N, H, D, theta};
    double *want = dbuf(N * H * D);
    ref_rope(&st, want);
    CHECK_FWD("rope out", out, want, N * H * D);
    /* position 0 is the identity, exactly */
    ck_assert_mem_eq(out, x, H * D * sizeof(float));

    /* the rotate_half pairing: a unit vector at i rotates into i + D/2 (not i + 1) */
    float *e = fbuf(D), *eo = fbuf(D);
    int32_t *p5 = ibuf(1);
    p5[0] = 5;
    e[1] = 1.0f;
    CHECK_OK(ops->rope_forward(NULL, eo, e, p5, 1, 1, D, theta));
    double a = 5.0 * pow(10000.0, -2.0 / D);
    for (int i = 0; i < D; i++) {
        double w = i == 1 ? cos(a) : (i == 1 + D / 2 ? sin(a) : 0.0);
        ck_assert_msg(fabs(eo[i] - w) < 1e-6, "rope e1 -> [%d] = %g, want %g", i, eo[i], w);
    }

    /* Qwen2.5's theta = 1e6 and a longer position */
    pos[4] = 1000;
    rope_st st6 = {st.x, pos, N, H, D, 1e6};
    CHECK_OK(ops->rope_forward(NULL, out, x, pos, N, H, D, 1e6f));
    ref_rope(&st6, want);
    CHECK_FWD("rope out (theta 1e6, pos 1000)", out, want, N * H * D);
    pos[4] = 40;

    /* backward overwrites; in place equals out of place, bit for bit */
    float *r;
    fd_problem p = problem(ref_rope, &st, N * H * D, &r);
    float *dx = frand(N * H * D, 7.0);
    CHECK_OK(ops->rope_backward(NULL, dx, r, pos, N, H, D, theta));
    CHECK_GRAD("rope dx", dx, NULL, fd_grad(&p, (double *)st.x, N * H * D), N * H * D);
    float *r2 = fcopy(r, N * H * D);
    CHECK_OK(ops->rope_backward(NULL, r2, r2, pos, N, H, D, theta));
    ck_assert_mem_eq(r2, dx, N * H * D * sizeof(float));
    CHECK_OK(ops->rope_forward(NULL, out, x, pos, N, H, D, theta));
    float *x2 = fcopy(x, N * H * D);
    CHECK_OK(ops->rope_forward(NULL, x2, x2, pos, N, H, D, theta));
    ck_assert_mem_eq(x2, out, N * H * D * sizeof(float));
    /* backward undoes forward */
    CHECK_OK(ops->rope_backward(NULL, x2, x2, pos, N, H, D, theta));
    double *xd = to_double(x, N * H * D);
    CHECK_FWD("rope backward(forward(x)) = x", x2, xd, N * H * D);
}
END_TEST

/* =========================================================================================== */
/* attention                                                                                   */
/* =========================================================================================== */
typedef struct attn_st {
    const double *q, *k, *v;
    const int32_t *len;
    int64_t B, T, Hq, Hkv, D;
    double *lse; /* optional output */
} attn_st;
/* Naive causal softmax(q k^T / sqrt(D)) v, one query row at a time. Query head h reads kv head
 * h / (Hq / Hkv): HF's repeat_kv expands kv head j to query heads j*n_rep .. j*n_rep + n_rep - 1. */
static void ref_attention(const void *sv, double *out)
{
    const attn_st *s = sv;
    const int64_t T = s->T, Hq = s->Hq, Hkv = s->Hkv, D = s->D, n_rep = Hq / Hkv;
    double sc[64];
    ck_assert_int_le(T, 64);
    for (int64_t b = 0; b < s->B; b++) {
        int64_t len = s->len ? s->len[b] : T;
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < Hq; h++) {
                double *o = out + ((b * T + t) * Hq + h) * D;
                for (int64_t d = 0; d < D; d++) o[d] = 0.0;
                if (s->lse) s->lse[(b * Hq + h) * T + t] = 0.0;
                if (t >= len) continue;
                const double *qt = s->q + ((b * T + t) * Hq + h) * D;
                const int64_t kh = h / n_rep;
                double m = -INFINITY, sum = 0.0;
                for (int64_t u = 0; u <= t; u++) { /* causal: keys u <= t only */
                    double acc = 0.0;
                    for (int64_t d = 0; d < D; d++) acc += qt[d] * s->k[((b * T + u) * Hkv + kh) * D + d];
                    sc[u] = acc / sqrt((double)D);
                    m = fmax(m, sc[u]);
                }
                for (int64_t u = 0; u <= t; u++) sum += exp(sc[u] - m);
                for (int64_t u = 0; u <= t; u++)
                    for (int64_t d = 0; d < D; d++)
                        o[d] += exp(sc[u] - m) / sum * s->v[((b * T + u) * Hkv + kh) * D + d];
                if (s->lse) s->lse[(b * Hq + h) * T + t] = m + log(sum);
            }
    }
}

/* Forward vs the reference and backward vs central differences for one configuration. Padded
 * tokens hold NaN: any read of them by the op would show. */
static void attention_case(const char *name, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                           const int32_t *len_init)
{
    char what[96];
    const int64_t nq = B * T * Hq * D, nk = B * T * Hkv * D, nl = B * Hq * T;
    float *q = frand(nq, 1.5), *k = frand(nk, 1.5), *v = frand(nk, 1.0);
    int32_t *len = NULL;
    if (len_init) {
        len = ibuf(B);
        memcpy(len, len_init, (size_t)B * sizeof(int32_t));
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = len[b]; t < T; t++) {
                for (int64_t i = 0; i < Hq * D; i++) q[(b * T + t) * Hq * D + i] = NAN;
                for (int64_t i = 0; i < Hkv * D; i++) k[(b * T + t) * Hkv * D + i] = v[(b * T + t) * Hkv * D + i] = NAN;
            }
    }
    float *out = frand(nq, 3.0), *lse = frand(nl, 3.0); /* garbage: forward overwrites */
    CHECK_OK(ops->attention_forward(NULL, out, lse, q, k, v, len, B, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    attn_st st = {to_double(q, nq), to_double(k, nk), to_double(v, nk), len, B, T, Hq, Hkv, D, dbuf(nl)};
    double *want = dbuf(nq);
    ref_attention(&st, want);
    snprintf(what, sizeof what, "attention out %s", name);
    CHECK_FWD(what, out, want, nq);
    snprintf(what, sizeof what, "attention lse %s", name);
    CHECK_FWD(what, lse, st.lse, nl);
    st.lse = NULL;

    float *r;
    fd_problem p = problem(ref_attention, &st, nq, &r);
    float *dq = frand(nq, 1.0), *dk = frand(nk, 1.0), *dv = frand(nk, 1.0);
    float *dq0 = fcopy(dq, nq), *dk0 = fcopy(dk, nk), *dv0 = fcopy(dv, nk);
    CHECK_OK(ops->attention_backward(NULL, dq, dk, dv, r, q, k, v, out, lse, len, B, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    snprintf(what, sizeof what, "attention dq %s", name);
    CHECK_GRAD(what, dq, dq0, fd_grad(&p, (double *)st.q, nq), nq);
    snprintf(what, sizeof what, "attention dk %s", name);
    CHECK_GRAD(what, dk, dk0, fd_grad(&p, (double *)st.k, nk), nk);
    snprintf(what, sizeof what, "attention dv %s", name);
    CHECK_GRAD(what, dv, dv0, fd_grad(&p, (double *)st.v, nk), nk);
}

START_TEST(test_attention)
{
    rng = 17;
    static const int32_t len2[2] = {5, 3};
    attention_case("(B2 T5 Hq4 Hkv2 D8, lengths 5,3)", 2, 5, 4, 2, 8, len2);
    attention_case("(B2 T5 Hq3 Hkv1 D6, no lengths)", 2, 5, 3, 1, 6, NULL);
    static const int32_t len3[3] = {1, 7, 0};
    attention_case("(B3 T7 Hq2 Hkv2 D4, lengths 1,7,0)", 3, 7, 2, 2, 4, len3);
}
END_TEST

/* BF16 numerics (ops.h), against the contract written out independently here: BF16 operands,
 * double scores and lse, p = bf16(expf(x - lse)); and the backward against FP32 numerics: close
 * (it is the same gradient with BF16 operands) but not equal (the rounding does happen). */
static float r16(float x) { return fp4rl_round_bf16(x); }
START_TEST(test_attention_bf16)
{
    rng = 19;
    enum { B = 2, T = 6, Hq = 4, Hkv = 2, D = 8, G = Hq / Hkv };
    const int64_t nq = B * T * Hq * D, nk = B * T * Hkv * D, nl = B * Hq * T;
    static const int32_t len_init[B] = {6, 4};
    int32_t *len = ibuf(B);
    memcpy(len, len_init, sizeof len_init);
    float *q = frand(nq, 1.5), *k = frand(nk, 1.5), *v = frand(nk, 1.0), *out = fbuf(nq), *lse = fbuf(nl);
    float *out32 = fbuf(nq), *lse32 = fbuf(nl);
    CHECK_OK(ops->attention_forward(NULL, out, lse, q, k, v, len, B, T, Hq, Hkv, D, FP4RL_ATT_BF16));
    CHECK_OK(ops->attention_forward(NULL, out32, lse32, q, k, v, len, B, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    double *want = dbuf(nq), *want_lse = dbuf(nl);
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < len[b]; t++)
            for (int64_t h = 0; h < Hq; h++) {
                double x[T], m = -INFINITY, sum = 0.0;
                const float *qt = q + ((b * T + t) * Hq + h) * D;
                for (int64_t u = 0; u <= t; u++) {
                    const float *ku = k + ((b * T + u) * Hkv + h / G) * D;
                    double d = 0.0;
                    for (int64_t i = 0; i < D; i++) d += (double)r16(qt[i]) * r16(ku[i]);
                    x[u] = (double)(float)(scale * d);
                    m = x[u] > m ? x[u] : m;
                }
                for (int64_t u = 0; u <= t; u++) sum += exp(x[u] - m);
                const double l = m + log(sum);
                want_lse[(b * Hq + h) * T + t] = l;
                for (int64_t u = 0; u <= t; u++) {
                    const double p = r16(expf((float)(x[u] - l)));
                    for (int64_t i = 0; i < D; i++) want[((b * T + t) * Hq + h) * D + i] += p * r16(v[((b * T + u) * Hkv + h / G) * D + i]);
                }
            }
    CHECK_FWD("attention BF16 out vs the contract", out, want, nq);
    CHECK_FWD("attention BF16 lse vs the contract", lse, want_lse, nl);
    double *o32 = to_double(out32, nq);
    const double fwd_gap = rel_err(out, NULL, o32, nq);
    ck_assert_msg(fwd_gap > 1e-4 && fwd_gap < 3e-2, "BF16 vs FP32 attention out: relative gap %g", fwd_gap);
    /* backward: BF16 numerics vs FP32 numerics from zero gradients */
    float *dout = frand(nq, 1.0);
    float *dq = fbuf(nq), *dk = fbuf(nk), *dv = fbuf(nk), *dq32 = fbuf(nq), *dk32 = fbuf(nk), *dv32 = fbuf(nk);
    CHECK_OK(ops->attention_backward(NULL, dq, dk, dv, dout, q, k, v, out, lse, len, B, T, Hq, Hkv, D, FP4RL_ATT_BF16));
    CHECK_OK(ops->attention_backward(NULL, dq32, dk32, dv32, dout, q, k, v, out32, lse32, len, B, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    const float *g16[3] = {dq, dk, dv}, *g32[3] = {dq32, dk32, dv32};
    const int64_t ng[3] = {nq, nk, nk};
    for (int i = 0; i < 3; i++) {
        const double gap = rel_err(g16[i], NULL, to_double(g32[i], ng[i]), ng[i]);
        ck_assert_msg(gap > 1e-4 && gap < 5e-2, "BF16 vs FP32 attention gradient %d: relative gap %g", i, gap);
    }
    /* padded rows of sequence 1 (t = 4, 5) get nothing */
    for (int64_t t = 4; t < T; t++) {
        for (int64_t i = 0; i < Hq * D; i++) ck_assert_float_eq(dq[((1 * T + t) * Hq) * D + i], 0.0f);
        for (int64_t i = 0; i < Hkv * D; i++) ck_assert_float_eq(dk[((1 * T + t) * Hkv) * D + i], 0.0f);
    }
    /* attention_rows in BF16 numerics gives the training forward's rows bit for bit: every row t
     * of a sequence against its first t + 1 keys (the prefill), from an FP32 cache (k, v as rows
     * b * T + s) and from a BF16 one written by kv_store; and split into two segments (a shared
     * prompt, then the completion's own rows) it gives the same bits */
    const int64_t rows = B * T, W = Hkv * D;
    int32_t *seg = calloc((size_t)(4 * rows), sizeof(int32_t)), *seg2 = calloc((size_t)(4 * rows), sizeof(int32_t));
    int32_t *ids = calloc((size_t)rows, sizeof(int32_t));
    uint16_t *kb = calloc((size_t)(rows * W), sizeof(uint16_t)), *vb = calloc((size_t)(rows * W), sizeof(uint16_t));
    float *kf = fbuf(rows * W), *vf = fbuf(rows * W), *od = fbuf(nq);
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / T, t = r % T, split = t / 2;
        ids[r] = (int32_t)(rows - 1 - r); /* stored in reverse order: the rows, not the call order, place them */
        seg[4 * r] = (int32_t)(b * T), seg[4 * r + 1] = (int32_t)(t + 1);
        seg2[4 * r] = (int32_t)(b * T), seg2[4 * r + 1] = (int32_t)split;
        seg2[4 * r + 2] = (int32_t)(b * T + split), seg2[4 * r + 3] = (int32_t)(t + 1 - split);
    }
    float *krev = fbuf(rows * W), *vrev = fbuf(rows * W);
    for (int64_t r = 0; r < rows; r++) {
        memcpy(krev + r * W, k + (rows - 1 - r) * W, (size_t)W * sizeof(float));
        memcpy(vrev + r * W, v + (rows - 1 - r) * W, (size_t)W * sizeof(float));
    }
    CHECK_OK(ops->kv_store(NULL, kf, 0, krev, ids, rows, W));
    CHECK_OK(ops->kv_store(NULL, vf, 0, vrev, ids, rows, W));
    ck_assert_mem_eq(kf, k, (size_t)(rows * W) * sizeof(float));
    CHECK_OK(ops->kv_store(NULL, kb, 1, krev, ids, rows, W));
    CHECK_OK(ops->kv_store(NULL, vb, 1, vrev, ids, rows, W));
    for (int64_t i = 0; i < rows * W; i++) ck_assert_uint_eq(kb[i], fp4rl_f32_to_bf16(k[i]));
    const void *caches[2][2] = {{kf, vf}, {kb, vb}};
    for (int bf = 0; bf < 2; bf++)
        for (int split = 0; split < 2; split++) {
            CHECK_OK(ops->attention_rows(NULL, od, q, caches[bf][0], caches[bf][1], bf, split ? seg2 : seg, rows, T, Hq, Hkv, D,
                                         FP4RL_ATT_BF16));
            for (int64_t r = 0; r < rows; r++) {
                if (r % T >= len[r / T]) continue; /* padding rows of the training forward are 0 */
                ck_assert_msg(!memcmp(od + r * Hq * D, out + r * Hq * D, Hq * D * sizeof(float)),
                              "attention_rows row %lld (bf16 cache %d, split %d) differs from the training forward", (long long)r, bf, split);
            }
        }
    /* in FP32 numerics from an FP32 cache: the FP32 training forward's rows */
    CHECK_OK(ops->attention_rows(NULL, od, q, kf, vf, 0, seg2, rows, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    /* a row with more keys than max_keys is refused */
    ck_assert_int_ne(ops->attention_rows(NULL, od, q, kf, vf, 0, seg2, rows, T - 1, Hq, Hkv, D, FP4RL_ATT_FP32), FP4RL_OK);
    for (int64_t r = 0; r < rows; r++)
        if (r % T < len[r / T]) ck_assert_mem_eq(od + r * Hq * D, out32 + r * Hq * D, Hq * D * sizeof(float));
    free(seg), free(seg2), free(ids), free(kb), free(vb);
}
END_TEST

/* The structure, shown directly: GQA head mapping, causality, padding. */
START_TEST(test_attention_structure)
{
    rng = 18;
    enum { B = 1, T = 5, Hq = 4, Hkv = 2, D = 8 };
    float *q = frand(B * T * Hq * D, 1.0), *k = frand(B * T * Hkv * D, 1.0), *v = fbuf(B * T * Hkv * D);
    float *out = fbuf(B * T * Hq * D), *lse = fbuf(B * Hq * T);
    /* v of kv head j is the constant j + 1: the probabilities sum to one, so query heads 0, 1
     * must give 1 and heads 2, 3 must give 2 */
    for (int t = 0; t < T; t++)
        for (int j = 0; j < Hkv; j++)
            for (int d = 0; d < D; d++) v[(t * Hkv + j) * D + d] = (float)(j + 1);
    CHECK_OK(ops->attention_forward(NULL, out, lse, q, k, v, NULL, B, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hq; h++)
            for (int d = 0; d < D; d++) {
                float got = out[(t * Hq + h) * D + d], want = (float)(h / 2 + 1);
                ck_assert_msg(fabsf(got - want) < 1e-6f, "GQA: out[t%d h%d] = %g, want %g", t, h, got, want);
            }
    /* the first token attends only to itself: out = v[0], lse = q.k / sqrt(D) */
    v = frand(B * T * Hkv * D, 1.0);
    CHECK_OK(ops->attention_forward(NULL, out, lse, q, k, v, NULL, B, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    for (int h = 0; h < Hq; h++)
        for (int d = 0; d < D; d++) ck_assert_float_eq_tol(out[h * D + d], v[(h / 2) * D + d], 1e-6f);
    /* causality: changing the last token's k and v leaves every earlier row bit-identical */
    float *out2 = fbuf(B * T * Hq * D), *lse2 = fbuf(B * Hq * T);
    for (int i = 0; i < Hkv * D; i++) {
        k[(T - 1) * Hkv * D + i] += 3.0f;
        v[(T - 1) * Hkv * D + i] -= 2.0f;
    }
    float *out1 = fcopy(out, B * T * Hq * D);
    CHECK_OK(ops->attention_forward(NULL, out1, lse, q, k, v, NULL, B, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    for (int i = 0; i < Hkv * D; i++) {
        k[(T - 1) * Hkv * D + i] -= 1.0f;
        v[(T - 1) * Hkv * D + i] += 5.0f;
    }
    CHECK_OK(ops->attention_forward(NULL, out2, lse2, q, k, v, NULL, B, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    ck_assert_mem_eq(out1, out2, (T - 1) * Hq * D * sizeof(float));
    ck_assert(memcmp(out1 + (T - 1) * Hq * D, out2 + (T - 1) * Hq * D, Hq * D * sizeof(float)) != 0);
    /* padding: with length 3, rows 3 and 4 are zero with lse 0, rows 0..2 equal the full run's
     * (a later token is never a key of an earlier one), and backward leaves padded gradients alone */
    int32_t *len = ibuf(1);
    len[0] = 3;
    CHECK_OK(ops->attention_forward(NULL, out1, lse, q, k, v, len, B, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    ck_assert_mem_eq(out1, out2, 3 * Hq * D * sizeof(float));
    for (int i = 3 * Hq * D; i < T * Hq * D; i++) ck_assert_float_eq(out1[i], 0.0f);
    for (int h = 0; h < Hq; h++)
        for (int t = 3; t < T; t++) ck_assert_float_eq(lse[h * T + t], 0.0f);
    float *dout = frand(B * T * Hq * D, 1.0);
    float *dq = fbuf(B * T * Hq * D), *dk = fbuf(B * T * Hkv * D), *dv = fbuf(B * T * Hkv * D);
    CHECK_OK(ops->attention_backward(NULL, dq, dk, dv, dout, q, k, v, out1, lse, len, B, T, Hq, Hkv, D, FP4RL_ATT_FP32));
    for (int i = 3 * Hq * D; i < T * Hq * D; i++) ck_assert_float_eq(dq[i], 0.0f);
    for (int i = 3 * Hkv * D; i < T * Hkv * D; i++) {
        ck_assert_float_eq(dk[i], 0.0f);
        ck_assert_float_eq(dv[i], 0.0f);
    }
}
END_TEST

/* =========================================================================================== */
/* SwiGLU and residual                                                                          */
/* =========================================================================================== */
typedef struct ew_st { const double *a, *b; int64_t n; } ew_st;
static void ref_swiglu(const void *sv, double *out)
{
    const ew_st *s = sv;
    for (int64_t i = 0; i < s->n; i++) out[i] = s->a[i] / (1.0 + exp(-s->a[i])) * s->b[i];
}
static void ref_residual(const void *sv, double *out)
{
    const ew_st *s = sv;
    for (int64_t i = 0; i < s->n; i++) out[i] = s->a[i] + s->b[i];
}

START_TEST(test_swiglu)
{
    rng = 19;
    enum { n = 13 };
    float *gate = frand(n, 4.0), *up = frand(n, 2.0), *out = fbuf(n);
    gate[0] = 30.0f;  /* saturated sigmoid */
    gate[1] = -30.0f; /* exp(30) in the denominator */
    gate[2] = -100.0f; /* expf overflows to inf: silu must be -0, not NaN */
    CHECK_OK(ops->swiglu_forward(NULL, out, gate, up, n));
    ew_st st = {to_double(gate, n), to_double(up, n), n};
    double *want = dbuf(n);
    ref_swiglu(&st, want);
    CHECK_FWD("swiglu out", out, want, n);

    float *r;
    fd_problem p = problem(ref_swiglu, &st, n, &r);
    float *dg = frand(n, 1.0), *dg0 = fcopy(dg, n), *du = frand(n, 1.0), *du0 = fcopy(du, n);
    CHECK_OK(ops->swiglu_backward(NULL, dg, du, r, gate, up, n));
    CHECK_GRAD("swiglu dgate", dg, dg0, fd_grad(&p, (double *)st.a, n), n);
    CHECK_GRAD("swiglu dup", du, du0, fd_grad(&p, (double *)st.b, n), n);
}
END_TEST

START_TEST(test_residual)
{
    rng = 20;
    enum { n = 7 };
    float *a = frand(n, 1.0), *b = frand(n, 1.0), *out = fbuf(n);
    CHECK_OK(ops->residual_forward(NULL, out, a, b, n));
    ew_st st = {to_double(a, n), to_double(b, n), n};
    double *want = dbuf(n);
    ref_residual(&st, want);
    CHECK_FWD("residual out", out, want, n);
    float *r;
    fd_problem p = problem(ref_residual, &st, n, &r);
    float *da = frand(n, 1.0), *da0 = fcopy(da, n), *db = frand(n, 1.0), *db0 = fcopy(db, n);
    CHECK_OK(ops->residual_backward(NULL, da, db, r, n));
    CHECK_GRAD("residual da", da, da0, fd_grad(&p, (double *)st.a, n), n);
    CHECK_GRAD("residual db", db, db0, fd_grad(&p, (double *)st.b, n), n);
}
END_TEST

/* =========================================================================================== */
/* log-probs, entropy, cross-entropy                                                           */
/* =========================================================================================== */
typedef struct lp_st { const double *x; const int32_t *tgt; const double *mask; int64_t N, V; } lp_st;
static double ref_lse(const double *x, int64_t V)
{
    double m = x[0], s = 0.0;
    for (int64_t v = 1; v < V; v++) m = fmax(m, x[v]);
    for (int64_t v = 0; v < V; v++) s += exp(x[v] - m);
    return m + log(s);
}
/* out[0..N) = log p(target) (0 if ignored), out[N..2N) = entropy */
static void ref_logprobs(const void *sv, double *out)
{
    const lp_st *s = sv;
    for (int64_t n = 0; n < s->N; n++) {
        const double *x = s->x + n * s->V;
        double l = ref_lse(x, s->V), h = 0.0;
        int32_t t = s->tgt[n];
        out[n] = (t >= 0 && t < s->V) ? x[t] - l : 0.0;
        for (int64_t v = 0; v < s->V; v++) h -= exp(x[v] - l) * (x[v] - l);
        out[s->N + n] = h;
    }
}
/* out[0] = masked mean of -log p(target) */
static void ref_ce(const void *sv, double *out)
{
    const lp_st *s = sv;
    double tot = 0.0, cnt = 0.0;
    for (int64_t n = 0; n < s->N; n++) {
        int32_t t = s->tgt[n];
        if (t < 0 || t >= s->V) continue;
        double m = s->mask ? s->mask[n] : 1.0;
        tot += m * (ref_lse(s->x + n * s->V, s->V) - s->x[n * s->V + t]);
        cnt += m;
    }
    out[0] = cnt > 0.0 ? tot / cnt : 0.0;
}

START_TEST(test_logprobs)
{
    rng = 21;
    enum { N = 6, V = 11 };
    static const int32_t tgt_init[N] = {4, 0, 10, -100, 7, 11}; /* -100 and 11 are ignored */
    int32_t *tgt = ibuf(N);
    memcpy(tgt, tgt_init, sizeof tgt_init);
    float *x = frand(N * V, 3.0), *logp = fbuf(N), *ent = fbuf(N), *lse = fbuf(N);
    for (int v = 0; v < V; v++) x[4 * V + v] += 1000.0f; /* large logits: max-shift must hold */
    CHECK_OK(ops->logprobs_forward(NULL, logp, ent, lse, x, tgt, N, V));
    lp_st st = {to_double(x, N * V), tgt, NULL, N, V};
    double *want = dbuf(2 * N), *want_lse = dbuf(N);
    ref_logprobs(&st, want);
    for (int n = 0; n < N; n++) want_lse[n] = ref_lse(st.x + n * V, V);
    CHECK_FWD("logprobs logp", logp, want, N);
    CHECK_FWD("logprobs entropy", ent, want + N, N);
    CHECK_FWD("logprobs lse", lse, want_lse, N);
    ck_assert_float_eq(logp[3], 0.0f);
    ck_assert_float_eq(logp[5], 0.0f);

    /* one loss of both outputs: L = sum r1 logp + sum r2 H */
    float *r;
    fd_problem p = problem(ref_logprobs, &st, 2 * N, &r);
    float *dx = frand(N * V, 1.0), *dx0 = fcopy(dx, N * V);
    CHECK_OK(ops->logprobs_backward(NULL, dx, r, r + N, x, tgt, lse, ent, N, V));
    double *g = fd_grad(&p, (double *)st.x, N * V);
    CHECK_GRAD("logprobs dlogits (logp + entropy)", dx, dx0, g, N * V);

    /* logp only: the entropy half of r zeroed */
    for (int n = 0; n < N; n++) r[N + n] = 0.0f;
    p = (fd_problem){ref_logprobs, &st, to_double(r, 2 * N), 2 * N, dbuf(2 * N)};
    memcpy(dx, dx0, N * V * sizeof(float));
    CHECK_OK(ops->logprobs_backward(NULL, dx, r, NULL, x, tgt, lse, NULL, N, V));
    CHECK_GRAD("logprobs dlogits (logp only)", dx, dx0, fd_grad(&p, (double *)st.x, N * V), N * V);
    /* entropy optional in forward */
    float *logp2 = fbuf(N);
    CHECK_OK(ops->logprobs_forward(NULL, logp2, NULL, lse, x, tgt, N, V));
    ck_assert_mem_eq(logp2, logp, N * sizeof(float));
}
END_TEST

START_TEST(test_cross_entropy)
{
    rng = 22;
    enum { N = 6, V = 11 };
    static const int32_t tgt_init[N] = {4, 0, 10, -100, 7, 2};
    static const float mask_init[N] = {1.0f, 0.0f, 1.0f, 1.0f, 0.5f, 1.0f}; /* row 3: ignored target */
    int32_t *tgt = ibuf(N);
    memcpy(tgt, tgt_init, sizeof tgt_init);
    float *mask = fbuf(N);
    memcpy(mask, mask_init, sizeof mask_init);
    float *x = frand(N * V, 3.0), *loss = fbuf(1), *lse = fbuf(N);
    CHECK_OK(ops->cross_entropy_forward(NULL, loss, lse, x, tgt, mask, N, V));
    lp_st st = {to_double(x, N * V), tgt, to_double(mask, N), N, V};
    double want;
    ref_ce(&st, &want);
    CHECK_FWD("cross-entropy loss (mask)", loss, &want, 1);
    /* the same by hand: rows 0, 2, 5 weigh 1, row 4 weighs 0.5, rows 1 and 3 are out */
    double hand = 0.0;
    for (int n = 0; n < N; n++)
        if (n != 1 && n != 3) hand += (n == 4 ? 0.5 : 1.0) * (ref_lse(st.x + n * V, V) - st.x[n * V + tgt[n]]);
    hand /= 3.5;
    CHECK_FWD("cross-entropy loss (by hand)", loss, &hand, 1);

    float *dloss = fbuf(1);
    dloss[0] = 0.7f; /* a non-unit upstream gradient */
    fd_problem p = {ref_ce, &st, (double[]){0.7}, 1, dbuf(1)};
    float *dx = frand(N * V, 1.0), *dx0 = fcopy(dx, N * V);
    CHECK_OK(ops->cross_entropy_backward(NULL, dx, dloss, x, tgt, mask, lse, N, V));
    CHECK_GRAD("cross-entropy dlogits (mask)", dx, dx0, fd_grad(&p, (double *)st.x, N * V), N * V);
    /* masked-out rows get nothing */
    ck_assert_mem_eq(dx + 1 * V, dx0 + 1 * V, V * sizeof(float));
    ck_assert_mem_eq(dx + 3 * V, dx0 + 3 * V, V * sizeof(float));

    /* no mask: the mean over rows with a valid target */
    lp_st st_nm = st;
    st_nm.mask = NULL;
    CHECK_OK(ops->cross_entropy_forward(NULL, loss, lse, x, tgt, NULL, N, V));
    ref_ce(&st_nm, &want);
    CHECK_FWD("cross-entropy loss (no mask)", loss, &want, 1);
    fd_problem pn = {ref_ce, &st_nm, (double[]){0.7}, 1, dbuf(1)};
    memcpy(dx, dx0, N * V * sizeof(float));
    CHECK_OK(ops->cross_entropy_backward(NULL, dx, dloss, x, tgt, NULL, lse, N, V));
    CHECK_GRAD("cross-entropy dlogits (no mask)", dx, dx0, fd_grad(&pn, (double *)st_nm.x, N * V), N * V);

    /* nothing counts: loss 0, no gradient, no NaN */
    for (int n = 0; n < N; n++) mask[n] = 0.0f;
    CHECK_OK(ops->cross_entropy_forward(NULL, loss, lse, x, tgt, mask, N, V));
    ck_assert_float_eq(loss[0], 0.0f);
    memcpy(dx, dx0, N * V * sizeof(float));
    CHECK_OK(ops->cross_entropy_backward(NULL, dx, dloss, x, tgt, mask, lse, N, V));
    ck_assert_mem_eq(dx, dx0, N * V * sizeof(float));
}
END_TEST

/* =========================================================================================== */
/* optimizer                                                                                   */
/* =========================================================================================== */
START_TEST(test_adamw)
{
    /* one step by hand: p = 1, g = 0.5, lr = 0.1, wd = 0.01, t = 1:
     * p = 1 - 0.1 * 0.01 = 0.999; m = 0.05, v = 0.00025; m^ = 0.5, v^ = 0.25;
     * p = 0.999 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.899 (+2e-10) */
    float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
    CHECK_OK(ops->adamw_update(NULL, &p, &g, &m, &v, 1, 0.1, 0.9, 0.999, 1e-8, 0.01, 1));
    ck_assert_float_eq_tol(p, 0.899f, 1e-6f);
    ck_assert_float_eq_tol(m, 0.05f, 1e-8f);
    ck_assert_float_eq_tol(v, 0.00025f, 1e-10f);

    /* two steps on a vector vs the PyTorch formulas in double */
    rng = 23;
    enum { n = 7 };
    const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    float *pf = frand(n, 1.0), *mf = fbuf(n), *vf = fbuf(n);
    double *pd = to_double(pf, n), *md = dbuf(n), *vd = dbuf(n);
    const float p0 = pf[0];
    for (int t = 1; t <= 2; t++) {
        float *gf = frand(n, 1.0);
        gf[0] = 0.0f; /* zero gradient: only the decay moves p (m, v stay 0 on step 1) */
        CHECK_OK(ops->adamw_update(NULL, pf, gf, mf, vf, n, lr, b1, b2, eps, wd, t));
        for (int i = 0; i < n; i++) {
            pd[i] *= 1.0 - lr * wd;
            md[i] = b1 * md[i] + (1.0 - b1) * gf[i];
            vd[i] = b2 * vd[i] + (1.0 - b2) * gf[i] * gf[i];
            double mhat = md[i] / (1.0 - pow(b1, t)), vhat = vd[i] / (1.0 - pow(b2, t));
            pd[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
        char what[32];
        snprintf(what, sizeof what, "adamw params, step %d", t);
        CHECK_ERR(what, rel_err(pf, NULL, pd, n), 1e-6);
        snprintf(what, sizeof what, "adamw m, step %d", t);
        CHECK_FWD(what, mf, md, n);
        snprintf(what, sizeof what, "adamw v, step %d", t);
        CHECK_FWD(what, vf, vd, n);
        if (t == 1) /* decay only, exactly: p * (1 - lr wd) in binary32 */
            ck_assert_float_eq(pf[0], p0 * (float)(1.0 - lr * wd));
    }
}
END_TEST

START_TEST(test_grad_norm_clip)
{
    rng = 24;
    enum { n = 29 };
    float *g = frand(n, 2.0), *norm = fbuf(1);
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)g[i] * g[i];
    const double want = sqrt(ss);
    CHECK_OK(ops->grad_norm(NULL, norm, g, n));
    CHECK_FWD("grad norm", norm, &want, 1);

    /* max_norm above the norm: untouched, bit for bit */
    float *g0 = fcopy(g, n);
    CHECK_OK(ops->grad_clip(NULL, g, n, norm, (float)want * 2.0f));
    ck_assert_mem_eq(g, g0, n * sizeof(float));
    /* below: scaled by max_norm / (norm + 1e-6), so the new norm is max_norm */
    CHECK_OK(ops->grad_clip(NULL, g, n, norm, 1.0f));
    double *scaled = dbuf(n);
    for (int i = 0; i < n; i++) scaled[i] = g0[i] * (1.0 / ((double)norm[0] + 1e-6));
    CHECK_FWD("grad clip", g, scaled, n);
    CHECK_OK(ops->grad_norm(NULL, norm, g, n));
    ck_assert_float_eq_tol(norm[0], 1.0f, 1e-5f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_grad");
    TCase *tc = tcase_create("cpu");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_embedding);
    tcase_add_test(tc, test_rmsnorm);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_linear_operand_routing);
    tcase_add_test(tc, test_round_bf16);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_attention_structure);
    tcase_add_test(tc, test_attention_bf16);
    tcase_add_test(tc, test_swiglu);
    tcase_add_test(tc, test_residual);
    tcase_add_test(tc, test_logprobs);
    tcase_add_test(tc, test_cross_entropy);
    tcase_add_test(tc, test_adamw);
    tcase_add_test(tc, test_grad_norm_clip);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
