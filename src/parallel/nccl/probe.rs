//! What [`Backend::Nccl`](crate::parallel::Backend::Nccl) checks before
//! it calls NCCL: that the library loads and has the symbols the backend
//! calls (cudarc's own loader panics on a missing library or symbol), and
//! that the group's devices are CUDA devices, one per GPU.
//!
//! Where the library does not load, the message says what works (see
//! [`not_loaded`]): cudarc opens NCCL only by names NCCL 2 does not
//! install (`libnccl.so`, `libnccl.so.12`, ..., never `libnccl.so.2`).
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
        return Err(not_loaded(nccl_2().as_deref()));
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

/// The names cudarc tries for NCCL, in its order, each once.
fn tried() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in cudarc::get_lib_name_candidates("nccl") {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// Why the library did not load and what works, given the file
/// `libnccl.so.2` opens here from (`found`), if it does.
///
/// cudarc (`get_lib_name_candidates`, built for CUDA 12.6) dlopens
/// `libnccl.so`, `libnccl64*.so` and `libnccl.so.12`, `.11`, `.10`, `.9`,
/// `.1`: never `libnccl.so.2`, NCCL 2's own name and the only one the
/// `nvidia-nccl-cu12`/`-cu13` wheels ship. Loading that one first
/// (`LD_PRELOAD`) does not help: the loader matches a name asked for against
/// the loaded libraries' names, not against `libnccl.so.2`. A link named
/// `libnccl.so` in a directory of `LD_LIBRARY_PATH` (read when the program
/// starts) does.
fn not_loaded(found: Option<&str>) -> String {
    let how = match found {
        Some(path) => format!(
            "libnccl.so.2 does open here, from {path}: `mkdir -p DIR && ln -sf {path} \
             DIR/libnccl.so` and start the program with DIR on LD_LIBRARY_PATH"
        ),
        None => "no libnccl.so.2 opens here either: find it (the nvidia-nccl-cu12 and \
                 nvidia-nccl-cu13 wheels put it in site-packages/nvidia/nccl/lib), then \
                 `ln -sf /that/dir/libnccl.so.2 DIR/libnccl.so` and start the program with \
                 DIR on LD_LIBRARY_PATH"
            .to_string(),
    };
    format!(
        "the NCCL library could not be loaded: cudarc opens it only as one of {} (looked for \
         in LD_LIBRARY_PATH, /etc/ld.so.cache and the default library directories), never as \
         libnccl.so.2, the name NCCL 2 installs (preloading libnccl.so.2 does not help). \
         What works: a link named libnccl.so to libnccl.so.2 in a directory on \
         LD_LIBRARY_PATH; {how}",
        tried().join(", ")
    )
}

/// The file `libnccl.so.2` opens from here, if it opens (it stays loaded:
/// NCCL's initialisers run, as they would for the backend).
#[cfg(target_os = "linux")]
fn nccl_2() -> Option<String> {
    use std::ffi::{c_char, c_int, c_void};
    #[cfg_attr(target_env = "gnu", link(name = "dl"))]
    unsafe extern "C" {
        fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    }
    const RTLD_LAZY: c_int = 1;
    // SAFETY: a NUL-terminated name; opening runs the library's
    // initialisers, as cudarc's opening would.
    let lib = unsafe { dlopen(c"libnccl.so.2".as_ptr(), RTLD_LAZY) };
    if lib.is_null() {
        return None;
    }
    let files = crate::device::mapped_libraries("libnccl.so");
    Some(
        files
            .into_iter()
            .next()
            .unwrap_or_else(|| "libnccl.so.2".into()),
    )
}

#[cfg(not(target_os = "linux"))]
fn nccl_2() -> Option<String> {
    None
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

    #[test]
    fn cudarc_never_asks_for_libnccl_so_2() {
        // What the message says of cudarc, checked against cudarc.
        let names = tried();
        assert!(!names.iter().any(|n| n == "libnccl.so.2"), "{names:?}");
        assert_eq!(names[0], "libnccl.so");
        assert!(names.iter().any(|n| n == "libnccl.so.1"), "{names:?}");
    }

    #[test]
    fn the_message_says_what_works() {
        let m = not_loaded(Some("/w/nvidia/nccl/lib/libnccl.so.2"));
        for name in tried() {
            assert!(m.contains(&name), "{name} missing: {m}");
        }
        assert!(
            m.contains(
                "libnccl.so.2 does open here, from /w/nvidia/nccl/lib/libnccl.so.2: `mkdir -p \
                 DIR && ln -sf /w/nvidia/nccl/lib/libnccl.so.2 DIR/libnccl.so` and start the \
                 program with DIR on LD_LIBRARY_PATH"
            ),
            "{m}"
        );
        assert!(!m.contains("set LD_LIBRARY_PATH to where"), "{m}");
        let m = not_loaded(None);
        assert!(m.contains("no libnccl.so.2 opens here either"), "{m}");
        assert!(m.contains("site-packages/nvidia/nccl/lib"), "{m}");
    }

    /// Run by [`a_link_named_libnccl_so_is_what_loads`] in a child process:
    /// prints what the probe says.
    #[test]
    #[ignore = "run by a_link_named_libnccl_so_is_what_loads, with LD_LIBRARY_PATH set"]
    fn print_the_probe() {
        println!("PROBE: {:?}", library());
    }

    /// This test binary's test `print_the_probe`, run with LD_LIBRARY_PATH
    /// `path`: what it printed.
    fn probe_with(path: &std::path::Path) -> String {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "parallel::nccl::probe::tests::print_the_probe",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("LD_LIBRARY_PATH", path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success() && text.contains("PROBE: "), "{text}");
        text
    }

    /// A library named (and with the soname) `libnccl.so.2`, as the wheels
    /// ship it, following the message's advice: loads by the link only.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_link_named_libnccl_so_is_what_loads() {
        // SAFETY: only tries to open the library.
        if unsafe { nccl_sys::is_culib_present() } {
            // A real NCCL under cudarc's names would be found first.
            println!("a real NCCL loads here: the fake one is not tried");
            return;
        }
        let base = std::env::temp_dir().join(format!("depflow-nccl-{}", std::process::id()));
        let (wheel, linked) = (base.join("wheel"), base.join("linked"));
        std::fs::create_dir_all(&wheel).unwrap();
        std::fs::create_dir_all(&linked).unwrap();
        let so2 = wheel.join("libnccl.so.2");
        let built = std::process::Command::new("cc")
            .args([
                "-shared",
                "-fPIC",
                "-Wl,-soname,libnccl.so.2",
                "-x",
                "c",
                "-o",
            ])
            .arg(&so2)
            .arg("-")
            .stdin(std::process::Stdio::null())
            .status()
            .expect("a C compiler (cc), which links Rust programs here");
        assert!(built.success(), "cc could not build a fake libnccl.so.2");

        // Only libnccl.so.2 on the path: not loaded, and the message names
        // the file to link to.
        let text = probe_with(&wheel);
        let want = format!("libnccl.so.2 does open here, from {}", so2.display());
        assert!(text.contains(&want), "{text}");

        // The advice followed: cudarc loads it (and finds no NCCL symbols
        // in this empty library).
        let link = linked.join("libnccl.so");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&so2, &link).unwrap();
        let text = probe_with(&linked);
        assert!(
            text.contains("the NCCL library has no ncclCommInitAll"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
