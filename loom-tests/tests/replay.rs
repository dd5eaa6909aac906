//! Loom models of a replay's countdowns (`src/core/replay.rs`): the ops of
//! a recorded graph's replay, on model threads (a stream op's two halves
//! included, as `src/graph/run_slow.rs` drives them).
//!
//! Each op writes its own loom cell and reads its predecessors': loom
//! checks that what an op ran after is ordered before it. A `frame` cell
//! stands for the replay's own memory (its counters, the graph the
//! awaiter may free once the replay is over): every op reads it before it
//! counts itself out, and the awaiter writes it (re-arming, or freeing)
//! once the replay is over, so loom flags an op touching it too late.
#![cfg(loom)]

use std::future::poll_fn;

use depflow::__loom::{Countdowns, Left, Satisfied};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{
    AtomicUsize,
    Ordering::{AcqRel, Relaxed},
};
use loom::thread;

/// Per-op cells and the frame, shared by the model's threads.
struct Replay {
    countdowns: Countdowns,
    cells: Vec<UnsafeCell<u64>>,
    frame: UnsafeCell<u64>,
    runs: Vec<AtomicUsize>,
}

// SAFETY: the cells are reached as the countdowns order them; loom flags
// any access they do not.
unsafe impl Sync for Replay {}
// SAFETY: as above.
unsafe impl Send for Replay {}

