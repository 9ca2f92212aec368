/*
 * capi_runtime.h - the C support code of the SWIG module fp4rl.capi (included once, by the
 * generated wrapper only; everything here is static).
 *
 * Three jobs the generated code cannot do by itself:
 *  1. Handles. Every fp4rl object is owned by a `fp4rl.capi.Handle`, a tiny non-GC extension type
 *     that calls the object's *_destroy exactly once, from its dealloc or from an explicit close.
 *     A handle holds strong references to the handles its C object depends on (a tensor or a model
 *     on its context, a session on its context and its model). Those references live in C fields
 *     the cycle collector never clears, so no collection order can free a context before the
 *     tensors that use its allocator.
 *  2. Errors. A failed status becomes an instance of the exception class of its family, carrying
 *     fp4rl_last_error()'s message unchanged.
 *  3. Reward callbacks. A C trampoline calls the Python callable with the GIL; an exception raised
 *     inside it makes the trampoline return non-zero and is kept, so the step's CallbackError can
 *     carry it as __cause__.
 * Plus a guard for the C ABI's rules on threads and re-entrancy: long calls release the GIL and
 * mark their context busy, and a call on a busy context from another thread is refused with a
 * Python exception instead of racing inside the library ("a context is used by one thread at a
 * time"). A reward function runs on the stepping thread and may use fp4rl, this context included,
 * but not step, train or destroy the session that calls it or that session's model (fp4rl.h,
 * fp4rl_reward_fn): such calls are refused the same way; reading them stays allowed.
 */
#ifndef FP4RL_CAPI_RUNTIME_H
#define FP4RL_CAPI_RUNTIME_H

#include <Python.h>
#include <string.h>

#include <fp4rl/fp4rl.h>

/* ---------------------------------------------------------------------------------------------
 * Exception classes, one per status family, created at module init.
 * ------------------------------------------------------------------------------------------- */
#define FP4RLPY_N_STATUS (FP4RL_ERR_INTERNAL + 1)
static PyObject *fp4rlpy_exc[FP4RLPY_N_STATUS]; /* [0] is the base class fp4rl.Error */

/* Creates fp4rl.Error and its subclasses and adds them to module `m`. The standard exception each
 * one also derives from lets callers who do not know fp4rl catch the natural Python family
 * (e.g. `except MemoryError`). */
static int fp4rlpy_init_exceptions(PyObject *m)
{
    static const struct {
        fp4rl_status st;
        const char *name, *doc;
    } table[] = {
        {FP4RL_OK, "Error", "Base class of every error raised by fp4rl; .status is the fp4rl_status."},
        {FP4RL_ERR_INVALID_ARGUMENT, "InvalidArgumentError", "FP4RL_ERR_INVALID_ARGUMENT: a NULL/closed handle or an out-of-range value."},
        {FP4RL_ERR_SHAPE, "ShapeError", "FP4RL_ERR_SHAPE: dims that do not fit together, or a buffer of the wrong size."},
        {FP4RL_ERR_DTYPE, "DTypeError", "FP4RL_ERR_DTYPE: a dtype this function does not take."},
        {FP4RL_ERR_UNSUPPORTED, "UnsupportedError", "FP4RL_ERR_UNSUPPORTED: valid, but not implemented for this case."},
        {FP4RL_ERR_OUT_OF_MEMORY, "OutOfMemoryError", "FP4RL_ERR_OUT_OF_MEMORY: an allocation failed (also a MemoryError)."},
        {FP4RL_ERR_DEVICE, "DeviceError", "FP4RL_ERR_DEVICE: no such device, or a device error."},
        {FP4RL_ERR_IO, "FileIOError", "FP4RL_ERR_IO: a file could not be read or written (also an OSError)."},
        {FP4RL_ERR_CORRUPT, "CorruptError", "FP4RL_ERR_CORRUPT: a file or buffer is malformed."},
        {FP4RL_ERR_CALLBACK, "CallbackError", "FP4RL_ERR_CALLBACK: a user callback failed; __cause__ is the Python exception it raised."},
        {FP4RL_ERR_INTERNAL, "InternalError", "FP4RL_ERR_INTERNAL: a bug in fp4rl; please report it with the message."},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        PyObject *std = NULL;
        switch (table[i].st) {
        case FP4RL_ERR_INVALID_ARGUMENT:
        case FP4RL_ERR_SHAPE: std = PyExc_ValueError; break;
        case FP4RL_ERR_DTYPE: std = PyExc_TypeError; break;
        case FP4RL_ERR_UNSUPPORTED: std = PyExc_NotImplementedError; break;
        case FP4RL_ERR_OUT_OF_MEMORY: std = PyExc_MemoryError; break;
        case FP4RL_ERR_DEVICE:
        case FP4RL_ERR_INTERNAL: std = PyExc_RuntimeError; break;
        case FP4RL_ERR_IO: std = PyExc_OSError; break;
        default: break;
        }
        char qualname[64];
        snprintf(qualname, sizeof qualname, "fp4rl.%s", table[i].name);
        PyObject *bases = table[i].st == FP4RL_OK ? PyTuple_Pack(1, PyExc_Exception)
                          : std                   ? PyTuple_Pack(2, fp4rlpy_exc[0], std)
                                                  : PyTuple_Pack(1, fp4rlpy_exc[0]);
        PyObject *dict = PyDict_New();
        PyObject *st = table[i].st == FP4RL_OK ? Py_NewRef(Py_None) : PyLong_FromLong((long)table[i].st);
        if (!bases || !dict || !st || PyDict_SetItemString(dict, "status", st) < 0) {
            Py_XDECREF(bases), Py_XDECREF(dict), Py_XDECREF(st);
            return -1;
        }
        PyObject *cls = PyErr_NewExceptionWithDoc(qualname, table[i].doc, bases, dict);
        Py_DECREF(bases), Py_DECREF(dict), Py_DECREF(st);
        if (!cls) return -1;
        fp4rlpy_exc[table[i].st] = cls;
        if (PyModule_AddObjectRef(m, table[i].name, cls) < 0) return -1;
    }
    return 0;
}

