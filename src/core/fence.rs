//! Fences: the record of one op's work on a device stream (done or not, and
//! how it ended), and of which device work each variable still waits for.
//!
//! An op on a stream device gives its variables back as soon as its work is
//! *enqueued*, not when it is done: a consumer on the same device is then
//! enqueued behind the producer's event (a stream wait, no host round trip).
//! Whatever touches the variable from the host must first wait for that work.
//! So each op on a stream device gets a [`Fence`] (its event, and whether the
//! work is done and how it ended), and each variable keeps [`VarFences`]: the
//! fence of its last device write and those of the device reads since.
//!
//! A fence completes once, when the device's poller sees its event reached
//! (see `poller`). Host waiters register a waker; the completion and a
//! registration meet under one lock after a fast atomic check, so a waiter
//! cannot miss the completion (loom model: `loom-tests/tests/fence.rs`).
//!
//! Who touches a variable's fences: an op holding its write grant replaces
//! them (it runs alone); ops holding read grants read the write fence (which
//! no one changes meanwhile) and append their own fences to the reads, which
//! is why the reads sit behind a lock.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::loom::sync::Mutex;
use crate::loom::sync::atomic::{AtomicBool, AtomicU8, Ordering::*};

/// What a fence tells its event: that a first waiter registered on the
/// fence (the device's poller then watches for it more eagerly).
pub trait Watch {
    /// A first waiter registered on the pending fence of this event.
    fn first_waiter(&self) {}
}

impl Watch for () {}

const PENDING: u8 = 0;
const DONE: u8 = 1;
/// The work failed (its own failure, or one it ran behind: the failure
/// value `F` tells which).
const FAILED: u8 = 2;

/// One op's work on a stream: done or not, and how it ended. `E` is the
/// device's event (a unit in the loom models), `F` what a failure is.
pub struct Fence<E, F> {
    /// The engine's index of the device the work runs on.
    device: u16,
    /// The lane (stream) of that device.
    lane: u8,
    state: AtomicU8,
    /// A waiter registered while the fence was pending (set once).
    waited: AtomicBool,
    inner: Mutex<Outcome<F>>,
    event: E,
}

struct Outcome<F> {
    waiters: Vec<Waker>,
    failure: Option<F>,
    /// The first error a host function of the op reported (see
    /// `Stream::enqueue`); the poller turns it into the op's failure.
    fault: Option<String>,
}

impl<E: Watch, F: Clone> Fence<E, F> {
    /// A fence for work about to be enqueued on `lane` of `device`; its
    /// event is recorded after the work.
    pub fn new(device: u16, lane: u8, event: E) -> Self {
        Self {
            device,
            lane,
            state: AtomicU8::new(PENDING),
            waited: AtomicBool::new(false),
            inner: Mutex::new(Outcome {
                waiters: Vec::new(),
                failure: None,
                fault: None,
            }),
            event,
        }
    }

    /// The index of the device the work runs on.
    pub fn device_index(&self) -> u16 {
        self.device
    }

    /// The lane of that device.
    pub fn lane(&self) -> u8 {
        self.lane
    }

    /// The event recorded after the work.
    pub fn event(&self) -> &E {
        &self.event
    }

    /// Whether the work is done (successfully or not).
    #[inline]
    pub fn is_done(&self) -> bool {
        self.state.load(Acquire) != PENDING
    }

    /// The failure, once the fence completed with one.
    pub fn failure(&self) -> Option<F> {
        if self.state.load(Acquire) < FAILED {
            return None;
        }
        self.lock().failure.clone()
    }

