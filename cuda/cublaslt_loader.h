/*
 * cublaslt_loader.h - cuBLASLt, loaded at run time (cuda/cublaslt_loader.cu).
 *
 * libfp4rl is compiled against cublasLt.h (its types and enums) but not linked to libcublasLt:
 * the library is opened with dlopen on first use, so a build with the CUDA backend still loads on
 * a machine without cuBLAS (or without CUDA at all). Every cuBLASLt call of the backend goes
 * through this table; calling a cublasLt* function directly would bring the link dependency back
 * (and fails to link, since libfp4rl is linked with --no-undefined and without -lcublasLt).
 */
#ifndef FP4RL_CUBLASLT_LOADER_H
#define FP4RL_CUBLASLT_LOADER_H

#include <cublasLt.h>

/* The cuBLASLt entry points fp4rl uses, with the header's own signatures. */
struct fp4rl_cublaslt {
    int ok;         /* every entry point below resolved, and the library's major version is the header's */
    char why[768];  /* when !ok: why cuBLASLt is not usable (names the library and dlerror) */
    size_t version; /* cublasLtGetVersion() of the loaded library */
    decltype(&::cublasLtGetVersion) get_version;
    decltype(&::cublasLtCreate) create;
    decltype(&::cublasLtDestroy) destroy;
    decltype(&::cublasLtMatmul) matmul;
    decltype(&::cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic;
    decltype(&::cublasLtMatmulDescCreate) desc_create;
    decltype(&::cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&::cublasLtMatmulDescSetAttribute) desc_set_attribute;
    decltype(&::cublasLtMatmulPreferenceCreate) pref_create;
    decltype(&::cublasLtMatmulPreferenceDestroy) pref_destroy;
    decltype(&::cublasLtMatmulPreferenceSetAttribute) pref_set_attribute;
    decltype(&::cublasLtMatrixLayoutCreate) layout_create;
    decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&::cublasLtMatrixLayoutSetAttribute) layout_set_attribute;
    decltype(&::cublasLtMatmulAlgoConfigGetAttribute) algo_config_get_attribute; /* the bench's algorithm sweep */
};

/* cuBLASLt, loaded once per process on the first call (thread-safe). Never NULL; check ->ok.
 * fp4rl_cuda_context_init refuses a context when !ok, so the backend's ops may use the table
 * without checking. */
const fp4rl_cublaslt *fp4rl_cublaslt_api(void);

#endif
