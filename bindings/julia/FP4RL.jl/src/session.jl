# RLSession: the end-to-end FP4 RL step, with reward functions written in Julia.
#
# Indices: Julia code sees 1-based prompt and completion indices (the prompt's position in the
# batch passed to step!/rollout!); the binding converts them to and from the library's 0-based
# ones. Token ids are the model's ids, unchanged.

"""
    RLSession(model; policy = nothing, stop_tokens = nothing, name = value, ...)

A session that trains `model` with GRPO (rollout in the rollout numerics, rewards, advantages,
TIS-weighted clipped loss, backward in the training numerics, AdamW). `policy` (copied) becomes
the model's policy; `nothing` keeps the model's. The session keeps the model (and its context)
alive. Keywords set hyper-parameters by name, the [`RLParam`](@ref) names in lowercase without
`RL_`: `group_size`, `max_new_tokens`, `temperature`, `top_k`, `lr`, `weight_decay`, `clip_low`,
`clip_high`, `tis_cap`, `kl_coef`, `loss_agg`, `adv_norm`, `minibatches`, `epochs`, `grad_clip`,
`seed`, `allreduce_bf16`, `microbatch_tokens`, `warmup_steps`, `lr_schedule`, `total_steps`, `top_p`. Read and change them later with `s[RL_LR]`, `s[RL_LR] = 1e-4`.

The session's first update starts from a fresh AdamW state.
"""
mutable struct RLSession <: Handle
    ptr::Ptr{Cvoid}
    released::Bool
    children::Int           # nothing depends on a session; kept for the shared release code
    const ctx::Context
    const model::Model      # borrowed by the C session: it must outlive it

    RLSession(ctx::Context, model::Model, ptr::Ptr{Cvoid}, ::_Wrap) = new(ptr, false, 0, ctx, model)
end

_context(s::RLSession) = s.ctx
_parents(s::RLSession) = (s.model, s.ctx)
_destroy_c(::RLSession, p::Ptr{Cvoid}) = ccall((:fp4rl_rl_session_destroy, libfp4rl()), Cvoid, (Ptr{Cvoid},), p)

RLSession(model::Model; kwargs...) = _new_session(nothing, model; kwargs...)
# The C form, with the context passed; the library checks that the model belongs to it.
RLSession(ctx::Context, model::Model; kwargs...) = _new_session(ctx, model; kwargs...)

function _new_session(ctx::Union{Context,Nothing}, model::Model; policy::Union{QuantPolicy,Nothing}=nothing,
                      stop_tokens=nothing, kwargs...)
    c = ctx === nothing ? model.ctx : ctx
    out = Ref{Ptr{Cvoid}}(C_NULL)
    s = _with(c) do
        _check(ccall((:fp4rl_rl_session_create, libfp4rl()), Cint, (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}),
                     out, ctx === nothing ? _ctxptr(model) : ctx, model, _policyarg(policy)))
        _adopt!(RLSession(c, model, out[], _Wrap()))
    end
    stop_tokens === nothing || set_stop_tokens!(s, stop_tokens)
    for (k, v) in kwargs
        setparam!(s, _param_by_name(RLParam, "RL_", k), v)
    end
    return s
end

"`setparam!(s::RLSession, param, value)`: sets a hyper-parameter ([`RLParam`](@ref) or its integer)."
function setparam!(s::RLSession, param::Union{RLParam,Integer}, value::Real)
    _with(s) do
        _check(ccall((:fp4rl_rl_session_set, libfp4rl()), Cint, (Ptr{Cvoid}, Cint, Cdouble), s, _cint(param), Cdouble(value)))
    end
    return s
end

"`getparam(s::RLSession, param) -> Float64`: a hyper-parameter."
function getparam(s::RLSession, param::Union{RLParam,Integer})
    v = Ref{Cdouble}(0)
    _with(s) do
        _check(ccall((:fp4rl_rl_session_get, libfp4rl()), Cint, (Ptr{Cvoid}, Cint, Ref{Cdouble}), s, _cint(param), v))
    end
    return v[]
end

Base.getindex(s::RLSession, p::RLParam) = getparam(s, p)
Base.setindex!(s::RLSession, v::Real, p::RLParam) = (setparam!(s, p, v); v)

"""
    set_stop_tokens!(s, ids)

The stop token ids (copied; may be empty). A completion ends with, and includes, the first.
"""
function set_stop_tokens!(s::RLSession, ids::AbstractVector{<:Integer})
    buf = _host_array(Int32, ids)
    _with(s) do
        GC.@preserve buf begin
            _check(ccall((:fp4rl_rl_session_set_stop_tokens, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Int32}, Csize_t),
                         s, pointer(buf), Csize_t(length(buf))))
        end
    end
    return s
