//! An op's life, step by step: spawned and linked into its variables'
//! chains (`spawn`, `launch`), granted by them (`Grant`), made ready
//! (`ready`: units, then dispatch), finished (`finish`: poison on failure,
//! then release its grants), and retired (`retire`: counted out of its
//! host). Every step is generic over the op's [`Host`], so the engine's
//! calls are static.
//!
//! An op keeps its host erased (`OpBlock::host`); [`host`] gets it back in
//! the code monomorphised for it: the op's future, its task's schedule
//! function, and the lease it hands its context. A grant passes on the
//! granting op's host instead: every op in a chain belongs to the engine
//! that made the variable (`decl` checks it), so that is the granted op's
//! host too.

// `unsafe`: the erased host, linking edges, and counting an op's references out; each block says why it is sound.
#![allow(unsafe_code)]

use std::sync::Arc;

use super::block::{OpBlock, OpSpec, Runner};
use super::body::Body;
use super::future::OpFuture;
use super::host::Host;
use super::reclaim;
use super::stream_op::StreamOpFuture;
use crate::core::chain::{Grant, Owner};
use crate::core::few::Few;
use crate::error::{Error, FailureKind, OpFailure};
use crate::loom::sync::atomic::Ordering::{AcqRel, Relaxed};

/// The task of a pushed op: what its handle awaits.
pub(crate) type OpTask<T> = async_task::Task<Result<T, Error>, OpBlock>;

/// The host `op` was spawned with.
///
/// # Safety
///
/// `op` was spawned by [`spawn`] with host type `H`, and is pending (its
/// host outlives it until it retires).
#[inline]
pub(super) unsafe fn host<H: Host>(op: &OpBlock) -> &H {
    // SAFETY: `spawn::<_, H>` stored a `*const H` there; the caller
    // guarantees the type and that the host is alive.
    unsafe { &*op.host.cast::<H>() }
}

/// Spawns an op made of `spec` and `body` on `host`, and links it into its
/// variables' chains: it runs as soon as its dependencies allow. Returns its
/// task, which resolves to the body's result.
#[inline]
pub(crate) fn spawn<B: Body, H: Host>(spec: OpSpec, body: B, host: &H) -> OpTask<B::Output> {
    let on_streams = spec.lane.is_some();
    let block = OpBlock::new(spec, std::ptr::from_ref(host).cast());
    let builder = async_task::Builder::new().metadata(block);
    let schedule = async_task::WithInfo(schedule::<H>);
    let (runner, task) = if on_streams {
        builder.spawn(
            move |op: &OpBlock| StreamOpFuture::<B, H>::new(op, body),
            schedule,
        )
    } else {
        builder.spawn(
            move |op: &OpBlock| OpFuture::<B, H>::new(op, body),
            schedule,
        )
    };
    // SAFETY: `runner` was just spawned for this block and never scheduled.
    unsafe { launch(runner, host) };
    task
}

/// Links a freshly spawned op into its variables' chains, and makes it
/// ready if nothing holds it back.
///
/// # Safety
///
/// `runner` comes straight from `spawn`: never scheduled, its edges never
/// linked.
#[inline]
unsafe fn launch<H: Host>(runner: Runner, host: &H) {
    let op: *const OpBlock = runner.metadata();
    // SAFETY: the block lives in the task allocation, which `runner` keeps
    // alive until it is parked in the countdown, and the anchor keeps alive
    // from then on until every edge is released. Nothing else can see the
    // block before its edges are linked, so the writes below are exclusive.
    unsafe {
        let this = &*op;
        this.anchor.set(runner.waker());
        for e in this.edges() {
            e.edge.set_owner(op);
        }
        this.countdown.park(runner);
        host.on_pushed(this);
        let edges = this.edges();
        if edges.len() == 1 && this.units().is_none() {
            edges[0].var.chain.append(&edges[0].edge, host);
        } else {
            link_all(this, host);
        }
        // Release the pusher's guard; if every edge was granted meanwhile,
        // the op is ready now.
        if let Some(runner) = this.countdown.release() {
            ready(this, runner, host);
        }
        // This thread frees the op once it is finished.
        reclaim::adopt(this);
    }
}

/// Links every edge under the host's push lock, so that all variables'
/// chains see multi-variable ops in one global order (two pushers cannot
/// interleave into opposite orders on two variables, which would be a
/// wait-for cycle). An op with units draws its tickets in the same critical
/// section, so ticket order agrees with that order too (see
/// `core::tickets`). Granting, which may run ops inline, happens after the
/// lock is dropped.
///
/// # Safety
///
/// As for [`launch`].
unsafe fn link_all<H: Host>(op: &OpBlock, host: &H) {
    let edges = op.edges();
    // One bit per edge whose token this push took: the first 64 edges in a
    // word, the rest (rare) a word per 64 more.
    let mut first = 0u64;
    let mut rest: Few<u64> = Few::from_fn(edges.len().saturating_sub(1) / 64, |_| 0);
    {
        let _order = host.push_lock().lock();
        if let Some(units) = op.units() {
            units.draw_tickets();
        }
        for (i, e) in edges.iter().enumerate() {
            // SAFETY: forwarded from `launch`.
            if unsafe { e.var.chain.link(&e.edge) } {
                match i {
                    0..64 => first |= 1 << i,
                    _ => rest[i / 64 - 1] |= 1 << (i % 64),
                }
            }
        }
    }
    for (w, &word) in std::iter::once(&first).chain(rest.iter()).enumerate() {
        let mut bits = word;
        while bits != 0 {
            let e = &edges[w * 64 + bits.trailing_zeros() as usize];
            bits &= bits - 1;
            // SAFETY: `link` handed us the token at this edge.
            unsafe { e.var.chain.advance(&e.edge, host) };
        }
    }
}

