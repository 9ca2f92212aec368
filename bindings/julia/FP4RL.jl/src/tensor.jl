# Tensors, and quantize / dequantize / transpose / matmul on them.
#
# Layout (see the module docstring): a Julia array of size (d1, ..., dn) is the C tensor
# [dn, ..., d1] with the same bytes, so arrays go in and out without a transposing copy, and
# the C tensor's last dimension (the one 1D quantization blocks run along) is the Julia
# array's first, contiguous one.

"""
    Tensor(ctx, A::AbstractArray; dtype = <from eltype(A)>)

A dense tensor in `ctx` holding a copy of `A`. `Float32` (or any float, converted) makes an F32
tensor, `Int32` (or any integer, checked) an I32 tensor, `UInt16` a BF16 tensor of those bit
patterns (`reinterpret(UInt16, x)` of a bfloat16 array). The C shape is `reverse(size(A))`:
a `(K, M)` Julia matrix is the C matrix `[M, K]`.

`Array(t)` copies a dense tensor back (`size(Array(t)) == size(t) == size(A)`), `copyto!(dst, t)`
into an existing array. Quantized tensors come from [`quantize`](@ref) or
[`import_quantized`](@ref); read them with [`dequantize`](@ref), [`codes`](@ref), [`scales`](@ref).
"""
mutable struct Tensor <: Handle
    ptr::Ptr{Cvoid}
    released::Bool
    children::Int           # nothing depends on a tensor; kept for the shared release code
    const ctx::Context
    owner::Any              # `wrap`: the Julia array whose memory the tensor is (kept alive by it)

    Tensor(ctx::Context, ptr::Ptr{Cvoid}, ::_Wrap) = new(ptr, false, 0, ctx, nothing)
end

_context(t::Tensor) = t.ctx
_parents(t::Tensor) = (t.ctx,)
_destroy_c(::Tensor, p::Ptr{Cvoid}) = ccall((:fp4rl_tensor_destroy, libfp4rl()), Cvoid, (Ptr{Cvoid},), p)

# The C shape of a Julia array; and of Julia-order dims (a tuple, a vector or one integer).
_cshape(A::AbstractArray) = Int64[size(A, d) for d in ndims(A):-1:1]
_cdims(dims::Union{Tuple,AbstractVector}) = Int64[dims[d] for d in length(dims):-1:1]
_cdims(dim::Integer) = Int64[dim]

# A dtype argument as a DType when it is one of the enum's values; any other integer stays as
# it is, for the library to reject with its own message.
_as_dtype(d::DType) = d
function _as_dtype(d::Integer)
    for x in instances(DType)
        Integer(x) == d && return x
    end
    return d
end

_dtype_of(::Type{UInt16}) = DTYPE_BF16
_dtype_of(::Type{<:AbstractFloat}) = DTYPE_F32
_dtype_of(::Type{<:Integer}) = DTYPE_I32
_dtype_of(::Type{T}) where {T} = throw(ArgumentError("FP4RL.jl: no tensor dtype for element type $(T)"))

# The Julia element type of a dense dtype; `nothing` for a quantized one.
function _host_eltype(dt::DType)
    dt == DTYPE_F32 && return Float32
    dt == DTYPE_BF16 && return UInt16
    dt == DTYPE_I32 && return Int32
    return nothing
end

# `A` as a contiguous Array{T}: itself when it already is one, else a converted copy. Only
# value-preserving conversions: BF16 data must already be UInt16 bit patterns, since converting
# numbers to UInt16 would silently make wrong bit patterns.
_host_array(::Type{T}, A::Array{T}) where {T} = A
function _host_array(::Type{T}, A::AbstractArray) where {T}
    if T === UInt16 && !(eltype(A) <: UInt16)
        throw(ArgumentError("FP4RL.jl: BF16 tensors take UInt16 bit patterns, got $(eltype(A))"))
    end
    if T === Int32 && !(eltype(A) <: Integer)
        throw(ArgumentError("FP4RL.jl: I32 tensors take integers, got $(eltype(A))"))
    end
    return Array{T}(A)
end

