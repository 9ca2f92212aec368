/* grpo.c - GRPO advantages and the TIS-weighted clipped policy loss (recipes.md section 3). */
#include <math.h>

#include "rl/grpo.h"

void fp4rl_grpo_advantages(const double *rewards, int64_t n_groups, int64_t group_size, int normalize_std, float *adv,
                           int64_t *zero_std_groups)
{
    int64_t zero = 0;
    for (int64_t g = 0; g < n_groups; g++) {
        const double *r = rewards + g * group_size;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < group_size; i++) mean += r[i];
        mean /= (double)group_size;
        for (int64_t i = 0; i < group_size; i++) var += (r[i] - mean) * (r[i] - mean);
        var = group_size > 1 ? var / (double)(group_size - 1) : 0.0;
        int flat = var == 0.0;
        zero += flat;
        for (int64_t i = 0; i < group_size; i++) {
            double a = flat ? 0.0 : r[i] - mean;
            if (normalize_std && !flat) a /= sqrt(var) + 1e-6;
            adv[g * group_size + i] = (float)a;
        }
    }
    if (zero_std_groups) *zero_std_groups = zero;
}

double fp4rl_pg_token_loss(const fp4rl_pg_config *cfg, double logp, double logp_old, double logp_mu, double logp_ref,
                           double adv, double *dloss_dlogp, fp4rl_pg_token_stats *stats)
{
    double w = 1.0;
    int capped = 0;
    if (cfg->tis_cap > 0) {
        w = exp(logp_old - logp_mu);
        if (w > cfg->tis_cap) {
            w = cfg->tis_cap;
            capped = 1;
        }
    }
    const double rho = exp(logp - logp_old);
    const double lo = 1.0 - cfg->eps_low, hi = 1.0 + cfg->eps_high;
    const double rho_c = rho < lo ? lo : (rho > hi ? hi : rho);
    const double unclipped = rho * adv, clipped = rho_c * adv;
    double loss, grad;
    /* min(unclipped, clipped): when the clipped term is the smaller one, it is constant in
     * log pi_theta and the token passes no gradient. Ties take the unclipped term. */
    if (unclipped <= clipped) {
        loss = -w * unclipped;
        grad = -w * unclipped; /* d(rho)/d(logp) = rho */
    } else {
        loss = -w * clipped;
        grad = 0.0;
    }
    double kl = 0.0;
    if (cfg->kl_coef != 0.0) {
        /* k3 = exp(ref - logp) - (ref - logp) - 1, an unbiased, non-negative KL estimator */
        const double d = logp_ref - logp;
        kl = exp(d) - d - 1.0;
        loss += cfg->kl_coef * kl;
        grad += cfg->kl_coef * (1.0 - exp(d));
    }
    if (dloss_dlogp) *dloss_dlogp = grad;
    if (stats) {
        stats->clipped_low = adv < 0 && rho < lo;
        stats->clipped_high = adv > 0 && rho > hi;
        stats->tis_capped = capped;
        stats->tis_weight = w;
        stats->kl_k3 = kl;
    }
    return loss;
}

void fp4rl_pg_token_weights(const int64_t *offsets, int64_t n_seqs, int per_sequence, double *weights)
{
    int64_t total = offsets[n_seqs] - offsets[0], nonempty = 0;
    for (int64_t i = 0; i < n_seqs; i++) nonempty += offsets[i + 1] > offsets[i];
    for (int64_t i = 0; i < n_seqs; i++) {
        const int64_t len = offsets[i + 1] - offsets[i];
        for (int64_t t = offsets[i]; t < offsets[i + 1]; t++)
            weights[t - offsets[0]] = per_sequence ? 1.0 / ((double)len * (double)nonempty) : 1.0 / (double)total;
    }
}
