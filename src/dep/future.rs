//! The future a host op's task runs: wait for device work on its variables,
//! check its inputs, start (unless cancelled first: `start`), run the body
//! with panics caught, then finish the op
//! (see `lifecycle`); and the thread-local marker of the op a thread is
//! running, which blocking waits (and the engine's last handle) consult.
//!
//! What the body still holds when it will not run again (the closure of a
//! skipped op, the future of an async one) is dropped here, inside the
//! future's poll or drop, panics caught (`discard_body`): left to the task,
//! it would be dropped under `async-task`'s guard, which aborts the process
//! on a panic, and outside the op, where dropping the engine's last handle
//! would wait for ops this very thread may have to run. While a skipped
//! op's body is dropped, the thread also knows why it was skipped
//! ([`skipped_because`]): a body that must tell someone that it will not
//! run (a collective's stand-in, `engine/collective.rs`) can say why.

// `unsafe`: the future's pointer to its own task's op, and pin projection; each block says why it
// is sound.
#![allow(unsafe_code)]

use std::future::Future;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use super::block::OpBlock;
use super::body::Body;
use super::ctx::Env;
use super::host::Host;
use super::lifecycle::{Outcome, abandon, dropping_failed, finish, host, lease_dropped, skip};
use super::output::Output;
use super::poison::Skip;
use super::start::Start;
use crate::error::{Error, FailureKind, panic_message};

/// The future of an op on a host device (see `stream_op` for the other).
pub(crate) struct OpFuture<B: Body, H: Host> {
    op: *const OpBlock,
    started: bool,
    finished: bool,
    body: B,
    _host: PhantomData<fn(&H)>,
}

// SAFETY: the only non-`Send` field is the pointer to the task's own metadata,
// which is `Sync`.
unsafe impl<B: Body, H: Host> Send for OpFuture<B, H> {}

impl<B: Body, H: Host> OpFuture<B, H> {
    pub(super) fn new(op: &OpBlock, body: B) -> Self {
        Self {
            op,
            started: false,
            finished: false,
            body,
            _host: PhantomData,
        }
    }
}

impl<B: Body, H: Host> Future for OpFuture<B, H> {
    type Output = Result<Output<B::Output>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `body` is structurally pinned (never moved out); the other
        // fields are plain data.
        let this = unsafe { self.get_unchecked_mut() };
        assert!(!this.finished, "op polled after it finished");
        // SAFETY: this future lives in the task allocation whose header holds
        // the block, and is dropped before it; `spawn::<_, H>` made it, and
        // the op is pending while it runs.
        let (op, host) = unsafe { (&*this.op, host::<H>(&*this.op)) };

        if !this.started {
            let streams = host.has_streams();
            // Device work on the op's variables must be done first.
            if streams {
                if op.await_fences(cx, None).is_pending() {
                    return Poll::Pending;
                }
                op.settle_fences();
            }
            // An op with units was checked when it became ready; a failed
            // device write may have come in since only with streams.
            let checked = !streams && op.units().is_some_and(|u| !u.is_skipped());
            if !checked && let Some(why) = op.blocked_by(streams) {
                return Poll::Ready(Err(this.skip(op, why, host)));
            }
            // Its inputs allow it: the body runs unless a cancel came
            // first, which one read-modify-write decides (`start`).
            if op.start() == Start::Cancelled {
                return Poll::Ready(Err(this.skip(op, Skip::Cancelled, host)));
            }
            host.on_started(op);
        } else {
            host.on_resumed(op);
        }

        this.started = true;
        // SAFETY: `body` is pinned with `this`.
        let body = unsafe { Pin::new_unchecked(&mut this.body) };
        let env = Env {
            stream: None,
            engine: host.id(),
            lease_dropped: lease_dropped::<H>,
        };
        let result = match run_body(op, body, &env, cx) {
            Poll::Pending => {
                host.on_suspended(op);
                return Poll::Pending;
            }
            Poll::Ready(result) => result,
        };
        this.finished = true;
        if !B::SYNC {
            // A finished future may still hold something (a sync body's
            // closure was consumed by its call).
            // SAFETY: `body` is pinned with `this`.
            discard_body(op, unsafe { Pin::new_unchecked(&mut this.body) }, host);
        }
        Poll::Ready(match result {
            Ok(value) => {
                finish(op, Outcome::Succeeded, host);
                Ok(Output::new(value, op, host.id()))
            }
            Err(kind) => {
                let failure = op.failure(kind);
                finish(op, Outcome::Failed(failure.clone()), host);
                Err(Error::Failed(failure))
            }
        })
    }
}

impl<B: Body, H: Host> OpFuture<B, H> {
    /// The op will not run: drops what its body holds and finishes it as
    /// skipped; returns its error.
    #[cold]
    fn skip(&mut self, op: &OpBlock, why: Skip, host: &H) -> Error {
        self.finished = true;
        // SAFETY: `body` is structurally pinned: the future is (in its
        // task), and `self` is its pinned place.
        discard_skipped(
            op,
            unsafe { Pin::new_unchecked(&mut self.body) },
            host,
            &why,
        );
        skip(op, why, host)
    }
}

