/*
 * model_forward.c - the Qwen2 forward pass and the backward pass of the loss (next-token
 * cross-entropy, or the caller's per-token loss on the log-probs), written once against the op
 * table (core/backend/ops.h). The linear layers' numerics are in core/model/model_linear.c.
 *
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/block.h"
#include "backend/nucleus.h"


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

/* The memory the context can still allocate (the test override ctx->mem_budget first); 0 when
 * the backend cannot say. */
static double memory_left(const fp4rl_model *m)
{
    const fp4rl_context *ctx = m->ctx;
    return (double)(ctx->mem_budget ? ctx->mem_budget : ctx->be->memory_available ? ctx->be->memory_available(m->ctx) : 0);
}

/* Rows of the LM head processed at once: what a chunk holds of [rows, V] within the byte budget:
 * m->head_chunk_bytes when set, else 1/32 of the memory left, at least FP4RL_HEAD_CHUNK_BYTES and
 * at most the backend's head_chunk_max (a GPU's GEMMs and row reductions want hundreds of rows).
 * Counted per row: the logits, their gradient, the gradient's GEMM operand, its BF16 copy (half)
 * and the FP32 widening a backend without BF16 GEMMs makes of it (the CPU: twice, one per
 * backward GEMM). One chunk when the batch fits: then the results are bit-identical to an
 * unchunked head; otherwise the head's weight gradient and the loss are summed over chunks (FP32
 * sum order). */
static size_t head_budget(const fp4rl_model *m)
{
    if (m->head_chunk_bytes) return m->head_chunk_bytes;
    const size_t cap = m->ctx->be->head_chunk_max ? m->ctx->be->head_chunk_max : FP4RL_HEAD_CHUNK_BYTES;
    const double share = memory_left(m) / 32;
    return share < (double)FP4RL_HEAD_CHUNK_BYTES ? FP4RL_HEAD_CHUNK_BYTES : share > (double)cap ? cap : (size_t)share;
}
static int64_t head_rows(const fp4rl_model *m, int64_t N)
{
    const size_t budget = head_budget(m);
    const size_t per_row = 11 * (size_t)m->cfg.vocab_size * sizeof(float) / 2;
    const int64_t r = (int64_t)(budget / per_row);
    return r < 1 ? 1 : r > N ? N : r;
}

/* logits [rows, V] of lnf rows r0.. (the head's forward; sv keeps its operands in `a`); w_op
 * (optional): the head weight's operand, made once for all chunks. */
static fp4rl_status head_logits(fp4rl_model *m, fp4rl_arena *a, fp4rl_linear_saved *sv, float *logits, float *lnf,
                                int64_t r0, int64_t rows, const fp4rl_linear_saved *w_op)
{
    const fp4rl_linear_spec s = fp4rl_head_linear_spec(m, 0);
    const int64_t C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    return fp4rl_lin_forward(m, a, &s, sv, logits, lnf + r0 * C, fp4rl_model_w(m, fp4rl_model_p_head(m)), NULL, rows, C, V,
                                w_op);
}

/* The head's backward for rows r0..: dlnf rows += dlogits W, dW_head += dlogits^T lnf rows. */
static fp4rl_status head_backward(fp4rl_model *m, const fp4rl_linear_saved *sv, float *dlnf, float *dlogits, float *lnf,
                                  int64_t r0, int64_t rows)
{
    const fp4rl_linear_spec s = fp4rl_head_linear_spec(m, 0);
    const int64_t C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const int p_head = fp4rl_model_p_head(m);
    fp4rl_arena t = {.ctx = m->ctx};
    fp4rl_status st = fp4rl_lin_backward(m, &t, &s, sv, dlnf + r0 * C, fp4rl_model_g(m, p_head), NULL, dlogits,
                                            lnf + r0 * C, fp4rl_model_w(m, p_head), rows, C, V);
    fp4rl_arena_free(&t);
    return st;
}

/* Rows of head chunk k of R rows each over N rows (the last one may be shorter). */
static int64_t chunk_rows(int64_t N, int64_t R, int64_t k) { return N - k * R < R ? N - k * R : R; }

/* Head chunk k's share of the batch's loss targets: the weight of its mean cross-entropy in the
 * batch's. */
