//! Recording a graph ([`Engine::record`], [`Recorder`], [`RecordOp`]) and
//! replaying it ([`Graph`], [`Replay`]): the entry to `crate::graph`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use super::Engine;
use super::handle::OpHandle;
use super::shared::Shared;
use super::shutdown::ShutdownOnDrop;
use crate::dep::{
    AnyVar, Arena, Buffer, Device, Element, Mode, OpCtx, OpSpec, RecordedBody, Var, edges, in_op,
    recorded_edges,
};
use crate::error::{BoxError, Error, VarId};
use crate::graph::dag::{Access, Dag, HappensBefore};
use crate::graph::dot::{DotOp, DotVar, to_dot};
use crate::graph::plan::{self, conflicts_parallel, conflicts_sequential};
use crate::graph::run::{ReplayBody, Runtime, Schedule};
use crate::graph::{GraphEdge, GraphOp, MemoryPlan, Order, PlannedBuffer};

/// Graph ids, which their intermediates carry (0: none).
static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

impl Engine {
    /// Records a graph: `f` declares ops on a [`Recorder`] exactly as it
    /// would push them (nothing runs), and the graph is analysed once at
    /// the end. Replay it with [`Graph::replay`], as often as needed: each
    /// replay behaves as if its ops were pushed, in recorded order, at the
    /// point of the replay call, but costs a fraction of that.
    ///
    /// Variables made by the recorder ([`Recorder::var`],
    /// [`Recorder::buffer`]) are the graph's *intermediates*: only its ops
    /// may declare them, each replay starts them unpoisoned, and planned
    /// buffers share memory. Variables from outside (parameters, inputs,
    /// outputs) are its *boundary*: a replay takes each of them once, in
    /// push order with the engine's other ops.
    ///
    /// ```
    /// use depflow::Engine;
    ///
    /// let engine = Engine::new();
    /// let (x, y) = (engine.var(1.0f64), engine.var(0.0f64));
    /// let graph = engine.record(|rec| {
    ///     let t = rec.var(0.0f64); // an intermediate
    ///     rec.op().name("square").reads(&[&x]).mutates(&[&t]).run({
    ///         let (x, t) = (x.key(), t.key());
    ///         move |ctx| { *ctx.write(t)? = *ctx.read(x)? * *ctx.read(x)?; Ok(()) }
    ///     })?;
    ///     rec.op().name("accumulate").reads(&[&t]).mutates(&[&y]).run({
    ///         let (t, y) = (t.key(), y.key());
    ///         move |ctx| { *ctx.write(y)? += *ctx.read(t)?; Ok(()) }
    ///     })
    /// })?;
    /// for _ in 0..3 {
    ///     graph.replay(); // no need to wait in between
    /// }
    /// // A pushed op after the replays sees all three.
    /// assert_eq!(engine.get(&y).wait()?, 3.0);
    /// assert_eq!(graph.ops().len(), 2);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown; [`Error::Graph`] inside an op;
    /// what `f` returns (the errors a push would give, and
    /// [`Error::Graph`] for an op a graph cannot replay); [`Error::Graph`]
    /// for a planned buffer that an op reads before any op writes it.
    pub fn record<F>(&self, f: F) -> Result<Graph, Error>
    where
        F: FnOnce(&mut Recorder<'_>) -> Result<(), Error>,
    {
        if self.shared().is_closed() {
            return Err(Error::ShutDown);
        }
        if in_op() {
            return Err(Error::Graph(
                "recording inside an op: record before pushing, or outside ops".into(),
            ));
        }
        let mut recorder = Recorder {
            engine: self,
            graph: NEXT_GRAPH.fetch_add(1, Ordering::Relaxed),
            ops: Vec::new(),
            boundary: HashMap::new(),
            buffers: Vec::new(),
            arena: Arc::new(Arena::default()),
            order: Order::Parallel,
            name: None,
        };
        f(&mut recorder)?;
        recorder.finish()
    }
}

/// What an op recorded so far.
struct RecordedOp {
    spec: OpSpec,
    body: RecordedBody,
    info: GraphOp,
}

/// Declares a graph's ops (see [`Engine::record`]).
pub struct Recorder<'e> {
    engine: &'e Engine,
    graph: u64,
    ops: Vec<RecordedOp>,
    /// The variables from outside, once each: owned, for the replays'
    /// declarations.
    boundary: HashMap<VarId, Box<dyn AnyVar>>,
    /// Per planned buffer: its id, size and alignment.
    buffers: Vec<(VarId, usize, usize)>,
    arena: Arc<Arena>,
    order: Order,
    name: Option<Arc<str>>,
}

