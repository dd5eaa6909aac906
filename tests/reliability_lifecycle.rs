//! Issue 15, B, C, D, 1, 2 and 5: user code the engine runs or drops at the
//! edges of an op's life must not overflow the stack, abort the process, or
//! hang the engine.
//!
//! Each case can crash the whole process or leave a thread stuck when it
//! regresses, so each runs in a child process of its own: this test binary
//! again, whose `child` test plays the scenario named by an environment
//! variable and prints a marker when it passed. The parent fails the test if
//! the child dies (a stack overflow, an abort), fails, or does not finish in
//! time (a hang).

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use depflow::{AnyVar, BoxError, Engine, Error, Executor, Var};

const SCENARIO: &str = "DEPFLOW_LIFECYCLE_SCENARIO";
const PASSED: &str = "LIFECYCLE-SCENARIO-PASSED";

/// Runs `scenario` in a child process; fails if the child does not print
/// [`PASSED`] and exit successfully within `secs` seconds.
fn in_child(scenario: &str, secs: u64) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(SCENARIO, scenario)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the test binary");
    // Read both pipes on threads of their own, so that a chatty child never
    // blocks on a full pipe.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut out = String::new();
            let _ = pipe.read_to_string(&mut out);
            out
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    let tail = |s: &str| s[s.len().saturating_sub(3000)..].to_string();
    match status {
        None => panic!(
            "scenario `{scenario}` did not finish within {secs} s (a hang)\n--- stdout\n{}\n--- stderr\n{}",
            tail(&stdout),
            tail(&stderr)
        ),
        Some(status) => assert!(
            status.success() && stdout.contains(PASSED),
            "scenario `{scenario}` failed ({status})\n--- stdout\n{}\n--- stderr\n{}",
            tail(&stdout),
            tail(&stderr)
        ),
    }
}

/// Plays the scenario its parent names; does nothing when run as a test of
/// its own.
#[test]
fn child() {
    let Ok(scenario) = std::env::var(SCENARIO) else {
        return;
    };
    match scenario.as_str() {
        "recycling_drops_pool" => recycling_drops(Engine::builder().threads(2).build().unwrap()),
        "recycling_drops_inline" => recycling_drops(
            Engine::builder()
                .executor(Executor::inline())
                .build()
                .unwrap(),
        ),
        "skipped_sync_closure" => skipped_sync_closure(),
        "skipped_async_closure" => skipped_async_closure(),
        "detached_output" => detached_output(),
        "value_freed_at_retire" => value_freed_at_retire(),
        "job_dropped_by_executor" => job_dropped_by_executor(),
        "job_dropped_at_thread_exit" => job_dropped_at_thread_exit(),
        "schedule_panics" => schedule_panics(),
        "last_clone_in_skipped_op" => last_clone_in_skipped_op(),
        "last_clone_in_detached_output" => last_clone_in_detached_output(),
        "last_clone_in_host_function" => last_clone_in_host_function(),
        "inline_custom_executor_long_chain" => inline_custom_executor_long_chain(),
        #[cfg(feature = "tokio")]
        "tokio_device_gone_long_chain" => tokio_device_gone_long_chain(),
        other => panic!("no scenario {other}"),
    }
    println!("\n{PASSED}");
}

// ---------------------------------------------------------------- helpers

/// A value whose destructor panics.
struct Bomb(&'static str);

impl Drop for Bomb {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("bomb: {}", self.0);
        }
    }
}

/// A blocking gate: an op that waits for `open` before it finishes.
fn gate() -> (mpsc::Sender<()>, impl FnOnce() + Send + 'static) {
    let (open, shut) = mpsc::channel::<()>();
    (open, move || {
        let _ = shut.recv_timeout(Duration::from_secs(30));
    })
}

/// Pushes an op mutating `vars` that holds them until the returned sender
/// sends (30 s at most).
fn hold_vars(engine: &Engine, vars: &[&dyn AnyVar]) -> mpsc::Sender<()> {
    let (open, shut) = gate();
    engine
        .push(&[], vars, move |_| {
            shut();
            Ok(())
        })
        .unwrap();
    open
}

/// A variable poisoned by an op that failed with "first failure".
fn poisoned_var(engine: &Engine) -> Var {
    let a = engine.new_var();
    engine
        .push(&[], &[&a], |_| Err::<(), BoxError>("first failure".into()))
        .unwrap();
    a
}

