/*
 * dist_rl.c - data-parallel RL on N GPUs, N processes (not run by ctest: it needs N GPUs).
 *
 *   dist_rl N [options]            N ranks, GPU r for rank r: K RL steps on the same global batch;
 *                                  prints each step's metrics (rank 0) and every rank's weights
 *                                  checksum; exits 1 when the ranks' weights differ
 *   dist_rl N --compare [options]  the same with 1 rank, then with N, and compares them
 *
 * Options: --steps K (3), --prompts P (global prompts per step, 16), --group G (4), --max-new T (6),
 *   --fp32 (FP32 numerics; default BF16 rollout and training, both deterministic),
 *   --allreduce-bf16 (BF16 gradient all-reduce), --bench (the ~120M-parameter model of
 *   dist_common.h instead of the small one), --tol X (weights tolerance of --compare, 1e-3).
 *
 * The parent forks the ranks before anything touches CUDA or NCCL. Rank 0 makes the NCCL unique
 * id and writes it into a pipe to each other rank, as a host framework would broadcast it; every
 * rank then calls fp4rl_context_create_distributed. Results come back through files in a
 * temporary directory.
 *
 * What --compare checks, and why these tolerances: the ranks together sample the completions one
 * process samples (counter-based sampling by global completion index), so the first step sees the
 * same tokens up to GEMM rows whose last bits differ with the batch's row count (a token flips
 * only when its uniform falls within that of a CDF step); the summed gradients differ from one
 * process's by the order of FP32 additions (NCCL's ring vs one GEMM), ~1e-7 relative, which AdamW
 * turns into weight differences of order lr * 1e-3 per step. So: step 1's metrics within 1e-3
 * relative (a flipped token would show here), the final weights within --tol of the largest weight,
 * and the later steps' metrics are printed, not judged (a flipped token changes a mean by 1/n).
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist_common.h"

#define MAX_RANKS 64
#define MAX_STEPS 1000
#define N_METRICS 64

static int n_metrics(void)
{
    int n = 0;
    while (fp4rl_rl_session_metric_name((size_t)n) && n < N_METRICS) n++;
    return n;
}

static int metric_index(const char *name)
{
    for (int i = 0; i < n_metrics(); i++)
        if (strcmp(fp4rl_rl_session_metric_name((size_t)i), name) == 0) return i;
    return -1;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n) {
        ssize_t k = read(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

#define CHILD_CHECK(call)                                                                                       \
    do {                                                                                                        \
        fp4rl_status st_ = (call);                                                                              \
        if (st_ != FP4RL_OK) {                                                                                  \
            fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #call, fp4rl_status_name(st_), fp4rl_last_error()); \
            _exit(1);                                                                                           \
        }                                                                                                       \
    } while (0)

/* One rank: join, run, write <dir>/w<world>_r<rank>.bin (metrics [steps][N_METRICS], then the
 * weights' count and the weights). */
static void child(int rank, int world, int (*pipes)[2], const dist_cfg *cfg, const char *dir)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsigned char id[FP4RL_NCCL_UNIQUE_ID_BYTES];
    if (rank == 0) {
        CHILD_CHECK(fp4rl_nccl_unique_id(id, sizeof id));
        for (int r = 1; r < world; r++)
            if (write_all(pipes[r][1], id, sizeof id)) {
                fprintf(stderr, "rank 0: cannot send the NCCL id to rank %d\n", r);
                _exit(1);
            }
    } else if (read_all(pipes[rank][0], id, sizeof id)) {
        fprintf(stderr, "rank %d: no NCCL id from rank 0\n", rank);
        _exit(1);
    }
    fp4rl_context *ctx = NULL;
    CHILD_CHECK(fp4rl_context_create_distributed(&ctx, rank, rank, world, id, sizeof id));
    dist_run r;
    CHILD_CHECK(dist_setup(&r, ctx, cfg));
    const int nm = n_metrics();
    double *metrics = calloc((size_t)cfg->steps * N_METRICS, sizeof(double));
    const int i_reward = metric_index("reward/mean"), i_loss = metric_index("pg/loss"), i_gn = metric_index("grad_norm");
    const int i_rtps = metric_index("perf/rollout_tokens_per_s"), i_ttps = metric_index("perf/train_tokens_per_s");
    const int i_step = metric_index("time/step_s");
    double rtps = 0, ttps = 0;
    for (int k = 0; k < cfg->steps; k++) {
        CHILD_CHECK(dist_step(&r, cfg, k));
        double *m = metrics + (size_t)k * N_METRICS;
        for (int i = 0; i < nm; i++) CHILD_CHECK(fp4rl_rl_session_metric(r.session, fp4rl_rl_session_metric_name((size_t)i), &m[i]));
        if (k > 0 || cfg->steps == 1) { /* the first step warms up (allocator, cuBLASLt plans) */
            rtps += m[i_rtps];
            ttps += m[i_ttps];
        }
        if (rank == 0)
            printf("world %d step %d: reward/mean %.6f  pg/loss %.6g  grad_norm %.6g  rollout %.0f tok/s  train %.0f tok/s  step %.3f s\n",
                   world, k + 1, m[i_reward], m[i_loss], m[i_gn], m[i_rtps], m[i_ttps], m[i_step]);
    }
    int64_t n = 0;
    float *w = dist_weights(r.model, &n);
    if (!w) {
        fprintf(stderr, "rank %d: cannot read the weights\n", rank);
        _exit(1);
    }
    printf("world %d rank %d: weights checksum %016llx (%lld parameters)\n", world, rank,
           (unsigned long long)dist_checksum(w, n), (long long)n);
    if (rank == 0) {
        const int timed = cfg->steps > 1 ? cfg->steps - 1 : 1;
        printf("summary: world %d, %d prompts x %d, rollout %.0f tok/s, train %.0f tok/s (global, mean of steps 2..%d)\n", world,
               cfg->n_prompts, cfg->group, rtps / timed, ttps / timed, cfg->steps);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/w%d_r%d.bin", dir, world, rank);
    FILE *f = fopen(path, "wb");
    const int ok = f && fwrite(metrics, sizeof(double), (size_t)cfg->steps * N_METRICS, f) == (size_t)cfg->steps * N_METRICS &&
                   fwrite(&n, sizeof n, 1, f) == 1 && fwrite(w, sizeof(float), (size_t)n, f) == (size_t)n;
    if (!f || fclose(f) != 0 || !ok) {
        fprintf(stderr, "rank %d: cannot write %s\n", rank, path);
        _exit(1);
    }
    free(w);
    free(metrics);
    dist_teardown(&r);
    fp4rl_context_destroy(ctx);
    _exit(0);
}

