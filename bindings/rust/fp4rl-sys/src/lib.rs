//! Raw declarations of libfp4rl's C ABI, written by hand from `abi/include/fp4rl/fp4rl.h`.
//!
//! Everything here mirrors the header one to one: the same names, parameter names, parameter
//! order and C types. `tests/header.rs` parses the header and this file and fails on any
//! difference, so the two cannot drift apart. Use the `fp4rl` crate for a safe API.
//!
//! C enums are declared as `c_int` type aliases with one constant per enumerator rather than as
//! Rust enums: the library returns values outside the enumerators (`fp4rl_tensor_dtype(NULL)`
//! is -1, a future library may add statuses), and an out-of-range value in a Rust enum is
//! undefined behaviour. All enums of the header have non-negative enumerators that fit an int,
//! so `c_int` has the size and the calling convention of the C enum type.
#![no_std]
#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_double, c_float, c_int, c_uint, c_void};
use core::marker::{PhantomData, PhantomPinned};

// ---------------------------------------------------------------------------------------------
// Version
// ---------------------------------------------------------------------------------------------
pub const FP4RL_VERSION_MAJOR: c_int = 0;
pub const FP4RL_VERSION_MINOR: c_int = 1;
pub const FP4RL_VERSION_PATCH: c_int = 0;
/// MAJOR * 10000 + MINOR * 100 + PATCH of the header these declarations were written from.
pub const FP4RL_VERSION_NUMBER: c_int = FP4RL_VERSION_MAJOR * 10000 + FP4RL_VERSION_MINOR * 100 + FP4RL_VERSION_PATCH;

// ---------------------------------------------------------------------------------------------
// Status and errors
// ---------------------------------------------------------------------------------------------
pub type fp4rl_status = c_int;
pub const FP4RL_OK: fp4rl_status = 0;
/// a NULL pointer, an out-of-range value
pub const FP4RL_ERR_INVALID_ARGUMENT: fp4rl_status = 1;
/// dims that do not fit together, or whose size overflows
pub const FP4RL_ERR_SHAPE: fp4rl_status = 2;
/// a dtype this function does not take
pub const FP4RL_ERR_DTYPE: fp4rl_status = 3;
/// valid, but not implemented for this case (the message says why)
pub const FP4RL_ERR_UNSUPPORTED: fp4rl_status = 4;
/// an allocation failed; nothing leaked, outputs untouched
pub const FP4RL_ERR_OUT_OF_MEMORY: fp4rl_status = 5;
/// no such device, or a device error (the context is then unusable)
pub const FP4RL_ERR_DEVICE: fp4rl_status = 6;
/// a file could not be read or written
pub const FP4RL_ERR_IO: fp4rl_status = 7;
/// a file or buffer is malformed
pub const FP4RL_ERR_CORRUPT: fp4rl_status = 8;
/// a user callback failed
pub const FP4RL_ERR_CALLBACK: fp4rl_status = 9;
/// a bug in fp4rl: please report it with the message
pub const FP4RL_ERR_INTERNAL: fp4rl_status = 10;

