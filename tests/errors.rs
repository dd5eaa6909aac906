//! Bad input and failing ops: each gives its documented error, nothing hangs,
//! the engine keeps running, and every op closure is dropped exactly once.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::{DropCount, engines, within};
use depflow::{AnyVar, Engine, Error, Executor, Var};

fn set(engine: &Engine, v: &Var<i64>, x: i64) -> Result<depflow::OpHandle<()>, Error> {
    let v2 = v.clone();
    engine.push(&[], &[v], move |ctx| {
        *ctx.write(&v2)? = x;
        Ok(())
    })
}

fn get(engine: &Engine, v: &Var<i64>) -> Result<i64, Error> {
    let v2 = v.clone();
    engine
        .push(&[v], &[], move |ctx| Ok(*ctx.read(&v2)?))?
        .wait()
}

fn failing(engine: &Engine, v: &Var<i64>, name: &'static str) -> depflow::OpHandle<()> {
    engine
        .op()
        .name(name)
        .mutates(&[v])
        .run(|_| -> Result<(), depflow::BoxError> {
            Err(std::io::Error::other("disk on fire").into())
        })
        .unwrap()
}

#[test]
fn empty_variable_lists_are_refused() {
    let engine = Engine::new();
    let drops = DropCount::default();
    let token = drops.token();
    let r = engine.push(&[], &[], move |_| {
        drop(token);
        Ok(())
    });
    assert!(matches!(r, Err(Error::NoVars)));
    assert_eq!(
        drops.dropped(),
        1,
        "the rejected closure must be dropped once"
    );
}

#[test]
fn a_variable_from_another_engine_is_refused() {
    let (e1, e2) = (Engine::new(), Engine::new());
    let v = e1.var(0i64);
    assert!(matches!(set(&e2, &v, 1), Err(Error::ForeignVar(id)) if id == v.id()));
    assert!(matches!(
        e2.wait_for_var(&v).wait(),
        Err(Error::ForeignVar(_))
    ));
    assert!(matches!(
        e2.delete_var(&v, |_| {}),
        Err(Error::ForeignVar(_))
    ));
    // Nothing was disturbed on its own engine.
    set(&e1, &v, 5).unwrap();
    assert_eq!(get(&e1, &v).unwrap(), 5);
}

