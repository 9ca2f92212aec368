/*
 * gemm.cu - C = alpha * A * B^T on the GPU with FP32 accumulation, and fp4rl_matmul's
 * quantized-operand paths.
 *
 * Dense GEMMs go to cuBLASLt: BF16 x BF16 on the tensor cores when both operands are BF16 (the
 * products are exact in FP32), plain FP32 (CUBLAS_COMPUTE_32F, never TF32) otherwise, so the
 * result is the CPU's FP32 GEMM up to summation order. A small tiled kernel covers shapes for
 * which cuBLASLt offers no algorithm.
 *
 * Quantized operands: the FP4 formats dequantize exactly to BF16 (value(code) * scale has at most
 * 6 significant bits), so a quantized GEMM runs at BF16 tensor-core speed with the same products
 * as the CPU's F32 path; MXFP8 does too unless some value falls in BF16's subnormal range, which
 * the dequantize kernel detects (then F32). Decode-shaped products with a quantized B go to the
 * fused kernel of decode_gemm.cu.
 */
#include <string.h>

#include "cuda_internal.h"
#include "gemm_fp8.h"
#include "format/formats.h"
#include "format/traits.h"

namespace {

/* ---- fallback: a plain smem-tiled FP32 GEMM for any dtype mix -------------------------------- */
template <typename T> __device__ __forceinline__ float as_f32(T v);
template <> __device__ __forceinline__ float as_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float as_f32<uint16_t>(uint16_t v) { return fp4rl_bf16_to_f32(v); }

constexpr int FT = 32; /* tile edge; 16 x 16 threads, 2 x 2 outputs each */

template <typename TA, typename TB, typename TC>
__global__ void __launch_bounds__(256) gemm_fallback_kernel(const TA *a, const TB *b, TC *c, int64_t M, int64_t N, int64_t K, float alpha,
                                                            int64_t tiles_n)
{
    __shared__ float sa[FT][FT + 1], sb[FT][FT + 1];
    const int64_t bm = blockIdx.x / tiles_n, bn = blockIdx.x - bm * tiles_n;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    for (int64_t k0 = 0; k0 < K; k0 += FT) {
        for (int i = threadIdx.x; i < FT * FT; i += 256) {
            const int r = i / FT, k = i % FT;
            const int64_t gm = bm * FT + r, gn = bn * FT + r, gk = k0 + k;
            sa[r][k] = (gm < M && gk < K) ? as_f32(a[gm * K + gk]) : 0.0f;
            sb[r][k] = (gn < N && gk < K) ? as_f32(b[gn * K + gk]) : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < FT; k++)
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) acc[i][j] += sa[ty + 16 * i][k] * sb[tx + 16 * j][k];
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int64_t m = bm * FT + ty + 16 * i, n = bn * FT + tx + 16 * j;
            if (m >= M || n >= N) continue;
            const float v = alpha * acc[i][j];
            if (sizeof(TC) == 2) reinterpret_cast<uint16_t *>(c)[m * N + n] = fp4rl_f32_to_bf16(v);
            else reinterpret_cast<float *>(c)[m * N + n] = v;
        }
}

template <typename TA, typename TB>
void fallback_c(const void *a, const void *b, void *c, int c_bf16, int64_t M, int64_t N, int64_t K, float alpha, cudaStream_t s)
{
    const int64_t tn = (N + FT - 1) / FT, blocks = ((M + FT - 1) / FT) * tn;
    if (c_bf16)
        gemm_fallback_kernel<<<(unsigned)blocks, 256, 0, s>>>(static_cast<const TA *>(a), static_cast<const TB *>(b), static_cast<uint16_t *>(c), M, N, K, alpha, tn);
    else
        gemm_fallback_kernel<<<(unsigned)blocks, 256, 0, s>>>(static_cast<const TA *>(a), static_cast<const TB *>(b), static_cast<float *>(c), M, N, K, alpha, tn);
}

/* ---- dtype conversion kernels ---- */
__global__ void bf16_to_f32_kernel(const uint16_t *in, float *out, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fp4rl_bf16_to_f32(in[i]);
}
__global__ void f32_to_bf16_kernel(const float *in, uint16_t *out, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fp4rl_f32_to_bf16(in[i]);
}

/* ---- cuBLASLt ---- */
void destroy_plan(fp4rl_cuda_plan *pl)
{
    const fp4rl_cublaslt *api = fp4rl_cublaslt_api();
    if (!pl->valid) return;
    api->layout_destroy(pl->la);
    api->layout_destroy(pl->lb);
    api->layout_destroy(pl->lc);
    api->desc_destroy(pl->desc);
    pl->valid = 0;
}

