//! The CUDA device (`--features cuda`): real kernels and copies on real
//! streams, written so that they fail if the engine's ordering is wrong:
//!
//! - cudarc's event tracking is off on the context the buffers come from,
//!   so nothing but the engine orders the kernels;
//! - each kernel is one thread, so a race is a wrong value, not a tie;
//! - the producer's lane is held by a blocking host function while the
//!   consumer is enqueued, so an unordered consumer runs first;
//! - results are copied back into pinned memory, which (unlike pageable
//!   memory) does not wait for the device on its own.
//!
//! `the_cross_lane_test_fails_without_the_cross_lane_wait` checks that the
//! first test fails with the engine's cross-lane wait stubbed out
//! (`DEPFLOW_DEBUG_NO_LANE_WAITS=1`, debug builds).
//!
//! Where there is no driver, no GPU or no NVRTC each test prints `SKIPPED`
//! and exactly what is missing (visibly: not captured by the test harness;
//! the driver's error by name and number, from
//! `depflow::stream::cuda_devices`) and passes, unless
//! `DEPFLOW_REQUIRE_GPU=1`, which makes a skip a failure (for a machine that
//! has a GPU: see `examples/gpu/require.rs`).
//! `no_such_device_is_a_config_error` runs everywhere (a missing driver is
//! an error, not a panic), and so do the checks of the messages: against a
//! fake driver library (a stub, a refused compat library, codes newer than
//! cudarc's enum) in child processes, and of NVRTC's options.
#![cfg(feature = "cuda")]

mod common;
#[path = "../examples/gpu/nvrtc.rs"]
mod nvrtc;
#[path = "../examples/gpu/require.rs"]
mod require;

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use common::streams::{failed, poisoned, run_in_child};
use common::{gate, within};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use depflow::{BoxError, Engine, Error, Executor, Lane, OpCtx, Var};

const KERNELS: &str = r#"
extern "C" __global__ void store(unsigned int* x, unsigned int v) { x[0] = v; }
extern "C" __global__ void consume(unsigned int* x) { x[1] = x[0] * 10u + 2u; }
extern "C" __global__ void trap_now() { __trap(); }
extern "C" __global__ void inc(unsigned int* x) { x[0] += 1u; }
extern "C" __global__ void bump(unsigned int* x, unsigned int expect) {
    // Counts, and records a broken order in x[1].
    if (x[0] != expect) { x[1] = 1u; }
    x[0] = expect + 1u;
}"#;

/// One thread: a race between two kernels is a wrong value.
const ONE: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};

struct Gpu {
    engine: Engine,
    gpu: depflow::Device,
    /// The test's own handle on device 0's primary context, with cudarc's
    /// event tracking off: it orders nothing the engine does not.
    ctx: Arc<CudaContext>,
    store: CudaFunction,
    consume: CudaFunction,
    bump: CudaFunction,
    trap: CudaFunction,
    inc: CudaFunction,
}

/// The engine and the kernels, or None (printed) where there is no GPU.
fn gpu(test: &str) -> Option<Gpu> {
    if let Err(why) = require::cuda_devices() {
        return skip(test, &why);
    }
    let ctx = CudaContext::new(0).unwrap();
    // SAFETY: the buffers of these tests are ordered by the engine only
    // (which is what they test), and freed after `wait_all`.
    unsafe { ctx.disable_event_tracking() };
    let cubin = match nvrtc::compile(KERNELS, &ctx) {
        Ok(cubin) => cubin,
        Err(why) => return skip(test, &why),
    };
    let module = ctx
        .load_module(cubin)
        .unwrap_or_else(|e| panic!("loading the kernels' CUBIN: {e}"));
    let engine = Engine::builder()
        .threads(2)
        .device("gpu", Executor::cuda(0, 2))
        .build()
        .unwrap();
    let gpu = engine.device("gpu").unwrap();
    Some(Gpu {
        engine,
        gpu,
        store: module.load_function("store").unwrap(),
        consume: module.load_function("consume").unwrap(),
        bump: module.load_function("bump").unwrap(),
        trap: module.load_function("trap_now").unwrap(),
        inc: module.load_function("inc").unwrap(),
        ctx,
    })
}

/// Runs `test` (named `name`) within `secs` seconds, on the GPU, or skips
/// it (see [`gpu`]).
fn on_gpu(name: &'static str, secs: u64, test: impl FnOnce(Gpu) + Send + 'static) {
    within(secs, move || {
        if let Some(g) = gpu(name) {
            test(g);
        }
    });
}

