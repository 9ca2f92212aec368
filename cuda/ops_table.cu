/*
 * ops_table.cu - the CUDA backend's op table (core/backend/ops.h), set as ctx->ops by
 * fp4rl_cuda_context_init. Designated initializers (C++20's, accepted by nvcc in C++17 mode): every
 * slot names the op it holds, and slots out of the struct's order do not compile.
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
    .name = "cuda",
    .embedding_forward = fp4rl_cuda_embedding_forward,
    .embedding_backward = fp4rl_cuda_embedding_backward, /* deterministic: serial over tokens per column, no atomics */
    .rmsnorm_forward = fp4rl_cuda_rmsnorm_forward,
    .rmsnorm_backward = fp4rl_cuda_rmsnorm_backward,
    .linear_forward = fp4rl_cuda_linear_forward,
    .linear_backward = fp4rl_cuda_linear_backward,
    .round_bf16 = fp4rl_cuda_round_bf16,
    .rope_forward = fp4rl_cuda_rope_forward,
    .rope_backward = fp4rl_cuda_rope_backward,
    .attention_forward = fp4rl_cuda_attention_forward,
    .attention_backward = fp4rl_cuda_attention_backward,
    .swiglu_forward = fp4rl_cuda_swiglu_forward,
    .swiglu_backward = fp4rl_cuda_swiglu_backward,
    .residual_forward = fp4rl_cuda_residual_forward,
    .residual_backward = fp4rl_cuda_residual_backward,
    .copy = fp4rl_cuda_copy,
    .sub = fp4rl_cuda_sub,
    .logprobs_forward = fp4rl_cuda_logprobs_forward,
    .logprobs_backward = fp4rl_cuda_logprobs_backward,
    .cross_entropy_forward = fp4rl_cuda_cross_entropy_forward,
    .cross_entropy_backward = fp4rl_cuda_cross_entropy_backward,
    .adamw_update = fp4rl_cuda_adamw_update,
    .adamw_check = fp4rl_cuda_adamw_check,
    .adamw_update_bf16 = fp4rl_cuda_adamw_update_bf16, /* adamw_math.h's step and SR uniforms: bitwise the CPU's */
    .adamw_check_bf16 = fp4rl_cuda_adamw_check_bf16,
    .grad_norm = fp4rl_cuda_grad_norm,
    .grad_clip = fp4rl_cuda_grad_clip,
    .init_normal = fp4rl_cuda_init_normal, /* init_math.h's arithmetic, bitwise the CPU's */
    .kv_store = fp4rl_cuda_kv_store,
    .attention_rows = fp4rl_cuda_attention_rows, /* warp-per-key dot products: sums in another order */
    .gather_rows = fp4rl_cuda_gather_rows,
    .resq_mask = fp4rl_cuda_resq_mask,
    .underflow_count = fp4rl_cuda_underflow_count,
    .scale = fp4rl_cuda_scale,
    .sample_rows = fp4rl_cuda_sample_rows, /* the CPU's inverse CDF and uniform; ties at a CDF step may differ by double rounding */
    .nucleus_logprobs_forward = fp4rl_cuda_nucleus_logprobs_forward, /* the CPU's nucleus; sums in chunk order */
    .nucleus_logprobs_backward = fp4rl_cuda_nucleus_logprobs_backward,
    .rollout_act = fp4rl_cuda_rollout_act,
    .qdq_bf16 = fp4rl_cuda_qdq_bf16,
    .linear_forward_bf16 = fp4rl_cuda_linear_forward_bf16,
    .pack_bf16 = fp4rl_cuda_pack_bf16,
    .linear_backward_bf16 = fp4rl_cuda_linear_backward_bf16,
};
