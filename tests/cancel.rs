//! What `OpHandle::cancel` answers, and `OpHandle::is_started` (issue 29,
//! item 5): a cancel racing the op's start answers exactly whether the body
//! ran, on every start path (a pool op, an op with units, an async body, a
//! stream op); a started async op runs to its end; an op that never runs
//! (cancelled, skipped on a poisoned input) answers true, before and after
//! it finished.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::within;
use depflow::{BoxError, Engine, Error, Executor, OpHandle, Var};

/// Checks one raced op: `not_run` (what `cancel` answered) against whether
/// the body ran, the handle's result and `is_started`.
fn check(op: OpHandle<()>, not_run: bool, ran: &AtomicBool, what: &str) {
    // The op is over once its result is in; `ran` is final then.
    let started_after = {
        let mut op = op;
        let result = futures::executor::block_on(&mut op);
        let ran = ran.load(SeqCst);
        assert_eq!(
            not_run, !ran,
            "{what}: cancel answered {not_run}, ran {ran}"
        );
        match result {
            Ok(()) => assert!(ran, "{what}: succeeded without running"),
            Err(Error::Cancelled) => assert!(!ran, "{what}: cancelled, but ran"),
            Err(e) => panic!("{what}: {e:?}"),
        }
        // After the result was taken, the handle still knows.
        assert_eq!(op.cancel(), not_run, "{what}: a second cancel");
        op.is_started()
    };
    assert_eq!(started_after, !not_run, "{what}: is_started");
}

/// Pushes `n` ops with `push`, each behind a gate (an op holding a
/// variable it reads), opens the gate and cancels the op as it may be
/// starting, after a spin of up to 49 `step`s: each outcome must match
/// `cancel`'s answer.
fn race(
    engine: &Engine,
    what: &str,
    n: u32,
    step: Duration,
    push: impl Fn(&Var, Arc<AtomicBool>) -> OpHandle<()>,
) {
    let (mut cancelled, mut ran) = (0, 0);
    for i in 0..n {
        let gate = engine.new_var();
        let (open, opened) = mpsc::channel::<()>();
        engine
            .push(&[], &[&gate], move |_| Ok(opened.recv()?))
            .unwrap();
        let flag = Arc::new(AtomicBool::new(false));
        let op = push(&gate, flag.clone());
        open.send(()).unwrap();
        let until = Instant::now() + step * (i % 50);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        let not_run = op.cancel();
        match not_run {
            true => cancelled += 1,
            false => ran += 1,
        }
        check(op, not_run, &flag, what);
    }
    // (Not asserted: on a loaded machine one outcome may take them all.)
    eprintln!("{what}: {cancelled} cancelled, {ran} ran");
}

#[test]
fn a_cancel_racing_the_start_answers_whether_a_pool_op_ran() {
    within(120, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        race(
            &engine,
            "pool op",
            3000,
            Duration::from_micros(4),
            |gate, flag| {
                // A variable of its own: a cancelled op poisons what it mutates.
                let v = engine.new_var();
                engine
                    .push(&[gate], &[&v], move |_| {
                        flag.store(true, SeqCst);
                        Ok(())
                    })
                    .unwrap()
            },
        );
        engine.wait_all().wait().unwrap();
    });
}

/// An op with units is checked for poison when it becomes ready, and only
/// starts when it runs: the cancel races that start.
#[test]
fn a_cancel_racing_the_start_answers_whether_an_op_with_units_ran() {
    within(120, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let slots = engine.new_resource("slots", 2);
        race(
            &engine,
            "op with units",
            3000,
            Duration::from_micros(4),
            |gate, flag| {
                let v = engine.new_var();
                engine
                    .op()
                    .reads(&[gate])
                    .mutates(&[&v])
                    .uses(&slots, 1)
                    .run(move |_| {
                        flag.store(true, SeqCst);
                        Ok(())
                    })
                    .unwrap()
            },
        );
        engine.wait_all().wait().unwrap();
        assert_eq!(slots.in_use(), 0);
    });
}

