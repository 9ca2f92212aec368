/*
 * ops_list.h - the backend ops, each declared once: FP4RL_OP(return type, name, (parameters)), with
 * its contract in the comment above it (the conventions every op follows are in ops.h).
 *
 * An X-macro list (the LLVM .def style): no include guard; the includer defines FP4RL_OP, includes
 * this file and gets one expansion per op, in this order; the file undefines FP4RL_OP at its end.
 * From it come struct fp4rl_ops's slots (ops.h), the backends' prototypes (core/cpu/ops_cpu.h:
 * fp4rl_cpu_<name>; cuda/ops_cuda.h: fp4rl_cuda_<name>) and both tables (core/cpu/ops_table.c,
 * cuda/ops_table.cu), so a slot, a prototype and a table entry cannot disagree: an op added here
 * and not written by a backend fails to link, one of another signature fails to compile, and no
 * table can hold an op in another op's slot. Nothing here is ABI.
 */
#ifndef FP4RL_OP
#error "define FP4RL_OP(ret, name, params) before including backend/ops_list.h"
#endif

/* ---- embedding: wte [V, C] -------------------------------------------------------------
 * out[n, :] = wte[tokens[n], :]                                     out [N, C]
 * dwte[tokens[n], :] += dout[n, :]           (rows repeat: a scatter-add) */
FP4RL_OP(fp4rl_status, embedding_forward, (fp4rl_context *ctx, float *out, const int32_t *tokens, const float *wte,
         int64_t N, int64_t V, int64_t C))
FP4RL_OP(fp4rl_status, embedding_backward, (fp4rl_context *ctx, float *dwte, const float *dout, const int32_t *tokens,
         int64_t N, int64_t V, int64_t C))

/* ---- RMSNorm over the last dim C (Qwen2: eps = config rms_norm_eps, 1e-6) ---------------
 * rstd[n] = 1 / sqrt(mean(x[n, :]^2) + eps); out = (x * rstd) * weight. rstd [N] is saved.
 * Backward: dx += ..., dweight += ... (dweight optional). */
FP4RL_OP(fp4rl_status, rmsnorm_forward, (fp4rl_context *ctx, float *out, float *rstd, const float *x,
         const float *weight, int64_t N, int64_t C, float eps))
/* sum = a + b (residual_forward), then out, rstd = rmsnorm_forward(sum): one pass, bit for bit the
 * two ops (a block's residual and the next norm; sum may be a or b). */
FP4RL_OP(fp4rl_status, residual_rmsnorm, (fp4rl_context *ctx, float *sum, float *out, float *rstd, const float *a,
         const float *b, const float *weight, int64_t N, int64_t C, float eps))
FP4RL_OP(fp4rl_status, rmsnorm_backward, (fp4rl_context *ctx, float *dx, float *dweight, const float *dout,
         const float *x, const float *weight, const float *rstd, int64_t N, int64_t C))

/* ---- linear, FP32 GEMMs: x [N, IN], w [OUT, IN] (HF layout), b [OUT] or NULL ------------
 * Forward: y = x w^T + b                                            y [N, OUT]
 * Backward, each GEMM with its own operands so a quantized mode can pass copies quantized
 * (then dequantized) along that GEMM's contraction axis; FP32 mode passes the same pointers:
 *   dx += dy_dx w_dx        (contracts over OUT)   dx optional
 *   dw += dy_dw^T x_dw      (contracts over N)     dw optional
 *   db += sum_n dy_db[n, :] (full-precision dy)    db optional (no bias) */
FP4RL_OP(fp4rl_status, linear_forward, (fp4rl_context *ctx, float *y, const float *x, const float *w, const float *b,
         int64_t N, int64_t IN, int64_t OUT))
FP4RL_OP(fp4rl_status, linear_backward, (fp4rl_context *ctx, float *dx, float *dw, float *db, const float *dy_dx,
         const float *w_dx, const float *dy_dw, const float *x_dw, const float *dy_db, int64_t N, int64_t IN,
         int64_t OUT))
