/*
 * test_layer.c - one linear layer at the ABI (fp4rl_linear_*):
 *   - FP32 numerics: y, dx, dw, db equal a double-precision x w^T + b and its gradients (1e-6),
 *     and the gradients accumulate;
 *   - every training recipe (the presets, and a 2D-tile stochastic one): the layer's y and
 *     gradients are bit for bit those of an fp4rl model's own block linear on the same inputs
 *     from the same random stream, and quantized numerics do differ from FP32;
 *   - bad input (NULL, dtype, shapes, order, overlaps, another context) is an error that changes
 *     nothing.
 */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static fp4rl_context *ctx;
static void setup(void) { ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK); }
static void teardown(void) { fp4rl_context_destroy(ctx); }
#define OK(call) ck_assert_msg((call) == FP4RL_OK, "%s", fp4rl_last_error())

enum { N = 70, IN = 96, OUT = 40 };

static uint64_t rng = 88172645463325252ull;
static float urand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float *filled(int64_t n, float scale)
{
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = scale * urand();
    return p;
}
static fp4rl_tensor *wrap2(float *p, int64_t r, int64_t c)
{
    const int64_t shape[2] = {r, c};
    fp4rl_tensor *t;
    OK(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, shape, NULL, p, NULL, NULL));
    return t;
}
static fp4rl_tensor *wrap1(float *p, int64_t n)
{
    fp4rl_tensor *t;
    OK(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 1, &n, NULL, p, NULL, NULL));
    return t;
}
static double max_rel(const float *got, const double *want, int64_t n)
{
    double e = 0, d = 0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs(got[i] - want[i]));
        d = fmax(d, fabs(want[i]));
    }
    return e / (d > 0 ? d : 1);
}

START_TEST(test_fp32_equals_reference)
{
    fp4rl_quant_policy *p;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_FP32));
    fp4rl_linear *l;
    OK(fp4rl_linear_create(&l, ctx, p, 0));
    float *x = filled(N * IN, 1), *w = filled(OUT * IN, 0.2f), *b = filled(OUT, 1), *y = calloc(N * OUT, 4), *dy = filled(N * OUT, 1);
    float *dx = calloc(N * IN, 4), *dw = calloc(OUT * IN, 4), *db = calloc(OUT, 4);
    fp4rl_tensor *tx = wrap2(x, N, IN), *tw = wrap2(w, OUT, IN), *tb = wrap1(b, OUT), *ty = wrap2(y, N, OUT), *tdy = wrap2(dy, N, OUT);
    fp4rl_tensor *tdx = wrap2(dx, N, IN), *tdw = wrap2(dw, OUT, IN), *tdb = wrap1(db, OUT);
    OK(fp4rl_linear_forward(l, ty, tx, tw, tb));
    double *ry = calloc(N * OUT, 8), *rdx = calloc(N * IN, 8), *rdw = calloc(OUT * IN, 8), *rdb = calloc(OUT, 8);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OUT; o++) {
            double s = b[o];
            for (int i = 0; i < IN; i++) s += (double)x[n * IN + i] * w[o * IN + i];
            ry[n * OUT + o] = s;
            rdb[o] += 2.0 * dy[n * OUT + o]; /* two backward calls below: the gradients accumulate */
            for (int i = 0; i < IN; i++) {
                rdx[n * IN + i] += 2.0 * dy[n * OUT + o] * w[o * IN + i];
                rdw[o * IN + i] += 2.0 * dy[n * OUT + o] * x[n * IN + i];
            }
        }
    ck_assert_msg(max_rel(y, ry, N * OUT) < 1e-6, "y: %g", max_rel(y, ry, N * OUT));
    OK(fp4rl_linear_backward(l, tdx, tdw, tdb, tdy));
    OK(fp4rl_linear_backward(l, tdx, tdw, tdb, tdy));
    ck_assert_msg(max_rel(dx, rdx, N * IN) < 1e-6, "dx: %g", max_rel(dx, rdx, N * IN));
    ck_assert_msg(max_rel(dw, rdw, OUT * IN) < 1e-6, "dw: %g", max_rel(dw, rdw, OUT * IN));
    ck_assert_msg(max_rel(db, rdb, OUT) < 1e-6, "db: %g", max_rel(db, rdb, OUT));
    fp4rl_tensor *all[] = {tx, tw, tb, ty, tdy, tdx, tdw, tdb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) fp4rl_tensor_destroy(all[i]);
    free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw), free(db), free(ry), free(rdx), free(rdw), free(rdb);
    fp4rl_linear_destroy(l);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

static const char *CFG = "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 32, \"intermediate_size\": 64,"
                         " \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                         " \"max_position_embeddings\": 32}";

