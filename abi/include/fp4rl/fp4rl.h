/*
 * fp4rl.h - the public C ABI of libfp4rl.
 *
 * Plain C99; also valid C++. Conventions (see docs in README.md):
 *  - Every handle is opaque. `fp4rl_x_create(fp4rl_x **out, ...)` makes one, `fp4rl_x_destroy`
 *    frees it and accepts NULL.
 *  - Every fallible function returns an fp4rl_status. On failure, fp4rl_last_error() returns a
 *    message for the calling thread that says what was wrong; outputs are left untouched.
 *    Nothing in the library prints, aborts or exits.
 *  - Sizes are int64_t (shapes) or size_t (bytes); booleans are int.
 *  - A context is used by one thread at a time. Separate contexts share no mutable state.
 */
#ifndef FP4RL_H
#define FP4RL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FP4RL_API
#elif defined(__GNUC__)
#define FP4RL_API __attribute__((visibility("default")))
#else
#define FP4RL_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */
#define FP4RL_VERSION_MAJOR 0
#define FP4RL_VERSION_MINOR 1
#define FP4RL_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, the same as fp4rl_version_number() of this header. */
#define FP4RL_VERSION_NUMBER (FP4RL_VERSION_MAJOR * 10000 + FP4RL_VERSION_MINOR * 100 + FP4RL_VERSION_PATCH)

/* The version of the library that is linked (compare with FP4RL_VERSION_NUMBER). */
FP4RL_API unsigned fp4rl_version_number(void);
/* "MAJOR.MINOR.PATCH" of the linked library. */
FP4RL_API const char *fp4rl_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status and errors
 * ------------------------------------------------------------------------------------------- */
typedef enum fp4rl_status {
    FP4RL_OK = 0,
    FP4RL_ERR_INVALID_ARGUMENT, /* a NULL pointer, an out-of-range value */
    FP4RL_ERR_SHAPE,            /* dims that do not fit together, or whose size overflows */
    FP4RL_ERR_DTYPE,            /* a dtype this function does not take */
    FP4RL_ERR_UNSUPPORTED,      /* valid, but not implemented for this case (the message says why) */
    FP4RL_ERR_OUT_OF_MEMORY,    /* an allocation failed; nothing leaked, outputs untouched */
    FP4RL_ERR_DEVICE,           /* no such device, or a device error (the context is then unusable) */
    FP4RL_ERR_IO,               /* a file could not be read or written */
    FP4RL_ERR_CORRUPT,          /* a file or buffer is malformed */
    FP4RL_ERR_CALLBACK,         /* a user callback failed */
    FP4RL_ERR_INTERNAL          /* a bug in fp4rl: please report it with the message */
} fp4rl_status;

/* "FP4RL_OK", "FP4RL_ERR_SHAPE", ...; "FP4RL_STATUS_UNKNOWN" for a value outside the enum. */
FP4RL_API const char *fp4rl_status_name(fp4rl_status s);
/* The calling thread's message for its last failed call ("" if none). Valid until this thread's
 * next failing call into fp4rl. */
FP4RL_API const char *fp4rl_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Handles
 * ------------------------------------------------------------------------------------------- */
typedef struct fp4rl_context fp4rl_context;
typedef struct fp4rl_tensor fp4rl_tensor;
typedef struct fp4rl_quant_policy fp4rl_quant_policy;

/* ---------------------------------------------------------------------------------------------
 * Context: a device, its memory and its random-number state
 * ------------------------------------------------------------------------------------------- */
typedef enum fp4rl_device { FP4RL_DEVICE_CPU = 0, FP4RL_DEVICE_CUDA = 1 } fp4rl_device;

/* Creates a context on `device`; `ordinal` picks the GPU (0 for the CPU). A CUDA context on a
 * machine without a usable GPU fails with FP4RL_ERR_DEVICE; in a build without CUDA it fails with
 * FP4RL_ERR_UNSUPPORTED. A new context has seed 0 and random offset 0. */
FP4RL_API fp4rl_status fp4rl_context_create(fp4rl_context **out, fp4rl_device device, int ordinal);
FP4RL_API void fp4rl_context_destroy(fp4rl_context *ctx);
/* Sets the seed of stochastic rounding and resets the random offset to 0. */
FP4RL_API fp4rl_status fp4rl_context_set_seed(fp4rl_context *ctx, uint64_t seed);
/* Reads the random state: the seed and the offset the next stochastic quantization will use.
 * Every stochastically rounded quantization uses the current offset and advances it by one, so a
 * run is replayable from (seed, offset). Either pointer may be NULL. */
FP4RL_API fp4rl_status fp4rl_context_get_rng(const fp4rl_context *ctx, uint64_t *seed, uint64_t *offset);
FP4RL_API fp4rl_status fp4rl_context_set_rng_offset(fp4rl_context *ctx, uint64_t offset);
/* The context's device, or -1 for a NULL context. */
FP4RL_API int fp4rl_context_device(const fp4rl_context *ctx);
/* Bytes of the context's device memory held by fp4rl (tensors, models, sessions and their
 * scratch): `in_use` now, `peak` the high-water mark of in_use since the context was created or
 * the last fp4rl_context_reset_peak_memory, `reserved` what the context holds from the device
 * (on CUDA in_use plus the blocks its caching allocator keeps for reuse; on the CPU equal to
 * in_use). Sizes are those of the allocations as made (the CUDA allocator's bucket sizes, the C
 * library's usable sizes). Any output pointer may be NULL. */
FP4RL_API fp4rl_status fp4rl_context_memory(const fp4rl_context *ctx, size_t *in_use, size_t *peak, size_t *reserved);
/* Sets the peak of fp4rl_context_memory to the bytes in use now. */
FP4RL_API fp4rl_status fp4rl_context_reset_peak_memory(fp4rl_context *ctx);

/* ---------------------------------------------------------------------------------------------
 * Data parallelism over several GPUs (NCCL)
 *
 * fp4rl does not start processes or connect them: the host framework (torch.distributed, MPI, a
 * launcher) gives every process its rank and the world size, and carries the bytes of one NCCL
 * unique id from rank 0 to every other rank. Each rank then makes a CUDA context that joins the
 * communicator, and every RL session of that context trains data-parallel (see the RL session).
 *
 * Every rank must make the same sequence of calls on its distributed context's sessions with the
 * same arguments: the collectives inside them wait for every rank. A failure on one rank inside a
 * step, a train or a checkpoint call is reported on every rank (FP4RL_ERR_*, "rank r failed ..."),
 * provided the failing rank keeps making the same calls; a rank that stops calling leaves the
 * others waiting, so the host framework's watchdog must end the job, as with torch.distributed.
 *
 * NCCL is loaded at run time (libnccl.so.2); without it, or in a build without NCCL or CUDA,
 * these functions return FP4RL_ERR_UNSUPPORTED with a message saying which. Creating a
 * communicator sets NCCL_NVLS_ENABLE=0 in the process environment (NVLink SHARP multicast off).
 * ------------------------------------------------------------------------------------------- */
#define FP4RL_NCCL_UNIQUE_ID_BYTES 128

/* Creates a new NCCL unique id on rank 0 (FP4RL_NCCL_UNIQUE_ID_BYTES bytes into `id_bytes`, which
 * holds n_bytes >= FP4RL_NCCL_UNIQUE_ID_BYTES; else FP4RL_ERR_INVALID_ARGUMENT). The id names a
 * listening socket of this process: make one per communicator, and pass its bytes unchanged to
 * every rank of it. Needs no GPU. */
