//! Who waits for whom in a [`Diagnostics`] report: the waits-for graph
//! between its tracked ops (and the variables holding units), the cycles
//! ([`Cycle`]), the chains its `Display` prints, and its Graphviz form
//! ([`Diagnostics::to_dot`]).
//!
//! An edge goes from an op to what it cannot go on without:
//!
//! - the earlier unfinished ops it conflicts with on a variable (all of
//!   them: a variable grants in push order);
//! - the ops and variables holding units of a resource it waits for (a
//!   variable's units come back with the first op pushed that frees it:
//!   its delete, or an op allocating it again; `stuck`);
//! - for a parked op with lasting units, the older ops asking for units of
//!   the resource and not granted yet (its turn: the head of that line and
//!   the op right before it);
//! - the ops whose handles its async body awaits (as the engine's
//!   `OpHandle` noted them, see `track`);
//! - the ops running on every worker of its device, when it is queued
//!   there and none is free.
//!
//! A units edge is *binding* (drawn solid) if the op cannot get its units
//! without that holder's. The cycles, though, are found among the ops that
//! can never go on (`stuck`): an op waiting for units is stuck when every
//! holder that could give back enough is stuck too, which no single edge
//! says. A worker edge never closes a cycle (any worker would do, and what
//! a running body waits for is unknown), which is why a device whose every
//! worker is stuck is a cycle of its own kind, judged by how long the
//! bodies have run.
//!
//! Built once per report, off every hot path; iterative, so a long chain of
//! ops cannot overflow the stack.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::{self, Write as _};
use std::time::Duration;

use super::diag::{Diagnostics, OpReport, OpState, conflicts};
use super::stuck::{freers, stuck_waits};
use crate::error::VarId;

/// How long every worker of a device must have been in the same bodies, with
/// ops queued for it, for the report to name it as a possible deadlock
/// (shorter if the engine's watchdog period is).
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(1);

/// What an op needs of the next one in a [`Cycle`] (or of whom it waits
/// for).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Needs {
    /// Its turn on this variable, which the other op comes before it on.
    Variable(VarId),
    /// Units of this resource, which the other op holds.
    Units(String),
    /// The other op's result: its async body awaits the other's
    /// [`OpHandle`](crate::OpHandle).
    Result,
    /// A worker of this device, which the other op's body occupies.
    Worker(String),
    /// Units of `resource` held by the variable `var`, which only the other
    /// op gives back (it deletes `var`, or allocates it again): the op
    /// cannot get enough units while `var` holds them (the other units are
    /// held too, by ops and variables that cannot give them back either).
    Freed {
        /// The resource's name.
        resource: String,
        /// The variable holding its units.
        var: VarId,
    },
    /// Its turn for units of this resource: it allocates some
    /// ([`OpBuilder::allocates`](crate::OpBuilder::allocates)), so it is
    /// granted units only after every older op that asks for units of the
    /// resource, and the other op is one of those, not granted yet.
    Turn(String),
}

/// A wait cycle in a [`Diagnostics`] report, naming its ops as the report
/// labels them (`` `name` ``, or `op #N` by push order).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cycle {
    /// Ops each waiting for the next, and the last for the first: each
    /// with what it needs of the next. None can go on: the program must
    /// break the cycle (cancel an op that has not started, or let a body
    /// stop awaiting). The classic case is an async op awaiting the handle
    /// of an op that needs a variable the first one holds. Another is a
    /// push order that does not fit a resource when run serially: an op
    /// waits for units that variables hold, which only ops pushed after it
    /// give back ([`Needs::Freed`]), and those wait for it (through a
    /// variable, or their [turn](Needs::Turn) for units).
    Ops(Vec<(String, Needs)>),
    /// Every worker of `device` is inside a body that has neither returned
    /// nor awaited for at least `stuck` (`running`), while `queued` ops
    /// wait for a worker of it. If a running body waits for a queued op (a
    /// channel, a lock, a flag that op sets), none can go on.
    Workers {
        /// The device's name.
        device: String,
        /// The ops whose bodies occupy its workers.
        running: Vec<String>,
        /// The ops ready to run there, waiting for a worker.
        queued: Vec<String>,
        /// How long the running bodies have run, at least.
        stuck: Duration,
    },
}

impl Cycle {
    /// The ops in the cycle: for [`Cycle::Ops`] in cycle order, for
    /// [`Cycle::Workers`] the running ones, then the queued ones.
    pub fn ops(&self) -> Vec<&str> {
        match self {
            Cycle::Ops(steps) => steps.iter().map(|(op, _)| op.as_str()).collect(),
            Cycle::Workers {
                running, queued, ..
            } => running.iter().chain(queued).map(String::as_str).collect(),
        }
    }
}

/// `needs` of `next`, as a sentence's end: "waits for {this}".
fn needs_of(needs: &Needs, next: &str) -> String {
    match needs {
        Needs::Variable(var) => format!("{var}, held by {next}"),
        Needs::Units(resource) => format!("units of `{resource}` held by {next}"),
        Needs::Result => format!("the result of {next}"),
        Needs::Worker(device) => format!("a worker of `{device}`, taken by {next}"),
        Needs::Freed { resource, var } => {
            format!("units of `{resource}` held by {var}, which only {next} gives back")
        }
        Needs::Turn(resource) => format!("its turn for units of `{resource}`, after {next}"),
    }
}

