//! `DEPFLOW_REQUIRE_GPU=1`: the GPU tests, benches and examples skip (or
//! fall back to a simulated GPU) where there is no CUDA device, NVRTC or
//! NCCL, saying why; with this variable set to `1` (on a machine that has
//! a GPU), each such skip is a failure instead, with the same reason.
//! Shared by `tests/cuda.rs`, `tests/nccl.rs`, `tests/differential.rs`,
//! `benches/gpu.rs` and the `gpu_pipeline` example (each includes this
//! file with `#[path = ...] mod require;`).
//!
//! The words are the contract a GPU kit's script reads: a skip prints
//! `SKIPPED <what>: <why>` on stderr (written to the stream, so the test
//! harness does not capture it); under `DEPFLOW_REQUIRE_GPU=1` the test
//! panics, or the program exits non-zero, with
//! `DEPFLOW_REQUIRE_GPU=1, but <what> cannot run: <why>`.

// Not every includer calls every function.
#![allow(dead_code)]

use std::io::Write;

/// Whether `DEPFLOW_REQUIRE_GPU=1`: a skip is a failure.
pub fn required() -> bool {
    std::env::var("DEPFLOW_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The failure a skip of `what` becomes under `DEPFLOW_REQUIRE_GPU=1`.
pub fn refusal(what: &str, why: &str) -> String {
    format!("DEPFLOW_REQUIRE_GPU=1, but {what} cannot run: {why}")
}

/// The line a skip of `what` prints.
pub fn skipped(what: &str, why: &str) -> String {
    format!("SKIPPED {what}: {why}")
}

/// Reports that `what` skips its CUDA part because of `why`, where the user
/// sees it (stderr, not captured by the test harness); panics instead under
/// `DEPFLOW_REQUIRE_GPU=1`.
pub fn skip(what: &str, why: &str) {
    if required() {
        panic!("{}", refusal(what, why));
    }
    let _ = writeln!(std::io::stderr(), "{}", skipped(what, why));
}

/// How many CUDA devices there are, or why none (the driver's words:
/// `depflow::stream::cuda_devices`).
pub fn cuda_devices() -> Result<usize, String> {
    depflow::stream::cuda_devices().map_err(|e| e.to_string())
}

/// For a program that falls back to a simulated GPU where it cannot run
/// `what` on CUDA (because of `why`): says so (a `SKIPPED` line on stderr)
/// and returns `Ok`; under `DEPFLOW_REQUIRE_GPU=1`, returns the refusal, for
/// the program to exit non-zero with.
pub fn fall_back(what: &str, why: &str) -> Result<(), String> {
    if required() {
        return Err(refusal(what, why));
    }
    let _ = writeln!(
        std::io::stderr(),
        "{} (running on the simulated GPU instead)",
        skipped(what, why)
    );
    Ok(())
}
