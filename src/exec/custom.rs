//! The custom executor: hands ready jobs to a function of the user's.

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
        (self.0)(job);
    }

    fn shutdown(&self) {}
}
