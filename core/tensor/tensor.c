/* tensor.c - dense and quantized tensors: creation, layout, host copies, import and export. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/layout.h"
#include "format/traits.h"
#include "runtime/internal.h"

bool fp4rl_mul_ok(size_t a, size_t b, size_t *r)
{
    if (a && b > SIZE_MAX / a) return false;
    *r = a * b;
    return true;
}

bool fp4rl_dtype_is_quantized(fp4rl_dtype t) { return fp4rl_format_is_quantized(t); }
bool fp4rl_dtype_is_dense(fp4rl_dtype t) { return t == FP4RL_DTYPE_F32 || t == FP4RL_DTYPE_BF16 || t == FP4RL_DTYPE_I32; }
size_t fp4rl_dtype_size(fp4rl_dtype t) { return t == FP4RL_DTYPE_BF16 ? 2 : 4; }

const char *fp4rl_dtype_name(fp4rl_dtype t)
{
    if (fp4rl_format_is_quantized(t)) return fp4rl_format_of(t).name; /* spelled once, in format/traits.h */
    switch (t) {
    case FP4RL_DTYPE_F32: return "f32";
    case FP4RL_DTYPE_BF16: return "bf16";
    case FP4RL_DTYPE_I32: return "i32";
    default: break;
    }
    return "unknown";
}

const char *fp4rl_format_tiles_str(fp4rl_dtype f, const char *first, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%s", first);
    const char *sep = first[0] ? ", " : "";
    for (int t = 16; t <= 64; t *= 2)
        if (fp4rl_format_tile_ok(f, t) && k >= 0 && (size_t)k < n) {
            k += snprintf(buf + k, n - (size_t)k, "%s%d", sep, t);
            sep = ", ";
        }
    return buf;
}

bool fp4rl_qdesc_make(fp4rl_qdesc *d, fp4rl_dtype dtype, int64_t rows, int64_t cols, int tile)
{
    const fp4rl_format_traits t = fp4rl_format_of(dtype);
    memset(d, 0, sizeof *d);
    if (!t.block) return false; /* not a quantized format: no layout */
    d->dtype = dtype;
    d->rows = rows;
    d->cols = cols;
    d->tile = tile;
    d->block = t.block;
    d->row_bytes = fp4rl_code_row_bytes(t.code_bits, cols);
    fp4rl_scale_dims(t, tile, rows, cols, &d->scale_rows, &d->scale_cols);
    d->scale_elem_bytes = t.scale_bytes;
    size_t a, b;
    return fp4rl_mul_ok((size_t)rows, (size_t)d->row_bytes, &a) &&
           fp4rl_mul_ok((size_t)d->scale_rows, (size_t)d->scale_cols, &b) && fp4rl_mul_ok(b, 4, &b);
}
size_t fp4rl_qdesc_codes_bytes(const fp4rl_qdesc *d) { return (size_t)d->rows * (size_t)d->row_bytes; }
size_t fp4rl_qdesc_scales_bytes(const fp4rl_qdesc *d)
{
    return (size_t)d->scale_rows * (size_t)d->scale_cols * (size_t)d->scale_elem_bytes;
}

void fp4rl_rows_cols(int ndim, const int64_t *dims, int64_t *rows, int64_t *cols)
{
    int64_t r = 1;
    for (int i = 0; i + 1 < ndim; i++) r *= dims[i];
    *rows = r;
    *cols = dims[ndim - 1];
}

fp4rl_status fp4rl_check_tensor(const fp4rl_tensor *t, const char *fn, const char *what)
{
    if (!t) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    if (t->layout) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: %s is a weight re-laid out for the rollout's decode GEMM", fn, what);
    return fp4rl_check_ctx(t->ctx, fn);
}

