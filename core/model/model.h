/*
 * model.h - the Qwen2 policy model behind fp4rl_model (internal; the ABI is in fp4rl.h).
 *
 * All parameters live in one contiguous FP32 buffer of the context's device (and so do their
 * gradients and the two AdamW moments, FP32 or BF16: FP4RL_MP_OPTIMIZER_MOMENTS), as llm.c does:
 * one global-norm reduction, one optimizer call, one file write.
 */
#ifndef FP4RL_MODEL_H
#define FP4RL_MODEL_H

#include "io/safetensors.h"
#include "model/hf_config.h"
#include "runtime/internal.h"
#include "backend/ops.h"

/* The parameters of one transformer block, in storage order. */
enum {
    FP4RL_LP_LN1, FP4RL_LP_Q_W, FP4RL_LP_Q_B, FP4RL_LP_K_W, FP4RL_LP_K_B, FP4RL_LP_V_W, FP4RL_LP_V_B, FP4RL_LP_O_W,
    FP4RL_LP_LN2, FP4RL_LP_GATE_W, FP4RL_LP_UP_W, FP4RL_LP_DOWN_W, FP4RL_LP_COUNT
};

typedef struct fp4rl_param {
    char name[96];   /* HF name, e.g. model.layers.3.self_attn.q_proj.weight */
    int ndim;
    int64_t dims[2];
    int64_t offset;  /* in floats, into the parameter buffer */
    int64_t numel;
    int is_norm;     /* initialised to 1 */
    int is_bias;     /* initialised to 0 */
} fp4rl_param;

struct fp4rl_model {
    fp4rl_context *ctx;
    const fp4rl_ops *ops;
    fp4rl_hf_config cfg;
    fp4rl_quant_policy *policy;
    double hp[FP4RL_MP_COUNT];
    int64_t step;                    /* AdamW steps taken */
    int n_params;                    /* 2 or 3 globals + 12 per layer */
    fp4rl_param *params;             /* [embed, layer 0 .. L-1 params, norm, (lm_head)] */
    int64_t total;                   /* floats in the parameter buffer */
    float *w, *g;                    /* device buffers of `total` floats */
    void *adam_m, *adam_v;           /* `total` floats, or BF16 bits (uint16_t) when hp[FP4RL_MP_OPTIMIZER_MOMENTS] = 1 */
    float *scalar;                   /* device scratch: [0] loss, [1] grad norm, [2] dloss = 1, [3] AdamW's dry run */
    int rollout_generic;             /* tests: 1 = no fused round trips (the rollout's linear path, training operands) */
    int rollout_lockstep;            /* tests: 1 = the rollout's lockstep schedule for any numerics (core/rl/rollout.c) */
    int rollout_eager;               /* tests: 1 = no CUDA graphs for the rollout's decode steps */
    int n_default_stop;              /* eos ids of a from_pretrained model: sessions' default stop tokens */
    int32_t default_stop[FP4RL_HF_MAX_EOS];
    size_t head_chunk_bytes;         /* the LM head's FP32 logits budget per chunk; 0 = FP4RL_HEAD_CHUNK_BYTES */
};

/* The default byte budget of the LM head's [rows, vocab] FP32 logits and their gradient per chunk
 * of rows (core/model/model_forward.c). */
#define FP4RL_HEAD_CHUNK_BYTES ((size_t)256 << 20)

/* fp4rl_model_create with the caller's name for messages; random_init = 0 zeroes the weights
 * instead (for a caller that loads every parameter next: fp4rl_model_from_pretrained). */
FP4RL_HIDDEN fp4rl_status fp4rl_model_create_ex(fp4rl_model **out, fp4rl_context *ctx, const char *config_json,
                                                const fp4rl_quant_policy *policy, uint64_t seed, int random_init,
                                                const char *fn);

/* Index of the parameter of layer l, kind k (FP4RL_LP_*); of the embedding, final norm, LM head. */
static inline int fp4rl_model_lp(int l, int k) { return 1 + l * FP4RL_LP_COUNT + k; }
static inline int fp4rl_model_p_embed(void) { return 0; }
static inline int fp4rl_model_p_norm(const fp4rl_model *m) { return 1 + (int)m->cfg.num_hidden_layers * FP4RL_LP_COUNT; }
/* The LM head's weight: its own parameter, or the embedding when tied. */
static inline int fp4rl_model_p_head(const fp4rl_model *m) { return m->cfg.tie_word_embeddings ? 0 : fp4rl_model_p_norm(m) + 1; }
static inline float *fp4rl_model_w(const fp4rl_model *m, int p) { return m->w + m->params[p].offset; }
static inline float *fp4rl_model_g(const fp4rl_model *m, int p) { return m->g + m->params[p].offset; }

