/*
 * test_api.c - the ABI's contract for bad input: every entry point validates its handles,
 * pointers, shapes and dtypes, returns the right status and leaves a non-empty message; plus
 * version, status names, policy parameters and presets, tensor accessors, import/export.
 */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <fp4rl/fp4rl.h>

static fp4rl_context *ctx;
static void setup(void) { ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK); }
static void teardown(void) { fp4rl_context_destroy(ctx); }

/* The call returns `want` and leaves a message. */
#define EXPECT FP4RL_EXPECT /* check_run.h */

static fp4rl_tensor *f32_tensor(int64_t r, int64_t c, float fill)
{
    float *x = malloc((size_t)(r * c) * sizeof(float));
    for (int64_t i = 0; i < r * c; i++) x[i] = fill * (float)((i % 7) - 3);
    int64_t shape[2] = {r, c};
    fp4rl_tensor *t = NULL;
    ck_assert_int_eq(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 2, shape, x), FP4RL_OK);
    free(x);
    return t;
}

START_TEST(test_version_and_names)
{
    ck_assert_uint_eq(fp4rl_version_number(), FP4RL_VERSION_NUMBER);
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%d.%d", FP4RL_VERSION_MAJOR, FP4RL_VERSION_MINOR, FP4RL_VERSION_PATCH);
    ck_assert_str_eq(fp4rl_version_string(), buf);
    ck_assert_str_eq(fp4rl_status_name(FP4RL_OK), "FP4RL_OK");
    ck_assert_str_eq(fp4rl_status_name(FP4RL_ERR_CORRUPT), "FP4RL_ERR_CORRUPT");
    ck_assert_str_eq(fp4rl_status_name((fp4rl_status)999), "FP4RL_STATUS_UNKNOWN");
    ck_assert_str_eq(fp4rl_dtype_name(FP4RL_DTYPE_HIF4), "hif4");
    ck_assert_str_eq(fp4rl_qparam_name(FP4RL_QP_SCALE_RULE), "scale_rule");
    ck_assert_ptr_null(fp4rl_qparam_name((fp4rl_qparam)99));
}
END_TEST

