//! What a stuck engine is waiting for: [`Engine::diagnostics`](crate::Engine::diagnostics).
//!
//! Ops parked for resource units are always listed (the broker holds them).
//! Every other unfinished op (waiting for its variables, queued, running,
//! awaiting inside its body), how long ago each was pushed, and who holds a
//! resource's units are known only if the engine tracks its ops
//! ([`EngineBuilder::track_ops`](crate::EngineBuilder::track_ops), or a
//! [watchdog](crate::EngineBuilder::watchdog)): finding them otherwise would
//! mean walking every variable's lock-free chain while workers free ops, and
//! tracking costs a lock per push, per start and per completion (and per
//! allocation), which a production engine should not pay by default.
//!
//! Who waits for whom among the tracked ops, the chains the report prints,
//! its cycles and its Graphviz form are `waits`'; the registry is `track`'s.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use super::stuck::Freer;
use super::waits::{Cycle, Holder, MAX_CHAINS, WaitEdge};
use crate::dep::OpBlock;
use crate::error::VarId;

/// A snapshot of an engine: its resources and who holds their units, and the
/// ops that have not finished, with what each waits for and since when.
/// `Display` prints a readable report, one line per op in push order:
///
/// ```text
/// 6 op(s) in flight
/// no op has started or ended for 3.9s
/// resource `memory`: 1 of 4 free
///   1 held by op `compute`
///   2 held by variable `cache` (var#0)
/// `fetch` is awaiting inside its body; pushed 7.4s ago
/// `compute` is running; pushed 7.3s ago
/// op #3 is running; pushed 7.2s ago
/// `later` is queued: ready, waiting for a worker; pushed 3.9s ago
/// `needs memory` waits for units: 2 of `memory` (1 of 4 free); pushed 3.9s ago
/// `after it` waits for variables: `activations` (var#1) (after `needs memory`); pushed 3.8s ago
/// ```
///
/// An op awaiting inside its body while it holds units that a parked op
/// needs is named as a possible deadlock (if it waits for that op, neither
/// can go on: see [`Resource`](crate::Resource) for the condition under
/// which a program that fits serially cannot deadlock):
///
/// ```text
/// possible deadlock: `fetch` awaits inside its body holding 1 of `memory`, which `needs memory` waits for: ...
/// ```
///
/// With tracking, it follows every wait to its end, as a chain: the
/// variable, the op holding it, what that one waits for, resources and who
/// holds their units, down to an op that runs (or awaits something the
/// engine does not know). It names the [cycles](Diagnostics::cycles) it
/// finds, of ops that cannot go on because each waits for the next (an
/// async op awaiting the handle of an op that needs a variable or units
/// the first one holds; an op waiting for units that variables hold, which
/// only ops pushed after it give back, and those waiting for it: a push
/// order that does not fit a [`Resource`](crate::Resource) when run
/// serially), and devices whose every worker is stuck in a body while ops
/// queue for them:
///
/// ```text
/// what waits for what:
///   `after it` waits for `activations` (var#1) (after `needs memory`) -> `needs memory` waits for 2 of `memory` (1 of 4 free), held by `compute`, variable `cache` (var#0) -> `compute` is running (for 7.3s)
///   `outer` waits for the result of `inner` -> `inner` waits for `x` (var#2), held by `outer` -> back to `outer`: a cycle
/// deadlock: `outer` waits for the result of `inner`; `inner` waits for `x` (var#2), held by `outer`: none of them can go on (...)
/// deadlock: `load 2` waits for units of `memory` held by `buf0` (var#3), which only `delete_var` gives back; `delete_var` waits for `buf0` (var#3), held by `preprocess 0`; `preprocess 0` waits for its turn for units of `memory`, after `load 2`: none of them can go on (... this push order does not fit `memory` when run serially; push each consumer ... or give `memory` more units)
/// ```
///
/// [`to_dot`](Diagnostics::to_dot) draws the same as a Graphviz graph.
/// The engine's [watchdog](crate::EngineBuilder::watchdog) takes this
/// report by itself when the engine stalls.
///
/// (Variables print by name if they have one, see
/// [`Engine::var_named`](crate::Engine::var_named); unnamed ops as `op #N`,
/// their place in push order.)
///
/// ```
/// use depflow::{Engine, Error};
///
/// let engine = Engine::builder().track_ops(true).build()?;
/// let memory = engine.new_resource("memory", 2);
/// let held = engine.var_named("cache", ());
/// let (x, y) = (engine.new_var(), engine.new_var());
/// // `held` keeps both units until it is deleted...
/// engine.op().mutates(&[&held]).allocates(&memory, 2, &held).run(|_| Ok(()))?.wait()?;
/// // ...so this op cannot start, and the next one waits for it.
/// engine.op().name("needs memory").mutates(&[&x]).uses(&memory, 1).run(|_| Ok(()))?;
/// engine.op().name("after it").reads(&[&x]).mutates(&[&y]).run(|_| Ok(()))?;
///
/// let report = engine.diagnostics();
/// assert_eq!(report.waiting_for_units()[0].name(), Some("needs memory"));
/// let text = report.to_string();
/// assert!(text.contains("`needs memory` waits for units: 1 of `memory` (0 of 2 free)"));
/// assert!(text.contains("`after it` waits for variables:"));
/// assert!(text.contains("2 held by variable `cache` (var#"));
/// assert_eq!(report.resources()[0].held_by_vars(), [(held.id(), 2)]);
/// assert!(report.ops().unwrap()[0].waited().is_some());
/// engine.delete_var(&held, drop)?.wait()?; // frees the units: both ops run
/// engine.wait_all().wait()?;
/// # Ok::<(), Error>(())
/// ```
///
/// A cycle, on demand: `outer` awaits the handle of `inner`, which needs
/// the variable `outer` holds.
///
/// ```
/// use depflow::{BoxError, Cycle, Engine, Error, Needs};
/// use futures::FutureExt;
///
/// let engine = Engine::builder().track_ops(true).build()?;
/// let x = engine.var_named("x", ());
/// let (give_up, given_up) = futures::channel::oneshot::channel::<()>();
/// let (e, x2) = (engine.clone(), x.clone());
/// engine.op().name("outer").mutates(&[&x]).run_async(move |_| async move {
///     let inner = e.op().name("inner").reads(&[&x2]).run(|_| Ok(()))?;
///     futures::select! {
///         done = inner.fuse() => done?, // never: `inner` waits for `outer`
///         _ = given_up.fuse() => {}
///     }
///     Ok::<_, BoxError>(())
/// })?;
/// let report = loop {
///     let report = engine.diagnostics();
///     if !report.cycles().is_empty() {
///         break report;
///     }
///     std::thread::yield_now();
/// };
/// assert_eq!(
///     report.cycles(),
///     [Cycle::Ops(vec![
///         ("`outer`".into(), Needs::Result),
///         ("`inner`".into(), Needs::Variable(x.id())),
///     ])]
/// );
/// assert!(report.to_string().contains("deadlock: `outer` waits for the result of `inner`"));
/// give_up.send(()).unwrap();
/// engine.wait_all().wait()?;
/// # Ok::<(), Error>(())
/// ```
///
/// A push order that does not fit: on one unit, `load b` is pushed before
/// what frees `a`'s unit, and that (`delete_var`) waits for `use a`, which
/// allocates too, so it takes its unit after `load b`.
///
/// ```
/// use std::time::Duration;
/// use depflow::{Cycle, Engine, Error, Needs};
///
/// let engine = Engine::builder().track_ops(true).build()?;
/// let memory = engine.new_resource("memory", 1);
/// let (a, b, out) = (engine.var_named("a", ()), engine.var_named("b", ()), engine.new_var());
/// for (name, v) in [("load a", &a), ("load b", &b)] {
///     engine.op().name(name).mutates(&[v]).allocates(&memory, 1, v).run(|_| Ok(()))?;
/// }
/// let use_a = engine.op().name("use a").reads(&[&a]).mutates(&[&out]);
/// use_a.allocates(&memory, 1, &out).run(|_| Ok(()))?;
/// engine.delete_var(&a, drop)?;
/// let report = loop {
///     let report = engine.diagnostics();
///     if !report.cycles().is_empty() {
///         break report;
///     }
///     std::thread::yield_now();
/// };
/// assert_eq!(report.cycles()[0].ops(), ["`load b`", "`delete_var`", "`use a`"]);
/// let Cycle::Ops(steps) = &report.cycles()[0] else { unreachable!() };
/// assert_eq!(steps[0].1, Needs::Freed { resource: "memory".into(), var: a.id() });
/// assert_eq!(steps[2].1, Needs::Turn("memory".into()));
/// let text = report.to_string();
/// assert!(text.contains("deadlock: `load b` waits for units of `memory` held by `a` (var#"));
/// assert!(text.contains("this push order does not fit `memory` when run serially"));
/// // Nothing ends it but a shutdown that stops waiting for its ops.
/// let shutdown = engine.shutdown_timeout(Duration::from_millis(10));
/// assert!(matches!(shutdown, Err(Error::TimedOut { .. })));
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Diagnostics {
    pub(crate) in_flight: usize,
    pub(crate) resources: Vec<ResourceReport>,
    pub(crate) waiting_for_units: Vec<OpReport>,
    pub(crate) tracked: Option<Vec<OpReport>>,
    /// How long since an op last started or ended (tracked engines).
    pub(crate) quiet: Option<Duration>,
    /// Who waits for whom among `tracked` (see `waits`).
    pub(crate) waits: Vec<WaitEdge>,
    pub(crate) cycles: Vec<Cycle>,
    /// The edges that are part of a cycle: from an op to whom it waits
    /// for (as in `waits`), or from a variable to the op that gives its
    /// units back (as in `freers`).
    pub(crate) in_cycle: Vec<(Holder, Holder)>,
    /// The variables holding units, each with the first op that gives them
    /// back (see `stuck`).
    pub(crate) freers: Vec<Freer>,
}

