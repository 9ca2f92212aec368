/* policy.c - the quantization policy: (parameter, value) pairs with bounds, checked when set so
 * that every policy is valid as a whole (each tile fits its formats), and the presets. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/traits.h"
#include "runtime/internal.h"

struct fp4rl_quant_policy {
    int64_t v[FP4RL_QP_COUNT];
};

static const char *const qparam_names[FP4RL_QP_COUNT] = {
    "tile_weight", "tile_activation", "tile_gradient", "scale_rule", "rounding_weight", "rounding_activation",
    "rounding_gradient", "seed", "format_weight", "format_activation", "format_gradient", "format_qk",
    "train_numerics", "rollout_numerics", "resq",
};

const char *fp4rl_qparam_name(fp4rl_qparam p)
{
    return ((int)p >= 0 && (int)p < FP4RL_QP_COUNT) ? qparam_names[p] : NULL;
}

static void set_defaults(fp4rl_quant_policy *p)
{
    memset(p, 0, sizeof *p);
    p->v[FP4RL_QP_SEED] = -1;
    p->v[FP4RL_QP_FORMAT_WEIGHT] = FP4RL_DTYPE_MXFP4;
    p->v[FP4RL_QP_FORMAT_ACTIVATION] = FP4RL_DTYPE_MXFP4;
    p->v[FP4RL_QP_FORMAT_GRADIENT] = FP4RL_DTYPE_MXFP4;
    p->v[FP4RL_QP_FORMAT_QK] = -1;
    p->v[FP4RL_QP_TRAIN_NUMERICS] = FP4RL_NUMERICS_FP4;
    p->v[FP4RL_QP_ROLLOUT_NUMERICS] = FP4RL_NUMERICS_W4A4;
    p->v[FP4RL_QP_RESQ] = FP4RL_RESQ_OFF;
}

fp4rl_status fp4rl_quant_policy_create(fp4rl_quant_policy **out)
{
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_quant_policy_create: out is NULL");
    fp4rl_quant_policy *p = malloc(sizeof *p);
    if (!p) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "fp4rl_quant_policy_create: out of memory");
    set_defaults(p);
    *out = p;
    return FP4RL_OK;
}

void fp4rl_quant_policy_destroy(fp4rl_quant_policy *p) { free(p); }

static bool is_format(int64_t v) { return v >= 0 && v <= INT_MAX && fp4rl_format_is_quantized((fp4rl_dtype)v); }

/* "0, 16, 32, 64": the tiles format f takes (format/traits.h). */
static const char *tiles_of(fp4rl_dtype f, char *buf, size_t n) { return fp4rl_format_tiles_str(f, "0", buf, n); }

static fp4rl_status bad(fp4rl_qparam param, int64_t value, const char *allowed)
{
    return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_quant_policy_set: %s = %lld is out of range; allowed: %s",
                      qparam_names[param], (long long)value, allowed);
}

/* The cross-parameter rule: each role's tile fits the role's format, and FORMAT_QK (the q/k
 * projections' format, quantized with every role's tile) fits all three tiles. Checked on the
 * candidate values v after `param` changed, for the pairs `param` belongs to; the message names
 * both parameters and which one to set first. */
static fp4rl_status check_pair(const int64_t *v, fp4rl_qparam param, fp4rl_qparam format_param, fp4rl_qparam tile_param)
{
    const fp4rl_dtype f = (fp4rl_dtype)v[format_param];
    const int64_t tile = v[tile_param];
    if ((param != format_param && param != tile_param) || fp4rl_format_tile_ok(f, tile)) return FP4RL_OK;
    char tiles[32];
    if (param == tile_param)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_quant_policy_set: %s = %lld does not fit %s = %s, which takes tiles %s; set %s first",
                          qparam_names[tile_param], (long long)tile, qparam_names[format_param], fp4rl_dtype_name(f),
                          tiles_of(f, tiles, sizeof tiles), qparam_names[format_param]);
    return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_quant_policy_set: %s = %s does not take %s = %lld (it takes tiles %s); set %s first",
                      qparam_names[format_param], fp4rl_dtype_name(f), qparam_names[tile_param], (long long)tile,
                      tiles_of(f, tiles, sizeof tiles), qparam_names[tile_param]);
}

static fp4rl_status check_pairs(const int64_t *v, fp4rl_qparam param)
{
    fp4rl_status st = FP4RL_OK;
    for (int r = 0; !st && r < 3; r++) {
        const fp4rl_qparam tp = (fp4rl_qparam)(FP4RL_QP_TILE_WEIGHT + r);
        st = check_pair(v, param, (fp4rl_qparam)(FP4RL_QP_FORMAT_WEIGHT + r), tp);
        if (!st && v[FP4RL_QP_FORMAT_QK] >= 0) st = check_pair(v, param, FP4RL_QP_FORMAT_QK, tp);
    }
    return st;
}