FP4RL_API fp4rl_status fp4rl_nccl_unique_id(void *id_bytes, size_t n_bytes);
/* Creates a CUDA context on GPU `device_ordinal` that joins the communicator of `world_size`
 * ranks named by the unique id `id_bytes` (n_bytes >= FP4RL_NCCL_UNIQUE_ID_BYTES) as rank `rank`
 * (0 <= rank < world_size). Blocks until every rank has joined. world_size 1 is valid (a
 * communicator of one rank; its sessions then train exactly as in a plain CUDA context with FP32
 * gradient all-reduce). A bad rank, world size or id is FP4RL_ERR_INVALID_ARGUMENT; no usable GPU
 * FP4RL_ERR_DEVICE; a build or a machine without NCCL FP4RL_ERR_UNSUPPORTED; an NCCL failure
 * (an id from another job, a rank that never joins and times out) FP4RL_ERR_DEVICE with NCCL's
 * message. Destroy it with fp4rl_context_destroy on every rank. */
FP4RL_API fp4rl_status fp4rl_context_create_distributed(fp4rl_context **out, int device_ordinal, int rank, int world_size,
                                                        const void *id_bytes, size_t n_bytes);
/* The context's rank and world size: those given to fp4rl_context_create_distributed, or 0 and 1
 * for any other context. Either pointer may be NULL. */
FP4RL_API fp4rl_status fp4rl_context_get_rank(const fp4rl_context *ctx, int *rank, int *world_size);

/* ---------------------------------------------------------------------------------------------
 * Tensors
 * ------------------------------------------------------------------------------------------- */
typedef enum fp4rl_dtype {
    FP4RL_DTYPE_F32,         /* dense binary32 */
    FP4RL_DTYPE_BF16,        /* dense bfloat16, stored as uint16_t bit patterns */
    FP4RL_DTYPE_I32,         /* dense int32 */
    FP4RL_DTYPE_MXFP4,       /* E2M1 elements, E8M0 scale per 32 (1D) or per T x T tile (2D) */
    FP4RL_DTYPE_NVFP4,       /* E2M1 elements, UE4M3 scale per 16 (1D) or T x T, one f32 per tensor */
    FP4RL_DTYPE_HIF4,        /* HiFloat4: S1P2 elements, one 32-bit three-level scale word per 64 */
    FP4RL_DTYPE_MXFP8_E4M3   /* E4M3 elements, E8M0 scale per 32 (1D) or per T x T tile (2D) */
} fp4rl_dtype;

#define FP4RL_MAX_DIMS 8

/* Name of a dtype ("f32", "bf16", "i32", "mxfp4", "nvfp4", "hif4", "mxfp8_e4m3"); "unknown". */
FP4RL_API const char *fp4rl_dtype_name(fp4rl_dtype dtype);

/* Creates a dense tensor (F32, BF16 or I32) of `ndim` (1..FP4RL_MAX_DIMS) dims, each >= 1, on the
 * context's device, and copies `data` (row-major, prod(shape) elements) into it. */
FP4RL_API fp4rl_status fp4rl_tensor_from_host(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype,
                                              int ndim, const int64_t *shape, const void *data);
/* Creates a dense tensor with every element zero. */
FP4RL_API fp4rl_status fp4rl_tensor_zeros(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype,
                                          int ndim, const int64_t *shape);
/* Copies a dense tensor's elements to `dst`, which holds `dst_bytes` >= fp4rl_tensor_nbytes(t). */
FP4RL_API fp4rl_status fp4rl_tensor_to_host(const fp4rl_tensor *t, void *dst, size_t dst_bytes);
FP4RL_API void fp4rl_tensor_destroy(fp4rl_tensor *t);

/* Accessors. On a NULL tensor: dtype -1, ndim 0, dim 0, numel 0, nbytes 0. */
FP4RL_API fp4rl_dtype fp4rl_tensor_dtype(const fp4rl_tensor *t);
FP4RL_API int fp4rl_tensor_ndim(const fp4rl_tensor *t);
/* dims[i]; 0 when i is out of range. */
FP4RL_API int64_t fp4rl_tensor_dim(const fp4rl_tensor *t, int i);
FP4RL_API int64_t fp4rl_tensor_numel(const fp4rl_tensor *t);
/* Bytes of a dense tensor's elements; for a quantized tensor, its codes plus its scales. */
FP4RL_API size_t fp4rl_tensor_nbytes(const fp4rl_tensor *t);
/* The context a tensor lives in. */
FP4RL_API fp4rl_context *fp4rl_tensor_context(const fp4rl_tensor *t);

/* ---------------------------------------------------------------------------------------------
 * Quantized tensors: layout of codes and scales
 *
 * A quantized tensor of shape [d0, ..., dn-1] is viewed as a matrix [R, C] with C = dn-1 and
 * R = d0 * ... * dn-2 (R = 1 for a 1-dim tensor). Blocks run along C (1D, `tile` == 0) or are
 * T x T tiles of rows x columns (2D, `tile` == T).
 *
 * Codes: row-major, each row starting on a byte boundary.
 *   MXFP4, NVFP4, HiF4: ceil(C / 2) bytes per row; element 2k in the low nibble of byte k,
 *     element 2k+1 in the high nibble; an odd row pads its last high nibble with 0.
 *   MXFP8_E4M3: C bytes per row, one E4M3 code each.
 * Scales:
 *   MXFP4, MXFP8 (uint8 E8M0) and NVFP4 (uint8 UE4M3):
 *     1D: [R, ceil(C / B)] row-major with B = 32 (MX) or 16 (NVFP4); element (r, c) uses
 *         scales[r * ceil(C / B) + c / B].
 *     2D: [ceil(R / T), ceil(C / T)] row-major; element (r, c) uses scales[(r / T) * ceil(C / T) + c / T].
 *   HiF4 (uint32 little-endian scale words, bit layout in shared/spec/formats.md section 6):
 *     1D and 2D alike: [R, ceil(C / 64)] row-major words, element (r, c) uses word
 *     r * ceil(C / 64) + c / 64 and position c % 64 inside it. In 2D (T = 64) the words of the
 *     rows of one tile share the tile's E6M2 base and carry the increment bits of the 8x8 and
 *     4x4 sub-blocks their row crosses, so a 2D HiF4 tensor is also a valid 1D HiF4 tensor.
 *   NVFP4 also has one binary32 decode scale per tensor (`tensor_scale`; 1.0 for other formats).
 * The element and scale encodings are those of shared/spec/formats.md.
 * ------------------------------------------------------------------------------------------- */

/* The block layout of a quantized tensor: `tile` (0 = 1D), the byte sizes of its codes and its
 * scales, and NVFP4's per-tensor scale (1.0f otherwise). Any output pointer may be NULL. */
FP4RL_API fp4rl_status fp4rl_tensor_quant_info(const fp4rl_tensor *t, int *tile, size_t *codes_bytes,
                                               size_t *scales_bytes, float *tensor_scale);
/* Copy the packed codes / the scales of a quantized tensor to host memory. */
FP4RL_API fp4rl_status fp4rl_tensor_codes_to_host(const fp4rl_tensor *t, void *dst, size_t dst_bytes);
FP4RL_API fp4rl_status fp4rl_tensor_scales_to_host(const fp4rl_tensor *t, void *dst, size_t dst_bytes);
/* Creates a quantized tensor from codes and scales in the layout above (copied). `codes_bytes` and
 * `scales_bytes` must equal the sizes the layout gives. Padding nibbles must be 0, and
 * `tensor_scale` must be finite and > 0 for NVFP4 (1.0f for the others); otherwise
 * FP4RL_ERR_CORRUPT. */
