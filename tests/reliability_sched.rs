//! Issue 15, scheduling items: parked resource requests must not slow other
//! resources (16); negative priorities are not starved (17); an op pushed
//! from inside a running op starts on an idle worker (10); a stream op that
//! fails on its device gives its allocated units back (11); what a variable's
//! version counts for device writes (12); and the documented limit of
//! "a program that fits serially never deadlocks" with ops that wait for
//! other ops inside their bodies, which diagnostics name (3).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::traced::{held_named_op, tracked_engine};
use common::units::allocate;
use common::{gate, within};
use depflow::{Engine, Error, Executor, Lane};

/// Item 16: 20,000 ops through a free 1-unit resource, while 20,000
/// requests are parked on another, exhausted one. Before, every release
/// rescanned every parked request (28 s in a debug build); now requests
/// wait at the resource they are short of, and a release looks only at those
/// parked at the resource it returns units to. The bound is over 20 times
/// what that takes in a debug build (85 ms).
#[test]
fn parked_requests_do_not_slow_other_resources() {
    const N: usize = 20_000;
    let took = within(120, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let busy = engine.new_resource("busy", 1);
        let free = engine.new_resource("free", 1);
        let holder = engine.new_var();
        allocate(&engine, &busy, 1, &holder);
        let tags: Vec<_> = (0..N).map(|_| engine.new_var()).collect();
        for tag in &tags {
            engine
                .op()
                .mutates(&[tag])
                .uses(&busy, 1)
                .run(|_| Ok(()))
                .unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while engine.diagnostics().waiting_for_units().len() < N {
            assert!(Instant::now() < deadline, "the requests never parked");
            std::thread::sleep(Duration::from_millis(5));
        }

        let start = Instant::now();
        let v = engine.new_var();
        for _ in 0..N {
            engine
                .op()
                .mutates(&[&v])
                .uses(&free, 1)
                .run(|_| Ok(()))
                .unwrap();
        }
        engine.wait_for_var(&v).wait().unwrap();
        let took = start.elapsed();

        // Unblock the parked ones: all of them run.
        engine.delete_var(&holder, drop).unwrap().wait().unwrap();
        engine.wait_all().wait().unwrap();
        assert_eq!((busy.in_use(), free.in_use()), (0, 0));
        took
    });
    eprintln!("{N} ops through a free resource beside {N} parked requests: {took:?}");
    assert!(
        took < Duration::from_secs(2),
        "{N} ops through a free resource took {took:?} beside {N} parked requests"
    );
}

/// Pushes an op of priority `priority` that works 200 µs, then pushes the
/// next such op, until `stop`: a chain that keeps one op ready at all times.
fn steady_chain(engine: &Engine, priority: i32, stop: Arc<AtomicBool>) {
    let next = engine.clone();
    engine
        .op()
        .mutates(&[&engine.new_var()])
        .priority(priority)
        .run(move |_| {
            std::thread::sleep(Duration::from_micros(200));
            if !stop.load(SeqCst) {
                steady_chain(&next, priority, stop);
            }
            Ok(())
        })
        .unwrap();
}

/// On a one-worker pool kept busy by 32 chains of ops of priority `steady`
/// (never short of ready ops), whether an op of priority `low` runs within
/// 10 s.
fn runs_beside_a_steady_producer(steady: i32, low: i32) -> Result<(), Error> {
    within(120, move || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        for _ in 0..32 {
            steady_chain(&engine, steady, stop.clone());
        }
        let mut op = engine
            .op()
            .mutates(&[&engine.new_var()])
            .priority(low)
            .run(|_| Ok(()))
            .unwrap();
        let ran = op.wait_timeout(Duration::from_secs(10));
        stop.store(true, SeqCst);
        engine.wait_all().wait().unwrap();
        ran
    })
}

/// Item 17: on a one-worker pool kept busy by chains of priority-0 ops, a ready op of negative priority still runs (overtaking is bounded).
#[test]
fn negative_priorities_are_not_starved() {
    let ran = runs_beside_a_steady_producer(0, -1);
    assert!(
        ran.is_ok(),
        "a priority -1 op did not run in 10 s beside a steady producer: {ran:?}"
    );
}

/// Item 17: priorities age, so a steady supply of higher ones does not hold
/// a lower one back forever.
#[test]
fn lower_priorities_age_past_a_steady_supply_of_higher_ones() {
    for (steady, low) in [(5, 1), (-1, -5)] {
        let ran = runs_beside_a_steady_producer(steady, low);
        assert!(
            ran.is_ok(),
            "a priority {low} op did not run in 10 s beside a steady producer of \
             priority {steady}: {ran:?}"
        );
    }
}

