//! The recorded ops a replay cannot run to completion inline (a child of
//! `run`): ops on stream devices, whose work ends on the device, and ops
//! with resource units, which may have to wait for them. Plain host ops
//! keep `run_from`'s inline path; these are *slow steps*:
//!
//! - they are never run on the thread that made them ready: their resident
//!   task is woken (their `inline_on` in the step is [`NO_INLINE`]), which
//!   asks for their units first if they have some (`dep::resident_units`);
//! - a stream op's successors on its device are made ready once its work
//!   is enqueued, as pushed ops are granted then (its lane's order keeps
//!   those on its lane behind it; those on other lanes put stream waits
//!   for its fence); the others once its work is done, when the poller
//!   wakes its resident task back: only then does it count itself out of
//!   the replay, so a replay is over only once all its device work is;
//! - a step with units gives them back when it ends (its device work done).
//!
//! Units are taken in push order at the replay's push: the replay's op
//! draws, under the push lock, one block of consecutive tickets per
//! resource for its recorded ops ([`ReplayTickets`]), and writes each op's
//! into its demands when it arms. A replay that never runs gives them up.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::{Runtime, Step, WatchedRun};
use crate::core::replay::Satisfied;
use crate::core::tickets::Demand;
use crate::dep::{
    DrawTickets, Enqueue, Host, OpSpec, Ran, StreamSlot, Units, complete_recorded,
    enqueue_recorded, give_back_units, set_tickets,
};
use crate::error::Error;
use crate::resource::Resource;

/// The `device` of a slow step: matches no device, so it never runs inline.
pub(super) const NO_INLINE: u16 = u16::MAX;

/// What kind of step a recorded op is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// A host op: runs inline.
    Host,
    /// A host op on an engine with stream devices: runs inline, settling
    /// device failures on its variables first (`dep::run_settled`).
    Settled,
    /// A host op with units (slow).
    Units,
    /// An op on a stream device (slow; perhaps with units).
    Stream,
}

impl WatchedRun for Enqueue {
    fn deferred(&self) -> bool {
        matches!(self, Enqueue::Waiting)
    }
}

/// What a slow step keeps besides the common fields.
pub(super) struct Slow {
    slot: StreamSlot,
}

/// The kind of the step made of `spec` on `host`, and its slow part.
pub(super) fn kind_of<H: Host>(spec: &OpSpec, host: &H) -> (Kind, Option<Box<Slow>>) {
    let kind = if spec.lane.is_some() {
        Kind::Stream
    } else if spec.units.is_some() {
        Kind::Units
    } else if host.has_streams() {
        return (Kind::Settled, None);
    } else {
        return (Kind::Host, None);
    };
    let slow = Slow {
        slot: StreamSlot::default(),
    };
    (kind, Some(Box::new(slow)))
}

/// The units a graph's ops take: its resources, and each demand's rank
/// among the graph's demands on its resource, in recorded order.
pub(super) struct UnitsPlan {
    resources: Box<[Resource]>,
    /// Per resource, how many of the graph's ops need it.
    counts: Box<[u64]>,
    /// Per demand, in recorded order (op by op, demand by demand): its
    /// resource and its rank.
    ranks: Box<[(u32, u64)]>,
}

impl UnitsPlan {
    /// The plan of `specs`, None if no op has units.
    pub(super) fn new<'a>(specs: impl Iterator<Item = &'a OpSpec>) -> Option<Arc<Self>> {
        let (mut resources, mut counts, mut ranks) =
            (Vec::<Resource>::new(), Vec::new(), Vec::new());
        for units in specs.filter_map(|s| s.units.as_deref()) {
            for (resource, _) in units.demands() {
                let slot = match resources.iter().position(|r| r == resource) {
                    Some(i) => i,
                    None => {
                        resources.push(resource.clone());
                        counts.push(0);
                        resources.len() - 1
                    }
                };
                ranks.push((slot as u32, counts[slot]));
                counts[slot] += 1;
            }
        }
        (!ranks.is_empty()).then(|| {
            Arc::new(Self {
                resources: resources.into(),
                counts: counts.into(),
                ranks: ranks.into(),
            })
        })
    }
}

/// One replay's tickets: drawn at its push, written into the recorded
/// ops' demands when it arms.
pub(super) struct ReplayTickets {
    plan: Arc<UnitsPlan>,
    /// Per resource, the first ticket of the replay's block.
    bases: Box<[AtomicU64]>,
    /// Drawn (the replay's op was linked): they must be used or given up.
    drawn: AtomicBool,
}

impl ReplayTickets {
    pub(super) fn new(plan: Arc<UnitsPlan>) -> Arc<Self> {
        let bases = plan.resources.iter().map(|_| AtomicU64::new(0)).collect();
        Arc::new(Self {
            plan,
            bases,
            drawn: AtomicBool::new(false),
        })
    }

