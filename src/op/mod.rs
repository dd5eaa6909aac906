//! One pushed op: its dependency bookkeeping, the future that runs it, and
//! what happens when it finishes.
//!
//! Every op is one `async-task` task. Its metadata is an [`OpBlock`]: the
//! countdown of unmet dependencies ([`Trigger`]) with the op's `Runnable`
//! parked in it, and one [`Edge`] per variable, linked into that variable's
//! [`Chain`](crate::chain::Chain). The task's future is an [`OpFuture`] that
//! checks the inputs, runs the body (a closure or an async block), and then
//! completes every edge: reads leave, writes bump the version, record poison
//! on failure and hand their token on. So an op costs one allocation, whatever
//! its number of variables (up to [`INLINE_EDGES`]).
//!
//! # Lifetimes
//!
//! - The `OpBlock` lives as long as the task allocation. Chains may touch an
//!   edge after its op finished (an appender linking behind it), so the block
//!   holds a [`Waker`] of its own task, the *anchor*, until `refs` (one per
//!   edge the chains have not released, plus one until the op has run) drops
//!   to zero. The thread that pushed the op then drops the anchor (see
//!   [`reclaim`]), or, for an orphaned op, the thread whose
//!   decrement reaches zero.
//! - The engine's shared state outlives every op between `Pending::enter` (at
//!   push) and `Pending::leave` (the last step of completion): the engine
//!   shuts down only after pending ops drained. So an op dereferences its
//!   `shared` pointer only in between.
//! - An async op's [`OpCtx`] may outlive its future (it is the user's value).
//!   The op's grants are then released when *both* are gone (`holders`).

pub(crate) mod anchor;
pub(crate) mod ctx;
mod device;
mod future;
pub(crate) mod reclaim;
pub(crate) mod track;
pub(crate) mod trigger;

pub(crate) use self::future::{
    AsyncBody, Body, OpFuture, SyncBody, in_op, panic_message, with_current_op,
};

use std::borrow::Cow;
use std::sync::Arc;
use std::task::Waker;

use async_task::Runnable;

use self::anchor::Anchor;
use self::trigger::Trigger;
use crate::chain::{Edge, Owner};
use crate::engine::Shared;
use crate::error::{Error, OpFailure};
use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::{AtomicU8, Ordering::AcqRel};
use crate::resource::OpResources;
use crate::var::{VarHold, VarState};

/// A runnable op, as executors see it.
pub(crate) type Runner = Runnable<OpBlock>;

/// Edges stored inside the op's allocation; more spill to one heap
/// allocation. Two keeps an op on one or two variables within a 256-byte
/// allocation (glibc chunk) with a small closure.
pub(crate) const INLINE_EDGES: usize = 2;

/// One op's access to one variable: the chain edge and the variable it is in.
pub(crate) struct OpEdge {
    pub(crate) edge: Edge<OpBlock>,
    pub(crate) var: VarHold,
}

impl OpEdge {
    pub(crate) fn new(var: VarHold, write: bool) -> Self {
        Self {
            edge: Edge::new(write),
            var,
        }
    }
}

/// The op's edges, writes first, each variable once.
pub(crate) enum Edges {
    One([OpEdge; 1]),
    Two([OpEdge; INLINE_EDGES]),
    Many(Box<[OpEdge]>),
}

impl Edges {
    pub(crate) fn from_vec(edges: Vec<OpEdge>) -> Self {
        match <[OpEdge; INLINE_EDGES]>::try_from(edges) {
            Ok(two) => Edges::Two(two),
            Err(edges) => match <[OpEdge; 1]>::try_from(edges) {
                Ok(one) => Edges::One(one),
                Err(edges) => Edges::Many(edges.into_boxed_slice()),
            },
        }
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[OpEdge] {
        match self {
            Edges::One(e) => e,
            Edges::Two(e) => e,
            Edges::Many(e) => e,
        }
    }
}

/// What decides whether an op runs when an input is poisoned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Skip on a poisoned or deleted input.
    Normal,
    /// Run even on poisoned inputs (deleting and un-poisoning a variable).
    Maintenance,
}

/// `OpBlock::flags`: the op's `pending` generation (0 or 1).
const GENERATION: u8 = 1;
/// `OpBlock::flags`: `Mode::Maintenance`.
const MAINTENANCE: u8 = 2;
/// `OpBlock::flags`: the name was leaked from an owned string.
const NAME_OWNED: u8 = 4;
/// `OpBlock::flags`: the bits above this hold the op's lane plus one on a
/// stream device, 0 elsewhere (lanes are fewer than 31).
const LANE_SHIFT: u8 = 3;

