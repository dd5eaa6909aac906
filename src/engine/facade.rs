//! The engine's facade: [`Engine`], what users call to make variables and
//! resources, push ops, wait and shut down.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use super::builder::EngineBuilder;
use super::handle::{Drained, OpHandle, Wait};
use super::op_builder::OpBuilder;
use super::shared::Shared;
use super::shutdown::ShutdownOnDrop;
use crate::dep::VarKey;
use crate::dep::{
    AnyVar, AsyncBody, Body, Buffer, Device, Element, Mode, OpCtx, OpSpec, SyncBody, Var, deletion,
    edges, in_op_of, mark_deleted, spawn, unpoisoning, var_wait, with_current_op,
};
use crate::error::{BoxError, Error};
use crate::resource::Resource;
use crate::trace::Diagnostics;

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
/// where that could wait for the calling thread itself: inside an op, on a
/// thread that runs the engine's ops or device work (a pool worker, a job of
/// an inline or custom executor, a stream device's threads and host
/// functions), inside a tokio runtime (with the `tokio` feature), and after
/// [`shutdown_timeout`](Engine::shutdown_timeout) gave up. There a helper
/// thread waits instead and the drop returns at once (`.await`
/// [`shutdown`](Engine::shutdown) first to know the ops have run). A custom
/// executor's own threads, outside a job, cannot be told apart: do not drop
/// the last clone there without awaiting `shutdown` first.
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
///     move |ctx| { *ctx.write(&b)? = *ctx.read(&a)? + 1; Ok(()) }
/// })?;
/// engine.push(&[&a], &[&c], {
///     let (a, c) = (a.clone(), c.clone());
///     move |ctx| { *ctx.write(&c)? = *ctx.read(&a)? + 2; Ok(()) }
/// })?;
/// let d = engine.push(&[&b, &c], &[], {
///     let (b, c) = (b.clone(), c.clone());
///     move |ctx| { Ok(*ctx.read(&b)? * *ctx.read(&c)?) }
/// })?;
/// assert_eq!(d.wait()?, 12);
/// # Ok::<(), depflow::Error>(())
/// ```
#[derive(Clone)]
pub struct Engine {
    pub(super) handle: Arc<ShutdownOnDrop>,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = self.shared();
        let devices: Vec<_> = shared.devices.iter().map(|d| (&d.name, &d.exec)).collect();
        f.debug_struct("Engine")
            .field("id", &shared.id)
            .field("devices", &devices)
            .field("in_flight", &shared.pending.in_flight())
            .finish()
    }
}

