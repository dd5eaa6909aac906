//! An op's life after its push (`spawn`), step by step: granted by its
//! variables (`Grant`), made ready (`ready`: units, then dispatch), finished
//! (`finish`: poison on failure, then release its grants) or skipped
//! (`skip`), and retired (`retire`: counted out of its host). Every step is
//! generic over the op's [`Host`], so the engine's calls are static.
//!
//! An op keeps its host erased (`OpBlock::host`); [`host`] gets it back in
//! the code monomorphised for it: the op's future, its task's schedule
//! function, and the lease it hands its context. A grant passes on the
//! granting op's host instead: every op in a chain belongs to the engine
//! that made the variable (`decl` checks it), so that is the granted op's
//! host too.

// `unsafe`: the erased host, completing edges, handing units on and counting an op's
// references out; each block says why it is sound.
#![allow(unsafe_code)]

use std::sync::Arc;

use super::block::{LEASE_MASK, OpBlock, Runner};
use super::host::{Host, Units};
use super::poison::Skip;
use super::units::{OpUnits, Returns};
use crate::core::chain::{Grant, Owner};
use crate::core::tickets::{Demand, Park, Request, Unpark};
use crate::error::{Error, FailureKind, OpFailure};
use crate::loom::sync::atomic::Ordering::{AcqRel, Relaxed};

/// The host `op` was spawned with.
///
/// # Safety
///
/// `op` was spawned by `spawn` with host type `H`, and is pending (its
/// host outlives it until it retires).
#[inline]
pub(super) unsafe fn host<H: Host>(op: &OpBlock) -> &H {
    // SAFETY: `spawn::<_, H>` stored a `*const H` there; the caller
    // guarantees the type and that the host is alive.
    unsafe { &*op.host.cast::<H>() }
}

impl Owner for OpBlock {
    #[inline]
    unsafe fn release(this: *const Self) {
        // SAFETY: the caller passes a live block and does not touch it after.
        unsafe { Self::unref(this) };
    }
}

/// What a chain passes to the ops it grants: their host, and the op whose
/// completion granted them (none when granted at their push), which the
/// host's hooks learn as the op that unblocked them.
pub(super) struct Granter<'a, H> {
    pub(super) host: &'a H,
    pub(super) by: Option<&'a OpBlock>,
}

impl<'a, H> Granter<'a, H> {
    /// Grants made while pushing: nobody's completion.
    #[inline]
    pub(super) fn push(host: &'a H) -> Self {
        Self { host, by: None }
    }
}

impl<H: Host> Grant<Granter<'_, H>> for OpBlock {
    #[inline]
    fn grant(&self, cx: &Granter<'_, H>) {
        debug_assert!(
            std::ptr::eq(self.host, std::ptr::from_ref(cx.host).cast()),
            "an op granted by another engine's op"
        );
        if let Some(runner) = self.countdown.release() {
            ready(self, runner, cx.host, cx.by);
        }
    }
}

/// The op's variables all granted it, the last one freed by `by`'s
/// completion (or at its push): dispatch it, or first ask for its units
/// (the host may park it until they are free).
#[inline]
pub(super) fn ready<H: Host>(op: &OpBlock, runner: Runner, host: &H, by: Option<&OpBlock>) {
    host.on_ready(op, by);
    let Some(units) = op.units() else {
        if op.is_wait() {
            // The host's wait for a variable has an empty body: finish it
            // here rather than wait for a free worker (it may go to one
            // later only if it must await device work).
            runner.run();
            return;
        }
        return host.dispatch(runner, false);
    };
    if op.blocked_by(host.has_streams()).is_some() {
        // It will be skipped: it needs no units, and younger requests must
        // not wait for its tickets.
        units.mark_skipped();
        host.retire_tickets(units.as_request(), op);
        host.dispatch(runner, false);
    } else {
        host.request_units(runner);
    }
}

impl Request for Runner {
    fn demands(&self) -> &[Demand] {
        self.metadata().units().map_or(&[], OpUnits::as_request)
    }

    #[inline]
    fn park(&self) -> Park {
        self.metadata().park()
    }

    #[inline]
    fn unpark(&self) -> Unpark {
        self.metadata().unpark()
    }
}

