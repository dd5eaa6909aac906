//! Pushing an op: spawning its task and linking it into its variables'
//! chains (`link_in`, and `link_all` for ops on several variables or with
//! units). What follows is `lifecycle`'s.

// `unsafe`: the block's one-time set-up and linking its edges; each block
// says why it is sound.
#![allow(unsafe_code)]

use super::block::{OpBlock, OpSpec, Runner};
use super::body::Body;
use super::future::OpFuture;
use super::host::Host;
use super::lifecycle::{Granter, ready, schedule, withdraw};
use super::output::Output;
use super::reclaim;
use super::stream_op::StreamOpFuture;
use crate::error::Error;

/// The task of a pushed op: what its handle awaits.
pub(crate) type OpTask<T> = async_task::Task<Result<Output<T>, Error>, OpBlock>;

/// Spawns an op made of `spec` and `body` on `host`, and links it into its
/// variables' chains: it runs as soon as its dependencies allow. Returns its
/// task, which resolves to the body's result.
#[inline]
pub(crate) fn spawn<B: Body, H: Host>(mut spec: OpSpec, body: B, host: &H) -> OpTask<B::Output> {
    let on_streams = spec.lane.is_some();
    if let Some(units) = &mut spec.units {
        // A cancel that finds it parked for these takes it out (`start`).
        units.withdraw = Some(withdraw::<H>);
    }
    let body_size = if on_streams {
        size_of::<StreamOpFuture<B, H>>()
    } else {
        size_of::<OpFuture<B, H>>()
    };
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
    unsafe { link_in(runner, host, body_size) };
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
unsafe fn link_in<H: Host>(runner: Runner, host: &H, body_size: usize) {
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
            edges[0]
                .var
                .chain
                .append(&edges[0].edge, &Granter::push(host));
        } else {
            link_all(this, host);
        }
        // Release the pusher's guard; if every edge was granted meanwhile,
        // the op is ready now.
        if let Some(runner) = this.countdown.release() {
            ready(this, runner, host, None);
        }
        // This thread frees the op once it is finished.
        reclaim::adopt(this, body_size);
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
/// As for [`link_in`].
unsafe fn link_all<H: Host>(op: &OpBlock, host: &H) {
    let edges = op.edges();
    // One bit per edge whose token this push took: the first 64 edges in a
    // word, more (an op on over 64 variables) in a vector.
    let mut first = 0u64;
    let mut rest: Vec<u64> = Vec::new();
    {
        let _order = host.push_lock().lock();
        if let Some(units) = op.units() {
            units.draw_tickets();
        }
        for (i, e) in edges.iter().enumerate() {
            // SAFETY: forwarded from `link_in`.
            if unsafe { e.var.chain.link(&e.edge) } {
                if i < 64 {
                    first |= 1 << i;
                } else {
                    rest.resize(rest.len().max(i / 64), 0);
                    rest[i / 64 - 1] |= 1 << (i % 64);
                }
            }
        }
    }
    let cx = Granter::push(host);
    // Grants from the edges whose bits are set in `word`, edge `base` first.
    let advance = |mut bits: u64, base: usize| {
        while bits != 0 {
            let e = &edges[base + bits.trailing_zeros() as usize];
            bits &= bits - 1;
            // SAFETY: `link` handed us the token at this edge.
            unsafe { e.var.chain.advance(&e.edge, &cx) };
        }
    };
    advance(first, 0);
    for (w, &word) in rest.iter().enumerate() {
        advance(word, 64 * (w + 1));
    }
}
