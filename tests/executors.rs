//! Executor options: thread start hooks on a pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use depflow::{BoxError, Engine, Error, Executor};

#[test]
fn the_start_hook_runs_on_every_worker_before_the_build_returns() {
    let started = Arc::new(AtomicUsize::new(0));
    let names = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (s, n) = (started.clone(), names.clone());
    let engine = Engine::builder()
        .executor(Executor::pool(3).on_thread_start(move || {
            s.fetch_add(1, Ordering::SeqCst);
            let name = std::thread::current().name().map(String::from);
            n.lock().unwrap().push(name.unwrap_or_default());
        }))
        .device("gpu", Executor::simulated_gpu(1).on_thread_start(|| {}))
        .build()
        .unwrap();
    assert_eq!(started.load(Ordering::SeqCst), 3);
    let mut names = names.lock().unwrap().clone();
    names.sort();
    assert_eq!(names, ["depflow-cpu-0", "depflow-cpu-1", "depflow-cpu-2"]);
    let v = engine.new_var();
    engine
        .push(&[], &[&v], |_| Ok::<_, BoxError>(()))
        .unwrap()
        .wait()
        .unwrap();
}

#[test]
fn a_start_hook_sets_up_thread_state_that_ops_see() {
    thread_local! {
        static WORKER_TAG: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    let engine = Engine::builder()
        .executor(Executor::pool(2).on_thread_start(|| WORKER_TAG.with(|t| t.set(7))))
        .build()
        .unwrap();
    let v = engine.new_var();
    let tag = engine
        .push(&[], &[&v], |_| {
            Ok::<_, BoxError>(WORKER_TAG.with(|t| t.get()))
        })
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(tag, 7);
}

#[test]
fn a_panicking_start_hook_fails_the_build() {
    let err = Engine::builder()
        .threads(1)
        .device(
            "cpu1",
            Executor::pool(2).on_thread_start(|| panic!("no runtime here")),
        )
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("device `cpu1`") && msg.contains("no runtime here"),
        "{msg}"
    );
}

#[test]
fn a_start_hook_needs_threads_of_the_executor_s_own() {
    for exec in [
        Executor::inline(),
        Executor::custom(|job| {
            job.run();
        }),
    ] {
        let err = Engine::builder()
            .executor(exec.on_thread_start(|| {}))
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        assert!(err.to_string().contains("start hook"), "{err}");
    }
}

#[test]
fn an_executor_with_a_start_hook_says_so() {
    assert_eq!(
        format!("{:?}", Executor::pool(2).on_thread_start(|| {})),
        "Executor::pool(2).on_thread_start(..)"
    );
    assert_eq!(format!("{:?}", Executor::pool(2)), "Executor::pool(2)");
    assert_eq!(
        format!("{:?}", Executor::simulated_gpu(1)),
        "Executor::Sim { compute: 1 }"
    );
}
