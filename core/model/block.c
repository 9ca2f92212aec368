/*
 * block.c - one Qwen2 transformer block against the op table: its forward's op sequence
 * (fp4rl_block_steps, shared with the rollout), training's linears and attention for it
 * (train_impl), and the backward; the linear layers' numerics are core/model/model_linear.c's.
 * See block.h for who owns which buffer.
 */
#include "model/block.h"

#define W(l, k) fp4rl_model_w(m, fp4rl_model_lp((int)(l), k))
#define G(l, k) fp4rl_model_g(m, fp4rl_model_lp((int)(l), k))
#define TRY(call) do { if ((st = (call)) != FP4RL_OK) return st; } while (0)

fp4rl_att_numerics fp4rl_attention_numerics(const fp4rl_model *m, int rollout)
{
    const int64_t n = fp4rl_policy_value(m->policy, rollout ? FP4RL_QP_ROLLOUT_NUMERICS : FP4RL_QP_TRAIN_NUMERICS);
    return n == FP4RL_NUMERICS_FP32 ? FP4RL_ATT_FP32 : FP4RL_ATT_BF16;
}

fp4rl_status fp4rl_block_steps(fp4rl_model *m, int64_t l, int64_t N, const int32_t *pos, const fp4rl_block_bufs *b,
                               const fp4rl_block_impl *impl)
{
    fp4rl_context *ctx = m->ctx;
    const fp4rl_ops *ops = m->ops;
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t C = c->hidden_size, I = c->intermediate_size;
    const int64_t Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, D = c->head_dim, QD = Hq * D, KD = Hkv * D;
    const float eps = (float)c->rms_norm_eps, theta = (float)c->rope_theta;
    void *u = impl->user;
    fp4rl_status st;
    TRY(ops->rmsnorm_forward(ctx, b->ln1, b->rstd1, b->x_in, W(l, FP4RL_LP_LN1), N, C, eps));
    if (impl->qkv) {
        TRY(impl->qkv(u, l, b->q, b->k, b->v, b->ln1, pos));
    } else {
        TRY(impl->linear(u, l, FP4RL_LIN_Q, b->q, b->ln1, C, QD, W(l, FP4RL_LP_Q_B)));
        TRY(impl->linear(u, l, FP4RL_LIN_K, b->k, b->ln1, C, KD, W(l, FP4RL_LP_K_B)));
        TRY(impl->linear(u, l, FP4RL_LIN_V, b->v, b->ln1, C, KD, W(l, FP4RL_LP_V_B)));
        TRY(ops->rope_forward(ctx, b->q, b->q, pos, N, Hq, D, theta));
        TRY(ops->rope_forward(ctx, b->k, b->k, pos, N, Hkv, D, theta));
    }
    TRY(impl->attention(u, l, b->att, b->q, b->k, b->v));
    TRY(impl->linear(u, l, FP4RL_LIN_O, b->o, b->att, QD, C, NULL));
    TRY(ops->residual_rmsnorm(ctx, b->x1, b->ln2, b->rstd2, b->x_in, b->o, W(l, FP4RL_LP_LN2), N, C, eps));
    if (impl->gate_up) {
        TRY(impl->gate_up(u, l, b->h, b->ln2));
    } else {
        TRY(impl->linear(u, l, FP4RL_LIN_GATE, b->gate, b->ln2, C, I, NULL));
        TRY(impl->linear(u, l, FP4RL_LIN_UP, b->up, b->ln2, C, I, NULL));
        TRY(ops->swiglu_forward(ctx, b->h, b->gate, b->up, N * I));
    }
    TRY(impl->linear(u, l, FP4RL_LIN_DOWN, b->o, b->h, I, C, NULL));
    TRY(ops->residual_forward(ctx, b->x_out, b->x1, b->o, N * C));
    return FP4RL_OK;
}

/* Training's linears and attention for fp4rl_block_steps: each linear saves its operands in A->sv
 * (A->mem); q/k/v read one operand of ln1 and gate/up one of ln2 where the numerics allow, and an
 * FP32 linear input the backward does not read (ln1, ln2, h: saved as their BF16 operands) dies
 * after its last linear. */