impl<B: Body, H: Host> Drop for OpFuture<B, H> {
    fn drop(&mut self) {
        if !self.finished {
            // SAFETY: as in `poll`: the op has not retired.
            let (op, host) = unsafe { (&*self.op, host::<H>(&*self.op)) };
            // SAFETY: the future is pinned (in its task) and being dropped:
            // the body is dropped in place.
            discard_body(op, unsafe { Pin::new_unchecked(&mut self.body) }, host);
            abandon(op, host);
        }
    }
}

/// Drops what `body` still holds (see [`Body::discard`]) as if running the
/// op: the thread counts as inside it, so that the engine's last handle
/// dropped there shuts the engine down in the background instead of
/// waiting for ops this thread may have to run. A panic is caught and
/// recorded as a failure of the op (reported by `wait_all`); the op's own
/// outcome stands.
pub(super) fn discard_body<B: Body, H: Host>(op: &OpBlock, body: Pin<&mut B>, host: &H) {
    let dropped = {
        let _current = CurrentOp::enter(op);
        catch_unwind(AssertUnwindSafe(|| body.discard()))
    };
    if let Err(payload) = dropped {
        host.record_failure(dropping_failed(op, "what its body held", payload));
    }
}

/// [`discard_body`] for an op skipped for `why`, which
/// [`skipped_because`] tells what the body drops meanwhile.
pub(super) fn discard_skipped<B: Body, H: Host>(
    op: &OpBlock,
    body: Pin<&mut B>,
    host: &H,
    why: &Skip,
) {
    let _skipped = Skipping::enter(why);
    discard_body(op, body, host);
}

/// Polls the op's body, marked as the thread's current op, panics caught.
#[inline]
pub(super) fn run_body<B: Body>(
    op: &OpBlock,
    body: Pin<&mut B>,
    env: &Env<'_>,
    cx: &mut Context<'_>,
) -> Poll<Result<B::Output, FailureKind>> {
    let polled = {
        let _current = CurrentOp::enter(op);
        catch_unwind(AssertUnwindSafe(|| body.poll_body(op, env, cx)))
    };
    match polled {
        Ok(Poll::Pending) => Poll::Pending,
        Ok(Poll::Ready(Ok(value))) => Poll::Ready(Ok(value)),
        Ok(Poll::Ready(Err(e))) => Poll::Ready(Err(FailureKind::Error(e))),
        Err(payload) => Poll::Ready(Err(FailureKind::Panic(panic_message(payload.as_ref())))),
    }
}

crate::loom::thread::thread_local! {
    static CURRENT: std::cell::Cell<*const OpBlock> = const { std::cell::Cell::new(std::ptr::null()) };
}

crate::loom::thread::thread_local! {
    /// Why the op whose body this thread is dropping was skipped (null
    /// unless one is: see [`discard_skipped`]).
    static SKIPPED: std::cell::Cell<*const Skip> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// Marks the calling thread as dropping a skipped op's body until dropped.
struct Skipping(*const Skip);

impl Skipping {
    fn enter(why: &Skip) -> Self {
        Skipping(SKIPPED.with(|c| c.replace(why)))
    }
}

impl Drop for Skipping {
    fn drop(&mut self) {
        SKIPPED.with(|c| c.set(self.0));
    }
}

/// Why the op whose body the calling thread is dropping did not run (a
/// poisoned or deleted input, or cancelled), in words: `None` unless the
/// thread is dropping a skipped op's body. For what a body holds that must
/// tell others that the op will not run (a collective's ticket: its
/// stand-in tells the other ranks why).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn skipped_because() -> Option<String> {
    let why = SKIPPED.try_with(|c| c.get()).ok()?;
    // SAFETY: `SKIPPED` is set only while `discard_skipped` drops a body on
    // this thread, during which the `Skip` it points to (its argument) is
    // alive.
    unsafe { why.as_ref() }.map(Skip::describe)
}

/// Marks the calling thread as running an op's body until dropped.
pub(super) struct CurrentOp(*const OpBlock);

impl CurrentOp {
    #[inline]
    pub(super) fn enter(op: &OpBlock) -> Self {
        CurrentOp(CURRENT.with(|c| c.replace(op)))
    }
}

impl Drop for CurrentOp {
    #[inline]
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

/// Runs `f` with the op whose body the calling thread is running, if any.
#[inline]
pub(crate) fn with_current_op<R>(f: impl FnOnce(Option<&OpBlock>) -> R) -> R {
    let op = CURRENT.with(|c| c.get());
    // SAFETY: `CURRENT` is set only while the op's body is being polled on this
    // thread, during which the op's block is alive.
    f(unsafe { op.as_ref() })
}

/// Whether the calling thread is running an op's body (of any engine).
#[inline]
pub(crate) fn in_op() -> bool {
    // (A thread whose locals are gone runs no op.)
    CURRENT.try_with(|c| !c.get().is_null()).unwrap_or(false)
}

/// Whether the calling thread is running the body of an op of the host at
/// `host`: waiting there for the whole host would wait for that op. (The
/// marker is per thread; this tells one engine's ops from another's.)
#[inline]
pub(crate) fn in_op_of<H: super::Host>(host: &H) -> bool {
    let host: *const () = std::ptr::from_ref(host).cast();
    // The op running here is alive, and so is its host: an equal address is
    // that very host, not a later one at the same place.
    with_current_op(|op| op.is_some_and(|op| std::ptr::eq(op.host, host)))
}