/* ---- core/model/model_linear.c: scratch buffers and the linear layer's numerics ---- */
/* Device buffers freed together (or one by one with fp4rl_arena_release), as many as needed: a
 * growable list. The first failure sticks in `st` and later allocations return NULL. Zero-initialise
 * with the context ({.ctx = ctx}); after fp4rl_arena_free the arena is empty and usable again. */
typedef struct fp4rl_arena { fp4rl_context *ctx; void **p; int n, cap; fp4rl_status st; } fp4rl_arena;
FP4RL_HIDDEN void *fp4rl_arena_alloc(fp4rl_arena *a, int64_t n_elems, size_t elem);
FP4RL_HIDDEN float *fp4rl_arena_f32(fp4rl_arena *a, int64_t n);
FP4RL_HIDDEN float *fp4rl_arena_zeros(fp4rl_arena *a, int64_t n);
/* Frees one buffer of the arena now (its last reader has run); NULL or a foreign pointer: nothing. */
FP4RL_HIDDEN void fp4rl_arena_release(fp4rl_arena *a, void *p);
FP4RL_HIDDEN void fp4rl_arena_free(fp4rl_arena *a);
/* The bounds of model hyper-parameter p: NULL when v is allowed, else the allowed range. */
FP4RL_HIDDEN const char *fp4rl_model_hparam_allowed(int p, double v);
FP4RL_HIDDEN const char *fp4rl_model_hparam_name(int p);

/* The numerics of one linear layer, per role (weight, activation, gradient). Each operand's mode
 * is one of the uniform members of the public fp4rl_numerics (FP32, BF16 or FP4: one enum, one
 * numbering); a pass's mixed numerics (W4A16, W16A4, W4A4) become one of them per operand in
 * fp4rl_block_linear_spec, the one owner of that mapping. */
typedef struct fp4rl_linear_spec {
    fp4rl_numerics mode[3];
    fp4rl_dtype fmt[3];
    int tile[3];
} fp4rl_linear_spec;
/* The forward GEMM's operands, kept for backward. The FP32 path keeps FP32 values (the originals
 * in FP32 mode); the BF16 path (core/model/model_linear.c) keeps the activation's operand as BF16
 * bits and the weight's only when it cannot be re-made (stochastic 2D tiles) or was given. */
typedef struct fp4rl_linear_saved {
    float *xq, *wq;
    uint16_t *xb, *wb;
    uint16_t *xbt; /* 1D FP4 activations (nearest): the dW GEMM's operand along tokens, made in the
                    * forward from the same read, so the FP32 input need not live until backward */
} fp4rl_linear_saved;

/* A transformer-block linear in the training (rollout = 0) or rollout numerics of the model's
 * policy; q_proj and k_proj (is_qk) take FP4RL_QP_FORMAT_QK when set. The LM head: BF16 operands
 * (FP32 in FP32 numerics). */
FP4RL_HIDDEN fp4rl_linear_spec fp4rl_block_linear_spec(const fp4rl_model *m, int is_qk, int rollout);
FP4RL_HIDDEN fp4rl_linear_spec fp4rl_head_linear_spec(const fp4rl_model *m, int rollout);
/* The gradient buffer m->g exists only while gradients are needed: fp4rl_model_grads makes it
 * (zeroed) if it is not held, for the first pass that computes gradients or an update that reads
 * them; fp4rl_model_release_grads frees it. The RL session releases it after each step's updates,
 * so its rollout phase never holds 4 bytes per parameter of gradients (what makes Qwen2.5-7B's
 * step fit one H200: bench/RESULTS.md). A model's own API keeps it once made. */
FP4RL_HIDDEN fp4rl_status fp4rl_model_grads(fp4rl_model *m);
FP4RL_HIDDEN void fp4rl_model_release_grads(fp4rl_model *m);
/* The attention's numerics in training (rollout = 0) or the rollout: FP32 in FP32 numerics, else
 * BF16 operands (the tensor cores'; PyTorch's BF16 SDPA rounds the same operands), so a BF16
 * rollout and a BF16 trainer compute the same attention (core/model/block.c). */
