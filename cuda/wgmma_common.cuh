/*
 * wgmma_common.cuh - the Hopper warpgroup-MMA primitives the FP8 GEMMs share (gemm_fp8.cu's
 * shared-memory kernel, decode_fp8.cu's register-A decode kernel): the shared-memory matrix
 * descriptor, the wgmma fence / commit / wait, and the register fence that keeps reads of a
 * wgmma's results behind its wait. Defined only in the sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL):
 * the kernels that use them have empty bodies elsewhere.
 */
#ifndef FP4RL_WGMMA_COMMON_CUH
#define FP4RL_WGMMA_COMMON_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace fp4rl_cuda_wg {

/* Shared-memory matrix descriptor (PTX ISA, "matrix descriptor" of wgmma): start address,
 * leading and stride byte offsets (all in 16-byte units, 14 bits each), base offset 0, layout
 * type in bits 62-63 (0: no swizzle, 1: 128-byte swizzle). */
__device__ __forceinline__ uint64_t wg_desc_bits(uint32_t addr, uint32_t lbo, uint32_t sbo, uint32_t layout)
{
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) | ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32) |
           ((uint64_t)layout << 62);
}

/* Makes this thread's generic-proxy writes of shared memory (st.shared, cp.async) visible to the
 * async proxy that wgmma reads its descriptor operands through; then a barrier, then the wgmma. */
__device__ __forceinline__ void wg_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
/* After a wait: the compiler may not read these registers (a wgmma's results, or keep an operand
 * of one alive) across it. */
template <int N>
__device__ __forceinline__ void wg_fence_regs(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void wg_fence_regs(uint32_t (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(d[i])::"memory");
}

} // namespace fp4rl_cuda_wg
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

#endif /* FP4RL_WGMMA_COMMON_CUH */
