//! `Backend::Nccl` (the `cuda` feature): the refusals, which run anywhere
//! (CPU devices, simulated GPUs, no `cuda` feature, no NCCL library), and
//! the sums on real GPUs, which skip where there is no CUDA device.
//!
//! A GPU test prints `SKIPPED` and what is missing (visibly: not captured
//! by the test harness; the driver's error by name and number, or the
//! backend's own words on the NCCL library) and passes, unless
//! `DEPFLOW_REQUIRE_GPU=1`, which makes a skip a failure (for a machine
//! that has GPUs and NCCL: see `examples/gpu/require.rs`).
//!
//! On one GPU a sum over one rank equals its input, so the values cannot
//! show a reduction that never ran. There each sum test runs its one-GPU
//! case again in a child process with NCCL's own log of its collective
//! calls on (`NCCL_DEBUG=INFO`, `NCCL_DEBUG_SUBSYS=COLL`) and checks that
//! NCCL logged the `AllReduce` calls; and it prints `UNVERIFIED <test>: ...`
//! (stderr, as `SKIPPED`): the reduction itself is not checked there.

mod common;
#[cfg(feature = "cuda")]
#[path = "../examples/gpu/require.rs"]
mod require;

use common::parallel::sgd;
use depflow::parallel::{AllReduce, Backend, Group};
use depflow::{Device, Engine, Error, Executor};

/// An engine with `n` devices of `exec`'s kind, named `d0`, `d1`, ...
fn engine(n: usize, exec: impl Fn(usize) -> Executor) -> (Engine, Vec<Device>) {
    let mut b = Engine::builder().threads(2);
    for d in 0..n {
        b = b.device(format!("d{d}"), exec(d));
    }
    let engine = b.build().unwrap();
    let devices = (0..n)
        .map(|d| engine.device(&format!("d{d}")).unwrap())
        .collect();
    (engine, devices)
}

/// Host devices (one worker each), but for device `gpu`, a simulated GPU.
fn one_simulated_gpu(gpu: usize) -> impl Fn(usize) -> Executor {
    move |d| {
        if d == gpu {
            Executor::simulated_gpu(1)
        } else {
            Executor::pool(1)
        }
    }
}

/// `Backend::Nccl` over `devices`: the error, and that the segments were
/// left alone (nothing was pushed that touched them).
fn refusal(engine: &Engine, devices: &[Device]) -> String {
    let grads: Vec<_> = (0..devices.len())
        .map(|d| engine.var(vec![d as f32 + 1.0; 4]))
        .collect();
    let segments = grads.iter().map(|g| vec![g.clone()]).collect();
    let got = AllReduce::new(engine, devices, segments, &[4], Backend::Nccl);
    let Err(Error::Parallel(m)) = got else {
        panic!("Backend::Nccl over these devices: {got:?}");
    };
    engine.wait_all().wait().unwrap();
    for (d, g) in grads.iter().enumerate() {
        assert_eq!(engine.get(g).wait().unwrap(), [d as f32 + 1.0; 4]);
    }
    m
}

/// `m` says why: `with_cuda` with the `cuda` feature; without it, that the
/// feature is off.
fn assert_says(m: &str, with_cuda: &str) {
    let want = if cfg!(feature = "cuda") {
        with_cuda
    } else {
        "the `cuda` feature"
    };
    assert!(m.contains(want), "{m}");
}

#[test]
fn nccl_over_cpu_devices_is_refused() {
    let (engine, devices) = engine(2, |_| Executor::pool(1));
    let m = refusal(&engine, &devices);
    assert!(m.contains("Backend::Nccl"), "{m}");
    assert_says(&m, "device 0 (`d0`) runs on the host");
}

#[test]
fn nccl_over_simulated_gpus_is_refused() {
    // The host device first, then a simulated GPU: the message names the
    // first device that cannot take part.
    let (engine, devices) = engine(2, one_simulated_gpu(0));
    let m = refusal(&engine, &devices);
    assert_says(&m, "device 0 (`d0`) is a simulated GPU");
}

#[test]
fn nccl_over_one_host_device_is_refused_too() {
    // One device sums nothing, but the backend asked for is checked all the
    // same (a program that works on one device works on several).
    let (engine, devices) = engine(1, |_| Executor::pool(1));
    let m = refusal(&engine, &devices);
    assert!(m.contains("Backend::Nccl"), "{m}");
}

