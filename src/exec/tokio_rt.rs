//! The tokio executor (the `tokio` feature): each ready job runs inside a
//! task spawned on a runtime of the user's, so the futures it polls find
//! tokio's reactor and timers; and whether the calling thread is inside a
//! tokio runtime, where blocking waits are refused.

use super::{Queue, Work};

/// Spawns each ready job as a task on a tokio runtime.
///
/// A task, not `spawn_blocking`: an op body is a step of an async op (it
/// awaits, and is woken and spawned again) or a short synchronous body, which
/// tokio's worker may run like any other task. A body that blocks for long
/// holds a worker meanwhile: such bodies belong on a pool device.
pub(crate) struct Tokio {
    handle: tokio::runtime::Handle,
}

impl Tokio {
    pub(crate) fn new(handle: tokio::runtime::Handle) -> Self {
        Self { handle }
    }
}

impl std::fmt::Debug for Tokio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokio")
            .field("flavor", &self.handle.runtime_flavor())
            .finish()
    }
}

/// A job in a tokio task: dropped unrun (the runtime shut down), it is
/// dropped on the trampoline (see `inline::drop_here`), so that the ops its
/// failure releases, dropped in turn, do not nest.
struct Spawned<W: Work>(Option<W>);

impl<W: Work> Drop for Spawned<W> {
    fn drop(&mut self) {
        if let Some(job) = self.0.take() {
            super::drop_here(job);
        }
    }
}

impl<W: Work> Queue<W> for Tokio {
    fn schedule(&self, job: W, _yielded: bool) {
        // A runtime that has shut down drops the task, and with it the job:
        // the engine resolves a dropped op as failed, it does not hang.
        let mut job = Spawned(Some(job));
        drop(self.handle.spawn(async move {
            if let Some(job) = job.0.take() {
                job.run();
            }
            // As a pool worker does before it parks: free the ops that jobs
            // run here pushed and that have finished (tokio's threads have
            // no idle hook of ours).
            W::before_park();
        }));
    }

    /// The runtime is the user's: nothing of ours to stop.
    fn shutdown(&self) {}
}

/// Whether the calling thread is inside a tokio runtime: one of its worker
/// threads, inside its `block_on`, or under a `Handle::enter` guard.
pub(crate) fn in_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}
