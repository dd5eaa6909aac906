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
//! the pipeline). Otherwise the same program runs on a simulated GPU
//! (`Executor::simulated_gpu`): a host thread per stream runs enqueued
//! closures, through the same launcher, event and completion code.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use depflow::{BoxError, Device, Engine, Executor, Lane, Stream, Var};

const CHUNKS: usize = 64;
/// Floats per chunk on the simulated GPU (256 KiB) and on CUDA (4 MiB).
const SIM_LEN: usize = 1 << 16;
#[cfg(feature = "cuda")]
const CUDA_LEN: usize = 1 << 20;
const A: f32 = 1.5;
const B: f32 = -0.25;

type Res<T = ()> = Result<T, BoxError>;

/// The kernel's function: the CPU reference.
fn f(x: f32) -> f32 {
    let y = A * x + B;
    y / (1.0 + y.abs())
}

/// What the pipeline needs of a GPU: buffers, and the three stages, each
/// enqueued on the op's stream (they return before the work is done).
trait Gpu: Send + Sync + 'static {
    type Host: Send + Sync + 'static;
    type Dev: Send + Sync + 'static;
    fn host(&self, data: &[f32]) -> Res<Self::Host>;
    fn dev(&self, len: usize) -> Res<Self::Dev>;
    fn h2d(&self, s: &Stream, src: &Self::Host, dst: &mut Self::Dev) -> Res;
    fn kernel(&self, s: &Stream, x: &mut Self::Dev) -> Res;
    fn d2h(&self, s: &Stream, src: &Self::Dev, dst: &mut Self::Host) -> Res;
    /// From a host op: the values, leaving NaNs.
    fn take(&self, h: &mut Self::Host) -> Res<Vec<f32>>;
}

/// The simulated GPU's memory: a buffer that the streams' closures lock (a
/// panic in a closure or an op fails that op, and poisons what it mutates).
type SimBuf = Arc<Mutex<Vec<f32>>>;
struct Sim;

fn sim_copy(s: &Stream, src: &SimBuf, dst: &SimBuf) -> Res {
    let (src, dst) = (src.clone(), dst.clone());
    Ok(s.enqueue(move || {
        dst.lock().unwrap().copy_from_slice(&src.lock().unwrap());
        Ok(())
    })?)
}

impl Gpu for Sim {
    type Host = SimBuf;
    type Dev = SimBuf;
    fn host(&self, data: &[f32]) -> Res<SimBuf> {
        Ok(Arc::new(Mutex::new(data.to_vec())))
    }
    fn dev(&self, len: usize) -> Res<SimBuf> {
        Ok(Arc::new(Mutex::new(vec![0.0; len])))
    }
    fn h2d(&self, s: &Stream, src: &SimBuf, dst: &mut SimBuf) -> Res {
        sim_copy(s, src, dst)
    }
    fn kernel(&self, s: &Stream, x: &mut SimBuf) -> Res {
        let x = x.clone();
        Ok(s.enqueue(move || {
            x.lock().unwrap().iter_mut().for_each(|v| *v = f(*v));
            Ok(())
        })?)
    }
    fn d2h(&self, s: &Stream, src: &SimBuf, dst: &mut SimBuf) -> Res {
        sim_copy(s, src, dst)
    }
    fn take(&self, h: &mut SimBuf) -> Res<Vec<f32>> {
        let mut h = h.lock().unwrap();
        let nans = vec![f32::NAN; h.len()];
        Ok(std::mem::replace(&mut *h, nans))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;

    use cudarc::driver::{
        CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice,
        PushKernelArg,
    };
    use depflow::Stream;

    use super::{A, B, Gpu, Res};

    const KERNEL: &str = r#"
extern "C" __global__ void affine_softsign(float* x, int n, float a, float b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float y = a * x[i] + b; x[i] = y / (1.0f + fabsf(y)); }
}"#;

    pub struct Cuda {
        ctx: Arc<CudaContext>,
        /// This context's default stream: allocations only.
        alloc: Arc<CudaStream>,
        f: CudaFunction,
        pub name: String,
    }

    impl Cuda {
        pub fn new() -> Res<Self> {
            // Device 0's primary context, which the engine's device shares.
            let ctx = CudaContext::new(0)?;
            // SAFETY: only engine ops touch the buffers allocated below, and
            // the engine orders them (and frees them after `wait_all`).
            // cudarc's own tracking (an event waited for and recorded at
            // every use of a CudaSlice) would order them a second time.
            unsafe { ctx.disable_event_tracking() };
            // SAFETY: only tries to open the library.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err("NVRTC (libnvrtc) not found: it compiles the kernel".into());
            }
            let ptx = cudarc::nvrtc::compile_ptx(KERNEL)?;
            let f = ctx.load_module(ptx)?.load_function("affine_softsign")?;
            Ok(Self {
                name: ctx.name()?,
                alloc: ctx.default_stream(),
                ctx,
                f,
            })
        }
    }

    fn cu(s: &Stream) -> Res<&Arc<CudaStream>> {
        s.cuda().ok_or_else(|| "not a CUDA stream".into())
    }

    impl Gpu for Cuda {
        type Host = PinnedHostSlice<f32>;
        type Dev = CudaSlice<f32>;
        fn host(&self, data: &[f32]) -> Res<Self::Host> {
            // Pinned, not write-combined: the host reads the outputs back.
            // SAFETY: uninitialized memory, written at once.
            let mut h = unsafe { self.ctx.alloc_pinned_with_flags::<f32>(data.len(), 0) }?;
            h.as_mut_slice()?.copy_from_slice(data);
            Ok(h)
        }
        fn dev(&self, len: usize) -> Res<Self::Dev> {
            let d = self.alloc.alloc_zeros::<f32>(len)?;
            // The engine's (non-blocking) streams do not wait for this one.
            self.alloc.synchronize()?;
            Ok(d)
        }
        fn h2d(&self, s: &Stream, src: &Self::Host, dst: &mut Self::Dev) -> Res {
            Ok(cu(s)?.memcpy_htod(src, dst)?)
        }
        fn kernel(&self, s: &Stream, x: &mut Self::Dev) -> Res {
            let n = i32::try_from(x.len())?;
            let cfg = LaunchConfig::for_num_elems(n as u32);
            let mut launch = cu(s)?.launch_builder(&self.f);
            launch.arg(x).arg(&n).arg(&A).arg(&B);
            // SAFETY: the arguments match the kernel's signature; `n` is x's length.
            unsafe { launch.launch(cfg) }?;
            Ok(())
        }
        fn d2h(&self, s: &Stream, src: &Self::Dev, dst: &mut Self::Host) -> Res {
            Ok(cu(s)?.memcpy_dtoh(src, dst)?)
        }
        fn take(&self, h: &mut Self::Host) -> Res<Vec<f32>> {
            let h = h.as_mut_slice()?;
            let values = h.to_vec();
            h.fill(f32::NAN);
            Ok(values)
        }
    }
}

