//! Futures that users await: an op's result ([`OpHandle`]) and the engine's
//! waits ([`Wait`]). Each also has a blocking `wait()` for code that is not
//! async, and a `wait_timeout()` that gives up at a deadline.
//!
//! A blocking wait refuses to block, rather than risk hanging, where the
//! thread may be one the awaited work needs: inside an op, or a host
//! function a stream op enqueued ([`Error::BlockingInOp`]) and, with the `tokio` feature, inside a tokio
//! runtime ([`Error::BlockingInRuntime`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures::future::FusedFuture;

use super::diagnostics::stop_watchdog;
use super::shared::Shared;
use crate::core::generations::Signal;
use crate::dep::{Cancel, OpTask, PushedOp, in_op, reclaim};
use crate::error::{Error, FailureKind, OpFailure};
use crate::exec::in_tokio_runtime;
use crate::trace::note_awaited;

/// Why the calling thread must not block on work that is not done: it runs
/// an op (its body, or device work: a stream device's host function, stream
/// thread or poller, which the awaited work may need), or it is inside a
/// tokio runtime.
fn refuse_to_block() -> Option<Error> {
    if in_op() || crate::device::on_device_thread() {
        Some(Error::BlockingInOp)
    } else if in_tokio_runtime() {
        Some(Error::BlockingInRuntime)
    } else {
        None
    }
}

/// Where the calling thread must not block ([`refuse_to_block`]) and `fut`
/// is not `ready`, polls it once (a wait that cannot tell it is done without
/// polling): its output if it is done after all, else the refusal. `None`
/// where blocking is fine.
fn refused<T, F>(ready: bool, fut: &mut F) -> Option<Result<T, Error>>
where
    F: Future<Output = Result<T, Error>> + Unpin,
{
    if ready {
        return None;
    }
    let refusal = refuse_to_block()?;
    match Pin::new(fut).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => Some(Err(refusal)),
    }
}

/// Blocks the calling thread on `fut`, unless the thread must not block
/// ([`refuse_to_block`]) and `fut` is not `ready` yet: blocking there could
/// stall the very executor the awaited work needs.
pub(super) fn block_outside_ops<T>(
    ready: bool,
    fut: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let mut fut = std::pin::pin!(fut);
    if let Some(out) = refused(ready, &mut fut) {
        return out;
    }
    reclaim::block_on(fut)
}

