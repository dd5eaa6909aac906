//! How an op runs on a stream device: its future, in two halves.
//!
//! 1. *Enqueue*, on the device's launcher thread, once its variables are
//!    granted: wait on the host for fences of other devices; put stream
//!    waits for this device's fences on its lane; run the body (which
//!    enqueues), then drop what it holds (so that it is gone when the op
//!    completes, as a host op's body is); record the op's fence after it;
//!    publish the fence in the variables; give the variables back. The
//!    op's units stay taken.
//! 2. *Complete*, when the device's poller completed the fence, on the
//!    poller's thread (it runs the op's task there, see `device::poller`):
//!    give the units back (and, if the work failed, take back those handed
//!    on to the outputs: a failed op hands nothing on, on a device as on the
//!    host), resolve the handle, retire the op.
//!
//! A host op on an engine with stream devices waits (parked) for the fences
//! on its variables before it runs (see `poison`).

// `unsafe`: as in `future`, for ops on stream devices; each block says why it is sound.
#![allow(unsafe_code)]

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::block::OpBlock;
use super::body::Body;
use super::ctx::Env;
use super::future::{discard_body, discard_skipped, run_body};
use super::host::{Host, Units};
use super::lifecycle::{
    Outcome, abandon, dropping_failed, finish, host, lease_dropped, release_edges, retire, skip,
};
use super::output::Output;
use super::start::Start;
use super::units::{Deferred, OpUnits};
use crate::core::few::Few;
use crate::device::poller::Entry;
use crate::device::{Fence, FenceFailure, Stream, StreamDevice};
use crate::error::{Error, FailureKind, VarId};
use crate::resource::Revocable;

impl OpBlock {
    /// Puts stream waits on `lane` of `device` (the op's) for that device's
    /// fences on the op's variables, and returns the writes' among them not done yet
    /// (the new fence's parents: their failure is the op's), each with the
    /// first variable it wrote, in edge order (the input a failure comes
    /// through). A read's fence only orders: a failed read does not poison
    /// what it read.
    pub(super) fn wait_on_device(
        &self,
        device: &StreamDevice,
        lane: u8,
    ) -> Result<Vec<(Arc<Fence>, VarId)>, String> {
        let mut parents: Vec<(Arc<Fence>, VarId)> = Vec::new();
        let mut failed = None;
        for e in self.edges() {
            e.var.fences().for_each_pending(e.is_write(), |f, write| {
                if f.device_index() != self.device_index() {
                    return;
                }
                // Same lane: the stream's order is enough. (A done fence here
                // is a write that failed since `blocked_by` looked: it is a
                // parent all the same.)
                if f.lane() != lane
                    && !f.is_done()
                    && let Err(m) = device.backend.wait(lane, f.event())
                {
                    failed.get_or_insert(m);
                }
                if write && !parents.iter().any(|(p, _)| Arc::ptr_eq(p, f)) {
                    parents.push((f.clone(), e.var.id()));
                }
            });
        }
        match failed {
            Some(m) => Err(m),
            None => Ok(parents),
        }
    }

    /// Publishes the op's fence in its variables: a write's replaces what
    /// the variable waited for, a read's joins the reads. The variables'
    /// values are the device's from now on (see `var`: where a value is
    /// dropped).
    pub(super) fn publish(&self, fence: &Arc<Fence>) {
        let device = fence.event().poller();
        for e in self.edges() {
            e.var.touched_by(device, e.is_write());
            if e.is_write() {
                e.var.fences().set_write(fence.clone());
            } else {
                e.var.fences().add_read(fence.clone());
            }
        }
    }

    /// The enqueue half's end: keeps aside the units to give back later
    /// (handing lasting ones on, revocably, unless the body failed), and
    /// gives the variables back. A failed body poisons through the fence,
    /// once the fences before it are known (an input's failure comes first).
    fn release_enqueued<H: Host>(&self, body_failed: bool, host: &H) {
        host.on_enqueued(self);
        if let Some(units) = self.units() {
            if body_failed {
                units.mark_failed();
            }
            if units.is_held() {
                // SAFETY: the op still holds its grants (released below).
                units.defer(unsafe { hand_on_revocably(self, units) });
            }
        }
        release_edges(self, host);
    }

    /// The complete half: takes back the units handed on if the device work
    /// `failed`, gives the rest back, and retires the op.
    fn complete_on_device<H: Host>(&self, failed: bool, host: &H) {
        host.on_ended(self);
        if let Some(units) = self.units() {
            let deferred = units.take_deferred();
            if failed {
                deferred.revocable.iter().for_each(Revocable::revoke);
            }
            host.give_back_units(&deferred.returns, Units::Op(self));
        }
        retire(self, host);
    }
}

