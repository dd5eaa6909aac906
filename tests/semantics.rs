//! The engine's scheduling guarantees: program order per variable, parallel
//! reads, exclusive mutations, normalised declarations, versions, waits.

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, mpsc};
use std::time::Duration;

use common::{Rng, engines, within};
use depflow::{Engine, Error, Var};

fn add(engine: &Engine, reads: &[&Var<i64>], target: &Var<i64>, k: i64) {
    let decl: Vec<&dyn depflow::AnyVar> =
        reads.iter().map(|v| *v as &dyn depflow::AnyVar).collect();
    let reads: Vec<Var<i64>> = reads.iter().map(|v| (*v).clone()).collect();
    let target2 = target.clone();
    drop(
        engine
            .push(&decl, &[target], move |ctx| {
                let mut sum = k;
                for r in &reads {
                    sum = sum.wrapping_add(*ctx.read(r)?);
                }
                let t = &mut *ctx.write(&target2)?;
                *t = t.wrapping_add(sum);
                Ok(())
            })
            .unwrap(),
    );
}

fn value(engine: &Engine, v: &Var<i64>) -> i64 {
    let v2 = v.clone();
    engine
        .push(&[v], &[], move |ctx| Ok(*ctx.read(&v2)?))
        .unwrap()
        .wait()
        .unwrap()
}

#[test]
fn seed_program_on_every_executor() {
    for (name, engine) in engines() {
        let a = engine.var(2i64);
        let b = engine.var(0i64);
        let c = engine.var(0i64);
        let d = engine.var(0i64);
        add(&engine, &[&a], &b, 1); // B = A + 1
        add(&engine, &[&a], &c, 2); // C = A + 2
        let (a2, c2) = (a.clone(), c.clone());
        let _ = engine.push(&[&c], &[&a], move |ctx| {
            *ctx.write(&a2)? = *ctx.read(&c2)? * 2; // A = C * 2
            Ok(())
        });
        add(&engine, &[&a], &d, 3); // D = A + 3
        engine.wait_all().wait().unwrap();
        assert_eq!(
            (
                value(&engine, &a),
                value(&engine, &b),
                value(&engine, &c),
                value(&engine, &d)
            ),
            (8, 3, 4, 11),
            "{name}"
        );
        assert_eq!(
            (a.version(), b.version(), c.version(), d.version()),
            (1, 1, 1, 1),
            "{name}"
        );
    }
}

#[test]
fn mutations_of_one_variable_follow_push_order() {
    for (name, engine) in engines() {
        let log = engine.var(Vec::new());
        for i in 0..2000 {
            let log2 = log.clone();
            let _ = engine.push(&[], &[&log], move |ctx| {
                ctx.write(&log2)?.push(i);
                Ok(())
            });
        }
        let log2 = log.clone();
        let got = engine
            .push(&[&log], &[], move |ctx| Ok(ctx.read(&log2)?.clone()))
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(got, (0..2000).collect::<Vec<_>>(), "{name}");
        assert_eq!(log.version(), 2000, "{name}");
    }
}

#[test]
fn reads_of_one_variable_run_concurrently() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let a = engine.new_var();
    let barrier = Arc::new(Barrier::new(2));
    let (tx, rx) = mpsc::channel();
    for _ in 0..2 {
        let (barrier, tx) = (barrier.clone(), tx.clone());
        let _ = engine.push(&[&a], &[], move |_| {
            // Both readers must be inside at the same time to pass.
            barrier.wait();
            tx.send(()).unwrap();
            Ok(())
        });
    }
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the two reads did not run concurrently");
    }
}

#[test]
fn a_mutation_runs_alone_and_reads_see_it() {
    let engine = Engine::builder().threads(4).build().unwrap();
    let vars: Vec<_> = (0..4).map(|_| engine.new_var()).collect();
    let state: Arc<Vec<AtomicI64>> = Arc::new((0..4).map(|_| AtomicI64::new(0)).collect());
    let mut rng = Rng(7);
    for _ in 0..20_000 {
        let i = rng.below(4) as usize;
        let state = state.clone();
        if rng.below(3) == 0 {
            let _ = engine.push(&[], &[&vars[i]], move |_| {
                // -1 marks a writer inside; nobody else may be.
                assert_eq!(
                    state[i].swap(-1, SeqCst),
                    0,
                    "a mutation overlapped another op"
                );
                std::hint::spin_loop();
                state[i].store(0, SeqCst);
                Ok(())
            });
        } else {
            let _ = engine.push(&[&vars[i]], &[], move |_| {
                let before = state[i].fetch_add(1, SeqCst);
                assert!(before >= 0, "a read overlapped a mutation");
                state[i].fetch_sub(1, SeqCst);
                Ok(())
            });
        }
    }
    within(60, move || engine.wait_all().wait()).unwrap();
}

