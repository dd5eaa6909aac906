//! A replay's countdowns: when each recorded op of one replay of a graph
//! may run, and when the whole replay is over.
//!
//! A recorded graph's ops are analysed once: each knows how many ops it
//! waits for (its predecessors in the graph). A replay *arms* the
//! countdowns with those numbers; an op that ends *satisfies* each of its
//! successors, and the one whose count reaches zero is ready (exactly one
//! thread sees that). Every op that ends also counts itself out of the
//! replay; the one that counts the last out ends the replay and wakes
//! whoever awaits it ([`poll_done`](Countdowns::poll_done)).
//!
//! # Protocol
//!
//! - Replays of one graph never overlap: `arm` is called only after the
//!   previous replay's `poll_done` returned `Ready` (the graph's caller
//!   orders them), and before any op of the new replay runs.
//! - An op calls [`satisfy`](Countdowns::satisfy) for its successors once,
//!   then is counted out once, by [`op_done`](Countdowns::op_done) or in a batch
//!   by [`ops_done`](Countdowns::ops_done). After a count that returns
//!   [`Left::Last`] the caller must not touch the countdowns (nor anything
//!   the replay's awaiter may free once it sees the replay over): the last
//!   thing it touches is the waiter's lock, released in `op_done`.
//! - In debug builds, a satisfy of an op whose count is already zero, and
//!   a count-out of more ops than are left, panic: an op ended twice.
//! - `poll_done` is Ready only once the last op's `op_done` has released
//!   that lock, so an awaiter that frees the graph on Ready frees nothing an
//!   op still uses.
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `pending` | `arm` (plain stores, before the replay's ops are released); `satisfy` (`fetch_sub`) | `satisfy` |
//! | `left` | `arm`; `ops_done` (`fetch_sub`, one op or a thread's run of them) | `ops_done` |
//! | `waiter` | `arm`, the last `op_done`, `poll_done` (under its lock) | the same |

use std::task::{Context, Poll, Waker};

use crate::loom::sync::Mutex;
use crate::loom::sync::atomic::AtomicU32;
use crate::loom::sync::atomic::Ordering::{AcqRel, Relaxed, Release};

/// What [`Countdowns::satisfy`] found.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Satisfied {
    /// The op was the last one the successor waited for: it is ready, and
    /// the caller is the one thread that runs it (or hands it on).
    Ready,
    /// The successor still waits for other ops.
    Waiting,
}

/// What [`Countdowns::op_done`] found.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// Other ops of the replay have not ended.
    More,
    /// This was the replay's last op: the replay is over, its awaiter
    /// woken. The caller must not touch the countdowns again.
    Last,
}

/// The countdowns of one graph's replays (one replay at a time).
#[derive(Debug)]
pub struct Countdowns {
    /// Per op: the predecessors that have not ended in this replay.
    pending: Box<[AtomicU32]>,
    /// The ops of this replay that have not ended.
    left: AtomicU32,
    waiter: Mutex<Waiter>,
}

#[derive(Debug, Default)]
struct Waiter {
    waker: Option<Waker>,
    /// The last op counted itself out (and released this lock).
    over: bool,
}

impl Countdowns {
    /// Countdowns for a graph of `ops` ops, armed for no replay.
    pub fn new(ops: usize) -> Self {
        assert!(
            u32::try_from(ops).is_ok(),
            "a graph has at most 2^32 - 1 ops"
        );
        Self {
            pending: (0..ops).map(|_| AtomicU32::new(0)).collect(),
            left: AtomicU32::new(0),
            waiter: Mutex::new(Waiter {
                waker: None,
                over: true,
            }),
        }
    }

    /// Arms the countdowns for a replay: op `i` waits for `preds[i]` ops.
    /// Returns whether the replay has ops at all (if not, it is already
    /// over).
    ///
    /// Called before any op of the replay runs, and only once the previous
    /// replay is over (`poll_done` returned Ready): so nothing else touches
    /// the countdowns meanwhile. The stores are published to the ops' threads
    /// by whatever hands them their ops (an executor's queue).
    pub fn arm(&self, preds: &[u32]) -> bool {
        debug_assert_eq!(preds.len(), self.pending.len());
        for (p, &n) in self.pending.iter().zip(preds) {
            p.store(n, Relaxed);
        }
        let n = self.pending.len() as u32;
        self.left.store(n, Release);
        let mut waiter = self.waiter.lock();
        debug_assert!(
            waiter.over,
            "a replay armed before the previous one was over"
        );
        waiter.over = n == 0;
        waiter.waker = None;
        n != 0
    }

    /// One predecessor of op `op` ended.
    #[inline]
    pub fn satisfy(&self, op: u32) -> Satisfied {
        // AcqRel: the thread that sees the count reach zero runs the op, and
        // must see what every predecessor wrote.
        let before = self.pending[op as usize].fetch_sub(1, AcqRel);
        // One more satisfy than the op has predecessors: a predecessor
        // ended twice (its successor then ran early, or in the next replay).
        debug_assert_ne!(before, 0, "op {op} satisfied more often than it waits");
        if before == 1 {
            Satisfied::Ready
        } else {
            Satisfied::Waiting
        }
    }

    /// An op of the replay ended (after satisfying its successors).
    #[inline]
    pub fn op_done(&self) -> Left {
        self.ops_done(1)
    }

    /// `n` ops of the replay ended (each after satisfying its successors),
    /// counted out at once: a thread that runs many ops in a row counts
    /// them out when it stops, instead of making every op's end a write to
    /// the one counter all threads share. (The replay cannot end meanwhile:
    /// the ops not yet counted out keep `left` above zero.)
    #[inline]
    pub fn ops_done(&self, n: u32) -> Left {
        debug_assert!(n != 0);
        // AcqRel: the last op's thread sees every op's effects, and publishes
        // them with the lock below to the awaiter.
        let before = self.left.fetch_sub(n, AcqRel);
        // More ops counted out than the replay has: an op ended twice (the
        // replay resolved before its ops had all run).
        debug_assert!(before >= n, "{n} ops counted out, {before} left");
        if before != n {
            return Left::More;
        }
        let waker = {
            let mut waiter = self.waiter.lock();
            waiter.over = true;
            waiter.waker.take()
        };
        // The lock is released: from here on the countdowns may be freed.
        if let Some(waker) = waker {
            waker.wake();
        }
        Left::Last
    }

    /// Ready once the armed replay is over (at once if none is armed).
    pub fn poll_done(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut waiter = self.waiter.lock();
        if waiter.over {
            return Poll::Ready(());
        }
        match &mut waiter.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}