/// The resources whose units a cycle's ops wait for, as `` `name` ``s.
fn units_in(steps: &[(String, Needs)]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for (_, needs) in steps {
        let name = match needs {
            Needs::Units(r) | Needs::Turn(r) | Needs::Freed { resource: r, .. } => r.as_str(),
            _ => continue,
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    names.join(", ")
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cycle::Ops(steps) => {
                write!(f, "deadlock: ")?;
                for (i, (op, needs)) in steps.iter().enumerate() {
                    let next = &steps[(i + 1) % steps.len()].0;
                    let sep = if i == 0 { "" } else { "; " };
                    write!(f, "{sep}{op} waits for {}", needs_of(needs, next))?;
                }
                write!(f, ": none of them can go on")?;
                if steps.iter().any(|(_, n)| *n == Needs::Result) {
                    write!(
                        f,
                        " (a body awaiting the handle of an op that needs what the awaiting \
                         op holds never finishes: declare that dependency through a variable \
                         instead, or await outside the op)"
                    )?;
                } else if steps
                    .iter()
                    .any(|(_, n)| matches!(n, Needs::Freed { .. } | Needs::Turn(_)))
                {
                    // With no body awaiting, only a variable's units can be
                    // given back by a younger op (variables and turns go to
                    // older ones): `core::tickets` says why this means the
                    // program does not fit when run serially.
                    let units = units_in(steps);
                    write!(
                        f,
                        " (the units they wait for are given back only by ops pushed after the \
                         ops that wait for them, which wait for those in turn: this push order \
                         does not fit {units} when run serially; push each consumer of an \
                         allocated variable, and what frees that variable, before the next op \
                         that allocates {units}, or give {units} more units)"
                    )?;
                }
                Ok(())
            }
            Cycle::Workers {
                device,
                running,
                queued,
                stuck,
            } => write!(
                f,
                "possible deadlock: every worker of `{device}` is inside a body that has \
                 neither returned nor awaited for {stuck:.1?} ({}), while {} wait(s) for a \
                 worker of it: if a running body waits for one of them (a channel, a lock, a \
                 flag it sets), none can go on; run them on another device, or await in an \
                 async body instead of blocking (that frees the worker)",
                running.join(", "),
                queued.join(", "),
            ),
        }
    }
}

/// Whom an edge leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Holder {
    /// An op, by its place in the report's ops.
    Op(usize),
    /// A variable holding units.
    Var(VarId),
}

/// One waits-for edge: the op at `from` (its place in the report's ops)
/// needs `needs` of `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WaitEdge {
    pub(crate) from: usize,
    pub(crate) to: Holder,
    pub(crate) needs: Needs,
    /// `from` cannot go on without `to` (see the module doc).
    pub(crate) binding: bool,
}