impl Diagnostics {
    /// Ops pushed and not finished, with or without a bound: what
    /// [`Engine::in_flight`](crate::Engine::in_flight) says.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Every resource of the engine, in creation order.
    pub fn resources(&self) -> &[ResourceReport] {
        &self.resources
    }

    /// Ops whose variables allow them but whose units are not free.
    pub fn waiting_for_units(&self) -> &[OpReport] {
        &self.waiting_for_units
    }

    /// Every unfinished op, in push order, if the engine tracks its ops.
    pub fn ops(&self) -> Option<&[OpReport]> {
        self.tracked.as_deref()
    }

    /// How long it has been since an op of the engine last started or
    /// ended (or since the engine started, if none has), when the report
    /// was taken; known only if the engine tracks its ops.
    pub fn quiet_for(&self) -> Option<Duration> {
        self.quiet
    }

    /// The wait cycles found among the unfinished ops: ops each waiting for
    /// the next and the last for the first, which none of them can leave on
    /// its own, and devices whose every worker is stuck in a body while ops
    /// queued for the device wait (see [`Cycle`]). Known only if the engine
    /// tracks its ops.
    pub fn cycles(&self) -> &[Cycle] {
        &self.cycles
    }
}

/// One resource in a [`Diagnostics`] report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceReport {
    pub(crate) name: String,
    pub(crate) capacity: u64,
    pub(crate) free: u64,
    pub(crate) held_by_ops: Vec<(String, u64)>,
    pub(crate) held_by_vars: Vec<(VarId, u64)>,
}

