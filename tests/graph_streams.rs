//! Recorded graphs with ops on stream devices (the simulated GPU) and ops
//! taking resource units: a replay behaves as its ops pushed at the
//! replay's call (lanes, device order and failures as `tests/streams.rs`
//! checks for pushed ops; units in push order, never over capacity).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::streams::{check_replay_orders_with_pushed_ops, failed, poisoned, store_from, update};
use common::{Mem, gate, gpu_engine, within};
use depflow::{Engine, Error, Executor, Lane, Var};

/// Records on `gpu`: `m = m * 10 + digit` as device work on `lane`.
fn record_digit(
    rec: &mut depflow::Recorder<'_>,
    gpu: depflow::Device,
    lane: Lane,
    reads: &[&dyn depflow::AnyVar],
    m: &Var<Mem>,
    digit: u64,
) -> Result<(), Error> {
    rec.op()
        .name(format!("digit {digit}"))
        .on(gpu)
        .lane(lane)
        .reads(reads)
        .mutates(&[m])
        .run(update(m, move |m| {
            m.store(m.load(SeqCst) * 10 + digit, SeqCst)
        }))
}

#[test]
fn device_ops_in_a_replay_keep_lane_and_program_order() {
    within(60, || {
        let (engine, gpu) = gpu_engine(2);
        let raw = Mem::default();
        let m = engine.var(raw.clone());
        let out = engine.var(0u64);
        let graph = engine
            .record(|rec| {
                record_digit(rec, gpu, Lane::Compute(0), &[], &m, 1)?;
                record_digit(rec, gpu, Lane::Compute(0), &[], &m, 2)?;
                record_digit(rec, gpu, Lane::Compute(1), &[], &m, 3)?;
                // A host op after the device work, inside the graph.
                rec.op().reads(&[&m]).mutates(&[&out]).run({
                    let (m, out) = (m.key(), out.key());
                    move |ctx| {
                        *ctx.write(out)? = ctx.read(m)?.load(SeqCst);
                        Ok(())
                    }
                })
            })
            .unwrap();
        for round in 1..=3u64 {
            raw.store(0, SeqCst);
            graph.replay().wait().unwrap();
            // Over only once every op's device work is done.
            assert_eq!(raw.load(SeqCst), 123, "round {round}");
            assert_eq!(engine.get(&out).wait().unwrap(), 123);
        }
        // Unrolled replays without waiting: each behind the last.
        for _ in 0..5 {
            graph.replay();
        }
        engine.wait_all().wait().unwrap();
        assert_eq!(raw.load(SeqCst), 123_123_123_123_123_123);
        assert_eq!(m.version(), 3 * 8, "each recorded mutation counted");
    });
}

#[test]
fn device_successors_are_enqueued_before_their_predecessor_finishes_and_host_ones_wait() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let raw = Mem::default();
        let m = engine.var(raw.clone());
        let (open, shut) = gate();
        let (enqueued_tx, enqueued) = mpsc::channel::<&'static str>();
        let enqueued_tx = Mutex::new(enqueued_tx);
        let enqueued_tx = Arc::new(enqueued_tx);
        let graph = engine
            .record(|rec| {
                let k = m.key();
                rec.op()
                    .name("gated")
                    .on(gpu)
                    .lane(Lane::Compute(0))
                    .mutates(&[&m])
                    .run(update(&m, move |m| {
                        shut.pass();
                        m.store(1, SeqCst);
                    }))?;
                for (lane, name, digit) in [
                    (Lane::Compute(0), "same", 2),
                    (Lane::Compute(1), "other", 3),
                ] {
                    let tx = enqueued_tx.clone();
                    rec.op()
                        .name(name)
                        .on(gpu)
                        .lane(lane)
                        .mutates(&[&m])
                        .run(move |ctx| {
                            let m = ctx.write(k)?.clone();
                            tx.lock().unwrap().send(name).unwrap();
                            Ok(ctx.stream()?.enqueue(move || {
                                m.store(m.load(SeqCst) * 10 + digit, SeqCst);
                                Ok(())
                            })?)
                        })?;
                }
                // A host op after them waits for their device work.
                let tx = enqueued_tx.clone();
                rec.op().name("host").reads(&[&m]).run(move |ctx| {
                    tx.lock().unwrap().send("host").unwrap();
                    assert_eq!(ctx.read(k)?.load(SeqCst), 123);
                    Ok(())
                })
            })
            .unwrap();
        let replay = graph.replay();
        // The ops on the gated op's device are enqueued while the gate is
        // shut, as pushed ones are (tests/streams.rs): on its lane behind
        // it, on the other lane behind a stream wait for its event.
        for want in ["same", "other"] {
            assert_eq!(
                enqueued.recv_timeout(Duration::from_secs(30)).unwrap(),
                want
            );
        }
        // The host op waits for the device work to be done. (Only a broken
        // order depends on this delay.)
        assert!(
            enqueued.recv_timeout(Duration::from_millis(200)).is_err(),
            "a host op went before its predecessors' device work was done"
        );
        open.send(()).unwrap();
        replay.wait().unwrap();
        assert_eq!(enqueued.try_recv().unwrap(), "host");
        // In program order on the device, across lanes.
        assert_eq!(raw.load(SeqCst), 123);
    });
}

