//! Handles and what finished ops give back: a dropped variable's value and
//! units go when its last op completes, whatever its pusher does next;
//! "finished" means the same for a handle and for `wait_all`; cancelling;
//! `Engine::get`; builders whose declarations add up; fused futures.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::held::held_op;
use common::units::allocate;
use common::{DropCount, within};
use depflow::{Engine, Error};
use futures::FutureExt;
use futures::future::FusedFuture;

/// Polls `cond` (without touching any engine) until it holds or `secs` pass.
fn eventually(secs: u64, cond: impl Fn() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    cond()
}

#[test]
fn a_dropped_variable_gives_its_units_back_while_its_pusher_idles() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let mem = engine.new_resource("mem", 1);
    let x = engine.var(0u8);
    let allocate = engine
        .op()
        .mutates(&[&x])
        .allocates(&mem, 1, &x)
        .run(|_| Ok(()))
        .unwrap();
    // Awaited elsewhere: this thread, its pusher, does not touch it again.
    std::thread::spawn(move || allocate.wait())
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(mem.in_use(), 1);
    drop(x); // the op still holds the variable, and with it the unit
    // Another thread needs the unit; this one (the pusher) stays idle, not
    // touching the engine, until the other is done.
    let (e, m, y) = (engine.clone(), mem.clone(), engine.new_var());
    let other = std::thread::spawn(move || {
        e.op()
            .mutates(&[&y])
            .uses(&m, 1)
            .run(|_| Ok(()))
            .unwrap()
            .wait()
    });
    assert!(
        eventually(10, || other.is_finished()),
        "the unit of a dropped variable did not come back while its pusher idled"
    );
    other.join().unwrap().unwrap();
    assert_eq!(mem.in_use(), 0);
}

#[test]
fn a_dropped_variable_frees_its_value_when_its_last_op_completes() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let drops = DropCount::default();
    let x = engine.var(drops.token());
    let gate = engine.new_var();
    let (tx, _) = held_op(&engine, &gate, |_| Ok(()));
    engine.push(&[&gate, &x], &[], |_| Ok(())).unwrap();
    drop(x);
    assert_eq!(drops.dropped(), 0, "an op still needs the value");
    // A worker completes the last op; this thread stays away from the engine.
    let releaser = std::thread::spawn(move || tx.send(()).unwrap());
    assert!(
        eventually(10, || drops.dropped() == 1),
        "the value outlived its last op while its pusher idled"
    );
    releaser.join().unwrap();
}

#[test]
fn values_of_dropped_variables_do_not_pile_up_on_a_busy_pusher() {
    // The pusher keeps pushing and waiting; each variable it drops is freed
    // by the time the op that used it is waited for.
    let engine = Engine::builder().threads(2).build().unwrap();
    let drops = DropCount::default();
    let keep = engine.new_var();
    // A long op pushed first by this thread, never finished during the loop:
    // before, nothing behind it in this thread's list was ever freed.
    let (tx, _) = held_op(&engine, &keep, |_| Ok(()));
    for i in 0..300 {
        let x = engine.var(drops.token());
        engine.push(&[], &[&x], |_| Ok(())).unwrap().wait().unwrap();
        drop(x);
        assert!(
            eventually(10, || drops.dropped() == i + 1),
            "value {i} still alive"
        );
    }
    tx.send(()).unwrap();
}

#[test]
fn a_handle_is_finished_once_wait_all_returns() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let v = engine.new_var();
    for i in 0..2000 {
        let handle = engine.push(&[], &[&v], |_| Ok(())).unwrap();
        engine.wait_all().wait().unwrap();
        assert!(handle.is_finished(), "try {i}: not finished after wait_all");
    }
}

#[test]
fn a_cancelled_op_does_not_run_and_poisons_its_outputs() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let (gate, out) = (engine.new_var(), engine.var(0));
    let (tx, _) = held_op(&engine, &gate, |_| Ok(()));
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let k = out.key();
    let cancelled = engine
        .push(&[&gate], &[&out], move |ctx| {
            r.store(true, SeqCst);
            *ctx.write(k)? = 1;
            Ok(())
        })
        .unwrap();
    cancelled.cancel();
    tx.send(()).unwrap();
    assert!(matches!(cancelled.wait(), Err(Error::Cancelled)));
    assert!(!ran.load(SeqCst), "a cancelled op ran");
    match engine.get(&out).wait() {
        Err(Error::Poisoned { cause, .. }) => assert!(cause.to_string().contains("cancelled")),
        other => panic!("{other:?}"),
    }
    // Asked for, so not a failure to report.
    engine.wait_all().wait().unwrap();
    engine.clear_poison(&out).unwrap();
    assert_eq!(engine.get(&out).wait().unwrap(), 0);
}

