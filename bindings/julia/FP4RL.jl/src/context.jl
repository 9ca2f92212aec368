# Context: a device, its memory and its random-number state.

"""
    Context(device = DEVICE_CPU, ordinal = 0)

A libfp4rl context on `device` (`DEVICE_CPU` or `DEVICE_CUDA`); `ordinal` picks the GPU. A CUDA
context throws an [`FP4RLError`](@ref) with `FP4RL.ERR_DEVICE` on a machine without a usable GPU
and `FP4RL.ERR_UNSUPPORTED` with a library built without CUDA. A new context has seed 0 and
random offset 0.

Tensors, models and sessions belong to a context and keep it alive. The binding serialises
calls on one context with a lock, so sharing a context between tasks is safe but not parallel;
use one context per thread for parallel work.
"""
mutable struct Context <: Handle
    ptr::Ptr{Cvoid}
    released::Bool          # closed or finalized; the C context lives until `children` is 0
    children::Int           # live Tensors, Models and RLSessions of this context
    in_callback::Bool       # a reward function of a step on this context is running
    const lock::ReentrantLock

    function Context(device::Union{Device,Integer}=DEVICE_CPU, ordinal::Integer=0)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        rc = ccall((:fp4rl_context_create, libfp4rl()), Cint, (Ref{Ptr{Cvoid}}, Cint, Cint),
                   out, _cint(device), Cint(ordinal))
        _check(rc)
        return finalizer(_finalize, new(out[], false, 0, false, ReentrantLock()))
    end

    function Context(ordinal::Integer, rank::Integer, world_size::Integer, id::AbstractVector{UInt8})
        out = Ref{Ptr{Cvoid}}(C_NULL)
        bytes = Vector{UInt8}(id)
        rc = GC.@preserve bytes ccall((:fp4rl_context_create_distributed, libfp4rl()), Cint,
                                      (Ref{Ptr{Cvoid}}, Cint, Cint, Cint, Ptr{Cvoid}, Csize_t),
                                      out, Cint(ordinal), Cint(rank), Cint(world_size), pointer(bytes),
                                      Csize_t(length(bytes)))
        _check(rc)
        return finalizer(_finalize, new(out[], false, 0, false, ReentrantLock()))
    end
end

"""
    nccl_unique_id() -> Vector{UInt8}

A new NCCL unique id ([`NCCL_UNIQUE_ID_BYTES`](@ref) bytes), made on rank 0 of a multi-GPU job;
carry its bytes to every rank with the job's own means (MPI, a file) and pass them to
[`distributed_context`](@ref). Throws `FP4RL.ERR_UNSUPPORTED` without NCCL.
"""
function nccl_unique_id()
    id = zeros(UInt8, NCCL_UNIQUE_ID_BYTES)
    GC.@preserve id begin
        _check(ccall((:fp4rl_nccl_unique_id, libfp4rl()), Cint, (Ptr{Cvoid}, Csize_t), pointer(id), Csize_t(length(id))))
    end
    return id
end

"""
    distributed_context(ordinal, rank, world_size, id) -> Context

A CUDA context on GPU `ordinal` that joins the communicator of `world_size` ranks named by the
NCCL unique id `id` (from [`nccl_unique_id`](@ref) on rank 0) as `rank` (0-based). Blocks until
every rank has joined. Its RL sessions train data-parallel: every rank passes the same global
prompts to [`step!`](@ref); see the C header for the split.
"""
distributed_context(ordinal::Integer, rank::Integer, world_size::Integer, id::AbstractVector{UInt8}) =
    Context(ordinal, rank, world_size, id)

"`rank(ctx) -> (rank = Int, world_size = Int)`: the context's rank (0-based) and world size (0 and 1 for a plain context)."
function rank(ctx::Context)
    r = Ref{Cint}(0)
    w = Ref{Cint}(1)
    _with(ctx) do
        _check(ccall((:fp4rl_context_get_rank, libfp4rl()), Cint, (Ptr{Cvoid}, Ref{Cint}, Ref{Cint}), ctx, r, w))
    end
    return (rank = Int(r[]), world_size = Int(w[]))
