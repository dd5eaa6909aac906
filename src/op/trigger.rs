//! An op's countdown of unmet dependencies and the runnable parked until the
//! countdown reaches zero.
//!
//! The count starts at one per edge plus one *guard* held by the pusher while
//! it links the op into its variables' chains (MXNet's `wait` counter does the
//! same). Grants may arrive on any thread, in any order, even before the push
//! has finished; the guard makes sure none of them can see zero before the
//! runnable is parked. Whoever brings the count to zero takes the runnable out
//! and schedules it: exactly one thread, exactly once.

use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::{AtomicU32, Ordering::AcqRel};

pub struct Trigger<R> {
    pending: AtomicU32,
    slot: UnsafeCell<Option<R>>,
}

// SAFETY: `slot` is written by the pusher before the guard is released and
// taken by the unique thread that brings `pending` to zero; the AcqRel
// decrements order the two accesses.
unsafe impl<R: Send> Send for Trigger<R> {}
// SAFETY: as above.
unsafe impl<R: Send> Sync for Trigger<R> {}

impl<R> Trigger<R> {
    /// A trigger waiting for `deps` grants plus the pusher's guard.
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
    pub fn release(&self) -> Option<R> {
        if self.pending.fetch_sub(1, AcqRel) != 1 {
            return None;
        }
        // SAFETY: we brought the count to zero, so we are the only thread that
        // will ever touch the slot again, and the pusher's write to it happened
        // before its guard release, which our AcqRel decrement observed.
        let value = self.slot.with_mut(|p| unsafe { (*p).take() });
        debug_assert!(value.is_some(), "trigger fired before its value was parked");
        value
    }
}

impl<R> Trigger<R> {
    /// Dependencies (and guard) not released yet; a snapshot, for reports.
    pub fn pending(&self) -> u32 {
        self.pending.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<R> std::fmt::Debug for Trigger<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trigger")
            .field(
                "pending",
                &self.pending.load(std::sync::atomic::Ordering::Relaxed),
            )
            .finish()
    }
}
