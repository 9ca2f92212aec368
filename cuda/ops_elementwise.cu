/*
 * ops_elementwise.cu - the elementwise and gather/scatter ops on the GPU: residual, SwiGLU, scale,
 * BF16 rounding, embedding, RoPE, KV-cache writes, underflow counts. Each element does the CPU's
 * arithmetic in the CPU's order (no FMA contraction: -fmad=false); exp / pow / cos / sin go
 * through double (ops_cuda.h), so they match the C library's but in rare double-rounding cases.
 */
#include "backend/halves.h"
#include "format/formats.h"
#include "ops_cuda.h"

using namespace fp4rl_cuda_ops_detail;

#define GRID_STRIDE(i, n) for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

namespace {

__global__ void sub_k(float *out, const float *a, const float *b, int64_t n)
{
    GRID_STRIDE(i, n) out[i] = a[i] - b[i];
}

/* vec: every pointer 16-byte aligned; four elements a thread, a tail of n % 4 scalar */
__global__ void residual_fwd_k(float *out, const float *a, const float *b, int64_t n, int vec)
{
    const int64_t n4 = vec ? n / 4 : 0;
    GRID_STRIDE(i, n4)
    {
        const float4 x = reinterpret_cast<const float4 *>(a)[i], y = reinterpret_cast<const float4 *>(b)[i];
        reinterpret_cast<float4 *>(out)[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
    GRID_STRIDE(j, n - n4 * 4)
    {
        const int64_t i = n4 * 4 + j;
        out[i] = a[i] + b[i];
    }
}
__global__ void residual_bwd_k(float *da, float *db, const float *dout, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        const float d = dout[i];
        da[i] += d;
        db[i] += d;
    }
}

/* SwiGLU reads and writes 16-byte vectors (8 independent exps in flight per thread: the double
 * exp is the expensive part); the vector path needs every pointer 16-byte aligned, a tail of
 * n % 4 elements runs scalar. Each element's arithmetic is the CPU's. */
__device__ __forceinline__ void swiglu_bwd1(float &dg, float &du, float d, float g, float u)
{
    const float s = sigmoid(g), silu = g * s, dsilu = s * (1.0f + g * (1.0f - s));
    dg += d * u * dsilu;
    du += d * silu;
}
__global__ void swiglu_fwd_k(float *out, const float *gate, const float *up, int64_t n, int vec)
{
    const int64_t n4 = vec ? n / 4 : 0;
    GRID_STRIDE(i, n4)
    {
        const float4 g = reinterpret_cast<const float4 *>(gate)[i], u = reinterpret_cast<const float4 *>(up)[i];
        reinterpret_cast<float4 *>(out)[i] = make_float4(swiglu1(g.x, u.x), swiglu1(g.y, u.y), swiglu1(g.z, u.z), swiglu1(g.w, u.w));
    }
    GRID_STRIDE(j, n - n4 * 4)
    {
        const int64_t i = n4 * 4 + j;
        out[i] = swiglu1(gate[i], up[i]);
    }
}
__global__ void swiglu_bwd_k(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n, int vec)
{
    const int64_t n4 = vec ? n / 4 : 0;
    GRID_STRIDE(i, n4)
    {
        const float4 d = reinterpret_cast<const float4 *>(dout)[i], g = reinterpret_cast<const float4 *>(gate)[i];
        const float4 u = reinterpret_cast<const float4 *>(up)[i];
        float4 dg = reinterpret_cast<float4 *>(dgate)[i], du = reinterpret_cast<float4 *>(dup)[i];
        swiglu_bwd1(dg.x, du.x, d.x, g.x, u.x);
        swiglu_bwd1(dg.y, du.y, d.y, g.y, u.y);
        swiglu_bwd1(dg.z, du.z, d.z, g.z, u.z);
        swiglu_bwd1(dg.w, du.w, d.w, g.w, u.w);
        reinterpret_cast<float4 *>(dgate)[i] = dg;
        reinterpret_cast<float4 *>(dup)[i] = du;
    }
    GRID_STRIDE(j, n - n4 * 4)
    {
        const int64_t i = n4 * 4 + j;
        swiglu_bwd1(dgate[i], dup[i], dout[i], gate[i], up[i]);
    }
}

__device__ __host__ inline int al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

__global__ void scale_k(float *x, int64_t n, float alpha)
{
    GRID_STRIDE(i, n) x[i] *= alpha;
}
__global__ void round_bf16_k(float *out, const float *x, int64_t n)
{
    GRID_STRIDE(i, n) out[i] = fp4rl_round_bf16(x[i]);
}

__global__ void embedding_fwd_k(float *out, const int32_t *tokens, const float *wte, int64_t N, int64_t V, int64_t C)
{
    GRID_STRIDE(i, N * C)
    {
        const int64_t n = i / C, c = i - n * C;
        const int32_t t = tokens[n];
        out[i] = (t < 0 || t >= V) ? 0.0f : wte[(int64_t)t * C + c];
    }
}
/* One thread per column c, serial over the tokens: the CPU's order, so repeated tokens add their
 * rows in the same order (deterministic, bitwise equal to the CPU) without atomics. */
__global__ void embedding_bwd_k(float *dwte, const float *dout, const int32_t *tokens, int64_t N, int64_t V, int64_t C)
{
    GRID_STRIDE(c, C)
    {
        for (int64_t n = 0; n < N; n++) {
            const int32_t t = tokens[n];
            if (t < 0 || t >= V) continue;
            dwte[(int64_t)t * C + c] += dout[n * C + c];
        }
    }
}

/* Pair (x1, x2) = (x[i], x[i + D/2]) of one head rotated by sign * the angle of position pos at
 * frequency i: the CPU's binary32 steps with correctly rounded functions. */
__device__ __forceinline__ float2 rope_pair(float x1, float x2, int32_t pos, int64_t i, int64_t D, float theta, float sign)
{
    const float inv_freq = 1.0f / powf_cr(theta, (float)(2 * i) / (float)D);
    const float a = (float)pos * inv_freq;
    const float c = cosf_cr(a);
    const float s = sinf_cr(a) * sign;
    return make_float2(x1 * c - x2 * s, x2 * c + x1 * s);
}

/* One thread per (n, h, i < D/2) pair; the pair is read before it is written (in place is fine). */
__global__ void rope_k(float *out, const float *x, const int32_t *positions, int64_t N, int64_t H, int64_t D, float theta,
                       float sign)
{
    const int64_t half = D / 2;
    GRID_STRIDE(j, N * H * half)
    {
        const int64_t i = j % half, nh = j / half, n = nh / H;
        const float2 r = rope_pair(x[nh * D + i], x[nh * D + i + half], positions[n], i, D, theta, sign);
        out[nh * D + i] = r.x;
        out[nh * D + i + half] = r.y;
    }
}

__device__ __forceinline__ void kv_put(void *cache, int kv_bf16, int64_t dst, float v)
{
    if (kv_bf16) ((uint16_t *)cache)[dst] = fp4rl_f32_to_bf16(v);
    else ((float *)cache)[dst] = v;
}

__global__ void kv_store_k(void *cache, int kv_bf16, const float *src, const int32_t *rows, int64_t N, int64_t W)
{
    GRID_STRIDE(i, N * W) kv_put(cache, kv_bf16, (int64_t)rows[i / W] * W + i % W, src[i]);
}

/* qkv_rope_store: one thread per (n, q or k head, i < D/2) rotates a pair (a k pair straight into
 * its cache row), one per v element stores it; rope_k's and kv_store_k's arithmetic, on inputs read
 * from the halves (qkv, lo, bias: backend/halves.h) as add_halves_k writes them. */
__global__ void qkv_rope_store_k(float *q, void *kc, void *vc, int kv_bf16, const float *qkv, const float *lo, const float *bias,
                                 const int32_t *positions, const int32_t *rows, int64_t N, int64_t Hq, int64_t Hkv, int64_t D,
                                 float theta)
{
    const int64_t half = D / 2, H = Hq + Hkv, KD = Hkv * D, per = H * half + KD, W = Hq * D + 2 * KD;
    GRID_STRIDE(j, N * per)
    {
        const int64_t n = j / per, r = j % per;
        if (r < H * half) {
            const int64_t h = r / half, i = r % half, c = h * D + i;
            const float2 o = rope_pair(fp4rl_halves_at(qkv, lo, bias, n * W + c, c),
                                       fp4rl_halves_at(qkv, lo, bias, n * W + c + half, c + half), positions[n], i, D, theta, 1.0f);
            if (h < Hq) {
                q[(n * Hq + h) * D + i] = o.x;
                q[(n * Hq + h) * D + i + half] = o.y;
            } else {
                const int64_t dst = (int64_t)rows[n] * KD + (h - Hq) * D + i;
                kv_put(kc, kv_bf16, dst, o.x);
                kv_put(kc, kv_bf16, dst + half, o.y);
            }
        } else {
            const int64_t w = r - H * half, c = Hq * D + KD + w;
            kv_put(vc, kv_bf16, (int64_t)rows[n] * KD + w, fp4rl_halves_at(qkv, lo, bias, n * W + c, c));
        }
    }
}

/* swiglu_rows: out[n, i] = swiglu1(gate, up), gate and up element i and I + i of row n of the input
 * read from the halves (gu, lo, bias: backend/halves.h; gu alone when lo and bias are NULL). vec
 * (I % 4 == 0, out, gu, lo and bias 16-byte aligned): four consecutive elements of a row a thread,
 * 16-byte loads, their four exps in flight together (the double exp is the cost); else one element
 * a thread. */
__global__ void swiglu_rows_k(float *out, const float *gu, const float *lo, const float *bias, int64_t N, int64_t I, int vec)
{
    if (vec) {
        const int64_t I4 = I / 4;
        GRID_STRIDE(j, N * I4)
        {
            const int64_t n = j / I4, i = (j - n * I4) * 4;
            const float4 g = fp4rl_halves_at4(gu, lo, bias, n * 2 * I + i, i), u = fp4rl_halves_at4(gu, lo, bias, n * 2 * I + I + i, I + i);
            reinterpret_cast<float4 *>(out)[j] = make_float4(swiglu1(g.x, u.x), swiglu1(g.y, u.y), swiglu1(g.z, u.z), swiglu1(g.w, u.w));
        }
        return;
    }
    GRID_STRIDE(j, N * I)
    {
        const int64_t n = j / I, i = j % I;
        out[j] = swiglu1(fp4rl_halves_at(gu, lo, bias, n * 2 * I + i, i), fp4rl_halves_at(gu, lo, bias, n * 2 * I + I + i, I + i));
    }
}

__global__ void gather_rows_k(float *dst, const float *src, const int32_t *idx, int64_t N, int64_t W)
{
    GRID_STRIDE(i, N * W) dst[i] = src[(int64_t)idx[i / W] * W + i % W];
}

/* One block: integer counts (exact), added to the float counts once. */
__global__ void underflow_k(float *counts, const float *x, const float *xq, int64_t n)
{
    __shared__ double sh[RED_THREADS];
    long long nz = 0, under = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        if (x[i] != 0.0f) {
            nz++;
            under += xq[i] == 0.0f;
        }
    const double tnz = block_sum((double)nz, sh), tunder = block_sum((double)under, sh);
    if (threadIdx.x == 0) {
        counts[0] += (float)(long long)tnz;
        counts[1] += (float)(long long)tunder;
    }
}

} // namespace

#define LAUNCH(what, kernel, n, ...)                                                                                           \
    do {                                                                                                                       \
        cudaStream_t s_;                                                                                                       \
        fp4rl_status st_ = fp4rl_cuda_op_begin(ctx, &s_);                                                                      \
        if (st_) return st_;                                                                                                   \
        kernel<<<ew_grid(n), 256, 0, s_>>>(__VA_ARGS__);                                                                       \
        return fp4rl_cuda_check_launch(ctx, what);                                                                             \
    } while (0)

fp4rl_status fp4rl_cuda_residual_forward(fp4rl_context *ctx, float *out, const float *a, const float *b, int64_t n)
{
    const int vec = al16(out) && al16(a) && al16(b);
    LAUNCH("residual_forward", residual_fwd_k, vec ? (n + 3) / 4 : n, out, a, b, n, vec);
}
fp4rl_status fp4rl_cuda_sub(fp4rl_context *ctx, float *out, const float *a, const float *b, int64_t n)
{
    LAUNCH("sub", sub_k, n, out, a, b, n);
}
fp4rl_status fp4rl_cuda_copy(fp4rl_context *ctx, float *dst, const float *src, int64_t n)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    if (dst != src) cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, s);
    return fp4rl_cuda_check_launch(ctx, "copy");
}
fp4rl_status fp4rl_cuda_residual_backward(fp4rl_context *ctx, float *da, float *db, const float *dout, int64_t n)
{
    LAUNCH("residual_backward", residual_bwd_k, n, da, db, dout, n);
}
fp4rl_status fp4rl_cuda_swiglu_forward(fp4rl_context *ctx, float *out, const float *gate, const float *up, int64_t n)
{
    const int vec = al16(out) && al16(gate) && al16(up);
    LAUNCH("swiglu_forward", swiglu_fwd_k, vec ? (n + 3) / 4 : n, out, gate, up, n, vec);
}
fp4rl_status fp4rl_cuda_swiglu_backward(fp4rl_context *ctx, float *dgate, float *dup, const float *dout, const float *gate,
                                        const float *up, int64_t n)
{
    const int vec = al16(dgate) && al16(dup) && al16(dout) && al16(gate) && al16(up);
    LAUNCH("swiglu_backward", swiglu_bwd_k, vec ? (n + 3) / 4 : n, dgate, dup, dout, gate, up, n, vec);
}
fp4rl_status fp4rl_cuda_scale(fp4rl_context *ctx, float *x, int64_t n, float alpha) { LAUNCH("scale", scale_k, n, x, n, alpha); }
fp4rl_status fp4rl_cuda_round_bf16(fp4rl_context *ctx, float *out, const float *x, int64_t n)
{
    LAUNCH("round_bf16", round_bf16_k, n, out, x, n);
}
fp4rl_status fp4rl_cuda_embedding_forward(fp4rl_context *ctx, float *out, const int32_t *tokens, const float *wte, int64_t N,
                                          int64_t V, int64_t C)
{
    LAUNCH("embedding_forward", embedding_fwd_k, N * C, out, tokens, wte, N, V, C);
}
fp4rl_status fp4rl_cuda_embedding_backward(fp4rl_context *ctx, float *dwte, const float *dout, const int32_t *tokens, int64_t N,
                                           int64_t V, int64_t C)
{
    LAUNCH("embedding_backward", embedding_bwd_k, C, dwte, dout, tokens, N, V, C);
}
fp4rl_status fp4rl_cuda_rope_forward(fp4rl_context *ctx, float *out, const float *x, const int32_t *positions, int64_t N,
                                     int64_t H, int64_t D, float theta)
{
    LAUNCH("rope_forward", rope_k, N * H * (D / 2), out, x, positions, N, H, D, theta, 1.0f);
}
fp4rl_status fp4rl_cuda_rope_backward(fp4rl_context *ctx, float *dx, const float *dout, const int32_t *positions, int64_t N,
                                      int64_t H, int64_t D, float theta)
{
    LAUNCH("rope_backward", rope_k, N * H * (D / 2), dx, dout, positions, N, H, D, theta, -1.0f);
}
fp4rl_status fp4rl_cuda_kv_store(fp4rl_context *ctx, void *cache, int kv_bf16, const float *src, const int32_t *rows, int64_t N,
                                 int64_t W)
{
    LAUNCH("kv_store", kv_store_k, N * W, cache, kv_bf16, src, rows, N, W);
}
fp4rl_status fp4rl_cuda_qkv_rope_store(fp4rl_context *ctx, float *q, void *kc, void *vc, int kv_bf16, const float *qkv,
                                      const float *lo, const float *bias, const int32_t *positions, const int32_t *rows, int64_t N,
                                      int64_t Hq, int64_t Hkv, int64_t D, float theta)
{
    LAUNCH("qkv_rope_store", qkv_rope_store_k, N * ((Hq + Hkv) * (D / 2) + Hkv * D), q, kc, vc, kv_bf16, qkv, lo, bias, positions,
           rows, N, Hq, Hkv, D, theta);
}
fp4rl_status fp4rl_cuda_swiglu_rows(fp4rl_context *ctx, float *out, const float *gu, const float *lo, const float *bias, int64_t N,
                                   int64_t inter)
{
    const int vec = inter % 4 == 0 && al16(out) && al16(gu) && al16(lo) && al16(bias);
    LAUNCH("swiglu_rows", swiglu_rows_k, vec ? N * inter / 4 : N * inter, out, gu, lo, bias, N, inter, vec);
}
fp4rl_status fp4rl_cuda_gather_rows(fp4rl_context *ctx, float *dst, const float *src, const int32_t *idx, int64_t N, int64_t W)
{
    LAUNCH("gather_rows", gather_rows_k, N * W, dst, src, idx, N, W);
}
fp4rl_status fp4rl_cuda_underflow_count(fp4rl_context *ctx, float *counts, const float *x, const float *xq, int64_t n)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    underflow_k<<<1, RED_THREADS, 0, s>>>(counts, x, xq, n);
    return fp4rl_cuda_check_launch(ctx, "underflow_count");
}

/* the second stage of ops_cuda.h's colsum: the chunks' partial sums, in chunk order */
__global__ void fp4rl_cuda_ops_detail::colsum_finish_k(float *acc, const float *part, int64_t chunks, int64_t C)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float a = acc[c];
    for (int64_t k = 0; k < chunks; k++) a += part[k * C + c];
    acc[c] = a;
}