/* The layer against a model's own block linear, one recipe: the same y and gradients, bit for bit. */
static void recipe_case(const fp4rl_quant_policy *p, int is_qk, const char *name)
{
    float *x = filled(N * IN, 1), *w = filled(OUT * IN, 0.2f), *b = filled(OUT, 1), *dy = filled(N * OUT, 1e-3f);
    for (int i = 0; i < N * IN; i += 17) x[i] *= 30.0f; /* outliers: the quantization matters */
    float *y[2], *dx[2], *dw[2], *db[2];
    for (int k = 0; k < 2; k++) {
        y[k] = calloc(N * OUT, 4), dx[k] = calloc(N * IN, 4), dw[k] = calloc(OUT * IN, 4), db[k] = calloc(OUT, 4);
        ctx->rng_offset = 40; /* the same random stream for both */
        if (k == 0) {
            fp4rl_linear *l;
            OK(fp4rl_linear_create(&l, ctx, p, is_qk));
            fp4rl_tensor *tx = wrap2(x, N, IN), *tw = wrap2(w, OUT, IN), *tb = wrap1(b, OUT), *ty = wrap2(y[k], N, OUT);
            fp4rl_tensor *tdy = wrap2(dy, N, OUT), *tdx = wrap2(dx[k], N, IN), *tdw = wrap2(dw[k], OUT, IN), *tdb = wrap1(db[k], OUT);
            OK(fp4rl_linear_forward(l, ty, tx, tw, tb));
            OK(fp4rl_linear_backward(l, tdx, tdw, tdb, tdy));
            fp4rl_tensor *all[] = {tx, tw, tb, ty, tdy, tdx, tdw, tdb};
            for (size_t i = 0; i < sizeof all / sizeof *all; i++) fp4rl_tensor_destroy(all[i]);
            fp4rl_linear_destroy(l);
        } else { /* the model's block linear, as core/model/block.c calls it */
            fp4rl_model *m;
            OK(fp4rl_model_create(&m, ctx, CFG, p, 1));
            ctx->rng_offset = 40;
            const fp4rl_linear_spec s = fp4rl_block_linear_spec(m, is_qk, 0);
            fp4rl_arena a = {.ctx = ctx}, t = {.ctx = ctx};
            fp4rl_linear_saved sv;
            OK(fp4rl_lin_forward(m, &a, &s, &sv, y[k], x, w, b, N, IN, OUT, NULL));
            OK(fp4rl_lin_backward(m, &t, &s, &sv, dx[k], dw[k], db[k], dy, x, w, N, IN, OUT));
            fp4rl_arena_free(&t);
            fp4rl_arena_free(&a);
            fp4rl_model_destroy(m);
        }
    }
    ck_assert_msg(!memcmp(y[0], y[1], N * OUT * 4), "%s: y differs from the model's linear", name);
    ck_assert_msg(!memcmp(dx[0], dx[1], N * IN * 4), "%s: dx differs", name);
    ck_assert_msg(!memcmp(dw[0], dw[1], OUT * IN * 4), "%s: dw differs", name);
    ck_assert_msg(!memcmp(db[0], db[1], OUT * 4), "%s: db differs", name);
    /* and the recipe's rounding happened: y is not the FP32 product */
    double e = 0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OUT; o++) {
            double r = b[o];
            for (int i = 0; i < IN; i++) r += (double)x[n * IN + i] * w[o * IN + i];
            e = fmax(e, fabs(y[0][n * OUT + o] - r));
        }
    ck_assert_msg(e > 1e-4, "%s: y equals the FP32 product (%g): no quantization", name, e);
    for (int k = 0; k < 2; k++) free(y[k]), free(dx[k]), free(dw[k]), free(db[k]);
    free(x), free(w), free(b), free(dy);
}

START_TEST(test_recipes_equal_model_linear)
{
    const fp4rl_preset presets[3] = {FP4RL_PRESET_DEFAULT, FP4RL_PRESET_STABLE_2D_MXFP4, FP4RL_PRESET_HIF4_RL};
    for (int i = 0; i < 3; i++)
        for (int qk = 0; qk < 2; qk++) {
            fp4rl_quant_policy *p;
            OK(fp4rl_quant_policy_create(&p));
            OK(fp4rl_quant_policy_apply_preset(p, presets[i]));
            recipe_case(p, qk, qk ? "preset q/k" : "preset");
            fp4rl_quant_policy_destroy(p);
        }
    /* BF16 numerics, and stochastic 2D activations (the forward draws) */
    fp4rl_quant_policy *p;
    OK(fp4rl_quant_policy_create(&p));
    OK(fp4rl_quant_policy_apply_preset(p, FP4RL_PRESET_STABLE_2D_MXFP4));
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_ROUNDING_ACTIVATION, FP4RL_ROUND_STOCHASTIC));
    recipe_case(p, 0, "2D stochastic activations");
    OK(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_BF16));
    recipe_case(p, 0, "BF16");
    fp4rl_quant_policy_destroy(p);
}
END_TEST