FP4RL_HIDDEN fp4rl_att_numerics fp4rl_attention_numerics(const fp4rl_model *m, int rollout);
/* dst [rows, cols] = the GEMM operand of src for `role`, blocked along the rows (along_rows) or
 * the last dim. */
/* 1 when the GEMM operand of `role` is exactly BF16-representable (BF16 numerics, or MXFP4 / HiF4
 * FP4): such GEMMs run on BF16 operands with the FP32 path's products (core/model/model_linear.c). */
FP4RL_HIDDEN int fp4rl_linear_bf16_exact(const fp4rl_linear_spec *s, fp4rl_role role);
/* The fused round trip's format (FP4RL_QDQ_* of format/qdq_block.h) of dtype d, or -2 for none. */
FP4RL_HIDDEN int fp4rl_qdq_format(fp4rl_dtype d);
/* The quantized tensor of src [rows, cols] (device) in format fmt, blocks along the last dim, with the
 * policy's parameters for role (stochastic: a fresh draw, the context's offset advanced): the
 * tensor whose dequantization is fp4rl_linear_operand's FP4 operand (the rollout keeps its weights'
 * for the W4A4 decode GEMM). */
FP4RL_HIDDEN fp4rl_status fp4rl_quantize_rows(fp4rl_model *m, fp4rl_tensor **out, float *src, int64_t rows, int64_t cols,
                                              fp4rl_dtype fmt, fp4rl_role role);
FP4RL_HIDDEN fp4rl_status fp4rl_linear_operand(fp4rl_model *m, fp4rl_arena *a, float *dst, float *src, int64_t rows,
                                               int64_t cols, const fp4rl_linear_spec *s, fp4rl_role role, int along_rows);
/* y [N, OUT] = x w^T + b in the spec's numerics; sv keeps the operands for backward (in arena a).
 * reuse (optional): BF16 operands made earlier, used instead of making them again: xb, the
 * forward operand of this same x (valid when fp4rl_linear_same_activation says so), and wb, this
 * w's from fp4rl_linear_weight_operand. */
FP4RL_HIDDEN fp4rl_status fp4rl_lin_forward(fp4rl_model *m, fp4rl_arena *a, const fp4rl_linear_spec *s,
                                               fp4rl_linear_saved *sv, float *y, float *x, float *w, const float *b,
                                               int64_t N, int64_t IN, int64_t OUT, const fp4rl_linear_saved *reuse);
/* The forward operand of weight w [OUT, IN] as BF16 bits in arena a, to reuse across calls while w
 * does not change (the LM head over its chunks of rows); NULL when the linear does not take the
 * BF16 path or its weight draws random numbers (then a->st is unchanged), or on failure (a->st). */
FP4RL_HIDDEN uint16_t *fp4rl_linear_weight_operand(fp4rl_model *m, fp4rl_arena *a, const fp4rl_linear_spec *s, float *w,
                                                  int64_t OUT, int64_t IN);
/* 1 when the training forward draws random numbers (stochastic rounding of a block linear's
 * weight or activation): then two forwards of the same weights differ. */
FP4RL_HIDDEN int fp4rl_model_forward_draws(const fp4rl_model *m);
/* 1 when the linear's backward reads its FP32 input x (else the saved operand is all it needs,
 * and x can be released after the forward). */
FP4RL_HIDDEN int fp4rl_linear_reads_x(const fp4rl_model *m, const fp4rl_linear_spec *s);
/* 1 when linears of specs a and b make the same BF16 forward operand of one x (q/k/v of ln1,
 * gate/up of ln2), which can then be made once. */
FP4RL_HIDDEN int fp4rl_linear_same_activation(const fp4rl_model *m, const fp4rl_linear_spec *a, const fp4rl_linear_spec *b);
/* dx (optional) += dY W, dw += dY^T X, db (optional) += sum dY, each GEMM on its own operands. */
FP4RL_HIDDEN fp4rl_status fp4rl_lin_backward(fp4rl_model *m, fp4rl_arena *a, const fp4rl_linear_spec *s,
                                                const fp4rl_linear_saved *sv, float *dx, float *dw, float *db, float *dy,
                                                float *x, float *w, int64_t N, int64_t IN, int64_t OUT);