impl std::fmt::Debug for Recorder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("ops", &self.ops.len())
            .field("buffers", &self.buffers.len())
            .field("order", &self.order)
            .finish_non_exhaustive()
    }
}

impl<'e> Recorder<'e> {
    /// A new intermediate variable owning `value`. Its value carries over
    /// from one replay to the next; its poison does not.
    pub fn var<T: Send + Sync + 'static>(&mut self, value: T) -> Var<T> {
        Var::intermediate(self.engine.shared().id, value, self.graph, None)
    }

    /// A new plain intermediate variable (a tag).
    pub fn new_var(&mut self) -> Var {
        self.var(())
    }

    /// A new planned buffer of `len` values of `T`: an intermediate whose
    /// memory the graph takes on the first replay that touches it and
    /// shares with buffers never live at the same time (see
    /// [`Graph::plan`]). Its first op in recorded order must mutate it.
    pub fn buffer<T: Element>(&mut self, len: usize) -> Buffer<T> {
        let var = Var::intermediate(self.engine.shared().id, (), self.graph, None);
        let slot = u32::try_from(self.buffers.len()).expect("at most 2^32 buffers");
        self.buffers.push((
            var.id(),
            len.checked_mul(size_of::<T>())
                .expect("buffer size overflows"),
            align_of::<T>(),
        ));
        Buffer::new(var, self.arena.clone(), slot, len)
    }

    /// The order replays run the ops in (default [`Order::Parallel`]).
    pub fn order(&mut self, order: Order) -> &mut Self {
        self.order = order;
        self
    }

    /// A name for the graph: its replays' op is named after it.
    pub fn name(&mut self, name: &str) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// Starts declaring an op, as [`Engine::op`] does.
    pub fn op(&mut self) -> RecordOp<'_, 'e> {
        RecordOp {
            recorder: self,
            reads: Vec::new(),
            mutates: Vec::new(),
            name: None,
            priority: 0,
            device: None,
        }
    }

    /// Records an op that reads `reads` and mutates `mutates`, as
    /// [`Engine::push`] pushes one; `f` runs once per replay.
    ///
    /// # Errors
    ///
    /// As for [`Engine::push`] (at once), and [`Error::GraphOwned`] for
    /// another graph's intermediate.
    pub fn push<F>(
        &mut self,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        f: F,
    ) -> Result<(), Error>
    where
        F: Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        self.op().reads(reads).mutates(mutates).run(f)
    }

    /// Analyses the recording into a graph.
    fn finish(self) -> Result<Graph, Error> {
        let shared = self.engine.shared().clone();
        let n = self.ops.len();
        // Dense variable numbers, in order of first use.
        let mut numbers: HashMap<VarId, u32> = HashMap::new();
        let accesses: Vec<Vec<Access>> = self
            .ops
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
        let dag = Dag::build(&lists, self.order == Order::Sequential);
        let mut ids = vec![VarId(0); numbers.len()];
        for (&id, &i) in &numbers {
            ids[i as usize] = id;
        }

        // Planned buffers: their uses, each first used by a write.
        let slot_of: HashMap<VarId, usize> = self
            .buffers
            .iter()
            .enumerate()
            .map(|(slot, &(id, ..))| (id, slot))
            .collect();
        let mut buffers: Vec<plan::Buffer> = self
            .buffers
            .iter()
            .map(|&(_, bytes, align)| plan::Buffer {
                bytes,
                align,
                uses: Vec::new(),
            })
            .collect();
        for (i, op) in self.ops.iter().enumerate() {
            for e in op.spec.edges.iter() {
                if let Some(&slot) = slot_of.get(&e.var.id()) {
                    if buffers[slot].uses.is_empty() && !e.is_write() {
                        return Err(Error::Graph(format!(
                            "op {i}{} reads buffer {} before any op writes it",
                            op.info
                                .name
                                .as_deref()
                                .map(|n| format!(" `{n}`"))
                                .unwrap_or_default(),
                            e.var.id()
                        )));
                    }
                    buffers[slot].uses.push(i as u32);
                }
            }
        }
        let planned = match self.order {
            Order::Sequential => plan::plan(&buffers, conflicts_sequential(&buffers)),
            Order::Parallel => {
                let before = HappensBefore::of(&dag);
                plan::plan(&buffers, conflicts_parallel(&before, &buffers))
            }
        };
        self.arena.set_plan(
            planned.offsets.clone().into_boxed_slice(),
            planned.arena_bytes,
        );
        let plan = MemoryPlan {
            arena_bytes: planned.arena_bytes,
            total_bytes: planned.total_bytes,
            peak_live_bytes: planned.peak_live_bytes,
            buffers: self
                .buffers
                .iter()
                .zip(&planned.offsets)
                .map(|(&(id, bytes, _), &offset)| PlannedBuffer { id, offset, bytes })
                .collect(),
        };

        // The boundary variables some op mutates: the replay's op mutates
        // them (and counts no version: the recorded ops count theirs).
        let mutated: std::collections::HashSet<VarId> = self
            .ops
            .iter()
            .flat_map(|op| op.spec.edges.iter())
            .filter(|e| e.is_write() && e.var.graph() == 0)
            .map(|e| e.var.id())
            .collect();

        let edges: Vec<GraphEdge> = dag
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
        let mut infos = Vec::with_capacity(n);
        let mut parts = Vec::with_capacity(n);
        for op in self.ops {
            infos.push(op.info);
            parts.push((op.spec, op.body));
        }
        let runtime = Runtime::new(self.graph, shared, schedule, parts);

        let mut reads = Vec::new();
        let mut mutates: Vec<Box<dyn AnyVar>> = Vec::new();
        let mut boundary: Vec<(VarId, bool)> = self
            .boundary
            .keys()
            .map(|&id| (id, mutated.contains(&id)))
            .collect();
        boundary.sort_unstable();
        let mut owned = self.boundary;
        for &(id, mutated) in &boundary {
            let var = owned.remove(&id).expect("recorded");
            if mutated {
                mutates.push(var)
            } else {
                reads.push(var)
            }
        }
        let token = Var::new(self.engine.shared().id, ());
        mutates.push(Box::new(token));
        let vars: Vec<DotVar> = ids
            .iter()
            .map(|&id| DotVar {
                name: id.to_string(),
                boundary: boundary.binary_search_by_key(&id, |&(b, _)| b).is_ok(),
                bytes: slot_of.get(&id).map(|&s| plan.buffers[s].bytes),
                offset: slot_of.get(&id).map(|&s| plan.buffers[s].offset),
            })
            .collect();
        Ok(Graph {
            inner: Arc::new(GraphInner {
                runtime,
                engine: Arc::downgrade(&self.engine.handle),
                reads: reads.into_boxed_slice(),
                mutates: mutates.into_boxed_slice(),
                ops: infos,
                edges,
                dag_edges: dag.edges,
                vars,
                plan,
                boundary,
                order: self.order,
                name: self.name,
                arena: self.arena,
            }),
        })
    }
}

