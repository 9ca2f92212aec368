/*
 * ops_attention.cu - causal grouped-query attention (training forward and backward) and the
 * rollout's attention of query rows against a KV cache (attention_rows) on the GPU, FlashAttention's interface without its tiling:
 * one thread block per query row (forward, dq) or per key row (dk, dv). Training attention with
 * head dims 16/32/64/128 goes to the tiled kernels of ops_attention_tiled.cu instead; these
 * kernels serve the other head dims and the rollout's decode step.
 * The decode step's attention_rows over a BF16 cache of head dim 64 or 128 runs the split-keys
 * kernels further down (chunks of keys in parallel, fixed orders).
 *
 * In BF16 numerics (ops.h) they read every operand rounded, as the CPU does; training attention
 * in BF16 numerics goes to ops_attention_gemm.cu's tensor-core path where the head dim allows.
 *
 * Every sum runs in the CPU's order (core/cpu/ops_attention.c): a score is one thread's serial
 * float dot product (bitwise the CPU's), out and the gradients accumulate over keys (or over
 * queries, then heads, for dk/dv) serially in the CPU's order, so no atomics are needed and the
 * results are deterministic. Only the softmax's double sum (a fixed tree instead of the CPU's
 * online serial sum) and expf may differ from the CPU, by rounding.
 */
#include <math.h>
#include <stdlib.h>

#include "format/formats.h"
#include "ops_cuda.h"

using namespace fp4rl_cuda_ops_detail;

namespace {

constexpr int AT = 128; /* threads per row block; also the chunk of keys staged in shared memory */

/* an operand as the numerics read it: as is (FP32) or rounded to BF16 (bf) */
__device__ __forceinline__ float rd(float x, int bf) { return bf ? fp4rl_round_bf16(x) : x; }

__device__ __forceinline__ float dot(const float *a, const float *b, int64_t D, int bf)
{
    float s = 0.0f;
    for (int64_t d = 0; d < D; d++) s += rd(a[d], bf) * rd(b[d], bf);
    return s;
}

__device__ __forceinline__ int64_t seq_len(const int32_t *lengths, int64_t b, int64_t T)
{
    if (!lengths) return T;
    const int64_t n = lengths[b];
    return n < 0 ? 0 : (n > T ? T : n);
}

/* One query row against n_keys keys k + s * stride (v likewise), by the whole block: o = sum_s p_s
 * v_s, p = softmax(scale * q.k). sq, sacc: D floats of shared memory each. Returns the row lse. */
__device__ float attend_row(float *o, const float *q, const float *k, const float *v, int64_t stride, int64_t n_keys, int64_t D,
                            float scale, float *sq, float *sacc, int bf)
{
    __shared__ float sp[AT];
    __shared__ float shf[AT];
    __shared__ double shd[AT];
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        sq[d] = rd(q[d], bf);
        sacc[d] = 0.0f;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int64_t s = threadIdx.x; s < n_keys; s += blockDim.x) m = fmaxf(m, scale * dot(sq, k + s * stride, D, bf));
    m = block_max(m, shf);
    double sum = 0.0;
    for (int64_t s = threadIdx.x; s < n_keys; s += blockDim.x) sum += exp((double)(scale * dot(sq, k + s * stride, D, bf)) - (double)m);
    sum = block_sum(sum, shd);
    const float row_lse = (float)((double)m + log(sum));
    for (int64_t c0 = 0; c0 < n_keys; c0 += AT) {
        const int64_t nc = n_keys - c0 < AT ? n_keys - c0 : AT;
        if (threadIdx.x < nc) sp[threadIdx.x] = rd(expf_cr(scale * dot(sq, k + (c0 + threadIdx.x) * stride, D, bf) - row_lse), bf);
        __syncthreads();
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            float a = sacc[d];
            for (int64_t j = 0; j < nc; j++) a += sp[j] * rd(v[(c0 + j) * stride + d], bf);
            sacc[d] = a;
        }
        __syncthreads();
    }
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) o[d] = sacc[d];
    return row_lse;
}

/* block = ((b * T + t) * Hq + h) */
__global__ void __launch_bounds__(AT) attn_fwd_k(float *out, float *lse, const float *q, const float *k, const float *v,
                                                 const int32_t *lengths, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, float scale,
                                                 int bf)
{
    extern __shared__ float dyn[];
    const int64_t row = blockIdx.x, h = row % Hq, bt = row / Hq, t = bt % T, b = bt / T;
    const int64_t len = seq_len(lengths, b, T);
    float *o = out + row * D;
    float *l_out = lse + (b * Hq + h) * T + t;
    if (t >= len) {
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) o[d] = 0.0f;
        if (threadIdx.x == 0) *l_out = 0.0f;
        return;
    }
    const int64_t kv0 = (b * T * Hkv + h / (Hq / Hkv)) * D;
    const float l = attend_row(o, q + row * D, k + kv0, v + kv0, Hkv * D, t + 1, D, scale, dyn, dyn + D, bf);
    if (threadIdx.x == 0) *l_out = l;
}

/* ---- attention_rows for rows whose scores do not fit in shared memory: one block per (query row,
 * kv head, chunk of up to RH query heads) ----
 * The GQA group's query heads read each key once. Warps take keys in turn; a key's D values
 * are spread over the lanes (RD = D / 32 contiguous values each when D is 32, 64, 128 or 256, so a
 * row is one coalesced load; otherwise strided, up to 8 each), and a score is the lanes' partial
 * dot products summed by shuffles. Pass 1 keeps an online max and double sum per head (the CPU's
 * recurrence, per warp, then merged); pass 2 recomputes the same scores for p = exp(x - lse) and
 * accumulates p v per lane, summed over the warps at the end. Sums run in another order than the
 * CPU's serial ones; operands and roundings are the contract's. */
constexpr int RW = 4, RH = 8; /* warps per block; query heads per block */

