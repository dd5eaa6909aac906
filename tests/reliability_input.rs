//! Issue 15, bad input and surprising waits: unit sums that overflow, device
//! names with NUL bytes, "inside an op" checks that mixed up engines,
//! `wait_for_var` on an idle variable waiting for a worker, a refused
//! `delete_var` that still deleted, `when_room` inside an op, and `OpCtx::read`
//! on an op with very many variables.
//!
//! (Item 18, a `wait_for_var` that loses a race with a `delete_var`, has its
//! deterministic test next to the code, in `engine/facade.rs`: losing the
//! race on purpose needs the crate's internals.)

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::held::held_op;
use common::within;
use depflow::{AnyVar, BoxError, Engine, Error, Executor, Var, VarKey};
use futures::FutureExt;

/// A one-thread engine whose worker is stuck in an op until `release` is
/// sent (returned); the op has started when this returns.
fn busy_engine(builder: depflow::EngineBuilder) -> (Engine, mpsc::Sender<()>) {
    let engine = builder.threads(1).build().unwrap();
    let gate_var = engine.new_var();
    let (release, gate) = mpsc::channel::<()>();
    let (started_tx, started) = mpsc::channel::<()>();
    engine
        .push(&[], &[&gate_var], move |_| -> Result<(), BoxError> {
            started_tx.send(())?;
            gate.recv()?;
            Ok(())
        })
        .unwrap();
    started
        .recv_timeout(Duration::from_secs(10))
        .expect("the gate op started");
    (engine, release)
}

// ---- item 6: unit sums that overflow ----

#[test]
fn units_whose_sum_overflows_are_over_capacity() {
    within(10, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let memory = engine.new_resource("mem", 4);
        let v = engine.new_var();
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let pushed = engine
            .op()
            .mutates(&[&v])
            .uses(&memory, u64::MAX)
            .uses(&memory, 2)
            .run(move |_| {
                flag.store(true, SeqCst);
                Ok(())
            });
        match pushed {
            Err(Error::OverCapacity {
                resource,
                requested,
                capacity,
            }) => {
                assert_eq!(resource, "mem");
                assert_eq!(requested, u64::MAX);
                assert_eq!(capacity, 4);
            }
            other => panic!("expected OverCapacity, got {other:?}"),
        }
        // The same through allocations, and mixed.
        let allocated = engine
            .op()
            .mutates(&[&v])
            .allocates(&memory, 3, &v)
            .allocates(&memory, u64::MAX - 1, &v)
            .run(|_| Ok(()));
        assert!(
            matches!(
                allocated,
                Err(Error::OverCapacity {
                    requested: u64::MAX,
                    ..
                })
            ),
            "{allocated:?}"
        );
        let mixed = engine
            .op()
            .mutates(&[&v])
            .uses(&memory, 2)
            .allocates(&memory, u64::MAX, &v)
            .run(|_| Ok(()));
        assert!(
            matches!(mixed, Err(Error::OverCapacity { .. })),
            "{mixed:?}"
        );
        engine.wait_all().wait().unwrap();
        assert!(!ran.load(SeqCst), "an op over capacity ran");
        assert_eq!(memory.in_use(), 0);
    });
}

// ---- item 7: device names with NUL bytes ----

#[test]
fn a_device_name_with_a_nul_byte_is_a_config_error() {
    within(10, || {
        type MakeExecutor = fn() -> Executor;
        let executors: [(&str, MakeExecutor); 3] = [
            ("pool", || Executor::pool(1)),
            ("simulated gpu", || Executor::simulated_gpu(1)),
            ("inline", Executor::inline),
        ];
        for (kind, executor) in executors {
            let built =
                std::panic::catch_unwind(|| Engine::builder().device("gpu\0", executor()).build());
            match built {
                Ok(Err(Error::Config(msg))) => {
                    assert!(msg.contains("NUL"), "{kind}: {msg}");
                }
                Ok(other) => panic!("{kind}: expected Error::Config, got {other:?}"),
                Err(_) => panic!("{kind}: build() panicked"),
            }
        }
    });
}