/// As `lifecycle::hand_on`, for an op whose device work may still fail:
/// the outputs hold their units revocably, and the op keeps what it needs
/// to take them back.
///
/// # Safety
///
/// `units` are `op`'s, and `op` still holds its write grants.
unsafe fn hand_on_revocably(op: &OpBlock, units: &OpUnits) -> Deferred {
    let mut deferred = Deferred {
        returns: units.returns(),
        revocable: Few::default(),
    };
    if units.is_failed() {
        return deferred;
    }
    for l in &units.lasting {
        let resource = units.resource(l.demand);
        let var = &op.edges()[l.edge].var;
        deferred.returns[l.demand].1 -= l.amount;
        let held = Revocable::new(resource.clone(), var.id(), l.amount);
        // SAFETY: the op holds the write grant on `var` (allocations go to
        // mutated variables only; checked at push).
        if let Some(old) = unsafe { var.hold_revocable_units(&held) } {
            deferred.returns.push((resource.pool(), old));
        }
        deferred.revocable.push(held);
    }
    deferred
}

/// The future of an op on a stream device.
pub(crate) struct StreamOpFuture<B: Body, H: Host> {
    op: *const OpBlock,
    stage: Stage<B::Output>,
    body: B,
    _host: PhantomData<fn(&H)>,
}

enum Stage<T> {
    Start,
    /// The work is enqueued; the body's value, unless it failed (then the
    /// fence fails).
    Enqueued(Arc<Fence>, Option<T>),
    Finished,
}

// SAFETY: as for `OpFuture`: the only non-`Send` field is the pointer to the
// task's own (`Sync`) metadata.
unsafe impl<B: Body, H: Host> Send for StreamOpFuture<B, H> {}

impl<B: Body, H: Host> StreamOpFuture<B, H> {
    pub(super) fn new(op: &OpBlock, body: B) -> Self {
        Self {
            op,
            stage: Stage::Start,
            body,
            _host: PhantomData,
        }
    }
}

impl<B: Body, H: Host> Future for StreamOpFuture<B, H> {
    type Output = Result<Output<B::Output>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `body` is structurally pinned (never moved out); the other
        // fields are plain data.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: this future lives in the task allocation whose header holds
        // the block, and is dropped before it; `spawn::<_, H>` made it, and
        // the op is pending while it runs.
        let (op, host) = unsafe { (&*this.op, host::<H>(&*this.op)) };
        if let Stage::Start = this.stage {
            if op.await_fences(cx, Some(op.device_index())).is_pending() {
                return Poll::Pending;
            }
            // Its inputs allow it: it runs unless a cancel came first, which
            // one read-modify-write decides (`start`); a cancelled op is
            // skipped as a blocked one is (`blocked_by` finds the cancel
            // from now on).
            if op.blocked_by(true).is_some() || op.start() == Start::Cancelled {
                // It will not run; but which input's failure comes first in
                // program order may hang on device work still running on an
                // earlier edge: wait for all of it before naming the cause.
                if op.await_fences(cx, None).is_pending() {
                    return Poll::Pending;
                }
                let why = op
                    .blocked_by(true)
                    .expect("a poisoned input stays poisoned, a cancelled op cancelled");
                this.stage = Stage::Finished;
                // SAFETY: `body` is pinned with `this`.
                discard_skipped(
                    op,
                    unsafe { Pin::new_unchecked(&mut this.body) },
                    host,
                    &why,
                );
                return Poll::Ready(Err(skip(op, why, host)));
            }
            host.on_started(op);
            // SAFETY: `body` is pinned with `this`.
            let body = unsafe { Pin::new_unchecked(&mut this.body) };
            match enqueue(op, body, host, cx) {
                Ok(stage) => this.stage = stage,
                Err(e) => {
                    this.stage = Stage::Finished;
                    return Poll::Ready(Err(e));
                }
            }
        }
        let Stage::Enqueued(fence, _) = &this.stage else {
            panic!("op polled after it finished");
        };
        // The poller holds this task's waker (`Entry::owner`): it wakes it,
        // and runs it, once it completed the fence. Not registered on the
        // fence itself, whose waiters are the consumers the poller hurries
        // for.
        if !fence.is_done() {
            return Poll::Pending;
        }
        let Poll::Ready(done) = fence.poll_done(cx) else {
            unreachable!("a done fence is ready")
        };
        let Stage::Enqueued(_, value) = std::mem::replace(&mut this.stage, Stage::Finished) else {
            unreachable!()
        };
        let result = match done {
            Ok(()) => Ok(Output::new(
                value.expect("a fence without failure has a value"),
                op,
                host.id(),
            )),
            Err(FenceFailure::Inherited { input, cause }) => Err(Error::Poisoned { input, cause }),
            Err(FenceFailure::Own(failure)) => {
                host.record_failure(failure.clone());
                Err(Error::Failed(failure))
            }
        };
        op.complete_on_device(result.is_err(), host);
        Poll::Ready(result)
    }
}