#[test]
fn a_replay_orders_with_pushed_device_and_host_ops_before_and_after() {
    within(60, || check_replay_orders_with_pushed_ops(false));
}

#[test]
fn a_device_failure_poisons_skips_and_fails_the_replay_which_stays_usable() {
    // The consumer on the failing op's lane is enqueued behind the failure
    // (and inherits it through its fence); on another lane it is skipped.
    for consumer_lane in [Lane::Compute(0), Lane::Compute(1)] {
        within(60, move || {
            let (engine, gpu) = gpu_engine(2);
            let (v, h) = (engine.var(Mem::default()), engine.var(0u64));
            let fail = Arc::new(AtomicBool::new(true));
            let graph = engine
                .record(|rec| {
                    let t = rec.var(Mem::default());
                    let (vk, tk, hk) = (v.key(), t.key(), h.key());
                    let fail = fail.clone();
                    rec.op()
                        .name("kernel")
                        .on(gpu)
                        .mutates(&[&v])
                        .run(move |ctx| {
                            let v = ctx.write(vk)?.clone();
                            let fail = fail.load(SeqCst);
                            Ok(ctx.stream()?.enqueue(move || {
                                if fail {
                                    return Err("illegal address".to_string());
                                }
                                v.store(4, SeqCst);
                                Ok(())
                            })?)
                        })?;
                    rec.op()
                        .name("consumer")
                        .on(gpu)
                        .lane(consumer_lane)
                        .reads(&[&v])
                        .mutates(&[&t])
                        .run(store_from(&v, &t, false, |v| v + 1))?;
                    rec.op()
                        .name("host")
                        .reads(&[&t])
                        .mutates(&[&h])
                        .run(move |ctx| {
                            *ctx.write(hk)? = ctx.read(tk)?.load(SeqCst);
                            Ok(())
                        })
                })
                .unwrap();
            let f = failed(graph.replay().wait());
            assert_eq!(f.op_name(), Some("kernel"), "{consumer_lane:?}");
            assert!(f.to_string().contains("illegal address"), "{f}");
            for got in [
                engine.wait_for_var(&h).wait(),
                engine.wait_for_var(&v).wait(),
            ] {
                let cause = poisoned(got);
                assert_eq!(cause.op_name(), Some("kernel"), "{consumer_lane:?}");
            }
            // Reported once: the skipped ops' poison is not a new failure.
            assert!(matches!(
                engine.wait_all().wait(),
                Err(Error::Failures { count: 1, .. })
            ));
            // The graph stays usable: its intermediate starts afresh.
            fail.store(false, SeqCst);
            engine.clear_poison(&v).unwrap();
            engine.clear_poison(&h).unwrap();
            graph.replay().wait().unwrap();
            assert_eq!(engine.get(&h).wait().unwrap(), 5);
        });
    }
}

#[test]
fn a_body_error_on_a_device_fails_the_replay() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let v = engine.var(0u32);
        let graph = engine
            .record(|rec| {
                rec.op()
                    .name("refuses")
                    .on(gpu)
                    .mutates(&[&v])
                    .run(|_| Err::<(), _>("no".into()))
            })
            .unwrap();
        for _ in 0..2 {
            assert_eq!(failed(graph.replay().wait()).op_name(), Some("refuses"));
            engine.clear_poison(&v).unwrap();
        }
    });
}

#[test]
fn shutdown_waits_for_a_replays_device_work() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let raw = Mem::default();
        let m = engine.var(raw.clone());
        let (open, shut) = gate();
        let graph = engine
            .record(|rec| {
                rec.op().on(gpu).mutates(&[&m]).run(update(&m, move |m| {
                    shut.pass();
                    m.store(9, SeqCst);
                }))
            })
            .unwrap();
        let replay = graph.replay();
        let shutdown = engine.shutdown();
        open.send(()).unwrap();
        shutdown.wait().unwrap();
        assert_eq!(
            raw.load(SeqCst),
            9,
            "shut down before the replay's device work"
        );
        replay.wait().unwrap();
        assert!(matches!(graph.replay().wait(), Err(Error::ShutDown)));
    });
}

