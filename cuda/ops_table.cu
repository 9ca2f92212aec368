/*
 * ops_table.cu - the CUDA backend's op table (core/backend/ops.h), set as ctx->ops by
 * fp4rl_cuda_context_init. Positional (C++17 has no designated initializers): the order is
 * fp4rl_ops's.
 *
 * Determinism: every op is deterministic run to run (fixed-order reductions, no floating-point
 * atomics; embedding_backward too: one thread per column adds the token rows serially, in the
 * CPU's order). Against the CPU: elementwise ops, embedding, AdamW, the bias, RMSNorm's dweight
 * and the ResQ masks do the CPU's float arithmetic in its order (bitwise, up to an ulp of expf /
 * powf / cosf / sinf where used); GEMMs (cuBLASLt FP32, no TF32) differ in summation order;
 * double row sums (RMSNorm, softmax, log-probs, norms) differ only in double rounding.
 */
#include "ops_cuda.h"

extern "C" const fp4rl_ops fp4rl_cuda_ops = {
    "cuda",
    fp4rl_cuda_embedding_forward,
    fp4rl_cuda_embedding_backward, /* deterministic: serial over tokens per column, no atomics */
    fp4rl_cuda_rmsnorm_forward,
    fp4rl_cuda_rmsnorm_backward,
    fp4rl_cuda_linear_forward,
    fp4rl_cuda_linear_backward,
    fp4rl_cuda_round_bf16,
    fp4rl_cuda_rope_forward,
    fp4rl_cuda_rope_backward,
    fp4rl_cuda_attention_forward,
    fp4rl_cuda_attention_backward,
    fp4rl_cuda_swiglu_forward,
    fp4rl_cuda_swiglu_backward,
    fp4rl_cuda_residual_forward,
    fp4rl_cuda_residual_backward,
    fp4rl_cuda_logprobs_forward,
    fp4rl_cuda_logprobs_backward,
    fp4rl_cuda_cross_entropy_forward,
    fp4rl_cuda_cross_entropy_backward,
    fp4rl_cuda_adamw_update,
    fp4rl_cuda_adamw_check,
    fp4rl_cuda_grad_norm,
    fp4rl_cuda_grad_clip,
    fp4rl_cuda_init_normal, /* init_math.h's arithmetic, bitwise the CPU's */
    fp4rl_cuda_kv_write,
    fp4rl_cuda_attention_decode,
    fp4rl_cuda_resq_mask,
    fp4rl_cuda_sample, /* the CPU's inverse CDF and uniform; ties at a CDF step may differ by double rounding */
    fp4rl_cuda_underflow_count,
    fp4rl_cuda_scale,
    fp4rl_cuda_sample_rows,
    fp4rl_cuda_rollout_act,
    fp4rl_cuda_linear_forward_bf16,
    fp4rl_cuda_pack_bf16,
    fp4rl_cuda_linear_backward_bf16,
};
