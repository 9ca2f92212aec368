/*
 * test_dist_cpu.c - the data-parallel RL session, on the CPU, without NCCL: W threads are W ranks,
 * each with its own CPU context whose backend all-reduce is an in-process collective (a barrier
 * and rank-ordered sums). Everything of core/rl/session.c's distributed path runs: the prompt split,
 * sampling by global row, the global loss normalizers, the gradient sum, the metric reductions,
 * failure agreement, and rank-0 checkpoints. The NCCL transport itself is tested by test_dist.c on
 * a GPU and by the multi-process program tests/dist_rl.c.
 *
 * What "the same as one process" means here, and the tolerances:
 *  - the first rollout samples exactly the one-process tokens (same weights, the same Philox draw
 *    per global row), with the same log-probs up to the last bits (OpenBLAS blocks its GEMMs by
 *    the row count, so a row's FP32 sums may round differently in a smaller batch);
 *  - after an update the gradients differ from one process's only by the order of FP32 sums (each
 *    rank's partial sum, then the sum of the partials), i.e. ~1e-7 relative, and AdamW carries
 *    that into the weights (it divides small gradient components by their own size): the weights
 *    agree to 5e-5 of the largest weight after a few steps (4e-6 measured), the metrics to
 *    1e-4 relative (they are sums over the ranks of the same per-token terms);
 *  - the ranks' weights are bit-identical to each other (every rank applies the same update).
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include "check_run.h"
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/formats.h"
#include "rl/session.h"

static const char *TINY =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 16, \"hidden_size\": 32, \"intermediate_size\": 64,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"max_position_embeddings\": 32, \"tie_word_embeddings\": true}";

/* ---- an in-process communicator of W threads ---- */
#define MAX_RANKS 4
static struct {
    int world;
    pthread_barrier_t bar;
    void *buf[MAX_RANKS];
    int64_t n[MAX_RANKS];
    fp4rl_reduce_kind kind[MAX_RANKS];
    void *result;
    int mismatch;   /* ranks called different collectives at the same point */
    int calls;      /* collectives so far */
} comm;

static fp4rl_status fake_allreduce(fp4rl_context *ctx, void *buf, int64_t n, fp4rl_reduce_kind kind)
{
    const int r = ctx->rank, W = comm.world;
    comm.buf[r] = buf;
    comm.n[r] = n;
    comm.kind[r] = kind;
    pthread_barrier_wait(&comm.bar);
    if (r == 0) {
        comm.calls++;
        for (int i = 1; i < W; i++)
            if (comm.n[i] != n || comm.kind[i] != kind) comm.mismatch = 1;
        const int f64 = kind == FP4RL_REDUCE_SUM_F64_HOST || kind == FP4RL_REDUCE_MAX_F64_HOST;
        comm.result = malloc((size_t)n * (f64 ? sizeof(double) : sizeof(float)));
        for (int64_t i = 0; !comm.mismatch && i < n; i++) {
            if (f64) {
                double acc = ((double *)comm.buf[0])[i];
                for (int k = 1; k < W; k++) {
                    const double v = ((double *)comm.buf[k])[i];
                    acc = kind == FP4RL_REDUCE_MAX_F64_HOST ? fmax(acc, v) : acc + v;
                }
                ((double *)comm.result)[i] = acc;
            } else if (kind == FP4RL_REDUCE_SUM_F32_BF16) { /* NCCL's BF16 sum: each partial rounded */
                float acc = fp4rl_round_bf16(((float *)comm.buf[0])[i]);
                for (int k = 1; k < W; k++) acc = fp4rl_round_bf16(acc + fp4rl_round_bf16(((float *)comm.buf[k])[i]));
                ((float *)comm.result)[i] = acc;
            } else {
                float acc = ((float *)comm.buf[0])[i];
                for (int k = 1; k < W; k++) acc += ((float *)comm.buf[k])[i];
                ((float *)comm.result)[i] = acc;
            }
        }
    }
    pthread_barrier_wait(&comm.bar);
    const int f64 = kind == FP4RL_REDUCE_SUM_F64_HOST || kind == FP4RL_REDUCE_MAX_F64_HOST;
    if (!comm.mismatch) memcpy(buf, comm.result, (size_t)n * (f64 ? sizeof(double) : sizeof(float)));
    pthread_barrier_wait(&comm.bar);
    if (r == 0) free(comm.result);
    return comm.mismatch ? fp4rl_fail(FP4RL_ERR_INTERNAL, "fake allreduce: ranks disagree on the collective") : FP4RL_OK;
}

