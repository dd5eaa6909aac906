//! The GPU backends and the copy/compute pipeline shared by
//! `examples/gpu_pipeline.rs` and `benches/gpu.rs`, which both include this
//! file with `#[path = ...] mod backend;` (it is not an example of its own:
//! cargo only builds `examples/*.rs` and `examples/*/main.rs`).
//!
//! It holds the pipeline's kernel `x = softsign(a * x + b)` and its CPU
//! reference [`f`], the [`Gpu`] trait (buffers, and the three stages: copy in,
//! kernel, copy out), its two implementations, a simulated GPU ([`Sim`]) and,
//! with the `cuda` feature, CUDA device 0 ([`cuda::Cuda`]: NVRTC kernel,
//! found by [`nvrtc`] under CUDA 12's or 13's names, pinned host buffers), and the [`Pipeline`]: chunks of buffers as engine
//! variables, a pass pushing stages of every chunk, and the read-back. What
//! only the bench needs (the hand-off chain's counter kernel, the floor, the
//! labels) is in the bench, on top of these types.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use depflow::{BoxError, Device, Engine, Executor, Lane, Stream, Var};

pub type Res<T = ()> = Result<T, BoxError>;

/// Floats per pipeline chunk on the simulated GPU (256 KiB) and on CUDA
/// (4 MiB).
pub const SIM_LEN: usize = 1 << 16;
#[cfg(feature = "cuda")]
pub const CUDA_LEN: usize = 1 << 20;
const A: f32 = 1.5;
const B: f32 = -0.25;

/// The kernel's function: the CPU reference.
pub fn f(x: f32) -> f32 {
    let y = A * x + B;
    y / (1.0 + y.abs())
}

/// Whether `y`, the pipeline's output for input `x`, is wrong (NaN: never
/// written).
pub fn wrong(x: f32, y: f32) -> bool {
    // The GPU may contract `a * x + b` into a fused multiply-add.
    y.is_nan() || (y - f(x)).abs() > 1e-5 * f(x).abs().max(1.0)
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What the pipeline needs of a GPU: buffers, and the three stages, each
/// enqueued on the op's stream (they return before the work is done).
pub trait Gpu: Send + Sync + 'static {
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

// ---- The simulated GPU ----

/// A GPU simulated by `Executor::simulated_gpu`: kernels and copies are host
/// closures, run by a thread per stream (`Stream::simulate`).
pub struct Sim;

/// The simulated GPU's memory: a buffer that the streams' closures lock (a
/// closure that panics holding it poisons it, failing the later ops on it).
pub type SimBuf = Arc<Mutex<Vec<f32>>>;

fn lock(b: &SimBuf) -> Result<MutexGuard<'_, Vec<f32>>, String> {
    b.lock()
        .map_err(|_| "a closure panicked holding the buffer".to_string())
}

fn sim_copy(s: &Stream, src: &SimBuf, dst: &SimBuf) -> Res {
    let (src, dst) = (src.clone(), dst.clone());
    s.simulate(move || {
        lock(&dst)?.copy_from_slice(&lock(&src)?);
        Ok(())
    })?;
    Ok(())
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
        s.simulate(move || {
            lock(&x)?.iter_mut().for_each(|v| *v = f(*v));
            Ok(())
        })?;
        Ok(())
    }
    fn d2h(&self, s: &Stream, src: &SimBuf, dst: &mut SimBuf) -> Res {
        sim_copy(s, src, dst)
    }
    fn take(&self, h: &mut SimBuf) -> Res<Vec<f32>> {
        let mut h = lock(h)?;
        let nans = vec![f32::NAN; h.len()];
        Ok(std::mem::replace(&mut *h, nans))
    }
}

// ---- CUDA ----

#[cfg(feature = "cuda")]
#[path = "nvrtc.rs"]
pub mod nvrtc;

#[cfg(feature = "cuda")]
pub mod cuda {
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

    /// CUDA device 0, with the pipeline's kernel compiled by NVRTC.
    pub struct Cuda {
        pub ctx: Arc<CudaContext>,
        /// This context's default stream: allocations (and the bench's
        /// counter reads).
        pub alloc: Arc<CudaStream>,
        softsign: CudaFunction,
        pub name: String,
    }

