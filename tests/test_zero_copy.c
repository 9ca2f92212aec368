/*
 * test_zero_copy.c - zero-copy tensors at the ABI on the CPU: fp4rl_tensor_wrap (the caller's
 * memory used in place, release called exactly once, every bad input refused), fp4rl_tensor_data,
 * fp4rl_context_set_stream on a CPU context, and fp4rl_model_param_tensor (a view of the master
 * weights that sees set_param and optimizer updates, writes through, and keeps the memory alive
 * when the model is destroyed first).
 */
#include "check_run.h"
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <fp4rl/fp4rl.h>

static fp4rl_context *ctx;
static void setup(void) { ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK); }
static void teardown(void) { fp4rl_context_destroy(ctx); }

#define EXPECT FP4RL_EXPECT /* check_run.h */

/* Counts calls of the release callback and remembers its argument. */
static int released;
static void *released_with;
static void count_release(void *p)
{
    released++;
    released_with = p;
}

static const char *TINY =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 32, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 32, \"tie_word_embeddings\": true}";

START_TEST(test_wrap_in_place)
{
    float buf[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {2, 3};
    fp4rl_tensor *t = NULL;
    released = 0;
    int token = 42;
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, shape, NULL, buf, count_release, &token), FP4RL_OK);
    ck_assert_ptr_eq(fp4rl_tensor_data(t), buf); /* the same memory, no copy */
    ck_assert_int_eq(fp4rl_tensor_dtype(t), FP4RL_DTYPE_F32);
    ck_assert_int_eq(fp4rl_tensor_ndim(t), 2);
    ck_assert_int_eq(fp4rl_tensor_dim(t, 1), 3);
    ck_assert_int_eq(fp4rl_tensor_numel(t), 6);
    ck_assert_uint_eq(fp4rl_tensor_nbytes(t), sizeof buf);
    ck_assert_ptr_eq(fp4rl_tensor_context(t), ctx);
    /* the library reads the caller's memory as it is now */
    buf[4] = -7.5f;
    float out[6];
    EXPECT(fp4rl_tensor_to_host(t, out, sizeof out), FP4RL_OK);
    ck_assert_float_eq(out[4], -7.5f);
    ck_assert_float_eq(out[0], 1.0f);
    /* and writes into it: a matmul into a wrapped output */
    float a_host[2 * 3] = {1, 0, 0, 0, 1, 0}, c_buf[2 * 2] = {0};
    int64_t cs[2] = {2, 2};
    fp4rl_tensor *a, *c;
    EXPECT(fp4rl_tensor_from_host(&a, ctx, FP4RL_DTYPE_F32, 2, shape, a_host), FP4RL_OK);
    EXPECT(fp4rl_tensor_wrap(&c, ctx, FP4RL_DTYPE_F32, 2, cs, NULL, c_buf, NULL, NULL), FP4RL_OK);
    EXPECT(fp4rl_matmul(c, ctx, a, t), FP4RL_OK); /* c = a t^T: rows of t picked by a */
    ck_assert_float_eq(c_buf[0], 1.0f);  /* a row 0 . t row 0 = t[0][0] */
    ck_assert_float_eq(c_buf[1], 4.0f);  /* a row 0 . t row 1 = t[1][0] */
    ck_assert_float_eq(c_buf[2], 2.0f);  /* a row 1 . t row 0 = t[0][1] */
    ck_assert_float_eq(c_buf[3], -7.5f); /* a row 1 . t row 1 = t[1][1] */
    fp4rl_tensor_destroy(c); /* no release callback: fine */
    fp4rl_tensor_destroy(a);
    ck_assert_int_eq(released, 0);
    fp4rl_tensor_destroy(t);
    ck_assert_int_eq(released, 1); /* exactly once, with its context */
    ck_assert_ptr_eq(released_with, &token);
    ck_assert_float_eq(buf[4], -7.5f); /* never freed nor changed by the destroy */
}
END_TEST

