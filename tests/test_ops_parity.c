/*
 * test_ops_parity.c - the CUDA op table (cuda/ops_*.cu) against the CPU reference (core/cpu/ops_*.c):
 * every op on the same random inputs, then the Qwen2 gqa fixture end to end (FP32 numerics:
 * logits and gradients), and one RL step on CUDA in HiF4 W4A4 + ResQ 2:4 numerics.
 *
 * Errors are normwise: max |gpu - cpu| / max |cpu| over a buffer. Tolerances: elementwise ops
 * (residual, SwiGLU, RoPE, embedding, AdamW, masks, ...) 1e-6; GEMMs, attention and row
 * reductions 1e-5; the model's logits 1e-5 and gradients 1e-4 (||.||_2 relative). Integer
 * results (sampled tokens, ResQ masks, counts) must be equal.
 * Label `gpu`: exits 77 (skipped) when no CUDA context can be created.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "check_run.h"
#include "backend/ops.h"
#include "format/layout.h"
#include "format/qdq_block.h"

#include "fixtures_path.h"

static fp4rl_context *gpu, *cpu;
static const fp4rl_ops *G, *C;

/* ---- helpers ---- */
static uint64_t rng = 88172645463325252ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float *rnd(int64_t n, float s)
{
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = s * frand();
    return p;
}
static void *dup_mem(const void *p, size_t bytes)
{
    void *q = malloc(bytes);
    memcpy(q, p, bytes);
    return q;
}
static void *up(const void *h, size_t bytes)
{
    void *d = NULL;
    ck_assert_int_eq(gpu->be->alloc(gpu, &d, bytes), FP4RL_OK);
    ck_assert_int_eq(gpu->be->upload(gpu, d, h, bytes), FP4RL_OK);
    return d;
}
static float *upf(const float *h, int64_t n) { return up(h, (size_t)n * sizeof(float)); }
static int32_t *upi(const int32_t *h, int64_t n) { return up(h, (size_t)n * sizeof(int32_t)); }
static void *down(const void *d, size_t bytes)
{
    void *h = malloc(bytes);
    ck_assert_msg(gpu->be->download(gpu, h, d, bytes) == FP4RL_OK, "%s", fp4rl_last_error());
    return h;
}
static void dfree(void *d) { gpu->be->free(gpu, d); }

/* compares device buffer d against host reference ref */
static double cmp(const char *what, const void *d, const float *ref, int64_t n, double tol)
{
    float *g = down(d, (size_t)n * sizeof(float));
    double num = 0, den = 0;
    int64_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)g[i] - ref[i]);
        if (!(e <= num)) num = e, worst = i; /* NaN sticks */
        if (fabs(ref[i]) > den) den = fabs(ref[i]);
    }
    double err = num / (den > 0 ? den : 1);
    printf("  %-34s rel err %.3g (tol %.0e)\n", what, err, tol);
    ck_assert_msg(err <= tol, "%s: rel err %.3g > %.3g (at %lld: gpu %.9g cpu %.9g)", what, err, tol, (long long)worst, g[worst],
                  ref[worst]);
    free(g);
    return err;
}
#define OKG(call) ck_assert_msg((call) == FP4RL_OK, "%s", fp4rl_last_error())

static void setup(void)
{
    ck_assert_int_eq(fp4rl_context_create(&gpu, FP4RL_DEVICE_CUDA, 0), FP4RL_OK);
    ck_assert_int_eq(fp4rl_context_create(&cpu, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    G = gpu->ops;
    C = cpu->ops;
    ck_assert_ptr_nonnull(G);
    ck_assert_str_eq(G->name, "cuda");
}
static void teardown(void)
{
    fp4rl_context_destroy(gpu);
    fp4rl_context_destroy(cpu);
}

/* ---- ops ---- */
START_TEST(test_elementwise)
{
    const int64_t n = 4099;
    float *a = rnd(n, 4), *b = rnd(n, 2), *o = rnd(n, 1), *o2 = dup_mem(o, n * 4);
    float *da = upf(a, n), *db = upf(b, n), *dout = upf(o, n), *dout2 = upf(o2, n), *tmp;
    /* residual */
    float *h = malloc(n * 4);
    C->residual_forward(cpu, h, a, b, n);
    tmp = upf(h, n);
    OKG(G->residual_forward(gpu, tmp, da, db, n));
    cmp("residual_forward", tmp, h, n, 0);
    float *ga = dup_mem(a, n * 4), *gb = dup_mem(b, n * 4);
    float *dga = upf(ga, n), *dgb = upf(gb, n);
    C->residual_backward(cpu, ga, gb, o, n);
    OKG(G->residual_backward(gpu, dga, dgb, dout, n));
    cmp("residual_backward da", dga, ga, n, 0);
    cmp("residual_backward db", dgb, gb, n, 0);
    /* copy and sub (bit for bit) */
    C->copy(cpu, h, a, n);
    OKG(G->copy(gpu, tmp, da, n));
    cmp("copy", tmp, h, n, 0);
    C->sub(cpu, h, a, b, n);
    OKG(G->sub(gpu, tmp, da, db, n));
    cmp("sub", tmp, h, n, 0);
    /* swiglu */
    C->swiglu_forward(cpu, h, a, b, n);
    OKG(G->swiglu_forward(gpu, tmp, da, db, n));
    cmp("swiglu_forward", tmp, h, n, 1e-6);
    C->swiglu_backward(cpu, ga, gb, o, a, b, n);
    OKG(G->swiglu_backward(gpu, dga, dgb, dout, da, db, n));
    cmp("swiglu_backward dgate", dga, ga, n, 1e-6);
    cmp("swiglu_backward dup", dgb, gb, n, 1e-6);
    /* scale, round_bf16 (in place) */
    C->scale(cpu, o2, n, 0.37f);
    OKG(G->scale(gpu, dout2, n, 0.37f));
    cmp("scale", dout2, o2, n, 0);
    C->round_bf16(cpu, o2, o2, n);
    OKG(G->round_bf16(gpu, dout2, dout2, n));
    cmp("round_bf16 (in place)", dout2, o2, n, 0);
    /* underflow_count */
    float *x = rnd(n, 1), *xq = dup_mem(x, n * 4);
    for (int64_t i = 0; i < n; i += 3) x[i] = 0;
    for (int64_t i = 0; i < n; i += 5) xq[i] = 0;
    float counts[2] = {3, 1};
    float *dc = upf(counts, 2), *dx = upf(x, n), *dxq = upf(xq, n);
    C->underflow_count(cpu, counts, x, xq, n);
    OKG(G->underflow_count(gpu, dc, dx, dxq, n));
    cmp("underflow_count", dc, counts, 2, 0);
    /* AdamW, grad norm and clip */
    float *p = rnd(n, 1), *gr = rnd(n, 0.1f), *m = rnd(n, 0.01f), *v = rnd(n, 0.001f);
    for (int64_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *dp = upf(p, n), *dg = upf(gr, n), *dm = upf(m, n), *dv = upf(v, n);
    C->adamw_update(cpu, p, gr, m, v, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3);
    OKG(G->adamw_update(gpu, dp, dg, dm, dv, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3));
    cmp("adamw_update params", dp, p, n, 0); /* the same arithmetic: core/backend/adamw_math.h */
    cmp("adamw_update m", dm, m, n, 0);
    cmp("adamw_update v", dv, v, n, 0);
    /* its dry run: clean at this lr, non-finite at lr 1 with one huge gradient */
    float bad[2] = {7, 7}, *dbad = upf(bad, 1);
    C->adamw_check(cpu, &bad[0], p, gr, m, v, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 4);
    OKG(G->adamw_check(gpu, dbad, dp, dg, dm, dv, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 4));
    ck_assert(bad[0] == 0.0f);
    cmp("adamw_check (finite)", dbad, &bad[0], 1, 0);
    gr[n / 3] = 1e30f;
    dfree(dg);
    dg = upf(gr, n);
    C->adamw_check(cpu, &bad[1], p, gr, m, v, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 4);
    OKG(G->adamw_check(gpu, dbad, dp, dg, dm, dv, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 4));
    ck_assert(bad[1] == 1.0f);
    cmp("adamw_check (non-finite)", dbad, &bad[1], 1, 0);
    /* BF16 moments: the FP32 step, then stochastic rounding with fp4rl_sr_uniform's uniforms, so
     * the parameters and the moments' bits are the CPU's; two steps, the second from the first's
     * rounded moments (n odd: a partial Philox block at the end) */
    {
        float *pb = rnd(n, 1), *gb16 = rnd(n, 0.1f);
        uint16_t *mb = malloc(n * 2), *vb = malloc(n * 2);
        for (int64_t i = 0; i < n; i++) mb[i] = fp4rl_f32_to_bf16(0.01f * frand()), vb[i] = fp4rl_f32_to_bf16(0.001f * fabsf(frand()));
        float *dpb = upf(pb, n), *dgb16 = upf(gb16, n);
        uint16_t *dmb = up(mb, n * 2), *dvb = up(vb, n * 2);
        for (int64_t t = 1; t <= 2; t++) {
            C->adamw_update_bf16(cpu, pb, gb16, mb, vb, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, t, 0x5eedull, 0xada0000000000000ull + t);
            OKG(G->adamw_update_bf16(gpu, dpb, dgb16, dmb, dvb, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, t, 0x5eedull, 0xada0000000000000ull + t));
        }
        cmp("adamw_update_bf16 params", dpb, pb, n, 0);
        uint16_t *gm = down(dmb, n * 2), *gv = down(dvb, n * 2);
        ck_assert_msg(memcmp(gm, mb, n * 2) == 0, "adamw_update_bf16: the GPU's BF16 m differs from the CPU's");
        ck_assert_msg(memcmp(gv, vb, n * 2) == 0, "adamw_update_bf16: the GPU's BF16 v differs from the CPU's");
        printf("  %-34s bit-identical\n", "adamw_update_bf16 m, v");
        float bb[2] = {7, 7};
        C->adamw_check_bf16(cpu, &bb[0], pb, gb16, mb, vb, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3, 0x5eedull, 3);
        OKG(G->adamw_check_bf16(gpu, dbad, dpb, dgb16, dmb, dvb, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3, 0x5eedull, 3));
        ck_assert(bb[0] == 0.0f);
        cmp("adamw_check_bf16 (finite)", dbad, &bb[0], 1, 0);
        gb16[n - 1] = 1e30f; /* its square overflows v */
        dfree(dgb16);
        dgb16 = upf(gb16, n);
        C->adamw_check_bf16(cpu, &bb[1], pb, gb16, mb, vb, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3, 0x5eedull, 3);
        OKG(G->adamw_check_bf16(gpu, dbad, dpb, dgb16, dmb, dvb, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, 3, 0x5eedull, 3));
        ck_assert(bb[1] == 1.0f);
        cmp("adamw_check_bf16 (non-finite)", dbad, &bb[1], 1, 0);
        free(pb), free(gb16), free(mb), free(vb), free(gm), free(gv);
        dfree(dpb), dfree(dgb16), dfree(dmb), dfree(dvb);
    }
    dfree(dbad);
    /* the random init: bit-identical, odd offset and length */
    const int64_t ni = 1000003;
    float *hi = malloc(ni * 4), *di = upf(hi, ni);
    C->init_normal(cpu, hi, 12345, ni, 77);
    OKG(G->init_normal(gpu, di, 12345, ni, 77));
    cmp("init_normal", di, hi, ni, 0);
    free(hi);
    dfree(di);
    const int64_t big = 300001;
    float *g2 = rnd(big, 1), norm = 0, *dg2 = upf(g2, big), *dnorm = upf(&norm, 1);
    C->grad_norm(cpu, &norm, g2, big);
    OKG(G->grad_norm(gpu, dnorm, dg2, big));
    cmp("grad_norm", dnorm, &norm, 1, 1e-6);
    C->grad_clip(cpu, g2, big, &norm, 1.5f);
    OKG(G->grad_clip(gpu, dg2, big, dnorm, 1.5f));
    cmp("grad_clip", dg2, g2, big, 1e-6);
    free(a), free(b), free(o), free(o2), free(h), free(ga), free(gb), free(x), free(xq), free(p), free(gr), free(m), free(v), free(g2);
    dfree(da), dfree(db), dfree(dout), dfree(dout2), dfree(tmp), dfree(dga), dfree(dgb), dfree(dc), dfree(dx), dfree(dxq);
    dfree(dp), dfree(dg), dfree(dm), dfree(dv), dfree(dg2), dfree(dnorm);
}
END_TEST

START_TEST(test_embedding_norm_rope)
{
    const int64_t N = 37, V = 50, Cd = 300;
    int32_t tok[37];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 7) % 23);
    tok[3] = -100, tok[9] = (int32_t)V, tok[10] = tok[11] = 5;
    float *wte = rnd(V * Cd, 1), *out = malloc(N * Cd * 4);
    int32_t *dtok = upi(tok, N);
    float *dwte = upf(wte, V * Cd), *dout = upf(wte, N * Cd);
    C->embedding_forward(cpu, out, tok, wte, N, V, Cd);
    OKG(G->embedding_forward(gpu, dout, dtok, dwte, N, V, Cd));
    cmp("embedding_forward", dout, out, N * Cd, 0);
    float *go = rnd(N * Cd, 1), *dgo = upf(go, N * Cd);
    C->embedding_backward(cpu, wte, go, tok, N, V, Cd);
    OKG(G->embedding_backward(gpu, dwte, dgo, dtok, N, V, Cd));
    cmp("embedding_backward", dwte, wte, V * Cd, 1e-6);
    /* RMSNorm */
    float *x = rnd(N * Cd, 3), *w = rnd(Cd, 1), *rstd = malloc(N * 4);
    float *dx = upf(x, N * Cd), *dw = upf(w, Cd), *drstd = upf(x, N);
    C->rmsnorm_forward(cpu, out, rstd, x, w, N, Cd, 1e-6f);
    OKG(G->rmsnorm_forward(gpu, dout, drstd, dx, dw, N, Cd, 1e-6f));
    cmp("rmsnorm_forward out", dout, out, N * Cd, 1e-6);
    cmp("rmsnorm_forward rstd", drstd, rstd, N, 1e-6);
    float *gx = rnd(N * Cd, 1), *gw = rnd(Cd, 1), *dgx = upf(gx, N * Cd), *dgw = upf(gw, Cd);
    C->rmsnorm_backward(cpu, gx, gw, go, x, w, rstd, N, Cd);
    OKG(G->rmsnorm_backward(gpu, dgx, dgw, dgo, dx, dw, drstd, N, Cd));
    cmp("rmsnorm_backward dx", dgx, gx, N * Cd, 1e-5);
    cmp("rmsnorm_backward dweight", dgw, gw, Cd, 1e-5);
    OKG(G->rmsnorm_backward(gpu, dgx, NULL, dgo, dx, dw, drstd, N, Cd));
    C->rmsnorm_backward(cpu, gx, NULL, go, x, w, rstd, N, Cd);
    cmp("rmsnorm_backward dx (no dweight)", dgx, gx, N * Cd, 1e-5);
    /* RoPE, in place both ways */
    const int64_t H = 3, D = 16, Nr = 12;
    int32_t pos[12];
    for (int i = 0; i < Nr; i++) pos[i] = i * 41 % 500;
    int32_t *dpos = upi(pos, Nr);
    float *r = rnd(Nr * H * D, 1), *dr = upf(r, Nr * H * D);
    C->rope_forward(cpu, r, r, pos, Nr, H, D, 10000.0f);
    OKG(G->rope_forward(gpu, dr, dr, dpos, Nr, H, D, 10000.0f));
    cmp("rope_forward", dr, r, Nr * H * D, 1e-6);
    C->rope_backward(cpu, r, r, pos, Nr, H, D, 1e6f);
    OKG(G->rope_backward(gpu, dr, dr, dpos, Nr, H, D, 1e6f));
    cmp("rope_backward", dr, r, Nr * H * D, 1e-6);
    free(wte), free(out), free(go), free(x), free(w), free(rstd), free(gx), free(gw), free(r);
    dfree(dtok), dfree(dwte), dfree(dout), dfree(dgo), dfree(dx), dfree(dw), dfree(drstd), dfree(dgx), dfree(dgw), dfree(dpos), dfree(dr);
}
END_TEST

START_TEST(test_linear)
{
    const int64_t N = 33, IN = 70, OUT = 45;
    float *x = rnd(N * IN, 1), *w = rnd(OUT * IN, 1), *b = rnd(OUT, 1), *y = malloc(N * OUT * 4);
    float *dx = upf(x, N * IN), *dw = upf(w, OUT * IN), *db = upf(b, OUT), *dy = upf(y, N * OUT);
    C->linear_forward(cpu, y, x, w, b, N, IN, OUT);
    OKG(G->linear_forward(gpu, dy, dx, dw, db, N, IN, OUT));
    cmp("linear_forward (bias)", dy, y, N * OUT, 1e-5);
    C->linear_forward(cpu, y, x, w, NULL, N, IN, OUT);
    OKG(G->linear_forward(gpu, dy, dx, dw, NULL, N, IN, OUT));
    cmp("linear_forward", dy, y, N * OUT, 1e-5);
    float *g = rnd(N * OUT, 1), *gx = rnd(N * IN, 1), *gw = rnd(OUT * IN, 1), *gb = rnd(OUT, 1);
    float *dg = upf(g, N * OUT), *dgx = upf(gx, N * IN), *dgw = upf(gw, OUT * IN), *dgb = upf(gb, OUT);
    C->linear_backward(cpu, gx, gw, gb, g, w, g, x, g, N, IN, OUT);
    OKG(G->linear_backward(gpu, dgx, dgw, dgb, dg, dw, dg, dx, dg, N, IN, OUT));
    cmp("linear_backward dx", dgx, gx, N * IN, 1e-5);
    cmp("linear_backward dw", dgw, gw, OUT * IN, 1e-5);
    cmp("linear_backward db", dgb, gb, OUT, 1e-6);
    C->linear_backward(cpu, NULL, gw, NULL, g, w, g, x, g, N, IN, OUT);
    OKG(G->linear_backward(gpu, NULL, dgw, NULL, dg, dw, dg, dx, dg, N, IN, OUT));
    cmp("linear_backward dw only", dgw, gw, OUT * IN, 1e-5);
    free(x), free(w), free(b), free(y), free(g), free(gx), free(gw), free(gb);
    dfree(dx), dfree(dw), dfree(db), dfree(dy), dfree(dg), dfree(dgx), dfree(dgw), dfree(dgb);
}
END_TEST

/* max |a - b| / max |b| over host buffers */
static double host_gap(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]);
        if (!(e <= num)) num = e;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / (den > 0 ? den : 1);
}

