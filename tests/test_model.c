/*
 * test_model.c - the Qwen2 model against HF transformers (fixtures made by
 * tests/fixtures/make_qwen2_fixtures.py with torch autograd), the FP4 linear's operands,
 * weights I/O and supervised training.
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "io/safetensors.h"

#include "fixtures_path.h"

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

static fp4rl_context *ctx;
static void setup(void) { ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK); }
static void teardown(void) { fp4rl_context_destroy(ctx); }

static fp4rl_quant_policy *policy_numerics(fp4rl_numerics n)
{
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, n), FP4RL_OK);
    return p;
}

static fp4rl_model *load_fixture(const char *name, const fp4rl_quant_policy *p)
{
    char path[512];
    FP4RL_FIXTURE(path, "qwen2/%s/config.json", name);
    char *cfg = read_text(path);
    fp4rl_model *m;
    ck_assert_msg(fp4rl_model_create(&m, ctx, cfg, p, 1) == FP4RL_OK, "%s", fp4rl_last_error());
    free(cfg);
    FP4RL_FIXTURE(path, "qwen2/%s/model.safetensors", name);
    ck_assert_msg(fp4rl_model_load(m, path) == FP4RL_OK, "%s", fp4rl_last_error());
    return m;
}

/* ||a - b|| / ||b|| */
static double rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void check_hf_parity(const char *name)
{
    fp4rl_quant_policy *p = policy_numerics(FP4RL_NUMERICS_FP32);
    fp4rl_model *m = load_fixture(name, p);
    char path[512];
    FP4RL_FIXTURE(path, "qwen2/%s/reference.safetensors", name);
    fp4rl_st *ref;
    ck_assert_int_eq(fp4rl_st_open_path(&ref, path), FP4RL_OK);
    const fp4rl_st_tensor *ids = fp4rl_st_find(ref, "input_ids"), *lens = fp4rl_st_find(ref, "lengths");
    ck_assert(ids && lens && ids->dtype == FP4RL_ST_I32);
    const int64_t B = ids->shape[0], T = ids->shape[1];
    int64_t V;
    fp4rl_model_get_info(m, FP4RL_MI_VOCAB_SIZE, &V);
    int32_t *tok = malloc((size_t)(B * T) * 4), len[16];
    memcpy(tok, ids->data, (size_t)(B * T) * 4);
    memcpy(len, lens->data, (size_t)B * 4);
    float *logits = malloc((size_t)(B * T * V) * 4), *want = malloc((size_t)(B * T * V) * 4);
    const int64_t lshape[3] = {B, T, V};
    ck_assert_int_eq(fp4rl_st_read_f32(ref, "logits", 3, lshape, want), FP4RL_OK);
    ck_assert_msg(fp4rl_model_logits(m, tok, len, B, T, logits, (size_t)(B * T * V) * 4) == FP4RL_OK, "%s", fp4rl_last_error());
    double e = rel_err(logits, want, B * T * V);
    ck_assert_msg(e <= 1e-4, "%s: logits relative error %.3g > 1e-4", name, e);
    printf("hf parity %s: logits rel. error %.3g (bound 1e-4)\n", name, e);

    double loss;
    float want_loss;
    const int64_t one = 1;
    ck_assert_int_eq(fp4rl_st_read_f32(ref, "loss", 1, &one, &want_loss), FP4RL_OK);
    ck_assert_msg(fp4rl_model_compute_gradients(m, tok, len, NULL, B, T, &loss) == FP4RL_OK, "%s", fp4rl_last_error());
    ck_assert_msg(fabs(loss - want_loss) <= 1e-5 * fabs(want_loss), "%s: loss %.7f vs HF %.7f", name, loss, want_loss);
    int grads = 0;
    for (size_t i = 0; i < fp4rl_st_count(ref); i++) {
        const fp4rl_st_tensor *t = fp4rl_st_at(ref, i);
        if (strncmp(t->name, "grad.", 5) != 0) continue;
        float *g = malloc((size_t)t->numel * 4), *w = malloc((size_t)t->numel * 4);
        ck_assert_int_eq(fp4rl_st_read_f32(ref, t->name, t->ndim, t->shape, w), FP4RL_OK);
        ck_assert_msg(fp4rl_model_get_grad(m, t->name + 5, g, (size_t)t->numel * 4) == FP4RL_OK, "%s", fp4rl_last_error());
        e = rel_err(g, w, t->numel);
        ck_assert_msg(e <= 1e-3, "%s: %s gradient relative error %.3g > 1e-3", name, t->name + 5, e);
        printf("hf parity %s: grad %s rel. error %.3g (bound 1e-3)\n", name, t->name + 5, e);
        free(g);
        free(w);
        grads++;
    }
    ck_assert_int_ge(grads, 5);
    fp4rl_st_close(ref);
    free(tok);
    free(logits);
    free(want);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}

