/*
 * rollout.c - the rollout engine (recipes.md section 3, steps 1-2).
 *
 * 1. Sync: the rollout copy of every weight, from the FP32 master weights.
 * 2. Prefill: every distinct prompt once, all its tokens in one forward (chunks of whole prompts),
 *    writing the KV cache's prompt rows, which the prompt's group of completions then shares; the
 *    first token of each completion is sampled from the prompt's last row.
 * 3. Decode: one forward per step over the sequences still running only (a finished one leaves
 *    the batch), each at its own position, reading its prompt's rows and its own completion rows.
 *
 * The draw of a token is numbered by (sampling offset + position, global sequence index), never
 * by the batch row, and every op of a step is row-local when the activations' quantization is
 * (row_local below), so which rows share a forward changes no token and no log-prob: the result
 * is that of feeding every sequence one token per step in lockstep. When the activations'
 * numerics couple rows (a tensor scale, 2D tiles, stochastic rounding indexed by batch position,
 * ResQ masks ranked over the batch) the batch defines the numerics, and the engine runs exactly
 * that lockstep schedule instead: all sequences every step, prompts fed token by token.
 *
 * Every forward (prefill or decode step) runs each block as fp4rl_block_steps (core/model/block.c),
 * the training block's op sequence, with the rollout's linears (the fused path below, else
 * fp4rl_rollout_linear) and attention over the KV cache (kv_store, then attention_rows) as its
 * callbacks (rollout_impl).
 *
 * The KV cache is BF16 when the rollout's attention numerics are (they round k and v to BF16
 * anyway), FP32 otherwise, and holds the rows actually needed: each prompt once plus
 * max_new - 1 rows per completion (lockstep: max prompt + max_new per sequence).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/layout.h"
#include "format/qdq_block.h"
#include "model/block.h"
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
    if (s->mode[X] != FP4RL_NUMERICS_FP32) {
        xq = fp4rl_arena_f32(a, N * IN);
        if (a->st) return a->st;
        st = fp4rl_linear_operand(m, a, xq, x, N, IN, s, X, 0);
        if (!st && s->mode[X] == FP4RL_NUMERICS_FP4 && counts) st = ops->underflow_count(ctx, counts, x, xq, N * IN);
    }
    if (!st) st = ops->linear_forward(ctx, y, xq, wq, b, N, IN, OUT);
    if (st || !resq || s->mode[X] != FP4RL_NUMERICS_FP4) return st;
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
 * ResQ's two GEMMs become one over the 2N rows [Q(x); S(Q(R))], reading Wq once, and its two
 * halves are added (add_halves; q/k/v's and gate/up's consumers, qkv_rope_store and swiglu_rows,
 * read the halves themselves: fast_gemm_halves). Anything else (FP32 numerics,
 * NVFP4's tensor scale, MXFP8's possible BF16 subnormals, 2D activation tiles, stochastic
 * activations, channel-50 / block-50) runs the generic fp4rl_rollout_linear.
 * W4A4 (issue 16, plan_w4): where weights and activations are both HiF4 or both MXFP4, a GEMM whose
 * operand has at most FP4RL_W4_MAX_ROWS rows (the decode steps; ResQ's 2N) reads the packed FP4
 * weights instead of their BF16 copy: rollout_act8 writes the activation's quantization as E4M3
 * bytes and unit scales, linear_forward_w4 multiplies them by the packed weight (about 28% of the
 * BF16 weight's bytes, which bound a decode step). The same products, summed in another order.
 * W4B (issue 16, plan_w4b): where the weights are HiF4 or MXFP4 (any activation numerics of the
 * fused path), a decode GEMM whose operand has at most w4b_rows() rows keeps the BF16 operand and reads
 * the packed weight (linear_forward_w4b: its values dequantized to their exact BF16 in registers,
 * the BF16 tensor cores; the products of the BF16 GEMM over wb, summed in another order).
 * Larger forwards (prefill) keep the BF16 GEMM; the head's weights are BF16 (its spec) and so is
 * its GEMM. */
typedef struct fast_plan {
    int on;
    int fmt;  /* activation: FP4RL_QDQ_* or -1 for BF16 */
    int tf;   /* truncation-free MX scales */
    int resq; /* FP4RL_RESQ_OFF / _DENSE / _2_4 */
    int w4;   /* W4A4 decode GEMMs (plan_w4): the packed weights are kept too */
    int w4b;  /* decode GEMMs on the BF16 operand and the packed weight (plan_w4b); kept too */
    int w4b_rows; /* ... for operands of at most this many rows (w4b_rows) */
    /* ResQ: q/k/v's and gate/up's consumers read the GEMM's two halves (fast_gemm_halves) instead
     * of add_halves' sum. On unless FP4RL_RESQ_HALVES=0 (the HiF4 + ResQ rollout ~3.5% faster on an H100). */
    int halves_direct;
    /* The down projection's operand straight from gate/up's GEMM output (swiglu_act: SwiGLU and the
     * quantizer in one pass, no [N, I] FP32 h). On unless FP4RL_SWIGLU_ACT=0 (the 3B rollouts on an
     * H100, session 20: BF16 +2.4%, HiF4 + ResQ +2.2%); the CPU op is the two ops composed. */
    int swiglu_act;
} fast_plan;