/// The failures `wait_all` reported: the first, and how many.
fn failures(outcome: Result<(), Error>) -> (Arc<depflow::OpFailure>, usize) {
    match outcome {
        Err(Error::Failures { first, count }) => (first, count),
        other => panic!("expected failures, got {other:?}"),
    }
}

/// Checks that an op failed because its job was dropped unrun.
fn assert_dropped<T: std::fmt::Debug>(outcome: Result<T, Error>) {
    match outcome {
        Err(Error::Failed(f)) => assert!(f.to_string().contains("dropped"), "{f}"),
        other => panic!("expected a dropped job, got {other:?}"),
    }
}

/// `wait_all`'s report, waiting (up to 10 s) for a failure to be recorded
/// after the ops it covers have retired (an output nobody awaits is dropped
/// just after its op retires).
fn failures_within_10s(engine: &Engine) -> (Arc<depflow::OpFailure>, usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match engine.wait_all().wait() {
            Err(Error::Failures { first, count }) => return (first, count),
            Ok(()) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            other => panic!("expected a failure, got {other:?}"),
        }
    }
}

// ---------------------------------------------------------------- B

/// Counts the ops its drops pushed (MXNet's recycling pattern: a buffer
/// dropped hands itself back through an op).
struct Recycler {
    engine: Engine,
    bin: Var<u64>,
    pushed: Arc<AtomicUsize>,
}

impl Drop for Recycler {
    fn drop(&mut self) {
        let bin = self.bin.key();
        let pushed = self.engine.push(&[], &[&self.bin], move |ctx| {
            *ctx.write(bin)? += 1;
            Ok(())
        });
        if pushed.is_ok() {
            self.pushed.fetch_add(1, SeqCst);
        }
    }
}

/// B: 10,000 variables hold values whose drops push ops, behind one gate
/// op; dropped, then the gate opens: each op's retiring frees a value, which
/// pushes, without recursing.
fn recycling_drops(engine: Engine) {
    const N: usize = 10_000;
    let inline = format!("{engine:?}").contains("Inline");
    let g = engine.new_var();
    let bin = engine.var(0u64);
    let pushed = Arc::new(AtomicUsize::new(0));
    // On the inline executor the gate must not block the pushing thread: it
    // is an async op that awaits a signal.
    let (open_async, shut_async) = futures::channel::oneshot::channel::<()>();
    let (open, shut) = gate();
    if inline {
        engine
            .push_async(&[], &[&g], move |_| async move {
                shut_async.await?;
                Ok::<_, BoxError>(())
            })
            .unwrap();
    } else {
        engine
            .push(&[], &[&g], move |_| {
                shut();
                Ok(())
            })
            .unwrap();
    }
    for _ in 0..N {
        let v = engine.var(Recycler {
            engine: engine.clone(),
            bin: bin.clone(),
            pushed: pushed.clone(),
        });
        engine.push(&[&g], &[&v], |_| Ok(())).unwrap();
        // The op holds the last reference now.
    }
    if inline {
        open_async.send(()).unwrap();
    } else {
        open.send(()).unwrap();
    }
    engine.wait_all().wait().unwrap();
    // The recycling ops were pushed before their pushers' ops retired.
    engine.wait_all().wait().unwrap();
    assert_eq!(pushed.load(SeqCst), N);
    assert_eq!(engine.get(&bin).wait().unwrap(), N as u64);
}

#[test]
fn recycling_drops_do_not_recurse_on_a_pool() {
    in_child("recycling_drops_pool", 120);
}

#[test]
fn recycling_drops_do_not_recurse_on_the_inline_executor() {
    in_child("recycling_drops_inline", 120);
}

// ---------------------------------------------------------------- C

/// C: a skipped op's closure whose captures panic when dropped, skipped for
/// a poisoned input and for a cancel: the process lives, the op is skipped
/// as usual, and `wait_all` reports the panic.
fn skipped_sync_closure() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let a = poisoned_var(&engine);
    let bomb = Bomb("closure of an op skipped for a poisoned input");
    let skipped = engine
        .push(&[&a], &[], move |_| {
            let _keep = &bomb;
            Ok(())
        })
        .unwrap();
    assert!(matches!(skipped.wait(), Err(Error::Poisoned { .. })));
    let (first, count) = failures(engine.wait_all().wait());
    assert_eq!(first.message(), "first failure");
    assert_eq!(count, 2, "the input's failure and the panic");
    // Cancelled: not reported itself, so the panic is the first failure.
    let b = engine.new_var();
    let open = hold_vars(&engine, &[&b]);
    let bomb = Bomb("closure of a cancelled op");
    let cancelled = engine
        .op()
        .name("cancelled")
        .mutates(&[&b])
        .run(move |_| {
            let _keep = &bomb;
            Ok(())
        })
        .unwrap();
    cancelled.cancel();
    open.send(()).unwrap();
    assert!(matches!(cancelled.wait(), Err(Error::Cancelled)));
    let (first, count) = failures(engine.wait_all().wait());
    let text = first.to_string();
    assert!(text.contains("closure of a cancelled op"), "{text}");
    assert_eq!(first.op_name(), Some("cancelled"));
    assert!(first.is_panic());
    assert_eq!(count, 1);
}

