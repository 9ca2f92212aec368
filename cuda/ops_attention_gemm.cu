/*
 * ops_attention_gemm.cu - training attention in BF16 numerics (core/backend/ops.h) on the tensor
 * cores, as strided-batched cuBLASLt GEMMs over materialised scores plus small row kernels.
 *
 * Why not a fused flash kernel: at RL lengths (hundreds to a few thousand tokens) the score matrix
 * of a few sequences is tens of MB, so writing it costs microseconds of HBM time, while the GEMMs
 * run at cuBLASLt's tensor-core speed; and the two-pass softmax the BF16 contract defines (lse
 * first, then p = bf16(exp(x - lse))) is exactly what a materialised row gives, so the GPU
 * computes the CPU reference's values with only FP32 summation order differing.
 *
 * Layout: q, k, v (and dout) are rounded to BF16 into head-major copies [B, H, T, D]. With GQA the
 * `group` query heads of one kv head are then consecutive, so the group's rows (g, t) form one
 * [group * T, D] matrix against its kv head's [T, D]: one batch entry per (sequence, kv head), and
 * dk / dv come out of one GEMM each with the group's heads summed inside (K = group * T).
 *   forward:  S = scale Q K^T (FP32) -> lse, P = bf16(exp(S - lse)) -> O = P V
 *   backward: S again -> P (the forward's bits: same GEMM, same lse) -> dV = P^T dO;
 *             dP = dO V^T; dS = bf16(P (dP - delta) scale) in place of P; dQ = dS K; dK = dS^T Q
 * Scores are made for a chunk of batch entries at a time (CHUNK_BYTES of scratch), causal and
 * length masks are applied in the row kernels (masked entries are exact zeros in P and dS).
 */
#include <math.h>

#include "cuda_internal.h"
#include "format/formats.h"
#include "ops_cuda.h"

using namespace fp4rl_cuda_ops_detail;

namespace {

constexpr int64_t CHUNK_BYTES = 256ll << 20; /* score scratch (FP32 S + BF16 P) per chunk */

__device__ __forceinline__ int64_t len_of(const int32_t *lengths, int64_t b, int64_t T)
{
    if (!lengths) return T;
    const int64_t n = lengths[b];
    return n < 0 ? 0 : (n > T ? T : n);
}

/* The layout kernels move rows of D floats between [B, T, H, D] and [B, H, T, D], four elements
 * per thread (D % 8 == 0): the row arithmetic (three divisions) is done once per four elements,
 * and loads and stores are 16 / 8-byte vectors. Row r of the head-major side is (b, h, t). */
struct RowIdx {
    int64_t b, h, t, bthd; /* bthd: the element offset of the row in [B, T, H, D] */
};
__device__ __forceinline__ RowIdx row_idx(int64_t r, int64_t T, int64_t H, int64_t D)
{
    RowIdx x;
    x.t = r % T;
    const int64_t bh = r / T;
    x.h = bh % H;
    x.b = bh / H;
    x.bthd = ((x.b * T + x.t) * H + x.h) * D;
    return x;
}

/* dst [B, H, T, D] BF16 = src [B, T, H, D] rounded to nearest even; rows at or past a sequence's
 * length are zeros (padding never reaches a GEMM: 0 * NaN would). */
__global__ void to_heads_k(uint16_t *dst, const float *src, const int32_t *lengths, int64_t B, int64_t T, int64_t H, int64_t D)
{
    const int64_t D4 = D / 4, n = B * H * T * D4;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / D4, d = (i - r * D4) * 4;
        const RowIdx x = row_idx(r, T, H, D);
        uint2 o = make_uint2(0, 0);
        if (x.t < len_of(lengths, x.b, T)) {
            const float4 v = *reinterpret_cast<const float4 *>(src + x.bthd + d);
            o.x = (uint32_t)fp4rl_f32_to_bf16(v.x) | (uint32_t)fp4rl_f32_to_bf16(v.y) << 16;
            o.y = (uint32_t)fp4rl_f32_to_bf16(v.z) | (uint32_t)fp4rl_f32_to_bf16(v.w) << 16;
        }
        *reinterpret_cast<uint2 *>(dst + r * D + d) = o;
    }
}

/* dst [B, T, H, D] (+)= src [B, H, T, D] FP32 for the sequences' valid rows (add: +=, else =; the
 * padded rows of a written dst get zeros) */
