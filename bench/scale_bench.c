/*
 * scale_bench.c - one GRPO configuration of issue 13's scale benchmark, through the public ABI:
 * a Qwen2 model from an HF config.json (random init), P random prompts of L tokens (fixed seed,
 * ids < min(1000, vocab)), G completions of exactly N tokens each (no stop tokens), a reward that
 * varies within a group (the fraction of even token ids) so GRPO has a signal, S steps of
 * fp4rl_rl_session_step (the first is a warm-up; the last is reported; 0 steps only creates the
 * model). Prints one JSON line.
 * The PyTorch + HF reference of the same shapes is bench/scale_torch.py; bench/device_scale.sh
 * runs both.
 *   fp4rl_scale_bench CONFIG.json [--numerics bf16|hif4] [--prompts P] [--group G]
 *                     [--prompt-len L] [--new-tokens N] [--steps S] [--cpu] [--train-only | --rollout-only]
 *                     [--moments fp32|bf16]
 * --train-only: no rollout; each step is the trainer's work on P*G random sequences of L + N
 * tokens through the model ABI: their log-probs (log pi_old) and one supervised train step
 * (forward, backward, AdamW). What to profile the trainer with (tools/kprof.cpp).
 * --rollout-only: each step is fp4rl_rl_session_rollout alone (weight sync, prefill, decode); what
 * to profile the rollout engine with. After the steps, one more rollout of a single new token
 * gives prefill_s (weight sync, the batched prefill of the P prompts, which the G completions of a
 * prompt share, and the first sampled token) and prefill_tok_s = P * L / prefill_s.
 * --moments bf16: AdamW moments in BF16 (FP4RL_MP_OPTIMIZER_MOMENTS = 1, set right after the
 * model is made; bench/RESULTS.md "7B on one H200: memory budget").
 * A failing call is a result, not a crash: the line then has "ok": false, the status and the
 * library's message, and the exit status is still 0 (2 only for bad command-line arguments).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fp4rl/fp4rl.h>

/* Added to the ABI by another branch; weak so that this program also links (and prints null)
 * against a library without it. */
fp4rl_status fp4rl_context_memory(const fp4rl_context *ctx, size_t *in_use, size_t *peak, size_t *reserved)
    __attribute__((weak));

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Reward: the fraction of even token ids in the completion. */
static int even_reward(void *user, size_t prompt_index, const int32_t *prompt, size_t prompt_len,
                       const int32_t *completion, size_t completion_len, double *reward)
{
    (void)user, (void)prompt_index, (void)prompt, (void)prompt_len;
    size_t even = 0;
    for (size_t i = 0; i < completion_len; i++) even += (completion[i] % 2) == 0;
    *reward = completion_len ? (double)even / (double)completion_len : 0.0;
    return 0;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) != NULL) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        } else {
            buf[n] = '\0';
        }
    }
    fclose(f);
    return buf;
}

/* The model's name: the config file's base name without ".json" (or its folder's name for a
 * file called config.json). */
static void model_name(const char *path, char *out, size_t cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (!strcmp(base, "config.json") && base > path + 1) {
        const char *dir_end = base - 1, *dir = dir_end;
        while (dir > path && dir[-1] != '/') dir--;
        n = (size_t)(dir_end - dir);
        base = dir;
    } else if (n > 5 && !strcmp(base + n - 5, ".json")) {
        n -= 5;
    }
    if (n >= cap) n = cap - 1;
    memcpy(out, base, n);
    out[n] = '\0';
}

