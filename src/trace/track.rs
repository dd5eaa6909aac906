//! The optional registry of unfinished ops behind
//! [`Engine::diagnostics`](crate::Engine::diagnostics) (see `diag`), fed by
//! the engine's lifecycle hooks (pushed, granted its units, started,
//! suspended and resumed, finished), and of the variables holding units,
//! fed by the engine's ledger.
//!
//! It exists only when the engine tracks its ops: an untracked engine never
//! reads the clock or takes this lock.
//!
//! The one `unsafe` block: a report reads the registered ops, which are
//! alive while registered.

// `unsafe`: reading the registered ops, alive while registered; each block says why it is sound.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use super::diag::{OpReport, OpState, ResourceReport, blockers};
use crate::dep::OpBlock;
use crate::error::VarId;
use crate::loom::sync::{Mutex, MutexGuard};

/// Where a registered op is, as the hooks last told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Pushed, its body not started: waiting for variables, units or a
    /// worker (the report tells which).
    Pushed,
    /// Its body is being polled (or a stream op's device work runs).
    Running,
    /// Its async body returned `Pending`.
    Awaiting,
}

/// One registered op.
struct Entry {
    /// Its place in push order.
    number: u64,
    pushed: Instant,
    phase: Phase,
    /// The broker granted it its units (it holds them until it finishes).
    holds_units: bool,
}

#[derive(Default)]
struct Registry {
    next: u64,
    /// Unfinished ops by address.
    ops: HashMap<usize, Entry>,
    /// Units held by variables: (pool, variable) to amount.
    held: BTreeMap<(usize, VarId), u64>,
}

/// Unfinished ops by address, and the variables holding units.
#[derive(Default)]
pub(crate) struct Tracker {
    registry: Mutex<Registry>,
}

fn key(op: &OpBlock) -> usize {
    std::ptr::from_ref(op) as usize
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock()
    }

    /// Registers an op being pushed (before it can run).
    pub(crate) fn add(&self, op: &OpBlock) {
        let pushed = Instant::now();
        let mut registry = self.lock();
        let number = registry.next;
        registry.next += 1;
        registry.ops.insert(
            key(op),
            Entry {
                number,
                pushed,
                phase: Phase::Pushed,
                holds_units: false,
            },
        );
    }

    fn set(&self, op: &OpBlock, f: impl FnOnce(&mut Entry)) {
        if let Some(entry) = self.lock().ops.get_mut(&key(op)) {
            f(entry);
        }
    }

    /// The op got its units.
    pub(crate) fn granted(&self, op: &OpBlock) {
        self.set(op, |e| e.holds_units = true);
    }

    /// The op's body starts, or resumes after awaiting.
    pub(crate) fn running(&self, op: &OpBlock) {
        self.set(op, |e| e.phase = Phase::Running);
    }

    /// The op's async body awaits.
    pub(crate) fn awaiting(&self, op: &OpBlock) {
        self.set(op, |e| e.phase = Phase::Awaiting);
    }

    /// Unregisters an op that ended (before its block can be freed).
    pub(crate) fn remove(&self, op: &OpBlock) {
        self.lock().ops.remove(&key(op));
    }

    /// `var` holds `amount` units of `pool` now (0: none).
    pub(crate) fn holding(&self, pool: usize, var: VarId, amount: u64) {
        let mut registry = self.lock();
        if amount == 0 {
            registry.held.remove(&(pool, var));
        } else {
            registry.held.insert((pool, var), amount);
        }
    }

    /// Every registered op in push order; `parked` are the addresses of the
    /// ops the broker holds. Adds who holds units to `resources` (by pool).
    pub(crate) fn report(
        &self,
        parked: &HashSet<usize>,
        resources: &mut [ResourceReport],
    ) -> Vec<OpReport> {
        let now = Instant::now();
        let registry = self.lock();
        let mut ops: Vec<(&Entry, usize)> = registry.ops.iter().map(|(&a, e)| (e, a)).collect();
        ops.sort_unstable_by_key(|(e, _)| e.number);
        let mut reports: Vec<OpReport> = ops
            .into_iter()
            .map(|(entry, addr)| {
                // SAFETY: a registered op is alive: it unregisters itself when
                // it ends (the `on_ended` hook), before the anchor that
                // keeps it alive can be dropped, and we hold the lock that
                // unregistering takes.
                let op = unsafe { &*(addr as *const OpBlock) };
                let mut report = OpReport::of(op, Some(entry.number));
                report.waited = Some(now.saturating_duration_since(entry.pushed));
                report.state = match entry.phase {
                    Phase::Running => OpState::Running,
                    Phase::Awaiting => OpState::Awaiting,
                    Phase::Pushed if op.ungranted() > 0 => OpState::Variables(Vec::new()),
                    Phase::Pushed if parked.contains(&addr) => {
                        OpState::Units(OpReport::units_of(op))
                    }
                    Phase::Pushed => OpState::Queued,
                };
                if entry.holds_units
                    && let Some(units) = op.units()
                {
                    for (resource, demand) in units.demands() {
                        if let Some(r) = resources.get_mut(resource.pool()) {
                            r.held_by_ops.push((report.label(), demand.amount));
                        }
                    }
                }
                report
            })
            .collect();
        for (&(pool, var), &amount) in &registry.held {
            if let Some(r) = resources.get_mut(pool) {
                r.held_by_vars.push((var, amount));
            }
        }
        blockers(&mut reports);
        reports
    }
}