START_TEST(test_context_errors)
{
    fp4rl_context *c = NULL;
    EXPECT(fp4rl_context_create(NULL, FP4RL_DEVICE_CPU, 0), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_context_create(&c, (fp4rl_device)7, 0), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_context_create(&c, FP4RL_DEVICE_CPU, -1), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_context_create(&c, FP4RL_DEVICE_CPU, 3), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(c);
    /* CUDA: works on a GPU machine; otherwise a clear DEVICE (no GPU) or UNSUPPORTED (no CUDA build). */
    fp4rl_status st = fp4rl_context_create(&c, FP4RL_DEVICE_CUDA, 0);
    if (st == FP4RL_OK) {
        ck_assert_int_eq(fp4rl_context_device(c), FP4RL_DEVICE_CUDA);
        fp4rl_context_destroy(c);
    } else {
        ck_assert(st == FP4RL_ERR_DEVICE || st == FP4RL_ERR_UNSUPPORTED);
        ck_assert(strlen(fp4rl_last_error()) > 10);
        ck_assert_ptr_null(c);
    }
    EXPECT(fp4rl_context_create(&c, FP4RL_DEVICE_CUDA, 100000), st == FP4RL_OK ? FP4RL_ERR_DEVICE : st);
    fp4rl_context_destroy(NULL);
    EXPECT(fp4rl_context_set_seed(NULL, 1), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_context_set_rng_offset(NULL, 1), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_context_get_rng(NULL, NULL, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_context_device(NULL), -1);

    uint64_t seed, off;
    EXPECT(fp4rl_context_set_seed(ctx, 42), FP4RL_OK);
    EXPECT(fp4rl_context_set_rng_offset(ctx, 9), FP4RL_OK);
    EXPECT(fp4rl_context_get_rng(ctx, &seed, &off), FP4RL_OK);
    ck_assert_uint_eq(seed, 42);
    ck_assert_uint_eq(off, 9);
    EXPECT(fp4rl_context_set_seed(ctx, 43), FP4RL_OK); /* resets the offset */
    EXPECT(fp4rl_context_get_rng(ctx, &seed, &off), FP4RL_OK);
    ck_assert_uint_eq(off, 0);
}
END_TEST

/* Data parallelism without a second process: argument checks, a plain context's rank, and the
 * build's answer (an id, or UNSUPPORTED without NCCL; DEVICE without a GPU). */
START_TEST(test_distributed_context)
{
    int rank = -1, world = -1;
    EXPECT(fp4rl_context_get_rank(ctx, &rank, &world), FP4RL_OK);
    ck_assert_int_eq(rank, 0);
    ck_assert_int_eq(world, 1);
    EXPECT(fp4rl_context_get_rank(ctx, NULL, NULL), FP4RL_OK);
    EXPECT(fp4rl_context_get_rank(NULL, &rank, &world), FP4RL_ERR_INVALID_ARGUMENT);

    unsigned char id[FP4RL_NCCL_UNIQUE_ID_BYTES + 8];
    memset(id, 0, sizeof id);
    EXPECT(fp4rl_nccl_unique_id(NULL, sizeof id), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_nccl_unique_id(id, FP4RL_NCCL_UNIQUE_ID_BYTES - 1), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "FP4RL_NCCL_UNIQUE_ID_BYTES"));
    const fp4rl_status have = fp4rl_nccl_unique_id(id, sizeof id);
    ck_assert_msg(have == FP4RL_OK || have == FP4RL_ERR_UNSUPPORTED, "%s", fp4rl_last_error());
    if (have == FP4RL_ERR_UNSUPPORTED) ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "NCCL"));

    fp4rl_context *c = NULL;
    EXPECT(fp4rl_context_create_distributed(NULL, 0, 0, 1, id, sizeof id), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_context_create_distributed(&c, -1, 0, 1, id, sizeof id), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_context_create_distributed(&c, 0, 2, 2, id, sizeof id), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "rank 2 is outside"));
    EXPECT(fp4rl_context_create_distributed(&c, 0, -1, 2, id, sizeof id), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_context_create_distributed(&c, 0, 0, 0, id, sizeof id), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "world_size"));
    EXPECT(fp4rl_context_create_distributed(&c, 0, 0, 1, NULL, sizeof id), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "id_bytes is NULL"));
    EXPECT(fp4rl_context_create_distributed(&c, 0, 0, 1, id, 16), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(c);
    /* valid arguments: a context on a GPU machine with NCCL; else why not */
    const fp4rl_status st = fp4rl_context_create_distributed(&c, 0, 0, 1, id, sizeof id);
    if (have == FP4RL_ERR_UNSUPPORTED) {
        ck_assert_int_eq(st, FP4RL_ERR_UNSUPPORTED);
    } else if (st == FP4RL_OK) {
        EXPECT(fp4rl_context_get_rank(c, &rank, &world), FP4RL_OK);
        ck_assert_int_eq(rank, 0);
        ck_assert_int_eq(world, 1);
        ck_assert_int_eq(fp4rl_context_device(c), FP4RL_DEVICE_CUDA);
        fp4rl_context_destroy(c);
    } else {
        ck_assert_msg(st == FP4RL_ERR_DEVICE, "%s: %s", fp4rl_status_name(st), fp4rl_last_error());
        ck_assert_ptr_null(c);
    }
}
END_TEST

