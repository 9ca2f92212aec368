/*
 * fixtures_path.h - where a test finds tests/fixtures: $FP4RL_FIXTURES when it is set (binaries run
 * away from their source tree, as on the GPU machine; the Python tests read the same variable),
 * else the source tree's, compiled in by CMake as FP4RL_FIXTURES_DIR.
 */
#ifndef FP4RL_FIXTURES_PATH_H
#define FP4RL_FIXTURES_PATH_H
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef FP4RL_FIXTURES_DIR
#error "FP4RL_FIXTURES_DIR must name tests/fixtures"
#endif

static inline const char *fp4rl_fixtures_dir(void)
{
    const char *e = getenv("FP4RL_FIXTURES");
    return e && *e ? e : FP4RL_FIXTURES_DIR;
}

/* buf = <fixtures>/<rel> (rel: a printf format and its arguments); fails the test if it is cut. */
#define FP4RL_FIXTURE(buf, ...)                                                                   \
    do {                                                                                          \
        const int n_ = snprintf((buf), sizeof(buf), "%s/", fp4rl_fixtures_dir());                 \
        ck_assert(n_ > 0 && (size_t)n_ < sizeof(buf));                                            \
        const int m_ = snprintf((buf) + n_, sizeof(buf) - (size_t)n_, __VA_ARGS__);               \
        ck_assert_msg(m_ >= 0 && (size_t)m_ < sizeof(buf) - (size_t)n_, "fixture path too long"); \
    } while (0)

#endif
