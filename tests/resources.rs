//! Counted resources, back-pressure and diagnostics, on every executor.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::traced::tracked_engine;
use common::units::allocate;
use common::{Rng, engines, within};
use depflow::{Engine, Error, OpState, Resource, Var};

/// Units in use as the op bodies see them: a body adds its units when it
/// starts and takes its temporary ones off when it ends; a delete takes the
/// allocated ones off. Since a body starts after its grant and ends before
/// its release, this never exceeds what the broker lets out: the maximum
/// checks the broker against an account it does not keep itself.
#[derive(Clone, Default)]
struct Account {
    used: Arc<AtomicI64>,
    peak: Arc<AtomicI64>,
}

impl Account {
    fn take(&self, units: i64) {
        let now = self.used.fetch_add(units, SeqCst) + units;
        self.peak.fetch_max(now, SeqCst);
    }
    fn give(&self, units: i64) {
        self.used.fetch_sub(units, SeqCst);
    }
    fn peak(&self) -> i64 {
        self.peak.load(SeqCst)
    }
}

/// A tiny random pause, so completions happen in varied orders.
fn jitter(seed: u64) {
    let mut rng = Rng(seed);
    if rng.below(3) == 0 {
        std::thread::sleep(Duration::from_micros(rng.below(200)));
    } else {
        std::thread::yield_now();
    }
}

/// Seed 003's movement op: allocates `units` of `mem` into `buf`.
fn movement(engine: &Engine, mem: &Resource, acc: &Account, buf: &Var, units: u64, seed: u64) {
    let acc = acc.clone();
    engine
        .op()
        .name(format!("M{units}"))
        .mutates(&[buf])
        .allocates(mem, units, buf)
        .run(move |_| {
            acc.take(units as i64);
            jitter(seed);
            Ok(())
        })
        .unwrap();
}

/// Seed 003's compute op: reads `buf`, uses `units` while it runs; then the
/// buffer (holding `freed` units) is deleted.
#[allow(clippy::too_many_arguments)]
fn compute(
    engine: &Engine,
    mem: &Resource,
    acc: &Account,
    buf: &Var,
    out: &Var,
    units: u64,
    freed: u64,
    seed: u64,
    delete_now: bool,
) -> Option<(Var, Account, u64)> {
    let a = acc.clone();
    engine
        .op()
        .name(format!("O{units}"))
        .reads(&[buf])
        .mutates(&[out])
        .uses(mem, units)
        .run(move |_| {
            a.take(units as i64);
            jitter(seed);
            a.give(units as i64);
            Ok(())
        })
        .unwrap();
    let delete = (buf.clone(), acc.clone(), freed);
    if delete_now {
        push_delete(engine, delete);
        None
    } else {
        Some(delete)
    }
}

fn push_delete(engine: &Engine, (buf, acc, freed): (Var, Account, u64)) {
    engine
        .delete_var(&buf, move |()| acc.give(freed as i64))
        .unwrap();
}

/// Every push order of seed 003's program (M1 before O1, M2 before O2;
/// deletes right after their compute op or at the end of the batch), two
/// micro-batches, the second pushed while the first runs: always completes,
/// never above 5 units.
#[test]
fn seed_003_always_completes() {
    // Orders of (M1, M2, O1, O2) with each M before its O.
    let orders: [[usize; 4]; 6] = [
        [0, 1, 2, 3],
        [0, 1, 3, 2],
        [1, 0, 2, 3],
        [1, 0, 3, 2],
        [0, 2, 1, 3],
        [1, 3, 0, 2],
    ];
    for (name, engine) in engines() {
        for (k, &order) in orders.iter().enumerate() {
            for delete_now in [true, false] {
                let engine = engine.clone();
                let peak = within(20, move || {
                    let mem = engine.new_resource("device memory", 5);
                    let acc = Account::default();
                    for batch in 0..2u64 {
                        let (b1, b2) = (engine.new_var(), engine.new_var());
                        let (r1, r2) = (engine.new_var(), engine.new_var());
                        let mut later = Vec::new();
                        for step in order {
                            let seed = batch * 100 + k as u64 * 10 + step as u64;
                            match step {
                                0 => movement(&engine, &mem, &acc, &b1, 1, seed),
                                1 => movement(&engine, &mem, &acc, &b2, 2, seed),
                                2 => later.extend(compute(
                                    &engine, &mem, &acc, &b1, &r1, 3, 1, seed, delete_now,
                                )),
                                _ => later.extend(compute(
                                    &engine, &mem, &acc, &b2, &r2, 2, 2, seed, delete_now,
                                )),
                            }
                        }
                        for d in later {
                            push_delete(&engine, d);
                        }
                    }
                    engine.wait_all().wait().unwrap();
                    assert_eq!(mem.in_use(), 0);
                    acc.peak()
                });
                assert!(peak <= 5, "{name}: order {order:?}: {peak} units in use");
            }
        }
    }
}

