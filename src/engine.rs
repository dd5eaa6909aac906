//! The engine: variables, pushes, waits, and its lifetime.
//!
//! # What serialises what
//!
//! A push of an op on **one** variable takes no lock: it is one append to that
//! variable's chain. A push on **several** variables links its edges while
//! holding the engine's push lock, so that every variable's chain sees
//! multi-variable ops in one global order. Without it, two threads pushing
//! `(read A, mutate B)` and `(mutate A, read B)` could each get ahead of the
//! other on one variable: a wait-for cycle. The lock is cheap: it is held for
//! one `swap` and one `fetch_or` per variable, never while granting or running
//! anything, and uncontended when one thread pushes. Single-variable ops need
//! no place in the global order: a cycle through one of them can be shortened
//! to one through multi-variable ops only, since its two neighbours are
//! ordered on its single variable.
//!
//! # Lifetime
//!
//! [`Engine`] handles share one `Handle`; the last one dropped shuts the
//! engine down: new pushes are refused, every op already pushed runs to the
//! end, then the executors stop and their threads are joined. Ops refer to
//! the engine's shared state by pointer, which is sound because that state
//! outlives every pending op: shutdown waits for them.

#![deny(unsafe_code)]

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::diag::{Diagnostics, OpReport, OpState, ResourceReport};
use crate::error::{BoxError, Error, OpFailure};
use crate::exec::{Device, Exec, Executor};
use crate::handle::{OpHandle, Wait};
use crate::loom::sync::Mutex;
use crate::op::ctx::OpCtx;
use crate::op::track::Tracker;
use crate::op::{
    AsyncBody, Body, Edges, Mode, OpBlock, OpEdge, Runner, SyncBody, in_op, with_current_op,
};
use crate::pending::Pending;
use crate::resource::{OpBroker, OpResources, Resource};
use crate::room::Room;
use crate::stream::Lane;
use crate::var::{AnyVar, Var, VarCore};
use std::collections::HashSet;

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// Declarations of up to this many variables are normalised on the stack.
const SMALL_DECL: usize = 8;

/// The name of the default device.
///
/// ```
/// let engine = depflow::Engine::new();
/// assert_eq!(engine.device_name(engine.default_device()), Some(depflow::DEFAULT_DEVICE));
/// ```
pub const DEFAULT_DEVICE: &str = "cpu";

/// State shared by an engine's handles and its ops.
pub(crate) struct Shared {
    id: u64,
    devices: Box<[DeviceSlot]>,
    pub(crate) pending: Pending,
    pub(crate) push_lock: Mutex<()>,
    closed: AtomicBool,
    failures: Mutex<FailureLog>,
    pub(crate) broker: Arc<OpBroker>,
    pub(crate) room: Room,
    pub(crate) tracker: Option<Tracker>,
    /// Some device is a stream device: ops must mind the variables' fences.
    pub(crate) has_streams: bool,
}

struct DeviceSlot {
    name: String,
    queue: Exec,
}

#[derive(Default)]
struct FailureLog {
    first: Option<Arc<OpFailure>>,
    count: usize,
}

impl Shared {
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Hands a ready op to its device's executor.
    #[inline]
    pub(crate) fn dispatch(&self, runner: Runner, yielded: bool) {
        let device = runner.metadata().device() as usize;
        self.devices[device].queue.schedule(runner, yielded);
    }

    /// The stream device with this index, if it is one.
    #[inline]
    pub(crate) fn streams(&self, device: u16) -> Option<&crate::stream::StreamExec> {
        self.devices[usize::from(device)].queue.streams()
    }

    pub(crate) fn record_failure(&self, failure: Arc<OpFailure>) {
        let mut log = self.failures.lock();
        log.first.get_or_insert(failure);
        log.count += 1;
    }

    pub(crate) fn take_failures(&self) -> Result<(), Error> {
        let mut log = self.failures.lock();
        let count = std::mem::take(&mut log.count);
        match log.first.take() {
            Some(first) => Err(Error::Failures { first, count }),
            None => Ok(()),
        }
    }

    /// Refuses new pushes and returns a signal that fires once every op
    /// pushed before has finished.
    fn close(&self) -> Arc<crate::pending::Signal> {
        self.closed.store(true, Ordering::SeqCst);
        self.pending.wait()
    }

    fn stop_executors(&self) {
        for device in self.devices.iter() {
            device.queue.shutdown();
        }
    }
}

/// The last engine handle: dropping it shuts the engine down.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let shared = self.shared.clone();
        let stop = move || {
            let drained = shared.close();
            crate::op::reclaim::block_on(std::future::poll_fn(|cx| drained.poll_fired(cx)));
            shared.stop_executors();
            crate::op::reclaim::drain();
        };
        if in_op() {
            // Dropped inside an op: waiting here would wait for this very op.
            // Let a helper thread wait for the drain and stop the executors.
            let spawned = std::thread::Builder::new()
                .name("depflow-shutdown".into())
                .spawn(stop);
            if spawned.is_err() {
                // Cannot wait anywhere: the engine stays up (its ops still finish).
            }
        } else {
            stop();
        }
    }
}

