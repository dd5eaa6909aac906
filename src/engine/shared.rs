//! The engine's shared state ([`Shared`]): its devices, its counts of ops in
//! flight, the broker of its resources, its failure log; and how it serves
//! its ops as their [`Host`] and its resources as their [`Ledger`].
//!
//! # What serialises what
//!
//! A push of an op on **one** variable takes no lock: it is one append to that
//! variable's chain. A push on **several** variables links its edges while
//! holding the engine's push lock, so that every variable's chain sees
//! multi-variable ops in one global order. Without it, two threads pushing
//! `(read A, mutate B)` and `(mutate A, read B)` could each get ahead of the
//! other on one variable: a wait-for cycle. The lock is cheap: it is held for
//! one `swap` and one `fetch_or` per variable, never while granting or running
//! anything, and uncontended when one thread pushes. Single-variable ops need
//! no place in the global order: a cycle through one of them can be shortened
//! to one through multi-variable ops only, since its two neighbours are
//! ordered on its single variable.
//!
//! # Who touches what
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `id`, `devices`, `has_streams`, `observer` (presence) | `EngineBuilder::build` | anyone |
//! | `pending`, `room`, `broker`, `observer` | see `core` and `trace` | |
//! | `closed` | `close` (shutdown) | pushes |
//! | `failures` | failing ops, `wait_all` (under its lock) | the same |

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::executor::Exec;
use crate::core::generations::{Generations, Signal};
use crate::core::room::Room;
use crate::core::tickets::Broker;
use crate::dep::{Host, OpBlock, RecordedRun, Runner, Units, take_late_failures};
use crate::device::StreamDevice;
use crate::error::{Error, OpFailure, VarId};
use crate::loom::sync::Mutex;
use crate::resource::Ledger;
use crate::trace::{Observer, Recorder, Tracker};

/// State shared by an engine's handles and its ops.
pub(crate) struct Shared {
    pub(super) id: u64,
    pub(super) devices: Box<[DeviceSlot]>,
    /// The ops in flight, for `wait_all` and shutdown.
    pub(super) pending: Generations,
    push_lock: Mutex<()>,
    /// Shut down: new pushes are refused.
    closed: AtomicBool,
    failures: Mutex<FailureLog>,
    /// The units of the engine's resources, and the ops waiting for them.
    pub(super) broker: Broker<Runner>,
    /// The bound on ops in flight.
    pub(super) room: Room,
    /// The registry of unfinished ops and the trace recorder, if either is
    /// on: one branch per hook when neither is.
    pub(super) observer: Option<Box<Observer>>,
    /// Some device is a stream device: ops must mind the variables' fences.
    has_streams: bool,
}

/// One device of the engine.
pub(crate) struct DeviceSlot {
    pub(super) name: String,
    pub(super) exec: Exec,
}

#[derive(Default)]
struct FailureLog {
    first: Option<Arc<OpFailure>>,
    count: usize,
}

impl Shared {
    pub(super) fn new(
        id: u64,
        devices: Box<[DeviceSlot]>,
        max_in_flight: usize,
        observer: Option<Box<Observer>>,
    ) -> Self {
        Self {
            has_streams: devices.iter().any(|d| d.exec.stream_device().is_some()),
            id,
            devices,
            pending: Generations::default(),
            push_lock: Mutex::new(()),
            closed: AtomicBool::new(false),
            failures: Mutex::new(FailureLog::default()),
            broker: Broker::default(),
            room: Room::new(max_in_flight),
            observer,
        }
    }

    /// Counts a new op in: returns its generation, or `ShutDown`.
    #[inline]
    /// Whether the engine is shut down (it takes no new work).
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    #[inline]
    pub(super) fn admit(&self) -> Result<u8, Error> {
        let generation = self.pending.enter();
        if self.closed.load(Ordering::SeqCst) {
            self.pending.leave(generation);
            return Err(Error::ShutDown);
        }
        self.room.enter();
        Ok(generation)
    }

    /// Counts one of the engine's own waits in (`Mode::Wait`): as `admit`,
    /// but outside the bound on ops in flight (`retire` leaves it out too):
    /// a wait is no work a producer runs ahead with.
    pub(super) fn admit_wait(&self) -> Result<u8, Error> {
        let generation = self.pending.enter();
        if self.closed.load(Ordering::SeqCst) {
            self.pending.leave(generation);
            return Err(Error::ShutDown);
        }
        Ok(generation)
    }

    /// Counts out an op that `admit` let in but that is not pushed after all.
    pub(super) fn unadmit(&self, generation: u8) {
        self.room.leave();
        self.pending.leave(generation);
    }

    /// Refuses new pushes from now on.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Refuses new pushes and returns a signal that fires once every op
    /// pushed before has finished.
    pub(super) fn close_and_drain(&self) -> Arc<Signal> {
        self.close();
        self.pending.wait()
    }