/* Training attention fwd + bwd on one shape, with and without sequence lengths. FP32 numerics:
 * head dims 16/32/64/128 take the tiled kernels, others the per-row ones; within 1e-5 of the CPU.
 * BF16 numerics: head dims that are multiples of 8 take the tensor-core path; the GPU must sit
 * far closer to the CPU's BF16 result than the CPU's BF16 result is to its FP32 one (the BF16
 * roundings happen at the same places; only FP32 summation order differs). */
static void attention_case(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, const int32_t *len, fp4rl_att_numerics nm)
{
    const int64_t nq = B * T * Hq * D, nk = B * T * Hkv * D;
    float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *out = malloc(nq * 4), *lse = malloc(B * Hq * T * 4);
    float *out32 = malloc(nq * 4), *lse32 = malloc(B * Hq * T * 4);
    float *dq = upf(q, nq), *dk = upf(k, nk), *dv = upf(v, nk), *dout = upf(q, nq), *dlse = upf(lse, B * Hq * T);
    int32_t *dlen = upi(len, B);
    const int bf = nm == FP4RL_ATT_BF16;
    printf("  attention %s B %lld T %lld Hq %lld Hkv %lld D %lld\n", bf ? "BF16" : "FP32", (long long)B, (long long)T, (long long)Hq,
           (long long)Hkv, (long long)D);
    for (int with_len = 0; with_len < 2; with_len++) {
        const int32_t *L = with_len ? len : NULL, *dL = with_len ? dlen : NULL;
        C->attention_forward(cpu, out, lse, q, k, v, L, B, T, Hq, Hkv, D, nm);
        C->attention_forward(cpu, out32, lse32, q, k, v, L, B, T, Hq, Hkv, D, FP4RL_ATT_FP32);
        const double tol_f = bf ? host_gap(out, out32, nq) / 10 : 1e-5;
        if (bf) ck_assert_msg(tol_f > 1e-5, "BF16 attention is no different from FP32 (gap %g)", tol_f * 10);
        OKG(G->attention_forward(gpu, dout, dlse, dq, dk, dv, dL, B, T, Hq, Hkv, D, nm));
        cmp(with_len ? "attention_forward out (lengths)" : "attention_forward out", dout, out, nq, tol_f);
        cmp("attention_forward lse", dlse, lse, B * Hq * T, 1e-5);
        float *go = rnd(nq, 1), *gq = rnd(nq, 1), *gk = rnd(nk, 1), *gv = rnd(nk, 1);
        float *dgo = upf(go, nq), *dgq = upf(gq, nq), *dgk = upf(gk, nk), *dgv = upf(gv, nk);
        float *hq = dup_mem(gq, nq * 4), *hk = dup_mem(gk, nk * 4), *hv = dup_mem(gv, nk * 4);
        C->attention_backward(cpu, gq, gk, gv, go, q, k, v, out, lse, L, B, T, Hq, Hkv, D, nm);
        C->attention_backward(cpu, hq, hk, hv, go, q, k, v, out32, lse32, L, B, T, Hq, Hkv, D, FP4RL_ATT_FP32);
        OKG(G->attention_backward(gpu, dgq, dgk, dgv, dgo, dq, dk, dv, dout, dlse, dL, B, T, Hq, Hkv, D, nm));
        cmp("attention_backward dq", dgq, gq, nq, bf ? host_gap(gq, hq, nq) / 10 : 1e-5);
        cmp("attention_backward dk", dgk, gk, nk, bf ? host_gap(gk, hk, nk) / 10 : 1e-5);
        cmp("attention_backward dv", dgv, gv, nk, bf ? host_gap(gv, hv, nk) / 10 : 1e-5);
        free(go), free(gq), free(gk), free(gv), free(hq), free(hk), free(hv);
        dfree(dgo), dfree(dgq), dfree(dgk), dfree(dgv);
    }
    free(q), free(k), free(v), free(out), free(lse), free(out32), free(lse32);
    dfree(dq), dfree(dk), dfree(dv), dfree(dout), dfree(dlse), dfree(dlen);
}

/* attention_rows on N rows of Hkv * D keys: row n reads cache rows seg = (n % 3, n % 5 + 1, 40 + 7 n, len1 + n % 4)
 * (segment 0 shared between rows, segment 1 its own); kv_store writes the cache (FP32 exactly,
 * BF16 as the bits of nearest-even), gather_rows picks rows back. The GPU's scores sit in shared
 * memory up to 160 KB of them (max_keys = 5 + len1 + 3 + slack, a little more than needed), else the warp kernel
 * (slack: a bound far beyond the keys, as in a decode step early in a long completion). */