/* Raises `cls(msg)` with .status / .status_name / .c_message set; `cause` (stolen, may be NULL)
 * becomes __cause__. */
static void fp4rlpy_raise_with(fp4rl_status st, const char *msg, const char *c_message, PyObject *cause)
{
    PyObject *cls = (st > FP4RL_OK && st < FP4RLPY_N_STATUS) ? fp4rlpy_exc[st] : fp4rlpy_exc[0];
    PyObject *exc = PyObject_CallFunction(cls, "s", msg);
    if (exc) {
        PyObject *code = PyLong_FromLong((long)st), *name = PyUnicode_FromString(fp4rl_status_name(st)),
                 *cmsg = PyUnicode_FromString(c_message);
        if (code && name && cmsg && PyObject_SetAttrString(exc, "status", code) == 0 &&
            PyObject_SetAttrString(exc, "status_name", name) == 0 && PyObject_SetAttrString(exc, "c_message", cmsg) == 0) {
            if (cause) {
                PyException_SetCause(exc, cause); /* steals */
                cause = NULL;
            }
            PyErr_SetObject(cls, exc);
        }
        Py_XDECREF(code), Py_XDECREF(name), Py_XDECREF(cmsg);
        Py_DECREF(exc);
    }
    Py_XDECREF(cause);
}

/* A binding-side refusal (closed handle, busy context, wrong buffer) in the same classes. */
static void fp4rlpy_raise_binding(fp4rl_status st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fp4rlpy_raise_with(st, msg, msg, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Reward callbacks
 * ------------------------------------------------------------------------------------------- */
struct fp4rlpy_handle;
typedef struct fp4rlpy_reward {
    PyObject *fn;                 /* borrowed: the wrapper's argument outlives the call */
    PyObject *exc;                /* the first exception the callable raised (owned), or NULL */
    struct fp4rlpy_reward *prev;  /* the enclosing call's record on this thread (nesting) */
    struct fp4rlpy_handle *root;  /* the stepping context, marked while the callable runs */
} fp4rlpy_reward;

/* The typemaps' locals start as this, so that a wrapper failing before it converted an argument
 * cleans up nothing for it. */
static const fp4rlpy_reward fp4rlpy_no_reward = {NULL, NULL, NULL, NULL};

/* The reward record of the step running on this thread, so that the status typemap can chain the
 * callable's exception. Thread-local because steps on separate contexts may run concurrently in
 * several threads (each releases the GIL). */
static _Thread_local fp4rlpy_reward *fp4rlpy_current_reward;

static PyObject *fp4rlpy_tokens_tuple(const int32_t *t, size_t n)
{
    PyObject *tup = PyTuple_New((Py_ssize_t)n);
    if (!tup) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLong(t[i]);
        if (!v) {
            Py_DECREF(tup);
            return NULL;
        }
        PyTuple_SET_ITEM(tup, (Py_ssize_t)i, v);
    }
    return tup;
}

/* The fp4rl_reward_fn handed to the library: reward = fn(prompt_index, prompt, completion), with
 * prompt and completion as tuples of ints (copies: the library's buffers die with the call, so a
 * callable that keeps its arguments must not see views of them). */
static void fp4rlpy_callback_enter(struct fp4rlpy_handle *root, int delta);

static int fp4rlpy_reward_trampoline(void *user, size_t prompt_index, const int32_t *prompt, size_t prompt_len,
                                     const int32_t *completion, size_t completion_len, double *reward)
{
    fp4rlpy_reward *r = (fp4rlpy_reward *)user;
    PyGILState_STATE gil = PyGILState_Ensure(); /* the step runs with the GIL released */
    int rc = 1;
    if (!r->exc) {
        fp4rlpy_callback_enter(r->root, +1);
        PyObject *p = fp4rlpy_tokens_tuple(prompt, prompt_len), *c = p ? fp4rlpy_tokens_tuple(completion, completion_len) : NULL;
        PyObject *res = c ? PyObject_CallFunction(r->fn, "nOO", (Py_ssize_t)prompt_index, p, c) : NULL;
        if (res) {
            const double v = PyFloat_AsDouble(res);
            if (!(v == -1.0 && PyErr_Occurred())) {
                *reward = v;
                rc = 0;
            }
        }
        Py_XDECREF(p), Py_XDECREF(c), Py_XDECREF(res);
        fp4rlpy_callback_enter(r->root, -1);
        if (rc) {
            /* keep the exception with its traceback for __cause__ */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb && value) PyException_SetTraceback(value, tb);
            Py_XDECREF(type), Py_XDECREF(tb);
            r->exc = value;
        }
    }
    PyGILState_Release(gil);
    return rc;
}

