# The error type, and turning a C status into it.

"""
    FP4RLError(status::Status, message::String)

Thrown when a call into libfp4rl fails. `status` is the C status (`FP4RL.ERR_SHAPE`, ...) and
`message` is `fp4rl_last_error()`'s text, exactly as the C API gives it. When a Julia reward
function threw inside [`step!`](@ref), `status` is `FP4RL.ERR_CALLBACK`, `message` ends with the
Julia exception's text, and `cause` holds `(exception, backtrace)` of the original error.

Errors made by the binding itself before any C call (using a closed handle, calling into a
context from a reward function running in it) are `FP4RLError`s with
`FP4RL.ERR_INVALID_ARGUMENT` and a message that starts with "FP4RL.jl:".
"""
struct FP4RLError <: Exception
    status::Status
    message::String
    cause::Any   # (exception, backtrace) from a Julia callback, or nothing
end
FP4RLError(status::Status, message::AbstractString) = FP4RLError(status, String(message), nothing)

function Base.showerror(io::IO, e::FP4RLError)
    print(io, "FP4RLError(", e.status, "): ", e.message)
    if e.cause !== nothing
        ex, bt = e.cause
        print(io, "\n\nThe exception inside the Julia callback was:\n")
        showerror(io, ex, bt)
    end
    return nothing
end

# The Status of a C return value; a value outside the enum (a newer library) is reported as
# ERR_INTERNAL rather than letting the enum constructor throw an unrelated error.
function _status(rc::Integer)
    for s in instances(Status)
        Integer(s) == rc && return s
    end
    return ERR_INTERNAL
end

# Throws the FP4RLError of a failed call. Call it directly after the ccall, with no yield
# point in between: fp4rl_last_error() is per OS thread, and a Julia task can move to another
# thread only when it yields.
@inline function _check(rc::Cint)
    rc == 0 || _throw_status(rc, nothing)
    return nothing
end

@noinline function _throw_status(rc::Cint, cause)
    msg = last_error()
    st = _status(rc)
    if st == ERR_INTERNAL && Integer(ERR_INTERNAL) != rc
        msg = "status $(rc) (unknown to this binding): " * msg
    end
    if cause !== nothing
        msg *= "\nthe Julia reward function threw: " * sprint(showerror, cause[1])
    end
    throw(FP4RLError(st, msg, cause))
end

# An error of the binding itself, before any C call.
_binding_error(msg::AbstractString) = throw(FP4RLError(ERR_INVALID_ARGUMENT, "FP4RL.jl: " * msg))

"""
    status_name(s) -> String

`"FP4RL_OK"`, `"FP4RL_ERR_SHAPE"`, ...; `"FP4RL_STATUS_UNKNOWN"` for a value outside the enum.
"""
status_name(s::Union{Status,Integer}) =
    unsafe_string(ccall((:fp4rl_status_name, libfp4rl()), Ptr{UInt8}, (Cint,), _cint(s)))
