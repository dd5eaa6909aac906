//! Which pushed ops have not finished yet, precisely enough to wait for
//! "everything pushed so far" while other threads keep pushing (the engine's
//! `wait_all` and shutdown).
//!
//! A single counter of ops in flight would make `wait_all` wait until the
//! engine is idle, which never happens while another thread keeps pushing.
//! Instead ops are counted in one of two *generations*. A waiter closes the
//! current generation by flipping `current` (new ops go to the other one) and
//! waits for the closed generation's count to drain to zero. Drains are
//! serialised: a waiter that arrives while one runs is queued for the next
//! flip, because ops pushed after that flip but before its call belong to the
//! open generation.
//!
//! Each generation's counter word holds its op count (in units of `ONE`) and
//! a `DRAINING` bit that the waiter sets when it closes the generation. Ops
//! and waiters meet on that single word: either the waiter's `fetch_or` sees
//! no ops left, or the op whose `fetch_sub` takes the word from
//! `ONE | DRAINING` to `DRAINING` finishes the drain. There is no
//! two-location (Dekker) reasoning, so no `SeqCst` fence on the hot path.
//!
//! `enter` re-reads `current` after counting itself in; if a flip intervened
//! it moves to the new generation. A generation's drain finishes only through
//! a release on its counter, and the flip precedes it, so an `enter` that
//! counts itself in after the drain finished also sees the flip and moves on.
//!
//! Cost: on push one `fetch_add` and two loads, on completion one `fetch_sub`.
//! No lock is taken except by waiters and by the op that empties a
//! generation being drained.

use std::sync::Arc;
use std::task::{Context, Poll};

use crossbeam_utils::CachePadded;

use crate::loom::future::AtomicWaker;
use crate::loom::sync::Mutex;
use crate::loom::sync::atomic::{AtomicUsize, Ordering::*};

/// Counter bit: a waiter closed this generation and waits for it to drain.
const DRAINING: usize = 1;
/// Counter unit: one op in flight.
const ONE: usize = 2;

/// The generation an op was counted in.
pub type Generation = u8;

/// Ops in flight, counted in two generations (see the module docs).
pub struct Generations {
    /// Generation of new ops: 0 or 1. Written only under `waiters`' lock.
    current: AtomicUsize,
    /// Each on its own cache line: pushers and completing workers hammer
    /// them.
    count: [CachePadded<AtomicUsize>; 2],
    waiters: Mutex<Waiters>,
}

#[derive(Default)]
struct Waiters {
    /// The generation being drained.
    draining: Option<usize>,
    /// Waiting for the generation being drained.
    now: Vec<Arc<Signal>>,
    /// Waiting for the next drain.
    next: Vec<Arc<Signal>>,
}

impl Default for Generations {
    fn default() -> Self {
        Self {
            current: AtomicUsize::new(0),
            count: Default::default(),
            waiters: Mutex::new(Waiters::default()),
        }
    }
}

impl std::fmt::Debug for Generations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generations")
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl Generations {
    /// Counts a new op in; returns the generation to hand to `leave`.
    #[inline]
    pub fn enter(&self) -> Generation {
        loop {
            let g = self.current.load(Acquire);
            self.count[g].fetch_add(ONE, AcqRel);
            if self.current.load(Acquire) == g {
                return g as Generation;
            }
            // A waiter closed `g` meanwhile: count in the open one instead.
            self.leave(g as Generation);
        }
    }

    /// Counts an op out of generation `g`.
    #[inline]
    pub fn leave(&self, g: Generation) {
        if self.count[g as usize].fetch_sub(ONE, AcqRel) == ONE | DRAINING {
            self.settle();
        }
    }

    /// Ops counted in and not yet out (a snapshot, for diagnostics).
    pub fn in_flight(&self) -> usize {
        (self.count[0].load(Acquire) + self.count[1].load(Acquire)) / ONE
    }

    /// Returns a signal that fires once every op counted in before this call
    /// has been counted out.
    pub fn wait(&self) -> Arc<Signal> {
        let signal = Arc::new(Signal::default());
        self.waiters.lock().next.push(signal.clone());
        self.settle();
        signal
    }

    /// Finishes the drain in progress if its generation is empty, then starts
    /// the next one if anyone waits for it. The signals fire after the lock
    /// is released: a waker is the waiting executor's code.
    fn settle(&self) {
        let mut fired = Vec::new();
        {
            let mut waiters = self.waiters.lock();
            loop {
                if let Some(g) = waiters.draining {
                    if self.count[g].load(Acquire) >= ONE {
                        break; // the op that empties it calls us again
                    }
                    self.count[g].fetch_and(!DRAINING, AcqRel);
                    waiters.draining = None;
                    fired.append(&mut waiters.now);
                }
                if waiters.next.is_empty() {
                    break;
                }
                let waiters = &mut *waiters;
                std::mem::swap(&mut waiters.now, &mut waiters.next);
                // Close the current generation: new ops go to the other one.
                let closed = self.current.load(Acquire);
                self.current.store(1 - closed, Release);
                self.count[closed].fetch_or(DRAINING, AcqRel);
                waiters.draining = Some(closed);
            }
        }
        for signal in fired {
            signal.fire();
        }
    }
}

/// A one-shot completion flag that a future can await.
#[derive(Debug, Default)]
pub struct Signal {
    done: AtomicUsize,
    waker: AtomicWaker,
}

impl Signal {
    /// Fires the signal (once) and wakes its waiter.
    pub fn fire(&self) {
        self.done.store(1, Release);
        self.waker.wake();
    }

    /// Whether the signal has fired.
    pub fn is_fired(&self) -> bool {
        self.done.load(Acquire) != 0
    }

    /// Ready once the signal has fired; otherwise registers `cx`'s waker.
    pub fn poll_fired(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_fired() {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        if self.is_fired() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}