/* A JSON string of s (quotes, backslashes and control characters escaped). */
static void print_json_string(const char *s)
{
    putchar('"');
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void print_num(const char *key, double v, int have)
{
    if (have) printf(", \"%s\": %.6g", key, v);
    else printf(", \"%s\": null", key);
}

typedef struct result {
    char model[256];
    const char *numerics, *device, *moments;
    size_t prompts, group, prompt_len, new_tokens;
    int steps;
    double create_s, rollout_s, train_s, step_s, reward_mean, prefill_s;
    int have_create, have_step, have_mem, have_prefill;
    size_t mem_in_use, mem_peak, mem_reserved;
    const char *failed_call; /* NULL when everything succeeded */
    fp4rl_status status;
    char error[1024];
} result;

static void print_result(const result *r)
{
    const double gb = 1024.0 * 1024.0 * 1024.0;
    const double seqs = (double)r->prompts * (double)r->group;
    printf("{\"impl\": \"fp4rl\", \"model\": ");
    print_json_string(r->model);
    printf(", \"numerics\": \"%s\", \"moments\": \"%s\", \"device\": \"%s\", \"ok\": %s", r->numerics, r->moments,
           r->device, r->failed_call ? "false" : "true");
    printf(", \"prompts\": %zu, \"group\": %zu, \"batch\": %.0f, \"prompt_len\": %zu, \"new_tokens\": %zu, \"steps\": %d",
           r->prompts, r->group, seqs, r->prompt_len, r->new_tokens, r->steps);
    print_num("create_s", r->create_s, r->have_create);
    print_num("rollout_s", r->rollout_s, r->have_step);
    print_num("train_s", r->train_s, r->have_step);
    print_num("step_s", r->step_s, r->have_step);
    print_num("rollout_tok_s", seqs * (double)r->new_tokens / r->rollout_s, r->have_step && r->rollout_s > 0);
    print_num("train_tok_s", seqs * (double)(r->prompt_len + r->new_tokens) / r->train_s,
              r->have_step && r->train_s > 0);
    print_num("prefill_s", r->prefill_s, r->have_prefill);
    print_num("prefill_tok_s", (double)r->prompts * (double)r->prompt_len / r->prefill_s, r->have_prefill && r->prefill_s > 0);
    print_num("reward_mean", r->reward_mean, r->have_step);
    print_num("peak_mem_gb", (double)r->mem_peak / gb, r->have_mem);
    print_num("reserved_mem_gb", (double)r->mem_reserved / gb, r->have_mem);
    if (r->failed_call) {
        printf(", \"failed_call\": \"%s\", \"status\": \"%s\", \"error\": ", r->failed_call,
               fp4rl_status_name(r->status));
        print_json_string(r->error);
    }
    printf("}\n");
    fflush(stdout);
}

/* Records the first failure of `call` in r and jumps to the report. */
#define TRY(r, call)                                                                                \
    do {                                                                                            \
        fp4rl_status st_ = (call);                                                                  \
        if (st_ != FP4RL_OK) {                                                                      \
            (r)->failed_call = #call;                                                               \
            (r)->status = st_;                                                                      \
            snprintf((r)->error, sizeof((r)->error), "%s", fp4rl_last_error());                    \
            goto report;                                                                            \
        }                                                                                           \
    } while (0)

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s CONFIG.json [--numerics bf16|hif4] [--prompts P] [--group G] [--prompt-len L]\n"
            "       [--new-tokens N] [--steps S] [--cpu] [--train-only | --rollout-only] [--moments fp32|bf16]\n",
            argv0);
    return 2;
}

static int parse_size(const char *s, size_t *out)
{
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (!end || *end || v <= 0) return -1;
    *out = (size_t)v;
    return 0;
}

