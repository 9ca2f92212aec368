/* load_time.c - how long fp4rl_model_from_pretrained takes (issue 14: the 3B checkpoint in BF16
 * onto the H200 in under 10 s), and a save_pretrained directory for tests/fixtures/check_saved_with_hf.py.
 *
 *   fp4rl_load_time DIR [--cpu] [--save OUT]
 * prints "load DIR: S s (P parameters, device)"; with --save, also writes OUT with
 * fp4rl_model_save_pretrained (F32, unsharded) and OUT.tokens.i32 / OUT.logits.f32 (16 tokens). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fp4rl/fp4rl.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what)
{
    fprintf(stderr, "%s: %s\n", what, fp4rl_last_error());
    return 1;
}

static int write_raw(const char *base, const char *ext, const void *p, size_t n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s%s", base, ext);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(p, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) fprintf(stderr, "cannot write %s\n", path);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *save = NULL;
    int cpu = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cpu") == 0) cpu = 1;
        else if (strcmp(argv[i], "--save") == 0 && i + 1 < argc) save = argv[++i];
        else dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "usage: %s DIR [--cpu] [--save OUT]\n", argv[0]);
        return 2;
    }
    fp4rl_context *ctx;
    if (fp4rl_context_create(&ctx, cpu ? FP4RL_DEVICE_CPU : FP4RL_DEVICE_CUDA, 0)) return fail("context");
    fp4rl_model *m;
    double t0 = now_s();
    /* --save compares logits with transformers' FP32 ones: FP32 numerics (the default policy's are FP4) */
    fp4rl_quant_policy *pol = NULL;
    if (save && (fp4rl_quant_policy_create(&pol) || fp4rl_quant_policy_set(pol, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_FP32)))
        return fail("policy");
    if (fp4rl_model_from_pretrained(&m, ctx, dir, pol)) return fail("fp4rl_model_from_pretrained");
    fp4rl_quant_policy_destroy(pol);
    double t = now_s() - t0;
    int64_t np = 0, V = 0;
    fp4rl_model_get_info(m, FP4RL_MI_NUM_PARAMETERS, &np);
    fp4rl_model_get_info(m, FP4RL_MI_VOCAB_SIZE, &V);
    printf("load %s: %.3f s (%lld parameters, %s)\n", dir, t, (long long)np, cpu ? "cpu" : "cuda");
    int rc = 0;
    if (save) {
        enum { T = 16 };
        int32_t tok[T];
        for (int i = 0; i < T; i++) tok[i] = (int32_t)((i * 7 + 3) % V);
        float *logits = malloc((size_t)(T * V) * sizeof(float));
        if (!logits || fp4rl_model_logits(m, tok, NULL, 1, T, logits, (size_t)(T * V) * sizeof(float))) rc = fail("logits");
        if (!rc && fp4rl_model_save_pretrained(m, save, FP4RL_DTYPE_F32, 0)) rc = fail("fp4rl_model_save_pretrained");
        if (!rc) rc = write_raw(save, ".tokens.i32", tok, sizeof tok) || write_raw(save, ".logits.f32", logits, (size_t)(T * V) * 4);
        free(logits);
    }
    fp4rl_model_destroy(m);
    fp4rl_context_destroy(ctx);
    return rc;
}