/// An op's metadata, stored in its task's header.
pub(crate) struct OpBlock {
    trigger: Trigger<Runner>,
    /// A waker of this very task, keeping its allocation alive while chains
    /// may still touch an edge; counts the edges not released yet, plus one
    /// until the op has run.
    anchor: Anchor<Waker>,
    /// The next op its pushing thread adopted (see `reclaim`); only that
    /// thread touches it.
    next_adopted: UnsafeCell<*const OpBlock>,
    /// 0, or (once an async body leased its `OpCtx`) how many of the future
    /// and the context still hold the grants: the last one releases them.
    holders: AtomicU8,
    /// `GENERATION`, `MAINTENANCE` and `NAME_OWNED` bits and the lane,
    /// packed so that the block stays within its size budget (see the test
    /// below).
    flags: u8,
    device: u16,
    priority: i32,
    shared: *const Shared,
    /// The op's name; an owned name is leaked into it and freed on drop.
    name: Option<&'static str>,
    edges: Edges,
    /// The counted resources the op needs, if any (see `resource`).
    resources: Option<Box<OpResources>>,
}

// SAFETY: `next_adopted` is touched only by the pushing thread (see
// `reclaim`); the trigger and the anchor are `Sync`; everything else is
// atomic or immutable.
unsafe impl Send for OpBlock {}
// SAFETY: as above.
unsafe impl Sync for OpBlock {}

