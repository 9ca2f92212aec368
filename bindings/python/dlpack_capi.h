/*
 * dlpack_capi.h - DLPack capsules for fp4rl.capi: an fp4rl tensor exported without a copy
 * (capi.dlpack_export) and a producer's capsule wrapped as an fp4rl tensor (capi.dlpack_import).
 * Included by fp4rl.i after capi_runtime.h. Streams are the Python layer's part (fp4rl/_dlpack.py).
 *
 * The structs are written from the DLPack specification (dmlc.github.io/dlpack, "C API" and
 * "Python specification for DLPack"), version 1.0 for the versioned capsule; no dlpack.h is
 * vendored. Their layout is the ABI every producer and consumer shares.
 */
#ifndef FP4RLPY_DLPACK_CAPI_H
#define FP4RLPY_DLPACK_CAPI_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* DLDeviceType values (the spec's enum; only those fp4rl meets) */
enum { FP4RLPY_DL_CPU = 1, FP4RLPY_DL_CUDA = 2, FP4RLPY_DL_CUDA_HOST = 3, FP4RLPY_DL_CUDA_MANAGED = 13 };
/* DLDataTypeCode values */
enum { FP4RLPY_DL_INT = 0, FP4RLPY_DL_UINT = 1, FP4RLPY_DL_FLOAT = 2, FP4RLPY_DL_BFLOAT = 4 };
/* DLManagedTensorVersioned.flags bits */
#define FP4RLPY_DL_FLAG_READ_ONLY ((uint64_t)1 << 0)
#define FP4RLPY_DL_FLAG_IS_COPIED ((uint64_t)1 << 1)

typedef struct {
    int32_t device_type; /* DLDeviceType: a C enum, int-sized on every platform DLPack targets */
    int32_t device_id;
} fp4rlpy_DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} fp4rlpy_DLDataType;

typedef struct {
    void *data;
    fp4rlpy_DLDevice device;
    int32_t ndim;
    fp4rlpy_DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL = compact row-major */
    uint64_t byte_offset;
} fp4rlpy_DLTensor;

typedef struct fp4rlpy_DLManagedTensor {
    fp4rlpy_DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct fp4rlpy_DLManagedTensor *self);
} fp4rlpy_DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} fp4rlpy_DLPackVersion;

typedef struct fp4rlpy_DLManagedTensorVersioned {
    fp4rlpy_DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct fp4rlpy_DLManagedTensorVersioned *self);
    uint64_t flags;
    fp4rlpy_DLTensor dl_tensor;
} fp4rlpy_DLManagedTensorVersioned;

/* ---- export: an fp4rl tensor as a capsule ---- */

/* One exported tensor: the DLPack struct the consumer sees, the shape and strides it points to,
 * and the fp4rl tensor handle it keeps (a child of the handle, so that close() leaves the C
 * tensor alive until the consumer lets go). */
typedef struct {
    union {
        fp4rlpy_DLManagedTensor v0;
        fp4rlpy_DLManagedTensorVersioned v1;
    } m;
    fp4rlpy_handle *owner;
    int64_t shape[FP4RL_MAX_DIMS], strides[FP4RL_MAX_DIMS];
} fp4rlpy_dl_export;

static void fp4rlpy_dl_export_free(fp4rlpy_dl_export *e)
{
    /* The consumer may drop its tensor on any thread, holding the GIL or not. */
    PyGILState_STATE g = PyGILState_Ensure();
    fp4rlpy_handle *h = e->owner;
    h->children--;
    if (h->closed && h->children == 0) fp4rlpy_finish(h);
    Py_DECREF((PyObject *)h);
    PyGILState_Release(g);
    free(e);
}
static void fp4rlpy_dl_deleter_v0(fp4rlpy_DLManagedTensor *m) { fp4rlpy_dl_export_free((fp4rlpy_dl_export *)m->manager_ctx); }
static void fp4rlpy_dl_deleter_v1(fp4rlpy_DLManagedTensorVersioned *m) { fp4rlpy_dl_export_free((fp4rlpy_dl_export *)m->manager_ctx); }

/* A capsule nobody consumed still owns its tensor (a consumer renames it "used_..."). */
static void fp4rlpy_dl_capsule_v0(PyObject *cap)
{
    if (!PyCapsule_IsValid(cap, "dltensor")) return;
    fp4rlpy_DLManagedTensor *m = (fp4rlpy_DLManagedTensor *)PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter) m->deleter(m);
}
static void fp4rlpy_dl_capsule_v1(PyObject *cap)
{
    if (!PyCapsule_IsValid(cap, "dltensor_versioned")) return;
    fp4rlpy_DLManagedTensorVersioned *m = (fp4rlpy_DLManagedTensorVersioned *)PyCapsule_GetPointer(cap, "dltensor_versioned");
    if (m && m->deleter) m->deleter(m);
}

