/* ops_adamw.c - the parameters: their random init (core/backend/init_math.h); AdamW on FP32 master
 * weights (its arithmetic: core/backend/adamw_math.h) with FP32 or BF16 moments and its
 * dry run, and the global gradient norm and its clipping, each following PyTorch
 * (torch.optim.AdamW, torch.nn.utils.clip_grad_norm_) so a recipe's hyper-parameters mean the
 * same thing here. */
#include <math.h>

#include "backend/adamw_math.h"
#include "backend/init_math.h"
#include "cpu/ops_cpu.h"

fp4rl_status fp4rl_cpu_adamw_update(fp4rl_context *ctx, float *params, const float *grads, float *m, float *v,
                                    int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay,
                                    int64_t t)
{
    (void)ctx;
    const fp4rl_adamw_k k = fp4rl_adamw_constants(lr, beta1, beta2, eps, weight_decay, t);
    for (int64_t i = 0; i < n; i++) fp4rl_adamw_elem(&k, grads[i], &params[i], &m[i], &v[i]);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_adamw_check(fp4rl_context *ctx, float *bad, const float *params, const float *grads, const float *m,
                                   const float *v, int64_t n, double lr, double beta1, double beta2, double eps,
                                   double weight_decay, int64_t t)
{
    (void)ctx;
    const fp4rl_adamw_k k = fp4rl_adamw_constants(lr, beta1, beta2, eps, weight_decay, t);
    int any = 0;
    for (int64_t i = 0; i < n && !any; i++) any = fp4rl_adamw_elem_bad(&k, grads[i], params[i], m[i], v[i]);
    bad[0] = any ? 1.0f : 0.0f;
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_adamw_update_bf16(fp4rl_context *ctx, float *params, const float *grads, uint16_t *m, uint16_t *v,
                                         int64_t n, double lr, double beta1, double beta2, double eps,
                                         double weight_decay, int64_t t, uint64_t seed, uint64_t offset)
{
    (void)ctx;
    const fp4rl_adamw_k k = fp4rl_adamw_constants(lr, beta1, beta2, eps, weight_decay, t);
    for (int64_t i = 0; i < n; i++) fp4rl_adamw_elem_bf16(&k, grads[i], &params[i], &m[i], &v[i], seed, offset, (uint64_t)i);
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_adamw_check_bf16(fp4rl_context *ctx, float *bad, const float *params, const float *grads,
                                        const uint16_t *m, const uint16_t *v, int64_t n, double lr, double beta1,
                                        double beta2, double eps, double weight_decay, int64_t t, uint64_t seed,
                                        uint64_t offset)
{
    (void)ctx;
    const fp4rl_adamw_k k = fp4rl_adamw_constants(lr, beta1, beta2, eps, weight_decay, t);
    int any = 0;
    for (int64_t i = 0; i < n && !any; i++)
        any = fp4rl_adamw_elem_bf16_bad(&k, grads[i], params[i], m[i], v[i], seed, offset, (uint64_t)i);
    bad[0] = any ? 1.0f : 0.0f;
    return FP4RL_OK;
}

fp4rl_status fp4rl_cpu_init_normal(fp4rl_context *ctx, float *dst, int64_t k0, int64_t n, uint64_t seed)
{
    (void)ctx;
    for (int64_t j = 0; j < n; j += 2) {
        float a, b;
        fp4rl_init_normal_pair(seed, (uint64_t)(k0 + j), &a, &b);
        dst[j] = a;
        if (j + 1 < n) dst[j + 1] = b;
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
