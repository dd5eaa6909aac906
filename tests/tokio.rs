//! depflow on tokio (the `tokio` feature): devices on a runtime, pool
//! threads that enter one, and blocking waits that refuse to block inside
//! one instead of hanging.

#![cfg(feature = "tokio")]

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::held::held_op;
use common::tokio_io::io_engine;
use common::within;
use depflow::{BoxError, Engine, Error, Executor, OpHandle, Var};

/// How long a test may take before it counts as hung.
const HUNG: u64 = 10;

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn multi_thread_runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// Engines whose default device is a pool and whose "rt" device spawns its
/// ops on `handle`: with `Executor::tokio`, and through a custom executor
/// (what users wrote by hand before).
fn engines_on(handle: &tokio::runtime::Handle) -> [Engine; 2] {
    let bridged = handle.clone();
    [
        Executor::tokio(handle.clone()),
        Executor::custom(move |job| {
            bridged.spawn(async move {
                job.run();
            });
        }),
    ]
    .map(|rt| {
        Engine::builder()
            .threads(1)
            .device("rt", rt)
            .build()
            .unwrap()
    })
}

/// Pushes onto `engine`'s "rt" device an async op that awaits `first`, then
/// adds one to `v`, and returns what `first` gave.
fn increment_on_rt<T: Send + 'static>(
    engine: &Engine,
    v: &Var<u32>,
    first: impl Future<Output = T> + Send + 'static,
) -> OpHandle<T> {
    let k = v.key();
    engine
        .op()
        .on(engine.device("rt").unwrap())
        .mutates(&[v])
        .run_async(move |ctx| async move {
            let out = first.await;
            *ctx.write(k)? += 1;
            Ok::<_, BoxError>(out)
        })
        .unwrap()
}

#[test]
fn a_blocking_wait_inside_a_runtime_is_an_error_not_a_hang() {
    within(HUNG, || {
        let rt = current_thread_runtime();
        for engine in engines_on(rt.handle()) {
            let v = engine.var(0u32);
            // Runs only when the current-thread runtime is driven: blocking the
            // thread that drives it could never see it finish.
            let op = increment_on_rt(&engine, &v, async { 7u32 });
            rt.block_on(async {
                let all = engine.wait_all();
                assert!(matches!(all.wait(), Err(Error::BlockingInRuntime)));
                let mut op = op;
                assert!(matches!(
                    op.wait_timeout(Duration::from_secs(30)),
                    Err(Error::BlockingInRuntime)
                ));
                // The handle is still good: awaiting it is the way.
                assert_eq!((&mut op).await.unwrap(), 7);
                engine.wait_all().await.unwrap();
            });
            drop(engine);
        }
    });
}

#[test]
fn a_blocking_wait_on_finished_work_inside_a_runtime_returns_it() {
    within(HUNG, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.var(1u32);
        let op = engine
            .push(&[&v], &[], |_| Ok::<_, BoxError>(5u32))
            .unwrap();
        engine.wait_all().wait().unwrap();
        while !op.is_finished() {
            std::thread::yield_now();
        }
        let rt = current_thread_runtime();
        rt.block_on(async {
            // Nothing to wait for: no reason to refuse.
            assert_eq!(op.wait().unwrap(), 5);
            engine.wait_all().wait().unwrap();
        });
    });
}

#[test]
fn dropping_the_engine_inside_a_runtime_does_not_hang() {
    within(HUNG, || {
        let rt = current_thread_runtime();
        for engine in engines_on(rt.handle()) {
            let v = engine.var(0u32);
            let sleep = async { tokio::time::sleep(Duration::from_millis(10)).await };
            let op = increment_on_rt(&engine, &v, sleep);
            rt.block_on(async move {
                // The op needs this very thread to drive the runtime: a drop that
                // blocked until the op finished would never return.
                drop(engine);
                op.await.unwrap();
            });
            assert_eq!(v.version(), 1);
        }
    });
}

#[test]
fn async_ops_on_a_tokio_device_use_its_timers_and_files() {
    within(HUNG, || {
        let rt = multi_thread_runtime(2);
        let (engine, io) = io_engine(rt.handle());
        let dir = std::env::temp_dir().join(format!("depflow-tokio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.txt");
        let text = engine.var(String::from("written by an op"));
        let back = engine.var(String::new());
        let file = engine.new_var(); // stands for the file on disk
        let (tk, bk) = (text.key(), back.key());
        let p = path.clone();
        engine
            .op()
            .on(io)
            .reads(&[&text])
            .mutates(&[&file])
            .run_async(move |ctx| async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let data = ctx.read(tk)?.clone();
                tokio::fs::write(&p, data).await?;
                Ok::<_, BoxError>(())
            })
            .unwrap();
        // Reads the file once the write above is done: ordered by `file`.
        let p = path.clone();
        let read = engine
            .op()
            .on(io)
            .reads(&[&file])
            .mutates(&[&back])
            .run_async(move |ctx| async move {
                let data = tokio::fs::read_to_string(&p).await?;
                *ctx.write(bk)? = data.clone();
                Ok::<_, BoxError>(data.len())
            })
            .unwrap();
        assert_eq!(read.wait().unwrap(), "written by an op".len());
        engine.wait_all().wait().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        // The same op on the default pool finds no reactor: the device is
        // what makes the difference.
        let sleep_on_pool = engine
            .push_async(&[], &[&back], |_| async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                Ok::<_, BoxError>(())
            })
            .unwrap()
            .wait();
        let err = sleep_on_pool.unwrap_err().to_string();
        assert!(err.contains("reactor") || err.contains("runtime"), "{err}");
    });
}

