//! Futures that users await: an op's result ([`OpHandle`]) and the engine's
//! waits ([`Wait`]). Each also has a blocking `wait()` for code that is not
//! async.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_task::FallibleTask;

use super::shared::Shared;
use crate::core::generations::Signal;
use crate::dep::{OpBlock, OpTask, in_op, reclaim};
use crate::error::{Error, FailureKind, OpFailure};

/// Blocks the calling thread on `fut`, unless it is inside an op and `fut`
/// is not `ready` yet: blocking there could stall the very executor the
/// awaited work needs.
pub(super) fn block_outside_ops<T>(
    ready: bool,
    fut: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    if in_op() && !ready {
        return Err(Error::BlockingInOp);
    }
    reclaim::block_on(fut)
}

/// The result of a pushed op: a future that resolves once the op has run (or
/// was skipped), to its output or its error.
///
/// Dropping the handle never cancels the op: it runs anyway, and its effects
/// on its variables happen as if the handle were kept.
///
/// ```
/// let engine = depflow::Engine::new();
/// let v = engine.var(40);
/// let handle = engine.push(&[], &[&v], {
///     let v = v.clone();
///     move |ctx| -> Result<i32, depflow::Error> {
///         *ctx.write(&v)? += 2;
///         Ok(*ctx.read(&v)?)
///     }
/// })?;
/// assert_eq!(handle.wait()?, 42);
/// # Ok::<(), depflow::Error>(())
/// ```
pub struct OpHandle<T> {
    task: Option<FallibleTask<Result<T, Error>, OpBlock>>,
}

impl<T> OpHandle<T> {
    pub(crate) fn new(task: OpTask<T>) -> Self {
        Self {
            task: Some(task.fallible()),
        }
    }

    /// Whether the op has finished (its result is ready, or was taken).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(|task| task.is_finished())
    }

    /// Blocks the calling thread until the op has finished, and returns its
    /// result.
    ///
    /// # Errors
    ///
    /// The op's error; or [`Error::BlockingInOp`] if called inside an op
    /// while the op it waits for has not finished (blocking there could stall
    /// the executor the other op needs: `.await` it instead).
    pub fn wait(self) -> Result<T, Error> {
        block_outside_ops(self.is_finished(), self)
    }
}

impl<T> Future for OpHandle<T> {
    type Output = Result<T, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let task = self
            .task
            .as_mut()
            .expect("OpHandle polled after completion");
        match Pin::new(task).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(out) => {
                // Completed: nothing left to detach.
                self.task = None;
                reclaim::collect();
                Poll::Ready(out.unwrap_or_else(|| {
                    // The task closed without output: its future was dropped
                    // before finishing, which released its grants with a
                    // failure of the same kind (named after the op).
                    Err(Error::Failed(Arc::new(OpFailure::new(
                        None,
                        FailureKind::Dropped,
                    ))))
                }))
            }
        }
    }
}

impl<T> Drop for OpHandle<T> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.detach();
        }
    }
}

impl<T> std::fmt::Debug for OpHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("OpHandle");
        if let Some(task) = &self.task {
            d.field("finished", &task.is_finished());
        }
        d.finish()
    }
}

/// A wait on the engine: [`Engine::wait_for_var`](crate::Engine::wait_for_var),
/// [`Engine::wait_all`](crate::Engine::wait_all) or
/// [`Engine::shutdown`](crate::Engine::shutdown).
///
/// Await it, or call [`wait`](Wait::wait) to block. What it waits for is fixed
/// when it is created, not when it is first polled.
///
/// ```
/// let engine = depflow::Engine::new();
/// let v = engine.new_var();
/// engine.push(&[], &[&v], |_| Ok::<_, depflow::Error>(()))?;
/// let all = engine.wait_all(); // covers the push above, whenever awaited
/// futures::executor::block_on(all)?; // or `all.wait()?`
/// # Ok::<(), depflow::Error>(())
/// ```
#[must_use = "a Wait does nothing unless awaited or waited on"]
pub struct Wait {
    inner: WaitFor,
}

enum WaitFor {
    Ready(Option<Result<(), Error>>),
    Op(OpHandle<()>),
    Drain {
        signal: Arc<Signal>,
        shared: Arc<Shared>,
        report_failures: bool,
    },
}

impl Wait {
    pub(crate) fn ready(result: Result<(), Error>) -> Self {
        Self {
            inner: WaitFor::Ready(Some(result)),
        }
    }

    pub(crate) fn op(handle: OpHandle<()>) -> Self {
        Self {
            inner: WaitFor::Op(handle),
        }
    }

    pub(crate) fn drain(signal: Arc<Signal>, shared: Arc<Shared>, report_failures: bool) -> Self {
        Self {
            inner: WaitFor::Drain {
                signal,
                shared,
                report_failures,
            },
        }
    }

    fn is_ready(&self) -> bool {
        match &self.inner {
            WaitFor::Ready(_) => true,
            WaitFor::Op(h) => h.is_finished(),
            WaitFor::Drain { signal, .. } => signal.is_fired(),
        }
    }

    /// Blocks the calling thread until the wait is over.
    ///
    /// # Errors
    ///
    /// What awaiting it would return; or [`Error::BlockingInOp`] if called
    /// inside an op before the wait is over.
    pub fn wait(self) -> Result<(), Error> {
        block_outside_ops(self.is_ready(), self)
    }
}

impl Future for Wait {
    type Output = Result<(), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.inner {
            WaitFor::Ready(result) => {
                Poll::Ready(result.take().expect("Wait polled after completion"))
            }
            WaitFor::Op(handle) => Pin::new(handle).poll(cx),
            WaitFor::Drain {
                signal,
                shared,
                report_failures,
            } => {
                std::task::ready!(signal.poll_fired(cx));
                // Everything this thread pushed before is finished: free it.
                reclaim::drain();
                Poll::Ready(if *report_failures {
                    shared.take_failures()
                } else {
                    Ok(())
                })
            }
        }
    }
}

impl std::fmt::Debug for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait")
            .field("ready", &self.is_ready())
            .finish()
    }
}