/* A per-token loss on the log-probs, for the RL objective, called once per micro-batch: given
 * logp and entropy of every row n = i * T + t of the micro-batch's sequences b0 .. b0 + nb - 1 of
 * the batch (row n predicts token t + 1 of sequence b0 + i; 0 for rows without a target), fill
 * dlogp (zeroed) and *loss, this micro-batch's share of the batch's loss (its normalisation is the
 * whole batch's). Host arrays of nb * T floats. */
typedef struct fp4rl_loss_hook {
    fp4rl_status (*fn)(void *user, int64_t b0, int64_t nb, const float *logp, const float *entropy, float *dlogp,
                       double *loss);
    void *user;
} fp4rl_loss_hook;

/* The rollout's truncation of the sampling distribution, replayed on the log-probs of a pass
 * (FP4RL_RL_TOP_P): with 0 < top_p < 1 each target's log-prob is log(p_t / sum_{i in S} p_i), S
 * the nucleus of the pass's own softmax(logits / temperature) (restricted to the top_k largest
 * when 0 < top_k < V; the sampler's rule) plus the target itself, the gradient with S fixed.
 * Otherwise (top_p = 1, or no truncation given) the full softmax's. */
typedef struct fp4rl_truncation {
    int64_t top_k;
    double top_p;
} fp4rl_truncation;

/* One pass of core/model/model_forward.c (fp4rl_model_pass), set with designated initialisers
 * (what is left out is 0 / NULL): tokens [B, T] with lengths [B] (NULL: all T) and loss_mask
 * [B, T] (NULL: every target). logits_out (host, [B, T, V]) and logprobs_out (host, [B, T]) are
 * optional. With `backward` the gradients are zeroed and then accumulated over the micro-batches
 * and *loss (optional) is set; the loss is the masked next-token cross-entropy normalised over the
 * whole batch, or the hook's when hook is not NULL. Logits are divided by `temperature` before
 * log-probs and the loss (0 or 1 = none; the logits output is never scaled); log-probs (logprobs_out
 * and the hook's) under `trunc` (NULL = none). Micro-batches of whole sequences of about
 * micro_tokens tokens (0 = sized from the memory the context can still allocate; see
 * FP4RL_MP_MICROBATCH_TOKENS). fn: the caller's name in error messages. */
typedef struct fp4rl_pass {
    const int32_t *tokens, *lengths;
    const float *loss_mask;
    int64_t B, T;
    float *logits_out, *logprobs_out;
    int backward;
    double *loss;
    const fp4rl_loss_hook *hook;
    float temperature;
    const fp4rl_truncation *trunc;
    int64_t micro_tokens;
    const char *fn;
} fp4rl_pass;
/* core/model/model_forward.c: the forward pass over a batch, and optionally the backward pass of a
 * loss (fp4rl_pass). */
FP4RL_HIDDEN fp4rl_status fp4rl_model_pass(fp4rl_model *m, const fp4rl_pass *p);

/* core/model/model.c: clip the gradients' global norm (clip > 0), one AdamW step on all parameters
 * with the model's betas and eps, step + 1. *grad_norm gets the norm before clipping. */
FP4RL_HIDDEN fp4rl_status fp4rl_model_update(fp4rl_model *m, double lr, double weight_decay, double clip, double *grad_norm);

/* ---- the state the model owns, for the layers above it (RL session, checkpoints) ---- */
/* What a caller may read: floats in each state buffer (weights, each AdamW moment), AdamW steps
 * taken, the hyper-parameters (FP4RL_MP_COUNT), the policy, the config, the gradient buffer (NULL
 * while none is held: fp4rl_model_grads). */
static inline int64_t fp4rl_model_param_floats(const fp4rl_model *m) { return m->total; }
static inline int64_t fp4rl_model_optimizer_step(const fp4rl_model *m) { return m->step; }
static inline const double *fp4rl_model_hparams(const fp4rl_model *m) { return m->hp; }
static inline const fp4rl_quant_policy *fp4rl_model_policy(const fp4rl_model *m) { return m->policy; }
static inline const fp4rl_hf_config *fp4rl_model_config(const fp4rl_model *m) { return &m->cfg; }
static inline float *fp4rl_model_grad_buffer(const fp4rl_model *m) { return m->g; }
/* The moments' storage: 1 = BF16 bits (FP4RL_MP_OPTIMIZER_MOMENTS = 1), 0 = FP32; bytes of one moment. */
static inline int fp4rl_model_moments_bf16(const fp4rl_model *m) { return m->hp[FP4RL_MP_OPTIMIZER_MOMENTS] != 0; }
static inline size_t fp4rl_moment_bytes(int64_t n, int bf16) { return (size_t)n * (bf16 ? sizeof(uint16_t) : sizeof(float)); }