impl OpBlock {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        shared: &Shared,
        device: u16,
        priority: i32,
        name: Option<Cow<'static, str>>,
        mode: Mode,
        generation: u8,
        edges: Edges,
        resources: Option<Box<OpResources>>,
        lane: Option<u8>,
    ) -> Self {
        let n = edges.as_slice().len() as u32;
        let lane = lane.map_or(0, |l| {
            debug_assert!(usize::from(l) < crate::stream::MAX_LANES);
            l + 1
        });
        Self {
            trigger: Trigger::new(n),
            anchor: Anchor::new(n + 1),
            flags: u8::from(generation != 0) * GENERATION
                + u8::from(mode == Mode::Maintenance) * MAINTENANCE
                + u8::from(matches!(name, Some(Cow::Owned(_)))) * NAME_OWNED
                + (lane << LANE_SHIFT),
            next_adopted: UnsafeCell::new(std::ptr::null()),
            holders: AtomicU8::new(0),
            device,
            priority,
            shared,
            name: name.map(|n| match n {
                Cow::Borrowed(s) => s,
                Cow::Owned(s) => Box::leak(s.into_boxed_str()),
            }),
            edges,
            resources,
        }
    }

    fn name_owned(&self) -> bool {
        self.flags & NAME_OWNED != 0
    }

    /// The op's lane, if it runs on a stream device.
    #[inline]
    pub(crate) fn lane(&self) -> Option<u8> {
        (self.flags >> LANE_SHIFT).checked_sub(1)
    }

    /// The name, for an `OpFailure` (which may outlive the op).
    fn failure_name(&self) -> Option<Cow<'static, str>> {
        self.name.map(|s| {
            if self.name_owned() {
                Cow::Owned(s.to_owned())
            } else {
                Cow::Borrowed(s)
            }
        })
    }

    #[inline]
    pub(crate) fn name(&self) -> Option<&str> {
        // Borrowed from `self`: an owned name lives only as long as the op.
        self.name
    }

    #[inline]
    pub(crate) fn priority(&self) -> i32 {
        self.priority
    }

    #[inline]
    pub(crate) fn device(&self) -> u16 {
        self.device
    }

    #[inline]
    pub(crate) fn edges(&self) -> &[OpEdge] {
        self.edges.as_slice()
    }

    #[inline]
    pub(crate) fn resources(&self) -> Option<&OpResources> {
        self.resources.as_deref()
    }

    /// The engine's shared state; valid while the op is pending.
    #[inline]
    pub(crate) fn shared(&self) -> &Shared {
        // SAFETY: see "Lifetimes" in the module docs: the engine's shared state
        // outlives every op until the op's `Pending::leave`, after which this
        // block never calls `shared()` again.
        unsafe { &*self.shared }
    }

    /// Spawns the op's task and links it into its variables' chains; it runs
    /// as soon as its dependencies allow. Returns the task's handle.
    pub(crate) fn spawn<B: Body>(
        block: OpBlock,
        body: B,
    ) -> async_task::Task<Result<B::Output, Error>, OpBlock> {
        let on_streams = block.lane().is_some();
        let builder = async_task::Builder::new().metadata(block);
        let (runner, task) = if on_streams {
            builder.spawn(
                move |op: &OpBlock| device::StreamOpFuture::new(op, body),
                async_task::WithInfo(schedule),
            )
        } else {
            builder.spawn(
                move |op: &OpBlock| OpFuture::new(op, body),
                async_task::WithInfo(schedule),
            )
        };
        // SAFETY: `runner` was just spawned for this block and never scheduled.
        unsafe { Self::launch(runner) };
        task
    }

    /// Links a freshly spawned op into its variables' chains, and schedules it
    /// if nothing holds it back.
    ///
    /// # Safety
    ///
    /// `runner` comes straight from `spawn` for this block: never scheduled,
    /// its edges never linked.
    unsafe fn launch(runner: Runner) {
        let op: *const OpBlock = runner.metadata();
        // SAFETY: the block lives in the task allocation, which `runner` keeps
        // alive until it is parked in the trigger, and the anchor keeps alive
        // from then on until every edge is released. Nothing else can see the
        // block before its edges are linked, so the writes below are exclusive.
        unsafe {
            let this = &*op;
            this.anchor.set(runner.waker());
            for e in this.edges() {
                e.edge.set_owner(op);
            }
            this.trigger.park(runner);
            if let Some(tracker) = &this.shared().tracker {
                tracker.add(this);
            }
            let edges = this.edges();
            if edges.len() == 1 && this.resources.is_none() {
                edges[0].var.chain.append(&edges[0].edge);
            } else {
                this.link_all();
            }
            // Release the pusher's guard; if every edge was granted meanwhile,
            // the op is ready now.
            if let Some(runner) = this.trigger.release() {
                this.ready(runner);
            }
            // This thread frees the op once it is finished.
            reclaim::adopt(this);
        }
    }

    /// Whether the op has run and the chains have released all its edges.
    #[inline]
    pub(crate) fn is_finished(&self) -> bool {
        self.anchor.is_finished()
    }

    /// Drops the anchor of a finished op, which may free it.
    ///
    /// # Safety
    ///
    /// Called once, by the thread that adopted the op, after `is_finished`.
    pub(crate) unsafe fn reclaim(this: *const Self) {
        // SAFETY: finished, so we are the anchor's taker; the anchor keeps
        // `this` alive until it is dropped, after this statement.
        drop(unsafe { (*this).anchor.take() });
    }

    /// Gives up the adopting thread's anchor: whoever brings the count to zero
    /// drops it (this thread, if the op is already finished).
    ///
    /// # Safety
    ///
    /// Called once, by the thread that adopted the op (or would have), and
    /// not together with `reclaim`.
    pub(crate) unsafe fn orphan(this: *const Self) {
        // SAFETY: forwarded; the anchor keeps `this` alive until dropped.
        drop(unsafe { (*this).anchor.orphan() });
    }

    /// Counts one reference out; the last one out of an orphaned op drops its
    /// anchor (which may free it: the caller must not touch it afterwards).
    ///
    /// # Safety
    ///
    /// `this` is alive; each reference is counted out once.
    #[inline]
    unsafe fn unref(this: *const Self) {
        // SAFETY: forwarded; the anchor keeps `this` alive until dropped.
        drop(unsafe { (*this).anchor.unref() });
    }

    /// # Safety
    ///
    /// Only the adopting thread calls this.
    pub(crate) unsafe fn set_next_adopted(&self, next: *const OpBlock) {
        // SAFETY: only the adopting thread touches the link.
        self.next_adopted.with_mut(|n| unsafe { *n = next });
    }

    /// # Safety
    ///
    /// Only the adopting thread calls this.
    pub(crate) unsafe fn next_adopted(&self) -> *const OpBlock {
        // SAFETY: only the adopting thread touches the link.
        self.next_adopted.with(|n| unsafe { *n })
    }

    /// Links every edge under the engine's push lock, so that all variables'
    /// chains see multi-variable ops in one global order (two pushers cannot
    /// interleave into opposite orders on two variables, which would be a
    /// wait-for cycle). An op with resource demands draws its tickets in the
    /// same critical section, so ticket order agrees with that order too (see
    /// `broker`). Granting, which may run ops inline, happens after the lock
    /// is dropped.
    ///
    /// # Safety
    ///
    /// As for [`launch`](Self::launch).
    unsafe fn link_all(&self) {
        let edges = self.edges();
        let mut tokens = TokenSet::default();
        {
            let _order = self.shared().push_lock.lock();
            if let Some(r) = self.resources() {
                r.draw_tickets();
            }
            for (i, e) in edges.iter().enumerate() {
                // SAFETY: forwarded from `launch`.
                if unsafe { e.var.chain.link(&e.edge) } {
                    tokens.insert(i);
                }
            }
        }
        for i in tokens.iter() {
            let e = &edges[i];
            // SAFETY: `link` handed us the token at this edge.
            unsafe { e.var.chain.advance(&e.edge) };
        }
    }

    /// Whether the op may run: the first poisoned or deleted input, in edge
    /// order, if not.
    fn blocked_by(&self) -> Option<Skip> {
        let streams = self.shared().has_streams;
        for e in self.edges() {
            // SAFETY: the op is running, so it holds a grant on every edge.
            if unsafe { e.var.is_live() } {
                // A failed device write poisons too (until a host op with
                // the write grant turns it into the variable's state). Only
                // engines with stream devices look: it takes a lock.
                if streams
                    && self.flags & MAINTENANCE == 0
                    && let Some(cause) = e.var.fences().write_failure()
                {
                    return Some(Skip::Poisoned(cause));
                }
                continue;
            }
            // SAFETY: as above.
            match unsafe { e.var.state() } {
                VarState::Live => {}
                VarState::Poisoned(cause) if self.flags & MAINTENANCE == 0 => {
                    return Some(Skip::Poisoned(cause));
                }
                VarState::Poisoned(_) => {}
                VarState::Deleted => return Some(Skip::Deleted(e.var.id())),
            }
        }
        None
    }

    /// The op finished (ran, failed, or was skipped with `failure` as cause).
    /// Poisons what it mutates on failure, then releases its grants, unless
    /// its leased `OpCtx` is still alive.
    fn finish(&self, failure: Option<Arc<OpFailure>>, record: bool) {
        if let Some(f) = failure {
            if let Some(r) = self.resources() {
                r.mark_failed();
            }
            // Still holding every grant: the mutated variables are ours.
            self.poison_outputs(&f);
            if record {
                self.shared().record_failure(f);
            }
        }
        // `holders` is 0 unless the body leased its context (see `lease`).
        if self.holders.load(std::sync::atomic::Ordering::Relaxed) != 0
            && self.holders.fetch_sub(1, AcqRel) != 1
        {
            return; // the lease releases the grants when it is dropped
        }
        self.release_grants();
    }

    /// Called when a leased `OpCtx` is dropped.
    pub(crate) fn lease_dropped(&self) {
        if self.holders.fetch_sub(1, AcqRel) == 1 {
            self.release_grants();
        }
    }

    /// Completes every edge and counts the op out. The op never touches the
    /// engine after this.
    fn release_grants(&self) {
        if let Some(r) = self.resources()
            && r.is_held()
        {
            let returns = self.hand_on_units(r);
            crate::resource::dispatch(self.shared().broker.release(returns.iter().copied()));
        }
        self.release_edges();
        self.retire();
    }

    /// Completes every edge: the op's variables go to the next ops.
    fn release_edges(&self) {
        for e in self.edges() {
            // SAFETY: each edge was granted and is completed exactly once, here.
            unsafe {
                if e.edge.is_write() {
                    e.var.bump_version();
                    e.var.chain.complete_write(&e.edge);
                } else {
                    e.var.chain.complete_read();
                }
            }
        }
    }

    /// Counts the finished op out of the engine. The op never touches the
    /// engine after this.
    fn retire(&self) {
        if let Some(tracker) = &self.shared().tracker {
            tracker.remove(self);
        }
        self.shared().room.leave();
        self.shared().pending.leave(self.flags & GENERATION);
        // The run's share of `refs`. Our caller (the future or the lease)
        // still holds the task, so this cannot free the block.
        // SAFETY: counted out once, here.
        unsafe { Self::unref(self) };
    }

    /// The op's variables all granted it: dispatch it, or first get its
    /// units from the broker (which may park it until they are free).
    #[inline]
    fn ready(&self, runner: Runner) {
        let Some(r) = self.resources() else {
            return self.shared().dispatch(runner, false);
        };
        let broker = &self.shared().broker;
        if self.blocked_by().is_some() {
            // It will be skipped: it needs no units, and younger requests
            // must not wait for its tickets.
            crate::resource::dispatch(broker.retire(r.demands.as_slice()));
            self.shared().dispatch(runner, false);
        } else {
            crate::resource::dispatch(broker.request(runner));
        }
    }

    /// Hands the op's lasting units on to its outputs (only if it
    /// succeeded) and returns what is to be given back: the rest of its
    /// units, and those the outputs held before. Called while the op still
    /// holds its write grants: the outputs are ours.
    fn hand_on_units(&self, r: &OpResources) -> crate::resource::Returns {
        let mut returns: crate::resource::Returns =
            r.demands.iter().map(|d| (d.pool, d.amount)).collect();
        if r.failed() {
            return returns;
        }
        for l in &r.lasting {
            let resource = &r.resources[l.demand];
            let var = &self.edges()[l.edge].var;
            returns.as_mut_slice()[l.demand].1 -= l.amount;
            // SAFETY: the op holds the write grant on `var` (allocations go
            // to mutated variables only; checked at push).
            if let Some(old) = unsafe { var.hold_units(resource, l.amount) } {
                returns.push((resource.inner.pool, old));
            }
        }
        returns
    }

    /// Marks an async op as having leased its `OpCtx`: from now on the
    /// future and the context each hold the grants.
    pub(crate) fn lease(&self) {
        self.holders.store(2, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for OpBlock {
    fn drop(&mut self) {
        if self.name_owned()
            && let Some(name) = self.name.take()
        {
            // SAFETY: an owned name was leaked from a `Box<str>` in `new`, and
            // `name()` only ever lent it out for the lifetime of `self`.
            drop(unsafe { Box::from_raw(std::ptr::from_ref(name).cast_mut()) });
        }
    }
}

impl Owner for OpBlock {
    #[inline]
    fn grant(&self) {
        if let Some(runner) = self.trigger.release() {
            self.ready(runner);
        }
    }

    #[inline]
    unsafe fn release(this: *const Self) {
        // SAFETY: the caller passes a live block and does not touch it after.
        unsafe { Self::unref(this) };
    }
}

impl std::fmt::Debug for OpBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let vars: Vec<_> = self
            .edges()
            .iter()
            .map(|e| {
                (
                    e.var.id(),
                    if e.edge.is_write() { "mutate" } else { "read" },
                )
            })
            .collect();
        f.debug_struct("Op")
            .field("name", &self.name())
            .field("priority", &self.priority)
            .field("vars", &vars)
            .field("trigger", &self.trigger)
            .finish()
    }
}