/// As [`block_outside_ops`], giving up after `timeout` with
/// [`Error::TimedOut`] (reporting `in_flight()` ops); `fut` is left as it
/// was, to be waited on again.
fn block_outside_ops_for<T, F>(
    ready: bool,
    fut: &mut F,
    timeout: Duration,
    in_flight: impl FnOnce() -> Option<usize>,
) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>> + Unpin,
{
    if let Some(out) = refused(ready, fut) {
        return out;
    }
    // (No deadline at all for a timeout past the end of time.)
    let deadline = Instant::now().checked_add(timeout);
    reclaim::block_on_until(fut, deadline).unwrap_or_else(|| {
        Err(Error::TimedOut {
            waited: timeout,
            in_flight: in_flight(),
        })
    })
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
    /// The result was taken; whether the op's body had started (what
    /// `is_started` and `cancel` still answer).
    Taken {
        started: bool,
    },
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
            HandleState::Ready(_) | HandleState::Taken { .. } => true,
        }
    }

    /// Whether the op's body has started: from then on it runs to its end,
    /// and [`cancel`](Self::cancel) returns false. False while the op waits
    /// for its variables, units or executor, and for an op that never
    /// runs: cancelled, skipped on a poisoned or deleted input, or refused
    /// without a push. A snapshot; once true, it stays true (after the op
    /// finished, and after its result was taken).
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let v = engine.new_var();
    /// let op = engine.push(&[], &[&v], |_| Ok(()))?;
    /// engine.wait_all().wait()?;
    /// assert!(op.is_started()); // it ran
    /// assert!(!op.cancel()); // too late
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn is_started(&self) -> bool {
        match &self.state {
            HandleState::Pushed(op) => op.is_started(),
            HandleState::Ready(_) => false,
            HandleState::Taken { started } => *started,
        }
    }

    /// Cancels the op if it has not started: then its body never runs, the
    /// handle resolves to [`Error::Cancelled`], and the variables it would
    /// have mutated are poisoned (their new values were never computed:
    /// later ops on them are skipped, until
    /// [`clear_poison`](crate::Engine::clear_poison)). A cancelled op still
    /// waits for its turn on its variables, then finishes at once (giving
    /// back any resource units it was granted).
    /// [`Engine::wait_all`](crate::Engine::wait_all) does not report it as
    /// a failure.
    ///
    /// Returns whether the op's body will not run: true if it had not
    /// started, or was cancelled before (its handle resolves to
    /// [`Error::Cancelled`]; an op that was already skipped on a poisoned
    /// or deleted input, or refused without a push, never runs either, and
    /// keeps its own error); false if its body had started
    /// ([`is_started`](Self::is_started)): it runs to its end, and its
    /// handle resolves as usual. The answer is exact: the op's start and
    /// the cancel are each one atomic read-modify-write of the op's status,
    /// so whichever comes first decides, and the other sees it. Ignoring it
    /// is fine: the handle still tells what happened.
    ///
    /// An async op ([`Engine::push_async`](crate::Engine::push_async),
    /// [`OpBuilder::run_async`](crate::OpBuilder::run_async)) starts when
    /// its body is first polled: from then on `cancel` returns false, and
    /// the body runs to its end (it is not interrupted at its next
    /// `.await`; have it watch a flag of your own for that). An op on a
    /// stream device starts when its body is called to enqueue its work.
    /// A replay ([`Graph::replay`](crate::Graph::replay)) cannot be
    /// cancelled.
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
    /// assert!(late.cancel()); // it cannot have started: `gate` is held
    /// tx.send(()).unwrap();
    /// assert!(!late.is_started());
    /// assert!(matches!(late.wait(), Err(Error::Cancelled)));
    /// assert!(matches!(engine.get(&v).wait(), Err(Error::Poisoned { .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn cancel(&self) -> bool {
        match &self.state {
            HandleState::Pushed(op) => op.cancel() == Cancel::NotRun,
            HandleState::Ready(_) => true,
            HandleState::Taken { started } => !started,
        }
    }

    /// Blocks the calling thread until the op has finished, and returns its
    /// result. The thread yields and looks again for some 20 µs before it
    /// parks: an op that ends within that time is seen without a park and
    /// a wake, which cost more.
    ///
    /// # Errors
    ///
    /// The op's error; or, while the op has not finished (else its result
    /// is returned):
    ///
    /// - [`Error::BlockingInOp`] if called inside an op: blocking there could
    ///   stall the executor the other op needs;
    /// - [`Error::BlockingInRuntime`] (with the `tokio` feature) if called on
    ///   a thread inside a tokio runtime: a worker, its `block_on`, a thread
    ///   under a `Handle::enter` guard. Blocking there could stall the
    ///   runtime the op needs (a current-thread runtime would never run it),
    ///   and tokio's own `block_on` panics there.
    ///
    /// In both cases `.await` the handle instead. Where blocking is what you
    /// want on such a thread (a `spawn_blocking` closure, which tokio counts
    /// as inside the runtime), block through the runtime:
    /// `Handle::current().block_on(handle)`.
    ///
    /// What cannot be detected, and hangs or stalls as any blocking call
    /// would: blocking inside another runtime (smol's, async-std's, a
    /// `futures` executor), on a thread of a
    /// [custom executor](crate::Executor::custom), or inside tokio without
    /// the `tokio` feature. [`wait_timeout`](OpHandle::wait_timeout) bounds
    /// the wait there.
    ///
    /// # Panics
    ///
    /// If the handle already returned its result (awaited to the end).
    pub fn wait(self) -> Result<T, Error> {
        assert!(
            !self.is_terminated(),
            "OpHandle::wait called after the handle returned its result"
        );
        block_outside_ops(self.is_finished(), self)
    }

    /// As [`wait`](OpHandle::wait), giving up after `timeout`: then it returns
    /// [`Error::TimedOut`] and the handle is still good (wait, or `.await`
    /// it, again).
    ///
    /// ```
    /// use std::time::Duration;
    /// use depflow::{BoxError, Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let v = engine.new_var();
    /// let (release, gate) = std::sync::mpsc::channel::<()>();
    /// let mut op = engine.push(&[], &[&v], move |_| -> Result<u32, BoxError> {
    ///     gate.recv()?; // stuck until released
    ///     Ok(42)
    /// })?;
    /// assert!(matches!(
    ///     op.wait_timeout(Duration::from_millis(10)),
    ///     Err(Error::TimedOut { .. })
    /// ));
    /// release.send(()).unwrap();
    /// assert_eq!(op.wait_timeout(Duration::from_secs(60))?, 42);
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`wait`](OpHandle::wait), and [`Error::TimedOut`].
    ///
    /// # Panics
    ///
    /// If the handle has already returned its result (from this call, or
    /// as a future), as a future polled after it completed does.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<T, Error> {
        assert!(
            !self.is_terminated(),
            "OpHandle::wait_timeout called after the handle returned its result"
        );
        block_outside_ops_for(self.is_finished(), self, timeout, || None)
    }
}

impl<T> Future for OpHandle<T> {
    type Output = Result<T, Error>;

