//! One pushed op's metadata, stored in its task's header: the [`OpBlock`].
//!
//! Every op is one `async-task` task. Its metadata holds the countdown of
//! unmet dependencies with the op's `Runnable` parked in it, and one edge per
//! variable, linked into that variable's chain; the task's future runs the
//! body. So an op costs one allocation, whatever its number of variables (up
//! to two inline). What happens to a block, step by step, is `lifecycle`.
//!
//! # Who touches what
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `countdown` | see `core::countdown` | |
//! | `anchor` | see `core::anchor`; set by the pusher before the block is shared | |
//! | `next_adopted` | the pushing thread only (`reclaim`) | the same |
//! | `status` | an async body leasing its context, the future and the lease as they finish (the lease count); a handle (`CANCELLED`, before the start only); the host's broker (`PARKED`, under its lock; cleared by a cancel's withdrawal); the op's start (`STARTED`); retiring (`RETIRED`, keeping `STARTED` and `CANCELLED`); of a resident op, the replay's runtime (`core::due::DUE`: see `resident`) | the same; the op's start (`CANCELLED`); a handle (`RETIRED`, `STARTED`, `CANCELLED`) |
//! | `host`, `flags`, `device`, `priority`, `name`, `units` | creation | anyone |
//! | `edges` | creation; owners set once by the pusher before linking; the variables given up at retiring | the chains, the op until it retires |
//!
//! # Lifetimes
//!
//! - The block lives as long as the task allocation. Chains may touch an
//!   edge after its op finished (an appender linking behind it), so the block
//!   holds a waker of its own task, the *anchor*, until every edge is released
//!   and the op has run; then the pushing thread drops it (`reclaim`), or,
//!   for an orphaned op, the thread whose release comes last.
//! - What the op declared does not wait for that: the op gives its
//!   variables up (their values, and the units they hold) when it retires,
//!   on whatever thread that is. Only the block's own memory is freed late.
//! - The host (the engine's shared state) outlives every op between its
//!   admission at push and its `Host::retire`: the engine shuts down only
//!   after its pending ops drained. So an op reaches its host only in between.

// `unsafe`: the adoption link, and freeing a leaked name; each block says why it is sound.
#![allow(unsafe_code)]

use std::any::Any;
use std::borrow::Cow;
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::task::Waker;

use async_task::Runnable;

use super::units::OpUnits;
use super::var::{AnyVar, VarHold};
use crate::core::anchor::Anchor;
use crate::core::chain::Edge;
use crate::core::countdown::Countdown;
use crate::core::few::Few;
use crate::error::{FailureKind, OpFailure, VarId};
use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::AtomicU8;
use crate::loom::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// One op's access to one variable: the chain edge and the variable it is in.
///
/// Inside a block, `var` is given up when the op retires
/// ([`OpBlock::release_vars`]), not when the block is freed.
pub(crate) struct OpEdge {
    pub(crate) edge: Edge<OpBlock>,
    pub(crate) var: VarHold,
}

impl OpEdge {
    #[inline]
    pub(super) fn new(var: &dyn AnyVar, write: bool) -> Self {
        Self {
            edge: Edge::new(write),
            var: var.hold(),
        }
    }

    /// Whether the op mutates this variable.
    #[inline]
    pub(crate) fn is_write(&self) -> bool {
        self.edge.is_write()
    }
}

/// The op's edges, writes first, each variable once; two inline.
pub(crate) type Edges = Few<OpEdge>;

/// A runnable op, as the host's executors see it.
pub(crate) type Runner = Runnable<OpBlock>;

/// What kind of op it is: whether it runs when an input is poisoned, and
/// whether it is the host's wait for a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Mode {
    /// Skip on a poisoned or deleted input.
    Normal = NORMAL,
    /// Run even on poisoned inputs (deleting and un-poisoning a variable).
    Maintenance = MAINTENANCE,
    /// The host's wait for a variable: skipped as `Normal` is, but with an
    /// empty body, so it finishes on the thread that makes it ready instead
    /// of waiting for a worker (`lifecycle::ready`); a deleted input is its
    /// caller's answer, not a failure to report (`lifecycle::skip`); and the
    /// host does not count it toward its bound on ops in flight.
    Wait = WAIT,
    /// A recorded graph's replay (`crate::graph::run`): runs even on
    /// poisoned inputs, as `Maintenance` does (its recorded ops skip
    /// themselves), and its end counts no mutation of the variables it
    /// mutates: its recorded ops count theirs as they end, as pushed ops
    /// would.
    Replay = REPLAY,
}

