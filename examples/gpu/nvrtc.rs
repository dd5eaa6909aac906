//! Kernels compiled at run time with NVRTC, shared by `tests/cuda.rs`, the
//! `gpu_pipeline` example and `benches/gpu.rs` (each includes this file with
//! `#[path = ...] mod nvrtc;`).
//!
//! [`compile`] compiles for the device's own architecture
//! (`--gpu-architecture=sm_XY` from its compute capability X.Y) and hands
//! back CUBIN, machine code the driver loads as it is. Not PTX: an NVRTC
//! newer than the driver (a CUDA 13.1 wheel on a CUDA 13.0 driver, say)
//! writes PTX of a version the driver cannot JIT, so every kernel load would
//! fail; its CUBIN runs (CUDA's minor-version compatibility).
//!
//! The library: cudarc (built for CUDA 12) looks for `libnvrtc.so`,
//! `libnvrtc.so.12` and older names, not for the `libnvrtc.so.13` a CUDA 13
//! machine (or the `nvidia-cuda-nvrtc` wheel) may ship alone. This file
//! opens cudarc's names, in cudarc's order, then the newer ones itself
//! (`dlopen`), and calls the NVRTC functions it needs through its own
//! pointers, each result an `int` (their signatures have not changed since
//! CUDA 11.1, which added `nvrtcGetCUBIN`); where none opens, the error says
//! exactly which names were tried and where they were looked for.

// `unsafe`: dlopen/dlsym and NVRTC's C functions, each block says why it is sound.
#![allow(unsafe_code)]
// Not every includer calls every function.
#![allow(dead_code)]

use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::nvrtc::Ptx;

/// Names of the NVRTC library that cudarc does not try.
const NEWER: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.14"];

/// `src` compiled for the GPU of `ctx` (CUBIN for its architecture: see the
/// module docs), to load with `ctx.load_module`; an error says what is
/// missing, or NVRTC's log and the architecture it compiled for.
pub fn compile(src: &str, ctx: &Arc<CudaContext>) -> Result<Ptx, String> {
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| format!("the device's compute capability: {e}"))?;
    compile_for(src, major, minor)
}

/// `src` compiled to CUBIN for compute capability `major.minor`.
pub fn compile_for(src: &str, major: i32, minor: i32) -> Result<Ptx, String> {
    let arch = arch_option(major, minor);
    #[cfg(target_os = "linux")]
    if let Some(lib) = names().iter().find_map(|name| dl::Nvrtc::open(name)) {
        return lib
            .compile(src, &arch)
            .map(Ptx::from_binary)
            .map_err(|e| format!("{e} (compiling with {arch})"));
    }
    Err(missing())
}

/// NVRTC's option naming the architecture of compute capability
/// `major.minor` (9.0: `--gpu-architecture=sm_90`): a real architecture,
/// so NVRTC writes CUBIN.
pub fn arch_option(major: i32, minor: i32) -> String {
    format!("--gpu-architecture=sm_{major}{minor}")
}

/// Whether an NVRTC library opens (cudarc's names or the newer ones); the
/// error says what is missing.
pub fn available() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    if names().iter().any(|name| dl::Nvrtc::open(name).is_some()) {
        return Ok(());
    }
    Err(missing())
}