FP4RL_API fp4rl_status fp4rl_tensor_import_quantized(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype,
                                                     int ndim, const int64_t *shape, int tile,
                                                     const void *codes, size_t codes_bytes,
                                                     const void *scales, size_t scales_bytes,
                                                     float tensor_scale);

/* ---------------------------------------------------------------------------------------------
 * Quantization policy: what is quantized how. Set through (parameter, value) pairs so that new
 * knobs never change a struct layout.
 * ------------------------------------------------------------------------------------------- */
typedef enum fp4rl_scale_rule {
    FP4RL_SCALE_OCP_FLOOR = 0,        /* e = floor(log2 amax) - emax_elem: the block max may saturate */
    FP4RL_SCALE_TRUNCATION_FREE = 1   /* smallest e with amax <= max_elem * 2^e: never saturates */
} fp4rl_scale_rule;

typedef enum fp4rl_rounding {
    FP4RL_ROUND_NEAREST = 0,          /* RNE (HiF4: half up on the magnitude, as the reference) */
    FP4RL_ROUND_STOCHASTIC = 1        /* Philox4x32-10 counter-based, reproducible on CPU and GPU */
} fp4rl_rounding;

/* The GEMM operands of a linear layer. Attention follows the numerics too: FP32 keeps it in FP32;
 * every other value gives it BF16 q, k, v (and dout, p, ds) with FP32 scores and sums, as the
 * tensor cores and PyTorch's BF16 SDPA compute it, in training and rollout alike. */
typedef enum fp4rl_numerics {
    FP4RL_NUMERICS_BF16 = 0,          /* no FP4: BF16-rounded GEMM operands */
    FP4RL_NUMERICS_FP4 = 1,           /* training: W, X and dY quantized per the policy (= W4A4) */
    FP4RL_NUMERICS_W4A16 = 2,         /* rollout: weights FP4, activations BF16 */
    FP4RL_NUMERICS_W16A4 = 3,         /* rollout: weights BF16, activations FP4 */
    FP4RL_NUMERICS_W4A4 = 4,          /* rollout: both FP4 */
    FP4RL_NUMERICS_FP32 = 5           /* no rounding at all: FP32 GEMM operands (reference checks) */
} fp4rl_numerics;

typedef enum fp4rl_resq {
    FP4RL_RESQ_OFF = 0, FP4RL_RESQ_DENSE = 1, FP4RL_RESQ_2_4 = 2,
    FP4RL_RESQ_CHANNEL_50 = 3, FP4RL_RESQ_BLOCK_50 = 4
} fp4rl_resq;

typedef enum fp4rl_role { FP4RL_ROLE_WEIGHT = 0, FP4RL_ROLE_ACTIVATION = 1, FP4RL_ROLE_GRADIENT = 2 } fp4rl_role;

typedef enum fp4rl_qparam {
    /* Tiles per role: 0 = 1D blocks along the last dim (the format's own block size);
     * T > 0 = 2D T x T tiles: 16, 32 or 64 for MXFP4, MXFP8 and NVFP4; 64 for HiF4. Default 0. */
    FP4RL_QP_TILE_WEIGHT = 0,
    FP4RL_QP_TILE_ACTIVATION = 1,
    FP4RL_QP_TILE_GRADIENT = 2,
    /* fp4rl_scale_rule for MXFP4 / MXFP8 (NVFP4 and HiF4 have their own rules). Default OCP floor. */
    FP4RL_QP_SCALE_RULE = 3,
    /* fp4rl_rounding per role. Default nearest. */
    FP4RL_QP_ROUNDING_WEIGHT = 4,
    FP4RL_QP_ROUNDING_ACTIVATION = 5,
    FP4RL_QP_ROUNDING_GRADIENT = 6,
    /* Seed of stochastic rounding: -1 (default) = the context's seed; 0 .. INT64_MAX overrides it. */
    FP4RL_QP_SEED = 7,
    /* Quantized formats (fp4rl_dtype, MXFP4 / NVFP4 / HiF4 / MXFP8_E4M3) of the model's linear layers
     * per role. Default MXFP4 for all three. */
    FP4RL_QP_FORMAT_WEIGHT = 8,
    FP4RL_QP_FORMAT_ACTIVATION = 9,
    FP4RL_QP_FORMAT_GRADIENT = 10,
    /* Format of q_proj and k_proj: -1 (default) = the same as the other linears; or a format. */
    FP4RL_QP_FORMAT_QK = 11,
    /* fp4rl_numerics of training (FP32, BF16 or FP4; default FP4) and of the rollout (FP32, BF16,
     * W4A16, W16A4, W4A4; default W4A4). */
    FP4RL_QP_TRAIN_NUMERICS = 12,
    FP4RL_QP_ROLLOUT_NUMERICS = 13,
    /* Rollout-ResQ pattern (fp4rl_resq), rollout only. Default off. */
    FP4RL_QP_RESQ = 14
} fp4rl_qparam;
#define FP4RL_QP_COUNT 15

typedef enum fp4rl_preset {
    FP4RL_PRESET_DEFAULT = 0,     /* the plain defaults of fp4rl_quant_policy_create */
    /* "Stable FP4 training": MXFP4, W and X in 32x32 tiles, truncation-free, dY 1D stochastic,
     * MXFP8 E4M3 for q_proj/k_proj, FP4 training, W4A4 rollout, no ResQ. */
    FP4RL_PRESET_STABLE_2D_MXFP4 = 1,
    /* "HiFloat4 end-to-end FP4 RL": HiF4 1D along K for every role, dY stochastic, FP4 training,
     * W4A4 rollout, Rollout-ResQ 2:4. */
    FP4RL_PRESET_HIF4_RL = 2
} fp4rl_preset;

/* A new policy with the plain defaults (1D, OCP floor, nearest, MXFP4, FP4 training, W4A4 rollout). */
FP4RL_API fp4rl_status fp4rl_quant_policy_create(fp4rl_quant_policy **out);
/* Sets one parameter. An unknown parameter or an out-of-range value is FP4RL_ERR_INVALID_ARGUMENT
 * with a message naming the parameter and the allowed values; the policy is then unchanged.
 * A policy is valid as a whole after every call: a value that would leave a tile its role's
 * format cannot take (HiF4 takes 1D blocks or 64 x 64 tiles only), or a FORMAT_QK that cannot
 * take one of the three tiles, is refused the same way, whichever member of the pair is being
 * set; the message names both parameters and the one to change first. Nothing else is changed
 * behind the caller's back. Order matters only between such pairs: MXFP4 in 32 x 32 tiles to
 * HiF4 in 64 x 64 tiles takes the tile first, HiF4 in 1D blocks to MXFP4 in 32 x 32 tiles the
 * format first. Tiles 0 and 64 fit every format, so setting the formats while the tiles are 0 (as
 * after fp4rl_quant_policy_create), then the tiles, reaches every valid policy. */
FP4RL_API fp4rl_status fp4rl_quant_policy_set(fp4rl_quant_policy *p, fp4rl_qparam param, int64_t value);
FP4RL_API fp4rl_status fp4rl_quant_policy_get(const fp4rl_quant_policy *p, fp4rl_qparam param, int64_t *value);
/* Resets every parameter to a named recipe. */
FP4RL_API fp4rl_status fp4rl_quant_policy_apply_preset(fp4rl_quant_policy *p, fp4rl_preset preset);
FP4RL_API void fp4rl_quant_policy_destroy(fp4rl_quant_policy *p);
/* Name of a parameter ("tile_weight", ...) or NULL for an unknown one. */
FP4RL_API const char *fp4rl_qparam_name(fp4rl_qparam param);

