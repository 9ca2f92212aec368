//! Tensors and the tensor-level API on slices and Vecs.
use fp4rl::*;

use crate::common::assert_err;

#[test]
fn dense_round_trips_every_element_type() -> Result<()> {
    let ctx = Context::cpu()?;
    let f: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let t = Tensor::from_slice(&ctx, &f, &[2, 3])?;
    assert_eq!(t.dtype(), DType::F32);
    assert_eq!(
        (t.ndim(), t.shape(), t.dim(1), t.dim(7), t.numel(), t.nbytes()),
        (2, vec![2, 3], 3, 0, 6, 24)
    );
    assert_eq!(t.to_vec::<f32>()?, f);
    // the handle's context is ours
    assert_eq!(unsafe { sys::fp4rl_tensor_context(t.as_ptr()) }, ctx.as_ptr());
    assert!(std::ptr::eq(t.context(), &ctx));
    assert_eq!(format!("{t:?}"), "Tensor { dtype: F32, shape: [2, 3] }");

    let bf: Vec<u16> = vec![0x3F80, 0xC000, 0x0000, 0x7F80]; // 1, -2, 0, +inf
    let b = Tensor::from_slice(&ctx, &bf, &[4])?;
    assert_eq!((b.dtype(), b.nbytes()), (DType::Bf16, 8));
    assert_eq!(b.to_vec::<u16>()?, bf);

    let iv: Vec<i32> = vec![-3, 0, 7, i32::MAX, i32::MIN, 1, 2, 3];
    let i = Tensor::from_slice(&ctx, &iv, &[2, 2, 2])?;
    assert_eq!(i.dtype(), DType::I32);
    assert_eq!(i.to_vec::<i32>()?, iv);

    let z = Tensor::zeros(&ctx, DType::F32, &[3, 1])?;
    assert_eq!(z.to_vec::<f32>()?, [0.0; 3]);
    let zb = Tensor::zeros(&ctx, DType::Bf16, &[2])?;
    assert_eq!(zb.to_vec::<u16>()?, [0, 0]);
    Ok(())
}

#[test]
fn tensor_errors() -> Result<()> {
    let ctx = Context::cpu()?;
    // a slice that does not fill the shape: caught here (C cannot see the slice's length)
    assert_err(
        Tensor::from_slice(&ctx, &[1.0f32; 5], &[2, 3]),
        Status::Shape,
        &["Tensor::from_slice", "5 elements", "[2, 3]"],
    );
    // shapes the library rejects: its messages
    assert_err(
        Tensor::from_slice(&ctx, &[1.0f32; 0], &[0]),
        Status::Shape,
        &["fp4rl_tensor_from_host", "dim 0 is 0"],
    );
    assert_err(
        Tensor::from_slice(&ctx, &[1.0f32], &[]),
        Status::Shape,
        &["fp4rl_tensor_from_host", "ndim is 0"],
    );
    assert_err(
        Tensor::from_slice(&ctx, &[1.0f32], &[1; 9]),
        Status::Shape,
        &["fp4rl_tensor_from_host", "ndim is 9"],
    );
    assert_err(
        Tensor::zeros(&ctx, DType::F32, &[2, -1]),
        Status::Shape,
        &["fp4rl_tensor_zeros", "dim 1 is -1"],
    );
    assert_err(
        Tensor::zeros(&ctx, DType::Hif4, &[64]),
        Status::Dtype,
        &["fp4rl_tensor_zeros"],
    );
    // reading a tensor as the wrong element type
    let t = Tensor::from_slice(&ctx, &[1.0f32, 2.0], &[2])?;
    assert_err(t.to_vec::<i32>(), Status::Dtype, &["Tensor::to_vec", "f32"]);
    assert_err(
        t.quant_info(),
        Status::Dtype,
        &["fp4rl_tensor_quant_info", "not a quantized dtype"],
    );
    assert_err(t.codes(), Status::Dtype, &["not a quantized dtype"]);
    assert_err(t.dequantize(DType::F32), Status::Dtype, &["fp4rl_dequantize"]);
    assert_err(t.hif4_scale_words(), Status::Dtype, &["hif4"]);
    // a quantized tensor is read through dequantize or its codes and scales: the library says so
    let q = t.quantize(DType::Mxfp4, None, Role::Weight)?;
    assert_err(
        q.to_vec::<f32>(),
        Status::Dtype,
        &["fp4rl_tensor_to_host", "dequantize it first"],
    );
    assert_err(
        q.quantize(DType::Mxfp4, None, Role::Weight),
        Status::Dtype,
        &["fp4rl_quantize"],
    );
    assert_err(
        t.quantize(DType::F32, None, Role::Weight),
        Status::Dtype,
        &["fp4rl_quantize"],
    );
    Ok(())
}