/// The enqueue half (see the module docs). Never pending: stream ops have
/// synchronous bodies (checked at push). An error means the op finished
/// without enqueuing anything.
fn enqueue<B: Body, H: Host>(
    op: &OpBlock,
    mut body: Pin<&mut B>,
    host: &H,
    cx: &mut Context<'_>,
) -> Result<Stage<B::Output>, Error> {
    let device = host
        .stream_device(op.device_index())
        .expect("a stream op on a stream device");
    let lane = op.lane().expect("a stream op has a lane");
    let prepared = device.backend.new_event().and_then(|event| {
        let parents = op.wait_on_device(device, lane)?;
        Ok((
            Arc::new(Fence::new(op.device_index(), lane, event)),
            parents,
        ))
    });
    let Ok((fence, parents)) = prepared else {
        // Nothing of this op's was enqueued: it fails like a host op.
        let Err(m) = prepared else { unreachable!() };
        discard_body(op, body, host);
        let failure = op.failure(FailureKind::Device(m));
        finish(op, Outcome::Failed(failure.clone()), host);
        return Err(Error::Failed(failure));
    };
    let stream = Stream::new(device.backend.clone(), lane, fence.clone());
    let env = Env {
        stream: Some(&stream),
        engine: host.id(),
        lease_dropped: lease_dropped::<H>,
    };
    #[cfg(debug_assertions)]
    let started = std::time::Instant::now();
    let outcome = match run_body(op, body.as_mut(), &env, cx) {
        Poll::Ready(Ok(value)) => Ok(value),
        Poll::Ready(Err(kind)) => Err(op.failure(kind)),
        Poll::Pending => unreachable!("a stream op's body is synchronous"),
    };
    // What the body holds goes now, before the op can complete, as a host
    // op's does: whoever awaits the op finds it dropped (a captured
    // graph's launch holds the graph). A closure its call consumed holds
    // nothing: no need to enter the op and catch panics for it.
    if !body.is_spent() {
        discard_body(op, body, host);
    }
    #[cfg(debug_assertions)]
    warn_if_long(op, started.elapsed());
    let deferred = stream.take_deferred();
    drop(stream);
    let (value, body_failure) = match outcome {
        Ok(value) => (Some(value), None),
        Err(failure) => (None, Some(failure)),
    };
    match device.backend.record(lane, fence.event()) {
        Ok(()) => {
            op.publish(&fence);
            op.release_enqueued(body_failure.is_some(), host);
            device.poller.watch(Entry {
                fence: fence.clone(),
                parents,
                body_failure,
                name: op.failure_name(),
                owner: Some(cx.waker().clone()),
                deferred,
            });
        }
        Err(m) => {
            // The event will never complete, so the op fails now: the
            // backend waited for the lane's work before reporting the error
            // (or found the device dead, which runs nothing more), so nothing
            // that depends on the fence proceeds while the work runs.
            fence.complete(Err(FenceFailure::Own(
                body_failure.unwrap_or_else(|| op.failure(FailureKind::Device(m))),
            )));
            // The lane's work is over: what the body handed to `drop_after`
            // may go (here, on the launcher, which keeps the context current).
            let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(deferred)));
            if let Err(payload) = dropped {
                host.record_failure(dropping_failed(op, "a value handed to drop_after", payload));
            }
            op.publish(&fence);
            op.release_enqueued(true, host);
        }
    }
    Ok(Stage::Enqueued(fence, value))
}

/// A body on a stream device longer than this holds up every lane's
/// enqueues (they all go through the device's one launcher thread).
#[cfg(debug_assertions)]
const LONG_BODY: std::time::Duration = std::time::Duration::from_millis(20);

/// Debug builds: says (once per process) that a stream op's body ran long,
/// which usually means it blocked: a copy from or to pageable memory, a
/// synchronise, a lock.
#[cfg(debug_assertions)]
fn warn_if_long(op: &OpBlock, took: std::time::Duration) {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if took >= LONG_BODY && !WARNED.swap(true, Relaxed) {
        let name = op.failure_name();
        eprintln!(
            "depflow warning (debug builds, once): the body of {} on a stream device took \
             {took:?} on the device's launcher thread, delaying every lane's enqueues; a body \
             there should only enqueue (a copy from pageable memory or a synchronise blocks)",
            name.map_or_else(|| "an unnamed op".to_string(), |n| format!("op `{n}`"))
        );
    }
}

impl<B: Body, H: Host> Drop for StreamOpFuture<B, H> {
    fn drop(&mut self) {
        if let Stage::Finished = self.stage {
            return;
        }
        // SAFETY: as in `poll`: the op has not retired.
        let (op, host) = unsafe { (&*self.op, host::<H>(&*self.op)) };
        match self.stage {
            Stage::Finished => {}
            Stage::Start => {
                // SAFETY: the future is pinned (in its task) and being
                // dropped: the body is dropped in place.
                discard_body(op, unsafe { Pin::new_unchecked(&mut self.body) }, host);
                abandon(op, host);
            }
            // Dropped while its work runs: count it out now rather than never
            // (how the work ends is not known: its outputs keep their units;
            // the body's value first, as `discard_body` drops a body).
            Stage::Enqueued(..) => {
                let stage = std::mem::replace(&mut self.stage, Stage::Finished);
                let dropped =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(stage)));
                if let Err(payload) = dropped {
                    host.record_failure(dropping_failed(op, "its output", payload));
                }
                op.complete_on_device(false, host);
            }
        }
    }
}