/* out[i] = round_to_bf16(x[i]) (nearest-even; the BF16 training mode's GEMM operands).
 * out may equal x. */
FP4RL_OP(fp4rl_status, round_bf16, (fp4rl_context *ctx, float *out, const float *x, int64_t n))

/* ---- rotary embeddings, HF "rotate_half" convention, on x [N, H, D], D even --------------
 * For i < D/2: inv_freq_i = theta^(-2i/D), a = positions[n] * inv_freq_i (binary32, as HF),
 *   out[i]       = x[i] cos a - x[i + D/2] sin a
 *   out[i + D/2] = x[i + D/2] cos a + x[i] sin a
 * A rotation, so backward is the inverse rotation and OVERWRITES: dx = R^T dout. Both may
 * run in place (out == x, dx == dout). */
FP4RL_OP(fp4rl_status, rope_forward, (fp4rl_context *ctx, float *out, const float *x, const int32_t *positions,
         int64_t N, int64_t H, int64_t D, float theta))
FP4RL_OP(fp4rl_status, rope_backward, (fp4rl_context *ctx, float *dx, const float *dout, const int32_t *positions,
         int64_t N, int64_t H, int64_t D, float theta))

/* ---- causal grouped-query attention --------------------------------------------------
 * q, out [B, T, Hq, D]; k, v [B, T, Hkv, D]; Hq % Hkv == 0, query head h reads kv head
 * h / (Hq / Hkv) (HF repeat_kv). lengths [B] (optional, NULL = all T): sequence b holds
 * tokens 0..lengths[b]-1 (right padding; clamped to [0, T]); later tokens are ignored:
 * they are never keys, their out rows are 0, their lse is 0 and they get no gradient.
 * out[t] = sum_{s <= t} p_s v[s], p_s = exp(x_s - lse), x_s = q[t].k[s] / sqrt(D).
 * lse [B, Hq, T] (the row log-sum-exp of the scores x) is saved for backward, which
 * recomputes the probabilities (the FlashAttention interface: backward also takes out).
 * Backward: dq, dk, dv += ... (all required); delta = dout . out, ds_s = p_s (dout . v[s] -
 * delta) / sqrt(D), dq += sum_s ds_s k[s], dk[s] += ds_s q, dv[s] += p_s dout.
 * Numerics (nm): FP4RL_ATT_FP32 runs all of it in FP32. FP4RL_ATT_BF16 is what the tensor cores
 * compute, defined exactly so the CPU can be the reference: q, k, v and dout are rounded to
 * BF16 (nearest even) first; scores, lse and the FP32 sums are as in FP32; p_s is rounded to
 * BF16 after the exp (one pass for lse, a second for p: no online rescaling of p), and so is
 * ds_s after its FP32 product; every product of two BF16 values is exact in FP32, so the two
 * backends differ only in the order of FP32 sums (and what that changes in a BF16 rounding). */
FP4RL_OP(fp4rl_status, attention_forward, (fp4rl_context *ctx, float *out, float *lse, const float *q, const float *k,
         const float *v, const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
         fp4rl_att_numerics nm))
FP4RL_OP(fp4rl_status, attention_backward, (fp4rl_context *ctx, float *dq, float *dk, float *dv, const float *dout,
         const float *q, const float *k, const float *v, const float *out, const float *lse, const int32_t *lengths,
         int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, fp4rl_att_numerics nm))

/* ---- SwiGLU, elementwise over n: out = silu(gate) * up, silu(g) = g * sigmoid(g) -------- */
FP4RL_OP(fp4rl_status, swiglu_forward, (fp4rl_context *ctx, float *out, const float *gate, const float *up, int64_t n))
FP4RL_OP(fp4rl_status, swiglu_backward, (fp4rl_context *ctx, float *dgate, float *dup, const float *dout,
         const float *gate, const float *up, int64_t n))

