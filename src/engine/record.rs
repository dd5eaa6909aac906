//! Recording a graph ([`Engine::record`], [`Recorder`], and its ops,
//! [`RecordOp`]) and replaying it ([`Graph`], [`Replay`]): the entry to
//! `crate::graph`.
//!
//! The recorder takes ops through `&self` (it is an [`Ops`](crate::Ops),
//! as the engine is), so its recording sits in a `RefCell`: borrowed only
//! inside one of its calls, never across a user's code.

use std::borrow::Cow;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use super::Engine;
use super::handle::{OpHandle, block_outside_ops};
use super::op_builder::sealed::Sealed;
use super::op_builder::{Declaration, OpBuilder, Ops, Reusable};
use super::shared::Shared;
use super::shutdown::ShutdownOnDrop;
use super::when_room::poll_room;
use crate::dep::{
    AnyVar, Buffer, Device, DeviceArena, DeviceBuffer, Element, Host, Mode, OpCtx, OpSpec, Var,
    buffer_bytes, distinct_edges, in_op, recorded_edges,
};
use crate::error::{BoxError, Error, VarId};
use crate::graph::analysis::{Analysed, Recording, analyse};
use crate::graph::capture::{CapturedBody, Capturing, capturing};
use crate::graph::dot::{DotOp, to_dot};
use crate::graph::run::ReplayBody;
use crate::graph::{GraphEdge, GraphOp, MemoryPlan, Order};

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
    /// `f` may return any error (a `depflow::Error`, an `anyhow::Error`, a
    /// `Box<dyn Error>`): the recording is dropped and the error returned,
    /// as itself if it is a `depflow::Error`, else inside
    /// [`Error::Recording`]. A closure that ends in `Ok(())` after `?`s
    /// names its error type, e.g. `Ok::<(), depflow::Error>(())`.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] after shutdown; [`Error::Graph`] inside an op;
    /// what `f` returns (the errors a push would give, and
    /// [`Error::Graph`] for an op a graph cannot replay; the closure's own
    /// errors in [`Error::Recording`]); [`Error::Graph`] for a planned
    /// buffer that an op reads before any op writes it.
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let x = engine.var(0u8);
    /// let err = engine
    ///     .record(|rec| {
    ///         rec.op().mutates(&[&x]).run(|_| Ok(()))?;
    ///         let batch: usize = "twelve".parse()?; // the caller's own error
    ///         rec.op().name(format!("batch {batch}")).mutates(&[&x]).run(|_| Ok(()))?;
    ///         Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    ///     })
    ///     .unwrap_err();
    /// assert!(matches!(err, Error::Recording(_)));
    /// assert_eq!(err.to_string(), "recording: invalid digit found in string");
    /// ```
    pub fn record<F, E>(&self, f: F) -> Result<Graph, Error>
    where
        F: FnOnce(&mut Recorder<'_>) -> Result<(), E>,
        E: Into<BoxError>,
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
            recording: RefCell::new(Recording {
                graph: NEXT_GRAPH.fetch_add(1, Ordering::Relaxed),
                ..Recording::default()
            }),
            name: None,
            capture: false,
        };
        f(&mut recorder).map_err(|e| Error::from_caller(e.into()))?;
        recorder.finish()
    }
}

/// Declares a graph's ops (see [`Engine::record`]).
pub struct Recorder<'e> {
    pub(super) engine: &'e Engine,
    recording: RefCell<Recording>,
    name: Option<Arc<str>>,
    /// Replays launch one captured device graph (`capture`).
    capture: bool,
}

impl std::fmt::Debug for Recorder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let recording = self.recording.borrow();
        f.debug_struct("Recorder")
            .field("ops", &recording.ops.len())
            .field("buffers", &recording.buffers.len())
            .field("order", &recording.order)
            .finish_non_exhaustive()
    }
}

