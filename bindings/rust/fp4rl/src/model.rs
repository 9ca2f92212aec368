//! `Model`: the Qwen2-architecture policy model.

use std::ffi::{c_char, c_int, CString};
use std::fmt;
use std::path::Path;
use std::ptr::{self, NonNull};

use fp4rl_sys as sys;

use crate::context::Context;
use crate::enums::{DType, MParam, ModelInfo};
use crate::error::{check, Error, Result, Status};
use crate::policy::{policy_ptr, QuantPolicy};
use crate::tensor::Tensor;

/// The loss and the gradient norm (before clipping) of a supervised step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainStep {
    pub loss: f64,
    pub grad_norm: f64,
}

/// A Qwen2-architecture decoder (HF `Qwen2ForCausalLM`) with FP32 master weights, trained in
/// the numerics of its quantization policy. It borrows its [`Context`].
///
/// A model is a shared handle, like the C object: every method takes `&self`, so that RL
/// sessions (which borrow the model, see [`RlSession`](crate::RlSession)) and supervised steps
/// on the same model can be interleaved, as the C API allows. It is neither `Send` nor `Sync`
/// (it borrows a `!Sync` context), so all of this happens on one thread.
///
/// Token batches are `batch` sequences of `seq_len` ids, row-major, right-padded; `batch` is
/// `tokens.len() / seq_len`. `lengths` (one per sequence, 1..=seq_len; `None` = all seq_len)
/// and `loss_mask` (one weight per token; `None` = 1) are checked to have the right lengths
/// here, because the C API reads them by the batch's shape.
pub struct Model<'ctx> {
    raw: NonNull<sys::fp4rl_model>,
    ctx: &'ctx Context,
}

/// A Rust string as a C string; a NUL byte inside is an error (C would cut the string there).
pub(crate) fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(Status::InvalidArgument, format!("{what}: {s:?} contains a NUL byte")))
}

/// A path as a C string (its bytes on Unix; elsewhere it must be valid Unicode).
pub(crate) fn c_path(path: &Path, what: &str) -> Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path
        .to_str()
        .ok_or_else(|| {
            Error::new(
                Status::InvalidArgument,
                format!("{what}: {} is not valid Unicode", path.display()),
            )
        })?
        .as_bytes()
        .to_vec();
    CString::new(bytes).map_err(|_| {
        Error::new(
            Status::InvalidArgument,
            format!("{what}: the path {} contains a NUL byte", path.display()),
        )
    })
}

/// (batch, seq_len) of a token slice, and the pointers of the optional per-sequence and
/// per-token arrays, after checking their lengths.
struct BatchArgs {
    batch: i64,
    seq_len: i64,
    lengths: *const i32,
    loss_mask: *const f32,
}

fn batch_args(
    tokens: &[i32],
    lengths: Option<&[i32]>,
    loss_mask: Option<&[f32]>,
    seq_len: usize,
    what: &str,
) -> Result<BatchArgs> {
    let shape_err = |m: String| Error::new(Status::Shape, format!("{what}: {m}"));
    // seq_len 0 goes to the library, whose message says why it is invalid.
    let batch = tokens.len().checked_div(seq_len).unwrap_or(0);
    if seq_len != 0 && tokens.len() % seq_len != 0 {
        return Err(shape_err(format!(
            "{} tokens is not a whole number of sequences of seq_len {seq_len}",
            tokens.len()
        )));
    }
    if let Some(l) = lengths {
        if l.len() != batch {
            return Err(shape_err(format!(
                "{} lengths for a batch of {batch} sequences",
                l.len()
            )));
        }
    }
    if let Some(m) = loss_mask {
        if m.len() != tokens.len() {
            return Err(shape_err(format!(
                "a loss mask of {} weights for {} tokens",
                m.len(),
                tokens.len()
            )));
        }
    }
    let to_i64 = |x: usize| i64::try_from(x).map_err(|_| shape_err(format!("{x} does not fit int64_t")));
    Ok(BatchArgs {
        batch: to_i64(batch)?,
        seq_len: to_i64(seq_len)?,
        lengths: lengths.map_or(ptr::null(), <[i32]>::as_ptr),
        loss_mask: loss_mask.map_or(ptr::null(), <[f32]>::as_ptr),
    })
}

