/* ops_rollout.c - the rollout's ops on the CPU: KV-cache writes, one-query attention against the
 * cache (fp4rl_cpu_attend_row, the training attention's own row function, so a BF16 rollout and
 * the BF16 trainer see the same attention), Rollout-ResQ masks, sampling, underflow counts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/nucleus.h"
#include "format/formats.h"
#include "cpu/ops_cpu.h"
#include "format/qdq_block.h"

fp4rl_status fp4rl_cpu_kv_store(fp4rl_context *ctx, void *cache, int kv_bf16, const float *src, const int32_t *rows,
                                int64_t N, int64_t W)
{
    (void)ctx;
    for (int64_t n = 0; n < N; n++) {
        const float *s = src + n * W;
        if (kv_bf16) {
            uint16_t *d = (uint16_t *)cache + (int64_t)rows[n] * W;
            for (int64_t w = 0; w < W; w++) d[w] = fp4rl_f32_to_bf16(s[w]);
        } else {
            memcpy((float *)cache + (int64_t)rows[n] * W, s, (size_t)W * sizeof(float));
        }
    }
    return FP4RL_OK;
}

/* Key or value row r, head kh of a cache, widened to FP32 into dst [D]. */
static void cache_row(float *dst, const void *c, int kv_bf16, int64_t r, int64_t W, int64_t kh, int64_t D)
{
    if (kv_bf16) {
        const uint16_t *s = (const uint16_t *)c + r * W + kh * D;
        for (int64_t d = 0; d < D; d++) dst[d] = fp4rl_bf16_to_f32(s[d]);
    } else {
        memcpy(dst, (const float *)c + r * W + kh * D, (size_t)D * sizeof(float));
    }
}

/* Each row's keys are gathered into contiguous FP32 rows, then every query head of the kv head
 * runs fp4rl_cpu_attend_row, the training attention's own row function: the same numerics. */
fp4rl_status fp4rl_cpu_attention_rows(fp4rl_context *ctx, float *out, const float *q, const void *kc, const void *vc,
                                      int kv_bf16, const int32_t *seg, int64_t N, int64_t max_keys, int64_t Hq,
                                      int64_t Hkv, int64_t D, fp4rl_att_numerics nm)
{
    (void)ctx;
    const int64_t group = Hq / Hkv, W = Hkv * D;
    const float scale = 1.0f / sqrtf((float)D);
    int64_t most = 0;
    for (int64_t n = 0; n < N; n++)
        if ((int64_t)seg[4 * n + 1] + seg[4 * n + 3] > most) most = (int64_t)seg[4 * n + 1] + seg[4 * n + 3];
    if (most > max_keys)
        return fp4rl_fail(FP4RL_ERR_INTERNAL, "attention_rows: a row has %lld keys, more than max_keys %lld", (long long)most,
                          (long long)max_keys);
    float *kb = malloc((size_t)(most * D + 1) * sizeof(float)), *vb = malloc((size_t)(most * D + 1) * sizeof(float));
    if (!kb || !vb) {
        free(kb), free(vb);
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "attention_rows: out of memory");
    }
    for (int64_t n = 0; n < N; n++) {
        const int32_t *sg = seg + 4 * n;
        const int64_t nk = (int64_t)sg[1] + sg[3];
        for (int64_t kh = 0; kh < Hkv; kh++) {
            for (int64_t s = 0; s < nk; s++) {
                const int64_t r = s < sg[1] ? sg[0] + s : sg[2] + (s - sg[1]);
                cache_row(kb + s * D, kc, kv_bf16, r, W, kh, D);
                cache_row(vb + s * D, vc, kv_bf16, r, W, kh, D);
            }
            for (int64_t h = kh * group; h < (kh + 1) * group; h++)
                fp4rl_cpu_attend_row(out + (n * Hq + h) * D, q + (n * Hq + h) * D, kb, vb, D, nk, D, scale, nm);
        }
    }
    free(kb);
    free(vb);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_gather_rows(fp4rl_context *ctx, float *dst, const float *src, const int32_t *idx, int64_t N,
                                   int64_t W)
{
    (void)ctx;
    for (int64_t n = 0; n < N; n++) memcpy(dst + n * W, src + (int64_t)idx[n] * W, (size_t)W * sizeof(float));
    return FP4RL_OK;
}

/* ---- Rollout-ResQ masks ---- */
typedef struct ranked { double key; int64_t idx; } ranked;
/* Larger key first; ties: lower index first. */
static int by_key_desc(const void *pa, const void *pb)
{
    const ranked *a = pa, *b = pb;
    if (a->key != b->key) return a->key > b->key ? -1 : 1;
    return a->idx < b->idx ? -1 : (a->idx > b->idx);
}

