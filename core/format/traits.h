/*
 * traits.h - what each quantized format is, written once (shared/spec/formats.md sections 2-6):
 * its name, 1D block, code width, scale kind and size, the element grid's emax and max, the 2D
 * tiles it takes, and whether its dequantized values are exactly BF16. Everything else asks
 * here: the CPU backend, the CUDA kernels, the rollout's fused path, the policy's checks, the
 * GEMM paths' choice of BF16 operands. ggml's type_traits[] idea; the bit-level element and scale
 * math stays in formats.h, and where codes and scales sit in memory in layout.h.
 *
 * A format is named by its fp4rl_dtype everywhere (the fused round trip's FP4RL_QDQ_* and the
 * CUDA kernels' template ids are the same numbers). fp4rl_format_of compiles for the host and,
 * as constexpr, for CUDA devices and templates (FP4RL_HD, FP4RL_HD_CONST).
 */
#ifndef FP4RL_FORMAT_TRAITS_H
#define FP4RL_FORMAT_TRAITS_H

#include <stdint.h>

#include "fp4rl/fp4rl.h"

#ifdef __CUDACC__
#define FP4RL_HD __host__ __device__ __forceinline__
#define FP4RL_HD_CONST __host__ __device__ constexpr inline /* usable in template arguments */
#else
#define FP4RL_HD static inline
#define FP4RL_HD_CONST static inline
#endif

/* ---- element grids and scale formats (spec section 2) --------------------------------------- */
#define FP4RL_E2M1_MAX 6.0f      /* E2M1: largest magnitude, 1.5 * 2^2 */
#define FP4RL_E2M1_EMAX 2        /* floor(log2(6)) */
#define FP4RL_E4M3_MAX 448.0f    /* E4M3 "fn" and UE4M3: 1.75 * 2^8 */
#define FP4RL_E4M3_EMAX 8
#define FP4RL_HIF4_ELEM_MAX 1.75f /* HiF4 S1P2: 7/4 */
#define FP4RL_E8M0_BIAS 127      /* E8M0 (MX scale): 2^(s - 127) */
#define FP4RL_E6M2_BIAS 48       /* E6M2 (HiF4 base): (1 + m/4) 2^(e - 48) */
#define FP4RL_E6M2_MAX 49152.0f  /* code 0xFE: 1.5 * 2^15 */

typedef enum fp4rl_scale_kind {
    FP4RL_SCALE_KIND_NONE = 0,  /* a dense dtype */
    FP4RL_SCALE_KIND_E8M0,      /* one power-of-two byte per block or tile (MX) */
    FP4RL_SCALE_KIND_UE4M3,     /* one UE4M3 byte per block or tile, and a binary32 per tensor (NVFP4) */
    FP4RL_SCALE_KIND_HIF4_WORD  /* one 32-bit three-level word per 64 elements of a row (layout.h) */
} fp4rl_scale_kind;

/* The 2D tiles a format may take, as bits of fp4rl_format_traits.tiles (1D, tile 0, always). */
#define FP4RL_TILE_BIT(t) ((t) == 16 ? 1u : (t) == 32 ? 2u : (t) == 64 ? 4u : 0u)
#define FP4RL_TILES_ANY (FP4RL_TILE_BIT(16) | FP4RL_TILE_BIT(32) | FP4RL_TILE_BIT(64))

typedef struct fp4rl_format_traits {
    const char *name;         /* fp4rl_dtype_name's spelling */
    int block;                /* elements per scale of a 1D block along the last dim; 0: dense */
    int code_bits;            /* 4: two codes a byte, low nibble first; 8: one byte */
    fp4rl_scale_kind scale_kind;
    int scale_bytes;          /* bytes of one stored scale */
    int emax_elem;            /* floor(log2(max_elem)): the MX scale rule's emax_elem */
    float max_elem;           /* largest element magnitude (before the scales) */
    unsigned max_code;        /* the code of max_elem (sign bit clear) */
    unsigned tiles;           /* FP4RL_TILE_BIT of each 2D tile edge it takes */
    int tensor_scale;         /* carries one binary32 scale per tensor (NVFP4's g, the GEMM's alpha) */
    int bf16_exact_unscaled;  /* value(code) * block scale is always a BF16 value */
    int bf16_exact;           /* every dequantized value, tensor scale included, is a BF16 value */
} fp4rl_format_traits;