/* "ValueError: bad input (at reward.py:12 in my_reward)" for the message of the CallbackError. */
static void fp4rlpy_exc_summary(PyObject *exc, char *buf, size_t n)
{
    PyObject *s = PyObject_Str(exc);
    const char *text = s ? PyUnicode_AsUTF8(s) : NULL;
    if (!text) PyErr_Clear();
    int used = snprintf(buf, n, "%s%s%s", Py_TYPE(exc)->tp_name, text && *text ? ": " : "", text ? text : "");
    Py_XDECREF(s);
    PyObject *tb = PyException_GetTraceback(exc), *next;
    while (tb && (next = PyObject_GetAttrString(tb, "tb_next")) != NULL && next != Py_None) {
        Py_DECREF(tb);
        tb = next;
    }
    if (tb) {
        Py_XDECREF(next);
        PyObject *line = PyObject_GetAttrString(tb, "tb_lineno"), *frame = PyObject_GetAttrString(tb, "tb_frame");
        PyObject *code = frame ? PyObject_GetAttrString(frame, "f_code") : NULL;
        PyObject *file = code ? PyObject_GetAttrString(code, "co_filename") : NULL;
        PyObject *name = code ? PyObject_GetAttrString(code, "co_name") : NULL;
        if (line && file && name && used >= 0 && (size_t)used < n)
            snprintf(buf + used, n - (size_t)used, " (at %s:%ld in %s)", PyUnicode_AsUTF8(file), PyLong_AsLong(line), PyUnicode_AsUTF8(name));
        Py_XDECREF(line), Py_XDECREF(frame), Py_XDECREF(code), Py_XDECREF(file), Py_XDECREF(name);
        Py_DECREF(tb);
    }
    PyErr_Clear();
}

/* Raises the exception of a failed status. For FP4RL_ERR_CALLBACK with a kept Python exception,
 * the exception becomes __cause__ and its summary is appended to the C message; a BaseException
 * that is not an Exception (KeyboardInterrupt, SystemExit) is re-raised as itself, since it is a
 * request to stop, not a reward failure. */
