/*
 * test_top_p.c - top-p (nucleus) sampling, FP4RL_RL_TOP_P: the sampled distribution is the
 * nucleus of the logits (an independent sort-based reference, frequencies against a chi-square
 * bound with fixed seeds), no token outside it ever appears, ties at the threshold by lower id,
 * top_p = 1 draws today's tokens bit for bit, the draws do not depend on the batch; the trainer's
 * truncated log-probs equal the sampler's and their gradient matches finite differences; with
 * BF16/BF16 numerics the session's rollout and trainer log-probs agree under top_p < 1; bad
 * values are refused.
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "addition_task.h"
#include "backend/ops.h"
#include "format/formats.h"
#include "rl/rollout.h"
#include "rl/session.h"

static const fp4rl_ops *ops = &fp4rl_cpu_ops;

/* ---- an independent reference: sort by (z desc, id asc), cumulative mass in double ---- */
typedef struct ref_item { double z; int id; } ref_item;
static int by_z_desc(const void *pa, const void *pb)
{
    const ref_item *a = pa, *b = pb;
    if (a->z != b->z) return a->z > b->z ? -1 : 1;
    return a->id - b->id;
}

/* in[v] = 1 when v is in the nucleus; p[v] = its renormalised probability (0 outside) */
static int ref_nucleus(const float *l, int V, float temperature, int top_k, double top_p, int *in, double *p)
{
    ref_item *it = malloc((size_t)V * sizeof *it);
    double mx = -INFINITY;
    for (int v = 0; v < V; v++) {
        it[v] = (ref_item){(double)(l[v] / temperature), v};
        mx = fmax(mx, it[v].z);
    }
    qsort(it, (size_t)V, sizeof *it, by_z_desc);
    int C = V;
    if (top_k > 0 && top_k < V) /* ties at the k-th value are kept */
        for (C = top_k; C < V && it[C].z == it[top_k - 1].z; C++) {}
    double kept = 0, acc = 0, mass = 0;
    for (int i = 0; i < C; i++) kept += exp(it[i].z - mx);
    int n = 0;
    memset(in, 0, (size_t)V * sizeof *in);
    for (; n < C; n++) {
        acc += exp(it[n].z - mx);
        in[it[n].id] = 1;
        if (acc >= top_p * kept) {
            n++;
            break;
        }
    }
    mass = acc;
    for (int v = 0; v < V; v++) p[v] = in[v] ? exp((double)(l[v] / temperature) - mx) / mass : 0.0;
    free(it);
    return n;
}

/* Draws R * steps tokens from one row of logits repeated R times (rows 0 .. R-1, offsets 0 ..
 * steps-1): counts[v] and, for every draw, |logp - log p_ref| <= 1e-6. */
static void draw_counts(const float *row, int V, float temperature, int top_k, double top_p, int R, int steps,
                        const double *p, long *counts)
{
    float *l = malloc((size_t)R * (size_t)V * sizeof(float));
    int32_t *tok = malloc((size_t)R * sizeof(int32_t));
    float *lp = malloc((size_t)R * sizeof(float));
    for (int r = 0; r < R; r++) memcpy(l + (size_t)r * (size_t)V, row, (size_t)V * sizeof(float));
    memset(counts, 0, (size_t)V * sizeof *counts);
    for (int s = 0; s < steps; s++) {
        ck_assert_int_eq(ops->sample_rows(NULL, tok, lp, l, R, V, temperature, top_k, top_p, 777, (uint64_t)s, 0, NULL, NULL), FP4RL_OK);
        for (int r = 0; r < R; r++) {
            ck_assert_msg(tok[r] >= 0 && tok[r] < V, "token %d", tok[r]);
            counts[tok[r]]++;
            if (p[tok[r]] > 0)
                ck_assert_msg(fabs((double)lp[r] - log(p[tok[r]])) <= 1e-6, "logp %.9g, nucleus log-prob %.9g", lp[r], log(p[tok[r]]));
        }
    }
    free(l), free(tok), free(lp);
}

/* Pearson's chi-square of the counts against the reference over the nucleus, with df = |S| - 1;
 * tokens outside the nucleus must never appear. */