#[test]
fn a_group_with_nccl_on_cpu_devices_fails_its_first_step() {
    let (engine, devices) = engine(2, |_| Executor::pool(1));
    let mut group = Group::builder(&engine)
        .devices(devices)
        .input(1)
        .backend(Backend::Nccl)
        .optimizer(sgd)
        .build()
        .unwrap();
    let w = group.param(&[1.0]).unwrap();
    group.load(vec![vec![1.0, 2.0]]).unwrap();
    let mut called = 0;
    let got = group.step(|s| {
        called += 1;
        s.grad_ready(w)
    });
    let Err(Error::Parallel(m)) = got else {
        panic!("a step of a group with Backend::Nccl on CPU devices: {got:?}");
    };
    assert!(m.contains("Backend::Nccl"), "{m}");
    assert_eq!(called, 0, "refused before the step's ops");
    assert_eq!(group.weights(w, 0).unwrap(), [1.0]);
    assert_eq!(group.weights(w, 1).unwrap(), [1.0]);
}

#[test]
fn auto_picks_the_ring_off_cuda() {
    let (engine, devices) = engine(3, one_simulated_gpu(1));
    assert_eq!(Backend::auto(&engine, &devices), Backend::Ring);
    assert_eq!(Backend::auto(&engine, &devices[1..2]), Backend::Ring);
    assert_eq!(Backend::auto(&engine, &[]), Backend::Ring);
}

/// Reports a skipped test where the user sees it, or fails it if GPUs are
/// required (`require::skip`).
#[cfg(feature = "cuda")]
fn skip(test: &str, why: &str) {
    require::skip(test, why);
}

/// How many CUDA devices there are (0, printed, where none).
#[cfg(feature = "cuda")]
fn cuda_gpus(test: &str) -> usize {
    match require::cuda_devices() {
        Ok(n) => n,
        Err(why) => {
            skip(test, &why);
            0
        }
    }
}

/// How many CUDA devices NCCL can run on here (0, printed, where none).
#[cfg(feature = "cuda")]
fn gpus(test: &str) -> usize {
    let n = cuda_gpus(test);
    if n == 0 {
        return 0;
    }
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        // The backend's own words: which names were tried, what works.
        let (engine, devices) = engine(1, |d| Executor::cuda(d, 1));
        let grads = vec![vec![engine.var(vec![0.0f32])]];
        let why = match AllReduce::new(&engine, &devices, grads, &[1], Backend::Nccl) {
            Err(e) => e.to_string(),
            Ok(_) => "no NCCL library, yet Backend::Nccl was built".to_string(),
        };
        skip(test, &format!("{n} CUDA device(s), but {why}"));
        return 0;
    }
    n
}

/// Where one GPU is all there is: runs this binary's ignored test `child`
/// (the one-GPU case of `test`) with NCCL's log of its collective calls on,
/// checks that NCCL logged `calls` `AllReduce` calls at least, and says
/// (visibly) that the reduction itself is unverified.
#[cfg(feature = "cuda")]
fn nccl_was_called(test: &str, child: &str, calls: usize) {
    use std::io::Write;
    let (passed, text) = common::streams::run_in_child(
        child,
        &["--ignored", "--nocapture"],
        &[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "COLL")],
    );
    assert!(passed, "{child} failed:\n{text}");
    let logged = text
        .lines()
        .filter(|l| l.contains("NCCL INFO AllReduce"))
        .count();
    assert!(
        logged >= calls,
        "on one GPU, NCCL logged {logged} AllReduce calls, not {calls} at least \
         (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=COLL):\n{text}"
    );
    let _ = writeln!(
        std::io::stderr(),
        "UNVERIFIED {test}: on one GPU a sum equals its input, so the reduction itself is \
         not checked; NCCL logged {logged} AllReduce calls (NCCL_DEBUG_SUBSYS=COLL)"
    );
}

#[cfg(feature = "cuda")]
const SUMS: &str = "nccl_sums_over_one_to_every_gpu";

#[cfg(feature = "cuda")]
#[test]
fn nccl_sums_over_one_to_every_gpu() {
    let count = gpus(SUMS);
    for n in 1..=count {
        sums(n);
    }
    if count == 1 {
        // Two pushes, one NCCL call each at least.
        nccl_was_called(SUMS, "sums_on_one_gpu", 2);
    }
}

/// `nccl_sums_over_one_to_every_gpu`'s one-GPU case, alone (with NCCL's log
/// on).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "run by nccl_sums_over_one_to_every_gpu in a child process, on one GPU"]
fn sums_on_one_gpu() {
    sums(1);
}

