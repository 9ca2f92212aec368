/*
 * fp4rl_bench.cu - throughput of the CUDA backend next to the ceilings measured in the same run.
 *
 *   fp4rl_bench [reps] [quant [FORMAT]|decode]   (default 10 timed runs per row, median reported;
 *        quant: sections 1 and 2 only, of one format if named (as fp4rl_dtype_name spells it: for
 *        profiling runs); decode: section 4 only)
 *
 * 1. Device-to-device copy bandwidth (bytes read + written), the ceiling of quantization; next to
 *    it two streaming kernels of this file on the quantize input's size: read-only, and read N +
 *    write N/4 (the traffic of a 4-bit quantization), for what the memory gives such a pattern.
 * 2. fp4rl_quantize of a BF16 8192 x 8192 tensor, every format x {1D, 2D} x {nearest, stochastic}:
 *    bytes read + written per second (source once, codes and scales once) and the share of copy
 *    bandwidth, for the quantize kernels alone (fp4rl_cuda_quantize_launch into a preallocated
 *    tensor: no allocation, no host read-back of NVFP4's g) and for the public call. NVFP4 reads
 *    the source twice (its tensor amax first), which the bytes do not count.
 * 3. fp4rl_matmul at M = N = K = 4096 and 8192 with both operands in each FP4 format (the
 *    dequantization to BF16 included) against the same call on BF16 operands (cuBLASLt BF16).
 * 4. Decode-shaped products, M in {1, 16, 64}, N = K = 8192: the fused FP4-weight kernel against
 *    cuBLASLt BF16, each rotating through enough weight buffers that L2 (60 MB on an H200) holds
 *    none of them between uses.
 * 5. The decode GEMM on packed weights (cuda/decode_packed.h), M in {1, 16, 64, 128, 256}, at
 *    N = K = 8192 and Qwen2.5-3B's linear shapes, against cuBLASLt BF16 (FP32 output, like it) in
 *    the same run: time, speed-up, and the weight bytes per second as a share of the copy
 *    bandwidth of section 1; ResQ (x [M, 2K], one read of W) against today's fused path (BF16
 *    [W | W] over 2K); a sweep of its launch shapes (warps per CTA x split-K slices).
 *
 *   fp4rl_bench [reps] dg            sections 1 and 5 only
 *   fp4rl_bench [reps] fp8           section 6 only: HiF4 x HiF4 and MXFP4 x MXFP4 through the FP8
 *                                    path (cuda/gemm_fp8.h) vs cuBLASLt BF16 at 8192^3 and the
 *                                    Qwen2.5-1.5B / 3B training shapes (M = 8192 tokens; forward,
 *                                    dgrad, wgrad of q/o, k/v, gate/up, down): the GEMM kernel alone
 *                                    and with its two pre-passes, TFLOP/s, ratio to BF16, share of
 *                                    the H200's dense peaks (BF16 989, FP8 1979 TFLOP/s), and the
 *                                    old dequantize-to-BF16 path. Times the tensor-core entry
 *                                    (fp4rl_cuda_fp8_gemm_tc: the wgmma kernel where its gate holds,
 *                                    named in the `kernel` column) and the mma.sync kernel alone
 *                                    (fp4rl_cuda_fp8_gemm_mma), not the slow reference.
 *   fp4rl_bench [reps] act           sections 1 and 10: the rollout's activation operand (rollout_act, pack_bf16)
 *   fp4rl_bench [reps] lt            sections 1 and 9: cuBLASLt's first choice against its best candidate at
 *                                    the rollout's decode shapes (BF16 -> FP32)
 *   fp4rl_bench [reps] d8            sections 1 and 8: the W4A4 decode GEMM on the FP8 tensor cores
 *                                    (cuda/decode_fp8.h, HiF4 and MXFP4 weights read packed, E4M3
 *                                    activations from fp4rl_cuda_act_e4m3) vs cuBLASLt BF16 at
 *                                    N = K = 8192 and the 3B shapes, M in {1, 16, 64, 128, 256}:
 *                                    time (auto split-K and one slice), speed-up, weight bytes per
 *                                    second as a share of the copy bandwidth; weights rotated out of L2;
 *                                    each M twice: FP4RL_D8_WGMMA unset (mma.sync) and =1 ("M wg"),
 *                                    and for M <= 64 with FP4RL_D8_PERSIST=1 ("M p": the persistent
 *                                    kernel on the re-laid-out weight)
 *   fp4rl_bench [reps] w4b           sections 1 and 11: the packed-weight GEMM with BF16 activations
 *                                    (cuda/decode_w4b.h, HiF4 / MXFP4 / NVFP4 weights read packed) vs cuBLASLt
 *                                    BF16 at N = K = 8192 and the 3B fused shapes, M 1..512
 *   fp4rl_bench [reps] w4bsweep      the W4B grid (tiles a warpgroup, K slices, split-K sum) at the decode
 *                                    shapes, M 1..64, each choice timed, against the library's own
 *   fp4rl_bench [reps] w4bprof M N K [pack|nvfp4]  only 3 + reps launches of the w4b kernel, HiF4 (for ncu; pack: re-laid
 *                                    out; nvfp4: an NVFP4 weight, re-laid out)
 *   fp4rl_bench [reps] dgprof F M    only 3 + reps launches of the packed kernel, format F
 *                                    (mxfp4 / nvfp4 / hif4), M rows, N = K = 8192 (for ncu)
 *   fp4rl_bench [reps] attn          sections 1 and 7: the decode attention (attention_rows) at the
 *                                    Qwen2.5 0.5B / 1.5B / 3B / 7B heads, 16 prompts x 8 and x 32
 *                                    completions, BF16 cache, against the unique KV bytes at the copy
 *                                    bandwidth
 *
 * Timing: CUDA events on the context's stream around each call, after a busy-wait kernel that
 * lets the host queue the whole sequence first (so no launch gap lands inside a measurement);
 * warm-up runs first; the median of `reps`.
 */
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include <string>

#include "backend/ops.h"
#include "cuda_internal.h"
#include "decode_fp8.h"
#include "decode_packed.h"
#include "decode_w4b.h"
#include "gemm_fp8.h"
#include "format/formats.h"
#include "format/qdq_block.h"

#define CK(call)                                                                                          \
    do {                                                                                                  \
        fp4rl_status st_ = (call);                                                                        \
        if (st_ != FP4RL_OK) {                                                                            \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call, fp4rl_status_name(st_), fp4rl_last_error()); \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)
#define CU(call)                                                                                          \
    do {                                                                                                  \
        cudaError_t e_ = (call);                                                                          \
        if (e_ != cudaSuccess) {                                                                          \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

static fp4rl_context *ctx;
static cudaStream_t stream;
static int reps = 10;

/* Busy-waits about `ns` nanoseconds of GPU time. */
__global__ void spin_kernel(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

/* Streaming references: every thread reads 4 x 16 bytes (grid-stride) and folds them into one
 * word; write_quarter > 0 also writes a quarter of the bytes read (one 16-byte store per 64 read). */
__global__ void stream_kernel(const uint4 *src, int64_t n16, uint4 *dst, int write_quarter, unsigned *sink)
{
    unsigned acc = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x * 4;
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n16; i += stride) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = i + k < n16 ? __ldg(src + i + k) : make_uint4(0, 0, 0, 0);
        uint4 r;
        r.x = v[0].x ^ v[1].y ^ v[2].z ^ v[3].w;
        r.y = v[0].y ^ v[1].z ^ v[2].w ^ v[3].x;
        r.z = v[0].z ^ v[1].w ^ v[2].x ^ v[3].y;
        r.w = v[0].w ^ v[1].x ^ v[2].y ^ v[3].z;
        if (write_quarter) dst[i / 4] = r;
        else acc ^= r.x ^ r.y ^ r.z ^ r.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc; /* keeps the loads; practically never taken */
}

/* Roughly Gaussian BF16 values from a hash of the index (sum of four uniforms). */
__global__ void fill_bf16_kernel(uint16_t *x, int64_t n, uint32_t seed)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9E3779B1u ^ seed;
        float s = 0.0f;
        for (int k = 0; k < 4; k++) {
            h ^= h >> 16;
            h *= 0x7feb352du;
            h ^= h >> 15;
            h *= 0x846ca68bu;
            h ^= h >> 16;
            s += (float)(h >> 8) * 0x1p-24f;
        }
        x[i] = fp4rl_f32_to_bf16((s - 2.0f) * 1.7320508f);
    }
}

