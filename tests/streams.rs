//! Stream devices, on the simulated GPU (the same launcher, fence and
//! poller code as CUDA): device-side hand-offs, host waiters, write after
//! read across lanes, errors, deletes and waits covering device work, and
//! what is refused at push. The real GPU tests are in `tests/cuda.rs`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::mpsc;
use std::time::Duration;

#[cfg(debug_assertions)]
use common::streams::run_in_child;
use common::streams::{
    failed, gated_store, host_fn, poisoned, poisoned_input, read_on_host, update,
};
use common::{Mem, gate, gpu_engine, within};
use depflow::stream::{SimMemory, SimView};
use depflow::{Engine, Error, Executor, Lane, Var};

#[test]
fn a_consumer_on_another_lane_is_enqueued_before_its_producer_finishes() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let v = engine.var(Mem::default());
        let (open, shut) = gate();
        // The producer's work blocks on the gate: it cannot finish.
        let producer = gated_store(&engine, gpu, Lane::Compute(0), &v, shut, 1);
        // The consumer's body runs (its work is enqueued) all the same.
        let (enqueued_tx, enqueued) = mpsc::channel();
        let (ran_tx, ran) = mpsc::channel();
        let consumer = engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(1))
            .mutates(&[&v])
            .run({
                let v = v.key();
                move |ctx| {
                    let m = ctx.write(v)?.clone();
                    // A kernel's stand-in: it runs on its lane's thread,
                    // not behind the producer's host function.
                    ctx.stream()?.simulate(move || {
                        // Stream order across lanes: the producer's store first.
                        let seen = m.load(SeqCst);
                        m.store(seen * 10 + 2, SeqCst);
                        let _ = ran_tx.send(());
                        Ok(())
                    })?;
                    enqueued_tx.send(()).unwrap();
                    Ok(())
                }
            })
            .unwrap();
        enqueued.recv_timeout(Duration::from_secs(30)).unwrap();
        // Time for a consumer that is not ordered behind the producer to run
        // (it must not: its lane waits for the producer's event). Only a
        // broken order depends on this delay; a correct one passes anyway.
        assert!(
            ran.recv_timeout(Duration::from_millis(200)).is_err(),
            "the consumer's work ran while the producer's was held"
        );
        open.send(()).unwrap();
        producer.wait().unwrap();
        consumer.wait().unwrap();
        assert_eq!(read_on_host(&engine, &v), 12);
    });
}

/// The test above fails when the engine's cross-lane wait is stubbed out
/// (`DEPFLOW_DEBUG_NO_LANE_WAITS=1`, read by debug builds only): it can
/// detect a missing wait. Runs it in a child process of this test binary.
#[cfg(debug_assertions)]
#[test]
fn the_cross_lane_test_fails_without_the_cross_lane_wait() {
    let (passed, text) = run_in_child(
        "a_consumer_on_another_lane_is_enqueued_before_its_producer_finishes",
        &[],
        &[("DEPFLOW_DEBUG_NO_LANE_WAITS", "1")],
    );
    assert!(!passed, "passed without the wait:\n{text}");
    assert!(
        text.contains("the consumer's work ran while the producer's was held")
            || text.contains("left: 2"),
        "failed for another reason:\n{text}"
    );
}

#[test]
fn a_host_reader_waits_for_device_work_without_holding_a_worker() {
    within(60, || {
        // One host worker: if the reader blocked it, `other` could not run.
        let (engine, gpu) = gpu_engine(1);
        let v = engine.var(Mem::default());
        let w = engine.var(0u32);
        let (open, shut) = gate();
        gated_store(&engine, gpu, Lane::default(), &v, shut, 5);
        let reader = engine
            .push(&[&v], &[], {
                let v = v.key();
                move |ctx| Ok(ctx.read(v)?.load(SeqCst))
            })
            .unwrap();
        let other = engine
            .push(&[], &[&w], {
                let w = w.key();
                move |ctx| {
                    *ctx.write(w)? += 1;
                    Ok(())
                }
            })
            .unwrap();
        other.wait().unwrap();
        open.send(()).unwrap();
        assert_eq!(reader.wait().unwrap(), 5);
    });
}