#[test]
fn declarations_are_normalised() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let a = engine.var(1i64);
    let b = engine.var(10i64);
    // A both read and mutated counts as mutated; repeats count once.
    let (a2, b2) = (a.clone(), b.clone());
    engine
        .push(&[&a, &b, &a, &b], &[&a, &a], move |ctx| {
            let b = *ctx.read(&b2)?;
            *ctx.write(&a2)? += b;
            Ok(())
        })
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(value(&engine, &a), 11);
    assert_eq!((a.version(), b.version()), (1, 0));
}

#[test]
fn pushes_from_many_threads_never_deadlock() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let vars: Arc<Vec<Var<i64>>> = Arc::new((0..6).map(|_| engine.var(0i64)).collect());
    let pushers: Vec<_> = (0..4)
        .map(|t| {
            let (engine, vars) = (engine.clone(), vars.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(t);
                for _ in 0..5_000 {
                    // Two distinct variables in random roles: the pattern that
                    // deadlocks an engine without one global push order.
                    let x = rng.below(6) as usize;
                    let y = (x + 1 + rng.below(5) as usize) % 6;
                    add(&engine, &[&vars[x]], &vars[y], 1);
                }
            })
        })
        .collect();
    for p in pushers {
        p.join().unwrap();
    }
    within(60, move || engine.wait_all().wait()).unwrap();
    let total: u64 = vars.iter().map(|v| v.version()).sum();
    assert_eq!(total, 4 * 5_000);
}

#[test]
fn wait_for_var_waits_for_pushed_mutations_only() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let a = engine.var(0i64);
    let done = Arc::new(AtomicBool::new(false));
    let (a2, done2) = (a.clone(), done.clone());
    let _ = engine.push(&[], &[&a], move |ctx| {
        std::thread::sleep(Duration::from_millis(50));
        *ctx.write(&a2)? = 5;
        done2.store(true, SeqCst);
        Ok(())
    });
    engine.wait_for_var(&a).wait().unwrap();
    assert!(done.load(SeqCst));
    assert_eq!(a.version(), 1);
    // A read in flight does not hold up a wait (it waits for mutations).
    let (tx, rx) = mpsc::channel::<()>();
    let _ = engine.push(&[&a], &[], move |_| {
        rx.recv_timeout(Duration::from_secs(20)).ok();
        Ok(())
    });
    within(20, {
        let (engine, a) = (engine.clone(), a.clone());
        move || engine.wait_for_var(&a).wait()
    })
    .unwrap();
    drop(tx);
}

#[test]
fn wait_all_does_not_wait_for_later_pushes_from_other_threads() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let pushed = Arc::new(AtomicUsize::new(0));
    // Another thread keeps a chain of 1 ms ops going, pushing one every
    // 0.5 ms: the engine is never idle, but the backlog stays small.
    let busy = {
        let (engine, stop, pushed) = (engine.clone(), stop.clone(), pushed.clone());
        std::thread::spawn(move || {
            let v = engine.new_var();
            while !stop.load(SeqCst) {
                let _ = engine.push(&[], &[&v], |_| {
                    std::thread::sleep(Duration::from_millis(1));
                    Ok(())
                });
                pushed.fetch_add(1, SeqCst);
                std::thread::sleep(Duration::from_micros(500));
            }
        })
    };
    while pushed.load(SeqCst) < 20 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mine = engine.new_var();
    let ran = Arc::new(AtomicBool::new(false));
    let ran2 = ran.clone();
    let _ = engine.push(&[], &[&mine], move |_| {
        ran2.store(true, SeqCst);
        Ok(())
    });
    // An engine that waited until idle would never return here.
    within(30, {
        let engine = engine.clone();
        move || engine.wait_all().wait()
    })
    .unwrap();
    assert!(ran.load(SeqCst));
    stop.store(true, SeqCst);
    busy.join().unwrap();
}