START_TEST(test_bad_input)
{
    fp4rl_linear *l = (fp4rl_linear *)1;
    ck_assert_int_eq(fp4rl_linear_create(NULL, ctx, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_linear_create(&l, NULL, NULL, 0), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(l);
    ck_assert_int_eq(fp4rl_linear_create(&l, ctx, NULL, 2), FP4RL_ERR_INVALID_ARGUMENT);
    OK(fp4rl_linear_create(&l, ctx, NULL, 0));
    float *x = filled(N * IN, 1), *w = filled(OUT * IN, 1), *y = calloc(N * OUT, 4), *dy = filled(N * OUT, 1);
    float *dx = calloc(N * IN, 4), *i32 = calloc(N * OUT, 4);
    fp4rl_tensor *tx = wrap2(x, N, IN), *tw = wrap2(w, OUT, IN), *ty = wrap2(y, N, OUT), *tdy = wrap2(dy, N, OUT), *tdx = wrap2(dx, N, IN);
    fp4rl_tensor *wt = wrap2(w, IN, OUT), *ybad = wrap2(y, N, OUT - 1), *yx = wrap2(x, N, OUT), *ti;
    const int64_t sh[2] = {N, OUT};
    OK(fp4rl_tensor_wrap(&ti, ctx, FP4RL_DTYPE_I32, 2, sh, NULL, i32, NULL, NULL));
    ck_assert_int_eq(fp4rl_linear_backward(l, tdx, NULL, NULL, tdy), FP4RL_ERR_INVALID_ARGUMENT); /* no forward yet */
    ck_assert_int_eq(fp4rl_linear_forward(NULL, ty, tx, tw, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_linear_forward(l, ty, NULL, tw, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_linear_forward(l, ty, tx, wt, NULL), FP4RL_ERR_SHAPE); /* w [IN, OUT] */
    ck_assert_int_eq(fp4rl_linear_forward(l, ybad, tx, tw, NULL), FP4RL_ERR_SHAPE);
    ck_assert_int_eq(fp4rl_linear_forward(l, ti, tx, tw, NULL), FP4RL_ERR_DTYPE);
    ck_assert_int_eq(fp4rl_linear_forward(l, yx, tx, tw, NULL), FP4RL_ERR_INVALID_ARGUMENT); /* y over x */
    ck_assert_int_eq(fp4rl_linear_forward(l, ty, tx, tw, tx), FP4RL_ERR_SHAPE);               /* b not [OUT] */
    for (int i = 0; i < N * OUT; i++) ck_assert(y[i] == 0.0f);                                 /* nothing written */
    fp4rl_context *other;
    OK(fp4rl_context_create(&other, FP4RL_DEVICE_CPU, 0));
    fp4rl_tensor *to;
    const int64_t shx[2] = {N, IN};
    OK(fp4rl_tensor_wrap(&to, other, FP4RL_DTYPE_F32, 2, shx, NULL, x, NULL, NULL));
    ck_assert_int_eq(fp4rl_linear_forward(l, ty, to, tw, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    OK(fp4rl_linear_forward(l, ty, tx, tw, NULL));
    ck_assert_int_eq(fp4rl_linear_backward(l, NULL, NULL, NULL, tdy), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_linear_backward(l, tdy, NULL, NULL, tdy), FP4RL_ERR_SHAPE); /* dx must be [N, IN] */
    ck_assert_int_eq(fp4rl_linear_backward(l, tdx, NULL, NULL, tx), FP4RL_ERR_SHAPE);  /* dy must be [N, OUT] */
    for (int i = 0; i < N * IN; i++) ck_assert(dx[i] == 0.0f);
    OK(fp4rl_linear_backward(l, tdx, NULL, NULL, tdy));
    fp4rl_linear_destroy(NULL);
    fp4rl_tensor *all[] = {tx, tw, ty, tdy, tdx, wt, ybad, yx, ti, to};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) fp4rl_tensor_destroy(all[i]);
    fp4rl_context_destroy(other);
    free(x), free(w), free(y), free(dy), free(dx), free(i32);
    fp4rl_linear_destroy(l);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("layer");
    TCase *tc = tcase_create("layer");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_fp32_equals_reference);
    tcase_add_test(tc, test_recipes_equal_model_linear);
    tcase_add_test(tc, test_bad_input);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
