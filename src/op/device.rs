//! Ops and device work: how an op waits for the device work on its
//! variables, and the future of an op on a stream device.
//!
//! An op on a stream device runs in two halves (see [`crate::stream`]):
//!
//! 1. *Enqueue*, on the launcher thread, once its variables are granted:
//!    wait on the host for fences of other devices; put stream waits for
//!    this device's fences on its lane; run the body (which enqueues); record
//!    the op's fence after it; publish the fence in the variables; give the
//!    variables back. The op's resource units stay taken.
//! 2. *Complete*, when the poller completed the fence: give the units back,
//!    resolve the handle, count the op out.
//!
//! A host op on an engine with stream devices waits (parked) for the
//! fences on its variables before it runs, and an op holding a write grant
//! turns a failed device write into the variable's poison.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::OpBlock;
use super::future::{Body, run_body, skipped};
use crate::error::{Error, FailureKind, OpFailure};
use crate::stream::fence::Fence;
use crate::stream::poller::Entry;
use crate::stream::{Event, Stream, StreamExec};
use crate::var::VarState;

impl OpBlock {
    /// Ready once every fence this op must wait for on the host is done:
    /// all of them for a host op (`device` None), those of other devices
    /// for an op on stream device `device`.
    pub(super) fn await_fences(&self, cx: &mut Context<'_>, device: Option<u16>) -> Poll<()> {
        let mut waiting = false;
        for e in self.edges() {
            e.var.fences().for_each_pending(e.edge.is_write(), |f, _| {
                if Some(f.device()) != device && f.poll_done(cx).is_pending() {
                    waiting = true;
                }
            });
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// A host op holding write grants, its fences done: a failed device
    /// write becomes the variable's poison, and the fences are forgotten.
    pub(super) fn settle_fences(&self) {
        for e in self.edges().iter().filter(|e| e.edge.is_write()) {
            if let Some(cause) = e.var.fences().settle() {
                // SAFETY: the op holds the write grant on this variable.
                unsafe {
                    if matches!(e.var.state(), VarState::Live) {
                        e.var.set_state(VarState::Poisoned(cause));
                    }
                }
            }
        }
    }

    /// Puts stream waits on `lane` for this device's fences on the op's
    /// variables, and returns the writes' among them not done yet (the new
    /// fence's parents: their failure is the op's). A read's fence only
    /// orders: a failed read does not poison what it read.
    fn wait_on_device(
        &self,
        exec: &StreamExec,
        lane: u8,
    ) -> Result<Vec<Arc<Fence<Event>>>, String> {
        let mut parents: Vec<Arc<Fence<Event>>> = Vec::new();
        let mut failed = None;
        for e in self.edges() {
            e.var
                .fences()
                .for_each_pending(e.edge.is_write(), |f, write| {
                    if f.device() != exec.index {
                        return;
                    }
                    // Same lane: the stream's order is enough. (A done fence
                    // here is a write that failed since `blocked_by` looked:
                    // it is a parent all the same.)
                    if f.lane() != lane
                        && !f.is_done()
                        && let Err(m) = exec.device.wait(lane, f.event())
                    {
                        failed.get_or_insert(m);
                    }
                    if write && !parents.iter().any(|p| Arc::ptr_eq(p, f)) {
                        parents.push(f.clone());
                    }
                });
        }
        match failed {
            Some(m) => Err(m),
            None => Ok(parents),
        }
    }

    /// Publishes the op's fence in its variables: a write's replaces what
    /// the variable waited for, a read's joins the reads.
    fn publish(&self, fence: &Arc<Fence<Event>>) {
        for e in self.edges() {
            if e.edge.is_write() {
                e.var.fences().set_write(fence.clone());
            } else {
                e.var.fences().add_read(fence.clone());
            }
        }
    }

    /// The enqueue half's end: keeps aside the units to give back later
    /// (handing lasting ones on unless the body failed), and gives the
    /// variables back. A failed body poisons through the fence, once the
    /// fences before it are known (an input's failure comes first).
    fn release_enqueued(&self, body_failed: bool) {
        if let Some(r) = self.resources() {
            if body_failed {
                r.mark_failed();
            }
            if r.is_held() {
                *r.deferred.lock() = self.hand_on_units(r);
            }
        }
        self.release_edges();
    }

    /// The complete half: gives the units back and counts the op out.
    fn complete_on_device(&self) {
        if let Some(r) = self.resources() {
            let returns = std::mem::take(&mut *r.deferred.lock());
            crate::resource::dispatch(self.shared().broker.release(returns.iter().copied()));
        }
        self.retire();
    }
}

/// The future of an op on a stream device.
pub(crate) struct StreamOpFuture<B: Body> {
    op: *const OpBlock,
    stage: Stage<B::Output>,
    body: B,
}

enum Stage<T> {
    Start,
    /// The work is enqueued; the body's value, unless it failed (then the
    /// fence fails).
    Enqueued(Arc<Fence<Event>>, Option<T>),
    Finished,
}

// SAFETY: as for `OpFuture`: the only non-`Send` field is the pointer to the
// task's own (`Sync`) metadata.
unsafe impl<B: Body> Send for StreamOpFuture<B> {}

impl<B: Body> StreamOpFuture<B> {
    pub(crate) fn new(op: &OpBlock, body: B) -> Self {
        Self {
            op,
            stage: Stage::Start,
            body,
        }
    }
}

impl<B: Body> Future for StreamOpFuture<B> {
    type Output = Result<B::Output, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `body` is structurally pinned (never moved out); the other
        // fields are plain data.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: this future lives in the task allocation whose header holds
        // the block, and is dropped before it.
        let op = unsafe { &*this.op };
        if let Stage::Start = this.stage {
            if op.await_fences(cx, Some(op.device())).is_pending() {
                return Poll::Pending;
            }
            if op.blocked_by().is_some() {
                // It will not run; but which input's failure comes first in
                // program order may hang on device work still running on an
                // earlier edge: wait for all of it before naming the cause.
                if op.await_fences(cx, None).is_pending() {
                    return Poll::Pending;
                }
                let skip = op.blocked_by().expect("a poisoned input stays poisoned");
                this.stage = Stage::Finished;
                return Poll::Ready(Err(skipped(op, skip)));
            }
            // SAFETY: `body` is pinned with `this`.
            let body = unsafe { Pin::new_unchecked(&mut this.body) };
            match enqueue(op, body, cx) {
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
        let done = match fence.poll_done(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(done) => done,
        };
        let inherited = fence.inherited();
        let Stage::Enqueued(_, value) = std::mem::replace(&mut this.stage, Stage::Finished) else {
            unreachable!()
        };
        let result = match done {
            Ok(()) => Ok(value.expect("a fence without failure has a value")),
            Err(cause) if inherited => Err(Error::Poisoned(cause)),
            Err(failure) => {
                op.shared().record_failure(failure.clone());
                Err(Error::Failed(failure))
            }
        };
        op.complete_on_device();
        Poll::Ready(result)
    }
}

/// The enqueue half (see the module docs). Never pending: stream ops have
/// synchronous bodies (checked at push). An error means the op finished
/// without enqueuing anything.
fn enqueue<B: Body>(
    op: &OpBlock,
    body: Pin<&mut B>,
    cx: &mut Context<'_>,
) -> Result<Stage<B::Output>, Error> {
    let exec = op
        .shared()
        .streams(op.device())
        .expect("a stream op on a stream device");
    let lane = op.lane().expect("a stream op has a lane");
    let fail = |message: String| {
        Arc::new(OpFailure::new(
            op.failure_name(),
            FailureKind::Device(message),
        ))
    };
    let prepared = exec.device.new_event().and_then(|event| {
        let parents = op.wait_on_device(exec, lane)?;
        Ok((Arc::new(Fence::new(exec.index, lane, event)), parents))
    });
    let (fence, parents) = prepared.map_err(|m| {
        // Nothing of this op's was enqueued: it fails like a host op.
        let failure = fail(m);
        op.finish(Some(failure.clone()), true);
        Error::Failed(failure)
    })?;
    let stream = Stream {
        device: exec.device.clone(),
        lane,
        fence: fence.clone(),
    };
    let outcome = match run_body(op, body, Some(&stream), cx) {
        Poll::Ready(Ok(value)) => Ok(value),
        Poll::Ready(Err(kind)) => Err(Arc::new(OpFailure::new(op.failure_name(), kind))),
        Poll::Pending => unreachable!("a stream op's body is synchronous"),
    };
    drop(stream);
    let (value, body_failure) = match outcome {
        Ok(value) => (Some(value), None),
        Err(failure) => (None, Some(failure)),
    };
    match exec.device.record(lane, fence.event()) {
        Ok(()) => {
            op.publish(&fence);
            op.release_enqueued(body_failure.is_some());
            exec.poller.watch(Entry {
                fence: fence.clone(),
                parents,
                body_failure,
                name: op.failure_name(),
            });
        }
        Err(m) => {
            // The event will never complete, so the op fails now: when its
            // work ends cannot be known (a device that refuses to record an
            // event is broken anyway).
            fence.complete(Err(body_failure.unwrap_or_else(|| fail(m))));
            op.publish(&fence);
            op.release_enqueued(true);
        }
    }
    Ok(Stage::Enqueued(fence, value))
}

impl<B: Body> Drop for StreamOpFuture<B> {
    fn drop(&mut self) {
        // SAFETY: as in `poll`.
        let op = unsafe { &*self.op };
        match self.stage {
            Stage::Finished => {}
            Stage::Start => {
                // Dropped before it ran: release its grants (see `OpFuture`).
                let failure = Arc::new(OpFailure::new(op.failure_name(), FailureKind::Dropped));
                op.finish(Some(failure), true);
            }
            // Dropped while its work runs: count it out now rather than never.
            Stage::Enqueued(..) => op.complete_on_device(),
        }
    }
}

impl OpBlock {
    /// Poisons the variables the op mutates (it holds their write grants).
    pub(super) fn poison_outputs(&self, failure: &Arc<OpFailure>) {
        for e in self.edges().iter().filter(|e| e.edge.is_write()) {
            // SAFETY: the op holds the write grant on this variable.
            unsafe {
                if !matches!(e.var.state(), VarState::Deleted) {
                    e.var.set_state(VarState::Poisoned(failure.clone()));
                }
            }
        }
    }
}