    fn ticket(&self, demand: usize) -> u64 {
        let (slot, rank) = self.plan.ranks[demand];
        self.bases[slot as usize].load(Relaxed) + rank
    }
}

impl DrawTickets for ReplayTickets {
    fn draw(&self) {
        for ((r, &n), base) in self
            .plan
            .resources
            .iter()
            .zip(&self.plan.counts)
            .zip(&self.bases)
        {
            base.store(r.draw_tickets(n), Relaxed);
        }
        self.drawn.store(true, Relaxed);
    }
}

impl<H: Host> Runtime<H> {
    /// Writes `tickets` into the recorded ops' demands, for the replay
    /// being armed (its op runs: the push lock that drew them was released
    /// before, and the op's grant ordered that before this).
    pub(super) fn set_tickets(&self, tickets: &ReplayTickets) {
        let mut demand = 0;
        for step in self.steps.iter() {
            set_tickets(step.resident.block(), |_| {
                demand += 1;
                tickets.ticket(demand - 1)
            });
        }
    }

    /// Gives up the tickets of a replay that never ran.
    #[cold]
    pub(super) fn give_up_tickets(&self, tickets: &ReplayTickets) {
        if !tickets.drawn.load(Relaxed) {
            return;
        }
        let demands: Vec<Demand> = (0..tickets.plan.ranks.len())
            .map(|i| {
                let (slot, _) = tickets.plan.ranks[i];
                let pool = tickets.plan.resources[slot as usize].pool();
                Demand::new(pool, 1, false, tickets.ticket(i))
            })
            .collect();
        self.host
            .dispatch_granted(self.host.broker().retire(&demands), Units::Free);
    }

    /// Runs slow step `op`, woken (its units granted, if it has some): a
    /// host op with units to its end; a stream op's enqueue or, once its
    /// work is done, its completion.
    #[inline(never)]
    pub(super) fn run_slow(&self, op: u32) {
        let step = &self.steps[op as usize];
        let block = step.resident.block();
        let host = &*self.host;
        let slow = step.slow.as_deref().expect("a slow step");
        match step.kind {
            Kind::Units => {
                let ran = self.run_host(step);
                give_back_units(block, host);
                self.slow_ended(op, ran, false);
            }
            Kind::Stream if slow.slot.is_enqueued() => {
                if let Some(ran) = complete_recorded(&slow.slot, host) {
                    give_back_units(block, host);
                    self.slow_ended(op, ran, true);
                }
            }
            Kind::Stream => {
                let enqueue = |step: &Step| {
                    enqueue_recorded(block, &step.body, host, &slow.slot, step.resident.waker())
                };
                let enqueued = if host.watches_recorded() {
                    self.run_watched(step, enqueue)
                } else {
                    enqueue(step)
                };
                match enqueued {
                    Enqueue::Waiting => {}
                    Enqueue::Ended(ran) => {
                        give_back_units(block, host);
                        self.slow_ended(op, ran, false);
                    }
                    // Its successors on its device may go (the poller, which
                    // wakes this task back, cannot run it before this poll
                    // returns).
                    Enqueue::Enqueued => self.satisfy(op, true, true),
                }
            }
            Kind::Host | Kind::Settled => unreachable!("not a slow step"),
        }
    }

    /// Slow step `op` ended with `ran`: no longer due (a leftover wake of
    /// its task now runs nothing), its successors (but those on its device
    /// if `enqueued`: they went at its enqueue), then it counts itself
    /// out. Nothing here runs an op inline (this may be a poller).
    fn slow_ended(&self, op: u32, ran: Ran, enqueued: bool) {
        // Inside its task's run: a wake meanwhile runs it again only after
        // this run, when it is no longer due.
        self.steps[op as usize].resident.end_due();
        match ran {
            Ran::Succeeded => {}
            Ran::Failed(f) => self.fail(Error::Failed(f)),
            Ran::Skipped(p) => self.fail(Error::Poisoned {
                input: p.input,
                cause: p.cause,
            }),
        }
        self.satisfy(op, false, enqueued);
        // The last thing touched: see `run_from`.
        let _ = self.countdowns.op_done();
    }

    /// Satisfies `op`'s successors on its device (`on_device`) or the
    /// others, or all of them (not `split`), waking those made ready.
    fn satisfy(&self, op: u32, on_device: bool, split: bool) {
        for &s in self.successors(op) {
            if split && self.same_device(op, s) != on_device {
                continue;
            }
            if self.countdowns.satisfy(s) == Satisfied::Ready {
                self.steps[s as usize].wake();
            }
        }
    }

    /// Whether steps `a` and `b` are stream ops on one device.
    fn same_device(&self, a: u32, b: u32) -> bool {
        let (a, b) = (&self.steps[a as usize], &self.steps[b as usize]);
        a.kind == Kind::Stream && b.kind == Kind::Stream && a.device() == b.device()
    }
}
