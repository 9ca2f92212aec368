/*
 * decode_packed.h - the decode GEMM on re-laid-out FP4 weights (cuda/decode_packed.cu), callable
 * from C. Internal to the library (hidden symbols; reach them through the static archive).
 *
 *   y[M, N] = alpha * x[M, K] * dequant(W[N, K])^T + bias
 *
 * W is MXFP4, NVFP4 or HiF4 with its blocks along K (1D, or 2D tiles), re-laid out once by
 * fp4rl_cuda_dg_prepare (per weight sync in the rollout) into records that load straight into
 * BF16 mma.sync fragments (cuda/decode_layout.h). x is BF16 and exact: the activation operand of
 * the rollout's fused path. The products are those of the generic path (dequantized operands in
 * an FP32 GEMM); only the FP32 summation order differs. ResQ: x is [M, 2K] = [Q(x) | S(Q(R))] and
 * every weight record is read once for both halves.
 */
#ifndef FP4RL_DECODE_PACKED_H
#define FP4RL_DECODE_PACKED_H

#include <stdint.h>

#include "fp4rl/fp4rl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A prepared weight (device memory of the context it was made in). */
typedef struct fp4rl_dg_layout fp4rl_dg_layout;

/* From a quantized 2-dim tensor w [N, K] (MXFP4, NVFP4 or HiF4, 1D or 2D tiles) of a CUDA context.
 * FP4RL_ERR_UNSUPPORTED (with a message) for another dtype or shape (K must be a multiple of 8),
 * or for scales whose range no exponent offset keeps exact (fp4rl_dg_pick_d); the caller then keeps
 * its generic path. Synchronizes once (the largest scale comes back to the host). */
fp4rl_status fp4rl_cuda_dg_prepare(fp4rl_context *ctx, const fp4rl_tensor *w, fp4rl_dg_layout **out);
/* The same from raw device buffers in fp4rl's quantized layout (fp4rl.h, "Quantized tensors"):
 * codes [N, row_bytes], scales with scale_cols per scale row, NVFP4's tensor scale g (1 for others). */
fp4rl_status fp4rl_cuda_dg_prepare_raw(fp4rl_context *ctx, fp4rl_dtype fmt, int tile, int64_t N, int64_t K, const void *codes,
                                       int64_t row_bytes, const void *scales, int64_t scale_cols, float tensor_scale,
                                       fp4rl_dg_layout **out);
void fp4rl_cuda_dg_destroy(fp4rl_context *ctx, fp4rl_dg_layout *L);

/* y [M, N] FP32 (row-major, overwritten) = x * W^T (+ bias[N] if not NULL), x BF16 [M, K], or
 * [M, 2K] with resq (both halves times the same W), all device pointers of ctx, on its stream.
 * M >= 1, any size (rows beyond 128 go to further blocks of the grid). */
fp4rl_status fp4rl_cuda_dg_run(fp4rl_context *ctx, float *y, const uint16_t *x, int64_t M, int resq, const fp4rl_dg_layout *L,
                               const float *bias);
/* The same with the launch shape forced (the benchmark's sweep): warps per CTA (4 or 8; 0: auto)
 * and split-K slices (1..8, a thread-block cluster reduces them; 0: auto). */
fp4rl_status fp4rl_cuda_dg_run_cfg(fp4rl_context *ctx, float *y, const uint16_t *x, int64_t M, int resq, const fp4rl_dg_layout *L,
                                   const float *bias, int warps, int slices);

/* What a prepared weight is: its format, shape, device bytes and exponent offset d
 * (decode_layout.h; alpha = 2^d, times g for NVFP4). Any pointer may be NULL. */
void fp4rl_cuda_dg_info(const fp4rl_dg_layout *L, fp4rl_dtype *fmt, int64_t *N, int64_t *K, size_t *bytes, int *d);

#ifdef __cplusplus
}
#endif

#endif /* FP4RL_DECODE_PACKED_H */
