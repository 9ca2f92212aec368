/*
 * model_linear.c - a linear layer's GEMM operands in the policy's numerics, and its forward and
 * backward, for the training step (core/model/model_forward.c) and the rollout (core/rl/rollout.c).
 *
 * A linear layer Y = X W^T (+ b) has three GEMMs (shared/spec/recipes.md section 1):
 *   forward          Y  = X  W^T   contracts over IN      X, W blocked along IN
 *   input gradient   dX = dY W     contracts over OUT     dY, W blocked along OUT
 *   weight gradient  dW = dY^T X   contracts over tokens  dY, X blocked along tokens
 * In FP4 mode each operand is quantized along its GEMM's contraction axis and dequantized
 * (exactly) before an FP32 GEMM. With 2D tiles one quantized copy of W and of X serves every
 * GEMM (the tiles are the same whichever axis contracts); with 1D blocks each GEMM re-quantizes
 * from the high-precision value. dY uses the gradient role (stochastic rounding in the recipes),
 * quantized once per GEMM in 1D (fresh random numbers each) or once in 2D.
 */
#include <stdlib.h>
#include <string.h>

#include "format/qdq_block.h"
#include "format/traits.h"
#include "model/model.h"

/* ---- a scratch arena of device buffers, freed together ---- */

void *fp4rl_arena_alloc(fp4rl_arena *a, int64_t n_elems, size_t elem)
{
    if (a->st) return NULL;
    if (a->n == a->cap) {
        const int cap = a->cap ? 2 * a->cap : 64;
        void **list = realloc(a->p, (size_t)cap * sizeof *list);
        if (!list) {
            a->st = fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "model: out of host memory for the scratch list");
            return NULL;
        }
        a->p = list;
        a->cap = cap;
    }
    void *p = NULL;
    a->st = a->ctx->be->alloc(a->ctx, &p, (size_t)n_elems * elem);
    if (a->st) return NULL;
    a->p[a->n++] = p;
    return p;
}
float *fp4rl_arena_f32(fp4rl_arena *a, int64_t n) { return fp4rl_arena_alloc(a, n, sizeof(float)); }
/* A zero-filled buffer (gradients accumulate). */
float *fp4rl_arena_zeros(fp4rl_arena *a, int64_t n)
{
    float *p = fp4rl_arena_f32(a, n);
    if (p) a->st = a->ctx->be->memset0(a->ctx, p, (size_t)n * sizeof(float));
    return a->st ? NULL : p;
}
void fp4rl_arena_release(fp4rl_arena *a, void *p)
{
    if (!p) return;
    for (int i = a->n - 1; i >= 0; i--) /* mostly the latest buffers */
        if (a->p[i] == p) {
            a->ctx->be->free(a->ctx, p);
            memmove(a->p + i, a->p + i + 1, (size_t)(a->n - 1 - i) * sizeof *a->p);
            a->n--;
            return;
        }
}
void fp4rl_arena_free(fp4rl_arena *a)
{
    for (int i = a->n - 1; i >= 0; i--) a->ctx->be->free(a->ctx, a->p[i]);
    free(a->p);
    a->p = NULL;
    a->n = a->cap = 0;
}

/* ---- GEMM operand numerics ---- */

static fp4rl_numerics mode_of(int64_t numerics, fp4rl_role role, int rollout)
{
    switch (numerics) {
    case FP4RL_NUMERICS_FP32: return FP4RL_NUMERICS_FP32;
    case FP4RL_NUMERICS_BF16: return FP4RL_NUMERICS_BF16;
    case FP4RL_NUMERICS_W4A16: return role == FP4RL_ROLE_WEIGHT ? FP4RL_NUMERICS_FP4 : FP4RL_NUMERICS_BF16;
    case FP4RL_NUMERICS_W16A4: return role == FP4RL_ROLE_WEIGHT ? FP4RL_NUMERICS_BF16 : FP4RL_NUMERICS_FP4;
    default: return (rollout && role == FP4RL_ROLE_GRADIENT) ? FP4RL_NUMERICS_BF16 : FP4RL_NUMERICS_FP4;
    }
}

