/* ops_embedding.c - token embedding: a row gather forward, a row scatter-add backward. */
#include <string.h>

#include "cpu/ops_cpu.h"

fp4rl_status fp4rl_cpu_embedding_forward(fp4rl_context *ctx, float *out, const int32_t *tokens, const float *wte,
                                         int64_t N, int64_t V, int64_t C)
{
    (void)ctx;
    for (int64_t n = 0; n < N; n++) {
        float *o = out + n * C;
        int32_t t = tokens[n];
        /* an id outside the vocabulary is padding the caller did not strip: a zero row, no read */
        if (t < 0 || t >= V) {
            memset(o, 0, (size_t)C * sizeof(float));
            continue;
        }
        memcpy(o, wte + (int64_t)t * C, (size_t)C * sizeof(float));
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_embedding_backward(fp4rl_context *ctx, float *dwte, const float *dout, const int32_t *tokens,
                                          int64_t N, int64_t V, int64_t C)
{
    (void)ctx;
    /* serial over n, so a token that repeats adds its rows in a fixed order (reproducible) */
    for (int64_t n = 0; n < N; n++) {
        int32_t t = tokens[n];
        if (t < 0 || t >= V) continue;
        float *dw = dwte + (int64_t)t * C;
        const float *d = dout + n * C;
        for (int64_t c = 0; c < C; c++) dw[c] += d[c];
    }
    return FP4RL_OK;
}