template <typename KT> __device__ __forceinline__ float kv_val(const KT *c, int64_t i);
template <> __device__ __forceinline__ float kv_val<float>(const float *c, int64_t i) { return c[i]; }
template <> __device__ __forceinline__ float kv_val<uint16_t>(const uint16_t *c, int64_t i) { return fp4rl_bf16_to_f32(c[i]); }

/* The lane's values of one head-dim row at c + base: element e(j) = CONTIG ? lane * RD + j : lane + 32 j. */
template <int RD, bool CONTIG, typename KT>
__device__ __forceinline__ void load_row(float (&x)[RD], const KT *c, int64_t base, int lane, int D, int bf)
{
#pragma unroll
    for (int j = 0; j < RD; j++) {
        const int e = CONTIG ? lane * RD + j : lane + 32 * j;
        x[j] = CONTIG || e < D ? rd(kv_val<KT>(c, base + e), bf) : 0.0f;
    }
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* A head's score against a key: the lanes' partial dot products, summed across the warp (every
 * lane gets the same value, the same in both passes). */
template <int RD> __device__ __forceinline__ float score(const float (&q)[RD], const float (&k)[RD], float scale)
{
    float p = 0.0f;
#pragma unroll
    for (int j = 0; j < RD; j++) p += q[j] * k[j];
    return scale * warp_sum(p);
}

template <int RD, bool CONTIG, typename KT>
__global__ void __launch_bounds__(RW * 32) attn_rows_k(float *out, const float *q, const KT *kc, const KT *vc, const int32_t *seg,
                                                      int64_t Hq, int64_t Hkv, int D, float scale, int bf)
{
    extern __shared__ float acc_sh[]; /* [RW][RH][D] */
    __shared__ float m_sh[RW][RH];
    __shared__ double s_sh[RW][RH];
    const int64_t n = blockIdx.x, kh = blockIdx.y, group = Hq / Hkv, h0 = kh * group + (int64_t)blockIdx.z * RH;
    const int nh = (int)(group - (int64_t)blockIdx.z * RH < RH ? group - (int64_t)blockIdx.z * RH : RH);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t W = Hkv * D, b0 = seg[4 * n], l0 = seg[4 * n + 1], b1 = seg[4 * n + 2], nk = l0 + seg[4 * n + 3];
    float qr[RH][RD], m[RH];
    double sum[RH];
#pragma unroll
    for (int h = 0; h < RH; h++) {
        if (h < nh) load_row<RD, CONTIG, float>(qr[h], q, (n * Hq + h0 + h) * D, lane, D, bf);
        m[h] = -INFINITY;
        sum[h] = 0.0;
    }
    /* pass 1: running max and sum of exponentials per head */
    for (int64_t s = warp; s < nk; s += RW) {
        const int64_t base = (s < l0 ? b0 + s : b1 + s - l0) * W + kh * D; /* key s: segment 0, then 1 */
        float kr[RD];
        load_row<RD, CONTIG, KT>(kr, kc, base, lane, D, bf);
#pragma unroll
        for (int h = 0; h < RH; h++) {
            if (h >= nh) break;
            const float x = score<RD>(qr[h], kr, scale);
            if (x > m[h]) {
                sum[h] = sum[h] * exp((double)m[h] - (double)x) + 1.0;
                m[h] = x;
            } else {
                sum[h] += exp((double)x - (double)m[h]);
            }
        }
    }
    if (lane == 0)
        for (int h = 0; h < nh; h++) {
            m_sh[warp][h] = m[h];
            s_sh[warp][h] = sum[h];
        }
    __syncthreads();
    float lse[RH];
#pragma unroll
    for (int h = 0; h < RH; h++) {
        if (h >= nh) break;
        float mx = -INFINITY;
        for (int w = 0; w < RW; w++) mx = fmaxf(mx, m_sh[w][h]);
        double t = 0.0;
        for (int w = 0; w < RW; w++)
            if (m_sh[w][h] > -INFINITY) t += s_sh[w][h] * exp((double)m_sh[w][h] - (double)mx);
        lse[h] = (float)((double)mx + log(t));
    }
    /* pass 2: o = sum_s p_s v_s */
    float acc[RH][RD];
#pragma unroll
    for (int h = 0; h < RH; h++)
#pragma unroll
        for (int j = 0; j < RD; j++) acc[h][j] = 0.0f;
    for (int64_t s = warp; s < nk; s += RW) {
        const int64_t base = (s < l0 ? b0 + s : b1 + s - l0) * W + kh * D;
        float kr[RD], vr[RD];
        load_row<RD, CONTIG, KT>(kr, kc, base, lane, D, bf);
        load_row<RD, CONTIG, KT>(vr, vc, base, lane, D, bf);
#pragma unroll
        for (int h = 0; h < RH; h++) {
            if (h >= nh) break;
            const float ps = rd(expf_cr(score<RD>(qr[h], kr, scale) - lse[h]), bf);
#pragma unroll
            for (int j = 0; j < RD; j++) acc[h][j] += ps * vr[j];
        }
    }
#pragma unroll
    for (int h = 0; h < RH; h++) {
        if (h >= nh) break;
#pragma unroll
        for (int j = 0; j < RD; j++) {
            const int e = CONTIG ? lane * RD + j : lane + 32 * j;
            if (CONTIG || e < D) acc_sh[(warp * RH + h) * D + e] = acc[h][j];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
        const int h = i / D, e = i % D;
        float o = 0.0f;
        for (int w = 0; w < RW; w++) o += acc_sh[(w * RH + h) * D + e];
        out[(n * Hq + h0 + h) * D + e] = o;
    }
}

/* ---- attention_rows with the row's scores in shared memory (up to SM_SCORES bytes of them) ----
 * One block per (query row, kv head, chunk of RH query heads), 256 threads. A thread takes whole
 * keys: its scores for every head of the chunk are serial dot products over D, the CPU's order,
 * and land in shared memory; max and double sum per head come from a fixed reduction; p is
 * rounded in place; then p v is summed over key slices (a thread per pair of d and slice), the
 * slices added in order. The scores are the CPU's bits; lse's and o's sums run in another order. */
constexpr int SMT = 256;
constexpr size_t SM_SCORES = 160 * 1024;

/* Eight consecutive cache values k[d .. d + 7] as FP32 (one 16-byte load of BF16, two of FP32). */
__device__ __forceinline__ void load8(float (&x)[8], const uint16_t *k, int d)
{
    const uint4 u = *reinterpret_cast<const uint4 *>(k + d);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        x[2 * i] = __uint_as_float(w[i] << 16);
        x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void load8(float (&x)[8], const float *k, int d)
{
    const float4 a = *reinterpret_cast<const float4 *>(k + d), b = *reinterpret_cast<const float4 *>(k + d + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

/* One head's dot products with a key accumulate over d in order, the CPU's serial order, whether
 * the values come eight at a time (VEC: D % 8 == 0) or one by one. */
template <typename KT, bool VEC>
__device__ __forceinline__ void key_scores(float (&acc)[RH], const float *qs, const KT *k, int D, int nh, int bf)
{
#pragma unroll
    for (int h = 0; h < RH; h++) acc[h] = 0.0f;
    if (VEC) {
        for (int d0 = 0; d0 < D; d0 += 8) {
            float kv[8];
            load8(kv, k, d0);
#pragma unroll
            for (int j = 0; j < 8; j++) kv[j] = rd(kv[j], bf);
#pragma unroll
            for (int h = 0; h < RH; h++) {
                if (h >= nh) break;
                const float4 qa = *reinterpret_cast<const float4 *>(qs + h * D + d0);
                const float4 qb = *reinterpret_cast<const float4 *>(qs + h * D + d0 + 4);
                const float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                for (int j = 0; j < 8; j++) acc[h] += qv[j] * kv[j];
            }
        }
    } else {
        for (int d = 0; d < D; d++) {
            const float kv = rd(kv_val<KT>(k, d), bf);
#pragma unroll
            for (int h = 0; h < RH; h++)
                if (h < nh) acc[h] += qs[h * D + d] * kv;
        }
    }
}

template <typename KT, bool VEC>
__global__ void __launch_bounds__(SMT) attn_rows_sm_k(float *out, const float *q, const KT *kc, const KT *vc, const int32_t *seg,
                                                     int64_t Hq, int64_t Hkv, int D, float scale, int bf, int64_t max_keys)
{
    extern __shared__ __align__(16) float sm[]; /* q [RH][D], then scores [RH][max_keys] */
    __shared__ float wmax[SMT / 32][RH];
    __shared__ double wsum[SMT / 32][RH];
    const int64_t n = blockIdx.x, kh = blockIdx.y, group = Hq / Hkv, h0 = kh * group + (int64_t)blockIdx.z * RH;
    const int nh = (int)(group - (int64_t)blockIdx.z * RH < RH ? group - (int64_t)blockIdx.z * RH : RH);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int64_t W = Hkv * D, b0 = seg[4 * n], l0 = seg[4 * n + 1], b1 = seg[4 * n + 2], nk = l0 + seg[4 * n + 3];
    float *qs = sm, *sc = sm + RH * D;
    for (int i = tid; i < nh * D; i += SMT) qs[i] = rd(q[(n * Hq + h0) * D + i], bf);
    __syncthreads();
    for (int64_t s = tid; s < nk; s += SMT) {
        float acc[RH];
        key_scores<KT, VEC>(acc, qs, kc + (s < l0 ? b0 + s : b1 + s - l0) * W + kh * D, D, nh, bf);
        for (int h = 0; h < nh; h++) sc[h * max_keys + s] = scale * acc[h];
    }
    __syncthreads();
    /* per head: the max, then the sum of exp(x - max) in double, both over the block */
    float mx[RH];
#pragma unroll
    for (int h = 0; h < RH; h++) {
        float m = -INFINITY;
        if (h < nh)
            for (int64_t s = tid; s < nk; s += SMT) m = fmaxf(m, sc[h * max_keys + s]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) wmax[warp][h] = m;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < RH; h++) {
        mx[h] = wmax[0][h];
        for (int w = 1; w < SMT / 32; w++) mx[h] = fmaxf(mx[h], wmax[w][h]);
        double t = 0.0;
        if (h < nh)
            for (int64_t s = tid; s < nk; s += SMT) t += exp((double)sc[h * max_keys + s] - (double)mx[h]);
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0) wsum[warp][h] = t;
    }
    __syncthreads();
    float lse[RH];
#pragma unroll
    for (int h = 0; h < RH; h++) {
        double t = 0.0;
        for (int w = 0; w < SMT / 32; w++) t += wsum[w][h];
        lse[h] = (float)((double)mx[h] + log(t));
    }
    for (int64_t i = tid; i < (int64_t)nh * nk; i += SMT) { /* p = exp(x - lse), rounded as the numerics say */
        const int h = (int)(i / nk);
        const int64_t s = i % nk;
        float *x = sc + h * max_keys + s;
        *x = rd(expf_cr(*x - lse[h]), bf);
    }
    __syncthreads();
    /* o[h][d] = sum_s p[h][s] v[s][d]. A thread takes a pair of d and every KS-th key (KS key
     * slices: short dependent chains, many loads in flight), for all heads; the slices' partial
     * sums are then added in slice order. */
    __shared__ float red[2 * SMT * RH];
    const int DP = (D + 1) / 2, KS = SMT / DP, dp = tid % DP, ks = tid / DP, d = 2 * dp;
    float acc[RH][2];
#pragma unroll
    for (int h = 0; h < RH; h++) acc[h][0] = acc[h][1] = 0.0f;
    if (ks < KS) {
        const KT *v = vc + kh * D + d;
        const bool two = d + 1 < D;
        for (int64_t s0 = ks; s0 < nk; s0 += 4 * (int64_t)KS) {
            float vv[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) { /* four keys' loads issued before their sums */
                const int64_t s = s0 + (int64_t)j * KS;
                vv[j][0] = vv[j][1] = 0.0f;
                if (s < nk) {
                    const KT *vs = v + (s < l0 ? b0 + s : b1 + s - l0) * W;
                    vv[j][0] = rd(kv_val<KT>(vs, 0), bf);
                    if (two) vv[j][1] = rd(kv_val<KT>(vs, 1), bf);
                }
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t s = s0 + (int64_t)j * KS;
                if (s >= nk) break;
#pragma unroll
                for (int h = 0; h < RH; h++) {
                    if (h >= nh) break;
                    const float p = sc[h * max_keys + s];
                    acc[h][0] += p * vv[j][0];
                    acc[h][1] += p * vv[j][1];
                }
            }
        }
#pragma unroll
        for (int h = 0; h < RH; h++) {
            if (h >= nh) break;
            red[(ks * RH + h) * D + d] = acc[h][0];
            if (two) red[(ks * RH + h) * D + d + 1] = acc[h][1];
        }
    }
    __syncthreads();
    for (int i = tid; i < nh * D; i += SMT) {
        const int h = i / D, e = i % D;
        float o = 0.0f;
        for (int k = 0; k < KS; k++) o += red[(k * RH + h) * D + e];
        out[(n * Hq + h0 + h) * D + e] = o;
    }
}

template <typename KT>
static cudaError_t launch_rows(cudaStream_t s, float *out, const float *q, const void *kc, const void *vc, const int32_t *seg,
                               int64_t N, int64_t Hq, int64_t Hkv, int D, float scale, int bf, int64_t max_keys)
{
    const dim3 grid((unsigned)N, (unsigned)Hkv, (unsigned)((Hq / Hkv + RH - 1) / RH));
    const size_t smb = ((size_t)RH * D + (size_t)RH * (size_t)max_keys) * sizeof(float);
    if (smb <= SM_SCORES) { /* the scores fit in shared memory */
        const bool vec = D % 8 == 0 && (uintptr_t)kc % 16 == 0 && (uintptr_t)vc % 16 == 0;
        void (*k)(float *, const float *, const KT *, const KT *, const int32_t *, int64_t, int64_t, int, float, int, int64_t) =
            vec ? attn_rows_sm_k<KT, true> : attn_rows_sm_k<KT, false>;
        /* beyond 48 KB by opt-in (a host-side attribute of the current device, cheap to set each time) */
        cudaError_t err = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SM_SCORES);
        if (err != cudaSuccess) return err;
        k<<<grid, SMT, smb, s>>>(out, q, (const KT *)kc, (const KT *)vc, seg, Hq, Hkv, D, scale, bf, max_keys);
        return cudaSuccess;
    }
    const size_t sh = (size_t)RW * RH * D * sizeof(float);
    const KT *k = (const KT *)kc, *v = (const KT *)vc;
#define ROWS_K(RD, C) attn_rows_k<RD, C, KT><<<grid, RW * 32, sh, s>>>(out, q, k, v, seg, Hq, Hkv, D, scale, bf)
    switch (D) {
    case 32: ROWS_K(1, true); break;
    case 64: ROWS_K(2, true); break;
    case 128: ROWS_K(4, true); break;
    case 256: ROWS_K(8, true); break;
    default: ROWS_K(8, false); break;
    }
#undef ROWS_K
    return cudaSuccess;
}

/* ---- attention_rows split over chunks of keys (flash-decoding's split, deterministic) ----
 * For BF16 caches with head dims 64 and 128. A row's keys are cut into chunks of SK_C keys from
 * key 0; every (row, kv head, block of RH query heads, chunk) is a block of SK_T threads, and
 * three kernels run:
 *  1. scores: the chunk's keys and values arrive as 16-byte coalesced loads into shared memory;
 *     a thread per (key, four heads) forms each score as today's kernel does (a serial dot
 *     product over d in the CPU's order, times scale: the CPU's bits) and stores it to a global
 *     scratch; per head the chunk's max and double sum of exp(x - max) (a fixed warp tree).
 *  2. p v: every chunk block forms the row's lse from all of the row's chunk statistics in a
 *     fixed order (lane-strided over chunks, then a fixed warp tree), p = rd(exp(x - lse)) as the
 *     contract says, and the chunk's partial o[h][d] = sum over its keys in key order.
 *  3. o = the chunks' partials summed in chunk order.
 * Every order above depends only on the row's own key count: not on N, the batch, its other rows,
 * the grid (blocks stride over chunks, each chunk computed alike), nor max_keys; so a row's bits
 * are the same alone or in any batch, eager or replayed from a CUDA graph. The grids depend only
 * on N, the heads and max_keys (blocks past a row's own chunks exit at once), so a recorded step
 * stays valid while the rows' key counts grow. The scratch comes from the caching allocator, sized
 * by N and max_keys (fixed for a rollout graph's bucket), rows taken SK_CAP bytes' worth at a time. */
constexpr int SK_C = 64;                /* keys per chunk */
constexpr int SK_T = 128;               /* threads per block: two per key in pass 1 (four heads each) */
constexpr int SK_CX = 16;               /* most blocks per (row, head block) along the chunks; they stride */
constexpr size_t SK_CAP = (size_t)64 << 20; /* scratch bytes per group of rows */
static_assert(SK_C == 64 && SK_T == 2 * SK_C && RH == 8 && (RH * 64 / SK_T) % 4 == 0, "pass 1 maps a thread to (key, four heads); stats read two keys a lane");

struct split_ws {
    double *csum;    /* [rows, Hq, mc]: the chunk's sum of exp(x - chunk max) */
    float *cmax;     /* [rows, Hq, mc] */
    float *sc;       /* [rows, Hq, max_keys]: the scores */
    float *part;     /* [rows, Hq, mc, D]: the chunk's partial o */
    int64_t max_keys, mc;
};

struct split_row {
    int64_t b0, l0, b1, nk, nc;
};
__device__ __forceinline__ split_row split_row_of(const int32_t *seg, int64_t n, int64_t max_keys)
{
    split_row r;
    r.b0 = seg[4 * n], r.l0 = seg[4 * n + 1], r.b1 = seg[4 * n + 2];
    r.nk = r.l0 + seg[4 * n + 3];
    if (r.nk > max_keys) r.nk = max_keys; /* the contract forbids it; the scratch must not overflow */
    if (r.nk < 0) r.nk = 0;
    r.nc = (r.nk + SK_C - 1) / SK_C;
    return r;
}

/* A chunk's rows of the cache (keys s0 .. s0 + SK_C - 1 of the row; zeros past its keys) as
 * 16-byte pieces in registers, then into shared memory rows of D + 8 halves (16-byte phases
 * of a quarter warp fall in distinct banks). */
template <int D> struct kv_tile {
    static constexpr int V = D / 8, PER = SK_C * V / SK_T, STRIDE = D + 8;
    uint4 r[PER];
    __device__ __forceinline__ void load(const uint16_t *c, const split_row &rw, int64_t s0, int64_t W, int64_t kh)
    {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int idx = (int)threadIdx.x + SK_T * i, j = idx / V, v = idx % V;
            const int64_t s = s0 + j;
            r[i] = make_uint4(0u, 0u, 0u, 0u);
            if (s < rw.nk) r[i] = reinterpret_cast<const uint4 *>(c + (s < rw.l0 ? rw.b0 + s : rw.b1 + s - rw.l0) * W + kh * D)[v];
        }
    }
    __device__ __forceinline__ void store(uint16_t *sh) const
    {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int idx = (int)threadIdx.x + SK_T * i, j = idx / V, v = idx % V;
            *reinterpret_cast<uint4 *>(sh + j * STRIDE + v * 8) = r[i];
        }
    }
};

/* The block's row, kv head and first query head (grid: chunks, Hkv * head blocks, rows). */
struct split_ids {
    int64_t n, kh, h0;
    int nh;
};
__device__ __forceinline__ split_ids split_ids_of(int64_t Hq, int64_t Hkv)
{
    split_ids b;
    const int64_t group = Hq / Hkv, hb = (group + RH - 1) / RH, blk = (int64_t)blockIdx.y % hb;
    b.n = blockIdx.z;
    b.kh = (int64_t)blockIdx.y / hb;
    b.h0 = b.kh * group + blk * RH;
    b.nh = (int)(group - blk * RH < RH ? group - blk * RH : RH);
    return b;
}

template <int D>
__global__ void __launch_bounds__(SK_T) attn_split_scores_k(split_ws w, const float *q, const uint16_t *kc, const int32_t *seg, int64_t Hq,
                                                           int64_t Hkv, float scale, int bf)
{
    __shared__ __align__(16) float qs[RH * D];
    __shared__ __align__(16) uint16_t ks[SK_C * kv_tile<D>::STRIDE];
    __shared__ float xs[RH][SK_C];
    const split_ids b = split_ids_of(Hq, Hkv);
    const split_row rw = split_row_of(seg, b.n, w.max_keys);
    if ((int64_t)blockIdx.x >= rw.nc) return;
    const int tid = threadIdx.x, j = tid % SK_C, hs = tid / SK_C, warp = tid / 32, lane = tid % 32;
    const int64_t W = Hkv * D;
    for (int i = tid; i < RH * D; i += SK_T) qs[i] = i < b.nh * D ? rd(q[(b.n * Hq + b.h0) * D + i], bf) : 0.0f;
    for (int64_t c = blockIdx.x; c < rw.nc; c += gridDim.x) {
        const int64_t s0 = c * SK_C;
        const int cnt = (int)(rw.nk - s0 < SK_C ? rw.nk - s0 : SK_C);
        kv_tile<D> t;
        t.load(kc, rw, s0, W, b.kh);
        __syncthreads(); /* q in place; the last chunk's readers done */
        t.store(ks);
        __syncthreads();
        if (j < cnt) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const uint16_t *kr = ks + j * kv_tile<D>::STRIDE;
#pragma unroll 4
            for (int d0 = 0; d0 < D; d0 += 8) {
                float kv[8];
                load8(kv, kr, d0);
#pragma unroll
                for (int e = 0; e < 8; e++) kv[e] = rd(kv[e], bf);
#pragma unroll
                for (int hh = 0; hh < 4; hh++) {
                    const float *qh = qs + (hs * 4 + hh) * D + d0;
                    const float4 qa = *reinterpret_cast<const float4 *>(qh), qb = *reinterpret_cast<const float4 *>(qh + 4);
                    const float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[hh] += qv[e] * kv[e];
                }
            }
#pragma unroll
            for (int hh = 0; hh < 4; hh++) {
                const int h = hs * 4 + hh;
                if (h < b.nh) {
                    const float x = scale * acc[hh];
                    xs[h][j] = x;
                    w.sc[(b.n * Hq + b.h0 + h) * w.max_keys + s0 + j] = x;
                }
            }
        }
        __syncthreads();
        for (int h = warp; h < b.nh; h += SK_T / 32) { /* the chunk's max and sum per head: a fixed tree */
            const bool in0 = lane < cnt, in1 = lane + 32 < cnt;
            const float x0 = in0 ? xs[h][lane] : -INFINITY, x1 = in1 ? xs[h][lane + 32] : -INFINITY;
            float m = fmaxf(x0, x1);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            double t = in0 ? exp((double)x0 - (double)m) : 0.0;
            if (in1) t += exp((double)x1 - (double)m);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (lane == 0) {
                const int64_t i = (b.n * Hq + b.h0 + h) * w.mc + c;
                w.cmax[i] = m;
                w.csum[i] = t;
            }
        }
    }
}

