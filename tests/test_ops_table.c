/* test_ops_table.c - the CPU backend's op table (core/cpu/ops_table.c) holds every op of
 * core/backend/ops_list.h in its own slot, and it is what a CPU context calls. The struct is
 * `name` and then one function pointer per op of the list (the static assertion below holds that,
 * from the list's own count), so it is also walked as an array of them: no slot is NULL.
 * tests/check_ops_tables.py checks the sources of both tables (CUDA's too, without a GPU). */
#include <stddef.h>
#include <string.h>

#include "backend/ops.h"
#include "check_run.h"
#include "cpu/ops_cpu.h"

typedef void (*any_fn)(void);

/* The number of ops, counted from the list itself. */
enum {
    N_OPS = 0
#define FP4RL_OP(ret, op, params) +1
#include "backend/ops_list.h"
};

#define FIRST_SLOT offsetof(fp4rl_ops, embedding_forward)
_Static_assert(FIRST_SLOT == sizeof(const char *), "fp4rl_ops: the first op slot follows name");
_Static_assert(sizeof(fp4rl_ops) == FIRST_SLOT + N_OPS * sizeof(any_fn),
               "fp4rl_ops: name and one function pointer per op of backend/ops_list.h, nothing else");

/* Slot i of table t, copied out as bytes (any function pointer has this one representation on the
 * platforms fp4rl builds for). */
static any_fn slot(const fp4rl_ops *t, size_t i)
{
    any_fn f;
    memcpy(&f, (const unsigned char *)t + FIRST_SLOT + i * sizeof f, sizeof f);
    return f;
}

START_TEST(test_cpu_slots_filled)
{
    const size_t n = (sizeof(fp4rl_ops) - FIRST_SLOT) / sizeof(any_fn);
    ck_assert_uint_eq(n, N_OPS);
    ck_assert_uint_ge(n, 40); /* the walk sees the table (42 ops when this was written) */
    ck_assert_str_eq(fp4rl_cpu_ops.name, "cpu");
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(slot(&fp4rl_cpu_ops, i) != NULL, "core/cpu/ops_table.c leaves slot %zu of %zu (byte offset %zu of struct fp4rl_ops) NULL",
                      i, n, FIRST_SLOT + i * sizeof(any_fn));
}
END_TEST

/* Slot <op> holds fp4rl_cpu_<op>, by name, for every op of the list. */
START_TEST(test_cpu_slots_by_name)
{
#define FP4RL_OP(ret, op, params) \
    ck_assert_msg(fp4rl_cpu_ops.op == fp4rl_cpu_##op, "fp4rl_cpu_ops." #op " does not hold fp4rl_cpu_" #op);
#include "backend/ops_list.h"
}
END_TEST

START_TEST(test_cpu_context_uses_it)
{
    fp4rl_context *ctx = NULL;
    ck_assert_int_eq(fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0), FP4RL_OK);
    ck_assert_ptr_eq(ctx->ops, &fp4rl_cpu_ops);
    fp4rl_context_destroy(ctx);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops_table");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, test_cpu_slots_filled);
    tcase_add_test(tc, test_cpu_slots_by_name);
    tcase_add_test(tc, test_cpu_context_uses_it);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