typedef struct world_result {
    double *metrics; /* rank 0's [steps][N_METRICS] */
    float *w;        /* rank 0's weights */
    int64_t n;
} world_result;

/* Runs `world` ranks; 0 when every rank succeeded and all hold the same weights. */
static int run_world(int world, const dist_cfg *cfg, const char *dir, world_result *out)
{
    int pipes[MAX_RANKS][2];
    pid_t pid[MAX_RANKS];
    for (int r = 0; r < world; r++)
        if (pipe(pipes[r])) {
            perror("pipe");
            return 1;
        }
    fflush(stdout);
    for (int r = 0; r < world; r++) {
        pid[r] = fork();
        if (pid[r] < 0) {
            perror("fork");
            for (int k = 0; k < r; k++) kill(pid[k], SIGTERM);
            return 1;
        }
        if (pid[r] == 0) child(r, world, pipes, cfg, dir);
    }
    for (int r = 0; r < world; r++) {
        close(pipes[r][0]);
        close(pipes[r][1]);
    }
    /* a rank that fails leaves the others waiting in NCCL: end them */
    int failed = 0, left = world;
    while (left > 0) {
        int status = 0;
        const pid_t p = waitpid(-1, &status, 0);
        if (p < 0 && errno == EINTR) continue;
        if (p < 0) break;
        left--;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (!failed)
                for (int r = 0; r < world; r++)
                    if (pid[r] != p) kill(pid[r], SIGTERM);
            failed = 1;
        }
    }
    if (failed) {
        fprintf(stderr, "dist_rl: a rank of world %d failed\n", world);
        return 1;
    }
    /* every rank's weights against rank 0's */
    int differ = 0;
    for (int r = 0; r < world; r++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/w%d_r%d.bin", dir, world, r);
        FILE *f = fopen(path, "rb");
        double *m = malloc((size_t)cfg->steps * N_METRICS * sizeof(double));
        int64_t n = 0;
        int ok = f && m && fread(m, sizeof(double), (size_t)cfg->steps * N_METRICS, f) == (size_t)cfg->steps * N_METRICS &&
                 fread(&n, sizeof n, 1, f) == 1 && n > 0;
        float *w = ok ? malloc((size_t)n * sizeof(float)) : NULL;
        ok = ok && w && fread(w, sizeof(float), (size_t)n, f) == (size_t)n;
        if (f) fclose(f);
        if (!ok) {
            fprintf(stderr, "dist_rl: cannot read %s\n", path);
            free(m);
            free(w);
            return 1;
        }
        if (r == 0) {
            out->metrics = m;
            out->w = w;
            out->n = n;
            continue;
        }
        if (n != out->n || memcmp(w, out->w, (size_t)n * sizeof(float)) != 0) {
            fprintf(stderr, "dist_rl: rank %d's weights differ from rank 0's\n", r);
            differ = 1;
        }
        /* the metrics are reduced over the ranks: the same everywhere (wall times aside) */
        for (int k = 0; k < cfg->steps; k++)
            for (int i = 0; i < n_metrics(); i++)
                if (!dist_timed_metric(fp4rl_rl_session_metric_name((size_t)i)) && m[k * N_METRICS + i] != out->metrics[k * N_METRICS + i] &&
                    !(isnan(m[k * N_METRICS + i]) && isnan(out->metrics[k * N_METRICS + i]))) {
                    fprintf(stderr, "dist_rl: rank %d step %d %s = %.17g, rank 0 %.17g\n", r, k + 1, fp4rl_rl_session_metric_name((size_t)i),
                            m[k * N_METRICS + i], out->metrics[k * N_METRICS + i]);
                    differ = 1;
                }
        free(m);
        free(w);
    }
    printf("world %d: %s\n", world, differ ? "RANKS DIFFER" : "every rank holds bit-identical weights and reports the same metrics");
    return differ;
}