/* The table. BF16 exactness: E2M1 values have 2 significant bits and HiF4's 3, E8M0 scales and
 * HiF4's increments are powers of two and the E6M2 base has 3 bits, so their products fit BF16's 8
 * (its exponent range is binary32's); NVFP4's value(code) * UE4M3 has at most 6, but times g it
 * is any binary32; E4M3 subnormals times small E8M0 scales fall below BF16's subnormals.
 * tests/test_format_traits.c checks every entry against the format functions by brute force. */
#define FP4RL_FORMAT_TABLE(X)                                                                                     \
    /* dtype                   name          block bits scale kind                   bytes emax         max                 code  tiles            g  bf16 (unscaled) bf16 */ \
    X(FP4RL_DTYPE_MXFP4,      "mxfp4",      32,   4,   FP4RL_SCALE_KIND_E8M0,      1,    FP4RL_E2M1_EMAX, FP4RL_E2M1_MAX,     0x7,  FP4RL_TILES_ANY,  0, 1, 1) \
    X(FP4RL_DTYPE_NVFP4,      "nvfp4",      16,   4,   FP4RL_SCALE_KIND_UE4M3,     1,    FP4RL_E2M1_EMAX, FP4RL_E2M1_MAX,     0x7,  FP4RL_TILES_ANY,  1, 1, 0) \
    X(FP4RL_DTYPE_HIF4,       "hif4",       64,   4,   FP4RL_SCALE_KIND_HIF4_WORD, 4,    0,               FP4RL_HIF4_ELEM_MAX, 0x7, FP4RL_TILE_BIT(64), 0, 1, 1) \
    X(FP4RL_DTYPE_MXFP8_E4M3, "mxfp8_e4m3", 32,   8,   FP4RL_SCALE_KIND_E8M0,      1,    FP4RL_E4M3_EMAX, FP4RL_E4M3_MAX,     0x7E, FP4RL_TILES_ANY,  0, 0, 0)

/* The traits of dtype d; a dense or unknown dtype gives block 0 and scale kind NONE. */
FP4RL_HD_CONST fp4rl_format_traits fp4rl_format_of(fp4rl_dtype d)
{
#define FP4RL_FORMAT_CASE(id, ...)                      \
    if (d == id) {                                      \
        const fp4rl_format_traits t = {__VA_ARGS__};    \
        return t;                                       \
    }
    FP4RL_FORMAT_TABLE(FP4RL_FORMAT_CASE)
#undef FP4RL_FORMAT_CASE
    const fp4rl_format_traits dense = {"dense", 0, 0, FP4RL_SCALE_KIND_NONE, 0, 0, 0.0f, 0u, 0u, 0, 0, 0};
    return dense;
}

/* The quantized formats in table order, for messages that list the valid ones, so a row added to
 * the table shows up there too: string literals made at compile time, each item after ", "
 * (", mxfp4, nvfp4, ..." by name; ", FP4RL_DTYPE_MXFP4, ..." by enum constant), so a message can
 * append them to its own literal. fp4rl_format_list_str is the names without the leading ", ". */
#define FP4RL_FORMAT_NAME_ITEM(id, name, ...) ", " name
#define FP4RL_FORMAT_ID_ITEM(id, ...) ", " #id
#define FP4RL_FORMAT_NAMES_SEP FP4RL_FORMAT_TABLE(FP4RL_FORMAT_NAME_ITEM)
#define FP4RL_FORMAT_IDS_SEP FP4RL_FORMAT_TABLE(FP4RL_FORMAT_ID_ITEM)
static inline const char *fp4rl_format_list_str(void) { return &FP4RL_FORMAT_NAMES_SEP[2]; }

/* The magnitude bits of a code (all but the sign, the top bit). */
FP4RL_HD_CONST unsigned fp4rl_format_mag_mask(fp4rl_format_traits t) { return t.code_bits ? (1u << (t.code_bits - 1)) - 1u : 0u; }

/* Whether d is a quantized format (has a row in the table). */
FP4RL_HD_CONST int fp4rl_format_is_quantized(fp4rl_dtype d) { return fp4rl_format_of(d).block != 0; }

/* Whether quantized format d takes tile edge `tile`: 0 (1D blocks) always, else a 2D tile of the
 * table. */
FP4RL_HD_CONST int fp4rl_format_tile_ok(fp4rl_dtype d, int64_t tile)
{
    return fp4rl_format_is_quantized(d) && (tile == 0 || (FP4RL_TILE_BIT(tile) & fp4rl_format_of(d).tiles) != 0);
}

#endif /* FP4RL_FORMAT_TRAITS_H */