/// Everything an op is made of, as the engine's builders fill it in.
pub(crate) struct OpSpec {
    pub(crate) edges: Edges,
    pub(crate) units: Option<Box<OpUnits>>,
    pub(crate) name: Option<Cow<'static, str>>,
    /// The index of its device among the engine's devices.
    pub(crate) device_index: u16,
    /// Its lane, on a stream device.
    pub(crate) lane: Option<u8>,
    pub(crate) priority: i32,
    pub(crate) mode: Mode,
    /// The host's bookkeeping bit: the generation of `wait_all` that counted
    /// the op in (see `core::generations`).
    pub(crate) generation: u8,
}

impl OpSpec {
    /// A plain op on `edges`: unnamed, on the default device, no units, no
    /// priority.
    #[inline]
    pub(crate) fn new(edges: Edges) -> Self {
        Self {
            edges,
            units: None,
            name: None,
            device_index: 0,
            lane: None,
            priority: 0,
            mode: Mode::Normal,
            generation: 0,
        }
    }

    /// One of the host's own ops (a delete, an un-poisoning, a wait): on the
    /// default device, no units, no priority.
    pub(crate) fn own(edges: Edges, name: &'static str, mode: Mode) -> Self {
        Self {
            edges,
            units: None,
            name: Some(Cow::Borrowed(name)),
            device_index: 0,
            lane: None,
            priority: 0,
            mode,
            generation: 0,
        }
    }
}

/// `OpBlock::status`: the count of holders of a leased op's grants.
pub(super) const LEASE_MASK: u8 = 0b11;
/// `OpBlock::status`: a handle cancelled the op before it started (see
/// `start`).
pub(super) const CANCELLED: u8 = 0b100;
/// `OpBlock::status`: the op has retired (counted out of its host).
const RETIRED: u8 = 0b1000;
/// `OpBlock::status`: the op's start came: its body runs unless
/// `CANCELLED` was set before (see `start`).
pub(super) const STARTED: u8 = 0b1_0000;
/// `OpBlock::status`: the op is parked in its host's broker, waiting for
/// its units (set and cleared under the broker's lock; see `start`).
pub(super) const PARKED: u8 = 0b10_0000;
/// `OpBlock::status`, of a resident op's block only: `core::due::DUE`,
/// its run is due in the replay in flight (see `resident`).
const _DUE_IS_FREE: () =
    assert!(crate::core::due::DUE & (LEASE_MASK | CANCELLED | RETIRED | STARTED | PARKED) == 0);

/// `OpBlock::flags`: the op's generation.
const GENERATION: u8 = 1;
/// `OpBlock::flags`: the name was leaked from an owned string.
const NAME_OWNED: u8 = 2;
/// `OpBlock::flags`: the bits above this hold the op's kind: `NORMAL`,
/// `MAINTENANCE`, `WAIT`, `REPLAY`, or `FIRST_LANE` plus its lane on a
/// stream device (lanes are fewer than 31, so the kind is below 64). Only
/// `Mode::Normal` ops run on stream devices.
const KIND_SHIFT: u8 = 2;
/// The kind of a `Mode::Normal` op on a host device.
const NORMAL: u8 = 0;
/// The kind of a `Mode::Maintenance` op.
const MAINTENANCE: u8 = 1;
/// The kind of a `Mode::Wait` op.
const WAIT: u8 = 2;
/// The kind of a `Mode::Replay` op.
const REPLAY: u8 = 3;
/// The kind of an op on lane 0 of a stream device.
const FIRST_LANE: u8 = 4;

