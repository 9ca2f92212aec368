# Model: the Qwen2-architecture policy model.
#
# Batches: the C API takes `batch` sequences of `seq_len` tokens row-major [batch, seq_len];
# in Julia that is a (seq_len, batch) matrix, one sequence per column (the same bytes). Token
# ids are the model's ids (0-based vocabulary indices, as in C), not Julia indices.

"""
    Model(ctx, config_json::AbstractString; policy = nothing, seed = 0)

A Qwen2-architecture model from the text of an HF `config.json`, its weights initialised
randomly from `seed` as HF does. `policy` (copied) sets its numerics; `nothing` for the
defaults. A malformed config throws `FP4RL.ERR_CORRUPT` naming the field, another architecture
`FP4RL.ERR_UNSUPPORTED`. See [`from_pretrained`](@ref) to load a checkpoint directory.

Optimizer hyper-parameters: `m[MP_LR] = 1e-3`, `m[MP_LR]`; sizes: `m[MI_VOCAB_SIZE]`.
"""
mutable struct Model <: Handle
    ptr::Ptr{Cvoid}
    released::Bool
    children::Int           # live RLSessions that borrow this model
    const ctx::Context

    Model(ctx::Context, ptr::Ptr{Cvoid}, ::_Wrap) = new(ptr, false, 0, ctx)
end

_context(m::Model) = m.ctx
_parents(m::Model) = (m.ctx,)
_destroy_c(::Model, p::Ptr{Cvoid}) = ccall((:fp4rl_model_destroy, libfp4rl()), Cvoid, (Ptr{Cvoid},), p)

function Model(ctx::Context, config_json::AbstractString; policy::Union{QuantPolicy,Nothing}=nothing, seed::Integer=0)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(ctx) do
        _check(ccall((:fp4rl_model_create, libfp4rl()), Cint,
                     (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Cstring, Ptr{Cvoid}, UInt64),
                     out, ctx, config_json, _policyarg(policy), UInt64(seed)))
        _adopt!(Model(ctx, out[], _Wrap()))
    end
end

"""
    from_pretrained(ctx, dir; policy = nothing) -> Model

A model from a directory as transformers writes it (`fp4rl_model_from_pretrained`):
`dir/config.json`, the weights (`model.safetensors`, or `model.safetensors.index.json` and its
shards) and `dir/generation_config.json` if present, whose eos ids become the default stop
tokens of sessions on the model (see [`stop_tokens`](@ref)).
"""
function from_pretrained(ctx::Context, dir::AbstractString; policy::Union{QuantPolicy,Nothing}=nothing)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(ctx) do
        _check(ccall((:fp4rl_model_from_pretrained, libfp4rl()), Cint, (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Cstring, Ptr{Cvoid}),
                     out, ctx, dir, _policyarg(policy)))
        _adopt!(Model(ctx, out[], _Wrap()))
    end
end

"""
    save_pretrained(m::Model, dir; dtype = DTYPE_F32, max_shard_bytes = 0)

Writes `dir` as transformers' `save_pretrained` does (config.json, generation_config.json, the
weights in F32 or BF16, sharded with an index above `max_shard_bytes`; 0 = one file),
atomically. A target that is not absent, empty or an earlier `save_pretrained`'s is refused.
"""
function save_pretrained(m::Model, dir::AbstractString; dtype::Union{DType,Integer}=DTYPE_F32, max_shard_bytes::Integer=0)
    _with(m) do
        _check(ccall((:fp4rl_model_save_pretrained, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring, Cint, Csize_t),
                     m, dir, _cint(dtype), Csize_t(max_shard_bytes)))
    end
    return m
end

"""
    load!(m::Model, safetensors_path)

Loads every weight from a safetensors file with HF tensor names. A missing or mis-shaped tensor
or a malformed file throws `FP4RL.ERR_CORRUPT` naming it, an unreadable file `FP4RL.ERR_IO`; the
weights are then unchanged. The optimizer state is reset.
"""
function load!(m::Model, path::AbstractString)
    _with(m) do
        _check(ccall((:fp4rl_model_load, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring), m, path))
    end
    return m
end

"""
    save(m::Model, safetensors_path; dtype = DTYPE_F32)

Saves the weights with HF names as F32 or BF16, atomically (a failure never destroys an
existing file).
"""
function save(m::Model, path::AbstractString; dtype::Union{DType,Integer}=DTYPE_F32)
    _with(m) do
        _check(ccall((:fp4rl_model_save, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring, Cint), m, path, _cint(dtype)))
    end
    return path