static fast_plan plan_fast(fp4rl_model *m, const fp4rl_linear_spec *s, int resq)
{
    const char *hv = getenv("FP4RL_RESQ_HALVES"), *sa = getenv("FP4RL_SWIGLU_ACT");
    fast_plan f = {.on = 0, .fmt = -1, .resq = FP4RL_RESQ_OFF, .halves_direct = !(hv && hv[0] == '0'), .swiglu_act = !(sa && sa[0] == '0')};
    if (m->rollout_generic || !m->ops->rollout_act || !m->ops->linear_forward_bf16 || !m->ops->pack_bf16) return f;
    if (!fp4rl_linear_bf16_exact(s, FP4RL_ROLE_WEIGHT) || !fp4rl_linear_bf16_exact(s, FP4RL_ROLE_ACTIVATION)) return f;
    if (s->mode[FP4RL_ROLE_ACTIVATION] == FP4RL_NUMERICS_FP4) { /* MXFP4 or HiF4: a qdq_block.h format */
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

/* Row blocks of the fused activation operand: 2 with ResQ (Q(x), then S(Q(R))), else 1. */
static int64_t fast_halves(const fast_plan *f)
{
    return f->fmt >= 0 && (f->resq == FP4RL_RESQ_DENSE || f->resq == FP4RL_RESQ_2_4) ? 2 : 1;
}

/* The weight operand of a fused linear into wb [OUT, K]: wq (the rollout weight values) in BF16. */
static fp4rl_status fast_weight(fp4rl_model *m, uint16_t *wb, const float *wq, int64_t OUT, int64_t K)
{
    return m->ops->pack_bf16(m->ctx, wb, K, wq, OUT, K);
}

/* A fused linear's activation operand (fast_act): BF16 words xb or, on the W4A4 path, E4M3 bytes a8
 * and their unit scales sa, which follow the bytes in a8's allocation; w4b: xb goes to the packed
 * weight (linear_forward_w4b) instead of wb. */
typedef struct fast_opnd {
    const uint16_t *xb;
    const uint8_t *a8;
    const float *sa;
    int w4b;
} fast_opnd;

static const void *opnd_buf(const fast_opnd *o) { return o->a8 ? (const void *)o->a8 : (const void *)o->xb; }

/* Whether a fused linear over N rows takes the W4A4 operand (decode steps: few enough rows). */
static int fast_w4(const fast_plan *f, int64_t N) { return f->w4 && fast_halves(f) * N <= FP4RL_W4_MAX_ROWS; }

/* Whether a fused linear over N rows multiplies its BF16 operand by the packed weight: decode steps
 * whose operand (ResQ's 2N) has at most f->w4b_rows rows, not prefills, whose tensor-core GEMMs on
 * wb are compute-bound and faster. */
static int fast_w4b(const fast_plan *f, int64_t N) { return f->w4b && !fast_w4(f, N) && fast_halves(f) * N <= f->w4b_rows; }

/* The fused activation operand of x [N, K] (fast_halves(f) * N rows): the W4A4 one where f->w4 and
 * the rows are few enough (decode steps), else BF16; both pointers NULL on failure (a->st). */
static fast_opnd fast_act(fp4rl_model *m, fp4rl_arena *a, const fast_plan *f, const float *x, int64_t N, int64_t K,
                          unsigned long long *counts)
{
    fast_opnd o = {NULL, NULL, NULL, 0};
    if (fast_w4(f, N)) {
        const int64_t rows = fast_halves(f) * N;
        const int64_t U = fp4rl_qdq_block_size(f->fmt), Kp = (K + U - 1) / U * U, bytes = (rows * Kp + 15) / 16 * 16;
        uint8_t *p = fp4rl_arena_alloc(a, bytes + (Kp / U) * FP4RL_FP8_SCALE_LD(rows) * (int64_t)sizeof(float), 1);
        if (p) a->st = m->ops->rollout_act8(m->ctx, p, (float *)(p + bytes), counts, x, N, K, f->fmt, f->tf, f->resq);
        if (!a->st) o.a8 = p, o.sa = (const float *)(p + bytes);
        return o;
    }
    uint16_t *xb = fp4rl_arena_alloc(a, fast_halves(f) * N * K, sizeof(uint16_t));
    if (xb) a->st = m->ops->rollout_act(m->ctx, xb, f->fmt >= 0 ? counts : NULL, x, N, K, f->fmt, f->tf, f->resq);
    if (!a->st) o.xb = xb, o.w4b = fast_w4b(f, N);
    return o;
}

/* y [rows, OUT] = x w^T (+ b) on x's path: wb the weight in BF16, wt packed (W4A4, W4B). */
static fp4rl_status fast_mm(fp4rl_model *m, const fast_opnd *x, const uint16_t *wb, const fp4rl_tensor *wt, float *y, const float *b,
                            int64_t rows, int64_t K, int64_t OUT)
{
    if (x->a8) return m->ops->linear_forward_w4(m->ctx, y, x->a8, x->sa, wt, b, rows, K, OUT);
    if (x->w4b) return m->ops->linear_forward_w4b(m->ctx, y, x->xb, wt, b, rows, K, OUT);
    return m->ops->linear_forward_bf16(m->ctx, y, x->xb, wb, b, rows, K, OUT);
}

/* y [N, OUT] = x w^T + b, x from fast_act. With ResQ one GEMM of 2N rows (w read once) into ys
 * [2N, OUT], then its halves added: Q(x) w^T + b + S(Q(R)) w^T, as the generic path's two GEMMs. */
static fp4rl_status fast_gemm(fp4rl_model *m, const fast_plan *f, float *y, float *ys, const fast_opnd *x, const uint16_t *wb,
                              const fp4rl_tensor *wt, const float *b, int64_t N, int64_t K, int64_t OUT)
{
    if (fast_halves(f) == 1) return fast_mm(m, x, wb, wt, y, b, N, K, OUT);
    fp4rl_status st = fast_mm(m, x, wb, wt, ys, NULL, 2 * N, K, OUT);
    return st ? st : m->ops->add_halves(m->ctx, y, ys, b, N, OUT);
}

/* A fused GEMM's output as an op reading halves takes it (qkv_rope_store, swiglu_rows: x, lo, bias). */
typedef struct fast_out {
    const float *x, *lo, *bias;
} fast_out;

/* fast_gemm for a consumer that adds ResQ's halves itself: with ResQ (and f->halves_direct), the
 * GEMM of 2N rows into ys and out = {ys, ys + N * OUT, b}, the sum add_halves would write left to
 * the consumer (no [N, OUT] round trip; the same bits, core/backend/halves.h); else fast_gemm's
 * y = x w^T + b and out = {y}. */
static fp4rl_status fast_gemm_halves(fp4rl_model *m, const fast_plan *f, fast_out *out, float *y, float *ys, const fast_opnd *x,
                                     const uint16_t *wb, const fp4rl_tensor *wt, const float *b, int64_t N, int64_t K, int64_t OUT)
{
    if (fast_halves(f) == 1 || !f->halves_direct) {
        *out = (fast_out){y, NULL, NULL};
        return fast_gemm(m, f, y, ys, x, wb, wt, b, N, K, OUT);
    }
    *out = (fast_out){ys, ys + N * OUT, b};
    return fast_mm(m, x, wb, wt, ys, NULL, 2 * N, K, OUT);
}

/* A prefill's activation operands go back once their GEMM is queued (a chunk of 8,192 rows held
 * each layer's to its end: 7B with ResQ, ~1 GB a layer). Decode steps keep theirs: a recorded
 * graph's replays use every address it recorded, and the eager step before a recording is what
 * leaves the allocator holding the recording's block sizes. */
static void act_done(fp4rl_arena *a, int keep, const fast_opnd *x)
{
    if (!keep) fp4rl_arena_release(a, (void *)opnd_buf(x));
}

/* y = x w^T + b with x's operand from fast_act; ys: fast_gemm's. */
static fp4rl_status fast_linear(fp4rl_model *m, fp4rl_arena *a, const fast_plan *f, float *y, float *ys, const float *x,
                                const uint16_t *wb, const fp4rl_tensor *wt, const float *b, int64_t N, int64_t K, int64_t OUT,
                                unsigned long long *counts, int keep)
{
    const fast_opnd xo = fast_act(m, a, f, x, N, K, counts);
    if (!opnd_buf(&xo)) return a->st;
    const fp4rl_status st = fast_gemm(m, f, y, ys, &xo, wb, wt, b, N, K, OUT);
    act_done(a, keep, &xo);
    return st;
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

enum { PREFILL_ROWS = 8192, PREFILL_SEQS = 1024 }; /* a prefill forward's rows and sampled sequences at most */

static int is_stop(const fp4rl_rollout_cfg *cfg, int32_t tok)
{
    for (int64_t i = 0; i < cfg->n_stop; i++)
        if (cfg->stop[i] == tok) return 1;
    return 0;
}

/* Whether a linear's activation operand is a function of its own row alone: FP32 / BF16, or a
 * quantized format in 1D blocks with round-to-nearest and no tensor scale, with ResQ off, dense
 * or 2:4 (the channel and block patterns rank over the batch). */
static int row_local(fp4rl_model *m, const fp4rl_linear_spec *s, int resq)
{
    const fp4rl_role X = FP4RL_ROLE_ACTIVATION;
    if (s->mode[X] != FP4RL_NUMERICS_FP4) return 1;
    fp4rl_qparams p;
    if (s->tile[X] != 0 || fp4rl_format_of(s->fmt[X]).tensor_scale) return 0;
    if (fp4rl_policy_resolve(m->policy, s->fmt[X], X, m->ctx, &p, "rollout") || p.stochastic) return 0;
    return resq == FP4RL_RESQ_OFF || resq == FP4RL_RESQ_DENSE || resq == FP4RL_RESQ_2_4;
}

/* What every forward of one rollout shares: the rollout weights, plans and KV cache. */
typedef struct engine {
    fp4rl_model *m;
    fp4rl_linear_spec s_qk, s_blk, s_head;
    fast_plan f_qk, f_blk, f_head;
    int resq, kv_bf16;
    int share_qkv;                /* q/k/v read one operand: one GEMM (+ qkv_rope_store); gate/up: one whenever f_blk.on */
    int lockstep;                 /* the lockstep schedule: row-coupled numerics (or tests asked for it) */
    fp4rl_att_numerics att_nm;
    float **wq, *whead;
    uint16_t **wb, *whead_b;      /* fused groups: a group's weights are consecutive rows of one buffer */
    fp4rl_tensor **wt;            /* W4A4 plans: the packed weights, one tensor a fused group (at its first linear) */
    float *bqkv;                  /* share_qkv: [L, QD + 2 KD], each layer's q | k | v biases */
    unsigned long long *counts64; /* fused path's underflow counts [L, FP4RL_LIN_COUNT, 2] */
    float *counts;                /* generic path's */
    void **kc, **vc;              /* [L] caches of rows x Hkv * D */
    int64_t max_keys;             /* the most keys of any row: max prompt + max_new */
    int64_t pad_row;              /* the cache row of the rows that pad a decode step to its graph's bucket */
    int graphs;                   /* decode steps replayed as CUDA graphs */
    float *pad_counts;            /* host: one pad row's counts (counts, then counts64), [2, L, FP4RL_LIN_COUNT, 2] */
    int64_t pad_rowsteps;         /* pad rows run, whose counts finish_counts takes off */
    fp4rl_arena keep;
} engine;

/* The fused groups' layout: the first linear of r's group, r's first row in the group's buffer,
 * and the group's rows (q | k | v and gate | up when fused; any other linear is its own group). */
static int fused_first(const engine *e, int r)
{
    if (e->share_qkv && r <= FP4RL_LIN_V) return FP4RL_LIN_Q;
    if (e->f_blk.on && r == FP4RL_LIN_UP) return FP4RL_LIN_GATE;
    return r;
}
static int64_t lin_rows(const engine *e, int r) /* linear r's outputs: its weight's rows */
{
    return e->m->params[fp4rl_model_lp(0, fp4rl_lin_weight(r))].dims[0];
}
static int64_t fused_offset(const engine *e, int r)
{
    int64_t off = 0;
    for (int g = fused_first(e, r); g < r; g++) off += lin_rows(e, g);
    return off;
}
static int64_t fused_rows(const engine *e, int r)
{
    int64_t n = 0;
    for (int g = r; g < FP4RL_LIN_COUNT && fused_first(e, g) == r; g++) n += lin_rows(e, g);
    return n;
}

/* The plan linear r's GEMM runs under: v's is q's when q/k/v share one GEMM. */
static const fast_plan *plan_of(const engine *e, int r)
{
    return r <= FP4RL_LIN_K || (e->share_qkv && r == FP4RL_LIN_V) ? &e->f_qk : &e->f_blk;
}
/* The spec of a group's (or a lone linear's) weight, r its first linear (fused_first). */
static const fp4rl_linear_spec *weight_spec(const engine *e, int r) { return r <= FP4RL_LIN_K ? &e->s_qk : &e->s_blk; }

/* Whether the weights of spec s (its linears the bits of `lins`, one a FP4RL_LIN_*) can be kept
 * packed for the decode GEMMs: HiF4 or MXFP4, nearest, 1D along K or in the tiles the kernels read
 * (HiF4 64, MXFP4 32) with every linear's rows a multiple of the tile (then a fused group quantized
 * as one tensor has the codes and scales of its linears quantized alone, w4_weight), and every
 * linear's K a multiple of kmult. */
static int packed_weights_ok(const engine *e, const fp4rl_linear_spec *s, unsigned lins, int64_t kmult)
{
    fp4rl_model *m = e->m;
    const fp4rl_role W = FP4RL_ROLE_WEIGHT;
    if (s->mode[W] != FP4RL_NUMERICS_FP4 || (s->fmt[W] != FP4RL_DTYPE_HIF4 && s->fmt[W] != FP4RL_DTYPE_MXFP4)) return 0;
    fp4rl_qparams p;
    if (fp4rl_policy_resolve(m->policy, s->fmt[W], W, m->ctx, &p, "rollout") || p.stochastic) return 0;
    if (p.tile != 0 && p.tile != (s->fmt[W] == FP4RL_DTYPE_HIF4 ? 64 : 32)) return 0;
    for (int r = 0; r < FP4RL_LIN_COUNT; r++) {
        if (!(lins >> r & 1u)) continue;
        const int64_t *d = m->params[fp4rl_model_lp(0, fp4rl_lin_weight(r))].dims;
        if (d[1] % kmult || (p.tile && d[0] % p.tile)) return 0;
    }
    return 1;
}

/* Whether plan f (its weights' spec s; its linears `lins`) takes the W4A4 decode GEMMs:
 * FP4RL_ROLLOUT_W4=1 turns it on (where the rest holds) on either backend; unset or 0 it is off:
 * opt-in until its kernels pay (the CPU's BF16 GEMM is the faster reference); the fused plan with
 * activations HiF4 or MXFP4 (1D, nearest: plan_fast), the weights packable (packed_weights_ok) in
 * the same format, every linear's K whole units. */
static int plan_w4(const engine *e, const fp4rl_linear_spec *s, const fast_plan *f, unsigned lins)
{
    fp4rl_model *m = e->m;
    const char *env = getenv("FP4RL_ROLLOUT_W4");
    if (!(env && env[0] == '1') || !f->on || (f->fmt != FP4RL_QDQ_HIF4 && f->fmt != FP4RL_QDQ_MXFP4) || !m->ops->rollout_act8 ||
        !m->ops->linear_forward_w4)
        return 0;
    return (int)s->fmt[FP4RL_ROLE_WEIGHT] == f->fmt && packed_weights_ok(e, s, lins, fp4rl_qdq_block_size(f->fmt));
}

/* Whether plan f takes the W4B decode GEMMs, where W4A4 does not: the fused plan (any activation
 * numerics) with the weights packable (packed_weights_ok), every linear's K a multiple of 64. On by
 * default on a GPU, where the weights are re-laid out for the kernel and it measured faster (the 3B
 * HiF4 + ResQ rollout at 2 x 8 on an H100, session 21: 3,942 tok/s with it, 3,372 without, BF16
 * 3,587); FP4RL_ROLLOUT_W4B=0 turns it off, =1 on, on either backend (the CPU's op dequantizes at
 * every call: slower than its BF16 copy, so off there by default). The backend's own gate
 * (linear_w4b_ok) is asked once the weights exist. */
static int plan_w4b(const engine *e, const fp4rl_linear_spec *s, const fast_plan *f, unsigned lins)
{
    fp4rl_model *m = e->m;
    const char *env = getenv("FP4RL_ROLLOUT_W4B");
    const int on = env && (env[0] == '0' || env[0] == '1') ? env[0] == '1' : m->ctx->device != FP4RL_DEVICE_CPU;
    if (!on || !f->on || f->w4 || !m->ops->linear_forward_w4b || !m->ops->linear_w4b_ok) return 0;
    return packed_weights_ok(e, s, lins, 64);
}
/* The W4B GEMMs' operand rows at most (FP4RL_ROLLOUT_W4B_ROWS=n overrides, read at each rollout). W4B
 * pays where the GEMM is bound by the weight's bytes: on an H100 (session 21, fp4rl_bench w4b) the
 * re-laid-out HiF4 kernel ran 0.96-1.99x cuBLASLt BF16 at 1 to 32 rows at the 8192^2 and 3B shapes,
 * 0.76-1.54x at 64, 1.04-1.23x at 128, 0.52-1.15x at 256 (ResQ's 2N at 128 sequences); the rollout
 * at 32 rows (ResQ: 16 sequences) measured faster with it. */
static int w4b_rows(void)
{
    const char *env = getenv("FP4RL_ROLLOUT_W4B_ROWS");
    const long v = env ? strtol(env, NULL, 10) : 0;
    return v > 0 && v <= (1L << 30) ? (int)v : 32;
}

/* The packed weight of layer l's linear r (r its group's first) for the W4A4 path into e->wt: the
 * group's FP32 master weights side by side (rows in wb's order), quantized as one tensor with the
 * weight spec's parameters as qdq_rows quantizes each (fp4rl_quantize_rows), so its dequantized
 * values are those wb holds (plan_w4's layouts quantize every row's units alone, or tiles within
 * one linear). */
static fp4rl_status w4_weight(engine *e, int64_t l, int r)
{
    fp4rl_model *m = e->m;
    const int64_t rows = fused_rows(e, r), K = m->params[fp4rl_model_lp(0, fp4rl_lin_weight(r))].dims[1];
    fp4rl_arena tmp = {.ctx = m->ctx};
    float *src = m->w + m->params[fp4rl_model_lp((int)l, fp4rl_lin_weight(r))].offset;
    fp4rl_status st = FP4RL_OK;
    if (rows != lin_rows(e, r)) { /* a fused group: its members' rows one after another */
        src = fp4rl_arena_f32(&tmp, rows * K);
        st = tmp.st;
        for (int g = r; !st && g < FP4RL_LIN_COUNT && fused_first(e, g) == r; g++)
            st = m->ops->copy(m->ctx, src + fused_offset(e, g) * K, m->w + m->params[fp4rl_model_lp((int)l, fp4rl_lin_weight(g))].offset,
                              lin_rows(e, g) * K);
    }
    const fp4rl_linear_spec *s = weight_spec(e, r);
    if (!st) st = fp4rl_quantize_rows(m, &e->wt[l * FP4RL_LIN_COUNT + r], src, rows, K, s->fmt[FP4RL_ROLE_WEIGHT], FP4RL_ROLE_WEIGHT);
    fp4rl_arena_free(&tmp);
    return st;
}

/* W4A4, W4B: the packed weights too, a tensor a fused group, made after everything else the rollout
 * holds. W4B is a speed-up that yields to memory (its weights are ~28% of wb's bytes on top of
 * them): where they do not fit, it is dropped and the rollout runs the BF16 GEMMs on wb as without
 * it (on by default on GPUs, it must never make a rollout that fits without it fail). W4A4
 * (opt-in) fails instead. */
static fp4rl_status engine_packed(engine *e, int64_t L)
{
    fp4rl_model *m = e->m;
    fp4rl_context *ctx = m->ctx;
    fp4rl_status st = FP4RL_OK;
    for (int64_t l = 0; l < L && !st; l++)
        for (int r = 0; r < FP4RL_LIN_COUNT && !st; r++)
            if (fused_first(e, r) == r && (plan_of(e, r)->w4 || plan_of(e, r)->w4b)) st = w4_weight(e, l, r);
    /* W4B: the backend's gate on the weights as stored (CUDA: an sm_90a build on compute capability
     * 9.0); where it refuses, the BF16 GEMM on wb as without it */
    for (int r = 0; r < FP4RL_LIN_COUNT && !st && L > 0; r++) {
        fast_plan *f = (fast_plan *)plan_of(e, r);
        if (f->w4b && fused_first(e, r) == r && m->ops->linear_w4b_ok(ctx, e->wt[r]) != FP4RL_OK) f->w4b = 0;
    }
    /* and its layout (CUDA: HiF4, and MXFP4 whose scales allow it, in the A fragments' order, one
     * 16-byte load a thread a chunk), once per rollout; the same results bit for bit */
    for (int64_t l = 0; l < L && !st; l++)
        for (int r = 0; r < FP4RL_LIN_COUNT && !st; r++)
            if (plan_of(e, r)->w4b && fused_first(e, r) == r) st = m->ops->linear_w4b_pack(ctx, e->wt[l * FP4RL_LIN_COUNT + r]);
    if (st == FP4RL_ERR_OUT_OF_MEMORY && !e->f_qk.w4 && !e->f_blk.w4) {
        for (int64_t i = 0; i < L * FP4RL_LIN_COUNT; i++) {
            fp4rl_tensor_destroy(e->wt[i]);
            e->wt[i] = NULL;
        }
        e->f_qk.w4b = e->f_blk.w4b = 0;
        st = FP4RL_OK;
    }
    return st;
}

/* Step 1: the plans and the schedule, the rollout copy of every weight, the counters and the
 * caches for B sequences of prompts of prompt_rows tokens in all (max_keys = max prompt + max_new,
 * cap = max_new - 1 rows a completion). */
static fp4rl_status engine_init(engine *e, fp4rl_model *m, int64_t B, int64_t prompt_rows, int64_t max_keys, int64_t cap)
{
    fp4rl_context *ctx = m->ctx;
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t L = c->num_hidden_layers, V = c->vocab_size, C = c->hidden_size;
    const int64_t KD = c->num_key_value_heads * c->head_dim;
    memset(e, 0, sizeof *e);
    e->m = m;
    e->keep.ctx = ctx;
    e->resq = (int)fp4rl_policy_value(m->policy, FP4RL_QP_RESQ);
    e->s_qk = fp4rl_block_linear_spec(m, 1, 1);
    e->s_blk = fp4rl_block_linear_spec(m, 0, 1);
    e->s_head = fp4rl_head_linear_spec(m, 1);
    e->att_nm = fp4rl_attention_numerics(m, 1);
    e->kv_bf16 = e->att_nm == FP4RL_ATT_BF16;
    e->f_qk = plan_fast(m, &e->s_qk, e->resq);
    e->f_blk = plan_fast(m, &e->s_blk, e->resq);
    e->f_head = plan_fast(m, &e->s_head, 0);
    e->share_qkv = same_plan(&e->f_qk, &e->f_blk);
    {
        const unsigned Q = 1u << FP4RL_LIN_Q | 1u << FP4RL_LIN_K, V = 1u << FP4RL_LIN_V;
        const unsigned REST = 1u << FP4RL_LIN_O | 1u << FP4RL_LIN_GATE | 1u << FP4RL_LIN_UP | 1u << FP4RL_LIN_DOWN;
        const fp4rl_role W = FP4RL_ROLE_WEIGHT;
        e->f_qk.w4 = plan_w4(e, &e->s_qk, &e->f_qk, e->share_qkv ? Q | V : Q);
        e->f_blk.w4 = plan_w4(e, &e->s_blk, &e->f_blk, e->share_qkv ? REST : V | REST);
        e->f_qk.w4b = plan_w4b(e, &e->s_qk, &e->f_qk, e->share_qkv ? Q | V : Q);
        e->f_blk.w4b = plan_w4b(e, &e->s_blk, &e->f_blk, e->share_qkv ? REST : V | REST);
        e->f_qk.w4b_rows = e->f_blk.w4b_rows = w4b_rows();
        /* one q | k | v tensor: v's weight must be quantized as q's and k's */
        if (e->share_qkv && (e->s_blk.mode[W] != e->s_qk.mode[W] || e->s_blk.fmt[W] != e->s_qk.fmt[W])) e->f_qk.w4 = e->f_qk.w4b = 0;
    }
    /* the schedule: batched unless the activations' numerics couple the rows of a batch */
    e->lockstep = m->rollout_lockstep || !row_local(m, &e->s_qk, e->resq) || !row_local(m, &e->s_blk, e->resq) ||
                  !row_local(m, &e->s_head, 0);
    const int64_t kv_rows = (e->lockstep ? B * max_keys : prompt_rows + B * cap) + 1; /* + the pad row */
    if (kv_rows > INT32_MAX)
        return fp4rl_fail(FP4RL_ERR_UNSUPPORTED, "rollout: a KV cache of %lld rows (%lld sequences) exceeds 2^31 - 1 rows; use fewer prompts per step",
                          (long long)kv_rows, (long long)B);
    e->pad_row = kv_rows - 1;
    e->max_keys = max_keys;
    /* graphs where no linear quantizes activations outside the fused path (the generic quantizer
     * reads flags back to the host, which a recording cannot) */
    const fp4rl_role X = FP4RL_ROLE_ACTIVATION;
    e->graphs = ctx->be->graph_begin && !m->rollout_eager && (e->f_qk.on || e->s_qk.mode[X] != FP4RL_NUMERICS_FP4) &&
                (e->f_blk.on || e->s_blk.mode[X] != FP4RL_NUMERICS_FP4) && (e->f_head.on || e->s_head.mode[X] != FP4RL_NUMERICS_FP4);
    e->wq = calloc((size_t)(L * FP4RL_LIN_COUNT + 1), sizeof(float *));
    e->wb = calloc((size_t)(L * FP4RL_LIN_COUNT + 1), sizeof(uint16_t *));
    e->wt = calloc((size_t)(L * FP4RL_LIN_COUNT + 1), sizeof(fp4rl_tensor *));
    e->kc = calloc((size_t)L, sizeof(void *));
    e->vc = calloc((size_t)L, sizeof(void *));
    if (!e->wq || !e->wb || !e->wt || !e->kc || !e->vc) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "rollout: out of host memory");
    fp4rl_arena *keep = &e->keep;
    fp4rl_status st = FP4RL_OK;
    for (int64_t l = 0; l < L && !st; l++)
        for (int r = 0; r < FP4RL_LIN_COUNT && !st; r++) {
            const fp4rl_param *p = &m->params[fp4rl_model_lp((int)l, fp4rl_lin_weight(r))];
            const fp4rl_linear_spec *s = r <= FP4RL_LIN_K ? &e->s_qk : &e->s_blk;
            const fast_plan *f = r <= FP4RL_LIN_K ? &e->f_qk : &e->f_blk;
            float *w = m->w + p->offset, **wq = &e->wq[l * FP4RL_LIN_COUNT + r];
            *wq = w;
            if (s->mode[FP4RL_ROLE_WEIGHT] == FP4RL_NUMERICS_FP32) continue;
            fp4rl_arena tmp = {.ctx = ctx}, *wa = f->on ? &tmp : keep; /* the fused path keeps only BF16 */
            *wq = fp4rl_arena_f32(wa, p->numel);
            st = wa->st ? wa->st : fp4rl_linear_operand(m, wa, *wq, w, p->dims[0], p->dims[1], s, FP4RL_ROLE_WEIGHT, 0);
            if (!st && f->on) { /* into its fused group's buffer (made by the group's first linear) */
                const int g = fused_first(e, r);
                if (g == r) e->wb[l * FP4RL_LIN_COUNT + r] = fp4rl_arena_alloc(keep, fused_rows(e, r) * p->dims[1], sizeof(uint16_t));
                uint16_t *dst = e->wb[l * FP4RL_LIN_COUNT + g];
                st = keep->st;
                if (!st) {
                    dst += fused_offset(e, r) * p->dims[1];
                    e->wb[l * FP4RL_LIN_COUNT + r] = dst;
                    st = fast_weight(m, dst, *wq, p->dims[0], p->dims[1]);
                }
            }
            if (f->on) fp4rl_arena_free(&tmp);
        }
    float *head = fp4rl_model_w(m, fp4rl_model_p_head(m));
    e->whead = head;
    if (!st && e->s_head.mode[FP4RL_ROLE_WEIGHT] != FP4RL_NUMERICS_FP32) {
        e->whead = fp4rl_arena_f32(keep, V * C);
        st = keep->st ? keep->st : fp4rl_linear_operand(m, keep, e->whead, head, V, C, &e->s_head, FP4RL_ROLE_WEIGHT, 0);
    }
    if (!st && e->f_head.on) {
        e->whead_b = fp4rl_arena_alloc(keep, V * C, sizeof(uint16_t));
        st = keep->st ? keep->st : fast_weight(m, e->whead_b, e->whead, V, C);
    }
    if (!st && e->share_qkv) { /* the layers' q | k | v biases, side by side as the fused GEMM's outputs */
        const int64_t QD = c->num_attention_heads * c->head_dim, W3 = QD + 2 * KD;
        e->bqkv = fp4rl_arena_f32(keep, L * W3);
        st = keep->st;
        for (int64_t l = 0; l < L && !st; l++) {
            float *b = e->bqkv + l * W3;
            st = m->ops->copy(ctx, b, fp4rl_model_w(m, fp4rl_model_lp((int)l, FP4RL_LP_Q_B)), QD);
            if (!st) st = m->ops->copy(ctx, b + QD, fp4rl_model_w(m, fp4rl_model_lp((int)l, FP4RL_LP_K_B)), KD);
            if (!st) st = m->ops->copy(ctx, b + QD + KD, fp4rl_model_w(m, fp4rl_model_lp((int)l, FP4RL_LP_V_B)), KD);
        }
    }
    if (st) return st;
    e->counts64 = fp4rl_arena_alloc(keep, L * FP4RL_LIN_COUNT * 2, sizeof(unsigned long long));
    e->counts = fp4rl_arena_zeros(keep, L * FP4RL_LIN_COUNT * 2);
    if (keep->st) return keep->st;
    st = ctx->be->memset0(ctx, e->counts64, (size_t)(L * FP4RL_LIN_COUNT * 2) * sizeof(unsigned long long));
    const size_t elem = e->kv_bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int64_t l = 0; l < L && !st; l++) {
        e->kc[l] = fp4rl_arena_alloc(keep, kv_rows * KD, elem);
        e->vc[l] = fp4rl_arena_alloc(keep, kv_rows * KD, elem);
        st = keep->st;
    }
    return st ? st : engine_packed(e, L);
}

static void engine_free(engine *e)
{
    const int64_t n = e->m ? e->m->cfg.num_hidden_layers * FP4RL_LIN_COUNT : 0;
    for (int64_t i = 0; e->wt && i < n; i++) fp4rl_tensor_destroy(e->wt[i]);
    free(e->wt);
    fp4rl_arena_free(&e->keep);
    free(e->pad_counts);
    free(e->wq);
    free(e->wb);
    free(e->kc);
    free(e->vc);
}

/* One forward's rows, as host arrays packed into one upload: row n feeds token tok[n] at position
 * pos[n], writes its k and v to cache row kvrow[n] and attends to the keys seg[4n .. 4n + 3]
 * (attention_rows); the head runs on the Nh rows hidx (or all N rows, hidx NULL) and the draw of
 * sampled row i is numbered (offset + steps[i], row0 + seqs[i]). */
typedef struct rows_batch {
    int64_t N, Nh;
    int32_t *h;                                       /* host: N * 7 + Nh * 3 */
    int32_t *tok, *pos, *kvrow, *seg, *hidx, *steps, *seqs; /* into h */
} rows_batch;

static fp4rl_status rows_alloc(rows_batch *r, int64_t N, int64_t Nh)
{
    r->N = N;
    r->Nh = Nh;
    r->h = calloc((size_t)(N * 7 + Nh * 3 + 1), sizeof(int32_t));
    if (!r->h) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "rollout: out of host memory");
    r->tok = r->h;
    r->pos = r->tok + N;
    r->kvrow = r->pos + N;
    r->seg = r->kvrow + N;
    r->hidx = r->seg + 4 * N;
    r->steps = r->hidx + Nh;
    r->seqs = r->steps + Nh;
    return FP4RL_OK;
}