/// Counts live holders of a resource's units, keeping the high-water mark.
#[derive(Default)]
struct Live {
    now: AtomicU64,
    high: AtomicU64,
    ran: AtomicU64,
}

impl Live {
    fn enter(&self) {
        let now = self.now.fetch_add(1, SeqCst) + 1;
        self.high.fetch_max(now, SeqCst);
        self.ran.fetch_add(1, SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, SeqCst);
    }
}

#[test]
fn units_hold_a_replay_back_without_exceeding_capacity() {
    within(120, || {
        let (engine, gpu) = gpu_engine(4);
        let slots = engine.new_resource("slots", 2);
        let live = Arc::new(Live::default());
        let vars: Vec<Var> = (0..12).map(|_| engine.new_var()).collect();
        let graph = engine
            .record(|rec| {
                for (i, v) in vars.iter().enumerate() {
                    let live = live.clone();
                    if i % 3 == 2 {
                        // On the device, the units are held until its work is done.
                        rec.op()
                            .on(gpu)
                            .lane(Lane::Compute((i % 2) as u8))
                            .mutates(&[v])
                            .uses(&slots, 1)
                            .run(move |ctx| {
                                live.enter();
                                let live = live.clone();
                                Ok(ctx.stream()?.enqueue(move || {
                                    std::thread::sleep(Duration::from_millis(1));
                                    live.leave();
                                    Ok(())
                                })?)
                            })?;
                    } else {
                        rec.op().mutates(&[v]).uses(&slots, 1).run(move |_| {
                            live.enter();
                            std::thread::sleep(Duration::from_millis(1));
                            live.leave();
                            Ok(())
                        })?;
                    }
                }
                Ok::<(), depflow::Error>(())
            })
            .unwrap();
        for _ in 0..10 {
            graph.replay();
        }
        graph.replay().wait().unwrap();
        assert_eq!(live.ran.load(SeqCst), 12 * 11);
        assert!(
            live.high.load(SeqCst) <= 2,
            "{} units in use",
            live.high.load(SeqCst)
        );
        assert_eq!(slots.in_use(), 0);
        engine.wait_all().wait().unwrap();
    });
}

#[test]
fn a_replays_units_come_in_push_order_with_pushed_ops() {
    within(60, || {
        let engine = Engine::builder().threads(2).build().unwrap();
        let slot = engine.new_resource("slot", 1);
        let log = Arc::new(Mutex::new(Vec::new()));
        let (a, b, held) = (engine.new_var(), engine.new_var(), engine.new_var());
        let input = engine.new_var();
        let graph = engine
            .record(|rec| {
                for (v, name) in [(&a, "replay 1"), (&b, "replay 2")] {
                    let log = log.clone();
                    rec.op()
                        .reads(&[&input])
                        .mutates(&[v])
                        .uses(&slot, 1)
                        .run(move |_| {
                            log.lock().unwrap().push(name);
                            Ok(())
                        })?;
                }
                Ok::<(), depflow::Error>(())
            })
            .unwrap();
        // Pushed before: holds the slot, and the replay's input, until the
        // gate opens.
        let (open, shut) = gate();
        let first = engine
            .op()
            .mutates(&[&input])
            .uses(&slot, 1)
            .run(move |_| {
                shut.pass();
                Ok(())
            })
            .unwrap();
        let replay = graph.replay();
        // Pushed after, allocating: it waits for every older request on the
        // slot, the replay's ops' included, though they share no variable.
        let log2 = log.clone();
        let after = engine
            .op()
            .mutates(&[&held])
            .allocates(&slot, 1, &held)
            .run(move |_| {
                log2.lock().unwrap().push("pushed after");
                Ok(())
            })
            .unwrap();
        open.send(()).unwrap();
        first.wait().unwrap();
        replay.wait().unwrap();
        after.wait().unwrap();
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 3);
        assert_eq!(log[2], "pushed after", "{log:?}");
    });
}

