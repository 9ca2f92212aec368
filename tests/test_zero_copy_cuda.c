/*
 * test_zero_copy_cuda.c - zero-copy tensors and streams on a CUDA context (label gpu; exits 77
 * without a GPU): wrapped device memory used in place and refused when it is host memory or
 * misaligned; fp4rl_context_set_stream ordering the context's work on the caller's stream (a
 * stream held back by a sleeping host function proves the order: on any other stream the read
 * would see the old bytes); the switch back ordered after the caller's stream; a device view of a
 * model parameter.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <fp4rl/fp4rl.h> /* before check_run.h: its GPU helper needs it */
#include "check_run.h"
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <fp4rl/fp4rl.h>

static fp4rl_context *ctx;
static void setup(void) { ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CUDA, 0), FP4RL_OK); }
static void teardown(void) { fp4rl_context_destroy(ctx); }

#define EXPECT FP4RL_EXPECT /* check_run.h */
#define CU(call) ck_assert_msg((call) == cudaSuccess, "%s failed", #call)

static int released;
static void count_release(void *p)
{
    (void)p;
    released++;
}

/* Holds a stream back: a host function that sleeps 300 ms before the stream's next operation. */
static void CUDART_CB sleep_300ms(void *p)
{
    (void)p;
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

static const char *TINY =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 32, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 32, \"tie_word_embeddings\": true}";

START_TEST(test_wrap_device_memory)
{
    enum { N = 256 };
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i - 100.0f;
    float *dev;
    CU(cudaMalloc((void **)&dev, N * sizeof(float)));
    CU(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice));
    int64_t shape[2] = {4, 64};
    fp4rl_tensor *t = NULL;
    released = 0;
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, shape, NULL, dev, count_release, NULL), FP4RL_OK);
    ck_assert_ptr_eq(fp4rl_tensor_data(t), dev);
    EXPECT(fp4rl_tensor_to_host(t, back, sizeof back), FP4RL_OK);
    ck_assert_int_eq(memcmp(back, host, sizeof host), 0);
    /* a quantize/dequantize round trip reads the wrapped memory on the device */
    fp4rl_tensor *q, *f;
    EXPECT(fp4rl_quantize(&q, ctx, t, FP4RL_DTYPE_MXFP8_E4M3, NULL, FP4RL_ROLE_WEIGHT), FP4RL_OK);
    EXPECT(fp4rl_dequantize(&f, ctx, q, FP4RL_DTYPE_F32), FP4RL_OK);
    EXPECT(fp4rl_tensor_to_host(f, back, sizeof back), FP4RL_OK);
    ck_assert_float_eq(back[100], 0.0f);  /* host[100] = 0 */
    ck_assert_float_eq(back[101], 1.0f);  /* small integers are exact in E4M3 */
    fp4rl_tensor_destroy(f);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(t);
    ck_assert_int_eq(released, 1);

    /* refused: host memory (pageable and pinned), misaligned device memory, past the allocation */
    float *pinned;
    CU(cudaMallocHost((void **)&pinned, N * sizeof(float)));
    t = NULL;
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, shape, NULL, host, count_release, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, shape, NULL, pinned, count_release, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "host"));
    int64_t one_row[2] = {1, 64};
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 2, one_row, NULL, dev + 1, count_release, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "aligned"));
    ck_assert_ptr_null(t);
    ck_assert_int_eq(released, 1);
    CU(cudaFreeHost(pinned));
    CU(cudaFree(dev));
}
END_TEST

