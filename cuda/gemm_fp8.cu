/*
 * gemm_fp8.cu - the FP8-operand path of HiF4 x HiF4 and MXFP4 x MXFP4 GEMMs (see gemm_fp8.h for
 * the math and the error bound). Pre-pass: quantized codes -> E4M3 bytes + FP32 unit scales.
 * Reference kernel: per-unit exact partial sums promoted into an FP32 accumulator with the two
 * scales, in K order; the fast wgmma kernel must reproduce its products and partials exactly.
 */
#include <stdlib.h>
#include <string.h>

#include "gemm_fp8.h"
#include "format/formats.h"
#include "format/layout.h"
#include "format/traits.h"

namespace {

/* E4M3 byte of a small signed integer-valued float (|v| <= 28, so exact: 3 significant bits). */
__device__ __forceinline__ uint8_t e4m3_exact(float v) { return fp4rl_e4m3_encode(v, -1.0f); }

/* One thread per (row, unit): the unit's U codes become E4M3 bytes, its scale one float. The
 * pre-pass is memory-bound and tiny next to the GEMM; it is not tuned yet. */
__global__ void prepass_hif4_kernel(const uint8_t *codes, const uint32_t *words, int64_t rows, int64_t K, int64_t row_bytes,
                                    int64_t scale_cols, uint8_t *out, float *scales)
{
    const int64_t units = K / FP4RL_HIF4_UNIT;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * units) return;
    const int64_t r = t / units, u = t - r * units;
    const uint32_t w = words[fp4rl_hif4_word_index(scale_cols, r, u * FP4RL_HIF4_UNIT)];
    /* base / 4: the element value k / 4 is stored as k (times 2^inc); NaN word -> NaN scale */
    scales[r * units + u] = fp4rl_hif4_word_base_bits(w) == FP4RL_HIF4_NAN_WORD ? fp4rl_bits_f32(0x7fc00000u)
                                                                                 : fp4rl_hif4_word_base(w) * 0.25f;
    for (int j = 0; j < FP4RL_HIF4_UNIT; j++) {
        const int64_t k = u * FP4RL_HIF4_UNIT + j;
        const uint8_t code = fp4rl_code_get(codes, row_bytes, 4, r, k);
        const float m = (float)(code & 7u) * (float)(1 << fp4rl_hif4_word_inc(w, j));
        out[r * K + k] = e4m3_exact((code & 8u) ? -m : m);
    }
}

__global__ void prepass_mxfp4_kernel(const uint8_t *codes, const uint8_t *sc, int64_t rows, int64_t K, int64_t row_bytes,
                                     int64_t scale_cols, int tile, uint8_t *out, float *scales)
{
    const int U = 32;
    const int64_t units = K / U;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * units) return;
    const int64_t r = t / units, u = t - r * units;
    /* 2^e / 2: the E2M1 value v is stored as 2 v (an integer <= 12) */
    scales[r * units + u] = fp4rl_e8m0_decode(sc[fp4rl_scale_index(tile, U, scale_cols, r, u * U)]) * 0.5f;
    for (int j = 0; j < U; j++) {
        const int64_t k = u * U + j;
        out[r * K + k] = e4m3_exact(2.0f * fp4rl_e2m1_decode(fp4rl_code_get(codes, row_bytes, 4, r, k)));
    }
}

/* One output a thread: for each unit, p = sum of E4M3 products (exact in FP32), then
 * acc += p * (sa * sb) in K order. Same math as the wgmma kernel's promotion. */
template <typename TC>
__global__ void __launch_bounds__(256) fp8_ref_kernel(const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb, TC *c,
                                                      int64_t M, int64_t N, int64_t K, int U)
{
    const int64_t n = (int64_t)blockIdx.x * 16 + (threadIdx.x & 15), m = (int64_t)blockIdx.y * 16 + (threadIdx.x >> 4);
    if (m >= M || n >= N) return;
    const int64_t units = K / U;
    const uint8_t *pa = a8 + m * K, *pb = b8 + n * K;
    float acc = 0.0f;
    for (int64_t u = 0; u < units; u++) {
        float p = 0.0f;
        for (int j = 0; j < U; j++) p += fp4rl_e4m3_decode(pa[u * U + j]) * fp4rl_e4m3_decode(pb[u * U + j]);
        acc += p * (sa[m * units + u] * sb[n * units + u]);
    }
    if (sizeof(TC) == 2) reinterpret_cast<uint16_t *>(c)[m * N + n] = fp4rl_f32_to_bf16(acc);
    else reinterpret_cast<float *>(c)[m * N + n] = acc;
}

/* FP4RL_FP8_GEMM: unset / "1" -> the fast kernel when present (not yet: old path), "0" -> old
 * path, "ref" -> the reference kernel. */
int fp8_mode(void)
{
    const char *e = getenv("FP4RL_FP8_GEMM");
    if (e && strcmp(e, "ref") == 0) return 2;
    if (e && strcmp(e, "0") == 0) return 0;
    return 1;
}

} // namespace

