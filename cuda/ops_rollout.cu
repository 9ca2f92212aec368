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
 * falls within double rounding of a CDF step. Top-p: the CPU's sort-free nucleus (a bisection on
 * the 32-bit order keys of z with the masses summed the same chunked way, then the ties at the
 * threshold by the shared fp4rl_nucleus_ties), so it is correct for any vocabulary (151,936
 * included) in one block per row; the trainer's nucleus log-probs use the same device code.
 */
#include <math.h>

#include "backend/nucleus.h"
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
constexpr int ST = 1024;

__device__ __forceinline__ uint32_t order_key(float f) { return fp4rl_nucleus_key(f); }
__device__ __forceinline__ float key_float(uint32_t k) { return fp4rl_bits_f32((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

/* The k-th largest of l (counting repeats), 0 < k < V, by a most-significant-byte-first radix
 * select on integer counts (exact). Every thread of the block calls it and gets the value. */
__device__ float kth_largest_block(const float *l, int64_t V, int64_t top_k)
{
    __shared__ unsigned hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int64_t s_need;
    const int tid = threadIdx.x;
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
    const float r = key_float(s_prefix);
    __syncthreads();
    return r;
}

/* One row's nucleus (core/backend/ops.h, sample_rows) for 0 < top_p < 1: z_v = l[v] / temperature,
 * candidates l[v] >= cand, e_v = exp((double)z_v - mx). Every sum is per thread over its
 * contiguous chunk [c0, c1) and then over the chunks in order by thread 0; the bisection and the
 * ties are the CPU's (fp4rl_nucleus_*). `kept` is the candidates' mass. Every thread calls it. */
struct nucleus_t {
    uint32_t key;
    int64_t last_tie;
    double mass;
};

__device__ nucleus_t nucleus_block(const float *l, float temperature, float cand, float mx, double kept, double top_p,
                                   int64_t c0, int64_t c1)
{
    __shared__ double s_part[ST];
    __shared__ int64_t s_cnt[ST];
    __shared__ uint32_t s_lo, s_hi;
    __shared__ nucleus_t s_nu;
    const int tid = threadIdx.x;
    const double target = top_p * kept;
    if (tid == 0) {
        s_lo = 0;
        s_hi = order_key(mx);
    }
    __syncthreads();
    while (s_lo < s_hi) { /* uniform: every thread reads the same shared bounds */
        const uint32_t mid = fp4rl_nucleus_mid(s_lo, s_hi);
        double m = 0;
        for (int64_t v = c0; v < c1; v++) {
            const float z = l[v] / temperature;
            if (l[v] >= cand && order_key(z) >= mid) m += exp((double)z - mx);
        }
        s_part[tid] = m;
        __syncthreads();
        if (tid == 0) {
            double t = 0;
            for (int i = 0; i < ST; i++) t += s_part[i];
            if (t >= target) s_lo = mid;
            else s_hi = mid - 1;
        }
        __syncthreads();
    }
    const uint32_t K = s_lo;
    double m_gt = 0;
    int64_t cnt = 0;
    for (int64_t v = c0; v < c1; v++) {
        const float z = l[v] / temperature;
        if (!(l[v] >= cand)) continue;
        const uint32_t k = order_key(z);
        if (k > K) m_gt += exp((double)z - mx);
        else if (k == K) cnt++;
    }
    s_part[tid] = m_gt;
    s_cnt[tid] = cnt;
    __syncthreads();
    if (tid == 0) {
        double gt = 0;
        int64_t all = 0;
        for (int i = 0; i < ST; i++) {
            gt += s_part[i];
            all += s_cnt[i];
        }
        const double e_k = exp((double)key_float(K) - mx); /* every tie has this z */
        const int64_t n = fp4rl_nucleus_ties(gt, e_k, target, all);
        int64_t seen = 0, last = -1;
        for (int i = 0; i < ST && last < 0; i++) {
            if (seen + s_cnt[i] < n) {
                seen += s_cnt[i];
                continue;
            }
            last = i; /* the chunk holding the n-th tie */
        }
        s_nu.key = K;
        s_nu.last_tie = last; /* a chunk index for now */
        s_nu.mass = gt + (double)n * e_k;
        s_cnt[0] = n - seen; /* the rank of the last tie within that chunk */
    }
    __syncthreads();
    nucleus_t r = s_nu;
    const int64_t rank = s_cnt[0];
    __syncthreads();
    if (tid == (int)r.last_tie) { /* the chunk's owner finds the token */
        int64_t seen = 0, id = -1;
        for (int64_t v = c0; v < c1 && id < 0; v++)
            if (l[v] >= cand && order_key(l[v] / temperature) == K && ++seen == rank) id = v;
        s_nu.last_tie = id;
    }
    __syncthreads();
    r.last_tie = s_nu.last_tie;
    __syncthreads();
    return r;
}

__device__ __forceinline__ bool in_nucleus(const nucleus_t &nu, float lv, float zv, float cand, int64_t v)
{
    if (!(lv >= cand)) return false;
    const uint32_t k = order_key(zv);
    return k > nu.key || (k == nu.key && v <= nu.last_tie);
}

__global__ void __launch_bounds__(ST) sample_k(int32_t *tokens, float *logp, const float *logits, int64_t V, float temperature,
                                               int64_t top_k, double top_p, uint64_t seed, uint64_t offset, uint64_t row0,
                                               const int32_t *steps, const int32_t *rows)
{
    __shared__ float shf[ST];
    __shared__ double s_all[ST], s_kept[ST];
    __shared__ int64_t s_last[ST];
    __shared__ double s_tkept;
    const int64_t b = blockIdx.x;
    const float *l = logits + b * V;
    const int tid = threadIdx.x;

    float mx = -INFINITY;
    for (int64_t v = tid; v < V; v += ST) mx = fmaxf(mx, l[v] / temperature);
    mx = block_max(mx, shf);

    /* the k-th largest logit (counting repeats) */
    const float thresh = top_k > 0 && top_k < V ? kth_largest_block(l, V, top_k) : -INFINITY;

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
    /* top-p: the nucleus, its per-chunk masses and last tokens in place of the top-k's */
    const bool nucl = fp4rl_nucleus_on(top_p);
    nucleus_t nu = {0, -1, 0};
    if (nucl) {
        if (tid == 0) {
            double t = 0;
            for (int i = 0; i < ST; i++) t += s_kept[i];
            s_tkept = t;
        }
        __syncthreads();
        nu = nucleus_block(l, temperature, thresh, mx, s_tkept, top_p, c0, c1);
        double part = 0;
        int64_t plast = -1;
        for (int64_t v = c0; v < c1; v++) {
            const float z = l[v] / temperature;
            if (!in_nucleus(nu, l[v], z, thresh, v)) continue;
            part += exp((double)z - mx);
            plast = v;
        }
        s_kept[tid] = part;
        s_last[tid] = plast;
        __syncthreads();
    }
    if (tid == 0) { /* the inverse CDF over the kept tokens (the nucleus: renormalised) */
        double tall = 0, tkept = 0;
        int64_t tlast = 0;
        for (int i = 0; i < ST; i++) {
            tall += s_all[i];
            tkept += s_kept[i];
            if (s_last[i] >= 0) tlast = s_last[i];
        }
        const double total = nucl ? nu.mass : tkept;
        const double u = (double)fp4rl_sr_uniform(seed, offset + (uint64_t)(steps ? steps[b] : 0),
                                                  row0 + (uint64_t)(rows ? rows[b] : b)) * total;
        double acc = 0;
        int64_t pick = -1;
        for (int i = 0; i < ST && pick < 0; i++) {
            if (!(u < acc + s_kept[i])) {
                acc += s_kept[i];
                continue;
            }
            const int64_t d0 = i * chunk, d1 = d0 + chunk < V ? d0 + chunk : V;
            for (int64_t v = d0; v < d1; v++) {
                const float z = l[v] / temperature;
                if (nucl ? !in_nucleus(nu, l[v], z, thresh, v) : l[v] < thresh) continue;
                acc += exp((double)z - mx);
                if (u < acc) {
                    pick = v;
                    break;
                }
            }
        }
        if (pick < 0) pick = tlast; /* u * kept rounding past the sum */
        tokens[b] = (int32_t)pick;
        logp[b] = (float)((double)(l[pick] / temperature) - mx - log(nucl ? nu.mass : tall));
    }
}

/* The trainer's side of top-p: one block per row of z (already divided by the temperature). The
 * row's max, top-k threshold and nucleus as sample_k finds them (temperature 1). */
struct trainer_row_t {
    float mx, cand;
    nucleus_t nu;
};

__device__ trainer_row_t trainer_nucleus_block(const float *z, int64_t V, int64_t top_k, double top_p, int64_t c0, int64_t c1)
{
    __shared__ float shf[ST];
    __shared__ double s_kept[ST];
    __shared__ double s_tkept;
    const int tid = threadIdx.x;
    trainer_row_t r;
    float mx = -INFINITY;
    for (int64_t v = tid; v < V; v += ST) mx = fmaxf(mx, z[v]);
    r.mx = block_max(mx, shf);
    r.cand = top_k > 0 && top_k < V ? kth_largest_block(z, V, top_k) : -INFINITY;
    double kept = 0;
    for (int64_t v = c0; v < c1; v++)
        if (z[v] >= r.cand) kept += exp((double)z[v] - r.mx);
    s_kept[tid] = kept;
    __syncthreads();
    if (tid == 0) {
        double t = 0;
        for (int i = 0; i < ST; i++) t += s_kept[i];
        s_tkept = t;
    }
    __syncthreads();
    r.nu = nucleus_block(z, 1.0f, r.cand, r.mx, s_tkept, top_p, c0, c1);
    return r;
}

__global__ void __launch_bounds__(ST) nucleus_logprobs_fwd_k(float *logp, float *lse, const float *logits, const int32_t *targets,
                                                             int64_t V, int64_t top_k, double top_p)
{
    const int64_t n = blockIdx.x;
    const float *z = logits + n * V;
    const int32_t t = targets[n];
    if (t < 0 || t >= V) { /* uniform over the block */
        if (threadIdx.x == 0) logp[n] = lse[n] = 0.0f;
        return;
    }
    const int64_t chunk = (V + ST - 1) / ST, c0 = threadIdx.x * chunk, c1 = c0 + chunk < V ? c0 + chunk : V;
    const trainer_row_t r = trainer_nucleus_block(z, V, top_k, top_p, c0, c1); /* c0 >= c1: an empty chunk */
    if (threadIdx.x == 0) {
        const double mass = r.nu.mass + (in_nucleus(r.nu, z[t], z[t], r.cand, t) ? 0.0 : exp((double)z[t] - r.mx));
        lse[n] = (float)((double)r.mx + log(mass));
        logp[n] = (float)((double)z[t] - r.mx - log(mass));
    }
}

__global__ void __launch_bounds__(ST) nucleus_logprobs_bwd_k(float *dlogits, const float *dlogp, const float *logits,
                                                             const int32_t *targets, const float *lse, int64_t V, int64_t top_k,
                                                             double top_p)
{
    const int64_t n = blockIdx.x;
    const float *z = logits + n * V;
    float *dz = dlogits + n * V;
    const int32_t t = targets[n];
    if (t < 0 || t >= V) return; /* an ignored target's logp is the constant 0 */
    const int64_t chunk = (V + ST - 1) / ST, c0 = threadIdx.x * chunk, c1 = c0 + chunk < V ? c0 + chunk : V;
    const trainer_row_t r = trainer_nucleus_block(z, V, top_k, top_p, c0, c1); /* c0 >= c1: an empty chunk */
    const double gl = dlogp[n], ls = (double)lse[n];
    for (int64_t v = threadIdx.x; v < V; v += ST) {
        /* d logp_t / dz_v = [v == t] - [v in S'] p_v / sum_{S'} p, S' = S plus t, held fixed */
        const double q = (v == t || in_nucleus(r.nu, z[v], z[v], r.cand, v)) ? exp((double)z[v] - ls) : 0.0;
        dz[v] += (float)(gl * ((v == t ? 1.0 : 0.0) - q));
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
                                    int64_t V, float temperature, int64_t top_k, double top_p, uint64_t seed, uint64_t offset,
                                    uint64_t row0, const int32_t *steps, const int32_t *rows)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st) return st;
    sample_k<<<(unsigned)B, ST, 0, s>>>(tokens, logp, logits, V, temperature, top_k, top_p, seed, offset, row0, steps, rows);
    return fp4rl_cuda_check_launch(ctx, "sample");
}

fp4rl_status fp4rl_cuda_nucleus_logprobs_forward(fp4rl_context *ctx, float *logp, float *lse, const float *logits,
                                                 const int32_t *targets, int64_t N, int64_t V, int64_t top_k, double top_p)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st || N <= 0) return st;
    nucleus_logprobs_fwd_k<<<(unsigned)N, ST, 0, s>>>(logp, lse, logits, targets, V, top_k, top_p);
    return fp4rl_cuda_check_launch(ctx, "nucleus_logprobs_forward");
}

fp4rl_status fp4rl_cuda_nucleus_logprobs_backward(fp4rl_context *ctx, float *dlogits, const float *dlogp, const float *logits,
                                                  const int32_t *targets, const float *lse, int64_t N, int64_t V, int64_t top_k,
                                                  double top_p)
{
    cudaStream_t s;
    fp4rl_status st = fp4rl_cuda_op_begin(ctx, &s);
    if (st || N <= 0) return st;
    nucleus_logprobs_bwd_k<<<(unsigned)N, ST, 0, s>>>(dlogits, dlogp, logits, targets, lse, V, top_k, top_p);
    return fp4rl_cuda_check_launch(ctx, "nucleus_logprobs_backward");
}