static void fp4rlpy_raise_status(fp4rl_status st)
{
    char c_message[1100];
    snprintf(c_message, sizeof c_message, "%s", fp4rl_last_error());
    if (!c_message[0]) snprintf(c_message, sizeof c_message, "%s (no message)", fp4rl_status_name(st));
    fp4rlpy_reward *r = fp4rlpy_current_reward;
    if (r && r->exc) {
        PyObject *cause = r->exc;
        r->exc = NULL;
        if (!PyObject_IsInstance(cause, PyExc_Exception)) {
            PyErr_SetObject((PyObject *)Py_TYPE(cause), cause);
            Py_DECREF(cause);
            return;
        }
        char summary[600], msg[1800];
        fp4rlpy_exc_summary(cause, summary, sizeof summary);
        snprintf(msg, sizeof msg, "%s; the reward function raised %s", c_message, summary);
        fp4rlpy_raise_with(st, msg, c_message, cause);
        return;
    }
    fp4rlpy_raise_with(st, c_message, c_message, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Handles
 * ------------------------------------------------------------------------------------------- */
enum { FP4RLPY_CONTEXT, FP4RLPY_TENSOR, FP4RLPY_POLICY, FP4RLPY_MODEL, FP4RLPY_SESSION, FP4RLPY_LINEAR, FP4RLPY_NKINDS };
static const char *const fp4rlpy_kind_name[FP4RLPY_NKINDS] = {"context", "tensor", "quant_policy", "model", "rl_session", "linear"};

typedef struct fp4rlpy_deferred {
    int kind;
    void *ptr;
} fp4rlpy_deferred;

typedef struct fp4rlpy_handle {
    PyObject_HEAD
    void *ptr;                         /* the C object; NULL once destroyed */
    int kind;
    int closed;                        /* its owner released it: unusable, freed with its last child */
    int busy;                          /* contexts: GIL-released calls running on it (nested: > 1) */
    unsigned long busy_thread;         /* contexts: the thread running them */
    int in_callback;                   /* contexts: reward functions of its steps now running */
    int stepping;                      /* sessions and models: a step of theirs is calling Python */
    Py_ssize_t children;               /* handles holding this one as a parent */
    struct fp4rlpy_handle *parents[2]; /* owned references */
    fp4rlpy_deferred *deferred;        /* contexts: objects whose destroy waits for the busy call */
    size_t n_deferred, cap_deferred;
    PyObject *weakrefs;
} fp4rlpy_handle;

static PyTypeObject fp4rlpy_handle_type;

static void fp4rlpy_destroy_kind(int kind, void *ptr)
{
    switch (kind) {
    case FP4RLPY_CONTEXT: fp4rl_context_destroy((fp4rl_context *)ptr); break;
    case FP4RLPY_TENSOR: fp4rl_tensor_destroy((fp4rl_tensor *)ptr); break;
    case FP4RLPY_POLICY: fp4rl_quant_policy_destroy((fp4rl_quant_policy *)ptr); break;
    case FP4RLPY_MODEL: fp4rl_model_destroy((fp4rl_model *)ptr); break;
    case FP4RLPY_SESSION: fp4rl_rl_session_destroy((fp4rl_rl_session *)ptr); break;
    case FP4RLPY_LINEAR: fp4rl_linear_destroy((fp4rl_linear *)ptr); break;
    }
}

/* The context a handle's C object lives in (itself for a context), or NULL (a policy). */
static fp4rlpy_handle *fp4rlpy_root(fp4rlpy_handle *h)
{
    while (h && h->kind != FP4RLPY_CONTEXT) h = h->parents[0];
    return h;
}

static fp4rlpy_handle *fp4rlpy_root_of(PyObject *o)
{
    return PyObject_TypeCheck(o, &fp4rlpy_handle_type) ? fp4rlpy_root((fp4rlpy_handle *)o) : NULL;
}

static void fp4rlpy_finish(fp4rlpy_handle *h);

/* Destroys the C object now, or, when its context is in a GIL-released call (another thread may
 * be inside the library with it), queues it on the context until that call returns. */
static void fp4rlpy_flush_deferred(fp4rlpy_handle *root);

static void fp4rlpy_destroy_now_or_later(fp4rlpy_handle *h)
{
    void *ptr = h->ptr;
    if (!ptr) return;
    h->ptr = NULL;
    /* a context's queued objects go before it (in practice the queue is empty: it is flushed when
     * the busy call ends, and a busy context is referenced by that call) */
    if (h->kind == FP4RLPY_CONTEXT) fp4rlpy_flush_deferred(h);
    fp4rlpy_handle *root = fp4rlpy_root(h);
    if (root && root != h && root->busy) {
        if (root->n_deferred == root->cap_deferred) {
            size_t cap = root->cap_deferred ? 2 * root->cap_deferred : 8;
            fp4rlpy_deferred *d = PyMem_Realloc(root->deferred, cap * sizeof *d);
            if (d) {
                root->deferred = d;
                root->cap_deferred = cap;
            }
        }
        if (root->n_deferred < root->cap_deferred) {
            root->deferred[root->n_deferred].kind = h->kind;
            root->deferred[root->n_deferred++].ptr = ptr;
            return;
        }
        /* no memory to queue it: leaking one object is better than racing inside the library */
        return;
    }
    fp4rlpy_destroy_kind(h->kind, ptr);
}

/* Runs the destroys queued while `root` was busy (GIL held, root no longer busy). */
static void fp4rlpy_flush_deferred(fp4rlpy_handle *root)
{
    while (root && root->n_deferred) {
        fp4rlpy_deferred d = root->deferred[--root->n_deferred];
        fp4rlpy_destroy_kind(d.kind, d.ptr);
    }
}

/* Frees the C object (once) and then lets go of the parents, children before parents. */
static void fp4rlpy_finish(fp4rlpy_handle *h)
{
    fp4rlpy_destroy_now_or_later(h);
    for (int i = 0; i < 2; i++) {
        fp4rlpy_handle *p = h->parents[i];
        if (!p) continue;
        h->parents[i] = NULL;
        /* a queued destroy keeps its context: the root is referenced by the busy call's argument */
        p->children--;
        if (p->closed && p->children == 0) fp4rlpy_finish(p);
        Py_DECREF(p);
    }
}

static void fp4rlpy_handle_dealloc(fp4rlpy_handle *h)
{
    if (h->weakrefs) PyObject_ClearWeakRefs((PyObject *)h);
    fp4rlpy_finish(h);
    PyMem_Free(h->deferred);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

/* A new handle owning `ptr` (NULL only after a failure, then None is returned). */
static PyObject *fp4rlpy_handle_new(void *ptr, int kind, PyObject *parent0, PyObject *parent1)
{
    if (!ptr) Py_RETURN_NONE;
    fp4rlpy_handle *h = PyObject_New(fp4rlpy_handle, &fp4rlpy_handle_type);
    if (!h) {
        fp4rlpy_destroy_kind(kind, ptr);
        return NULL;
    }
    h->ptr = ptr;
    h->kind = kind;
    h->closed = h->busy = h->in_callback = h->stepping = 0;
    h->busy_thread = 0;
    h->children = 0;
    h->deferred = NULL;
    h->n_deferred = h->cap_deferred = 0;
    h->weakrefs = NULL;
    PyObject *parents[2] = {parent0, parent1};
    for (int i = 0; i < 2; i++) {
        fp4rlpy_handle *p = parents[i] && PyObject_TypeCheck(parents[i], &fp4rlpy_handle_type) ? (fp4rlpy_handle *)parents[i] : NULL;
        h->parents[i] = p;
        if (p) {
            Py_INCREF(p);
            p->children++;
        }
    }
    return (PyObject *)h;
}

/* Whether the thread calling now may use a context that is busy: only the thread running the
 * busy call, from inside one of its reward functions (the library is then between calls). */
static int fp4rlpy_reentry_ok(const fp4rlpy_handle *root)
{
    return root->in_callback > 0 && root->busy_thread == PyThread_get_thread_ident();
}

static void fp4rlpy_callback_enter(struct fp4rlpy_handle *root, int delta)
{
    if (root) root->in_callback += delta;
}

/* What a reward function may still do with the session that calls it and that session's model:
 * read them (fp4rl.h allows any use but stepping, training or destroying them; the binding takes
 * the safe side and refuses every other call on those two, since they change state the step
 * relies on). */
static int fp4rlpy_read_only(const char *fn)
{
    static const char *const ok[] = {
        "fp4rl_rl_session_get", "fp4rl_rl_session_metric", "fp4rl_rl_session_metrics_json",
        "fp4rl_rl_session_num_completions", "fp4rl_rl_session_completion", "fp4rl_rl_session_step_count",
        "fp4rl_model_get_info", "fp4rl_model_get_hparam", "fp4rl_model_param_shape", "fp4rl_model_get_param",
        "fp4rl_model_get_grad", "fp4rl_model_logits", "fp4rl_model_token_logprobs", "fp4rl_model_save",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(fn, ok[i])) return 1;
    return 0;
}

/* -1 (raised) when `fn` may not use handle `h` now: its context is busy in another thread, or
 * `h` is a stepping session or model and `fn` would change it. */
static int fp4rlpy_check_free(fp4rlpy_handle *h, const char *fn, int argnum)
{
    fp4rlpy_handle *root = fp4rlpy_root(h);
    if (root && root->busy && !fp4rlpy_reentry_ok(root)) {
        fp4rlpy_raise_binding(FP4RL_ERR_INVALID_ARGUMENT,
                              "%s: argument %d: its context is busy with a call in another thread; a context is used by "
                              "one thread at a time",
                              fn, argnum);
        return -1;
    }
    if (h->stepping && !fp4rlpy_read_only(fn)) {
        fp4rlpy_raise_binding(FP4RL_ERR_INVALID_ARGUMENT,
                              "%s: argument %d: this %s is in the RL step whose reward function is running; a reward "
                              "function may read it but not step, train, change or destroy it",
                              fn, argnum, fp4rlpy_kind_name[h->kind]);
        return -1;
    }
    return 0;
}

/* Converts an argument to the C pointer of a live handle of `kind`; None gives NULL (the library
 * then reports the NULL argument in its own words). */
static int fp4rlpy_handle_arg(PyObject *o, int kind, void **out, const char *fn, int argnum)
{
    if (o == Py_None) {
        *out = NULL;
        return 0;
    }
    if (!PyObject_TypeCheck(o, &fp4rlpy_handle_type)) {
        PyErr_Format(PyExc_TypeError, "%s: argument %d must be an fp4rl %s handle (fp4rl.capi.Handle), not %.100s", fn, argnum,
                     fp4rlpy_kind_name[kind], Py_TYPE(o)->tp_name);
        return -1;
    }
    fp4rlpy_handle *h = (fp4rlpy_handle *)o;
    if (h->kind != kind) {
        PyErr_Format(PyExc_TypeError, "%s: argument %d must be an fp4rl %s handle, not a %s handle", fn, argnum,
                     fp4rlpy_kind_name[kind], fp4rlpy_kind_name[h->kind]);
        return -1;
    }
    if (h->closed || !h->ptr) {
        fp4rlpy_raise_binding(FP4RL_ERR_INVALID_ARGUMENT, "%s: argument %d: the %s was closed", fn, argnum, fp4rlpy_kind_name[kind]);
        return -1;
    }
    if (fp4rlpy_check_free(h, fn, argnum) < 0) return -1;
    *out = h->ptr;
    return 0;
}

/* Marks the context of a long call busy before the GIL is released; -1 (raised) if another
 * thread got it meanwhile (an argument conversion can run Python code and switch threads). */
static int fp4rlpy_begin_busy(PyObject *o, fp4rlpy_handle **root, const char *fn)
{
    *root = fp4rlpy_root_of(o);
    if (!*root) return 0;
    if ((*root)->busy && !fp4rlpy_reentry_ok(*root)) {
        *root = NULL;
        fp4rlpy_raise_binding(FP4RL_ERR_INVALID_ARGUMENT, "%s: the context is busy with a call in another thread", fn);
        return -1;
    }
    (*root)->busy++;
    (*root)->busy_thread = PyThread_get_thread_ident();
    return 0;
}

static void fp4rlpy_end_busy(fp4rlpy_handle *root)
{
    if (!root) return;
    if (--root->busy == 0) fp4rlpy_flush_deferred(root);
}

/* Marks a stepping session and its model (the session's second parent) while the step runs. */
static void fp4rlpy_mark_stepping(PyObject *session, int delta)
{
    if (!PyObject_TypeCheck(session, &fp4rlpy_handle_type)) return;
    fp4rlpy_handle *s = (fp4rlpy_handle *)session;
    s->stepping += delta;
    if (s->parents[1]) s->parents[1]->stepping += delta;
}

/* The owner's explicit destroy: the handle becomes unusable now; its C object is destroyed now if
 * nothing depends on it, otherwise when the last handle that depends on it goes. Idempotent. */
static PyObject *fp4rlpy_release(PyObject *o, int kind, const char *fn)
{
    if (o == Py_None) Py_RETURN_NONE; /* like *_destroy(NULL) */
    if (!PyObject_TypeCheck(o, &fp4rlpy_handle_type) || ((fp4rlpy_handle *)o)->kind != kind) {
        PyErr_Format(PyExc_TypeError, "%s: expected an fp4rl %s handle, not %.100s", fn, fp4rlpy_kind_name[kind], Py_TYPE(o)->tp_name);
        return NULL;
    }
    fp4rlpy_handle *h = (fp4rlpy_handle *)o;
    /* (a handle that garbage collection drops meanwhile is queued instead: fp4rlpy_finish) */
    if (!h->closed && fp4rlpy_check_free(h, fn, 1) < 0) return NULL;
    if (!h->closed) {
        h->closed = 1;
        if (h->children == 0) fp4rlpy_finish(h);
    }
    Py_RETURN_NONE;
}

static PyObject *fp4rlpy_handle_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    return fp4rlpy_release(self, ((fp4rlpy_handle *)self)->kind, "Handle.close");
}

static PyObject *fp4rlpy_handle_get_kind(PyObject *self, void *unused)
{
    (void)unused;
    return PyUnicode_FromString(fp4rlpy_kind_name[((fp4rlpy_handle *)self)->kind]);
}

static PyObject *fp4rlpy_handle_get_closed(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((fp4rlpy_handle *)self)->closed);
}

static PyObject *fp4rlpy_handle_get_alive(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((fp4rlpy_handle *)self)->ptr != NULL);
}