static int fp4rlpy_dl_dtype(fp4rl_dtype d, fp4rlpy_DLDataType *out)
{
    switch (d) {
    case FP4RL_DTYPE_F32: *out = (fp4rlpy_DLDataType){FP4RLPY_DL_FLOAT, 32, 1}; return 0;
    case FP4RL_DTYPE_BF16: *out = (fp4rlpy_DLDataType){FP4RLPY_DL_BFLOAT, 16, 1}; return 0;
    case FP4RL_DTYPE_I32: *out = (fp4rlpy_DLDataType){FP4RLPY_DL_INT, 32, 1}; return 0;
    default: return -1;
    }
}

/* capi.dlpack_export(tensor, versioned, device_type, device_id): a new capsule of the tensor's
 * elements, in place. The device is the caller's (the Python Context knows its ordinal). */
static PyObject *fp4rlpy_dlpack_export(PyObject *tensor, int versioned, int device_type, int device_id)
{
    const char *fn = "__dlpack__";
    fp4rl_tensor *t;
    if (fp4rlpy_handle_arg(tensor, FP4RLPY_TENSOR, (void **)&t, fn, 1) < 0) return NULL;
    if (!t) {
        PyErr_SetString(PyExc_TypeError, "__dlpack__: the tensor handle is None");
        return NULL;
    }
    fp4rlpy_DLDataType dt;
    if (fp4rlpy_dl_dtype(fp4rl_tensor_dtype(t), &dt) < 0) {
        PyErr_Format(PyExc_BufferError, "__dlpack__: a %s tensor has no dense elements to share (DLPack holds dense arrays); dequantize it first",
                     fp4rl_dtype_name(fp4rl_tensor_dtype(t)));
        return NULL;
    }
    void *data = fp4rl_tensor_data(t);
    if (!data) {
        PyErr_Format(PyExc_BufferError, "__dlpack__: %s", fp4rl_last_error());
        return NULL;
    }
    fp4rlpy_dl_export *e = calloc(1, sizeof *e);
    if (!e) return PyErr_NoMemory();
    const int nd = fp4rl_tensor_ndim(t);
    int64_t stride = 1;
    for (int i = nd - 1; i >= 0; i--) {
        e->shape[i] = fp4rl_tensor_dim(t, i);
        e->strides[i] = stride; /* explicit: newer consumers expect strides, and the layout is row-major */
        stride *= e->shape[i];
    }
    fp4rlpy_DLTensor dl = {data, {device_type, device_id}, nd, dt, e->shape, e->strides, 0};
    e->owner = (fp4rlpy_handle *)tensor;
    Py_INCREF(tensor);
    e->owner->children++;
    PyObject *cap;
    if (versioned) {
        e->m.v1.version = (fp4rlpy_DLPackVersion){1, 0};
        e->m.v1.manager_ctx = e;
        e->m.v1.deleter = fp4rlpy_dl_deleter_v1;
        e->m.v1.flags = 0; /* writable, not a copy */
        e->m.v1.dl_tensor = dl;
        cap = PyCapsule_New(&e->m.v1, "dltensor_versioned", fp4rlpy_dl_capsule_v1);
    } else {
        e->m.v0.dl_tensor = dl;
        e->m.v0.manager_ctx = e;
        e->m.v0.deleter = fp4rlpy_dl_deleter_v0;
        cap = PyCapsule_New(&e->m.v0, "dltensor", fp4rlpy_dl_capsule_v0);
    }
    if (!cap) fp4rlpy_dl_export_free(e);
    return cap;
}

/* ---- import: a producer's capsule as an fp4rl tensor ---- */

typedef struct {
    void *managed; /* fp4rlpy_DLManagedTensor or ..Versioned */
    int versioned;
} fp4rlpy_dl_import;

/* fp4rl_tensor_wrap's release: hands the tensor back to its producer (its deleter). */
static void fp4rlpy_dl_import_release(void *p)
{
    fp4rlpy_dl_import *im = (fp4rlpy_dl_import *)p;
    if (im->versioned) {
        fp4rlpy_DLManagedTensorVersioned *m = (fp4rlpy_DLManagedTensorVersioned *)im->managed;
        if (m->deleter) m->deleter(m);
    } else {
        fp4rlpy_DLManagedTensor *m = (fp4rlpy_DLManagedTensor *)im->managed;
        if (m->deleter) m->deleter(m);
    }
    free(im);
}

static int fp4rlpy_dl_to_fp4rl(fp4rlpy_DLDataType d, fp4rl_dtype *out)
{
    if (d.lanes != 1) return -1;
    if (d.code == FP4RLPY_DL_FLOAT && d.bits == 32) *out = FP4RL_DTYPE_F32;
    else if (d.code == FP4RLPY_DL_BFLOAT && d.bits == 16) *out = FP4RL_DTYPE_BF16;
    else if (d.code == FP4RLPY_DL_INT && d.bits == 32) *out = FP4RL_DTYPE_I32;
    else return -1;
    return 0;
}

