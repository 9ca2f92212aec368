/*
 * format_table.c - the table that motivates fp4rl's two recipes: for Gaussian data and for
 * outlier-heavy data, each format's relative error, the fraction of non-zero values that
 * underflow to zero, and the fraction of blocks whose max saturates.
 *
 *   fp4rl_format_table [rows cols]     (default 1024 x 4096, on the CPU)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <fp4rl/fp4rl.h>

#define CHECK(call)                                                                              \
    do {                                                                                         \
        fp4rl_status st_ = (call);                                                               \
        if (st_ != FP4RL_OK) {                                                                   \
            fprintf(stderr, "%s failed: %s: %s\n", #call, fp4rl_status_name(st_), fp4rl_last_error()); \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

/* xorshift64* and Box-Muller: deterministic data without a dependency. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform01(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) * 0x1p-53;
}
static double gaussian(void)
{
    double u = uniform01(), v = uniform01();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

int main(int argc, char **argv)
{
    int64_t rows = argc > 2 ? atoll(argv[1]) : 1024, cols = argc > 2 ? atoll(argv[2]) : 4096;
    if (rows < 1 || cols < 1) {
        fprintf(stderr, "usage: %s [rows cols]\n", argv[0]);
        return 2;
    }
    float *x = malloc((size_t)(rows * cols) * sizeof(float));
    if (!x) return 1;
    fp4rl_context *ctx;
    CHECK(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0));
    fp4rl_quant_policy *pol;
    CHECK(fp4rl_quant_policy_create(&pol));

    const struct { const char *name; fp4rl_dtype f; int tile; int tf; } cfg[] = {
        {"MXFP4 1D (OCP floor)", FP4RL_DTYPE_MXFP4, 0, 0},
        {"MXFP4 1D (trunc-free)", FP4RL_DTYPE_MXFP4, 0, 1},
        {"MXFP4 2D 32x32 (tf)", FP4RL_DTYPE_MXFP4, 32, 1},
        {"NVFP4 1D", FP4RL_DTYPE_NVFP4, 0, 0},
        {"NVFP4 2D 16x16", FP4RL_DTYPE_NVFP4, 16, 0},
        {"HiF4 1D", FP4RL_DTYPE_HIF4, 0, 0},
        {"HiF4 2D 64x64", FP4RL_DTYPE_HIF4, 64, 0},
        {"MXFP8 E4M3 1D", FP4RL_DTYPE_MXFP8_E4M3, 0, 0},
    };
    printf("fp4rl %s: quantization error on %lld x %lld, 1D blocks along rows unless noted\n\n",
           fp4rl_version_string(), (long long)rows, (long long)cols);
    for (int data = 0; data < 2; data++) {
        /* outlier-heavy: Gaussian rows plus a few channels 30-100x larger, as in LLM activations */
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                double v = gaussian();
                if (data == 1 && c % 97 == 5) v *= 30.0 + 70.0 * uniform01();
                if (data == 1) v *= 0.05;
                x[r * cols + c] = (float)v;
            }
        const int64_t shape[2] = {rows, cols};
        fp4rl_tensor *src;
        CHECK(fp4rl_tensor_from_host(&src, ctx, FP4RL_DTYPE_F32, 2, shape, x));
        printf("%s data\n", data ? "Outlier-heavy (every 97th channel x30..x100)" : "Gaussian N(0,1)");
        printf("  %-24s %12s %12s %12s\n", "format", "rel. MSE", "underflow", "saturated");
        double hif4_mse = 0, mse_of[8];
        for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
            CHECK(fp4rl_quant_policy_set(pol, FP4RL_QP_FORMAT_ACTIVATION, cfg[k].f));
            CHECK(fp4rl_quant_policy_set(pol, FP4RL_QP_TILE_ACTIVATION, cfg[k].tile));
            CHECK(fp4rl_quant_policy_set(pol, FP4RL_QP_SCALE_RULE, cfg[k].tf));
            fp4rl_tensor *q;
            CHECK(fp4rl_quantize(&q, ctx, src, cfg[k].f, pol, FP4RL_ROLE_ACTIVATION));
            double mse, under, sat;
            CHECK(fp4rl_quant_error(src, q, &mse, &under, &sat, NULL));
            printf("  %-24s %12.5f %11.2f%% %11.2f%%\n", cfg[k].name, mse, 100 * under, 100 * sat);
            mse_of[k] = mse;
            if (cfg[k].f == FP4RL_DTYPE_HIF4 && cfg[k].tile == 0) hif4_mse = mse;
            fp4rl_tensor_destroy(q);
            CHECK(fp4rl_quant_policy_set(pol, FP4RL_QP_TILE_ACTIVATION, 0));
        }
        printf("  MSE ratios: NVFP4/HiF4 = %.3f, MXFP4/HiF4 = %.3f\n\n", mse_of[3] / hif4_mse, mse_of[0] / hif4_mse);
        fp4rl_tensor_destroy(src);
    }
    fp4rl_quant_policy_destroy(pol);
    fp4rl_context_destroy(ctx);
    free(x);
    return 0;
}
