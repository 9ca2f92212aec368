/*
 * rollout.c - the rollout engine (recipes.md section 3, steps 1-2).
 *
 * All sequences advance in lockstep, one position per decode step: a sequence still inside its
 * prompt is fed its next prompt token (its prompt is "prefilled" through the same decode path),
 * the others are fed the token they sampled. One path for prompts of any length, and the KV
 * cache is written at the same position for every row.
 */
#include <stdlib.h>
#include <string.h>

#include "rollout.h"

fp4rl_status fp4rl_rollout_linear(fp4rl_model *m, fp4rl_arena *a, const fp4rl_linear_spec *s, int resq, float *y,
                                  float *x, const float *wq, const float *b, int64_t N, int64_t IN, int64_t OUT,
                                  float *counts)
{
    fp4rl_context *ctx = m->ctx;
    const fp4rl_ops *ops = m->ops;
    const fp4rl_role X = FP4RL_ROLE_ACTIVATION;
    float *xq = x;
    fp4rl_status st = FP4RL_OK;
    if (s->mode[X] != FP4RL_NUM_FP32) {
        xq = fp4rl_arena_f32(a, N * IN);
        if (a->st) return a->st;
        st = fp4rl_linear_operand(m, a, xq, x, N, IN, s, X, 0);
        if (!st && s->mode[X] == FP4RL_NUM_FP4 && counts) st = ops->underflow_count(ctx, counts, x, xq, N * IN);
    }
    if (!st) st = ops->linear_forward(ctx, y, xq, wq, b, N, IN, OUT);
    if (st || !resq || s->mode[X] != FP4RL_NUM_FP4) return st;
    /* ResQ: R = X - Xq over the whole activation, re-quantized with fresh scales, masked, and
     * multiplied by the same quantized weights */
    float *r = fp4rl_arena_f32(a, N * IN), *neg = fp4rl_arena_zeros(a, N * IN), *rq = fp4rl_arena_f32(a, N * IN);
    float *y2 = fp4rl_arena_f32(a, N * OUT);
    if (a->st) return a->st;
    if (!st) st = ops->residual_backward(ctx, neg, r, xq, N * IN); /* r := xq (r is scratch here) */
    if (!st) st = ops->scale(ctx, neg, N * IN, -1.0f);             /* neg = -xq */
    if (!st) st = ops->residual_forward(ctx, r, x, neg, N * IN);    /* r = x - xq */
    if (!st) st = fp4rl_linear_operand(m, a, rq, r, N, IN, s, X, 0);
    if (!st) st = ops->resq_mask(ctx, rq, N, IN, resq);
    if (!st) st = ops->linear_forward(ctx, y2, rq, wq, NULL, N, IN, OUT);
    if (!st) st = ops->residual_forward(ctx, y, y, y2, N * OUT);
    return st;
}

void fp4rl_rollout_result_free(fp4rl_rollout_result *res)
{
    free(res->tokens);
    free(res->logprobs);
    free(res->lengths);
    free(res->stopped);
    memset(res, 0, sizeof *res);
}

enum { R_Q, R_K, R_V, R_O, R_GATE, R_UP, R_DOWN, R_COUNT };
static const int weight_of[R_COUNT] = {FP4RL_LP_Q_W, FP4RL_LP_K_W, FP4RL_LP_V_W, FP4RL_LP_O_W,
                                       FP4RL_LP_GATE_W, FP4RL_LP_UP_W, FP4RL_LP_DOWN_W};

static int is_stop(const fp4rl_rollout_cfg *cfg, int32_t tok)
{
    for (int64_t i = 0; i < cfg->n_stop; i++)
        if (cfg->stop[i] == tok) return 1;
    return 0;
}

