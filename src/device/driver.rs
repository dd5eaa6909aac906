//! The CUDA driver asked at its C interface how many devices it has, and
//! why none where it has none: no driver library, a stub library, a
//! forward-compatibility library the GPU or the kernel module refuses, no
//! device visible (`cuda_devices` in `mod.rs` is the public face).
//!
//! Why not cudarc's own calls: cudarc's `CUresult` is a Rust enum of the
//! codes CUDA 12.6 knows (the API level the crate is built for), and a newer
//! driver returns codes it lacks (CUDA 13.0: 36, 226, 721, 916). A Rust enum
//! holding a value none of its variants has is undefined behaviour from the
//! moment cudarc's typed `cuInit` returns it, not only when it is printed.
//! So this file looks the driver's functions up in the library cudarc
//! opened (`sys::culib()`: the answer is about the library the engine uses)
//! and calls them through its own pointers, declared to return a C `int`
//! (`CUresult` is a C enum: an `int` in the C ABI). A code is only ever an
//! `i32` here, named by the driver's `cuGetErrorName` (which takes it as an
//! `int` too) or, where the driver cannot name it, by `codes`.
//!
//! Owns nothing: each call asks the driver again (`cuInit` is cheap after
//! the first).

// `unsafe`: the driver's C functions, looked up and called; each block says
// why it is sound.
#![allow(unsafe_code)]

mod codes;

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use cudarc::driver::sys;

type Init = unsafe extern "C" fn(c_uint) -> c_int;
type GetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type ErrorText = unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int;

/// How many devices the CUDA driver has (at least 1), or why there is none.
pub(crate) fn devices() -> Result<usize, String> {
    // SAFETY: only tries to open the library (its initialisers run, as for
    // any library loaded).
    if !unsafe { sys::is_culib_present() } {
        return Err(no_driver());
    }
    // SAFETY: the library is present (just checked), so `culib` opens it
    // and does not panic; it stays open for the process (a static).
    let lib = unsafe { sys::culib() };
    let from = loaded("libcuda");
    let symbol = |name: &str| {
        // SAFETY: only looks the address up (the library is never closed);
        // `Driver::of` says what each is.
        unsafe { lib.get::<*mut c_void>(name.as_bytes()) }
            .ok()
            .map(|s| *s)
    };
    let driver = match Driver::of(symbol) {
        Ok(d) => d,
        Err(missing) => return Err(format!("the CUDA driver library{from} has no {missing}")),
    };
    // SAFETY: cuInit's C signature (cuda.h: `CUresult cuInit(unsigned int
    // Flags)`), flags 0 as documented.
    let r = unsafe { (driver.init)(0) };
    if r != 0 {
        return Err(format!(
            "the CUDA driver{from} failed to start (cuInit): {}",
            driver.describe(r)
        ));
    }
    let mut n: c_int = 0;
    // SAFETY: cuDeviceGetCount's C signature; `n` is a valid out pointer.
    let r = unsafe { (driver.count)(&mut n) };
    if r != 0 {
        return Err(format!(
            "the CUDA driver{from} could not count its devices (cuDeviceGetCount): {}",
            driver.describe(r)
        ));
    }
    match usize::try_from(n) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "the CUDA driver{from} reports no device (cuDeviceGetCount: {n}){}",
            visible_devices()
        )),
    }
}

/// The driver functions asked for, from one opened library.
struct Driver {
    init: Init,
    count: GetCount,
    name: Option<ErrorText>,
    text: Option<ErrorText>,
}

impl Driver {
    /// The functions `symbol` finds (an address by name), or the name of
    /// one it lacks.
    fn of(symbol: impl Fn(&str) -> Option<*mut c_void>) -> Result<Self, &'static str> {
        let get = |name: &'static str| symbol(name).filter(|p| !p.is_null()).ok_or(name);
        // SAFETY: (each transmute) the address is the driver's function of
        // that name, whose cuda.h signature the type spells, each `CUresult`
        // an `int`; a function pointer is the size of a data pointer here.
        unsafe {
            Ok(Self {
                init: std::mem::transmute::<*mut c_void, Init>(get("cuInit")?),
                count: std::mem::transmute::<*mut c_void, GetCount>(get("cuDeviceGetCount")?),
                name: get("cuGetErrorName")
                    .ok()
                    .map(|p| std::mem::transmute::<*mut c_void, ErrorText>(p)),
                text: get("cuGetErrorString")
                    .ok()
                    .map(|p| std::mem::transmute::<*mut c_void, ErrorText>(p)),
            })
        }
    }

    /// Result code `code` named, with the driver's words for it and what to
    /// do about it.
    fn describe(&self, code: i32) -> String {
        describe(code, ask(self.name, code), ask(self.text, code))
    }
}