end
set_stop_tokens!(s::RLSession, id::Integer) = set_stop_tokens!(s, [id])

"""
    stop_tokens(s) -> Vector{Int32}

The stop token ids: the model's eos ids for a model from [`from_pretrained`](@ref), until
[`set_stop_tokens!`](@ref) replaces them.
"""
function stop_tokens(s::RLSession)
    n = Ref{Csize_t}(0)
    _with(s) do
        _check(ccall((:fp4rl_rl_session_get_stop_tokens, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Int32}, Csize_t, Ref{Csize_t}),
                     s, C_NULL, Csize_t(0), n))
        buf = Vector{Int32}(undef, n[])
        GC.@preserve buf begin
            _check(ccall((:fp4rl_rl_session_get_stop_tokens, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Int32}, Csize_t, Ref{Csize_t}),
                         s, pointer(buf), Csize_t(length(buf)), n))
        end
        buf
    end
end

# Prompts in the library's CSR form: (tokens::Vector{Int32}, offsets::Vector{Csize_t}) with
# prompt p = tokens[offsets[p]+1 : offsets[p+1]]. Taken from a vector of token vectors, or
# passed through when already in CSR form (0-based offsets, as the C API has them).
function _csr(prompts::AbstractVector{<:AbstractVector{<:Integer}})
    offsets = Vector{Csize_t}(undef, length(prompts) + 1)
    offsets[1] = 0
    for (p, x) in enumerate(prompts)
        offsets[p + 1] = offsets[p] + length(x)
    end
    tokens = Vector{Int32}(undef, Int(offsets[end]))
    k = 1
    for x in prompts, id in x
        tokens[k] = id   # converts with an overflow check
        k += 1
    end
    return tokens, offsets
end
function _csr(csr::Tuple{AbstractVector{<:Integer},AbstractVector{<:Integer}})
    tokens = _host_array(Int32, csr[1])
    offsets = Vector{Csize_t}(csr[2])
    # The library reads tokens up to the last offset; make sure they are there.
    (isempty(offsets) || offsets[end] <= length(tokens)) ||
        throw(DimensionMismatch("FP4RL.jl: the last offset $(offsets[end]) is past the $(length(tokens)) tokens"))
    return tokens, offsets
end

# ---- the reward callback ----
#
# The C library calls `_reward_trampoline` (a plain top-level function, made C-callable by
# @cfunction with fp4rl_reward_fn's exact signature) with the `user` pointer of the step. That
# pointer is the address of a `_RewardBox` holding the Julia function (any closure), which the
# step keeps rooted with GC.@preserve while the library can call back. The trampoline must not
# let a Julia exception unwind through C frames, so it catches everything, stores it in the box
# and returns non-zero; the library then abandons the step (model and optimizer unchanged) with
# FP4RL_ERR_CALLBACK, and step! rethrows it as an FP4RLError carrying the Julia exception.

mutable struct _RewardBox
    const f::Any
    err::Any   # (exception, backtrace) of a failed call, or nothing
end

function _reward_trampoline(user::Ptr{Cvoid}, prompt_index::Csize_t, prompt::Ptr{Int32}, prompt_len::Csize_t,
                            completion::Ptr{Int32}, completion_len::Csize_t, reward::Ptr{Cdouble})::Cint
    box = unsafe_pointer_to_objref(user)::_RewardBox
    try
        # Copies: the library's buffers are only valid during this call, and a reward function may keep its arguments.
        p = copy(unsafe_wrap(Array, prompt, Int(prompt_len)))
        c = copy(unsafe_wrap(Array, completion, Int(completion_len)))
        r = Float64(box.f(Int(prompt_index) + 1, p, c))
        # A NaN or infinite reward is passed on: the library rejects it with its own message
        # ("rewards must be finite") and status FP4RL_ERR_CALLBACK.
        unsafe_store!(reward, r)
        return Cint(0)
    catch e
        box.err = (e, catch_backtrace())
        return Cint(1)
    end
end

_reward_cfunction() = @cfunction(_reward_trampoline, Cint,
                                 (Ptr{Cvoid}, Csize_t, Ptr{Int32}, Csize_t, Ptr{Int32}, Csize_t, Ptr{Cdouble}))