/// Reports a skipped test where the user sees it, or fails it if a GPU is
/// required (`require::skip`).
fn skip<T>(test: &str, why: &str) -> Option<T> {
    require::skip(test, why);
    None
}

/// Why the child process's test skipped (its `SKIPPED` line), if it did.
fn child_skipped(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("SKIPPED "))
        .map(|l| l.split_once(": ").map_or(l, |(_, why)| why))
}

impl Gpu {
    /// A variable holding `n` zeroed u32 on the device (allocated on the
    /// test's context, finished before the engine's streams use it).
    fn zeros(&self, n: usize) -> Var<CudaSlice<u32>> {
        let alloc = self.ctx.default_stream();
        let x = alloc.alloc_zeros::<u32>(n).unwrap();
        alloc.synchronize().unwrap();
        self.engine.var(x)
    }

    /// `x` copied back on the device-to-host lane into pinned memory, then
    /// read by a host op (which waits for the copy's fence).
    fn read_back(&self, x: &Var<CudaSlice<u32>>, n: usize) -> Vec<u32> {
        // Not write-combined: the host reads it.
        // SAFETY: written at once, below.
        let mut pinned = unsafe { self.ctx.alloc_pinned_with_flags::<u32>(n, 0) }.unwrap();
        pinned.as_mut_slice().unwrap().fill(u32::MAX);
        let host: Var<PinnedHostSlice<u32>> = self.engine.var(pinned);
        let (xk, hk) = (x.key(), host.key());
        self.engine
            .op()
            .on(self.gpu)
            .lane(Lane::DeviceToHost)
            .reads(&[x])
            .mutates(&[&host])
            .run(move |ctx| {
                let stream = ctx.stream()?.cuda().expect("a CUDA stream").clone();
                stream.memcpy_dtoh(&*ctx.read(xk)?, &mut *ctx.write(hk)?)?;
                Ok(())
            })
            .unwrap();
        let got = self
            .engine
            .push(&[&host], &[], move |ctx| {
                Ok(ctx.read(hk)?.as_slice()?.to_vec())
            })
            .unwrap();
        got.wait().unwrap()
    }
}

/// Launches `kernel` (one thread) on the op's CUDA stream with the
/// arguments `x` and, where given, `v`.
///
/// # Safety
///
/// `kernel` takes `(unsigned int* x)`, or `(unsigned int* x, unsigned int
/// v)` where `v` is given, and touches no element past `x`'s.
unsafe fn launch_on(
    ctx: &OpCtx,
    kernel: &CudaFunction,
    x: &mut CudaSlice<u32>,
    v: Option<u32>,
) -> Result<(), BoxError> {
    let stream = ctx.stream()?.cuda().expect("a CUDA stream").clone();
    let mut launch = stream.launch_builder(kernel);
    launch.arg(x);
    if let Some(v) = &v {
        launch.arg(v);
    }
    // SAFETY: the arguments match `kernel`, as the caller promises.
    unsafe { launch.launch(ONE) }?;
    Ok(())
}

#[test]
fn no_such_device_is_a_config_error() {
    let built = Engine::builder()
        .device("gpu", Executor::cuda(64, 1))
        .build();
    assert!(matches!(built, Err(Error::Config(_))), "{built:?}");
}

const CROSS_LANE: &str = "a_consumer_on_another_lane_waits_for_its_producer_on_the_device";

