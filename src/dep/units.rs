//! The counted units an op needs ([`OpUnits`]), and how it hands the lasting
//! ones on to its outputs.
//!
//! An op declares units next to its variables; the engine validates them at
//! push. Once the op's variables grant it, the host's broker grants it all
//! its units at once (or parks it, holding nothing); when it completes, its
//! temporary units go back and its lasting ones stay with the outputs it
//! allocated (see `resource` and `core::tickets`).
//!
//! # Who touches what
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `demands` (amounts), `resources`, `lasting` | the builder, before push | anyone |
//! | `demands` (tickets) | the pusher, under the push lock | the broker |
//! | `held`, `skipped`, `failed` | the op's lifecycle, in order (`Relaxed`: each hand-off between threads orders them) | the same |
//! | `deferred` (units to give back, and to take back on failure) | a stream op's enqueue half, then its completion | the same |
//! | `held`, `skipped`, `failed` of a recorded op (`resident_units`) | as above, within one replay; `reset` at its end | the same |
//! | `also` | the replay's pusher, before push | the pusher, under the push lock |
//! | `withdraw` | `spawn`, before the op is shared | a cancel that found the op parked (see `start`) |

// `unsafe`: handing units on to outputs under the op's write grants; each block says why it is
// sound.
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::block::OpBlock;
use crate::core::few::Few;
use crate::core::tickets::Demand;
use crate::loom::sync::Mutex;
use crate::resource::{Resource, Revocable};

/// Units to give back: (pool, amount) pairs.
pub(crate) type Returns = Few<(usize, u64)>;

/// Units an op hands on to one of its mutated variables.
pub(crate) struct Lasting {
    /// Index into the op's `demands`.
    pub(crate) demand: usize,
    pub(crate) amount: u64,
    /// Index into the op's edges (while building: into its allocations).
    pub(crate) edge: usize,
}

/// What an op with resource demands carries.
pub(crate) struct OpUnits {
    /// One per resource, tickets filled in at push (under the push lock).
    demands: Few<Demand>,
    /// The resource of each demand.
    resources: Few<Resource>,
    pub(crate) lasting: Few<Lasting>,
    /// The units were granted (set before the op is dispatched).
    held: AtomicBool,
    /// The op will be skipped (an input is poisoned or deleted): it asked for
    /// no units, and gave up its tickets.
    skipped: AtomicBool,
    /// The op failed: nothing is handed on.
    failed: AtomicBool,
    /// On a stream device: the units to give back once the op's device
    /// work is done (its outputs took theirs when the work was enqueued),
    /// and those the outputs took, to take back if that work fails.
    deferred: Mutex<Deferred>,
    /// More tickets to draw with the op's own (a replay's op draws its
    /// recorded ops' here: see `crate::graph::run`).
    also: Option<Arc<dyn DrawTickets>>,
    /// Takes the op out of its host's broker, for a cancel that found it
    /// parked there (`lifecycle::withdraw`, monomorphised for the op's
    /// host): set by `spawn` for a pushed op; a resident op is never
    /// cancelled while parked, and has none.
    pub(super) withdraw: Option<fn(&OpBlock)>,
}

/// Tickets drawn in the same critical section as an op's own (under the
/// push lock, see [`OpUnits::draw_tickets`]): a replay's op draws those of
/// the recorded ops it runs, so they take their places in push order at
/// the replay's push.
pub(crate) trait DrawTickets: Send + Sync {
    /// Draws the tickets (called once, under the push lock).
    fn draw(&self);
}

/// What a stream op keeps aside from enqueuing its work to completing.
#[derive(Default)]
pub(crate) struct Deferred {
    /// Units to give back when the work is done.
    pub(crate) returns: Returns,
    /// Units handed on to the outputs, taken back if the work fails.
    pub(crate) revocable: Few<Revocable>,
}

impl Default for OpUnits {
    fn default() -> Self {
        Self {
            demands: Few::default(),
            resources: Few::default(),
            lasting: Few::default(),
            held: AtomicBool::new(false),
            skipped: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            deferred: Mutex::new(Deferred::default()),
            also: None,
            withdraw: None,
        }
    }
}