/// Two segments summed over `n` GPUs, twice, checked on every device.
#[cfg(feature = "cuda")]
fn sums(n: usize) {
    {
        let (engine, devices) = engine(n, |d| Executor::cuda(d, 1));
        // Two segments per device (3 and 5 floats): small integers, so any
        // order of the sum gives the same bits.
        let lens = [3usize, 5];
        let value = |d: usize, s: usize, i: usize| ((d + 1) * 10 + s * 5 + i) as f32;
        let grads: Vec<Vec<_>> = (0..n)
            .map(|d| {
                lens.iter()
                    .enumerate()
                    .map(|(s, &len)| engine.var((0..len).map(|i| value(d, s, i)).collect()))
                    .collect()
            })
            .collect();
        let sum = AllReduce::new(&engine, &devices, grads.clone(), &lens, Backend::Nccl).unwrap();
        // Twice: the second sums the first's sums (the staging is reused).
        for round in 1..=2 {
            sum.push(&engine, 0).unwrap();
            for (d, segments) in grads.iter().enumerate() {
                for (s, g) in segments.iter().enumerate() {
                    let want: Vec<f32> = (0..lens[s])
                        .map(|i| {
                            let once: f32 = (0..n).map(|d| value(d, s, i)).sum();
                            once * (n as f32).powi(round - 1)
                        })
                        .collect();
                    let got = engine.get(g).wait().unwrap();
                    assert_eq!(
                        got, want,
                        "{n} GPU(s), round {round}, device {d}, segment {s}"
                    );
                }
            }
        }
        if n > 1 {
            assert_eq!(Backend::auto(&engine, &devices), Backend::Nccl);
        }
    }
}

#[cfg(feature = "cuda")]
#[test]
fn two_devices_on_one_gpu_are_refused() {
    // Refused before NCCL is looked for: a GPU is all it needs.
    if cuda_gpus("two_devices_on_one_gpu_are_refused") == 0 {
        return;
    }
    let (engine, devices) = engine(2, |_| Executor::cuda(0, 1));
    let m = refusal(&engine, &devices);
    assert!(m.contains("devices 0 and 1 are both CUDA device 0"), "{m}");
}

#[cfg(feature = "cuda")]
#[test]
fn a_group_steps_with_nccl_on_every_gpu() {
    let n = gpus(GROUP);
    if n == 0 {
        return;
    }
    group_step(n);
    if n == 1 {
        // One bucket (one NCCL call) per parameter, two parameters.
        nccl_was_called(GROUP, "a_group_step_on_one_gpu", 2);
    }
}

#[cfg(feature = "cuda")]
const GROUP: &str = "a_group_steps_with_nccl_on_every_gpu";

/// `a_group_steps_with_nccl_on_every_gpu`'s one-GPU case, alone (with
/// NCCL's log on).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "run by a_group_steps_with_nccl_on_every_gpu in a child process, on one GPU"]
fn a_group_step_on_one_gpu() {
    group_step(1);
}

/// One step of a group on `n` GPUs, its weights checked on every device.
#[cfg(feature = "cuda")]
fn group_step(n: usize) {
    let (engine, devices) = engine(n, |d| Executor::cuda(d, 1));
    let mut group = Group::builder(&engine)
        .devices(devices)
        .input(2)
        .backend(Backend::Nccl)
        .bucket_bytes(0) // one bucket (one NCCL op) per parameter
        .optimizer(|w, g| w.iter_mut().zip(g).for_each(|(w, g)| *w -= 0.5 * g))
        .build()
        .unwrap();
    let (a, b) = (
        group.param(&[1.0, 1.0]).unwrap(),
        group.param(&[2.0]).unwrap(),
    );
    // One row of two per device: device d's row is [d, 2d + 1].
    let batch: Vec<f32> = (0..n)
        .flat_map(|d| [d as f32, 2.0 * d as f32 + 1.0])
        .collect();
    group.load(vec![batch]).unwrap();
    group
        .step(|s| {
            let (x, ga, gb) = (s.input(0).clone(), s.grad(a).clone(), s.grad(b).clone());
            // The "backward" on the GPU device's launcher: its gradients are
            // its row (a) and the row's sum (b), in host memory.
            let (xk, gak, gbk) = (x.key(), ga.key(), gb.key());
            s.engine()
                .op()
                .name("backward")
                .on(s.device())
                .reads(&[&x])
                .mutates(&[&ga, &gb])
                .run(move |ctx| {
                    let x = ctx.read(xk)?.clone();
                    ctx.write(gak)?.copy_from_slice(&x);
                    ctx.write(gbk)?[0] = x.iter().sum();
                    Ok(())
                })?;
            s.grad_ready(b)?;
            s.grad_ready(a)
        })
        .unwrap();
    let nf = n as f32;
    let sum_d: f32 = (0..n).map(|d| d as f32).sum();
    let ga = [sum_d, 2.0 * sum_d + nf];
    let want_a = [1.0 - 0.5 * ga[0], 1.0 - 0.5 * ga[1]];
    let want_b = [2.0 - 0.5 * (ga[0] + ga[1])];
    for d in 0..n {
        assert_eq!(group.weights(a, d).unwrap(), want_a, "device {d}");
        assert_eq!(group.weights(b, d).unwrap(), want_b, "device {d}");
    }
}

