/* qerror.c - the quantization-error report: relative MSE, underflow, saturation, NaN blocks. */
#include <stdlib.h>
#include <string.h>

#include "format/formats.h"
#include "tensor/qlayout.h"

/* Block id of element (r, c), and the number of blocks: a 1D block or a 2D tile. A HiF4 block
 * (unit or 64 x 64 tile) counts as one although its words are stored per row, so it is numbered
 * like an MX / NVFP4 scale. */
static int64_t block_of(const fp4rl_qdesc *d, int64_t r, int64_t c) { return fp4rl_q_scale_index(d, r, c); }
static int64_t block_count(const fp4rl_qdesc *d)
{
    return (d->tile ? (d->rows + d->tile - 1) / d->tile : d->rows) * d->scale_cols;
}

/* Whether element (r, c), input x, was clipped: its code is the largest magnitude and |x| is
 * beyond the value that code decodes to. */
static int clipped(const fp4rl_tensor *q, int64_t r, int64_t c, float x)
{
    const fp4rl_qdesc *d = &q->q;
    const fp4rl_format_traits t = fp4rl_format_of(d->dtype);
    uint8_t code = fp4rl_q_code(d, q->data, r, c);
    if ((code & fp4rl_format_mag_mask(t)) != t.max_code) return 0;
    return fabsf(x) > fabsf(fp4rl_q_value(q, r, c, 0));
}

fp4rl_status fp4rl_quant_error(const fp4rl_tensor *src, const fp4rl_tensor *q, double *rel_mse, double *underflow_frac,
                               double *saturated_frac, double *nan_block_frac)
{
    const char *fn = "fp4rl_quant_error";
    fp4rl_status st = fp4rl_check_tensor(src, fn, "src");
    if (!st) st = fp4rl_check_tensor(q, fn, "q");
    if (st) return st;
    if (src->dtype != FP4RL_DTYPE_F32 && src->dtype != FP4RL_DTYPE_BF16)
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: src is %s; it must be the dense f32 or bf16 source", fn, fp4rl_dtype_name(src->dtype));
    if (!fp4rl_dtype_is_quantized(q->dtype))
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: q is %s, not a quantized tensor", fn, fp4rl_dtype_name(q->dtype));
    if (src->ndim != q->ndim || memcmp(src->dims, q->dims, (size_t)src->ndim * sizeof(int64_t)) != 0) {
        char a[128], b[128];
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: src is %s but q is %s", fn, fp4rl_shape_str(a, sizeof a, src->ndim, src->dims),
                          fp4rl_shape_str(b, sizeof b, q->ndim, q->dims));
    }
    fp4rl_context host = {.device = FP4RL_DEVICE_CPU, .be = &fp4rl_cpu_backend};
    fp4rl_tensor *hs = NULL, *hq = NULL;
    const fp4rl_qdesc *d = &q->q;
    const int64_t nb = block_count(d);
    uint8_t *flags = calloc((size_t)nb, 1); /* bit 0: NaN block, bit 1: saturated */
    if (!flags) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    st = fp4rl_tensor_to_cpu(&hs, &host, src);
    if (!st) st = fp4rl_tensor_to_cpu(&hq, &host, q);
    if (!st) {
        double se = 0, sx = 0;
        int64_t nonzero = 0, under = 0;
        for (int64_t r = 0; r < d->rows; r++)
            for (int64_t c = 0; c < d->cols; c++) {
                int64_t i = r * d->cols + c, blk = block_of(d, r, c);
                float x = hs->dtype == FP4RL_DTYPE_F32 ? ((float *)hs->data)[i] : fp4rl_bf16_to_f32(((uint16_t *)hs->data)[i]);
                float y = fp4rl_q_value(hq, r, c, 0);
                if (y != y) { flags[blk] |= 1; continue; }
                se += ((double)x - y) * ((double)x - y);
                sx += (double)x * x;
                if (x != 0.0f) {
                    nonzero++;
                    if (y == 0.0f) under++;
                }
                if (clipped(hq, r, c, x)) flags[blk] |= 2;
            }
        int64_t nan_blocks = 0, sat_blocks = 0;
        for (int64_t b = 0; b < nb; b++) {
            nan_blocks += flags[b] & 1;
            sat_blocks += (flags[b] & 3) == 2;
        }
        if (rel_mse) *rel_mse = sx > 0 ? se / sx : 0.0;
        if (underflow_frac) *underflow_frac = nonzero ? (double)under / (double)nonzero : 0.0;
        if (saturated_frac) *saturated_frac = nb > nan_blocks ? (double)sat_blocks / (double)(nb - nan_blocks) : 0.0;
        if (nan_block_frac) *nan_block_frac = (double)nan_blocks / (double)nb;
    }
    fp4rl_tensor_destroy(hs);
    fp4rl_tensor_destroy(hq);
    host.be->context_destroy(&host); /* the backend's state of this temporary context (its byte counts) */
    free(flags);
    return st;
}