static double chi_square(const long *counts, const double *p, int V, long total, int *df)
{
    double x2 = 0;
    *df = -1;
    for (int v = 0; v < V; v++) {
        if (p[v] == 0) {
            ck_assert_msg(counts[v] == 0, "token %d outside the nucleus drawn %ld times", v, counts[v]);
            continue;
        }
        const double e = p[v] * (double)total;
        x2 += ((double)counts[v] - e) * ((double)counts[v] - e) / e;
        ++*df;
    }
    return x2;
}

START_TEST(test_nucleus_distribution)
{
    /* 24 tokens: a spread of logits with a repeated value, sampled at several top-p / top-k */
    enum { V = 24 };
    float row[V];
    for (int v = 0; v < V; v++) row[v] = 2.5f * sinf(1.7f * (float)v + 0.3f);
    row[5] = row[9] = row[17] = 1.25f; /* a tie */
    const double ps[4] = {0.3, 0.6, 0.85, 0.97};
    const int ks[2] = {0, 7};
    for (int ip = 0; ip < 4; ip++)
        for (int ik = 0; ik < 2; ik++) {
            int in[V];
            double p[V];
            long counts[V];
            const int n = ref_nucleus(row, V, 0.8f, ks[ik], ps[ip], in, p);
            const int R = 400, steps = 100;
            draw_counts(row, V, 0.8f, ks[ik], ps[ip], R, steps, p, counts);
            int df;
            const double x2 = chi_square(counts, p, V, (long)R * steps, &df);
            ck_assert_int_eq(df, n - 1);
            /* a fixed seed: deterministic; the bound is the chi-square's 1e-6 tail (Wilson-Hilferty) */
            const double z = 4.75, k = df > 0 ? df : 1;
            const double bound = k * pow(1 - 2 / (9 * k) + z * sqrt(2 / (9 * k)), 3);
            printf("top_p %.2f top_k %d: nucleus of %d tokens, chi2 %.2f (df %d, bound %.1f)\n", ps[ip], ks[ik], n, x2, df, bound);
            ck_assert_msg(df == 0 || x2 < bound, "chi2 %.2f >= %.1f (df %d)", x2, bound, df);
            /* and a nucleus strictly smaller than the candidates for the small top-p */
            if (ps[ip] < 0.9) ck_assert_int_lt(n, ks[ik] ? ks[ik] : V);
        }
}
END_TEST

START_TEST(test_nucleus_ties_and_edges)
{
    /* all equal: 10 tokens of 0.1; top_p 0.35 keeps the first four by id */
    enum { V = 10 };
    float row[V];
    for (int v = 0; v < V; v++) row[v] = 0.5f;
    int in[V];
    double p[V];
    long counts[V];
    ck_assert_int_eq(ref_nucleus(row, V, 1.0f, 0, 0.35, in, p), 4);
    draw_counts(row, V, 1.0f, 0, 0.35, 500, 20, p, counts);
    for (int v = 0; v < V; v++) {
        if (v < 4) ck_assert_msg(counts[v] > 2000, "token %d drawn %ld times", v, counts[v]); /* 2500 expected */
        else ck_assert_msg(counts[v] == 0, "token %d drawn", v);
    }
    /* a tiny top-p keeps the argmax only (log-prob 0); the lowest id of a tied maximum */
    float r2[V] = {0.1f, 3.0f, -1.0f, 3.0f, 2.0f, 0, 0, 0, 0, 0};
    int32_t tok[4];
    float lp[4], l4[4 * V];
    for (int r = 0; r < 4; r++) memcpy(l4 + r * V, r2, sizeof r2);
    for (uint64_t s = 0; s < 50; s++) {
        ck_assert_int_eq(ops->sample_rows(NULL, tok, lp, l4, 4, V, 1.0f, 0, 1e-9, 3, s, 0, NULL, NULL), FP4RL_OK);
        for (int r = 0; r < 4; r++) {
            ck_assert_int_eq(tok[r], 1);
            ck_assert_float_eq(lp[r], 0.0f);
        }
    }
}
END_TEST

/* top_p = 1 (and the unset 0) is today's sampler: the documented inverse CDF over the top-k with
 * the log-prob of the full softmax, recomputed here, bit for bit. */