int main(int argc, char **argv)
{
    result r = {.numerics = "bf16", .moments = "fp32", .prompts = 16, .group = 8, .prompt_len = 128, .new_tokens = 256, .steps = 2};
    const char *config_path = NULL;
    int cpu = 0, train_only = 0, rollout_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        size_t steps = 0;
        if (!strcmp(a, "--cpu")) cpu = 1;
        else if (!strcmp(a, "--train-only")) train_only = 1;
        else if (!strcmp(a, "--rollout-only")) rollout_only = 1;
        else if (!strcmp(a, "--numerics") && v && (!strcmp(v, "bf16") || !strcmp(v, "hif4"))) r.numerics = argv[++i];
        else if (!strcmp(a, "--moments") && v && (!strcmp(v, "fp32") || !strcmp(v, "bf16"))) r.moments = argv[++i];
        else if (!strcmp(a, "--prompts") && v && !parse_size(v, &r.prompts)) i++;
        else if (!strcmp(a, "--group") && v && !parse_size(v, &r.group)) i++;
        else if (!strcmp(a, "--prompt-len") && v && !parse_size(v, &r.prompt_len)) i++;
        else if (!strcmp(a, "--new-tokens") && v && !parse_size(v, &r.new_tokens)) i++;
        else if (!strcmp(a, "--steps") && v && (!strcmp(v, "0") || !parse_size(v, &steps)) && steps < 1000)
            r.steps = (int)steps, i++; /* 0: only create the model (its time and memory) */
        else if (a[0] != '-' && !config_path) config_path = a;
        else return usage(argv[0]);
    }
    if (!config_path) return usage(argv[0]);
    model_name(config_path, r.model, sizeof(r.model));
    r.device = cpu ? "cpu" : "cuda";

    fp4rl_context *ctx = NULL;
    fp4rl_quant_policy *policy = NULL;
    fp4rl_model *model = NULL;
    fp4rl_rl_session *sess = NULL;
    int32_t *prompts = NULL, *seqs = NULL;
    float *logp = NULL;
    size_t *offsets = NULL;
    char *config = read_text(config_path);
    if (!config) {
        r.failed_call = "read_text(config_path)";
        r.status = FP4RL_ERR_IO;
        snprintf(r.error, sizeof(r.error), "cannot read %s", config_path);
        goto report;
    }

    TRY(&r, fp4rl_context_create(&ctx, cpu ? FP4RL_DEVICE_CPU : FP4RL_DEVICE_CUDA, 0));
    TRY(&r, fp4rl_quant_policy_create(&policy));
    if (!strcmp(r.numerics, "hif4")) {
        TRY(&r, fp4rl_quant_policy_apply_preset(policy, FP4RL_PRESET_HIF4_RL));
    } else {
        TRY(&r, fp4rl_quant_policy_set(policy, FP4RL_QP_TRAIN_NUMERICS, FP4RL_NUMERICS_BF16));
        TRY(&r, fp4rl_quant_policy_set(policy, FP4RL_QP_ROLLOUT_NUMERICS, FP4RL_NUMERICS_BF16));
    }
    const double t0 = now();
    TRY(&r, fp4rl_model_create(&model, ctx, config, policy, 1234));
    if (!strcmp(r.moments, "bf16")) { /* the conversion holds both copies for a moment: the peak counts from after it */
        TRY(&r, fp4rl_model_set_hparam(model, FP4RL_MP_OPTIMIZER_MOMENTS, 1));
        TRY(&r, fp4rl_context_reset_peak_memory(ctx));
    }
    r.create_s = now() - t0;
    r.have_create = 1;

    int64_t vocab = 0;
    TRY(&r, fp4rl_model_get_info(model, FP4RL_MI_VOCAB_SIZE, &vocab));
    const uint64_t id_range = vocab < 1000 ? (uint64_t)vocab : 1000u;
    prompts = malloc(sizeof(int32_t) * r.prompts * r.prompt_len);
    offsets = malloc(sizeof(size_t) * (r.prompts + 1));
    if (!prompts || !offsets) {
        r.failed_call = "malloc(prompts)";
        r.status = FP4RL_ERR_OUT_OF_MEMORY;
        snprintf(r.error, sizeof(r.error), "out of host memory for the prompts");
        goto report;
    }
    uint64_t x = 0x9E3779B97F4A7C15ull; /* xorshift64: fixed prompts for every run */
    for (size_t i = 0; i < r.prompts * r.prompt_len; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        prompts[i] = (int32_t)(x % id_range);
    }
    for (size_t p = 0; p <= r.prompts; p++) offsets[p] = p * r.prompt_len;

    if (train_only) { /* the trainer alone: log pi_old and one forward + backward + AdamW per step */
        const size_t B = r.prompts * r.group, T = r.prompt_len + r.new_tokens;
        seqs = malloc(sizeof(int32_t) * B * T);
        logp = malloc(sizeof(float) * B * T);
        if (!seqs || !logp) {
            r.failed_call = "malloc(seqs)";
            r.status = FP4RL_ERR_OUT_OF_MEMORY;
            snprintf(r.error, sizeof(r.error), "out of host memory for the sequences");
            goto report;
        }
        for (size_t i = 0; i < B * T; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            seqs[i] = (int32_t)(x % id_range);
        }
        for (int s = 0; s < r.steps; s++) {
            const double ts = now();
            double loss = 0;
            TRY(&r, fp4rl_model_token_logprobs(model, seqs, NULL, (int64_t)B, (int64_t)T, logp, sizeof(float) * B * T));
            TRY(&r, fp4rl_model_train_step(model, seqs, NULL, NULL, (int64_t)B, (int64_t)T, &loss, NULL));
            r.train_s = r.step_s = now() - ts;
            r.rollout_s = 0;
            r.have_step = 1;
        }
        goto report;
    }

    TRY(&r, fp4rl_rl_session_create(&sess, ctx, model, NULL));
    TRY(&r, fp4rl_rl_session_set(sess, FP4RL_RL_GROUP_SIZE, (double)r.group));
    TRY(&r, fp4rl_rl_session_set(sess, FP4RL_RL_MAX_NEW_TOKENS, (double)r.new_tokens));
    TRY(&r, fp4rl_rl_session_set_stop_tokens(sess, NULL, 0));
    for (int s = 0; rollout_only && s < r.steps; s++) {
        const double ts = now();
        TRY(&r, fp4rl_rl_session_rollout(sess, prompts, offsets, r.prompts));
        r.rollout_s = r.step_s = now() - ts;
        r.train_s = 0;
        r.have_step = 1;
    }
    if (rollout_only && r.steps > 0) { /* the prefill's share: a rollout of one new token (warm: after the steps) */
        TRY(&r, fp4rl_rl_session_set(sess, FP4RL_RL_MAX_NEW_TOKENS, 1.0));
        const double ts = now();
        TRY(&r, fp4rl_rl_session_rollout(sess, prompts, offsets, r.prompts));
        r.prefill_s = now() - ts;
        r.have_prefill = 1;
        TRY(&r, fp4rl_rl_session_set(sess, FP4RL_RL_MAX_NEW_TOKENS, (double)r.new_tokens));
    }
    for (int s = 0; !rollout_only && s < r.steps; s++) {
        const double ts = now();
        TRY(&r, fp4rl_rl_session_step(sess, prompts, offsets, r.prompts, even_reward, NULL));
        r.step_s = now() - ts;
        TRY(&r, fp4rl_rl_session_metric(sess, "time/rollout_s", &r.rollout_s));
        TRY(&r, fp4rl_rl_session_metric(sess, "time/train_s", &r.train_s));
        TRY(&r, fp4rl_rl_session_metric(sess, "reward/mean", &r.reward_mean));
        r.have_step = 1;
    }

report:
    if (ctx && fp4rl_context_memory &&
        fp4rl_context_memory(ctx, &r.mem_in_use, &r.mem_peak, &r.mem_reserved) == FP4RL_OK)
        r.have_mem = 1;
    print_result(&r);
    fp4rl_rl_session_destroy(sess);
    fp4rl_model_destroy(model);
    fp4rl_quant_policy_destroy(policy);
    fp4rl_context_destroy(ctx);
    free(prompts);
    free(seqs);
    free(logp);
    free(offsets);
    free(config);
    return 0;
}
