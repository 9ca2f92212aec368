//! `Context`: a device, its memory and its random-number state.

use std::fmt;
use std::ptr::{self, NonNull};

use fp4rl_sys as sys;

use crate::enums::Device;
use crate::error::{check, Result};

/// A device, its memory and its random-number state. Everything else (tensors, models,
/// sessions) lives in a context and borrows it, so the context outlives them all.
///
/// The C library lets one thread at a time use a context. `Context` is therefore `Send` (it can
/// move to another thread with nothing borrowing it) but not `Sync`, and the objects borrowing
/// it are neither: a context and its objects are used by one thread.
///
/// ```compile_fail,E0277
/// fn on_another_thread<T: Send>(_: T) {}
/// let ctx = fp4rl::Context::cpu().unwrap();
/// let t = fp4rl::Tensor::from_slice(&ctx, &[1.0f32], &[1]).unwrap();
/// on_another_thread(t); // error: a tensor borrows a context, which is not Sync
/// ```
///
/// Methods that change the context's state take `&self`: the random state is shared by every
/// tensor and model of the context (each stochastic quantization advances it), like a `Cell`.
pub struct Context {
    raw: NonNull<sys::fp4rl_context>,
}

// SAFETY: the library allows a context to be used from any one thread at a time; nothing in it
// is tied to the creating thread. `Sync` is not implemented (NonNull is !Sync), so shared
// references, and with them every object borrowing the context, stay on one thread.
unsafe impl Send for Context {}

/// A context's random state: its seed and the offset the next stochastic quantization uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RngState {
    pub seed: u64,
    pub offset: u64,
}

/// Bytes of a context's device memory held by fp4rl (see `Context::memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// In use now.
    pub in_use: usize,
    /// The high-water mark of `in_use` since creation or the last `reset_peak_memory`.
    pub peak: usize,
    /// Held from the device, the caching allocator's free blocks included (`in_use` on the CPU).
    pub reserved: usize,
}

impl Context {
    /// A context on `device`; `ordinal` picks the GPU (0 for the CPU). A CUDA context on a
    /// machine without a usable GPU is [`Status::Device`](crate::Status::Device); in a library
    /// built without CUDA, [`Status::Unsupported`](crate::Status::Unsupported).
    pub fn new(device: Device, ordinal: i32) -> Result<Context> {
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; on success the library hands us a new handle.
        check(unsafe { sys::fp4rl_context_create(&mut raw, device.as_raw(), ordinal) })?;
        Ok(Context {
            raw: NonNull::new(raw).expect("fp4rl_context_create returned OK and NULL"),
        })
    }

    /// A CPU context.
    pub fn cpu() -> Result<Context> {
        Context::new(Device::Cpu, 0)
    }

    /// A context on GPU `ordinal`.
    pub fn cuda(ordinal: i32) -> Result<Context> {
        Context::new(Device::Cuda, ordinal)
    }

    /// A CUDA context on GPU `ordinal` that joins the NCCL communicator of `world_size` ranks
    /// named by `nccl_id` (rank 0's [`nccl_unique_id`], carried to every rank by the job's own
    /// means) as `rank`. Blocks until every rank has joined. Its RL sessions train
    /// data-parallel: every rank passes the same global prompts to the session's step.
    /// [`Status::Unsupported`](crate::Status::Unsupported) without NCCL.
    pub fn distributed(ordinal: i32, rank: i32, world_size: i32, nccl_id: &[u8]) -> Result<Context> {
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer and `nccl_id` a readable slice of its length.
        check(unsafe {
            sys::fp4rl_context_create_distributed(
                &mut raw,
                ordinal,
                rank,
                world_size,
                nccl_id.as_ptr().cast(),
                nccl_id.len(),
            )
        })?;
        Ok(Context {
            raw: NonNull::new(raw).expect("fp4rl_context_create_distributed returned OK and NULL"),
        })
    }