/// An op being recorded, from [`Recorder::op`]: the same declarations as
/// [`OpBuilder`](crate::OpBuilder) (variables, name, priority, device),
/// and a body that runs once per replay.
#[must_use = "a RecordOp records nothing until `run`"]
pub struct RecordOp<'r, 'e> {
    recorder: &'r mut Recorder<'e>,
    reads: Vec<&'r dyn AnyVar>,
    mutates: Vec<&'r dyn AnyVar>,
    name: Option<Cow<'static, str>>,
    priority: i32,
    device: Option<Device>,
}

impl std::fmt::Debug for RecordOp<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordOp")
            .field("name", &self.name)
            .field("priority", &self.priority)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl<'r> RecordOp<'r, '_> {
    /// Adds variables the op reads (calls add up).
    pub fn reads(mut self, vars: &[&'r dyn AnyVar]) -> Self {
        self.reads.extend_from_slice(vars);
        self
    }

    /// Adds variables the op mutates (calls add up).
    pub fn mutates(mut self, vars: &[&'r dyn AnyVar]) -> Self {
        self.mutates.extend_from_slice(vars);
        self
    }

    /// A name for errors, traces and the graph's DOT.
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// A priority among ready ops; see [`OpBuilder::priority`](crate::OpBuilder::priority).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The device to run on (default: the engine's default device). A
    /// stream device cannot be recorded yet.
    pub fn on(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// Records the op with its body, which runs once per replay.
    ///
    /// # Errors
    ///
    /// As for [`Engine::push`]; [`Error::GraphOwned`] for another graph's
    /// intermediate; [`Error::Config`] for another engine's device;
    /// [`Error::Graph`] for a stream device.
    pub fn run<F>(self, f: F) -> Result<(), Error>
    where
        F: Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        let recorder = self.recorder;
        let shared = recorder.engine.shared();
        let device = match self.device {
            None => 0,
            Some(d) if d.engine == shared.id => d.index,
            Some(_) => return Err(Error::Config("the device belongs to another engine".into())),
        };
        if shared.devices[usize::from(device)]
            .exec
            .stream_device()
            .is_some()
        {
            return Err(Error::Graph(
                "ops on stream devices cannot be recorded yet: push them".into(),
            ));
        }
        let edges = recorded_edges(&self.reads, &self.mutates, shared.id, recorder.graph)?;
        for var in self.mutates.iter().chain(&self.reads) {
            if var.core().graph() == 0 && !recorder.boundary.contains_key(&var.core().id()) {
                recorder
                    .boundary
                    .insert(var.core().id(), var.to_owned_var());
            }
        }
        let info = GraphOp {
            name: self.name.as_ref().map(|n| n.to_string()),
            device: usize::from(device),
            reads: edges
                .iter()
                .filter(|e| !e.is_write())
                .map(|e| e.var.id())
                .collect(),
            mutates: edges
                .iter()
                .filter(|e| e.is_write())
                .map(|e| e.var.id())
                .collect(),
        };
        let spec = OpSpec {
            edges,
            units: None,
            name: self.name,
            device_index: device,
            lane: None,
            priority: self.priority,
            mode: Mode::Normal,
            generation: 0,
        };
        let body: RecordedBody = Box::new(f);
        recorder.ops.push(RecordedOp { spec, body, info });
        Ok(())
    }
}

/// A recorded graph, from [`Engine::record`]: replay it with
/// [`replay`](Graph::replay); inspect it with [`ops`](Graph::ops),
/// [`edges`](Graph::edges), [`plan`](Graph::plan) and
/// [`to_dot`](Graph::to_dot). Cheap to clone.
#[derive(Clone)]
pub struct Graph {
    inner: Arc<GraphInner>,
}

struct GraphInner {
    runtime: Arc<Runtime<Shared>>,
    engine: Weak<ShutdownOnDrop>,
    /// The boundary variables the graph only reads, and those it mutates
    /// (then the graph's token): what each replay's op declares.
    reads: Box<[Box<dyn AnyVar>]>,
    mutates: Box<[Box<dyn AnyVar>]>,
    ops: Vec<GraphOp>,
    edges: Vec<GraphEdge>,
    dag_edges: Vec<crate::graph::dag::DagEdge>,
    vars: Vec<DotVar>,
    plan: MemoryPlan,
    boundary: Vec<(VarId, bool)>,
    order: Order,
    name: Option<Arc<str>>,
    arena: Arc<Arena>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("name", &self.inner.name)
            .field("ops", &self.inner.ops.len())
            .field("edges", &self.inner.edges.len())
            .field("order", &self.inner.order)
            .field("arena", &self.inner.arena)
            .finish()
    }
}