/* Validates a shape and computes numel; the byte size of every dtype must fit a size_t. */
fp4rl_status fp4rl_check_shape(int ndim, const int64_t *shape, int64_t *numel, const char *fn)
{
    if (ndim < 1 || ndim > FP4RL_MAX_DIMS)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: ndim is %d; it must be 1 to %d", fn, ndim, FP4RL_MAX_DIMS);
    if (!shape) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: shape is NULL", fn);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1)
            return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: dim %d is %lld; every dim must be >= 1", fn, i, (long long)shape[i]);
        if (n > (INT64_MAX / 8) / shape[i]) /* keep numel * 8 bytes within int64 and size_t */
            return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: the shape's element count overflows (dim %d = %lld)", fn, i, (long long)shape[i]);
        n *= shape[i];
    }
    if ((uint64_t)n * 8u > (uint64_t)SIZE_MAX)
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: the tensor is too large for this platform", fn);
    *numel = n;
    return FP4RL_OK;
}

fp4rl_status fp4rl_tensor_alloc(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype, int ndim, const int64_t *dims,
                                const fp4rl_qdesc *q, const char *fn)
{
    int64_t numel;
    fp4rl_status st = fp4rl_check_shape(ndim, dims, &numel, fn);
    if (st) return st;
    fp4rl_tensor *t = calloc(1, sizeof *t);
    if (!t) return fp4rl_fail(FP4RL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    t->ctx = ctx;
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->dims, dims, (size_t)ndim * sizeof(int64_t));
    t->numel = numel;
    t->tensor_scale = 1.0f;
    if (q) {
        t->q = *q;
        t->data_bytes = fp4rl_qdesc_codes_bytes(q);
        t->scales_bytes = fp4rl_qdesc_scales_bytes(q);
    } else {
        t->data_bytes = (size_t)numel * fp4rl_dtype_size(dtype);
    }
    st = ctx->be->alloc(ctx, &t->data, t->data_bytes);
    if (!st && q) st = ctx->be->alloc(ctx, &t->scales, t->scales_bytes);
    if (st) {
        fp4rl_tensor_destroy(t);
        return st;
    }
    *out = t;
    return FP4RL_OK;
}

void fp4rl_tensor_destroy(fp4rl_tensor *t)
{
    if (!t) return;
    if (t->storage != FP4RL_STORAGE_OWNED) { /* the caller's memory, or a view: core/tensor/tensor_wrap.c */
        fp4rl_tensor_unwrap(t);
        free(t);
        return;
    }
    if (t->data) t->ctx->be->free(t->ctx, t->data);
    if (t->scales) t->ctx->be->free(t->ctx, t->scales);
    free(t);
}

static fp4rl_status new_dense(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype, int ndim, const int64_t *shape,
                              const void *data, int zero, const char *fn)
{
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (st) return st;
    if (!fp4rl_dtype_is_dense(dtype)) {
        if (fp4rl_dtype_is_quantized(dtype))
            return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: %s is a quantized dtype; make it with fp4rl_quantize or fp4rl_tensor_import_quantized", fn, fp4rl_dtype_name(dtype));
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: unknown dtype %d", fn, (int)dtype);
    }
    if (!zero && !data) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: data is NULL", fn);
    fp4rl_tensor *t;
    st = fp4rl_tensor_alloc(&t, ctx, dtype, ndim, shape, NULL, fn);
    if (st) return st;
    st = zero ? ctx->be->memset0(ctx, t->data, t->data_bytes) : ctx->be->upload(ctx, t->data, data, t->data_bytes);
    if (st) {
        fp4rl_tensor_destroy(t);
        return st;
    }
    *out = t;
    return FP4RL_OK;
}

fp4rl_status fp4rl_tensor_from_host(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype, int ndim,
                                    const int64_t *shape, const void *data)
{
    return new_dense(out, ctx, dtype, ndim, shape, data, 0, "fp4rl_tensor_from_host");
}

fp4rl_status fp4rl_tensor_zeros(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype, int ndim, const int64_t *shape)
{
    return new_dense(out, ctx, dtype, ndim, shape, NULL, 1, "fp4rl_tensor_zeros");
}

static fp4rl_status copy_out(const fp4rl_tensor *t, const void *src, size_t n, void *dst, size_t dst_bytes, const char *fn)
{
    if (!dst) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: dst is NULL", fn);
    if (dst_bytes < n) return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: dst holds %zu bytes but the tensor needs %zu", fn, dst_bytes, n);
    return t->ctx->be->download(t->ctx, dst, src, n);
}