START_TEST(test_hf_parity_gqa) { check_hf_parity("gqa"); }
END_TEST
START_TEST(test_hf_parity_tied) { check_hf_parity("tied"); }
END_TEST

/* ---- the FP4 linear: which operands its three GEMMs see ---- */
#define MAX_CALLS 64
typedef struct recorded { float *x, *w; int64_t nx, nw; } recorded;
static recorded fwd[MAX_CALLS], bwd[MAX_CALLS];
static int n_fwd, n_bwd;
static fp4rl_ops recording;

static float *copy_of(const float *p, int64_t n)
{
    float *c = malloc((size_t)n * sizeof(float));
    memcpy(c, p, (size_t)n * sizeof(float));
    return c;
}
static fp4rl_status rec_forward(fp4rl_context *c, float *y, const float *x, const float *w, const float *b, int64_t N,
                                int64_t IN, int64_t OUT)
{
    fwd[n_fwd++] = (recorded){copy_of(x, N * IN), copy_of(w, OUT * IN), N * IN, OUT * IN};
    return fp4rl_cpu_ops.linear_forward(c, y, x, w, b, N, IN, OUT);
}
static fp4rl_status rec_backward(fp4rl_context *c, float *dx, float *dw, float *db, const float *dy_dx, const float *w_dx,
                                 const float *dy_dw, const float *x_dw, const float *dy_db, int64_t N, int64_t IN, int64_t OUT)
{
    bwd[n_bwd++] = (recorded){copy_of(x_dw, N * IN), copy_of(w_dx, OUT * IN), N * IN, OUT * IN};
    return fp4rl_cpu_ops.linear_backward(c, dx, dw, db, dy_dx, w_dx, dy_dw, x_dw, dy_db, N, IN, OUT);
}

/* Counts the block linears (not the LM head) whose backward X and W differ from the forward's. */
static int count_mismatches(fp4rl_quant_policy *p)
{
    fp4rl_model *m = load_fixture("tied", p);
    recording = fp4rl_cpu_ops;
    recording.linear_forward = rec_forward;
    recording.linear_backward = rec_backward;
    /* the float forms only: the BF16 forms (taken when all operands are exactly BF16) receive the
     * same values, packed without rounding */
    recording.linear_forward_bf16 = NULL;
    recording.linear_backward_bf16 = NULL;
    m->ops = &recording;
    n_fwd = n_bwd = 0;
    int32_t tok[2 * 9] = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6, 2, 6}, len[2] = {9, 7};
    double loss;
    ck_assert_msg(fp4rl_model_compute_gradients(m, tok, len, NULL, 2, 9, &loss) == FP4RL_OK, "%s", fp4rl_last_error());
    /* forward: per layer q k v o gate up down, then the head; backward: head, then per layer
     * (last first) down gate up o q k v */
    const int per_layer_bwd_to_fwd[7] = {6, 4, 5, 3, 0, 1, 2};
    const int layers = (n_fwd - 1) / 7;
    ck_assert_int_eq(n_fwd, 7 * layers + 1);
    ck_assert_int_eq(n_bwd, n_fwd);
    int mismatches = 0;
    for (int l = 0; l < layers; l++)
        for (int j = 0; j < 7; j++) {
            const recorded *f = &fwd[l * 7 + per_layer_bwd_to_fwd[j]], *b = &bwd[1 + (layers - 1 - l) * 7 + j];
            ck_assert_int_eq(f->nx, b->nx);
            ck_assert_int_eq(f->nw, b->nw);
            mismatches += memcmp(f->x, b->x, (size_t)f->nx * 4) != 0;
            mismatches += memcmp(f->w, b->w, (size_t)f->nw * 4) != 0;
        }
    for (int i = 0; i < n_fwd; i++) {
        free(fwd[i].x); free(fwd[i].w); free(bwd[i].x); free(bwd[i].w);
    }
    fp4rl_model_destroy(m);
    return mismatches;
}

