//! The custom executor: hands ready jobs to a function of the user's.
//!
//! That function is the user's code, called wherever a job becomes ready
//! (inside another op's completion, say): so it runs on the calling thread's
//! trampoline (see `inline`), where the jobs it runs at once or drops queue
//! up instead of nesting, and a panic in it is caught. A panic must not
//! unwind into the engine: the grants still to be handed on after this one
//! would be lost. The job it dropped (if it did) fails its op as dropped by
//! its executor, which is how the panic is reported.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::inline::on_trampoline;
use super::{Queue, Work};

/// Calls `F` with every ready job.
pub(crate) struct Custom<F>(F);

impl<F> Custom<F> {
    pub(crate) fn new(schedule: F) -> Self {
        Self(schedule)
    }
}

impl<F> std::fmt::Debug for Custom<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Custom")
    }
}

impl<W: Work, F: Fn(W) + Send + Sync> Queue<W> for Custom<F> {
    fn schedule(&self, job: W, _yielded: bool) {
        on_trampoline::<W>(|| {
            // The panic hook has reported it; a job dropped by the unwinding
            // fails its op (see the module docs).
            let _ = catch_unwind(AssertUnwindSafe(|| (self.0)(job)));
        });
    }

    fn shutdown(&self) {}
}