static double chunk_share(const float *mask, int64_t N, int64_t R, int64_t k, double mask_total)
{
    double part = 0;
    for (int64_t n = k * R; n < k * R + chunk_rows(N, R, k); n++) part += mask[n];
    return mask_total > 0 ? part / mask_total : 0;
}

/* One pass over the micro-batch p (sequences [b0, b0 + p->B) of a batch): its gradients are added
 * to m->g and its loss to *p->loss. mask_total is the whole batch's count of loss targets (the
 * cross-entropy's normaliser); whole: the micro-batch is the whole batch. */
static fp4rl_status run_micro(fp4rl_model *m, const fp4rl_pass *p, int64_t b0, double mask_total, int whole, int recompute)
{
    const int32_t *tokens = p->tokens, *lengths = p->lengths;
    const float *loss_mask = p->loss_mask;
    const int64_t B = p->B, T = p->T;
    float *logits_out = p->logits_out, *logprobs_out = p->logprobs_out;
    const int backward = p->backward;
    const fp4rl_loss_hook *hook = p->hook;
    const float temperature = p->temperature == 0 ? 1.0f : p->temperature;
    const fp4rl_truncation *trunc = p->trunc;
    const char *fn = p->fn;
    fp4rl_status st = FP4RL_OK;
    fp4rl_context *ctx = m->ctx;
    const fp4rl_ops *ops = m->ops;
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t N = B * T, C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;
    const float eps = (float)c->rms_norm_eps;
    fp4rl_arena a = {.ctx = ctx}; /* buffers of the whole pass */
    fp4rl_block_acts *acts = calloc((size_t)L, sizeof *acts);
    /* recomputation: each block's input and the random-number offset its forward started at */
    float **block_in = recompute ? calloc((size_t)L, sizeof *block_in) : NULL;
    uint64_t *block_rng = recompute ? calloc((size_t)L, sizeof *block_rng) : NULL;
    int32_t *h_pos = malloc((size_t)N * sizeof(int32_t)), *h_tgt = malloc((size_t)N * sizeof(int32_t));
    int32_t *h_len = malloc((size_t)B * sizeof(int32_t));
    float *h_mask = malloc((size_t)N * sizeof(float)), *h_lp = malloc((size_t)N * 3 * sizeof(float));
    if (!acts || !h_pos || !h_tgt || !h_len || !h_mask || !h_lp || (recompute && (!block_in || !block_rng))) {
        st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        goto done;
    }
    for (int64_t l = 0; l < L; l++) acts[l].mem.ctx = ctx;
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
    int32_t *d_tok = fp4rl_arena_alloc(&a, N, 4), *d_pos = fp4rl_arena_alloc(&a, N, 4), *d_tgt = fp4rl_arena_alloc(&a, N, 4);
    int32_t *d_len = fp4rl_arena_alloc(&a, B, 4);
    float *d_mask = fp4rl_arena_f32(&a, N), *x0 = fp4rl_arena_f32(&a, N * C);
    if (a.st) goto arena_fail;
    if ((st = ctx->be->upload(ctx, d_tok, tokens, (size_t)N * 4)) || (st = ctx->be->upload(ctx, d_pos, h_pos, (size_t)N * 4)) ||
        (st = ctx->be->upload(ctx, d_tgt, h_tgt, (size_t)N * 4)) || (st = ctx->be->upload(ctx, d_len, h_len, (size_t)B * 4)) ||
        (st = ctx->be->upload(ctx, d_mask, h_mask, (size_t)N * 4)))
        goto done;
#define TRY(call) do { if ((st = (call)) != FP4RL_OK) goto done; } while (0)
    /* padding tokens past a length are arbitrary ids: read them as token 0 for the embedding */
    TRY(ops->embedding_forward(ctx, x0, d_tok, fp4rl_model_w(m, fp4rl_model_p_embed()), N, V, C));
    const fp4rl_block_batch bt = {d_pos, d_len, B, T};
    float *x = x0;
    for (int64_t l = 0; l < L; l++) {
        if (recompute) { /* keep only the block's input (and its output, the next one's input) */
            float *out = fp4rl_arena_f32(&a, N * C);
            if (a.st) goto arena_fail;
            block_in[l] = x;
            block_rng[l] = ctx->rng_offset;
            TRY(fp4rl_block_forward(m, l, &bt, &acts[l], x, out));
            fp4rl_arena_free(&acts[l].mem);
            x = out;
            continue;
        }
        TRY(fp4rl_block_forward(m, l, &bt, &acts[l], x, NULL));
        x = acts[l].x_out;
        /* without a backward, a block's activations die with the next block's forward */
        if (!backward && l > 0) fp4rl_arena_free(&acts[l - 1].mem);
    }
    const int p_norm = fp4rl_model_p_norm(m);
    float *lnf = fp4rl_arena_f32(&a, N * C), *rstdf = fp4rl_arena_f32(&a, N);
    float *lse = fp4rl_arena_f32(&a, N), *logp = fp4rl_arena_f32(&a, N), *ent = fp4rl_arena_f32(&a, N);
    /* top-p: the log-probs under the nucleus (core/backend/ops.h), whose log-normaliser goes here */
    const int nucl = trunc && fp4rl_nucleus_on(trunc->top_p);
    float *nlse = nucl ? fp4rl_arena_f32(&a, N) : NULL;
    if (a.st) goto arena_fail;
    TRY(ops->rmsnorm_forward(ctx, lnf, rstdf, x, fp4rl_model_w(m, p_norm), N, C, eps));

    /* ---- the LM head and the loss, in chunks of rows ---- */
    const int64_t R = head_rows(m, N), n_chunks = (N + R - 1) / R;
    const int want_lp = logprobs_out || (backward && hook);
    float *dlnf = NULL;
    double lh = 0;
    if (backward) {
        dlnf = fp4rl_arena_zeros(&a, N * C);
        if (a.st) goto arena_fail;
    }
    /* the head weight's GEMM operand, made once for all chunks */
    const fp4rl_linear_spec s_head = fp4rl_head_linear_spec(m, 0);
    const fp4rl_linear_saved w_head = {.wb = fp4rl_linear_weight_operand(m, &a, &s_head, fp4rl_model_w(m, fp4rl_model_p_head(m)), V, C)};
    if (a.st) goto arena_fail;
    /* the cross-entropy's upstream gradient of each chunk (its share of the batch's targets) goes
     * up before the chunks, and its loss comes down after them: no synchronization per chunk */
    const int ce = backward && !hook, one = whole && n_chunks == 1; /* one: bit-identical to an unchunked head */
    float *h_ce = NULL, *d_ce = NULL; /* [0, n_chunks): each chunk's loss, then [n_chunks, 2 n_chunks): its dloss */
    if (ce) {
        h_ce = malloc((size_t)(2 * n_chunks) * sizeof(float));
        d_ce = fp4rl_arena_f32(&a, 2 * n_chunks);
        if (!h_ce) st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        if (a.st || st) {
            free(h_ce);
            if (a.st) goto arena_fail;
            goto done;
        }
        for (int64_t k = 0; k < n_chunks; k++)
            h_ce[n_chunks + k] = one ? 1.0f : (float)chunk_share(h_mask, N, R, k, mask_total);
        st = ctx->be->upload(ctx, d_ce + n_chunks, h_ce + n_chunks, (size_t)n_chunks * sizeof(float));
    }
    /* pass 1: logits, the log-probs and entropy; with the cross-entropy, also its backward */
    float *kept = NULL; /* one chunk: its logits stay for the hook's backward */
    fp4rl_arena kept_mem = {.ctx = ctx};
    fp4rl_linear_saved kept_sv;
    for (int64_t k = 0; !st && k < n_chunks && (logits_out || want_lp || backward); k++) {
        const int64_t r0 = k * R, rows = chunk_rows(N, R, k);
        fp4rl_arena ca = {.ctx = ctx};
        fp4rl_linear_saved sv;
        float *logits = fp4rl_arena_f32(&ca, rows * V);
        st = ca.st;
        if (!st) st = head_logits(m, &ca, &sv, logits, lnf, r0, rows, &w_head);
        if (!st && logits_out) st = ctx->be->download(ctx, logits_out + r0 * V, logits, (size_t)(rows * V) * sizeof(float));
        if (!st && temperature != 1.0f) st = ops->scale(ctx, logits, rows * V, 1.0f / temperature);
        if (!st && want_lp)
            st = ops->logprobs_forward(ctx, logp + r0, backward && hook ? ent + r0 : NULL, lse + r0, logits, d_tgt + r0, rows, V);
        if (!st && want_lp && nucl)
            st = ops->nucleus_logprobs_forward(ctx, logp + r0, nlse + r0, logits, d_tgt + r0, rows, V, trunc->top_k, trunc->top_p);
        if (!st && ce) { /* the masked next-token cross-entropy, normalised over the batch */
            float *dlogits = fp4rl_arena_zeros(&ca, rows * V);
            st = ca.st;
            if (!st) st = ops->cross_entropy_forward(ctx, d_ce + k, lse + r0, logits, d_tgt + r0, d_mask + r0, rows, V);
            if (!st)
                st = ops->cross_entropy_backward(ctx, dlogits, d_ce + n_chunks + k, logits, d_tgt + r0, d_mask + r0, lse + r0, rows, V);
            if (!st && temperature != 1.0f) st = ops->scale(ctx, dlogits, rows * V, 1.0f / temperature);
            if (!st) st = head_backward(m, &sv, dlnf, dlogits, lnf, r0, rows);
        }
        if (!st && backward && hook && n_chunks == 1) { /* keep the chunk for pass 2 */
            kept = logits;
            kept_sv = sv;
            kept_mem = ca;
            continue;
        }
        fp4rl_arena_free(&ca);
        if (st) goto done;
    }
    if (!st && ce) { /* each chunk's mean loss, weighted by its share of the batch's targets */
        st = ctx->be->download(ctx, h_ce, d_ce, (size_t)n_chunks * sizeof(float));
        for (int64_t k = 0; !st && k < n_chunks; k++)
            lh += one ? (double)h_ce[k] : (double)h_ce[k] * chunk_share(h_mask, N, R, k, mask_total);
    }
    free(h_ce);
    if (st) {
        fp4rl_arena_free(&kept_mem);
        goto done;
    }
    if (logits_out)
        for (int64_t b = 0; b < B; b++) /* rows past a length are padding */
            memset(logits_out + (b * T + h_len[b]) * V, 0, (size_t)((T - h_len[b]) * V) * sizeof(float));
    if (want_lp) {
        if (!(st = ctx->be->download(ctx, h_lp, logp, (size_t)N * sizeof(float))) && hook && backward)
            st = ctx->be->download(ctx, h_lp + N, ent, (size_t)N * sizeof(float));
        if (st) {
            fp4rl_arena_free(&kept_mem);
            goto done;
        }
    }
    if (logprobs_out)
        for (int64_t b = 0; b < B; b++) { /* logp of row t is that of token t + 1 */
            logprobs_out[b * T] = 0.0f;
            for (int64_t t = 1; t < T; t++) logprobs_out[b * T + t] = t < h_len[b] ? h_lp[b * T + t - 1] : 0.0f;
        }
    if (!backward) goto done;
    if (hook) { /* pass 2: the caller's loss on the token log-probs, and its backward per chunk */
        float *dlogp = fp4rl_arena_f32(&a, N);
        st = a.st;
        if (!st) {
            memset(h_lp + 2 * N, 0, (size_t)N * sizeof(float));
            st = hook->fn(hook->user, b0, B, h_lp, h_lp + N, h_lp + 2 * N, &lh);
        }
        if (!st) st = ctx->be->upload(ctx, dlogp, h_lp + 2 * N, (size_t)N * sizeof(float));
        for (int64_t k = 0; !st && k < n_chunks; k++) {
            const int64_t r0 = k * R, rows = chunk_rows(N, R, k);
            fp4rl_arena ca = {.ctx = ctx};
            fp4rl_linear_saved sv = kept_sv;
            float *logits = kept;
            if (!kept) { /* recompute the chunk's logits (deterministic: the head has no stochastic rounding) */
                logits = fp4rl_arena_f32(&ca, rows * V);
                st = ca.st;
                if (!st) st = head_logits(m, &ca, &sv, logits, lnf, r0, rows, &w_head);
                if (!st && temperature != 1.0f) st = ops->scale(ctx, logits, rows * V, 1.0f / temperature);
            }
            float *dlogits = st ? NULL : fp4rl_arena_zeros(&ca, rows * V);
            if (!st) st = ca.st;
            if (!st && nucl)
                st = ops->nucleus_logprobs_backward(ctx, dlogits, dlogp + r0, logits, d_tgt + r0, nlse + r0, rows, V, trunc->top_k,
                                                    trunc->top_p);
            else if (!st)
                st = ops->logprobs_backward(ctx, dlogits, dlogp + r0, NULL, logits, d_tgt + r0, lse + r0, ent + r0, rows, V);
            if (!st && temperature != 1.0f) st = ops->scale(ctx, dlogits, rows * V, 1.0f / temperature);
            if (!st) st = head_backward(m, &sv, dlnf, dlogits, lnf, r0, rows);
            fp4rl_arena_free(&ca);
        }
        fp4rl_arena_free(&kept_mem);
        if (st) goto done;
    }

    /* ---- backward through the blocks; each block's activations freed after its backward ---- */
    float *dres = fp4rl_arena_zeros(&a, N * C);
    if (a.st) goto arena_fail;
    TRY(ops->rmsnorm_backward(ctx, dres, fp4rl_model_g(m, p_norm), dlnf, x, fp4rl_model_w(m, p_norm), rstdf, N, C));
    fp4rl_arena_release(&a, dlnf);
    fp4rl_arena grads[2] = {{.ctx = ctx}, {.ctx = ctx}}; /* the gradient flowing down: this block's and the last */
    for (int64_t l = L - 1; !st && l >= 0; l--) {
        fp4rl_arena *out = &grads[l & 1];
        float *dx_in = NULL;
        if (recompute) { /* the block's forward again, with the random numbers it drew the first time */
            const uint64_t now = ctx->rng_offset;
            ctx->rng_offset = block_rng[l];
            st = fp4rl_block_forward(m, l, &bt, &acts[l], block_in[l], NULL);
            ctx->rng_offset = now;
        }
        if (!st) st = fp4rl_block_backward(m, l, &bt, &acts[l], dres, out, &dx_in);
        if (recompute && l > 0) fp4rl_arena_release(&a, block_in[l]); /* block l - 1's output */
        fp4rl_arena_free(&grads[(l + 1) & 1]); /* dres */
        fp4rl_arena_free(&acts[l].mem);
        dres = dx_in;
    }
    if (!st) st = ops->embedding_backward(ctx, fp4rl_model_g(m, fp4rl_model_p_embed()), dres, d_tok, N, V, C);
    fp4rl_arena_free(&grads[0]);
    fp4rl_arena_free(&grads[1]);
    if (!st && p->loss) *p->loss += lh;
#undef TRY
    goto done;
arena_fail:
    st = a.st;
done:
    if (acts)
        for (int64_t l = 0; l < L; l++) fp4rl_arena_free(&acts[l].mem);
    fp4rl_arena_free(&a);
    free(acts);
    free(block_in);
    free(block_rng);
    free(h_pos);
    free(h_tgt);
    free(h_len);
    free(h_mask);
    free(h_lp);
    return st;
}