#[test]
fn a_write_after_device_reads_on_other_lanes_waits_for_them() {
    within(60, || {
        let (engine, gpu) = gpu_engine(2);
        let v = engine.var(Mem::default());
        let reads_done = Arc::new(AtomicU64::new(0));
        let (open, shut) = gate();
        for lane in [Lane::Compute(0), Lane::HostToDevice] {
            let (done, shut) = (reads_done.clone(), shut.clone());
            engine
                .op()
                .on(gpu)
                .lane(lane)
                .reads(&[&v])
                .run(host_fn(move || {
                    if lane == Lane::Compute(0) {
                        shut.pass();
                    }
                    done.fetch_add(1, SeqCst);
                }))
                .unwrap();
        }
        let (seen_tx, seen) = mpsc::channel();
        let writer = engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(1))
            .mutates(&[&v])
            .run({
                let done = reads_done.clone();
                host_fn(move || {
                    seen_tx.send(done.load(SeqCst)).unwrap();
                })
            })
            .unwrap();
        // And a host write after them too.
        let host_writer = engine
            .push(&[], &[&v], {
                let done = reads_done.clone();
                move |_| Ok(done.load(SeqCst))
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            seen.try_recv().is_err(),
            "the write ran before a read finished"
        );
        open.send(()).unwrap();
        writer.wait().unwrap();
        assert_eq!(seen.recv().unwrap(), 2);
        assert_eq!(host_writer.wait().unwrap(), 2);
    });
}

#[test]
fn device_failures_poison_in_program_order() {
    within(60, || {
        let (engine, gpu) = gpu_engine(2);
        let v = engine.var(Mem::default());
        let out = engine.var(Mem::default());
        let (open, shut) = gate();
        // Fails on the device, after the consumer below is enqueued.
        let failing = engine
            .op()
            .name("kernel")
            .on(gpu)
            .mutates(&[&v])
            .run(move |ctx| {
                Ok(ctx.stream()?.enqueue(move || {
                    shut.pass();
                    Err("illegal address".to_string())
                })?)
            })
            .unwrap();
        let consumer = engine
            .op()
            .name("consumer")
            .on(gpu)
            .lane(Lane::Compute(1))
            .reads(&[&v])
            .mutates(&[&out])
            .run(|ctx| Ok(ctx.stream()?.enqueue(|| Ok(()))?))
            .unwrap();
        open.send(()).unwrap();
        let f = failed(failing.wait());
        assert_eq!(f.op_name(), Some("kernel"));
        assert!(
            f.to_string().contains("device error: illegal address"),
            "{f}"
        );
        // Enqueued behind the failure: poisoned by it, and passes it on.
        assert_eq!(poisoned(consumer.wait()).op_name(), Some("kernel"));
        for var in [&v, &out] {
            let cause = poisoned(engine.wait_for_var(var).wait());
            assert_eq!(cause.op_name(), Some("kernel"));
        }
        // Reported once by wait_all: the consumer's is not a new failure.
        assert!(matches!(
            engine.wait_all().wait(),
            Err(Error::Failures { count: 1, .. })
        ));
        engine.clear_poison(&v).unwrap();
        engine.wait_for_var(&v).wait().unwrap();
    });
}