/// Fills in `d`'s waits-for edges and cycles; `devices` are the engine's
/// devices by index (name, and how many ops each can run at once where
/// known); a device whose workers have all run the same bodies for
/// `stuck_after` is named as stuck.
pub(crate) fn analyse(
    d: &mut Diagnostics,
    devices: &[(String, Option<usize>)],
    stuck_after: Duration,
) {
    let Some(ops) = &d.tracked else {
        return;
    };
    let mut edges = Vec::new();
    // Only the nearest conflicts: a long queue on one variable is a chain,
    // not a quadratic number of edges.
    for (from, waits) in conflicts(ops, true).into_iter().enumerate() {
        for (var, before) in waits {
            edges.extend(before.into_iter().map(|to| WaitEdge {
                from,
                to: Holder::Op(to),
                needs: Needs::Variable(var),
                binding: true,
            }));
        }
    }
    let holders = units_holders(d);
    // Per resource, the ops asking for units of it and not granted yet, in
    // push order: a lasting request waits for them (its turn).
    let mut asking: HashMap<&str, Vec<usize>> = HashMap::new();
    for (from, op) in ops.iter().enumerate() {
        if let OpState::Units(needs) = &op.state {
            for (resource, amount) in needs {
                units_edges(d, &holders, from, resource, *amount, &mut edges);
            }
        }
        edges.extend(op.awaited.iter().map(|&to| WaitEdge {
            from,
            to: Holder::Op(to),
            needs: Needs::Result,
            binding: true,
        }));
        if !matches!(op.state, OpState::Variables(_) | OpState::Units(_)) {
            continue;
        }
        for (resource, _, lasting) in &op.asks {
            let older = asking.entry(resource).or_default();
            // A parked op waiting for its turn: the head of the line, and
            // the op right before it (the head's line is a chain).
            if *lasting && matches!(op.state, OpState::Units(_)) {
                let mut ahead: Vec<usize> = older
                    .first()
                    .into_iter()
                    .chain(older.last())
                    .copied()
                    .collect();
                ahead.dedup();
                edges.extend(ahead.into_iter().map(|to| WaitEdge {
                    from,
                    to: Holder::Op(to),
                    needs: Needs::Turn(resource.clone()),
                    binding: true,
                }));
            }
            older.push(from);
        }
    }
    let freers = freers(ops, &d.resources);
    let stuck: Vec<WaitEdge> = stuck_waits(ops, &d.resources, &freers)
        .into_iter()
        .map(|(from, to, needs)| WaitEdge {
            from,
            to: Holder::Op(to),
            needs,
            binding: true,
        })
        .collect();
    let mut cycles = Vec::new();
    let mut in_cycle = Vec::new();
    for (cycle, places) in op_cycles(ops, &stuck) {
        if let Cycle::Ops(steps) = &cycle {
            for (i, (&from, (_, needs))) in places.iter().zip(steps).enumerate() {
                let next = Holder::Op(places[(i + 1) % places.len()]);
                match needs {
                    Needs::Freed { var, .. } => {
                        in_cycle.push((Holder::Op(from), Holder::Var(*var)));
                        in_cycle.push((Holder::Var(*var), next));
                    }
                    _ => in_cycle.push((Holder::Op(from), next)),
                }
            }
        }
        cycles.push(cycle);
    }
    for (index, (name, workers)) in devices.iter().enumerate() {
        let Some(workers) = *workers else { continue };
        let on_it = |state: &OpState| -> Vec<usize> {
            (0..ops.len())
                .filter(|&i| usize::from(ops[i].device_index) == index && ops[i].state == *state)
                .collect()
        };
        let (running, queued) = (on_it(&OpState::Running), on_it(&OpState::Queued));
        if running.len() < workers || queued.is_empty() {
            continue;
        }
        for &from in &queued {
            edges.extend(running.iter().map(|&to| WaitEdge {
                from,
                to: Holder::Op(to),
                needs: Needs::Worker(name.clone()),
                binding: false,
            }));
        }
        let stuck = running
            .iter()
            .map(|&i| ops[i].in_state.unwrap_or_default())
            .min()
            .unwrap_or_default();
        if stuck >= stuck_after {
            for &from in &queued {
                in_cycle.extend(running.iter().map(|&to| (Holder::Op(from), Holder::Op(to))));
            }
            let labels = |places: &[usize]| places.iter().map(|&i| ops[i].label()).collect();
            cycles.push(Cycle::Workers {
                device: name.clone(),
                running: labels(&running),
                queued: labels(&queued),
                stuck,
            });
        }
    }
    // By op, each op's edges in the order above (`edges_from` relies on it).
    edges.sort_by_key(|e| e.from);
    d.waits = edges;
    d.cycles = cycles;
    d.in_cycle = in_cycle;
    d.freers = freers;
}

/// Per resource (by its place in the report), who holds its units: ops
/// (by place) and variables, with how many.
fn units_holders(d: &Diagnostics) -> Vec<Vec<(Holder, u64)>> {
    let mut holders: Vec<Vec<(Holder, u64)>> = d
        .resources
        .iter()
        .map(|r| {
            r.held_by_vars
                .iter()
                .map(|&(var, held)| (Holder::Var(var), held))
                .collect()
        })
        .collect();
    for (i, op) in d.tracked.iter().flatten().enumerate() {
        for (resource, held) in &op.holds {
            if let Some(r) = d.resources.iter().position(|r| &r.name == resource) {
                holders[r].push((Holder::Op(i), *held));
            }
        }
    }
    holders
}

/// The edges from the op at `from`, which needs `amount` of `resource`: to
/// every holder of its units, binding where the op cannot get enough
/// without that holder's.
fn units_edges(
    d: &Diagnostics,
    holders: &[Vec<(Holder, u64)>],
    from: usize,
    resource: &str,
    amount: u64,
    edges: &mut Vec<WaitEdge>,
) {
    let Some(r) = d.resources.iter().position(|r| r.name == resource) else {
        return;
    };
    let free = d.resources[r].free;
    if amount <= free {
        return;
    }
    let total: u64 = free + holders[r].iter().map(|(_, held)| held).sum::<u64>();
    for &(to, held) in &holders[r] {
        if to == Holder::Op(from) {
            continue;
        }
        edges.push(WaitEdge {
            from,
            to,
            needs: Needs::Units(resource.to_owned()),
            binding: total - held < amount,
        });
    }
}