end

"`set_policy!(m, policy)`: replaces the model's policy with a copy of `policy`."
function set_policy!(m::Model, policy::QuantPolicy)
    _with(m) do
        _check(ccall((:fp4rl_model_set_policy, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Cvoid}), m, policy))
    end
    return m
end

"`set_hparam!(m, param, value)`: sets an optimizer hyper-parameter ([`MParam`](@ref))."
function set_hparam!(m::Model, param::Union{MParam,Integer}, value::Real)
    _with(m) do
        _check(ccall((:fp4rl_model_set_hparam, libfp4rl()), Cint, (Ptr{Cvoid}, Cint, Cdouble),
                     m, _cint(param), Cdouble(value)))
    end
    return m
end

"`hparam(m, param) -> Float64`: an optimizer hyper-parameter ([`MParam`](@ref))."
function hparam(m::Model, param::Union{MParam,Integer})
    v = Ref{Cdouble}(0)
    _with(m) do
        _check(ccall((:fp4rl_model_get_hparam, libfp4rl()), Cint, (Ptr{Cvoid}, Cint, Ref{Cdouble}), m, _cint(param), v))
    end
    return v[]
end

"`model_info(m, key) -> Int64`: a size or counter of the model ([`ModelInfo`](@ref))."
function model_info(m::Model, key::Union{ModelInfo,Integer})
    v = Ref{Int64}(0)
    _with(m) do
        _check(ccall((:fp4rl_model_get_info, libfp4rl()), Cint, (Ptr{Cvoid}, Cint, Ref{Int64}), m, _cint(key), v))
    end
    return v[]
end

Base.getindex(m::Model, p::MParam) = hparam(m, p)
Base.setindex!(m::Model, v::Real, p::MParam) = (set_hparam!(m, p, v); v)
Base.getindex(m::Model, k::ModelInfo) = model_info(m, k)

# ---- batches ----

_ptr_or_null(::Type{T}, ::Nothing) where {T} = Ptr{T}(C_NULL)
_ptr_or_null(::Type{T}, x::Array{T}) where {T} = pointer(x)

# A batch as (tokens::Matrix{Int32} of size (seq_len, batch), lengths::Vector{Int32} or nothing).
# The library reads batch * seq_len tokens and `batch` lengths, so the sizes are checked here,
# where the buffers' sizes are known.
function _batch(tokens::AbstractMatrix{<:Integer}, lengths)
    tok = _host_array(Int32, tokens)
    lengths === nothing && return tok, nothing
    lens = _host_array(Int32, collect(lengths))
    length(lens) == size(tok, 2) ||
        throw(DimensionMismatch("FP4RL.jl: $(length(lens)) lengths for a batch of $(size(tok, 2)) sequences"))
    return tok, lens
end
_batch(tokens::AbstractVector{<:Integer}, lengths) = _batch(reshape(tokens, :, 1), lengths)
function _batch(seqs::AbstractVector{<:AbstractVector{<:Integer}}, lengths)
    lengths === nothing ||
        throw(ArgumentError("FP4RL.jl: a batch given as sequences has their lengths; do not pass lengths too"))
    tok = zeros(Int32, maximum(length, seqs; init=0), length(seqs))
    for (b, s) in enumerate(seqs)
        tok[1:length(s), b] .= s
    end
    return tok, Int32[length(s) for s in seqs]
end

# A loss mask of the batch's size, (seq_len, batch) Float32; sequences of weights are padded with 0.
_mask(::Nothing, T, B) = nothing
function _mask(mask::AbstractMatrix{<:Real}, T, B)
    size(mask) == (T, B) || throw(DimensionMismatch("FP4RL.jl: loss_mask has size $(size(mask)), the batch ($(T), $(B))"))
    return _host_array(Float32, mask)
end
function _mask(mask::AbstractVector{<:AbstractVector{<:Real}}, T, B)
    length(mask) == B || throw(DimensionMismatch("FP4RL.jl: $(length(mask)) loss masks for $(B) sequences"))
    out = zeros(Float32, T, B)
    for (b, w) in enumerate(mask)
        length(w) <= T || throw(DimensionMismatch("FP4RL.jl: loss mask $(b) is longer than the batch"))
        out[1:length(w), b] .= w
    end
    return out
