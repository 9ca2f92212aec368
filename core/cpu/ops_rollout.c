/* ops_rollout.c - the rollout's ops on the CPU: KV-cache writes, one-query attention against the
 * cache (fp4rl_cpu_attend_row, the training attention's own row function, so a BF16 rollout and
 * the BF16 trainer see the same attention), Rollout-ResQ masks, sampling, underflow counts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/formats.h"
#include "cpu/ops_cpu.h"
#include "format/qdq_block.h"

fp4rl_status fp4rl_cpu_kv_write(fp4rl_context *ctx, float *cache, const float *src, int64_t B, int64_t Tmax, int64_t W,
                                int64_t t)
{
    (void)ctx;
    for (int64_t b = 0; b < B; b++) memcpy(cache + (b * Tmax + t) * W, src + b * W, (size_t)W * sizeof(float));
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_attention_decode(fp4rl_context *ctx, float *out, const float *q, const float *kc, const float *vc,
                                        int64_t B, int64_t Tmax, int64_t len, int64_t Hq, int64_t Hkv, int64_t D,
                                        fp4rl_att_numerics nm)
{
    (void)ctx;
    const int64_t group = Hq / Hkv;
    const float scale = 1.0f / sqrtf((float)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t kv0 = (b * Tmax * Hkv + h / group) * D;
            fp4rl_cpu_attend_row(out + (b * Hq + h) * D, q + (b * Hq + h) * D, kc + kv0, vc + kv0, Hkv * D, len, D, scale, nm);
        }
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

/* ---- sampling ---- */
fp4rl_status fp4rl_cpu_sample_rows(fp4rl_context *ctx, int32_t *tokens, float *logp, const float *logits, int64_t B,
                                   int64_t V, float temperature, int64_t top_k, uint64_t seed, uint64_t offset,
                                   uint64_t row0)
{
    (void)ctx;
    float *kth = NULL;
    if (top_k > 0 && top_k < V) {
        kth = malloc((size_t)V * sizeof(float));
        if (!kth) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "sample: out of memory");
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
        double all = 0, kept = 0;
        for (int64_t v = 0; v < V; v++) {
            double e = exp((double)(l[v] / temperature) - mx);
            all += e;
            if (l[v] >= thresh) kept += e;
        }
        const double u = (double)fp4rl_sr_uniform(seed, offset, row0 + (uint64_t)b) * kept;
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
