//! Futures that users await: an op's result ([`OpHandle`]) and the engine's
//! waits ([`Wait`]). Each also has a blocking `wait()` for code that is not
//! async.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::FusedFuture;

use super::shared::Shared;
use crate::core::generations::Signal;
use crate::dep::{OpTask, PushedOp, in_op, reclaim};
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
/// on its variables happen as if the handle were kept. To keep an op that
/// has not started from running, [`cancel`](OpHandle::cancel) it.
///
/// ```
/// let engine = depflow::Engine::new();
/// let v = engine.var(40);
/// let handle = engine.push(&[], &[&v], {
///     let v = v.clone();
///     move |ctx| {
///         *ctx.write(&v)? += 2;
///         Ok(*ctx.read(&v)?)
///     }
/// })?;
/// assert_eq!(handle.wait()?, 42);
/// # Ok::<(), depflow::Error>(())
/// ```
pub struct OpHandle<T> {
    state: HandleState<T>,
}

enum HandleState<T> {
    Pushed(PushedOp<T>),
    /// Decided without pushing (a refused `Engine::get`); boxed, so that a
    /// handle stays two words plus a tag, cheap to move and drop.
    Ready(Box<Result<T, Error>>),
    /// The result was taken.
    Taken,
}

impl<T> OpHandle<T> {
    pub(crate) fn new(task: OpTask<T>) -> Self {
        Self {
            state: HandleState::Pushed(PushedOp::new(task)),
        }
    }

    pub(crate) fn ready(result: Result<T, Error>) -> Self {
        Self {
            state: HandleState::Ready(Box::new(result)),
        }
    }

    /// Whether the op has finished: it has run (or was skipped), and
    /// [`Engine::wait_all`](crate::Engine::wait_all) no longer waits for it.
    /// True from the moment `wait_all` can see it finished, and after the
    /// result was taken.
    pub fn is_finished(&self) -> bool {
        match &self.state {
            HandleState::Pushed(op) => op.is_finished(),
            HandleState::Ready(_) | HandleState::Taken => true,
        }
    }

    /// Cancels the op if it has not started: then its body never runs, the
    /// handle resolves to [`Error::Cancelled`], and the variables it would
    /// have mutated are poisoned (their new values were never computed:
    /// later ops on them are skipped, until
    /// [`clear_poison`](crate::Engine::clear_poison)). A cancelled op still
    /// waits for its turn on its variables, then finishes at once without
    /// taking its resource units. [`Engine::wait_all`](crate::Engine::wait_all)
    /// does not report it as a failure.
    ///
    /// An op that has started runs to its end, and its handle resolves as
    /// usual; await the handle to know which happened.
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let (gate, v) = (engine.new_var(), engine.var(0));
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// // Holds `gate` until we say so.
    /// engine.push(&[], &[&gate], move |_| Ok(rx.recv()?))?;
    /// let k = v.key();
    /// let late = engine.push(&[&gate], &[&v], move |ctx| {
    ///     *ctx.write(k)? = 1;
    ///     Ok(())
    /// })?;
    /// late.cancel(); // it cannot have started: `gate` is held
    /// tx.send(()).unwrap();
    /// assert!(matches!(late.wait(), Err(Error::Cancelled)));
    /// assert!(matches!(engine.get(&v).wait(), Err(Error::Poisoned(_))));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn cancel(&self) {
        if let HandleState::Pushed(op) = &self.state {
            op.cancel();
        }
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

    /// Resolves once; polled again after that, it stays pending (see its
    /// [`FusedFuture`] implementation).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let out = match &mut self.state {
            HandleState::Pushed(op) => match op.poll_result(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(out) => out.unwrap_or_else(|| {
                    // The task closed without output: its future was dropped
                    // before finishing, which released its grants with a
                    // failure of the same kind (named after the op).
                    Err(Error::Failed(Arc::new(OpFailure::new(
                        None,
                        FailureKind::Dropped,
                    ))))
                }),
            },
            HandleState::Ready(_) => {
                let HandleState::Ready(out) =
                    std::mem::replace(&mut self.state, HandleState::Taken)
                else {
                    unreachable!()
                };
                return Poll::Ready(*out);
            }
            HandleState::Taken => return Poll::Pending,
        };
        // Completed: nothing left to detach.
        self.state = HandleState::Taken;
        reclaim::collect();
        Poll::Ready(out)
    }
}

// Nothing in a handle is pinned: the task lives on the heap, and a ready
// result is moved out whole.
impl<T> Unpin for OpHandle<T> {}

impl<T> FusedFuture for OpHandle<T> {
    /// True once the handle has resolved (as `select!` loops expect).
    fn is_terminated(&self) -> bool {
        matches!(self.state, HandleState::Taken)
    }
}

impl<T> Drop for OpHandle<T> {
    fn drop(&mut self) {
        if let HandleState::Pushed(_) = self.state
            && let HandleState::Pushed(op) = std::mem::replace(&mut self.state, HandleState::Taken)
        {
            op.detach();
        }
    }
}

impl<T> std::fmt::Debug for OpHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpHandle")
            .field("finished", &self.is_finished())
            .finish()
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
/// engine.push(&[], &[&v], |_| Ok(()))?;
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
    /// Resolved.
    Done,
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
            WaitFor::Done => true,
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

    /// Resolves once; polled again after that, it stays pending (see its
    /// [`FusedFuture`] implementation).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let out = match &mut self.inner {
            WaitFor::Ready(result) => result.take().unwrap_or(Ok(())),
            WaitFor::Op(handle) => std::task::ready!(Pin::new(handle).poll(cx)),
            WaitFor::Drain {
                signal,
                shared,
                report_failures,
            } => {
                std::task::ready!(signal.poll_fired(cx));
                // Everything this thread pushed before is finished: free it.
                reclaim::drain();
                if *report_failures {
                    shared.take_failures()
                } else {
                    Ok(())
                }
            }
            WaitFor::Done => return Poll::Pending,
        };
        self.inner = WaitFor::Done;
        Poll::Ready(out)
    }
}

impl FusedFuture for Wait {
    /// True once the wait has resolved (as `select!` loops expect).
    fn is_terminated(&self) -> bool {
        matches!(self.inner, WaitFor::Done)
    }
}

impl std::fmt::Debug for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wait")
            .field("ready", &self.is_ready())
            .finish()
    }
}