fp4rl_linear_spec fp4rl_block_linear_spec(const fp4rl_model *m, int is_qk, int rollout)
{
    fp4rl_linear_spec s;
    const int64_t numerics = fp4rl_policy_value(m->policy, rollout ? FP4RL_QP_ROLLOUT_NUMERICS : FP4RL_QP_TRAIN_NUMERICS);
    const int64_t qk = fp4rl_policy_value(m->policy, FP4RL_QP_FORMAT_QK);
    for (int r = 0; r < 3; r++) {
        s.mode[r] = mode_of(numerics, (fp4rl_role)r, rollout);
        s.fmt[r] = (fp4rl_dtype)(is_qk && qk >= 0 ? qk : fp4rl_policy_value(m->policy, (fp4rl_qparam)(FP4RL_QP_FORMAT_WEIGHT + r)));
        s.tile[r] = (int)fp4rl_policy_value(m->policy, (fp4rl_qparam)(FP4RL_QP_TILE_WEIGHT + r));
    }
    return s;
}

fp4rl_linear_spec fp4rl_head_linear_spec(const fp4rl_model *m, int rollout)
{
    fp4rl_linear_spec s = fp4rl_block_linear_spec(m, 0, rollout);
    const int64_t numerics = fp4rl_policy_value(m->policy, rollout ? FP4RL_QP_ROLLOUT_NUMERICS : FP4RL_QP_TRAIN_NUMERICS);
    for (int r = 0; r < 3; r++) s.mode[r] = numerics == FP4RL_NUMERICS_FP32 ? FP4RL_NUMERICS_FP32 : FP4RL_NUMERICS_BF16;
    return s;
}

/* A non-owning dense F32 tensor over a device buffer, for the backend's quantize functions. */
static fp4rl_tensor view2d(fp4rl_context *ctx, float *p, int64_t rows, int64_t cols)
{
    fp4rl_tensor t;
    memset(&t, 0, sizeof t);
    t.ctx = ctx;
    t.dtype = FP4RL_DTYPE_F32;
    t.ndim = 2;
    t.dims[0] = rows;
    t.dims[1] = cols;
    t.numel = rows * cols;
    t.data = p;
    t.data_bytes = (size_t)t.numel * sizeof(float);
    t.tensor_scale = 1.0f;
    return t;
}

fp4rl_status fp4rl_quantize_rows(fp4rl_model *m, fp4rl_tensor **out, float *src, int64_t rows, int64_t cols, fp4rl_dtype fmt,
                                 fp4rl_role role)
{
    fp4rl_context *ctx = m->ctx;
    fp4rl_qparams p;
    *out = NULL;
    fp4rl_status st = fp4rl_policy_resolve(m->policy, fmt, role, ctx, &p, "model linear");
    if (st) return st;
    fp4rl_qdesc d;
    fp4rl_qdesc_make(&d, fmt, rows, cols, p.tile);
    fp4rl_tensor *q;
    const int64_t dims[2] = {rows, cols};
    st = fp4rl_tensor_alloc(&q, ctx, fmt, 2, dims, &d, "model linear");
    if (st) return st;
    fp4rl_tensor s = view2d(ctx, src, rows, cols);
    st = ctx->be->quantize(ctx, q, &s, &p);
    if (!st && p.stochastic) ctx->rng_offset++;
    if (st) fp4rl_tensor_destroy(q);
    else *out = q;
    return st;
}

/* dst = dequantize(quantize(src)) with blocks along the last dim of src [rows, cols]. */
static fp4rl_status qdq_rows(fp4rl_model *m, float *dst, float *src, int64_t rows, int64_t cols, fp4rl_dtype fmt,
                             fp4rl_role role)
{
    fp4rl_tensor *q;
    fp4rl_status st = fp4rl_quantize_rows(m, &q, src, rows, cols, fmt, role);
    if (st) return st;
    fp4rl_tensor o = view2d(m->ctx, dst, rows, cols);
    st = m->ctx->be->dequantize(m->ctx, &o, q, 0);
    fp4rl_tensor_destroy(q);
    return st;
}