impl ResourceReport {
    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its capacity.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Units free now.
    pub fn free(&self) -> u64 {
        self.free
    }

    /// The unfinished ops holding units of it (granted, not finished yet:
    /// queued, running or awaiting), each as its report labels it (`` `name` ``
    /// or `op #N`) with the units it holds, in push order. Empty unless the
    /// engine tracks its ops.
    pub fn held_by_ops(&self) -> &[(String, u64)] {
        &self.held_by_ops
    }

    /// The variables holding units of it (those that ops allocated to them,
    /// [`OpBuilder::allocates`](crate::OpBuilder::allocates)), with how many.
    /// Empty unless the engine tracks its ops.
    pub fn held_by_vars(&self) -> &[(VarId, u64)] {
        &self.held_by_vars
    }
}

/// What an op waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpState {
    /// Some of its variables have not granted it yet: each with the earlier
    /// unfinished ops (by name, or `#` and push number) it comes after there.
    Variables(Vec<(VarId, Vec<String>)>),
    /// Its variables allow it; these units (resource, amount) are not free.
    Units(Vec<(String, u64)>),
    /// Ready (its variables and units allow it), waiting for a worker of
    /// its executor.
    Queued,
    /// Its body is running (on a stream device: or its device work is).
    Running,
    /// Its async body is awaiting (its future is pending), or was woken and
    /// waits for a worker to resume it.
    Awaiting,
}

