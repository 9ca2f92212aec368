/*
 * qlayout.h - where element (r, c) of a quantized tensor in host memory keeps its code and its
 * scale, and the value they decode to. The one owner of this indexing on the host: the CPU
 * backend (core/cpu/cpu_quant.c) and the error report (core/tensor/qerror.c) both read through it;
 * the layout itself is documented in fp4rl.h (fp4rl_tensor_codes_to_host, _scales_to_host).
 */
#ifndef FP4RL_QLAYOUT_H
#define FP4RL_QLAYOUT_H

#include "format/formats.h"
#include "runtime/internal.h"

/* Code of element (r, c): one E4M3 byte, or a nibble of two FP4 codes per byte (low nibble first). */
static inline uint8_t fp4rl_q_code(const fp4rl_qdesc *d, const uint8_t *codes, int64_t r, int64_t c)
{
    if (d->dtype == FP4RL_DTYPE_MXFP8_E4M3) return codes[r * d->row_bytes + c];
    uint8_t b = codes[r * d->row_bytes + c / 2];
    return (c & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 0x0f);
}

/* Index of the one-byte scale of element (r, c) for MX / NVFP4 (1D block or 2D tile). */
static inline int64_t fp4rl_q_scale_index(const fp4rl_qdesc *d, int64_t r, int64_t c)
{
    if (d->tile) return (r / d->tile) * d->scale_cols + c / d->tile;
    return r * d->scale_cols + c / d->block;
}

/* The value of element (r, c); unscaled skips NVFP4's tensor scale. HiF4 keeps one 32-bit word
 * per 64 elements of a row, in 1D and 2D alike. */
static inline float fp4rl_q_value(const fp4rl_tensor *q, int64_t r, int64_t c, int unscaled)
{
    const fp4rl_qdesc *d = &q->q;
    uint8_t code = fp4rl_q_code(d, q->data, r, c);
    switch (d->dtype) {
    case FP4RL_DTYPE_HIF4:
        return fp4rl_hif4_decode(code, ((const uint32_t *)q->scales)[r * d->scale_cols + c / 64], (int)(c % 64));
    case FP4RL_DTYPE_NVFP4: {
        uint8_t s = ((const uint8_t *)q->scales)[fp4rl_q_scale_index(d, r, c)];
        return unscaled ? fp4rl_nvfp4_decode_unscaled(code, s) : fp4rl_nvfp4_decode(code, s, q->tensor_scale);
    }
    default:
        return fp4rl_mx_decode(code, ((const uint8_t *)q->scales)[fp4rl_q_scale_index(d, r, c)],
                               d->dtype == FP4RL_DTYPE_MXFP8_E4M3);
    }
}

#endif
