//! Waits with a deadline: `OpHandle::wait_timeout`, `Wait::wait_timeout` and
//! `Engine::shutdown_timeout` report a stuck program instead of hanging it,
//! and leave the wait good for another try.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::held::held_op;
use common::within;
use depflow::{BoxError, Engine, Error};

/// How long a test may take before it counts as hung.
const HUNG: u64 = 10;

const SHORT: Duration = Duration::from_millis(20);
const LONG: Duration = Duration::from_secs(60);

/// Checks that `err` is a timeout of a wait on the whole engine, which
/// counted `ops` ops still in flight.
fn assert_timed_out_with_in_flight(err: &Error, ops: usize) {
    assert!(
        matches!(err, Error::TimedOut { in_flight: Some(n), .. } if *n == ops),
        "{err:?}"
    );
}

#[test]
fn an_op_handle_times_out_and_stays_good() {
    within(HUNG, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.new_var();
        let (release, mut op) = held_op(&engine, &v, |_| Ok(7));
        match op.wait_timeout(SHORT) {
            Err(Error::TimedOut { waited, in_flight }) => {
                assert_eq!(waited, SHORT);
                assert_eq!(in_flight, None);
            }
            other => panic!("{other:?}"),
        }
        assert!(!op.is_finished());
        release.send(()).unwrap();
        assert_eq!(op.wait_timeout(LONG).unwrap(), 7);
        assert!(op.is_finished());
    });
}

#[test]
fn an_op_handle_that_timed_out_can_still_be_awaited() {
    within(HUNG, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.new_var();
        let (release, mut op) = held_op(&engine, &v, |_| Err::<u32, _>("failed late".into()));
        assert!(matches!(
            op.wait_timeout(SHORT),
            Err(Error::TimedOut { .. })
        ));
        release.send(()).unwrap();
        let err = futures::executor::block_on(op).unwrap_err();
        assert!(matches!(err, Error::Failed(_)), "{err}");
    });
}

#[test]
fn wait_all_times_out_with_the_ops_in_flight() {
    within(HUNG, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.new_var();
        let (release, _) = held_op(&engine, &v, |_| Ok(()));
        for _ in 0..2 {
            engine.push(&[&v], &[], |_| Ok::<_, BoxError>(())).unwrap();
        }
        let mut all = engine.wait_all();
        let err = all.wait_timeout(SHORT).unwrap_err();
        assert_timed_out_with_in_flight(&err, 3);
        assert!(err.to_string().contains("3 op(s) still in flight"), "{err}");
        release.send(()).unwrap();
        all.wait_timeout(LONG).unwrap();
    });
}

#[test]
fn a_wait_for_a_variable_times_out() {
    within(HUNG, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.var(0u32);
        let k = v.key();
        let (release, _) = held_op(&engine, &v, move |ctx| {
            *ctx.write(k)? += 1;
            Ok(())
        });
        let mut wait = engine.wait_for_var(&v);
        assert!(matches!(
            wait.wait_timeout(SHORT),
            Err(Error::TimedOut {
                in_flight: None,
                ..
            })
        ));
        release.send(()).unwrap();
        wait.wait_timeout(LONG).unwrap();
        assert_eq!(v.version(), 1);
    });
}

#[test]
fn a_shutdown_with_a_deadline_reports_instead_of_hanging() {
    within(HUNG, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.new_var();
        let (ran, finished) = mpsc::channel::<()>();
        let (release, _) = held_op(&engine, &v, move |_| Ok(ran.send(())?));
        let queued = engine.push(&[&v], &[], |_| Ok::<_, BoxError>(1)).unwrap();
        let err = engine.shutdown_timeout(SHORT).unwrap_err();
        assert_timed_out_with_in_flight(&err, 2);
        // Shut down all the same: no new pushes.
        assert!(matches!(
            engine.push(&[], &[&v], |_| Ok::<_, BoxError>(())),
            Err(Error::ShutDown)
        ));
        // The last handle's drop no longer waits for the stuck op.
        drop(engine);
        // The ops pushed before still run to the end.
        release.send(()).unwrap();
        finished.recv_timeout(LONG).unwrap();
        assert_eq!(queued.wait().unwrap(), 1);
    });
}

#[test]
fn a_shutdown_in_time_is_ok() {
    within(HUNG, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.var(0u32);
        let k = v.key();
        for _ in 0..10 {
            engine
                .push(&[], &[&v], move |ctx| -> Result<(), BoxError> {
                    *ctx.write(k)? += 1;
                    Ok(())
                })
                .unwrap();
        }
        engine.shutdown_timeout(LONG).unwrap();
        assert_eq!(v.version(), 10);
        drop(engine);
    });
}

