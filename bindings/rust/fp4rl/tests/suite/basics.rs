//! Version, Status and Error, the enums, Context and QuantPolicy.
use fp4rl::sys;
use fp4rl::*;

use crate::common::assert_err;

#[test]
fn version_matches_the_header() {
    assert_eq!(version_number(), sys::FP4RL_VERSION_NUMBER as u32);
    assert_eq!(
        version(),
        format!(
            "{}.{}.{}",
            sys::FP4RL_VERSION_MAJOR,
            sys::FP4RL_VERSION_MINOR,
            sys::FP4RL_VERSION_PATCH
        )
    );
}

#[test]
fn status_round_trips_and_has_library_names() {
    assert_eq!(Status::from_raw(sys::FP4RL_OK), None);
    let all = [
        (Status::InvalidArgument, "FP4RL_ERR_INVALID_ARGUMENT"),
        (Status::Shape, "FP4RL_ERR_SHAPE"),
        (Status::Dtype, "FP4RL_ERR_DTYPE"),
        (Status::Unsupported, "FP4RL_ERR_UNSUPPORTED"),
        (Status::OutOfMemory, "FP4RL_ERR_OUT_OF_MEMORY"),
        (Status::Device, "FP4RL_ERR_DEVICE"),
        (Status::Io, "FP4RL_ERR_IO"),
        (Status::Corrupt, "FP4RL_ERR_CORRUPT"),
        (Status::Callback, "FP4RL_ERR_CALLBACK"),
        (Status::Internal, "FP4RL_ERR_INTERNAL"),
    ];
    for (s, name) in all {
        assert_eq!(Status::from_raw(s.as_raw()), Some(s));
        assert_eq!(s.name(), name);
        assert_eq!(s.to_string(), name);
    }
    assert_eq!(Status::from_raw(77), Some(Status::Unknown(77)));
    assert_eq!(Status::Unknown(77).as_raw(), 77);
    assert_eq!(Status::Unknown(77).name(), "FP4RL_STATUS_UNKNOWN");
    let e = Error::new(Status::Shape, "two by three");
    assert_eq!(e.to_string(), "FP4RL_ERR_SHAPE: two by three");
    let boxed: Box<dyn std::error::Error> = Box::new(e.clone());
    assert_eq!(boxed.to_string(), e.to_string());
}

#[test]
fn enums_round_trip_through_raw_values() {
    fn check<T: Copy + PartialEq + std::fmt::Debug>(all: &[T], raw: fn(T) -> i32, from: fn(i32) -> Option<T>) {
        for (i, &v) in all.iter().enumerate() {
            assert_eq!(raw(v), i as i32, "{v:?}: the C enums are dense from 0");
            assert_eq!(from(raw(v)), Some(v));
        }
        assert_eq!(from(all.len() as i32), None);
        assert_eq!(from(-1), None);
    }
    check(Device::ALL, Device::as_raw, Device::from_raw);
    check(DType::ALL, DType::as_raw, DType::from_raw);
    check(ScaleRule::ALL, ScaleRule::as_raw, ScaleRule::from_raw);
    check(Rounding::ALL, Rounding::as_raw, Rounding::from_raw);
    check(Numerics::ALL, Numerics::as_raw, Numerics::from_raw);
    check(Resq::ALL, Resq::as_raw, Resq::from_raw);
    check(Role::ALL, Role::as_raw, Role::from_raw);
    check(QParam::ALL, QParam::as_raw, QParam::from_raw);
    check(Preset::ALL, Preset::as_raw, Preset::from_raw);
    check(MParam::ALL, MParam::as_raw, MParam::from_raw);
    check(ModelInfo::ALL, ModelInfo::as_raw, ModelInfo::from_raw);
    check(RlParam::ALL, RlParam::as_raw, RlParam::from_raw);
    assert_eq!(QParam::ALL.len(), sys::FP4RL_QP_COUNT as usize);
    assert_eq!(MParam::ALL.len(), sys::FP4RL_MP_COUNT as usize);
    assert_eq!(RlParam::ALL.len(), sys::FP4RL_RL_PARAM_COUNT as usize);
    let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    assert_eq!(names, ["f32", "bf16", "i32", "mxfp4", "nvfp4", "hif4", "mxfp8_e4m3"]);
    let mut qnames: Vec<&str> = QParam::ALL.iter().map(|p| p.name()).collect();
    assert_eq!(qnames[0], "tile_weight");
    qnames.sort();
    qnames.dedup();
    assert_eq!(
        qnames.len(),
        QParam::ALL.len(),
        "every policy parameter has its own name"
    );
    assert!(!qnames.contains(&"unknown"));
}