static void rows_case(int64_t N, int64_t Hkv, int64_t D, int64_t group, int64_t len1, int64_t slack)
{
    const int64_t max_keys = 5 + len1 + 3 + slack;
    const int64_t Hq = Hkv * group, W = Hkv * D, rows = 40 + 7 * N + len1 + 4, nq = N * Hq * D;
    float *src = rnd(rows * W, 1), *q = rnd(nq, 1), *kf = malloc((size_t)(rows * W) * 4), *vf = malloc((size_t)(rows * W) * 4);
    float *vsrc = rnd(rows * W, 1);
    int32_t *ids = malloc((size_t)rows * 4), *seg = malloc((size_t)(4 * N) * 4);
    ck_assert_msg(rows % 41 != 0, "the permutation needs 41 prime to rows");
    for (int64_t r = 0; r < rows; r++) ids[r] = (int32_t)((r * 41) % rows); /* a permutation of the rows */
    for (int64_t n = 0; n < N; n++) {
        seg[4 * n] = (int32_t)(n % 3), seg[4 * n + 1] = (int32_t)(n % 5 + 1);
        seg[4 * n + 2] = (int32_t)(40 + 7 * n), seg[4 * n + 3] = (int32_t)(len1 + n % 4);
    }
    float *dsrc = upf(src, rows * W), *dvsrc = upf(vsrc, rows * W), *dq = upf(q, nq), *dout = upf(q, nq);
    int32_t *dids = upi(ids, rows), *dseg = upi(seg, 4 * N);
    void *dk = NULL, *dv = NULL;
    ck_assert_int_eq(gpu->be->alloc(gpu, &dk, (size_t)(rows * W) * 4), FP4RL_OK);
    ck_assert_int_eq(gpu->be->alloc(gpu, &dv, (size_t)(rows * W) * 4), FP4RL_OK);
    float *out = malloc((size_t)nq * 4), *out32 = malloc((size_t)nq * 4);
    for (int kvb = 0; kvb < 2; kvb++) {
        C->kv_store(cpu, kf, kvb, src, ids, rows, W);
        C->kv_store(cpu, vf, kvb, vsrc, ids, rows, W);
        OKG(G->kv_store(gpu, dk, kvb, dsrc, dids, rows, W));
        OKG(G->kv_store(gpu, dv, kvb, dvsrc, dids, rows, W));
        void *hk = down(dk, (size_t)(rows * W) * (kvb ? 2 : 4));
        ck_assert_msg(!memcmp(hk, kf, (size_t)(rows * W) * (kvb ? 2 : 4)), "kv_store (bf16 %d) differs from the CPU", kvb);
        free(hk);
        for (int nm = kvb; nm <= FP4RL_ATT_BF16; nm++) { /* a BF16 cache serves BF16 numerics only */
            C->attention_rows(cpu, out, q, kf, vf, kvb, seg, N, max_keys, Hq, Hkv, D, (fp4rl_att_numerics)nm);
            C->attention_rows(cpu, out32, q, kf, vf, kvb, seg, N, max_keys, Hq, Hkv, D, FP4RL_ATT_FP32);
            const double tol = nm ? host_gap(out, out32, nq) / 10 : 1e-5;
            OKG(G->attention_rows(gpu, dout, dq, dk, dv, kvb, dseg, N, max_keys, Hq, Hkv, D, (fp4rl_att_numerics)nm));
            char what[64];
            snprintf(what, sizeof what, "attention_rows D%lld g%lld %s%s", (long long)D, (long long)group, nm ? "BF16" : "FP32",
                     kvb ? " bf16 cache" : "");
            cmp(what, dout, out, nq, tol > 1e-5 ? tol : 1e-5);
        }
    }
    /* gather_rows: rows of the source picked back in the permuted order */
    float *g = malloc((size_t)(rows * W) * 4), *dg = upf(src, rows * W);
    C->gather_rows(cpu, g, src, ids, rows, W);
    OKG(G->gather_rows(gpu, dg, dsrc, dids, rows, W));
    cmp("gather_rows", dg, g, rows * W, 0);
    free(src), free(vsrc), free(q), free(kf), free(vf), free(ids), free(seg), free(out), free(out32), free(g);
    dfree(dsrc), dfree(dvsrc), dfree(dq), dfree(dout), dfree(dids), dfree(dseg), dfree(dk), dfree(dv), dfree(dg);
}

/* The rollout's fused block steps: qkv_rope_store and swiglu_rows on the GPU equal the GPU's own
 * unfused steps bit for bit (rope_forward + kv_store, swiglu_forward), and the CPU's within the
 * elementwise tolerance (BF16 caches: both round the same rope values, so within one BF16 step). */
START_TEST(test_fused_block_ops)
{
    const int64_t N = 19, Hq = 14, Hkv = 2, D = 64, QD = Hq * D, KD = Hkv * D, W3 = QD + 2 * KD, R = 23, I = 1000;
    int32_t pos[19], rows[19];
    for (int i = 0; i < N; i++) pos[i] = i * 977 % 4000, rows[i] = (int32_t)((i * 5 + 3) % R);
    float *qkv = rnd(N * W3, 4), *q = malloc((size_t)(N * QD) * 4), *kf = calloc((size_t)(R * KD), 4), *vf = calloc((size_t)(R * KD), 4);
    float *dqkv = upf(qkv, N * W3), *dq = upf(q, N * QD), *dq2 = upf(q, N * QD), *dk = upf(qkv, N * KD), *dv = upf(qkv, N * KD);
    int32_t *dpos = upi(pos, N), *drows = upi(rows, N);
    void *dkc, *dvc, *dkc2, *dvc2;
    const size_t cb = (size_t)(R * KD) * 4;
    ck_assert_int_eq(gpu->be->alloc(gpu, &dkc, cb), FP4RL_OK);
    ck_assert_int_eq(gpu->be->alloc(gpu, &dvc, cb), FP4RL_OK);
    ck_assert_int_eq(gpu->be->alloc(gpu, &dkc2, cb), FP4RL_OK);
    ck_assert_int_eq(gpu->be->alloc(gpu, &dvc2, cb), FP4RL_OK);
    for (int kvb = 0; kvb < 2; kvb++) {
        const size_t used = (size_t)(R * KD) * (kvb ? 2 : 4);
        OKG(gpu->be->memset0(gpu, dkc, cb)), OKG(gpu->be->memset0(gpu, dvc, cb));
        OKG(gpu->be->memset0(gpu, dkc2, cb)), OKG(gpu->be->memset0(gpu, dvc2, cb));
        OKG(G->qkv_rope_store(gpu, dq, dkc, dvc, kvb, dqkv, NULL, NULL, dpos, drows, N, Hq, Hkv, D, 1e6f));
        for (int64_t n = 0; n < N; n++) { /* the unfused steps on the GPU */
            OKG(G->copy(gpu, dq2 + n * QD, dqkv + n * W3, QD));
            OKG(G->copy(gpu, dk + n * KD, dqkv + n * W3 + QD, KD));
            OKG(G->copy(gpu, dv + n * KD, dqkv + n * W3 + QD + KD, KD));
        }
        OKG(G->rope_forward(gpu, dq2, dq2, dpos, N, Hq, D, 1e6f));
        OKG(G->rope_forward(gpu, dk, dk, dpos, N, Hkv, D, 1e6f));
        OKG(G->kv_store(gpu, dkc2, kvb, dk, drows, N, KD));
        OKG(G->kv_store(gpu, dvc2, kvb, dv, drows, N, KD));
        void *a = down(dq, (size_t)(N * QD) * 4), *b = down(dq2, (size_t)(N * QD) * 4);
        ck_assert_msg(!memcmp(a, b, (size_t)(N * QD) * 4), "qkv_rope_store: q differs from the GPU's rope_forward");
        free(a), free(b);
        a = down(dkc, used), b = down(dkc2, used);
        ck_assert_msg(!memcmp(a, b, used), "qkv_rope_store: k cache (bf16 %d) differs from rope + kv_store", kvb);
        free(a), free(b);
        a = down(dvc, used), b = down(dvc2, used);
        ck_assert_msg(!memcmp(a, b, used), "qkv_rope_store: v cache (bf16 %d) differs from kv_store", kvb);
        free(a), free(b);
        if (!kvb) { /* against the CPU */
            C->qkv_rope_store(cpu, q, kf, vf, 0, qkv, NULL, NULL, pos, rows, N, Hq, Hkv, D, 1e6f);
            cmp("qkv_rope_store q", dq, q, N * QD, 1e-6);
            cmp("qkv_rope_store k cache", dkc, kf, R * KD, 1e-6);
            cmp("qkv_rope_store v cache", dvc, vf, R * KD, 0);
        }
    }
    float *gu = rnd(N * 2 * I, 4), *h = malloc((size_t)(N * I) * 4);
    float *dgu = upf(gu, N * 2 * I), *dh = upf(h, N * I), *dh2 = upf(h, N * I);
    for (int64_t Ir = I; Ir <= I + 1; Ir++) { /* I % 4 == 0: four elements a thread; I + 1: one */
        C->swiglu_rows(cpu, h, gu, NULL, NULL, N, Ir);
        OKG(G->swiglu_rows(gpu, dh, dgu, NULL, NULL, N, Ir));
        for (int64_t n = 0; n < N; n++) OKG(G->swiglu_forward(gpu, dh2 + n * Ir, dgu + n * 2 * Ir, dgu + n * 2 * Ir + Ir, Ir));
        cmp("swiglu_rows", dh, h, N * Ir, 1e-6);
        void *a = down(dh, (size_t)(N * Ir) * 4), *b = down(dh2, (size_t)(N * Ir) * 4);
        ck_assert_msg(!memcmp(a, b, (size_t)(N * Ir) * 4), "swiglu_rows (I = %lld) differs from the GPU's swiglu_forward", (long long)Ir);
        free(a), free(b);
        if (Ir == I) { /* the next I reads one more element a row than gu's N * 2 * I: refill */
            free(gu), dfree(dgu), dfree(dh), dfree(dh2);
            gu = rnd(N * 2 * (I + 1), 4), h = realloc(h, (size_t)(N * (I + 1)) * 4);
            dgu = upf(gu, N * 2 * (I + 1)), dh = upf(h, N * (I + 1)), dh2 = upf(h, N * (I + 1));
        }
    }
    /* residual_rmsnorm, also with the sum over one of its inputs (training writes x1 apart, the
     * rollout in place) */
    const int64_t Cn = 896;
    float *ra = rnd(N * Cn, 3), *rb = rnd(N * Cn, 3), *rw = rnd(Cn, 1), *rs = malloc((size_t)(N * Cn) * 4);
    float *ro = malloc((size_t)(N * Cn) * 4), *rr = malloc((size_t)N * 4);
    float *dra = upf(ra, N * Cn), *drb = upf(rb, N * Cn), *drw = upf(rw, Cn), *drs = upf(ra, N * Cn), *dro = upf(ra, N * Cn);
    float *drs2 = upf(ra, N * Cn), *dro2 = upf(ra, N * Cn), *drr = upf(ra, N), *drr2 = upf(ra, N);
    C->residual_rmsnorm(cpu, rs, ro, rr, ra, rb, rw, N, Cn, 1e-6f);
    OKG(G->residual_rmsnorm(gpu, drs, dro, drr, dra, drb, drw, N, Cn, 1e-6f));
    OKG(G->residual_forward(gpu, drs2, dra, drb, N * Cn));
    OKG(G->rmsnorm_forward(gpu, dro2, drr2, drs2, drw, N, Cn, 1e-6f));
    cmp("residual_rmsnorm sum", drs, rs, N * Cn, 0);
    cmp("residual_rmsnorm out", dro, ro, N * Cn, 1e-6);
    float *got[3] = {down(drs, (size_t)(N * Cn) * 4), down(dro, (size_t)(N * Cn) * 4), down(drr, (size_t)N * 4)};
    float *want[3] = {down(drs2, (size_t)(N * Cn) * 4), down(dro2, (size_t)(N * Cn) * 4), down(drr2, (size_t)N * 4)};
    ck_assert_msg(!memcmp(got[0], want[0], (size_t)(N * Cn) * 4) && !memcmp(got[1], want[1], (size_t)(N * Cn) * 4) &&
                      !memcmp(got[2], want[2], (size_t)N * 4),
                  "residual_rmsnorm differs from the GPU's residual_forward + rmsnorm_forward");
    OKG(G->residual_rmsnorm(gpu, dra, dro, drr, dra, drb, drw, N, Cn, 1e-6f)); /* in place over a */
    float *inplace = down(dro, (size_t)(N * Cn) * 4);
    ck_assert_msg(!memcmp(inplace, want[1], (size_t)(N * Cn) * 4), "residual_rmsnorm in place differs");
    for (int i = 0; i < 3; i++) free(got[i]), free(want[i]);
    free(inplace), free(ra), free(rb), free(rw), free(rs), free(ro), free(rr);
    dfree(dra), dfree(drb), dfree(drw), dfree(drs), dfree(dro), dfree(drs2), dfree(dro2), dfree(drr), dfree(drr2);
    /* every row form of the norm kernel: rows held in 8 or 16 registers a thread, and re-read
     * (C beyond 16 x 256), against the CPU */
    const int64_t Cs[3] = {2048, 3584, 4100};
    for (int i = 0; i < 3; i++) {
        const int64_t Cc = Cs[i], Nr = 5;
        float *xa = rnd(Nr * Cc, 3), *xb = rnd(Nr * Cc, 2), *xw = rnd(Cc, 1), *cs = malloc((size_t)(Nr * Cc) * 4);
        float *co = malloc((size_t)(Nr * Cc) * 4), *cr = malloc((size_t)Nr * 4);
        float *gxa = upf(xa, Nr * Cc), *gxb = upf(xb, Nr * Cc), *gxw = upf(xw, Cc), *gs = upf(xa, Nr * Cc), *go = upf(xa, Nr * Cc);
        float *gr = upf(xa, Nr);
        C->residual_rmsnorm(cpu, cs, co, cr, xa, xb, xw, Nr, Cc, 1e-6f);
        OKG(G->residual_rmsnorm(gpu, gs, go, gr, gxa, gxb, gxw, Nr, Cc, 1e-6f));
        cmp("residual_rmsnorm sum (wide)", gs, cs, Nr * Cc, 0);
        cmp("residual_rmsnorm out (wide)", go, co, Nr * Cc, 1e-6);
        cmp("residual_rmsnorm rstd (wide)", gr, cr, Nr, 1e-6);
        C->rmsnorm_forward(cpu, co, cr, xa, xw, Nr, Cc, 1e-6f);
        OKG(G->rmsnorm_forward(gpu, go, gr, gxa, gxw, Nr, Cc, 1e-6f));
        cmp("rmsnorm_forward out (wide)", go, co, Nr * Cc, 1e-6);
        free(xa), free(xb), free(xw), free(cs), free(co), free(cr);
        dfree(gxa), dfree(gxb), dfree(gxw), dfree(gs), dfree(go), dfree(gr);
    }
    /* add_halves: ResQ's two GEMM halves, with and without bias, bit for bit the CPU */
    for (int with_b = 0; with_b < 4; with_b++) { /* bias or not; OUT % 4 == 0 (four a thread) or not */
        const int64_t O = with_b < 2 ? I : I + 1;
        float *ys = rnd(2 * N * O, 5), *hb = rnd(O, 1), *y = malloc((size_t)(N * O) * 4);
        float *dys = upf(ys, 2 * N * O), *dhb = upf(hb, O), *dy = upf(ys, N * O);
        C->add_halves(cpu, y, ys, with_b % 2 ? hb : NULL, N, O);
        OKG(G->add_halves(gpu, dy, dys, with_b % 2 ? dhb : NULL, N, O));
        cmp(with_b % 2 ? "add_halves (bias)" : "add_halves", dy, y, N * O, 0);
        free(ys), free(hb), free(y);
        dfree(dys), dfree(dhb), dfree(dy);
    }
    free(qkv), free(q), free(kf), free(vf), free(gu), free(h);
    dfree(dqkv), dfree(dq), dfree(dq2), dfree(dk), dfree(dv), dfree(dpos), dfree(drows), dfree(dkc), dfree(dvc), dfree(dkc2), dfree(dvc2);
    dfree(dgu), dfree(dh), dfree(dh2);
}
END_TEST

