//! `Backend::Nccl` (the `cuda` feature): the refusals, which run anywhere
//! (CPU devices, simulated GPUs, no `cuda` feature, no NCCL library), and
//! the sums on real GPUs, which skip where there is no CUDA device.
//!
//! A GPU test prints `SKIPPED` and what is missing (visibly: not captured
//! by the test harness) and passes, unless `DEPFLOW_REQUIRE_GPU=1`, which
//! makes a skip a failure (for a machine that has GPUs and NCCL).

mod common;

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
/// required.
#[cfg(feature = "cuda")]
fn skip(test: &str, why: &str) {
    use std::io::Write;
    if std::env::var("DEPFLOW_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("DEPFLOW_REQUIRE_GPU=1, but {test} cannot run: {why}");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// How many CUDA devices NCCL can run on here (0, printed, where none).
#[cfg(feature = "cuda")]
fn gpus(test: &str) -> usize {
    let n = depflow::stream::cuda_device_count();
    if n == 0 {
        skip(test, "no CUDA device (no driver, or no GPU)");
        return 0;
    }
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        skip(
            test,
            &format!(
                "{n} CUDA device(s) but no NCCL library (tried {})",
                cudarc::get_lib_name_candidates("nccl").join(", ")
            ),
        );
        return 0;
    }
    n
}

#[cfg(feature = "cuda")]
#[test]
fn nccl_sums_over_one_to_every_gpu() {
    let count = gpus("nccl_sums_over_one_to_every_gpu");
    for n in 1..=count {
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
    if gpus("two_devices_on_one_gpu_are_refused") == 0 {
        return;
    }
    let (engine, devices) = engine(2, |_| Executor::cuda(0, 1));
    let m = refusal(&engine, &devices);
    assert!(m.contains("devices 0 and 1 are both CUDA device 0"), "{m}");
}

#[cfg(feature = "cuda")]
#[test]
fn a_group_steps_with_nccl_on_every_gpu() {
    let n = gpus("a_group_steps_with_nccl_on_every_gpu");
    if n == 0 {
        return;
    }
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
    use cudarc::driver::CudaContext;
    use depflow::parallel::NcclAllReduce;
    let count = gpus("nccl_sums_device_memory_over_one_to_every_gpu");
    for n in 1..=count {
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
