/* ops_adamw.c - AdamW on FP32 master weights, and the global gradient norm and its clipping,
 * each following PyTorch (torch.optim.AdamW, torch.nn.utils.clip_grad_norm_) so a recipe's
 * hyper-parameters mean the same thing here. */
#include <math.h>

#include "cpu/ops_cpu.h"

fp4rl_status fp4rl_cpu_adamw_update(fp4rl_context *ctx, float *params, const float *grads, float *m, float *v,
                                    int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay,
                                    int64_t t)
{
    (void)ctx;
    /* The scalars as PyTorch forms them: from double hyper-parameters on the host, then
     * rounded once to the binary32 the element loop runs in. */
    const double bc1 = 1.0 - pow(beta1, (double)t);
    const double bc2 = 1.0 - pow(beta2, (double)t);
    const float decay = (float)(1.0 - lr * weight_decay);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float one_m_b1 = (float)(1.0 - beta1), b2 = (float)beta2, one_m_b2 = (float)(1.0 - beta2);
    const float epsf = (float)eps;
    for (int64_t i = 0; i < n; i++) {
        float g = grads[i];
        params[i] *= decay;            /* decoupled: the decay never enters m or v */
        m[i] += one_m_b1 * (g - m[i]); /* PyTorch's lerp form of b1 m + (1 - b1) g */
        v[i] = v[i] * b2 + one_m_b2 * g * g;
        float denom = sqrtf(v[i]) / bc2_sqrt + epsf;
        params[i] -= step_size * (m[i] / denom);
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_grad_norm(fp4rl_context *ctx, float *norm, const float *g, int64_t n)
{
    (void)ctx;
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    norm[0] = (float)sqrt(ss);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_grad_clip(fp4rl_context *ctx, float *g, int64_t n, const float *norm, float max_norm)
{
    (void)ctx;
    const float coef = max_norm / (norm[0] + 1e-6f);
    /* written as "return unless below 1" so a NaN norm scales (poisons) the gradients, as in
     * PyTorch, instead of letting a broken step through unclipped */
    if (coef >= 1.0f) return FP4RL_OK;
    for (int64_t i = 0; i < n; i++) g[i] *= coef;
    return FP4RL_OK;
}
