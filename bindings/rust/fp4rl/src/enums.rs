//! Rust enums for the C enums of the ABI. Each converts to and from its raw value; the raw
//! values come from fp4rl-sys, whose test checks them against the header.

use std::ffi::c_int;

use fp4rl_sys as sys;

use crate::error::static_str;

macro_rules! c_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $raw:path,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in the order of the C enum.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The raw C value.
            pub fn as_raw(self) -> c_int {
                match self {
                    $($name::$variant => $raw,)+
                }
            }

            /// The value for a raw C value; `None` for one outside the enum.
            pub fn from_raw(raw: c_int) -> Option<$name> {
                match raw {
                    $(x if x == $raw => Some($name::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

c_enum! {
    /// Where a context's tensors and models live.
    Device {
        Cpu = sys::FP4RL_DEVICE_CPU,
        Cuda = sys::FP4RL_DEVICE_CUDA,
    }
}

c_enum! {
    /// Element types: dense (F32, BF16, I32) and quantized (the block formats).
    DType {
        /// dense binary32
        F32 = sys::FP4RL_DTYPE_F32,
        /// dense bfloat16, as `u16` bit patterns
        Bf16 = sys::FP4RL_DTYPE_BF16,
        /// dense int32
        I32 = sys::FP4RL_DTYPE_I32,
        /// E2M1 elements, E8M0 scale per 32 (1D) or per T x T tile (2D)
        Mxfp4 = sys::FP4RL_DTYPE_MXFP4,
        /// E2M1 elements, UE4M3 scale per 16 (1D) or T x T, one f32 per tensor
        Nvfp4 = sys::FP4RL_DTYPE_NVFP4,
        /// HiFloat4: S1P2 elements, one 32-bit three-level scale word per 64
        Hif4 = sys::FP4RL_DTYPE_HIF4,
        /// E4M3 elements, E8M0 scale per 32 (1D) or per T x T tile (2D)
        Mxfp8E4m3 = sys::FP4RL_DTYPE_MXFP8_E4M3,
    }
}

impl DType {
    /// The library's name: "f32", "bf16", "i32", "mxfp4", "nvfp4", "hif4", "mxfp8_e4m3".
    pub fn name(self) -> &'static str {
        // SAFETY: fp4rl_dtype_name returns a static string for any value.
        unsafe { static_str(sys::fp4rl_dtype_name(self.as_raw())) }.unwrap_or("unknown")
    }
}

c_enum! {
    /// How MXFP4 / MXFP8 pick a block's shared exponent.
    ScaleRule {
        /// e = floor(log2 amax) - emax_elem: the block max may saturate
        OcpFloor = sys::FP4RL_SCALE_OCP_FLOOR,
        /// smallest e with amax <= max_elem * 2^e: never saturates
        TruncationFree = sys::FP4RL_SCALE_TRUNCATION_FREE,
    }
}

c_enum! {
    /// Rounding of quantization.
    Rounding {
        /// round to nearest even (HiF4: half up on the magnitude, as the reference)
        Nearest = sys::FP4RL_ROUND_NEAREST,
        /// Philox4x32-10 counter-based stochastic rounding, reproducible on CPU and GPU
        Stochastic = sys::FP4RL_ROUND_STOCHASTIC,
    }
}

c_enum! {
    /// The numerics of training or of the rollout.
    Numerics {
        /// no FP4: BF16-rounded GEMM operands
        Bf16 = sys::FP4RL_NUMERICS_BF16,
        /// training: W, X and dY quantized per the policy (= W4A4)
        Fp4 = sys::FP4RL_NUMERICS_FP4,
        /// rollout: weights FP4, activations BF16
        W4A16 = sys::FP4RL_NUMERICS_W4A16,
        /// rollout: weights BF16, activations FP4
        W16A4 = sys::FP4RL_NUMERICS_W16A4,
        /// rollout: both FP4
        W4A4 = sys::FP4RL_NUMERICS_W4A4,
        /// no rounding at all: FP32 GEMM operands (reference checks)
        Fp32 = sys::FP4RL_NUMERICS_FP32,
    }
}

c_enum! {
    /// Rollout-ResQ patterns (rollout only).
    Resq {
        Off = sys::FP4RL_RESQ_OFF,
        Dense = sys::FP4RL_RESQ_DENSE,
        TwoFour = sys::FP4RL_RESQ_2_4,
        Channel50 = sys::FP4RL_RESQ_CHANNEL_50,
        Block50 = sys::FP4RL_RESQ_BLOCK_50,
    }
}

c_enum! {
    /// The operand roles of a linear layer's GEMMs.
    Role {
        Weight = sys::FP4RL_ROLE_WEIGHT,
        Activation = sys::FP4RL_ROLE_ACTIVATION,
        Gradient = sys::FP4RL_ROLE_GRADIENT,
    }
}

c_enum! {
    /// The parameters of a [`QuantPolicy`](crate::QuantPolicy); see the typed setters there.
    QParam {
        TileWeight = sys::FP4RL_QP_TILE_WEIGHT,
        TileActivation = sys::FP4RL_QP_TILE_ACTIVATION,
        TileGradient = sys::FP4RL_QP_TILE_GRADIENT,
        ScaleRule = sys::FP4RL_QP_SCALE_RULE,
        RoundingWeight = sys::FP4RL_QP_ROUNDING_WEIGHT,
        RoundingActivation = sys::FP4RL_QP_ROUNDING_ACTIVATION,
        RoundingGradient = sys::FP4RL_QP_ROUNDING_GRADIENT,
        Seed = sys::FP4RL_QP_SEED,
        FormatWeight = sys::FP4RL_QP_FORMAT_WEIGHT,
        FormatActivation = sys::FP4RL_QP_FORMAT_ACTIVATION,
        FormatGradient = sys::FP4RL_QP_FORMAT_GRADIENT,
        FormatQk = sys::FP4RL_QP_FORMAT_QK,
        TrainNumerics = sys::FP4RL_QP_TRAIN_NUMERICS,
        RolloutNumerics = sys::FP4RL_QP_ROLLOUT_NUMERICS,
        Resq = sys::FP4RL_QP_RESQ,
    }
}

impl QParam {
    /// The library's name of the parameter ("tile_weight", ...).
    pub fn name(self) -> &'static str {
        // SAFETY: fp4rl_qparam_name returns a static string or NULL.
        unsafe { static_str(sys::fp4rl_qparam_name(self.as_raw())) }.unwrap_or("unknown")
    }

    pub(crate) fn tile(role: Role) -> QParam {
        match role {
            Role::Weight => QParam::TileWeight,
            Role::Activation => QParam::TileActivation,
            Role::Gradient => QParam::TileGradient,
        }
    }

    pub(crate) fn rounding(role: Role) -> QParam {
        match role {
            Role::Weight => QParam::RoundingWeight,
            Role::Activation => QParam::RoundingActivation,
            Role::Gradient => QParam::RoundingGradient,
        }
    }

    pub(crate) fn format(role: Role) -> QParam {
        match role {
            Role::Weight => QParam::FormatWeight,
            Role::Activation => QParam::FormatActivation,
            Role::Gradient => QParam::FormatGradient,
        }
    }
}

c_enum! {
    /// Named quantization recipes.
    Preset {
        /// the plain defaults of a new policy
        Default = sys::FP4RL_PRESET_DEFAULT,
        /// "Stable FP4 training": MXFP4, W and X in 32x32 tiles, truncation-free, dY 1D
        /// stochastic, MXFP8 E4M3 for q_proj/k_proj, FP4 training, W4A4 rollout, no ResQ
        Stable2dMxfp4 = sys::FP4RL_PRESET_STABLE_2D_MXFP4,
        /// "HiFloat4 end-to-end FP4 RL": HiF4 1D for every role, dY stochastic, FP4 training,
        /// W4A4 rollout, Rollout-ResQ 2:4
        Hif4Rl = sys::FP4RL_PRESET_HIF4_RL,
    }
}

c_enum! {
    /// Optimizer and training hyper-parameters of a [`Model`](crate::Model).
    MParam {
        /// AdamW learning rate, > 0; default 1e-4
        Lr = sys::FP4RL_MP_LR,
        /// decoupled weight decay, >= 0; default 0
        WeightDecay = sys::FP4RL_MP_WEIGHT_DECAY,
        /// [0, 1); default 0.9
        Beta1 = sys::FP4RL_MP_BETA1,
        /// [0, 1); default 0.999
        Beta2 = sys::FP4RL_MP_BETA2,
        /// > 0; default 1e-8
        AdamEps = sys::FP4RL_MP_ADAM_EPS,
        /// clip the global gradient norm to this; 0 = off (default)
        GradClip = sys::FP4RL_MP_GRAD_CLIP,
        /// tokens per micro-batch of a pass (whole sequences, gradients accumulated, the whole
        /// batch's loss normalisation); 0 = automatic from the free device memory (default)
        MicrobatchTokens = sys::FP4RL_MP_MICROBATCH_TOKENS,
        /// 1 = recompute each block's activations in the backward (bit-identical, less memory);
        /// 0 (default) = only when automatic micro-batches cannot fit one sequence otherwise
        Recompute = sys::FP4RL_MP_RECOMPUTE,
        /// storage of the AdamW moments: 0 = FP32 (default), 1 = BF16 with stochastic rounding
        /// (4 bytes per parameter fewer; the step computes in FP32); setting it converts the
        /// moments the model holds
        OptimizerMoments = sys::FP4RL_MP_OPTIMIZER_MOMENTS,
    }
}

c_enum! {
    /// Sizes of a [`Model`](crate::Model).
    ModelInfo {
        VocabSize = sys::FP4RL_MI_VOCAB_SIZE,
        HiddenSize = sys::FP4RL_MI_HIDDEN_SIZE,
        IntermediateSize = sys::FP4RL_MI_INTERMEDIATE_SIZE,
        NumLayers = sys::FP4RL_MI_NUM_LAYERS,
        NumHeads = sys::FP4RL_MI_NUM_HEADS,
        NumKvHeads = sys::FP4RL_MI_NUM_KV_HEADS,
        HeadDim = sys::FP4RL_MI_HEAD_DIM,
        MaxPositions = sys::FP4RL_MI_MAX_POSITIONS,
        TiedEmbeddings = sys::FP4RL_MI_TIED_EMBEDDINGS,
        NumParameters = sys::FP4RL_MI_NUM_PARAMETERS,
        Step = sys::FP4RL_MI_STEP,
        NumTensors = sys::FP4RL_MI_NUM_TENSORS,
    }
}

c_enum! {
    /// Hyper-parameters of an [`RlSession`](crate::RlSession); defaults in brackets.
    RlParam {
        /// completions per prompt, 2..1024 [8]
        GroupSize = sys::FP4RL_RL_GROUP_SIZE,
        /// 1..65536 [64]
        MaxNewTokens = sys::FP4RL_RL_MAX_NEW_TOKENS,
        /// (0, 100] [1.0]; the trainer divides its logits by it too
        Temperature = sys::FP4RL_RL_TEMPERATURE,
        /// 0 = off, else 1..vocab [0]
        TopK = sys::FP4RL_RL_TOP_K,
        /// AdamW learning rate, > 0 [1e-6]
        Lr = sys::FP4RL_RL_LR,
        /// >= 0 [0]
        WeightDecay = sys::FP4RL_RL_WEIGHT_DECAY,
        /// eps_low, [0, 1) [0.2]
        ClipLow = sys::FP4RL_RL_CLIP_LOW,
        /// eps_high, >= 0 [0.2]
        ClipHigh = sys::FP4RL_RL_CLIP_HIGH,
        /// C of truncated importance sampling, 0 = TIS off, else >= 1 [5]
        TisCap = sys::FP4RL_RL_TIS_CAP,
        /// beta of the k3 KL to the weights at the first step, >= 0 [0]
        KlCoef = sys::FP4RL_RL_KL_COEF,
        /// 0 = mean over a completion's tokens, then over completions [0]; 1 = over all tokens
        LossAgg = sys::FP4RL_RL_LOSS_AGG,
        /// 1 = divide by the group's std (GRPO) [1]; 0 = Dr. GRPO
        AdvNorm = sys::FP4RL_RL_ADV_NORM,
        /// optimizer steps per epoch, 1..n_prompts*G [1]
        Minibatches = sys::FP4RL_RL_MINIBATCHES,
        /// passes over the rollout, 1..100 [1]
        Epochs = sys::FP4RL_RL_EPOCHS,
        /// global-norm clip, 0 = off [1.0]
        GradClip = sys::FP4RL_RL_GRAD_CLIP,
        /// seed of sampling, 0 .. 2^53 [0]
        Seed = sys::FP4RL_RL_SEED,
        /// distributed contexts: 0 = all-reduce the gradients in FP32 [0]; 1 = in BF16
        AllreduceBf16 = sys::FP4RL_RL_ALLREDUCE_BF16,
        /// tokens per micro-batch of the trainer's passes; 0 = automatic from the free device memory [0]
        MicrobatchTokens = sys::FP4RL_RL_MICROBATCH_TOKENS,
        /// learning-rate warm-up, in optimizer updates (lr(u) = lr * u / W while u < W) [0]
        WarmupSteps = sys::FP4RL_RL_WARMUP_STEPS,
        /// after the warm-up: 0 = constant [0], 1 = linear decay, 2 = cosine decay (as transformers)
        LrSchedule = sys::FP4RL_RL_LR_SCHEDULE,
        /// total optimizer updates of a linear / cosine schedule [0]
        TotalSteps = sys::FP4RL_RL_TOTAL_STEPS,
        /// nucleus sampling, (0, 1] [1 = off]; the rollout's and the trainer's log-probs are both
        /// under the truncated, renormalised distribution
        TopP = sys::FP4RL_RL_TOP_P,
    }
}
