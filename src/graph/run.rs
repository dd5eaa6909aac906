//! Running a recorded graph: its ops' resident tasks, the replay's
//! countdowns, and the replay's own op ([`ReplayBody`]), which holds the
//! graph's variables from outside while the replay runs.
//!
//! One replay, step by step:
//!
//! 1. The engine pushes the replay's op, declaring each boundary variable
//!    once (mutated if any recorded op mutates it) and the graph's token
//!    (mutated: replays of one graph run one after the other). It is
//!    granted like any op, in push order.
//! 2. Its body arms the countdowns, clears what the previous replay
//!    poisoned inside the graph, wakes the graph's first ops and runs one
//!    of them itself.
//! 3. An op that ends satisfies its successors: the first one made ready
//!    on the same device runs at once on the same thread (no queue round
//!    trip: a recorded chain runs as a loop); more on that device (of
//!    priority 0) are kept on this thread's stack ([`Ready`]) to run next,
//!    and the others are woken onto their devices' executors. Kept ops are
//!    handed to the executor as it wants them (`Host::wanted`: its idle
//!    workers), and all of them when an op of higher priority was woken on
//!    this device (the executor orders them). That happens between two ops
//!    of this thread only: a worker that goes idle while the thread runs an
//!    op gets nothing until its end. So an op that an earlier replay
//!    measured as long next to the others (`long_ops.rs`) is not run
//!    inline: it is woken like an op of another device (an idle worker
//!    takes it), and the thread goes on with the others.
//!    So a replay wakes an op (some 250 instructions: the task's wake, the
//!    queue, the task's run) only to hand it to another worker.
//! 4. The op that ends last wakes the replay's op, which resolves to the
//!    replay's first failure and releases the boundary variables.
//!
//! Ops on stream devices and ops with units are *slow steps* (`run_slow`):
//! always woken, never run inline; a stream op counts itself out only once
//! its device work is done.
//!
//! A host that watches recorded ops (`Host::watches_recorded`: a trace,
//! `tracing` spans, or a watchdog, for which they are progress) is told of each run, with the replay's op (its address,
//! kept as the replay arms): `run_watched`, apart from the loop, so that a
//! host that watches nothing pays one branch per op.

// `unsafe`: spawning the resident tasks, whose contract the runtime keeps;
// the block says why it is sound.
#![allow(unsafe_code)]

#[path = "run_slow.rs"]
mod slow;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use self::slow::{Kind, NO_INLINE, ReplayTickets, Slow, UnitsPlan};
use super::long_ops::LongOps;
use crate::core::replay::{Countdowns, Left, Satisfied};
use crate::dep::{
    Body, Driver, Env, Host, OpBlock, OpSpec, OpUnits, Ran, RecordedBody, RecordedRun, Resident,
    run_recorded, run_settled,
};
use crate::error::{BoxError, Error};
use crate::loom::sync::Mutex;

/// One recorded op, as a replay runs it.
pub(crate) struct Step {
    pub(crate) resident: Resident,
    pub(crate) body: RecordedBody,
    /// The device it runs inline on: its own, or [`NO_INLINE`] for a slow
    /// step or one measured as long (`long_ops.rs`), which are always woken.
    /// Set when a measuring replay ends, read as the next replays make the
    /// op ready: a hint (`Relaxed`), since inline or woken the op runs the
    /// same.
    inline_on: AtomicU16,
    pub(crate) priority: i32,
    kind: Kind,
    slow: Option<Box<Slow>>,
}

impl Step {
    /// Its device, whether or not it runs inline (`inline_on`).
    #[inline]
    pub(crate) fn device(&self) -> u16 {
        self.resident.block().device_index()
    }

    /// Wakes the step, which this thread made ready (a root as the replay
    /// arms, or its countdown reached zero here): a slow step is made due
    /// first, its task gated (see `core::due`).
    #[inline]
    fn wake(&self) {
        if self.slow.is_some() {
            self.resident.make_due();
        }
        self.resident.wake();
    }
}

/// How many ready ops one thread keeps to run itself (a power of two).
const KEEP: usize = 64;