// HiF4 spec vector D: x[j] = (j - 32) / 16 -> scale word 0xEC3FC3B9, x[0] -> -1.875.
#[test]
fn hif4_spec_vector_d() -> Result<()> {
    let ctx = Context::cpu()?;
    let x: Vec<f32> = (0..64).map(|j| (j as f32 - 32.0) / 16.0).collect();
    let src = Tensor::from_slice(&ctx, &x, &[1, 64])?;
    let q = src.quantize(DType::Hif4, None, Role::Weight)?;
    assert_eq!(q.dtype(), DType::Hif4);
    assert_eq!(
        q.quant_info()?,
        QuantInfo {
            tile: 0,
            codes_bytes: 32,
            scales_bytes: 4,
            tensor_scale: 1.0
        }
    );
    assert_eq!(q.hif4_scale_words()?, [0xEC3F_C3B9]);
    assert_eq!(q.scales()?, 0xEC3F_C3B9u32.to_le_bytes());
    let y = q.dequantize(DType::F32)?.to_vec::<f32>()?;
    assert_eq!(y[0], -1.875);
    // the sign bit of every code (bit 3) says negative exactly for j < 32
    let codes = q.codes()?;
    for j in 0..64 {
        let code = (codes[j / 2] >> (4 * (j % 2))) & 0xF;
        assert_eq!(code >> 3 == 1, j < 32, "j = {j}");
    }
    Ok(())
}

#[test]
fn quantize_dequantize_and_error_report() -> Result<()> {
    let ctx = Context::cpu()?;
    // values on the E2M1 grid with one power-of-two scale: MXFP4 is exact
    let grid = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let x: Vec<f32> = (0..64)
        .map(|i| grid[i % 8] * if i % 3 == 0 { -1.0 } else { 1.0 })
        .collect();
    let src = Tensor::from_slice(&ctx, &x, &[2, 32])?;
    let q = src.quantize(DType::Mxfp4, None, Role::Weight)?;
    assert_eq!(q.shape(), [2, 32]);
    assert_eq!(
        q.quant_info()?,
        QuantInfo {
            tile: 0,
            codes_bytes: 32,
            scales_bytes: 2,
            tensor_scale: 1.0
        }
    );
    assert_eq!(q.nbytes(), 34);
    assert_eq!(q.dequantize(DType::F32)?.to_vec::<f32>()?, x);
    let e = src.quant_error(&q)?;
    assert_eq!(
        (e.rel_mse, e.underflow_frac, e.saturated_frac, e.nan_block_frac),
        (0.0, 0.0, 0.0, 0.0)
    );
    // BF16 out: exact for MXFP4
    let bf = q.dequantize(DType::Bf16)?.to_vec::<u16>()?;
    let back: Vec<f32> = bf.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect();
    assert_eq!(back, x);
    // every format quantizes and reports its error
    let r: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
    let rs = Tensor::from_slice(&ctx, &r, &[4, 64])?;
    for fmt in [DType::Mxfp4, DType::Nvfp4, DType::Hif4, DType::Mxfp8E4m3] {
        let q = rs.quantize(fmt, None, Role::Activation)?;
        let e = rs.quant_error(&q)?;
        assert!(e.rel_mse > 0.0 && e.rel_mse < 0.05, "{fmt:?}: rel_mse {}", e.rel_mse);
        let info = q.quant_info()?;
        assert_eq!(info.codes_bytes + info.scales_bytes, q.nbytes());
        if fmt == DType::Nvfp4 {
            assert!(info.tensor_scale > 0.0 && info.tensor_scale != 1.0);
        } else {
            assert_eq!(info.tensor_scale, 1.0);
        }
    }
    // a clipped HiF4 unit (spec vector B) and a NaN block
    let big = Tensor::from_slice(&ctx, &[1000.0f32; 64], &[64])?;
    let qb = big.quantize(DType::Hif4, None, Role::Weight)?;
    assert_eq!(big.quant_error(&qb)?.saturated_frac, 1.0);
    assert!(qb.dequantize(DType::F32)?.to_vec::<f32>()?.iter().all(|&v| v == 896.0));
    let mut n = vec![1.0f32; 64];
    n[40] = f32::NAN;
    let ns = Tensor::from_slice(&ctx, &n, &[64])?;
    let nq = ns.quantize(DType::Mxfp4, None, Role::Weight)?;
    assert_eq!(ns.quant_error(&nq)?.nan_block_frac, 0.5);
    // the error of a quantized tensor against a source of another shape
    assert_err(src.quant_error(&nq), Status::Shape, &["fp4rl_quant_error"]);
    Ok(())
}