/// One chunk's buffers, each a variable.
struct Chunk<G: Gpu> {
    input: Var<G::Host>,
    dev: Var<G::Dev>,
    output: Var<G::Host>,
}

/// Pushes chunk `c`'s op of stage `s` (0: copy in, 1: kernel, 2: copy out).
fn push<G: Gpu>(e: &Engine, gpu: Device, g: &Arc<G>, s: usize, c: usize, ch: &Chunk<G>) -> Res {
    let g = g.clone();
    let (i, d, o) = (ch.input.key(), ch.dev.key(), ch.output.key());
    let op = e.op().on(gpu);
    match s {
        0 => op
            .lane(Lane::HostToDevice)
            .reads(&[&ch.input])
            .mutates(&[&ch.dev])
            .run(move |ctx| g.h2d(ctx.stream()?, &*ctx.read(i)?, &mut *ctx.write(d)?))?,
        1 => op
            .lane(Lane::Compute((c % 2) as u8))
            .mutates(&[&ch.dev])
            .run(move |ctx| g.kernel(ctx.stream()?, &mut *ctx.write(d)?))?,
        _ => op
            .lane(Lane::DeviceToHost)
            .reads(&[&ch.dev])
            .mutates(&[&ch.output])
            .run(move |ctx| g.d2h(ctx.stream()?, &*ctx.read(d)?, &mut *ctx.write(o)?))?,
    };
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs the pipeline; false if a value is wrong.
fn pipeline<G: Gpu>(g: G, executor: Executor, len: usize) -> Res<bool> {
    let g = Arc::new(g);
    let engine = Engine::builder().device("gpu", executor).build()?;
    let gpu = engine.device("gpu").ok_or("no device `gpu`")?;
    let inputs: Vec<Vec<f32>> = (0..CHUNKS)
        .map(|c| {
            (0..len)
                .map(|i| ((c * len + i) % 1000) as f32 / 100.0 - 5.0)
                .collect()
        })
        .collect();
    let chunks = inputs
        .iter()
        .map(|x| {
            Ok(Chunk {
                input: engine.var(g.host(x)?),
                dev: engine.var(g.dev(len)?),
                output: engine.var(g.host(&vec![f32::NAN; len])?),
            })
        })
        .collect::<Res<Vec<Chunk<G>>>>()?;
    println!(
        "{CHUNKS} chunks of {len} floats ({} KiB): copy in on HostToDevice, kernel on Compute(chunk % 2), copy out on DeviceToHost",
        len * 4 / 1024
    );
    // Pushes `stages` of every chunk, chunk by chunk, then waits once.
    let pass = |stages: &[usize]| -> Res<Duration> {
        let t = Instant::now();
        for (c, ch) in chunks.iter().enumerate() {
            for &s in stages {
                push(&engine, gpu, &g, s, c, ch)?;
            }
        }
        engine.wait_all().wait()?;
        Ok(t.elapsed())
    };
    // Takes the outputs with host ops (which wait for the copies out).
    let take = || -> Res<Vec<Vec<f32>>> {
        let ops = chunks.iter().map(|ch| {
            let (g, o) = (g.clone(), ch.output.key());
            engine.push(&[], &[&ch.output], move |ctx| g.take(&mut *ctx.write(o)?))
        });
        let ops = ops.collect::<Result<Vec<_>, _>>()?;
        Ok(ops
            .into_iter()
            .map(|op| op.wait())
            .collect::<Result<_, _>>()?)
    };

    pass(&[0, 1, 2])?; // warm-up
    let alone = [pass(&[0])?, pass(&[1])?, pass(&[2])?];
    take()?;
    let total = pass(&[0, 1, 2])?;
    let outputs = take()?;

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
    for (c, (xs, ys)) in inputs.iter().zip(&outputs).enumerate() {
        for (i, (&x, &y)) in xs.iter().zip(ys).enumerate() {
            // The GPU may contract `a * x + b` into a fused multiply-add.
            if y.is_nan() || (y - f(x)).abs() > 1e-5 * f(x).abs().max(1.0) {
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
    #[cfg(feature = "cuda")]
    if depflow::stream::cuda_device_count() > 0 {
        let gpu = cuda::Cuda::new()?;
        println!("CUDA device 0: {} (kernel compiled with NVRTC)", gpu.name);
        return pipeline(gpu, Executor::cuda(0, 2), CUDA_LEN);
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "no CUDA device: running on a simulated GPU (Executor::simulated_gpu(2): a host thread per stream, sharing this machine's {cores} cores{})",
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