/* device buffers a and b hold the same bytes */
static int dsame(const void *a, const void *b, size_t bytes)
{
    void *x = down(a, bytes), *y = down(b, bytes);
    const int same = !memcmp(x, y, bytes);
    free(x), free(y);
    return same;
}

/* The fused steps reading a ResQ GEMM's halves (lo, bias: core/backend/halves.h) on the GPU equal
 * the GPU's add_halves followed by the op on its output, bit for bit, and the CPU's op on the same
 * halves within the elementwise tolerance (v exactly): lo alone, lo and bias, bias alone (against
 * the op on x + bias), q/k/v rows of 1152 and 30 values, gate/up of I = 1000 (four a thread) and
 * 1001 (one), and a bias off 16-byte alignment (swiglu_rows' scalar form at I = 1000); swiglu_act on
 * the same halves equals rollout_act of swiglu_rows' output bit for bit (words and counts), BF16 and
 * every round-trip format, ResQ off / dense / 2:4. */
START_TEST(test_fused_ops_halves)
{
    const int64_t N = 19, R = 23;
    int32_t pos[19], rows[19];
    for (int i = 0; i < N; i++) pos[i] = i * 977 % 4000, rows[i] = (int32_t)((i * 5 + 3) % R);
    int32_t *dpos = upi(pos, N), *drows = upi(rows, N);
    const int64_t shapes[2][3] = {{14, 2, 64}, {3, 1, 6}}; /* Hq, Hkv, D */
    for (int s = 0; s < 2; s++)
        for (int mode = 0; mode < 3; mode++) { /* 0: lo; 1: lo and bias; 2: bias alone */
            const int64_t Hq = shapes[s][0], Hkv = shapes[s][1], D = shapes[s][2], QD = Hq * D, KD = Hkv * D, W = QD + 2 * KD;
            float *ys = rnd(2 * N * W, 4), *b = rnd(W, 1), *x = malloc((size_t)(N * W) * 4), *q = malloc((size_t)(N * QD) * 4);
            float *kf = calloc((size_t)(R * KD), 4), *vf = calloc((size_t)(R * KD), 4);
            for (int64_t i = N * W; i < 2 * N * W; i++) ys[i] *= 0.01f; /* the residual's half: small */
            for (int64_t i = 0; i < N * W; i++) x[i] = ys[i] + b[i % W];  /* mode 2's reference input */
            float *dys = upf(ys, 2 * N * W), *db = upf(b, W), *dx = upf(x, N * W), *dq = upf(q, N * QD), *dq2 = upf(q, N * QD);
            const float *lo = mode < 2 ? ys + N * W : NULL, *bias = mode ? b : NULL;
            const float *dlo = mode < 2 ? dys + N * W : NULL, *dbias = mode ? db : NULL;
            if (dlo) OKG(G->add_halves(gpu, dx, dys, dbias, N, W));
            void *dkc, *dvc, *dkc2, *dvc2;
            const size_t cb = (size_t)(R * KD) * 4;
            ck_assert_int_eq(gpu->be->alloc(gpu, &dkc, cb), FP4RL_OK);
            ck_assert_int_eq(gpu->be->alloc(gpu, &dvc, cb), FP4RL_OK);
            ck_assert_int_eq(gpu->be->alloc(gpu, &dkc2, cb), FP4RL_OK);
            ck_assert_int_eq(gpu->be->alloc(gpu, &dvc2, cb), FP4RL_OK);
            for (int kvb = 0; kvb < 2; kvb++) {
                const size_t used = (size_t)(R * KD) * (kvb ? 2 : 4);
                OKG(gpu->be->memset0(gpu, dkc, cb)), OKG(gpu->be->memset0(gpu, dvc, cb));
                OKG(gpu->be->memset0(gpu, dkc2, cb)), OKG(gpu->be->memset0(gpu, dvc2, cb));
                OKG(G->qkv_rope_store(gpu, dq, dkc, dvc, kvb, dys, dlo, dbias, dpos, drows, N, Hq, Hkv, D, 1e6f));
                OKG(G->qkv_rope_store(gpu, dq2, dkc2, dvc2, kvb, dx, NULL, NULL, dpos, drows, N, Hq, Hkv, D, 1e6f));
                ck_assert_msg(dsame(dq, dq2, (size_t)(N * QD) * 4), "qkv_rope_store halves (W %lld, mode %d): q differs", (long long)W, mode);
                ck_assert_msg(dsame(dkc, dkc2, used) && dsame(dvc, dvc2, used),
                              "qkv_rope_store halves (W %lld, mode %d, bf16 %d): cache differs from add_halves + qkv_rope_store", (long long)W,
                              mode, kvb);
                if (!kvb) { /* against the CPU on the same halves */
                    OKG(C->qkv_rope_store(cpu, q, kf, vf, 0, ys, lo, bias, pos, rows, N, Hq, Hkv, D, 1e6f));
                    cmp("qkv_rope_store halves q", dq, q, N * QD, 1e-6);
                    cmp("qkv_rope_store halves k cache", dkc, kf, R * KD, 1e-6);
                    cmp("qkv_rope_store halves v cache", dvc, vf, R * KD, 0);
                }
            }
            free(ys), free(b), free(x), free(q), free(kf), free(vf);
            dfree(dys), dfree(db), dfree(dx), dfree(dq), dfree(dq2), dfree(dkc), dfree(dvc), dfree(dkc2), dfree(dvc2);
        }
    for (int64_t I = 1000; I <= 1001; I++)
        for (int mode = 0; mode < 4; mode++) { /* 0: lo; 1: lo and bias; 2: bias alone; 3: lo and a bias off alignment */
            const int64_t W = 2 * I;
            float *ys = rnd(2 * N * W, 4), *b = rnd(W + 1, 1), *x = malloc((size_t)(N * W) * 4), *h = malloc((size_t)(N * I) * 4);
            const int64_t bo = mode == 3;
            for (int64_t i = N * W; i < 2 * N * W; i++) ys[i] *= 0.01f;
            for (int64_t i = 0; i < N * W; i++) x[i] = ys[i] + b[bo + i % W];
            float *dys = upf(ys, 2 * N * W), *db = upf(b, W + 1), *dx = upf(x, N * W), *dh = upf(h, N * I), *dh2 = upf(h, N * I);
            const float *lo = mode != 2 ? ys + N * W : NULL, *bias = mode ? b + bo : NULL;
            const float *dlo = mode != 2 ? dys + N * W : NULL, *dbias = mode ? db + bo : NULL;
            if (dlo) OKG(G->add_halves(gpu, dx, dys, dbias, N, W));
            OKG(G->swiglu_rows(gpu, dh, dys, dlo, dbias, N, I));
            OKG(G->swiglu_rows(gpu, dh2, dx, NULL, NULL, N, I));
            ck_assert_msg(dsame(dh, dh2, (size_t)(N * I) * 4), "swiglu_rows halves (I %lld, mode %d) differs from add_halves + swiglu_rows",
                          (long long)I, mode);
            OKG(C->swiglu_rows(cpu, h, ys, lo, bias, N, I));
            cmp("swiglu_rows halves", dh, h, N * I, 1e-6);
            /* swiglu_act on the halves == rollout_act of swiglu_rows' h, words and counts, every format */
            const int fmts[4] = {-1, FP4RL_QDQ_HIF4, FP4RL_QDQ_MXFP4, FP4RL_QDQ_MXFP8};
            uint16_t *dw1 = NULL, *dw2 = NULL;
            ck_assert_int_eq(gpu->be->alloc(gpu, (void **)&dw1, (size_t)(2 * N * I) * 2), FP4RL_OK);
            ck_assert_int_eq(gpu->be->alloc(gpu, (void **)&dw2, (size_t)(2 * N * I) * 2), FP4RL_OK);
            for (int f = 0; f < 4; f++)
                for (int resq = FP4RL_RESQ_OFF; resq <= FP4RL_RESQ_2_4; resq++) {
                    const int64_t words = N * I * (fmts[f] >= 0 && resq != FP4RL_RESQ_OFF ? 2 : 1);
                    unsigned long long cc[2] = {5, 6}, *dc1 = up(cc, sizeof cc), *dc2 = up(cc, sizeof cc);
                    OKG(G->swiglu_act(gpu, dw1, dc1, dys, dlo, dbias, N, I, fmts[f], f & 1, resq));
                    OKG(G->rollout_act(gpu, dw2, dc2, dh, N, I, fmts[f], f & 1, resq));
                    unsigned long long *c1 = down(dc1, sizeof cc), *c2 = down(dc2, sizeof cc);
                    ck_assert_msg(dsame(dw1, dw2, (size_t)words * 2) && c1[0] == c2[0] && c1[1] == c2[1],
                                  "swiglu_act (I %lld, mode %d, fmt %d, resq %d) differs from swiglu_rows + rollout_act", (long long)I, mode,
                                  fmts[f], resq);
                    free(c1), free(c2), dfree(dc1), dfree(dc2);
                }
            dfree(dw1), dfree(dw2);
            free(ys), free(b), free(x), free(h);
            dfree(dys), dfree(db), dfree(dx), dfree(dh), dfree(dh2);
        }
    dfree(dpos), dfree(drows);
}
END_TEST

