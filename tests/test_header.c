/* test_header.c - the public header is plain C99 (built with -std=c99 -pedantic -Werror) and
 * C++ (the same file is compiled as C++ by test_header_cxx.cpp). */
#include <fp4rl/fp4rl.h>
#include <stdio.h>

int main(void)
{
    fp4rl_context *ctx = NULL;
    fp4rl_status st = fp4rl_context_create(&ctx, FP4RL_DEVICE_CPU, 0);
    printf("%s %s\n", fp4rl_version_string(), fp4rl_status_name(st));
    fp4rl_context_destroy(ctx);
    return st == FP4RL_OK && fp4rl_version_number() == FP4RL_VERSION_NUMBER ? 0 : 1;
}