START_TEST(test_top_p_one_is_today)
{
    enum { B = 16, V = 50 };
    float l[B * V];
    uint64_t x = 12345;
    for (int i = 0; i < B * V; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        l[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 6.0 - 3.0);
    }
    const int ks[3] = {0, 5, 1};
    for (int ik = 0; ik < 3; ik++)
        for (uint64_t off = 0; off < 6; off++) {
            int32_t t1[B], t0[B];
            float lp1[B], lp0[B];
            ck_assert_int_eq(ops->sample_rows(NULL, t1, lp1, l, B, V, 0.7f, ks[ik], 1.0, 42, off, 3, NULL, NULL), FP4RL_OK);
            ck_assert_int_eq(ops->sample_rows(NULL, t0, lp0, l, B, V, 0.7f, ks[ik], 0.0, 42, off, 3, NULL, NULL), FP4RL_OK);
            for (int b = 0; b < B; b++) {
                const float *r = l + b * V;
                float mx = -INFINITY, sorted[V], th = -INFINITY;
                for (int v = 0; v < V; v++) mx = fmaxf(mx, r[v] / 0.7f), sorted[v] = r[v];
                if (ks[ik]) { /* the k-th largest */
                    for (int i = 0; i < ks[ik]; i++)
                        for (int j = i + 1; j < V; j++)
                            if (sorted[j] > sorted[i]) { float t = sorted[i]; sorted[i] = sorted[j]; sorted[j] = t; }
                    th = sorted[ks[ik] - 1];
                }
                double all = 0, kept = 0;
                for (int v = 0; v < V; v++) {
                    const double e = exp((double)(r[v] / 0.7f) - mx);
                    all += e;
                    if (r[v] >= th) kept += e;
                }
                const double u = (double)fp4rl_sr_uniform(42, off, 3 + (uint64_t)b) * kept;
                double acc = 0;
                int pick = -1, last = 0;
                for (int v = 0; v < V && pick < 0; v++) {
                    if (r[v] < th) continue;
                    last = v;
                    acc += exp((double)(r[v] / 0.7f) - mx);
                    if (u < acc) pick = v;
                }
                if (pick < 0) pick = last;
                const float want = (float)((double)(r[pick] / 0.7f) - mx - log(all));
                ck_assert_int_eq(t1[b], pick);
                ck_assert_int_eq(t0[b], pick);
                ck_assert_msg(memcmp(&lp1[b], &want, 4) == 0 && memcmp(&lp0[b], &want, 4) == 0, "row %d: logp %.9g / %.9g, want %.9g",
                              b, lp1[b], lp0[b], want);
            }
        }
}
END_TEST

/* Batch composition never changes a token: rows [5, 12) sampled alone (row0 = 5) draw what they
 * draw inside the whole batch. */
START_TEST(test_top_p_batch_independent)
{
    enum { B = 16, V = 64 };
    float l[B * V];
    for (int i = 0; i < B * V; i++) l[i] = 3.0f * sinf(0.37f * (float)i * (float)(i % 7 + 1));
    int32_t all[B], part[7];
    float lpa[B], lpp[7];
    for (uint64_t off = 0; off < 8; off++) {
        ck_assert_int_eq(ops->sample_rows(NULL, all, lpa, l, B, V, 1.3f, 9, 0.7, 5, off, 0, NULL, NULL), FP4RL_OK);
        ck_assert_int_eq(ops->sample_rows(NULL, part, lpp, l + 5 * V, 7, V, 1.3f, 9, 0.7, 5, off, 5, NULL, NULL), FP4RL_OK);
        for (int b = 0; b < 7; b++) {
            ck_assert_int_eq(part[b], all[5 + b]);
            ck_assert_msg(memcmp(&lpp[b], &lpa[5 + b], 4) == 0, "row %d", b);
        }
    }
}
END_TEST

/* The trainer's op: logp equals the sampler's for tokens it drew; a token outside the nucleus is
 * renormalised over S plus itself; the gradient (S fixed) matches central finite differences of
 * the forward, and differs from the full softmax's. */
