# The C enums and integer constants of fp4rl.h, with their exact C values.
#
# Every name is the C name without its "FP4RL_" prefix (FP4RL_DTYPE_HIF4 -> DTYPE_HIF4).
# Values are written out rather than left implicit so that tests/check_julia_binding.py can
# compare each one with the header, and so that a reordering in the header cannot silently
# shift them. The base type is Cint because the C enums are passed as int.

const VERSION_MAJOR = 0
const VERSION_MINOR = 1
const VERSION_PATCH = 0
# The header this binding was written against; compare with version_number().
const VERSION_NUMBER = 100
const MAX_DIMS = 8
const QP_COUNT = 15
const MP_COUNT = 9
const RL_PARAM_COUNT = 22
# Bytes of an NCCL unique id ([`nccl_unique_id`](@ref)).
const NCCL_UNIQUE_ID_BYTES = 128

"Status of a call (`fp4rl_status`); [`FP4RLError`](@ref) carries one."
@enum Status::Cint begin
    OK = 0
    ERR_INVALID_ARGUMENT = 1   # a NULL pointer, an out-of-range value
    ERR_SHAPE = 2              # dims that do not fit together, or whose size overflows
    ERR_DTYPE = 3              # a dtype this function does not take
    ERR_UNSUPPORTED = 4        # valid, but not implemented for this case
    ERR_OUT_OF_MEMORY = 5
    ERR_DEVICE = 6             # no such device, or a device error (the context is then unusable)
    ERR_IO = 7                 # a file could not be read or written
    ERR_CORRUPT = 8            # a file or buffer is malformed
    ERR_CALLBACK = 9           # a user callback (a reward function) failed
    ERR_INTERNAL = 10          # a bug in fp4rl
end

"Where a [`Context`](@ref) computes (`fp4rl_device`)."
@enum Device::Cint begin
    DEVICE_CPU = 0
    DEVICE_CUDA = 1
end

"Element type of a [`Tensor`](@ref) (`fp4rl_dtype`): dense F32/BF16/I32 or a quantized format."
@enum DType::Cint begin
    DTYPE_F32 = 0
    DTYPE_BF16 = 1         # bfloat16 bit patterns, held in Julia as UInt16
    DTYPE_I32 = 2
    DTYPE_MXFP4 = 3
    DTYPE_NVFP4 = 4
    DTYPE_HIF4 = 5
    DTYPE_MXFP8_E4M3 = 6
end

"Shared-exponent rule of the MX formats (`fp4rl_scale_rule`)."
@enum ScaleRule::Cint begin
    SCALE_OCP_FLOOR = 0
    SCALE_TRUNCATION_FREE = 1
end

"Rounding of a quantization (`fp4rl_rounding`)."
@enum Rounding::Cint begin
    ROUND_NEAREST = 0
    ROUND_STOCHASTIC = 1
end

"GEMM operand numerics of training and of the rollout (`fp4rl_numerics`)."
@enum Numerics::Cint begin
    NUMERICS_BF16 = 0
    NUMERICS_FP4 = 1
    NUMERICS_W4A16 = 2
    NUMERICS_W16A4 = 3
    NUMERICS_W4A4 = 4
    NUMERICS_FP32 = 5
end

"Rollout-ResQ pattern (`fp4rl_resq`)."
@enum ResQ::Cint begin
    RESQ_OFF = 0
    RESQ_DENSE = 1
    RESQ_2_4 = 2
    RESQ_CHANNEL_50 = 3
    RESQ_BLOCK_50 = 4
end

"Role of a GEMM operand (`fp4rl_role`)."
@enum Role::Cint begin
    ROLE_WEIGHT = 0
    ROLE_ACTIVATION = 1
    ROLE_GRADIENT = 2
end

"Parameter of a [`QuantPolicy`](@ref) (`fp4rl_qparam`); its keyword name is `qparam_name(p)`."
@enum QParam::Cint begin
    QP_TILE_WEIGHT = 0
    QP_TILE_ACTIVATION = 1
    QP_TILE_GRADIENT = 2
    QP_SCALE_RULE = 3
    QP_ROUNDING_WEIGHT = 4
    QP_ROUNDING_ACTIVATION = 5
    QP_ROUNDING_GRADIENT = 6
    QP_SEED = 7
    QP_FORMAT_WEIGHT = 8
    QP_FORMAT_ACTIVATION = 9
    QP_FORMAT_GRADIENT = 10
    QP_FORMAT_QK = 11
    QP_TRAIN_NUMERICS = 12
    QP_ROLLOUT_NUMERICS = 13
    QP_RESQ = 14