// ---------------------------------------------------------------------------------------------
// Handles. Opaque: zero-sized, not constructible, not Send/Sync/Unpin (the pattern of the
// Rustonomicon's FFI chapter), only ever used behind pointers the library hands out.
// ---------------------------------------------------------------------------------------------
#[repr(C)]
pub struct fp4rl_context {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}
#[repr(C)]
pub struct fp4rl_tensor {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}
#[repr(C)]
pub struct fp4rl_quant_policy {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}
#[repr(C)]
pub struct fp4rl_model {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}
#[repr(C)]
pub struct fp4rl_rl_session {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}
#[repr(C)]
pub struct fp4rl_linear {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

// ---------------------------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------------------------
pub type fp4rl_device = c_int;
pub const FP4RL_DEVICE_CPU: fp4rl_device = 0;
pub const FP4RL_DEVICE_CUDA: fp4rl_device = 1;

// ---------------------------------------------------------------------------------------------
// Data parallelism over several GPUs (NCCL)
// ---------------------------------------------------------------------------------------------
/// Bytes of an NCCL unique id (`fp4rl_nccl_unique_id`).
pub const FP4RL_NCCL_UNIQUE_ID_BYTES: c_int = 128;

// ---------------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------------
pub type fp4rl_dtype = c_int;
/// dense binary32
pub const FP4RL_DTYPE_F32: fp4rl_dtype = 0;
/// dense bfloat16, stored as uint16_t bit patterns
pub const FP4RL_DTYPE_BF16: fp4rl_dtype = 1;
/// dense int32
pub const FP4RL_DTYPE_I32: fp4rl_dtype = 2;
/// E2M1 elements, E8M0 scale per 32 (1D) or per T x T tile (2D)
pub const FP4RL_DTYPE_MXFP4: fp4rl_dtype = 3;
/// E2M1 elements, UE4M3 scale per 16 (1D) or T x T, one f32 per tensor
pub const FP4RL_DTYPE_NVFP4: fp4rl_dtype = 4;
/// HiFloat4: S1P2 elements, one 32-bit three-level scale word per 64
pub const FP4RL_DTYPE_HIF4: fp4rl_dtype = 5;
/// E4M3 elements, E8M0 scale per 32 (1D) or per T x T tile (2D)
pub const FP4RL_DTYPE_MXFP8_E4M3: fp4rl_dtype = 6;

pub const FP4RL_MAX_DIMS: c_int = 8;

// ---------------------------------------------------------------------------------------------
// Quantization policy
// ---------------------------------------------------------------------------------------------
pub type fp4rl_scale_rule = c_int;
pub const FP4RL_SCALE_OCP_FLOOR: fp4rl_scale_rule = 0;
pub const FP4RL_SCALE_TRUNCATION_FREE: fp4rl_scale_rule = 1;

pub type fp4rl_rounding = c_int;
pub const FP4RL_ROUND_NEAREST: fp4rl_rounding = 0;
pub const FP4RL_ROUND_STOCHASTIC: fp4rl_rounding = 1;

pub type fp4rl_numerics = c_int;
pub const FP4RL_NUMERICS_BF16: fp4rl_numerics = 0;
pub const FP4RL_NUMERICS_FP4: fp4rl_numerics = 1;
pub const FP4RL_NUMERICS_W4A16: fp4rl_numerics = 2;
pub const FP4RL_NUMERICS_W16A4: fp4rl_numerics = 3;
pub const FP4RL_NUMERICS_W4A4: fp4rl_numerics = 4;
pub const FP4RL_NUMERICS_FP32: fp4rl_numerics = 5;

pub type fp4rl_resq = c_int;
pub const FP4RL_RESQ_OFF: fp4rl_resq = 0;
pub const FP4RL_RESQ_DENSE: fp4rl_resq = 1;
pub const FP4RL_RESQ_2_4: fp4rl_resq = 2;
pub const FP4RL_RESQ_CHANNEL_50: fp4rl_resq = 3;
pub const FP4RL_RESQ_BLOCK_50: fp4rl_resq = 4;

pub type fp4rl_role = c_int;
pub const FP4RL_ROLE_WEIGHT: fp4rl_role = 0;
pub const FP4RL_ROLE_ACTIVATION: fp4rl_role = 1;
pub const FP4RL_ROLE_GRADIENT: fp4rl_role = 2;

pub type fp4rl_qparam = c_int;
pub const FP4RL_QP_TILE_WEIGHT: fp4rl_qparam = 0;
pub const FP4RL_QP_TILE_ACTIVATION: fp4rl_qparam = 1;
pub const FP4RL_QP_TILE_GRADIENT: fp4rl_qparam = 2;
pub const FP4RL_QP_SCALE_RULE: fp4rl_qparam = 3;
pub const FP4RL_QP_ROUNDING_WEIGHT: fp4rl_qparam = 4;
pub const FP4RL_QP_ROUNDING_ACTIVATION: fp4rl_qparam = 5;
pub const FP4RL_QP_ROUNDING_GRADIENT: fp4rl_qparam = 6;
pub const FP4RL_QP_SEED: fp4rl_qparam = 7;
pub const FP4RL_QP_FORMAT_WEIGHT: fp4rl_qparam = 8;
pub const FP4RL_QP_FORMAT_ACTIVATION: fp4rl_qparam = 9;
pub const FP4RL_QP_FORMAT_GRADIENT: fp4rl_qparam = 10;
pub const FP4RL_QP_FORMAT_QK: fp4rl_qparam = 11;
pub const FP4RL_QP_TRAIN_NUMERICS: fp4rl_qparam = 12;
pub const FP4RL_QP_ROLLOUT_NUMERICS: fp4rl_qparam = 13;
pub const FP4RL_QP_RESQ: fp4rl_qparam = 14;
pub const FP4RL_QP_COUNT: c_int = 15;

pub type fp4rl_preset = c_int;
pub const FP4RL_PRESET_DEFAULT: fp4rl_preset = 0;
pub const FP4RL_PRESET_STABLE_2D_MXFP4: fp4rl_preset = 1;
pub const FP4RL_PRESET_HIF4_RL: fp4rl_preset = 2;

// ---------------------------------------------------------------------------------------------
// The policy model
// ---------------------------------------------------------------------------------------------
pub type fp4rl_mparam = c_int;
pub const FP4RL_MP_LR: fp4rl_mparam = 0;
pub const FP4RL_MP_WEIGHT_DECAY: fp4rl_mparam = 1;
pub const FP4RL_MP_BETA1: fp4rl_mparam = 2;
pub const FP4RL_MP_BETA2: fp4rl_mparam = 3;
pub const FP4RL_MP_ADAM_EPS: fp4rl_mparam = 4;
pub const FP4RL_MP_GRAD_CLIP: fp4rl_mparam = 5;
pub const FP4RL_MP_MICROBATCH_TOKENS: fp4rl_mparam = 6;
pub const FP4RL_MP_RECOMPUTE: fp4rl_mparam = 7;
pub const FP4RL_MP_OPTIMIZER_MOMENTS: fp4rl_mparam = 8;
pub const FP4RL_MP_COUNT: c_int = 9;

pub type fp4rl_model_info = c_int;
pub const FP4RL_MI_VOCAB_SIZE: fp4rl_model_info = 0;
pub const FP4RL_MI_HIDDEN_SIZE: fp4rl_model_info = 1;
pub const FP4RL_MI_INTERMEDIATE_SIZE: fp4rl_model_info = 2;
pub const FP4RL_MI_NUM_LAYERS: fp4rl_model_info = 3;
pub const FP4RL_MI_NUM_HEADS: fp4rl_model_info = 4;
pub const FP4RL_MI_NUM_KV_HEADS: fp4rl_model_info = 5;
pub const FP4RL_MI_HEAD_DIM: fp4rl_model_info = 6;
pub const FP4RL_MI_MAX_POSITIONS: fp4rl_model_info = 7;
pub const FP4RL_MI_TIED_EMBEDDINGS: fp4rl_model_info = 8;
pub const FP4RL_MI_NUM_PARAMETERS: fp4rl_model_info = 9;
pub const FP4RL_MI_STEP: fp4rl_model_info = 10;
pub const FP4RL_MI_NUM_TENSORS: fp4rl_model_info = 11;

// ---------------------------------------------------------------------------------------------
// The RL session
// ---------------------------------------------------------------------------------------------
/// The reward of one completion. Return 0 and set `*reward` (finite) on success; a non-zero
/// return or a NaN reward stops the step with FP4RL_ERR_CALLBACK. `Option` because the C
/// function pointer may be NULL (the library then reports FP4RL_ERR_INVALID_ARGUMENT).
/// Called once, with `release_ctx`, when a tensor made by `fp4rl_tensor_wrap` is destroyed (after
/// the context's queued work is done): the caller's memory is its own again. `Option`: may be NULL.
pub type fp4rl_release_fn = Option<unsafe extern "C" fn(release_ctx: *mut c_void)>;
pub type fp4rl_reward_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        prompt_index: usize,
        prompt: *const i32,
        prompt_len: usize,
        completion: *const i32,
        completion_len: usize,
        reward: *mut c_double,
    ) -> c_int,
