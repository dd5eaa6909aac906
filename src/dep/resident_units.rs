//! Recorded ops with resource units: how a graph's op that declared units
//! ([`RecordOp::uses`](crate::RecordOp::uses)) takes them in each replay.
//!
//! Such an op never runs inline on the thread that made it ready: its
//! resident task is woken, and its schedule function (`resident`'s) asks
//! the host's broker for its units first ([`ask`]), as a pushed op's
//! readiness does (`lifecycle::ready`). The broker parks the task's
//! runnable, holding nothing and blocking no thread, until the units are
//! free; then it goes to its device's executor, and runs through the
//! graph's driver. When it ends, [`give_back_units`] returns them (and
//! resets the op's flags for the next replay).
//!
//! Its tickets (its place in push order on each resource) are drawn by the
//! replay's op at its push, under the push lock, for all its recorded ops
//! at once, in recorded order; the replay writes them into the ops'
//! demands when it arms ([`set_tickets`]), before any of them can ask.
//! Every ticket is either taken by a grant or given up (skipped op, or a
//! replay that never ran), once per replay.
//!
//! Only temporary units are recorded: lasting ones (`allocates`) are
//! refused at recording, planned buffers being a graph's memory.
//!
//! | field (`OpUnits`) | written by | read by |
//! | --- | --- | --- |
//! | tickets | the replay's op when it arms (no op of the replay runs yet) | the broker, after the op's wake |
//! | `held`, `skipped` | `ask` and the broker's grant, then `give_back_units` at the op's end | the schedule function, the op's run |

use super::block::{OpBlock, Runner};
use super::host::{Host, Units};
use std::sync::atomic::Ordering::Relaxed;

/// Whether a woken resident task must first get its units: it has some,
/// and has neither got them nor given up its tickets in this replay.
#[inline]
pub(super) fn must_ask(op: &OpBlock) -> bool {
    op.units().is_some_and(|u| !u.is_held() && !u.is_skipped())
}

/// Asks for the units of recorded op `runner` (ready in its replay): it is
/// dispatched once they are granted; if it will be skipped (a poisoned or
/// deleted input), it gives its tickets up and is dispatched at once.
pub(super) fn ask<H: Host>(runner: Runner, host: &H) {
    let op = runner.metadata();
    let units = op.units().expect("asked for units");
    // The op holds its variables in the replay (its predecessors ended).
    if op.blocked_by(host.has_streams()).is_some() {
        units.mark_skipped();
        host.retire_tickets(units.as_request(), op);
        host.dispatch(runner, false);
    } else {
        host.request_units(runner);
    }
}

/// Recorded op `op` ended in this replay (its device work done, if any):
/// gives its units back, if it got them, and readies it for the next
/// replay.
pub(crate) fn give_back_units<H: Host>(op: &OpBlock, host: &H) {
    if let Some(units) = op.units() {
        let held = units.is_held();
        units.reset();
        if held {
            host.give_back_units(&units.returns(), Units::Op(op));
        }
    }
}

/// Writes recorded op `op`'s tickets for the replay being armed: demand
/// `i`'s is `ticket(i, resource pool)`.
pub(crate) fn set_tickets(op: &OpBlock, mut ticket: impl FnMut(usize) -> u64) {
    if let Some(units) = op.units() {
        for (resource, demand) in units.demands() {
            demand.ticket.store(ticket(resource.pool()), Relaxed);
        }
    }
}