#[test]
fn delete_runs_after_pending_uses_and_refuses_later_pushes() {
    for (name, engine) in engines() {
        let v = engine.var(vec![1u8; 16]);
        let reads = Arc::new(AtomicUsize::new(0));
        for _ in 0..10 {
            let (v2, reads) = (v.clone(), reads.clone());
            let _ = engine.push(&[&v], &[], move |ctx| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                assert_eq!(ctx.read(&v2)?.len(), 16);
                reads.fetch_add(1, SeqCst);
                Ok(())
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let reads2 = reads.clone();
        let deleted = engine
            .delete_var(&v, move |buf| {
                // Runs after every op already pushed on the variable.
                tx.send((buf.len(), reads2.load(SeqCst))).unwrap();
            })
            .unwrap();
        deleted.wait().unwrap();
        assert_eq!(rx.recv().unwrap(), (16, 10), "{name}");
        assert!(
            matches!(engine.push(&[&v], &[], |_| Ok(())), Err(Error::Deleted(_))),
            "{name}"
        );
        assert!(
            matches!(engine.wait_for_var(&v).wait(), Err(Error::Deleted(_))),
            "{name}"
        );
        assert!(
            matches!(engine.delete_var(&v, |_| {}), Err(Error::Deleted(_))),
            "{name}"
        );
        assert_eq!(v.version(), 1, "{name}");
    }
}

#[test]
fn an_op_racing_a_delete_sees_deleted_not_freed_memory() {
    // Push and delete from two threads: each push either fails at once or its
    // op resolves to `Deleted`; none runs on the deleted value.
    for _ in 0..200 {
        let engine = Engine::builder().threads(2).build().unwrap();
        let v = engine.var(7i64);
        let pusher = {
            let (engine, v) = (engine.clone(), v.clone());
            std::thread::spawn(move || {
                (0..20)
                    .map(|_| {
                        let v2 = v.clone();
                        engine.push(&[&v], &[], move |ctx| Ok(*ctx.read(&v2)?))
                    })
                    .map(|r| r.and_then(|h| h.wait()))
                    .collect::<Vec<_>>()
            })
        };
        engine.delete_var(&v, |_| {}).unwrap();
        for r in pusher.join().unwrap() {
            assert!(matches!(r, Ok(7) | Err(Error::Deleted(_))), "{r:?}");
        }
    }
}

#[test]
fn pushes_after_shutdown_are_refused() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let v = engine.var(0i64);
    let clone = engine.clone();
    set(&engine, &v, 1).unwrap();
    engine.shutdown().wait().unwrap();
    assert!(matches!(set(&clone, &v, 2), Err(Error::ShutDown)));
    assert!(matches!(
        clone.wait_for_var(&v).wait(),
        Err(Error::ShutDown)
    ));
    assert!(clone.wait_all().wait().is_ok());
}

#[test]
fn a_failing_op_poisons_what_it_mutates_and_names_itself() {
    for (name, engine) in engines() {
        let (a, b, c) = (engine.var(1i64), engine.var(2i64), engine.var(3i64));
        let err = failing(&engine, &a, "load weights").wait().unwrap_err();
        let Error::Failed(failure) = &err else {
            panic!("{name}: {err:?}")
        };
        assert_eq!(failure.op_name(), Some("load weights"));
        assert_eq!(failure.message(), "disk on fire");
        // The op's own error's message is in the plain text; it has no
        // source, so neither has the failure (nothing printed twice).
        assert_eq!(err.to_string(), "op `load weights` failed: disk on fire");
        assert!(std::error::Error::source(&err).is_none());
        assert!(
            failure
                .op_error()
                .unwrap()
                .downcast_ref::<std::io::Error>()
                .is_some()
        );

        // b = a + 1 does not run: b is poisoned by the same failure.
        let (a2, b2) = (a.clone(), b.clone());
        let ran = Arc::new(AtomicUsize::new(0));
        let ran2 = ran.clone();
        let skipped = engine
            .push(&[&a], &[&b], move |ctx| {
                ran2.fetch_add(1, SeqCst);
                *ctx.write(&b2)? = *ctx.read(&a2)? + 1;
                Ok(())
            })
            .unwrap()
            .wait();
        let Err(Error::Poisoned { cause, .. }) = skipped else {
            panic!("{name}: {skipped:?}")
        };
        assert_eq!(cause.op_name(), Some("load weights"), "{name}");
        assert_eq!(ran.load(SeqCst), 0, "{name}: a poisoned op ran");
        // Poison passes down; c, untouched, is fine; the engine keeps running.
        assert!(
            matches!(get(&engine, &b), Err(Error::Poisoned { cause: c, .. }) if c.op_name() == Some("load weights"))
        );
        assert!(
            matches!(engine.wait_for_var(&b).wait(), Err(Error::Poisoned { .. })),
            "{name}"
        );
        assert_eq!(get(&engine, &c).unwrap(), 3);
        assert_eq!(
            (a.version(), b.version()),
            (1, 1),
            "skipped mutations still count"
        );
        // wait_all reports the failure once.
        let all = engine.wait_all().wait();
        assert!(
            matches!(all, Err(Error::Failures { count: 1, .. })),
            "{name}: {all:?}"
        );
        assert!(engine.wait_all().wait().is_ok(), "{name}: reported twice");
        // Poison clears in push order with clear_poison.
        engine.clear_poison(&a).unwrap();
        set(&engine, &a, 10).unwrap();
        assert_eq!(get(&engine, &a).unwrap(), 10, "{name}");
    }
}

#[test]
fn a_panicking_op_is_an_error_not_a_crash() {
    for (name, engine) in engines() {
        let v = engine.var(0i64);
        let v2 = v.clone();
        let err = engine
            .op()
            .name("boom")
            .mutates(&[&v])
            .run(move |ctx| -> Result<(), depflow::BoxError> {
                *ctx.write(&v2)? = 99;
                panic!("index out of range");
            })
            .unwrap()
            .wait()
            .unwrap_err();
        let Error::Failed(failure) = &err else {
            panic!("{name}: {err:?}")
        };
        assert!(failure.is_panic(), "{name}");
        assert!(failure.message().contains("index out of range"), "{name}");
        assert!(
            matches!(get(&engine, &v), Err(Error::Poisoned { .. })),
            "{name}"
        );
        // The executor survived: unrelated work still runs.
        let w = engine.var(1i64);
        assert_eq!(get(&engine, &w).unwrap(), 1, "{name}");
        let _ = engine.wait_all().wait();
    }
}

#[test]
fn an_async_op_that_fails_after_awaiting_poisons_too() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let v = engine.var(0i64);
    let r = engine
        .push_async(&[], &[&v], |_ctx| async {
            futures::future::ready(()).await;
            Err::<(), _>("late failure".into())
        })
        .unwrap()
        .wait();
    assert!(matches!(r, Err(Error::Failed(f)) if f.message() == "late failure"));
    assert!(matches!(get(&engine, &v), Err(Error::Poisoned { .. })));
}