/// The driver's words for `code` from `f` (`cuGetErrorName` or
/// `cuGetErrorString`), if it has them.
fn ask(f: Option<ErrorText>, code: i32) -> Option<String> {
    let f = f?;
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorName/cuGetErrorString's C signature, the code
    // passed as the `int` it is (an unknown one is answered with an error);
    // `s` is a valid out pointer.
    let r = unsafe { f(code, &mut s) };
    // SAFETY: on success the driver points `s` at a static NUL-terminated
    // string.
    (r == 0 && !s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
}

/// A driver error in words from its number, for any code (one newer than
/// the enum cudarc is built with too): [`describe`] with the driver's own
/// name and words where its library is loaded.
pub(crate) fn describe_code(code: i32) -> String {
    static TEXTS: OnceLock<(Option<ErrorText>, Option<ErrorText>)> = OnceLock::new();
    let (name, text) = *TEXTS.get_or_init(|| {
        // SAFETY: only tries to open the library; present, `culib` opens it
        // (else it would panic) and keeps it open for the process.
        if !unsafe { sys::is_culib_present() } {
            return (None, None);
        }
        // SAFETY: the library is present (just checked).
        let lib = unsafe { sys::culib() };
        // SAFETY: both symbols have the C signature `ErrorText` spells
        // (cuda.h's cuGetErrorName, cuGetErrorString, `CUresult` an `int`);
        // the library is never closed.
        let find = |name: &[u8]| unsafe { lib.get::<ErrorText>(name) }.ok().map(|f| *f);
        (find(b"cuGetErrorName\0"), find(b"cuGetErrorString\0"))
    });
    describe(code, ask(name, code), ask(text, code))
}

/// [`describe_code`] for an error cudarc returned, read as its number.
pub(crate) fn describe_driver(e: &cudarc::driver::DriverError) -> String {
    describe_code(e.0 as i32)
}

/// `code` as a message: its name (`driver_name`, the driver's, else this
/// crate's table, else "unknown"), its number, the driver's words for it
/// (`driver_text`), and a hint where the code has a usual cause.
pub(crate) fn describe(
    code: i32,
    driver_name: Option<String>,
    driver_text: Option<String>,
) -> String {
    let name = driver_name
        .or_else(|| codes::name(code).map(str::to_string))
        .unwrap_or_else(|| "an error code unknown to this build (newer than CUDA 13.4?)".into());
    let mut s = format!("{name} ({code})");
    if let Some(text) = driver_text {
        s.push_str(": ");
        s.push_str(&text);
    }
    if let Some(hint) = hint(code) {
        s.push_str("; ");
        s.push_str(hint);
    }
    if code == 100 {
        s.push_str(&visible_devices());
    }
    s
}

/// What usually causes `code` where the driver starts, and the way out.
fn hint(code: i32) -> Option<&'static str> {
    Some(match code {
        34 => {
            "the library opened is a stub (the CUDA toolkit's stubs/libcuda.so, for \
             linking only), not the driver: cudarc opens libcuda.so before libcuda.so.1, \
             so take the stubs directory off LD_LIBRARY_PATH"
        }
        803 => {
            "the libcuda opened does not match the kernel module's driver version: \
             usually a CUDA forward-compatibility library (cuda-compat, a compat/ \
             directory) on LD_LIBRARY_PATH; take it off to use the driver's own"
        }
        804 => {
            "a CUDA forward-compatibility library (cuda-compat) is on LD_LIBRARY_PATH, \
             which this GPU does not support; take it off to use the driver's own"
        }
        100 => {
            "no GPU is visible to this process (on a GPU in MIG mode, only MIG instances \
             are devices: name one in CUDA_VISIBLE_DEVICES as `nvidia-smi -L` lists it)"
        }
        46 => "the GPU is unavailable: in exclusive-process mode and used by another process?",
        _ => return None,
    })
}

