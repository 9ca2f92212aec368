/*
 * wgmma_common.cuh - the Hopper warpgroup-MMA primitives the FP8 GEMMs share (gemm_fp8.cu's
 * shared-memory kernel, decode_fp8.cu's register-A decode kernel): the shared-memory matrix
 * descriptor, the wgmma fence / commit / wait, and the register fence that keeps reads of a
 * wgmma's results behind its wait. Defined only in the sm_90a pass (__CUDA_ARCH_FEAT_SM90_ALL):
 * the kernels that use them have empty bodies elsewhere. Also the mbarrier / bulk-copy helpers
 * (sm_90+ passes), below.
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

/* The mbarrier and 1D bulk-copy (cp.async.bulk) primitives of the producer / consumer rings
 * (gemm_fp8.cu's wgmma kernel, decode_fp8.cu's persistent decode kernel): plain sm_90 PTX, so
 * defined in every pass for sm_90 and later, not only the sm_90a one. Barrier and destination
 * operands are 32-bit shared-window addresses. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace fp4rl_cuda_bulk {

__device__ __forceinline__ void wg_mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void wg_mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void wg_mbar_arrive_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/* One try: whether the phase of parity `parity` has completed. */
__device__ __forceinline__ bool wg_mbar_try(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done != 0;
}
/* Waits for the phase of parity `parity` to complete (the consumers' wait: a plain loop, any more
 * code here made ptxas spill the HiF4 consumers). */
__device__ __forceinline__ void wg_mbar_wait(uint32_t bar, uint32_t parity)
{
    while (!wg_mbar_try(bar, parity)) {
    }
}
/* The producer's wait: past 2^31 cycles (~1 s) it traps, so a pipeline bug (a lost arrival, a
 * byte count that never lands, consumers stuck on a full barrier) fails the launch instead of
 * hanging the process: the producer ends by waiting for the consumers to release every stage. */
__device__ __forceinline__ void wg_mbar_wait_or_trap(uint32_t bar, uint32_t parity)
{
    const uint32_t t0 = (uint32_t)clock();
    while (!wg_mbar_try(bar, parity))
        if ((uint32_t)clock() - t0 > (1u << 31)) __trap();
}
/* 1D bulk copy global -> shared (16-byte aligned, a multiple of 16 bytes), completing on bar. */
__device__ __forceinline__ void wg_bulk(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src), "r"(bytes),
                 "r"(bar)
                 : "memory");
}

} // namespace fp4rl_cuda_bulk
#endif /* __CUDA_ARCH__ >= 900 */

#endif /* FP4RL_WGMMA_COMMON_CUH */
