//! Device memory for the simulated GPU that can show a use after free:
//! [`SimMemory`] owns an allocation, work on the streams uses it through
//! [`SimView`]s, and a view used after its memory was dropped (or while it
//! is dropped) fails instead of reading freed memory, as a real GPU would
//! silently. What a CUDA device's `CudaSlice` is, without the silence.
//!
//! A free also records where it ran: on a thread keeping a stream device's
//! context current (its poller, see `context`), or on another thread, where
//! a `CudaSlice`'s free would fail for want of a current context
//! ([`SimView::freed_in_context`]).

use std::sync::Arc;

use crate::loom::sync::Mutex;
use crate::loom::sync::atomic::{AtomicBool, Ordering::SeqCst};

struct Allocation<T> {
    data: Mutex<Vec<T>>,
    freed: AtomicBool,
    /// Set by the free: the device whose context the freeing thread kept
    /// current, if any.
    context: Mutex<Option<Option<Arc<str>>>>,
}

/// An allocation of the simulated device's memory: dropping it frees it,
/// whatever [`SimView`]s of it the streams' work still holds.
///
/// ```
/// use depflow::stream::SimMemory;
///
/// let memory = SimMemory::new(vec![1u32, 2, 3]);
/// let view = memory.view(); // what a kernel captures
/// assert_eq!(view.with(|x| x.iter().sum::<u32>()), Ok(6));
/// drop(memory);
/// assert!(view.with(|x| x[0]).unwrap_err().contains("use after free"));
/// ```
pub struct SimMemory<T> {
    view: SimView<T>,
}

/// A use of a [`SimMemory`] that does not own it: what work enqueued on a
/// stream captures (as a kernel gets a device pointer).
pub struct SimView<T> {
    allocation: Arc<Allocation<T>>,
}

impl<T> SimMemory<T> {
    /// An allocation holding `data`.
    pub fn new(data: Vec<T>) -> Self {
        Self {
            view: SimView {
                allocation: Arc::new(Allocation {
                    data: Mutex::new(data),
                    freed: AtomicBool::new(false),
                    context: Mutex::new(None),
                }),
            },
        }
    }

    /// A view of the allocation, for work on a stream.
    pub fn view(&self) -> SimView<T> {
        self.view.clone()
    }

    /// Runs `f` on the contents (from a host op, say).
    pub fn with<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> R {
        f(&mut self.view.allocation.data.lock())
    }
}

impl<T> Drop for SimMemory<T> {
    fn drop(&mut self) {
        *self.view.allocation.context.lock() = Some(super::context::current_name());
        self.view.allocation.freed.store(true, SeqCst);
    }
}

impl<T> SimView<T> {
    /// Runs `f` on the contents, or reports a use after free: the memory
    /// was dropped before, or while `f` ran.
    ///
    /// # Errors
    ///
    /// A message saying "use after free".
    pub fn with<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R, String> {
        let freed = || self.allocation.freed.load(SeqCst);
        if freed() {
            return Err("use after free: the memory was dropped before this use".into());
        }
        let r = f(&mut self.allocation.data.lock());
        if freed() {
            return Err("use after free: the memory was dropped during this use".into());
        }
        Ok(r)
    }

    /// Where the memory was freed: `None` while it is not; then
    /// `Some(Some(name))` if the freeing thread kept stream device `name`'s
    /// context current (its poller: where a CUDA device's free succeeds),
    /// or `Some(None)` if it kept none (a host op's worker, the user's
    /// thread: where a `CudaSlice`'s free fails, the error parked for the
    /// device's next body).
    ///
    /// ```
    /// use depflow::stream::SimMemory;
    ///
    /// let memory = SimMemory::new(vec![0u8; 4]);
    /// let view = memory.view();
    /// assert_eq!(view.freed_in_context(), None);
    /// drop(memory); // on this thread, which keeps no device's context
    /// assert_eq!(view.freed_in_context(), Some(None));
    /// ```
    pub fn freed_in_context(&self) -> Option<Option<String>> {
        let context = self.allocation.context.lock();
        context.as_ref().map(|c| c.as_deref().map(str::to_string))
    }
}

impl<T> Clone for SimView<T> {
    fn clone(&self) -> Self {
        Self {
            allocation: self.allocation.clone(),
        }
    }
}

impl<T> std::fmt::Debug for SimMemory<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMemory").finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for SimView<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimView")
            .field("freed", &self.allocation.freed.load(SeqCst))
            .finish_non_exhaustive()
    }
}