/// The cycles of binding edges between ops (`analyse` passes the waits
/// among the stuck ops): one per strongly connected group of ops, the
/// shortest through its earliest op; with the places of its ops in cycle
/// order.
fn op_cycles(ops: &[OpReport], edges: &[WaitEdge]) -> Vec<(Cycle, Vec<usize>)> {
    let mut next: Vec<Vec<(usize, &Needs)>> = vec![Vec::new(); ops.len()];
    for e in edges {
        if let (true, Holder::Op(to)) = (e.binding, e.to) {
            next[e.from].push((to, &e.needs));
        }
    }
    let mut cycles = Vec::new();
    for group in strongly_connected(&next) {
        let start = group[0];
        let inside: HashSet<usize> = group.iter().copied().collect();
        // Breadth first from `start` back to it, inside the group.
        let mut came_from: Vec<Option<(usize, &Needs)>> = vec![None; ops.len()];
        let mut queue = VecDeque::from([start]);
        let mut last = None;
        'search: while let Some(at) = queue.pop_front() {
            for &(to, needs) in &next[at] {
                if to == start {
                    last = Some((at, needs));
                    break 'search;
                }
                if inside.contains(&to) && came_from[to].is_none() {
                    came_from[to] = Some((at, needs));
                    queue.push_back(to);
                }
            }
        }
        let Some((mut at, needs)) = last else {
            continue;
        };
        // Walk back from the op before `start`, collecting the steps.
        let mut steps = vec![(at, needs.clone())];
        while at != start {
            let (prev, needs) = came_from[at].expect("on the path");
            steps.push((prev, needs.clone()));
            at = prev;
        }
        steps.reverse();
        let places = steps.iter().map(|&(i, _)| i).collect();
        let steps = steps.into_iter().map(|(i, needs)| (ops[i].label(), needs));
        cycles.push((Cycle::Ops(steps.collect()), places));
    }
    cycles
}

