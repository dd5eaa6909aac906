//! What the MPI backend asks of the MPI library itself, outside its
//! collectives: the message for an error code, and the library's
//! `MPI_IN_PLACE` (a macro of `mpi.h` that rsmpi does not export).
//!
//! Owns nothing; called by `comm.rs` (setting up a communicator), by
//! `order.rs` and `progress.rs` (failing a collective with MPI's message).

// `unsafe`: calls into the MPI library with buffers it writes; each block
// says why it is sound.
#![allow(unsafe_code)]

use std::ffi::c_int;

use mpi::ffi;

/// MPI's message for an error code.
pub(super) fn error_string(rc: c_int) -> String {
    let mut buf = [0 as std::ffi::c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `buf` holds MPI_MAX_ERROR_STRING characters and the nul, as
    // MPI_Error_string requires; callable at any time after init.
    let ok = unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr(), &mut len) };
    if ok != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error {rc}");
    }
    let bytes: Vec<u8> = buf[..len.max(0) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    format!("MPI error {rc}: {}", String::from_utf8_lossy(&bytes))
}

/// `MPI_IN_PLACE` of the MPI library this process runs, from its version
/// string: a macro in `mpi.h`, which rsmpi does not export.
pub(super) fn in_place() -> Result<usize, String> {
    let mut buf = [0 as std::ffi::c_char; 8192];
    let mut len: c_int = 0;
    // SAFETY: `buf` is larger than MPI_MAX_LIBRARY_VERSION_STRING (Open
    // MPI: 256, MPICH: 8192).
    let rc = unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return Err(error_string(rc));
    }
    let bytes: Vec<u8> = buf[..len.max(0) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    let version = String::from_utf8_lossy(&bytes);
    if version.contains("Open MPI") {
        Ok(1) // ((void *) 1)
    } else if version.contains("MPICH") || version.contains("Intel") {
        Ok(usize::MAX) // ((void *) -1)
    } else {
        Err(format!(
            "unknown MPI library ({}): its MPI_IN_PLACE is not known",
            version.lines().next().unwrap_or("")
        ))
    }
}

/// `Err`: MPI's message for `rc`, unless it is `MPI_SUCCESS`.
pub(super) fn check(rc: c_int) -> Result<(), String> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(error_string(rc))
    }
}