end

"""
    logits(m, tokens; lengths = nothing) -> Array{Float32,3}

Logits of every position, of size `(vocab, seq_len, batch)` (0 past a sequence's length).
`tokens` is a `(seq_len, batch)` integer matrix (right-padded; `lengths` gives each sequence's
length, `nothing` = all `seq_len`), one sequence as a vector, or a vector of sequences of any
lengths (padded for you).
"""
function logits(m::Model, tokens; lengths=nothing)
    tok, lens = _batch(tokens, lengths)
    T, B = size(tok)
    out = Array{Float32}(undef, model_info(m, MI_VOCAB_SIZE), T, B)
    _with(m) do
        GC.@preserve tok lens out begin
            _check(ccall((:fp4rl_model_logits, libfp4rl()), Cint,
                         (Ptr{Cvoid}, Ptr{Int32}, Ptr{Int32}, Int64, Int64, Ptr{Cfloat}, Csize_t),
                         m, pointer(tok), _ptr_or_null(Int32, lens), Int64(B), Int64(T), pointer(out), Csize_t(sizeof(out))))
        end
    end
    return out
end

"""
    token_logprobs(m, tokens; lengths = nothing) -> Matrix{Float32}

`(seq_len, batch)` log-probabilities: entry `(t + 1, b)` is `log p(token t | tokens before it)`
for the 0-based positions 1 <= t < length; 0 at the first position and past the length.
"""
function token_logprobs(m::Model, tokens; lengths=nothing)
    tok, lens = _batch(tokens, lengths)
    T, B = size(tok)
    out = Matrix{Float32}(undef, T, B)
    _with(m) do
        GC.@preserve tok lens out begin
            _check(ccall((:fp4rl_model_token_logprobs, libfp4rl()), Cint,
                         (Ptr{Cvoid}, Ptr{Int32}, Ptr{Int32}, Int64, Int64, Ptr{Cfloat}, Csize_t),
                         m, pointer(tok), _ptr_or_null(Int32, lens), Int64(B), Int64(T), pointer(out), Csize_t(sizeof(out))))
        end
    end
    return out
end

"""
    compute_gradients!(m, tokens; lengths = nothing, loss_mask = nothing) -> Float64

Forward and backward of the next-token loss (the mean of `-log p(target)` over the counted
targets, each weighted by `loss_mask`, `(seq_len, batch)`, `nothing` = 1). Leaves the gradients
in the model ([`get_grad`](@ref)) without updating; returns the loss.
"""
function compute_gradients!(m::Model, tokens; lengths=nothing, loss_mask=nothing)
    tok, lens = _batch(tokens, lengths)
    T, B = size(tok)
    mask = _mask(loss_mask, T, B)
    loss = Ref{Cdouble}(0)
    _with(m) do
        GC.@preserve tok lens mask begin
            _check(ccall((:fp4rl_model_compute_gradients, libfp4rl()), Cint,
                         (Ptr{Cvoid}, Ptr{Int32}, Ptr{Int32}, Ptr{Cfloat}, Int64, Int64, Ref{Cdouble}),
                         m, pointer(tok), _ptr_or_null(Int32, lens), _ptr_or_null(Float32, mask), Int64(B), Int64(T), loss))
        end
    end
    return loss[]
end

"""
    train_step!(m, tokens; lengths = nothing, loss_mask = nothing) -> (loss, grad_norm)

One supervised step: [`compute_gradients!`](@ref), global-norm clipping (`MP_GRAD_CLIP`),
AdamW. Returns the loss and the gradient norm before clipping.
"""
function train_step!(m::Model, tokens; lengths=nothing, loss_mask=nothing)
    tok, lens = _batch(tokens, lengths)
    T, B = size(tok)
    mask = _mask(loss_mask, T, B)
    loss = Ref{Cdouble}(0)
    grad_norm = Ref{Cdouble}(0)
    _with(m) do
        GC.@preserve tok lens mask begin
            _check(ccall((:fp4rl_model_train_step, libfp4rl()), Cint,
                         (Ptr{Cvoid}, Ptr{Int32}, Ptr{Int32}, Ptr{Cfloat}, Int64, Int64, Ref{Cdouble}, Ref{Cdouble}),
                         m, pointer(tok), _ptr_or_null(Int32, lens), _ptr_or_null(Float32, mask), Int64(B), Int64(T),
                         loss, grad_norm))
        end
    end
    return (loss = loss[], grad_norm = grad_norm[])
