/*
 * qlayout.h - where element (r, c) of a quantized tensor in host memory keeps its code and its
 * scale, and the value they decode to: format/layout.h's indexing applied to a tensor's
 * description. The CPU backend (core/cpu/cpu_quant.c) and the error report (core/tensor/qerror.c)
 * both read through it; the CUDA kernels call format/layout.h directly.
 */
#ifndef FP4RL_QLAYOUT_H
#define FP4RL_QLAYOUT_H

#include "format/formats.h"
#include "format/layout.h"
#include "format/traits.h"
#include "runtime/internal.h"

static inline int fp4rl_q_code_bits(const fp4rl_qdesc *d) { return fp4rl_format_of(d->dtype).code_bits; }

/* Code of element (r, c). */
static inline uint8_t fp4rl_q_code(const fp4rl_qdesc *d, const uint8_t *codes, int64_t r, int64_t c)
{
    return fp4rl_code_get(codes, d->row_bytes, fp4rl_q_code_bits(d), r, c);
}
static inline void fp4rl_q_put_code(const fp4rl_qdesc *d, uint8_t *codes, int64_t r, int64_t c, uint8_t code)
{
    fp4rl_code_put(codes, d->row_bytes, fp4rl_q_code_bits(d), r, c, code);
}

/* Index of the one-byte scale of element (r, c) for MX / NVFP4 (1D block or 2D tile). */
static inline int64_t fp4rl_q_scale_index(const fp4rl_qdesc *d, int64_t r, int64_t c)
{
    return fp4rl_scale_index(d->tile, d->block, d->scale_cols, r, c);
}

/* The value of element (r, c); unscaled skips NVFP4's tensor scale. */
static inline float fp4rl_q_value(const fp4rl_tensor *q, int64_t r, int64_t c, int unscaled)
{
    const fp4rl_qdesc *d = &q->q;
    uint8_t code = fp4rl_q_code(d, q->data, r, c);
    switch (fp4rl_format_of(d->dtype).scale_kind) {
    case FP4RL_SCALE_KIND_HIF4_WORD:
        return fp4rl_hif4_decode(code, ((const uint32_t *)q->scales)[fp4rl_hif4_word_index(d->scale_cols, r, c)],
                                 fp4rl_hif4_unit_pos(c));
    case FP4RL_SCALE_KIND_UE4M3: {
        uint8_t s = ((const uint8_t *)q->scales)[fp4rl_q_scale_index(d, r, c)];
        return unscaled ? fp4rl_nvfp4_decode_unscaled(code, s) : fp4rl_nvfp4_decode(code, s, q->tensor_scale);
    }
    default:
        return fp4rl_mx_decode(code, ((const uint8_t *)q->scales)[fp4rl_q_scale_index(d, r, c)],
                               fp4rl_q_code_bits(d) == 8);
    }
}

#endif