/// An op's metadata, stored in its task's header.
pub(crate) struct OpBlock {
    pub(super) countdown: Countdown<Runner>,
    /// A waker of this very task, keeping its allocation alive while chains
    /// may still touch an edge; counts the edges not released yet, plus one
    /// until the op has run.
    pub(super) anchor: Anchor<Waker>,
    /// The next op its pushing thread adopted (see `reclaim`).
    next_adopted: UnsafeCell<*const OpBlock>,
    /// In `LEASE_MASK`: 0, or (once an async body leased its `OpCtx`) how
    /// many of the future and the context still hold the grants: the last
    /// one releases them. Plus the `CANCELLED` and `STARTED` bits (see
    /// `start`) and `RETIRED`.
    pub(super) status: AtomicU8,
    /// `GENERATION` and `NAME_OWNED` bits and the kind (mode or lane),
    /// packed so that the block stays within its size budget (see the test
    /// below).
    flags: u8,
    device: u16,
    priority: i32,
    /// The host that spawned the op, erased (see `lifecycle::host`).
    pub(super) host: *const (),
    /// The op's name; an owned name is leaked into it and freed on drop.
    name: Option<&'static str>,
    /// Its variables are given up at retiring (`release_vars`), so the
    /// block's drop frees the list without dropping them again.
    edges: ManuallyDrop<Edges>,
    /// The counted units the op needs, if any.
    units: Option<Box<OpUnits>>,
}

// SAFETY: `next_adopted` is touched only by the pushing thread (see
// `reclaim`); `host` points to a `Sync` host; the countdown and the anchor
// are `Sync`; everything else is atomic or immutable.
unsafe impl Send for OpBlock {}
// SAFETY: as above.
unsafe impl Sync for OpBlock {}

impl OpBlock {
    /// The block of an op made of `spec`, pushed to the host at `host`.
    #[inline]
    pub(super) fn new(spec: OpSpec, host: *const ()) -> Self {
        let n = spec.edges.len() as u32;
        // A mode's kind is its discriminant; only `Normal` ops have lanes.
        let kind = spec.lane.map_or(spec.mode as u8, |l| {
            debug_assert!(usize::from(l) < crate::device::MAX_LANES);
            debug_assert!(spec.mode == Mode::Normal, "{:?} op on a stream", spec.mode);
            FIRST_LANE + l
        });
        Self {
            countdown: Countdown::new(n),
            anchor: Anchor::new(n + 1),
            flags: u8::from(spec.generation != 0) * GENERATION
                + u8::from(matches!(spec.name, Some(Cow::Owned(_)))) * NAME_OWNED
                + (kind << KIND_SHIFT),
            next_adopted: UnsafeCell::new(std::ptr::null()),
            status: AtomicU8::new(0),
            device: spec.device_index,
            priority: spec.priority,
            host,
            name: spec.name.map(|n| match n {
                Cow::Borrowed(s) => s,
                Cow::Owned(s) => Box::leak(s.into_boxed_str()),
            }),
            edges: ManuallyDrop::new(spec.edges),
            units: spec.units,
        }
    }

    #[inline]
    fn name_owned(&self) -> bool {
        self.flags & NAME_OWNED != 0
    }

    /// The op's lane, if it runs on a stream device.
    #[inline]
    pub(crate) fn lane(&self) -> Option<u8> {
        (self.flags >> KIND_SHIFT).checked_sub(FIRST_LANE)
    }

    /// Whether the op runs even on poisoned inputs.
    #[inline]
    pub(crate) fn is_maintenance(&self) -> bool {
        matches!(self.flags >> KIND_SHIFT, MAINTENANCE | REPLAY)
    }

    /// Whether the op's end counts a mutation of each variable it mutates:
    /// every op's but a replay's (`Mode::Replay`).
    #[inline]
    pub(crate) fn counts_versions(&self) -> bool {
        self.flags >> KIND_SHIFT != REPLAY
    }

    /// Whether the op is the host's wait for a variable (`Mode::Wait`).
    #[inline]
    pub(crate) fn is_wait(&self) -> bool {
        self.flags >> KIND_SHIFT == WAIT
    }

    /// The generation the host counted the op in.
    #[inline]
    pub(crate) fn generation(&self) -> u8 {
        self.flags & GENERATION
    }

    #[inline]
    pub(crate) fn name(&self) -> Option<&str> {
        // Borrowed from `self`: an owned name lives only as long as the op.
        self.name
    }

