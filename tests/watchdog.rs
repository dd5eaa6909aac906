//! The hang watchdog: deadlocked programs of both kinds are reported within
//! the configured time, naming the ops of the cycle; a slow but healthy
//! program is not; the report's Graphviz form has the expected shape; the
//! watchdog's thread ends with its engine.
//!
//! The tests run one at a time (`serial`): the thread count must see only
//! its own engine's watchdog.

mod common;

use std::sync::{Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use common::units::{Abandoned, allocate, loads_pushed_before_their_consumers};
use common::within;
use depflow::{BoxError, Cycle, Diagnostics, Engine, Error, Needs, Var};
use futures::FutureExt;
use futures::channel::oneshot;

const PERIOD: Duration = Duration::from_millis(200);
/// A generous bound on "reported within the configured time" (1.25 periods
/// on an idle machine).
const REPORTED_WITHIN: Duration = Duration::from_secs(10);

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An engine with a watchdog whose reports come out of the receiver.
fn watched(threads: usize) -> (Engine, mpsc::Receiver<Diagnostics>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let engine = Engine::builder()
        .threads(threads)
        .watchdog(PERIOD)
        .on_hang(move |report| {
            let _ = tx.lock().unwrap().send(report.clone());
        })
        .build()
        .unwrap();
    (engine, rx)
}

/// `outer` (async) mutates `x` and awaits the handle of `inner`, which it
/// pushes reading `x`: `inner` waits for `outer`, which waits for `inner`.
/// Sending on the returned sender makes `outer` stop awaiting.
fn async_deadlock(engine: &Engine, x: &Var) -> oneshot::Sender<()> {
    let (give_up, given_up) = oneshot::channel::<()>();
    let (e, x2) = (engine.clone(), x.clone());
    engine
        .op()
        .name("outer")
        .mutates(&[x])
        .run_async(move |_| async move {
            let inner = e.op().name("inner").reads(&[&x2]).run(|_| Ok(()))?;
            drop(e);
            futures::select! {
                done = inner.fuse() => done?,
                _ = given_up.fuse() => {}
            }
            Ok::<_, BoxError>(())
        })
        .unwrap();
    give_up
}

fn first_report(hangs: &mpsc::Receiver<Diagnostics>, since: Instant) -> Diagnostics {
    let report = hangs
        .recv_timeout(REPORTED_WITHIN)
        .expect("the watchdog reported no hang");
    assert!(since.elapsed() >= PERIOD, "reported before the period");
    report
}

#[test]
fn an_async_op_awaiting_an_op_that_needs_its_variable_is_a_named_cycle() {
    let _serial = serial();
    let (engine, hangs) = watched(2);
    let x = engine.var_named("x", ());
    let pushed = Instant::now();
    let give_up = async_deadlock(&engine, &x);

    let report = first_report(&hangs, pushed);
    let text = report.to_string();
    println!("{text}");
    assert_eq!(
        report.cycles(),
        [Cycle::Ops(vec![
            ("`outer`".into(), Needs::Result),
            ("`inner`".into(), Needs::Variable(x.id())),
        ])],
        "{text}"
    );
    assert_eq!(report.cycles()[0].ops(), ["`outer`", "`inner`"]);
    let outer = &report.ops().unwrap()[0];
    assert_eq!(outer.awaits(), ["`inner`"], "{text}");
    for line in [
        "no op has started or ended for ",
        "`outer` is awaiting inside its body, for the result of `inner`",
        "`inner` waits for variables: `x` (var#",
        "what waits for what:\n",
        "  `outer` waits for the result of `inner` -> `inner` waits for `x` (var#",
        "), held by `outer` -> back to `outer`: a cycle\n",
        "deadlock: `outer` waits for the result of `inner`; `inner` waits for `x` (var#",
    ] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }
    // Once per stall: no second report while nothing moves.
    assert!(hangs.recv_timeout(PERIOD * 3).is_err(), "reported twice");
    // The same report on demand.
    assert_eq!(engine.diagnostics().cycles(), report.cycles());

    give_up.send(()).unwrap();
    let e = engine.clone();
    within(10, move || e.wait_all().wait()).unwrap();
    assert!(engine.diagnostics().cycles().is_empty());
}