template <int D>
__global__ void __launch_bounds__(SK_T) attn_split_pv_k(split_ws w, const uint16_t *vc, const int32_t *seg, int64_t Hq, int64_t Hkv, int bf)
{
    constexpr int HPV = RH * D / SK_T; /* heads per thread: a thread per (d, slice of heads) */
    __shared__ __align__(16) uint16_t vs[SK_C * kv_tile<D>::STRIDE];
    __shared__ __align__(16) float ps[SK_C][RH]; /* p by key, then head: a thread's heads are one or two 16-byte reads */
    __shared__ float lse_sh[RH];
    const split_ids b = split_ids_of(Hq, Hkv);
    const split_row rw = split_row_of(seg, b.n, w.max_keys);
    if ((int64_t)blockIdx.x >= rw.nc) return;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, d = tid % D, hs = tid / D;
    const int64_t W = Hkv * D;
    /* the row's lse per head from all its chunks: lane-strided over chunks, then a fixed tree */
    for (int h = warp; h < b.nh; h += SK_T / 32) {
        const int64_t base = (b.n * Hq + b.h0 + h) * w.mc;
        float m = -INFINITY;
        for (int64_t c = lane; c < rw.nc; c += 32) m = fmaxf(m, w.cmax[base + c]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        double t = 0.0;
        for (int64_t c = lane; c < rw.nc; c += 32) t += w.csum[base + c] * exp((double)w.cmax[base + c] - (double)m);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (lane == 0) lse_sh[h] = (float)((double)m + log(t));
    }
    for (int64_t c = blockIdx.x; c < rw.nc; c += gridDim.x) {
        const int64_t s0 = c * SK_C;
        const int cnt = (int)(rw.nk - s0 < SK_C ? rw.nk - s0 : SK_C);
        kv_tile<D> t;
        t.load(vc, rw, s0, W, b.kh);
        __syncthreads(); /* lse in place; the last chunk's readers done */
        t.store(vs);
        for (int i = tid; i < RH * SK_C; i += SK_T) {
            const int h = i / SK_C, jj = i % SK_C;
            ps[jj][h] = h < b.nh && jj < cnt ? rd(expf_cr(w.sc[(b.n * Hq + b.h0 + h) * w.max_keys + s0 + jj] - lse_sh[h]), bf) : 0.0f;
        }
        __syncthreads();
        float acc[HPV];
#pragma unroll
        for (int hh = 0; hh < HPV; hh++) acc[hh] = 0.0f;
#pragma unroll 4
        for (int jj = 0; jj < cnt; jj++) { /* keys in order: o[d] += p v[d], the CPU's product */
            const float v = rd(fp4rl_bf16_to_f32(vs[jj * kv_tile<D>::STRIDE + d]), bf);
            float p[HPV];
#pragma unroll
            for (int i = 0; i < HPV; i += 4) {
                const float4 p4 = *reinterpret_cast<const float4 *>(&ps[jj][hs * HPV + i]);
                p[i] = p4.x, p[i + 1] = p4.y, p[i + 2] = p4.z, p[i + 3] = p4.w;
            }
#pragma unroll
            for (int hh = 0; hh < HPV; hh++) acc[hh] += p[hh] * v;
        }
#pragma unroll
        for (int hh = 0; hh < HPV; hh++) {
            const int h = hs * HPV + hh;
            if (h < b.nh) w.part[((b.n * Hq + b.h0 + h) * w.mc + c) * D + d] = acc[hh];
        }
    }
}

/* o = the chunks' partials in chunk order; block (h, row), D threads. */
__global__ void attn_split_sum_k(float *out, split_ws w, const int32_t *seg, int64_t Hq, int D)
{
    const int64_t h = blockIdx.x, n = blockIdx.y, d = threadIdx.x;
    const split_row rw = split_row_of(seg, n, w.max_keys);
    const float *p = w.part + (n * Hq + h) * w.mc * D + d;
    float o = 0.0f;
    for (int64_t c = 0; c < rw.nc; c++) o += p[c * D];
    out[(n * Hq + h) * D + d] = o;
}

/* The split path's cases: BF16 caches of head dim 64 or 128 read as 16-byte vectors. */
static bool split_ok(int kv_bf16, const void *kc, const void *vc, int64_t Hq, int64_t Hkv, int64_t D)
{
    static int mode = -1; /* on unless FP4RL_ATTN_SPLIT=0 (3B BF16 rollout 13% faster on an H100, bench/RESULTS.md) */
    if (mode < 0) {
        const char *e = getenv("FP4RL_ATTN_SPLIT");
        mode = !(e && e[0] == '0');
    }
    return mode && kv_bf16 && (D == 64 || D == 128) && Hkv > 0 && Hq % Hkv == 0 && ((uintptr_t)kc | (uintptr_t)vc) % 16 == 0;
}

template <int D>
static fp4rl_status launch_split(fp4rl_context *ctx, cudaStream_t s, float *out, const float *q, const uint16_t *kc, const uint16_t *vc,
                                 const int32_t *seg, int64_t N, int64_t max_keys, int64_t Hq, int64_t Hkv, float scale, int bf)
{
    if (max_keys < 1) max_keys = 1;
    const int64_t mc = (max_keys + SK_C - 1) / SK_C, group = Hq / Hkv, hb = (group + RH - 1) / RH;
    const size_t per_row = (size_t)Hq * ((size_t)mc * (sizeof(double) + sizeof(float) + (size_t)D * sizeof(float)) +
                                         (size_t)max_keys * sizeof(float));
    int64_t rb = (int64_t)(SK_CAP / per_row);
    if (rb < 1) rb = 1;
    if (rb > 65535) rb = 65535;
    if (rb > N) rb = N;
    void *ws = NULL;
    fp4rl_status st = fp4rl_cuda_alloc_bytes(ctx, &ws, (size_t)rb * per_row);
    if (st) return st;
    split_ws w;
    const size_t nstat = (size_t)rb * (size_t)Hq * (size_t)mc;
    w.csum = static_cast<double *>(ws);
    w.cmax = reinterpret_cast<float *>(w.csum + nstat);
    w.sc = w.cmax + nstat;
    w.part = w.sc + (size_t)rb * (size_t)Hq * (size_t)max_keys;
    w.max_keys = max_keys;
    w.mc = mc;
    for (int64_t n0 = 0; n0 < N && !st; n0 += rb) { /* rows are independent: a group's size changes no bits */
        const int64_t nr = N - n0 < rb ? N - n0 : rb;
        const float *qg = q + n0 * Hq * D;
        const int32_t *sg = seg + 4 * n0;
        const dim3 grid((unsigned)(mc < SK_CX ? mc : SK_CX), (unsigned)(Hkv * hb), (unsigned)nr);
        attn_split_scores_k<D><<<grid, SK_T, 0, s>>>(w, qg, kc, sg, Hq, Hkv, scale, bf);
        attn_split_pv_k<D><<<grid, SK_T, 0, s>>>(w, vc, sg, Hq, Hkv, bf);
        attn_split_sum_k<<<dim3((unsigned)Hq, (unsigned)nr), D, 0, s>>>(out + n0 * Hq * D, w, sg, Hq, D);
        st = fp4rl_cuda_check_launch(ctx, "attention_rows (split)");
    }
    fp4rl_cuda_free_bytes(ctx, ws); /* stream order keeps later users of the block after these kernels */
    return st;
}

/* dq of one query row (block = ((b * T + t) * Hq + h)): dq += sum_{s <= t} ds_s k_s, serial in s. */
__global__ void __launch_bounds__(AT) attn_bwd_dq_k(float *dq, const float *dout, const float *q, const float *k, const float *v,
                                                    const float *out, const float *lse, const int32_t *lengths, int64_t T,
                                                    int64_t Hq, int64_t Hkv, int64_t D, float scale, int bf)
{
    extern __shared__ float dyn[];
    __shared__ float sds[AT];
    __shared__ float sdelta;
    float *sq = dyn, *sdo = dyn + D, *sacc = dyn + 2 * D;
    const int64_t row = blockIdx.x, h = row % Hq, bt = row / Hq, t = bt % T, b = bt / T;
    if (t >= seq_len(lengths, b, T)) return;
    const int64_t kh = h / (Hq / Hkv);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        sq[d] = rd(q[row * D + d], bf);
        sdo[d] = rd(dout[row * D + d], bf);
        sacc[d] = dq[row * D + d];
    }
    if (threadIdx.x == 0) { /* from global memory: the other threads' sdo writes are not yet visible */
        float dl = 0.0f;
        for (int64_t d = 0; d < D; d++) dl += rd(dout[row * D + d], bf) * out[row * D + d];
        sdelta = dl;
    }
    __syncthreads();
    const float row_lse = lse[(b * Hq + h) * T + t], delta = sdelta;
    for (int64_t c0 = 0; c0 <= t; c0 += AT) {
        const int64_t nc = t + 1 - c0 < AT ? t + 1 - c0 : AT;
        if (threadIdx.x < nc) {
            const int64_t kv = ((b * T + c0 + threadIdx.x) * Hkv + kh) * D;
            const float p = rd(expf_cr(scale * dot(sq, k + kv, D, bf) - row_lse), bf);
            sds[threadIdx.x] = rd(p * (dot(sdo, v + kv, D, bf) - delta) * scale, bf);
        }
        __syncthreads();
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            float a = sacc[d];
            for (int64_t j = 0; j < nc; j++) a += sds[j] * rd(k[((b * T + c0 + j) * Hkv + kh) * D + d], bf);
            sacc[d] = a;
        }
        __syncthreads();
    }
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dq[row * D + d] = sacc[d];
}

