//! A countdown of unmet dependencies and the value parked until it reaches
//! zero (for ops: the runnable).
//!
//! The count starts at one per dependency plus one *guard* held by the
//! pusher while it registers the dependencies (MXNet's `wait` counter does
//! the same). Releases may arrive on any thread, in any order, even before
//! the push has finished; the guard makes sure none of them can see zero
//! before the value is parked. Whoever brings the count to zero takes the
//! value out: exactly one thread, exactly once.
//!
//! Access: `slot` is written by the pusher before it releases the guard, and
//! taken by the one thread whose release reaches zero; the `AcqRel`
//! decrements order the two.

// `unsafe`: the parked value, taken by the one thread that reaches zero; each block says why it is
// sound.
#![allow(unsafe_code)]

use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::{AtomicU32, Ordering::*};

/// A countdown of dependencies, and the value parked until it reaches zero.
pub struct Countdown<R> {
    pending: AtomicU32,
    slot: UnsafeCell<Option<R>>,
}

// SAFETY: `slot` is written by the pusher before the guard is released and
// taken by the unique thread that brings `pending` to zero; the AcqRel
// decrements order the two accesses.
unsafe impl<R: Send> Send for Countdown<R> {}
// SAFETY: as above.
unsafe impl<R: Send> Sync for Countdown<R> {}

impl<R> Countdown<R> {
    /// A countdown waiting for `deps` releases plus the pusher's guard.
    pub fn new(deps: u32) -> Self {
        Self {
            pending: AtomicU32::new(deps + 1),
            slot: UnsafeCell::new(None),
        }
    }

    /// Parks `value` until the count reaches zero.
    ///
    /// # Safety
    ///
    /// Called once, by the pusher, before it releases its guard.
    pub unsafe fn park(&self, value: R) {
        // SAFETY: the guard is still held, so no thread can take the slot yet.
        self.slot.with_mut(|p| unsafe { *p = Some(value) });
    }

    /// Releases one dependency (or the guard). Returns the parked value to
    /// the caller that released the last one.
    #[inline]
    #[must_use = "the last release gets the parked value, which must be used"]
    pub fn release(&self) -> Option<R> {
        if self.pending.fetch_sub(1, AcqRel) != 1 {
            return None;
        }
        // SAFETY: we brought the count to zero, so we are the only thread that
        // will ever touch the slot again, and the pusher's write to it happened
        // before its guard release, which our AcqRel decrement observed.
        let value = self.slot.with_mut(|p| unsafe { (*p).take() });
        debug_assert!(
            value.is_some(),
            "countdown fired before its value was parked"
        );
        value
    }

    /// Dependencies (and guard) not released yet; a snapshot, for reports.
    pub fn pending(&self) -> u32 {
        self.pending.load(Relaxed)
    }
}

impl<R> std::fmt::Debug for Countdown<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Countdown")
            .field("pending", &self.pending())
            .finish()
    }
}
