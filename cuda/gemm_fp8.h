/*
 * gemm_fp8.h - HiF4 x HiF4 and MXFP4 x MXFP4 products through FP8 (E4M3) operands (issue 17).
 *
 * Both formats' elements times their sub-unit power-of-two factors are small integers, exact in
 * E4M3 once scaled by 4 (HiF4: k * 2^inc, k <= 7, inc <= 2, so |v| <= 28) or by 2 (MXFP4's E2M1:
 * 2 * {0, .5, 1, 1.5, 2, 3, 4, 6}, |v| <= 12). A pre-pass writes each operand as E4M3 bytes
 * [rows, K] and one FP32 scale per unit (HiF4: base / 4, U = 64; MXFP4: 2^e / 2, U = 32) in the
 * scale layout below. A unit's partial sum of E4M3 products is a sum of at most 64 integers below
 * 2^10, so it is exact in FP32; the only roundings are the promotion acc += p * (sa * sb)
 * (sa * sb itself is exact away from under/overflow: 3 + 3 significant bits) and the final store.
 * Bound per output, S = sum_k |a_k b_k|: |C - C_exact| <= (2 K / U + 2) 2^-24 S, plus 2^-9 S for
 * a BF16 C (the CPU's FP32 GEMM over the dequantized operands has a bound of the same form with
 * K in place of 2 K / U).
 *
 * Kernels: `ref`, one output a thread on the CUDA cores doing exactly this math (unit partials
 * promoted in K order), taken under FP4RL_FP8_GEMM=ref; `tc`, warp-level mma.sync m16n8k32
 * E4M3 (sm_89+), 128 x 128 CTA tiles, the same per-unit partials and promotions, taken under
 * FP4RL_FP8_GEMM=1 where fp4rl_cuda_fp8_tc_ok holds; on sm_90a builds run on an H100 / H200 that
 * entry takes a wgmma kernel (fp4rl_cuda_fp8_gemm_wg) where K % 128 == 0 (issue 17, part 2). Unset (the default) keeps the old BF16 path:
 * the tensor-core kernel is exact but slower than it on the H200 (bench/RESULTS.md, session 11).
 */
#ifndef FP4RL_CUDA_GEMM_FP8_H
#define FP4RL_CUDA_GEMM_FP8_H

#ifdef __cplusplus
#include "cuda_internal.h"
#else
#include "runtime/internal.h" /* C callers (the tests): the declarations only */
#endif
#include "format/layout.h" /* FP4RL_FP8_SCALE_LD */

/* The unit-scale layout: FP4RL_FP8_SCALE_LD (format/layout.h, its one owner, which the CPU's W4A4
 * ops share). The buffer takes fp4rl_cuda_fp8_scales_bytes(rows, K, U) bytes, 16-byte aligned. */
static inline size_t fp4rl_cuda_fp8_scales_bytes(int64_t rows, int64_t K, int U) { return (size_t)((K / U) * FP4RL_FP8_SCALE_LD(rows)) * 4; }

#ifdef __cplusplus
extern "C" { /* C linkage: the C tests (test_decode_fp8) call the pre-pass and the reference */
#endif

/* Whether C = A B^T for these operands can take the FP8 path (format pair, 1D along K or MXFP4
 * 32 x 32 tiles, K % U == 0) and the env / device select it. */
int fp4rl_cuda_fp8_gemm_wanted(fp4rl_context *ctx, const fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b);

/* C = A B^T through the pre-pass and the kernel chosen by FP4RL_FP8_GEMM (only when wanted). */
fp4rl_status fp4rl_cuda_fp8_gemm(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b);

/* Pieces for the test and the bench: the unit of a format (0: not an FP8-path format), the
 * pre-pass of one operand into caller buffers (e4m3 [rows, K]; scales [K / U][FP4RL_FP8_SCALE_LD(rows)],
 * see above), and the
 * reference kernel on pre-passed operands (c: F32 when c_bf16 == 0, else BF16). */
int fp4rl_cuda_fp8_unit(const fp4rl_tensor *t);
fp4rl_status fp4rl_cuda_fp8_prepass(fp4rl_context *ctx, const fp4rl_tensor *t, uint8_t *e4m3, float *scales);
fp4rl_status fp4rl_cuda_fp8_gemm_ref(fp4rl_context *ctx, const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb,
                                     void *c, int c_bf16, int64_t M, int64_t N, int64_t K, int U);
/* The tensor-core kernel (mma.sync m16n8k32 E4M3, sm_89+; K % 64 == 0), same math and contract
 * as the reference; and its gate (sm_89+, M >= 512, N >= 128, K >= 128, K % 64 == 0). */
int fp4rl_cuda_fp8_tc_ok(fp4rl_context *ctx, int64_t M, int64_t N, int64_t K);
/* The tensor-core entry: the wgmma kernel where fp4rl_cuda_fp8_wg_ok holds, else the mma.sync one. */
fp4rl_status fp4rl_cuda_fp8_gemm_tc(fp4rl_context *ctx, const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb, void *c,
                                    int c_bf16, int64_t M, int64_t N, int64_t K, int U);
/* The mma.sync m16n8k32 kernel alone (sm_89+, K % 64 == 0). */
fp4rl_status fp4rl_cuda_fp8_gemm_mma(fp4rl_context *ctx, const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb, void *c,
                                     int c_bf16, int64_t M, int64_t N, int64_t K, int U);
/* The wgmma kernel (wgmma.mma_async m64n128k32 E4M3 from TMA-loaded 128-byte-swizzled shared
 * memory, a producer warp and two consumer warpgroups, 128 x 128 CTA tiles; same per-unit math
 * and contract): its gate (compute capability 9.0 with sm_90a code in the build, the driver's
 * tensor-map encoder, M >= 128, N >= 128, K >= 128, K % 128 == 0, FP4RL_FP8_WG not "0"; ragged
 * M and N are fine; sa, sb, a8, b8 16-byte aligned) and the kernel alone (FP4RL_ERR_UNSUPPORTED
 * where the gate fails). FP4RL_FP8_WG_PIPE=1 selects its pipelined consumer loop (each job's
 * wgmmas issued before the previous job's promotion; same results), read at every launch. */
int fp4rl_cuda_fp8_wg_ok(fp4rl_context *ctx, int64_t M, int64_t N, int64_t K);
/* Whether the device is compute capability 9.0 and this build carries sm_90a code for it (the
 * wgmma kernels' bodies: fp8_wg_kernel here, decode_fp8.cu's FP4RL_D8_WGMMA kernel): a probe
 * kernel's answer, asked once per process (0 while a stream captures, before the first answer). */
int fp4rl_cuda_has_sm90a(fp4rl_context *ctx);
fp4rl_status fp4rl_cuda_fp8_gemm_wg(fp4rl_context *ctx, const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb, void *c,
                                    int c_bf16, int64_t M, int64_t N, int64_t K, int U);

#ifdef __cplusplus
}
#endif

#endif /* FP4RL_CUDA_GEMM_FP8_H */