/// An op skipped for failed device work names the input it came through:
/// a device op enqueued behind the failing work (whose fence inherits the
/// failure), and ops that find the failure in a variable's fence.
#[test]
fn device_poison_names_the_input() {
    within(60, || {
        let (engine, gpu) = gpu_engine(2);
        let (ok, grad) = (
            engine.var(Mem::default()),
            engine.var_named("fc1.grad", Mem::default()),
        );
        let out = engine.var(Mem::default());
        let (open, shut) = gate();
        // Fails on the device once the consumer below has been enqueued
        // (its body opens the gate).
        let failing = engine
            .op()
            .name("backward fc1")
            .on(gpu)
            .mutates(&[&grad])
            .run(move |ctx| {
                Ok(ctx.stream()?.enqueue(move || {
                    shut.pass();
                    Err("NaN in gradient".to_string())
                })?)
            })
            .unwrap();
        let consumer = engine
            .op()
            .name("step")
            .on(gpu)
            .lane(Lane::Compute(1))
            .reads(&[&ok, &grad])
            .mutates(&[&out])
            .run(move |ctx| {
                open.send(()).unwrap();
                Ok(ctx.stream()?.enqueue(|| Ok(()))?)
            })
            .unwrap();
        assert!(failing.wait().is_err());
        let (input, cause) = poisoned_input(consumer.wait());
        assert_eq!(input, grad.id());
        assert_eq!(cause.op_name(), Some("backward fc1"));
        // Host ops find the failure in the variables' fences.
        for var in [&grad, &out] {
            let (input, cause) = poisoned_input(engine.wait_for_var(var).wait());
            assert_eq!(input, var.id());
            assert_eq!(cause.op_name(), Some("backward fc1"));
        }
        // A device op pushed now finds it in `grad`'s fence at once.
        let fresh = engine.var(Mem::default());
        let later = engine
            .op()
            .on(gpu)
            .reads(&[&ok, &grad])
            .mutates(&[&fresh])
            .run(|ctx| Ok(ctx.stream()?.enqueue(|| Ok(()))?))
            .unwrap();
        let (input, _) = poisoned_input(later.wait());
        assert_eq!(input, grad.id());
        let _ = engine.wait_all().wait();
    });
}

#[test]
fn body_errors_and_panics_fail_the_op() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let v = engine.var(Mem::default());
        let err = engine
            .op()
            .on(gpu)
            .mutates(&[&v])
            .run(|_| Err::<(), _>("bad shape".into()));
        assert!(matches!(err.unwrap().wait(), Err(Error::Failed(_))));
        engine.clear_poison(&v).unwrap();
        let panicking = engine
            .op()
            .on(gpu)
            .mutates(&[&v])
            .run(|ctx| Ok(ctx.stream()?.enqueue(|| panic!("in the host function"))?));
        let f = failed(panicking.unwrap().wait());
        assert!(f.to_string().contains("in the host function"), "{f}");
        let _ = engine.wait_all().wait();
    });
}

#[test]
fn delete_and_waits_cover_device_work() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let v = engine.var(Mem::default());
        let work_done = Arc::new(AtomicBool::new(false));
        let (open, shut) = gate();
        engine
            .op()
            .on(gpu)
            .mutates(&[&v])
            .run({
                let done = work_done.clone();
                host_fn(move || {
                    shut.pass();
                    done.store(true, SeqCst);
                })
            })
            .unwrap();
        let all = std::thread::spawn({
            let engine = engine.clone();
            move || engine.wait_all().wait()
        });
        let (freed_tx, freed) = mpsc::channel();
        let delete = engine
            .delete_var(&v, {
                let done = work_done.clone();
                move |_| freed_tx.send(done.load(SeqCst)).unwrap()
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !all.is_finished(),
            "wait_all returned before the device work"
        );
        assert!(
            freed.try_recv().is_err(),
            "the memory was freed under the device"
        );
        open.send(()).unwrap();
        delete.wait().unwrap();
        assert!(
            freed.recv().unwrap(),
            "freed before the device work finished"
        );
        all.join().unwrap().unwrap();
    });
}

/// An error the device reports with an event while the lane's work still
/// runs (CUDA's event query may return an earlier launch's error) fails the
/// op only once that work is over: until then nothing that depends on the
/// fence (here a delete, which frees the memory) proceeds.
#[test]
fn an_error_reported_with_an_event_fails_the_op_once_the_lanes_work_is_over() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let v = engine.var(Mem::default());
        let work_done = Arc::new(AtomicBool::new(false));
        let (open, shut) = gate();
        let op = engine
            .op()
            .name("kernel")
            .on(gpu)
            .mutates(&[&v])
            .run({
                let done = work_done.clone();
                move |ctx| {
                    let s = ctx.stream()?;
                    s.simulate_device_error("an earlier launch failed", false)?;
                    Ok(s.enqueue(move || {
                        shut.pass();
                        done.store(true, SeqCst);
                        Ok(())
                    })?)
                }
            })
            .unwrap();
        let (freed_tx, freed) = mpsc::channel();
        let delete = engine
            .delete_var(&v, {
                let done = work_done.clone();
                move |_| freed_tx.send(done.load(SeqCst)).unwrap()
            })
            .unwrap();
        // Only a fence completed before its work lets the delete run now.
        assert!(
            freed.recv_timeout(Duration::from_millis(200)).is_err(),
            "the memory was freed under the device"
        );
        open.send(()).unwrap();
        let f = failed(op.wait());
        assert!(f.to_string().contains("an earlier launch failed"), "{f}");
        delete.wait().unwrap();
        assert!(freed.recv().unwrap(), "freed before the device work");
    });
}