impl<'ctx> Model<'ctx> {
    /// A model from the text of an HF config.json of the Qwen2 architecture, with weights
    /// initialised randomly from `seed` as HF does. The policy is copied (None = defaults).
    /// A malformed config is [`Status::Corrupt`] naming the field; another architecture is
    /// [`Status::Unsupported`].
    pub fn from_config(
        ctx: &'ctx Context,
        config_json: &str,
        policy: Option<&QuantPolicy>,
        seed: u64,
    ) -> Result<Model<'ctx>> {
        let cfg = c_string(config_json, "Model::from_config")?;
        let mut raw = ptr::null_mut();
        // SAFETY: live handles, a NUL-terminated config, a valid out-pointer.
        check(unsafe { sys::fp4rl_model_create(&mut raw, ctx.as_ptr(), cfg.as_ptr(), policy_ptr(policy), seed) })?;
        Ok(Model {
            raw: NonNull::new(raw).expect("fp4rl_model_create returned OK and NULL"),
            ctx,
        })
    }

    /// A model from a directory as transformers writes it (`fp4rl_model_from_pretrained`):
    /// `dir/config.json`, the weights (`model.safetensors`, or `model.safetensors.index.json`
    /// and its shards) and `dir/generation_config.json` if present, whose eos ids become the
    /// default stop tokens of sessions on the model. An unreadable directory is [`Status::Io`].
    pub fn from_pretrained(
        ctx: &'ctx Context,
        dir: impl AsRef<Path>,
        policy: Option<&QuantPolicy>,
    ) -> Result<Model<'ctx>> {
        let d = c_path(dir.as_ref(), "Model::from_pretrained")?;
        let mut raw = ptr::null_mut();
        // SAFETY: a valid out-pointer, a live context, a NUL-terminated path, a live or null policy.
        check(unsafe { sys::fp4rl_model_from_pretrained(&mut raw, ctx.as_ptr(), d.as_ptr(), policy_ptr(policy)) })?;
        Ok(Model {
            raw: NonNull::new(raw).expect("fp4rl_model_from_pretrained returned OK and NULL"),
            ctx,
        })
    }

    /// Writes `dir` as transformers' `save_pretrained` does: config.json, generation_config.json,
    /// the weights in F32 or BF16, sharded with an index above `max_shard_bytes` (0 = one file),
    /// atomically. A target that is not absent, empty or an earlier `save_pretrained`'s is
    /// refused ([`Status::InvalidArgument`]) and left untouched.
    pub fn save_pretrained(&self, dir: impl AsRef<Path>, dtype: DType, max_shard_bytes: usize) -> Result<()> {
        let d = c_path(dir.as_ref(), "Model::save_pretrained")?;
        // SAFETY: a live handle and a NUL-terminated path.
        check(unsafe { sys::fp4rl_model_save_pretrained(self.raw.as_ptr(), d.as_ptr(), dtype.as_raw(), max_shard_bytes) })
    }

    /// Loads every weight from a safetensors file with HF names (F32, BF16 or F16). A missing
    /// or mis-shaped tensor or a malformed file is [`Status::Corrupt`], an unreadable file
    /// [`Status::Io`]; the weights are then unchanged. The optimizer state is reset.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = c_path(path.as_ref(), "Model::load")?;
        // SAFETY: a live handle and a NUL-terminated path.
        check(unsafe { sys::fp4rl_model_load(self.raw.as_ptr(), p.as_ptr()) })
    }

    /// Saves the weights with HF names as F32 or BF16, atomically.
    pub fn save(&self, path: impl AsRef<Path>, dtype: DType) -> Result<()> {
        let p = c_path(path.as_ref(), "Model::save")?;
        // SAFETY: a live handle and a NUL-terminated path.
        check(unsafe { sys::fp4rl_model_save(self.raw.as_ptr(), p.as_ptr(), dtype.as_raw()) })
    }

    /// Replaces the model's policy with a copy of `policy`.
    pub fn set_policy(&self, policy: &QuantPolicy) -> Result<()> {
        // SAFETY: live handles.
        check(unsafe { sys::fp4rl_model_set_policy(self.raw.as_ptr(), policy_ptr(Some(policy))) })
    }

    /// Sets an optimizer / training hyper-parameter.
    pub fn set_hparam(&self, param: MParam, value: f64) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::fp4rl_model_set_hparam(self.raw.as_ptr(), param.as_raw(), value) })
    }

    /// An optimizer / training hyper-parameter.
    pub fn hparam(&self, param: MParam) -> Result<f64> {
        let mut v = 0.0;
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::fp4rl_model_get_hparam(self.raw.as_ptr(), param.as_raw(), &mut v) })?;
        Ok(v)
    }

    /// A size of the model.
    pub fn info(&self, key: ModelInfo) -> Result<i64> {
        let mut v = 0;
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::fp4rl_model_get_info(self.raw.as_ptr(), key.as_raw(), &mut v) })?;
        Ok(v)
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> Result<usize> {
        Ok(self.info(ModelInfo::VocabSize)? as usize)
    }

    /// The number of parameters.
    pub fn num_parameters(&self) -> Result<i64> {
        self.info(ModelInfo::NumParameters)
    }

    /// The number of optimizer steps taken.
    pub fn step(&self) -> Result<i64> {
        self.info(ModelInfo::Step)
    }

    /// Logits of every position, `[batch, seq_len, vocab]` row-major (0 past a sequence's
    /// length).
    pub fn logits(&self, tokens: &[i32], lengths: Option<&[i32]>, seq_len: usize) -> Result<Vec<f32>> {
        let a = batch_args(tokens, lengths, None, seq_len, "Model::logits")?;
        let vocab = self.vocab_size()?;
        let n = (tokens.len())
            .checked_mul(vocab)
            .ok_or_else(|| Error::new(Status::Shape, "Model::logits: the logits do not fit in memory"))?;
        let mut out = vec![0f32; n];
        let bytes = std::mem::size_of_val(out.as_slice());
        // SAFETY: `tokens` holds batch * seq_len ids and `lengths` batch entries (checked);
        // `out` holds `bytes` bytes, which the library checks against what it writes.
        check(unsafe {
            sys::fp4rl_model_logits(
                self.raw.as_ptr(),
                tokens.as_ptr(),
                a.lengths,
                a.batch,
                a.seq_len,
                out.as_mut_ptr(),
                bytes,
            )
        })?;
        Ok(out)
    }

    /// Token log-probs `[batch, seq_len]`: log p(tokens[b, t] | tokens[b, <t]) for
    /// 1 <= t < length, 0 at t = 0 and past the length.
    pub fn token_logprobs(&self, tokens: &[i32], lengths: Option<&[i32]>, seq_len: usize) -> Result<Vec<f32>> {
        let a = batch_args(tokens, lengths, None, seq_len, "Model::token_logprobs")?;
        let mut out = vec![0f32; tokens.len()];
        let bytes = std::mem::size_of_val(out.as_slice());
        // SAFETY: as in `logits`.
        check(unsafe {
            sys::fp4rl_model_token_logprobs(
                self.raw.as_ptr(),
                tokens.as_ptr(),
                a.lengths,
                a.batch,
                a.seq_len,
                out.as_mut_ptr(),
                bytes,
            )
        })?;
        Ok(out)
    }

    /// Forward and backward of the next-token loss (weighted by `loss_mask`), leaving the
    /// gradients in the model ([`Model::grad`]) without updating. Returns the loss.
    pub fn compute_gradients(
        &self,
        tokens: &[i32],
        lengths: Option<&[i32]>,
        loss_mask: Option<&[f32]>,
        seq_len: usize,
    ) -> Result<f64> {
        let a = batch_args(tokens, lengths, loss_mask, seq_len, "Model::compute_gradients")?;
        let mut loss = 0.0;
        // SAFETY: `tokens`, `lengths` and `loss_mask` have the batch's sizes (checked).
        check(unsafe {
            sys::fp4rl_model_compute_gradients(
                self.raw.as_ptr(),
                tokens.as_ptr(),
                a.lengths,
                a.loss_mask,
                a.batch,
                a.seq_len,
                &mut loss,
            )
        })?;
        Ok(loss)
    }

    /// One supervised step: gradients, global-norm clipping ([`MParam::GradClip`]), AdamW.
    pub fn train_step(
        &self,
        tokens: &[i32],
        lengths: Option<&[i32]>,
        loss_mask: Option<&[f32]>,
        seq_len: usize,
    ) -> Result<TrainStep> {
        let a = batch_args(tokens, lengths, loss_mask, seq_len, "Model::train_step")?;
        let mut s = TrainStep {
            loss: 0.0,
            grad_norm: 0.0,
        };
        // SAFETY: as in `compute_gradients`.
        check(unsafe {
            sys::fp4rl_model_train_step(
                self.raw.as_ptr(),
                tokens.as_ptr(),
                a.lengths,
                a.loss_mask,
                a.batch,
                a.seq_len,
                &mut s.loss,
                &mut s.grad_norm,
            )
        })?;
        Ok(s)
    }

    /// The HF names of the parameter tensors, in checkpoint order.
    pub fn param_names(&self) -> Result<Vec<String>> {
        let n = self.info(ModelInfo::NumTensors)?;
        (0..n as usize)
            .map(|i| {
                // SAFETY: the model is live; the C string lives as long as it and is copied here.
                let p = unsafe { sys::fp4rl_model_param_name(self.raw.as_ptr(), i) };
                if p.is_null() {
                    return Err(Error::new(Status::InvalidArgument, format!("Model::param_names: no parameter {i}")));
                }
                // SAFETY: a non-NULL result is a NUL-terminated string owned by the model.
                Ok(unsafe { crate::error::owned_str(p) })
            })
            .collect()
    }

    /// A dense F32 view (no copy) of the master weight `name` on the model's device
    /// (`fp4rl_model_param_tensor`): writes through it change the model, optimizer steps show in
    /// it. It keeps the weights' memory alive, so it may outlive this `Model` (not its context).
    pub fn param_tensor(&self, name: &str) -> Result<Tensor<'ctx>> {
        let n = c_string(name, "Model::param_tensor")?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a live model handle and a NUL-terminated name.
        check(unsafe { sys::fp4rl_model_param_tensor(self.raw.as_ptr(), n.as_ptr(), &mut raw) })?;
        Ok(Tensor::wrap(raw, self.ctx))
    }

    /// The shape of the parameter with HF name `name` (1 or 2 dims).
    pub fn param_shape(&self, name: &str) -> Result<Vec<i64>> {
        let n = c_string(name, "Model::param_shape")?;
        let (mut ndim, mut dims): (c_int, [i64; 2]) = (0, [0; 2]);
        // SAFETY: `dims` holds the 2 entries the C API writes.
        check(unsafe { sys::fp4rl_model_param_shape(self.raw.as_ptr(), n.as_ptr(), &mut ndim, dims.as_mut_ptr()) })?;
        Ok(dims[..(ndim.clamp(0, 2) as usize)].to_vec())
    }

    fn read(
        &self,
        name: &str,
        what: &str,
        f: unsafe extern "C" fn(*const sys::fp4rl_model, *const c_char, *mut f32, usize) -> c_int,
    ) -> Result<Vec<f32>> {
        let numel: i64 = self.param_shape(name)?.iter().product();
        let c = c_string(name, what)?;
        let mut out = vec![0f32; numel as usize];
        let bytes = std::mem::size_of_val(out.as_slice());
        // SAFETY: `out` holds `bytes` bytes; the library checks them against the parameter.
        check(unsafe { f(self.raw.as_ptr(), c.as_ptr(), out.as_mut_ptr(), bytes) })?;
        Ok(out)
    }

    /// A copy of a parameter (HF name, e.g. "model.layers.0.self_attn.q_proj.weight").
    pub fn param(&self, name: &str) -> Result<Vec<f32>> {
        self.read(name, "Model::param", sys::fp4rl_model_get_param)
    }

    /// A copy of a parameter's gradient from the last backward.
    pub fn grad(&self, name: &str) -> Result<Vec<f32>> {
        self.read(name, "Model::grad", sys::fp4rl_model_get_grad)
    }

    /// Sets a parameter; `values` must have exactly its number of elements.
    pub fn set_param(&self, name: &str, values: &[f32]) -> Result<()> {
        let c = c_string(name, "Model::set_param")?;
        // SAFETY: the library checks the byte count against the parameter before reading.
        check(unsafe {
            sys::fp4rl_model_set_param(
                self.raw.as_ptr(),
                c.as_ptr(),
                values.as_ptr(),
                std::mem::size_of_val(values),
            )
        })
    }

    /// The context the model lives in.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }

    /// The raw handle, for calls into fp4rl-sys. It stays owned by this `Model`.
    pub fn as_ptr(&self) -> *mut sys::fp4rl_model {
        self.raw.as_ptr()
    }
}

impl Drop for Model<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the handle; sessions borrowing the model are gone (borrow checker).
        unsafe { sys::fp4rl_model_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Model<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Model");
        for key in [
            ModelInfo::NumLayers,
            ModelInfo::HiddenSize,
            ModelInfo::VocabSize,
            ModelInfo::NumParameters,
            ModelInfo::Step,
        ] {
            d.field(&format!("{key:?}"), &self.info(key).ok());
        }
        d.finish()
    }
}