START_TEST(test_fp4_2d_operands_identical)
{
    fp4rl_quant_policy *p;
    ck_assert_int_eq(fp4rl_quant_policy_create(&p), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_apply_preset(p, FP4RL_PRESET_STABLE_2D_MXFP4), FP4RL_OK);
    ck_assert_int_eq(count_mismatches(p), 0);
    /* the same recipe with 1D blocks: backward re-quantizes along the other axis */
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_WEIGHT, 0), FP4RL_OK);
    ck_assert_int_eq(fp4rl_quant_policy_set(p, FP4RL_QP_TILE_ACTIVATION, 0), FP4RL_OK);
    ck_assert_int_gt(count_mismatches(p), 10);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* FP4 numerics stay close to FP32 on logits, and BF16 closer. */
START_TEST(test_numerics_modes)
{
    const fp4rl_numerics modes[3] = {FP4RL_NUMERICS_FP32, FP4RL_NUMERICS_BF16, FP4RL_NUMERICS_FP4};
    int32_t tok[9] = {3, 14, 15, 9, 26, 5, 35, 8, 9};
    float logits[3][9 * 96];
    for (int i = 0; i < 3; i++) {
        fp4rl_quant_policy *p = policy_numerics(modes[i]);
        fp4rl_quant_policy_apply_preset(p, FP4RL_PRESET_HIF4_RL);
        fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, modes[i]);
        fp4rl_model *m = load_fixture("gqa", p);
        ck_assert_int_eq(fp4rl_model_logits(m, tok, NULL, 1, 9, logits[i], sizeof logits[i]), FP4RL_OK);
        fp4rl_model_destroy(m);
        fp4rl_quant_policy_destroy(p);
    }
    double e_bf16 = rel_err(logits[1], logits[0], 9 * 96), e_fp4 = rel_err(logits[2], logits[0], 9 * 96);
    ck_assert_msg(e_bf16 > 0 && e_bf16 < 0.02, "bf16 logits error %.3g", e_bf16);
    ck_assert_msg(e_fp4 > e_bf16 && e_fp4 < 0.3, "fp4 logits error %.3g (bf16 %.3g)", e_fp4, e_bf16);
    printf("logits vs FP32: BF16 numerics %.3g, HiF4 FP4 numerics %.3g\n", e_bf16, e_fp4);
}
END_TEST