    /// The op's name if it is a static string (one that outlives the op).
    #[inline]
    pub(crate) fn static_name(&self) -> Option<&'static str> {
        self.name.filter(|_| !self.name_owned())
    }

    /// The op's failure of kind `kind`, named after it (the failure may
    /// outlive the op).
    pub(crate) fn failure(&self, kind: FailureKind) -> Arc<OpFailure> {
        Arc::new(OpFailure::new(self.failure_name(), kind))
    }

    /// The op's name, owned, for a failure reported later.
    pub(crate) fn failure_name(&self) -> Option<Cow<'static, str>> {
        self.name.map(|s| {
            if self.name_owned() {
                Cow::Owned(s.to_owned())
            } else {
                Cow::Borrowed(s)
            }
        })
    }

    #[inline]
    pub(crate) fn priority(&self) -> i32 {
        self.priority
    }

    /// The index of the op's device among its engine's devices.
    #[inline]
    pub(crate) fn device_index(&self) -> u16 {
        self.device
    }

    #[inline]
    pub(crate) fn edges(&self) -> &[OpEdge] {
        self.edges.as_slice()
    }

    #[inline]
    pub(crate) fn units(&self) -> Option<&OpUnits> {
        self.units.as_deref()
    }

    /// Dependencies not granted yet (and the pusher's guard); a snapshot.
    #[inline]
    pub(crate) fn ungranted(&self) -> u32 {
        self.countdown.pending()
    }

    /// Marks the op retired: nothing it declared waits for it any more.
    /// The lease count is 0 by then, so the word holds only the `STARTED`
    /// and `CANCELLED` bits, which it keeps: what a cancel answers stands
    /// (see `start`). (A cancel that sets its bit in between, on an op
    /// that never started, is lost to the store; a later one answers the
    /// same.) A load and a store, not a read-modify-write: only a cancel
    /// may write the word now, and losing its bit is harmless.
    #[inline]
    pub(super) fn mark_retired(&self) {
        let status = self.status.load(Relaxed);
        debug_assert_eq!(status & !(STARTED | CANCELLED), 0, "leased or retired");
        self.status.store(status | RETIRED, Release);
    }

    /// Whether the op has retired: its host counts it out (its handle's
    /// result may still be on its way).
    #[inline]
    pub(crate) fn has_retired(&self) -> bool {
        self.status.load(Acquire) & RETIRED != 0
    }

    /// Gives up the op's variables: their values and units may go now, if
    /// no one else holds them. Chains still may touch the edges themselves.
    ///
    /// A value's drop is user code: a panic there is caught (this may run
    /// where `async-task` aborts on a panic), the other variables are given
    /// up all the same, and the first panic is returned with its variable.
    /// (Catching costs a little: it is done only from the first variable
    /// whose value's drop runs code, never for plain tags.)
    ///
    /// # Safety
    ///
    /// Called once, when the op retires: its edges are completed and
    /// nothing reads their `var` afterwards.
    #[inline]
    pub(super) unsafe fn release_vars(&self) -> Option<(VarId, Box<dyn Any + Send>)> {
        let edges = self.edges();
        for (i, e) in edges.iter().enumerate() {
            if e.var.value_drops() {
                // SAFETY: forwarded, for the edges not given up yet.
                return unsafe { release_caught(&edges[i..]) };
            }
            // SAFETY: each hold is moved out once, here; the block's drop
            // does not drop it again (`edges` is `ManuallyDrop`), and the
            // caller guarantees nothing reads it afterwards. Its value's
            // drop runs no code.
            drop(unsafe { std::ptr::read(&e.var) });
        }
        None
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
    pub(super) unsafe fn unref(this: *const Self) {
        // SAFETY: forwarded; the anchor keeps `this` alive until dropped.
        drop(unsafe { (*this).anchor.unref() });
    }

    /// # Safety
    ///
    /// Only the adopting thread calls this.
    pub(super) unsafe fn set_next_adopted(&self, next: *const OpBlock) {
        // SAFETY: only the adopting thread touches the link.
        self.next_adopted.with_mut(|n| unsafe { *n = next });
    }

    /// # Safety
    ///
    /// Only the adopting thread calls this.
    pub(super) unsafe fn next_adopted(&self) -> *const OpBlock {
        // SAFETY: only the adopting thread touches the link.
        self.next_adopted.with(|n| unsafe { *n })
    }
}

