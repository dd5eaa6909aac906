//! Which tracked ops of a [`Diagnostics`](super::Diagnostics) report can
//! never go on, and whom each waits for among them: the graph its cycles
//! are found in (`waits`).
//!
//! An unfinished op *goes on* (finishes) if:
//!
//! - it is running or queued: what a running body waits for is unknown
//!   (assumed to come), and a worker comes (a device whose every worker is
//!   stuck is judged apart, by time);
//! - it awaits inside its body: once every op whose handle it awaits (as
//!   far as the engine saw) goes on;
//! - it waits for its variables: once the earlier ops it conflicts with go
//!   on (the nearest ones, through which it waits for the others);
//! - it asks for units and was not granted them (parked, or its variables
//!   not granted yet), per resource: once enough units can come back, and,
//!   if some of its units are lasting (`allocates`), once its turn comes:
//!   such a request is granted only after every older request on the
//!   resource (`core::tickets`), so every older op asking for units of it
//!   and not granted yet must go on first. Enough units: the capacity less
//!   the units held by holders that never give them back covers the
//!   demand. An op gives its units back if it goes on; a variable gives
//!   them back when the first op pushed that frees it (its delete, or an op
//!   that allocates it again, `OpReport::frees`) goes on, or may at any
//!   time if no such op was pushed (the program may still delete or drop
//!   it).
//!
//! Every rule is a *must*: an op found stuck cannot go on, on the report's
//! snapshot; where the engine does not know (a body's waits, units held by
//! no tracked op or variable, a variable the program may still free) it
//! assumes the op goes on. So a stuck op is truly stuck, and a program that
//! is merely slow or busy has none. Every stuck op waits for another stuck
//! one (the rule it fails names one), so the stuck ops contain a cycle.
//!
//! The ops that go on are found as a worklist over counts of unmet
//! conditions: linear in the ops and their waits, plus a sort per
//! resource. Built once per report, off every hot path.

use std::collections::VecDeque;

use super::diag::{OpReport, OpState, ResourceReport, conflicts};
use super::waits::Needs;
use crate::error::VarId;

/// A variable holding units, and the first pushed op that gives them back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Freer {
    pub(crate) var: VarId,
    /// The resource, by its place in the report.
    pub(crate) resource: usize,
    /// The op, by its place in the report's ops.
    pub(crate) op: usize,
}

/// Per variable holding units of a resource (in the order of the report's
/// resources and their `held_by_vars`), the first op in push order that
/// gives them back: it deletes the variable, or allocates it again.
pub(crate) fn freers(ops: &[OpReport], resources: &[ResourceReport]) -> Vec<Freer> {
    let mut found = Vec::new();
    for (r, res) in resources.iter().enumerate() {
        for &(var, _) in &res.held_by_vars {
            let first = ops.iter().position(|op| {
                op.frees
                    .iter()
                    .any(|(v, of)| *v == var && of.as_ref().is_none_or(|name| *name == res.name))
            });
            if let Some(op) = first {
                found.push(Freer {
                    var,
                    resource: r,
                    op,
                });
            }
        }
    }
    found
}

/// An op's unit demands while it is not granted them: (resource by place,
/// amount, lasting). None for an op holding units (granted, even if the
/// report's state is a step behind) or past its grant.
fn ungranted_asks<'a>(
    op: &'a OpReport,
    resources: &'a [ResourceReport],
) -> impl Iterator<Item = (usize, u64, bool)> + 'a {
    let asking =
        matches!(op.state, OpState::Variables(_) | OpState::Units(_)) && op.holds.is_empty();
    op.asks
        .iter()
        .filter(move |_| asking)
        .filter_map(|(name, amount, lasting)| {
            let r = resources.iter().position(|r| r.name == *name)?;
            Some((r, *amount, *lasting))
        })
}

/// The worklist's state.
struct Fixpoint {
    /// Per op: it goes on.
    goes_on: Vec<bool>,
    /// Per op: conditions not met yet.
    unmet: Vec<usize>,
    /// Per op: the ops one of whose conditions it meets by going on.
    meets: Vec<Vec<usize>>,
    /// Per op: the units that come back when it goes on: (resource, amount).
    gives: Vec<Vec<(usize, u64)>>,
    /// Per resource: its capacity, and the units held by holders not known
    /// to give them back yet.
    capacity: Vec<u64>,
    held: Vec<u64>,
    /// Per resource: the ungranted requests' (amount, op), smallest first,
    /// and how many of them have enough units.
    demands: Vec<Vec<(u64, usize)>>,
    enough: Vec<usize>,
    /// Per resource: the ungranted requests (op, lasting) in push order; the
    /// first that does not go on yet (the others wait for it if lasting),
    /// and how many have had their turn.
    line: Vec<Vec<(usize, bool)>>,
    head: Vec<usize>,
    turned: Vec<usize>,
    /// Per op: its place in each resource's `line`: (resource, place).
    places: Vec<Vec<(usize, usize)>>,
    /// Per resource: the ops holding units of it.
    holders: Vec<Vec<usize>>,
    ready: VecDeque<usize>,
}

impl Fixpoint {
    fn meet(&mut self, op: usize) {
        self.unmet[op] -= 1;
        if self.unmet[op] == 0 {
            self.ready.push_back(op);
        }
    }

    /// Meets the units condition of every request on `r` that now has
    /// enough.
    fn units_back(&mut self, r: usize) {
        let room = self.capacity[r].saturating_sub(self.held[r]);
        while let Some(&(amount, op)) = self.demands[r].get(self.enough[r]) {
            if amount > room {
                break;
            }
            self.enough[r] += 1;
            self.meet(op);
        }
    }

