/* cpu_internal.h - the CPU backend's functions (filled into fp4rl_cpu_backend). */
#ifndef FP4RL_CPU_INTERNAL_H
#define FP4RL_CPU_INTERNAL_H
#include "runtime/internal.h"

FP4RL_HIDDEN fp4rl_status fp4rl_cpu_quantize(fp4rl_context *ctx, fp4rl_tensor *q, const fp4rl_tensor *src, const fp4rl_qparams *p);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_dequantize(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *q, int unscaled);
FP4RL_HIDDEN fp4rl_status fp4rl_cpu_transpose(fp4rl_context *ctx, fp4rl_tensor *out, const fp4rl_tensor *t);
#endif