START_TEST(test_nucleus_logprobs_grad)
{
    enum { N = 4, V = 12 };
    float z[N * V];
    for (int i = 0; i < N * V; i++) z[i] = 1.5f * sinf(0.9f * (float)i + 0.2f * (float)(i / V));
    const double top_p = 0.7;
    int32_t tgt[N], drawn[N];
    float lps[N];
    ck_assert_int_eq(ops->sample_rows(NULL, drawn, lps, z, N, V, 1.0f, 0, top_p, 11, 0, 0, NULL, NULL), FP4RL_OK);
    memcpy(tgt, drawn, sizeof tgt);
    /* row 3: its least likely token, outside the nucleus */
    int in[V];
    double p[V];
    int lo = 0;
    for (int v = 0; v < V; v++)
        if (z[3 * V + v] < z[3 * V + lo]) lo = v;
    ref_nucleus(z + 3 * V, V, 1.0f, 0, top_p, in, p);
    ck_assert_int_eq(in[lo], 0);
    tgt[3] = lo;
    float lp[N], lse[N];
    ck_assert_int_eq(ops->nucleus_logprobs_forward(NULL, lp, lse, z, tgt, N, V, 0, top_p), FP4RL_OK);
    for (int n = 0; n < 3; n++) ck_assert_msg(memcmp(&lp[n], &lps[n], 4) == 0, "row %d: trainer %.9g sampler %.9g", n, lp[n], lps[n]);
    { /* the outside token: log(p_t / (mass_S + p_t)) */
        double mx = -INFINITY, mass = 0, et = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, z[3 * V + v]);
        for (int v = 0; v < V; v++)
            if (in[v] || v == lo) mass += exp((double)z[3 * V + v] - mx);
        et = exp((double)z[3 * V + lo] - mx);
        ck_assert_msg(fabs(lp[3] - log(et / mass)) < 1e-6, "outside token: %.9g, want %.9g", lp[3], log(et / mass));
    }
    /* the gradient of L = sum_n c_n logp_n */
    const float c[N] = {0.7f, -1.3f, 0.4f, 1.1f};
    float g[N * V];
    memset(g, 0, sizeof g);
    ck_assert_int_eq(ops->nucleus_logprobs_backward(NULL, g, c, z, tgt, lse, N, V, 0, top_p), FP4RL_OK);
    double worst = 0, full_diff = 0;
    for (int i = 0; i < N * V; i++) {
        const float h = 1e-2f;
        float zp[N * V], zm[N * V], lpp[N], lpm[N], ls[N];
        memcpy(zp, z, sizeof z), memcpy(zm, z, sizeof z);
        zp[i] += h, zm[i] -= h;
        ck_assert_int_eq(ops->nucleus_logprobs_forward(NULL, lpp, ls, zp, tgt, N, V, 0, top_p), FP4RL_OK);
        ck_assert_int_eq(ops->nucleus_logprobs_forward(NULL, lpm, ls, zm, tgt, N, V, 0, top_p), FP4RL_OK);
        double fd = 0;
        for (int n = 0; n < N; n++) fd += (double)c[n] * ((double)lpp[n] - lpm[n]) / (double)(zp[i] - zm[i]);
        worst = fmax(worst, fabs(fd - g[i]));
        /* the full softmax's gradient for comparison: c (onehot - p) */
        const int n = i / V, v = i % V;
        double mx = -INFINITY, sum = 0;
        for (int u = 0; u < V; u++) mx = fmax(mx, z[n * V + u]);
        for (int u = 0; u < V; u++) sum += exp((double)z[n * V + u] - mx);
        const double full = c[n] * ((v == tgt[n]) - exp((double)z[i] - mx) / sum);
        full_diff = fmax(full_diff, fabs(full - g[i]));
    }
    printf("nucleus log-prob gradient: max |analytic - finite difference| %.3g; against the full softmax's %.3g\n", worst,
           full_diff);
    ck_assert_msg(worst < 2e-3, "gradient vs finite differences: %.3g", worst);
    ck_assert_msg(full_diff > 0.05, "the truncated gradient should differ from the full softmax's (%.3g)", full_diff);
    /* an ignored target: logp 0 and no gradient */
    int32_t ign[N] = {-1, -1, -1, -1};
    float g2[N * V];
    memset(g2, 0, sizeof g2);
    ck_assert_int_eq(ops->nucleus_logprobs_forward(NULL, lp, lse, z, ign, N, V, 0, top_p), FP4RL_OK);
    ck_assert_int_eq(ops->nucleus_logprobs_backward(NULL, g2, c, z, ign, lse, N, V, 0, top_p), FP4RL_OK);
    for (int i = 0; i < N * V; i++) ck_assert_float_eq(g2[i], 0.0f);
    ck_assert_float_eq(lp[0], 0.0f);
}
END_TEST

