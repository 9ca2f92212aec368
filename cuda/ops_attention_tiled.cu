/*
 * ops_attention_tiled.cu - causal GQA attention for training, forward and backward, in tiles of
 * 32 query rows x 32 key rows staged in shared memory (FlashAttention-2's schedule, in FP32 on the
 * CUDA cores): the forward keeps an online softmax per row and writes out and lse; the backward
 * recomputes p = exp(scale q.k - lse) and runs one kernel for dq (a block per query tile) and one
 * for dk, dv (a block per key tile, looping over the group's heads and the later query tiles), so
 * every output has one writer and the sums need no atomics (deterministic).
 *
 * A block is 128 threads, 4 per tile row: a thread computes 8 scores of its row (keys c, c + 4,
 * ..., so the four threads of a row read four consecutive tile rows: no bank conflicts) and owns
 * D/4 of its row's output columns. Tiles sit in shared memory at a pitch of D + 4 floats, so
 * every read is a 16-byte vector. Scores are serial FP32 dot products, as on the CPU; the softmax
 * sums run in double; only the order of the output sums differs from core/cpu/ops_attention.c
 * (within the parity suite's 1e-5). The dk/dv pass runs a block per (key tile, query head), so
 * GQA's few kv heads still fill the GPU; each head's share goes to a scratch and a second kernel
 * adds the group's heads in order (deterministic). Head dims 16, 32, 64 and 128; others use
 * ops_attention.cu's kernels.
 */
#include <math.h>

#include "ops_cuda.h"

using namespace fp4rl_cuda_ops_detail;

