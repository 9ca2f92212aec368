//! Safe Rust API of libfp4rl: FP4 quantization and end-to-end FP4 RL post-training of LLMs.
//!
//! ```no_run
//! use fp4rl::{Context, Model, Preset, QuantPolicy, RlParam, RlSession};
//!
//! fn main() -> fp4rl::Result<()> {
//!     let ctx = Context::cpu()?;
//!     let policy = QuantPolicy::with_preset(Preset::Hif4Rl)?;
//!     let model = Model::from_pretrained(&ctx, "path/to/qwen2", Some(&policy))?;
//!     let mut session = RlSession::new(&model, None)?;
//!     session.set(RlParam::GroupSize, 8.0)?.set(RlParam::Lr, 1e-6)?;
//!     let prompts: Vec<Vec<i32>> = vec![vec![1, 2, 3], vec![4, 5]];
//!     // the reward: any Rust closure over (prompt index, prompt tokens, completion tokens)
//!     session.step(&prompts, |_, _prompt, completion| completion.len() as f64 / 64.0)?;
//!     println!("{:?}", session.metric("reward/mean")?);
//!     session.save("ckpt")?;
//!     Ok(())
//! }
//! ```
//!
//! Ownership follows the C API: a [`Context`] owns a device; [`Tensor`]s and [`Model`]s
//! borrow it (`Tensor<'ctx>`, `Model<'ctx>`); an [`RlSession`] borrows a model. Each handle
//! frees its C object in `Drop`, exactly once, and the borrow checker makes freeing a context
//! before its tensors, or a model before its sessions, a compile error. Every fallible call
//! returns [`Result`], whose [`Error`] carries the [`Status`] and the library's message.
//!
//! Nothing here reimplements the library: the wrappers convert types, check the lengths of
//! slices the C API cannot see, and pass everything else through.

mod context;
mod enums;
mod error;
mod model;
mod policy;
mod session;
mod tensor;

pub use context::{nccl_unique_id, Context, MemoryStats, RngState};
pub use enums::{DType, Device, MParam, ModelInfo, Numerics, Preset, QParam, Resq, RlParam, Role, Rounding, ScaleRule};
pub use error::{Error, Result, Status};
pub use model::{Model, TrainStep};
pub use policy::QuantPolicy;
pub use session::{Completion, RewardValue, RlSession};
pub use tensor::{Element, QuantError, QuantInfo, Tensor};

/// The raw declarations, for what the safe API does not cover.
pub use fp4rl_sys as sys;

/// The linked library's version, "MAJOR.MINOR.PATCH".
pub fn version() -> &'static str {
    // SAFETY: fp4rl_version_string returns a static string.
    unsafe { error::static_str(sys::fp4rl_version_string()) }.unwrap_or("")
}

/// The linked library's version as MAJOR * 10000 + MINOR * 100 + PATCH.
pub fn version_number() -> u32 {
    // SAFETY: no arguments, no state.
    unsafe { sys::fp4rl_version_number() }
}
