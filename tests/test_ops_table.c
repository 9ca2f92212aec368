/* test_ops_table.c - every slot of the CPU backend's op table (core/cpu/ops_table.c) is filled,
 * and it is what a CPU context calls. The table is `name` and then function pointers only (the
 * static assertion below and tests/check_ops_tables.py hold that), so it is walked as an array of
 * them: a slot added to core/backend/ops.h and left out of the table fails here by its position.
 * tests/check_ops_tables.py names the slots of both tables (CUDA's too, without a GPU). */
#include <stddef.h>
#include <string.h>

#include "backend/ops.h"
#include "check_run.h"

typedef void (*any_fn)(void);

#define FIRST_SLOT offsetof(fp4rl_ops, embedding_forward)
_Static_assert((sizeof(fp4rl_ops) - FIRST_SLOT) % sizeof(any_fn) == 0, "fp4rl_ops: only function pointers after name");

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
    ck_assert_uint_ge(n, 30); /* the walk sees the table (37 slots when this was written) */
    ck_assert_str_eq(fp4rl_cpu_ops.name, "cpu");
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(slot(&fp4rl_cpu_ops, i) != NULL, "core/cpu/ops_table.c leaves slot %zu of %zu (byte offset %zu of struct fp4rl_ops) NULL",
                      i, n, FIRST_SLOT + i * sizeof(any_fn));
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
    tcase_add_test(tc, test_cpu_context_uses_it);
    suite_add_tcase(s, tc);
    return fp4rl_check_run(s);
}