static PyObject *fp4rlpy_handle_get_children(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromSsize_t(((fp4rlpy_handle *)self)->children);
}

static PyObject *fp4rlpy_handle_get_parents(PyObject *self, void *unused)
{
    (void)unused;
    fp4rlpy_handle *h = (fp4rlpy_handle *)self;
    PyObject *t = PyTuple_New(0);
    for (int i = 0; i < 2 && t; i++)
        if (h->parents[i]) {
            PyObject *one = PyTuple_Pack(1, (PyObject *)h->parents[i]), *cat = one ? PySequence_Concat(t, one) : NULL;
            Py_XDECREF(one);
            Py_DECREF(t);
            t = cat;
        }
    return t;
}

static PyObject *fp4rlpy_handle_get_address(PyObject *self, void *unused)
{
    (void)unused;
    return PyLong_FromVoidPtr(((fp4rlpy_handle *)self)->ptr);
}

static PyObject *fp4rlpy_handle_repr(PyObject *self)
{
    fp4rlpy_handle *h = (fp4rlpy_handle *)self;
    if (!h->ptr) return PyUnicode_FromFormat("<fp4rl %s handle (destroyed)>", fp4rlpy_kind_name[h->kind]);
    return PyUnicode_FromFormat("<fp4rl %s handle %p%s>", fp4rlpy_kind_name[h->kind], h->ptr,
                                h->closed ? " (closed, kept alive by dependents)" : "");
}