/* ---------------------------------------------------------------------------------------------
 * Quantize, dequantize, transpose, matmul
 * ------------------------------------------------------------------------------------------- */

/* Quantizes a dense F32 or BF16 tensor to `format` (MXFP4, NVFP4, HiF4 or MXFP8_E4M3) with the
 * tile and rounding the policy gives `role` (the policy's seed if it sets one; the scale rule
 * for MX formats). `policy` may be NULL for the plain defaults. Any shape; nothing needs to be a
 * multiple of a block. A NaN or Inf makes its whole block NaN (not an error). A stochastically
 * rounded call advances the context's random offset by one. Random numbers are indexed by the
 * element's row-major index, so with stochastic rounding Q(W)^T and Q(W^T) differ; with nearest
 * rounding and 2D tiles they are bit-identical. */
FP4RL_API fp4rl_status fp4rl_quantize(fp4rl_tensor **out, fp4rl_context *ctx, const fp4rl_tensor *src,
                                      fp4rl_dtype format, const fp4rl_quant_policy *policy, fp4rl_role role);
/* Dequantizes to a dense F32 or BF16 tensor of the same shape. F32 is exact (value(code) x scale).
 * BF16 is the round-to-nearest-even of the F32 result: exact for MXFP4 and HiF4 inside BF16's range,
 * not in general for NVFP4 (whose per-tensor f32 scale g is arbitrary) or MXFP8. */
FP4RL_API fp4rl_status fp4rl_dequantize(fp4rl_tensor **out, fp4rl_context *ctx, const fp4rl_tensor *q, fp4rl_dtype dtype);
/* Transposes a 2-dim tensor. Dense: a plain transpose. 2D-tiled quantized: a reshuffle of codes
 * and scales, bit-identical to quantizing the transposed source with nearest rounding. 1D-quantized:
 * FP4RL_ERR_UNSUPPORTED (its blocks run along rows; the transpose needs blocks along columns,
 * i.e. a re-quantization from the high-precision source). */
FP4RL_API fp4rl_status fp4rl_tensor_transpose(fp4rl_tensor **out, fp4rl_context *ctx, const fp4rl_tensor *t);
/* C[M,N] = A[M,K] * B[N,K]^T. C is a dense F32 or BF16 [M,N] tensor made by the caller and
 * overwritten. A and B are 2-dim, dense (F32/BF16) or quantized (blocks along K: 1D, or 2D tiles).
 * Quantized operands are dequantized exactly and multiplied with FP32 accumulation; NVFP4's
 * per-tensor scales are applied as the GEMM's alpha. All tensors in `ctx`. */
FP4RL_API fp4rl_status fp4rl_matmul(fp4rl_tensor *c, fp4rl_context *ctx, const fp4rl_tensor *a, const fp4rl_tensor *b);

/* Quantization error of `q` against its dense source `src` (same shape):
 *   rel_mse        = sum (x - x')^2 / sum x^2 over finite blocks (0 when sum x^2 == 0)
 *   underflow_frac = fraction of the non-zero finite inputs that became zero
 *   saturated_frac = fraction of finite blocks (1D blocks, 2D tiles; HiF4: 64-element units) in
 *                    which some element was clipped, i.e. |x| exceeds the largest magnitude its
 *                    block and position can represent
 *   nan_block_frac = fraction of blocks that are NaN because of a non-finite input
 * Any output pointer may be NULL. */
FP4RL_API fp4rl_status fp4rl_quant_error(const fp4rl_tensor *src, const fp4rl_tensor *q, double *rel_mse,
                                         double *underflow_frac, double *saturated_frac, double *nan_block_frac);

/* ---------------------------------------------------------------------------------------------
 * The policy model: a Qwen2-architecture decoder (HF Qwen2ForCausalLM), FP32 master weights,
 * forward and backward in the numerics of its quantization policy (FP4RL_QP_TRAIN_NUMERICS):
 * every linear layer inside the transformer blocks runs its three GEMMs (forward, input gradient,
 * weight gradient) on operands quantized per the policy; embeddings, the LM head, norms, softmax
 * and attention stay FP32 (BF16-rounded GEMM operands in the BF16 and FP4 modes).
 *
 * Batches are `batch` sequences of `seq_len` token ids, row-major [batch, seq_len], right-padded:
 * sequence b holds lengths[b] tokens (1 <= lengths[b] <= seq_len; lengths NULL = all seq_len).
 * Position t of a sequence predicts its token t + 1.
 * ------------------------------------------------------------------------------------------- */
typedef struct fp4rl_model fp4rl_model;

/* Creates a model from the text of an HF config.json of the Qwen2 architecture (vocab_size,
 * hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
 * rope_theta (or rope_parameters.rope_theta), rms_norm_eps, max_position_embeddings,
 * tie_word_embeddings), with weights initialised randomly from `seed` as HF does (normal(0, 0.02)
 * for linears and embeddings, zero biases, unit norms). The policy is copied (NULL = defaults).
 * A malformed config is FP4RL_ERR_CORRUPT naming the field; another architecture is
 * FP4RL_ERR_UNSUPPORTED. */
FP4RL_API fp4rl_status fp4rl_model_create(fp4rl_model **out, fp4rl_context *ctx, const char *config_json,
                                          const fp4rl_quant_policy *policy, uint64_t seed);
FP4RL_API void fp4rl_model_destroy(fp4rl_model *m);
/* Loads every weight, with HF tensor names (F32, BF16 or F16), from `path`: one safetensors file,
 * a model.safetensors.index.json (the shards are in its folder), or a directory holding
 * model.safetensors or that index. Files are mapped, not read whole; anything but a regular file
 * (a FIFO, a device) is refused without blocking. A missing or mis-shaped tensor, a malformed
 * file, or an index that disagrees with its shards is FP4RL_ERR_CORRUPT naming the file and the
 * tensor; an unreadable path FP4RL_ERR_IO. Every tensor of every file is checked before any weight
 * changes: on failure the model's weights are unchanged. The optimizer state is reset. */
FP4RL_API fp4rl_status fp4rl_model_load(fp4rl_model *m, const char *safetensors_path);
/* Saves the weights with HF names as F32 or BF16 (`dtype`), atomically (a temporary file, fsync,
 * rename): a failure never destroys an existing file. */
FP4RL_API fp4rl_status fp4rl_model_save(const fp4rl_model *m, const char *safetensors_path, fp4rl_dtype dtype);
/* A model as transformers and the hub write it: `dir`/config.json (fp4rl_model_create's rules),
 * the weights of `dir` (fp4rl_model_load: model.safetensors or the index and its shards) and, when
 * present, `dir`/generation_config.json. The eos ids ("eos_token_id", an int or a list; from
 * generation_config.json first, else config.json) become the default stop tokens of every session
 * created on the model. The policy is copied (NULL = defaults). */
FP4RL_API fp4rl_status fp4rl_model_from_pretrained(fp4rl_model **out, fp4rl_context *ctx, const char *dir,
                                                   const fp4rl_quant_policy *policy);