/* The plan of a row-major GEMM (fp4rl_cuda_gemm_shape). cuBLASLt is column-major: row-major C is
 * column-major C^T[N, M] = op(B)^T op(A)^T, so its "A" is our B and its "B" our A. A row-major
 * [R, C] matrix is a column-major [C, R] one with the same leading dim: our B stored [K, N] is
 * already op(B)^T (no transpose), stored [N, K] it needs one; our A stored [M, K] is op(A)^T, stored
 * [K, M] it needs one. C = A B^T (ta = 0, tb = 1) is the TN layout every tensor-core kernel has. */
bool same_shape(const fp4rl_cuda_gemm_shape *x, const fp4rl_cuda_gemm_shape *y)
{
    return x->ta == y->ta && x->tb == y->tb && x->m == y->m && x->n == y->n && x->k == y->k && x->lda == y->lda &&
           x->ldb == y->ldb && x->ldc == y->ldc && x->batch == y->batch && x->sa == y->sa && x->sb == y->sb &&
           x->sc == y->sc && x->ab_type == y->ab_type && x->c_type == y->c_type;
}

int make_layout(cublasLtMatrixLayout_t *l, int type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride)
{
    const fp4rl_cublaslt *api = fp4rl_cublaslt_api();
    if (api->layout_create(l, (cudaDataType_t)type, (uint64_t)rows, (uint64_t)cols, ld) != CUBLAS_STATUS_SUCCESS) return 0;
    if (batch <= 1) return 1;
    const int count = (int)batch;
    return api->layout_set_attribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count) == CUBLAS_STATUS_SUCCESS &&
           api->layout_set_attribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride) == CUBLAS_STATUS_SUCCESS;
}