#[test]
fn a_skipped_ops_closure_that_panics_when_dropped_does_not_abort() {
    in_child("skipped_sync_closure", 60);
}

/// C: the same for an async op's closure (its future never made).
fn skipped_async_closure() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let a = poisoned_var(&engine);
    let bomb = Bomb("async op's closure");
    let skipped = engine
        .push_async(&[&a], &[], move |_ctx| {
            let _keep = &bomb;
            async { Ok::<_, BoxError>(()) }
        })
        .unwrap();
    assert!(matches!(skipped.wait(), Err(Error::Poisoned { .. })));
    assert_eq!(failures(engine.wait_all().wait()).1, 2);
}

#[test]
fn a_skipped_async_ops_closure_that_panics_when_dropped_does_not_abort() {
    in_child("skipped_async_closure", 60);
}

/// C: an op's output that nobody awaits (its handle was dropped) panics when
/// the engine drops it: reported by `wait_all`.
fn detached_output() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let v = engine.new_var();
    let open = hold_vars(&engine, &[&v]);
    let h = engine
        .push(&[&v], &[], |_| Ok(Bomb("detached output")))
        .unwrap();
    drop(h); // before the op finished: the engine drops its output
    open.send(()).unwrap();
    let (first, count) = failures_within_10s(&engine);
    assert!(first.to_string().contains("detached output"), "{first}");
    assert_eq!(count, 1);
    // The engine goes on.
    let after = engine.push(&[], &[&v], |_| Ok(5)).unwrap();
    assert_eq!(after.wait().unwrap(), 5);
}

#[test]
fn a_detached_output_that_panics_when_dropped_does_not_abort() {
    in_child("detached_output", 60);
}

/// C: a variable's value, dropped by its user, goes when its last op
/// retires: a panic there is reported by `wait_all`, and the engine goes
/// on (every op on every engine thread still runs).
fn value_freed_at_retire() {
    for engine in [
        Engine::builder().threads(1).build().unwrap(),
        Engine::builder()
            .executor(Executor::inline())
            .build()
            .unwrap(),
    ] {
        let v = engine.var(Bomb("a variable's value"));
        let w = engine.new_var();
        // An async op holding w keeps `last` queued until the signal (on
        // the inline executor too).
        let (open, shut) = futures::channel::oneshot::channel::<()>();
        engine
            .push_async(&[], &[&w], move |_| async move {
                shut.await?;
                Ok::<_, BoxError>(())
            })
            .unwrap();
        let last = engine
            .op()
            .name("last on v")
            .mutates(&[&v, &w])
            .run(|_| Ok(()))
            .unwrap();
        drop(v); // `last` holds the only reference now
        open.send(()).unwrap();
        assert!(last.wait().is_ok(), "its outcome was decided before");
        let (first, count) = failures(engine.wait_all().wait());
        let text = first.to_string();
        assert!(text.contains("a variable's value"), "{text}");
        assert_eq!(first.op_name(), Some("last on v"));
        assert_eq!(count, 1);
        let after = engine.push(&[], &[&w], |_| Ok(7)).unwrap();
        assert_eq!(after.wait().unwrap(), 7);
    }
}

#[test]
fn a_variables_value_that_panics_when_freed_at_retiring_does_not_abort() {
    in_child("value_freed_at_retire", 60);
}

/// C: a custom executor that drops a job: the op fails as dropped, its
/// closure (which panics when dropped) is dropped without aborting.
fn job_dropped_by_executor() {
    let engine = Engine::builder()
        .executor(Executor::custom(drop))
        .build()
        .unwrap();
    let v = engine.new_var();
    let bomb = Bomb("closure of a dropped job");
    let dropped = engine
        .push(&[], &[&v], move |_| {
            let _keep = &bomb;
            Ok(())
        })
        .unwrap();
    assert_dropped(dropped.wait());
    let (_, count) = failures(engine.wait_all().wait());
    assert_eq!(count, 2, "dropped, and the panic");
}