/// Ops on independent variables sharing a resource never exceed it, over
/// two resources at once (all or nothing), with several pushing threads.
#[test]
fn never_more_than_capacity() {
    for (name, engine) in engines() {
        let engine2 = engine.clone();
        let (peak_a, peak_b) = within(30, move || {
            let engine = engine2;
            let a = engine.new_resource("a", 3);
            let b = engine.new_resource("b", 2);
            let (acc_a, acc_b) = (Account::default(), Account::default());
            let pushers: Vec<_> = (0..3u64)
                .map(|t| {
                    let (engine, a, b) = (engine.clone(), a.clone(), b.clone());
                    let (acc_a, acc_b) = (acc_a.clone(), acc_b.clone());
                    std::thread::spawn(move || {
                        let vars: Vec<Var> = (0..4).map(|_| engine.new_var()).collect();
                        let mut rng = Rng(t + 1);
                        for i in 0..150 {
                            let v = &vars[rng.below(4) as usize];
                            let (ua, ub) = (rng.below(4), rng.below(3));
                            let (acc_a, acc_b) = (acc_a.clone(), acc_b.clone());
                            engine
                                .op()
                                .mutates(&[v])
                                .uses(&a, ua)
                                .uses(&b, ub)
                                .run(move |_| {
                                    acc_a.take(ua as i64);
                                    acc_b.take(ub as i64);
                                    jitter(t * 1000 + i);
                                    acc_a.give(ua as i64);
                                    acc_b.give(ub as i64);
                                    Ok(())
                                })
                                .unwrap();
                        }
                    })
                })
                .collect();
            pushers.into_iter().for_each(|p| p.join().unwrap());
            engine.wait_all().wait().unwrap();
            assert_eq!((a.in_use(), b.in_use()), (0, 0));
            (acc_a.peak(), acc_b.peak())
        });
        assert!(
            peak_a <= 3 && peak_b <= 2,
            "{name}: peaks {peak_a}, {peak_b}"
        );
    }
}

/// An op waiting for units holds no thread: with one worker, later ops run.
#[test]
fn waiting_for_units_blocks_no_thread() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let mem = engine.new_resource("mem", 2);
    let (held, x, y) = (engine.new_var(), engine.new_var(), engine.new_var());
    allocate(&engine, &mem, 2, &held);
    let starved = engine
        .op()
        .mutates(&[&x])
        .uses(&mem, 1)
        .run(|_| Ok(()))
        .unwrap();
    let free = engine.push(&[], &[&y], |_| Ok(7)).unwrap();
    assert_eq!(within(10, move || free.wait().unwrap()), 7);
    assert!(!starved.is_finished());
    engine.delete_var(&held, drop).unwrap();
    within(10, move || starved.wait().unwrap());
    assert_eq!(mem.in_use(), 0);
}