/// A dependency engine: push ops with the variables they read and mutate, and
/// it runs them in parallel, as their dependencies allow.
///
/// Per variable, ops take effect in push order; reads of one variable run
/// concurrently, a mutation runs alone; an op starts once all its variables
/// allow it. Cheap to clone (`Send + Sync`); the last clone dropped finishes
/// what was pushed and joins the engine's threads. Engines are independent of
/// each other: there is no global instance.
///
/// Dropping the last clone blocks until the pushed ops have run, except
/// inside an op, where a helper thread waits instead. With a
/// [custom executor](crate::Executor::custom), do not drop it on one of that
/// executor's own threads (or `.await` [`shutdown`](Engine::shutdown) first):
/// blocking there could stall the very executor that must run the remaining
/// ops.
///
/// ```
/// use depflow::Engine;
///
/// let engine = Engine::new();
/// let a = engine.var(2);
/// let b = engine.var(0);
/// let c = engine.var(0);
/// // B = A + 1 and C = A + 2 may run in parallel; D = B * C waits for both.
/// engine.push(&[&a], &[&b], {
///     let (a, b) = (a.clone(), b.clone());
///     move |ctx| -> Result<(), depflow::Error> { *ctx.write(&b)? = *ctx.read(&a)? + 1; Ok(()) }
/// })?;
/// engine.push(&[&a], &[&c], {
///     let (a, c) = (a.clone(), c.clone());
///     move |ctx| -> Result<(), depflow::Error> { *ctx.write(&c)? = *ctx.read(&a)? + 2; Ok(()) }
/// })?;
/// let d = engine.push(&[&b, &c], &[], {
///     let (b, c) = (b.clone(), c.clone());
///     move |ctx| -> Result<i32, depflow::Error> { Ok(*ctx.read(&b)? * *ctx.read(&c)?) }
/// })?;
/// assert_eq!(d.wait()?, 12);
/// # Ok::<(), depflow::Error>(())
/// ```
#[derive(Clone)]
pub struct Engine {
    handle: Arc<Handle>,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = self.shared();
        let devices: Vec<_> = shared.devices.iter().map(|d| (&d.name, &d.queue)).collect();
        f.debug_struct("Engine")
            .field("id", &shared.id)
            .field("devices", &devices)
            .field("in_flight", &shared.pending.in_flight())
            .finish()
    }
}

/// Configures an [`Engine`]: its default device's executor and any further
/// named devices.
///
/// ```
/// use depflow::{Engine, Error, Executor};
///
/// let engine = Engine::builder()
///     .threads(2) // the default device: a pool of two threads
///     .device("gpu0", Executor::pool(1))
///     .build()?;
/// let gpu0 = engine.device("gpu0").unwrap();
/// let v = engine.new_var();
/// let ran_on = engine
///     .op()
///     .on(gpu0)
///     .mutates(&[&v])
///     .run(|_| Ok::<_, Error>(std::thread::current().name().map(String::from)))?
///     .wait()?;
/// assert_eq!(ran_on.as_deref(), Some("depflow-gpu0-0"));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct EngineBuilder {
    default: Executor,
    devices: Vec<(String, Executor)>,
    max_in_flight: usize,
    track_ops: bool,
}

impl EngineBuilder {
    /// The executor of the default device, named [`DEFAULT_DEVICE`]
    /// (default: a pool with one thread per available core).
    pub fn executor(mut self, executor: Executor) -> Self {
        self.default = executor;
        self
    }

    /// Shorthand for `.executor(Executor::pool(threads))`.
    pub fn threads(self, threads: usize) -> Self {
        self.executor(Executor::pool(threads))
    }

    /// Adds a named device with its own executor (its own threads, for a
    /// pool). Push an op to it with [`OpBuilder::on`].
    pub fn device(mut self, name: impl Into<String>, executor: Executor) -> Self {
        self.devices.push((name.into(), executor));
        self
    }

    /// Bounds the ops in flight (pushed, not finished) for producers that
    /// wait for room with [`OpBuilder::when_room`] (default: no bound). Plain
    /// pushes never wait, but count.
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::builder().threads(1).max_in_flight(2).build()?;
    /// let v = engine.new_var();
    /// for _ in 0..100 {
    ///     // Blocks while 2 ops are in flight: memory stays flat however far
    ///     // this loop would otherwise run ahead.
    ///     engine.op().mutates(&[&v]).when_room().wait()?.run(|_| Ok::<_, Error>(()))?;
    ///     assert!(engine.in_flight() <= 2);
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub fn max_in_flight(mut self, ops: usize) -> Self {
        self.max_in_flight = ops;
        self
    }

    /// Keeps a registry of unfinished ops, so that
    /// [`Engine::diagnostics`] can list the ops waiting for their variables
    /// too (default: off; it costs a lock per push and per completion).
    pub fn track_ops(mut self, on: bool) -> Self {
        self.track_ops = on;
        self
    }