#[test]
fn a_body_blocked_on_an_op_queued_behind_it_is_named() {
    let _serial = serial();
    let (engine, hangs) = watched(1);
    let (a, b) = (engine.new_var(), engine.new_var());
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    // Unblocks the consumer however the test ends (a failed assertion must
    // not leave the engine's drop waiting for it).
    let release = OnDrop(Some({
        let tx = tx.clone();
        move || {
            let _ = tx.send(());
        }
    }));
    let pushed = Instant::now();
    engine
        .op()
        .name("consumer")
        .mutates(&[&a])
        .run(move |_| Ok(rx.lock().unwrap().recv()?))
        .unwrap();
    let sender = tx.clone();
    engine
        .op()
        .name("producer")
        .mutates(&[&b])
        .run(move |_| {
            // (The consumer may have been released and gone.)
            let _ = sender.send(());
            Ok(())
        })
        .unwrap();

    let report = first_report(&hangs, pushed);
    let text = report.to_string();
    println!("{text}");
    let [
        Cycle::Workers {
            device,
            running,
            queued,
            stuck,
        },
    ] = report.cycles()
    else {
        panic!("not one stuck device:\n{text}");
    };
    assert_eq!(device, "cpu", "{text}");
    assert_eq!(running, &["`consumer`"], "{text}");
    assert_eq!(queued, &["`producer`"], "{text}");
    assert!(*stuck >= PERIOD, "{text}");
    for line in [
        "`consumer` is running; pushed ",
        "`producer` is queued: ready, waiting for a worker; pushed ",
        "`producer` waits for a worker of `cpu`, all taken by `consumer` -> `consumer` is running (for ",
        "possible deadlock: every worker of `cpu` is inside a body that has neither returned nor awaited for ",
    ] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }

    drop(release);
    let e = engine.clone();
    within(10, move || e.wait_all().wait()).unwrap();
}

/// Runs its closure when dropped.
struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// Loads pushed before the ops that free their buffers, on too few units
/// (see `loads_pushed_before_their_consumers`): the watchdog reports the
/// deadlock, naming the units cycle.
#[test]
fn loads_pushed_before_their_consumers_are_reported_as_a_deadlock() {
    let _serial = serial();
    let (engine, hangs) = watched(2);
    let engine = Abandoned(engine);
    let pushed = Instant::now();
    let bufs = loads_pushed_before_their_consumers(&engine);
    let report = first_report(&hangs, pushed);
    let text = report.to_string();
    assert_eq!(report.cycles().len(), 1, "{text}");
    assert_eq!(
        report.cycles()[0].ops(),
        ["`load 2`", "`delete_var`", "`preprocess 0`"],
        "{text}"
    );
    let Cycle::Ops(steps) = &report.cycles()[0] else {
        panic!("{text}")
    };
    assert_eq!(
        steps[0].1,
        Needs::Freed {
            resource: "memory".into(),
            var: bufs[0].id()
        }
    );
    for line in [
        "deadlock: `load 2` waits for units of `memory` held by `buf0` (var#",
        "does not fit `memory` when run serially",
    ] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }
}

/// Ops that each take a while, one after another, over several periods:
/// always some op starts or ends well within a period.
#[test]
fn a_slow_but_healthy_program_is_not_reported() {
    let _serial = serial();
    let (engine, hangs) = watched(2);
    let (v, w) = (engine.var(0u32), engine.new_var());
    let started = Instant::now();
    for i in 0..40 {
        let k = v.key();
        engine
            .op()
            .mutates(&[&v])
            .run(move |ctx| {
                std::thread::sleep(Duration::from_millis(25));
                *ctx.write(k)? += 1;
                Ok(())
            })
            .unwrap();
        // Async ops awaiting other ops' handles, healthily.
        if i % 10 == 0 {
            let e = engine.clone();
            let w2 = w.clone();
            engine
                .op()
                .mutates(&[&w])
                .run_async(move |_| async move {
                    let t = e.new_var();
                    let slow = e.op().mutates(&[&t]).run(|_| {
                        std::thread::sleep(Duration::from_millis(25));
                        Ok(())
                    })?;
                    drop((e, w2));
                    slow.await?;
                    Ok::<_, BoxError>(())
                })
                .unwrap();
        }
    }
    let e = engine.clone();
    within(60, move || e.wait_all().wait()).unwrap();
    assert!(
        started.elapsed() >= PERIOD * 3,
        "the program was not slow: {:?}",
        started.elapsed()
    );
    assert_eq!(engine.get(&v).wait().unwrap(), 40);
    // Idle after it: nothing is pending, nothing to report.
    std::thread::sleep(PERIOD * 2);
    assert!(hangs.try_recv().is_err(), "a healthy program was reported");
}