/* ---- residual: out = a + b; backward da += dout, db += dout ----------------------------- */
FP4RL_OP(fp4rl_status, residual_forward, (fp4rl_context *ctx, float *out, const float *a, const float *b, int64_t n))
FP4RL_OP(fp4rl_status, residual_backward, (fp4rl_context *ctx, float *da, float *db, const float *dout, int64_t n))
/* ---- plain elementwise: dst = src (a copy, bit for bit); out = a - b (one IEEE rounding) ---- */
FP4RL_OP(fp4rl_status, copy, (fp4rl_context *ctx, float *dst, const float *src, int64_t n))
FP4RL_OP(fp4rl_status, sub, (fp4rl_context *ctx, float *out, const float *a, const float *b, int64_t n))

/* ---- token log-probs: logits [N, V], targets [N] -------------------------------------
 * lse[n] = logsumexp(logits[n, :]) (saved);
 * logp[n] = logits[n, targets[n]] - lse[n], 0 for an ignored target;
 * entropy[n] = -sum_v p_v log p_v (optional; computed for every row).
 * Backward: dlogits[n, :] += dlogp[n] (onehot(target) - p) + dentropy[n] (-p (log p + H)),
 * either upstream gradient optional; `entropy` is required when dentropy is given. */
FP4RL_OP(fp4rl_status, logprobs_forward, (fp4rl_context *ctx, float *logp, float *entropy, float *lse,
         const float *logits, const int32_t *targets, int64_t N, int64_t V))
FP4RL_OP(fp4rl_status, logprobs_backward, (fp4rl_context *ctx, float *dlogits, const float *dlogp,
         const float *dentropy, const float *logits, const int32_t *targets, const float *lse, const float *entropy,
         int64_t N, int64_t V))

/* ---- masked cross-entropy ----------------------------------------------------------
 * loss[0] = sum_n m_n (lse_n - logits[n, t_n]) / sum_n m_n, with m_n = mask[n] (optional,
 * NULL = 1) and m_n = 0 for an ignored target; 0 when no row counts. lse [N] is saved.
 * Backward: dlogits[n, :] += dloss[0] m_n / sum m (p - onehot(t_n)). */
FP4RL_OP(fp4rl_status, cross_entropy_forward, (fp4rl_context *ctx, float *loss, float *lse, const float *logits,
         const int32_t *targets, const float *mask, int64_t N, int64_t V))
FP4RL_OP(fp4rl_status, cross_entropy_backward, (fp4rl_context *ctx, float *dlogits, const float *dloss,
         const float *logits, const int32_t *targets, const float *mask, const float *lse, int64_t N, int64_t V))

/* ---- optimizer -----------------------------------------------------------------------
 * AdamW on FP32 master weights, PyTorch semantics (decoupled decay, bias correction at step
 * t >= 1): p -= lr wd p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). The hyper-parameters are
 * double, like PyTorch's Python floats, so 1 - beta1 is formed before rounding to binary32. */
FP4RL_OP(fp4rl_status, adamw_update, (fp4rl_context *ctx, float *params, const float *grads, float *m, float *v,
         int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t))
/* The dry run of adamw_update with the same arguments, changing nothing: bad[0] = 1 when the
 * update would leave some parameter or moment non-finite, else 0 (the arithmetic is
 * core/backend/adamw_math.h's, shared by both backends). */
FP4RL_OP(fp4rl_status, adamw_check, (fp4rl_context *ctx, float *bad, const float *params, const float *grads,
         const float *m, const float *v, int64_t n, double lr, double beta1, double beta2, double eps,
         double weight_decay, int64_t t))
/* adamw_update and adamw_check with the moments m, v [n] stored as BF16 bits (the model's
 * FP4RL_MP_OPTIMIZER_MOMENTS = 1): each element's step is adamw_update's in FP32 on the widened
 * moments, then m and v are stochastically rounded back to BF16 with the uniforms
 * fp4rl_sr_uniform(seed, offset, 2 i) and (seed, offset, 2 i + 1) (core/backend/adamw_math.h:
 * fp4rl_adamw_elem_bf16, which says why stochastic), so both backends write the same bits. The
 * dry run flags a parameter, or a rounded moment, that would be non-finite. */