#[test]
fn a_consumer_on_another_lane_waits_for_its_producer_on_the_device() {
    on_gpu(CROSS_LANE, 120, |g| {
        let x = g.zeros(2);
        let (open, shut) = gate();
        // The producer: its lane first blocks on the gate, then x[0] = 1.
        let (store, xk) = (g.store.clone(), x.key());
        let producer = g
            .engine
            .op()
            .on(g.gpu)
            .lane(Lane::Compute(0))
            .mutates(&[&x])
            .run(move |ctx| {
                let s = ctx.stream()?;
                s.enqueue(move || {
                    shut.pass();
                    Ok(())
                })?;
                let mut x = ctx.write(xk)?;
                // SAFETY: `store` takes (x, v); x has 2 elements.
                unsafe { launch_on(ctx, &store, &mut x, Some(1)) }
            })
            .unwrap();
        // The consumer, on another lane: x[1] = x[0] * 10 + 2, which is 12
        // only if it runs after the producer.
        let (enqueued_tx, enqueued) = mpsc::channel();
        let consume = g.consume.clone();
        let consumer = g
            .engine
            .op()
            .on(g.gpu)
            .lane(Lane::Compute(1))
            .mutates(&[&x])
            .run(move |ctx| {
                let mut x = ctx.write(xk)?;
                // SAFETY: `consume` takes (x); x has 2 elements.
                unsafe { launch_on(ctx, &consume, &mut x, None) }?;
                enqueued_tx.send(()).unwrap();
                Ok::<_, BoxError>(())
            })
            .unwrap();
        enqueued.recv_timeout(Duration::from_secs(60)).unwrap();
        // Time for a consumer that is not ordered behind the producer to run
        // (only a broken order depends on this delay).
        std::thread::sleep(Duration::from_millis(200));
        open.send(()).unwrap();
        producer.wait().unwrap();
        consumer.wait().unwrap();
        assert_eq!(g.read_back(&x, 2), vec![1, 12], "the consumer ran first");
        g.engine.wait_all().wait().unwrap();
        // Freed here, on the thread whose context is current.
        drop(x);
    });
}

#[test]
fn kernels_alternating_lanes_and_a_copy_back_keep_program_order() {
    let name = "kernels_alternating_lanes_and_a_copy_back_keep_program_order";
    on_gpu(name, 120, |g| {
        let counter = g.zeros(2);
        const N: u32 = 1000;
        for i in 0..N {
            let (f, c) = (g.bump.clone(), counter.key());
            g.engine
                .op()
                .on(g.gpu)
                .lane(Lane::Compute((i % 2) as u8))
                .mutates(&[&counter])
                .run(move |ctx| {
                    let mut x = ctx.write(c)?;
                    // SAFETY: `bump` takes (x, expect); x has 2 elements.
                    unsafe { launch_on(ctx, &f, &mut x, Some(i)) }
                })
                .unwrap();
        }
        assert_eq!(
            g.read_back(&counter, 2),
            vec![N, 0],
            "count, and no broken order"
        );
        g.engine.wait_all().wait().unwrap();
        drop(counter);
    });
}

#[test]
fn a_host_function_error_fails_the_op_and_poisons() {
    on_gpu("a_host_function_error_fails_the_op_and_poisons", 60, |g| {
        let v = g.engine.new_var();
        let failing = g
            .engine
            .op()
            .name("host fn")
            .on(g.gpu)
            .mutates(&[&v])
            .run(|ctx| Ok(ctx.stream()?.enqueue(|| Err("bad".to_string()))?))
            .unwrap();
        assert!(matches!(failing.wait(), Err(Error::Failed(_))));
        let cause = poisoned(g.engine.wait_for_var(&v).wait());
        assert_eq!(cause.op_name(), Some("host fn"));
        let _ = g.engine.wait_all().wait();
    });
}

/// The cross-lane test above fails when the engine's cross-lane wait is
/// stubbed out: it can detect a missing `cuStreamWaitEvent`. Runs it in a
/// child process of this test binary.
#[cfg(debug_assertions)]
#[test]
fn the_cross_lane_test_fails_without_the_cross_lane_wait() {
    let (passed, text) = run_in_child(CROSS_LANE, &[], &[("DEPFLOW_DEBUG_NO_LANE_WAITS", "1")]);
    assert!(!text.contains("DEPFLOW_REQUIRE_GPU=1, but"), "{text}");
    if let (true, Some(why)) = (passed, child_skipped(&text)) {
        // The child printed why; say it here too.
        let _ = skip::<()>("the_cross_lane_test_fails_without_the_cross_lane_wait", why);
        return;
    }
    assert!(!passed, "passed without the wait:\n{text}");
    assert!(
        text.contains("the consumer ran first"),
        "failed for another reason:\n{text}"
    );
}

const TRAP: &str = "a_trapping_kernel_kills_the_device";

