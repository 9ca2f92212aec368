/* ops_table.c - the CPU backend's op table (core/backend/ops.h): slot <op> holds fp4rl_cpu_<op>,
 * one designated initialiser per entry of core/backend/ops_list.h, so no op can be left out or put
 * in another op's slot (tests/test_ops_table.c and tests/check_ops_tables.py hold that). */
#include "cpu/ops_cpu.h"

const fp4rl_ops fp4rl_cpu_ops = {
    .name = "cpu",
#define FP4RL_OP(ret, op, params) .op = fp4rl_cpu_##op,
#include "backend/ops_list.h"
};