/* dk, dv of one key row (block = ((b * T + s) * Hkv + kh)): the CPU adds the contributions of the
 * queries t = s .. len-1, and for each the heads of the group in order; so do we, serially. */
__global__ void __launch_bounds__(AT) attn_bwd_dkv_k(float *dk, float *dv, const float *dout, const float *q, const float *k,
                                                     const float *v, const float *out, const float *lse, const int32_t *lengths,
                                                     int64_t T, int64_t Hq, int64_t Hkv, int64_t D, float scale, int bf)
{
    extern __shared__ float dyn[];
    __shared__ float sp[AT], sds[AT];
    float *sk = dyn, *sv = dyn + D, *adk = dyn + 2 * D, *adv = dyn + 3 * D;
    const int64_t krow = blockIdx.x, kh = krow % Hkv, bs = krow / Hkv, s = bs % T, b = bs / T;
    const int64_t len = seq_len(lengths, b, T);
    if (s >= len) return;
    const int64_t group = Hq / Hkv;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        sk[d] = rd(k[krow * D + d], bf);
        sv[d] = rd(v[krow * D + d], bf);
        adk[d] = dk[krow * D + d];
        adv[d] = dv[krow * D + d];
    }
    __syncthreads();
    const int64_t npairs = (len - s) * group;
    for (int64_t c0 = 0; c0 < npairs; c0 += AT) {
        const int64_t nc = npairs - c0 < AT ? npairs - c0 : AT;
        if (threadIdx.x < nc) {
            const int64_t j = c0 + threadIdx.x, t = s + j / group, h = kh * group + j % group;
            const int64_t row = ((b * T + t) * Hq + h) * D;
            float delta = 0.0f;
            for (int64_t d = 0; d < D; d++) delta += rd(dout[row + d], bf) * out[row + d];
            const float p = rd(expf_cr(scale * dot(q + row, sk, D, bf) - lse[(b * Hq + h) * T + t]), bf);
            sp[threadIdx.x] = p;
            sds[threadIdx.x] = rd(p * (dot(dout + row, sv, D, bf) - delta) * scale, bf);
        }
        __syncthreads();
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            float ak = adk[d], av = adv[d];
            for (int64_t jj = 0; jj < nc; jj++) {
                const int64_t j = c0 + jj, t = s + j / group, h = kh * group + j % group;
                const int64_t row = ((b * T + t) * Hq + h) * D;
                ak += sds[jj] * rd(q[row + d], bf);
                av += sp[jj] * rd(dout[row + d], bf);
            }
            adk[d] = ak;
            adv[d] = av;
        }
        __syncthreads();
    }
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        dk[krow * D + d] = adk[d];
        dv[krow * D + d] = adv[d];
    }
}

} // namespace