    /// Starts the engine.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a pool of zero threads, a repeated device name,
    /// more than 65536 devices, or threads that could not be spawned.
    pub fn build(self) -> Result<Engine, Error> {
        let mut specs = vec![(DEFAULT_DEVICE.to_string(), self.default)];
        specs.extend(self.devices);
        if specs.len() > usize::from(u16::MAX) + 1 {
            return Err(Error::Config("too many devices".into()));
        }
        let mut devices = Vec::with_capacity(specs.len());
        for (name, executor) in &specs {
            if devices.iter().any(|d: &DeviceSlot| &d.name == name) {
                return Err(Error::Config(format!("device `{name}` is defined twice")));
            }
            if devices.is_empty() && matches!(executor.0, crate::exec::Kind::Streams(_)) {
                return Err(Error::Config(format!(
                    "the default device `{name}` must run on the host (a stream device's ops enqueue work): add the stream device with `device`"
                )));
            }
            if let crate::exec::Kind::Pool(0) = executor.0 {
                return Err(Error::Config(format!(
                    "device `{name}`: a pool needs at least one thread"
                )));
            }
            let queue = executor
                .build(name, devices.len() as u16)
                .map_err(|e| Error::Config(format!("device `{name}`: {e}")))?;
            devices.push(DeviceSlot {
                name: name.clone(),
                queue,
            });
        }
        let has_streams = devices.iter().any(|d| d.queue.streams().is_some());
        let shared = Arc::new(Shared {
            has_streams,
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            devices: devices.into_boxed_slice(),
            pending: Pending::default(),
            push_lock: Mutex::new(()),
            closed: AtomicBool::new(false),
            failures: Mutex::new(FailureLog::default()),
            broker: Arc::default(),
            room: Room::new(self.max_in_flight),
            tracker: self.track_ops.then(Tracker::default),
        });
        Ok(Engine {
            handle: Arc::new(Handle { shared }),
        })
    }
}

