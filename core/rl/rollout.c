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

#include "format/qdq_block.h"
#include "rl/rollout.h"

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
    float *r = fp4rl_arena_f32(a, N * IN), *rq = fp4rl_arena_f32(a, N * IN);
    float *y2 = fp4rl_arena_f32(a, N * OUT);
    if (a->st) return a->st;
    if (!st) st = ops->sub(ctx, r, x, xq, N * IN); /* r = x - xq */
    if (!st) st = fp4rl_linear_operand(m, a, rq, r, N, IN, s, X, 0);
    if (!st) st = ops->resq_mask(ctx, rq, N, IN, resq);
    if (!st) st = ops->linear_forward(ctx, y2, rq, wq, NULL, N, IN, OUT);
    if (!st) st = ops->residual_forward(ctx, y, y, y2, N * OUT);
    return st;
}

/* ---- the fused path: one activation kernel and one BF16 GEMM per linear ----
 * Taken when both GEMM operands are exactly BF16-representable and the activation's quantization
 * needs no statistic across rows: weights BF16 or MXFP4 / HiF4 (any tiles), activations BF16 or
 * MXFP4 / HiF4 in 1D blocks with round-to-nearest, ResQ off, dense or 2:4. The products are then
 * those of the generic path (dequantized operands in an FP32 GEMM), only summed in another order;
 * ResQ's two GEMMs become one over [Q(x) | S(Q(R))] and [Wq | Wq]. Anything else (FP32 numerics,
 * NVFP4's tensor scale, MXFP8's possible BF16 subnormals, 2D activation tiles, stochastic
 * activations, channel-50 / block-50) runs the generic fp4rl_rollout_linear. */
typedef struct fast_plan {
    int on;
    int fmt;  /* activation: FP4RL_QDQ_* or -1 for BF16 */
    int tf;   /* truncation-free MX scales */
    int resq; /* FP4RL_RESQ_OFF / _DENSE / _2_4 */
} fast_plan;

static fast_plan plan_fast(fp4rl_model *m, const fp4rl_linear_spec *s, int resq)
{
    fast_plan f = {0, -1, 0, FP4RL_RESQ_OFF};
    if (m->rollout_generic || !m->ops->rollout_act || !m->ops->linear_forward_bf16 || !m->ops->pack_bf16) return f;
    if (!fp4rl_linear_bf16_exact(s, FP4RL_ROLE_WEIGHT) || !fp4rl_linear_bf16_exact(s, FP4RL_ROLE_ACTIVATION)) return f;
    if (s->mode[FP4RL_ROLE_ACTIVATION] == FP4RL_NUM_FP4) { /* MXFP4 or HiF4: a qdq_block.h format */
        fp4rl_qparams p;
        const fp4rl_dtype fx = s->fmt[FP4RL_ROLE_ACTIVATION];
        if (s->tile[FP4RL_ROLE_ACTIVATION] != 0) return f;
        if (fp4rl_policy_resolve(m->policy, fx, FP4RL_ROLE_ACTIVATION, m->ctx, &p, "rollout") || p.stochastic) return f;
        if (resq != FP4RL_RESQ_OFF && resq != FP4RL_RESQ_DENSE && resq != FP4RL_RESQ_2_4) return f;
        f.fmt = fp4rl_qdq_format(fx);
        f.tf = p.truncation_free;
        f.resq = resq;
    }
    f.on = 1;
    return f;
}

/* Columns of the fused GEMM: K, or 2K with ResQ. */
static int64_t fast_cols(const fast_plan *f, int64_t K)
{
    return f->fmt >= 0 && (f->resq == FP4RL_RESQ_DENSE || f->resq == FP4RL_RESQ_2_4) ? 2 * K : K;
}

/* The weight operand of a fused linear: wq (the rollout weight values, [OUT, K]) in BF16,
 * twice side by side with ResQ. */
static uint16_t *fast_weight(fp4rl_model *m, fp4rl_arena *keep, const fast_plan *f, const float *wq, int64_t OUT, int64_t K)
{
    const int64_t kx = fast_cols(f, K);
    uint16_t *wb = fp4rl_arena_alloc(keep, OUT * kx, sizeof(uint16_t));
    if (!wb) return NULL;
    keep->st = m->ops->pack_bf16(m->ctx, wb, kx, wq, OUT, K);
    if (!keep->st && kx != K) keep->st = m->ops->pack_bf16(m->ctx, wb + K, kx, wq, OUT, K);
    return keep->st ? NULL : wb;
}

/* The fused activation operand of x [N, K] (fast_cols(f, K) columns), NULL on failure (a->st). */
static uint16_t *fast_act(fp4rl_model *m, fp4rl_arena *a, const fast_plan *f, const float *x, int64_t N, int64_t K,
                          unsigned long long *counts)
{
    uint16_t *xb = fp4rl_arena_alloc(a, N * fast_cols(f, K), sizeof(uint16_t));
    if (xb) a->st = m->ops->rollout_act(m->ctx, xb, f->fmt >= 0 ? counts : NULL, x, N, K, f->fmt, f->tf, f->resq);
    return a->st ? NULL : xb;
}