/* Writes `dir` as transformers' save_pretrained does: config.json (the architecture fields fp4rl
 * uses, in the spelling transformers reads), generation_config.json with the eos ids when known,
 * and the weights with HF names in F32 or BF16 (`dtype`): model.safetensors, or, when they are
 * larger than max_shard_bytes (0 = never shard), model-0000i-of-0000n.safetensors shards and
 * model.safetensors.index.json. Atomic as a whole: the directory is written under a temporary
 * name and renamed into place, so it appears complete or not at all. `dir` must be absent, an
 * empty directory or a directory an earlier save_pretrained wrote (marker file
 * .fp4rl-pretrained); anything else is refused (FP4RL_ERR_INVALID_ARGUMENT naming it) and left
 * untouched. */
FP4RL_API fp4rl_status fp4rl_model_save_pretrained(const fp4rl_model *m, const char *dir, fp4rl_dtype dtype,
                                                   size_t max_shard_bytes);
/* Replaces the model's policy with a copy of `policy`. */
FP4RL_API fp4rl_status fp4rl_model_set_policy(fp4rl_model *m, const fp4rl_quant_policy *policy);

/* Optimizer and training hyper-parameters, with their defaults. */
typedef enum fp4rl_mparam {
    FP4RL_MP_LR = 0,             /* AdamW learning rate, (0, 1]; default 1e-4 */
    FP4RL_MP_WEIGHT_DECAY = 1,   /* decoupled weight decay, [0, 1]; default 0 */
    FP4RL_MP_BETA1 = 2,          /* [0, 1); default 0.9 */
    FP4RL_MP_BETA2 = 3,          /* [0, 1); default 0.999 */
    FP4RL_MP_ADAM_EPS = 4,       /* (0, 1]; default 1e-8 */
    FP4RL_MP_GRAD_CLIP = 5,      /* clip the global gradient norm to this; 0 = off (default) */
    FP4RL_MP_MICROBATCH_TOKENS = 6 /* tokens (batch rows x seq_len) per micro-batch of
                                      fp4rl_model_compute_gradients / _train_step / _logits /
                                      _token_logprobs: the batch runs in micro-batches of whole
                                      sequences (at least one) whose gradients accumulate; the loss
                                      is normalised over the whole batch, so results equal one pass
                                      up to the order of FP32 sums (and the draws of stochastic
                                      rounding). 0 = automatic (default): sized from the free memory
                                      of the context's device and the model; an integer in 0 .. 2^40 */,
    FP4RL_MP_RECOMPUTE = 7       /* activation recomputation per transformer block in the passes with
                                    a backward: 1 = the forward keeps only each block's input and
                                    the backward re-runs the block's forward before its backward
                                    (same results, bit for bit; one more forward of the blocks;
                                    activation memory of one block instead of all); 0 (default) =
                                    keep every block's activations, unless automatic micro-batches
                                    (FP4RL_MP_MICROBATCH_TOKENS or the session's 0) cannot fit one
                                    sequence that way, then recompute */,
    FP4RL_MP_OPTIMIZER_MOMENTS = 8 /* storage of the AdamW moments m and v: 0 = FP32 (default; 8 bytes
                                      per parameter), 1 = BF16 with stochastic rounding (4 bytes per
                                      parameter; for models whose FP32 state does not fit, e.g.
                                      Qwen2.5-7B on one 141 GB GPU). With BF16 each update computes
                                      in FP32 as with FP32 moments (the weight's step reads this
                                      step's FP32 m and v) and then rounds m and v to BF16
                                      stochastically, unbiased (nearest rounding would stall v under
                                      beta2 = 0.999), from counter-based uniforms of the AdamW step
                                      and the element: deterministic, the same bits on the CPU and
                                      CUDA and on every rank. Setting it on a model converts the
                                      moments it holds (FP32 to BF16 to nearest even, BF16 to FP32
                                      exactly; the step count is kept); the new buffers are made
                                      before the old ones are freed, so a failure changes nothing and
                                      both are held for the moment. A model holds no moments until
                                      its first update (they are zero until then, and again after
                                      an RL session's fresh start), so setting this before training
                                      converts nothing and costs no time. RL checkpoints store the moments in their
                                      dtype; a load restores the setting with the other model
                                      parameters (a checkpoint written before this parameter holds
                                      FP32 moments, which are converted to the model's setting) */
} fp4rl_mparam;
#define FP4RL_MP_COUNT 9
FP4RL_API fp4rl_status fp4rl_model_set_hparam(fp4rl_model *m, fp4rl_mparam param, double value);
FP4RL_API fp4rl_status fp4rl_model_get_hparam(const fp4rl_model *m, fp4rl_mparam param, double *value);

/* Sizes of the model. FP4RL_MI_NUM_PARAMETERS counts floats; FP4RL_MI_NUM_TENSORS counts the
 * parameter tensors that fp4rl_model_param_name lists. */
typedef enum fp4rl_model_info {
    FP4RL_MI_VOCAB_SIZE = 0, FP4RL_MI_HIDDEN_SIZE = 1, FP4RL_MI_INTERMEDIATE_SIZE = 2, FP4RL_MI_NUM_LAYERS = 3,
    FP4RL_MI_NUM_HEADS = 4, FP4RL_MI_NUM_KV_HEADS = 5, FP4RL_MI_HEAD_DIM = 6, FP4RL_MI_MAX_POSITIONS = 7,
    FP4RL_MI_TIED_EMBEDDINGS = 8, FP4RL_MI_NUM_PARAMETERS = 9, FP4RL_MI_STEP = 10, FP4RL_MI_NUM_TENSORS = 11
} fp4rl_model_info;
FP4RL_API fp4rl_status fp4rl_model_get_info(const fp4rl_model *m, fp4rl_model_info key, int64_t *value);
/* The HF name of parameter tensor i (0 <= i < FP4RL_MI_NUM_TENSORS, in checkpoint order: the
 * embedding, each layer's tensors, the final norm, the LM head when untied), for
 * fp4rl_model_param_shape / _get_param / _set_param. NULL for a NULL model or i out of range; the
 * string lives as long as the model. */
FP4RL_API const char *fp4rl_model_param_name(const fp4rl_model *m, size_t i);

/* Logits of every position: logits [batch, seq_len, vocab] (F32; 0 past a sequence's length). */
FP4RL_API fp4rl_status fp4rl_model_logits(fp4rl_model *m, const int32_t *tokens, const int32_t *lengths, int64_t batch,
                                          int64_t seq_len, float *logits, size_t logits_bytes);
/* Token log-probs: logprobs [batch, seq_len] with logprobs[b, t] = log p(tokens[b, t] | tokens[b, <t])
 * for 1 <= t < lengths[b], and 0 at t = 0 and past the length. */
FP4RL_API fp4rl_status fp4rl_model_token_logprobs(fp4rl_model *m, const int32_t *tokens, const int32_t *lengths,
                                                  int64_t batch, int64_t seq_len, float *logprobs, size_t logprobs_bytes);
/* Forward and backward of the next-token loss: mean over the counted targets of -log p(target),
 * where target (b, t), 1 <= t < lengths[b], counts with weight loss_mask[b, t] ([batch, seq_len],
 * NULL = 1). Leaves the gradients in the model (fp4rl_model_get_grad) without updating. */
FP4RL_API fp4rl_status fp4rl_model_compute_gradients(fp4rl_model *m, const int32_t *tokens, const int32_t *lengths,
                                                     const float *loss_mask, int64_t batch, int64_t seq_len,
                                                     double *loss);