function Tensor(ctx::Context, A::AbstractArray; dtype::Union{DType,Integer,Nothing}=nothing)
    dt = _as_dtype(dtype === nothing ? _dtype_of(eltype(A)) : dtype)
    T = dt isa DType ? _host_eltype(dt) : nothing
    # A quantized or unknown dtype goes to the library as given, which rejects it (before reading
    # the data) with its own message.
    data = T === nothing ? collect(A) : _host_array(T, A)
    shape = _cshape(A)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(ctx) do
        GC.@preserve data shape begin
            _check(ccall((:fp4rl_tensor_from_host, libfp4rl()), Cint,
                         (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Cint, Cint, Ptr{Int64}, Ptr{Cvoid}),
                         out, ctx, _cint(dt), Cint(length(shape)), pointer(shape), pointer(data)))
        end
        _adopt!(Tensor(ctx, out[], _Wrap()))
    end
end

"""
    zeros(ctx::Context, dtype, dims...)

A dense tensor (F32, BF16 or I32) of Julia size `dims` (C shape `reverse(dims)`), all zeros.
"""
function Base.zeros(ctx::Context, dt::Union{DType,Integer}, dims::Integer...)
    shape = _cdims(dims)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(ctx) do
        GC.@preserve shape begin
            _check(ccall((:fp4rl_tensor_zeros, libfp4rl()), Cint,
                         (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Cint, Cint, Ptr{Int64}),
                         out, ctx, _cint(dt), Cint(length(shape)), pointer(shape)))
        end
        _adopt!(Tensor(ctx, out[], _Wrap()))
    end
end
Base.zeros(ctx::Context, dt::Union{DType,Integer}, dims::Tuple{Vararg{Integer}}) = zeros(ctx, dt, dims...)

"`dtype(t) -> DType`"
function dtype(t::Tensor)
    d = _with(t) do
        ccall((:fp4rl_tensor_dtype, libfp4rl()), Cint, (Ptr{Cvoid},), t)
    end
    return DType(d)
end

function Base.ndims(t::Tensor)
    n = _with(t) do
        ccall((:fp4rl_tensor_ndim, libfp4rl()), Cint, (Ptr{Cvoid},), t)
    end
    return Int(n)
end

"""
    cshape(t::Tensor) -> Vector{Int64}

The C shape of `t` (row-major order), `reverse` of `size(t)`.
"""
function cshape(t::Tensor)
    return _with(t) do
        n = ccall((:fp4rl_tensor_ndim, libfp4rl()), Cint, (Ptr{Cvoid},), t)
        Int64[ccall((:fp4rl_tensor_dim, libfp4rl()), Int64, (Ptr{Cvoid}, Cint), t, Cint(i)) for i in 0:n-1]
    end
end

"`size(t)`: the Julia size of `t`, `reverse` of its C shape (see the module docstring)."
Base.size(t::Tensor) = Tuple(Int.(reverse(cshape(t))))
Base.size(t::Tensor, d::Integer) = size(t)[d]

"`length(t)`: the number of elements."
function Base.length(t::Tensor)
    n = _with(t) do
        ccall((:fp4rl_tensor_numel, libfp4rl()), Int64, (Ptr{Cvoid},), t)
    end
    return Int(n)
end

"""
    nbytes(t) -> Int

Bytes of a dense tensor's elements; of a quantized tensor, its codes plus its scales.
"""
function nbytes(t::Tensor)
    n = _with(t) do
        ccall((:fp4rl_tensor_nbytes, libfp4rl()), Csize_t, (Ptr{Cvoid},), t)
    end
    return Int(n)
end

"`context(t) -> Context`: the context `t` lives in (the library's answer, checked against the binding's)."
function context(t::Tensor)
    p = _with(t) do
        ccall((:fp4rl_tensor_context, libfp4rl()), Ptr{Cvoid}, (Ptr{Cvoid},), t)
    end
    p == t.ctx.ptr || error("FP4RL.jl: the library reports another context for this tensor (a binding bug)")
    return t.ctx
end

"""
    copyto!(dst::Array, t::Tensor)

Copies a dense tensor's elements into `dst` (at least `nbytes(t)` bytes; the element type must
be the tensor's: Float32, UInt16 for BF16, Int32). The C row-major order becomes Julia's
column-major order with reversed dimensions, so `dst` of size `size(t)` gets the values in place.
"""
function Base.copyto!(dst::Array, t::Tensor)
    T = _host_eltype(dtype(t))
    if T !== nothing && eltype(dst) !== T
        throw(ArgumentError("FP4RL.jl: a $(dtype(t)) tensor copies into an Array{$(T)}, not Array{$(eltype(dst))}"))
    end
    _with(t) do
        GC.@preserve dst begin
            _check(ccall((:fp4rl_tensor_to_host, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t),
                         t, pointer(dst), Csize_t(sizeof(dst))))
        end
    end
    return dst
