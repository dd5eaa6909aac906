//! A recording and its analysis, once, at the recording's end: the DAG,
//! the boundary, the memory plan, and the runtime that replays it.

use std::collections::HashMap;
use std::sync::Arc;

use super::dag::{Access, Dag, DagEdge, HappensBefore};
use super::dot::DotVar;
use super::plan::{
    self, conflicts_parallel, conflicts_sequential, horizons_parallel, horizons_sequential,
};
use super::run::{Runtime, Schedule};
use super::{GraphEdge, GraphOp, MemoryPlan, Order, PlannedBuffer};
use crate::dep::{AnyVar, Arena, Device, DeviceArena, DeviceArenas, Host, OpSpec, RecordedBody};
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
    /// The planned device buffers: one arena per device, made by the
    /// first buffer on it, with its buffers in slot order.
    pub(crate) device: Vec<DeviceBuffers>,
    /// Each device buffer's device, by id.
    pub(crate) device_of: HashMap<VarId, u16>,
    /// The first buffer the recording could not make (its size overflows):
    /// `Recorder::buffer` returns a buffer regardless, and the recording
    /// fails with this at its end.
    pub(crate) refused: Option<Error>,
}

/// One device arena of a recording, and the buffers declared in it.
pub(crate) struct DeviceBuffers {
    pub(crate) arena: Arc<DeviceArena>,
    /// Per buffer, in slot order: its id, size and alignment.
    pub(crate) buffers: Vec<(VarId, usize, usize)>,
}

impl Recording {
    /// A new device buffer of `bytes` bytes aligned to `align` on device
    /// `device`: its arena and its slot there.
    pub(crate) fn device_slot(
        &mut self,
        device: u16,
        id: VarId,
        bytes: usize,
        align: usize,
    ) -> (Arc<DeviceArena>, u32) {
        let at = match self.device.iter().position(|d| d.arena.device() == device) {
            Some(at) => at,
            None => {
                self.device.push(DeviceBuffers {
                    arena: Arc::new(DeviceArena::new(device)),
                    buffers: Vec::new(),
                });
                self.device.len() - 1
            }
        };
        let d = &mut self.device[at];
        let slot = u32::try_from(d.buffers.len()).expect("at most 2^32 buffers");
        d.buffers.push((id, bytes, align));
        self.device_of.insert(id, device);
        (d.arena.clone(), slot)
    }

    /// Refuses an op (of `spec`) that declares a device
    /// buffer off its device: a host op, or an op on another device.
    pub(crate) fn check_device_buffers(&self, spec: &OpSpec) -> Result<(), Error> {
        if self.device_of.is_empty() {
            return Ok(());
        }
        // Named only for an error: a well-placed buffer costs no string.
        let op = || {
            spec.name
                .as_ref()
                .map_or_else(|| "an op".into(), |n| format!("op `{n}`"))
        };
        for e in spec.edges.iter() {
            let id = e.var.id();
            let Some(&home) = self.device_of.get(&id) else {
                continue;
            };
            if spec.lane.is_none() {
                return Err(Error::Graph(format!(
                    "device buffer {id} lives in the memory of device {home}: {} on the host \
                     (device {}) cannot declare it; run it on device {home} (`.on(device)`), or \
                     use a host buffer (Recorder::buffer)",
                    op(),
                    spec.device_index
                )));
            }
            if spec.device_index != home {
                return Err(Error::Graph(format!(
                    "device buffer {id} lives in the memory of device {home}: {} on device {} \
                     cannot declare it (copy it through a variable instead)",
                    op(),
                    spec.device_index
                )));
            }
        }
        Ok(())
    }

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
    /// Per device with device buffers: its index, its plan and its arena.
    pub(crate) device: Vec<(Device, MemoryPlan, Arc<DeviceArena>)>,
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
        device,
        device_of: _,
        refused,
    } = recording;
    if let Some(refused) = refused {
        return Err(refused);
    }

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
    // Each device's buffers, planned as the host's are, in its own arena
    // (the DOT's arena note shows the host's).
    let mut device_plans = Vec::with_capacity(device.len());
    for d in device {
        // By the DAG's happens-before whatever the order: in sequential
        // order too, the device work of consecutive ops on different lanes
        // is ordered only through their variables (the data edges).
        let (planned, plan, _) = plan_buffers(&ops, &d.buffers, &dag, Order::Parallel)?;
        d.arena
            .set_plan(planned.offsets.into_boxed_slice(), planned.arena_bytes);
        device_plans.push((Device::new(host.id(), d.arena.device()), plan, d.arena));
    }
    let device_arenas = DeviceArenas(device_plans.iter().map(|d| d.2.clone()).collect());

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
        _device_arenas: device_arenas,
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
        device: device_plans,
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
        Order::Sequential => plan::plan(
            &buffers,
            conflicts_sequential(&buffers),
            &horizons_sequential(&buffers),
        ),
        Order::Parallel => {
            let before = HappensBefore::of(dag);
            let horizons = horizons_parallel(&before, &buffers);
            plan::plan(&buffers, conflicts_parallel(&before, &buffers), &horizons)
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