impl Engine {
    /// An engine whose default device is a work-stealing pool with one thread
    /// per available core, unless the environment says otherwise:
    /// `DEPFLOW_EXECUTOR=inline` runs every op on the thread that makes it
    /// ready (for debugging), `DEPFLOW_THREADS=n` sizes the pool (see
    /// [`EngineBuilder`'s environment](EngineBuilder#environment)).
    ///
    /// # Panics
    ///
    /// If the pool's threads cannot be spawned, or a `DEPFLOW_*` variable has
    /// a bad value (the message names it); use [`Engine::builder`] to handle
    /// that as an error.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .unwrap_or_else(|e| panic!("depflow: cannot start the engine: {e}"))
    }

    /// Configures an engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// The engine of `shared`, which shuts down when its last handle drops.
    pub(super) fn start(shared: Shared) -> Self {
        Self {
            handle: Arc::new(ShutdownOnDrop::new(Arc::new(shared))),
        }
    }

    #[inline]
    pub(super) fn shared(&self) -> &Arc<Shared> {
        self.handle.shared()
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
    /// engine.push(&[], &[&weights], move |ctx| {
    ///     ctx.write(w)?.fill(0.5);
    ///     Ok(())
    /// })?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn var<T: Send + Sync + 'static>(&self, value: T) -> Var<T> {
        Var::new(self.shared().id, value)
    }

    /// A new variable owning `value`, named `name` (a plain tag with `()`):
    /// errors, [`Debug`](std::fmt::Debug) output and [`Diagnostics`] then
    /// show `` `name` (var#N) `` instead of `var#N`.
    ///
    /// The name is kept apart from the variable (pushes and runs never read
    /// it) and shows while the variable is alive: an error printed after its
    /// last handle and op are gone says `var#N` only. [`VarId::name`](crate::VarId::name) reads
    /// it back. Names need not be unique.
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let weights = engine.var_named("fc1.weight", vec![0.5f32; 4]);
    /// let rng = engine.var_named("rng", ()); // a named plain tag
    /// let key = rng.key();
    /// let err = engine
    ///     .push(&[&weights], &[], move |ctx| -> Result<(), depflow::BoxError> {
    ///         ctx.read(key)?; // not declared
    ///         Ok(())
    ///     })?
    ///     .wait()
    ///     .unwrap_err();
    /// let text = err.to_string();
    /// assert!(text.contains("the op did not declare `rng` (var#"), "{text}");
    /// # Ok::<(), Error>(())
    /// ```
    pub fn var_named<T: Send + Sync + 'static>(
        &self,
        name: impl Into<Arc<str>>,
        value: T,
    ) -> Var<T> {
        Var::named(self.shared().id, value, name.into())
    }

    /// A new buffer of `len` values of `T`, zeroed: a variable whose value
    /// is a fixed-length slice of plain numbers, which bodies reach as
    /// `[T]` ([`OpCtx::read`], [`OpCtx::write`], typed access). It is what
    /// a recorded graph's planned buffer ([`Recorder::buffer`](crate::Recorder::buffer)) is, outside
    /// any graph, with memory of its own (taken on its first access, freed
    /// with the last handle): so code written against [`Ops`](crate::Ops) makes its
    /// intermediates the same way pushed or recorded.
    ///
    /// ```
    /// use depflow::{Engine, read, write};
    ///
    /// let engine = Engine::new();
    /// let (samples, mean) = (engine.buffer::<f32>(4), engine.var(0.0f32));
    /// engine.op().with(write(&samples)).run(|s| {
    ///     s.copy_from_slice(&[1.0, 2.0, 3.0, 6.0]); // a `&mut [f32]`
    ///     Ok(())
    /// })?;
    /// engine.op().with((read(&samples), write(&mean))).run(|(s, mean)| {
    ///     *mean = s.iter().sum::<f32>() / s.len() as f32;
    ///     Ok(())
    /// })?;
    /// assert_eq!(engine.get(&mean).wait()?, 3.0);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    ///
    /// The memory is taken, zeroed, when an op first touches the buffer:
    /// if it cannot be allocated (or `len` values of `T` are more bytes than
    /// one allocation may hold), that op fails with [`Error::Graph`]
    /// saying so; nothing panics or aborts.
    pub fn buffer<T: Element>(&self, len: usize) -> Buffer<T> {
        Buffer::standalone(Var::new(self.shared().id, ()), len)
    }

    /// [`buffer`](Self::buffer), named `name` (as
    /// [`var_named`](Self::var_named) names a variable).
    ///
    /// # Panics
    ///
    /// As for [`buffer`](Self::buffer).
    pub fn buffer_named<T: Element>(&self, name: impl Into<Arc<str>>, len: usize) -> Buffer<T> {
        Buffer::standalone(Var::named(self.shared().id, (), name.into()), len)
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
        let name = name.into();
        let shared = self.shared();
        let pool = shared.broker.add_pool(name.as_ref(), capacity);
        Resource::new(shared.id, pool, name, capacity, shared.clone())
    }

    /// Ops pushed and not finished yet (a snapshot), whether or not the
    /// engine bounds them ([`EngineBuilder::max_in_flight`]): the same count
    /// as [`Diagnostics::in_flight`]. The engine's own ops count too
    /// ([`delete_var`](Self::delete_var), [`clear_poison`](Self::clear_poison),
    /// [`wait_for_var`](Self::wait_for_var)), though a pending
    /// `wait_for_var` takes no room under the bound.
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let v = engine.new_var();
    /// engine.push(&[], &[&v], |_| Ok::<_, depflow::BoxError>(()))?;
    /// assert!(engine.in_flight() <= 1);
    /// engine.wait_all().wait()?;
    /// assert_eq!(engine.in_flight(), 0);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn in_flight(&self) -> usize {
        super::diagnostics::in_flight(self.shared())
    }

    /// What the engine is waiting for: its resources, the ops parked for
    /// units, and (with [`EngineBuilder::track_ops`]) every unfinished op
    /// with the variables and earlier ops it waits for. For a stuck engine;
    /// see [`Diagnostics`] for an example.
    pub fn diagnostics(&self) -> Diagnostics {
        super::diagnostics::report(self.shared())
    }

    /// The default device (named [`DEFAULT_DEVICE`](crate::DEFAULT_DEVICE)).
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

    /// Whether `device` is a stream device of this engine (a GPU, or a
    /// simulated one: see [`stream`](crate::stream)), whose ops enqueue
    /// work on streams instead of running on a host thread.
    ///
    /// ```
    /// use depflow::{Engine, Executor};
    ///
    /// let engine = Engine::builder().device("gpu0", Executor::simulated_gpu(1)).build()?;
    /// assert!(engine.is_stream_device(engine.device("gpu0").unwrap()));
    /// assert!(!engine.is_stream_device(engine.default_device()));
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn is_stream_device(&self, device: Device) -> bool {
        device.engine == self.shared().id
            && self
                .shared()
                .devices
                .get(device.index())
                .is_some_and(|d| d.exec.stream_device().is_some())
    }

    /// Describes an op to push with more options: a name, a priority, a
    /// device. See [`OpBuilder`].
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let v = engine.new_var();
    /// engine.op().name("init").mutates(&[&v]).run(|_| Ok(()))?.wait()?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn op(&self) -> OpBuilder<'_> {
        OpBuilder::new(self)
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
    /// let done = engine.push(&[&x], &[&y], move |ctx| {
    ///     let v = *ctx.read(xk)? * *ctx.read(xk)?;
    ///     *ctx.write(yk)? = v;
    ///     Ok(v)
    /// })?;
    /// assert_eq!(done.wait()?, 9.0);
    /// assert!(matches!(engine.push(&[], &[], |_| Ok(())), Err(Error::NoVars)));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn push<F, T>(
        &self,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        f: F,
    ) -> Result<OpHandle<T>, Error>
    where
        F: FnOnce(&OpCtx) -> Result<T, BoxError> + Send + 'static,
        T: Send + 'static,
    {
        // The builder's defaults, without its copies of the lists.
        let spec = OpSpec::new(edges(reads, mutates, self.shared().id)?);
        self.push_spec(spec, SyncBody(Some(f)))
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
    ///         Ok(())
    ///     }
    /// })?;
    /// fill.wait()?;
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn push_async<F, Fut, T>(
        &self,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        f: F,
    ) -> Result<OpHandle<T>, Error>
    where
        F: FnOnce(OpCtx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, BoxError>> + Send + 'static,
        T: Send + 'static,
    {
        let spec = OpSpec::new(edges(reads, mutates, self.shared().id)?);
        self.push_spec(spec, AsyncBody::new(f))
    }

    /// A clone of `var`'s value once every mutation pushed on it so far has
    /// completed: a read op, pushed now, that clones the value. Await the
    /// handle, or [`wait`](OpHandle::wait) on it.
    ///
    /// Resolves to the errors a read op would: [`Error::Poisoned`] for a
    /// poisoned variable, [`Error::Deleted`], [`Error::ShutDown`] (and
    /// [`Error::ForeignVar`] for another engine's variable). Inside an op
    /// that declared `var`, to [`Error::WaitsForItself`].
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let v = engine.var(vec![1, 2]);
    /// let k = v.key();
    /// engine.push(&[], &[&v], move |ctx| {
    ///     ctx.write(k)?.push(3);
    ///     Ok(())
    /// })?;
    /// assert_eq!(engine.get(&v).wait()?, vec![1, 2, 3]);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    pub fn get<T>(&self, var: &Var<T>) -> OpHandle<T>
    where
        T: Clone + Send + Sync + 'static,
    {
        let key = var.key();
        if declared_here(key) {
            return OpHandle::ready(Err(Error::WaitsForItself));
        }
        let pushed = edges(&[var], &[], self.shared().id).and_then(|edges| {
            let mut spec = OpSpec::new(edges);
            spec.name = Some("get".into());
            self.push_spec(
                spec,
                SyncBody(Some(move |ctx: &OpCtx| {
                    Ok::<_, Error>(ctx.read(key)?.clone())
                })),
            )
        });
        pushed.unwrap_or_else(|e| OpHandle::ready(Err(e)))
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
    /// [`push`](Self::push). A refused delete (after shutdown, say) leaves
    /// the variable as it was: it is marked deleted only once the delete is
    /// admitted. A delete [cancelled](OpHandle::cancel) before it ran
    /// resolves to [`Error::Cancelled`] and poisons nothing: the variable
    /// stays marked deleted, and its value (and the units it holds) go when
    /// its last handle is dropped.
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let buffer = engine.var(vec![0u8; 4096]);
    /// let b = buffer.key();
    /// engine.push(&[&buffer], &[], move |ctx| Ok(ctx.read(b)?.len()))?;
    /// // Runs after the read above; the buffer goes back to a pool, say.
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// engine.delete_var(&buffer, move |bytes| tx.send(bytes).unwrap())?.wait()?;
    /// assert_eq!(rx.recv().unwrap().len(), 4096);
    /// assert!(matches!(engine.push(&[&buffer], &[], |_| Ok(())), Err(Error::Deleted(_))));
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
        let shared = self.shared();
        let (mut spec, body) = deletion(var, shared.id, f)?;
        spec.generation = shared.admit()?;
        // Only an admitted delete marks the variable deleted (and only one).
        if let Err(e) = mark_deleted(var) {
            shared.unadmit(spec.generation);
            return Err(e);
        }
        Ok(OpHandle::new(spawn(spec, body, &**shared)))
    }

    /// Clears the poison of `var`, in push order: ops pushed after this one
    /// run normally again (their values are whatever the variable holds).
    ///
    /// [Cancelled](OpHandle::cancel) before it ran, it resolves to
    /// [`Error::Cancelled`] and leaves `var` as it was: a healthy variable
    /// healthy, a poisoned one poisoned by its original failure.
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
    /// let failing = engine.push(&[], &[&v], |_| Err::<(), _>("bad batch".into()))?;
    /// assert!(failing.wait().is_err());
    /// assert!(matches!(engine.wait_for_var(&v).wait(), Err(Error::Poisoned { .. })));
    /// engine.clear_poison(&v)?;
    /// engine.wait_for_var(&v).wait()?; // live again
    /// # let _ = engine.wait_all().wait();
    /// # Ok::<(), Error>(())
    /// ```
    pub fn clear_poison<T>(&self, var: &Var<T>) -> Result<OpHandle<()>, Error>
    where
        T: Send + Sync + 'static,
    {
        let (spec, body) = unpoisoning(var, self.shared().id)?;
        self.push_spec(spec, body)
    }

    /// Waits until every mutation pushed on `var` so far has completed.
    ///
    /// Resolves to an error if the variable is poisoned
    /// ([`Error::Poisoned`], naming the original failure) or deleted
    /// (that error is the caller's alone: `wait_all` does not report it).
    /// Inside an op that declared `var` it resolves at once to
    /// [`Error::WaitsForItself`].
    ///
    /// The wait needs no worker: it is over as soon as the mutations are,
    /// on the thread that completes the last of them (at once for a
    /// variable with nothing pending, however busy the executor is); only
    /// device work on the variable (a [stream device](crate::stream)'s) is
    /// waited for on the default device. It takes no room under
    /// [`EngineBuilder::max_in_flight`].
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let v = engine.var(0u64);
    /// let k = v.key();
    /// for _ in 0..10 {
    ///     engine.push(&[], &[&v], move |ctx| {
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
        if declared_here(var.key()) {
            return Wait::ready(Err(Error::WaitsForItself));
        }
        let pushed =
            var_wait(var, self.shared().id).and_then(|(spec, body)| self.push_wait(spec, body));
        match pushed {
            Ok(handle) => Wait::op(handle),
            Err(e) => Wait::ready(Err(e)),
        }
    }

    /// Waits until every op pushed so far (by any thread) has finished.
    ///
    /// Resolves to [`Error::Failures`] if ops failed since the previous
    /// `wait_all` (each failure is reported once). Ops pushed by other threads
    /// while it waits do not delay it. Inside an op of this engine it
    /// resolves at once to [`Error::WaitsForItself`]; an op may await
    /// another engine's `wait_all` (a blocking [`wait`](Wait::wait) on it
    /// is refused with [`Error::BlockingInOp`] while it is not over, as
    /// any blocking wait inside an op is).
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let vars: Vec<_> = (0..8).map(|_| engine.new_var()).collect();
    /// for v in &vars {
    ///     engine.push(&[], &[v], |_| Ok(()))?;
    /// }
    /// engine.wait_all().wait()?;
    /// assert!(vars.iter().all(|v| v.version() == 1));
    ///
    /// engine.push(&[], &[&vars[0]], |_| Err::<(), _>("out of memory".into()))?;
    /// assert!(matches!(engine.wait_all().wait(), Err(Error::Failures { count: 1, .. })));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn wait_all(&self) -> Wait {
        if in_op_of(&**self.shared()) {
            return Wait::ready(Err(Error::WaitsForItself));
        }
        Wait::drain(
            self.shared().pending.wait(),
            self.shared().clone(),
            Drained::ReportFailures,
        )
    }

    /// Shuts the engine down: new pushes fail with [`Error::ShutDown`]; the
    /// returned wait resolves once every op pushed before has finished, and
    /// stops the engine's [watchdog](crate::EngineBuilder::watchdog) thread
    /// then (joined before it returns; until then the watchdog still
    /// reports a drain that hangs). The
    /// executors' threads stop when the last handle is dropped (dropping it
    /// also shuts down, blocking until the ops have finished, except where
    /// [`Engine`] says). [`shutdown_timeout`](Engine::shutdown_timeout)
    /// waits with a deadline. Inside an op of this engine
    /// the engine is shut down all the same, but the wait resolves at once to
    /// [`Error::WaitsForItself`] (inside another engine's op, it waits as
    /// anywhere else).
    ///
    /// ```
    /// use depflow::{Engine, Error};
    ///
    /// let engine = Engine::new();
    /// let v = engine.new_var();
    /// engine.push(&[], &[&v], |_| Ok(()))?;
    /// engine.shutdown().wait()?; // the op above has run
    /// assert!(matches!(engine.push(&[], &[&v], |_| Ok(())), Err(Error::ShutDown)));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn shutdown(&self) -> Wait {
        if in_op_of(&**self.shared()) {
            self.shared().close();
            return Wait::ready(Err(Error::WaitsForItself));
        }
        Wait::drain(
            self.shared().close_and_drain(),
            self.shared().clone(),
            Drained::StopWatchdog,
        )
    }

    /// Admits an op (refused after shutdown), spawns it and links it into
    /// its variables' chains.
    #[inline]
    pub(super) fn push_spec<B: Body>(
        &self,
        mut spec: OpSpec,
        body: B,
    ) -> Result<OpHandle<B::Output>, Error> {
        debug_assert!(spec.mode != Mode::Wait, "a wait is pushed by push_wait");
        let shared = self.shared();
        spec.generation = shared.admit()?;
        Ok(OpHandle::new(spawn(spec, body, &**shared)))
    }

    /// Pushes one of the engine's own waits (`Mode::Wait`): admitted
    /// outside the bound on ops in flight.
    fn push_wait<B: Body>(&self, mut spec: OpSpec, body: B) -> Result<OpHandle<B::Output>, Error> {
        debug_assert!(spec.mode == Mode::Wait);
        let shared = self.shared();
        spec.generation = shared.admit_wait()?;
        Ok(OpHandle::new(spawn(spec, body, &**shared)))
    }
}

/// Whether the op running on this thread, if any, declared the variable
/// `key` names: waiting for the variable there would wait for that op.
fn declared_here<T>(key: VarKey<T>) -> bool {
    with_current_op(|op| op.is_some_and(|op| op.edges().iter().any(|e| key.names(&e.var))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `wait_for_var` whose declaration passed its checks just before
    /// another thread's `delete_var` was pushed, and so is linked behind the
    /// delete (issue 15, item 18: a race, lost here on purpose).
    #[test]
    fn a_wait_that_loses_a_race_with_a_delete_is_not_a_failure() {
        let engine = Engine::builder().threads(1).build().unwrap();
        let v = engine.var(1u32);
        let (spec, body) = var_wait(&v, engine.shared().id).unwrap();
        engine.delete_var(&v, drop).unwrap();
        let wait = Wait::op(engine.push_wait(spec, body).unwrap());
        assert!(matches!(wait.wait(), Err(Error::Deleted(_))));
        // The engine's own wait failed no op of the user's.
        let all = engine.wait_all().wait();
        assert!(all.is_ok(), "{all:?}");
    }
}