#[test]
fn recorded_units_are_checked_and_lasting_ones_refused() {
    let (engine, gpu) = gpu_engine(1);
    let slot = engine.new_resource("slot", 2);
    let other = Engine::new().new_resource("theirs", 2);
    let v = engine.new_var();
    let refused = |f: &dyn Fn(&mut depflow::Recorder<'_>) -> Result<(), Error>| {
        engine.record(|rec| f(rec)).unwrap_err()
    };
    assert!(matches!(
        refused(&|rec| rec.op().mutates(&[&v]).uses(&slot, 3).run(|_| Ok(()))),
        Error::OverCapacity { .. }
    ));
    assert!(matches!(
        refused(&|rec| rec.op().mutates(&[&v]).uses(&other, 1).run(|_| Ok(()))),
        Error::ForeignResource(_)
    ));
    match refused(&|rec| {
        rec.op()
            .mutates(&[&v])
            .allocates(&slot, 1, &v)
            .run(|_| Ok(()))
    }) {
        Error::Graph(m) => assert!(m.contains("planned buffers"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        refused(&|rec| rec
            .op()
            .lane(Lane::Compute(0))
            .mutates(&[&v])
            .run(|_| Ok(()))),
        Error::Stream(_)
    ));
    assert!(matches!(
        refused(&|rec| rec
            .op()
            .on(gpu)
            .lane(Lane::Compute(7))
            .mutates(&[&v])
            .run(|_| Ok(()))),
        Error::Stream(_)
    ));
}

#[test]
fn a_recorded_host_op_is_skipped_on_an_input_a_pushed_device_op_failed_to_write() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let (v, out) = (engine.var(0u32), engine.var(0u32));
        let graph = engine
            .record(|rec| {
                rec.op().name("host").reads(&[&v]).mutates(&[&out]).run({
                    let (v, out) = (v.key(), out.key());
                    move |ctx| {
                        *ctx.write(out)? = *ctx.read(v)? + 1;
                        Ok(())
                    }
                })
            })
            .unwrap();
        let failing = engine
            .op()
            .name("kernel")
            .on(gpu)
            .mutates(&[&v])
            .run(|ctx| {
                Ok(ctx
                    .stream()?
                    .enqueue(|| Err("illegal address".to_string()))?)
            })
            .unwrap();
        // The replay only reads v: the failure stays in v's fence, which a
        // pushed host op reading v would see.
        let cause = poisoned(graph.replay().wait());
        assert_eq!(cause.op_name(), Some("kernel"));
        assert!(failing.wait().is_err());
        let cause = poisoned(engine.wait_for_var(&out).wait());
        assert_eq!(cause.op_name(), Some("kernel"));
    });
}

#[test]
fn traced_and_tracked_replays_of_device_ops_with_units() {
    within(60, || {
        let engine = Engine::builder()
            .threads(2)
            .device("gpu", Executor::simulated_gpu(2))
            .tracing(depflow::Tracing::On)
            .track_ops(true)
            .build()
            .unwrap();
        let gpu = engine.device("gpu").unwrap();
        let slots = engine.new_resource("slots", 1);
        let (a, b) = (engine.var(Mem::default()), engine.var(0u64));
        let graph = engine
            .record(|rec| {
                let (ak, bk) = (a.key(), b.key());
                rec.op()
                    .on(gpu)
                    .mutates(&[&a])
                    .uses(&slots, 1)
                    .run(update(&a, |a| {
                        a.fetch_add(1, SeqCst);
                    }))?;
                rec.op()
                    .reads(&[&a])
                    .mutates(&[&b])
                    .uses(&slots, 1)
                    .run(move |ctx| {
                        *ctx.write(bk)? = ctx.read(ak)?.load(SeqCst);
                        Ok(())
                    })
            })
            .unwrap();
        for _ in 0..3 {
            graph.replay();
        }
        graph.replay().wait().unwrap();
        assert_eq!(engine.get(&b).wait().unwrap(), 4);
        let trace = engine.trace().unwrap();
        assert!(!trace.ops().is_empty());
        // The recorded ops' grants and give-backs of `slots` show as they
        // do for pushed ops: taken (1) and free (0) again, per op run.
        let slots = trace
            .resources()
            .iter()
            .find(|r| r.name == "slots")
            .expect("the resource is traced");
        let taken = slots.in_use.iter().filter(|&&(_, n)| n == 1).count();
        let freed = slots.in_use.iter().filter(|&&(_, n)| n == 0).count();
        assert!(taken >= 8 && freed >= 8, "{:?}", slots.in_use);
        assert!(slots.in_use.iter().all(|&(_, n)| n <= 1));
        assert!(trace.to_chrome_json().contains("units of slots"));
        let diagnostics = engine.diagnostics();
        assert_eq!(
            diagnostics.ops().map(<[_]>::len),
            Some(0),
            "nothing left tracked"
        );
    });
}