START_TEST(test_save_load_roundtrip)
{
    fp4rl_quant_policy *p = policy_numerics(FP4RL_NUMERICS_FP32);
    fp4rl_model *m = load_fixture("gqa", p), *m2;
    char dir[] = "/tmp/fp4rl_model_XXXXXX", path[600];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    ck_assert_msg(fp4rl_model_save(m, path, FP4RL_DTYPE_F32) == FP4RL_OK, "%s", fp4rl_last_error());
    char fx[600];
    FP4RL_FIXTURE(fx, "qwen2/gqa/config.json");
    char *cfg = read_text(fx);
    ck_assert_int_eq(fp4rl_model_create(&m2, ctx, cfg, p, 99), FP4RL_OK);
    ck_assert_int_eq(fp4rl_model_load(m2, path), FP4RL_OK);
    int32_t tok[5] = {1, 2, 3, 4, 5};
    float a[5 * 96], b[5 * 96];
    fp4rl_model_logits(m, tok, NULL, 1, 5, a, sizeof a);
    fp4rl_model_logits(m2, tok, NULL, 1, 5, b, sizeof b);
    ck_assert_mem_eq(a, b, sizeof a);
    /* errors: missing file, the wrong model's file names the tensor, bad dtype, bad names */
    ck_assert_int_eq(fp4rl_model_load(m2, "/nonexistent/w.safetensors"), FP4RL_ERR_IO);
    FP4RL_FIXTURE(fx, "qwen2/tied/model.safetensors");
    ck_assert_int_eq(fp4rl_model_load(m2, fx), FP4RL_ERR_CORRUPT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "model."));
    FP4RL_FIXTURE(fx, "qwen2/gqa/config.json");
    ck_assert_int_eq(fp4rl_model_load(m2, fx), FP4RL_ERR_CORRUPT);
    fp4rl_model_logits(m2, tok, NULL, 1, 5, b, sizeof b); /* a failed load changes nothing */
    ck_assert_mem_eq(a, b, sizeof a);
    ck_assert_int_eq(fp4rl_model_save(m, path, FP4RL_DTYPE_HIF4), FP4RL_ERR_DTYPE);
    float w[64];
    ck_assert_int_eq(fp4rl_model_get_param(m, "model.norm.weight", w, sizeof w), FP4RL_OK);
    ck_assert_int_eq(fp4rl_model_get_param(m, "model.norm.weight", w, sizeof w - 4), FP4RL_ERR_SHAPE);
    ck_assert_int_eq(fp4rl_model_get_param(m, "model.nope", w, sizeof w), FP4RL_ERR_INVALID_ARGUMENT);
    /* the parameter list: every name resolves, the shapes add up to the float count */
    int64_t n_tensors = 0, n_floats = 0, total = 0;
    ck_assert_int_eq(fp4rl_model_get_info(m, FP4RL_MI_NUM_TENSORS, &n_tensors), FP4RL_OK);
    ck_assert_int_eq(fp4rl_model_get_info(m, FP4RL_MI_NUM_PARAMETERS, &n_floats), FP4RL_OK);
    ck_assert_int_ge(n_tensors, 3);
    ck_assert_str_eq(fp4rl_model_param_name(m, 0), "model.embed_tokens.weight");
    for (int64_t i = 0; i < n_tensors; i++) {
        const char *name = fp4rl_model_param_name(m, (size_t)i);
        ck_assert_ptr_nonnull(name);
        int nd;
        int64_t dims[2];
        ck_assert_msg(fp4rl_model_param_shape(m, name, &nd, dims) == FP4RL_OK, "%s: %s", name, fp4rl_last_error());
        total += nd == 2 ? dims[0] * dims[1] : dims[0];
    }
    ck_assert_int_eq(total, n_floats);
    ck_assert_ptr_null(fp4rl_model_param_name(m, (size_t)n_tensors));
    ck_assert_ptr_null(fp4rl_model_param_name(NULL, 0));
    /* bad batches */
    int32_t bad[2] = {1, 1000}, blen[1] = {0};
    ck_assert_int_eq(fp4rl_model_logits(m, bad, NULL, 1, 2, a, sizeof a), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_model_logits(m, tok, blen, 1, 5, a, sizeof a), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_model_logits(m, tok, NULL, 1, 5, a, 10), FP4RL_ERR_SHAPE);
    ck_assert_int_eq(fp4rl_model_logits(m, tok, NULL, 0, 5, a, sizeof a), FP4RL_ERR_SHAPE);
    ck_assert_int_eq(fp4rl_model_create(&m2, ctx, "{\"model_type\": \"llama\"}", NULL, 0) != FP4RL_OK, 1);
    ck_assert_int_eq(fp4rl_model_create(&m2, ctx, "{not json", NULL, 0), FP4RL_ERR_CORRUPT);
    unlink(path);
    rmdir(dir);
    free(cfg);
    fp4rl_model_destroy(m2);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* Token log-probs agree with the logits' log-softmax. */
START_TEST(test_token_logprobs)
{
    fp4rl_quant_policy *p = policy_numerics(FP4RL_NUMERICS_FP32);
    fp4rl_model *m = load_fixture("gqa", p);
    int32_t tok[2 * 6] = {5, 9, 2, 7, 7, 1, 4, 4, 8, 0, 0, 0}, len[2] = {6, 3};
    float lp[12], lg[12 * 96];
    ck_assert_int_eq(fp4rl_model_token_logprobs(m, tok, len, 2, 6, lp, sizeof lp), FP4RL_OK);
    ck_assert_int_eq(fp4rl_model_logits(m, tok, len, 2, 6, lg, sizeof lg), FP4RL_OK);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 6; t++) {
            if (t == 0 || t >= len[b]) {
                ck_assert_float_eq(lp[b * 6 + t], 0.0f);
                continue;
            }
            const float *row = lg + (b * 6 + t - 1) * 96;
            double mx = -1e30, s = 0;
            for (int v = 0; v < 96; v++) mx = fmax(mx, row[v]);
            for (int v = 0; v < 96; v++) s += exp(row[v] - mx);
            double want = row[tok[b * 6 + t]] - mx - log(s);
            ck_assert_double_eq_tol(lp[b * 6 + t], want, 1e-5);
        }
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(p);
}
END_TEST

