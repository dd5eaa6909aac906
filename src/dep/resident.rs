//! Recorded ops: an op of a recorded graph (`crate::graph`), as the
//! dependency layer runs it once per replay, without a push.
//!
//! Each recorded op keeps one *resident* task for the graph's lifetime,
//! spawned at recording: its metadata is an ordinary [`OpBlock`] (its edges
//! name the op's variables; they are never linked into a chain), and its
//! future runs the op whenever the graph's [`Driver`] wakes it. So a replay
//! spawns nothing and allocates nothing per op: waking the task hands its
//! runnable to the op's device's executor like any ready op (priority
//! included), and a driver may also run an op at once on the thread that
//! made it ready ([`run_recorded`]). What a run needs is made once, at
//! recording, and kept with the task: its block's address and edges, and
//! the body's context ([`OpCtx`]), lent to each run.
//!
//! Ordering is the graph's: a recorded op runs only when the replay's
//! countdowns (`core::replay`) say every op it depends on has ended, and
//! the replay's own op holds the grants of every variable from outside the
//! graph. So a recorded op touches its variables' states and values exactly
//! as a pushed op holding their grants would.
//!
//! # Lifetimes
//!
//! - The task is woken only while a replay of its graph is in flight: the
//!   replay's op keeps the graph, its host (the engine) and its driver
//!   alive until every recorded op of the replay has ended.
//! - But a slow step's task (on a stream device, or with units) is woken
//!   by fences too, and a fence wakes every waker it holds, perhaps after
//!   the step ended or once its replay is over. Its task is *gated*
//!   (`core::due`): the thread that makes it ready makes it due
//!   ([`Resident::make_due`]) before waking it, it ends its due run
//!   ([`Resident::end_due`]) before counting itself out, and a wake that
//!   finds it not due runs nothing (its schedule function asks for no
//!   units, its future touches nothing but its own block). So the step
//!   runs once per replay, and a leftover wake never reaches the driver.
//! - Dropping a [`Resident`] gives up the op's variables and cancels the
//!   task; the cancelled task's runnable is dropped on the spot by its
//!   schedule function (`schedule_resident`), never sent to an executor
//!   (the engine may be gone by then).

// `unsafe`: the resident future's pointer to its driver, the block's host,
// and the variables given up when the task goes; each block says why it is
// sound.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::block::{OpBlock, OpEdge, OpSpec, Runner};
use super::ctx::OpCtx;
use super::future::CurrentOp;
use super::host::Host;
use super::lifecycle::host;
use super::poison::Skip;
use super::start::Cancel;
use super::var::VarState;
use crate::core::due::{self, Wake};
use crate::error::{BoxError, FailureKind, OpFailure, VarId, panic_message};

/// A recorded op's body: called once per replay.
pub(crate) type RecordedBody = Box<dyn Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync>;

/// What runs a graph's recorded ops when their tasks are woken.
pub(crate) trait Driver: Send + Sync + 'static {
    /// Runs recorded op number `op`, which is ready (and whatever it lets
    /// run at once on this thread).
    fn run(&self, op: u32);
}

/// How a recorded op ended in one replay.
#[must_use]
#[derive(Debug)]
pub(crate) enum Ran {
    /// The body ran and succeeded.
    Succeeded,
    /// The body failed or panicked (or an input was deleted): the op's
    /// outputs are poisoned with this failure, which the host recorded.
    Failed(Arc<OpFailure>),
    /// An input was poisoned by an earlier failure: the body did not run,
    /// and the outputs carry the poison on. Boxed, so that a `Ran` stays
    /// two words on the replay's path (a skip is rare).
    Skipped(Box<PoisonedInput>),
}

/// The input whose poison made a recorded op skip, and the failure behind
/// it (as `Error::Poisoned` says them).
#[derive(Debug)]
pub(crate) struct PoisonedInput {
    pub(crate) input: VarId,
    pub(crate) cause: Arc<OpFailure>,
}

impl Ran {
    /// Skipped for `input`, poisoned by `cause`.
    #[cold]
    pub(crate) fn skipped(input: VarId, cause: Arc<OpFailure>) -> Self {
        Ran::Skipped(Box::new(PoisonedInput { input, cause }))
    }
}

/// A recorded op's resident task.
pub(crate) struct Resident {
    waker: Waker,
    task: Option<async_task::Task<(), OpBlock>>,
    /// The task's block and its edges, at hand: the task's metadata stays
    /// in place, alive, until `task` is dropped (in `drop`).
    block: NonNull<OpBlock>,
    edges: NonNull<[OpEdge]>,
    /// The body's context, lent to each run (none is built per run). It
    /// points into the task's block, which `task` keeps alive; its drop
    /// touches no block.
    ctx: OpCtx,
}

// SAFETY: `block` and `edges` point into the task's metadata, an `OpBlock`,
// which is `Sync` (executors share it); only shared references are made.
unsafe impl Send for Resident {}
// SAFETY: as above.
unsafe impl Sync for Resident {}

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Resident").field(self.block()).finish()
    }
}

