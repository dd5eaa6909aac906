//! Recorded ops on stream devices, and recorded host ops on an engine
//! with stream devices: how one replay runs them (the driver, in
//! `crate::graph::run`, decides when).
//!
//! A recorded stream op runs as a pushed one does (`stream_op`), in two
//! halves, both through its resident task:
//!
//! 1. [`enqueue_recorded`], on the device's launcher (its resident task was
//!    dispatched there): waits (through the task's waker) for other
//!    devices' fences on its variables, puts stream waits on its lane for
//!    other lanes' fences, runs the body with the lane's stream in its
//!    `OpCtx`, records its fence after it, publishes the fence in its
//!    variables and hands the fence to the device's poller, whose
//!    completion wakes the resident task again. The fence waits in the
//!    op's [`StreamSlot`] meanwhile.
//! 2. [`complete_recorded`], on the poller's thread once the fence is done:
//!    how the op ended (its own failure, or an input's device failure
//!    inherited through the fence).
//!
//! A device failure poisons through the fence, as for pushed ops: later
//! ops (recorded or pushed) see it in the variables' fences. A recorded
//! host op on such an engine settles the fences of what it mutates and
//! checks those of what it reads first ([`run_settled`]), as a pushed host
//! op does.
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `StreamSlot::fence` | the enqueue half (before the poller can see the fence) | the completion (after the poller woke the task), which empties it |

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::task::{Context, Waker};

use super::block::OpBlock;
use super::ctx::{Env, OpCtx};
use super::future::CurrentOp;
use super::host::Host;
use super::lifecycle::{dropping_failed, lease_dropped};
use super::poison::Skip;
use super::resident::{Ran, RecordedBody, Resident, run_recorded};
use crate::device::poller::Entry;
use crate::device::{Fence, FenceFailure, Stream};
use crate::error::{FailureKind, panic_message};
use crate::loom::sync::Mutex;

/// A recorded stream op's work in flight in this replay: its fence, from
/// its enqueue to its completion.
#[derive(Default)]
pub(crate) struct StreamSlot {
    fence: Mutex<Option<Arc<Fence>>>,
}

impl StreamSlot {
    /// Whether the op's work is enqueued and not yet completed.
    pub(crate) fn is_enqueued(&self) -> bool {
        self.fence.lock().is_some()
    }
}

/// How the enqueue half went.
#[must_use]
pub(crate) enum Enqueue {
    /// It waits for another device's work: its task is woken again.
    Waiting,
    /// Its work is enqueued; the poller wakes its task once it is done.
    Enqueued,
    /// It ended without device work in flight: skipped, or failed before
    /// its fence could be recorded.
    Ended(Ran),
}

/// The enqueue half of recorded op `op` on its stream device (see the
/// module docs); `waker` is its resident task's. The caller guarantees
/// what `run_recorded`'s does.
pub(crate) fn enqueue_recorded<H: Host>(
    op: &OpBlock,
    body: &RecordedBody,
    host: &H,
    slot: &StreamSlot,
    waker: &Waker,
) -> Enqueue {
    let mut cx = Context::from_waker(waker);
    if op
        .await_fences(&mut cx, Some(op.device_index()))
        .is_pending()
    {
        return Enqueue::Waiting;
    }
    if op.blocked_by(true).is_some() {
        // Which input's failure comes first may hang on device work still
        // running on an earlier edge (as for a pushed op).
        if op.await_fences(&mut cx, None).is_pending() {
            return Enqueue::Waiting;
        }
        let why = op
            .blocked_by(true)
            .expect("a poisoned input stays poisoned");
        let ran = skipped(op, why, host);
        bump_versions(op);
        return Enqueue::Ended(ran);
    }
    let device = host
        .stream_device(op.device_index())
        .expect("a recorded stream op on a stream device");
    let lane = op.lane().expect("a recorded stream op has a lane");
    let prepared = device.backend.new_event().and_then(|event| {
        let parents = op.wait_on_device(device, lane)?;
        Ok((
            Arc::new(Fence::new(op.device_index(), lane, event)),
            parents,
        ))
    });
    let (fence, parents) = match prepared {
        Ok(p) => p,
        Err(m) => {
            let ran = failed(op, FailureKind::Device(m), host);
            bump_versions(op);
            return Enqueue::Ended(ran);
        }
    };
    let stream = Stream::new(device.backend.clone(), lane, fence.clone());
    let env = Env {
        stream: Some(&stream),
        engine: host.id(),
        lease_dropped: lease_dropped::<H>,
    };
    let result = {
        let _current = CurrentOp::enter(op);
        catch_unwind(AssertUnwindSafe(|| body(&OpCtx::borrowed(op, &env))))
    };
    let body_failure = match result {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(op.failure(FailureKind::Error(e))),
        Err(payload) => Some(op.failure(FailureKind::Panic(panic_message(payload.as_ref())))),
    };
    let deferred = stream.take_deferred();
    drop(stream);
    bump_versions(op);
    match device.backend.record(lane, fence.event()) {
        Ok(()) => {
            op.publish(&fence);
            *slot.fence.lock() = Some(fence.clone());
            device.poller.watch(Entry {
                fence,
                parents,
                body_failure,
                name: op.failure_name(),
                owner: Some(waker.clone()),
                deferred,
            });
            Enqueue::Enqueued
        }
        Err(m) => {
            // The event will never complete: the op fails now (the backend
            // waited for the lane's work before reporting the error).
            let failure = body_failure.unwrap_or_else(|| op.failure(FailureKind::Device(m)));
            fence.complete(Err(FenceFailure::Own(failure.clone())));
            let dropped = catch_unwind(AssertUnwindSafe(|| drop(deferred)));
            if let Err(payload) = dropped {
                host.record_failure(dropping_failed(op, "a value handed to drop_after", payload));
            }
            op.publish(&fence);
            host.record_failure(failure.clone());
            Enqueue::Ended(Ran::Failed(failure))
        }
    }
}