/// A replay of a graph whose recorded ops each take a while, over several
/// periods: the replay is one op of the engine's, running all along, but
/// its recorded ops start and end well within a period, and that is
/// progress (issue 35: reported as a hang, "no op has started or ended").
#[test]
fn a_long_healthy_replay_is_not_reported() {
    let _serial = serial();
    let period = Duration::from_millis(250);
    let (tx, hangs) = mpsc::channel();
    let tx = Mutex::new(tx);
    let engine = Engine::builder()
        .threads(2)
        .watchdog(period)
        .on_hang(move |report| {
            let _ = tx.lock().unwrap().send(report.clone());
        })
        .build()
        .unwrap();
    let v = engine.var(0u32);
    let graph = engine
        .record(|rec| {
            for _ in 0..40 {
                let k = v.key();
                rec.op().name("slow step").mutates(&[&v]).run(move |ctx| {
                    std::thread::sleep(Duration::from_millis(25));
                    *ctx.write(k)? += 1;
                    Ok(())
                })?;
            }
            Ok::<_, Error>(())
        })
        .unwrap();
    let started = Instant::now();
    let replay = graph.replay();
    within(60, move || replay.wait()).unwrap();
    assert!(
        started.elapsed() >= period * 3,
        "the replay was not slow: {:?}",
        started.elapsed()
    );
    assert_eq!(engine.get(&v).wait().unwrap(), 40);
    // Idle after it: nothing is pending, nothing to report.
    std::thread::sleep(period * 2);
    if let Ok(report) = hangs.try_recv() {
        panic!("a healthy replay was reported:\n{report}");
    }
}

/// The other side: a replay whose recorded op blocks, after others ran, is
/// still reported (recorded ops' progress stops with them).
#[test]
fn a_replay_stuck_in_a_recorded_op_is_reported() {
    let _serial = serial();
    let (engine, hangs) = watched(2);
    let (release, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let v = engine.var(0u32);
    let graph = engine
        .record(|rec| {
            for _ in 0..4 {
                let k = v.key();
                rec.op().mutates(&[&v]).run(move |ctx| {
                    std::thread::sleep(Duration::from_millis(10));
                    *ctx.write(k)? += 1;
                    Ok(())
                })?;
            }
            rec.op()
                .name("stuck")
                .mutates(&[&v])
                .run(move |_| Ok(gate.lock().unwrap().recv_timeout(Duration::from_secs(60))?))
        })
        .unwrap();
    let since = Instant::now();
    let replay = graph.replay();
    let report = first_report(&hangs, since);
    let text = report.to_string();
    assert!(text.contains("no op has started or ended"), "{text}");
    release.send(()).unwrap();
    within(60, move || replay.wait()).unwrap();
    assert_eq!(engine.get(&v).wait().unwrap(), 4);
}

#[test]
fn the_dot_graph_has_the_ops_the_variable_and_the_cycle() {
    let _serial = serial();
    let (engine, hangs) = watched(2);
    let memory = engine.new_resource("memory", 1);
    let (x, cache) = (engine.var_named("x", ()), engine.var_named("cache", ()));
    allocate(&engine, &memory, 1, &cache);
    let pushed = Instant::now();
    let give_up = async_deadlock(&engine, &x);
    // Waits for the unit `cache` holds.
    let starved = engine.new_var();
    let parked = engine
        .op()
        .name("parked")
        .mutates(&[&starved])
        .uses(&memory, 1)
        .run(|_| Ok(()))
        .unwrap();

    let report = first_report(&hangs, pushed);
    println!("{report}");
    let dot = report.to_dot();
    println!("{dot}");
    let lines: Vec<&str> = dot.lines().collect();
    assert_eq!(lines.first(), Some(&"digraph depflow {"), "{dot}");
    assert_eq!(lines.last(), Some(&"}"), "{dot}");
    let node = |label: &str| -> String {
        let found: Vec<&&str> = lines
            .iter()
            .filter(|l| l.contains(&format!("[label=\"{label}\\n")))
            .collect();
        assert_eq!(found.len(), 1, "node {label} in:\n{dot}");
        found[0].trim().split(' ').next().unwrap().to_string()
    };
    let (outer, inner, parked_node) = (node("`outer`"), node("`inner`"), node("`parked`"));
    let cache_id = cache.id().to_string();
    let cache_node = format!(
        "var{}",
        cache_id.rsplit('#').next().unwrap().trim_end_matches(')')
    );
    let edges: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains(" -> "))
        .collect();
    let edge = |from: &str, to: &str| -> &str {
        let found: Vec<&&str> = edges
            .iter()
            .filter(|l| l.trim().starts_with(&format!("{from} -> {to} ")))
            .collect();
        assert_eq!(found.len(), 1, "edge {from} -> {to} in:\n{dot}");
        found[0]
    };
    let red = "color=red";
    let result = edge(&outer, &inner);
    assert!(
        result.contains("[label=\"result\"") && result.contains(red),
        "{dot}"
    );
    let var = edge(&inner, &outer);
    assert!(
        var.contains("[label=\"`x` (var#") && var.contains(red),
        "{dot}"
    );
    let units = edge(&parked_node, &cache_node);
    assert!(
        units.contains("[label=\"units of `memory`\"") && !units.contains(red),
        "{dot}"
    );
    assert_eq!(edges.len(), 3, "{dot}");
    assert!(
        lines.iter().any(|l| l.trim().starts_with(&format!(
            "{cache_node} [shape=ellipse, label=\"`cache` (var#"
        ))),
        "{dot}"
    );

    give_up.send(()).unwrap();
    let e = engine.clone();
    within(10, move || {
        e.delete_var(&cache, drop).unwrap();
        e.wait_all().wait()
    })
    .unwrap();
    drop(parked);
}