/// Ops finish on the device's poller, not on its launcher: a body that
/// blocks the launcher does not hold up the completion of work already
/// enqueued on another lane.
#[test]
fn a_blocking_body_does_not_delay_other_ops_completions() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let (a, b) = (engine.var(Mem::default()), engine.var(Mem::default()));
        let (open, shut) = gate();
        let mut first = gated_store(&engine, gpu, Lane::Compute(0), &a, shut, 1);
        // A body that blocks the launcher until released.
        let (release_tx, release) = mpsc::channel::<()>();
        let (entered_tx, entered) = mpsc::channel();
        let blocking = engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(1))
            .mutates(&[&b])
            .run(move |_| {
                entered_tx.send(()).unwrap();
                release.recv().unwrap();
                Ok(())
            })
            .unwrap();
        entered.recv_timeout(Duration::from_secs(30)).unwrap();
        // The first op's work ends while the launcher is blocked.
        open.send(()).unwrap();
        let done = first.wait_timeout(Duration::from_secs(10));
        release_tx.send(()).unwrap();
        assert!(
            done.is_ok(),
            "the completion waited for the launcher: {done:?}"
        );
        blocking.wait().unwrap();
        assert_eq!(read_on_host(&engine, &a), 1);
    });
}

/// Pushes the ops `ops` on `v`, on compute lanes 0 and 1 by turns (op `i`
/// on lane `i % 2`), op `i`'s device work `work(i, memory)`.
fn push_on_alternate_lanes(
    engine: &Engine,
    gpu: depflow::Device,
    v: &Var<Mem>,
    ops: std::ops::Range<u64>,
    work: fn(u64, &AtomicU64),
) {
    for i in ops {
        engine
            .op()
            .on(gpu)
            .lane(Lane::Compute((i % 2) as u8))
            .mutates(&[v])
            .run(update(v, move |m| work(i, m)))
            .unwrap();
    }
}

/// A device reuses the events of finished ops: over 10,000 ops, about as
/// many events as were ever in flight at once, not one per op.
#[test]
fn events_are_reused() {
    within(120, || {
        let (engine, gpu) = gpu_engine(1);
        let v = engine.var(Mem::default());
        for batch in 0..100u64 {
            push_on_alternate_lanes(&engine, gpu, &v, 0..100, |_, m| {
                m.fetch_add(1, SeqCst);
            });
            engine.wait_for_var(&v).wait().unwrap();
            assert_eq!(read_on_host(&engine, &v), (batch + 1) * 100);
        }
        let created = engine
            .op()
            .on(gpu)
            .reads(&[&v])
            .run(|ctx| Ok(ctx.stream()?.events_created()))
            .unwrap()
            .wait()
            .unwrap();
        assert!(created <= 200, "{created} events for 10,000 ops");
    });
}

/// After a sticky error (CUDA's illegal address, a trap) the device is
/// dead: the ops in flight fail with that error, and later ops fail at once
/// with it, their bodies not run.
#[test]
fn a_sticky_error_kills_the_device() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let (v, w) = (engine.var(Mem::default()), engine.var(Mem::default()));
        let (open, shut) = gate();
        // In flight on lane 1 when the device dies.
        let in_flight = gated_store(&engine, gpu, Lane::Compute(1), &w, shut, 1);
        let trap = engine
            .op()
            .name("trap")
            .on(gpu)
            .mutates(&[&v])
            .run(|ctx| {
                Ok(ctx
                    .stream()?
                    .simulate_device_error("illegal address", true)?)
            })
            .unwrap();
        for h in [trap, in_flight] {
            let f = failed(h.wait());
            assert!(f.to_string().contains("illegal address"), "{f}");
        }
        let ran = Arc::new(AtomicBool::new(false));
        let later = engine
            .op()
            .on(gpu)
            .mutates(&[&engine.var(Mem::default())])
            .run({
                let ran = ran.clone();
                move |_| {
                    ran.store(true, SeqCst);
                    Ok(())
                }
            })
            .unwrap();
        let f = failed(later.wait());
        assert!(f.to_string().contains("illegal address"), "{f}");
        assert!(!ran.load(SeqCst), "a body ran on a dead device");
        // (The held work may have been dropped unrun, with its gate.)
        let _ = open.send(());
    });
}