#[test]
fn async_ops_do_not_hold_a_worker_while_pending() {
    // One worker thread: if the pending async op held it, the op it waits for
    // could never run.
    let engine = Engine::builder().threads(1).build().unwrap();
    let (a, b) = (engine.var(0i64), engine.var(0i64));
    let (tx, rx) = futures::channel::oneshot::channel::<i64>();
    let a2 = a.clone();
    let waiter = engine
        .push_async(&[], &[&a], move |ctx| async move {
            let got = rx.await.map_err(|_| Error::ShutDown)?;
            *ctx.write(&a2)? = got;
            Ok(got)
        })
        .unwrap();
    let b2 = b.clone();
    let _ = engine.push(&[], &[&b], move |ctx| {
        *ctx.write(&b2)? = 1;
        tx.send(42).unwrap();
        Ok(())
    });
    assert_eq!(within(20, move || waiter.wait()).unwrap(), 42);
    assert_eq!(value(&engine, &a), 42);
}

#[test]
fn async_op_holds_its_variables_across_awaits() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let a = engine.var(0i64);
    let (a2, a3) = (a.clone(), a.clone());
    let slow = engine
        .push_async(&[], &[&a], move |ctx| async move {
            *ctx.write(&a2)? = 1;
            // An await in the middle: a timer on another thread.
            let (tx, rx) = futures::channel::oneshot::channel();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                let _ = tx.send(());
            });
            rx.await.ok();
            *ctx.write(&a2)? = 2;
            Ok(())
        })
        .unwrap();
    // Pushed after: must see the async op's final value, never the middle one.
    let read = engine
        .push(&[&a], &[], move |ctx| Ok(*ctx.read(&a3)?))
        .unwrap();
    assert_eq!(read.wait().unwrap(), 2);
    slow.wait().unwrap();
}

#[test]
fn async_op_awaits_another_ops_handle() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let (a, b) = (engine.var(20i64), engine.var(0i64));
    let a2 = a.clone();
    let first = engine
        .push(&[&a], &[], move |ctx| Ok(*ctx.read(&a2)? + 1))
        .unwrap();
    let b2 = b.clone();
    let second = engine
        .push_async(&[], &[&b], move |ctx| async move {
            let x = first.await?;
            *ctx.write(&b2)? = x * 2;
            Ok(())
        })
        .unwrap();
    within(20, move || second.wait()).unwrap();
    assert_eq!(value(&engine, &b), 42);
}

#[test]
fn priorities_order_ready_ops() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let blocker = engine.new_var();
    // Occupy the only worker until every other op is ready.
    let _ = engine.push(&[], &[&blocker], move |_| {
        started_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        Ok(())
    });
    started_rx.recv().unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let priorities = [3, -1, 0, 5, 1, 0, -2, 5];
    for (i, &p) in priorities.iter().enumerate() {
        let v = engine.new_var();
        let order = order.clone();
        drop(
            engine
                .op()
                .priority(p)
                .mutates(&[&v])
                .run(move |_| {
                    order.lock().unwrap().push((p, i));
                    Ok(())
                })
                .unwrap(),
        );
    }
    release_tx.send(()).unwrap();
    engine.wait_all().wait().unwrap();
    let got = order.lock().unwrap().clone();
    // Higher first; equal priorities in the order they became ready.
    assert_eq!(
        got,
        vec![
            (5, 3),
            (5, 7),
            (3, 0),
            (1, 4),
            (0, 2),
            (0, 5),
            (-1, 1),
            (-2, 6)
        ]
    );
}

#[test]
fn priority_never_overrides_dependencies() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let log = engine.var(Vec::new());
    for i in 0..50 {
        let log2 = log.clone();
        drop(
            engine
                .op()
                .priority(i)
                .mutates(&[&log])
                .run(move |ctx| {
                    ctx.write(&log2)?.push(i);
                    Ok(())
                })
                .unwrap(),
        );
    }
    engine.wait_all().wait().unwrap();
    let log2 = log.clone();
    let got = engine.push(&[&log], &[], move |ctx| Ok(ctx.read(&log2)?.clone()));
    assert_eq!(got.unwrap().wait().unwrap(), (0..50).collect::<Vec<_>>());
}