#[test]
fn stochastic_rounding_uses_and_advances_the_context_rng() -> Result<()> {
    let ctx = Context::cpu()?;
    ctx.set_seed(11)?;
    let mut p = QuantPolicy::new()?;
    p.set_rounding(Role::Gradient, Rounding::Stochastic)?;
    let x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.377).sin()).collect();
    let src = Tensor::from_slice(&ctx, &x, &[2, 64])?;
    let a = src.quantize(DType::Mxfp4, Some(&p), Role::Gradient)?;
    assert_eq!(ctx.rng()?.offset, 1);
    let b = src.quantize(DType::Mxfp4, Some(&p), Role::Gradient)?;
    assert_eq!(ctx.rng()?.offset, 2);
    assert_ne!(a.codes()?, b.codes()?, "another offset, other random numbers");
    ctx.set_rng_offset(0)?;
    let c = src.quantize(DType::Mxfp4, Some(&p), Role::Gradient)?;
    assert_eq!(a.codes()?, c.codes()?, "replayable from (seed, offset)");
    // nearest rounding does not touch the random state
    src.quantize(DType::Mxfp4, Some(&p), Role::Weight)?;
    assert_eq!(ctx.rng()?.offset, 1);
    Ok(())
}

#[test]
fn codes_and_scales_export_and_import() -> Result<()> {
    let ctx = Context::cpu()?;
    let x: Vec<f32> = (0..3 * 40).map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.3).collect();
    let src = Tensor::from_slice(&ctx, &x, &[3, 40])?;
    for fmt in [DType::Mxfp4, DType::Nvfp4, DType::Hif4, DType::Mxfp8E4m3] {
        let q = src.quantize(fmt, None, Role::Weight)?;
        let info = q.quant_info()?;
        let (codes, scales) = (q.codes()?, q.scales()?);
        assert_eq!((codes.len(), scales.len()), (info.codes_bytes, info.scales_bytes));
        let r = Tensor::import_quantized(&ctx, fmt, &[3, 40], info.tile, &codes, &scales, info.tensor_scale)?;
        assert_eq!(r.dtype(), fmt);
        assert_eq!((r.codes()?, r.scales()?), (codes.clone(), scales.clone()));
        assert_eq!(
            r.dequantize(DType::F32)?.to_vec::<f32>()?,
            q.dequantize(DType::F32)?.to_vec::<f32>()?
        );
        // wrong sizes: the library compares them with the layout
        assert_err(
            Tensor::import_quantized(&ctx, fmt, &[3, 40], info.tile, &codes[1..], &scales, info.tensor_scale),
            Status::Shape,
            &["fp4rl_tensor_import_quantized"],
        );
    }
    let q = src.quantize(DType::Mxfp4, None, Role::Weight)?;
    let (mut codes, scales) = (q.codes()?, q.scales()?);
    // 40 columns = 20 bytes per row, no padding nibble; 39 would have one
    let q39 = Tensor::from_slice(&ctx, &x[..39], &[39])?.quantize(DType::Mxfp4, None, Role::Weight)?;
    let mut c39 = q39.codes()?;
    c39[19] |= 0xF0; // the padding nibble of the odd row
    assert_err(
        Tensor::import_quantized(&ctx, DType::Mxfp4, &[39], 0, &c39, &q39.scales()?, 1.0),
        Status::Corrupt,
        &["padding"],
    );
    assert_err(
        Tensor::import_quantized(&ctx, DType::Mxfp4, &[3, 40], 0, &codes, &scales, 2.0),
        Status::Corrupt,
        &["tensor_scale"],
    );
    assert_err(
        Tensor::import_quantized(&ctx, DType::F32, &[3, 40], 0, &codes, &scales, 1.0),
        Status::Dtype,
        &["not a quantized dtype"],
    );
    assert_err(
        Tensor::import_quantized(&ctx, DType::Mxfp4, &[3, 40], 7, &codes, &scales, 1.0),
        Status::InvalidArgument,
        &["tile 7"],
    );
    codes.clear();
    assert_err(
        Tensor::import_quantized(&ctx, DType::Mxfp4, &[3, 40], 0, &codes, &scales, 1.0),
        Status::Shape,
        &["bytes of codes"],
    );
    Ok(())
}