end

function Base.Array(t::Tensor)
    T = _host_eltype(dtype(t))
    # A quantized tensor has no dense host form; the library says so (use dequantize).
    dst = T === nothing ? Vector{UInt8}(undef, nbytes(t)) : Array{T}(undef, size(t))
    return copyto!(dst, t)
end

"""
    quant_info(t) -> (tile, codes_bytes, scales_bytes, tensor_scale)

The block layout of a quantized tensor: `tile` (0 = 1D blocks along the C last dimension), the
byte sizes of its codes and scales, and NVFP4's per-tensor decode scale (1.0 otherwise).
"""
function quant_info(t::Tensor)
    tile = Ref{Cint}(0)
    codes_bytes = Ref{Csize_t}(0)
    scales_bytes = Ref{Csize_t}(0)
    tensor_scale = Ref{Cfloat}(0)
    _with(t) do
        _check(ccall((:fp4rl_tensor_quant_info, libfp4rl()), Cint,
                     (Ptr{Cvoid}, Ref{Cint}, Ref{Csize_t}, Ref{Csize_t}, Ref{Cfloat}),
                     t, tile, codes_bytes, scales_bytes, tensor_scale))
    end
    return (tile = Int(tile[]), codes_bytes = Int(codes_bytes[]), scales_bytes = Int(scales_bytes[]),
            tensor_scale = tensor_scale[])
end

"""
    codes(q) -> Vector{UInt8}

The packed codes of a quantized tensor, in the layout of fp4rl.h (C row-major rows of
`ceil(C/2)` bytes for the FP4 formats, element 2k in the low nibble of byte k).
"""
function codes(q::Tensor)
    buf = Vector{UInt8}(undef, quant_info(q).codes_bytes)
    _with(q) do
        GC.@preserve buf begin
            _check(ccall((:fp4rl_tensor_codes_to_host, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t),
                         q, pointer(buf), Csize_t(length(buf))))
        end
    end
    return buf
end

"""
    scales(q) -> Vector{UInt8} or Vector{UInt32}

The scales of a quantized tensor: bytes (E8M0 for MX formats, UE4M3 for NVFP4), or for HiF4 its
32-bit scale words (stored little-endian by the library, returned as host integers).
"""
function scales(q::Tensor)
    buf = Vector{UInt8}(undef, quant_info(q).scales_bytes)
    _with(q) do
        GC.@preserve buf begin
            _check(ccall((:fp4rl_tensor_scales_to_host, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t),
                         q, pointer(buf), Csize_t(length(buf))))
        end
    end
    return dtype(q) == DTYPE_HIF4 ? ltoh.(collect(reinterpret(UInt32, buf))) : buf
end

_bytes(v::Vector{UInt8}) = v
_bytes(v::AbstractVector{UInt8}) = Vector{UInt8}(v)
_bytes(v::AbstractVector{UInt32}) = collect(reinterpret(UInt8, htol.(collect(v))))   # HiF4 words, little-endian

"""
    import_quantized(ctx, dtype, dims, codes, scales; tile = 0, tensor_scale = 1f0)

A quantized tensor of Julia size `dims` (C shape `reverse(dims)`) made from codes and scales in
the layout of fp4rl.h (copied). `scales` are bytes, or for HiF4 also 32-bit words as
[`scales`](@ref) returns them. The library checks the sizes, padding nibbles and NVFP4's
`tensor_scale`, and throws `FP4RL.ERR_CORRUPT` (or another status) with what was wrong.
"""
function import_quantized(ctx::Context, dt::Union{DType,Integer}, dims, codes::AbstractVector, scales::AbstractVector;
                          tile::Integer=0, tensor_scale::Real=1.0f0)
    shape = _cdims(dims)
    cbuf = _bytes(codes)
    sbuf = _bytes(scales)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(ctx) do
        GC.@preserve shape cbuf sbuf begin
            _check(ccall((:fp4rl_tensor_import_quantized, libfp4rl()), Cint,
                         (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Cint, Cint, Ptr{Int64}, Cint, Ptr{Cvoid}, Csize_t, Ptr{Cvoid}, Csize_t, Cfloat),
                         out, ctx, _cint(dt), Cint(length(shape)), pointer(shape), Cint(tile),
                         pointer(cbuf), Csize_t(length(cbuf)), pointer(sbuf), Csize_t(length(sbuf)), Cfloat(tensor_scale)))
        end
        _adopt!(Tensor(ctx, out[], _Wrap()))
    end