#[test]
fn undeclared_and_conflicting_access_are_errors() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let (a, b, c) = (engine.var(1i64), engine.var(2i64), engine.var(3i64));
    let (a2, b2, c2) = (a.clone(), b.clone(), c.clone());
    engine
        .push(&[&a], &[&b], move |ctx| {
            assert!(matches!(ctx.read(&c2), Err(Error::NotDeclared(id)) if id == c2.id()));
            assert!(matches!(ctx.write(&a2), Err(Error::NotMutable(_))));
            let w = ctx.write(&b2)?;
            assert!(matches!(ctx.write(&b2), Err(Error::Borrowed(_))));
            assert!(matches!(ctx.read(&b2), Err(Error::Borrowed(_))));
            drop(w);
            let r1 = ctx.read(&b2)?;
            let r2 = ctx.read(&b2)?;
            assert!(matches!(ctx.write(&b2), Err(Error::Borrowed(_))));
            assert_eq!(*r1 + *r2 + *ctx.read(&a2)?, 5);
            Ok(())
        })
        .unwrap()
        .wait()
        .unwrap();
}

/// Borrow tracking at every edge index: the first two mutated variables'
/// counters are kept apart from the others', and an op on three variables
/// may mutate two or three of them.
#[test]
fn every_mutated_variable_of_a_wide_op_is_borrow_checked() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let vars: Vec<Var<i64>> = (0..4).map(|i| engine.var(i)).collect();
    for writes in [1, 2, 3] {
        let (w, r): (Vec<&dyn AnyVar>, Vec<&dyn AnyVar>) = (
            vars[..writes].iter().map(|v| v as &dyn AnyVar).collect(),
            vars[writes..3].iter().map(|v| v as &dyn AnyVar).collect(),
        );
        let keys: Vec<_> = vars.iter().map(Var::key).collect();
        engine
            .push(&r, &w, move |ctx| {
                // All mutable borrows at once: no two share a counter.
                let mut held = Vec::new();
                for &k in &keys[..writes] {
                    held.push(ctx.write(k)?);
                }
                for (&k, v) in keys.iter().zip(&mut held) {
                    assert!(matches!(ctx.write(k), Err(Error::Borrowed(_))));
                    assert!(matches!(ctx.read(k), Err(Error::Borrowed(_))));
                    **v += 10;
                }
                drop(held);
                for (i, &k) in keys[..3].iter().enumerate() {
                    let (r1, r2) = (ctx.read(k)?, ctx.read(k)?);
                    assert_eq!(*r1, *r2);
                    if i < writes {
                        assert!(matches!(ctx.write(k), Err(Error::Borrowed(_))));
                    } else {
                        assert!(matches!(ctx.write(k), Err(Error::NotMutable(_))));
                    }
                }
                assert!(matches!(ctx.read(keys[3]), Err(Error::NotDeclared(_))));
                Ok(())
            })
            .unwrap()
            .wait()
            .unwrap();
    }
    let values: Vec<i64> = vars.iter().map(|v| get(&engine, v).unwrap()).collect();
    assert_eq!(values, [30, 21, 12, 3]);
}

