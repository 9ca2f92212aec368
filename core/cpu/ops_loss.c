/* ops_loss.c - log-softmax over the vocabulary: per-token log-probs and entropy (the RL losses are
 * built from these), and the masked mean cross-entropy (SFT). Row sums run in double; the saved
 * lse lets backward rebuild p = exp(logit - lse) without a second max pass. */
#include <math.h>

#include "cpu/ops_cpu.h"

static int target_ok(int32_t t, int64_t V) { return t >= 0 && t < V; }

/* logsumexp of one row, max-shifted so exp never overflows */
static float row_lse(const float *x, int64_t V)
{
    float m = x[0];
    for (int64_t v = 1; v < V; v++)
        if (x[v] > m) m = x[v];
    double sum = 0.0;
    for (int64_t v = 0; v < V; v++) sum += exp((double)x[v] - (double)m);
    return (float)((double)m + log(sum));
}

fp4rl_status fp4rl_cpu_logprobs_forward(fp4rl_context *ctx, float *logp, float *entropy, float *lse,
                                        const float *logits, const int32_t *targets, int64_t N, int64_t V)
{
    (void)ctx;
    for (int64_t n = 0; n < N; n++) {
        const float *x = logits + n * V;
        const float l = row_lse(x, V);
        lse[n] = l;
        logp[n] = target_ok(targets[n], V) ? x[targets[n]] - l : 0.0f;
        if (entropy) {
            /* H = -sum p log p = sum p (lse - x) */
            double h = 0.0;
            for (int64_t v = 0; v < V; v++) {
                double lp = (double)x[v] - (double)l;
                h -= exp(lp) * lp;
            }
            entropy[n] = (float)h;
        }
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_logprobs_backward(fp4rl_context *ctx, float *dlogits, const float *dlogp, const float *dentropy,
                                         const float *logits, const int32_t *targets, const float *lse,
                                         const float *entropy, int64_t N, int64_t V)
{
    (void)ctx;
    for (int64_t n = 0; n < N; n++) {
        const float *x = logits + n * V;
        float *dx = dlogits + n * V;
        const int32_t t = targets[n];
        /* an ignored target's logp is the constant 0 */
        const float gl = (dlogp && target_ok(t, V)) ? dlogp[n] : 0.0f;
        const float gh = dentropy ? dentropy[n] : 0.0f;
        const float h = dentropy ? entropy[n] : 0.0f;
        for (int64_t v = 0; v < V; v++) {
            float lp = x[v] - lse[n];
            float p = expf(lp);
            /* d logp_t / dx_v = [v == t] - p_v;  dH / dx_v = -p_v (log p_v + H) */
            float g = -gl * p - gh * p * (lp + h);
            if (v == t) g += gl;
            dx[v] += g;
        }
    }
    return FP4RL_OK;
}

/* The weight of row n in the masked mean: mask[n] (1 without a mask), 0 for an ignored target. */
static float ce_weight(const int32_t *targets, const float *mask, int64_t n, int64_t V)
{
    if (!target_ok(targets[n], V)) return 0.0f;
    return mask ? mask[n] : 1.0f;
}

static double ce_count(const int32_t *targets, const float *mask, int64_t N, int64_t V)
{
    double c = 0.0;
    for (int64_t n = 0; n < N; n++) c += ce_weight(targets, mask, n, V);
    return c;
}

fp4rl_status fp4rl_cpu_cross_entropy_forward(fp4rl_context *ctx, float *loss, float *lse, const float *logits,
                                             const int32_t *targets, const float *mask, int64_t N, int64_t V)
{
    (void)ctx;
    double total = 0.0;
    for (int64_t n = 0; n < N; n++) {
        const float *x = logits + n * V;
        lse[n] = row_lse(x, V);
        float w = ce_weight(targets, mask, n, V);
        if (w != 0.0f) total += (double)w * ((double)lse[n] - (double)x[targets[n]]);
    }
    const double count = ce_count(targets, mask, N, V);
    loss[0] = count > 0.0 ? (float)(total / count) : 0.0f; /* nothing to learn from: no loss, no NaN */
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_cross_entropy_backward(fp4rl_context *ctx, float *dlogits, const float *dloss,
                                              const float *logits, const int32_t *targets, const float *mask,
                                              const float *lse, int64_t N, int64_t V)
{
    (void)ctx;
    const double count = ce_count(targets, mask, N, V);
    if (!(count > 0.0)) return FP4RL_OK;
    for (int64_t n = 0; n < N; n++) {
        const float w = ce_weight(targets, mask, n, V);
        if (w == 0.0f) continue;
        const float coef = (float)((double)dloss[0] * w / count);
        const float *x = logits + n * V;
        float *dx = dlogits + n * V;
        for (int64_t v = 0; v < V; v++) {
            float p = expf(x[v] - lse[n]);
            dx[v] += coef * (p - (v == targets[n] ? 1.0f : 0.0f));
        }
    }
    return FP4RL_OK;
}