impl Replay {
    fn new(ops: usize) -> Arc<Self> {
        Arc::new(Self {
            countdowns: Countdowns::new(ops),
            cells: (0..ops).map(|_| UnsafeCell::new(0)).collect(),
            frame: UnsafeCell::new(0),
            runs: (0..ops).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    /// Runs op `op`: reads its predecessors' cells, writes its own.
    fn run(&self, op: usize, preds: &[usize], round: u64) {
        self.runs[op].fetch_add(1, AcqRel);
        let sum: u64 = preds
            .iter()
            // SAFETY: see `Sync`.
            .map(|&p| self.cells[p].with(|c| unsafe { *c }))
            .sum();
        // SAFETY: see `Sync`.
        self.cells[op].with_mut(|c| unsafe { *c = round * 100 + sum + 1 });
        // SAFETY: see `Sync`: the frame is read by every op before it
        // counts itself out.
        self.frame.with(|f| unsafe { assert_eq!(*f, round) });
    }

    /// Awaits the replay's end, then takes the frame over (as a re-arm or
    /// a free would) for round `next`.
    fn await_end(&self, next: u64) {
        loom::future::block_on(poll_fn(|cx| self.countdowns.poll_done(cx)));
        // Every op's effects are visible to the awaiter.
        for cell in &self.cells {
            // SAFETY: see `Sync`: the replay is over.
            cell.with(|c| unsafe { assert!(*c > (next - 1) * 100) });
        }
        // SAFETY: see `Sync`: the replay is over.
        self.frame.with_mut(|f| unsafe { *f = next });
    }
}

/// Two independent ops on two threads, two replays: the second replay is
/// armed while the first one's last op may still be counting itself out;
/// nothing an op touches is taken over before that op is done with it.
#[test]
fn re_armed_while_the_last_op_completes() {
    loom::model(|| {
        let replay = Replay::new(2);
        for round in 0..2u64 {
            assert!(replay.countdowns.arm(&[0, 0]));
            let ops: Vec<_> = (0..2)
                .map(|op| {
                    let replay = replay.clone();
                    thread::spawn(move || {
                        replay.run(op, &[], round);
                        replay.countdowns.op_done()
                    })
                })
                .collect();
            replay.await_end(round + 1);
            let lasts = ops
                .into_iter()
                .map(|t| t.join().unwrap())
                .filter(|&l| l == Left::Last)
                .count();
            assert_eq!(lasts, 1, "exactly one op ends the replay");
        }
        for op in 0..2 {
            assert_eq!(replay.runs[op].load(AcqRel), 2, "each op once per replay");
        }
    });
}

/// A diamond's join: ops 0 and 1 end on two threads and both satisfy op
/// 2; the one that makes it ready runs it at once on its own thread (the
/// hand-off), after seeing both predecessors' writes; it runs once.
#[test]
fn a_single_ready_successor_is_handed_off_once() {
    loom::model(|| {
        let replay = Replay::new(3);
        assert!(replay.countdowns.arm(&[0, 0, 2]));
        let ops: Vec<_> = (0..2)
            .map(|op| {
                let replay = replay.clone();
                thread::spawn(move || {
                    replay.run(op, &[], 0);
                    if replay.countdowns.satisfy(2) == Satisfied::Ready {
                        // Counted out first: the hand-off is not the last op.
                        assert_eq!(replay.countdowns.op_done(), Left::More);
                        replay.run(2, &[0, 1], 0);
                    }
                    let _ = replay.countdowns.op_done();
                })
            })
            .collect();
        replay.await_end(1);
        for t in ops {
            t.join().unwrap();
        }
        assert_eq!(replay.runs[2].load(AcqRel), 1);
        // SAFETY: every thread is joined.
        replay.cells[2].with(|c| unsafe { assert_eq!(*c, 3) });
    });
}

/// A thread keeps several ready successors to run itself (`run_from`'s
/// kept ops): op 0 makes ops 2 and 3 ready on thread A, which runs both;
/// op 3 and op 1 (on thread B) join into op 4, run by whichever satisfies
/// it last. Each thread counts the ops it ran out at once when it stops
/// (`ops_done`), as `run_from` does. Each op runs once, after its
/// predecessors' writes, and one thread's count ends the replay.
#[test]
fn kept_successors_run_on_the_thread_that_made_them_ready() {
    loom::model(|| {
        let replay = Replay::new(5);
        assert!(replay.countdowns.arm(&[0, 0, 1, 1, 2]));
        // Op 4 once both 1 and 3 ended: returns how many ops it ran.
        let join = |replay: &Replay| {
            if replay.countdowns.satisfy(4) == Satisfied::Ready {
                replay.run(4, &[1, 3], 0);
                1
            } else {
                0
            }
        };
        let a = {
            let replay = replay.clone();
            thread::spawn(move || {
                replay.run(0, &[], 0);
                let mut kept = Vec::new();
                for s in [2, 3] {
                    if replay.countdowns.satisfy(s) == Satisfied::Ready {
                        kept.push(s);
                    }
                }
                assert_eq!(kept, [2, 3], "op 0 was their only predecessor");
                let mut done = 1;
                for s in kept {
                    replay.run(s as usize, &[0], 0);
                    done += 1;
                    if s == 3 {
                        done += join(&replay);
                    }
                }
                replay.countdowns.ops_done(done)
            })
        };
        let b = {
            let replay = replay.clone();
            thread::spawn(move || {
                replay.run(1, &[], 0);
                let done = 1 + join(&replay);
                replay.countdowns.ops_done(done)
            })
        };
        replay.await_end(1);
        let lasts = [a.join().unwrap(), b.join().unwrap()];
        assert_eq!(lasts.iter().filter(|&&l| l == Left::Last).count(), 1);
        for op in 0..5 {
            assert_eq!(replay.runs[op].load(AcqRel), 1, "op {op} once");
        }
    });
}

/// A stream op in a replay (`src/graph/run_slow.rs`): op 0 enqueues its
/// work on the launcher and makes its successor on the same device (op 1)
/// ready at once; the poller completes its fence later, on a thread of its
/// own, and only then does op 0 count itself out (its other successors,
/// none here, go then too). Op 1's end and the completion race for the
/// replay's last count: loom checks that nothing is touched after the
/// replay's end (the fence completing while the countdowns are read), and
/// that the replay ends after op 0's device work (it fails if op 0 counts
/// itself out at its enqueue).
#[test]
fn a_stream_op_completes_while_its_device_successor_runs() {
    loom::model(|| {
        let replay = Replay::new(2);
        assert!(replay.countdowns.arm(&[0, 1]));
        // Op 0's device work: done before its fence completes.
        let device_work = Arc::new(AtomicUsize::new(0));
        let launcher = {
            let (replay, device_work) = (replay.clone(), device_work.clone());
            thread::spawn(move || {
                // Enqueue: the body, then the same-device successor.
                replay.run(0, &[], 0);
                assert_eq!(replay.countdowns.satisfy(1), Satisfied::Ready);
                let device_successor = {
                    let replay = replay.clone();
                    thread::spawn(move || {
                        replay.run(1, &[0], 0);
                        let _ = replay.countdowns.op_done();
                    })
                };
                // The fence, handed to the poller: its completion.
                device_work.store(1, Relaxed);
                let _ = replay.countdowns.op_done();
                device_successor.join().unwrap();
            })
        };
        replay.await_end(1);
        assert_eq!(device_work.load(Relaxed), 1, "over before the device work");
        launcher.join().unwrap();
    });
}

/// A replay of a real recorded graph (two roots and a join, through
/// intermediates, on the no-op host) holds its boundary variable `a` while
/// another thread pushes a read and a write of `a` behind or before it:
/// they run in one of the push orders, the replay as one op (never
/// interleaved with the pushed ones), and loom checks every access to `a`
/// and to the intermediates.
/// A variable's value: a cell loom watches.
struct Value(UnsafeCell<u64>);

// SAFETY: reached only through ops' contexts, under the grants the model
// checks; loom flags any access they do not order.
unsafe impl Sync for Value {}

impl Value {
    fn get(&self) -> u64 {
        // SAFETY: see `Sync`.
        self.0.with(|v| unsafe { *v })
    }

    fn set(&self, value: u64) {
        // SAFETY: see `Sync`.
        self.0.with_mut(|v| unsafe { *v = value })
    }
}

#[test]
fn a_boundary_variable_granted_to_a_replay_while_an_op_appends_behind_it() {
    use depflow::__loom::{Harness, exit_thread, record};
    use loom::sync::atomic::AtomicBool;

    // Three threads and a graph: bounded tighter than the CI-wide 4 (at 3
    // it takes about four minutes on 2 cores).
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(|| {
        let h = Harness::new();
        let a = h.var(Value(UnsafeCell::new(1)));
        let ka = a.key();
        let graph = record(&h, |rec| {
            let (t1, t2) = (rec.var(0u64), rec.var(0u64));
            let (k1, k2) = (t1.key(), t2.key());
            rec.push("left", &[&a], &[&t1], move |ctx| {
                *ctx.write(k1)? = ctx.read(ka)?.get();
                Ok(())
            })?;
            rec.push("right", &[&a], &[&t2], move |ctx| {
                *ctx.write(k2)? = ctx.read(ka)?.get();
                Ok(())
            })?;
            rec.push("join", &[&t1, &t2], &[&a], move |ctx| {
                let sum = *ctx.read(k1)? + *ctx.read(k2)?;
                ctx.write(ka)?.set(sum);
                Ok(())
            })
        })
        .unwrap();
        // The main thread and one more run what the ops dispatch, until
        // the pusher has seen everything done and stops them.
        let stop = Arc::new(AtomicBool::new(false));
        let work = |h: &Harness, stop: &AtomicBool| {
            while !stop.load(AcqRel) {
                h.run_next();
            }
        };
        let worker = {
            let (h, stop) = (h.clone(), stop.clone());
            thread::spawn(move || work(&h, &stop))
        };
        let replay = graph.replay().unwrap();
        let pusher = {
            let (h, a, stop) = (h.clone(), a.clone(), stop.clone());
            thread::spawn(move || {
                let read = h
                    .push("read", &[&a], &[], move |ctx| Ok(ctx.read(ka)?.get()))
                    .unwrap();
                let op = h
                    .push("times ten", &[], &[&a], move |ctx| {
                        let a = ctx.write(ka)?;
                        a.set(a.get() * 10);
                        Ok(())
                    })
                    .unwrap();
                assert!(replay.wait().unwrap().is_none());
                op.wait().unwrap();
                // Before the replay, or after it: never in between.
                let seen = read.wait().unwrap();
                assert!(seen == 1 || seen == 2, "{seen}");
                stop.store(true, AcqRel);
                // Wake both runners.
                let last = h.var(());
                for _ in 0..2 {
                    h.push("stop", &[], &[&last], |_| Ok(())).unwrap().detach();
                }
                exit_thread();
            })
        };
        work(&h, &stop);
        pusher.join().unwrap();
        worker.join().unwrap();
        while h.run_one() {}
        let value = h
            .push("get", &[&a], &[], move |ctx| Ok(ctx.read(ka)?.get()))
            .unwrap();
        h.run_one();
        let value = value.wait().unwrap();
        // Replay first: (1 + 1) * 10; the pushed op first: 10 + 10. An
        // interleaving would give 11 (`right` reading the pushed op's
        // write) or 2 (`join` writing over it).
        assert_eq!(value, 20, "the replay ran as one op");
        exit_thread();
    });
}
