# Ownership of C handles by Julia objects.
#
# The C rules: a tensor, model or session must be destroyed before its context, a session
# before the model it borrows, and a context is used by one thread at a time.
#
# Julia's garbage collector gives no order between the finalizers of objects that become
# unreachable together (it runs them in reverse registration order on a best-effort basis only),
# and it may run a finalizer on any thread, at any allocation, including one made by a reward
# function while the library is inside fp4rl_rl_session_step. So:
#
#  * Each context-bound handle (Context, Tensor, Model, RLSession) holds Julia references to the
#    handles it depends on (`_parents`) and counts the live handles that depend on it
#    (`children`). Releasing a handle (close or finalizer) marks it `released`; its C object is
#    destroyed only once its `children` count is zero, so the last dependent to go destroys
#    its parents that were released before it. Destroying swaps `ptr` to C_NULL first, so it
#    happens exactly once.
#  * Every call into the library on a handle of a context holds that context's lock
#    (`_with`). A finalizer never blocks: when the lock is held, by another thread or by the
#    very task it interrupted, it re-registers itself and runs at a later collection (the
#    "delay the finalizer" strategy of the Julia manual's section on safe use of finalizers).
#    `children`, `released` and `ptr` are only changed with the lock held.
#
# QuantPolicy does not belong to a context (the library copies policies), so it has no lock
# and no children; see policy.jl.

"A C object owned by a Julia object that belongs to a [`Context`](@ref)."
abstract type Handle end

# Marks the inner constructors that wrap a pointer the library has just returned, so that they
# cannot be mistaken for (or called as) the public constructors.
struct _Wrap end

# Destroys the C object of `h` unless handles that depend on it are alive; then releases its
# parents that were waiting for it. Call with the context's lock held.
function _release_locked!(h::Handle)
    h.released = true
    h.children > 0 && return nothing
    p = h.ptr
    p == C_NULL && return nothing
    h.ptr = C_NULL
    _destroy_c(h, p)
    for parent in _parents(h)
        parent.children -= 1
        parent.released && _release_locked!(parent)
    end
    return nothing
end

# The finalizer of every context-bound handle.
function _finalize(h::Handle)
    l = _context(h).lock
    if islocked(l) || !trylock(l)
        finalizer(_finalize, h)   # in use: try again at a later collection
        return nothing
    end
    try
        h.released || _release_locked!(h)
    finally
        unlock(l)
    end
    return nothing
end

# Registers `h` (just created from a C pointer) with its parents and the collector. Call with
# the context's lock held.
function _adopt!(h::Handle)
    for parent in _parents(h)
        parent.children += 1
    end
    return finalizer(_finalize, h)
end

"""
    close(h)

Releases a `Context`, `QuantPolicy`, `Tensor`, `Model` or `RLSession` now instead of at garbage
collection. Idempotent: the C object is destroyed exactly once however often `close` is called
and whether or not the finalizer runs later. A closed handle can no longer be passed to
functions (that throws an [`FP4RLError`](@ref)).

A handle that others depend on (a context with live tensors, a model with a live session) stays
alive in C until the last of them is released, so those keep working.
"""
function Base.close(h::Handle)
    _with(h) do
        h.released || _release_locked!(h)
    end
    return nothing
end

"""
    destroy!(h)

The same as `close(h)`.
"""
destroy!(h) = close(h)

"`isopen(h)`: `h` has not been closed (nor finalized)."
Base.isopen(h::Handle) = !h.released

# ccall converts a handle to its C pointer through this, and keeps the Julia object rooted
# for the duration of the call.
function Base.unsafe_convert(::Type{Ptr{Cvoid}}, h::Handle)
    h.released && _binding_error("this $(nameof(typeof(h))) has been closed")
    return h.ptr
end

# Runs `f` with the lock of `h`'s context held; every call into the library on a handle of a
# context goes through here.
function _with(f, h)
    ctx = _context(h)
    lock(ctx.lock)
    try
        # The lock is re-entrant, so a reward function running inside step! on this context
        # would get through it; the library is not re-entrant, so stop it here.
        ctx.in_callback && _binding_error("a reward function may not call into fp4rl on the context of the " *
                                          "step that runs it; use another Context for such work")
        return f()
    finally
        unlock(ctx.lock)
    end
end

# The C context of a handle that depends on it. Used where the context is implied (a
# tensor's own context) rather than passed: it is alive as long as `h` is, even when the user
# has closed the Context object. Call with the lock held.
_ctxptr(h::Handle) = (h.released && _binding_error("this $(nameof(typeof(h))) has been closed"); _context(h).ptr)