fp4rl_status fp4rl_tensor_to_host(const fp4rl_tensor *t, void *dst, size_t dst_bytes)
{
    const char *fn = "fp4rl_tensor_to_host";
    fp4rl_status st = fp4rl_check_tensor(t, fn, "tensor");
    if (st) return st;
    if (!fp4rl_dtype_is_dense(t->dtype))
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: the tensor is %s; dequantize it first, or read its codes and scales with fp4rl_tensor_codes_to_host / fp4rl_tensor_scales_to_host", fn, fp4rl_dtype_name(t->dtype));
    return copy_out(t, t->data, t->data_bytes, dst, dst_bytes, fn);
}

fp4rl_dtype fp4rl_tensor_dtype(const fp4rl_tensor *t) { return t ? t->dtype : (fp4rl_dtype)-1; }
int fp4rl_tensor_ndim(const fp4rl_tensor *t) { return t ? t->ndim : 0; }
int64_t fp4rl_tensor_dim(const fp4rl_tensor *t, int i) { return (t && i >= 0 && i < t->ndim) ? t->dims[i] : 0; }
int64_t fp4rl_tensor_numel(const fp4rl_tensor *t) { return t ? t->numel : 0; }
size_t fp4rl_tensor_nbytes(const fp4rl_tensor *t) { return t ? t->data_bytes + t->scales_bytes : 0; }
fp4rl_context *fp4rl_tensor_context(const fp4rl_tensor *t) { return t ? t->ctx : NULL; }

static fp4rl_status check_quantized(const fp4rl_tensor *t, const char *fn)
{
    fp4rl_status st = fp4rl_check_tensor(t, fn, "tensor");
    if (st) return st;
    if (!fp4rl_dtype_is_quantized(t->dtype))
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: the tensor is %s, not a quantized dtype", fn, fp4rl_dtype_name(t->dtype));
    return FP4RL_OK;
}

fp4rl_status fp4rl_tensor_quant_info(const fp4rl_tensor *t, int *tile, size_t *codes_bytes, size_t *scales_bytes, float *tensor_scale)
{
    fp4rl_status st = check_quantized(t, "fp4rl_tensor_quant_info");
    if (st) return st;
    if (tile) *tile = t->q.tile;
    if (codes_bytes) *codes_bytes = t->data_bytes;
    if (scales_bytes) *scales_bytes = t->scales_bytes;
    if (tensor_scale) *tensor_scale = t->tensor_scale;
    return FP4RL_OK;
}

fp4rl_status fp4rl_tensor_codes_to_host(const fp4rl_tensor *t, void *dst, size_t dst_bytes)
{
    fp4rl_status st = check_quantized(t, "fp4rl_tensor_codes_to_host");
    return st ? st : copy_out(t, t->data, t->data_bytes, dst, dst_bytes, "fp4rl_tensor_codes_to_host");
}

fp4rl_status fp4rl_tensor_scales_to_host(const fp4rl_tensor *t, void *dst, size_t dst_bytes)
{
    fp4rl_status st = check_quantized(t, "fp4rl_tensor_scales_to_host");
    return st ? st : copy_out(t, t->scales, t->scales_bytes, dst, dst_bytes, "fp4rl_tensor_scales_to_host");
}

/* Padding nibbles of odd rows must be zero, so that a tensor has one byte representation. */
static bool padding_clean(const fp4rl_qdesc *d, const uint8_t *codes)
{
    if (fp4rl_format_of(d->dtype).code_bits == 8 || d->cols % 2 == 0) return true;
    for (int64_t r = 0; r < d->rows; r++)
        if (codes[r * d->row_bytes + d->row_bytes - 1] & 0xf0) return false;
    return true;
}