"""
    step!(reward, s, prompts) -> Dict{String,Float64}
    step!(s, prompts) do prompt_index, prompt, completion
        ...   # return the reward
    end

One complete RL step: sync the rollout weights, sample `group_size` completions per prompt,
reward each with `reward(prompt_index, prompt, completion)` (a Julia function or closure;
`prompt_index` is 1-based into `prompts`, `prompt` and `completion` are `Vector{Int32}` copies;
it returns a real number), then GRPO advantages, the trainer's log-probs, the TIS-weighted
clipped loss, backward and AdamW. Returns the step's [`metrics`](@ref).

`prompts` is a vector of token vectors (or a `(tokens, offsets)` CSR pair as in C).

If `reward` throws (or returns NaN or Inf), the step is abandoned with the model and optimizer
exactly as before it, and `step!` throws an [`FP4RLError`](@ref) with status
`FP4RL.ERR_CALLBACK`, the library's message (which completion), and the Julia exception in its
message and `cause`. An `InterruptException` inside `reward` is rethrown as itself. A reward
function must not call into this session's context (it throws if it does).
"""
function step!(reward, s::RLSession, prompts)
    tokens, offsets = _csr(prompts)
    n = Csize_t(max(length(offsets) - 1, 0))
    box = _RewardBox(reward, nothing)
    cb = _reward_cfunction()
    _with(s) do
        s.ctx.in_callback = true
        rc = try
            GC.@preserve box tokens offsets begin
                ccall((:fp4rl_rl_session_step, libfp4rl()), Cint,
                      (Ptr{Cvoid}, Ptr{Int32}, Ptr{Csize_t}, Csize_t, Ptr{Cvoid}, Ptr{Cvoid}),
                      s, pointer(tokens), pointer(offsets), n, cb, pointer_from_objref(box))
            end
        finally
            s.ctx.in_callback = false
        end
        if rc != 0
            if box.err !== nothing && box.err[1] isa InterruptException
                throw(box.err[1])
            end
            _throw_status(rc, box.err)
        end
    end
    return metrics(s)
end

# ---- the split form ----

"""
    rollout!(s, prompts) -> Int

Samples `group_size` completions per prompt (the first half of a step, for trainers that
compute rewards themselves); returns the number of completions. Completion `i` (1-based) belongs
to prompt `(i - 1) ÷ group_size + 1`. Read them with [`completion`](@ref) or
[`completions`](@ref), then call [`set_rewards!`](@ref) and [`train!`](@ref).
"""
function rollout!(s::RLSession, prompts)
    tokens, offsets = _csr(prompts)
    n = Csize_t(max(length(offsets) - 1, 0))
    _with(s) do
        GC.@preserve tokens offsets begin
            _check(ccall((:fp4rl_rl_session_rollout, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Int32}, Ptr{Csize_t}, Csize_t),
                         s, pointer(tokens), pointer(offsets), n))
        end
    end
    return num_completions(s)
end

"`num_completions(s) -> Int`: completions of the current rollout (0 after train!)."
function num_completions(s::RLSession)
    n = Ref{Csize_t}(0)
    _with(s) do
        _check(ccall((:fp4rl_rl_session_num_completions, libfp4rl()), Cint, (Ptr{Cvoid}, Ref{Csize_t}), s, n))
    end
    return Int(n[])
end

"""
    completion(s, i) -> (tokens, logprobs, prompt_index)

Completion `i` (1-based) of the current rollout: its tokens (`Vector{Int32}`, ending with the
stop token when it stopped), their rollout log-probabilities (`Vector{Float32}`), and the
1-based index of its prompt.
"""
function completion(s::RLSession, i::Integer)
    i >= 1 || _binding_error("completion indices start at 1, got $(i)")
    len = Ref{Csize_t}(0)
    pidx = Ref{Csize_t}(0)
    return _with(s) do
        # First the length (the library always writes it), then the data into buffers of that size.
        _check(ccall((:fp4rl_rl_session_completion, libfp4rl()), Cint,
                     (Ptr{Cvoid}, Csize_t, Ptr{Int32}, Ptr{Cfloat}, Csize_t, Ref{Csize_t}, Ref{Csize_t}),
                     s, Csize_t(i - 1), Ptr{Int32}(C_NULL), Ptr{Cfloat}(C_NULL), Csize_t(0), len, pidx))
        tokens = Vector{Int32}(undef, Int(len[]))
        logprobs = Vector{Float32}(undef, Int(len[]))
        GC.@preserve tokens logprobs begin
            _check(ccall((:fp4rl_rl_session_completion, libfp4rl()), Cint,
                         (Ptr{Cvoid}, Csize_t, Ptr{Int32}, Ptr{Cfloat}, Csize_t, Ref{Csize_t}, Ref{Csize_t}),
                         s, Csize_t(i - 1), pointer(tokens), pointer(logprobs), Csize_t(length(tokens)), len, pidx))
        end
        (tokens = tokens, logprobs = logprobs, prompt_index = Int(pidx[]) + 1)
    end
end

"`completions(s)`: every [`completion`](@ref) of the current rollout, in order."
completions(s::RLSession) = [completion(s, i) for i in 1:num_completions(s)]