/* The rollout's linears and attention for fp4rl_block_steps over a forward's N rows: a linear on
 * the fused path (fast_linear) or the generic one (fp4rl_rollout_linear), each counting its
 * activation's underflows; attention over the KV cache: the rows' k and v stored at cache rows
 * kvrow, then attention_rows over the keys seg. */
typedef struct rollout_impl {
    engine *e;
    fp4rl_arena *step;
    int64_t N;
    const int32_t *kvrow, *seg; /* device */
    float *qkv, *gu;            /* the fused groups' GEMM outputs [N, QD + 2 KD], [N, 2I] (NULL with ResQ: ys) */
    float *ys;                  /* ResQ: a fused GEMM's 2N rows (fast_gemm), or NULL */
    int keep;                   /* a decode step: its activation operands live to its end (act_done) */
    fast_opnd down;             /* down_proj's operand from swiglu_act (rollout_block_gate_up), until its linear takes it */
} rollout_impl;

static fp4rl_status rollout_block_linear(void *user, int64_t l, int which, float *y, float *x, int64_t IN, int64_t OUT,
                                         const float *bias)
{
    rollout_impl *r = user;
    const engine *e = r->e;
    const int64_t i = l * FP4RL_LIN_COUNT + which;
    const int qk = which <= FP4RL_LIN_K;
    const fast_plan *f = qk ? &e->f_qk : &e->f_blk;
    /* (q/k/v with one operand and gate/up on the fused path come through rollout_block_qkv and
     * _gate_up: each linear here has an operand of its own, down_proj's perhaps made already) */
    if (which == FP4RL_LIN_DOWN && r->down.xb) {
        const fast_opnd xo = r->down;
        r->down.xb = NULL;
        const fp4rl_status st = fast_gemm(e->m, f, y, r->ys, &xo, e->wb[i], e->wt[i], bias, r->N, IN, OUT);
        act_done(r->step, r->keep, &xo);
        return st;
    }
    if (f->on)
        return fast_linear(e->m, r->step, f, y, r->ys, x, e->wb[i], e->wt[i], bias, r->N, IN, OUT, e->counts64 + i * 2, r->keep);
    return fp4rl_rollout_linear(e->m, r->step, qk ? &e->s_qk : &e->s_blk, e->resq, y, x, e->wq[i], bias, r->N, IN, OUT,
                                e->counts + i * 2);
}