fp4rl_status fp4rl_quant_policy_set(fp4rl_quant_policy *p, fp4rl_qparam param, int64_t value)
{
    if (!p) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_quant_policy_set: policy is NULL");
    if ((int)param < 0 || (int)param >= FP4RL_QP_COUNT)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_quant_policy_set: unknown parameter %d (0 .. %d)", (int)param, FP4RL_QP_COUNT - 1);
    /* each value on its own */
    switch (param) {
    case FP4RL_QP_TILE_WEIGHT:
    case FP4RL_QP_TILE_ACTIVATION:
    case FP4RL_QP_TILE_GRADIENT:
        if (!(value == 0 || FP4RL_TILE_BIT(value) != 0))
            return bad(param, value, "0 (1D blocks), or 2D tiles of 16, 32, 64 (MXFP4, MXFP8, NVFP4) or 64 (HiF4)");
        break;
    case FP4RL_QP_SCALE_RULE:
        if (value != FP4RL_SCALE_OCP_FLOOR && value != FP4RL_SCALE_TRUNCATION_FREE)
            return bad(param, value, "FP4RL_SCALE_OCP_FLOOR (0), FP4RL_SCALE_TRUNCATION_FREE (1)");
        break;
    case FP4RL_QP_ROUNDING_WEIGHT:
    case FP4RL_QP_ROUNDING_ACTIVATION:
    case FP4RL_QP_ROUNDING_GRADIENT:
        if (value != FP4RL_ROUND_NEAREST && value != FP4RL_ROUND_STOCHASTIC)
            return bad(param, value, "FP4RL_ROUND_NEAREST (0), FP4RL_ROUND_STOCHASTIC (1)");
        break;
    case FP4RL_QP_SEED:
        if (value < -1) return bad(param, value, "-1 (the context's seed) or 0 .. INT64_MAX");
        break;
    case FP4RL_QP_FORMAT_WEIGHT:
    case FP4RL_QP_FORMAT_ACTIVATION:
    case FP4RL_QP_FORMAT_GRADIENT:
        if (!is_format(value))
            return bad(param, value, &FP4RL_FORMAT_IDS_SEP[2]); /* the table's formats, by enum name */
        break;
    case FP4RL_QP_FORMAT_QK:
        if (value != -1 && !is_format(value))
            return bad(param, value, "-1 (as the other linears)" FP4RL_FORMAT_IDS_SEP);
        break;
    case FP4RL_QP_TRAIN_NUMERICS:
        if (value != FP4RL_NUMERICS_BF16 && value != FP4RL_NUMERICS_FP4 && value != FP4RL_NUMERICS_FP32)
            return bad(param, value, "FP4RL_NUMERICS_BF16 (0), FP4RL_NUMERICS_FP4 (1), FP4RL_NUMERICS_FP32 (5)");
        break;
    case FP4RL_QP_ROLLOUT_NUMERICS:
        if (value != FP4RL_NUMERICS_BF16 && value != FP4RL_NUMERICS_FP32 && !(value >= FP4RL_NUMERICS_W4A16 && value <= FP4RL_NUMERICS_W4A4))
            return bad(param, value, "FP4RL_NUMERICS_BF16 (0), FP4RL_NUMERICS_W4A16 (2), FP4RL_NUMERICS_W16A4 (3), FP4RL_NUMERICS_W4A4 (4), FP4RL_NUMERICS_FP32 (5)");
        break;
    case FP4RL_QP_RESQ:
        if (value < FP4RL_RESQ_OFF || value > FP4RL_RESQ_BLOCK_50)
            return bad(param, value, "FP4RL_RESQ_OFF (0), _DENSE (1), _2_4 (2), _CHANNEL_50 (3), _BLOCK_50 (4)");
        break;
    }
    /* then with the others: the candidate policy must be valid as a whole */
    fp4rl_quant_policy next = *p;
    next.v[param] = value;
    fp4rl_status st = check_pairs(next.v, param);
    if (!st) *p = next;
    return st;
}

fp4rl_status fp4rl_quant_policy_get(const fp4rl_quant_policy *p, fp4rl_qparam param, int64_t *value)
{
    if (!p || !value) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_quant_policy_get: policy or value is NULL");
    if ((int)param < 0 || (int)param >= FP4RL_QP_COUNT)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_quant_policy_get: unknown parameter %d (0 .. %d)", (int)param, FP4RL_QP_COUNT - 1);
    *value = p->v[param];
    return FP4RL_OK;
}

