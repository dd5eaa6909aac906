//! Assembling an engine's [`Diagnostics`]: its resources, the ops its broker
//! parked for units, and (if it tracks its ops) every unfinished one, who
//! holds units, who waits for whom and the cycles; and the watchdog thread,
//! which takes that report when the engine stalls.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::shared::Shared;
use crate::error::Error;
use crate::trace::{
    Diagnostics, OpReport, OpState, ResourceReport, STUCK_AFTER, Stall, Watchdog, analyse,
};

/// Ops pushed and not finished: what `Engine::in_flight` and
/// `Diagnostics::in_flight` both say.
///
/// With a bound, the room's count: a producer waiting for room
/// (`when_room`) must never see more than the bound, and an op leaves the
/// room just before it leaves the `wait_all` count (which must come last:
/// it lets shutdown free the engine). Without one, the room counts nothing
/// and the `wait_all` count is the number.
pub(super) fn in_flight(shared: &Shared) -> usize {
    if shared.room.is_bounded() {
        shared.room.in_flight()
    } else {
        shared.pending.in_flight()
    }
}

/// A snapshot of what `shared` is waiting for.
pub(super) fn report(shared: &Shared) -> Diagnostics {
    let mut parked = HashSet::new();
    let mut waiting_for_units = Vec::new();
    shared.broker.for_each_waiting(|runner| {
        let op = runner.metadata();
        parked.insert(std::ptr::from_ref(op) as usize);
        let mut report = OpReport::of(op, None);
        report.state = OpState::Units(OpReport::units_of(op));
        waiting_for_units.push(report);
    });
    let mut resources: Vec<ResourceReport> = shared
        .broker
        .pools()
        .into_iter()
        .map(|p| ResourceReport {
            name: p.name,
            capacity: p.capacity,
            free: p.free,
            held_by_ops: Vec::new(),
            held_by_vars: Vec::new(),
        })
        .collect();
    let tracker = shared.tracker();
    let quiet = tracker.map(|t| match watchdog(shared) {
        // Recorded ops' runs are progress too (a watchdog counts them).
        Some(dog) => dog.progress(t, Instant::now()).1,
        None => t.progress().1,
    });
    let mut tracked = tracker.map(|t| t.report(&parked, &mut resources));
    let name = |i: u16| shared.devices[usize::from(i)].name.clone();
    for op in waiting_for_units
        .iter_mut()
        .chain(tracked.iter_mut().flatten())
    {
        op.device = name(op.device_index);
    }
    let mut report = Diagnostics {
        in_flight: in_flight(shared),
        resources,
        waiting_for_units,
        tracked,
        quiet,
        waits: Vec::new(),
        cycles: Vec::new(),
        in_cycle: Vec::new(),
        freers: Vec::new(),
    };
    if let Some(tracker) = tracker {
        let devices: Vec<(String, Option<usize>)> = shared
            .devices
            .iter()
            .zip(tracker.workers())
            .map(|(d, &workers)| (d.name.clone(), workers))
            .collect();
        // A watchdog shorter than the default judges stuck workers sooner.
        let stuck_after = watchdog(shared).map_or(STUCK_AFTER, |w| w.period().min(STUCK_AFTER));
        analyse(&mut report, &devices, stuck_after);
    }
    report
}

/// The engine's watchdog, if it has one.
pub(super) fn watchdog(shared: &Shared) -> Option<&Watchdog> {
    shared.observer.as_ref()?.watchdog.as_ref()
}

/// Stops the watchdog thread of `shared`, if it has one, and joins it
/// (unless called on that thread). Again: nothing.
pub(super) fn stop_watchdog(shared: &Shared) {
    if let Some(dog) = watchdog(shared) {
        dog.stop();
    }
}

/// Starts the watchdog thread of `shared`, if it has a watchdog. The thread
/// holds the engine weakly and ends when the engine's shutdown stops it (or
/// the engine is gone).
pub(super) fn start_watchdog(shared: &Arc<Shared>) -> Result<(), Error> {
    let Some(dog) = watchdog(shared) else {
        return Ok(());
    };
    let weak = Arc::downgrade(shared);
    let thread = std::thread::Builder::new()
        .name("depflow-watch".into())
        .spawn(move || watch(&weak))
        .map_err(|e| Error::Config(format!("cannot start the watchdog thread: {e}")))?;
    dog.set_thread(thread);
    Ok(())
}

/// The watchdog thread: a look every tick, a report once per stall.
fn watch(weak: &Weak<Shared>) {
    let mut stall = Stall::new();
    let mut last = Instant::now();
    loop {
        let tick = {
            // Only for the look: the engine is never kept alive by this
            // thread between looks.
            let Some(shared) = weak.upgrade() else {
                return;
            };
            let (Some(dog), Some(tracker)) = (watchdog(&shared), shared.tracker()) else {
                return;
            };
            if dog.is_stopped() {
                return;
            }
            let now = Instant::now();
            let (progress, quiet) = dog.progress(tracker, now);
            let elapsed = now.saturating_duration_since(last);
            last = now;
            if stall.look(
                shared.pending.in_flight(),
                progress,
                quiet,
                elapsed,
                dog.period(),
            ) {
                dog.report(&report(&shared));
            }
            dog.tick()
        };
        std::thread::park_timeout(tick);
    }
}
