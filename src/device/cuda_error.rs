//! CUDA driver errors in words, from their raw numbers.
//!
//! cudarc's `CUresult` is CUDA 12.6's enum; a newer driver returns codes it
//! lacks (13.0: `CUDA_ERROR_CONTAINED` 226, and 36, 721, 916, ...), and
//! such a value formatted with `{:?}` (or held in the enum at all) is
//! undefined behaviour. So errors are told by their number: the driver's
//! own `cuGetErrorName` and `cuGetErrorString`, looked up in the driver
//! library by name and called with the number as a plain integer, never
//! through the enum.

// `unsafe`: the driver library's lookup and calls; each block says why.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char};
use std::sync::OnceLock;

use cudarc::driver::{DriverError, sys};

/// `cuGetErrorName` and `cuGetErrorString` alike: `CUresult (CUresult,
/// const char**)`, the enum an `unsigned int` in C.
type Lookup = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;

/// The driver's two lookups, if it has a library (loaded once).
fn lookups() -> Option<(Lookup, Lookup)> {
    static LOOKUPS: OnceLock<Option<(Lookup, Lookup)>> = OnceLock::new();
    *LOOKUPS.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries to open the library; with it
        // present, `culib` opens it (else it would panic).
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        // SAFETY: as above: the library is present.
        let lib = unsafe { sys::culib() };
        // SAFETY: both symbols have the C signature `Lookup` spells (the
        // driver API's `cuGetErrorName`, `cuGetErrorString`); the pointers
        // stay valid as long as the library, which cudarc never unloads.
        let find = |name: &[u8]| unsafe { lib.get::<Lookup>(name) }.ok().map(|f| *f);
        Some((find(b"cuGetErrorName\0")?, find(b"cuGetErrorString\0")?))
    })
}

/// Calls `lookup` for `raw`: the driver's static text, if it knows the code.
fn ask(lookup: Lookup, raw: u32) -> Option<String> {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: the driver writes a pointer to a static string (or nothing)
    // into `text`, for any value of `raw`; an unknown code is answered with
    // an error, not undefined behaviour.
    let ok = unsafe { lookup(raw, &mut text) } == 0;
    if !ok || text.is_null() {
        return None;
    }
    // SAFETY: on success the driver pointed `text` at a NUL-terminated
    // static string.
    let text = unsafe { CStr::from_ptr(text) };
    Some(text.to_string_lossy().into_owned())
}

/// A driver error in words from its raw number: `"NAME (raw): text"` as the
/// driver says it, or `"CUDA error raw"` for a code it does not know (or
/// without a driver library): e.g. `CUDA_ERROR_OUT_OF_MEMORY (2): out of
/// memory`.
pub(crate) fn describe(raw: u32) -> String {
    let Some((name, string)) = lookups() else {
        return format!("CUDA error {raw}");
    };
    match (ask(name, raw), ask(string, raw)) {
        (Some(name), Some(text)) => format!("{name} ({raw}): {text}"),
        (Some(name), None) => format!("{name} ({raw})"),
        (None, _) => format!("CUDA error {raw}"),
    }
}

/// [`describe`] for an error cudarc returned: its number, read as one.
pub(crate) fn describe_driver(e: &DriverError) -> String {
    describe(e.0 as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A code CUDA 12.6's enum lacks is told by its number, with no driver
    /// (this machine's CI) or with one (whose words come first then).
    #[test]
    fn a_code_the_enum_lacks_is_told_by_its_number() {
        let contained = describe(226);
        assert!(contained.contains("226"), "{contained}");
        let unknown = describe(999_999);
        assert_eq!(unknown, "CUDA error 999999");
        if lookups().is_some() {
            assert!(contained.starts_with("CUDA_ERROR_"), "{contained}");
        }
    }
}
