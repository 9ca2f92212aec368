/*
 * model_forward.c - the Qwen2 forward pass and the backward pass of the loss (next-token
 * cross-entropy, or the caller's per-token loss on the log-probs), written once against the op
 * table (core/backend/ops.h). The linear layers' numerics are in core/model/model_linear.c.
 *
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* ---- the model ---- */
enum { LIN_Q, LIN_K, LIN_V, LIN_O, LIN_GATE, LIN_UP, LIN_DOWN, LIN_COUNT };

typedef struct layer_acts {
    float *x_in, *ln1, *rstd1, *q, *k, *v, *att, *lse, *x1, *ln2, *rstd2, *gate, *up, *h;
    fp4rl_linear_saved sv[LIN_COUNT];
} layer_acts;

static fp4rl_status check_batch(const fp4rl_model *m, const int32_t *tokens, const int32_t *lengths, int64_t B,
                                int64_t T, const char *fn)
{
    if (!tokens) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tokens is NULL", fn);
    if (B < 1 || T < 1)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: batch %lld and seq_len %lld must both be >= 1", fn, (long long)B, (long long)T);
    if (T > m->cfg.max_position_embeddings)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: seq_len %lld exceeds max_position_embeddings %lld", fn, (long long)T,
                          (long long)m->cfg.max_position_embeddings);
    /* the largest activation (the logits) must stay within int32 GEMM dims and int64 bytes */
    if (B > INT32_MAX / T || B * T > (int64_t)(INT32_MAX / 4) || B * T > (INT64_MAX / 16) / m->cfg.vocab_size)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: batch %lld x seq_len %lld is too large", fn, (long long)B, (long long)T);
    for (int64_t b = 0; b < B; b++) {
        int32_t len = lengths ? lengths[b] : (int32_t)T;
        if (len < 1 || len > T)
            return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: lengths[%lld] = %d is outside [1, seq_len = %lld]", fn,
                              (long long)b, len, (long long)T);
        for (int64_t t = 0; t < len; t++) {
            int32_t id = tokens[b * T + t];
            if (id < 0 || id >= m->cfg.vocab_size)
                return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tokens[%lld, %lld] = %d is outside the vocabulary [0, %lld)",
                                  fn, (long long)b, (long long)t, id, (long long)m->cfg.vocab_size);
        }
    }
    return FP4RL_OK;
}

