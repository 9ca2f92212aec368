//! `QuantPolicy`: what is quantized how.

use std::fmt;
use std::ptr::{self, NonNull};

use fp4rl_sys as sys;

use crate::enums::{DType, Numerics, Preset, QParam, Resq, Role, Rounding, ScaleRule};
use crate::error::{check, Error, Result, Status};

/// A quantization policy: formats, tiles, rounding and numerics per role, set through
/// (parameter, value) pairs. Models and sessions copy a policy when they take one, so a policy
/// can be changed or dropped afterwards.
///
/// Setters return `&mut Self` so they chain:
/// ```no_run
/// # fn main() -> fp4rl::Result<()> {
/// use fp4rl::{DType, QuantPolicy, Preset, Resq, Role};
/// let mut p = QuantPolicy::with_preset(Preset::Hif4Rl)?;
/// p.set_format(Role::Gradient, DType::Mxfp4)?.set_resq(Resq::Off)?;
/// # Ok(()) }
/// ```
/// An unknown parameter or out-of-range value is [`Status::InvalidArgument`] with the library's
/// message naming the parameter and the allowed values; the policy is then unchanged.
pub struct QuantPolicy {
    raw: NonNull<sys::fp4rl_quant_policy>,
}

// SAFETY: a policy is plain data owned by this handle; `&self` methods only read it
// (fp4rl_quant_policy_get takes a const pointer) and `&mut self` ones are exclusive.
unsafe impl Send for QuantPolicy {}
unsafe impl Sync for QuantPolicy {}

fn bad_value(param: QParam, v: i64) -> Error {
    Error::new(
        Status::Internal,
        format!(
            "QuantPolicy: the library returned {v} for {}, which this binding does not know",
            param.name()
        ),
    )
}

impl QuantPolicy {
    /// A policy with the plain defaults (1D, OCP floor, nearest, MXFP4, FP4 training, W4A4
    /// rollout, no ResQ).
    pub fn new() -> Result<QuantPolicy> {
        let mut raw = ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check(unsafe { sys::fp4rl_quant_policy_create(&mut raw) })?;
        Ok(QuantPolicy {
            raw: NonNull::new(raw).expect("fp4rl_quant_policy_create returned OK and NULL"),
        })
    }

    /// A policy set to a named recipe.
    pub fn with_preset(preset: Preset) -> Result<QuantPolicy> {
        let mut p = QuantPolicy::new()?;
        p.apply_preset(preset)?;
        Ok(p)
    }

    /// Resets every parameter to a named recipe.
    pub fn apply_preset(&mut self, preset: Preset) -> Result<&mut Self> {
        // SAFETY: a live handle, exclusively borrowed.
        check(unsafe { sys::fp4rl_quant_policy_apply_preset(self.raw.as_ptr(), preset.as_raw()) })?;
        Ok(self)
    }

    /// Sets one parameter to a raw value (see the typed setters).
    pub fn set(&mut self, param: QParam, value: i64) -> Result<&mut Self> {
        // SAFETY: a live handle, exclusively borrowed.
        check(unsafe { sys::fp4rl_quant_policy_set(self.raw.as_ptr(), param.as_raw(), value) })?;
        Ok(self)
    }

    /// One parameter's raw value.
    pub fn get(&self, param: QParam) -> Result<i64> {
        let mut v = 0;
        // SAFETY: a live handle and a valid out-pointer.
        check(unsafe { sys::fp4rl_quant_policy_get(self.raw.as_ptr(), param.as_raw(), &mut v) })?;
        Ok(v)
    }

    /// Tiles of `role`: 0 = 1D blocks along the last dim; T = 2D T x T tiles (16, 32 or 64
    /// for MXFP4, MXFP8 and NVFP4; 64 for HiF4).
    pub fn set_tile(&mut self, role: Role, tile: i64) -> Result<&mut Self> {
        self.set(QParam::tile(role), tile)
    }
    pub fn tile(&self, role: Role) -> Result<i64> {
        self.get(QParam::tile(role))
    }

    /// The block scale rule of MXFP4 / MXFP8.
    pub fn set_scale_rule(&mut self, rule: ScaleRule) -> Result<&mut Self> {
        self.set(QParam::ScaleRule, rule.as_raw().into())
    }
    pub fn scale_rule(&self) -> Result<ScaleRule> {
        let v = self.get(QParam::ScaleRule)?;
        i32::try_from(v)
            .ok()
            .and_then(ScaleRule::from_raw)
            .ok_or_else(|| bad_value(QParam::ScaleRule, v))
    }

