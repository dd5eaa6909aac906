//! The custom executor: hands ready ops to a function of the user's.

use std::sync::Arc;

use super::{Job, Queue};
use crate::op::Runner;

pub(crate) struct Custom(pub(crate) Arc<dyn Fn(Job) + Send + Sync>);

impl std::fmt::Debug for Custom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Custom")
    }
}

impl Queue for Custom {
    fn schedule(&self, runner: Runner, _yielded: bool) {
        (self.0)(Job(runner));
    }

    fn shutdown(&self) {}
}