#[test]
fn blocking_waits_inside_an_op_are_errors_not_hangs() {
    for (name, engine) in engines() {
        let (a, b) = (engine.new_var(), engine.new_var());
        let (tx, rx) = futures::channel::oneshot::channel::<()>();
        // An op that will not finish until we say so (without holding a
        // worker thread meanwhile).
        let slow = engine
            .push_async(&[], &[&b], move |_| async move {
                let _ = rx.await;
                Ok::<(), depflow::BoxError>(())
            })
            .unwrap();
        let (engine2, a2, b2) = (engine.clone(), a.clone(), b.clone());
        let outcome = engine
            .push(&[], &[&a], move |_| {
                assert!(matches!(slow.wait(), Err(Error::BlockingInOp)));
                assert!(matches!(
                    engine2.wait_all().wait(),
                    Err(Error::WaitsForItself)
                ));
                assert!(matches!(
                    engine2.wait_for_var(&a2).wait(),
                    Err(Error::WaitsForItself)
                ));
                assert!(matches!(
                    engine2.wait_for_var(&b2).wait(),
                    Err(Error::BlockingInOp)
                ));
                Ok(())
            })
            .unwrap();
        // The inline executor ran the op above inside push; the others run it
        // on a worker while `slow` is pending.
        let done = within(20, move || outcome.wait());
        tx.send(()).unwrap();
        done.unwrap_or_else(|e| panic!("{name}: {e}"));
        engine.wait_all().wait().unwrap();
    }
}

#[test]
fn every_op_closure_is_dropped_exactly_once() {
    for (name, engine) in engines() {
        let drops = DropCount::default();
        let pushed = Arc::new(AtomicUsize::new(0));
        let v = engine.var(0i64);
        let mut expect = 0;
        let mut push = |engine: &Engine, vars: &[&dyn depflow::AnyVar], fail: bool| {
            let token = drops.token();
            expect += 1;
            let pushed = pushed.clone();
            let r = engine.push(&[], vars, move |_| -> Result<(), depflow::BoxError> {
                let _token = token;
                pushed.fetch_add(1, SeqCst);
                if fail { Err("no".into()) } else { Ok(()) }
            });
            drop(r);
        };
        push(&engine, &[&v], false); // runs
        push(&engine, &[&v], true); // runs and fails
        push(&engine, &[&v], false); // skipped: poisoned
        push(&engine, &[], false); // refused: no variables
        let other = Engine::new();
        push(&other, &[&v], false); // refused: foreign variable
        engine.delete_var(&v, |_| {}).unwrap();
        push(&engine, &[&v], false); // refused: deleted
        // Async ops: skipped ones drop their closure without calling it.
        let w = engine.var(0i64);
        drop(failing(&engine, &w, "fail"));
        let token = drops.token();
        expect += 1;
        let _ = engine.push_async(&[&w], &[], move |_| async move {
            let _token = token;
            Ok::<(), depflow::BoxError>(())
        });
        engine.wait_all().wait().ok();
        within(20, {
            let drops = drops.clone();
            move || {
                while drops.dropped() < expect {
                    std::thread::yield_now();
                }
            }
        });
        assert_eq!(drops.dropped(), expect, "{name}");
        assert_eq!(
            pushed.load(SeqCst),
            2,
            "{name}: only two closures should have run"
        );
    }
}

#[test]
fn an_executor_that_drops_ops_fails_them_instead_of_hanging() {
    let engine = Engine::builder()
        .executor(Executor::custom(drop))
        .build()
        .unwrap();
    let v = engine.var(0i64);
    let r = within(20, {
        let (engine, v) = (engine.clone(), v.clone());
        move || set(&engine, &v, 1).unwrap().wait()
    });
    assert!(
        matches!(r, Err(Error::Failed(ref f)) if f.message().contains("dropped")),
        "{r:?}"
    );
    // What depended on it is poisoned, not stuck.
    let r = within(20, move || get(&engine, &v));
    assert!(
        matches!(r, Err(Error::Poisoned { .. }) | Err(Error::Failed(_))),
        "{r:?}"
    );
}

#[test]
fn bad_configurations_are_errors() {
    assert!(matches!(
        Engine::builder().threads(0).build(),
        Err(Error::Config(_))
    ));
    let dup = Engine::builder()
        .device("x", Executor::pool(1))
        .device("x", Executor::inline())
        .build();
    assert!(matches!(dup, Err(Error::Config(_))));
    let (e1, e2) = (Engine::new(), Engine::new());
    let v = e2.new_var();
    let r = e2
        .op()
        .on(e1.default_device())
        .mutates(&[&v])
        .run(|_| Ok(()));
    assert!(matches!(r, Err(Error::Config(_))));
}