namespace {

constexpr int TL = 32, NT = 128; /* tile rows, threads per block */

__device__ __forceinline__ int64_t len_of(const int32_t *lengths, int64_t b, int64_t T)
{
    if (!lengths) return T;
    const int64_t n = lengths[b];
    return n < 0 ? 0 : (n > T ? T : n);
}

template <int D> __host__ __device__ constexpr int pitch() { return D + 4; } /* a tile row in shared memory, 16-byte aligned */

/* a . b over D floats of shared memory, serial in d (the CPU's order), read as 16-byte vectors */
template <int D> __device__ __forceinline__ float sdot(const float *a, const float *b)
{
    float s = 0.0f;
#pragma unroll 8
    for (int d = 0; d < D; d += 4) {
        const float4 x = *reinterpret_cast<const float4 *>(a + d), y = *reinterpret_cast<const float4 *>(b + d);
        s += x.x * y.x;
        s += x.y * y.y;
        s += x.z * y.z;
        s += x.w * y.w;
    }
    return s;
}

/* acc[i] += w * row[i] for the DPT floats of row (shared memory, 16-byte aligned) */
template <int DPT> __device__ __forceinline__ void axpy(float *acc, float w, const float *row)
{
#pragma unroll
    for (int i = 0; i < DPT; i += 4) {
        const float4 x = *reinterpret_cast<const float4 *>(row + i);
        acc[i] += w * x.x;
        acc[i + 1] += w * x.y;
        acc[i + 2] += w * x.z;
        acc[i + 3] += w * x.w;
    }
}

/* rows [r0, r0 + TL) of a [.., D] tensor with row i at base + i * stride, into s (row pitch
 * pitch<D>()), as 16-byte vectors (D and the strides are multiples of 4 floats); rows at or past
 * n are zeros */
template <int D>
__device__ __forceinline__ void stage(float *s, const float *base, int64_t stride, int64_t r0, int64_t n)
{
    constexpr int D4 = D / 4;
    for (int i = threadIdx.x; i < TL * D4; i += NT) {
        const int r = i / D4, d = (i - r * D4) * 4;
        const float4 x = r0 + r < n ? *reinterpret_cast<const float4 *>(base + (r0 + r) * stride + d) : make_float4(0, 0, 0, 0);
        *reinterpret_cast<float4 *>(s + r * pitch<D>() + d) = x;
    }
}

__device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ double quad_sum(double v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* grid (query tiles, B * Hq) */
template <int D>
__global__ void __launch_bounds__(NT) fwd_k(float *out, float *lse, const float *q, const float *k, const float *v,
                                            const int32_t *lengths, int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    constexpr int P = pitch<D>(), DPT = D / 4;
    extern __shared__ float sm[];
    float *sQ = sm, *sK = sQ + TL * P, *sV = sK + TL * P, *sP = sV + TL * P; /* sP: TL x (TL + 1) */
    const int64_t q0 = (int64_t)blockIdx.x * TL, h = blockIdx.y % Hq, b = blockIdx.y / Hq, kh = h / (Hq / Hkv);
    const int64_t len = len_of(lengths, b, T);
    const int r = threadIdx.x >> 2, c = threadIdx.x & 3;
    const int64_t qi = q0 + r, qs = Hq * D, ks = Hkv * D;
    const float *qb = q + (b * T * Hq + h) * D, *kb = k + (b * T * Hkv + kh) * D, *vb = v + (b * T * Hkv + kh) * D;
    stage<D>(sQ, qb, qs, q0, len);
    float acc[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) acc[i] = 0.0f;
    float m = -INFINITY;
    double l = 0.0;
    const int64_t kend = q0 >= len ? 0 : (len < q0 + TL ? len : q0 + TL); /* a padding tile needs no keys */
    for (int64_t k0 = 0; k0 < kend; k0 += TL) {
        __syncthreads();
        stage<D>(sK, kb, ks, k0, len);
        stage<D>(sV, vb, ks, k0, len);
        __syncthreads();
        float s[8], mt = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
            const int j = jj * 4 + c;
            const int64_t key = k0 + j;
            s[jj] = (key <= qi && qi < len) ? scale * sdot<D>(sQ + r * P, sK + j * P) : -INFINITY;
            mt = fmaxf(mt, s[jj]);
        }
        const float mn = fmaxf(m, quad_max(mt));
        const float alpha = m == -INFINITY ? 0.0f : expf_cr(m - mn);
        double ps = 0.0;
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
            const float p = s[jj] == -INFINITY ? 0.0f : expf_cr(s[jj] - mn);
            sP[r * (TL + 1) + jj * 4 + c] = p;
            ps += p;
        }
        l = l * (double)alpha + quad_sum(ps);
        m = mn;
        __syncwarp();
#pragma unroll
        for (int i = 0; i < DPT; i++) acc[i] *= alpha;
        for (int j = 0; j < TL; j++) axpy<DPT>(acc, sP[r * (TL + 1) + j], sV + j * P + c * DPT);
        __syncwarp();
    }
    if (qi >= T) return;
    const int valid = qi < len && l > 0.0;
    float *o = out + ((b * T + qi) * Hq + h) * D + c * DPT;
#pragma unroll
    for (int i = 0; i < DPT; i++) o[i] = valid ? (float)((double)acc[i] / l) : 0.0f;
    if (c == 0) lse[(b * Hq + h) * T + qi] = valid ? (float)((double)m + log(l)) : 0.0f;
}

/* delta[row] = dout[row] . out[row], the CPU's serial dot */
__global__ void delta_k(float *delta, const float *dout, const float *out, int64_t rows, int64_t D)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    float s = 0.0f;
    for (int64_t d = 0; d < D; d++) s += dout[i * D + d] * out[i * D + d];
    delta[i] = s;
}