/// A kernel that traps leaves a sticky error: the device is dead, later ops
/// fail at once with the original error (their bodies not run), and
/// dropping the engine does not hang. Ignored: it kills the device's
/// primary context for the whole process, so
/// `a_trapping_kernel_kills_the_device_in_a_child_process` runs it alone.
#[test]
#[ignore]
fn a_trapping_kernel_kills_the_device() {
    on_gpu(TRAP, 60, |g| {
        let v = g.engine.new_var();
        let trap = g.trap.clone();
        let trapped = g
            .engine
            .op()
            .name("trap")
            .on(g.gpu)
            .mutates(&[&v])
            .run(move |ctx| {
                let stream = ctx.stream()?.cuda().expect("a CUDA stream").clone();
                let mut launch = stream.launch_builder(&trap);
                // SAFETY: `trap_now` takes no argument.
                unsafe { launch.launch(ONE) }?;
                Ok::<_, BoxError>(())
            })
            .unwrap();
        let original = failed(trapped.wait()).to_string();
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = g.engine.new_var();
        let later = g
            .engine
            .op()
            .on(g.gpu)
            .mutates(&[&w])
            .run({
                let ran = ran.clone();
                move |_| {
                    ran.store(true, std::sync::atomic::Ordering::SeqCst);
                    Ok(())
                }
            })
            .unwrap();
        eprintln!("trap: {original}; later: {}", failed(later.wait()));
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
        drop((v, w));
        drop(g.engine);
    });
}

#[test]
fn a_trapping_kernel_kills_the_device_in_a_child_process() {
    let (passed, text) = run_in_child(TRAP, &["--ignored", "--nocapture"], &[]);
    assert!(passed, "{text}");
    if let Some(why) = child_skipped(&text) {
        let _ = skip::<()>("a_trapping_kernel_kills_the_device_in_a_child_process", why);
    }
}

/// A captured graph (`Recorder::capture`) on a GPU: its bodies run once,
/// at the first replay, under stream capture; every replay launches the
/// CUDA graph once: kernels (two ops declared on two lanes, captured onto
/// one stream in recorded order) and a repeatable host function.
#[test]
fn a_captured_graph_runs_its_bodies_once_and_launches_per_replay() {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    let name = "a_captured_graph_runs_its_bodies_once_and_launches_per_replay";
    on_gpu(name, 120, |g| {
        let x = g.zeros(2);
        let (bodies, host_fns) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let graph = g
            .engine
            .record(|rec| {
                rec.capture();
                let (inc, consume, xk) = (g.inc.clone(), g.consume.clone(), x.key());
                let (b, h) = (bodies.clone(), host_fns.clone());
                rec.op()
                    .on(g.gpu)
                    .lane(Lane::Compute(0))
                    .mutates(&[&x])
                    .run(move |ctx| {
                        b.fetch_add(1, SeqCst);
                        let s = ctx.stream()?;
                        assert!(s.is_capturing());
                        let mut x = ctx.write(xk)?;
                        // SAFETY: `inc` takes (x); x has 2 elements.
                        unsafe { launch_on(ctx, &inc, &mut x, None) }?;
                        let h = h.clone();
                        s.enqueue_repeatable(move || {
                            h.fetch_add(1, SeqCst);
                            Ok(())
                        })?;
                        Ok::<_, BoxError>(())
                    })?;
                let b = bodies.clone();
                rec.op()
                    .on(g.gpu)
                    .lane(Lane::Compute(1))
                    .mutates(&[&x])
                    .run(move |ctx| {
                        b.fetch_add(1, SeqCst);
                        let mut x = ctx.write(xk)?;
                        // SAFETY: `consume` takes (x); x has 2 elements.
                        unsafe { launch_on(ctx, &consume, &mut x, None) }
                    })
            })
            .unwrap();
        const N: u32 = 20;
        for _ in 0..N {
            graph.replay();
        }
        // x[1] = x[0] * 10 + 2 after the last increment: program order.
        assert_eq!(g.read_back(&x, 2), vec![N, N * 10 + 2]);
        g.engine.wait_all().wait().unwrap();
        assert_eq!(bodies.load(SeqCst), 2, "each body ran once");
        assert_eq!(
            host_fns.load(SeqCst),
            N,
            "the host node ran at every launch"
        );
        assert_eq!(graph.captures(), 1);
        assert!(graph.is_captured());
        drop(graph);
        drop(x);
    });
}