#[test]
fn a_dropped_jobs_closure_that_panics_when_dropped_does_not_abort() {
    in_child("job_dropped_by_executor", 60);
}

std::thread_local! {
    /// Jobs a custom executor keeps on the thread that made them ready.
    static KEPT: std::cell::RefCell<Vec<depflow::Job>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// C: a custom executor keeps its jobs in a thread-local, which the thread's
/// exit drops after the engine's own thread-locals are gone: the job still
/// fails its op (no panic in a thread-local destructor, which aborts).
fn job_dropped_at_thread_exit() {
    let engine = Engine::builder()
        .executor(Executor::custom(|job| {
            KEPT.with(|k| k.borrow_mut().push(job))
        }))
        .build()
        .unwrap();
    let pushed = std::thread::spawn({
        let engine = engine.clone();
        move || {
            // The executor's thread-local first: destroyed last.
            KEPT.with(|_| {});
            let v = engine.new_var();
            engine.push(&[], &[&v], |_| Ok(())).unwrap()
        }
    })
    .join()
    .unwrap();
    assert_dropped(pushed.wait());
}

#[test]
fn a_job_dropped_at_its_threads_exit_fails_its_op() {
    in_child("job_dropped_at_thread_exit", 60);
}

// ---------------------------------------------------------------- D

/// D: a custom executor's schedule function panics (its channel's receiver
/// is gone) when a gate op's release hands three variables on: every
/// variable is handed on, every op resolves, `wait_all` reports.
fn schedule_panics() {
    let (tx, rx) = mpsc::channel::<depflow::Job>();
    let tx = std::sync::Mutex::new(tx);
    let engine = Engine::builder()
        .threads(1)
        .device(
            "queue",
            Executor::custom(move |job| tx.lock().unwrap().send(job).unwrap()),
        )
        .build()
        .unwrap();
    let queue = engine.device("queue").unwrap();
    let vars: Vec<_> = (0..3).map(|_| engine.new_var()).collect();
    let refs: Vec<&dyn depflow::AnyVar> = vars.iter().map(|v| v as _).collect();
    let open = hold_vars(&engine, &refs);
    let mut on_queue = Vec::new();
    let mut after = Vec::new();
    for v in &vars {
        for _ in 0..3 {
            on_queue.push(engine.op().on(queue).mutates(&[v]).run(|_| Ok(())).unwrap());
        }
        // Back on the pool: runs (skipped) once the queue's ops are done.
        after.push(engine.push(&[], &[v], |_| Ok(())).unwrap());
    }
    drop(rx);
    open.send(()).unwrap();
    for mut h in on_queue {
        assert_dropped(h.wait_timeout(Duration::from_secs(10)));
    }
    for mut h in after {
        assert!(matches!(
            h.wait_timeout(Duration::from_secs(10)),
            Err(Error::Poisoned { .. })
        ));
    }
    let all = engine.wait_all().wait_timeout(Duration::from_secs(10));
    assert_eq!(failures(all).1, 9);
    // The pool's worker survived.
    let fresh = engine.new_var();
    assert_eq!(
        engine
            .push(&[], &[&fresh], |_| Ok(3))
            .unwrap()
            .wait()
            .unwrap(),
        3
    );
}

#[test]
fn a_panicking_schedule_function_hands_every_variable_on() {
    in_child("schedule_panics", 60);
}

// ---------------------------------------------------------------- 1, 2

/// 1: the last engine handle, held by the closure of an op skipped for a
/// poisoned input, goes on the only worker: it must not wait there for ops
/// only that worker can run.
fn last_clone_in_skipped_op() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let (a, out) = (engine.new_var(), engine.new_var());
    let (open, shut) = gate();
    engine
        .push(&[], &[&a], move |_| -> Result<(), BoxError> {
            shut();
            Err("poison a".into())
        })
        .unwrap();
    let last = engine.clone();
    let mut skipped = engine
        .push(&[&a], &[&out], move |_| {
            let _keep = &last;
            Ok(())
        })
        .unwrap();
    let mut later = engine.push(&[&out], &[], |_| Ok(())).unwrap();
    drop(engine);
    open.send(()).unwrap();
    assert!(matches!(
        skipped.wait_timeout(Duration::from_secs(10)),
        Err(Error::Poisoned { .. })
    ));
    assert!(matches!(
        later.wait_timeout(Duration::from_secs(10)),
        Err(Error::Poisoned { .. })
    ));
}