fp4rl_status fp4rl_model_run(fp4rl_model *m, const int32_t *tokens, const int32_t *lengths, const float *loss_mask,
                             int64_t B, int64_t T, float *logits_out, float *logprobs_out, int backward, double *loss,
                             const fp4rl_loss_hook *hook, float temperature, const char *fn)
{
    fp4rl_status st = check_batch(m, tokens, lengths, B, T, fn);
    if (st) return st;
    fp4rl_context *ctx = m->ctx;
    const fp4rl_ops *ops = m->ops;
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t N = B * T, C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, L = c->num_hidden_layers;
    const int64_t Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, D = c->head_dim;
    const int64_t QD = Hq * D, KD = Hkv * D;
    const float eps = (float)c->rms_norm_eps, theta = (float)c->rope_theta;
    fp4rl_arena a = {.ctx = ctx};
    layer_acts *acts = calloc((size_t)L, sizeof *acts);
    int32_t *h_pos = malloc((size_t)N * sizeof(int32_t)), *h_tgt = malloc((size_t)N * sizeof(int32_t));
    int32_t *h_len = malloc((size_t)B * sizeof(int32_t));
    float *h_mask = malloc((size_t)N * sizeof(float));
    if (!acts || !h_pos || !h_tgt || !h_len || !h_mask) {
        st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        goto done;
    }
    /* positions, lengths, and targets: position t predicts token t + 1 (ignored: -1) */
    for (int64_t b = 0; b < B; b++) {
        h_len[b] = lengths ? lengths[b] : (int32_t)T;
        for (int64_t t = 0; t < T; t++) {
            const int64_t n = b * T + t;
            const int valid = t + 1 < h_len[b];
            h_pos[n] = (int32_t)t;
            h_tgt[n] = valid ? tokens[n + 1] : -1;
            h_mask[n] = valid ? (loss_mask ? loss_mask[n + 1] : 1.0f) : 0.0f;
        }
    }
    const fp4rl_linear_spec s_qk = fp4rl_block_linear_spec(m, 1, 0), s_blk = fp4rl_block_linear_spec(m, 0, 0);
    const fp4rl_linear_spec s_head = fp4rl_head_linear_spec(m, 0);

    int32_t *d_tok = fp4rl_arena_alloc(&a, N, 4), *d_pos = fp4rl_arena_alloc(&a, N, 4), *d_tgt = fp4rl_arena_alloc(&a, N, 4);
    int32_t *d_len = fp4rl_arena_alloc(&a, B, 4);
    float *d_mask = fp4rl_arena_f32(&a, N), *x = fp4rl_arena_f32(&a, N * C);
    if (a.st) goto arena_fail;
    if ((st = ctx->be->upload(ctx, d_tok, tokens, (size_t)N * 4)) || (st = ctx->be->upload(ctx, d_pos, h_pos, (size_t)N * 4)) ||
        (st = ctx->be->upload(ctx, d_tgt, h_tgt, (size_t)N * 4)) || (st = ctx->be->upload(ctx, d_len, h_len, (size_t)B * 4)) ||
        (st = ctx->be->upload(ctx, d_mask, h_mask, (size_t)N * 4)))
        goto done;
    /* padding tokens past a length are arbitrary ids: read them as token 0 for the embedding */
    if ((st = ops->embedding_forward(ctx, x, d_tok, fp4rl_model_w(m, fp4rl_model_p_embed()), N, V, C))) goto done;

#define W(l, k) fp4rl_model_w(m, fp4rl_model_lp((int)(l), k))
#define G(l, k) fp4rl_model_g(m, fp4rl_model_lp((int)(l), k))
#define TRY(call) do { if ((st = (call)) != FP4RL_OK) goto done; } while (0)
    for (int64_t l = 0; l < L; l++) {
        layer_acts *A = &acts[l];
        A->x_in = x;
        A->ln1 = fp4rl_arena_f32(&a, N * C); A->rstd1 = fp4rl_arena_f32(&a, N);
        A->q = fp4rl_arena_f32(&a, N * QD); A->k = fp4rl_arena_f32(&a, N * KD); A->v = fp4rl_arena_f32(&a, N * KD);
        A->att = fp4rl_arena_f32(&a, N * QD); A->lse = fp4rl_arena_f32(&a, B * Hq * T);
        A->x1 = fp4rl_arena_f32(&a, N * C); A->ln2 = fp4rl_arena_f32(&a, N * C); A->rstd2 = fp4rl_arena_f32(&a, N);
        A->gate = fp4rl_arena_f32(&a, N * I); A->up = fp4rl_arena_f32(&a, N * I); A->h = fp4rl_arena_f32(&a, N * I);
        float *o = fp4rl_arena_f32(&a, N * C), *dn = fp4rl_arena_f32(&a, N * C), *xo = fp4rl_arena_f32(&a, N * C);
        if (a.st) goto arena_fail;
        TRY(ops->rmsnorm_forward(ctx, A->ln1, A->rstd1, x, W(l, FP4RL_LP_LN1), N, C, eps));
        TRY(fp4rl_linear_forward(m, &a, &s_qk, &A->sv[LIN_Q], A->q, A->ln1, W(l, FP4RL_LP_Q_W), W(l, FP4RL_LP_Q_B), N, C, QD));
        TRY(fp4rl_linear_forward(m, &a, &s_qk, &A->sv[LIN_K], A->k, A->ln1, W(l, FP4RL_LP_K_W), W(l, FP4RL_LP_K_B), N, C, KD));
        TRY(fp4rl_linear_forward(m, &a, &s_blk, &A->sv[LIN_V], A->v, A->ln1, W(l, FP4RL_LP_V_W), W(l, FP4RL_LP_V_B), N, C, KD));
        TRY(ops->rope_forward(ctx, A->q, A->q, d_pos, N, Hq, D, theta));
        TRY(ops->rope_forward(ctx, A->k, A->k, d_pos, N, Hkv, D, theta));
        TRY(ops->attention_forward(ctx, A->att, A->lse, A->q, A->k, A->v, d_len, B, T, Hq, Hkv, D));
        TRY(fp4rl_linear_forward(m, &a, &s_blk, &A->sv[LIN_O], o, A->att, W(l, FP4RL_LP_O_W), NULL, N, QD, C));
        TRY(ops->residual_forward(ctx, A->x1, x, o, N * C));
        TRY(ops->rmsnorm_forward(ctx, A->ln2, A->rstd2, A->x1, W(l, FP4RL_LP_LN2), N, C, eps));
        TRY(fp4rl_linear_forward(m, &a, &s_blk, &A->sv[LIN_GATE], A->gate, A->ln2, W(l, FP4RL_LP_GATE_W), NULL, N, C, I));
        TRY(fp4rl_linear_forward(m, &a, &s_blk, &A->sv[LIN_UP], A->up, A->ln2, W(l, FP4RL_LP_UP_W), NULL, N, C, I));
        TRY(ops->swiglu_forward(ctx, A->h, A->gate, A->up, N * I));
        TRY(fp4rl_linear_forward(m, &a, &s_blk, &A->sv[LIN_DOWN], dn, A->h, W(l, FP4RL_LP_DOWN_W), NULL, N, I, C));
        TRY(ops->residual_forward(ctx, xo, A->x1, dn, N * C));
        x = xo;
    }
    float *lnf = fp4rl_arena_f32(&a, N * C), *rstdf = fp4rl_arena_f32(&a, N), *logits = fp4rl_arena_f32(&a, N * V);
    float *lse = fp4rl_arena_f32(&a, N), *logp = fp4rl_arena_f32(&a, N);
    if (a.st) goto arena_fail;
    const int p_norm = fp4rl_model_p_norm(m), p_head = fp4rl_model_p_head(m);
    fp4rl_linear_saved sv_head;
    TRY(ops->rmsnorm_forward(ctx, lnf, rstdf, x, fp4rl_model_w(m, p_norm), N, C, eps));
    TRY(fp4rl_linear_forward(m, &a, &s_head, &sv_head, logits, lnf, fp4rl_model_w(m, p_head), NULL, N, C, V));

    if (logits_out) {
        TRY(ctx->be->download(ctx, logits_out, logits, (size_t)(N * V) * sizeof(float)));
        for (int64_t b = 0; b < B; b++) /* rows past a length are padding */
            memset(logits_out + (b * T + h_len[b]) * V, 0, (size_t)((T - h_len[b]) * V) * sizeof(float));
    }
    if (temperature != 1.0f) TRY(ops->scale(ctx, logits, N * V, 1.0f / temperature));
    if (logprobs_out) {
        float *h = malloc((size_t)N * sizeof(float));
        if (!h) { st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn); goto done; }
        st = ops->logprobs_forward(ctx, logp, NULL, lse, logits, d_tgt, N, V);
        if (!st) st = ctx->be->download(ctx, h, logp, (size_t)N * sizeof(float));
        if (!st)
            for (int64_t b = 0; b < B; b++) { /* logp of row t is that of token t + 1 */
                logprobs_out[b * T] = 0.0f;
                for (int64_t t = 1; t < T; t++) logprobs_out[b * T + t] = t < h_len[b] ? h[b * T + t - 1] : 0.0f;
            }
        free(h);
        if (st) goto done;
    }
    if (!backward) goto done;

    /* ---- backward of the loss ---- */
    TRY(ctx->be->memset0(ctx, m->g, (size_t)m->total * sizeof(float)));
    float *dlogits = fp4rl_arena_zeros(&a, N * V), *dlnf = fp4rl_arena_zeros(&a, N * C), *dres = fp4rl_arena_zeros(&a, N * C);
    if (a.st) goto arena_fail;
    double lh = 0;
    if (hook) { /* the caller's loss on the token log-probs */
        float *ent = fp4rl_arena_f32(&a, N), *dlogp = fp4rl_arena_f32(&a, N);
        float *h = malloc((size_t)N * 3 * sizeof(float));
        if (a.st || !h) {
            free(h);
            st = a.st ? a.st : fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
            goto done;
        }
        st = ops->logprobs_forward(ctx, logp, ent, lse, logits, d_tgt, N, V);
        if (!st) st = ctx->be->download(ctx, h, logp, (size_t)N * sizeof(float));
        if (!st) st = ctx->be->download(ctx, h + N, ent, (size_t)N * sizeof(float));
        if (!st) {
            memset(h + 2 * N, 0, (size_t)N * sizeof(float));
            st = hook->fn(hook->user, h, h + N, h + 2 * N, &lh);
        }
        if (!st) st = ctx->be->upload(ctx, dlogp, h + 2 * N, (size_t)N * sizeof(float));
        if (!st) st = ops->logprobs_backward(ctx, dlogits, dlogp, NULL, logits, d_tgt, lse, ent, N, V);
        free(h);
        if (st) goto done;
    } else { /* the masked next-token cross-entropy */
        float lf = 0, one = 1.0f;
        TRY(ops->cross_entropy_forward(ctx, m->scalar, lse, logits, d_tgt, d_mask, N, V));
        TRY(ctx->be->download(ctx, &lf, m->scalar, sizeof lf));
        TRY(ctx->be->upload(ctx, m->scalar + 2, &one, sizeof one));
        TRY(ops->cross_entropy_backward(ctx, dlogits, m->scalar + 2, logits, d_tgt, d_mask, lse, N, V));
        lh = lf;
    }
    if (temperature != 1.0f) TRY(ops->scale(ctx, dlogits, N * V, 1.0f / temperature));
    TRY(fp4rl_linear_backward(m, &a, &s_head, &sv_head, dlnf, fp4rl_model_g(m, p_head), NULL, dlogits, lnf,
                   fp4rl_model_w(m, p_head), N, C, V));
    TRY(ops->rmsnorm_backward(ctx, dres, fp4rl_model_g(m, p_norm), dlnf, x, fp4rl_model_w(m, p_norm), rstdf, N, C));
    for (int64_t l = L - 1; l >= 0; l--) {
        layer_acts *A = &acts[l];
        /* dres is the gradient of this layer's output x_out = x1 + down(h) */
        float *dx1 = fp4rl_arena_zeros(&a, N * C), *ddn = fp4rl_arena_zeros(&a, N * C), *dh = fp4rl_arena_zeros(&a, N * I);
        float *dgate = fp4rl_arena_zeros(&a, N * I), *dup = fp4rl_arena_zeros(&a, N * I), *dln2 = fp4rl_arena_zeros(&a, N * C);
        float *dxin = fp4rl_arena_zeros(&a, N * C), *dout = fp4rl_arena_zeros(&a, N * C), *datt = fp4rl_arena_zeros(&a, N * QD);
        float *dq = fp4rl_arena_zeros(&a, N * QD), *dk = fp4rl_arena_zeros(&a, N * KD), *dv = fp4rl_arena_zeros(&a, N * KD);
        float *dln1 = fp4rl_arena_zeros(&a, N * C);
        if (a.st) goto arena_fail;
        TRY(ops->residual_backward(ctx, dx1, ddn, dres, N * C));
        TRY(fp4rl_linear_backward(m, &a, &s_blk, &A->sv[LIN_DOWN], dh, G(l, FP4RL_LP_DOWN_W), NULL, ddn, A->h, W(l, FP4RL_LP_DOWN_W), N, I, C));
        TRY(ops->swiglu_backward(ctx, dgate, dup, dh, A->gate, A->up, N * I));
        TRY(fp4rl_linear_backward(m, &a, &s_blk, &A->sv[LIN_GATE], dln2, G(l, FP4RL_LP_GATE_W), NULL, dgate, A->ln2, W(l, FP4RL_LP_GATE_W), N, C, I));
        TRY(fp4rl_linear_backward(m, &a, &s_blk, &A->sv[LIN_UP], dln2, G(l, FP4RL_LP_UP_W), NULL, dup, A->ln2, W(l, FP4RL_LP_UP_W), N, C, I));
        TRY(ops->rmsnorm_backward(ctx, dx1, G(l, FP4RL_LP_LN2), dln2, A->x1, W(l, FP4RL_LP_LN2), A->rstd2, N, C));
        /* x1 = x_in + o */
        TRY(ops->residual_backward(ctx, dxin, dout, dx1, N * C));
        TRY(fp4rl_linear_backward(m, &a, &s_blk, &A->sv[LIN_O], datt, G(l, FP4RL_LP_O_W), NULL, dout, A->att, W(l, FP4RL_LP_O_W), N, QD, C));
        TRY(ops->attention_backward(ctx, dq, dk, dv, datt, A->q, A->k, A->v, A->att, A->lse, d_len, B, T, Hq, Hkv, D));
        TRY(ops->rope_backward(ctx, dq, dq, d_pos, N, Hq, D, theta));
        TRY(ops->rope_backward(ctx, dk, dk, d_pos, N, Hkv, D, theta));
        TRY(fp4rl_linear_backward(m, &a, &s_qk, &A->sv[LIN_Q], dln1, G(l, FP4RL_LP_Q_W), G(l, FP4RL_LP_Q_B), dq, A->ln1, W(l, FP4RL_LP_Q_W), N, C, QD));
        TRY(fp4rl_linear_backward(m, &a, &s_qk, &A->sv[LIN_K], dln1, G(l, FP4RL_LP_K_W), G(l, FP4RL_LP_K_B), dk, A->ln1, W(l, FP4RL_LP_K_W), N, C, KD));
        TRY(fp4rl_linear_backward(m, &a, &s_blk, &A->sv[LIN_V], dln1, G(l, FP4RL_LP_V_W), G(l, FP4RL_LP_V_B), dv, A->ln1, W(l, FP4RL_LP_V_W), N, C, KD));
        TRY(ops->rmsnorm_backward(ctx, dxin, G(l, FP4RL_LP_LN1), dln1, A->x_in, W(l, FP4RL_LP_LN1), A->rstd1, N, C));
        dres = dxin;
    }
    TRY(ops->embedding_backward(ctx, fp4rl_model_g(m, fp4rl_model_p_embed()), dres, d_tok, N, V, C));
    if (loss) *loss = lh;