START_TEST(test_tensor_errors)
{
    fp4rl_tensor *t = NULL;
    float x[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {2, 3};
    EXPECT(fp4rl_tensor_from_host(NULL, ctx, FP4RL_DTYPE_F32, 2, shape, x), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_from_host(&t, NULL, FP4RL_DTYPE_F32, 2, shape, x), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 2, NULL, x), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 2, shape, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 0, shape, x), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, FP4RL_MAX_DIMS + 1, shape, x), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_HIF4, 2, shape, x), FP4RL_ERR_DTYPE);
    EXPECT(fp4rl_tensor_from_host(&t, ctx, (fp4rl_dtype)77, 2, shape, x), FP4RL_ERR_DTYPE);
    int64_t zero[2] = {2, 0}, neg[2] = {-1, 3}, huge[3] = {INT64_C(1) << 40, INT64_C(1) << 40, 4};
    EXPECT(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 2, zero, x), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 2, neg, x), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_tensor_zeros(&t, ctx, FP4RL_DTYPE_F32, 3, huge), FP4RL_ERR_SHAPE);
    int64_t big[1] = {INT64_MAX / 2};
    EXPECT(fp4rl_tensor_zeros(&t, ctx, FP4RL_DTYPE_BF16, 1, big), FP4RL_ERR_SHAPE);
    ck_assert_ptr_null(t);

    EXPECT(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 2, shape, x), FP4RL_OK);
    float y[6];
    EXPECT(fp4rl_tensor_to_host(NULL, y, sizeof y), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_to_host(t, NULL, sizeof y), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_to_host(t, y, sizeof y - 1), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_tensor_to_host(t, y, sizeof y), FP4RL_OK);
    ck_assert_mem_eq(x, y, sizeof y);
    ck_assert_int_eq(fp4rl_tensor_dtype(t), FP4RL_DTYPE_F32);
    ck_assert_int_eq(fp4rl_tensor_ndim(t), 2);
    ck_assert_int_eq(fp4rl_tensor_dim(t, 1), 3);
    ck_assert_int_eq(fp4rl_tensor_dim(t, 2), 0);
    ck_assert_int_eq(fp4rl_tensor_dim(t, -1), 0);
    ck_assert_int_eq(fp4rl_tensor_numel(t), 6);
    ck_assert_uint_eq(fp4rl_tensor_nbytes(t), 24);
    ck_assert_ptr_eq(fp4rl_tensor_context(t), ctx);
    ck_assert_int_eq(fp4rl_tensor_ndim(NULL), 0);
    ck_assert_int_eq(fp4rl_tensor_numel(NULL), 0);
    EXPECT(fp4rl_tensor_quant_info(t, NULL, NULL, NULL, NULL), FP4RL_ERR_DTYPE);
    EXPECT(fp4rl_tensor_codes_to_host(t, y, sizeof y), FP4RL_ERR_DTYPE);
    fp4rl_tensor_destroy(t);
    fp4rl_tensor_destroy(NULL);

    fp4rl_tensor *z;
    EXPECT(fp4rl_tensor_zeros(&z, ctx, FP4RL_DTYPE_I32, 1, shape), FP4RL_OK);
    int32_t zi[2] = {5, 5};
    EXPECT(fp4rl_tensor_to_host(z, zi, sizeof zi), FP4RL_OK);
    ck_assert_int_eq(zi[0] | zi[1], 0);
    fp4rl_tensor_destroy(z);
}
END_TEST

