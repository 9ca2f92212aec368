//! `Tensor`: dense and quantized tensors, and the tensor-level API (quantize, dequantize,
//! transpose, matmul, quantization error, codes and scales).

use std::ffi::{c_int, c_void};
use std::fmt;
use std::ptr::{self, NonNull};

use fp4rl_sys as sys;

use crate::context::Context;
use crate::enums::{DType, Role};
use crate::error::{check, Error, Result, Status};
use crate::policy::{policy_ptr, QuantPolicy};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
    impl Sealed for i32 {}
}

/// A host element type of a dense tensor: `f32` (F32), `u16` (BF16 bit patterns), `i32` (I32).
pub trait Element: sealed::Sealed + Copy + Default + 'static {
    /// The dense dtype whose elements this type holds.
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for u16 {
    const DTYPE: DType = DType::Bf16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}

/// The block layout of a quantized tensor (see "Quantized tensors" in fp4rl.h).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantInfo {
    /// 0 = 1D blocks along the last dim; T = 2D T x T tiles
    pub tile: i32,
    /// bytes of the packed codes
    pub codes_bytes: usize,
    /// bytes of the scales (HiF4: little-endian u32 words)
    pub scales_bytes: usize,
    /// NVFP4's per-tensor decode scale; 1.0 for the other formats
    pub tensor_scale: f32,
}

/// How far a quantized tensor is from its dense source (see `fp4rl_quant_error`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantError {
    /// sum (x - x')^2 / sum x^2 over finite blocks (0 when sum x^2 == 0)
    pub rel_mse: f64,
    /// fraction of the non-zero finite inputs that became zero
    pub underflow_frac: f64,
    /// fraction of finite blocks in which some element was clipped
    pub saturated_frac: f64,
    /// fraction of blocks that are NaN because of a non-finite input
    pub nan_block_frac: f64,
}

/// A tensor in a [`Context`]: dense (F32, BF16, I32) or quantized (MXFP4, NVFP4, HiF4,
/// MXFP8 E4M3). It borrows its context, so it cannot outlive it:
///
/// ```compile_fail,E0597
/// use fp4rl::{Context, Tensor};
/// let t;
/// {
///     let ctx = Context::cpu().unwrap();
///     t = Tensor::from_slice(&ctx, &[1.0f32, 2.0], &[2]).unwrap();
/// } // error: `ctx` does not live long enough
/// drop(t);
/// ```
///
/// Data goes in and out as slices and `Vec`s (copied: the tensor may live on a GPU).
pub struct Tensor<'ctx> {
    raw: NonNull<sys::fp4rl_tensor>,
    ctx: &'ctx Context,
}

/// `shape` as the C API takes it: the dims pointer and ndim.
fn shape_args(shape: &[i64], what: &str) -> Result<(c_int, *const i64)> {
    let ndim = c_int::try_from(shape.len())
        .map_err(|_| Error::new(Status::Shape, format!("{what}: {} dims is too many", shape.len())))?;
    Ok((ndim, shape.as_ptr()))
}

/// Elements of a valid shape (1..=MAX_DIMS dims, each >= 1), or None when the library itself
/// will reject the shape (so that its message, not ours, reports it).
fn valid_numel(shape: &[i64]) -> Option<Option<usize>> {
    if shape.is_empty() || shape.len() > sys::FP4RL_MAX_DIMS as usize || shape.iter().any(|&d| d < 1) {
        return None;
    }
    // Some(None): valid dims whose product overflows usize (no slice can be that long).
    Some(
        shape
            .iter()
            .try_fold(1usize, |n, &d| usize::try_from(d).ok().and_then(|d| n.checked_mul(d))),
    )
}

