//! The pusher's side of an op's task: [`PushedOp`], what a handle holds to
//! await the op's result, ask whether it finished, or cancel it.

// `unsafe`: a pointer to the op's block in the task's header; each block says why it is sound.
#![allow(unsafe_code)]

use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

use async_task::FallibleTask;

use super::block::OpBlock;
use super::output::Output;
use super::spawn::OpTask;
use super::start::Cancel;
use crate::error::Error;

/// A pushed op's task, and its block.
pub(crate) struct PushedOp<T> {
    task: FallibleTask<Result<Output<T>, Error>, OpBlock>,
    /// The block, in the task's header: alive as long as `task` is.
    op: NonNull<OpBlock>,
}

// SAFETY: `op` points into the allocation `task` keeps alive, and is only
// read as `&OpBlock`, which is `Sync`; the task is `Send` for `T: Send`.
unsafe impl<T: Send> Send for PushedOp<T> {}

impl<T> PushedOp<T> {
    #[inline]
    pub(crate) fn new(task: OpTask<T>) -> Self {
        let op = NonNull::from(task.metadata());
        Self {
            task: task.fallible(),
            op,
        }
    }

    #[inline]
    pub(crate) fn op(&self) -> &OpBlock {
        // SAFETY: the block lives in the task's header, which `self.task`
        // keeps alive while `self` is borrowed.
        unsafe { self.op.as_ref() }
    }

    /// Whether the op has finished: its result is ready, or it has retired
    /// (its host no longer counts it; the result is on its way).
    pub(crate) fn is_finished(&self) -> bool {
        self.task.is_finished() || self.op().has_retired()
    }

    /// Asks the op not to run, if it has not started; says whether its body
    /// will not run (see `start`).
    pub(crate) fn cancel(&self) -> Cancel {
        self.op().cancel()
    }

    /// Whether the op's body started (see `start`).
    pub(crate) fn is_started(&self) -> bool {
        self.op().is_started()
    }

    /// The op's result, once it is there; `None` if its future was dropped
    /// before it finished.
    #[inline]
    pub(crate) fn poll_result(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T, Error>>> {
        Pin::new(&mut self.task)
            .poll(cx)
            .map(|r| r.map(|r| r.map(Output::into_inner)))
    }

    /// Lets the op run on without anyone awaiting it.
    #[inline]
    pub(crate) fn detach(self) {
        self.task.detach();
    }
}