#[test]
fn the_last_handle_in_a_skipped_ops_closure_does_not_hang_its_worker() {
    in_child("last_clone_in_skipped_op", 60);
}

/// 1: the same, the last handle being an op's output nobody awaits (dropped
/// on the worker, after the op's body).
fn last_clone_in_detached_output() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let v = engine.new_var();
    let open = hold_vars(&engine, &[&v]);
    let last = engine.clone();
    drop(engine.push(&[&v], &[], move |_| Ok(last)).unwrap());
    let mut later = engine.push(&[], &[&v], |_| Ok(9)).unwrap();
    drop(engine);
    open.send(()).unwrap();
    assert_eq!(later.wait_timeout(Duration::from_secs(10)).unwrap(), 9);
}

#[test]
fn the_last_handle_in_a_detached_output_does_not_hang_its_worker() {
    in_child("last_clone_in_detached_output", 60);
}

/// 2: the last engine handle, dropped inside a stream device's host
/// function: the stream thread must not wait for the op whose work it runs.
fn last_clone_in_host_function() {
    let engine = Engine::builder()
        .threads(1)
        .device("gpu", Executor::simulated_gpu(1))
        .build()
        .unwrap();
    let gpu = engine.device("gpu").unwrap();
    let v = engine.new_var();
    let (open, shut) = gate();
    let (returned, has_returned) = mpsc::channel::<()>();
    let last = engine.clone();
    engine
        .op()
        .on(gpu)
        .mutates(&[&v])
        .run(move |ctx| {
            ctx.stream()?.enqueue(move || {
                shut();
                drop(last);
                let _ = returned.send(());
                Ok(())
            })?;
            Ok(())
        })
        .unwrap();
    let mut later = engine.push(&[&v], &[], |_| Ok(4)).unwrap();
    drop(engine);
    open.send(()).unwrap();
    has_returned
        .recv_timeout(Duration::from_secs(10))
        .expect("the host function returns");
    assert_eq!(later.wait_timeout(Duration::from_secs(10)).unwrap(), 4);
}

#[test]
fn the_last_handle_dropped_in_a_host_function_does_not_hang_its_stream() {
    in_child("last_clone_in_host_function", 60);
}

// ---------------------------------------------------------------- 5

/// 5: a custom executor that runs each job where it is handed over, and a
/// chain of 200,000 ops released at once: run one after the other, not
/// nested.
fn inline_custom_executor_long_chain() {
    const N: usize = 200_000;
    let engine = Engine::builder()
        .threads(1)
        .device(
            "here",
            Executor::custom(|job| {
                job.run();
            }),
        )
        .build()
        .unwrap();
    let here = engine.device("here").unwrap();
    let v = engine.var(0u64);
    let k = v.key();
    let open = hold_vars(&engine, &[&v]);
    for _ in 0..N {
        drop(
            engine
                .op()
                .on(here)
                .mutates(&[&v])
                .run(move |ctx| {
                    *ctx.write(k)? += 1;
                    Ok(())
                })
                .unwrap(),
        );
    }
    open.send(()).unwrap();
    engine
        .wait_all()
        .wait_timeout(Duration::from_secs(100))
        .unwrap();
    assert_eq!(engine.get(&v).wait().unwrap(), N as u64);
}

#[test]
fn a_custom_executor_running_jobs_inline_runs_a_long_chain() {
    in_child("inline_custom_executor_long_chain", 150);
}

/// 5, on the tokio device: its runtime is gone, so each job handed to it is
/// dropped as it is spawned, which fails its op and hands its variable to
/// the next: a chain of 100,000 released at once fails op after op, not
/// nested.
#[cfg(feature = "tokio")]
fn tokio_device_gone_long_chain() {
    const N: usize = 100_000;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (engine, io) = common::tokio_io::io_engine(rt.handle());
    drop(rt);
    let v = engine.new_var();
    let open = hold_vars(&engine, &[&v]);
    for _ in 0..N {
        drop(engine.op().on(io).mutates(&[&v]).run(|_| Ok(())).unwrap());
    }
    open.send(()).unwrap();
    let all = engine.wait_all().wait_timeout(Duration::from_secs(100));
    assert_eq!(failures(all).1, N, "each dropped");
}

#[cfg(feature = "tokio")]
#[test]
fn a_tokio_device_whose_runtime_is_gone_fails_a_long_chain() {
    in_child("tokio_device_gone_long_chain", 150);
}