/* q/k/v as one GEMM on the shared activation operand of ln1 (its underflows counted at q's), then
 * rope on q and on k, k and v going straight into the cache (share_qkv). */
static fp4rl_status rollout_block_qkv(void *user, int64_t l, float *q, float *k, float *v, float *ln1, const int32_t *pos)
{
    rollout_impl *r = user;
    const engine *e = r->e;
    fp4rl_model *m = e->m;
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t C = c->hidden_size, Hq = c->num_attention_heads, Hkv = c->num_key_value_heads, D = c->head_dim;
    const int64_t i = l * FP4RL_LIN_COUNT + FP4RL_LIN_Q, W3 = (Hq + 2 * Hkv) * D;
    (void)k, (void)v;
    const fast_opnd xs = fast_act(m, r->step, &e->f_qk, ln1, r->N, C, e->counts64 + i * 2);
    if (!opnd_buf(&xs)) return r->step->st;
    fast_out y;
    fp4rl_status st = fast_gemm_halves(m, &e->f_qk, &y, r->qkv, r->ys, &xs, e->wb[i], e->wt[i], e->bqkv + l * W3, r->N, C, W3);
    act_done(r->step, r->keep, &xs);
    return st ? st : m->ops->qkv_rope_store(m->ctx, q, e->kc[l], e->vc[l], e->kv_bf16, y.x, y.lo, y.bias, pos, r->kvrow, r->N,
                                            Hq, Hkv, D, (float)c->rope_theta);
}