impl<'e> Recorder<'e> {
    /// A new intermediate variable owning `value`. Its value carries over
    /// from one replay to the next; its poison does not.
    pub fn var<T: Send + Sync + 'static>(&self, value: T) -> Var<T> {
        self.intermediate(value, None)
    }

    /// [`var`](Self::var), named `name` in errors, diagnostics and the
    /// graph's DOT (as [`Engine::var_named`] names a variable).
    pub fn var_named<T: Send + Sync + 'static>(&self, name: &str, value: T) -> Var<T> {
        self.intermediate(value, Some(name.into()))
    }

    /// A new plain intermediate variable (a tag).
    pub fn new_var(&self) -> Var {
        self.var(())
    }

    fn intermediate<T: Send + Sync + 'static>(&self, value: T, name: Option<Arc<str>>) -> Var<T> {
        let graph = self.recording.borrow().graph;
        Var::intermediate(self.engine.shared().id, value, graph, name)
    }

    /// A new planned buffer of `len` values of `T`: an intermediate whose
    /// memory the graph takes on the first replay that touches it and
    /// shares with buffers never live at the same time (see
    /// [`Graph::plan`]). Its first op in recorded order must mutate it.
    ///
    /// If `len` values of `T` are more bytes than one allocation may hold
    /// (`isize::MAX`), the recording fails with [`Error::Graph`] at its
    /// end. If the planned memory cannot be allocated when a replay first
    /// touches it, the op touching it fails with [`Error::Graph`] (and the
    /// replay with it); nothing panics or aborts.
    pub fn buffer<T: Element>(&self, len: usize) -> Buffer<T> {
        self.make_buffer(len, None)
    }

    /// [`buffer`](Self::buffer), named `name` in errors and the graph's
    /// DOT (as [`Engine::var_named`] names a variable).
    pub fn buffer_named<T: Element>(&self, name: &str, len: usize) -> Buffer<T> {
        self.make_buffer(len, Some(name.into()))
    }

    fn make_buffer<T: Element>(&self, len: usize, name: Option<Arc<str>>) -> Buffer<T> {
        let recording = &mut *self.recording.borrow_mut();
        let var = Var::intermediate(self.engine.shared().id, (), recording.graph, name);
        let slot = u32::try_from(recording.buffers.len()).expect("at most 2^32 buffers");
        let bytes = buffer_bytes::<T>(len).unwrap_or_else(|| {
            recording.refused.get_or_insert_with(|| {
                Error::Graph(format!(
                    "buffer {}: {len} values of {} bytes are more than one allocation may hold",
                    var.id(),
                    size_of::<T>()
                ))
            });
            0
        });
        recording.buffers.push((var.id(), bytes, align_of::<T>()));
        Buffer::new(var, recording.arena.clone(), slot, len)
    }

    /// A new planned device buffer of `len` values of `T` in the memory of
    /// stream device `device`: an intermediate that only the graph's ops
    /// on that device may declare, reached in their bodies as a
    /// [`DeviceSlice`](crate::stream::DeviceSlice) for their device work
    /// ([`OpCtx::device_buffer`], [`OpCtx::device_buffer_mut`]). The
    /// graph's buffers on one device share one arena of device memory,
    /// planned as host buffers are ([`Graph::device_plan`]): taken by the
    /// first replay that reaches one, in stream order, and given back in
    /// stream order (after every replay's device work) when the graph is
    /// dropped. Two device buffers share bytes only if every use of one
    /// happens before every use of the other in the DAG, in either
    /// [`Order`] (the device orders work on two lanes only through the ops'
    /// variables). Its first op in recorded order must mutate it. See
    /// [`OpCtx::device_buffer`] for an example.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for another engine's device; [`Error::Graph`] for
    /// a device without streams (use [`buffer`](Self::buffer) there).
    pub fn device_buffer<T: Element>(
        &self,
        device: Device,
        len: usize,
    ) -> Result<DeviceBuffer<T>, Error> {
        self.make_device_buffer(device, len, None)
    }

    /// [`device_buffer`](Self::device_buffer), named `name` in errors and
    /// the graph's DOT.
    ///
    /// # Errors
    ///
    /// As for `device_buffer`.
    pub fn device_buffer_named<T: Element>(
        &self,
        name: &str,
        device: Device,
        len: usize,
    ) -> Result<DeviceBuffer<T>, Error> {
        self.make_device_buffer(device, len, Some(name.into()))
    }

    fn make_device_buffer<T: Element>(
        &self,
        device: Device,
        len: usize,
        name: Option<Arc<str>>,
    ) -> Result<DeviceBuffer<T>, Error> {
        let shared = self.engine.shared();
        if device.engine != shared.id {
            return Err(Error::Config("the device belongs to another engine".into()));
        }
        if shared.stream_device(device.index).is_none() {
            return Err(Error::Graph(format!(
                "a device buffer on device {}, which has no streams: device buffers live in a \
                 stream device's memory (Executor::simulated_gpu, Executor::cuda); use \
                 Recorder::buffer for host memory",
                device.index
            )));
        }
        let recording = &mut *self.recording.borrow_mut();
        let var = Var::intermediate(shared.id, (), recording.graph, name);
        let bytes = buffer_bytes::<T>(len).ok_or_else(|| {
            Error::Graph(format!(
                "a device buffer of {len} values of {} bytes: more than one allocation may hold",
                size_of::<T>()
            ))
        })?;
        let (arena, slot) = recording.device_slot(device.index, var.id(), bytes, align_of::<T>());
        Ok(DeviceBuffer::new(var, arena, slot, len))
    }

    /// The order replays run the ops in (default [`Order::Parallel`]).
    pub fn order(&mut self, order: Order) -> &mut Self {
        self.recording.get_mut().order = order;
        self
    }

    /// A name for the graph: its replays' op is named after it.
    pub fn name(&mut self, name: &str) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// Replays of this graph launch it as one captured device graph: a
    /// CUDA graph (stream capture) on a CUDA device, the same path on the
    /// simulated GPU. Every op must run on one stream device, with no
    /// units and no planned buffers; the recording's end refuses the
    /// graph otherwise ([`Error::Graph`]).
    ///
    /// # The contract (CUDA graphs')
    ///
    /// - The first replay runs every op's body once, in recorded order,
    ///   with a *capturing* stream for the graph's first op's lane (the
    ///   device's private capture stream, forked from that lane, so that
    ///   other threads' work on the lane stays out of the graph): the
    ///   work the bodies enqueue is recorded, not run (kernels on
    ///   [`Stream::cuda`](crate::stream::Stream), and repeatable host
    ///   functions: [`Stream::enqueue_repeatable`](crate::stream::Stream::enqueue_repeatable),
    ///   [`Stream::simulate_repeatable`](crate::stream::Stream::simulate_repeatable);
    ///   the one-shot `enqueue` and `simulate` are refused there). Then the
    ///   graph is instantiated. **Bodies' host-side code runs only then**:
    ///   what they enqueued is what every launch repeats, with the values
    ///   and pointers they captured.
    /// - Every replay (the first too, once captured) is *one* device op on
    ///   that device and lane: it takes the graph's boundary variables
    ///   (mutating those the graph mutates) once, in push order with the
    ///   engine's other ops as any replay does, waits for their device
    ///   work, launches the graph, and is fenced by one event; the
    ///   variables are handed on once the launch is enqueued, as a pushed
    ///   stream op's are. Two replays of one graph run one after the
    ///   other; the second's launch waits for the first's capture.
    /// - All ops go to one stream, in recorded order: the lanes the ops
    ///   declared, and their parallelism inside the graph, are given up.
    /// - Failures: a body's error or panic during the capture fails that
    ///   replay (poisoning what the graph mutates) and leaves the graph
    ///   uncaptured: the next replay captures again. A failure of a
    ///   launch's work (a host function's `Err`, a device error) fails
    ///   that replay and poisons what the graph mutates, as any device
    ///   op's; a poisoned input skips the whole launch. The graph stays
    ///   usable either way.
    /// - Device memory: **allocate outside the capture, or free inside the
    ///   bodies**. Memory allocated on the capturing stream (`alloc_zeros`,
    ///   a `cuMemAllocAsync`) becomes an allocation node of the graph; not
    ///   freed in the graph, it would still be allocated at the next launch,
    ///   which fails. On CUDA such a capture is refused: the replay fails
    ///   with [`Error::Failed`](crate::Error::Failed) saying so, and the graph stays uncaptured.
    ///
    /// ```
    /// use depflow::{Engine, Executor, Lane};
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    ///
    /// let engine = Engine::builder().device("gpu", Executor::simulated_gpu(2)).build()?;
    /// let gpu = engine.device("gpu").unwrap();
    /// let x = engine.var(Arc::new(AtomicU64::new(1)));
    /// let graph = engine.record(|rec| {
    ///     rec.capture();
    ///     for lane in [Lane::Compute(0), Lane::Compute(1)] {
    ///         rec.op().on(gpu).lane(lane).mutates(&[&x]).run({
    ///             let k = x.key();
    ///             move |ctx| {
    ///                 let x = ctx.write(k)?.clone(); // host side: at the capture only
    ///                 Ok(ctx.stream()?.enqueue_repeatable(move || {
    ///                     x.store(x.load(SeqCst) * 2, SeqCst); // at every launch
    ///                     Ok(())
    ///                 })?)
    ///             }
    ///         })?;
    ///     }
    ///     Ok::<(), depflow::Error>(())
    /// })?;
    /// graph.replay().wait()?; // captures, then launches
    /// graph.replay().wait()?; // launches
    /// assert!(graph.is_captured());
    /// let k = x.key();
    /// let got = engine.push(&[&x], &[], move |ctx| Ok(ctx.read(k)?.load(SeqCst)))?;
    /// assert_eq!(got.wait()?, 16);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn capture(&mut self) -> &mut Self {
        self.capture = true;
        self
    }

    /// Starts declaring an op, as [`Engine::op`] does (the same as
    /// [`Ops::op`]).
    pub fn op(&self) -> RecordOp<'_, 'e> {
        Ops::op(self)
    }

    /// Records an op that reads `reads` and mutates `mutates`, as
    /// [`Engine::push`] pushes one; `f` runs once per replay.
    ///
    /// # Errors
    ///
    /// As for [`Engine::push`] (at once), and [`Error::GraphOwned`] for
    /// another graph's intermediate.
    pub fn push<F>(&self, reads: &[&dyn AnyVar], mutates: &[&dyn AnyVar], f: F) -> Result<(), Error>
    where
        F: Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        self.op().reads(reads).mutates(mutates).run(f)
    }

    /// Analyses the recording into a graph.
    fn finish(self) -> Result<Graph, Error> {
        let shared = self.engine.shared();
        // A refused buffer (`Recording::refused`) fails the analysis.
        let mut analysed = analyse(self.recording.into_inner(), shared.clone())?;
        analysed.mutates.push(Box::new(Var::new(shared.id, ())));
        let capture = match self.capture {
            true => {
                // Device buffers too: their arena is taken by a replay's
                // first access, which under capture would be captured.
                let device: usize = analysed.device.iter().map(|d| d.1.buffers.len()).sum();
                let planned = analysed.plan.buffers.len() + device;
                let capturing = capturing(&analysed.runtime, planned)?;
                // A launch op only reads the token: a failed launch must not
                // poison it (no later launch would run), and launches are
                // ordered by what they mutate and their lane (see
                // `graph::capture`).
                let token = analysed.mutates.pop().expect("the token");
                analysed.reads.push(token);
                Some(Arc::new(capturing))
            }
            false => None,
        };
        Ok(Graph {
            inner: Arc::new(GraphInner {
                analysed,
                engine: Arc::downgrade(&self.engine.handle),
                name: self.name,
                capture,
            }),
        })
    }
}

