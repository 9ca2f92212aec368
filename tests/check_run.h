/* check_run.h - the end of every Check suite's main: run it, report, exit status. */
#ifndef FP4RL_CHECK_RUN_H
#define FP4RL_CHECK_RUN_H
#include <check.h>
#include <stdlib.h>

#include <fp4rl/fp4rl.h>

static inline int fp4rl_check_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#include <stdio.h>
/* The call returns `want`, and a failure leaves a message. */
#define FP4RL_EXPECT(call, want)                                                                     \
    do {                                                                                             \
        fp4rl_status st_ = (call);                                                                   \
        ck_assert_msg(st_ == (want), "%s returned %s, expected %s (%s)", #call, fp4rl_status_name(st_), \
                      fp4rl_status_name(want), fp4rl_last_error());                                  \
        if ((want) != FP4RL_OK) ck_assert_msg(fp4rl_last_error()[0] != 0, "%s: empty message", #call); \
    } while (0)

/* GPU suites: 0 when a CUDA context can be made, else prints why `name` is skipped and returns
 * ctest's skip code 77. */
static inline int fp4rl_gpu_or_skip(const char *name)
{
    fp4rl_context *probe;
    if (fp4rl_context_create(&probe, FP4RL_DEVICE_CUDA, 0) != FP4RL_OK) {
        printf("%s: skipped, no CUDA context: %s\n", name, fp4rl_last_error());
        return 77;
    }
    fp4rl_context_destroy(probe);
    return 0;
}

/* ||a - b||_2 / ||b||_2 (b all zero: ||a - b||_2), in double: the normwise error of the GPU suites. */
#include <math.h>
#include <stdint.h>
static inline double fp4rl_l2rel(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* One process for GPU suites: a CUDA context does not survive fork. */
static inline int fp4rl_check_run_nofork(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
#endif
