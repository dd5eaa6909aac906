//! The stream devices' figures: hand-off latency, copy/compute overlap and
//! host threads, one line each, labelled with the device.
//!
//! ```text
//! cargo bench --bench gpu [-- --quick]                  # simulated GPU
//! cargo bench --features cuda --bench gpu [-- --quick]  # CUDA device 0, if any
//! ```
//!
//! 1. **Hand-off latency**: a chain of N tiny kernels (`x[i] += 1`, one block
//!    of 32 threads) on one variable, alternating between `Compute(0)` and
//!    `Compute(1)`: each waits on the device for the previous one's event on
//!    the other stream. Against the floor: the same N kernels launched on one
//!    stream, no engine. Both from the first push or launch to the last kernel
//!    done, in µs per op (target: within 2 µs/op of the floor).
//! 2. **Overlap**: host-to-device copy, kernel, device-to-host copy over C
//!    chunks (as in `examples/gpu_pipeline.rs`): each stage alone over all
//!    chunks, then all 3C ops pushed at once. Reports the achieved time, the
//!    sum of the stages, the longest one and achieved / longest (target:
//!    at most 1.10).
//! 3. **Host threads**: the process's OS threads (`/proc/self/status`) before
//!    building an engine, with it idle, and with N + 1 ops in flight: a first
//!    op holds `Compute(0)` (a host function waiting for a gate), the N
//!    kernels are pushed behind it, the threads are counted, the gate opens.
//!    On CUDA the "before" count includes the driver's threads (the context
//!    exists by then).
//!
//! N = 10000 and C = 64 (`--quick`: 1000 and 16); times are the best of 3
//! runs (1 with `--quick`). Every run is checked (the chain ends at N, the
//! pipeline's outputs match the CPU); a wrong result exits non-zero.
//!
//! Without a CUDA device (or the `cuda` feature) the same measurements run on
//! `Executor::simulated_gpu(2)`, whose kernels are host closures run by a
//! thread per stream, and the floor is the same closures called in a loop on
//! one thread: engine overhead only, not GPU figures. With CUDA, the kernels
//! are compiled at run time with NVRTC and the host buffers are pinned (a
//! copy from or to pageable memory blocks the launcher thread until done).

use std::ops::Range;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use depflow::{BoxError, Device, Engine, Executor, Lane, OpHandle, Stream, Var};

type Res<T = ()> = Result<T, BoxError>;

const USAGE: &str = "usage: cargo bench --bench gpu [--features cuda] -- [--quick] [--help]
  --quick   1000 kernels and 16 chunks (instead of 10000 and 64), one run each";
const A: f32 = 1.5;
const B: f32 = -0.25;

/// The pipeline's kernel: the CPU reference.
fn f(x: f32) -> f32 {
    let y = A * x + B;
    y / (1.0 + y.abs())
}

/// What the measurements need of a GPU; everything on a `Stream` is
/// enqueued (it returns before the work is done).
trait Gpu: Send + Sync + 'static {
    type Counter: Send + Sync + 'static;
    type Host: Send + Sync + 'static;
    type Dev: Send + Sync + 'static;
    fn label(&self) -> String;
    fn executor(&self) -> Executor;
    /// Floats per pipeline chunk.
    fn chunk_len(&self) -> usize;
    fn counter(&self) -> Res<Self::Counter>;
    /// One tiny kernel, the `i`th of its chain: the counter += 1.
    fn bump(&self, s: &Stream, x: &mut Self::Counter, i: u64) -> Res;
    /// The counter's value (host side, once its kernels are done).
    fn count(&self, x: &Self::Counter) -> Res<u64>;
    /// `n` of the same kernels on one stream, no engine (checked).
    fn floor(&self, n: u64) -> Res<Duration>;
    fn host(&self, data: &[f32]) -> Res<Self::Host>;
    fn dev(&self, len: usize) -> Res<Self::Dev>;
    fn h2d(&self, s: &Stream, src: &Self::Host, dst: &mut Self::Dev) -> Res;
    fn kernel(&self, s: &Stream, x: &mut Self::Dev) -> Res;
    fn d2h(&self, s: &Stream, src: &Self::Dev, dst: &mut Self::Host) -> Res;
    /// From a host op: the values, leaving NaNs.
    fn take(&self, h: &mut Self::Host) -> Res<Vec<f32>>;
}

