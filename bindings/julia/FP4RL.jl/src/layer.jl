# One linear layer in a policy's training numerics (fp4rl_linear_*): the fp4rl model's block
# linear on the caller's tensors, for putting fp4rl's FP4 training numerics into another stack.

"""
    Linear(ctx, policy=nothing; qk=false)

A layer handle computing `y = x w' + b` exactly as an fp4rl model's block linear does in the
training numerics of `policy` (`fp4rl_linear_create`; `qk = true`: a q/k projection, where
`QP_FORMAT_QK` applies). Use [`linear_forward!`](@ref) and [`linear_backward!`](@ref) with dense
F32 tensors of `ctx` (e.g. [`wrap`](@ref)ped Julia arrays, row-major as the C side sees them).
"""
mutable struct Linear <: Handle
    ptr::Ptr{Cvoid}
    released::Bool
    children::Int
    const ctx::Context
    saved::Any   # the last forward's x and w: the backward reads them again

    Linear(ctx::Context, ptr::Ptr{Cvoid}, ::_Wrap) = new(ptr, false, 0, ctx, nothing)
end

_context(l::Linear) = l.ctx
_parents(l::Linear) = (l.ctx,)
_destroy_c(::Linear, p::Ptr{Cvoid}) = ccall((:fp4rl_linear_destroy, libfp4rl()), Cvoid, (Ptr{Cvoid},), p)

function Linear(ctx::Context, policy::Union{QuantPolicy,Nothing}=nothing; qk::Bool=false)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(ctx) do
        pp = policy === nothing ? C_NULL : policy.ptr
        GC.@preserve policy begin
            _check(ccall((:fp4rl_linear_create, libfp4rl()), Cint, (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Ptr{Cvoid}, Cint), out, ctx, pp,
                         qk ? 1 : 0))
        end
        _adopt!(Linear(ctx, out[], _Wrap()))
    end
end

_tptr(t::Union{Tensor,Nothing}) = t === nothing ? C_NULL : t.ptr

"""
    linear_forward!(l::Linear, y, x, w, b=nothing)

`y [N, OUT] = x [N, IN] w [OUT, IN]' + b [OUT]` (`fp4rl_linear_forward`); `x` and `w` must stay
unchanged until the backward (the layer keeps references to them).
"""
function linear_forward!(l::Linear, y::Tensor, x::Tensor, w::Tensor, b::Union{Tensor,Nothing}=nothing)
    _with(l) do
        GC.@preserve y x w b begin
            _check(ccall((:fp4rl_linear_forward, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}), l, y,
                         x, w, _tptr(b)))
        end
        l.saved = (x, w)
    end
    return y
end

"""
    linear_backward!(l::Linear, dy; dx=nothing, dw=nothing, db=nothing)

The last forward's backward for `dy [N, OUT]` (`fp4rl_linear_backward`): `dx`, `dw`, `db`
accumulate (+=); each optional, at least one given.
"""
function linear_backward!(l::Linear, dy::Tensor; dx::Union{Tensor,Nothing}=nothing, dw::Union{Tensor,Nothing}=nothing,
                          db::Union{Tensor,Nothing}=nothing)
    _with(l) do
        GC.@preserve dy dx dw db l begin
            _check(ccall((:fp4rl_linear_backward, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}), l,
                         _tptr(dx), _tptr(dw), _tptr(db), dy))
        end
    end
    return nothing
end
