/*
 * block.h - one Qwen2 transformer block, forward and backward (llm.c style: one pair per layer
 * kind), for the training pass over whole sequences (core/model/model_forward.c); its forward's
 * steps are also the rollout's (core/rl/rollout.c).
 *
 * The block's op sequence (rmsnorm, q/k/v, rope, attention, o, residual, rmsnorm, gate/up,
 * swiglu, down, residual) is written once, fp4rl_block_steps, with how a linear and how the
 * attention are computed left to its caller (fp4rl_block_impl). Training's fp4rl_block_forward
 * computes them in the training numerics, saving what its backward reads; the rollout's KV-cache
 * forward (core/rl/rollout.c, prefill and decode) in the rollout numerics (its fused linears), with
 * attention over the cache (kv_store, then attention_rows) in place of attention_forward.
 *
 * Memory: a block's saved activations live in its own arena (fp4rl_block_acts.mem), allocated by
 * block_forward and released by the caller as soon as their last reader has run (the block's
 * backward, or the next block's forward in a forward-only pass). Temporaries inside a block are
 * released right after their last use.
 */
#ifndef FP4RL_BLOCK_H
#define FP4RL_BLOCK_H

#include "model/model.h"

enum { FP4RL_LIN_Q, FP4RL_LIN_K, FP4RL_LIN_V, FP4RL_LIN_O, FP4RL_LIN_GATE, FP4RL_LIN_UP, FP4RL_LIN_DOWN, FP4RL_LIN_COUNT };

/* The parameter index (FP4RL_LP_*) of linear `which`'s weight. */
static inline int fp4rl_lin_weight(int which)
{
    static const int w[FP4RL_LIN_COUNT] = {FP4RL_LP_Q_W,    FP4RL_LP_K_W,  FP4RL_LP_V_W,   FP4RL_LP_O_W,
                                           FP4RL_LP_GATE_W, FP4RL_LP_UP_W, FP4RL_LP_DOWN_W};
    return w[which];
}

/* How a block computes its linears and its attention, for fp4rl_block_steps (user: the caller's).
 * linear: y [N, OUT] = linear `which` (FP4RL_LIN_*) of layer l on x [N, IN], plus bias (NULL: none).
 * attention: att [N, Hq * D] from q [N, Hq * D] and k, v [N, Hkv * D] (q and k with rope).
 * Optional fused forms of runs of steps (NULL: the steps one by one; the rollout's decode fuses):
 * qkv: the q, k, v linears of ln1 and rope on q and k; q [N, Hq * D] is written, k and v wherever
 *   the impl's attention then reads them (the rollout: straight into its KV cache);
 * gate_up: h [N, I] = swiglu(gate linear, up linear) of ln2. */
typedef struct fp4rl_block_impl {
    fp4rl_status (*linear)(void *user, int64_t l, int which, float *y, float *x, int64_t IN, int64_t OUT, const float *bias);
    fp4rl_status (*attention)(void *user, int64_t l, float *att, float *q, float *k, float *v);
    void *user;
    fp4rl_status (*qkv)(void *user, int64_t l, float *q, float *k, float *v, float *ln1, const int32_t *pos);
    fp4rl_status (*gate_up)(void *user, int64_t l, float *h, float *ln2);
} fp4rl_block_impl;

/* The buffers of one block's steps over N rows: ln1 / ln2 and rstd1 / rstd2 may be the same, x_out
 * may be x_in (in place); o holds the attention's projection, then the down projection. */
typedef struct fp4rl_block_bufs {
    float *x_in, *ln1, *rstd1, *q, *k, *v, *att, *o, *x1, *ln2, *rstd2, *gate, *up, *h, *x_out;
} fp4rl_block_bufs;

/* x_out = block l (x_in) over N rows at positions pos (device, [N], for rope): each step in order,
 * the linears and the attention through impl. Waits for nothing on the host unless impl does. */
FP4RL_HIDDEN fp4rl_status fp4rl_block_steps(fp4rl_model *m, int64_t l, int64_t N, const int32_t *pos,
                                            const fp4rl_block_bufs *b, const fp4rl_block_impl *impl);

/* The batch every block of a pass sees: device positions [B * T] and lengths [B]. */
typedef struct fp4rl_block_batch {
    const int32_t *pos, *len;
    int64_t B, T;
} fp4rl_block_batch;

/* What the backward of a block reads; x_in is the previous block's x_out (not owned). */
typedef struct fp4rl_block_acts {
    fp4rl_arena mem;
    float *x_in, *ln1, *rstd1, *q, *k, *v, *att, *lse, *x1, *ln2, *rstd2, *gate, *up, *h, *x_out;
    fp4rl_linear_saved sv[FP4RL_LIN_COUNT];
} fp4rl_block_acts;

/* A->x_out = block l (x_in) in the training numerics; A->mem must be empty ({.ctx = ctx}).
 * x_out (optional): where to write the output (not owned by A), else it is allocated in A->mem. */
FP4RL_HIDDEN fp4rl_status fp4rl_block_forward(fp4rl_model *m, int64_t l, const fp4rl_block_batch *bt, fp4rl_block_acts *A,
                                              float *x_in, float *x_out);
/* Accumulates block l's parameter gradients from dout (the gradient of A->x_out) and sets *dx_in,
 * the gradient of A->x_in, allocated in `out`. Does not free A. */
FP4RL_HIDDEN fp4rl_status fp4rl_block_backward(fp4rl_model *m, int64_t l, const fp4rl_block_batch *bt,
                                               const fp4rl_block_acts *A, const float *dout, fp4rl_arena *out,
                                               float **dx_in);

#endif