/// Dropping an engine whose device died while a stream was hung (here a
/// host function that never returns) does not wait for that stream.
#[test]
fn dropping_an_engine_with_a_dead_device_and_a_hung_stream_returns() {
    let (open, shut) = gate();
    within(60, move || {
        let (engine, gpu) = gpu_engine(1);
        let (v, w) = (engine.var(Mem::default()), engine.var(Mem::default()));
        let (started_tx, started) = mpsc::channel();
        let hung = engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(1))
            .mutates(&[&w])
            .run(host_fn(move || {
                started_tx.send(()).unwrap();
                shut.pass();
            }))
            .unwrap();
        // The stream is inside the function when the device dies.
        started.recv_timeout(Duration::from_secs(30)).unwrap();
        engine
            .op()
            .on(gpu)
            .mutates(&[&v])
            .run(|ctx| Ok(ctx.stream()?.simulate_device_error("trap", true)?))
            .unwrap();
        assert!(hung.wait().is_err());
        drop((v, w));
        drop(engine);
    });
    // Lets the hung stream's thread end.
    open.send(()).unwrap();
}

/// An engine whose build fails after a stream device was built stops that
/// device's threads (its poller used to wait forever, holding the streams).
#[cfg(target_os = "linux")]
#[test]
fn a_failed_build_stops_the_stream_devices_it_built() {
    let threads = || -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("leak9-"))
            .collect()
    };
    let built = Engine::builder()
        .device("leak9", Executor::simulated_gpu(1))
        .device("bad", Executor::pool(0))
        .build();
    assert!(matches!(built, Err(Error::Config(_))));
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !threads().is_empty() {
        assert!(
            std::time::Instant::now() < end,
            "still running: {:?}",
            threads()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The simulated device runs host functions one at a time, as CUDA may:
/// one on another stream does not run while the first one runs.
#[test]
fn host_functions_of_different_streams_run_one_at_a_time() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let (a, b) = (engine.new_var(), engine.new_var());
        let (other_tx, other_ran) = mpsc::channel::<()>();
        let (seen_tx, seen) = mpsc::channel();
        let (started_tx, started) = mpsc::channel::<()>();
        engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(0))
            .mutates(&[&a])
            .run(host_fn(move || {
                started_tx.send(()).unwrap();
                let concurrent = other_ran.recv_timeout(Duration::from_millis(300)).is_ok();
                seen_tx.send(concurrent).unwrap();
            }))
            .unwrap();
        started.recv_timeout(Duration::from_secs(30)).unwrap();
        let other = engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(1))
            .mutates(&[&b])
            .run(host_fn(move || {
                let _ = other_tx.send(());
            }))
            .unwrap();
        assert!(
            !seen.recv().unwrap(),
            "another stream's host function ran during this one"
        );
        other.wait().unwrap();
    });
}

/// A host function counts as inside its op: a blocking wait there is
/// refused (it could wait for work queued behind it), not a hang.
#[test]
fn a_blocking_wait_in_a_host_function_is_refused() {
    within(60, || {
        let (engine, gpu) = gpu_engine(2);
        let (a, b) = (engine.new_var(), engine.new_var());
        let (open, shut) = gate();
        let pending = engine
            .push(&[], &[&a], move |_| {
                shut.pass();
                Ok(())
            })
            .unwrap();
        let (got_tx, got) = mpsc::channel();
        engine
            .op()
            .on(gpu)
            .mutates(&[&b])
            .run(host_fn(move || {
                got_tx.send(pending.wait()).unwrap();
            }))
            .unwrap();
        let got = got.recv_timeout(Duration::from_secs(10));
        open.send(()).unwrap();
        assert!(matches!(got, Ok(Err(Error::BlockingInOp))), "{got:?}");
        engine.wait_all().wait().unwrap();
    });
}

