//! The inline executor: runs each ready op on the thread that made it ready.
//!
//! Running an op can make others ready (its completion grants them), and those
//! would run inside it, nesting without bound along a long chain. So the first
//! op on a thread runs a *trampoline*: ops made ready while it runs queue up on
//! that thread and run one after the other once it returns.

use std::cell::RefCell;
use std::collections::VecDeque;

use super::Queue;
use crate::op::Runner;

#[derive(Debug)]
pub(crate) struct Inline;

crate::loom::thread::thread_local! {
    /// Ops made ready on this thread while the trampoline runs; `None` when
    /// no trampoline is running here.
    static TRAMPOLINE: RefCell<Option<VecDeque<Runner>>> = const { RefCell::new(None) };
}

/// Ends the trampoline even if an op panics through `run` (it should not:
/// op bodies' panics are caught).
struct Active;

impl Drop for Active {
    fn drop(&mut self) {
        let rest = TRAMPOLINE.with(|t| t.borrow_mut().take());
        drop(rest);
    }
}

impl Queue for Inline {
    fn schedule(&self, runner: Runner, _yielded: bool) {
        let runner = TRAMPOLINE.with(|t| match t.borrow_mut().as_mut() {
            Some(queue) => {
                queue.push_back(runner);
                None
            }
            None => Some(runner),
        });
        let Some(first) = runner else { return };
        TRAMPOLINE.with(|t| *t.borrow_mut() = Some(VecDeque::new()));
        let _active = Active;
        first.run();
        while let Some(next) =
            TRAMPOLINE.with(|t| t.borrow_mut().as_mut().and_then(VecDeque::pop_front))
        {
            next.run();
        }
    }

    fn shutdown(&self) {}
}
