"""
    FP4RL

Julia binding of libfp4rl, the C library for end-to-end FP4 RL post-training of LLMs.

Every function of the C ABI (`abi/include/fp4rl/fp4rl.h`) is reached through a `ccall` in
this package; nothing of the library's logic is re-implemented here. The binding adds what a
Julia user expects on top of the C calls:

  * handles (`Context`, `QuantPolicy`, `Tensor`, `Model`, `RLSession`) are Julia objects that
    free their C object exactly once, by `close` or by the garbage collector;
  * a failing call throws [`FP4RLError`](@ref) with the C status and `fp4rl_last_error()`'s text;
  * Julia arrays go in and come out (see "Array layout" below);
  * reward functions are Julia functions or closures.

# Array layout

C tensors and batches are row-major; Julia arrays are column-major. The binding passes memory
through unchanged, which reverses the order of the dimensions: a Julia array of size
`(d1, d2, ..., dn)` is the C tensor of shape `[dn, ..., d2, d1]`. So

  * a Julia matrix `A` of size `(K, M)` is the C matrix `[M, K]`: each Julia column is a C row,
    and quantization blocks (which run along C's last dimension) run down Julia columns;
  * a batch of token sequences is a Julia matrix of size `(seq_len, batch)`, one sequence per
    column; logits come back as `(vocab, seq_len, batch)`;
  * `size(t)` of a `Tensor` is the Julia size; `cshape(t)` is the C shape, `reverse` of it.

`permutedims` gives the other orientation when a computation needs it.

# Library

The shared library is `ENV["FP4RL_LIB"]` when that is set (a path or a name), else `libfp4rl`
on the dynamic loader's path; see [`libfp4rl`](@ref).
"""
module FP4RL

using Libdl

export Context, QuantPolicy, Tensor, Model, RLSession, FP4RLError
export destroy!, cshape, nbytes, dtype, set_seed!, rng_state, set_rng_offset!
export memory, reset_peak_memory!
export wrap, data_pointer, set_stream!, param_tensor
export Linear, linear_forward!, linear_backward!
export nccl_unique_id, distributed_context
# device and context are not exported: CUDA.jl exports a `device` too; use FP4RL.device(ctx).
export quant_info, codes, scales, import_quantized, quantize, dequantize, matmul, matmul!, quant_error
export setparam!, getparam, apply_preset!, qparam_name, dtype_name, status_name, last_error
export version_number, version_string, library_version
export from_pretrained, save_pretrained, load!, save, set_policy!, set_hparam!, hparam, model_info
export logits, token_logprobs, compute_gradients!, train_step!, param_names, param_shape, get_param, get_grad, set_param!
export set_stop_tokens!, stop_tokens, step!, rollout!, num_completions, completion, completions, set_rewards!, train!
export metric, metric_names, metrics, metrics_json, set_metrics_file!, step_count
# The enum types; their values are exported too, except Status's (OK, ERR_*), which are
# spelled FP4RL.ERR_SHAPE etc. so that `OK` does not land in the user's namespace.
export Status, Device, DType, ScaleRule, Rounding, Numerics, ResQ, Role, QParam, Preset, MParam, ModelInfo, RLParam

include("library.jl")
include("enums.jl")
include("errors.jl")
include("handles.jl")
include("context.jl")
include("policy.jl")
include("tensor.jl")
include("model.jl")
include("session.jl")
include("layer.jl")

for T in (Device, DType, ScaleRule, Rounding, Numerics, ResQ, Role, QParam, Preset, MParam, ModelInfo, RLParam)
    for x in instances(T)
        @eval export $(Symbol(x))
    end
end

function __init__()
    # Resolve the library in the running process: a path saved in the precompile cache would
    # ignore the FP4RL_LIB of this session.
    _LIBPATH[] = ""
    return nothing
end

end # module