/* gate/up as one GEMM on the shared activation operand of ln2 (counted at gate's), then SwiGLU of
 * its two halves (f_blk.on): into h, or (swiglu_act, unless down_proj takes the W4A4 path) straight
 * into down_proj's operand, which rollout_block_linear then uses (h is not written). */
static fp4rl_status rollout_block_gate_up(void *user, int64_t l, float *h, float *ln2)
{
    rollout_impl *r = user;
    const engine *e = r->e;
    fp4rl_model *m = e->m;
    const int64_t C = m->cfg.hidden_size, I = m->cfg.intermediate_size, i = l * FP4RL_LIN_COUNT + FP4RL_LIN_GATE;
    const fast_opnd xs = fast_act(m, r->step, &e->f_blk, ln2, r->N, C, e->counts64 + i * 2);
    if (!opnd_buf(&xs)) return r->step->st;
    fast_out y;
    const fast_plan *f = &e->f_blk;
    fp4rl_status st = fast_gemm_halves(m, f, &y, r->gu, r->ys, &xs, e->wb[i], e->wt[i], NULL, r->N, C, 2 * I);
    act_done(r->step, r->keep, &xs);
    if (st) return st;
    if (!f->swiglu_act || fast_w4(f, r->N)) return m->ops->swiglu_rows(m->ctx, h, y.x, y.lo, y.bias, r->N, I);
    const int64_t d = l * FP4RL_LIN_COUNT + FP4RL_LIN_DOWN;
    uint16_t *xb = fp4rl_arena_alloc(r->step, fast_halves(f) * r->N * I, sizeof(uint16_t));
    if (!xb) return r->step->st;
    st = m->ops->swiglu_act(m->ctx, xb, f->fmt >= 0 ? e->counts64 + d * 2 : NULL, y.x, y.lo, y.bias, r->N, I, f->fmt, f->tf, f->resq);
    if (!st) r->down = (fast_opnd){xb, NULL, NULL, fast_w4b(f, r->N)};
    return st;
}