impl Graph {
    /// Replays the graph: as if its ops were pushed now, in recorded order
    /// (so it orders with the engine's other ops on its boundary
    /// variables, and `wait_for_var`/`wait_all` cover it). Returns a future
    /// of the replay's end, which resolves to its first failure if an op
    /// failed (the failed op poisons what it mutates; ops on poisoned
    /// variables are skipped, as pushed ops are); dropping it does not
    /// cancel the replay.
    ///
    /// Replays may be pushed without waiting: two replays of one graph run
    /// one after the other (they share the graph's intermediates and
    /// countdowns), each behind the ops pushed before it.
    ///
    /// A replay pushes one op: it takes each boundary variable once, holds
    /// them until its last op has ended, and runs the graph's ops from
    /// counters armed at its start (no push, no allocation, no future per
    /// op). So a pushed op on a boundary variable waits for the whole
    /// replay, not only for the recorded ops on that variable.
    ///
    /// Errors come through the future: [`Error::ShutDown`] once the engine
    /// is shut down or dropped, [`Error::Deleted`] for a deleted boundary
    /// variable, and the first failure of the replay's ops.
    pub fn replay(&self) -> Replay {
        Replay {
            handle: self.push_replay(),
        }
    }

    fn push_replay(&self) -> Result<OpHandle<Option<Error>>, Error> {
        let inner = &*self.inner;
        let handle = inner.engine.upgrade().ok_or(Error::ShutDown)?;
        let engine = Engine { handle };
        let reads: Vec<&dyn AnyVar> = inner.reads.iter().map(|v| &**v).collect();
        let mutates: Vec<&dyn AnyVar> = inner.mutates.iter().map(|v| &**v).collect();
        let mut spec = OpSpec::new(edges(&reads, &mutates, engine.shared().id)?);
        spec.mode = Mode::Replay;
        spec.name = Some(match &inner.name {
            Some(name) => Cow::Owned(format!("replay {name}")),
            None => Cow::Borrowed("replay"),
        });
        engine.push_spec(spec, ReplayBody::new(inner.runtime.clone()))
    }

