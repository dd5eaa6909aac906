//! Helpers of the stream-device tests (`streams.rs`, `graph_streams.rs`,
//! `graph_capture.rs`, `cuda.rs`): device work on the simulated GPU's
//! memory cells ([`Mem`]), reading those back, unwrapping failures, a
//! replay-ordering check shared by recorded and captured graphs, and
//! re-running a test in a child process.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use depflow::{
    BoxError, Device, Engine, Error, Lane, OpCtx, OpFailure, OpHandle, Stream, Var, VarId,
};

use super::{Gate, Mem, gate, gpu_engine};

/// `v`'s value, read by a pushed host op (after the device work on it).
pub fn read_on_host(engine: &Engine, v: &Var<Mem>) -> u64 {
    let k = v.key();
    let got = engine.push(&[v], &[], move |ctx| Ok(ctx.read(k)?.load(SeqCst)));
    got.unwrap().wait().unwrap()
}

/// An op body for an op that mutates `v`: it enqueues `work` on `v`'s
/// memory as one-shot device work (`Stream::enqueue`). The body is `Fn`,
/// so a recorded op can take it as well as a pushed one.
pub fn update(
    v: &Var<Mem>,
    work: impl Fn(&AtomicU64) + Send + Sync + 'static,
) -> impl Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static {
    updating(v, false, work)
}

/// As [`update`], with repeatable device work
/// (`Stream::enqueue_repeatable`): each launch of a captured graph runs it.
pub fn update_repeatable(
    v: &Var<Mem>,
    work: impl Fn(&AtomicU64) + Send + Sync + 'static,
) -> impl Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static {
    updating(v, true, work)
}

fn updating(
    v: &Var<Mem>,
    repeatable: bool,
    work: impl Fn(&AtomicU64) + Send + Sync + 'static,
) -> impl Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static {
    let (k, work) = (v.key(), Arc::new(work));
    move |ctx| {
        let (m, work) = (ctx.write(k)?.clone(), work.clone());
        let work = move || {
            work(&m);
            Ok(())
        };
        Ok(enqueue(ctx.stream()?, repeatable, work)?)
    }
}

/// An op body for an op that reads `x` and mutates `y`: its device work
/// stores `f(x)` in `y`, one-shot or `repeatable` (as for [`update`] and
/// [`update_repeatable`]).
pub fn store_from(
    x: &Var<Mem>,
    y: &Var<Mem>,
    repeatable: bool,
    f: impl Fn(u64) -> u64 + Send + Sync + 'static,
) -> impl Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static {
    let (xk, yk, f) = (x.key(), y.key(), Arc::new(f));
    move |ctx| {
        let (x, y, f) = (ctx.read(xk)?.clone(), ctx.write(yk)?.clone(), f.clone());
        let work = move || {
            y.store(f(x.load(SeqCst)), SeqCst);
            Ok(())
        };
        Ok(enqueue(ctx.stream()?, repeatable, work)?)
    }
}

/// Enqueues `work` on `stream`: repeatable (as a captured graph needs) or
/// one-shot.
fn enqueue(
    stream: &Stream,
    repeatable: bool,
    work: impl Fn() -> Result<(), String> + Send + Sync + 'static,
) -> Result<(), Error> {
    if repeatable {
        stream.enqueue_repeatable(work)
    } else {
        stream.enqueue(work)
    }
}

/// An op body that enqueues `work` on the op's stream as a host function
/// (one-shot device work, `Stream::enqueue`).
pub fn host_fn(
    work: impl FnOnce() + Send + 'static,
) -> impl FnOnce(&OpCtx) -> Result<(), BoxError> + Send + 'static {
    move |ctx| {
        Ok(ctx.stream()?.enqueue(move || {
            work();
            Ok(())
        })?)
    }
}

/// Pushes an op on `lane` of `gpu` whose device work waits for `shut`,
/// then stores `value` in `v`.
pub fn gated_store(
    engine: &Engine,
    gpu: Device,
    lane: Lane,
    v: &Var<Mem>,
    shut: Gate,
    value: u64,
) -> OpHandle<()> {
    let store = move |m: &AtomicU64| {
        shut.pass();
        m.store(value, SeqCst);
    };
    let op = engine.op().on(gpu).lane(lane).mutates(&[v]);
    op.run(update(v, store)).unwrap()
}

/// The failure `got` reports; panics if it is not `Error::Failed`.
#[track_caller]
pub fn failed<T: Debug>(got: Result<T, Error>) -> Arc<OpFailure> {
    match got {
        Err(Error::Failed(f)) => f,
        other => panic!("not a failure: {other:?}"),
    }
}

/// The failure that poisoned `got`; panics if it is not `Error::Poisoned`.
#[track_caller]
pub fn poisoned<T: Debug>(got: Result<T, Error>) -> Arc<OpFailure> {
    match got {
        Err(Error::Poisoned { cause, .. }) => cause,
        other => panic!("not poisoned: {other:?}"),
    }
}

/// The input `got` names and the failure that poisoned it; panics if it
/// is not `Error::Poisoned`.
#[track_caller]
pub fn poisoned_input<T: Debug>(got: Result<T, Error>) -> (VarId, Arc<OpFailure>) {
    match got {
        Err(Error::Poisoned { input, cause }) => (input, cause),
        other => panic!("not poisoned: {other:?}"),
    }
}

/// A replay orders with pushed ops before and after it, on other lanes:
/// a graph of one op (`y = x * 10 + 5` on the device, on lane 1) replayed
/// between a pushed producer of `x` (on lane 0, held at a gate) and pushed
/// consumers of `y` (device work on the host-to-device lane, then a host
/// op), three rounds. `captured` makes it a captured graph (its work then
/// repeatable), captured once for all rounds.
pub fn check_replay_orders_with_pushed_ops(captured: bool) {
    let (engine, gpu) = gpu_engine(2);
    let (x, y) = (engine.var(Mem::default()), engine.var(Mem::default()));
    let yk = y.key();
    let graph = engine
        .record(|rec| {
            if captured {
                rec.capture();
            }
            rec.op()
                .on(gpu)
                .lane(Lane::Compute(1))
                .reads(&[&x])
                .mutates(&[&y])
                .run(store_from(&x, &y, captured, |x| x * 10 + 5))
        })
        .unwrap();
    for round in 1..=3u64 {
        let (open, shut) = gate();
        let producer = gated_store(&engine, gpu, Lane::Compute(0), &x, shut, round);
        let replay = graph.replay();
        let consumer = engine
            .op()
            .on(gpu)
            .lane(Lane::HostToDevice)
            .mutates(&[&y])
            .run(update(&y, |y| y.store(y.load(SeqCst) * 10 + 7, SeqCst)))
            .unwrap();
        let on_host = engine
            .push(&[&y], &[], move |ctx| Ok(ctx.read(yk)?.load(SeqCst)))
            .unwrap();
        open.send(()).unwrap();
        producer.wait().unwrap();
        replay.wait().unwrap();
        consumer.wait().unwrap();
        assert_eq!(on_host.wait().unwrap(), (round * 10 + 5) * 10 + 7);
    }
    assert_eq!(graph.is_captured(), captured);
    assert_eq!(graph.captures(), u64::from(captured));
}

/// Runs this test binary's test `test` alone in a child process, with
/// `args` added and the environment variables `env` set; returns whether it
/// passed and what it printed (checked to have run that one test).
pub fn run_in_child(test: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--test-threads=1"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("running 1 test"), "{text}");
    (out.status.success(), text)
}