    /// Moves `r`'s head past the requests that go on, and gives the lasting
    /// ones it reached their turn.
    fn turns(&mut self, r: usize) {
        while let Some(&(op, _)) = self.line[r].get(self.head[r]) {
            if !self.goes_on[op] {
                break;
            }
            self.head[r] += 1;
        }
        while self.turned[r] <= self.head[r] {
            let Some(&(op, lasting)) = self.line[r].get(self.turned[r]) else {
                break;
            };
            self.turned[r] += 1;
            if lasting {
                self.meet(op);
            }
        }
    }
}

/// The waits among the ops that can never go on: (op, op it waits for,
/// what it needs of it), by places in `ops`; empty if every op goes on.
/// `freers` as [`freers`] made them.
pub(crate) fn stuck_waits(
    ops: &[OpReport],
    resources: &[ResourceReport],
    freers: &[Freer],
) -> Vec<(usize, usize, Needs)> {
    let n = ops.len();
    let rn = resources.len();
    let mut f = Fixpoint {
        goes_on: vec![false; n],
        unmet: vec![0; n],
        meets: vec![Vec::new(); n],
        gives: vec![Vec::new(); n],
        capacity: resources.iter().map(|r| r.capacity).collect(),
        held: vec![0; rn],
        demands: vec![Vec::new(); rn],
        enough: vec![0; rn],
        line: vec![Vec::new(); rn],
        head: vec![0; rn],
        turned: vec![0; rn],
        places: vec![Vec::new(); n],
        holders: vec![Vec::new(); rn],
        ready: VecDeque::new(),
    };
    let variables = conflicts(ops, true);
    for (i, op) in ops.iter().enumerate() {
        for (_, before) in &variables[i] {
            for &p in before {
                f.unmet[i] += 1;
                f.meets[p].push(i);
            }
        }
        if op.state == OpState::Awaiting {
            for &p in &op.awaited {
                f.unmet[i] += 1;
                f.meets[p].push(i);
            }
        }
        for (r, amount, lasting) in ungranted_asks(op, resources) {
            f.unmet[i] += 1 + usize::from(lasting);
            f.demands[r].push((amount, i));
            f.places[i].push((r, f.line[r].len()));
            f.line[r].push((i, lasting));
        }
        for (name, amount) in &op.holds {
            if let Some(r) = resources.iter().position(|r| r.name == *name) {
                f.held[r] += amount;
                f.gives[i].push((r, *amount));
                f.holders[r].push(i);
            }
        }
    }
    for freer in freers {
        let r = freer.resource;
        if let Some(&(_, amount)) = resources[r]
            .held_by_vars
            .iter()
            .find(|(v, _)| *v == freer.var)
        {
            f.held[r] += amount;
            f.gives[freer.op].push((r, amount));
        }
    }
    // Those waiting for nothing first: the rest reach the queue as their
    // last condition is met.
    f.ready.extend((0..n).filter(|&i| f.unmet[i] == 0));
    for r in 0..rn {
        f.demands[r].sort_unstable();
        f.units_back(r);
        f.turns(r);
    }
    while let Some(i) = f.ready.pop_front() {
        f.goes_on[i] = true;
        for w in std::mem::take(&mut f.meets[i]) {
            f.meet(w);
        }
        for (r, amount) in std::mem::take(&mut f.gives[i]) {
            f.held[r] -= amount;
            f.units_back(r);
        }
        for (r, _, _) in ungranted_asks(&ops[i], resources) {
            f.turns(r);
        }
    }
    stuck_edges(ops, resources, freers, &f, &variables)
}

/// What each stuck op waits for among the stuck ones.
fn stuck_edges(
    ops: &[OpReport],
    resources: &[ResourceReport],
    freers: &[Freer],
    f: &Fixpoint,
    variables: &[Vec<(VarId, Vec<usize>)>],
) -> Vec<(usize, usize, Needs)> {
    let stuck = |i: usize| !f.goes_on[i];
    let mut edges = Vec::new();
    for (i, op) in ops.iter().enumerate().filter(|&(i, _)| stuck(i)) {
        for (var, before) in &variables[i] {
            for &p in before.iter().filter(|&&p| stuck(p)) {
                edges.push((i, p, Needs::Variable(*var)));
            }
        }
        if op.state == OpState::Awaiting {
            for &p in op.awaited.iter().filter(|&&p| stuck(p)) {
                edges.push((i, p, Needs::Result));
            }
        }
        for ((r, amount, lasting), &(_, place)) in ungranted_asks(op, resources).zip(&f.places[i]) {
            let name = &resources[r].name;
            if lasting && f.head[r] < place {
                // The oldest request still stuck ahead of it, and the
                // nearest one.
                let oldest = f.line[r][f.head[r]].0;
                edges.push((i, oldest, Needs::Turn(name.clone())));
                if let Some(&(nearest, _)) =
                    f.line[r][..place].iter().rev().find(|&&(o, _)| stuck(o))
                    && nearest != oldest
                {
                    edges.push((i, nearest, Needs::Turn(name.clone())));
                }
            }
            if f.capacity[r].saturating_sub(f.held[r]) >= amount {
                continue;
            }
            for &p in f.holders[r].iter().filter(|&&p| p != i && stuck(p)) {
                edges.push((i, p, Needs::Units(name.clone())));
            }
            for freer in freers.iter().filter(|fr| fr.resource == r && stuck(fr.op)) {
                edges.push((
                    i,
                    freer.op,
                    Needs::Freed {
                        resource: name.clone(),
                        var: freer.var,
                    },
                ));
            }
        }
    }
    edges
}