static fp4rl_backend fake_backend;

/* A CPU context that is rank r of the fake communicator (world 1: a plain CPU context). */
static fp4rl_context *rank_context(int r, int world)
{
    fp4rl_context *c;
    ck_assert_int_eq(fp4rl_context_create(&c, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    fp4rl_context_set_seed(c, 5);
    if (world > 1) {
        fake_backend = fp4rl_cpu_backend;
        fake_backend.allreduce = fake_allreduce;
        c->be = &fake_backend;
        c->rank = r;
        c->world_size = world;
        c->comm = 1;
    }
    return c;
}

/* ---- one rank's run ---- */
#define N_PROMPTS 6
#define G 4
#define MAX_NEW 4
#define STEPS 3
#define MAX_SEQS (N_PROMPTS * G)

typedef struct run_cfg {
    double loss_agg, minibatches, kl, allreduce_bf16;
    int fail_rank;              /* the reward callback fails on this rank at step 2 (-1: never) */
    const char *ckpt;           /* rank 0 saves here after the steps, every rank loads it, one more step */
} run_cfg;

typedef struct rank_out {
    fp4rl_status st[STEPS + 2];
    char msg[STEPS + 2][512];
    double metrics[STEPS][M_COUNT];
    /* the first rollout: this rank's completions */
    int n_seqs;
    int32_t tok[MAX_SEQS][MAX_NEW];
    float lp[MAX_SEQS][MAX_NEW];
    int64_t len[MAX_SEQS];
    size_t prompt_index[MAX_SEQS];
    size_t calls[MAX_SEQS];       /* the reward callbacks of the second step: their prompt_index */
    int n_calls;
    uint64_t sample_offset;
    float *w;                     /* the final weights */
    float *w_saved;               /* the weights when the checkpoint was saved */
    int64_t nw;
    fp4rl_status after_ckpt;
} rank_out;

typedef struct rank_arg {
    int rank, world;
    const run_cfg *cfg;
    rank_out *out;
    int step; /* the step being run (for the callback) */
} rank_arg;

/* Prompts of different lengths (3..8 tokens); the longest is the last, on the last rank only. */
static void make_prompts(int32_t *tok, size_t *off)
{
    static const int lens[N_PROMPTS] = {3, 5, 4, 3, 6, 8};
    off[0] = 0;
    uint64_t x = 12345;
    for (int p = 0; p < N_PROMPTS; p++) {
        for (int i = 0; i < lens[p]; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            tok[off[p] + (size_t)i] = (int32_t)((x >> 33) % 16);
        }
        off[p + 1] = off[p] + (size_t)lens[p];
    }
}

/* Prefers completions with many 7s (learnable from scratch); records its prompt indices. */
static int sevens(void *user, size_t pi, const int32_t *p, size_t pl, const int32_t *c, size_t cl, double *r)
{
    (void)p; (void)pl;
    rank_arg *a = user;
    if (a->step == 1 && a->out->n_calls < MAX_SEQS) a->out->calls[a->out->n_calls++] = pi;
    if (a->step == 1 && a->rank == a->cfg->fail_rank) return 7;
    double k = 0;
    for (size_t i = 0; i < cl; i++) k += c[i] == 7;
    *r = k / (double)MAX_NEW + 0.01 * (double)(pi % 3);
    return 0;
}

static void *run_rank(void *p)
{
    rank_arg *a = p;
    rank_out *o = a->out;
    const run_cfg *cfg = a->cfg;
    fp4rl_context *c = rank_context(a->rank, a->world);
    fp4rl_quant_policy *pol;
    fp4rl_quant_policy_create(&pol);
    fp4rl_quant_policy_set(pol, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_FP32);
    fp4rl_quant_policy_set(pol, FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_FP32);
    fp4rl_model *m = NULL;
    fp4rl_rl_session *s = NULL;
    fp4rl_status st = fp4rl_model_create(&m, c, TINY, pol, 3);
    if (!st) st = fp4rl_rl_session_create(&s, c, m, pol);
    const int32_t stop = 12;
    if (!st) st = fp4rl_rl_session_set_stop_tokens(s, &stop, 1);
    const double hp[][2] = {{FP4RL_RL_GROUP_SIZE, G}, {FP4RL_RL_MAX_NEW_TOKENS, MAX_NEW}, {FP4RL_RL_LR, 3e-3},
                            {FP4RL_RL_TEMPERATURE, 1.0}, {FP4RL_RL_SEED, 11}, {FP4RL_RL_LOSS_AGG, cfg->loss_agg},
                            {FP4RL_RL_MINIBATCHES, cfg->minibatches}, {FP4RL_RL_KL_COEF, cfg->kl},
                            {FP4RL_RL_ALLREDUCE_BF16, cfg->allreduce_bf16}, {FP4RL_RL_TIS_CAP, 2}};
    for (size_t i = 0; !st && i < sizeof hp / sizeof hp[0]; i++) st = fp4rl_rl_session_set(s, (fp4rl_rlparam)hp[i][0], hp[i][1]);
    ck_assert_msg(st == FP4RL_OK, "rank %d setup: %s", a->rank, fp4rl_last_error());
    int32_t tok[64];
    size_t off[N_PROMPTS + 1];
    make_prompts(tok, off);
    for (int k = 0; k < STEPS; k++) {
        a->step = k;
        if (k == 0) { /* the split API for the first step: the completions are compared */
            st = fp4rl_rl_session_rollout(s, tok, off, N_PROMPTS);
            size_t n = 0;
            if (!st) st = fp4rl_rl_session_num_completions(s, &n);
            o->n_seqs = (int)n;
            double r[MAX_SEQS];
            for (size_t i = 0; !st && i < n; i++) {
                size_t len;
                st = fp4rl_rl_session_completion(s, i, o->tok[i], o->lp[i], MAX_NEW, &len, &o->prompt_index[i]);
                o->len[i] = (int64_t)len;
                if (!st && sevens(a, o->prompt_index[i], NULL, 0, o->tok[i], len, &r[i])) st = FP4RL_ERR_CALLBACK;
            }
            o->sample_offset = s->sample_offset;
            if (!st) st = fp4rl_rl_session_set_rewards(s, r, n);
            if (!st) st = fp4rl_rl_session_train(s);
        } else {
            st = fp4rl_rl_session_step(s, tok, off, N_PROMPTS, sevens, a);
        }
        o->st[k] = st;
        snprintf(o->msg[k], sizeof o->msg[k], "%s", st ? fp4rl_last_error() : "");
        memcpy(o->metrics[k], s->metrics, sizeof s->metrics);
    }
    if (cfg->ckpt) {
        st = a->rank == 0 || a->world > 1 ? fp4rl_rl_session_save(s, cfg->ckpt) : FP4RL_OK;
        o->st[STEPS] = st;
        snprintf(o->msg[STEPS], sizeof o->msg[STEPS], "%s", st ? fp4rl_last_error() : "");
        o->w_saved = malloc((size_t)m->total * sizeof(float));
        memcpy(o->w_saved, m->w, (size_t)m->total * sizeof(float));
        /* every rank trains one step away from the checkpoint, then loads it back */
        a->step = STEPS;
        if (!st) st = fp4rl_rl_session_step(s, tok, off, N_PROMPTS, sevens, a);
        if (!st) st = fp4rl_rl_session_load(s, cfg->ckpt);
        o->after_ckpt = st;
        snprintf(o->msg[STEPS + 1], sizeof o->msg[STEPS + 1], "%s", st ? fp4rl_last_error() : "");
    }
    o->nw = m->total;
    o->w = malloc((size_t)m->total * sizeof(float));
    memcpy(o->w, m->w, (size_t)m->total * sizeof(float)); /* CPU: device memory is host memory */
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_quant_policy_destroy(pol);
    fp4rl_context_destroy(c);
    return NULL;
}

static void run(int world, const run_cfg *cfg, rank_out *out)
{
    memset(out, 0, sizeof(rank_out) * (size_t)world);
    memset(&comm, 0, sizeof comm);
    comm.world = world;
    pthread_barrier_init(&comm.bar, NULL, (unsigned)world);
    pthread_t th[MAX_RANKS];
    rank_arg args[MAX_RANKS];
    for (int r = 0; r < world; r++) {
        args[r] = (rank_arg){r, world, cfg, &out[r], 0};
        ck_assert_int_eq(pthread_create(&th[r], NULL, run_rank, &args[r]), 0);
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&comm.bar);
    ck_assert_msg(!comm.mismatch, "the ranks called different collectives");
}

static void free_out(rank_out *out, int world)
{
    for (int r = 0; r < world; r++) {
        free(out[r].w);
        free(out[r].w_saved);
    }
}

/* Metrics that depend on wall time are not compared. */
/* measurements of this rank's machine: times, and its context's peak memory */
static int timed(int i)
{
    return i == M_ROLLOUT_TPS || i == M_TRAIN_TPS || i == M_TIME_ROLLOUT || i == M_TIME_TRAIN || i == M_TIME_STEP ||
           i == M_PEAK_MEM_GB;
}

static double max_rel_diff(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - (double)b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

/* W ranks against one process on the same global batch. */
static void check_against_one(int world, const run_cfg *cfg)
{
    rank_out one[1], many[MAX_RANKS];
    run(1, cfg, one);
    run(world, cfg, many);
    ck_assert_msg(comm.calls > 0, "no collectives ran");
    for (int k = 0; k < STEPS; k++) {
        ck_assert_msg(one[0].st[k] == FP4RL_OK, "1 rank, step %d: %s", k, one[0].msg[k]);
        for (int r = 0; r < world; r++) ck_assert_msg(many[r].st[k] == FP4RL_OK, "rank %d, step %d: %s", r, k, many[r].msg[k]);
    }
    /* the first rollout: rank r's completions are one process's, in order */
    int seq = 0;
    for (int r = 0; r < world; r++) {
        ck_assert_uint_eq(many[r].sample_offset, one[0].sample_offset);
        for (int i = 0; i < many[r].n_seqs; i++, seq++) {
            ck_assert_int_eq(many[r].len[i], one[0].len[seq]);
            ck_assert_uint_eq(many[r].prompt_index[i], one[0].prompt_index[seq]);
            ck_assert_mem_eq(many[r].tok[i], one[0].tok[seq], (size_t)many[r].len[i] * sizeof(int32_t));
            for (int64_t j = 0; j < many[r].len[i]; j++) ck_assert_float_eq_tol(many[r].lp[i][j], one[0].lp[seq][j], 1e-5f);
        }
    }
    ck_assert_int_eq(seq, one[0].n_seqs);
    /* the reward callbacks of the second step saw global prompt indices: rank r's share */
    for (int r = 0; r < world; r++) {
        const size_t p0 = (size_t)(N_PROMPTS * r / world), p1 = (size_t)(N_PROMPTS * (r + 1) / world);
        ck_assert_int_eq(many[r].n_calls, (int)((p1 - p0) * G));
        for (int i = 0; i < many[r].n_calls; i++) ck_assert(many[r].calls[i] >= p0 && many[r].calls[i] < p1);
    }
    /* every rank reports the same metrics, those of one process up to the order of sums */
    for (int k = 0; k < STEPS; k++)
        for (int i = 0; i < M_COUNT; i++) {
            if (timed(i)) continue;
            const double want = one[0].metrics[k][i];
            for (int r = 0; r < world; r++) {
                const double got = many[r].metrics[k][i];
                ck_assert_msg(got == many[0].metrics[k][i], "step %d %s: rank %d %.17g, rank 0 %.17g", k,
                              fp4rl_rl_session_metric_name((size_t)i), r, got, many[0].metrics[k][i]);
                ck_assert_msg(fabs(got - want) <= 1e-4 * fmax(1.0, fabs(want)), "step %d %s: %d ranks %.9g, 1 rank %.9g", k,
                              fp4rl_rl_session_metric_name((size_t)i), world, got, want);
            }
        }
    /* the weights: bit-identical across the ranks, and those of one process to 1e-5 */
    for (int r = 1; r < world; r++) ck_assert_mem_eq(many[r].w, many[0].w, (size_t)many[0].nw * sizeof(float));
    const double d = max_rel_diff(many[0].w, one[0].w, one[0].nw);
    printf("%d ranks vs 1 (loss_agg %g, kl %g): weights max |diff| / max |w| = %.3g after %d steps, %d collectives\n", world,
           cfg->loss_agg, cfg->kl, d, STEPS, comm.calls);
    ck_assert_msg(d < 5e-5, "weights differ by %.3g", d);
    free_out(one, 1);
    free_out(many, world);
}

START_TEST(test_two_ranks_match_one) { check_against_one(2, &(run_cfg){0, 1, 0, 0, -1, NULL}); }
END_TEST
START_TEST(test_three_ranks_token_mean_kl) { check_against_one(3, &(run_cfg){1, 1, 0.05, 0, -1, NULL}); }
END_TEST

/* Minibatches (every rank's local minibatch b is global minibatch b) and the BF16 all-reduce:
 * not one process's arithmetic, but the ranks stay bit-identical and train. */
START_TEST(test_minibatches_bf16_ranks_identical)
{
    rank_out many[2];
    run(2, &(run_cfg){0, 3, 0, 1, -1, NULL}, many);
    for (int k = 0; k < STEPS; k++)
        for (int r = 0; r < 2; r++) ck_assert_msg(many[r].st[k] == FP4RL_OK, "rank %d step %d: %s", r, k, many[r].msg[k]);
    ck_assert_mem_eq(many[1].w, many[0].w, (size_t)many[0].nw * sizeof(float));
    ck_assert_mem_eq(many[1].metrics[STEPS - 1], many[0].metrics[STEPS - 1], sizeof(double) * M_ROLLOUT_TPS);
    ck_assert(many[0].metrics[STEPS - 1][M_GRAD_NORM] > 0);
    free_out(many, 2);
}
END_TEST

/* A reward callback that fails on one rank stops the step on every rank, the model unchanged;
 * the next step runs again on all of them. */
START_TEST(test_failure_on_one_rank_reaches_all)
{
    rank_out ok[2], bad[2];
    run(2, &(run_cfg){0, 1, 0, 0, -1, NULL}, ok);
    run(2, &(run_cfg){0, 1, 0, 0, 1, NULL}, bad);
    for (int r = 0; r < 2; r++) {
        ck_assert_int_eq(bad[r].st[0], FP4RL_OK);
        ck_assert_int_eq(bad[r].st[1], FP4RL_ERR_CALLBACK);
        ck_assert_int_eq(bad[r].st[2], FP4RL_OK);
    }
    ck_assert_ptr_nonnull(strstr(bad[1].msg[1], "reward callback returned 7"));
    ck_assert_msg(strstr(bad[0].msg[1], "rank 1 of 2 failed with FP4RL_ERR_CALLBACK"), "%s", bad[0].msg[1]);
    ck_assert_mem_eq(bad[1].w, bad[0].w, (size_t)bad[0].nw * sizeof(float));
    /* one step fewer was trained than in the run without the failure */
    ck_assert(memcmp(bad[0].w, ok[0].w, (size_t)ok[0].nw * sizeof(float)) != 0);
    free_out(ok, 2);
    free_out(bad, 2);
}
END_TEST

/* Rank 0 writes the checkpoint, every rank loads it; the ranks stay identical. */
START_TEST(test_checkpoint_rank0_writes_all_load)
{
    char dir[] = "/tmp/fp4rl_dist_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    rank_out many[2];
    run(2, &(run_cfg){0, 1, 0, 0, -1, ck}, many);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(many[r].st[STEPS] == FP4RL_OK, "rank %d save: %s", r, many[r].msg[STEPS]);
        ck_assert_msg(many[r].after_ckpt == FP4RL_OK, "rank %d: %s", r, many[r].msg[STEPS + 1]);
    }
    /* the loaded weights are those of the checkpoint, the same on both ranks */
    for (int r = 0; r < 2; r++) ck_assert_mem_eq(many[r].w, many[0].w_saved, (size_t)many[0].nw * sizeof(float));
    char path[700];
    snprintf(path, sizeof path, "%s/state.json", ck);
    ck_assert_int_eq(access(path, R_OK), 0);
    /* a failed save on rank 0 (its directory cannot be created) is every rank's failure */
    free_out(many, 2);
    run(2, &(run_cfg){0, 1, 0, 0, -1, "/nonexistent-dir/ckpt"}, many);
    for (int r = 0; r < 2; r++) ck_assert_int_eq(many[r].st[STEPS], FP4RL_ERR_IO);
    ck_assert_msg(strstr(many[1].msg[STEPS], "rank 0 of 2 failed with FP4RL_ERR_IO"), "%s", many[1].msg[STEPS]);
    free_out(many, 2);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Fewer prompts than ranks: every rank refuses, none waits for the others. */
static void *too_few(void *p)
{
    rank_arg *a = p;
    fp4rl_context *c = rank_context(a->rank, a->world);
    fp4rl_model *m;
    fp4rl_rl_session *s;
    ck_assert_int_eq(fp4rl_model_create(&m, c, TINY, NULL, 1), FP4RL_OK);
    ck_assert_int_eq(fp4rl_rl_session_create(&s, c, m, NULL), FP4RL_OK);
    fp4rl_rl_session_set(s, FP4RL_RL_MAX_NEW_TOKENS, 2);
    const int32_t tok[1] = {3};
    const size_t off[2] = {0, 1};
    a->out->st[0] = fp4rl_rl_session_step(s, tok, off, 1, sevens, a);
    snprintf(a->out->msg[0], sizeof a->out->msg[0], "%s", fp4rl_last_error());
    fp4rl_rl_session_destroy(s);
    fp4rl_model_destroy(m);
    fp4rl_context_destroy(c);
    return NULL;
}

START_TEST(test_fewer_prompts_than_ranks)
{
    rank_out out[2];
    memset(out, 0, sizeof out);
    memset(&comm, 0, sizeof comm);
    comm.world = 2;
    pthread_barrier_init(&comm.bar, NULL, 2);
    pthread_t th[2];
    rank_arg args[2];
    for (int r = 0; r < 2; r++) {
        args[r] = (rank_arg){r, 2, NULL, &out[r], 0};
        pthread_create(&th[r], NULL, too_few, &args[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&comm.bar);
    for (int r = 0; r < 2; r++) {
        ck_assert_int_eq(out[r].st[0], FP4RL_ERR_INVALID_ARGUMENT);
        ck_assert_msg(strstr(out[r].msg[0], "1 prompts for 2 ranks"), "%s", out[r].msg[0]);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dist_cpu");
    TCase *tc = tcase_create("dist_cpu");
    tcase_add_test(tc, test_two_ranks_match_one);
    tcase_add_test(tc, test_three_ranks_token_mean_kl);
    tcase_add_test(tc, test_minibatches_bf16_ranks_identical);
    tcase_add_test(tc, test_failure_on_one_rank_reaches_all);
    tcase_add_test(tc, test_checkpoint_rank0_writes_all_load);
    tcase_add_test(tc, test_fewer_prompts_than_ranks);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