START_TEST(test_policy)
{
    fp4rl_quant_policy *p;
    int64_t v;
    EXPECT(fp4rl_quant_policy_create(NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_policy_create(&p), FP4RL_OK);
    /* defaults: 1D, OCP floor, nearest */
    const fp4rl_qparam zero_params[] = {FP4RL_QP_TILE_WEIGHT, FP4RL_QP_TILE_ACTIVATION, FP4RL_QP_TILE_GRADIENT,
                                        FP4RL_QP_SCALE_RULE, FP4RL_QP_ROUNDING_WEIGHT, FP4RL_QP_ROUNDING_ACTIVATION,
                                        FP4RL_QP_ROUNDING_GRADIENT};
    for (size_t i = 0; i < sizeof zero_params / sizeof zero_params[0]; i++) {
        EXPECT(fp4rl_quant_policy_get(p, zero_params[i], &v), FP4RL_OK);
        ck_assert_int_eq(v, 0);
    }
    /* every parameter reads back what was set */
    const struct { fp4rl_qparam k; int64_t v; } sets[] = {
        {FP4RL_QP_TILE_WEIGHT, 32}, {FP4RL_QP_TILE_ACTIVATION, 16}, {FP4RL_QP_TILE_GRADIENT, 64},
        {FP4RL_QP_SCALE_RULE, FP4RL_SCALE_TRUNCATION_FREE}, {FP4RL_QP_ROUNDING_WEIGHT, 1},
        {FP4RL_QP_ROUNDING_ACTIVATION, 1}, {FP4RL_QP_ROUNDING_GRADIENT, 1}, {FP4RL_QP_SEED, 1234},
        {FP4RL_QP_FORMAT_WEIGHT, FP4RL_DTYPE_NVFP4}, {FP4RL_QP_FORMAT_ACTIVATION, FP4RL_DTYPE_MXFP8_E4M3},
        {FP4RL_QP_FORMAT_GRADIENT, FP4RL_DTYPE_HIF4}, {FP4RL_QP_FORMAT_QK, FP4RL_DTYPE_MXFP8_E4M3},
        {FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_BF16}, {FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_W16A4},
        {FP4RL_QP_RESQ, FP4RL_RESQ_BLOCK_50},
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        EXPECT(fp4rl_quant_policy_set(p, sets[i].k, sets[i].v), FP4RL_OK);
        EXPECT(fp4rl_quant_policy_get(p, sets[i].k, &v), FP4RL_OK);
        ck_assert_int_eq(v, sets[i].v);
    }
    /* out of range: the message names the parameter; the value is kept */
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, 48), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "tile_weight"));
    EXPECT(fp4rl_quant_policy_get(p, FP4RL_QP_TILE_WEIGHT, &v), FP4RL_OK);
    ck_assert_int_eq(v, 32);
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_SCALE_RULE, 2), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "scale_rule"));
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_ROUNDING_GRADIENT, -1), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_SEED, -2), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_WEIGHT, FP4RL_DTYPE_F32), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_FP4), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_RESQ, 5), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_policy_set(p, (fp4rl_qparam)99, 0), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_policy_get(p, (fp4rl_qparam)-1, &v), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_policy_get(p, FP4RL_QP_SEED, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_policy_set(NULL, FP4RL_QP_SEED, 0), FP4RL_ERR_INVALID_ARGUMENT);
    /* HiF4 takes only 64x64 tiles: the gradient role's format is HiF4 and its tile 64 */
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_GRADIENT, 32), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "hif4"));
    /* FORMAT_QK is quantized with every role's tile: refused at the setter when a tile does not fit,
     * with both parameters named, whichever of the two is set last */
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_QK, FP4RL_DTYPE_HIF4), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "format_qk"));
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "tile_weight = 32"));
    EXPECT(fp4rl_quant_policy_get(p, FP4RL_QP_FORMAT_QK, &v), FP4RL_OK);
    ck_assert_int_eq(v, FP4RL_DTYPE_MXFP8_E4M3); /* a refused set changes nothing */
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, 64), FP4RL_OK);
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_ACTIVATION, 64), FP4RL_OK);
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_FORMAT_QK, FP4RL_DTYPE_HIF4), FP4RL_OK);
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, 32), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "tile_weight = 32"));
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "format_qk = hif4"));
    EXPECT(fp4rl_quant_policy_get(p, FP4RL_QP_TILE_WEIGHT, &v), FP4RL_OK);
    ck_assert_int_eq(v, 64);

    /* presets */
    EXPECT(fp4rl_quant_policy_apply_preset(p, FP4RL_PRESET_STABLE_2D_MXFP4), FP4RL_OK);
    EXPECT(fp4rl_quant_policy_get(p, FP4RL_QP_TILE_WEIGHT, &v), FP4RL_OK);
    ck_assert_int_eq(v, 32);
    EXPECT(fp4rl_quant_policy_get(p, FP4RL_QP_SCALE_RULE, &v), FP4RL_OK);
    ck_assert_int_eq(v, FP4RL_SCALE_TRUNCATION_FREE);
    EXPECT(fp4rl_quant_policy_get(p, FP4RL_QP_ROUNDING_GRADIENT, &v), FP4RL_OK);
    ck_assert_int_eq(v, FP4RL_ROUND_STOCHASTIC);
    EXPECT(fp4rl_quant_policy_get(p, FP4RL_QP_FORMAT_QK, &v), FP4RL_OK);
    ck_assert_int_eq(v, FP4RL_DTYPE_MXFP8_E4M3);
    EXPECT(fp4rl_quant_policy_apply_preset(p, FP4RL_PRESET_HIF4_RL), FP4RL_OK);
    EXPECT(fp4rl_quant_policy_get(p, FP4RL_QP_FORMAT_ACTIVATION, &v), FP4RL_OK);
    ck_assert_int_eq(v, FP4RL_DTYPE_HIF4);
    EXPECT(fp4rl_quant_policy_get(p, FP4RL_QP_RESQ, &v), FP4RL_OK);
    ck_assert_int_eq(v, FP4RL_RESQ_2_4);
    EXPECT(fp4rl_quant_policy_apply_preset(p, (fp4rl_preset)9), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_policy_apply_preset(NULL, FP4RL_PRESET_DEFAULT), FP4RL_ERR_INVALID_ARGUMENT);
    fp4rl_quant_policy_destroy(p);
    fp4rl_quant_policy_destroy(NULL);
}
END_TEST