FP4RL_OP(fp4rl_status, adamw_update_bf16, (fp4rl_context *ctx, float *params, const float *grads, uint16_t *m,
         uint16_t *v, int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t,
         uint64_t seed, uint64_t offset))
FP4RL_OP(fp4rl_status, adamw_check_bf16, (fp4rl_context *ctx, float *bad, const float *params, const float *grads,
         const uint16_t *m, const uint16_t *v, int64_t n, double lr, double beta1, double beta2, double eps,
         double weight_decay, int64_t t, uint64_t seed, uint64_t offset))
/* norm[0] = sqrt(sum g^2) over one contiguous gradient buffer (keep all gradients in one
 * allocation, as llm.c does, to get the global norm). */
FP4RL_OP(fp4rl_status, grad_norm, (fp4rl_context *ctx, float *norm, const float *g, int64_t n))
/* g *= min(1, max_norm / (norm[0] + 1e-6)) (PyTorch clip_grad_norm_), norm read on device. */
FP4RL_OP(fp4rl_status, grad_clip, (fp4rl_context *ctx, float *g, int64_t n, const float *norm, float max_norm))

/* ---- initialisation -----------------------------------------------------------------
 * One parameter's random initial values, dst [n], n >= 1: element pair (2t, 2t + 1) is
 * fp4rl_init_normal_pair(seed, k0 + 2t) (core/backend/init_math.h; k0 = the parameter's offset in
 * the model's buffer), the same bits on every backend. */
FP4RL_OP(fp4rl_status, init_normal, (fp4rl_context *ctx, float *dst, int64_t k0, int64_t n, uint64_t seed))

/* ---- rollout (prefill and decode with a KV cache) ----------------------------------------
 * A layer's cache is rows of W = Hkv * D values, FP32 or, with kv_bf16, BF16 bit patterns: the
 * rollout's BF16 attention numerics round k and v to BF16 before use, so a cache rounded when
 * written gives the same attention at half the bytes.
 * kv_store: cache row rows[n] = src row n (src [N, W]; rounded to nearest-even BF16 with kv_bf16). */
FP4RL_OP(fp4rl_status, kv_store, (fp4rl_context *ctx, void *cache, int kv_bf16, const float *src, const int32_t *rows,
         int64_t N, int64_t W))
/* qkv_rope_store and swiglu_rows read their input x [N, W] (W its row length) as x = (top + bias) +
 * lo, a ResQ GEMM's two halves (ops add_halves would write, read where they lie): element (n, c) is
 * fp4rl_halves_at(top, lo, bias, n * W + c, c) (core/backend/halves.h), top the op's x argument,
 * lo [N, W] and bias [W] each optional (NULL: that term absent; both NULL: x = top). So the op on
 * (top, lo, bias) equals, bit for bit, add_halves into x followed by the op on x, without the
 * [N, W] round trip.
 * q/k/v of the rollout's forward from one GEMM: qkv [N, Hq * D + 2 * Hkv * D], row n = q | k | v.
 * q [N, Hq, D] = rope_forward(q part); cache row rows[n] of kc = rope_forward(k part) and of vc =
 * the v part, stored as kv_store stores them. Equal, bit for bit, to rope_forward on q and k and
 * kv_store of k and v (one kernel in place of four, and no separate q/k/v buffers). */
FP4RL_OP(fp4rl_status, qkv_rope_store, (fp4rl_context *ctx, float *q, void *kc, void *vc, int kv_bf16, const float *qkv,
         const float *lo, const float *bias, const int32_t *positions, const int32_t *rows, int64_t N, int64_t Hq,
         int64_t Hkv, int64_t D, float theta))
/* SwiGLU of one gate/up GEMM: out [N, inter] = silu(gu[n, i]) * gu[n, inter + i], gu [N, 2 inter] (row n = gate |
 * up; lo and bias as above, W = 2 inter); bit for bit swiglu_forward on the two halves. */
FP4RL_OP(fp4rl_status, swiglu_rows, (fp4rl_context *ctx, float *out, const float *gu, const float *lo, const float *bias,
         int64_t N, int64_t inter))
