/* ops_swiglu.c - the SwiGLU gate of the Qwen2 MLP, out = silu(gate) * up. */
#include <math.h>

#include "backend/halves.h"
#include "cpu/ops_cpu.h"

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); } /* expf overflow gives 0, as it should */
static float swiglu1(float g, float u) { return g * sigmoid(g) * u; }

fp4rl_status fp4rl_cpu_swiglu_forward(fp4rl_context *ctx, float *out, const float *gate, const float *up, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) out[i] = swiglu1(gate[i], up[i]);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_swiglu_backward(fp4rl_context *ctx, float *dgate, float *dup, const float *dout,
                                       const float *gate, const float *up, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], s = sigmoid(g);
        float silu = g * s;
        float dsilu = s * (1.0f + g * (1.0f - s)); /* d/dg of g * sigmoid(g) */
        dgate[i] += dout[i] * up[i] * dsilu;
        dup[i] += dout[i] * silu;
    }
    return FP4RL_OK;
}

/* gate and up of row n read from the halves (backend/halves.h; gu alone when lo and bias are NULL),
 * then swiglu_forward's expression */
fp4rl_status fp4rl_cpu_swiglu_rows(fp4rl_context *ctx, float *out, const float *gu, const float *lo, const float *bias,
                                   int64_t N, int64_t inter)
{
    (void)ctx;
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < inter; i++) {
            const int64_t g = n * 2 * inter + i;
            out[n * inter + i] = swiglu1(fp4rl_halves_at(gu, lo, bias, g, i), fp4rl_halves_at(gu, lo, bias, g + inter, inter + i));
        }
    return FP4RL_OK;
}
