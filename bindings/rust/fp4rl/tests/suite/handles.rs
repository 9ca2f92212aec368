//! Handles and their lifetimes: objects outliving what made them where the C API copies
//! (policies, tensor sources), legal drop orders, moved and boxed handles. Freeing a context or
//! a model while something still borrows it does not compile: see the compile_fail examples
//! on `Tensor` and `RlSession`. (The 1000-round leak test is tests/lifecycle.rs.)
use fp4rl::*;

use crate::common::{addition, TINY};

#[test]
fn sessions_and_tensors_in_any_legal_drop_order() -> Result<()> {
    let ctx = Context::cpu()?;
    let model = Model::from_config(&ctx, TINY, None, 1)?;
    let tensors: Vec<Tensor> = (0..10)
        .map(|i| Tensor::from_slice(&ctx, &[i as f32; 64], &[64]))
        .collect::<Result<_>>()?;
    let quantized: Vec<Tensor> = tensors
        .iter()
        .map(|t| t.quantize(DType::Mxfp4, None, Role::Weight))
        .collect::<Result<_>>()?;
    drop(tensors);
    let s1 = RlSession::new(&model, None)?;
    let mut s2 = RlSession::new(&model, None)?;
    drop(s1); // sessions of one model are independent
    s2.set_stop_tokens(&[addition::END])?
        .set(RlParam::GroupSize, 2.0)?
        .set(RlParam::MaxNewTokens, 2.0)?;
    s2.step(&[addition::prompt(1, 2)], |_, _, _| 0.0)?;
    // a session that failed in its closure is dropped like any other
    assert!(s2
        .step(&[addition::prompt(1, 2)], |_, _, _| -> f64 {
            panic!("dropped after this")
        })
        .is_err());
    drop(s2);
    assert_eq!(quantized[3].dequantize(DType::F32)?.to_vec::<f32>()?, [3.0; 64]);
    drop(model);
    drop(quantized);
    Ok(())
}

#[test]
fn boxed_and_moved_handles() -> Result<()> {
    // Handles are plain owners: moving or boxing them moves the pointer, never frees it.
    let ctx = Box::new(Context::cpu()?);
    let t = Tensor::from_slice(&ctx, &[1.0f32, 2.0], &[2])?;
    let moved = Box::new(t);
    let model = Model::from_config(&ctx, TINY, None, 3)?;
    let models = [model];
    let session = RlSession::new(&models[0], None)?;
    let sessions = Box::new(session);
    assert_eq!(sessions.step_count()?, 0);
    assert_eq!(moved.to_vec::<f32>()?, [1.0, 2.0]);
    Ok(())
}