/* core/model/model_state.c: a fresh AdamW state (zero moments, step 0). */
FP4RL_HIDDEN fp4rl_status fp4rl_model_reset_optimizer(fp4rl_model *m);
/* *out = a new device buffer of the context holding a copy of the weights (a KL reference; the
 * caller frees it with ctx->be->free). *out is set as soon as it is allocated, even when the
 * copy then fails. */
FP4RL_HIDDEN fp4rl_status fp4rl_model_copy_weights(const fp4rl_model *m, float **out);
/* fp4rl_model_pass's forward (log-probs only, no backward) on the weights ref_w, a buffer from
 * fp4rl_model_copy_weights, instead of the model's own, which stay as they are; log-probs under
 * `trunc` (NULL = none). */
FP4RL_HIDDEN fp4rl_status fp4rl_model_ref_logprobs(fp4rl_model *m, float *ref_w, const int32_t *tokens,
                                                   const int32_t *lengths, int64_t B, int64_t T, float *logprobs_out,
                                                   float temperature, const fp4rl_truncation *trunc, int64_t micro_tokens,
                                                   const char *fn);
/* Checkpoint I/O through host arrays of fp4rl_model_param_floats floats in the model's layout:
 * the moments to the host (BF16 moments widened, exactly); every parameter of file f by its HF
 * name into w; weights and moments from the host (in that order, stopping at the first failure;
 * into BF16 moments rounded to nearest even, exact for values that came from BF16). */
FP4RL_HIDDEN fp4rl_status fp4rl_model_moments_to_host(const fp4rl_model *m, float *adam_m, float *adam_v);
FP4RL_HIDDEN fp4rl_status fp4rl_model_read_weights(const fp4rl_model *m, const fp4rl_st *f, float *w);
FP4RL_HIDDEN fp4rl_status fp4rl_model_state_from_host(fp4rl_model *m, const float *w, const float *adam_m,
                                                      const float *adam_v);
/* Moment buffers for the storage bf16 (1: BF16, 0: FP32), made before a commit that may change
 * the model's storage: *adam_m and *adam_v are new zeroed device buffers (both NULL on failure).
 * fp4rl_model_moments_adopt makes them the model's moments (freeing its own) and sets
 * FP4RL_MP_OPTIMIZER_MOMENTS to bf16; fp4rl_model_moments_discard frees them unused. */
/* The moments are allocated by the first update (ensure); before it, and after a reset, the model
 * holds none and they read as zeros. */
FP4RL_HIDDEN fp4rl_status fp4rl_model_moments_ensure(fp4rl_model *m);
FP4RL_HIDDEN int fp4rl_model_moments_held(const fp4rl_model *m);
FP4RL_HIDDEN fp4rl_status fp4rl_model_moments_alloc(const fp4rl_model *m, int bf16, void **adam_m, void **adam_v);
FP4RL_HIDDEN void fp4rl_model_moments_adopt(fp4rl_model *m, int bf16, void *adam_m, void *adam_v);
FP4RL_HIDDEN void fp4rl_model_moments_discard(const fp4rl_model *m, void *adam_m, void *adam_v);
/* Converts the moments the model holds to the storage bf16 (FP32 to BF16 to nearest even, BF16 to
 * FP32 exactly) through the host, in chunks: new buffers first, so on failure nothing changed. */
FP4RL_HIDDEN fp4rl_status fp4rl_model_convert_moments(fp4rl_model *m, int bf16);
/* A loaded checkpoint's training settings: the model takes `policy` (and destroys its own), hp
 * (FP4RL_MP_COUNT values; FP4RL_MP_OPTIMIZER_MOMENTS is not taken from hp but stays what the
 * model's buffers are: fp4rl_model_moments_adopt sets it) and the AdamW step count. */
FP4RL_HIDDEN void fp4rl_model_restore_training(fp4rl_model *m, fp4rl_quant_policy *policy, const double *hp, int64_t step);

#endif