/// The ready ops a thread keeps to run itself, in the order they became
/// ready: a ring on its stack (no allocation).
struct Ready {
    ops: [u32; KEEP],
    head: usize,
    len: usize,
    /// In a measuring replay: when the last op that ended while others
    /// were kept ended, and its rank in its `run_from` (`Runtime::stamp`).
    stamp: Option<(std::time::Instant, u32)>,
}

impl Ready {
    fn new() -> Self {
        Self {
            ops: [0; KEEP],
            head: 0,
            len: 0,
            stamp: None,
        }
    }

    #[inline]
    fn push(&mut self, op: u32) {
        debug_assert!(self.len < KEEP);
        self.ops[(self.head + self.len) % KEEP] = op;
        self.len += 1;
    }

    #[inline]
    fn pop_front(&mut self) -> Option<u32> {
        (self.len != 0).then(|| {
            let op = self.ops[self.head];
            self.head = (self.head + 1) % KEEP;
            self.len -= 1;
            op
        })
    }

    #[inline]
    fn pop_back(&mut self) -> Option<u32> {
        (self.len != 0).then(|| {
            self.len -= 1;
            self.ops[(self.head + self.len) % KEEP]
        })
    }
}

/// The order a replay follows, from the analysis.
pub(crate) struct Schedule {
    /// Per op, the ops it waits for.
    pub(crate) preds: Box<[u32]>,
    /// Per op, where its successors start in `succ` (one more entry than
    /// ops).
    pub(crate) succ_start: Box<[u32]>,
    pub(crate) succ: Box<[u32]>,
    /// The ops that wait for none, in recorded order.
    pub(crate) roots: Box<[u32]>,
    /// The graph's device memory: given back, in stream order, when the
    /// runtime goes (no replay in flight, all their device work done).
    /// Held for its drop (never read: hence the underscore).
    pub(crate) _device_arenas: crate::dep::DeviceArenas,
}

/// A recorded graph's runtime, shared by its handle and the replay in
/// flight.
///
/// | field | written by | read by |
/// | --- | --- | --- |
/// | `steps` (resident tasks, bodies, kinds), `schedule`, `host`, `graph`, `units` | the recording's end | replays |
/// | a slow step's `StreamSlot` | see `dep::resident_stream` | |
/// | the recorded ops' tickets | the replay's op as it arms (`slow`) | the broker |
/// | `countdowns` | see `core::replay` | |
/// | `failure`, `failed` | the replay's ops, as they fail; the replay's op (taking it, at its end; clearing `failed` when it arms) | the same |
pub(crate) struct Runtime<H: Host> {
    steps: Box<[Step]>,
    schedule: Schedule,
    countdowns: Countdowns,
    /// How long its ops take, measured in some replays.
    long_ops: LongOps,
    /// The replay's first failure.
    failure: Mutex<Option<Error>>,
    /// Some op failed or was skipped in the last replay: its poison inside
    /// the graph is cleared when the next one arms.
    failed: AtomicBool,
    /// The id of the graph, which its intermediates carry.
    graph: u64,
    /// The address of the replay's op in flight: how a host that watches
    /// recorded ops (`Host::watches_recorded`) tells their replay. Set as
    /// it arms, read by its recorded ops (their wakes order the two).
    replay: AtomicUsize,
    host: Arc<H>,
    /// The units its ops take, if any (see `slow`).
    units: Option<Arc<UnitsPlan>>,
}

impl<H: Host> std::fmt::Debug for Runtime<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("ops", &self.steps.len())
            .finish_non_exhaustive()
    }
}