static fp4rl_status rollout_block_attention(void *user, int64_t l, float *att, float *q, float *k, float *v)
{
    const rollout_impl *r = user;
    const engine *e = r->e;
    fp4rl_context *ctx = e->m->ctx;
    const fp4rl_ops *ops = e->m->ops;
    const fp4rl_hf_config *c = &e->m->cfg;
    const int64_t Hkv = c->num_key_value_heads, D = c->head_dim;
    fp4rl_status st = FP4RL_OK;
    if (!e->share_qkv) { /* else rollout_block_qkv stored them */
        st = ops->kv_store(ctx, e->kc[l], e->kv_bf16, k, r->kvrow, r->N, Hkv * D);
        if (!st) st = ops->kv_store(ctx, e->vc[l], e->kv_bf16, v, r->kvrow, r->N, Hkv * D);
    }
    if (!st)
        st = ops->attention_rows(ctx, att, q, e->kc[l], e->vc[l], e->kv_bf16, r->seg, r->N, e->max_keys, c->num_attention_heads,
                                 Hkv, D, e->att_nm);
    return st;
}

/* Enqueues the forward of a batch of rows (their arrays at d, device, rows_batch's packing) through
 * the rollout numerics and the sampling of its head rows into d_samp, d_slogp; buffers come from
 * `step`. Each block is fp4rl_block_steps (core/model/block.c) in place on x with the rollout's
 * linears and KV-cache attention. Nothing in it waits for the host, so it can be recorded as a
 * graph. */
static fp4rl_status forward_core(engine *e, const fp4rl_rollout_cfg *cfg, fp4rl_arena *step, int64_t N, int64_t Nh,
                                 int use_hidx, const int32_t *d, int32_t *d_samp, float *d_slogp, int keep)
{
    fp4rl_model *m = e->m;
    fp4rl_context *ctx = m->ctx;
    const fp4rl_ops *ops = m->ops;
    const fp4rl_hf_config *c = &m->cfg;
    const int64_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    const int64_t L = c->num_hidden_layers, QD = c->num_attention_heads * c->head_dim, KD = c->num_key_value_heads * c->head_dim;
    const float eps = (float)c->rms_norm_eps;
    float *x = fp4rl_arena_f32(step, N * C), *ln = fp4rl_arena_f32(step, N * C), *rstd = fp4rl_arena_f32(step, N);
    /* fused groups: one GEMM output in place of k and v, of gate and up */
    float *q = fp4rl_arena_f32(step, N * QD), *qkv = NULL, *k = NULL, *v = NULL, *gu = NULL, *gate = NULL, *up = NULL;
    /* (with ResQ their consumers read ys's halves: fast_gemm_halves) */
    if (e->share_qkv) qkv = fast_halves(&e->f_qk) == 2 && e->f_qk.halves_direct ? NULL : fp4rl_arena_f32(step, N * (QD + 2 * KD));
    else k = fp4rl_arena_f32(step, N * KD), v = fp4rl_arena_f32(step, N * KD);
    if (e->f_blk.on) gu = fast_halves(&e->f_blk) == 2 && e->f_blk.halves_direct ? NULL : fp4rl_arena_f32(step, N * 2 * I);
    else gate = fp4rl_arena_f32(step, N * I), up = fp4rl_arena_f32(step, N * I);
    float *att = fp4rl_arena_f32(step, N * QD), *o = fp4rl_arena_f32(step, N * C), *x1 = fp4rl_arena_f32(step, N * C);
    float *h = fp4rl_arena_f32(step, N * I);
    /* ResQ's GEMMs of 2N rows: the widest output a fused linear has */
    float *ys = NULL;
    if (fast_halves(&e->f_qk) == 2 || fast_halves(&e->f_blk) == 2) {
        int64_t w = QD + 2 * KD > 2 * I ? QD + 2 * KD : 2 * I;
        ys = fp4rl_arena_f32(step, 2 * N * (w > C ? w : C));
    }
    float *xh = use_hidx ? fp4rl_arena_f32(step, Nh * C) : x, *lnh = use_hidx ? fp4rl_arena_f32(step, Nh * C) : ln;
    float *rstdh = fp4rl_arena_f32(step, Nh), *logits = fp4rl_arena_f32(step, Nh * V);
    fp4rl_status st = step->st;
    if (st) return st;
    const int32_t *d_tok = d, *d_pos = d + N, *d_kvrow = d + 2 * N, *d_seg = d + 3 * N, *d_hidx = d + 7 * N;
    const int32_t *d_steps = d_hidx + Nh, *d_seqs = d_steps + Nh;
#define TRY(call) do { if ((st = (call)) != FP4RL_OK) return st; } while (0)
    rollout_impl r = {.e = e, .step = step, .N = N, .kvrow = d_kvrow, .seg = d_seg, .qkv = qkv, .gu = gu, .ys = ys,
                      .keep = keep};
    const fp4rl_block_impl impl = {.linear = rollout_block_linear, .attention = rollout_block_attention, .user = &r,
                                   .qkv = e->share_qkv ? rollout_block_qkv : NULL, .gate_up = e->f_blk.on ? rollout_block_gate_up : NULL};
    const fp4rl_block_bufs b = {.x_in = x, .ln1 = ln, .rstd1 = rstd, .q = q, .k = k, .v = v, .att = att, .o = o, .x1 = x1,
                                .ln2 = ln, .rstd2 = rstd, .gate = gate, .up = up, .h = h, .x_out = x};
    TRY(ops->embedding_forward(ctx, x, d_tok, fp4rl_model_w(m, fp4rl_model_p_embed()), N, V, C));
    for (int64_t l = 0; l < L; l++) TRY(fp4rl_block_steps(m, l, N, d_pos, &b, &impl));
    /* the head on the rows that sample (a prefill samples at each prompt's last row, once per
     * completion of its group) */
    if (use_hidx) TRY(ops->gather_rows(ctx, xh, x, d_hidx, Nh, C));
    TRY(ops->rmsnorm_forward(ctx, lnh, rstdh, xh, fp4rl_model_w(m, fp4rl_model_p_norm(m)), Nh, C, eps));
    if (e->f_head.on) {
        TRY(fast_linear(m, step, &e->f_head, logits, NULL, lnh, e->whead_b, NULL, NULL, Nh, C, V, NULL, keep)); /* never W4: BF16 weights */
    } else {
        if (e->s_head.mode[FP4RL_ROLE_ACTIVATION] == FP4RL_NUMERICS_BF16) TRY(ops->round_bf16(ctx, lnh, lnh, Nh * C));
        TRY(ops->linear_forward(ctx, logits, lnh, e->whead, NULL, Nh, C, V));
    }
    TRY(ops->sample_rows(ctx, d_samp, d_slogp, logits, Nh, V, cfg->temperature, cfg->top_k, cfg->top_p, cfg->seed,
                         cfg->offset, cfg->row0, d_steps, d_seqs));
#undef TRY
    return FP4RL_OK;
}

/* A step's device buffers: the packed row arrays and the sampled tokens and log-probs. */
typedef struct step_io {
    int32_t *d, *d_samp;
    float *d_slogp;
} step_io;

static fp4rl_status io_alloc(fp4rl_arena *a, step_io *io, int64_t N, int64_t Nh)
{
    io->d = fp4rl_arena_alloc(a, N * 7 + Nh * 3, sizeof(int32_t));
    io->d_samp = fp4rl_arena_alloc(a, Nh, sizeof(int32_t));
    io->d_slogp = fp4rl_arena_f32(a, Nh);
    return a->st;
}

static fp4rl_status io_download(fp4rl_context *ctx, const step_io *io, int64_t Nh, int32_t *sampled, float *slogp)
{
    fp4rl_status st = ctx->be->download(ctx, sampled, io->d_samp, (size_t)Nh * sizeof(int32_t));
    return st ? st : ctx->be->download(ctx, slogp, io->d_slogp, (size_t)Nh * sizeof(float));
}

