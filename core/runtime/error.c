/* error.c - status names and the thread-local error message. */
#include <stdarg.h>
#include <stdio.h>

#include "runtime/internal.h"

static _Thread_local char last_error[1024];

const char *fp4rl_last_error(void) { return last_error; }

fp4rl_status fp4rl_fail(fp4rl_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

const char *fp4rl_status_name(fp4rl_status s)
{
    switch (s) {
    case FP4RL_OK: return "FP4RL_OK";
    case FP4RL_ERR_INVALID_ARGUMENT: return "FP4RL_ERR_INVALID_ARGUMENT";
    case FP4RL_ERR_SHAPE: return "FP4RL_ERR_SHAPE";
    case FP4RL_ERR_DTYPE: return "FP4RL_ERR_DTYPE";
    case FP4RL_ERR_UNSUPPORTED: return "FP4RL_ERR_UNSUPPORTED";
    case FP4RL_ERR_OUT_OF_MEMORY: return "FP4RL_ERR_OUT_OF_MEMORY";
    case FP4RL_ERR_DEVICE: return "FP4RL_ERR_DEVICE";
    case FP4RL_ERR_IO: return "FP4RL_ERR_IO";
    case FP4RL_ERR_CORRUPT: return "FP4RL_ERR_CORRUPT";
    case FP4RL_ERR_CALLBACK: return "FP4RL_ERR_CALLBACK";
    case FP4RL_ERR_INTERNAL: return "FP4RL_ERR_INTERNAL";
    }
    return "FP4RL_STATUS_UNKNOWN";
}

const char *fp4rl_shape_str(char *buf, size_t n, int ndim, const int64_t *dims)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)dims[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
    return buf;
}

unsigned fp4rl_version_number(void) { return FP4RL_VERSION_NUMBER; }
const char *fp4rl_version_string(void) { return FP4RL_VERSION_STR; }