/* One supervised step: fp4rl_model_compute_gradients, global-norm clipping (FP4RL_MP_GRAD_CLIP),
 * AdamW. Outputs the loss and the gradient norm before clipping (either may be NULL). A non-finite
 * loss or gradient norm, or an update that would leave a weight or an AdamW moment non-finite
 * (checked by a dry run first), returns FP4RL_ERR_INVALID_ARGUMENT and changes no weight or
 * optimizer state. */
FP4RL_API fp4rl_status fp4rl_model_train_step(fp4rl_model *m, const int32_t *tokens, const int32_t *lengths,
                                              const float *loss_mask, int64_t batch, int64_t seq_len, double *loss,
                                              double *grad_norm);
/* Shape of the parameter with HF name `name` (ndim 1 or 2; dims holds 2). */
FP4RL_API fp4rl_status fp4rl_model_param_shape(const fp4rl_model *m, const char *name, int *ndim, int64_t *dims);
/* Copy a parameter, or its gradient from the last backward, to host F32 memory; or set a parameter.
 * The gradient buffer is made by the first backward (a model holds none after creation) and kept
 * by the model's own calls; an RL session step releases it after its updates (so a rollout never
 * holds it), and then, as before any backward, fp4rl_model_get_grad reads zeros. */
FP4RL_API fp4rl_status fp4rl_model_get_param(const fp4rl_model *m, const char *name, float *dst, size_t dst_bytes);
FP4RL_API fp4rl_status fp4rl_model_get_grad(const fp4rl_model *m, const char *name, float *dst, size_t dst_bytes);
FP4RL_API fp4rl_status fp4rl_model_set_param(fp4rl_model *m, const char *name, const float *src, size_t src_bytes);

/* ---------------------------------------------------------------------------------------------
 * The RL session: one complete end-to-end FP4 RL step (shared/spec/recipes.md section 3):
 * sync the rollout weights, sample G completions per prompt in the rollout numerics (FP4
 * weights/activations, Rollout-ResQ), reward them, GRPO advantages, the trainer's log-probs,
 * the TIS-weighted clipped loss, backward in the training numerics, AdamW.
 *
 * Prompts are passed in CSR form: prompt p is prompts[prompt_offsets[p] .. prompt_offsets[p+1]),
 * prompt_offsets has n_prompts + 1 entries, starting at 0. A prompt holds >= 1 token; its length
 * plus FP4RL_RL_MAX_NEW_TOKENS must fit the model's max_position_embeddings.
 *
 * Data parallelism: in a context made by fp4rl_context_create_distributed with W ranks, every rank
 * passes the SAME global prompt list (n_prompts >= W) to fp4rl_rl_session_step / _rollout. Rank r
 * takes prompts [n_prompts * r / W, n_prompts * (r + 1) / W) and samples for them the completions
 * one process would sample for the whole list with the same seed (sampling is counter-based on the
 * global completion index). Rewards and GRPO advantages are computed on the rank that holds the
 * prompt (a group never straddles ranks); the loss is normalised by the global token or completion
 * count; the gradients are summed over the ranks (in FP32, or BF16 with FP4RL_RL_ALLREDUCE_BF16)
 * before the clip and AdamW, so every rank applies the same update and the weights stay
 * bit-identical on all ranks. Optimizer step b of an epoch uses every rank's local minibatch b
 * (FP4RL_RL_MINIBATCHES is capped by the smallest rank's completion count). Against one process
 * on the same batch the results agree up to the order of floating-point sums (and of GEMMs run on
 * fewer rows). The metrics are those of the global batch, the same on every rank (time/...: the
 * slowest rank's; quant/act_zero_frac: the completion-weighted mean of the ranks').
 * ------------------------------------------------------------------------------------------- */
typedef struct fp4rl_rl_session fp4rl_rl_session;

/* The reward of one completion. Return 0 and set *reward (finite) on success; a non-zero return
 * or a NaN reward stops the step with FP4RL_ERR_CALLBACK and leaves the model and the optimizer
 * exactly as before the step. `prompt_index` is the prompt's index in the step's batch (the global
 * list in a distributed context; each rank calls back only for its own prompts). The
 * callback runs on the calling thread between the rollout and the update, when no library call is
 * in progress: it may use fp4rl itself (another model, another session, even this context), but
 * must not step, train or destroy the session (or its model) that is calling it. */
typedef int (*fp4rl_reward_fn)(void *user, size_t prompt_index, const int32_t *prompt, size_t prompt_len,
                               const int32_t *completion, size_t completion_len, double *reward);

/* Hyper-parameters, (enum, value) with bounds; defaults in brackets. */
typedef enum fp4rl_rlparam {
    FP4RL_RL_GROUP_SIZE = 0,      /* completions per prompt, 2..1024 [8] */
    FP4RL_RL_MAX_NEW_TOKENS = 1,  /* 1..65536 [64] */
    FP4RL_RL_TEMPERATURE = 2,     /* [0.01, 100] [1.0] (below 0.01 the logits overflow); the trainer divides its logits by it too */
    FP4RL_RL_TOP_K = 3,           /* 0 = off, else 1..vocab [0]; alone (top_p = 1) the log-probs are those of
                                     the full softmax, not renormalised to the top k */
    FP4RL_RL_LR = 4,              /* AdamW learning rate, (0, 1] [1e-6] */
    FP4RL_RL_WEIGHT_DECAY = 5,    /* decoupled, [0, 1] [0] (lr * decay <= 1) */
    FP4RL_RL_CLIP_LOW = 6,        /* eps_low, [0, 1) [0.2] */
    FP4RL_RL_CLIP_HIGH = 7,       /* eps_high, >= 0 [0.2] */
    FP4RL_RL_TIS_CAP = 8,         /* C of truncated importance sampling, 0 = TIS off, else >= 1 [5] */
    FP4RL_RL_KL_COEF = 9,         /* beta of the k3 KL to the weights at the first step, [0, 100] [0] */
    FP4RL_RL_LOSS_AGG = 10,       /* 0 = mean over a completion's tokens, then over completions [0];
                                     1 = mean over all tokens */
    FP4RL_RL_ADV_NORM = 11,       /* 1 = divide by the group's std (GRPO) [1]; 0 = Dr. GRPO */
    FP4RL_RL_MINIBATCHES = 12,    /* optimizer steps per epoch, 1..n_prompts*G [1] */
    FP4RL_RL_EPOCHS = 13,         /* passes over the rollout, 1..100 [1]. With one update per step
                                     (1 epoch, 1 minibatch) log pi_old is the training pass's own
                                     log-probs, as in TRL (the same weights; no forward of its own),
                                     unless the policy rounds weights or activations stochastically */
    FP4RL_RL_GRAD_CLIP = 14,      /* global-norm clip, 0 = off [1.0] */
    FP4RL_RL_SEED = 15,           /* seed of sampling, 0 .. 2^53 [0] */
    FP4RL_RL_ALLREDUCE_BF16 = 16, /* distributed contexts: 0 = all-reduce the gradients in FP32 [0];
                                     1 = in BF16 (half the bytes; each rank's gradient and the sums
                                     rounded to BF16). No effect in a single-process context */
    FP4RL_RL_MICROBATCH_TOKENS = 17 /* tokens per micro-batch of the trainer's passes (log pi_old,
                                       the KL reference, each minibatch's loss and backward), as
                                       FP4RL_MP_MICROBATCH_TOKENS: whole completions, gradients
                                       accumulated, the minibatch's loss normalisation; 0 = automatic
                                       from the free device memory [0]; an integer in 0 .. 2^40 */,
    /* The learning-rate schedule, per optimizer update u = 0, 1, ... of the session (the count of
     * earlier updates; one per minibatch and epoch), as transformers' get_*_schedule_with_warmup
     * (which TRL uses): lr(u) = FP4RL_RL_LR * f(u) with f(u) = u / W while u < W (the first update
     * of a warm-up has lr 0, as in transformers), then 1 (constant), or max(0, (N - u) / (N - W))
     * (linear), or max(0, (1 + cos(pi (u - W) / (N - W))) / 2) (cosine), W the warm-up and N the
     * total updates. The metric "lr" is the last update's. */
    FP4RL_RL_WARMUP_STEPS = 18,   /* W, an integer in 0 .. 2^31 [0] */
    FP4RL_RL_LR_SCHEDULE = 19,    /* 0 = constant [0], 1 = linear decay, 2 = cosine decay */
    FP4RL_RL_TOTAL_STEPS = 20,    /* N for linear / cosine, an integer in 0 .. 2^31, N > W when used [0] */
    /* Top-p (nucleus) sampling, (0, 1] [1 = off]. With top_p < 1 the rollout samples from the
     * nucleus: of softmax(logits / temperature), restricted to the top-k when FP4RL_RL_TOP_K is
     * set, the smallest set of tokens whose probability adds up to >= top_p, taken in order of
     * probability (ties: lower token id first), renormalised. The sampled token is still a
     * deterministic function of the seed, the step and the completion's global index (batch
     * composition never changes it). Its rollout log-prob (log mu) is under that truncated,
     * renormalised distribution, and so is every log-prob the trainer's loss uses (log pi_theta,
     * log pi_old, the KL reference's): the trainer computes the nucleus of its own distribution by
     * the same rule (temperature, top-k, top-p) and takes log(p_t / sum_{i in S} p_i) with
     * S = its nucleus plus the sampled token t (a token the rollout sampled can fall just outside
     * the trainer's nucleus when the two numerics differ: it is kept, renormalised over S, never
     * dropped or given -inf), the gradient with S held fixed; otherwise the importance ratio and
     * the TIS weight would compare a truncated with a full distribution and be biased. The metric
     * "entropy" stays that of the full distribution. With top_p = 1 sampling and every log-prob
     * are as without it (top-k alone is not renormalised: see FP4RL_RL_TOP_K). */
    FP4RL_RL_TOP_P = 21
} fp4rl_rlparam;
#define FP4RL_RL_PARAM_COUNT 22

