/*
 * ops_rollout.cu - the rollout's Rollout-ResQ masks and sampling on the GPU (KV-cache writes and
 * decode attention live in ops_elementwise.cu / ops_attention.cu).
 *
 * The masks choose exactly what the CPU chooses: group / column / tile scores are the CPU's
 * serial sums (one thread each, same order), and a column or tile is kept when its rank in
 * (score descending, index ascending) order is below the half, the CPU's qsort order.
 * Sampling is the CPU's inverse CDF with the same uniform (fp4rl_sr_uniform), the k-th largest
 * logit found exactly by a radix select; the double CDF sums run per contiguous chunk of the
 * vocabulary and then over the chunks in order, so a token can differ from the CPU's only when u
 * falls within double rounding of a CDF step.
 */
#include <math.h>

#include "format/formats.h"
#include "format/qdq_block.h"
#include "ops_cuda.h"

using namespace fp4rl_cuda_ops_detail;

namespace {

/* ---- Rollout-ResQ ---- */
__global__ void mask_2_4_k(float *r, int64_t N, int64_t K)
{
    const int64_t groups = (K + 3) / 4;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * groups; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / groups, k0 = (i - n * groups) * 4;
        fp4rl_mask_2_4_group(r + n * K + k0, (int)(K - k0 < 4 ? K - k0 : 4));
    }
}

/* key[k] = sum_n r[n, k]^2, serial in n (the CPU's order) */
__global__ void col_norm_k(double *key, const float *r, int64_t N, int64_t K)
{
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= K) return;
    double s = 0;
    for (int64_t n = 0; n < N; n++) s += (double)r[n * K + k] * r[n * K + k];
    key[k] = s;
}

constexpr int64_t TR = 32, TC = 64;
__global__ void tile_norm_k(double *key, const float *r, int64_t N, int64_t K, int64_t nc, int64_t nt)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nt) return;
    const int64_t r0 = (i / nc) * TR, c0 = (i % nc) * TC;
    double s = 0;
    for (int64_t n = r0; n < r0 + TR && n < N; n++)
        for (int64_t k = c0; k < c0 + TC && k < K; k++) s += (double)r[n * K + k] * r[n * K + k];
    key[i] = s;
}

/* keep[i] = 1 when fewer than `half` items come before i in (key desc, index asc) order */
__global__ void rank_k(unsigned char *keep, const double *key, int64_t n, int64_t half)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double ki = key[i];
    int64_t before = 0;
    for (int64_t j = 0; j < n; j++) {
        const double kj = key[j];
        before += (kj > ki) || (kj == ki && j < i);
    }
    keep[i] = before < half;
}

__global__ void apply_col_mask_k(float *r, const unsigned char *keep, int64_t N, int64_t K)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * K; i += (int64_t)gridDim.x * blockDim.x)
        if (!keep[i % K]) r[i] = 0.0f;
}

__global__ void apply_tile_mask_k(float *r, const unsigned char *keep, int64_t N, int64_t K, int64_t nc)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * K; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / K, k = i - n * K;
        if (!keep[(n / TR) * nc + k / TC]) r[i] = 0.0f;
    }
}

/* ---- sampling: one block per row ---- */
constexpr int ST = 256;