/// A `CudaSlice` allocated on an engine lane whose last holder is a host op:
/// dropped on the host worker (no context current there) its free would
/// fail, and cudarc would park the error on the engine's context for the
/// next call through it, failing the device's next body. The engine drops
/// it on the device's poller instead, so the next body allocates cleanly.
#[test]
fn a_slice_last_held_by_a_host_op_is_freed_without_failing_the_next_body() {
    let name = "a_slice_last_held_by_a_host_op_is_freed_without_failing_the_next_body";
    on_gpu(name, 60, |g| {
        let x: Var<Option<CudaSlice<u32>>> = g.engine.var(None);
        let k = x.key();
        // Allocated through the engine's stream: the slice frees on it,
        // with the engine's context (and parks its errors there).
        g.engine
            .op()
            .on(g.gpu)
            .mutates(&[&x])
            .run(move |ctx| {
                let stream = ctx.stream()?.cuda().expect("a CUDA stream").clone();
                *ctx.write(k)? = Some(stream.alloc_zeros::<u32>(1 << 10)?);
                Ok(())
            })
            .unwrap()
            .wait()
            .unwrap();
        // A host op holds it while the last handle goes: it is the last
        // holder, retiring on a pool worker.
        let (open, shut) = gate();
        let len = g
            .engine
            .push(&[&x], &[], move |ctx| {
                shut.pass();
                Ok(ctx.read(k)?.as_ref().map_or(0, |s| s.len()))
            })
            .unwrap();
        drop(x);
        open.send(()).unwrap();
        assert_eq!(len.wait().unwrap(), 1 << 10);
        // The next body's first cudarc call takes any parked error.
        let next = g.engine.var(());
        let got = g
            .engine
            .op()
            .on(g.gpu)
            .mutates(&[&next])
            .run(|ctx| {
                let stream = ctx.stream()?.cuda().expect("a CUDA stream").clone();
                let y = stream.alloc_zeros::<u32>(4)?;
                ctx.stream()?.drop_after(y);
                Ok(())
            })
            .unwrap()
            .wait();
        assert!(got.is_ok(), "the next body failed: {got:?}");
        g.engine.wait_all().wait().unwrap();
    });
}

