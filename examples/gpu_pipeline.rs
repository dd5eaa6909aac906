//! The copy/compute pipeline of the GPU issue, on a stream device.
//!
//! ```text
//! cargo run --release --example gpu_pipeline                  # simulated GPU
//! cargo run --release --features cuda --example gpu_pipeline  # CUDA device 0, if any
//! ```
//!
//! An input of 64 chunks goes through three ops per chunk, all on the GPU
//! device: a host-to-device copy on `Lane::HostToDevice`, a kernel
//! `x = softsign(a * x + b)` in place on `Lane::Compute(chunk % 2)`, and a
//! device-to-host copy on `Lane::DeviceToHost` into a host buffer. Each
//! chunk's input, device buffer and output are variables, so the engine orders
//! each chunk's copy in, kernel and copy out (on the device: a stream waits
//! for the previous op's event, no host round trip), while chunks overlap:
//! chunk `c`'s kernel runs during chunk `c + 1`'s copy in and chunk `c - 1`'s
//! copy out. All 192 ops are pushed at once, then one `wait_all`; host ops
//! then read every output, checked against the CPU. Timing: after an untimed
//! warm-up pass, each stage alone over all chunks, then the pipeline.
//!
//! With the `cuda` feature and a CUDA device, the kernel is compiled at run
//! time with NVRTC and the host buffers are pinned (a copy from or to pageable
//! memory would block the engine's launcher thread until done, serializing
//! the pipeline). Otherwise (no feature, no driver, no GPU, or a GPU but no
//! NVRTC, which the example names) the same program runs on a simulated GPU
//! (`Executor::simulated_gpu`): a host thread per stream runs the
//! simulated closures (`Stream::simulate`), through the same launcher, event and completion code.
//! It says why first (a `SKIPPED` line on stderr, with the driver's error by
//! name and number where there is one). Under `DEPFLOW_REQUIRE_GPU=1` it
//! does not fall back: it exits non-zero, saying why it cannot run on CUDA.

#[path = "gpu/backend.rs"]
mod backend;
#[path = "gpu/require.rs"]
mod require;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use depflow::Executor;

#[cfg(feature = "cuda")]
use backend::CUDA_LEN;
use backend::{Gpu, Pipeline, Res, SIM_LEN, Sim, f, ms, wrong};

const CHUNKS: usize = 64;

/// Runs the pipeline; false if a value is wrong.
fn pipeline<G: Gpu>(g: G, executor: Executor, len: usize) -> Res<bool> {
    let g = Arc::new(g);
    let p = Pipeline::new(&g, executor, CHUNKS, len)?;
    println!(
        "{CHUNKS} chunks of {len} floats ({} KiB): copy in on HostToDevice, kernel on Compute(chunk % 2), copy out on DeviceToHost",
        len * 4 / 1024
    );

    p.pass(&[0, 1, 2])?; // warm-up
    let alone = [p.pass(&[0])?, p.pass(&[1])?, p.pass(&[2])?];
    p.take()?;
    let total = p.pass(&[0, 1, 2])?;
    let outputs = p.take()?;

    let sum: Duration = alone.iter().sum();
    let longest = alone.iter().max().copied().unwrap_or_default();
    println!(
        "stages alone: copy in {:.2} ms + kernel {:.2} ms + copy out {:.2} ms = {:.2} ms",
        ms(alone[0]),
        ms(alone[1]),
        ms(alone[2]),
        ms(sum)
    );
    println!(
        "pipelined:    {:.2} ms total, {:.2} of the sum of stages (longest stage alone: {:.2} ms)",
        ms(total),
        total.as_secs_f64() / sum.as_secs_f64(),
        ms(longest)
    );
    let mut bad = 0usize;
    for (c, (xs, ys)) in p.inputs.iter().zip(&outputs).enumerate() {
        for (i, (&x, &y)) in xs.iter().zip(ys).enumerate() {
            if wrong(x, y) {
                if bad < 5 {
                    eprintln!("mismatch: chunk {c}, element {i}: got {y}, want {}", f(x));
                }
                bad += 1;
            }
        }
    }
    if bad > 0 {
        eprintln!("check: FAILED ({bad} of {} values wrong)", CHUNKS * len);
    }
    Ok(bad == 0)
}

fn run() -> Res<bool> {
    let why = match require::cuda_devices() {
        // A driver and a GPU, but the kernel needs NVRTC too: without it,
        // say exactly what is missing (and run on the simulated GPU).
        #[cfg(feature = "cuda")]
        Ok(_) => match backend::nvrtc::available() {
            Ok(()) => {
                let gpu = backend::cuda::Cuda::new()?;
                println!("CUDA device 0: {} (kernel compiled with NVRTC)", gpu.name);
                return pipeline(gpu, Executor::cuda(0, 2), CUDA_LEN);
            }
            Err(why) => format!("a CUDA device, but {why}"),
        },
        #[cfg(not(feature = "cuda"))]
        Ok(_) => "built without the `cuda` feature".to_string(),
        Err(why) => why,
    };
    require::fall_back("the gpu_pipeline example on CUDA", &why)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "running on a simulated GPU (Executor::simulated_gpu(2): a host thread per stream, sharing this machine's {cores} cores{})",
        if cfg!(feature = "cuda") {
            ""
        } else {
            "; built without the `cuda` feature"
        }
    );
    pipeline(Sim, Executor::simulated_gpu(2), SIM_LEN)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => {
            println!("check: ok");
            ExitCode::SUCCESS
        }
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