/* Bytes per token of one pass, from the shapes (an upper estimate): without a backward about two
 * blocks' activations live at once; with one, every block's saved activations (FP32, and the GEMM
 * operand copies of quantized numerics) plus one block's gradient temporaries; with recomputation
 * one block's activations and every block's input. */
static double pass_bytes_per_token(const fp4rl_model *m, int backward, int recompute)
{
    const fp4rl_hf_config *c = &m->cfg;
    const double C = (double)c->hidden_size, I = (double)c->intermediate_size, Hq = (double)c->num_attention_heads;
    const double QD = Hq * (double)c->head_dim, KD = (double)c->num_key_value_heads * (double)c->head_dim;
    const double saved = 4 * C + 2 * QD + 2 * KD + 3 * I + Hq + 2, operands = 5 * C + QD + I;
    const double temps = 6 * C + 6 * I + 3 * QD, outer = 8 * C;
    const double L = (double)c->num_hidden_layers, layers = backward && !recompute ? L : 2;
    return 4.0 * (layers * (saved + operands) + temps + outer + (backward && recompute ? L * C : 0));
}

/* Automatic micro-batches hold at most this many tokens: GEMMs of 4096 rows already run near the
 * tensor cores' rate, and more rows only cost activation memory (PyTorch trainers use 16 x 384). */
