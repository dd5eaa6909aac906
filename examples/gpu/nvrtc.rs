//! Kernels compiled at run time with NVRTC, shared by `tests/cuda.rs`, the
//! `gpu_pipeline` example and `benches/gpu.rs` (each includes this file with
//! `#[path = ...] mod nvrtc;`).
//!
//! cudarc (built for CUDA 12) looks for `libnvrtc.so`, `libnvrtc.so.12` and
//! older names, not for the `libnvrtc.so.13` a CUDA 13 machine may ship
//! alone. [`compile`] tries cudarc first, then opens those newer names itself
//! (`dlopen`) and calls the five NVRTC functions it needs (their signatures
//! have not changed since CUDA 9); where none is found, the error says
//! exactly which names were tried and where they were looked for.

// `unsafe`: dlopen/dlsym and NVRTC's C functions, each block says why it is sound.
#![allow(unsafe_code)]
// Not every includer calls every function.
#![allow(dead_code)]

use cudarc::nvrtc::Ptx;

/// Names of the NVRTC library that cudarc does not try.
const NEWER: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.14"];

/// `src` compiled to PTX (the driver compiles PTX for the GPU it loads it
/// on); an error says what is missing, or NVRTC's log.
pub fn compile(src: &str) -> Result<Ptx, String> {
    // SAFETY: only tries to open the library.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return cudarc::nvrtc::compile_ptx(src).map_err(|e| format!("NVRTC failed: {e}"));
    }
    #[cfg(target_os = "linux")]
    for name in NEWER {
        if let Some(lib) = dl::Nvrtc::open(name) {
            return lib.compile(src).map(Ptx::from_src);
        }
    }
    Err(missing())
}

/// Whether an NVRTC library opens (cudarc's names or the newer ones); the
/// error says what is missing.
pub fn available() -> Result<(), String> {
    // SAFETY: only tries to open the library.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    #[cfg(target_os = "linux")]
    if NEWER.iter().any(|name| dl::Nvrtc::open(name).is_some()) {
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

/// Which NVRTC libraries were looked for, and how to get one.
pub fn missing() -> String {
    let mut tried = candidates("nvrtc");
    tried.extend(NEWER.iter().map(|s| s.to_string()));
    format!(
        "NVRTC (the CUDA runtime compiler, which compiles the kernels) not found: none of {} \
         could be opened (looked for in LD_LIBRARY_PATH, /etc/ld.so.cache and the default \
         library directories); install the driver's CUDA version of NVRTC (e.g. the \
         cuda-nvrtc-12-* or cuda-nvrtc-13-* package) or add its directory to LD_LIBRARY_PATH",
        tried.join(", ")
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
        ptx_size: Size,
        ptx: Get,
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
                    ptx_size: symbol(lib, c"nvrtcGetPTXSize")?,
                    ptx: symbol(lib, c"nvrtcGetPTX")?,
                    destroy: symbol(lib, c"nvrtcDestroyProgram")?,
                })
            }
        }

        /// `src` compiled to PTX text.
        pub fn compile(&self, src: &str) -> Result<String, String> {
            let csrc = CString::new(src).map_err(|e| e.to_string())?;
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
            // SAFETY: `prog` was created above; no options.
            let compiled = unsafe { (self.compile)(prog, 0, std::ptr::null()) };
            let result = if compiled == 0 {
                // SAFETY: `prog` compiled.
                unsafe { self.text(prog, self.ptx_size, self.ptx) }
            } else {
                // SAFETY: `prog` exists; its log says why it failed.
                let log = unsafe { self.text(prog, self.log_size, self.log) };
                Err(format!(
                    "NVRTC failed ({compiled}): {}",
                    log.unwrap_or_default()
                ))
            };
            // SAFETY: destroyed once, not used after.
            unsafe { (self.destroy)(&mut prog) };
            result
        }

        /// A string NVRTC writes into a buffer of the size it reports.
        ///
        /// # Safety
        ///
        /// `prog` is a live program; `size` and `get` are a matching pair.
        unsafe fn text(&self, prog: Program, size: Size, get: Get) -> Result<String, String> {
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
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            buf.truncate(end);
            String::from_utf8(buf).map_err(|e| e.to_string())
        }
    }
}
