/* rollout.h - batched autoregressive sampling with a KV cache in the rollout numerics of the
 * model's policy (W4A4, ResQ, ...), recording each sampled token's log-probability. Internal. */
#ifndef FP4RL_ROLLOUT_H
#define FP4RL_ROLLOUT_H

#include "model/model.h"

typedef struct fp4rl_rollout_cfg {
    int64_t group;          /* completions per prompt */
    int64_t max_new;        /* tokens per completion at most */
    float temperature;      /* > 0 */
    int64_t top_k;          /* 0 = off */
    double top_p;           /* nucleus sampling when 0 < top_p < 1; 0 (unset) or 1 = off */
    const int32_t *stop;    /* stop token ids (a completion ends with, and includes, the first) */
    int64_t n_stop;
    uint64_t seed;          /* of sampling */
    uint64_t offset;        /* sampling offset of the first decode step; one per step after */
    uint64_t row0;          /* the global row of sequence 0 (a data-parallel rank's slice; 0 otherwise) */
} fp4rl_rollout_cfg;

typedef struct fp4rl_rollout_result {
    int64_t n_seqs;         /* n_prompts * group; sequence i belongs to prompt i / group */
    int64_t max_new;
    int32_t *tokens;        /* [n_seqs, max_new] completion tokens */
    float *logprobs;        /* [n_seqs, max_new] log mu of each */
    int64_t *lengths;       /* [n_seqs] */
    int *stopped;           /* [n_seqs] 1 when a stop token ended it, 0 when max_new did */
    double act_zero_frac;   /* quant/act_zero_frac over the block linears (0 without FP4 activations) */
    uint64_t offset_end;    /* the sampling offset after the last step */
    int64_t decode_steps;
    int64_t fused_linears;  /* linear layers (of 7 L + 1) that ran the fused BF16 path */
    int64_t w4_linears;     /* of those, the ones whose GEMMs of at most FP4RL_W4_MAX_ROWS rows read packed FP4 weights (W4A4) */
    int64_t w4b_linears;    /* of those, the ones whose decode GEMMs multiply the BF16 operand by packed FP4 weights (W4B) */
} fp4rl_rollout_result;

/* Runs the rollout for n_prompts prompts (CSR: prompt p = prompts[offsets[p] .. offsets[p+1])).
 * res is filled with new host arrays (free with fp4rl_rollout_result_free). */
FP4RL_HIDDEN fp4rl_status fp4rl_rollout_run(fp4rl_model *m, const fp4rl_rollout_cfg *cfg, const int32_t *prompts,
                                            const size_t *offsets, size_t n_prompts, fp4rl_rollout_result *res);
FP4RL_HIDDEN void fp4rl_rollout_result_free(fp4rl_rollout_result *res);

/* One rollout linear on rows x [N, IN]: y = Q(x) Wq^T + b, plus Rollout-ResQ's
 * S(Q(x - Q(x))) Wq^T when the policy sets a pattern and activations are quantized. wq is the
 * weight operand prepared at sync; counts (device, 2 floats) gathers underflow counts. Exposed
 * for the ResQ tests. */
FP4RL_HIDDEN fp4rl_status fp4rl_rollout_linear(fp4rl_model *m, fp4rl_arena *a, const fp4rl_linear_spec *s, int resq,
                                               float *y, float *x, const float *wq, const float *b, int64_t N,
                                               int64_t IN, int64_t OUT, float *counts);
#endif