/* A short supervised run memorises a sequence, in BF16 and in both FP4 recipes. */
START_TEST(test_training_reduces_loss)
{
    const fp4rl_preset presets[3] = {FP4RL_PRESET_DEFAULT, FP4RL_PRESET_STABLE_2D_MXFP4, FP4RL_PRESET_HIF4_RL};
    for (int k = 0; k < 3; k++) {
        fp4rl_quant_policy *p;
        fp4rl_quant_policy_create(&p);
        fp4rl_quant_policy_apply_preset(p, presets[k]);
        if (k == 0) fp4rl_quant_policy_set(p, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_BF16);
        fp4rl_model *m = load_fixture("tied", p);
        fp4rl_model_set_hparam(m, FP4RL_MP_LR, 3e-3);
        fp4rl_model_set_hparam(m, FP4RL_MP_GRAD_CLIP, 1.0);
        int32_t tok[2 * 12];
        for (int i = 0; i < 24; i++) tok[i] = (i * 7 + 3) % 80;
        double first = 0, loss = 0, gn = 0;
        for (int s = 0; s < 30; s++) {
            ck_assert_msg(fp4rl_model_train_step(m, tok, NULL, NULL, 2, 12, &loss, &gn) == FP4RL_OK, "%s", fp4rl_last_error());
            if (s == 0) first = loss;
            ck_assert(isfinite(loss) && gn > 0);
        }
        ck_assert_msg(loss < 0.5 * first, "preset %d: loss %.4f -> %.4f", k, first, loss);
        printf("training preset %d: loss %.4f -> %.4f in 30 steps\n", k, first, loss);
        int64_t step;
        fp4rl_model_get_info(m, FP4RL_MI_STEP, &step);
        ck_assert_int_eq(step, 30);
        fp4rl_model_destroy(m);
        fp4rl_quant_policy_destroy(p);
    }
}
END_TEST

/* fp4rl_context_memory counts what the model and its steps hold, and returns to its baseline when
 * everything made on the context is destroyed. */
START_TEST(test_context_memory_baseline)
{
    size_t base, peak, res, used;
    ck_assert_int_eq(fp4rl_context_memory(ctx, &base, &peak, &res), FP4RL_OK);
    ck_assert(res == base && peak >= base);
    fp4rl_model *m = load_fixture("tied", NULL);
    int64_t numel;
    fp4rl_model_get_info(m, FP4RL_MI_NUM_PARAMETERS, &numel);
    ck_assert_int_eq(fp4rl_context_memory(ctx, &used, NULL, NULL), FP4RL_OK);
    /* the weights only: gradients are made by the first pass that needs them, the two AdamW
     * moments by the first update */
    ck_assert_msg(used >= base + (size_t)numel * sizeof(float), "in use %zu, %lld params", used, (long long)numel);
    ck_assert_msg(used < base + 2 * (size_t)numel * sizeof(float), "in use %zu before any update, %lld params", used, (long long)numel);
    int32_t tok[2 * 8];
    for (int i = 0; i < 16; i++) tok[i] = (i * 5 + 1) % 80;
    double loss, gn;
    ck_assert_msg(fp4rl_model_train_step(m, tok, NULL, NULL, 2, 8, &loss, &gn) == FP4RL_OK, "%s", fp4rl_last_error());
    size_t with_grads;
    ck_assert_int_eq(fp4rl_context_memory(ctx, &with_grads, NULL, NULL), FP4RL_OK);
    ck_assert_msg(with_grads >= used + 3 * (size_t)numel * sizeof(float), "in use %zu with gradients and moments, %zu before", with_grads, used);
    fp4rl_model_destroy(m);
    ck_assert_int_eq(fp4rl_context_memory(ctx, &used, &peak, &res), FP4RL_OK);
    ck_assert_msg(used == base, "in use %zu after destroy, baseline %zu", used, base);
    ck_assert(peak > base + 4 * (size_t)numel * sizeof(float) && res == used);
    ck_assert_int_eq(fp4rl_context_reset_peak_memory(ctx), FP4RL_OK);
    ck_assert_int_eq(fp4rl_context_memory(ctx, NULL, &peak, NULL), FP4RL_OK);
    ck_assert(peak == used);
    ck_assert_int_eq(fp4rl_context_memory(NULL, &used, NULL, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_context_reset_peak_memory(NULL), FP4RL_ERR_INVALID_ARGUMENT);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_hf_parity_gqa);
    tcase_add_test(tc, test_hf_parity_tied);
    tcase_add_test(tc, test_fp4_2d_operands_identical);
    tcase_add_test(tc, test_numerics_modes);
    tcase_add_test(tc, test_save_load_roundtrip);
    tcase_add_test(tc, test_token_logprobs);
    tcase_add_test(tc, test_training_reduces_loss);
    tcase_add_test(tc, test_context_memory_baseline);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