/* capi.dlpack_import(capsule, ctx, device_type, device_id): the capsule's tensor wrapped in ctx
 * without a copy (fp4rl_tensor_wrap), its producer's deleter called when the fp4rl tensor goes.
 * (device_type, device_id) is ctx's device; the tensor must live there. The capsule is marked
 * used only on success; on failure it still owns its tensor. */
static PyObject *fp4rlpy_dlpack_import(PyObject *cap, PyObject *ctx_handle, int device_type, int device_id)
{
    const char *fn = "from_dlpack";
    fp4rl_context *ctx;
    if (fp4rlpy_handle_arg(ctx_handle, FP4RLPY_CONTEXT, (void **)&ctx, fn, 2) < 0) return NULL;
    int versioned;
    void *managed;
    fp4rlpy_DLTensor *dl;
    uint64_t flags = 0;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        fp4rlpy_DLManagedTensorVersioned *m = (fp4rlpy_DLManagedTensorVersioned *)PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m->version.major != 1) { /* another major version may change the struct's layout */
            PyErr_Format(PyExc_BufferError, "%s: the producer's DLPack version is %u.%u; fp4rl reads version 1.x", fn, m->version.major,
                         m->version.minor);
            return NULL;
        }
        versioned = 1, managed = m, dl = &m->dl_tensor, flags = m->flags;
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        fp4rlpy_DLManagedTensor *m = (fp4rlpy_DLManagedTensor *)PyCapsule_GetPointer(cap, "dltensor");
        versioned = 0, managed = m, dl = &m->dl_tensor;
    } else {
        PyErr_Format(PyExc_TypeError, "%s: expected an unused DLPack capsule (\"dltensor\" or \"dltensor_versioned\"), got %.100s", fn,
                     Py_TYPE(cap)->tp_name);
        return NULL;
    }
    if (flags & FP4RLPY_DL_FLAG_READ_ONLY) {
        PyErr_Format(PyExc_BufferError, "%s: the tensor is read-only; fp4rl tensors are writable (pass a writable array, or a copy)", fn);
        return NULL;
    }
    const int dev_ok = device_type == FP4RLPY_DL_CPU
                           ? dl->device.device_type == FP4RLPY_DL_CPU || dl->device.device_type == FP4RLPY_DL_CUDA_HOST
                           : (dl->device.device_type == FP4RLPY_DL_CUDA || dl->device.device_type == FP4RLPY_DL_CUDA_MANAGED) &&
                                 dl->device.device_id == device_id;
    if (!dev_ok) {
        fp4rlpy_raise_binding(FP4RL_ERR_INVALID_ARGUMENT, "%s: the tensor is on DLPack device (%d, %d); the context is on (%d, %d): move it there first",
                              fn, (int)dl->device.device_type, (int)dl->device.device_id, device_type, device_id);
        return NULL;
    }
    fp4rl_dtype dtype;
    if (fp4rlpy_dl_to_fp4rl(dl->dtype, &dtype) < 0) {
        fp4rlpy_raise_binding(FP4RL_ERR_DTYPE, "%s: DLPack dtype (code %u, %u bits, %u lanes) has no fp4rl dtype; fp4rl wraps float32, bfloat16 and int32",
                              fn, dl->dtype.code, dl->dtype.bits, dl->dtype.lanes);
        return NULL;
    }
    if (dl->ndim < 0 || dl->ndim > FP4RL_MAX_DIMS) {
        fp4rlpy_raise_binding(FP4RL_ERR_SHAPE, "%s: the tensor has %d dims; fp4rl takes 1 to %d", fn, (int)dl->ndim, FP4RL_MAX_DIMS);
        return NULL;
    }
    /* a 0-dim tensor is one element: fp4rl's shapes have at least one dim */
    int64_t one = 1, unit_stride = 1;
    const int nd = dl->ndim ? dl->ndim : 1;
    const int64_t *shape = dl->ndim ? dl->shape : &one, *strides = dl->ndim ? dl->strides : &unit_stride;
    fp4rlpy_dl_import *im = malloc(sizeof *im);
    if (!im) return PyErr_NoMemory();
    im->managed = managed;
    im->versioned = versioned;
    fp4rl_tensor *t = NULL;
    void *data = (char *)dl->data + dl->byte_offset;
    fp4rl_status st = fp4rl_tensor_wrap(&t, ctx, dtype, nd, shape, strides, data, fp4rlpy_dl_import_release, im);
    if (st != FP4RL_OK) {
        free(im);
        fp4rlpy_raise_status(st);
        return NULL;
    }
    /* from here the fp4rl tensor owns the producer's tensor: the capsule must not delete it */
    if (PyCapsule_SetName(cap, versioned ? "used_dltensor_versioned" : "used_dltensor") < 0) {
        PyErr_Clear(); /* cannot fail for a valid capsule; never let both sides delete */
    }
    return fp4rlpy_handle_new(t, FP4RLPY_TENSOR, ctx_handle, NULL);
}

#endif