end

_context(c::Context) = c
_parents(::Context) = ()
_destroy_c(::Context, p::Ptr{Cvoid}) = ccall((:fp4rl_context_destroy, libfp4rl()), Cvoid, (Ptr{Cvoid},), p)

"`device(ctx)`: the [`Device`](@ref) of a context."
function device(ctx::Context)
    d = _with(ctx) do
        ccall((:fp4rl_context_device, libfp4rl()), Cint, (Ptr{Cvoid},), ctx)
    end
    return Device(d)
end

"""
    set_seed!(ctx, seed)

Sets the seed of stochastic rounding and resets the random offset to 0.
"""
function set_seed!(ctx::Context, seed::Integer)
    _with(ctx) do
        _check(ccall((:fp4rl_context_set_seed, libfp4rl()), Cint, (Ptr{Cvoid}, UInt64), ctx, UInt64(seed)))
    end
    return ctx
end

"""
    rng_state(ctx) -> (seed = UInt64, offset = UInt64)

The random state: the seed, and the offset the next stochastic quantization will use (each one
uses the current offset and advances it by one, so a run is replayable from the pair).
"""
function rng_state(ctx::Context)
    seed = Ref{UInt64}(0)
    offset = Ref{UInt64}(0)
    _with(ctx) do
        _check(ccall((:fp4rl_context_get_rng, libfp4rl()), Cint, (Ptr{Cvoid}, Ref{UInt64}, Ref{UInt64}),
                     ctx, seed, offset))
    end
    return (seed = seed[], offset = offset[])
end

"`set_rng_offset!(ctx, offset)`: sets the offset the next stochastic quantization uses."
function set_rng_offset!(ctx::Context, offset::Integer)
    _with(ctx) do
        _check(ccall((:fp4rl_context_set_rng_offset, libfp4rl()), Cint, (Ptr{Cvoid}, UInt64), ctx, UInt64(offset)))
    end
    return ctx
end

"""
    memory(ctx) -> (in_use = Int, peak = Int, reserved = Int)

Bytes of the context's device memory held by fp4rl: in use now, the high-water mark, and what its
caching allocator holds (equal to in_use on the CPU).
"""
function memory(ctx::Context)
    u = Ref{Csize_t}(0)
    p = Ref{Csize_t}(0)
    r = Ref{Csize_t}(0)
    _with(ctx) do
        _check(ccall((:fp4rl_context_memory, libfp4rl()), Cint, (Ptr{Cvoid}, Ref{Csize_t}, Ref{Csize_t}, Ref{Csize_t}),
                     ctx, u, p, r))
    end
    return (in_use = Int(u[]), peak = Int(p[]), reserved = Int(r[]))
end

"`reset_peak_memory!(ctx)`: sets the peak of [`memory`](@ref) to the bytes in use now."
function reset_peak_memory!(ctx::Context)
    _with(ctx) do
        _check(ccall((:fp4rl_context_reset_peak_memory, libfp4rl()), Cint, (Ptr{Cvoid},), ctx))
    end
    return ctx
end

function Base.show(io::IO, ctx::Context)
    if ctx.released
        print(io, "FP4RL.Context(closed)")
    else
        print(io, "FP4RL.Context(", device(ctx), ")")
    end
end

"""
    set_stream!(ctx::Context, stream::Ptr{Cvoid})

Orders all of the context's later work on `stream` (a `cudaStream_t`, e.g. CUDA.jl's
`CUDA.stream().handle` converted with `Ptr{Cvoid}`; `C_NULL` = the context's own stream), after
its earlier work (`fp4rl_context_set_stream`). The stream must stay valid while set. A CPU
context takes `C_NULL` only.
"""
function set_stream!(ctx::Context, stream::Ptr{Cvoid})
    _with(ctx) do
        GC.@preserve stream begin  # a bits value: nothing to root, but the checker wants every pointer here
            _check(ccall((:fp4rl_context_set_stream, libfp4rl()), Cint, (Ptr{Cvoid}, Ptr{Cvoid}), ctx, stream))
        end
    end
    return ctx
end