/* The tiled kernels read their tensors as 16-byte vectors. */
static int aligned16(const float *a, const float *b, const float *c)
{
    return ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16 == 0;
}

fp4rl_status fp4rl_cuda_attention_forward(fp4rl_context *ctx, float *out, float *lse, const float *q, const float *k, const float *v,
                                          const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                                          fp4rl_att_numerics nm)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    const float scale = 1.0f / sqrtf((float)D);
    const int bf = nm == FP4RL_ATT_BF16;
    if (bf && fp4rl_cuda_attention_gemm_ok(D) && aligned16(q, k, v) && aligned16(out, out, out))
        return fp4rl_cuda_attention_forward_gemm(ctx, s, out, lse, q, k, v, lengths, B, T, Hq, Hkv, D, scale);
    if (!bf && fp4rl_cuda_attention_tiled_ok(B, Hq, D) && aligned16(q, k, v))
        return fp4rl_cuda_attention_forward_tiled(ctx, s, out, lse, q, k, v, lengths, B, T, Hq, Hkv, D, scale);
    attn_fwd_k<<<(unsigned)(B * T * Hq), AT, 2 * D * sizeof(float), s>>>(out, lse, q, k, v, lengths, T, Hq, Hkv, D, scale, bf);
    return fp4rl_cuda_check_launch(ctx, "attention_forward");
}