    /// Takes the failures recorded since the last call, as one error
    /// (with those recorded after their op retired: see `dep::output`).
    pub(super) fn take_failures(&self) -> Result<(), Error> {
        let late = take_late_failures(self.id);
        let mut log = self.failures.lock();
        for failure in late {
            log.first.get_or_insert(failure);
            log.count += 1;
        }
        let count = std::mem::take(&mut log.count);
        match log.first.take() {
            Some(first) => Err(Error::Failures { first, count }),
            None => Ok(()),
        }
    }

    /// The registry of unfinished ops, if the engine tracks them.
    pub(super) fn tracker(&self) -> Option<&Tracker> {
        self.observer.as_ref()?.tracker.as_ref()
    }

    /// The trace recorder, if the engine was built to trace.
    pub(super) fn recorder(&self) -> Option<&Recorder> {
        self.observer.as_ref()?.recorder.as_ref()
    }

    pub(super) fn stop_executors(&self) {
        for device in self.devices.iter() {
            device.exec.shutdown();
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Nobody will take them any more.
        drop(take_late_failures(self.id));
    }
}

impl Host for Shared {
    #[inline]
    fn id(&self) -> u64 {
        self.id
    }

    #[inline]
    fn push_lock(&self) -> &Mutex<()> {
        &self.push_lock
    }

    #[inline]
    fn has_streams(&self) -> bool {
        self.has_streams
    }

    #[inline]
    fn stream_device(&self, device_index: u16) -> Option<&StreamDevice> {
        self.devices[usize::from(device_index)].exec.stream_device()
    }

    #[inline]
    fn dispatch(&self, op: Runner, yielded: bool) {
        let device = usize::from(op.metadata().device_index());
        self.devices[device].exec.schedule(op, yielded);
    }

    #[inline]
    fn wanted(&self, device_index: u16) -> usize {
        self.devices[usize::from(device_index)].exec.wanted()
    }

    fn broker(&self) -> &Broker<Runner> {
        &self.broker
    }

    fn record_failure(&self, failure: Arc<OpFailure>) {
        let mut log = self.failures.lock();
        log.first.get_or_insert(failure);
        log.count += 1;
    }

    #[inline]
    fn retire(&self, op: &OpBlock) {
        if let Some(o) = &self.observer {
            o.retired(op);
        }
        // A wait was admitted outside the bound (`admit_wait`).
        if self.room.is_bounded() && !op.is_wait() {
            self.room.leave();
        }
        self.pending.leave(op.generation());
    }

    #[inline]
    fn on_pushed(&self, op: &OpBlock) {
        if let Some(o) = &self.observer {
            o.pushed(op);
        }
    }

    #[inline]
    fn on_ready(&self, op: &OpBlock, by: Option<&OpBlock>) {
        if let Some(o) = &self.observer {
            o.ready(op, by);
        }
    }

    #[inline]
    fn on_granted(&self, op: &OpBlock, by: Units<'_>) {
        if let Some(o) = &self.observer {
            o.granted(op, by);
        }
    }

    #[inline]
    fn on_units(&self, pools: impl Iterator<Item = usize>) {
        if let Some(o) = &self.observer {
            o.units(pools, |pool| {
                let (capacity, free) = self.broker.units(pool);
                capacity - free
            });
        }
    }

    #[inline]
    fn on_started(&self, op: &OpBlock) {
        if let Some(o) = &self.observer {
            o.started(op);
        }
    }

    #[inline]
    fn on_suspended(&self, op: &OpBlock) {
        if let Some(o) = &self.observer {
            o.suspended(op);
        }
    }

    #[inline]
    fn on_resumed(&self, op: &OpBlock) {
        if let Some(o) = &self.observer {
            o.resumed(op);
        }
    }

    #[inline]
    fn on_enqueued(&self, op: &OpBlock) {
        if let Some(o) = &self.observer {
            o.enqueued(op);
        }
    }

    #[inline]
    fn on_ended(&self, op: &OpBlock) {
        if let Some(o) = &self.observer {
            o.ended(op);
        }
    }

    #[inline]
    fn watches_recorded(&self) -> bool {
        self.observer.as_ref().is_some_and(|o| o.watches_recorded())
    }

    #[inline]
    fn on_recorded(&self, op: &OpBlock, replay: usize, run: RecordedRun) {
        if let Some(o) = &self.observer {
            o.recorded(op, replay, run);
        }
    }
}

impl Ledger for Shared {
    fn free(&self, pool: usize) -> u64 {
        self.broker.units(pool).1
    }

    fn give_back(&self, pool: usize, amount: u64) {
        self.give_back_units(&[(pool, amount)], Units::Var);
    }

    fn tracks_holders(&self) -> bool {
        self.tracker().is_some()
    }

    fn holding(&self, pool: usize, holder: VarId, amount: u64) {
        if let Some(tracker) = self.tracker() {
            tracker.holding(pool, holder, amount);
        }
    }
}