/* Query row n against its own keys, q, out [N, Hq, D]: the keys (and values) of row n are cache
 * rows seg[4n] .. seg[4n] + seg[4n+1] - 1 followed by seg[4n+2] .. seg[4n+2] + seg[4n+3] - 1
 * (a prompt shared by a group of completions, then the completion's own tokens; either part may
 * be empty, not both), in that order; kc, vc [rows, Hkv, D] as kv_store wrote them. Scale
 * 1/sqrt(D), GQA and the numerics nm as in attention_forward, so a row gives the training
 * forward's row for the same keys: the rollout's prefill (row t of a prompt: its first t + 1
 * keys) and its decode steps use this one op. max_keys >= every row's key count (it sizes the
 * GPU's shared memory for the scores; the CPU checks it). */
FP4RL_OP(fp4rl_status, attention_rows, (fp4rl_context *ctx, float *out, const float *q, const void *kc, const void *vc,
         int kv_bf16, const int32_t *seg, int64_t N, int64_t max_keys, int64_t Hq, int64_t Hkv, int64_t D,
         fp4rl_att_numerics nm))
/* dst row n = src row idx[n] (rows of W floats, a copy bit for bit). */
FP4RL_OP(fp4rl_status, gather_rows, (fp4rl_context *ctx, float *dst, const float *src, const int32_t *idx, int64_t N,
         int64_t W))
/* Rollout-ResQ sparsity on the quantized residual r [N, K], in place (recipes.md section 2):
 * FP4RL_RESQ_DENSE keeps all; _2_4 keeps the 2 largest magnitudes of every 4 consecutive
 * elements of a row (ties: lower index; a tail shorter than 4 keeps its 2 largest);
 * _CHANNEL_50 keeps the ceil(K/2) columns of largest L2 norm over the N rows (ties: lower index);
 * _BLOCK_50 tiles r into 32-row x 64-column tiles and keeps the ceil(tiles/2) of largest L2 norm. */
FP4RL_OP(fp4rl_status, resq_mask, (fp4rl_context *ctx, float *r, int64_t N, int64_t K, int pattern))
/* counts[0] += #{i : x[i] != 0}, counts[1] += #{i : x[i] != 0 and xq[i] == 0} (FP32 sums of
 * counts, exact below 2^24 per call). */
FP4RL_OP(fp4rl_status, underflow_count, (fp4rl_context *ctx, float *counts, const float *x, const float *xq, int64_t n))
/* x *= alpha (the sampling temperature on logits, and its chain rule). */
FP4RL_OP(fp4rl_status, scale, (fp4rl_context *ctx, float *x, int64_t n, float alpha))
/* Samples one token per row of logits [B, V] from softmax(logits / temperature), restricted to
 * the top_k largest logits when 0 < top_k < V (ties at the k-th value are kept), by inverse CDF
 * in vocabulary order with the uniform u = fp4rl_sr_uniform(seed, offset + steps[b],
 * row0 + rows[b]) (steps, rows: optional [B] arrays, NULL reads 0 and b): the rows are numbered
 * from row0, so a data-parallel rank sampling rows [row0, row0 + B) of a global batch draws
 * what one process sampling the whole batch draws, and the rollout numbers a draw by its
 * sequence and position, so which rows share a call never changes a token. Writes the token and its
 * log-probability under the full softmax(logits / temperature) (not renormalised to the top
 * k): the probability the trainer's numerics are compared against. temperature > 0.
 * Top-p, when 0 < top_p < 1 (else off, and everything above holds bit for bit): with
 * z_v = logits[v] / temperature (FP32), mx = max_v z_v, e_v = exp((double)z_v - mx) and C the
 * candidates (the top k as above, or all), S is the nucleus of C: the tokens of C in (z
 * descending, id ascending) order up to and including the first at which the mass reaches
 * top_p * kept (kept = sum_{C} e_v). Found without sorting (fp4rl_nucleus below): the
 * threshold key K = the largest order key of a z with M(K) = sum_{C, key(z_v) >= K} e_v >=
 * top_p * kept, found by bisection on the 32-bit keys; S = {key > K} and the first n tokens
 * (by id) with key == K, n the least >= 1 with M_gt + n e_K >= top_p * kept (M_gt the mass
 * with key > K). The draw is the inverse CDF over S in vocabulary order with u * mass_S,
 * mass_S = M_gt + n e_K, and logp = z_t - mx - log(mass_S): the log-prob under the truncated,
 * renormalised distribution. Sums are in double in a fixed order (the GPU: per contiguous
 * chunk, then over the chunks in order), so the CPU and the GPU differ only where a sum falls
 * within double rounding of a comparison. */