START_TEST(test_wrap_dtypes_and_strides)
{
    uint16_t bf[4] = {0x3f80, 0x4000, 0x4040, 0x4080}; /* 1, 2, 3, 4 in BF16 */
    int32_t iv[4] = {1, -2, 3, -4};
    int64_t shape[3] = {2, 1, 2};
    fp4rl_tensor *t = NULL;
    /* contiguous strides given explicitly; the size-1 dim's stride is arbitrary */
    int64_t strides[3] = {2, 999, 1};
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_BF16, 3, shape, strides, bf, NULL, NULL), FP4RL_OK);
    ck_assert_ptr_eq(fp4rl_tensor_data(t), bf);
    ck_assert_uint_eq(fp4rl_tensor_nbytes(t), sizeof bf);
    /* a BF16 wrapped tensor is read like any other: 1, 2, 3, 4 are exact in MXFP4 (scale 1) */
    fp4rl_tensor *q, *f;
    EXPECT(fp4rl_quantize(&q, ctx, t, FP4RL_DTYPE_MXFP4, NULL, FP4RL_ROLE_WEIGHT), FP4RL_OK);
    EXPECT(fp4rl_dequantize(&f, ctx, q, FP4RL_DTYPE_F32), FP4RL_OK);
    float fv[4];
    EXPECT(fp4rl_tensor_to_host(f, fv, sizeof fv), FP4RL_OK);
    for (int i = 0; i < 4; i++) ck_assert_float_eq(fv[i], (float)(i + 1));
    fp4rl_tensor_destroy(f);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(t);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_I32, 3, shape, NULL, iv, NULL, NULL), FP4RL_OK);
    int32_t back[4];
    EXPECT(fp4rl_tensor_to_host(t, back, sizeof back), FP4RL_OK);
    ck_assert_int_eq(back[3], -4);
    fp4rl_tensor_destroy(t);

    /* non-contiguous: a transposed view and a row stride with padding */
    int64_t s2[2] = {2, 2};
    int64_t transposed[2] = {1, 2}, padded[2] = {3, 1}, negative[2] = {-2, 1};
    float fbuf[8] = {0};
    t = NULL;
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, s2, transposed, fbuf, NULL, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "contiguous"));
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, s2, padded, fbuf, NULL, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, s2, negative, fbuf, NULL, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(t);
}
END_TEST

START_TEST(test_wrap_bad_input)
{
    float buf[8] = {0};
    int64_t shape[2] = {2, 4}, zero[2] = {2, 0}, neg[2] = {-1, 4}, huge[2] = {INT64_MAX / 2, 4};
    fp4rl_tensor *t = NULL;
    released = 0;
    EXPECT(fp4rl_tensor_wrap(NULL, ctx, FP4RL_DTYPE_F32, 2, shape, NULL, buf, count_release, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_wrap(&t, NULL, FP4RL_DTYPE_F32, 2, shape, NULL, buf, count_release, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, shape, NULL, NULL, count_release, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, NULL, NULL, buf, count_release, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 0, shape, NULL, buf, count_release, NULL), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, FP4RL_MAX_DIMS + 1, shape, NULL, buf, count_release, NULL), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, zero, NULL, buf, count_release, NULL), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, neg, NULL, buf, count_release, NULL), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, huge, NULL, buf, count_release, NULL), FP4RL_ERR_SHAPE);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_HIF4, 2, shape, NULL, buf, count_release, NULL), FP4RL_ERR_DTYPE);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "quantized"));
    EXPECT(fp4rl_tensor_wrap(&t, ctx, (fp4rl_dtype)77, 2, shape, NULL, buf, count_release, NULL), FP4RL_ERR_DTYPE);
    /* misaligned for the element size */
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, shape, NULL, (char *)buf + 1, count_release, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "aligned"));
    /* an address range that wraps around */
    int64_t big[1] = {1 << 20};
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 1, big, NULL, (void *)(UINTPTR_MAX - 15), count_release, NULL),
           FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(t);
    ck_assert_int_eq(released, 0); /* a refused wrap never calls release: the memory stays the caller's */
}
END_TEST

START_TEST(test_data_accessor)
{
    ck_assert_ptr_null(fp4rl_tensor_data(NULL));
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "NULL"));
    float w[64];
    for (int i = 0; i < 64; i++) w[i] = (float)(i % 5) - 2.0f;
    int64_t shape[2] = {1, 64};
    fp4rl_tensor *x, *q;
    EXPECT(fp4rl_tensor_from_host(&x, ctx, FP4RL_DTYPE_F32, 2, shape, w), FP4RL_OK);
    float *p = fp4rl_tensor_data(x); /* a library-owned dense tensor: its elements, in place */
    ck_assert_ptr_nonnull(p);
    ck_assert_float_eq(p[3], w[3]);
    p[3] = 100.0f;
    float back[64];
    EXPECT(fp4rl_tensor_to_host(x, back, sizeof back), FP4RL_OK);
    ck_assert_float_eq(back[3], 100.0f);
    EXPECT(fp4rl_quantize(&q, ctx, x, FP4RL_DTYPE_MXFP4, NULL, FP4RL_ROLE_WEIGHT), FP4RL_OK);
    ck_assert_ptr_null(fp4rl_tensor_data(q));
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "mxfp4"));
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(x);
}
END_TEST