static void mask_2_4(float *r, int64_t N, int64_t K)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t k0 = 0; k0 < K; k0 += 4) fp4rl_mask_2_4_group(r + n * K + k0, (int)(K - k0 < 4 ? K - k0 : 4));
}

static fp4rl_status mask_channels(float *r, int64_t N, int64_t K)
{
    ranked *c = malloc((size_t)K * sizeof *c);
    if (!c) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "resq channel-50: out of memory");
    for (int64_t k = 0; k < K; k++) {
        double s = 0;
        for (int64_t n = 0; n < N; n++) s += (double)r[n * K + k] * r[n * K + k];
        c[k] = (ranked){s, k};
    }
    qsort(c, (size_t)K, sizeof *c, by_key_desc);
    for (int64_t i = (K + 1) / 2; i < K; i++)
        for (int64_t n = 0; n < N; n++) r[n * K + c[i].idx] = 0.0f;
    free(c);
    return FP4RL_OK;
}

static fp4rl_status mask_blocks(float *r, int64_t N, int64_t K)
{
    const int64_t TR = 32, TC = 64, nr = (N + TR - 1) / TR, nc = (K + TC - 1) / TC, nt = nr * nc;
    ranked *t = malloc((size_t)nt * sizeof *t);
    if (!t) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "resq block-50: out of memory");
    for (int64_t i = 0; i < nt; i++) {
        const int64_t r0 = (i / nc) * TR, c0 = (i % nc) * TC;
        double s = 0;
        for (int64_t n = r0; n < r0 + TR && n < N; n++)
            for (int64_t k = c0; k < c0 + TC && k < K; k++) s += (double)r[n * K + k] * r[n * K + k];
        t[i] = (ranked){s, i};
    }
    qsort(t, (size_t)nt, sizeof *t, by_key_desc);
    for (int64_t i = (nt + 1) / 2; i < nt; i++) {
        const int64_t r0 = (t[i].idx / nc) * TR, c0 = (t[i].idx % nc) * TC;
        for (int64_t n = r0; n < r0 + TR && n < N; n++)
            for (int64_t k = c0; k < c0 + TC && k < K; k++) r[n * K + k] = 0.0f;
    }
    free(t);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_resq_mask(fp4rl_context *ctx, float *r, int64_t N, int64_t K, int pattern)
{
    (void)ctx;
    switch (pattern) {
    case FP4RL_RESQ_2_4: mask_2_4(r, N, K); return FP4RL_OK;
    case FP4RL_RESQ_CHANNEL_50: return mask_channels(r, N, K);
    case FP4RL_RESQ_BLOCK_50: return mask_blocks(r, N, K);
    default: return FP4RL_OK; /* dense keeps everything */
    }
}

/* ---- top-p: the nucleus of one row (core/backend/ops.h, sample_rows) ---- */
typedef struct nucleus {
    uint32_t key;     /* the threshold key K */
    int64_t last_tie; /* the last token (by id) with key K in the nucleus */
    double mass;      /* mass_S = M_gt + n e_K */
} nucleus;

/* Fills key[v] = the order key of z_v = l[v] / temperature and e[v] = exp(z_v - mx) for the
 * candidates (l[v] >= cand; e[v] = 0 for the others), and returns kept = sum e in order. */
static double nucleus_prepare(const float *l, int64_t V, float temperature, float cand, float mx, uint32_t *key, double *e)
{
    double kept = 0;
    for (int64_t v = 0; v < V; v++) {
        const float z = l[v] / temperature;
        key[v] = fp4rl_nucleus_key(z);
        e[v] = l[v] >= cand ? exp((double)z - mx) : 0.0;
        kept += e[v];
    }
    return kept;
}

/* M(K) = the mass of the candidates with key >= K, summed in vocabulary order. */
static double mass_from(const float *l, int64_t V, float cand, const uint32_t *key, const double *e, uint32_t K)
{
    double m = 0;
    for (int64_t v = 0; v < V; v++)
        if (l[v] >= cand && key[v] >= K) m += e[v];
    return m;
}

/* The nucleus of the candidates for 0 < top_p < 1: K = the largest key with M(K) >= top_p * kept
 * by bisection (M falls with K, and only at the candidates' keys, so K is one of them; the
 * maximum z is a candidate, so the search starts below its key), then the ties at K. */