#[test]
fn context_memory_returns_to_baseline() -> Result<()> {
    let ctx = Context::cpu()?;
    let base = ctx.memory()?;
    assert!(base.reserved == base.in_use && base.peak >= base.in_use);
    let t = Tensor::from_slice(&ctx, &vec![0.0f32; 256 * 256], &[256, 256])?;
    assert!(ctx.memory()?.in_use >= base.in_use + 256 * 256 * 4);
    drop(t);
    let m = ctx.memory()?;
    assert_eq!(m.in_use, base.in_use, "a destroyed tensor gives its bytes back");
    assert!(m.peak >= base.in_use + 256 * 256 * 4);
    ctx.reset_peak_memory()?;
    assert_eq!(ctx.memory()?.peak, base.in_use);
    Ok(())
}

#[test]
fn context_cpu_and_random_state() -> Result<()> {
    let ctx = Context::cpu()?;
    assert_eq!(ctx.device(), Device::Cpu);
    assert_eq!(
        ctx.rng()?,
        RngState { seed: 0, offset: 0 },
        "a new context has seed 0 and offset 0"
    );
    ctx.set_seed(1234)?;
    ctx.set_rng_offset(17)?;
    assert_eq!(ctx.rng()?, RngState { seed: 1234, offset: 17 });
    ctx.set_seed(99)?;
    assert_eq!(
        ctx.rng()?,
        RngState { seed: 99, offset: 0 },
        "set_seed resets the offset"
    );
    assert!(format!("{ctx:?}").contains("Cpu"));
    assert!(!ctx.as_ptr().is_null());
    Ok(())
}

#[test]
fn context_errors() {
    // A CPU context has ordinal 0 only; negative ordinals are rejected: the library's messages.
    assert_err(
        Context::new(Device::Cpu, 1),
        Status::InvalidArgument,
        &["fp4rl_context_create", "ordinal 0 only"],
    );
    assert_err(Context::new(Device::Cpu, -1), Status::InvalidArgument, &["negative"]);
    // CUDA: works on a GPU machine; otherwise DEVICE (no GPU) or UNSUPPORTED (no CUDA build).
    match Context::cuda(0) {
        Ok(ctx) => {
            assert_eq!(ctx.device(), Device::Cuda);
            assert_err(Context::cuda(100000), Status::Device, &["fp4rl_context_create"]);
        }
        Err(e) => {
            assert!(matches!(e.status(), Status::Device | Status::Unsupported), "{e}");
            // UNSUPPORTED (no CUDA build) starts with the function; DEVICE reads "no CUDA device: fp4rl_context_create: ..."
            assert!(e.message().contains("fp4rl_context_create"), "{e}");
        }
    }
}

#[test]
fn distributed_context_arguments() -> Result<()> {
    assert_eq!(Context::cpu()?.rank()?, (0, 1), "a plain context is rank 0 of 1");
    let id = match nccl_unique_id() {
        Ok(id) => id,
        Err(e) => {
            assert_eq!(e.status(), Status::Unsupported, "{e}");
            vec![0u8; sys::FP4RL_NCCL_UNIQUE_ID_BYTES as usize]
        }
    };
    assert_eq!(id.len(), sys::FP4RL_NCCL_UNIQUE_ID_BYTES as usize);
    assert_err(Context::distributed(0, 2, 2, &id), Status::InvalidArgument, &["rank 2"]);
    assert_err(
        Context::distributed(0, 0, 0, &id),
        Status::InvalidArgument,
        &["world_size"],
    );
    assert_err(
        Context::distributed(0, 0, 1, &id[..8]),
        Status::InvalidArgument,
        &["8 bytes"],
    );
    Ok(())
}

#[test]
fn context_is_send_and_works_on_another_thread() -> Result<()> {
    fn assert_send<T: Send>() {}
    assert_send::<Context>();
    assert_send::<QuantPolicy>();
    let ctx = Context::cpu()?;
    ctx.set_seed(5)?;
    let ctx = std::thread::spawn(move || -> Result<Context> {
        // the error message is per thread: a failure here is reported here
        assert_err(
            Tensor::zeros(&ctx, DType::Mxfp4, &[4]),
            Status::Dtype,
            &["fp4rl_tensor_zeros"],
        );
        let t = Tensor::from_slice(&ctx, &[1.0f32, 2.0], &[2])?;
        assert_eq!(t.to_vec::<f32>()?, [1.0, 2.0]);
        drop(t);
        Ok(ctx)
    })
    .join()
    .unwrap()?;
    assert_eq!(ctx.rng()?.seed, 5);
    Ok(())
}

