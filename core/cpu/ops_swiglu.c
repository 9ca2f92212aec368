/* ops_swiglu.c - the SwiGLU gate of the Qwen2 MLP, out = silu(gate) * up. */
#include <math.h>

#include "cpu/ops_cpu.h"

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); } /* expf overflow gives 0, as it should */

fp4rl_status fp4rl_cpu_swiglu_forward(fp4rl_context *ctx, float *out, const float *gate, const float *up, int64_t n)
{
    (void)ctx;
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
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

fp4rl_status fp4rl_cpu_swiglu_rows(fp4rl_context *ctx, float *out, const float *gu, int64_t N, int64_t inter)
{
    fp4rl_status st = FP4RL_OK;
    for (int64_t n = 0; n < N && !st; n++)
        st = fp4rl_cpu_swiglu_forward(ctx, out + n * inter, gu + n * 2 * inter, gu + n * 2 * inter + inter, inter);
    return st;
}