fp4rl_status fp4rl_tensor_import_quantized(fp4rl_tensor **out, fp4rl_context *ctx, fp4rl_dtype dtype, int ndim,
                                           const int64_t *shape, int tile, const void *codes, size_t codes_bytes,
                                           const void *scales, size_t scales_bytes, float tensor_scale)
{
    const char *fn = "fp4rl_tensor_import_quantized";
    if (!out) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    fp4rl_status st = fp4rl_check_ctx(ctx, fn);
    if (st) return st;
    if (!fp4rl_dtype_is_quantized(dtype))
        return fp4rl_fail(FP4RL_ERR_DTYPE, "%s: %s is not a quantized dtype (%s)", fn, fp4rl_dtype_name(dtype),
                          fp4rl_format_list_str());
    const fp4rl_format_traits ft = fp4rl_format_of(dtype);
    char tiles[32];
    if (!fp4rl_format_tile_ok(dtype, tile))
        return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: tile %d is not allowed for %s (0, or %s)", fn, tile,
                          fp4rl_dtype_name(dtype), fp4rl_format_tiles_str(dtype, "", tiles, sizeof tiles));
    if (!codes || !scales) return fp4rl_fail(FP4RL_ERR_INVALID_ARGUMENT, "%s: codes or scales is NULL", fn);
    int64_t numel, rows, cols;
    st = fp4rl_check_shape(ndim, shape, &numel, fn);
    if (st) return st;
    fp4rl_rows_cols(ndim, shape, &rows, &cols);
    fp4rl_qdesc d;
    if (!fp4rl_qdesc_make(&d, dtype, rows, cols, tile)) return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: the layout's size overflows", fn);
    if (codes_bytes != fp4rl_qdesc_codes_bytes(&d) || scales_bytes != fp4rl_qdesc_scales_bytes(&d))
        return fp4rl_fail(FP4RL_ERR_SHAPE, "%s: a %s tensor of this shape with tile %d has %zu bytes of codes and %zu of scales; got %zu and %zu",
                          fn, fp4rl_dtype_name(dtype), tile, fp4rl_qdesc_codes_bytes(&d), fp4rl_qdesc_scales_bytes(&d), codes_bytes, scales_bytes);
    if (!padding_clean(&d, codes)) return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: a row's padding nibble is not zero", fn);
    if (ft.scale_kind == FP4RL_SCALE_KIND_UE4M3) /* UE4M3 is unsigned: the top bit of a scale byte is never set */
        for (size_t i = 0; i < scales_bytes; i++)
            if (((const uint8_t *)scales)[i] & 0x80u)
                return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: NVFP4 scale %zu is 0x%02X, not a UE4M3 code (0x00..0x7F)", fn, i, ((const uint8_t *)scales)[i]);
    if (ft.tensor_scale ? !(tensor_scale > 0.0f && tensor_scale <= 3.4028235e38f) : tensor_scale != 1.0f)
        return fp4rl_fail(FP4RL_ERR_CORRUPT, "%s: tensor_scale %g is invalid (NVFP4: finite and > 0; other formats: 1.0)", fn, (double)tensor_scale);
    fp4rl_tensor *t;
    st = fp4rl_tensor_alloc(&t, ctx, dtype, ndim, shape, &d, fn);
    if (st) return st;
    t->tensor_scale = tensor_scale;
    st = ctx->be->upload(ctx, t->data, codes, codes_bytes);
    if (!st) st = ctx->be->upload(ctx, t->scales, scales, scales_bytes);
    if (st) {
        fp4rl_tensor_destroy(t);
        return st;
    }
    *out = t;
    return FP4RL_OK;
}

fp4rl_status fp4rl_tensor_to_cpu(fp4rl_tensor **out, fp4rl_context *host, const fp4rl_tensor *t)
{
    fp4rl_tensor *h = NULL;
    fp4rl_status st = fp4rl_tensor_alloc(&h, host, t->dtype, t->ndim, t->dims, fp4rl_dtype_is_quantized(t->dtype) ? &t->q : NULL, "fp4rl_tensor_to_cpu");
    if (st) return st;
    h->tensor_scale = t->tensor_scale;
    st = t->ctx->be->download(t->ctx, h->data, t->data, t->data_bytes);
    if (!st && t->scales) st = t->ctx->be->download(t->ctx, h->scales, t->scales, t->scales_bytes);
    if (st) {
        fp4rl_tensor_destroy(h);
        return st;
    }
    *out = h;
    return FP4RL_OK;
}
