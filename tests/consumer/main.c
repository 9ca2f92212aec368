/* A user's program built only with `pkg-config --cflags --libs fp4rl` (or find_package(fp4rl))
 * against an installed tree: quantizes a vector to HiF4 and back. */
#include <fp4rl/fp4rl.h>
#include <stdio.h>

int main(void)
{
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float)(i - 32) / 16.0f; /* spec vector D */
    int64_t shape[1] = {64};
    fp4rl_context *ctx;
    fp4rl_tensor *t, *q, *d;
    if (fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0) || fp4rl_tensor_from_host(&t, ctx, FP4RL_DTYPE_F32, 1, shape, x) ||
        fp4rl_quantize(&q, ctx, t, FP4RL_DTYPE_HIF4, NULL, FP4RL_ROLE_ACTIVATION) ||
        fp4rl_dequantize(&d, ctx, q, FP4RL_DTYPE_F32)) {
        fprintf(stderr, "fp4rl: %s\n", fp4rl_last_error());
        return 1;
    }
    unsigned word;
    float y[64];
    fp4rl_tensor_scales_to_host(q, &word, sizeof word);
    fp4rl_tensor_to_host(d, y, sizeof y);
    printf("consumer: fp4rl %s, HiF4 word 0x%08X, x[0] -> %g\n", fp4rl_version_string(), word, (double)y[0]);
    fp4rl_tensor_destroy(d);
    fp4rl_tensor_destroy(q);
    fp4rl_tensor_destroy(t);
    fp4rl_context_destroy(ctx);
    return (word == 0xEC3FC3B9u && y[0] == -1.875f) ? 0 : 1;
}
