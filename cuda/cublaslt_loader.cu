/*
 * cublaslt_loader.cu - dlopen of libcublasLt and the table of its entry points (cublaslt_loader.h).
 *
 * Looked up by the dynamic loader's usual rules (LD_LIBRARY_PATH, the ld.so cache, the system
 * directories): first libcublasLt.so.<major> of the cuBLAS the backend was compiled against, then
 * the unversioned libcublasLt.so, last the build machine's own copy (the toolkit's library
 * directory, as found by CMake). A library of another major version is refused.
 */
#include "cublaslt_loader.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define FP4RL_STR2(x) #x
#define FP4RL_STR(x) FP4RL_STR2(x)
#define FP4RL_CUBLASLT_SONAME "libcublasLt.so." FP4RL_STR(CUBLAS_VER_MAJOR)

namespace {

template <typename F> int resolve(void *lib, const char *name, F *out, fp4rl_cublaslt *a)
{
    dlerror();
    *out = reinterpret_cast<F>(dlsym(lib, name));
    if (!*out) {
        const char *err = dlerror();
        snprintf(a->why, sizeof a->why, "cuBLASLt (%s) has no symbol %s (%s)", FP4RL_CUBLASLT_SONAME, name, err ? err : "");
    }
    return *out != nullptr;
}

fp4rl_cublaslt load_cublaslt()
{
    fp4rl_cublaslt a;
    memset(&a, 0, sizeof a);
    const char *names[] = {FP4RL_CUBLASLT_SONAME, "libcublasLt.so",
#ifdef FP4RL_CUBLASLT_LIBRARY_PATH
                           FP4RL_CUBLASLT_LIBRARY_PATH,
#endif
                           nullptr};
    void *lib = nullptr;
    char first_err[384] = "";
    for (int i = 0; names[i] && !lib; i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib && i == 0) {
            const char *err = dlerror();
            snprintf(first_err, sizeof first_err, "%s", err ? err : "");
        }
    }
    if (!lib) {
        snprintf(a.why, sizeof a.why,
                 "cuBLASLt is not installed here: dlopen(%s) failed (%s); put %s (CUDA %d's cuBLAS) on the library path "
                 "(LD_LIBRARY_PATH)",
                 FP4RL_CUBLASLT_SONAME, first_err, FP4RL_CUBLASLT_SONAME, CUBLAS_VER_MAJOR);
        return a;
    }
    /* the library stays loaded for the life of the process: handles may outlive any one context */
    if (!resolve(lib, "cublasLtGetVersion", &a.get_version, &a) || !resolve(lib, "cublasLtCreate", &a.create, &a) ||
        !resolve(lib, "cublasLtDestroy", &a.destroy, &a) || !resolve(lib, "cublasLtMatmul", &a.matmul, &a) ||
        !resolve(lib, "cublasLtMatmulAlgoGetHeuristic", &a.algo_get_heuristic, &a) ||
        !resolve(lib, "cublasLtMatmulDescCreate", &a.desc_create, &a) || !resolve(lib, "cublasLtMatmulDescDestroy", &a.desc_destroy, &a) ||
        !resolve(lib, "cublasLtMatmulDescSetAttribute", &a.desc_set_attribute, &a) ||
        !resolve(lib, "cublasLtMatmulPreferenceCreate", &a.pref_create, &a) ||
        !resolve(lib, "cublasLtMatmulPreferenceDestroy", &a.pref_destroy, &a) ||
        !resolve(lib, "cublasLtMatmulPreferenceSetAttribute", &a.pref_set_attribute, &a) ||
        !resolve(lib, "cublasLtMatrixLayoutCreate", &a.layout_create, &a) ||
        !resolve(lib, "cublasLtMatrixLayoutDestroy", &a.layout_destroy, &a) ||
        !resolve(lib, "cublasLtMatrixLayoutSetAttribute", &a.layout_set_attribute, &a) ||
        !resolve(lib, "cublasLtMatmulAlgoConfigGetAttribute", &a.algo_config_get_attribute, &a))
        return a;
    a.version = a.get_version();
    if (a.version / 10000 != (size_t)CUBLAS_VER_MAJOR) {
        snprintf(a.why, sizeof a.why, "the libcublasLt found is version %zu; fp4rl was built against cuBLAS %d (%s)", a.version,
                 CUBLAS_VER_MAJOR, FP4RL_CUBLASLT_SONAME);
        return a;
    }
    a.ok = 1;
    return a;
}

} // namespace

/* C++ guarantees a thread-safe one-time initialisation of a function's static. */
const fp4rl_cublaslt *fp4rl_cublaslt_api(void)
{
    static const fp4rl_cublaslt api = load_cublaslt();
    return &api;
}
