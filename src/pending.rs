//! Which pushed ops have not finished yet, precisely enough to wait for
//! "everything pushed so far" while other threads keep pushing.
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
//! `enter` re-reads `current` after counting itself in; if a flip intervened
//! it moves to the new generation. So once `enter` returns, the op is counted
//! in a generation that no drain has yet declared empty, and any later flip
//! waits for it. Every counter access is `SeqCst`: the drain start (store
//! `draining`, load `count`) and the last op out (decrement `count`, load
//! `draining`) form a Dekker pair, so at least one of them sees the other and
//! the drain is never missed.
//!
//! Cost on the push path: one `fetch_add` and two loads; on completion one
//! `fetch_sub`, plus a load when a count reaches zero. No lock is taken
//! except by waiters and by the op that empties a generation being drained.

use std::sync::Arc;
use std::task::{Context, Poll};

use crate::sync::{AtomicUsize, AtomicWaker, Mutex, Ordering::*};

const IDLE: usize = 2;

/// Pads a value to its own cache line, so that the two generation counters
/// (hammered by pushers and completing workers) do not share one.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct CachePadded<T>(pub T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The generation an op was counted in.
pub type Generation = u8;

pub struct Pending {
    /// Generation of new ops: 0 or 1.
    current: AtomicUsize,
    count: [CachePadded<AtomicUsize>; 2],
    /// Generation being drained, or `IDLE`.
    draining: AtomicUsize,
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    /// Waiting for the generation being drained.
    now: Vec<Arc<Signal>>,
    /// Waiting for the next drain.
    next: Vec<Arc<Signal>>,
}

impl Default for Pending {
    fn default() -> Self {
        Self {
            current: AtomicUsize::new(0),
            count: Default::default(),
            draining: AtomicUsize::new(IDLE),
            queue: Mutex::new(Queue::default()),
        }
    }
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").field("in_flight", &self.in_flight()).finish()
    }
}

impl Pending {
    /// Counts a new op in; returns the generation to hand to `leave`.
    pub fn enter(&self) -> Generation {
        loop {
            let g = self.current.load(SeqCst);
            self.count[g].fetch_add(1, SeqCst);
            if self.current.load(SeqCst) == g {
                return g as Generation;
            }
            // A waiter closed `g` meanwhile; it may already have seen it empty.
            self.leave(g as Generation);
        }
    }

    /// Counts an op out of generation `g`.
    pub fn leave(&self, g: Generation) {
        let g = g as usize;
        if self.count[g].fetch_sub(1, SeqCst) == 1 && self.draining.load(SeqCst) == g {
            self.settle(&mut self.queue.lock().unwrap());
        }
    }

    /// Ops counted in and not yet out (a snapshot, for diagnostics).
    pub fn in_flight(&self) -> usize {
        self.count[0].load(SeqCst) + self.count[1].load(SeqCst)
    }

    /// Returns a signal that fires once every op counted in before this call
    /// has been counted out.
    pub fn wait(&self) -> Arc<Signal> {
        let signal = Arc::new(Signal::default());
        let mut queue = self.queue.lock().unwrap();
        queue.next.push(signal.clone());
        self.settle(&mut queue);
        signal
    }

    /// Finishes the drain in progress if its generation is empty, then starts
    /// the next one if anyone waits for it. Runs under the queue lock.
    fn settle(&self, queue: &mut Queue) {
        loop {
            let g = self.draining.load(SeqCst);
            if g != IDLE {
                if self.count[g].load(SeqCst) != 0 {
                    return; // the op that empties it will call us again
                }
                self.draining.store(IDLE, SeqCst);
                for signal in queue.now.drain(..) {
                    signal.fire();
                }
            }
            if queue.next.is_empty() {
                return;
            }
            std::mem::swap(&mut queue.now, &mut queue.next);
            // Close the current generation: new ops go to the other one.
            let closed = self.current.load(SeqCst);
            self.current.store(1 - closed, SeqCst);
            self.draining.store(closed, SeqCst);
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
    pub fn fire(&self) {
        self.done.store(1, Release);
        self.waker.wake();
    }

    pub fn is_fired(&self) -> bool {
        self.done.load(Acquire) != 0
    }

    pub fn poll_fired(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_fired() {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        if self.is_fired() { Poll::Ready(()) } else { Poll::Pending }
    }
}