#define FP4RL_AUTO_MICRO_TOKENS 4096

/* Sequences per micro-batch: `micro_tokens` / T (at least one); 0 = automatic: what fits in 85% of
 * the memory the context can still allocate after the LM head's chunk budget, at most
 * FP4RL_AUTO_MICRO_TOKENS tokens. *recompute (in: the model's setting) is turned on when automatic
 * sizing cannot fit one sequence without it. */
static int64_t micro_seqs(const fp4rl_model *m, int64_t B, int64_t T, int backward, int64_t micro_tokens, int *recompute)
{
    int64_t tokens = micro_tokens;
    if (tokens <= 0) {
        const double avail = memory_left(m);
        const double head = 3.0 * (double)head_budget(m);
        const double usable = 0.85 * avail - head;
        for (int r = *recompute; r <= (backward ? 1 : 0); r++) { /* without recomputation first */
            tokens = avail <= 0 ? FP4RL_AUTO_MICRO_TOKENS /* no estimate */
                     : usable > 0 ? (int64_t)(usable / pass_bytes_per_token(m, backward, r)) : 0;
            *recompute = r;
            if (tokens >= T) break;
        }
        if (tokens > FP4RL_AUTO_MICRO_TOKENS) tokens = FP4RL_AUTO_MICRO_TOKENS;
    }
    const int64_t seqs = tokens / T;
    return seqs < 1 ? 1 : seqs > B ? B : seqs;
}