/// A cancel found `op` parked in its host's broker, held there (see
/// `start`): takes it out, giving up its tickets, and dispatches it; it
/// runs, skipped as cancelled, and finishes at once, handing its variables
/// on. What giving up its tickets lets through is dispatched first.
pub(super) fn withdraw<H: Host>(op: &OpBlock) {
    // SAFETY: `spawn::<_, H>` set this function for this op. The op is
    // parked and held in its host's broker, so pending: its host is alive
    // until it retires, which it cannot before the dispatch below.
    let host = unsafe { host::<H>(op) };
    let units = op.units().expect("an op parked for units has some");
    let pools = units.demands().map(|(resource, _)| resource.pool());
    let withdrawn = host
        .broker()
        .withdraw(pools, |r| std::ptr::eq(r.metadata(), op));
    let runner = withdrawn
        .request
        .expect("a cancelled op held in the broker stays there until its cancel takes it out");
    op.unmark_parked();
    host.dispatch_granted(withdrawn.granted, Units::Op(op));
    host.dispatch(runner, false);
}

/// The schedule function of every op's task: wakes of async ops land here.
pub(super) fn schedule<H: Host>(runner: Runner, info: async_task::ScheduleInfo) {
    // SAFETY: `spawn::<_, H>` gave this function to the op's task; an op is
    // woken only while it is pending, when its host is alive. The pointer is
    // taken before `runner` moves into the dispatch.
    let host: *const H = unsafe { host::<H>(runner.metadata()) };
    // SAFETY: as above.
    unsafe { (*host).dispatch(runner, info.woken_while_running) };
}

/// How an op ended, as [`finish`] records it.
pub(super) enum Outcome {
    /// The body ran and succeeded.
    Succeeded,
    /// A failure of the op's own (its body failed or panicked, it was
    /// dropped, an input was deleted): it poisons the outputs and is
    /// reported by `wait_all`.
    Failed(Arc<OpFailure>),
    /// Skipped for an earlier failure on an input: passed on to the
    /// outputs, not reported again.
    Poisoned(Arc<OpFailure>),
    /// One of the host's own ops (a delete, an un-poisoning) cancelled
    /// before it ran: its variable is left as it was, unpoisoned.
    Unchanged,
}

/// The op finished: poisons what it mutates on failure, then releases its
/// grants, unless its leased context is still alive.
#[inline]
pub(super) fn finish<H: Host>(op: &OpBlock, outcome: Outcome, host: &H) {
    match outcome {
        Outcome::Succeeded | Outcome::Unchanged => {}
        Outcome::Failed(failure) => {
            op.fail(&failure);
            host.record_failure(failure);
        }
        Outcome::Poisoned(cause) => op.fail(&cause),
    }
    // The lease count is 0 unless the body leased its context
    // (`OpCtx::leased`).
    if op.status.load(Relaxed) & LEASE_MASK != 0 && op.status.fetch_sub(1, AcqRel) & LEASE_MASK != 1
    {
        return; // the lease releases the grants when it is dropped
    }
    release_grants(op, host);
}

/// The op's future was dropped before it finished (its executor dropped the
/// runnable, or the task): fails the op and releases its grants, so that
/// nothing waits on it forever.
pub(super) fn abandon<H: Host>(op: &OpBlock, host: &H) {
    finish(op, Outcome::Failed(op.failure(FailureKind::Dropped)), host);
}

/// A leased context was dropped: the last of it and the future releases
/// the grants.
///
/// # Safety
///
/// `op` was spawned with host type `H` and has not retired.
pub(super) unsafe fn lease_dropped<H: Host>(op: &OpBlock) {
    if op.status.fetch_sub(1, AcqRel) & LEASE_MASK == 1 {
        // SAFETY: forwarded.
        release_grants(op, unsafe { host::<H>(op) });
    }
}

/// The op ended (`on_ended`): gives its units back, completes its edges and
/// retires it.
#[inline]
fn release_grants<H: Host>(op: &OpBlock, host: &H) {
    host.on_ended(op);
    if let Some(units) = op.units()
        && units.is_held()
    {
        // SAFETY: the op still holds its grants (released just below).
        let returns = unsafe { hand_on(op, units) };
        host.give_back_units(&returns, Units::Op(op));
    }
    release_edges(op, host);
    retire(op, host);
}