static PyMethodDef fp4rlpy_handle_methods[] = {
    {"close", fp4rlpy_handle_close, METH_NOARGS,
     "Destroy the C object now (or, if other handles depend on it, when the last of them goes). Idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fp4rlpy_handle_getset[] = {
    {"kind", fp4rlpy_handle_get_kind, NULL, "'context', 'tensor', 'quant_policy', 'model' or 'rl_session'", NULL},
    {"closed", fp4rlpy_handle_get_closed, NULL, "True once closed (the handle can no longer be passed to fp4rl)", NULL},
    {"alive", fp4rlpy_handle_get_alive, NULL, "True while the C object exists", NULL},
    {"children", fp4rlpy_handle_get_children, NULL, "number of handles that depend on this one", NULL},
    {"parents", fp4rlpy_handle_get_parents, NULL, "the handles this one keeps alive", NULL},
    {"address", fp4rlpy_handle_get_address, NULL, "the C pointer as an int (0 once destroyed), for debugging", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int fp4rlpy_init_handle_type(PyObject *m)
{
    fp4rlpy_handle_type.tp_name = "fp4rl.capi.Handle";
    fp4rlpy_handle_type.tp_doc = "An owned fp4rl C object (context, tensor, quant_policy, model or rl_session).\n\n"
                                 "Made only by the library's create functions; its destruction calls the matching "
                                 "fp4rl_*_destroy exactly once, after every handle that depends on it.";
    fp4rlpy_handle_type.tp_basicsize = sizeof(fp4rlpy_handle);
    fp4rlpy_handle_type.tp_flags = Py_TPFLAGS_DEFAULT;
    fp4rlpy_handle_type.tp_dealloc = (destructor)fp4rlpy_handle_dealloc;
    fp4rlpy_handle_type.tp_repr = fp4rlpy_handle_repr;
    fp4rlpy_handle_type.tp_methods = fp4rlpy_handle_methods;
    fp4rlpy_handle_type.tp_getset = fp4rlpy_handle_getset;
    fp4rlpy_handle_type.tp_weaklistoffset = offsetof(fp4rlpy_handle, weakrefs);
    /* no tp_new: handles come only from the library's create functions */
    if (PyType_Ready(&fp4rlpy_handle_type) < 0) return -1;
    return PyModule_AddObjectRef(m, "Handle", (PyObject *)&fp4rlpy_handle_type);
}

/* ---------------------------------------------------------------------------------------------
 * Buffers (the buffer protocol: numpy arrays, bytes, bytearray, memoryview, array.array, ...)
 * ------------------------------------------------------------------------------------------- */
typedef struct fp4rlpy_buf {
    Py_buffer view; /* view.obj == NULL when none was taken */
    void *ptr;      /* NULL for None */
    Py_ssize_t count; /* elements (bytes when the kind is FP4RLPY_ANY) */
} fp4rlpy_buf;

/* (see fp4rlpy_no_reward) */
static const fp4rlpy_buf fp4rlpy_no_buf = {{0}, NULL, 0};

/* Element kinds a typed buffer must have: a float of `size` bytes, an integer of `size` bytes
 * (either signedness: the library checks values), or anything (raw bytes). */
enum { FP4RLPY_ANY = 0, FP4RLPY_FLOAT = 1, FP4RLPY_INT = 2 };

/* The kind of a PEP 3118 format string of one native-order scalar; -1 for others. */
static int fp4rlpy_format_kind(const char *f)
{
    if (!f) return FP4RLPY_INT; /* no format means unsigned bytes */
    if (*f == '@' || *f == '=' || *f == '<') f++;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "fp4rl's Python binding assumes a little-endian host"
#endif
    if (!f[0] || f[1]) return -1;
    if (strchr("fde", f[0])) return FP4RLPY_FLOAT;
    if (strchr("bBhHiIlLqQnN", f[0])) return FP4RLPY_INT;
    return -1;
}

static const char *fp4rlpy_kind_label(int kind, Py_ssize_t size)
{
    if (kind == FP4RLPY_FLOAT) return size == 4 ? "float32" : size == 8 ? "float64" : "float";
    if (kind == FP4RLPY_INT) return size == 4 ? "int32" : size == 8 ? "64-bit integer" : size == 2 ? "16-bit" : "integer";
    return "any";
}

/* Takes a C-contiguous buffer of `o` (None allowed when `none_ok`) for reading or writing, with
 * elements of `kind` and `size` bytes (or raw bytes of any kind: bytes/bytearray are accepted for
 * every typed buffer when their length is a multiple of `size`). */
static int fp4rlpy_get_buf(PyObject *o, fp4rlpy_buf *b, int writable, int kind, Py_ssize_t size, int none_ok, const char *fn,
                           const char *what)
{
    b->view.obj = NULL;
    b->ptr = NULL;
    b->count = 0;
    if (o == Py_None && none_ok) return 0;
    if (PyObject_GetBuffer(o, &b->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        Py_XDECREF(tb);
        PyObject *s = value ? PyObject_Str(value) : NULL;
        PyErr_Format(PyExc_TypeError, "%s: %s must be a C-contiguous%s buffer (e.g. a numpy array)%s, not %.100s (%s)", fn, what,
                     writable ? " writable" : "", none_ok ? " or None" : "", Py_TYPE(o)->tp_name, s ? PyUnicode_AsUTF8(s) : "");
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(s);
        b->view.obj = NULL;
        return -1;
    }
    const int fk = fp4rlpy_format_kind(b->view.format);
    const int raw = b->view.itemsize == 1 && (!b->view.format || !strcmp(b->view.format, "B") || !strcmp(b->view.format, "b") ||
                                              !strcmp(b->view.format, "c"));
    if (kind != FP4RLPY_ANY && !raw && (fk != kind || b->view.itemsize != size)) {
        fp4rlpy_raise_binding(FP4RL_ERR_DTYPE, "%s: %s must hold %s elements; this buffer has format '%s' with %zd-byte items", fn,
                              what, fp4rlpy_kind_label(kind, size), b->view.format ? b->view.format : "B", b->view.itemsize);
        PyBuffer_Release(&b->view);
        b->view.obj = NULL;
        return -1;
    }
    if (kind != FP4RLPY_ANY && raw && b->view.len % size) {
        fp4rlpy_raise_binding(FP4RL_ERR_SHAPE, "%s: %s has %zd bytes, not a whole number of %zd-byte elements", fn, what,
                              b->view.len, size);
        PyBuffer_Release(&b->view);
        b->view.obj = NULL;
        return -1;
    }
    b->ptr = b->view.buf;
    b->count = kind == FP4RLPY_ANY ? b->view.len : b->view.len / size;
    if (!b->ptr) b->ptr = (void *)&b->view; /* an empty buffer still is not None */
    return 0;
}

static void fp4rlpy_release_buf(fp4rlpy_buf *b)
{
    if (b->view.obj) PyBuffer_Release(&b->view);
    b->view.obj = NULL;
}

/* Bytes per element of a dense dtype, 0 for the others (the library rejects those itself). */
static Py_ssize_t fp4rlpy_dense_size(int dtype)
{
    switch (dtype) {
    case FP4RL_DTYPE_F32:
    case FP4RL_DTYPE_I32: return 4;
    case FP4RL_DTYPE_BF16: return 2;
    default: return 0;
    }
}

/* prod(shape) when every dim is >= 1 and it fits; -1 otherwise (the library then reports it). */
static Py_ssize_t fp4rlpy_numel(int ndim, const int64_t *shape)
{
    if (ndim < 1 || ndim > FP4RL_MAX_DIMS) return -1;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1 || n > INT64_MAX / shape[i] || n * shape[i] > PY_SSIZE_T_MAX / 8) return -1;
        n *= shape[i];
    }
    return (Py_ssize_t)n;
}

#endif