#[test]
fn a_recorded_write_after_device_reads_on_another_lane_waits_for_them() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let raw = Mem::new(AtomicU64::new(1));
        let seen_raw = Mem::default();
        let (v, seen) = (engine.var(raw.clone()), engine.var(seen_raw.clone()));
        let (open, shut) = gate();
        let graph = engine
            .record(|rec| {
                let (vk, sk) = (v.key(), seen.key());
                // Reads v on lane 0, held at the gate.
                rec.op()
                    .on(gpu)
                    .lane(Lane::Compute(0))
                    .reads(&[&v])
                    .mutates(&[&seen])
                    .run(move |ctx| {
                        let (v, seen) = (ctx.read(vk)?.clone(), ctx.write(sk)?.clone());
                        let shut = shut.clone();
                        Ok(ctx.stream()?.enqueue(move || {
                            shut.pass();
                            seen.store(v.load(SeqCst), SeqCst);
                            Ok(())
                        })?)
                    })?;
                // Writes v on lane 1: enqueued at once, its work after the read's.
                rec.op()
                    .on(gpu)
                    .lane(Lane::Compute(1))
                    .mutates(&[&v])
                    .run(move |ctx| {
                        let v = ctx.write(vk)?.clone();
                        Ok(ctx.stream()?.simulate(move || {
                            v.store(2, SeqCst);
                            Ok(())
                        })?)
                    })
            })
            .unwrap();
        let replay = graph.replay();
        open.send(()).unwrap();
        replay.wait().unwrap();
        assert_eq!(seen_raw.load(SeqCst), 1, "the write ran before the read");
        assert_eq!(raw.load(SeqCst), 2);
    });
}

/// Issue 35, item 13: a recorded stream op skipped on a poisoned boundary
/// variable, while it waits for two other lanes' reads of what it
/// mutates, is woken by both fences. It must end once per replay: ended
/// twice, it satisfied its successor and counted itself out twice, so a
/// replay resolved before its ops had run, the next one armed (clearing
/// the intermediate's poison) under it, and the host op after it ran on
/// an intermediate the skip had poisoned.
///
/// Seen failing before the fix: the host op ran in most runs (5 to 422
/// times per 10,000 replays), and some runs hung.
#[test]
fn a_skipped_stream_op_woken_by_two_fences_ends_once_per_replay() {
    const ENGINES: usize = 20;
    const REPLAYS: usize = 500;
    within(60, || {
        let host_runs = Arc::new(AtomicU64::new(0));
        let bodies = Arc::new(AtomicU64::new(0));
        for _ in 0..ENGINES {
            let (engine, gpu) = gpu_engine(2);
            let (b, v) = (engine.var(0u64), engine.var(0u64));
            let bk = b.key();
            let refused = engine.push(&[], &[&b], |_| Err::<(), _>("refused".into()));
            assert!(refused.unwrap().wait().is_err());
            let graph = engine
                .record(|rec| {
                    let i = rec.var(0u64);
                    let ik = i.key();
                    // Two reads of `i` on two lanes: their fences are what
                    // the write of `i` below waits for.
                    for lane in [Lane::Compute(0), Lane::Compute(1)] {
                        rec.op()
                            .name("read i")
                            .on(gpu)
                            .lane(lane)
                            .reads(&[&i])
                            .run(move |ctx| {
                                let _ = *ctx.read(ik)?;
                                Ok(ctx.stream()?.simulate(|| {
                                    std::hint::black_box((0..200).sum::<u64>());
                                    Ok(())
                                })?)
                            })?;
                    }
                    let seen = bodies.clone();
                    rec.op()
                        .name("skipped")
                        .on(gpu)
                        .lane(Lane::Compute(0))
                        .reads(&[&b])
                        .mutates(&[&i, &v])
                        .run(move |ctx| {
                            seen.fetch_add(1, SeqCst);
                            *ctx.write(ik)? = *ctx.read(bk)?;
                            Ok(())
                        })?;
                    let runs = host_runs.clone();
                    rec.op().name("host").mutates(&[&i]).run(move |ctx| {
                        runs.fetch_add(1, SeqCst);
                        *ctx.write(ik)? += 1;
                        Ok(())
                    })
                })
                .unwrap();
            let replays: Vec<_> = (0..REPLAYS).map(|_| graph.replay()).collect();
            for r in replays {
                let cause = poisoned(r.wait());
                assert_eq!(cause.op_name(), None, "the push's failure");
            }
            assert!(engine.wait_for_var(&v).wait().is_err());
            assert_eq!(b.version(), 1, "only the failed push wrote b");
            // A skipped op counts its mutations, once per replay.
            assert_eq!(v.version(), REPLAYS as u64, "v's version");
        }
        assert_eq!(bodies.load(SeqCst), 0, "the skipped op's body never ran");
        assert_eq!(
            host_runs.load(SeqCst),
            0,
            "the host op after the skipped one ran"
        );
    });
}