/* y = x w^T + b with x from fast_act (or a shared one: xb_in not NULL). */
static fp4rl_status fast_linear(fp4rl_model *m, fp4rl_arena *a, const fast_plan *f, float *y, const float *x,
                                const uint16_t *wb, const float *b, int64_t N, int64_t K, int64_t OUT,
                                unsigned long long *counts, const uint16_t *xb_in)
{
    const uint16_t *xb = xb_in ? xb_in : fast_act(m, a, f, x, N, K, counts);
    return xb ? m->ops->linear_forward_bf16(m->ctx, y, xb, wb, b, N, fast_cols(f, K), OUT) : a->st;
}

static int same_plan(const fast_plan *a, const fast_plan *b)
{
    return a->on && b->on && a->fmt == b->fmt && a->tf == b->tf && a->resq == b->resq;
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
    const fp4rl_att_numerics att_nm = fp4rl_attention_numerics(m, 1);
    fp4rl_linear_spec s_head = fp4rl_head_linear_spec(m, 1);
    const fast_plan f_qk = plan_fast(m, &s_qk, resq), f_blk = plan_fast(m, &s_blk, resq), f_head = plan_fast(m, &s_head, 0);
    float **wq = calloc((size_t)(L * R_COUNT + 1), sizeof(float *));
    uint16_t **wb = calloc((size_t)(L * R_COUNT + 1), sizeof(uint16_t *));
    if (!wq || !wb) {
        free(wq);
        free(wb);
        st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "rollout: out of host memory");
        goto out;
    }
    for (int64_t l = 0; l < L && !st; l++)
        for (int r = 0; r < R_COUNT && !st; r++) {
            const fp4rl_param *p = &m->params[fp4rl_model_lp((int)l, weight_of[r])];
            const fp4rl_linear_spec *s = r <= R_K ? &s_qk : &s_blk;
            const fast_plan *f = r <= R_K ? &f_qk : &f_blk;
            float *w = m->w + p->offset;
            wq[l * R_COUNT + r] = w;
            if (s->mode[FP4RL_ROLE_WEIGHT] == FP4RL_NUM_FP32) continue;
            fp4rl_arena tmp = {.ctx = ctx}, *wa = f->on ? &tmp : &keep; /* the fused path keeps only BF16 */
            wq[l * R_COUNT + r] = fp4rl_arena_f32(wa, p->numel);
            st = wa->st ? wa->st
                        : fp4rl_linear_operand(m, wa, wq[l * R_COUNT + r], w, p->dims[0], p->dims[1], s,
                                               FP4RL_ROLE_WEIGHT, 0);
            if (!st && f->on) {
                wb[l * R_COUNT + r] = fast_weight(m, &keep, f, wq[l * R_COUNT + r], p->dims[0], p->dims[1]);
                st = keep.st;
            }
            if (f->on) fp4rl_arena_free(&tmp);
        }
    float *head = fp4rl_model_w(m, fp4rl_model_p_head(m));
    float *whead = head;
    if (!st && s_head.mode[FP4RL_ROLE_WEIGHT] != FP4RL_NUM_FP32) {
        whead = fp4rl_arena_f32(&keep, V * C);
        st = keep.st ? keep.st : fp4rl_linear_operand(m, &keep, whead, head, V, C, &s_head, FP4RL_ROLE_WEIGHT, 0);
    }
    res->fused_linears = L * (5 * f_blk.on + 2 * f_qk.on) + f_head.on;
    const int share_qkv = same_plan(&f_qk, &f_blk);
    uint16_t *whead_b = NULL;
    if (!st && f_head.on) {
        whead_b = fast_weight(m, &keep, &f_head, whead, V, C);
        st = keep.st;
    }
    unsigned long long *counts64 = fp4rl_arena_alloc(&keep, L * R_COUNT * 2, sizeof(unsigned long long));
    if (!st && !keep.st) st = ctx->be->memset0(ctx, counts64, (size_t)(L * R_COUNT * 2) * sizeof(unsigned long long));
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
/* xs: a fused activation operand shared with the previous linear on the same input, or NULL */
#define LIN(s, r, y, xin, bias, IN, OUT, xs)                                                                     \
    ((s) == &s_qk ? f_qk.on : f_blk.on)                                                                          \
        ? fast_linear(m, &step, (s) == &s_qk ? &f_qk : &f_blk, y, xin, wb[l * R_COUNT + (r)], bias, B, IN, OUT, \
                      counts64 + (l * R_COUNT + (r)) * 2, xs)                                                      \
        : fp4rl_rollout_linear(m, &step, s, resq, y, xin, wq[l * R_COUNT + (r)], bias, B, IN, OUT,               \
                               counts + (l * R_COUNT + (r)) * 2)
        TRY(ctx->be->upload(ctx, d_tok, cur, (size_t)B * 4));
        TRY(ctx->be->upload(ctx, d_pos, pos, (size_t)B * 4));
        TRY(ops->embedding_forward(ctx, x, d_tok, fp4rl_model_w(m, fp4rl_model_p_embed()), B, V, C));
        for (int64_t l = 0; l < L; l++) {
            TRY(ops->rmsnorm_forward(ctx, ln, rstd, x, W(l, FP4RL_LP_LN1), B, C, eps));
            /* q, k, v read one input: one fused activation operand when their numerics agree */
            const uint16_t *xs = share_qkv ? fast_act(m, &step, &f_qk, ln, B, C, counts64 + l * R_COUNT * 2) : NULL;
            if (share_qkv && !xs) TRY(step.st);
            TRY(LIN(&s_qk, R_Q, q, ln, W(l, FP4RL_LP_Q_B), C, QD, xs));
            TRY(LIN(&s_qk, R_K, k, ln, W(l, FP4RL_LP_K_B), C, KD, xs));
            TRY(LIN(&s_blk, R_V, v, ln, W(l, FP4RL_LP_V_B), C, KD, xs));
            TRY(ops->rope_forward(ctx, q, q, d_pos, B, Hq, D, theta));
            TRY(ops->rope_forward(ctx, k, k, d_pos, B, Hkv, D, theta));
            TRY(ops->kv_write(ctx, kc[l], k, B, Tmax, KD, t));
            TRY(ops->kv_write(ctx, vc[l], v, B, Tmax, KD, t));
            TRY(ops->attention_decode(ctx, att, q, kc[l], vc[l], B, Tmax, t + 1, Hq, Hkv, D, att_nm));
            TRY(LIN(&s_blk, R_O, o, att, NULL, QD, C, NULL));
            TRY(ops->residual_forward(ctx, x1, x, o, B * C));
            TRY(ops->rmsnorm_forward(ctx, ln, rstd, x1, W(l, FP4RL_LP_LN2), B, C, eps));
            xs = f_blk.on ? fast_act(m, &step, &f_blk, ln, B, C, counts64 + (l * R_COUNT + R_GATE) * 2) : NULL;
            if (f_blk.on && !xs) TRY(step.st);
            TRY(LIN(&s_blk, R_GATE, gate, ln, NULL, C, I, xs));
            TRY(LIN(&s_blk, R_UP, up, ln, NULL, C, I, xs));
            TRY(ops->swiglu_forward(ctx, h, gate, up, B * I));
            TRY(LIN(&s_blk, R_DOWN, o, h, NULL, I, C, NULL));
            TRY(ops->residual_forward(ctx, x, x1, o, B * C));
        }
        TRY(ops->rmsnorm_forward(ctx, ln, rstd, x, fp4rl_model_w(m, fp4rl_model_p_norm(m)), B, C, eps));
        if (f_head.on) {
            TRY(fast_linear(m, &step, &f_head, logits, ln, whead_b, NULL, B, C, V, NULL, NULL));
        } else {
            float *lq = ln;
            if (s_head.mode[FP4RL_ROLE_ACTIVATION] == FP4RL_NUM_BF16) TRY(ops->round_bf16(ctx, lq, ln, B * C));
            TRY(ops->linear_forward(ctx, logits, lq, whead, NULL, B, C, V));
        }
        TRY(ops->sample_rows(ctx, d_samp, d_slogp, logits, B, V, cfg->temperature, cfg->top_k, cfg->top_p, cfg->seed, cfg->offset + (uint64_t)t, cfg->row0));
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
    unsigned long long *h64 = calloc((size_t)(L * R_COUNT * 2), sizeof(unsigned long long));
    if (!st && !h64) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "rollout: out of host memory");
    if (!st) st = ctx->be->download(ctx, h64, counts64, (size_t)(L * R_COUNT * 2) * sizeof(unsigned long long));
    for (int64_t l = 0; !st && l < L; l++) { /* a shared operand was counted once: for each of its readers */
        unsigned long long *c = h64 + l * R_COUNT * 2;
        for (int j = 0; j < 2; j++) {
            if (share_qkv) c[R_K * 2 + j] = c[R_V * 2 + j] = c[R_Q * 2 + j];
            if (f_blk.on) c[R_UP * 2 + j] = c[R_GATE * 2 + j];
        }
    }
    for (int64_t i = 0; !st && i < L * R_COUNT * 2; i++) hcounts[i] += (float)h64[i]; /* one path per linear: one is 0 */
    free(h64);
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
    free(wb);
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