#[test]
fn transpose_dense_and_2d_tiled() -> Result<()> {
    let ctx = Context::cpu()?;
    let t = Tensor::from_slice(&ctx, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    let tt = t.transpose()?;
    assert_eq!(tt.shape(), [3, 2]);
    assert_eq!(tt.to_vec::<f32>()?, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    // 2D tiles: the transpose of Q(W) is Q(W^T), bit for bit, with nearest rounding
    let (r, c) = (64usize, 96usize);
    let w: Vec<f32> = (0..r * c).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 123.0).collect();
    let wt: Vec<f32> = (0..c * r).map(|k| w[(k % r) * c + k / r]).collect();
    let mut p = QuantPolicy::new()?;
    p.set_tile(Role::Weight, 32)?;
    let qw = Tensor::from_slice(&ctx, &w, &[r as i64, c as i64])?.quantize(DType::Mxfp4, Some(&p), Role::Weight)?;
    let qwt = Tensor::from_slice(&ctx, &wt, &[c as i64, r as i64])?.quantize(DType::Mxfp4, Some(&p), Role::Weight)?;
    let t_of_q = qw.transpose()?;
    assert_eq!(t_of_q.quant_info()?.tile, 32);
    assert_eq!((t_of_q.codes()?, t_of_q.scales()?), (qwt.codes()?, qwt.scales()?));
    // 1D blocks run along rows: no transpose without the source
    let q1 = Tensor::from_slice(&ctx, &w, &[r as i64, c as i64])?.quantize(DType::Mxfp4, None, Role::Weight)?;
    assert_err(q1.transpose(), Status::Unsupported, &["fp4rl_tensor_transpose"]);
    let v = Tensor::from_slice(&ctx, &[1.0f32; 4], &[4])?;
    assert_err(v.transpose(), Status::Shape, &["fp4rl_tensor_transpose"]);
    Ok(())
}

#[test]
fn matmul_dense_quantized_and_errors() -> Result<()> {
    let ctx = Context::cpu()?;
    // C[M,N] = A[M,K] B[N,K]^T
    let a = Tensor::from_slice(&ctx, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    let b = Tensor::from_slice(
        &ctx,
        &[1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0],
        &[4, 3],
    )?;
    let c = a.matmul_nt(&b)?;
    assert_eq!(c.shape(), [2, 4]);
    assert_eq!(c.to_vec::<f32>()?, [1.0, 2.0, 3.0, 6.0, 4.0, 5.0, 6.0, 15.0]);
    // into a caller-made BF16 output
    let mut cb = Tensor::zeros(&ctx, DType::Bf16, &[2, 4])?;
    cb.matmul(&a, &b)?;
    let got: Vec<f32> = cb
        .to_vec::<u16>()?
        .iter()
        .map(|&h| f32::from_bits((h as u32) << 16))
        .collect();
    assert_eq!(got, [1.0, 2.0, 3.0, 6.0, 4.0, 5.0, 6.0, 15.0]);
    // quantized operands are dequantized exactly: the same as the product of the dequantized
    let (m, n, k) = (3usize, 5usize, 64usize);
    let xa: Vec<f32> = (0..m * k).map(|i| ((i * 31 % 17) as f32 - 8.0) / 3.0).collect();
    let xb: Vec<f32> = (0..n * k).map(|i| ((i * 19 % 23) as f32 - 11.0) / 5.0).collect();
    let qa = Tensor::from_slice(&ctx, &xa, &[m as i64, k as i64])?.quantize(DType::Nvfp4, None, Role::Activation)?;
    let qb = Tensor::from_slice(&ctx, &xb, &[n as i64, k as i64])?.quantize(DType::Hif4, None, Role::Weight)?;
    let fused = qa.matmul_nt(&qb)?.to_vec::<f32>()?;
    let da = qa.dequantize(DType::F32)?.to_vec::<f32>()?;
    let db = qb.dequantize(DType::F32)?.to_vec::<f32>()?;
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k).map(|t| da[i * k + t] as f64 * db[j * k + t] as f64).sum();
            assert!(
                (fused[i * n + j] as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                "({i},{j}) {} vs {want}",
                fused[i * n + j]
            );
        }
    }
    // errors: the library's
    let mut wrong = Tensor::zeros(&ctx, DType::F32, &[3, 3])?;
    assert_err(wrong.matmul(&a, &b), Status::Shape, &["fp4rl_matmul"]);
    let bad_k = Tensor::from_slice(&ctx, &[1.0f32; 8], &[4, 2])?;
    assert_err(a.matmul_nt(&bad_k), Status::Shape, &["fp4rl_matmul"]);
    let mut ci = Tensor::zeros(&ctx, DType::I32, &[2, 4])?;
    assert_err(ci.matmul(&a, &b), Status::Dtype, &["fp4rl_matmul"]);
    // tensors of two contexts do not mix
    let other = Context::cpu()?;
    let b2 = Tensor::from_slice(&other, &[1.0f32; 12], &[4, 3])?;
    assert_err(a.matmul_nt(&b2), Status::InvalidArgument, &["another context"]);
    Ok(())
}