fp4rl_status fp4rl_model_pass(fp4rl_model *m, const fp4rl_pass *p)
{
    const int64_t B = p->B, T = p->T;
    fp4rl_status st = check_batch(m, p->tokens, p->lengths, B, T, p->fn);
    if (st) return st;
    double mask_total = 0; /* the loss normaliser of the whole batch */
    for (int64_t b = 0; b < B; b++) {
        const int64_t len = p->lengths ? p->lengths[b] : T;
        for (int64_t t = 1; t < len; t++) mask_total += p->loss_mask ? p->loss_mask[b * T + t] : 1.0f;
    }
    if (p->backward &&
        ((st = fp4rl_model_grads(m)) || (st = m->ctx->be->memset0(m->ctx, m->g, (size_t)m->total * sizeof(float)))))
        return st;
    int recompute = p->backward && m->hp[FP4RL_MP_RECOMPUTE] != 0;
    const int64_t mb = micro_seqs(m, B, T, p->backward, p->micro_tokens, &recompute);
    double lsum = 0;
    for (int64_t b0 = 0; !st && b0 < B; b0 += mb) {
        fp4rl_pass mp = *p; /* the micro-batch's sequences */
        mp.B = B - b0 < mb ? B - b0 : mb;
        mp.tokens += b0 * T;
        if (mp.lengths) mp.lengths += b0;
        if (mp.loss_mask) mp.loss_mask += b0 * T;
        if (mp.logits_out) mp.logits_out += b0 * T * m->cfg.vocab_size;
        if (mp.logprobs_out) mp.logprobs_out += b0 * T;
        mp.loss = &lsum;
        st = run_micro(m, &mp, b0, mask_total, mp.B == B, recompute);
    }
    if (!st && p->loss) *p->loss = lsum;
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
    return fp4rl_model_pass(m, &(fp4rl_pass){.tokens = tokens, .lengths = lengths, .B = B, .T = T, .logits_out = logits,
                                             .micro_tokens = (int64_t)m->hp[FP4RL_MP_MICROBATCH_TOKENS], .fn = fn});
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
    return fp4rl_model_pass(m, &(fp4rl_pass){.tokens = tokens, .lengths = lengths, .B = B, .T = T, .logprobs_out = logprobs,
                                             .micro_tokens = (int64_t)m->hp[FP4RL_MP_MICROBATCH_TOKENS], .fn = fn});
}