    /// The op's CUDA stream.
    pub fn cu(s: &Stream) -> Res<&Arc<CudaStream>> {
        s.cuda().ok_or_else(|| "not a CUDA stream".into())
    }

    impl Cuda {
        pub fn new() -> Res<Self> {
            // Device 0's primary context, which the engine's device shares.
            let ctx = CudaContext::new(0)?;
            // SAFETY: only the engine orders the work on the buffers allocated
            // on this context (or, for the bench's floor, one stream), and
            // frees them after `wait_all`: cudarc's own tracking of CudaSlices
            // across streams (an event waited for and recorded at each use)
            // would order it a second time and cost launches.
            unsafe { ctx.disable_event_tracking() };
            let ptx = super::nvrtc::compile(KERNEL, &ctx)?;
            let softsign = ctx.load_module(ptx)?.load_function("affine_softsign")?;
            Ok(Self {
                name: ctx.name()?,
                alloc: ctx.default_stream(),
                ctx,
                softsign,
            })
        }
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
            let mut launch = cu(s)?.launch_builder(&self.softsign);
            launch.arg(x).arg(&n).arg(&A).arg(&B);
            // SAFETY: the arguments match the kernel's signature; `n` is x's length.
            unsafe { launch.launch(LaunchConfig::for_num_elems(n as u32)) }?;
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

// ---- The pipeline ----

/// An engine with one device, `gpu`, on `executor`.
pub fn engine_on(executor: Executor) -> Res<(Engine, Device)> {
    let engine = Engine::builder().device("gpu", executor).build()?;
    let gpu = engine.device("gpu").ok_or("no device `gpu`")?;
    Ok((engine, gpu))
}

/// One chunk's buffers, each a variable.
struct Chunk<G: Gpu> {
    input: Var<G::Host>,
    dev: Var<G::Dev>,
    output: Var<G::Host>,
}

/// The copy/compute pipeline: an engine, and chunks of inputs with their
/// buffers. Chunk `c` goes through a copy in on `Lane::HostToDevice`, the
/// kernel on `Lane::Compute(c % 2)` and a copy out on `Lane::DeviceToHost`.
pub struct Pipeline<G: Gpu> {
    // Declared first, dropped first: the variables before their engine.
    chunks: Vec<Chunk<G>>,
    /// Each chunk's input values.
    pub inputs: Vec<Vec<f32>>,
    engine: Engine,
    gpu: Device,
    g: Arc<G>,
}

impl<G: Gpu> Pipeline<G> {
    /// An engine on `executor` and `chunks` chunks of `len` floats.
    pub fn new(g: &Arc<G>, executor: Executor, chunks: usize, len: usize) -> Res<Self> {
        let (engine, gpu) = engine_on(executor)?;
        let inputs: Vec<Vec<f32>> = (0..chunks)
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
        Ok(Self {
            chunks,
            inputs,
            engine,
            gpu,
            g: g.clone(),
        })
    }

    /// Pushes chunk `c`'s op of stage `s` (0: copy in, 1: kernel, 2: copy out).
    fn push(&self, s: usize, c: usize) -> Res {
        let (g, ch) = (self.g.clone(), &self.chunks[c]);
        let (i, d, o) = (ch.input.key(), ch.dev.key(), ch.output.key());
        let op = self.engine.op().on(self.gpu);
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

    /// Pushes `stages` of every chunk, chunk by chunk, then waits once.
    pub fn pass(&self, stages: &[usize]) -> Res<Duration> {
        let t = Instant::now();
        for c in 0..self.chunks.len() {
            for &s in stages {
                self.push(s, c)?;
            }
        }
        self.engine.wait_all().wait()?;
        Ok(t.elapsed())
    }

    /// Takes the outputs with host ops (which wait for the copies out),
    /// leaving NaNs.
    pub fn take(&self) -> Res<Vec<Vec<f32>>> {
        let ops = self.chunks.iter().map(|ch| {
            let (g, o) = (self.g.clone(), ch.output.key());
            self.engine
                .push(&[], &[&ch.output], move |ctx| g.take(&mut *ctx.write(o)?))
        });
        let ops = ops.collect::<Result<Vec<_>, _>>()?;
        Ok(ops
            .into_iter()
            .map(|op| op.wait())
            .collect::<Result<_, _>>()?)
    }
}
