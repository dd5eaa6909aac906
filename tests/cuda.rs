//! The CUDA device (`--features cuda`): real kernels and copies on real
//! streams. Where there is no driver or no GPU each test prints `SKIPPED`
//! and why (visibly: not captured by the test harness) and passes, unless
//! `DEPFLOW_REQUIRE_GPU=1`, which makes a skip a failure (for a machine that
//! has a GPU). `no_such_device_is_a_config_error` runs everywhere (it checks
//! that a missing driver is an error, not a panic).
#![cfg(feature = "cuda")]

mod common;

use std::sync::Arc;

use common::within;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use depflow::{BoxError, Engine, Error, Executor, Lane};

const KERNEL: &str = r#"
extern "C" __global__ void bump(unsigned int* x, unsigned int expect) {
    // Counts, and records a broken order as a huge value.
    if (x[0] != expect) { x[1] = 1; }
    x[0] = expect + 1;
}"#;

/// The engine and the kernel, or None (printed) where there is no GPU.
fn gpu() -> Option<(Engine, depflow::Device, CudaFunction, Arc<CudaContext>)> {
    if depflow::stream::cuda_device_count() == 0 {
        return skip("no CUDA device (no driver, or no GPU)");
    }
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return skip("NVRTC not found (it compiles the test kernel)");
    }
    let engine = Engine::builder()
        .threads(2)
        .device("gpu", Executor::cuda(0, 2))
        .build()
        .unwrap();
    let ctx = CudaContext::new(0).unwrap();
    let ptx = cudarc::nvrtc::compile_ptx(KERNEL).unwrap();
    let f = ctx.load_module(ptx).unwrap().load_function("bump").unwrap();
    let gpu = engine.device("gpu").unwrap();
    Some((engine, gpu, f, ctx))
}

/// Reports a skipped test where the user sees it (the harness captures
/// `eprintln!`, not writes to the stream), or fails it if a GPU is required.
fn skip<T>(why: &str) -> Option<T> {
    use std::io::Write;
    let name = std::thread::current()
        .name()
        .unwrap_or("a cuda test")
        .to_owned();
    if std::env::var("DEPFLOW_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("DEPFLOW_REQUIRE_GPU=1, but {why}");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED {name}: {why}");
    None
}

#[test]
fn no_such_device_is_a_config_error() {
    let built = Engine::builder()
        .device("gpu", Executor::cuda(64, 1))
        .build();
    assert!(matches!(built, Err(Error::Config(_))), "{built:?}");
}

#[test]
fn kernels_on_two_streams_and_a_copy_back_keep_program_order() {
    within(120, || {
        let Some((engine, gpu, f, ctx)) = gpu() else {
            return;
        };
        let alloc = ctx.default_stream();
        let counter: CudaSlice<u32> = alloc.alloc_zeros(2).unwrap();
        alloc.synchronize().unwrap();
        let counter = engine.var(counter);
        let host = engine.var(vec![0u32; 2]);
        const N: u32 = 1000;
        for i in 0..N {
            let (f, c) = (f.clone(), counter.key());
            engine
                .op()
                .on(gpu)
                .lane(Lane::Compute((i % 2) as u8))
                .mutates(&[&counter])
                .run(move |ctx| {
                    let stream = ctx.stream()?.cuda().expect("a CUDA stream").clone();
                    let mut x = ctx.write(c)?;
                    let mut launch = stream.launch_builder(&f);
                    launch.arg(&mut *x).arg(&i);
                    // SAFETY: the arguments match `bump`; x has 2 elements.
                    unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }?;
                    Ok::<_, BoxError>(())
                })
                .unwrap();
        }
        // The copy back, on the device-to-host lane, then read on the host.
        let (c, h) = (counter.key(), host.key());
        engine
            .op()
            .on(gpu)
            .lane(Lane::DeviceToHost)
            .reads(&[&counter])
            .mutates(&[&host])
            .run(move |ctx| {
                let stream = ctx.stream()?.cuda().expect("a CUDA stream").clone();
                stream.memcpy_dtoh(&*ctx.read(c)?, &mut ctx.write(h)?[..])?;
                Ok::<_, BoxError>(())
            })
            .unwrap();
        let got = engine
            .push(&[&host], &[], move |ctx| Ok(ctx.read(h)?.clone()))
            .unwrap();
        assert_eq!(
            got.wait().unwrap(),
            vec![N, 0],
            "count, and no broken order"
        );
        engine.wait_all().wait().unwrap();
    });
}

#[test]
fn a_host_function_error_fails_the_op_and_poisons() {
    within(60, || {
        let Some((engine, gpu, _, _)) = gpu() else {
            return;
        };
        let v = engine.new_var();
        let failing = engine
            .op()
            .name("host fn")
            .on(gpu)
            .mutates(&[&v])
            .run(|ctx| Ok(ctx.stream()?.enqueue(|| Err("bad".to_string()))?))
            .unwrap();
        assert!(matches!(failing.wait(), Err(Error::Failed(_))));
        match engine.wait_for_var(&v).wait() {
            Err(Error::Poisoned(cause)) => assert_eq!(cause.op_name(), Some("host fn")),
            other => panic!("{other:?}"),
        }
        let _ = engine.wait_all().wait();
    });
}
