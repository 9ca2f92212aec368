/*
 * decode_fp8.h - the W4A4 decode GEMM on the FP8 tensor cores (issue 16): C[M, N] = A8 W^T for
 * M = 1..256 activation rows against a HiF4 or MXFP4 weight W [N, K] read in its packed form
 * (4-bit codes + HiF4 words / E8M0 scales) straight from global memory, and the activation
 * quantizer that writes this GEMM's operand.
 *
 * Operands follow gemm_fp8.h: A8 [M, K] E4M3 bytes with FP32 unit scales in the unit-major layout
 * FP4RL_FP8_SCALE_LD(M) (HiF4: base / 4 for U = 64; MXFP4: 2^e / 2 for U = 32). The kernel turns
 * W's codes into the same E4M3 bytes and scales the pre-pass (fp4rl_cuda_fp8_prepass) would
 * write, in registers, and computes each output as gemm_fp8.cu's reference does: per unit an
 * exact partial sum p of E4M3 products, promoted acc = acc + p * (sa * sw) in K order. So with one
 * K slice the result is bit for bit fp4rl_cuda_fp8_gemm_ref on the pre-passed operands; with
 * split-K (slices > 1) each slice promotes its units in order and the slices' FP32 partials are
 * added in slice order (deterministic), within gemm_fp8.h's bound plus one rounding per slice.
 *
 * Limits (FP4RL_ERR_UNSUPPORTED with a message otherwise, so callers can fall back): sm_89+ and a
 * build with sm_89+ code, W HiF4 (1D or 2D words) or MXFP4 (1D along K or 32 x 32 tiles), K % U ==
 * 0, 1 <= M <= 256, N, K < 2^31, 16-byte aligned a8 / codes; C FP32 (c_bf16 0) or BF16, [M, ldc].
 */
#ifndef FP4RL_CUDA_DECODE_FP8_H
#define FP4RL_CUDA_DECODE_FP8_H

#ifdef __cplusplus
#include "cuda_internal.h"
#else
#include "runtime/internal.h" /* C callers (the tests): the declarations only */
#endif

#define FP4RL_D8_MAX_M 256

#ifdef __cplusplus
extern "C" {
#endif

/* C = A8 W^T. slices: 0 chooses the K split (1 where the grid already fills the GPU), n > 0
 * forces n slices (clamped to the number of 128-k chunks); 1 is the bit-exact single pass. */
fp4rl_status fp4rl_cuda_d8_gemm(fp4rl_context *ctx, const uint8_t *a8, const float *sa, int64_t M, const fp4rl_tensor *w, void *c,
                                int c_bf16, int64_t ldc, int slices);

/* The persistent variant (opt-in: FP4RL_D8_PERSIST=1, read at every call; cuda/decode_fp8.cu,
 * d8p_kernel): the weight re-laid out once per weight sync into tiles a bulk copy each.
 * fp4rl_cuda_d8_relayout allocates *out on ctx (free it with ctx's backend free, i.e.
 * fp4rl_cuda_free_bytes) holding fp4rl_cuda_d8_relayout_bytes(w) bytes (*bytes when not NULL)
 * and fills it from w (w's checks as fp4rl_cuda_d8_gemm's; rerun it whenever w's values change).
 * fp4rl_cuda_d8_gemm_tiles is fp4rl_cuda_d8_gemm with the re-laid-out weight beside w: with
 * FP4RL_D8_PERSIST=1, M <= 64, an sm_90+ device and sm_90+ code in the build it runs the
 * persistent kernel (same contract: one slice gives fp4rl_cuda_d8_gemm's one-slice bits, split-K
 * the same bound; slices 0 picks its own split, at most 32); otherwise exactly
 * fp4rl_cuda_d8_gemm (tiles unused). */
size_t fp4rl_cuda_d8_relayout_bytes(const fp4rl_tensor *w);
fp4rl_status fp4rl_cuda_d8_relayout(fp4rl_context *ctx, const fp4rl_tensor *w, void **out, size_t *bytes);
fp4rl_status fp4rl_cuda_d8_gemm_tiles(fp4rl_context *ctx, const uint8_t *a8, const float *sa, int64_t M, const fp4rl_tensor *w,
                                      const void *tiles, void *c, int c_bf16, int64_t ldc, int slices);

/* The activation operand of fp4rl_cuda_d8_gemm, from FP32 x [N, K] (row-major): each row quantized
 * along K (fmt FP4RL_DTYPE_HIF4 or FP4RL_DTYPE_MXFP4, nearest; truncation_free picks MX's scale
 * rule) and written as E4M3 bytes out [rows, Kp] (Kp = K rounded up to the unit; padding bytes
 * 0) and unit scales [Kp / U][FP4RL_FP8_SCALE_LD(rows)] (padding rows 0; NaN units: codes 0, scale
 * the NaN 0x7fc00000) - the bytes and scales of fp4rl_quantize then the pre-pass. resq
 * FP4RL_RESQ_DENSE / FP4RL_RESQ_2_4: rows = 2N, rows N.. hold the quantized residual of
 * rollout_act (cuda/ops_rollout_fast.cu): x - Q(x) quantized afresh, and for 2:4 the elements the
 * mask drops written as 0x00 (the unit keeps its scale), so bytes * scale are rollout_act's values.
 * counts (NULL or 2 counters): += nonzero inputs, += those that quantized to 0, as rollout_act. */
fp4rl_status fp4rl_cuda_act_e4m3(fp4rl_context *ctx, uint8_t *out, float *scales, const float *x, int64_t N, int64_t K, int fmt,
                                 int truncation_free, int resq, unsigned long long *counts);

#ifdef __cplusplus
}
#endif

#endif /* FP4RL_CUDA_DECODE_FP8_H */
