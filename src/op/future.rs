//! The future an op's task runs: check the inputs, run the body (a closure
//! or an async block) with panics caught, then finish the op (see
//! [`OpBlock::finish`]); and the thread-local marker of the op a thread is
//! running, which blocking waits consult.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::ctx::OpCtx;
use super::{OpBlock, Skip};
use crate::error::{BoxError, Error, FailureKind, OpFailure};
use crate::stream::Stream;

/// What an op runs once its dependencies are granted.
pub(crate) trait Body: Send + 'static {
    type Output: Send + 'static;

    /// Whether the body completes in one poll (a closure): only those run on
    /// stream devices.
    const SYNC: bool;

    /// Drives the op's work. Called only while the op holds every grant and
    /// none of its inputs is poisoned or deleted.
    fn poll_body(
        self: Pin<&mut Self>,
        op: &OpBlock,
        stream: Option<&Stream>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Output, BoxError>>;
}

/// A synchronous op: a closure run once.
pub(crate) struct SyncBody<F>(pub(crate) Option<F>);

impl<F, T, E> Body for SyncBody<F>
where
    F: FnOnce(&OpCtx) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: Into<BoxError>,
{
    type Output = T;
    const SYNC: bool = true;

    fn poll_body(
        self: Pin<&mut Self>,
        op: &OpBlock,
        stream: Option<&Stream>,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<T, BoxError>> {
        // `SyncBody` is `Unpin`: it never pins its closure.
        let f = self
            .get_mut()
            .0
            .take()
            .expect("op body polled after it ran");
        let ctx = OpCtx::borrowed(op, stream);
        Poll::Ready(f(&ctx).map_err(Into::into))
    }
}

impl<F> Unpin for SyncBody<F> {}

/// An asynchronous op: a closure that makes a future from a leased `OpCtx`.
pub(crate) struct AsyncBody<F, Fut> {
    start: Option<F>,
    fut: Option<Fut>,
}

impl<F, Fut> AsyncBody<F, Fut> {
    pub(crate) fn new(start: F) -> Self {
        Self {
            start: Some(start),
            fut: None,
        }
    }
}

impl<F, Fut, T, E> Body for AsyncBody<F, Fut>
where
    F: FnOnce(OpCtx) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: Into<BoxError>,
{
    type Output = T;
    const SYNC: bool = false;

    fn poll_body(
        self: Pin<&mut Self>,
        op: &OpBlock,
        _stream: Option<&Stream>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<T, BoxError>> {
        // SAFETY: `fut` is structurally pinned: once set it is never moved
        // (only polled in place and dropped with `self`); `start` is not pinned.
        let this = unsafe { self.get_unchecked_mut() };
        if let Some(start) = this.start.take() {
            op.lease();
            this.fut = Some(start(OpCtx::leased(op, cx.waker().clone())));
        }
        // SAFETY: see above; `this` is pinned, so is `fut` inside it.
        let fut =
            unsafe { Pin::new_unchecked(this.fut.as_mut().expect("async op polled after it ran")) };
        fut.poll(cx).map(|r| r.map_err(Into::into))
    }
}

/// The future an op's task runs.
pub(crate) struct OpFuture<B> {
    op: *const OpBlock,
    started: bool,
    finished: bool,
    body: B,
}

// SAFETY: the only non-`Send` field is the pointer to the task's own metadata,
// which is `Sync`.
unsafe impl<B: Send> Send for OpFuture<B> {}

impl<B: Body> OpFuture<B> {
    pub(crate) fn new(op: &OpBlock, body: B) -> Self {
        Self {
            op,
            started: false,
            finished: false,
            body,
        }
    }
}

impl<B: Body> Future for OpFuture<B> {
    type Output = Result<B::Output, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `body` is structurally pinned (never moved out); the other
        // fields are plain data.
        let this = unsafe { self.get_unchecked_mut() };
        assert!(!this.finished, "op polled after it finished");
        // SAFETY: this future lives in the task allocation whose header holds
        // the block, and is dropped before it.
        let op = unsafe { &*this.op };

        if !this.started {
            // Device work on the op's variables must be done first.
            if op.shared().has_streams {
                if op.await_fences(cx, None).is_pending() {
                    return Poll::Pending;
                }
                op.settle_fences();
            }
            if let Some(skip) = op.blocked_by() {
                this.finished = true;
                return Poll::Ready(Err(skipped(op, skip)));
            }
        }

        this.started = true;
        // SAFETY: `body` is pinned with `this`.
        let body = unsafe { Pin::new_unchecked(&mut this.body) };
        let result = match run_body(op, body, None, cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(result) => result,
        };
        this.finished = true;
        Poll::Ready(match result {
            Ok(value) => {
                op.finish(None, false);
                Ok(value)
            }
            Err(kind) => {
                let failure = Arc::new(OpFailure::new(op.failure_name(), kind));
                op.finish(Some(failure.clone()), true);
                Err(Error::Failed(failure))
            }
        })
    }
}

impl<B> Drop for OpFuture<B> {
    fn drop(&mut self) {
        if !self.finished {
            // The executor dropped the op's runnable (or the task) before it
            // finished: release its grants so nothing waits on it forever.
            // SAFETY: as in `poll`.
            let op = unsafe { &*self.op };
            let failure = Arc::new(OpFailure::new(op.failure_name(), FailureKind::Dropped));
            op.finish(Some(failure), true);
        }
    }
}

/// Finishes an op that does not run (see [`OpBlock::blocked_by`]); returns
/// its error.
pub(super) fn skipped(op: &OpBlock, skip: Skip) -> Error {
    match skip {
        Skip::Poisoned(cause) => {
            op.finish(Some(cause.clone()), false);
            Error::Poisoned(cause)
        }
        Skip::Deleted(var) => {
            let cause = Arc::new(OpFailure::new(
                op.failure_name(),
                FailureKind::InputDeleted(var),
            ));
            op.finish(Some(cause), true);
            Error::Deleted(var)
        }
    }
}

/// Polls the op's body, marked as the thread's current op, panics caught.
pub(super) fn run_body<B: Body>(
    op: &OpBlock,
    body: Pin<&mut B>,
    stream: Option<&Stream>,
    cx: &mut Context<'_>,
) -> Poll<Result<B::Output, FailureKind>> {
    let polled = {
        let _current = CurrentOp::enter(op);
        catch_unwind(AssertUnwindSafe(|| body.poll_body(op, stream, cx)))
    };
    match polled {
        Ok(Poll::Pending) => Poll::Pending,
        Ok(Poll::Ready(Ok(value))) => Poll::Ready(Ok(value)),
        Ok(Poll::Ready(Err(e))) => Poll::Ready(Err(FailureKind::Error(e))),
        Err(payload) => Poll::Ready(Err(FailureKind::Panic(panic_message(payload.as_ref())))),
    }
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

crate::loom::thread::thread_local! {
    static CURRENT: std::cell::Cell<*const OpBlock> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// Marks the calling thread as running an op's body until dropped.
struct CurrentOp(*const OpBlock);

impl CurrentOp {
    fn enter(op: &OpBlock) -> Self {
        CurrentOp(CURRENT.with(|c| c.replace(op)))
    }
}

impl Drop for CurrentOp {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

/// Runs `f` with the op whose body the calling thread is running, if any.
pub(crate) fn with_current_op<R>(f: impl FnOnce(Option<&OpBlock>) -> R) -> R {
    let op = CURRENT.with(|c| c.get());
    // SAFETY: `CURRENT` is set only while the op's body is being polled on this
    // thread, during which the op's block is alive.
    f(unsafe { op.as_ref() })
}

/// Whether the calling thread is running an op's body.
pub(crate) fn in_op() -> bool {
    CURRENT.with(|c| !c.get().is_null())
}
