//! What keeps an allocation alive while others may still touch it (for ops:
//! the task): its *anchor*, and the count of the references that still need
//! it.
//!
//! `refs` starts at one per chain edge plus one for the op's run. The thread
//! that pushed the op holds the anchor and polls [`Anchor::is_finished`]; once
//! the count is zero nothing can touch the op any more and it takes the anchor
//! back ([`Anchor::take`]) to free the op. A pusher that cannot wait (it exits,
//! say) *orphans* the anchor instead: whoever brings the count to zero then
//! gets it from [`Anchor::unref`], or the orphaning thread itself if the count
//! already is zero. Both sides meet on the one `refs` word, so exactly one of
//! them ends up with the anchor.

// `unsafe`: the anchor slot, taken by the one thread the count designates; each block says why it
// is sound.
#![allow(unsafe_code)]

use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::{AtomicU32, Ordering::*};

/// `refs` bit: the pusher gave the anchor up.
const ORPHAN: u32 = 1 << 31;

/// An anchor and the count of references that still need it.
pub struct Anchor<A> {
    refs: AtomicU32,
    slot: UnsafeCell<Option<A>>,
}

// SAFETY: `slot` is written before the anchor is shared and taken by the one
// thread the `refs` protocol designates, after an AcqRel RMW or Acquire load
// that orders all earlier uses before it.
unsafe impl<A: Send> Send for Anchor<A> {}
// SAFETY: as above.
unsafe impl<A: Send> Sync for Anchor<A> {}

impl<A> Anchor<A> {
    /// An anchor waiting for `refs` references to be counted out.
    pub fn new(refs: u32) -> Self {
        Self {
            refs: AtomicU32::new(refs),
            slot: UnsafeCell::new(None),
        }
    }

    /// Stores the anchor.
    ///
    /// # Safety
    ///
    /// Called once, before the anchor is shared with other threads.
    pub unsafe fn set(&self, anchor: A) {
        // SAFETY: not shared yet.
        self.slot.with_mut(|s| unsafe { *s = Some(anchor) });
    }

    /// Whether every reference has been counted out.
    #[inline]
    pub fn is_finished(&self) -> bool {
        self.refs.load(Acquire) == 0
    }

    /// Counts one reference out. Returns the anchor if it was orphaned and
    /// this was the last reference.
    #[inline]
    #[must_use = "the anchor of an orphan is the caller's to drop"]
    pub fn unref(&self) -> Option<A> {
        if self.refs.fetch_sub(1, AcqRel) == ORPHAN | 1 {
            // SAFETY: orphaned and finished: we are the one designated taker.
            return unsafe { self.take() };
        }
        None
    }

    /// Gives the anchor up: returns it at once if every reference is already
    /// out, else the last [`unref`](Self::unref) will.
    ///
    /// # Safety
    ///
    /// Called once, by the anchor's holder, instead of [`take`](Self::take).
    #[must_use = "the anchor of a finished orphan is the caller's to drop"]
    pub unsafe fn orphan(&self) -> Option<A> {
        if self.refs.fetch_or(ORPHAN, AcqRel) == 0 {
            // SAFETY: finished before the orphaning: we are the taker.
            return unsafe { self.take() };
        }
        None
    }

    /// Takes the anchor back.
    ///
    /// # Safety
    ///
    /// The caller is the designated taker: the holder after `is_finished`
    /// returned true, or as described for `unref` and `orphan`.
    pub unsafe fn take(&self) -> Option<A> {
        // SAFETY: forwarded; nobody else touches the slot any more.
        self.slot.with_mut(|s| unsafe { (*s).take() })
    }
}

impl<A> std::fmt::Debug for Anchor<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Anchor")
            .field("refs", &(self.refs.load(Relaxed) & !ORPHAN))
            .finish()
    }
}
