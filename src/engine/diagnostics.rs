//! Assembling an engine's [`Diagnostics`]: its resources, the ops its broker
//! parked for units, and (if it tracks its ops) every unfinished one.

use std::collections::HashSet;

use super::shared::Shared;
use crate::trace::{Diagnostics, OpReport, OpState, ResourceReport};

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
    Diagnostics {
        in_flight: shared.pending.in_flight(),
        resources: shared
            .broker
            .pools()
            .into_iter()
            .map(|p| ResourceReport {
                name: p.name,
                capacity: p.capacity,
                free: p.free,
            })
            .collect(),
        waiting_for_units,
        tracked: shared.tracker.as_ref().map(|t| t.report(&parked)),
    }
}