    /// This process's rank and the world size (0 and 1 for a context that is not distributed).
    pub fn rank(&self) -> Result<(i32, i32)> {
        let (mut rank, mut world_size) = (0, 1);
        // SAFETY: a live handle and valid out-pointers.
        check(unsafe { sys::fp4rl_context_get_rank(self.raw.as_ptr(), &mut rank, &mut world_size) })?;
        Ok((rank, world_size))
    }

    /// The context's device.
    pub fn device(&self) -> Device {
        // SAFETY: a live handle.
        let raw = unsafe { sys::fp4rl_context_device(self.raw.as_ptr()) };
        Device::from_raw(raw).expect("fp4rl_context_device returned an unknown device")
    }

    /// Sets the seed of stochastic rounding and resets the random offset to 0.
    pub fn set_seed(&self, seed: u64) -> Result<()> {
        // SAFETY: a live handle; the context is not shared across threads (!Sync).
        check(unsafe { sys::fp4rl_context_set_seed(self.raw.as_ptr(), seed) })
    }

    /// The seed and the offset the next stochastic quantization will use.
    pub fn rng(&self) -> Result<RngState> {
        let (mut seed, mut offset) = (0, 0);
        // SAFETY: a live handle and valid out-pointers.
        check(unsafe { sys::fp4rl_context_get_rng(self.raw.as_ptr(), &mut seed, &mut offset) })?;
        Ok(RngState { seed, offset })
    }

    /// The bytes of device memory fp4rl holds on this context.
    pub fn memory(&self) -> Result<MemoryStats> {
        let (mut in_use, mut peak, mut reserved) = (0, 0, 0);
        // SAFETY: a live handle and valid out-pointers.
        check(unsafe { sys::fp4rl_context_memory(self.raw.as_ptr(), &mut in_use, &mut peak, &mut reserved) })?;
        Ok(MemoryStats { in_use, peak, reserved })
    }

    /// Sets the peak of `memory` to the bytes in use now.
    pub fn reset_peak_memory(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::fp4rl_context_reset_peak_memory(self.raw.as_ptr()) })
    }

    /// Sets the random offset (to replay a run from a (seed, offset) pair).
    pub fn set_rng_offset(&self, offset: u64) -> Result<()> {
        // SAFETY: a live handle.
        check(unsafe { sys::fp4rl_context_set_rng_offset(self.raw.as_ptr(), offset) })
    }

    /// Orders all of the context's later work on `cuda_stream` (a `cudaStream_t`; null = the
    /// context's own stream), after its earlier work (`fp4rl_context_set_stream`). A CPU context
    /// takes null only ([`Status::Unsupported`](crate::Status::Unsupported) otherwise).
    ///
    /// # Safety
    /// A non-null `cuda_stream` must be a valid stream and stay valid while it is set (set null
    /// again, or drop the context, before destroying it).
    pub unsafe fn set_stream(&self, cuda_stream: *mut std::ffi::c_void) -> Result<()> {
        // SAFETY: a live handle; the stream is the caller's promise.
        check(unsafe { sys::fp4rl_context_set_stream(self.raw.as_ptr(), cuda_stream) })
    }

    /// The raw handle, for calls into fp4rl-sys. It stays owned by this `Context`.
    pub fn as_ptr(&self) -> *mut sys::fp4rl_context {
        self.raw.as_ptr()
    }
}

/// A new NCCL unique id (`FP4RL_NCCL_UNIQUE_ID_BYTES` bytes), made on rank 0 of a multi-GPU job
/// for [`Context::distributed`]. [`Status::Unsupported`](crate::Status::Unsupported) without NCCL.
pub fn nccl_unique_id() -> Result<Vec<u8>> {
    let mut id = vec![0u8; sys::FP4RL_NCCL_UNIQUE_ID_BYTES as usize];
    // SAFETY: `id` is a writable buffer of the length passed.
    check(unsafe { sys::fp4rl_nccl_unique_id(id.as_mut_ptr().cast(), id.len()) })?;
    Ok(id)
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: we own the handle; borrows guarantee nothing of the context is still alive.
        unsafe { sys::fp4rl_context_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.device())
            .field("rng", &self.rng().ok())
            .finish()
    }
}