/// A body that replaces device memory an earlier op's work still uses:
/// dropped there, the memory is freed under that work, which the simulated
/// device's memory reports; handed to `drop_after`, it goes once the work
/// is done.
fn replace_memory_under_a_reader(hand_on: bool) -> Result<u32, Error> {
    let (engine, gpu) = gpu_engine(1);
    let buf = engine.var(SimMemory::new(vec![7u32; 4]));
    let k = buf.key();
    let (open, shut) = gate();
    // The reader: its lane is held, then its kernel reads the memory.
    let reader = engine
        .op()
        .on(gpu)
        .lane(Lane::Compute(0))
        .reads(&[&buf])
        .run(move |ctx| {
            let view = ctx.read(k)?.view();
            let s = ctx.stream()?;
            s.enqueue(move || {
                shut.pass();
                Ok(())
            })?;
            let (sum_tx, sum) = mpsc::channel();
            s.simulate(move || {
                sum_tx.send(view.with(|x| x.iter().sum::<u32>())?).unwrap();
                Ok(())
            })?;
            Ok(sum)
        })
        .unwrap();
    let (ran_tx, ran) = mpsc::channel();
    let writer = engine
        .op()
        .on(gpu)
        .lane(Lane::Compute(1))
        .mutates(&[&buf])
        .run(move |ctx| {
            let old = std::mem::replace(&mut *ctx.write(k)?, SimMemory::new(vec![0u32; 8]));
            if hand_on {
                ctx.stream()?.drop_after(old);
            } else {
                drop(old);
            }
            ran_tx.send(()).unwrap();
            Ok(())
        })
        .unwrap();
    // The writer's body ran (it dropped or handed on the old memory) while
    // the reader's work waits.
    ran.recv_timeout(Duration::from_secs(30)).unwrap();
    open.send(()).unwrap();
    let sum = reader.wait()?;
    writer.wait()?;
    Ok(sum.recv().unwrap())
}

#[test]
fn memory_dropped_in_a_body_is_freed_under_earlier_work() {
    within(60, || {
        let f = failed(replace_memory_under_a_reader(false));
        assert!(f.to_string().contains("use after free"), "{f}");
    });
}

#[test]
fn memory_handed_to_drop_after_outlives_earlier_work() {
    within(60, || {
        assert_eq!(replace_memory_under_a_reader(true).unwrap(), 28);
    });
}

/// A variable of simulated device memory that a stream op on `gpu` wrote
/// (so its value is the device's), and a view of the memory.
fn device_memory(engine: &Engine, gpu: depflow::Device) -> (Var<SimMemory<u32>>, SimView<u32>) {
    let memory = SimMemory::new(vec![1u32; 4]);
    let view = memory.view();
    let buf = engine.var(memory);
    let k = buf.key();
    engine
        .op()
        .on(gpu)
        .mutates(&[&buf])
        .run(move |ctx| {
            let v = ctx.write(k)?.view();
            ctx.stream()?
                .simulate(move || v.with(|x| x[0] += 1))
                .map_err(Into::into)
        })
        .unwrap()
        .wait()
        .unwrap();
    (buf, view)
}

/// Where `view`'s memory was freed, once it was (within 10 s).
fn freed_in(view: &SimView<u32>) -> Option<String> {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(context) = view.freed_in_context() {
            return context;
        }
        assert!(
            std::time::Instant::now() < end,
            "the memory was never freed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_device_value_last_held_by_a_host_op_is_freed_on_the_device_s_poller() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let (buf, view) = device_memory(&engine, gpu);
        let k = buf.key();
        let (open, shut) = gate();
        // A host op reads it, held on a worker while the last handle goes:
        // it retires last, on the worker, which keeps no device context.
        let read = engine
            .push(&[&buf], &[], move |ctx| {
                shut.pass();
                Ok(ctx.read(k)?.with(|x| x[0]))
            })
            .unwrap();
        drop(buf);
        open.send(()).unwrap();
        assert_eq!(read.wait().unwrap(), 2);
        // Freed where a CUDA free succeeds: on the device's poller.
        assert_eq!(freed_in(&view).as_deref(), Some("gpu"));
    });
}