/* an unsigned key with the order of the floats (-0 just below +0; no NaN expected) */
__device__ __forceinline__ uint32_t order_key(float f)
{
    const uint32_t u = fp4rl_f32_bits(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) { return fp4rl_bits_f32((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

__global__ void __launch_bounds__(ST) sample_k(int32_t *tokens, float *logp, const float *logits, int64_t V, float temperature,
                                               int64_t top_k, uint64_t seed, uint64_t offset, uint64_t row0)
{
    __shared__ float shf[ST];
    __shared__ unsigned hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int64_t s_need;
    __shared__ double s_all[ST], s_kept[ST];
    __shared__ int64_t s_last[ST];
    const int64_t b = blockIdx.x;
    const float *l = logits + b * V;
    const int tid = threadIdx.x;

    float mx = -INFINITY;
    for (int64_t v = tid; v < V; v += ST) mx = fmaxf(mx, l[v] / temperature);
    mx = block_max(mx, shf);

    /* the k-th largest logit (counting repeats), by a most-significant-byte-first radix select */
    float thresh = -INFINITY;
    if (top_k > 0 && top_k < V) {
        if (tid == 0) {
            s_prefix = 0;
            s_need = top_k; /* rank still to find among the keys matching the prefix */
        }
        for (int pass = 0; pass < 4; pass++) {
            const int shift = 24 - 8 * pass;
            for (int i = tid; i < 256; i += ST) hist[i] = 0;
            __syncthreads();
            const uint32_t prefix = s_prefix;
            const uint32_t hi_mask = pass == 0 ? 0u : (0xffffffffu << (32 - 8 * pass));
            for (int64_t v = tid; v < V; v += ST) {
                const uint32_t key = order_key(l[v]);
                if ((key & hi_mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u); /* integer counts: exact */
            }
            __syncthreads();
            if (tid == 0) {
                int64_t need = s_need;
                int bin = 255;
                for (; bin > 0; bin--) {
                    if ((int64_t)hist[bin] >= need) break;
                    need -= hist[bin];
                }
                s_need = need;
                s_prefix = prefix | ((uint32_t)bin << shift);
            }
            __syncthreads();
        }
        thresh = key_float(s_prefix);
    }

    /* per-thread contiguous chunks of the vocabulary: sums of exponentials, all and kept */
    const int64_t chunk = (V + ST - 1) / ST, c0 = tid * chunk, c1 = c0 + chunk < V ? c0 + chunk : V;
    double all = 0, kept = 0;
    int64_t last = -1;
    for (int64_t v = c0; v < c1; v++) {
        const double e = exp((double)(l[v] / temperature) - mx);
        all += e;
        if (l[v] >= thresh) {
            kept += e;
            last = v;
        }
    }
    s_all[tid] = all;
    s_kept[tid] = kept;
    s_last[tid] = last;
    __syncthreads();
    if (tid == 0) {
        double tall = 0, tkept = 0;
        int64_t tlast = 0;
        for (int i = 0; i < ST; i++) {
            tall += s_all[i];
            tkept += s_kept[i];
            if (s_last[i] >= 0) tlast = s_last[i];
        }
        const double u = (double)fp4rl_sr_uniform(seed, offset, row0 + (uint64_t)b) * tkept;
        double acc = 0;
        int64_t pick = -1;
        for (int i = 0; i < ST && pick < 0; i++) {
            if (!(u < acc + s_kept[i])) {
                acc += s_kept[i];
                continue;
            }
            const int64_t d0 = i * chunk, d1 = d0 + chunk < V ? d0 + chunk : V;
            for (int64_t v = d0; v < d1; v++) {
                if (l[v] < thresh) continue;
                acc += exp((double)(l[v] / temperature) - mx);
                if (u < acc) {
                    pick = v;
                    break;
                }
            }
        }
        if (pick < 0) pick = tlast; /* u * kept rounding past the sum */
        tokens[b] = (int32_t)pick;
        logp[b] = (float)((double)(l[pick] / temperature) - mx - log(tall));
    }
}

} // namespace

fp4rl_status fp4rl_cuda_resq_mask(fp4rl_context *ctx, float *r, int64_t N, int64_t K, int pattern)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    if (pattern == FP4RL_RESQ_2_4) {
        mask_2_4_k<<<ew_grid(N * ((K + 3) / 4)), 256, 0, s>>>(r, N, K);
        return fp4rl_cuda_check_launch(ctx, "resq_mask (2:4)");
    }
    if (pattern != FP4RL_RESQ_CHANNEL_50 && pattern != FP4RL_RESQ_BLOCK_50) return FP4RL_OK; /* dense keeps everything */
    const int channel = pattern == FP4RL_RESQ_CHANNEL_50;
    const int64_t nc = (K + TC - 1) / TC, nt = channel ? K : ((N + TR - 1) / TR) * nc;
    void *key = NULL, *keep = NULL;
    st = fp4rl_cuda_alloc_bytes(ctx, &key, (size_t)nt * sizeof(double));
    if (!st) st = fp4rl_cuda_alloc_bytes(ctx, &keep, (size_t)nt);
    if (!st) {
        if (channel) col_norm_k<<<fp4rl_cuda_blocks(nt, 128), 128, 0, s>>>(static_cast<double *>(key), r, N, K);
        else tile_norm_k<<<fp4rl_cuda_blocks(nt, 128), 128, 0, s>>>(static_cast<double *>(key), r, N, K, nc, nt);
        st = fp4rl_cuda_check_launch(ctx, "resq_mask (norms)");
    }
    if (!st) {
        rank_k<<<fp4rl_cuda_blocks(nt, 128), 128, 0, s>>>(static_cast<unsigned char *>(keep), static_cast<const double *>(key), nt,
                                                          (nt + 1) / 2);
        st = fp4rl_cuda_check_launch(ctx, "resq_mask (ranks)");
    }
    if (!st) {
        if (channel) apply_col_mask_k<<<ew_grid(N * K), 256, 0, s>>>(r, static_cast<const unsigned char *>(keep), N, K);
        else apply_tile_mask_k<<<ew_grid(N * K), 256, 0, s>>>(r, static_cast<const unsigned char *>(keep), N, K, nc);
        st = fp4rl_cuda_check_launch(ctx, "resq_mask (apply)");
    }
    fp4rl_cuda_free_bytes(ctx, key);
    fp4rl_cuda_free_bytes(ctx, keep);
    return st;
}

fp4rl_status fp4rl_cuda_sample_rows(fp4rl_context *ctx, int32_t *tokens, float *logp, const float *logits, int64_t B,
                                    int64_t V, float temperature, int64_t top_k, uint64_t seed, uint64_t offset, uint64_t row0)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    sample_k<<<(unsigned)B, ST, 0, s>>>(tokens, logp, logits, V, temperature, top_k, seed, offset, row0);
    return fp4rl_cuda_check_launch(ctx, "sample");
}