    /// The recorded ops, in recorded order.
    pub fn ops(&self) -> &[GraphOp] {
        &self.inner.ops
    }

    /// The dependencies between recorded ops (one per pair of ops and
    /// variable), as the analysis found them.
    pub fn edges(&self) -> &[GraphEdge] {
        &self.inner.edges
    }

    /// The boundary variables (from outside the graph), by id, with
    /// whether the graph mutates them.
    pub fn boundary(&self) -> &[(VarId, bool)] {
        &self.inner.boundary
    }

    /// The memory plan of the graph's planned buffers.
    pub fn plan(&self) -> &MemoryPlan {
        &self.inner.plan
    }

    /// Whether a replay has taken the arena's memory yet (it is taken on
    /// the first access of a planned buffer).
    pub fn is_allocated(&self) -> bool {
        self.inner.arena.is_allocated()
    }

    /// The order replays follow.
    pub fn order(&self) -> Order {
        self.inner.order
    }

    /// The graph in Graphviz's DOT: one box per op (name, index), one
    /// arrow per dependency labelled with its variable and kind.
    pub fn to_dot(&self) -> String {
        let ops: Vec<DotOp> = self
            .inner
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| DotOp {
                name: op.name.clone().unwrap_or_else(|| format!("op {i}")),
                device: op.device.to_string(),
            })
            .collect();
        to_dot(
            self.inner.name.as_deref().unwrap_or("graph"),
            &ops,
            &self.inner.vars,
            &self.inner.dag_edges,
        )
    }

    /// Writes [`to_dot`](Self::to_dot) to `path`.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the file cannot be written.
    pub fn write_dot(&self, path: impl AsRef<std::path::Path>) -> Result<(), Error> {
        let path = path.as_ref();
        std::fs::write(path, self.to_dot()).map_err(|e| Error::Io {
            path: path.to_path_buf(),
            source: Arc::new(e),
        })
    }
}

/// A replay of a [`Graph`]: a future of its end (with a blocking
/// [`wait`](Replay::wait)). Dropping it does not cancel the replay.
#[derive(Debug)]
pub struct Replay {
    handle: Result<OpHandle<Option<Error>>, Error>,
}

impl Replay {
    /// Blocks until the replay has ended.
    ///
    /// # Errors
    ///
    /// The replay's (see [`Graph::replay`]), and those of a blocking wait
    /// ([`OpHandle::wait`]).
    pub fn wait(self) -> Result<(), Error> {
        match self.handle {
            Ok(handle) => flatten(handle.wait()),
            Err(e) => Err(e),
        }
    }
}

fn flatten(outcome: Result<Option<Error>, Error>) -> Result<(), Error> {
    match outcome {
        Ok(None) => Ok(()),
        Ok(Some(e)) | Err(e) => Err(e),
    }
}

impl Future for Replay {
    type Output = Result<(), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.handle {
            Ok(handle) => Pin::new(handle).poll(cx).map(flatten),
            Err(e) => Poll::Ready(Err(e.clone())),
        }
    }
}