/* ---- the session ---- */
static const char *TINY =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 32, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 32, \"tie_word_embeddings\": true}";

static int sevens(void *user, size_t pi, const int32_t *p, size_t pl, const int32_t *c, size_t cl, double *r)
{
    (void)user, (void)pi, (void)p, (void)pl;
    double k = 0;
    for (size_t i = 0; i < cl; i++) k += c[i] == 7;
    *r = k / 4.0;
    return 0;
}

static fp4rl_rl_session *bf16_session(fp4rl_context *ctx, fp4rl_model **m, double top_p, double kl)
{
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_BF16), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_BF16), FP4RL_OK);
    ck_assert_msg(fp4rl_model_create(m, ctx, TINY, p, 3) == FP4RL_OK, "%s", fp4rl_last_error());
    fp4rl_rl_session *s;
    ck_assert_int_eq(fp4rl_rl_session_create(&s, ctx, *m, p), FP4RL_OK);
    fp4rl_quant_policy_destroy(p);
    const int32_t stop = ADD_END;
    ck_assert_int_eq(fp4rl_rl_session_set_stop_tokens(s, &stop, 1), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_GROUP_SIZE, 4), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_MAX_NEW_TOKENS, 6), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_LR, 1e-3), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_KL_COEF, kl), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_set(s, FP4RL_RL_TOP_P, top_p), FP4RL_OK);
    return s;
}

static double metric(const fp4rl_rl_session *s, const char *name)
{
    double v;
    ck_assert_msg(fp4rl_rl_session_metric(s, name, &v) == FP4RL_OK, "%s", fp4rl_last_error());
    return v;
}

/* BF16 rollout and BF16 trainer with top_p < 1: log mu == log pi_old up to GEMM order, through
 * both trainer paths (log pi_old from a forward of its own, and from the training pass); the KL
 * to the reference at the first step is 0 (the reference is truncated the same way). With the
 * full softmax on the trainer's side the mismatch would be |log mass_S|, far above. */
START_TEST(test_bf16_mismatch_top_p)
{
    fp4rl_context *ctx;
    ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    int32_t tok[8 * 43];
    size_t off[9];
    add_rng r = {1};
    add_batch(&r, 9, 8, tok, off);
    for (int sep = 0; sep < 2; sep++) {
        fp4rl_model *m;
        fp4rl_rl_session *s = bf16_session(ctx, &m, 0.6, 0.1);
        s->separate_old_pass = sep;
        ck_assert_msg(fp4rl_rl_session_step(s, tok, off, 8, sevens, NULL) == FP4RL_OK, "%s", fp4rl_last_error());
        const double mm = metric(s, "mismatch/logp_abs_diff_max"), kl = metric(s, "kl/k3");
        printf("top_p 0.6, BF16/BF16 (separate log pi_old pass %d): mismatch max %.3g, k3 KL %.3g\n", sep, mm, kl);
        ck_assert_msg(mm < 1e-4, "BF16/BF16 mismatch max under top-p %.3g", mm);
        ck_assert_msg(fabs(kl) < 1e-6, "k3 KL to the reference at its first step %.3g", kl);
        fp4rl_rl_session_destroy(s);
        fp4rl_model_destroy(m);
    }
    /* the same rollout log-probs under top_p = 0.6 are higher than under the full softmax */
    fp4rl_model *m1, *m2;
    fp4rl_rl_session *s1 = bf16_session(ctx, &m1, 0.6, 0), *s2 = bf16_session(ctx, &m2, 1.0, 0);
    ck_assert_int_eq(fp4rl_rl_session_rollout(s1, tok, off, 8), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_rollout(s2, tok, off, 8), FP4RL_OK);
    double sum1 = 0, sum2 = 0;
    size_t n1, n2;
    ck_assert_int_eq(fp4rl_rl_session_num_completions(s1, &n1), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_num_completions(s2, &n2), FP4RL_OK);
    for (size_t i = 0; i < n1; i++) {
        int32_t t[8];
        float lp[8];
        size_t len, pi;
        ck_assert_int_eq(fp4rl_rl_session_completion(s1, i, t, lp, 8, &len, &pi), FP4RL_OK);
        for (size_t j = 0; j < len; j++) sum1 += lp[j] / (double)len;
        ck_assert_int_eq(fp4rl_rl_session_completion(s2, i, t, lp, 8, &len, &pi), FP4RL_OK);
        for (size_t j = 0; j < len; j++) sum2 += lp[j] / (double)len;
    }
    printf("mean log mu per token: top_p 0.6 %.4f, top_p 1 %.4f\n", sum1 / (double)n1, sum2 / (double)n2);
    ck_assert_msg(sum1 / (double)n1 > sum2 / (double)n2 + 0.1, "truncated log-probs %.4f vs full %.4f", sum1 / (double)n1,
                  sum2 / (double)n2);
    fp4rl_rl_session_destroy(s1), fp4rl_rl_session_destroy(s2);
    fp4rl_model_destroy(m1), fp4rl_model_destroy(m2);
    fp4rl_context_destroy(ctx);
}
END_TEST

