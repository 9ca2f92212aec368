//! `RlSession`: one complete end-to-end FP4 RL step with a reward closure.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::{c_double, c_int, c_void};
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::ptr::{self, NonNull};

use fp4rl_sys as sys;

use crate::enums::RlParam;
use crate::error::{check, owned_str, Error, Result, Status};
use crate::model::{c_path, c_string, Model};
use crate::policy::{policy_ptr, QuantPolicy};

/// What a reward closure may return: a reward (`f64`), or a `Result` whose error fails the step.
pub trait RewardValue {
    /// The reward, or why there is none (becomes part of the step's error message).
    fn into_reward(self) -> std::result::Result<f64, String>;
}

impl RewardValue for f64 {
    fn into_reward(self) -> std::result::Result<f64, String> {
        Ok(self)
    }
}

impl<E: fmt::Display> RewardValue for std::result::Result<f64, E> {
    fn into_reward(self) -> std::result::Result<f64, String> {
        self.map_err(|e| e.to_string())
    }
}

/// One completion of a rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// the sampled tokens (ending with a stop token if one was sampled)
    pub tokens: Vec<i32>,
    /// their log-probs under the rollout numerics
    pub logprobs: Vec<f32>,
    /// the index of its prompt in the batch (completion i belongs to prompt i / group_size)
    pub prompt_index: usize,
}

/// Prompts in the CSR form of the C API: prompt p is `tokens[offsets[p]..offsets[p + 1]]`.
fn csr<P: AsRef<[i32]>>(prompts: &[P]) -> (Vec<i32>, Vec<usize>) {
    let mut tokens = Vec::with_capacity(prompts.iter().map(|p| p.as_ref().len()).sum());
    let mut offsets = Vec::with_capacity(prompts.len() + 1);
    offsets.push(0);
    for p in prompts {
        tokens.extend_from_slice(p.as_ref());
        offsets.push(tokens.len());
    }
    (tokens, offsets)
}

/// The pointers and count of a CSR batch, after checking that every offset is inside `tokens`
/// (the C API reads `tokens` by the offsets, so an offset past the end would read out of
/// bounds; everything else about the prompts the library checks and reports itself).
fn csr_args<'a>(tokens: &'a [i32], offsets: &'a [usize], what: &str) -> Result<(*const i32, *const usize, usize)> {
    static ZERO: [usize; 1] = [0];
    if let Some(&bad) = offsets.iter().find(|&&o| o > tokens.len()) {
        return Err(Error::new(
            Status::InvalidArgument,
            format!("{what}: prompt offset {bad} is past the {} prompt tokens", tokens.len()),
        ));
    }
    if offsets.is_empty() {
        // No prompts at all: the library reports it (n_prompts 0) without reading past [0].
        return Ok((tokens.as_ptr(), ZERO.as_ptr(), 0));
    }
    Ok((tokens.as_ptr(), offsets.as_ptr(), offsets.len() - 1))
}

/// The state the trampoline shares with `step`: the closure, and what went wrong in it.
struct Callback<'f, F> {
    f: &'f mut F,
    failure: Option<String>,
}

/// A panic payload as text (panics carry a &str or a String, or something else).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic payload that is not a string".to_string()
    }
}

/// The `fp4rl_reward_fn` for closures of type `F`; `user` points to a `Callback<F>`.
///
/// A panic must not unwind into C (undefined behaviour, and the library would skip its
/// cleanup), so the closure runs inside catch_unwind; a panic or an `Err` is recorded and the
/// callback returns non-zero (1 for an `Err`, 2 for a panic), which makes the library abandon the
/// step with FP4RL_ERR_CALLBACK and the model unchanged. `step` then adds the record to the
/// library's message.
unsafe extern "C" fn trampoline<F, R>(
    user: *mut c_void,
    prompt_index: usize,
    prompt: *const i32,
    prompt_len: usize,
    completion: *const i32,
    completion_len: usize,
    reward: *mut c_double,
) -> c_int
where
    F: FnMut(usize, &[i32], &[i32]) -> R,
    R: RewardValue,
{
    // SAFETY: `user` is the `Callback<F>` that `step` passed, alive for the whole call.
    let cb = &mut *(user as *mut Callback<'_, F>);
    if cb.failure.is_some() {
        return 1; // the library stops at the first failure; never call a failed closure again
    }
    // SAFETY: the library passes `len` valid elements (slice::from_raw_parts needs a non-null
    // pointer even for length 0, which a C caller need not give).
    let slice = |p: *const i32, len: usize| {
        if len == 0 || p.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts(p, len)
        }
    };
    let (p, c) = (slice(prompt, prompt_len), slice(completion, completion_len));
    match panic::catch_unwind(AssertUnwindSafe(|| (cb.f)(prompt_index, p, c).into_reward())) {
        Ok(Ok(r)) => {
            // A NaN is the library's to reject (its message says so).
            *reward = r;
            0
        }
        Ok(Err(e)) => {
            cb.failure = Some(format!(
                "the Rust reward closure returned an error for a completion of prompt {prompt_index}: {e}"
            ));
            1
        }
        Err(payload) => {
            cb.failure = Some(format!(
                "the Rust reward closure panicked for a completion of prompt {prompt_index}: {}",
                panic_message(payload.as_ref())
            ));
            // Dropping the payload runs its destructor, which could panic too: not into C.
            let _ = panic::catch_unwind(AssertUnwindSafe(move || drop(payload)));
            2
        }
    }
}