/// Tarjan's strongly connected components of more than one node (or one
/// with an edge to itself), each sorted, in order of their first node;
/// iterative.
fn strongly_connected(next: &[Vec<(usize, &Needs)>]) -> Vec<Vec<usize>> {
    /// Tarjan's bookkeeping: per node its visit index (`NONE`: not yet),
    /// its low link and whether it is on the stack.
    struct Marks {
        index: Vec<usize>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        /// The depth-first path: (node, its next edge to follow).
        calls: Vec<(usize, usize)>,
        counter: usize,
    }
    impl Marks {
        fn visit(&mut self, v: usize) {
            self.index[v] = self.counter;
            self.low[v] = self.counter;
            self.counter += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            self.calls.push((v, 0));
        }
    }
    const NONE: usize = usize::MAX;
    let n = next.len();
    let mut m = Marks {
        index: vec![NONE; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        calls: Vec::new(),
        counter: 0,
    };
    let mut groups = Vec::new();
    for root in 0..n {
        if m.index[root] != NONE {
            continue;
        }
        m.visit(root);
        while let Some(&(v, child)) = m.calls.last() {
            if let Some(&(w, _)) = next[v].get(child) {
                if let Some(top) = m.calls.last_mut() {
                    top.1 += 1;
                }
                if m.index[w] == NONE {
                    m.visit(w);
                } else if m.on_stack[w] {
                    m.low[v] = m.low[v].min(m.index[w]);
                }
                continue;
            }
            m.calls.pop();
            if let Some(&(parent, _)) = m.calls.last() {
                m.low[parent] = m.low[parent].min(m.low[v]);
            }
            if m.low[v] == m.index[v] {
                let mut group = Vec::new();
                while let Some(w) = m.stack.pop() {
                    m.on_stack[w] = false;
                    group.push(w);
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 || next[v].iter().any(|&(w, _)| w == v) {
                    group.sort_unstable();
                    groups.push(group);
                }
            }
        }
    }
    groups.sort_unstable_by_key(|g| g[0]);
    groups
}

/// At most this many chains in a report, each at most this many steps.
pub(crate) const MAX_CHAINS: usize = 32;
const MAX_STEPS: usize = 12;

impl Diagnostics {
    /// The edges from the op at `from` (`waits` is sorted by it).
    fn edges_from(&self, from: usize) -> impl Iterator<Item = &WaitEdge> {
        let start = self.waits.partition_point(|e| e.from < from);
        self.waits[start..]
            .iter()
            .take_while(move |e| e.from == from)
    }

    /// The label of a holder.
    fn holder_label(&self, holder: Holder) -> String {
        match (holder, &self.tracked) {
            (Holder::Op(i), Some(ops)) => ops[i].label(),
            (Holder::Var(var), _) => format!("variable {var}"),
            (Holder::Op(i), None) => format!("op #{i}"),
        }
    }

    /// What the op at `from` waits for first, as "waits for ...", and the
    /// op that chain goes on with.
    fn first_wait(&self, ops: &[OpReport], from: usize) -> Option<(String, Option<usize>)> {
        let first = self.edges_from(from).next()?;
        // Every edge of the first one's kind: all the holders of it.
        let group: Vec<Holder> = self
            .edges_from(from)
            .filter(|e| e.needs == first.needs)
            .map(|e| e.to)
            .collect();
        let names = |holders: &[Holder]| -> String {
            let names: Vec<String> = holders.iter().map(|&h| self.holder_label(h)).collect();
            names.join(", ")
        };
        let mut then = group.iter().find_map(|h| match h {
            Holder::Op(i) => Some(*i),
            Holder::Var(_) => None,
        });
        let text = match &first.needs {
            Needs::Variable(var) => {
                // Those granted `var` hold it; the others wait for it too,
                // ahead of this op.
                let (holding, ahead): (Vec<Holder>, Vec<Holder>) =
                    group.iter().partition(|h| match h {
                        Holder::Op(i) => match &ops[*i].state {
                            OpState::Variables(waits) => waits.iter().all(|(v, _)| v != var),
                            _ => true,
                        },
                        Holder::Var(_) => true,
                    });
                if let Some(&Holder::Op(i)) = holding.first() {
                    then = Some(i);
                }
                match (holding.is_empty(), ahead.is_empty()) {
                    (false, true) => format!("{var}, held by {}", names(&holding)),
                    (false, false) => format!(
                        "{var}, held by {} (and after {})",
                        names(&holding),
                        names(&ahead)
                    ),
                    (true, _) => format!("{var} (after {})", names(&ahead)),
                }
            }
            Needs::Units(resource) => {
                let amount = match &ops[from].state {
                    OpState::Units(units) => units.iter().find(|(r, _)| r == resource).map(|u| u.1),
                    _ => None,
                };
                let place = self.resources.iter().position(|r| &r.name == resource);
                let r = place.map(|p| &self.resources[p]);
                let (free, cap) = r.map_or((0, 0), |r| (r.free, r.capacity));
                // A variable's units come back with the op that frees it:
                // the chain goes on there if no op holds any.
                let freer = |var: VarId| {
                    self.freers
                        .iter()
                        .find(|f| Some(f.resource) == place && f.var == var)
                        .map(|f| f.op)
                };
                let holders: Vec<String> = group
                    .iter()
                    .map(|&h| match (h, h_var(h).and_then(freer)) {
                        (_, Some(op)) => {
                            format!(
                                "{} (given back by {})",
                                self.holder_label(h),
                                ops[op].label()
                            )
                        }
                        _ => self.holder_label(h),
                    })
                    .collect();
                then = then.or_else(|| group.iter().find_map(|&h| h_var(h).and_then(freer)));
                format!(
                    "{} of `{resource}` ({free} of {cap} free), held by {}",
                    amount.unwrap_or_default(),
                    holders.join(", ")
                )
            }
            Needs::Result => format!("the result of {}", names(&group)),
            Needs::Worker(device) => {
                format!("a worker of `{device}`, all taken by {}", names(&group))
            }
            Needs::Turn(resource) => {
                format!(
                    "its turn for units of `{resource}`, after {}",
                    names(&group)
                )
            }
            Needs::Freed { resource, var } => {
                format!(
                    "units of `{resource}` held by {var}, given back by {}",
                    names(&group)
                )
            }
        };
        Some((text, then))
    }

    /// Chains of waits: what an op waits for, who holds that, what that one
    /// waits for, ... up to an op that waits for nothing the engine knows of
    /// (running, awaiting something else) or back to an op already in the
    /// chain (a cycle). Every waiting op is in one: first the chains of ops
    /// that nothing waits for, then of those not in a chain yet (cycles).
    pub(crate) fn chains(&self) -> Vec<String> {
        let Some(ops) = &self.tracked else {
            return Vec::new();
        };
        let mut waited_for = vec![false; ops.len()];
        for e in &self.waits {
            if let Holder::Op(to) = e.to {
                waited_for[to] = true;
            }
        }
        let mut shown = vec![false; ops.len()];
        let mut chains = Vec::new();
        let starts = (0..ops.len())
            .filter(|&i| !waited_for[i])
            .chain((0..ops.len()).filter(|&i| waited_for[i]));
        for start in starts {
            if shown[start] || self.edges_from(start).next().is_none() {
                continue;
            }
            let mut text = String::new();
            let mut seen = vec![start];
            let mut at = start;
            loop {
                shown[at] = true;
                let _ = write!(text, "{} ", ops[at].label());
                let Some((waits, then)) = self.first_wait(ops, at) else {
                    text.push_str(&state_words(&ops[at]));
                    break;
                };
                let _ = write!(text, "waits for {waits}");
                let Some(then) = then else { break };
                if seen.contains(&then) {
                    let _ = write!(text, " -> back to {}: a cycle", ops[then].label());
                    break;
                }
                if seen.len() == MAX_STEPS {
                    text.push_str(" -> ...");
                    break;
                }
                seen.push(then);
                text.push_str(" -> ");
                at = then;
            }
            chains.push(text);
        }
        chains
    }

    /// The report as a Graphviz graph: a node per unfinished op (labelled
    /// with its name and state) and per variable holding units an op waits
    /// for; an edge from each op to each op or variable it waits for,
    /// labelled with what it waits for (the variable, the resource, the
    /// result, a worker of the device), in red where it is part of a
    /// [cycle](Diagnostics::cycles). Render it with `dot -Tsvg`.
    ///
    /// Node names are `op<N>` (N: the op's place in push order, as in
    /// `op #N`) and `var<N>` (as in `var#N`). Without op tracking the graph
    /// has no ops.
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::builder().threads(1).track_ops(true).build()?;
    /// let x = engine.var_named("x", ());
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// let rx = std::sync::Mutex::new(rx);
    /// engine.op().name("holder").mutates(&[&x]).run(move |_| Ok(rx.lock().unwrap().recv()?))?;
    /// engine.op().name("waiter").reads(&[&x]).run(|_| Ok(()))?;
    /// let dot = engine.diagnostics().to_dot();
    /// assert!(dot.starts_with("digraph depflow {"));
    /// assert!(dot.contains("[label=\"`waiter`\\nwaits for variables\""));
    /// assert!(dot.contains("op1 -> op0 [label=\"`x` (var#"));
    /// tx.send(()).unwrap();
    /// engine.wait_all().wait()?;
    /// # Ok::<(), Error>(())
    /// ```
    pub fn to_dot(&self) -> String {
        let in_cycle: HashSet<&(Holder, Holder)> = self.in_cycle.iter().collect();
        let ops = self.tracked.as_deref().unwrap_or_default();
        let node = |holder: Holder| match holder {
            Holder::Op(i) => format!("op{}", ops[i].number.unwrap_or(i as u64)),
            Holder::Var(var) => format!("var{}", var.0),
        };
        let mut dot = String::from("digraph depflow {\n  rankdir=LR;\n  node [shape=box];\n");
        for (i, op) in ops.iter().enumerate() {
            let state = state_words(op);
            let _ = writeln!(
                dot,
                "  {} [label=\"{}\\n{}\"];",
                node(Holder::Op(i)),
                escape(&op.label()),
                escape(state.strip_prefix("is ").unwrap_or(&state)),
            );
        }
        let mut vars: Vec<VarId> = self
            .waits
            .iter()
            .filter_map(|e| match e.to {
                Holder::Var(v) => Some(v),
                Holder::Op(_) => None,
            })
            .collect();
        vars.sort_unstable();
        vars.dedup();
        let red = ", color=red, fontcolor=red, penwidth=2";
        for &var in &vars {
            let _ = writeln!(
                dot,
                "  {} [shape=ellipse, label=\"{}\"];",
                node(Holder::Var(var)),
                escape(&var.to_string())
            );
        }
        // Each variable's units come back with the op that frees it.
        for f in self.freers.iter().filter(|f| vars.contains(&f.var)) {
            let (from, to) = (Holder::Var(f.var), Holder::Op(f.op));
            let style = if in_cycle.contains(&(from, to)) {
                red
            } else {
                ""
            };
            let _ = writeln!(
                dot,
                "  {} -> {} [label=\"given back by\"{style}];",
                node(from),
                node(to)
            );
        }
        for e in &self.waits {
            let label = match &e.needs {
                Needs::Variable(var) => var.to_string(),
                Needs::Units(resource) => format!("units of `{resource}`"),
                Needs::Result => "result".into(),
                Needs::Worker(device) => format!("worker of `{device}`"),
                Needs::Turn(resource) => format!("turn for `{resource}`"),
                Needs::Freed { resource, .. } => format!("units of `{resource}`"),
            };
            let style = if in_cycle.contains(&(Holder::Op(e.from), e.to)) {
                red
            } else if e.binding {
                ""
            } else {
                ", style=dashed"
            };
            let _ = writeln!(
                dot,
                "  {} -> {} [label=\"{}\"{style}];",
                node(Holder::Op(e.from)),
                node(e.to),
                escape(&label)
            );
        }
        dot.push_str("}\n");
        dot
    }
}

/// The variable a holder is, if it is one.
fn h_var(holder: Holder) -> Option<VarId> {
    match holder {
        Holder::Var(var) => Some(var),
        Holder::Op(_) => None,
    }
}

/// An op's state in a few words, as the report's lines say it.
fn state_words(op: &OpReport) -> String {
    let since = op
        .in_state
        .map(|d| format!(" (for {d:.1?})"))
        .unwrap_or_default();
    match &op.state {
        OpState::Variables(_) => "waits for variables".into(),
        OpState::Units(_) => "waits for units".into(),
        OpState::Queued => format!("is queued{since}"),
        OpState::Running => format!("is running{since}"),
        OpState::Awaiting => format!("is awaiting inside its body{since}"),
    }
}

/// `text` inside a DOT string.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::ResourceReport;

    fn op(number: u64, state: OpState) -> OpReport {
        OpReport {
            name: Some(format!("o{number}")),
            number: Some(number),
            reads: Vec::new(),
            mutates: Vec::new(),
            state,
            waited: None,
            in_state: Some(Duration::from_secs(5)),
            device_index: 0,
            device: "cpu".into(),
            awaited: Vec::new(),
            awaits: Vec::new(),
            holds: Vec::new(),
            asks: Vec::new(),
            frees: Vec::new(),
        }
    }

    fn report(ops: Vec<OpReport>, resources: Vec<ResourceReport>) -> Diagnostics {
        Diagnostics {
            in_flight: ops.len(),
            resources,
            waiting_for_units: Vec::new(),
            tracked: Some(ops),
            quiet: None,
            waits: Vec::new(),
            cycles: Vec::new(),
            in_cycle: Vec::new(),
            freers: Vec::new(),
        }
    }

    /// `memory`, with `by_ops` units held by ops besides these.
    fn memory(free: u64, held_by_vars: Vec<(VarId, u64)>, by_ops: u64) -> ResourceReport {
        ResourceReport {
            name: "memory".into(),
            capacity: free + by_ops + held_by_vars.iter().map(|v| v.1).sum::<u64>(),
            free,
            held_by_ops: Vec::new(),
            held_by_vars,
        }
    }

    /// `o0` awaits `o1`'s result while holding 2 units; `o1` needs 2.
    fn units_cycle(free: u64, held_by_vars: Vec<(VarId, u64)>) -> Diagnostics {
        let mut holder = op(0, OpState::Awaiting);
        holder.holds = vec![("memory".into(), 2)];
        holder.awaited = vec![1];
        let mut parked = op(1, OpState::Units(vec![("memory".into(), 2)]));
        parked.asks = vec![("memory".into(), 2, false)];
        let mut d = report(vec![holder, parked], vec![memory(free, held_by_vars, 2)]);
        analyse(&mut d, &[("cpu".into(), None)], STUCK_AFTER);
        d
    }

    #[test]
    fn units_bind_only_where_the_holder_is_needed() {
        // Nothing else could free enough: a cycle.
        let d = units_cycle(1, Vec::new());
        assert_eq!(
            d.cycles,
            [Cycle::Ops(vec![
                ("`o0`".into(), Needs::Result),
                ("`o1`".into(), Needs::Units("memory".into())),
            ])]
        );
        assert!(
            d.to_string()
                .contains("`o1` waits for units of `memory` held by `o0`")
        );
        // Two units besides the holder's: `o1` can get them once the
        // variable's go, without `o0`'s: no cycle, but the edges are drawn.
        let d = units_cycle(0, vec![(VarId(9), 2)]);
        assert!(d.cycles.is_empty(), "{d}");
        assert!(
            d.to_dot()
                .contains("op1 -> op0 [label=\"units of `memory`\", style=dashed]")
        );
        assert!(
            d.to_dot()
                .contains("op1 -> var9 [label=\"units of `memory`\", style=dashed]")
        );
    }

    /// An op parked for `amount` units of `memory` (lasting if `lasting`)
    /// that frees `frees` (allocates it again).
    fn parked(number: u64, amount: u64, lasting: bool, frees: Option<VarId>) -> OpReport {
        let mut o = op(number, OpState::Units(vec![("memory".into(), amount)]));
        o.asks = vec![("memory".into(), amount, lasting)];
        o.frees = frees
            .map(|v| (v, Some("memory".into())))
            .into_iter()
            .collect();
        o
    }

    #[test]
    fn units_of_a_variable_come_back_only_with_the_op_that_frees_it() {
        let v = VarId(7);
        // Nothing pushed frees `v`: the program may still delete it.
        let mut d = report(
            vec![parked(0, 1, false, None)],
            vec![memory(0, vec![(v, 1)], 0)],
        );
        analyse(&mut d, &[("cpu".into(), None)], STUCK_AFTER);
        assert!(d.cycles.is_empty(), "{d}");
        // The op waiting allocates `v` again: it needs new units before the
        // old ones come back. A cycle of one.
        let mut d = report(
            vec![parked(0, 1, true, Some(v))],
            vec![memory(0, vec![(v, 1)], 0)],
        );
        analyse(&mut d, &[("cpu".into(), None)], STUCK_AFTER);
        let freed = Needs::Freed {
            resource: "memory".into(),
            var: v,
        };
        assert_eq!(d.cycles, [Cycle::Ops(vec![("`o0`".into(), freed.clone())])]);
        assert!(
            d.to_string().contains(
                "deadlock: `o0` waits for units of `memory` held by var#7, which only `o0` \
                 gives back: none of them can go on (the units they wait for are given back \
                 only by ops pushed after"
            ),
            "{d}"
        );
        assert!(
            d.to_dot()
                .contains("var7 -> op0 [label=\"given back by\", color=red")
        );
        // Room for both: no cycle.
        let mut d = report(
            vec![parked(0, 1, true, Some(v))],
            vec![memory(1, vec![(v, 1)], 0)],
        );
        analyse(&mut d, &[("cpu".into(), None)], STUCK_AFTER);
        assert!(d.cycles.is_empty(), "{d}");
        // Units held by nothing the report sees (an op that just ended, say)
        // may come back: no cycle.
        let mut d = report(
            vec![parked(0, 1, true, Some(v))],
            vec![memory(0, vec![(v, 1)], 1)],
        );
        analyse(&mut d, &[("cpu".into(), None)], STUCK_AFTER);
        assert!(d.cycles.is_empty(), "{d}");
    }

    #[test]
    fn an_allocating_op_waits_for_its_turn_behind_older_requests() {
        let v = VarId(7);
        // `o0` (temporary) waits for `v`'s units; `o1` would free them but
        // allocates, so it comes after `o0`.
        let ops = vec![parked(0, 1, false, None), parked(1, 1, true, Some(v))];
        let mut d = report(ops, vec![memory(0, vec![(v, 1)], 0)]);
        analyse(&mut d, &[("cpu".into(), None)], STUCK_AFTER);
        assert_eq!(
            d.cycles,
            [Cycle::Ops(vec![
                (
                    "`o0`".into(),
                    Needs::Freed {
                        resource: "memory".into(),
                        var: v
                    }
                ),
                ("`o1`".into(), Needs::Turn("memory".into())),
            ])]
        );
        assert!(d.to_string().contains(
            "`o1` waits for its turn for units of `memory`, after `o0`: none of them can go on"
        ));
        // Without a lasting demand it overtakes `o0`: no cycle.
        let ops = vec![parked(0, 1, false, None), parked(1, 1, false, Some(v))];
        let mut d = report(ops, vec![memory(0, vec![(v, 1)], 1)]);
        analyse(&mut d, &[("cpu".into(), None)], STUCK_AFTER);
        assert!(d.cycles.is_empty(), "{d}");
    }

    #[test]
    fn a_long_chain_of_waits_is_no_cycle_and_no_stack_overflow() {
        let n = 100_000;
        let ops: Vec<OpReport> = (0..n)
            .map(|i| {
                let mut o = op(i as u64, OpState::Awaiting);
                if i + 1 < n {
                    o.awaited = vec![i + 1];
                }
                o
            })
            .collect();
        let mut d = report(ops, Vec::new());
        analyse(&mut d, &[("cpu".into(), None)], STUCK_AFTER);
        assert!(d.cycles.is_empty());
        // Closing it makes one cycle through all of them.
        d.tracked.as_mut().unwrap()[n - 1].awaited = vec![0];
        analyse(&mut d, &[("cpu".into(), None)], STUCK_AFTER);
        assert_eq!(d.cycles.len(), 1);
        assert_eq!(d.cycles[0].ops().len(), n);
        assert_eq!(d.cycles[0].ops()[0], "`o0`");
        assert_eq!(d.chains()[0].matches(" -> ").count(), MAX_STEPS, "capped");
    }

    #[test]
    fn a_queue_on_one_variable_is_a_chain_of_nearest_waits() {
        let x = VarId(1);
        let access = |i: u64, write: bool| {
            let mut o = op(i, OpState::Variables(Vec::new()));
            if write {
                o.mutates = vec![x]
            } else {
                o.reads = vec![x]
            }
            o
        };
        // Reads first, then a write, reads, a write, a read.
        let ops: Vec<OpReport> = [false, false, true, false, false, true, false]
            .iter()
            .enumerate()
            .map(|(i, &w)| access(i as u64, w))
            .collect();
        let waits = |nearest| -> Vec<Vec<usize>> {
            conflicts(&ops, nearest)
                .into_iter()
                .map(|w| w.into_iter().flat_map(|(_, before)| before).collect())
                .collect()
        };
        let nearest: Vec<Vec<usize>> = vec![
            vec![],
            vec![],
            vec![0, 1],
            vec![2],
            vec![2],
            vec![3, 4],
            vec![5],
        ];
        assert_eq!(waits(true), nearest);
        assert_eq!(waits(false)[5], [0, 1, 2, 3, 4]);
        assert_eq!(waits(false)[6], [2, 5]);
    }

    #[test]
    fn two_separate_cycles_are_two_and_the_shortest_way_round() {
        // o0 <-> o1, and o2 -> o3 -> o4 -> o2 with a shortcut o2 -> o4.
        let mut ops: Vec<OpReport> = (0..5).map(|i| op(i, OpState::Awaiting)).collect();
        ops[0].awaited = vec![1];
        ops[1].awaited = vec![0];
        ops[2].awaited = vec![3, 4];
        ops[3].awaited = vec![4];
        ops[4].awaited = vec![2];
        let mut d = report(ops, Vec::new());
        analyse(&mut d, &[("cpu".into(), None)], STUCK_AFTER);
        let cycles: Vec<Vec<&str>> = d.cycles.iter().map(Cycle::ops).collect();
        assert_eq!(cycles, [vec!["`o0`", "`o1`"], vec!["`o2`", "`o4`"]]);
    }

    #[test]
    fn busy_workers_are_stuck_only_after_a_while() {
        let running = op(0, OpState::Running);
        let mut fresh = op(1, OpState::Running);
        fresh.in_state = Some(Duration::from_millis(10));
        let queued = op(2, OpState::Queued);
        let devices = [("cpu".to_string(), Some(2))];
        let mut d = report(vec![running.clone(), fresh, queued.clone()], Vec::new());
        analyse(&mut d, &devices, STUCK_AFTER);
        assert!(d.cycles.is_empty(), "one body just started: not stuck");
        assert_eq!(d.waits.len(), 2, "but the queued op waits for both");
        // A free worker: nothing waits for one.
        let mut d = report(vec![running.clone(), queued.clone()], Vec::new());
        analyse(&mut d, &devices, STUCK_AFTER);
        assert!(d.waits.is_empty() && d.cycles.is_empty());
        // Both workers stuck.
        let mut d = report(vec![running.clone(), running, queued], Vec::new());
        d.tracked.as_mut().unwrap()[1].number = Some(1);
        analyse(&mut d, &devices, STUCK_AFTER);
        assert!(matches!(&d.cycles[..], [Cycle::Workers { queued, .. }] if queued == &["`o2`"]));
    }
}
