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
            e.var.fences().for_each_pending(e.edge.is_write(), |f| {
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
    /// variables, and returns those not done yet (the new fence's parents).
    fn wait_on_device(
        &self,
        exec: &StreamExec,
        lane: u8,
    ) -> Result<Vec<Arc<Fence<Event>>>, String> {
        let mut parents: Vec<Arc<Fence<Event>>> = Vec::new();
        let mut failed = None;
        for e in self.edges() {
            e.var.fences().for_each_pending(e.edge.is_write(), |f| {
                if f.device() != exec.index
                    || f.is_done()
                    || parents.iter().any(|p| Arc::ptr_eq(p, f))
                {
                    return;
                }
                // Same lane: the stream's order is enough.
                if f.lane() != lane
                    && let Err(m) = exec.device.wait(lane, f.event())
                {
                    failed.get_or_insert(m);
                }
                parents.push(f.clone());
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

    /// The enqueue half's end: poisons the outputs on failure, keeps aside
    /// the units to give back later, and gives the variables back.
    fn release_enqueued(&self, failure: Option<&Arc<OpFailure>>) {
        if let Some(f) = failure {
            if let Some(r) = self.resources() {
                r.mark_failed();
            }
            self.poison_outputs(f);
            self.shared().record_failure(f.clone());
        }
        if let Some(r) = self.resources()
            && r.is_held()
        {
            *r.deferred.lock().unwrap_or_else(|e| e.into_inner()) = self.hand_on_units(r);
        }
        self.release_edges();
    }

    /// The complete half: gives the units back and counts the op out.
    fn complete_on_device(&self) {
        if let Some(r) = self.resources() {
            let returns =
                std::mem::take(&mut *r.deferred.lock().unwrap_or_else(|e| e.into_inner()));
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
    /// The work is enqueued; the op's outcome so far.
    Enqueued(Arc<Fence<Event>>, Result<T, Arc<OpFailure>>),
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
            if let Some(skip) = op.blocked_by() {
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
        let Stage::Enqueued(_, outcome) = std::mem::replace(&mut this.stage, Stage::Finished)
        else {
            unreachable!()
        };
        let result = match (outcome, done) {
            (Err(failure), _) => Err(Error::Failed(failure)),
            (Ok(_), Err(cause)) if inherited => Err(Error::Poisoned(cause)),
            (Ok(_), Err(failure)) => {
                op.shared().record_failure(failure.clone());
                Err(Error::Failed(failure))
            }
            (Ok(value), Ok(())) => Ok(value),
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
    match exec.device.record(lane, fence.event()) {
        Ok(()) => {
            op.publish(&fence);
            op.release_enqueued(outcome.as_ref().err());
            exec.poller.watch(Entry {
                fence: fence.clone(),
                parents,
                name: op.failure_name(),
            });
            Ok(Stage::Enqueued(fence, outcome))
        }
        Err(m) => {
            // The event will never complete, so the op fails now: when its
            // work ends cannot be known (a device that refuses to record an
            // event is broken anyway).
            let failure = outcome.err().unwrap_or_else(|| fail(m));
            fence.complete(Err(failure.clone()));
            op.publish(&fence);
            op.release_enqueued(Some(&failure));
            Ok(Stage::Enqueued(fence, Err(failure)))
        }
    }
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