typedef struct train_impl {
    fp4rl_model *m;
    const fp4rl_block_batch *bt;
    fp4rl_block_acts *A;
    fp4rl_linear_spec s_qk, s_blk;
    fp4rl_linear_saved ln1_op, ln2_op;
    int share_k, share_v, share_up, keep_qk, keep_blk;
} train_impl;

static fp4rl_status train_linear(void *user, int64_t l, int which, float *y, float *x, int64_t IN, int64_t OUT,
                                 const float *bias)
{
    train_impl *t = user;
    fp4rl_model *m = t->m;
    fp4rl_block_acts *A = t->A;
    fp4rl_arena *a = &A->mem;
    const fp4rl_linear_spec *s = which <= FP4RL_LIN_K ? &t->s_qk : &t->s_blk;
    const fp4rl_linear_saved *reuse = which == FP4RL_LIN_K && t->share_k    ? &t->ln1_op
                                      : which == FP4RL_LIN_V && t->share_v  ? &t->ln1_op
                                      : which == FP4RL_LIN_UP && t->share_up ? &t->ln2_op
                                                                              : NULL;
    fp4rl_status st;
    TRY(fp4rl_lin_forward(m, a, s, &A->sv[which], y, x, W(l, fp4rl_lin_weight(which)), bias, t->bt->B * t->bt->T, IN, OUT,
                          reuse));
    fp4rl_linear_saved *op = which == FP4RL_LIN_Q ? &t->ln1_op : which == FP4RL_LIN_GATE ? &t->ln2_op : NULL;
    float **dies = which == FP4RL_LIN_V && !t->keep_qk && !t->keep_blk ? &A->ln1
                   : which == FP4RL_LIN_UP && !t->keep_blk             ? &A->ln2
                   : which == FP4RL_LIN_DOWN && !t->keep_blk           ? &A->h
                                                                       : NULL;
    if (op) { /* the operand its input's next readers share */
        op->xb = A->sv[which].xb;
        op->xbt = A->sv[which].xbt;
    }
    if (dies) {
        fp4rl_arena_release(a, *dies);
        *dies = NULL;
    }
    return FP4RL_OK;
}

static fp4rl_status train_attention(void *user, int64_t l, float *att, float *q, float *k, float *v)
{
    const train_impl *t = user;
    const fp4rl_hf_config *c = &t->m->cfg;
    const fp4rl_block_batch *bt = t->bt;
    (void)l;
    return t->m->ops->attention_forward(t->m->ctx, att, t->A->lse, q, k, v, bt->len, bt->B, bt->T, c->num_attention_heads,
                                        c->num_key_value_heads, c->head_dim, fp4rl_attention_numerics(t->m, 0));
}