fp4rl_status fp4rl_linear_operand(fp4rl_model *m, fp4rl_arena *a, float *dst, float *src, int64_t rows, int64_t cols,
                                  const fp4rl_linear_spec *s, fp4rl_role role, int along_rows)
{
    fp4rl_context *ctx = m->ctx;
    switch (s->mode[role]) {
    case FP4RL_NUMERICS_FP32: return m->ops->copy(ctx, dst, src, rows * cols);
    case FP4RL_NUMERICS_BF16: return m->ops->round_bf16(ctx, dst, src, rows * cols);
    default: break; /* FP4; the mixed values never reach an operand (fp4rl_block_linear_spec splits them) */
    }
    if (!along_rows || s->tile[role]) return qdq_rows(m, dst, src, rows, cols, s->fmt[role], role);
    /* 1D blocks along the rows: quantize the transpose, whose rows are src's columns */
    float *t = fp4rl_arena_f32(a, rows * cols), *tq = fp4rl_arena_f32(a, rows * cols);
    if (a->st) return a->st;
    fp4rl_tensor vs = view2d(ctx, src, rows, cols), vt = view2d(ctx, t, cols, rows);
    fp4rl_status st = ctx->be->transpose(ctx, &vt, &vs);
    if (!st) st = qdq_rows(m, tq, t, cols, rows, s->fmt[role], role);
    fp4rl_tensor vtq = view2d(ctx, tq, cols, rows), vd = view2d(ctx, dst, rows, cols);
    if (!st) st = ctx->be->transpose(ctx, &vd, &vtq);
    return st;
}

/* The operand of `role` for the forward GEMM: the original in FP32 mode, else a new buffer. */
static fp4rl_status forward_operand(fp4rl_model *m, fp4rl_arena *a, const fp4rl_linear_spec *s, fp4rl_role role,
                                    float **dst, float *src, int64_t rows, int64_t cols)
{
    *dst = src;
    if (s->mode[role] == FP4RL_NUMERICS_FP32) return FP4RL_OK;
    *dst = fp4rl_arena_f32(a, rows * cols);
    if (a->st) return a->st;
    return fp4rl_linear_operand(m, a, *dst, src, rows, cols, s, role, 0);
}

/* The operand values of `role` are exactly BF16: BF16-rounded, or MXFP4 / HiF4 values (a few
 * significant bits times a power of two, or HiF4's E6M2 base). Such GEMMs run on BF16 operands:
 * the products are the FP32 path's, on the GPU's tensor cores. */
int fp4rl_linear_bf16_exact(const fp4rl_linear_spec *s, fp4rl_role r)
{
    return s->mode[r] == FP4RL_NUMERICS_BF16 || (s->mode[r] == FP4RL_NUMERICS_FP4 && fp4rl_format_of(s->fmt[r]).bf16_exact);
}

/* The fused round trip gives BF16 words, so it serves the formats whose values are exactly BF16
 * (MXFP4, HiF4; qdq_block.h also takes MXFP8, whose values may not be). */
int fp4rl_qdq_format(fp4rl_dtype d) { return fp4rl_format_of(d).bf16_exact ? (int)d : -2; }

/* The BF16 path: the backend multiplies BF16 operands and all three GEMMs' operands are exactly
 * BF16. Then the operands are made as BF16 bits in one pass from their source, and what backward
 * keeps of them is BF16 (half the FP32 copy). The forward takes this path only when the backward
 * can, so a saved operand always has the form its backward reads. */
static int bf16_path(const fp4rl_model *m, const fp4rl_linear_spec *s)
{
    return m->ops->linear_forward_bf16 && m->ops->linear_backward_bf16 && fp4rl_linear_bf16_exact(s, FP4RL_ROLE_WEIGHT) &&
           fp4rl_linear_bf16_exact(s, FP4RL_ROLE_ACTIVATION) && fp4rl_linear_bf16_exact(s, FP4RL_ROLE_GRADIENT);
}

/* Whether the operand of `role` draws random numbers (FP4 with stochastic rounding): then each
 * quantization is a fresh draw, and an operand is never shared between GEMMs or re-made. */