// ---- item 8: "inside an op" is per engine ----

#[test]
fn an_op_may_await_another_engines_wait_all_and_shutdown() {
    within(10, || {
        let a = Engine::builder().threads(1).build().unwrap();
        let b = Engine::builder().threads(1).build().unwrap();
        let vb = b.new_var();
        b.push(&[], &[&vb], |_| {
            std::thread::sleep(Duration::from_millis(20));
            Ok(())
        })
        .unwrap();
        let va = a.new_var();
        let (a2, b2) = (a.clone(), b.clone());
        let awaited = a
            .push_async(&[], &[&va], move |_| async move {
                let other = b2.wait_all().await;
                // Its own engine's wait_all would wait for this very op.
                let own = a2.wait_all().await;
                let shutdown = b2.shutdown().await;
                Ok::<_, BoxError>((other, own, shutdown))
            })
            .unwrap();
        let (other, own, shutdown) = awaited.wait().unwrap();
        assert!(other.is_ok(), "another engine's wait_all: {other:?}");
        assert!(
            matches!(own, Err(Error::WaitsForItself)),
            "its own engine's wait_all: {own:?}"
        );
        assert!(shutdown.is_ok(), "another engine's shutdown: {shutdown:?}");
        assert!(matches!(
            b.push(&[], &[&vb], |_| Ok(())),
            Err(Error::ShutDown)
        ));
        // Shutting down its own engine from inside an op still refuses the wait.
        let a3 = a.clone();
        let own_shutdown = a
            .push_async(&[], &[&va], move |_| async move {
                Ok::<_, BoxError>(a3.shutdown().await)
            })
            .unwrap()
            .wait()
            .unwrap();
        assert!(matches!(own_shutdown, Err(Error::WaitsForItself)));
    });
}

#[test]
fn blocking_on_another_engine_inside_an_op_is_still_refused() {
    within(10, || {
        let a = Engine::builder().threads(1).build().unwrap();
        let (b, release) = busy_engine(Engine::builder());
        let va = a.new_var();
        let b2 = b.clone();
        let blocked = a
            .push(&[], &[&va], move |_| Ok(b2.wait_all().wait()))
            .unwrap()
            .wait()
            .unwrap();
        assert!(matches!(blocked, Err(Error::BlockingInOp)), "{blocked:?}");
        release.send(()).unwrap();
    });
}

// ---- item 9: wait_for_var on an idle variable ----

#[test]
fn waiting_for_an_idle_variable_needs_no_free_worker() {
    within(20, || {
        let (engine, release) = busy_engine(Engine::builder());
        let idle = engine.var(5);
        let mut wait = engine.wait_for_var(&idle);
        // The only worker is stuck: the wait must not need it.
        let waited = wait.wait_timeout(Duration::from_secs(5));
        release.send(()).unwrap();
        assert!(waited.is_ok(), "{waited:?}");
        engine.wait_all().wait().unwrap();
    });
}

#[test]
fn waiting_for_a_variable_still_waits_for_its_mutations() {
    within(20, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let v = engine.var(0u32);
        let k = v.key();
        let (release, _) = held_op(&engine, &v, move |ctx| {
            *ctx.write(k)? = 7;
            Ok(())
        });
        let mut wait = engine.wait_for_var(&v);
        assert!(matches!(
            wait.wait_timeout(Duration::from_millis(50)),
            Err(Error::TimedOut { .. })
        ));
        release.send(()).unwrap();
        wait.wait().unwrap();
        assert_eq!(v.version(), 1);
        // Poison still comes through, from the mutation before the wait.
        engine
            .push(&[], &[&v], |_| Err::<(), _>("bad".into()))
            .unwrap();
        assert!(matches!(
            engine.wait_for_var(&v).wait(),
            Err(Error::Poisoned { .. })
        ));
        assert!(engine.wait_all().wait().is_err());
        engine.clear_poison(&v).unwrap();
        engine.wait_for_var(&v).wait().unwrap();
    });
}

