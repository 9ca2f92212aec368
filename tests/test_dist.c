/*
 * test_dist.c - data parallelism through NCCL on one GPU: a context that joins a communicator of
 * world size 1 (fp4rl_nccl_unique_id + fp4rl_context_create_distributed) runs the session's whole
 * distributed path (collectives included) and must match a plain CUDA context exactly: the same
 * metrics (wall-time ones aside) and the same weights, bit for bit, after a few RL steps with
 * deterministic numerics. Several ranks need several GPUs: tests/dist_rl.c.
 *
 * Label `gpu`: exits 77 (skipped) without a usable GPU, in a build without CUDA or NCCL, or when
 * libnccl.so.2 cannot be loaded.
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dist_common.h"
#include "check_run.h" /* after fp4rl.h: its GPU helpers */

#define OK(call) ck_assert_msg((call) == FP4RL_OK, "%s: %s", #call, fp4rl_last_error())
#define MAX_STEPS 8
#define N_METRICS 64

typedef struct result {
    double metrics[MAX_STEPS][N_METRICS];
    float *w;
    int64_t n;
    uint64_t checksum;
} result;

static fp4rl_context *distributed_world1(void)
{
    unsigned char id[FP4RL_NCCL_UNIQUE_ID_BYTES];
    OK(fp4rl_nccl_unique_id(id, sizeof id));
    fp4rl_context *c = NULL;
    OK(fp4rl_context_create_distributed(&c, 0, 0, 1, id, sizeof id));
    int rank = -1, world = -1;
    OK(fp4rl_context_get_rank(c, &rank, &world));
    ck_assert_int_eq(rank, 0);
    ck_assert_int_eq(world, 1);
    return c;
}

static void run(fp4rl_context *c, const dist_cfg *cfg, result *out)
{
    dist_run r;
    OK(dist_setup(&r, c, cfg));
    for (int k = 0; k < cfg->steps; k++) {
        OK(dist_step(&r, cfg, k));
        for (size_t i = 0; fp4rl_rl_session_metric_name(i) && i < N_METRICS; i++)
            OK(fp4rl_rl_session_metric(r.session, fp4rl_rl_session_metric_name(i), &out->metrics[k][i]));
    }
    out->w = dist_weights(r.model, &out->n);
    ck_assert_ptr_nonnull(out->w);
    out->checksum = dist_checksum(out->w, out->n);
    dist_teardown(&r);
}

static void check_same(const result *a, const result *b, const dist_cfg *cfg)
{
    for (int k = 0; k < cfg->steps; k++)
        for (size_t i = 0; fp4rl_rl_session_metric_name(i) && i < N_METRICS; i++) {
            const char *name = fp4rl_rl_session_metric_name(i);
            if (dist_timed_metric(name)) continue;
            ck_assert_msg(a->metrics[k][i] == b->metrics[k][i] || (isnan(a->metrics[k][i]) && isnan(b->metrics[k][i])),
                          "step %d %s: %.17g vs %.17g", k, name, a->metrics[k][i], b->metrics[k][i]);
        }
    ck_assert_int_eq(a->n, b->n);
    ck_assert_msg(a->checksum == b->checksum, "weights checksum %016llx vs %016llx", (unsigned long long)a->checksum,
                  (unsigned long long)b->checksum);
}

/* World size 1 through NCCL = a plain CUDA context, for BF16 and FP32 numerics. */
START_TEST(test_world1_matches_plain)
{
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        dist_cfg cfg = DIST_DEFAULT_CFG;
        cfg.bf16 = bf16;
        result plain = {0}, dist = {0};
        fp4rl_context *c;
        OK(fp4rl_context_create(&c, FP4RL_DEVICE_CUDA, 0));
        run(c, &cfg, &plain);
        fp4rl_context_destroy(c);
        c = distributed_world1();
        run(c, &cfg, &dist);
        fp4rl_context_destroy(c);
        check_same(&dist, &plain, &cfg);
        printf("world 1 via NCCL = plain CUDA context (%s numerics): weights checksum %016llx after %d steps\n",
               bf16 ? "BF16" : "FP32", (unsigned long long)dist.checksum, cfg.steps);
        free(plain.w);
        free(dist.w);
    }
}
END_TEST

/* BF16 gradient all-reduce: the gradients are rounded to BF16 before the update, so the weights
 * move differently; the first rollout (before any update) is the same. */