static int stochastic(const fp4rl_model *m, const fp4rl_linear_spec *s, fp4rl_role role)
{
    return s->mode[role] == FP4RL_NUMERICS_FP4 &&
           fp4rl_policy_value(m->policy, (fp4rl_qparam)(FP4RL_QP_ROUNDING_WEIGHT + role)) == FP4RL_ROUND_STOCHASTIC;
}

/* The GEMM operand of src [rows, cols] for `role` as BF16 bits, in arena a (NULL on failure:
 * a->st): BF16 numerics round in the packing itself; FP4 goes through an FP32 temporary. */
static uint16_t *bf16_operand(fp4rl_model *m, fp4rl_arena *a, float *src, int64_t rows, int64_t cols,
                              const fp4rl_linear_spec *s, fp4rl_role role, int along_rows)
{
    uint16_t *d = fp4rl_arena_alloc(a, rows * cols, sizeof(uint16_t));
    if (!d) return NULL;
    if (s->mode[role] == FP4RL_NUMERICS_BF16) {
        a->st = m->ops->pack_bf16(m->ctx, d, cols, src, rows, cols);
        return a->st ? NULL : d;
    }
    const int qf = fp4rl_qdq_format(s->fmt[role]);
    if (!s->tile[role] && qf >= 0 && m->ops->qdq_bf16 && !m->rollout_generic) {
        /* 1D blocks: the fused round trip, one pass (along the rows without the transposes) */
        fp4rl_qparams p;
        a->st = fp4rl_policy_resolve(m->policy, s->fmt[role], role, m->ctx, &p, "model linear");
        if (!a->st)
            a->st = m->ops->qdq_bf16(m->ctx, d, src, rows, cols, qf, p.truncation_free, along_rows, p.stochastic, p.seed, p.offset);
        if (!a->st && p.stochastic) m->ctx->rng_offset++; /* as qdq_rows: one draw per quantization */
        return a->st ? NULL : d;
    }
    fp4rl_arena t = {.ctx = m->ctx};
    float *q = fp4rl_arena_f32(&t, rows * cols);
    fp4rl_status st = q ? fp4rl_linear_operand(m, &t, q, src, rows, cols, s, role, along_rows) : t.st;
    if (!st) st = m->ops->pack_bf16(m->ctx, d, cols, q, rows, cols);
    fp4rl_arena_free(&t); /* the GPU allocator reuses in stream order */
    a->st = st;
    return st ? NULL : d;
}

uint16_t *fp4rl_linear_weight_operand(fp4rl_model *m, fp4rl_arena *a, const fp4rl_linear_spec *s, float *w, int64_t OUT,
                                      int64_t IN)
{
    if (!bf16_path(m, s) || stochastic(m, s, FP4RL_ROLE_WEIGHT)) return NULL;
    return bf16_operand(m, a, w, OUT, IN, s, FP4RL_ROLE_WEIGHT, 0);
}

int fp4rl_model_forward_draws(const fp4rl_model *m)
{
    const fp4rl_linear_spec qk = fp4rl_block_linear_spec(m, 1, 0), blk = fp4rl_block_linear_spec(m, 0, 0);
    return stochastic(m, &qk, FP4RL_ROLE_WEIGHT) || stochastic(m, &qk, FP4RL_ROLE_ACTIVATION) ||
           stochastic(m, &blk, FP4RL_ROLE_WEIGHT) || stochastic(m, &blk, FP4RL_ROLE_ACTIVATION);
}

/* 1D FP4 activation blocks: the dW GEMM needs x quantized along tokens too (another operand) */
static int x_along_tokens(const fp4rl_linear_spec *s)
{
    return s->mode[FP4RL_ROLE_ACTIVATION] == FP4RL_NUMERICS_FP4 && !s->tile[FP4RL_ROLE_ACTIVATION];
}

/* The along-tokens operand is made in the forward (sv->xbt) when that changes no random draw:
 * with nearest rounding. A stochastic one is drawn in the backward, in the FP32 path's order. */
