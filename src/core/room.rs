//! Back-pressure on producers: a bound on the ops in flight, and the wait for
//! room under it.
//!
//! A producer that pushes faster than the engine drains (MXNet's run-ahead)
//! grows memory without bound: every pending op holds its closure and its
//! inputs. With [`EngineBuilder::max_in_flight`](crate::EngineBuilder::max_in_flight)
//! the engine counts its ops in flight, and
//! [`OpBuilder::when_room`](crate::OpBuilder::when_room) waits (as a future,
//! or blocking) until there are fewer than the bound.
//!
//! The count and a `WAITING` bit share one word, so a waiter and a finishing
//! op meet on a single location (as in [`generations`](super::generations)): either
//! the waiter's `fetch_or` sees the room the op made, or the op's `fetch_sub`
//! sees the bit and wakes the waiters. The bit is set and cleared only under
//! the waiter list's lock.

use std::task::{Context, Poll, Waker};

use crate::loom::sync::Mutex;
use crate::loom::sync::atomic::{AtomicUsize, Ordering::*};

/// Counter bit: a waiter is registered.
const WAITING: usize = 1;
/// Counter unit: one op in flight.
const ONE: usize = 2;

/// A bound on ops in flight, and the producers waiting for room under it.
pub struct Room {
    /// The bound; 0 for none (then nothing is counted).
    limit: usize,
    word: AtomicUsize,
    waiters: Mutex<Vec<Waker>>,
}

impl Room {
    /// A bound of `limit` ops in flight; 0 for none.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            word: AtomicUsize::new(0),
            waiters: Mutex::new(Vec::new()),
        }
    }

    /// Whether ops are counted at all.
    #[inline]
    pub fn is_bounded(&self) -> bool {
        self.limit != 0
    }

    /// Ops in flight (0 when unbounded: they are not counted).
    pub fn in_flight(&self) -> usize {
        self.word.load(Acquire) / ONE
    }

    /// Whether there is room with `own` of the ops in flight left out (the
    /// caller's own, which cannot make room while it waits); always true
    /// when unbounded.
    pub fn has_room_besides(&self, own: usize) -> bool {
        !self.is_bounded() || self.in_flight().saturating_sub(own) < self.limit
    }

    /// Counts an op in. Pushes never wait here: `poll_room` is the wait.
    #[inline]
    pub fn enter(&self) {
        if self.is_bounded() {
            self.word.fetch_add(ONE, Relaxed);
        }
    }

    /// Counts an op out, and wakes the waiters if that made room.
    #[inline]
    pub fn leave(&self) {
        if !self.is_bounded() {
            return;
        }
        let before = self.word.fetch_sub(ONE, AcqRel);
        if before & WAITING != 0 && before / ONE - 1 < self.limit {
            self.wake_all();
        }
    }

    #[cold]
    fn wake_all(&self) {
        let wakers = {
            let mut waiters = self.waiters.lock();
            self.word.fetch_and(!WAITING, AcqRel);
            std::mem::take(&mut *waiters)
        };
        // Woken outside the lock: a waker may run arbitrary code.
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Ready once fewer than `limit` ops are in flight; otherwise registers
    /// `cx`'s waker for the next op that makes room.
    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.is_bounded() || self.word.load(Acquire) / ONE < self.limit {
            return Poll::Ready(());
        }
        let mut waiters = self.waiters.lock();
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        // Set under the lock, so a waker that clears it takes our waker too.
        let word = self.word.fetch_or(WAITING, AcqRel);
        if word / ONE < self.limit {
            // Room was made before the bit was set: nobody will wake us.
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl std::fmt::Debug for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Room")
            .field("limit", &self.limit)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}
