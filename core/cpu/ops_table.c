/* ops_table.c - the CPU backend's op table (core/ops.h). */
#include "ops_cpu.h"

const fp4rl_ops fp4rl_cpu_ops = {
    .name = "cpu",
    .embedding_forward = fp4rl_cpu_embedding_forward,
    .embedding_backward = fp4rl_cpu_embedding_backward,
    .rmsnorm_forward = fp4rl_cpu_rmsnorm_forward,
    .rmsnorm_backward = fp4rl_cpu_rmsnorm_backward,
    .linear_forward = fp4rl_cpu_linear_forward,
    .linear_backward = fp4rl_cpu_linear_backward,
    .round_bf16 = fp4rl_cpu_round_bf16,
    .rope_forward = fp4rl_cpu_rope_forward,
    .rope_backward = fp4rl_cpu_rope_backward,
    .attention_forward = fp4rl_cpu_attention_forward,
    .attention_backward = fp4rl_cpu_attention_backward,
    .swiglu_forward = fp4rl_cpu_swiglu_forward,
    .swiglu_backward = fp4rl_cpu_swiglu_backward,
    .residual_forward = fp4rl_cpu_residual_forward,
    .residual_backward = fp4rl_cpu_residual_backward,
    .logprobs_forward = fp4rl_cpu_logprobs_forward,
    .logprobs_backward = fp4rl_cpu_logprobs_backward,
    .cross_entropy_forward = fp4rl_cpu_cross_entropy_forward,
    .cross_entropy_backward = fp4rl_cpu_cross_entropy_backward,
    .adamw_update = fp4rl_cpu_adamw_update,
    .grad_norm = fp4rl_cpu_grad_norm,
    .grad_clip = fp4rl_cpu_grad_clip,
};