impl Owner for OpBlock {
    #[inline]
    unsafe fn release(this: *const Self) {
        // SAFETY: the caller passes a live block and does not touch it after.
        unsafe { Self::unref(this) };
    }
}

impl<H: Host> Grant<H> for OpBlock {
    #[inline]
    fn grant(&self, host: &H) {
        debug_assert!(
            std::ptr::eq(self.host, std::ptr::from_ref(host).cast()),
            "an op granted by another engine's op"
        );
        if let Some(runner) = self.countdown.release() {
            ready(self, runner, host);
        }
    }
}

/// The op's variables all granted it: dispatch it, or first ask for its
/// units (the host may park it until they are free).
#[inline]
fn ready<H: Host>(op: &OpBlock, runner: Runner, host: &H) {
    host.on_ready(op);
    let Some(units) = op.units() else {
        return host.dispatch(runner, false);
    };
    if op.blocked_by(host.has_streams()).is_some() {
        // It will be skipped: it needs no units, and younger requests must
        // not wait for its tickets.
        units.mark_skipped();
        host.retire_tickets(units.as_request());
        host.dispatch(runner, false);
    } else {
        host.request_units(runner);
    }
}

/// Dispatches the ops whose units the host's broker granted (what the host
/// does with the requests it parked, once a release makes room).
#[inline]
pub(crate) fn dispatch_granted<H: Host>(granted: Few<Runner>, host: &H) {
    granted.for_each(|runner| {
        let op = runner.metadata();
        if let Some(units) = op.units() {
            units.mark_held();
        }
        host.on_granted(op);
        host.dispatch(runner, false);
    });
}

/// The schedule function of every op's task: wakes of async ops land here.
fn schedule<H: Host>(runner: Runner, info: async_task::ScheduleInfo) {
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
}

/// The op finished: poisons what it mutates on failure, then releases its
/// grants, unless its leased context is still alive.
#[inline]
pub(super) fn finish<H: Host>(op: &OpBlock, outcome: Outcome, host: &H) {
    match outcome {
        Outcome::Succeeded => {}
        Outcome::Failed(failure) => {
            op.fail(&failure);
            host.record_failure(failure);
        }
        Outcome::Poisoned(cause) => op.fail(&cause),
    }
    // `holders` is 0 unless the body leased its context (see `lease`).
    if op.holders.load(Relaxed) != 0 && op.holders.fetch_sub(1, AcqRel) != 1 {
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

/// Marks an async op as having leased its context: from now on the future
/// and the context each hold the grants.
#[inline]
pub(super) fn lease(op: &OpBlock) {
    op.holders.store(2, Relaxed);
}

/// A leased context was dropped: the last of it and the future releases
/// the grants.
///
/// # Safety
///
/// `op` was spawned with host type `H` and has not retired.
pub(super) unsafe fn lease_dropped<H: Host>(op: &OpBlock) {
    if op.holders.fetch_sub(1, AcqRel) == 1 {
        // SAFETY: forwarded.
        release_grants(op, unsafe { host::<H>(op) });
    }
}

/// Gives the op's units back, completes its edges and retires it.
#[inline]
fn release_grants<H: Host>(op: &OpBlock, host: &H) {
    if let Some(units) = op.units()
        && units.is_held()
    {
        // SAFETY: the op still holds its grants (released just below).
        let returns = unsafe { units.hand_on(op) };
        host.give_back_units(&returns);
    }
    release_edges(op, host);
    retire(op, host);
}

/// Completes every edge: the op's variables go to the next ops.
#[inline]
pub(super) fn release_edges<H: Host>(op: &OpBlock, host: &H) {
    for e in op.edges() {
        // SAFETY: each edge was granted and is completed exactly once, here.
        unsafe {
            if e.is_write() {
                e.var.bump_version();
                e.var.chain.complete_write(&e.edge, host);
            } else {
                e.var.chain.complete_read(host);
            }
        }
    }
}

/// Counts the finished op out of its host, which it never reaches again.
#[inline]
pub(super) fn retire<H: Host>(op: &OpBlock, host: &H) {
    host.on_finished(op);
    host.retire(op);
    // The run's share of `refs`. Our caller (the future or the lease) still
    // holds the task, so this cannot free the block.
    // SAFETY: counted out once, here.
    unsafe { OpBlock::unref(op) };
}