__global__ void from_heads_k(float *dst, const float *src, int add, const int32_t *lengths, int64_t B, int64_t T, int64_t H,
                             int64_t D)
{
    const int64_t D4 = D / 4, n = B * H * T * D4;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / D4, d = (i - r * D4) * 4;
        const RowIdx x = row_idx(r, T, H, D);
        const int valid = x.t < len_of(lengths, x.b, T);
        float4 *o = reinterpret_cast<float4 *>(dst + x.bthd + d);
        const float4 v = valid ? *reinterpret_cast<const float4 *>(src + r * D + d) : make_float4(0, 0, 0, 0);
        if (!add) {
            *o = v;
        } else if (valid) {
            float4 w = *o;
            w.x += v.x, w.y += v.y, w.z += v.z, w.w += v.w;
            *o = w;
        }
    }
}

/* delta[(b * H + h) * T + t] = bf16(dout) . out over the row: a warp per row, each lane a strided
 * share of the row, then a fixed tree (deterministic; the CPU sums serially: FP32 order only) */
__global__ void delta_k(float *delta, const float *dout, const float *out, const int32_t *lengths, int64_t B, int64_t T, int64_t H,
                        int64_t D)
{
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= B * H * T) return;
    const RowIdx x = row_idx(r, T, H, D);
    float s = 0.0f;
    if (x.t < len_of(lengths, x.b, T))
        for (int64_t d = lane; d < D; d += 32) s += fp4rl_round_bf16(dout[x.bthd + d]) * out[x.bthd + d];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) delta[r] = s;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum(double v)
{
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One warp per score row r of the chunk (rows (entry, g, t), entry = b * Hkv + kh): the keys of
 * query t are s <= t and s < len. With compute_lse: lse = max + log(sum exp(x - max)) (double
 * sum), stored; else the saved lse is read. Then P[r, s] = bf16(exp(x - lse)), zeros where masked. */
__global__ void probs_k(uint16_t *P, const float *S, float *lse, int compute_lse, const int32_t *lengths, int64_t e0, int64_t rows,
                        int64_t T, int64_t group, int64_t Hkv)
{
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const int64_t t = r % T, e = e0 + r / (T * group), b = e / Hkv, len = len_of(lengths, b, T);
    const float *x = S + r * T;
    uint16_t *p = P + r * T;
    /* the lse index: (b * Hq + h) * T + t with h = kh * group + g, which is (e0 * group) * T + r */
    float *l = lse + e0 * group * T + r;
    const int64_t nk = t < len ? t + 1 : 0;
    float row_lse;
    if (compute_lse) {
        float m = -INFINITY;
        for (int64_t s = lane; s < nk; s += 32) m = fmaxf(m, x[s]);
        m = warp_max(m);
        double sum = 0.0;
        for (int64_t s = lane; s < nk; s += 32) sum += exp((double)x[s] - (double)m);
        sum = warp_sum(sum);
        row_lse = nk ? (float)((double)m + log(sum)) : 0.0f;
        if (lane == 0) *l = row_lse;
    } else {
        row_lse = *l;
    }
    for (int64_t s = lane; s < T; s += 32) p[s] = s < nk ? fp4rl_f32_to_bf16(expf_cr(x[s] - row_lse)) : 0;
}

/* dS = bf16(p (dp - delta) scale), in place over P (row r as in probs_k) */
__global__ void dscore_k(uint16_t *PdS, const float *dP, const float *delta, int64_t e0, int64_t rows, int64_t T, int64_t group,
                         float scale)
{
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float dl = delta[e0 * group * T + r];
    uint16_t *p = PdS + r * T;
    const float *g = dP + r * T;
    for (int64_t s = lane; s < T; s += 32) {
        const float pv = fp4rl_bf16_to_f32(p[s]);
        p[s] = pv == 0.0f ? 0 : fp4rl_f32_to_bf16(pv * (g[s] - dl) * scale);
    }
}

/* the GEMMs (fp4rl_cuda_gemm_shape): BF16 operands, FP32 C, `n` batch entries */
struct Gemm {
    fp4rl_context *ctx;
    const char *what;
    fp4rl_status run(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t batch, int64_t sa,
                     int64_t sb, int64_t sc, const void *a, const void *b, void *c, int c_bf16, float alpha, float beta) const
    {
        const fp4rl_cuda_gemm_shape g = {ta, tb, m, n, k, lda, ldb, ldc, batch, sa, sb, sc, (int)CUDA_R_16BF,
                                         (int)(c_bf16 ? CUDA_R_16BF : CUDA_R_32F)};
        if (!fp4rl_cuda_lt_gemm_ex(fp4rl_cuda_of(ctx), &g, a, b, c, alpha, beta))
            return fp4rl_fail(FP4RL_ERR_DEVICE, "%s: cuBLASLt has no algorithm for a [%lld x %lld x %lld] x %lld batched GEMM", what,
                              (long long)m, (long long)n, (long long)k, (long long)batch);
        return fp4rl_cuda_check_launch(ctx, what);
    }
};

/* entries per chunk: each needs group*T*T FP32 scores and as many BF16 probabilities */
int64_t chunk_entries(int64_t entries, int64_t T, int64_t group)
{
    const int64_t per = group * T * T * 6, n = CHUNK_BYTES / per;
    return n < 1 ? 1 : (n > entries ? entries : n);
}

/* scratch of one call, freed together */
struct Scratch {
    fp4rl_context *ctx;
    void *p[10] = {};
    int n = 0;
    fp4rl_status st = FP4RL_OK;
    template <typename T> T *get(int64_t elems)
    {
        void *x = NULL;
        if (!st) st = fp4rl_cuda_alloc_bytes(ctx, &x, (size_t)elems * sizeof(T));
        if (!st) p[n++] = x;
        return static_cast<T *>(x);
    }
    ~Scratch()
    {
        for (int i = n - 1; i >= 0; i--) fp4rl_cuda_free_bytes(ctx, p[i]);
    }
};

constexpr int RB = 256; /* row kernels: 8 warps, a row each */
unsigned row_blocks(int64_t rows) { return (unsigned)((rows + RB / 32 - 1) / (RB / 32)); }

} // namespace