START_TEST(test_world1_bf16_allreduce)
{
    dist_cfg cfg = DIST_DEFAULT_CFG;
    result plain = {0}, dist = {0};
    fp4rl_context *c;
    OK(fp4rl_context_create(&c, FP4RL_DEVICE_CUDA, 0));
    run(c, &cfg, &plain);
    fp4rl_context_destroy(c);
    cfg.allreduce_bf16 = 1;
    c = distributed_world1();
    run(c, &cfg, &dist);
    fp4rl_context_destroy(c);
    for (size_t i = 0; fp4rl_rl_session_metric_name(i) && i < N_METRICS; i++) {
        const char *name = fp4rl_rl_session_metric_name(i);
        if (strncmp(name, "reward/", 7) == 0 || strncmp(name, "response_length/", 16) == 0)
            ck_assert_msg(dist.metrics[0][i] == plain.metrics[0][i], "%s", name);
    }
    double dmax = 0, wmax = 0;
    for (int64_t i = 0; i < plain.n; i++) {
        ck_assert(isfinite(dist.w[i]));
        dmax = fmax(dmax, fabs((double)dist.w[i] - plain.w[i]));
        wmax = fmax(wmax, fabs((double)plain.w[i]));
    }
    printf("BF16 all-reduce, world 1: weights max |diff| %.3g (max |w| %.3g) after %d steps\n", dmax, wmax, cfg.steps);
    ck_assert(dmax < 1e-2 * wmax);
    free(plain.w);
    free(dist.w);
}
END_TEST

/* A distributed context saves (rank 0) and loads its checkpoints. */
START_TEST(test_world1_checkpoint)
{
    dist_cfg cfg = DIST_DEFAULT_CFG;
    fp4rl_context *c = distributed_world1();
    dist_run r;
    OK(dist_setup(&r, c, &cfg));
    OK(dist_step(&r, &cfg, 0));
    char dir[] = "/tmp/fp4rl_dist_XXXXXX", ck[600];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    OK(fp4rl_rl_session_save(r.session, ck));
    int64_t n = 0;
    float *want = dist_weights(r.model, &n);
    OK(dist_step(&r, &cfg, 1));
    OK(fp4rl_rl_session_load(r.session, ck));
    float *got = dist_weights(r.model, &n);
    ck_assert_mem_eq(got, want, (size_t)n * sizeof(float));
    ck_assert_int_eq(fp4rl_rl_session_load(r.session, "/nonexistent/ckpt"), FP4RL_ERR_IO);
    free(want);
    free(got);
    dist_teardown(&r);
    fp4rl_context_destroy(c);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_bad_arguments)
{
    unsigned char id[FP4RL_NCCL_UNIQUE_ID_BYTES];
    OK(fp4rl_nccl_unique_id(id, sizeof id));
    fp4rl_context *c = NULL;
    ck_assert_int_eq(fp4rl_context_create_distributed(&c, 0, 1, 1, id, sizeof id), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fp4rl_last_error(), "rank 1 is outside"));
    ck_assert_int_eq(fp4rl_context_create_distributed(&c, 0, 0, 1, NULL, sizeof id), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_context_create_distributed(&c, 0, 0, 1, id, sizeof id - 1), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fp4rl_context_create_distributed(&c, 100000, 0, 1, id, sizeof id), FP4RL_ERR_DEVICE);
    ck_assert_int_eq(fp4rl_nccl_unique_id(id, 10), FP4RL_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_null(c);
    /* a session of a 1-rank communicator needs >= 1 prompt, like any session */
    c = distributed_world1();
    dist_cfg cfg = DIST_DEFAULT_CFG;
    dist_run r;
    OK(dist_setup(&r, c, &cfg));
    const int32_t tok[1] = {5};
    const size_t off[1] = {0};
    ck_assert_int_eq(fp4rl_rl_session_step(r.session, tok, off, 0, dist_reward, NULL), FP4RL_ERR_INVALID_ARGUMENT);
    dist_teardown(&r);
    fp4rl_context_destroy(c);
}
END_TEST

int main(void)
{
    if (fp4rl_gpu_or_skip("test_dist")) return 77;
    unsigned char id[FP4RL_NCCL_UNIQUE_ID_BYTES];
    const fp4rl_status st = fp4rl_nccl_unique_id(id, sizeof id);
    if (st != FP4RL_OK) {
        printf("skip: no NCCL (%s: %s)\n", fp4rl_status_name(st), fp4rl_last_error());
        return 77;
    }
    Suite *s = suite_create("dist");
    TCase *tc = tcase_create("dist");
    tcase_add_test(tc, test_world1_matches_plain);
    tcase_add_test(tc, test_world1_bf16_allreduce);
    tcase_add_test(tc, test_world1_checkpoint);
    tcase_add_test(tc, test_bad_arguments);
    suite_add_tcase(s, tc);
    return fp4rl_check_run_nofork(s);
}