START_TEST(test_set_stream_orders_work)
{
    enum { N = 1024 };
    float *host, *back;
    CU(cudaMallocHost((void **)&host, N * sizeof(float)));
    CU(cudaMallocHost((void **)&back, N * sizeof(float)));
    for (int i = 0; i < N; i++) host[i] = (float)(i % 97);
    float *dev;
    CU(cudaMalloc((void **)&dev, N * sizeof(float)));
    CU(cudaMemset(dev, 0, N * sizeof(float)));
    CU(cudaDeviceSynchronize());
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); /* as PyTorch's side streams are */
    int64_t shape[1] = {N};
    fp4rl_tensor *t;
    EXPECT(fp4rl_tensor_wrap(&t, ctx, FP4RL_DTYPE_F32, 1, shape, NULL, dev, NULL, NULL), FP4RL_OK);

    /* on the caller's stream: the copy in waits for the sleep, the read waits for the copy */
    EXPECT(fp4rl_context_set_stream(ctx, s), FP4RL_OK);
    CU(cudaLaunchHostFunc(s, sleep_300ms, NULL));
    CU(cudaMemcpyAsync(dev, host, N * sizeof(float), cudaMemcpyHostToDevice, s));
    EXPECT(fp4rl_tensor_to_host(t, back, N * sizeof(float)), FP4RL_OK);
    ck_assert_int_eq(memcmp(back, host, N * sizeof(float)), 0);

    /* the switch back to the context's own stream is ordered after the caller's stream */
    for (int i = 0; i < N; i++) host[i] = -(float)i;
    CU(cudaLaunchHostFunc(s, sleep_300ms, NULL));
    CU(cudaMemcpyAsync(dev, host, N * sizeof(float), cudaMemcpyHostToDevice, s));
    EXPECT(fp4rl_context_set_stream(ctx, NULL), FP4RL_OK);
    EXPECT(fp4rl_tensor_to_host(t, back, N * sizeof(float)), FP4RL_OK);
    ck_assert_int_eq(memcmp(back, host, N * sizeof(float)), 0);

    /* setting the same stream twice, and the legacy default stream, are fine */
    EXPECT(fp4rl_context_set_stream(ctx, NULL), FP4RL_OK);
    EXPECT(fp4rl_context_set_stream(ctx, (void *)cudaStreamLegacy), FP4RL_OK);
    EXPECT(fp4rl_tensor_to_host(t, back, N * sizeof(float)), FP4RL_OK);
    ck_assert_float_eq(back[5], -5.0f);
    /* a context left on a caller's stream: destroy waits for it (the teardown's destroy) */
    EXPECT(fp4rl_context_set_stream(ctx, s), FP4RL_OK);
    fp4rl_tensor_destroy(t);
    EXPECT(fp4rl_context_set_stream(ctx, NULL), FP4RL_OK);
    CU(cudaStreamSynchronize(s));
    CU(cudaStreamDestroy(s));
    CU(cudaFree(dev));
    CU(cudaFreeHost(host));
    CU(cudaFreeHost(back));
}
END_TEST

START_TEST(test_set_stream_other_device)
{
    int n = 0;
    CU(cudaGetDeviceCount(&n));
    if (n < 2) return; /* needs a second GPU */
    int cur;
    CU(cudaGetDevice(&cur));
    CU(cudaSetDevice(1));
    cudaStream_t s1;
    CU(cudaStreamCreate(&s1));
    CU(cudaSetDevice(cur));
    EXPECT(fp4rl_context_set_stream(ctx, s1), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "device 0"));
    EXPECT(fp4rl_context_set_stream(ctx, NULL), FP4RL_OK); /* unchanged and usable */
    CU(cudaSetDevice(1));
    CU(cudaStreamDestroy(s1));
    CU(cudaSetDevice(cur));
}
END_TEST

START_TEST(test_param_tensor_on_device)
{
    fp4rl_model *m;
    EXPECT(fp4rl_model_create(&m, ctx, TINY, NULL, 3), FP4RL_OK);
    const char *name = "model.layers.0.mlp.up_proj.weight";
    fp4rl_tensor *v;
    EXPECT(fp4rl_model_param_tensor(m, name, &v), FP4RL_OK);
    void *p = fp4rl_tensor_data(v);
    struct cudaPointerAttributes a;
    CU(cudaPointerGetAttributes(&a, p));
    ck_assert_int_eq(a.type, cudaMemoryTypeDevice);
    const size_t n = (size_t)fp4rl_tensor_numel(v);
    ck_assert_uint_eq(n, 64 * 32);
    float *viaview = malloc(n * sizeof(float)), *viaget = malloc(n * sizeof(float));
    CU(cudaMemcpy(viaview, p, n * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT(fp4rl_model_get_param(m, name, viaget, n * sizeof(float)), FP4RL_OK);
    ck_assert_int_eq(memcmp(viaview, viaget, n * sizeof(float)), 0);
    /* a write through the view is the model's weight */
    float x = 0.625f;
    CU(cudaMemcpy((float *)p + 3, &x, sizeof x, cudaMemcpyHostToDevice));
    EXPECT(fp4rl_model_get_param(m, name, viaget, n * sizeof(float)), FP4RL_OK);
    ck_assert_float_eq(viaget[3], 0.625f);
    fp4rl_model_destroy(m); /* the view keeps the weights */
    CU(cudaMemcpy(viaview, p, n * sizeof(float), cudaMemcpyDeviceToHost));
    ck_assert_float_eq(viaview[3], 0.625f);
    fp4rl_tensor_destroy(v);
    size_t in_use;
    EXPECT(fp4rl_context_memory(ctx, &in_use, NULL, NULL), FP4RL_OK);
    ck_assert_uint_eq(in_use, 0);
    free(viaview);
    free(viaget);
}
END_TEST

int main(void)
{
    int skip = fp4rl_gpu_or_skip("test_zero_copy_cuda");
    if (skip) return skip;
    Suite *s = suite_create("zero_copy_cuda");
    TCase *tc = tcase_create("cuda");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_wrap_device_memory);
    tcase_add_test(tc, test_set_stream_orders_work);
    tcase_add_test(tc, test_set_stream_other_device);
    tcase_add_test(tc, test_param_tensor_on_device);
    suite_add_tcase(s, tc);
    return fp4rl_check_run_nofork(s); /* CUDA state does not survive fork() */
}