/* Creates a session that trains `model` (borrowed: it must outlive the session and belong to
 * `ctx`) with `policy` (copied; it becomes the model's policy; NULL keeps the model's). The
 * session's first update starts from a fresh AdamW state (zero moments, step 0), so optimizer
 * state left by supervised training does not carry into RL. */
FP4RL_API fp4rl_status fp4rl_rl_session_create(fp4rl_rl_session **out, fp4rl_context *ctx, fp4rl_model *model,
                                               const fp4rl_quant_policy *policy);
FP4RL_API void fp4rl_rl_session_destroy(fp4rl_rl_session *s);
FP4RL_API fp4rl_status fp4rl_rl_session_set(fp4rl_rl_session *s, fp4rl_rlparam param, double value);
FP4RL_API fp4rl_status fp4rl_rl_session_get(const fp4rl_rl_session *s, fp4rl_rlparam param, double *value);
/* The stop token ids (copied; n may be 0). A completion ends with, and includes, the first. */
FP4RL_API fp4rl_status fp4rl_rl_session_set_stop_tokens(fp4rl_rl_session *s, const int32_t *ids, size_t n);
/* The stop token ids: the model's eos ids for a model from fp4rl_model_from_pretrained, until
 * set_stop_tokens replaces them (none otherwise). *n = how many there are; min(*n, cap) are
 * copied to ids (ids may be NULL with cap 0 to ask the count). */
FP4RL_API fp4rl_status fp4rl_rl_session_get_stop_tokens(const fp4rl_rl_session *s, int32_t *ids, size_t cap, size_t *n);

/* One complete step. On any error the model and optimizer are as before the step, with one
 * exception: with several updates per step (FP4RL_RL_MINIBATCHES or FP4RL_RL_EPOCHS > 1), an
 * update refused after earlier ones of the same step (a non-finite loss or gradient norm, or an
 * AdamW update that would leave a weight or moment non-finite) stops the step there and the earlier
 * updates stay applied; the error says which minibatch and how many. */
FP4RL_API fp4rl_status fp4rl_rl_session_step(fp4rl_rl_session *s, const int32_t *prompts, const size_t *prompt_offsets,
                                             size_t n_prompts, fp4rl_reward_fn reward_fn, void *user);

/* The split form, for trainers that compute rewards themselves: rollout, read the completions,
 * set one reward per completion, train. Completion i belongs to prompt i / G. In a distributed
 * context these address this rank's completions only: num_completions counts them, completion i
 * is the rank's i-th (its prompt_index is an index into the global prompt list: the rank's first
 * prompt plus i / G), and set_rewards takes one reward per local completion. Every rank then calls
 * fp4rl_rl_session_train. */
FP4RL_API fp4rl_status fp4rl_rl_session_rollout(fp4rl_rl_session *s, const int32_t *prompts,
                                                const size_t *prompt_offsets, size_t n_prompts);
FP4RL_API fp4rl_status fp4rl_rl_session_num_completions(const fp4rl_rl_session *s, size_t *n);
/* Copies completion i: its length (always), and when the buffers are not NULL its tokens and their
 * rollout log-probs (cap elements each; FP4RL_ERR_SHAPE when cap < length), and its prompt index. */
FP4RL_API fp4rl_status fp4rl_rl_session_completion(const fp4rl_rl_session *s, size_t i, int32_t *tokens, float *logprobs,
                                                   size_t cap, size_t *length, size_t *prompt_index);
FP4RL_API fp4rl_status fp4rl_rl_session_set_rewards(fp4rl_rl_session *s, const double *rewards, size_t n);
FP4RL_API fp4rl_status fp4rl_rl_session_train(fp4rl_rl_session *s);

/* Metrics of the last step, by name (recipes.md section 3: "reward/mean", "pg/loss", "tis/mean",
 * "mismatch/logp_abs_diff_mean", "quant/act_zero_frac", "perf/rollout_tokens_per_s", ...).
 * An unknown name is FP4RL_ERR_INVALID_ARGUMENT. */
FP4RL_API fp4rl_status fp4rl_rl_session_metric(const fp4rl_rl_session *s, const char *name, double *value);
/* The name of metric i (0 .. count-1), or NULL. */
FP4RL_API const char *fp4rl_rl_session_metric_name(size_t i);
/* The last step's metrics as one JSON object ({"step": N, "reward/mean": ..., ...}) into buf
 * (NUL-terminated); *needed gets the size it needs. FP4RL_ERR_SHAPE when buf_size is too small. */
FP4RL_API fp4rl_status fp4rl_rl_session_metrics_json(const fp4rl_rl_session *s, char *buf, size_t buf_size, size_t *needed);
/* Appends each step's metrics JSON as a line to this file (NULL stops). Every rank of a distributed
 * context that sets a file writes to it: set one on rank 0 only, or one per rank. A failing append
 * (the file became a directory, the disk is full) never fails the step, whose update is applied:
 * the step returns FP4RL_OK, its metric "io/metrics_write_error" is 1 (else 0) and
 * fp4rl_last_error() says what failed. */
FP4RL_API fp4rl_status fp4rl_rl_session_set_metrics_file(fp4rl_rl_session *s, const char *jsonl_path);
/* The number of completed steps. */
FP4RL_API fp4rl_status fp4rl_rl_session_step_count(const fp4rl_rl_session *s, int64_t *steps);