impl<'ctx> Tensor<'ctx> {
    pub(crate) fn wrap(raw: *mut sys::fp4rl_tensor, ctx: &'ctx Context) -> Tensor<'ctx> {
        Tensor {
            raw: NonNull::new(raw).expect("fp4rl returned OK and a NULL tensor"),
            ctx,
        }
    }

    /// A dense tensor of `shape` (row-major) holding a copy of `data`: `f32` data makes an
    /// F32 tensor, `u16` a BF16 one (bit patterns), `i32` an I32 one.
    pub fn from_slice<T: Element>(ctx: &'ctx Context, data: &[T], shape: &[i64]) -> Result<Tensor<'ctx>> {
        // The C function reads prod(shape) elements and cannot know the slice's length: check
        // it here, or it would read past the end. A shape the library rejects anyway goes to it
        // unchecked (it fails before reading data) so that its message reports the problem.
        if let Some(n) = valid_numel(shape) {
            if n != Some(data.len()) {
                return Err(Error::new(
                    Status::Shape,
                    format!(
                        "Tensor::from_slice: {} elements for shape {shape:?}, which holds {}",
                        data.len(),
                        n.map_or("more than usize::MAX".to_string(), |n| n.to_string())
                    ),
                ));
            }
        }
        let (ndim, dims) = shape_args(shape, "Tensor::from_slice")?;
        let mut raw = ptr::null_mut();
        // SAFETY: `dims` has `ndim` entries; `data` holds prod(shape) elements (checked above)
        // or the shape is invalid and the library fails before reading it.
        check(unsafe {
            sys::fp4rl_tensor_from_host(
                &mut raw,
                ctx.as_ptr(),
                T::DTYPE.as_raw(),
                ndim,
                dims,
                data.as_ptr().cast(),
            )
        })?;
        Ok(Tensor::wrap(raw, ctx))
    }

    /// A dense tensor (F32, BF16 or I32) of `shape` with every element zero.
    pub fn zeros(ctx: &'ctx Context, dtype: DType, shape: &[i64]) -> Result<Tensor<'ctx>> {
        let (ndim, dims) = shape_args(shape, "Tensor::zeros")?;
        let mut raw = ptr::null_mut();
        // SAFETY: `dims` has `ndim` entries.
        check(unsafe { sys::fp4rl_tensor_zeros(&mut raw, ctx.as_ptr(), dtype.as_raw(), ndim, dims) })?;
        Ok(Tensor::wrap(raw, ctx))
    }

    /// A quantized tensor from packed codes and scales in the layout of fp4rl.h (copied).
    /// Their lengths must equal the sizes the layout gives; padding nibbles must be 0;
    /// `tensor_scale` is NVFP4's per-tensor scale (finite, > 0), 1.0 for the other formats.
    pub fn import_quantized(
        ctx: &'ctx Context,
        dtype: DType,
        shape: &[i64],
        tile: i32,
        codes: &[u8],
        scales: &[u8],
        tensor_scale: f32,
    ) -> Result<Tensor<'ctx>> {
        let (ndim, dims) = shape_args(shape, "Tensor::import_quantized")?;
        let mut raw = ptr::null_mut();
        // SAFETY: the library checks both byte counts against the layout before reading.
        check(unsafe {
            sys::fp4rl_tensor_import_quantized(
                &mut raw,
                ctx.as_ptr(),
                dtype.as_raw(),
                ndim,
                dims,
                tile,
                codes.as_ptr().cast(),
                codes.len(),
                scales.as_ptr().cast(),
                scales.len(),
                tensor_scale,
            )
        })?;
        Ok(Tensor::wrap(raw, ctx))
    }

    /// A copy of a dense tensor's elements, as `T` (`f32` for F32, `u16` for BF16, `i32` for
    /// I32). A quantized tensor is the library's [`Status::Dtype`]: dequantize it first.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let dtype = self.dtype();
        if dtype != T::DTYPE && matches!(dtype, DType::F32 | DType::Bf16 | DType::I32) {
            // The library copies bytes whatever the element type; the mismatch is ours to catch.
            return Err(Error::new(
                Status::Dtype,
                format!(
                    "Tensor::to_vec: the tensor is {}; read it as {}",
                    dtype.name(),
                    match dtype {
                        DType::F32 => "f32",
                        DType::Bf16 => "u16 (bf16 bit patterns)",
                        _ => "i32",
                    }
                ),
            ));
        }
        let n = if dtype == T::DTYPE { self.numel() } else { 0 };
        let mut out = vec![T::default(); n];
        let bytes = std::mem::size_of_val(out.as_slice());
        // SAFETY: `out` holds `bytes` bytes; the library writes at most that many.
        check(unsafe { sys::fp4rl_tensor_to_host(self.raw.as_ptr(), out.as_mut_ptr().cast::<c_void>(), bytes) })?;
        Ok(out)
    }

    /// The tensor's dtype.
    pub fn dtype(&self) -> DType {
        // SAFETY: a live handle.
        DType::from_raw(unsafe { sys::fp4rl_tensor_dtype(self.raw.as_ptr()) }).expect("fp4rl returned an unknown dtype")
    }

    /// The number of dims.
    pub fn ndim(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { sys::fp4rl_tensor_ndim(self.raw.as_ptr()) as usize }
    }

    /// Dim `i` (0 when `i` is out of range).
    pub fn dim(&self, i: usize) -> i64 {
        let i = c_int::try_from(i).unwrap_or(c_int::MAX);
        // SAFETY: a live handle; the library returns 0 for an out-of-range index.
        unsafe { sys::fp4rl_tensor_dim(self.raw.as_ptr(), i) }
    }

    /// The dims.
    pub fn shape(&self) -> Vec<i64> {
        (0..self.ndim()).map(|i| self.dim(i)).collect()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        // SAFETY: a live handle. A tensor's elements fit in memory, so in usize.
        unsafe { sys::fp4rl_tensor_numel(self.raw.as_ptr()) as usize }
    }

    /// Bytes of a dense tensor's elements; of a quantized tensor's codes plus scales.
    pub fn nbytes(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { sys::fp4rl_tensor_nbytes(self.raw.as_ptr()) }
    }

    /// The context the tensor lives in.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }

    /// The block layout of a quantized tensor ([`Status::Dtype`] for a dense one).
    pub fn quant_info(&self) -> Result<QuantInfo> {
        let mut q = QuantInfo {
            tile: 0,
            codes_bytes: 0,
            scales_bytes: 0,
            tensor_scale: 0.0,
        };
        // SAFETY: a live handle and valid out-pointers.
        check(unsafe {
            sys::fp4rl_tensor_quant_info(
                self.raw.as_ptr(),
                &mut q.tile,
                &mut q.codes_bytes,
                &mut q.scales_bytes,
                &mut q.tensor_scale,
            )
        })?;
        Ok(q)
    }

    /// A copy of a quantized tensor's packed codes.
    pub fn codes(&self) -> Result<Vec<u8>> {
        let n = self.quant_info()?.codes_bytes;
        let mut out = vec![0u8; n];
        // SAFETY: `out` holds `n` bytes.
        check(unsafe { sys::fp4rl_tensor_codes_to_host(self.raw.as_ptr(), out.as_mut_ptr().cast(), n) })?;
        Ok(out)
    }

    /// A copy of a quantized tensor's scales, as bytes (HiF4: little-endian u32 words, see
    /// [`Tensor::hif4_scale_words`]).
    pub fn scales(&self) -> Result<Vec<u8>> {
        let n = self.quant_info()?.scales_bytes;
        let mut out = vec![0u8; n];
        // SAFETY: `out` holds `n` bytes.
        check(unsafe { sys::fp4rl_tensor_scales_to_host(self.raw.as_ptr(), out.as_mut_ptr().cast(), n) })?;
        Ok(out)
    }

    /// A HiF4 tensor's scale words (the scales decoded from little-endian u32).
    pub fn hif4_scale_words(&self) -> Result<Vec<u32>> {
        if self.dtype() != DType::Hif4 {
            return Err(Error::new(
                Status::Dtype,
                format!(
                    "Tensor::hif4_scale_words: the tensor is {}, not hif4",
                    self.dtype().name()
                ),
            ));
        }
        Ok(self
            .scales()?
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect())
    }

    /// Quantizes this dense F32 or BF16 tensor to `format` with the tile and rounding that
    /// `policy` (None = the defaults) gives `role`. A stochastically rounded call advances the
    /// context's random offset by one.
    pub fn quantize(&self, format: DType, policy: Option<&QuantPolicy>, role: Role) -> Result<Tensor<'ctx>> {
        let mut raw = ptr::null_mut();
        // SAFETY: live handles; the output is a new handle we own.
        check(unsafe {
            sys::fp4rl_quantize(
                &mut raw,
                self.ctx.as_ptr(),
                self.raw.as_ptr(),
                format.as_raw(),
                policy_ptr(policy),
                role.as_raw(),
            )
        })?;
        Ok(Tensor::wrap(raw, self.ctx))
    }