fp4rl_status fp4rl_block_forward(fp4rl_model *m, int64_t l, const fp4rl_block_batch *bt, fp4rl_block_acts *A, float *x_in,
                                 float *x_out)
{
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t N = bt->B * bt->T, C = c->hidden_size, I = c->intermediate_size;
    const int64_t Hq = c->num_attention_heads, QD = Hq * c->head_dim, KD = c->num_key_value_heads * c->head_dim;
    fp4rl_arena *a = &A->mem;
    fp4rl_status st;
    A->x_in = x_in;
    A->ln1 = fp4rl_arena_f32(a, N * C); A->rstd1 = fp4rl_arena_f32(a, N);
    A->q = fp4rl_arena_f32(a, N * QD); A->k = fp4rl_arena_f32(a, N * KD); A->v = fp4rl_arena_f32(a, N * KD);
    A->att = fp4rl_arena_f32(a, N * QD); A->lse = fp4rl_arena_f32(a, bt->B * Hq * bt->T);
    A->x1 = fp4rl_arena_f32(a, N * C); A->ln2 = fp4rl_arena_f32(a, N * C); A->rstd2 = fp4rl_arena_f32(a, N);
    A->gate = fp4rl_arena_f32(a, N * I); A->up = fp4rl_arena_f32(a, N * I); A->h = fp4rl_arena_f32(a, N * I);
    A->x_out = x_out ? x_out : fp4rl_arena_f32(a, N * C);
    float *o = fp4rl_arena_f32(a, N * C); /* temporary: o, then the down projection */
    if (a->st) return a->st;
    train_impl t = {.m = m, .bt = bt, .A = A, .s_qk = fp4rl_block_linear_spec(m, 1, 0), .s_blk = fp4rl_block_linear_spec(m, 0, 0)};
    t.share_k = fp4rl_linear_same_activation(m, &t.s_qk, &t.s_qk);
    t.share_v = fp4rl_linear_same_activation(m, &t.s_qk, &t.s_blk);
    t.share_up = fp4rl_linear_same_activation(m, &t.s_blk, &t.s_blk);
    t.keep_qk = fp4rl_linear_reads_x(m, &t.s_qk);
    t.keep_blk = fp4rl_linear_reads_x(m, &t.s_blk);
    const fp4rl_block_bufs b = {.x_in = x_in, .ln1 = A->ln1, .rstd1 = A->rstd1, .q = A->q, .k = A->k, .v = A->v,
                                .att = A->att, .o = o, .x1 = A->x1, .ln2 = A->ln2, .rstd2 = A->rstd2, .gate = A->gate,
                                .up = A->up, .h = A->h, .x_out = A->x_out};
    const fp4rl_block_impl impl = {.linear = train_linear, .attention = train_attention, .user = &t};
    TRY(fp4rl_block_steps(m, l, N, bt->pos, &b, &impl));
    fp4rl_arena_release(a, o);
    return FP4RL_OK;
}

/* A linear's backward with its temporaries (the re-quantized operands) freed at once. */
static fp4rl_status lin_bwd(fp4rl_model *m, const fp4rl_linear_spec *s, const fp4rl_linear_saved *sv, float *dx, float *dw,
                            float *db, float *dy, float *x, float *w, int64_t N, int64_t IN, int64_t OUT)
{
    fp4rl_arena t = {.ctx = m->ctx};
    fp4rl_status st = fp4rl_lin_backward(m, &t, s, sv, dx, dw, db, dy, x, w, N, IN, OUT);
    fp4rl_arena_free(&t);
    return st;
}