/// An RL session: rollout in the rollout numerics, rewards from a Rust closure, GRPO
/// advantages, TIS-weighted clipped loss, backward in FP4, AdamW — one call per step.
///
/// A session borrows its model (and through it the context), so it cannot outlive them:
///
/// ```compile_fail,E0597
/// use fp4rl::{Context, Model, RlSession};
/// # const CFG: &str = "";
/// let ctx = Context::cpu().unwrap();
/// let session;
/// {
///     let model = Model::from_config(&ctx, CFG, None, 1).unwrap();
///     session = RlSession::new(&model, None).unwrap();
/// } // error: `model` does not live long enough
/// drop(session);
/// ```
///
/// The borrow is shared, as in the C API: several sessions may train or evaluate one model
/// (an evaluation session with greedy decoding next to the training one, say), and the model's
/// supervised methods remain usable between steps.
pub struct RlSession<'m> {
    raw: NonNull<sys::fp4rl_rl_session>,
    model: &'m Model<'m>,
}

impl<'m> RlSession<'m> {
    /// A session that trains `model` with `policy` (copied; it becomes the model's policy;
    /// `None` keeps the model's). The first update starts from a fresh AdamW state.
    pub fn new(model: &'m Model<'_>, policy: Option<&QuantPolicy>) -> Result<RlSession<'m>> {
        let mut raw = ptr::null_mut();
        // SAFETY: live handles; the model belongs to the context passed (its own).
        check(unsafe {
            sys::fp4rl_rl_session_create(&mut raw, model.context().as_ptr(), model.as_ptr(), policy_ptr(policy))
        })?;
        Ok(RlSession {
            raw: NonNull::new(raw).expect("fp4rl_rl_session_create returned OK and NULL"),
            model,
        })
    }

    /// The model this session trains.
    pub fn model(&self) -> &'m Model<'m> {
        self.model
    }

    /// Sets a hyper-parameter (see [`RlParam`] for bounds and defaults).
    pub fn set(&mut self, param: RlParam, value: f64) -> Result<&mut Self> {
        // SAFETY: a live handle, exclusively borrowed.
        check(unsafe { sys::fp4rl_rl_session_set(self.raw.as_ptr(), param.as_raw(), value) })?;
        Ok(self)
    }

    /// A hyper-parameter.
    pub fn get(&self, param: RlParam) -> Result<f64> {
        let mut v = 0.0;
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::fp4rl_rl_session_get(self.raw.as_ptr(), param.as_raw(), &mut v) })?;
        Ok(v)
    }

    /// The stop token ids (copied; may be empty). A completion ends with, and includes, the
    /// first one it samples.
    pub fn set_stop_tokens(&mut self, ids: &[i32]) -> Result<&mut Self> {
        // SAFETY: `ids` holds `ids.len()` elements.
        check(unsafe { sys::fp4rl_rl_session_set_stop_tokens(self.raw.as_ptr(), ids.as_ptr(), ids.len()) })?;
        Ok(self)
    }

    /// The stop token ids: the model's eos ids for a model from [`Model::from_pretrained`],
    /// until [`set_stop_tokens`](Self::set_stop_tokens) replaces them.
    pub fn stop_tokens(&self) -> Result<Vec<i32>> {
        let mut n = 0usize;
        // SAFETY: a live handle; ids NULL with cap 0 asks the count.
        check(unsafe { sys::fp4rl_rl_session_get_stop_tokens(self.raw.as_ptr(), ptr::null_mut(), 0, &mut n) })?;
        let mut ids = vec![0i32; n];
        // SAFETY: `ids` holds `ids.len()` writable elements.
        check(unsafe { sys::fp4rl_rl_session_get_stop_tokens(self.raw.as_ptr(), ids.as_mut_ptr(), ids.len(), &mut n) })?;
        ids.truncate(n);
        Ok(ids)
    }

    /// One complete step on `prompts` (each a slice of token ids), with rewards from `reward`:
    /// `reward(prompt_index, prompt, completion)` for each of the group_size completions of
    /// each prompt, called on this thread, one at a time. It returns an `f64`, or a `Result`
    /// whose `Err` fails the step.
    ///
    /// A reward closure that panics or returns `Err`, or a NaN reward, fails the step with
    /// [`Status::Callback`]; the library's message says which completion, and for a panic or
    /// an `Err` the message goes on with the panic's message or the error. On any error the
    /// model and the optimizer are exactly as before the step.
    pub fn step<P, F, R>(&mut self, prompts: &[P], reward: F) -> Result<()>
    where
        P: AsRef<[i32]>,
        F: FnMut(usize, &[i32], &[i32]) -> R,
        R: RewardValue,
    {
        let (tokens, offsets) = csr(prompts);
        self.step_csr(&tokens, &offsets, reward)
    }

    /// [`RlSession::step`] on prompts already in CSR form: prompt p is
    /// `tokens[offsets[p]..offsets[p + 1]]`, `offsets` has one more entry than there are
    /// prompts and starts at 0.
    pub fn step_csr<F, R>(&mut self, tokens: &[i32], offsets: &[usize], mut reward: F) -> Result<()>
    where
        F: FnMut(usize, &[i32], &[i32]) -> R,
        R: RewardValue,
    {
        let (t, o, n) = csr_args(tokens, offsets, "RlSession::step")?;
        let mut cb = Callback {
            f: &mut reward,
            failure: None,
        };
        // SAFETY: `t`/`o` are valid for the offsets (checked); `cb` outlives the call and the
        // trampoline is instantiated for exactly its type.
        let st = unsafe {
            sys::fp4rl_rl_session_step(
                self.raw.as_ptr(),
                t,
                o,
                n,
                Some(trampoline::<F, R>),
                (&mut cb as *mut Callback<'_, F>).cast(),
            )
        };
        match check(st) {
            Err(e) if e.status() == Status::Callback => match cb.failure {
                Some(why) => Err(Error::new(Status::Callback, format!("{}; {why}", e.message()))),
                None => Err(e),
            },
            other => other,
        }
    }

    /// The first half of the split form: sample group_size completions per prompt. Read them
    /// with [`RlSession::completions`], then [`RlSession::set_rewards`] and
    /// [`RlSession::train`].
    pub fn rollout<P: AsRef<[i32]>>(&mut self, prompts: &[P]) -> Result<()> {
        let (tokens, offsets) = csr(prompts);
        self.rollout_csr(&tokens, &offsets)
    }

    /// [`RlSession::rollout`] on prompts in CSR form.
    pub fn rollout_csr(&mut self, tokens: &[i32], offsets: &[usize]) -> Result<()> {
        let (t, o, n) = csr_args(tokens, offsets, "RlSession::rollout")?;
        // SAFETY: `t`/`o` are valid for the offsets (checked).
        check(unsafe { sys::fp4rl_rl_session_rollout(self.raw.as_ptr(), t, o, n) })
    }

    /// The number of completions of the last rollout (0 after training on it).
    pub fn num_completions(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::fp4rl_rl_session_num_completions(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }

    /// Completion `i` of the last rollout.
    pub fn completion(&self, i: usize) -> Result<Completion> {
        let (mut len, mut pi) = (0usize, 0usize);
        // SAFETY: NULL buffers with cap 0: the library only reports the length.
        check(unsafe {
            sys::fp4rl_rl_session_completion(
                self.raw.as_ptr(),
                i,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
                &mut len,
                &mut pi,
            )
        })?;
        let mut c = Completion {
            tokens: vec![0; len],
            logprobs: vec![0.0; len],
            prompt_index: pi,
        };
        // SAFETY: both buffers hold `len` elements, the cap passed.
        check(unsafe {
            sys::fp4rl_rl_session_completion(
                self.raw.as_ptr(),
                i,
                c.tokens.as_mut_ptr(),
                c.logprobs.as_mut_ptr(),
                len,
                &mut len,
                &mut c.prompt_index,
            )
        })?;
        Ok(c)
    }

    /// Every completion of the last rollout, in order.
    pub fn completions(&self) -> Result<Vec<Completion>> {
        (0..self.num_completions()?).map(|i| self.completion(i)).collect()
    }

    /// One reward per completion of the last rollout (finite).
    pub fn set_rewards(&mut self, rewards: &[f64]) -> Result<()> {
        // SAFETY: `rewards` holds `rewards.len()` elements; the library checks the count.
        check(unsafe { sys::fp4rl_rl_session_set_rewards(self.raw.as_ptr(), rewards.as_ptr(), rewards.len()) })
    }

    /// The second half of the split form: train on the rollout and its rewards.
    pub fn train(&mut self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::fp4rl_rl_session_train(self.raw.as_ptr()) })
    }

    /// A metric of the last step by name ("reward/mean", "pg/loss", "tis/mean", ...); an
    /// unknown name is [`Status::InvalidArgument`].
    pub fn metric(&self, name: &str) -> Result<f64> {
        let c = c_string(name, "RlSession::metric")?;
        let mut v = 0.0;
        // SAFETY: a live handle, a NUL-terminated name, a valid out-pointer.
        check(unsafe { sys::fp4rl_rl_session_metric(self.raw.as_ptr(), c.as_ptr(), &mut v) })?;
        Ok(v)
    }

    /// The names of all metrics, in the library's order.
    pub fn metric_names() -> Vec<&'static str> {
        let mut names = Vec::new();
        // SAFETY: fp4rl_rl_session_metric_name returns a static string, or NULL past the end.
        while let Some(n) = unsafe { crate::error::static_str(sys::fp4rl_rl_session_metric_name(names.len())) } {
            names.push(n);
        }
        names
    }

    /// Every metric of the last step, by name.
    pub fn metrics(&self) -> Result<HashMap<String, f64>> {
        RlSession::metric_names()
            .into_iter()
            .map(|n| Ok((n.to_string(), self.metric(n)?)))
            .collect()
    }

    /// The last step's metrics as one JSON object (`{"step": N, "reward/mean": ..., ...}`).
    pub fn metrics_json(&self) -> Result<String> {
        let mut need = 0usize;
        // SAFETY: a NULL buffer of size 0 only asks for the size; the call reports
        // FP4RL_ERR_SHAPE for that, which is expected here.
        let st = unsafe { sys::fp4rl_rl_session_metrics_json(self.raw.as_ptr(), ptr::null_mut(), 0, &mut need) };
        if st != sys::FP4RL_OK && st != sys::FP4RL_ERR_SHAPE {
            return Err(Error::last(st));
        }
        let mut buf = vec![0u8; need.max(1)];
        // SAFETY: `buf` holds `buf.len()` bytes.
        check(unsafe {
            sys::fp4rl_rl_session_metrics_json(self.raw.as_ptr(), buf.as_mut_ptr().cast(), buf.len(), &mut need)
        })?;
        // SAFETY: on success the buffer holds a NUL-terminated string.
        Ok(unsafe { owned_str(buf.as_ptr().cast()) })
    }

    /// Appends each step's metrics JSON as a line to this file (`None` stops).
    pub fn set_metrics_file(&mut self, jsonl_path: Option<&Path>) -> Result<()> {
        let p = jsonl_path
            .map(|p| c_path(p, "RlSession::set_metrics_file"))
            .transpose()?;
        // SAFETY: a live handle; NULL or a NUL-terminated path (the library copies it).
        check(unsafe {
            sys::fp4rl_rl_session_set_metrics_file(self.raw.as_ptr(), p.as_ref().map_or(ptr::null(), |p| p.as_ptr()))
        })
    }

    /// The number of completed steps.
    pub fn step_count(&self) -> Result<i64> {
        let mut n = 0;
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::fp4rl_rl_session_step_count(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }

    /// Saves the full state (weights, optimizer, step, random state, policy, hyper-parameters,
    /// stop tokens, config) to directory `dir`, atomically.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let p = c_path(dir.as_ref(), "RlSession::save")?;
        // SAFETY: a live handle and a NUL-terminated path.
        check(unsafe { sys::fp4rl_rl_session_save(self.raw.as_ptr(), p.as_ptr()) })
    }

    /// Restores a checkpoint saved by [`RlSession::save`] into this session and its model
    /// (same model config); resuming continues bit-identically on the CPU. On error nothing
    /// changes.
    pub fn load(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let p = c_path(dir.as_ref(), "RlSession::load")?;
        // SAFETY: a live handle and a NUL-terminated path.
        check(unsafe { sys::fp4rl_rl_session_load(self.raw.as_ptr(), p.as_ptr()) })
    }

    /// The raw handle, for calls into fp4rl-sys. It stays owned by this `RlSession`.
    pub fn as_ptr(&self) -> *mut sys::fp4rl_rl_session {
        self.raw.as_ptr()
    }
}

impl Drop for RlSession<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the handle and free it once; the model it borrows is still alive.
        unsafe { sys::fp4rl_rl_session_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for RlSession<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RlSession")
            .field("steps", &self.step_count().ok())
            .finish()
    }
}
