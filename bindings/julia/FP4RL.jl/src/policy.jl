# QuantPolicy: what is quantized how.

"""
    QuantPolicy(preset = nothing; name = value, ...)

A quantization policy. Starts from the library's plain defaults (1D blocks, OCP floor, nearest
rounding, MXFP4, FP4 training, W4A4 rollout), then applies `preset` (a [`Preset`](@ref)) if
given, then each keyword: the keywords are the parameter names of `qparam_name`
(`tile_weight`, `rounding_gradient`, `format_qk`, `train_numerics`, `resq`, ...), the values
integers or enum values:

    QuantPolicy(PRESET_HIF4_RL; train_numerics = NUMERICS_FP4, resq = RESQ_2_4)
    QuantPolicy(; format_weight = DTYPE_NVFP4, tile_weight = 16)

Read and change single parameters with `p[QP_TILE_WEIGHT]`, `p[QP_TILE_WEIGHT] = 32` (or
[`getparam`](@ref), [`setparam!`](@ref), which also take plain integers). Models and sessions
copy a policy when they are given one, so a policy can be changed or closed afterwards.
"""
mutable struct QuantPolicy
    ptr::Ptr{Cvoid}

    function QuantPolicy(preset::Union{Preset,Integer,Nothing}=nothing; kwargs...)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        _check(ccall((:fp4rl_quant_policy_create, libfp4rl()), Cint, (Ref{Ptr{Cvoid}},), out))
        p = finalizer(_destroy_policy!, new(out[]))
        preset === nothing || apply_preset!(p, preset)
        for (k, v) in kwargs
            setparam!(p, _param_by_name(QParam, "QP_", k), v)
        end
        return p
    end
end

# A policy is not tied to a context and the library only reads it during a call, so its
# finalizer can free it directly: it runs only once the policy is unreachable, when no call can
# be using it.
function _destroy_policy!(p::QuantPolicy)
    ptr = p.ptr
    ptr == C_NULL && return nothing
    p.ptr = C_NULL
    ccall((:fp4rl_quant_policy_destroy, libfp4rl()), Cvoid, (Ptr{Cvoid},), ptr)
    return nothing
end

Base.close(p::QuantPolicy) = _destroy_policy!(p)
Base.isopen(p::QuantPolicy) = p.ptr != C_NULL

function Base.unsafe_convert(::Type{Ptr{Cvoid}}, p::QuantPolicy)
    p.ptr == C_NULL && _binding_error("this QuantPolicy has been closed")
    return p.ptr
end

# A value of a policy parameter: an integer, or an enum value (a format, numerics, ...).
_qvalue(v::Enum) = Int64(Integer(v))
_qvalue(v::Integer) = Int64(v)

"""
    setparam!(p::QuantPolicy, param, value)

Sets one parameter (`param` a [`QParam`](@ref) or its integer). An unknown parameter or a value
out of range throws `FP4RL.ERR_INVALID_ARGUMENT` naming the parameter and the allowed values;
the policy is then unchanged.
"""
function setparam!(p::QuantPolicy, param::Union{QParam,Integer}, value::Union{Integer,Enum})
    _check(ccall((:fp4rl_quant_policy_set, libfp4rl()), Cint, (Ptr{Cvoid}, Cint, Int64),
                 p, _cint(param), _qvalue(value)))
    return p
end

"`getparam(p::QuantPolicy, param) -> Int64`: the value of one parameter."
function getparam(p::QuantPolicy, param::Union{QParam,Integer})
    v = Ref{Int64}(0)
    _check(ccall((:fp4rl_quant_policy_get, libfp4rl()), Cint, (Ptr{Cvoid}, Cint, Ref{Int64}), p, _cint(param), v))
    return v[]
end

Base.getindex(p::QuantPolicy, param::QParam) = getparam(p, param)
Base.setindex!(p::QuantPolicy, value, param::QParam) = (setparam!(p, param, value); value)

"`apply_preset!(p, preset)`: resets every parameter to a named recipe ([`Preset`](@ref))."
function apply_preset!(p::QuantPolicy, preset::Union{Preset,Integer})
    _check(ccall((:fp4rl_quant_policy_apply_preset, libfp4rl()), Cint, (Ptr{Cvoid}, Cint), p, _cint(preset)))
    return p
end

"""
    qparam_name(param) -> Union{String,Nothing}

The library's name of a policy parameter (`"tile_weight"`, ...), the keyword of
[`QuantPolicy`](@ref); `nothing` for an unknown one.
"""
function qparam_name(param::Union{QParam,Integer})
    s = ccall((:fp4rl_qparam_name, libfp4rl()), Ptr{UInt8}, (Cint,), _cint(param))
    return s == C_NULL ? nothing : unsafe_string(s)
end

function Base.show(io::IO, p::QuantPolicy)
    if p.ptr == C_NULL
        print(io, "FP4RL.QuantPolicy(closed)")
        return
    end
    print(io, "FP4RL.QuantPolicy(")
    join(io, (string(qparam_name(q), " = ", getparam(p, q)) for q in instances(QParam)), ", ")
    print(io, ")")
end
