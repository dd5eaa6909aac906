//! What [`Backend::Nccl`](crate::parallel::Backend::Nccl) checks before
//! it calls NCCL: that the library loads and has the symbols the backend
//! calls (cudarc's own loader panics on a missing library or symbol), and
//! that the group's devices are CUDA devices, one per GPU.
//!
//! Owns nothing; pushes one empty op per device to learn its kind.

// `unsafe`: the NCCL library is opened and its symbols looked up (never
// called from here); each block says why it is sound.
#![allow(unsafe_code)]

use cudarc::nccl::sys as nccl_sys;

use crate::dep::Device;
use crate::engine::Engine;
use crate::error::Error;

/// The NCCL symbols the backend calls (probed before the first call;
/// `ncclCommFinalize` is NCCL 2.14's).
pub(super) const SYMBOLS: [&str; 9] = [
    "ncclCommInitAll",
    "ncclCommDestroy",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclAllReduce",
    "ncclCommGetAsyncError",
    "ncclGetErrorString",
    "ncclCommAbort",
    "ncclCommFinalize",
];

/// Whether the NCCL library loads and has what the backend calls; why not
/// otherwise. cudarc's own loading panics on a missing library or symbol:
/// nothing of NCCL is called before this said yes.
pub(in crate::parallel) fn library() -> Result<(), String> {
    // SAFETY: only tries to open the library (its initialisers run, as for
    // any library loaded).
    if !unsafe { nccl_sys::is_culib_present() } {
        return Err(format!(
            "the NCCL library could not be loaded (tried {}; set LD_LIBRARY_PATH to where \
             libnccl.so.2 is)",
            cudarc::get_lib_name_candidates("nccl").join(", ")
        ));
    }
    // SAFETY: the library is present (just checked), so `culib` finds it and
    // does not panic.
    let lib = unsafe { nccl_sys::culib() };
    for name in SYMBOLS {
        // SAFETY: the symbol is only looked up, never called through this
        // (mistyped) pointer.
        if let Err(e) = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) } {
            return Err(format!("the NCCL library has no {name}: {e}"));
        }
    }
    Ok(())
}

/// What kind of device a device of the engine is.
enum Kind {
    Host,
    Simulated,
    Cuda(usize),
}

/// Device `device`'s CUDA ordinal, from the stream an (empty) op on it
/// gets; or why it has none.
fn ordinal(engine: &Engine, device: Device, i: usize) -> Result<usize, Error> {
    let probe = engine.new_var(); // an op declares a variable at least
    let kind = engine
        .op()
        .name("parallel probe")
        .on(device)
        .mutates(&[&probe])
        .run(|ctx| {
            Ok(match ctx.stream() {
                Err(_) => Kind::Host,
                Ok(s) => s
                    .cuda()
                    .map_or(Kind::Simulated, |c| Kind::Cuda(c.context().ordinal())),
            })
        })?
        .wait()?;
    let name = engine.device_name(device).unwrap_or("?");
    match kind {
        Kind::Cuda(ordinal) => Ok(ordinal),
        Kind::Host => Err(Error::Parallel(format!(
            "Backend::Nccl needs CUDA devices: device {i} (`{name}`) runs on the host (use \
             Backend::Ring)"
        ))),
        Kind::Simulated => Err(Error::Parallel(format!(
            "Backend::Nccl needs CUDA devices: device {i} (`{name}`) is a simulated GPU (use \
             Backend::Ring)"
        ))),
    }
}

/// The CUDA ordinals of `devices`, checked for NCCL: CUDA devices, one per
/// GPU, and the library loadable.
pub(in crate::parallel) fn ordinals(
    engine: &Engine,
    devices: &[Device],
) -> Result<Vec<usize>, Error> {
    let mut ordinals = Vec::with_capacity(devices.len());
    for (i, &d) in devices.iter().enumerate() {
        let o = ordinal(engine, d, i)?;
        if let Some(j) = ordinals.iter().position(|&p| p == o) {
            return Err(Error::Parallel(format!(
                "Backend::Nccl wants one device per GPU: devices {j} and {i} are both CUDA \
                 device {o}"
            )));
        }
        ordinals.push(o);
    }
    library().map_err(|m| Error::Parallel(format!("Backend::Nccl: {m}")))?;
    Ok(ordinals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_probe_answers_without_panicking() {
        // SAFETY: only tries to open the library.
        let present = unsafe { nccl_sys::is_culib_present() };
        match library() {
            Ok(()) => assert!(present, "no library, yet the probe found one"),
            Err(m) if present => assert!(m.contains("has no nccl"), "{m}"),
            // Here (no NCCL): a message naming what was tried, not cudarc's
            // panic.
            Err(m) => assert!(
                m.contains("could not be loaded") && m.contains("libnccl"),
                "{m}"
            ),
        }
    }
}