/* dq += sum_keys ds k; grid (query tiles, B * Hq) */
template <int D>
__global__ void __launch_bounds__(NT) dq_k(float *dq, const float *dout, const float *q, const float *k, const float *v,
                                           const float *lse, const float *delta, const int32_t *lengths, int64_t T, int64_t Hq,
                                           int64_t Hkv, float scale)
{
    constexpr int P = pitch<D>(), DPT = D / 4;
    extern __shared__ float sm[];
    float *sQ = sm, *sO = sQ + TL * P, *sK = sO + TL * P, *sV = sK + TL * P, *sS = sV + TL * P;
    const int64_t q0 = (int64_t)blockIdx.x * TL, h = blockIdx.y % Hq, b = blockIdx.y / Hq, kh = h / (Hq / Hkv);
    const int64_t len = len_of(lengths, b, T);
    if (q0 >= len) return;
    const int r = threadIdx.x >> 2, c = threadIdx.x & 3;
    const int64_t qi = q0 + r, qs = Hq * D, ks = Hkv * D;
    const float *qb = q + (b * T * Hq + h) * D, *ob = dout + (b * T * Hq + h) * D;
    const float *kb = k + (b * T * Hkv + kh) * D, *vb = v + (b * T * Hkv + kh) * D;
    stage<D>(sQ, qb, qs, q0, len);
    stage<D>(sO, ob, qs, q0, len);
    const float row_lse = qi < len ? lse[(b * Hq + h) * T + qi] : 0.0f;
    const float row_delta = qi < len ? delta[(b * T + qi) * Hq + h] : 0.0f;
    float acc[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) acc[i] = 0.0f;
    const int64_t kend = len < q0 + TL ? len : q0 + TL;
    for (int64_t k0 = 0; k0 < kend; k0 += TL) {
        __syncthreads();
        stage<D>(sK, kb, ks, k0, len);
        stage<D>(sV, vb, ks, k0, len);
        __syncthreads();
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
            const int j = jj * 4 + c;
            float ds = 0.0f;
            if (k0 + j <= qi && qi < len) {
                const float p = expf_cr(scale * sdot<D>(sQ + r * P, sK + j * P) - row_lse);
                ds = p * (sdot<D>(sO + r * P, sV + j * P) - row_delta) * scale;
            }
            sS[r * (TL + 1) + j] = ds;
        }
        __syncwarp();
        for (int j = 0; j < TL; j++) axpy<DPT>(acc, sS[r * (TL + 1) + j], sK + j * P + c * DPT);
        __syncwarp();
    }
    if (qi >= len) return;
    float *o = dq + ((b * T + qi) * Hq + h) * D + c * DPT;
#pragma unroll
    for (int i = 0; i < DPT; i++) o[i] += acc[i];
}

/* Head h's share of dk and dv for one key tile: pk = sum ds q, pv = sum p dout over the queries
 * at or after each key, written (not added) to the scratch rows [B, T, Hq, D] of that head, or
 * added to dk, dv directly when a kv head has one query head (pk == dk); grid (key tiles, B * Hq) */
template <int D>
__global__ void __launch_bounds__(NT) dkv_k(float *pk, float *pv, int add, const float *dout, const float *q, const float *k,
                                            const float *v, const float *lse, const float *delta, const int32_t *lengths, int64_t T,
                                            int64_t Hq, int64_t Hkv, float scale)
{
    constexpr int P = pitch<D>(), DPT = D / 4;
    extern __shared__ float sm[];
    float *sK = sm, *sV = sK + TL * P, *sQ = sV + TL * P, *sO = sQ + TL * P, *sP = sO + TL * P, *sS = sP + TL * (TL + 1);
    float *sL = sS + TL * (TL + 1), *sD = sL + TL;
    const int64_t k0 = (int64_t)blockIdx.x * TL, h = blockIdx.y % Hq, b = blockIdx.y / Hq, kh = h / (Hq / Hkv);
    const int64_t len = len_of(lengths, b, T);
    if (k0 >= len) return;
    const int r = threadIdx.x >> 2, c = threadIdx.x & 3;
    const int64_t key = k0 + r, qs = Hq * D, ks = Hkv * D;
    stage<D>(sK, k + (b * T * Hkv + kh) * D, ks, k0, len);
    stage<D>(sV, v + (b * T * Hkv + kh) * D, ks, k0, len);
    float ak[DPT], av[DPT];
#pragma unroll
    for (int i = 0; i < DPT; i++) ak[i] = av[i] = 0.0f;
    const float *qb = q + (b * T * Hq + h) * D, *ob = dout + (b * T * Hq + h) * D;
    for (int64_t q0 = k0; q0 < len; q0 += TL) {
        __syncthreads();
        stage<D>(sQ, qb, qs, q0, len);
        stage<D>(sO, ob, qs, q0, len);
        if (threadIdx.x < TL) {
            const int64_t qi = q0 + threadIdx.x;
            sL[threadIdx.x] = qi < len ? lse[(b * Hq + h) * T + qi] : 0.0f;
            sD[threadIdx.x] = qi < len ? delta[(b * T + qi) * Hq + h] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
            const int i = jj * 4 + c;
            const int64_t qi = q0 + i;
            float p = 0.0f, ds = 0.0f;
            if (key <= qi && qi < len && key < len) {
                p = expf_cr(scale * sdot<D>(sQ + i * P, sK + r * P) - sL[i]);
                ds = p * (sdot<D>(sO + i * P, sV + r * P) - sD[i]) * scale;
            }
            sP[r * (TL + 1) + i] = p;
            sS[r * (TL + 1) + i] = ds;
        }
        __syncwarp();
        for (int i = 0; i < TL; i++) {
            axpy<DPT>(av, sP[r * (TL + 1) + i], sO + i * P + c * DPT);
            axpy<DPT>(ak, sS[r * (TL + 1) + i], sQ + i * P + c * DPT);
        }
        __syncwarp();
    }
    if (key >= len) return;
    const int64_t row = add ? (b * T + key) * Hkv + kh : (b * T + key) * Hq + h;
    float *okk = pk + row * D + c * DPT, *ovv = pv + row * D + c * DPT;
#pragma unroll
    for (int d = 0; d < DPT; d++) {
        okk[d] = add ? okk[d] + ak[d] : ak[d];
        ovv[d] = add ? ovv[d] + av[d] : av[d];
    }
}