static nucleus nucleus_find(const float *l, int64_t V, float cand, float mx, double kept, double top_p, const uint32_t *key,
                            const double *e)
{
    const double target = top_p * kept;
    uint32_t lo = 0, hi = fp4rl_nucleus_key(mx);
    while (lo < hi) {
        const uint32_t mid = fp4rl_nucleus_mid(lo, hi);
        if (mass_from(l, V, cand, key, e, mid) >= target) lo = mid;
        else hi = mid - 1;
    }
    nucleus r = {lo, -1, 0};
    double m_gt = 0, e_k = 0;
    int64_t cnt = 0;
    for (int64_t v = 0; v < V; v++) {
        if (!(l[v] >= cand)) continue;
        if (key[v] > lo) m_gt += e[v];
        else if (key[v] == lo) {
            if (!cnt) e_k = e[v];
            cnt++;
        }
    }
    const int64_t n = fp4rl_nucleus_ties(m_gt, e_k, target, cnt);
    for (int64_t v = 0, seen = 0; v < V && seen < n; v++)
        if (l[v] >= cand && key[v] == lo && ++seen == n) r.last_tie = v;
    r.mass = m_gt + (double)n * e_k;
    return r;
}

static int in_nucleus(const nucleus *nu, const float *l, float cand, const uint32_t *key, int64_t v)
{
    return l[v] >= cand && (key[v] > nu->key || (key[v] == nu->key && v <= nu->last_tie));
}

/* The k-th largest of z (counting repeats), exactly: the largest key with at least k values at
 * or above it, by bisection on integer counts. */
static float kth_largest(const float *z, int64_t V, int64_t k, const uint32_t *key)
{
    uint32_t lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
        const uint32_t mid = fp4rl_nucleus_mid(lo, hi);
        int64_t c = 0;
        for (int64_t v = 0; v < V; v++) c += key[v] >= mid;
        if (c >= k) lo = mid;
        else hi = mid - 1;
    }
    for (int64_t v = 0; v < V; v++)
        if (key[v] == lo) return z[v];
    return -INFINITY; /* not reached: the k-th largest is one of the values */
}

/* ---- sampling ---- */
fp4rl_status fp4rl_cpu_sample_rows(fp4rl_context *ctx, int32_t *tokens, float *logp, const float *logits, int64_t B,
                                   int64_t V, float temperature, int64_t top_k, double top_p, uint64_t seed, uint64_t offset,
                                   uint64_t row0, const int32_t *steps, const int32_t *rows)
{
    (void)ctx;
    const int nucl = fp4rl_nucleus_on(top_p);
    float *kth = NULL;
    uint32_t *key = NULL;
    double *e = NULL;
    if (top_k > 0 && top_k < V) {
        kth = malloc((size_t)V * sizeof(float));
        if (!kth) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "sample: out of memory");
    }
    if (nucl) {
        key = malloc((size_t)V * sizeof *key);
        e = malloc((size_t)V * sizeof *e);
        if (!key || !e) {
            free(kth), free(key), free(e);
            return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "sample: out of memory");
        }
    }
    for (int64_t b = 0; b < B; b++) {
        const float *l = logits + b * V;
        float mx = -INFINITY, thresh = -INFINITY;
        for (int64_t v = 0; v < V; v++) mx = fmaxf(mx, l[v] / temperature);
        if (kth) { /* the k-th largest logit: partial selection on a copy */
            memcpy(kth, l, (size_t)V * sizeof(float));
            for (int64_t i = 0; i < top_k; i++) {
                int64_t best = i;
                for (int64_t j = i + 1; j < V; j++)
                    if (kth[j] > kth[best]) best = j;
                float tmp = kth[i];
                kth[i] = kth[best];
                kth[best] = tmp;
            }
            thresh = kth[top_k - 1];
        }
        const double u0 = (double)fp4rl_sr_uniform(seed, offset + (uint64_t)(steps ? steps[b] : 0),
                                                   row0 + (uint64_t)(rows ? rows[b] : b));
        if (nucl) { /* top-p: the inverse CDF over the nucleus, renormalised */
            const double kept = nucleus_prepare(l, V, temperature, thresh, mx, key, e);
            const nucleus nu = nucleus_find(l, V, thresh, mx, kept, top_p, key, e);
            const double u = u0 * nu.mass;
            double acc = 0;
            int64_t pick = -1, last = 0;
            for (int64_t v = 0; v < V; v++) {
                if (!in_nucleus(&nu, l, thresh, key, v)) continue;
                last = v;
                acc += e[v];
                if (u < acc) {
                    pick = v;
                    break;
                }
            }
            if (pick < 0) pick = last; /* u * mass rounding past the sum */
            tokens[b] = (int32_t)pick;
            logp[b] = (float)((double)(l[pick] / temperature) - mx - log(nu.mass));
            continue;
        }
        double all = 0, kept = 0;
        for (int64_t v = 0; v < V; v++) {
            double e = exp((double)(l[v] / temperature) - mx);
            all += e;
            if (l[v] >= thresh) kept += e;
        }
        const double u = u0 * kept;
        double acc = 0;
        int64_t pick = -1, last = 0;
        for (int64_t v = 0; v < V; v++) {
            if (l[v] < thresh) continue;
            last = v;
            acc += exp((double)(l[v] / temperature) - mx);
            if (u < acc) {
                pick = v;
                break;
            }
        }
        if (pick < 0) pick = last; /* u * kept rounding past the sum */
        tokens[b] = (int32_t)pick;
        logp[b] = (float)((double)(l[pick] / temperature) - mx - log(all));
    }
    free(kth);
    free(key);
    free(e);
    return FP4RL_OK;
}

