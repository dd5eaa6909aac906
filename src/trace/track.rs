//! The optional registry of unfinished ops behind
//! [`Engine::diagnostics`](crate::Engine::diagnostics) (see `diag`), fed by
//! the engine's lifecycle hooks (pushed, finished).
//!
//! The one `unsafe` block: a report reads the registered ops, which are
//! alive while registered.

// `unsafe`: reading the registered ops, alive while registered; each block says why it is sound.
#![allow(unsafe_code)]

use std::collections::{HashMap, HashSet};

use super::diag::{OpReport, OpState, blockers};
use crate::dep::OpBlock;
use crate::loom::sync::Mutex;

/// Unfinished ops by address, with their push number.
#[derive(Default)]
pub(crate) struct Tracker {
    ops: Mutex<(u64, HashMap<usize, u64>)>,
}

impl Tracker {
    fn lock(&self) -> crate::loom::sync::MutexGuard<'_, (u64, HashMap<usize, u64>)> {
        self.ops.lock()
    }

    /// Registers an op being pushed (before it can run).
    pub(crate) fn add(&self, op: &OpBlock) {
        let mut ops = self.lock();
        let number = ops.0;
        ops.0 += 1;
        ops.1.insert(std::ptr::from_ref(op) as usize, number);
    }

    /// Unregisters a finishing op (before its block can be freed).
    pub(crate) fn remove(&self, op: &OpBlock) {
        self.lock().1.remove(&(std::ptr::from_ref(op) as usize));
    }

    /// Every registered op in push order; `parked` are the addresses of the
    /// ops the broker holds.
    pub(crate) fn report(&self, parked: &HashSet<usize>) -> Vec<OpReport> {
        let ops = self.lock();
        let mut ops: Vec<(u64, usize)> = ops.1.iter().map(|(&a, &n)| (n, a)).collect();
        ops.sort_unstable();
        let mut reports: Vec<OpReport> = ops
            .into_iter()
            .map(|(number, addr)| {
                // SAFETY: a registered op is alive: it unregisters itself when
                // it finishes (the `on_finished` hook), before the anchor that
                // keeps it alive can be dropped, and we hold the lock that
                // unregistering takes.
                let op = unsafe { &*(addr as *const OpBlock) };
                let mut report = OpReport::of(op, Some(number));
                report.state = if op.ungranted() > 0 {
                    OpState::Variables(Vec::new())
                } else if parked.contains(&addr) {
                    OpState::Units(OpReport::units_of(op))
                } else {
                    OpState::Running
                };
                report
            })
            .collect();
        blockers(&mut reports);
        reports
    }
}