/// Completes every edge: the op's variables go to the next ops.
#[inline]
pub(super) fn release_edges<H: Host>(op: &OpBlock, host: &H) {
    let cx = Granter { host, by: Some(op) };
    let counts = op.counts_versions();
    for e in op.edges() {
        // SAFETY: each edge was granted and is completed exactly once, here.
        unsafe {
            if e.is_write() {
                if counts {
                    e.var.bump_version();
                }
                e.var.chain.complete_write(&e.edge, &cx);
            } else {
                e.var.chain.complete_read(&cx);
            }
        }
    }
}

/// Hands the lasting units of `op` on to its outputs (unless it failed) and
/// returns what is to be given back: the rest of its units, and those the
/// outputs held before.
///
/// # Safety
///
/// `units` are `op`'s, and `op` still holds its write grants.
pub(super) unsafe fn hand_on(op: &OpBlock, units: &OpUnits) -> Returns {
    let mut returns = units.returns();
    if units.is_failed() {
        return returns;
    }
    for l in &units.lasting {
        let resource = units.resource(l.demand);
        let var = &op.edges()[l.edge].var;
        returns[l.demand].1 -= l.amount;
        // SAFETY: the op holds the write grant on `var` (allocations go to
        // mutated variables only; checked at push).
        if let Some(old) = unsafe { var.hold_units(resource, l.amount) } {
            returns.push((resource.pool(), old));
        }
    }
    returns
}

/// The failure of `op` whose drop of `what` panicked with `payload`.
pub(super) fn dropping_failed(
    op: &OpBlock,
    what: &str,
    payload: Box<dyn std::any::Any + Send>,
) -> Arc<OpFailure> {
    let message = crate::error::panic_message(payload.as_ref());
    op.failure(FailureKind::Panic(format!(
        "while {what} was dropped: {message}"
    )))
}

/// Finishes an op that does not run; returns its error.
pub(super) fn skip<H: Host>(op: &OpBlock, why: Skip, host: &H) -> Error {
    match why {
        Skip::Poisoned { input, cause } => {
            finish(op, Outcome::Poisoned(cause.clone()), host);
            Error::Poisoned { input, cause }
        }
        Skip::Deleted(var) => {
            let failure = op.failure(FailureKind::InputDeleted(var));
            if op.is_wait() {
                // The host's own wait lost a race with a delete: that is its
                // caller's answer, not a failure for `wait_all` to report
                // (and it has no outputs to poison).
                finish(op, Outcome::Poisoned(failure), host);
            } else {
                finish(op, Outcome::Failed(failure), host);
            }
            Error::Deleted(var)
        }
        Skip::Cancelled if op.is_maintenance() => {
            // The host's own delete or un-poisoning computes no value: its
            // variable stays as it was (a delete's stays marked deleted,
            // its value kept until its last handle goes; a poison stays
            // with its original cause). (The host's wait mutates nothing.)
            finish(op, Outcome::Unchanged, host);
            Error::Cancelled
        }
        Skip::Cancelled => {
            // The outputs were not computed: poisoned, as by a failure; but
            // the user asked for it, so `wait_all` does not report it.
            let failure = op.failure(FailureKind::Cancelled);
            finish(op, Outcome::Poisoned(failure), host);
            Error::Cancelled
        }
    }
}

/// Counts the finished op out of its host, which it never reaches again,
/// and gives up its variables (whichever thread this is: so a variable
/// dropped by its user goes, with its units, when its last op retires).
///
/// A value whose drop panics there is reported as a failure of the op by
/// `wait_all` (its outcome was decided, and passed on, before).
#[inline]
pub(super) fn retire<H: Host>(op: &OpBlock, host: &H) {
    // SAFETY: the op retires once, here; its edges are completed, and nothing
    // reads their variables from now on.
    if let Some((var, payload)) = unsafe { op.release_vars() } {
        host.record_failure(dropping_failed(op, &format!("the value of {var}"), payload));
    }
    op.mark_retired();
    host.retire(op);
    // The run's share of `refs`. Our caller (the future or the lease) still
    // holds the task, so this cannot free the block.
    // SAFETY: counted out once, here.
    unsafe { OpBlock::unref(op) };
}