#[test]
fn a_cancel_racing_the_start_answers_whether_an_async_op_ran() {
    within(120, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        race(
            &engine,
            "async op",
            3000,
            Duration::from_micros(4),
            |gate, flag| {
                let v = engine.new_var();
                engine
                    .push_async(&[gate], &[&v], move |_ctx| async move {
                        flag.store(true, SeqCst);
                        Ok::<_, BoxError>(())
                    })
                    .unwrap()
            },
        );
        engine.wait_all().wait().unwrap();
    });
}

#[test]
fn a_cancel_racing_the_start_answers_whether_a_stream_op_ran() {
    within(120, || {
        let engine = Engine::builder()
            .device("gpu", Executor::simulated_gpu(1))
            .build()
            .unwrap();
        let gpu = engine.device("gpu").unwrap();
        race(
            &engine,
            "stream op",
            1000,
            Duration::from_micros(40),
            |gate, flag| {
                let v = engine.new_var();
                engine
                    .op()
                    .on(gpu)
                    .reads(&[gate])
                    .mutates(&[&v])
                    .run(move |_| {
                        flag.store(true, SeqCst);
                        Ok(())
                    })
                    .unwrap()
            },
        );
        engine.wait_all().wait().unwrap();
    });
}

/// An async op whose body has started cannot be cancelled: `cancel`
/// answers false, and the body runs to its end across its await points.
#[test]
fn a_started_async_op_runs_to_its_end() {
    within(60, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let v = engine.var(0u32);
        let (began_tx, began_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = futures::channel::oneshot::channel::<()>();
        let k = v.key();
        let op = engine
            .push_async(&[], &[&v], move |ctx| async move {
                began_tx.send(())?;
                go_rx.await?; // an await point: not where a cancel lands
                *ctx.write(k)? = 7;
                Ok::<_, BoxError>(5u32)
            })
            .unwrap();
        began_rx.recv().unwrap();
        assert!(op.is_started());
        assert!(!op.cancel(), "a started async op reported cancelled");
        go_tx.send(()).unwrap();
        assert_eq!(op.wait().unwrap(), 5);
        assert_eq!(engine.get(&v).wait().unwrap(), 7);
    });
}

/// An op skipped on a poisoned input never runs: `cancel` answers true,
/// before it is skipped (it is cancelled then) and after (it keeps its
/// poison); `is_started` is false either way.
#[test]
fn an_op_that_never_runs_answers_true() {
    within(60, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let v = engine.new_var();
        engine
            .push(&[], &[&v], |_| -> Result<(), BoxError> {
                Err("boom".into())
            })
            .unwrap();
        let skipped = engine.push(&[&v], &[], |_| Ok(())).unwrap();
        engine.wait_all().wait().unwrap_err();
        assert!(skipped.is_finished());
        assert!(!skipped.is_started());
        assert!(skipped.cancel(), "a skipped op's body will not run");
        assert!(!skipped.is_started());
        assert!(matches!(skipped.wait(), Err(Error::Poisoned { .. })));

        // Cancelled while it waits for a held variable: true, and again.
        let gate = engine.new_var();
        let (tx, rx) = mpsc::channel::<()>();
        engine.push(&[], &[&gate], move |_| Ok(rx.recv()?)).unwrap();
        let late = engine.push(&[&gate], &[], |_| Ok(())).unwrap();
        assert!(!late.is_started());
        assert!(late.cancel());
        assert!(late.cancel());
        tx.send(()).unwrap();
        engine.wait_all().wait().unwrap();
        assert!(late.cancel());
        assert!(!late.is_started());
        assert!(matches!(late.wait(), Err(Error::Cancelled)));
    });
}