#[test]
fn a_device_value_whose_last_handle_goes_on_the_user_s_thread_is_freed_on_the_poller() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let (buf, view) = device_memory(&engine, gpu);
        drop(buf);
        assert_eq!(freed_in(&view).as_deref(), Some("gpu"));
        drop(engine);
    });
}

#[test]
fn a_host_value_and_a_device_value_outliving_its_engine_are_freed_where_they_go() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        // Only host ops touched it: not the device's, freed at once, here.
        let memory = SimMemory::new(vec![0u32; 4]);
        let host_view = memory.view();
        let host = engine.var(memory);
        engine.wait_for_var(&host).wait().unwrap();
        drop(host);
        assert_eq!(host_view.freed_in_context(), Some(None));
        // The device's, but its poller is gone with the engine: freed here
        // (nothing is left to free it on), not leaked.
        let (buf, view) = device_memory(&engine, gpu);
        drop(engine);
        drop(buf);
        assert_eq!(view.freed_in_context(), Some(None));
    });
}

#[test]
fn resource_units_stay_taken_until_the_device_work_is_done() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let memory = engine.new_resource("gpu memory", 1);
        let (a, b) = (engine.var(Mem::default()), engine.var(Mem::default()));
        let running = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for var in [&a, &b] {
            let running = running.clone();
            let h = engine
                .op()
                .on(gpu)
                .lane(Lane::Compute(handles.len() as u8))
                .mutates(&[var])
                .uses(&memory, 1)
                .run(host_fn(move || {
                    assert_eq!(running.fetch_add(1, SeqCst), 0, "two ops hold the unit");
                    std::thread::sleep(Duration::from_millis(5));
                    running.fetch_sub(1, SeqCst);
                }))
                .unwrap();
            handles.push(h);
        }
        for h in handles {
            h.wait().unwrap();
        }
        assert_eq!(memory.in_use(), 0);
    });
}

#[test]
fn misuse_is_refused_at_push() {
    let (engine, gpu) = gpu_engine(1);
    let v = engine.new_var();
    let on_host = engine
        .op()
        .lane(Lane::Compute(0))
        .mutates(&[&v])
        .run(|_| Ok(()));
    assert!(matches!(on_host, Err(Error::Stream(_))));
    let no_lane = engine
        .op()
        .on(gpu)
        .lane(Lane::Compute(2))
        .mutates(&[&v])
        .run(|_| Ok(()));
    assert!(matches!(no_lane, Err(Error::Stream(_))));
    let asynchronous = engine
        .op()
        .on(gpu)
        .mutates(&[&v])
        .run_async(|_| async { Ok(()) });
    assert!(matches!(asynchronous, Err(Error::Stream(_))));
    let no_stream = engine.push(&[], &[&v], |ctx| Ok(ctx.stream().map(|_| ())?));
    assert!(matches!(no_stream.unwrap().wait(), Err(Error::Failed(_))));
    let default_gpu = Engine::builder()
        .executor(Executor::simulated_gpu(1))
        .build();
    assert!(matches!(default_gpu, Err(Error::Config(_))));
    let no_compute = Engine::builder()
        .device("gpu", Executor::simulated_gpu(0))
        .build();
    assert!(matches!(no_compute, Err(Error::Config(_))));
}

#[test]
fn a_long_chain_alternating_lanes_keeps_program_order() {
    within(120, || {
        let (engine, gpu) = gpu_engine(1);
        let v = engine.var(Mem::default());
        push_on_alternate_lanes(&engine, gpu, &v, 0..2000, |i, m| {
            assert_eq!(m.fetch_add(1, SeqCst), i, "out of order")
        });
        engine.wait_for_var(&v).wait().unwrap();
        assert_eq!(v.version(), 2000);
        assert_eq!(read_on_host(&engine, &v), 2000);
        engine.wait_all().wait().unwrap();
    });
}

