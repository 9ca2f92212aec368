/*
 * ops_table.cu - the CUDA backend's op table (core/backend/ops.h), set as ctx->ops by
 * fp4rl_cuda_context_init: slot <op> holds fp4rl_cuda_<op>, one designated initialiser per entry of
 * core/backend/ops_list.h, in its order (C++20's rule for designated initialisers, which nvcc
 * accepts in C++17 mode), so no op can be left out or put in another op's slot.
 *
 * Determinism: every op is deterministic run to run (fixed-order reductions, no floating-point
 * atomics; embedding_backward too: one thread per column adds the token rows serially, in the
 * CPU's order). Against the CPU: elementwise ops, embedding, AdamW, the bias, RMSNorm's dweight
 * and the ResQ masks do the CPU's float arithmetic in its order (bitwise, up to an ulp of expf /
 * powf / cosf / sinf where used); GEMMs (cuBLASLt FP32, no TF32) differ in summation order;
 * double row sums (RMSNorm, softmax, log-probs, norms) differ only in double rounding. Per op:
 *  - adamw_update_bf16: adamw_math.h's step and SR uniforms, bitwise the CPU's;
 *  - init_normal: init_math.h's arithmetic, bitwise the CPU's;
 *  - attention_rows: the CPU's scores bit for bit; lse and o summed in another order, fixed by the
 *    row's own key count (BF16 caches of head dim 64/128: over chunks of 64 keys, in chunk order);
 *  - sample_rows: the CPU's inverse CDF and uniform; ties at a CDF step may differ by double rounding;
 *  - nucleus_logprobs_forward: the CPU's nucleus; sums in chunk order.
 */
#include "ops_cuda.h"

extern "C" const fp4rl_ops fp4rl_cuda_ops = {
    .name = "cuda",
#define FP4RL_OP(ret, op, params) .op = fp4rl_cuda_##op,
#include "backend/ops_list.h"
};
