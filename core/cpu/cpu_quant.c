/*
 * cpu_quant.c - the CPU reference: quantize, dequantize and transpose of quantized tensors,
 * on host memory, with the element and scale math of core/format/formats.h.
 *
 * Every format is done in two passes: (1) one scale per block (1D block, 2D tile, HiF4 unit or
 * tile) from the block's max magnitude, (2) each element encoded with its block's scale.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_internal.h"
#include "format/formats.h"
#include "tensor/qlayout.h"

/* Element (r, c) of a dense F32/BF16 source, as binary32 (exact for BF16). */
static inline float src_at(const fp4rl_tensor *src, int64_t i)
{
    if (src->dtype == FP4RL_DTYPE_F32) return ((const float *)src->data)[i];
    return fp4rl_bf16_to_f32(((const uint16_t *)src->data)[i]);
}


/* Stochastic-rounding uniforms, one Philox call per 4 consecutive indices. */
typedef struct sr_stream { uint64_t seed, offset, q; uint32_t out[4]; int valid; } sr_stream;
static float sr_next(sr_stream *s, uint64_t i)
{
    uint64_t q = i >> 2;
    if (!s->valid || q != s->q) {
        uint32_t c[4] = {(uint32_t)q, (uint32_t)(q >> 32), (uint32_t)s->offset, (uint32_t)(s->offset >> 32)};
        uint32_t k[2] = {(uint32_t)s->seed, (uint32_t)(s->seed >> 32)};
        fp4rl_philox4x32_10(c, k, s->out);
        s->q = q;
        s->valid = 1;
    }
    return (float)(s->out[i & 3] >> 8) * 0x1p-24f;
}

/* Max magnitude and finiteness of the block rows [r0, r1) x cols [c0, c1). */
static float block_amax(const fp4rl_tensor *src, int64_t C, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int *finite)
{
    float amax = 0.0f;
    *finite = 1;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
            float x = src_at(src, r * C + c);
            if (!fp4rl_is_finite(x)) *finite = 0;
            else if (fabsf(x) > amax) amax = fabsf(x);
        }
    return amax;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- MX and NVFP4 ---------------------------------------------------------------------------- */
static void quantize_scaled(fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p)
{
    const fp4rl_qdesc *d = &q->q;
    const int64_t R = d->rows, C = d->cols;
    const fp4rl_format_traits t = fp4rl_format_of(d->dtype);
    const int fp8 = t.code_bits == 8, nv = t.scale_kind == FP4RL_SCALE_KIND_UE4M3;
    const int bh = d->tile ? d->tile : 1, bw = d->tile ? d->tile : d->block;
    uint8_t *scales = q->scales, *codes = q->data;
    float g = 1.0f;

    if (nv) { /* per-tensor decode scale from the max over the finite elements */
        int fin;
        g = fp4rl_nvfp4_tensor_scale(block_amax(src, C, 0, R, 0, C, &fin));
    }
    q->tensor_scale = g;
    for (int64_t sr = 0; sr < d->scale_rows; sr++)
        for (int64_t sc = 0; sc < d->scale_cols; sc++) {
            int finite;
            float amax = block_amax(src, C, sr * bh, min64(R, (sr + 1) * bh), sc * bw, min64(C, (sc + 1) * bw), &finite);
            uint8_t s;
            if (!finite) s = nv ? FP4RL_UE4M3_NAN : FP4RL_E8M0_NAN;
            else if (nv) s = fp4rl_nvfp4_block_scale(amax, g);
            else s = fp4rl_mx_block_scale(amax, d->dtype, p->truncation_free);
            scales[sr * d->scale_cols + sc] = s;
        }

    sr_stream rs = {p->seed, p->offset, 0, {0, 0, 0, 0}, 0};
    memset(codes, 0, fp4rl_qdesc_codes_bytes(d));
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            uint8_t s = scales[fp4rl_q_scale_index(d, r, c)];
            float x = src_at(src, r * C + c);
            float u = p->stochastic ? sr_next(&rs, (uint64_t)(r * C + c)) : -1.0f;
            uint8_t code;
            if (nv) code = (s == FP4RL_UE4M3_NAN || s == 0) ? 0 : fp4rl_nvfp4_encode(x, s, g, u);
            else code = (s == FP4RL_E8M0_NAN) ? 0 : fp4rl_mx_encode(x, fp4rl_e8m0_exp(s), fp8, u);
            fp4rl_q_put_code(d, codes, r, c, code);
        }
}

/* ---- HiF4 ------------------------------------------------------------------------------------ */
/* The increment bits of one tile: rows [r0, r0 + th) x cols [c0, c0 + 64) (th = 1 for 1D units,
 * 64 for 2D tiles), padded with zeros. e8[i][h]: sub-block (rows i..i+sh, cols 8h..8h+7) with
 * sh = 1 (1D) or 8 (2D); e16[i][g] likewise with 4. Returns 0 if the tile has a non-finite value. */
enum { UNIT = FP4RL_HIF4_UNIT }; /* 64 elements of a row; a 2D tile is UNIT x UNIT */
typedef struct hif4_tile { fp4rl_hif4_base b; uint8_t e8[UNIT][8]; uint8_t e16[UNIT][16]; } hif4_tile;

