//! Which stream device's context a thread keeps current, and the device a
//! variable's value belongs to: so that a value dropped elsewhere is
//! dropped on its device's poller instead.
//!
//! A `CudaSlice` is freed where it is dropped, with the dropping thread's
//! current context (cudarc does not make it current for the drop): with
//! none, the free fails and cudarc parks the error on the context, for
//! the next call of whoever uses it (the next body on the device). The
//! device's poller keeps its context current, and the engine drops values
//! there ([`Wake::defer`]).
//!
//! - [`enter`]: a device's poller marks its thread as keeping that
//!   device's context current, for its whole life. The simulated device
//!   has the same notion (what [`SimMemory`](super::SimMemory) records
//!   when it is freed), so the simulator shows a value freed elsewhere.
//! - [`DeviceOf`]: the device of a variable's value, set by stream ops as
//!   they publish their fences (a write's device replaces the one before, a
//!   read's is taken only if there is none), never by host ops. The
//!   variable's drop takes it: a value with a device, dropped on a thread
//!   that does not keep that device's context current, goes to the
//!   device's poller.
//!
//! Invariant: a [`DeviceOf`] holds its device's [`Wake`] while it names it
//! (its address, compared on the stream op path, is that of a live
//! `Wake`), and a value sent with [`Wake::defer`] is dropped exactly once:
//! on the poller, or handed back to the sender if the poller has exited.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};

use super::poller::Wake;
use crate::loom::sync::Mutex;

crate::loom::thread::thread_local! {
    /// The device whose context this thread keeps current (its poller's).
    static CURRENT: RefCell<Option<Arc<Wake>>> = const { RefCell::new(None) };
}

/// The calling thread keeps `device`'s context current until dropped
/// (see [`enter`]).
pub(crate) struct Entered(Option<Arc<Wake>>);

/// Marks the calling thread (a device's poller) as keeping `device`'s
/// context current until the returned guard is dropped.
pub(crate) fn enter(device: &Arc<Wake>) -> Entered {
    Entered(CURRENT.with(|c| c.replace(Some(device.clone()))))
}

impl Drop for Entered {
    fn drop(&mut self) {
        let before = self.0.take();
        let _ = CURRENT.try_with(|c| c.replace(before));
    }
}

/// Whether the calling thread keeps `device`'s context current.
pub(crate) fn is_current(device: &Wake) -> bool {
    CURRENT
        .try_with(|c| {
            c.borrow()
                .as_deref()
                .is_some_and(|w| std::ptr::eq(w, device))
        })
        .unwrap_or(false)
}

/// The name of the device whose context the calling thread keeps current.
pub(crate) fn current_name() -> Option<Arc<str>> {
    CURRENT
        .try_with(|c| c.borrow().as_ref().map(|w| w.name().clone()))
        .ok()
        .flatten()
}

/// The device a variable's value belongs to (module docs): none until a
/// stream op touches it.
#[derive(Default)]
pub(crate) struct DeviceOf {
    /// The address of `device`'s `Wake`, or null: compared only, on the
    /// stream op path, without the lock.
    named: AtomicPtr<Wake>,
    device: Mutex<Option<Arc<Wake>>>,
}

impl DeviceOf {
    /// A stream op of `device` touched the variable (`write`: mutated it).
    /// Called under the op's grant on the variable, so writers never race.
    #[inline]
    pub(crate) fn touched_by(&self, device: &Arc<Wake>, write: bool) {
        let named = self.named.load(Relaxed);
        if std::ptr::eq(named, Arc::as_ptr(device)) || (!write && !named.is_null()) {
            return;
        }
        self.set(device, write);
    }

    #[cold]
    fn set(&self, device: &Arc<Wake>, write: bool) {
        let mut slot = self.device.lock();
        if !write && slot.is_some() {
            return; // another reader's device came first
        }
        let old = slot.replace(device.clone());
        self.named.store(Arc::as_ptr(device).cast_mut(), Relaxed);
        drop(slot);
        drop(old);
    }

    /// Takes the device (the variable is being dropped).
    pub(crate) fn take(&self) -> Option<Arc<Wake>> {
        if self.named.load(Relaxed).is_null() {
            return None;
        }
        self.named.store(std::ptr::null_mut(), Relaxed);
        self.device.lock().take()
    }
}

impl std::fmt::Debug for DeviceOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceOf")
            .field("set", &!self.named.load(Relaxed).is_null())
            .finish()
    }
}