/// A recorded graph's device buffers on a CUDA device: one arena taken
/// with `cuMemAllocAsync` by the first replay, two buffers sharing it
/// (the second is written only after the first was copied back), kernels
/// on two lanes and copies on the device-to-host lane reaching them
/// through `DeviceSlice::device_ptr`; right over several replays, and the
/// arena given back (`cuMemFreeAsync`) once when the graph goes.
#[test]
fn a_graph_s_device_buffers_share_one_arena_of_device_memory() {
    let name = "a_graph_s_device_buffers_share_one_arena_of_device_memory";
    on_gpu(name, 120, |g| {
        let pinned = |n: usize| {
            // SAFETY: written at once, below.
            let mut p = unsafe { g.ctx.alloc_pinned_with_flags::<u32>(n, 0) }.unwrap();
            p.as_mut_slice().unwrap().fill(u32::MAX);
            g.engine.var(p)
        };
        let (first, second) = (pinned(2), pinned(2));
        let round = g.engine.var(0u32);
        let gpu = g.gpu;
        /// Launches `f` with the device pointer `ptr` (and `v`, if any).
        fn launch(
            ctx: &depflow::OpCtx,
            f: &CudaFunction,
            ptr: u64,
            v: Option<u32>,
        ) -> Result<(), BoxError> {
            let stream = ctx.stream()?.cuda().expect("a CUDA stream").clone();
            let mut launch = stream.launch_builder(f);
            launch.arg(&ptr);
            if let Some(v) = &v {
                launch.arg(v);
            }
            // SAFETY: the arguments match the kernel; the buffer holds 2 u32.
            unsafe { launch.launch(ONE) }?;
            Ok(())
        }
        /// Copies 2 u32 from `ptr` into the pinned host variable `host`.
        fn copy_back(
            ctx: &depflow::OpCtx,
            ptr: u64,
            host: depflow::VarKey<PinnedHostSlice<u32>>,
        ) -> Result<(), BoxError> {
            let stream = ctx.stream()?.cuda().expect("a CUDA stream").clone();
            let mut host = ctx.write(host)?;
            // SAFETY: `ptr` holds 2 u32 (the op's buffer); the host memory
            // is pinned and read only by ops after this op's fence.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    host.as_mut_slice()?,
                    ptr,
                    stream.cu_stream(),
                )
            }?;
            Ok(())
        }
        let mut kept = None;
        let graph = g
            .engine
            .record(|rec| {
                let a = rec.device_buffer::<u32>(gpu, 2)?;
                let b = rec.device_buffer::<u32>(gpu, 2)?;
                let (store, consume) = (g.store.clone(), g.consume.clone());
                rec.op()
                    .on(gpu)
                    .lane(Lane::Compute(0))
                    .reads(&[&round])
                    .mutates(&[&a])
                    .run({
                        let (a, r, store) = (a.clone(), round.key(), store.clone());
                        move |ctx| {
                            let ptr = ctx.device_buffer_mut(&a)?.device_ptr().unwrap();
                            launch(ctx, &store, ptr, Some(*ctx.read(r)?))
                        }
                    })?;
                rec.op()
                    .on(gpu)
                    .lane(Lane::Compute(1))
                    .mutates(&[&a])
                    .run({
                        let a = a.clone();
                        move |ctx| {
                            let ptr = ctx.device_buffer_mut(&a)?.device_ptr().unwrap();
                            launch(ctx, &consume, ptr, None)
                        }
                    })?;
                rec.op()
                    .on(gpu)
                    .lane(Lane::DeviceToHost)
                    .reads(&[&a])
                    .mutates(&[&first])
                    .run({
                        let (a, h) = (a.clone(), first.key());
                        move |ctx| copy_back(ctx, ctx.device_buffer(&a)?.device_ptr().unwrap(), h)
                    })?;
                // After the copy (it reads `first`): `b` may take `a`'s bytes.
                rec.op()
                    .on(gpu)
                    .lane(Lane::Compute(1))
                    .reads(&[&round, &first])
                    .mutates(&[&b])
                    .run({
                        let (b, r) = (b.clone(), round.key());
                        move |ctx| {
                            let ptr = ctx.device_buffer_mut(&b)?.device_ptr().unwrap();
                            launch(ctx, &store, ptr, Some(*ctx.read(r)? + 100))
                        }
                    })?;
                rec.op()
                    .on(gpu)
                    .lane(Lane::DeviceToHost)
                    .reads(&[&b])
                    .mutates(&[&second])
                    .run({
                        let (b, h) = (b.clone(), second.key());
                        move |ctx| copy_back(ctx, ctx.device_buffer(&b)?.device_ptr().unwrap(), h)
                    })?;
                kept = Some(b);
                Ok::<(), depflow::Error>(())
            })
            .unwrap();
        let kept = kept.unwrap();
        let plan = graph.device_plan(gpu).unwrap();
        assert_eq!((plan.arena_bytes, plan.total_bytes), (8, 16), "{plan:?}");
        let read = |h: &Var<PinnedHostSlice<u32>>| {
            let k = h.key();
            g.engine
                .push(&[h], &[], move |ctx| Ok(ctx.read(k)?.as_slice()?.to_vec()))
                .unwrap()
                .wait()
                .unwrap()
        };
        for r in 1..=3u32 {
            g.engine
                .push(&[], &[&round], {
                    let k = round.key();
                    move |ctx| {
                        *ctx.write(k)? = r;
                        Ok(())
                    }
                })
                .unwrap();
            graph.replay().wait().unwrap();
            assert_eq!(read(&first), vec![r, r * 10 + 2], "round {r}");
            assert_eq!(read(&second)[0], r + 100, "round {r}");
        }
        assert_eq!(kept.arena_events(), (1, 0));
        drop(graph);
        g.engine.wait_all().wait().unwrap();
        assert_eq!(kept.arena_events(), (1, 1));
        drop((first, second));
    });
}

// ---- The messages, checked anywhere (no GPU needed) ----

#[test]
fn nvrtc_compiles_for_the_device_s_own_architecture() {
    assert_eq!(nvrtc::arch_option(9, 0), "--gpu-architecture=sm_90");
    assert_eq!(nvrtc::arch_option(8, 6), "--gpu-architecture=sm_86");
    assert_eq!(nvrtc::arch_option(12, 0), "--gpu-architecture=sm_120");
    assert_eq!(nvrtc::arch_option(10, 3), "--gpu-architecture=sm_103");
}

#[test]
fn a_missing_nvrtc_names_every_library_tried() {
    let m = nvrtc::missing();
    for name in ["libnvrtc.so", "libnvrtc.so.12", "libnvrtc.so.13"] {
        assert!(
            m.contains(&format!("{name},")) || m.contains(&format!("{name} ")),
            "{name}: {m}"
        );
    }
    assert!(m.contains("LD_LIBRARY_PATH"), "{m}");
    if nvrtc::available().is_err() {
        // Here: compiling says the same, not a panic.
        assert_eq!(nvrtc::compile_for("", 9, 0).unwrap_err(), m);
    }
}