static fp4rl_tensor *random_bf16(int64_t rows, int64_t cols, uint32_t seed)
{
    const int64_t d[2] = {rows, cols};
    fp4rl_tensor *t;
    CK(fp4rl_tensor_zeros(&t, ctx, FP4RL_DTYPE_BF16, 2, d));
    fill_bf16_kernel<<<1024, 256, 0, stream>>>(static_cast<uint16_t *>(t->data), rows * cols, seed);
    CU(cudaGetLastError());
    return t;
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times `op(i)` for i = 0 .. warm + reps - 1 (the first `warm` untimed); returns the median in
 * milliseconds. `op` may synchronize (NVFP4 quantization reads its amax back): then the spin
 * lead is lost for that op but the events still bracket only its own GPU work. */
template <typename F>
static double time_ms(F op, int warm = 3)
{
    const int n = warm + reps;
    std::vector<cudaEvent_t> ev(2 * n);
    for (auto &e : ev) CU(cudaEventCreate(&e));
    spin_kernel<<<1, 1, 0, stream>>>(20ull * 1000 * 1000); /* 20 ms: time to queue the sequence */
    for (int i = 0; i < n; i++) {
        CU(cudaEventRecord(ev[2 * i], stream));
        op(i);
        CU(cudaEventRecord(ev[2 * i + 1], stream));
    }
    CU(cudaStreamSynchronize(stream));
    std::vector<double> t;
    for (int i = warm; i < n; i++) {
        float ms;
        CU(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        t.push_back(ms);
    }
    for (auto &e : ev) CU(cudaEventDestroy(e));
    return median(t);
}

static const char *fmt_name(fp4rl_dtype f) { return fp4rl_dtype_name(f); }

static fp4rl_quant_policy *policy(fp4rl_dtype f, int tile, int stochastic)
{
    fp4rl_quant_policy *p;
    CK(fp4rl_quant_policy_create(&p));
    CK(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, f));
    CK(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, tile));
    CK(fp4rl_quant_policy_set(p, FP4RL_QP_SCALE_RULE, FP4RL_SCALE_TRUNCATION_FREE));
    CK(fp4rl_quant_policy_set(p, FP4RL_QP_ROUNDING_WEIGHT, stochastic));
    return p;
}

static const fp4rl_dtype FORMATS[4] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};
static const fp4rl_dtype FP4[3] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4};
static int tile2d(fp4rl_dtype f) { return f == FP4RL_DTYPE_HIF4 ? 64 : f == FP4RL_DTYPE_NVFP4 ? 16 : 32; }

/* Device-to-device copy of 1 GiB: bytes read + written per second. */
static double copy_bandwidth()
{
    const size_t cbytes = (size_t)1 << 30;
    void *s0, *s1;
    CU(cudaMalloc(&s0, cbytes));
    CU(cudaMalloc(&s1, cbytes));
    CU(cudaMemsetAsync(s0, 1, cbytes, stream));
    const double copy_ms = time_ms([&](int) { CU(cudaMemcpyAsync(s1, s0, cbytes, cudaMemcpyDeviceToDevice, stream)); });
    CU(cudaFree(s0));
    CU(cudaFree(s1));
    const double bw = 2.0 * cbytes / (copy_ms * 1e-3) / 1e9;
    printf("## Device-to-device copy, 1 GiB: %.3f ms, %.0f GB/s (bytes read + written)\n\n", copy_ms, bw);
    return bw;
}

/* Buffers of `bytes` each to rotate through so that L2 holds none between uses (2.5x its size). */
static int rotation(double bytes, double l2, int most)
{
    int n = (int)(2.5 * l2 / bytes) + 1;
    return n < 2 ? 2 : n > most ? most : n;
}

/* `n` prepared weights of format f, quantized from the BF16 buffers wb in turn. */
static std::vector<fp4rl_dg_layout *> prepared(fp4rl_dtype f, const std::vector<fp4rl_tensor *> &wb, int n)
{
    fp4rl_quant_policy *p = policy(f, 0, 0);
    std::vector<fp4rl_dg_layout *> v;
    for (int i = 0; i < n; i++) {
        fp4rl_tensor *q;
        fp4rl_dg_layout *L;
        CK(fp4rl_quantize(&q, ctx, wb[i % wb.size()], f, p, FP4RL_ROLE_WEIGHT));
        CK(fp4rl_cuda_dg_prepare(ctx, q, &L));
        fp4rl_tensor_destroy(q);
        v.push_back(L);
    }
    fp4rl_quant_policy_destroy(p);
    return v;
}

static double lt_ms(int64_t M, int64_t N, int64_t K, const fp4rl_tensor *x, const std::vector<fp4rl_tensor *> &wb, float *y)
{
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    return time_ms([&](int i) {
        if (!fp4rl_cuda_lt_gemm(cu, M, N, K, x->data, wb[i % wb.size()]->data, CUDA_R_16BF, y, CUDA_R_32F, 1.0f, 0.0f)) {
            fprintf(stderr, "cuBLASLt has no algorithm for %lld x %lld x %lld\n", (long long)M, (long long)N, (long long)K);
            exit(1);
        }
    });
}

static double dg_ms(int64_t M, int resq, const fp4rl_tensor *x, const std::vector<fp4rl_dg_layout *> &L, float *y, int warps = 0,
                    int slices = 0)
{
    return time_ms([&](int i) {
        CK(fp4rl_cuda_dg_run_cfg(ctx, y, static_cast<const uint16_t *>(x->data), M, resq, L[i % L.size()], NULL, warps, slices));
    });
}

