//! The custom executor: hands ready jobs to a function of the user's.

use std::sync::Arc;

use super::{Queue, Work};

pub(crate) struct Custom<W>(Arc<dyn Fn(W) + Send + Sync>);

impl<W> Custom<W> {
    pub(crate) fn new(schedule: Arc<dyn Fn(W) + Send + Sync>) -> Self {
        Self(schedule)
    }
}

impl<W> std::fmt::Debug for Custom<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Custom")
    }
}

impl<W: Work> Queue<W> for Custom<W> {
    fn schedule(&self, job: W, _yielded: bool) {
        (self.0)(job);
    }

    fn shutdown(&self) {}
}