impl<H: Host> Runtime<H> {
    /// The runtime of graph `graph` on `host`: one step per recorded op,
    /// made of its spec and its body, with its resident task.
    pub(crate) fn new(
        graph: u64,
        host: Arc<H>,
        schedule: Schedule,
        ops: Vec<(OpSpec, RecordedBody)>,
    ) -> Arc<Self> {
        let n = ops.len();
        let units = UnitsPlan::new(ops.iter().map(|(spec, _)| spec));
        Arc::new_cyclic(|me| {
            let driver: *const Self = me.as_ptr();
            let steps = ops
                .into_iter()
                .enumerate()
                .map(|(i, (spec, body))| {
                    let (kind, slow) = slow::kind_of(&spec, &*host);
                    let gated = slow.is_some();
                    let inline_on = if gated { NO_INLINE } else { spec.device_index };
                    Step {
                        inline_on: AtomicU16::new(inline_on),
                        priority: spec.priority,
                        kind,
                        slow,
                        // SAFETY: a resident task is woken only by this runtime
                        // (`run_from`, `ReplayBody`, `slow`), or for it (the
                        // broker, fences, the poller) while a replay is in
                        // flight and waits for the op, and the replay's op
                        // holds the runtime (the driver, at `driver` once
                        // built) and with it the host.
                        // A slow step's task is gated: fences wake it too
                        // (see `core::due`).
                        resident: unsafe { Resident::spawn(spec, &*host, driver, i as u32, gated) },
                        body,
                    }
                })
                .collect();
            Self {
                steps,
                schedule,
                countdowns: Countdowns::new(n),
                long_ops: LongOps::new(n),
                failure: Mutex::new(None),
                failed: AtomicBool::new(false),
                graph,
                replay: AtomicUsize::new(0),
                host,
                units,
            }
        })
    }

    /// The host the graph's ops run on.
    pub(crate) fn host(&self) -> &H {
        &self.host
    }

    /// The recorded ops, in recorded order.
    pub(crate) fn steps(&self) -> &[Step] {
        &self.steps
    }

    fn successors(&self, op: u32) -> &[u32] {
        let s = &self.schedule.succ_start;
        &self.schedule.succ[s[op as usize] as usize..s[op as usize + 1] as usize]
    }

    /// Keeps the replay's first failure.
    #[cold]
    fn fail(&self, error: Error) {
        self.failed.store(true, Ordering::Relaxed);
        let mut first = self.failure.lock();
        if first.is_none() {
            *first = Some(error);
        }
    }

    /// Arms a replay; returns whether it has ops.
    fn arm(&self) -> bool {
        if self.failed.swap(false, Ordering::Relaxed) {
            for step in self.steps.iter() {
                crate::dep::clear_graph_poison(step.resident.block(), self.graph);
                crate::dep::clear_graph_fences(step.resident.block(), self.graph);
            }
        }
        self.long_ops.arm();
        self.countdowns.arm(&self.schedule.preds)
    }

    /// Op `op` became ready on a thread that runs ops of device `device`
    /// and has `next` to run next: the first one that runs inline on this
    /// device becomes `next` whatever its priority (a chain runs as a loop);
    /// more are kept in `ready` at priority 0, as many as fit; the others
    /// are woken onto their devices' executors. Returns whether it woke an
    /// op of higher priority that may be on this device (a slow or long one
    /// of any device: a test of its device here would cost every woken op),
    /// which this thread should then not hold its kept ops back from.
    #[inline]
    fn make_ready(&self, next: &mut Option<u32>, ready: &mut Ready, device: u16, op: u32) -> bool {
        let step = &self.steps[op as usize];
        let inline_on = step.inline_on.load(Ordering::Relaxed);
        if inline_on == device {
            if next.is_none() {
                *next = Some(op);
                return false;
            }
            if step.priority == 0 && ready.len < KEEP {
                ready.push(op);
                return false;
            }
        }
        step.wake();
        // Of higher priority and perhaps on this device (a slow or long op
        // of any device): the executor orders it before the kept ones.
        step.priority > 0 && (inline_on == device || inline_on == NO_INLINE)
    }

    /// Hands kept ops on: all of them if `urgent` (an op of higher priority
    /// waits: the executor orders them), else as many as the executor of
    /// `device` wants now (`Host::wanted`: enough to keep its other
    /// workers busy), latest first.
    #[inline(always)]
    fn share(&self, ready: &mut Ready, device: u16, urgent: bool) {
        let n = if urgent {
            ready.len
        } else {
            self.host.wanted(device).min(ready.len)
        };
        for _ in 0..n {
            let s = ready.pop_back().expect("kept");
            self.steps[s as usize].resident.share();
        }
    }