fp4rl_cuda_plan *get_plan(fp4rl_cuda *cu, const fp4rl_cuda_gemm_shape *g)
{
    const fp4rl_cublaslt *api = fp4rl_cublaslt_api();
    fp4rl_cuda_plan *victim = &cu->plans[0];
    for (int i = 0; i < FP4RL_CUDA_PLAN_CACHE; i++) {
        fp4rl_cuda_plan *pl = &cu->plans[i];
        if (pl->valid && same_shape(&pl->g, g)) {
            pl->stamp = ++cu->plan_clock;
            return pl;
        }
        if (!pl->valid || pl->stamp < victim->stamp) victim = pl; /* least recently used (or empty) */
        if (!victim->valid) break;
    }
    destroy_plan(victim);
    fp4rl_cuda_plan *pl = victim;
    memset(pl, 0, sizeof *pl);
    const cublasOperation_t ta = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (api->desc_create(&pl->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return NULL;
    api->desc_set_attribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    api->desc_set_attribute(pl->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    int ok = make_layout(&pl->la, g->ab_type, g->tb ? g->k : g->n, g->tb ? g->n : g->k, g->ldb, g->batch, g->sb);
    ok = ok && make_layout(&pl->lb, g->ab_type, g->ta ? g->m : g->k, g->ta ? g->k : g->m, g->lda, g->batch, g->sa);
    ok = ok && make_layout(&pl->lc, g->c_type, g->n, g->m, g->ldc, g->batch, g->sc);
    pl->valid = 1; /* destroy_plan can now release whatever was made */
    if (!ok) {
        destroy_plan(pl);
        return NULL;
    }
    cublasLtMatmulPreference_t pref;
    if (api->pref_create(&pref) == CUBLAS_STATUS_SUCCESS) {
        size_t ws = cu->lt_workspace_bytes;
        api->pref_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        cublasLtMatmulHeuristicResult_t res;
        int count = 0;
        if (api->algo_get_heuristic(cu->lt, pl->desc, pl->la, pl->lb, pl->lc, pl->lc, pref, 1, &res, &count) == CUBLAS_STATUS_SUCCESS &&
            count > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
            pl->algo = res.algo;
            pl->has_algo = 1;
        }
        api->pref_destroy(pref);
    }
    pl->g = *g;
    pl->stamp = ++cu->plan_clock;
    return pl;
}

int lt_gemm(fp4rl_cuda *cu, int64_t M, int64_t N, int64_t K, const void *a, const void *b, cudaDataType_t ab, void *c,
            cudaDataType_t ct, float alpha)
{
    return fp4rl_cuda_lt_gemm(cu, M, N, K, a, b, ab, c, ct, alpha, 0.0f);
}

/* A dense operand in device memory: dtype F32 or BF16. */
struct Operand {
    const void *p;
    fp4rl_dtype dt;
};

fp4rl_status to_f32(fp4rl_context *ctx, const void *in, int64_t n, void **out)
{
    fp4rl_status st = fp4rl_cuda_alloc_bytes(ctx, out, (size_t)n * 4);
    if (st) return st;
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    bf16_to_f32_kernel<<<fp4rl_cuda_blocks(n, 256), 256, 0, cu->stream>>>(static_cast<const uint16_t *>(in), static_cast<float *>(*out), n);
    return fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: BF16 -> F32");
}

/* c[M,N] = alpha * a * b^T for dense operands, written as c_dt. */
fp4rl_status gemm_dense(fp4rl_context *ctx, int64_t M, int64_t N, int64_t K, Operand a, Operand b, void *c, fp4rl_dtype c_dt, float alpha)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    fp4rl_status st = fp4rl_cuda_enter(ctx);
    if (st) return st;
    const int c_bf16 = c_dt == FP4RL_DTYPE_BF16;
    if (a.dt == FP4RL_DTYPE_BF16 && b.dt == FP4RL_DTYPE_BF16) {
        if (lt_gemm(cu, M, N, K, a.p, b.p, CUDA_R_16BF, c, c_bf16 ? CUDA_R_16BF : CUDA_R_32F, alpha))
            return fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: cuBLASLt BF16 GEMM");
        fallback_c<uint16_t, uint16_t>(a.p, b.p, c, c_bf16, M, N, K, alpha, cu->stream);
        return fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: fallback GEMM");
    }
    /* FP32 GEMM: widen BF16 operands (exact), and go through an F32 C for a BF16 output */
    void *ta = NULL, *tb = NULL, *tc = NULL;
    const void *fa = a.p, *fb = b.p;
    void *fc = c;
    if (a.dt == FP4RL_DTYPE_BF16) st = to_f32(ctx, a.p, M * K, &ta), fa = ta;
    if (!st && b.dt == FP4RL_DTYPE_BF16) st = to_f32(ctx, b.p, N * K, &tb), fb = tb;
    if (!st && c_bf16) st = fp4rl_cuda_alloc_bytes(ctx, &tc, (size_t)(M * N) * 4), fc = tc;
    if (!st) {
        if (lt_gemm(cu, M, N, K, fa, fb, CUDA_R_32F, fc, CUDA_R_32F, alpha)) {
            st = fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: cuBLASLt FP32 GEMM");
        } else {
            fallback_c<float, float>(fa, fb, fc, 0, M, N, K, alpha, cu->stream);
            st = fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: fallback GEMM");
        }
    }
    if (!st && c_bf16) {
        f32_to_bf16_kernel<<<fp4rl_cuda_blocks(M * N, 256), 256, 0, cu->stream>>>(static_cast<const float *>(tc), static_cast<uint16_t *>(c), M * N);
        st = fp4rl_cuda_check_launch(ctx, "fp4rl_matmul: F32 -> BF16");
    }
    fp4rl_cuda_free_bytes(ctx, ta);
    fp4rl_cuda_free_bytes(ctx, tb);
    fp4rl_cuda_free_bytes(ctx, tc);
    return st;
}

/* Whether a quantized format dequantizes (without NVFP4's g) exactly to BF16 always (the FP4
 * formats), or only when the values avoid BF16's subnormal range (MXFP8, checked at dequantization). */
int fp4_exact(fp4rl_dtype d) { return fp4rl_format_of(d).bf16_exact_unscaled; }

/* A GEMM operand from a tensor: dense as is, quantized dequantized (without NVFP4's g, returned
 * in *g) to BF16 when `want_bf16` and exact, else to F32. *tmp is the buffer to free. */
fp4rl_status operand(fp4rl_context *ctx, const fp4rl_tensor *t, int want_bf16, Operand *o, void **tmp, float *g)
{
    *tmp = NULL;
    *g = 1.0f;
    if (!fp4rl_dtype_is_quantized(t->dtype)) {
        o->p = t->data;
        o->dt = t->dtype;
        return FP4RL_OK;
    }
    *g = t->tensor_scale;
    const size_t n = (size_t)t->numel;
    fp4rl_status st;
    if (want_bf16) {
        st = fp4rl_cuda_alloc_bytes(ctx, tmp, n * 2);
        int inexact = 0;
        if (!st) st = fp4rl_cuda_dequantize_to(ctx, *tmp, FP4RL_DTYPE_BF16, t, 1, fp4_exact(t->dtype) ? NULL : &inexact);
        if (!st && !inexact) {
            o->p = *tmp;
            o->dt = FP4RL_DTYPE_BF16;
            return FP4RL_OK;
        }
        fp4rl_cuda_free_bytes(ctx, *tmp);
        *tmp = NULL;
        if (st) return st;
    }
    st = fp4rl_cuda_alloc_bytes(ctx, tmp, n * 4);
    if (!st) st = fp4rl_cuda_dequantize_to(ctx, *tmp, FP4RL_DTYPE_F32, t, 1, NULL);
    if (st) {
        fp4rl_cuda_free_bytes(ctx, *tmp);
        *tmp = NULL;
        return st;
    }
    o->p = *tmp;
    o->dt = FP4RL_DTYPE_F32;
    return FP4RL_OK;
}

/* BF16 operands are possible for this tensor: dense BF16, or quantized. */
int bf16_able(const fp4rl_tensor *t) { return t->dtype == FP4RL_DTYPE_BF16 || fp4rl_dtype_is_quantized(t->dtype); }

} // namespace

fp4rl_status fp4rl_cuda_gemm_nt(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b, float alpha)
{
    Operand oa = {a->data, a->dtype}, ob = {b->data, b->dtype};
    return gemm_dense(ctx, a->dims[0], b->dims[0], a->dims[1], oa, ob, c->data, c->dtype, alpha);
}

fp4rl_status fp4rl_cuda_matmul(fp4rl_context *ctx, fp4rl_tensor *c, const fp4rl_tensor *a, const fp4rl_tensor *b)
{
    if (fp4rl_dtype_is_quantized(b->dtype) && fp4rl_dtype_is_dense(a->dtype) && fp4rl_cuda_decode_gemm_fits(a, b))
        return fp4rl_cuda_decode_gemm(ctx, c, a, b, b->tensor_scale);
    /* HiF4 x HiF4 / MXFP4 x MXFP4 on FP8 operands (gemm_fp8.h): per-unit exact partials */
    if (fp4rl_cuda_fp8_gemm_wanted(ctx, c, a, b)) return fp4rl_cuda_fp8_gemm(ctx, c, a, b);
    const int bf16 = bf16_able(a) && bf16_able(b);
    Operand oa, ob;
    void *ta = NULL, *tb = NULL;
    float ga = 1.0f, gb = 1.0f;
    fp4rl_status st = operand(ctx, a, bf16, &oa, &ta, &ga);
    if (!st) st = operand(ctx, b, bf16, &ob, &tb, &gb);
    if (!st) st = gemm_dense(ctx, a->dims[0], b->dims[0], a->dims[1], oa, ob, c->data, c->dtype, ga * gb);
    fp4rl_cuda_free_bytes(ctx, ta);
    fp4rl_cuda_free_bytes(ctx, tb);
    return st;
}

int fp4rl_cuda_lt_gemm(fp4rl_cuda *cu, int64_t M, int64_t N, int64_t K, const void *a, const void *b, cudaDataType_t ab, void *c,
                       cudaDataType_t ct, float alpha, float beta)
{
    const fp4rl_cuda_gemm_shape g = {0, 1, M, N, K, K, K, N, 1, 0, 0, 0, (int)ab, (int)ct};
    return fp4rl_cuda_lt_gemm_ex(cu, &g, a, b, c, alpha, beta);
}

int fp4rl_cuda_lt_gemm_ex(fp4rl_cuda *cu, const fp4rl_cuda_gemm_shape *g, const void *a, const void *b, void *c, float alpha,
                          float beta)
{
    fp4rl_cuda_plan *pl = get_plan(cu, g);
    if (!pl || !pl->has_algo) return 0;
    const fp4rl_cublaslt *api = fp4rl_cublaslt_api();
    return api->matmul(cu->lt, pl->desc, &alpha, b, pl->la, a, pl->lb, &beta, c, pl->lc, c, pl->lc, &pl->algo, cu->lt_workspace,
                       cu->lt_workspace_bytes, cu->stream) == CUBLAS_STATUS_SUCCESS;
}

void fp4rl_cuda_gemm_destroy(fp4rl_cuda *cu)
{
    for (int i = 0; i < FP4RL_CUDA_PLAN_CACHE; i++) destroy_plan(&cu->plans[i]);
}