/* dk, dv [B, T, Hkv, D] += the group's heads' shares (scratch [B, T, Hq, D]), in head order;
 * rows past a sequence's length get nothing (their scratch rows were never written) */
__global__ void dkv_sum_k(float *dk, float *dv, const float *pk, const float *pv, const int32_t *lengths, int64_t B, int64_t T,
                          int64_t Hq, int64_t Hkv, int64_t D)
{
    const int64_t group = Hq / Hkv, n = B * T * Hkv * D;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d = i % D, kh = (i / D) % Hkv, t = (i / (D * Hkv)) % T, b = i / (D * Hkv * T);
        if (t >= len_of(lengths, b, T)) continue;
        const int64_t base = ((b * T + t) * Hq + kh * group) * D + d;
        float sk = 0.0f, sv = 0.0f;
        for (int64_t g = 0; g < group; g++) {
            sk += pk[base + g * D];
            sv += pv[base + g * D];
        }
        dk[i] += sk;
        dv[i] += sv;
    }
}

template <int D> constexpr size_t fwd_smem() { return (3 * TL * pitch<D>() + TL * (TL + 1)) * sizeof(float); }
template <int D> constexpr size_t dq_smem() { return (4 * TL * pitch<D>() + TL * (TL + 1)) * sizeof(float); }
template <int D> constexpr size_t dkv_smem() { return (4 * TL * pitch<D>() + 2 * TL * (TL + 1) + 2 * TL) * sizeof(float); }

template <int D>
fp4rl_status forward_d(fp4rl_context *ctx, cudaStream_t s, float *out, float *lse, const float *q, const float *k, const float *v,
                       const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    cudaFuncSetAttribute(fwd_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_smem<D>());
    const dim3 grid((unsigned)((T + TL - 1) / TL), (unsigned)(B * Hq));
    fwd_k<D><<<grid, NT, fwd_smem<D>(), s>>>(out, lse, q, k, v, lengths, T, Hq, Hkv, scale);
    return fp4rl_cuda_check_launch(ctx, "attention_forward (tiled)");
}