#[test]
fn a_skip_and_its_refusal_say_why() {
    assert_eq!(require::skipped("t", "no GPU"), "SKIPPED t: no GPU");
    assert_eq!(
        require::refusal("t", "no GPU"),
        "DEPFLOW_REQUIRE_GPU=1, but t cannot run: no GPU"
    );
    assert_eq!(child_skipped("x\nSKIPPED t: a: b\n"), Some("a: b"));
    assert_eq!(child_skipped("running 1 test\n"), None);
}

/// A driver library of our own, `libcuda.so` in a fresh directory: its
/// `cuInit` and `cuDeviceGetCount` return `DEPFLOW_FAKE_CUDA_RESULT` (34 if
/// unset) and count no device; `cuGetErrorName` and `cuGetErrorString`
/// answer 34 under 34 (as a stub does) and 1 otherwise (as a driver that
/// does not know the code). Built with `cc`, which links Rust programs here.
fn fake_driver() -> std::path::PathBuf {
    const SOURCE: &str = r#"
#include <stdlib.h>
static int code(void) {
    const char* s = getenv("DEPFLOW_FAKE_CUDA_RESULT");
    return s ? atoi(s) : 34;
}
int cuInit(unsigned int flags) { (void)flags; return code(); }
int cuDeviceGetCount(int* n) { *n = 0; return code(); }
int cuGetErrorName(int e, const char** s) { (void)e; (void)s; return code() == 34 ? 34 : 1; }
int cuGetErrorString(int e, const char** s) { (void)e; (void)s; return code() == 34 ? 34 : 1; }
"#;
    use std::sync::OnceLock;
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // In the target directory's scratch space (cargo's), one per run.
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("fake-cuda-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("fake.c");
        std::fs::write(&src, SOURCE).unwrap();
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(dir.join("libcuda.so"))
            .arg(&src)
            .status()
            .expect("a C compiler (cc), which links Rust programs here");
        assert!(built.success(), "cc could not build the fake libcuda.so");
        dir
    })
    .clone()
}

/// `CROSS_LANE` run in a child process against the fake driver answering
/// `code`, a GPU required or not: whether it passed, and what it printed.
fn against_fake_driver(code: &str, require: &str) -> (bool, String) {
    let dir = fake_driver();
    run_in_child(
        CROSS_LANE,
        &["--nocapture"],
        &[
            ("LD_LIBRARY_PATH", dir.to_str().unwrap()),
            ("DEPFLOW_FAKE_CUDA_RESULT", code),
            ("DEPFLOW_REQUIRE_GPU", require),
        ],
    )
}

#[cfg(target_os = "linux")]
#[test]
fn a_stub_driver_library_is_named_in_the_skip() {
    let lib = fake_driver().join("libcuda.so");
    let (passed, text) = against_fake_driver("34", "0");
    assert!(passed, "{text}");
    let want = format!(
        "SKIPPED {CROSS_LANE}: stream device: the CUDA driver ({}) failed to start (cuInit): \
         CUDA_ERROR_STUB_LIBRARY (34); the library opened is a stub",
        lib.display()
    );
    assert!(text.contains(&want), "{want}\nnot in:\n{text}");
    // Required: the same reason, and a failure.
    let (passed, text) = against_fake_driver("34", "1");
    assert!(!passed, "{text}");
    assert!(
        text.contains(&format!(
            "DEPFLOW_REQUIRE_GPU=1, but {CROSS_LANE} cannot run: "
        )) && text.contains("CUDA_ERROR_STUB_LIBRARY (34)"),
        "{text}"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn driver_codes_are_named_by_number_even_where_cudarc_s_enum_lacks_them() {
    for (code, want) in [
        (
            "803",
            "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803); the libcuda opened does not match",
        ),
        // CUDA 13.0's, not in the CUDA 12.6 enum cudarc is built with.
        ("226", "(cuInit): CUDA_ERROR_CONTAINED (226)"),
        (
            "4321",
            "(cuInit): an error code unknown to this build (newer than CUDA 13.4?) (4321)",
        ),
        ("0", "reports no device (cuDeviceGetCount: 0)"),
    ] {
        let (passed, text) = against_fake_driver(code, "0");
        assert!(
            passed && text.contains(want),
            "{code}: {want}\nnot in:\n{text}"
        );
    }
}