// ---- The simulated GPU ----

struct Sim;
type SimBuf = Arc<Mutex<Vec<f32>>>;

/// The simulated kernel `i` of a chain: fails if it runs out of order.
fn sim_bump(x: Arc<AtomicU64>, i: u64) -> impl FnOnce() -> Result<(), String> + Send + 'static {
    move || match x.load(SeqCst) {
        v if v == i => {
            x.store(i + 1, SeqCst);
            Ok(())
        }
        v => Err(format!("kernel {i} ran after {v} kernels")),
    }
}

fn lock(b: &SimBuf) -> Result<MutexGuard<'_, Vec<f32>>, String> {
    b.lock()
        .map_err(|_| "a closure panicked holding the buffer".to_string())
}

fn sim_copy(s: &Stream, src: &SimBuf, dst: &SimBuf) -> Res {
    let (src, dst) = (src.clone(), dst.clone());
    s.enqueue(move || {
        lock(&dst)?.copy_from_slice(&lock(&src)?);
        Ok(())
    })?;
    Ok(())
}

impl Gpu for Sim {
    type Counter = Arc<AtomicU64>;
    type Host = SimBuf;
    type Dev = SimBuf;
    fn label(&self) -> String {
        "simulated GPU (no CUDA device): engine overhead only, not GPU figures".into()
    }
    fn executor(&self) -> Executor {
        Executor::simulated_gpu(2)
    }
    fn chunk_len(&self) -> usize {
        1 << 16
    }
    fn counter(&self) -> Res<Self::Counter> {
        Ok(Arc::default())
    }
    fn bump(&self, s: &Stream, x: &mut Self::Counter, i: u64) -> Res {
        Ok(s.enqueue(sim_bump(x.clone(), i))?)
    }
    fn count(&self, x: &Self::Counter) -> Res<u64> {
        Ok(x.load(SeqCst))
    }
    fn floor(&self, n: u64) -> Res<Duration> {
        let x = self.counter()?;
        let t = Instant::now();
        for i in 0..n {
            // Boxed, as `Stream::enqueue` does.
            let kernel: Box<dyn FnOnce() -> Result<(), String> + Send> =
                Box::new(sim_bump(x.clone(), i));
            kernel()?;
        }
        let took = t.elapsed();
        check_count("floor", self.count(&x)?, n)?;
        Ok(took)
    }
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
        s.enqueue(move || {
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
mod cuda {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use cudarc::driver::{
        CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice,
        PushKernelArg,
    };
    use depflow::{Executor, Stream};

    use super::{A, B, Gpu, Res, check_count};

    const KERNELS: &str = r#"
extern "C" __global__ void bump(unsigned int* x) { x[threadIdx.x] += 1; }
extern "C" __global__ void affine_softsign(float* x, int n, float a, float b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float y = a * x[i] + b; x[i] = y / (1.0f + fabsf(y)); }
}"#;
    const BUMP: LaunchConfig = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };

    pub struct Cuda {
        ctx: Arc<CudaContext>,
        /// This context's default stream: allocations and reading counters.
        alloc: Arc<CudaStream>,
        /// The floor's stream.
        floor: Arc<CudaStream>,
        bump: CudaFunction,
        softsign: CudaFunction,
        name: String,
    }

    fn cu(s: &Stream) -> Res<&Arc<CudaStream>> {
        s.cuda().ok_or_else(|| "not a CUDA stream".into())
    }

    impl Cuda {
        pub fn new() -> Res<Self> {
            // Device 0's primary context, which the engine's device shares.
            let ctx = CudaContext::new(0)?;
            // SAFETY: only the engine orders the work on the buffers allocated
            // below (or, for the floor, one stream): cudarc's own tracking of
            // CudaSlices across streams (an event waited for and recorded at
            // each use) would order it a second time and cost launches.
            unsafe { ctx.disable_event_tracking() };
            // SAFETY: only tries to open the library.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err("NVRTC (libnvrtc) not found: it compiles the kernels".into());
            }
            let module = ctx.load_module(cudarc::nvrtc::compile_ptx(KERNELS)?)?;
            Ok(Self {
                name: ctx.name()?,
                alloc: ctx.default_stream(),
                floor: ctx.new_stream()?,
                bump: module.load_function("bump")?,
                softsign: module.load_function("affine_softsign")?,
                ctx,
            })
        }

        fn launch_bump(&self, s: &CudaStream, x: &mut CudaSlice<u32>) -> Res {
            let mut launch = s.launch_builder(&self.bump);
            launch.arg(x);
            // SAFETY: `bump` takes one pointer to 32 elements.
            unsafe { launch.launch(BUMP) }?;
            Ok(())
        }
    }