START_TEST(test_attention)
{
    const int64_t B = 2, Hq = 4, Hkv = 2, D = 16;
    const int32_t len[2] = {9, 5}, len2[2] = {100, 37}, len3[2] = {40, 33}, len4[1] = {70};
    const int32_t len5[3] = {384, 200, 1};
    for (int nm = FP4RL_ATT_FP32; nm <= FP4RL_ATT_BF16; nm++) {
        attention_case(B, 9, Hq, Hkv, D, len, (fp4rl_att_numerics)nm);
        attention_case(2, 100, 8, 2, 64, len2, (fp4rl_att_numerics)nm); /* several tiles, a padded one, groups of 4 */
        attention_case(2, 40, 2, 2, 128, len3, (fp4rl_att_numerics)nm);
        attention_case(1, 70, 4, 1, 32, len4, (fp4rl_att_numerics)nm);
        attention_case(1, 70, 6, 3, 24, len4, (fp4rl_att_numerics)nm); /* FP32: the per-row kernels */
        attention_case(1, 30, 4, 2, 12, len4, (fp4rl_att_numerics)nm); /* BF16: the per-row kernels */
    }
    attention_case(3, 384, 12, 2, 128, len5, FP4RL_ATT_BF16); /* Qwen2.5-1.5B's heads at an RL length */
    /* the rollout's attention against a cache: every head dim path (contiguous lanes at 32 / 64 /
     * 128, strided otherwise), GQA groups of 7 and of 12 (two blocks of heads), FP32 and BF16
     * caches, keys in two segments */
    rows_case(5, 2, 64, 7, 11, 0);  /* Qwen2.5-0.5B's heads */
    rows_case(4, 1, 128, 12, 40, 0); /* more heads than a block */
    rows_case(3, 2, 24, 2, 9, 0);
    rows_case(3, 2, 32, 1, 300, 0);
    rows_case(2, 2, 16, 3, 2, 0);
    rows_case(6, 2, 128, 6, 600, 0);  /* Qwen2.5-1.5B's heads at a decode cache length */
    rows_case(5, 2, 128, 8, 130, 500); /* 3B's heads, cache far longer than the keys */
    rows_case(2, 1, 64, 4, 5200, 0); /* FP32 cache: scores beyond shared memory, the warp kernel; BF16: the split path */
}
END_TEST

/* attention_rows on the GPU's split-keys path (BF16 cache, head dims 64 and 128) at a Qwen2.5
 * head shape: 37 rows of 1 .. max_keys keys (chunk edges 63/64/65/128/129 among them; the
 * prompt part only, the own part only, both) against the CPU; then the determinism the rollout's
 * graphs need: a row's bits are the same alone (a batch of 1), in the batch of 37 and in the
 * batch reversed (memcmp). */
static void split_case(int64_t Hq, int64_t Hkv, int64_t D, int64_t max_keys)
{
    const int64_t N = 37, W = Hkv * D, rows = max_keys + N * max_keys, nq = N * Hq * D, RQ = Hq * D;
    const int64_t fixed[] = {1, 2, 63, 64, 65, 127, 128, 129, max_keys - 1, max_keys};
    float *src = rnd(rows * W, 1), *vsrc = rnd(rows * W, 1), *q = rnd(nq, 3);
    uint16_t *kb = malloc((size_t)(rows * W) * 2), *vb = malloc((size_t)(rows * W) * 2);
    int32_t *ids = malloc((size_t)rows * 4), *seg = malloc((size_t)(4 * N) * 4), *rseg = malloc((size_t)(4 * N) * 4);
    for (int64_t r = 0; r < rows; r++) ids[r] = (int32_t)r;
    C->kv_store(cpu, kb, 1, src, ids, rows, W); /* the BF16 cache: nearest-even bits */
    C->kv_store(cpu, vb, 1, vsrc, ids, rows, W);
    for (int64_t n = 0; n < N; n++) {
        int64_t nk = n < 10 ? fixed[n] : 1 + (n * 97) % max_keys;
        if (nk > max_keys) nk = max_keys;
        if (nk < 1) nk = 1;
        const int64_t mode = n % 3, l0 = mode == 0 ? nk : mode == 1 ? 0 : nk / 2; /* prompt only, own only, both */
        seg[4 * n] = (int32_t)((n % 4) * 3 < max_keys - l0 ? (n % 4) * 3 : 0), seg[4 * n + 1] = (int32_t)l0;
        seg[4 * n + 2] = (int32_t)(max_keys + n * max_keys), seg[4 * n + 3] = (int32_t)(nk - l0);
    }
    float *rq = malloc((size_t)nq * 4);
    for (int64_t n = 0; n < N; n++) { /* the batch reversed */
        memcpy(rq + n * RQ, q + (N - 1 - n) * RQ, (size_t)RQ * 4);
        memcpy(rseg + 4 * n, seg + 4 * (N - 1 - n), 16);
    }
    void *dk = up(kb, (size_t)(rows * W) * 2), *dv = up(vb, (size_t)(rows * W) * 2);
    float *dq = upf(q, nq), *drq = upf(rq, nq), *dout = upf(q, nq), *drout = upf(q, nq), *d1 = upf(q, RQ);
    int32_t *dseg = upi(seg, 4 * N), *drseg = upi(rseg, 4 * N);
    float *out = malloc((size_t)nq * 4), *out32 = malloc((size_t)nq * 4);
    C->attention_rows(cpu, out, q, kb, vb, 1, seg, N, max_keys, Hq, Hkv, D, FP4RL_ATT_BF16);
    C->attention_rows(cpu, out32, q, kb, vb, 1, seg, N, max_keys, Hq, Hkv, D, FP4RL_ATT_FP32);
    const double tol = host_gap(out, out32, nq) / 10;
    OKG(G->attention_rows(gpu, dout, dq, dk, dv, 1, dseg, N, max_keys, Hq, Hkv, D, FP4RL_ATT_BF16));
    char what[80];
    snprintf(what, sizeof what, "attention_rows split %lld/%lld/%lld keys<=%lld", (long long)Hq, (long long)Hkv, (long long)D,
             (long long)max_keys);
    cmp(what, dout, out, nq, tol > 1e-5 ? tol : 1e-5);
    OKG(G->attention_rows(gpu, drout, drq, dk, dv, 1, drseg, N, max_keys, Hq, Hkv, D, FP4RL_ATT_BF16));
    float *g = down(dout, (size_t)nq * 4), *gr = down(drout, (size_t)nq * 4);
    for (int64_t n = 0; n < N; n++) {
        ck_assert_msg(!memcmp(g + n * RQ, gr + (N - 1 - n) * RQ, (size_t)RQ * 4), "%s: row %lld differs in the reversed batch", what,
                      (long long)n);
        int32_t *s1 = upi(seg + 4 * n, 4);
        ck_assert_int_eq(gpu->be->upload(gpu, d1, q + n * RQ, (size_t)RQ * 4), FP4RL_OK);
        float *o1 = NULL;
        OKG(G->attention_rows(gpu, dout, d1, dk, dv, 1, s1, 1, max_keys, Hq, Hkv, D, FP4RL_ATT_BF16));
        o1 = down(dout, (size_t)RQ * 4);
        ck_assert_msg(!memcmp(g + n * RQ, o1, (size_t)RQ * 4), "%s: row %lld (%d keys) differs alone and in a batch of %lld", what,
                      (long long)n, seg[4 * n + 1] + seg[4 * n + 3], (long long)N);
        free(o1);
        dfree(s1);
    }
    free(src), free(vsrc), free(q), free(rq), free(kb), free(vb), free(ids), free(seg), free(rseg), free(out), free(out32), free(g),
        free(gr);
    dfree(dk), dfree(dv), dfree(dq), dfree(drq), dfree(dout), dfree(drout), dfree(d1), dfree(dseg), dfree(drseg);
}
START_TEST(test_attention_rows_split)
{
    split_case(14, 2, 64, 300);  /* Qwen2.5-0.5B */
    split_case(12, 2, 128, 300); /* 1.5B */
    split_case(16, 2, 128, 640); /* 3B at the bench's max_keys */
    split_case(28, 4, 128, 300); /* 7B */
    split_case(16, 2, 128, 1500); /* more chunks than blocks along them (blocks stride over chunks) */
}
END_TEST

START_TEST(test_losses)
{
    const int64_t N = 7, V = 300;
    int32_t tgt[7] = {3, 299, -100, 0, 150, 300, 42};
    float mask[7] = {1, 0.5f, 1, 0, 2, 1, 1};
    float *x = rnd(N * V, 6), *lp = malloc(N * 4), *ent = malloc(N * 4), *lse = malloc(N * 4);
    float *dx = upf(x, N * V), *dlp = upf(x, N), *dent = upf(x, N), *dlse = upf(x, N), *dmask = upf(mask, N);
    int32_t *dt = upi(tgt, N);
    C->logprobs_forward(cpu, lp, ent, lse, x, tgt, N, V);
    OKG(G->logprobs_forward(gpu, dlp, dent, dlse, dx, dt, N, V));
    cmp("logprobs_forward logp", dlp, lp, N, 1e-5);
    cmp("logprobs_forward entropy", dent, ent, N, 1e-5);
    cmp("logprobs_forward lse", dlse, lse, N, 1e-5);
    float *up_lp = rnd(N, 1), *up_h = rnd(N, 1), *gx = rnd(N * V, 0.01f);
    float *dup_lp = upf(up_lp, N), *dup_h = upf(up_h, N), *dgx = upf(gx, N * V);
    C->logprobs_backward(cpu, gx, up_lp, up_h, x, tgt, lse, ent, N, V);
    OKG(G->logprobs_backward(gpu, dgx, dup_lp, dup_h, dx, dt, dlse, dent, N, V));
    cmp("logprobs_backward", dgx, gx, N * V, 1e-5);
    C->logprobs_backward(cpu, gx, up_lp, NULL, x, tgt, lse, NULL, N, V);
    OKG(G->logprobs_backward(gpu, dgx, dup_lp, NULL, dx, dt, dlse, NULL, N, V));
    cmp("logprobs_backward (no entropy)", dgx, gx, N * V, 1e-5);
    for (int masked = 0; masked < 2; masked++) {
        float loss = 0, dloss = 0.7f, *dl = upf(&loss, 1), *ddl = upf(&dloss, 1);
        C->cross_entropy_forward(cpu, &loss, lse, x, tgt, masked ? mask : NULL, N, V);
        OKG(G->cross_entropy_forward(gpu, dl, dlse, dx, dt, masked ? dmask : NULL, N, V));
        cmp("cross_entropy_forward loss", dl, &loss, 1, 1e-5);
        cmp("cross_entropy_forward lse", dlse, lse, N, 1e-5);
        C->cross_entropy_backward(cpu, gx, &dloss, x, tgt, masked ? mask : NULL, lse, N, V);
        OKG(G->cross_entropy_backward(gpu, dgx, ddl, dx, dt, masked ? dmask : NULL, dlse, N, V));
        cmp("cross_entropy_backward", dgx, gx, N * V, 1e-5);
        dfree(dl), dfree(ddl);
    }
    free(x), free(lp), free(ent), free(lse), free(up_lp), free(up_h), free(gx);
    dfree(dx), dfree(dlp), dfree(dent), dfree(dlse), dfree(dmask), dfree(dt), dfree(dup_lp), dfree(dup_h), dfree(dgx);
}
END_TEST

START_TEST(test_rollout_ops)
{
    /* ResQ masks: the same elements kept */
    const int64_t N = 40, K = 130;
    for (int pat = FP4RL_RESQ_DENSE; pat <= FP4RL_RESQ_BLOCK_50; pat++) {
        float *r = rnd(N * K, 1);
        r[5] = r[6] = r[7] = 0.5f; /* a tie */
        float *dr = upf(r, N * K);
        OKG(C->resq_mask(cpu, r, N, K, pat));
        OKG(G->resq_mask(gpu, dr, N, K, pat));
        char what[64];
        snprintf(what, sizeof what, "resq_mask pattern %d", pat);
        cmp(what, dr, r, N * K, 0);
        free(r);
        dfree(dr);
    }
    /* sampling: the same tokens */
    const int64_t B = 6, V = 1000;
    float *l = rnd(B * V, 4);
    for (int64_t v = 0; v < 40; v++) l[V + v * 7] = 3.5f; /* ties at the k-th value */
    float *dl = upf(l, B * V);
    const int64_t ks[3] = {0, 20, 1};
    for (int i = 0; i < 3; i++)
        for (uint64_t off = 0; off < 4; off++) {
            int32_t tc[6] = {0}, *tg, *dtok = upi(tc, B);
            float lc[6] = {0}, *dlp = upf(lc, B);
            OKG(C->sample_rows(cpu, tc, lc, l, B, V, 0.7f, ks[i], 1.0, 1234, off, 0, NULL, NULL));
            OKG(G->sample_rows(gpu, dtok, dlp, dl, B, V, 0.7f, ks[i], 1.0, 1234, off, 0, NULL, NULL));
            tg = down(dtok, sizeof tc);
            for (int b = 0; b < B; b++) ck_assert_msg(tg[b] == tc[b], "sample top_k %lld row %d: gpu %d cpu %d", (long long)ks[i], b, tg[b], tc[b]);
            cmp("sample logp", dlp, lc, B, 1e-5);
            free(tg);
            dfree(dtok), dfree(dlp);
        }
    free(l);
    dfree(dl);
}
END_TEST

