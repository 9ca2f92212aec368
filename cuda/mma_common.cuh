/*
 * mma_common.cuh - the asynchronous-copy and tensor-core primitives the decode GEMMs share
 * (decode_gemm.cu on fp4rl's own layout, decode_packed.cu on the packed one): cp.async into
 * shared memory with zero fill, its group commit / wait, and the BF16 MMA m16n8k16 with FP32
 * accumulation.
 */
#ifndef FP4RL_MMA_COMMON_CUH
#define FP4RL_MMA_COMMON_CUH

#include <stdint.h>

namespace fp4rl_cuda_mma {

/* Copies `bytes` (4, 8 or 16) from global src to shared dst; live == false writes zeros instead
 * (src must still be a valid address). 16-byte copies bypass L1 (.cg), smaller ones cannot. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool live)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(live ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool live)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(live ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* cp.async to a shared address (the CTA window's 32-bit offset); live false: zero-fill, the
 * source is not read. */
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void *src, bool live)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(live ? 16 : 0));
}
__device__ __forceinline__ void cp_async4_s(uint32_t dst, const void *src, bool live)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(live ? 4 : 0));
}

/* PTX prmt in its default mode (__byte_perm documents only the 3-bit selectors): selector bit 3
 * replicates the chosen byte's sign (bit 7) into the whole byte. */
__device__ __forceinline__ uint32_t prmt_b32(uint32_t a, uint32_t b, uint32_t sel)
{
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
/* d += A (16 x 16, row-major fragment a0..a3) * B (16 x 8, column fragment b0, b1), BF16 in, FP32 out. */
__device__ __forceinline__ void mma_bf16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

} // namespace fp4rl_cuda_mma

#endif
