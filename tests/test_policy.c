/*
 * test_policy.c - the quantization policy is valid as a whole after every call
 * (fp4rl_quant_policy_set, fp4rl.h): each refused tile / format / FORMAT_QK combination is
 * refused at the setter whichever member is set last, names both parameters, and changes
 * nothing; every valid combination is reached in the order the header states; the presets are
 * valid; and a random walk of sets never leaves an invalid policy behind.
 *
 * The rule is written here again, independently of the library: HiF4 takes tiles 0 and 64, the
 * other formats 0, 16, 32 and 64.
 */
#include "check_run.h"
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <fp4rl/fp4rl.h>

static const int64_t FORMATS[4] = {FP4RL_DTYPE_MXFP4, FP4RL_DTYPE_NVFP4, FP4RL_DTYPE_HIF4, FP4RL_DTYPE_MXFP8_E4M3};
static const int64_t TILES[4] = {0, 16, 32, 64};

static int fits(int64_t format, int64_t tile)
{
    if (format == FP4RL_DTYPE_HIF4) return tile == 0 || tile == 64;
    return tile == 0 || tile == 16 || tile == 32 || tile == 64;
}

static void get_all(const fp4rl_quant_policy *p, int64_t v[FP4RL_QP_COUNT])
{
    for (int i = 0; i < FP4RL_QP_COUNT; i++) ck_assert_int_eq(fp4rl_quant_policy_get(p, (fp4rl_qparam)i, &v[i]), FP4RL_OK);
}

/* The policy as a whole obeys the rule. */
static int valid(const int64_t v[FP4RL_QP_COUNT])
{
    for (int r = 0; r < 3; r++) {
        if (!fits(v[FP4RL_QP_FORMAT_WEIGHT + r], v[FP4RL_QP_TILE_WEIGHT + r])) return 0;
        if (v[FP4RL_QP_FORMAT_QK] >= 0 && !fits(v[FP4RL_QP_FORMAT_QK], v[FP4RL_QP_TILE_WEIGHT + r])) return 0;
    }
    return 1;
}

static int has(const char *needle) { return strstr(fp4rl_last_error(), needle) != NULL; }

/* Sets (param, value), expecting a refusal that names `other` and changes nothing. */
static void refused(fp4rl_quant_policy *p, fp4rl_qparam param, int64_t value, fp4rl_qparam other)
{
    int64_t before[FP4RL_QP_COUNT], after[FP4RL_QP_COUNT];
    get_all(p, before);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, param, value), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_msg(has(fp4rl_qparam_name(param)) && has(fp4rl_qparam_name(other)), "%s = %lld: message \"%s\" should name %s and %s",
                  fp4rl_qparam_name(param), (long long)value, fp4rl_last_error(), fp4rl_qparam_name(param), fp4rl_qparam_name(other));
    /* it says which to set first: the other member of the pair */
    char first[64];
    snprintf(first, sizeof first, "set %s first", fp4rl_qparam_name(other));
    ck_assert_msg(has(first), "\"%s\" should say \"%s\"", fp4rl_last_error(), first);
    get_all(p, after);
    ck_assert_msg(memcmp(before, after, sizeof before) == 0, "a refused set of %s changed the policy", fp4rl_qparam_name(param));
}

static void set_ok(fp4rl_quant_policy *p, fp4rl_qparam param, int64_t value)
{
    ck_assert_msg(fp4rl_quant_policy_set(p, param, value) == FP4RL_OK, "%s = %lld: %s", fp4rl_qparam_name(param), (long long)value,
                  fp4rl_last_error());
    int64_t v;
    ck_assert_int_eq(fp4rl_quant_policy_get(p, param, &v), FP4RL_OK);
    ck_assert_int_eq(v, value);
}

/* Every (format, tile) of every role from the defaults: a valid pair is reached in both orders, an
 * invalid one refused in both, naming the other member, with the policy unchanged. */
START_TEST(test_role_pairs_both_orders)
{
    for (int r = 0; r < 3; r++)
        for (int f = 0; f < 4; f++)
            for (int t = 0; t < 4; t++) {
                const fp4rl_qparam fp = (fp4rl_qparam)(FP4RL_QP_FORMAT_WEIGHT + r), tp = (fp4rl_qparam)(FP4RL_QP_TILE_WEIGHT + r);
                for (int order = 0; order < 2; order++) {
                    fp4rl_quant_policy *p;
                    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
                    if (fits(FORMATS[f], TILES[t])) {
                        if (order) set_ok(p, tp, TILES[t]), set_ok(p, fp, FORMATS[f]);
                        else set_ok(p, fp, FORMATS[f]), set_ok(p, tp, TILES[t]);
                    } else if (order) { /* the tile (fits the default MXFP4), then the format */
                        set_ok(p, tp, TILES[t]);
                        refused(p, fp, FORMATS[f], tp);
                    } else {
                        set_ok(p, fp, FORMATS[f]);
                        refused(p, tp, TILES[t], fp);
                    }
                    int64_t v[FP4RL_QP_COUNT];
                    get_all(p, v);
                    ck_assert(valid(v));
                    fp4rl_quant_policy_destroy(p);
                }
            }
}
END_TEST