static int hif4_tile_bits(hif4_tile *t, const fp4rl_tensor *src, int64_t R, int64_t C, int64_t r0, int64_t c0, int th)
{
    const int s8 = th == 1 ? 1 : 8, s4 = th == 1 ? 1 : 4; /* sub-block heights */
    int finite;
    float amax = block_amax(src, C, r0, min64(R, r0 + th), c0, min64(C, c0 + UNIT), &finite);
    if (!finite) return 0;
    t->b = fp4rl_hif4_make_base(amax);
    for (int i = 0; i < th; i += s8)
        for (int h = 0; h < 8; h++) {
            int f;
            float m8 = block_amax(src, C, min64(R, r0 + i), min64(R, r0 + i + s8), min64(C, c0 + 8 * h),
                                  min64(C, c0 + 8 * h + 8), &f);
            for (int k = 0; k < s8; k++) t->e8[i + k][h] = (uint8_t)fp4rl_hif4_e8(m8, t->b.rec);
        }
    for (int i = 0; i < th; i += s4)
        for (int g = 0; g < 16; g++) {
            int f;
            float m4 = block_amax(src, C, min64(R, r0 + i), min64(R, r0 + i + s4), min64(C, c0 + 4 * g),
                                  min64(C, c0 + 4 * g + 4), &f);
            for (int k = 0; k < s4; k++) t->e16[i + k][g] = (uint8_t)fp4rl_hif4_e16(m4, t->e8[i][g / 2], t->b.rec);
        }
    return 1;
}

static uint32_t hif4_row_word(const hif4_tile *t, int i)
{
    uint32_t w = t->b.e6m2;
    for (int h = 0; h < 8; h++) w |= fp4rl_hif4_e8_at(t->e8[i][h], h);
    for (int g = 0; g < 16; g++) w |= fp4rl_hif4_e16_at(t->e16[i][g], g);
    return w;
}

static void quantize_hif4(fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p)
{
    const fp4rl_qdesc *d = &q->q;
    const int64_t R = d->rows, C = d->cols, U = d->scale_cols;
    const int th = d->tile ? UNIT : 1;
    uint32_t *words = q->scales;
    uint8_t *codes = q->data;
    hif4_tile t;
    sr_stream rs = {p->seed, p->offset, 0, {0, 0, 0, 0}, 0};

    q->tensor_scale = 1.0f;
    memset(codes, 0, fp4rl_qdesc_codes_bytes(d));
    for (int64_t r0 = 0; r0 < R; r0 += th)
        for (int64_t u = 0; u < U; u++) {
            int finite = hif4_tile_bits(&t, src, R, C, r0, u * UNIT, th);
            for (int64_t r = r0; r < min64(R, r0 + th); r++) {
                int i = (int)(r - r0);
                words[r * U + u] = finite ? hif4_row_word(&t, i) : FP4RL_HIF4_NAN_WORD;
                if (!finite) continue;
                for (int64_t c = u * UNIT; c < min64(C, u * UNIT + UNIT); c++) {
                    int j = (int)(c - u * UNIT);
                    float x = src_at(src, r * C + c);
                    float uu = p->stochastic ? sr_next(&rs, (uint64_t)(r * C + c)) : -1.0f;
                    fp4rl_q_put_code(d, codes, r, c, fp4rl_hif4_encode(x, t.e8[i][j / 8] + t.e16[i][j / 4], t.b.rec, uu));
                }
            }
        }
}

fp4rl_status fp4rl_cpu_quantize(fp4rl_context *ctx, fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p)
{
    (void)ctx;
    if (fp4rl_format_of(q->q.dtype).scale_kind == FP4RL_SCALE_KIND_HIF4_WORD) quantize_hif4(q, src, p);
    else quantize_scaled(q, src, p);
    return FP4RL_OK;
}

/* The dequantized value of element (r, c); unscaled skips NVFP4's g. */
fp4rl_status fp4rl_cpu_dequantize(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *q, int unscaled)
{
    (void)ctx;
    const int64_t R = q->q.rows, C = q->q.cols;
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            float v = fp4rl_q_value(q, r, c, unscaled);
            if (out->dtype == FP4RL_DTYPE_F32) ((float *)out->data)[r * C + c] = v;
            else ((uint16_t *)out->data)[r * C + c] = fp4rl_f32_to_bf16(v);
        }
    return FP4RL_OK;
}

/* ---- transpose ------------------------------------------------------------------------------- */
static void transpose_dense(fp4rl_tensor *out, const fp4rl_tensor *t)
{
    const int64_t R = t->dims[0], C = t->dims[1];
    const size_t es = fp4rl_dtype_size(t->dtype);
    const char *s = t->data;
    char *o = out->data;
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) memcpy(o + (c * R + r) * es, s + (r * C + c) * es, es);
}

fp4rl_status fp4rl_cpu_transpose(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *t)
{
    (void)ctx;
    if (fp4rl_dtype_is_dense(t->dtype)) {
        transpose_dense(out, t);
        return FP4RL_OK;
    }
    const fp4rl_qdesc *d = &t->q, *od = &out->q;
    memset(out->data, 0, fp4rl_qdesc_codes_bytes(od));
    for (int64_t r = 0; r < d->rows; r++)
        for (int64_t c = 0; c < d->cols; c++) fp4rl_q_put_code(od, out->data, c, r, fp4rl_q_code(d, t->data, r, c));
    if (fp4rl_format_of(d->dtype).scale_kind == FP4RL_SCALE_KIND_HIF4_WORD) {
        uint32_t *ow = out->scales;
        for (int64_t c = 0; c < od->rows; c++)
            for (int64_t v = 0; v < od->scale_cols; v++) ow[c * od->scale_cols + v] = fp4rl_hif4_transposed_word(t->scales, d->rows, d->scale_cols, c, v);
    } else {
        const uint8_t *s = t->scales;
        uint8_t *os = out->scales;
        for (int64_t i = 0; i < d->scale_rows; i++)
            for (int64_t k = 0; k < d->scale_cols; k++) os[k * d->scale_rows + i] = s[i * d->scale_cols + k];
    }
    out->tensor_scale = t->tensor_scale;
    return FP4RL_OK;
}