    /// In a measuring replay, at the end of op `op`, the `done`-th this
    /// thread ran in this `run_from`, while ops are kept: if the op before
    /// it ended so too, the time since is `op`'s run, its measure.
    #[cold]
    #[inline(never)]
    fn stamp(&self, ready: &mut Ready, op: u32, done: u32) {
        let now = std::time::Instant::now();
        if let Some((prev, last)) = ready.stamp
            && last.wrapping_add(1) == done
        {
            self.long_ops.record(op, now - prev);
        }
        ready.stamp = Some((now, done));
    }

    /// Runs op `op` (ready), then, while an op it ends makes one on the
    /// same device ready, that one; then the ops kept in `ready` (of the
    /// same device), and those they make ready, until none is left. Kept
    /// ops are shared with the device's idle workers as it goes.
    ///
    /// The ops it ran are counted out of the replay together when it stops
    /// (`Countdowns::ops_done`): at T >= 2, a count per op was a write to
    /// the counter every worker shares, its cache line moving between them
    /// at every op.
    fn run_from(&self, op: u32, ready: &mut Ready) {
        if self.long_ops.is_sampling() {
            self.run_ops::<true>(op, ready)
        } else {
            self.run_ops::<false>(op, ready)
        }
    }

    /// `run_from`'s loop; `MEASURE`: this replay times its ops (`stamp`), in
    /// a copy of the loop apart, so that the others test nothing per op.
    fn run_ops<const MEASURE: bool>(&self, mut op: u32, ready: &mut Ready) {
        let device = self.steps[op as usize].device();
        let mut done = 0;
        loop {
            let step = &self.steps[op as usize];
            // Not watching, the one branch on the host's observer per op:
            // then the same match as ever.
            let ran = match step.kind {
                Kind::Host | Kind::Settled if self.host.watches_recorded() => {
                    self.run_watched(step, |step| self.run_unwatched(step))
                }
                Kind::Host => run_recorded(&step.resident, &step.body, &*self.host),
                Kind::Settled => run_settled(&step.resident, &step.body, &*self.host),
                Kind::Units | Kind::Stream => {
                    // `op` is not counted out yet: this cannot be the last.
                    if done != 0 {
                        let _ = self.countdowns.ops_done(done);
                    }
                    return self.run_slow(op);
                }
            };
            match ran {
                Ran::Succeeded => {}
                Ran::Failed(f) => self.fail(Error::Failed(f)),
                Ran::Skipped(p) => self.fail(Error::Poisoned {
                    input: p.input,
                    cause: p.cause,
                }),
            }
            let (mut next, mut urgent) = (None, false);
            for &s in self.successors(op) {
                if self.countdowns.satisfy(s) == Satisfied::Ready {
                    urgent |= self.make_ready(&mut next, ready, device, s);
                }
            }
            if ready.len != 0 {
                self.share(ready, device, urgent);
                if MEASURE {
                    self.stamp(ready, op, done);
                }
            }
            done += 1;
            match next.or_else(|| ready.pop_front()) {
                Some(s) => op = s,
                None => {
                    // After the last op is counted out nothing here may be
                    // touched (the replay's op may free the graph); the ops
                    // handed on are not counted out yet, so a thread that
                    // handed one on is not the last.
                    let _: Left = self.countdowns.ops_done(done);
                    return;
                }
            }
        }
    }
}

impl<H: Host> Runtime<H> {
    /// Runs host step `step` (of kind `Host`, `Settled` or `Units`) on this
    /// thread; a host that watches recorded ops is told of the run.
    fn run_host(&self, step: &Step) -> Ran {
        if self.host.watches_recorded() {
            return self.run_watched(step, |step| self.run_unwatched(step));
        }
        self.run_unwatched(step)
    }

    /// Runs host step `step` on this thread, untold.
    #[inline(always)]
    fn run_unwatched(&self, step: &Step) -> Ran {
        let host = &*self.host;
        match step.kind {
            Kind::Host => run_recorded(&step.resident, &step.body, host),
            Kind::Settled => run_settled(&step.resident, &step.body, host),
            Kind::Units if host.has_streams() => run_settled(&step.resident, &step.body, host),
            Kind::Units => run_recorded(&step.resident, &step.body, host),
            Kind::Stream => unreachable!("a stream step is enqueued, not run"),
        }
    }