/// An error reported while a host function on the queried lane waits for
/// the poller (here for a value the poller drops once another op's work is
/// done) does not hang the poller: it waits for the lane up to a deadline,
/// not forever, then counts the device as dead, and both ops fail. (Seen
/// hanging with the simulated device's settle waiting without a deadline,
/// as CUDA's `cuStreamSynchronize` did.)
#[test]
fn an_error_settled_behind_a_host_function_waiting_for_the_poller_does_not_hang() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let (a, b) = (engine.new_var(), engine.new_var());
        let (released, waiting) = mpsc::channel::<()>();
        let (entered_tx, entered) = mpsc::channel();
        let waiting = std::sync::Mutex::new(Some(waiting));
        // Lane 0: a host function that returns once the poller dropped
        // `released` (the other op's `drop_after` value).
        let blocked = engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(0))
            .mutates(&[&a])
            .run(move |ctx| {
                let waiting = waiting.lock().unwrap().take().unwrap();
                let entered_tx = entered_tx.clone();
                Ok(ctx.stream()?.enqueue(move || {
                    entered_tx.send(()).unwrap();
                    let _ = waiting.recv();
                    Ok(())
                })?)
            })
            .unwrap();
        entered.recv().unwrap();
        // Lane 1: an error, and the value whose drop releases lane 0. The
        // poller learns of the error at its next query: lane 0's first.
        let released = std::sync::Mutex::new(Some(released));
        let failing = engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(1))
            .mutates(&[&b])
            .run(move |ctx| {
                let stream = ctx.stream()?;
                stream.simulate_device_error("launch failed", false)?;
                stream.drop_after(released.lock().unwrap().take());
                Ok(())
            })
            .unwrap();
        let blocked = blocked.wait().unwrap_err().to_string();
        let failing = failing.wait().unwrap_err().to_string();
        assert!(blocked.contains("launch failed"), "{blocked}");
        assert!(failing.contains("dead"), "{failing}");
    });
}

/// Issue 35, item 3 (what the `stream` docs now say): an op whose body
/// fails on a stream device (a failed launch, after enqueuing work that
/// is still running) fails; but it hands its variables on at once, as
/// every stream op does, so a consumer on the same device is enqueued
/// before the failure is known: its body runs, and it resolves to
/// `Error::Poisoned` with the launch's failure once the device work is
/// over. A consumer that starts after that is skipped, its body not run.
#[test]
fn a_consumer_behind_a_failed_launch_runs_its_body_and_is_poisoned() {
    within(60, || {
        let (engine, gpu) = gpu_engine(1);
        let (v, w) = (engine.var(Mem::default()), engine.var(Mem::default()));
        let (open, shut) = gate();
        let launch = engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(0))
            .mutates(&[&v])
            .run(move |ctx| {
                ctx.stream()?.enqueue(move || {
                    shut.pass();
                    Ok(())
                })?;
                Err::<(), _>("launch failed".into())
            })
            .unwrap();
        let (ran_tx, ran) = mpsc::channel();
        let consumer = engine
            .op()
            .on(gpu)
            .lane(Lane::Compute(0))
            .reads(&[&v])
            .mutates(&[&w])
            .run(move |_| {
                ran_tx.send(()).unwrap();
                Ok(())
            })
            .unwrap();
        // The launch's work cannot end before the gate opens: the
        // consumer's body runs meanwhile.
        ran.recv_timeout(Duration::from_secs(30))
            .expect("the consumer's body runs behind the failed launch");
        open.send(()).unwrap();
        let failure = failed(launch.wait());
        assert!(failure.to_string().contains("launch failed"), "{failure}");
        let cause = poisoned(consumer.wait());
        assert!(Arc::ptr_eq(&cause, &failure), "{cause}");
        // Once the failure is known, a consumer is skipped.
        let late_ran = Arc::new(AtomicBool::new(false));
        let late = engine
            .op()
            .on(gpu)
            .reads(&[&v])
            .run({
                let late_ran = late_ran.clone();
                move |_| {
                    late_ran.store(true, SeqCst);
                    Ok(())
                }
            })
            .unwrap();
        poisoned(late.wait());
        assert!(!late_ran.load(SeqCst));
    });
}