#undef W
#undef G
#undef TRY
    goto done;
arena_fail:
    st = a.st;
done:
    fp4rl_arena_free(&a);
    free(acts);
    free(h_pos);
    free(h_tgt);
    free(h_len);
    free(h_mask);
    return st;
}

fp4rl_status fp4rl_model_logits(fp4rl_model *m, const int32_t *tokens, const int32_t *lengths, int64_t B, int64_t T,
                                float *logits, size_t bytes)
{
    const char *fn = "fp4rl_model_logits";
    if (!m) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(m->ctx, fn);
    if (st) return st;
    if (!logits) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: logits is NULL", fn);
    if (B >= 1 && T >= 1 && bytes / sizeof(float) / (size_t)m->cfg.vocab_size / (size_t)T < (size_t)B)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: logits holds %zu bytes; [%lld, %lld, %lld] floats need more", fn, bytes,
                          (long long)B, (long long)T, (long long)m->cfg.vocab_size);
    return fp4rl_model_run(m, tokens, lengths, NULL, B, T, logits, NULL, 0, NULL, NULL, 1.0f, fn);
}

fp4rl_status fp4rl_model_token_logprobs(fp4rl_model *m, const int32_t *tokens, const int32_t *lengths, int64_t B,
                                        int64_t T, float *logprobs, size_t bytes)
{
    const char *fn = "fp4rl_model_token_logprobs";
    if (!m) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: model is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(m->ctx, fn);
    if (st) return st;
    if (!logprobs) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: logprobs is NULL", fn);
    if (B >= 1 && T >= 1 && bytes / sizeof(float) / (size_t)T < (size_t)B)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: logprobs holds %zu bytes; [%lld, %lld] floats need more", fn, bytes,
                          (long long)B, (long long)T);
    return fp4rl_model_run(m, tokens, lengths, NULL, B, T, NULL, logprobs, 0, NULL, NULL, 1.0f, fn);
}