    impl Gpu for Cuda {
        type Counter = CudaSlice<u32>;
        type Host = PinnedHostSlice<f32>;
        type Dev = CudaSlice<f32>;
        fn label(&self) -> String {
            format!("CUDA device 0 ({})", self.name)
        }
        fn executor(&self) -> Executor {
            Executor::cuda(0, 2)
        }
        fn chunk_len(&self) -> usize {
            1 << 20
        }
        fn counter(&self) -> Res<Self::Counter> {
            let x = self.alloc.alloc_zeros::<u32>(BUMP.block_dim.0 as usize)?;
            // The engine's (non-blocking) streams do not wait for this one.
            self.alloc.synchronize()?;
            Ok(x)
        }
        fn bump(&self, s: &Stream, x: &mut Self::Counter, _: u64) -> Res {
            self.launch_bump(cu(s)?, x)
        }
        fn count(&self, x: &Self::Counter) -> Res<u64> {
            let v = self.alloc.clone_dtoh(x)?;
            self.alloc.synchronize()?;
            match v.iter().min() == v.iter().max() {
                true => Ok(u64::from(v[0])),
                false => Err(format!("counter elements differ: {v:?}").into()),
            }
        }
        fn floor(&self, n: u64) -> Res<Duration> {
            let mut x = self.counter()?;
            for _ in 0..100 {
                self.launch_bump(&self.floor, &mut x)?;
            }
            self.floor.synchronize()?;
            let t = Instant::now();
            for _ in 0..n {
                self.launch_bump(&self.floor, &mut x)?;
            }
            self.floor.synchronize()?;
            let took = t.elapsed();
            check_count("floor", self.count(&x)?, n + 100)?;
            Ok(took)
        }
        fn host(&self, data: &[f32]) -> Res<Self::Host> {
            // Pinned, not write-combined: the host reads the outputs back.
            // SAFETY: uninitialized memory, written at once.
            let mut h = unsafe { self.ctx.alloc_pinned_with_flags::<f32>(data.len(), 0) }?;
            h.as_mut_slice()?.copy_from_slice(data);
            Ok(h)
        }
        fn dev(&self, len: usize) -> Res<Self::Dev> {
            let d = self.alloc.alloc_zeros::<f32>(len)?;
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
            // SAFETY: the arguments match the kernel's; `n` is x's length.
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

// ---- The measurements ----

fn check_count(what: &str, got: u64, want: u64) -> Res {
    match got == want {
        true => Ok(()),
        false => Err(format!("{what}: the counter is {got} after {want} kernels").into()),
    }
}

fn engine_on<G: Gpu>(g: &G) -> Res<(Engine, Device)> {
    let engine = Engine::builder().device("gpu", g.executor()).build()?;
    let gpu = engine.device("gpu").ok_or("no device `gpu`")?;
    Ok((engine, gpu))
}

/// Pushes kernels `range` of a chain on `x`, alternating compute streams.
fn push_chain<G: Gpu>(
    e: &Engine,
    gpu: Device,
    g: &Arc<G>,
    x: &Var<G::Counter>,
    range: Range<u64>,
) -> Res<Vec<OpHandle<()>>> {
    let mut handles = Vec::with_capacity(range.end.saturating_sub(range.start) as usize);
    for i in range {
        let (g, k) = (g.clone(), x.key());
        handles.push(
            e.op()
                .on(gpu)
                .lane(Lane::Compute((i % 2) as u8))
                .mutates(&[x])
                .run(move |ctx| g.bump(ctx.stream()?, &mut *ctx.write(k)?, i))?,
        );
    }
    Ok(handles)
}

/// The counter's value, read by a host op (after the chain's last kernel).
fn read_count<G: Gpu>(e: &Engine, g: &Arc<G>, x: &Var<G::Counter>) -> Res<u64> {
    let (g, k) = (g.clone(), x.key());
    Ok(e.push(&[x], &[], move |ctx| g.count(&*ctx.read(k)?))?
        .wait()?)
}

/// Figure 1: (engine, floor), best of `runs`.
fn handoff<G: Gpu>(g: &Arc<G>, n: u64, runs: usize) -> Res<(Duration, Duration)> {
    let (engine, gpu) = engine_on(&**g)?;
    let warm = engine.var(g.counter()?);
    push_chain(&engine, gpu, g, &warm, 0..100)?;
    engine.wait_all().wait()?;
    let (mut best, mut floor) = (Duration::MAX, Duration::MAX);
    for _ in 0..runs {
        let x = engine.var(g.counter()?);
        let t = Instant::now();
        let handles = push_chain(&engine, gpu, g, &x, 0..n)?;
        engine.wait_all().wait()?;
        best = best.min(t.elapsed());
        drop(handles);
        check_count("chain", read_count(&engine, g, &x)?, n)?;
        floor = floor.min(g.floor(n)?);
    }
    Ok((best, floor))
}

struct Chunk<G: Gpu> {
    input: Var<G::Host>,
    dev: Var<G::Dev>,
    output: Var<G::Host>,
}

/// Pushes chunk `c`'s op of stage `s` (0: copy in, 1: kernel, 2: copy out).
fn push_stage<G: Gpu>(
    e: &Engine,
    gpu: Device,
    g: &Arc<G>,
    s: usize,
    c: usize,
    ch: &Chunk<G>,
) -> Res {
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

/// Figure 2: (each stage alone, the pipeline), best of `runs`; checked.
fn overlap<G: Gpu>(g: &Arc<G>, chunks: usize, runs: usize) -> Res<([Duration; 3], Duration)> {
    let (engine, gpu) = engine_on(&**g)?;
    let len = g.chunk_len();
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
    // Pushes `stages` of every chunk, chunk by chunk, then waits once.
    let pass = |stages: &[usize]| -> Res<Duration> {
        let t = Instant::now();
        for (c, ch) in chunks.iter().enumerate() {
            for &s in stages {
                push_stage(&engine, gpu, g, s, c, ch)?;
            }
        }
        engine.wait_all().wait()?;
        Ok(t.elapsed())
    };
    // Takes the outputs with host ops (after the copies out), leaving NaNs.
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
    let (mut alone, mut piped) = ([Duration::MAX; 3], Duration::MAX);
    for _ in 0..runs {
        for (s, best) in alone.iter_mut().enumerate() {
            *best = (*best).min(pass(&[s])?);
        }
        take()?;
        piped = piped.min(pass(&[0, 1, 2])?);
        for (c, (xs, ys)) in inputs.iter().zip(take()?).enumerate() {
            for (i, (&x, y)) in xs.iter().zip(ys).enumerate() {
                // The GPU may contract `a * x + b` into a fused multiply-add.
                if y.is_nan() || (y - f(x)).abs() > 1e-5 * f(x).abs().max(1.0) {
                    let e = format!("pipeline: chunk {c}, element {i} is {y}, want {}", f(x));
                    return Err(e.into());
                }
            }
        }
    }
    Ok((alone, piped))
}

struct Open(Arc<AtomicBool>);
impl Drop for Open {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

/// The process's OS threads (Linux), or None.
fn os_threads() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Threads:"))?;
    line["Threads:".len()..].trim().parse().ok()
}

/// Figure 3: threads (before the engine, engine idle, ops in flight) and
/// the ops in flight when counted.
fn threads<G: Gpu>(g: &Arc<G>, n: u64) -> Res<([Option<usize>; 3], usize)> {
    let before = os_threads();
    let (engine, gpu) = engine_on(&**g)?;
    let idle = os_threads();
    let x = engine.var(g.counter()?);
    let gate = Arc::new(AtomicBool::new(false));
    // Opens the gate when dropped, also on an early return.
    let open = Open(gate.clone());
    let gate_op = engine
        .op()
        .on(gpu)
        .lane(Lane::Compute(0))
        .mutates(&[&x])
        .run(move |ctx| {
            ctx.stream()?.enqueue(move || {
                let t = Instant::now();
                while !gate.load(SeqCst) {
                    if t.elapsed() > Duration::from_secs(60) {
                        return Err("the gate never opened".into());
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                Ok(())
            })
        })?;
    let handles = push_chain(&engine, gpu, g, &x, 0..n)?;
    let mut busy = os_threads();
    // Let the launcher enqueue them all, and count again.
    std::thread::sleep(Duration::from_millis(100));
    busy = busy.max(os_threads());
    let in_flight =
        handles.iter().filter(|h| !h.is_finished()).count() + usize::from(!gate_op.is_finished());
    drop(open);
    engine.wait_all().wait()?;
    check_count("threads' chain", read_count(&engine, g, &x)?, n)?;
    Ok(([before, idle, busy], in_flight))
}

fn us_per_op(d: Duration, n: u64) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn bench<G: Gpu>(g: G, n: u64, chunks: usize, runs: usize) -> Res {
    let g = Arc::new(g);
    let label = g.label();
    let (engine, floor) = handoff(&g, n, runs)?;
    let (e, fl) = (us_per_op(engine, n), us_per_op(floor, n));
    println!(
        "[{label}] hand-off latency: engine {e:.2} µs/op ({n} kernels on one variable, alternating Compute(0)/Compute(1)); floor {fl:.2} µs/op (same kernels, one stream, no engine); difference {:.2} µs/op (target: within 2)",
        e - fl
    );
    let (alone, piped) = overlap(&g, chunks, runs)?;
    let sum: Duration = alone.iter().sum();
    let longest = alone.iter().copied().max().unwrap_or_default();
    println!(
        "[{label}] overlap: {chunks} chunks x {} KiB, copy in -> kernel -> copy out: achieved {:.2} ms; stages alone {:.2} + {:.2} + {:.2} = {:.2} ms; longest {:.2} ms; achieved/longest {:.2} (target: at most 1.10)",
        g.chunk_len() * 4 / 1024,
        ms(piped),
        ms(alone[0]),
        ms(alone[1]),
        ms(alone[2]),
        ms(sum),
        ms(longest),
        piped.as_secs_f64() / longest.as_secs_f64()
    );
    let (t, in_flight) = threads(&g, n)?;
    let show = |t: Option<usize>| t.map_or("n/a".to_string(), |t| t.to_string());
    println!(
        "[{label}] host threads: {} before the engine, {} with the engine idle, {} with {in_flight} GPU ops in flight",
        show(t[0]),
        show(t[1]),
        show(t[2])
    );
    Ok(())
}

fn run(quick: bool) -> Res {
    let (n, chunks, runs) = if quick {
        (1_000, 16, 1)
    } else {
        (10_000, 64, 3)
    };
    #[cfg(feature = "cuda")]
    if depflow::stream::cuda_device_count() > 0 {
        return bench(cuda::Cuda::new()?, n, chunks, runs);
    }
    bench(Sim, n, chunks, runs)
}

fn main() -> ExitCode {
    let mut quick = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => quick = true,
            "--help" | "-h" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            "--bench" => {} // passed by `cargo bench`
            other => {
                eprintln!("error: unknown argument `{other}`\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    match run(quick) {
        Ok(()) => {
            println!("check: ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