"`set_rewards!(s, rewards)`: one reward per completion of the current rollout, in order."
function set_rewards!(s::RLSession, rewards::AbstractVector{<:Real})
    buf = _host_array(Float64, rewards)
    _with(s) do
        GC.@preserve buf begin
            _check(ccall((:fp4rl_rl_session_set_rewards, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Cdouble}, Csize_t),
                         s, pointer(buf), Csize_t(length(buf))))
        end
    end
    return s
end

"`train!(s) -> Dict{String,Float64}`: the training half of a step, after set_rewards!; returns the metrics."
function train!(s::RLSession)
    _with(s) do
        _check(ccall((:fp4rl_rl_session_train, libfp4rl()), Cint, (Ptr{Cvoid},), s))
    end
    return metrics(s)
end

# ---- metrics ----

"`metric(s, name) -> Float64`: a metric of the last step (`\"reward/mean\"`, `\"pg/loss\"`, ...)."
function metric(s::RLSession, name::AbstractString)
    v = Ref{Cdouble}(0)
    _with(s) do
        _check(ccall((:fp4rl_rl_session_metric, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring, Ref{Cdouble}), s, name, v))
    end
    return v[]
end

"`metric_names() -> Vector{String}`: the names of every metric, in the library's order."
function metric_names()
    names = String[]
    while true
        p = ccall((:fp4rl_rl_session_metric_name, libfp4rl()), Ptr{UInt8}, (Csize_t,), Csize_t(length(names)))
        p == C_NULL && return names
        push!(names, unsafe_string(p))
    end
end

"`metrics(s) -> Dict{String,Float64}`: every metric of the last step."
metrics(s::RLSession) = Dict(name => metric(s, name) for name in metric_names())

"`metrics_json(s) -> String`: the last step's metrics as the library's JSON object (with `\"step\"`)."
function metrics_json(s::RLSession)
    needed = Ref{Csize_t}(0)
    return _with(s) do
        # Ask for the size first: with no buffer the library reports FP4RL_ERR_SHAPE and the size.
        rc = ccall((:fp4rl_rl_session_metrics_json, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{UInt8}, Csize_t, Ref{Csize_t}),
                   s, Ptr{UInt8}(C_NULL), Csize_t(0), needed)
        rc == 0 || rc == Integer(ERR_SHAPE) || _check(rc)
        buf = Vector{UInt8}(undef, Int(needed[]))
        GC.@preserve buf begin
            _check(ccall((:fp4rl_rl_session_metrics_json, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{UInt8}, Csize_t, Ref{Csize_t}),
                         s, pointer(buf), Csize_t(length(buf)), needed))
            unsafe_string(pointer(buf))
        end
    end
end

"""
    set_metrics_file!(s, path)

Appends each step's metrics JSON as a line to `path`; `nothing` stops.
"""
function set_metrics_file!(s::RLSession, path::Union{AbstractString,Nothing})
    # A NUL inside the path would cut it short in C; Cstring conversion rejects that, so build
    # the C string the same way and fall back to NULL only for `nothing`.
    cpath = path === nothing ? nothing : String(path)
    cpath === nothing || !occursin('\0', cpath) || throw(ArgumentError("FP4RL.jl: a path may not contain NUL"))
    _with(s) do
        GC.@preserve cpath begin
            _check(ccall((:fp4rl_rl_session_set_metrics_file, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{UInt8}),
                         s, cpath === nothing ? Ptr{UInt8}(C_NULL) : pointer(cpath)))
        end
    end
    return s
end

"`step_count(s) -> Int64`: the number of completed steps."
function step_count(s::RLSession)
    n = Ref{Int64}(0)
    _with(s) do
        _check(ccall((:fp4rl_rl_session_step_count, libfp4rl()), Cint, (Ptr{Cvoid}, Ref{Int64}), s, n))
    end
    return n[]
end

# ---- checkpoints ----

"""
    save(s::RLSession, dir)

Saves the full state (weights, optimizer moments, step, random state, policy, hyper-parameters,
stop tokens, config) to the directory `dir`, atomically.
"""
function save(s::RLSession, dir::AbstractString)
    _with(s) do
        _check(ccall((:fp4rl_rl_session_save, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring), s, dir))
    end
    return dir
end

"""
    load!(s::RLSession, dir)

Restores a checkpoint of [`save`](@ref) into the session and its model (same model config).
Resuming continues bit-identically on the CPU. On error nothing changes.
"""
function load!(s::RLSession, dir::AbstractString)
    _with(s) do
        _check(ccall((:fp4rl_rl_session_load, libfp4rl()), Cint, (Ptr{Cvoid}, Cstring), s, dir))
    end
    return s
end

function Base.show(io::IO, s::RLSession)
    if s.released
        print(io, "FP4RL.RLSession(closed)")
    else
        print(io, "FP4RL.RLSession(", step_count(s), " steps, group_size ", Int(getparam(s, RL_GROUP_SIZE)), ")")
    end
end