fp4rl_status fp4rl_rollout_run(fp4rl_model *m, const fp4rl_rollout_cfg *cfg, const int32_t *prompts,
                               const size_t *offsets, size_t n_prompts, fp4rl_rollout_result *res)
{
    fp4rl_context *ctx = m->ctx;
    const fp4rl_ops *ops = m->ops;
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t B = (int64_t)n_prompts * cfg->group, G = cfg->group, C = c->hidden_size, I = c->intermediate_size;
    const int64_t V = c->vocab_size, L = c->num_hidden_layers, Hq = c->num_attention_heads, Hkv = c->num_key_value_heads;
    const int64_t D = c->head_dim, QD = Hq * D, KD = Hkv * D;
    const float eps = (float)c->rms_norm_eps, theta = (float)c->rope_theta;
    const int resq = (int)fp4rl_policy_value(m->policy, FP4RL_QP_RESQ);
    int64_t max_plen = 0;
    for (size_t p = 0; p < n_prompts; p++)
        if ((int64_t)(offsets[p + 1] - offsets[p]) > max_plen) max_plen = (int64_t)(offsets[p + 1] - offsets[p]);
    const int64_t Tmax = max_plen + cfg->max_new;

    memset(res, 0, sizeof *res);
    res->n_seqs = B;
    res->max_new = cfg->max_new;
    res->tokens = calloc((size_t)(B * cfg->max_new), sizeof(int32_t));
    res->logprobs = calloc((size_t)(B * cfg->max_new), sizeof(float));
    res->lengths = calloc((size_t)B, sizeof(int64_t));
    res->stopped = calloc((size_t)B, sizeof(int));
    int32_t *cur = malloc((size_t)B * sizeof(int32_t)), *pos = malloc((size_t)B * sizeof(int32_t));
    int32_t *sampled = malloc((size_t)B * sizeof(int32_t));
    float *slogp = malloc((size_t)B * sizeof(float)), *hcounts = calloc((size_t)(L * R_COUNT * 2), sizeof(float));
    int *done = calloc((size_t)B, sizeof(int));
    fp4rl_arena keep = {.ctx = ctx}, step = {.ctx = ctx};
    fp4rl_status st = FP4RL_OK;
    if (!res->tokens || !res->logprobs || !res->lengths || !res->stopped || !cur || !pos || !sampled || !slogp ||
        !hcounts || !done) {
        st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "rollout: out of host memory");
        goto out;
    }

    /* 1. sync: the rollout copy of every weight, from the FP32 master weights */
    fp4rl_linear_spec s_qk = fp4rl_block_linear_spec(m, 1, 1), s_blk = fp4rl_block_linear_spec(m, 0, 1);
    fp4rl_linear_spec s_head = fp4rl_head_linear_spec(m, 1);
    float **wq = calloc((size_t)(L * R_COUNT + 1), sizeof(float *));
    if (!wq) {
        st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "rollout: out of host memory");
        goto out;
    }
    for (int64_t l = 0; l < L && !st; l++)
        for (int r = 0; r < R_COUNT && !st; r++) {
            const fp4rl_param *p = &m->params[fp4rl_model_lp((int)l, weight_of[r])];
            const fp4rl_linear_spec *s = r <= R_K ? &s_qk : &s_blk;
            float *w = m->w + p->offset;
            wq[l * R_COUNT + r] = w;
            if (s->mode[FP4RL_ROLE_WEIGHT] == FP4RL_NUM_FP32) continue;
            wq[l * R_COUNT + r] = fp4rl_arena_f32(&keep, p->numel);
            st = keep.st ? keep.st
                         : fp4rl_linear_operand(m, &keep, wq[l * R_COUNT + r], w, p->dims[0], p->dims[1], s,
                                                FP4RL_ROLE_WEIGHT, 0);
        }
    float *head = fp4rl_model_w(m, fp4rl_model_p_head(m));
    float *whead = head;
    if (!st && s_head.mode[FP4RL_ROLE_WEIGHT] != FP4RL_NUM_FP32) {
        whead = fp4rl_arena_f32(&keep, V * C);
        st = keep.st ? keep.st : fp4rl_linear_operand(m, &keep, whead, head, V, C, &s_head, FP4RL_ROLE_WEIGHT, 0);
    }
    /* the KV cache and per-step buffers */
    float **kc = calloc((size_t)L, sizeof(float *)), **vc = calloc((size_t)L, sizeof(float *));
    float *counts = fp4rl_arena_zeros(&keep, L * R_COUNT * 2);
    int32_t *d_tok = fp4rl_arena_alloc(&keep, B, 4), *d_pos = fp4rl_arena_alloc(&keep, B, 4), *d_samp = fp4rl_arena_alloc(&keep, B, 4);
    float *d_slogp = fp4rl_arena_f32(&keep, B);
    for (int64_t l = 0; l < L && kc && vc; l++) {
        kc[l] = fp4rl_arena_f32(&keep, B * Tmax * KD);
        vc[l] = fp4rl_arena_f32(&keep, B * Tmax * KD);
    }
    if (!st && (keep.st || !kc || !vc)) st = keep.st ? keep.st : fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "rollout: out of memory");

    /* 2. decode in lockstep */
    for (int64_t t = 0; !st && t + 1 < Tmax; t++) {
        int64_t active = 0;
        for (int64_t b = 0; b < B; b++) {
            const int32_t *pr = prompts + offsets[b / G];
            const int64_t plen = (int64_t)(offsets[b / G + 1] - offsets[b / G]);
            cur[b] = t < plen ? pr[t] : (res->lengths[b] ? res->tokens[b * cfg->max_new + res->lengths[b] - 1] : 0);
            pos[b] = (int32_t)t;
            active += !done[b];
        }
        if (!active) break;
        res->decode_steps++;
        float *x = fp4rl_arena_f32(&step, B * C), *ln = fp4rl_arena_f32(&step, B * C);
        float *rstd = fp4rl_arena_f32(&step, B), *q = fp4rl_arena_f32(&step, B * QD), *k = fp4rl_arena_f32(&step, B * KD);
        float *v = fp4rl_arena_f32(&step, B * KD), *att = fp4rl_arena_f32(&step, B * QD), *o = fp4rl_arena_f32(&step, B * C);
        float *x1 = fp4rl_arena_f32(&step, B * C), *gate = fp4rl_arena_f32(&step, B * I), *up = fp4rl_arena_f32(&step, B * I);
        float *h = fp4rl_arena_f32(&step, B * I), *logits = fp4rl_arena_f32(&step, B * V);
        if (step.st) {
            st = step.st;
            break;
        }
#define TRY(call) do { if ((st = (call)) != FP4RL_OK) goto step_end; } while (0)
#define W(l, k) fp4rl_model_w(m, fp4rl_model_lp((int)(l), k))
#define LIN(s, r, y, xin, bias, IN, OUT) \
    fp4rl_rollout_linear(m, &step, s, resq, y, xin, wq[l * R_COUNT + (r)], bias, B, IN, OUT, counts + (l * R_COUNT + (r)) * 2)
        TRY(ctx->be->upload(ctx, d_tok, cur, (size_t)B * 4));
        TRY(ctx->be->upload(ctx, d_pos, pos, (size_t)B * 4));
        TRY(ops->embedding_forward(ctx, x, d_tok, fp4rl_model_w(m, fp4rl_model_p_embed()), B, V, C));
        for (int64_t l = 0; l < L; l++) {
            TRY(ops->rmsnorm_forward(ctx, ln, rstd, x, W(l, FP4RL_LP_LN1), B, C, eps));
            TRY(LIN(&s_qk, R_Q, q, ln, W(l, FP4RL_LP_Q_B), C, QD));
            TRY(LIN(&s_qk, R_K, k, ln, W(l, FP4RL_LP_K_B), C, KD));
            TRY(LIN(&s_blk, R_V, v, ln, W(l, FP4RL_LP_V_B), C, KD));
            TRY(ops->rope_forward(ctx, q, q, d_pos, B, Hq, D, theta));
            TRY(ops->rope_forward(ctx, k, k, d_pos, B, Hkv, D, theta));
            TRY(ops->kv_write(ctx, kc[l], k, B, Tmax, KD, t));
            TRY(ops->kv_write(ctx, vc[l], v, B, Tmax, KD, t));
            TRY(ops->attention_decode(ctx, att, q, kc[l], vc[l], B, Tmax, t + 1, Hq, Hkv, D));
            TRY(LIN(&s_blk, R_O, o, att, NULL, QD, C));
            TRY(ops->residual_forward(ctx, x1, x, o, B * C));
            TRY(ops->rmsnorm_forward(ctx, ln, rstd, x1, W(l, FP4RL_LP_LN2), B, C, eps));
            TRY(LIN(&s_blk, R_GATE, gate, ln, NULL, C, I));
            TRY(LIN(&s_blk, R_UP, up, ln, NULL, C, I));
            TRY(ops->swiglu_forward(ctx, h, gate, up, B * I));
            TRY(LIN(&s_blk, R_DOWN, o, h, NULL, I, C));
            TRY(ops->residual_forward(ctx, x, x1, o, B * C));
        }
        TRY(ops->rmsnorm_forward(ctx, ln, rstd, x, fp4rl_model_w(m, fp4rl_model_p_norm(m)), B, C, eps));
        {
            float *lq = ln;
            if (s_head.mode[FP4RL_ROLE_ACTIVATION] == FP4RL_NUM_BF16) TRY(ops->round_bf16(ctx, lq, ln, B * C));
            TRY(ops->linear_forward(ctx, logits, lq, whead, NULL, B, C, V));
        }
        TRY(ops->sample_rows(ctx, d_samp, d_slogp, logits, B, V, cfg->temperature, cfg->top_k, cfg->seed, cfg->offset + (uint64_t)t, cfg->row0));
        TRY(ctx->be->download(ctx, sampled, d_samp, (size_t)B * 4));
        TRY(ctx->be->download(ctx, slogp, d_slogp, (size_t)B * 4));
        for (int64_t b = 0; b < B; b++) {
            const int64_t plen = (int64_t)(offsets[b / G + 1] - offsets[b / G]);
            if (done[b] || t + 1 < plen) continue; /* still prefilling the prompt */
            const int64_t n = res->lengths[b]++;
            res->tokens[b * cfg->max_new + n] = sampled[b];
            res->logprobs[b * cfg->max_new + n] = slogp[b];
            if (is_stop(cfg, sampled[b])) {
                res->stopped[b] = 1;
                done[b] = 1;
            } else if (n + 1 == cfg->max_new) {
                done[b] = 1;
            }
        }
    step_end:
        fp4rl_arena_free(&step);
#undef TRY
#undef W
#undef LIN
    }
    res->offset_end = cfg->offset + (uint64_t)(Tmax > 0 ? Tmax - 1 : 0);
    if (!st) st = ctx->be->download(ctx, hcounts, counts, (size_t)(L * R_COUNT * 2) * sizeof(float));
    if (!st) { /* the mean over linear layers of each one's underflow fraction */
        double sum = 0;
        int64_t layers = 0;
        for (int64_t i = 0; i < L * R_COUNT; i++)
            if (hcounts[2 * i] > 0) {
                sum += (double)hcounts[2 * i + 1] / hcounts[2 * i];
                layers++;
            }
        res->act_zero_frac = layers ? sum / (double)layers : 0.0;
    }
    free(kc);
    free(vc);
    free(wq);
out:
    fp4rl_arena_free(&step);
    fp4rl_arena_free(&keep);
    free(cur);
    free(pos);
    free(sampled);
    free(slogp);
    free(hcounts);
    free(done);
    if (st) fp4rl_rollout_result_free(res);
    return st;
}