/// The edges whose token a push took, to advance after the push lock.
#[derive(Default)]
struct TokenSet {
    first: u64,
    rest: Vec<usize>,
}

impl TokenSet {
    fn insert(&mut self, i: usize) {
        if i < 64 {
            self.first |= 1 << i;
        } else {
            self.rest.push(i);
        }
    }

    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let mut bits = self.first;
        std::iter::from_fn(move || {
            (bits != 0).then(|| {
                let i = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                i
            })
        })
        .chain(self.rest.iter().copied())
    }
}

/// The schedule function of every op's task: wakes of async ops land here.
fn schedule(runner: Runner, info: async_task::ScheduleInfo) {
    let shared: *const Shared = runner.metadata().shared();
    // SAFETY: an op is only woken while it is pending, when the engine's shared
    // state is alive (see "Lifetimes" above); the pointer is read before
    // `runner` moves into the dispatch.
    unsafe { (*shared).dispatch(runner, info.woken_while_running) };
}

/// Hands a ready op to its device's executor.
pub(crate) fn dispatch(runner: Runner) {
    let shared: *const Shared = runner.metadata().shared();
    // SAFETY: as in `schedule`: the op is pending, so its engine is alive.
    unsafe { (*shared).dispatch(runner, false) };
}

/// Why an op did not run.
pub(crate) enum Skip {
    Poisoned(Arc<OpFailure>),
    Deleted(crate::var::VarId),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The op block is most of an op's allocation; with a small closure an op
    /// on one or two variables fits in 256 bytes (see `INLINE_EDGES`). A
    /// bigger block is a regression of the memory held per pending op.
    #[test]
    fn op_block_stays_small() {
        assert!(
            std::mem::size_of::<OpBlock>() <= 144,
            "OpBlock grew to {} bytes",
            std::mem::size_of::<OpBlock>()
        );
        assert_eq!(std::mem::size_of::<OpEdge>(), 24);
    }
}
