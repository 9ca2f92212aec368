/*
 * ops.h - the backend op table: the transformer layers (a Qwen2-architecture decoder) forward and
 * backward, plus the optimizer, written against raw buffers of the backend's device memory.
 *
 * The model and the RL session call only this table, so the CPU backend (core/cpu/ops_*.c) and
 * a CUDA backend fill the same slots. The ops themselves, their signatures and contracts, are
 * written once, in backend/ops_list.h, from which the slots below, both backends' prototypes and
 * both tables are generated. Not installed; nothing here is ABI.
 *
 * Conventions (every op):
 *  - Pointers are device memory of the context: float * for activations, parameters and
 *    gradients, int32_t * for token ids, positions and lengths. Dims are host int64_t.
 *    Everything is dense row-major; N is a number of token rows.
 *  - Scalars that are hyper-parameters (eps, lr, theta) come from the host; anything computed
 *    from device data (a loss, a norm) is written to a device buffer, never returned, so a
 *    backend never has to synchronize inside an op.
 *  - Arguments have been validated by the caller (non-NULL where not marked optional, dims > 0,
 *    GEMM dims within the BLAS int range). Outputs do not alias inputs unless said so.
 *  - Backward ops ACCUMULATE (+=) into every gradient they produce, activations and parameters
 *    alike (the llm.c rule: the caller zeroes gradient buffers once, and branches that meet,
 *    like a residual or tied embeddings, just add). The one exception is RoPE, whose backward
 *    overwrites so it can run in place (see there).
 *  - A gradient pointer marked optional may be NULL: that gradient is not computed.
 *  - Each returns FP4RL_OK, or a status with the message set (a device error on CUDA). The CPU
 *    ops allocate nothing and cannot fail.
 *  - Padding: a target id < 0 or >= V is "ignored" (HF's -100); a token id outside [0, V) of an
 *    embedding reads as a zero row. Neither reads out of bounds.
 */
#ifndef FP4RL_OPS_H
#define FP4RL_OPS_H

#include <stdint.h>

#include "runtime/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* linear_forward_w4's rows at most: the d8 kernel's M (cuda/decode_fp8.h FP4RL_D8_MAX_M; cuda/ops_rollout_fast.cu
 * static-asserts the two equal); the rollout takes its W4A4 path on decode steps within it. */
#define FP4RL_W4_MAX_ROWS 256

/* The numerics of an attention op (see attention_forward). */
typedef enum fp4rl_att_numerics { FP4RL_ATT_FP32 = 0, FP4RL_ATT_BF16 = 1 } fp4rl_att_numerics;

typedef struct fp4rl_ops {
    const char *name;
    /* one function pointer per op of backend/ops_list.h, where each is declared and documented */
#define FP4RL_OP(ret, op, params) ret(*op) params;
#include "backend/ops_list.h"
} fp4rl_ops;

FP4RL_HIDDEN extern const fp4rl_ops fp4rl_cpu_ops;

#ifdef __cplusplus
}
#endif
#endif