end

"Named recipe of a [`QuantPolicy`](@ref) (`fp4rl_preset`)."
@enum Preset::Cint begin
    PRESET_DEFAULT = 0
    PRESET_STABLE_2D_MXFP4 = 1
    PRESET_HIF4_RL = 2
end

"Optimizer hyper-parameter of a [`Model`](@ref) (`fp4rl_mparam`)."
@enum MParam::Cint begin
    MP_LR = 0
    MP_WEIGHT_DECAY = 1
    MP_BETA1 = 2
    MP_BETA2 = 3
    MP_ADAM_EPS = 4
    MP_GRAD_CLIP = 5
    MP_MICROBATCH_TOKENS = 6 # tokens per micro-batch of a pass; 0 = automatic from the free device memory
    MP_RECOMPUTE = 7 # 1 = recompute block activations in the backward; 0 = only when memory requires it
    MP_OPTIMIZER_MOMENTS = 8 # AdamW moments: 0 = FP32, 1 = BF16 with stochastic rounding (setting it converts them)
end

"Size or counter of a [`Model`](@ref) (`fp4rl_model_info`)."
@enum ModelInfo::Cint begin
    MI_VOCAB_SIZE = 0
    MI_HIDDEN_SIZE = 1
    MI_INTERMEDIATE_SIZE = 2
    MI_NUM_LAYERS = 3
    MI_NUM_HEADS = 4
    MI_NUM_KV_HEADS = 5
    MI_HEAD_DIM = 6
    MI_MAX_POSITIONS = 7
    MI_TIED_EMBEDDINGS = 8
    MI_NUM_PARAMETERS = 9
    MI_STEP = 10
    MI_NUM_TENSORS = 11
end

"Hyper-parameter of an [`RLSession`](@ref) (`fp4rl_rlparam`); keyword name: lowercase without `RL_`."
@enum RLParam::Cint begin
    RL_GROUP_SIZE = 0
    RL_MAX_NEW_TOKENS = 1
    RL_TEMPERATURE = 2
    RL_TOP_K = 3
    RL_LR = 4
    RL_WEIGHT_DECAY = 5
    RL_CLIP_LOW = 6
    RL_CLIP_HIGH = 7
    RL_TIS_CAP = 8
    RL_KL_COEF = 9
    RL_LOSS_AGG = 10
    RL_ADV_NORM = 11
    RL_MINIBATCHES = 12
    RL_EPOCHS = 13
    RL_GRAD_CLIP = 14
    RL_SEED = 15
    RL_ALLREDUCE_BF16 = 16   # distributed contexts: gradients all-reduced in BF16 (1) or FP32 (0)
    RL_MICROBATCH_TOKENS = 17 # tokens per micro-batch of the trainer's passes; 0 = automatic
    RL_WARMUP_STEPS = 18 # learning-rate warm-up in optimizer updates [0]
    RL_LR_SCHEDULE = 19 # 0 = constant [0], 1 = linear, 2 = cosine decay after the warm-up
    RL_TOTAL_STEPS = 20 # total optimizer updates of a linear / cosine schedule [0]
    RL_TOP_P = 21 # nucleus sampling, (0, 1] [1 = off]; rollout and trainer log-probs both truncated
end

# An enum value or a plain integer as the C int of a parameter. Plain integers are accepted so
# that out-of-range values reach the library, which rejects them with its own message.
_cint(x::Enum) = Cint(Integer(x))
_cint(x::Integer) = Cint(x)

# The enum value of `name` (a keyword such as :group_size) among the values of T whose names
# start with `prefix`; the keyword spelling is the C name without the prefix, in lowercase.
function _param_by_name(::Type{T}, prefix::String, name::Symbol) where {T<:Enum}
    for x in instances(T)
        if lowercase(chop(string(x); head=length(prefix), tail=0)) == string(name)
            return x
        end
    end
    valid = join((lowercase(chop(string(x); head=length(prefix), tail=0)) for x in instances(T)), ", ")
    throw(ArgumentError("FP4RL.jl: no $(nameof(T)) named $(name); the names are: $(valid)"))
end
