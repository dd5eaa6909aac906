//! Assembling an engine's [`Diagnostics`]: its resources, the ops its broker
//! parked for units, and (if it tracks its ops) every unfinished one and who
//! holds units.

use std::collections::HashSet;

use super::shared::Shared;
use crate::trace::{Diagnostics, OpReport, OpState, ResourceReport};

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
    let tracked = shared.tracker().map(|t| t.report(&parked, &mut resources));
    Diagnostics {
        in_flight: in_flight(shared),
        resources,
        waiting_for_units,
        tracked,
    }
}
