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
//! `Executor::simulated_gpu(2)` (after a `SKIPPED` line saying why; under
//! `DEPFLOW_REQUIRE_GPU=1` the bench exits non-zero instead, saying why), whose kernels are host closures run by a
//! thread per stream, and the floor is the same closures called in a loop on
//! one thread: engine overhead only, not GPU figures. With CUDA, the kernels
//! are compiled at run time with NVRTC and the host buffers are pinned (a
//! copy from or to pageable memory blocks the launcher thread until done).

#[path = "../examples/gpu/backend.rs"]
mod backend;
#[path = "../examples/gpu/require.rs"]
mod require;

use std::ops::Range;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use depflow::{Device, Engine, Executor, Lane, OpHandle, Stream, Var};

use backend::{Gpu, Pipeline, Res, SIM_LEN, Sim, f, ms, wrong};

const USAGE: &str = "usage: cargo bench --bench gpu [--features cuda] -- [--quick] [--help]
  --quick   1000 kernels and 16 chunks (instead of 10000 and 64), one run each";

/// What the measurements need of a GPU beyond the pipeline's stages: the
/// hand-off chain's counter and kernel, its floor, and the engine's device.
/// Everything on a `Stream` is enqueued (it returns before the work is done).
trait Bench: Gpu {
    type Counter: Send + Sync + 'static;
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
}

// ---- The simulated GPU ----

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

impl Bench for Sim {
    type Counter = Arc<AtomicU64>;
    fn label(&self) -> String {
        "simulated GPU (no CUDA device): engine overhead only, not GPU figures".into()
    }
    fn executor(&self) -> Executor {
        Executor::simulated_gpu(2)
    }
    fn chunk_len(&self) -> usize {
        SIM_LEN
    }
    fn counter(&self) -> Res<Self::Counter> {
        Ok(Arc::default())
    }
    fn bump(&self, s: &Stream, x: &mut Self::Counter, i: u64) -> Res {
        Ok(s.simulate(sim_bump(x.clone(), i))?)
    }
    fn count(&self, x: &Self::Counter) -> Res<u64> {
        Ok(x.load(SeqCst))
    }
    fn floor(&self, n: u64) -> Res<Duration> {
        let x = self.counter()?;
        let t = Instant::now();
        for i in 0..n {
            // Boxed, as `Stream::simulate` does.
            let kernel: Box<dyn FnOnce() -> Result<(), String> + Send> =
                Box::new(sim_bump(x.clone(), i));
            kernel()?;
        }
        let took = t.elapsed();
        check_count("floor", self.count(&x)?, n)?;
        Ok(took)
    }
}

// ---- CUDA ----

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use cudarc::driver::{
        CudaFunction, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice, PushKernelArg,
    };
    use depflow::{Executor, Stream};

    use super::backend::cuda::cu;
    use super::backend::{CUDA_LEN, Gpu};
    use super::{Bench, Res, check_count};

    const BUMP_KERNEL: &str = r#"