impl Engine {
    /// An engine whose default device is a work-stealing pool with one thread
    /// per available core.
    ///
    /// # Panics
    ///
    /// If the pool's threads cannot be spawned; use [`Engine::builder`] to
    /// handle that as an error.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("depflow: cannot start the engine")
    }

    /// Configures an engine.
    pub fn builder() -> EngineBuilder {
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        EngineBuilder {
            default: Executor::pool(threads),
            devices: Vec::new(),
            max_in_flight: 0,
            track_ops: false,
        }
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// A new plain variable: a tag for a resource the engine does not own.
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let rng = engine.new_var(); // stands for an RNG kept elsewhere
    /// assert_eq!(rng.version(), 0);
    /// ```
    pub fn new_var(&self) -> Var {
        self.var(())
    }

    /// A new variable owning `value`, which ops reach through their
    /// [`OpCtx`].
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let weights = engine.var(vec![0.0f32; 1024]);
    /// let w = weights.key();
    /// engine.push(&[], &[&weights], move |ctx| -> Result<(), depflow::Error> {
    ///     ctx.write(w)?.fill(0.5);
    ///     Ok(())
    /// })?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn var<T: Send + Sync + 'static>(&self, value: T) -> Var<T> {
        Var::new(self.shared().id, value)
    }

    /// A new counted resource of `capacity` units (bytes of a device's
    /// memory, buffer slots, stream slots): ops declare the units they need
    /// with [`OpBuilder::uses`] and [`OpBuilder::allocates`], and start only
    /// once those are free. See [`Resource`].
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let slots = engine.new_resource("staging buffers", 2);
    /// assert_eq!((slots.name(), slots.capacity(), slots.in_use()), ("staging buffers", 2, 0));
    /// ```
    pub fn new_resource(&self, name: impl Into<Cow<'static, str>>, capacity: u64) -> Resource {
        Resource::new(
            self.shared().id,
            name.into(),
            capacity,
            &self.shared().broker,
        )
    }

    /// Ops pushed and not finished yet, if the engine bounds them
    /// ([`EngineBuilder::max_in_flight`]); otherwise 0 (they are not counted).
    pub fn in_flight(&self) -> usize {
        self.shared().room.in_flight()
    }

    /// What the engine is waiting for: its resources, the ops parked for
    /// units, and (with [`EngineBuilder::track_ops`]) every unfinished op
    /// with the variables and earlier ops it waits for. For a stuck engine;
    /// see [`Diagnostics`] for an example.
    pub fn diagnostics(&self) -> Diagnostics {
        let shared = self.shared();
        let mut parked = HashSet::new();
        let mut waiting_for_units = Vec::new();
        shared.broker.for_each_waiting(|runner| {
            let op = runner.metadata();
            parked.insert(std::ptr::from_ref(op) as usize);
            let mut report = OpReport::of(op, None);
            report.state = OpState::Units(OpReport::units_of(op));
            waiting_for_units.push(report);
        });
        Diagnostics {
            in_flight: shared.pending.in_flight(),
            resources: shared
                .broker
                .pools()
                .into_iter()
                .map(|p| ResourceReport {
                    name: p.name,
                    capacity: p.capacity,
                    free: p.free,
                })
                .collect(),
            waiting_for_units,
            tracked: shared.tracker.as_ref().map(|t| t.report(&parked)),
        }
    }

    /// The default device (named [`DEFAULT_DEVICE`]).
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// assert_eq!(engine.default_device().index(), 0);
    /// ```
    pub fn default_device(&self) -> Device {
        Device::new(self.shared().id, 0)
    }

    /// The device named `name`, if the engine has one.
    ///
    /// ```
    /// use depflow::{Engine, Executor};
    ///
    /// let engine = Engine::builder().device("io", Executor::pool(1)).build()?;
    /// assert!(engine.device("io").is_some());
    /// assert!(engine.device("gpu7").is_none());
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn device(&self, name: &str) -> Option<Device> {
        let index = self.shared().devices.iter().position(|d| d.name == name)?;
        Some(Device::new(self.shared().id, index as u16))
    }

    /// The name of `device`, if it belongs to this engine.
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// assert_eq!(engine.device_name(engine.default_device()), Some("cpu"));
    /// ```
    pub fn device_name(&self, device: Device) -> Option<&str> {
        if device.engine != self.shared().id {
            return None;
        }
        self.shared()
            .devices
            .get(device.index())
            .map(|d| d.name.as_str())
    }

    /// Describes an op to push with more options: a name, a priority, a
    /// device. See [`OpBuilder`].
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let v = engine.new_var();
    /// engine.op().name("init").mutates(&[&v]).run(|_| Ok::<_, depflow::Error>(()))?.wait()?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn op(&self) -> OpBuilder<'_> {
        OpBuilder {
            engine: self,
            reads: &[],
            mutates: &[],
            name: None,
            priority: 0,
            device: None,
            lane: None,
            resources: None,
            allocations: Vec::new(),
            invalid: None,
        }
    }

    /// Pushes a synchronous op that reads `reads` and mutates `mutates`.
    ///
    /// The closure runs once every earlier op that conflicts with it (per
    /// variable: earlier mutations for a read; earlier reads and mutations for
    /// a mutation) has completed, on the default device. It gets an [`OpCtx`]
    /// to reach the variables' values. A variable in both lists counts as
    /// mutated; a repeated variable counts once.
    ///
    /// Returns a handle that resolves to the closure's result. If the closure
    /// returns an error or panics, the variables it mutates are poisoned:
    /// later ops touching them do not run and resolve to
    /// [`Error::Poisoned`].
    ///
    /// # Errors
    ///
    /// At once, without running anything: [`Error::NoVars`] for empty lists,
    /// [`Error::ForeignVar`] for a variable of another engine,
    /// [`Error::Deleted`] for a deleted variable, [`Error::ShutDown`] after
    /// shutdown.
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let (x, y) = (engine.var(3.0f64), engine.var(0.0f64));
    /// let (xk, yk) = (x.key(), y.key());
    /// // y = x * x: reads x, mutates y.
    /// let done = engine.push(&[&x], &[&y], move |ctx| -> Result<f64, Error> {
    ///     let v = *ctx.read(xk)? * *ctx.read(xk)?;
    ///     *ctx.write(yk)? = v;
    ///     Ok(v)
    /// })?;
    /// assert_eq!(done.wait()?, 9.0);
    /// assert!(matches!(engine.push(&[], &[], |_| Ok::<_, Error>(())), Err(Error::NoVars)));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn push<F, T, E>(
        &self,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        f: F,
    ) -> Result<OpHandle<T>, Error>
    where
        F: FnOnce(&OpCtx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Into<BoxError>,
    {
        self.op().reads(reads).mutates(mutates).run(f)
    }

    /// Pushes an asynchronous op: `f` receives the op's [`OpCtx`] and returns
    /// a future, which may await (I/O, timers, other ops' handles) while the
    /// op holds its variables, without occupying a worker thread while it is
    /// pending.
    ///
    /// # Errors
    ///
    /// As for [`push`](Self::push).
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let buf = engine.var(Vec::new());
    /// let fill = engine.push_async(&[], &[&buf], {
    ///     let buf = buf.clone();
    ///     move |ctx| async move {
    ///         let data = async { vec![1u8, 2, 3] }.await; // e.g. a file read
    ///         ctx.write(&buf)?.extend(data);
    ///         Ok::<_, depflow::Error>(())
    ///     }
    /// })?;
    /// fill.wait()?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn push_async<F, Fut, T, E>(
        &self,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        f: F,
    ) -> Result<OpHandle<T>, Error>
    where
        F: FnOnce(OpCtx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Into<BoxError>,
    {
        self.op().reads(reads).mutates(mutates).run_async(f)
    }

    /// Deletes `var` once every op already pushed on it has completed: then
    /// `f` receives the variable's value (`()` for a plain variable), to
    /// recycle it. Pushing on the variable afterwards is an error.
    ///
    /// The deletion runs even if the variable is poisoned. Resource units the
    /// variable holds ([`OpBuilder::allocates`]) go back once `f` returns.
    ///
    /// # Errors
    ///
    /// [`Error::Deleted`] if a delete was already pushed; otherwise as for
    /// [`push`](Self::push).
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let buffer = engine.var(vec![0u8; 4096]);
    /// let b = buffer.key();
    /// engine.push(&[&buffer], &[], move |ctx| Ok::<_, Error>(ctx.read(b)?.len()))?;
    /// // Runs after the read above; the buffer goes back to a pool, say.
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// engine.delete_var(&buffer, move |bytes| tx.send(bytes).unwrap())?.wait()?;
    /// assert_eq!(rx.recv().unwrap().len(), 4096);
    /// assert!(matches!(engine.push(&[&buffer], &[], |_| Ok::<_, Error>(())), Err(Error::Deleted(_))));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn delete_var<T>(
        &self,
        var: &Var<T>,
        f: impl FnOnce(T) + Send + 'static,
    ) -> Result<OpHandle<()>, Error>
    where
        T: Send + Sync + 'static,
    {
        self.check_var(var)?;
        if !var.core().mark_deleted() {
            return Err(Error::Deleted(var.id()));
        }
        let key = var.key();
        let body = SyncBody(Some(move |ctx: &OpCtx| -> Result<(), BoxError> {
            // The units go back after `f` recycled the value (or unwound).
            let (value, _units) = ctx.delete(key)?;
            if let Some(value) = value {
                f(value);
            }
            Ok(())
        }));
        let edges = self.edges(&[], &[var], |_| Ok(()))?;
        self.launch(
            edges,
            body,
            0,
            Some(Cow::Borrowed("delete_var")),
            Mode::Maintenance,
            0,
            None,
            None,
        )
    }

    /// Clears the poison of `var`, in push order: ops pushed after this one
    /// run normally again (their values are whatever the variable holds).
    ///
    /// # Errors
    ///
    /// As for [`push`](Self::push).
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let v = engine.var(0);
    /// let failing = engine.push(&[], &[&v], |_| Err::<(), _>("bad batch"))?;
    /// assert!(failing.wait().is_err());
    /// assert!(matches!(engine.wait_for_var(&v).wait(), Err(Error::Poisoned(_))));
    /// engine.clear_poison(&v)?;
    /// engine.wait_for_var(&v).wait()?; // live again
    /// # let _ = engine.wait_all().wait();
    /// # Ok::<(), Error>(())
    /// ```
    pub fn clear_poison<T>(&self, var: &Var<T>) -> Result<OpHandle<()>, Error>
    where
        T: Send + Sync + 'static,
    {
        let key = var.key();
        let body = SyncBody(Some(move |ctx: &OpCtx| -> Result<(), BoxError> {
            ctx.clear_poison(key)?;
            Ok(())
        }));
        let edges = self.edges(&[], &[var], |c| self.check_core(c))?;
        self.launch(
            edges,
            body,
            0,
            Some(Cow::Borrowed("clear_poison")),
            Mode::Maintenance,
            0,
            None,
            None,
        )
    }

    /// Waits until every mutation pushed on `var` so far has completed.
    ///
    /// Resolves to an error if the variable is poisoned
    /// ([`Error::Poisoned`], naming the original failure) or deleted.
    /// Inside an op that declared `var` it resolves at once to
    /// [`Error::WaitsForItself`].
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let v = engine.var(0u64);
    /// let k = v.key();
    /// for _ in 0..10 {
    ///     engine.push(&[], &[&v], move |ctx| -> Result<(), depflow::Error> {
    ///         *ctx.write(k)? += 1;
    ///         Ok(())
    ///     })?;
    /// }
    /// engine.wait_for_var(&v).wait()?; // or `.await`
    /// assert_eq!(v.version(), 10);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn wait_for_var<T>(&self, var: &Var<T>) -> Wait
    where
        T: Send + Sync + 'static,
    {
        let key = var.key();
        let own =
            with_current_op(|op| op.is_some_and(|op| op.edges().iter().any(|e| key.names(&e.var))));
        if own {
            return Wait::ready(Err(Error::WaitsForItself));
        }
        let body = SyncBody(Some(|_: &OpCtx| Ok::<(), BoxError>(())));
        let pushed = self
            .edges(&[var], &[], |c| self.check_core(c))
            .and_then(|edges| {
                self.launch(
                    edges,
                    body,
                    0,
                    Some(Cow::Borrowed("wait_for_var")),
                    Mode::Normal,
                    0,
                    None,
                    None,
                )
            });
        match pushed {
            Ok(handle) => Wait::op(handle),
            Err(e) => Wait::ready(Err(e)),
        }
    }

    /// Waits until every op pushed so far (by any thread) has finished.
    ///
    /// Resolves to [`Error::Failures`] if ops failed since the previous
    /// `wait_all` (each failure is reported once). Ops pushed by other threads
    /// while it waits do not delay it. Inside an op it resolves at once to
    /// [`Error::WaitsForItself`].
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let vars: Vec<_> = (0..8).map(|_| engine.new_var()).collect();
    /// for v in &vars {
    ///     engine.push(&[], &[v], |_| Ok::<_, Error>(()))?;
    /// }
    /// engine.wait_all().wait()?;
    /// assert!(vars.iter().all(|v| v.version() == 1));
    ///
    /// engine.push(&[], &[&vars[0]], |_| Err::<(), _>("out of memory"))?;
    /// assert!(matches!(engine.wait_all().wait(), Err(Error::Failures { count: 1, .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn wait_all(&self) -> Wait {
        if in_op() {
            return Wait::ready(Err(Error::WaitsForItself));
        }
        Wait::drain(self.shared().pending.wait(), self.shared().clone(), true)
    }

    /// Shuts the engine down: new pushes fail with [`Error::ShutDown`]; the
    /// returned wait resolves once every op pushed before has finished. The
    /// executors' threads stop when the last handle is dropped (dropping it
    /// also shuts down, blocking until the ops have finished). Inside an op
    /// the engine is shut down all the same, but the wait resolves at once to
    /// [`Error::WaitsForItself`].
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let v = engine.new_var();
    /// engine.push(&[], &[&v], |_| Ok::<_, Error>(()))?;
    /// engine.shutdown().wait()?; // the op above has run
    /// assert!(matches!(engine.push(&[], &[&v], |_| Ok::<_, Error>(())), Err(Error::ShutDown)));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn shutdown(&self) -> Wait {
        if in_op() {
            self.shared().closed.store(true, Ordering::SeqCst);
            return Wait::ready(Err(Error::WaitsForItself));
        }
        Wait::drain(self.shared().close(), self.shared().clone(), false)
    }

    /// Whether `var` may be used with this engine.
    fn check_var<T>(&self, var: &Var<T>) -> Result<(), Error> {
        self.check_core(var.core())
    }

    fn check_core(&self, core: &VarCore) -> Result<(), Error> {
        if core.engine() != self.shared().id {
            Err(Error::ForeignVar(core.id()))
        } else if core.is_deleted() {
            Err(Error::Deleted(core.id()))
        } else {
            Ok(())
        }
    }

    /// Normalises a declaration into edges: mutated variables first, each
    /// variable once, a variable both read and mutated counting as mutated.
    fn edges(
        &self,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        check: impl Fn(&VarCore) -> Result<(), Error>,
    ) -> Result<Edges, Error> {
        let all = || mutates.iter().chain(reads);
        if mutates.is_empty() && reads.is_empty() {
            return Err(Error::NoVars);
        }
        for var in all() {
            check(var.core())?;
        }
        // Fast paths for one or two variables, the common case. The general
        // path below gives the same edges; this one saves 58 to 105
        // instructions per push (callgrind, `chain` and `seed4`).
        match (mutates, reads) {
            ([v], []) | ([], [v]) => {
                return Ok(Edges::One([OpEdge::new(v.hold(), !mutates.is_empty())]));
            }
            ([a], [b]) | ([a, b], []) | ([], [a, b]) => {
                let a_write = !mutates.is_empty();
                let b_write = mutates.len() == 2;
                return Ok(if std::ptr::eq(a.core(), b.core()) {
                    Edges::One([OpEdge::new(a.hold(), a_write)])
                } else {
                    Edges::Two([
                        OpEdge::new(a.hold(), a_write),
                        OpEdge::new(b.hold(), b_write),
                    ])
                });
            }
            _ => {}
        }
        let n = mutates.len() + reads.len();
        if n <= SMALL_DECL {
            // Dedup on the stack: no allocation unless more than two remain.
            let mut kept: [Option<(&dyn AnyVar, bool)>; SMALL_DECL] = [None; SMALL_DECL];
            let mut k = 0;
            for (i, var) in all().enumerate() {
                if !kept[..k]
                    .iter()
                    .flatten()
                    .any(|(v, _)| std::ptr::eq(v.core(), var.core()))
                {
                    kept[k] = Some((*var, i < mutates.len()));
                    k += 1;
                }
            }
            let edge = |j: usize| {
                let (var, write) = kept[j].expect("kept");
                OpEdge::new(var.hold(), write)
            };
            return Ok(match k {
                1 => Edges::One([edge(0)]),
                2 => Edges::Two([edge(0), edge(1)]),
                _ => Edges::Many((0..k).map(edge).collect()),
            });
        }
        let mut edges: Vec<OpEdge> = Vec::with_capacity(n);
        let mut index = std::collections::HashSet::new();
        for (i, var) in all().enumerate() {
            if index.insert(var.core() as *const VarCore) {
                edges.push(OpEdge::new(var.hold(), i < mutates.len()));
            }
        }
        Ok(Edges::from_vec(edges))
    }

    /// Spawns the op's task and links it into its variables' chains.
    #[allow(clippy::too_many_arguments)]
    fn launch<B: Body>(
        &self,
        edges: Edges,
        body: B,
        device: u16,
        name: Option<Cow<'static, str>>,
        mode: Mode,
        priority: i32,
        resources: Option<Box<OpResources>>,
        lane: Option<u8>,
    ) -> Result<OpHandle<B::Output>, Error> {
        let shared = self.shared();
        let generation = shared.pending.enter();
        if shared.closed.load(Ordering::SeqCst) {
            shared.pending.leave(generation);
            return Err(Error::ShutDown);
        }
        shared.room.enter();
        let block = OpBlock::new(
            shared, device, priority, name, mode, generation, edges, resources, lane,
        );
        Ok(OpHandle::new(OpBlock::spawn(block, body)))
    }
}

