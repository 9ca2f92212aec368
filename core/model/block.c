/*
 * block.c - one Qwen2 transformer block, forward and backward, against the op table; the linear
 * layers' numerics are core/model/model_linear.c's. See block.h for who owns which buffer.
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

fp4rl_status fp4rl_block_forward(fp4rl_model *m, int64_t l, const fp4rl_block_batch *bt, fp4rl_block_acts *A, float *x_in,
                                 float *x_out)
{
    fp4rl_context *ctx = m->ctx;
    const fp4rl_ops *ops = m->ops;
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t N = bt->B * bt->T, C = c->hidden_size, I = c->intermediate_size;
    const int64_t Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, D = c->head_dim, QD = Hq * D, KD = Hkv * D;
    const float eps = (float)c->rms_norm_eps, theta = (float)c->rope_theta;
    const fp4rl_linear_spec s_qk = fp4rl_block_linear_spec(m, 1, 0), s_blk = fp4rl_block_linear_spec(m, 0, 0);
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
    TRY(ops->rmsnorm_forward(ctx, A->ln1, A->rstd1, x_in, W(l, FP4RL_LP_LN1), N, C, eps));
    /* q/k/v read one operand of ln1 and gate/up one of ln2 where the numerics allow */
    fp4rl_linear_saved ln1_op = {0}, ln2_op = {0};
    const int share_k = fp4rl_linear_same_activation(m, &s_qk, &s_qk), share_v = fp4rl_linear_same_activation(m, &s_qk, &s_blk);
    const int share_up = fp4rl_linear_same_activation(m, &s_blk, &s_blk);
    TRY(fp4rl_lin_forward(m, a, &s_qk, &A->sv[FP4RL_LIN_Q], A->q, A->ln1, W(l, FP4RL_LP_Q_W), W(l, FP4RL_LP_Q_B), N, C, QD, NULL));
    ln1_op.xb = A->sv[FP4RL_LIN_Q].xb;
    ln1_op.xbt = A->sv[FP4RL_LIN_Q].xbt;
    TRY(fp4rl_lin_forward(m, a, &s_qk, &A->sv[FP4RL_LIN_K], A->k, A->ln1, W(l, FP4RL_LP_K_W), W(l, FP4RL_LP_K_B), N, C, KD,
                             share_k ? &ln1_op : NULL));
    TRY(fp4rl_lin_forward(m, a, &s_blk, &A->sv[FP4RL_LIN_V], A->v, A->ln1, W(l, FP4RL_LP_V_W), W(l, FP4RL_LP_V_B), N, C, KD,
                             share_v ? &ln1_op : NULL));
    /* an FP32 linear input the backward does not read dies here (saved: its BF16 operand) */
    const int keep_qk = fp4rl_linear_reads_x(m, &s_qk), keep_blk = fp4rl_linear_reads_x(m, &s_blk);
    if (!keep_qk && !keep_blk) {
        fp4rl_arena_release(a, A->ln1);
        A->ln1 = NULL;
    }
    TRY(ops->rope_forward(ctx, A->q, A->q, bt->pos, N, Hq, D, theta));
    TRY(ops->rope_forward(ctx, A->k, A->k, bt->pos, N, Hkv, D, theta));
    TRY(ops->attention_forward(ctx, A->att, A->lse, A->q, A->k, A->v, bt->len, bt->B, bt->T, Hq, Hkv, D,
                                 fp4rl_attention_numerics(m, 0)));
    TRY(fp4rl_lin_forward(m, a, &s_blk, &A->sv[FP4RL_LIN_O], o, A->att, W(l, FP4RL_LP_O_W), NULL, N, QD, C, NULL));
    TRY(ops->residual_forward(ctx, A->x1, x_in, o, N * C));
    TRY(ops->rmsnorm_forward(ctx, A->ln2, A->rstd2, A->x1, W(l, FP4RL_LP_LN2), N, C, eps));
    TRY(fp4rl_lin_forward(m, a, &s_blk, &A->sv[FP4RL_LIN_GATE], A->gate, A->ln2, W(l, FP4RL_LP_GATE_W), NULL, N, C, I, NULL));
    ln2_op.xb = A->sv[FP4RL_LIN_GATE].xb;
    ln2_op.xbt = A->sv[FP4RL_LIN_GATE].xbt;
    TRY(fp4rl_lin_forward(m, a, &s_blk, &A->sv[FP4RL_LIN_UP], A->up, A->ln2, W(l, FP4RL_LP_UP_W), NULL, N, C, I,
                             share_up ? &ln2_op : NULL));
    if (!keep_blk) {
        fp4rl_arena_release(a, A->ln2);
        A->ln2 = NULL;
    }
    TRY(ops->swiglu_forward(ctx, A->h, A->gate, A->up, N * I));
    TRY(fp4rl_lin_forward(m, a, &s_blk, &A->sv[FP4RL_LIN_DOWN], o, A->h, W(l, FP4RL_LP_DOWN_W), NULL, N, I, C, NULL));
    if (!keep_blk) {
        fp4rl_arena_release(a, A->h);
        A->h = NULL;
    }
    TRY(ops->residual_forward(ctx, A->x_out, A->x1, o, N * C));
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