    /// Rounding of `role`'s quantization.
    pub fn set_rounding(&mut self, role: Role, rounding: Rounding) -> Result<&mut Self> {
        self.set(QParam::rounding(role), rounding.as_raw().into())
    }
    pub fn rounding(&self, role: Role) -> Result<Rounding> {
        let v = self.get(QParam::rounding(role))?;
        i32::try_from(v)
            .ok()
            .and_then(Rounding::from_raw)
            .ok_or_else(|| bad_value(QParam::rounding(role), v))
    }

    /// Seed of stochastic rounding: `None` = the context's seed, `Some(s)` (s <= i64::MAX)
    /// overrides it. A larger seed is passed as an out-of-range value for the library to reject.
    pub fn set_seed(&mut self, seed: Option<u64>) -> Result<&mut Self> {
        let raw = match seed {
            None => -1,
            Some(s) => i64::try_from(s).unwrap_or(i64::MIN),
        };
        self.set(QParam::Seed, raw)
    }
    pub fn seed(&self) -> Result<Option<u64>> {
        let v = self.get(QParam::Seed)?;
        Ok(u64::try_from(v).ok())
    }

    /// The quantized format of `role` in the model's linear layers.
    pub fn set_format(&mut self, role: Role, format: DType) -> Result<&mut Self> {
        self.set(QParam::format(role), format.as_raw().into())
    }
    pub fn format(&self, role: Role) -> Result<DType> {
        let v = self.get(QParam::format(role))?;
        i32::try_from(v)
            .ok()
            .and_then(DType::from_raw)
            .ok_or_else(|| bad_value(QParam::format(role), v))
    }

    /// Format of q_proj and k_proj: `None` = the same as the other linears.
    pub fn set_format_qk(&mut self, format: Option<DType>) -> Result<&mut Self> {
        self.set(QParam::FormatQk, format.map_or(-1, |f| f.as_raw().into()))
    }
    pub fn format_qk(&self) -> Result<Option<DType>> {
        let v = self.get(QParam::FormatQk)?;
        if v == -1 {
            return Ok(None);
        }
        i32::try_from(v)
            .ok()
            .and_then(DType::from_raw)
            .map(Some)
            .ok_or_else(|| bad_value(QParam::FormatQk, v))
    }

    /// Numerics of training (FP32, BF16 or FP4).
    pub fn set_train_numerics(&mut self, n: Numerics) -> Result<&mut Self> {
        self.set(QParam::TrainNumerics, n.as_raw().into())
    }
    pub fn train_numerics(&self) -> Result<Numerics> {
        let v = self.get(QParam::TrainNumerics)?;
        i32::try_from(v)
            .ok()
            .and_then(Numerics::from_raw)
            .ok_or_else(|| bad_value(QParam::TrainNumerics, v))
    }

    /// Numerics of the rollout (FP32, BF16, W4A16, W16A4, W4A4).
    pub fn set_rollout_numerics(&mut self, n: Numerics) -> Result<&mut Self> {
        self.set(QParam::RolloutNumerics, n.as_raw().into())
    }
    pub fn rollout_numerics(&self) -> Result<Numerics> {
        let v = self.get(QParam::RolloutNumerics)?;
        i32::try_from(v)
            .ok()
            .and_then(Numerics::from_raw)
            .ok_or_else(|| bad_value(QParam::RolloutNumerics, v))
    }

    /// The Rollout-ResQ pattern.
    pub fn set_resq(&mut self, resq: Resq) -> Result<&mut Self> {
        self.set(QParam::Resq, resq.as_raw().into())
    }
    pub fn resq(&self) -> Result<Resq> {
        let v = self.get(QParam::Resq)?;
        i32::try_from(v)
            .ok()
            .and_then(Resq::from_raw)
            .ok_or_else(|| bad_value(QParam::Resq, v))
    }

    /// The raw handle, for calls into fp4rl-sys. It stays owned by this `QuantPolicy`.
    pub fn as_ptr(&self) -> *mut sys::fp4rl_quant_policy {
        self.raw.as_ptr()
    }
}

/// `Option<&QuantPolicy>` as the C API takes it: NULL for the defaults.
pub(crate) fn policy_ptr(p: Option<&QuantPolicy>) -> *const sys::fp4rl_quant_policy {
    p.map_or(ptr::null(), |p| p.raw.as_ptr().cast_const())
}

impl Drop for QuantPolicy {
    fn drop(&mut self) {
        // SAFETY: we own the handle; models and sessions keep copies, not this handle.
        unsafe { sys::fp4rl_quant_policy_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for QuantPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for &p in QParam::ALL {
            m.entry(&p.name(), &self.get(p).ok());
        }
        m.finish()
    }
}