static int compare(const world_result *one, const world_result *many, int world, const dist_cfg *cfg, double tol)
{
    int bad = 0;
    printf("1 rank vs %d ranks (relative differences):\n", world);
    for (int k = 0; k < cfg->steps; k++)
        for (int i = 0; i < n_metrics(); i++) {
            const char *name = fp4rl_rl_session_metric_name((size_t)i);
            if (dist_timed_metric(name)) continue;
            const double a = one->metrics[k * N_METRICS + i], b = many->metrics[k * N_METRICS + i];
            const double rel = fabs(a - b) / fmax(1e-12, fmax(fabs(a), fabs(b)));
            if (rel == 0 || (isnan(a) && isnan(b))) continue;
            const int judged = k == 0;
            printf("  step %d %-32s %.9g vs %.9g  (%.2g)%s\n", k + 1, name, a, b, rel, judged && rel > 1e-3 ? "  > 1e-3: FAIL" : "");
            if (judged && rel > 1e-3) bad = 1;
        }
    double dmax = 0, wmax = 0;
    for (int64_t i = 0; i < one->n && one->n == many->n; i++) {
        dmax = fmax(dmax, fabs((double)one->w[i] - many->w[i]));
        wmax = fmax(wmax, fabs((double)one->w[i]));
    }
    const double rel = wmax > 0 ? dmax / wmax : dmax;
    printf("  weights after %d steps: max |diff| %.3g, max |w| %.3g: %.3g relative (tolerance %.3g)%s\n", cfg->steps, dmax, wmax, rel, tol,
           rel > tol ? ": FAIL" : "");
    if (one->n != many->n || rel > tol) bad = 1;
    printf("compare: %s\n", bad ? "FAIL" : "ok");
    return bad;
}

/* Removes the results directory (plain files only). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    if (rmdir(dir) != 0) fprintf(stderr, "dist_rl: could not remove %s\n", dir);
}

static void usage(void)
{
    fprintf(stderr, "usage: dist_rl N [--compare] [--steps K] [--prompts P] [--group G] [--max-new T] [--fp32] [--allreduce-bf16] [--bench] [--tol X]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 2) usage();
    const int world = atoi(argv[1]);
    dist_cfg cfg = DIST_DEFAULT_CFG;
    int do_compare = 0;
    double tol = 1e-3;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const int has_value = i + 1 < argc;
        if (!strcmp(a, "--compare")) do_compare = 1;
        else if (!strcmp(a, "--fp32")) cfg.bf16 = 0;
        else if (!strcmp(a, "--allreduce-bf16")) cfg.allreduce_bf16 = 1;
        else if (!strcmp(a, "--bench")) cfg.bench = 1;
        else if (!strcmp(a, "--steps") && has_value) cfg.steps = atoi(argv[++i]);
        else if (!strcmp(a, "--prompts") && has_value) cfg.n_prompts = atoi(argv[++i]);
        else if (!strcmp(a, "--group") && has_value) cfg.group = atoi(argv[++i]);
        else if (!strcmp(a, "--max-new") && has_value) cfg.max_new = atoi(argv[++i]);
        else if (!strcmp(a, "--tol") && has_value) tol = atof(argv[++i]);
        else usage();
    }
    if (world < 1 || world > MAX_RANKS || cfg.steps < 1 || cfg.steps > MAX_STEPS || cfg.n_prompts < world || cfg.group < 2 || cfg.max_new < 1) {
        fprintf(stderr, "dist_rl: need 1 <= N <= %d, 1 <= steps <= %d, prompts >= N, group >= 2, max-new >= 1\n", MAX_RANKS, MAX_STEPS);
        return 2;
    }
    char dir[] = "/tmp/fp4rl_dist_rl_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    printf("dist_rl: %d rank%s, %d steps, %d prompts x %d completions, max %d new tokens, %s numerics, %s gradient all-reduce, %s model\n",
           world, world > 1 ? "s" : "", cfg.steps, cfg.n_prompts, cfg.group, cfg.max_new, cfg.bf16 ? "BF16" : "FP32",
           cfg.allreduce_bf16 ? "BF16" : "FP32", cfg.bench ? "bench (~120M)" : "small");
    world_result one = {0}, many = {0};
    int rc = 0;
    if (do_compare) rc = run_world(1, &cfg, dir, &one);
    if (!rc) rc = run_world(world, &cfg, dir, &many);
    if (!rc && do_compare) rc = compare(&one, &many, world, &cfg, tol);
    free(one.metrics);
    free(one.w);
    free(many.metrics);
    free(many.w);
    remove_dir(dir);
    return rc;
}
