//! A recording and its analysis, once, at the recording's end: the DAG,
//! the boundary, the memory plan, and the runtime that replays it.

use std::collections::HashMap;
use std::sync::Arc;

use super::dag::{Access, Dag, DagEdge, HappensBefore};
use super::dot::DotVar;
use super::plan::{self, conflicts_parallel, conflicts_sequential};
use super::run::{Runtime, Schedule};
use super::{GraphEdge, GraphOp, MemoryPlan, Order, PlannedBuffer};
use crate::dep::{AnyVar, Arena, Host, OpSpec, RecordedBody};
use crate::error::{Error, VarId};

/// One recorded op: as it will run, and as the graph shows it.
pub(crate) struct RecordedOp {
    pub(crate) spec: OpSpec,
    pub(crate) body: RecordedBody,
    pub(crate) info: GraphOp,
}

/// What a recorder collected.
#[derive(Default)]
pub(crate) struct Recording {
    /// The graph's id, which its intermediates carry.
    pub(crate) graph: u64,
    pub(crate) ops: Vec<RecordedOp>,
    /// The variables from outside, once each: owned, for the replays'
    /// declarations.
    pub(crate) boundary: HashMap<VarId, Box<dyn AnyVar>>,
    /// Per planned buffer, in slot order: its id, size and alignment.
    pub(crate) buffers: Vec<(VarId, usize, usize)>,
    pub(crate) order: Order,
    /// The memory the planned buffers share.
    pub(crate) arena: Arc<Arena>,
}

impl Recording {
    /// Records op `spec` with `body`; `vars` are the variables it declared
    /// (those from outside join the boundary).
    pub(crate) fn push(&mut self, spec: OpSpec, body: RecordedBody, vars: &[&dyn AnyVar]) {
        for var in vars {
            let core = var.core();
            if core.graph() == 0 && !self.boundary.contains_key(&core.id()) {
                self.boundary.insert(core.id(), var.to_owned_var());
            }
        }
        let ids = |write: bool| {
            spec.edges
                .iter()
                .filter(|e| e.is_write() == write)
                .map(|e| e.var.id())
                .collect()
        };
        let info = GraphOp {
            name: spec.name.as_ref().map(|n| n.to_string()),
            device: usize::from(spec.device_index),
            reads: ids(false),
            mutates: ids(true),
        };
        self.ops.push(RecordedOp { spec, body, info });
    }
}

/// A graph, analysed: everything a replay and an inspection need.
pub(crate) struct Analysed<H: Host> {
    pub(crate) runtime: Arc<Runtime<H>>,
    /// The boundary variables the graph only reads, and those it mutates:
    /// what each replay's op declares (besides the graph's token).
    pub(crate) reads: Vec<Box<dyn AnyVar>>,
    pub(crate) mutates: Vec<Box<dyn AnyVar>>,
    pub(crate) ops: Vec<GraphOp>,
    pub(crate) edges: Vec<GraphEdge>,
    pub(crate) dag_edges: Vec<DagEdge>,
    /// Every variable the ops declare, by dense number, for the DOT.
    pub(crate) vars: Vec<DotVar>,
    pub(crate) plan: MemoryPlan,
    /// The boundary by id, with whether the graph mutates each.
    pub(crate) boundary: Vec<(VarId, bool)>,
    pub(crate) arena: Arc<Arena>,
}