/// A finished op that ran: `is_started` stays true, before and after its
/// result is taken, and `cancel` answers false.
#[test]
fn a_finished_op_stays_started() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let v = engine.new_var();
    let mut op = engine.push(&[], &[&v], |_| Ok(3)).unwrap();
    engine.wait_all().wait().unwrap();
    assert!(op.is_finished());
    assert!(op.is_started());
    assert!(!op.cancel());
    assert_eq!(futures::executor::block_on(&mut op).unwrap(), 3);
    assert!(op.is_started());
    assert!(!op.cancel());
}

/// Issue 35, item 1: an op parked for its units (its variables granted
/// it, its units held by a blocked op) finishes at once when cancelled,
/// taking no units, instead of staying parked until they free; what it
/// mutates is poisoned, the next op on its variable goes on, and once the
/// blocker ends the units are all back.
#[test]
fn cancelling_an_op_parked_for_units_finishes_it_at_once() {
    within(60, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let slot = engine.new_resource("slot", 1);
        let (release, gate) = mpsc::channel::<()>();
        let held = engine.new_var();
        let holder = engine
            .op()
            .mutates(&[&held])
            .uses(&slot, 1)
            .run(move |_| Ok(gate.recv()?))
            .unwrap();
        while !holder.is_started() {
            std::thread::yield_now();
        }
        let v = engine.new_var();
        let ran = Arc::new(AtomicBool::new(false));
        let mut parked = engine
            .op()
            .mutates(&[&v])
            .uses(&slot, 1)
            .run({
                let ran = ran.clone();
                move |_| {
                    ran.store(true, SeqCst);
                    Ok(())
                }
            })
            .unwrap();
        // Its variable granted it: it waits for the slot only.
        let mut after = engine.push(&[], &[&v], |_| Ok(())).unwrap();
        assert!(parked.cancel());
        match parked.wait_timeout(Duration::from_secs(3)) {
            Err(Error::Cancelled) => {}
            other => panic!("a cancelled op parked for units: {other:?}"),
        }
        // It handed `v` on (poisoned, as by any cancel) without the slot.
        assert!(matches!(
            after.wait_timeout(Duration::from_secs(3)),
            Err(Error::Poisoned { .. })
        ));
        assert_eq!(slot.in_use(), 1, "the holder still has the slot");
        release.send(()).unwrap();
        holder.wait().unwrap();
        engine.wait_all().wait().unwrap();
        assert!(!ran.load(SeqCst));
        assert_eq!(slot.in_use(), 0);
    });
}

/// A parked op that allocates (lasting units, which wait for every older
/// request's turn) gives up its place in line when cancelled: a younger
/// allocation behind it is granted once the units free, not held forever
/// behind the cancelled op's ticket.
#[test]
fn a_cancelled_parked_allocation_gives_up_its_turn() {
    within(60, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let memory = engine.new_resource("memory", 1);
        let (release, gate) = mpsc::channel::<()>();
        let held = engine.new_var();
        let holder = engine
            .op()
            .mutates(&[&held])
            .uses(&memory, 1)
            .run(move |_| Ok(gate.recv()?))
            .unwrap();
        while !holder.is_started() {
            std::thread::yield_now();
        }
        let (older, younger) = (engine.new_var(), engine.new_var());
        let mut cancelled = engine
            .op()
            .mutates(&[&older])
            .allocates(&memory, 1, &older)
            .run(|_| Ok(()))
            .unwrap();
        let mut next = engine
            .op()
            .mutates(&[&younger])
            .allocates(&memory, 1, &younger)
            .run(|_| Ok(()))
            .unwrap();
        assert!(cancelled.cancel());
        assert!(matches!(
            cancelled.wait_timeout(Duration::from_secs(3)),
            Err(Error::Cancelled)
        ));
        release.send(()).unwrap();
        next.wait_timeout(Duration::from_secs(3)).unwrap();
        assert_eq!(memory.in_use(), 1, "`younger` holds its allocation");
        engine.delete_var(&younger, drop).unwrap().wait().unwrap();
        assert_eq!(memory.in_use(), 0);
    });
}