/* The two transitions where the order matters, as the header states them. */
START_TEST(test_order_between_pairs)
{
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    /* MXFP4 in 32 x 32 tiles -> HiF4 in 64 x 64: the format first is refused, the tile first works */
    set_ok(p, FP4RL_QP_TILE_WEIGHT, 32);
    refused(p, FP4RL_QP_FORMAT_WEIGHT, FP4RL_DTYPE_HIF4, FP4RL_QP_TILE_WEIGHT);
    set_ok(p, FP4RL_QP_TILE_WEIGHT, 64);
    set_ok(p, FP4RL_QP_FORMAT_WEIGHT, FP4RL_DTYPE_HIF4);
    /* HiF4 in 1D blocks -> MXFP4 in 32 x 32: the tile first is refused, the format first works */
    set_ok(p, FP4RL_QP_TILE_WEIGHT, 0);
    refused(p, FP4RL_QP_TILE_WEIGHT, 32, FP4RL_QP_FORMAT_WEIGHT);
    set_ok(p, FP4RL_QP_FORMAT_WEIGHT, FP4RL_DTYPE_MXFP4);
    set_ok(p, FP4RL_QP_TILE_WEIGHT, 32);
    /* the refusal names the format's tiles */
    refused(p, FP4RL_QP_FORMAT_WEIGHT, FP4RL_DTYPE_HIF4, FP4RL_QP_TILE_WEIGHT);
    ck_assert(has("hif4") && has("0, 64"));
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* FORMAT_QK takes every role's tile: refused against any of the three, in both orders. */
START_TEST(test_format_qk)
{
    for (int f = 0; f < 4; f++)
        for (int r = 0; r < 3; r++)
            for (int t = 0; t < 4; t++) {
                const fp4rl_qparam tp = (fp4rl_qparam)(FP4RL_QP_TILE_WEIGHT + r);
                fp4rl_quant_policy *p;
                ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
                set_ok(p, tp, TILES[t]); /* the role's MXFP4 takes every tile */
                if (fits(FORMATS[f], TILES[t])) {
                    set_ok(p, FP4RL_QP_FORMAT_QK, FORMATS[f]);
                    set_ok(p, FP4RL_QP_FORMAT_QK, -1);
                    /* and the other order: QK first, then the tile */
                    set_ok(p, tp, 0);
                    set_ok(p, FP4RL_QP_FORMAT_QK, FORMATS[f]);
                    set_ok(p, tp, TILES[t]);
                } else {
                    refused(p, FP4RL_QP_FORMAT_QK, FORMATS[f], tp);
                    set_ok(p, tp, 0);
                    set_ok(p, FP4RL_QP_FORMAT_QK, FORMATS[f]);
                    refused(p, tp, TILES[t], FP4RL_QP_FORMAT_QK);
                    /* -1 (as the other linears) frees the tile again */
                    set_ok(p, FP4RL_QP_FORMAT_QK, -1);
                    set_ok(p, tp, TILES[t]);
                }
                fp4rl_quant_policy_destroy(p);
            }
}
END_TEST

/* Every preset is a valid policy: it obeys the rule, every parameter can be set again to its own
 * value, and it is reached from a new policy by setters in the order the header gives. */
START_TEST(test_presets_valid)
{
    const fp4rl_preset presets[3] = {FP4RL_PRESET_DEFAULT, FP4RL_PRESET_STABLE_2D_MXFP4, FP4RL_PRESET_HIF4_RL};
    for (int k = 0; k < 3; k++) {
        fp4rl_quant_policy *p, *q;
        ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
        ck_assert_int_eq(fp4rl_quant_policy_apply_preset(p, presets[k]), FP4RL_OK);
        int64_t v[FP4RL_QP_COUNT], w[FP4RL_QP_COUNT];
        get_all(p, v);
        ck_assert(valid(v));
        for (int i = 0; i < FP4RL_QP_COUNT; i++) set_ok(p, (fp4rl_qparam)i, v[i]);
        /* formats (tiles still 0), then everything else */
        ck_assert_int_eq(fp4rl_quant_policy_create(&q), FP4RL_OK);
        for (int i = FP4RL_QP_FORMAT_WEIGHT; i <= FP4RL_QP_FORMAT_QK; i++) set_ok(q, (fp4rl_qparam)i, v[i]);
        for (int i = 0; i < FP4RL_QP_COUNT; i++) set_ok(q, (fp4rl_qparam)i, v[i]);
        get_all(q, w);
        ck_assert(memcmp(v, w, sizeof v) == 0);
        fp4rl_quant_policy_destroy(q);
        fp4rl_quant_policy_destroy(p);
    }
    /* a preset also replaces an arbitrary valid policy whatever its tiles */
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    set_ok(p, FP4RL_QP_TILE_GRADIENT, 64);
    set_ok(p, FP4RL_QP_FORMAT_QK, FP4RL_DTYPE_HIF4);
    ck_assert_int_eq(fp4rl_quant_policy_apply_preset(p, FP4RL_PRESET_STABLE_2D_MXFP4), FP4RL_OK);
    int64_t v[FP4RL_QP_COUNT];
    get_all(p, v);
    ck_assert(valid(v));
    ck_assert_int_eq(v[FP4RL_QP_FORMAT_QK], FP4RL_DTYPE_MXFP8_E4M3);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* A random walk over the tiles and formats: every set is accepted exactly when the policy it
 * would give is valid, and a refused one changes nothing. */
START_TEST(test_random_walk)
{
    static const fp4rl_qparam params[7] = {FP4RL_QP_TILE_WEIGHT,      FP4RL_QP_TILE_ACTIVATION,   FP4RL_QP_TILE_GRADIENT,
                                           FP4RL_QP_FORMAT_WEIGHT,    FP4RL_QP_FORMAT_ACTIVATION, FP4RL_QP_FORMAT_GRADIENT,
                                           FP4RL_QP_FORMAT_QK};
    uint64_t s = 0x9E3779B97F4A7C15ull;
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    int accepted = 0, refusals = 0;
    for (int n = 0; n < 20000; n++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const fp4rl_qparam param = params[s % 7];
        const unsigned pick = (unsigned)(s >> 8) % 5;
        int64_t value = param <= FP4RL_QP_TILE_GRADIENT ? TILES[pick % 4] : pick == 4 && param == FP4RL_QP_FORMAT_QK ? -1 : FORMATS[pick % 4];
        int64_t before[FP4RL_QP_COUNT], after[FP4RL_QP_COUNT], want[FP4RL_QP_COUNT];
        get_all(p, before);
        memcpy(want, before, sizeof want);
        want[param] = value;
        const fp4rl_status st = fp4rl_quant_policy_set(p, param, value);
        get_all(p, after);
        ck_assert_int_eq(st == FP4RL_OK, valid(want));
        ck_assert(memcmp(after, st == FP4RL_OK ? want : before, sizeof after) == 0);
        ck_assert(valid(after));
        if (st) refusals++;
        else accepted++;
    }
    ck_assert(accepted > 1000 && refusals > 1000); /* the walk went both ways */
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* A policy that was refused nothing works end to end: a model with HiF4 and 64 x 64 weight tiles
 * quantizes its weights with the policy's tile (the late check it used to fail is gone for such
 * policies; a format the caller names still is checked at fp4rl_quantize). */
START_TEST(test_quantize_with_policy_formats)
{
    fp4rl_context *ctx;
    ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    set_ok(p, FP4RL_QP_TILE_WEIGHT, 64);
    set_ok(p, FP4RL_QP_FORMAT_WEIGHT, FP4RL_DTYPE_HIF4);
    float x[64 * 64];
    for (int i = 0; i < 64 * 64; i++) x[i] = (float)(i % 11) - 5.0f;
    const int64_t shape[2] = {64, 64};
    fp4rl_tensor *t, *q = NULL;
    ck_assert_int_eq(fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 2, shape, x), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quantize(&q, ctx, t, FP4RL_DTYPE_HIF4, p, FP4RL_ROLE_WEIGHT), FP4RL_OK);
    int tile = -1;
    ck_assert_int_eq(fp4rl_tensor_quant_info(q, &tile, NULL, NULL, NULL), FP4RL_OK);
    ck_assert_int_eq(tile, 64);
    fp4rl_tensor_destroy(q);
    q = NULL;
    /* the caller's own format that does not take the tile: refused there, naming the tile */
    set_ok(p, FP4RL_QP_FORMAT_WEIGHT, FP4RL_DTYPE_MXFP4);
    set_ok(p, FP4RL_QP_TILE_WEIGHT, 32);
    ck_assert_int_eq(fp4rl_quantize(&q, ctx, t, FP4RL_DTYPE_HIF4, p, FP4RL_ROLE_WEIGHT), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert(has("tile_weight = 32") && has("hif4") && has("0, 64"));
    ck_assert_ptr_null(q);
    fp4rl_tensor_destroy(t);
    fp4rl_quant_policy_destroy(p);
    fp4rl_context_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("policy");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_role_pairs_both_orders);
    tcase_add_test(tc, test_order_between_pairs);
    tcase_add_test(tc, test_format_qk);
    tcase_add_test(tc, test_presets_valid);
    tcase_add_test(tc, test_random_walk);
    tcase_add_test(tc, test_quantize_with_policy_formats);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
