/* ops_cpu.h - the CPU backend's ops (core/cpu/ops_*.c), filled into fp4rl_cpu_ops; each is
 * documented at its slot in core/backend/ops.h. */
#ifndef FP4RL_OPS_CPU_H
#define FP4RL_OPS_CPU_H

#include "backend/ops.h"

FP4RL_HIDDEN fp4rl_status fp4rl_cpu_embedding_forward(fp4rl_context *ctx, float *out, const int32_t *tokens,
                                                      const float *wte, int64_t N, int64_t V, int64_t C);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_embedding_backward(fp4rl_context *ctx, float *dwte, const float *dout,
                                                       const int32_t *tokens, int64_t N, int64_t V, int64_t C);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_rmsnorm_forward(fp4rl_context *ctx, float *out, float *rstd, const float *x,
                                                    const float *weight, int64_t N, int64_t C, float eps);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_rmsnorm_backward(fp4rl_context *ctx, float *dx, float *dweight, const float *dout,
                                                     const float *x, const float *weight, const float *rstd, int64_t N,
                                                     int64_t C);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_linear_forward(fp4rl_context *ctx, float *y, const float *x, const float *w,
                                                   const float *b, int64_t N, int64_t IN, int64_t OUT);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_linear_backward(fp4rl_context *ctx, float *dx, float *dw, float *db,
                                                    const float *dy_dx, const float *w_dx, const float *dy_dw,
                                                    const float *x_dw, const float *dy_db, int64_t N, int64_t IN,
                                                    int64_t OUT);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_round_bf16(fp4rl_context *ctx, float *out, const float *x, int64_t n);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_rope_forward(fp4rl_context *ctx, float *out, const float *x,
                                                 const int32_t *positions, int64_t N, int64_t H, int64_t D,
                                                 float theta);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_rope_backward(fp4rl_context *ctx, float *dx, const float *dout,
                                                  const int32_t *positions, int64_t N, int64_t H, int64_t D,
                                                  float theta);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_attention_forward(fp4rl_context *ctx, float *out, float *lse, const float *q,
                                                      const float *k, const float *v, const int32_t *lengths, int64_t B,
                                                      int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                                                      fp4rl_att_numerics nm);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_attention_backward(fp4rl_context *ctx, float *dq, float *dk, float *dv,
                                                       const float *dout, const float *q, const float *k,
                                                       const float *v, const float *out, const float *lse,
                                                       const int32_t *lengths, int64_t B, int64_t T, int64_t Hq,
                                                       int64_t Hkv, int64_t D, fp4rl_att_numerics nm);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_swiglu_forward(fp4rl_context *ctx, float *out, const float *gate, const float *up,
                                                   int64_t n);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_swiglu_backward(fp4rl_context *ctx, float *dgate, float *dup, const float *dout,
                                                    const float *gate, const float *up, int64_t n);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_residual_forward(fp4rl_context *ctx, float *out, const float *a, const float *b,
                                                     int64_t n);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_copy(fp4rl_context *ctx, float *dst, const float *src, int64_t n);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_sub(fp4rl_context *ctx, float *out, const float *a, const float *b, int64_t n);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_residual_backward(fp4rl_context *ctx, float *da, float *db, const float *dout,
                                                      int64_t n);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_logprobs_forward(fp4rl_context *ctx, float *logp, float *entropy, float *lse,
                                                     const float *logits, const int32_t *targets, int64_t N, int64_t V);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_logprobs_backward(fp4rl_context *ctx, float *dlogits, const float *dlogp,
                                                      const float *dentropy, const float *logits,
                                                      const int32_t *targets, const float *lse, const float *entropy,
                                                      int64_t N, int64_t V);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_cross_entropy_forward(fp4rl_context *ctx, float *loss, float *lse,
                                                          const float *logits, const int32_t *targets,
                                                          const float *mask, int64_t N, int64_t V);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_cross_entropy_backward(fp4rl_context *ctx, float *dlogits, const float *dloss,
                                                           const float *logits, const int32_t *targets,
                                                           const float *mask, const float *lse, int64_t N, int64_t V);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_adamw_update(fp4rl_context *ctx, float *params, const float *grads, float *m,
                                                 float *v, int64_t n, double lr, double beta1, double beta2,
                                                 double eps, double weight_decay, int64_t t);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_adamw_check(fp4rl_context *ctx, float *bad, const float *params, const float *grads,
                                                const float *m, const float *v, int64_t n, double lr, double beta1,
                                                double beta2, double eps, double weight_decay, int64_t t);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_adamw_update_bf16(fp4rl_context *ctx, float *params, const float *grads, uint16_t *m,
                                                      uint16_t *v, int64_t n, double lr, double beta1, double beta2,
                                                      double eps, double weight_decay, int64_t t, uint64_t seed,
                                                      uint64_t offset);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_adamw_check_bf16(fp4rl_context *ctx, float *bad, const float *params,
                                                     const float *grads, const uint16_t *m, const uint16_t *v, int64_t n,
                                                     double lr, double beta1, double beta2, double eps,
                                                     double weight_decay, int64_t t, uint64_t seed, uint64_t offset);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_init_normal(fp4rl_context *ctx, float *dst, int64_t k0, int64_t n, uint64_t seed);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_grad_norm(fp4rl_context *ctx, float *norm, const float *g, int64_t n);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_grad_clip(fp4rl_context *ctx, float *g, int64_t n, const float *norm,
                                              float max_norm);

