//! Recorded graphs: replays behave as the same ops pushed, in recorded
//! order, at the replay's call.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use depflow::{Engine, Error, Executor, Order, Var};

fn engine(threads: usize) -> Engine {
    Engine::builder().threads(threads).build().unwrap()
}

/// Keeps the calling thread busy for `d`.
fn spin(d: std::time::Duration) {
    let start = std::time::Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// `y += 2x + 1` through an intermediate, replayed n times.
fn affine(engine: &Engine, x: &Var<i64>, y: &Var<i64>) -> depflow::Graph {
    engine
        .record(|rec| {
            let t = rec.var(0i64);
            rec.op().name("double").reads(&[x]).mutates(&[&t]).run({
                let (x, t) = (x.key(), t.key());
                move |ctx| {
                    *ctx.write(t)? = 2 * *ctx.read(x)?;
                    Ok(())
                }
            })?;
            rec.op().name("add").reads(&[&t]).mutates(&[y]).run({
                let (t, y) = (t.key(), y.key());
                move |ctx| {
                    *ctx.write(y)? += *ctx.read(t)? + 1;
                    Ok(())
                }
            })
        })
        .unwrap()
}

#[test]
fn replays_add_up_and_order_with_pushed_ops() {
    for threads in [1, 2] {
        let engine = engine(threads);
        let (x, y) = (engine.var(3i64), engine.var(0i64));
        let graph = affine(&engine, &x, &y);
        assert_eq!(y.version(), 0, "recording runs nothing");
        for i in 0..50 {
            // A pushed op between replays changes x: the next replay sees it.
            graph.replay();
            let xk = x.key();
            engine
                .push(&[], &[&x], move |ctx| {
                    *ctx.write(xk)? = i;
                    Ok(())
                })
                .unwrap();
        }
        let want: i64 = std::iter::once(3).chain(0..49).map(|x| 2 * x + 1).sum();
        assert_eq!(engine.get(&y).wait().unwrap(), want);
        assert_eq!(y.version(), 50, "one mutation of y per replay");
        engine.wait_all().wait().unwrap();
    }
}

#[test]
fn a_failure_poisons_like_a_pushed_op_and_the_graph_recovers() {
    let engine = engine(2);
    let (x, out) = (engine.var(1i64), engine.var(0i64));
    let fail = Arc::new(AtomicUsize::new(1));
    let graph = engine
        .record(|rec| {
            let t = rec.var(0i64);
            rec.op()
                .name("maybe fail")
                .reads(&[&x])
                .mutates(&[&t])
                .run({
                    let (x, t, fail) = (x.key(), t.key(), fail.clone());
                    move |ctx| {
                        if fail.load(Ordering::SeqCst) == 1 {
                            return Err("boom".into());
                        }
                        *ctx.write(t)? = *ctx.read(x)?;
                        Ok(())
                    }
                })?;
            rec.op().name("copy").reads(&[&t]).mutates(&[&out]).run({
                let (t, out) = (t.key(), out.key());
                move |ctx| {
                    *ctx.write(out)? = *ctx.read(t)? + 10;
                    Ok(())
                }
            })
        })
        .unwrap();
    match graph.replay().wait() {
        Err(Error::Failed(f)) => assert_eq!(f.op_name(), Some("maybe fail")),
        other => panic!("{other:?}"),
    }
    // The output is poisoned, as a pushed `copy` would have left it.
    assert!(matches!(
        engine.get(&out).wait(),
        Err(Error::Poisoned { .. })
    ));
    assert!(matches!(
        engine.wait_all().wait(),
        Err(Error::Failures { count: 1, .. })
    ));
    engine.clear_poison(&out).unwrap().wait().unwrap();
    fail.store(0, Ordering::SeqCst);
    graph.replay().wait().unwrap();
    assert_eq!(engine.get(&out).wait().unwrap(), 11);
}

#[test]
fn intermediates_are_the_graphs_own() {
    let engine = engine(1);
    let x = engine.var(1i64);
    let mut leaked = None;
    let graph = engine
        .record(|rec| {
            let t = rec.var(0i64);
            leaked = Some(t.clone());
            rec.push(&[&x], &[&t], |_| Ok(()))
        })
        .unwrap();
    let t = leaked.unwrap();
    assert!(matches!(
        engine.push(&[&t], &[], |_| Ok(())),
        Err(Error::GraphOwned(_))
    ));
    assert!(matches!(
        engine.record(|rec| rec.push(&[&t], &[&x], |_| Ok(()))),
        Err(Error::GraphOwned(_))
    ));
    graph.replay().wait().unwrap();
}

#[test]
fn bad_recordings_are_refused() {
    let engine = engine(1);
    let x = engine.var(0u8);
    // Recording inside an op.
    let e2 = engine.clone();
    let inside = engine
        .push(&[], &[&x], move |_| {
            Ok(e2.record(|_| Ok::<(), depflow::Error>(())).err())
        })
        .unwrap()
        .wait()
        .unwrap();
    assert!(matches!(inside, Some(Error::Graph(_))), "{inside:?}");
    // A buffer read before anything writes it.
    let r = engine.record(|rec| {
        let b = rec.buffer::<f32>(4);
        rec.push(&[&b], &[&x], |_| Ok(()))
    });
    assert!(matches!(r, Err(Error::Graph(_))), "{r:?}");
    // A stream device is recorded (tests/graph_streams.rs), but not a lane
    // it lacks.
    let gpu_engine = Engine::builder()
        .device("gpu", Executor::simulated_gpu(1))
        .build()
        .unwrap();
    let gpu = gpu_engine.device("gpu").unwrap();
    let v = gpu_engine.new_var();
    let r = gpu_engine.record(|rec| rec.op().on(gpu).mutates(&[&v]).run(|_| Ok(())));
    r.unwrap().replay().wait().unwrap();
    let r = gpu_engine.record(|rec| {
        rec.op()
            .on(gpu)
            .lane(depflow::Lane::Compute(5))
            .mutates(&[&v])
            .run(|_| Ok(()))
    });
    assert!(matches!(r, Err(Error::Stream(_))), "{r:?}");
    // Another engine's variable.
    let other = Engine::new();
    let w = other.var(0u8);
    let r = engine.record(|rec| rec.push(&[&w], &[&x], |_| Ok(())));
    assert!(matches!(r, Err(Error::ForeignVar(_))), "{r:?}");
}

#[test]
fn a_replay_after_shutdown_is_refused() {
    let engine = engine(1);
    let x = engine.var(0i64);
    let y = engine.var(0i64);
    let graph = affine(&engine, &x, &y);
    graph.replay().wait().unwrap();
    engine.shutdown().wait().unwrap();
    assert!(matches!(graph.replay().wait(), Err(Error::ShutDown)));
    assert!(matches!(
        engine.record(|_| Ok::<(), depflow::Error>(())),
        Err(Error::ShutDown)
    ));
}

#[test]
fn a_replay_outlives_its_dropped_graph_and_engine() {
    let engine = engine(2);
    let (x, y) = (engine.var(1i64), engine.var(0i64));
    let graph = affine(&engine, &x, &y);
    let replays: Vec<_> = (0..20).map(|_| graph.replay()).collect();
    drop(graph);
    for r in replays {
        r.wait().unwrap();
    }
    assert_eq!(engine.get(&y).wait().unwrap(), 60);
    drop(engine);
}

#[test]
fn buffers_are_planned_and_shared() {
    let engine = engine(2);
    let (input, out) = (engine.var(vec![1.0f32; 16]), engine.var(0.0f32));
    let graph = engine
        .record(|rec| {
            rec.order(Order::Sequential);
            // A chain of four 16-float buffers: only neighbours live at once.
            let bufs: Vec<_> = (0..4).map(|_| rec.buffer::<f32>(16)).collect();
            rec.push(&[&input], &[&bufs[0]], {
                let (input, b) = (input.key(), bufs[0].clone());
                move |ctx| {
                    ctx.write(&b)?.copy_from_slice(&ctx.read(input)?);
                    Ok(())
                }
            })?;
            for w in bufs.windows(2) {
                let (a, b) = (w[0].clone(), w[1].clone());
                rec.push(&[&w[0]], &[&w[1]], move |ctx| {
                    let a = ctx.read(&a)?;
                    for (b, a) in ctx.write(&b)?.iter_mut().zip(a.iter()) {
                        *b = a * 2.0;
                    }
                    Ok(())
                })?;
            }
            let (last, ok) = (bufs[3].clone(), out.key());
            rec.push(&[&bufs[3]], &[&out], move |ctx| {
                *ctx.write(ok)? = ctx.read(&last)?.iter().sum();
                Ok(())
            })
        })
        .unwrap();
    let plan = graph.plan();
    assert_eq!(plan.total_bytes, 4 * 64);
    assert_eq!(plan.arena_bytes, 2 * 64, "{plan:?}");
    assert!(
        !graph.is_allocated(),
        "memory is taken by a replay, not at recording"
    );
    for _ in 0..3 {
        graph.replay().wait().unwrap();
        assert_eq!(engine.get(&out).wait().unwrap(), 16.0 * 8.0);
    }
    assert!(graph.is_allocated());
    let dot = graph.to_dot();
    assert_eq!(dot.matches("->").count(), graph.edges().len());
}

#[test]
fn an_op_after_the_last_write_sees_the_version_a_push_would() {
    let engine = engine(2);
    let (y, seen) = (engine.var(0u64), engine.var(0u64));
    let graph = engine
        .record(|rec| {
            rec.op().name("write").mutates(&[&y]).run({
                let y = y.key();
                move |ctx| {
                    *ctx.write(y)? += 1;
                    Ok(())
                }
            })?;
            rec.op()
                .name("observe")
                .reads(&[&y])
                .mutates(&[&seen])
                .run({
                    let (y, seen) = (y.clone(), seen.key());
                    move |ctx| {
                        *ctx.write(seen)? = y.version();
                        Ok(())
                    }
                })
        })
        .unwrap();
    for i in 1..=3 {
        graph.replay().wait().unwrap();
        // Pushed, `observe` would run after `write` had counted its mutation.
        assert_eq!(engine.get(&seen).wait().unwrap(), i, "replay {i}");
        assert_eq!(y.version(), i);
    }
}

#[test]
fn a_replay_counts_each_mutation_once_on_an_op_with_many_variables() {
    let engine = engine(1);
    let vars: Vec<Var<u8>> = (0..70).map(|_| engine.var(0)).collect();
    let decl: Vec<&dyn depflow::AnyVar> = vars.iter().map(|v| v as _).collect();
    let graph = engine
        .record(|rec| rec.push(&[], &decl, |_| Ok(())))
        .unwrap();
    graph.replay().wait().unwrap();
    graph.replay().wait().unwrap();
    for (i, v) in vars.iter().enumerate() {
        assert_eq!(v.version(), 2, "variable {i}");
    }
}

/// Ops a finished op makes ready together run in parallel when workers
/// are idle: the thread that made them ready keeps some to run itself (no
/// queue round trip), but hands the others to idle workers. Each body here
/// waits for a sibling to run at the same time (a generous bound on the
/// wait, so that a lost parallelism fails rather than hangs).
#[test]
fn siblings_made_ready_together_run_on_idle_workers() {
    use std::time::{Duration, Instant};
    let engine = engine(2);
    let a = engine.var(0u64);
    let outs: Vec<Var<u64>> = (0..8).map(|_| engine.var(0u64)).collect();
    let running = Arc::new(AtomicUsize::new(0));
    let graph = engine
        .record(|rec| {
            let ak = a.key();
            rec.op().name("start").mutates(&[&a]).run(move |ctx| {
                *ctx.write(ak)? += 1;
                Ok(())
            })?;
            for out in &outs {
                let (ak, ok, running) = (a.key(), out.key(), running.clone());
                rec.op()
                    .name("sibling")
                    .reads(&[&a])
                    .mutates(&[out])
                    .run(move |ctx| {
                        let seen = running.fetch_add(1, Ordering::SeqCst);
                        let deadline = Instant::now() + Duration::from_secs(20);
                        // The first of each replay waits for a second to
                        // start; the others pass (they may all end before
                        // the first looks again).
                        while seen % 8 == 0 && running.load(Ordering::SeqCst) < seen + 2 {
                            if Instant::now() > deadline {
                                return Err("no sibling ran alongside".into());
                            }
                            std::thread::yield_now();
                        }
                        *ctx.write(ok)? += *ctx.read(ak)?;
                        Ok(())
                    })?;
            }
            Ok::<(), depflow::Error>(())
        })
        .unwrap();
    for i in 1..=20u64 {
        graph.replay().wait().unwrap();
        assert_eq!(engine.get(&outs[7]).wait().unwrap(), i * (i + 1) / 2);
    }
}

/// A replay measures its ops (the second replay does): one that was long
/// next to the others is not run inline from then on, where the ops its
/// thread keeps would wait for its end, but woken onto the executor. The
/// long op here waits for all three of its siblings to have run (a generous
/// bound: a sibling held back behind it fails the test rather than hangs
/// it).
#[test]
fn a_long_recorded_op_does_not_hold_its_ready_siblings_back() {
    use std::time::{Duration, Instant};
    let engine = engine(2);
    let root = engine.var(0u64);
    let outs: Vec<Var<u64>> = (0..4).map(|_| engine.var(0u64)).collect();
    let siblings_ran = Arc::new(AtomicUsize::new(0));
    let graph = engine
        .record(|rec| {
            let (rk, ran) = (root.key(), siblings_ran.clone());
            rec.op().name("root").mutates(&[&root]).run(move |ctx| {
                ran.store(0, Ordering::SeqCst);
                *ctx.write(rk)? += 1;
                Ok(())
            })?;
            // Recorded first: the first op the root makes ready, which the
            // thread that ran the root runs next, keeping the others.
            let (rk, ok, ran) = (root.key(), outs[0].key(), siblings_ran.clone());
            rec.op()
                .name("long")
                .reads(&[&root])
                .mutates(&[&outs[0]])
                .run(move |ctx| {
                    let replay = *ctx.read(rk)?;
                    if replay <= 2 {
                        // Not measured yet, then measured: long.
                        spin(Duration::from_millis(2));
                    } else {
                        let deadline = Instant::now() + Duration::from_secs(20);
                        while ran.load(Ordering::SeqCst) < 3 {
                            if Instant::now() > deadline {
                                return Err(
                                    format!("replay {replay}: a sibling was held back").into()
                                );
                            }
                            std::thread::yield_now();
                        }
                    }
                    *ctx.write(ok)? += 1;
                    Ok(())
                })?;
            for out in &outs[1..] {
                let (ok, ran) = (out.key(), siblings_ran.clone());
                rec.op()
                    .name("short")
                    .reads(&[&root])
                    .mutates(&[out])
                    .run(move |ctx| {
                        *ctx.write(ok)? += 1;
                        ran.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })?;
            }
            Ok::<(), depflow::Error>(())
        })
        .unwrap();
    for i in 1..=6u64 {
        graph.replay().wait().unwrap();
        assert_eq!(engine.get(&outs[0]).wait().unwrap(), i);
    }
}

/// A long op of higher priority is woken rather than run inline (see the
/// test above), and the ops its thread keeps go to the executor with it,
/// which runs it first: on one thread, the long op runs right after the
/// sibling run inline, not after all the kept ones.
#[test]
fn a_long_recorded_op_of_higher_priority_runs_before_the_ops_kept_beside_it() {
    use std::sync::Mutex;
    use std::time::Duration;
    let engine = engine(1);
    let root = engine.var(0u64);
    let outs: Vec<Var<u64>> = (0..4).map(|_| engine.var(0u64)).collect();
    let order = Arc::new(Mutex::new(Vec::new()));
    let graph = engine
        .record(|rec| {
            let rk = root.key();
            rec.op().name("root").mutates(&[&root]).run(move |ctx| {
                *ctx.write(rk)? += 1;
                Ok(())
            })?;
            for (i, out) in outs.iter().enumerate() {
                let (ok, order) = (out.key(), order.clone());
                let op = rec.op().reads(&[&root]).mutates(&[out]);
                // The first made ready (so it runs inline while the others
                // are kept, and is measured): long, of higher priority.
                let op = if i == 0 {
                    op.name("long").priority(5)
                } else {
                    op.name("short")
                };
                op.run(move |ctx| {
                    if i == 0 {
                        spin(Duration::from_millis(5));
                    }
                    order.lock().unwrap().push(i);
                    *ctx.write(ok)? += 1;
                    Ok(())
                })?;
            }
            Ok::<(), depflow::Error>(())
        })
        .unwrap();
    for replay in 1..=6u64 {
        order.lock().unwrap().clear();
        graph.replay().wait().unwrap();
        assert_eq!(engine.get(&outs[0]).wait().unwrap(), replay);
        let order = order.lock().unwrap().clone();
        if replay <= 2 {
            // Not measured yet, then measured: run inline, first.
            assert_eq!(order, [0, 1, 2, 3], "replay {replay}");
        } else {
            // The sibling made ready next runs inline, then the long op; the
            // kept ones after it, in whichever order.
            assert_eq!(order[..2], [1, 0], "replay {replay}: {order:?}");
        }
    }
}

/// A recorded op's context is kept from one replay to the next: a borrow
/// its body forgot (a leaked guard) does not outlive the run.
#[test]
fn a_borrow_forgotten_in_one_replay_is_gone_in_the_next() {
    let engine = engine(1);
    let y = engine.var(0u64);
    let graph = engine
        .record(|rec| {
            let yk = y.key();
            rec.op().mutates(&[&y]).run(move |ctx| {
                let mut v = ctx.write(yk)?;
                *v += 1;
                std::mem::forget(v);
                Ok(())
            })
        })
        .unwrap();
    for _ in 0..3 {
        graph.replay().wait().unwrap();
    }
    assert_eq!(engine.get(&y).wait().unwrap(), 3);
}