    /// Ready with the outcome once the work is done; otherwise registers
    /// `cx`'s waker, which [`complete`](Self::complete) wakes.
    pub fn poll_done(&self, cx: &mut Context<'_>) -> Poll<Result<(), F>> {
        if let Some(outcome) = self.outcome() {
            return Poll::Ready(outcome);
        }
        let mut inner = self.lock();
        // Re-checked under the lock: `complete` sets the state under it, so
        // either we see it done or it sees our waker.
        match self.state.load(Acquire) {
            PENDING => {
                if !inner.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                    inner.waiters.push(cx.waker().clone());
                }
                // Set under the lock: whoever completes the fence sees it.
                let first = !self.waited.swap(true, Relaxed);
                drop(inner);
                if first {
                    self.event.first_waiter();
                }
                Poll::Pending
            }
            DONE => Poll::Ready(Ok(())),
            _ => Poll::Ready(Err(inner
                .failure
                .clone()
                .expect("failed fence without failure"))),
        }
    }

    fn outcome(&self) -> Option<Result<(), F>> {
        match self.state.load(Acquire) {
            PENDING => None,
            DONE => Some(Ok(())),
            _ => Some(Err(self.failure().expect("failed fence without failure"))),
        }
    }

    /// Whether a waiter registered while the fence was pending (read after
    /// completing it: a registration either came before, and is seen, or
    /// found the fence done).
    pub fn was_waited(&self) -> bool {
        self.waited.load(Relaxed)
    }

    /// Records the first error reported by one of the op's host functions.
    pub fn set_fault(&self, message: String) {
        self.lock().fault.get_or_insert(message);
    }

    /// Takes the fault a host function reported, if any.
    pub fn take_fault(&self) -> Option<String> {
        self.lock().fault.take()
    }

    /// Completes the fence (once) and wakes its waiters.
    pub fn complete(&self, outcome: Result<(), F>) {
        match outcome {
            Ok(()) => self.finish(DONE, None),
            Err(failure) => self.finish(FAILED, Some(failure)),
        }
    }

    fn finish(&self, state: u8, failure: Option<F>) {
        let waiters = {
            let mut inner = self.lock();
            debug_assert_eq!(self.state.load(Relaxed), PENDING, "fence completed twice");
            inner.failure = failure;
            self.state.store(state, Release);
            std::mem::take(&mut inner.waiters)
        };
        for w in waiters {
            w.wake();
        }
    }

    fn lock(&self) -> crate::loom::sync::MutexGuard<'_, Outcome<F>> {
        self.inner.lock()
    }
}

impl<E, F> std::fmt::Debug for Fence<E, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("device", &self.device)
            .field("lane", &self.lane)
            .field("state", &self.state.load(Relaxed))
            .finish()
    }
}

/// The device work a variable waits for: its last device write, and the
/// device reads pushed after it.
pub struct VarFences<E, F> {
    inner: Mutex<Slots<E, F>>,
}

struct Slots<E, F> {
    write: Option<Arc<Fence<E, F>>>,
    reads: Vec<Arc<Fence<E, F>>>,
}

impl<E, F> Default for VarFences<E, F> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Slots {
                write: None,
                reads: Vec::new(),
            }),
        }
    }
}

impl<E: Watch, F: Clone> VarFences<E, F> {
    fn lock(&self) -> crate::loom::sync::MutexGuard<'_, Slots<E, F>> {
        self.inner.lock()
    }

    /// Calls `f` with each fence an op must wait for before it touches the
    /// variable, and whether it is the last write's (whose failure poisons)
    /// or a read's (which only orders): the last write's for a read; for a
    /// write, the reads' too. Done fences are skipped, except failed writes.
    pub fn for_each_pending(&self, write: bool, mut visit: impl FnMut(&Arc<Fence<E, F>>, bool)) {
        let slots = self.lock();
        if let Some(w) = &slots.write
            && (!w.is_done() || w.state.load(Acquire) >= FAILED)
        {
            visit(w, true);
        }
        if write {
            for r in slots.reads.iter().filter(|r| !r.is_done()) {
                visit(r, false);
            }
        }
    }

    /// The failure of the last device write, if it failed.
    pub fn write_failure(&self) -> Option<F> {
        self.lock().write.as_ref().and_then(|w| w.failure())
    }

    /// An op holding the write grant enqueued work that writes the variable.
    pub fn set_write(&self, fence: Arc<Fence<E, F>>) {
        let mut slots = self.lock();
        slots.write = Some(fence);
        slots.reads.clear();
    }

    /// An op holding a read grant enqueued work that reads the variable.
    pub fn add_read(&self, fence: Arc<Fence<E, F>>) {
        let mut slots = self.lock();
        // Keep the list as long as the reads in flight, not all reads ever.
        slots.reads.retain(|r| !r.is_done());
        slots.reads.push(fence);
    }

    /// A host op holding the write grant waited for every fence: forgets
    /// them, returning the last write's failure (which the variable's state
    /// takes over).
    pub fn settle(&self) -> Option<F> {
        let mut slots = self.lock();
        slots.reads.clear();
        slots.write.take().and_then(|w| w.failure())
    }
}

impl<E, F> std::fmt::Debug for VarFences<E, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slots = self.inner.lock();
        f.debug_struct("VarFences")
            .field("write", &slots.write)
            .field("reads", &slots.reads.len())
            .finish()
    }
}