    /// Dequantizes this quantized tensor to a dense F32 (exact) or BF16 tensor.
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor<'ctx>> {
        let mut raw = ptr::null_mut();
        // SAFETY: live handles; the output is a new handle we own.
        check(unsafe { sys::fp4rl_dequantize(&mut raw, self.ctx.as_ptr(), self.raw.as_ptr(), dtype.as_raw()) })?;
        Ok(Tensor::wrap(raw, self.ctx))
    }

    /// The transpose of a 2-dim tensor: dense, or quantized in 2D tiles (a reshuffle of codes
    /// and scales). A 1D-quantized tensor is [`Status::Unsupported`].
    pub fn transpose(&self) -> Result<Tensor<'ctx>> {
        let mut raw = ptr::null_mut();
        // SAFETY: live handles; the output is a new handle we own.
        check(unsafe { sys::fp4rl_tensor_transpose(&mut raw, self.ctx.as_ptr(), self.raw.as_ptr()) })?;
        Ok(Tensor::wrap(raw, self.ctx))
    }

    /// `self[M,N] = a[M,K] * b[N,K]^T`: `self` is a dense F32 or BF16 tensor, overwritten; `a`
    /// and `b` are dense or quantized with blocks along K. All three must be in one context.
    pub fn matmul(&mut self, a: &Tensor<'_>, b: &Tensor<'_>) -> Result<()> {
        // SAFETY: live handles; `self` is exclusively borrowed while the library writes it.
        check(unsafe { sys::fp4rl_matmul(self.raw.as_ptr(), self.ctx.as_ptr(), a.raw.as_ptr(), b.raw.as_ptr()) })
    }

    /// `self * b^T` as a new F32 tensor of shape [self.dim(0), b.dim(0)].
    pub fn matmul_nt(&self, b: &Tensor<'_>) -> Result<Tensor<'ctx>> {
        let mut c = Tensor::zeros(self.ctx, DType::F32, &[self.dim(0), b.dim(0)])?;
        c.matmul(self, b)?;
        Ok(c)
    }

    /// The quantization error of `q` against this tensor, its dense source (same shape).
    pub fn quant_error(&self, q: &Tensor<'_>) -> Result<QuantError> {
        let mut e = QuantError {
            rel_mse: 0.0,
            underflow_frac: 0.0,
            saturated_frac: 0.0,
            nan_block_frac: 0.0,
        };
        // SAFETY: live handles and valid out-pointers.
        check(unsafe {
            sys::fp4rl_quant_error(
                self.raw.as_ptr(),
                q.raw.as_ptr(),
                &mut e.rel_mse,
                &mut e.underflow_frac,
                &mut e.saturated_frac,
                &mut e.nan_block_frac,
            )
        })?;
        Ok(e)
    }

    /// The raw handle, for calls into fp4rl-sys. It stays owned by this `Tensor`.
    pub fn as_ptr(&self) -> *mut sys::fp4rl_tensor {
        self.raw.as_ptr()
    }

    /// A dense tensor on the caller's host memory, without a copy (`fp4rl_tensor_wrap`): the
    /// library reads and writes `data` in place. The tensor borrows `data` mutably for its whole
    /// life, so Rust code cannot touch the memory meanwhile. A CPU context only (a CUDA context
    /// refuses host memory); `data.len()` must equal prod(`shape`).
    pub fn wrap_slice<'a, T: Element>(ctx: &'a Context, data: &'a mut [T], shape: &[i64]) -> Result<Tensor<'a>> {
        if let Some(n) = valid_numel(shape) {
            if n != Some(data.len()) {
                return Err(Error::new(
                    Status::Shape,
                    format!("Tensor::wrap_slice: {} elements for shape {shape:?}", data.len()),
                ));
            }
        }
        // SAFETY: `data` holds prod(shape) elements (checked above, or the library rejects the
        // shape first) and stays borrowed, so valid and unaliased, while the tensor lives.
        unsafe { Tensor::wrap_raw(ctx, T::DTYPE, shape, None, data.as_mut_ptr().cast(), None, ptr::null_mut()) }
    }

    /// A dense tensor on memory the caller owns (host memory for a CPU context, device memory of
    /// the context's GPU for a CUDA context), without a copy; `strides` in elements (None =
    /// contiguous; only contiguous layouts are taken). `release(release_ctx)` runs once when the
    /// tensor is dropped, after the context's queued work.
    ///
    /// # Safety
    /// `data` must hold prod(`shape`) elements of `dtype` and stay valid, and used by nothing
    /// else that races with the library, until `release` runs (or the tensor is dropped).
    pub unsafe fn wrap_raw(
        ctx: &'ctx Context,
        dtype: DType,
        shape: &[i64],
        strides: Option<&[i64]>,
        data: *mut c_void,
        release: sys::fp4rl_release_fn,
        release_ctx: *mut c_void,
    ) -> Result<Tensor<'ctx>> {
        let (ndim, dims) = shape_args(shape, "Tensor::wrap_raw")?;
        if let Some(s) = strides {
            if s.len() != shape.len() {
                return Err(Error::new(
                    Status::Shape,
                    format!("Tensor::wrap_raw: {} strides for {} dims", s.len(), shape.len()),
                ));
            }
        }
        let mut raw = ptr::null_mut();
        // SAFETY: `dims` (and `strides`, when given) have `ndim` entries; the rest is the caller's promise.
        check(unsafe {
            sys::fp4rl_tensor_wrap(
                &mut raw,
                ctx.as_ptr(),
                dtype.as_raw(),
                ndim,
                dims,
                strides.map_or(ptr::null(), <[i64]>::as_ptr),
                data,
                release,
                release_ctx,
            )
        })?;
        Ok(Tensor::wrap(raw, ctx))
    }

    /// The address of a dense tensor's elements in its context's device memory (to hand to
    /// another framework); an error for a quantized tensor. Valid while the tensor lives.
    pub fn data_ptr(&self) -> Result<*mut c_void> {
        // SAFETY: a live handle.
        let p = unsafe { sys::fp4rl_tensor_data(self.raw.as_ptr()) };
        if p.is_null() {
            return Err(Error::last(Status::Dtype.as_raw()));
        }
        Ok(p)
    }
}

impl Drop for Tensor<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the handle and free it once.
        unsafe { sys::fp4rl_tensor_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Tensor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .finish()
    }
}