/// An op being recorded, from [`Recorder::op`]: an [`OpBuilder`] on a
/// recorder, with the declarations of any (variables, typed accesses, name,
/// priority, device, lane, units), and a body that runs once per replay.
pub type RecordOp<'r, 'e> = OpBuilder<'r, Recorder<'e>, Reusable>;

impl Recorder<'_> {
    /// Records the op `decl` declares with its body (see
    /// [`OpBuilder::run`](OpBuilder#method.run-1)).
    pub(super) fn record_op<F>(&self, mut decl: Declaration<'_>, f: F) -> Result<(), Error>
    where
        F: Fn(&OpCtx) -> Result<(), BoxError> + Send + Sync + 'static,
    {
        let shared = self.engine.shared();
        if !decl.allocations.is_empty() {
            let resource = decl.opts.units.as_ref().and_then(|u| u.lasting_resource());
            decl.opts.invalid.get_or_insert(Error::Graph(format!(
                "a recorded op cannot allocate lasting units of `{}`: a graph's memory is its \
                 planned buffers (Recorder::buffer); use `uses` for units held while the op \
                 runs, or push the allocating op",
                resource.unwrap_or("a resource")
            )));
        }
        let opts = &mut decl.opts;
        let device = opts.device_index(shared)?;
        if let Some(e) = opts.invalid.take() {
            return Err(e);
        }
        let lane = opts.lane_index(shared, device, true)?;
        opts.check_capacity()?;
        let recording = &mut *self.recording.borrow_mut();
        let (reads, mutates) = (decl.reads.as_slice(), decl.mutates.as_slice());
        let edges = recorded_edges(reads, mutates, shared.id, recording.graph)?;
        let spec = OpSpec {
            edges,
            units: decl.opts.units,
            name: decl.opts.name,
            device_index: device,
            lane,
            priority: decl.opts.priority,
            mode: Mode::Normal,
            generation: 0,
        };
        recording.check_device_buffers(&spec)?;
        let vars: Vec<&dyn AnyVar> = mutates.iter().chain(reads).copied().collect();
        recording.push(spec, Box::new(f), &vars);
        Ok(())
    }
}