#[test]
fn bad_demands_fail_at_push() {
    let engine = Engine::new();
    let other = Engine::new();
    let mem = engine.new_resource("mem", 4);
    let foreign = other.new_resource("theirs", 4);
    let (a, b) = (engine.new_var(), engine.new_var());
    let ok = |_: &depflow::OpCtx| Ok(());
    // The sum of all declarations counts.
    match engine
        .op()
        .mutates(&[&a])
        .uses(&mem, 3)
        .allocates(&mem, 2, &a)
        .run(ok)
    {
        Err(Error::OverCapacity {
            resource,
            requested,
            capacity,
        }) => assert_eq!((resource.as_str(), requested, capacity), ("mem", 5, 4)),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        engine.op().mutates(&[&a]).uses(&foreign, 1).run(ok),
        Err(Error::ForeignResource(name)) if name == "theirs"
    ));
    // Allocating into a variable the op only reads, or does not declare.
    assert!(matches!(
        engine.op().reads(&[&b]).mutates(&[&a]).allocates(&mem, 1, &b).run(ok),
        Err(Error::NotMutable(id)) if id == b.id()
    ));
    let c = engine.new_var();
    assert!(matches!(
        engine.op().mutates(&[&a]).allocates(&mem, 1, &c).run(ok),
        Err(Error::NotMutable(id)) if id == c.id()
    ));
    // Nothing was taken by the refused pushes; zero units are no demand.
    engine
        .op()
        .mutates(&[&a])
        .uses(&mem, 0)
        .run(ok)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(mem.in_use(), 0);
}

#[test]
fn allocated_units_follow_their_variable() {
    let engine = Engine::new();
    let mem = engine.new_resource("mem", 10);
    let ok = |_: &depflow::OpCtx| Ok(());
    let v = engine.new_var();
    engine
        .op()
        .mutates(&[&v])
        .allocates(&mem, 3, &v)
        .uses(&mem, 2)
        .run(ok)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        mem.in_use(),
        3,
        "temporary units come back, allocated ones stay"
    );
    // Re-allocating replaces; repeated allocations in one op add up.
    engine
        .op()
        .mutates(&[&v])
        .allocates(&mem, 1, &v)
        .allocates(&mem, 1, &v)
        .run(ok)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(mem.in_use(), 2);
    // A failing op hands nothing on.
    let w = engine.new_var();
    let failed = engine
        .op()
        .mutates(&[&w])
        .allocates(&mem, 4, &w)
        .run(|_| Err::<(), _>("no".into()))
        .unwrap();
    assert!(failed.wait().is_err());
    assert_eq!(mem.in_use(), 2);
    // Dropping the last handle of a variable gives its units back.
    drop(v);
    engine.wait_all().wait().unwrap_err(); // reports the failure above
    assert_eq!(mem.in_use(), 0);
}

/// A deleted variable's units go back only after its value was recycled:
/// the op waiting for them never sees capacity + 1 buffers.
#[test]
fn units_come_back_after_the_delete_callback() {
    use std::sync::atomic::AtomicBool;
    for (name, engine) in engines() {
        let mem = engine.new_resource("buffers", 1);
        let (old, new) = (engine.new_var(), engine.new_var());
        let recycled = Arc::new(AtomicBool::new(false));
        let ok = |_: &depflow::OpCtx| Ok(());
        engine
            .op()
            .mutates(&[&old])
            .allocates(&mem, 1, &old)
            .run(ok)
            .unwrap();
        let r = recycled.clone();
        engine
            .delete_var(&old, move |()| {
                std::thread::sleep(Duration::from_millis(20));
                r.store(true, SeqCst);
            })
            .unwrap();
        let r = recycled.clone();
        let next = engine
            .op()
            .priority(1)
            .mutates(&[&new])
            .allocates(&mem, 1, &new)
            .run(move |_| Ok(r.load(SeqCst)))
            .unwrap();
        assert!(within(10, move || next.wait().unwrap()), "{name}");
    }
}

/// A skipped op (poisoned input) takes no units and does not hold up
/// younger allocations on the same resource.
#[test]
fn skipped_ops_do_not_hold_up_allocations() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let mem = engine.new_resource("mem", 1);
    let (bad, out1, out2) = (engine.new_var(), engine.new_var(), engine.new_var());
    engine
        .op()
        .mutates(&[&bad])
        .run(|_| Err::<(), _>("boom".into()))
        .unwrap();
    let skipped = engine
        .op()
        .reads(&[&bad])
        .mutates(&[&out1])
        .allocates(&mem, 1, &out1)
        .run(|_| Ok(()))
        .unwrap();
    let next = engine
        .op()
        .mutates(&[&out2])
        .allocates(&mem, 1, &out2)
        .run(|_| Ok(()))
        .unwrap();
    within(10, move || {
        assert!(matches!(skipped.wait(), Err(Error::Poisoned { .. })));
        next.wait().unwrap();
    });
    assert_eq!(mem.in_use(), 1);
}

