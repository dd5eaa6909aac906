//! The CUDA driver and NCCL as the backend meets them outside its calls:
//! their messages for an error code, and the calling thread's current
//! context, put back when the backend is done with the thread.
//!
//! Owns nothing; used by every file of the NCCL backend and by
//! `nccl_slices.rs`.

// `unsafe`: NCCL's static error strings, and setting a context current
// again; each block says why it is sound.
#![allow(unsafe_code)]

use cudarc::driver::{DriverError, result, sys};
use cudarc::nccl::sys as nccl_sys;

/// NCCL's message for `r`.
pub(in crate::parallel) fn nccl_message(r: nccl_sys::ncclResult_t) -> String {
    // SAFETY: `library` found the symbol; NCCL returns a static string.
    let s = unsafe { nccl_sys::ncclGetErrorString(r) };
    if s.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: a non-null answer is a NUL-terminated static string.
    let s = unsafe { std::ffi::CStr::from_ptr(s) };
    format!("{r:?}: {}", s.to_string_lossy())
}

pub(in crate::parallel) fn driver_message(e: DriverError) -> String {
    match e.error_string() {
        Ok(s) => format!("{:?}: {}", e.0, s.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    }
}

/// Puts back, when dropped, the context that was current on the calling
/// thread: the backend binds its devices' contexts on whatever thread runs
/// it (a pool worker, the user's thread), whose own code may rely on the one
/// it had bound (to drop a `CudaSlice`, say).
pub(in crate::parallel) struct KeepContext(Option<sys::CUcontext>);

impl KeepContext {
    pub(in crate::parallel) fn new() -> Self {
        Self(
            result::ctx::get_current()
                .ok()
                .map(|c| c.unwrap_or(std::ptr::null_mut())),
        )
    }
}

impl Drop for KeepContext {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            // SAFETY: `c` was current on this thread (or null: none was),
            // and stays retained by whoever made it current.
            let _ = unsafe { result::ctx::set_current(c) };
        }
    }
}