impl Sealed for Recorder<'_> {}

impl Ops for Recorder<'_> {
    type Handle<T: Send + 'static> = ();

    fn engine(&self) -> &Engine {
        self.engine
    }

    fn var<T: Send + Sync + 'static>(&self, value: T) -> Var<T> {
        Recorder::var(self, value)
    }

    fn var_named<T: Send + Sync + 'static>(&self, name: &str, value: T) -> Var<T> {
        Recorder::var_named(self, name, value)
    }

    fn buffer<T: Element>(&self, len: usize) -> Buffer<T> {
        Recorder::buffer(self, len)
    }

    fn buffer_named<T: Element>(&self, name: &str, len: usize) -> Buffer<T> {
        Recorder::buffer_named(self, name, len)
    }

    fn submit<F, T>(op: RecordOp<'_, '_>, f: F) -> Result<(), Error>
    where
        F: Fn(&OpCtx) -> Result<T, BoxError> + Send + Sync + 'static,
        T: Send + 'static,
    {
        let (recorder, decl) = op.into_parts();
        recorder.record_op(decl, move |ctx| f(ctx).map(drop))
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
    /// The analysis; its `mutates` ends with the graph's token (so that
    /// replays of one graph follow each other).
    analysed: Analysed<Shared>,
    engine: Weak<ShutdownOnDrop>,
    name: Option<Arc<str>>,
    /// A captured graph's state (`Recorder::capture`).
    capture: Option<Arc<Capturing>>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("name", &self.inner.name)
            .field("ops", &self.inner.analysed.ops.len())
            .field("edges", &self.inner.analysed.edges.len())
            .field("arena", &self.inner.analysed.arena)
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
    /// A captured graph's replay ([`Recorder::capture`]) is one device op
    /// instead, launching the captured device graph.
    ///
    /// Errors come through the future: [`Error::ShutDown`] once the engine
    /// is shut down or dropped, [`Error::Deleted`] for a deleted boundary
    /// variable, and the first failure of the replay's ops.
    ///
    /// A replay counts as one op under the engine's bound on ops in flight
    /// ([`EngineBuilder::max_in_flight`](crate::EngineBuilder::max_in_flight)),
    /// whatever its number of recorded ops; `replay` itself never waits
    /// for room: a producer of replays waits with
    /// [`when_room`](Self::when_room).
    pub fn replay(&self) -> Replay {
        Replay {
            handle: self.push_replay(),
        }
    }

    /// Waits for room under the engine's bound on ops in flight
    /// ([`EngineBuilder::max_in_flight`](crate::EngineBuilder::max_in_flight)),
    /// then gives the graph back to [`replay`](Self::replay): as
    /// [`OpBuilder::when_room`](crate::OpBuilder::when_room) does for an op
    /// (a replay is one op in flight), with the same rule inside an op of
    /// the engine (it never waits there: it resolves at once, to
    /// [`Error::WaitsForItself`] if there is no room besides the calling
    /// op). A producer that replays this way never runs more than the bound
    /// ahead of the engine (plus one op per other producer between its
    /// wait and its replay). Ready at once without a bound.
    ///
    /// `.await` it in async code, or block with
    /// [`ReplayRoom::wait`](crate::ReplayRoom::wait).
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::builder().max_in_flight(8).build()?;
    /// let x = engine.var(0u64);
    /// let graph = engine.record(|rec| {
    ///     let k = x.key();
    ///     rec.op().mutates(&[&x]).run(move |ctx| { *ctx.write(k)? += 1; Ok(()) })
    /// })?;
    /// for _ in 0..100 {
    ///     // Blocks while 8 ops (replays here) are in flight.
    ///     graph.when_room().wait()?.replay();
    ///     assert!(engine.in_flight() <= 8);
    /// }
    /// # futures::executor::block_on(async {
    /// graph.when_room().await?.replay().await?; // the same, in async code
    /// # Ok::<(), Error>(()) })?;
    /// assert_eq!(engine.get(&x).wait()?, 101);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn when_room(&self) -> ReplayRoom<'_> {
        ReplayRoom::new(self)
    }

    /// The engine's shared state, which the graph's runtime holds.
    pub(super) fn shared(&self) -> &Shared {
        self.inner.analysed.runtime.host()
    }

    fn push_replay(&self) -> Result<OpHandle<Option<Error>>, Error> {
        if let Some(capturing) = &self.inner.capture {
            return self.push_launch(capturing);
        }
        let (engine, spec, body) = self.replay_op()?;
        engine.push_spec(spec, body)
    }

    /// A captured graph's replay: one launch op on its device and lane,
    /// declaring what the replay's op would (see `graph::capture`).
    fn push_launch(&self, capturing: &Arc<Capturing>) -> Result<OpHandle<Option<Error>>, Error> {
        let inner = &*self.inner;
        let handle = inner.engine.upgrade().ok_or(Error::ShutDown)?;
        let engine = Engine { handle };
        let a = &inner.analysed;
        let mut spec = OpSpec::new(distinct_edges(&a.reads, &a.mutates, engine.shared().id)?);
        spec.device_index = capturing.device;
        spec.lane = Some(capturing.lane);
        spec.name = Some(match &inner.name {
            Some(name) => Cow::Owned(format!("replay {name}")),
            None => Cow::Borrowed("replay"),
        });
        let body = CapturedBody::new(a.runtime.clone(), capturing.clone());
        engine.push_spec(spec, body)
    }

    /// Whether replays launch a captured device graph
    /// ([`Recorder::capture`]) and a replay has captured it (false again
    /// after a capture failed, until the next one succeeds).
    pub fn is_captured(&self) -> bool {
        self.inner.capture.as_ref().is_some_and(|c| c.is_captured())
    }

    /// How many times a replay ran the recorded bodies under a capture
    /// (0 for a graph that is not captured): once, unless a capture
    /// failed.
    pub fn captures(&self) -> u64 {
        self.inner.capture.as_ref().map_or(0, |c| c.captures())
    }

    /// The replay's op, declared (its variables checked), not pushed.
    fn replay_op(&self) -> Result<(Engine, OpSpec, ReplayBody<Shared>), Error> {
        let inner = &*self.inner;
        let handle = inner.engine.upgrade().ok_or(Error::ShutDown)?;
        let engine = Engine { handle };
        let a = &inner.analysed;
        let mut spec = OpSpec::new(distinct_edges(&a.reads, &a.mutates, engine.shared().id)?);
        spec.mode = Mode::Replay;
        spec.name = Some(match &inner.name {
            Some(name) => Cow::Owned(format!("replay {name}")),
            None => Cow::Borrowed("replay"),
        });
        let body = ReplayBody::new(a.runtime.clone());
        spec.units = body.units();
        Ok((engine, spec, body))
    }

    /// The recorded ops, in recorded order.
    pub fn ops(&self) -> &[GraphOp] {
        &self.inner.analysed.ops
    }

    /// The dependencies between recorded ops (one per pair of ops and
    /// variable), as the analysis found them.
    pub fn edges(&self) -> &[GraphEdge] {
        &self.inner.analysed.edges
    }

    /// The boundary variables (from outside the graph), by id, with
    /// whether the graph mutates them.
    pub fn boundary(&self) -> &[(VarId, bool)] {
        &self.inner.analysed.boundary
    }

    /// The memory plan of the graph's planned buffers.
    pub fn plan(&self) -> &MemoryPlan {
        &self.inner.analysed.plan
    }

    /// The memory plan of the graph's device buffers on `device`
    /// ([`Recorder::device_buffer`]): their offsets in the device's arena,
    /// its size against the sum of the buffers. None if the graph has no
    /// device buffer there.
    pub fn device_plan(&self, device: Device) -> Option<&MemoryPlan> {
        self.device_arena(device).map(|d| &d.1)
    }

    /// Whether a replay has taken the graph's device memory on `device`
    /// (taken on the first access of one of its device buffers there, given
    /// back when the graph goes).
    pub fn is_device_allocated(&self, device: Device) -> bool {
        self.device_arena(device)
            .is_some_and(|d| d.2.is_allocated())
    }

    fn device_arena(&self, device: Device) -> Option<&(Device, MemoryPlan, Arc<DeviceArena>)> {
        self.inner.analysed.device.iter().find(|d| d.0 == device)
    }

    /// Whether a replay has taken the arena's memory yet (it is taken on
    /// the first access of a planned buffer).
    pub fn is_allocated(&self) -> bool {
        self.inner.analysed.arena.is_allocated()
    }

    /// The graph in Graphviz's DOT: one box per op (name, index), one
    /// arrow per dependency labelled with its variable and kind.
    pub fn to_dot(&self) -> String {
        let ops: Vec<DotOp> = self
            .inner
            .analysed
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
            &self.inner.analysed.vars,
            &self.inner.analysed.dag_edges,
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

/// Waits for room under the engine's bound on ops in flight for one replay
/// of a graph; resolves to the [`Graph`], to [`replay`](Graph::replay).
/// Made by [`Graph::when_room`].
#[must_use = "a ReplayRoom does nothing unless awaited or waited on"]
#[derive(Debug)]
pub struct ReplayRoom<'g> {
    graph: Option<&'g Graph>,
}