fp4rl_status fp4rl_cuda_attention_backward(fp4rl_context *ctx, float *dq, float *dk, float *dv, const float *dout, const float *q,
                                           const float *k, const float *v, const float *out, const float *lse,
                                           const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                                           fp4rl_att_numerics nm)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    const float scale = 1.0f / sqrtf((float)D);
    const int bf = nm == FP4RL_ATT_BF16;
    if (bf && fp4rl_cuda_attention_gemm_ok(D) && aligned16(q, k, v) && aligned16(dout, dk, dv) && aligned16(dq, out, out))
        return fp4rl_cuda_attention_backward_gemm(ctx, s, dq, dk, dv, dout, q, k, v, out, lse, lengths, B, T, Hq, Hkv, D, scale);
    if (!bf && fp4rl_cuda_attention_tiled_ok(B, Hq, D) && aligned16(q, k, v) && aligned16(dout, dk, dv))
        return fp4rl_cuda_attention_backward_tiled(ctx, s, dq, dk, dv, dout, q, k, v, out, lse, lengths, B, T, Hq, Hkv, D, scale);
    attn_bwd_dq_k<<<(unsigned)(B * T * Hq), AT, 3 * D * sizeof(float), s>>>(dq, dout, q, k, v, out, lse, lengths, T, Hq, Hkv, D, scale,
                                                                              bf);
    if ((st = fp4rl_cuda_check_launch(ctx, "attention_backward (dq)"))) return st;
    attn_bwd_dkv_k<<<(unsigned)(B * T * Hkv), AT, 4 * D * sizeof(float), s>>>(dk, dv, dout, q, k, v, out, lse, lengths, T, Hq, Hkv, D,
                                                                               scale, bf);
    return fp4rl_cuda_check_launch(ctx, "attention_backward (dk, dv)");
}