/* Saves the full state (master weights, optimizer moments, step, random state, policy,
 * hyper-parameters, stop tokens, config) to directory `dir`, atomically: it is written as a new
 * directory and renamed into place, so a crash never destroys the previous checkpoint. `dir` must
 * be absent, an empty directory or a previous checkpoint (holding the marker file
 * ".fp4rl-checkpoint", or written before it existed: a state.json of "format":
 * "fp4rl-rl-checkpoint"); a regular file, a symbolic link, any other directory or a special file
 * is refused with FP4RL_ERR_INVALID_ARGUMENT naming the path and left untouched. The leftovers of
 * a killed save are removed by the next save or load of `dir` when provably its own. In a
 * distributed context only rank 0 writes; every rank must call it (with the same dir), and every
 * rank returns rank 0's status. */
FP4RL_API fp4rl_status fp4rl_rl_session_save(const fp4rl_rl_session *s, const char *dir);
/* Restores a checkpoint saved by fp4rl_rl_session_save into this session and its model (same
 * model config). Resuming continues bit-identically on the CPU. On error nothing changes. In a
 * distributed context every rank reads the checkpoint (the directory must be visible to all), and
 * when it fails on one rank it fails, with nothing changed, on every rank. Checkpoints saved
 * before FP4RL_RL_ALLREDUCE_BF16 existed load with the session's current value of it. */
FP4RL_API fp4rl_status fp4rl_rl_session_load(fp4rl_rl_session *s, const char *dir);

/* ---------------------------------------------------------------------------------------------
 * Zero-copy tensors and streams (for frameworks: DLPack, PyTorch, CuPy, JAX)
 * ------------------------------------------------------------------------------------------- */
/* Wraps the caller's dense memory as an fp4rl tensor without copying: `data` holds prod(shape)
 * elements of `dtype` (F32, BF16 or I32) in the memory of the context's device (host memory for a
 * CPU context; device memory of the context's GPU, or managed memory, for a CUDA context, which is
 * checked). `strides` are in elements, one per dim; NULL means row-major contiguous. Only
 * contiguous layouts are taken (the stride of a dim of size 1 does not matter); any other strides
 * are FP4RL_ERR_INVALID_ARGUMENT (copy the array to a contiguous one first). `data` must be
 * aligned to the element size on the CPU and to 256 bytes on a GPU (the alignment of fp4rl's own
 * device allocations, which its kernels and cuBLASLt plans assume; a fresh PyTorch or CuPy
 * allocation is, a slice at an offset may not be): else FP4RL_ERR_INVALID_ARGUMENT.
 * The memory stays the caller's: fp4rl reads and writes it in place and never frees it. When the
 * tensor is destroyed fp4rl waits for the context's queued work, then calls release(release_ctx)
 * (release may be NULL), exactly once. On failure no tensor is made and release is not called.
 * The caller keeps the memory valid until then, and orders its own use of it against the
 * context's stream (fp4rl_context_set_stream). */
typedef void (*fp4rl_release_fn)(void *release_ctx); /* = void (*release)(void *) */
FP4RL_API fp4rl_status fp4rl_tensor_wrap(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype, int ndim,
                                         const int64_t *shape, const int64_t *strides, void *data,
                                         fp4rl_release_fn release, void *release_ctx);
/* The address of a dense tensor's elements (row-major, contiguous) in the memory of its context's
 * device: for handing it to other frameworks. Valid until the tensor is destroyed. NULL for a
 * NULL or quantized tensor, with fp4rl_last_error() saying why. */
FP4RL_API void *fp4rl_tensor_data(const fp4rl_tensor *t);
/* Orders all later work of a CUDA context on `cuda_stream` (a cudaStream_t of the context's GPU,
 * e.g. PyTorch's current stream), after all of the context's earlier work (the switch is an event
 * on the old stream that the new one waits for; nothing blocks the host). NULL goes back to the
 * context's own stream; to use CUDA's legacy default stream pass cudaStreamLegacy ((void *)1).
 * The stream must stay valid while it is set: set NULL (or destroy the context, which waits for
 * the stream) before destroying it. A stream of another GPU is FP4RL_ERR_INVALID_ARGUMENT.
 * A CPU context takes NULL (nothing to do); any other value is FP4RL_ERR_UNSUPPORTED. */
FP4RL_API fp4rl_status fp4rl_context_set_stream(fp4rl_context *ctx, void *cuda_stream);
/* A dense F32 view (no copy) of the master weight `name` (HF names, as fp4rl_model_param_name) on
 * the model's device: its elements are the weights themselves, so writing through it changes the
 * model, and the optimizer's updates show in it. Destroy it with fp4rl_tensor_destroy. The view
 * keeps the weights' memory alive: destroying the model first is safe, and the memory is freed
 * with the last view; the view must not outlive the model's context. Unknown names are
 * FP4RL_ERR_INVALID_ARGUMENT. */
FP4RL_API fp4rl_status fp4rl_model_param_tensor(fp4rl_model *m, const char *name, fp4rl_tensor **out);

/* ---------------------------------------------------------------------------------------------
 * One linear layer in a policy's training numerics (for existing stacks, e.g. fp4rl.torch.Linear)
 * ------------------------------------------------------------------------------------------- */
/* A layer handle: y = x w^T (+ b) computed exactly as an fp4rl model's block linear computes it in
 * the training numerics of `policy` (FP4RL_QP_TRAIN_NUMERICS; the policy is copied): W, X and dY
 * quantized per the policy (formats, tiles, scale rules, rounding) for all three GEMMs, 2D tiles
 * shared by forward and backward, stochastic rounding from the context's counter-based stream
 * (seed: FP4RL_QP_SEED, else the context's). is_qk = 1: a q or k projection
 * (FP4RL_QP_FORMAT_QK applies). Not thread-safe per handle; one handle per layer. */
typedef struct fp4rl_linear fp4rl_linear;
FP4RL_API fp4rl_status fp4rl_linear_create(fp4rl_linear **out, fp4rl_context *ctx, const fp4rl_quant_policy *policy,
                                           int is_qk);
FP4RL_API void fp4rl_linear_destroy(fp4rl_linear *l);
/* y [N, OUT] = x [N, IN] w [OUT, IN]^T + b [OUT] (b may be NULL): dense F32 tensors of the
 * layer's context (fp4rl_tensor_wrap for the caller's memory), y distinct from the inputs. The
 * layer keeps what its backward needs (the quantized operands) until the next forward or destroy,
 * and reads x and w again in the backward: they must stay alive and unchanged until then. */
FP4RL_API fp4rl_status fp4rl_linear_forward(fp4rl_linear *l, fp4rl_tensor *y, const fp4rl_tensor *x, const fp4rl_tensor *w,
                                            const fp4rl_tensor *b);
/* The backward of the last forward for dy [N, OUT]: dx [N, IN], dw [OUT, IN], db [OUT] ACCUMULATE
 * (+=; zero them first for plain gradients), each optional (NULL: not computed), at least one
 * given. FP4RL_ERR_INVALID_ARGUMENT before any forward or for shapes other than the forward's. */
FP4RL_API fp4rl_status fp4rl_linear_backward(fp4rl_linear *l, fp4rl_tensor *dx, fp4rl_tensor *dw, fp4rl_tensor *db,
                                             const fp4rl_tensor *dy);

#ifdef __cplusplus
}
#endif
#endif /* FP4RL_H */