FP4RL_HIDDEN fp4rl_status fp4rl_cpu_kv_store(fp4rl_context *ctx, void *cache, int kv_bf16, const float *src,
                                             const int32_t *rows, int64_t N, int64_t W);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_attention_rows(fp4rl_context *ctx, float *out, const float *q, const void *kc,
                                                   const void *vc, int kv_bf16, const int32_t *seg, int64_t N, int64_t max_keys, int64_t Hq,
                                                   int64_t Hkv, int64_t D, fp4rl_att_numerics nm);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_gather_rows(fp4rl_context *ctx, float *dst, const float *src, const int32_t *idx,
                                                int64_t N, int64_t W);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_resq_mask(fp4rl_context *ctx, float *r, int64_t N, int64_t K, int pattern);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_sample_rows(fp4rl_context *ctx, int32_t *tokens, float *logp, const float *logits,
                                                int64_t B, int64_t V, float temperature, int64_t top_k, double top_p,
                                                uint64_t seed, uint64_t offset, uint64_t row0, const int32_t *steps,
                                                const int32_t *rows);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_nucleus_logprobs_forward(fp4rl_context *ctx, float *logp, float *lse,
                                                             const float *logits, const int32_t *targets, int64_t N,
                                                             int64_t V, int64_t top_k, double top_p);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_nucleus_logprobs_backward(fp4rl_context *ctx, float *dlogits, const float *dlogp,
                                                              const float *logits, const int32_t *targets,
                                                              const float *lse, int64_t N, int64_t V, int64_t top_k,
                                                              double top_p);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_underflow_count(fp4rl_context *ctx, float *counts, const float *x, const float *xq,
                                                    int64_t n);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_scale(fp4rl_context *ctx, float *x, int64_t n, float alpha);

/* One query row of attention (ops_attention.c), shared by the training attention and the rollout's
 * decode attention so both do the same arithmetic in the same order: o = sum_s p_s v_s over the
 * n_keys keys k_s = k + s * stride (v likewise), p = softmax(scale * q.k) in FP32 with a double
 * running sum, in numerics nm (ops.h). Returns the row's log-sum-exp. */
FP4RL_HIDDEN float fp4rl_cpu_attend_row(float *o, const float *q, const float *k, const float *v, int64_t stride,
                                        int64_t n_keys, int64_t D, float scale, fp4rl_att_numerics nm);

/* core/cpu/ops_rollout_fast.c (rollout_act) and ops_linear.c (the BF16-operand layer, packing) */
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_rollout_act(fp4rl_context *ctx, uint16_t *out, unsigned long long *counts,
                                                const float *x, int64_t N, int64_t K, int fmt, int truncation_free,
                                                int resq);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_qdq_bf16(fp4rl_context *ctx, uint16_t *dst, const float *src, int64_t rows, int64_t cols,
                                             int fmt, int truncation_free, int along_rows, int stochastic, uint64_t seed,
                                             uint64_t offset);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_linear_forward_bf16(fp4rl_context *ctx, float *y, const uint16_t *x,
                                                        const uint16_t *w, const float *b, int64_t N, int64_t IN,
                                                        int64_t OUT);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_pack_bf16(fp4rl_context *ctx, uint16_t *dst, int64_t ld, const float *src,
                                              int64_t rows, int64_t cols);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_linear_backward_bf16(fp4rl_context *ctx, float *dx, float *dw, float *db,
                                                         const uint16_t *dy_dx, const uint16_t *w_dx,
                                                         const uint16_t *dy_dw, const uint16_t *x_dw, const float *dy_db,
                                                         int64_t N, int64_t IN, int64_t OUT);
#endif
