/* ops_attention.c - causal grouped-query attention with per-sequence lengths, FlashAttention's
 * interface without its tiling: forward saves only the row log-sum-exp, backward recomputes the
 * probabilities from q, k and lse. Plain loops, one query row at a time, so nothing is allocated
 * and every sum runs in a fixed order (bit-reproducible). In BF16 numerics (ops.h) every operand
 * is rounded where it is read, which is what the GPU's tensor-core path computes. */
#include <math.h>
#include <string.h>

#include "cpu/ops_cpu.h"
#include "format/formats.h"

/* an operand as the numerics read it */
static inline float opnd(float x, fp4rl_att_numerics nm) { return nm == FP4RL_ATT_BF16 ? fp4rl_round_bf16(x) : x; }

static float dot(const float *a, const float *b, int64_t D, fp4rl_att_numerics nm)
{
    float s = 0.0f;
    for (int64_t d = 0; d < D; d++) s += opnd(a[d], nm) * opnd(b[d], nm);
    return s;
}

/* Valid tokens of sequence b. Clamped because lengths live in device memory the caller cannot
 * cheaply check: a bad length must not read out of bounds. */
static int64_t seq_len(const int32_t *lengths, int64_t b, int64_t T)
{
    if (!lengths) return T;
    int64_t n = lengths[b];
    return n < 0 ? 0 : (n > T ? T : n);
}

float fp4rl_cpu_attend_row(float *o, const float *q, const float *k, const float *v, int64_t stride, int64_t n_keys,
                           int64_t D, float scale, fp4rl_att_numerics nm)
{
    /* pass 1: running max and sum of exponentials (online softmax, so no row of scores is stored) */
    float m = -INFINITY;
    double sum = 0.0;
    for (int64_t s = 0; s < n_keys; s++) {
        float x = scale * dot(q, k + s * stride, D, nm);
        if (x > m) {
            sum = sum * exp((double)m - (double)x) + 1.0;
            m = x;
        } else {
            sum += exp((double)x - (double)m);
        }
    }
    const float row_lse = (float)((double)m + log(sum));
    /* pass 2: out = sum_s p_s v_s with p_s = exp(x_s - lse), exactly as backward recomputes it */
    memset(o, 0, (size_t)D * sizeof(float));
    for (int64_t s = 0; s < n_keys; s++) {
        float p = opnd(expf(scale * dot(q, k + s * stride, D, nm) - row_lse), nm);
        const float *vs = v + s * stride;
        for (int64_t d = 0; d < D; d++) o[d] += p * opnd(vs[d], nm);
    }
    return row_lse;
}

fp4rl_status fp4rl_cpu_attention_forward(fp4rl_context *ctx, float *out, float *lse, const float *q, const float *k,
                                         const float *v, const int32_t *lengths, int64_t B, int64_t T, int64_t Hq,
                                         int64_t Hkv, int64_t D, fp4rl_att_numerics nm)
{
    (void)ctx;
    const int64_t group = Hq / Hkv; /* query heads per kv head */
    const float scale = 1.0f / sqrtf((float)D);
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = seq_len(lengths, b, T);
        for (int64_t t = 0; t < T; t++) {
            for (int64_t h = 0; h < Hq; h++) {
                float *o = out + ((b * T + t) * Hq + h) * D;
                float *l_out = lse + (b * Hq + h) * T + t;
                memset(o, 0, (size_t)D * sizeof(float));
                if (t >= len) { /* padding: no output, no state */
                    *l_out = 0.0f;
                    continue;
                }
                const int64_t kh = h / group;
                const int64_t kv0 = (b * T * Hkv + kh) * D; /* key 0 of this sequence and kv head */
                *l_out = fp4rl_cpu_attend_row(o, q + ((b * T + t) * Hq + h) * D, k + kv0, v + kv0, Hkv * D, t + 1, D, scale, nm);
            }
        }
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_attention_backward(fp4rl_context *ctx, float *dq, float *dk, float *dv, const float *dout,
                                          const float *q, const float *k, const float *v, const float *out,
                                          const float *lse, const int32_t *lengths, int64_t B, int64_t T, int64_t Hq,
                                          int64_t Hkv, int64_t D, fp4rl_att_numerics nm)
{
    (void)ctx;
    const int64_t group = Hq / Hkv;
    const float scale = 1.0f / sqrtf((float)D);
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = seq_len(lengths, b, T);
        for (int64_t t = 0; t < len; t++) { /* padded rows have no gradient to give */
            for (int64_t h = 0; h < Hq; h++) {
                const int64_t row = ((b * T + t) * Hq + h) * D;
                const float *qt = q + row, *dout_t = dout + row;
                float *dqt = dq + row;
                const float row_lse = lse[(b * Hq + h) * T + t];
                const int64_t kh = h / group;
                /* softmax backward: dS_s = p_s (dP_s - sum_r p_r dP_r), and the sum equals
                 * dout . out since out = sum_r p_r v_r and dP_r = dout . v_r */
                float delta = 0.0f; /* dout (as the numerics read it) . out */
                for (int64_t d = 0; d < D; d++) delta += opnd(dout_t[d], nm) * out[row + d];
                for (int64_t s = 0; s <= t; s++) {
                    const int64_t kv = ((b * T + s) * Hkv + kh) * D;
                    const float *ks = k + kv, *vs = v + kv;
                    float *dks = dk + kv, *dvs = dv + kv;
                    float p = opnd(expf(scale * dot(qt, ks, D, nm) - row_lse), nm);
                    float ds = opnd(p * (dot(dout_t, vs, D, nm) - delta) * scale, nm); /* through the 1/sqrt(D) too */
                    for (int64_t d = 0; d < D; d++) {
                        dqt[d] += ds * opnd(ks[d], nm);
                        dks[d] += ds * opnd(qt[d], nm);
                        dvs[d] += p * opnd(dout_t[d], nm);
                    }
                }
            }
        }
    }
    return FP4RL_OK;
}