#[test]
fn policy_defaults() -> Result<()> {
    let p = QuantPolicy::new()?;
    for role in Role::ALL.iter().copied() {
        assert_eq!(p.tile(role)?, 0);
        assert_eq!(p.rounding(role)?, Rounding::Nearest);
        assert_eq!(p.format(role)?, DType::Mxfp4);
    }
    assert_eq!(p.scale_rule()?, ScaleRule::OcpFloor);
    assert_eq!(p.seed()?, None);
    assert_eq!(p.format_qk()?, None);
    assert_eq!(p.train_numerics()?, Numerics::Fp4);
    assert_eq!(p.rollout_numerics()?, Numerics::W4A4);
    assert_eq!(p.resq()?, Resq::Off);
    let dbg = format!("{p:?}");
    for q in QParam::ALL {
        assert!(dbg.contains(q.name()), "{dbg}");
    }
    Ok(())
}

#[test]
fn policy_presets() -> Result<()> {
    let s = QuantPolicy::with_preset(Preset::Stable2dMxfp4)?;
    assert_eq!(s.tile(Role::Weight)?, 32);
    assert_eq!(s.tile(Role::Activation)?, 32);
    assert_eq!(s.tile(Role::Gradient)?, 0);
    assert_eq!(s.scale_rule()?, ScaleRule::TruncationFree);
    assert_eq!(s.rounding(Role::Gradient)?, Rounding::Stochastic);
    assert_eq!(s.format_qk()?, Some(DType::Mxfp8E4m3));
    assert_eq!(s.resq()?, Resq::Off);
    let mut h = QuantPolicy::with_preset(Preset::Hif4Rl)?;
    for role in Role::ALL.iter().copied() {
        assert_eq!(h.format(role)?, DType::Hif4);
    }
    assert_eq!(h.resq()?, Resq::TwoFour);
    assert_eq!(h.rollout_numerics()?, Numerics::W4A4);
    h.apply_preset(Preset::Default)?;
    assert_eq!(h.format(Role::Weight)?, DType::Mxfp4);
    assert_eq!(h.resq()?, Resq::Off);
    Ok(())
}

#[test]
fn policy_setters_chain_and_round_trip() -> Result<()> {
    let mut p = QuantPolicy::new()?;
    p.set_format(Role::Weight, DType::Nvfp4)?
        .set_tile(Role::Weight, 16)?
        .set_rounding(Role::Gradient, Rounding::Stochastic)?
        .set_scale_rule(ScaleRule::TruncationFree)?
        .set_seed(Some(42))?
        .set_format_qk(Some(DType::Mxfp8E4m3))?
        .set_train_numerics(Numerics::Bf16)?
        .set_rollout_numerics(Numerics::W4A16)?
        .set_resq(Resq::Block50)?;
    assert_eq!(p.format(Role::Weight)?, DType::Nvfp4);
    assert_eq!(p.tile(Role::Weight)?, 16);
    assert_eq!(p.rounding(Role::Gradient)?, Rounding::Stochastic);
    assert_eq!(p.scale_rule()?, ScaleRule::TruncationFree);
    assert_eq!(p.seed()?, Some(42));
    assert_eq!(p.format_qk()?, Some(DType::Mxfp8E4m3));
    assert_eq!(p.train_numerics()?, Numerics::Bf16);
    assert_eq!(p.rollout_numerics()?, Numerics::W4A16);
    assert_eq!(p.resq()?, Resq::Block50);
    assert_eq!(p.get(QParam::TileWeight)?, 16);
    p.set(QParam::TileWeight, 0)?.set_seed(None)?.set_format_qk(None)?;
    assert_eq!(p.seed()?, None);
    assert_eq!(p.format_qk()?, None);
    Ok(())
}

#[test]
fn policy_errors_name_the_parameter_and_change_nothing() -> Result<()> {
    let mut p = QuantPolicy::new()?;
    assert_err(p.set_tile(Role::Weight, 48), Status::InvalidArgument, &["tile_weight"]);
    assert_eq!(p.tile(Role::Weight)?, 0, "a rejected value leaves the policy unchanged");
    // HiF4 takes 64 x 64 tiles only
    p.set_format(Role::Activation, DType::Hif4)?;
    assert_err(
        p.set_tile(Role::Activation, 32),
        Status::InvalidArgument,
        &["tile_activation"],
    );
    // a dense dtype is not a quantized format
    assert_err(
        p.set_format(Role::Weight, DType::F32),
        Status::InvalidArgument,
        &["format_weight"],
    );
    // a seed above INT64_MAX cannot be represented: the library rejects it
    assert_err(p.set_seed(Some(u64::MAX)), Status::InvalidArgument, &["seed"]);
    assert_eq!(p.seed()?, None);
    // FP4 training numerics: W4A4 is a rollout setting
    assert_err(
        p.set_train_numerics(Numerics::W4A4),
        Status::InvalidArgument,
        &["train_numerics"],
    );
    assert_eq!(p.train_numerics()?, Numerics::Fp4);
    Ok(())
}
