//! Executors: where and when ready jobs run, separate from dependency
//! tracking (seed 000). For the engine a job is a ready op; here it is only
//! something that implements [`Work`].
//!
//! - [`Pool`]: a work-stealing pool of CPU threads, with priorities;
//! - [`Inline`]: runs each job on the thread that made it ready (MXNet's
//!   `NaiveEngine`, for debugging);
//! - [`Custom`]: hands each job to a function of the user's (a tokio or smol
//!   runtime, a channel), on the inline executor's trampoline so that a
//!   function running its jobs at once does not nest them;
//! - `Tokio` (the `tokio` feature): spawns each job as a task on a tokio
//!   runtime.
//!
//! May import: `crate::loom`, and `crate::error` for a panic's message. Knows no op, variable, stream or engine;
//! the engine implements [`Work`] for its ops and picks the executor of each
//! device. Executors run on real threads and are checked by the stress and
//! differential tests, not by loom.

mod custom;
mod inline;
mod pool;
#[cfg(feature = "tokio")]
mod tokio_rt;

use std::fmt;

pub(crate) use custom::Custom;
pub(crate) use inline::{Inline, drop_here, run_here};
pub(crate) use pool::{Pool, StartHook};
#[cfg(feature = "tokio")]
pub(crate) use tokio_rt::{Tokio, in_runtime as in_tokio_runtime};

/// Whether the calling thread is inside a tokio runtime (never, without the
/// `tokio` feature).
#[cfg(not(feature = "tokio"))]
#[inline]
pub(crate) fn in_tokio_runtime() -> bool {
    false
}

/// Whether the calling thread runs jobs of an executor: a pool's worker, or
/// a thread whose trampoline is running (an inline or a custom executor's
/// job). Waiting there for other jobs to run could wait for this very
/// thread.
pub(crate) fn on_executor_thread() -> bool {
    pool::on_worker_thread() || inline::on_trampoline_thread()
}

/// What an executor runs.
pub(crate) trait Work: Send + Sized + 'static {
    /// Runs the job (one step of it). Returns `true` if it woke itself while
    /// running and has already been scheduled again.
    fn run(self) -> bool;

    /// Its priority among ready jobs: higher first, 0 by default.
    fn priority(&self) -> i32;

    /// Called on a pool worker before it parks (the engine frees there the
    /// ops that worker's jobs pushed).
    fn before_park() {}

    /// Whether the calling thread is inside a job's body, which goes on
    /// running after it made another job ready (an op pushed from inside an
    /// op): the pool then does not keep the new job in the worker's private
    /// slot, where it would wait for that body.
    #[inline]
    fn in_body() -> bool {
        false
    }
}

/// What the engine asks of an executor.
pub(crate) trait Queue<W: Work>: Send + Sync + fmt::Debug {
    /// Takes a ready job. `yielded`: the job woke itself while running (it
    /// should go behind other ready jobs). Must not block, must not panic
    /// (the custom one catches its user's), and should not run the job on
    /// the calling thread unless the executor is built for that (the inline
    /// one, and the custom one, through the trampoline: see `inline`).
    fn schedule(&self, job: W, yielded: bool);

    /// Stops the executor once the engine has drained; joins its threads
    /// unless called from one of them.
    fn shutdown(&self);
}
