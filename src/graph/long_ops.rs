//! Which recorded ops are *long*, so that a replay does not hold ready ops
//! back behind them.
//!
//! A thread running a replay runs the first op it makes ready on its device
//! itself and keeps the others (`run.rs`: `Ready`), handing them to idle
//! workers between two of its ops. While it runs a long op, a worker that
//! goes idle would wait for that op's end to get them: a replay could then
//! take longer than the same ops pushed (a pushed op waits in the
//! executor's queues, where any idle worker takes it). So an op measured
//! as long is never run inline: like an op of another device, it is woken
//! onto its executor, where an idle worker takes it, and the thread goes on
//! with the others. That costs one wake (some 250 instructions) per long op
//! per replay, next to an op of at least [`LONG`]; the other ops pay
//! nothing, since the step's inline device says it (`run.rs`: `inline_on`).
//!
//! One replay in [`SAMPLE_EVERY`], from the second on, measures how long
//! its ops take, only those run while the thread keeps others (the only
//! ones the choice is about), in a copy of the run loop apart (`run.rs`:
//! `run_ops`): the other replays test nothing per op. When a measuring
//! replay ends, an op is long if its last measure was at least [`LONG`] and
//! at least [`RELATIVE`] times the mean of the other measured ops: long
//! next to its graph's other ops, so that a uniformly slower machine (or
//! valgrind) does not make every op long. The first replay is not measured:
//! it takes the graph's lazily allocated memory and finds the caches cold.
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `armed`, `sampling` | the replay's op as it arms (one replay at a time; the ops' threads get `sampling` with their ops, through the executor's queue, as the countdowns) | the threads running the replay's ops |
//! | `took` | the thread that ran the op in a measuring replay | the replay's op, once that replay is over ([`LongOps::settle`]) |
//! | `long` | the replay's op, as it settles | the same |
//!
//! Every access is `Relaxed`: the measures are hints (a stale one runs a
//! long op inline or wakes a short one, which is only slower).

// std's atomics, not `crate::loom`'s: these are hints, whose races change
// no outcome, so the loom models need not explore them.
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::time::Duration;

/// An op shorter than this is never long: waking it (a task's wake, some
/// 250 instructions) is cheap next to it.
pub(crate) const LONG: Duration = Duration::from_micros(10);

/// An op is long only if it took this many times the mean of its graph's
/// other measured ops.
pub(crate) const RELATIVE: u64 = 4;

/// One replay in this many measures its ops: the second, and every this
/// many after it.
pub(crate) const SAMPLE_EVERY: u32 = 64;

/// An op's measure before any.
const UNMEASURED: u32 = 0;

/// The measures of one graph's ops (see the module docs).
#[derive(Debug)]
pub(crate) struct LongOps {
    /// Replays armed so far.
    armed: AtomicU32,
    /// The replay in flight measures its ops.
    sampling: AtomicBool,
    /// Per op, how long it took when last measured, in ns ([`UNMEASURED`]
    /// if never).
    took: Box<[AtomicU32]>,
    /// Per op, whether it was long when last settled.
    long: Box<[AtomicBool]>,
}