static int xbt_in_forward(const fp4rl_model *m, const fp4rl_linear_spec *s)
{
    return bf16_path(m, s) && x_along_tokens(s) && !stochastic(m, s, FP4RL_ROLE_ACTIVATION);
}

int fp4rl_linear_reads_x(const fp4rl_model *m, const fp4rl_linear_spec *s)
{
    /* the FP32 path keeps pointers into x (FP32 mode) or re-quantizes from it; the BF16 path
     * re-makes x only for a stochastic along-tokens operand (1D FP4 blocks) */
    return !bf16_path(m, s) || (x_along_tokens(s) && !xbt_in_forward(m, s));
}

int fp4rl_linear_same_activation(const fp4rl_model *m, const fp4rl_linear_spec *a, const fp4rl_linear_spec *b)
{
    const fp4rl_role X = FP4RL_ROLE_ACTIVATION;
    return bf16_path(m, a) && bf16_path(m, b) && !stochastic(m, a, X) && a->mode[X] == b->mode[X] &&
           (a->mode[X] != FP4RL_NUMERICS_FP4 || (a->fmt[X] == b->fmt[X] && a->tile[X] == b->tile[X]));
}

fp4rl_status fp4rl_lin_forward(fp4rl_model *m, fp4rl_arena *a, const fp4rl_linear_spec *s, fp4rl_linear_saved *sv,
                                  float *y, float *x, float *w, const float *b, int64_t N, int64_t IN, int64_t OUT,
                                  const fp4rl_linear_saved *reuse)
{
    memset(sv, 0, sizeof *sv);
    if (bf16_path(m, s)) {
        const fp4rl_role W = FP4RL_ROLE_WEIGHT, X = FP4RL_ROLE_ACTIVATION;
        /* backward re-makes a deterministic weight operand (cheaper than keeping 2 bytes per
         * weight for every block); a stochastic one it reuses with 2D tiles (the same draw) */
        const int keep_w = stochastic(m, s, W) && s->tile[W];
        fp4rl_arena t = {.ctx = m->ctx};
        /* the weight first, then the activation: the FP32 path's order of random draws */
        const uint16_t *wb = reuse && reuse->wb ? reuse->wb : bf16_operand(m, keep_w ? a : &t, w, OUT, IN, s, W, 0);
        if (wb) sv->xb = reuse && reuse->xb && !stochastic(m, s, X) ? reuse->xb : bf16_operand(m, a, x, N, IN, s, X, 0);
        if (sv->xb && xbt_in_forward(m, s)) sv->xbt = reuse && reuse->xbt ? reuse->xbt : bf16_operand(m, a, x, N, IN, s, X, 1);
        const int ok = sv->xb && (sv->xbt || !xbt_in_forward(m, s));
        fp4rl_status st = !wb ? (keep_w ? a->st : t.st) : !ok ? a->st
                                                              : m->ops->linear_forward_bf16(m->ctx, y, sv->xb, wb, b, N, IN, OUT);
        if (reuse && reuse->wb) sv->wb = reuse->wb;
        else if (keep_w) sv->wb = (uint16_t *)wb;
        fp4rl_arena_free(&t);
        return st;
    }
    fp4rl_status st = forward_operand(m, a, s, FP4RL_ROLE_WEIGHT, &sv->wq, w, OUT, IN);
    if (!st) st = forward_operand(m, a, s, FP4RL_ROLE_ACTIVATION, &sv->xq, x, N, IN);
    return st ? st : m->ops->linear_forward(m->ctx, y, sv->xq, sv->wq, b, N, IN, OUT);
}

/* The operand of `role` for a backward GEMM contracting along rows or the last dim: the forward
 * copy where it is the same (FP32, BF16, or 2D tiles), else a re-quantization. */
static fp4rl_status backward_operand(fp4rl_model *m, fp4rl_arena *a, const fp4rl_linear_spec *s, fp4rl_role role,
                                     float **dst, float *fwd_copy, float *src, int64_t rows, int64_t cols)
{
    *dst = fwd_copy;
    if (s->mode[role] != FP4RL_NUMERICS_FP4 || s->tile[role]) return FP4RL_OK;
    *dst = fp4rl_arena_f32(a, rows * cols);
    if (a->st) return a->st;
    return fp4rl_linear_operand(m, a, *dst, src, rows, cols, s, role, 1);
}