>;

pub type fp4rl_rlparam = c_int;
pub const FP4RL_RL_GROUP_SIZE: fp4rl_rlparam = 0;
pub const FP4RL_RL_MAX_NEW_TOKENS: fp4rl_rlparam = 1;
pub const FP4RL_RL_TEMPERATURE: fp4rl_rlparam = 2;
pub const FP4RL_RL_TOP_K: fp4rl_rlparam = 3;
pub const FP4RL_RL_LR: fp4rl_rlparam = 4;
pub const FP4RL_RL_WEIGHT_DECAY: fp4rl_rlparam = 5;
pub const FP4RL_RL_CLIP_LOW: fp4rl_rlparam = 6;
pub const FP4RL_RL_CLIP_HIGH: fp4rl_rlparam = 7;
pub const FP4RL_RL_TIS_CAP: fp4rl_rlparam = 8;
pub const FP4RL_RL_KL_COEF: fp4rl_rlparam = 9;
pub const FP4RL_RL_LOSS_AGG: fp4rl_rlparam = 10;
pub const FP4RL_RL_ADV_NORM: fp4rl_rlparam = 11;
pub const FP4RL_RL_MINIBATCHES: fp4rl_rlparam = 12;
pub const FP4RL_RL_EPOCHS: fp4rl_rlparam = 13;
pub const FP4RL_RL_GRAD_CLIP: fp4rl_rlparam = 14;
pub const FP4RL_RL_SEED: fp4rl_rlparam = 15;
pub const FP4RL_RL_ALLREDUCE_BF16: fp4rl_rlparam = 16;
pub const FP4RL_RL_MICROBATCH_TOKENS: fp4rl_rlparam = 17;
pub const FP4RL_RL_WARMUP_STEPS: fp4rl_rlparam = 18;
pub const FP4RL_RL_LR_SCHEDULE: fp4rl_rlparam = 19;
pub const FP4RL_RL_TOTAL_STEPS: fp4rl_rlparam = 20;
pub const FP4RL_RL_TOP_P: fp4rl_rlparam = 21;
pub const FP4RL_RL_PARAM_COUNT: c_int = 22;