int fp4rl_cuda_fp8_unit(const fp4rl_tensor *t)
{
    if (t->dtype == FP4RL_DTYPE_HIF4) return FP4RL_HIF4_UNIT; /* 1D and 2D keep one word per 64 of a row */
    if (t->dtype == FP4RL_DTYPE_MXFP4 && (t->q.tile == 0 || t->q.tile == 32)) return 32;
    return 0;
}

fp4rl_status fp4rl_cuda_fp8_prepass(fp4rl_context *ctx, const fp4rl_tensor *t, uint8_t *e4m3, float *scales)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    const int U = fp4rl_cuda_fp8_unit(t);
    const int64_t rows = t->q.rows, K = t->q.cols;
    if (!U || K % U) return FP4RL_ERR_UNSUPPORTED;
    const int64_t n = rows * (K / U);
    const unsigned blocks = (unsigned)((n + 255) / 256);
    if (t->dtype == FP4RL_DTYPE_HIF4)
        prepass_hif4_kernel<<<blocks, 256, 0, cu->stream>>>(static_cast<const uint8_t *>(t->data), static_cast<const uint32_t *>(t->scales),
                                                            rows, K, t->q.row_bytes, t->q.scale_cols, e4m3, scales);
    else
        prepass_mxfp4_kernel<<<blocks, 256, 0, cu->stream>>>(static_cast<const uint8_t *>(t->data), static_cast<const uint8_t *>(t->scales),
                                                             rows, K, t->q.row_bytes, t->q.scale_cols, t->q.tile, e4m3, scales);
    return fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: FP8 pre-pass");
}

fp4rl_status fp4rl_cuda_fp8_gemm_ref(fp4rl_context *ctx, const uint8_t *a8, const float *sa, const uint8_t *b8, const float *sb,
                                     void *c, int c_bf16, int64_t M, int64_t N, int64_t K, int U)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    const dim3 grid((unsigned)((N + 15) / 16), (unsigned)((M + 15) / 16));
    if (c_bf16) fp8_ref_kernel<<<grid, 256, 0, cu->stream>>>(a8, sa, b8, sb, static_cast<uint16_t *>(c), M, N, K, U);
    else fp8_ref_kernel<<<grid, 256, 0, cu->stream>>>(a8, sa, b8, sb, static_cast<float *>(c), M, N, K, U);
    return fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: FP8 reference GEMM");
}

int fp4rl_cuda_fp8_gemm_wanted(fp4rl_context *ctx, const fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b)
{
    (void)ctx;
    if (a->dtype != b->dtype || a->ndim != 2 || b->ndim != 2) return 0;
    if (c->dtype != FP4RL_DTYPE_F32 && c->dtype != FP4RL_DTYPE_BF16) return 0;
    const int U = fp4rl_cuda_fp8_unit(a);
    if (!U || U != fp4rl_cuda_fp8_unit(b) || a->q.cols != b->q.cols || a->q.cols % U) return 0;
    /* Only the reference kernel exists so far; the sm_90 / size gate (M >= 512, N >= 128,
     * K >= 128) belongs to the wgmma kernel. */
    return fp8_mode() == 2;
}

fp4rl_status fp4rl_cuda_fp8_gemm(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b)
{
    const int U = fp4rl_cuda_fp8_unit(a);
    const int64_t M = a->q.rows, N = b->q.rows, K = a->q.cols;
    void *a8 = NULL, *b8 = NULL, *sa = NULL, *sb = NULL;
    fp4rl_status st = fp4rl_cuda_alloc_bytes(ctx, &a8, (size_t)(M * K));
    if (!st) st = fp4rl_cuda_alloc_bytes(ctx, &b8, (size_t)(N * K));
    if (!st) st = fp4rl_cuda_alloc_bytes(ctx, &sa, (size_t)(M * (K / U)) * 4);
    if (!st) st = fp4rl_cuda_alloc_bytes(ctx, &sb, (size_t)(N * (K / U)) * 4);
    if (!st) st = fp4rl_cuda_fp8_prepass(ctx, a, static_cast<uint8_t *>(a8), static_cast<float *>(sa));
    if (!st) st = fp4rl_cuda_fp8_prepass(ctx, b, static_cast<uint8_t *>(b8), static_cast<float *>(sb));
    if (!st)
        st = fp4rl_cuda_fp8_gemm_ref(ctx, static_cast<const uint8_t *>(a8), static_cast<const float *>(sa), static_cast<const uint8_t *>(b8),
                                     static_cast<const float *>(sb), c->data, c->dtype == FP4RL_DTYPE_BF16, M, N, K, U);
    fp4rl_cuda_free_bytes(ctx, a8);
    fp4rl_cuda_free_bytes(ctx, b8);
    fp4rl_cuda_free_bytes(ctx, sa);
    fp4rl_cuda_free_bytes(ctx, sb);
    return st;
}