/* forward_core run at once: sampled[i], slogp[i] (host) for head row i. */
static fp4rl_status forward_sample(engine *e, const fp4rl_rollout_cfg *cfg, const rows_batch *rb, int use_hidx,
                                   int32_t *sampled, float *slogp)
{
    fp4rl_context *ctx = e->m->ctx;
    fp4rl_arena step = {.ctx = ctx};
    step_io io;
    fp4rl_status st = io_alloc(&step, &io, rb->N, rb->Nh);
    if (!st) st = ctx->be->upload(ctx, io.d, rb->h, (size_t)(rb->N * 7 + rb->Nh * 3) * sizeof(int32_t));
    if (!st) st = forward_core(e, cfg, &step, rb->N, rb->Nh, use_hidx, io.d, io.d_samp, io.d_slogp, !use_hidx);
    if (!st) st = io_download(ctx, &io, rb->Nh, sampled, slogp);
    fp4rl_arena_free(&step);
    return st;
}

/* The rollout's per-sequence bookkeeping: appends a sampled token, ends the sequence at a stop
 * token or max_new. */
static void record(const fp4rl_rollout_cfg *cfg, fp4rl_rollout_result *res, int *done, int64_t b, int32_t tok, float lp)
{
    const int64_t n = res->lengths[b]++;
    res->tokens[b * cfg->max_new + n] = tok;
    res->logprobs[b * cfg->max_new + n] = lp;
    if (is_stop(cfg, tok)) {
        res->stopped[b] = 1;
        done[b] = 1;
    } else if (n + 1 == cfg->max_new) {
        done[b] = 1;
    }
}

/* ---- decode steps as CUDA graphs ----
 * A step's row count is rounded up to a bucket and the extra rows are pad rows: token 0 at
 * position 0, attending only to itself in a cache row of its own, sampled and ignored. Every op
 * is row-local, so they change no real row; their underflow counts are those of one pad row
 * (measured once, pad_measure) times the pad rows run, taken off at the end. The active count
 * only falls, so one graph lives at a time: a bucket's first step runs eagerly (the allocator
 * then holds its block sizes), its second is recorded, and the rest replay it. */
static int64_t bucket(int64_t n, int64_t B)
{
    const int64_t q = n <= 64 ? 8 : n <= 256 ? 32 : 64, r = (n + q - 1) / q * q;
    return r < B ? r : B;
}

static void pad_rows(const engine *e, rows_batch *rb, int64_t i)
{
    rb->tok[i] = rb->pos[i] = rb->steps[i] = rb->seqs[i] = 0;
    rb->kvrow[i] = rb->seg[4 * i] = (int32_t)e->pad_row;
    rb->seg[4 * i + 1] = 1;
    rb->seg[4 * i + 2] = rb->seg[4 * i + 3] = 0;
}

typedef struct step_graph {
    int64_t rows; /* its bucket; 0 before the first */
    void *g;      /* the recorded step, NULL until the bucket's second step */
    fp4rl_arena a; /* the buffers it addresses */
    step_io io;
} step_graph;

static void graph_free(fp4rl_context *ctx, step_graph *sg)
{
    if (sg->g) ctx->be->graph_destroy(ctx, sg->g);
    fp4rl_arena_free(&sg->a);
    sg->g = NULL;
    sg->rows = 0;
}

static fp4rl_status decode_step(engine *e, const fp4rl_rollout_cfg *cfg, const rows_batch *rb, step_graph *sg,
                                int32_t *sampled, float *slogp)
{
    fp4rl_context *ctx = e->m->ctx;
    if (!sg) return forward_sample(e, cfg, rb, 0, sampled, slogp);
    if (sg->rows != rb->N) {
        graph_free(ctx, sg);
        sg->rows = rb->N;
        return forward_sample(e, cfg, rb, 0, sampled, slogp);
    }
    fp4rl_status st = FP4RL_OK;
    if (!sg->g) {
        st = io_alloc(&sg->a, &sg->io, rb->N, rb->N);
        if (!st) st = ctx->be->graph_begin(ctx);
        if (!st) {
            st = forward_core(e, cfg, &sg->a, rb->N, rb->N, 0, sg->io.d, sg->io.d_samp, sg->io.d_slogp, 1);
            const fp4rl_status end = ctx->be->graph_end(ctx, &sg->g); /* ends the capture in any case */
            if (!st) st = end;
        }
        if (st) return st;
    }
    st = ctx->be->upload(ctx, sg->io.d, rb->h, (size_t)(rb->N * 10) * sizeof(int32_t));
    if (!st) st = ctx->be->graph_launch(ctx, sg->g);
    return st ? st : io_download(ctx, &sg->io, rb->N, sampled, slogp);
}

/* One pad row's underflow counts: a forward of it alone, before anything else is counted. */
static fp4rl_status pad_measure(engine *e, const fp4rl_rollout_cfg *cfg)
{
    fp4rl_context *ctx = e->m->ctx;
    const int64_t n = e->m->cfg.num_hidden_layers * FP4RL_LIN_COUNT * 2;
    int32_t tok;
    float lp;
    rows_batch rb = {0};
    unsigned long long *h64 = malloc((size_t)n * sizeof *h64);
    e->pad_counts = calloc((size_t)(2 * n), sizeof(float));
    fp4rl_status st = h64 && e->pad_counts ? rows_alloc(&rb, 1, 1) : fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "rollout: out of host memory");
    if (st) {
        free(h64);
        return st;
    }
    pad_rows(e, &rb, 0);
    st = forward_sample(e, cfg, &rb, 0, &tok, &lp);
    if (!st) st = ctx->be->download(ctx, e->pad_counts, e->counts, (size_t)n * sizeof(float));
    if (!st) st = ctx->be->download(ctx, h64, e->counts64, (size_t)n * sizeof *h64);
    for (int64_t i = 0; i < n; i++) e->pad_counts[n + i] = (float)h64[i]; /* small integers: exact */
    if (!st) st = ctx->be->memset0(ctx, e->counts, (size_t)n * sizeof(float));
    if (!st) st = ctx->be->memset0(ctx, e->counts64, (size_t)n * sizeof *h64);
    free(rb.h);
    free(h64);
    return st;
}

/* The lockstep schedule (row-coupled numerics): every sequence every step t at position t, fed its
 * prompt's token t while inside it, else its last sampled token; a private cache of Tmax rows each. */
static fp4rl_status run_lockstep(engine *e, const fp4rl_rollout_cfg *cfg, const int32_t *prompts, const size_t *offsets,
                                 int64_t B, int64_t Tmax, fp4rl_rollout_result *res, int *done, int32_t *sampled,
                                 float *slogp)
{
    const int64_t G = cfg->group;
    rows_batch rb = {0};
    fp4rl_status st = rows_alloc(&rb, B, B);
    for (int64_t t = 0; !st && t + 1 < Tmax; t++) {
        int64_t active = 0;
        for (int64_t b = 0; b < B; b++) {
            const int32_t *pr = prompts + offsets[b / G];
            const int64_t plen = (int64_t)(offsets[b / G + 1] - offsets[b / G]);
            rb.tok[b] = t < plen ? pr[t] : (res->lengths[b] ? res->tokens[b * cfg->max_new + res->lengths[b] - 1] : 0);
            rb.pos[b] = (int32_t)t;
            rb.kvrow[b] = (int32_t)(b * Tmax + t);
            rb.seg[4 * b] = (int32_t)(b * Tmax);
            rb.seg[4 * b + 1] = (int32_t)(t + 1);
            rb.seg[4 * b + 2] = rb.seg[4 * b + 3] = 0;
            rb.steps[b] = (int32_t)t;
            rb.seqs[b] = (int32_t)b;
            active += !done[b];
        }
        if (!active) break;
        res->decode_steps++;
        st = forward_sample(e, cfg, &rb, 0, sampled, slogp);
        for (int64_t b = 0; !st && b < B; b++) {
            const int64_t plen = (int64_t)(offsets[b / G + 1] - offsets[b / G]);
            if (!done[b] && t + 1 >= plen) record(cfg, res, done, b, sampled[b], slogp[b]);
        }
    }
    free(rb.h);
    return st;
}

/* Prefill (every distinct prompt once, in chunks of whole prompts) and compacted decode. The cache
 * holds prompt p at rows pb[p] .. pb[p] + plen - 1 and completion b's fed tokens from row
 * cb + b * cap (cap = max_new - 1: the last sampled token is never fed). */