/* The BF16 path's backward (the same operand order, so the same random draws, as the FP32 path). */
static fp4rl_status backward_bf16(fp4rl_model *m, fp4rl_arena *t, const fp4rl_linear_spec *s, const fp4rl_linear_saved *sv,
                                  float *dx, float *dw, float *db, float *dy, float *x, float *w, int64_t N, int64_t IN,
                                  int64_t OUT)
{
    const fp4rl_role G = FP4RL_ROLE_GRADIENT, W = FP4RL_ROLE_WEIGHT, X = FP4RL_ROLE_ACTIVATION;
    /* dY along OUT for dX; along tokens for dW unless 2D or BF16 */
    const uint16_t *g1 = bf16_operand(m, t, dy, N, OUT, s, G, 0);
    const uint16_t *g2 = !g1 ? NULL : s->mode[G] == FP4RL_NUMERICS_FP4 && !s->tile[G] ? bf16_operand(m, t, dy, N, OUT, s, G, 1) : g1;
    /* W along OUT: the forward's values unless 1D FP4 (re-made when not kept) */
    const int same_w = s->mode[W] != FP4RL_NUMERICS_FP4 || s->tile[W];
    const uint16_t *wb = !g2 ? NULL : same_w && sv->wb ? sv->wb : bf16_operand(m, t, w, OUT, IN, s, W, 1);
    /* X along tokens: the saved forward operand unless 1D FP4 */
    const uint16_t *xb = !wb ? NULL : !x_along_tokens(s) ? sv->xb : sv->xbt ? sv->xbt : bf16_operand(m, t, x, N, IN, s, X, 1);
    if (!xb) return t->st ? t->st : fp4rl_fail(FP4RL_ERR_INTERNAL, "model linear: no saved forward operand");
    return m->ops->linear_backward_bf16(m->ctx, dx, dw, db, dx ? g1 : NULL, dx ? wb : NULL, dw ? g2 : NULL, dw ? xb : NULL,
                                        dy, N, IN, OUT);
}

fp4rl_status fp4rl_lin_backward(fp4rl_model *m, fp4rl_arena *a, const fp4rl_linear_spec *s, const fp4rl_linear_saved *sv,
                                   float *dx, float *dw, float *db, float *dy, float *x, float *w, int64_t N, int64_t IN,
                                   int64_t OUT)
{
    if (bf16_path(m, s)) return backward_bf16(m, a, s, sv, dx, dw, db, dy, x, w, N, IN, OUT);
    const fp4rl_role G = FP4RL_ROLE_GRADIENT;
    float *dy_dx = dy, *dy_dw = dy, *w_dx, *x_dw;
    fp4rl_status st = FP4RL_OK;
    if (s->mode[G] != FP4RL_NUMERICS_FP32) { /* dY along OUT for dX; along tokens for dW unless 2D or BF16 */
        dy_dx = dy_dw = fp4rl_arena_f32(a, N * OUT);
        if (a->st) return a->st;
        st = fp4rl_linear_operand(m, a, dy_dx, dy, N, OUT, s, G, 0);
        if (!st && s->mode[G] == FP4RL_NUMERICS_FP4 && !s->tile[G]) {
            dy_dw = fp4rl_arena_f32(a, N * OUT);
            if (a->st) return a->st;
            st = fp4rl_linear_operand(m, a, dy_dw, dy, N, OUT, s, G, 1);
        }
    }
    if (!st) st = backward_operand(m, a, s, FP4RL_ROLE_WEIGHT, &w_dx, sv->wq, w, OUT, IN);   /* along OUT */
    if (!st) st = backward_operand(m, a, s, FP4RL_ROLE_ACTIVATION, &x_dw, sv->xq, x, N, IN); /* along tokens */
    return st ? st : m->ops->linear_backward(m->ctx, dx, dw, db, dy_dx, w_dx, dy_dw, x_dw, dy, N, IN, OUT);
}