#[test]
fn a_pending_wait_for_var_does_not_count_toward_max_in_flight() {
    within(20, || {
        let (engine, release) = busy_engine(Engine::builder().max_in_flight(3));
        let v = engine.new_var();
        // Queued behind the stuck op on the only worker.
        engine.push(&[], &[&v], |_| Ok::<_, BoxError>(())).unwrap();
        let wait = engine.wait_for_var(&v);
        // In flight: the stuck op and the one behind it; the wait is not an
        // op of the user's, and takes no room.
        let other = engine.new_var();
        let room = engine.op().mutates(&[&other]).when_room().now_or_never();
        assert!(
            matches!(room, Some(Ok(_))),
            "no room: the engine's own wait counted"
        );
        drop(room);
        release.send(()).unwrap();
        wait.wait().unwrap();
        engine.wait_all().wait().unwrap();
    });
}

// ---- item 13: a refused delete_var ----

#[test]
fn a_delete_refused_after_shutdown_does_not_delete() {
    within(10, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.var(5);
        engine.shutdown().wait().unwrap();
        let (tx, rx) = mpsc::channel();
        let first = engine.delete_var(&v, move |x| tx.send(x).unwrap());
        assert!(matches!(first, Err(Error::ShutDown)), "{first:?}");
        // Refused, so not deleted: a second try is refused the same way.
        let second = engine.delete_var(&v, drop);
        assert!(matches!(second, Err(Error::ShutDown)), "{second:?}");
        let push = engine.push(&[&v], &[], |_| Ok(()));
        assert!(matches!(push, Err(Error::ShutDown)), "{push:?}");
        assert!(rx.try_recv().is_err(), "the refused callback ran");
    });
}

#[test]
fn a_second_delete_is_still_refused_as_deleted() {
    within(10, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.var(5);
        let first = engine.delete_var(&v, drop).unwrap();
        assert!(matches!(
            engine.delete_var(&v, drop),
            Err(Error::Deleted(_))
        ));
        first.wait().unwrap();
        assert!(matches!(
            engine.delete_var(&v, drop),
            Err(Error::Deleted(_))
        ));
        engine.wait_all().wait().unwrap();
    });
}

// ---- item 4: when_room inside an op ----

/// An engine of one worker that lets one op in flight at a time, and two
/// variables of it.
fn one_op_at_a_time() -> (Engine, Var, Var) {
    let engine = Engine::builder()
        .threads(1)
        .max_in_flight(1)
        .build()
        .unwrap();
    let (v, w) = (engine.new_var(), engine.new_var());
    (engine, v, w)
}

#[test]
fn when_room_inside_an_op_does_not_count_the_op_itself() {
    within(10, || {
        let (engine, v, w) = one_op_at_a_time();
        let e2 = engine.clone();
        let pushed = engine
            .push_async(&[], &[&v], move |_| async move {
                let child = e2.op().mutates(&[&w]).when_room().await?.run(|_| Ok(7))?;
                Ok::<_, BoxError>(child)
            })
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(pushed.wait().unwrap(), 7);
        engine.wait_all().wait().unwrap();
    });
}