FP4RL_OP(fp4rl_status, sample_rows, (fp4rl_context *ctx, int32_t *tokens, float *logp, const float *logits, int64_t B,
         int64_t V, float temperature, int64_t top_k, double top_p, uint64_t seed, uint64_t offset, uint64_t row0,
         const int32_t *steps, const int32_t *rows))
/* The trainer's side of top-p (0 < top_p < 1): the log-prob of each target under the nucleus of
 * its own row, for logits z [N, V] already divided by the temperature. Per row n with a target
 * t (targets[n] in [0, V); else logp[n] = lse[n] = 0): C = the top_k largest z (ties at the
 * k-th kept; all when top_k is 0 or >= V), S = sample_rows' nucleus of C (the same rule and
 * arithmetic), S' = S plus t (a sampled token just outside this row's nucleus is kept, with
 * its renormalised probability), lse[n] = (float)(mx + log(sum_{S'} e_v)) (saved) and
 * logp[n] = (float)((double)z_t - mx - log(sum_{S'} e_v)), exactly sample_rows' value for the
 * same row and token when t is in S. Backward, S' fixed:
 * dlogits[n, v] += dlogp[n] ([v == t] - [v in S'] exp(z_v - lse[n])). */
FP4RL_OP(fp4rl_status, nucleus_logprobs_forward, (fp4rl_context *ctx, float *logp, float *lse, const float *logits,
         const int32_t *targets, int64_t N, int64_t V, int64_t top_k, double top_p))
FP4RL_OP(fp4rl_status, nucleus_logprobs_backward, (fp4rl_context *ctx, float *dlogits, const float *dlogp,
         const float *logits, const int32_t *targets, const float *lse, int64_t N, int64_t V, int64_t top_k,
         double top_p))

/* ---- the rollout's fused linear path (core/rl/rollout.c) ---------------------------------
 * The GEMM operand of rollout activations x [N, K] in one pass, as BF16 bit patterns; every
 * value written is exactly representable, so the GEMM's products are the generic path's:
 *   fmt < 0: x rounded to BF16 (BF16 numerics); out [N, K].
 *   fmt = FP4RL_QDQ_* (qdq_block.h): xq = dequantize(quantize(x)), 1D blocks along K, round to
 *   nearest. resq = FP4RL_RESQ_DENSE or _2_4: out [2N, K], rows 0 .. N-1 = xq, rows N .. 2N-1 =
 *   S(qdq(x - xq)) (the residual re-quantized with fresh scales, masked as resq_mask does), so
 *   one GEMM of 2N rows reads Wq once for Q(x) Wq^T and S(Q(R)) Wq^T (add_halves, or the
 *   consuming op's lo and bias, then adds them); resq = OFF: out [N, K] = xq.
 * counts (fmt >= 0; may be NULL): counts[0] += #{x != 0}, counts[1] += #{x != 0, xq == 0},
 * integer sums, exact and order-free. */
FP4RL_OP(fp4rl_status, rollout_act, (fp4rl_context *ctx, uint16_t *out, unsigned long long *counts, const float *x,
         int64_t N, int64_t K, int fmt, int truncation_free, int resq))
/* swiglu_rows followed by rollout_act of its output, in one pass: out and counts are what
 * rollout_act(out, counts, h, N, inter, fmt, truncation_free, resq) gives for h = swiglu_rows(gu,
 * lo, bias, N, inter), bit for bit, without h (the rollout's down_proj operand straight from the
 * gate/up GEMM's output or halves). */
