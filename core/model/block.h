/*
 * block.h - one Qwen2 transformer block, forward and backward (llm.c style: one pair per layer
 * kind), for the training pass over whole sequences (core/model/model_forward.c).
 *
 * Memory: a block's saved activations live in its own arena (fp4rl_block_acts.mem), allocated by
 * block_forward and released by the caller as soon as their last reader has run (the block's
 * backward, or the next block's forward in a forward-only pass). Temporaries inside a block are
 * released right after their last use. A KV-cache variant (decode) can reuse the same steps with
 * attention over a cache in place of attention_forward.
 */
#ifndef FP4RL_BLOCK_H
#define FP4RL_BLOCK_H

#include "model/model.h"

enum { FP4RL_LIN_Q, FP4RL_LIN_K, FP4RL_LIN_V, FP4RL_LIN_O, FP4RL_LIN_GATE, FP4RL_LIN_UP, FP4RL_LIN_DOWN, FP4RL_LIN_COUNT };

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