#[test]
fn a_timed_wait_inside_an_op_is_refused() {
    within(HUNG, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let (a, b) = (engine.new_var(), engine.new_var());
        let (release, slow) = held_op(&engine, &a, |_| Ok(()));
        let mut slow = Some(slow);
        let inside = engine
            .push(&[], &[&b], move |_| -> Result<bool, BoxError> {
                let slow = slow.as_mut().unwrap();
                let refused = matches!(slow.wait_timeout(LONG), Err(Error::BlockingInOp));
                release.send(())?;
                Ok(refused)
            })
            .unwrap();
        assert!(inside.wait().unwrap());
        engine.wait_all().wait().unwrap();
    });
}

/// A value whose drop waits for an op: kept in a thread-local, it waits as
/// its thread exits.
struct WaitsOnDrop(Option<(Engine, mpsc::Sender<u32>)>);

impl Drop for WaitsOnDrop {
    fn drop(&mut self) {
        let Some((engine, done)) = self.0.take() else {
            return;
        };
        let v = engine.var(41_u32);
        let k = v.key();
        let out = engine
            .push(&[], &[&v], move |ctx| {
                *ctx.write(k)? += 1;
                Ok(*ctx.read(k)?)
            })
            .unwrap()
            .wait()
            .unwrap();
        done.send(out).unwrap();
    }
}

thread_local! {
    static WAITS_AT_EXIT: std::cell::RefCell<WaitsOnDrop> =
        const { std::cell::RefCell::new(WaitsOnDrop(None)) };
}

#[test]
fn a_wait_in_a_thread_locals_destructor_completes() {
    // A blocking wait keeps its waker in a thread-local: as a thread exits it
    // may be gone before another thread-local's destructor waits. Both
    // orders of first use, so that one thread sees each.
    within(HUNG, || {
        let engine = Engine::new();
        let (done, results) = mpsc::channel();
        let threads: Vec<_> = [false, true]
            .into_iter()
            .map(|waited_first| {
                let (engine, done) = (engine.clone(), done.clone());
                std::thread::spawn(move || {
                    let v = engine.var(0_u32);
                    let wait = || engine.push(&[&v], &[], |_| Ok(())).unwrap().wait().unwrap();
                    if waited_first {
                        wait();
                    }
                    WAITS_AT_EXIT.with(|w| w.borrow_mut().0 = Some((engine.clone(), done)));
                    if !waited_first {
                        wait();
                    }
                })
            })
            .collect();
        drop(done);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(results.iter().collect::<Vec<_>>(), [42, 42]);
    });
}

/// This thread's voluntary context switches so far: each park that
/// sleeps is one (Linux).
#[cfg(target_os = "linux")]
fn voluntary_switches() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A blocking wait on an op of the engine (the op's handle, or the engine).
#[cfg(target_os = "linux")]
type LongWait = fn(&Engine, depflow::OpHandle<()>);

/// How often the calling thread wakes while `wait` blocks on an op of
/// `LONG_OP` (the op is pushed first, by this thread, so that it is one of
/// the thread's own ops still to free).
#[cfg(target_os = "linux")]
fn wakes_in_a_long_wait(wait: LongWait) -> u64 {
    const LONG_OP: Duration = Duration::from_millis(500);
    let engine = Engine::builder().threads(1).build().unwrap();
    let v = engine.new_var();
    let long = engine
        .push(&[], &[&v], |_| {
            std::thread::sleep(LONG_OP);
            Ok(())
        })
        .unwrap();
    let before = voluntary_switches();
    let started = std::time::Instant::now();
    wait(&engine, long);
    let wakes = voluntary_switches() - before;
    assert!(started.elapsed() >= LONG_OP * 9 / 10, "the op was not long");
    wakes
}

/// A blocked wait sleeps until what it waits for is done (or its deadline
/// passes): it does not wake to look for finished ops to free meanwhile
/// once a look found none (issue 35: a wait of 1 s woke about 105 times,
/// every 10 ms; here about 57 times for each of these waits of 500 ms).
#[cfg(target_os = "linux")]
#[test]
fn a_blocked_wait_wakes_only_when_its_op_is_done() {
    within(HUNG, || {
        let waits: [(&str, LongWait); 4] = [
            ("OpHandle::wait", |_, op| op.wait().unwrap()),
            ("OpHandle::wait_timeout", |_, mut op| {
                op.wait_timeout(LONG).unwrap();
            }),
            ("Wait::wait (wait_all)", |engine, _| {
                engine.wait_all().wait().unwrap();
            }),
            ("Wait::wait_timeout (shutdown)", |engine, _| {
                engine.shutdown().wait_timeout(LONG).unwrap();
            }),
        ];
        for (name, wait) in waits {
            let wakes = wakes_in_a_long_wait(wait);
            assert!(wakes < 10, "{name}: {wakes} wakes in one wait of 500 ms");
        }
    });
}