FP4RL_OP(fp4rl_status, swiglu_act, (fp4rl_context *ctx, uint16_t *out, unsigned long long *counts, const float *gu,
         const float *lo, const float *bias, int64_t N, int64_t inter, int fmt, int truncation_free, int resq))
/* The W4A4 decode path of the fused linear (issue 16): rollout_act's quantization written as the
 * FP8 GEMM operand instead of BF16 words. fmt FP4RL_QDQ_HIF4 or _MXFP4 (anything else, and resq
 * other than OFF / DENSE / 2_4: FP4RL_ERR_UNSUPPORTED), nearest, 1D blocks along K; rows = N, or 2N
 * with ResQ (the same row blocks as rollout_act); Kp = K rounded up to the unit U (HiF4 64, MXFP4
 * 32). out [rows, Kp] E4M3 bytes, scales the unit scales in format/layout.h's FP4RL_FP8_SCALE_LD(rows)
 * layout (padding bytes and padding rows 0), and for every element e4m3(byte) * scale equals
 * rollout_act's value exactly (the bytes and scales fp4rl_qdq_block_e4m3 gives; a dropped 2:4
 * residual element is the byte 0 in a unit that keeps its scale), except in a NaN unit: bytes 0 and
 * the scale NaN, where rollout_act's 2:4 mask has zeroed some of the NaNs (any GEMM output reading
 * the unit is NaN either way). counts as rollout_act's. out 16-byte aligned, x 16 (K % 8 == 0) or 4. */
FP4RL_OP(fp4rl_status, rollout_act8, (fp4rl_context *ctx, uint8_t *out, float *scales, unsigned long long *counts, const float *x,
         int64_t N, int64_t K, int fmt, int truncation_free, int resq))
/* y [N, OUT] = A8 W^T (+ b): a8 [N, K] E4M3 bytes with unit scales sa (rollout_act8's operand), w the
 * packed quantized weight [OUT, K], HiF4 (1D or 64 x 64 tiles) or MXFP4 (1D or 32 x 32 tiles), of
 * the same unit as a8; K % U == 0, 1 <= N <= FP4RL_W4_MAX_ROWS (ops.h); else FP4RL_ERR_UNSUPPORTED.
 * The math (gemm_fp8.h): per output and unit u an exact partial sum p_u of the E4M3 products, then
 * acc = acc + p_u * (sa_u * sw_u) in K order from acc = 0, each of the three operations one IEEE
 * rounding (no fma), and y = acc, or acc + b[o] (one more rounding) with a bias. The CUDA backend
 * may split K into S slices of whole 128-k chunks (the d8 kernel's split-K: cuda/decode_fp8.h),
 * each promoted as above from 0 and the slice sums added in slice order; FP4RL_D8_SLICES=<n> forces
 * n slices there, 1 being the reference's bits; unset, S is chosen from the shape and the device,
 * deterministically (graph replays are bitwise the eager step), within gemm_fp8.h's bound plus one
 * rounding a slice. */
FP4RL_OP(fp4rl_status, linear_forward_w4, (fp4rl_context *ctx, float *y, const uint8_t *a8, const float *sa, const fp4rl_tensor *w,
         const float *b, int64_t N, int64_t K, int64_t OUT))
/* y [N, OUT] = x w^T (+ b): x [N, K] BF16 words (linear_forward_bf16's operand, e.g. rollout_act's),
 * w the packed quantized weight [OUT, K], HiF4 (1D or 64 x 64 tiles) or MXFP4 (1D or 32 x 32 tiles),
 * K % 64 == 0. Every value of such a weight is exactly a BF16 (HiF4 k 2^inc base / 4, MXFP4 e2m1
 * 2^(e - 127)), so this is linear_forward_bf16 over the BF16 dequantization of w: the same products,
 * FP32 sums in the backend's order, without a BF16 copy of w (CUDA: cuda/decode_w4b.h reads the
 * packed codes; the CPU dequantizes per call). Where linear_w4b_ok refuses, FP4RL_ERR_UNSUPPORTED. */