/// Analyses `recording` into a graph whose ops run on `host`.
///
/// # Errors
///
/// [`Error::Graph`] for a planned buffer that an op reads before any op
/// (in recorded order) writes it.
pub(crate) fn analyse<H: Host>(recording: Recording, host: Arc<H>) -> Result<Analysed<H>, Error> {
    let Recording {
        graph,
        ops,
        boundary: owned,
        buffers: declared,
        order,
        arena,
    } = recording;

    // Dense variable numbers, in order of first use.
    let mut numbers: HashMap<VarId, u32> = HashMap::new();
    let accesses: Vec<Vec<Access>> = ops
        .iter()
        .map(|op| {
            op.spec
                .edges
                .iter()
                .map(|e| {
                    let next = numbers.len() as u32;
                    Access {
                        var: *numbers.entry(e.var.id()).or_insert(next),
                        write: e.is_write(),
                    }
                })
                .collect()
        })
        .collect();
    let lists: Vec<&[Access]> = accesses.iter().map(Vec::as_slice).collect();
    let dag = Dag::build(&lists, order == Order::Sequential);
    let mut ids = vec![VarId(0); numbers.len()];
    for (&id, &i) in &numbers {
        ids[i as usize] = id;
    }

    let (planned, plan, slot_of) = plan_buffers(&ops, &declared, &dag, order)?;
    arena.set_plan(planned.offsets.into_boxed_slice(), planned.arena_bytes);

    // The boundary variables some op mutates: the replay's op mutates them
    // (and counts no version: the recorded ops count theirs).
    let mutated: std::collections::HashSet<VarId> = ops
        .iter()
        .flat_map(|op| op.spec.edges.iter())
        .filter(|e| e.is_write() && e.var.graph() == 0)
        .map(|e| e.var.id())
        .collect();

    let edges = dag
        .edges
        .iter()
        .map(|e| GraphEdge {
            from: e.from as usize,
            to: e.to as usize,
            var: ids[e.var as usize],
            kind: e.kind,
        })
        .collect();
    let schedule = Schedule {
        preds: dag.pred_count.clone().into_boxed_slice(),
        succ_start: dag.succ_start.clone().into_boxed_slice(),
        succ: dag.succ.clone().into_boxed_slice(),
        roots: dag.roots.clone().into_boxed_slice(),
    };
    let mut infos = Vec::with_capacity(ops.len());
    let mut parts = Vec::with_capacity(ops.len());
    for op in ops {
        infos.push(op.info);
        parts.push((op.spec, op.body));
    }
    let runtime = Runtime::new(graph, host, schedule, parts);

    let mut boundary: Vec<(VarId, bool)> = owned
        .keys()
        .map(|&id| (id, mutated.contains(&id)))
        .collect();
    boundary.sort_unstable();
    let (mut reads, mut mutates) = (Vec::new(), Vec::new());
    let mut owned = owned;
    for &(id, mutated) in &boundary {
        let var = owned.remove(&id).expect("recorded");
        if mutated {
            mutates.push(var);
        } else {
            reads.push(var);
        }
    }
    let vars = ids
        .iter()
        .map(|&id| DotVar {
            name: id.to_string(),
            boundary: boundary.binary_search_by_key(&id, |&(b, _)| b).is_ok(),
            bytes: slot_of.get(&id).map(|&s| plan.buffers[s].bytes),
            offset: slot_of.get(&id).map(|&s| plan.buffers[s].offset),
        })
        .collect();
    Ok(Analysed {
        runtime,
        reads,
        mutates,
        ops: infos,
        edges,
        dag_edges: dag.edges,
        vars,
        plan,
        boundary,
        arena,
    })
}

/// The planned buffers' uses (each first used by a write) and their plan;
/// also each buffer's slot by id.
fn plan_buffers(
    ops: &[RecordedOp],
    declared: &[(VarId, usize, usize)],
    dag: &Dag,
    order: Order,
) -> Result<(plan::Plan, MemoryPlan, HashMap<VarId, usize>), Error> {
    let slot_of: HashMap<VarId, usize> = declared
        .iter()
        .enumerate()
        .map(|(slot, &(id, ..))| (id, slot))
        .collect();
    let mut buffers: Vec<plan::Buffer> = declared
        .iter()
        .map(|&(_, bytes, align)| plan::Buffer {
            bytes,
            align,
            uses: Vec::new(),
        })
        .collect();
    for (i, op) in ops.iter().enumerate() {
        for e in op.spec.edges.iter() {
            if let Some(&slot) = slot_of.get(&e.var.id()) {
                if buffers[slot].uses.is_empty() && !e.is_write() {
                    let name = op.info.name.as_deref();
                    return Err(Error::Graph(format!(
                        "op {i}{} reads buffer {} before any op writes it",
                        name.map(|n| format!(" `{n}`")).unwrap_or_default(),
                        e.var.id()
                    )));
                }
                buffers[slot].uses.push(i as u32);
            }
        }
    }
    let planned = match order {
        Order::Sequential => plan::plan(&buffers, conflicts_sequential(&buffers)),
        Order::Parallel => {
            let before = HappensBefore::of(dag);
            plan::plan(&buffers, conflicts_parallel(&before, &buffers))
        }
    };
    let plan = MemoryPlan {
        arena_bytes: planned.arena_bytes,
        total_bytes: planned.total_bytes,
        peak_live_bytes: planned.peak_live_bytes,
        buffers: declared
            .iter()
            .zip(&planned.offsets)
            .map(|(&(id, bytes, _), &offset)| PlannedBuffer { id, offset, bytes })
            .collect(),
    };
    Ok((planned, plan, slot_of))
}