template <int D>
fp4rl_status backward_d(fp4rl_context *ctx, cudaStream_t s, float *dq, float *dk, float *dv, const float *dout, const float *q,
                        const float *k, const float *v, const float *out, const float *lse, const int32_t *lengths, int64_t B,
                        int64_t T, int64_t Hq, int64_t Hkv, float scale)
{
    void *delta = NULL;
    fp4rl_status st = fp4rl_cuda_alloc_bytes(ctx, &delta, (size_t)(B * T * Hq) * sizeof(float));
    if (st) return st;
    float *dl = static_cast<float *>(delta);
    delta_k<<<fp4rl_cuda_blocks(B * T * Hq, 256), 256, 0, s>>>(dl, dout, out, B * T * Hq, D);
    st = fp4rl_cuda_check_launch(ctx, "attention_backward (delta)");
    if (!st) {
        cudaFuncSetAttribute(dq_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_smem<D>());
        const dim3 grid((unsigned)((T + TL - 1) / TL), (unsigned)(B * Hq));
        dq_k<D><<<grid, NT, dq_smem<D>(), s>>>(dq, dout, q, k, v, lse, dl, lengths, T, Hq, Hkv, scale);
        st = fp4rl_cuda_check_launch(ctx, "attention_backward (dq, tiled)");
    }
    /* one query head per kv head: add to dk, dv directly; else each head's share to a scratch */
    const int direct = Hq == Hkv;
    void *part = NULL;
    if (!st && !direct) st = fp4rl_cuda_alloc_bytes(ctx, &part, 2 * (size_t)(B * T * Hq * D) * sizeof(float));
    float *pk = direct ? dk : static_cast<float *>(part), *pv = direct ? dv : pk + B * T * Hq * D;
    if (!st) {
        cudaFuncSetAttribute(dkv_k<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkv_smem<D>());
        const dim3 grid((unsigned)((T + TL - 1) / TL), (unsigned)(B * Hq));
        dkv_k<D><<<grid, NT, dkv_smem<D>(), s>>>(pk, pv, direct, dout, q, k, v, lse, dl, lengths, T, Hq, Hkv, scale);
        st = fp4rl_cuda_check_launch(ctx, "attention_backward (dk, dv, tiled)");
    }
    if (!st && !direct) {
        dkv_sum_k<<<ew_grid(B * T * Hkv * D), 256, 0, s>>>(dk, dv, pk, pv, lengths, B, T, Hq, Hkv, D);
        st = fp4rl_cuda_check_launch(ctx, "attention_backward (dk, dv, the group's sum)");
    }
    fp4rl_cuda_free_bytes(ctx, part);
    fp4rl_cuda_free_bytes(ctx, delta);
    return st;
}

} // namespace

int fp4rl_cuda_attention_tiled_ok(int64_t B, int64_t Hq, int64_t D)
{
    return (D == 16 || D == 32 || D == 64 || D == 128) && B * Hq <= 65535;
}

fp4rl_status fp4rl_cuda_attention_forward_tiled(fp4rl_context *ctx, cudaStream_t s, float *out, float *lse, const float *q, const float *k,
                                                const float *v, const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                                int64_t D, float scale)
{
    switch (D) {
    case 16: return forward_d<16>(ctx, s, out, lse, q, k, v, lengths, B, T, Hq, Hkv, scale);
    case 32: return forward_d<32>(ctx, s, out, lse, q, k, v, lengths, B, T, Hq, Hkv, scale);
    case 64: return forward_d<64>(ctx, s, out, lse, q, k, v, lengths, B, T, Hq, Hkv, scale);
    default: return forward_d<128>(ctx, s, out, lse, q, k, v, lengths, B, T, Hq, Hkv, scale);
    }
}

fp4rl_status fp4rl_cuda_attention_backward_tiled(fp4rl_context *ctx, cudaStream_t s, float *dq, float *dk, float *dv, const float *dout,
                                                 const float *q, const float *k, const float *v, const float *out, const float *lse,
                                                 const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                                                 float scale)
{
    switch (D) {
    case 16: return backward_d<16>(ctx, s, dq, dk, dv, dout, q, k, v, out, lse, lengths, B, T, Hq, Hkv, scale);
    case 32: return backward_d<32>(ctx, s, dq, dk, dv, dout, q, k, v, out, lse, lengths, B, T, Hq, Hkv, scale);
    case 64: return backward_d<64>(ctx, s, dq, dk, dv, dout, q, k, v, out, lse, lengths, B, T, Hq, Hkv, scale);
    default: return backward_d<128>(ctx, s, dq, dk, dv, dout, q, k, v, out, lse, lengths, B, T, Hq, Hkv, scale);
    }
}