#[test]
fn a_cancelled_op_takes_no_units() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let mem = engine.new_resource("mem", 1);
    let (gate, v) = (engine.new_var(), engine.new_var());
    let (tx, _) = held_op(&engine, &gate, |_| Ok(()));
    let op = engine
        .op()
        .reads(&[&gate])
        .mutates(&[&v])
        .allocates(&mem, 1, &v)
        .run(|_| Ok(()))
        .unwrap();
    op.cancel();
    tx.send(()).unwrap();
    assert!(matches!(op.wait(), Err(Error::Cancelled)));
    assert_eq!(mem.in_use(), 0);
}

#[test]
fn cancelling_a_started_op_lets_it_finish() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let v = engine.var(0);
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let k = v.key();
    let running = engine
        .push(&[], &[&v], move |ctx| {
            started_tx.send(())?;
            go_rx.recv()?;
            *ctx.write(k)? = 7;
            Ok(5)
        })
        .unwrap();
    started_rx.recv().unwrap();
    running.cancel();
    go_tx.send(()).unwrap();
    assert_eq!(running.wait().unwrap(), 5);
    assert_eq!(engine.get(&v).wait().unwrap(), 7);
}

#[test]
fn get_returns_the_value_after_pending_writes() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let v = engine.var(Vec::new());
    let k = v.key();
    for i in 0..100 {
        engine
            .push(&[], &[&v], move |ctx| {
                ctx.write(k)?.push(i);
                Ok(())
            })
            .unwrap();
    }
    let got = engine.get(&v).wait().unwrap();
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    // Awaitable too; and refused input resolves to the error.
    assert_eq!(
        futures::executor::block_on(engine.get(&v)).unwrap().len(),
        100
    );
    let other = Engine::builder().threads(1).build().unwrap();
    assert!(matches!(other.get(&v).wait(), Err(Error::ForeignVar(_))));
}

#[test]
fn builder_declarations_add_up() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let (a, b, out) = (engine.var(1), engine.var(2), engine.var(0));
    let (ka, kb, ko) = (a.key(), b.key(), out.key());
    // Split across statements, two `reads` calls: both count.
    let mut op = engine.op().name("sum").reads(&[&a]);
    op = op.reads(&[&b]);
    op = op.mutates(&[&out]);
    op.run(move |ctx| {
        *ctx.write(ko)? = *ctx.read(ka)? + *ctx.read(kb)?;
        Ok(())
    })
    .unwrap()
    .wait()
    .unwrap();
    assert_eq!(engine.get(&out).wait().unwrap(), 3);
}

#[test]
fn handles_and_waits_are_fused() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let v = engine.new_var();
    let mut handle = engine.push(&[], &[&v], |_| Ok(1)).unwrap();
    let mut all = engine.wait_all();
    within(10, move || {
        futures::executor::block_on(async {
            let mut got = 0;
            let mut waited = false;
            // A select! loop polls each future until it is terminated.
            while !(handle.is_terminated() && all.is_terminated()) {
                futures::select! {
                    r = handle => got = r.unwrap(),
                    r = all => { r.unwrap(); waited = true; }
                }
            }
            assert_eq!((got, waited), (1, true));
            // Polled again after completion: pending, not a panic.
            assert!((&mut handle).now_or_never().is_none());
            assert!((&mut all).now_or_never().is_none());
        })
    });
}

/// This thread's voluntary context switches so far (Linux).
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

#[cfg(target_os = "linux")]
#[test]
fn a_blocking_wait_on_a_long_op_parks_instead_of_polling() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let v = engine.new_var();
    let long = engine
        .push(&[], &[&v], |_| {
            std::thread::sleep(Duration::from_millis(500));
            Ok(())
        })
        .unwrap();
    let before = voluntary_switches();
    long.wait().unwrap();
    let switches = voluntary_switches() - before;
    // Polling every 100 µs made about 2700 here (5400 for a 1 s op).
    assert!(switches < 500, "{switches} wakes for one 500 ms wait");
}

#[test]
fn a_training_loop_behind_a_long_op_keeps_getting_its_units() {
    // Each step allocates 1 of 2 units for a buffer and drops it; a loader
    // op pushed first by the same thread runs all along. Before, the dropped
    // buffers stayed alive behind the loader in this thread's list: 2 of 5
    // steps ran, then the third waited for units forever.
    within(20, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let mem = engine.new_resource("mem", 2);
        let loader = engine.new_var();
        let (tx, _) = held_op(&engine, &loader, |_| Ok(()));
        for _ in 0..5 {
            let buffer = engine.var(vec![0u8; 1024]);
            allocate(&engine, &mem, 1, &buffer);
            drop(buffer);
        }
        tx.send(()).unwrap();
        engine.wait_all().wait().unwrap();
        assert_eq!(mem.in_use(), 0);
    });
}