/// The `Cycle` docs' remedy for a units deadlock: cancel one of its ops.
/// Here `use` waits for units that `buf` holds, which only the delete
/// pushed after it gives back, and the delete waits for `use` through
/// `buf`; cancelling `use` lets the delete run and the units come back.
#[test]
fn cancelling_one_op_breaks_a_units_deadlock() {
    within(60, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let memory = engine.new_resource("memory", 1);
        let buf = engine.new_var();
        common::units::allocate(&engine, &memory, 1, &buf);
        let out = engine.new_var();
        let mut stuck = engine
            .op()
            .reads(&[&buf])
            .mutates(&[&out])
            .uses(&memory, 1)
            .run(|_| Ok(()))
            .unwrap();
        let mut delete = engine.delete_var(&buf, drop).unwrap();
        assert!(matches!(
            delete.wait_timeout(Duration::from_millis(100)),
            Err(Error::TimedOut { .. })
        ));
        assert!(stuck.cancel());
        assert!(matches!(
            stuck.wait_timeout(Duration::from_secs(3)),
            Err(Error::Cancelled)
        ));
        delete.wait_timeout(Duration::from_secs(3)).unwrap();
        assert_eq!(memory.in_use(), 0);
    });
}

/// Issue 35, item 2: the engine's own ops poison nothing when cancelled. A
/// cancelled `clear_poison` leaves its variable as it was: a healthy one
/// healthy (its value intact), a poisoned one poisoned by the original
/// failure, not by the cancel. A cancelled `delete_var` leaves its
/// variable deleted (later pushes are refused) but not poisoned, and
/// `wait_all` reports neither.
#[test]
fn cancelled_own_ops_poison_nothing() {
    within(60, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let gate = engine.new_var();
        let (release, held) = mpsc::channel::<()>();
        // Holds `gate`; each op below waits behind it through its variable.
        let (v, w) = (engine.var(7), engine.var(1));
        engine
            .push(&[], &[&gate, &v, &w], move |_| Ok(held.recv()?))
            .unwrap();
        let failing = engine
            .push(&[], &[&w], |_| Err::<(), _>("bad batch".into()))
            .unwrap();
        let clear_healthy = engine.clear_poison(&v).unwrap();
        let clear_poisoned = engine.clear_poison(&w).unwrap();
        assert!(clear_healthy.cancel());
        assert!(clear_poisoned.cancel());
        release.send(()).unwrap();
        assert!(failing.wait().is_err());
        assert!(matches!(clear_healthy.wait(), Err(Error::Cancelled)));
        assert!(matches!(clear_poisoned.wait(), Err(Error::Cancelled)));
        assert_eq!(
            engine.get(&v).wait().unwrap(),
            7,
            "a healthy variable stays so"
        );
        match engine.get(&w).wait() {
            Err(Error::Poisoned { cause, .. }) => {
                assert!(
                    cause.to_string().contains("bad batch"),
                    "the original failure stays: {cause}"
                );
            }
            other => panic!("{other:?}"),
        }
        match engine.wait_all().wait() {
            Err(Error::Failures { count: 1, .. }) => {} // `failing` only
            other => panic!("{other:?}"),
        }

        // A cancelled delete: the variable stays deleted, its value with
        // it until its last handle goes, and nothing is reported.
        let (release, held) = mpsc::channel::<()>();
        let x = engine.var(3);
        engine
            .push(&[], &[&gate, &x], move |_| Ok(held.recv()?))
            .unwrap();
        let delete = engine.delete_var(&x, drop).unwrap();
        assert!(delete.cancel());
        release.send(()).unwrap();
        assert!(matches!(delete.wait(), Err(Error::Cancelled)));
        assert!(matches!(engine.get(&x).wait(), Err(Error::Deleted(_))));
        engine.wait_all().wait().unwrap();
    });
}