end

"""
    dtype_name(d) -> String

The library's name of a dtype (`"f32"`, `"hif4"`, ...); `"unknown"` for a value outside the enum.
"""
dtype_name(d::Union{DType,Integer}) = unsafe_string(ccall((:fp4rl_dtype_name, libfp4rl()), Ptr{UInt8}, (Cint,), _cint(d)))

# The context a call runs in: the one passed, else (when `ctx` is nothing) the one `t` lives in.
_ctx_for(ctx::Union{Context,Nothing}, t::Tensor) = ctx === nothing ? t.ctx : ctx
# Its pointer for the ccall: a passed Context converts itself (and is checked to be open); an
# implied one is taken from the tensor, which keeps it alive.
_ctxarg(ctx::Union{Context,Nothing}, t::Tensor) = ctx === nothing ? _ctxptr(t) : ctx
_policyarg(p::Union{QuantPolicy,Nothing}) = p === nothing ? C_NULL : p

"""
    quantize(src, format; policy = nothing, role = ROLE_WEIGHT, ctx = context of src) -> Tensor

Quantizes a dense F32/BF16 tensor to `format` (`DTYPE_MXFP4`, `DTYPE_NVFP4`, `DTYPE_HIF4`,
`DTYPE_MXFP8_E4M3`) with the tile and rounding `policy` gives `role` (the library's defaults when
`policy` is nothing). Blocks run along the C last dimension, i.e. down the columns of the Julia
array the tensor was made from. A stochastically rounded call advances the context's random
offset by one.
"""
function quantize(src::Tensor, format::Union{DType,Integer}; policy::Union{QuantPolicy,Nothing}=nothing,
                  role::Union{Role,Integer}=ROLE_WEIGHT, ctx::Union{Context,Nothing}=nothing)
    c = _ctx_for(ctx, src)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(c) do
        _check(ccall((:fp4rl_quantize, libfp4rl()), Cint,
                     (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Ptr{Cvoid}, Cint, Ptr{Cvoid}, Cint),
                     out, _ctxarg(ctx, src), src, _cint(format), _policyarg(policy), _cint(role)))
        _adopt!(Tensor(c, out[], _Wrap()))
    end
end

"""
    dequantize(q, dtype = DTYPE_F32; ctx = context of q) -> Tensor

A dense F32 (exact) or BF16 tensor of the same shape as the quantized `q`.
"""
function dequantize(q::Tensor, dt::Union{DType,Integer}=DTYPE_F32; ctx::Union{Context,Nothing}=nothing)
    c = _ctx_for(ctx, q)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(c) do
        _check(ccall((:fp4rl_dequantize, libfp4rl()), Cint, (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Ptr{Cvoid}, Cint),
                     out, _ctxarg(ctx, q), q, _cint(dt)))
        _adopt!(Tensor(c, out[], _Wrap()))
    end
end

"""
    transpose(t::Tensor; ctx = context of t) -> Tensor

The transpose of a 2-dim tensor, as a new tensor. Dense: a plain transpose. 2D-tiled quantized:
a reshuffle of codes and scales. 1D-quantized: `FP4RL.ERR_UNSUPPORTED` (its blocks would have to
run along the other dimension; quantize the transposed source instead).
"""
function Base.transpose(t::Tensor; ctx::Union{Context,Nothing}=nothing)
    c = _ctx_for(ctx, t)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(c) do
        _check(ccall((:fp4rl_tensor_transpose, libfp4rl()), Cint, (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Ptr{Cvoid}),
                     out, _ctxarg(ctx, t), t))
        _adopt!(Tensor(c, out[], _Wrap()))
    end
end

"""
    matmul!(c, a, b; ctx = context of c) -> c

The library's GEMM, `C[M,N] = A[M,K] * B[N,K]^T` in C shapes, into the dense F32/BF16 tensor `c`.
`a` and `b` are dense or quantized (blocks along K). In Julia sizes: `a` is `(K, M)`, `b` is
`(K, N)`, `c` is `(N, M)`, and the result is `transpose(b) * a` of the arrays they hold.
"""
function matmul!(c::Tensor, a::Tensor, b::Tensor; ctx::Union{Context,Nothing}=nothing)
    _with(_ctx_for(ctx, c)) do
        _check(ccall((:fp4rl_matmul, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}),
                     c, _ctxarg(ctx, c), a, b))
    end
    return c