/// Threads of this process named as the watchdog's.
fn watchdog_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "depflow-watch")
        .count()
}

/// Waits (boundedly) for the count of watchdog threads to be `n`: a new
/// thread names itself once it runs.
fn expect_watchdog_threads(n: usize, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while watchdog_threads() != n {
        assert!(
            Instant::now() < deadline,
            "{why}: {} watchdog threads, not {n}",
            watchdog_threads()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits up to `bound` for the count of watchdog threads to be `n` or
/// fewer (another test's joined thread may linger in /proc a moment).
fn expect_watchdog_threads_within(n: usize, bound: Duration, why: &str) {
    let deadline = Instant::now() + bound;
    while watchdog_threads() > n {
        assert!(
            Instant::now() < deadline,
            "{why}: {} watchdog threads, not {n} or fewer, {bound:?} on",
            watchdog_threads()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "counts threads through /proc")]
fn the_watchdog_thread_ends_with_its_engine() {
    let _serial = serial();
    let before = watchdog_threads();
    // A long period: the thread sleeps 15 s between looks, so it is gone
    // within the bound below only if the engine's shutdown wakes and joins
    // it.
    let engine = Engine::builder()
        .threads(1)
        .watchdog(Duration::from_secs(60))
        .build()
        .unwrap();
    expect_watchdog_threads(before + 1, "a watchdog has a thread");
    let plain = Engine::builder()
        .threads(1)
        .track_ops(true)
        .build()
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        watchdog_threads(),
        before + 1,
        "only a watchdog has a thread"
    );
    drop(plain);
    within(10, move || drop(engine));
    // (A joined thread may linger in /proc for a moment.)
    expect_watchdog_threads(before, "the watchdog thread outlived its engine");

    // After reporting a hang too.
    let (engine, hangs) = watched(1);
    expect_watchdog_threads(before + 1, "a watchdog has a thread");
    let x = engine.var_named("x", ());
    let give_up = async_deadlock(&engine, &x);
    hangs.recv_timeout(REPORTED_WITHIN).expect("reported");
    give_up.send(()).unwrap();
    within(10, move || drop(engine));
    expect_watchdog_threads(before, "the watchdog thread outlived its engine");
}

/// The builder's docs say the engine's shutdown stops the watchdog: once
/// `shutdown().wait()` returns, its thread is gone, though the engine's
/// handle is still held (issue 35: it ran until the last handle went).
#[test]
#[cfg_attr(not(target_os = "linux"), ignore = "counts threads through /proc")]
fn shutdown_stops_the_watchdog_thread() {
    let _serial = serial();
    let before = watchdog_threads();
    let (engine, hangs) = watched(1);
    expect_watchdog_threads(before + 1, "a watchdog has a thread");
    let v = engine.new_var();
    engine
        .push(&[], &[&v], |_| {
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        })
        .unwrap();
    let e = engine.clone();
    within(10, move || e.shutdown().wait()).unwrap();
    // Joined by the wait: no lingering thread to wait for here (a joined
    // thread's entry may outlive it in /proc for a moment, so the bound
    // is short, not zero).
    expect_watchdog_threads_within(before, Duration::from_millis(200), "after shutdown");
    // Awaited rather than waited on, and shut down twice: the same.
    let (engine2, _hangs2) = watched(1);
    expect_watchdog_threads(before + 1, "a watchdog has a thread");
    futures::executor::block_on(engine2.shutdown()).unwrap();
    futures::executor::block_on(engine2.shutdown()).unwrap();
    expect_watchdog_threads_within(before, Duration::from_millis(200), "after shutdown");
    drop((engine, engine2));
    assert!(hangs.try_recv().is_err(), "nothing hung");
}

#[test]
fn the_builder_refuses_a_watchdog_it_cannot_run() {
    let _serial = serial();
    let zero = Engine::builder().watchdog(Duration::ZERO).build();
    assert!(matches!(zero, Err(Error::Config(m)) if m.contains("must not be zero")));
    let no_period = Engine::builder().on_hang(|_| {}).build();
    assert!(matches!(no_period, Err(Error::Config(m)) if m.contains("on_hang needs a watchdog")));
    // A watchdog turns op tracking on.
    let engine = Engine::builder()
        .watchdog(Duration::from_secs(60))
        .build()
        .unwrap();
    assert!(engine.diagnostics().ops().is_some());
}