START_TEST(test_cpu_stream)
{
    EXPECT(fp4rl_context_set_stream(NULL, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_context_set_stream(ctx, NULL), FP4RL_OK);
    int fake;
    EXPECT(fp4rl_context_set_stream(ctx, &fake), FP4RL_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "cpu"));
    EXPECT(fp4rl_context_set_stream(ctx, NULL), FP4RL_OK); /* still usable */
}
END_TEST

START_TEST(test_param_tensor_view)
{
    fp4rl_model *m;
    EXPECT(fp4rl_model_create(&m, ctx, TINY, NULL, 3), FP4RL_OK);
    const char *name = "model.layers.1.self_attn.q_proj.weight";
    int ndim;
    int64_t dims[2];
    EXPECT(fp4rl_model_param_shape(m, name, &ndim, dims), FP4RL_OK);
    const size_t n = (size_t)(dims[0] * dims[1]);
    fp4rl_tensor *v = NULL, *v2 = NULL;
    EXPECT(fp4rl_model_param_tensor(m, name, &v), FP4RL_OK);
    ck_assert_int_eq(fp4rl_tensor_dtype(v), FP4RL_DTYPE_F32);
    ck_assert_int_eq(fp4rl_tensor_ndim(v), ndim);
    ck_assert_int_eq(fp4rl_tensor_dim(v, 0), dims[0]);
    ck_assert_int_eq(fp4rl_tensor_dim(v, 1), dims[1]);
    ck_assert_uint_eq(fp4rl_tensor_nbytes(v), n * sizeof(float));
    float *p = fp4rl_tensor_data(v);
    ck_assert_ptr_nonnull(p);
    /* the view is the master weight: get_param agrees, set_param shows in it, writes go through */
    float *host = malloc(n * sizeof(float));
    EXPECT(fp4rl_model_get_param(m, name, host, n * sizeof(float)), FP4RL_OK);
    ck_assert_int_eq(memcmp(host, p, n * sizeof(float)), 0);
    for (size_t i = 0; i < n; i++) host[i] = (float)i * 0.01f;
    EXPECT(fp4rl_model_set_param(m, name, host, n * sizeof(float)), FP4RL_OK);
    ck_assert_float_eq(p[7], host[7]);
    ck_assert_float_ne(host[7], 0.0f);
    p[5] = 2.5f;
    EXPECT(fp4rl_model_get_param(m, name, host, n * sizeof(float)), FP4RL_OK);
    ck_assert_float_eq(host[5], 2.5f);
    /* a second view of the same memory; a 1-dim parameter */
    EXPECT(fp4rl_model_param_tensor(m, name, &v2), FP4RL_OK);
    ck_assert_ptr_eq(fp4rl_tensor_data(v2), p);
    fp4rl_tensor *norm;
    EXPECT(fp4rl_model_param_tensor(m, "model.norm.weight", &norm), FP4RL_OK);
    ck_assert_int_eq(fp4rl_tensor_ndim(norm), 1);
    ck_assert_int_eq(fp4rl_tensor_dim(norm, 0), 32);
    ck_assert_float_eq(((float *)fp4rl_tensor_data(norm))[0], 1.0f); /* norms start at 1 */
    /* an optimizer step updates what the view shows */
    float before = p[0];
    int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8}, lengths[1] = {8};
    EXPECT(fp4rl_model_set_hparam(m, FP4RL_MP_LR, 1e-2), FP4RL_OK);
    EXPECT(fp4rl_model_train_step(m, tokens, lengths, NULL, 1, 8, NULL, NULL), FP4RL_OK);
    EXPECT(fp4rl_model_get_param(m, name, host, n * sizeof(float)), FP4RL_OK);
    ck_assert_float_eq(p[0], host[0]);
    ck_assert_float_ne(p[0], before);
    /* the model goes first: the views stay readable (the memory is kept), then free it */
    fp4rl_model_destroy(m);
    ck_assert_float_eq(p[5], host[5]);
    float back[4];
    EXPECT(fp4rl_tensor_to_host(norm, back, sizeof back), FP4RL_ERR_SHAPE); /* 32 floats do not fit 4 */
    fp4rl_tensor_destroy(v);
    ck_assert_float_eq(((float *)fp4rl_tensor_data(v2))[5], host[5]); /* still held by v2 */
    fp4rl_tensor_destroy(v2);
    fp4rl_tensor_destroy(norm); /* the last view: the weights are freed now (ASan checks no leak) */
    size_t in_use;
    EXPECT(fp4rl_context_memory(ctx, &in_use, NULL, NULL), FP4RL_OK);
    ck_assert_uint_eq(in_use, 0); /* everything the model had is back */
    free(host);
}
END_TEST