end

"""
    matmul(a, b; dtype = DTYPE_F32, ctx = context of a) -> Tensor

[`matmul!`](@ref) into a new `(N, M)` tensor (Julia size): `transpose(b) * a` in Julia terms,
`A * B^T` in C terms.
"""
function matmul(a::Tensor, b::Tensor; dtype::Union{DType,Integer}=DTYPE_F32, ctx::Union{Context,Nothing}=nothing)
    c = zeros(_ctx_for(ctx, a), dtype, first(cshape(b)), first(cshape(a)))
    return matmul!(c, a, b; ctx=ctx)
end

"""
    quant_error(src, q) -> (rel_mse, underflow_frac, saturated_frac, nan_block_frac)

The quantization error of `q` against its dense source `src` (definitions in fp4rl.h).
"""
function quant_error(src::Tensor, q::Tensor)
    rel_mse = Ref{Cdouble}(0)
    underflow = Ref{Cdouble}(0)
    saturated = Ref{Cdouble}(0)
    nan_blocks = Ref{Cdouble}(0)
    _with(src) do
        _check(ccall((:fp4rl_quant_error, libfp4rl()), Cint,
                     (Ptr{Cvoid}, Ptr{Cvoid}, Ref{Cdouble}, Ref{Cdouble}, Ref{Cdouble}, Ref{Cdouble}),
                     src, q, rel_mse, underflow, saturated, nan_blocks))
    end
    return (rel_mse = rel_mse[], underflow_frac = underflow[], saturated_frac = saturated[], nan_block_frac = nan_blocks[])
end

function Base.show(io::IO, t::Tensor)
    if t.released
        print(io, "FP4RL.Tensor(closed)")
    else
        print(io, "FP4RL.Tensor(", dtype_name(dtype(t)), ", size ", size(t), ")")
    end
end

# ---- zero copy ----
"""
    wrap(ctx::Context, A::Array{T}) where T <: Union{Float32, UInt16, Int32}

A dense tensor on `A`'s own memory, without a copy (`fp4rl_tensor_wrap`): the library reads and
writes `A` in place (F32, BF16 bit patterns, I32; C shape `reverse(size(A))`, as `Tensor(ctx, A)`).
The tensor keeps `A` alive. A CPU context only (a CUDA context refuses host memory); for device
memory (a `CuArray`) use `wrap(ctx, ptr, dtype, dims...; owner)`.
"""
function wrap(ctx::Context, A::Array{T}) where {T<:Union{Float32,UInt16,Int32}}
    t = wrap(ctx, Ptr{Cvoid}(pointer(A)), _dtype_of(T), size(A)...; owner=A)
    return t
end

"""
    wrap(ctx::Context, ptr::Ptr{Cvoid}, dtype, dims...; owner)

A dense tensor on the memory at `ptr` (host memory for a CPU context, device memory of the
context's GPU for a CUDA one), of Julia size `dims` (contiguous), without a copy. `owner` is kept
alive by the tensor: pass the object that owns the memory (a `CuArray`, say).
"""
function wrap(ctx::Context, ptr::Ptr{Cvoid}, dt::Union{DType,Integer}, dims::Integer...; owner)
    shape = _cdims(dims)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(ctx) do
        GC.@preserve shape owner ptr begin
            # release NULL: `owner` is held by the Julia Tensor, whose finalizer destroys the C
            # tensor before `owner` can be collected
            _check(ccall((:fp4rl_tensor_wrap, libfp4rl()), Cint,
                         (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Cint, Cint, Ptr{Int64}, Ptr{Int64}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}),
                         out, ctx, _cint(dt), Cint(length(shape)), pointer(shape), C_NULL, ptr, C_NULL, C_NULL))
        end
        t = _adopt!(Tensor(ctx, out[], _Wrap()))
        t.owner = owner
        t
    end
end

"""
    data_pointer(t::Tensor) -> Ptr{Cvoid}

The address of a dense tensor's elements in its context's device memory (`fp4rl_tensor_data`);
an error for a quantized tensor. Valid while `t` lives.
"""
function data_pointer(t::Tensor)
    p = _with(t) do
        ccall((:fp4rl_tensor_data, libfp4rl()), Ptr{Cvoid}, (Ptr{Cvoid},), t)
    end
    p == C_NULL && throw(FP4RLError(ERR_DTYPE, last_error()))
    return p
end