/// With a bound on ops in flight, a producer that waits for room never runs
/// more than the bound ahead, blocking or async.
#[test]
fn back_pressure_bounds_ops_in_flight() {
    for threads in [1, 2] {
        let engine = Engine::builder()
            .threads(threads)
            .max_in_flight(4)
            .build()
            .unwrap();
        let v = engine.new_var();
        let peak = Arc::new(AtomicUsize::new(0));
        let e = engine.clone();
        let p = peak.clone();
        within(30, move || {
            for i in 0..2000u64 {
                e.op()
                    .mutates(&[&v])
                    .when_room()
                    .wait()
                    .unwrap()
                    .run(move |_| {
                        jitter(i);
                        Ok(())
                    })
                    .unwrap();
                p.fetch_max(e.in_flight(), SeqCst);
            }
            futures::executor::block_on(async {
                for _ in 0..500 {
                    e.op()
                        .mutates(&[&v])
                        .when_room()
                        .await
                        .unwrap()
                        .run(|_| Ok(()))
                        .unwrap();
                    p.fetch_max(e.in_flight(), SeqCst);
                }
            });
            e.wait_all().wait().unwrap();
        });
        assert!(peak.load(SeqCst) <= 4, "{} in flight", peak.load(SeqCst));
        assert_eq!(engine.in_flight(), 0);
    }
    // Inside an op the blocking form never blocks: the op itself does not
    // count, so here there is room (see tests/reliability_input.rs).
    let engine = Engine::builder().max_in_flight(1).build().unwrap();
    let v = engine.new_var();
    let e = engine.clone();
    let inner = engine
        .push(&[], &[&v], move |_| {
            let w = e.new_var();
            Ok(e.op().mutates(&[&w]).when_room().wait().err())
        })
        .unwrap();
    assert!(inner.wait().unwrap().is_none());
}

/// A stuck engine says what it waits for.
#[test]
fn diagnostics_name_what_ops_wait_for() {
    let engine = tracked_engine(1);
    let mem = engine.new_resource("gpu memory", 4);
    let (held, x, y) = (engine.new_var(), engine.new_var(), engine.new_var());
    let ok = |_: &depflow::OpCtx| Ok(());
    engine
        .op()
        .mutates(&[&held])
        .allocates(&mem, 4, &held)
        .run(ok)
        .unwrap()
        .wait()
        .unwrap();
    engine
        .op()
        .name("conv")
        .reads(&[&y])
        .mutates(&[&x])
        .uses(&mem, 2)
        .run(ok)
        .unwrap();
    engine.op().name("relu").mutates(&[&x]).run(ok).unwrap();
    let report = within(10, move || {
        // The broker parks "conv" right away (its variables are free).
        loop {
            let report = engine.diagnostics();
            if !report.waiting_for_units().is_empty() {
                engine.delete_var(&held, drop).unwrap();
                engine.wait_all().wait().unwrap();
                assert!(engine.diagnostics().waiting_for_units().is_empty());
                return report;
            }
            std::thread::yield_now();
        }
    });
    let ops = report.ops().expect("tracked");
    assert_eq!(ops.len(), 2, "{report}");
    assert_eq!(ops[0].name(), Some("conv"));
    assert_eq!(
        ops[0].state(),
        &OpState::Units(vec![("gpu memory".to_string(), 2)])
    );
    match ops[1].state() {
        OpState::Variables(waits) => {
            assert_eq!(
                waits,
                &vec![(ops[0].vars().1[0], vec!["`conv`".to_string()])]
            );
        }
        other => panic!("{other:?}"),
    }
    let text = report.to_string();
    assert!(
        text.contains("`conv` waits for units: 2 of `gpu memory` (0 of 4 free)"),
        "{text}"
    );
    assert!(text.contains("`relu` waits for variables:"), "{text}");
    assert_eq!(report.resources()[0].free(), 0);
}
