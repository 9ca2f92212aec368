/* ops_rope.c - rotary position embeddings, HF Llama/Qwen2 "rotate_half" convention: dimension i
 * pairs with i + D/2 (not with i + 1 as in the interleaved GPT-J form). */
#include <math.h>
#include <stdlib.h>

#include "backend/halves.h"
#include "cpu/ops_cpu.h"

/* cos and sin of position `pos` at frequency index i, in binary32 like HF's Qwen2RotaryEmbedding
 * (inv_freq = 1 / theta^(2i/D), then pos * inv_freq, then cos/sin), so pretrained weights see the
 * angles they were trained with. */
static void rope_angle(int32_t pos, int64_t i, int64_t D, float theta, float *c, float *s)
{
    float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)D);
    float a = (float)pos * inv_freq;
    *c = cosf(a);
    *s = sinf(a);
}

/* Rotates every head of every token by +angle (sign 1) or -angle (sign -1, the inverse = R^T).
 * Each pair is read before it is written, so out may equal x. */
static void rope_rotate(float *out, const float *x, const int32_t *positions, int64_t N, int64_t H, int64_t D,
                        float theta, float sign)
{
    int64_t half = D / 2;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t i = 0; i < half; i++) {
            float c, s;
            rope_angle(positions[n], i, D, theta, &c, &s);
            s *= sign;
            for (int64_t h = 0; h < H; h++) {
                const float *xh = x + (n * H + h) * D;
                float *oh = out + (n * H + h) * D;
                float x1 = xh[i], x2 = xh[i + half];
                oh[i] = x1 * c - x2 * s;
                oh[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

fp4rl_status fp4rl_cpu_rope_forward(fp4rl_context *ctx, float *out, const float *x, const int32_t *positions, int64_t N,
                                    int64_t H, int64_t D, float theta)
{
    (void)ctx;
    rope_rotate(out, x, positions, N, H, D, theta, 1.0f);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_rope_backward(fp4rl_context *ctx, float *dx, const float *dout, const int32_t *positions,
                                     int64_t N, int64_t H, int64_t D, float theta)
{
    (void)ctx;
    /* the Jacobian is the rotation R itself, so dx = R^T dout: the same rotation, angle negated */
    rope_rotate(dx, dout, positions, N, H, D, theta, -1.0f);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_qkv_rope_store(fp4rl_context *ctx, float *q, void *kc, void *vc, int kv_bf16, const float *qkv,
                                      const float *lo, const float *bias, const int32_t *positions, const int32_t *rows,
                                      int64_t N, int64_t Hq, int64_t Hkv, int64_t D, float theta)
{
    const int64_t QD = Hq * D, KD = Hkv * D, W = QD + 2 * KD;
    const int halves = lo || bias;
    float *k = malloc((size_t)(KD + (halves ? W : 0)) * sizeof(float));
    if (!k) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "qkv_rope_store: out of memory");
    float *x = k + KD; /* with halves: one row read from them */
    fp4rl_status st = FP4RL_OK;
    for (int64_t n = 0; n < N && !st; n++) { /* row by row: rope_forward and kv_store of one row each */
        const float *r = qkv + n * W;
        if (halves) { /* the row add_halves would have written (backend/halves.h) */
            for (int64_t c = 0; c < W; c++) x[c] = fp4rl_halves_at(qkv, lo, bias, n * W + c, c);
            r = x;
        }
        rope_rotate(q + n * QD, r, positions + n, 1, Hq, D, theta, 1.0f);
        rope_rotate(k, r + QD, positions + n, 1, Hkv, D, theta, 1.0f);
        st = fp4rl_cpu_kv_store(ctx, kc, kv_bf16, k, rows + n, 1, KD);
        if (!st) st = fp4rl_cpu_kv_store(ctx, vc, kv_bf16, r + QD + KD, rows + n, 1, KD);
    }
    free(k);
    return st;
}
