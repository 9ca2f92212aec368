/*
 * grpo.h - the RL objective of shared/spec/recipes.md section 3, as pure host functions:
 * GRPO advantages, the TIS-weighted clipped policy loss per token with its gradient with respect
 * to log pi_theta, the optional k3 KL penalty, and the aggregation weights. Backend-independent:
 * these work on per-token scalars the model has produced.
 */
#ifndef FP4RL_GRPO_H
#define FP4RL_GRPO_H

#include <stdint.h>

#include "runtime/internal.h"

/* Advantages for n_groups groups of group_size rewards (group g = rewards[g*G .. g*G+G-1]):
 *   A = (r - mean_group) / (std_group + 1e-6)    with the unbiased std (n - 1), as TRL and verl;
 *   A = r - mean_group                           when normalize_std == 0 (Dr. GRPO).
 * A group with zero variance gets A = 0 everywhere. *zero_std_groups counts those groups. */
FP4RL_HIDDEN void fp4rl_grpo_advantages(const double *rewards, int64_t n_groups, int64_t group_size, int normalize_std,
                                        float *adv, int64_t *zero_std_groups);

/* The clipping and TIS settings of the loss. */
typedef struct fp4rl_pg_config {
    double eps_low, eps_high; /* clip(rho, 1 - eps_low, 1 + eps_high) */
    double tis_cap;           /* C: w = min(exp(log pi_old - log mu), C); <= 0 disables TIS (w = 1) */
    double kl_coef;           /* beta of the k3 KL to the reference log-probs; 0 = none */
} fp4rl_pg_config;

/* Per-token statistics, summed by the caller into the step's metrics. */
typedef struct fp4rl_pg_token_stats {
    int clipped_low, clipped_high, tis_capped;
    double tis_weight, kl_k3;
} fp4rl_pg_token_stats;

/* One token's loss l_t and dl_t / d(log pi_theta):
 *   w   = min(exp(logp_old - logp_mu), C)   (detached)
 *   rho = exp(logp - logp_old)
 *   l   = -w * min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A) + beta * k3(logp, logp_ref)
 * logp_ref is read only when kl_coef != 0. */
FP4RL_HIDDEN double fp4rl_pg_token_loss(const fp4rl_pg_config *cfg, double logp, double logp_old, double logp_mu,
                                        double logp_ref, double adv, double *dloss_dlogp, fp4rl_pg_token_stats *stats);

/* Aggregation weights: loss = sum_t weight_t * l_t over all completion tokens.
 * per_sequence (default): each completion's tokens get 1 / (len * n_seqs), i.e. the mean over a
 * completion's tokens, then over completions; otherwise 1 / total tokens. Completions of length 0
 * get nothing. weights is indexed like the tokens: completion i's tokens are
 * [offsets[i], offsets[i + 1]). */
FP4RL_HIDDEN void fp4rl_pg_token_weights(const int64_t *offsets, int64_t n_seqs, int per_sequence, double *weights);

#endif