/// An error with a cause of its own, to see the whole chain printed.
#[derive(Debug)]
struct ReadFailed(std::io::Error);

impl std::fmt::Display for ReadFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("could not read the shard")
    }
}

impl std::error::Error for ReadFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Every level of `err`'s `source()` chain, as `Display` prints it.
fn chain(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut levels = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        levels.push(e.to_string());
        next = e.source();
    }
    levels
}

/// Asserts that no level of the chain repeats the text of a level below it
/// (what every chain printer, anyhow's included, would print twice), and
/// returns the chain joined the way `anyhow`'s `{:#}` prints it.
fn assert_no_repeats(err: &(dyn std::error::Error + 'static)) -> String {
    let levels = chain(err);
    for (i, outer) in levels.iter().enumerate() {
        for inner in &levels[i + 1..] {
            assert!(
                !outer.contains(inner.as_str()),
                "`{outer}` repeats its source `{inner}`: {levels:?}"
            );
        }
    }
    levels.join(": ")
}

#[test]
fn display_does_not_repeat_the_source() {
    let engine = Engine::new();
    let (a, b) = (engine.var(1i64), engine.var(0i64));
    let failed = engine
        .op()
        .name("load shard")
        .mutates(&[&a])
        .run(|_| -> Result<(), depflow::BoxError> {
            Err(ReadFailed(std::io::Error::other("disk on fire")).into())
        })
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(matches!(failed, Error::Failed(_)), "{failed:?}");
    assert_eq!(
        assert_no_repeats(&failed),
        "op `load shard` failed: could not read the shard: disk on fire"
    );
    // The failure itself is an error with the same cause.
    let failure = failed.failure().unwrap().clone();
    assert_eq!(
        assert_no_repeats(&failure),
        "op `load shard` failed: could not read the shard: disk on fire"
    );
    assert_eq!(failure.message(), "could not read the shard");

    let skipped = set(&engine, &b, 1).unwrap(); // b is fine
    skipped.wait().unwrap();
    let poisoned = engine
        .push(&[&a], &[&b], |_| Ok::<_, depflow::BoxError>(()))
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(matches!(poisoned, Error::Poisoned { .. }), "{poisoned:?}");
    assert_eq!(
        assert_no_repeats(&poisoned),
        format!(
            "skipped: input {} was poisoned because op `load shard` failed: \
             could not read the shard: disk on fire",
            a.id()
        )
    );
    let all = engine.wait_all().wait().unwrap_err();
    assert_eq!(
        assert_no_repeats(&all),
        "1 op(s) failed; the first: op `load shard` failed: could not read the shard: disk on fire"
    );

    // Failures with no source error say everything themselves.
    let c = engine.var(0i64);
    let panicked = engine
        .op()
        .name("boom")
        .mutates(&[&c])
        .run(|_| -> Result<(), depflow::BoxError> { panic!("index out of range") })
        .unwrap()
        .wait()
        .unwrap_err();
    assert_eq!(chain(&panicked).len(), 1);
    assert_eq!(
        panicked.to_string(),
        "op `boom` failed: panicked: index out of range"
    );
    let _ = engine.wait_all().wait();
}

/// An op skipped for a poisoned input names that input: a pushed op, and
/// recorded ops in a replay (an inline host op, and one with resource
/// units, which a replay runs apart).
#[test]
fn a_skipped_op_names_the_poisoned_input() {
    let engine = Engine::new();
    let slots = engine.new_resource("slots", 1);
    let (weights, grad) = (
        engine.var_named("fc1.weight", 1i64),
        engine.var_named("fc1.grad", 0i64),
    );
    let out = engine.new_var();
    let failure = engine
        .op()
        .name("backward fc1")
        .mutates(&[&grad])
        .run(|_| Err::<(), depflow::BoxError>("NaN in gradient".into()))
        .unwrap()
        .wait()
        .unwrap_err();
    // Reads a live variable and the poisoned one: the latter is named.
    let skipped = engine
        .push(&[&weights, &grad], &[&out], |_| {
            Ok::<_, depflow::BoxError>(())
        })
        .unwrap()
        .wait()
        .unwrap_err();
    let Error::Poisoned { input, cause } = &skipped else {
        panic!("{skipped:?}")
    };
    assert_eq!(*input, grad.id());
    assert!(Arc::ptr_eq(cause, failure.failure().unwrap()));
    let text = skipped.to_string();
    assert_eq!(
        text,
        format!(
            "skipped: input {} was poisoned because op `backward fc1` failed: NaN in gradient",
            grad.id()
        )
    );
    assert!(
        text.starts_with("skipped: input `fc1.grad` (var#"),
        "{text}"
    );
    // Passed on: a reader of `out` is skipped for `out`, with the same cause.
    match engine.wait_for_var(&out).wait() {
        Err(Error::Poisoned { input, cause }) => {
            assert_eq!(input, out.id());
            assert_eq!(cause.op_name(), Some("backward fc1"));
        }
        other => panic!("{other:?}"),
    }

    for units in [0, 1] {
        let graph = engine
            .record(|rec| {
                let op = rec.op().name("step").reads(&[&weights, &grad]);
                let op = if units == 0 {
                    op
                } else {
                    op.uses(&slots, units)
                };
                op.mutates(&[&weights]).run(|_| Ok(()))
            })
            .unwrap();
        match graph.replay().wait() {
            Err(Error::Poisoned { input, cause }) => {
                assert_eq!(input, grad.id(), "units {units}");
                assert_eq!(cause.op_name(), Some("backward fc1"), "units {units}");
            }
            other => panic!("units {units}: {other:?}"),
        }
        engine.clear_poison(&weights).unwrap().wait().unwrap();
    }
    let _ = engine.wait_all().wait();
}

/// An error with a message of its own and, optionally, a cause.
#[derive(Debug)]
struct Layer(
    &'static str,
    Option<Box<dyn std::error::Error + Send + Sync>>,
);

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Layer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.1.as_deref().map(|e| e as _)
    }
}