#[test]
fn ops_of_a_tokio_device_whose_runtime_is_gone_fail_instead_of_hanging() {
    within(HUNG, || {
        let rt = current_thread_runtime();
        let (engine, io) = io_engine(rt.handle());
        drop(rt);
        let v = engine.var(0u32);
        let op = engine
            .op()
            .on(io)
            .mutates(&[&v])
            .run(|_| Ok::<_, BoxError>(()))
            .unwrap();
        assert!(matches!(op.wait(), Err(Error::Failed(_))));
        // The engine drops (and shuts down) without waiting forever.
    });
}

#[test]
fn a_pool_whose_threads_entered_a_runtime_runs_tokio_futures() {
    within(HUNG, || {
        let rt = multi_thread_runtime(1);
        let handle = rt.handle().clone();
        let engine = Engine::builder()
            .executor(Executor::pool(2).on_thread_start(move || {
                std::mem::forget(handle.enter());
            }))
            .build()
            .unwrap();
        let v = engine.var(0u32);
        let k = v.key();
        let op = engine
            .push_async(&[], &[&v], move |ctx| async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                *ctx.write(k)? += 1;
                Ok::<_, BoxError>(std::thread::current().name().map(String::from))
            })
            .unwrap();
        let ran_on = op.wait().unwrap().unwrap();
        assert!(ran_on.starts_with("depflow-cpu-"), "{ran_on}");
        assert_eq!(v.version(), 1);
    });
}

#[test]
fn a_tokio_device_shows_in_debug_and_refuses_a_start_hook() {
    let rt = current_thread_runtime();
    let exec = Executor::tokio(rt.handle().clone());
    assert_eq!(format!("{exec:?}"), "Executor::tokio(..)");
    let err = Engine::builder()
        .device("io", exec.on_thread_start(|| {}))
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    assert!(err.to_string().contains("device `io`"), "{err}");
}

#[test]
fn a_blocking_wait_in_spawn_blocking_goes_through_the_runtime() {
    within(HUNG, || {
        let rt = multi_thread_runtime(1);
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.var(0u32);
        let (release, op) = held_op(&engine, &v, |_| Ok(3u32));
        let got = rt.block_on(async move {
            tokio::task::spawn_blocking(move || {
                // tokio counts this thread as inside the runtime: the plain
                // wait refuses, the runtime's own block_on is the way.
                let mut op = op;
                assert!(matches!(
                    op.wait_timeout(Duration::from_secs(30)),
                    Err(Error::BlockingInRuntime)
                ));
                release.send(()).unwrap();
                tokio::runtime::Handle::current().block_on(op)
            })
            .await
            .unwrap()
        });
        assert_eq!(got.unwrap(), 3);
    });
}

#[test]
fn waiting_for_room_inside_a_runtime_refuses_only_when_there_is_none() {
    within(HUNG, || {
        let engine = Engine::builder()
            .threads(1)
            .max_in_flight(1)
            .build()
            .unwrap();
        let v = engine.new_var();
        let rt = current_thread_runtime();
        // Room: nothing to block on.
        rt.block_on(async {
            assert!(engine.op().mutates(&[&v]).when_room().wait().is_ok());
        });
        let (release, _) = held_op(&engine, &v, |_| Ok(()));
        rt.block_on(async {
            assert!(matches!(
                engine.op().mutates(&[&v]).when_room().wait(),
                Err(Error::BlockingInRuntime)
            ));
        });
        release.send(()).unwrap();
        engine.wait_all().wait().unwrap();
    });
}

#[test]
fn an_op_awaiting_a_timer_of_a_runtime_that_shuts_down_fails_instead_of_hanging() {
    within(HUNG, || {
        let rt = multi_thread_runtime(1);
        let (engine, io) = io_engine(rt.handle());
        let v = engine.var(0u32);
        let (started, has_started) = mpsc::channel::<()>();
        let op = engine
            .op()
            .on(io)
            .mutates(&[&v])
            .run_async(move |_| async move {
                started.send(())?;
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok::<_, BoxError>(())
            })
            .unwrap();
        has_started.recv().unwrap();
        drop(rt); // the op is parked on the runtime's timer
        assert!(matches!(op.wait(), Err(Error::Failed(_))));
        // Its output is poisoned by that failure, and the engine drops.
        assert!(matches!(
            engine.wait_for_var(&v).wait(),
            Err(Error::Poisoned { .. })
        ));
    });
}

/// An op on the default pool (no runtime entered) that awaits a tokio
/// timer panics with tokio's "no reactor running"; its error says how to
/// give it a runtime, as the README does.
#[test]
fn a_tokio_timer_on_the_default_pool_fails_with_a_hint() {
    within(HUNG, || {
        let engine = Engine::new();
        let v = engine.var(0u32);
        let err = engine
            .op()
            .name("sleepy")
            .mutates(&[&v])
            .run_async(|_| async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                Ok::<_, BoxError>(())
            })
            .unwrap()
            .wait()
            .unwrap_err();
        let failure = err.failure().unwrap();
        assert!(failure.is_panic(), "{err}");
        let message = failure.message();
        assert!(message.contains("there is no reactor running"), "{message}");
        for remedy in ["Executor::tokio(", "on_thread_start(", "handle.enter()"] {
            assert!(message.contains(remedy), "{remedy}: {message}");
            assert!(err.to_string().contains(remedy), "{remedy}: {err}");
        }
        // Other panics get no hint.
        let w = engine.var(0u32);
        let other = engine
            .op()
            .mutates(&[&w])
            .run(|_| -> Result<(), BoxError> { panic!("index out of range") })
            .unwrap()
            .wait()
            .unwrap_err();
        assert_eq!(
            other.failure().unwrap().message(),
            "panicked: index out of range"
        );
        let _ = engine.wait_all().wait();
    });
}