static fp4rl_status run_batched(engine *e, const fp4rl_rollout_cfg *cfg, const int32_t *prompts, const size_t *offsets,
                                int64_t P, int64_t cap, fp4rl_rollout_result *res, int *done, int32_t *sampled,
                                float *slogp)
{
    const int64_t G = cfg->group, B = P * G, cb = (int64_t)offsets[P];
    fp4rl_status st = e->graphs ? pad_measure(e, cfg) : FP4RL_OK;
    /* 2. prefill */
    for (int64_t p0 = 0; !st && p0 < P;) {
        int64_t p1 = p0 + 1;
        while (p1 < P && (int64_t)(offsets[p1 + 1] - offsets[p0]) <= PREFILL_ROWS && (p1 + 1 - p0) * G <= PREFILL_SEQS) p1++;
        rows_batch rb = {0};
        const int64_t r0 = (int64_t)offsets[p0];
        if ((st = rows_alloc(&rb, (int64_t)offsets[p1] - r0, (p1 - p0) * G))) break;
        for (int64_t p = p0; p < p1; p++) {
            const int64_t plen = (int64_t)(offsets[p + 1] - offsets[p]);
            for (int64_t t = 0; t < plen; t++) {
                const int64_t n = (int64_t)offsets[p] - r0 + t;
                rb.tok[n] = prompts[offsets[p] + t];
                rb.pos[n] = (int32_t)t;
                rb.kvrow[n] = (int32_t)(offsets[p] + t);
                rb.seg[4 * n] = (int32_t)offsets[p];
                rb.seg[4 * n + 1] = (int32_t)(t + 1);
                rb.seg[4 * n + 2] = rb.seg[4 * n + 3] = 0;
            }
            for (int64_t g = 0; g < G; g++) {
                const int64_t i = (p - p0) * G + g;
                rb.hidx[i] = (int32_t)((int64_t)offsets[p + 1] - 1 - r0);
                rb.steps[i] = (int32_t)(plen - 1);
                rb.seqs[i] = (int32_t)(p * G + g);
            }
        }
        st = forward_sample(e, cfg, &rb, 1, sampled, slogp);
        for (int64_t i = 0; !st && i < rb.Nh; i++) record(cfg, res, done, rb.seqs[i], sampled[i], slogp[i]);
        free(rb.h);
        p0 = p1;
    }
    /* 3. decode: the sequences still running, each at its own position */
    step_graph sg = {0};
    sg.a.ctx = e->m->ctx;
    while (!st) {
        int64_t n = 0;
        for (int64_t b = 0; b < B; b++) n += !done[b];
        if (!n) break;
        const int64_t nb = e->graphs ? bucket(n, B) : n;
        rows_batch rb = {0};
        if ((st = rows_alloc(&rb, nb, nb))) break;
        for (int64_t i = 0, b = 0; b < B; b++) {
            if (done[b]) continue;
            const int64_t p = b / G, plen = (int64_t)(offsets[p + 1] - offsets[p]), fed = res->lengths[b];
            rb.tok[i] = res->tokens[b * cfg->max_new + fed - 1];
            rb.pos[i] = rb.steps[i] = (int32_t)(plen + fed - 1);
            rb.kvrow[i] = (int32_t)(cb + b * cap + fed - 1);
            rb.seg[4 * i] = (int32_t)offsets[p];
            rb.seg[4 * i + 1] = (int32_t)plen;
            rb.seg[4 * i + 2] = (int32_t)(cb + b * cap);
            rb.seg[4 * i + 3] = (int32_t)fed;
            rb.seqs[i++] = (int32_t)b;
        }
        for (int64_t i = n; i < nb; i++) pad_rows(e, &rb, i);
        e->pad_rowsteps += nb - n;
        res->decode_steps++;
        st = decode_step(e, cfg, &rb, e->graphs ? &sg : NULL, sampled, slogp);
        for (int64_t i = 0; !st && i < n; i++) record(cfg, res, done, rb.seqs[i], sampled[i], slogp[i]);
        free(rb.h);
    }
    graph_free(e->m->ctx, &sg);
    return st;
}

/* act_zero_frac: the mean over linear layers of each one's underflow fraction. */
static fp4rl_status finish_counts(engine *e, fp4rl_rollout_result *res)
{
    fp4rl_context *ctx = e->m->ctx;
    const int64_t L = e->m->cfg.num_hidden_layers, n = L * FP4RL_LIN_COUNT * 2;
    float *hc = calloc((size_t)n, sizeof(float));
    unsigned long long *h64 = calloc((size_t)n, sizeof(unsigned long long));
    fp4rl_status st = hc && h64 ? FP4RL_OK : fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "rollout: out of host memory");
    if (!st) st = ctx->be->download(ctx, hc, e->counts, (size_t)n * sizeof(float));
    if (!st) st = ctx->be->download(ctx, h64, e->counts64, (size_t)n * sizeof(unsigned long long));
    for (int64_t i = 0; !st && e->pad_counts && i < n; i++) { /* the pad rows' share */
        hc[i] -= (float)e->pad_rowsteps * e->pad_counts[i];
        h64[i] -= (unsigned long long)e->pad_rowsteps * (unsigned long long)e->pad_counts[n + i];
    }
    for (int64_t l = 0; !st && l < L; l++) { /* a shared operand was counted once: for each of its readers */
        unsigned long long *c = h64 + l * FP4RL_LIN_COUNT * 2;
        for (int j = 0; j < 2; j++) {
            if (e->share_qkv) c[FP4RL_LIN_K * 2 + j] = c[FP4RL_LIN_V * 2 + j] = c[FP4RL_LIN_Q * 2 + j];
            if (e->f_blk.on) c[FP4RL_LIN_UP * 2 + j] = c[FP4RL_LIN_GATE * 2 + j];
        }
    }
    double sum = 0;
    int64_t layers = 0;
    for (int64_t i = 0; !st && i < L * FP4RL_LIN_COUNT; i++) {
        const double all = (double)hc[2 * i] + (double)h64[2 * i], zero = (double)hc[2 * i + 1] + (double)h64[2 * i + 1];
        if (all > 0) { /* one path per linear: the other's counts are 0 */
            sum += zero / all;
            layers++;
        }
    }
    res->act_zero_frac = layers ? sum / (double)layers : 0.0;
    free(hc);
    free(h64);
    return st;
}

fp4rl_status fp4rl_rollout_run(fp4rl_model *m, const fp4rl_rollout_cfg *cfg, const int32_t *prompts,
                               const size_t *offsets, size_t n_prompts, fp4rl_rollout_result *res)
{
    const int64_t P = (int64_t)n_prompts, B = P * cfg->group, L = m->cfg.num_hidden_layers;
    int64_t max_plen = 0;
    for (int64_t p = 0; p < P; p++)
        if ((int64_t)(offsets[p + 1] - offsets[p]) > max_plen) max_plen = (int64_t)(offsets[p + 1] - offsets[p]);
    const int64_t Tmax = max_plen + cfg->max_new, cap = cfg->max_new > 1 ? cfg->max_new - 1 : 0;

    memset(res, 0, sizeof *res);
    res->n_seqs = B;
    res->max_new = cfg->max_new;
    res->tokens = calloc((size_t)(B * cfg->max_new + 1), sizeof(int32_t));
    res->logprobs = calloc((size_t)(B * cfg->max_new + 1), sizeof(float));
    res->lengths = calloc((size_t)B, sizeof(int64_t));
    res->stopped = calloc((size_t)B, sizeof(int));
    int32_t *sampled = malloc((size_t)B * sizeof(int32_t));
    float *slogp = malloc((size_t)B * sizeof(float));
    int *done = calloc((size_t)B, sizeof(int));
    engine e = {0};
    fp4rl_status st = FP4RL_OK;
    if (!res->tokens || !res->logprobs || !res->lengths || !res->stopped || !sampled || !slogp || !done) {
        st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "rollout: out of host memory");
        goto out;
    }
    if (cfg->max_new > 0) st = engine_init(&e, m, B, (int64_t)offsets[P], Tmax, cap);
    res->fused_linears = L * (5 * e.f_blk.on + 2 * e.f_qk.on) + e.f_head.on;
    res->w4_linears = L * (e.share_qkv ? 3 * e.f_qk.w4 + 4 * e.f_blk.w4 : 2 * e.f_qk.w4 + 5 * e.f_blk.w4);
    res->w4b_linears = L * (e.share_qkv ? 3 * e.f_qk.w4b + 4 * e.f_blk.w4b : 2 * e.f_qk.w4b + 5 * e.f_blk.w4b);
    if (!st && cfg->max_new > 0)
        st = e.lockstep ? run_lockstep(&e, cfg, prompts, offsets, B, Tmax, res, done, sampled, slogp)
                        : run_batched(&e, cfg, prompts, offsets, P, cap, res, done, sampled, slogp);
    if (!st && cfg->max_new > 0) st = finish_counts(&e, res);
    res->offset_end = cfg->offset + (uint64_t)(Tmax > 0 ? Tmax - 1 : 0);
out:
    engine_free(&e);
    free(sampled);
    free(slogp);
    free(done);
    if (st) fp4rl_rollout_result_free(res);
    return st;
}