#[test]
fn named_devices_run_ops_on_their_own_threads() {
    let engine = Engine::builder()
        .threads(1)
        .device("gpu0", depflow::Executor::pool(2))
        .device("gpu1", depflow::Executor::pool(2))
        .build()
        .unwrap();
    for name in ["gpu0", "gpu1"] {
        let device = engine.device(name).unwrap();
        assert_eq!(engine.device_name(device), Some(name));
        let v = engine.new_var();
        let thread = engine
            .op()
            .on(device)
            .mutates(&[&v])
            .run(|ctx| {
                let _ = ctx.device();
                Ok(std::thread::current().name().unwrap_or("").to_string())
            })
            .unwrap()
            .wait()
            .unwrap();
        assert!(
            thread.starts_with(&format!("depflow-{name}-")),
            "ran on {thread}"
        );
    }
    assert!(engine.device("nope").is_none());
}

#[test]
fn inline_executor_runs_ready_ops_inside_push() {
    let engine = Engine::builder()
        .executor(depflow::Executor::inline())
        .build()
        .unwrap();
    let v = engine.new_var();
    let me = std::thread::current().id();
    let handle = engine
        .push(&[], &[&v], move |_| Ok(std::thread::current().id() == me))
        .unwrap();
    assert!(handle.is_finished(), "the op should have run inside push");
    assert!(handle.wait().unwrap());
}

#[test]
fn ops_run_on_a_tokio_runtime_through_a_custom_executor() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let handle = rt.handle().clone();
    let engine = Engine::builder()
        .executor(depflow::Executor::custom(move |job| {
            handle.spawn(async move {
                job.run();
            });
        }))
        .build()
        .unwrap();
    let v = engine.var(0i64);
    let v2 = v.clone();
    // An async op using tokio's timer: it runs inside the runtime.
    let op = engine
        .push_async(&[], &[&v], move |ctx| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            *ctx.write(&v2)? = 9;
            Ok(())
        })
        .unwrap();
    rt.block_on(async {
        op.await.unwrap();
        engine.wait_for_var(&v).await.unwrap();
    });
    assert_eq!(v.version(), 1);
}

#[test]
fn rng_draws_are_the_same_whatever_the_thread_count() {
    let run = |engine: Engine| -> Vec<u64> {
        let rng = engine.var(Rng(2024));
        let outs: Vec<_> = (0..64).map(|_| engine.var(0u64)).collect();
        let noise = engine.var(0u64);
        for round in 0..20 {
            for out in &outs {
                let (rng2, out2) = (rng.clone(), out.clone());
                // Each op mutates the RNG: draws are serialised in push order.
                let _ = engine.push(&[], &[&rng, out], move |ctx| {
                    let x = ctx.write(&rng2)?.next();
                    *ctx.write(&out2)? ^= x;
                    Ok(())
                });
                if round % 3 == 0 {
                    let noise2 = noise.clone();
                    let _ = engine.push(&[out], &[&noise], move |ctx| {
                        *ctx.write(&noise2)? += 1;
                        Ok(())
                    });
                }
            }
        }
        engine.wait_all().wait().unwrap();
        outs.iter()
            .map(|o| {
                let o2 = o.clone();
                engine
                    .push(&[o], &[], move |ctx| Ok(*ctx.read(&o2)?))
                    .unwrap()
                    .wait()
                    .unwrap()
            })
            .collect()
    };
    let reference = run(Engine::builder()
        .executor(depflow::Executor::inline())
        .build()
        .unwrap());
    for threads in [1, 2, 4, 8] {
        assert_eq!(
            run(Engine::builder().threads(threads).build().unwrap()),
            reference,
            "{threads} threads"
        );
    }
}

#[test]
fn dropping_a_handle_does_not_cancel_the_op() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let v = engine.var(0i64);
    let v2 = v.clone();
    drop(engine.push(&[], &[&v], move |ctx| {
        std::thread::sleep(Duration::from_millis(20));
        *ctx.write(&v2)? = 3;
        Ok(())
    }));
    engine.wait_for_var(&v).wait().unwrap();
    assert_eq!(value(&engine, &v), 3);
}

#[test]
fn several_engines_coexist() {
    let e1 = Engine::builder().threads(1).build().unwrap();
    let e2 = Engine::builder().threads(1).build().unwrap();
    let (a, b) = (e1.var(1i64), e2.var(2i64));
    add(&e1, &[], &a, 10);
    add(&e2, &[], &b, 20);
    assert_eq!((value(&e1, &a), value(&e2, &b)), (11, 22));
}