/// One unfinished op in a [`Diagnostics`] report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpReport {
    pub(crate) name: Option<String>,
    pub(crate) number: Option<u64>,
    pub(crate) reads: Vec<VarId>,
    pub(crate) mutates: Vec<VarId>,
    pub(crate) state: OpState,
    pub(crate) waited: Option<Duration>,
    /// How long it has been in `state` (tracked ops).
    pub(crate) in_state: Option<Duration>,
    pub(crate) device_index: u16,
    /// Its device's name (filled in by the engine).
    pub(crate) device: String,
    /// While awaiting: the ops whose handles its body awaits, by their
    /// place in the report's ops, and named.
    pub(crate) awaited: Vec<usize>,
    pub(crate) awaits: Vec<String>,
    /// The units it holds: (resource, amount).
    pub(crate) holds: Vec<(String, u64)>,
    /// Every units demand it makes: (resource, amount, lasting). A lasting
    /// one (some units are handed on to an output) is granted in push
    /// order, after every older op asking for units of that resource.
    pub(crate) asks: Vec<(String, u64, bool)>,
    /// The variables whose units its end gives back: (variable, of this
    /// resource, or of every resource for `None`: a delete). An op that
    /// allocates a variable replaces what that variable held.
    pub(crate) frees: Vec<(VarId, Option<String>)>,
}

impl OpReport {
    /// The op's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The variables it reads and mutates.
    pub fn vars(&self) -> (&[VarId], &[VarId]) {
        (&self.reads, &self.mutates)
    }

    /// What it waits for.
    pub fn state(&self) -> &OpState {
        &self.state
    }

    /// How long ago it was pushed, when the report was taken (known only if
    /// the engine tracks its ops).
    pub fn waited(&self) -> Option<Duration> {
        self.waited
    }

    /// How long it has been in its state, when the report was taken: since
    /// its push for an op not started, since its body started (or last
    /// resumed) for a running one, since it last suspended for an awaiting
    /// one. Known only if the engine tracks its ops.
    pub fn in_state_for(&self) -> Option<Duration> {
        self.in_state
    }

    /// The name of the device it runs on.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// While its async body awaits: the ops of the same engine whose
    /// [`OpHandle`](crate::OpHandle)s it found pending when it last
    /// suspended, as the report labels them. Empty otherwise, and unless the
    /// engine tracks its ops.
    pub fn awaits(&self) -> &[String] {
        &self.awaits
    }

    /// How the report names it: `` `name` ``, or `op #N` by its place in
    /// push order.
    pub(crate) fn label(&self) -> String {
        match (&self.name, self.number) {
            (Some(name), _) => format!("`{name}`"),
            (None, Some(n)) => format!("op #{n}"),
            (None, None) => "unnamed op".into(),
        }
    }
}