end

# ---- parameters ----

"`param_names(m) -> Vector{String}`: the HF names of the parameter tensors, in checkpoint order."
function param_names(m::Model)
    n = m[MI_NUM_TENSORS]
    return _with(m) do
        map(0:n-1) do i
            p = ccall((:fp4rl_model_param_name, libfp4rl()), Ptr{UInt8}, (Ptr{Cvoid}, Csize_t), m, Csize_t(i))
            p == C_NULL && throw(ArgumentError("param_names: no parameter $i"))
            unsafe_string(p)
        end
    end
end

"""
    param_shape(m, name) -> Vector{Int64}

The C shape of the parameter with HF name `name` (1 or 2 dims). Its Julia arrays have size
`reverse` of it: `model.layers.0.self_attn.k_proj.weight` of C shape `[kv_dim, hidden]` is a
`(hidden, kv_dim)` Julia matrix, one output row per column.
"""
function param_shape(m::Model, name::AbstractString)
    ndim = Ref{Cint}(0)
    dims = zeros(Int64, 2)   # the library writes at most 2
    _with(m) do
        GC.@preserve dims begin
            _check(ccall((:fp4rl_model_param_shape, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring, Ref{Cint}, Ptr{Int64}),
                         m, name, ndim, pointer(dims)))
        end
    end
    return dims[1:ndim[]]
end

function _param_array(m::Model, name::AbstractString, sym::Symbol)
    dst = Array{Float32}(undef, Tuple(Int.(reverse(param_shape(m, name)))))
    _with(m) do
        GC.@preserve dst begin
            rc = if sym === :param
                ccall((:fp4rl_model_get_param, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring, Ptr{Cfloat}, Csize_t),
                      m, name, pointer(dst), Csize_t(sizeof(dst)))
            else
                ccall((:fp4rl_model_get_grad, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring, Ptr{Cfloat}, Csize_t),
                      m, name, pointer(dst), Csize_t(sizeof(dst)))
            end
            _check(rc)
        end
    end
    return dst
end

"`get_param(m, name) -> Array{Float32}`: a copy of a parameter, Julia size `reverse(param_shape(m, name))`."
get_param(m::Model, name::AbstractString) = _param_array(m, name, :param)

"`get_grad(m, name) -> Array{Float32}`: its gradient from the last backward, same size as `get_param`."
get_grad(m::Model, name::AbstractString) = _param_array(m, name, :grad)

"""
    set_param!(m, name, A)

Sets a parameter from `A`, which must have the parameter's Julia size
`reverse(param_shape(m, name))` (checked, so that a transposed matrix of the right length is
not taken for it).
"""
function set_param!(m::Model, name::AbstractString, A::AbstractArray{<:Real})
    want = Tuple(Int.(reverse(param_shape(m, name))))
    size(A) == want || throw(DimensionMismatch("FP4RL.jl: $(name) has Julia size $(want), got $(size(A))"))
    src = _host_array(Float32, A)
    _with(m) do
        GC.@preserve src begin
            _check(ccall((:fp4rl_model_set_param, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring, Ptr{Cfloat}, Csize_t),
                         m, name, pointer(src), Csize_t(sizeof(src))))
        end
    end
    return m
end

function Base.show(io::IO, m::Model)
    if m.released
        print(io, "FP4RL.Model(closed)")
    else
        print(io, "FP4RL.Model(", model_info(m, MI_NUM_PARAMETERS), " parameters, vocab ", model_info(m, MI_VOCAB_SIZE),
              ", ", model_info(m, MI_NUM_LAYERS), " layers)")
    end
end

"""
    param_tensor(m::Model, name) -> Tensor

A dense F32 view (no copy) of the master weight `name` on the model's device
(`fp4rl_model_param_tensor`): writes through it change the model, optimizer steps show in it. It
keeps the weights' memory alive, so it may outlive `m` (not its context).
"""
function param_tensor(m::Model, name::AbstractString)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    return _with(m) do
        _check(ccall((:fp4rl_model_param_tensor, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring, Ref{Ptr{Cvoid}}), m, name, out))
        _adopt!(Tensor(m.ctx, out[], _Wrap()))
    end
end
