//! `fp4rl::Error`: a failed call's status and the library's message for it.

use std::ffi::{c_int, CStr};
use std::fmt;

use fp4rl_sys as sys;

/// The status of a failed call: the `FP4RL_ERR_*` codes of the C API (`FP4RL_OK` is `Ok(_)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// a NULL pointer, an out-of-range value
    InvalidArgument,
    /// dims that do not fit together, or whose size overflows
    Shape,
    /// a dtype this function does not take
    Dtype,
    /// valid, but not implemented for this case (the message says why)
    Unsupported,
    /// an allocation failed; nothing leaked, outputs untouched
    OutOfMemory,
    /// no such device, or a device error (the context is then unusable)
    Device,
    /// a file could not be read or written
    Io,
    /// a file or buffer is malformed
    Corrupt,
    /// a user callback failed (for a reward closure, the message says how)
    Callback,
    /// a bug in fp4rl: please report it with the message
    Internal,
    /// a status this binding does not know (a newer library); the raw value
    Unknown(i32),
}

impl Status {
    /// The status of a raw `fp4rl_status`; `None` for `FP4RL_OK`.
    pub fn from_raw(raw: c_int) -> Option<Status> {
        Some(match raw {
            sys::FP4RL_OK => return None,
            sys::FP4RL_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::FP4RL_ERR_SHAPE => Status::Shape,
            sys::FP4RL_ERR_DTYPE => Status::Dtype,
            sys::FP4RL_ERR_UNSUPPORTED => Status::Unsupported,
            sys::FP4RL_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::FP4RL_ERR_DEVICE => Status::Device,
            sys::FP4RL_ERR_IO => Status::Io,
            sys::FP4RL_ERR_CORRUPT => Status::Corrupt,
            sys::FP4RL_ERR_CALLBACK => Status::Callback,
            sys::FP4RL_ERR_INTERNAL => Status::Internal,
            other => Status::Unknown(other),
        })
    }

    /// The raw `fp4rl_status` value.
    pub fn as_raw(self) -> c_int {
        match self {
            Status::InvalidArgument => sys::FP4RL_ERR_INVALID_ARGUMENT,
            Status::Shape => sys::FP4RL_ERR_SHAPE,
            Status::Dtype => sys::FP4RL_ERR_DTYPE,
            Status::Unsupported => sys::FP4RL_ERR_UNSUPPORTED,
            Status::OutOfMemory => sys::FP4RL_ERR_OUT_OF_MEMORY,
            Status::Device => sys::FP4RL_ERR_DEVICE,
            Status::Io => sys::FP4RL_ERR_IO,
            Status::Corrupt => sys::FP4RL_ERR_CORRUPT,
            Status::Callback => sys::FP4RL_ERR_CALLBACK,
            Status::Internal => sys::FP4RL_ERR_INTERNAL,
            Status::Unknown(raw) => raw,
        }
    }

    /// The library's name of the status: "FP4RL_ERR_SHAPE", ... ("FP4RL_STATUS_UNKNOWN").
    pub fn name(self) -> &'static str {
        // SAFETY: fp4rl_status_name returns a static NUL-terminated string for any value.
        unsafe { static_str(sys::fp4rl_status_name(self.as_raw())) }.unwrap_or("FP4RL_STATUS_UNKNOWN")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed fp4rl call: its [`Status`] and a message that says what was wrong.
///
/// For failures inside the C library the message is exactly `fp4rl_last_error()`'s. A few
/// failures are detected by this binding before it calls into C, where the C API cannot see
/// the problem (a slice shorter than the shape it is said to have, a path with a NUL byte);
/// their messages name the Rust function. A reward closure's failure keeps the library's
/// message and appends what the closure did (its error, or its panic message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

/// `Result<T, fp4rl::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with this status and message.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    /// The status of the failed call.
    pub fn status(&self) -> Status {
        self.status
    }

    /// What was wrong, in the library's words.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error of a failed call on this thread: `raw`'s status with `fp4rl_last_error()`.
    /// Must be called right after the failing call, before any other call into fp4rl on this
    /// thread (the message is per thread and valid until the next failing call).
    pub(crate) fn last(raw: c_int) -> Error {
        // SAFETY: fp4rl_last_error returns a valid NUL-terminated string ("" if none).
        let message = unsafe { owned_str(sys::fp4rl_last_error()) };
        Error {
            status: Status::from_raw(raw).unwrap_or(Status::Internal),
            message,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

/// `Ok(())` for FP4RL_OK, else the status with the thread's last error message.
pub(crate) fn check(raw: c_int) -> Result<()> {
    if raw == sys::FP4RL_OK {
        Ok(())
    } else {
        Err(Error::last(raw))
    }
}

/// A copy of a C string ("" for NULL); invalid UTF-8 is replaced rather than failing.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub(crate) unsafe fn owned_str(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// A string the library keeps for its lifetime (names of statuses, dtypes, parameters).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string with static storage in the library, which
/// is never unloaded while this crate is linked to it.
pub(crate) unsafe fn static_str(p: *const std::ffi::c_char) -> Option<&'static str> {
    if p.is_null() {
        None
    } else {
        CStr::from_ptr(p).to_str().ok()
    }
}
