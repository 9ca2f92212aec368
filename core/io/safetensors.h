/*
 * safetensors.h - reading and writing safetensors files (internal; not part of the ABI).
 *
 * The format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
 *   {"NAME": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value", ...}}
 * (padded with spaces), then the data section; offsets are relative to its start.
 *
 * The reader trusts nothing in the file. It accepts a file only when the header length fits the
 * file and a 100 MB cap, the header is valid UTF-8 JSON whose numbers are plain non-negative
 * integers, every entry has a known dtype, a shape and two data offsets of the right JSON types,
 * shape product * dtype size == end - begin (overflow-checked), no two names are equal, and the
 * tensors tile the data section exactly (no overlap, no gap, nothing after the last one), as the
 * format requires. Anything else is FP4RL_ERR_CORRUPT with a message naming the tensor and the
 * field; a file that cannot be read is FP4RL_ERR_IO. Errors follow the library's convention:
 * a status, and the thread's message through fp4rl_fail (core/runtime/internal.h).
 */
#ifndef FP4RL_SAFETENSORS_H
#define FP4RL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest header the reader accepts (the reference implementation's limit). */
#define FP4RL_ST_MAX_HEADER 100000000u
/* Longest tensor name, in bytes. */
#define FP4RL_ST_MAX_NAME 1024
/* Most dims of one tensor (a 0-dim tensor is a scalar with one element). */
#define FP4RL_ST_MAX_DIMS FP4RL_MAX_DIMS

/* The dtypes of the safetensors format (its own names: "F32", "BF16", ...). */
typedef enum fp4rl_st_dtype {
    FP4RL_ST_BOOL, FP4RL_ST_U8, FP4RL_ST_I8, FP4RL_ST_F8_E5M2, FP4RL_ST_F8_E4M3,
    FP4RL_ST_I16, FP4RL_ST_U16, FP4RL_ST_F16, FP4RL_ST_BF16,
    FP4RL_ST_I32, FP4RL_ST_U32, FP4RL_ST_F32,
    FP4RL_ST_F64, FP4RL_ST_I64, FP4RL_ST_U64
} fp4rl_st_dtype;
#define FP4RL_ST_DTYPE_COUNT 15

/* "F32", "BF16", ...; "?" outside the enum. */
FP4RL_HIDDEN const char *fp4rl_st_dtype_name(fp4rl_st_dtype dt);
/* Bytes of one element; 0 outside the enum. */
FP4RL_HIDDEN size_t fp4rl_st_dtype_size(fp4rl_st_dtype dt);

/* ---- reader -------------------------------------------------------------------------------- */

/* One tensor of an open file. Everything points into the file object and lives as long as it. */
typedef struct fp4rl_st_tensor {
    const char *name;               /* NUL-terminated, 1..FP4RL_ST_MAX_NAME bytes */
    fp4rl_st_dtype dtype;
    int ndim;                       /* 0..FP4RL_ST_MAX_DIMS */
    int64_t shape[FP4RL_ST_MAX_DIMS];
    int64_t numel;                  /* product of shape (1 for ndim 0) */
    const uint8_t *data;            /* nbytes bytes, little-endian, NOT aligned */
    size_t nbytes;
    uint64_t offset;                /* begin offset inside the data section */
} fp4rl_st_tensor;

typedef struct fp4rl_st fp4rl_st;   /* an open, fully validated file */

/* Maps the file at `path` (read-only, MAP_PRIVATE) and validates it; the tensors' data point into
 * the mapping. FP4RL_ERR_IO when it cannot be opened or mapped, or is not a regular file (a FIFO
 * is refused without blocking), FP4RL_ERR_OUT_OF_MEMORY, FP4RL_ERR_CORRUPT. */
FP4RL_HIDDEN fp4rl_status fp4rl_st_open_path(fp4rl_st **out, const char *path);
/* Validates the `len` bytes at `buf`, which are BORROWED: they must stay alive and unchanged until
 * fp4rl_st_close. No byte outside [buf, buf + len) is ever read. */
FP4RL_HIDDEN fp4rl_status fp4rl_st_open_mem(fp4rl_st **out, const void *buf, size_t len);
/* Accepts NULL. */
FP4RL_HIDDEN void fp4rl_st_close(fp4rl_st *f);

/* Tensors, sorted by name (strcmp order). fp4rl_st_at returns NULL for i >= count. */
FP4RL_HIDDEN size_t fp4rl_st_count(const fp4rl_st *f);
FP4RL_HIDDEN const fp4rl_st_tensor *fp4rl_st_at(const fp4rl_st *f, size_t i);
/* The tensor called `name`, or NULL (no message is set). */
FP4RL_HIDDEN const fp4rl_st_tensor *fp4rl_st_find(const fp4rl_st *f, const char *name);

/* The "__metadata__" pairs, sorted by key. fp4rl_st_metadata_at returns 0 (and leaves the outputs
 * alone) for i >= count, else 1. fp4rl_st_metadata returns the value of `key`, or NULL. */