/* Top-p: the same tokens and log-probs (under the nucleus) from sample_rows, small and at
 * Qwen2.5's vocabulary (151,936), with ties at the threshold and top-k; the trainer's nucleus
 * log-probs and their backward within row-reduction tolerance, targets inside and outside the
 * nucleus and ignored ones. */
START_TEST(test_top_p_ops)
{
    const int64_t Vs[2] = {1000, 151936};
    for (int iv = 0; iv < 2; iv++) {
        const int64_t B = 6, V = Vs[iv];
        float *l = rnd(B * V, 4);
        for (int64_t v = 0; v < 40; v++) l[V + v * 7] = 3.5f;        /* row 1: ties */
        for (int64_t v = 0; v < V; v++) l[2 * V + v] = 0.25f;         /* row 2: all equal: ties at the threshold */
        for (int64_t v = 0; v < 5; v++) l[3 * V + 11 * v + 3] = 9.0f; /* row 3: a peaked row */
        float *dl = upf(l, B * V);
        const double ps[4] = {0.05, 0.5, 0.9, 0.999};
        const int64_t ks[3] = {0, 20, 1};
        for (int ip = 0; ip < 4; ip++)
            for (int i = 0; i < 3; i++)
                for (uint64_t off = 0; off < 3; off++) {
                    int32_t tc[6] = {0}, *tg, *dtok = upi(tc, B);
                    float lc[6] = {0}, *dlp = upf(lc, B);
                    OKG(C->sample_rows(cpu, tc, lc, l, B, V, 0.7f, ks[i], ps[ip], 1234, off, 0, NULL, NULL));
                    OKG(G->sample_rows(gpu, dtok, dlp, dl, B, V, 0.7f, ks[i], ps[ip], 1234, off, 0, NULL, NULL));
                    tg = down(dtok, sizeof tc);
                    for (int b = 0; b < B; b++)
                        ck_assert_msg(tg[b] == tc[b], "sample V %lld top_p %g top_k %lld row %d: gpu %d cpu %d", (long long)V, ps[ip],
                                      (long long)ks[i], b, tg[b], tc[b]);
                    cmp("sample top-p logp", dlp, lc, B, 1e-5);
                    free(tg);
                    dfree(dtok), dfree(dlp);
                }
        /* the trainer's side on z = l (already scaled): targets the CPU sampled, one far outside
         * the nucleus, one ignored */
        int32_t tgt[6];
        float lpc[6];
        OKG(C->sample_rows(cpu, tgt, lpc, l, B, V, 1.0f, 0, 0.5, 99, 0, 0, NULL, NULL));
        for (int64_t v = 0, lo = 0; v < V; v++)
            if (l[5 * V + v] < l[5 * V + lo]) tgt[5] = (int32_t)(lo = v); /* row 5: its least likely token */
        tgt[4] = -1;
        int32_t *dt = upi(tgt, B);
        for (int i = 0; i < 3; i++) {
            float lp[6], lse[6], *dlp2 = upf(lp, B), *dlse = upf(lse, B);
            OKG(C->nucleus_logprobs_forward(cpu, lp, lse, l, tgt, B, V, ks[i], 0.5));
            OKG(G->nucleus_logprobs_forward(gpu, dlp2, dlse, dl, dt, B, V, ks[i], 0.5));
            cmp("nucleus_logprobs_forward logp", dlp2, lp, B, 1e-5);
            cmp("nucleus_logprobs_forward lse", dlse, lse, B, 1e-5);
            if (ks[i] == 0) /* the sampler's own log-probs for the tokens it drew */
                for (int b = 0; b < 4; b++) ck_assert_msg(lp[b] == lpc[b], "row %d: trainer %.9g sampler %.9g", b, lp[b], lpc[b]);
            float up_[6] = {0.3f, -1.1f, 0.7f, 2.0f, 1.0f, -0.4f}, *dup_ = upf(up_, B);
            float *gx = calloc((size_t)(B * V), sizeof(float)), *dgx = upf(gx, B * V);
            OKG(C->nucleus_logprobs_backward(cpu, gx, up_, l, tgt, lse, B, V, ks[i], 0.5));
            OKG(G->nucleus_logprobs_backward(gpu, dgx, dup_, dl, dt, dlse, B, V, ks[i], 0.5));
            cmp("nucleus_logprobs_backward", dgx, gx, B * V, 1e-5);
            free(gx);
            dfree(dlp2), dfree(dlse), dfree(dup_), dfree(dgx);
        }
        free(l);
        dfree(dl), dfree(dt);
    }
}
END_TEST

/* rollout_act's four-elements-a-thread kernel (and qdq_bf16's nearest path, which shares it) over
 * its every path, bit for bit against the CPU: HiF4 / MXFP4 / MXFP8, truncation-free off and on,
 * ResQ off / dense / 2:4, counts on and off, K a multiple of the block and ragged (K % 4 != 0
 * too), N = 1 and N > 128, 16-byte loads and the scalar path (misaligned x or out). Magnitudes
 * vary by a power of two every 4 elements, so HiF4's e8 / e16 bits take both values; some blocks
 * are zero, some hold NaN or inf, some underflow. */
START_TEST(test_rollout_act_paths)
{
    const int64_t shapes[][3] = {/* N, K, misaligned */
                                 {1, 2048, 0}, {1, 200, 0}, {130, 2048, 0}, {130, 200, 0}, {4, 11008, 0}, {3, 197, 0},
                                 {2, 30, 0}, {5, 96, 0}, {7, 2048, 1}, {3, 197, 1}};
    const int fmts[3] = {FP4RL_QDQ_HIF4, FP4RL_QDQ_MXFP4, FP4RL_QDQ_MXFP8};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t N = shapes[si][0], K = shapes[si][1], mis = shapes[si][2], n = N * K;
        float *x = rnd(n, 1);
        for (int64_t i = 0; i < n; i += 4) {
            const float sc = ldexpf(1.0f, (int)((frand() + 1.0f) * 4.5f) - 4); /* 2^-4 .. 2^4 per quad */
            for (int64_t j = i; j < i + 4 && j < n; j++) x[j] *= sc;
        }
        for (int64_t i = 0; i < n; i += 9) x[i] *= 1e-3f;   /* underflows */
        for (int64_t i = 5; i < n; i += 31) x[i] *= 50.0f;  /* outliers */
        for (int64_t i = 64; i < n && i < 128; i++) x[i] = 0.0f; /* a zero block */
        if (n > 300) x[n / 2] = NAN, x[n / 3] = INFINITY, x[n / 5 + 1] = -INFINITY;
        float *dx0 = NULL;
        ck_assert_int_eq(gpu->be->alloc(gpu, (void **)&dx0, (size_t)(n + 4) * 4), FP4RL_OK);
        float *dx = dx0 + mis; /* misaligned: 4 bytes off */
        ck_assert_int_eq(gpu->be->upload(gpu, dx, x, (size_t)n * 4), FP4RL_OK);
        void *dout0 = NULL;
        ck_assert_int_eq(gpu->be->alloc(gpu, &dout0, (size_t)(2 * n + 4) * 2), FP4RL_OK);
        uint16_t *dout = (uint16_t *)dout0 + mis; /* misaligned: 2 bytes off */
        for (int f = 0; f < 3; f++)
            for (int tf = 0; tf < 2; tf++)
                for (int resq = FP4RL_RESQ_OFF; resq <= FP4RL_RESQ_2_4; resq++)
                    for (int cnt = 0; cnt < 2; cnt++) {
                        const int64_t words = n * (resq != FP4RL_RESQ_OFF ? 2 : 1);
                        uint16_t *oc = malloc((size_t)words * 2), *og;
                        unsigned long long cc[2] = {3, 4}, *cg = NULL, *dc = cnt ? up(cc, sizeof cc) : NULL;
                        OKG(C->rollout_act(cpu, oc, cnt ? cc : NULL, x, N, K, fmts[f], tf, resq));
                        OKG(G->rollout_act(gpu, dout, dc, dx, N, K, fmts[f], tf, resq));
                        og = down(dout, (size_t)words * 2);
                        int64_t diff = 0, first = -1;
                        for (int64_t i = 0; i < words; i++)
                            if (og[i] != oc[i]) diff++, first = first < 0 ? i : first;
                        if (cnt) cg = down(dc, sizeof cc);
                        if (diff || (cnt && (cg[0] != cc[0] || cg[1] != cc[1])))
                            printf("  rollout_act N %lld K %lld mis %lld fmt %d tf %d resq %d counts %d: %lld of %lld words differ "
                                   "(first %lld: gpu %04x cpu %04x)\n",
                                   (long long)N, (long long)K, (long long)mis, fmts[f], tf, resq, cnt, (long long)diff,
                                   (long long)words, (long long)first, first >= 0 ? og[first] : 0, first >= 0 ? oc[first] : 0);
                        ck_assert_int_eq(diff, 0);
                        if (cnt) ck_assert(cg[0] == cc[0] && cg[1] == cc[1]);
                        free(oc), free(og), free(cg);
                        if (dc) dfree(dc);
                    }
        /* qdq_bf16 along the last dim, nearest: the same kernel without ResQ or counts */
        for (int f = 0; f < 3; f++)
            for (int tf = 0; tf < 2; tf++) {
                uint16_t *oc = malloc((size_t)n * 2), *og;
                OKG(C->qdq_bf16(cpu, oc, x, N, K, fmts[f], tf, 0, 0, 0, 0));
                OKG(G->qdq_bf16(gpu, dout, dx, N, K, fmts[f], tf, 0, 0, 0, 0));
                og = down(dout, (size_t)n * 2);
                int64_t diff = 0;
                for (int64_t i = 0; i < n; i++) diff += og[i] != oc[i];
                if (diff) printf("  qdq_bf16 N %lld K %lld mis %lld fmt %d tf %d: %lld words differ\n", (long long)N, (long long)K,
                                 (long long)mis, fmts[f], tf, (long long)diff);
                ck_assert_int_eq(diff, 0);
                free(oc), free(og);
            }
        printf("  rollout_act / qdq_bf16 N %lld K %lld misaligned %lld: bit for bit\n", (long long)N, (long long)K, (long long)mis);
        free(x);
        dfree(dx0), dfree(dout0);
    }
}
END_TEST

/* The rollout's fused path: rollout_act bit for bit (BF16 words and counts), the BF16 linear
 * within GEMM tolerance, pack_bf16 bit for bit. */