START_TEST(test_quantize_errors)
{
    fp4rl_tensor *src = f32_tensor(4, 40, 0.5f), *q = NULL, *o = NULL;
    fp4rl_quant_policy *p;
    fp4rl_quant_policy_create(&p);
    EXPECT(fp4rl_quantize(NULL, ctx, src, FP4RL_DTYPE_MXFP4, p, FP4RL_ROLE_WEIGHT), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quantize(&q, NULL, src, FP4RL_DTYPE_MXFP4, p, FP4RL_ROLE_WEIGHT), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quantize(&q, ctx, NULL, FP4RL_DTYPE_MXFP4, p, FP4RL_ROLE_WEIGHT), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quantize(&q, ctx, src, FP4RL_DTYPE_BF16, p, FP4RL_ROLE_WEIGHT), FP4RL_ERR_DTYPE);
    EXPECT(fp4rl_quantize(&q, ctx, src, FP4RL_DTYPE_MXFP4, p, (fp4rl_role)5), FP4RL_ERR_INVALID_ARGUMENT);
    /* a tile the format cannot take: MXFP4 policy with 32x32 weight tiles, asked for HiF4 */
    EXPECT(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, 32), FP4RL_OK);
    EXPECT(fp4rl_quantize(&q, ctx, src, FP4RL_DTYPE_HIF4, p, FP4RL_ROLE_WEIGHT), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "tile_weight"));
    ck_assert_ptr_null(q);
    /* an I32 source */
    int32_t iv[4] = {1, 2, 3, 4};
    int64_t s1[1] = {4};
    fp4rl_tensor *ti;
    EXPECT(fp4rl_tensor_from_host(&ti, ctx, FP4RL_DTYPE_I32, 1, s1, iv), FP4RL_OK);
    EXPECT(fp4rl_quantize(&q, ctx, ti, FP4RL_DTYPE_MXFP4, NULL, FP4RL_ROLE_WEIGHT), FP4RL_ERR_DTYPE);
    /* a NULL policy means the defaults */
    EXPECT(fp4rl_quantize(&q, ctx, src, FP4RL_DTYPE_MXFP4, NULL, FP4RL_ROLE_WEIGHT), FP4RL_OK);
    int tile = -1;
    size_t cb = 0, sb = 0;
    float g = 0;
    EXPECT(fp4rl_tensor_quant_info(q, &tile, &cb, &sb, &g), FP4RL_OK);
    ck_assert_int_eq(tile, 0);
    ck_assert_uint_eq(cb, 4 * 20);
    ck_assert_uint_eq(sb, 4 * 2);
    ck_assert_float_eq(g, 1.0f);
    ck_assert_uint_eq(fp4rl_tensor_nbytes(q), 88);

    /* dequantize */
    EXPECT(fp4rl_dequantize(NULL, ctx, q, FP4RL_DTYPE_F32), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_dequantize(&o, ctx, NULL, FP4RL_DTYPE_F32), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_dequantize(&o, ctx, src, FP4RL_DTYPE_F32), FP4RL_ERR_DTYPE);
    EXPECT(fp4rl_dequantize(&o, ctx, q, FP4RL_DTYPE_I32), FP4RL_ERR_DTYPE);
    EXPECT(fp4rl_dequantize(&o, ctx, q, FP4RL_DTYPE_MXFP4), FP4RL_ERR_DTYPE);
    /* transpose */
    EXPECT(fp4rl_tensor_transpose(NULL, ctx, q), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_transpose(&o, ctx, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_transpose(&o, ctx, q), FP4RL_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "1D"));
    EXPECT(fp4rl_tensor_transpose(&o, ctx, ti), FP4RL_ERR_SHAPE);
    ck_assert_ptr_null(o);
    /* tensors of another context */
    fp4rl_context *other;
    fp4rl_context_create(&other, FP4RL_DEVICE_CPU, 0);
    EXPECT(fp4rl_quantize(&q, other, src, FP4RL_DTYPE_MXFP4, NULL, FP4RL_ROLE_WEIGHT), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_dequantize(&o, other, q, FP4RL_DTYPE_F32), FP4RL_ERR_INVALID_ARGUMENT);
    fp4rl_context_destroy(other);
    /* quant_error */
    double mse;
    EXPECT(fp4rl_quant_error(NULL, q, &mse, NULL, NULL, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_error(src, NULL, &mse, NULL, NULL, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_quant_error(q, q, &mse, NULL, NULL, NULL), FP4RL_ERR_DTYPE);
    EXPECT(fp4rl_quant_error(src, src, &mse, NULL, NULL, NULL), FP4RL_ERR_DTYPE);
    fp4rl_tensor *src2 = f32_tensor(4, 41, 1.0f);
    EXPECT(fp4rl_quant_error(src2, q, &mse, NULL, NULL, NULL), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_quant_error(src, q, &mse, NULL, NULL, NULL), FP4RL_OK);
    ck_assert(mse >= 0 && mse < 0.1);
    fp4rl_tensor_destroy(src2);
    fp4rl_tensor_destroy(ti);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(src);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

START_TEST(test_matmul_errors)
{
    fp4rl_tensor *a = f32_tensor(64, 96, 1), *b = f32_tensor(32, 80, 1), *b2 = f32_tensor(32, 96, 1), *c = NULL, *c3;
    int64_t cs[2] = {64, 32}, cbad[2] = {64, 31};
    ck_assert_int_eq(fp4rl_tensor_zeros(&c, ctx, FP4RL_DTYPE_F32, 2, cs), FP4RL_OK);
    EXPECT(fp4rl_matmul(c, ctx, a, b), FP4RL_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "A is [64, 96] and B is [32, 80]"));
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "96 vs 80"));
    EXPECT(fp4rl_matmul(NULL, ctx, a, b2), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_matmul(c, NULL, a, b2), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_matmul(c, ctx, NULL, b2), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_matmul(c, ctx, a, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_tensor_zeros(&c3, ctx, FP4RL_DTYPE_F32, 2, cbad), FP4RL_OK);
    EXPECT(fp4rl_matmul(c3, ctx, a, b2), FP4RL_ERR_SHAPE);
    fp4rl_tensor_destroy(c3);
    ck_assert_int_eq(fp4rl_tensor_zeros(&c3, ctx, FP4RL_DTYPE_I32, 2, cs), FP4RL_OK);
    EXPECT(fp4rl_matmul(c3, ctx, a, b2), FP4RL_ERR_DTYPE);
    EXPECT(fp4rl_matmul(c, ctx, a, c3), FP4RL_ERR_DTYPE);
    fp4rl_tensor_destroy(c3);
    int64_t s3[3] = {2, 32, 96};
    ck_assert_int_eq(fp4rl_tensor_zeros(&c3, ctx, FP4RL_DTYPE_F32, 3, s3), FP4RL_OK);
    EXPECT(fp4rl_matmul(c, ctx, c3, b2), FP4RL_ERR_SHAPE);
    fp4rl_tensor_destroy(c3);
    EXPECT(fp4rl_matmul(c, ctx, a, b2), FP4RL_OK);
    float out[64 * 32];
    EXPECT(fp4rl_tensor_to_host(c, out, sizeof out), FP4RL_OK);
    ck_assert(isfinite(out[0]) && out[0] != 0.0f);
    fp4rl_tensor_destroy(a);
    fp4rl_tensor_destroy(b);
    fp4rl_tensor_destroy(b2);
    fp4rl_tensor_destroy(c);
}
END_TEST