extern "C" __global__ void bump(unsigned int* x) { x[threadIdx.x] += 1; }"#;
    const BUMP: LaunchConfig = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };

    /// The shared CUDA backend, plus the chain's kernel and the floor's stream.
    pub struct Cuda {
        base: super::backend::cuda::Cuda,
        /// The floor's stream.
        floor: Arc<CudaStream>,
        bump: CudaFunction,
    }

    impl Cuda {
        pub fn new() -> Res<Self> {
            let base = super::backend::cuda::Cuda::new()?;
            let module = base
                .ctx
                .load_module(super::backend::nvrtc::compile(BUMP_KERNEL, &base.ctx)?)?;
            Ok(Self {
                floor: base.ctx.new_stream()?,
                bump: module.load_function("bump")?,
                base,
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

    /// The pipeline's stages: the shared backend's.
    impl Gpu for Cuda {
        type Host = PinnedHostSlice<f32>;
        type Dev = CudaSlice<f32>;
        fn host(&self, data: &[f32]) -> Res<Self::Host> {
            self.base.host(data)
        }
        fn dev(&self, len: usize) -> Res<Self::Dev> {
            self.base.dev(len)
        }
        fn h2d(&self, s: &Stream, src: &Self::Host, dst: &mut Self::Dev) -> Res {
            self.base.h2d(s, src, dst)
        }
        fn kernel(&self, s: &Stream, x: &mut Self::Dev) -> Res {
            self.base.kernel(s, x)
        }
        fn d2h(&self, s: &Stream, src: &Self::Dev, dst: &mut Self::Host) -> Res {
            self.base.d2h(s, src, dst)
        }
        fn take(&self, h: &mut Self::Host) -> Res<Vec<f32>> {
            self.base.take(h)
        }
    }

    impl Bench for Cuda {
        type Counter = CudaSlice<u32>;
        fn label(&self) -> String {
            format!("CUDA device 0 ({})", self.base.name)
        }
        fn executor(&self) -> Executor {
            Executor::cuda(0, 2)
        }
        fn chunk_len(&self) -> usize {
            CUDA_LEN
        }
        fn counter(&self) -> Res<Self::Counter> {
            let alloc = &self.base.alloc;
            let x = alloc.alloc_zeros::<u32>(BUMP.block_dim.0 as usize)?;
            // The engine's (non-blocking) streams do not wait for this one.
            alloc.synchronize()?;
            Ok(x)
        }
        fn bump(&self, s: &Stream, x: &mut Self::Counter, _: u64) -> Res {
            self.launch_bump(cu(s)?, x)
        }
        fn count(&self, x: &Self::Counter) -> Res<u64> {
            let v = self.base.alloc.clone_dtoh(x)?;
            self.base.alloc.synchronize()?;
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
    }
}

// ---- The measurements ----

fn check_count(what: &str, got: u64, want: u64) -> Res {
    match got == want {
        true => Ok(()),
        false => Err(format!("{what}: the counter is {got} after {want} kernels").into()),
    }
}

fn engine_on<G: Bench>(g: &G) -> Res<(Engine, Device)> {
    backend::engine_on(g.executor())
}

/// Pushes kernels `range` of a chain on `x`, alternating compute streams.
fn push_chain<G: Bench>(
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
fn read_count<G: Bench>(e: &Engine, g: &Arc<G>, x: &Var<G::Counter>) -> Res<u64> {
    let (g, k) = (g.clone(), x.key());
    Ok(e.push(&[x], &[], move |ctx| g.count(&*ctx.read(k)?))?
        .wait()?)
}

/// Figure 1: (engine, floor), best of `runs`.
fn handoff<G: Bench>(g: &Arc<G>, n: u64, runs: usize) -> Res<(Duration, Duration)> {
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

/// Figure 2: (each stage alone, the pipeline), best of `runs`; checked.
fn overlap<G: Bench>(g: &Arc<G>, chunks: usize, runs: usize) -> Res<([Duration; 3], Duration)> {
    let p = Pipeline::new(g, g.executor(), chunks, g.chunk_len())?;
    p.pass(&[0, 1, 2])?; // warm-up
    let (mut alone, mut piped) = ([Duration::MAX; 3], Duration::MAX);
    for _ in 0..runs {
        for (s, best) in alone.iter_mut().enumerate() {
            *best = (*best).min(p.pass(&[s])?);
        }
        p.take()?;
        piped = piped.min(p.pass(&[0, 1, 2])?);
        for (c, (xs, ys)) in p.inputs.iter().zip(p.take()?).enumerate() {
            for (i, (&x, y)) in xs.iter().zip(ys).enumerate() {
                if wrong(x, y) {
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
fn threads<G: Bench>(g: &Arc<G>, n: u64) -> Res<([Option<usize>; 3], usize)> {
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
            Ok(ctx.stream()?.enqueue(move || {
                let t = Instant::now();
                while !gate.load(SeqCst) {
                    if t.elapsed() > Duration::from_secs(60) {
                        return Err("the gate never opened".into());
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                Ok(())
            })?)
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

fn bench<G: Bench>(g: G, n: u64, chunks: usize, runs: usize) -> Res {
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
    let why = match require::cuda_devices() {
        #[cfg(feature = "cuda")]
        Ok(_) => return bench(cuda::Cuda::new()?, n, chunks, runs),
        #[cfg(not(feature = "cuda"))]
        Ok(_) => "built without the `cuda` feature".to_string(),
        Err(why) => why,
    };
    require::fall_back("the gpu bench on CUDA", &why)?;
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