/// The names cudarc tries for `lib` (`"cuda"`, `"nvrtc"`), each once.
pub fn candidates(lib: &str) -> Vec<String> {
    let mut names = cudarc::get_lib_name_candidates(lib);
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// The NVRTC names tried, in order: cudarc's, then the newer ones.
fn names() -> Vec<String> {
    let mut tried = candidates("nvrtc");
    tried.extend(NEWER.iter().map(|s| s.to_string()));
    tried
}

/// Which NVRTC libraries were looked for, and how to get one.
pub fn missing() -> String {
    format!(
        "NVRTC (the CUDA runtime compiler, which compiles the kernels) not found: none of {} \
         could be opened (looked for in LD_LIBRARY_PATH, /etc/ld.so.cache and the default \
         library directories); install the driver's CUDA version of NVRTC (e.g. the \
         cuda-nvrtc-12-* or cuda-nvrtc-13-* package, or the nvidia-cuda-nvrtc wheel) or add \
         its directory to LD_LIBRARY_PATH",
        names().join(", ")
    )
}

#[cfg(target_os = "linux")]
mod dl {
    use std::ffi::{CStr, CString, c_char, c_int, c_void};

    const RTLD_NOW: c_int = 2;

    #[cfg_attr(target_env = "gnu", link(name = "dl"))]
    unsafe extern "C" {
        fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }

    type Program = *mut c_void;
    type Create = unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int;
    type Compile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
    type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
    type Get = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
    type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;

    /// The NVRTC functions this file calls, from one opened library (never
    /// closed: the process keeps it, as cudarc keeps its own).
    pub struct Nvrtc {
        create: Create,
        compile: Compile,
        log_size: Size,
        log: Get,
        cubin_size: Size,
        cubin: Get,
        destroy: Destroy,
    }

    /// `name` in `lib`, as a function pointer of type `F`.
    ///
    /// # Safety
    ///
    /// `lib` is a handle from `dlopen`, and the symbol `name` has type `F`.
    unsafe fn symbol<F: Copy>(lib: *mut c_void, name: &CStr) -> Option<F> {
        // SAFETY: `lib` is a live handle; `name` is NUL-terminated.
        let p = unsafe { dlsym(lib, name.as_ptr()) };
        // SAFETY: the caller says the symbol is a function of type `F`, which
        // is a function pointer (the size of a data pointer on Linux).
        (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }

    impl Nvrtc {
        /// The library `name`, if it opens and has the functions.
        pub fn open(name: &str) -> Option<Self> {
            let cname = CString::new(name).ok()?;
            // SAFETY: opening a shared library runs its initialisers; NVRTC's
            // are the ones cudarc would run opening it under another name.
            let lib = unsafe { dlopen(cname.as_ptr(), RTLD_NOW) };
            if lib.is_null() {
                return None;
            }
            // SAFETY: these are NVRTC's documented signatures (nvrtc.h).
            unsafe {
                Some(Self {
                    create: symbol(lib, c"nvrtcCreateProgram")?,
                    compile: symbol(lib, c"nvrtcCompileProgram")?,
                    log_size: symbol(lib, c"nvrtcGetProgramLogSize")?,
                    log: symbol(lib, c"nvrtcGetProgramLog")?,
                    cubin_size: symbol(lib, c"nvrtcGetCUBINSize")?,
                    cubin: symbol(lib, c"nvrtcGetCUBIN")?,
                    destroy: symbol(lib, c"nvrtcDestroyProgram")?,
                })
            }
        }

        /// `src` compiled with the one option `arch` (a real architecture:
        /// see `arch_option`), as CUBIN.
        pub fn compile(&self, src: &str, arch: &str) -> Result<Vec<u8>, String> {
            let csrc = CString::new(src).map_err(|e| e.to_string())?;
            let carch = CString::new(arch).map_err(|e| e.to_string())?;
            let options = [carch.as_ptr()];
            let mut prog: Program = std::ptr::null_mut();
            // SAFETY: valid out pointer and NUL-terminated source; no headers.
            let r = unsafe {
                (self.create)(
                    &mut prog,
                    csrc.as_ptr(),
                    c"kernel.cu".as_ptr(),
                    0,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            };
            if r != 0 {
                return Err(format!("nvrtcCreateProgram failed ({r})"));
            }
            // SAFETY: `prog` was created above; one NUL-terminated option,
            // alive until the call returns.
            let compiled = unsafe { (self.compile)(prog, 1, options.as_ptr()) };
            let result = if compiled == 0 {
                // SAFETY: `prog` compiled for a real architecture: it has CUBIN.
                unsafe { self.bytes(prog, self.cubin_size, self.cubin) }
            } else {
                // SAFETY: `prog` exists; its log says why it failed.
                let log = unsafe { self.bytes(prog, self.log_size, self.log) }.map(|b| text(&b));
                Err(format!(
                    "NVRTC failed ({compiled}): {}",
                    log.unwrap_or_default()
                ))
            };
            // SAFETY: destroyed once, not used after.
            unsafe { (self.destroy)(&mut prog) };
            result
        }

        /// What NVRTC writes into a buffer of the size it reports.
        ///
        /// # Safety
        ///
        /// `prog` is a live program; `size` and `get` are a matching pair.
        unsafe fn bytes(&self, prog: Program, size: Size, get: Get) -> Result<Vec<u8>, String> {
            let mut n = 0usize;
            // SAFETY: valid out pointer.
            if unsafe { size(prog, &mut n) } != 0 {
                return Err("NVRTC could not size its output".into());
            }
            let mut buf = vec![0u8; n.max(1)];
            // SAFETY: the buffer holds the `n` bytes NVRTC said it writes.
            if unsafe { get(prog, buf.as_mut_ptr().cast()) } != 0 {
                return Err("NVRTC could not write its output".into());
            }
            buf.truncate(n);
            Ok(buf)
        }
    }

    /// A NUL-terminated log as text.
    fn text(b: &[u8]) -> String {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    }
}
