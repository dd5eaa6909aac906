//! Engine lifetime: the last handle dropped finishes what was pushed and
//! joins its threads, wherever it is dropped; no crash or hang at shutdown.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::within;
use depflow::{Engine, Error, Executor};

/// Live threads of this process whose name starts with `prefix` (names are
/// truncated to 15 bytes by the kernel).
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|name| name.starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

fn wait_until_gone(prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while threads_named(prefix) > 0 {
        assert!(Instant::now() < deadline, "threads {prefix}* still alive");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (at most 20 s) until an op has bumped `ran`.
fn wait_ran(ran: &Arc<AtomicUsize>) {
    let ran = ran.clone();
    within(20, move || {
        while ran.load(SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

fn engine_with_device(device: &str, threads: usize) -> Engine {
    Engine::builder()
        .executor(Executor::inline())
        .device(device, Executor::pool(threads))
        .build()
        .unwrap()
}

#[test]
fn dropping_the_last_handle_finishes_pushed_ops_and_joins_threads() {
    let engine = engine_with_device("lc1", 2);
    // (Threads name themselves as they start, so their count is not checked here.)
    let dev = engine.device("lc1").unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let v = engine.new_var();
    for _ in 0..100 {
        let ran = ran.clone();
        let _ = engine.op().on(dev).mutates(&[&v]).run(move |_| {
            std::thread::sleep(Duration::from_micros(200));
            ran.fetch_add(1, SeqCst);
            Ok(())
        });
    }
    within(30, move || drop(engine));
    assert_eq!(
        ran.load(SeqCst),
        100,
        "drop returned before the pushed ops ran"
    );
    assert_eq!(
        threads_named("depflow-lc1-"),
        0,
        "drop returned before joining"
    );
}

#[test]
fn dropping_the_last_handle_inside_an_op_does_not_hang() {
    let engine = engine_with_device("lc2", 1);
    let dev = engine.device("lc2").unwrap();
    let v = engine.new_var();
    let inner = engine.clone();
    let ran = Arc::new(AtomicUsize::new(0));
    let ran2 = ran.clone();
    let _ = engine.op().on(dev).mutates(&[&v]).run(move |_| {
        std::thread::sleep(Duration::from_millis(20));
        ran2.fetch_add(1, SeqCst);
        drop(inner); // the last handle, dropped inside the op
        Ok(())
    });
    drop(engine);
    wait_ran(&ran);
    wait_until_gone("depflow-lc2-");
}

#[test]
fn an_engine_returned_by_its_own_op_shuts_down_cleanly() {
    let engine = engine_with_device("lc3", 1);
    let dev = engine.device("lc3").unwrap();
    let v = engine.new_var();
    let inner = engine.clone();
    // The output (the last handle) is dropped by the worker thread, outside
    // the op, when the detached task finishes.
    let ran = Arc::new(AtomicUsize::new(0));
    let ran2 = ran.clone();
    drop(engine.op().on(dev).mutates(&[&v]).run(move |_| {
        ran2.fetch_add(1, SeqCst);
        Ok(inner)
    }));
    drop(engine);
    wait_ran(&ran);
    wait_until_gone("depflow-lc3-");
}

#[test]
fn shutdown_drains_then_refuses() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let v = engine.var(0u32);
    for _ in 0..50 {
        let v2 = v.clone();
        let _ = engine.push_async(&[], &[&v], move |ctx| async move {
            futures::future::ready(()).await;
            *ctx.write(&v2)? += 1;
            Ok(())
        });
    }
    engine.shutdown().wait().unwrap();
    assert_eq!(v.version(), 50);
    assert!(matches!(
        engine.push(&[], &[&v], |_| Ok(())),
        Err(Error::ShutDown)
    ));
}

#[test]
fn many_engines_come_and_go() {
    within(60, || {
        for i in 0..100 {
            let engine = Engine::builder().threads(1 + i % 3).build().unwrap();
            let v = engine.var(i);
            let v2 = v.clone();
            let _ = engine.push(&[], &[&v], move |ctx| {
                *ctx.write(&v2)? += 1;
                Ok(())
            });
            if i % 2 == 0 {
                engine.wait_all().wait().unwrap();
            }
        }
    });
}