START_TEST(test_rollout_fused_ops)
{
    const int64_t N = 37, K = 200, OUT = 48;
    float *x = rnd(N * K, 2);
    for (int64_t i = 0; i < N * K; i += 9) x[i] *= 1e-3f; /* underflows */
    for (int64_t i = 0; i < N * K; i += 31) x[i] *= 50.0f; /* outliers */
    x[N * K / 2] = NAN;
    float *dx = upf(x, N * K);
    const int fmts[4] = {-1, FP4RL_QDQ_MXFP4, FP4RL_QDQ_HIF4, FP4RL_QDQ_MXFP8};
    for (int f = 0; f < 4; f++)
        for (int resq = FP4RL_RESQ_OFF; resq <= FP4RL_RESQ_2_4; resq++) {
            const int64_t ld = K * ((fmts[f] >= 0 && resq != FP4RL_RESQ_OFF) ? 2 : 1); /* ResQ: 2N rows of K */
            uint16_t *oc = malloc((size_t)(N * ld) * 2), *og;
            unsigned long long cc[2] = {0, 0}, *cg, *dc;
            void *dout = NULL;
            ck_assert_int_eq(gpu->be->alloc(gpu, &dout, (size_t)(N * ld) * 2), FP4RL_OK);
            dc = up(cc, sizeof cc);
            OKG(C->rollout_act(cpu, oc, cc, x, N, K, fmts[f], f == 1, resq));
            OKG(G->rollout_act(gpu, dout, dc, dx, N, K, fmts[f], f == 1, resq));
            og = down(dout, (size_t)(N * ld) * 2);
            cg = down(dc, sizeof cc);
            int64_t diff = 0;
            for (int64_t i = 0; i < N * ld; i++) diff += og[i] != oc[i];
            printf("  rollout_act fmt %d resq %d: %lld of %lld words differ, counts cpu %llu/%llu gpu %llu/%llu\n", fmts[f], resq,
                   (long long)diff, (long long)(N * ld), cc[0], cc[1], cg[0], cg[1]);
            ck_assert_int_eq(diff, 0);
            ck_assert(cg[0] == cc[0] && cg[1] == cc[1]);
            free(oc), free(og), free(cg);
            dfree(dout), dfree(dc);
        }
    /* qdq_bf16: the training operands' round trip, along the last dim and down the columns,
     * nearest and stochastic, bit for bit (rows 37: blocks down the columns end ragged) */
    for (int f = 1; f < 4; f++)
        for (int along = 0; along < 2; along++)
            for (int sr = 0; sr < 2; sr++) {
                uint16_t *oc = malloc((size_t)(N * K) * 2), *og;
                void *dq = NULL;
                ck_assert_int_eq(gpu->be->alloc(gpu, &dq, (size_t)(N * K) * 2), FP4RL_OK);
                OKG(C->qdq_bf16(cpu, oc, x, N, K, fmts[f], f == 1, along, sr, 77, 5));
                OKG(G->qdq_bf16(gpu, dq, dx, N, K, fmts[f], f == 1, along, sr, 77, 5));
                og = down(dq, (size_t)(N * K) * 2);
                int64_t diff = 0;
                for (int64_t i = 0; i < N * K; i++) diff += og[i] != oc[i];
                printf("  qdq_bf16 fmt %d along_rows %d stochastic %d: %lld of %lld words differ\n", fmts[f], along, sr, (long long)diff,
                       (long long)(N * K));
                ck_assert_int_eq(diff, 0);
                free(oc), free(og);
                dfree(dq);
            }
    /* pack + BF16 linear */
    float *w = rnd(OUT * K, 0.3f), *b = rnd(OUT, 1), *yc = malloc((size_t)(N * OUT) * 4);
    uint16_t *xb = malloc((size_t)(N * K) * 2), *wb = malloc((size_t)(OUT * K) * 2), *g;
    float *xf = rnd(N * K, 1), *dxf = upf(xf, N * K), *dw = upf(w, OUT * K), *db = upf(b, OUT), *dy = NULL;
    void *dxb = NULL, *dwb = NULL;
    ck_assert_int_eq(gpu->be->alloc(gpu, &dxb, (size_t)(N * K) * 2), FP4RL_OK);
    ck_assert_int_eq(gpu->be->alloc(gpu, &dwb, (size_t)(OUT * K) * 2), FP4RL_OK);
    ck_assert_int_eq(gpu->be->alloc(gpu, (void **)&dy, (size_t)(N * OUT) * 4), FP4RL_OK);
    OKG(C->pack_bf16(cpu, xb, K, xf, N, K));
    OKG(C->pack_bf16(cpu, wb, K, w, OUT, K));
    OKG(G->pack_bf16(gpu, dxb, K, dxf, N, K));
    OKG(G->pack_bf16(gpu, dwb, K, dw, OUT, K));
    g = down(dwb, (size_t)(OUT * K) * 2);
    ck_assert_mem_eq(g, wb, (size_t)(OUT * K) * 2);
    free(g);
    for (int with_b = 0; with_b < 2; with_b++) {
        OKG(C->linear_forward_bf16(cpu, yc, xb, wb, with_b ? b : NULL, N, K, OUT));
        OKG(G->linear_forward_bf16(gpu, dy, dxb, dwb, with_b ? db : NULL, N, K, OUT));
        cmp(with_b ? "linear_forward_bf16 (bias)" : "linear_forward_bf16", dy, yc, N * OUT, 1e-5);
    }
    /* the backward on BF16 operands: dx += dy w, dw += dy^T x, db += colsum dy (dy: yc, packed) */
    {
        uint16_t *gb = malloc((size_t)(N * OUT) * 2);
        float *gx = rnd(N * K, 1), *gw = rnd(OUT * K, 1), *gbias = rnd(OUT, 1);
        float *dgx = upf(gx, N * K), *dgw = upf(gw, OUT * K), *dgbias = upf(gbias, OUT), *dyc = upf(yc, N * OUT);
        void *dgb = NULL;
        ck_assert_int_eq(gpu->be->alloc(gpu, &dgb, (size_t)(N * OUT) * 2), FP4RL_OK);
        OKG(C->pack_bf16(cpu, gb, OUT, yc, N, OUT));
        OKG(G->pack_bf16(gpu, dgb, OUT, dyc, N, OUT));
        OKG(C->linear_backward_bf16(cpu, gx, gw, gbias, gb, wb, gb, xb, yc, N, K, OUT));
        OKG(G->linear_backward_bf16(gpu, dgx, dgw, dgbias, dgb, dwb, dgb, dxb, dyc, N, K, OUT));
        cmp("linear_backward_bf16 dx", dgx, gx, N * K, 1e-5);
        cmp("linear_backward_bf16 dw", dgw, gw, OUT * K, 1e-5);
        cmp("linear_backward_bf16 db", dgbias, gbias, OUT, 1e-5);
        free(gb), free(gx), free(gw), free(gbias);
        dfree(dgx), dfree(dgw), dfree(dgbias), dfree(dyc), dfree(dgb);
    }
    free(x), free(w), free(b), free(yc), free(xb), free(wb), free(xf);
    dfree(dx), dfree(dxf), dfree(dw), dfree(db), dfree(dy), dfree(dxb), dfree(dwb);
}
END_TEST

/* The W4A4 decode pair: rollout_act8's bytes, scales (the layout's padding included) and counts
 * memcmp-equal to the CPU's (HiF4 / MXFP4, ResQ off / dense / 2:4, ragged K, a NaN); then
 * linear_forward_w4 on weights quantized on each context (1D and tiles) bit for bit the CPU's with
 * FP4RL_D8_SLICES=1 (one K slice: the reference's promotion order), and with the kernel's own split
 * within GEMM tolerance, for 1, 37, 74 (ResQ's 2N) and 256 rows, with and without bias. */
static fp4rl_tensor *quant_on(fp4rl_context *c, const float *w, int64_t R, int64_t K, fp4rl_dtype fmt, int tile)
{
    fp4rl_quant_policy *p;
    OKG(fp4rl_quant_policy_create(&p));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, fmt));
    OKG(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile));
    const int64_t shape[2] = {R, K};
    fp4rl_tensor *t, *q;
    OKG(fp4rl_tensor_from_host(&t, c, FP4RL_DTYPE_F32, 2, shape, w));
    OKG(fp4rl_quantize(&q, c, t, fmt, p, FP4RL_ROLE_WEIGHT));
    fp4rl_tensor_destroy(t);
    fp4rl_quant_policy_destroy(p);
    return q;
}

START_TEST(test_w4_ops)
{
    const int fmts[2] = {FP4RL_QDQ_HIF4, FP4RL_QDQ_MXFP4};
    for (int kk = 0; kk < 2; kk++) {
        const int64_t N = 37, K = kk ? 200 : 256;
        float *x = rnd(N * K, 2);
        for (int64_t i = 0; i < N * K; i += 9) x[i] *= 1e-3f;
        x[N * K / 2] = NAN;
        float *dx = upf(x, N * K);
        for (int f = 0; f < 2; f++)
            for (int resq = FP4RL_RESQ_OFF; resq <= FP4RL_RESQ_2_4; resq++) {
                const int64_t U = fp4rl_qdq_block_size(fmts[f]), Kp = (K + U - 1) / U * U, rows = (resq ? 2 : 1) * N;
                const size_t eb = (size_t)(rows * Kp), sb = (size_t)((Kp / U) * FP4RL_FP8_SCALE_LD(rows)) * 4;
                uint8_t *ec = malloc(eb);
                float *sc = malloc(sb);
                unsigned long long cc[2] = {0, 0}, *cg, *dc = up(cc, sizeof cc);
                void *de = NULL, *ds = NULL;
                ck_assert_int_eq(gpu->be->alloc(gpu, &de, eb), FP4RL_OK);
                ck_assert_int_eq(gpu->be->alloc(gpu, &ds, sb), FP4RL_OK);
                OKG(C->rollout_act8(cpu, ec, sc, cc, x, N, K, fmts[f], f, resq));
                OKG(G->rollout_act8(gpu, de, ds, dc, dx, N, K, fmts[f], f, resq));
                uint8_t *eg = down(de, eb);
                float *sg = down(ds, sb);
                cg = down(dc, sizeof cc);
                printf("  rollout_act8 fmt %d resq %d K %lld: bytes %s, scales %s, counts cpu %llu/%llu gpu %llu/%llu\n", fmts[f], resq,
                       (long long)K, memcmp(eg, ec, eb) ? "DIFFER" : "equal", memcmp(sg, sc, sb) ? "DIFFER" : "equal", cc[0], cc[1], cg[0], cg[1]);
                ck_assert(!memcmp(eg, ec, eb) && !memcmp(sg, sc, sb));
                ck_assert(cg[0] == cc[0] && cg[1] == cc[1]);
                free(ec), free(sc), free(eg), free(sg), free(cg);
                dfree(de), dfree(ds), dfree(dc);
            }
        free(x);
        dfree(dx);
    }
    const int64_t K = 256, OUT = 200, MS[4] = {1, 37, 74, 256};
    const fp4rl_dtype wf[4] = {FP4RL_DTYPE_HIF4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_MXFP4};
    const int tiles[4] = {0, 64, 0, 32};
    float *w = rnd(OUT * K, 0.3f), *b = rnd(OUT, 1), *db = upf(b, OUT);
    for (int c = 0; c < 4; c++) {
        fp4rl_tensor *qc = quant_on(cpu, w, OUT, K, wf[c], tiles[c]), *qg = quant_on(gpu, w, OUT, K, wf[c], tiles[c]);
        for (int mi = 0; mi < 4; mi++) {
            const int64_t M = MS[mi], U = wf[c] == FP4RL_DTYPE_HIF4 ? 64 : 32;
            const size_t eb = (size_t)(M * K), sb = (size_t)((K / U) * FP4RL_FP8_SCALE_LD(M)) * 4;
            float *x = rnd(M * K, 1), *dx = upf(x, M * K), *sa = malloc(sb), *y = malloc((size_t)(M * OUT) * 4), *dy = NULL;
            uint8_t *a8 = malloc(eb);
            void *da8 = NULL, *dsa = NULL;
            ck_assert_int_eq(gpu->be->alloc(gpu, &da8, eb), FP4RL_OK);
            ck_assert_int_eq(gpu->be->alloc(gpu, &dsa, sb), FP4RL_OK);
            ck_assert_int_eq(gpu->be->alloc(gpu, (void **)&dy, (size_t)(M * OUT) * 4), FP4RL_OK);
            OKG(C->rollout_act8(cpu, a8, sa, NULL, x, M, K, (int)wf[c], 0, FP4RL_RESQ_OFF));
            OKG(G->rollout_act8(gpu, da8, dsa, NULL, dx, M, K, (int)wf[c], 0, FP4RL_RESQ_OFF));
            for (int with_b = 0; with_b < 2; with_b++) {
                OKG(C->linear_forward_w4(cpu, y, a8, sa, qc, with_b ? b : NULL, M, K, OUT));
                setenv("FP4RL_D8_SLICES", "1", 1);
                OKG(G->linear_forward_w4(gpu, dy, da8, dsa, qg, with_b ? db : NULL, M, K, OUT));
                float *g = down(dy, (size_t)(M * OUT) * 4);
                ck_assert_msg(!memcmp(g, y, (size_t)(M * OUT) * 4), "linear_forward_w4 (%s tile %d, M %lld, bias %d): one slice differs from the CPU",
                              fp4rl_dtype_name(wf[c]), tiles[c], (long long)M, with_b);
                free(g);
                unsetenv("FP4RL_D8_SLICES");
                OKG(G->linear_forward_w4(gpu, dy, da8, dsa, qg, with_b ? db : NULL, M, K, OUT));
                cmp("linear_forward_w4 (auto split)", dy, y, M * OUT, 1e-5);
            }
            free(x), free(sa), free(y), free(a8);
            dfree(dx), dfree(dy), dfree(da8), dfree(dsa);
        }
        printf("  linear_forward_w4 %s tile %d: one slice bit for bit the CPU\n", fp4rl_dtype_name(wf[c]), tiles[c]);
        fp4rl_tensor_destroy(qc);
        fp4rl_tensor_destroy(qg);
    }
    free(w), free(b);
    dfree(db);
}
END_TEST

