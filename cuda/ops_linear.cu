/*
 * ops_linear.cu - the FP32 linear layer on cuBLASLt (CUBLAS_COMPUTE_32F: true FP32 products and
 * sums, never TF32), on the context's handle, workspace and stream; the bias sums in a column
 * kernel. A plain kernel covers shapes cuBLASLt has no algorithm for. The GEMMs match the CPU's
 * OpenBLAS up to FP32 summation order. The _bf16 forms take BF16 operands (exactly representable
 * values, so the products are the FP32 path's) on the tensor cores, with FP32 accumulation.
 */
#include "format/formats.h"
#include "ops_cuda.h"

using namespace fp4rl_cuda_ops_detail;

namespace {

/* Row-major C[M,N] = op(A)[M,K] op(B)[K,N] + beta C, A stored [M,K] (or [K,M] when ta) with row
 * length lda, B stored [K,N] (or [N,K] when tb) with row length ldb; T: float or BF16 bits. */
__device__ __forceinline__ float wide(float v) { return v; }
__device__ __forceinline__ float wide(uint16_t v) { return fp4rl_bf16_to_f32(v); }
template <typename T>
__global__ void gemm_naive_k(float *c, const T *a, const T *b, int64_t M, int64_t N, int64_t K, int ta, int tb, int64_t lda,
                             int64_t ldb, float beta)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < M * N; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / N, n = i - m * N;
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++) acc += wide(ta ? a[k * lda + m] : a[m * lda + k]) * wide(tb ? b[n * ldb + k] : b[k * ldb + n]);
        c[i] = beta == 0.0f ? acc : acc + beta * c[i];
    }
}

__global__ void bias_fill_k(float *y, const float *b, int64_t N, int64_t OUT)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * OUT; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = b[i % OUT];
}

struct BiasDy {
    const float *dy;
    int64_t OUT;
    __device__ float operator()(int64_t n, int64_t o) const { return dy[n * OUT + o]; }
};

/* The same product on cuBLASLt. Row-major X is column-major X^T, so the row-major product is the
 * column-major C^T[N,M] = op(B)^T op(A)^T: cuBLASLt's first operand is our B, its second our A. */
fp4rl_status gemm_rm(fp4rl_context *ctx, float *c, const void *a, const void *b, int64_t M, int64_t N, int64_t K, int ta, int tb,
                     int64_t lda, int64_t ldb, float beta, const char *what, cudaDataType_t ab = CUDA_R_32F)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    const fp4rl_cublaslt *api = fp4rl_cublaslt_api();
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t l1 = NULL, l2 = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    const cublasOperation_t op1 = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op2 = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int ok = api->desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    ok = ok && api->desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof op1) == CUBLAS_STATUS_SUCCESS;
    ok = ok && api->desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof op2) == CUBLAS_STATUS_SUCCESS;
    /* stored shapes, column-major: B^T is [N,K] (or [K,N] when tb), A^T is [K,M] (or [M,K] when ta) */
    ok = ok && api->layout_create(&l1, ab, tb ? (uint64_t)K : (uint64_t)N, tb ? (uint64_t)N : (uint64_t)K, ldb) == CUBLAS_STATUS_SUCCESS;
    ok = ok && api->layout_create(&l2, ab, ta ? (uint64_t)M : (uint64_t)K, ta ? (uint64_t)K : (uint64_t)M, lda) == CUBLAS_STATUS_SUCCESS;
    ok = ok && api->layout_create(&lc, CUDA_R_32F, (uint64_t)N, (uint64_t)M, N) == CUBLAS_STATUS_SUCCESS;
    ok = ok && api->pref_create(&pref) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulHeuristicResult_t res;
    int count = 0;
    if (ok) {
        size_t ws = cu->lt_workspace_bytes;
        api->pref_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        ok = api->algo_get_heuristic(cu->lt, desc, l1, l2, lc, lc, pref, 1, &res, &count) == CUBLAS_STATUS_SUCCESS && count > 0 &&
             res.state == CUBLAS_STATUS_SUCCESS;
    }
    int done = 0;
    if (ok) {
        const float alpha = 1.0f;
        done = api->matmul(cu->lt, desc, &alpha, b, l1, a, l2, &beta, c, lc, c, lc, &res.algo, cu->lt_workspace, cu->lt_workspace_bytes,
                           cu->stream) == CUBLAS_STATUS_SUCCESS;
    }
    if (pref) api->pref_destroy(pref);
    if (lc) api->layout_destroy(lc);
    if (l2) api->layout_destroy(l2);
    if (l1) api->layout_destroy(l1);
    if (desc) api->desc_destroy(desc);
    if (!done && ab == CUDA_R_16BF)
        gemm_naive_k<uint16_t><<<ew_grid(M * N), 256, 0, cu->stream>>>(c, static_cast<const uint16_t *>(a), static_cast<const uint16_t *>(b), M,
                                                                     N, K, ta, tb, lda, ldb, beta);
    else if (!done)
        gemm_naive_k<float><<<ew_grid(M * N), 256, 0, cu->stream>>>(c, static_cast<const float *>(a), static_cast<const float *>(b), M, N, K,
                                                                  ta, tb, lda, ldb, beta);
    return fp4rl_cuda_check_launch(ctx, what);
}