impl Resident {
    /// The resident task of recorded op number `op`, made of `spec`, on
    /// `host`, run by `driver`.
    ///
    /// # Safety
    ///
    /// The task is woken ([`wake`](Self::wake)) only while `driver` and
    /// `host` are alive; a *gated* one (`gated`: a slow step, see
    /// [`make_due`](Self::make_due)) may be woken any time before it is
    /// dropped, but runs its op through the driver only while it is due,
    /// and then the same holds.
    ///
    /// Inline: its one caller (`graph::run::Runtime::new`) builds a
    /// graph's tasks in a loop, and `spec` is large to pass by value.
    #[inline]
    pub(crate) unsafe fn spawn<H: Host, D: Driver>(
        spec: OpSpec,
        host: &H,
        driver: *const D,
        op: u32,
        gated: bool,
    ) -> Self {
        let block = OpBlock::new(spec, std::ptr::from_ref(host).cast());
        let (runner, task) = if gated {
            async_task::Builder::new().metadata(block).spawn(
                move |block| ResidentFuture::<D, true>::new(driver, op, block),
                schedule_resident::<H>,
            )
        } else {
            async_task::Builder::new().metadata(block).spawn(
                move |block| ResidentFuture::<D, false>::new(driver, op, block),
                schedule_resident::<H>,
            )
        };
        let waker = runner.waker();
        // The first poll parks the task (it returns at once): from now on a
        // wake schedules it.
        runner.run();
        let block = task.metadata();
        let ctx = OpCtx::resident(block, host.id());
        Self {
            waker,
            block: NonNull::from(block),
            edges: NonNull::from(block.edges()),
            task: Some(task),
            ctx,
        }
    }

    /// The op's block: its edges, name, device, priority.
    #[inline]
    pub(crate) fn block(&self) -> &OpBlock {
        // SAFETY: the task keeps its metadata alive and in place while this
        // lives (see the field).
        unsafe { self.block.as_ref() }
    }

    /// The op's edges, writes first.
    #[inline]
    fn edges(&self) -> &[OpEdge] {
        // SAFETY: as in `block`: the edges are the block's, which never
        // change once it is made.
        unsafe { self.edges.as_ref() }
    }

    /// Hands the op to its device's executor: it runs there through the
    /// driver.
    #[inline]
    pub(crate) fn wake(&self) {
        self.waker.wake_by_ref();
    }

    /// [`wake`](Self::wake), for a thread that goes on running ops of its
    /// own: the op goes where idle workers take it at once (a pool's
    /// shared deque), not to this worker's next slot, which only this
    /// worker takes, once it is done with what it runs.
    #[inline]
    pub(crate) fn share(&self) {
        SHARING.set(true);
        self.waker.wake_by_ref();
        SHARING.set(false);
    }

    /// The task's waker: what device work and fences wake it with.
    pub(crate) fn waker(&self) -> &Waker {
        &self.waker
    }

    /// Of a gated task (a slow step): it became ready in this replay, so
    /// its runs are due until it [`ends`](Self::end_due); wakes before or
    /// after are leftovers (a fence's) that run nothing. Called by the one
    /// thread that made it ready, before it wakes it.
    #[inline]
    pub(crate) fn make_due(&self) {
        due::make_due(&self.block().status);
    }

    /// Of a gated task: it ended in this replay (called inside its run,
    /// before it counts itself out); wakes are leftovers until the next
    /// replay makes it due.
    #[inline]
    pub(crate) fn end_due(&self) {
        due::end(&self.block().status);
    }
}

thread_local! {
    /// A [`Resident::share`] is waking a task on this thread.
    static SHARING: Cell<bool> = const { Cell::new(false) };
}

impl Drop for Resident {
    fn drop(&mut self) {
        let task = self.task.take().expect("resident task");
        // SAFETY: no replay is in flight (it would hold the graph, and so
        // this task), so nothing reads the edges' variables any more; they
        // are given up once, here. A panic of a value's drop was caught;
        // there is no op left to report it against.
        drop(unsafe { task.metadata().release_vars() });
        // A resident op never starts (see `start`): the cancel always takes.
        let cancelled = task.metadata().cancel();
        debug_assert_eq!(cancelled, Cancel::NotRun);
        // Cancels the task: `schedule_resident` drops its runnable at once.
        drop(task);
    }
}

/// The schedule function of a resident task: to its device's executor, or,
/// for a cancelled (dropped) one, nowhere: its runnable is dropped here,
/// which drops the future.
fn schedule_resident<H: Host>(runner: Runner) {
    if runner.metadata().is_cancelled() {
        drop(runner);
        return;
    }
    // SAFETY: a resident task is woken only while its host is alive (see
    // `Resident::spawn`): in a replay, or (a gated task's leftover wake)
    // while its `Resident` is not dropped, whose graph's runtime holds the
    // host; a dropped one is cancelled, and a cancelled task is not
    // scheduled by a wake. `spawn::<H, _>` set this block's host.
    let host: *const H = unsafe { host::<H>(runner.metadata()) };
    // A leftover wake of a step that is not due (see `core::due`) asks for
    // nothing: dispatched, it runs nothing either.
    if super::resident_units::must_ask(runner.metadata())
        && due::on_wake(&runner.metadata().status) == Wake::Due
    {
        // SAFETY: as above.
        return super::resident_units::ask(runner, unsafe { &*host });
    }
    // Shared work goes where other workers take it: as a pool takes an op
    // that woke itself (`yielded`).
    let shared = SHARING.get();
    // SAFETY: as above.
    unsafe { (*host).dispatch(runner, shared) };
}