// Functions, in the header's order. `size_t` is `usize` (the same width and ABI on every
// platform Rust and the library support); `const T *` is `*const T`, `T *` is `*mut T`.
extern "C" {
    // Version
    pub fn fp4rl_version_number() -> c_uint;
    pub fn fp4rl_version_string() -> *const c_char;

    // Status and errors
    pub fn fp4rl_status_name(s: fp4rl_status) -> *const c_char;
    pub fn fp4rl_last_error() -> *const c_char;

    // Context
    pub fn fp4rl_context_create(out: *mut *mut fp4rl_context, device: fp4rl_device, ordinal: c_int) -> fp4rl_status;
    pub fn fp4rl_context_destroy(ctx: *mut fp4rl_context);
    pub fn fp4rl_context_set_seed(ctx: *mut fp4rl_context, seed: u64) -> fp4rl_status;
    pub fn fp4rl_context_get_rng(ctx: *const fp4rl_context, seed: *mut u64, offset: *mut u64) -> fp4rl_status;
    pub fn fp4rl_context_set_rng_offset(ctx: *mut fp4rl_context, offset: u64) -> fp4rl_status;
    pub fn fp4rl_context_device(ctx: *const fp4rl_context) -> c_int;
    pub fn fp4rl_context_memory(ctx: *const fp4rl_context, in_use: *mut usize, peak: *mut usize, reserved: *mut usize) -> fp4rl_status;
    pub fn fp4rl_context_reset_peak_memory(ctx: *mut fp4rl_context) -> fp4rl_status;

    // Data parallelism (NCCL)
    pub fn fp4rl_nccl_unique_id(id_bytes: *mut c_void, n_bytes: usize) -> fp4rl_status;
    pub fn fp4rl_context_create_distributed(
        out: *mut *mut fp4rl_context,
        device_ordinal: c_int,
        rank: c_int,
        world_size: c_int,
        id_bytes: *const c_void,
        n_bytes: usize,
    ) -> fp4rl_status;
    pub fn fp4rl_context_get_rank(ctx: *const fp4rl_context, rank: *mut c_int, world_size: *mut c_int) -> fp4rl_status;

    // Tensors
    pub fn fp4rl_dtype_name(dtype: fp4rl_dtype) -> *const c_char;
    pub fn fp4rl_tensor_from_host(
        out: *mut *mut fp4rl_tensor,
        ctx: *mut fp4rl_context,
        dtype: fp4rl_dtype,
        ndim: c_int,
        shape: *const i64,
        data: *const c_void,
    ) -> fp4rl_status;
    pub fn fp4rl_tensor_zeros(
        out: *mut *mut fp4rl_tensor,
        ctx: *mut fp4rl_context,
        dtype: fp4rl_dtype,
        ndim: c_int,
        shape: *const i64,
    ) -> fp4rl_status;
    pub fn fp4rl_tensor_to_host(t: *const fp4rl_tensor, dst: *mut c_void, dst_bytes: usize) -> fp4rl_status;
    pub fn fp4rl_tensor_destroy(t: *mut fp4rl_tensor);
    pub fn fp4rl_tensor_dtype(t: *const fp4rl_tensor) -> fp4rl_dtype;
    pub fn fp4rl_tensor_ndim(t: *const fp4rl_tensor) -> c_int;
    pub fn fp4rl_tensor_dim(t: *const fp4rl_tensor, i: c_int) -> i64;
    pub fn fp4rl_tensor_numel(t: *const fp4rl_tensor) -> i64;
    pub fn fp4rl_tensor_nbytes(t: *const fp4rl_tensor) -> usize;
    pub fn fp4rl_tensor_context(t: *const fp4rl_tensor) -> *mut fp4rl_context;

    // Quantized tensors
    pub fn fp4rl_tensor_quant_info(
        t: *const fp4rl_tensor,
        tile: *mut c_int,
        codes_bytes: *mut usize,
        scales_bytes: *mut usize,
        tensor_scale: *mut c_float,
    ) -> fp4rl_status;
    pub fn fp4rl_tensor_codes_to_host(t: *const fp4rl_tensor, dst: *mut c_void, dst_bytes: usize) -> fp4rl_status;
    pub fn fp4rl_tensor_scales_to_host(t: *const fp4rl_tensor, dst: *mut c_void, dst_bytes: usize) -> fp4rl_status;
    pub fn fp4rl_tensor_import_quantized(
        out: *mut *mut fp4rl_tensor,
        ctx: *mut fp4rl_context,
        dtype: fp4rl_dtype,
        ndim: c_int,
        shape: *const i64,
        tile: c_int,
        codes: *const c_void,
        codes_bytes: usize,
        scales: *const c_void,
        scales_bytes: usize,
        tensor_scale: c_float,
    ) -> fp4rl_status;

    // Quantization policy
    pub fn fp4rl_quant_policy_create(out: *mut *mut fp4rl_quant_policy) -> fp4rl_status;
    pub fn fp4rl_quant_policy_set(p: *mut fp4rl_quant_policy, param: fp4rl_qparam, value: i64) -> fp4rl_status;
    pub fn fp4rl_quant_policy_get(p: *const fp4rl_quant_policy, param: fp4rl_qparam, value: *mut i64) -> fp4rl_status;
    pub fn fp4rl_quant_policy_apply_preset(p: *mut fp4rl_quant_policy, preset: fp4rl_preset) -> fp4rl_status;
    pub fn fp4rl_quant_policy_destroy(p: *mut fp4rl_quant_policy);
    pub fn fp4rl_qparam_name(param: fp4rl_qparam) -> *const c_char;

    // Quantize, dequantize, transpose, matmul
    pub fn fp4rl_quantize(
        out: *mut *mut fp4rl_tensor,
        ctx: *mut fp4rl_context,
        src: *const fp4rl_tensor,
        format: fp4rl_dtype,
        policy: *const fp4rl_quant_policy,
        role: fp4rl_role,
    ) -> fp4rl_status;
    pub fn fp4rl_dequantize(
        out: *mut *mut fp4rl_tensor,
        ctx: *mut fp4rl_context,
        q: *const fp4rl_tensor,
        dtype: fp4rl_dtype,
    ) -> fp4rl_status;
    pub fn fp4rl_tensor_transpose(
        out: *mut *mut fp4rl_tensor,
        ctx: *mut fp4rl_context,
        t: *const fp4rl_tensor,
    ) -> fp4rl_status;
    pub fn fp4rl_matmul(
        c: *mut fp4rl_tensor,
        ctx: *mut fp4rl_context,
        a: *const fp4rl_tensor,
        b: *const fp4rl_tensor,
    ) -> fp4rl_status;
    pub fn fp4rl_quant_error(
        src: *const fp4rl_tensor,
        q: *const fp4rl_tensor,
        rel_mse: *mut c_double,
        underflow_frac: *mut c_double,
        saturated_frac: *mut c_double,
        nan_block_frac: *mut c_double,
    ) -> fp4rl_status;

    // The policy model
    pub fn fp4rl_model_create(
        out: *mut *mut fp4rl_model,
        ctx: *mut fp4rl_context,
        config_json: *const c_char,
        policy: *const fp4rl_quant_policy,
        seed: u64,
    ) -> fp4rl_status;
    pub fn fp4rl_model_destroy(m: *mut fp4rl_model);
    pub fn fp4rl_model_load(m: *mut fp4rl_model, safetensors_path: *const c_char) -> fp4rl_status;
    pub fn fp4rl_model_save(m: *const fp4rl_model, safetensors_path: *const c_char, dtype: fp4rl_dtype)
        -> fp4rl_status;
    pub fn fp4rl_model_from_pretrained(
        out: *mut *mut fp4rl_model,
        ctx: *mut fp4rl_context,
        dir: *const c_char,
        policy: *const fp4rl_quant_policy,
    ) -> fp4rl_status;
    pub fn fp4rl_model_save_pretrained(m: *const fp4rl_model, dir: *const c_char, dtype: fp4rl_dtype, max_shard_bytes: usize)
        -> fp4rl_status;
    pub fn fp4rl_model_set_policy(m: *mut fp4rl_model, policy: *const fp4rl_quant_policy) -> fp4rl_status;
    pub fn fp4rl_model_set_hparam(m: *mut fp4rl_model, param: fp4rl_mparam, value: c_double) -> fp4rl_status;
    pub fn fp4rl_model_get_hparam(m: *const fp4rl_model, param: fp4rl_mparam, value: *mut c_double) -> fp4rl_status;
    pub fn fp4rl_model_get_info(m: *const fp4rl_model, key: fp4rl_model_info, value: *mut i64) -> fp4rl_status;
    pub fn fp4rl_model_logits(
        m: *mut fp4rl_model,
        tokens: *const i32,
        lengths: *const i32,
        batch: i64,
        seq_len: i64,
        logits: *mut c_float,
        logits_bytes: usize,
    ) -> fp4rl_status;
    pub fn fp4rl_model_token_logprobs(
        m: *mut fp4rl_model,
        tokens: *const i32,
        lengths: *const i32,
        batch: i64,
        seq_len: i64,
        logprobs: *mut c_float,
        logprobs_bytes: usize,
    ) -> fp4rl_status;
    pub fn fp4rl_model_compute_gradients(
        m: *mut fp4rl_model,
        tokens: *const i32,
        lengths: *const i32,
        loss_mask: *const c_float,
        batch: i64,
        seq_len: i64,
        loss: *mut c_double,
    ) -> fp4rl_status;
    pub fn fp4rl_model_train_step(
        m: *mut fp4rl_model,
        tokens: *const i32,
        lengths: *const i32,
        loss_mask: *const c_float,
        batch: i64,
        seq_len: i64,
        loss: *mut c_double,
        grad_norm: *mut c_double,
    ) -> fp4rl_status;
    pub fn fp4rl_model_param_name(m: *const fp4rl_model, i: usize) -> *const c_char;
    pub fn fp4rl_model_param_shape(
        m: *const fp4rl_model,
        name: *const c_char,
        ndim: *mut c_int,
        dims: *mut i64,
    ) -> fp4rl_status;
    pub fn fp4rl_model_get_param(
        m: *const fp4rl_model,
        name: *const c_char,
        dst: *mut c_float,
        dst_bytes: usize,
    ) -> fp4rl_status;
    pub fn fp4rl_model_get_grad(
        m: *const fp4rl_model,
        name: *const c_char,
        dst: *mut c_float,
        dst_bytes: usize,
    ) -> fp4rl_status;
    pub fn fp4rl_model_set_param(
        m: *mut fp4rl_model,
        name: *const c_char,
        src: *const c_float,
        src_bytes: usize,
    ) -> fp4rl_status;

    // The RL session
    pub fn fp4rl_rl_session_create(
        out: *mut *mut fp4rl_rl_session,
        ctx: *mut fp4rl_context,
        model: *mut fp4rl_model,
        policy: *const fp4rl_quant_policy,
    ) -> fp4rl_status;
    pub fn fp4rl_rl_session_destroy(s: *mut fp4rl_rl_session);
    pub fn fp4rl_rl_session_set(s: *mut fp4rl_rl_session, param: fp4rl_rlparam, value: c_double) -> fp4rl_status;
    pub fn fp4rl_rl_session_get(s: *const fp4rl_rl_session, param: fp4rl_rlparam, value: *mut c_double)
        -> fp4rl_status;
    pub fn fp4rl_rl_session_set_stop_tokens(s: *mut fp4rl_rl_session, ids: *const i32, n: usize) -> fp4rl_status;
    pub fn fp4rl_rl_session_get_stop_tokens(s: *const fp4rl_rl_session, ids: *mut i32, cap: usize, n: *mut usize)
        -> fp4rl_status;
    pub fn fp4rl_rl_session_step(
        s: *mut fp4rl_rl_session,
        prompts: *const i32,
        prompt_offsets: *const usize,
        n_prompts: usize,
        reward_fn: fp4rl_reward_fn,
        user: *mut c_void,
    ) -> fp4rl_status;
    pub fn fp4rl_rl_session_rollout(
        s: *mut fp4rl_rl_session,
        prompts: *const i32,
        prompt_offsets: *const usize,
        n_prompts: usize,
    ) -> fp4rl_status;
    pub fn fp4rl_rl_session_num_completions(s: *const fp4rl_rl_session, n: *mut usize) -> fp4rl_status;
    pub fn fp4rl_rl_session_completion(
        s: *const fp4rl_rl_session,
        i: usize,
        tokens: *mut i32,
        logprobs: *mut c_float,
        cap: usize,
        length: *mut usize,
        prompt_index: *mut usize,
    ) -> fp4rl_status;
    pub fn fp4rl_rl_session_set_rewards(s: *mut fp4rl_rl_session, rewards: *const c_double, n: usize) -> fp4rl_status;
    pub fn fp4rl_rl_session_train(s: *mut fp4rl_rl_session) -> fp4rl_status;
    pub fn fp4rl_rl_session_metric(
        s: *const fp4rl_rl_session,
        name: *const c_char,
        value: *mut c_double,
    ) -> fp4rl_status;
    pub fn fp4rl_rl_session_metric_name(i: usize) -> *const c_char;
    pub fn fp4rl_rl_session_metrics_json(
        s: *const fp4rl_rl_session,
        buf: *mut c_char,
        buf_size: usize,
        needed: *mut usize,
    ) -> fp4rl_status;
    pub fn fp4rl_rl_session_set_metrics_file(s: *mut fp4rl_rl_session, jsonl_path: *const c_char) -> fp4rl_status;
    pub fn fp4rl_rl_session_step_count(s: *const fp4rl_rl_session, steps: *mut i64) -> fp4rl_status;
    pub fn fp4rl_rl_session_save(s: *const fp4rl_rl_session, dir: *const c_char) -> fp4rl_status;
    pub fn fp4rl_rl_session_load(s: *mut fp4rl_rl_session, dir: *const c_char) -> fp4rl_status;

    // Zero-copy tensors and streams
    pub fn fp4rl_tensor_wrap(
        out: *mut *mut fp4rl_tensor,
        ctx: *mut fp4rl_context,
        dtype: fp4rl_dtype,
        ndim: c_int,
        shape: *const i64,
        strides: *const i64,
        data: *mut c_void,
        release: fp4rl_release_fn,
        release_ctx: *mut c_void,
    ) -> fp4rl_status;
    pub fn fp4rl_tensor_data(t: *const fp4rl_tensor) -> *mut c_void;
    pub fn fp4rl_context_set_stream(ctx: *mut fp4rl_context, cuda_stream: *mut c_void) -> fp4rl_status;
    pub fn fp4rl_model_param_tensor(m: *mut fp4rl_model, name: *const c_char, out: *mut *mut fp4rl_tensor) -> fp4rl_status;

    // One linear layer in a policy's training numerics
    pub fn fp4rl_linear_create(
        out: *mut *mut fp4rl_linear,
        ctx: *mut fp4rl_context,
        policy: *const fp4rl_quant_policy,
        is_qk: c_int,
    ) -> fp4rl_status;
    pub fn fp4rl_linear_destroy(l: *mut fp4rl_linear);
    pub fn fp4rl_linear_forward(
        l: *mut fp4rl_linear,
        y: *mut fp4rl_tensor,
        x: *const fp4rl_tensor,
        w: *const fp4rl_tensor,
        b: *const fp4rl_tensor,
    ) -> fp4rl_status;
    pub fn fp4rl_linear_backward(
        l: *mut fp4rl_linear,
        dx: *mut fp4rl_tensor,
        dw: *mut fp4rl_tensor,
        db: *mut fp4rl_tensor,
        dy: *const fp4rl_tensor,
    ) -> fp4rl_status;
}