/* ---- the trainer's side of top-p: one row's nucleus, as the sampler finds it ---- */
typedef struct nucleus_row {
    float mx, cand;
    nucleus nu;
} nucleus_row;

static nucleus_row trainer_nucleus(const float *z, int64_t V, int64_t top_k, double top_p, uint32_t *key, double *e)
{
    nucleus_row r = {-INFINITY, -INFINITY, {0, -1, 0}};
    for (int64_t v = 0; v < V; v++) {
        r.mx = fmaxf(r.mx, z[v]);
        key[v] = fp4rl_nucleus_key(z[v]);
    }
    if (top_k > 0 && top_k < V) r.cand = kth_largest(z, V, top_k, key);
    const double kept = nucleus_prepare(z, V, 1.0f, r.cand, r.mx, key, e);
    r.nu = nucleus_find(z, V, r.cand, r.mx, kept, top_p, key, e);
    return r;
}

fp4rl_status fp4rl_cpu_nucleus_logprobs_forward(fp4rl_context *ctx, float *logp, float *lse, const float *logits,
                                                const int32_t *targets, int64_t N, int64_t V, int64_t top_k, double top_p)
{
    (void)ctx;
    uint32_t *key = malloc((size_t)V * sizeof *key);
    double *e = malloc((size_t)V * sizeof *e);
    if (!key || !e) {
        free(key), free(e);
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "nucleus log-probs: out of memory");
    }
    for (int64_t n = 0; n < N; n++) {
        const float *z = logits + n * V;
        const int32_t t = targets[n];
        if (t < 0 || t >= V) {
            logp[n] = lse[n] = 0.0f;
            continue;
        }
        const nucleus_row r = trainer_nucleus(z, V, top_k, top_p, key, e);
        /* S' = S plus the target */
        const double mass = r.nu.mass + (in_nucleus(&r.nu, z, r.cand, key, t) ? 0.0 : exp((double)z[t] - r.mx));
        lse[n] = (float)((double)r.mx + log(mass));
        logp[n] = (float)((double)z[t] - r.mx - log(mass));
    }
    free(key);
    free(e);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_nucleus_logprobs_backward(fp4rl_context *ctx, float *dlogits, const float *dlogp, const float *logits,
                                                 const int32_t *targets, const float *lse, int64_t N, int64_t V,
                                                 int64_t top_k, double top_p)
{
    (void)ctx;
    uint32_t *key = malloc((size_t)V * sizeof *key);
    double *e = malloc((size_t)V * sizeof *e);
    if (!key || !e) {
        free(key), free(e);
        return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "nucleus log-probs backward: out of memory");
    }
    for (int64_t n = 0; n < N; n++) {
        const float *z = logits + n * V;
        float *dz = dlogits + n * V;
        const int32_t t = targets[n];
        if (t < 0 || t >= V) continue; /* an ignored target's logp is the constant 0 */
        const nucleus_row r = trainer_nucleus(z, V, top_k, top_p, key, e);
        const double gl = dlogp[n];
        for (int64_t v = 0; v < V; v++) {
            /* d logp_t / dz_v = [v == t] - [v in S'] p_v / sum_{S'} p, S' = S plus t, held fixed */
            const double q = (v == t || in_nucleus(&r.nu, z, r.cand, key, v)) ? exp((double)z[v] - (double)lse[n]) : 0.0;
            dz[v] += (float)(gl * ((v == t ? 1.0 : 0.0) - q));
        }
    }
    free(key);
    free(e);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_underflow_count(fp4rl_context *ctx, float *counts, const float *x, const float *xq, int64_t n)
{
    (void)ctx;
    int64_t nz = 0, under = 0;
    for (int64_t i = 0; i < n; i++)
        if (x[i] != 0.0f) {
            nz++;
            under += xq[i] == 0.0f;
        }
    counts[0] += (float)nz;
    counts[1] += (float)under;
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_scale(fp4rl_context *ctx, float *x, int64_t n, float alpha)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) x[i] *= alpha;
    return FP4RL_OK;
}