/// An op under construction: set its variables, name, priority and device,
/// then [`run`](OpBuilder::run) or [`run_async`](OpBuilder::run_async) it.
///
/// ```
/// let engine = depflow::Engine::new();
/// let grad = engine.var(vec![1.0f32; 8]);
/// let handle = engine
///     .op()
///     .name("allreduce fc1")
///     .priority(10)
///     .mutates(&[&grad])
///     .run({
///         let grad = grad.clone();
///         move |ctx| -> Result<f32, depflow::Error> {
///             let mut g = ctx.write(&grad)?;
///             g.iter_mut().for_each(|x| *x *= 0.5);
///             Ok(g.iter().sum())
///         }
///     })?;
/// assert_eq!(handle.wait()?, 4.0);
/// # Ok::<(), depflow::Error>(())
/// ```
#[must_use = "an OpBuilder does nothing until `run` or `run_async`"]
pub struct OpBuilder<'a> {
    engine: &'a Engine,
    reads: &'a [&'a dyn AnyVar],
    mutates: &'a [&'a dyn AnyVar],
    name: Option<Cow<'static, str>>,
    priority: i32,
    device: Option<Device>,
    lane: Option<Lane>,
    resources: Option<Box<OpResources>>,
    /// The variable of each lasting demand in `resources`, in order.
    allocations: Vec<&'a dyn AnyVar>,
    /// The first bad resource declaration, reported by `run`.
    invalid: Option<Error>,
}

