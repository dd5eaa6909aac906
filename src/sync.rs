//! The synchronisation primitives of the lock-free core, swapped for loom's
//! under `cfg(loom)` so that the loom models in `loom-tests/` explore every
//! interleaving of the very code the engine runs.
//!
//! Only the core state machines ([`chain`](crate::chain),
//! [`op`](crate::op), [`pending`](crate::pending)) use this shim.
//! Executors use `std` directly: they are exercised by the stress and
//! differential tests, not by loom.

#![deny(unsafe_code)]

#[cfg(loom)]
pub(crate) use loom::future::AtomicWaker;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU8, AtomicU32, AtomicUsize};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use futures::task::AtomicWaker;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU32, AtomicUsize};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

pub(crate) use std::sync::atomic::Ordering;

/// `UnsafeCell` with loom's closure-based API, so that loom can check every
/// access for causality. In normal builds it compiles to a plain cell.
#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

#[cfg(not(loom))]
#[derive(Debug, Default)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a pointer to the contents; the caller's `unsafe` block
    /// must justify reading through it.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a mutable pointer to the contents; the caller's `unsafe`
    /// block must justify writing through it.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Registers `waker` with `slot` (loom's `AtomicWaker` takes it differently).
pub(crate) fn register_waker(slot: &AtomicWaker, waker: &std::task::Waker) {
    #[cfg(loom)]
    slot.register_by_ref(waker);
    #[cfg(not(loom))]
    slot.register(waker);
}