    /// Runs `step` through `run`, telling the host of it: started, then
    /// ended (or deferred, if `run` says the step did not run yet).
    #[cold]
    #[inline(never)]
    fn run_watched<T: WatchedRun>(&self, step: &Step, run: impl FnOnce(&Step) -> T) -> T {
        let (op, replay) = (step.resident.block(), self.replay.load(Ordering::Relaxed));
        self.host.on_recorded(op, replay, RecordedRun::Started);
        let ran = run(step);
        let end = if ran.deferred() {
            RecordedRun::Deferred
        } else {
            RecordedRun::Ended
        };
        self.host.on_recorded(op, replay, end);
        ran
    }
}

/// What a step's run returns, as its watcher needs it.
trait WatchedRun {
    /// The step did not run yet (a stream op waiting for device work).
    fn deferred(&self) -> bool;
}

impl WatchedRun for Ran {
    fn deferred(&self) -> bool {
        false
    }
}

impl<H: Host> Driver for Runtime<H> {
    fn run(&self, op: u32) {
        self.run_from(op, &mut Ready::new());
    }
}

/// The body of a replay's op: arms the replay, starts its first ops, and
/// resolves once every op of it has ended, to its first failure if any.
pub(crate) struct ReplayBody<H: Host> {
    runtime: Option<Arc<Runtime<H>>>,
    armed: bool,
    /// The recorded ops' tickets, if they take units.
    tickets: Option<Arc<ReplayTickets>>,
}

impl<H: Host> ReplayBody<H> {
    pub(crate) fn new(runtime: Arc<Runtime<H>>) -> Self {
        let tickets = runtime.units.clone().map(ReplayTickets::new);
        Self {
            runtime: Some(runtime),
            armed: false,
            tickets,
        }
    }

    /// The units of the replay's op: none, but its push draws its recorded
    /// ops' tickets (None if they take no units).
    pub(crate) fn units(&self) -> Option<Box<OpUnits>> {
        let tickets = self.tickets.clone()?;
        Some(OpUnits::drawing(tickets))
    }

    /// Gives up the tickets of a replay that never armed.
    fn give_up_tickets(&mut self) {
        if let (Some(runtime), Some(tickets)) = (&self.runtime, self.tickets.take())
            && !self.armed
        {
            runtime.give_up_tickets(&tickets);
        }
    }
}

impl<H: Host> Drop for ReplayBody<H> {
    fn drop(&mut self) {
        self.give_up_tickets();
    }
}

impl<H: Host> Unpin for ReplayBody<H> {}

impl<H: Host> Body for ReplayBody<H> {
    type Output = Option<Error>;
    const SYNC: bool = false;

    fn poll_body(
        self: Pin<&mut Self>,
        op: &OpBlock,
        _env: &Env<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Error>, BoxError>> {
        let this = self.get_mut();
        let runtime = this.runtime.as_ref().expect("replay polled after it ended");
        if !this.armed {
            this.armed = true;
            runtime
                .replay
                .store(std::ptr::from_ref(op) as usize, Ordering::Relaxed);
            if let Some(tickets) = &this.tickets {
                runtime.set_tickets(tickets);
            }
            if runtime.arm() {
                // Wake the first ops, keeping those on this device that
                // fit to run here.
                let (mut here, mut ready, mut urgent) = (None, Ready::new(), false);
                let device = op.device_index();
                for &r in runtime.schedule.roots.iter() {
                    urgent |= runtime.make_ready(&mut here, &mut ready, device, r);
                }
                if let Some(r) = here {
                    runtime.share(&mut ready, device, urgent);
                    runtime.run_from(r, &mut ready);
                }
            }
        }
        match runtime.countdowns.poll_done(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                runtime.long_ops.settle(|op, long| {
                    let step = &runtime.steps[op as usize];
                    debug_assert!(step.slow.is_none(), "only ops run inline are measured");
                    let on = if long { NO_INLINE } else { step.device() };
                    step.inline_on.store(on, Ordering::Relaxed);
                });
                Poll::Ready(Ok(runtime.failure.lock().take()))
            }
        }
    }

    fn discard(self: Pin<&mut Self>) {
        let this = self.get_mut();
        this.give_up_tickets();
        this.runtime = None;
    }
}