START_TEST(test_param_tensor_bad_input)
{
    fp4rl_model *m;
    EXPECT(fp4rl_model_create(&m, ctx, TINY, NULL, 3), FP4RL_OK);
    fp4rl_tensor *v = NULL;
    EXPECT(fp4rl_model_param_tensor(NULL, "model.norm.weight", &v), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_model_param_tensor(m, NULL, &v), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_model_param_tensor(m, "model.norm.weight", NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_model_param_tensor(m, "no.such.weight", &v), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "no.such.weight"));
    EXPECT(fp4rl_model_param_tensor(m, "lm_head.weight", &v), FP4RL_ERR_INVALID_ARGUMENT); /* tied */
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "ties"));
    ck_assert_ptr_null(v);
    /* destroying views before the model, and the model with no views left: the normal order */
    EXPECT(fp4rl_model_param_tensor(m, "model.embed_tokens.weight", &v), FP4RL_OK);
    fp4rl_tensor_destroy(v);
    fp4rl_tensor_destroy(NULL);
    fp4rl_model_destroy(m);
    size_t in_use;
    EXPECT(fp4rl_context_memory(ctx, &in_use, NULL, NULL), FP4RL_OK);
    ck_assert_uint_eq(in_use, 0);
}
END_TEST

/* Two models of one context: views of one do not keep the other's memory, and a view left at
 * context destruction does not leak what its model freed (ASan's leak check runs this). */
START_TEST(test_param_tensor_two_models)
{
    fp4rl_context *c2;
    EXPECT(fp4rl_context_create(&c2, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    fp4rl_model *a, *b;
    EXPECT(fp4rl_model_create(&a, c2, TINY, NULL, 1), FP4RL_OK);
    EXPECT(fp4rl_model_create(&b, c2, TINY, NULL, 2), FP4RL_OK);
    fp4rl_tensor *va, *vb;
    EXPECT(fp4rl_model_param_tensor(a, "model.norm.weight", &va), FP4RL_OK);
    EXPECT(fp4rl_model_param_tensor(b, "model.norm.weight", &vb), FP4RL_OK);
    ck_assert_ptr_ne(fp4rl_tensor_data(va), fp4rl_tensor_data(vb));
    size_t with_b, after_b;
    EXPECT(fp4rl_context_memory(c2, &with_b, NULL, NULL), FP4RL_OK);
    fp4rl_tensor_destroy(vb);
    fp4rl_model_destroy(b); /* no view of b left: its memory goes now */
    EXPECT(fp4rl_context_memory(c2, &after_b, NULL, NULL), FP4RL_OK);
    ck_assert_uint_lt(after_b, with_b);
    fp4rl_model_destroy(a); /* va keeps a's weights */
    ck_assert_float_eq(((float *)fp4rl_tensor_data(va))[0], 1.0f);
    fp4rl_tensor_destroy(va);
    fp4rl_context_destroy(c2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("zero_copy");
    TCase *tc = tcase_create("cpu");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_wrap_in_place);
    tcase_add_test(tc, test_wrap_dtypes_and_strides);
    tcase_add_test(tc, test_wrap_bad_input);
    tcase_add_test(tc, test_data_accessor);
    tcase_add_test(tc, test_cpu_stream);
    tcase_add_test(tc, test_param_tensor_view);
    tcase_add_test(tc, test_param_tensor_bad_input);
    tcase_add_test(tc, test_param_tensor_two_models);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