/// The future of a resident task: parks on its first poll, then runs its
/// op each time it is woken; `GATED` (a slow step's), only while the op is
/// due in the replay in flight (`core::due`), ignoring leftover wakes. It
/// never completes.
struct ResidentFuture<D, const GATED: bool> {
    driver: *const D,
    op: u32,
    parked: bool,
    /// The task's own block (its metadata, which outlives this future).
    block: *const OpBlock,
}

impl<D, const GATED: bool> ResidentFuture<D, GATED> {
    fn new(driver: *const D, op: u32, block: &OpBlock) -> Self {
        Self {
            driver,
            op,
            parked: false,
            block,
        }
    }
}

// SAFETY: the driver is `Sync` (a `Driver` is), and so is the block (an
// `OpBlock`); only shared references to them are made.
unsafe impl<D: Driver, const GATED: bool> Send for ResidentFuture<D, GATED> {}

impl<D: Driver, const GATED: bool> Future for ResidentFuture<D, GATED> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if !self.parked {
            self.parked = true;
            return Poll::Pending;
        }
        // SAFETY: the block is this task's metadata, which lives as long as
        // the task, longer than its future.
        if GATED && due::on_wake(unsafe { &(*self.block).status }) == Wake::Stale {
            // A leftover wake (see `core::due`): the replay that the step
            // ran in may be over and its graph gone; nothing of it is
            // touched.
            return Poll::Pending;
        }
        // SAFETY: woken (and due, if gated), so a replay is in flight and
        // waits for this op, which keeps the driver alive
        // (`Resident::spawn`'s contract).
        unsafe { (*self.driver).run(self.op) };
        Poll::Pending
    }
}

/// Runs recorded op `op` (its block, context and body) once, on the calling thread: skipped if an input
/// is poisoned or deleted, else its body, panics caught. A failure poisons
/// what it mutates (and is recorded by the host); every mutated variable's
/// version is counted, as a pushed op's end counts it (the replay's own op,
/// a `Mode::Replay` op, counts none).
///
/// The caller guarantees that the op may touch its variables now: every
/// op it depends on in the replay has ended, and the replay holds the
/// grants of its variables from outside the graph.
#[inline(always)]
pub(crate) fn run_recorded<H: Host>(op: &Resident, body: &RecordedBody, host: &H) -> Ran {
    let (edges, ctx) = (op.edges(), &op.ctx);
    let op = op.block();
    let ran = match op.blocked_by_edges(edges, false) {
        Some(Skip::Poisoned { input, cause }) => {
            op.fail(&cause);
            Ran::skipped(input, cause)
        }
        Some(Skip::Deleted(var)) => failed(op, FailureKind::InputDeleted(var), host),
        Some(Skip::Cancelled) => unreachable!("a recorded op is never cancelled"),
        None => {
            let result = {
                let _current = CurrentOp::enter(op);
                catch_unwind(AssertUnwindSafe(|| body(ctx.lend())))
            };
            match result {
                Ok(Ok(())) => Ran::Succeeded,
                Ok(Err(e)) => failed(op, FailureKind::Error(e), host),
                Err(payload) => failed(
                    op,
                    FailureKind::Panic(panic_message(payload.as_ref())),
                    host,
                ),
            }
        }
    };
    // Writes come first among the edges.
    for e in edges.iter().take_while(|e| e.is_write()) {
        e.var.bump_version();
    }
    ran
}

/// The op failed with `kind`: its outputs are poisoned, the host records it.
fn failed<H: Host>(op: &OpBlock, kind: FailureKind, host: &H) -> Ran {
    let failure = op.failure(kind);
    op.fail(&failure);
    host.record_failure(failure.clone());
    Ran::Failed(failure)
}

/// Clears the poison a failed replay left on the intermediates of graph
/// `graph` that recorded op `op` mutates: each replay starts them afresh.
///
/// Called only while no op of the graph runs (a replay arming), on the
/// graph's own intermediates, which no other op may declare.
pub(crate) fn clear_graph_poison(op: &OpBlock, graph: u64) {
    for e in op
        .edges()
        .iter()
        .filter(|e| e.is_write() && e.var.graph() == graph)
    {
        // SAFETY: only the graph's ops touch its intermediates, and none
        // runs while a replay arms: the access is exclusive.
        unsafe {
            if matches!(e.var.state(), VarState::Poisoned(_)) {
                e.var.set_state(VarState::Live);
            }
        }
    }
}