impl OpReport {
    /// Describes a live op; `state` is filled in by the caller.
    pub(crate) fn of(op: &OpBlock, number: Option<u64>) -> Self {
        let (mut reads, mut mutates) = (Vec::new(), Vec::new());
        let mut frees = Vec::new();
        for e in op.edges() {
            if e.is_write() {
                mutates.push(e.var.id());
                if op.is_deletion() {
                    frees.push((e.var.id(), None));
                }
            } else {
                reads.push(e.var.id());
            }
        }
        let mut asks = Vec::new();
        if let Some(units) = op.units() {
            let demands: Vec<_> = units.demands().collect();
            asks.extend(
                demands
                    .iter()
                    .map(|(res, d)| (res.name().to_owned(), d.amount, d.lasting)),
            );
            for l in units.lasting.iter() {
                let (Some(edge), Some((res, _))) = (op.edges().get(l.edge), demands.get(l.demand))
                else {
                    continue;
                };
                frees.push((edge.var.id(), Some(res.name().to_owned())));
            }
        }
        Self {
            name: op.name().map(str::to_owned),
            number,
            reads,
            mutates,
            state: OpState::Queued,
            waited: None,
            in_state: None,
            device_index: op.device_index(),
            device: String::new(),
            awaited: Vec::new(),
            awaits: Vec::new(),
            holds: Vec::new(),
            asks,
            frees,
        }
    }

    /// The units `op` asks for, named.
    pub(crate) fn units_of(op: &OpBlock) -> Vec<(String, u64)> {
        op.units().map_or_else(Vec::new, |u| {
            u.demands()
                .map(|(res, d)| (res.name().to_owned(), d.amount))
                .collect()
        })
    }
}

impl Diagnostics {
    /// Ops awaiting inside their body while they hold units of a resource
    /// that a parked op needs more of than are free: (the awaiting op's
    /// label, the resource, the units it holds, the parked op's label). If
    /// the awaiting op waits for the parked one, neither can go on: the
    /// documented limit of the deadlock-freedom guarantee (`core::tickets`).
    /// Known only if the engine tracks its ops.
    fn units_awaited_on(&self) -> Vec<(String, &str, u64, String)> {
        let Some(ops) = &self.tracked else {
            return Vec::new();
        };
        let awaiting: Vec<String> = ops
            .iter()
            .filter(|op| op.state == OpState::Awaiting)
            .map(OpReport::label)
            .collect();
        let mut found = Vec::new();
        for r in &self.resources {
            for (holder, units) in &r.held_by_ops {
                if !awaiting.contains(holder) {
                    continue;
                }
                for op in ops {
                    if let OpState::Units(needs) = &op.state
                        && needs.iter().any(|(name, n)| *name == r.name && *n > r.free)
                    {
                        found.push((holder.clone(), r.name.as_str(), *units, op.label()));
                    }
                }
            }
        }
        found
    }
}

/// For each op (push order) waiting on variables: per variable, the
/// earlier ops (their places in `ops`) it conflicts with there, which it
/// waits for: all of them, or with `nearest` only those right before it
/// (the reads since the last write for a write, else that write), through
/// which it waits for the others. Empty for the other ops.
pub(crate) fn conflicts(ops: &[OpReport], nearest: bool) -> Vec<Vec<(VarId, Vec<usize>)>> {
    // Per variable, the ops seen so far: (place, mutates); with `nearest`
    // only the last write and the reads since.
    let mut seen: HashMap<VarId, Vec<(usize, bool)>> = HashMap::new();
    let mut found = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let touches: Vec<(VarId, bool)> = op
            .mutates
            .iter()
            .map(|&v| (v, true))
            .chain(op.reads.iter().map(|&v| (v, false)))
            .collect();
        let mut waits = Vec::new();
        if let OpState::Variables(_) = op.state {
            for &(var, write) in &touches {
                let earlier = seen.get(&var).map_or(&[][..], Vec::as_slice);
                let mut before: Vec<usize> = earlier
                    .iter()
                    .filter(|(_, w)| *w || write)
                    .map(|&(place, _)| place)
                    .collect();
                if nearest && write && before.len() > 1 && earlier[0].1 {
                    // The last write comes first, the reads since after it.
                    before.remove(0);
                }
                if !before.is_empty() {
                    waits.push((var, before));
                }
            }
        }
        found.push(waits);
        for (var, write) in touches {
            let earlier = seen.entry(var).or_default();
            if nearest && write {
                earlier.clear();
            }
            earlier.push((i, write));
        }
    }
    found
}