START_TEST(test_import_export)
{
    fp4rl_tensor *src = f32_tensor(3, 65, 0.25f), *q, *r, *dq, *dr;
    fp4rl_quant_policy *p;
    fp4rl_quant_policy_create(&p);
    const fp4rl_dtype fmts[] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};
    for (size_t k = 0; k < 4; k++) {
        EXPECT(fp4rl_quantize(&q, ctx, src, fmts[k], p, FP4RL_ROLE_ACTIVATION), FP4RL_OK);
        size_t cb, sb;
        float g;
        int tile;
        EXPECT(fp4rl_tensor_quant_info(q, &tile, &cb, &sb, &g), FP4RL_OK);
        uint8_t *codes = malloc(cb), *scales = malloc(sb);
        EXPECT(fp4rl_tensor_codes_to_host(q, codes, cb - 1), FP4RL_ERR_SHAPE);
        EXPECT(fp4rl_tensor_codes_to_host(q, codes, cb), FP4RL_OK);
        EXPECT(fp4rl_tensor_scales_to_host(q, scales, sb), FP4RL_OK);
        int64_t shape[2] = {3, 65};
        EXPECT(fp4rl_tensor_import_quantized(&r, ctx, fmts[k], 2, shape, tile, codes, cb - 1, scales, sb, g), FP4RL_ERR_SHAPE);
        EXPECT(fp4rl_tensor_import_quantized(&r, ctx, fmts[k], 2, shape, 48, codes, cb, scales, sb, g), FP4RL_ERR_INVALID_ARGUMENT);
        EXPECT(fp4rl_tensor_import_quantized(&r, ctx, FP4RL_DTYPE_F32, 2, shape, 0, codes, cb, scales, sb, g), FP4RL_ERR_DTYPE);
        EXPECT(fp4rl_tensor_import_quantized(&r, ctx, fmts[k], 2, shape, tile, NULL, cb, scales, sb, g), FP4RL_ERR_INVALID_ARGUMENT);
        EXPECT(fp4rl_tensor_import_quantized(&r, ctx, fmts[k], 2, shape, tile, codes, cb, scales, sb, -1.0f), FP4RL_ERR_CORRUPT);
        if (fmts[k] != FP4RL_DTYPE_MXFP8_E4M3) { /* 65 columns: the last byte of a row has a padding nibble */
            codes[cb - 1] |= 0x30;
            EXPECT(fp4rl_tensor_import_quantized(&r, ctx, fmts[k], 2, shape, tile, codes, cb, scales, sb, g), FP4RL_ERR_CORRUPT);
            codes[cb - 1] &= 0x0f;
        }
        EXPECT(fp4rl_tensor_import_quantized(&r, ctx, fmts[k], 2, shape, tile, codes, cb, scales, sb, g), FP4RL_OK);
        EXPECT(fp4rl_dequantize(&dq, ctx, q, FP4RL_DTYPE_F32), FP4RL_OK);
        EXPECT(fp4rl_dequantize(&dr, ctx, r, FP4RL_DTYPE_F32), FP4RL_OK);
        float a[195], b[195];
        fp4rl_tensor_to_host(dq, a, sizeof a);
        fp4rl_tensor_to_host(dr, b, sizeof b);
        ck_assert_mem_eq(a, b, sizeof a);
        fp4rl_tensor_destroy(dq);
        fp4rl_tensor_destroy(dr);
        fp4rl_tensor_destroy(r);
        fp4rl_tensor_destroy(q);
        free(codes);
        free(scales);
    }
    fp4rl_quant_policy_destroy(p);
    fp4rl_tensor_destroy(src);
}
END_TEST

/* The message is per thread: a failure here does not leak into a fresh thread. */
#include <pthread.h>
static void *thread_msg(void *arg)
{
    (void)arg;
    return (void *)(uintptr_t)(fp4rl_last_error()[0] == 0);
}
START_TEST(test_thread_local_error)
{
    EXPECT(fp4rl_context_set_seed(NULL, 1), FP4RL_ERR_INVALID_ARGUMENT);
    pthread_t th;
    void *ret;
    ck_assert_int_eq(pthread_create(&th, NULL, thread_msg, NULL), 0);
    pthread_join(th, &ret);
    ck_assert_int_eq((int)(uintptr_t)ret, 1);
    ck_assert(fp4rl_last_error()[0] != 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("api");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_version_and_names);
    tcase_add_test(tc, test_context_errors);
    tcase_add_test(tc, test_distributed_context);
    tcase_add_test(tc, test_tensor_errors);
    tcase_add_test(tc, test_policy);
    tcase_add_test(tc, test_quantize_errors);
    tcase_add_test(tc, test_matmul_errors);
    tcase_add_test(tc, test_import_export);
    tcase_add_test(tc, test_thread_local_error);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