impl std::fmt::Debug for OpBuilder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpBuilder")
            .field("reads", &self.reads)
            .field("mutates", &self.mutates)
            .field("name", &self.name)
            .field("priority", &self.priority)
            .field("device", &self.device)
            .field(
                "resources",
                &self.resources.as_ref().map(|r| r.resources.as_slice()),
            )
            .finish()
    }
}

impl<'a> OpBuilder<'a> {
    /// The variables the op reads.
    pub fn reads(mut self, vars: &'a [&'a dyn AnyVar]) -> Self {
        self.reads = vars;
        self
    }

    /// The variables the op mutates.
    pub fn mutates(mut self, vars: &'a [&'a dyn AnyVar]) -> Self {
        self.mutates = vars;
        self
    }

    /// A name for errors and `Debug` output.
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// A priority among ready ops (default 0; higher runs first). Honoured by
    /// the pool executor; it never overrides dependencies.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The device to run on (default: the engine's default device).
    pub fn on(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// The lane (stream) of a stream device the op's work goes to (default
    /// [`Lane::Compute(0)`](Lane::Compute)); see [`stream`](crate::stream).
    ///
    /// # Errors
    ///
    /// Reported by `run`: [`Error::Stream`] if the device has no such lane
    /// or is not a stream device.
    ///
    /// ```
    /// use depflow::{Engine, Error, Executor, Lane};
    ///
    /// let engine = Engine::builder().device("gpu", Executor::simulated_gpu(1)).build()?;
    /// let gpu = engine.device("gpu").unwrap();
    /// let v = engine.new_var();
    /// let lane = engine
    ///     .op()
    ///     .on(gpu)
    ///     .lane(Lane::HostToDevice)
    ///     .mutates(&[&v])
    ///     .run(|ctx| Ok::<_, Error>(ctx.stream()?.lane()))?;
    /// assert_eq!(lane.wait()?, Lane::HostToDevice);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn lane(mut self, lane: Lane) -> Self {
        self.lane = Some(lane);
        self
    }

    /// Units of `resource` the op needs while it runs, given back when it
    /// completes. The op starts only once all its variables allow it *and*
    /// all its units are free; it takes them all at once.
    ///
    /// # Errors
    ///
    /// Reported by `run`: [`Error::OverCapacity`] if the op needs more than
    /// the resource has, [`Error::ForeignResource`] for another engine's.
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let streams = engine.new_resource("streams", 1);
    /// let (a, b) = (engine.new_var(), engine.new_var());
    /// // Independent variables, but one stream: the two never overlap.
    /// let first = engine.op().mutates(&[&a]).uses(&streams, 1).run(|_| Ok::<_, Error>(()))?;
    /// let second = engine.op().mutates(&[&b]).uses(&streams, 1).run(|_| Ok::<_, Error>(()))?;
    /// first.wait()?;
    /// second.wait()?;
    /// assert_eq!(streams.in_use(), 0);
    /// # Ok::<(), Error>(())
    /// ```
    pub fn uses(mut self, resource: &Resource, units: u64) -> Self {
        self.add_units(resource, units, None);
        self
    }

    /// Units of `resource` the op needs and hands on to `output`, one of the
    /// variables it mutates (the buffer it fills): `output` holds them from
    /// the op's completion until it is deleted or dropped, or a later op
    /// allocates it again (which replaces them). If the op fails, they come
    /// back at once.
    ///
    /// Such an op waits for every op pushed before it that needs units of
    /// the same resource (see [`Resource`] on why this makes pipelines
    /// deadlock-free).
    ///
    /// # Errors
    ///
    /// As for [`uses`](Self::uses), and [`Error::NotMutable`] (reported by
    /// `run`) if the op does not mutate `output`.
    pub fn allocates(mut self, resource: &Resource, units: u64, output: &'a dyn AnyVar) -> Self {
        self.allocations.push(output);
        self.add_units(resource, units, Some(self.allocations.len() - 1));
        self
    }

    fn add_units(&mut self, resource: &Resource, units: u64, allocation: Option<usize>) {
        if resource.inner.engine != self.engine.shared().id {
            self.invalid
                .get_or_insert(Error::ForeignResource(resource.name().to_string()));
        } else if units > 0 {
            self.resources
                .get_or_insert_with(|| Box::new(OpResources::new()))
                .add(resource, units, allocation);
        }
    }

    /// Waits for room under the engine's bound on ops in flight
    /// ([`EngineBuilder::max_in_flight`]), then gives the builder back to
    /// [`run`](Self::run): a producer that pushes this way never runs more
    /// than the bound ahead of the engine (plus one op per other producer
    /// between its wait and its push). Ready at once without a bound.
    ///
    /// `.await` it in async code, or block with [`WhenRoom::wait`].
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// # futures::executor::block_on(async {
    /// let engine = Engine::builder().max_in_flight(8).build()?;
    /// let v = engine.new_var();
    /// for _ in 0..100 {
    ///     engine.op().mutates(&[&v]).when_room().await?.run(|_| Ok::<_, Error>(()))?;
    /// }
    /// engine.wait_all().await?;
    /// # Ok::<(), Error>(()) }).unwrap();
    /// ```
    pub fn when_room(self) -> WhenRoom<'a> {
        WhenRoom {
            builder: Some(self),
        }
    }

    /// The op's lane on a stream device (None elsewhere).
    fn lane_index<B: Body>(&self, device: u16) -> Result<Option<u8>, Error> {
        if self.lane.is_none() && !self.engine.shared().has_streams {
            return Ok(None); // the common case, one load
        }
        let lane = self.lane.unwrap_or_default();
        match self.engine.shared().streams(device) {
            None if self.lane.is_some() => Err(Error::Stream(format!(
                "{lane:?} given for an op on a device without streams"
            ))),
            None => Ok(None),
            Some(_) if !B::SYNC => Err(Error::Stream(
                "an op on a stream device has a synchronous body (it enqueues work)".into(),
            )),
            Some(exec) => exec
                .lane(lane)
                .map(Some)
                .ok_or_else(|| Error::Stream(format!("the device has no lane {lane:?}"))),
        }
    }

    fn device_index(&self) -> Result<u16, Error> {
        match self.device {
            None => Ok(0),
            Some(d) if d.engine == self.engine.shared().id => Ok(d.index),
            Some(_) => Err(Error::Config("the device belongs to another engine".into())),
        }
    }

    /// Pushes the op with a synchronous body; see [`Engine::push`].
    ///
    /// # Errors
    ///
    /// As for [`Engine::push`].
    pub fn run<F, T, E>(self, f: F) -> Result<OpHandle<T>, Error>
    where
        F: FnOnce(&OpCtx) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Into<BoxError>,
    {
        self.launch(SyncBody(Some(f)))
    }

    /// Pushes the op with an asynchronous body; see [`Engine::push_async`].
    ///
    /// # Errors
    ///
    /// As for [`Engine::push`].
    pub fn run_async<F, Fut, T, E>(self, f: F) -> Result<OpHandle<T>, Error>
    where
        F: FnOnce(OpCtx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: Into<BoxError>,
    {
        self.launch(AsyncBody::new(f))
    }

    fn launch<B: Body>(mut self, body: B) -> Result<OpHandle<B::Output>, Error> {
        let engine = self.engine;
        let device = self.device_index()?;
        if let Some(e) = self.invalid {
            return Err(e);
        }
        let edges = engine.edges(self.reads, self.mutates, |c| engine.check_core(c))?;
        if let Some(r) = &mut self.resources {
            if let Some((resource, requested)) = r.over_capacity() {
                return Err(Error::OverCapacity {
                    resource: resource.name().to_string(),
                    requested,
                    capacity: resource.capacity(),
                });
            }
            // Point each allocation at its output's edge, merging repeats.
            for l in &mut r.lasting {
                let var = self.allocations[l.edge].core();
                l.edge = edges
                    .as_slice()
                    .iter()
                    .position(|e| std::ptr::eq(e.var.core(), var) && e.edge.is_write())
                    .ok_or(Error::NotMutable(var.id()))?;
            }
            r.merge_lasting();
        }
        let lane = self.lane_index::<B>(device)?;
        engine.launch(
            edges,
            body,
            device,
            self.name,
            Mode::Normal,
            self.priority,
            self.resources,
            lane,
        )
    }
}

/// Waits for room under the engine's bound on ops in flight; resolves to the
/// [`OpBuilder`] to push with. Made by [`OpBuilder::when_room`].
#[must_use = "a WhenRoom does nothing unless awaited or waited on"]
#[derive(Debug)]
pub struct WhenRoom<'a> {
    builder: Option<OpBuilder<'a>>,
}

impl<'a> WhenRoom<'a> {
    /// Blocks the calling thread until there is room.
    ///
    /// # Errors
    ///
    /// [`Error::BlockingInOp`] inside an op (`.await` it there instead).
    pub fn wait(self) -> Result<OpBuilder<'a>, Error> {
        if in_op() {
            return Err(Error::BlockingInOp);
        }
        crate::op::reclaim::block_on(self)
    }
}

impl<'a> Future for WhenRoom<'a> {
    type Output = Result<OpBuilder<'a>, Error>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let builder = self
            .builder
            .as_ref()
            .expect("WhenRoom polled after it resolved");
        std::task::ready!(builder.engine.shared().room.poll_room(cx));
        std::task::Poll::Ready(Ok(self.builder.take().expect("checked above")))
    }
}

// An `OpBuilder` holds only shared references and owned data.
impl Unpin for WhenRoom<'_> {}