/// The plain text of an op's returned error says what the op said, as a
/// panic's does; a chain printer then prints every message of its chain
/// once: the failing op's own, then the deeper causes.
#[test]
fn an_op_error_is_in_the_plain_text_once_and_its_causes_in_the_chain() {
    let engine = Engine::new();
    let (shard, out) = (engine.var(0i64), engine.var(0i64));
    let failed = engine
        .op()
        .name("load shard")
        .mutates(&[&shard])
        .run(|_| -> Result<(), depflow::BoxError> {
            // An io::Error whose source chain goes two levels down.
            let cause = Layer("disk on fire", Some(Box::new(Layer("fan stopped", None))));
            Err(
                std::io::Error::other(Layer("could not read the shard", Some(Box::new(cause))))
                    .into(),
            )
        })
        .unwrap()
        .wait()
        .unwrap_err();
    assert_eq!(
        failed.to_string(),
        "op `load shard` failed: could not read the shard"
    );
    assert_eq!(
        chain(&failed),
        [
            "op `load shard` failed: could not read the shard",
            "disk on fire",
            "fan stopped"
        ]
    );
    // The op's error itself is still there, to downcast.
    let failure = failed.failure().unwrap();
    assert!(
        failure
            .op_error()
            .unwrap()
            .downcast_ref::<std::io::Error>()
            .is_some()
    );
    assert_eq!(chain(&**failure), chain(&failed));

    let skipped = engine
        .push(&[&shard], &[&out], |_| Ok::<_, depflow::BoxError>(()))
        .unwrap()
        .wait()
        .unwrap_err();
    let all = engine.wait_all().wait().unwrap_err();
    for (err, head) in [
        (
            &skipped,
            format!(
                "skipped: input {} was poisoned because op `load shard` failed: \
                 could not read the shard",
                shard.id()
            ),
        ),
        (
            &all,
            "1 op(s) failed; the first: op `load shard` failed: could not read the shard"
                .to_string(),
        ),
    ] {
        assert_eq!(err.to_string(), head);
        let levels = chain(err);
        assert_eq!(levels, [head.as_str(), "disk on fire", "fan stopped"]);
        let printed = levels.join(": ");
        for message in ["could not read the shard", "disk on fire", "fan stopped"] {
            assert_eq!(printed.matches(message).count(), 1, "{printed}");
        }
    }
}