impl LongOps {
    /// The measures of a graph of `ops` ops: none yet.
    pub(crate) fn new(ops: usize) -> Self {
        Self {
            armed: AtomicU32::new(0),
            sampling: AtomicBool::new(false),
            took: (0..ops).map(|_| AtomicU32::new(UNMEASURED)).collect(),
            long: (0..ops).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// A replay arms: decides whether it measures. Called by the replay's
    /// op only, before any of its ops runs.
    pub(crate) fn arm(&self) {
        let n = self.armed.load(Relaxed);
        self.armed.store(n.wrapping_add(1), Relaxed);
        self.sampling.store(n % SAMPLE_EVERY == 1, Relaxed);
    }

    /// Whether the replay in flight measures its ops.
    #[inline]
    pub(crate) fn is_sampling(&self) -> bool {
        self.sampling.load(Relaxed)
    }

    /// Op `op` of the replay in flight took `took`.
    pub(crate) fn record(&self, op: u32, took: Duration) {
        // Never UNMEASURED: a measure of 0 ns is 1.
        let ns = u32::try_from(took.as_nanos()).unwrap_or(u32::MAX).max(1);
        self.took[op as usize].store(ns, Relaxed);
    }

    /// The replay is over: if it measured its ops, tells `set_long` for
    /// each op that became long or stopped being long (see the module
    /// docs); ops it did not measure keep their last measure.
    /// Called by the replay's op once every op of it has ended.
    ///
    /// Only the changes: the caller touches each op it is told of, and the
    /// steps of a large graph do not fit in the caches, while these
    /// measures are read in order.
    pub(crate) fn settle(&self, mut set_long: impl FnMut(u32, bool)) {
        if !self.is_sampling() {
            return;
        }
        let took = |i: usize| u64::from(self.took[i].load(Relaxed));
        let (sum, n) = (0..self.took.len())
            .map(took)
            .filter(|&t| t != u64::from(UNMEASURED))
            .fold((0u64, 0u64), |(sum, n), t| (sum + t, n + 1));
        if n == 0 {
            // Nothing measured (a chain keeps nothing): nothing changes.
            return;
        }
        let floor = LONG.as_nanos() as u64;
        for i in 0..self.took.len() {
            let t = took(i);
            let long = t != u64::from(UNMEASURED) && t >= floor && {
                // The mean of the others (none: 0).
                let others = (sum - t).checked_div(n - 1).unwrap_or(0);
                t >= RELATIVE * others
            };
            if self.long[i].swap(long, Relaxed) != long {
                set_long(i as u32, long);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_replay_and_every_sample_every_th_after_measure() {
        let ops = LongOps::new(0);
        let measuring: Vec<u32> = (0..2 * SAMPLE_EVERY + 2)
            .filter(|_| {
                ops.arm();
                ops.is_sampling()
            })
            .collect();
        assert_eq!(measuring, vec![1, SAMPLE_EVERY + 1, 2 * SAMPLE_EVERY + 1]);
    }

    /// The ops of a measuring replay that took `us` µs each (0: not
    /// measured).
    fn measured(us: &[u64]) -> LongOps {
        let ops = LongOps::new(us.len());
        ops.arm();
        ops.arm();
        assert!(ops.is_sampling());
        for (i, &us) in us.iter().enumerate() {
            if us != 0 {
                ops.record(i as u32, Duration::from_micros(us));
            }
        }
        ops
    }

    /// Settles `ops`: which are long now, checking that only the changes
    /// were told.
    fn long(ops: &LongOps) -> Vec<bool> {
        let mut long: Vec<bool> = ops.long.iter().map(|l| l.load(Relaxed)).collect();
        ops.settle(|i, l| {
            assert_ne!(long[i as usize], l, "op {i} was told of no change");
            long[i as usize] = l;
        });
        assert!(
            long.iter()
                .zip(&ops.long)
                .all(|(&a, b)| a == b.load(Relaxed))
        );
        long
    }

    #[test]
    fn long_means_past_the_floor_and_far_above_the_others() {
        // One op of 10 ms among 1 ms ones.
        let l = long(&measured(&[10_000, 1000, 0, 1000]));
        assert_eq!(l, [true, false, false, false]);
        assert_eq!(long(&measured(&[10_000, 1000])), [true, false]);
        // Slower everywhere: nothing stands out.
        assert_eq!(long(&measured(&[50, 60, 40])), [false, false, false]);
        // Far above the others, but short.
        assert_eq!(long(&measured(&[9, 1, 1])), [false, false, false]);
        // Alone: past the floor is enough.
        assert_eq!(long(&measured(&[0, 11])), [false, true]);
        assert_eq!(long(&measured(&[])), [] as [bool; 0]);
    }

    #[test]
    fn only_a_measuring_replay_settles() {
        let ops = measured(&[0, 0]);
        ops.settle(|_, _| panic!("nothing was measured"));
        let ops = measured(&[10_000, 1000]);
        ops.arm();
        assert!(!ops.is_sampling());
        ops.settle(|_, _| panic!("not a measuring replay"));
    }

    #[test]
    fn a_new_measure_replaces_the_last() {
        let ops = measured(&[10_000, 1000]);
        assert_eq!(long(&ops), [true, false]);
        ops.settle(|i, _| panic!("op {i} did not change"));
        ops.record(0, Duration::from_micros(1000));
        assert_eq!(long(&ops), [false, false], "no longer long");
        ops.record(0, Duration::ZERO);
        assert_eq!(
            ops.took[0].load(Relaxed),
            1,
            "a measure is never UNMEASURED"
        );
        ops.record(0, Duration::from_secs(10));
        assert_eq!(ops.took[0].load(Relaxed), u32::MAX, "saturated");
    }
}