fp4rl_status fp4rl_block_backward(fp4rl_model *m, int64_t l, const fp4rl_block_batch *bt, const fp4rl_block_acts *A,
                                  const float *dout, fp4rl_arena *out, float **dx_in)
{
    fp4rl_context *ctx = m->ctx;
    const fp4rl_ops *ops = m->ops;
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t N = bt->B * bt->T, C = c->hidden_size, I = c->intermediate_size;
    const int64_t Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, D = c->head_dim, QD = Hq * D, KD = Hkv * D;
    const float theta = (float)c->rope_theta;
    const fp4rl_linear_spec s_qk = fp4rl_block_linear_spec(m, 1, 0), s_blk = fp4rl_block_linear_spec(m, 0, 0);
    fp4rl_arena g = {.ctx = ctx}; /* this block's gradient temporaries */
    fp4rl_status st = FP4RL_OK;
    float *dxin = fp4rl_arena_zeros(out, N * C);
    if (out->st) return out->st;
#define TRYG(call) do { if ((st = (call)) != FP4RL_OK) goto done; } while (0)
#define ZEROS(n) fp4rl_arena_zeros(&g, (n))
    /* dout is the gradient of x_out = x1 + down(h) */
    float *dx1 = ZEROS(N * C), *ddn = ZEROS(N * C);
    if ((st = g.st)) goto done;
    TRYG(ops->residual_backward(ctx, dx1, ddn, dout, N * C));
    float *dh = ZEROS(N * I);
    if ((st = g.st)) goto done;
    TRYG(lin_bwd(m, &s_blk, &A->sv[FP4RL_LIN_DOWN], dh, G(l, FP4RL_LP_DOWN_W), NULL, ddn, A->h, W(l, FP4RL_LP_DOWN_W), N, I, C));
    fp4rl_arena_release(&g, ddn);
    float *dgate = ZEROS(N * I), *dup = ZEROS(N * I), *dln2 = ZEROS(N * C);
    if ((st = g.st)) goto done;
    TRYG(ops->swiglu_backward(ctx, dgate, dup, dh, A->gate, A->up, N * I));
    fp4rl_arena_release(&g, dh);
    TRYG(lin_bwd(m, &s_blk, &A->sv[FP4RL_LIN_GATE], dln2, G(l, FP4RL_LP_GATE_W), NULL, dgate, A->ln2, W(l, FP4RL_LP_GATE_W), N, C, I));
    fp4rl_arena_release(&g, dgate);
    TRYG(lin_bwd(m, &s_blk, &A->sv[FP4RL_LIN_UP], dln2, G(l, FP4RL_LP_UP_W), NULL, dup, A->ln2, W(l, FP4RL_LP_UP_W), N, C, I));
    fp4rl_arena_release(&g, dup);
    TRYG(ops->rmsnorm_backward(ctx, dx1, G(l, FP4RL_LP_LN2), dln2, A->x1, W(l, FP4RL_LP_LN2), A->rstd2, N, C));
    fp4rl_arena_release(&g, dln2);
    /* x1 = x_in + o */
    float *dres_o = ZEROS(N * C), *datt = ZEROS(N * QD);
    if ((st = g.st)) goto done;
    TRYG(ops->residual_backward(ctx, dxin, dres_o, dx1, N * C));
    fp4rl_arena_release(&g, dx1);
    TRYG(lin_bwd(m, &s_blk, &A->sv[FP4RL_LIN_O], datt, G(l, FP4RL_LP_O_W), NULL, dres_o, A->att, W(l, FP4RL_LP_O_W), N, QD, C));
    fp4rl_arena_release(&g, dres_o);
    float *dq = ZEROS(N * QD), *dk = ZEROS(N * KD), *dv = ZEROS(N * KD);
    if ((st = g.st)) goto done;
    TRYG(ops->attention_backward(ctx, dq, dk, dv, datt, A->q, A->k, A->v, A->att, A->lse, bt->len, bt->B, bt->T, Hq, Hkv, D,
                                    fp4rl_attention_numerics(m, 0)));
    fp4rl_arena_release(&g, datt);
    TRYG(ops->rope_backward(ctx, dq, dq, bt->pos, N, Hq, D, theta));
    TRYG(ops->rope_backward(ctx, dk, dk, bt->pos, N, Hkv, D, theta));
    float *dln1 = ZEROS(N * C);
    if ((st = g.st)) goto done;
    TRYG(lin_bwd(m, &s_qk, &A->sv[FP4RL_LIN_Q], dln1, G(l, FP4RL_LP_Q_W), G(l, FP4RL_LP_Q_B), dq, A->ln1, W(l, FP4RL_LP_Q_W), N, C, QD));
    TRYG(lin_bwd(m, &s_qk, &A->sv[FP4RL_LIN_K], dln1, G(l, FP4RL_LP_K_W), G(l, FP4RL_LP_K_B), dk, A->ln1, W(l, FP4RL_LP_K_W), N, C, KD));
    TRYG(lin_bwd(m, &s_blk, &A->sv[FP4RL_LIN_V], dln1, G(l, FP4RL_LP_V_W), G(l, FP4RL_LP_V_B), dv, A->ln1, W(l, FP4RL_LP_V_W), N, C, KD));
    TRYG(ops->rmsnorm_backward(ctx, dxin, G(l, FP4RL_LP_LN1), dln1, A->x_in, W(l, FP4RL_LP_LN1), A->rstd1, N, C));
    *dx_in = dxin;
#undef TRYG
#undef ZEROS
done:
    fp4rl_arena_free(&g);
    return st;
}