/// Item 10: an op pushed from inside a body that keeps running is not
/// stuck in its worker's private slot: the idle worker runs it.
#[test]
fn an_op_pushed_inside_a_running_op_starts_on_an_idle_worker() {
    within(60, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        // Let both workers go idle.
        std::thread::sleep(Duration::from_millis(100));
        let inner = engine.clone();
        let parent = engine
            .op()
            .mutates(&[&engine.new_var()])
            .run(move |_| {
                let (started, child_started) = mpsc::channel();
                inner.op().mutates(&[&inner.new_var()]).run(move |_| {
                    let _ = started.send(());
                    Ok(())
                })?;
                // The parent keeps working until its child has started.
                Ok(child_started.recv_timeout(Duration::from_secs(10)).is_ok())
            })
            .unwrap();
        assert!(
            parent.wait().unwrap(),
            "the child did not start while its parent kept its worker busy"
        );
        engine.wait_all().wait().unwrap();
    });
}

fn gpu_engine() -> (Engine, depflow::Device) {
    let engine = Engine::builder()
        .threads(1)
        .track_ops(true)
        .device("gpu", Executor::simulated_gpu(1))
        .build()
        .unwrap();
    let gpu = engine.device("gpu").unwrap();
    (engine, gpu)
}

/// Item 11: a stream op whose device work fails gives the units it
/// allocated back, as a host op that fails does.
#[test]
fn a_stream_op_failing_on_its_device_gives_its_units_back() {
    within(60, || {
        let (engine, gpu) = gpu_engine();
        let mem = engine.new_resource("mem", 4);
        let out = engine.new_var();
        let failing = engine
            .op()
            .on(gpu)
            .mutates(&[&out])
            .uses(&mem, 1)
            .allocates(&mem, 3, &out)
            .run(|ctx| {
                Ok(ctx
                    .stream()?
                    .enqueue(|| Err("illegal address".to_string()))?)
            })
            .unwrap();
        assert!(matches!(failing.wait(), Err(Error::Failed(_))));
        assert_eq!(mem.in_use(), 0, "a failed stream op kept its units");
        assert_eq!(engine.diagnostics().resources()[0].held_by_vars(), []);

        // Success still hands them on, until the output is deleted.
        let ok = engine.new_var();
        engine
            .op()
            .on(gpu)
            .mutates(&[&ok])
            .allocates(&mem, 2, &ok)
            .run(|ctx| Ok(ctx.stream()?.enqueue(|| Ok(()))?))
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(mem.in_use(), 2);
        assert_eq!(
            engine.diagnostics().resources()[0].held_by_vars(),
            [(ok.id(), 2)]
        );
        engine.delete_var(&ok, drop).unwrap().wait().unwrap();
        assert_eq!(mem.in_use(), 0);
        engine.clear_poison(&out).unwrap().wait().unwrap();
        engine.delete_var(&out, drop).unwrap().wait().unwrap();
        assert_eq!(mem.in_use(), 0);
    });
}

/// Item 11, with the output allocated again by a later stream op before the
/// failure is known: the later op's units replace the failed op's, and they
/// too come back, as that op fails in turn (its input failed).
#[test]
fn a_failed_allocation_replaced_before_the_failure_is_known_comes_back_once() {
    within(60, || {
        let (engine, gpu) = gpu_engine();
        let mem = engine.new_resource("mem", 4);
        let out = engine.new_var();
        let (open, shut) = gate();
        let first = engine
            .op()
            .on(gpu)
            .mutates(&[&out])
            .allocates(&mem, 2, &out)
            .run(move |ctx| {
                Ok(ctx.stream()?.enqueue(move || {
                    shut.pass();
                    Err("illegal address".to_string())
                })?)
            })
            .unwrap();
        let second = engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(0))
            .mutates(&[&out])
            .allocates(&mem, 1, &out)
            .run(|ctx| Ok(ctx.stream()?.enqueue(|| Ok(()))?))
            .unwrap();
        // Both are enqueued (the second's units replaced the first's in
        // `out`) before the first's work fails.
        let deadline = Instant::now() + Duration::from_secs(10);
        while mem.in_use() != 3 {
            assert!(Instant::now() < deadline, "in use: {}", mem.in_use());
            std::thread::sleep(Duration::from_millis(1));
        }
        open.send(()).unwrap();
        assert!(matches!(first.wait(), Err(Error::Failed(_))));
        assert!(matches!(second.wait(), Err(Error::Poisoned { .. })));
        assert_eq!(mem.in_use(), 0, "units kept by failed stream ops");
        let _ = engine.wait_all().wait();
    });
}