#[test]
fn when_room_inside_an_op_refuses_rather_than_waits_for_itself() {
    within(10, || {
        let (engine, v, w) = one_op_at_a_time();
        let e2 = engine.clone();
        let (v2, w2) = (v.clone(), w.clone());
        let refused = engine
            .push_async(&[], &[&v], move |_| async move {
                // A child on the op's own variable: it waits for this op, and
                // fills the bound.
                let child = e2.push(&[], &[&v2], |_| Ok(()))?;
                let room = e2.op().mutates(&[&w2]).when_room().await.map(drop);
                // Blocking from a synchronous view of it is refused the same way.
                let blocking = e2.op().mutates(&[&w2]).when_room().wait().map(drop);
                drop(child);
                Ok::<_, BoxError>((room, blocking))
            })
            .unwrap()
            .wait()
            .unwrap();
        assert!(
            matches!(refused.0, Err(Error::WaitsForItself)),
            "{refused:?}"
        );
        assert!(
            matches!(refused.1, Err(Error::WaitsForItself)),
            "{refused:?}"
        );
        engine.wait_all().wait().unwrap();
        // Outside ops, it still waits for room as before.
        engine
            .op()
            .mutates(&[&w])
            .when_room()
            .wait()
            .unwrap()
            .run(|_| Ok(()))
            .unwrap();
        engine.wait_all().wait().unwrap();
    });
}

// ---- item 19: an op reading very many variables ----

#[test]
fn an_op_reading_100000_variables_finds_each_quickly() {
    const N: u64 = 100_000;
    // Everything on `within`'s thread: on a timeout the test fails at once,
    // instead of dropping the engine here and waiting for the slow op.
    within(30, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let vars: Vec<Var<u64>> = (0..N).map(|i| engine.var(i)).collect();
        let keys: Vec<VarKey<u64>> = vars.iter().map(Var::key).collect();
        let reads: Vec<&dyn AnyVar> = vars.iter().map(|v| v as &dyn AnyVar).collect();
        let start = Instant::now();
        let sum = engine
            .push(&reads, &[], move |ctx| {
                let start = Instant::now();
                let mut sum = 0;
                for k in &keys {
                    sum += *ctx.read(*k)?;
                }
                Ok((sum, start.elapsed()))
            })
            .unwrap()
            .wait()
            .unwrap();
        eprintln!(
            "100,000 reads in one op: {:?} in the body, {:?} with the push",
            sum.1,
            start.elapsed()
        );
        assert_eq!(sum.0, N * (N - 1) / 2);
        engine.wait_all().wait().unwrap();
    });
}

#[test]
fn an_op_on_many_variables_still_checks_every_access() {
    within(20, || {
        let engine = Engine::builder().threads(1).build().unwrap();
        let written: Vec<Var<u64>> = (0..20).map(|_| engine.var(0)).collect();
        let read: Vec<Var<u64>> = (0..20).map(|i| engine.var(i)).collect();
        let stranger = engine.var(0u64);
        let (w, r): (Vec<&dyn AnyVar>, Vec<&dyn AnyVar>) = (
            written.iter().map(|v| v as &dyn AnyVar).collect(),
            read.iter().map(|v| v as &dyn AnyVar).collect(),
        );
        let (wk, rk, sk): (Vec<_>, Vec<_>, _) = (
            written.iter().map(Var::key).collect(),
            read.iter().map(Var::key).collect(),
            stranger.key(),
        );
        engine
            .push(&r, &w, move |ctx| {
                for (w, r) in wk.iter().zip(&rk) {
                    let value = *ctx.read(*r)?;
                    let mut out = ctx.write(*w)?;
                    assert!(matches!(ctx.read(*w), Err(Error::Borrowed(_))));
                    *out = value + 1;
                }
                assert!(matches!(ctx.read(sk), Err(Error::NotDeclared(_))));
                assert!(matches!(ctx.write(rk[3]), Err(Error::NotMutable(_))));
                // Shared from several threads of the body: one index.
                std::thread::scope(|s| {
                    for _ in 0..4 {
                        s.spawn(|| {
                            for r in &rk {
                                ctx.read(*r).unwrap();
                            }
                        });
                    }
                });
                Ok(())
            })
            .unwrap()
            .wait()
            .unwrap();
        for (i, v) in written.iter().enumerate() {
            assert_eq!(engine.get(v).wait().unwrap(), i as u64 + 1);
        }
    });
}
