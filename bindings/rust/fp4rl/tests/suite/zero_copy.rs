//! Zero copy: host slices wrapped in place, a tensor's address, model parameter views, streams.
use std::ffi::c_void;

use fp4rl::*;

use crate::common::{assert_err, TINY};

#[test]
fn wrapped_slices_are_used_in_place() -> Result<()> {
    let ctx = Context::cpu()?;
    let mut buf = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let addr = buf.as_ptr() as *mut c_void;
    {
        let t = Tensor::wrap_slice(&ctx, &mut buf, &[2, 3])?;
        assert_eq!(t.data_ptr()?, addr); // no copy
        assert_eq!((t.dtype(), t.shape()), (DType::F32, vec![2, 3]));
        let a = Tensor::from_slice(&ctx, &[1.0f32, 0.0, 0.0], &[1, 3])?;
        let mut out = vec![0.0f32; 2];
        {
            let mut c = Tensor::wrap_slice(&ctx, &mut out, &[1, 2])?;
            c.matmul(&a, &t)?; // c = a t^T, written into `out`
        }
        assert_eq!(out, vec![1.0, 4.0]);
    }
    assert_eq!(buf[4], 5.0);
    // wrong length, a quantized dtype through the raw form, non-contiguous strides
    let mut small = vec![0.0f32; 3];
    assert_err(Tensor::wrap_slice(&ctx, &mut small, &[2, 2]), Status::Shape, &[]);
    let mut four = vec![0.0f32; 4];
    let p = four.as_mut_ptr().cast();
    assert_err(unsafe { Tensor::wrap_raw(&ctx, DType::Hif4, &[2, 2], None, p, None, std::ptr::null_mut()) }, Status::Dtype, &[]);
    assert_err(
        unsafe { Tensor::wrap_raw(&ctx, DType::F32, &[2, 2], Some(&[1, 2]), p, None, std::ptr::null_mut()) },
        Status::InvalidArgument,
        &["contiguous"],
    );
    assert_err(unsafe { Tensor::wrap_raw(&ctx, DType::F32, &[2, 2], Some(&[2]), p, None, std::ptr::null_mut()) }, Status::Shape, &[]);
    Ok(())
}

static mut RELEASED: usize = 0;
unsafe extern "C" fn count(_ctx: *mut c_void) {
    unsafe { RELEASED += 1 };
}

#[test]
fn release_runs_once_when_dropped() -> Result<()> {
    let ctx = Context::cpu()?;
    let mut v = vec![7i32; 8];
    let t = unsafe { Tensor::wrap_raw(&ctx, DType::I32, &[8], None, v.as_mut_ptr().cast(), Some(count), std::ptr::null_mut())? };
    assert_eq!(t.to_vec::<i32>()?, vec![7; 8]);
    assert_eq!(unsafe { RELEASED }, 0);
    drop(t);
    assert_eq!(unsafe { RELEASED }, 1);
    Ok(())
}

#[test]
fn param_tensor_is_the_master_weight() -> Result<()> {
    let ctx = Context::cpu()?;
    let m = Model::from_config(&ctx, TINY, None, 1)?;
    let name = "model.layers.0.self_attn.o_proj.weight";
    let v = m.param_tensor(name)?;
    assert_eq!(v.shape(), m.param_shape(name)?);
    assert_eq!(v.to_vec::<f32>()?, m.param(name)?);
    let p = v.data_ptr()?.cast::<f32>();
    unsafe { *p = 0.25 }; // a write through the view is the weight
    assert_eq!(m.param(name)?[0], 0.25);
    assert_err(m.param_tensor("no.such.weight"), Status::InvalidArgument, &[]);
    let last = m.param(name)?;
    drop(m); // the view keeps the memory
    assert_eq!(v.to_vec::<f32>()?, last);
    // a CPU context has no streams
    unsafe {
        ctx.set_stream(std::ptr::null_mut())?;
        assert_err(ctx.set_stream(8 as *mut c_void), Status::Unsupported, &[]);
    }
    let q = Tensor::from_slice(&ctx, &[1.0f32; 32], &[1, 32])?.quantize(DType::Mxfp4, None, Role::Weight)?;
    assert_err(q.data_ptr(), Status::Dtype, &[]);
    Ok(())
}