/// Item 12: a stream op's write counts in its variable's version once the
/// op has enqueued its work and handed the variable on, before the device
/// work completes (as documented on `Var::version`); waiting for the
/// variable covers the device work.
#[test]
fn a_device_write_counts_in_the_version_when_handed_on() {
    within(60, || {
        let (engine, gpu) = gpu_engine();
        let v = engine.new_var();
        let (open, shut) = gate();
        let (done_tx, done) = mpsc::channel::<()>();
        let write = engine
            .op()
            .on(gpu)
            .mutates(&[&v])
            .run(move |ctx| {
                Ok(ctx.stream()?.enqueue(move || {
                    shut.pass();
                    let _ = done_tx.send(());
                    Ok(())
                })?)
            })
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while v.version() != 1 {
            assert!(Instant::now() < deadline, "the write never counted");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!write.is_finished(), "its device work is still pending");
        assert!(done.try_recv().is_err());
        open.send(()).unwrap();
        engine.wait_for_var(&v).wait().unwrap();
        assert!(
            done.try_recv().is_ok(),
            "waiting for the variable covers the device work"
        );
        assert_eq!(v.version(), 1);
    });
}

/// Item 3: the documented limit. A 2-unit resource; `E` (mutates `a`,
/// uses 2 units) is queued behind a gated op on `a`; the async op `X`
/// (mutates `b`, uses 1 unit) awaits `E`'s handle in its body. `X`
/// overtakes `E` for a unit, then waits for `E`, which waits for `X`'s
/// unit. Serially (E, then X) it fits, but `X` waits for another op inside
/// its body while holding units: outside the guarantee. Diagnostics name
/// the cycle; `X` gives up when told to, and everything completes.
#[test]
fn an_op_awaiting_an_older_op_while_holding_its_units_is_named_by_diagnostics() {
    within(60, || {
        let engine = tracked_engine(2);
        let mem = engine.new_resource("mem", 2);
        let (a, b) = (engine.new_var(), engine.new_var());
        let open = held_named_op(&engine, "gate", &a);
        let e = engine
            .op()
            .name("E")
            .mutates(&[&a])
            .uses(&mem, 2)
            .run(|_| Ok(()))
            .unwrap();
        let (give_up, gave_up) = futures::channel::oneshot::channel::<()>();
        let x = engine
            .op()
            .name("X")
            .mutates(&[&b])
            .uses(&mem, 1)
            .run_async(move |_| async move {
                match futures::future::select(e, gave_up).await {
                    futures::future::Either::Left((e, _)) => Ok::<_, depflow::BoxError>({
                        e?;
                        true
                    }),
                    futures::future::Either::Right(_) => Ok(false),
                }
            })
            .unwrap();
        // X runs, holding its unit; then E reaches the broker and parks.
        let deadline = Instant::now() + Duration::from_secs(10);
        while mem.in_use() != 1 {
            assert!(Instant::now() < deadline, "X never started");
            std::thread::sleep(Duration::from_millis(1));
        }
        open.send(()).unwrap();
        let report = loop {
            let report = engine.diagnostics();
            if !report.waiting_for_units().is_empty() {
                break report;
            }
            assert!(Instant::now() < deadline, "E never parked");
            std::thread::sleep(Duration::from_millis(1));
        };
        let text = report.to_string();
        assert!(
            text.contains("`X` awaits inside its body holding 1 of `mem`, which `E` waits for"),
            "the report does not name the cycle:\n{text}"
        );
        give_up.send(()).unwrap();
        assert!(!x.wait().unwrap(), "X gave up waiting for E");
        engine.wait_all().wait().unwrap();
        assert_eq!(mem.in_use(), 0);
    });
}

/// Item 3, the documented remedy: `X` declares its dependency on `E`
/// through a variable (it reads `a`, which `E` mutates) instead of awaiting
/// `E` in its body, and cannot start, holding units, before `E` is done.
#[test]
fn declaring_the_dependency_through_a_variable_keeps_the_guarantee() {
    within(60, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let mem = engine.new_resource("mem", 2);
        let (a, b) = (engine.new_var(), engine.new_var());
        engine
            .op()
            .mutates(&[&a])
            .run(|_| {
                std::thread::sleep(Duration::from_millis(100));
                Ok(())
            })
            .unwrap();
        let e = engine
            .op()
            .mutates(&[&a])
            .uses(&mem, 2)
            .run(|_| Ok(()))
            .unwrap();
        let x = engine
            .op()
            .reads(&[&a])
            .mutates(&[&b])
            .uses(&mem, 1)
            .run_async(move |_| async move { Ok::<_, depflow::BoxError>(e.await?) })
            .unwrap();
        x.wait().unwrap();
        engine.wait_all().wait().unwrap();
        assert_eq!(mem.in_use(), 0);
    });
}
