/* ops_cpu.h - the CPU backend's ops (core/cpu/ops_*.c), filled into fp4rl_cpu_ops; each is
 * declared and documented once, at its entry in core/backend/ops_list.h. */
#ifndef FP4RL_OPS_CPU_H
#define FP4RL_OPS_CPU_H

#include "backend/ops.h"

/* fp4rl_cpu_<op> for every op of the list: a definition of another signature does not compile. */
#define FP4RL_OP(ret, op, params) FP4RL_HIDDEN ret fp4rl_cpu_##op params;
#include "backend/ops_list.h"

/* One query row of attention (ops_attention.c), shared by the training attention and the rollout's
 * decode attention so both do the same arithmetic in the same order: o = sum_s p_s v_s over the
 * n_keys keys k_s = k + s * stride (v likewise), p = softmax(scale * q.k) in FP32 with a double
 * running sum, in numerics nm (ops.h). Returns the row's log-sum-exp. */
FP4RL_HIDDEN float fp4rl_cpu_attend_row(float *o, const float *q, const float *k, const float *v, int64_t stride,
                                        int64_t n_keys, int64_t D, float scale, fp4rl_att_numerics nm);
#endif