/// Gives up the variables of `edges` as `OpBlock::release_vars` does,
/// catching panics.
///
/// # Safety
///
/// As for `release_vars`, for these edges.
unsafe fn release_caught(edges: &[OpEdge]) -> Option<(VarId, Box<dyn Any + Send>)> {
    let mut next = 0;
    let mut first_panic = None;
    while next < edges.len() {
        let mut dropping = None;
        let released = catch_unwind(AssertUnwindSafe(|| {
            while let Some(e) = edges.get(next) {
                // Counted before the drop: a hold whose drop panicked is gone
                // all the same, and not dropped again.
                next += 1;
                dropping = Some(e.var.id());
                // SAFETY: as in `release_vars`.
                drop(unsafe { std::ptr::read(&e.var) });
            }
        }));
        if let (Err(payload), Some(var)) = (released, dropping) {
            first_panic.get_or_insert((var, payload));
        }
    }
    first_panic
}

impl Drop for OpBlock {
    fn drop(&mut self) {
        // The variables were given up at retiring (every block dropped has
        // retired: it is freed only after its run's share of `refs` is
        // counted out, by `retire`): free the list only.
        // SAFETY: `edges` is not used after this.
        let edges = unsafe { ManuallyDrop::take(&mut self.edges) };
        match edges {
            Few::Many(mut list) => {
                // SAFETY: length 0 leaves the elements to their `release_vars`.
                unsafe { list.set_len(0) };
            }
            inline => std::mem::forget(inline),
        }
        if self.name_owned()
            && let Some(name) = self.name.take()
        {
            // SAFETY: an owned name was leaked from a `Box<str>` in `new`, and
            // `name()` only ever lent it out for the lifetime of `self`.
            drop(unsafe { Box::from_raw(std::ptr::from_ref(name).cast_mut()) });
        }
    }
}

impl std::fmt::Debug for OpBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let vars: Vec<_> = self
            .edges()
            .iter()
            .map(|e| (e.var.id(), if e.is_write() { "mutate" } else { "read" }))
            .collect();
        f.debug_struct("Op")
            .field("name", &self.name())
            .field("priority", &self.priority)
            .field("vars", &vars)
            .field("countdown", &self.countdown)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The op block is most of an op's allocation; with a small closure an op
    /// on one or two variables fits in 256 bytes (glibc's chunk). A bigger
    /// block is a regression of the memory held per pending op.
    #[test]
    fn op_block_stays_small() {
        assert!(
            std::mem::size_of::<OpBlock>() <= 144,
            "OpBlock grew to {} bytes",
            std::mem::size_of::<OpBlock>()
        );
        assert_eq!(std::mem::size_of::<OpEdge>(), 24);
    }

    /// The mode, the lane, the generation and the owned name share one
    /// byte: each reads back as it was given.
    #[test]
    fn flags_keep_mode_lane_and_name_apart() {
        let block = |mode, lane, generation, name: Option<Cow<'static, str>>| {
            let mut spec = OpSpec::new(Few::default());
            (spec.mode, spec.lane, spec.generation, spec.name) = (mode, lane, generation, name);
            OpBlock::new(spec, std::ptr::null())
        };
        let last_lane = (crate::device::MAX_LANES - 1) as u8;
        for lane in [None, Some(0), Some(1), Some(last_lane)] {
            for generation in [0, 1] {
                for owned in [false, true] {
                    let name = if owned {
                        Cow::Owned("x".into())
                    } else {
                        Cow::Borrowed("x")
                    };
                    let b = block(Mode::Normal, lane, generation, Some(name));
                    assert_eq!(b.lane(), lane);
                    assert_eq!(b.generation(), generation);
                    assert_eq!(b.name_owned(), owned);
                    assert!(!b.is_maintenance() && !b.is_wait());
                }
            }
        }
        for generation in [0, 1] {
            let m = block(Mode::Maintenance, None, generation, None);
            assert!(m.is_maintenance() && !m.is_wait() && m.lane().is_none());
            assert!(m.counts_versions());
            assert_eq!(m.generation(), generation);
            let r = block(Mode::Replay, None, generation, None);
            assert!(r.is_maintenance() && !r.is_wait() && r.lane().is_none());
            assert!(!r.counts_versions());
            assert_eq!(r.generation(), generation);
            let w = block(Mode::Wait, None, generation, Some(Cow::Borrowed("w")));
            assert!(w.is_wait() && !w.is_maintenance() && w.lane().is_none());
            assert_eq!(w.generation(), generation);
            assert_eq!(w.name(), Some("w"));
        }
    }
}
