/*
 * decode_w4b.h - the packed-weight GEMM with BF16 activations (issue 16): C [M, N] (FP32) = X W^T
 * (+ bias) for X [M, K] BF16 (row-major, the rollout's fused operand: BF16 or the BF16-widened
 * FP4 quantization, ResQ's 2N rows included) and W [N, K] HiF4 or MXFP4 read in its packed form
 * (4-bit codes + HiF4 words / E8M0 scales, as fp4rl_quantize stores them, or re-laid out by
 * fp4rl_cuda_w4b_pack) or NVFP4 re-laid out (codes + UE4M3 scales, the tensor scale g as the
 * epilogue's alpha: C = g (X V^T) + bias, V = e2m1 s_b) - no BF16 copy of W.
 *
 * Exactness: every weight value is dequantized in registers to its exact BF16 value (HiF4: k 2^inc
 * base / 4, 6 significant bits at most; MXFP4: e2m1 2^(e - 127); NVFP4: e2m1 s_b 2^-10, the 2^10
 * folded into alpha, format/w4b_layout.h), the very words the rollout's BF16
 * copy of W holds (pack_bf16 of the dequantized weight), and multiplied on the BF16 tensor cores
 * with FP32 accumulation: the products are those of linear_forward_bf16 over that copy, summed in
 * another order (per output, one K slice: k ascending in 16-k MMA steps; split-K: the slices'
 * FP32 partials added in slice order, by the tile's last CTA or, for larger M, a second kernel).
 * Deterministic: no atomics on values, the split fixed by the shapes and the device.
 *
 * Kernel: Hopper wgmma m64nNk16 BF16 with the weights as the register-sourced A (64 weight rows a
 * warpgroup tile) and the activations as the shared-memory B (N = 32, 64 or 128 activation rows
 * a CTA, 128-byte swizzled, K-major), two warpgroups of one or two m64 tiles each (128 or 256
 * weight rows a CTA), a cp.async ring of 64-k chunks (8 stages for 32-64 activation rows, 4 for
 * 128), the next step's weights dequantized while the current step's MMAs run (wait_group 1).
 * A weight re-laid out by fp4rl_cuda_w4b_pack (below) takes the same path with its own dequantizer.
 *
 * Limits (FP4RL_ERR_UNSUPPORTED with a message otherwise, so a caller can fall back): a compute
 * capability 9.0 device and a build with sm_90a code; W 2D HiF4 (1D or 2D words), MXFP4 (1D
 * along K or 32 x 32 tiles) or NVFP4 re-laid out (1D along K or 16 x 16 tiles), K % 64 == 0; M >= 1; N, K, M < 2^31; x 16-byte aligned; c [M, ldc]
 * with ldc >= N.
 */
#ifndef FP4RL_CUDA_DECODE_W4B_H
#define FP4RL_CUDA_DECODE_W4B_H

#ifdef __cplusplus
#include "cuda_internal.h"
#else
#include "runtime/internal.h" /* C callers (the tests): the declarations only */
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Re-lays a HiF4 weight out in place for fp4rl_cuda_w4b_gemm (w->layout = FP4RL_LAYOUT_W4B): the
 * codes as [64-row tile][64-k chunk][warp 4][lane 32][16 bytes], one 16-byte piece the codes of a
 * thread's wgmma A fragments for the chunk (offset-binary levels), and the words as [tile][chunk]
 * [64 rows in fragment order], their bits arranged for the fragments' increments (decode_w4b.cu,
 * wp_word); rows padded to 64. Same bytes a weight (4.5 bits), the GEMM's results bit for bit those
 * of the weight as stored; such a weight serves only fp4rl_cuda_w4b_gemm. MXFP4 likewise (the codes
 * as they are, a word of two BF16 multipliers a row and chunk: 4.5 bits a weight) where every scale
 * code is at most FP4RL_W4B_MX_MAX_SCALE (one 4-byte download to know), else left as stored; a
 * weight already re-laid out is left too (format/w4b_layout.h has both layouts). The weight's
 * memory must be the library's own. NVFP4 always (the codes as they are, zero-scale blocks' codes
 * zeroed; a word of the four 16-k blocks' multiplier bytes a row and chunk: 4.5 bits a weight). */
fp4rl_status fp4rl_cuda_w4b_pack(fp4rl_context *ctx, fp4rl_tensor *w);

/* Whether fp4rl_cuda_w4b_gemm can run W on this context's device and build (no message set). */
int fp4rl_cuda_w4b_ok(fp4rl_context *ctx, const fp4rl_tensor *w);

/* c = x w^T (+ bias [N], NULL for none). slices: 0 chooses the K split from the shapes and the
 * device; n > 0 forces n slices (clamped to the number of 64-k chunks). */
fp4rl_status fp4rl_cuda_w4b_gemm(fp4rl_context *ctx, float *c, int64_t ldc, const uint16_t *x, int64_t M, const fp4rl_tensor *w,
                                 const float *bias, int slices);

#ifdef __cplusplus
}
#endif

#endif /* FP4RL_CUDA_DECODE_W4B_H */