int fp4rl_cuda_attention_gemm_ok(int64_t D) { return D % 8 == 0; /* 16-byte aligned BF16 rows and batch strides */ }

fp4rl_status fp4rl_cuda_attention_forward_gemm(fp4rl_context *ctx, cudaStream_t s, float *out, float *lse, const float *q, const float *k,
                                               const float *v, const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                                               int64_t D, float scale)
{
    const int64_t group = Hq / Hkv, E = B * Hkv, gT = group * T, ec = chunk_entries(E, T, group);
    Scratch m{ctx};
    uint16_t *qh = m.get<uint16_t>(B * Hq * T * D), *kh = m.get<uint16_t>(E * T * D), *vh = m.get<uint16_t>(E * T * D);
    float *S = m.get<float>(ec * gT * T), *Oh = m.get<float>(B * Hq * T * D);
    uint16_t *P = m.get<uint16_t>(ec * gT * T);
    if (m.st) return m.st;
    to_heads_k<<<ew_grid(B * Hq * T * D / 4), 256, 0, s>>>(qh, q, lengths, B, T, Hq, D);
    to_heads_k<<<ew_grid(E * T * D / 4), 256, 0, s>>>(kh, k, lengths, B, T, Hkv, D);
    to_heads_k<<<ew_grid(E * T * D / 4), 256, 0, s>>>(vh, v, lengths, B, T, Hkv, D);
    fp4rl_status st = fp4rl_cuda_check_launch(ctx, "attention_forward (BF16 operands)");
    const Gemm scores{ctx, "attention_forward: scores"}, outs{ctx, "attention_forward: out = P V"};
    for (int64_t e0 = 0; !st && e0 < E; e0 += ec) {
        const int64_t n = E - e0 < ec ? E - e0 : ec;
        st = scores.run(0, 1, gT, T, D, D, D, T, n, gT * D, T * D, gT * T, qh + e0 * gT * D, kh + e0 * T * D, S, 0, scale, 0.0f);
        if (st) break;
        probs_k<<<row_blocks(n * gT), RB, 0, s>>>(P, S, lse, 1, lengths, e0, n * gT, T, group, Hkv);
        if ((st = fp4rl_cuda_check_launch(ctx, "attention_forward: probabilities"))) break;
        st = outs.run(0, 0, gT, D, T, T, D, D, n, gT * T, T * D, gT * D, P, vh + e0 * T * D, Oh + e0 * gT * D, 0, 1.0f, 0.0f);
    }
    if (st) return st;
    from_heads_k<<<ew_grid(B * T * Hq * D / 4), 256, 0, s>>>(out, Oh, 0, lengths, B, T, Hq, D);
    return fp4rl_cuda_check_launch(ctx, "attention_forward: out");
}

