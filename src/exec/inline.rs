//! The inline executor: runs each ready job on the thread that made it ready.
//!
//! Running a job can make others ready (an op's completion grants the next),
//! and those would run inside it, nesting without bound along a long chain.
//! So the first job on a thread runs a *trampoline*: jobs made ready while it
//! runs queue up on that thread and run one after the other once it returns.

use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;

use super::{Queue, Work};

#[derive(Debug)]
pub(crate) struct Inline;

crate::loom::thread::thread_local! {
    /// The jobs made ready on this thread while its trampoline runs (a
    /// `VecDeque` of the executor's job type); `None` when none runs here.
    static TRAMPOLINE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Ends the trampoline even if a job panics through `run` (op bodies'
/// panics are caught, so it should not happen).
struct Active;

impl Drop for Active {
    fn drop(&mut self) {
        let rest = TRAMPOLINE.with(|t| t.borrow_mut().take());
        drop(rest);
    }
}

/// Runs `f` on this thread's trampoline queue, if one of job type `W` runs.
fn with_queue<W: Work, R>(f: impl FnOnce(&mut VecDeque<W>) -> R) -> Option<R> {
    TRAMPOLINE.with(|t| {
        t.borrow_mut()
            .as_mut()
            .and_then(|q| q.downcast_mut::<VecDeque<W>>())
            .map(f)
    })
}

impl<W: Work> Queue<W> for Inline {
    fn schedule(&self, job: W, _yielded: bool) {
        let mut job = Some(job);
        if with_queue(|queue: &mut VecDeque<W>| queue.push_back(job.take().expect("once")))
            .is_some()
        {
            return;
        }
        let first = job.expect("not queued");
        TRAMPOLINE.with(|t| *t.borrow_mut() = Some(Box::new(VecDeque::<W>::new())));
        let _active = Active;
        first.run();
        while let Some(next) = with_queue(VecDeque::<W>::pop_front).flatten() {
            next.run();
        }
    }

    fn shutdown(&self) {}
}