FP4RL_HIDDEN size_t fp4rl_st_metadata_count(const fp4rl_st *f);
FP4RL_HIDDEN int fp4rl_st_metadata_at(const fp4rl_st *f, size_t i, const char **key, const char **value);
FP4RL_HIDDEN const char *fp4rl_st_metadata(const fp4rl_st *f, const char *key);

/* Copies tensor `name` into `dst` as binary32, converting from F32, BF16 or F16 exactly. The file's
 * tensor must have exactly `ndim` dims equal to `shape` (dst holds their product of floats).
 * A missing tensor or another shape: FP4RL_ERR_CORRUPT, with a message like
 * "model.layers.0.self_attn.q_proj.weight: expected [64, 64], file has [64, 32]"; another dtype:
 * FP4RL_ERR_DTYPE; NULL or bad arguments: FP4RL_ERR_INVALID_ARGUMENT. dst is untouched on error. */
/* The checks of fp4rl_st_read_f32 (the tensor exists, has that shape and a convertible dtype),
 * without copying anything: a multi-file load validates every tensor before it changes a weight. */
FP4RL_HIDDEN fp4rl_status fp4rl_st_check_f32(const fp4rl_st *f, const char *name, int ndim, const int64_t *shape);
FP4RL_HIDDEN fp4rl_status fp4rl_st_read_f32(const fp4rl_st *f, const char *name, int ndim, const int64_t *shape,
                                            float *dst);

/* ---- writer -------------------------------------------------------------------------------- */

/* One tensor to write. `data` is host memory in native byte order: numel floats (F32), uint16_t
 * bfloat16 bit patterns (BF16) or int32_t (I32). With `store_bf16` set, F32 data is rounded to
 * BF16 (to nearest even) and stored as BF16. */
typedef struct fp4rl_st_write_entry {
    const char *name;
    fp4rl_dtype dtype;              /* FP4RL_DTYPE_F32, FP4RL_DTYPE_BF16 or FP4RL_DTYPE_I32 */
    int ndim;                       /* 0..FP4RL_ST_MAX_DIMS; dims >= 0 */
    const int64_t *shape;
    const void *data;               /* may be NULL only when the tensor has no elements */
    int store_bf16;                 /* F32 only */
} fp4rl_st_write_entry;

typedef struct fp4rl_st_kv {
    const char *key, *value;        /* UTF-8, NUL-terminated */
} fp4rl_st_kv;

/* Writes the tensors and metadata to `path` atomically: into a new temporary file in the same
 * directory, flushed and fsync'd, renamed over `path`, then the directory fsync'd. On failure the
 * temporary file is removed and a previous file at `path` is left as it was: FP4RL_ERR_IO with the
 * system's reason. Bad entries (NULL, empty, duplicate or over-long names, "__metadata__" as a
 * name, other dtypes, negative dims, oversized tensors, invalid UTF-8): FP4RL_ERR_INVALID_ARGUMENT
 * before anything touches the disk.
 * The header's keys are sorted; it is padded with spaces to a multiple of 8 bytes, and the data
 * is ordered by element size (largest first, then by name), so that every tensor begins at a
 * multiple of its element size from the start of the file. */
FP4RL_HIDDEN fp4rl_status fp4rl_st_write_path(const char *path, const fp4rl_st_write_entry *entries, size_t n_entries,
                                              const fp4rl_st_kv *meta, size_t n_meta);
/* The same file as bytes in a new malloc'd buffer (*out, *out_len; the caller frees it). */
FP4RL_HIDDEN fp4rl_status fp4rl_st_write_mem(void **out, size_t *out_len, const fp4rl_st_write_entry *entries,
                                             size_t n_entries, const fp4rl_st_kv *meta, size_t n_meta);

/* ---- small file helpers shared with core/model/hf_config.c --------------------------------------- */

/* Opens `path` read-only, refusing anything but a regular file without blocking (a FIFO, a device,
 * a directory: FP4RL_ERR_IO naming the path). *fd is the open descriptor, *size the file's bytes. */
FP4RL_HIDDEN fp4rl_status fp4rl_open_regular(const char *path, int *fd, size_t *size, const char *fn);
/* Reads a whole regular file into a new malloc'd buffer with a NUL byte after its `*len` bytes.
 * FP4RL_ERR_IO (cannot open / read, not a regular file), FP4RL_ERR_CORRUPT (more than max_bytes),
 * FP4RL_ERR_OUT_OF_MEMORY. Messages begin with `fn`. */
FP4RL_HIDDEN fp4rl_status fp4rl_read_file(const char *path, size_t max_bytes, uint8_t **out, size_t *len,
                                          const char *fn);
/* Whether the n bytes at s are valid UTF-8 (no overlong forms, no surrogates, <= U+10FFFF). When
 * not and bad_at is not NULL, *bad_at is the offset of the first bad byte. */
FP4RL_HIDDEN int fp4rl_utf8_valid(const uint8_t *s, size_t n, size_t *bad_at);

#ifdef __cplusplus
}
#endif
#endif