#[cfg(feature = "cuda")]
#[test]
fn nccl_over_device_memory_is_refused_off_cuda() {
    use depflow::parallel::NcclAllReduce;
    let (engine, devices) = engine(2, |_| Executor::pool(1));
    let got = NcclAllReduce::new(&engine, &devices, Vec::new(), 4);
    let Err(Error::Parallel(m)) = got else {
        panic!("NcclAllReduce over CPU devices: {got:?}");
    };
    assert!(m.contains("device 0 (`d0`) runs on the host"), "{m}");
    let got = NcclAllReduce::new(&engine, &[], Vec::new(), 4);
    let Err(Error::Parallel(m)) = got else {
        panic!("NcclAllReduce over no devices: {got:?}");
    };
    assert!(m.contains("no devices"), "{m}");
}

#[cfg(feature = "cuda")]
#[test]
fn nccl_sums_device_memory_over_one_to_every_gpu() {
    let count = gpus(DEVICE_MEMORY);
    for n in 1..=count {
        device_memory_sums(n);
    }
    if count == 1 {
        // Two pushes, one NCCL call each.
        nccl_was_called(DEVICE_MEMORY, "device_memory_sums_on_one_gpu", 2);
    }
}

#[cfg(feature = "cuda")]
const DEVICE_MEMORY: &str = "nccl_sums_device_memory_over_one_to_every_gpu";

/// `nccl_sums_device_memory_over_one_to_every_gpu`'s one-GPU case, alone
/// (with NCCL's log on).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "run by nccl_sums_device_memory_over_one_to_every_gpu in a child process, on one GPU"]
fn device_memory_sums_on_one_gpu() {
    device_memory_sums(1);
}

/// A buffer of device memory per GPU summed over `n` GPUs, twice, checked
/// on every device.
#[cfg(feature = "cuda")]
fn device_memory_sums(n: usize) {
    use cudarc::driver::CudaContext;
    use depflow::parallel::NcclAllReduce;
    {
        let (engine, devices) = engine(n, |d| Executor::cuda(d, 1));
        let ctxs: Vec<_> = (0..n)
            .map(|d| {
                let ctx = CudaContext::new(d).unwrap();
                // SAFETY: the engine orders these buffers (which is what
                // this tests); the test's copies synchronise.
                unsafe { ctx.disable_event_tracking() };
                ctx
            })
            .collect();
        let len = 1000;
        // Small integers: any order of the sum gives the same bits.
        let value = |d: usize, i: usize| ((d + 1) * 100 + i % 7) as f32;
        let buffers: Vec<_> = ctxs
            .iter()
            .enumerate()
            .map(|(d, ctx)| {
                let s = ctx.default_stream();
                let host: Vec<f32> = (0..len).map(|i| value(d, i)).collect();
                let x = s.clone_htod(&host).unwrap();
                s.synchronize().unwrap();
                engine.var(x)
            })
            .collect();
        let sum = NcclAllReduce::new(&engine, &devices, buffers.clone(), len).unwrap();
        // Twice: the second sums the first's sums.
        sum.push(&engine, 0).unwrap();
        sum.push(&engine, 0).unwrap();
        let want: Vec<f32> = (0..len)
            .map(|i| (0..n).map(|d| value(d, i)).sum::<f32>() * n as f32)
            .collect();
        for (d, b) in buffers.iter().enumerate() {
            let (ctx, k) = (ctxs[d].clone(), b.key());
            // A host op waits for the all-reduce's fence.
            let got = engine
                .push(&[b], &[], move |c| {
                    let s = ctx.default_stream();
                    let got = s.clone_dtoh(&*c.read(k)?).map_err(|e| format!("{e:?}"))?;
                    Ok(got)
                })
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(got, want, "{n} GPU(s), device {d}");
        }
        engine.wait_all().wait().unwrap();
    }
}
