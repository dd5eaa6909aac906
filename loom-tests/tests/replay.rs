//! Loom models of a replay's countdowns (`src/core/replay.rs`): the ops of
//! a recorded graph's replay, on model threads.
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
use loom::sync::atomic::{AtomicUsize, Ordering::AcqRel};
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