fp4rl_status fp4rl_cuda_attention_backward_gemm(fp4rl_context *ctx, cudaStream_t s, float *dq, float *dk, float *dv, const float *dout,
                                                const float *q, const float *k, const float *v, const float *out, const float *lse,
                                                const int32_t *lengths, int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                                                float scale)
{
    const int64_t group = Hq / Hkv, E = B * Hkv, gT = group * T, ec = chunk_entries(E, T, group);
    const int64_t nq = B * Hq * T * D, nk = E * T * D;
    Scratch m{ctx};
    uint16_t *qh = m.get<uint16_t>(nq), *kh = m.get<uint16_t>(nk), *vh = m.get<uint16_t>(nk), *doh = m.get<uint16_t>(nq);
    float *delta = m.get<float>(B * Hq * T), *dQh = m.get<float>(nq), *dKh = m.get<float>(nk), *dVh = m.get<float>(nk);
    float *S = m.get<float>(ec * gT * T);
    uint16_t *P = m.get<uint16_t>(ec * gT * T);
    if (m.st) return m.st;
    to_heads_k<<<ew_grid(nq / 4), 256, 0, s>>>(qh, q, lengths, B, T, Hq, D);
    to_heads_k<<<ew_grid(nk / 4), 256, 0, s>>>(kh, k, lengths, B, T, Hkv, D);
    to_heads_k<<<ew_grid(nk / 4), 256, 0, s>>>(vh, v, lengths, B, T, Hkv, D);
    to_heads_k<<<ew_grid(nq / 4), 256, 0, s>>>(doh, dout, lengths, B, T, Hq, D);
    delta_k<<<row_blocks(B * Hq * T), RB, 0, s>>>(delta, dout, out, lengths, B, T, Hq, D);
    fp4rl_status st = fp4rl_cuda_check_launch(ctx, "attention_backward (BF16 operands)");
    const Gemm scores{ctx, "attention_backward: scores"}, gdv{ctx, "attention_backward: dv = P^T dout"};
    const Gemm gdp{ctx, "attention_backward: dP = dout V^T"}, gdq{ctx, "attention_backward: dq = dS K"};
    const Gemm gdk{ctx, "attention_backward: dk = dS^T Q"};
    for (int64_t e0 = 0; !st && e0 < E; e0 += ec) {
        const int64_t n = E - e0 < ec ? E - e0 : ec;
        const uint16_t *qe = qh + e0 * gT * D, *ke = kh + e0 * T * D, *ve = vh + e0 * T * D, *de = doh + e0 * gT * D;
        if ((st = scores.run(0, 1, gT, T, D, D, D, T, n, gT * D, T * D, gT * T, qe, ke, S, 0, scale, 0.0f))) break;
        probs_k<<<row_blocks(n * gT), RB, 0, s>>>(P, S, const_cast<float *>(lse), 0, lengths, e0, n * gT, T, group, Hkv);
        if ((st = fp4rl_cuda_check_launch(ctx, "attention_backward: probabilities"))) break;
        if ((st = gdv.run(1, 0, T, D, gT, T, D, D, n, gT * T, gT * D, T * D, P, de, dVh + e0 * T * D, 0, 1.0f, 0.0f))) break;
        if ((st = gdp.run(0, 1, gT, T, D, D, D, T, n, gT * D, T * D, gT * T, de, ve, S, 0, 1.0f, 0.0f))) break;
        dscore_k<<<row_blocks(n * gT), RB, 0, s>>>(P, S, delta, e0, n * gT, T, group, scale);
        if ((st = fp4rl_cuda_check_launch(ctx, "attention_backward: dS"))) break;
        if ((st = gdq.run(0, 0, gT, D, T, T, D, D, n, gT * T, T * D, gT * D, P, ke, dQh + e0 * gT * D, 0, 1.0f, 0.0f))) break;
        st = gdk.run(1, 0, T, D, gT, T, D, D, n, gT * T, gT * D, T * D, P, qe, dKh + e0 * T * D, 0, 1.0f, 0.0f);
    }
    if (st) return st;
    from_heads_k<<<ew_grid(B * T * Hq * D / 4), 256, 0, s>>>(dq, dQh, 1, lengths, B, T, Hq, D);
    from_heads_k<<<ew_grid(B * T * Hkv * D / 4), 256, 0, s>>>(dk, dKh, 1, lengths, B, T, Hkv, D);
    from_heads_k<<<ew_grid(B * T * Hkv * D / 4), 256, 0, s>>>(dv, dVh, 1, lengths, B, T, Hkv, D);
    return fp4rl_cuda_check_launch(ctx, "attention_backward: dq, dk, dv");
}