/* y [N, OUT] = x [N, IN] . w^T (+ b), w stored [OUT, IN], operands of type ab (F32 or BF16). */
fp4rl_status linear_fwd(fp4rl_context *ctx, float *y, const void *x, const void *w, const float *b, int64_t N, int64_t IN, int64_t OUT,
                        cudaDataType_t ab, const char *what)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    float beta = 0.0f;
    if (b) { /* start y at the bias and let the GEMM add x w^T on top, as the CPU */
        bias_fill_k<<<ew_grid(N * OUT), 256, 0, s>>>(y, b, N, OUT);
        if ((st = fp4rl_cuda_check_launch(ctx, what))) return st;
        beta = 1.0f;
    }
    /* a cached cuBLASLt plan, else a fresh one (or the plain kernel) */
    if (fp4rl_cuda_lt_gemm(fp4rl_cuda_of(ctx), N, OUT, IN, x, w, ab, y, CUDA_R_32F, 1.0f, beta)) return fp4rl_cuda_check_launch(ctx, what);
    return gemm_rm(ctx, y, x, w, N, OUT, IN, 0, 1, IN, IN, beta, what, ab);
}

/* dx [N, IN] += dy [N, OUT] . w [OUT, IN]; dw [OUT, IN] += dy^T . x (dy stored [N, OUT]); db += column sums of dy. */
fp4rl_status linear_bwd(fp4rl_context *ctx, float *dx, float *dw, float *db, const void *dy_dx, const void *w_dx, const void *dy_dw,
                        const void *x_dw, const float *dy_db, int64_t N, int64_t IN, int64_t OUT, cudaDataType_t ab, const char *what)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    if (dx && (st = gemm_rm(ctx, dx, dy_dx, w_dx, N, IN, OUT, 0, 0, OUT, IN, 1.0f, what, ab))) return st;
    if (dw && (st = gemm_rm(ctx, dw, dy_dw, x_dw, OUT, IN, N, 1, 0, OUT, IN, 1.0f, what, ab))) return st;
    if (db) st = colsum(ctx, s, db, N, OUT, BiasDy{dy_db, OUT}, what);
    return st;
}

} // namespace

fp4rl_status fp4rl_cuda_linear_forward(fp4rl_context *ctx, float *y, const float *x, const float *w, const float *b, int64_t N,
                                       int64_t IN, int64_t OUT)
{
    return linear_fwd(ctx, y, x, w, b, N, IN, OUT, CUDA_R_32F, "linear_forward");
}

/* BF16 x BF16 on the tensor cores, FP32 accumulation and output */
fp4rl_status fp4rl_cuda_linear_forward_bf16(fp4rl_context *ctx, float *y, const uint16_t *x, const uint16_t *w, const float *b,
                                            int64_t N, int64_t IN, int64_t OUT)
{
    return linear_fwd(ctx, y, x, w, b, N, IN, OUT, CUDA_R_16BF, "linear_forward_bf16");
}

fp4rl_status fp4rl_cuda_linear_backward_bf16(fp4rl_context *ctx, float *dx, float *dw, float *db, const uint16_t *dy_dx,
                                             const uint16_t *w_dx, const uint16_t *dy_dw, const uint16_t *x_dw, const float *dy_db,
                                             int64_t N, int64_t IN, int64_t OUT)
{
    return linear_bwd(ctx, dx, dw, db, dy_dx, w_dx, dy_dw, x_dw, dy_db, N, IN, OUT, CUDA_R_16BF, "linear_backward_bf16");
}

fp4rl_status fp4rl_cuda_linear_backward(fp4rl_context *ctx, float *dx, float *dw, float *db, const float *dy_dx, const float *w_dx,
                                        const float *dy_dw, const float *x_dw, const float *dy_db, int64_t N, int64_t IN, int64_t OUT)
{
    return linear_bwd(ctx, dx, dw, db, dy_dx, w_dx, dy_dw, x_dw, dy_db, N, IN, OUT, CUDA_R_32F, "linear_backward");
}