/// `CUDA_VISIBLE_DEVICES`, as a note, if it is set.
fn visible_devices() -> String {
    std::env::var("CUDA_VISIBLE_DEVICES")
        .map(|v| format!(" (CUDA_VISIBLE_DEVICES={v:?})"))
        .unwrap_or_default()
}

/// Why no driver library opened: the names cudarc tries, each once (it
/// tries the same forms of `nvcuda`, Windows' name, too).
fn no_driver() -> String {
    let mut tried: Vec<String> = Vec::new();
    for name in cudarc::get_lib_name_candidates("cuda") {
        if !tried.contains(&name) {
            tried.push(name);
        }
    }
    format!(
        "no CUDA driver: none of {} (nor their libnvcuda forms) could be opened (looked for \
         in LD_LIBRARY_PATH, /etc/ld.so.cache and the default library directories)",
        tried.join(", ")
    )
}

/// The files of the libraries named `prefix*` this process has mapped, as
/// a note (` (/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05)`): which
/// file a name such as `libcuda.so` opened (a stub? a compat library?).
/// Empty where it cannot be read (not Linux).
fn loaded(prefix: &str) -> String {
    let files = mapped(prefix);
    if files.is_empty() {
        String::new()
    } else {
        format!(" ({})", files.join(", "))
    }
}

/// The paths of the files named `prefix*` this process has mapped (the
/// libraries it loaded), each once, in the order of their mappings; none
/// where `/proc/self/maps` cannot be read (not Linux).
pub(crate) fn mapped(prefix: &str) -> Vec<String> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let mut files: Vec<String> = Vec::new();
    for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
        let file = path.rsplit('/').next().unwrap_or(path);
        if file.starts_with(prefix) && !files.iter().any(|f| f == path) {
            files.push(path.to_string());
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_is_named_with_its_number() {
        let m = describe(803, None, None);
        assert!(
            m.starts_with("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803); "),
            "{m}"
        );
        assert!(
            m.contains("cuda-compat") && m.contains("LD_LIBRARY_PATH"),
            "{m}"
        );
        // Codes CUDA 12.6's enum lacks (cudarc's `CUresult` cannot hold them).
        assert!(describe(226, None, None).starts_with("CUDA_ERROR_CONTAINED (226)"));
        assert!(describe(916, None, None).starts_with("CUDA_ERROR_KEY_ROTATION (916)"));
        // A code nobody knows yet: its number, never a guess.
        let m = describe(4321, None, None);
        assert_eq!(
            m,
            "an error code unknown to this build (newer than CUDA 13.4?) (4321)"
        );
    }

    #[test]
    fn a_stub_library_is_called_one() {
        // A stub answers cuGetErrorName with 34 too: the table names it.
        let m = describe(34, None, None);
        assert!(m.starts_with("CUDA_ERROR_STUB_LIBRARY (34); "), "{m}");
        assert!(m.contains("stubs directory off LD_LIBRARY_PATH"), "{m}");
    }

    #[test]
    fn the_driver_s_own_words_come_first() {
        let m = describe(
            999,
            Some("CUDA_ERROR_UNKNOWN".into()),
            Some("unknown error".into()),
        );
        assert_eq!(m, "CUDA_ERROR_UNKNOWN (999): unknown error");
        let m = describe(100, Some("CUDA_ERROR_NO_DEVICE".into()), None);
        assert!(
            m.starts_with("CUDA_ERROR_NO_DEVICE (100); no GPU is visible"),
            "{m}"
        );
    }

    #[test]
    fn the_probe_answers_here_without_panicking() {
        // SAFETY: only tries to open the library.
        let present = unsafe { sys::is_culib_present() };
        match devices() {
            Ok(n) => assert!(present && n > 0),
            Err(m) if present => assert!(m.starts_with("the CUDA driver"), "{m}"),
            // Here (no driver): every name tried, the one a driver installs too.
            Err(m) => assert!(
                m.starts_with("no CUDA driver: none of libcuda.so, ")
                    && m.contains(", libcuda.so.1"),
                "{m}"
            ),
        }
    }

    #[test]
    fn the_mapped_library_files_are_found_by_name() {
        // This test binary maps its own file; a libc is mapped on Linux.
        if cfg!(target_os = "linux") {
            assert!(loaded("libc").contains("/libc"), "{}", loaded("libc"));
        }
        assert_eq!(loaded("no-such-library-prefix"), "");
    }
}