fp4rl_status fp4rl_quant_policy_apply_preset(fp4rl_quant_policy *p, fp4rl_preset preset)
{
    if (!p) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_quant_policy_apply_preset: policy is NULL");
    if ((int)preset < FP4RL_PRESET_DEFAULT || (int)preset > FP4RL_PRESET_HIF4_RL)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "fp4rl_quant_policy_apply_preset: unknown preset %d (0 .. 2)", (int)preset);
    set_defaults(p);
    if (preset == FP4RL_PRESET_STABLE_2D_MXFP4) {
        p->v[FP4RL_QP_TILE_WEIGHT] = 32;
        p->v[FP4RL_QP_TILE_ACTIVATION] = 32;
        p->v[FP4RL_QP_TILE_GRADIENT] = 0;
        p->v[FP4RL_QP_SCALE_RULE] = FP4RL_SCALE_TRUNCATION_FREE;
        p->v[FP4RL_QP_ROUNDING_GRADIENT] = FP4RL_ROUND_STOCHASTIC;
        p->v[FP4RL_QP_FORMAT_QK] = FP4RL_DTYPE_MXFP8_E4M3;
    } else if (preset == FP4RL_PRESET_HIF4_RL) {
        p->v[FP4RL_QP_FORMAT_WEIGHT] = FP4RL_DTYPE_HIF4;
        p->v[FP4RL_QP_FORMAT_ACTIVATION] = FP4RL_DTYPE_HIF4;
        p->v[FP4RL_QP_FORMAT_GRADIENT] = FP4RL_DTYPE_HIF4;
        p->v[FP4RL_QP_ROUNDING_GRADIENT] = FP4RL_ROUND_STOCHASTIC;
        p->v[FP4RL_QP_RESQ] = FP4RL_RESQ_2_4;
    }
    return FP4RL_OK;
}

int64_t fp4rl_policy_value(const fp4rl_quant_policy *p, fp4rl_qparam param) { return p->v[param]; }

fp4rl_status fp4rl_policy_copy(fp4rl_quant_policy **out, const fp4rl_quant_policy *src)
{
    fp4rl_status st = fp4rl_quant_policy_create(out);
    if (!st && src) **out = *src;
    return st;
}

/* Resolves the parameters of one quantize call (used by core/tensor/quant.c). */
FP4RL_HIDDEN fp4rl_status fp4rl_policy_resolve(const fp4rl_quant_policy *p, fp4rl_dtype format, fp4rl_role role,
                                               const fp4rl_context *ctx, fp4rl_qparams *out, const char *fn)
{
    fp4rl_quant_policy defaults;
    if (!p) {
        set_defaults(&defaults);
        p = &defaults;
    }
    if ((int)role < FP4RL_ROLE_WEIGHT || (int)role > FP4RL_ROLE_GRADIENT)
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: unknown role %d (FP4RL_ROLE_WEIGHT 0, _ACTIVATION 1, _GRADIENT 2)", fn, (int)role);
    int64_t tile = p->v[FP4RL_QP_TILE_WEIGHT + role];
    if (!fp4rl_format_tile_ok(format, tile)) {
        char tiles[32];
        /* The setters keep every tile fitting its role's format and FORMAT_QK, so a format of the
         * policy itself (what the model and the rollout pass) always fits: a misfit is a bug here.
         * Only a format the caller names (fp4rl_quantize's argument) can misfit. */
        if (format == p->v[FP4RL_QP_FORMAT_WEIGHT + role] || format == p->v[FP4RL_QP_FORMAT_QK])
            return fp4rl_fail(FP4RL_ERR_INTERNAL, "%s: internal error: the policy's %s = %lld does not fit its own format %s", fn,
                              qparam_names[FP4RL_QP_TILE_WEIGHT + role], (long long)tile, fp4rl_dtype_name(format));
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: the policy's %s = %lld does not fit %s (allowed: %s)", fn,
                          qparam_names[FP4RL_QP_TILE_WEIGHT + role], (long long)tile, fp4rl_dtype_name(format),
                          tiles_of(format, tiles, sizeof tiles));
    }
    memset(out, 0, sizeof *out);
    out->format = format;
    out->tile = (int)tile;
    out->truncation_free = p->v[FP4RL_QP_SCALE_RULE] == FP4RL_SCALE_TRUNCATION_FREE;
    out->stochastic = p->v[FP4RL_QP_ROUNDING_WEIGHT + role] == FP4RL_ROUND_STOCHASTIC;
    out->seed = p->v[FP4RL_QP_SEED] >= 0 ? (uint64_t)p->v[FP4RL_QP_SEED] : ctx->seed;
    out->offset = ctx->rng_offset;
    return FP4RL_OK;
}