/// The completion half of a recorded op, woken by the poller: how it
/// ended, once the fence in its `slot` is done (None if it is not: a wake
/// for nothing).
pub(crate) fn complete_recorded<H: Host>(slot: &StreamSlot, host: &H) -> Option<Ran> {
    let fence = {
        let mut fence = slot.fence.lock();
        if !fence.as_ref().is_some_and(|f| f.is_done()) {
            return None;
        }
        fence.take().expect("checked")
    };
    Some(match fence.failure() {
        None => Ran::Succeeded,
        Some(FenceFailure::Inherited { input, cause }) => Ran::skipped(input, cause),
        Some(FenceFailure::Own(failure)) => {
            host.record_failure(failure.clone());
            Ran::Failed(failure)
        }
    })
}

/// Runs recorded host op `op` on an engine with stream devices: a failed
/// device write on what it mutates becomes that variable's poison (the
/// fences are done: the op's predecessors in the replay ended, device work
/// included, and the replay's op waited for the rest), and one on what it
/// reads skips it; then as `run_recorded`.
#[inline(never)]
pub(crate) fn run_settled<H: Host>(resident: &Resident, body: &RecordedBody, host: &H) -> Ran {
    let op = resident.block();
    op.settle_fences();
    if let Some(why @ Skip::Poisoned { .. }) = op.blocked_by(true) {
        let ran = skipped(op, why, host);
        bump_versions(op);
        return ran;
    }
    run_recorded(resident, body, host)
}

/// Runs recorded op `op`'s body once while its graph is captured (see
/// `crate::graph::capture`): with `env`, whose stream is the capturing one,
/// panics caught. Nothing else of the op's lifecycle runs: the graph's
/// launch op holds the grants and ends for all of its ops. `Err` is the
/// body's error or panic, as a message.
pub(crate) fn run_captured(op: &OpBlock, body: &RecordedBody, env: &Env<'_>) -> Result<(), String> {
    let result = {
        let _current = CurrentOp::enter(op);
        catch_unwind(AssertUnwindSafe(|| body(&OpCtx::borrowed(op, env))))
    };
    match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(payload) => Err(format!("panicked: {}", panic_message(payload.as_ref()))),
    }
}

/// Forgets the fences a replay left on the intermediates of graph `graph`
/// that recorded op `op` mutates (a failed one would poison the next
/// replay). Called as `clear_graph_poison` is: while no op of the graph
/// runs, its previous replay's device work all done.
pub(crate) fn clear_graph_fences(op: &OpBlock, graph: u64) {
    for e in op
        .edges()
        .iter()
        .filter(|e| e.is_write() && e.var.graph() == graph)
    {
        drop(e.var.fences().settle());
    }
}

/// The op does not run for `why`: poisoned outputs, or a deleted input's
/// failure.
fn skipped<H: Host>(op: &OpBlock, why: Skip, host: &H) -> Ran {
    match why {
        Skip::Poisoned { input, cause } => {
            op.fail(&cause);
            Ran::skipped(input, cause)
        }
        Skip::Deleted(var) => failed(op, FailureKind::InputDeleted(var), host),
        Skip::Cancelled => unreachable!("a recorded op is never cancelled"),
    }
}

/// The op failed with `kind` before enqueuing anything: its outputs are
/// poisoned, the host records it.
fn failed<H: Host>(op: &OpBlock, kind: FailureKind, host: &H) -> Ran {
    let failure = op.failure(kind);
    op.fail(&failure);
    host.record_failure(failure.clone());
    Ran::Failed(failure)
}

/// Counts a mutation of every variable `op` mutates (as its end would).
fn bump_versions(op: &OpBlock) {
    for e in op.edges().iter().filter(|e| e.is_write()) {
        e.var.bump_version();
    }
}