static void dg_section(double copy_bw, double l2)
{
    struct Shape {
        const char *name;
        int64_t N, K;
    };
    const Shape shapes[] = {{"8192 x 8192", 8192, 8192}, {"3B qkv", 2560, 2048}, {"3B o", 2048, 2048},
                            {"3B gate/up", 11008, 2048}, {"3B down", 2048, 11008}};
    const int64_t Ms[] = {1, 16, 64, 128, 256};
    printf("\n## Decode GEMM on packed FP4 weights (cuda/decode_packed.h) vs cuBLASLt BF16, FP32 output, weights rotated out of L2\n\n");
    printf("Speed-up = cuBLASLt BF16 time / packed time; %%copy = weight bytes per second / copy bandwidth (%.0f GB/s).\n\n", copy_bw);
    printf("| shape (N x K) | M | BF16 us | %%copy | mxfp4 us | x | %%copy | nvfp4 us | x | %%copy | hif4 us | x | %%copy |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::vector<std::vector<double>> resq_rows;
    for (const Shape &sh : shapes) {
        const int64_t N = sh.N, K = sh.K;
        const double bf_bytes = (double)N * K * 2;
        std::vector<fp4rl_tensor *> wb;
        for (int i = 0, nb = rotation(bf_bytes, l2, 32); i < nb; i++) wb.push_back(random_bf16(N, K, 100 + i));
        std::vector<std::vector<fp4rl_dg_layout *>> L(3);
        size_t qbytes[3];
        for (int f = 0; f < 3; f++) {
            size_t b;
            {
                std::vector<fp4rl_tensor *> one(1, wb[0]);
                std::vector<fp4rl_dg_layout *> probe = prepared(FP4[f], one, 1);
                fp4rl_cuda_dg_info(probe[0], NULL, NULL, NULL, &b, NULL);
                fp4rl_cuda_dg_destroy(ctx, probe[0]);
            }
            qbytes[f] = b;
            L[f] = prepared(FP4[f], wb, rotation((double)b, l2, 64));
        }
        const int64_t dy[2] = {256, N};
        fp4rl_tensor *y;
        CK(fp4rl_tensor_zeros(&y, ctx, FP4RL_DTYPE_F32, 2, dy));
        float *yp = static_cast<float *>(y->data);
        for (int64_t M : Ms) {
            fp4rl_tensor *x = random_bf16(M, 2 * K, 7);
            const double base = lt_ms(M, N, K, x, wb, yp);
            printf("| %s (%lld x %lld) | %lld | %.1f | %.0f%% |", sh.name, (long long)N, (long long)K, (long long)M, base * 1e3,
                   100.0 * bf_bytes / (base * 1e-3) / 1e9 / copy_bw);
            for (int f = 0; f < 3; f++) {
                const double ms = dg_ms(M, 0, x, L[f], yp);
                printf(" %.1f | %.2f | %.0f%% |", ms * 1e3, base / ms, 100.0 * (double)qbytes[f] / (ms * 1e-3) / 1e9 / copy_bw);
            }
            printf("\n");
            fflush(stdout);
            if (sh.N == 8192 || sh.N == 11008) { /* ResQ: today's fused path is BF16 [W | W] over 2K */
                std::vector<double> r = {(double)N, (double)K, (double)M};
                std::vector<fp4rl_tensor *> wb2;
                for (int i = 0, nb = rotation(2 * bf_bytes, l2, 16); i < nb; i++) wb2.push_back(random_bf16(N, 2 * K, 300 + i));
                r.push_back(lt_ms(M, N, 2 * K, x, wb2, yp));
                for (auto *t : wb2) fp4rl_tensor_destroy(t);
                r.push_back(dg_ms(M, 1, x, L[2], yp));
                r.push_back((double)qbytes[2]);
                resq_rows.push_back(r);
            }
            fp4rl_tensor_destroy(x);
        }
        if (sh.N == 8192) { /* the launch shapes, MXFP4 and HiF4 */
            printf("\n### Launch-shape sweep at 8192 x 8192 (us; auto = what fp4rl_cuda_dg_run picks)\n\n| format | M | auto |");
            const int warps[2] = {4, 8}, slices[6] = {1, 2, 3, 4, 6, 8};
            for (int w : warps)
                for (int s : slices) printf(" %dw %ds |", w, s);
            printf("\n|---|---|---|");
            for (int i = 0; i < 12; i++) printf("---|");
            printf("\n");
            for (int f = 0; f < 3; f += 2)
                for (int64_t M : {1, 16, 64, 256}) {
                    fp4rl_tensor *x = random_bf16(M, K, 9);
                    printf("| %s | %lld | %.1f |", fmt_name(FP4[f]), (long long)M, dg_ms(M, 0, x, L[f], yp) * 1e3);
                    for (int w : warps)
                        for (int s : slices) printf(" %.1f |", dg_ms(M, 0, x, L[f], yp, w, s) * 1e3);
                    printf("\n");
                    fflush(stdout);
                    fp4rl_tensor_destroy(x);
                }
            printf("\n| shape (N x K) | M | BF16 us | %%copy | mxfp4 us | x | %%copy | nvfp4 us | x | %%copy | hif4 us | x | %%copy |\n");
            printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        }
        fp4rl_tensor_destroy(y);
        for (auto *t : wb) fp4rl_tensor_destroy(t);
        for (auto &v : L)
            for (auto *l : v) fp4rl_cuda_dg_destroy(ctx, l);
    }
    printf("\n### ResQ: HiF4 packed over [x1 | x2] (W read once) vs today's fused path (cuBLASLt BF16, [W | W] over 2K)\n\n");
    printf("| shape (N x K) | M | BF16 2K us | hif4 ResQ us | x | %%copy |\n|---|---|---|---|---|---|\n");
    for (auto &r : resq_rows)
        printf("| %.0f x %.0f | %.0f | %.1f | %.1f | %.2f | %.0f%% |\n", r[0], r[1], r[2], r[3] * 1e3, r[4] * 1e3, r[3] / r[4],
               100.0 * r[5] / (r[4] * 1e-3) / 1e9 / copy_bw);
}

/* ncu target: 3 + reps launches of one configuration at N = K = 8192. */
static void dg_profile(fp4rl_dtype f, int64_t M)
{
    std::vector<fp4rl_tensor *> wb(1, random_bf16(8192, 8192, 1));
    std::vector<fp4rl_dg_layout *> L = prepared(f, wb, 1);
    const int64_t dy[2] = {M, 8192};
    fp4rl_tensor *y, *x = random_bf16(M, 8192, 2);
    CK(fp4rl_tensor_zeros(&y, ctx, FP4RL_DTYPE_F32, 2, dy));
    const double ms = dg_ms(M, 0, x, L, static_cast<float *>(y->data));
    printf("%s M %lld: %.1f us (L2-warm: one buffer)\n", fmt_name(f), (long long)M, ms * 1e3);
    fp4rl_cuda_dg_destroy(ctx, L[0]);
    fp4rl_tensor_destroy(x);
    fp4rl_tensor_destroy(y);
    fp4rl_tensor_destroy(wb[0]);
}

/* ---- 6. FP8-operand GEMM (cuda/gemm_fp8.h) ---- */
static void fp8_section(void)
{
    struct shape { const char *what; int64_t M, N, K; };
    std::vector<shape> shapes = {{"square", 8192, 8192, 8192}};
    /* Qwen2.5: 1.5B hidden 1536, intermediate 8960; 3B hidden 2048, intermediate 11008; both 2 KV
     * heads of 128 (k/v out 256). Per linear [out, in]: forward [T, out, in], dgrad [T, in, out],
     * wgrad [out, in, T] with T = 8192 tokens. */
    const struct { const char *name; int64_t h, i; } models[2] = {{"1.5B", 1536, 8960}, {"3B", 2048, 11008}};
    static char names[2][4][3][40];
    for (int mi = 0; mi < 2; mi++) {
        const int64_t h = models[mi].h, in = models[mi].i;
        const struct { const char *l; int64_t out, inp; } lin[4] = {{"q/o", h, h}, {"k/v", 256, h}, {"gate/up", in, h}, {"down", h, in}};
        for (int l = 0; l < 4; l++) {
            const char *pass[3] = {"fwd", "dgrad", "wgrad"};
            const int64_t mnk[3][3] = {{8192, lin[l].out, lin[l].inp}, {8192, lin[l].inp, lin[l].out}, {lin[l].out, lin[l].inp, 8192}};
            for (int p = 0; p < 3; p++) {
                snprintf(names[mi][l][p], sizeof names[mi][l][p], "%s %s %s", models[mi].name, lin[l].l, pass[p]);
                shapes.push_back({names[mi][l][p], mnk[p][0], mnk[p][1], mnk[p][2]});
            }
        }
    }
    printf("\n## FP8-operand GEMM (HiF4 / MXFP4 pairs), BF16 C; kernel: fp4rl_cuda_fp8_gemm_tc (wgmma m64n128k32 E4M3, 128x128 CTA "
           "tiles, where its gate holds; else mma.sync m16n8k32); mma.sync: that kernel alone\n\n");
    printf("| shape | M x N x K | operands | BF16 ms | BF16 TFLOP/s | kernel | kernel ms | kernel TFLOP/s | kernel vs BF16 | kernel %% of FP8 peak | "
           "pipe TFLOP/s | pipe vs BF16 | mma.sync TFLOP/s | mma.sync vs BF16 | +pre-pass ms | +pre-pass vs BF16 | dequant path vs BF16 |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const shape &sh : shapes) {
        const int64_t M = sh.M, N = sh.N, K = sh.K, dc[2] = {M, N};
        fp4rl_tensor *a = random_bf16(M, K, 2), *b = random_bf16(N, K, 3), *c;
        CK(fp4rl_tensor_zeros(&c, ctx, FP4RL_DTYPE_BF16, 2, dc));
        const double flop = 2.0 * M * N * K;
        const double base = time_ms([&](int) { CK(fp4rl_matmul(c, ctx, a, b)); });
        for (fp4rl_dtype f : {FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP4}) {
            fp4rl_quant_policy *p = policy(f, 0, 0);
            fp4rl_tensor *qa, *qb;
            CK(fp4rl_quantize(&qa, ctx, a, f, p, FP4RL_ROLE_WEIGHT));
            CK(fp4rl_quantize(&qb, ctx, b, f, p, FP4RL_ROLE_WEIGHT));
            const int U = fp4rl_cuda_fp8_unit(qa);
            void *a8, *b8, *sa, *sb;
            CK(fp4rl_cuda_alloc_bytes(ctx, &a8, (size_t)(M * K)));
            CK(fp4rl_cuda_alloc_bytes(ctx, &b8, (size_t)(N * K)));
            CK(fp4rl_cuda_alloc_bytes(ctx, &sa, fp4rl_cuda_fp8_scales_bytes(M, K, U)));
            CK(fp4rl_cuda_alloc_bytes(ctx, &sb, fp4rl_cuda_fp8_scales_bytes(N, K, U)));
            auto prepass = [&]() {
                CK(fp4rl_cuda_fp8_prepass(ctx, qa, (uint8_t *)a8, (float *)sa));
                CK(fp4rl_cuda_fp8_prepass(ctx, qb, (uint8_t *)b8, (float *)sb));
            };
            auto kernel = [&]() {
                CK(fp4rl_cuda_fp8_gemm_tc(ctx, (const uint8_t *)a8, (const float *)sa, (const uint8_t *)b8, (const float *)sb, c->data, 1, M,
                                          N, K, U));
            };
            auto kernel_mma = [&]() {
                CK(fp4rl_cuda_fp8_gemm_mma(ctx, (const uint8_t *)a8, (const float *)sa, (const uint8_t *)b8, (const float *)sb, c->data, 1,
                                           M, N, K, U));
            };
            prepass();
            const double tk = time_ms([&](int) { kernel(); });
            setenv("FP4RL_FP8_WG_PIPE", "1", 1); /* the wgmma kernel's pipelined consumer loop */
            const double tp = time_ms([&](int) { kernel(); });
            unsetenv("FP4RL_FP8_WG_PIPE");
            const double tm = time_ms([&](int) { kernel_mma(); });
            const double tf = time_ms([&](int) { prepass(); kernel(); });
            const char *kname = fp4rl_cuda_fp8_wg_ok(ctx, M, N, K) ? "wgmma" : "mma.sync";
            setenv("FP4RL_FP8_GEMM", "0", 1);
            const double td = time_ms([&](int) { CK(fp4rl_matmul(c, ctx, qa, qb)); });
            unsetenv("FP4RL_FP8_GEMM");
            printf("| %s | %lldx%lldx%lld | %s | %.3f | %.0f | %s | %.3f | %.0f | %.2f | %.1f%% | %.0f | %.2f | %.0f | %.2f | %.3f | %.2f | %.2f |\n",
                   sh.what, (long long)M, (long long)N, (long long)K, fmt_name(f), base, flop / (base * 1e-3) / 1e12, kname, tk,
                   flop / (tk * 1e-3) / 1e12, base / tk, 100.0 * flop / (tk * 1e-3) / 1979e12, flop / (tp * 1e-3) / 1e12, base / tp,
                   flop / (tm * 1e-3) / 1e12, base / tm, tf, base / tf, base / td);
            fflush(stdout);
            fp4rl_cuda_free_bytes(ctx, a8);
            fp4rl_cuda_free_bytes(ctx, b8);
            fp4rl_cuda_free_bytes(ctx, sa);
            fp4rl_cuda_free_bytes(ctx, sb);
            fp4rl_tensor_destroy(qa);
            fp4rl_tensor_destroy(qb);
            fp4rl_quant_policy_destroy(p);
        }
        fp4rl_tensor_destroy(a);
        fp4rl_tensor_destroy(b);
        fp4rl_tensor_destroy(c);
    }
}

/* The rollout's decode attention (the attention_rows op) at the Qwen2.5 heads: P prompts of L
 * tokens in the cache once, G completions each, every completion at t own keys; a BF16 cache and
 * BF16 numerics, as the BF16 rollout runs it. Bytes: what a row reads (its prompt's keys and its
 * own, k and v) and the unique bytes (each prompt once); the bound is the unique bytes at the
 * copy bandwidth (read + write counted, as a read-only stream of that rate). */
static void attn_section(double copy_bw)
{
    struct heads { const char *name; int64_t Hq, Hkv, D; } hs[] = {
        {"0.5B", 14, 2, 64}, {"1.5B", 12, 2, 128}, {"3B", 16, 2, 128}, {"7B", 28, 4, 128}};
    const int64_t P = 16, L = 128, NEW = 512, max_keys = L + NEW;
    printf("## Decode attention (attention_rows), BF16 cache and numerics, %lld prompts of %lld tokens, max_keys %lld\n\n",
           (long long)P, (long long)L, (long long)max_keys);
    printf("| heads (Hq/Hkv/D) | rows | own keys | us | GB/s read by rows | unique GB/s | x unique bound |\n|---|---|---|---|---|---|---|\n");
    for (const heads &h : hs) {
        for (int64_t G : {8, 32}) {
            const int64_t N = P * G, W = h.Hkv * h.D, rows = P * L + N * NEW;
            void *kc, *vc, *q, *out, *seg;
            CU(cudaMalloc(&kc, (size_t)(rows * W) * 2));
            CU(cudaMalloc(&vc, (size_t)(rows * W) * 2));
            CU(cudaMalloc(&q, (size_t)(N * h.Hq * h.D) * 4));
            CU(cudaMalloc(&out, (size_t)(N * h.Hq * h.D) * 4));
            CU(cudaMalloc(&seg, (size_t)(4 * N) * 4));
            CU(cudaMemsetAsync(kc, 0x3c, (size_t)(rows * W) * 2, stream)); /* 0x3c3c: a finite BF16 (~0.0115) */
            CU(cudaMemsetAsync(vc, 0x3c, (size_t)(rows * W) * 2, stream));
            CU(cudaMemsetAsync(q, 0x3c, (size_t)(N * h.Hq * h.D) * 4, stream));
            for (int64_t t : {1, 256, 511}) {
                std::vector<int32_t> sg(4 * N);
                for (int64_t n = 0; n < N; n++) {
                    sg[4 * n] = (int32_t)(n / G * L), sg[4 * n + 1] = (int32_t)L;
                    sg[4 * n + 2] = (int32_t)(P * L + n * NEW), sg[4 * n + 3] = (int32_t)t;
                }
                CU(cudaMemcpyAsync(seg, sg.data(), sg.size() * 4, cudaMemcpyHostToDevice, stream));
                const double ms = time_ms([&](int) {
                    CK(ctx->ops->attention_rows(ctx, (float *)out, (const float *)q, kc, vc, 1, (const int32_t *)seg, N, max_keys,
                                                h.Hq, h.Hkv, h.D, FP4RL_ATT_BF16));
                });
                const double row_bytes = (double)N * (L + t) * W * 4, uniq = ((double)P * L + (double)N * t) * W * 4;
                printf("| %s (%lld/%lld/%lld) | %lld | %lld | %.1f | %.0f | %.0f | %.1f |\n", h.name, (long long)h.Hq,
                       (long long)h.Hkv, (long long)h.D, (long long)N, (long long)t, ms * 1e3, row_bytes / ms / 1e6,
                       uniq / ms / 1e6, ms / (uniq / (copy_bw * 1e6)));
            }
            for (void *b : {kc, vc, q, out, seg}) CU(cudaFree(b));
        }
    }
    printf("\n");
}

/* ---- 11. the packed-weight GEMM with BF16 activations (cuda/decode_w4b.h) ---- */
/* The W4B sections' weights: 8192^2 and the 3B model's fused decode GEMMs. */
struct W4bShape {
    const char *name;
    int64_t N, K;
};
static const W4bShape W4B_SHAPES[] = {{"8192 x 8192", 8192, 8192}, {"3B q+k+v", 2560, 2048}, {"3B o", 2048, 2048},
                                      {"3B gate+up", 22016, 2048}, {"3B down", 2048, 11008}};

static void w4b_section(double copy_bw, double l2)
{
    const int64_t Ms[] = {1, 16, 64, 128, 256, 512};
    constexpr int NF = 5;
    const fp4rl_dtype fmts[NF] = {FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4}; /* from 2: re-laid out (fp4rl_cuda_w4b_pack) */
    printf("\n## Packed-weight GEMM, BF16 activations (cuda/decode_w4b.h) vs cuBLASLt BF16 on the BF16 weight, FP32 output, weights rotated "
           "out of L2\n\n");
    printf("x = cuBLASLt BF16 time / w4b time (auto split-K); %%copy = weight bytes (BF16; codes + scales) per second / copy bandwidth "
           "(%.0f GB/s); TFLOP/s = 2 M N K / time (%%pk: of the 989 TFLOP/s dense BF16 peak).\n\n", copy_bw);
    printf("| shape (N x K) | M | BF16 us | %%copy | TFLOP/s | hif4 us | x | %%copy | TFLOP/s (%%pk) | mxfp4 us | x | %%copy | hif4 packed us | x | "
           "%%copy | mxfp4 packed us | x | %%copy | nvfp4 packed us | x | %%copy |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const W4bShape &sh : W4B_SHAPES) {
        const int64_t N = sh.N, K = sh.K;
        const double bf_bytes = (double)N * K * 2;
        std::vector<fp4rl_tensor *> wb;
        for (int i = 0, nb = rotation(bf_bytes, l2, 32); i < nb; i++) wb.push_back(random_bf16(N, K, 100 + i));
        std::vector<fp4rl_tensor *> wq[NF];
        double qbytes[NF];
        for (int f = 0; f < NF; f++) {
            fp4rl_quant_policy *p = policy(fmts[f], 0, 0);
            qbytes[f] = (double)N * K / 2 + (double)N * K / (f == 1 ? 32 : 16); /* re-laid-out MXFP4: 4 bytes a 64 too */
            for (int i = 0, nq = rotation(qbytes[f], l2, 64); i < nq; i++) {
                fp4rl_tensor *q;
                CK(fp4rl_quantize(&q, ctx, wb[i % wb.size()], fmts[f], p, FP4RL_ROLE_WEIGHT));
                if (f >= 2) CK(fp4rl_cuda_w4b_pack(ctx, q));
                if (f == 3 && q->layout != FP4RL_LAYOUT_W4B) printf("(MXFP4 weight %d left as stored: a scale code past 128)\n", i);
                wq[f].push_back(q);
            }
            fp4rl_quant_policy_destroy(p);
        }
        const int64_t dy[2] = {512, N};
        fp4rl_tensor *y;
        CK(fp4rl_tensor_zeros(&y, ctx, FP4RL_DTYPE_F32, 2, dy));
        float *yp = static_cast<float *>(y->data);
        for (int64_t M : Ms) {
            fp4rl_tensor *x = random_bf16(M, K, 7);
            const double base = lt_ms(M, N, K, x, wb, yp), flop = 2.0 * M * N * K;
            printf("| %s (%lld x %lld) | %lld | %.1f | %.0f%% | %.0f |", sh.name, (long long)N, (long long)K, (long long)M, base * 1e3,
                   100.0 * bf_bytes / (base * 1e-3) / 1e9 / copy_bw, flop / (base * 1e-3) / 1e12);
            for (int f = 0; f < NF; f++) {
                const double ms = time_ms([&](int i) {
                    CK(fp4rl_cuda_w4b_gemm(ctx, yp, N, static_cast<const uint16_t *>(x->data), M, wq[f][i % wq[f].size()], NULL, 0));
                });
                const double tf = flop / (ms * 1e-3) / 1e12;
                if (f == 0) printf(" %.1f | %.2f | %.0f%% | %.0f (%.0f%%) |", ms * 1e3, base / ms, 100.0 * qbytes[f] / (ms * 1e-3) / 1e9 / copy_bw, tf, 100.0 * tf / 989.0);
                else printf(" %.1f | %.2f | %.0f%% |", ms * 1e3, base / ms, 100.0 * qbytes[f] / (ms * 1e-3) / 1e9 / copy_bw);
            }
            printf("\n");
            fflush(stdout);
            fp4rl_tensor_destroy(x);
        }
        fp4rl_tensor_destroy(y);
        for (fp4rl_tensor *t : wb) fp4rl_tensor_destroy(t);
        for (int f = 0; f < NF; f++)
            for (fp4rl_tensor *t : wq[f]) fp4rl_tensor_destroy(t);
    }
    printf("\n");
}

/* ---- 11b. the W4B grid choices (FP4RL_W4B_MT, slices, FP4RL_W4B_REDUCE) at the decode shapes ---- */
static void w4b_sweep(double l2)
{
    const int64_t Ms[] = {1, 16, 32, 64};
    const int sl[] = {1, 2, 4, 8, 16, 32};
    printf("\n## W4B grid sweep: HiF4 re-laid out, us (mt = m64 tiles a warpgroup, s = K slices, r = the split-K sum: 0 the last CTA, 1 wb_reduce, 2 a cluster); "
           "auto = the library's choice\n\n| shape | M | BF16 us | auto us | best | best us | auto / best | all (mt s r: us) |\n|---|---|---|---|---|---|---|---|\n");
    for (const W4bShape &sh : W4B_SHAPES) {
        const int64_t N = sh.N, K = sh.K;
        std::vector<fp4rl_tensor *> wb, wq;
        for (int i = 0, nb = rotation((double)N * K * 2, l2, 32); i < nb; i++) wb.push_back(random_bf16(N, K, 100 + i));
        fp4rl_quant_policy *p = policy(FP4RL_DTYPE_HIF4, 0, 0);
        for (int i = 0, nq = rotation((double)N * K * 9 / 16, l2, 64); i < nq; i++) {
            fp4rl_tensor *q;
            CK(fp4rl_quantize(&q, ctx, wb[i % wb.size()], FP4RL_DTYPE_HIF4, p, FP4RL_ROLE_WEIGHT));
            CK(fp4rl_cuda_w4b_pack(ctx, q));
            wq.push_back(q);
        }
        fp4rl_quant_policy_destroy(p);
        float *y;
        CU(cudaMalloc(&y, (size_t)(64 * N) * 4));
        for (int64_t M : Ms) {
            fp4rl_tensor *x = random_bf16(M, K, 7);
            auto run = [&](int slices) {
                return time_ms([&](int i) { CK(fp4rl_cuda_w4b_gemm(ctx, y, N, static_cast<const uint16_t *>(x->data), M, wq[i % wq.size()], NULL, slices)); });
            };
            const double base = lt_ms(M, N, K, x, wb, y), autot = run(0);
            std::string all;
            double best = 1e30;
            char bestc[32] = "";
            for (int mt = 1; mt <= 2; mt++)
                for (int si : sl)
                    for (int r = 0; r < (si > 1 ? si <= 8 ? 3 : 2 : 1); r++) { /* r 2: the cluster sum, at most 8 slices */
                        setenv("FP4RL_W4B_MT", mt == 1 ? "1" : "2", 1);
                        setenv("FP4RL_W4B_REDUCE", r == 2 ? "2" : r ? "1" : "0", 1);
                        const double t = run(si);
                        char b[48];
                        snprintf(b, sizeof b, "%d %d %d: %.1f; ", mt, si, r, t * 1e3);
                        all += b;
                        if (t < best) best = t, snprintf(bestc, sizeof bestc, "%d %d %d", mt, si, r);
                    }
            unsetenv("FP4RL_W4B_MT");
            unsetenv("FP4RL_W4B_REDUCE");
            printf("| %s | %lld | %.1f | %.1f | %s | %.1f | %.2f | %s |\n", sh.name, (long long)M, base * 1e3, autot * 1e3, bestc, best * 1e3, autot / best,
                   all.c_str());
            fflush(stdout);
            fp4rl_tensor_destroy(x);
        }
        CU(cudaFree(y));
        for (fp4rl_tensor *t : wb) fp4rl_tensor_destroy(t);
        for (fp4rl_tensor *t : wq) fp4rl_tensor_destroy(t);
    }
    printf("\n");
}

/* ---- 8. the W4A4 decode GEMM (cuda/decode_fp8.h) ---- */
static void d8_section(double copy_bw, double l2)
{
    struct Shape {
        const char *name;
        int64_t N, K;
    };
    const Shape shapes[] = {{"8192 x 8192", 8192, 8192}, {"3B o", 2048, 2048}, {"3B k/v", 256, 2048},
                            {"3B gate/up", 11008, 2048}, {"3B down", 2048, 11008}};
    const int64_t Ms[] = {1, 16, 64, 128, 256};
    const fp4rl_dtype fmts[2] = {FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP4};
    printf("\n## W4A4 decode GEMM on the FP8 tensor cores (cuda/decode_fp8.h) vs cuBLASLt BF16, FP32 output, weights rotated out of L2\n\n");
    printf("x = cuBLASLt BF16 time / d8 time (auto split-K); 1s = one K slice (bit-exact mode); %%copy = weight bytes (codes + scales) per "
           "second / copy bandwidth (%.0f GB/s); M wg: FP4RL_D8_WGMMA=1 (the wgmma kernel on sm_90a); M p: FP4RL_D8_PERSIST=1 with the "
           "re-laid-out weight (fp4rl_cuda_d8_gemm_tiles: the persistent kernel on sm_90+, M <= 64; the re-layout is not timed). The "
           "activation quantizer (act_e4m3) is not timed.\n\n", copy_bw);
    printf("| shape (N x K) | M | BF16 us | %%copy | hif4 us | x | %%copy | hif4 1s us | mxfp4 us | x | %%copy | mxfp4 1s us |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const Shape &sh : shapes) {
        const int64_t N = sh.N, K = sh.K;
        const double bf_bytes = (double)N * K * 2;
        std::vector<fp4rl_tensor *> wb;
        for (int i = 0, nb = rotation(bf_bytes, l2, 32); i < nb; i++) wb.push_back(random_bf16(N, K, 100 + i));
        std::vector<fp4rl_tensor *> wq[2];
        double qbytes[2];
        for (int f = 0; f < 2; f++) {
            fp4rl_quant_policy *p = policy(fmts[f], 0, 0);
            qbytes[f] = (double)N * K / 2 + (double)N * K / (f == 0 ? 16 : 32); /* codes + words / scale bytes */
            for (int i = 0, nq = rotation(qbytes[f], l2, 64); i < nq; i++) {
                fp4rl_tensor *q;
                CK(fp4rl_quantize(&q, ctx, wb[i % wb.size()], fmts[f], p, FP4RL_ROLE_WEIGHT));
                wq[f].push_back(q);
            }
            fp4rl_quant_policy_destroy(p);
        }
        /* the persistent kernel's re-laid-out weights (one per rotated weight, made once) */
        std::vector<void *> wt[2];
        for (int f = 0; f < 2; f++)
            for (fp4rl_tensor *q : wq[f]) {
                void *t = NULL;
                CK(fp4rl_cuda_d8_relayout(ctx, q, &t, NULL));
                wt[f].push_back(t);
            }
        const int64_t dy[2] = {256, N};
        fp4rl_tensor *y;
        CK(fp4rl_tensor_zeros(&y, ctx, FP4RL_DTYPE_F32, 2, dy));
        float *yp = static_cast<float *>(y->data);
        for (int64_t M : Ms) {
            fp4rl_tensor *x = random_bf16(M, 2 * K, 7); /* the BF16 GEMM's operand (its first K columns) */
            const double base = lt_ms(M, N, K, x, wb, yp);
            /* the E4M3 activation operand of each format, from F32 activations */
            std::vector<float> xh((size_t)(M * K));
            for (size_t i = 0; i < xh.size(); i++) xh[i] = (float)((int)(i * 2654435761u % 2001u) - 1000) * 1e-3f;
            float *xd;
            CU(cudaMalloc(&xd, xh.size() * 4));
            CU(cudaMemcpy(xd, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
            uint8_t *a8[2];
            float *sa[2];
            for (int f = 0; f < 2; f++) {
                CU(cudaMalloc(&a8[f], (size_t)(M * K)));
                CU(cudaMalloc(&sa[f], fp4rl_cuda_fp8_scales_bytes(M, K, f == 0 ? 64 : 32)));
                CK(fp4rl_cuda_act_e4m3(ctx, a8[f], sa[f], xd, M, K, fmts[f], 1, FP4RL_RESQ_OFF, NULL));
            }
            /* a row with FP4RL_D8_WGMMA unset (the mma.sync kernel), one with it =1 ("M wg": the wgmma
             * kernel where the device and the build have sm_90a, else the mma.sync kernel again), and
             * for M <= 64 one with FP4RL_D8_PERSIST=1 ("M p": the persistent kernel on sm_90+, else the
             * mma.sync kernel again) */
            for (int wg = 0; wg < 3; wg++) {
                if (wg == 2 && M > 64) break;
                if (wg == 1) setenv("FP4RL_D8_WGMMA", "1", 1);
                else unsetenv("FP4RL_D8_WGMMA");
                if (wg == 2) setenv("FP4RL_D8_PERSIST", "1", 1);
                else unsetenv("FP4RL_D8_PERSIST");
                printf("| %s (%lld x %lld) | %lld%s | %.1f | %.0f%% |", sh.name, (long long)N, (long long)K, (long long)M,
                       wg == 1 ? " wg" : wg == 2 ? " p" : "", base * 1e3, 100.0 * bf_bytes / (base * 1e-3) / 1e9 / copy_bw);
                for (int f = 0; f < 2; f++) {
                    auto run = [&](int i, int slices) {
                        const size_t j = i % wq[f].size();
                        CK(fp4rl_cuda_d8_gemm_tiles(ctx, a8[f], sa[f], M, wq[f][j], wt[f][j], yp, 0, N, slices));
                    };
                    const double ms = time_ms([&](int i) { run(i, 0); });
                    const double ms1 = time_ms([&](int i) { run(i, 1); });
                    printf(" %.1f | %.2f | %.0f%% | %.1f |", ms * 1e3, base / ms, 100.0 * qbytes[f] / (ms * 1e-3) / 1e9 / copy_bw, ms1 * 1e3);
                }
                printf("\n");
                fflush(stdout);
            }
            unsetenv("FP4RL_D8_WGMMA");
            unsetenv("FP4RL_D8_PERSIST");
            for (int f = 0; f < 2; f++) {
                CU(cudaFree(a8[f]));
                CU(cudaFree(sa[f]));
            }
            CU(cudaFree(xd));
            fp4rl_tensor_destroy(x);
        }
        fp4rl_tensor_destroy(y);
        for (auto *t : wb) fp4rl_tensor_destroy(t);
        for (int f = 0; f < 2; f++) {
            for (auto *t : wq[f]) fp4rl_tensor_destroy(t);
            for (void *t : wt[f]) fp4rl_cuda_free_bytes(ctx, t);
        }
    }
}

/* cuBLASLt's own choice against the best of its first 24 candidates, BF16 x BF16 -> FP32 as the
 * rollout's linears call it (C[M,N] = A[M,K] B[N,K]^T, weights rotated out of L2), at the decode
 * shapes of the 1.5B and 3B models (fused q/k/v and gate/up) and 128-1024 rows (ResQ doubles the
 * rows). Tells whether choosing among cuBLASLt's candidates would pay before the library does it. */
static void lt_section(double copy_bw, double l2)
{
    const fp4rl_cublaslt *api = fp4rl_cublaslt_api();
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    struct Shape {
        const char *name;
        int64_t n, k;
    } shapes[] = {{"3B qkv", 2560, 2048}, {"3B o", 2048, 2048}, {"3B gate/up", 22016, 2048}, {"3B down", 2048, 11008},
                  {"1.5B qkv", 2048, 1536}, {"1.5B o", 1536, 1536}, {"1.5B gate/up", 17920, 1536}, {"1.5B down", 1536, 8960}};
    const int64_t rows[] = {128, 256, 512, 1024};
    printf("## cuBLASLt BF16 -> FP32 at the rollout's decode shapes: its first choice against the best of 24 candidates\n\n");
    printf("| shape (N x K) | M | weight bound us | first us | best us | best # | best tile / stages / split-K | first / best |\n"
           "|---|---|---|---|---|---|---|---|\n");
    double sum_first[2][4] = {}, sum_best[2][4] = {};
    for (const Shape &sh : shapes) {
        const int nb = rotation((double)sh.n * sh.k * 2, l2, 8);
        std::vector<fp4rl_tensor *> wb;
        for (int i = 0; i < nb; i++) wb.push_back(random_bf16(sh.n, sh.k, 100 + i));
        fp4rl_tensor *x = random_bf16(1024, sh.k, 7);
        float *y;
        CU(cudaMalloc(&y, (size_t)1024 * sh.n * 4));
        for (int mi = 0; mi < 4; mi++) {
            const int64_t M = rows[mi];
            cublasLtMatmulDesc_t desc;
            cublasLtMatrixLayout_t la, lb, lc;
            cublasLtMatmulPreference_t pref;
            const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
            api->desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
            api->desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
            api->desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
            api->layout_create(&la, CUDA_R_16BF, sh.k, sh.n, sh.k);
            api->layout_create(&lb, CUDA_R_16BF, sh.k, M, sh.k);
            api->layout_create(&lc, CUDA_R_32F, sh.n, M, sh.n);
            api->pref_create(&pref);
            size_t ws = cu->lt_workspace_bytes;
            api->pref_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
            cublasLtMatmulHeuristicResult_t res[24];
            int count = 0;
            api->algo_get_heuristic(cu->lt, desc, la, lb, lc, lc, pref, 24, res, &count);
            double first = 0, best = 1e30;
            int bi = -1;
            for (int i = 0; i < count; i++) {
                if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
                const float alpha = 1.0f, beta = 0.0f;
                int bad = 0;
                const double t = time_ms([&](int j) {
                    bad |= api->matmul(cu->lt, desc, &alpha, wb[j % nb]->data, la, x->data, lb, &beta, y, lc, y, lc, &res[i].algo,
                                       cu->lt_workspace, cu->lt_workspace_bytes, stream) != CUBLAS_STATUS_SUCCESS;
                });
                if (bad) continue;
                if (i == 0) first = t;
                if (t < best) best = t, bi = i;
            }
            int tile = -1, stages = -1, split = -1;
            if (bi >= 0) {
                size_t w;
                api->algo_config_get_attribute(&res[bi].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
                api->algo_config_get_attribute(&res[bi].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
                api->algo_config_get_attribute(&res[bi].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split, &w);
            }
            const double bound = (double)sh.n * sh.k * 2 * 2 / (copy_bw * 1e9) * 1e6; /* copy_bw counts read + write */
            printf("| %s %lld x %lld | %lld | %.1f | %.1f | %.1f | %d of %d | %d / %d / %d | %.2f |\n", sh.name, (long long)sh.n,
                   (long long)sh.k, (long long)M, bound, first * 1e3, best * 1e3, bi, count, tile, stages, split, first / best);
            const int m3 = sh.name[0] == '3' ? 1 : 0;
            sum_first[m3][mi] += first * 1e3;
            sum_best[m3][mi] += best * 1e3;
            api->pref_destroy(pref);
            api->layout_destroy(lc);
            api->layout_destroy(lb);
            api->layout_destroy(la);
            api->desc_destroy(desc);
        }
        CU(cudaFree(y));
        fp4rl_tensor_destroy(x);
        for (auto *t : wb) fp4rl_tensor_destroy(t);
    }
    printf("\nA layer's four GEMMs, us (first choice -> best): ");
    for (int m3 = 1; m3 >= 0; m3--)
        for (int mi = 0; mi < 4; mi++)
            printf("%s M=%lld %.1f -> %.1f; ", m3 ? "3B" : "1.5B", (long long)rows[mi], sum_first[m3][mi], sum_best[m3][mi]);
    printf("\n\n");
}

/* The rollout's activation operand (rollout_act: HiF4 + ResQ 2:4 writes Q(x) and S(Q(R)) as BF16,
 * with the underflow counts or without) against the BF16 numerics' operand (pack_bf16) at the
 * rollout's decode shapes: rows 128 / 256 / 512, K of the 3B model's q/k/v, o, gate/up (2048) and
 * down (11008). Bytes: FP32 read + BF16 written. */
static void act_section(double copy_bw)
{
    const int64_t rows[] = {128, 256, 512}, ks[] = {2048, 11008};
    unsigned long long *counts;
    CU(cudaMalloc(&counts, 2 * sizeof *counts));
    printf("## The rollout's activation operand at decode shapes (us)\n\n| rows x K | pack_bf16 | HiF4 ResQ 2:4, counts | "
           "no counts | MXFP4 ResQ 2:4 | HiF4 %% of copy |\n|---|---|---|---|---|---|\n");
    for (int64_t N : rows)
        for (int64_t K : ks) {
            float *x;
            uint16_t *out;
            CU(cudaMalloc(&x, (size_t)N * K * 4));
            CU(cudaMalloc(&out, (size_t)2 * N * K * 2));
            /* a smooth ramp of magnitudes, so blocks have real scales and some elements underflow */
            std::vector<float> h((size_t)N * K);
            for (size_t i = 0; i < h.size(); i++) h[i] = (float)((int)(i * 2654435761u % 2001) - 1000) * 1e-3f * (1.0f + (float)(i % 64));
            CU(cudaMemcpy(x, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
            const double tp = time_ms([&](int) { CK(ctx->ops->pack_bf16(ctx, out, K, x, N, K)); });
            const double tc = time_ms([&](int) { CK(ctx->ops->rollout_act(ctx, out, counts, x, N, K, FP4RL_QDQ_HIF4, 1, FP4RL_RESQ_2_4)); });
            const double tn = time_ms([&](int) { CK(ctx->ops->rollout_act(ctx, out, NULL, x, N, K, FP4RL_QDQ_HIF4, 1, FP4RL_RESQ_2_4)); });
            const double tm = time_ms([&](int) { CK(ctx->ops->rollout_act(ctx, out, counts, x, N, K, FP4RL_QDQ_MXFP4, 1, FP4RL_RESQ_2_4)); });
            const double bytes = (double)N * K * (4 + 2 * 2);
            printf("| %lld x %lld | %.1f | %.1f | %.1f | %.1f | %.0f%% |\n", (long long)N, (long long)K, tp * 1e3, tc * 1e3, tn * 1e3, tm * 1e3,
                   100.0 * bytes / (tc * 1e-3) / 1e9 / copy_bw);
            CU(cudaFree(x));
            CU(cudaFree(out));
        }
    CU(cudaFree(counts));
    printf("\n");
}

int main(int argc, char **argv)
{
    if (argc > 1) reps = atoi(argv[1]) > 0 ? atoi(argv[1]) : reps;
    const int decode_only = argc > 2 && strcmp(argv[2], "decode") == 0; /* for profiling runs */
    const int dg_only = argc > 2 && strcmp(argv[2], "dg") == 0, dg_prof = argc > 4 && strcmp(argv[2], "dgprof") == 0;
    const int quant_only = argc > 2 && strcmp(argv[2], "quant") == 0;
    const char *only_format = quant_only && argc > 3 ? argv[3] : NULL;
    fp4rl_status st = fp4rl_context_create(&ctx, FP4RL_DEVICE_CUDA, 0);
    if (st != FP4RL_OK) {
        printf("skip: %s\n", fp4rl_last_error());
        return 77;
    }
    fp4rl_cuda *cu = fp4rl_cuda_of(ctx);
    stream = cu->stream;
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, cu->device));
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    printf("# fp4rl_bench, %s, %s (%d SMs, %.0f MB L2), median of %d\n\n", date, prop.name, prop.multiProcessorCount,
           prop.l2CacheSize / 1e6, reps);

    if (argc > 2 && strcmp(argv[2], "fp8") == 0) {
        fp8_section();
        fp4rl_context_destroy(ctx);
        return 0;
    }
    if (dg_prof) {
        const fp4rl_dtype f = strcmp(argv[3], "mxfp4") == 0 ? FP4RL_DTYPE_MXFP4 : strcmp(argv[3], "nvfp4") == 0 ? FP4RL_DTYPE_NVFP4
                                                                                                              : FP4RL_DTYPE_HIF4;
        dg_profile(f, atoll(argv[4]));
        fp4rl_context_destroy(ctx);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "act") == 0) {
        act_section(copy_bandwidth());
        fp4rl_context_destroy(ctx);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "lt") == 0) {
        lt_section(copy_bandwidth(), prop.l2CacheSize);
        fp4rl_context_destroy(ctx);
        return 0;
    }
    if (argc > 5 && strcmp(argv[2], "w4bprof") == 0) { /* 3 + reps launches of the w4b kernel alone, HiF4 (for ncu); 6th arg "pack": re-laid out, "nvfp4": NVFP4 re-laid out */
        const int64_t M = atoll(argv[3]), N = atoll(argv[4]), K = atoll(argv[5]);
        const bool nv = argc > 6 && strcmp(argv[6], "nvfp4") == 0;
        const fp4rl_dtype fmt = nv ? FP4RL_DTYPE_NVFP4 : FP4RL_DTYPE_HIF4;
        fp4rl_tensor *w = random_bf16(N, K, 3), *x = random_bf16(M, K, 4), *q;
        fp4rl_quant_policy *p = policy(fmt, 0, 0);
        CK(fp4rl_quantize(&q, ctx, w, fmt, p, FP4RL_ROLE_WEIGHT));
        if (nv || (argc > 6 && strcmp(argv[6], "pack") == 0)) CK(fp4rl_cuda_w4b_pack(ctx, q));
        float *y;
        CU(cudaMalloc(&y, (size_t)(M * N) * 4));
        for (int i = 0; i < 3 + reps; i++) CK(fp4rl_cuda_w4b_gemm(ctx, y, N, static_cast<const uint16_t *>(x->data), M, q, NULL, 0));
        CU(cudaStreamSynchronize(stream));
        printf("w4bprof: %d launches, M %lld N %lld K %lld\n", 3 + reps, (long long)M, (long long)N, (long long)K);
        fp4rl_context_destroy(ctx);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "w4bsweep") == 0) {
        w4b_sweep(prop.l2CacheSize);
        fp4rl_context_destroy(ctx);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "w4b") == 0) {
        w4b_section(copy_bandwidth(), prop.l2CacheSize);
        fp4rl_context_destroy(ctx);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "d8") == 0) {
        d8_section(copy_bandwidth(), prop.l2CacheSize);
        fp4rl_context_destroy(ctx);
        return 0;
    }
    if (decode_only) goto decode;
    {
    /* ---- 1. copy bandwidth ---- */
    const double copy_bw = copy_bandwidth();
    if (argc > 2 && strcmp(argv[2], "attn") == 0) {
        attn_section(copy_bw);
        fp4rl_context_destroy(ctx);
        return 0;
    }
    if (dg_only) {
        dg_section(copy_bw, prop.l2CacheSize);
        fp4rl_context_destroy(ctx);
        return 0;
    }

    /* ---- 2. quantize throughput ---- */
    const int64_t QN = 8192;
    fp4rl_tensor *x = random_bf16(QN, QN, 1);
    {
        /* the streaming references on the same input (and an output of a quarter of its size) */
        const int64_t n16 = (int64_t)fp4rl_tensor_nbytes(x) / 16;
        uint4 *dst;
        unsigned *sink;
        CU(cudaMalloc(&dst, (size_t)(n16 / 4 + 1) * 16));
        CU(cudaMalloc(&sink, sizeof(unsigned)));
        const unsigned grid = (unsigned)prop.multiProcessorCount * 8;
        const uint4 *src = static_cast<const uint4 *>(x->data);
        const double ro = time_ms([&](int) { stream_kernel<<<grid, 256, 0, stream>>>(src, n16, dst, 0, sink); });
        const double rw = time_ms([&](int) { stream_kernel<<<grid, 256, 0, stream>>>(src, n16, dst, 1, sink); });
        const double b = (double)n16 * 16;
        printf("Streaming kernels on the quantize input (%.0f MB): read-only %.1f us, %.0f GB/s (%.0f%% of copy); "
               "read + write 1/4 %.1f us, %.0f GB/s (%.0f%% of copy)\n\n",
               b / 1e6, ro * 1e3, b / (ro * 1e-3) / 1e9, 100.0 * b / (ro * 1e-3) / 1e9 / copy_bw, rw * 1e3,
               1.25 * b / (rw * 1e-3) / 1e9, 100.0 * 1.25 * b / (rw * 1e-3) / 1e9 / copy_bw);
        CU(cudaFree(dst));
        CU(cudaFree(sink));
    }
    printf("## Quantize, BF16 %lld x %lld (truncation-free scales where the format has a rule)\n\n", (long long)QN, (long long)QN);
    printf("Kernels: the quantize kernels alone (NVFP4: its amax pass too, which reads the source a second time, "
           "uncounted); call: fp4rl_quantize as a user calls it (allocation; NVFP4 also waits for g on the host).\n\n");
    printf("| format | blocks | rounding | kernels (us) | GB/s (read + written) | %% of copy | call (us) | call %% of copy |\n"
           "|---|---|---|---|---|---|---|---|\n");
    for (fp4rl_dtype f : FORMATS)
        for (int two_d = 0; two_d < 2; two_d++)
            for (int sr = 0; sr < 2; sr++) {
                if (only_format && strcmp(only_format, fmt_name(f)) != 0) continue;
                const int tile = two_d ? tile2d(f) : 0;
                fp4rl_quant_policy *p = policy(f, tile, sr);
                fp4rl_tensor *q;
                CK(fp4rl_quantize(&q, ctx, x, f, p, FP4RL_ROLE_WEIGHT));
                const double bytes = (double)fp4rl_tensor_nbytes(x) + (double)fp4rl_tensor_nbytes(q);
                const double call = time_ms([&](int) {
                    fp4rl_tensor *r;
                    CK(fp4rl_quantize(&r, ctx, x, f, p, FP4RL_ROLE_WEIGHT));
                    fp4rl_tensor_destroy(r); /* back to the cache; stream order protects it */
                });
                fp4rl_qparams qp;
                memset(&qp, 0, sizeof qp);
                qp.format = f;
                qp.tile = tile;
                qp.truncation_free = 1;
                qp.stochastic = sr;
                qp.seed = 0x243F6A8885A308D3ull;
                const double ms = time_ms([&](int i) {
                    qp.offset = (uint64_t)i;
                    CK(fp4rl_cuda_quantize_launch(ctx, q, x, &qp));
                });
                fp4rl_tensor_destroy(q);
                const double bw = bytes / (ms * 1e-3) / 1e9, cbw = bytes / (call * 1e-3) / 1e9;
                char blocks[16];
                snprintf(blocks, sizeof blocks, two_d ? "2D %dx%d" : "1D", tile, tile);
                printf("| %s | %s | %s | %.1f | %.0f | %.0f%% | %.1f | %.0f%% |\n", fmt_name(f), blocks, sr ? "stochastic" : "nearest",
                       ms * 1e3, bw, 100.0 * bw / copy_bw, call * 1e3, 100.0 * cbw / copy_bw);
                fflush(stdout);
                fp4rl_quant_policy_destroy(p);
            }
    fp4rl_tensor_destroy(x);
    if (quant_only) {
        fp4rl_context_destroy(ctx);
        return 0;
    }

    /* ---- 3. large GEMMs ---- */
    printf("\n## GEMM C[M,N] = A[M,K] B[N,K]^T, BF16 output, M = N = K\n\n");
    printf("| size | operands | time (ms) | TFLOP/s | vs cuBLASLt BF16 |\n|---|---|---|---|---|\n");
    for (int64_t n : {4096, 8192}) {
        const int64_t dc[2] = {n, n};
        fp4rl_tensor *a = random_bf16(n, n, 2), *b = random_bf16(n, n, 3), *c;
        CK(fp4rl_tensor_zeros(&c, ctx, FP4RL_DTYPE_BF16, 2, dc));
        const double flop = 2.0 * n * n * n;
        const double base = time_ms([&](int) { CK(fp4rl_matmul(c, ctx, a, b)); });
        printf("| %lld | BF16 x BF16 (cuBLASLt) | %.3f | %.0f | 1.00 |\n", (long long)n, base, flop / (base * 1e-3) / 1e12);
        for (fp4rl_dtype f : FP4) {
            fp4rl_quant_policy *p = policy(f, 0, 0);
            fp4rl_tensor *qa, *qb;
            CK(fp4rl_quantize(&qa, ctx, a, f, p, FP4RL_ROLE_WEIGHT));
            CK(fp4rl_quantize(&qb, ctx, b, f, p, FP4RL_ROLE_WEIGHT));
            const double ms = time_ms([&](int) { CK(fp4rl_matmul(c, ctx, qa, qb)); });
            printf("| %lld | %s x %s (dequant to BF16 + cuBLASLt) | %.3f | %.0f | %.2f |\n", (long long)n, fmt_name(f), fmt_name(f), ms,
                   flop / (ms * 1e-3) / 1e12, base / ms);
            fflush(stdout);
            fp4rl_tensor_destroy(qa);
            fp4rl_tensor_destroy(qb);
            fp4rl_quant_policy_destroy(p);
        }
        fp4rl_tensor_destroy(a);
        fp4rl_tensor_destroy(b);
        fp4rl_tensor_destroy(c);
    }

    }
decode:
    /* ---- 4. decode-shaped products ---- */
    const int64_t DN = 8192, DK = 8192;
    const int NBF = 3, NQ = 6; /* 3 x 128 MB of BF16 weights, 6 x ~36 MB of FP4: each set well over L2 */
    printf("\n## Decode-shaped GEMM, N = K = %lld, BF16 activations and output, weights rotated (%d BF16 / %d FP4 buffers)\n\n",
           (long long)DN, NBF, NQ);
    printf("| M | weights | time (us) | weight GB/s | speed-up vs cuBLASLt BF16 |\n|---|---|---|---|---|\n");
    std::vector<fp4rl_tensor *> wb;
    for (int i = 0; i < NBF; i++) wb.push_back(random_bf16(DN, DK, 10 + i));
    std::vector<std::vector<fp4rl_tensor *>> wq(3);
    for (int fi = 0; fi < 3; fi++) {
        fp4rl_quant_policy *p = policy(FP4[fi], 0, 0);
        for (int i = 0; i < NQ; i++) {
            fp4rl_tensor *q;
            CK(fp4rl_quantize(&q, ctx, wb[i % NBF], FP4[fi], p, FP4RL_ROLE_WEIGHT));
            wq[fi].push_back(q);
        }
        fp4rl_quant_policy_destroy(p);
    }
    for (int64_t M : {1, 16, 64}) {
        const int64_t dc[2] = {M, DN};
        fp4rl_tensor *a = random_bf16(M, DK, 20), *c;
        CK(fp4rl_tensor_zeros(&c, ctx, FP4RL_DTYPE_BF16, 2, dc));
        const double base = time_ms([&](int i) { CK(fp4rl_matmul(c, ctx, a, wb[i % NBF])); });
        printf("| %lld | BF16 (cuBLASLt) | %.1f | %.0f | 1.00 |\n", (long long)M, base * 1e3, (double)fp4rl_tensor_nbytes(wb[0]) / (base * 1e-3) / 1e9);
        for (int fi = 0; fi < 3; fi++) {
            const double ms = time_ms([&](int i) { CK(fp4rl_matmul(c, ctx, a, wq[fi][i % NQ])); });
            printf("| %lld | %s (fused FP4-weight kernel) | %.1f | %.0f | %.2f |\n", (long long)M, fmt_name(FP4[fi]), ms * 1e3,
                   (double)fp4rl_tensor_nbytes(wq[fi][0]) / (ms * 1e-3) / 1e9, base / ms);
            fflush(stdout);
        }
        fp4rl_tensor_destroy(a);
        fp4rl_tensor_destroy(c);
    }
    /* the split-K choice, swept for MXFP4 (the automatic one is what the table above used) */
    printf("\n### Split-K sweep, MXFP4 weights (us)\n\n| M | auto |");
    const int sweep[] = {1, 2, 4, 8, 16, 32};
    for (int sl : sweep) printf(" %d |", sl);
    printf("\n|---|---|---|---|---|---|---|---|\n");
    for (int64_t M : {1, 16, 64}) {
        const int64_t dc[2] = {M, DN};
        fp4rl_tensor *a = random_bf16(M, DK, 20), *c;
        CK(fp4rl_tensor_zeros(&c, ctx, FP4RL_DTYPE_BF16, 2, dc));
        printf("| %lld |", (long long)M);
        for (int sl = -1; sl < (int)(sizeof sweep / sizeof sweep[0]); sl++) {
            const int want = sl < 0 ? 0 : sweep[sl];
            const double ms = time_ms([&](int i) { CK(fp4rl_cuda_decode_gemm_split(ctx, c, a, wq[0][i % NQ], 1.0f, want)); });
            printf(" %.1f |", ms * 1e3);
        }
        printf("\n");
        fflush(stdout);
        fp4rl_tensor_destroy(a);
        fp4rl_tensor_destroy(c);
    }
    for (auto *t : wb) fp4rl_tensor_destroy(t);
    for (auto &v : wq)
        for (auto *t : v) fp4rl_tensor_destroy(t);
    /* ---- 5. the decode GEMM on packed weights ---- */
    if (!decode_only) dg_section(copy_bandwidth(), prop.l2CacheSize);
    fp4rl_context_destroy(ctx);
    return 0;
}
