/* cpu_internal.h - the CPU backend's functions (filled into fp4rl_cpu_backend). */
#ifndef FP4RL_CPU_INTERNAL_H
#define FP4RL_CPU_INTERNAL_H
#include "runtime/internal.h"

FP4RL_HIDDEN fp4rl_status fp4rl_cpu_quantize(fp4rl_context *ctx, fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_dequantize(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *q, int unscaled);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_transpose(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *t);
/* Code (r, c) of a quantized tensor in host memory, and its dequantized value. */
FP4RL_HIDDEN uint8_t fp4rl_cpu_get_code(const fp4rl_qdesc *d, const uint8_t *codes, int64_t r, int64_t c);
FP4RL_HIDDEN float fp4rl_cpu_deq_at(const fp4rl_tensor *q, int64_t r, int64_t c, int unscaled);
#endif