/* linear_forward_w4b (the BF16 operand times the packed weight): the GPU's against the CPU's (the
 * BF16 GEMM over the dequantized weight) within summation-order noise, M across the kernel's
 * activation tiles and split-K, with and without bias; linear_w4b_ok agrees on both contexts (the
 * GPU refuses where it has no sm_90a kernel, and then so does the op); linear_w4b_pack leaves the
 * CPU's weight as it is and re-lays the GPU's out, its results bit for bit the unpacked one's. */
START_TEST(test_w4b_ops)
{
    const int64_t K = 256, OUT = 200, MS[4] = {1, 37, 100, 300};
    const fp4rl_dtype wf[4] = {FP4RL_DTYPE_HIF4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_MXFP4};
    const int tiles[4] = {0, 64, 0, 32};
    float *w = rnd(OUT * K, 0.3f), *b = rnd(OUT, 1), *db = upf(b, OUT);
    for (int c = 0; c < 4; c++) {
        fp4rl_tensor *qc = quant_on(cpu, w, OUT, K, wf[c], tiles[c]), *qg = quant_on(gpu, w, OUT, K, wf[c], tiles[c]);
        OKG(C->linear_w4b_ok(cpu, qc));
        if (G->linear_w4b_ok(gpu, qg) != FP4RL_OK) { /* no sm_90a kernel here: the op refuses too */
            printf("  linear_forward_w4b: not on this GPU / build (%s)\n", fp4rl_last_error());
            ck_assert_int_eq(G->linear_forward_w4b(gpu, db, NULL, qg, NULL, 1, K, OUT), FP4RL_ERR_UNSUPPORTED);
            fp4rl_tensor_destroy(qc);
            fp4rl_tensor_destroy(qg);
            break;
        }
        /* and the pack op: the CPU leaves its weight as it is, the GPU re-lays HiF4 out (same results) */
        OKG(C->linear_w4b_pack(cpu, qc));
        ck_assert_int_eq(qc->layout, 0);
        fp4rl_tensor *qp = quant_on(gpu, w, OUT, K, wf[c], tiles[c]);
        OKG(G->linear_w4b_pack(gpu, qp));
        ck_assert_int_eq(qp->layout, FP4RL_LAYOUT_W4B); /* MXFP4 too: these scales are small */
        for (int mi = 0; mi < 4; mi++) {
            const int64_t M = MS[mi];
            float *x = rnd(M * K, 1), *y = malloc((size_t)(M * OUT) * 4), *dy = NULL, *dyp = NULL;
            uint16_t *xb = malloc((size_t)(M * K) * 2);
            OKG(C->pack_bf16(cpu, xb, K, x, M, K));
            void *dxb = NULL;
            ck_assert_int_eq(gpu->be->alloc(gpu, &dxb, (size_t)(M * K) * 2), FP4RL_OK);
            ck_assert_int_eq(gpu->be->upload(gpu, dxb, xb, (size_t)(M * K) * 2), FP4RL_OK);
            ck_assert_int_eq(gpu->be->alloc(gpu, (void **)&dy, (size_t)(M * OUT) * 4), FP4RL_OK);
            ck_assert_int_eq(gpu->be->alloc(gpu, (void **)&dyp, (size_t)(M * OUT) * 4), FP4RL_OK);
            for (int with_b = 0; with_b < 2; with_b++) {
                OKG(C->linear_forward_w4b(cpu, y, xb, qc, with_b ? b : NULL, M, K, OUT));
                OKG(G->linear_forward_w4b(gpu, dy, dxb, qg, with_b ? db : NULL, M, K, OUT));
                cmp("linear_forward_w4b", dy, y, M * OUT, 1e-5);
                OKG(G->linear_forward_w4b(gpu, dyp, dxb, qp, with_b ? db : NULL, M, K, OUT));
                float *h1 = malloc((size_t)(M * OUT) * 4), *h2 = malloc((size_t)(M * OUT) * 4);
                OKG(gpu->be->download(gpu, h1, dy, (size_t)(M * OUT) * 4));
                OKG(gpu->be->download(gpu, h2, dyp, (size_t)(M * OUT) * 4));
                ck_assert_msg(!memcmp(h1, h2, (size_t)(M * OUT) * 4), "linear_forward_w4b: the packed weight's results differ");
                free(h1), free(h2);
            }
            free(x), free(y), free(xb);
            dfree(dxb), dfree(dy), dfree(dyp);
        }
        fp4rl_tensor_destroy(qp);
        printf("  linear_forward_w4b %s tile %d: the CPU's within 1e-5\n", fp4rl_dtype_name(wf[c]), tiles[c]);
        fp4rl_tensor_destroy(qc);
        fp4rl_tensor_destroy(qg);
    }
    free(w), free(b);
    dfree(db);
}
END_TEST

/* ---- end to end ---- */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}
static fp4rl_model *load(fp4rl_context *c, const fp4rl_quant_policy *p)
{
    char path[1024];
    FP4RL_FIXTURE(path, "qwen2/gqa/config.json");
    char *cfg = read_text(path);
    fp4rl_model *m;
    ck_assert_msg(fp4rl_model_create(&m, c, cfg, p, 1) == FP4RL_OK, "%s", fp4rl_last_error());
    free(cfg);
    FP4RL_FIXTURE(path, "qwen2/gqa/model.safetensors");
    ck_assert_msg(fp4rl_model_load(m, path) == FP4RL_OK, "%s", fp4rl_last_error());
    return m;
}
START_TEST(test_model_fp32)
{
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_FP32), FP4RL_OK);
    { /* random init before the load: the GPU generates the CPU's bits (the host-thread path) */
        char path[1024];
        FP4RL_FIXTURE(path, "qwen2/gqa/config.json");
        char *cfg = read_text(path);
        fp4rl_model *rc, *rg;
        OKG(fp4rl_model_create(&rc, cpu, cfg, p, 99));
        OKG(fp4rl_model_create(&rg, gpu, cfg, p, 99));
        float *w = down(rg->w, (size_t)rg->total * sizeof(float));
        int64_t diff = 0;
        for (int64_t i = 0; i < rc->total; i++) diff += memcmp(&w[i], &rc->w[i], 4) != 0;
        printf("  random init GPU vs CPU: %lld of %lld words differ\n", (long long)diff, (long long)rc->total);
        ck_assert_int_eq(diff, 0);
        free(w);
        free(cfg);
        fp4rl_model_destroy(rc);
        fp4rl_model_destroy(rg);
    }
    fp4rl_model *mc = load(cpu, p), *mg = load(gpu, p);
    int64_t V;
    fp4rl_model_get_info(mc, FP4RL_MI_VOCAB_SIZE, &V);
    const int64_t B = 2, T = 12;
    int32_t tok[24], len[2] = {12, 7};
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 37 + 11) % V);
    const size_t lb = (size_t)(B * T * V) * sizeof(float);
    float *lc = malloc(lb), *lg = malloc(lb);
    OKG(fp4rl_model_logits(mc, tok, len, B, T, lc, lb));
    OKG(fp4rl_model_logits(mg, tok, len, B, T, lg, lb));
    double e = fp4rl_l2rel(lg, lc, B * T * V);
    printf("  model logits (gqa, FP32)            rel err %.3g (tol 1e-05)\n", e);
    ck_assert_msg(e <= 1e-5, "logits rel err %.3g", e);
    float mask[24];
    for (int i = 0; i < 24; i++) mask[i] = (float)(1 + i % 3);
    double loss_c, loss_g;
    OKG(fp4rl_model_compute_gradients(mc, tok, len, mask, B, T, &loss_c));
    OKG(fp4rl_model_compute_gradients(mg, tok, len, mask, B, T, &loss_g));
    printf("  model loss cpu %.9g gpu %.9g\n", loss_c, loss_g);
    ck_assert_msg(fabs(loss_c - loss_g) <= 1e-5 * fabs(loss_c), "loss %.9g vs %.9g", loss_g, loss_c);
    float *gg = down(mg->g, (size_t)mg->total * sizeof(float));
    e = fp4rl_l2rel(gg, mc->g, mc->total);
    printf("  model gradients (gqa, FP32)         rel err %.3g (tol 1e-04)\n", e);
    ck_assert_msg(e <= 1e-4, "gradients rel err %.3g", e);
    /* and one supervised step: the weights after AdamW */
    double gn_c, gn_g;
    OKG(fp4rl_model_train_step(mc, tok, len, mask, B, T, &loss_c, &gn_c));
    OKG(fp4rl_model_train_step(mg, tok, len, mask, B, T, &loss_g, &gn_g));
    float *wg = down(mg->w, (size_t)mg->total * sizeof(float));
    e = fp4rl_l2rel(wg, mc->w, mc->total);
    printf("  train_step weights                  rel err %.3g (grad norm cpu %.6g gpu %.6g)\n", e, gn_c, gn_g);
    ck_assert_msg(e <= 1e-4, "weights after a step: rel err %.3g", e);
    free(lc), free(lg), free(gg), free(wg);
    fp4rl_model_destroy(mc);
    fp4rl_model_destroy(mg);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

static int sevens(void *user, size_t pi, const int32_t *p, size_t pl, const int32_t *c, size_t cl, double *r)
{
    (void)user, (void)pi, (void)p, (void)pl;
    double k = 0;
    for (size_t i = 0; i < cl; i++) k += c[i] == 7;
    *r = k;
    return 0;
}

START_TEST(test_rl_step)
{
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_apply_preset(p, FP4RL_PRESET_HIF4_RL), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_FP4), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_W4A4), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_RESQ, FP4RL_RESQ_2_4), FP4RL_OK);
    fp4rl_model *m = load(gpu, p);
    fp4rl_rl_session *s;
    OKG(fp4rl_rl_session_create(&s, gpu, m, p));
    OKG(fp4rl_rl_session_set(s, FP4RL_RL_GROUP_SIZE, 4));
    OKG(fp4rl_rl_session_set(s, FP4RL_RL_MAX_NEW_TOKENS, 6));
    OKG(fp4rl_rl_session_set(s, FP4RL_RL_TOP_K, 20));
    const int32_t prompts[7] = {1, 5, 9, 2, 4, 6, 8};
    const size_t off[3] = {0, 3, 7};
    OKG(fp4rl_rl_session_step(s, prompts, off, 2, sevens, NULL));
    int64_t steps;
    fp4rl_rl_session_step_count(s, &steps);
    ck_assert_int_eq(steps, 1);
    size_t nm = 0;
    for (size_t i = 0; fp4rl_rl_session_metric_name(i); i++, nm++) {
        double v;
        OKG(fp4rl_rl_session_metric(s, fp4rl_rl_session_metric_name(i), &v));
        printf("  rl metric %-32s %.6g\n", fp4rl_rl_session_metric_name(i), v);
        ck_assert_msg(isfinite(v), "metric %s = %g", fp4rl_rl_session_metric_name(i), v);
    }
    ck_assert_uint_gt(nm, 0);
    float *w = down(m->w, (size_t)m->total * sizeof(float));
    for (int64_t i = 0; i < m->total; i++) ck_assert_msg(isfinite(w[i]), "weight %lld not finite", (long long)i);
    free(w);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

int main(void)
{
    if (fp4rl_gpu_or_skip("test_ops_parity")) return 77;
    Suite *su = suite_create("ops_parity");
    TCase *tc = tcase_create("ops");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_rollout_act_paths);
    tcase_add_test(tc, test_elementwise);
    tcase_add_test(tc, test_embedding_norm_rope);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_attention_rows_split);
    tcase_add_test(tc, test_fused_block_ops);
    tcase_add_test(tc, test_losses);
    tcase_add_test(tc, test_rollout_ops);
    tcase_add_test(tc, test_top_p_ops);
    tcase_add_test(tc, test_rollout_fused_ops);
    tcase_add_test(tc, test_w4_ops);
    tcase_add_test(tc, test_w4b_ops);
    tcase_add_test(tc, test_fused_ops_halves);
    tcase_add_test(tc, test_model_fp32);
    tcase_add_test(tc, test_rl_step);
    suite_add_tcase(su, tc);
    const int rc = fp4rl_check_run_nofork(su);
    return rc;
}
