//! What a stuck engine is waiting for: [`Engine::diagnostics`](crate::Engine::diagnostics).
//!
//! Ops parked for resource units are always listed (the broker holds them).
//! Ops still waiting for their variables are listed only if the engine tracks
//! its ops ([`EngineBuilder::track_ops`](crate::EngineBuilder::track_ops)):
//! finding them otherwise would mean walking every variable's lock-free chain
//! while workers free ops, and tracking costs a lock per push and per
//! completion, which a production engine should not pay by default.

use std::collections::HashMap;
use std::fmt;

use crate::dep::OpBlock;
use crate::error::VarId;

/// A snapshot of an engine: its resources, and the ops that have not
/// finished with what each waits for. `Display` prints a readable report.
///
/// ```
/// use depflow::{Engine, Error};
///
/// let engine = Engine::builder().track_ops(true).build()?;
/// let memory = engine.new_resource("memory", 2);
/// let (held, x, y) = (engine.new_var(), engine.new_var(), engine.new_var());
/// // `held` keeps both units until it is deleted...
/// engine.op().mutates(&[&held]).allocates(&memory, 2, &held).run(|_| Ok::<_, Error>(()))?.wait()?;
/// // ...so this op cannot start, and the next one waits for it.
/// engine.op().name("needs memory").mutates(&[&x]).uses(&memory, 1).run(|_| Ok::<_, Error>(()))?;
/// engine.op().name("after it").reads(&[&x]).mutates(&[&y]).run(|_| Ok::<_, Error>(()))?;
///
/// let report = engine.diagnostics();
/// assert_eq!(report.waiting_for_units()[0].name(), Some("needs memory"));
/// let text = report.to_string();
/// assert!(text.contains("`needs memory` waits for units: 1 of `memory` (0 of 2 free)"));
/// assert!(text.contains("`after it` waits for variables:"));
/// engine.delete_var(&held, drop)?.wait()?; // frees the units: both ops run
/// engine.wait_all().wait()?;
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Diagnostics {
    pub(crate) in_flight: usize,
    pub(crate) resources: Vec<ResourceReport>,
    pub(crate) waiting_for_units: Vec<OpReport>,
    pub(crate) tracked: Option<Vec<OpReport>>,
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
}

/// One resource in a [`Diagnostics`] report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceReport {
    pub(crate) name: String,
    pub(crate) capacity: u64,
    pub(crate) free: u64,
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
    /// Queued on its executor, or running.
    Running,
}

/// One unfinished op in a [`Diagnostics`] report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpReport {
    pub(crate) name: Option<String>,
    pub(crate) number: Option<u64>,
    pub(crate) reads: Vec<VarId>,
    pub(crate) mutates: Vec<VarId>,
    pub(crate) state: OpState,
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

    fn label(&self) -> String {
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
        for e in op.edges() {
            if e.is_write() {
                mutates.push(e.var.id());
            } else {
                reads.push(e.var.id());
            }
        }
        Self {
            name: op.name().map(str::to_owned),
            number,
            reads,
            mutates,
            state: OpState::Running,
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

/// For tracked ops waiting on variables (push order): per variable, the
/// earlier unfinished ops it conflicts with there.
pub(crate) fn blockers(ops: &mut [OpReport]) {
    // Per variable, the ops seen so far: (label, mutates).
    let mut seen: HashMap<VarId, Vec<(String, bool)>> = HashMap::new();
    for op in ops.iter_mut() {
        let label = op.label();
        let touches: Vec<(VarId, bool)> = op
            .mutates
            .iter()
            .map(|&v| (v, true))
            .chain(op.reads.iter().map(|&v| (v, false)))
            .collect();
        if let OpState::Variables(waits) = &mut op.state {
            for &(var, write) in &touches {
                let before: Vec<String> = seen
                    .get(&var)
                    .into_iter()
                    .flatten()
                    .filter(|(_, w)| *w || write)
                    .map(|(l, _)| l.clone())
                    .collect();
                if !before.is_empty() {
                    waits.push((var, before));
                }
            }
        }
        for (var, write) in touches {
            seen.entry(var).or_default().push((label.clone(), write));
        }
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} op(s) in flight", self.in_flight)?;
        for r in &self.resources {
            writeln!(
                f,
                "resource `{}`: {} of {} free",
                r.name, r.free, r.capacity
            )?;
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
                OpState::Running => writeln!(f, "is queued or running")?,
                OpState::Units(units) => {
                    let units: Vec<String> = units
                        .iter()
                        .map(|(name, n)| {
                            let (free, cap) = free(name);
                            format!("{n} of `{name}` ({free} of {cap} free)")
                        })
                        .collect();
                    writeln!(f, "waits for units: {}", units.join(", "))?;
                }
                OpState::Variables(vars) => {
                    let vars: Vec<String> = vars
                        .iter()
                        .map(|(var, after)| format!("{var} (after {})", after.join(", ")))
                        .collect();
                    writeln!(f, "waits for variables: {}", vars.join("; "))?;
                }
            }
        }
        if self.tracked.is_none() {
            writeln!(
                f,
                "(ops waiting for variables are listed only with EngineBuilder::track_ops)"
            )?;
        }
        Ok(())
    }
}