    /// Resolves once; polled again after that, it stays pending (see its
    /// [`FusedFuture`] implementation).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let out = match &mut self.state {
            HandleState::Pushed(op) => match op.poll_result(cx) {
                Poll::Pending => {
                    // Inside an op's body, that op now waits for this one:
                    // the engine's diagnostics can see a cycle through
                    // them. (Not for the one poll a refused blocking wait
                    // makes, with a waker that wakes nothing.)
                    if !cx.waker().will_wake(Waker::noop()) {
                        note_awaited(op.op());
                    }
                    return Poll::Pending;
                }
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
                    std::mem::replace(&mut self.state, HandleState::Taken { started: false })
                else {
                    unreachable!()
                };
                return Poll::Ready(*out);
            }
            HandleState::Taken { .. } => return Poll::Pending,
        };
        // Completed: nothing left to detach.
        let started = self.is_started();
        self.state = HandleState::Taken { started };
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
        matches!(self.state, HandleState::Taken { .. })
    }
}

impl<T> Drop for OpHandle<T> {
    fn drop(&mut self) {
        if let HandleState::Pushed(_) = self.state
            && let HandleState::Pushed(op) =
                std::mem::replace(&mut self.state, HandleState::Taken { started: false })
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

/// What a wait on the whole engine does once every op it covers finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drained {
    /// `wait_all`: resolves to the failures since the last one reported.
    ReportFailures,
    /// `shutdown`: stops the watchdog's thread and joins it.
    StopWatchdog,
}

enum WaitFor {
    Ready(Option<Result<(), Error>>),
    Op(OpHandle<()>),
    Drain {
        signal: Arc<Signal>,
        shared: Arc<Shared>,
        then: Drained,
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

    pub(crate) fn drain(signal: Arc<Signal>, shared: Arc<Shared>, then: Drained) -> Self {
        Self {
            inner: WaitFor::Drain {
                signal,
                shared,
                then,
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

    /// Blocks the calling thread until the wait is over (yielding and
    /// looking again for some 20 µs before it parks, as
    /// [`OpHandle::wait`] does).
    ///
    /// # Errors
    ///
    /// What awaiting it would return; or, before the wait is over,
    /// [`Error::BlockingInOp`] inside an op and [`Error::BlockingInRuntime`]
    /// inside a tokio runtime (with the `tokio` feature), as for
    /// [`OpHandle::wait`], which says what is not detected.
    ///
    /// # Panics
    ///
    /// If the wait is already over (awaited to the end).
    pub fn wait(self) -> Result<(), Error> {
        assert!(
            !self.is_terminated(),
            "Wait::wait called after the wait returned"
        );
        block_outside_ops(self.is_ready(), self)
    }

    /// As [`wait`](Wait::wait), giving up after `timeout`: then it returns
    /// [`Error::TimedOut`], which for a wait on the whole engine
    /// ([`wait_all`](crate::Engine::wait_all),
    /// [`shutdown`](crate::Engine::shutdown)) counts the ops still in
    /// flight, and the wait is still good (wait, or `.await` it, again).
    ///
    /// ```
    /// use std::time::Duration;
    /// use depflow::{BoxError, Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let v = engine.new_var();
    /// let (release, gate) = std::sync::mpsc::channel::<()>();
    /// engine.push(&[], &[&v], move |_| -> Result<(), BoxError> { Ok(gate.recv()?) })?;
    /// engine.push(&[], &[&v], |_| Ok::<_, BoxError>(()))?; // behind the first
    /// let mut all = engine.wait_all();
    /// match all.wait_timeout(Duration::from_millis(10)) {
    ///     Err(Error::TimedOut { in_flight, .. }) => assert_eq!(in_flight, Some(2)),
    ///     other => panic!("{other:?}"),
    /// }
    /// release.send(()).unwrap();
    /// all.wait()?;
    /// # Ok::<(), Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`wait`](Wait::wait), and [`Error::TimedOut`].
    ///
    /// # Panics
    ///
    /// If the wait is already over (it returned, from this call or as a
    /// future).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<(), Error> {
        assert!(
            !self.is_terminated(),
            "Wait::wait_timeout called after the wait returned"
        );
        let in_flight = match &self.inner {
            WaitFor::Drain { shared, .. } => Some(shared.clone()),
            _ => None,
        };
        block_outside_ops_for(self.is_ready(), self, timeout, move || {
            in_flight.map(|shared| shared.pending.in_flight())
        })
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
                then,
            } => {
                std::task::ready!(signal.poll_fired(cx));
                // Everything this thread pushed before is finished: free it.
                reclaim::drain();
                match then {
                    Drained::ReportFailures => shared.take_failures(),
                    Drained::StopWatchdog => {
                        // Nothing is left to watch: the engine is closed and
                        // drained (its thread would look until the last
                        // handle went).
                        stop_watchdog(shared);
                        Ok(())
                    }
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
