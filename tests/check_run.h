/* check_run.h - the end of every Check suite's main: run it, report, exit status. */
#ifndef FP4RL_CHECK_RUN_H
#define FP4RL_CHECK_RUN_H
#include <check.h>
#include <stdlib.h>

static inline int fp4rl_check_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
#endif