/// For tracked ops waiting on variables (push order): per variable, the
/// earlier unfinished ops it conflicts with there.
pub(crate) fn blockers(ops: &mut [OpReport]) {
    let labels: Vec<String> = ops.iter().map(OpReport::label).collect();
    let found = conflicts(ops, false);
    for (op, waits) in ops.iter_mut().zip(found) {
        if let OpState::Variables(vars) = &mut op.state {
            *vars = waits
                .into_iter()
                .map(|(var, before)| (var, before.into_iter().map(|i| labels[i].clone()).collect()))
                .collect();
        }
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} op(s) in flight", self.in_flight)?;
        if let Some(quiet) = self.quiet
            && self.in_flight > 0
        {
            writeln!(f, "no op has started or ended for {quiet:.1?}")?;
        }
        for r in &self.resources {
            writeln!(
                f,
                "resource `{}`: {} of {} free",
                r.name, r.free, r.capacity
            )?;
            for (op, units) in &r.held_by_ops {
                // Labels are `name` or "op #N".
                let op_ = if op.starts_with('`') { "op " } else { "" };
                writeln!(f, "  {units} held by {op_}{op}")?;
            }
            for (var, units) in &r.held_by_vars {
                writeln!(f, "  {units} held by variable {var}")?;
            }
        }
        let free = |name: &str| {
            self.resources
                .iter()
                .find(|r| r.name == name)
                .map_or((0, 0), |r| (r.free, r.capacity))
        };
        let ops: &[OpReport] = self.tracked.as_deref().unwrap_or(&self.waiting_for_units);
        for op in ops {
            write!(f, "{} ", op.label())?;
            match &op.state {
                OpState::Queued => write!(f, "is queued: ready, waiting for a worker")?,
                OpState::Running => write!(f, "is running")?,
                OpState::Awaiting if op.awaits.is_empty() => {
                    write!(f, "is awaiting inside its body")?;
                }
                OpState::Awaiting => write!(
                    f,
                    "is awaiting inside its body, for the result of {}",
                    op.awaits.join(", ")
                )?,
                OpState::Units(units) => {
                    let units: Vec<String> = units
                        .iter()
                        .map(|(name, n)| {
                            let (free, cap) = free(name);
                            format!("{n} of `{name}` ({free} of {cap} free)")
                        })
                        .collect();
                    write!(f, "waits for units: {}", units.join(", "))?;
                }
                OpState::Variables(vars) => {
                    let vars: Vec<String> = vars
                        .iter()
                        .map(|(var, after)| format!("{var} (after {})", after.join(", ")))
                        .collect();
                    write!(f, "waits for variables: {}", vars.join("; "))?;
                }
            }
            match op.waited {
                Some(waited) => writeln!(f, "; pushed {waited:.1?} ago")?,
                None => writeln!(f)?,
            }
        }
        let chains = self.chains();
        if !chains.is_empty() {
            writeln!(f, "what waits for what:")?;
        }
        for chain in chains.iter().take(MAX_CHAINS) {
            writeln!(f, "  {chain}")?;
        }
        if chains.len() > MAX_CHAINS {
            writeln!(f, "  ... and {} more", chains.len() - MAX_CHAINS)?;
        }
        for cycle in &self.cycles {
            writeln!(f, "{cycle}")?;
        }
        for (holder, resource, units, parked) in self.units_awaited_on() {
            writeln!(
                f,
                "possible deadlock: {holder} awaits inside its body holding {units} of \
                 `{resource}`, which {parked} waits for: if {holder} waits for {parked} (its \
                 handle, a wait that covers it, or anything it produces), neither can go on; \
                 declare that dependency through a variable instead (see `Resource`)"
            )?;
        }
        if self.tracked.is_none() {
            writeln!(
                f,
                "(other unfinished ops, their ages and who holds units are listed only with \
                 EngineBuilder::track_ops)"
            )?;
        }
        Ok(())
    }
}