FP4RL_OP(fp4rl_status, linear_forward_w4b, (fp4rl_context *ctx, float *y, const uint16_t *x, const fp4rl_tensor *w, const float *b,
         int64_t N, int64_t K, int64_t OUT))
/* FP4RL_OK where linear_forward_w4b can run weight w on this context (its format, layout and K; on
 * CUDA also the device and the build: compute capability 9.0 with sm_90a code), else
 * FP4RL_ERR_UNSUPPORTED with the reason. */
FP4RL_OP(fp4rl_status, linear_w4b_ok, (fp4rl_context *ctx, const fp4rl_tensor *w))
/* Re-lays w (accepted by linear_w4b_ok) out in place where the backend's linear_forward_w4b has a
 * faster layout for it (CUDA: HiF4, and MXFP4 whose scale codes are at most 128, cuda/decode_w4b.h's
 * fp4rl_cuda_w4b_pack; w->layout becomes
 * FP4RL_LAYOUT_W4B and only that op may read w afterwards); elsewhere w is left as it is. The
 * results of linear_forward_w4b are the same bits either way. */
FP4RL_OP(fp4rl_status, linear_w4b_pack, (fp4rl_context *ctx, fp4rl_tensor *w))
/* The training GEMMs' FP4 operand in one pass: dst [rows, cols] = the BF16 bits of
 * dequantize(quantize(src)) in round-trip format fmt (FP4RL_QDQ_*, values exactly BF16), 1D
 * blocks along the last dim or, with along_rows, down the columns (block b of column c: rows
 * b * B .. b * B + B - 1, the last one zero-padded). stochastic: element (r, c) rounds with
 * fp4rl_sr_uniform(seed, offset, i), i = r * cols + c, or c * rows + r along the rows (its
 * index in the transposed tensor). Bit for bit the generic path: transpose (along rows),
 * fp4rl_quantize, fp4rl_dequantize, transpose back, BF16. */
FP4RL_OP(fp4rl_status, qdq_bf16, (fp4rl_context *ctx, uint16_t *dst, const float *src, int64_t rows, int64_t cols,
         int fmt, int truncation_free, int along_rows, int stochastic, uint64_t seed, uint64_t offset))
/* y [N, OUT] = (ys[n, :] + b) + ys[N + n, :] over ys [2N, OUT] (b [OUT] or NULL): the two halves
 * of a Rollout-ResQ GEMM, the quantized activation's and the residual's, added as the generic
 * path adds its two GEMMs (fp4rl_halves_add, core/backend/halves.h). The rollout reads q/k/v's and
 * gate/up's halves in qkv_rope_store and swiglu_rows instead (their lo and bias). */
FP4RL_OP(fp4rl_status, add_halves, (fp4rl_context *ctx, float *y, const float *ys, const float *b, int64_t N, int64_t OUT))
/* y [N, OUT] = x [N, IN] w^T (+ b): BF16 operands (bit patterns), FP32 products and sums. */
FP4RL_OP(fp4rl_status, linear_forward_bf16, (fp4rl_context *ctx, float *y, const uint16_t *x, const uint16_t *w,
         const float *b, int64_t N, int64_t IN, int64_t OUT))
/* dst[r * ld + c] = the BF16 bits of src[r * cols + c] (round to nearest even). */
FP4RL_OP(fp4rl_status, pack_bf16, (fp4rl_context *ctx, uint16_t *dst, int64_t ld, const float *src, int64_t rows,
         int64_t cols))
/* linear_backward on BF16 operands (bit patterns; dy_db stays FP32): FP32 products and sums. */
FP4RL_OP(fp4rl_status, linear_backward_bf16, (fp4rl_context *ctx, float *dx, float *dw, float *db,
         const uint16_t *dy_dx, const uint16_t *w_dx, const uint16_t *dy_dw, const uint16_t *x_dw, const float *dy_db,
         int64_t N, int64_t IN, int64_t OUT))

#undef FP4RL_OP