impl OpUnits {
    /// Adds `amount` units of `resource`; lasting ones are handed on to the
    /// op's allocation number `allocation` (the builder turns it into an
    /// edge index).
    pub(crate) fn add(&mut self, resource: &Resource, amount: u64, allocation: Option<usize>) {
        let i = match self.resources.iter().position(|r| r == resource) {
            Some(i) => i,
            None => {
                self.resources.push(resource.clone());
                self.demands.push(Demand::new(resource.pool(), 0, false, 0));
                self.resources.len() - 1
            }
        };
        let demand = &mut self.demands.as_mut_slice()[i];
        // Saturating: a sum past `u64::MAX` is over any capacity, and is
        // refused as such at push (`over_capacity`), never wrapped.
        demand.amount = demand.amount.saturating_add(amount);
        if let Some(edge) = allocation {
            demand.lasting = true;
            self.lasting.push(Lasting {
                demand: i,
                amount,
                edge,
            });
        }
    }

    /// The name of the resource of the first units handed on to an output.
    pub(crate) fn lasting_resource(&self) -> Option<&str> {
        let l = self.lasting.as_slice().first()?;
        Some(self.resources.as_slice()[l.demand].name())
    }

    /// Merges allocations of one resource to one variable (once `edge`
    /// holds edge indices).
    pub(crate) fn merge_lasting(&mut self) {
        if self.lasting.len() < 2 {
            return;
        }
        let mut merged: Few<Lasting> = Few::default();
        std::mem::take(&mut self.lasting).for_each(|l| {
            match merged
                .iter_mut()
                .find(|m| m.demand == l.demand && m.edge == l.edge)
            {
                Some(m) => m.amount = m.amount.saturating_add(l.amount),
                None => merged.push(l),
            }
        });
        self.lasting = merged;
    }

    /// The first demand above its resource's capacity (a sum that would
    /// overflow counts as `u64::MAX`, above every capacity).
    pub(crate) fn over_capacity(&self) -> Option<(&Resource, u64)> {
        self.demands
            .iter()
            .zip(&self.resources)
            .find(|(d, r)| d.amount > r.capacity())
            .map(|(d, r)| (r, d.amount))
    }

    /// Every demand, with its resource.
    pub(crate) fn demands(&self) -> impl Iterator<Item = (&Resource, &Demand)> {
        self.resources.iter().zip(&self.demands)
    }

    /// The demands, as the broker sees them.
    #[inline]
    pub(crate) fn as_request(&self) -> &[Demand] {
        &self.demands
    }

    /// Draws the op's place in push order on each resource.
    ///
    /// Called under the engine's push lock, in the same critical section that
    /// links the op into its variables' chains: ticket order then agrees with
    /// the order of every chain, so an older ticket never waits on a younger
    /// one through a variable.
    pub(super) fn draw_tickets(&self) {
        for (d, r) in self.demands.iter().zip(&self.resources) {
            d.ticket.store(r.draw_ticket(), Relaxed);
        }
        if let Some(also) = &self.also {
            also.draw();
        }
    }

    /// Units of no resource that draw `also`'s tickets at the op's push
    /// (a replay's op: its recorded ops' places in push order).
    pub(crate) fn drawing(also: Arc<dyn DrawTickets>) -> Box<Self> {
        Box::new(Self {
            also: Some(also),
            ..Self::default()
        })
    }

    /// A recorded op's units after its run in one replay: ready for the
    /// next (nothing held, skipped or failed).
    pub(super) fn reset(&self) {
        self.held.store(false, Relaxed);
        self.skipped.store(false, Relaxed);
        self.failed.store(false, Relaxed);
    }

    #[inline]
    pub(super) fn mark_held(&self) {
        self.held.store(true, Relaxed);
    }

    #[inline]
    pub(super) fn is_held(&self) -> bool {
        self.held.load(Relaxed)
    }

    pub(super) fn mark_skipped(&self) {
        self.skipped.store(true, Relaxed);
    }

    /// Whether the op was found blocked when it became ready.
    #[inline]
    pub(super) fn is_skipped(&self) -> bool {
        self.skipped.load(Relaxed)
    }

    pub(super) fn mark_failed(&self) {
        self.failed.store(true, Relaxed);
    }

    /// Keeps `deferred` aside until the op's device work is done.
    pub(super) fn defer(&self, deferred: Deferred) {
        *self.deferred.lock() = deferred;
    }

    /// What `defer` kept aside.
    pub(super) fn take_deferred(&self) -> Deferred {
        std::mem::take(&mut *self.deferred.lock())
    }

    /// Every unit the op holds, as (pool, amount) pairs: what goes back if
    /// nothing is handed on.
    pub(super) fn returns(&self) -> Returns {
        self.demands.iter().map(|d| (d.pool, d.amount)).collect()
    }

    /// The resource of demand `i`.
    pub(super) fn resource(&self, i: usize) -> &Resource {
        &self.resources[i]
    }

    /// Whether the op failed (then nothing is handed on).
    pub(super) fn is_failed(&self) -> bool {
        self.failed.load(Relaxed)
    }
}
