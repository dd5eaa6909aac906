//! What an op runs once its dependencies are granted: a closure run once
//! ([`SyncBody`]) or a future made from a leased context ([`AsyncBody`]).

// `unsafe`: pin projection of an async body's future; each block says why it is sound.
#![allow(unsafe_code)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::block::OpBlock;
use super::ctx::{Env, OpCtx};
use crate::error::BoxError;

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
        env: &Env<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Output, BoxError>>;

    /// Drops, in place, what the body still holds: the closure of a body
    /// that never ran, the future of one that finished or never will.
    /// User code (destructors) runs here: the caller catches its panics.
    fn discard(self: Pin<&mut Self>);

    /// Whether the body holds nothing left to [`discard`](Self::discard)
    /// (a closure its call consumed): then dropping it runs no user code,
    /// and discarding it can be skipped.
    #[inline]
    fn is_spent(&self) -> bool {
        false
    }
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
        env: &Env<'_>,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<T, BoxError>> {
        // `SyncBody` is `Unpin`: it never pins its closure.
        let f = self
            .get_mut()
            .0
            .take()
            .expect("op body polled after it ran");
        let ctx = OpCtx::borrowed(op, env);
        Poll::Ready(f(&ctx).map_err(Into::into))
    }

    fn discard(self: Pin<&mut Self>) {
        self.get_mut().0 = None;
    }

    #[inline]
    fn is_spent(&self) -> bool {
        self.0.is_none()
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
        env: &Env<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<T, BoxError>> {
        // SAFETY: `fut` is structurally pinned: once set it is never moved
        // (only polled in place and dropped with `self`); `start` is not pinned.
        let this = unsafe { self.get_unchecked_mut() };
        if let Some(start) = this.start.take() {
            this.fut = Some(start(OpCtx::leased(op, env, cx.waker().clone())));
        }
        // SAFETY: see above; `this` is pinned, so is `fut` inside it.
        let fut =
            unsafe { Pin::new_unchecked(this.fut.as_mut().expect("async op polled after it ran")) };
        fut.poll(cx).map(|r| r.map_err(Into::into))
    }

    fn discard(self: Pin<&mut Self>) {
        // SAFETY: as in `poll_body`; `fut` is dropped in place (assigning
        // drops the old value where it is), as pinning allows.
        let this = unsafe { self.get_unchecked_mut() };
        this.start = None;
        this.fut = None;
    }
}