START_TEST(test_top_p_bad_values)
{
    fp4rl_context *ctx;
    ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    fp4rl_model *m;
    fp4rl_rl_session *s = bf16_session(ctx, &m, 1.0, 0);
    double v = 0;
    ck_assert_int_eq(fp4rl_rl_session_get(s, FP4RL_RL_TOP_P, &v), FP4RL_OK);
    ck_assert(v == 1.0); /* the default */
    FP4RL_EXPECT(fp4rl_rl_session_set(s, FP4RL_RL_TOP_P, 0.9), FP4RL_OK);
    const double bad[6] = {0.0, -0.1, 1.0000001, 2.0, NAN, INFINITY};
    for (int i = 0; i < 6; i++) {
        FP4RL_EXPECT(fp4rl_rl_session_set(s, FP4RL_RL_TOP_P, bad[i]), FP4RL_ERR_INVALID_ARGUMENT);
        ck_assert_msg(strstr(fp4rl_last_error(), "top_p") && strstr(fp4rl_last_error(), "(0, 1]"), "%s", fp4rl_last_error());
        ck_assert_int_eq(fp4rl_rl_session_get(s, FP4RL_RL_TOP_P, &v), FP4RL_OK);
        ck_assert(v == 0.9); /* unchanged */
    }
    FP4RL_EXPECT(fp4rl_rl_session_set(s, FP4RL_RL_TOP_P, 1.0), FP4RL_OK);
    /* a checkpoint keeps the value */
    FP4RL_EXPECT(fp4rl_rl_session_set(s, FP4RL_RL_TOP_P, 0.75), FP4RL_OK);
    char dir[] = "/tmp/fp4rl_top_p_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/ck", dir);
    FP4RL_EXPECT(fp4rl_rl_session_save(s, path), FP4RL_OK);
    FP4RL_EXPECT(fp4rl_rl_session_set(s, FP4RL_RL_TOP_P, 1.0), FP4RL_OK);
    FP4RL_EXPECT(fp4rl_rl_session_load(s, path), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_get(s, FP4RL_RL_TOP_P, &v), FP4RL_OK);
    ck_assert(v == 0.75);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_context_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("top_p");
    TCase *tc = tcase_create("top_p");
    tcase_add_test(tc, test_nucleus_distribution);
    tcase_add_test(tc, test_nucleus_ties_and_edges);
    tcase_add_test(tc, test_top_p_one_is_today);
    tcase_add_test(tc, test_top_p_batch_independent);
    tcase_add_test(tc, test_nucleus_logprobs_grad);
    tcase_add_test(tc, test_bf16_mismatch_top_p);
    tcase_add_test(tc, test_top_p_bad_values);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