fp4rl_status fp4rl_cuda_attention_rows(fp4rl_context *ctx, float *out, const float *q, const void *kc, const void *vc, int kv_bf16,
                                       const int32_t *seg, int64_t N, int64_t max_keys, int64_t Hq, int64_t Hkv, int64_t D,
                                       fp4rl_att_numerics nm)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st || N <= 0) return st;
    if (D > 256) return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "attention_rows: head dim %lld > 256 is not supported on CUDA", (long long)D);
    const float scale = 1.0f / sqrtf((float)D);
    const int bf = nm == FP4RL_ATT_BF16;
    if (split_ok(kv_bf16, kc, vc, Hq, Hkv, D))
        return D == 64 ? launch_split<64>(ctx, s, out, q, (const uint16_t *)kc, (const uint16_t *)vc, seg, N, max_keys, Hq, Hkv, scale, bf)
                       : launch_split<128>(ctx, s, out, q, (const uint16_t *)kc, (const uint16_t *)vc, seg, N, max_keys, Hq, Hkv, scale, bf);
    const cudaError_t err = kv_bf16 ? launch_rows<uint16_t>(s, out, q, kc, vc, seg, N, Hq, Hkv, (int)D, scale, bf, max_keys)
                                    : launch_rows<float>(s, out, q, kc, vc, seg, N, Hq, Hkv, (int)D, scale, bf, max_keys);
    if (err != cudaSuccess) return fp4rl_cuda_fail(ctx, err, "attention_rows: cudaFuncSetAttribute");
    return fp4rl_cuda_check_launch(ctx, "attention_rows");
}