impl<'g> ReplayRoom<'g> {
    pub(super) fn new(graph: &'g Graph) -> Self {
        Self { graph: Some(graph) }
    }

    /// Blocks the calling thread until there is room.
    ///
    /// # Errors
    ///
    /// As for [`WhenRoom::wait`](crate::WhenRoom::wait): while there is no room,
    /// [`Error::WaitsForItself`] inside an op of this engine,
    /// [`Error::BlockingInOp`] inside another engine's op, and
    /// [`Error::BlockingInRuntime`] inside a tokio runtime.
    pub fn wait(self) -> Result<&'g Graph, Error> {
        block_outside_ops(false, self)
    }
}

impl<'g> Future for ReplayRoom<'g> {
    type Output = Result<&'g Graph, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let graph = self.graph.expect("ReplayRoom polled after it resolved");
        let room = std::task::ready!(poll_room(graph.shared(), cx));
        self.graph = None;
        Poll::Ready(room.map(|()| graph))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replay declared just before another thread's delete of one of its
    /// variables is pushed behind the delete, and never runs: the tickets
    /// its push drew for its recorded ops are given up (else an allocating
    /// op pushed later would wait for them for ever).
    #[test]
    fn a_replay_that_never_runs_gives_its_tickets_up() {
        let engine = Engine::builder().threads(1).build().unwrap();
        let slot = engine.new_resource("slot", 1);
        let v = engine.var(0u32);
        let graph = engine
            .record(|rec| rec.op().mutates(&[&v]).uses(&slot, 1).run(|_| Ok(())))
            .unwrap();
        let (replaying, spec, body) = graph.replay_op().unwrap();
        engine.delete_var(&v, drop).unwrap();
        let replay = Replay {
            handle: replaying.push_spec(spec, body),
        };
        assert!(matches!(replay.wait(), Err(Error::Deleted(_))));
        let out = engine.new_var();
        let (tx, rx) = std::sync::mpsc::channel();
        engine
            .op()
            .mutates(&[&out])
            .allocates(&slot, 1, &out)
            .run(move |_| {
                tx.send(()).unwrap();
                Ok(())
            })
            .unwrap();
        if rx.recv_timeout(std::time::Duration::from_secs(30)).is_err() {
            // Dropping the engine would wait for the stuck op.
            std::mem::forget(engine);
            panic!("the allocating op waits for the dead replay's tickets");
        }
    }
}
